/* LRMoE planner (Algorithm 1): for each candidate retention rate, in
 * decreasing order, choose replicas, quotas and the min-peak integer
 * allocation of forward and retained pairs (exact T* and max-flow, lib/
 * minpeak.c), evaluate the memory and communication model, and keep the
 * first rate with a candidate that fits. The forward candidates (placements
 * and their forward allocations) do not depend on the rate: built once per
 * frame. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "plan_internal.h"
#include "minpeak_internal.h"
#include "clock.h"

/* ---------------------------------------------------------------- planner */

/* Greedy replica placement works on eligibility masks and the closed-form
 * bounds directly (P <= LRMOE_PLAN_MAX_P). */
typedef struct {
    const int64_t *load;       /* (E) pairs routed to each expert */
    const int64_t *floor;      /* (E) quota floors (free quotas) */
    const int64_t *K;          /* (E) fixed quotas (NULL: K = load) */
    int64_t total, N;          /* retained pairs, all pairs */
    int E, P, bwd_free;        /* quotas free (minpeak policy, total < N) */
    uint32_t *mask;            /* (E) each expert's ranks, as bits */
    int64_t *load_sums;        /* (2^P) loads of the experts within each rank set */
    int64_t *bwd_sums;         /* (2^P) the same of K (or of the floors) */
} greedy_ctx_t;

typedef struct {
    int64_t fwd, bwd;          /* forward and backward optimum peaks */
    double excess;             /* excess over the reference levels (plateau progress) */
    uint32_t fwd_set, bwd_set; /* a bottleneck rank subset of each */
} greedy_value_t;

static void subset_sums(const uint32_t *mask, const int64_t *w, int E, int P, int64_t *sub)
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

static int64_t ceil_div(int64_t x, int64_t k) { return x >= 0 ? (x + k - 1) / k : -((-x) / k); }

/* Refresh the subset sums of the current masks: a from the loads, b from
 * the backward quotas (fixed K) or their floors (free quotas). */
static void greedy_sums(greedy_ctx_t *c)
{
    subset_sums(c->mask, c->load, c->E, c->P, c->load_sums);
    if (c->bwd_free)
        subset_sums(c->mask, c->floor, c->E, c->P, c->bwd_sums);
    else if (c->K)
        subset_sums(c->mask, c->K, c->E, c->P, c->bwd_sums);
}

/* Objective: forward peak + 2 x backward peak (a backward pair costs two
 * forward GEMM passes); the excess sum_S max(0, N(S) - (T_ref-1)|S|) over
 * the rank subsets measures progress towards lowering a peak. Evaluated for
 * the current masks with, when e >= 0, rank q added to expert e: that only
 * removes e's pairs from the subsets that contain e's ranks but not q. */
