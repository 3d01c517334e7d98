/* CUDA kernels and their C launchers (see kcu.h; CPU twins in lib/kref.c).
 *
 * Memory-bound by design: every kernel reads its inputs once and writes its
 * outputs once, rows are walked with consecutive threads on consecutive
 * elements (coalesced), reductions run per warp in double where the CPU
 * reference accumulates in double.
 */
#include <cub/cub.cuh>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "kcu_internal.h"
#include "kdiv.h"
#include "score.h"

/* ---------------------------------------------------------------- context */

static thread_local lrmoe_kcu_ctx_t *cur_ctx;

cudaStream_t kcu_stream(void) { return cur_ctx ? cur_ctx->stream : (cudaStream_t)0; }

int lrmoe_gemm_impl_parse(const char *s, lrmoe_gemm_impl_t *impl)
{
    if (!strcmp(s, "loop")) { *impl = LRMOE_GEMM_LOOP; return 0; }
    if (!strcmp(s, "grouped")) { *impl = LRMOE_GEMM_GROUPED; return 0; }
    if (!strcmp(s, "cutlass")) { *impl = LRMOE_GEMM_CUTLASS; return 0; }
    return lrmoe_err("unknown GEMM implementation '%s' (loop, grouped, cutlass)", s);
}

const char *lrmoe_gemm_impl_name(lrmoe_gemm_impl_t impl)
{
    return impl == LRMOE_GEMM_GROUPED ? "grouped" : impl == LRMOE_GEMM_CUTLASS ? "cutlass" : "loop";
}

int lrmoe_kcu_device_count(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        return lrmoe_err("cudaGetDeviceCount: %s", cudaGetErrorString(e));
    if (n < 1) return lrmoe_err("cudaGetDeviceCount: no CUDA device");
    return n;
}

/* Every allocation of this backend comes from the device's default pool
 * (cudaMallocAsync). With the default release threshold of 0 each
 * synchronisation hands the pool's free memory back to the driver and the
 * next allocation maps it again; keep it instead (it goes back at
 * lrmoe_kcu_ctx_destroy, cudaMemPoolTrimTo). */
static int pool_keep(int device)
{
    cudaMemPool_t pool;
    uint64_t keep = UINT64_MAX;
    KCU_CUDA(cudaDeviceGetDefaultMemPool(&pool, device));
    KCU_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    return 0;
}

static int ctx_init(lrmoe_kcu_ctx_t *c, int device, int nstreams)
{
    c->device = device;
    c->nstreams = nstreams;
    c->gemm_impl = LRMOE_GEMM_LOOP;
    KCU_CUDA(cudaSetDevice(device));
    if (pool_keep(device) < 0) return -1;
    KCU_CUDA(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    KCU_CUDA(cudaEventCreateWithFlags(&c->ev_fork, cudaEventDisableTiming));
    for (int i = 0; i < KCU_STAGE_SLOTS; i++)
        KCU_CUDA(cudaEventCreateWithFlags(&c->stage[i].done, cudaEventDisableTiming));
    for (int i = 0; i < nstreams; i++) {
        KCU_CUDA(cudaStreamCreateWithFlags(&c->side[i], cudaStreamNonBlocking));
        KCU_CUDA(cudaEventCreateWithFlags(&c->ev_join[i], cudaEventDisableTiming));
        KCU_BLAS(cublasCreate(&c->blas[i]));
        KCU_BLAS(cublasSetStream(c->blas[i], c->side[i]));
        KCU_BLAS(cublasSetMathMode(c->blas[i], CUBLAS_DEFAULT_MATH));
    }
    return 0;
}

int lrmoe_kcu_ctx_create(int device, int nstreams, lrmoe_kcu_ctx_t **out)
{
    *out = NULL;
    if (nstreams < 1) nstreams = 1;
    if (nstreams > KCU_MAX_STREAMS) nstreams = KCU_MAX_STREAMS;
    lrmoe_kcu_ctx_t *c = (lrmoe_kcu_ctx_t *)calloc(1, sizeof *c);
    if (!c) return lrmoe_err("out of memory");
    if (ctx_init(c, device, nstreams) < 0) {
        lrmoe_kcu_ctx_destroy(c);
        return lrmoe_err_prefix("CUDA device %d", device);
    }
    *out = c;
    return 0;
}

void lrmoe_kcu_ctx_destroy(lrmoe_kcu_ctx_t *c)
{
    if (!c) return;
    /* Teardown statuses are ignored on purpose: the context is going away and
     * an earlier error is the one worth reporting. Every stream drains before
     * anything it may still use goes: the side streams too (a GEMM queued
     * there reads operands and uses its cuBLAS handle and staging). */
    (void)cudaSetDevice(c->device);
    if (c->flags) (void)cudaFreeAsync(c->flags, c->stream);
    if (c->stream) (void)cudaStreamSynchronize(c->stream);
    for (int i = 0; i < KCU_MAX_STREAMS; i++)
        if (c->side[i]) (void)cudaStreamSynchronize(c->side[i]);
    for (int i = 0; i < KCU_MAX_STREAMS; i++) {
        if (c->blas[i]) (void)cublasDestroy(c->blas[i]);
        if (c->side[i]) (void)cudaStreamDestroy(c->side[i]);
        if (c->ev_join[i]) (void)cudaEventDestroy(c->ev_join[i]);
    }
    for (int i = 0; i < KCU_STAGE_SLOTS; i++) {
        if (c->stage[i].host) (void)cudaFreeHost(c->stage[i].host);
        if (c->stage[i].done) (void)cudaEventDestroy(c->stage[i].done);
    }
    if (c->flags_host) (void)cudaFreeHost(c->flags_host);
    if (c->ev_fork) (void)cudaEventDestroy(c->ev_fork);
    if (c->stream) (void)cudaStreamDestroy(c->stream);
    {   /* the pool's unused memory back to the driver (pool_keep) */
        cudaMemPool_t pool;
        if (cudaDeviceGetDefaultMemPool(&pool, c->device) == cudaSuccess)
            (void)cudaMemPoolTrimTo(pool, 0);
    }
    if (cur_ctx == c) cur_ctx = NULL;
    free(c);
}

int lrmoe_kcu_use(lrmoe_kcu_ctx_t *c)
{
    cur_ctx = c;
    if (c) KCU_CUDA(cudaSetDevice(c->device));
    return 0;
}

lrmoe_kcu_ctx_t *lrmoe_kcu_current(void) { return cur_ctx; }
int lrmoe_kcu_device(const lrmoe_kcu_ctx_t *c) { return c->device; }
void *lrmoe_kcu_stream(const lrmoe_kcu_ctx_t *c) { return (void *)c->stream; }
void lrmoe_kcu_set_gemm(lrmoe_kcu_ctx_t *c, lrmoe_gemm_impl_t impl) { c->gemm_impl = impl; }

int lrmoe_kcu_sync(void)
{
    KCU_CUDA(cudaStreamSynchronize(kcu_stream()));
    return 0;
}

int lrmoe_kcu_alloc(void **p, size_t bytes)
{
    *p = NULL;
    if (!bytes) return 0;
    KCU_CUDA(cudaMallocAsync(p, bytes, kcu_stream()));
    return 0;
}

int lrmoe_kcu_free(void *p)
{
    if (p) KCU_CUDA(cudaFreeAsync(p, kcu_stream()));
    return 0;
}

int lrmoe_kcu_h2d(void *dst, const void *src, size_t bytes)
{
    if (bytes) KCU_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, kcu_stream()));
    return 0;
}

int lrmoe_kcu_d2h(void *dst, const void *src, size_t bytes)
{
    if (bytes) KCU_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, kcu_stream()));
    return 0;
}

int lrmoe_kcu_d2d(void *dst, const void *src, size_t bytes)
{
    if (bytes) KCU_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, kcu_stream()));
    return 0;
}

int lrmoe_kcu_memset(void *dst, int v, size_t bytes)
{
    if (bytes) KCU_CUDA(cudaMemsetAsync(dst, v, bytes, kcu_stream()));
    return 0;
}

/* ---------------------------------------------------------------- events, pinned memory */

int lrmoe_kcu_event_create(void **ev, int timing)
{
    cudaEvent_t e = NULL;
    *ev = NULL;
    KCU_CUDA(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    *ev = (void *)e;
    return 0;
}

void lrmoe_kcu_event_destroy(void *ev)
{
    if (ev) (void)cudaEventDestroy((cudaEvent_t)ev);
}

int lrmoe_kcu_event_record(void *ev)
{
    KCU_CUDA(cudaEventRecord((cudaEvent_t)ev, kcu_stream()));
    return 0;
}

int lrmoe_kcu_event_wait(void *ev)
{
    KCU_CUDA(cudaStreamWaitEvent(kcu_stream(), (cudaEvent_t)ev, 0));
    return 0;
}

int lrmoe_kcu_event_sync(void *ev)
{
    KCU_CUDA(cudaEventSynchronize((cudaEvent_t)ev));
    return 0;
}

int lrmoe_kcu_event_ms(void *a, void *b, float *ms)
{
    *ms = 0.0f;
    KCU_CUDA(cudaEventElapsedTime(ms, (cudaEvent_t)a, (cudaEvent_t)b));
    return 0;
}

int lrmoe_kcu_host_alloc(void **p, size_t bytes)
{
    *p = NULL;
    KCU_CUDA(cudaMallocHost(p, bytes ? bytes : 16));
    return 0;
}

void lrmoe_kcu_host_free(void *p)
{
    if (p) (void)cudaFreeHost(p);
}

int lrmoe_kcu_event_record_on(void *ev, void *stream)
{
    KCU_CUDA(cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream));
    return 0;
}

