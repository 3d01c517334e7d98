/* lrmoe-sim: replay routing traces through every planner on a modelled
 * cluster; summary table on stdout, per-frame TSV, pressure experiment,
 * gnuplot figures. The work is lib/sim.c over lib/plan.c and lib/cost.c. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lrmoe.h"
#include "plan_cli.h"
#include "plot.h"
#include "sim.h"

#define TOOL "lrmoe-sim"
#define BATCH_PER_JOB 4 /* frames read ahead per worker thread */

static void usage(FILE *fp)
{
    fprintf(fp,
        "Usage: lrmoe-sim [options] [FILE]\n"
        "Replay a stream of routing frames (expert_load [E], or topk_ids [T,K] reduced\n"
        "to loads) through every planner on a modelled cluster. Per frame and planner:\n"
        "per-rank forward and backward load, peak/mean, lower bound, all-to-all bytes on\n"
        "the busiest rank, memory split (base experts, replicas, token buffers), the\n"
        "critical-path time of dispatch, compute and combine, and feasibility, all from\n"
        "the library code of lrmoe-plan. Prints a summary table (mean, p99, ratio to\n"
        "fixed) on stdout. Every memory and time figure is modelled, not measured.\n\n"
        "Replay:\n"
        "  -p, --planners LIST   planners to compare (default fixed,llep,eplb,lrmoe);\n"
        "                        lrmoe@R is lrmoe at the single rate R\n"
        "  -E, --experts E       experts, for frames with topk_ids only\n"
        "  -t, --tsv FILE        one TSV row per frame and planner\n"
        "  -R, --rank-tsv FILE   one TSV row per frame, planner and rank: forward and\n"
        "                        backward pairs\n"
        "  -x, --pressure LIST   effective-throughput experiment at these batch\n"
        "                        multipliers, e.g. 1,2,4,8,16,20\n"
        "      --pressure-base T tokens per rank at multiplier 1 (default: the trace's)\n"
        "      --pressure-every N  run the pressure experiment on every N-th frame (1)\n"
        "  -g, --plot DIR        write figures (gnuplot) into DIR\n"
        "      --plot-format F   svg (default) or png\n"
        "  -j, --jobs N          planner threads (default: online CPUs, at most 8)\n"
        "  -n, --frames N        stop after N frames\n"
        "  -Q, --quiet           no progress line\n"
        "Cluster (defaults: the LRMoE paper's setup, one node of 8 GPUs):\n"
        "  -P, --ranks P         expert-parallel ranks (default 8; must divide E)\n"
        "  -N, --nodes N         nodes (default 1; must divide P)\n"
        "  -M, --hbm BYTES       budget for replicas + buffers per rank (default 16GiB;\n"
        "                        0 = unlimited)\n"
        "      --gpu-mem BYTES   with --resident: hbm = gpu-mem - resident\n"
        "      --resident BYTES\n"
        "  -B, --bw BYTES/S      all-to-all bandwidth per rank inside a node (100e9)\n"
        "      --bw-inter BYTES/S  per rank between nodes (default 50e9)\n"
        "  -W, --window SEC      all-to-all window (default 0 = unlimited)\n"
        "      --flops F         expert GEMM FLOP/s per rank (default 400e12)\n"
        "Model (default: from the frame, else the paper's):\n"
        "  -D, --hidden D        hidden size (from hidden [T,D], else 2048)\n"
        "  -F, --ffn F           expert FFN width (default 768)\n"
        "  -K, --topk K          top-k (from topk_ids, else 8)\n"
        "  -T, --tokens T        tokens per rank (from topk_ids, else 32768)\n"
        "      --dtype NAME      storage dtype (of hidden, else BF16)\n"
        "Planner options (as lrmoe-plan):\n"
        "  -G, --groups G        eplb expert groups (default: nodes)\n"
        "  -s, --slots S         expert slots per rank (eplb, lrmoe; default E/P+2)\n"
        "      --rebalance-every N  eplb: frames of a layer between rearrangements\n"
        "                        (default 3000; 0 = every frame from its own loads)\n"
        "      --lambda L        llep imbalance threshold (default 1.3)\n"
        "      --alpha A         llep capacity factor (default 1.0)\n"
        "  -m, --min-chunk M     llep minimum rows per spilled chunk (default 1024)\n"
        "  -r, --rates LIST      lrmoe candidate rates (default 1.0,0.9,0.8,0.7)\n"
        "  -q, --quota POLICY    even (default), minpeak or proportional\n"
        "  -k, --min-keep F      every expert keeps >= ceil(F*n_e) (default 0.25)\n"
        "      --longer-backward when no rate has a plan whose modelled backward is\n"
        "                        within that of keeping every pair, take a longer one\n"
        "      --glpk-time SEC   GLPK time limit per solve (default 10)\n"
        "BYTES take K, M, G, T (powers of 1024) or KB, MB, GB, TB (powers of 1000).\n"
        "  -h, --help            this help\n"
        "  -V, --version         print the version\n");
}

