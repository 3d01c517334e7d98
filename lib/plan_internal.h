/* Private to the plan module (plan*.c). */
#ifndef LRMOE_PLAN_INTERNAL_H
#define LRMOE_PLAN_INTERNAL_H

#include <stdio.h>
#include "plan.h"

int plan_eplb(const lrmoe_plan_opts_t *o, const int64_t *load, int E, lrmoe_plan_t *p);
int plan_lrmoe(const lrmoe_plan_opts_t *o, const int64_t *load, int E, lrmoe_plan_t *p);
void plan_summarise(lrmoe_plan_t *p, const int64_t *load);
int plan_cost(const lrmoe_plan_opts_t *o, lrmoe_plan_t *p, const int64_t *load,
              lrmoe_cost_summary_t *s);
int plan_fits(const lrmoe_plan_opts_t *o, const lrmoe_plan_t *p, char *why, size_t len);
/* Max-flow versions of the bounds (any P). */
int64_t lrmoe_minpeak_lb_flow(const uint8_t *placement, const int64_t *need, int E, int P);
int64_t lrmoe_minpeak_quota_lb_flow(const uint8_t *placement, const int64_t *lo,
                                    const int64_t *n, int64_t total, int E, int P);

#endif
