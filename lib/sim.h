/* sim: replay routing traces through the planners on a modelled cluster.
 *
 * Every figure comes from the same library code lrmoe-plan uses:
 * lrmoe_plan_compute() for the plan and lrmoe_cost_eval() for the memory and
 * time model (lib/cost.h). This module adds what a replay needs on top:
 * the per-frame figures of a plan, accumulators with exact means and
 * percentiles over frames, the effective-throughput (batch pressure)
 * experiment, and the two-level bandwidth adapter.
 *
 * Two-level bandwidth (adapter, see lrmoe_sim_bw_effective): token origins
 * are uniform over ranks in the cost model, so a rank with G = P/nodes ranks
 * per node sends the fraction (G-1)/(P-1) of its all-to-all bytes inside its
 * node and (P-G)/(P-1) across nodes, over separate links at once. A phase of
 * B bytes then takes max(B*(G-1)/(P-1)/bw_intra, B*(P-G)/(P-1)/bw_inter) =
 * B / bw_eff, so the single-bandwidth cost model evaluated at bw_eff gives the
 * two-level times exactly; the simulator runs lrmoe_plan_compute with
 * cost.bw = bw_eff (lrmoe-plan --bw bw_eff reproduces every frame).
 *
 * The library never prints; lrmoe_sim_report() writes the summary table to
 * a FILE* the caller chooses.
 */
#ifndef LRMOE_SIM_H
#define LRMOE_SIM_H

#include <stdint.h>
#include <stdio.h>

#include "lrmoe.h"
#include "plan.h"
#include "plan_cli.h"
#include "plot.h"

#define LRMOE_SIM_MAX_PLANNERS 16
#define LRMOE_SIM_MAX_PRESSURE 32

/* Per-frame figures of one planner (all memory at the rank whose charged
 * memory is highest; all times the bulk-synchronous critical path: each
 * phase lasts as long as its slowest rank). */
enum {
    LRMOE_SIM_RHO = 0,      /* retention rate sum K_e / N */
    LRMOE_SIM_FWD_PEAK,     /* max_p forward pairs on p */
    LRMOE_SIM_FWD_MEAN,     /* N / P */
    LRMOE_SIM_FWD_IMB,      /* peak / mean (1 when N == 0) */
    LRMOE_SIM_BWD_PEAK,     /* max_p retained pairs on p */
    LRMOE_SIM_BWD_MEAN,     /* sum K_e / P */
    LRMOE_SIM_BWD_IMB,
    LRMOE_SIM_LB,           /* ceil(N/P): min-peak lower bound of any placement */
    LRMOE_SIM_FWD_LB,       /* T* of the chosen placement (plan.fwd_lb) */
    LRMOE_SIM_BWD_LB,       /* T* of the placement and quotas (plan.bwd_lb) */
    LRMOE_SIM_PEAK_LB,      /* fwd_peak / ceil(N/P) */
    LRMOE_SIM_REPLICAS,     /* instances beyond the native ones, all ranks */
    LRMOE_SIM_A2A_BYTES,    /* busiest rank: max_p max(sent_p, received_p)
                               over all five phases (bytes) */
    LRMOE_SIM_MEM_BASE,     /* native expert weights (bytes; resident) */
    LRMOE_SIM_MEM_REPLICA,  /* replica weights + gradient buffers */
    LRMOE_SIM_MEM_TOKENS,   /* fwd + saved + bwd token buffers */
    LRMOE_SIM_MEM_SUBTOTAL, /* base + replica + tokens (Figure 7) */
    LRMOE_SIM_MEM_CHARGED,  /* replica + tokens: what the hbm budget bounds */
    LRMOE_SIM_T_DISPATCH,   /* forward + backward dispatch all-to-all (s) */
    LRMOE_SIM_T_COMPUTE,    /* forward + backward expert GEMMs (s) */
    LRMOE_SIM_T_COMBINE,    /* forward + backward combine all-to-all (s) */
    LRMOE_SIM_T_WEIGHTS,    /* replica weights out and gradients back (s) */
    LRMOE_SIM_T_BWD,        /* backward only: dispatch + compute + combine (s) */
    LRMOE_SIM_T_TOTAL,      /* forward + backward layer time (s) */
    LRMOE_SIM_FEASIBLE,     /* 1 fits hbm and window, else 0 */
    LRMOE_SIM_PLAN_MS,      /* wall time of lrmoe_plan_compute (ms) */
    LRMOE_SIM_T_BWD_DISPATCH, /* backward only: dispatch all-to-all (s) */
    LRMOE_SIM_T_BWD_COMPUTE,  /* backward only: expert GEMMs (s) */
    LRMOE_SIM_T_BWD_COMBINE,  /* backward only: combine all-to-all (s);
                                 forward = T_DISPATCH etc. minus these */
    LRMOE_SIM_NMETRICS
};

