/* test-kernels: every CUDA launcher (kernels/kcu.h) against its CPU reference
 * (lib/kref.h, same parameters) on fresh random inputs, edge sizes (0 rows,
 * 1 row, sizes that are not a multiple of the block, an expert with all
 * pairs, experts with none) and both GEMM implementations.
 *
 * Each comparison is |gpu - ref| <= atol + rtol*|ref| per element, with the
 * tolerance stated (and argued) at its call. Outputs are poisoned (NaN bytes)
 * before each launch, so an unwritten element fails; NaN never passes.
 *
 *   test-kernels [SEED]    run all, print one line per case, exit 0 iff all pass
 *   test-kernels --probe   exit 0 when a CUDA device is usable, 3 when not
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>
#include <cuda_runtime.h>
extern "C" {
#include "lrmoe.h"
}
#include "kcu.h"
#include "score.h"

static int fails = 0, cases = 0;
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float urand(float lo, float hi) { return lo + (hi - lo) * (float)((rnd() >> 40) * (1.0 / 16777216.0)); }
static int64_t irand(int64_t n) { return n > 0 ? (int64_t)(rnd() % (uint64_t)n) : 0; }

/* A launcher or copy that fails ends its case, not the run: the case is
 * reported FAIL with the message and the next case runs (main's CASE). */
struct case_error {
    char msg[512];
};
static void die(const char *what)
{
    case_error e;
    snprintf(e.msg, sizeof e.msg, "%s: %s", what, lrmoe_errmsg());
    throw e;
}
#define OK(x) do { if ((x) < 0) die(#x); } while (0)

/* device buffer with a pinned host staging copy for its life: put() copies
 * the vector there and from there to the device, so the asynchronous copy
 * reads memory nobody frees or changes under it (from pageable memory the
 * runtime promises nothing about when the source has been read); the next
 * put() first waits for the stream, so the previous copy has run. */
template <typename X> struct dbuf {
    X *d = nullptr;
    X *stage = nullptr;
    size_t n = 0;
    explicit dbuf(size_t n_) : n(n_) { OK(lrmoe_kcu_alloc((void **)&d, (n ? n : 1) * sizeof(X))); }
    ~dbuf()
    {
        lrmoe_kcu_free(d);
        if (stage) {
            (void)lrmoe_kcu_sync();
            (void)cudaFreeHost(stage);
        }
    }
    void put(const std::vector<X> &h)
    {
        if (!stage) {
            cudaError_t e = cudaMallocHost((void **)&stage, (n ? n : 1) * sizeof(X));
            if (e != cudaSuccess) {
                case_error ce;
                snprintf(ce.msg, sizeof ce.msg, "cudaMallocHost: %s", cudaGetErrorString(e));
                throw ce;
            }
        } else {
            OK(lrmoe_kcu_sync());
        }
        memcpy(stage, h.data(), n * sizeof(X));
        OK(lrmoe_kcu_h2d(d, stage, n * sizeof(X)));
    }
    void poison() { OK(lrmoe_kcu_memset(d, 0xFF, (n ? n : 1) * sizeof(X))); }
    std::vector<X> get()
    {
        std::vector<X> h(n ? n : 1);
        OK(lrmoe_kcu_d2h(h.data(), d, n * sizeof(X)));
        OK(lrmoe_kcu_sync());
        h.resize(n);
        return h;
    }
};

static void report(const char *name, const char *cs, int ok, double maxerr, const char *extra)
{
    cases++;
    if (!ok) fails++;
    printf("%-4s %-20s %-34s maxerr %.3e %s\n", ok ? "ok" : "FAIL", name, cs, maxerr, extra ? extra : "");
}

/* |g - r| <= atol + rtol*|r| for every element; NaN in g fails */
static void cmp_f32(const char *name, const char *cs, const float *g, const float *r, size_t n,
                    double atol, double rtol)
{
    double me = 0;
    size_t bad = 0, first = (size_t)-1;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)g[i] - (double)r[i]);
        if (!(e <= atol + rtol * fabs((double)r[i]))) { if (!bad) first = i; bad++; }
        if (e > me || e != e) me = e;
    }
    char ex[96] = "";
    if (bad) snprintf(ex, sizeof ex, "(%zu bad, first at %zu: %g vs %g)", bad, first,
                      (double)g[first], (double)r[first]);
    report(name, cs, bad == 0, me, ex);
}

template <typename X>
static void cmp_exact(const char *name, const char *cs, const X *g, const X *r, size_t n)
{
    size_t bad = 0, first = (size_t)-1;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&g[i], &r[i], sizeof(X))) { if (!bad) first = i; bad++; }
    char ex[64] = "";
    if (bad) snprintf(ex, sizeof ex, "(%zu differ, first at %zu)", bad, first);
    report(name, cs, bad == 0, bad ? 1.0 : 0.0, ex);
}

static std::vector<float> randf(size_t n, float lo, float hi)
{
    std::vector<float> v(n);
    for (auto &x : v) x = urand(lo, hi);
    return v;
}

/* ---------------------------------------------------------------- cases */

static void t_convert(int64_t n)
{
    char cs[64];
    snprintf(cs, sizeof cs, "n=%lld", (long long)n);
    std::vector<uint16_t> hb(n);
    for (auto &x : hb) x = (uint16_t)rnd(); /* every bit pattern: NaN, Inf, subnormal */
    std::vector<float> hf(n);
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)rnd();
        switch (i % 4) {
        case 0: memcpy(&hf[i], &u, 4); break;                      /* any bits */
        case 1: u = (u & 0xFFFF0000u) | 0x8000u; memcpy(&hf[i], &u, 4); break; /* exact ties */
        default: hf[i] = urand(-3, 3);
        }
    }
    dbuf<uint16_t> db(n), ob(n);
    dbuf<float> df(n), of(n);
    db.put(hb); df.put(hf);
    of.poison(); ob.poison();
    OK(lrmoe_kcu_bf16_to_f32(n, db.d, of.d));
    OK(lrmoe_kcu_f32_to_bf16(n, df.d, ob.d));
    std::vector<float> rf(n);
    std::vector<uint16_t> rb(n);
    OK(lrmoe_kref_bf16_to_f32(n, hb.data(), rf.data()));
    OK(lrmoe_kref_f32_to_bf16(n, hf.data(), rb.data()));
    /* conversions are exact: bit equality (NaN payloads included) */
    auto gf = of.get();
    auto gb = ob.get();
    cmp_exact("bf16_to_f32", cs, gf.data(), rf.data(), n);
    cmp_exact("f32_to_bf16", cs, gb.data(), rb.data(), n);
}

