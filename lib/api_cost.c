/* api_cost: the planner's cost model (lib/cost.c) behind an opaque handle
 * (cost.h): the model's parameters set and the plan's summary read by
 * their field names, so a caller (the Python study) mirrors neither
 * lrmoe_cost_model_t nor lrmoe_cost_summary_t. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "lrmoe.h"

struct lrmoe_cost_cfg {
    lrmoe_cost_model_t m;
    lrmoe_cost_summary_t s;
    int have_sum;
};

enum { K_I64, K_INT, K_DBL };

#define M_(f, k) {#f, offsetof(lrmoe_cost_model_t, f), k}
static const struct {
    const char *name;
    size_t off;
    int kind;
} MODEL[] = {
    M_(D, K_I64), M_(F, K_I64), M_(K, K_INT), M_(tokens, K_I64), M_(dtype_bytes, K_INT),
    M_(grad_bytes, K_INT), M_(gpu_mem, K_DBL), M_(resident, K_DBL), M_(hbm, K_DBL),
    M_(window, K_DBL), M_(bw, K_DBL), M_(flops, K_DBL), M_(keep_by_rank, K_INT),
};
#define S_(f, k) {#f, offsetof(lrmoe_cost_summary_t, f), k}
static const struct {
    const char *name;
    size_t off;
    int kind;
} SUMMARY[] = {
    S_(mem_peak, K_DBL), S_(mem_peak_rank, K_INT), S_(t_dispatch, K_DBL),
    S_(t_combine, K_DBL), S_(t_bwd_dispatch, K_DBL), S_(t_bwd_combine, K_DBL),
    S_(t_weights, K_DBL), S_(t_comm, K_DBL), S_(t_fwd_compute, K_DBL),
    S_(t_bwd_compute, K_DBL), S_(t_total, K_DBL), S_(bytes_total, K_DBL),
};

lrmoe_cost_cfg_t *lrmoe_cost_cfg_new(void)
{
    lrmoe_cost_cfg_t *c = calloc(1, sizeof *c);
    if (!c) {
        lrmoe_err("out of memory");
        return NULL;
    }
    lrmoe_cost_default(&c->m);
    return c;
}

void lrmoe_cost_cfg_free(lrmoe_cost_cfg_t *c) { free(c); }

static double get_field(const char *base, size_t off, int kind)
{
    int64_t l;
    int i;
    double d;
    switch (kind) {
    case K_I64: memcpy(&l, base + off, sizeof l); return (double)l;
    case K_INT: memcpy(&i, base + off, sizeof i); return i;
    default: memcpy(&d, base + off, sizeof d); return d;
    }
}

int lrmoe_cost_cfg_set(lrmoe_cost_cfg_t *c, const char *name, double value)
{
    if (!c || !name) return lrmoe_err("cost: no handle or name");
    for (size_t i = 0; i < sizeof MODEL / sizeof MODEL[0]; i++) {
        if (strcmp(MODEL[i].name, name)) continue;
        char *at = (char *)&c->m + MODEL[i].off;
        if (MODEL[i].kind == K_DBL) {
            memcpy(at, &value, sizeof value);
        } else {
            const double hi = MODEL[i].kind == K_INT ? 2147483647.0 : 9.2e18;
            if (!(value >= 0 && value <= hi) || value != (double)(int64_t)value)
                return lrmoe_err("cost: %s = %g is not a whole number in [0, %.0f]", name,
                                 value, hi);
            if (MODEL[i].kind == K_INT) {
                int v = (int)value;
                memcpy(at, &v, sizeof v);
            } else {
                int64_t v = (int64_t)value;
                memcpy(at, &v, sizeof v);
            }
        }
        c->have_sum = 0;
        return 0;
    }
    return lrmoe_err("cost: no model parameter '%s' (cost.h lists them)", name);
}

int lrmoe_cost_cfg_eval(lrmoe_cost_cfg_t *c, int E, int P, const uint8_t *placement,
                        const int64_t *load, const int64_t *fwd, const int64_t *quota,
                        const int64_t *bwd)
{
    if (!c) return lrmoe_err("cost: no handle");
    c->have_sum = 0;
    if (lrmoe_cost_eval(&c->m, E, P, placement, load, fwd, quota, bwd, NULL, &c->s) < 0)
        return -1;
    c->have_sum = 1;
    return 0;
}

int lrmoe_cost_cfg_get(const lrmoe_cost_cfg_t *c, const char *name, double *value)
{
    if (!c || !name || !value) return lrmoe_err("cost: no handle, name or value");
    for (size_t i = 0; i < sizeof SUMMARY / sizeof SUMMARY[0]; i++)
        if (!strcmp(SUMMARY[i].name, name)) {
            if (!c->have_sum) return lrmoe_err("cost: '%s' before an evaluation", name);
            *value = get_field((const char *)&c->s, SUMMARY[i].off, SUMMARY[i].kind);
            return 0;
        }
    for (size_t i = 0; i < sizeof MODEL / sizeof MODEL[0]; i++)
        if (!strcmp(MODEL[i].name, name)) {
            *value = get_field((const char *)&c->m, MODEL[i].off, MODEL[i].kind);
            return 0;
        }
    return lrmoe_err("cost: no value '%s'", name);
}
