/* Plans: options, frame I/O and the planner dispatch (lrmoe_plan_compute).
 * Below it: the planners (plan_llep.c, plan_eplb.c, plan_lrmoe.c), the
 * shared struct, summary and cost (plan_core.c) and the min-peak solver
 * (minpeak.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plan.h"
#include "plan_internal.h"
#include "minpeak_internal.h"
#include "clock.h"

void lrmoe_plan_opts_default(lrmoe_plan_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->planner = LRMOE_PLANNER_LRMOE;
    o->P = 8;
    o->nodes = 1;
    o->groups = 0;
    o->slots = 0;
    o->lambda = 1.3;
    o->alpha = 1.0;
    o->min_chunk = 1024;
    o->nrates = 4;
    o->rates[0] = 1.0;
    o->rates[1] = 0.9;
    o->rates[2] = 0.8;
    o->rates[3] = 0.7;
    o->quota = LRMOE_QUOTA_EVEN;
    o->min_keep = 0.25;
    o->best_effort = 0;
    o->rebalance_every = 3000;
    o->explain = 1;
    o->glpk_tm_lim = 10.0;
    o->capacity_factor_e6 = 1000000;
    o->capacity_policy = LRMOE_CAPACITY_PROBS;
    lrmoe_cost_default(&o->cost);
}

static const char *const planner_names[] = {"fixed", "llep", "eplb", "lrmoe", "capacity"};
#define NPLANNERS (int)(sizeof planner_names / sizeof planner_names[0])

int lrmoe_planner_parse(const char *s, lrmoe_planner_t *out)
{
    for (int i = 0; i < NPLANNERS; i++)
        if (s && !strcmp(s, planner_names[i])) {
            *out = (lrmoe_planner_t)i;
            return 0;
        }
    return lrmoe_err("unknown planner '%s' (fixed, llep, eplb, lrmoe, capacity)", s ? s : "");
}

const char *lrmoe_planner_name(lrmoe_planner_t p)
{
    return (unsigned)p < (unsigned)NPLANNERS ? planner_names[p] : "?";
}

int lrmoe_plan_set_capacity_factor(lrmoe_plan_opts_t *o, double f)
{
    if (!(f > 0) || !(f <= 2147.483647))
        return lrmoe_err("capacity factor %g is outside (0,2147.483647]", f);
    const double m = nearbyint(f * 1e6);
    /* m / 1e6 is the double nearest the decimal m * 10^-6 (one correctly
     * rounded division), so it equals f exactly when f was written with at
     * most six decimals */
    if (m < 1 || m / 1e6 != f)
        return lrmoe_err("capacity factor %.17g has more than six decimals", f);
    o->capacity_factor_e6 = (int32_t)m;
    return 0;
}

double lrmoe_plan_capacity_factor(const lrmoe_plan_opts_t *o)
{
    return (double)o->capacity_factor_e6 / 1e6;
}

int lrmoe_quota_parse(const char *s, lrmoe_quota_policy_t *out)
{
    if (s && !strcmp(s, "minpeak")) {
        *out = LRMOE_QUOTA_MINPEAK;
        return 0;
    }
    if (s && !strcmp(s, "proportional")) {
        *out = LRMOE_QUOTA_PROPORTIONAL;
        return 0;
    }
    if (s && !strcmp(s, "even")) {
        *out = LRMOE_QUOTA_EVEN;
        return 0;
    }
    return lrmoe_err("unknown quota policy '%s' (even, minpeak, proportional)", s ? s : "");
}

const char *lrmoe_quota_name(lrmoe_quota_policy_t q)
{
    return q == LRMOE_QUOTA_PROPORTIONAL ? "proportional" : q == LRMOE_QUOTA_EVEN ? "even" : "minpeak";
}

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

int lrmoe_plan_parse_rates(lrmoe_plan_opts_t *o, const char *s)
{
    int n = 0;
    const char *p = s;
    if (!s || !*s)
        return lrmoe_err("--rates: empty list");
    while (*p) {
        char *end;
        double v = strtod(p, &end);
        if (end == p || (*end && *end != ','))
            return lrmoe_err("--rates: '%s' is not a comma-separated list of numbers", s);
        if (!(v > 0 && v <= 1))
            return lrmoe_err("--rates: rate %g is outside (0,1]", v);
        if (n == LRMOE_PLAN_MAX_RATES)
            return lrmoe_err("--rates: more than %d rates", LRMOE_PLAN_MAX_RATES);
        o->rates[n++] = v;
        p = *end ? end + 1 : end;
        if (*end && !*p)
            return lrmoe_err("--rates: trailing comma in '%s'", s);
    }
    qsort(o->rates, (size_t)n, sizeof(double), cmp_desc);
    o->nrates = n;
    return 0;
}