static void t_score(int64_t T, int K, int64_t D)
{
    char cs[64];
    snprintf(cs, sizeof cs, "T=%lld K=%d D=%lld", (long long)T, K, (long long)D);
    auto g = randf((size_t)(T * D), -2, 2), al = randf((size_t)(T * K), 0, 1),
         ps = randf((size_t)(T * K), 0, 50), x = randf((size_t)(T * D), -1, 1);
    dbuf<float> dg(T * D), da(T * K), dp(T * K), ds(T * K), dn(T);
    dg.put(g); da.put(al); dp.put(ps);
    ds.poison(); dn.poison();
    OK(lrmoe_kcu_row_sqnorm(T, D, dg.d, dn.d));
    std::vector<float> rs(T * K), rn(T);
    OK(lrmoe_kref_row_sqnorm(T, D, g.data(), rn.data()));
    /* both accumulate ||g||^2 (or sum |g|) in double and round once to f32;
     * only the summation order differs (~1e-16 relative), so at most one f32
     * ulp (6e-8 relative) apart: rtol 1e-6, atol 0. gradnorm and absgrad
     * get NULL alpha and phi_sqnorm (read by lrm only). */
    static const char *const mn[] = {"pair_score lrm", "pair_score gradnorm",
                                     "pair_score absgrad"};
    for (int m = LRMOE_METRIC_LRM; m <= LRMOE_METRIC_ABSGRAD; m++) {
        const bool lrm = m == LRMOE_METRIC_LRM;
        ds.poison();
        OK(lrmoe_kcu_pair_score(m, T, K, D, dg.d, lrm ? da.d : nullptr, lrm ? dp.d : nullptr,
                                ds.d));
        OK(lrmoe_kref_pair_score(m, T, K, D, g.data(), lrm ? al.data() : nullptr,
                                 lrm ? ps.data() : nullptr, rs.data()));
        auto gs = ds.get();
        cmp_f32(mn[m], cs, gs.data(), rs.data(), (size_t)(T * K), 0, 1e-6);
    }
    auto gn = dn.get();
    cmp_f32("row_sqnorm", cs, gn.data(), rn.data(), (size_t)T, 0, 1e-6);
}

/* routing: "spread" uniform over E, "hot" every pair of expert 0 (K=1),
 * "sparse" only the first few experts used (the rest have none) */
static std::vector<int32_t> route(int64_t T, int K, int E, const char *how)
{
    std::vector<int32_t> ids((size_t)(T * K));
    for (int64_t t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int e;
            if (!strcmp(how, "hot")) e = k;
            else if (!strcmp(how, "sparse")) e = (int)((t + k) % (K + 2 < E ? K + 2 : E));
            else e = (int)irand(E);
            ids[t * K + k] = e;
        }
    return ids;
}

static void t_select(int64_t T, int K, int E, const char *how, int ties)
{
    char cs[80];
    snprintf(cs, sizeof cs, "T=%lld K=%d E=%d %s%s", (long long)T, K, E, how, ties ? " ties" : "");
    int64_t N = T * K;
    auto ids = route(T, K, E, how);
    std::vector<float> sc(N);
    for (auto &s : sc) s = ties ? (float)irand(4) * 0.5f : urand(0, 10); /* ties: 4 values, +0 */
    std::vector<int64_t> n(E, 0), q(E);
    for (auto e : ids) n[e]++;
    for (int e = 0; e < E; e++) {
        int64_t r = irand(4);
        q[e] = r == 0 ? 0 : r == 1 ? n[e] : irand(n[e] + 1); /* none, all, some */
    }
    dbuf<int32_t> di(N);
    dbuf<float> dsc(N);
    dbuf<int64_t> dq(E), dl(E);
    dbuf<uint8_t> dk(N);
    di.put(ids); dsc.put(sc); dq.put(q);
    dk.poison(); dl.poison();
    OK(lrmoe_kcu_select(T, K, E, di.d, dsc.d, dq.d, dk.d, dl.d));
    std::vector<uint8_t> rk(N);
    std::vector<int64_t> rl(E);
    OK(lrmoe_kref_select(T, K, E, ids.data(), sc.data(), q.data(), rk.data(), rl.data()));
    /* a selection is exact: same pairs, ties to the lower u */
    auto gk = dk.get();
    auto gl = dl.get();
    cmp_exact("select keep", cs, gk.data(), rk.data(), (size_t)N);
    cmp_exact("select load", cs, gl.data(), rl.data(), (size_t)E);
    /* a quota above the load is refused by both */
    int e0 = ids.empty() ? 0 : ids[0];
    q[e0] = n[e0] + 1;
    dq.put(q);
    int gr = lrmoe_kcu_select(T, K, E, di.d, dsc.d, dq.d, dk.d, dl.d);
    int rr = lrmoe_kref_select(T, K, E, ids.data(), sc.data(), q.data(), rk.data(), rl.data());
    if (N) report("select bad quota", cs, gr < 0 && rr < 0, 0, gr < 0 ? lrmoe_errmsg() : "accepted");
    if (N) { /* the same, its check deferred (lrmoe_kcu_flags_defer): the call
              * queues, the one read at the end fails with select's message */
        OK(lrmoe_kcu_flags_defer(1));
        int gq = lrmoe_kcu_select(T, K, E, di.d, dsc.d, dq.d, dk.d, dl.d);
        int gc = lrmoe_kcu_flags_defer(0);
        const char *m = gc < 0 ? lrmoe_errmsg() : "accepted";
        report("select bad quota, deferred check", cs,
               gq == 0 && gc < 0 && strstr(m, "select: expert") != NULL, 0, m);
    }
}