int lrmoe_kcu_stream_capturing(void *stream)
{
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    KCU_CUDA(cudaStreamIsCapturing((cudaStream_t)stream, &st));
    return st != cudaStreamCaptureStatusNone;
}

int lrmoe_kcu_stream_wait(void *stream, void *ev)
{
    KCU_CUDA(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)ev, 0));
    return 0;
}

int lrmoe_kcu_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes) KCU_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, kcu_stream()));
    return 0;
}

/* ---------------------------------------------------------------- error flag
 * Kernels that validate input record the first problem in one 64-bit word:
 * (code << 48) | index, combined by atomicMin, so the report is the smallest
 * code and index whatever the thread order. ~0 means no problem. */
enum {
    FL_EXPERT = 1,    /* expert id out of range (index: pair) */
    FL_NAN,           /* NaN score (pair) */
    FL_NONFINITE,     /* non-finite computed score (pair) */
    FL_QUOTA,         /* quota < 0 or > n_e (expert) */
    FL_KEEP,          /* keep not 0/1 (pair) */
    FL_RANK,          /* pair_rank out of range (pair) */
    FL_ALLOC_NEG,     /* bwd_alloc negative (e*P+p) */
    FL_ALLOC_SUM,     /* sum_p bwd_alloc[e,p] != kept pairs of e (expert) */
    FL_R,             /* total rows != R (0) */
    FL_PAIR,          /* pair index out of range (row) */
    FL_DUP            /* pair index twice (row) */
};
#define FL_NONE 0xFFFFFFFFFFFFFFFFull

__device__ __forceinline__ void flag_set(unsigned long long *fl, unsigned code, int64_t idx)
{
    atomicMin(fl, ((unsigned long long)code << 48) | ((unsigned long long)idx & 0xFFFFFFFFFFFFull));
}

typedef struct { unsigned long long *d; int slot; } kflag_t;

static int flag_new(kflag_t *f)
{
    f->d = NULL;
    f->slot = -1;
    lrmoe_kcu_ctx_t *c = cur_ctx;
    if (c && c->defer && c->nflags < KCU_FLAG_SLOTS) {
        if (!c->flags) {
            KCU_CUDA(cudaMallocAsync((void **)&c->flags, KCU_FLAG_SLOTS * sizeof *c->flags, c->stream));
            KCU_CUDA(cudaMallocHost((void **)&c->flags_host, KCU_FLAG_SLOTS * sizeof *c->flags_host));
        }
        if (c->nflags == 0)
            KCU_CUDA(cudaMemsetAsync(c->flags, 0xFF, KCU_FLAG_SLOTS * sizeof *c->flags, c->stream));
        f->slot = c->nflags++;
        f->d = c->flags + f->slot;
        c->flag_meta[f->slot].what = "check";
        c->flag_meta[f->slot].K = c->flag_meta[f->slot].P = 1;
        return 0;
    }
    KCU_CUDA(cudaMallocAsync((void **)&f->d, sizeof *f->d, kcu_stream()));
    KCU_CUDA(cudaMemsetAsync(f->d, 0xFF, sizeof *f->d, kcu_stream()));
    return 0;
}

/* The message of flag word h of call `what`. */
static int flag_msg(unsigned long long h, const char *what, int K, int P)
{
    if (h == FL_NONE) return 0;
    unsigned code = (unsigned)(h >> 48);
    long long i = (long long)(h & 0xFFFFFFFFFFFFull);
    if (K < 1) K = 1;
    if (P < 1) P = 1;
    switch (code) {
    case FL_EXPERT: return lrmoe_err("%s: topk_ids[%lld,%lld]: expert id out of range", what, i / K, i % K);
    case FL_NAN: return lrmoe_err("%s: pair_score[%lld,%lld] is NaN", what, i / K, i % K);
    case FL_NONFINITE: return lrmoe_err("%s: score of pair [%lld,%lld] is not finite", what, i / K, i % K);
    case FL_QUOTA: return lrmoe_err("%s: expert %lld: quota < 0 or above its routed pairs", what, i);
    case FL_KEEP: return lrmoe_err("%s: keep[%lld,%lld] is not 0 or 1", what, i / K, i % K);
    case FL_RANK: return lrmoe_err("%s: pair_rank[%lld,%lld] out of range", what, i / K, i % K);
    case FL_ALLOC_NEG: return lrmoe_err("%s: bwd_alloc[%lld,%lld] is negative", what, i / P, i % P);
    case FL_ALLOC_SUM: return lrmoe_err("%s: expert %lld: bwd_alloc row sum differs from its kept pairs", what, i);
    case FL_R: return lrmoe_err("%s: total rows differ from R", what);
    case FL_PAIR: return lrmoe_err("%s: row %lld: pair index out of range", what, i);
    case FL_DUP: return lrmoe_err("%s: row %lld: pair index appears twice", what, i);
    default: return lrmoe_err("%s: device check failed (code %u)", what, code);
    }
}

/* Read the flag back (synchronises the stream), free it, turn it into an
 * error message; a deferred one only records its call for
 * lrmoe_kcu_flags_check. */
static int flag_check(kflag_t *f, const char *what, int K, int P)
{
    if (f->slot >= 0) {
        cur_ctx->flag_meta[f->slot].what = what;
        cur_ctx->flag_meta[f->slot].K = K;
        cur_ctx->flag_meta[f->slot].P = P;
        f->d = NULL;
        return 0;
    }
    unsigned long long h = FL_NONE;
    cudaError_t e1 = cudaMemcpyAsync(&h, f->d, sizeof h, cudaMemcpyDeviceToHost, kcu_stream());
    cudaError_t e2 = cudaStreamSynchronize(kcu_stream());
    cudaError_t e3 = cudaFreeAsync(f->d, kcu_stream());
    f->d = NULL;
    if (e1 != cudaSuccess) return lrmoe_err("cudaMemcpyAsync: %s", cudaGetErrorString(e1));
    if (e2 != cudaSuccess) return lrmoe_err("cudaStreamSynchronize: %s", cudaGetErrorString(e2));
    if (e3 != cudaSuccess) return lrmoe_err("cudaFreeAsync: %s", cudaGetErrorString(e3));
    return flag_msg(h, what, K, P);
}

static void flag_drop(kflag_t *f)
{
    if (f->d && f->slot < 0) (void)cudaFreeAsync(f->d, kcu_stream());
    f->d = NULL;
}

int lrmoe_kcu_flags_check(void)
{
    lrmoe_kcu_ctx_t *c = cur_ctx;
    if (!c || !c->nflags) return 0;
    int n = c->nflags;
    c->nflags = 0;
    KCU_CUDA(cudaMemcpyAsync(c->flags_host, c->flags, (size_t)n * sizeof *c->flags,
                             cudaMemcpyDeviceToHost, c->stream));
    KCU_CUDA(cudaStreamSynchronize(c->stream));
    for (int i = 0; i < n; i++)
        if (flag_msg(c->flags_host[i], c->flag_meta[i].what, c->flag_meta[i].K,
                     c->flag_meta[i].P) < 0)
            return -1;
    return 0;
}

int lrmoe_kcu_flags_hold(int on)
{
    lrmoe_kcu_ctx_t *c = cur_ctx;
    if (!c) return lrmoe_err("flags_hold: no CUDA context (lrmoe_kcu_use)");
    c->defer = on != 0;
    return 0;
}

int lrmoe_kcu_flags_defer(int on)
{
    lrmoe_kcu_ctx_t *c = cur_ctx;
    if (!c) return lrmoe_err("flags_defer: no CUDA context (lrmoe_kcu_use)");
    int rc = on ? 0 : lrmoe_kcu_flags_check();
    c->defer = on != 0;
    return rc;
}

/* ---------------------------------------------------------------- helpers */

