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

static int gemm_loop(lrmoe_kcu_ctx_t *c, int ngemm, const lrmoe_gemm_t *g)
{
    KCU_CUDA(cudaEventRecord(c->ev_fork, c->stream));
    for (int i = 0; i < c->nstreams; i++) KCU_CUDA(cudaStreamWaitEvent(c->side[i], c->ev_fork, 0));
    int next = 0;
    for (int i = 0; i < ngemm; i++) {
        const lrmoe_gemm_t *x = &g[i];
        if (!x->m || !x->n) continue;
        int sidx = next++ % c->nstreams;
        if (!x->k) {
            if (x->beta == 0.0f && zero_c(x, c->side[sidx]) < 0) return -1;
            continue;
        }
        if (gemm_one(c->blas[sidx], x) < 0) return -1;
    }
    for (int i = 0; i < c->nstreams; i++) {
        KCU_CUDA(cudaEventRecord(c->ev_join[i], c->side[i]));
        KCU_CUDA(cudaStreamWaitEvent(c->stream, c->ev_join[i], 0));
    }
    return 0;
}

/* One group's F32 output from its BF16 temporary (m, n) with row stride
 * tld: C = beta*C + tmp. */
typedef struct {
    float *c;
    const uint16_t *tmp;
    int64_t m, n, ldc, tld;
    float beta;
} widen_t;

__global__ void k_widen(const widen_t *w)
{
    widen_t x = w[blockIdx.y];
    int64_t mn = x.m * x.n;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < mn;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / x.n, q = i - r * x.n;
        float v = __uint_as_float((uint32_t)x.tmp[r * x.tld + q] << 16);
        float *p = x.c + r * x.ldc + q;
        *p = x.beta != 0.0f ? __fadd_rn(*p, v) : v;
    }
}

struct grouped_bufs {
    int *mi, *ni, *ki, *lda, *ldb, *ldc, *gsz;
    cublasOperation_t *ta, *tb;
    float *alpha, *beta;
    const void **ha, **hb;
    void **hc;
    widen_t *hw;
};