int lrmoe_plan_opts_check(const lrmoe_plan_opts_t *o, int E)
{
    const lrmoe_cost_model_t *m = &o->cost;
    if (o->P <= 0)
        return lrmoe_err("ranks must be > 0 (got %d)", o->P);
    if (E == 0)
        return lrmoe_err("expert_load has no experts");
    if (E > LRMOE_PLAN_MAX_E || (E > 0 && (int64_t)E * o->P > LRMOE_PLAN_MAX_EP))
        return lrmoe_err("%d experts over %d ranks: above the planner's limits (%d experts, "
                         "%d expert x rank entries; a plan holds four [E,P] matrices)",
                         E, o->P, LRMOE_PLAN_MAX_E, LRMOE_PLAN_MAX_EP);
    if (E > 0 && E % o->P)
        return lrmoe_err("%d ranks do not divide %d experts", o->P, E);
    if (o->nodes <= 0 || o->P % o->nodes)
        return lrmoe_err("%d nodes do not divide %d ranks", o->nodes, o->P);
    if (o->slots < 0 || (E > 0 && o->slots && o->slots < E / o->P))
        return lrmoe_err("slots per rank %d is below the %d native experts", o->slots, E / o->P);
    if (!(o->lambda >= 0) || !(o->alpha > 0) || o->min_chunk < 0)
        return lrmoe_err("llep: need lambda >= 0, alpha > 0, m >= 0");
    if (o->rebalance_every < 0)
        return lrmoe_err("eplb: rebalance interval %d is negative", o->rebalance_every);
    if (o->capacity_factor_e6 <= 0)
        return lrmoe_err("capacity: factor %g must be > 0", lrmoe_plan_capacity_factor(o));
    if (o->capacity_policy != LRMOE_CAPACITY_PROBS && o->capacity_policy != LRMOE_CAPACITY_POSITION)
        return lrmoe_err("capacity: unknown drop policy %d", o->capacity_policy);
    if (o->nrates <= 0)
        return lrmoe_err("no candidate rates");
    for (int i = 0; i < o->nrates; i++)
        if (!(o->rates[i] > 0 && o->rates[i] <= 1))
            return lrmoe_err("rate %g is outside (0,1]", o->rates[i]);
    if (!(o->min_keep >= 0 && o->min_keep <= 1))
        return lrmoe_err("min-keep %g is outside [0,1]", o->min_keep);
    if (!(o->glpk_tm_lim > 0) || o->glpk_tm_lim > 3600)
        return lrmoe_err("GLPK time limit %g s is outside (0,3600]", o->glpk_tm_lim);
    if (m->D <= 0 || m->F <= 0 || m->K <= 0 || m->tokens < 0 || m->dtype_bytes <= 0 ||
        m->grad_bytes < 0)
        return lrmoe_err("cost model: D, F, K, dtype bytes must be > 0");
    if (!(m->hbm >= 0) || m->hbm > 1e18) {
        char b[32];
        return lrmoe_err("hbm budget %s is negative or absurd",
                         m->hbm > 1e18 ? lrmoe_cost_fmt_bytes(m->hbm, b, sizeof b)
                         : m->hbm != m->hbm ? "NaN" : "below 0");
    }
    if (!(m->window >= 0) || m->window > 1e6)
        return lrmoe_err("window %g s is negative or absurd", m->window);
    if (!(m->bw > 0) || m->bw > 1e18)
        return lrmoe_err("bandwidth %g B/s must be > 0 and sane", m->bw);
    if (!(m->flops > 0) || m->flops > 1e21)
        return lrmoe_err("flops %g must be > 0 and sane", m->flops);
    if (o->planner == LRMOE_PLANNER_EPLB && E > 0) {
        int g = o->groups ? o->groups : o->nodes;
        if (g <= 0 || E % g)
            return lrmoe_err("eplb: %d groups do not divide %d experts", g, E);
    }
    return 0;
}