__device__ __forceinline__ uint16_t f2bf(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ __forceinline__ double warp_sum(double v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

#define GRID_STRIDE(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (int64_t)gridDim.x * blockDim.x)

/* Launch check inside a function that cleans up at `out:`. */
#define KCU_LAUNCHED_GOTO(name) do { cudaError_t e_ = cudaGetLastError(); \
    if (e_ != cudaSuccess) { lrmoe_err("kernel %s: %s", name, cudaGetErrorString(e_)); goto out; } } while (0)

/* ---------------------------------------------------------------- conversions */

__global__ void k_bf16_to_f32(int64_t n, const uint16_t *s, float *d)
{
    GRID_STRIDE(i, n) d[i] = bf2f(s[i]);
}
__global__ void k_f32_to_bf16(int64_t n, const float *s, uint16_t *d)
{
    GRID_STRIDE(i, n) d[i] = f2bf(s[i]);
}

int lrmoe_kcu_bf16_to_f32(int64_t n, const uint16_t *src, float *dst)
{
    if (n < 0) return lrmoe_err("bf16_to_f32: negative count");
    if (!n) return 0;
    k_bf16_to_f32<<<KCU_GRID(k_bf16_to_f32, n), KCU_THREADS(k_bf16_to_f32), 0, kcu_stream()>>>(
        n, src, dst);
    KCU_LAUNCHED("bf16_to_f32");
    return 0;
}

int lrmoe_kcu_f32_to_bf16(int64_t n, const float *src, uint16_t *dst)
{
    if (n < 0) return lrmoe_err("f32_to_bf16: negative count");
    if (!n) return 0;
    k_f32_to_bf16<<<KCU_GRID(k_f32_to_bf16, n), KCU_THREADS(k_f32_to_bf16), 0, kcu_stream()>>>(
        n, src, dst);
    KCU_LAUNCHED("f32_to_bf16");
    return 0;
}

int lrmoe_kcu_to_f32(int64_t n, int src_bf16, const void *src, float *dst)
{
    if (src_bf16) return lrmoe_kcu_bf16_to_f32(n, (const uint16_t *)src, dst);
    if (src != dst) return lrmoe_kcu_d2d(dst, src, (size_t)n * 4);
    return 0;
}

int lrmoe_kcu_from_f32(int64_t n, const float *src, int dst_bf16, void *dst)
{
    if (dst_bf16) return lrmoe_kcu_f32_to_bf16(n, src, (uint16_t *)dst);
    if (src != dst) return lrmoe_kcu_d2d(dst, src, (size_t)n * 4);
    return 0;
}

__global__ void k_mask_rows(int64_t n, int64_t row, const uint8_t *mask, float *x)
{
    GRID_STRIDE(i, n) if (!mask[i / row]) x[i] = 0.0f;
}

int lrmoe_kcu_mask_rows(int64_t nrows, int64_t row, const uint8_t *mask, float *x)
{
    int64_t n = nrows * row;
    if (n <= 0) return 0;
    k_mask_rows<<<KCU_GRID(k_mask_rows, n), KCU_THREADS(k_mask_rows), 0, kcu_stream()>>>(
        n, row, mask, x);
    KCU_LAUNCHED("mask_rows");
    return 0;
}

__global__ void k_add(int64_t n, const float *s, float *d)
{
    GRID_STRIDE(i, n) d[i] = __fadd_rn(d[i], s[i]);
}

int lrmoe_kcu_add(int64_t n, const float *src, float *dst)
{
    if (n <= 0) return 0;
    k_add<<<KCU_GRID(k_add, n), KCU_THREADS(k_add), 0, kcu_stream()>>>(n, src, dst);
    KCU_LAUNCHED("add");
    return 0;
}

__global__ void k_seq_i64(int64_t n, int64_t start, int64_t step, int64_t *d)
{
    GRID_STRIDE(i, n) d[i] = start + i * step;
}

int lrmoe_kcu_seq_i64(int64_t n, int64_t start, int64_t step, int64_t *dst)
{
    if (n <= 0) return 0;
    k_seq_i64<<<KCU_GRID(k_seq_i64, n), KCU_THREADS(k_seq_i64), 0, kcu_stream()>>>(n, start, step,
                                                                                 dst);
    KCU_LAUNCHED("seq_i64");
    return 0;
}

/* inv[perm[i]] = i; a perm entry outside [0, n) is skipped */
__global__ void k_invert_i64(int64_t n, const int64_t *perm, int64_t *inv)
{
    GRID_STRIDE(i, n) {
        int64_t j = perm[i];
        if (j >= 0 && j < n) inv[j] = i;
    }
}

int lrmoe_kcu_invert_i64(int64_t n, const int64_t *perm, int64_t *inv)
{
    if (n <= 0) return 0;
    k_invert_i64<<<KCU_GRID(k_invert_i64, n), KCU_THREADS(k_invert_i64), 0, kcu_stream()>>>(
        n, perm, inv);
    KCU_LAUNCHED("invert_i64");
    return 0;
}

/* ---------------------------------------------------------------- score */

/* One warp per token: the sum over d of g_td^2 (lrm, gradnorm) or |g_td|
 * (absgrad) in double, then the K pair scores with the formulas of
 * lrmoe_score_pairs: lrm ((a*a)*s)*phi, gradnorm and absgrad s, in double,
 * rounded to f32, -0 -> +0, a non-finite one flagged. alpha and phisq are
 * read by lrm only. (The warp's adds are ordered otherwise than the CPU's
 * eight partial sums: the f32 scores agree to about one ulp.) */
__global__ void k_pair_score(int metric, int64_t T, int K, int64_t D, const float *g,
                             const float *alpha, const float *phisq, float *score,
                             unsigned long long *fl)
{
    int lane = threadIdx.x & 31;
    int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    const bool absval = metric == LRMOE_METRIC_ABSGRAD;
    const bool lrm = metric == LRMOE_METRIC_LRM;
    for (int64_t t = warp; t < T; t += nwarps) {
        const float *row = g + t * D;
        double s = 0;
        if (absval)
            for (int64_t j = lane; j < D; j += 32) s += fabs((double)row[j]);
        else
            for (int64_t j = lane; j < D; j += 32) s += (double)row[j] * row[j];
        s = warp_sum(s);
        s = __shfl_sync(0xffffffffu, s, 0);
        for (int k = lane; k < K; k += 32) {
            int64_t u = t * K + k;
            double v = s;
            if (lrm) {
                double a = alpha[u];
                v = a * a * s * (double)phisq[u];
            }
            float f = (float)v;
            if (!isfinite(f)) flag_set(fl, FL_NONFINITE, u);
            score[u] = f == 0.0f ? 0.0f : f;
        }
    }
}

int lrmoe_kcu_pair_score(int metric, int64_t T, int K, int64_t D, const float *g,
                         const float *alpha, const float *phi_sqnorm, float *score)
{
    if (metric != LRMOE_METRIC_LRM && metric != LRMOE_METRIC_GRADNORM &&
        metric != LRMOE_METRIC_ABSGRAD)
        return lrmoe_err("pair_score: metric %d has no kernel (lrm, gradnorm, absgrad)", metric);
    if (T < 0 || K < 1 || D < 0) return lrmoe_err("pair_score: bad sizes");
    if (!T) return 0;
    kflag_t f;
    if (flag_new(&f) < 0) return -1;
    k_pair_score<<<KCU_GRID(k_pair_score, T * 32), KCU_THREADS(k_pair_score), 0, kcu_stream()>>>(
        metric, T, K, D, g, alpha, phi_sqnorm, score, f.d);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        flag_drop(&f);
        return lrmoe_err("kernel pair_score: %s", cudaGetErrorString(e));
    }
    return flag_check(&f, "pair_score", K, 1);
}

__global__ void k_row_sqnorm(int64_t n, int64_t d, const float *x, float *out)
{
    int lane = threadIdx.x & 31;
    int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t i = warp; i < n; i += nwarps) {
        double s = 0;
        for (int64_t j = lane; j < d; j += 32) s += (double)x[i * d + j] * x[i * d + j];
        s = warp_sum(s);
        if (lane == 0) out[i] = (float)s;
    }
}

int lrmoe_kcu_row_sqnorm(int64_t n, int64_t d, const float *x, float *out)
{
    if (n < 0 || d < 0) return lrmoe_err("row_sqnorm: bad sizes");
    if (!n) return 0;
    k_row_sqnorm<<<KCU_GRID(k_row_sqnorm, n * 32), KCU_THREADS(k_row_sqnorm), 0, kcu_stream()>>>(
        n, d, x, out);
    KCU_LAUNCHED("row_sqnorm");
    return 0;
}

/* ---------------------------------------------------------------- bucketing
 * Pairs grouped by expert, u ascending inside each expert: a stable radix sort
 * of (expert, u) by expert (cub), plus per-expert starts. */

__global__ void k_expert_hist(int64_t N, int E, const int32_t *ids, const float *score,
                              unsigned long long *cnt, unsigned long long *fl)
{
    GRID_STRIDE(u, N) {
        int e = ids[u];
        if (e < 0 || e >= E) { flag_set(fl, FL_EXPERT, u); continue; }
        if (score && isnan(score[u])) flag_set(fl, FL_NAN, u);
        atomicAdd(&cnt[e], 1ull);
    }
}

__global__ void k_iota(int64_t N, int32_t *v)
{
    GRID_STRIDE(i, N) v[i] = (int32_t)i;
}

/* Single block: start[0..n] = exclusive prefix sum of cnt[0..n) (u64). */
__global__ void __launch_bounds__(KCU_THREADS(k_scan_small))
k_scan_small(int n, const unsigned long long *cnt, int64_t *start)
{
    const int B = KCU_THREADS(k_scan_small);
    typedef cub::BlockScan<long long, B> Scan;
    __shared__ typename Scan::TempStorage tmp;
    __shared__ long long carry;
    if (threadIdx.x == 0) carry = 0;
    __syncthreads();
    for (int base = 0; base < n; base += B) {
        int i = base + threadIdx.x;
        long long v = i < n ? (long long)cnt[i] : 0, ex, total;
        Scan(tmp).ExclusiveSum(v, ex, total);
        if (i < n) start[i] = carry + ex;
        __syncthreads();
        if (threadIdx.x == 0) carry += total;
        __syncthreads();
    }
    if (threadIdx.x == 0) start[n] = carry;
}

static int bits_for(int E)
{
    int b = 1;
    while ((1LL << b) < E) b++;
    return b;
}

/* Device scratch of one bucketing: list (N) pair ids grouped by expert,
 * start (E+1). */
typedef struct {
    int32_t *list;
    int64_t *start;
    unsigned long long *cnt;
    void *tmp;
} bucket_t;

