/* Expert-parallel plans: which ranks hold which experts, where every forward
 * pair runs, how many pairs each expert retains for backward (quota) and where
 * the retained pairs run.
 *
 * Planners: fixed (plain EP), llep (least-loaded spill), eplb (DeepSeek EPLB
 * redundant experts), lrmoe (Algorithm 1 of the LRMoE paper: quotas, replicas
 * and a min-peak integer allocation solved with GLPK), capacity (plain EP
 * with Megatron-Core's capacity-factor token dropping, capacity.h).
 *
 * Conventions: E experts, P ranks, rank r natively owns experts
 * [r*E/P, (r+1)*E/P). Matrices are row-major [E,P]: x[e*P + p].
 * The library never prints; errors return <0 with lrmoe_errmsg() set.
 */
#ifndef LRMOE_PLAN_H
#define LRMOE_PLAN_H

/* Only what the installed headers declare is exported (the library is
 * built with -fvisibility=hidden, lrmoe(3)). */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#include <stdint.h>
#include "lrmoe.h"
#include "capacity.h"
#include "cost.h"
#include "minpeak.h"

typedef enum {
    LRMOE_PLANNER_FIXED = 0,
    LRMOE_PLANNER_LLEP,
    LRMOE_PLANNER_EPLB,
    LRMOE_PLANNER_LRMOE,
    LRMOE_PLANNER_CAPACITY     /* plain EP, each expert capped at its capacity
                                  in forward and backward (a modelled baseline:
                                  lrmoe-plan(1), PLANNERS) */
} lrmoe_planner_t;

typedef enum {
    LRMOE_QUOTA_MINPEAK = 0,   /* quotas that minimise the backward peak */
    LRMOE_QUOTA_PROPORTIONAL,  /* K_e = rho*n_e, largest remainders */
    LRMOE_QUOTA_EVEN           /* the least backward peak, then the least
                                  largest per-expert drop fraction (default) */
} lrmoe_quota_policy_t;

#define LRMOE_PLAN_MAX_RATES 32
#define LRMOE_PLAN_MAX_E 65536        /* experts a planner accepts */
#define LRMOE_PLAN_MAX_EP (1 << 22)   /* E*P entries (a plan is ~25 bytes each) */

typedef struct {
    lrmoe_planner_t planner;
    int P;                /* ranks (required, > 0, divides E) */
    int nodes;            /* nodes (eplb hierarchy), default 1 */
    int groups;           /* eplb expert groups, default 0 = nodes */
    int slots;            /* physical expert slots per rank; 0 = default:
                             eplb E/P+2 (>= E/P), lrmoe E/P+2 (E/P = no replicas) */
    int32_t capacity_factor_e6; /* capacity: the capacity factor in millionths
                             (1000000 = 1.0, the default): every factor with
                             at most six decimals, held exactly (the double
                             capacity_factor_e6 / 1e6 is the one strtod makes
                             of its decimal text), in what was padding, so the
                             struct keeps its size and offsets (lrmoe(3) ABI);
                             set it with lrmoe_plan_set_capacity_factor */
    double lambda, alpha; /* llep: imbalance threshold 1.3, capacity factor 1.0 */
    int64_t min_chunk;    /* llep m: min rows per spilled chunk, 1024 */
    int nrates;           /* lrmoe candidate rates, tried in decreasing order */
    int capacity_policy;  /* capacity: lrmoe_capacity_policy_t, which pairs an
                             expert keeps (default probs; in padding too) */
    double rates[LRMOE_PLAN_MAX_RATES]; /* default 1.0,0.9,0.8,0.7 */
    lrmoe_quota_policy_t quota;         /* default EVEN */
    double min_keep;      /* K_e >= ceil(min_keep*n_e), default 0.25 (<= every rate) */
    int best_effort;      /* lrmoe: when nothing fits, keep the last candidate */
    int explain;          /* lrmoe: an infeasible frame's error also names the
                             least budget at which rate 1 fits and the
                             highest rate below the candidates that would
                             (probed in steps of 0.05); default 1 */
    int longer_bwd;       /* lrmoe: when no rate has a fitting plan whose modelled
                             backward is within that of keeping every pair,
                             take a fitting one that is longer (default 0:
                             refuse; plan.source ends in "+longer") */
    int rebalance_every;  /* eplb: frames of a layer between rearrangements
                             (3000 as vLLM's EPLB step_interval); 0 = every
                             frame placed from its own loads (an oracle) */
    const struct lrmoe_eplb_layout *eplb_layout; /* eplb: the physical layout
                             this frame uses (lrmoe_eplb_step); NULL = placed
                             from this frame's loads, weights moved from the
                             native layout */
    double glpk_tm_lim;   /* seconds per GLPK solve, default 10 */
    lrmoe_cost_model_t cost; /* D, F, dtype bytes, tokens, K, hbm, window, bw, flops */
} lrmoe_plan_opts_t;