static void greedy_eval(const greedy_ctx_t *c, int e, int q, int64_t fref, int64_t bref,
                        greedy_value_t *o)
{
    const size_t S = (size_t)1 << c->P;
    const uint32_t emask = e >= 0 ? c->mask[e] : 0, qbit = e >= 0 ? 1u << q : 0;
    const int64_t dload = e >= 0 ? c->load[e] : 0;
    const int64_t dbwd = e < 0 ? 0 : c->bwd_free ? c->floor[e] : c->K ? c->K[e] : 0;
    const int same = !c->bwd_free && !c->K; /* backward = forward */
    int64_t f = 0, bb = 0;
    double exf = 0, exb = 0;
    uint32_t sf = 1, sb = 1;
    for (size_t m = 1; m < S; m++) {
        const int hit = e >= 0 && ((uint32_t)m & emask) == emask && !((uint32_t)m & qbit);
        const int64_t k = __builtin_popcount((unsigned)m);
        const int64_t a = c->load_sums[m] - (hit ? dload : 0);
        int64_t v = ceil_div(a, k);
        if (v > f) {
            f = v;
            sf = (uint32_t)m;
        }
        double x = (double)a - (double)(fref - 1) * k;
        if (x > 0)
            exf += x;
        if (same)
            continue;
        const int64_t b = c->bwd_sums[m] - (hit ? dbwd : 0);
        v = ceil_div(b, k);
        double y = (double)b - (double)(bref - 1) * k;
        if (y > 0)
            exb += y;
        if (c->bwd_free) {
            int64_t qv = c->total - c->N + a, w = ceil_div(qv, k);
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
    o->fwd = f;
    o->bwd = bb;
    o->excess = exf + 2 * exb;
    o->fwd_set = sf;
    o->bwd_set = sb;
}

/* Above GREEDY_MAX_P ranks the exact greedy (2^P subsets per evaluation)
 * is too slow; the search is a spill at a capacity T found by bisection.
 * spill_at: experts by load, largest first; the native rank keeps what fits
 * under T counting the loads of its experts not yet visited (LLEP's
 * effective load), the excess goes in chunks to the ranks with the most
 * room under T that have a free slot and no instance of the expert, each
 * chunk a replica. Returns 1 when every pair fits (pl: natives plus the
 * replicas, add_expert/add_rank their order, *nadded their count), 0 when the slots or the
 * room run out. The allocation it builds keeps every rank <= T, so the
 * placement's optimum T* (max-flow, computed by the caller) is <= T. */
#define GREEDY_MAX_P 10
static int spill_at(const int64_t *n, const int *ord, int E, int P, int extra, int64_t T,
                    int64_t *as, int64_t *pend, int *used, uint8_t *pl, int *add_expert,
                    int *add_rank, int *nadded)
{
    const int per = E / P;
    memset(as, 0, (size_t)P * sizeof *as);
    memset(pend, 0, (size_t)P * sizeof *pend);
    memset(used, 0, (size_t)P * sizeof *used);
    memset(pl, 0, (size_t)E * P);
    for (int e = 0; e < E; e++) {
        pend[e / per] += n[e];
        pl[(size_t)e * P + e / per] = 1;
    }
    int k = 0;
    for (int i = 0; i < E; i++) {
        const int e = ord[i], r = e / per;
        pend[r] -= n[e];
        int64_t keep = T - as[r] - pend[r];
        keep = keep < 0 ? 0 : keep > n[e] ? n[e] : keep;
        as[r] += keep;
        int64_t rem = n[e] - keep;
        while (rem > 0) {
            int q = -1;
            int64_t room = 0;
            for (int p = 0; p < P; p++) {
                const int64_t w = T - as[p] - pend[p];
                if (used[p] < extra && !pl[(size_t)e * P + p] && w > room) {
                    room = w;
                    q = p;
                }
            }
            if (q < 0)
                return 0;
            const int64_t d = rem < room ? rem : room;
            as[q] += d;
            used[q]++;
            pl[(size_t)e * P + q] = 1;
            add_expert[k] = e;
            add_rank[k] = q;
            k++;
            rem -= d;
        }
    }
    *nadded = k;
    return 1;
}

typedef struct {
    int64_t n;
    int e;
} eload_t;

static int by_load_desc(const void *a, const void *b)
{
    const eload_t *x = a, *y = b;
    return x->n != y->n ? (x->n < y->n ? 1 : -1) : (x->e > y->e) - (x->e < y->e);
}

/* The least T in [ceil(N/P), the natives' peak] at which spill_at fits
 * (bisection), and its placement. Returns the replicas added, or -1. */
static int place_replicas_search(const int64_t *n, int E, int P, int extra, uint8_t *pl,
                                 int *add_expert, int *add_rank)
{
    const int per = E / P;
    int *ord = malloc((size_t)E * sizeof *ord), *used = malloc((size_t)P * sizeof *used);
    int64_t *as = malloc((size_t)P * sizeof *as), *pend = malloc((size_t)P * sizeof *pend);
    int rc = -1;
    if (!ord || !used || !as || !pend) {
        lrmoe_err("replica search: out of memory");
        goto out;
    }
    int64_t N = 0, hi = 0;
    memset(as, 0, (size_t)P * sizeof *as);
    for (int e = 0; e < E; e++) {
        ord[e] = e;
        N += n[e];
        as[e / per] += n[e];
    }
    for (int p = 0; p < P; p++)
        hi = as[p] > hi ? as[p] : hi;
    int64_t lo = (N + P - 1) / P;
    eload_t *el = malloc((size_t)E * sizeof *el);
    if (!el) {
        lrmoe_err("replica search: out of memory");
        goto out;
    }
    for (int e = 0; e < E; e++)
        el[e] = (eload_t){n[e], e};
    qsort(el, (size_t)E, sizeof *el, by_load_desc); /* a total order: ties by index */
    for (int e = 0; e < E; e++)
        ord[e] = el[e].e;
    free(el);
    int nadded = 0;
    while (lo < hi) {
        const int64_t T = lo + (hi - lo) / 2;
        if (spill_at(n, ord, E, P, extra, T, as, pend, used, pl, add_expert, add_rank, &nadded))
            hi = T;
        else
            lo = T + 1;
    }
    if (!spill_at(n, ord, E, P, extra, hi, as, pend, used, pl, add_expert, add_rank, &nadded)) {
        lrmoe_err("replica search: no spill at the natives' peak (internal error)");
        goto out;
    }
    rc = nadded;
out:
    free(ord);
    free(used);
    free(as);
    free(pend);
    return rc;
}

/* Greedy replica placement: at each step try every (expert, rank) pair with
 * the expert among the C heaviest (load per instance) whose instances all
 * lie in a bottleneck subset, and the rank outside it with a free slot; take
 * the pair with the lowest (objective, excess). Stop when neither drops; keep
 * the shortest prefix that reached the best objective. pl holds the natives
 * on entry. Returns the replicas added, or -1. */
static int place_replicas(greedy_ctx_t *c, int extra, uint8_t *pl, int *add_expert, int *add_rank)
{
    const int E = c->E, P = c->P, C = 6;
    const int maxadd = extra * P;
    if (maxadd <= 0 || P == 1)
        return 0;
    if (P > GREEDY_MAX_P)
        return place_replicas_search(c->load, E, P, extra, pl, add_expert, add_rank);
    int *inst = malloc((size_t)E * sizeof(int)), *reps = calloc((size_t)P, sizeof(int));
    c->mask = malloc((size_t)E * sizeof(uint32_t));
    c->load_sums = malloc(((size_t)1 << P) * sizeof(int64_t));
    c->bwd_sums = malloc(((size_t)1 << P) * sizeof(int64_t));
    int rc = -1;
    if (!inst || !reps || !c->mask || !c->load_sums || !c->bwd_sums) {
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
    greedy_value_t cur;
    greedy_sums(c);
    greedy_eval(c, -1, 0, 0, 0, &cur);
    greedy_eval(c, -1, 0, cur.fwd, cur.bwd, &cur);
    int64_t bestJ = cur.fwd + 2 * cur.bwd;
    int added = 0, best_count = 0;
    int cand[8];
    while (added < maxadd) {
        int nc = 0;
        for (int k = 0; k < C; k++) {
            int heaviest = -1;
            for (int e = 0; e < E; e++) {
                if (c->load[e] <= 0 || inst[e] >= P)
                    continue;
                if ((c->mask[e] & ~cur.fwd_set) && (c->mask[e] & ~cur.bwd_set))
                    continue; /* outside both bottlenecks */
                int taken = 0;
                for (int j = 0; j < nc; j++)
                    taken |= cand[j] == e;
                if (taken)
                    continue;
                if (heaviest < 0 ||
                    (double)c->load[e] / inst[e] > (double)c->load[heaviest] / inst[heaviest])
                    heaviest = e;
            }
            if (heaviest < 0)
                break;
            cand[nc++] = heaviest;
        }
        int best_e = -1, best_q = -1;
        greedy_value_t best = {0, 0, 0, 0, 0};
        for (int k = 0; k < nc; k++) {
            int e = cand[k];
            for (int q = 0; q < P; q++) {
                if (reps[q] >= extra || (c->mask[e] >> q & 1u))
                    continue;
                greedy_value_t v;
                greedy_eval(c, e, q, cur.fwd, cur.bwd, &v);
                int64_t j = v.fwd + 2 * v.bwd, jb = best.fwd + 2 * best.bwd;
                if (best_e < 0 || j < jb || (j == jb && v.excess < best.excess)) {
                    best = v;
                    best_e = e;
                    best_q = q;
                }
            }
        }
        if (best_e < 0)
            break;
        int64_t j = best.fwd + 2 * best.bwd, jc = cur.fwd + 2 * cur.bwd;
        if (!(j < jc || (j == jc && best.excess < cur.excess)))
            break; /* no progress */
        c->mask[best_e] |= 1u << best_q;
        pl[(size_t)best_e * P + best_q] = 1;
        inst[best_e]++;
        reps[best_q]++;
        add_expert[added] = best_e;
        add_rank[added] = best_q;
        added++;
        greedy_sums(c);
        greedy_eval(c, -1, 0, best.fwd, best.bwd, &cur); /* excess against the new levels */
        if (j < bestJ) {
            bestJ = j;
            best_count = added;
        }
    }
    for (int i = added - 1; i >= best_count; i--)
        pl[(size_t)add_expert[i] * P + add_rank[i]] = 0;
    rc = best_count;
out:
    free(inst);
    free(reps);
    free(c->mask);
    free(c->load_sums);
    free(c->bwd_sums);
    c->mask = NULL;
    c->load_sums = c->bwd_sums = NULL;
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

/* ------------------------------------------------------------ candidates */

/* A best-so-far: the plan, whether it holds a candidate that fits at this
 * rate, and its class (2: no worse than the best baseline in t_total and
 * forward peak, 1: in t_total only). */
typedef struct {
    lrmoe_plan_t *p;
    int have, cls;
} slot_t;

/* The planner's state over one call: the options, the loads, the best
 * candidate so far (in *best) and what it must beat. */
typedef struct {
    const lrmoe_plan_opts_t *o;
    const int64_t *load, *lo;
    int E, P, per;
    int64_t N, total;
    double rho;          /* the rate being tried */
    slot_t strict;       /* the best candidate that fits and does not
                            lengthen the modelled backward */
    slot_t any;          /* the best that fits, longer or not (used only
                            with --longer-backward, below rate 1) */
    lrmoe_plan_t *cand;  /* the candidate being evaluated (scratch) */
    double ref_t;        /* the best baseline: the lowest t_total of those */
    int64_t ref_pk;      /* that fit (of all when none fits), its forward peak */
    double glpk;         /* seconds in the min-peak allocations (max-flow;
                            reported as glpk_seconds) */
    int longer_fits;     /* a plan that fits was kept out: it lengthens */
    const int64_t *kprop; /* policy even below rate 1: the proportional quotas */
    int pre1;            /* rate 1 is the first rate: the forward candidates
                            are offered at it as they are built */
    int allow_longer;    /* offer plans whose backward is longer than keeping
                            every pair (source marked "+longer") */
    char why[400];       /* what the best non-fitting candidate hit */
    double min_mem1;     /* least memory of a rate-1 candidate within the window */
    char why_src[48];
    double why_mem;      /* its memory (for the closest miss) */
    int exhaustive;      /* LRMOE_PLAN_EXHAUSTIVE: no skips (see plan_exhaustive) */
    int have_anchor;     /* below rate 1: the best rate-1 plan that fits ... */
    double anchor_t;     /* ... its t_total and modelled backward: no plan */
    double anchor_b;     /* below rate 1 may take longer in either */
} plan_state_t;

/* LRMOE_PLAN_EXHAUSTIVE set to anything but "" or "0": the planner skips
 * nothing that it proves cannot change the plan (the backward-peak and
 * memory bound prunes, the threshold stop of their least-peak search,
 * bwd_loses, the early return of bwd_in_place, the min-peak forward
 * candidate of a baseline without replicas) and evaluates every candidate
 * in full, as before those skips. The plans must come out byte-identical;
 * tests/plan-prune.bats compares. Read once per call (a getenv per frame). */
static int plan_exhaustive(void)
{
    const char *e = getenv("LRMOE_PLAN_EXHAUSTIVE");
    return e && *e && strcmp(e, "0") != 0;
}

static double t_bwd_of(const lrmoe_cost_summary_t *s)
{
    return s->t_bwd_dispatch + s->t_bwd_compute + s->t_bwd_combine;
}

/* Runs the statements that follow i for each entry i of the placement pl
 * (n entries) that holds an instance, in increasing order (zero 8-byte
 * words skipped: plans are sparse). */
#define FOR_PLACED(pl, n, i, ...)                                             \
    for (size_t i##0 = 0; i##0 < (n); i##0 += 8) {                          \
        uint64_t i##w = 0;                                                  \
        if (i##0 + 8 <= (n) && (memcpy(&i##w, (pl) + i##0, 8), !i##w))       \
            continue;                                                       \
        for (size_t i = i##0; i < i##0 + 8 && i < (n); i++)                 \
            if ((pl)[i]) {                                                  \
                __VA_ARGS__                                                 \
            }                                                               \
    }

/* Copy the arrays and summary of a into b (same shape, b allocated). Both
 * hold allocations only where they place an expert (the planner's plans
 * do), so only those entries are cleared in b and copied from a. */
static void plan_copy(lrmoe_plan_t *b, const lrmoe_plan_t *a)
{
    const size_t EP = (size_t)a->E * a->P, P = (size_t)a->P;
    uint8_t *pl = b->placement;
    int64_t *fw = b->fwd_alloc, *q = b->quota, *bw = b->bwd_alloc, *held = b->held;
    double *ws = b->wsend, *wr = b->wrecv;
    lrmoe_rank_cost_t *rk = b->rank;
    *b = *a;
    b->placement = pl;
    b->fwd_alloc = fw;
    b->quota = q;
    b->bwd_alloc = bw;
    b->held = held;
    b->wsend = ws;
    b->wrecv = wr;
    b->rank = rk;
    FOR_PLACED(pl, EP, i, pl[i] = 0; fw[i] = bw[i] = 0;)
    FOR_PLACED(a->placement, EP, i, pl[i] = a->placement[i]; fw[i] = a->fwd_alloc[i];
               bw[i] = a->bwd_alloc[i];)
    memcpy(q, a->quota, (size_t)a->E * sizeof *q);
    memcpy(held, a->held, P * sizeof *held);
    memcpy(ws, a->wsend, P * sizeof *ws);
    memcpy(wr, a->wrecv, P * sizeof *wr);
    memcpy(rk, a->rank, P * sizeof *rk);
}

/* The largest per-expert drop fraction (n_e - K_e) / n_e of plan k. */
static double max_drop(const plan_state_t *c, const lrmoe_plan_t *k)
{
    double m = 0;
    for (int e = 0; e < c->E; e++)
        if (c->load[e] > 0) {
            double d = (double)(c->load[e] - k->quota[e]) / (double)c->load[e];
            if (d > m)
                m = d;
        }
    return m;
}

/* Whether the evaluated candidate c->cand beats the best of slot b. The
 * order: at rate 1, class (2 when neither its t_total nor its forward peak
 * is worse than the best baseline's, 1 when its t_total is not), then
 * t_total, forward peak, backward peak; below rate 1 the least t_total (a
 * plan that does not fit the budget never competes: where the budget binds
 * only lower-peak plans are left), then the least backward peak, the global
 * keep before by-rank, (policy even) the proportional quotas, the least
 * largest drop fraction, then the forward peak. */
static int beats(const plan_state_t *c, const slot_t *sl, int cls)
{
    const lrmoe_plan_t *k = c->cand, *b = sl->p;
    if (!sl->have)
        return 1;
    if (c->total < c->N) {
        const double dk = max_drop(c, k), db = max_drop(c, b);
        if (k->t_total != b->t_total)
            return k->t_total < b->t_total;
        if (k->bwd_peak != b->bwd_peak)
            return k->bwd_peak < b->bwd_peak;
        /* the global top-K_e keep where it reaches this peak: by-rank
         * selection only when the backward needs it */
        if (k->keep_by_rank != b->keep_by_rank)
            return !k->keep_by_rank;
        if (c->o->quota == LRMOE_QUOTA_EVEN && c->kprop) {
            /* the proportional quotas, where they reach this peak: the same
             * pairs as policy proportional keeps, so no larger error */
            const size_t qb = (size_t)c->E * sizeof *c->kprop;
            const int pk = !memcmp(k->quota, c->kprop, qb), pb = !memcmp(b->quota, c->kprop, qb);
            if (pk != pb)
                return pk;
        }
        if (c->o->quota == LRMOE_QUOTA_EVEN && dk != db)
            return dk < db; /* fidelity: the most even retention */
        return k->fwd_peak < b->fwd_peak;
    }
    if (cls != sl->cls)
        return cls > sl->cls;
    if (k->t_total != b->t_total)
        return k->t_total < b->t_total;
    if (k->fwd_peak != b->fwd_peak)
        return k->fwd_peak < b->fwd_peak;
    return k->bwd_peak < b->bwd_peak;
}

static void take(const plan_state_t *c, slot_t *sl, int cls, const char *src)
{
    plan_copy(sl->p, c->cand);
    snprintf(sl->p->source, sizeof sl->p->source, "%s", src);
    snprintf(sl->p->planner, sizeof sl->p->planner, "lrmoe");
    sl->have = 1;
    sl->cls = cls;
}

/* Offer the evaluated candidate c->cand (summary and cost filled) named
 * src; longer: its modelled backward is longer than the same plan keeping
 * every pair. Below rate 1 a plan whose t_total or modelled backward is
 * above the best rate-1 plan's (the anchor, when one fits) counts as
 * longer too. A candidate that does not fit only explains the rate (the
 * closest miss by memory); one that fits goes to the strict slot unless it
 * is longer, and (with --longer-backward, below rate 1) to the any slot,
 * its name ending in "+longer" when it is. */
static void submit(plan_state_t *c, const char *src, int longer)
{
    lrmoe_plan_t *k = c->cand;
    if (c->total < c->N && c->have_anchor &&
        (k->t_total > c->anchor_t * (1 + 1e-12) || t_bwd_of(&k->cost) > c->anchor_b * (1 + 1e-12)))
        longer = 1;
    if (c->total == c->N && k->mem_peak < c->min_mem1 &&
        !(c->o->cost.window > 0 && k->t_comm > c->o->cost.window))
        c->min_mem1 = k->mem_peak;
    if (!lrmoe_plan_fits(c->o, k, NULL, 0)) {
        if (!c->why[0] || k->mem_peak < c->why_mem) { /* the closest miss so far */
            lrmoe_plan_fits(c->o, k, c->why, sizeof c->why);
            snprintf(c->why_src, sizeof c->why_src, "%s", src);
            c->why_mem = k->mem_peak;
        }
        return;
    }
    const int tok = k->t_total <= c->ref_t * (1 + 1e-12);
    const int cls = tok ? 1 + (k->fwd_peak <= c->ref_pk) : 0;
    if (longer)
        c->longer_fits = 1;
    else if (beats(c, &c->strict, cls))
        take(c, &c->strict, cls, src);
    if (c->allow_longer && c->total < c->N && beats(c, &c->any, cls)) {
        char name[48];
        snprintf(name, sizeof name, "%.40s%s", src, longer ? "+longer" : "");
        take(c, &c->any, cls, name);
    }
}

/* Summary and cost of c->cand as it stands (global keep); 0 or -1. */
static int cand_eval(plan_state_t *c)
{
    c->cand->keep_by_rank = 0;
    if (lrmoe_plan_cost(c->o, c->cand, c->load, NULL) < 0)
        return -1;
    lrmoe_plan_summarise(c->cand, c->load);
    return 0;
}

/* Submit the evaluated backward c->cand (rate below 1) named src; t1: the
 * modelled backward of the same plan keeping every pair. When it is longer
 * with lrmoe-score's global top-K_e (the worst case over which pairs are
 * kept), the same plan with the keep by forward rank (plan.keep=by-rank:
 * the state moved onto p for e is max(0, bwd - fwd)) is offered instead if
 * that is not longer; else the longer one is. 0 or -1. */
static int submit_bwd(plan_state_t *c, const char *src, double t1)
{
    lrmoe_plan_t *k = c->cand;
    if (t_bwd_of(&k->cost) <= t1) {
        submit(c, src, 0);
        return 0;
    }
    k->keep_by_rank = 1;
    if (lrmoe_plan_cost(c->o, k, c->load, NULL) < 0)
        return -1;
    if (t_bwd_of(&k->cost) <= t1) {
        char name[48];
        snprintf(name, sizeof name, "%.39s+by-rank", src);
        submit(c, name, 0);
        return 0;
    }
    k->keep_by_rank = 0;
    if (lrmoe_plan_cost(c->o, k, c->load, NULL) < 0)
        return -1;
    submit(c, src, 1);
    return 0;
}

/* Backward kept in place: only experts whose forward ran on one rank drop
 * pairs, on that rank (their retained state never moves), every other
 * expert keeps all its pairs where forward ran. So every rank retains at
 * most its forward rows and nothing moves: no backward phase can take
 * longer than with every pair kept. Among these, the least backward peak;
 * then the most even retention (every rank's droppable experts keep the same
 * fraction as far as the peak allows, split inside a rank by largest
 * remainders). Returns 1 with quota and bwd_alloc of cand filled, 0 when the
 * droppable experts cannot absorb N - total, 2 when its peak is above beat
 * (>= 0: the strict slot's, which it then cannot beat; see bwd_loses), -1
 * on error. */
static int bwd_in_place(plan_state_t *c, int64_t beat)
{
    const int E = c->E, P = c->P;
    lrmoe_plan_t *k = c->cand;
    /* per rank p (the comments' notation): spread (M_p) the forward rows of
     * the experts that ran on several ranks, kept where they ran;
     * drop_load (S_p) and drop_floor (L_p) the loads and floors of the
     * experts that ran on p alone (only_rank[e] = p), which drop; kept
     * (x_p) the pairs those retain. rank_*: one rank's droppable experts. */
    int64_t *spread = calloc((size_t)P, sizeof *spread);
    int64_t *drop_load = calloc((size_t)P, sizeof *drop_load);
    int64_t *drop_floor = calloc((size_t)P, sizeof *drop_floor);
    int64_t *kept = calloc((size_t)P, sizeof *kept);
    int *only_rank = malloc((size_t)E * sizeof(int));
    int64_t *rank_load = malloc((size_t)E * sizeof *rank_load);
    int64_t *rank_floor = malloc((size_t)E * sizeof *rank_floor);
    int64_t *rank_quota = malloc((size_t)E * sizeof *rank_quota);
    int *rank_expert = malloc((size_t)E * sizeof(int));
    int rc = -1;
    if (!spread || !drop_load || !drop_floor || !kept || !only_rank || !rank_load ||
        !rank_floor || !rank_quota || !rank_expert) {
        lrmoe_err("lrmoe: out of memory");
        goto out;
    }
    for (int e = 0; e < E; e++) {
        int cnt = 0, w = -1;
        for (int p = 0; p < P; p++)
            if (k->fwd_alloc[(size_t)e * P + p] > 0) {
                cnt++;
                w = p;
            }
        only_rank[e] = cnt == 1 ? w : -1;
        if (cnt == 1) {
            drop_load[w] += c->load[e];
            drop_floor[w] += c->lo[e];
        } else {
            for (int p = 0; p < P; p++)
                spread[p] += k->fwd_alloc[(size_t)e * P + p];
        }
    }
    int64_t retain = c->total, floor_sum = 0, hi = 0, lo = 0;
    for (int p = 0; p < P; p++) {
        retain -= spread[p];
        floor_sum += drop_floor[p];
        if (spread[p] + drop_floor[p] > lo)
            lo = spread[p] + drop_floor[p];
        if (spread[p] + drop_load[p] > hi)
            hi = spread[p] + drop_load[p];
    }
    if (retain < floor_sum) {
        rc = 0;
        goto out;
    }
    /* least T with sum_p min(S_p, T - M_p) >= retain */
    while (lo < hi) {
        const int64_t T = lo + (hi - lo) / 2;
        int64_t room = 0;
        for (int p = 0; p < P; p++)
            room += T - spread[p] < drop_load[p] ? T - spread[p] : drop_load[p];
        if (room >= retain)
            hi = T;
        else
            lo = T + 1;
    }
    const int64_t T = lo;
    /* T is this backward's peak: x_p <= T - M_p keeps every rank <= T, and
     * a peak below T would leave room >= retain at T - 1 (or, at T = lo, a rank
     * is at M_p + L_p = T) */
    if (beat >= 0 && T > beat) {
        rc = 2;
        goto out;
    }
    /* even retention: x_p = clamp(floor(f*S_p), L_p, cap_p), f as large as
     * keeps sum kept <= retain (bisection), the rest where room is left */
    double fl = 0, fh = 1;
    for (int it = 0; it < 60; it++) {
        const double f = 0.5 * (fl + fh);
        int64_t s = 0;
        for (int p = 0; p < P; p++) {
            int64_t cap = T - spread[p] < drop_load[p] ? T - spread[p] : drop_load[p];
            int64_t v = (int64_t)floor(f * (double)drop_load[p]);
            s += v < drop_floor[p] ? drop_floor[p] : v > cap ? cap : v;
        }
        if (s <= retain)
            fl = f;
        else
            fh = f;
    }
    int64_t s = 0;
    for (int p = 0; p < P; p++) {
        int64_t cap = T - spread[p] < drop_load[p] ? T - spread[p] : drop_load[p];
        int64_t v = (int64_t)floor(fl * (double)drop_load[p]);
        kept[p] = v < drop_floor[p] ? drop_floor[p] : v > cap ? cap : v;
        s += kept[p];
    }
    for (int p = 0; p < P && s < retain; p++) {
        int64_t cap = T - spread[p] < drop_load[p] ? T - spread[p] : drop_load[p];
        int64_t d = cap - kept[p] < retain - s ? cap - kept[p] : retain - s;
        kept[p] += d;
        s += d;
    }
    if (s != retain) {
        lrmoe_err("lrmoe: in-place backward: retained %lld of %lld (internal error)",
                  (long long)s, (long long)retain);
        goto out;
    }
    memset(k->bwd_alloc, 0, (size_t)E * P * sizeof *k->bwd_alloc);
    for (int e = 0; e < E; e++) {
        if (only_rank[e] >= 0)
            continue;
        k->quota[e] = c->load[e];
        for (int p = 0; p < P; p++)
            k->bwd_alloc[(size_t)e * P + p] = k->fwd_alloc[(size_t)e * P + p];
    }
    for (int p = 0; p < P; p++) {
        int m = 0;
        for (int e = 0; e < E; e++)
            if (only_rank[e] == p) {
                rank_expert[m] = e;
                rank_load[m] = c->load[e];
                rank_floor[m] = c->lo[e];
                m++;
            }
        if (!m)
            continue;
        quota_proportional(rank_load, rank_floor, m,
                           drop_load[p] ? (double)kept[p] / (double)drop_load[p] : 0, kept[p],
                           rank_quota);
        for (int j = 0; j < m; j++) {
            k->quota[rank_expert[j]] = rank_quota[j];
            k->bwd_alloc[(size_t)rank_expert[j] * P + p] = rank_quota[j];
        }
    }
    rc = 1;
out:
    free(spread); free(drop_load); free(drop_floor); free(kept); free(only_rank);
    free(rank_load); free(rank_floor); free(rank_quota); free(rank_expert);
    return rc;
}

/* Bisection steps of the even floors: the drop fraction to 2^-12. */
#define EVEN_STEPS 12

/* Fidelity-aware floors (policy even): the least drop fraction f such that
 * floors max(lo_e, ceil((1-f) n_e)) still reach the least backward peak T
 * of the free quotas; written to lf. Returns 0 or -1. */
static int even_floors(plan_state_t *c, const uint8_t *pl, int64_t T, int64_t *lf)
{
    const int E = c->E;
    double fl = 0, fh = 1;
    /* the floors only rise from the last that routed (f below fh) */
    lrmoe_route_net_t *net = lrmoe_route_net_new(pl, E, c->P, T);
    if (!net)
        return -1;
    int r0 = lrmoe_route_net_try(net, c->lo);
    if (r0 != 1) {
        lrmoe_route_net_free(net);
        return r0 < 0 ? -1 : lrmoe_err("lrmoe: the floors do not route at the least "
                                       "backward peak (internal error)");
    }
    for (int it = 0; it < EVEN_STEPS; it++) {
        const double f = 0.5 * (fl + fh);
        int64_t sum = 0;
        for (int e = 0; e < E; e++) {
            int64_t v = (int64_t)ceil((1 - f) * (double)c->load[e] - 1e-9);
            if (v < c->lo[e])
                v = c->lo[e];
            if (v > c->load[e])
                v = c->load[e];
            lf[e] = v;
            sum += v;
        }
        /* the free-quota peak with floors lf is <= T iff the floors route
         * at T: the other family of bounds (the total must route) holds at
         * T, the least peak with the floors lo <= lf */
        int ok = sum <= c->total;
        if (ok && (ok = lrmoe_route_net_try(net, lf)) < 0) {
            lrmoe_route_net_free(net);
            return -1;
        }
        if (ok)
            fh = f;
        else
            fl = f;
    }
    lrmoe_route_net_free(net);
    for (int e = 0; e < E; e++) {
        int64_t v = (int64_t)ceil((1 - fh) * (double)c->load[e] - 1e-9);
        lf[e] = v < c->lo[e] ? c->lo[e] : v > c->load[e] ? c->load[e] : v;
    }
    return 0;
}

/* Backward at the least peak for the policy: free quotas (minpeak: floors
 * lo; even: the proportional quotas when they reach the least peak, else
 * the fidelity-aware floors), or the proportional quotas K. The optimum T*
 * by plan_minpeak, the allocation at it by max-flow (retained pairs first
 * where forward ran). Fills cand's quota, bwd_alloc and bwd_lb. Returns 0
 * or -1. */
static int bwd_minpeak(plan_state_t *c, const int64_t *K, int64_t lb)
{
    lrmoe_plan_t *k = c->cand;
    const int E = c->E, P = c->P;
    const uint8_t *pl = k->placement;
    double t0 = lrmoe_now();
    int64_t bpk;
    int64_t *lf = NULL;
    if (K) {
        memcpy(k->quota, K, (size_t)E * sizeof *K);
        bpk = lrmoe_alloc_flow_at(pl, K, E, P, lb, k->bwd_alloc);
    } else {
        if (!(lf = malloc((size_t)E * sizeof *lf)))
            return lrmoe_err("lrmoe: out of memory");
        int t = -1;
        if (c->o->quota == LRMOE_QUOTA_EVEN) {
            /* the proportional quotas, when they reach the least peak, are
             * the most even of all */
            if (c->kprop)
                memcpy(lf, c->kprop, (size_t)E * sizeof *lf);
            else
                quota_proportional(c->load, c->lo, E, c->rho, c->total, lf);
            /* their peak is at least lb (they are one choice of the free
             * quotas): lb exactly when they route at lb */
            t = lrmoe_flow_routes_x(pl, lf, E, P, lb, k->bwd_alloc);
            if (t < 0) {
                free(lf);
                return -1;
            }
            if (t) {
                memcpy(k->quota, lf, (size_t)E * sizeof *lf);
                bpk = lb;
            } else if (even_floors(c, pl, lb, lf) < 0) { /* else the least drop fraction */
                free(lf);
                return -1;
            }
        }
        if (!t || c->o->quota != LRMOE_QUOTA_EVEN) {
            const int64_t *floors = c->o->quota == LRMOE_QUOTA_EVEN ? lf : c->lo;
            bpk = lrmoe_alloc_flow_quota(pl, floors, c->load, c->total, k->fwd_alloc, E, P, lb,
                                         k->quota, k->bwd_alloc);
            for (int e = 0; bpk >= 0 && e < E; e++)
                if (k->quota[e] < floors[e] || k->quota[e] > c->load[e]) {
                    free(lf);
                    return lrmoe_err("lrmoe: quota %lld of expert %d outside [%lld,%lld] "
                                     "(internal error)", (long long)k->quota[e], e,
                                     (long long)floors[e], (long long)c->load[e]);
                }
        }
        free(lf);
    }
    c->glpk += lrmoe_now() - t0;
    if (bpk < 0)
        return -1;
    if (bpk != lb)
        return lrmoe_err("lrmoe: backward peak %lld differs from the optimum %lld "
                         "(internal error)", (long long)bpk, (long long)lb);
    k->bwd_lb = lb;
    return 0;
}

/* Retained pairs of cand's quotas split over the ranks in proportion to
 * where forward ran (largest remainders). */
static void bwd_follow(plan_state_t *c)
{
    lrmoe_plan_t *k = c->cand;
    const int P = c->P;
    const size_t EP = (size_t)c->E * P;
    /* forward runs only where an expert is placed: elsewhere b = f = 0 */
    memset(k->bwd_alloc, 0, EP * sizeof *k->bwd_alloc);
    FOR_PLACED(k->placement, EP, i, {
        const int64_t n = c->load[i / P], K = k->quota[i / P], f = k->fwd_alloc[i];
        int64_t b = n ? (int64_t)((double)f * (double)K / (double)n) : 0;
        k->bwd_alloc[i] = b > f ? f : b;
    })
    for (int e = 0; e < c->E; e++) {
        const int64_t K = k->quota[e];
        int64_t *b = k->bwd_alloc + (size_t)e * P;
        const int64_t *f = k->fwd_alloc + (size_t)e * P;
        const uint8_t *row = k->placement + (size_t)e * P;
        int64_t s = 0;
        for (int p = 0; p < P; p++)
            s += b[p];
        for (int p = 0; p < P && s < K; p++)
            if (row[p] && b[p] < f[p]) {
                int64_t d = f[p] - b[p] < K - s ? f[p] - b[p] : K - s;
                b[p] += d;
                s += d;
            }
    }
}

/* Whether cand's backward (bwd_alloc as it stands) cannot win at this
 * rate: its peak is above cap (peak_cap). Once the strict slot holds a
 * plan the rate is decided by it: the any slot, the explanation of a miss
 * and the closest miss are not used. So the cost evaluation is skipped. */
static int bwd_loses(const plan_state_t *c, int64_t cap)
{
    if (cap == INT64_MAX)
        return 0;
    const lrmoe_plan_t *k = c->cand;
    const int P = c->P;
    int64_t *br = calloc((size_t)P, sizeof *br);
    if (!br)
        return 0; /* evaluate it */
    int64_t pk = 0;
    FOR_PLACED(k->placement, (size_t)c->E * P, i, br[i % P] += k->bwd_alloc[i];)
    for (int q = 0; q < P; q++)
        if (br[q] > pk)
            pk = br[q];
    free(br);
    return pk > cap;
}

/* A forward candidate: a placement with its forward allocation (and EPLB's
 * slot accounting), which does not depend on the rate; kept sparse (an
 * expert lives on a few ranks), so a frame's candidates cost O(E + replicas)
 * each, built once per frame and loaded into cand at every rate. */
typedef struct {
    char name[40];      /* "placement:forward" */
    int64_t flb;        /* the forward optimum T* of the placement */
    double t1;          /* modelled backward keeping every pair */
    double tnb;         /* modelled time outside the backward (forward
                           all-to-all and compute, replica weights) */
    double base_min;    /* the least replica + forward charge of a rank */
    int npl, nfw;       /* entries of the placement, nonzero forward cells */
    int32_t *pidx, *fidx;
    int64_t *fval;
    int have_slots, weight_moves;
    int64_t *held;      /* (P) with have_slots */
    double *wsend, *wrecv;
} fwd_cand_t;

static void fwd_cand_free(fwd_cand_t *f)
{
    free(f->pidx);
    free(f->fidx);
    free(f->fval);
    free(f->held);
    free(f->wsend);
    free(f->wrecv);
    memset(f, 0, sizeof *f);
}

/* 1 when candidates a and b are the same plan (P ranks). */
static int fwd_cand_same(const fwd_cand_t *a, const fwd_cand_t *b, int P)
{
    if (a->npl != b->npl || a->nfw != b->nfw || a->have_slots != b->have_slots ||
        memcmp(a->pidx, b->pidx, (size_t)a->npl * sizeof *a->pidx) ||
        memcmp(a->fidx, b->fidx, (size_t)a->nfw * sizeof *a->fidx) ||
        memcmp(a->fval, b->fval, (size_t)a->nfw * sizeof *a->fval))
        return 0;
    return !a->have_slots || (a->weight_moves == b->weight_moves &&
                              !memcmp(a->held, b->held, (size_t)P * sizeof *a->held) &&
                              !memcmp(a->wsend, b->wsend, (size_t)P * sizeof *a->wsend) &&
                              !memcmp(a->wrecv, b->wrecv, (size_t)P * sizeof *a->wrecv));
}

/* Keep cand's placement and forward (and, evaluated with every pair kept,
 * its backward time) as candidate cands[*ncands], unless an earlier one is the
 * same plan (it would tie and lose every comparison). Returns 0 or -1. */
static int fwd_cand_take(plan_state_t *c, fwd_cand_t *cands, int *ncands, const char *name,
                         int64_t flb)
{
    fwd_cand_t *f = &cands[*ncands];
    const lrmoe_plan_t *k = c->cand;
    const size_t EP = (size_t)c->E * c->P;
    int npl = 0, nfw = 0;
    /* pairs only where an expert is placed: the placement's entries */
    FOR_PLACED(k->placement, EP, i, npl++; nfw += k->fwd_alloc[i] != 0;)
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    f->flb = flb;
    f->t1 = t_bwd_of(&k->cost);
    f->tnb = k->cost.t_dispatch + k->cost.t_combine + k->cost.t_weights + k->cost.t_fwd_compute;
    f->base_min = HUGE_VAL;
    for (int p = 0; p < c->P; p++) {
        const lrmoe_rank_cost_t *r = &k->rank[p];
        const double b = r->mem_replica + r->mem_fwd + r->mem_saved;
        if (b < f->base_min)
            f->base_min = b;
    }
    f->pidx = malloc(((size_t)npl + 1) * sizeof *f->pidx);
    f->fidx = malloc(((size_t)nfw + 1) * sizeof *f->fidx);
    f->fval = malloc(((size_t)nfw + 1) * sizeof *f->fval);
    f->have_slots = k->have_slots;
    f->weight_moves = k->weight_moves;
    if (k->have_slots) {
        f->held = malloc((size_t)c->P * sizeof *f->held);
        f->wsend = malloc((size_t)c->P * sizeof *f->wsend);
        f->wrecv = malloc((size_t)c->P * sizeof *f->wrecv);
    }
    if (!f->pidx || !f->fidx || !f->fval ||
        (k->have_slots && (!f->held || !f->wsend || !f->wrecv))) {
        fwd_cand_free(f);
        return lrmoe_err("lrmoe: out of memory");
    }
    FOR_PLACED(k->placement, EP, i, f->pidx[f->npl++] = (int32_t)i;
               if (k->fwd_alloc[i]) {
                   f->fidx[f->nfw] = (int32_t)i;
                   f->fval[f->nfw++] = k->fwd_alloc[i];
               })
    if (k->have_slots) {
        memcpy(f->held, k->held, (size_t)c->P * sizeof *f->held);
        memcpy(f->wsend, k->wsend, (size_t)c->P * sizeof *f->wsend);
        memcpy(f->wrecv, k->wrecv, (size_t)c->P * sizeof *f->wrecv);
    }
    for (int i = 0; i < *ncands; i++)
        if (fwd_cand_same(&cands[i], f, c->P)) {
            fwd_cand_free(f);
            return 0;
        }
    (*ncands)++;
    if (c->pre1) { /* rate 1 comes first: offer it as it stands */
        char all[56];
        c->cand->fwd_lb = c->cand->bwd_lb = flb;
        snprintf(all, sizeof all, "%s/all", name);
        submit(c, all, 0);
    }
    return 0;
}

/* Candidate f into cand: placement, forward, slot accounting. */
static void fwd_cand_load(plan_state_t *c, const fwd_cand_t *f)
{
    lrmoe_plan_t *k = c->cand;
    const size_t EP = (size_t)c->E * c->P;
    /* cand's forward lies on its placement: clearing those entries clears it */
    FOR_PLACED(k->placement, EP, i, k->placement[i] = 0; k->fwd_alloc[i] = 0;)
    for (int i = 0; i < f->npl; i++)
        k->placement[f->pidx[i]] = 1;
    for (int i = 0; i < f->nfw; i++)
        k->fwd_alloc[f->fidx[i]] = f->fval[i];
    k->have_slots = f->have_slots;
    k->weight_moves = f->weight_moves;
    if (f->have_slots) {
        memcpy(k->held, f->held, (size_t)c->P * sizeof *k->held);
        memcpy(k->wsend, f->wsend, (size_t)c->P * sizeof *k->wsend);
        memcpy(k->wrecv, f->wrecv, (size_t)c->P * sizeof *k->wrecv);
    }
}

/* The forward candidates of a placement, appended to cands[*ncands]: when base is
 * given, the baseline's own plan (slot accounting included); then the
 * min-peak forward on the placement (pl, or base's). Replicas left without
 * pairs by the min-peak allocation are dropped (they would cost weights for
 * nothing; T* stays: the allocation still routes). Each is evaluated with
 * every pair kept. Returns 0 or -1. */
static int fwd_candidates(plan_state_t *c, const lrmoe_plan_t *base, const uint8_t *pl,
                          const char *src, fwd_cand_t *cands, int *ncands)
{
    lrmoe_plan_t *k = c->cand;
    const int E = c->E, P = c->P;
    const size_t EP = (size_t)E * P;
    char name[40];
    int64_t flb = -1;
    if (base) {
        plan_copy(k, base); /* evaluated with every pair kept */
        flb = lrmoe_plan_minpeak(base->placement, NULL, c->load, 0, E, P, -1, NULL, NULL);
        if (flb < 0)
            return -1;
        snprintf(name, sizeof name, "%s:own", src);
        if (fwd_cand_take(c, cands, ncands, name, flb) < 0)
            return -1;
        /* without replicas (every expert on its native rank alone) the
         * forward has one allocation: the min-peak candidate would be this
         * one again, and dropped as a duplicate */
        if (!base->have_slots && base->replicas == 0 && !c->exhaustive)
            return 0;
        pl = base->placement;
    }
    memcpy(k->placement, pl, EP);
    if (base && base->have_slots) {
        memcpy(k->held, base->held, (size_t)P * sizeof *k->held);
        memcpy(k->wsend, base->wsend, (size_t)P * sizeof *k->wsend);
        memcpy(k->wrecv, base->wrecv, (size_t)P * sizeof *k->wrecv);
        k->have_slots = 1;
        k->weight_moves = base->weight_moves;
    } else {
        k->have_slots = 0;
        k->weight_moves = 0;
    }
    double t0 = lrmoe_now();
    int64_t fpk = flb >= 0 ? lrmoe_alloc_flow_at(k->placement, c->load, E, P, flb, k->fwd_alloc)
                           : lrmoe_alloc_flow(k->placement, c->load, E, P, k->fwd_alloc);
    c->glpk += lrmoe_now() - t0;
    if (fpk < 0)
        return lrmoe_err_prefix("forward allocation");
    if (!k->have_slots)
        for (int e = 0; e < E; e++)
            for (int p = 0; p < P; p++) {
                const size_t i = (size_t)e * P + p;
                if (k->placement[i] && !k->fwd_alloc[i] && p != e / c->per)
                    k->placement[i] = 0;
            }
    memcpy(k->quota, c->load, (size_t)E * sizeof *c->load);
    memcpy(k->bwd_alloc, k->fwd_alloc, EP * sizeof(int64_t));
    if (cand_eval(c) < 0)
        return -1;
    snprintf(name, sizeof name, "%s:minpeak", src);
    return fwd_cand_take(c, cands, ncands, name, fpk);
}

/* lrmoe's own placement pl (nadded additions, history add_expert/add_rank) and its shorter
 * prefixes of the additions (1/2, 1/4, ...: fewer weight transfers). */
static int own_candidates(plan_state_t *c, uint8_t *pl, int nadded, const int *add_expert,
                          const int *add_rank, fwd_cand_t *cands, int *ncands)
{
    const int P = c->P;
    if (fwd_candidates(c, NULL, pl, "lrmoe", cands, ncands) < 0)
        return -1;
    for (int k = nadded / 2; k > 0; k /= 2) {
        for (int i = nadded - 1; i >= k; i--)
            pl[(size_t)add_expert[i] * P + add_rank[i]] = 0;
        int r = fwd_candidates(c, NULL, pl, "lrmoe", cands, ncands);
        for (int i = k; i < nadded; i++)
            pl[(size_t)add_expert[i] * P + add_rank[i]] = 1;
        if (r < 0)
            return -1;
    }
    return 0;
}

/* Candidates a placement search with nadded additions yields. */
static int own_count(int nadded)
{
    int n = 1;
    for (int k = nadded / 2; k > 0; k /= 2)
        n++;
    return n;
}

/* Evaluate cand's backward and submit it as src/what, with the bounds
 * flb, blb; t1: the backward keeping every pair (submit_bwd), or < 0 for a
 * backward that cannot be longer (submitted as it is). 0 or -1. */
static int offer_bwd(plan_state_t *c, const char *src, const char *what, int64_t flb, int64_t blb,
                     double t1)
{
    char name[56];
    if (cand_eval(c) < 0)
        return -1;
    c->cand->fwd_lb = flb;
    c->cand->bwd_lb = blb;
    snprintf(name, sizeof name, "%s/%s", src, what);
    if (t1 < 0) {
        submit(c, name, 0);
        return 0;
    }
    return submit_bwd(c, name, t1);
}

/* Below rate 1, the highest backward peak at which a backward of forward
 * candidate f could still win the strict slot (beats: t_total first): its
 * t_total is at least f's time outside the backward plus the compute of
 * its peak rank (12*D*F FLOPs a row), and a t_total above the slot's
 * loses. INT64_MAX when nothing is known (the slot is empty, or
 * LRMOE_PLAN_EXHAUSTIVE), -1 when no backward of f can win. The margin
 * (1e-9 relative) keeps rounding from pruning a candidate that ties. */
static int64_t peak_cap(const plan_state_t *c, const fwd_cand_t *f)
{
    if (!c->strict.have || c->exhaustive)
        return INT64_MAX;
    const lrmoe_cost_model_t *m = &c->o->cost;
    const double row = 12.0 * (double)m->D * (double)m->F / m->flops;
    const double room = c->strict.p->t_total * (1 + 1e-9) - f->tnb;
    if (room < 0)
        return -1;
    const double r = floor(room / row);
    return r > 4e18 ? INT64_MAX : (int64_t)r;
}

/* All backward variants of forward candidate f at the current rate, each
 * submitted with whether it lengthens the modelled backward of the same
 * plan with every pair kept. K: proportional quotas (NULL: free). */
static int try_backwards(plan_state_t *c, const int64_t *K, const fwd_cand_t *f)
{
    lrmoe_plan_t *k = c->cand;
    const int E = c->E;
    const size_t EP = (size_t)E * c->P;
    const int64_t flb = f->flb;
    const char *src = f->name;
    char name[56];
    fwd_cand_load(c, f);
    if (c->total == c->N) {
        memcpy(k->quota, c->load, (size_t)E * sizeof *c->load);
        memcpy(k->bwd_alloc, k->fwd_alloc, EP * sizeof(int64_t));
        if (cand_eval(c) < 0)
            return -1;
        k->fwd_lb = k->bwd_lb = flb;
        snprintf(name, sizeof name, "%s/all", src);
        submit(c, name, 0);
        return 0;
    }
    const double t1 = f->t1 * (1 + 1e-12);
    /* the least backward peak of this placement bounds every backward of
     * it: when it is above cap (peak_cap: its t_total would be above the
     * best that fits and does not lengthen), no variant can win the strict
     * slot, and once that slot holds a plan the any slot is not used */
    /* memory: some rank retains lb rows, on top of at least the least
     * replica + forward charge of any rank; when that is over the budget no
     * variant fits, and the candidate only matters for the explanation: not
     * once a plan fits here or a closer miss is known. Both tests need only
     * to know that lb reaches a threshold, so the search stops there (ub). */
    const double B = lrmoe_cost_bwd_row_bytes(&c->o->cost);
    const int explained = c->strict.have || c->longer_fits || c->why[0];
    const int prune = !c->exhaustive;
    const int64_t cap = peak_cap(c, f);
    if (cap < 0)
        return 0; /* its forward alone is slower than the slot's plan */
    int64_t ub = cap < INT64_MAX ? cap + 1 : -1;
    if (c->o->cost.hbm > 0 && explained && prune) {
        const double r = floor((c->o->cost.hbm - f->base_min) / B) + 1;
        const int64_t m = r < 1 ? 1 : r > 4e18 ? INT64_MAX : (int64_t)r;
        if (ub < 0 || m < ub)
            ub = m;
    }
    int64_t lb = -1;
    for (int exact = 0; exact < 2; exact++) {
        lb = K ? lrmoe_plan_minpeak(k->placement, NULL, K, 0, E, c->P, exact ? -1 : ub, NULL, NULL)
               : lrmoe_plan_minpeak(k->placement, c->lo, c->load, c->total, E, c->P,
                              exact ? -1 : ub, NULL, NULL);
        if (lb < 0)
            return -1;
        if (lb > cap)
            return 0;
        const double mlb = f->base_min + (double)lb * B;
        if (prune && c->o->cost.hbm > 0 && mlb > c->o->cost.hbm &&
            (c->strict.have || c->longer_fits || (c->why[0] && c->why_mem <= mlb))) {
            return 0;
        }
        if (ub < 0 || lb < ub)
            break; /* exact: below the threshold the search ran to T* */
    }
    /* the least peak of the policy */
    if (bwd_minpeak(c, K, lb) < 0)
        return -1;
    const int64_t blb = k->bwd_lb;
    if (offer_bwd(c, src, "minpeak", flb, blb, t1) < 0)
        return -1;
    /* the same quotas where forward ran */
    bwd_follow(c);
    const int64_t cap2 = peak_cap(c, f); /* the slot may have improved */
    if (!bwd_loses(c, cap2) && offer_bwd(c, src, "follow", flb, blb, t1) < 0)
        return -1;
    if (K)
        return 0; /* proportional quotas are fixed */
    const int64_t cap3 = peak_cap(c, f);
    if (cap3 < 0)
        return 0;
    int r = bwd_in_place(c, cap3 < INT64_MAX ? cap3 : -1);
    if (r < 0)
        return -1;
    /* in place nothing moves: never longer than keeping every pair */
    return r == 1 ? offer_bwd(c, src, "in-place", flb, blb, -1) : 0;
}

/* Offer the plan ch of a higher rate scaled down to this rate: its
 * placement and forward, quotas K_e in [lo_e, ch's K_e] summing to the
 * rate's total (proportional, largest remainders), each expert's retained
 * rows split over the ranks where ch retained them (in proportion, never
 * more on a rank than ch), kept by forward rank. Every rank then retains
 * and receives no more than under ch, so neither its t_total, its modelled
 * backward nor its memory can exceed ch's: a plan at this rate no slower
 * than ch always exists. Named "placement:forward/scaled+by-rank".
 * Returns 0 or -1. */
static int offer_scaled(plan_state_t *c, const lrmoe_plan_t *ch)
{
    lrmoe_plan_t *k = c->cand;
    const int E = c->E, P = c->P;
    int64_t sk = 0;
    for (int e = 0; e < E; e++)
        sk += ch->quota[e];
    if (sk < c->total)
        return 0; /* cannot happen: ch's rate is higher */
    plan_copy(k, ch);
    quota_proportional(ch->quota, c->lo, E, sk ? (double)c->total / (double)sk : 0, c->total,
                       k->quota);
    for (int e = 0; e < E; e++) {
        const int64_t Kc = ch->quota[e], K = k->quota[e];
        int64_t *b = k->bwd_alloc + (size_t)e * P, s = 0;
        const int64_t *bc = ch->bwd_alloc + (size_t)e * P;
        for (int p = 0; p < P; p++) {
            b[p] = Kc ? (int64_t)((double)bc[p] * (double)K / (double)Kc) : 0;
            if (b[p] > bc[p])
                b[p] = bc[p];
            s += b[p];
        }
        for (int p = 0; p < P && s < K; p++)
            if (b[p] < bc[p]) {
                const int64_t d = bc[p] - b[p] < K - s ? bc[p] - b[p] : K - s;
                b[p] += d;
                s += d;
            }
        if (s != K)
            return lrmoe_err("lrmoe: scaled backward: expert %d retains %lld of %lld "
                             "(internal error)", e, (long long)s, (long long)K);
    }
    const int64_t blb = lrmoe_plan_minpeak(k->placement, NULL, k->quota, 0, E, P, -1, NULL, NULL);
    if (blb < 0)
        return -1;
    k->keep_by_rank = 1;
    if (lrmoe_plan_cost(c->o, k, c->load, NULL) < 0)
        return -1;
    lrmoe_plan_summarise(k, c->load);
    k->fwd_lb = ch->fwd_lb;
    k->bwd_lb = blb;
    char name[48];
    snprintf(name, sizeof name, "%.*s/scaled+by-rank", (int)strcspn(ch->source, "/"), ch->source);
    submit(c, name, 0);
    return 0;
}

/* Slots beyond the natives: -s S gives S - E/P; else what the budget holds
 * once a balanced rank's token buffers are paid (at least 2, at most E/P
 * more, and never more experts than exist). */
static int extra_slots(const lrmoe_plan_opts_t *o, int E, int64_t N)
{
    const int P = o->P, per = E / P;
    if (o->slots)
        return o->slots - per;
    int cap = per < 2 ? 2 : per;
    if (cap > E - per)
        cap = E - per;
    if (o->cost.hbm > 0) {
        const int64_t r = (N + P - 1) / P;
        const double room = o->cost.hbm - lrmoe_cost_rank_mem(&o->cost, 0, r, r);
        const double k = room / lrmoe_cost_replica_bytes(&o->cost);
        if (k < cap)
            cap = k < 2 ? 2 : (int)k;
        if (cap > E - per)
            cap = E - per;
    }
    return cap < 0 ? 0 : cap;
}

/* What an infeasible frame would need: the least budget at which rate 1
 * fits (of the plans tried) and the highest rate below the candidates, in
 * steps of 0.05 down to min-keep, that fits. Appended to more. */
static void explain(const lrmoe_plan_opts_t *o, const int64_t *load, int E, plan_base_fn base,
                    double mem1, char *more, size_t len)
{
    char b[24];
    size_t n = 0;
    if (o->cost.hbm > 0 && mem1 < HUGE_VAL && mem1 > o->cost.hbm)
        n += (size_t)snprintf(more + n, len - n, "; rate 1 fits from %s",
                              lrmoe_cost_fmt_bytes(mem1, b, sizeof b));
    lrmoe_plan_opts_t q = *o;
    q.explain = 0;
    q.best_effort = 0;
    q.nrates = 0;
    const double lowest = q.min_keep > 0.05 ? q.min_keep : 0.05;
    for (double r = o->rates[o->nrates - 1] - 0.05; r >= lowest - 1e-9 && q.nrates < 16; r -= 0.05)
        q.rates[q.nrates++] = floor(r * 100 + 0.5) / 100;
    if (!q.nrates || n >= len)
        return;
    lrmoe_plan_t t;
    lrmoe_plan_init(&t);
    if (lrmoe_plan_alloc(&t, E, o->P) == 0 && lrmoe_plan_lrmoe(&q, load, E, base, &t) == 0)
        snprintf(more + n, len - n, "; rate %.2f would fit", q.rates[t.rate_index]);
    else
        snprintf(more + n, len - n, "; no rate down to %.2f fits", q.rates[q.nrates - 1]);
    lrmoe_plan_free(&t);
}

/* The scratch plans of lrmoe_plan_lrmoe, kept per thread from one call to
 * the next: planning frame after frame then neither allocates nor faults in
 * six [E,P] plans each time. They are freed when the thread ends (a
 * thread-specific key's destructor), or earlier by
 * lrmoe_plan_thread_cleanup; a nested call (explain) uses plans of its own. */
typedef struct {
    lrmoe_plan_t base[3]; /* the baselines at rate 1: fixed, llep, eplb */
    lrmoe_plan_t cand;    /* the candidate being evaluated */
    lrmoe_plan_t any;     /* the any slot's plan (--longer-backward, best effort) */
    lrmoe_plan_t chain;   /* the plan of the last chain rate that fit */
} scratch_t;

static _Thread_local scratch_t scratch;
static _Thread_local int scratch_ready, scratch_busy;
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_ok;

static void scratch_init(scratch_t *s)
{
    for (int i = 0; i < 3; i++)
        lrmoe_plan_init(&s->base[i]);
    lrmoe_plan_init(&s->cand);
    lrmoe_plan_init(&s->any);
    lrmoe_plan_init(&s->chain);
}

static void scratch_free(scratch_t *s)
{
    for (int i = 0; i < 3; i++)
        lrmoe_plan_free(&s->base[i]);
    lrmoe_plan_free(&s->cand);
    lrmoe_plan_free(&s->any);
    lrmoe_plan_free(&s->chain);
}

void lrmoe_plan_lrmoe_thread_cleanup(void)
{
    if (scratch_ready)
        scratch_free(&scratch);
    scratch_ready = 0;
}

static void scratch_exit(void *unused)
{
    (void)unused;
    lrmoe_plan_lrmoe_thread_cleanup();
}

static void scratch_key_make(void)
{
    scratch_key_ok = pthread_key_create(&scratch_key, scratch_exit) == 0;
}

/* The scratch plans of a call: the thread's (*kept = 1: scratch_give hands
 * them back), or in a nested call fresh ones in own. */
static scratch_t *scratch_take(scratch_t *own, int *kept)
{
    *kept = !scratch_busy;
    if (!*kept) {
        scratch_init(own);
        return own;
    }
    if (!scratch_ready) { /* the thread's exit frees them */
        pthread_once(&scratch_once, scratch_key_make);
        if (scratch_key_ok)
            pthread_setspecific(scratch_key, &scratch);
        scratch_init(&scratch);
    }
    scratch_ready = scratch_busy = 1;
    return &scratch;
}

static void scratch_give(scratch_t *s, int kept)
{
    if (kept)
        scratch_busy = 0;
    else
        scratch_free(s);
}

/* What lrmoe_plan_lrmoe keeps over its rates besides the planner state:
 * lrmoe's own placement, the forward candidates and the messages of the
 * rates tried. */
typedef struct {
    scratch_t *sp;              /* the call's scratch plans */
    int extra;                  /* slots per rank beyond the natives */
    int cached;                 /* the forward candidates in cands serve every
                                   rate (above GREEDY_MAX_P ranks) */
    int64_t *lo, *K;            /* the rate's floors, proportional quotas */
    uint8_t *pl;                /* lrmoe's own placement */
    int *add_expert, *add_rank; /* its replicas, in the order added */
    fwd_cand_t *cands;          /* forward candidates of every rate */
    fwd_cand_t *rate_cands;     /* the rate's own (when not cached; they
                                   lie inside cands' allocation) */
    int ncands, nrate_cands;    /* their counts */
    int cands_cap;              /* the entries of cands' allocation */
    lrmoe_plan_t *anyp;         /* the any slot's plan, or NULL */
    lrmoe_plan_t *chain;        /* the plan of the last chain rate that fit */
    char why[480];              /* why the last user rate tried failed */
    char why1[400];             /* why the first user rate failed */
    char alt_why[480];          /* why the rate of the any slot's plan did */
    int alt_ri;                 /* that rate (the user's index), or -1 */
} search_t;
_Static_assert(sizeof ((search_t *)0)->alt_why < sizeof ((lrmoe_plan_t *)0)->binding,
               "take_longer copies alt_why whole into binding");

static int search_alloc(search_t *s, int E, int P)
{
    const int nown = own_count(s->extra * P);
    s->lo = malloc((size_t)E * sizeof *s->lo);
    s->K = malloc((size_t)E * sizeof *s->K);
    s->pl = malloc((size_t)E * P);
    s->add_expert = malloc(((size_t)s->extra * P + 1) * sizeof(int));
    s->add_rank = malloc(((size_t)s->extra * P + 1) * sizeof(int));
    s->cands_cap = 2 * nown + 7;
    s->cands = calloc((size_t)s->cands_cap, sizeof *s->cands);
    if (!s->lo || !s->K || !s->pl || !s->add_expert || !s->add_rank || !s->cands)
        return -1;
    s->rate_cands = s->cands + nown + 7;
    return 0;
}

static void search_free(search_t *s)
{
    for (int i = 0; s->cands && i < s->cands_cap; i++)
        fwd_cand_free(&s->cands[i]);
    free(s->cands);
    free(s->lo);
    free(s->K);
    free(s->pl);
    free(s->add_expert);
    free(s->add_rank);
}

/* The floors lo_e = ceil(min_keep n_e) within [0, n_e]; returns their sum. */
static int64_t keep_floors(double min_keep, const int64_t *load, int E, int64_t *lo)
{
    int64_t sum = 0;
    for (int e = 0; e < E; e++) {
        int64_t l = (int64_t)ceil(min_keep * (double)load[e] - 1e-9);
        lo[e] = l > load[e] ? load[e] : (l < 0 ? 0 : l);
        sum += lo[e];
    }
    return sum;
}

/* Pairs retained at rate rho of N. */
static int64_t rate_total(double rho, int64_t N)
{
    return rho >= 1.0 ? N : (int64_t)floor(rho * (double)N + 1e-9);
}

/* lrmoe's own placement at c's rate into s->pl: the natives, plus the
 * replicas place_replicas adds (recorded in s->add_expert, s->add_rank)
 * for fixed quotas K (NULL: the loads) or free ones (bwd_free). Returns the
 * replicas added, or -1. */
static int own_placement(const plan_state_t *c, search_t *s, const int64_t *K, int bwd_free)
{
    greedy_ctx_t g = {c->load, s->lo, K, c->total, c->N, c->E, c->P, bwd_free, NULL, NULL, NULL};
    memset(s->pl, 0, (size_t)c->E * c->P);
    for (int e = 0; e < c->E; e++)
        s->pl[(size_t)e * c->P + e / c->per] = 1;
    return place_replicas(&g, s->extra, s->pl, s->add_expert, s->add_rank);
}

/* The baselines at rate 1 (fixed, llep, eplb by base, every pair kept),
 * evaluated into bl; the best of them (the lowest t_total of those that
 * fit, of all when none does; then the least forward peak) is what lrmoe
 * must not lose to: c->ref_t, c->ref_pk. 0 or -1. */
static int plan_baselines(plan_state_t *c, plan_base_fn base, lrmoe_plan_t *bl)
{
    static const lrmoe_planner_t planners[3] = {LRMOE_PLANNER_FIXED, LRMOE_PLANNER_LLEP,
                                                LRMOE_PLANNER_EPLB};
    const int E = c->E, P = c->P;
    const int64_t *load = c->load;
    int ref_fits = 0;
    c->ref_t = HUGE_VAL;
    c->ref_pk = INT64_MAX;
    for (int i = 0; i < 3; i++) {
        lrmoe_plan_opts_t ob = *c->o;
        ob.planner = planners[i];
        if (lrmoe_plan_alloc(&bl[i], E, P) < 0)
            return -1;
        if (base(&ob, load, E, &bl[i]) < 0)
            return -1;
        memcpy(bl[i].quota, load, (size_t)E * sizeof *load);
        memcpy(bl[i].bwd_alloc, bl[i].fwd_alloc, (size_t)E * P * sizeof(int64_t));
        if (lrmoe_plan_cost(&ob, &bl[i], load, NULL) < 0)
            return -1;
        lrmoe_plan_summarise(&bl[i], load);
        char w[200];
        const int fits = lrmoe_plan_fits(c->o, &bl[i], w, sizeof w);
        if ((fits && !ref_fits) || (fits == ref_fits && (bl[i].t_total < c->ref_t ||
                                    (bl[i].t_total == c->ref_t && bl[i].fwd_peak < c->ref_pk)))) {
            c->ref_t = bl[i].t_total;
            c->ref_pk = bl[i].fwd_peak;
            ref_fits = fits;
        }
    }
    return 0;
}

/* The forward candidates built before the rates (s->cands): above
 * GREEDY_MAX_P ranks the replica search works on the loads alone, so
 * lrmoe's own placements (and the baselines') are the same at every rate,
 * and are offered at rate 1 as they are built (c->pre1); below it the
 * greedy objective weighs the rate's quotas, and lrmoe's own candidates
 * are made per rate (try_rate). Then the baselines'. 0 or -1. */
static int first_candidates(plan_state_t *c, search_t *s, const lrmoe_plan_t *bl)
{
    static const char *const names[3] = {"fixed", "llep", "eplb"};
    c->pre1 = s->cached;
    if (c->pre1) { /* the state of rate 1, as try_rate sets it */
        keep_floors(c->o->min_keep, c->load, c->E, s->lo);
        c->total = c->N;
        c->rho = 1.0;
    }
    if (s->cached) {
        const int nadded = own_placement(c, s, NULL, 0);
        if (nadded < 0 ||
            own_candidates(c, s->pl, nadded, s->add_expert, s->add_rank, s->cands, &s->ncands) < 0)
            return -1;
    }
    for (int i = 0; i < 3; i++)
        if (fwd_candidates(c, &bl[i], NULL, names[i], s->cands, &s->ncands) < 0)
            return -1;
    return 0;
}

/* The rates searched, in decreasing order, into rates: the user's, and the
 * chain's (user_index -1: 1, 0.9, 0.8, ... down to the user's last rate, where the
 * user has not given them) whose plans are not returned but bound the
 * rates below them; user_index: the user's index of each. Rate 1 comes first, the
 * user's or the chain's. Returns their count. */
static int rate_list(const lrmoe_plan_opts_t *o, double *rates, int *user_index)
{
    int n = 0, u = 0;
    for (int g = 10; g >= 1 && g / 10.0 >= o->rates[o->nrates - 1] - 1e-9; g--) {
        for (; u < o->nrates && o->rates[u] > g / 10.0 + 1e-9; u++) {
            rates[n] = o->rates[u];
            user_index[n++] = u;
        }
        if (u < o->nrates && o->rates[u] >= g / 10.0 - 1e-9) {
            rates[n] = o->rates[u];
            user_index[n++] = u++;
        } else {
            rates[n] = g / 10.0;
            user_index[n++] = -1;
        }
    }
    for (; u < o->nrates; u++) {
        rates[n] = o->rates[u];
        user_index[n++] = u;
    }
    return n;
}

/* After a chain rate: its plan p, when one fits, is the anchor of the
 * rates below (kept in s->chain, offered scaled down to them); rate 1's
 * placement and forward join the candidates (unless one of them is it
 * already). The messages stay those of the user's rates. 0 or -1. */
static int chain_rate_done(plan_state_t *c, search_t *s, const lrmoe_plan_t *p)
{
    if (c->strict.have) {
        if (!s->chain) {
            s->chain = &s->sp->chain;
            if (lrmoe_plan_alloc(s->chain, c->E, c->P) < 0)
                return -1;
        }
        plan_copy(s->chain, p); /* its summary and source too */
        c->have_anchor = 1;
        c->anchor_t = p->t_total;
        c->anchor_b = t_bwd_of(&p->cost);
        if (c->total == c->N) {
            char name[40];
            snprintf(name, sizeof name, "%.*s", (int)strcspn(p->source, "/"), p->source);
            plan_copy(c->cand, p);
            if (fwd_cand_take(c, s->cands, &s->ncands, name, p->fwd_lb) < 0)
                return -1;
        }
    }
    s->why[0] = 0;
    if (c->total == c->N)
        c->min_mem1 = HUGE_VAL;
    return 0;
}

/* After the user's rate ui (rho): 1 when its plan wins (p is the result),
 * else 0 with the explanation of the miss in s->why (and s->why1 at the
 * first rate) and, with --longer-backward, the first rate whose any slot
 * holds a plan noted (s->alt_ri). */
static int user_rate_done(plan_state_t *c, search_t *s, lrmoe_plan_t *p, double rho, int ui)
{
    if (c->strict.have) {
        p->feasible = 1;
        p->rate_index = ui;
        snprintf(p->binding, sizeof p->binding, "%s", s->why);
        return 1;
    }
    if (c->allow_longer && c->any.have) {
        s->alt_ri = ui;
        snprintf(s->alt_why, sizeof s->alt_why, "%s", s->why1[0] ? s->why1 : s->why);
    }
    if (c->longer_fits)
        snprintf(s->why, sizeof s->why,
                 "rate %.3f: every plan that drops pairs and fits would lengthen the "
                 "modelled backward", rho);
    else if (c->why[0])
        snprintf(s->why, sizeof s->why, "rate %.3f: %s", rho, c->why);
    if (ui == 0)
        snprintf(s->why1, sizeof s->why1, "%.*s", (int)sizeof s->why1 - 1, s->why);
    return 0;
}

/* One rate of the search (ui: the user's index, -1 a chain rate; done: its
 * candidates in cands were offered as they were built): floors and quotas,
 * lrmoe's own candidates (when not cached), the chain's plan scaled down,
 * every backward of every forward candidate. Returns 1 when this rate's
 * plan is the result (in p), 0 to go on, -1 on error. */
static int try_rate(plan_state_t *c, search_t *s, lrmoe_plan_t *p, double rho, int ui, int done)
{
    const lrmoe_plan_opts_t *o = c->o;
    const int E = c->E;
    const int64_t N = c->N, total = rate_total(rho, N);
    const int64_t slo = keep_floors(o->min_keep, c->load, E, s->lo);
    if (slo > total) {
        snprintf(s->why, sizeof s->why,
                 "min-keep: rate %.3f allows %lld retained pairs, min-keep %.3f needs %lld",
                 rho, (long long)total, o->min_keep, (long long)slo);
        return 0;
    }
    c->total = total;
    c->rho = rho;
    if (!done) {
        c->strict.have = 0;
        c->why[0] = 0;
        c->longer_fits = 0;
    }
    c->allow_longer = o->longer_bwd && s->alt_ri < 0;
    if (c->allow_longer)
        c->any.have = 0;
    const int prop = total < N && o->quota == LRMOE_QUOTA_PROPORTIONAL;
    if (total < N && (prop || o->quota == LRMOE_QUOTA_EVEN))
        quota_proportional(c->load, s->lo, E, rho, total, s->K);
    const int64_t *Kq = prop ? s->K : NULL;
    c->kprop = total < N && o->quota == LRMOE_QUOTA_EVEN ? s->K : NULL;
    if (!s->cached) { /* lrmoe's own placement at this rate */
        const int nadded = own_placement(c, s, Kq, total < N && !prop);
        if (nadded < 0 ||
            own_candidates(c, s->pl, nadded, s->add_expert, s->add_rank, s->rate_cands,
                           &s->nrate_cands) < 0)
            return -1;
    }
    /* the chain's plan above, scaled down: first, so that its t_total
     * bounds the search of the others early (peak_cap) */
    if (s->chain && total < N && offer_scaled(c, s->chain) < 0)
        return -1;
    for (int i = 0; i < s->nrate_cands; i++)
        if (try_backwards(c, Kq, &s->rate_cands[i]) < 0)
            return -1;
    for (int i = 0; i < s->ncands && !done; i++)
        if (try_backwards(c, Kq, &s->cands[i]) < 0)
            return -1;
    for (; s->nrate_cands > 0; s->nrate_cands--)
        fwd_cand_free(&s->rate_cands[s->nrate_cands - 1]);
    if (ui < 0) /* a chain rate: its plan is the anchor from here on */
        return chain_rate_done(c, s, p) < 0 ? -1 : 0;
    return user_rate_done(c, s, p, rho, ui);
}

/* The rates in decreasing order: the first user rate with a fitting plan
 * whose modelled backward is no longer than keeping every pair (nor, below
 * rate 1, its t_total or backward than the plan of the rate above it in
 * the chain, the anchor) wins; with --longer-backward, when no rate has
 * one, the first rate below 1 with any fitting plan (kept in the any slot
 * while the search goes on). A chain rate's plan that fits becomes the
 * anchor of the rates below it, and is offered scaled down to each of them
 * (offer_scaled): so every rate below has a plan, and none is slower in
 * t_total or backward than the plans of the chain rates above it. The
 * placement and forward of rate 1's plan join the candidates of every rate
 * (cands). Returns 1 when a rate's plan is in p, 0 when none won, -1. */
static int search_rates(plan_state_t *c, search_t *s, lrmoe_plan_t *p)
{
    double rates[LRMOE_PLAN_MAX_RATES + 10];
    int user_index[LRMOE_PLAN_MAX_RATES + 10];
    const int nrates_tried = rate_list(c->o, rates, user_index);
    const int pre1 = c->pre1;
    c->pre1 = 0;
    for (int ri = 0; ri < nrates_tried; ri++) {
        const int r = try_rate(c, s, p, rates[ri], user_index[ri], ri == 0 && pre1);
        if (r)
            return r;
    }
    return 0;
}

/* No plan that drops pairs keeps the modelled backward: the any slot's
 * plan, at the first rate that had one. */
static void take_longer(const search_t *s, lrmoe_plan_t *p)
{
    plan_copy(p, s->anyp);
    snprintf(p->source, sizeof p->source, "%s", s->anyp->source);
    snprintf(p->planner, sizeof p->planner, "lrmoe");
    p->feasible = 1;
    p->rate_index = s->alt_ri;
    /* s->alt_why is shorter than binding: the note is cut where binding ends */
    const size_t n = strlen(s->alt_why);
    memcpy(p->binding, s->alt_why, n);
    snprintf(p->binding + n, sizeof p->binding - n, "%s", "; no plan that drops pairs keeps "
             "the modelled backward within that of keeping them all");
}

/* Best effort when no rate fits: the last rate (at least its floors),
 * budgets ignored, lrmoe's own placement, any backward; p->feasible = 0.
 * 0 or -1. */
static int best_effort(plan_state_t *c, search_t *s, lrmoe_plan_t *p)
{
    const lrmoe_plan_opts_t *o = c->o;
    const int E = c->E;
    const int64_t N = c->N;
    const int ri = o->nrates - 1;
    const double rho = o->rates[ri];
    int64_t total = rate_total(rho, N);
    const int64_t slo = keep_floors(o->min_keep, c->load, E, s->lo);
    if (slo > total)
        total = slo;
    if (!s->anyp) {
        s->anyp = &s->sp->any;
        if (lrmoe_plan_alloc(s->anyp, E, c->P) < 0)
            return -1;
    }
    lrmoe_plan_opts_t ob = *o;
    ob.cost.hbm = 0;
    ob.cost.window = 0;
    c->o = &ob;
    c->total = total;
    c->rho = rho;
    c->strict.have = c->any.have = 0;
    c->have_anchor = 0; /* budgets ignored: nothing to bound */
    c->any.p = s->anyp;
    c->allow_longer = 1;
    c->kprop = NULL;
    const int prop = total < N && o->quota == LRMOE_QUOTA_PROPORTIONAL;
    if (prop)
        quota_proportional(c->load, s->lo, E, rho, total, s->K);
    int rc = 0;
    if (!s->cached) {
        const int nadded = own_placement(c, s, prop ? s->K : NULL, total < N && !prop);
        if (nadded < 0 ||
            fwd_candidates(c, NULL, s->pl, "lrmoe", s->rate_cands, &s->nrate_cands) < 0)
            rc = -1;
    }
    if (!rc &&
        try_backwards(c, prop ? s->K : NULL, s->cached ? &s->cands[0] : &s->rate_cands[0]) < 0)
        rc = -1;
    c->o = o;
    if (rc < 0)
        return -1;
    if (c->any.have) {
        plan_copy(p, s->anyp);
        snprintf(p->source, sizeof p->source, "%s", s->anyp->source);
        snprintf(p->planner, sizeof p->planner, "lrmoe");
    }
    if (lrmoe_plan_cost(o, p, c->load, NULL) < 0)
        return -1;
    p->feasible = 0;
    p->rate_index = ri;
    snprintf(p->binding, sizeof p->binding, "%s", s->why);
    return 0;
}

int lrmoe_plan_lrmoe(const lrmoe_plan_opts_t *o, const int64_t *load, int E, plan_base_fn base,
               lrmoe_plan_t *p)
{
    const int P = o->P;
    int64_t N = 0;
    for (int e = 0; e < E; e++)
        N += load[e];
    int kept;
    scratch_t own;
    scratch_t *sp = scratch_take(&own, &kept);
    plan_state_t c;
    memset(&c, 0, sizeof c);
    search_t s;
    memset(&s, 0, sizeof s);
    s.sp = sp;
    s.extra = extra_slots(o, E, N);
    s.cached = P > GREEDY_MAX_P;
    s.alt_ri = -1;
    c.exhaustive = plan_exhaustive();
    c.cand = &sp->cand;
    c.o = o;
    c.load = load;
    c.E = E;
    c.P = P;
    c.per = E / P;
    c.N = N;
    c.min_mem1 = HUGE_VAL;
    c.strict.p = p;
    int rc = -1;
    if (search_alloc(&s, E, P) < 0 || lrmoe_plan_alloc(c.cand, E, P) < 0) {
        lrmoe_err("lrmoe: out of memory");
        goto out;
    }
    c.lo = s.lo;
    if (plan_baselines(&c, base, sp->base) < 0 || first_candidates(&c, &s, sp->base) < 0)
        goto out;
    if (o->longer_bwd) {
        s.anyp = &sp->any;
        if (lrmoe_plan_alloc(s.anyp, E, P) < 0)
            goto out;
    }
    c.any.p = s.anyp;
    int found = search_rates(&c, &s, p);
    if (found < 0)
        goto out;
    if (!found && s.alt_ri >= 0) {
        take_longer(&s, p);
        found = 1;
    }
    if (!found && !o->best_effort) {
        char more[200] = "";
        if (o->explain)
            explain(o, load, E, base, c.min_mem1, more, sizeof more);
        lrmoe_err("infeasible at every rate (%d tried): %s%s%s", o->nrates, s.why,
                  strstr(s.why, "lengthen") ? " (--longer-backward allows it)" : "", more);
        goto out;
    }
    if (!found && best_effort(&c, &s, p) < 0)
        goto out;
    p->glpk_seconds = c.glpk;
    rc = 0;
out:
    search_free(&s);
    scratch_give(sp, kept);
    return rc;
}
