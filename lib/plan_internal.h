/* Private to the plan module (plan*.c). */
#ifndef LRMOE_PLAN_INTERNAL_H
#define LRMOE_PLAN_INTERNAL_H

#include <stdio.h>
#include <string.h>
#include "plan.h"

/* Plans are sparse (an expert lives on a few of P ranks): 1 when the 8
 * entries at pl, f, b are all zero, so a row scan can skip them at once. */
static inline int plan_zero8(const uint8_t *pl, const int64_t *f, const int64_t *b)
{
    uint64_t w;
    memcpy(&w, pl, sizeof w);
    int64_t acc = 0;
    for (int k = 0; k < 8; k++)
        acc |= f[k] | b[k];
    return !w && !acc;
}

/* How many entries from (e, q) a row scan of p can skip (i = e*P + q): 8 at
 * an aligned all-zero block, 1 at one entry that holds nothing, else 0. */
static inline int plan_skip(const lrmoe_plan_t *p, size_t i, int q, int P)
{
    if (!(q & 7) && q + 8 <= P && plan_zero8(p->placement + i, p->fwd_alloc + i, p->bwd_alloc + i))
        return 8;
    return !p->placement[i] && !(p->fwd_alloc[i] | p->bwd_alloc[i]);
}

/* cost.c: lrmoe_cost_eval_slots for a plan whose fwd and bwd are zero
 * wherever its placement is (as lrmoe_plan_check requires): only the
 * placement is scanned for the entries to visit (plan_cost's candidates) */
int lrmoe_cost_eval_placed(const lrmoe_cost_model_t *m, int E, int P, const uint8_t *placement,
                     const int64_t *load, const int64_t *fwd, const int64_t *quota,
                     const int64_t *bwd, const lrmoe_cost_slots_t *slots,
                     lrmoe_rank_cost_t *rank, lrmoe_cost_summary_t *sum);

/* the planners (plan_eplb.c, plan_lrmoe.c) */
int lrmoe_plan_eplb(const lrmoe_plan_opts_t *o, const int64_t *load, int E, lrmoe_plan_t *p);
/* A baseline's placement and forward allocation (o->planner fixed, llep or
 * eplb): plan.c's, handed to plan_lrmoe, which must not lose to them; so the
 * planners reach each other only through the dispatcher. */
typedef int (*plan_base_fn)(const lrmoe_plan_opts_t *o, const int64_t *load, int E,
                            lrmoe_plan_t *p);
int lrmoe_plan_lrmoe(const lrmoe_plan_opts_t *o, const int64_t *load, int E, plan_base_fn base,
               lrmoe_plan_t *p);
void lrmoe_plan_lrmoe_thread_cleanup(void); /* its per-thread scratch plans */
/* plan_core.c: summary, cost model evaluation, budget check */
void lrmoe_plan_summarise(lrmoe_plan_t *p, const int64_t *load); /* after plan_cost */
int lrmoe_plan_cost(const lrmoe_plan_opts_t *o, lrmoe_plan_t *p, const int64_t *load,
              lrmoe_cost_summary_t *s);
int lrmoe_plan_fits(const lrmoe_plan_opts_t *o, const lrmoe_plan_t *p, char *why, size_t len);
/* plan_core.c */
int lrmoe_plan_fixed(const lrmoe_plan_opts_t *o, const int64_t *load, int E, lrmoe_plan_t *p);

#endif
