/* bench-gpu: the CUDA backward at the qwen3 MoE shape on one GPU.
 *
 *   bench-gpu [--tokens T] [--experts E] [--topk K] [--hidden D] [--ffn F]
 *             [--ranks P] [--reps N] [--seed S]
 *
 * Defaults: T=16384 tokens, E=128, K=8, D=2048, F=768, P=8 ranks sharing the
 * one device (each expert's backward rows on its native rank), 10 timed
 * repetitions after 2 warm-ups; every time is the median of CUDA-event times
 * on the context's stream. Inputs are random (never zeros), routing skewed
 * (a Zipf-like expert popularity), weights and activations BF16.
 *
 * Prints, each a ratio measured in this run:
 *  1. per backward GEMM kind (FC2 data dphi, FC2 weight dW_down, FC1 weight
 *     dW_gate, FC1 data dx), for the LOOP (cublasGemmEx over streams) and
 *     GROUPED (cublasGemmGroupedBatchedEx) implementations: TFLOP/s and
 *     grouping efficiency = one dense cuBLAS GEMM with the same total rows /
 *     the grouped call (target >= 0.8);
 *  2. compact backward / full backward at C = 10, 20, 30 % dropped, compact
 *     including score, select and pack, against the ideal ratio retained/all
 *     rows (target: ideal/realised >= 0.9 at C30);
 *  3. score + select + pack as a share of the compact backward (target
 *     <= 5 %), and the memory-bound kernels' GB/s against a device-to-device
 *     cudaMemcpy of the same run (target >= 0.7).
 * Ends with a verdict line. Exit 0 when it ran (targets missed are reported,
 * not failed), 1 on a CUDA error, 3 without a device.
 */
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
#include "score.h"

