/* Grouped GEMMs through cuBLAS: BF16 operands, F32 accumulation.
 *
 * The GEMMs of lrmoe_kcu_gemm are row-major (lrmoe_gemm_t). cuBLAS is
 * column-major, and a row-major (m,n) C is a column-major (n,m) C^T, so
 *   C = op(A) op(B)   is computed as   C^T = op(B)^T op(A)^T
 * by passing B first: cublas(opB, opA, n, m, k, B, ldb, A, lda, C, ldc).
 *
 * LOOP: one cublasGemmEx per GEMM, round-robin over the context's side
 * streams (each with its own handle, so no workspace is shared between
 * concurrent GEMMs), forked from and joined back into the main stream by
 * events. C may be F32 or BF16.
 *
 * GROUPED: one cublasGemmGroupedBatchedEx call (one group per GEMM). cuBLAS
 * documents BF16 A/B with BF16 C only for this call (compute 32F), so an F32
 * C is produced through a BF16 temporary and then added to beta*C in F32: the
 * accumulation is F32 inside cuBLAS, the result carries one BF16 rounding.
 * GEMMs whose operands miss the call's 16-byte alignment run as cublasGemmEx
 * on the same stream instead (grouped_aligned).
 *
 * GEMMs with m == 0 or n == 0 are skipped; k == 0 gives C = beta*C (zeroed
 * when beta == 0), as BLAS defines it.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "kcu_internal.h"
#include "ggemm_setup.h"

static int gemm_check(int ngemm, const lrmoe_gemm_t *g)
{
    for (int i = 0; i < ngemm; i++) {
        const lrmoe_gemm_t *x = &g[i];
        if (x->m < 0 || x->n < 0 || x->k < 0)
            return lrmoe_err("gemm %d: negative size", i);
        if (x->m > INT_MAX || x->n > INT_MAX || x->k > INT_MAX || x->lda > INT_MAX ||
            x->ldb > INT_MAX || x->ldc > INT_MAX)
            return lrmoe_err("gemm %d: size above INT_MAX", i);
        if (x->beta != 0.0f && x->beta != 1.0f)
            return lrmoe_err("gemm %d: beta must be 0 or 1", i);
        if (x->m && x->n) {
            if (x->ldc < x->n) return lrmoe_err("gemm %d: ldc < n", i);
            if (x->k) {
                if (x->lda < (x->ta ? x->m : x->k)) return lrmoe_err("gemm %d: lda too small", i);
                if (x->ldb < (x->tb ? x->k : x->n)) return lrmoe_err("gemm %d: ldb too small", i);
            }
        }
    }
    return 0;
}

/* C = 0 for a k == 0 GEMM with beta == 0. */
static int zero_c(const lrmoe_gemm_t *x, cudaStream_t s)
{
    size_t es = x->c_bf16 ? 2 : 4;
    KCU_CUDA(cudaMemset2DAsync(x->c, (size_t)x->ldc * es, 0, (size_t)x->n * es, (size_t)x->m, s));
    return 0;
}

/* One GEMM (m, n, k > 0) as one cublasGemmEx on handle h (operands swapped,
 * see top). */
static int gemm_one(cublasHandle_t h, const lrmoe_gemm_t *x)
{
    const float one = 1.0f;
    KCU_BLAS(cublasGemmEx(h, x->tb ? CUBLAS_OP_T : CUBLAS_OP_N, x->ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                          (int)x->n, (int)x->m, (int)x->k, &one, x->b, CUDA_R_16BF, (int)x->ldb,
                          x->a, CUDA_R_16BF, (int)x->lda, &x->beta, x->c,
                          x->c_bf16 ? CUDA_R_16BF : CUDA_R_32F, (int)x->ldc, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT));
    return 0;
}

