/* sim: per-frame plan figures, accumulators, the pressure experiment and
 * the summary report (see sim.h). */
#include "sim.h"
#include "route.h"
#include "parse.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MIB (1024.0 * 1024.0)

static const lrmoe_sim_metric_t metrics[LRMOE_SIM_NMETRICS] = {
    [LRMOE_SIM_RHO] = {"rho", "retention rate rho", "", 1},
    [LRMOE_SIM_FWD_PEAK] = {"fwd_peak", "forward peak", "pairs", 1},
    [LRMOE_SIM_FWD_MEAN] = {"fwd_mean", "forward mean", "pairs", 1},
    [LRMOE_SIM_FWD_IMB] = {"fwd_imbalance", "forward peak/mean", "", 1},
    [LRMOE_SIM_BWD_PEAK] = {"bwd_peak", "backward peak", "pairs", 1},
    [LRMOE_SIM_BWD_MEAN] = {"bwd_mean", "backward mean", "pairs", 1},
    [LRMOE_SIM_BWD_IMB] = {"bwd_imbalance", "backward peak/mean", "", 1},
    [LRMOE_SIM_LB] = {"lower_bound", "lower bound ceil(N/P)", "pairs", 1},
    [LRMOE_SIM_FWD_LB] = {"fwd_lb", "forward T* (placement)", "pairs", 1},
    [LRMOE_SIM_BWD_LB] = {"bwd_lb", "backward T* (placement)", "pairs", 1},
    [LRMOE_SIM_PEAK_LB] = {"peak_over_lb", "forward peak/ceil(N/P)", "", 1},
    [LRMOE_SIM_REPLICAS] = {"replicas", "replicas (all ranks)", "", 1},
    [LRMOE_SIM_A2A_BYTES] = {"a2a_bytes", "all-to-all, busiest rank", "MiB", 1 / MIB},
    [LRMOE_SIM_MEM_BASE] = {"mem_base_bytes", "memory: base experts", "GiB", 1 / GIB},
    [LRMOE_SIM_MEM_REPLICA] = {"mem_replica_bytes", "memory: replicas", "GiB", 1 / GIB},
    [LRMOE_SIM_MEM_TOKENS] = {"mem_tokens_bytes", "memory: token buffers", "GiB", 1 / GIB},
    [LRMOE_SIM_MEM_SUBTOTAL] = {"mem_subtotal_bytes", "memory: subtotal", "GiB", 1 / GIB},
    [LRMOE_SIM_MEM_CHARGED] = {"mem_charged_bytes", "memory: charged to hbm", "GiB", 1 / GIB},
    [LRMOE_SIM_T_DISPATCH] = {"t_dispatch_s", "time: dispatch a2a", "ms", 1e3},
    [LRMOE_SIM_T_COMPUTE] = {"t_compute_s", "time: expert compute", "ms", 1e3},
    [LRMOE_SIM_T_COMBINE] = {"t_combine_s", "time: combine a2a", "ms", 1e3},
    [LRMOE_SIM_T_WEIGHTS] = {"t_weights_s", "time: replica weights", "ms", 1e3},
    [LRMOE_SIM_T_BWD] = {"t_backward_s", "time: backward path", "ms", 1e3},
    [LRMOE_SIM_T_TOTAL] = {"t_total_s", "time: layer total", "ms", 1e3},
    [LRMOE_SIM_FEASIBLE] = {"feasible", "feasible", "%", 100},
    [LRMOE_SIM_PLAN_MS] = {"plan_ms", "planner wall time", "ms", 1},
    [LRMOE_SIM_T_BWD_DISPATCH] = {"t_bwd_dispatch_s", "time: backward dispatch", "ms", 1e3},
    [LRMOE_SIM_T_BWD_COMPUTE] = {"t_bwd_compute_s", "time: backward compute", "ms", 1e3},
    [LRMOE_SIM_T_BWD_COMBINE] = {"t_bwd_combine_s", "time: backward combine", "ms", 1e3},
};

const lrmoe_sim_metric_t *lrmoe_sim_metric(int i)
{
    return (i >= 0 && i < LRMOE_SIM_NMETRICS) ? &metrics[i] : NULL;
}

/* ---------------------------------------------------------- planners */