static void bucket_free(bucket_t *b)
{
    lrmoe_kcu_free(b->list);
    lrmoe_kcu_free(b->start);
    lrmoe_kcu_free(b->cnt);
    lrmoe_kcu_free(b->tmp);
    memset(b, 0, sizeof *b);
}

/* ids validated into fl (and scores checked for NaN when score != NULL). */
static int bucket_build(int64_t N, int E, const int32_t *ids, const float *score,
                        unsigned long long *fl, bucket_t *b)
{
    cudaStream_t s = kcu_stream();
    memset(b, 0, sizeof *b);
    int32_t *iota = NULL, *keys_out = NULL;
    int rc = -1;
    size_t tmpb = 0;
    if (N > INT32_MAX) return lrmoe_err("too many pairs (%lld) for one call", (long long)N);
    if (lrmoe_kcu_alloc((void **)&b->cnt, (size_t)E * 8) < 0 ||
        lrmoe_kcu_alloc((void **)&b->start, (size_t)(E + 1) * 8) < 0 ||
        lrmoe_kcu_alloc((void **)&b->list, (size_t)(N ? N : 1) * 4) < 0 ||
        lrmoe_kcu_alloc((void **)&iota, (size_t)(N ? N : 1) * 4) < 0 ||
        lrmoe_kcu_alloc((void **)&keys_out, (size_t)(N ? N : 1) * 4) < 0)
        goto out;
    if (lrmoe_kcu_memset(b->cnt, 0, (size_t)E * 8) < 0) goto out;
    if (N) {
        k_expert_hist<<<KCU_GRID(k_expert_hist, N), KCU_THREADS(k_expert_hist), 0, s>>>(
            N, E, ids, score, b->cnt, fl);
        { cudaError_t e = cudaGetLastError();
          if (e != cudaSuccess) { lrmoe_err("kernel expert_hist: %s", cudaGetErrorString(e)); goto out; } }
        k_iota<<<KCU_GRID(k_iota, N), KCU_THREADS(k_iota), 0, s>>>(N, iota);
        { cudaError_t e = cudaGetLastError();
          if (e != cudaSuccess) { lrmoe_err("kernel iota: %s", cudaGetErrorString(e)); goto out; } }
    }
    k_scan_small<<<1, KCU_THREADS(k_scan_small), 0, s>>>(E, b->cnt, b->start);
    { cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) { lrmoe_err("kernel scan_small: %s", cudaGetErrorString(e)); goto out; } }
    if (N) {
        /* Out-of-range ids are reported through fl; the sort still runs on
         * their low bits, harmlessly, and the caller fails after flag_check. */
        const unsigned *kin = (const unsigned *)ids;
        unsigned *kout = (unsigned *)keys_out;
        int nb = bits_for(E);
        cudaError_t e = cub::DeviceRadixSort::SortPairs(NULL, tmpb, kin, kout, iota, b->list,
                                                        (int)N, 0, nb, s);
        if (e != cudaSuccess) { lrmoe_err("cub::DeviceRadixSort::SortPairs: %s", cudaGetErrorString(e)); goto out; }
        if (lrmoe_kcu_alloc(&b->tmp, tmpb ? tmpb : 1) < 0) goto out;
        e = cub::DeviceRadixSort::SortPairs(b->tmp, tmpb, kin, kout, iota, b->list, (int)N, 0,
                                            nb, s);
        if (e != cudaSuccess) { lrmoe_err("cub::DeviceRadixSort::SortPairs: %s", cudaGetErrorString(e)); goto out; }
    }
    rc = 0;
out:
    lrmoe_kcu_free(iota);
    lrmoe_kcu_free(keys_out);
    if (rc < 0) bucket_free(b);
    return rc;
}

/* ---------------------------------------------------------------- select */

/* Order-preserving u32 of a float (score.c ord32: -0 counts as +0). */
__device__ __forceinline__ uint32_t ord32(float f)
{
    if (f == 0.0f) f = 0.0f;
    uint32_t b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* One block per expert: radix select of the q-th largest key over the
 * expert's list (4 passes of 8 bits), then a marking pass in u order that
 * keeps keys above the threshold and the first `need` keys equal to it
 * (lower u first: the CPU's tie rule). */
__global__ void __launch_bounds__(KCU_THREADS(k_select))
k_select(int E, const int32_t *list, const int64_t *start, const float *score,
         const int64_t *quota, uint8_t *keep, unsigned long long *fl)
{
    typedef cub::BlockScan<int, KCU_THREADS(k_select)> Scan;
    __shared__ typename Scan::TempStorage tmp;
    __shared__ unsigned hist[256];
    __shared__ uint32_t s_prefix;
    __shared__ long long s_need;
    __shared__ int s_carry;
    int e = blockIdx.x;
    int64_t b0 = start[e], n = start[e + 1] - b0;
    int64_t q = quota[e];
    if (q < 0 || q > n) {
        if (threadIdx.x == 0) flag_set(fl, FL_QUOTA, e);
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) keep[list[b0 + i]] = 0;
        return;
    }
    if (q == 0 || q == n) {
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) keep[list[b0 + i]] = q ? 1 : 0;
        return;
    }
    if (threadIdx.x == 0) { s_prefix = 0; s_need = q; }
    __syncthreads();
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        uint32_t prefix = s_prefix;
        uint32_t hmask = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            uint32_t k = ord32(score[list[b0 + i]]);
            if ((k & hmask) == (prefix & hmask)) atomicAdd(&hist[(k >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            long long need = s_need, above = 0;
            int d = 255;
            for (; d > 0; d--) {
                if (above + hist[d] >= need) break;
                above += hist[d];
            }
            s_need = need - above;
            s_prefix = prefix | ((uint32_t)d << shift);
        }
        __syncthreads();
    }
    uint32_t thr = s_prefix;
    int need = (int)s_need; /* keys equal to thr to keep, lowest u first */
    if (threadIdx.x == 0) s_carry = 0;
    __syncthreads();
    for (int64_t base = 0; base < n; base += blockDim.x) {
        int64_t i = base + threadIdx.x;
        int u = -1, eq = 0;
        uint32_t k = 0;
        if (i < n) {
            u = list[b0 + i];
            k = ord32(score[u]);
            eq = k == thr;
        }
        int ex, total;
        Scan(tmp).ExclusiveSum(eq, ex, total);
        int carry = s_carry;
        if (u >= 0) keep[u] = (k > thr || (eq && carry + ex < need)) ? 1 : 0;
        __syncthreads();
        if (threadIdx.x == 0) s_carry = carry + total;
        __syncthreads();
    }
}

__global__ void k_load_out(int E, const int64_t *start, int64_t *load)
{
    GRID_STRIDE(e, E) load[e] = start[e + 1] - start[e];
}

int lrmoe_kcu_select(int64_t T, int K, int E, const int32_t *topk_ids, const float *score,
                     const int64_t *quota, uint8_t *keep, int64_t *load)
{
    if (T < 0 || K < 1 || E < 1) return lrmoe_err("select: bad sizes");
    if (!quota) return lrmoe_err("select: quota required");
    int64_t N = T * K;
    kflag_t f;
    bucket_t b;
    if (flag_new(&f) < 0) return -1;
    if (bucket_build(N, E, topk_ids, score, f.d, &b) < 0) { flag_drop(&f); return -1; }
    k_select<<<E, KCU_THREADS(k_select), 0, kcu_stream()>>>(
        E, b.list, b.start, score, quota, keep, f.d);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) {
        k_load_out<<<KCU_GRID(k_load_out, E), KCU_THREADS(k_load_out), 0, kcu_stream()>>>(
            E, b.start, load);
        e = cudaGetLastError();
    }
    bucket_free(&b);
    if (e != cudaSuccess) {
        flag_drop(&f);
        return lrmoe_err("kernel select: %s", cudaGetErrorString(e));
    }
    return flag_check(&f, "select", K, 1);
}

/* ---------------------------------------------------------------- sample */

/* lrmoe_score_sample on the device, bit for bit (score.c's sample_bucket,
 * waterfill, sample_offset and points_below): one thread per expert walks
 * its pairs in ascending u (bucket_build's stable order), so every sum and
 * the systematic walk add in the CPU's order; products that feed a sum are
 * __dmul_rn (no contraction into an FMA, which the CPU code does not do). */