/* the unbiased draw (lrmoe-score --select sample) on the device against
 * lrmoe_score_sample: the same pairs and the same F32 weights, bit for bit
 * (one thread per expert walks its pairs in the CPU's order) */
static void t_sample(int64_t T, int K, int E, const char *how, int zeros, uint64_t seed)
{
    char cs[96];
    snprintf(cs, sizeof cs, "T=%lld K=%d E=%d %s%s seed %llu", (long long)T, K, E, how,
             zeros ? " zeros" : "", (unsigned long long)seed);
    int64_t N = T * K;
    auto ids = route(T, K, E, how);
    std::vector<float> sc(N);
    for (auto &s : sc) { /* LRM-like: six decades, some exact zeros */
        float m = urand(0, 1);
        s = zeros && irand(4) == 0 ? 0.0f : powf(10.0f, -6.0f * m) * urand(0.5f, 1.0f);
    }
    std::vector<int64_t> n(E, 0), q(E);
    for (auto e : ids) n[e]++;
    for (int e = 0; e < E; e++) {
        int64_t r = irand(4);
        q[e] = r == 0 ? 0 : r == 1 ? n[e] : irand(n[e] + 1);
    }
    dbuf<int32_t> di(N);
    dbuf<float> dsc(N), dw(N);
    dbuf<int64_t> dq(E), dl(E);
    dbuf<uint8_t> dk(N);
    di.put(ids); dsc.put(sc); dq.put(q);
    dk.poison(); dw.poison(); dl.poison();
    OK(lrmoe_kcu_sample(T, K, E, di.d, dsc.d, dq.d, seed, dk.d, dw.d, dl.d));
    std::vector<uint8_t> rk(N);
    std::vector<float> rw(N);
    std::vector<int64_t> rl(E);
    OK(lrmoe_kref_sample(T, K, E, ids.data(), sc.data(), q.data(), seed, rk.data(), rw.data(),
                         rl.data()));
    auto gk = dk.get();
    auto gw = dw.get();
    auto gl = dl.get();
    cmp_exact("sample keep", cs, gk.data(), rk.data(), (size_t)N);
    cmp_exact("sample weight", cs, gw.data(), rw.data(), (size_t)N);
    cmp_exact("sample load", cs, gl.data(), rl.data(), (size_t)E);
    int e0 = ids.empty() ? 0 : ids[0];
    q[e0] = n[e0] + 1;
    dq.put(q);
    int gr = lrmoe_kcu_sample(T, K, E, di.d, dsc.d, dq.d, seed, dk.d, dw.d, dl.d);
    int rr = lrmoe_kref_sample(T, K, E, ids.data(), sc.data(), q.data(), seed, rk.data(),
                               rw.data(), rl.data());
    if (N) report("sample bad quota", cs, gr < 0 && rr < 0, 0, gr < 0 ? lrmoe_errmsg() : "accepted");
}

static void t_pack(int64_t T, int K, int E, int P, const char *how, int with_rank, int with_alloc)
{
    char cs[96];
    snprintf(cs, sizeof cs, "T=%lld K=%d E=%d P=%d %s%s%s", (long long)T, K, E, P, how,
             with_rank ? "" : " no-rank", with_alloc ? "" : " no-alloc");
    int64_t N = T * K;
    auto ids = route(T, K, E, how);
    std::vector<uint8_t> keep(N);
    std::vector<int32_t> pr(N);
    std::vector<int64_t> kept(E, 0);
    for (int64_t u = 0; u < N; u++) {
        keep[u] = irand(10) < 7;
        pr[u] = (int32_t)irand(P);
        kept[ids[u]] += keep[u];
    }
    std::vector<int64_t> alloc((size_t)E * P, 0);
    int64_t R = 0;
    for (int e = 0; e < E; e++) {
        int64_t left = kept[e];
        for (int p = 0; p < P - 1; p++) {
            int64_t a = irand(left + 1);
            alloc[(size_t)e * P + p] = a;
            left -= a;
        }
        alloc[(size_t)e * P + P - 1] = left;
        R += kept[e];
    }
    dbuf<int32_t> di(N), dpr(N), drk(R);
    dbuf<uint8_t> dk(N);
    dbuf<int64_t> dal((size_t)E * P), dpair(R), dc((size_t)P * E), doff((size_t)P * E);
    di.put(ids); dk.put(keep); dpr.put(pr); dal.put(alloc);
    dpair.poison(); drk.poison(); dc.poison(); doff.poison();
    OK(lrmoe_kcu_pack_assign(T, K, E, P, di.d, dk.d, with_rank ? dpr.d : nullptr,
                             with_alloc ? dal.d : nullptr, R, dpair.d, drk.d, dc.d, doff.d));
    std::vector<int64_t> rp(R), rc((size_t)P * E), ro((size_t)P * E);
    std::vector<int32_t> rr(R);
    OK(lrmoe_kref_pack_assign(T, K, E, P, ids.data(), keep.data(), with_rank ? pr.data() : nullptr,
                              with_alloc ? alloc.data() : nullptr, R, rp.data(), rr.data(),
                              rc.data(), ro.data()));
    /* an assignment is exact: same rows, ranks, counts, offsets */
    auto gp = dpair.get();
    auto gr = drk.get();
    auto gc = dc.get();
    auto go = doff.get();
    cmp_exact("pack_assign pair", cs, gp.data(), rp.data(), (size_t)R);
    cmp_exact("pack_assign rank", cs, gr.data(), rr.data(), (size_t)R);
    cmp_exact("pack_assign counts", cs, gc.data(), rc.data(), (size_t)P * E);
    cmp_exact("pack_assign offsets", cs, go.data(), ro.data(), (size_t)P * E);
    if (with_alloc && E > 0 && kept[0] > 0) { /* an allocation that misses a pair: refused */
        alloc[0] += 1; /* expert 0's row sum exceeds its kept pairs */
        dal.put(alloc);
        int g = lrmoe_kcu_pack_assign(T, K, E, P, di.d, dk.d, dpr.d, dal.d, R, dpair.d,
                                      drk.d, dc.d, doff.d);
        report("pack_assign bad alloc", cs, g < 0, 0, g < 0 ? lrmoe_errmsg() : "accepted");
    }
}