static void die(const char *what)
{
    fprintf(stderr, "bench-gpu: %s: %s\n", what, lrmoe_errmsg());
    exit(1);
}
#define OK(x) do { if ((x) < 0) die(#x); } while (0)
#define CU(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "bench-gpu: %s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static uint64_t rs = 0x1234567ull;
static uint64_t rnd(void)
{
    uint64_t z = (rs += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double urand(void) { return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0); }

static int reps = 10;
static cudaStream_t S;

template <typename X> static X *dalloc(size_t n)
{
    void *p;
    OK(lrmoe_kcu_alloc(&p, (n ? n : 1) * sizeof(X)));
    return (X *)p;
}

/* fill device memory with random BF16 in [-a, a] / F32 */
static void fill_bf16(uint16_t *d, size_t n, float a)
{
    std::vector<uint16_t> h(n);
    for (auto &x : h) x = lrmoe_f32_to_bf16((float)((urand() * 2 - 1) * a));
    OK(lrmoe_kcu_h2d(d, h.data(), n * 2));
    OK(lrmoe_kcu_sync());
}
static void fill_f32(float *d, size_t n, float lo, float hi)
{
    std::vector<float> h(n);
    for (auto &x : h) x = (float)(lo + (hi - lo) * urand());
    OK(lrmoe_kcu_h2d(d, h.data(), n * 4));
    OK(lrmoe_kcu_sync());
}

/* median milliseconds of fn over reps runs after 2 warm-ups */
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

/* native rank of expert e (lrmoe_exec_native) */
static int native(int64_t e, int64_t E, int P) { return (int)(((e + 1) * P - 1) / E); }

struct shape_t { int64_t T, E, K, D, F; int P; };

struct data_t {
    shape_t s;
    int64_t N;
    int32_t *ids;
    float *alpha, *g, *phisq, *score;
    uint16_t *x, *hg, *hu, *W;   /* W: (E, 3, F*D) gate, up, down */
    std::vector<int32_t> hids;
    std::vector<int64_t> load;   /* (E) */
};

/* workspace for R rows */
struct work_t {
    int64_t R = 0;
    int64_t *pair, *counts, *offsets, *alloc, *quota, *load;
    int32_t *rank;
    uint8_t *keep;
    float *dy, *hgf, *huf, *dphi, *dg, *du, *phi, *dx, *gh, *gw;
    uint16_t *dyb, *xb, *hgb, *hub, *phib, *dgb, *dub;
};

static void work_alloc(work_t &w, const data_t &d)
{
    int64_t N = d.N, D = d.s.D, F = d.s.F, E = d.s.E, P = d.s.P, T = d.s.T;
    w.pair = dalloc<int64_t>(N); w.rank = dalloc<int32_t>(N);
    w.counts = dalloc<int64_t>(P * E); w.offsets = dalloc<int64_t>(P * E);
    w.alloc = dalloc<int64_t>(E * P); w.quota = dalloc<int64_t>(E); w.load = dalloc<int64_t>(E);
    w.keep = dalloc<uint8_t>(N);
    w.dy = dalloc<float>(N * D); w.dx = dalloc<float>(N * D);
    w.hgf = dalloc<float>(N * F); w.huf = dalloc<float>(N * F); w.dphi = dalloc<float>(N * F);
    w.dg = dalloc<float>(N * F); w.du = dalloc<float>(N * F); w.phi = dalloc<float>(N * F);
    w.gh = dalloc<float>(T * D); w.gw = dalloc<float>((size_t)E * 3 * F * D);
    w.dyb = dalloc<uint16_t>(N * D); w.xb = dalloc<uint16_t>(N * D);
    w.hgb = dalloc<uint16_t>(N * F); w.hub = dalloc<uint16_t>(N * F);
    w.phib = dalloc<uint16_t>(N * F); w.dgb = dalloc<uint16_t>(N * F); w.dub = dalloc<uint16_t>(N * F);
}

static lrmoe_gemm_t G(int64_t m, int64_t n, int64_t k, int ta, int tb, const void *a, int64_t lda,
                      const void *b, int64_t ldb, void *c, int64_t ldc, float beta)
{
    lrmoe_gemm_t g = {m, n, k, ta, tb, a, b, c, lda, ldb, ldc, 0, beta};
    return g;
}

/* The four GEMM kinds of the backward over segments cnt (E) starting at seg. */
enum { GK_DPHI, GK_DWDOWN, GK_DWGATE, GK_DX, GK_N };
static const char *gk_name[GK_N] = {"FC2 data dphi", "FC2 weight dWdown", "FC1 weight dWgate", "FC1 data dx"};

static std::vector<lrmoe_gemm_t> gemms(int kind, const data_t &d, const work_t &w,
                                       const std::vector<int64_t> &cnt, const std::vector<int64_t> &seg)
{
    int64_t D = d.s.D, F = d.s.F, FD = F * D;
    std::vector<lrmoe_gemm_t> v;
    for (size_t e = 0; e < cnt.size(); e++) {
        int64_t c = cnt[e], i0 = seg[e];
        if (!c) continue;
        const uint16_t *W = d.W + (size_t)e * 3 * FD;
        float *gw = w.gw + (size_t)e * 3 * FD;
        switch (kind) {
        case GK_DPHI: v.push_back(G(c, F, D, 0, 0, w.dyb + i0 * D, D, W + 2 * FD, F, w.dphi + i0 * F, F, 0)); break;
        case GK_DWDOWN: v.push_back(G(D, F, c, 1, 0, w.dyb + i0 * D, D, w.phib + i0 * F, F, gw + 2 * FD, F, 0)); break;
        case GK_DWGATE: v.push_back(G(F, D, c, 1, 0, w.dgb + i0 * F, F, w.xb + i0 * D, D, gw, D, 0)); break;
        case GK_DX: v.push_back(G(c, D, F, 0, 0, w.dgb + i0 * F, F, W, D, w.dx + i0 * D, D, 0)); break;
        }
    }
    return v;
}

/* the same work as one dense GEMM over all rows (expert 0's weights) */
static lrmoe_gemm_t dense(int kind, const data_t &d, const work_t &w, int64_t M)
{
    int64_t D = d.s.D, F = d.s.F, FD = F * D;
    switch (kind) {
    case GK_DPHI: return G(M, F, D, 0, 0, w.dyb, D, d.W + 2 * FD, F, w.dphi, F, 0);
    case GK_DWDOWN: return G(D, F, M, 1, 0, w.dyb, D, w.phib, F, w.gw + 2 * FD, F, 0);
    case GK_DWGATE: return G(F, D, M, 1, 0, w.dgb, F, w.xb, D, w.gw, D, 0);
    default: return G(M, D, F, 0, 0, w.dgb, F, d.W, D, w.dx, D, 0);
    }
}

/* One backward step on the device. compact: score, select(quota), pack;
 * full: every pair. Returns per-stage ms in t[4]: ssp (score/select/pack and
 * gathers), gemm, act, unpack. */
struct step_t { double ssp, ssa, gemm, act, unpack, total; int64_t R; };

static step_t backward(const data_t &d, work_t &w, const std::vector<int64_t> &quota, int compact)
{
    const int64_t T = d.s.T, K = d.s.K, E = d.s.E, D = d.s.D, F = d.s.F, N = d.N;
    const int P = d.s.P;
    /* host side of the plan: each expert's retained rows on its native rank */
    std::vector<int64_t> alloc((size_t)E * P, 0), cnt(E), seg(E);
    int64_t R = 0;
    for (int64_t e = 0; e < E; e++) {
        int64_t q = compact ? quota[e] : d.load[e];
        alloc[(size_t)e * P + (size_t)native(e, E, P)] = q;
    }
    /* packed order is destination-major then expert-major */
    for (int p = 0; p < P; p++)
        for (int64_t e = 0; e < E; e++)
            if (native(e, E, P) == p) { seg[e] = R; cnt[e] = alloc[(size_t)e * P + p]; R += cnt[e]; }
    OK(lrmoe_kcu_h2d(w.alloc, alloc.data(), alloc.size() * 8));
    OK(lrmoe_kcu_h2d(w.quota, quota.data(), (size_t)E * 8));
    OK(lrmoe_kcu_sync());
    cudaEvent_t ev[6], evm;
    CU(cudaEventCreate(&evm));
    for (auto &e : ev) CU(cudaEventCreate(&e));
    /* the step's input checks are read once, after it (no host wait inside) */
    OK(lrmoe_kcu_flags_defer(1));
    CU(cudaEventRecord(ev[0], S));
    if (compact) {
        OK(lrmoe_kcu_pair_score(LRMOE_METRIC_LRM, T, (int)K, D, d.g, d.alpha, d.phisq, d.score));
        OK(lrmoe_kcu_select(T, (int)K, (int)E, d.ids, d.score, w.quota, w.keep, w.load));
    } else {
        OK(lrmoe_kcu_memset(w.keep, 1, (size_t)N));
    }
    OK(lrmoe_kcu_pack_assign(T, (int)K, (int)E, P, d.ids, w.keep, nullptr, w.alloc, R, w.pair,
                             w.rank, w.counts, w.offsets));
    CU(cudaEventRecord(evm, S));
    OK(lrmoe_kcu_pack_gather_scaled_bf16(w.pair, R, (int)K, D, d.g, d.alpha, w.dyb));
    OK(lrmoe_kcu_pack_gather(w.pair, R, (int)K, 1, d.x, (size_t)D * 2, w.xb));
    OK(lrmoe_kcu_pack_gather(w.pair, R, (int)K, 0, d.hg, (size_t)F * 2, w.hgb));
    OK(lrmoe_kcu_pack_gather(w.pair, R, (int)K, 0, d.hu, (size_t)F * 2, w.hub));
    CU(cudaEventRecord(ev[1], S));
    auto g1 = gemms(GK_DPHI, d, w, cnt, seg);
    OK(lrmoe_kcu_gemm((int)g1.size(), g1.data()));
    CU(cudaEventRecord(ev[2], S));
    OK(lrmoe_kcu_swiglu_bwd_bf16(R, F, w.hgb, w.hub, w.dphi, w.dgb, w.dub, w.phib));
    CU(cudaEventRecord(ev[3], S));
    std::vector<lrmoe_gemm_t> g2, g3;
    int64_t FD = F * D;
    for (int k = GK_DWDOWN; k <= GK_DX; k++) {
        auto v = gemms(k, d, w, cnt, seg);
        g2.insert(g2.end(), v.begin(), v.end());
    }
    for (int64_t e = 0; e < E; e++) /* dW_up and the second half of dx */
        if (cnt[e]) {
            const uint16_t *W = d.W + (size_t)e * 3 * FD;
            g2.push_back(G(F, D, cnt[e], 1, 0, w.dub + seg[e] * F, F, w.xb + seg[e] * D, D,
                           w.gw + (size_t)e * 3 * FD + FD, D, 0));
            g3.push_back(G(cnt[e], D, F, 0, 0, w.dub + seg[e] * F, F, W + FD, D, w.dx + seg[e] * D, D, 1));
        }
    OK(lrmoe_kcu_gemm((int)g2.size(), g2.data()));
    OK(lrmoe_kcu_gemm((int)g3.size(), g3.data()));
    CU(cudaEventRecord(ev[4], S));
    OK(lrmoe_kcu_pack_unpack(w.pair, R, w.dx, D, T, (int)K, w.gh));
    CU(cudaEventRecord(ev[5], S));
    CU(cudaEventSynchronize(ev[5]));
    OK(lrmoe_kcu_flags_defer(0)); /* the one read of the step's check words */
    float ms[5];
    for (int i = 0; i < 5; i++) CU(cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]));
    float msa;
    CU(cudaEventElapsedTime(&msa, ev[0], evm));
    for (auto &e : ev) CU(cudaEventDestroy(e));
    CU(cudaEventDestroy(evm));
    step_t st;
    st.ssp = ms[0];
    st.ssa = msa;
    st.gemm = ms[1] + ms[3];
    st.act = ms[2];
    st.unpack = ms[4];
    st.total = ms[0] + ms[1] + ms[2] + ms[3] + ms[4];
    st.R = R;
    return st;
}