int lrmoe_sim_parse_planners(const char *s, const lrmoe_plan_opts_t *base,
                             lrmoe_sim_planner_t *out, int max)
{
    if (!s || !*s)
        return lrmoe_err("--planners: empty list");
    int n = 0;
    const char *p = s;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[64];
        if (len == 0 || len >= sizeof item)
            return lrmoe_err("--planners: bad item in '%s'", s);
        memcpy(item, p, len);
        item[len] = 0;
        if (n >= max)
            return lrmoe_err("--planners: more than %d planners", max);
        lrmoe_sim_planner_t *pl = &out[n];
        pl->opts = *base;
        char *at = strchr(item, '@');
        if (at)
            *at = 0;
        if (lrmoe_planner_parse(item, &pl->opts.planner) < 0)
            return lrmoe_err_prefix("--planners");
        if (at && pl->opts.planner == LRMOE_PLANNER_CAPACITY) {
            double f;
            if (lrmoe_parse_f64("--planners capacity factor", at + 1, -1e300, 1e300, &f) < 0)
                return -1;
            if (lrmoe_plan_set_capacity_factor(&pl->opts, f) < 0)
                return lrmoe_err_prefix("--planners %s@%s", item, at + 1);
            snprintf(pl->label, sizeof pl->label, "capacity@%.10g", f);
        } else if (at) {
            if (pl->opts.planner != LRMOE_PLANNER_LRMOE)
                return lrmoe_err("--planners: a rate or factor (@) applies to lrmoe and "
                                 "capacity only, not %s", item);
            double r;
            if (lrmoe_parse_f64("--planners rate", at + 1, 1e-9, 1.0, &r) < 0)
                return -1;
            pl->opts.nrates = 1;
            pl->opts.rates[0] = r;
            snprintf(pl->label, sizeof pl->label, "lrmoe@%g", r);
        } else {
            snprintf(pl->label, sizeof pl->label, "%s", lrmoe_planner_name(pl->opts.planner));
        }
        pl->opts.best_effort = 1;
        for (int j = 0; j < n; j++)
            if (!strcmp(out[j].label, pl->label))
                return lrmoe_err("--planners: %s given twice", pl->label);
        n++;
        p += len;
        if (*p == ',') {
            p++;
            if (!*p)
                return lrmoe_err("--planners: trailing comma in '%s'", s);
        }
    }
    return n;
}

double lrmoe_sim_bw_effective(int P, int nodes, double bw_intra, double bw_inter)
{
    if (P <= 0 || nodes <= 0 || P % nodes || !(bw_intra > 0))
        return lrmoe_err("bandwidth: need P > 0, nodes dividing P and bw > 0");
    if (nodes == 1 || P == 1)
        return bw_intra;
    if (!(bw_inter > 0))
        return lrmoe_err("bandwidth between nodes must be > 0");
    const double G = (double)(P / nodes);
    const double fin = (G - 1) / (P - 1), fout = ((double)P - G) / (P - 1);
    /* B / bw_eff = max(B*fin/bw_intra, B*fout/bw_inter) */
    double t = fout / bw_inter;
    if (fin / bw_intra > t)
        t = fin / bw_intra;
    return 1.0 / t;
}

/* ---------------------------------------------------------- frames */

static int attr_int(const lrmoe_frame_t *f, const char *key)
{
    int64_t v;
    if (lrmoe_frame_attr_i64(f, key, &v) == 1 && v > 0 && v < (1 << 20))
        return (int)v;
    return 0;
}