/* v with `mis` leading zero elements: a device copy of it read from
 * d + mis is v at an address mis elements off the allocation's alignment */
template <typename X> static std::vector<X> shifted(const std::vector<X> &v, int mis)
{
    std::vector<X> w(v.size() + mis);
    memcpy(w.data() + mis, v.data(), v.size() * sizeof(X));
    return w;
}

/* mis: the scaled rows, the gradient rows and the unpack output start one
 * float off 16-byte alignment (the launchers' scalar paths even where D is
 * a multiple of 4) */
static void t_gather(int64_t T, int K, int64_t R, size_t row_bytes, int by_token, int64_t D,
                     int mis = 0)
{
    char cs[96];
    snprintf(cs, sizeof cs, "T=%lld K=%d R=%lld row=%zuB %s", (long long)T, K, (long long)R,
             row_bytes, by_token ? "token" : "pair");
    int64_t N = T * K;
    if (R > N) R = N;
    /* R distinct pairs (a partial shuffle) */
    std::vector<int64_t> perm(N), pair(R);
    for (int64_t i = 0; i < N; i++) perm[i] = i;
    for (int64_t i = 0; i < R; i++) {
        int64_t j = i + irand(N - i);
        std::swap(perm[i], perm[j]);
        pair[i] = perm[i];
    }
    int64_t srows = by_token ? T : N;
    std::vector<uint8_t> src(srows * row_bytes);
    for (auto &b : src) b = (uint8_t)rnd();
    dbuf<int64_t> dp(R);
    dbuf<uint8_t> ds(src.size()), dd(R * row_bytes);
    dp.put(pair); ds.put(src);
    dd.poison();
    OK(lrmoe_kcu_pack_gather(dp.d, R, K, by_token, ds.d, row_bytes, dd.d));
    std::vector<uint8_t> rd(R * row_bytes);
    OK(lrmoe_kref_pack_gather(pair.data(), R, K, by_token, src.data(), row_bytes, rd.data()));
    auto gd = dd.get();
    cmp_exact("pack_gather", cs, gd.data(), rd.data(), rd.size()); /* a byte copy: exact */

    /* scaled gradient rows, then the inverse scatter-add */
    snprintf(cs, sizeof cs, "T=%lld K=%d R=%lld D=%lld%s", (long long)T, K, (long long)R, (long long)D,
             mis ? " misaligned" : "");
    auto g = randf((size_t)(T * D), -2, 2), al = randf((size_t)N, 0, 1);
    dbuf<float> dg(T * D + mis), da(N), dr(R * D + mis), dout(T * D + mis);
    dg.put(shifted(g, mis)); da.put(al);
    dr.poison();
    OK(lrmoe_kcu_pack_gather_scaled(dp.d, R, K, D, dg.d + mis, da.d, dr.d + mis));
    std::vector<float> rr(R * D);
    OK(lrmoe_kref_pack_gather_scaled(pair.data(), R, K, D, g.data(), al.data(), rr.data()));
    auto gr = dr.get();
    /* one correctly rounded f32 product on both sides: exact */
    cmp_exact("pack_gather_scaled", cs, gr.data() + mis, rr.data(), rr.size());
    {
        dbuf<uint16_t> db(R * D + mis);
        db.poison();
        OK(lrmoe_kcu_pack_gather_scaled_bf16(dp.d, R, K, D, dg.d + mis, da.d, db.d + mis));
        std::vector<uint16_t> rb(R * D);
        OK(lrmoe_kref_pack_gather_scaled_bf16(pair.data(), R, K, D, g.data(), al.data(), rb.data()));
        auto gb = db.get();
        /* the same product, one RNE rounding to BF16: exact */
        cmp_exact("pack_gather_scaled_bf16", cs, gb.data() + mis, rb.data(), rb.size());
    }
    dout.poison();
    OK(lrmoe_kcu_pack_unpack(dp.d, R, dr.d + mis, D, T, K, dout.d + mis));
    std::vector<float> ro(T * D);
    OK(lrmoe_kref_pack_unpack(pair.data(), R, rr.data(), D, T, K, ro.data()));
    auto go = dout.get();
    /* same additions in the same (ascending k) order from +0: exact */
    cmp_exact("pack_unpack", cs, go.data() + mis, ro.data(), ro.size());
    if (R >= 2) { /* a pair twice: refused */
        std::vector<int64_t> dup(pair);
        dup[1] = dup[0];
        dp.put(dup);
        int gr2 = lrmoe_kcu_pack_unpack(dp.d, R, dr.d + mis, D, T, K, dout.d + mis);
        report("pack_unpack duplicate", cs, gr2 < 0, 0, gr2 < 0 ? lrmoe_errmsg() : "accepted");
    }
}