/* ---------------------------------------------------------------- frames */

int lrmoe_plan_to_frame(const lrmoe_plan_t *p, lrmoe_frame_t *f)
{
    const int64_t ep[2] = {p->E, p->P}, e1[1] = {p->E};
    size_t n = (size_t)p->E * (size_t)p->P;
    lrmoe_tensor_t *t;
    if (!(t = lrmoe_frame_put(f, "placement", LRMOE_U8, 2, ep)))
        return -1;
    memcpy(t->data, p->placement, n);
    if (!(t = lrmoe_frame_put(f, "fwd_alloc", LRMOE_I64, 2, ep)))
        return -1;
    memcpy(t->data, p->fwd_alloc, n * sizeof(int64_t));
    if (!(t = lrmoe_frame_put(f, "quota", LRMOE_I64, 1, e1)))
        return -1;
    memcpy(t->data, p->quota, (size_t)p->E * sizeof(int64_t));
    if (!(t = lrmoe_frame_put(f, "bwd_alloc", LRMOE_I64, 2, ep)))
        return -1;
    memcpy(t->data, p->bwd_alloc, n * sizeof(int64_t));
    if (lrmoe_frame_set_attr(f, "plan.planner", p->planner) < 0 ||
        lrmoe_frame_set_attrf(f, "plan.ranks", "%d", p->P) < 0 ||
        lrmoe_frame_set_attrf(f, "plan.rho", "%.6f", p->rho) < 0 ||
        lrmoe_frame_set_attrf(f, "plan.fwd_peak", "%lld", (long long)p->fwd_peak) < 0 ||
        lrmoe_frame_set_attrf(f, "plan.bwd_peak", "%lld", (long long)p->bwd_peak) < 0 ||
        lrmoe_frame_set_attrf(f, "plan.fwd_lb", "%lld", (long long)p->fwd_lb) < 0 ||
        lrmoe_frame_set_attrf(f, "plan.bwd_lb", "%lld", (long long)p->bwd_lb) < 0 ||
        lrmoe_frame_set_attrf(f, "plan.replicas", "%d", p->replicas) < 0 ||
        (p->source[0] && lrmoe_frame_set_attr(f, "plan.source", p->source) < 0) ||
        (p->llep[0] && lrmoe_frame_set_attr(f, "plan.llep", p->llep) < 0) ||
        (p->have_slots &&
         lrmoe_frame_set_attrf(f, "plan.weight_moves", "%d", p->weight_moves) < 0) ||
        lrmoe_frame_set_attrf(f, "plan.feasible", "%d", p->feasible) < 0 ||
        /* only by-rank plans carry it; a re-planned frame's stale one is
         * overwritten with the default */
        ((p->keep_by_rank || lrmoe_frame_attr(f, "plan.keep")) &&
         lrmoe_frame_set_attr(f, "plan.keep", p->keep_by_rank ? "by-rank" : "global") < 0) ||
        lrmoe_frame_set_attrf(f, "plan.mem_peak", "%.0f", p->mem_peak) < 0 ||
        lrmoe_frame_set_attrf(f, "plan.mem_peak_rank", "%d", p->mem_peak_rank) < 0 ||
        lrmoe_frame_set_attrf(f, "plan.t_comm", "%.9g", p->t_comm) < 0 ||
        lrmoe_frame_set_attr(f, "plan.binding", p->binding) < 0 ||
        (p->D > 0 && (lrmoe_frame_set_attrf(f, "plan.hidden", "%lld", (long long)p->D) < 0 ||
                      lrmoe_frame_set_attrf(f, "plan.ffn", "%lld", (long long)p->F) < 0 ||
                      lrmoe_frame_set_attrf(f, "plan.topk", "%d", p->K) < 0 ||
                      lrmoe_frame_set_attrf(f, "plan.tokens_per_rank", "%lld",
                                            (long long)p->tokens) < 0)))
        return -1;
    return 0;
}

static int get_i64_attr(const lrmoe_frame_t *f, const char *k, int64_t *v)
{
    int r = lrmoe_frame_attr_i64(f, k, v);
    if (r < 0)
        return lrmoe_err("attribute %s: '%s' is not an integer", k, lrmoe_frame_attr(f, k));
    return r;
}

