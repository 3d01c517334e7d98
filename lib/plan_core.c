/* The plan struct and what every planner shares below the dispatch
 * (lib/plan.c): allocation, the consistency check, the summary (peaks,
 * replicas, rho), the cost model's evaluation, the budget check and the
 * fixed (plain EP) plan. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "plan_internal.h"

/* ---------------------------------------------------------------- struct */

void lrmoe_plan_init(lrmoe_plan_t *p)
{
    memset(p, 0, sizeof *p);
    p->rate_index = -1;
}

void lrmoe_plan_free(lrmoe_plan_t *p)
{
    free(p->placement);
    free(p->fwd_alloc);
    free(p->quota);
    free(p->bwd_alloc);
    free(p->rank);
    free(p->held);
    free(p->wsend);
    free(p->wrecv);
    lrmoe_plan_init(p);
}

int lrmoe_plan_alloc(lrmoe_plan_t *p, int E, int P)
{
    if (E > 0 && P > 0 && p->E == E && p->P == P && p->placement && p->fwd_alloc &&
        p->quota && p->bwd_alloc && p->rank && p->held && p->wsend && p->wrecv) {
        /* same shape (a scratch plan reused frame after frame): keep the
         * arrays, zero them and the summary; no allocator churn */
        lrmoe_plan_t keep = *p;
        const size_t n = (size_t)E * (size_t)P;
        lrmoe_plan_init(p);
        p->E = E;
        p->P = P;
        p->placement = keep.placement;
        p->fwd_alloc = keep.fwd_alloc;
        p->quota = keep.quota;
        p->bwd_alloc = keep.bwd_alloc;
        p->rank = keep.rank;
        p->held = keep.held;
        p->wsend = keep.wsend;
        p->wrecv = keep.wrecv;
        memset(p->held, 0, (size_t)P * sizeof *p->held);
        memset(p->wsend, 0, (size_t)P * sizeof *p->wsend);
        memset(p->wrecv, 0, (size_t)P * sizeof *p->wrecv);
        memset(p->placement, 0, n);
        memset(p->fwd_alloc, 0, n * sizeof(int64_t));
        memset(p->quota, 0, (size_t)E * sizeof(int64_t));
        memset(p->bwd_alloc, 0, n * sizeof(int64_t));
        memset(p->rank, 0, (size_t)P * sizeof(lrmoe_rank_cost_t));
        return 0;
    }
    lrmoe_plan_free(p);
    if (E <= 0 || P <= 0)
        return lrmoe_err("plan: bad shape %d x %d", E, P);
    size_t n = (size_t)E * (size_t)P;
    p->E = E;
    p->P = P;
    p->placement = calloc(n, 1);
    p->fwd_alloc = calloc(n, sizeof(int64_t));
    p->quota = calloc((size_t)E, sizeof(int64_t));
    p->bwd_alloc = calloc(n, sizeof(int64_t));
    p->rank = calloc((size_t)P, sizeof(lrmoe_rank_cost_t));
    p->held = calloc((size_t)P, sizeof *p->held);
    p->wsend = calloc((size_t)P, sizeof *p->wsend);
    p->wrecv = calloc((size_t)P, sizeof *p->wrecv);
    if (!p->placement || !p->fwd_alloc || !p->quota || !p->bwd_alloc || !p->rank || !p->held ||
        !p->wsend || !p->wrecv) {
        lrmoe_plan_free(p);
        return lrmoe_err("plan: out of memory");
    }
    return 0;
}

/* ---------------------------------------------------------------- check */

