/* Unit checks for the plan module (built by tests/plan.bats against
 * build/liblrmoe.a). Subcommands:
 *   eplb-readme            the DeepSeek EPLB README example, exact phy2log
 *   random COUNT SEED      random instances: GLPK peak == closed-form T* ==
 *                          max-flow peak == flow-bisection bound; quota
 *                          variant likewise (GLPK, and max-flow at T* with
 *                          GLPK's, no or a random preference, refused below
 *                          T*); the incremental routing check equals a
 *                          fresh max-flow; every allocation consistent
 *   random-large COUNT SEED  the same with 17..24 ranks (bounds by max-flow)
 *   fastpath COUNT SEED    the min-peak fast path and parametric max-flow
 *                          search vs the full bisection search and the closed
 *                          form, with certificates, 1..64 ranks
 *   dump COUNT SEED        tiny instances as text for the Python brute force:
 *                          "P E | placement rows | need | glpk_peak lb | lo n total qpeak qlb"
 *   llep P LAMBDA ALPHA M LOAD...   print fwd_alloc rows and "ran"
 *   plan PLANNER P LOAD...          full plan + lrmoe_plan_check
 *   check-stream FILE      lrmoe_plan_from_frame + lrmoe_plan_check per frame
 *   bench FILE             GLPK vs closed form + max-flow timings (bench/plan.sh)
 *   never-loses COUNT SEED P...  random traces (E = 64..384, nodes 1..16,
 *                          uniform/hot/Zipf skew, budgets from unlimited to
 *                          ones that force rho < 1) at each P: lrmoe's t_total
 *                          and forward peak are no worse than the best
 *                          baseline's (lowest t_total of those whose plans
 *                          fit the budget; lrmoe must then fit too), and a
 *                          plan with rho < 1 has a
 *                          modelled backward no longer than the same plan
 *                          keeping every pair; at the pinned rates 1, 0.9,
 *                          0.8 ... 0.5 (--rate R): every plan's t_total and
 *                          modelled backward are no longer than the rate-1
 *                          plan's (when it fits), and both are non-increasing
 *                          as the rate falls (over the rates that fit)
 * Exit 0 when all checks pass; prints "FAIL ..." lines otherwise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "plan_internal.h"
#include "minpeak_internal.h"
#include "clock.h"

static uint64_t rs = 88172645463325252ull;
static uint64_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}
static int rint_(int lo, int hi) { return lo + (int)(rnd() % (uint64_t)(hi - lo + 1)); }

static int eplb_readme(void)
{
    const double w[2][12] = {{90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86},
                             {20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27}};
    const int want[2][16] = {{5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1},
                             {7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1}};
    int p2l[32], rk[32], cnt[24];
    if (lrmoe_eplb_rebalance(&w[0][0], 2, 12, 16, 4, 2, 8, p2l, rk, cnt) < 0) {
        printf("FAIL eplb: %s\n", lrmoe_errmsg());
        return 1;
    }
    int bad = 0;
    for (int l = 0; l < 2; l++) {
        printf("phy2log[%d] =", l);
        for (int i = 0; i < 16; i++) {
            printf(" %d", p2l[l * 16 + i]);
            bad |= p2l[l * 16 + i] != want[l][i];
        }
        printf("\n");
    }
    /* logcnt must count the physical copies */
    for (int l = 0; l < 2; l++)
        for (int e = 0; e < 12; e++) {
            int c = 0;
            for (int i = 0; i < 16; i++)
                c += p2l[l * 16 + i] == e;
            if (c != cnt[l * 12 + e]) {
                printf("FAIL logcnt[%d][%d] = %d, copies %d\n", l, e, cnt[l * 12 + e], c);
                bad = 1;
            }
        }
    if (bad)
        printf("FAIL eplb-readme mismatch\n");
    return bad;
}

/* random instance: E experts, P ranks, each expert 1..P eligible ranks
 * (native always), skewed loads */
static void instance(int E, int P, int maxload, uint8_t *pl, int64_t *n)
{
    int per = E / P;
    memset(pl, 0, (size_t)E * P);
    int skew = rint_(0, 2);
    for (int e = 0; e < E; e++) {
        pl[(size_t)e * P + e / per] = 1;
        int k = rint_(1, P);
        if (rint_(0, 1))
            k = 1 + (rint_(0, 3) == 0 ? rint_(0, P - 1) : 0);
        for (int j = 1; j < k; j++)
            pl[(size_t)e * P + rint_(0, P - 1)] = 1;
        int64_t v = rint_(0, maxload);
        if (skew == 1 && rint_(0, 7) == 0)
            v *= 20;
        if (skew == 2)
            v = (int64_t)(maxload * 4.0 / (1 + e) / (1 + e % 3)); /* Zipf-like */
        n[e] = maxload <= 4 && v > 6 ? 6 : v; /* tiny: keep brute force small */
    }
}