enum { OPT_BW_INTER = LRMOE_PLAN_OPT_END, OPT_PBASE, OPT_PEVERY, OPT_PLOTFMT };

/* "1,2,4" -> multipliers (each > 0). Returns the count or -1. */
static int parse_list(const char *opt, const char *s, double *out, int max)
{
    int n = 0;
    const char *p = s;
    if (!*p)
        return lrmoe_err("%s: empty list", opt);
    while (*p) {
        char *end;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || errno || !(v > 0) || v > 1e6)
            return lrmoe_err("%s: bad multiplier in '%s' (each > 0)", opt, s);
        if (n >= max)
            return lrmoe_err("%s: more than %d values", opt, max);
        out[n++] = v;
        p = end;
        if (*p == ',') {
            p++;
            if (!*p)
                return lrmoe_err("%s: trailing comma in '%s'", opt, s);
        } else if (*p) {
            return lrmoe_err("%s: bad multiplier in '%s'", opt, s);
        }
    }
    return n;
}

/* ------------------------------------------------------------ state */

typedef struct {
    lrmoe_sim_planner_t pl[LRMOE_SIM_MAX_PLANNERS];
    int np;
    lrmoe_plan_opts_t base;  /* options every planner starts from */
    int set_D, set_K, set_T, set_dtype;
    int experts;             /* --experts */
    double pressure[LRMOE_SIM_MAX_PRESSURE];
    int npress;
    int64_t pbase, pevery;
    int P;
} cfg_t;

/* One frame of a batch: its load and, after the workers ran, its figures. */
typedef struct {
    int64_t index;
    char layer[32], step[32];
    int E, K;
    int64_t *load;              /* (E) */
    lrmoe_plan_opts_t o;        /* the frame's model sizes, before the planner */
    lrmoe_sim_row_t rows[LRMOE_SIM_MAX_PLANNERS];
    int64_t *rank_fwd, *rank_bwd; /* (np, P) */
    int do_press;
    double *frac, *rho;         /* (npress, np+1), (npress, np) */
    lrmoe_eplb_layout_t lay;    /* deployed EPLB's layout for this frame */
} item_t;

