/* The min-peak solver (lib/minpeak.c), below the planners: the optimum
 * peak T* of an allocation of pairs to eligible ranks and the allocations
 * that reach it (closed form, max-flow, GLPK).
 * Placement is row-major [E,P]; the library never prints. */
#ifndef LRMOE_MINPEAK_H
#define LRMOE_MINPEAK_H

/* Only what the installed headers declare is exported (the library is
 * built with -fvisibility=hidden, lrmoe(3)). */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#include <stdint.h>

#define LRMOE_PLAN_MAX_P 16    /* closed-form T* enumerates 2^P rank subsets;
                                  above it an exact max-flow search */

/* Closed-form min-peak: T* = max over non-empty rank subsets S of
 * ceil(N(S)/|S|), N(S) = sum of need[e] over experts whose eligible ranks
 * (placement row) all lie in S; enumerated for P <= LRMOE_PLAN_MAX_P, by
 * an exact parametric max-flow search above. Returns T* (>= 0) or -1.
 * An expert with need > 0 and no eligible rank gives -1. */
int64_t lrmoe_minpeak_lb(const uint8_t *placement, const int64_t *need, int E, int P);

/* Closed-form optimum of the backward peak when the quotas are free:
 * the least T such that quotas lo[e] <= K_e <= n[e], sum K_e = total can be
 * allocated with every rank <= T. -1 if total is outside [sum lo, sum n]. */
int64_t lrmoe_minpeak_quota_lb(const uint8_t *placement, const int64_t *lo,
                               const int64_t *n, int64_t total, int E, int P);

/* Min-peak integer allocation with GLPK (glp_intopt, presolve on, terminal
 * output off, time limit tm_lim seconds): x[E,P] >= 0 only where placement,
 * rows sum to need[e] (fixed quotas) ... Returns the peak (>= 0) or -1. */
int64_t lrmoe_alloc_glpk(const uint8_t *placement, const int64_t *need, int E, int P,
                         double tm_lim, int64_t *x);
/* ... or, with free quotas lo[e] <= K_e <= n[e], sum K_e = total: also
 * returns the chosen quotas in K. Among optimal solutions it prefers
 * retained pairs where pref[E,P] (may be NULL; e.g. fwd_alloc) is large. */
int64_t lrmoe_alloc_glpk_quota(const uint8_t *placement, const int64_t *lo,
                               const int64_t *n, int64_t total, const int64_t *pref,
                               int E, int P, double tm_lim, int64_t *K, int64_t *x);
/* The same fixed-quota allocation by closed form T* + max-flow (Dinic).
 * Returns the peak or -1. */
int64_t lrmoe_alloc_flow(const uint8_t *placement, const int64_t *need, int E, int P,
                         int64_t *x);
/* Free quotas lo[e] <= K_e <= n[e], sum K_e = total, allocated with every
 * rank <= T (e.g. plan_minpeak's optimum) by max-flow; retained pairs go
 * first where pref[E,P] (may be NULL; e.g. fwd_alloc) has room, the rest
 * in proportion to that room. Fills K and x; returns the peak (<= T), or
 * -1 when T is below the optimum. */
int64_t lrmoe_alloc_flow_quota(const uint8_t *placement, const int64_t *lo, const int64_t *n,
                               int64_t total, const int64_t *pref, int E, int P, int64_t T,
                               int64_t *K, int64_t *x);
/* The same at a known optimum T (e.g. from plan_minpeak): max-flow only.
 * Returns T, or -1 when not every pair routes at T. */
int64_t lrmoe_alloc_flow_at(const uint8_t *placement, const int64_t *need, int E, int P,
                            int64_t T, int64_t *x);

/* 1 when every need[e] routes to its eligible ranks with each rank <= T
 * (one max-flow), 0 when not, -1 on error. */
int lrmoe_flow_routes(const uint8_t *placement, const int64_t *need, int E, int P, int64_t T);
/* The same, and when it routes, that max-flow's allocation in x[E,P] (as
 * lrmoe_alloc_flow_at fills it; x is scratch when it does not route). */
int lrmoe_flow_routes_x(const uint8_t *placement, const int64_t *need, int E, int P,
                        int64_t T, int64_t *x);
/* An incremental routing check at a fixed peak T (e.g. the floors of a
 * bisection, which only rise): new builds the network of the placement with
 * nothing routed; try(need) returns 1 and keeps the routing when every
 * need[e] (each >= the last kept one) routes with each rank <= T, 0 (the
 * last kept routing stays) when not, -1 on error. */
typedef struct lrmoe_route_net lrmoe_route_net_t;
lrmoe_route_net_t *lrmoe_route_net_new(const uint8_t *placement, int E, int P, int64_t T);
int lrmoe_route_net_try(lrmoe_route_net_t *r, const int64_t *need);
void lrmoe_route_net_free(lrmoe_route_net_t *r);
/* The reference full search: bisection over [0, N] with one max-flow per
 * probe (any P). Used by the tests against the above. */
int64_t lrmoe_minpeak_lb_flow(const uint8_t *placement, const int64_t *need, int E, int P);
int64_t lrmoe_minpeak_quota_lb_flow(const uint8_t *placement, const int64_t *lo,
                                    const int64_t *n, int64_t total, int E, int P);

/* Free GLPK's per-thread environment (lrmoe_plan_thread_cleanup calls it). */
void lrmoe_minpeak_thread_cleanup(void);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#endif
