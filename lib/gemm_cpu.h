/* CPU GEMMs of the expert layer behind one small interface (lib/exec_cpu.c
 * calls it for every expert GEMM).
 *
 *   C (M,N) F32  =  op(A) op(B)  [+ C when acc]
 *
 * op(X) = X, or X^T when its trans flag is set; A is stored (M,K) row-major
 * with row stride lda, or (K,M) when ta; B is (K,N), or (N,K) when tb. Each
 * operand is F32 or BF16, independently.
 *
 * Two computes:
 *   f32   the exact reference: BF16 operands are widened to F32 (exact) and
 *         OpenBLAS sgemm multiplies in F32 with F32 accumulation.
 *   bf16  BF16 operands and F32 accumulation: F32 operands are rounded to
 *         BF16 (nearest even) first, the products of two BF16 values are exact
 *         in F32 and the sums are F32, as in cuBLAS' BF16 GEMM with F32
 *         compute. On a CPU with AMX, lib/gemm_amx.c runs the GEMMs with a
 *         BF16 B and ta = 0 whose shape it takes (K % 32, N % 16; B read in
 *         place), and C = A^T B with both operands BF16, N % 16 and no acc
 *         (the weight gradients, C written with non-temporal stores); the
 *         rest run oneDNN matmul. On a CPU with AVX512_BF16 and no AMX,
 *         lib/gemm_dpbf16.c runs every GEMM (kernel DPBF16), unless the
 *         emulation below is chosen; elsewhere oneDNN matmul (AMX or
 *         AVX512_BF16 where the CPU has them). Needs a build with oneDNN
 *         (LRMOE_HAVE_DNNL).
 *
 * A context belongs to one thread (it holds that thread's conversion scratch,
 * its AMX kernel state and its cached oneDNN primitives, all fixed-shape:
 * one per (M, N, K, strides) for the GEMMs whose K is fixed (oneDNN 2.6 runs
 * runtime-dims matmul with its slower gemm:jit, fixed shapes with brgemm),
 * and for the weight-gradient GEMMs (ta: K is the row count) one per K
 * rounded up to a multiple of 16 with zero rows so that a frame's many
 * segment sizes share a few primitives; zero rows add exact zeros). Nothing
 * here prints or exits.
 */
#ifndef LRMOE_GEMM_CPU_H
#define LRMOE_GEMM_CPU_H

#include <stdint.h>
#include "lrmoe.h"

typedef enum {
    LRMOE_COMPUTE_AUTO = 0,  /* bf16 for BF16-stored weights when the build and
                                the CPU run BF16 GEMMs natively, else f32 */
    LRMOE_COMPUTE_F32 = 1,
    LRMOE_COMPUTE_BF16 = 2
} lrmoe_compute_t;

/* "auto", "f32", "bf16" -> 0; name for printing. */
int lrmoe_compute_parse(const char *s, lrmoe_compute_t *c);
const char *lrmoe_compute_name(lrmoe_compute_t c);

/* 1 when this build has oneDNN, 0 otherwise. */
int lrmoe_gemm_have_dnnl(void);
/* 1 when oneDNN runs BF16 matmul on this CPU with a native (non-reference)
 * implementation; *impl (may be NULL) gets oneDNN's implementation name. */
int lrmoe_gemm_bf16_native(const char **impl);
/* 1 when the build has oneDNN but oneDNN has no BF16 matmul at all on this
 * CPU (AVX2 without AVX512_BF16 or AMX): the bf16 compute is then emulated,
 * each F32 operand rounded to BF16 and multiplied by lib/gemm_avx2.c's
 * kernel (OpenBLAS sgemm on widened operands without AVX2 and FMA, or with
 * LRMOE_AVX2_GEMM=0). Also 1 on a CPU without AMX whose AVX-512 F32 FMAs
 * do at least 1.4 times the FLOPs of its BF16 dot product
 * (lrmoe_avx2_fma_over_bf16dot: the kernel's AVX-512 form then outruns
 * oneDNN's BF16 matmul), unless LRMOE_BF16_EMULATE=0 or LRMOE_AVX2_GEMM=256;
 * and where LRMOE_BF16_EMULATE=1 (for comparison and the tests). */