static int consistent(const uint8_t *pl, const int64_t *need, const int64_t *x, int E, int P,
                      int64_t peak, const char *what)
{
    int64_t mx = 0;
    int64_t *rsum = calloc((size_t)P, sizeof *rsum);
    for (int e = 0; e < E; e++) {
        int64_t s = 0;
        for (int p = 0; p < P; p++) {
            int64_t v = x[(size_t)e * P + p];
            if (v < 0 || (v && !pl[(size_t)e * P + p])) {
                printf("FAIL %s: x[%d,%d]=%lld ineligible/negative\n", what, e, p, (long long)v);
                free(rsum);
                return 1;
            }
            s += v;
            rsum[p] += v;
        }
        if (s != need[e]) {
            printf("FAIL %s: row %d sums %lld, need %lld\n", what, e, (long long)s,
                   (long long)need[e]);
            free(rsum);
            return 1;
        }
    }
    for (int p = 0; p < P; p++)
        if (rsum[p] > mx)
            mx = rsum[p];
    free(rsum);
    if (mx != peak) {
        printf("FAIL %s: reported peak %lld, actual %lld\n", what, (long long)peak, (long long)mx);
        return 1;
    }
    return 0;
}

static int random_check(int count, int tiny, int dump, int large)
{
    int fails = 0;
    for (int it = 0; it < count; it++) {
        int P = tiny ? rint_(1, 3) : large ? rint_(LRMOE_PLAN_MAX_P + 1, 24) : rint_(1, 8);
        int per = tiny ? rint_(1, 2) : large ? rint_(1, 4) : rint_(1, 16);
        int E = P * per, maxload = tiny ? 4 : rint_(1, 5000);
        uint8_t *pl = malloc((size_t)E * P);
        int64_t *n = malloc((size_t)E * sizeof *n), *lo = malloc((size_t)E * sizeof *lo);
        int64_t *x = malloc((size_t)E * P * sizeof *x), *K = malloc((size_t)E * sizeof *K);
        instance(E, P, maxload, pl, n);
        int64_t lb = lrmoe_minpeak_lb(pl, n, E, P);
        int64_t g = lrmoe_alloc_glpk(pl, n, E, P, 10.0, x);
        if (g < 0 || lb < 0) {
            printf("FAIL glpk/lb error: %s\n", lrmoe_errmsg());
            return 1;
        }
        fails += consistent(pl, n, x, E, P, g, "glpk");
        int64_t f = lrmoe_alloc_flow(pl, n, E, P, x);
        fails += consistent(pl, n, x, E, P, f, "flow");
        /* large P: lb itself comes from the flow bisection; compare with GLPK */
        int64_t lbf = lrmoe_minpeak_lb_flow(pl, n, E, P);
        if (g != lb || f != lb || lbf != lb) {
            printf("FAIL instance %d: glpk %lld flow %lld lb %lld lb-flow %lld\n", it,
                   (long long)g, (long long)f, (long long)lb, (long long)lbf);
            fails++;
        }
        /* quota variant */
        int64_t N = 0, slo = 0;
        double keep = rint_(0, 4) / 8.0;
        for (int e = 0; e < E; e++) {
            N += n[e];
            lo[e] = (int64_t)((double)n[e] * keep);
            slo += lo[e];
        }
        int64_t total = slo + (N > slo ? (int64_t)(rnd() % (uint64_t)(N - slo + 1)) : 0);
        int64_t qlb = lrmoe_minpeak_quota_lb(pl, lo, n, total, E, P);
        int64_t qg = lrmoe_alloc_glpk_quota(pl, lo, n, total, NULL, E, P, 10.0, K, x);
        if (qlb < 0 || qg < 0) {
            printf("FAIL quota error: %s\n", lrmoe_errmsg());
            return 1;
        }
        int64_t ks = 0;
        for (int e = 0; e < E; e++) {
            ks += K[e];
            if (K[e] < lo[e] || K[e] > n[e]) {
                printf("FAIL quota %d outside [lo,n]\n", e);
                fails++;
            }
        }
        if (ks != total) {
            printf("FAIL quotas sum %lld, want %lld\n", (long long)ks, (long long)total);
            fails++;
        }
        fails += consistent(pl, K, x, E, P, qg, "glpk-quota");
        int64_t qlbf = lrmoe_minpeak_quota_lb_flow(pl, lo, n, total, E, P);
        if (qg != qlb || qlbf != qlb) {
            printf("FAIL quota instance %d: glpk %lld bound %lld flow bound %lld\n", it,
                   (long long)qg, (long long)qlb, (long long)qlbf);
            fails++;
        }
        /* the max-flow quota allocation at the optimum; pref: GLPK's x,
         * none, or random */
        int64_t *xf = malloc((size_t)E * P * sizeof *xf), *Kf = malloc((size_t)E * sizeof *Kf);
        int64_t *kept = malloc((size_t)E * sizeof *kept);
        const int pk = it % 3;
        for (size_t i = 0; pk == 2 && i < (size_t)E * P; i++)
            xf[i] = pl[i] ? (int64_t)(rnd() % 100) : 0;
        int64_t *pref = pk == 0 ? x : pk == 1 ? NULL : xf;
        int64_t qf = lrmoe_alloc_flow_quota(pl, lo, n, total, pref, E, P, qlb, Kf, xf);
        if (qf < 0) {
            printf("FAIL flow-quota instance %d: %s\n", it, lrmoe_errmsg());
            fails++;
        } else {
            int64_t fs = 0;
            for (int e = 0; e < E; e++) {
                fs += Kf[e];
                if (Kf[e] < lo[e] || Kf[e] > n[e]) {
                    printf("FAIL flow-quota %d: %lld outside [%lld,%lld]\n", e,
                           (long long)Kf[e], (long long)lo[e], (long long)n[e]);
                    fails++;
                }
            }
            if (fs != total || qf != qlb) {
                printf("FAIL flow-quota instance %d: sum %lld (want %lld), peak %lld (T* %lld)\n",
                       it, (long long)fs, (long long)total, (long long)qf, (long long)qlb);
                fails++;
            }
            fails += consistent(pl, Kf, xf, E, P, qf, "flow-quota");
        }
        /* below the optimum it must refuse */
        if (qlb > 0 && lrmoe_alloc_flow_quota(pl, lo, n, total, NULL, E, P, qlb - 1, Kf, xf) >= 0) {
            printf("FAIL flow-quota instance %d: allocated below T* %lld\n", it, (long long)qlb);
            fails++;
        }
        /* the incremental routing check against a fresh max-flow: needs
         * rise from the floors (each try from the last kept routing, after a
         * refusal too), the last try the loads, which route at their T*
         * (every other instance checks at 3/4 of it, where some refuse) */
        const int64_t rT = it % 2 ? lb : 3 * lb / 4; /* below T*: refusals */
        lrmoe_route_net_t *rn = lrmoe_route_net_new(pl, E, P, rT);
        memcpy(kept, lo, (size_t)E * sizeof *kept);
        for (int step = 0; rn && step < 8; step++) {
            const int64_t part = rint_(1, 4);
            for (int e = 0; e < E; e++)
                Kf[e] = step == 7 ? n[e] : step == 0 ? lo[e]
                        : kept[e] + (int64_t)(rnd() % (uint64_t)((n[e] - kept[e]) / part + 1));
            int a = lrmoe_route_net_try(rn, Kf), b = lrmoe_flow_routes(pl, Kf, E, P, rT);
            if (a != b || (step == 7 && rT == lb && a != 1)) {
                printf("FAIL route-net instance %d step %d: incremental %d, fresh %d\n", it, step,
                       a, b);
                fails++;
            }
            if (a == 1)
                memcpy(kept, Kf, (size_t)E * sizeof *kept);
        }
        if (!rn) {
            printf("FAIL route-net: %s\n", lrmoe_errmsg());
            fails++;
        }
        lrmoe_route_net_free(rn);
        free(xf);
        free(Kf);
        free(kept);
        if (dump) {
            printf("%d %d |", P, E);
            for (int e = 0; e < E; e++) {
                printf(" ");
                for (int p = 0; p < P; p++)
                    printf("%d", pl[(size_t)e * P + p]);
            }
            printf(" |");
            for (int e = 0; e < E; e++)
                printf(" %lld", (long long)n[e]);
            printf(" | %lld %lld |", (long long)g, (long long)lb);
            for (int e = 0; e < E; e++)
                printf(" %lld", (long long)lo[e]);
            printf(" | %lld %lld %lld\n", (long long)total, (long long)qg, (long long)qlb);
        }
        free(pl);
        free(n);
        free(lo);
        free(x);
        free(K);
    }
    if (!dump)
        printf("%d instances, %d failures\n", count, fails);
    return fails != 0;
}

