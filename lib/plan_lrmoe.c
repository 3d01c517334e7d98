/* LRMoE planner (Algorithm 1): for each candidate retention rate, in
 * decreasing order, choose replicas, quotas and the min-peak integer
 * allocation of forward and retained pairs (GLPK), evaluate the memory and
 * communication model, and keep the first candidate that fits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "plan_internal.h"

/* ---------------------------------------------------------------- planner */

/* Greedy replica placement works on eligibility masks and the closed-form
 * bounds directly (P <= LRMOE_PLAN_MAX_P). */
typedef struct {
    const int64_t *n, *lo, *K; /* loads, quota floors, fixed quotas (NULL: K = n) */
    int64_t total, N;
    int E, P, bwd_free;        /* quotas free (minpeak policy, total < N) */
    uint32_t *mask;            /* (E) eligible ranks */
    int64_t *a, *b;            /* (2^P) subset sums */
} gctx_t;

typedef struct {
    int64_t f, b;      /* forward and backward optimum peaks */
    double ex;         /* excess over the reference levels (plateau progress) */
    uint32_t sf, sb;   /* a bottleneck subset of each */
} jv_t;

static void zsum(const uint32_t *mask, const int64_t *w, int E, int P, int64_t *sub)
{
    const size_t S = (size_t)1 << P;
    memset(sub, 0, S * sizeof *sub);
    for (int e = 0; e < E; e++)
        sub[mask[e]] += w[e];
    for (int bit = 0; bit < P; bit++)
        for (size_t m = 0; m < S; m++)
            if (m & ((size_t)1 << bit))
                sub[m] += sub[m ^ ((size_t)1 << bit)];
}

static int64_t cdiv(int64_t x, int64_t k) { return x >= 0 ? (x + k - 1) / k : -((-x) / k); }

/* Refresh the subset sums of the current masks: a from the loads, b from
 * the backward quotas (fixed K) or their floors (free quotas). */
static void jsums(gctx_t *c)
{
    zsum(c->mask, c->n, c->E, c->P, c->a);
    if (c->bwd_free)
        zsum(c->mask, c->lo, c->E, c->P, c->b);
    else if (c->K)
        zsum(c->mask, c->K, c->E, c->P, c->b);
}

/* Objective: forward peak + 2 x backward peak (a backward pair costs two
 * forward GEMM passes); the excess sum_S max(0, N(S) - (T_ref-1)|S|) over
 * the rank subsets measures progress towards lowering a peak. Evaluated for
 * the current masks with, when e >= 0, rank q added to expert e: that only
 * removes e's pairs from the subsets that contain e's ranks but not q. */
static void jeval(const gctx_t *c, int e, int q, int64_t fref, int64_t bref, jv_t *o)
{
    const size_t S = (size_t)1 << c->P;
    const uint32_t me = e >= 0 ? c->mask[e] : 0, qb = e >= 0 ? 1u << q : 0;
    const int64_t dn = e >= 0 ? c->n[e] : 0;
    const int64_t db = e < 0 ? 0 : c->bwd_free ? c->lo[e] : c->K ? c->K[e] : 0;
    const int same = !c->bwd_free && !c->K; /* backward = forward */
    int64_t f = 0, bb = 0;
    double exf = 0, exb = 0;
    uint32_t sf = 1, sb = 1;
    for (size_t m = 1; m < S; m++) {
        const int hit = e >= 0 && ((uint32_t)m & me) == me && !((uint32_t)m & qb);
        const int64_t k = __builtin_popcount((unsigned)m);
        const int64_t a = c->a[m] - (hit ? dn : 0);
        int64_t v = cdiv(a, k);
        if (v > f) {
            f = v;
            sf = (uint32_t)m;
        }
        double x = (double)a - (double)(fref - 1) * k;
        if (x > 0)
            exf += x;
        if (same)
            continue;
        const int64_t b = c->b[m] - (hit ? db : 0);
        v = cdiv(b, k);
        double y = (double)b - (double)(bref - 1) * k;
        if (y > 0)
            exb += y;
        if (c->bwd_free) {
            int64_t qv = c->total - c->N + a, w = cdiv(qv, k);
            if (w > v)
                v = w;
            x = (double)qv - (double)(bref - 1) * k;
            if (x > 0)
                exb += x;
        }
        if (v > bb) {
            bb = v;
            sb = (uint32_t)m;
        }
    }
    if (same) {
        bb = f;
        exb = exf;
        sb = sf;
    }
    o->f = f;
    o->b = bb;
    o->ex = exf + 2 * exb;
    o->sf = sf;
    o->sb = sb;
}

