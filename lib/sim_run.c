/* sim_run: the simulator's replay (lrmoe_sim_run): frames read in batches,
 * each frame's loads planned by every planner (and at every pressure point)
 * by a pool of worker threads, the figures accumulated, written as TSV and
 * the worst frame kept for the plots; and the gnuplot figures
 * (lrmoe_sim_plots). lrmoe-sim is options and printing around these. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plot.h"
#include "sim.h"
#include "clock.h"

#define BATCH_PER_JOB 4 /* frames read ahead per worker thread */

/* One frame of a batch: its load and, after the workers ran, its figures. */
typedef struct {
    int64_t index;
    char layer[32], step[32];
    int E, K;
    int64_t *load;              /* (E) */
    lrmoe_plan_opts_t o;        /* the frame's model sizes, before the planner */
    lrmoe_sim_row_t rows[LRMOE_SIM_MAX_PLANNERS];
    int64_t *rank_fwd, *rank_bwd; /* (np, P) */
    int64_t *rank_moved;          /* (np, P): the model's moved backward rows */
    int do_press;
    double *frac, *rho;         /* (npress, np+1), (npress, np) */
    lrmoe_eplb_layout_t lay;    /* deployed EPLB's layout for this frame */
} item_t;

typedef struct {
    const lrmoe_sim_cfg_t *c;
    item_t *items;
    int nitems;
    int ntasks;                 /* nitems * (np + pressure tasks) */
    int next;                   /* next task (under mu) */
    int failed;
    char err[512];
    pthread_mutex_t mu;
} work_t;

static void worker_loop(work_t *w);

/* Task t of the batch: frame t / per, then planner evaluation or one
 * pressure point. */
static int run_task(work_t *w, int t, lrmoe_plan_t *plan, int64_t *scaled)
{
    const lrmoe_sim_cfg_t *c = w->c;
    const int per = c->np * (1 + c->npress);
    item_t *it = &w->items[t / per];
    int k = t % per;
    int j = k % c->np, i = k / c->np - 1; /* i < 0: the plain evaluation */
    lrmoe_sim_planner_t pl = c->pl[j];
    /* the frame's model sizes, the planner's own choice */
    lrmoe_planner_t which = pl.opts.planner;
    int nrates = pl.opts.nrates;
    double rates[LRMOE_PLAN_MAX_RATES];
    memcpy(rates, pl.opts.rates, sizeof rates);
    pl.opts = it->o;
    pl.opts.planner = which;
    pl.opts.nrates = nrates;
    memcpy(pl.opts.rates, rates, sizeof rates);
    pl.opts.capacity_factor_e6 = c->pl[j].opts.capacity_factor_e6; /* capacity@F */
    pl.opts.best_effort = 1;
    if (i < 0) {
        if (lrmoe_sim_eval(&pl, it->load, it->E, plan, &it->rows[j],
                           it->rank_fwd + (size_t)j * c->P, it->rank_bwd + (size_t)j * c->P) < 0)
            return -1;
        /* lrmoe_plan_compute evaluated the plan's cost model (per rank) */
        for (int p = 0; p < c->P; p++)
            it->rank_moved[(size_t)j * c->P + p] = plan->have_cost ? plan->rank[p].moved_rows : 0;
        return 0;
    }
    if (!it->do_press)
        return 0;
    double mult = c->pressure[i];
    if (c->pbase > 0) {
        int64_t N = 0;
        for (int e = 0; e < it->E; e++)
            N += it->load[e];
        int K = it->K > 0 ? it->K : it->o.cost.K;
        if (N > 0)
            mult *= (double)c->pbase * c->P * K / (double)N;
    }
    return lrmoe_sim_pressure(&pl, it->load, it->E, mult, plan, scaled,
                              &it->frac[(size_t)i * (c->np + 1) + j],
                              &it->rho[(size_t)i * c->np + j]);
}

/* Run tasks until none are left (every thread of a batch, main included). */
static void worker_loop(work_t *w)
{
    lrmoe_plan_t plan;
    lrmoe_plan_init(&plan);
    int64_t *scaled = NULL;
    int cap = 0;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        int t = w->failed ? w->ntasks : w->next++;
        pthread_mutex_unlock(&w->mu);
        if (t >= w->ntasks)
            break;
        int E = w->items[t / (w->c->np * (1 + w->c->npress))].E;
        if (E > cap) {
            free(scaled);
            scaled = malloc((size_t)E * sizeof *scaled);
            cap = scaled ? E : 0;
            if (!scaled) {
                lrmoe_err("out of memory");
                goto fail;
            }
        }
        if (run_task(w, t, &plan, scaled) < 0)
            goto fail;
        continue;
    fail:
        pthread_mutex_lock(&w->mu);
        if (!w->failed) {
            w->failed = 1;
            snprintf(w->err, sizeof w->err, "%s", lrmoe_errmsg());
        }
        pthread_mutex_unlock(&w->mu);
        break;
    }
    free(scaled);
    lrmoe_plan_free(&plan);
}