int lrmoe_sim_frame_load(const lrmoe_frame_t *f, int experts_hint, int64_t **load,
                         int *E, int *pairs_per_token)
{
    *load = NULL;
    *pairs_per_token = attr_int(f, "route.topk");
    if (!*pairs_per_token)
        *pairs_per_token = attr_int(f, "topk");
    const lrmoe_tensor_t *t = lrmoe_frame_get(f, "expert_load");
    if (t) {
        if (t->ndim != 1 || t->shape[0] <= 0 || t->shape[0] > (1 << 20) ||
            t->dtype == LRMOE_BOOL)
            return lrmoe_err("expert_load: expected a non-empty integer vector [E] (or "
                             "floats holding whole numbers)");
        if (experts_hint > 0 && t->shape[0] != experts_hint)
            return lrmoe_err("expert_load: %lld experts, --experts says %d",
                             (long long)t->shape[0], experts_hint);
        *E = (int)t->shape[0];
        /* I64 from lrmoe-route; whole-number floats too (Megatron's F32) */
        if (!(*load = malloc((size_t)*E * sizeof **load)))
            return lrmoe_err("out of memory");
        if (lrmoe_route_load_i64(t->dtype, t->data, *E, *load) < 0) {
            free(*load);
            *load = NULL;
            return -1;
        }
        for (int e = 0; e < *E; e++)
            if ((*load)[e] < 0) {
                lrmoe_err("expert_load[%d]: negative (%lld)", e, (long long)(*load)[e]);
                free(*load);
                *load = NULL;
                return -1;
            }
        return 0;
    }
    t = lrmoe_frame_get(f, "topk_ids");
    if (!t)
        return lrmoe_err("frame has neither expert_load nor topk_ids");
    if (t->ndim != 2 || lrmoe_dtype_is_float(t->dtype) || t->dtype == LRMOE_BOOL)
        return lrmoe_err("topk_ids: expected an integer matrix [T,K]");
    int nE = experts_hint;
    if (nE <= 0) {
        const lrmoe_tensor_t *lg = lrmoe_frame_get(f, "router_logits");
        if (lg && lg->ndim == 2 && lg->shape[1] > 0 && lg->shape[1] <= (1 << 20))
            nE = (int)lg->shape[1];
    }
    if (nE <= 0)
        return lrmoe_err("topk_ids without expert_load or router_logits: give --experts");
    int64_t *ids = lrmoe_tensor_i64(t);
    if (!ids && lrmoe_tensor_numel(t) > 0)
        return -1;
    int64_t *l = calloc((size_t)nE, sizeof *l);
    if (!l) {
        free(ids);
        return lrmoe_err("out of memory");
    }
    int64_t n = lrmoe_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= nE) {
            lrmoe_err("topk_ids[%lld,%lld]: expert %lld outside [0,%d)",
                      (long long)(i / t->shape[1]), (long long)(i % t->shape[1]),
                      (long long)ids[i], nE);
            free(ids);
            free(l);
            return -1;
        }
        l[ids[i]]++;
    }
    free(ids);
    *pairs_per_token = (int)t->shape[1];
    *E = nE;
    *load = l;
    return 0;
}

/* ---------------------------------------------------------- per frame */