/* Above GREEDY_MAX_P ranks the exact greedy (2^P subsets per evaluation) is
 * too slow: with even-split load estimates per rank, replicate the heaviest
 * expert (per instance) of the most loaded rank onto the least loaded rank
 * with a free slot, while the sum of squared estimates drops. */
#define GREEDY_MAX_P 10
static int place_replicas_estimate(const gctx_t *c, int extra, uint8_t *pl)
{
    const int E = c->E, P = c->P, per = E / P;
    int *inst = calloc((size_t)E, sizeof(int)), *reps = calloc((size_t)P, sizeof(int));
    double *est = calloc((size_t)P, sizeof(double));
    int added = -1;
    if (!inst || !reps || !est) {
        lrmoe_err("replica placement: out of memory");
        goto out;
    }
    for (int e = 0; e < E; e++) {
        inst[e] = 1;
        est[e / per] += (double)c->n[e];
    }
    added = 0;
    while (added < extra * P) {
        /* the heaviest expert (per instance) on the rank with the largest
         * estimate that still has somewhere to go */
        int pm = 0;
        for (int p = 1; p < P; p++)
            if (est[p] > est[pm])
                pm = p;
        int be = -1, q = -1;
        for (int e = 0; e < E; e++) {
            if (c->n[e] <= 0 || inst[e] >= P || !pl[(size_t)e * P + pm])
                continue;
            if (be >= 0 && (double)c->n[e] / inst[e] <= (double)c->n[be] / inst[be])
                continue;
            int t = -1;
            for (int p = 0; p < P; p++)
                if (reps[p] < extra && !pl[(size_t)e * P + p] && (t < 0 || est[p] < est[t]))
                    t = p;
            if (t >= 0) {
                be = e;
                q = t;
            }
        }
        if (be < 0)
            break;
        /* accept while the sum of squared estimates drops */
        double so = (double)c->n[be] / inst[be], sn = (double)c->n[be] / (inst[be] + 1);
        double d = (est[q] + sn) * (est[q] + sn) - est[q] * est[q];
        for (int p = 0; p < P; p++)
            if (pl[(size_t)be * P + p])
                d += (est[p] + sn - so) * (est[p] + sn - so) - est[p] * est[p];
        if (!(d < 0))
            break;
        for (int p = 0; p < P; p++)
            if (pl[(size_t)be * P + p])
                est[p] += sn - so;
        est[q] += sn;
        pl[(size_t)be * P + q] = 1;
        inst[be]++;
        reps[q]++;
        added++;
    }
out:
    free(inst);
    free(reps);
    free(est);
    return added;
}

/* Greedy replica placement: at each step try every (expert, rank) pair with
 * the expert among the C heaviest (load per instance) whose instances all
 * lie in a bottleneck subset, and the rank outside it with a free slot; take
 * the pair with the lowest (objective, excess). Stop when neither drops; keep
 * the shortest prefix that reached the best objective. pl holds the natives
 * on entry. Returns the replicas added, or -1. */
