/* fake-kcu: the kcu API (kernels/kcu.h) on the host, for GPU-free testing of
 * the CUDA backend's data path.
 *
 * Every launcher lrmoe_kcu_NAME runs its CPU reference lrmoe_kref_NAME (same
 * parameters, lib/kref.h); "device memory" is malloc'd host memory; the
 * communicator is the CPU one (memcpy). Linked with kernels/exec_cuda.cu
 * compiled as plain C++ (it calls no CUDA runtime function itself), it gives
 * an lrmoe-exec whose --backend cuda runs exec_cuda.cu's whole host logic:
 * layouts, send/receive orders, weight and gradient movement, GEMM groups and
 * their shapes, on the reference kernels. tests/cuda.bats builds and runs it
 * against --backend cpu; on a GPU, make check-gpu runs the real thing.
 * Not part of liblrmoe.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lrmoe.h"
#include "kref.h"
#include "comm.h"

/* kcu.h declares these with C++ linkage guards; repeat what we define. */
typedef enum { LRMOE_GEMM_LOOP = 0, LRMOE_GEMM_GROUPED = 1 } lrmoe_gemm_impl_t;
typedef struct lrmoe_kcu_ctx { int device; lrmoe_gemm_impl_t impl; } lrmoe_kcu_ctx_t;

static _Thread_local lrmoe_kcu_ctx_t *cur;

int lrmoe_gemm_impl_parse(const char *s, lrmoe_gemm_impl_t *impl);
const char *lrmoe_gemm_impl_name(lrmoe_gemm_impl_t impl);
int lrmoe_kcu_ctx_create(int device, int nstreams, lrmoe_kcu_ctx_t **out);
void lrmoe_kcu_ctx_destroy(lrmoe_kcu_ctx_t *c);
int lrmoe_kcu_use(lrmoe_kcu_ctx_t *c);
lrmoe_kcu_ctx_t *lrmoe_kcu_current(void);
int lrmoe_kcu_device(const lrmoe_kcu_ctx_t *c);
void *lrmoe_kcu_stream(const lrmoe_kcu_ctx_t *c);
void lrmoe_kcu_set_gemm(lrmoe_kcu_ctx_t *c, lrmoe_gemm_impl_t impl);
int lrmoe_kcu_sync(void);
int lrmoe_kcu_device_count(void);
int lrmoe_kcu_alloc(void **p, size_t bytes);
int lrmoe_kcu_free(void *p);
int lrmoe_kcu_h2d(void *dst, const void *src, size_t bytes);
int lrmoe_kcu_d2h(void *dst, const void *src, size_t bytes);
int lrmoe_kcu_d2d(void *dst, const void *src, size_t bytes);
int lrmoe_kcu_memset(void *dst, int v, size_t bytes);
int lrmoe_kcu_to_f32(int64_t n, int src_bf16, const void *src, float *dst);
int lrmoe_kcu_from_f32(int64_t n, const float *src, int dst_bf16, void *dst);
int lrmoe_kcu_mask_rows(int64_t nrows, int64_t row, const uint8_t *mask, float *x);
int lrmoe_kcu_add(int64_t n, const float *src, float *dst);
int lrmoe_comm_cuda_init(lrmoe_comm_t *c, int P, lrmoe_kcu_ctx_t *const *ctx, int use_nccl);
int lrmoe_comm_cuda_is_nccl(const lrmoe_comm_t *c);
int lrmoe_comm_cuda_set_async(lrmoe_comm_t *c, int on);
int lrmoe_kcu_event_create(void **ev, int timing);
void lrmoe_kcu_event_destroy(void *ev);
int lrmoe_kcu_event_record(void *ev);
int lrmoe_kcu_event_wait(void *ev);
int lrmoe_kcu_event_sync(void *ev);
int lrmoe_kcu_event_ms(void *a, void *b, float *ms);
int lrmoe_kcu_host_alloc(void **p, size_t bytes);
void lrmoe_kcu_host_free(void *p);

/* events: everything here has run when it returns, so an event is a
 * no-op marker (time 0); pinned memory is plain memory */