__device__ __forceinline__ unsigned long long smix64(unsigned long long x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__device__ double dev_sample_offset(unsigned long long seed, long long b)
{
    unsigned long long h = smix64(seed ^ (((unsigned long long)b + 1) * 0x8CB92BA72F3D8DD7ull));
    return __dmul_rn((double)(smix64(h) >> 11), 1.0 / 9007199254740992.0);
}

__device__ long long dev_points_below(double x, double r, long long qq)
{
    double v = ceil(__dsub_rn(x, r));
    if (!(v > 0)) return 0;
    return v >= (double)qq ? qq : (long long)v;
}

/* sift a[root] down a min-heap of a[0..k) */
__device__ void dev_sift(double *a, long long root, long long k)
{
    for (;;) {
        long long c = 2 * root + 1;
        if (c >= k) return;
        if (c + 1 < k && a[c + 1] < a[c]) c++;
        if (!(a[c] < a[root])) return;
        double t = a[c];
        a[c] = a[root];
        a[root] = t;
        root = c;
    }
}

/* descending heap sort of a[0..k) (the CPU's qsort: the sorted array of
 * doubles is the same whatever the algorithm) */
__device__ void dev_sort_desc(double *a, long long k)
{
    for (long long i = k / 2 - 1; i >= 0; i--) dev_sift(a, i, k);
    for (long long end = k - 1; end > 0; end--) {
        double t = a[0];
        a[0] = a[end];
        a[end] = t;
        dev_sift(a, 0, end);
    }
}

__device__ double dev_waterfill(const double *s, long long n, long long q, double S, double *tmp)
{
    long long m = 0;
    double Su = S, c = (double)q / S;
    for (int pass = 0; pass < 32; pass++) {
        long long m2 = 0;
        double Su2 = 0;
        for (long long i = 0; i < n; i++) {
            if (__dmul_rn(c, s[i]) >= 1.0) m2++;
            else Su2 = __dadd_rn(Su2, s[i]);
        }
        if (m2 == m) return c;
        if (m2 >= q || !(Su2 > 0)) break;
        m = m2;
        Su = Su2;
        c = (double)(q - m) / Su;
    }
    long long k = 0;
    for (long long i = 0; i < n; i++)
        if (s[i] > 0) tmp[k++] = s[i];
    dev_sort_desc(tmp, k);
    Su = 0;
    for (long long i = 0; i < k; i++) Su = __dadd_rn(Su, tmp[i]);
    for (m = 0; m < q; m++) {
        c = (double)(q - m) / Su;
        if (__dmul_rn(c, tmp[m]) < 1.0) return c;
        Su = __dsub_rn(Su, tmp[m]);
    }
    return c;
}

__global__ void __launch_bounds__(KCU_THREADS(k_sample))
k_sample(int E, const int32_t *list, const int64_t *start, const float *score,
         const int64_t *quota, unsigned long long seed, double *scr, int64_t N,
         uint8_t *keep, float *weight, unsigned long long *fl)
{
    int e = blockIdx.x;
    if (threadIdx.x != 0 || e >= E) return;
    const int64_t b0 = start[e], n = start[e + 1] - b0, q = quota[e];
    const int32_t *us = list + b0;
    if (q < 0 || q > n) {
        flag_set(fl, FL_QUOTA, e);
        for (int64_t i = 0; i < n; i++) { keep[us[i]] = 0; weight[us[i]] = 1.0f; }
        return;
    }
    if (n == 0) return;
    double *s = scr + b0, *p = scr + N + b0, *tmp = scr + 2 * N + b0;
    const double r = dev_sample_offset(seed, e);
    long long npos = 0;
    double S = 0;
    for (int64_t i = 0; i < n; i++) {
        s[i] = sqrt((double)score[us[i]]);
        if (s[i] > 0) { npos++; S = __dadd_rn(S, s[i]); }
    }
    if (q >= n) {
        for (int64_t i = 0; i < n; i++) p[i] = 1.0;
    } else if (q == 0) {
        for (int64_t i = 0; i < n; i++) p[i] = 0.0;
    } else if (npos <= q) {
        const double pz = (double)(q - npos) / (double)(n - npos);
        for (int64_t i = 0; i < n; i++) p[i] = s[i] > 0 ? 1.0 : pz;
    } else {
        const double c = dev_waterfill(s, n, q, S, tmp);
        for (int64_t i = 0; i < n; i++) {
            const double v = __dmul_rn(c, s[i]);
            p[i] = v >= 1.0 ? 1.0 : v;
        }
    }
    long long qq = q;
    double Sp = 0;
    for (int64_t i = 0; i < n; i++) {
        if (p[i] >= 1.0) qq--;
        else Sp = __dadd_rn(Sp, p[i]);
    }
    const double scale = qq > 0 && Sp > 0 ? (double)qq / Sp : 0.0;
    double cum = 0;
    long long got = 0;
    for (int64_t i = 0; i < n; i++) {
        const int32_t u = us[i];
        float w = 1.0f;
        uint8_t k = 0;
        if (p[i] >= 1.0) {
            k = 1;
        } else if (p[i] > 0) {
            p[i] = __dmul_rn(p[i], scale);
            const double lo = cum;
            cum = __dadd_rn(cum, p[i]);
            if (dev_points_below(cum, r, qq) > dev_points_below(lo, r, qq)) {
                k = 1;
                got++;
                w = (float)(1.0 / p[i]);
            }
        }
        keep[u] = k;
        weight[u] = w;
    }
    for (int64_t i = n - 1; i >= 0 && got < qq; i--) {
        const int32_t u = us[i];
        if (!keep[u] && p[i] > 0) {
            keep[u] = 1;
            got++;
            weight[u] = (float)(1.0 / p[i]);
        }
    }
}

int lrmoe_kcu_sample(int64_t T, int K, int E, const int32_t *topk_ids, const float *score,
                     const int64_t *quota, uint64_t seed, uint8_t *keep, float *weight,
                     int64_t *load)
{
    if (T < 0 || K < 1 || E < 1) return lrmoe_err("sample: bad sizes");
    if (!quota) return lrmoe_err("sample: quota required");
    int64_t N = T * K;
    kflag_t f;
    bucket_t b;
    double *scr = NULL;
    if (flag_new(&f) < 0) return -1;
    if (bucket_build(N, E, topk_ids, score, f.d, &b) < 0) { flag_drop(&f); return -1; }
    if (lrmoe_kcu_alloc((void **)&scr, (size_t)(N ? N : 1) * 3 * sizeof(double)) < 0) {
        bucket_free(&b);
        flag_drop(&f);
        return -1;
    }
    k_sample<<<E, KCU_THREADS(k_sample), 0, kcu_stream()>>>(
        E, b.list, b.start, score, quota, (unsigned long long)seed, scr, N, keep, weight, f.d);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) {
        k_load_out<<<KCU_GRID(k_load_out, E), KCU_THREADS(k_load_out), 0, kcu_stream()>>>(
            E, b.start, load);
        e = cudaGetLastError();
    }
    lrmoe_kcu_free(scr);
    bucket_free(&b);
    if (e != cudaSuccess) {
        flag_drop(&f);
        return lrmoe_err("kernel sample: %s", cudaGetErrorString(e));
    }
    return flag_check(&f, "sample", K, 1);
}

/* ---------------------------------------------------------------- pack_assign */

/* Native rank of expert e: the r with floor(r*E/P) <= e < floor((r+1)*E/P)
 * (lrmoe_exec_native, pack.c's native_rank). */
__device__ __forceinline__ int native_rank(int64_t e, int64_t E, int P)
{
    return (int)(((e + 1) * P - 1) / E);
}

__global__ void k_check_pairs(int64_t N, int K, int P, const uint8_t *keep,
                              const int32_t *pair_rank, unsigned long long *fl)
{
    (void)K;
    GRID_STRIDE(u, N) {
        if (keep[u] > 1) flag_set(fl, FL_KEEP, u);
        if (pair_rank && (pair_rank[u] < 0 || pair_rank[u] >= P)) flag_set(fl, FL_RANK, u);
    }
}

/* bwd_alloc NULL: alloc[e,p] = kept pairs of e whose forward rank is p. */
__global__ void k_alloc_forward(int64_t N, int E, int P, const int32_t *ids,
                                const uint8_t *keep, const int32_t *pair_rank,
                                unsigned long long *alloc)
{
    GRID_STRIDE(u, N) {
        int e = ids[u];
        if (!keep[u] || e < 0 || e >= E) continue;
        int r = pair_rank ? pair_rank[u] : native_rank(e, E, P);
        if (r < 0 || r >= P) continue;
        atomicAdd(&alloc[(int64_t)e * P + r], 1ull);
    }
}

/* Single block: counts[p,e] = alloc[e,p], offsets = exclusive prefix in
 * row-major (P,E); checks negatives and the total against R. */
__global__ void __launch_bounds__(KCU_THREADS(k_counts_offsets))
k_counts_offsets(int E, int P, const int64_t *alloc, int64_t R, int64_t *counts,
                 int64_t *offsets, unsigned long long *fl)
{
    const int B = KCU_THREADS(k_counts_offsets);
    typedef cub::BlockScan<long long, B> Scan;
    __shared__ typename Scan::TempStorage tmp;
    __shared__ long long carry;
    int64_t n = (int64_t)E * P;
    if (threadIdx.x == 0) carry = 0;
    __syncthreads();
    for (int64_t base = 0; base < n; base += B) {
        int64_t i = base + threadIdx.x; /* row-major (p,e) */
        long long v = 0, ex, total;
        if (i < n) {
            int64_t p = i / E, e = i % E;
            v = alloc[e * P + p];
            if (v < 0) { flag_set(fl, FL_ALLOC_NEG, e * P + p); v = 0; }
            counts[i] = v;
        }
        Scan(tmp).ExclusiveSum(v, ex, total);
        if (i < n) offsets[i] = carry + ex;
        __syncthreads();
        if (threadIdx.x == 0) carry += total;
        __syncthreads();
    }
    if (threadIdx.x == 0 && carry != R) flag_set(fl, FL_R, 0);
}

/* One block of WALK_WARPS warps per expert; the expert's pairs (ascending u)
 * are cut into one contiguous slice per warp, and lib/pack.h's rule runs as
 * three walks in u order:
 *  1. a kept pair stays on its forward rank r while fewer than alloc[e,r]
 *     earlier kept pairs of the expert ran on r;
 *  2. the others, in u order, fill the remaining allocation rank by rank;
 *  3. every kept pair gets its row: offsets[p,e] + its index among the
 *     pairs of (p,e) in u order.
 * The only order dependence is through per-rank counters, so each walk first
 * counts per warp (tab[w][p]), scans those counts over the warps, then walks
 * every slice in parallel from its own starting counters. Inside a warp,
 * __match_any_sync groups the lanes of one rank and the popcount of the
 * lower peers is a lane's index. Shared memory: alloc, totals and cumulative
 * remainders (3*P long long) and tab (WALK_WARPS*P int): WALK_SMEM(P).
 * WALK_WARPS, WALK_MAX_P and WALK_SMEM are in kcu_launch.h. */