static int gemm_grouped(lrmoe_kcu_ctx_t *c, int ngemm, const lrmoe_gemm_t *g)
{
    cudaStream_t s = c->side[0];
    int rc = -1, ng = 0, nw = 0;
    size_t tmp_elems = 0;
    uint16_t *tmp = NULL;
    void **dptr = NULL;
    widen_t *dw = NULL;
    grouped_bufs b;
    memset(&b, 0, sizeof b);
    size_t n = (size_t)(ngemm ? ngemm : 1);
    b.mi = (int *)malloc(n * sizeof(int)); b.ni = (int *)malloc(n * sizeof(int));
    b.ki = (int *)malloc(n * sizeof(int)); b.lda = (int *)malloc(n * sizeof(int));
    b.ldb = (int *)malloc(n * sizeof(int)); b.ldc = (int *)malloc(n * sizeof(int));
    b.gsz = (int *)malloc(n * sizeof(int));
    b.ta = (cublasOperation_t *)malloc(n * sizeof(cublasOperation_t));
    b.tb = (cublasOperation_t *)malloc(n * sizeof(cublasOperation_t));
    b.alpha = (float *)malloc(n * sizeof(float)); b.beta = (float *)malloc(n * sizeof(float));
    b.ha = (const void **)malloc(3 * n * sizeof(void *));
    b.hw = (widen_t *)malloc(n * sizeof(widen_t));
    if (!b.mi || !b.ni || !b.ki || !b.lda || !b.ldb || !b.ldc || !b.gsz || !b.ta || !b.tb ||
        !b.alpha || !b.beta || !b.ha || !b.hw) {
        lrmoe_err("out of memory");
        goto out;
    }
    b.hb = b.ha + n;
    b.hc = (void **)(b.ha + 2 * n);
    /* BF16 temporaries for F32 outputs */
    for (int i = 0; i < ngemm; i++)
        if (g[i].m && g[i].n && g[i].k && !g[i].c_bf16 && grouped_aligned(&g[i]))
            tmp_elems += (size_t)g[i].m * (size_t)tmp_ld(g[i].n);
    if (cudaEventRecord(c->ev_fork, c->stream) != cudaSuccess ||
        cudaStreamWaitEvent(s, c->ev_fork, 0) != cudaSuccess) {
        lrmoe_err("cudaEventRecord/cudaStreamWaitEvent: %s", cudaGetErrorString(cudaGetLastError()));
        goto out;
    }
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
        cudaError_t e = cudaMallocAsync((void **)&dptr, 3 * (size_t)ng * sizeof(void *), s);
        if (e != cudaSuccess) { lrmoe_err("cudaMallocAsync: %s", cudaGetErrorString(e)); goto out; }
        /* pointer arrays live in device memory (cuBLAS reads them there);
         * from pageable host memory the copy has consumed the source when
         * cudaMemcpyAsync returns */
        e = cudaMemcpyAsync(dptr, b.ha, (size_t)ng * sizeof(void *), cudaMemcpyHostToDevice, s);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(dptr + ng, b.hb, (size_t)ng * sizeof(void *), cudaMemcpyHostToDevice, s);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(dptr + 2 * ng, b.hc, (size_t)ng * sizeof(void *), cudaMemcpyHostToDevice, s);
        if (e != cudaSuccess) { lrmoe_err("cudaMemcpyAsync: %s", cudaGetErrorString(e)); goto out; }
        cublasStatus_t st = cublasGemmGroupedBatchedEx(
            c->blas[0], b.ta, b.tb, b.mi, b.ni, b.ki, b.alpha, (const void *const *)dptr,
            CUDA_R_16BF, b.lda, (const void *const *)(dptr + ng), CUDA_R_16BF, b.ldb, b.beta,
            (void *const *)(dptr + 2 * ng), CUDA_R_16BF, b.ldc, ng, b.gsz, CUBLAS_COMPUTE_32F);
        if (st != CUBLAS_STATUS_SUCCESS) {
            lrmoe_err("cublasGemmGroupedBatchedEx: %s", cublasGetStatusString(st));
            goto out;
        }
    }
    if (nw) {
        cudaError_t e = cudaMallocAsync((void **)&dw, (size_t)nw * sizeof(widen_t), s);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(dw, b.hw, (size_t)nw * sizeof(widen_t), cudaMemcpyHostToDevice, s);
        if (e != cudaSuccess) { lrmoe_err("cudaMemcpyAsync: %s", cudaGetErrorString(e)); goto out; }
        for (int base = 0; base < nw; base += 65535) {
            int cnt = nw - base < 65535 ? nw - base : 65535;
            k_widen<<<dim3(64, (unsigned)cnt), 256, 0, s>>>(dw + base);
            e = cudaGetLastError();
            if (e != cudaSuccess) { lrmoe_err("kernel widen: %s", cudaGetErrorString(e)); goto out; }
        }
    }
    rc = 0;
out:
    if (dptr) (void)cudaFreeAsync(dptr, s);
    if (dw) (void)cudaFreeAsync(dw, s);
    if (tmp) (void)cudaFreeAsync(tmp, s);
    if (cudaEventRecord(c->ev_join[0], s) != cudaSuccess ||
        cudaStreamWaitEvent(c->stream, c->ev_join[0], 0) != cudaSuccess) {
        if (rc == 0) rc = lrmoe_err("cudaEventRecord/cudaStreamWaitEvent: %s",
                                    cudaGetErrorString(cudaGetLastError()));
    }
    free(b.mi); free(b.ni); free(b.ki); free(b.lda); free(b.ldb); free(b.ldc); free(b.gsz);
    free(b.ta); free(b.tb); free(b.alpha); free(b.beta); free(b.ha); free(b.hw);
    return rc;
}

int lrmoe_kcu_gemm(int ngemm, const lrmoe_gemm_t *g)
{
    lrmoe_kcu_ctx_t *c = lrmoe_kcu_current();
    if (!c) return lrmoe_err("gemm: no CUDA context (lrmoe_kcu_use)");
    if (ngemm < 0) return lrmoe_err("gemm: negative count");
    if (gemm_check(ngemm, g) < 0) return -1;
    if (!ngemm) return 0;
    return c->gemm_impl == LRMOE_GEMM_GROUPED ? gemm_grouped(c, ngemm, g) : gemm_loop(c, ngemm, g);
}
