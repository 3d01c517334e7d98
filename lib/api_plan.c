/* api_plan: lrmoe-plan's options set by name, and one plan into a frame
 * (see api.h). The option table is lrmoe-plan's own (plan_cli.h). The cfg
 * keeps lrmoe-plan's state between frames: deployed EPLB's layout per
 * layer (lrmoe_eplb_cache_t), so a sequence of runs plans like one
 * lrmoe-plan over the same frames. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "plan_cli.h"
#include "parse.h"

enum { OPT_PLANNER = LRMOE_PLAN_OPT_END, OPT_RATE, OPT_BEST_EFFORT };

static const struct option names[] = {
    LRMOE_PLAN_LONGOPTS,
    {"planner", required_argument, 0, OPT_PLANNER},
    {"rate", required_argument, 0, OPT_RATE},
    {"best-effort", no_argument, 0, OPT_BEST_EFFORT},
    {0, 0, 0, 0}};

struct lrmoe_plan_cfg {
    lrmoe_plan_opts_t o;
    lrmoe_plan_cli_t cli;
    lrmoe_eplb_cache_t *eplb; /* per layer, as lrmoe-plan keeps it */
};

lrmoe_plan_cfg_t *lrmoe_plan_cfg_new(void)
{
    lrmoe_plan_cfg_t *c = calloc(1, sizeof *c);
    if (!c) {
        lrmoe_err("out of memory");
        return NULL;
    }
    if (!(c->eplb = lrmoe_eplb_cache_new())) {
        free(c);
        return NULL;
    }
    lrmoe_plan_opts_default(&c->o);
    c->o.P = 0;
    lrmoe_plan_cli_init(&c->cli, &c->o);
    return c;
}

void lrmoe_plan_cfg_free(lrmoe_plan_cfg_t *c)
{
    if (!c)
        return;
    lrmoe_eplb_cache_free(c->eplb);
    lrmoe_plan_cli_free(&c->cli);
    free(c);
}

int lrmoe_plan_cfg_reset(lrmoe_plan_cfg_t *c)
{
    lrmoe_eplb_cache_t *n = lrmoe_eplb_cache_new();
    if (!n)
        return -1;
    lrmoe_eplb_cache_free(c->eplb);
    c->eplb = n;
    return 0;
}

int lrmoe_plan_cfg_set(lrmoe_plan_cfg_t *c, const char *name, const char *value)
{
    const struct option *op = names;
    while (op->name && strcmp(op->name, name ? name : ""))
        op++;
    if (!op->name)
        return lrmoe_err("unknown planner option '%s'", name ? name : "(null)");
    if (op->has_arg == no_argument && value)
        return lrmoe_err("--%s: takes no value", name);
    if (op->has_arg != no_argument && !value)
        return lrmoe_err("--%s: needs a value", name);
    double d;
    switch (op->val) {
    case OPT_PLANNER: return lrmoe_planner_parse(value, &c->o.planner) < 0 ? -1 : 0;
    case OPT_BEST_EFFORT: c->o.best_effort = 1; return 0;
    case OPT_RATE:
        if (lrmoe_parse_f64("--rate", value, -1e9, 1e9, &d) < 0)
            return -1;
        if (!(d > 0 && d <= 1))
            return lrmoe_err("--rate: %g is outside (0,1]", d);
        c->o.nrates = 1;
        c->o.rates[0] = d;
        return 0;
    default:
        if (lrmoe_plan_cli_opt(&c->cli, op->val, value) < 0)
            return -1;
        /* --weights is opened here, so a bad one fails at the set */
        return op->val == LRMOE_PLAN_OPT_WEIGHTS ? lrmoe_plan_cli_load(&c->cli) : 0;
    }
}

int lrmoe_plan_cfg_run(lrmoe_plan_cfg_t *c, const int64_t *load, int E, lrmoe_frame_t *f)
{
    if (c->o.P <= 0)
        return lrmoe_err("--ranks P is required");
    lrmoe_plan_opts_t o = c->o;
    lrmoe_plan_cli_t cli = c->cli;
    cli.o = &o;
    if (lrmoe_plan_cli_finish(&cli) < 0 || lrmoe_plan_opts_check(&o, E) < 0)
        return -1;
    lrmoe_plan_t p;
    lrmoe_plan_init(&p);
    /* as lrmoe-plan: the model sizes from f, then the plan */
    int rc = lrmoe_plan_cli_plan(&cli, c->eplb, load, E, f, &p, NULL);
    lrmoe_plan_free(&p);
    return rc;
}