static step_t median_step(const data_t &d, work_t &w, const std::vector<int64_t> &q, int compact)
{
    for (int i = 0; i < 2; i++) backward(d, w, q, compact);
    std::vector<step_t> v(reps);
    for (int i = 0; i < reps; i++) v[i] = backward(d, w, q, compact);
    std::sort(v.begin(), v.end(), [](const step_t &a, const step_t &b) { return a.total < b.total; });
    return v[reps / 2];
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* partial results survive a timeout */
    shape_t s = {16384, 128, 8, 2048, 768, 8};
    for (int i = 1; i + 1 < argc; i += 2) {
        long long v = atoll(argv[i + 1]);
        if (!strcmp(argv[i], "--tokens")) s.T = v;
        else if (!strcmp(argv[i], "--experts")) s.E = v;
        else if (!strcmp(argv[i], "--topk")) s.K = v;
        else if (!strcmp(argv[i], "--hidden")) s.D = v;
        else if (!strcmp(argv[i], "--ffn")) s.F = v;
        else if (!strcmp(argv[i], "--ranks")) s.P = (int)v;
        else if (!strcmp(argv[i], "--reps")) reps = (int)v;
        else if (!strcmp(argv[i], "--seed")) rs = (uint64_t)v;
        else { fprintf(stderr, "bench-gpu: unknown option %s\n", argv[i]); return 2; }
    }
    if (s.T < 1 || s.E < 1 || s.K < 1 || s.K > s.E || s.D < 1 || s.F < 1 || s.P < 1 || s.P > s.E ||
        reps < 1) {
        fprintf(stderr, "bench-gpu: bad parameters\n");
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("bench-gpu: no CUDA device: nothing measured\n");
        return 3;
    }
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    lrmoe_kcu_ctx_t *ctx;
    OK(lrmoe_kcu_ctx_create(0, 4, &ctx));
    OK(lrmoe_kcu_use(ctx));
    S = (cudaStream_t)lrmoe_kcu_stream(ctx);

    data_t d;
    d.s = s;
    d.N = s.T * s.K;
    int64_t T = s.T, K = s.K, E = s.E, D = s.D, F = s.F, N = d.N;
    printf("bench-gpu: device %s (%d SMs), T=%lld E=%lld K=%lld D=%lld F=%lld, P=%d ranks on 1 GPU, "
           "BF16 operands / F32 accumulation, median of %d\n", prop.name, prop.multiProcessorCount,
           (long long)T, (long long)E, (long long)K, (long long)D, (long long)F, s.P, reps);
    /* skewed routing: expert popularity ~ 1/(rank+1)^0.8, K distinct experts */
    std::vector<double> pop(E), cum(E);
    double tot = 0;
    for (int64_t e = 0; e < E; e++) { pop[e] = 1.0 / pow((double)(e + 1), 0.8); tot += pop[e]; }
    double c = 0;
    for (int64_t e = 0; e < E; e++) { c += pop[(e * 37) % E] / tot; cum[e] = c; }
    d.hids.resize(N);
    d.load.assign(E, 0);
    for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < K; k++) {
            int32_t e;
            for (;;) {
                double r = urand();
                e = (int32_t)(std::lower_bound(cum.begin(), cum.end(), r) - cum.begin());
                if (e >= E) e = (int32_t)(E - 1);
                bool dup = false;
                for (int64_t j = 0; j < k; j++) dup |= d.hids[t * K + j] == e;
                if (!dup) break;
            }
            d.hids[t * K + k] = e;
            d.load[e]++;
        }
    d.ids = dalloc<int32_t>(N);
    OK(lrmoe_kcu_h2d(d.ids, d.hids.data(), (size_t)N * 4));
    d.alpha = dalloc<float>(N); fill_f32(d.alpha, N, 0.01f, 0.5f);
    d.g = dalloc<float>(T * D); fill_f32(d.g, T * D, -1, 1);
    d.phisq = dalloc<float>(N); fill_f32(d.phisq, N, 1, 100);
    d.score = dalloc<float>(N);
    d.x = dalloc<uint16_t>(T * D); fill_bf16(d.x, T * D, 1);
    d.hg = dalloc<uint16_t>(N * F); fill_bf16(d.hg, N * F, 4);
    d.hu = dalloc<uint16_t>(N * F); fill_bf16(d.hu, N * F, 2);
    d.W = dalloc<uint16_t>((size_t)E * 3 * F * D); fill_bf16(d.W, (size_t)E * 3 * F * D, 0.05f);
    work_t w;
    work_alloc(w, d);
    int64_t maxload = *std::max_element(d.load.begin(), d.load.end());
    int64_t minload = *std::min_element(d.load.begin(), d.load.end());
    printf("routing: %lld pairs, expert load min %lld mean %lld max %lld\n", (long long)N,
           (long long)minload, (long long)(N / E), (long long)maxload);

    /* full step once, so every buffer holds real values for the GEMM runs */
    std::vector<int64_t> qall(d.load);
    backward(d, w, qall, 0);
    std::vector<int64_t> cnt(d.load), seg(E);
    int64_t acc = 0;
    for (int p = 0; p < s.P; p++)
        for (int64_t e = 0; e < E; e++)
            if (native(e, E, s.P) == p) { seg[e] = acc; acc += cnt[e]; }

    /* 1. grouped GEMMs */
    printf("\n%-20s %-8s %10s %10s %10s %10s\n", "GEMM (backward)", "impl", "ms", "TFLOP/s",
           "dense ms", "group eff");
    double worst_eff = 1e9;
    double impl_ms[2] = {0, 0};
    for (int kind = 0; kind < GK_N; kind++) {
        auto v = gemms(kind, d, w, cnt, seg);
        double flop = 0;
        for (auto &g : v) flop += 2.0 * (double)g.m * g.n * g.k;
        lrmoe_gemm_t dn = dense(kind, d, w, N);
        lrmoe_kcu_set_gemm(ctx, LRMOE_GEMM_LOOP);
        double tdense = time_ms([&] { OK(lrmoe_kcu_gemm(1, &dn)); });
        for (int impl = 0; impl < 2; impl++) {
            lrmoe_kcu_set_gemm(ctx, (lrmoe_gemm_impl_t)impl);
            double t = time_ms([&] { OK(lrmoe_kcu_gemm((int)v.size(), v.data())); });
            double eff = tdense / t;
            impl_ms[impl] += t;
            if (eff < worst_eff && impl == 0) worst_eff = eff;
            printf("%-20s %-8s %10.3f %10.1f %10.3f %10.2f\n", gk_name[kind],
                   lrmoe_gemm_impl_name((lrmoe_gemm_impl_t)impl), t, flop / t * 1e-9, tdense, eff);
        }
    }
    lrmoe_gemm_impl_t best = impl_ms[1] < impl_ms[0] ? LRMOE_GEMM_GROUPED : LRMOE_GEMM_LOOP;
    double best_eff = 1e9;
    for (int kind = 0; kind < GK_N; kind++) {
        auto v = gemms(kind, d, w, cnt, seg);
        lrmoe_gemm_t dn = dense(kind, d, w, N);
        lrmoe_kcu_set_gemm(ctx, LRMOE_GEMM_LOOP);
        double tdense = time_ms([&] { OK(lrmoe_kcu_gemm(1, &dn)); });
        lrmoe_kcu_set_gemm(ctx, best);
        double t = time_ms([&] { OK(lrmoe_kcu_gemm((int)v.size(), v.data())); });
        best_eff = std::min(best_eff, tdense / t);
    }
    printf("faster implementation over the four kinds: %s (loop %.3f ms, grouped %.3f ms); "
           "lowest grouping efficiency with it %.2f (target >= 0.80)\n",
           lrmoe_gemm_impl_name(best), impl_ms[0], impl_ms[1], best_eff);
    lrmoe_kcu_set_gemm(ctx, best);

    /* 2. compact vs full backward */
    step_t full = median_step(d, w, qall, 0);
    printf("\n%-10s %8s %10s %10s %10s %10s %10s %10s %10s %10s\n", "backward", "rows", "total ms",
           "ssp ms", "(no gath)", "gemm ms", "act ms", "unpack ms", "ratio", "ideal/real");
    printf("%-10s %8lld %10.3f %10.3f %10.3f %10.3f %10.3f %10.3f %10s %10s\n", "full",
           (long long)full.R, full.total, full.ssp, full.ssa, full.gemm, full.act, full.unpack,
           "1.000", "-");
    double eff30 = 0, share30 = 0, share30a = 0;
    for (int C = 10; C <= 30; C += 10) {
        std::vector<int64_t> q(E);
        for (int64_t e = 0; e < E; e++) q[e] = d.load[e] - (int64_t)floor((double)d.load[e] * C / 100.0);
        step_t st = median_step(d, w, q, 1);
        double ratio = st.total / full.total, ideal = (double)st.R / (double)full.R;
        double eff = ideal / ratio;
        char nm[16];
        snprintf(nm, sizeof nm, "C%d", C);
        printf("%-10s %8lld %10.3f %10.3f %10.3f %10.3f %10.3f %10.3f %10.3f %10.2f\n", nm,
               (long long)st.R, st.total, st.ssp, st.ssa, st.gemm, st.act, st.unpack, ratio, eff);
        if (C == 30) { eff30 = eff; share30 = st.ssp / st.total; share30a = st.ssa / st.total; }
    }
    printf("C30: ideal/realised %.2f (target >= 0.90); score+select+pack share of compact %.1f %% "
           "with the row gathers, %.1f %% without (target <= 5 %%)\n", eff30, share30 * 100,
           share30a * 100);

    /* 3. memory-bound kernels against cudaMemcpy D2D, on all N pairs: one
     * full step first, so w.pair is again a permutation of all N pairs (the
     * last compact step left only its R rows valid, and pack_unpack refuses
     * the stale tail's repeated pairs) */
    backward(d, w, qall, 0);
    size_t cbytes = (size_t)N * D * 4; /* 1 GB at the default shape */
    double tcp = time_ms([&] { CU(cudaMemcpyAsync(w.dx, w.dy, cbytes, cudaMemcpyDeviceToDevice, S)); });
    double bw_copy = 2.0 * cbytes / tcp * 1e-6; /* GB/s, read + write */
    printf("\n%-24s %14s %10s %10s %10s\n", "kernel", "bytes moved", "ms", "GB/s", "vs memcpy");
    printf("%-24s %14.3e %10.3f %10.1f %10s\n", "cudaMemcpy D2D", 2.0 * cbytes, tcp, bw_copy, "1.00");
    double worst_bw = 1e9;
    auto row = [&](const char *name, double bytes, double ms) {
        double bw = bytes / ms * 1e-6;
        worst_bw = std::min(worst_bw, bw / bw_copy);
        printf("%-24s %14.3e %10.3f %10.1f %10.2f\n", name, bytes, ms, bw, bw / bw_copy);
    };
    /* each output written once, each input read once (gathered rows count
     * as read once per output row) */
    row("pack_gather (x, BF16)", 2.0 * N * D * 2 + N * 8.0,
        time_ms([&] { OK(lrmoe_kcu_pack_gather(w.pair, N, (int)K, 1, d.x, (size_t)D * 2, w.xb)); }));
    row("pack_gather_scaled", 2.0 * N * D * 4 + N * 12.0,
        time_ms([&] { OK(lrmoe_kcu_pack_gather_scaled(w.pair, N, (int)K, D, d.g, d.alpha, w.dy)); }));
    row("pack_gather_scaled_bf16", 6.0 * N * D + N * 12.0,
        time_ms([&] { OK(lrmoe_kcu_pack_gather_scaled_bf16(w.pair, N, (int)K, D, d.g, d.alpha, w.dyb)); }));
    OK(lrmoe_kcu_bf16_to_f32(N * F, w.hgb, w.hgf));
    OK(lrmoe_kcu_bf16_to_f32(N * F, w.hub, w.huf));
    row("swiglu_bwd", 6.0 * N * F * 4,
        time_ms([&] { OK(lrmoe_kcu_swiglu_bwd(N, F, w.hgf, w.huf, w.dphi, w.dg, w.du, w.phi)); }));
    row("swiglu_bwd_bf16", 14.0 * N * F,
        time_ms([&] { OK(lrmoe_kcu_swiglu_bwd_bf16(N, F, w.hgb, w.hub, w.dphi, w.dgb, w.dub, w.phib)); }));
    row("f32_to_bf16", 6.0 * N * D,
        time_ms([&] { OK(lrmoe_kcu_f32_to_bf16(N * D, w.dy, w.dyb)); }));
    row("pack_unpack", 1.0 * N * D * 4 + 4.0 * T * D + N * 16.0,
        time_ms([&] { OK(lrmoe_kcu_pack_unpack(w.pair, N, w.dx, D, T, (int)K, w.gh)); }));
    row("pair_score", 4.0 * T * D + 12.0 * N,
        time_ms([&] { OK(lrmoe_kcu_pair_score(LRMOE_METRIC_LRM, T, (int)K, D, d.g, d.alpha, d.phisq, d.score)); }));
    printf("lowest memory-bound kernel / memcpy: %.2f (target >= 0.70)\n", worst_bw);

    int pass = best_eff >= 0.8 && eff30 >= 0.9 && share30 <= 0.05 && worst_bw >= 0.7;
    printf("\nverdict: %s (grouping efficiency %.2f, C30 ideal/realised %.2f, overhead share %.1f %%, "
           "memory-bound %.2f of memcpy)\n", pass ? "all targets met" : "targets MISSED",
           best_eff, eff30, share30 * 100, worst_bw);
    lrmoe_kcu_ctx_destroy(ctx);
    return 0;
}
