/* plan_cli: the planner and cost-model options that lrmoe-plan and lrmoe-sim
 * share, parsed and checked in one place (their man pages document them).
 *
 * A tool puts LRMOE_PLAN_SHORTOPTS in its getopt string and
 * LRMOE_PLAN_LONGOPTS in its option table, numbers its own long-only options
 * from LRMOE_PLAN_OPT_END, hands every option to lrmoe_plan_cli_opt() first
 * and calls lrmoe_plan_cli_finish() after the last one. */
#ifndef LRMOE_PLAN_CLI_H
#define LRMOE_PLAN_CLI_H

#include "plan.h"
#include "weights_map.h"

enum {
    LRMOE_PLAN_OPT_LAMBDA = 0x2001,
    LRMOE_PLAN_OPT_ALPHA,
    LRMOE_PLAN_OPT_GLPK_TIME,
    LRMOE_PLAN_OPT_GPU_MEM,
    LRMOE_PLAN_OPT_RESIDENT,
    LRMOE_PLAN_OPT_FLOPS,
    LRMOE_PLAN_OPT_DTYPE,
    LRMOE_PLAN_OPT_REBALANCE,
    LRMOE_PLAN_OPT_LONGER,
    LRMOE_PLAN_OPT_MIN_CHUNK,
    LRMOE_PLAN_OPT_RATES,
    LRMOE_PLAN_OPT_MIN_KEEP,
    LRMOE_PLAN_OPT_FFN,
    LRMOE_PLAN_OPT_TOKENS,
    LRMOE_PLAN_OPT_WEIGHTS,
    LRMOE_PLAN_OPT_CAPACITY_FACTOR,
    LRMOE_PLAN_OPT_DROP_POLICY,
    LRMOE_PLAN_OPT_END /* the tools' own long-only options start here */
};

/* Short letters follow lrmoe(7)'s option table (one letter, one meaning in
 * every tool): -k is --topk; --min-chunk, --rates, --min-keep, --ffn and
 * --tokens are long only (-F and -T are --frame and --tensor elsewhere). */
#define LRMOE_PLAN_SHORTOPTS "P:N:G:s:q:k:M:W:B:D:"

/* entries of a struct option table (needs <getopt.h>) */
#define LRMOE_PLAN_LONGOPTS                                                 \
    {"ranks", required_argument, 0, 'P'},                                   \
    {"nodes", required_argument, 0, 'N'},                                   \
    {"groups", required_argument, 0, 'G'},                                  \
    {"slots", required_argument, 0, 's'},                                   \
    {"lambda", required_argument, 0, LRMOE_PLAN_OPT_LAMBDA},                \
    {"alpha", required_argument, 0, LRMOE_PLAN_OPT_ALPHA},                  \
    {"min-chunk", required_argument, 0, LRMOE_PLAN_OPT_MIN_CHUNK},          \
    {"rates", required_argument, 0, LRMOE_PLAN_OPT_RATES},                  \
    {"quota", required_argument, 0, 'q'},                                   \
    {"min-keep", required_argument, 0, LRMOE_PLAN_OPT_MIN_KEEP},            \
    {"glpk-time", required_argument, 0, LRMOE_PLAN_OPT_GLPK_TIME},          \
    {"hbm", required_argument, 0, 'M'},                                     \
    {"gpu-mem", required_argument, 0, LRMOE_PLAN_OPT_GPU_MEM},              \
    {"resident", required_argument, 0, LRMOE_PLAN_OPT_RESIDENT},            \
    {"window", required_argument, 0, 'W'},                                  \
    {"bw", required_argument, 0, 'B'},                                      \
    {"flops", required_argument, 0, LRMOE_PLAN_OPT_FLOPS},                  \
    {"hidden", required_argument, 0, 'D'},                                  \
    {"ffn", required_argument, 0, LRMOE_PLAN_OPT_FFN},                      \
    {"topk", required_argument, 0, 'k'},                                    \
    {"tokens", required_argument, 0, LRMOE_PLAN_OPT_TOKENS},                \
    {"weights", required_argument, 0, LRMOE_PLAN_OPT_WEIGHTS},              \
    {"dtype", required_argument, 0, LRMOE_PLAN_OPT_DTYPE},                  \
    {"rebalance-every", required_argument, 0, LRMOE_PLAN_OPT_REBALANCE},    \
    {"longer-backward", no_argument, 0, LRMOE_PLAN_OPT_LONGER},            \
    {"capacity-factor", required_argument, 0, LRMOE_PLAN_OPT_CAPACITY_FACTOR}, \
    {"drop-policy", required_argument, 0, LRMOE_PLAN_OPT_DROP_POLICY}