int lrmoe_plan_check(const lrmoe_plan_t *p, const int64_t *load)
{
    if (!p || p->E <= 0 || p->P <= 0 || !p->placement || !p->fwd_alloc || !p->quota ||
        !p->bwd_alloc)
        return lrmoe_err("plan: empty");
    const int E = p->E, P = p->P;
    if (E % P)
        return lrmoe_err("plan: %d ranks do not divide %d experts", P, E);
    const int per = E / P;
    for (int e = 0; e < E; e++) {
        int64_t fs = 0, bs = 0;
        const int nat = e / per;
        if (p->placement[(size_t)e * P + nat] != 1)
            return lrmoe_err("placement[%d,%d]: native rank does not hold expert %d", e, nat, e);
        for (int q = 0; q < P; q++) {
            size_t i = (size_t)e * P + q;
            const int skip = plan_skip(p, i, q, P);
            if (skip) { /* sparse: nothing held, nothing to check or sum */
                q += skip - 1;
                continue;
            }
            if (p->placement[i] > 1)
                return lrmoe_err("placement[%d,%d]: %u is not 0 or 1", e, q, p->placement[i]);
            if (p->fwd_alloc[i] < 0)
                return lrmoe_err("fwd_alloc[%d,%d]: negative (%lld)", e, q,
                                 (long long)p->fwd_alloc[i]);
            if (p->bwd_alloc[i] < 0)
                return lrmoe_err("bwd_alloc[%d,%d]: negative (%lld)", e, q,
                                 (long long)p->bwd_alloc[i]);
            if (!p->placement[i] && p->fwd_alloc[i])
                return lrmoe_err("fwd_alloc[%d,%d]: %lld pairs on a rank without expert %d", e,
                                 q, (long long)p->fwd_alloc[i], e);
            if (!p->placement[i] && p->bwd_alloc[i])
                return lrmoe_err("bwd_alloc[%d,%d]: %lld pairs on a rank without expert %d", e,
                                 q, (long long)p->bwd_alloc[i], e);
            if (p->fwd_alloc[i] > INT64_MAX / 4 || p->bwd_alloc[i] > INT64_MAX / 4)
                return lrmoe_err("alloc[%d,%d]: absurd count", e, q);
            if (__builtin_add_overflow(fs, p->fwd_alloc[i], &fs) ||
                __builtin_add_overflow(bs, p->bwd_alloc[i], &bs))
                return lrmoe_err("alloc[%d,:]: sums past 2^63-1", e);
        }
        const int64_t n = load ? load[e] : fs;
        if (n < 0)
            return lrmoe_err("expert_load[%d]: negative (%lld)", e, (long long)n);
        if (fs != n)
            return lrmoe_err("fwd_alloc[%d,:]: sums to %lld, expert load is %lld", e,
                             (long long)fs, (long long)n);
        if (p->quota[e] < 0 || p->quota[e] > n)
            return lrmoe_err("quota[%d]: %lld is outside [0,%lld]", e, (long long)p->quota[e],
                             (long long)n);
        if (bs != p->quota[e])
            return lrmoe_err("bwd_alloc[%d,:]: sums to %lld, quota is %lld", e, (long long)bs,
                             (long long)p->quota[e]);
    }
    return 0;
}

/* ---------------------------------------------------------------- common */

/* The summary of p (N, rho, peaks, replicas, mean_ceil) from the rows of
 * its cost evaluation: p->rank, filled by plan_cost, holds each rank's
 * forward and backward rows and replicas, so the [E,P] arrays are not
 * scanned again. */
void lrmoe_plan_summarise(lrmoe_plan_t *p, const int64_t *load)
{
    int64_t K = 0;
    p->N = 0;
    for (int e = 0; e < p->E; e++) {
        p->N += load[e];
        K += p->quota[e];
    }
    p->replicas = 0;
    p->fwd_peak = p->bwd_peak = 0;
    for (int q = 0; q < p->P; q++) {
        const lrmoe_rank_cost_t *r = &p->rank[q];
        p->replicas += (int)r->replicas;
        if (r->fwd_rows > p->fwd_peak)
            p->fwd_peak = r->fwd_rows;
        if (r->bwd_rows > p->bwd_peak)
            p->bwd_peak = r->bwd_rows;
    }
    p->rho = p->N ? (double)K / (double)p->N : 1.0;
    p->mean_ceil = (p->N + p->P - 1) / p->P;
}

/* The cost model of plan p (its slots and keep rule); placed: p's
 * allocations lie on its placement (lrmoe_cost_eval_placed). */