static void t_swiglu(int64_t n, int64_t F)
{
    char cs[64];
    snprintf(cs, sizeof cs, "n=%lld F=%lld", (long long)n, (long long)F);
    size_t m = (size_t)(n * F);
    auto g = randf(m, -8, 8), u = randf(m, -3, 3), dp = randf(m, -1, 1);
    dbuf<float> dg(m), du(m), ddp(m), dphi(m), dsq(n), ddg(m), ddu(m), dphi2(m);
    dg.put(g); du.put(u); ddp.put(dp);
    dphi.poison(); dsq.poison(); ddg.poison(); ddu.poison(); dphi2.poison();
    OK(lrmoe_kcu_swiglu_fwd(n, F, dg.d, du.d, dphi.d, dsq.d));
    OK(lrmoe_kcu_swiglu_bwd(n, F, dg.d, du.d, ddp.d, ddg.d, ddu.d, dphi2.d));
    std::vector<float> rphi(m), rsq(n), rdg(m), rdu(m), rphi2(m);
    OK(lrmoe_kref_swiglu_fwd(n, F, g.data(), u.data(), rphi.data(), rsq.data()));
    OK(lrmoe_kref_swiglu_bwd(n, F, g.data(), u.data(), dp.data(), rdg.data(), rdu.data(), rphi2.data()));
    /* same operation order without FMA contraction on both sides; device
     * expf is within 2 ulp of glibc's, which moves sigmoid by ~2e-7 and,
     * through g*(1-sigmoid) for |g| up to 8, dg by a few 1e-7 relative:
     * rtol 1e-5, atol 1e-6 for results near zero */
    auto a = dphi.get(); cmp_f32("swiglu_fwd phi", cs, a.data(), rphi.data(), m, 1e-6, 1e-5);
    auto b = dsq.get(); cmp_f32("swiglu_fwd sqnorm", cs, b.data(), rsq.data(), (size_t)n, 1e-6, 1e-5);
    auto c = ddg.get(); cmp_f32("swiglu_bwd dg", cs, c.data(), rdg.data(), m, 1e-6, 1e-5);
    auto d = ddu.get(); cmp_f32("swiglu_bwd du", cs, d.data(), rdu.data(), m, 1e-6, 1e-5);
    auto e = dphi2.get(); cmp_f32("swiglu_bwd phi", cs, e.data(), rphi2.data(), m, 1e-6, 1e-5);

    /* BF16 in and out */
    std::vector<uint16_t> gb(m), ub(m);
    for (size_t i = 0; i < m; i++) { gb[i] = lrmoe_f32_to_bf16(g[i]); ub[i] = lrmoe_f32_to_bf16(u[i]); }
    dbuf<uint16_t> dgb(m), dub(m), ddgb(m), ddub(m), dphib(m);
    dgb.put(gb); dub.put(ub);
    ddgb.poison(); ddub.poison(); dphib.poison();
    OK(lrmoe_kcu_swiglu_bwd_bf16(n, F, dgb.d, dub.d, ddp.d, ddgb.d, ddub.d, dphib.d));
    std::vector<uint16_t> rdgb(m), rdub(m), rphib(m);
    OK(lrmoe_kref_swiglu_bwd_bf16(n, F, gb.data(), ub.data(), dp.data(), rdgb.data(), rdub.data(),
                                  rphib.data()));
    /* the F32 values agree as above; rounding them to BF16 can land on
     * neighbouring BF16 values, one BF16 ulp apart (2^-7 relative at most):
     * rtol 2^-7, atol 1e-6 */
    const char *nm[3] = {"swiglu_bwd_bf16 dg", "swiglu_bwd_bf16 du", "swiglu_bwd_bf16 phi"};
    dbuf<uint16_t> *gd[3] = {&ddgb, &ddub, &dphib};
    std::vector<uint16_t> *rf[3] = {&rdgb, &rdub, &rphib};
    for (int q = 0; q < 3; q++) {
        auto hb = gd[q]->get();
        std::vector<float> x(m), y(m);
        lrmoe_convert_to_f32(LRMOE_BF16, hb.data(), x.data(), m);
        lrmoe_convert_to_f32(LRMOE_BF16, rf[q]->data(), y.data(), m);
        cmp_f32(nm[q], cs, x.data(), y.data(), m, 1e-6, 1.0 / 128);
    }
}

static void t_combine(int64_t T, int K, int64_t D, int mis = 0)
{
    char cs[64];
    snprintf(cs, sizeof cs, "T=%lld K=%d D=%lld%s", (long long)T, K, (long long)D,
             mis ? " misaligned" : "");
    int64_t N = T * K;
    std::vector<int64_t> row(N);
    int64_t rows = 0;
    for (int64_t u = 0; u < N; u++) row[u] = irand(5) == 0 ? -1 : rows++; /* some pairs absent */
    for (int64_t u = 0; u < N; u++) /* rows in a shuffled order */
        if (row[u] >= 0) { int64_t v = irand(N); if (row[v] >= 0) std::swap(row[u], row[v]); }
    auto al = randf((size_t)N, 0, 1), y = randf((size_t)(rows * D), -2, 2), g = randf((size_t)(T * D), -2, 2);
    dbuf<int64_t> dr(N);
    dbuf<float> da(N), dy(rows * D + mis), dout(T * D + mis), dg(T * D), ddot(N);
    dr.put(row); da.put(al); dy.put(shifted(y, mis)); dg.put(g);
    dout.poison(); ddot.poison();
    OK(lrmoe_kcu_combine(T, K, D, da.d, dr.d, dy.d + mis, dout.d + mis));
    OK(lrmoe_kcu_pair_dot(T, K, D, dg.d, dr.d, dy.d + mis, ddot.d));
    std::vector<float> ro(T * D), rd(N);
    OK(lrmoe_kref_combine(T, K, D, al.data(), row.data(), y.data(), ro.data()));
    OK(lrmoe_kref_pair_dot(T, K, D, g.data(), row.data(), y.data(), rd.data()));
    /* combine: the same rounded multiplies and adds in ascending k, so
     * bit-equal unless the host compiler contracted a*y+o into an FMA (one
     * rounding less per term): rtol 1e-6 allows that, atol 1e-6 near zero */
    auto go = dout.get(); cmp_f32("combine", cs, go.data() + mis, ro.data(), ro.size(), 1e-6, 1e-6);
    /* pair_dot: double accumulation both sides, one f32 rounding: rtol 1e-6,
     * atol 1e-9 for dots that cancel to ~0 */
    auto gd = ddot.get(); cmp_f32("pair_dot", cs, gd.data(), rd.data(), rd.size(), 1e-9, 1e-6);
}