/* The bound of rank subset w (P flags) computed here from its definition:
 * fixed needs max over S of ceil(N(S)/|S|) restricted to S = w; with free
 * quotas the larger of ceil(Lo(S)/|S|) and ceil((total - N + n(S))/|S|).
 * N(S) counts the experts whose eligible ranks all lie in S. */
static int64_t subset_bound(const uint8_t *pl, const int64_t *lo, const int64_t *n,
                            int64_t total, int E, int P, const uint8_t *w)
{
    int64_t k = 0, a = 0, b = 0, N = 0;
    for (int p = 0; p < P; p++)
        k += w[p] != 0;
    if (k == 0)
        return -1;
    for (int e = 0; e < E; e++) {
        int in = 1;
        for (int p = 0; p < P; p++)
            if (pl[(size_t)e * P + p] && !w[p])
                in = 0;
        N += n[e];
        if (in) {
            a += lo ? lo[e] : n[e];
            b += n[e];
        }
    }
    int64_t v = (a + k - 1) / k;
    if (lo) {
        int64_t x = total - N + b, u = x >= 0 ? (x + k - 1) / k : -((-x) / k);
        if (u > v)
            v = u;
    }
    return v;
}

/* fastpath COUNT SEED: the min-peak search with its fast path (LB0 against
 * an upper bound) and the parametric max-flow (plan_minpeak) against the
 * full search (bisection with one max-flow per probe) and, for P <= 16, the
 * closed form, on random instances with 1..64 ranks: dense and sparse
 * eligibility, skewed loads. Each result is also certified independently:
 * the returned witness subset has exactly that bound (so T* >= result) and
 * a max-flow allocation reaches it (T* <= result). Fixed needs and free
 * quotas; upper bounds from the optimal allocation, from everything-native
 * (often far above T*) and T* + small. */