static int place_replicas(gctx_t *c, int extra, uint8_t *pl)
{
    const int E = c->E, P = c->P, C = 6;
    const int maxadd = extra * P;
    if (maxadd <= 0 || P == 1)
        return 0;
    if (P > GREEDY_MAX_P)
        return place_replicas_estimate(c, extra, pl);
    int *inst = malloc((size_t)E * sizeof(int)), *reps = calloc((size_t)P, sizeof(int));
    int *he = malloc((size_t)maxadd * sizeof(int)), *hp = malloc((size_t)maxadd * sizeof(int));
    c->mask = malloc((size_t)E * sizeof(uint32_t));
    c->a = malloc(((size_t)1 << P) * sizeof(int64_t));
    c->b = malloc(((size_t)1 << P) * sizeof(int64_t));
    int rc = -1;
    if (!inst || !reps || !he || !hp || !c->mask || !c->a || !c->b) {
        lrmoe_err("replica placement: out of memory");
        goto out;
    }
    for (int e = 0; e < E; e++) {
        inst[e] = 0;
        c->mask[e] = 0;
        for (int p = 0; p < P; p++)
            if (pl[(size_t)e * P + p]) {
                c->mask[e] |= 1u << p;
                inst[e]++;
            }
    }
    jv_t cur;
    jsums(c);
    jeval(c, -1, 0, 0, 0, &cur);
    jeval(c, -1, 0, cur.f, cur.b, &cur);
    int64_t bestJ = cur.f + 2 * cur.b;
    int added = 0, best_count = 0;
    int cand[8];
    while (added < maxadd) {
        int nc = 0;
        for (int k = 0; k < C; k++) {
            int bst = -1;
            for (int e = 0; e < E; e++) {
                if (c->n[e] <= 0 || inst[e] >= P)
                    continue;
                if ((c->mask[e] & ~cur.sf) && (c->mask[e] & ~cur.sb))
                    continue; /* outside both bottlenecks */
                int taken = 0;
                for (int j = 0; j < nc; j++)
                    taken |= cand[j] == e;
                if (taken)
                    continue;
                if (bst < 0 || (double)c->n[e] / inst[e] > (double)c->n[bst] / inst[bst])
                    bst = e;
            }
            if (bst < 0)
                break;
            cand[nc++] = bst;
        }
        int be = -1, bp = -1;
        jv_t bv = {0, 0, 0, 0, 0};
        for (int k = 0; k < nc; k++) {
            int e = cand[k];
            for (int q = 0; q < P; q++) {
                if (reps[q] >= extra || (c->mask[e] >> q & 1u))
                    continue;
                jv_t v;
                jeval(c, e, q, cur.f, cur.b, &v);
                int64_t j = v.f + 2 * v.b, jb = bv.f + 2 * bv.b;
                if (be < 0 || j < jb || (j == jb && v.ex < bv.ex)) {
                    bv = v;
                    be = e;
                    bp = q;
                }
            }
        }
        if (be < 0)
            break;
        int64_t j = bv.f + 2 * bv.b, jc = cur.f + 2 * cur.b;
        if (!(j < jc || (j == jc && bv.ex < cur.ex)))
            break; /* no progress */
        c->mask[be] |= 1u << bp;
        pl[(size_t)be * P + bp] = 1;
        inst[be]++;
        reps[bp]++;
        he[added] = be;
        hp[added] = bp;
        added++;
        jsums(c);
        jeval(c, -1, 0, bv.f, bv.b, &cur); /* excess against the new levels */
        if (j < bestJ) {
            bestJ = j;
            best_count = added;
        }
    }
    for (int i = added - 1; i >= best_count; i--)
        pl[(size_t)he[i] * P + hp[i]] = 0;
    rc = best_count;
out:
    free(inst);
    free(reps);
    free(he);
    free(hp);
    free(c->mask);
    free(c->a);
    free(c->b);
    c->mask = NULL;
    c->a = c->b = NULL;
    return rc;
}

/* Proportional quotas: clamp(floor(rho*n_e), lo_e, n_e), then +-1 by
 * largest (smallest) remainder until they sum to total. */
static void quota_proportional(const int64_t *n, const int64_t *lo, int E, double rho,
                               int64_t total, int64_t *K)
{
    int64_t s = 0;
    for (int e = 0; e < E; e++) {
        int64_t k = (int64_t)floor(rho * (double)n[e]);
        if (k < lo[e])
            k = lo[e];
        if (k > n[e])
            k = n[e];
        K[e] = k;
        s += k;
    }
    while (s != total) {
        int best = -1;
        double br = 0;
        for (int e = 0; e < E; e++) {
            double r = rho * (double)n[e] - (double)K[e];
            if (s < total && K[e] < n[e] && (best < 0 || r > br)) {
                best = e;
                br = r;
            }
            if (s > total && K[e] > lo[e] && (best < 0 || r < br)) {
                best = e;
                br = r;
            }
        }
        if (best < 0)
            break; /* cannot happen when sum lo <= total <= N */
        K[best] += s < total ? 1 : -1;
        s += s < total ? 1 : -1;
    }
}