/* cublasGemmGroupedBatchedEx reads BF16 matrices through device pointer
 * arrays it cannot inspect, so cuBLAS documents an alignment precondition
 * (16-byte pointers ideally, else alignment matching k*2 bytes) whose
 * violation is a misaligned-address fault. A GEMM goes into the grouped call
 * only when its BF16 operands start and every row starts on 16 bytes; the
 * others run as cublasGemmEx on the same handle and stream. (An F32 C goes
 * through the BF16 temporary, which is laid out aligned.) */
static int grouped_aligned(const lrmoe_gemm_t *x)
{
    uintptr_t p = (uintptr_t)x->a | (uintptr_t)x->b;
    if (x->c_bf16) p |= (uintptr_t)x->c;
    if (p % 16 || x->lda % 8 || x->ldb % 8) return 0;
    return x->c_bf16 ? x->ldc % 8 == 0 : x->n <= INT_MAX - 7;
}

/* Rows of an F32 C's BF16 temporary: n rounded up to 8 elements (16 bytes). */
static int64_t tmp_ld(int64_t n) { return (n + 7) & ~(int64_t)7; }

/* Join side streams 0..n-1 back into the main stream. When an event cannot
 * be recorded or waited for, the host waits for that side stream instead,
 * so whatever happens nothing queued on a side stream outlives the call
 * unordered (the caller frees operands on the main stream next). Returns
 * the first failure, cudaSuccess when every join was stream-ordered. */
static cudaError_t join_side(lrmoe_kcu_ctx_t *c, int n)
{
    cudaError_t first = cudaSuccess;
    for (int i = 0; i < n; i++) {
        cudaError_t e = cudaEventRecord(c->ev_join[i], c->side[i]);
        if (e == cudaSuccess) e = cudaStreamWaitEvent(c->stream, c->ev_join[i], 0);
        if (e != cudaSuccess) {
            (void)cudaStreamSynchronize(c->side[i]);
            if (first == cudaSuccess) first = e;
        }
    }
    return first;
}

/* Fork side streams 0..n-1 from the main stream; *forked = how many wait on
 * the fork (the ones join_side must join even when this fails). */
static int fork_side(lrmoe_kcu_ctx_t *c, int n, int *forked)
{
    *forked = 0;
    KCU_CUDA(cudaEventRecord(c->ev_fork, c->stream));
    for (int i = 0; i < n; i++) {
        KCU_CUDA(cudaStreamWaitEvent(c->side[i], c->ev_fork, 0));
        *forked = i + 1;
    }
    return 0;
}

/* The join after a fork, error or not; rc is the work's status (<0: its
 * message is set and stays the one reported). */
static int join_after(lrmoe_kcu_ctx_t *c, int forked, int rc)
{
    cudaError_t e = join_side(c, forked);
    if (e != cudaSuccess && rc == 0)
        rc = lrmoe_err("cudaEventRecord/cudaStreamWaitEvent: %s", cudaGetErrorString(e));
    return rc;
}

static int gemm_loop(lrmoe_kcu_ctx_t *c, int ngemm, const lrmoe_gemm_t *g)
{
    int forked = 0, rc = fork_side(c, c->nstreams, &forked), next = 0;
    for (int i = 0; rc == 0 && i < ngemm; i++) {
        const lrmoe_gemm_t *x = &g[i];
        if (!x->m || !x->n) continue;
        int sidx = next++ % c->nstreams;
        if (!x->k) {
            if (x->beta == 0.0f) rc = zero_c(x, c->side[sidx]);
            continue;
        }
        rc = gemm_one(c->blas[sidx], x);
    }
    return join_after(c, forked, rc);
}

__device__ __forceinline__ float widen_bf(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ float4 widen_bf(uint2 h)
{
    return make_float4(__uint_as_float(h.x << 16), __uint_as_float(h.x & 0xffff0000u),
                       __uint_as_float(h.y << 16), __uint_as_float(h.y & 0xffff0000u));
}
__device__ __forceinline__ float widen_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float4 widen_add(float4 a, float4 b)
{
    return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z),
                       __fadd_rn(a.w, b.w));
}

/* One group's F32 output from its BF16 temporary (m, n) with row stride
 * tld: C = beta*C + tmp. */