static int fastpath_check(int count)
{
    int fails = 0, nfast = 0, nsearch = 0;
    for (int it = 0; it < count; it++) {
        const int P = rint_(1, 64), per = rint_(1, 4), E = P * per;
        const int maxload = rint_(1, 5000);
        uint8_t *pl = malloc((size_t)E * P), *w = malloc((size_t)P);
        int64_t *n = malloc((size_t)E * sizeof *n), *lo = malloc((size_t)E * sizeof *lo);
        int64_t *x = malloc((size_t)E * P * sizeof *x), *rs = calloc((size_t)P, sizeof *rs);
        if (rint_(0, 1)) {
            instance(E, P, maxload, pl, n);
        } else { /* sparse: native + 0..2 random ranks, a few hot experts */
            memset(pl, 0, (size_t)E * P);
            for (int e = 0; e < E; e++) {
                pl[(size_t)e * P + e / per] = 1;
                for (int j = rint_(0, 2); j > 0; j--)
                    pl[(size_t)e * P + rint_(0, P - 1)] = 1;
                n[e] = rint_(0, maxload) * (rint_(0, 9) == 0 ? 30 : 1);
            }
        }
        /* fixed needs */
        int64_t ref = lrmoe_minpeak_lb_flow(pl, n, E, P);
        int64_t cf = P <= LRMOE_PLAN_MAX_P ? lrmoe_minpeak_lb(pl, n, E, P) : ref;
        int how = 0;
        int64_t t = lrmoe_plan_minpeak(pl, NULL, n, 0, E, P, -1, w, &how);
        int64_t wb = subset_bound(pl, NULL, n, 0, E, P, w);
        int64_t fl = lrmoe_alloc_flow(pl, n, E, P, x);
        if (ref < 0 || cf < 0 || t < 0 || fl < 0) {
            printf("FAIL fastpath instance %d: error %s\n", it, lrmoe_errmsg());
            return 1;
        }
        fails += consistent(pl, n, x, E, P, fl, "fastpath-flow");
        if (t != ref || cf != ref || wb != t || fl != t) {
            printf("FAIL fastpath instance %d (P=%d E=%d): full search %lld closed form %lld "
                   "search %lld witness %lld allocation %lld\n", it, P, E, (long long)ref,
                   (long long)cf, (long long)t, (long long)wb, (long long)fl);
            fails++;
        }
        /* upper bounds: optimal allocation, everything native, T* + 0..3 */
        int64_t nat = 0;
        for (int e = 0; e < E; e++)
            rs[e / per] += n[e];
        for (int p = 0; p < P; p++)
            nat = rs[p] > nat ? rs[p] : nat;
        const int64_t ubs[3] = {fl, nat, ref + rint_(0, 3)};
        for (int k = 0; k < 3; k++) {
            int64_t u = lrmoe_plan_minpeak(pl, NULL, n, 0, E, P, ubs[k], k == 2 ? w : NULL, &how);
            nfast += how == 1;
            nsearch += how == 3;
            if (u != ref || (k == 2 && subset_bound(pl, NULL, n, 0, E, P, w) != u)) {
                printf("FAIL fastpath instance %d (P=%d E=%d): ub %lld gives %lld, T* %lld "
                       "(how %d)\n", it, P, E, (long long)ubs[k], (long long)u,
                       (long long)ref, how);
                fails++;
            }
        }
        if (lrmoe_minpeak_lb(pl, n, E, P) != ref) {
            printf("FAIL fastpath instance %d: lrmoe_minpeak_lb differs\n", it);
            fails++;
        }
        /* free quotas */
        int64_t N = 0, slo = 0;
        const double keep = rint_(0, 4) / 8.0;
        for (int e = 0; e < E; e++) {
            N += n[e];
            lo[e] = (int64_t)((double)n[e] * keep);
            slo += lo[e];
        }
        const int64_t total = slo + (N > slo ? (int64_t)(rnd() % (uint64_t)(N - slo + 1)) : 0);
        int64_t qref = lrmoe_minpeak_quota_lb_flow(pl, lo, n, total, E, P);
        int64_t qcf = P <= LRMOE_PLAN_MAX_P ? lrmoe_minpeak_quota_lb(pl, lo, n, total, E, P)
                                            : qref;
        int64_t qt = lrmoe_plan_minpeak(pl, lo, n, total, E, P, -1, w, &how);
        int64_t qw = subset_bound(pl, lo, n, total, E, P, w);
        int64_t qu = lrmoe_plan_minpeak(pl, lo, n, total, E, P, qref + rint_(0, 2), NULL, &how);
        nfast += how == 1;
        nsearch += how == 3;
        if (qref < 0 || qt != qref || qcf != qref || qw != qt || qu != qref ||
            lrmoe_minpeak_quota_lb(pl, lo, n, total, E, P) != qref) {
            printf("FAIL fastpath quota instance %d (P=%d E=%d): full search %lld closed form "
                   "%lld search %lld witness %lld with ub %lld\n", it, P, E, (long long)qref,
                   (long long)qcf, (long long)qt, (long long)qw, (long long)qu);
            fails++;
        }
        free(pl);
        free(w);
        free(n);
        free(lo);
        free(x);
        free(rs);
    }
    printf("%d instances, %d failures (fast path %d, max-flow search %d)\n", count, fails,
           nfast, nsearch);
    return fails != 0;
}