/* The figures of plan from its cost model evaluation (rc per rank, s). */
static void row_fill(const lrmoe_plan_t *plan, const int64_t *load,
                     const lrmoe_rank_cost_t *rc, const lrmoe_cost_summary_t *sp,
                     lrmoe_sim_row_t *row)
{
    const int E = plan->E, P = plan->P;
    const lrmoe_cost_summary_t s = *sp;
    double *v = row->v;
    memset(row, 0, sizeof *row);
    int64_t N = 0, K = 0;
    for (int e = 0; e < E; e++) {
        N += load[e];
        K += plan->quota[e];
    }
    double a2a = 0;
    for (int p = 0; p < P; p++) {
        const lrmoe_rank_cost_t *r = &rc[p];
        /* combine is the reverse of dispatch: a rank sends back what it got */
        double sent = r->send_dispatch + r->recv_dispatch + r->send_bwd + r->send_bwd_combine +
                      r->send_weights;
        double recv = r->recv_dispatch + r->send_dispatch + r->recv_bwd + r->recv_bwd_combine +
                      r->recv_weights;
        if (sent > a2a)
            a2a = sent;
        if (recv > a2a)
            a2a = recv;
    }
    v[LRMOE_SIM_RHO] = N ? (double)K / (double)N : 1.0;
    v[LRMOE_SIM_FWD_PEAK] = (double)plan->fwd_peak;
    v[LRMOE_SIM_FWD_MEAN] = (double)N / P;
    v[LRMOE_SIM_FWD_IMB] = N ? v[LRMOE_SIM_FWD_PEAK] / v[LRMOE_SIM_FWD_MEAN] : 1.0;
    v[LRMOE_SIM_BWD_PEAK] = (double)plan->bwd_peak;
    v[LRMOE_SIM_BWD_MEAN] = (double)K / P;
    v[LRMOE_SIM_BWD_IMB] = K ? v[LRMOE_SIM_BWD_PEAK] / v[LRMOE_SIM_BWD_MEAN] : 1.0;
    v[LRMOE_SIM_LB] = (double)((N + P - 1) / P);
    v[LRMOE_SIM_FWD_LB] = (double)plan->fwd_lb;
    v[LRMOE_SIM_BWD_LB] = (double)plan->bwd_lb;
    v[LRMOE_SIM_PEAK_LB] = N ? v[LRMOE_SIM_FWD_PEAK] / v[LRMOE_SIM_LB] : 1.0;
    v[LRMOE_SIM_REPLICAS] = plan->replicas;
    v[LRMOE_SIM_A2A_BYTES] = a2a;
    const lrmoe_rank_cost_t *c = &rc[s.mem_peak_rank >= 0 ? s.mem_peak_rank : 0];
    v[LRMOE_SIM_MEM_BASE] = c->mem_base;
    v[LRMOE_SIM_MEM_REPLICA] = c->mem_replica;
    v[LRMOE_SIM_MEM_TOKENS] = c->mem_fwd + c->mem_saved + c->mem_bwd;
    v[LRMOE_SIM_MEM_SUBTOTAL] = c->mem_base + c->mem_replica + v[LRMOE_SIM_MEM_TOKENS];
    v[LRMOE_SIM_MEM_CHARGED] = c->mem_charged;
    v[LRMOE_SIM_T_DISPATCH] = s.t_dispatch + s.t_bwd_dispatch;
    v[LRMOE_SIM_T_COMPUTE] = s.t_fwd_compute + s.t_bwd_compute;
    v[LRMOE_SIM_T_COMBINE] = s.t_combine + s.t_bwd_combine;
    v[LRMOE_SIM_T_WEIGHTS] = s.t_weights;
    v[LRMOE_SIM_T_BWD] = s.t_bwd_dispatch + s.t_bwd_compute + s.t_bwd_combine;
    v[LRMOE_SIM_T_TOTAL] = s.t_total;
    v[LRMOE_SIM_FEASIBLE] = plan->feasible ? 1 : 0;
    v[LRMOE_SIM_PLAN_MS] = plan->plan_seconds * 1e3;
    v[LRMOE_SIM_T_BWD_DISPATCH] = s.t_bwd_dispatch;
    v[LRMOE_SIM_T_BWD_COMPUTE] = s.t_bwd_compute;
    v[LRMOE_SIM_T_BWD_COMBINE] = s.t_bwd_combine;
}

int lrmoe_sim_row_from_plan(const lrmoe_cost_model_t *m, const lrmoe_plan_t *plan,
                            const int64_t *load, lrmoe_sim_row_t *row)
{
    const int E = plan->E, P = plan->P;
    lrmoe_rank_cost_t *rc = calloc((size_t)P, sizeof *rc);
    if (!rc)
        return lrmoe_err("out of memory");
    lrmoe_cost_summary_t s;
    (void)E;
    if (lrmoe_plan_eval_cost(m, plan, load, rc, &s) < 0) {
        free(rc);
        return -1;
    }
    row_fill(plan, load, rc, &s, row);
    free(rc);
    return 0;
}

int lrmoe_sim_eval(const lrmoe_sim_planner_t *pl, const int64_t *load, int E,
                   lrmoe_plan_t *plan, lrmoe_sim_row_t *row, int64_t *fwd_rank,
                   int64_t *bwd_rank)
{
    if (lrmoe_plan_compute(&pl->opts, load, E, plan) < 0)
        return lrmoe_err_prefix("planner %s", pl->label);
    /* lrmoe_plan_compute already evaluated the cost model of the plan it
     * returns, with these options: reuse it rather than evaluate it twice */
    if (plan->have_cost && plan->rank)
        row_fill(plan, load, plan->rank, &plan->cost, row);
    else if (lrmoe_sim_row_from_plan(&pl->opts.cost, plan, load, row) < 0)
        return -1;
    const int P = plan->P;
    if (plan->have_cost && plan->rank) { /* the model summed them already */
        for (int p = 0; p < P; p++) {
            if (fwd_rank)
                fwd_rank[p] = plan->rank[p].fwd_rows;
            if (bwd_rank)
                bwd_rank[p] = plan->rank[p].bwd_rows;
        }
        return 0;
    }
    if (fwd_rank)
        memset(fwd_rank, 0, (size_t)P * sizeof *fwd_rank);
    if (bwd_rank)
        memset(bwd_rank, 0, (size_t)P * sizeof *bwd_rank);
    for (int e = 0; e < E && (fwd_rank || bwd_rank); e++)
        for (int p = 0; p < P; p++) {
            if (fwd_rank)
                fwd_rank[p] += plan->fwd_alloc[(size_t)e * P + p];
            if (bwd_rank)
                bwd_rank[p] += plan->bwd_alloc[(size_t)e * P + p];
        }
    return 0;
}