typedef struct {
    float *c;
    const uint16_t *tmp;
    int64_t m, n, ldc, tld;
    float beta;
} widen_t;

/* One group's rows, F a float (1 element) or float4 (4) vector: 1 << sh
 * threads a row, no division (see the row walks of kcu.cu). */
template <typename F, typename B>
__device__ __forceinline__ void widen_rows(const widen_t &x, int64_t nv, int sh)
{
    const int vs = sizeof(F) == 16 ? 2 : 0; /* strides in vectors */
    const int64_t cs = x.ldc >> vs, ts = x.tld >> vs;
    _Pragma("unroll 1") for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> sh;
                             r < x.m; r += ((int64_t)gridDim.x * blockDim.x) >> sh) {
        const B *t = (const B *)x.tmp + r * ts;
        F *o = (F *)x.c + r * cs;
        _Pragma("unroll 1") for (int64_t q = threadIdx.x & ((1u << sh) - 1u); q < nv;
                                 q += (int64_t)1 << sh) {
            F v = widen_bf(t[q]);
            o[q] = x.beta != 0.0f ? widen_add(o[q], v) : v;
        }
    }
}

__global__ void k_widen(const widen_t *w)
{
    widen_t x = w[blockIdx.y];
    /* 16-byte rows when n, both strides and both pointers allow */
    int vec = ((x.n | x.ldc | x.tld) & 3) == 0 && ((uintptr_t)x.c & 15) == 0 &&
              ((uintptr_t)x.tmp & 7) == 0;
    int64_t nv = vec ? x.n >> 2 : x.n;
    /* least power of two >= nv threads a row, at most the block */
    int sh = nv > 1 ? 64 - __clzll((unsigned long long)(nv - 1)) : 0, bsh = __ffs(blockDim.x) - 1;
    if (sh > bsh) sh = bsh;
    if (vec) widen_rows<float4, uint2>(x, nv, sh);
    else widen_rows<float, uint16_t>(x, nv, sh);
}

/* The grouped call's host arrays, carved out of one pinned staging slot
 * (kcu_stage, kcu_internal.h): per group the sizes and scalars cuBLAS reads
 * on the host, the three pointer arrays and the widen descriptors the
 * device reads after cudaMemcpyAsync. */
struct grouped_bufs {
    int *mi, *ni, *ki, *lda, *ldb, *ldc, *gsz;
    cublasOperation_t *ta, *tb;
    float *alpha, *beta;
    const void **ha, **hb;
    void **hc;
    widen_t *hw;
};

static size_t al16(size_t x) { return (x + 15) & ~(size_t)15; }

/* Lay the arrays for n groups out in `base` (NULL: only size them); returns
 * the bytes used. The three pointer arrays are adjacent (one copy). */
static size_t grouped_layout(size_t n, char *base, grouped_bufs *b)
{
    size_t off = 0;
#define GB_TAKE(field, type, count) do { \
        if (base) b->field = (type *)(base + off); \
        off = al16(off + (count) * sizeof(type)); } while (0)
    GB_TAKE(ha, const void *, 3 * n);
    GB_TAKE(hw, widen_t, n);
    GB_TAKE(mi, int, n); GB_TAKE(ni, int, n); GB_TAKE(ki, int, n);
    GB_TAKE(lda, int, n); GB_TAKE(ldb, int, n); GB_TAKE(ldc, int, n); GB_TAKE(gsz, int, n);
    GB_TAKE(ta, cublasOperation_t, n); GB_TAKE(tb, cublasOperation_t, n);
    GB_TAKE(alpha, float, n); GB_TAKE(beta, float, n);
#undef GB_TAKE
    if (base) {
        b->hb = b->ha + n;
        b->hc = (void **)(b->ha + 2 * n);
    }
    return off;
}

/* The next staging slot, at least `bytes` long, once the call that last
 * used it has run (kcu_stage). */