static int llep(int argc, char **argv)
{
    int P = atoi(argv[0]);
    double lambda = atof(argv[1]), alpha = atof(argv[2]);
    int64_t m = atoll(argv[3]);
    int E = argc - 4;
    int64_t *n = malloc((size_t)E * sizeof *n), *x = malloc((size_t)E * P * sizeof *x);
    uint8_t *pl = malloc((size_t)E * P);
    for (int e = 0; e < E; e++)
        n[e] = atoll(argv[4 + e]);
    int r = lrmoe_llep_assign(n, E, P, lambda, alpha, m, pl, x);
    if (r < 0) {
        printf("error: %s\n", lrmoe_errmsg());
        return 1;
    }
    printf("ran %d\n", r);
    for (int e = 0; e < E; e++) {
        for (int p = 0; p < P; p++)
            printf("%s%lld", p ? " " : "", (long long)x[(size_t)e * P + p]);
        printf("\n");
    }
    return 0;
}

static int plan(int argc, char **argv)
{
    lrmoe_plan_opts_t o;
    lrmoe_plan_opts_default(&o);
    if (lrmoe_planner_parse(argv[0], &o.planner) < 0)
        return 2;
    o.P = atoi(argv[1]);
    int E = argc - 2;
    int64_t *n = malloc((size_t)E * sizeof *n);
    for (int e = 0; e < E; e++)
        n[e] = atoll(argv[2 + e]);
    lrmoe_plan_t p;
    lrmoe_plan_init(&p);
    if (lrmoe_plan_compute(&o, n, E, &p) < 0 || lrmoe_plan_check(&p, n) < 0) {
        printf("error: %s\n", lrmoe_errmsg());
        return 1;
    }
    printf("rho %.3f fwd_peak %lld bwd_peak %lld fwd_lb %lld replicas %d\n", p.rho,
           (long long)p.fwd_peak, (long long)p.bwd_peak, (long long)p.fwd_lb, p.replicas);
    lrmoe_plan_free(&p);
    return 0;
}