/* tab[w][p] := sum of tab[w'][p] over w' < w (exclusive, per rank), and
 * tot[p] := the sum over all warps. */
__device__ void walk_scan(int P, int *tab, long long *tot)
{
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        long long acc = 0;
        for (int w = 0; w < WALK_WARPS; w++) {
            int v = tab[w * P + p];
            tab[w * P + p] = (int)acc;
            acc += v;
        }
        if (tot) tot[p] = acc;
    }
}

__global__ void __launch_bounds__(KCU_THREADS(k_pack_walk))
k_pack_walk(int E, int P, const int32_t *list, const int64_t *start, const uint8_t *keep,
            const int32_t *pair_rank, const int64_t *alloc, const int64_t *offsets, int64_t R,
            int32_t *dest, int64_t *out_pair, int32_t *out_rank, unsigned long long *fl)
{
    extern __shared__ long long sm[];
    long long *a = sm, *tot = sm + P, *cum = sm + 2 * P;
    int *tab = (int *)(sm + 3 * P);
    __shared__ int s_left[WALK_WARPS];
    const int e = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const unsigned lt = (1u << lane) - 1u;
    const int64_t b0 = start[e], n = start[e + 1] - b0;
    /* slice of warp w: [lo, hi), lo a multiple of 32 */
    const int64_t per = ((n + WALK_WARPS - 1) / WALK_WARPS + 31) & ~(int64_t)31;
    const int64_t lo = min(n, (int64_t)w * per), hi = min(n, lo + per);
    const int native = native_rank(e, E, P);
    int *row = tab + w * P;
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        long long v = alloc[(int64_t)e * P + p];
        a[p] = v < 0 ? 0 : v;
    }
    for (int i = threadIdx.x; i < WALK_WARPS * P; i += blockDim.x) tab[i] = 0;
    __syncthreads();

    /* walk 1a: kept pairs per forward rank, per warp */
    for (int64_t base = lo; base < hi; base += 32) {
        int64_t i = base + lane;
        int k = 0, r = -1;
        if (i < hi) {
            int u = list[b0 + i];
            r = pair_rank ? pair_rank[u] : native;
            k = keep[u] == 1 && r >= 0 && r < P; /* bad values are flagged elsewhere */
        }
        int key = k ? r : -1;
        unsigned peers = __match_any_sync(0xffffffffu, key);
        if (k && lane == 31 - __clz(peers)) row[r] += __popc(peers);
        __syncwarp();
    }
    __syncthreads();
    walk_scan(P, tab, tot);
    __syncthreads();
    if (threadIdx.x == 0) {
        long long s = 0, c = 0, kept = 0;
        for (int p = 0; p < P; p++) {
            s += a[p];
            kept += tot[p];
            long long st = tot[p] < a[p] ? tot[p] : a[p];
            c += a[p] - st;
            cum[p] = c; /* allocation left over on ranks 0..p */
        }
        if (s != kept) flag_set(fl, FL_ALLOC_SUM, e);
    }
    /* walk 1b: stay while the forward rank's allocation lasts */
    int left = 0;
    for (int64_t base = lo; base < hi; base += 32) {
        int64_t i = base + lane;
        int u = -1, k = 0, r = -1;
        if (i < hi) {
            u = list[b0 + i];
            r = pair_rank ? pair_rank[u] : native;
            k = keep[u] == 1 && r >= 0 && r < P;
        }
        int key = k ? r : -1;
        unsigned peers = __match_any_sync(0xffffffffu, key);
        int stay = 0;
        if (k) stay = row[r] + __popc(peers & lt) < a[r];
        left += __popc(__ballot_sync(0xffffffffu, k && !stay));
        __syncwarp();
        if (k && lane == 31 - __clz(peers)) row[r] += __popc(peers);
        __syncwarp();
        if (u >= 0) dest[u] = k ? (stay ? r : -2) : -1;
    }
    if (lane == 0) s_left[w] = left;
    __syncthreads();
    /* walk 2: the others fill the remaining allocation in ascending rank order */
    long long j0 = 0;
    for (int v = 0; v < w; v++) j0 += s_left[v];
    for (int64_t base = lo; base < hi; base += 32) {
        int64_t i = base + lane;
        int u = -1, lo2 = 0;
        if (i < hi) {
            u = list[b0 + i];
            lo2 = dest[u] == -2;
        }
        unsigned bal = __ballot_sync(0xffffffffu, lo2);
        if (lo2) {
            long long j = j0 + __popc(bal & lt);
            int p = 0;
            while (p < P - 1 && cum[p] <= j) p++;
            dest[u] = p;
        }
        j0 += __popc(bal);
    }
    /* walk 3a: pairs per destination rank, per warp */
    for (int p = lane; p < P; p += 32) row[p] = 0;
    __syncwarp();
    for (int64_t base = lo; base < hi; base += 32) {
        int64_t i = base + lane;
        int p = -1;
        if (i < hi) p = dest[list[b0 + i]];
        unsigned peers = __match_any_sync(0xffffffffu, p);
        if (p >= 0 && lane == 31 - __clz(peers)) row[p] += __popc(peers);
        __syncwarp();
    }
    __syncthreads();
    walk_scan(P, tab, NULL);
    __syncthreads();
    /* walk 3b: rows, u ascending inside each (p,e) segment */
    for (int64_t base = lo; base < hi; base += 32) {
        int64_t i = base + lane;
        int u = -1, p = -1;
        if (i < hi) {
            u = list[b0 + i];
            p = dest[u];
        }
        unsigned peers = __match_any_sync(0xffffffffu, p);
        int64_t pos = -1;
        if (p >= 0) pos = offsets[(int64_t)p * E + e] + row[p] + __popc(peers & lt);
        __syncwarp();
        if (p >= 0 && lane == 31 - __clz(peers)) row[p] += __popc(peers);
        __syncwarp();
        if (p >= 0 && pos >= 0 && pos < R) {
            out_pair[pos] = u;
            out_rank[pos] = p;
        }
    }
}

int lrmoe_kcu_pack_assign(int64_t T, int K, int E, int P, const int32_t *topk_ids,
                          const uint8_t *keep, const int32_t *pair_rank,
                          const int64_t *bwd_alloc, int64_t R, int64_t *pair, int32_t *rank,
                          int64_t *counts, int64_t *offsets)
{
    if (T < 0 || K < 1 || E < 1 || P < 1 || R < 0) return lrmoe_err("pack_assign: bad sizes");
    if (P > WALK_MAX_P) return lrmoe_err("pack_assign: P=%d above %d ranks", P, WALK_MAX_P);
    cudaStream_t s = kcu_stream();
    int64_t N = T * K;
    kflag_t f;
    bucket_t b;
    int32_t *dest = NULL;
    int64_t *alloc = NULL;
    int rc = -1;
    if (flag_new(&f) < 0) return -1;
    if (bucket_build(N, E, topk_ids, NULL, f.d, &b) < 0) { flag_drop(&f); return -1; }
    if (lrmoe_kcu_alloc((void **)&dest, (size_t)(N ? N : 1) * 4) < 0) goto out;
    if (N) {
        k_check_pairs<<<KCU_GRID(k_check_pairs, N), KCU_THREADS(k_check_pairs), 0, s>>>(
            N, K, P, keep, pair_rank, f.d);
        KCU_LAUNCHED_GOTO("check_pairs");
    }
    if (!bwd_alloc) {
        if (lrmoe_kcu_alloc((void **)&alloc, (size_t)E * P * 8) < 0 ||
            lrmoe_kcu_memset(alloc, 0, (size_t)E * P * 8) < 0)
            goto out;
        if (N) {
            k_alloc_forward<<<KCU_GRID(k_alloc_forward, N), KCU_THREADS(k_alloc_forward), 0, s>>>(
                N, E, P, topk_ids, keep, pair_rank, (unsigned long long *)alloc);
            KCU_LAUNCHED_GOTO("alloc_forward");
        }
        bwd_alloc = alloc;
    }
    k_counts_offsets<<<1, KCU_THREADS(k_counts_offsets), 0, s>>>(
        E, P, bwd_alloc, R, counts, offsets, f.d);
    KCU_LAUNCHED_GOTO("counts_offsets");
    k_pack_walk<<<E, KCU_THREADS(k_pack_walk), WALK_SMEM(P), s>>>(
        E, P, b.list, b.start, keep, pair_rank, bwd_alloc, offsets, R, dest, pair, rank, f.d);
    KCU_LAUNCHED_GOTO("pack_walk");
    rc = 0;
out:
    bucket_free(&b);
    lrmoe_kcu_free(dest);
    lrmoe_kcu_free(alloc);
    if (rc < 0) { flag_drop(&f); return -1; }
    return flag_check(&f, "pack_assign", K, P);
}