typedef struct {
    const char *name;   /* TSV column */
    const char *label;  /* table row */
    const char *unit;   /* table unit: "", "pairs", "GiB", "MiB", "ms", "%" */
    double scale;       /* value * scale is shown in the table */
} lrmoe_sim_metric_t;

const lrmoe_sim_metric_t *lrmoe_sim_metric(int i);

typedef struct {
    double v[LRMOE_SIM_NMETRICS];
} lrmoe_sim_row_t;

/* One planner as the simulator runs it: a label ("lrmoe", "lrmoe@0.8") and
 * the complete lrmoe-plan options (best_effort is forced on: infeasible plans
 * are recorded, not fatal). */
typedef struct {
    char label[32];
    lrmoe_plan_opts_t opts;
} lrmoe_sim_planner_t;

/* Parse "fixed,llep,eplb,lrmoe,lrmoe@0.8" into planners copied from base
 * (lrmoe@R means a fixed rate R). Returns the count, -1 with error. */
int lrmoe_sim_parse_planners(const char *s, const lrmoe_plan_opts_t *base,
                             lrmoe_sim_planner_t *out, int max);

/* Two-level bandwidth: the effective per-rank all-to-all bandwidth
 * (bytes/s) of P ranks over nodes nodes (see the top of this file).
 * Returns bw_intra when nodes == 1 or P == 1, -1 on bad arguments. */
double lrmoe_sim_bw_effective(int P, int nodes, double bw_intra, double bw_inter);

/* Per-expert loads of a frame: expert_load [E] (any integer dtype), else
 * topk_ids [T,K] counted over E experts, E from experts_hint (> 0), else
 * from router_logits [T,E]. *load is malloc'd (E). *pairs_per_token gets K
 * when known (topk_ids shape or attribute route.topk / topk), else 0.
 * 0 ok, -1 with error. */
int lrmoe_sim_frame_load(const lrmoe_frame_t *f, int experts_hint, int64_t **load,
                         int *E, int *pairs_per_token);

/* Plan load with planner pl (through lrmoe_plan_compute), then fill row from
 * the plan and the lrmoe_cost_eval() result lrmoe_plan_compute already made
 * for it (plan->rank, plan->cost: the model is evaluated once per plan).
 * plan is reused scratch (lrmoe_plan_init'd).
 * fwd_rank / bwd_rank (P, may be NULL) get the per-rank pair counts. */
int lrmoe_sim_eval(const lrmoe_sim_planner_t *pl, const int64_t *load, int E,
                   lrmoe_plan_t *plan, lrmoe_sim_row_t *row, int64_t *fwd_rank,
                   int64_t *bwd_rank);

/* Figures of an already computed plan (what lrmoe_sim_eval does after the
 * plan): used by the tests to compare against lrmoe-plan's output. */
int lrmoe_sim_row_from_plan(const lrmoe_cost_model_t *m, const lrmoe_plan_t *plan,
                            const int64_t *load, lrmoe_sim_row_t *row);

/* ---------------------------------------------------------- pressure */

/* Effective throughput at batch multiplier mult: loads scaled to
 * llround(mult * load[e]) and planned with pl. 1 when the plan fits the
 * budgets; else the largest fraction s of the offered batch whose workload
 * would fit with the same plan: token memory and all-to-all time scale with
 * the batch, replica memory does not, so
 *   s = min over ranks of (hbm - replica_p) / tokens_p, and window / t_comm;
 * clamped to [0,1]. rho gets the plan's retention rate. */