int lrmoe_kcu_event_create(void **ev, int timing)
{
    (void)timing;
    *ev = malloc(1);
    return *ev ? 0 : lrmoe_err("out of memory");
}
void lrmoe_kcu_event_destroy(void *ev) { free(ev); }
int lrmoe_kcu_event_record(void *ev) { (void)ev; return cur ? 0 : lrmoe_err("event_record: no context"); }
int lrmoe_kcu_event_wait(void *ev) { (void)ev; return cur ? 0 : lrmoe_err("event_wait: no context"); }
int lrmoe_kcu_event_sync(void *ev) { (void)ev; return 0; }
int lrmoe_kcu_event_ms(void *a, void *b, float *ms) { (void)a; (void)b; *ms = 0.0f; return 0; }
int lrmoe_kcu_host_alloc(void **p, size_t bytes)
{
    *p = malloc(bytes ? bytes : 16);
    if (!*p) return lrmoe_err("cudaMallocHost: out of memory (fake)");
    memset(*p, 0xFF, bytes); /* poisoned, like device memory */
    return 0;
}
void lrmoe_kcu_host_free(void *p) { free(p); }
int lrmoe_kcu_event_record_on(void *ev, void *stream);
int lrmoe_kcu_stream_wait(void *stream, void *ev);
int lrmoe_kcu_stream_capturing(void *stream);
int lrmoe_kcu_stream_capturing(void *stream) { (void)stream; return 0; }
int lrmoe_kcu_copy(void *dst, const void *src, size_t bytes);
int lrmoe_kcu_event_record_on(void *ev, void *stream) { (void)ev; (void)stream; return 0; }
int lrmoe_kcu_stream_wait(void *stream, void *ev) { (void)ev; (void)stream; return 0; }
int lrmoe_kcu_copy(void *d, const void *s, size_t n) { if (n && d != s) memmove(d, s, n); return 0; }

int lrmoe_gemm_impl_parse(const char *s, lrmoe_gemm_impl_t *impl)
{
    if (!strcmp(s, "loop")) { *impl = LRMOE_GEMM_LOOP; return 0; }
    if (!strcmp(s, "grouped")) { *impl = LRMOE_GEMM_GROUPED; return 0; }
    return lrmoe_err("unknown GEMM implementation '%s' (loop, grouped)", s);
}
const char *lrmoe_gemm_impl_name(lrmoe_gemm_impl_t impl)
{
    return impl == LRMOE_GEMM_GROUPED ? "grouped" : "loop";
}

int lrmoe_kcu_ctx_create(int device, int nstreams, lrmoe_kcu_ctx_t **out)
{
    (void)nstreams;
    *out = calloc(1, sizeof **out);
    if (!*out) return lrmoe_err("out of memory");
    (*out)->device = device;
    return 0;
}
void lrmoe_kcu_ctx_destroy(lrmoe_kcu_ctx_t *c)
{
    if (cur == c) cur = NULL;
    free(c);
}
int lrmoe_kcu_use(lrmoe_kcu_ctx_t *c) { cur = c; return 0; }
lrmoe_kcu_ctx_t *lrmoe_kcu_current(void) { return cur; }
int lrmoe_kcu_device(const lrmoe_kcu_ctx_t *c) { return c->device; }
void *lrmoe_kcu_stream(const lrmoe_kcu_ctx_t *c) { (void)c; return NULL; }
void lrmoe_kcu_set_gemm(lrmoe_kcu_ctx_t *c, lrmoe_gemm_impl_t impl) { c->impl = impl; }
int lrmoe_kcu_sync(void) { return 0; }
int lrmoe_kcu_device_count(void)
{
    const char *s = getenv("LRMOE_FAKE_DEVICES");
    int n = s ? atoi(s) : 1;
    return n >= 1 ? n : lrmoe_err("cudaGetDeviceCount: no CUDA device (fake)");
}

/* Fresh "device" memory is poisoned (NaN bytes), as on a GPU it is garbage:
 * a read of something never written shows up in the results. */
int lrmoe_kcu_alloc(void **p, size_t bytes)
{
    *p = NULL;
    if (!bytes) return 0;
    if (!(*p = malloc(bytes))) return lrmoe_err("cudaMallocAsync: out of memory (fake)");
    memset(*p, 0xFF, bytes);
    return 0;
}
int lrmoe_kcu_free(void *p) { free(p); return 0; }
int lrmoe_kcu_h2d(void *d, const void *s, size_t n) { if (n) memcpy(d, s, n); return 0; }
int lrmoe_kcu_d2h(void *d, const void *s, size_t n) { if (n) memcpy(d, s, n); return 0; }
int lrmoe_kcu_d2d(void *d, const void *s, size_t n) { if (n && d != s) memmove(d, s, n); return 0; }
int lrmoe_kcu_memset(void *d, int v, size_t n) { if (n) memset(d, v, n); return 0; }

