/* What the planners share of lib/minpeak.c below the installed minpeak.h
 * (not installed). */
#ifndef LRMOE_MINPEAK_INTERNAL_H
#define LRMOE_MINPEAK_INTERNAL_H

#include <stdint.h>

/* Exact min-peak optimum T* with the fast paths (lib/minpeak.c): fixed needs
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
int64_t lrmoe_plan_minpeak(const uint8_t *pl, const int64_t *lo, const int64_t *n, int64_t total,
                           int E, int P, int64_t ub, uint8_t *witness, int *how);

#endif