typedef struct {
    const cfg_t *c;
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
    const cfg_t *c = w->c;
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
    pl.opts.best_effort = 1;
    if (i < 0)
        return lrmoe_sim_eval(&pl, it->load, it->E, plan, &it->rows[j],
                              it->rank_fwd + (size_t)j * c->P, it->rank_bwd + (size_t)j * c->P);
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
 * takes them. */
static void frame_opts(const cfg_t *c, const lrmoe_frame_t *f, int K, lrmoe_plan_opts_t *o)
{
    *o = c->base;
    const lrmoe_tensor_t *ti = lrmoe_frame_get(f, "topk_ids");
    if (ti && ti->ndim == 2) {
        if (!c->set_K)
            o->cost.K = (int)ti->shape[1];
        if (!c->set_T)
            o->cost.tokens = ti->shape[0] / o->P;
    } else if (K > 0 && !c->set_K) {
        o->cost.K = K;
    }
    const lrmoe_tensor_t *hd = lrmoe_frame_get(f, "hidden");
    if (hd && hd->ndim == 2) {
        if (!c->set_D)
            o->cost.D = hd->shape[1];
        if (!c->set_dtype)
            o->cost.dtype_bytes = (int)lrmoe_dtype_size(hd->dtype);
    }
}

static void copy_attr(char *dst, size_t len, const lrmoe_frame_t *f, const char *key)
{
    const char *v = lrmoe_frame_attr(f, key);
    snprintf(dst, len, "%s", v && *v && !strpbrk(v, "\t\n") ? v : "NA");
}

/* ------------------------------------------------------------ plots */

/* The frame with the worst plain-EP imbalance: its per-rank loads. */
typedef struct {
    double imb;
    int64_t index;
    char layer[32], step[32];
    int have;
    int64_t *before;            /* (P) plain EP */
    int64_t *fwd, *bwd;         /* (np, P) */
    double rho[LRMOE_SIM_MAX_PLANNERS];
} worst_t;

static void track_worst(worst_t *w, const cfg_t *c, const item_t *it)
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

static int have_gnuplot(void)
{
    const char *path = getenv("PATH");
    if (!path)
        return 0;
    char *dup = strdup(path), *save = NULL;
    int ok = 0;
    for (char *d = strtok_r(dup, ":", &save); d && !ok; d = strtok_r(NULL, ":", &save)) {
        char buf[4096];
        snprintf(buf, sizeof buf, "%s/gnuplot", *d ? d : ".");
        ok = access(buf, X_OK) == 0;
    }
    free(dup);
    return ok;
}

/* Run gnuplot NAME.gp inside dir; 0 ok, -1 with error. */
static int run_gnuplot(const char *dir, const char *name)
{
    char gp[1024];
    snprintf(gp, sizeof gp, "%s.gp", name);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return lrmoe_err("gnuplot: fork: %s", strerror(errno));
    if (pid == 0) {
        if (chdir(dir) != 0)
            _exit(127);
        if (!freopen("/dev/null", "r", stdin) || dup2(2, 1) < 0)
            _exit(127);
        execlp("gnuplot", "gnuplot", gp, (char *)NULL);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return lrmoe_err("gnuplot: wait: %s", strerror(errno));
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return lrmoe_err("gnuplot %s/%s failed (status %d)", dir, gp,
                         WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return 0;
}

static int write_plots(const char *dir, lrmoe_plot_fmt_t fmt, const cfg_t *c,
                       const lrmoe_sim_acc_t *a, const worst_t *w)
{
    const int np = c->np, P = c->P;
    const char *labels[LRMOE_SIM_MAX_PLANNERS];
    for (int j = 0; j < np; j++)
        labels[j] = c->pl[j].label;
    char title[512];

    /* 1. load per rank before and after planning (the worst frame) */
    {
        int ns = 1 + np;
        for (int j = 0; j < np; j++)
            ns += w->rho[j] < 1;
        double *x = malloc(P * sizeof *x), *y = malloc((size_t)ns * P * sizeof *y);
        const char **sl = malloc(ns * sizeof *sl);
        int *dash = calloc(ns, sizeof *dash);
        char (*names)[64] = calloc(ns, sizeof *names);
        if (!x || !y || !sl || !dash || !names) {
            free(x); free(y); free(sl); free(dash); free(names);
            return lrmoe_err("out of memory");
        }
        int s = 0;
        for (int p = 0; p < P; p++) {
            x[p] = p;
            y[p] = (double)w->before[p];
        }
        sl[s++] = "before: plain EP (= fixed)";
        for (int j = 0; j < np; j++) {
            if (c->pl[j].opts.planner == LRMOE_PLANNER_FIXED) {
                ns--; /* the same as before */
                continue;
            }
            snprintf(names[s], 64, "%s forward", labels[j]);
            sl[s] = names[s];
            for (int p = 0; p < P; p++)
                y[(size_t)s * P + p] = (double)w->fwd[(size_t)j * P + p];
            s++;
            if (w->rho[j] < 1) {
                snprintf(names[s], 64, "%s backward (rho %.2f)", labels[j], w->rho[j]);
                sl[s] = names[s];
                dash[s] = 1;
                for (int p = 0; p < P; p++)
                    y[(size_t)s * P + p] = (double)w->bwd[(size_t)j * P + p];
                s++;
            }
        }
        snprintf(title, sizeof title,
                 "pairs per rank before and after planning (modelled cluster: planned, not measured)\n"
                 "frame %lld (layer %s, step %s): the worst plain-EP peak/mean, %.2f",
                 (long long)w->index, w->layer, w->step, w->imb);
        int r = lrmoe_plot_lines(dir, "load", fmt, title, "rank", "token-expert pairs", P, x,
                                 ns, sl, y, dash, 1);
        free(x); free(y); free(sl); free(dash); free(names);
        if (r < 0)
            return -1;
    }
    /* 2. memory breakdown (Figure 7) */
    {
        static const char *seg[] = {"base experts", "replicas", "token buffers"};
        static const int km[] = {LRMOE_SIM_MEM_BASE, LRMOE_SIM_MEM_REPLICA, LRMOE_SIM_MEM_TOKENS};
        double v[LRMOE_SIM_MAX_PLANNERS * 3];
        for (int j = 0; j < np; j++)
            for (int s = 0; s < 3; s++)
                v[j * 3 + s] = lrmoe_sim_acc_mean(a, j, km[s]) / (1024.0 * 1024.0 * 1024.0);
        snprintf(title, sizeof title,
                 "modelled GPU memory per MoE layer at the busiest rank (mean over %zu frames)",
                 a->n);
        if (lrmoe_plot_stacked(dir, "memory", fmt, title, "GiB (modelled)", np, labels, 3, seg,
                               v) < 0)
            return -1;
    }
    /* 3. latency breakdown (Figure 8) */
    {
        static const char *seg[] = {"expert compute", "dispatch all-to-all",
                                    "combine all-to-all", "replica weights"};
        static const int km[] = {LRMOE_SIM_T_COMPUTE, LRMOE_SIM_T_DISPATCH, LRMOE_SIM_T_COMBINE,
                                 LRMOE_SIM_T_WEIGHTS};
        double v[LRMOE_SIM_MAX_PLANNERS * 4];
        for (int j = 0; j < np; j++)
            for (int s = 0; s < 4; s++)
                v[j * 4 + s] = lrmoe_sim_acc_mean(a, j, km[s]) * 1e3;
        snprintf(title, sizeof title,
                 "modelled MoE-layer latency, forward + backward critical path "
                 "(mean over %zu frames)", a->n);
        if (lrmoe_plot_stacked(dir, "latency", fmt, title, "ms (modelled)", np, labels, 4, seg,
                               v) < 0)
            return -1;
    }
    /* 4. effective throughput vs pressure (Figure 6) */
    if (c->npress && a->npress_frames) {
        double x[LRMOE_SIM_MAX_PRESSURE], y[(LRMOE_SIM_MAX_PLANNERS + 1) * LRMOE_SIM_MAX_PRESSURE];
        const char *sl[LRMOE_SIM_MAX_PLANNERS + 1];
        int dash[LRMOE_SIM_MAX_PLANNERS + 1] = {0};
        for (int i = 0; i < c->npress; i++)
            x[i] = c->pressure[i];
        for (int j = 0; j <= np; j++) {
            sl[j] = j < np ? labels[j] : "ideal full (balanced, uncompressed)";
            dash[j] = j == np;
            for (int i = 0; i < c->npress; i++)
                y[(size_t)j * c->npress + i] = 100 * lrmoe_sim_acc_pressure(a, i, j);
        }
        snprintf(title, sizeof title,
                 "modelled effective backward throughput under batch pressure (%zu frames)",
                 a->npress_frames);
        if (lrmoe_plot_lines(dir, "pressure", fmt, title, "batch-size multiplier",
                             "% of offered batch that fits (modelled)", c->npress, x, np + 1,
                             sl, y, dash, 0) < 0)
            return -1;
    }
    static const char *names[] = {"load", "memory", "latency", "pressure"};
    for (int i = 0; i < 4; i++) {
        if (i == 3 && !(c->npress && a->npress_frames))
            break;
        if (run_gnuplot(dir, names[i]) < 0)
            return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ main */

static void free_items(item_t *items, int n)
{
    for (int i = 0; i < n; i++) {
        free(items[i].load);
        items[i].load = NULL;
    }
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"planners", required_argument, 0, 'p'},
        {"experts", required_argument, 0, 'E'},
        {"tsv", required_argument, 0, 't'},
        {"rank-tsv", required_argument, 0, 'R'},
        {"pressure", required_argument, 0, 'x'},
        {"pressure-base", required_argument, 0, OPT_PBASE},
        {"pressure-every", required_argument, 0, OPT_PEVERY},
        {"plot", required_argument, 0, 'g'},
        {"plot-format", required_argument, 0, OPT_PLOTFMT},
        {"jobs", required_argument, 0, 'j'},
        {"frames", required_argument, 0, 'n'},
        {"quiet", no_argument, 0, 'Q'},
        {"bw-inter", required_argument, 0, OPT_BW_INTER},
        LRMOE_PLAN_LONGOPTS,
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0}};
    cfg_t c;
    memset(&c, 0, sizeof c);
    lrmoe_plan_opts_default(&c.base);
    c.pevery = 1;
    const char *planners = "fixed,llep,eplb,lrmoe", *tsv_path = NULL, *plot_dir = NULL,
               *rank_path = NULL;
    lrmoe_plot_fmt_t fmt = LRMOE_PLOT_SVG;
    double bw_inter = 50e9;
    int64_t jobs = 0, max_frames = -1, v;
    int quiet = 0, ch;
    lrmoe_plan_cli_t cli;
    lrmoe_plan_cli_init(&cli, &c.base);
    while ((ch = getopt_long(argc, argv, "p:E:t:R:x:g:j:n:Q" LRMOE_PLAN_SHORTOPTS "hV", longopts,
                             NULL)) != -1) {
        int r = lrmoe_plan_cli_opt(&cli, ch, optarg);
        if (r > 0)
            continue;
        switch (r < 0 ? 0 : ch) { /* 0: a bad value of a shared option */
        case 0: break;
        case 'p': planners = optarg; break;
        case 'E':
            r = lrmoe_parse_i64("--experts", optarg, 1, 1 << 20, &v);
            c.experts = (int)v;
            break;
        case 't': tsv_path = optarg; break;
        case 'R': rank_path = optarg; break;
        case 'x': r = c.npress = parse_list("--pressure", optarg, c.pressure, LRMOE_SIM_MAX_PRESSURE); break;
        case OPT_PBASE: r = lrmoe_parse_i64("--pressure-base", optarg, 1, INT64_C(1) << 40, &c.pbase); break;
        case OPT_PEVERY: r = lrmoe_parse_i64("--pressure-every", optarg, 1, INT64_C(1) << 40, &c.pevery); break;
        case 'g': plot_dir = optarg; break;
        case OPT_PLOTFMT: r = lrmoe_plot_fmt_parse(optarg, &fmt); break;
        case 'j': r = lrmoe_parse_i64("--jobs", optarg, 1, 256, &jobs); break;
        case 'n': r = lrmoe_parse_i64("--frames", optarg, 0, INT64_MAX, &max_frames); break;
        case 'Q': quiet = 1; break;
        case OPT_BW_INTER: r = lrmoe_parse_bytes("--bw-inter", optarg, &bw_inter); break;
        case 'h': usage(stdout); return 0;
        case 'V': printf(TOOL " (lrmoe) %s\n", LRMOE_VERSION); return 0;
        default: usage(stderr); return 2;
        }
        if (r < 0) {
            fprintf(stderr, TOOL ": %s\n", lrmoe_errmsg());
            return 2;
        }
    }
    if (argc - optind > 1) {
        fprintf(stderr, TOOL ": too many input files (one FILE or stdin)\n");
        return 2;
    }
    if (lrmoe_plan_cli_finish(&cli) < 0) {
        fprintf(stderr, TOOL ": %s\n", lrmoe_errmsg());
        return 2;
    }
    c.set_D = cli.set_D;
    c.set_K = cli.set_K;
    c.set_T = cli.set_T;
    c.set_dtype = cli.set_dtype;
    c.P = c.base.P;
    if (c.base.nodes <= 0 || c.P % c.base.nodes) {
        fprintf(stderr, TOOL ": %d nodes do not divide %d ranks\n", c.base.nodes, c.P);
        return 2;
    }
    const double bw_intra = c.base.cost.bw;
    double bw_eff = lrmoe_sim_bw_effective(c.P, c.base.nodes, bw_intra, bw_inter);
    if (bw_eff < 0) {
        fprintf(stderr, TOOL ": %s\n", lrmoe_errmsg());
        return 2;
    }
    c.base.cost.bw = bw_eff;
    c.np = lrmoe_sim_parse_planners(planners, &c.base, c.pl, LRMOE_SIM_MAX_PLANNERS);
    if (c.np < 0) {
        fprintf(stderr, TOOL ": %s\n", lrmoe_errmsg());
        return 2;
    }
    if (jobs <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        jobs = n < 1 ? 1 : n > 8 ? 8 : n;
    }
    if (plot_dir) {
        if (!have_gnuplot()) {
            fprintf(stderr, TOOL ": --plot: gnuplot not found in PATH "
                            "(Debian: apt-get install gnuplot-nox)\n");
            return 1;
        }
        if (mkdir(plot_dir, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, TOOL ": %s: %s\n", plot_dir, strerror(errno));
            return 1;
        }
    }

    const char *in = optind < argc ? argv[optind] : "-";
    lrmoe_reader_t *rd = lrmoe_reader_open(in);
    if (!rd) {
        fprintf(stderr, TOOL ": %s\n", lrmoe_errmsg());
        return 1;
    }
    FILE *tsv = NULL;
    if (tsv_path) {
        tsv = fopen(tsv_path, "w");
        if (!tsv) {
            fprintf(stderr, TOOL ": %s: %s\n", tsv_path, strerror(errno));
            lrmoe_reader_close(rd);
            return 1;
        }
        lrmoe_sim_tsv_header(tsv);
    }
    FILE *rtsv = NULL;
    if (rank_path) {
        rtsv = fopen(rank_path, "w");
        if (!rtsv) {
            fprintf(stderr, TOOL ": %s: %s\n", rank_path, strerror(errno));
            lrmoe_reader_close(rd);
            return 1;
        }
        fprintf(rtsv, "frame\tlayer\tstep\tplanner\trank\tfwd_pairs\tbwd_pairs\n");
    }

    lrmoe_sim_acc_t acc;
    const int B = (int)jobs * BATCH_PER_JOB, np = c.np, P = c.P, npr = c.npress;
    item_t *items = calloc((size_t)B, sizeof *items);
    worst_t worst;
    memset(&worst, 0, sizeof worst);
    worst.before = calloc((size_t)P, sizeof(int64_t));
    worst.fwd = calloc((size_t)np * P, sizeof(int64_t));
    worst.bwd = calloc((size_t)np * P, sizeof(int64_t));
    int rc = 0;
    if (lrmoe_sim_acc_init(&acc, np, npr) < 0 || !items || !worst.before || !worst.fwd ||
        !worst.bwd) {
        fprintf(stderr, TOOL ": out of memory\n");
        return 1;
    }
    for (int i = 0; i < B; i++) {
        items[i].rank_fwd = calloc((size_t)np * P, sizeof(int64_t));
        items[i].rank_bwd = calloc((size_t)np * P, sizeof(int64_t));
        items[i].frac = calloc((size_t)(npr ? npr : 1) * (np + 1), sizeof(double));
        items[i].rho = calloc((size_t)(npr ? npr : 1) * np, sizeof(double));
        if (!items[i].rank_fwd || !items[i].rank_bwd || !items[i].frac || !items[i].rho) {
            fprintf(stderr, TOOL ": out of memory\n");
            return 1;
        }
    }

    lrmoe_eplb_cache_t *eplb = NULL;
    for (int j = 0; j < np; j++)
        if (c.pl[j].opts.planner == LRMOE_PLANNER_EPLB || c.pl[j].opts.planner == LRMOE_PLANNER_LRMOE)
            if (!eplb && !(eplb = lrmoe_eplb_cache_new())) {
                fprintf(stderr, TOOL ": %s\n", lrmoe_errmsg());
                return 1;
            }
    const int show = !quiet && isatty(2);
    const double t0 = lrmoe_now();
    double last = t0;
    int progress_shown = 0;
    int64_t nframes = 0, E0 = -1;
    lrmoe_frame_t f;
    lrmoe_frame_init(&f);
    int eof = 0;
    while (!eof && !rc) {
        /* read a batch: only the loads are kept, the frames are dropped */
        int n = 0;
        while (n < B && (max_frames < 0 || nframes + n < max_frames)) {
            int r = lrmoe_reader_next(rd, &f);
            if (r < 0) {
                fprintf(stderr, TOOL ": %s\n", lrmoe_errmsg());
                rc = 1;
                break;
            }
            if (r == 0) {
                eof = 1;
                break;
            }
            item_t *it = &items[n];
            it->index = nframes + n;
            copy_attr(it->layer, sizeof it->layer, &f, "layer");
            copy_attr(it->step, sizeof it->step, &f, "step");
            if (lrmoe_sim_frame_load(&f, c.experts, &it->load, &it->E, &it->K) < 0) {
                fprintf(stderr, TOOL ": frame %lld: %s\n", (long long)it->index, lrmoe_errmsg());
                rc = 1;
                break;
            }
            if (it->E % P) {
                fprintf(stderr, TOOL ": frame %lld: %d ranks do not divide %d experts\n",
                        (long long)it->index, P, it->E);
                free(it->load);
                it->load = NULL;
                rc = 1;
                break;
            }
            if (E0 < 0)
                E0 = it->E;
            frame_opts(&c, &f, it->K, &it->o);
            if (eplb) {
                const lrmoe_eplb_layout_t *lay;
                if (lrmoe_plan_opts_check(&it->o, it->E) < 0 ||
                    lrmoe_eplb_step(eplb, lrmoe_frame_attr(&f, "layer"), &it->o, it->load,
                                    it->E, &lay) < 0 ||
                    lrmoe_eplb_layout_copy(&it->lay, lay) < 0) {
                    fprintf(stderr, TOOL ": frame %lld: %s\n", (long long)it->index,
                            lrmoe_errmsg());
                    free(it->load);
                    it->load = NULL;
                    rc = 1;
                    break;
                }
                it->o.eplb_layout = &it->lay;
            }
            it->do_press = npr > 0 && it->index % c.pevery == 0;
            n++;
        }
        if (!eof && max_frames >= 0 && nframes + n >= max_frames)
            eof = 1;
        if (rc || n == 0) {
            free_items(items, n);
            break;
        }
        work_t w;
        memset(&w, 0, sizeof w);
        w.c = &c;
        w.items = items;
        w.nitems = n;
        w.ntasks = n * np * (1 + npr);
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
        if (w.failed) {
            fprintf(stderr, TOOL ": %s\n", w.err);
            free_items(items, n);
            rc = 1;
            break;
        }
        for (int i = 0; i < n && !rc; i++) {
            item_t *it = &items[i];
            if (lrmoe_sim_acc_add(&acc, it->rows) < 0) {
                fprintf(stderr, TOOL ": %s\n", lrmoe_errmsg());
                rc = 1;
                break;
            }
            if (it->do_press) {
                /* the ideal bound in the last column */
                int64_t N = 0;
                for (int e = 0; e < it->E; e++)
                    N += it->load[e];
                for (int k = 0; k < npr; k++) {
                    double mult = c.pressure[k];
                    int K = it->K > 0 ? it->K : it->o.cost.K;
                    if (c.pbase > 0 && N > 0)
                        mult *= (double)c.pbase * P * K / (double)N;
                    it->frac[(size_t)k * (np + 1) + np] =
                        lrmoe_sim_pressure_ideal(&it->o.cost, N, P, mult);
                }
                lrmoe_sim_acc_add_pressure(&acc, it->frac, it->rho);
            }
            if (plot_dir)
                track_worst(&worst, &c, it);
            if (tsv)
                for (int j = 0; j < np; j++)
                    if (lrmoe_sim_tsv_row(tsv, it->index, it->layer, it->step, c.pl[j].label,
                                          &it->rows[j]) < 0) {
                        fprintf(stderr, TOOL ": %s: %s\n", tsv_path, lrmoe_errmsg());
                        rc = 1;
                        break;
                    }
        }
        for (int i = 0; i < n && rtsv; i++) {
            const item_t *it = &items[i];
            for (int j = 0; j < np; j++)
                for (int p = 0; p < P; p++)
                    fprintf(rtsv, "%lld\t%s\t%s\t%s\t%d\t%lld\t%lld\n", (long long)it->index,
                            it->layer, it->step, c.pl[j].label, p,
                            (long long)it->rank_fwd[(size_t)j * P + p],
                            (long long)it->rank_bwd[(size_t)j * P + p]);
            if (ferror(rtsv)) {
                fprintf(stderr, TOOL ": %s: write failed\n", rank_path);
                rc = 1;
                break;
            }
        }
        free_items(items, n);
        nframes += n;
        double now = lrmoe_now();
        if (show && now - t0 > 1.0 && now - last > 0.25) {
            fprintf(stderr, "\r" TOOL ": %lld frames, %.1f frames/s ", (long long)nframes,
                    nframes / (now - t0));
            last = now;
            progress_shown = 1;
        }
    }
    if (progress_shown)
        fprintf(stderr, "\r\033[K");
    lrmoe_frame_clear(&f);
    lrmoe_reader_close(rd);
    if (rtsv && fclose(rtsv) != 0 && !rc) {
        fprintf(stderr, TOOL ": %s: write failed\n", rank_path);
        rc = 1;
    }
    if (tsv && fclose(tsv) != 0 && !rc) {
        fprintf(stderr, TOOL ": %s: write failed\n", tsv_path);
        rc = 1;
    }
    if (!rc) {
        const lrmoe_cost_model_t *m = &c.base.cost;
        char hb[24];
        printf("lrmoe-sim: %lld frames, E=%lld, P=%d over %d node(s); D=%lld F=%lld, "
               "%d-byte storage; hbm %s for replicas and buffers",
               (long long)nframes, (long long)E0, P, c.base.nodes, (long long)m->D,
               (long long)m->F, m->dtype_bytes,
               m->hbm > 0 ? lrmoe_cost_fmt_bytes(m->hbm, hb, sizeof hb) : "unlimited");
        if (m->window > 0)
            printf(", window %.3g ms", m->window * 1e3);
        printf(";\n  bandwidth %.4g GB/s inside, %.4g GB/s between nodes (effective %.4g GB/s); "
               "%.4g TFLOP/s per rank. Memory and time are modelled (lrmoe-plan(1)).\n\n",
               bw_intra / 1e9, bw_inter / 1e9, bw_eff / 1e9, m->flops / 1e12);
        if (nframes == 0)
            printf("no frames\n");
        else if (lrmoe_sim_report(stdout, &acc, c.pl, c.pressure) < 0) {
            fprintf(stderr, TOOL ": %s\n", lrmoe_errmsg());
            rc = 1;
        }
    }
    if (!rc && plot_dir && nframes > 0 && write_plots(plot_dir, fmt, &c, &acc, &worst) < 0) {
        fprintf(stderr, TOOL ": --plot %s: %s\n", plot_dir, lrmoe_errmsg());
        rc = 1;
    }
    lrmoe_eplb_cache_free(eplb);
    for (int i = 0; i < B; i++) {
        lrmoe_eplb_layout_free(&items[i].lay);
        free(items[i].rank_fwd);
        free(items[i].rank_bwd);
        free(items[i].frac);
        free(items[i].rho);
    }
    free(items);
    free(worst.before);
    free(worst.fwd);
    free(worst.bwd);
    lrmoe_sim_acc_free(&acc);
    lrmoe_plan_thread_cleanup();
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, TOOL ": stdout: write failed\n");
        rc = 1;
    }
    return rc;
}