int lrmoe_kcu_to_f32(int64_t n, int src_bf16, const void *src, float *dst)
{
    if (src_bf16) return lrmoe_kref_bf16_to_f32(n, src, dst);
    return lrmoe_kcu_d2d(dst, src, (size_t)n * 4);
}
int lrmoe_kcu_from_f32(int64_t n, const float *src, int dst_bf16, void *dst)
{
    if (dst_bf16) return lrmoe_kref_f32_to_bf16(n, src, dst);
    return lrmoe_kcu_d2d(dst, src, (size_t)n * 4);
}
int lrmoe_kcu_mask_rows(int64_t nrows, int64_t row, const uint8_t *mask, float *x)
{
    for (int64_t i = 0; i < nrows * row; i++)
        if (!mask[i / row]) x[i] = 0.0f;
    return 0;
}
int lrmoe_kcu_add(int64_t n, const float *src, float *dst)
{
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
    return 0;
}
/* the references check their input at once: nothing is ever pending */
int lrmoe_kcu_flags_hold(int on);
int lrmoe_kcu_flags_hold(int on) { (void)on; return cur ? 0 : lrmoe_err("flags_hold: no context"); }
int lrmoe_kcu_flags_check(void);
int lrmoe_kcu_flags_check(void) { return 0; }
int lrmoe_kcu_seq_i64(int64_t n, int64_t start, int64_t step, int64_t *dst);
int lrmoe_kcu_seq_i64(int64_t n, int64_t start, int64_t step, int64_t *dst)
{
    for (int64_t i = 0; i < n; i++) dst[i] = start + i * step;
    return 0;
}
int lrmoe_kcu_invert_i64(int64_t n, const int64_t *perm, int64_t *inv);
int lrmoe_kcu_invert_i64(int64_t n, const int64_t *perm, int64_t *inv)
{
    for (int64_t i = 0; i < n; i++)
        if (perm[i] >= 0 && perm[i] < n) inv[perm[i]] = i;
    return 0;
}

/* every launcher: its CPU reference */
#define FAKE(name, args) int lrmoe_kcu_##name args;
LRMOE_KERNELS(FAKE)
#undef FAKE
int lrmoe_kcu_bf16_to_f32(int64_t n, const uint16_t *s, float *d) { return lrmoe_kref_bf16_to_f32(n, s, d); }
int lrmoe_kcu_f32_to_bf16(int64_t n, const float *s, uint16_t *d) { return lrmoe_kref_f32_to_bf16(n, s, d); }
int lrmoe_kcu_pair_score(int m, int64_t T, int K, int64_t D, const float *g, const float *a,
                         const float *p, float *s)
{ return lrmoe_kref_pair_score(m, T, K, D, g, a, p, s); }
int lrmoe_kcu_row_sqnorm(int64_t n, int64_t d, const float *x, float *o) { return lrmoe_kref_row_sqnorm(n, d, x, o); }
int lrmoe_kcu_select(int64_t T, int K, int E, const int32_t *ids, const float *s, const int64_t *q,
                     uint8_t *keep, int64_t *load)
{ return lrmoe_kref_select(T, K, E, ids, s, q, keep, load); }
int lrmoe_kcu_sample(int64_t T, int K, int E, const int32_t *ids, const float *s, const int64_t *q,
                     uint64_t seed, uint8_t *keep, float *w, int64_t *load)
{ return lrmoe_kref_sample(T, K, E, ids, s, q, seed, keep, w, load); }
int lrmoe_kcu_pack_assign(int64_t T, int K, int E, int P, const int32_t *ids, const uint8_t *keep,
                          const int32_t *pr, const int64_t *al, int64_t R, int64_t *pair, int32_t *rank,
                          int64_t *counts, int64_t *offsets)
{ return lrmoe_kref_pack_assign(T, K, E, P, ids, keep, pr, al, R, pair, rank, counts, offsets); }
int lrmoe_kcu_pack_gather(const int64_t *pair, int64_t R, int K, int bt, const void *src, size_t rb, void *dst)
{ return lrmoe_kref_pack_gather(pair, R, K, bt, src, rb, dst); }
int lrmoe_kcu_pack_gather_scaled(const int64_t *pair, int64_t R, int K, int64_t D, const float *g,
                                 const float *a, float *dst)
{ return lrmoe_kref_pack_gather_scaled(pair, R, K, D, g, a, dst); }
int lrmoe_kcu_pack_gather_scaled_bf16(const int64_t *pair, int64_t R, int K, int64_t D, const float *g,
                                      const float *a, uint16_t *dst)
{ return lrmoe_kref_pack_gather_scaled_bf16(pair, R, K, D, g, a, dst); }
int lrmoe_kcu_pack_unpack(const int64_t *pair, int64_t R, const float *rows, int64_t D, int64_t T, int K,
                          float *out)
{ return lrmoe_kref_pack_unpack(pair, R, rows, D, T, K, out); }
int lrmoe_kcu_swiglu_fwd(int64_t n, int64_t F, const float *g, const float *u, float *phi, float *sq)
{ return lrmoe_kref_swiglu_fwd(n, F, g, u, phi, sq); }
int lrmoe_kcu_swiglu_bwd(int64_t n, int64_t F, const float *g, const float *u, const float *dphi,
                         float *dg, float *du, float *phi)
{ return lrmoe_kref_swiglu_bwd(n, F, g, u, dphi, dg, du, phi); }
int lrmoe_kcu_swiglu_bwd_bf16(int64_t n, int64_t F, const uint16_t *g, const uint16_t *u, const float *dphi,
                              uint16_t *dg, uint16_t *du, uint16_t *phi)
{ return lrmoe_kref_swiglu_bwd_bf16(n, F, g, u, dphi, dg, du, phi); }
int lrmoe_kcu_combine(int64_t T, int K, int64_t D, const float *a, const int64_t *row, const float *y,
                      float *out)
{ return lrmoe_kref_combine(T, K, D, a, row, y, out); }
int lrmoe_kcu_pair_dot(int64_t T, int K, int64_t D, const float *g, const int64_t *row, const float *y,
                       float *out)
{ return lrmoe_kref_pair_dot(T, K, D, g, row, y, out); }
/* LRMOE_FAKE_BREAK=dx drops the accumulating GEMMs (beta = 1: the second
 * FC1 data-gradient GEMM), to show that the comparison catches a wrong path. */