static void *worker(void *arg)
{
    worker_loop(arg);
    /* the planner keeps per-thread state (GLPK's environment): free it
     * before the thread goes, or every batch leaks one */
    lrmoe_plan_thread_cleanup();
    return NULL;
}

/* The frame's copy of the options: model sizes from the frame, as lrmoe-plan
 * takes them (lrmoe_plan_cli_frame). */
static int frame_opts(const lrmoe_sim_cfg_t *c, const lrmoe_frame_t *f, int K, lrmoe_plan_opts_t *o)
{
    *o = c->base;
    return lrmoe_plan_cli_frame(&c->given, f, o->P, K, &o->cost);
}

static void copy_attr(char *dst, size_t len, const lrmoe_frame_t *f, const char *key)
{
    const char *v = lrmoe_frame_attr(f, key);
    snprintf(dst, len, "%s", v && *v && !strpbrk(v, "\t\n") ? v : "NA");
}

/* ------------------------------------------------------------ plots */

static void track_worst(lrmoe_sim_worst_t *w, const lrmoe_sim_cfg_t *c, const item_t *it)
{
    const int P = c->P, per = it->E / P;
    int64_t N = 0, peak = 0;
    for (int p = 0; p < P; p++) {
        int64_t s = 0;
        for (int e = p * per; e < (p + 1) * per; e++)
            s += it->load[e];
        N += s;
        if (s > peak)
            peak = s;
    }
    double imb = N ? (double)peak * P / (double)N : 0;
    if (w->have && imb <= w->imb)
        return;
    w->have = 1;
    w->imb = imb;
    w->index = it->index;
    memcpy(w->layer, it->layer, sizeof w->layer);
    memcpy(w->step, it->step, sizeof w->step);
    for (int p = 0; p < P; p++) {
        int64_t s = 0;
        for (int e = p * per; e < (p + 1) * per; e++)
            s += it->load[e];
        w->before[p] = s;
    }
    memcpy(w->fwd, it->rank_fwd, (size_t)c->np * P * sizeof *w->fwd);
    memcpy(w->bwd, it->rank_bwd, (size_t)c->np * P * sizeof *w->bwd);
    for (int j = 0; j < c->np; j++)
        w->rho[j] = it->rows[j].v[LRMOE_SIM_RHO];
}

int lrmoe_sim_have_gnuplot(void)
{
    return lrmoe_plot_have_gnuplot();
}

/* Per-rank pairs before planning (plain EP) and after, forward and (when
 * it drops pairs) backward, of every planner but fixed, on frame w. */
static int plot_load(const char *dir, const char *name, lrmoe_plot_fmt_t fmt,
                     const lrmoe_sim_cfg_t *c, const lrmoe_sim_worst_t *w, const char *title)
{
    const int np = c->np, P = c->P;
    int ns = 1 + np;
    for (int j = 0; j < np; j++)
        ns += w->rho[j] < 1;
    double *x = malloc(P * sizeof *x), *y = malloc((size_t)ns * P * sizeof *y);
    const char **sl = malloc(ns * sizeof *sl);
    char (*names)[64] = calloc(ns, sizeof *names);
    if (!x || !y || !sl || !names) {
        free(x); free(y); free(sl); free(names);
        return lrmoe_err("out of memory");
    }
    int s = 0;
    for (int p = 0; p < P; p++) {
        x[p] = p;
        y[p] = (double)w->before[p];
    }
    sl[s++] = "before: plain EP (= fixed)";
    for (int j = 0; j < np; j++) {
        if (c->pl[j].opts.planner == LRMOE_PLANNER_FIXED)
            continue; /* the same as before */
        snprintf(names[s], 64, "%s forward", c->pl[j].label);
        sl[s] = names[s];
        for (int p = 0; p < P; p++)
            y[(size_t)s * P + p] = (double)w->fwd[(size_t)j * P + p];
        s++;
        if (w->rho[j] < 1) {
            snprintf(names[s], 64, "%s backward (rho %.2f)", c->pl[j].label, w->rho[j]);
            sl[s] = names[s];
            for (int p = 0; p < P; p++)
                y[(size_t)s * P + p] = (double)w->bwd[(size_t)j * P + p];
            s++;
        }
    }
    lrmoe_plot_opts_t o;
    lrmoe_plot_opts_init(&o);
    o.title = title;
    o.xlabel = "rank";
    o.ylabel = "token-expert pairs";
    o.steps = 1;
    int r = lrmoe_plot_lines(dir, name, fmt, &o, P, x, s, sl, y);
    free(x); free(y); free(sl); free(names);
    return r;
}