static std::vector<uint16_t> randbf(size_t n)
{
    std::vector<uint16_t> v(n);
    for (auto &x : v) x = lrmoe_f32_to_bf16(urand(-1, 1));
    return v;
}

/* One grouped call: the backward's four shapes (dphi, dW_down, dW_gate, dx)
 * for E experts of m_e rows, m_e including 0 and not multiples of tiles. */
static void t_gemm(int E, int64_t D, int64_t F, int c_bf16, lrmoe_gemm_impl_t impl, int beta1)
{
    char cs[96];
    snprintf(cs, sizeof cs, "E=%d D=%lld F=%lld C=%s beta=%d %s", E, (long long)D, (long long)F,
             c_bf16 ? "bf16" : "f32", beta1, lrmoe_gemm_impl_name(impl));
    lrmoe_kcu_set_gemm(lrmoe_kcu_current(), impl);
    std::vector<int64_t> m(E);
    int64_t M = 0;
    for (int e = 0; e < E; e++) {
        m[e] = e == 0 ? 0 : e == 1 ? 1 : irand(300); /* empty, one row, ragged */
        M += m[e];
    }
    size_t es = c_bf16 ? 2 : 4;
    auto dy = randbf((size_t)(M * D)), ph = randbf((size_t)(M * F)), w = randbf((size_t)E * F * D);
    size_t cn = (size_t)(M * F + (size_t)E * D * F + M * D);
    std::vector<uint8_t> c0(cn * es);
    if (c_bf16) { auto v = randbf(cn); memcpy(c0.data(), v.data(), cn * 2); }
    else { auto v = randf(cn, -1, 1); memcpy(c0.data(), v.data(), cn * 4); }
    dbuf<uint16_t> ddy(dy.size()), dph(ph.size()), dw(w.size());
    dbuf<uint8_t> dc(c0.size());
    ddy.put(dy); dph.put(ph); dw.put(w); dc.put(c0);
    std::vector<lrmoe_gemm_t> gd, gh;
    std::vector<uint8_t> hc(c0);
    int64_t off = 0;
    size_t c_dphi = 0, c_dw = (size_t)(M * F), c_dx = c_dw + (size_t)E * D * F;
    float beta = beta1 ? 1.0f : 0.0f;
    for (int e = 0; e < E; e++) {
        lrmoe_gemm_t a[3];
        // dphi (m,F) = dy (m,D) W (D,F)
        a[0] = {m[e], F, D, 0, 0, nullptr, nullptr, nullptr, D, F, F, c_bf16, beta};
        // dW (D,F) = dy^T (D,m) phi (m,F): K = m (0 for the empty expert)
        a[1] = {D, F, m[e], 1, 0, nullptr, nullptr, nullptr, D, F, F, c_bf16, beta};
        // dx (m,D) = phi (m,F) W^T, W stored (D,F)
        a[2] = {m[e], D, F, 0, 1, nullptr, nullptr, nullptr, F, F, D, c_bf16, beta};
        size_t wo = (size_t)e * D * F;
        size_t co[3] = {c_dphi + (size_t)(off * F), c_dw + wo, c_dx + (size_t)(off * D)};
        const void *A[3] = {dy.data() + off * D, dy.data() + off * D, ph.data() + off * F};
        const void *B[3] = {w.data() + wo, ph.data() + off * F, w.data() + wo};
        const void *Ad[3] = {ddy.d + off * D, ddy.d + off * D, dph.d + off * F};
        const void *Bd[3] = {dw.d + wo, dph.d + off * F, dw.d + wo};
        for (int j = 0; j < 3; j++) {
            lrmoe_gemm_t x = a[j];
            x.a = A[j]; x.b = B[j]; x.c = hc.data() + co[j] * es;
            gh.push_back(x);
            x.a = Ad[j]; x.b = Bd[j]; x.c = dc.d + co[j] * es;
            gd.push_back(x);
        }
        off += m[e];
    }
    OK(lrmoe_kcu_gemm((int)gd.size(), gd.data()));
    OK(lrmoe_kref_gemm((int)gh.size(), gh.data()));
    auto got = dc.get();
    std::vector<float> g(cn), r(cn);
    if (c_bf16) {
        lrmoe_convert_to_f32(LRMOE_BF16, got.data(), g.data(), cn);
        lrmoe_convert_to_f32(LRMOE_BF16, hc.data(), r.data(), cn);
    } else {
        memcpy(g.data(), got.data(), cn * 4);
        memcpy(r.data(), hc.data(), cn * 4);
    }
    /* products of BF16 operands are exact in F32; the sum of k of them in F32
     * (any order, split-K) errs by well under 1e-6*k for |a|,|b| <= 1 (the
     * reference sums in double): atol 1e-6*max(k), rtol 1e-5. A BF16 C, or
     * the grouped path's BF16 temporary, rounds the result once on each side:
     * the two may land on neighbouring BF16 values, one BF16 ulp apart, at
     * most 2^-7 relative: rtol 2^-7. The grouped path with an F32 C and
     * beta = 1 rounds the product BEFORE adding C, so its error scales with
     * |AB|, not with |AB + C|: there atol also gets 2^-8 * max|AB|. A dropped
     * or doubled term (~0.25) is far outside every bound. */
    double kmax = (double)(D > F ? D : F);
    if (M > kmax) kmax = (double)M;
    int rounded = c_bf16 || impl == LRMOE_GEMM_GROUPED;
    double atol = 1e-6 * kmax;
    if (impl == LRMOE_GEMM_GROUPED && !c_bf16 && beta1) {
        double mp = 0;
        const float *c0f = (const float *)c0.data();
        for (size_t i = 0; i < cn; i++) mp = fmax(mp, fabs((double)r[i] - c0f[i]));
        atol += mp / 256;
    }
    cmp_f32("gemm", cs, g.data(), r.data(), cn, atol, rounded ? 1.0 / 128 : 1e-5);
}

