/* kcu: CUDA kernels with C launchers, and their runtime context.
 *
 * lrmoe_kcu_NAME has exactly the parameters of its CPU reference
 * lrmoe_kref_NAME (lib/kref.h, one shared list), with device pointers.
 * Launchers run on the calling thread's current context (lrmoe_kcu_use):
 * its device, its stream and, for gemm, its cuBLAS handles. They are
 * asynchronous except where the kernel validates its input (pair_score,
 * select, pack_assign, pack_unpack read back one error flag) or must size
 * memory. Every CUDA, cuBLAS and NCCL status is checked; a failure returns -1
 * with lrmoe_err "CALL: status string". Nothing prints.
 *
 * Only built when nvcc is found (LRMOE_HAVE_CUDA).
 */
#ifndef LRMOE_KCU_H
#define LRMOE_KCU_H

#include <stdint.h>
#include "kref.h"

#ifdef __cplusplus
extern "C" {
#endif

/* GEMM implementation of lrmoe_kcu_gemm: one cublasGemmEx per GEMM spread
 * round-robin over the context's streams (LOOP), or one
 * cublasGemmGroupedBatchedEx call (GROUPED; BF16 output only in cuBLAS, so an
 * F32 C is produced through a BF16 temporary and converted; a GEMM whose BF16
 * operands are not 16-byte aligned runs as cublasGemmEx instead). */
/* CUTLASS: the Hopper grouped GEMM of kernels/ggemm.cu (CUTLASS 3.x sm90
 * ptr-array kernel, wgmma + TMA, F32 or BF16 C written in its epilogue): one
 * launch per (ta, tb, C type, beta) of the list; a GEMM it cannot take (see
 * kcu_gg_variant_of in ggemm_setup.h) runs as cublasGemmEx. Only in a build
 * that found the CUTLASS headers (lrmoe_kcu_have_cutlass). */
typedef enum { LRMOE_GEMM_LOOP = 0, LRMOE_GEMM_GROUPED = 1, LRMOE_GEMM_CUTLASS = 2 } lrmoe_gemm_impl_t;
int lrmoe_gemm_impl_parse(const char *s, lrmoe_gemm_impl_t *impl); /* loop/grouped/cutlass */
const char *lrmoe_gemm_impl_name(lrmoe_gemm_impl_t impl);

typedef struct lrmoe_kcu_ctx lrmoe_kcu_ctx_t;

/* A context on device `device`: one main stream, nstreams (>= 1) side streams
 * for the GEMM loop, a cuBLAS handle per side stream, pinned staging for the
 * grouped GEMM's arrays. Creating one sets the device's default memory pool
 * to keep freed memory (release threshold UINT64_MAX); destroying it waits
 * for the main and every side stream, then trims the pool. */
int lrmoe_kcu_ctx_create(int device, int nstreams, lrmoe_kcu_ctx_t **out);
void lrmoe_kcu_ctx_destroy(lrmoe_kcu_ctx_t *c);
/* Make c the calling thread's current context (also cudaSetDevice). */
int lrmoe_kcu_use(lrmoe_kcu_ctx_t *c);
lrmoe_kcu_ctx_t *lrmoe_kcu_current(void);
int lrmoe_kcu_device(const lrmoe_kcu_ctx_t *c);
void *lrmoe_kcu_stream(const lrmoe_kcu_ctx_t *c);   /* its cudaStream_t */
void lrmoe_kcu_set_gemm(lrmoe_kcu_ctx_t *c, lrmoe_gemm_impl_t impl);
/* Wait for everything queued on the current context's stream. */
int lrmoe_kcu_sync(void);
/* Number of visible CUDA devices; -1 with the CUDA error when none. */
int lrmoe_kcu_device_count(void);

/* Stream-ordered device memory of the current context (cudaMallocAsync). */
int lrmoe_kcu_alloc(void **p, size_t bytes);
int lrmoe_kcu_free(void *p);
int lrmoe_kcu_h2d(void *dst, const void *src, size_t bytes);
int lrmoe_kcu_d2h(void *dst, const void *src, size_t bytes);
int lrmoe_kcu_d2d(void *dst, const void *src, size_t bytes);
int lrmoe_kcu_memset(void *dst, int v, size_t bytes);

/* Events and pinned host memory, for the persistent executor
 * (kernels/exec_cuda.cu): it orders ranks' streams by events instead of
 * host waits, and stages every host transfer through pinned memory.
 * event_create: timing 1 for an event cudaEventElapsedTime can read.
 * event_record/event_wait: on the current context's stream.
 * event_sync: the host waits for the event (one host synchronisation).
 * event_ms: milliseconds between two completed events (0 when not timed). */
int lrmoe_kcu_event_create(void **ev, int timing);
void lrmoe_kcu_event_destroy(void *ev);
int lrmoe_kcu_event_record(void *ev);
int lrmoe_kcu_event_wait(void *ev);
int lrmoe_kcu_event_sync(void *ev);
int lrmoe_kcu_event_ms(void *a, void *b, float *ms);
int lrmoe_kcu_host_alloc(void **p, size_t bytes);
void lrmoe_kcu_host_free(void *p);
/* A caller's stream (cudaStream_t; NULL the legacy default stream):
 * record ev on it, or make it wait for ev. */
int lrmoe_kcu_event_record_on(void *ev, void *stream);
/* 1 when a CUDA graph capture is under way on the caller's stream, else 0 */
int lrmoe_kcu_stream_capturing(void *stream);
int lrmoe_kcu_stream_wait(void *stream, void *ev);
/* Copy between any two device (or host) pointers on the current stream
 * (cudaMemcpyDefault: the pointers say where they live). */
int lrmoe_kcu_copy(void *dst, const void *src, size_t bytes);

/* Deferred input checks. pair_score, select, sample, pack_assign and
 * pack_unpack validate their input on the device and by default read the
 * result back at once (one host wait each). After lrmoe_kcu_flags_defer(1)
 * on the current context they only write it to a word of the context's
 * flag array (up to 32 calls; beyond that a call checks at once), and
 * lrmoe_kcu_flags_check reads every word written since the last check with
 * one copy and one wait, and fails with the first failing call's message
 * (in call order). flags_defer(0) checks what is pending, then stops
 * deferring. */
int lrmoe_kcu_flags_defer(int on);
int lrmoe_kcu_flags_check(void);
/* Defer (1) or stop deferring (0) without checking: what was deferred stays
 * pending for the next lrmoe_kcu_flags_check (the device-routing frames of
 * exec_cuda.cu check a frame's flags at the next frame, outside any CUDA
 * graph capture). */
int lrmoe_kcu_flags_hold(int on);

/* Elementwise helpers without a CPU twin (exec glue). */
/* dst (n) f32 = src (n) of dtype BF16 (bits) or F32 (copy). */
int lrmoe_kcu_to_f32(int64_t n, int src_bf16, const void *src, float *dst);
/* dst (n) of dtype BF16 or F32 = src f32. */
int lrmoe_kcu_from_f32(int64_t n, const float *src, int dst_bf16, void *dst);
/* x (n) *= mask[i / row] ? 1 : 0 for rows of `row` elements (masked mode). */
int lrmoe_kcu_mask_rows(int64_t nrows, int64_t row, const uint8_t *mask, float *x);
/* dst (n) += src (n), f32. */
int lrmoe_kcu_add(int64_t n, const float *src, float *dst);
/* dst[i] = start + i * step (i < n): a constant or an index sequence on the
 * device (the device-routing frames of exec_cuda.cu: no host staging). */
int lrmoe_kcu_seq_i64(int64_t n, int64_t start, int64_t step, int64_t *dst);
/* inv[perm[i]] = i for a permutation perm of 0..n-1 (entries outside are
 * skipped): the row of each pair from the rows' pairs. */
int lrmoe_kcu_invert_i64(int64_t n, const int64_t *perm, int64_t *inv);

/* 1 when this build has the CUTLASS grouped GEMM (LRMOE_GEMM_CUTLASS,
 * lrmoe_kcu_ggemm), else 0. */
int lrmoe_kcu_have_cutlass(void);

/* A grouped GEMM whose group sizes live on the device: ngroups GEMMs
 * (one per expert) with the rows of group g at offsets[g] .. offsets[g+1]
 * (expert-major, device memory, ngroups + 1 entries, within 0 .. rows), so
 * no count is copied to the host. Row-major, BF16 A and B, F32 accumulation,
 * C F32 or BF16 (c_bf16) = alpha * op(A) op(B) + beta * C, beta 0 or 1.
 *   kgrouped = 0 (forward FC1/FC2, dphi, dx): C_g (rows_g, n) =
 *     A_g (rows_g, k) op(B_g) with A_g = a + offsets[g]*lda, ta = 0,
 *     B_g = b + g*sb (the expert's weight, op by tb), C_g = c + offsets[g]*ldc;
 *   kgrouped = 1 (weight gradients): C_g (m, n) = A_g^T B_g with K = rows_g,
 *     A_g = a + offsets[g]*lda stored (rows_g, m), B_g = b + offsets[g]*ldb
 *     stored (rows_g, n), C_g = c + g*sc; ta = 1, tb = 0. A group with no
 *     rows gets C_g = beta * C_g (zeroed when beta == 0).
 * Strides in elements. The fixed sizes are multiples of 8, pointers and
 * strides 16-byte aligned. Offsets that are not within 0..rows and
 * nondecreasing (or a group above INT_MAX rows) make their group empty and
 * set *err (device int, may be NULL) to 1; nothing else is read back. */
typedef struct {
    int kgrouped;
    int ngroups;
    const int64_t *offsets;
    int64_t rows;
    int64_t m, n, k;          /* kgrouped 0: n, k used; kgrouped 1: m, n used */
    int ta, tb;
    const void *a, *b;
    void *c;
    int64_t lda, ldb, ldc;
    int64_t sb, sc;           /* group strides of B (kgrouped 0), of C (kgrouped 1) */
    int c_bf16;
    float alpha, beta;
    int *err;
} lrmoe_ggemm_t;
int lrmoe_kcu_ggemm(const lrmoe_ggemm_t *d);

#define LRMOE_KCU_DECL(name, args) int lrmoe_kcu_##name args;
LRMOE_KERNELS(LRMOE_KCU_DECL)
#undef LRMOE_KCU_DECL

#ifdef __cplusplus
}
#endif

#endif