/* The paper's setup: E=128, K=8, D=2048, F=768, P=8, 32768 tokens per rank,
 * BF16, 80 GiB GPU with 64 GiB resident (hbm budget 16 GiB for replicas and
 * buffers), planner lrmoe. */
void lrmoe_plan_opts_default(lrmoe_plan_opts_t *o);
/* "fixed"/"llep"/"eplb"/"lrmoe"/"capacity" -> 0; -1 with error otherwise. */
int lrmoe_planner_parse(const char *s, lrmoe_planner_t *out);
const char *lrmoe_planner_name(lrmoe_planner_t p);
int lrmoe_quota_parse(const char *s, lrmoe_quota_policy_t *out); /* even|minpeak|proportional */
const char *lrmoe_quota_name(lrmoe_quota_policy_t q);
/* The capacity planner's factor: f finite, > 0, at most 2147.483647 and with
 * at most six decimals (f*1e6 an integer, as every factor written in decimal
 * with six digits after the point or fewer); 0, or -1 with error. */
int lrmoe_plan_set_capacity_factor(lrmoe_plan_opts_t *o, double f);
/* o->capacity_factor_e6 / 1e6: the factor as the double strtod gives. */
double lrmoe_plan_capacity_factor(const lrmoe_plan_opts_t *o);
/* Parse "1.0,0.9,0.8" into o->rates (each in (0,1]); sorted decreasing. */
int lrmoe_plan_parse_rates(lrmoe_plan_opts_t *o, const char *s);
/* Validate options against E (P divides E, budgets sane, ...); E < 0 checks
 * only what does not depend on E. */
int lrmoe_plan_opts_check(const lrmoe_plan_opts_t *o, int E);

typedef struct {
    int E, P;
    uint8_t *placement;   /* (E,P) 1 where rank p holds an instance of e */
    int64_t *fwd_alloc;   /* (E,P) forward pairs of e computed on p; rows sum to n_e */
    int64_t *quota;       /* (E) K_e retained for backward, 0 <= K_e <= n_e */
    int64_t *bwd_alloc;   /* (E,P) retained pairs of e on p; rows sum to K_e */
    /* summary */
    char planner[16];
    double rho;           /* sum K_e / N (1 when N == 0) */
    int64_t N;            /* total pairs sum n_e */
    int64_t fwd_peak, bwd_peak;   /* max_p sum_e alloc */
    int64_t fwd_lb, bwd_lb;       /* closed-form optimum T* for this placement
                                     (and, for bwd, these quotas) */
    int64_t mean_ceil;            /* ceil(N/P): the bound of any placement */
    int replicas;                 /* instances beyond the native ones (eplb:
                                     its redundant slots, P*slots - E) */
    /* eplb's physical slots (have_slots 1): per rank (P) the replica slots
     * charged to memory and the weight bytes sent and received this step;
     * weight_moves: physical slots whose weights arrived this step */
    int64_t *held;
    double *wsend, *wrecv;
    int have_slots, weight_moves;
    int feasible;                 /* 1 fits hbm and window; 0 best effort */
    int rate_index;               /* lrmoe: candidate chosen (-1 none) */
    char source[48];              /* lrmoe: which candidate won, as
                                     placement:forward/backward, e.g.
                                     "lrmoe:minpeak/in-place", "llep:own/all" */
    char llep[12];                /* planner llep: why its plan is what it is
                                     (lrmoe_llep_reason_name; "" otherwise) */
    char binding[512];            /* why the next better candidate failed, or
                                     what binds ("" when nothing does) */
    double mem_peak;              /* max over ranks of modelled bytes */
    int mem_peak_rank;
    double t_comm;                /* modelled all-to-all seconds (all phases) */
    double t_total;               /* modelled layer seconds (comm + compute) */
    int64_t D, F, tokens;         /* the model sizes planned with: hidden, expert
                                     FFN width, tokens per rank ... */
    int K;                        /* ... and top-k (plan.hidden, plan.ffn,
                                     plan.tokens_per_rank, plan.topk) */
    double plan_seconds;          /* wall time of lrmoe_plan_compute */
    double glpk_seconds;          /* of which inside GLPK */
    lrmoe_rank_cost_t *rank;      /* (P) modelled memory and bytes per rank */
    lrmoe_cost_summary_t cost;    /* the model's summary of this plan ... */
    int have_cost;                /* ... and of rank[]: 1 when lrmoe_plan_compute
                                     evaluated them (0 after from_frame) */
    int keep_by_rank;             /* the modelled backward assumes lrmoe-score
                                     keeps by forward rank (plan.keep=by-rank;
                                     cost model keep_by_rank) */
    double plan_cpu_seconds;      /* thread CPU time of lrmoe_plan_compute */
} lrmoe_plan_t;