/* lrmoe_kcu_ggemm (the Hopper grouped GEMM fed by device-side row offsets)
 * against the CPU reference, GEMM by GEMM: row-grouped (tb 0: dphi/dx form,
 * tb 1: forward FC1/FC2) or K-grouped (weight gradients), E experts of m_e
 * rows including empty ones; the offsets are only ever in device memory
 * for the call. Tolerances as in t_gemm (an F32 C is not rounded). */
static void t_ggemm(int E, int64_t n, int64_t k, int kgrouped, int tb, int c_bf16, int beta1)
{
    char cs[112];
    snprintf(cs, sizeof cs, "E=%d n=%lld k=%lld %s tb=%d C=%s beta=%d cutlass-offsets", E,
             (long long)n, (long long)k, kgrouped ? "K-grouped" : "row-grouped", tb,
             c_bf16 ? "bf16" : "f32", beta1);
    std::vector<int64_t> m(E), off(E + 1, 0);
    for (int e = 0; e < E; e++) {
        m[e] = e == 0 ? 0 : e == 1 ? 1 : irand(300);
        off[e + 1] = off[e] + m[e];
    }
    int64_t M = off[E];
    /* row-grouped: A (M,k), B E x op (k,n), C (M,n); K-grouped: A (M,n_a=k)
     * stored rows x k as the "m" side, B (M,n), C E x (k,n) */
    int64_t arows = M, acols = k, brows = kgrouped ? M : (int64_t)E * (tb ? n : k);
    int64_t bcols = kgrouped ? n : (tb ? k : n), crows = kgrouped ? (int64_t)E * k : M;
    size_t es = c_bf16 ? 2 : 4, cn = (size_t)(crows * n);
    auto a = randbf((size_t)(arows * acols)), b = randbf((size_t)(brows * bcols));
    std::vector<uint8_t> c0(cn * es);
    if (c_bf16) { auto v = randbf(cn); memcpy(c0.data(), v.data(), cn * 2); }
    else { auto v = randf(cn, -1, 1); memcpy(c0.data(), v.data(), cn * 4); }
    dbuf<uint16_t> da(a.size() ? a.size() : 1), db(b.size() ? b.size() : 1);
    dbuf<uint8_t> dc(c0.size() ? c0.size() : 1);
    dbuf<int64_t> doff(off.size());
    dbuf<int> derr(1);
    if (a.size()) da.put(a);
    if (b.size()) db.put(b);
    if (c0.size()) dc.put(c0);
    doff.put(off);
    derr.put(std::vector<int>{0});
    lrmoe_ggemm_t d;
    memset(&d, 0, sizeof d);
    d.kgrouped = kgrouped; d.ngroups = E; d.offsets = doff.d; d.rows = M;
    d.m = k; d.n = n; d.k = k;
    d.ta = kgrouped; d.tb = kgrouped ? 0 : tb;
    d.a = da.d; d.b = db.d; d.c = dc.d;
    d.lda = acols; d.ldb = bcols; d.ldc = n;
    d.sb = kgrouped ? 0 : (tb ? n : k) * bcols;
    d.sc = kgrouped ? k * n : 0;
    d.c_bf16 = c_bf16; d.alpha = 1.0f; d.beta = beta1 ? 1.0f : 0.0f; d.err = derr.d;
    OK(lrmoe_kcu_ggemm(&d));
    /* the reference, one lrmoe_gemm_t per expert on the host copies */
    std::vector<uint8_t> hc(c0);
    std::vector<lrmoe_gemm_t> gh;
    for (int e = 0; e < E; e++) {
        lrmoe_gemm_t x;
        memset(&x, 0, sizeof x);
        if (!kgrouped) {
            x.m = m[e]; x.n = n; x.k = k; x.ta = 0; x.tb = tb;
            x.a = a.data() + off[e] * acols; x.b = b.data() + (size_t)e * d.sb;
            x.c = hc.data() + (size_t)(off[e] * n) * es;
        } else {
            x.m = k; x.n = n; x.k = m[e]; x.ta = 1; x.tb = 0;
            x.a = a.data() + off[e] * acols; x.b = b.data() + off[e] * bcols;
            x.c = hc.data() + (size_t)e * d.sc * es;
        }
        x.lda = d.lda; x.ldb = d.ldb; x.ldc = d.ldc; x.c_bf16 = c_bf16; x.beta = d.beta;
        gh.push_back(x);
    }
    OK(lrmoe_kref_gemm((int)gh.size(), gh.data()));
    auto got = dc.get();
    auto err = derr.get();
    if (err[0]) report("ggemm", cs, 0, 0, "error flag set for valid offsets");
    std::vector<float> g(cn), r(cn);
    if (c_bf16) {
        lrmoe_convert_to_f32(LRMOE_BF16, got.data(), g.data(), cn);
        lrmoe_convert_to_f32(LRMOE_BF16, hc.data(), r.data(), cn);
    } else {
        memcpy(g.data(), got.data(), cn * 4);
        memcpy(r.data(), hc.data(), cn * 4);
    }
    double kmax = (double)(k > M ? k : M);
    cmp_f32("ggemm", cs, g.data(), r.data(), cn, 1e-6 * kmax, c_bf16 ? 1.0 / 128 : 1e-5);
}