int lrmoe_plan_from_frame(const lrmoe_frame_t *f, lrmoe_plan_t *p)
{
    lrmoe_tensor_t *pl = lrmoe_frame_need(f, "placement");
    if (!pl)
        return -1;
    if (pl->ndim != 2 || pl->shape[0] <= 0 || pl->shape[1] <= 0 || pl->shape[0] > (1 << 24) ||
        pl->shape[1] > (1 << 16))
        return lrmoe_err("tensor placement: expected [E,P]");
    if (pl->dtype != LRMOE_U8 && pl->dtype != LRMOE_BOOL)
        return lrmoe_err("tensor placement: dtype %s, expected U8", lrmoe_dtype_name(pl->dtype));
    const int E = (int)pl->shape[0], P = (int)pl->shape[1];
    const int64_t ep[2] = {E, P}, e1[1] = {E};
    const char *names[3] = {"fwd_alloc", "quota", "bwd_alloc"};
    lrmoe_tensor_t *t[3];
    for (int i = 0; i < 3; i++) {
        if (!(t[i] = lrmoe_frame_need(f, names[i])))
            return -1;
        if (lrmoe_tensor_check(t[i], i == 1 ? 1 : 2, i == 1 ? e1 : ep) < 0)
            return -1;
        if (lrmoe_dtype_is_float(t[i]->dtype))
            return lrmoe_err("tensor %s: dtype %s, expected I64", names[i],
                             lrmoe_dtype_name(t[i]->dtype));
    }
    if (lrmoe_plan_alloc(p, E, P) < 0)
        return -1;
    memcpy(p->placement, pl->data, (size_t)E * P);
    lrmoe_convert_to_i64(t[0]->dtype, t[0]->data, p->fwd_alloc, (size_t)E * P);
    lrmoe_convert_to_i64(t[1]->dtype, t[1]->data, p->quota, (size_t)E);
    lrmoe_convert_to_i64(t[2]->dtype, t[2]->data, p->bwd_alloc, (size_t)E * P);
    const char *s = lrmoe_frame_attr(f, "plan.planner");
    if (s)
        snprintf(p->planner, sizeof p->planner, "%s", s);
    if (s && !strcmp(s, "capacity")) {
        /* its fwd_alloc lists every pair (row sums n_e) while the plan drops
         * the pairs above capacity in forward: executing it would compute
         * what the plan says is dropped, so it is refused, not run */
        int64_t dropped = 0;
        if (get_i64_attr(f, "plan.dropped_fwd", &dropped) < 0)
            return -1;
        if (dropped > 0)
            return lrmoe_err("planner capacity drops %lld forward pairs (plan.dropped_fwd): a "
                             "modelled baseline, not executed (lrmoe-plan(1), CAPACITY); keep "
                             "its pairs with lrmoe.capacity_keep or plan with another planner",
                             (long long)dropped);
    }
    s = lrmoe_frame_attr(f, "plan.binding");
    if (s)
        snprintf(p->binding, sizeof p->binding, "%s", s);
    s = lrmoe_frame_attr(f, "plan.keep");
    p->keep_by_rank = s && !strcmp(s, "by-rank");
    int64_t v;
    double d;
    if (get_i64_attr(f, "plan.fwd_peak", &p->fwd_peak) < 0 ||
        get_i64_attr(f, "plan.bwd_peak", &p->bwd_peak) < 0 ||
        get_i64_attr(f, "plan.fwd_lb", &p->fwd_lb) < 0 ||
        get_i64_attr(f, "plan.bwd_lb", &p->bwd_lb) < 0)
        return -1;
    if (get_i64_attr(f, "plan.replicas", &v) > 0)
        p->replicas = (int)v;
    if (get_i64_attr(f, "plan.feasible", &v) > 0)
        p->feasible = (int)v;
    if (get_i64_attr(f, "plan.mem_peak_rank", &v) > 0)
        p->mem_peak_rank = (int)v;
    if (lrmoe_frame_attr_f64(f, "plan.rho", &d) > 0)
        p->rho = d;
    if (lrmoe_frame_attr_f64(f, "plan.mem_peak", &d) > 0)
        p->mem_peak = d;
    if (lrmoe_frame_attr_f64(f, "plan.t_comm", &d) > 0)
        p->t_comm = d;
    /* derived figures */
    p->N = 0;
    for (size_t i = 0; i < (size_t)E * P; i++)
        if (__builtin_add_overflow(p->N, p->fwd_alloc[i], &p->N))
            return lrmoe_err("fwd_alloc: sums past 2^63-1");
    return 0;
}