int lrmoe_sim_pressure(const lrmoe_sim_planner_t *pl, const int64_t *load, int E,
                       double mult, lrmoe_plan_t *scratch, int64_t *scaled,
                       double *fraction, double *rho);

/* The ideal bound: perfectly balanced, uncompressed (every rank holds
 * ceil(mult*N/P) forward and backward rows), replicas free:
 *   min(1, hbm / lrmoe_cost_rank_mem(m, 0, r, r)), and 1 when hbm == 0. */
double lrmoe_sim_pressure_ideal(const lrmoe_cost_model_t *m, int64_t N, int P, double mult);

/* ---------------------------------------------------------- accumulators */

/* Exact means and percentiles: every per-frame value is kept as a float
 * (4 bytes per metric, planner and frame; the frames themselves are not);
 * means come from double sums. */
typedef struct {
    int nplanners, npressure;
    size_t n, cap;               /* frames added */
    float *v;                    /* (cap, nplanners, NMETRICS) */
    double *sum;                 /* (nplanners, NMETRICS) */
    double *press;               /* (npressure + 1) x (nplanners + 1) sums:
                                    fraction per planner, then ideal */
    double *press_rho;           /* (npressure) x (nplanners) sums of rho */
    size_t npress_frames;
} lrmoe_sim_acc_t;

int lrmoe_sim_acc_init(lrmoe_sim_acc_t *a, int nplanners, int npressure);
void lrmoe_sim_acc_free(lrmoe_sim_acc_t *a);
/* rows is (nplanners) for one frame. */
int lrmoe_sim_acc_add(lrmoe_sim_acc_t *a, const lrmoe_sim_row_t *rows);
/* frac is (npressure, nplanners + 1) (last column ideal), rho (npressure, nplanners). */
void lrmoe_sim_acc_add_pressure(lrmoe_sim_acc_t *a, const double *frac, const double *rho);
double lrmoe_sim_acc_mean(const lrmoe_sim_acc_t *a, int planner, int metric);
/* Nearest-rank quantile q in [0,1] (the ceil(q*n)-th smallest; q=0 the
 * minimum). NaN when no frames. */
double lrmoe_sim_acc_quantile(const lrmoe_sim_acc_t *a, int planner, int metric, double q);
/* Mean effective throughput at pressure index i for planner j (j ==
 * nplanners: the ideal bound), and mean rho. NaN when none. */
double lrmoe_sim_acc_pressure(const lrmoe_sim_acc_t *a, int i, int j);
double lrmoe_sim_acc_pressure_rho(const lrmoe_sim_acc_t *a, int i, int j);

/* Nearest-rank quantile of v[0..n) (sorts v in place). */
double lrmoe_sim_quantile(double *v, size_t n, double q);

/* ---------------------------------------------------------- replay */

/* What lrmoe_sim_run replays with. */
typedef struct {
    lrmoe_sim_planner_t pl[LRMOE_SIM_MAX_PLANNERS];
    int np;
    lrmoe_plan_opts_t base;  /* options every planner starts from */
    lrmoe_plan_cli_t given;  /* which model sizes the command line gave (they
                                must agree with the frames') */
    int experts;             /* E for topk_ids-only frames (0: from the frame) */
    double pressure[LRMOE_SIM_MAX_PRESSURE];
    int npress;
    int64_t pbase, pevery;   /* pressure: tokens per rank at x1 (0: the
                                trace's), every pevery-th frame */
    int P;
    int jobs;                /* worker threads (>= 1) */
    int64_t max_frames;      /* stop after this many (-1: all) */
    FILE *tsv, *rank_tsv;    /* per-frame / per-rank rows (may be NULL) */
    int track_worst;         /* keep the worst frame for lrmoe_sim_plots */
    void (*progress)(int64_t frames, double seconds, void *arg); /* per batch */
    void *progress_arg;
} lrmoe_sim_cfg_t;

/* The frame with the worst plain-EP imbalance: its per-rank loads. */
typedef struct {
    double imb;
    int64_t index;
    char layer[32], step[32];
    int have;
    int64_t *before;            /* (P) plain EP */
    int64_t *fwd, *bwd;         /* (np, P) */
    double rho[LRMOE_SIM_MAX_PLANNERS];
} lrmoe_sim_worst_t;