int kcu_stage_take(lrmoe_kcu_ctx_t *c, size_t bytes, kcu_stage **out)
{
    kcu_stage *st = &c->stage[c->stage_next];
    *out = NULL;
    if (st->pending) { /* wait only when its call may still run */
        cudaError_t q = cudaEventQuery(st->done);
        if (q == cudaErrorNotReady) {
            (void)cudaGetLastError(); /* not an error: clear it */
            KCU_CUDA(cudaEventSynchronize(st->done));
        } else if (q != cudaSuccess) {
            return lrmoe_err("cudaEventQuery: %s", cudaGetErrorString(q));
        }
        st->pending = 0;
    }
    if (st->bytes < bytes) {
        size_t nb = st->bytes ? st->bytes : 4096;
        while (nb < bytes) nb *= 2;
        if (st->host) KCU_CUDA(cudaFreeHost(st->host));
        st->host = NULL;
        st->bytes = 0;
        KCU_CUDA(cudaMallocHost(&st->host, nb));
        st->bytes = nb;
    }
    c->stage_next = (c->stage_next + 1) % KCU_STAGE_SLOTS;
    *out = st;
    return 0;
}

static int gemm_grouped(lrmoe_kcu_ctx_t *c, int ngemm, const lrmoe_gemm_t *g)
{
    cudaStream_t s = c->side[0];
    int rc = -1, ng = 0, nw = 0, forked = 0;
    size_t tmp_elems = 0;
    uint16_t *tmp = NULL;
    void **dptr = NULL;
    widen_t *dw = NULL;
    kcu_stage *st = NULL;
    grouped_bufs b;
    memset(&b, 0, sizeof b);
    size_t n = (size_t)(ngemm ? ngemm : 1);
    if (kcu_stage_take(c, grouped_layout(n, NULL, NULL), &st) < 0) return -1;
    grouped_layout(n, (char *)st->host, &b);
    /* BF16 temporaries for F32 outputs */
    for (int i = 0; i < ngemm; i++)
        if (g[i].m && g[i].n && g[i].k && !g[i].c_bf16 && grouped_aligned(&g[i]))
            tmp_elems += (size_t)g[i].m * (size_t)tmp_ld(g[i].n);
    if (fork_side(c, 1, &forked) < 0) goto out;
    if (tmp_elems) {
        cudaError_t e = cudaMallocAsync((void **)&tmp, tmp_elems * 2, s);
        if (e != cudaSuccess) { lrmoe_err("cudaMallocAsync: %s", cudaGetErrorString(e)); goto out; }
    }
    {
        size_t off = 0;
        for (int i = 0; i < ngemm; i++) {
            const lrmoe_gemm_t *x = &g[i];
            if (!x->m || !x->n) continue;
            if (!x->k) {
                if (x->beta == 0.0f && zero_c(x, s) < 0) goto out;
                continue;
            }
            if (!grouped_aligned(x)) {
                if (gemm_one(c->blas[0], x) < 0) goto out;
                continue;
            }
            b.ta[ng] = x->tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* operands swapped, see top */
            b.tb[ng] = x->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
            b.mi[ng] = (int)x->n; b.ni[ng] = (int)x->m; b.ki[ng] = (int)x->k;
            b.lda[ng] = (int)x->ldb; b.ldb[ng] = (int)x->lda;
            b.gsz[ng] = 1;
            b.alpha[ng] = 1.0f;
            b.ha[ng] = x->b; b.hb[ng] = x->a;
            if (x->c_bf16) {
                b.hc[ng] = x->c; b.ldc[ng] = (int)x->ldc; b.beta[ng] = x->beta;
            } else {
                int64_t tld = tmp_ld(x->n);
                b.hc[ng] = tmp + off; b.ldc[ng] = (int)tld; b.beta[ng] = 0.0f;
                widen_t w = {(float *)x->c, tmp + off, x->m, x->n, x->ldc, tld, x->beta};
                b.hw[nw++] = w;
                off += (size_t)x->m * (size_t)tld;
            }
            ng++;
        }
    }
    if (ng) {
        /* pointer arrays live in device memory (cuBLAS reads them there),
         * copied from the pinned slot, packed: A of every group, then B,
         * then C (hb and hc start right after the ng used entries) */
        if (ng < (int)n) {
            memmove(b.ha + ng, b.hb, (size_t)ng * sizeof(void *));
            memmove(b.ha + 2 * ng, b.hc, (size_t)ng * sizeof(void *));
        }
        cudaError_t e = cudaMallocAsync((void **)&dptr, 3 * (size_t)ng * sizeof(void *), s);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(dptr, b.ha, 3 * (size_t)ng * sizeof(void *),
                                cudaMemcpyHostToDevice, s);
        if (e != cudaSuccess) {
            lrmoe_err("cudaMallocAsync/cudaMemcpyAsync: %s", cudaGetErrorString(e));
            goto out;
        }
        cublasStatus_t bs = cublasGemmGroupedBatchedEx(
            c->blas[0], b.ta, b.tb, b.mi, b.ni, b.ki, b.alpha, (const void *const *)dptr,
            CUDA_R_16BF, b.lda, (const void *const *)(dptr + ng), CUDA_R_16BF, b.ldb, b.beta,
            (void *const *)(dptr + 2 * ng), CUDA_R_16BF, b.ldc, ng, b.gsz, CUBLAS_COMPUTE_32F);
        if (bs != CUBLAS_STATUS_SUCCESS) {
            lrmoe_err("cublasGemmGroupedBatchedEx: %s", cublasGetStatusString(bs));
            goto out;
        }
    }
    if (nw) {
        cudaError_t e = cudaMallocAsync((void **)&dw, (size_t)nw * sizeof(widen_t), s);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(dw, b.hw, (size_t)nw * sizeof(widen_t), cudaMemcpyHostToDevice, s);
        if (e != cudaSuccess) {
            lrmoe_err("cudaMallocAsync/cudaMemcpyAsync: %s", cudaGetErrorString(e));
            goto out;
        }
        for (int base = 0; base < nw; base += 65535) {
            int cnt = nw - base < 65535 ? nw - base : 65535;
            k_widen<<<dim3(64, (unsigned)cnt), KCU_THREADS(k_widen), 0, s>>>(dw + base);
            e = cudaGetLastError();
            if (e != cudaSuccess) { lrmoe_err("kernel widen: %s", cudaGetErrorString(e)); goto out; }
        }
    }
    rc = 0;
out:
    /* the slot may be refilled once everything queued above has run */
    if (cudaEventRecord(st->done, s) == cudaSuccess) st->pending = 1;
    else (void)cudaStreamSynchronize(s);
    if (dptr) (void)cudaFreeAsync(dptr, s);
    if (dw) (void)cudaFreeAsync(dw, s);
    if (tmp) (void)cudaFreeAsync(tmp, s);
    return join_after(c, forked, rc);
}