static void worst_title(char *title, size_t len, const lrmoe_sim_worst_t *w)
{
    snprintf(title, len,
             "pairs per rank before and after planning\n(modelled cluster: planned, not measured)\n"
             "frame %lld (layer %s, step %s): the worst plain-EP peak/mean, %.2f",
             (long long)w->index, w->layer, w->step, w->imb);
}

/* 2. memory breakdown (Figure 7), the budget, the infeasible frames */
static int plot_memory(const char *dir, lrmoe_plot_fmt_t fmt, const lrmoe_sim_cfg_t *c,
                       const lrmoe_sim_acc_t *a, const char *const *labels)
{
    const int np = c->np;
    const double GIB = 1024.0 * 1024.0 * 1024.0;
    char title[512];
    lrmoe_plot_opts_t o;
    static const char *seg[] = {"base experts", "replicas", "token buffers"};
    static const int km[] = {LRMOE_SIM_MEM_BASE, LRMOE_SIM_MEM_REPLICA, LRMOE_SIM_MEM_TOKENS};
    double v[LRMOE_SIM_MAX_PLANNERS * 3], base = 0;
    for (int j = 0; j < np; j++) {
        for (int s = 0; s < 3; s++)
            v[j * 3 + s] = lrmoe_sim_acc_mean(a, j, km[s]) / GIB;
        if (v[j * 3] > base)
            base = v[j * 3];
    }
    /* every infeasible frame at its bar, and a count above it */
    size_t nm = 0;
    const size_t wd = (size_t)np * LRMOE_SIM_NMETRICS;
    for (size_t i = 0; i < a->n; i++)
        for (int j = 0; j < np; j++)
            nm += a->v[i * wd + (size_t)j * LRMOE_SIM_NMETRICS + LRMOE_SIM_FEASIBLE] == 0;
    double *mb = malloc((nm ? nm : 1) * sizeof *mb), *my = malloc((nm ? nm : 1) * sizeof *my);
    char (*bn)[64] = calloc((size_t)np, sizeof *bn);
    const char *bnp[LRMOE_SIM_MAX_PLANNERS];
    if (!mb || !my || !bn) {
        free(mb); free(my); free(bn);
        return lrmoe_err("out of memory");
    }
    size_t k = 0;
    for (int j = 0; j < np; j++) {
        size_t cnt = 0;
        for (size_t i = 0; i < a->n; i++) {
            const float *r = a->v + i * wd + (size_t)j * LRMOE_SIM_NMETRICS;
            if (r[LRMOE_SIM_FEASIBLE] != 0)
                continue;
            mb[k] = j;
            my[k++] = r[LRMOE_SIM_MEM_SUBTOTAL] / GIB;
            cnt++;
        }
        if (cnt)
            snprintf(bn[j], 64, "%zu of %zu infeasible", cnt, a->n);
        bnp[j] = cnt ? bn[j] : NULL;
    }
    char ref[160], note[256];
    const double hbm = c->base.cost.hbm;
    char hb[32];
    snprintf(ref, sizeof ref, "budget: base experts + --hbm %s",
             hbm > 0 ? lrmoe_cost_fmt_bytes(hbm, hb, sizeof hb) : "unlimited");
    snprintf(note, sizeof note, "%s%s%s",
             nm ? "crosses: the memory of each infeasible frame (over the budget or the window)"
                : "",
             nm && hbm <= 0 ? "\n" : "", hbm > 0 ? "" : "no budget (--hbm 0)");
    snprintf(title, sizeof title,
             "modelled GPU memory per MoE layer at the busiest rank\n(bars: mean over %zu "
             "frames)", a->n);
    lrmoe_plot_opts_init(&o);
    o.title = title;
    o.ylabel = "GiB (modelled)";
    o.note = *note ? note : NULL;
    o.ref_y = hbm > 0 ? base + hbm / GIB : 0;
    o.ref_label = ref;
    o.nmarks = (int)nm;
    o.mark_bar = mb;
    o.mark_y = my;
    o.mark_label = "an infeasible frame";
    o.bar_notes = bnp;
    int r = lrmoe_plot_stacked(dir, "memory", fmt, &o, np, labels, 3, seg, v);
    free(mb); free(my); free(bn);
    if (r < 0)
        return -1;
    return 0;
}

/* 3. latency (Figure 8): dispatch, compute and combine of the forward,
 * then of the backward on its own, then the replica weights */
