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
    if (E > 0 && P > 0 && p->E == E && p->P == P && p->placement && p->fwd_alloc &&
        p->quota && p->bwd_alloc && p->rank) {
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
            if (!(q & 7) && q + 8 <= P &&
                plan_zero8(p->placement + i, p->fwd_alloc + i, p->bwd_alloc + i)) {
                q += 7;
                continue;
            }
            if (!p->placement[i] && !(p->fwd_alloc[i] | p->bwd_alloc[i]))
                continue; /* sparse: nothing held, nothing to check or sum */
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
        return plan_minpeak(placement, NULL, need, 0, E, P, -1, NULL, NULL);
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
        return plan_minpeak(placement, lo, n, total, E, P, -1, NULL, NULL);
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

/* ------------------------------------------------- min-peak search (any P) */

/* The exact optimum by a parametric max-flow search, for P above
 * LRMOE_PLAN_MAX_P (and whenever a witness subset is wanted).
 *
 * Cheap bound first: LB0 = the bound of the whole rank set and of every
 * single rank (for fixed needs max(ceil(N/P), max_p load of the experts whose
 * only eligible rank is p)). When the caller knows a feasible allocation
 * whose peak ub equals LB0, T* = LB0 and nothing else runs.
 *
 * Otherwise, starting at T = LB0: max-flow on the network source -> expert
 * (cap need) -> eligible rank -> sink (cap T). If not every pair routes, the
 * ranks R reachable from the source in the residual network form a violated
 * subset: every reachable expert has all its eligible ranks in R, so the
 * cut N - N_reach + T|R| < N gives N(R) > T|R| and ceil(N(R)/|R|) is a
 * lower bound above T. T rises to it and the search continues from the
 * current flow (raising the sink capacities keeps it feasible); a T where
 * every pair routes is feasible, hence T*. Each step raises T strictly to a
 * valid bound (Dinkelbach's ratio iteration), so a handful of steps suffice,
 * each an incremental Dinic. With free quotas the same holds for the two
 * families of the closed form: the floors lo must route (ceil(Lo(R)/|R|)),
 * and at least total of the loads n must (ceil((total - N + n(R))/|R|)). */

typedef struct {
    int E, P, nn, s, t;
    int *head, *nxt, *to, *level, *it, *queue;
    int64_t *cap;
    int na, sink0;          /* arcs used; arc of rank 0 -> sink (rank p: +2p) */
    int64_t T, flow;
} mpnet_t;

static void mp_free(mpnet_t *g)
{
    free(g->head); free(g->nxt); free(g->to); free(g->level); free(g->it);
    free(g->queue); free(g->cap);
    memset(g, 0, sizeof *g);
}

static void mp_arc(mpnet_t *g, int u, int v, int64_t c)
{
    int a = g->na;
    g->to[a] = v; g->cap[a] = c; g->nxt[a] = g->head[u]; g->head[u] = a;
    g->to[a + 1] = u; g->cap[a + 1] = 0; g->nxt[a + 1] = g->head[v]; g->head[v] = a + 1;
    g->na += 2;
}

/* Network for caps c[e] over the eligible lists (eoff, elist), sink caps T,
 * with a greedy initial flow (each expert fills its ranks in order). */
static int mp_build(mpnet_t *g, const int64_t *c, const int *eoff, const int *elist, int E,
                    int P, int64_t T)
{
    memset(g, 0, sizeof *g);
    int arcs = 0;
    for (int e = 0; e < E; e++)
        if (c[e] > 0)
            arcs += 1 + eoff[e + 1] - eoff[e];
    arcs = 2 * (arcs + P);
    g->E = E;
    g->P = P;
    g->nn = E + P + 2;
    g->s = 0;
    g->t = E + P + 1;
    g->head = malloc((size_t)g->nn * sizeof(int));
    g->level = malloc((size_t)g->nn * sizeof(int));
    g->it = malloc((size_t)g->nn * sizeof(int));
    g->queue = malloc((size_t)g->nn * sizeof(int));
    g->nxt = malloc((size_t)arcs * sizeof(int));
    g->to = malloc((size_t)arcs * sizeof(int));
    g->cap = malloc((size_t)arcs * sizeof(int64_t));
    if (!g->head || !g->level || !g->it || !g->queue || !g->nxt || !g->to || !g->cap) {
        mp_free(g);
        return lrmoe_err("min-peak search: out of memory");
    }
    for (int i = 0; i < g->nn; i++)
        g->head[i] = -1;
    g->sink0 = 0;
    for (int p = 0; p < P; p++)
        mp_arc(g, 1 + E + p, g->t, T);
    g->T = T;
    for (int e = 0; e < E; e++) {
        if (c[e] <= 0)
            continue;
        int sa = g->na;
        mp_arc(g, g->s, 1 + e, c[e]);
        int64_t rem = c[e];
        for (int k = eoff[e]; k < eoff[e + 1]; k++) {
            const int p = elist[k], ra = g->sink0 + 2 * p;
            int ea = g->na;
            mp_arc(g, 1 + e, 1 + E + p, c[e]);
            int64_t d = rem < g->cap[ra] ? rem : g->cap[ra];
            if (d > 0) { /* greedy: push d along s -> e -> p -> t */
                g->cap[sa] -= d; g->cap[sa + 1] += d;
                g->cap[ea] -= d; g->cap[ea + 1] += d;
                g->cap[ra] -= d; g->cap[ra + 1] += d;
                rem -= d;
                g->flow += d;
            }
        }
    }
    return 0;
}

static void mp_set_T(mpnet_t *g, int64_t T)
{
    for (int p = 0; p < g->P; p++)
        g->cap[g->sink0 + 2 * p] += T - g->T;
    g->T = T;
}

static int mp_bfs(mpnet_t *g)
{
    for (int i = 0; i < g->nn; i++)
        g->level[i] = -1;
    int qh = 0, qt = 0;
    g->level[g->s] = 0;
    g->queue[qt++] = g->s;
    while (qh < qt) {
        int u = g->queue[qh++];
        for (int a = g->head[u]; a >= 0; a = g->nxt[a])
            if (g->cap[a] > 0 && g->level[g->to[a]] < 0) {
                g->level[g->to[a]] = g->level[u] + 1;
                g->queue[qt++] = g->to[a];
            }
    }
    return g->level[g->t] >= 0;
}

/* Blocking flow (multi-push, current arcs, dead ends pruned). */
static int64_t mp_dfs(mpnet_t *g, int u, int64_t f)
{
    if (u == g->t)
        return f;
    int64_t pushed = 0;
    for (; g->it[u] >= 0; g->it[u] = g->nxt[g->it[u]]) {
        const int a = g->it[u], v = g->to[a];
        if (g->cap[a] <= 0 || g->level[v] != g->level[u] + 1)
            continue;
        int64_t want = f - pushed;
        int64_t d = mp_dfs(g, v, want < g->cap[a] ? want : g->cap[a]);
        if (d > 0) {
            g->cap[a] -= d;
            g->cap[a ^ 1] += d;
            pushed += d;
            if (pushed == f)
                return pushed;
        }
    }
    g->level[u] = -1;
    return pushed;
}

/* Max flow from the current one; afterwards level[] >= 0 marks the nodes
 * reachable from the source in the residual network (the last BFS). */
static void mp_maxflow(mpnet_t *g)
{
    while (mp_bfs(g)) {
        memcpy(g->it, g->head, (size_t)g->nn * sizeof(int));
        g->flow += mp_dfs(g, g->s, INT64_MAX);
    }
}

/* Eligible ranks of each expert as lists (CSR). */
static int elig_lists(const uint8_t *pl, int E, int P, int **eoff, int **elist)
{
    int nnz = 0;
    const size_t EP = (size_t)E * P;
    size_t i = 0;
    for (; i + 8 <= EP; i += 8) {
        uint64_t w;
        memcpy(&w, pl + i, sizeof w);
        if (w)
            for (int k = 0; k < 8; k++)
                nnz += pl[i + k] != 0;
    }
    for (; i < EP; i++)
        nnz += pl[i] != 0;
    *eoff = malloc(((size_t)E + 1) * sizeof(int));
    *elist = malloc(((size_t)nnz + 1) * sizeof(int));
    if (!*eoff || !*elist) {
        free(*eoff);
        free(*elist);
        return lrmoe_err("min-peak search: out of memory");
    }
    int k = 0;
    for (int e = 0; e < E; e++) {
        (*eoff)[e] = k;
        const uint8_t *row = pl + (size_t)e * P;
        for (int p = 0; p < P; p++) {
            uint64_t w;
            if (!(p & 7) && p + 8 <= P && (memcpy(&w, row + p, sizeof w), !w)) {
                p += 7;
                continue;
            }
            if (row[p])
                (*elist)[k++] = p;
        }
    }
    (*eoff)[E] = k;
    return 0;
}

int64_t plan_minpeak(const uint8_t *pl, const int64_t *lo, const int64_t *n, int64_t total,
                     int E, int P, int64_t ub, uint8_t *witness, int *how)
{
    if (P <= 0 || E <= 0)
        return lrmoe_err("min-peak bound: bad shape");
    int *eoff = NULL, *elist = NULL;
    int64_t *s1 = calloc((size_t)P, sizeof *s1), *l1 = calloc((size_t)P, sizeof *l1);
    int64_t rc = -1;
    mpnet_t A, B;
    memset(&A, 0, sizeof A);
    memset(&B, 0, sizeof B);
    if (how)
        *how = 0;
    if (!s1 || !l1 || elig_lists(pl, E, P, &eoff, &elist) < 0) {
        lrmoe_err("min-peak search: out of memory");
        goto out;
    }
    /* totals, orphans, single-rank experts */
    int64_t N = 0, slo = 0, on = 0, ol = 0;
    for (int e = 0; e < E; e++) {
        const int64_t l = lo ? lo[e] : 0;
        if (n[e] < 0 || (lo && (l < 0 || l > n[e]))) {
            lrmoe_err("min-peak bound: need of expert %d is negative or lo outside [0,n]", e);
            goto out;
        }
        N += n[e];
        slo += l;
        const int k = eoff[e + 1] - eoff[e];
        if (k == 0) {
            on += n[e];
            ol += l;
        } else if (k == 1) {
            s1[elist[eoff[e]]] += n[e];
            l1[elist[eoff[e]]] += l;
        }
    }
    if (!lo)
        total = N;
    if (lo && (total < slo || total > N)) {
        lrmoe_err("quota bound: total %lld outside [%lld,%lld]", (long long)total,
                  (long long)slo, (long long)N);
        goto out;
    }
    if (lo ? (ol > 0 || total > N - on) : on > 0) {
        lrmoe_err(lo ? "quota bound: pairs of an expert without eligible rank"
                     : "min-peak bound: an expert with pairs has no eligible rank");
        goto out;
    }
    /* LB0: the whole rank set and every single rank */
    int64_t T = ceil_div(total, P);
    int wrank = -1; /* witness: -1 all ranks, else one rank */
    for (int p = 0; p < P; p++) {
        int64_t v = lo ? l1[p] : s1[p];
        if (lo && total - N + on + s1[p] > v)
            v = total - N + on + s1[p];
        if (v > T) {
            T = v;
            wrank = p;
        }
    }
    if (witness)
        for (int p = 0; p < P; p++)
            witness[p] = wrank < 0 || p == wrank;
    if (ub >= 0 && T >= ub) {
        rc = T; /* LB0 <= T* <= ub */
        if (how)
            *how = 1;
        goto out;
    }
    if (P <= LRMOE_PLAN_MAX_P && !witness) {
        if (how)
            *how = 2;
        rc = lo ? lrmoe_minpeak_quota_lb(pl, lo, n, total, E, P) : lrmoe_minpeak_lb(pl, n, E, P);
        goto out;
    }
    if (how)
        *how = 3;
    if ((lo && mp_build(&A, lo, eoff, elist, E, P, T) < 0) ||
        mp_build(&B, n, eoff, elist, E, P, T) < 0)
        goto out;
    for (;;) {
        mpnet_t *g = NULL;
        int fam = 0; /* 0: the needs (or floors) exceed T|R|; 1: total - N + n(R) does */
        if (lo) {
            mp_set_T(&A, T);
            mp_maxflow(&A);
            if (A.flow < slo)
                g = &A;
        }
        if (!g) {
            mp_set_T(&B, T);
            mp_maxflow(&B);
            if (B.flow < total) {
                g = &B;
                fam = lo != NULL;
            }
        }
        if (!g) {
            rc = T; /* every pair routes at T, and T is a lower bound */
            break;
        }
        /* the violated subset R: ranks reachable in the residual network */
        int64_t k = 0, w = 0;
        for (int p = 0; p < P; p++)
            k += g->level[1 + E + p] >= 0;
        const int64_t *c = g == &A ? lo : n;
        for (int e = 0; e < E; e++) {
            int in = 1;
            for (int j = eoff[e]; in && j < eoff[e + 1]; j++)
                in = g->level[1 + E + elist[j]] >= 0;
            if (in)
                w += c[e];
        }
        if (k == 0) {
            lrmoe_err("min-peak search: pairs cannot be routed at any peak");
            goto out;
        }
        int64_t nt = ceil_div(fam ? total - N + w : w, k);
        if (nt <= T) {
            lrmoe_err("min-peak search: no progress at T=%lld (internal error)", (long long)T);
            goto out;
        }
        T = nt;
        if (witness)
            for (int p = 0; p < P; p++)
                witness[p] = g->level[1 + E + p] >= 0;
        if (ub >= 0 && T >= ub) {
            rc = T;
            break;
        }
    }
out:
    mp_free(&A);
    mp_free(&B);
    free(s1);
    free(l1);
    free(eoff);
    free(elist);
    return rc;
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
            if (!(q & 7) && q + 8 <= P &&
                plan_zero8(p->placement + i, p->fwd_alloc + i, p->bwd_alloc + i)) {
                q += 7;
                continue;
            }
            if (!p->placement[i] && !(p->fwd_alloc[i] | p->bwd_alloc[i]))
                continue; /* sparse: adds nothing */
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
    p->cost = *s;
    p->have_cost = 1;
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
        /* the planner's own allocation is feasible: its peak bounds T* from
         * above, so the bound search stops as soon as it reaches it */
        out->fwd_lb = plan_minpeak(out->placement, NULL, load, 0, E, o->P, out->fwd_peak, NULL,
                                   NULL);
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
