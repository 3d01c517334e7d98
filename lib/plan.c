/* Plans: options, the plan struct, consistency check, frame I/O, the
 * closed-form min-peak bounds and the planner dispatch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "plan_internal.h"

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
    o->quota = LRMOE_QUOTA_MINPEAK;
    o->min_keep = 0.25;
    o->best_effort = 0;
    o->glpk_tm_lim = 10.0;
    lrmoe_cost_default(&o->cost);
}

static const char *const planner_names[] = {"fixed", "llep", "eplb", "lrmoe"};

int lrmoe_planner_parse(const char *s, lrmoe_planner_t *out)
{
    for (int i = 0; i < 4; i++)
        if (s && !strcmp(s, planner_names[i])) {
            *out = (lrmoe_planner_t)i;
            return 0;
        }
    return lrmoe_err("unknown planner '%s' (fixed, llep, eplb, lrmoe)", s ? s : "");
}

const char *lrmoe_planner_name(lrmoe_planner_t p)
{
    return (unsigned)p < 4 ? planner_names[p] : "?";
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
    return lrmoe_err("unknown quota policy '%s' (minpeak, proportional)", s ? s : "");
}

const char *lrmoe_quota_name(lrmoe_quota_policy_t q)
{
    return q == LRMOE_QUOTA_PROPORTIONAL ? "proportional" : "minpeak";
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
    if (E > 0 && E % o->P)
        return lrmoe_err("%d ranks do not divide %d experts", o->P, E);
    if (o->nodes <= 0 || o->P % o->nodes)
        return lrmoe_err("%d nodes do not divide %d ranks", o->nodes, o->P);
    if (o->slots < 0 || (E > 0 && o->slots && o->slots < E / o->P))
        return lrmoe_err("slots per rank %d is below the %d native experts", o->slots, E / o->P);
    if (!(o->lambda >= 0) || !(o->alpha > 0) || o->min_chunk < 0)
        return lrmoe_err("llep: need lambda >= 0, alpha > 0, m >= 0");
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
    if (!(m->hbm >= 0) || m->hbm > 1e18)
        return lrmoe_err("hbm budget %g bytes is negative or absurd", m->hbm);
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
    lrmoe_plan_init(p);
}

int lrmoe_plan_alloc(lrmoe_plan_t *p, int E, int P)
{
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
    if (!p->placement || !p->fwd_alloc || !p->quota || !p->bwd_alloc || !p->rank) {
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
            fs += p->fwd_alloc[i];
            bs += p->bwd_alloc[i];
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
        lrmoe_frame_set_attrf(f, "plan.feasible", "%d", p->feasible) < 0 ||
        lrmoe_frame_set_attrf(f, "plan.mem_peak", "%.0f", p->mem_peak) < 0 ||
        lrmoe_frame_set_attrf(f, "plan.mem_peak_rank", "%d", p->mem_peak_rank) < 0 ||
        lrmoe_frame_set_attrf(f, "plan.t_comm", "%.9g", p->t_comm) < 0 ||
        lrmoe_frame_set_attr(f, "plan.binding", p->binding) < 0)
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
    s = lrmoe_frame_attr(f, "plan.binding");
    if (s)
        snprintf(p->binding, sizeof p->binding, "%s", s);
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
        p->N += p->fwd_alloc[i];
    return 0;
}

/* ---------------------------------------------------------------- bounds */

/* Fill sub[S] = sum of w[e] over experts whose eligible mask lies within S
 * (zeta transform over subsets). sub has 2^P entries. Returns the sum of w
 * over experts with an empty mask (no eligible rank) through *orphan. */