/* ---------------------------------------------------------- pressure */

static double clamp01(double x)
{
    return x < 0 ? 0 : x > 1 ? 1 : x;
}

int lrmoe_sim_pressure(const lrmoe_sim_planner_t *pl, const int64_t *load, int E,
                       double mult, lrmoe_plan_t *scratch, int64_t *scaled,
                       double *fraction, double *rho)
{
    if (!(mult > 0))
        return lrmoe_err("pressure multiplier %g must be > 0", mult);
    for (int e = 0; e < E; e++)
        scaled[e] = llround(mult * (double)load[e]);
    if (lrmoe_plan_compute(&pl->opts, scaled, E, scratch) < 0)
        return lrmoe_err_prefix("planner %s at pressure %g", pl->label, mult);
    *rho = scratch->rho;
    if (scratch->feasible) {
        *fraction = 1.0;
        return 0;
    }
    const lrmoe_cost_model_t *m = &pl->opts.cost;
    double s = 1.0;
    if (m->hbm > 0 && scratch->rank)
        for (int p = 0; p < scratch->P; p++) {
            const lrmoe_rank_cost_t *r = &scratch->rank[p];
            double tok = r->mem_fwd + r->mem_saved + r->mem_bwd;
            double room = m->hbm - r->mem_replica;
            if (room <= 0) {
                s = 0;
                break;
            }
            if (tok > 0 && room / tok < s)
                s = room / tok;
        }
    if (m->window > 0 && scratch->t_comm > 0 && m->window / scratch->t_comm < s)
        s = m->window / scratch->t_comm;
    *fraction = clamp01(s);
    return 0;
}

double lrmoe_sim_pressure_ideal(const lrmoe_cost_model_t *m, int64_t N, int P, double mult)
{
    if (!(m->hbm > 0) || P <= 0)
        return 1.0;
    double n = ceil(mult * (double)N / P);
    double need = lrmoe_cost_rank_mem(m, 0, (int64_t)n, (int64_t)n);
    return need > 0 ? clamp01(m->hbm / need) : 1.0;
}

/* ---------------------------------------------------------- accumulators */

/* Per-frame values are stored as float (exact percentiles to ~7 digits, half
 * the memory); means come from double sums. */
typedef float store_t;

int lrmoe_sim_acc_init(lrmoe_sim_acc_t *a, int nplanners, int npressure)
{
    memset(a, 0, sizeof *a);
    if (nplanners <= 0 || nplanners > LRMOE_SIM_MAX_PLANNERS || npressure < 0 ||
        npressure > LRMOE_SIM_MAX_PRESSURE)
        return lrmoe_err("accumulator: bad sizes");
    a->nplanners = nplanners;
    a->npressure = npressure;
    a->sum = calloc((size_t)nplanners * LRMOE_SIM_NMETRICS, sizeof *a->sum);
    if (npressure) {
        a->press = calloc((size_t)npressure * (nplanners + 1), sizeof *a->press);
        a->press_rho = calloc((size_t)npressure * nplanners, sizeof *a->press_rho);
    }
    if (!a->sum || (npressure && (!a->press || !a->press_rho))) {
        lrmoe_sim_acc_free(a);
        return lrmoe_err("out of memory");
    }
    return 0;
}

void lrmoe_sim_acc_free(lrmoe_sim_acc_t *a)
{
    free(a->v);
    free(a->sum);
    free(a->press);
    free(a->press_rho);
    memset(a, 0, sizeof *a);
}

int lrmoe_sim_acc_add(lrmoe_sim_acc_t *a, const lrmoe_sim_row_t *rows)
{
    const size_t w = (size_t)a->nplanners * LRMOE_SIM_NMETRICS;
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 1024;
        store_t *v = realloc(a->v, cap * w * sizeof *v);
        if (!v)
            return lrmoe_err("out of memory keeping %zu frames of figures", a->n);
        a->v = v;
        a->cap = cap;
    }
    store_t *dst = (store_t *)a->v + a->n * w;
    for (int j = 0; j < a->nplanners; j++)
        for (int k = 0; k < LRMOE_SIM_NMETRICS; k++) {
            dst[(size_t)j * LRMOE_SIM_NMETRICS + k] = (store_t)rows[j].v[k];
            a->sum[(size_t)j * LRMOE_SIM_NMETRICS + k] += rows[j].v[k];
        }
    a->n++;
    return 0;
}