void lrmoe_plan_init(lrmoe_plan_t *p);
/* Zeroed arrays for E x P (frees previous content; a plan that already has
 * this shape keeps its arrays, zeroed, and its summary is reset). */
int lrmoe_plan_alloc(lrmoe_plan_t *p, int E, int P);
void lrmoe_plan_free(lrmoe_plan_t *p);
/* The cost model (m) of plan p, with eplb's slot accounting when the plan
 * has it (lrmoe_cost_eval_slots). rank (P) may be NULL. */
int lrmoe_plan_eval_cost(const lrmoe_cost_model_t *m, const lrmoe_plan_t *p,
                         const int64_t *load, lrmoe_rank_cost_t *rank,
                         lrmoe_cost_summary_t *sum);

/* Compute a plan for per-expert loads load[E] (pairs n_e >= 0).
 * Returns 0, or -1 on error: bad options/loads, GLPK failure, or (lrmoe
 * only, without best_effort) no candidate rate fits (the error names the
 * binding constraint: rank, need, budget). Baseline planners never refuse:
 * an over-budget plan has out->feasible = 0 and out->binding set; so has an
 * lrmoe best-effort plan. On -1 out may hold a partial plan. */
int lrmoe_plan_compute(const lrmoe_plan_opts_t *o, const int64_t *load, int E,
                       lrmoe_plan_t *out);

/* Free the per-thread state the planners keep (GLPK's environment, which
 * lrmoe_plan_compute creates on first use in each thread, and the lrmoe
 * planner's scratch plans, kept from one call to the next). Call it at the
 * end of every thread that planned, and of main; planning again afterwards
 * is allowed (the state is recreated). */
void lrmoe_plan_thread_cleanup(void);

/* Consistency: shapes, non-negativity, native placement (placement[e][e/(E/P)]
 * == 1), fwd_alloc rows sum to load[e] (when load != NULL; else to the row sum
 * of fwd as n_e), 0 <= quota <= n_e, bwd_alloc rows sum to quota, and both
 * allocations non-zero only where placement is 1. 0 ok, -1 with error naming
 * the first violation ("fwd_alloc[3,5]: ..."). */
int lrmoe_plan_check(const lrmoe_plan_t *p, const int64_t *load);

/* Frame I/O: tensors placement [E,P] U8, fwd_alloc [E,P] I64, quota [E] I64,
 * bwd_alloc [E,P] I64; attributes plan.planner, plan.ranks, plan.rho,
 * plan.fwd_peak, plan.bwd_peak, plan.fwd_lb, plan.bwd_lb, plan.replicas,
 * plan.feasible, plan.mem_peak (bytes), plan.mem_peak_rank, plan.t_comm (s),
 * plan.binding. from_frame reads the four tensors (E and P from placement's
 * shape) and whatever attributes are present; it does not check the plan. */
int lrmoe_plan_to_frame(const lrmoe_plan_t *p, lrmoe_frame_t *f);
int lrmoe_plan_from_frame(const lrmoe_frame_t *f, lrmoe_plan_t *p);

/* ------------------------------------------------------- building blocks */

/* DeepSeek EPLB (rebalance_experts): weight (layers,E) loads; num_phy
 * physical slots over num_gpus; hierarchical when groups % nodes == 0, else
 * global. Outputs phy2log (layers,num_phy), phyrank (layers,num_phy),
 * logcnt (layers,E). 0 ok, -1 bad shapes. */
int lrmoe_eplb_rebalance(const double *weight, int layers, int E, int num_phy,
                         int groups, int nodes, int num_gpus,
                         int *phy2log, int *phyrank, int *logcnt);

/* EPLB as deployed: a layer keeps its physical layout (P*slots physical
 * experts, P*slots - E redundant) between rearrangements. */