typedef struct {
    lrmoe_sim_acc_t acc;     /* figures of every frame */
    lrmoe_sim_worst_t worst; /* with track_worst */
    int64_t frames;
    int E;                   /* experts of the first frame (-1: none) */
    lrmoe_cost_model_t model; /* the first frame's model sizes (D, F, K, ...) */
    int model_varies;        /* a later frame's D, F, K or dtype differ */
} lrmoe_sim_result_t;

/* Replay every frame of rd: per frame its loads (lrmoe_sim_frame_load), the
 * model sizes from the frame unless set, deployed EPLB's layout per layer,
 * then every planner and pressure point on a pool of c->jobs threads, in
 * batches of 4 frames per thread; rows go to c->tsv / c->rank_tsv in frame
 * order. 0, or -1 with the error set ("frame N: ..."). out is always
 * initialised: free it with lrmoe_sim_result_free. */
int lrmoe_sim_run(const lrmoe_sim_cfg_t *c, lrmoe_reader_t *rd, lrmoe_sim_result_t *out);
void lrmoe_sim_result_free(lrmoe_sim_result_t *r);

/* 1 when gnuplot is on PATH. */
int lrmoe_sim_have_gnuplot(void);
/* The figures (load, memory, latency, pressure) as gnuplot scripts, data and
 * rendered plots in dir (which must exist); runs gnuplot with its stdout
 * on stderr. 0 or -1. */
int lrmoe_sim_plots(const char *dir, lrmoe_plot_fmt_t fmt, const lrmoe_sim_cfg_t *c,
                    const lrmoe_sim_acc_t *a, const lrmoe_sim_worst_t *w);
/* The loads and model sizes of the frames lrmoe-plan planned, kept in
 * memory (E int64 per frame) for lrmoe-plan --plot: the figure needs no
 * second read of the trace, so the trace may come from a pipe. */
typedef struct {
    int64_t index;
    char layer[32], step[32];   /* as lrmoe-sim's TSV shows them ("NA") */
    char *layer_key;            /* the attribute layer (EPLB's key), or NULL */
    int E;
    int64_t *load;              /* (E) */
    lrmoe_cost_model_t cost;    /* the frame's model sizes as planned */
} lrmoe_sim_trace_frame_t;

typedef struct {
    int64_t n, cap;
    lrmoe_sim_trace_frame_t *f;
} lrmoe_sim_trace_t;

/* Append frame index of f: a copy of load[E], its layer and step, and the
 * cost model it was planned with. 0 or -1 (out of memory). */
int lrmoe_sim_trace_add(lrmoe_sim_trace_t *t, int64_t index, const lrmoe_frame_t *f,
                        const int64_t *load, int E, const lrmoe_cost_model_t *m);
void lrmoe_sim_trace_free(lrmoe_sim_trace_t *t);

/* lrmoe-plan --plot FILE: replay the frames of t through fixed, llep, eplb
 * and lrmoe with cli's options (each frame with its own model sizes) and
 * draw the per-rank load of its worst plain-EP frame before and after each
 * (lrmoe_sim_plots' load figure) as FILE, which ends in .svg or .png;
 * FILE's .gp and .dat are left beside it. 0, or -1 with error. */
int lrmoe_sim_plot_trace(const lrmoe_sim_trace_t *t, const lrmoe_plan_cli_t *cli,
                         const char *file);
/* lrmoe_sim_plot_trace's checks of FILE, before any frame is read:
 * the extension, gnuplot on PATH. 0, or -1 with error. */
int lrmoe_sim_plot_check(const char *file);

/* ---------------------------------------------------------- reports */

/* TSV: header, then one line per (frame, planner). */
int lrmoe_sim_tsv_header(FILE *fp);
int lrmoe_sim_tsv_row(FILE *fp, int64_t frame, const char *layer, const char *step,
                      const char *planner, const lrmoe_sim_row_t *row);

/* The summary table: per metric mean and p99 per planner, ratios against
 * the planner labelled "fixed" (when present), and the pressure table. */
int lrmoe_sim_report(FILE *fp, const lrmoe_sim_acc_t *a, const lrmoe_sim_planner_t *pl,
                     const double *pressure);

#endif