void lrmoe_sim_acc_add_pressure(lrmoe_sim_acc_t *a, const double *frac, const double *rho)
{
    for (int i = 0; i < a->npressure; i++) {
        for (int j = 0; j <= a->nplanners; j++)
            a->press[(size_t)i * (a->nplanners + 1) + j] += frac[(size_t)i * (a->nplanners + 1) + j];
        for (int j = 0; j < a->nplanners; j++)
            a->press_rho[(size_t)i * a->nplanners + j] += rho[(size_t)i * a->nplanners + j];
    }
    a->npress_frames++;
}

double lrmoe_sim_acc_mean(const lrmoe_sim_acc_t *a, int planner, int metric)
{
    if (!a->n)
        return NAN;
    return a->sum[(size_t)planner * LRMOE_SIM_NMETRICS + metric] / (double)a->n;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

double lrmoe_sim_quantile(double *v, size_t n, double q)
{
    if (!n)
        return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    double r = ceil(q * (double)n);
    size_t i = r < 1 ? 0 : (size_t)r - 1;
    if (i >= n)
        i = n - 1;
    return v[i];
}

double lrmoe_sim_acc_quantile(const lrmoe_sim_acc_t *a, int planner, int metric, double q)
{
    if (!a->n)
        return NAN;
    double *tmp = malloc(a->n * sizeof *tmp);
    if (!tmp)
        return NAN;
    const size_t w = (size_t)a->nplanners * LRMOE_SIM_NMETRICS;
    const store_t *src = (const store_t *)a->v + (size_t)planner * LRMOE_SIM_NMETRICS + metric;
    for (size_t i = 0; i < a->n; i++)
        tmp[i] = src[i * w];
    double r = lrmoe_sim_quantile(tmp, a->n, q);
    free(tmp);
    return r;
}

double lrmoe_sim_acc_pressure(const lrmoe_sim_acc_t *a, int i, int j)
{
    if (!a->npress_frames || i < 0 || i >= a->npressure || j < 0 || j > a->nplanners)
        return NAN;
    return a->press[(size_t)i * (a->nplanners + 1) + j] / (double)a->npress_frames;
}

double lrmoe_sim_acc_pressure_rho(const lrmoe_sim_acc_t *a, int i, int j)
{
    if (!a->npress_frames || i < 0 || i >= a->npressure || j < 0 || j >= a->nplanners)
        return NAN;
    return a->press_rho[(size_t)i * a->nplanners + j] / (double)a->npress_frames;
}

/* ---------------------------------------------------------- reports */

int lrmoe_sim_tsv_header(FILE *fp)
{
    fprintf(fp, "frame\tlayer\tstep\tplanner");
    for (int k = 0; k < LRMOE_SIM_NMETRICS; k++)
        fprintf(fp, "\t%s", metrics[k].name);
    fputc('\n', fp);
    return ferror(fp) ? lrmoe_err("TSV: write failed") : 0;
}

int lrmoe_sim_tsv_row(FILE *fp, int64_t frame, const char *layer, const char *step,
                      const char *planner, const lrmoe_sim_row_t *row)
{
    fprintf(fp, "%lld\t%s\t%s\t%s", (long long)frame, layer ? layer : "", step ? step : "",
            planner);
    for (int k = 0; k < LRMOE_SIM_NMETRICS; k++)
        fprintf(fp, "\t%.10g", row->v[k]);
    fputc('\n', fp);
    return ferror(fp) ? lrmoe_err("TSV: write failed") : 0;
}

/* A value for the table: %.4g fits the 10-character columns. */
static void cell(FILE *fp, double x)
{
    if (isnan(x))
        fprintf(fp, " %10s", "-");
    else
        fprintf(fp, " %10.4g", x);
}

int lrmoe_sim_report(FILE *fp, const lrmoe_sim_acc_t *a, const lrmoe_sim_planner_t *pl,
                     const double *pressure)
{
    const int np = a->nplanners;
    int fixed = -1;
    for (int j = 0; j < np; j++)
        if (!strcmp(pl[j].label, "fixed"))
            fixed = j;
    fprintf(fp, "%-28s %-5s %-4s", "figure (modelled)", "unit", "stat");
    for (int j = 0; j < np; j++)
        fprintf(fp, " %10s", pl[j].label);
    fputc('\n', fp);
    static const int rows[] = {
        LRMOE_SIM_RHO, LRMOE_SIM_FWD_PEAK, LRMOE_SIM_FWD_IMB, LRMOE_SIM_BWD_PEAK,
        LRMOE_SIM_BWD_IMB, LRMOE_SIM_LB, LRMOE_SIM_PEAK_LB, LRMOE_SIM_REPLICAS,
        LRMOE_SIM_A2A_BYTES, LRMOE_SIM_MEM_BASE, LRMOE_SIM_MEM_REPLICA, LRMOE_SIM_MEM_TOKENS,
        LRMOE_SIM_MEM_SUBTOTAL, LRMOE_SIM_MEM_CHARGED, LRMOE_SIM_T_DISPATCH,
        LRMOE_SIM_T_COMPUTE, LRMOE_SIM_T_COMBINE, LRMOE_SIM_T_WEIGHTS, LRMOE_SIM_T_BWD,
        LRMOE_SIM_T_TOTAL, LRMOE_SIM_FEASIBLE, LRMOE_SIM_PLAN_MS};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const int k = rows[i];
        const lrmoe_sim_metric_t *m = &metrics[k];
        const int has_p99 = k != LRMOE_SIM_FEASIBLE && k != LRMOE_SIM_LB;
        for (int st = 0; st < 1 + has_p99; st++) {
            fprintf(fp, "%-28s %-5s %-4s", st ? "" : m->label, st ? "" : m->unit,
                    st ? "p99" : "mean");
            for (int j = 0; j < np; j++) {
                double x = st ? lrmoe_sim_acc_quantile(a, j, k, 0.99) : lrmoe_sim_acc_mean(a, j, k);
                cell(fp, x * m->scale);
            }
            fputc('\n', fp);
        }
    }
    if (fixed >= 0) {
        static const int ratio[] = {LRMOE_SIM_FWD_PEAK, LRMOE_SIM_BWD_PEAK, LRMOE_SIM_A2A_BYTES,
                                    LRMOE_SIM_MEM_TOKENS, LRMOE_SIM_MEM_SUBTOTAL,
                                    LRMOE_SIM_T_BWD, LRMOE_SIM_T_TOTAL};
        fprintf(fp, "\nratio to fixed (of the means)\n");
        for (size_t i = 0; i < sizeof ratio / sizeof ratio[0]; i++) {
            const int k = ratio[i];
            fprintf(fp, "%-28s %-5s %-4s", metrics[k].label, "x", "mean");
            double base = lrmoe_sim_acc_mean(a, fixed, k);
            for (int j = 0; j < np; j++)
                cell(fp, base > 0 ? lrmoe_sim_acc_mean(a, j, k) / base : NAN);
            fputc('\n', fp);
        }
    }
    if (a->npressure && a->npress_frames) {
        fprintf(fp, "\neffective throughput (modelled): fraction of the offered batch whose "
                    "backward workload fits, mean over %zu frames\n",
                a->npress_frames);
        fprintf(fp, "%-28s %-5s %-4s", "batch multiplier", "", "");
        for (int j = 0; j < np; j++)
            fprintf(fp, " %10s", pl[j].label);
        fprintf(fp, " %10s\n", "ideal");
        for (int i = 0; i < a->npressure; i++) {
            char lab[32];
            snprintf(lab, sizeof lab, "x%g", pressure[i]);
            fprintf(fp, "%-28s %-5s %-4s", lab, "%", "mean");
            for (int j = 0; j <= np; j++)
                cell(fp, 100 * lrmoe_sim_acc_pressure(a, i, j));
            fputc('\n', fp);
            fprintf(fp, "%-28s %-5s %-4s", "", "rho", "mean");
            for (int j = 0; j < np; j++)
                cell(fp, lrmoe_sim_acc_pressure_rho(a, i, j));
            fprintf(fp, " %10s\n", "1");
        }
    }
    return ferror(fp) ? lrmoe_err("report: write failed") : 0;
}