int lrmoe_gemm_bf16_emulated(void);

/* The kernel of the bf16 compute: which code multiplies, resolved once per
 * process (lrmoe_gemm_kernel) and used by every bf16 context it makes. Under
 * MPI, rank 0's travels in each job's header and every rank pins it
 * (lrmoe_gemm_kernel_pin) or fails saying what it lacks, so that one job is
 * never computed by two kernels. Bit-equalities each kernel guarantees
 * (tests/unit/gemm_amx_test.c and gemm_test.c check them):
 *   every kernel   lrmoe_gemm2 = two lrmoe_gemm calls with the same strides;
 *                  lrmoe_gemm_bf16out = lrmoe_gemm with ldc = N, rounded.
 *   EMUL_AVX*, AMX, DPBF16  lrmoe's own kernels (AMX: on the shapes lib/gemm_amx.c
 *                  takes): a C element's bits do not depend on the strides,
 *                  so bf16out also equals lrmoe_gemm at any ldc, rounded.
 *   EMUL_AVX512    and EMUL_AVX2 give the same bits (one kernel, two widths:
 *                  gemm_avx2.h), so a CPU without AVX-512F runs an
 *                  EMUL_AVX512 job with the AVX2 form.
 *   NATIVE, AMX    oneDNN's matmul picks its implementation per shape and
 *                  stride (oneDNN 2.6.3 on AVX512_BF16: brgemm for a dense
 *                  C, gemm:jit for some strided ones, which sum K in another
 *                  order), and its ISA and version change the order too: two
 *                  processes give the same bits only with the same oneDNN
 *                  version and implementation (dnnl_version, dnnl_impl).
 *   EMUL_SGEMM     OpenBLAS sgemm on BF16-rounded operands: OpenBLAS's
 *                  bits (its kernel for the CPU), as the f32 compute. */
typedef enum {
    LRMOE_KERNEL_NONE = 0,     /* a build without oneDNN: no bf16 compute */
    LRMOE_KERNEL_AMX = 1,      /* lib/gemm_amx.c where it takes the shape, oneDNN elsewhere */
    LRMOE_KERNEL_NATIVE = 2,   /* oneDNN's BF16 matmul (AVX512_BF16 or AMX) */
    LRMOE_KERNEL_EMUL_AVX512 = 3, /* operands rounded to BF16, lib/gemm_avx2.c's AVX-512F form */
    LRMOE_KERNEL_EMUL_AVX2 = 4,   /* the same, its AVX2 form (the same bits) */
    LRMOE_KERNEL_EMUL_SGEMM = 5,  /* the same, OpenBLAS sgemm (no AVX2 and FMA) */
    LRMOE_KERNEL_DPBF16 = 6       /* lib/gemm_dpbf16.c on AVX512_BF16, every GEMM */
} lrmoe_kernel_t;

typedef struct {
    int kind;              /* lrmoe_kernel_t */
    int dnnl_version;      /* AMX, NATIVE: oneDNN's major*10000 + minor*100 + patch; else 0 */
    char dnnl_impl[48];    /* AMX, NATIVE: oneDNN's BF16 matmul implementation on this
                              CPU, which names its ISA ("brg:avx512_core_bf16"); else "" */
} lrmoe_gemm_kernel_t;

/* "amx", "native", "emulated-avx512", "emulated-avx2", "emulated-sgemm",
 * "dpbf16", "none": the frame attribute exec.bf16. */
const char *lrmoe_gemm_kernel_name(int kind);
/* This process's bf16 kernel: the pinned one, else the default choice for
 * this CPU and environment: EMUL_* where lrmoe_gemm_bf16_emulated() (the
 * AVX-512F form where lrmoe_avx2_gemm_wide(), the AVX2 form where only
 * lrmoe_avx2_gemm_available(), else sgemm), else AMX where
 * lrmoe_amx_available(), else DPBF16 where lrmoe_dpbf16_available(), else
 * NATIVE; NONE without oneDNN. */