/* ---------------------------------------------------------------- gather
 * The memory-bound kernels (gather, unpack, combine; k_widen in gemm.cu) walk
 * rows, not flat elements: a row's 1 << sh threads take its vectors
 * (16-byte where sizes and pointers allow), so no thread divides by the row
 * length, and a token row index u / K is kdiv_q (kernels/kdiv.h). No loop is
 * unrolled (an unrolled grid-stride loop divides for its trip count);
 * tests/gpu/divfree.py checks their PTX (make check) and SASS (device-check)
 * for integer division. */

#define ROW_WALK(r, R, sh)                                                        \
    _Pragma("unroll 1") for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> (sh); \
                             r < (R); r += ((int64_t)gridDim.x * blockDim.x) >> (sh))
#define COL_WALK(c, nv, sh)                                                       \
    _Pragma("unroll 1") for (int64_t c = threadIdx.x & ((1u << (sh)) - 1u); c < (nv); \
                             c += (int64_t)1 << (sh))

/* launch geometry of a row walk over R rows of nv items at KCU_TPB threads */
#define ROW_SHIFT(nv) kdiv_row_shift((nv), KCU_TPB)
#define ROW_GRID(k, R, sh) KCU_GRID(k, (R) << (sh))

__device__ __forceinline__ float4 f4_scale(float a, float4 x)
{
    return make_float4(__fmul_rn(a, x.x), __fmul_rn(a, x.y), __fmul_rn(a, x.z), __fmul_rn(a, x.w));
}
__device__ __forceinline__ float4 f4_add(float4 s, float4 x)
{
    return make_float4(__fadd_rn(s.x, x.x), __fadd_rn(s.y, x.y), __fadd_rn(s.z, x.z), __fadd_rn(s.w, x.w));
}
__device__ __forceinline__ float f4_scale(float a, float x) { return __fmul_rn(a, x); }
__device__ __forceinline__ float f4_add(float s, float x) { return __fadd_rn(s, x); }
__device__ __forceinline__ uint2 bf_pack(float4 v)
{
    return make_uint2((uint32_t)f2bf(v.x) | (uint32_t)f2bf(v.y) << 16,
                      (uint32_t)f2bf(v.z) | (uint32_t)f2bf(v.w) << 16);
}
__device__ __forceinline__ uint16_t bf_pack(float v) { return f2bf(v); }
template <typename F> __device__ __forceinline__ F fzero();
template <> __device__ __forceinline__ float fzero<float>() { return 0.0f; }
template <> __device__ __forceinline__ float4 fzero<float4>() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
/* the BF16 vector of an F32 vector type: 4 BF16 in 8 bytes */
template <typename F> struct bfvec { typedef uint16_t T; };
template <> struct bfvec<float4> { typedef uint2 T; };

static inline int al16(const void *a, const void *b) { return (((uintptr_t)a | (uintptr_t)b) & 15) == 0; }

template <typename V>
__global__ void k_gather(const int64_t *pair, int64_t R, kdiv_t K, int by_token, const V *src,
                         int64_t nv, int sh, V *dst)
{
    ROW_WALK(r, R, sh) {
        int64_t u = pair[r];
        const V *s = src + (by_token ? kdiv_q(u, K) : u) * nv;
        V *d = dst + r * nv;
        COL_WALK(c, nv, sh) d[c] = s[c];
    }
}

template <typename V>
static void gather_launch(const int64_t *pair, int64_t R, int K, int by_token, const void *src,
                          size_t row_bytes, void *dst, cudaStream_t s)
{
    int64_t nv = (int64_t)(row_bytes / sizeof(V));
    int sh = ROW_SHIFT(nv);
    k_gather<V><<<ROW_GRID(k_gather, R, sh), KCU_THREADS(k_gather), 0, s>>>(
        pair, R, kdiv_make(K), by_token, (const V *)src, nv, sh, (V *)dst);
}

int lrmoe_kcu_pack_gather(const int64_t *pair, int64_t R, int K, int by_token, const void *src,
                          size_t row_bytes, void *dst)
{
    if (R < 0 || K < 1) return lrmoe_err("pack_gather: bad sizes");
    if (!R || !row_bytes) return 0;
    cudaStream_t s = kcu_stream();
    uintptr_t al = (uintptr_t)src | (uintptr_t)dst | (uintptr_t)row_bytes;
    if (al % 16 == 0) gather_launch<uint4>(pair, R, K, by_token, src, row_bytes, dst, s);
    else if (al % 8 == 0) gather_launch<uint2>(pair, R, K, by_token, src, row_bytes, dst, s);
    else if (al % 4 == 0) gather_launch<uint32_t>(pair, R, K, by_token, src, row_bytes, dst, s);
    else gather_launch<uint8_t>(pair, R, K, by_token, src, row_bytes, dst, s);
    KCU_LAUNCHED("pack_gather");
    return 0;
}

/* dst row r = alpha[u] * g row u/K, u = pair[r]; F is float or float4 (nv =
 * D/4 vectors), O the output element: F itself, or its BF16 vector */
template <typename F, typename O>
__global__ void k_gather_scaled(const int64_t *pair, int64_t R, kdiv_t K, int64_t nv, int sh,
                                const F *g, const float *alpha, O *dst)
{
    ROW_WALK(r, R, sh) {
        int64_t u = pair[r];
        float a = alpha[u];
        const F *s = g + kdiv_q(u, K) * nv;
        O *d = dst + r * nv;
        COL_WALK(c, nv, sh) d[c] = f4_scale(a, s[c]);
    }
}
template <typename F, typename O>
__global__ void k_gather_scaled_bf16(const int64_t *pair, int64_t R, kdiv_t K, int64_t nv, int sh,
                                     const F *g, const float *alpha, O *dst)
{
    ROW_WALK(r, R, sh) {
        int64_t u = pair[r];
        float a = alpha[u];
        const F *s = g + kdiv_q(u, K) * nv;
        O *d = dst + r * nv;
        COL_WALK(c, nv, sh) d[c] = bf_pack(f4_scale(a, s[c]));
    }
}

int lrmoe_kcu_pack_gather_scaled(const int64_t *pair, int64_t R, int K, int64_t D,
                                 const float *g, const float *alpha, float *dst)
{
    if (R < 0 || K < 1 || D < 0) return lrmoe_err("pack_gather_scaled: bad sizes");
    if (!R || !D) return 0;
    cudaStream_t s = kcu_stream();
    if (D % 4 == 0 && al16(g, dst)) {
        int sh = ROW_SHIFT(D / 4);
        k_gather_scaled<float4, float4><<<ROW_GRID(k_gather_scaled, R, sh), KCU_THREADS(k_gather_scaled), 0, s>>>(
            pair, R, kdiv_make(K), D / 4, sh, (const float4 *)g, alpha, (float4 *)dst);
    } else {
        int sh = ROW_SHIFT(D);
        k_gather_scaled<float, float><<<ROW_GRID(k_gather_scaled, R, sh), KCU_THREADS(k_gather_scaled), 0, s>>>(
            pair, R, kdiv_make(K), D, sh, g, alpha, dst);
    }
    KCU_LAUNCHED("pack_gather_scaled");
    return 0;
}

int lrmoe_kcu_pack_gather_scaled_bf16(const int64_t *pair, int64_t R, int K, int64_t D,
                                      const float *g, const float *alpha, uint16_t *dst)
{
    if (R < 0 || K < 1 || D < 0) return lrmoe_err("pack_gather_scaled_bf16: bad sizes");
    if (!R || !D) return 0;
    cudaStream_t s = kcu_stream();
    if (D % 4 == 0 && ((uintptr_t)g & 15) == 0 && ((uintptr_t)dst & 7) == 0) {
        int sh = ROW_SHIFT(D / 4);
        k_gather_scaled_bf16<float4, uint2><<<ROW_GRID(k_gather_scaled_bf16, R, sh),
                                              KCU_THREADS(k_gather_scaled_bf16), 0, s>>>(
            pair, R, kdiv_make(K), D / 4, sh, (const float4 *)g, alpha, (uint2 *)dst);
    } else {
        int sh = ROW_SHIFT(D);
        k_gather_scaled_bf16<float, uint16_t><<<ROW_GRID(k_gather_scaled_bf16, R, sh),
                                                KCU_THREADS(k_gather_scaled_bf16), 0, s>>>(
            pair, R, kdiv_make(K), D, sh, g, alpha, dst);
    }
    KCU_LAUNCHED("pack_gather_scaled_bf16");
    return 0;
}

/* ---------------------------------------------------------------- unpack */

__global__ void k_inverse(const int64_t *pair, int64_t R, int64_t N, unsigned long long *inv,
                          unsigned long long *fl)
{
    GRID_STRIDE(i, R) {
        int64_t u = pair[i];
        if (u < 0 || u >= N) { flag_set(fl, FL_PAIR, i); continue; }
        if (atomicCAS(&inv[u], ~0ull, (unsigned long long)i) != ~0ull) flag_set(fl, FL_DUP, i);
    }
}

/* out[t] = sum over k ascending of rows[inv[t*K+k]], from +0.0f; F is float
 * or float4 (nv = D/4 vectors a row). */
template <typename F>
__global__ void k_unpack(int64_t T, int K, int64_t nv, int sh, const unsigned long long *inv,
                         const F *rows, F *out)
{
    ROW_WALK(t, T, sh) {
        const unsigned long long *it = inv + t * K;
        F *o = out + t * nv;
        COL_WALK(c, nv, sh) {
            F s = fzero<F>();
            _Pragma("unroll 1") for (int k = 0; k < K; k++) {
                unsigned long long r = it[k];
                if (r != ~0ull) s = f4_add(s, rows[(int64_t)r * nv + c]);
            }
            o[c] = s;
        }
    }
}