void lrmoe_plan_thread_cleanup(void)
{
    lrmoe_minpeak_thread_cleanup();
    lrmoe_plan_lrmoe_thread_cleanup();
}

/* thread CPU seconds (the plan time without the other processes of a
 * shared machine) */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The baselines plan_lrmoe must not lose to, placed and allocated at rate
 * 1 (plan_base_fn): the one way one planner reaches another. */
static int baseline(const lrmoe_plan_opts_t *o, const int64_t *load, int E, lrmoe_plan_t *p)
{
    switch (o->planner) {
    case LRMOE_PLANNER_FIXED: return lrmoe_plan_fixed(o, load, E, p);
    case LRMOE_PLANNER_LLEP:
        return lrmoe_llep_assign(load, E, o->P, o->lambda, o->alpha, o->min_chunk, p->placement,
                                 p->fwd_alloc) < 0 ? -1 : 0;
    case LRMOE_PLANNER_EPLB: return lrmoe_plan_eplb(o, load, E, p);
    default: return lrmoe_err("no baseline planner %d", (int)o->planner);
    }
}

int lrmoe_plan_compute(const lrmoe_plan_opts_t *o, const int64_t *load, int E,
                       lrmoe_plan_t *out)
{
    double t0 = lrmoe_now(), c0 = cpu_now();
    if (lrmoe_plan_opts_check(o, E) < 0)
        return -1;
    int64_t N = 0;
    for (int e = 0; e < E; e++) {
        if (load[e] < 0)
            return lrmoe_err("expert_load[%d]: negative (%lld)", e, (long long)load[e]);
        if (load[e] > ((int64_t)1 << 48) || N > ((int64_t)1 << 50))
            return lrmoe_err("expert_load[%d]: absurd (%lld)", e, (long long)load[e]);
        N += load[e];
    }
    if (lrmoe_plan_alloc(out, E, o->P) < 0)
        return -1;
    snprintf(out->planner, sizeof out->planner, "%s", lrmoe_planner_name(o->planner));
    out->feasible = 1;
    out->llep[0] = 0;
    int r;
    switch (o->planner) {
    case LRMOE_PLANNER_FIXED: r = lrmoe_plan_fixed(o, load, E, out); break;
    case LRMOE_PLANNER_LLEP: {
        lrmoe_llep_reason_t why;
        r = lrmoe_llep_assign_why(load, E, o->P, o->lambda, o->alpha, o->min_chunk,
                                  out->placement, out->fwd_alloc, &why) < 0 ? -1 : 0;
        if (r == 0)
            snprintf(out->llep, sizeof out->llep, "%s", lrmoe_llep_reason_name(why));
        break;
    }
    case LRMOE_PLANNER_EPLB: r = lrmoe_plan_eplb(o, load, E, out); break;
    case LRMOE_PLANNER_LRMOE: r = lrmoe_plan_lrmoe(o, load, E, baseline, out); break;
    case LRMOE_PLANNER_CAPACITY: r = lrmoe_plan_fixed(o, load, E, out); break;
    default: r = lrmoe_err("unknown planner %d", (int)o->planner);
    }
    if (r < 0)
        return -1;
    if (o->planner != LRMOE_PLANNER_LRMOE) {
        /* baselines retain everything: K_e = n_e, backward where forward ran */
        memcpy(out->quota, load, (size_t)E * sizeof *load);
        memcpy(out->bwd_alloc, out->fwd_alloc, (size_t)E * o->P * sizeof(int64_t));
        if (o->planner == LRMOE_PLANNER_CAPACITY) {
            /* Megatron-Core's token dropping: expert e keeps min(n_e, C)
             * pairs in forward and backward; fwd_alloc keeps every pair
             * (its rows sum to n_e, as lrmoe-exec computes them) and the
             * cost model takes the capped rows from bwd_alloc (plan_core.c) */
            const int64_t C = lrmoe_capacity_pairs(N, E, lrmoe_plan_capacity_factor(o));
            if (C < 0)
                return -1;
            const int per = E / o->P;
            for (int e = 0; e < E; e++) {
                out->quota[e] = load[e] < C ? load[e] : C;
                out->bwd_alloc[(size_t)e * o->P + e / per] = out->quota[e];
            }
        }
        if (lrmoe_plan_cost(o, out, load, NULL) < 0)
            return -1;
        lrmoe_plan_summarise(out, load);
        /* the planner's own allocation is feasible: its peak bounds T* from
         * above, so the bound search stops as soon as it reaches it (the
         * capacity planner's forward load is its kept pairs, quota) */
        out->fwd_lb = lrmoe_plan_minpeak(out->placement, NULL,
                                   o->planner == LRMOE_PLANNER_CAPACITY ? out->quota : load, 0,
                                   E, o->P, out->fwd_peak, NULL, NULL);
        if (out->fwd_lb < 0)
            return -1;
        out->bwd_lb = out->fwd_lb;
        /* baselines do not adapt: an over-budget plan is reported, not refused */
        out->feasible = lrmoe_plan_fits(o, out, out->binding, sizeof out->binding);
    }
    out->D = o->cost.D;
    out->F = o->cost.F;
    out->K = o->cost.K;
    out->tokens = o->cost.tokens;
    if (lrmoe_plan_check(out, load) < 0)
        return lrmoe_err_prefix("planner %s produced an inconsistent plan",
                                lrmoe_planner_name(o->planner));
    out->plan_seconds = lrmoe_now() - t0;
    out->plan_cpu_seconds = cpu_now() - c0;
    return 0;
}