void lrmoe_gemm_kernel(lrmoe_gemm_kernel_t *k);
/* 0 when this process runs k with k's bits, else -1 with the error saying
 * which kernel k is and what this process lacks. */
int lrmoe_gemm_kernel_check(const lrmoe_gemm_kernel_t *k);
/* lrmoe_gemm_kernel_check, then k is this process's kernel: every bf16
 * context made later uses it (call it between jobs, not while contexts are
 * being made). NONE pins nothing. */
int lrmoe_gemm_kernel_pin(const lrmoe_gemm_kernel_t *k);

/* The compute for weights stored as wdt: f32 and bf16 as asked (bf16 fails
 * without oneDNN: "this build has no oneDNN"), auto as documented above. */
int lrmoe_gemm_resolve(lrmoe_compute_t want, lrmoe_dtype_t wdt, lrmoe_compute_t *out);

typedef struct lrmoe_gemm lrmoe_gemm_t;

/* A context for the calling thread; compute is F32 or BF16 (resolved).
 * threads > 0: the GEMM threads of this thread (OpenMP threads for oneDNN;
 * the caller sets OpenBLAS' own). NULL with the error set on failure. */
lrmoe_gemm_t *lrmoe_gemm_new(lrmoe_compute_t compute, int threads);
void lrmoe_gemm_free(lrmoe_gemm_t *g);
lrmoe_compute_t lrmoe_gemm_compute(const lrmoe_gemm_t *g);
/* The operand dtype the compute multiplies: F32 or BF16. A caller that uses
 * one F32 operand in several GEMMs converts it once to this dtype. */
lrmoe_dtype_t lrmoe_gemm_dtype(const lrmoe_gemm_t *g);

/* n F32 values to BF16: lrmoe_f32_to_bf16's rounding (nearest even, NaN
 * kept quiet), bit for bit, branch-free and built for AVX-512/AVX2 where the
 * CPU has them (3x the scalar loop here): the BF16 compute's operand and
 * saved-state conversion. */
void lrmoe_gemm_to_bf16(const float *src, void *dst, size_t n);

int lrmoe_gemm(lrmoe_gemm_t *g, int ta, int tb, int64_t M, int64_t N, int64_t K,
               const void *A, lrmoe_dtype_t adt, int64_t lda,
               const void *B, lrmoe_dtype_t bdt, int64_t ldb,
               int acc, float *C, int64_t ldc);

/* C (M,2N) = [A B1^T | A B2^T]: two GEMMs sharing the operand A (M,K),
 * B1 and B2 stored (N,K) with row stride ldb (the forward's gate and up
 * projections), A converted or packed once. Same numerics as two
 * lrmoe_gemm calls with tb = 1. */
int lrmoe_gemm2(lrmoe_gemm_t *g, int64_t M, int64_t N, int64_t K, const void *A,
                lrmoe_dtype_t adt, int64_t lda, const void *B1, const void *B2,
                lrmoe_dtype_t bdt, int64_t ldb, float *C, int64_t ldc);

/* C (M,N) BF16 = A B^T (B stored (N,K), tb = 1), each F32 sum rounded as
 * lrmoe_gemm_to_bf16 does: the bits of lrmoe_gemm into a dense (ldc = N)
 * F32 result followed by that conversion (at any ldc on the stride-free
 * kernels, see lrmoe_kernel_t), without the F32 product in memory on AMX
 * (the forward's y, which the layer stores in BF16). */
int lrmoe_gemm_bf16out(lrmoe_gemm_t *g, int64_t M, int64_t N, int64_t K, const void *A,
                       lrmoe_dtype_t adt, int64_t lda, const void *B, lrmoe_dtype_t bdt,
                       int64_t ldb, uint16_t *C, int64_t ldc);

#endif