static int plot_latency(const char *dir, lrmoe_plot_fmt_t fmt, const lrmoe_sim_cfg_t *c,
                        const lrmoe_sim_acc_t *a, const char *const *labels)
{
    const int np = c->np;
    char title[512];
    lrmoe_plot_opts_t o;
    enum { NSEG = 7 };
    static const char *seg[NSEG] = {"forward: dispatch", "forward: compute",
                                    "forward: combine", "backward: dispatch",
                                    "backward: compute", "backward: combine",
                                    "replica weights out, gradients back"};
    /* forward blues, backward oranges, each dark to light; weights
     * black. In greyscale (Rec. 601 luma) the seven are 43, 128, 191,
     * 82, 165, 234 and 0: no two closer than 26, so a printed figure
     * tells every segment apart (tests/plot.bats checks it) */
    static const char *rgb[NSEG] = {"#08306B", "#4292C6", "#9ECAE1", "#A63603",
                                    "#FD8D3C", "#FEE6CE", "#000000"};
    static const int both[3] = {LRMOE_SIM_T_DISPATCH, LRMOE_SIM_T_COMPUTE,
                                LRMOE_SIM_T_COMBINE};
    static const int bwd[3] = {LRMOE_SIM_T_BWD_DISPATCH, LRMOE_SIM_T_BWD_COMPUTE,
                               LRMOE_SIM_T_BWD_COMBINE};
    double v[LRMOE_SIM_MAX_PLANNERS * NSEG];
    char (*bn)[64] = calloc((size_t)np, sizeof *bn);
    const char *bnp[LRMOE_SIM_MAX_PLANNERS];
    if (!bn)
        return lrmoe_err("out of memory");
    for (int j = 0; j < np; j++) {
        double tb = 0;
        for (int s = 0; s < 3; s++) {
            double b = lrmoe_sim_acc_mean(a, j, bwd[s]);
            v[j * NSEG + s] = (lrmoe_sim_acc_mean(a, j, both[s]) - b) * 1e3;
            v[j * NSEG + 3 + s] = b * 1e3;
            tb += b;
        }
        v[j * NSEG + 6] = lrmoe_sim_acc_mean(a, j, LRMOE_SIM_T_WEIGHTS) * 1e3;
        snprintf(bn[j], 64, "backward %.3g ms", tb * 1e3);
        bnp[j] = bn[j];
    }
    snprintf(title, sizeof title,
             "modelled MoE-layer latency on the critical path (mean over %zu frames)", a->n);
    lrmoe_plot_opts_init(&o);
    o.title = title;
    o.ylabel = "ms (modelled)";
    o.bar_notes = bnp;
    o.seg_rgb = rgb;
    o.note = "each part: the slowest rank of each stage (bulk-synchronous, lrmoe-sim(1))";
    int r = lrmoe_plot_stacked(dir, "latency", fmt, &o, np, labels, NSEG, seg, v);
    free(bn);
    if (r < 0)
        return -1;
    return 0;
}

/* 4. effective throughput vs pressure (Figure 6) */
static int plot_pressure(const char *dir, lrmoe_plot_fmt_t fmt, const lrmoe_sim_cfg_t *c,
                         const lrmoe_sim_acc_t *a, const char *const *labels)
{
    const int np = c->np;
    char title[512];
    lrmoe_plot_opts_t o;
    double x[LRMOE_SIM_MAX_PRESSURE], y[(LRMOE_SIM_MAX_PLANNERS + 1) * LRMOE_SIM_MAX_PRESSURE];
    const char *sl[LRMOE_SIM_MAX_PLANNERS + 1];
    for (int i = 0; i < c->npress; i++)
        x[i] = c->pressure[i];
    for (int j = 0; j <= np; j++) {
        sl[j] = j < np ? labels[j] : "ideal (keeps every pair)";
        for (int i = 0; i < c->npress; i++)
            y[(size_t)j * c->npress + i] = 100 * lrmoe_sim_acc_pressure(a, i, j);
    }
    snprintf(title, sizeof title,
             "modelled effective backward throughput under batch pressure (%zu frames)",
             a->npress_frames);
    lrmoe_plot_opts_init(&o);
    o.title = title;
    o.xlabel = "batch-size multiplier (log2 scale)";
    o.ylabel = "% of offered batch that fits (modelled)";
    o.note = "ideal: keeps every pair (no dropping), perfectly balanced, same budget\n"
             "and window; planners that drop pairs (lrmoe, capacity) can lie above it";
    int sorted = 1; /* a log2 axis needs positive, increasing multipliers */
    for (int i = 0; i < c->npress; i++)
        sorted &= x[i] > 0 && (i == 0 || x[i] > x[i - 1]);
    o.log2x = sorted && c->npress > 1;
    /* under each multiplier, the rho every lrmoe planner chose there
     * (mean over the frames, as the table prints it), "/" between planners */
    char notes[LRMOE_SIM_MAX_PRESSURE][128], who[256] = "";
    const char *np_[LRMOE_SIM_MAX_PRESSURE];
    int nl = 0;
    for (int i = 0; i < c->npress; i++) {
        snprintf(notes[i], sizeof notes[i], "rho");
        np_[i] = notes[i];
    }
    for (int j = 0; j < np; j++) {
        if (c->pl[j].opts.planner != LRMOE_PLANNER_LRMOE)
            continue;
        size_t wl = strlen(who);
        snprintf(who + wl, sizeof who - wl, "%s%s", nl ? "/" : "", labels[j]);
        for (int i = 0; i < c->npress; i++) {
            size_t l = strlen(notes[i]);
            snprintf(notes[i] + l, sizeof notes[i] - l, "%s%.4g", nl ? "/" : " ",
                     lrmoe_sim_acc_pressure_rho(a, i, j));
        }
        nl++;
    }
    char xl[512];
    if (nl) {
        snprintf(xl, sizeof xl, "batch-size multiplier%s; under it the retention rate rho "
                 "%s chose (mean over the frames)", o.log2x ? " (log2 scale)" : "", who);
        o.xlabel = xl;
        o.xtic_notes = np_;
    } else if (!o.log2x) {
        o.xlabel = "batch-size multiplier";
    }
    if (lrmoe_plot_lines(dir, "pressure", fmt, &o, c->npress, x, np + 1, sl, y) < 0)
        return -1;
    return 0;
}