/* remove attribute key from f (frame.c has no call for it) */
static void del_attr(lrmoe_frame_t *f, const char *key)
{
    for (int i = 0; i < f->nattrs; i++)
        if (!strcmp(f->keys[i], key)) {
            free(f->keys[i]);
            free(f->vals[i]);
            memmove(f->keys + i, f->keys + i + 1, (size_t)(f->nattrs - i - 1) * sizeof *f->keys);
            memmove(f->vals + i, f->vals + i + 1, (size_t)(f->nattrs - i - 1) * sizeof *f->vals);
            f->nattrs--;
            return;
        }
}

int lrmoe_plan_frame(const lrmoe_plan_opts_t *o, lrmoe_eplb_cache_t *cache,
                     const int64_t *load, int E, lrmoe_frame_t *f, lrmoe_plan_t *p)
{
    lrmoe_plan_opts_t oo = *o;
    if (cache && (o->planner == LRMOE_PLANNER_EPLB || o->planner == LRMOE_PLANNER_LRMOE)) {
        const lrmoe_eplb_layout_t *lay;
        if (lrmoe_plan_opts_check(o, E) < 0 ||
            lrmoe_eplb_step(cache, lrmoe_frame_attr(f, "layer"), o, load, E, &lay) < 0)
            return -1;
        oo.eplb_layout = lay;
    }
    if (lrmoe_plan_compute(&oo, load, E, p) < 0 || lrmoe_plan_check(p, load) < 0 ||
        lrmoe_plan_to_frame(p, f) < 0)
        return -1;
    /* the capacity planner's attributes (lrmoe-stream(5)); a re-planned
     * frame loses those of an earlier capacity plan */
    static const char *const cap_attrs[] = {"plan.capacity_factor", "plan.capacity",
                                            "plan.drop_policy", "plan.dropped_fwd"};
    if (o->planner != LRMOE_PLANNER_CAPACITY) {
        for (int i = 0; i < 4; i++)
            del_attr(f, cap_attrs[i]);
        return 0;
    }
    int64_t kept = 0;
    for (int e = 0; e < E; e++)
        kept += p->quota[e];
    const int64_t C = lrmoe_capacity_pairs(p->N, E, lrmoe_plan_capacity_factor(o));
    if (C < 0 ||
        lrmoe_frame_set_attrf(f, "plan.capacity_factor", "%.10g", lrmoe_plan_capacity_factor(o)) < 0 ||
        lrmoe_frame_set_attrf(f, "plan.capacity", "%lld", (long long)C) < 0 ||
        lrmoe_frame_set_attr(f, "plan.drop_policy",
                             lrmoe_capacity_policy_name(o->capacity_policy)) < 0 ||
        lrmoe_frame_set_attrf(f, "plan.dropped_fwd", "%lld", (long long)(p->N - kept)) < 0)
        return -1;
    return 0;
}