typedef struct {
    lrmoe_plan_opts_t *o;   /* the options being set */
    double gpu, resident;   /* --gpu-mem, --resident bytes; -1 = not given */
    int set_D, set_F, set_K, set_T, set_dtype; /* given on the command line:
                                           a frame that says otherwise is an
                                           error (lrmoe_plan_cli_frame) */
    const char *weights_path; /* --weights: D and F (and E) from its layer
                                 frames; NULL: none */
    lrmoe_weights_t *w;       /* loaded by lrmoe_plan_cli_load (owned) */
    lrmoe_wmap_t wmap;
} lrmoe_plan_cli_t;

void lrmoe_plan_cli_init(lrmoe_plan_cli_t *c, lrmoe_plan_opts_t *o);
/* Frees the --weights stream (copies of c share it: free one of them). */
void lrmoe_plan_cli_free(lrmoe_plan_cli_t *c);
/* One option: 1 = one of the shared ones, applied; 0 = not one of them;
 * -1 = a bad value (lrmoe_errmsg() says which, a usage error). */
int lrmoe_plan_cli_opt(lrmoe_plan_cli_t *c, int ch, const char *arg);
/* After the last option: --gpu-mem and --resident go together, resident
 * below gpu-mem; they set o->cost gpu_mem, resident and hbm (the budget
 * between them). 0, or -1 with the message set. */
int lrmoe_plan_cli_finish(lrmoe_plan_cli_t *c);
/* Open the --weights stream (if one was given and is not open yet): a raw
 * regular file is mapped, so only the headers are read (lib/weights_map.h);
 * anything else is read whole. 0, or -1 with the error set (an I/O error,
 * not a usage error). */
int lrmoe_plan_cli_load(lrmoe_plan_cli_t *c);

/* The model sizes of one frame of P ranks, into m (which holds the options'
 * values): D, F, K and tokens per rank wherever the frame says them, and the
 * storage dtype from hidden unless --dtype was given.
 *   D  hidden, grad_output, output [T,D]; pack_hidden [R,D]; w_gate [E,F,D]
 *      the attributes route.hidden (lrmoe-route --loads-only), hidden
 *      (lrmoe-gen --routing-only, --loads-only)
 *   F  saved_gate, saved_up [T,K,F]; w_gate, w_up [E,F,D]; w_down [E,D,F];
 *      the attribute ffn (lrmoe-gen)
 *   K  topk_ids [T,K]; saved_gate [T,K,F]; route.topk, topk; k_hint (> 0)
 *   T  tokens per rank: T/P of topk_ids, hidden [T,D]; sum(expert_load)/K/P
 *      when K is known
 * With --weights (lrmoe_plan_cli_load), the weights frame of the frame's
 * layer (attribute layer, default 0, as lrmoe-exec matches them) says D and
 * F too (w_gate [E,F,D], w_up, w_down) and its E must be expert_load's; a
 * frame and its weights that disagree are an error naming both.
 * An option the command line gave (c->set_*) that disagrees with the frame
 * is an error naming both (-1); where the frame does not say, the option, else
 * the plan.hidden/ffn/topk/tokens_per_rank attributes of an earlier
 * lrmoe-plan, else the default stands -- except F, which decides the memory
 * of every replica: a frame that says nothing of F, with no --ffn, no
 * --weights and no earlier plan.ffn, is an error saying what to give
 * (lrmoe(7), MODEL SIZES). c may be NULL (nothing given). */
int lrmoe_plan_cli_frame(const lrmoe_plan_cli_t *c, const lrmoe_frame_t *f, int P, int k_hint,
                         lrmoe_cost_model_t *m);

/* One frame as lrmoe-plan plans it: c's options (c->o, after
 * lrmoe_plan_cli_finish) with f's model sizes (lrmoe_plan_cli_frame), then
 * lrmoe_plan_frame(load[E], f, p). The options actually used go to *used
 * (may be NULL). lrmoe-plan and lrmoe_plan_cfg_run both plan through this.
 * 0, or -1 with the error set. */
int lrmoe_plan_cli_plan(const lrmoe_plan_cli_t *c, lrmoe_eplb_cache_t *eplb, const int64_t *load,
                        int E, lrmoe_frame_t *f, lrmoe_plan_t *p, lrmoe_plan_opts_t *used);

#endif