int lrmoe_sim_plots(const char *dir, lrmoe_plot_fmt_t fmt, const lrmoe_sim_cfg_t *c,
                    const lrmoe_sim_acc_t *a, const lrmoe_sim_worst_t *w)
{
    const int np = c->np;
    const char *labels[LRMOE_SIM_MAX_PLANNERS];
    for (int j = 0; j < np; j++)
        labels[j] = c->pl[j].label;
    char title[512];

    /* 1. load per rank before and after planning (the worst frame); 2.
     * memory; 3. latency; 4. effective throughput under pressure */
    worst_title(title, sizeof title, w);
    if (plot_load(dir, "load", fmt, c, w, title) < 0)
        return -1;
    if (plot_memory(dir, fmt, c, a, labels) < 0 || plot_latency(dir, fmt, c, a, labels) < 0 ||
        (c->npress && a->npress_frames && plot_pressure(dir, fmt, c, a, labels) < 0))
        return -1;
    static const char *names[] = {"load", "memory", "latency", "pressure"};
    for (int i = 0; i < 4; i++) {
        if (i == 3 && !(c->npress && a->npress_frames))
            break;
        if (lrmoe_plot_render(dir, names[i], fmt) < 0)
            return -1;
    }
    return 0;
}

/* FILE of --plot split into dir, name and format */
static int plot_file(const char *file, char *dir, size_t dlen, char *name, size_t nlen,
                     lrmoe_plot_fmt_t *fmt)
{
    size_t fl = strlen(file);
    if (fl > 4 && !strcmp(file + fl - 4, ".svg"))
        *fmt = LRMOE_PLOT_SVG;
    else if (fl > 4 && !strcmp(file + fl - 4, ".png"))
        *fmt = LRMOE_PLOT_PNG;
    else
        return lrmoe_err("the name must end in .svg or .png");
    const char *slash = strrchr(file, '/');
    if (slash && (size_t)(slash - file) >= dlen)
        return lrmoe_err("path too long");
    snprintf(dir, dlen, "%.*s", slash ? (int)(slash - file) : 1, slash ? file : ".");
    if (slash && slash == file)
        snprintf(dir, dlen, "/");
    const char *base = slash ? slash + 1 : file;
    snprintf(name, nlen, "%.*s", (int)(strlen(base) - 4), base);
    if (!*name)
        return lrmoe_err("no name before the extension");
    return 0;
}

int lrmoe_sim_plot_check(const char *file)
{
    char dir[4096], name[1024];
    lrmoe_plot_fmt_t fmt;
    if (plot_file(file, dir, sizeof dir, name, sizeof name, &fmt) < 0)
        return -1;
    if (!lrmoe_plot_have_gnuplot())
        return lrmoe_err("gnuplot not found in PATH (Debian: apt-get install gnuplot-nox)");
    return 0;
}