typedef struct lrmoe_eplb_layout {
    int E, P, slots;
    int *phy2log, *phyrank;   /* (P*slots): slot i is on rank i / slots */
    int *logcnt;              /* (E) physical copies of each expert */
    uint8_t *moved;           /* (P*slots) 1 where the slot's weights arrive
                                 this frame (rearranged since the last) */
    int nmoved;
} lrmoe_eplb_layout_t;

void lrmoe_eplb_layout_free(lrmoe_eplb_layout_t *l);
/* dst = src (dst zeroed or a layout; its arrays are reused when sized). */
int lrmoe_eplb_layout_copy(lrmoe_eplb_layout_t *dst, const lrmoe_eplb_layout_t *src);
/* The layout of load placed by EPLB (slots from o, default E/P+2), moved
 * relative to prev (NULL: the native layout, slot j < E/P of rank p holding
 * expert p*E/P + j). */
int lrmoe_eplb_layout_make(const lrmoe_plan_opts_t *o, const int64_t *load, int E,
                           const lrmoe_eplb_layout_t *prev, lrmoe_eplb_layout_t *out);

/* Per-layer state of deployed EPLB: the layout in use and the loads summed
 * since the last rearrangement. */
typedef struct lrmoe_eplb_cache lrmoe_eplb_cache_t;
lrmoe_eplb_cache_t *lrmoe_eplb_cache_new(void);
void lrmoe_eplb_cache_free(lrmoe_eplb_cache_t *c);
/* The layout frame `load` of layer `layer` uses: the first frame of a layer
 * is placed from its own loads; after every o->rebalance_every frames the
 * layer is rearranged from the loads summed over them (applied from the next
 * frame, whose moved[] marks the slots that changed). rebalance_every 0:
 * every frame from its own loads, moved relative to the previous frame.
 * *out points into the cache (valid until the next call for that layer). */
int lrmoe_eplb_step(lrmoe_eplb_cache_t *c, const char *layer, const lrmoe_plan_opts_t *o,
                    const int64_t *load, int E, const lrmoe_eplb_layout_t **out);

/* One frame's plan as lrmoe-plan makes it: for the eplb and lrmoe planners
 * the options are checked against E and the layer's deployed EPLB layout is
 * taken from cache (NULL: placed from this frame's loads), then the plan is
 * computed into p (lrmoe_plan_init'ed by the caller, freed by it), checked
 * against load, and its tensors and plan.* attributes are added to f. */
int lrmoe_plan_frame(const lrmoe_plan_opts_t *o, lrmoe_eplb_cache_t *cache,
                     const int64_t *load, int E, lrmoe_frame_t *f, lrmoe_plan_t *p);

/* LLEP (SalesforceAIResearch/LeastLoadedEP, rule for rule; lib/plan_llep.c
 * restates the rules): fills placement and fwd_alloc (E,P). Returns 1 when
 * the LPT plan ran, 0 when the gate kept plain EP. lambda 0: gate off. */
int lrmoe_llep_assign(const int64_t *load, int E, int P, double lambda,
                      double alpha, int64_t min_chunk, uint8_t *placement,
                      int64_t *fwd_alloc);
/* Why LLEP's plan is what it is (the attribute plan.llep, lib/plan_llep.c):
 * the gate kept plain EP; the plan ran but nothing was over capacity (plain
 * EP); pairs spilled, all in chunks below min_chunk; a chunk of >= min_chunk
 * spilled. */
typedef enum {
    LRMOE_LLEP_GATE,
    LRMOE_LLEP_CAPACITY,
    LRMOE_LLEP_MINCHUNK,
    LRMOE_LLEP_SPILLED
} lrmoe_llep_reason_t;
/* lrmoe_llep_assign, and *why (set when it returns >= 0). */
int lrmoe_llep_assign_why(const int64_t *load, int E, int P, double lambda,
                          double alpha, int64_t min_chunk, uint8_t *placement,
                          int64_t *fwd_alloc, lrmoe_llep_reason_t *why);
/* "gate", "capacity", "minchunk", "spilled". */
const char *lrmoe_llep_reason_name(lrmoe_llep_reason_t r);
/* The gate alone: 1 when float32 max/mean of the native rank loads >= lambda
 * (or lambda <= 0), else 0. */
int lrmoe_llep_gate(const int64_t *load, int E, int P, double lambda);
/* The reference capacity int(alpha * (N // P)), N when N // P == 0, >= 1. */
int64_t lrmoe_llep_capacity(int64_t N, int P, double alpha);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#endif