static int eval_cost(const lrmoe_cost_model_t *m, const lrmoe_plan_t *p, const int64_t *load,
                     lrmoe_rank_cost_t *rank, lrmoe_cost_summary_t *sum, int placed)
{
    const lrmoe_cost_slots_t sl = {p->held, p->wsend, p->wrecv};
    lrmoe_cost_model_t mk = *m;
    mk.keep_by_rank = m->keep_by_rank || p->keep_by_rank;
    /* a capacity plan drops the pairs above capacity in forward too: its
     * forward rows and loads are the kept pairs (bwd_alloc, quota), while
     * fwd_alloc lists every pair (lrmoe-plan(1), CAPACITY) */
    const int capped = !strcmp(p->planner, "capacity");
    return (placed ? lrmoe_cost_eval_placed : lrmoe_cost_eval_slots)(
        &mk, p->E, p->P, p->placement, capped ? p->quota : load,
        capped ? p->bwd_alloc : p->fwd_alloc, p->quota, p->bwd_alloc,
        p->have_slots ? &sl : NULL, rank, sum);
}

int lrmoe_plan_eval_cost(const lrmoe_cost_model_t *m, const lrmoe_plan_t *p,
                         const int64_t *load, lrmoe_rank_cost_t *rank,
                         lrmoe_cost_summary_t *sum)
{
    return eval_cost(m, p, load, rank, sum, 0);
}

/* Evaluate the cost model for p, a plan a planner built (its allocations
 * lie on its placement: lrmoe_cost_eval_placed), and fill the summary figures. */
int lrmoe_plan_cost(const lrmoe_plan_opts_t *o, lrmoe_plan_t *p, const int64_t *load,
              lrmoe_cost_summary_t *s)
{
    lrmoe_cost_summary_t tmp;
    if (!s)
        s = &tmp;
    if (eval_cost(&o->cost, p, load, p->rank, s, 1) < 0)
        return -1;
    p->cost = *s;
    p->have_cost = 1;
    p->mem_peak = s->mem_peak;
    p->mem_peak_rank = s->mem_peak_rank;
    p->t_comm = s->t_comm;
    p->t_total = s->t_total;
    return 0;
}

/* Describe what binds for plan p against the budgets; returns 1 if it fits.
 * Memory: the rank, its need split into replicas, forward buffers, saved
 * state and backward payloads, and the budget, in adaptive units. */
int lrmoe_plan_fits(const lrmoe_plan_opts_t *o, const lrmoe_plan_t *p, char *why, size_t len)
{
    if (!why) /* the answer only */
        return !(o->cost.hbm > 0 && p->mem_peak > o->cost.hbm) &&
               !(o->cost.window > 0 && p->t_comm > o->cost.window);
    if (o->cost.hbm > 0 && p->mem_peak > o->cost.hbm) {
        char a[24], b[24], r[24], f[24], s[24], w[24];
        const lrmoe_rank_cost_t *k = p->have_cost && p->rank ? &p->rank[p->mem_peak_rank] : NULL;
        if (k)
            snprintf(why, len,
                     "memory: rank %d needs %s (replicas %s, forward buffers %s, saved state "
                     "%s, backward payloads %s), budget %s",
                     p->mem_peak_rank, lrmoe_cost_fmt_bytes(p->mem_peak, a, sizeof a),
                     lrmoe_cost_fmt_bytes(k->mem_replica, r, sizeof r),
                     lrmoe_cost_fmt_bytes(k->mem_fwd, f, sizeof f),
                     lrmoe_cost_fmt_bytes(k->mem_saved, s, sizeof s),
                     lrmoe_cost_fmt_bytes(k->mem_bwd, w, sizeof w),
                     lrmoe_cost_fmt_bytes(o->cost.hbm, b, sizeof b));
        else
            snprintf(why, len, "memory: rank %d needs %s, budget %s", p->mem_peak_rank,
                     lrmoe_cost_fmt_bytes(p->mem_peak, a, sizeof a),
                     lrmoe_cost_fmt_bytes(o->cost.hbm, b, sizeof b));
        return 0;
    }
    if (o->cost.window > 0 && p->t_comm > o->cost.window) {
        snprintf(why, len, "window: all-to-all needs %.3f ms, window %.3f ms", p->t_comm * 1e3,
                 o->cost.window * 1e3);
        return 0;
    }
    why[0] = 0;
    return 1;
}

int lrmoe_plan_fixed(const lrmoe_plan_opts_t *o, const int64_t *load, int E, lrmoe_plan_t *p)
{
    (void)o;
    const int P = p->P, per = E / P;
    for (int e = 0; e < E; e++) {
        size_t i = (size_t)e * P + e / per;
        p->placement[i] = 1;
        p->fwd_alloc[i] = load[e];
    }
    return 0;
}