int lrmoe_sim_trace_add(lrmoe_sim_trace_t *t, int64_t index, const lrmoe_frame_t *f,
                        const int64_t *load, int E, const lrmoe_cost_model_t *m)
{
    if (t->n == t->cap) {
        int64_t cap = t->cap ? 2 * t->cap : 64;
        lrmoe_sim_trace_frame_t *n = realloc(t->f, (size_t)cap * sizeof *n);
        if (!n)
            return lrmoe_err("out of memory");
        t->f = n;
        t->cap = cap;
    }
    lrmoe_sim_trace_frame_t *r = &t->f[t->n];
    memset(r, 0, sizeof *r);
    const char *key = lrmoe_frame_attr(f, "layer");
    r->load = malloc((size_t)E * sizeof *r->load);
    if (!r->load || (key && !(r->layer_key = strdup(key)))) {
        free(r->load);
        return lrmoe_err("out of memory");
    }
    memcpy(r->load, load, (size_t)E * sizeof *load);
    r->index = index;
    r->E = E;
    r->cost = *m;
    copy_attr(r->layer, sizeof r->layer, f, "layer");
    copy_attr(r->step, sizeof r->step, f, "step");
    t->n++;
    return 0;
}

void lrmoe_sim_trace_free(lrmoe_sim_trace_t *t)
{
    for (int64_t i = 0; i < t->n; i++) {
        free(t->f[i].load);
        free(t->f[i].layer_key);
    }
    free(t->f);
    memset(t, 0, sizeof *t);
}

static int sim_run(const lrmoe_sim_cfg_t *c, lrmoe_reader_t *rd, const lrmoe_sim_trace_t *tr,
                   lrmoe_sim_result_t *out);

int lrmoe_sim_plot_trace(const lrmoe_sim_trace_t *t, const lrmoe_plan_cli_t *cli,
                         const char *file)
{
    char dir[4096], name[1024];
    lrmoe_plot_fmt_t fmt;
    if (lrmoe_sim_plot_check(file) < 0 ||
        plot_file(file, dir, sizeof dir, name, sizeof name, &fmt) < 0)
        return -1;
    if (t->n == 0)
        return lrmoe_err("no frames were planned");
    lrmoe_sim_cfg_t *c = calloc(1, sizeof *c);
    if (!c)
        return lrmoe_err("out of memory");
    c->base = *cli->o;
    c->given = *cli;
    c->P = c->base.P;
    c->jobs = 1;
    c->max_frames = -1;
    c->track_worst = 1;
    c->np = lrmoe_sim_parse_planners("fixed,llep,eplb,lrmoe", &c->base, c->pl,
                                     LRMOE_SIM_MAX_PLANNERS);
    int rc = c->np < 0 ? -1 : 0;
    lrmoe_sim_result_t res;
    memset(&res, 0, sizeof res);
    if (!rc)
        rc = sim_run(c, NULL, t, &res);
    if (!rc) {
        char title[512];
        worst_title(title, sizeof title, &res.worst);
        rc = plot_load(dir, name, fmt, c, &res.worst, title);
    }
    if (!rc)
        rc = lrmoe_plot_render(dir, name, fmt);
    lrmoe_sim_result_free(&res); /* zeroed or filled: both free */
    free(c);
    return rc;
}

static void free_items(item_t *items, int n)
{
    for (int i = 0; i < n; i++) {
        free(items[i].load);
        items[i].load = NULL;
    }
}

int lrmoe_sim_run(const lrmoe_sim_cfg_t *c, lrmoe_reader_t *rd, lrmoe_sim_result_t *out)
{
    return sim_run(c, rd, NULL, out);
}

/* One frame of the trace tr as a batch item: its loads, its model sizes. */
static int item_from_trace(const lrmoe_sim_cfg_t *c, const lrmoe_sim_trace_frame_t *tf,
                           item_t *it)
{
    if (!(it->load = malloc((size_t)tf->E * sizeof *it->load)))
        return lrmoe_err("out of memory");
    memcpy(it->load, tf->load, (size_t)tf->E * sizeof *it->load);
    it->index = tf->index;
    memcpy(it->layer, tf->layer, sizeof it->layer);
    memcpy(it->step, tf->step, sizeof it->step);
    it->E = tf->E;
    it->K = tf->cost.K;
    it->o = c->base;
    it->o.cost = tf->cost;
    return 0;
}

/* lrmoe_sim_run over the frames of rd, or of the kept trace tr */
/* Plan and cost a batch of n frames: n x planners x (1 + pressure points)
 * tasks shared by `jobs` threads (this one among them). 0, or -1 with the
 * first failing task's error. */
static int run_batch(const lrmoe_sim_cfg_t *c, item_t *items, int n, int jobs)
{
    work_t w;
    memset(&w, 0, sizeof w);
    w.c = c;
    w.items = items;
    w.nitems = n;
    w.ntasks = n * c->np * (1 + c->npress);
    pthread_mutex_init(&w.mu, NULL);
    int nt = jobs < w.ntasks ? (int)jobs : w.ntasks;
    pthread_t th[256];
    int started = 0;
    for (int i = 1; i < nt; i++) {
        if (pthread_create(&th[i], NULL, worker, &w) != 0)
            break;
        started = i;
    }
    worker_loop(&w);
    for (int i = 1; i <= started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&w.mu);
    return w.failed ? lrmoe_err("%s", w.err) : 0;
}