static int subset_sums(const uint8_t *placement, const int64_t *w, int E, int P,
                       int64_t *sub, int64_t *orphan)
{
    const size_t S = (size_t)1 << P;
    memset(sub, 0, S * sizeof *sub);
    *orphan = 0;
    for (int e = 0; e < E; e++) {
        uint32_t m = 0;
        for (int p = 0; p < P; p++)
            if (placement[(size_t)e * P + p])
                m |= 1u << p;
        if (!m)
            *orphan += w[e];
        sub[m] += w[e];
    }
    for (int b = 0; b < P; b++)
        for (size_t m = 0; m < S; m++)
            if (m & ((size_t)1 << b))
                sub[m] += sub[m ^ ((size_t)1 << b)];
    return 0;
}

static int64_t ceil_div(int64_t a, int64_t b) /* b > 0 */
{
    return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}

int64_t lrmoe_minpeak_lb(const uint8_t *placement, const int64_t *need, int E, int P)
{
    if (P <= 0 || E <= 0)
        return lrmoe_err("min-peak bound: bad shape");
    if (P > LRMOE_PLAN_MAX_P)
        return lrmoe_minpeak_lb_flow(placement, need, E, P);
    int64_t *sub = malloc(((size_t)1 << P) * sizeof *sub), orphan;
    if (!sub)
        return lrmoe_err("min-peak bound: out of memory");
    subset_sums(placement, need, E, P, sub, &orphan);
    if (orphan > 0) {
        free(sub);
        return lrmoe_err("min-peak bound: an expert with pairs has no eligible rank");
    }
    int64_t best = 0;
    for (size_t m = 1; m < ((size_t)1 << P); m++) {
        int64_t v = ceil_div(sub[m], __builtin_popcount((unsigned)m));
        if (v > best)
            best = v;
    }
    free(sub);
    return best;
}

int64_t lrmoe_minpeak_quota_lb(const uint8_t *placement, const int64_t *lo,
                               const int64_t *n, int64_t total, int E, int P)
{
    int64_t slo = 0, sn = 0;
    for (int e = 0; e < E; e++) {
        if (lo[e] < 0 || lo[e] > n[e])
            return lrmoe_err("quota bound: lo[%d] outside [0,n]", e);
        slo += lo[e];
        sn += n[e];
    }
    if (total < slo || total > sn)
        return lrmoe_err("quota bound: total %lld outside [%lld,%lld]", (long long)total,
                         (long long)slo, (long long)sn);
    if (P > LRMOE_PLAN_MAX_P)
        return lrmoe_minpeak_quota_lb_flow(placement, lo, n, total, E, P);
    const size_t S = (size_t)1 << P;
    int64_t *a = malloc(S * sizeof *a), *b = malloc(S * sizeof *b), oa, ob;
    if (!a || !b) {
        free(a);
        free(b);
        return lrmoe_err("quota bound: out of memory");
    }
    subset_sums(placement, lo, E, P, a, &oa);
    subset_sums(placement, n, E, P, b, &ob);
    int64_t best = 0;
    /* lower bounds must fit, and experts without ranks cannot retain */
    if (oa > 0 || total > sn - ob)
        best = -1;
    for (size_t m = 1; best >= 0 && m < S; m++) {
        int64_t k = __builtin_popcount((unsigned)m);
        int64_t v1 = ceil_div(a[m], k);
        int64_t v2 = ceil_div(total - sn + b[m], k);
        if (v1 > best)
            best = v1;
        if (v2 > best)
            best = v2;
    }
    free(a);
    free(b);
    if (best < 0)
        return lrmoe_err("quota bound: pairs of an expert without eligible rank");
    return best;
}

/* ---------------------------------------------------------------- common */

void plan_summarise(lrmoe_plan_t *p, const int64_t *load)
{
    const int E = p->E, P = p->P;
    int64_t *fr = calloc((size_t)P, sizeof *fr), *br = calloc((size_t)P, sizeof *br);
    p->N = 0;
    int64_t K = 0;
    p->replicas = 0;
    for (int e = 0; e < E; e++) {
        p->N += load[e];
        K += p->quota[e];
        for (int q = 0; q < P; q++) {
            size_t i = (size_t)e * P + q;
            if (fr) {
                fr[q] += p->fwd_alloc[i];
                br[q] += p->bwd_alloc[i];
            }
            if (p->placement[i] && q != e / (E / P))
                p->replicas++;
        }
    }
    p->fwd_peak = p->bwd_peak = 0;
    for (int q = 0; fr && br && q < P; q++) {
        if (fr[q] > p->fwd_peak)
            p->fwd_peak = fr[q];
        if (br[q] > p->bwd_peak)
            p->bwd_peak = br[q];
    }
    free(fr);
    free(br);
    p->rho = p->N ? (double)K / (double)p->N : 1.0;
    p->mean_ceil = (p->N + P - 1) / P;
}