/* CUTLASS: the list split into launches by kcu_gg_split (one per operand
 * layout, C type and beta), each launch's arrays filled on the host in one
 * pinned staging slot and copied to the device in one copy, then one
 * CUTLASS grouped launch each (ggemm.cu); the GEMMs it cannot take run as
 * cublasGemmEx and k == 0 ones as zero_c, all on side stream 0. */
static int gemm_cutlass(lrmoe_kcu_ctx_t *c, int ngemm, const lrmoe_gemm_t *g)
{
    cudaStream_t s = c->side[0];
    int rc = -1, forked = 0;
    int *launch = (int *)malloc((size_t)ngemm * sizeof(int));
    int cnt[2 * KCU_GG_NVARIANTS] = {0};
    size_t off[2 * KCU_GG_NVARIANTS + 1];
    kcu_stage *st = NULL;
    char *dev = NULL;
    if (!launch) return lrmoe_err("gemm: out of memory");
    int n = kcu_gg_split(ngemm, g, launch);
    for (int i = 0; i < ngemm; i++)
        if (launch[i] >= 0) cnt[launch[i]]++;
    off[0] = 0;
    for (int l = 0; l < 2 * KCU_GG_NVARIANTS; l++)
        off[l + 1] = off[l] + al16(kcu_gg_bytes(cnt[l]));
    if (fork_side(c, 1, &forked) < 0) goto out;
    if (n) {
        size_t bytes = off[2 * KCU_GG_NVARIANTS];
        if (kcu_stage_take(c, bytes, &st) < 0) goto out;
        int fill[2 * KCU_GG_NVARIANTS] = {0};
        cudaError_t e = cudaMallocAsync((void **)&dev, bytes, s);
        if (e != cudaSuccess) { lrmoe_err("cudaMallocAsync: %s", cudaGetErrorString(e)); goto out; }
        for (int i = 0; i < ngemm; i++) {
            int l = launch[i];
            if (l < 0) continue;
            const lrmoe_gemm_t *x = &g[i];
            kcu_gg_arrays_t h;
            kcu_gg_carve((char *)st->host + off[l], cnt[l], &h);
            int j = fill[l]++;
            h.a[j] = x->a; h.b[j] = x->b; h.c[j] = x->c;
            h.lda[j] = x->lda; h.ldb[j] = x->ldb; h.ldc[j] = x->ldc;
            h.shapes[3 * j] = (int)x->m; h.shapes[3 * j + 1] = (int)x->n;
            h.shapes[3 * j + 2] = (int)x->k;
            h.zm[j] = 0;
        }
        e = cudaMemcpyAsync(dev, st->host, bytes, cudaMemcpyHostToDevice, s);
        if (e != cudaSuccess) { lrmoe_err("cudaMemcpyAsync: %s", cudaGetErrorString(e)); goto out; }
        for (int l = 0; l < 2 * KCU_GG_NVARIANTS; l++) {
            if (!cnt[l]) continue;
            if (kcu_gg_launch(c, l / 2, cnt[l], dev + off[l], 1.0f, (float)(l & 1), s) < 0) goto out;
        }
    }
    for (int i = 0; i < ngemm; i++) {
        const lrmoe_gemm_t *x = &g[i];
        if (launch[i] >= 0 || !x->m || !x->n) continue;
        if (!x->k) {
            if (x->beta == 0.0f && zero_c(x, s) < 0) goto out;
            continue;
        }
        if (gemm_one(c->blas[0], x) < 0) goto out;
    }
    rc = 0;
out:
    if (st) {
        if (cudaEventRecord(st->done, s) == cudaSuccess) st->pending = 1;
        else (void)cudaStreamSynchronize(s);
    }
    if (dev) (void)cudaFreeAsync(dev, s);
    free(launch);
    return join_after(c, forked, rc);
}

int lrmoe_kcu_gemm(int ngemm, const lrmoe_gemm_t *g)
{
    lrmoe_kcu_ctx_t *c = lrmoe_kcu_current();
    if (!c) return lrmoe_err("gemm: no CUDA context (lrmoe_kcu_use)");
    if (ngemm < 0) return lrmoe_err("gemm: negative count");
    if (gemm_check(ngemm, g) < 0) return -1;
    if (!ngemm) return 0;
    if (c->gemm_impl == LRMOE_GEMM_CUTLASS) {
        if (!lrmoe_kcu_have_cutlass())
            return lrmoe_err("gemm: --gemm cutlass: not built with CUTLASS (no headers found)");
        return gemm_cutlass(c, ngemm, g);
    }
    return c->gemm_impl == LRMOE_GEMM_GROUPED ? gemm_grouped(c, ngemm, g) : gemm_loop(c, ngemm, g);
}

int lrmoe_kcu_ggemm(const lrmoe_ggemm_t *d)
{
    lrmoe_kcu_ctx_t *c = lrmoe_kcu_current();
    if (!c) return lrmoe_err("ggemm: no CUDA context (lrmoe_kcu_use)");
    return kcu_gg_dev(c, d, c->stream);
}