/* A planned batch into the accumulators, the worst frame and the --tsv
 * and --rank-tsv rows, in frame order. 0, or -1 with the error set. */
static int absorb_batch(const lrmoe_sim_cfg_t *c, item_t *items, int n, lrmoe_sim_acc_t *accp,
                        lrmoe_sim_worst_t *wp)
{
    const int np = c->np, P = c->P, npr = c->npress;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        item_t *it = &items[i];
        if (lrmoe_sim_acc_add(accp, it->rows) < 0) {
            rc = -1;
            break;
        }
        if (it->do_press) {
            /* the ideal bound in the last column */
            int64_t N = 0;
            for (int e = 0; e < it->E; e++)
                N += it->load[e];
            for (int k = 0; k < npr; k++) {
                double mult = c->pressure[k];
                int K = it->K > 0 ? it->K : it->o.cost.K;
                if (c->pbase > 0 && N > 0)
                    mult *= (double)c->pbase * P * K / (double)N;
                it->frac[(size_t)k * (np + 1) + np] =
                    lrmoe_sim_pressure_ideal(&it->o.cost, N, P, mult);
            }
            lrmoe_sim_acc_add_pressure(accp, it->frac, it->rho);
        }
        if (c->track_worst)
            track_worst(wp, c, it);
        if (c->tsv)
            for (int j = 0; j < np && !rc; j++)
                if (lrmoe_sim_tsv_row(c->tsv, it->index, it->layer, it->step, c->pl[j].label,
                                      &it->rows[j]) < 0)
                    rc = lrmoe_err("--tsv: write failed");
    }
    for (int i = 0; i < n && c->rank_tsv && !rc; i++) {
        const item_t *it = &items[i];
        for (int j = 0; j < np; j++)
            for (int p = 0; p < P; p++)
                fprintf(c->rank_tsv, "%lld\t%s\t%s\t%s\t%d\t%lld\t%lld\t%lld\n",
                        (long long)it->index, it->layer, it->step, c->pl[j].label, p,
                        (long long)it->rank_fwd[(size_t)j * P + p],
                        (long long)it->rank_bwd[(size_t)j * P + p],
                        (long long)it->rank_moved[(size_t)j * P + p]);
        if (ferror(c->rank_tsv))
            rc = lrmoe_err("--rank-tsv: write failed");
    }
    return rc;
}

/* The first frame's model sizes into out->model; out->model_varies once a
 * frame's D, F, K or dtype differ from them */
static void note_model(lrmoe_sim_result_t *out, const lrmoe_cost_model_t *m, int *have)
{
    if (!*have) {
        out->model = *m;
        *have = 1;
    } else if (m->D != out->model.D || m->F != out->model.F || m->K != out->model.K ||
               m->dtype_bytes != out->model.dtype_bytes) {
        out->model_varies = 1;
    }
}

