/* bench-ggemm: the Hopper grouped GEMM (--gemm cutlass, kernels/ggemm.cu)
 * against the cuBLAS loop, cuBLAS's grouped call and one dense cuBLAS BF16
 * GEMM of the same FLOPs, on one GPU.
 *
 * Shapes (Qwen3-30B-A3B expert, D = 2048, F = 768, K = 8): T = 4096 and
 * 16384 tokens per GPU, N = T*K rows over E = 128 and E = 16 local experts,
 * row counts drawn from a skewed popularity (~1/(rank+1)^0.8). The four GEMM
 * kinds of a layer step, all with F32 C:
 *   fc1    C (rows, F) = X_e (rows, D) W_gate,e^T        row-grouped, tb = 1
 *   dphi   C (rows, F) = dY_e (rows, D) W_down,e (D, F)  row-grouped, tb = 0
 *   dx     C (rows, D) = dG_e (rows, F) W_gate,e (F, D)  row-grouped, tb = 0
 *   dW     C_e (F, D) = dG_e^T X_e, K = rows of e        K-grouped
 * Implementations: loop (cublasGemmEx over 4 streams), grouped
 * (cublasGemmGroupedBatchedEx + widen), cutlass (the lrmoe_gemm_t list
 * through --gemm cutlass), cutlass-dev (lrmoe_kcu_ggemm: row offsets only in
 * device memory), dense (one cublasGemmEx of N rows, the same FLOPs).
 * Times: median of 5 CUDA-event times after 2 warm-ups.
 *
 * Agreement: cutlass-dev's and cutlass's F32 C against the loop's, per kind
 * (max |diff| / max |loop|; both accumulate BF16 products in F32, in
 * different orders: <= 1e-5 expected, FAIL above 1e-4).
 *
 *   bench-ggemm [--quick] [--counts FILE]
 * --quick: T = 4096 only. --counts: write "T E counts..." per shape (what
 * tests/gpu/ggemm-torch.py runs torch._grouped_mm on). Exit 0, 1 on an
 * error or a disagreement, 3 without a device, 4 when built without
 * CUTLASS (nothing to compare). */
#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <cuda_runtime.h>
extern "C" {
#include "lrmoe.h"
}
#include "kcu.h"

static void die(const char *what)
{
    fprintf(stderr, "bench-ggemm: %s: %s\n", what, lrmoe_errmsg());
    exit(1);
}
#define OK(x) do { if ((x) < 0) die(#x); } while (0)
#define CU(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "bench-ggemm: %s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static uint64_t rs = 0x2545F4914F6CDD1Dull;
static double urand(void)
{
    uint64_t z = (rs += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) * (1.0 / 9007199254740992.0);
}

static cudaStream_t S;
static const int reps = 5;

template <typename Fn> static double time_ms(Fn fn)
{
    cudaEvent_t a, b;
    CU(cudaEventCreate(&a));
    CU(cudaEventCreate(&b));
    for (int i = 0; i < 2; i++) fn();
    std::vector<float> t(reps);
    for (int i = 0; i < reps; i++) {
        CU(cudaEventRecord(a, S));
        fn();
        CU(cudaEventRecord(b, S));
        CU(cudaEventSynchronize(b));
        CU(cudaEventElapsedTime(&t[i], a, b));
    }
    CU(cudaEventDestroy(a));
    CU(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t[reps / 2];
}

/* BF16 in [-a, a] from a hash of the index (no host round trip) */
__global__ void k_fill(uint16_t *x, size_t n, uint32_t seed, float a)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15; h *= 0x2c1b3c6du; h ^= h >> 12;
        float f = ((h & 0xffffff) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * a;
        x[i] = (uint16_t)(__float_as_uint(f) >> 16);
    }
}
static uint16_t *bf(size_t n, uint32_t seed, float a)
{
    void *p;
    OK(lrmoe_kcu_alloc(&p, n * 2));
    k_fill<<<1024, 256, 0, S>>>((uint16_t *)p, n, seed, a);
    CU(cudaGetLastError());
    return (uint16_t *)p;
}
static float *f32(size_t n)
{
    void *p;
    OK(lrmoe_kcu_alloc(&p, n * 4));
    return (float *)p;
}

static lrmoe_gemm_t G(int64_t m, int64_t n, int64_t k, int ta, int tb, const void *a, int64_t lda,
                      const void *b, int64_t ldb, void *c, int64_t ldc)
{
    lrmoe_gemm_t g;
    memset(&g, 0, sizeof g);
    g.m = m; g.n = n; g.k = k; g.ta = ta; g.tb = tb; g.a = a; g.b = b; g.c = c;
    g.lda = lda; g.ldb = ldb; g.ldc = ldc; g.beta = 0.0f;
    return g;
}

/* max |a - b| / max |b| over n F32 values (host copies) */
static double rel_diff(const float *a, const float *b, size_t n)
{
    std::vector<float> ha(n), hb(n);
    CU(cudaMemcpy(ha.data(), a, n * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(hb.data(), b, n * 4, cudaMemcpyDeviceToHost));
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)ha[i] - hb[i]);
        if (!(d <= md)) md = d;  /* NaN wins */
        mb = fmax(mb, fabs((double)hb[i]));
    }
    return mb > 0 ? md / mb : md;
}