int plan_lrmoe(const lrmoe_plan_opts_t *o, const int64_t *load, int E, lrmoe_plan_t *p)
{
    const int P = o->P, per = E / P;
    const int slots = o->slots ? o->slots : per + 2;
    const int extra = slots - per;
    const size_t EP = (size_t)E * P;
    int64_t N = 0;
    for (int e = 0; e < E; e++)
        N += load[e];
    int64_t *lo = malloc((size_t)E * sizeof *lo), *K = malloc((size_t)E * sizeof *K);
    uint8_t *pl = malloc(EP);
    int rc = -1;
    char why[256] = "";
    if (!lo || !K || !pl) {
        lrmoe_err("lrmoe: out of memory");
        goto out;
    }
    double glpk = 0;
    for (int ri = 0; ri < o->nrates; ri++) {
        const double rho = o->rates[ri];
        const int last = ri == o->nrates - 1;
        int64_t total = rho >= 1.0 ? N : (int64_t)floor(rho * (double)N + 1e-9);
        int64_t slo = 0;
        for (int e = 0; e < E; e++) {
            int64_t l = (int64_t)ceil(o->min_keep * (double)load[e] - 1e-9);
            lo[e] = l > load[e] ? load[e] : (l < 0 ? 0 : l);
            slo += lo[e];
        }
        if (slo > total) {
            snprintf(why, sizeof why,
                     "min-keep: rate %.3f allows %lld retained pairs, min-keep %.3f needs %lld",
                     rho, (long long)total, o->min_keep, (long long)slo);
            if (last && !o->best_effort) {
                lrmoe_err("infeasible at every rate: %s", why);
                goto out;
            }
            if (!last)
                continue;
            total = slo; /* best effort: keep the floors */
        }
        const int free_q = total < N && o->quota == LRMOE_QUOTA_MINPEAK;
        if (total < N && !free_q)
            quota_proportional(load, lo, E, rho, total, K);
        gctx_t jc = {load, lo, total < N && !free_q ? K : NULL, total, N, E, P, free_q,
                     NULL, NULL, NULL};
        memset(pl, 0, EP);
        for (int e = 0; e < E; e++)
            pl[(size_t)e * P + e / per] = 1;
        if (place_replicas(&jc, extra, pl) < 0)
            goto out;
        /* allocations */
        memcpy(p->placement, pl, EP);
        double t0 = lrmoe_now();
        int64_t fpk = lrmoe_alloc_glpk(pl, load, E, P, o->glpk_tm_lim, p->fwd_alloc);
        if (fpk < 0) {
            lrmoe_err_prefix("forward allocation at rate %.3f", rho);
            goto out;
        }
        int64_t bpk;
        if (total == N) {
            memcpy(p->quota, load, (size_t)E * sizeof *load);
            memcpy(p->bwd_alloc, p->fwd_alloc, EP * sizeof(int64_t));
            bpk = fpk;
        } else if (free_q) {
            bpk = lrmoe_alloc_glpk_quota(pl, lo, load, total, p->fwd_alloc, E, P,
                                         o->glpk_tm_lim, p->quota, p->bwd_alloc);
        } else {
            memcpy(p->quota, K, (size_t)E * sizeof *K);
            bpk = lrmoe_alloc_glpk(pl, K, E, P, o->glpk_tm_lim, p->bwd_alloc);
        }
        glpk += lrmoe_now() - t0;
        if (bpk < 0) {
            lrmoe_err_prefix("backward allocation at rate %.3f", rho);
            goto out;
        }
        /* exactness guard: GLPK's peaks must equal the optimum T*. GLPK's
         * allocations are feasible (lrmoe_plan_check verifies the rows and
         * eligibility, the quotas are checked below), so their peaks bound
         * T* from above: the search stops at T* or as soon as it reaches
         * them, and a GLPK peak above T* still shows as a mismatch */
        if (free_q) {
            int64_t ks = 0;
            for (int e = 0; e < E; e++) {
                if (p->quota[e] < lo[e] || p->quota[e] > load[e]) {
                    lrmoe_err("GLPK quota %lld of expert %d outside [%lld,%lld]",
                              (long long)p->quota[e], e, (long long)lo[e], (long long)load[e]);
                    goto out;
                }
                ks += p->quota[e];
            }
            if (ks != total) {
                lrmoe_err("GLPK quotas sum to %lld, want %lld", (long long)ks, (long long)total);
                goto out;
            }
        }
        p->fwd_lb = plan_minpeak(pl, NULL, load, 0, E, P, fpk, NULL, NULL);
        p->bwd_lb = total == N ? p->fwd_lb
                    : free_q   ? plan_minpeak(pl, lo, load, total, E, P, bpk, NULL, NULL)
                               : plan_minpeak(pl, NULL, K, 0, E, P, bpk, NULL, NULL);
        if (p->fwd_lb < 0 || p->bwd_lb < 0)
            goto out;
        if (fpk != p->fwd_lb || bpk != p->bwd_lb) {
            lrmoe_err("GLPK peaks %lld/%lld differ from the optimum %lld/%lld at rate %.3f",
                      (long long)fpk, (long long)bpk, (long long)p->fwd_lb,
                      (long long)p->bwd_lb, rho);
            goto out;
        }
        plan_summarise(p, load);
        if (plan_cost(o, p, load, NULL) < 0)
            goto out;
        char w2[200];
        int fits = plan_fits(o, p, w2, sizeof w2);
        if (fits) {
            p->feasible = 1;
            p->rate_index = ri;
            snprintf(p->binding, sizeof p->binding, "%s", why); /* what the better rate hit */
            rc = 0;
            break;
        }
        snprintf(why, sizeof why, "rate %.3f: %s", rho, w2);
        if (last) {
            if (o->best_effort) {
                p->feasible = 0;
                p->rate_index = ri;
                snprintf(p->binding, sizeof p->binding, "%s", why);
                rc = 0;
            } else {
                lrmoe_err("infeasible at every rate (%d tried): %s", o->nrates, why);
            }
            break;
        }
    }
    p->glpk_seconds = glpk;
out:
    free(lo);
    free(K);
    free(pl);
    return rc;
}