static int sim_run(const lrmoe_sim_cfg_t *c, lrmoe_reader_t *rd, const lrmoe_sim_trace_t *tr,
                   lrmoe_sim_result_t *out)
{
    const lrmoe_sim_cfg_t *cp = c;
    const int jobs = c->jobs > 0 ? c->jobs : 1;
    const int64_t max_frames = c->max_frames;
    const int B = jobs * BATCH_PER_JOB, np = c->np, P = c->P, npr = c->npress;
    lrmoe_sim_acc_t *accp = &out->acc;
    lrmoe_sim_worst_t *wp = &out->worst;
    item_t *items = calloc((size_t)B, sizeof *items);
    memset(out, 0, sizeof *out);
    out->E = -1;
    wp->before = calloc((size_t)P, sizeof(int64_t));
    wp->fwd = calloc((size_t)np * P, sizeof(int64_t));
    wp->bwd = calloc((size_t)np * P, sizeof(int64_t));
    int rc = 0;
    lrmoe_eplb_cache_t *eplb = NULL;
    if (!items || !wp->before || !wp->fwd || !wp->bwd || lrmoe_sim_acc_init(accp, np, npr) < 0) {
        rc = lrmoe_err("out of memory");
        goto done;
    }
    for (int i = 0; i < B; i++) {
        items[i].rank_fwd = calloc((size_t)np * P, sizeof(int64_t));
        items[i].rank_bwd = calloc((size_t)np * P, sizeof(int64_t));
        items[i].rank_moved = calloc((size_t)np * P, sizeof(int64_t));
        items[i].frac = calloc((size_t)(npr ? npr : 1) * (np + 1), sizeof(double));
        items[i].rho = calloc((size_t)(npr ? npr : 1) * np, sizeof(double));
        if (!items[i].rank_fwd || !items[i].rank_bwd || !items[i].rank_moved || !items[i].frac ||
            !items[i].rho) {
            rc = lrmoe_err("out of memory");
            goto done;
        }
    }

    for (int j = 0; j < np; j++)
        if (c->pl[j].opts.planner == LRMOE_PLANNER_EPLB || c->pl[j].opts.planner == LRMOE_PLANNER_LRMOE)
            if (!eplb && !(eplb = lrmoe_eplb_cache_new())) {
                rc = -1;
                goto done;
            }
    const double t0 = lrmoe_now();
    int64_t nframes = 0, E0 = -1;
    int have_model = 0;
    lrmoe_frame_t f;
    lrmoe_frame_init(&f);
    int eof = 0;
    while (!eof && !rc) {
        /* read a batch: only the loads are kept, the frames are dropped */
        int n = 0;
        while (n < B && (max_frames < 0 || nframes + n < max_frames)) {
            item_t *it = &items[n];
            const char *layer_key;
            if (tr) {
                if (nframes + n >= tr->n) {
                    eof = 1;
                    break;
                }
                const lrmoe_sim_trace_frame_t *tf = &tr->f[nframes + n];
                if (item_from_trace(c, tf, it) < 0) {
                    rc = -1;
                    break;
                }
                layer_key = tf->layer_key;
            } else {
                int r = lrmoe_reader_next(rd, &f);
                if (r < 0) {
                    rc = -1;
                    break;
                }
                if (r == 0) {
                    eof = 1;
                    break;
                }
                it->index = nframes + n;
                copy_attr(it->layer, sizeof it->layer, &f, "layer");
                copy_attr(it->step, sizeof it->step, &f, "step");
                if (lrmoe_sim_frame_load(&f, c->experts, &it->load, &it->E, &it->K) < 0) {
                    rc = lrmoe_err_prefix("frame %lld", (long long)it->index);
                    break;
                }
                layer_key = lrmoe_frame_attr(&f, "layer");
            }
            if (it->E % P) {
                rc = lrmoe_err("frame %lld: %d ranks do not divide %d experts",
                               (long long)it->index, P, it->E);
                free(it->load);
                it->load = NULL;
                break;
            }
            if (!tr && frame_opts(c, &f, it->K, &it->o) < 0) {
                rc = lrmoe_err_prefix("frame %lld", (long long)it->index);
                free(it->load);
                it->load = NULL;
                break;
            }
            if (E0 < 0)
                E0 = it->E;
            note_model(out, &it->o.cost, &have_model);
            if (eplb) {
                const lrmoe_eplb_layout_t *lay;
                if (lrmoe_plan_opts_check(&it->o, it->E) < 0 ||
                    lrmoe_eplb_step(eplb, layer_key, &it->o, it->load,
                                    it->E, &lay) < 0 ||
                    lrmoe_eplb_layout_copy(&it->lay, lay) < 0) {
                    rc = lrmoe_err_prefix("frame %lld", (long long)it->index);
                    free(it->load);
                    it->load = NULL;
                    break;
                }
                it->o.eplb_layout = &it->lay;
            }
            it->do_press = npr > 0 && it->index % c->pevery == 0;
            n++;
        }
        if (!eof && max_frames >= 0 && nframes + n >= max_frames)
            eof = 1;
        if (rc || n == 0) {
            free_items(items, n);
            break;
        }
        if (run_batch(cp, items, n, jobs) < 0) {
            rc = -1;
            free_items(items, n);
            break;
        }
        rc = absorb_batch(c, items, n, accp, wp);
        free_items(items, n);
        nframes += n;
        if (c->progress)
            c->progress(nframes, lrmoe_now() - t0, c->progress_arg);
    }
    lrmoe_frame_clear(&f);
    out->frames = nframes;
    out->E = E0;
done:
    lrmoe_eplb_cache_free(eplb);
    for (int i = 0; items && i < B; i++) {
        lrmoe_eplb_layout_free(&items[i].lay);
        free(items[i].rank_fwd);
        free(items[i].rank_bwd);
        free(items[i].rank_moved);
        free(items[i].frac);
        free(items[i].rho);
    }
    free(items);
    return rc < 0 ? -1 : 0;
}

void lrmoe_sim_result_free(lrmoe_sim_result_t *r)
{
    lrmoe_sim_acc_free(&r->acc);
    free(r->worst.before);
    free(r->worst.fwd);
    free(r->worst.bwd);
    memset(r, 0, sizeof *r);
}