enum { K_FC1, K_DPHI, K_DX, K_DW, K_N };
static const char *kname[K_N] = {"fc1", "dphi", "dx", "dW"};
static int fails;

static void shape(lrmoe_kcu_ctx_t *ctx, int64_t T, int E, FILE *counts)
{
    const int64_t K = 8, D = 2048, F = 768, N = T * K;
    /* skewed counts summing to N */
    std::vector<double> cum(E);
    double tot = 0;
    for (int e = 0; e < E; e++) tot += 1.0 / pow((double)(e + 1), 0.8);
    double c = 0;
    for (int e = 0; e < E; e++) { c += 1.0 / pow((double)(((e * 37) % E) + 1), 0.8) / tot; cum[e] = c; }
    std::vector<int64_t> cnt(E, 0), off(E + 1, 0);
    for (int64_t i = 0; i < N; i++) {
        int e = (int)(std::lower_bound(cum.begin(), cum.end(), urand()) - cum.begin());
        cnt[e < E ? e : E - 1]++;
    }
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + cnt[e];
    if (counts) {
        fprintf(counts, "%lld %d", (long long)T, E);
        for (int e = 0; e < E; e++) fprintf(counts, " %lld", (long long)cnt[e]);
        fprintf(counts, "\n");
    }
    int64_t mn = *std::min_element(cnt.begin(), cnt.end()), mx = *std::max_element(cnt.begin(), cnt.end());
    printf("\nT=%lld tokens, N=%lld rows over E=%d local experts (rows/expert min %lld mean %lld "
           "max %lld), D=%lld F=%lld, F32 C\n", (long long)T, (long long)N, E, (long long)mn,
           (long long)(N / E), (long long)mx, (long long)D, (long long)F);
    uint16_t *X = bf((size_t)(N * D), 1, 1.0f), *dY = bf((size_t)(N * D), 2, 1.0f);
    uint16_t *dG = bf((size_t)(N * F), 3, 1.0f);
    uint16_t *W = bf((size_t)E * 3 * F * D, 4, 0.05f);
    int64_t *doff;
    OK(lrmoe_kcu_alloc((void **)&doff, (size_t)(E + 1) * 8));
    OK(lrmoe_kcu_h2d(doff, off.data(), (size_t)(E + 1) * 8));
    size_t cmax = (size_t)std::max(N * D, (int64_t)E * F * D);
    float *C0 = f32(cmax), *C1 = f32(cmax), *C2 = f32(cmax);
    OK(lrmoe_kcu_sync());
    const size_t FD = (size_t)(F * D);
    printf("%-6s %-12s %10s %10s %10s\n", "GEMM", "impl", "ms", "TFLOP/s", "vs dense");
    double sum_dense = 0, sum_cut = 0, sum_loop = 0;
    for (int k = 0; k < K_N; k++) {
        std::vector<lrmoe_gemm_t> v0, v1;
        lrmoe_ggemm_t dd;
        memset(&dd, 0, sizeof dd);
        dd.ngroups = E; dd.offsets = doff; dd.rows = N; dd.alpha = 1.0f; dd.beta = 0.0f;
        lrmoe_gemm_t dn;
        for (int e = 0; e < E; e++) {
            int64_t r = cnt[e], o = off[e];
            const uint16_t *We = W + (size_t)e * 3 * FD;
            lrmoe_gemm_t g;
            if (k == K_FC1) g = G(r, F, D, 0, 1, X + o * D, D, We, D, nullptr, F);
            else if (k == K_DPHI) g = G(r, F, D, 0, 0, dY + o * D, D, We + 2 * FD, F, nullptr, F);
            else if (k == K_DX) g = G(r, D, F, 0, 0, dG + o * F, F, We, D, nullptr, D);
            else g = G(F, D, r, 1, 0, dG + o * F, F, X + o * D, D, nullptr, D);
            size_t co = k == K_DW ? (size_t)e * FD : (size_t)(o * g.ldc);
            g.c = C0 + co; v0.push_back(g);
            g.c = C1 + co; v1.push_back(g);
        }
        if (k == K_FC1) {
            dn = G(N, F, D, 0, 1, X, D, W, D, C2, F);
            dd.kgrouped = 0; dd.n = F; dd.k = D; dd.tb = 1; dd.a = X; dd.lda = D;
            dd.b = W; dd.ldb = D; dd.sb = 3 * FD; dd.c = C2; dd.ldc = F;
        } else if (k == K_DPHI) {
            dn = G(N, F, D, 0, 0, dY, D, W + 2 * FD, F, C2, F);
            dd.kgrouped = 0; dd.n = F; dd.k = D; dd.tb = 0; dd.a = dY; dd.lda = D;
            dd.b = W + 2 * FD; dd.ldb = F; dd.sb = 3 * FD; dd.c = C2; dd.ldc = F;
        } else if (k == K_DX) {
            dn = G(N, D, F, 0, 0, dG, F, W, D, C2, D);
            dd.kgrouped = 0; dd.n = D; dd.k = F; dd.tb = 0; dd.a = dG; dd.lda = F;
            dd.b = W; dd.ldb = D; dd.sb = 3 * FD; dd.c = C2; dd.ldc = D;
        } else {
            dn = G(F, D, N, 1, 0, dG, F, X, D, C2, D);
            dd.kgrouped = 1; dd.m = F; dd.n = D; dd.ta = 1; dd.tb = 0; dd.a = dG; dd.lda = F;
            dd.b = X; dd.ldb = D; dd.sc = FD; dd.c = C2; dd.ldc = D;
        }
        double flop = k == K_DW ? 2.0 * F * D * N : 2.0 * N * dn.n * dn.k;
        lrmoe_kcu_set_gemm(ctx, LRMOE_GEMM_LOOP);
        double tdense = time_ms([&] { OK(lrmoe_kcu_gemm(1, &dn)); });
        double tl = time_ms([&] { OK(lrmoe_kcu_gemm((int)v0.size(), v0.data())); });
        lrmoe_kcu_set_gemm(ctx, LRMOE_GEMM_GROUPED);
        double tg = time_ms([&] { OK(lrmoe_kcu_gemm((int)v0.size(), v0.data())); });
        /* the loop's result again in C0 (grouped wrote it through BF16) */
        lrmoe_kcu_set_gemm(ctx, LRMOE_GEMM_LOOP);
        OK(lrmoe_kcu_gemm((int)v0.size(), v0.data()));
        lrmoe_kcu_set_gemm(ctx, LRMOE_GEMM_CUTLASS);
        double tc = time_ms([&] { OK(lrmoe_kcu_gemm((int)v1.size(), v1.data())); });
        double td = time_ms([&] { OK(lrmoe_kcu_ggemm(&dd)); });
        OK(lrmoe_kcu_sync());
        size_t cn = k == K_DW ? (size_t)E * FD : (size_t)(N * dn.n);
        double r1 = rel_diff(C1, C0, cn), r2 = rel_diff(C2, C0, cn);
        const char *impl[5] = {"dense", "loop", "grouped", "cutlass", "cutlass-dev"};
        double t[5] = {tdense, tl, tg, tc, td};
        for (int i = 0; i < 5; i++)
            printf("%-6s %-12s %10.3f %10.1f %10.2f\n", kname[k], impl[i], t[i], flop / t[i] * 1e-9,
                   tdense / t[i]);
        int bad = !(r1 <= 1e-4) || !(r2 <= 1e-4);
        fails += bad;
        printf("%-6s agreement with the loop: cutlass %.2e, cutlass-dev %.2e (max|diff|/max|loop|, "
               "limit 1e-4): %s\n", kname[k], r1, r2, bad ? "FAIL" : "ok");
        sum_dense += tdense; sum_cut += td; sum_loop += tl;
    }
    printf("T=%lld E=%d: grouped/dense (cutlass-dev, four kinds) %.2f, loop/dense %.2f%s\n",
           (long long)T, E, sum_dense / sum_cut, sum_dense / sum_loop,
           E == 16 ? " (target >= 0.85 at 16 local experts)" : "");
    OK(lrmoe_kcu_free(X)); OK(lrmoe_kcu_free(dY)); OK(lrmoe_kcu_free(dG)); OK(lrmoe_kcu_free(W));
    OK(lrmoe_kcu_free(doff)); OK(lrmoe_kcu_free(C0)); OK(lrmoe_kcu_free(C1)); OK(lrmoe_kcu_free(C2));
    OK(lrmoe_kcu_sync());
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int quick = 0;
    const char *cpath = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--counts") && i + 1 < argc) cpath = argv[++i];
        else {
            fprintf(stderr, "usage: bench-ggemm [--quick] [--counts FILE]\n");
            return 2;
        }
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("bench-ggemm: no CUDA device: nothing measured\n");
        return 3;
    }
    if (!lrmoe_kcu_have_cutlass()) {
        printf("bench-ggemm: built without CUTLASS: nothing to compare\n");
        return 4;
    }
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("bench-ggemm: device %s (%d SMs, sm_%d%d)\n", prop.name, prop.multiProcessorCount,
           prop.major, prop.minor);
    lrmoe_kcu_ctx_t *ctx;
    OK(lrmoe_kcu_ctx_create(0, 4, &ctx));
    OK(lrmoe_kcu_use(ctx));
    S = (cudaStream_t)lrmoe_kcu_stream(ctx);
    FILE *counts = cpath ? fopen(cpath, "w") : NULL;
    if (cpath && !counts) { perror(cpath); return 1; }
    int64_t Ts[2] = {4096, 16384};
    int Es[2] = {128, 16};
    for (int ti = 0; ti < (quick ? 1 : 2); ti++)
        for (int ei = 0; ei < 2; ei++) shape(ctx, Ts[ti], Es[ei], counts);
    if (counts) fclose(counts);
    lrmoe_kcu_ctx_destroy(ctx);
    printf("\nbench-ggemm: %s\n", fails ? "FAIL (results disagree with the loop)" : "done, all agree");
    return fails ? 1 : 0;
}
