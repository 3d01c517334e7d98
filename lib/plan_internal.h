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

int plan_eplb(const lrmoe_plan_opts_t *o, const int64_t *load, int E, lrmoe_plan_t *p);
int plan_lrmoe(const lrmoe_plan_opts_t *o, const int64_t *load, int E, lrmoe_plan_t *p);
void plan_summarise(lrmoe_plan_t *p, const int64_t *load);
int plan_cost(const lrmoe_plan_opts_t *o, lrmoe_plan_t *p, const int64_t *load,
              lrmoe_cost_summary_t *s);
int plan_fits(const lrmoe_plan_opts_t *o, const lrmoe_plan_t *p, char *why, size_t len);
/* Exact min-peak optimum T* with the fast paths (lib/plan.c): fixed needs
 * n[e] (lo == NULL, total ignored) or free quotas lo[e] <= K_e <= n[e] with
 * sum K_e = total. ub: an upper bound on T* (the peak of a feasible
 * allocation, e.g. the planner's own), or -1; when the cheap bound LB0
 * (whole rank set, single ranks) reaches ub, T* = LB0 and nothing else runs,
 * and the search stops once it reaches ub (if ub is not really an upper
 * bound the result is only a lower bound). Above LRMOE_PLAN_MAX_P ranks, or when
 * witness (P flags, may be NULL) is wanted, the parametric max-flow search
 * (Dinkelbach steps over incremental Dinic); else the closed form. witness
 * gets a rank subset S whose closed-form bound equals the result. how (may
 * be NULL): 1 fast path, 2 closed form, 3 max-flow search. Returns T* or -1. */
int64_t plan_minpeak(const uint8_t *pl, const int64_t *lo, const int64_t *n, int64_t total,
                     int E, int P, int64_t ub, uint8_t *witness, int *how);
/* The reference full search: bisection over [0, N] with one max-flow per
 * probe (lib/plan_lrmoe.c; any P). Used by the tests against the above. */
int64_t lrmoe_minpeak_lb_flow(const uint8_t *placement, const int64_t *need, int E, int P);
int64_t lrmoe_minpeak_quota_lb_flow(const uint8_t *placement, const int64_t *lo,
                                    const int64_t *n, int64_t total, int E, int P);

#endif