/* Evaluate the cost model for p and fill the summary figures. */
int plan_cost(const lrmoe_plan_opts_t *o, lrmoe_plan_t *p, const int64_t *load,
              lrmoe_cost_summary_t *s)
{
    lrmoe_cost_summary_t tmp;
    if (!s)
        s = &tmp;
    if (lrmoe_cost_eval(&o->cost, p->E, p->P, p->placement, load, p->fwd_alloc, p->quota,
                        p->bwd_alloc, p->rank, s) < 0)
        return -1;
    p->mem_peak = s->mem_peak;
    p->mem_peak_rank = s->mem_peak_rank;
    p->t_comm = s->t_comm;
    p->t_total = s->t_total;
    return 0;
}

/* Describe what binds for plan p against the budgets; returns 1 if it fits. */
int plan_fits(const lrmoe_plan_opts_t *o, const lrmoe_plan_t *p, char *why, size_t len)
{
    const double G = 1024.0 * 1024.0 * 1024.0;
    if (o->cost.hbm > 0 && p->mem_peak > o->cost.hbm) {
        snprintf(why, len, "memory: rank %d needs %.3f GiB, budget %.3f GiB", p->mem_peak_rank,
                 p->mem_peak / G, o->cost.hbm / G);
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

static int plan_fixed(const lrmoe_plan_opts_t *o, const int64_t *load, int E, lrmoe_plan_t *p)
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

int lrmoe_plan_compute(const lrmoe_plan_opts_t *o, const int64_t *load, int E,
                       lrmoe_plan_t *out)
{
    double t0 = lrmoe_now();
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
    int r;
    switch (o->planner) {
    case LRMOE_PLANNER_FIXED: r = plan_fixed(o, load, E, out); break;
    case LRMOE_PLANNER_LLEP:
        r = lrmoe_llep_assign(load, E, o->P, o->lambda, o->alpha, o->min_chunk, out->placement,
                              out->fwd_alloc) < 0 ? -1 : 0;
        break;
    case LRMOE_PLANNER_EPLB: r = plan_eplb(o, load, E, out); break;
    case LRMOE_PLANNER_LRMOE: r = plan_lrmoe(o, load, E, out); break;
    default: r = lrmoe_err("unknown planner %d", (int)o->planner);
    }
    if (r < 0)
        return -1;
    if (o->planner != LRMOE_PLANNER_LRMOE) {
        /* baselines retain everything: K_e = n_e, backward where forward ran */
        memcpy(out->quota, load, (size_t)E * sizeof *load);
        memcpy(out->bwd_alloc, out->fwd_alloc, (size_t)E * o->P * sizeof(int64_t));
        plan_summarise(out, load);
        if (plan_cost(o, out, load, NULL) < 0)
            return -1;
        out->fwd_lb = lrmoe_minpeak_lb(out->placement, load, E, o->P);
        if (out->fwd_lb < 0)
            return -1;
        out->bwd_lb = out->fwd_lb;
        /* baselines do not adapt: an over-budget plan is reported, not refused */
        out->feasible = plan_fits(o, out, out->binding, sizeof out->binding);
    }
    if (lrmoe_plan_check(out, load) < 0)
        return lrmoe_err_prefix("planner %s produced an inconsistent plan",
                                lrmoe_planner_name(o->planner));
    out->plan_seconds = lrmoe_now() - t0;
    return 0;
}