int main(int argc, char **argv)
{
    /* one line per case as it happens: a hang or a crash on the device keeps
     * the lines before it (stdout is a file under check-gpu) */
    setvbuf(stdout, NULL, _IOLBF, 0);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (argc > 1 && !strcmp(argv[1], "--probe")) {
        if (e != cudaSuccess || n < 1) {
            printf("no CUDA device: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
            return 3;
        }
        return 0;
    }
    if (e != cudaSuccess || n < 1) {
        fprintf(stderr, "test-kernels: no CUDA device: %s\n", cudaGetErrorString(e));
        return 3;
    }
    /* fresh inputs every run; the seed is printed so a failure can be rerun */
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : (uint64_t)time(NULL);
    rng_state ^= seed;
    printf("test-kernels: seed %llu (rerun: test-kernels %llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    lrmoe_kcu_ctx_t *ctx;
    try {
        OK(lrmoe_kcu_ctx_create(0, 4, &ctx));
        OK(lrmoe_kcu_use(ctx));
    } catch (const case_error &e) {
        printf("test-kernels: %s\n", e.msg);
        return 1;
    }
/* a case that throws (a launcher or copy failed) is one FAIL line; the rest run */
#define CASE(call) do { try { call; } catch (const case_error &e_) { \
        report(#call, "aborted", 0, 0, e_.msg); } } while (0)

    int64_t sz[] = {0, 1, 255, 4097};
    for (int64_t s : sz) CASE(t_convert(s));
    CASE(t_score(0, 2, 8)); CASE(t_score(1, 1, 1)); CASE(t_score(257, 8, 300)); CASE(t_score(1000, 4, 2048));
    CASE(t_select(0, 2, 4, "spread", 0));
    CASE(t_select(1, 1, 3, "spread", 0));
    CASE(t_select(777, 8, 128, "spread", 0));
    CASE(t_select(777, 8, 128, "spread", 1));
    CASE(t_select(500, 1, 8, "hot", 0));       /* expert 0 has every pair, the rest none */
    CASE(t_select(300, 2, 64, "sparse", 1));   /* most experts empty */
    CASE(t_select(20000, 8, 128, "spread", 1));
    CASE(t_sample(0, 2, 4, "spread", 0, 1));
    CASE(t_sample(777, 8, 128, "spread", 0, 2));
    CASE(t_sample(777, 8, 128, "spread", 1, 3));
    CASE(t_sample(500, 1, 8, "hot", 1, 4));
    CASE(t_sample(300, 2, 64, "sparse", 0, 5));
    CASE(t_sample(20000, 8, 128, "spread", 1, 6));
    CASE(t_pack(0, 2, 4, 2, "spread", 1, 1));
    CASE(t_pack(1, 1, 3, 3, "spread", 1, 1));
    CASE(t_pack(333, 4, 16, 4, "spread", 1, 1));
    CASE(t_pack(333, 4, 16, 4, "spread", 0, 1));
    CASE(t_pack(333, 4, 16, 4, "spread", 1, 0));
    CASE(t_pack(5000, 1, 8, 8, "hot", 1, 1));   /* one expert, many rows per warp slice */
    CASE(t_pack(3000, 4, 128, 64, "spread", 1, 1));
    CASE(t_pack(3000, 4, 128, 64, "spread", 1, 0));
    CASE(t_pack(400, 2, 64, 5, "sparse", 1, 1));
    CASE(t_pack(9000, 8, 128, 8, "spread", 1, 1));
    CASE(t_gather(0, 2, 0, 64, 1, 16));
    CASE(t_gather(1, 1, 1, 16, 0, 1));
    CASE(t_gather(100, 4, 333, 4096, 1, 2048));  /* 16-byte path */
    CASE(t_gather(100, 4, 333, 1536, 0, 768));
    CASE(t_gather(50, 3, 100, 44, 1, 33));       /* 4-byte path */
    CASE(t_gather(50, 3, 100, 6, 0, 3));         /* byte path */
    CASE(t_gather(300, 8, 2000, 24, 1, 20));     /* 8-byte path; D=20: 5 float4, 8 threads a row */
    CASE(t_gather(100, 4, 333, 1536, 1, 768, 1)); /* F32 rows off 16-byte alignment */
    CASE(t_gather(40, 2, 80, 4104, 0, 1000));    /* 8-byte rows > 256 vectors; 250 float4 */
    CASE(t_swiglu(0, 7)); CASE(t_swiglu(1, 1)); CASE(t_swiglu(300, 768)); CASE(t_swiglu(77, 1000));
    CASE(t_combine(0, 2, 4)); CASE(t_combine(1, 1, 1)); CASE(t_combine(300, 8, 257)); CASE(t_combine(64, 4, 2048));
    CASE(t_combine(300, 8, 20)); CASE(t_combine(64, 4, 2048, 1)); CASE(t_combine(33, 2, 6));
    /* --gemm cutlass where the build has it (an sm_90 device) */
    int nimpl = lrmoe_kcu_have_cutlass() ? 3 : 2;
    if (nimpl == 2) printf("test-kernels: built without CUTLASS: no cutlass GEMM cases\n");
    for (int impl = 0; impl < nimpl; impl++)
        for (int cb = 0; cb < 2; cb++) {
            CASE(t_gemm(6, 64, 48, cb, (lrmoe_gemm_impl_t)impl, 0));
            CASE(t_gemm(5, 130, 70, cb, (lrmoe_gemm_impl_t)impl, 1));
        }
    CASE(t_gemm(16, 512, 384, 0, LRMOE_GEMM_LOOP, 0));
    CASE(t_gemm(16, 512, 384, 0, LRMOE_GEMM_GROUPED, 0));
    if (nimpl == 3) {
        CASE(t_gemm(16, 512, 384, 0, LRMOE_GEMM_CUTLASS, 0));
        CASE(t_gemm(16, 512, 384, 0, LRMOE_GEMM_CUTLASS, 1));
        for (int cb = 0; cb < 2; cb++)
            for (int b1 = 0; b1 < 2; b1++) {
                CASE(t_ggemm(7, 64, 48, 0, 0, cb, b1));   /* dphi / dx form */
                CASE(t_ggemm(7, 64, 48, 0, 1, cb, b1));   /* forward form */
                CASE(t_ggemm(7, 64, 48, 1, 0, cb, b1));   /* weight gradient */
            }
        CASE(t_ggemm(16, 768, 512, 0, 1, 0, 0));
        CASE(t_ggemm(16, 768, 512, 1, 0, 0, 0));
    }

    if (lrmoe_kcu_sync() < 0) report("final sync", "", 0, 0, lrmoe_errmsg());
    lrmoe_kcu_ctx_destroy(ctx);
    printf("%d of %d kernel checks passed\n", cases - fails, cases);
    return fails ? 1 : 0;
}