int lrmoe_kcu_gemm(int n, const lrmoe_gemm_t *g)
{
    if (!cur) return lrmoe_err("gemm: no CUDA context (lrmoe_kcu_use)");
    const char *brk = getenv("LRMOE_FAKE_BREAK");
    int skip = brk && !strcmp(brk, "dx");
    for (int i = 0; i < n; i++) {
        if (skip && g[i].beta != 0.0f) continue;
        if (lrmoe_kref_gemm(1, &g[i]) < 0) return -1;
    }
    return 0;
}

int lrmoe_comm_cuda_init(lrmoe_comm_t *c, int P, lrmoe_kcu_ctx_t *const *ctx, int use_nccl)
{
    (void)ctx; (void)use_nccl;
    return lrmoe_comm_cpu_init(c, P);
}
int lrmoe_comm_cuda_is_nccl(const lrmoe_comm_t *c) { (void)c; return 0; }
int lrmoe_comm_cuda_set_async(lrmoe_comm_t *c, int on) { (void)c; (void)on; return 0; }

/* One rank per process (lib/exec_mpi.c, lrmoe_comm_mpi_nccl_init; MPI
 * builds only). Ranks on distinct fake devices (LRMOE_FAKE_DEVICES=N) get
 * the bootstrap as on NCCL up to ncclCommInitRank (rank 0 makes a 128-byte
 * id, the caller's bcast carries it over MPI, every rank checks it got rank
 * 0's bytes); since fake device memory is host memory, the rank's
 * communicator is then the MPI one itself (arg: MPI_Alltoallv,
 * MPI_Send/Recv), tagged CUDA. Ranks sharing a device use comm_mpi.c's
 * host-staged communicator, as on a GPU. */
int lrmoe_comm_cuda_device_key(lrmoe_kcu_ctx_t *ctx, char *buf, size_t n);
void lrmoe_comm_cuda_rank_take(lrmoe_comm_t *c, int64_t *a2a_bytes, int64_t *p2p_bytes,
                               double *a2a_sec);

int lrmoe_comm_cuda_device_key(lrmoe_kcu_ctx_t *ctx, char *buf, size_t n)
{
    snprintf(buf, n, "fake:%d", ctx->device);
    return 0;
}
/* the MPI communicator counted the bytes already */
void lrmoe_comm_cuda_rank_take(lrmoe_comm_t *c, int64_t *a2a_bytes, int64_t *p2p_bytes,
                               double *a2a_sec)
{
    (void)c;
    *a2a_bytes = *p2p_bytes = 0;
    *a2a_sec = 0;
}

#ifdef LRMOE_HAVE_MPI
int lrmoe_comm_cuda_init_rank(lrmoe_comm_t *c, int P, int rank, lrmoe_kcu_ctx_t *ctx,
                              int (*bcast)(void *buf, size_t bytes, void *arg), void *arg);

int lrmoe_comm_cuda_init_rank(lrmoe_comm_t *c, int P, int rank, lrmoe_kcu_ctx_t *ctx,
                              int (*bcast)(void *buf, size_t bytes, void *arg), void *arg)
{
    unsigned char id[128];
    memset(c, 0, sizeof *c);
    memset(id, 0, sizeof id);
    if (rank == 0)
        for (int i = 0; i < 128; i++) id[i] = (unsigned char)(i * 7 + 1);
    if (bcast(id, sizeof id, arg) < 0) return -1;
    for (int i = 0; i < 128; i++)
        if (id[i] != (unsigned char)(i * 7 + 1))
            return lrmoe_err("fake ncclCommInitRank: rank %d of %d got another id than rank 0's",
                             rank, P);
    *c = *(const lrmoe_comm_t *)arg;
    c->backend = 1; /* LRMOE_BACKEND_CUDA */
    c->destroy = NULL;
    c->device = ctx;
    return 0;
}
#endif