int lrmoe_kcu_pack_unpack(const int64_t *pair, int64_t R, const float *rows, int64_t D,
                          int64_t T, int K, float *out)
{
    if (R < 0 || T < 0 || K < 1 || D < 0) return lrmoe_err("pack_unpack: bad sizes");
    cudaStream_t s = kcu_stream();
    int64_t N = T * K;
    unsigned long long *inv = NULL;
    kflag_t f;
    if (!T || !D) return 0;
    if (flag_new(&f) < 0) return -1;
    if (lrmoe_kcu_alloc((void **)&inv, (size_t)N * 8) < 0 ||
        lrmoe_kcu_memset(inv, 0xFF, (size_t)N * 8) < 0) {
        flag_drop(&f);
        lrmoe_kcu_free(inv);
        return -1;
    }
    if (R) k_inverse<<<KCU_GRID(k_inverse, R), KCU_THREADS(k_inverse), 0, s>>>(
        pair, R, N, inv, f.d);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) {
        if (D % 4 == 0 && al16(rows, out)) {
            int sh = ROW_SHIFT(D / 4);
            k_unpack<float4><<<ROW_GRID(k_unpack, T, sh), KCU_THREADS(k_unpack), 0, s>>>(
                T, K, D / 4, sh, inv, (const float4 *)rows, (float4 *)out);
        } else {
            int sh = ROW_SHIFT(D);
            k_unpack<float><<<ROW_GRID(k_unpack, T, sh), KCU_THREADS(k_unpack), 0, s>>>(
                T, K, D, sh, inv, rows, out);
        }
        e = cudaGetLastError();
    }
    lrmoe_kcu_free(inv);
    if (e != cudaSuccess) {
        flag_drop(&f);
        return lrmoe_err("kernel pack_unpack: %s", cudaGetErrorString(e));
    }
    return flag_check(&f, "pack_unpack", K, 1);
}

/* ---------------------------------------------------------------- SwiGLU
 * Same operation order as lib/swiglu.c; the _rn intrinsics keep nvcc from
 * contracting into FMAs, so the only difference left is expf's last bits. */

__device__ __forceinline__ float sigm(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }

__global__ void k_swiglu_fwd(int64_t n, int64_t F, const float *g, const float *u, float *phi,
                             float *sqnorm)
{
    int lane = threadIdx.x & 31;
    int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t i = warp; i < n; i += nwarps) {
        double s = 0;
        for (int64_t j = lane; j < F; j += 32) {
            int64_t x = i * F + j;
            float gi = g[x];
            float v = __fmul_rn(__fmul_rn(gi, sigm(gi)), u[x]);
            phi[x] = v;
            s += (double)v * v;
        }
        if (sqnorm) {
            s = warp_sum(s);
            if (lane == 0) sqnorm[i] = (float)s;
        }
    }
}

int lrmoe_kcu_swiglu_fwd(int64_t n, int64_t F, const float *g, const float *u, float *phi,
                         float *sqnorm)
{
    if (n < 0 || F < 0) return lrmoe_err("swiglu_fwd: bad sizes");
    if (!n) return 0;
    k_swiglu_fwd<<<KCU_GRID(k_swiglu_fwd, n * 32), KCU_THREADS(k_swiglu_fwd), 0, kcu_stream()>>>(
        n, F, g, u, phi, sqnorm);
    KCU_LAUNCHED("swiglu_fwd");
    return 0;
}

__global__ void k_swiglu_bwd(int64_t m, const float *g, const float *u, const float *dphi,
                             float *dg, float *du, float *phi)
{
    GRID_STRIDE(j, m) {
        float gj = g[j], uj = u[j], dp = dphi[j];
        float sg = sigm(gj);
        float si = __fmul_rn(gj, sg);
        du[j] = __fmul_rn(dp, si);
        float t = __fadd_rn(1.0f, __fmul_rn(gj, __fsub_rn(1.0f, sg)));
        dg[j] = __fmul_rn(__fmul_rn(__fmul_rn(dp, uj), sg), t);
        if (phi) phi[j] = __fmul_rn(si, uj);
    }
}

int lrmoe_kcu_swiglu_bwd(int64_t n, int64_t F, const float *g, const float *u,
                         const float *dphi, float *dg, float *du, float *phi)
{
    if (n < 0 || F < 0) return lrmoe_err("swiglu_bwd: bad sizes");
    int64_t m = n * F;
    if (!m) return 0;
    k_swiglu_bwd<<<KCU_GRID(k_swiglu_bwd, m), KCU_THREADS(k_swiglu_bwd), 0, kcu_stream()>>>(
        m, g, u, dphi, dg, du, phi);
    KCU_LAUNCHED("swiglu_bwd");
    return 0;
}

/* BF16 saved state in, BF16 GEMM operands out: the F32 values never touch
 * memory. */
__global__ void k_swiglu_bwd_bf16(int64_t m, const uint16_t *g, const uint16_t *u,
                                  const float *dphi, uint16_t *dg, uint16_t *du, uint16_t *phi)
{
    GRID_STRIDE(j, m) {
        float gj = bf2f(g[j]), uj = bf2f(u[j]), dp = dphi[j];
        float sg = sigm(gj);
        float si = __fmul_rn(gj, sg);
        du[j] = f2bf(__fmul_rn(dp, si));
        float t = __fadd_rn(1.0f, __fmul_rn(gj, __fsub_rn(1.0f, sg)));
        dg[j] = f2bf(__fmul_rn(__fmul_rn(__fmul_rn(dp, uj), sg), t));
        if (phi) phi[j] = f2bf(__fmul_rn(si, uj));
    }
}

int lrmoe_kcu_swiglu_bwd_bf16(int64_t n, int64_t F, const uint16_t *g, const uint16_t *u,
                              const float *dphi, uint16_t *dg, uint16_t *du, uint16_t *phi)
{
    if (n < 0 || F < 0) return lrmoe_err("swiglu_bwd_bf16: bad sizes");
    int64_t m = n * F;
    if (!m) return 0;
    cudaStream_t s = kcu_stream();
    k_swiglu_bwd_bf16<<<KCU_GRID(k_swiglu_bwd_bf16, m), KCU_THREADS(k_swiglu_bwd_bf16), 0, s>>>(
        m, g, u, dphi, dg, du, phi);
    KCU_LAUNCHED("swiglu_bwd_bf16");
    return 0;
}

/* ---------------------------------------------------------------- combine */

/* out[t] = sum over k ascending of alpha[u] * y[row[u]], u = t*K+k, from
 * +0.0f; F is float or float4 (nv = D/4 vectors a row). */
template <typename F>
__global__ void k_combine(int64_t T, int K, int64_t nv, int sh, const float *alpha,
                          const int64_t *row, const F *y, F *out)
{
    ROW_WALK(t, T, sh) {
        const int64_t *rt = row + t * K;
        const float *at = alpha + t * K;
        F *o = out + t * nv;
        COL_WALK(c, nv, sh) {
            F s = fzero<F>();
            _Pragma("unroll 1") for (int k = 0; k < K; k++) {
                int64_t r = rt[k];
                if (r < 0) continue;
                s = f4_add(s, f4_scale(at[k], y[r * nv + c]));
            }
            o[c] = s;
        }
    }
}

int lrmoe_kcu_combine(int64_t T, int K, int64_t D, const float *alpha, const int64_t *row,
                      const float *y, float *out)
{
    if (T < 0 || K < 1 || D < 0) return lrmoe_err("combine: bad sizes");
    if (!T || !D) return 0;
    cudaStream_t s = kcu_stream();
    if (D % 4 == 0 && al16(y, out)) {
        int sh = ROW_SHIFT(D / 4);
        k_combine<float4><<<ROW_GRID(k_combine, T, sh), KCU_THREADS(k_combine), 0, s>>>(
            T, K, D / 4, sh, alpha, row, (const float4 *)y, (float4 *)out);
    } else {
        int sh = ROW_SHIFT(D);
        k_combine<float><<<ROW_GRID(k_combine, T, sh), KCU_THREADS(k_combine), 0, s>>>(
            T, K, D, sh, alpha, row, y, out);
    }
    KCU_LAUNCHED("combine");
    return 0;
}

__global__ void k_pair_dot(int64_t N, int K, int64_t D, const float *g, const int64_t *row,
                           const float *y, float *out)
{
    int lane = threadIdx.x & 31;
    int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t u = warp; u < N; u += nwarps) {
        int64_t r = row[u];
        double s = 0;
        if (r >= 0) {
            const float *gt = g + (u / K) * D, *yr = y + r * D;
            for (int64_t j = lane; j < D; j += 32) s += (double)gt[j] * yr[j];
        }
        s = warp_sum(s);
        if (lane == 0) out[u] = (float)s;
    }
}

int lrmoe_kcu_pair_dot(int64_t T, int K, int64_t D, const float *g, const int64_t *row,
                       const float *y, float *out)
{
    if (T < 0 || K < 1 || D < 0) return lrmoe_err("pair_dot: bad sizes");
    int64_t N = T * K;
    if (!N) return 0;
    k_pair_dot<<<KCU_GRID(k_pair_dot, N * 32), KCU_THREADS(k_pair_dot), 0, kcu_stream()>>>(
        N, K, D, g, row, y, out);
    KCU_LAUNCHED("pair_dot");
    return 0;
}