/* read a planned stream back: lrmoe_plan_from_frame + lrmoe_plan_check */
static int check_stream(const char *path)
{
    lrmoe_reader_t *r = lrmoe_reader_open(path);
    if (!r) {
        printf("error: %s\n", lrmoe_errmsg());
        return 1;
    }
    lrmoe_frame_t f;
    lrmoe_frame_init(&f);
    int rc, bad = 0;
    while ((rc = lrmoe_reader_next(r, &f)) == 1) {
        lrmoe_plan_t p;
        lrmoe_plan_init(&p);
        lrmoe_tensor_t *tl = lrmoe_frame_need(&f, "expert_load");
        int64_t *load = tl ? lrmoe_tensor_i64(tl) : NULL;
        if (!load || lrmoe_plan_from_frame(&f, &p) < 0 || lrmoe_plan_check(&p, load) < 0) {
            printf("frame %lld: %s\n", (long long)lrmoe_reader_index(r) - 1, lrmoe_errmsg());
            bad = 1;
        } else {
            printf("frame %lld: ok %s E=%d P=%d fwd_peak %lld\n",
                   (long long)lrmoe_reader_index(r) - 1, p.planner, p.E, p.P,
                   (long long)p.fwd_peak);
        }
        free(load);
        lrmoe_plan_free(&p);
    }
    if (rc < 0) {
        printf("error: %s\n", lrmoe_errmsg());
        bad = 1;
    }
    lrmoe_frame_clear(&f);
    lrmoe_reader_close(r);
    return bad;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report(const char *what, double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    int i99 = (int)(0.99 * (n - 1) + 0.5);
    printf("%-34s %10.3f %10.3f\n", what, t[n / 2] * 1e3, t[i99] * 1e3);
}

/* bench FILE: per frame of a planned stream, the min-peak allocation of the
 * forward pairs by GLPK and by closed form + max-flow, on the native-only
 * placement and on the frame's placement; and the free-quota backward
 * allocation at rho 0.8 by GLPK against its closed-form bound. Prints
 * median and p99 ms; exit 1 if any peak differs from T*. */
static int bench(const char *path)
{
    lrmoe_reader_t *r = lrmoe_reader_open(path);
    if (!r) {
        printf("error: %s\n", lrmoe_errmsg());
        return 1;
    }
    enum { MAXF = 4096 };
    static double tg0[MAXF], tf0[MAXF], tg1[MAXF], tf1[MAXF], tq[MAXF], tb[MAXF];
    lrmoe_frame_t f;
    lrmoe_frame_init(&f);
    int n = 0, bad = 0, rc;
    while (n < MAXF && (rc = lrmoe_reader_next(r, &f)) == 1) {
        lrmoe_plan_t p;
        lrmoe_plan_init(&p);
        lrmoe_tensor_t *tl = lrmoe_frame_need(&f, "expert_load");
        int64_t *load = tl ? lrmoe_tensor_i64(tl) : NULL;
        if (!load || lrmoe_plan_from_frame(&f, &p) < 0) {
            printf("error: %s\n", lrmoe_errmsg());
            return 1;
        }
        const int E = p.E, P = p.P, per = E / P;
        uint8_t *nat = calloc((size_t)E * P, 1);
        int64_t *x = malloc((size_t)E * P * sizeof *x), *K = malloc((size_t)E * sizeof *K);
        int64_t *lo = malloc((size_t)E * sizeof *lo), N = 0;
        for (int e = 0; e < E; e++) {
            nat[(size_t)e * P + e / per] = 1;
            lo[e] = load[e] / 4;
            N += load[e];
        }
        const uint8_t *pls[2] = {nat, p.placement};
        double *tg[2] = {tg0, tg1}, *tf[2] = {tf0, tf1};
        for (int k = 0; k < 2; k++) {
            double t0 = lrmoe_now();
            int64_t g = lrmoe_alloc_glpk(pls[k], load, E, P, 10.0, x);
            double t1 = lrmoe_now();
            int64_t fl = lrmoe_alloc_flow(pls[k], load, E, P, x);
            double t2 = lrmoe_now();
            int64_t lb = lrmoe_minpeak_lb(pls[k], load, E, P);
            tg[k][n] = t1 - t0;
            tf[k][n] = t2 - t1;
            if (g != lb || fl != lb) {
                printf("FAIL frame %d: glpk %lld flow %lld T* %lld\n", n, (long long)g,
                       (long long)fl, (long long)lb);
                bad = 1;
            }
        }
        int64_t total = (int64_t)(0.8 * (double)N);
        double t0 = lrmoe_now();
        int64_t q = lrmoe_alloc_glpk_quota(p.placement, lo, load, total, p.fwd_alloc, E, P, 10.0,
                                           K, x);
        double t1 = lrmoe_now();
        int64_t qb = lrmoe_minpeak_quota_lb(p.placement, lo, load, total, E, P);
        double t2 = lrmoe_now();
        tq[n] = t1 - t0;
        tb[n] = t2 - t1;
        if (q != qb) {
            printf("FAIL frame %d: quota glpk %lld bound %lld\n", n, (long long)q, (long long)qb);
            bad = 1;
        }
        n++;
        free(nat);
        free(x);
        free(K);
        free(lo);
        free(load);
        lrmoe_plan_free(&p);
    }
    lrmoe_frame_clear(&f);
    lrmoe_reader_close(r);
    if (n == 0)
        return 1;
    printf("%-34s %10s %10s\n", "allocation (E,P from the stream)", "median ms", "p99 ms");
    report("fwd, native placement: GLPK", tg0, n);
    report("fwd, native placement: T*+flow", tf0, n);
    report("fwd, lrmoe placement: GLPK", tg1, n);
    report("fwd, lrmoe placement: T*+flow", tf1, n);
    report("bwd quotas rho 0.8: GLPK", tq, n);
    report("bwd quotas rho 0.8: closed form T*", tb, n);
    printf("frames %d, all peaks equal T*: %s\n", n, bad ? "NO" : "yes");
    return bad;
}

/* A load vector of N pairs over E experts: 0 uniform, 1 hot (one expert
 * takes share%), 2 Zipf 1.2 (shuffled). */
static void skewed_load(int kind, int E, int64_t N, int share, int64_t *n)
{
    double *w = malloc((size_t)E * sizeof *w), s = 0;
    for (int e = 0; e < E; e++) {
        w[e] = kind == 2 ? 1.0 / __builtin_pow(e + 1, 1.2) : 1.0;
        s += w[e];
    }
    if (kind == 1) {
        for (int e = 0; e < E; e++)
            w[e] = (1.0 - share / 100.0) / (E - 1);
        w[rint_(0, E - 1)] = share / 100.0;
        s = 1.0;
    }
    for (int e = E - 1; kind == 2 && e > 0; e--) { /* shuffle */
        int j = rint_(0, e);
        double t = w[e];
        w[e] = w[j];
        w[j] = t;
    }
    int64_t left = N;
    for (int e = 0; e < E; e++) {
        /* expected share with +-10% noise */
        double v = (double)N * w[e] / s * (0.9 + 0.2 * (double)(rnd() % 1000) / 1000.0);
        n[e] = (int64_t)v;
        if (n[e] > left)
            n[e] = left;
        left -= n[e];
    }
    n[rint_(0, E - 1)] += left;
}

static double t_bwd(const lrmoe_plan_t *p)
{
    return p->cost.t_bwd_dispatch + p->cost.t_bwd_compute + p->cost.t_bwd_combine;
}

/* lrmoe at the pinned rates 1, 0.9, ..., 0.5 of trace n: every plan
 * no slower (t_total, modelled backward) than the rate-1 plan when that
 * fits, and both non-increasing as the rate falls. Returns the failures;
 * *pinned counts the plans made below rate 1, *faster those with a t_total
 * below the rate-1 plan's. */
static int pinned_rates(const lrmoe_plan_opts_t *o0, const int64_t *n, int E, int *pinned,
                        int *faster)
{
    static const double rates[] = {1.0, 0.9, 0.8, 0.7, 0.6, 0.5};
    const int nr = (int)(sizeof rates / sizeof *rates);
    lrmoe_plan_opts_t o = *o0;
    o.planner = LRMOE_PLANNER_LRMOE;
    o.nrates = 1;
    o.explain = 0;
    int fails = 0, have1 = 0, prev = -1;
    double t1 = 0, b1 = 0, tp = 0, bp = 0;
    for (int i = 0; i < nr; i++) {
        lrmoe_plan_t L;
        lrmoe_plan_init(&L);
        o.rates[0] = rates[i];
        if (lrmoe_plan_compute(&o, n, E, &L) == 0) {
            const double t = L.t_total, b = t_bwd(&L);
            if (i == 0) {
                have1 = 1;
                t1 = t;
                b1 = b;
            } else {
                ++*pinned;
                *faster += have1 && t < t1 * (1 - 1e-9);
            }
            if (have1 && (t > t1 * (1 + 1e-9) || b > b1 * (1 + 1e-9))) {
                printf("FAIL P=%d E=%d hbm %.3g rate %.2f: t_total %.6g ms backward %.6g ms "
                       "(%s), rate 1: %.6g ms %.6g ms\n", o.P, E, o.cost.hbm, rates[i], t * 1e3,
                       b * 1e3, L.source, t1 * 1e3, b1 * 1e3);
                fails++;
            }
            if (prev >= 0 && (t > tp * (1 + 1e-9) || b > bp * (1 + 1e-9))) {
                printf("FAIL P=%d E=%d hbm %.3g: rate %.2f t_total %.6g ms backward %.6g ms "
                       "(%s), rate %.2f: %.6g ms %.6g ms\n", o.P, E, o.cost.hbm, rates[i],
                       t * 1e3, b * 1e3, L.source, rates[prev], tp * 1e3, bp * 1e3);
                fails++;
            }
            prev = i;
            tp = t;
            bp = b;
        }
        lrmoe_plan_free(&L);
    }
    return fails;
}

static int never_loses(int count, int argc, char **argv)
{
    int fails = 0, total = 0, reduced = 0, cls[3] = {0, 0, 0}, pinned = 0, faster = 0;
    static const int Es[] = {64, 128, 256, 384};
    for (int a = 0; a < argc; a++) {
        const int P = atoi(argv[a]);
        for (int it = 0; it < count; it++) {
            int E;
            do
                E = Es[rint_(0, 3)];
            while (E % P || E < P);
            lrmoe_plan_opts_t o;
            lrmoe_plan_opts_default(&o);
            o.P = P;
            int nodes;
            do
                nodes = 1 << rint_(0, 4);
            while (P % nodes);
            o.nodes = nodes;
            o.cost.D = rint_(0, 1) ? 2048 : 7168;
            o.cost.F = rint_(0, 1) ? 768 : 2048;
            o.cost.tokens = 8192;
            const int64_t N = o.cost.tokens * o.cost.K * P;
            int64_t *n = malloc((size_t)E * sizeof *n);
            const int kind = rint_(0, 2), share = (int[]){30, 80, 95}[rint_(0, 2)];
            skewed_load(kind, E, N, share, n);
            /* budget: unlimited, or a fraction of a balanced rank's need */
            const int64_t r = N / P;
            const double need = lrmoe_cost_rank_mem(&o.cost, 0, r, r);
            const int bsel = rint_(0, 3);
            o.cost.hbm = bsel == 0 ? 0 : need * (bsel == 1 ? 1.6 : bsel == 2 ? 1.05 : 0.92);
            o.best_effort = 0;
            lrmoe_plan_t b[3], L;
            double bt = 1e300;
            int64_t bpk = 0;
            int bfits = 0;
            for (int i = 0; i < 3; i++) {
                lrmoe_plan_init(&b[i]);
                o.planner = (lrmoe_planner_t)i;
                if (lrmoe_plan_compute(&o, n, E, &b[i]) < 0) {
                    printf("FAIL P=%d E=%d baseline %d: %s\n", P, E, i, lrmoe_errmsg());
                    fails++;
                    continue;
                }
                const int f = b[i].feasible;
                if ((f && !bfits) || (f == bfits && (b[i].t_total < bt ||
                                      (b[i].t_total == bt && b[i].fwd_peak < bpk)))) {
                    bt = b[i].t_total;
                    bpk = b[i].fwd_peak;
                    bfits = f;
                }
            }
            o.planner = LRMOE_PLANNER_LRMOE;
            lrmoe_plan_init(&L);
            total++;
            if (lrmoe_plan_compute(&o, n, E, &L) < 0) {
                if (bfits) {
                    printf("FAIL P=%d E=%d nodes %d kind %d hbm %.3g: lrmoe refused where a "
                           "baseline fits: %s\n", P, E, nodes, kind, o.cost.hbm, lrmoe_errmsg());
                    fails++;
                }
            } else {
                if (bfits && (L.t_total > bt * (1 + 1e-9) || L.fwd_peak > bpk)) {
                    printf("FAIL P=%d E=%d nodes %d kind %d/%d hbm %.3g: lrmoe t_total %.6g ms "
                           "fwd_peak %lld (%s), best baseline %.6g ms %lld\n", P, E, nodes,
                           kind, share, o.cost.hbm, L.t_total * 1e3, (long long)L.fwd_peak,
                           L.source, bt * 1e3, (long long)bpk);
                    fails++;
                }
                if (L.rho < 1) {
                    reduced++;
                    lrmoe_plan_t K;
                    lrmoe_plan_init(&K);
                    lrmoe_plan_alloc(&K, E, P);
                    memcpy(K.placement, L.placement, (size_t)E * P);
                    memcpy(K.fwd_alloc, L.fwd_alloc, (size_t)E * P * sizeof(int64_t));
                    memcpy(K.bwd_alloc, L.fwd_alloc, (size_t)E * P * sizeof(int64_t));
                    memcpy(K.quota, n, (size_t)E * sizeof(int64_t));
                    memcpy(K.held, L.held, (size_t)P * sizeof(int64_t));
                    memcpy(K.wsend, L.wsend, (size_t)P * sizeof(double));
                    memcpy(K.wrecv, L.wrecv, (size_t)P * sizeof(double));
                    K.have_slots = L.have_slots;
                    lrmoe_cost_summary_t s1, s2;
                    lrmoe_plan_eval_cost(&o.cost, &K, n, NULL, &s1);
                    lrmoe_plan_eval_cost(&o.cost, &L, n, NULL, &s2);
                    const double t1 = s1.t_bwd_dispatch + s1.t_bwd_compute + s1.t_bwd_combine;
                    const double t2 = s2.t_bwd_dispatch + s2.t_bwd_compute + s2.t_bwd_combine;
                    if (t2 > t1 * (1 + 1e-9)) {
                        printf("FAIL P=%d E=%d: rho %.3f backward %.6g ms > %.6g ms keeping "
                               "every pair (%s)\n", P, E, L.rho, t2 * 1e3, t1 * 1e3, L.source);
                        fails++;
                    }
                    lrmoe_plan_free(&K);
                }
                cls[L.fwd_peak < bpk ? 2 : L.t_total < bt * (1 - 1e-9) ? 1 : 0]++;
            }
            for (int i = 0; i < 3; i++)
                lrmoe_plan_free(&b[i]);
            lrmoe_plan_free(&L);
            fails += pinned_rates(&o, n, E, &pinned, &faster);
            free(n);
        }
    }
    lrmoe_plan_thread_cleanup();
    printf("%d traces, %d failures (%d at rho < 1; lower peak %d, shorter t_total %d; "
           "%d pinned below rate 1, %d faster than rate 1)\n", total, fails, reduced, cls[2],
           cls[1], pinned, faster);
    return fails != 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    if (!strcmp(argv[1], "bench") && argc == 3)
        return bench(argv[2]);
    if (!strcmp(argv[1], "check-stream") && argc == 3)
        return check_stream(argv[2]);
    if (!strcmp(argv[1], "eplb-readme"))
        return eplb_readme();
    if (!strcmp(argv[1], "random") && argc == 4) {
        rs ^= (uint64_t)atoll(argv[3]) * 0x9E3779B97F4A7C15ull;
        return random_check(atoi(argv[2]), 0, 0, 0);
    }
    if (!strcmp(argv[1], "random-large") && argc == 4) {
        rs ^= (uint64_t)atoll(argv[3]) * 0x9E3779B97F4A7C15ull;
        return random_check(atoi(argv[2]), 0, 0, 1);
    }
    if (!strcmp(argv[1], "fastpath") && argc == 4) {
        rs ^= (uint64_t)atoll(argv[3]) * 0x9E3779B97F4A7C15ull;
        return fastpath_check(atoi(argv[2]));
    }
    if (!strcmp(argv[1], "dump") && argc == 4) {
        rs ^= (uint64_t)atoll(argv[3]) * 0x9E3779B97F4A7C15ull;
        return random_check(atoi(argv[2]), 1, 1, 0);
    }
    if (!strcmp(argv[1], "never-loses") && argc >= 5) {
        rs ^= (uint64_t)atoll(argv[3]) * 0x9E3779B97F4A7C15ull;
        return never_loses(atoi(argv[2]), argc - 4, argv + 4);
    }
    if (!strcmp(argv[1], "llep") && argc >= 6)
        return llep(argc - 2, argv + 2);
    if (!strcmp(argv[1], "plan") && argc >= 4)
        return plan(argc - 2, argv + 2);
    return 2;
}
