/* plan_cli: options shared by lrmoe-plan and lrmoe-sim (see plan_cli.h). */
#include "plan_cli.h"

void lrmoe_plan_cli_init(lrmoe_plan_cli_t *c, lrmoe_plan_opts_t *o)
{
    c->o = o;
    c->gpu = c->resident = -1;
    c->set_D = c->set_K = c->set_T = c->set_dtype = 0;
}

/* r, the result of parsing into *v, and *v into *out when it parsed (v is
 * read here, after the parse: argument order is unspecified) */
static int as_int(int r, const int64_t *v, int *out)
{
    if (r == 0)
        *out = (int)*v;
    return r;
}

int lrmoe_plan_cli_opt(lrmoe_plan_cli_t *c, int ch, const char *arg)
{
    lrmoe_plan_opts_t *o = c->o;
    int64_t v = 0;
    int r;
    switch (ch) {
    case 'P': r = as_int(lrmoe_parse_i64("--ranks", arg, 1, 4096, &v), &v, &o->P); break;
    case 'N': r = as_int(lrmoe_parse_i64("--nodes", arg, 1, 4096, &v), &v, &o->nodes); break;
    case 'G': r = as_int(lrmoe_parse_i64("--groups", arg, 1, 1 << 20, &v), &v, &o->groups); break;
    case 's': r = as_int(lrmoe_parse_i64("--slots", arg, 1, 1 << 20, &v), &v, &o->slots); break;
    case LRMOE_PLAN_OPT_LAMBDA: r = lrmoe_parse_f64("--lambda", arg, 0, 1e9, &o->lambda); break;
    case LRMOE_PLAN_OPT_ALPHA: r = lrmoe_parse_f64("--alpha", arg, 1e-9, 1e9, &o->alpha); break;
    case 'm': r = lrmoe_parse_i64("--min-chunk", arg, 0, INT64_MAX / 4, &o->min_chunk); break;
    case 'r': r = lrmoe_plan_parse_rates(o, arg); break;
    case 'q': r = lrmoe_quota_parse(arg, &o->quota); break;
    case 'k': r = lrmoe_parse_f64("--min-keep", arg, 0, 1, &o->min_keep); break;
    case LRMOE_PLAN_OPT_GLPK_TIME:
        r = lrmoe_parse_f64("--glpk-time", arg, 1e-3, 3600, &o->glpk_tm_lim);
        break;
    case LRMOE_PLAN_OPT_LONGER: o->longer_bwd = 1; r = 0; break;
    case LRMOE_PLAN_OPT_REBALANCE:
        r = as_int(lrmoe_parse_i64("--rebalance-every", arg, 0, 1 << 30, &v), &v,
                   &o->rebalance_every);
        break;
    case 'M': r = lrmoe_parse_bytes("--hbm", arg, &o->cost.hbm); break;
    case LRMOE_PLAN_OPT_GPU_MEM: r = lrmoe_parse_bytes("--gpu-mem", arg, &c->gpu); break;
    case LRMOE_PLAN_OPT_RESIDENT: r = lrmoe_parse_bytes("--resident", arg, &c->resident); break;
    case 'W': r = lrmoe_parse_f64("--window", arg, 0, 1e6, &o->cost.window); break;
    case 'B': r = lrmoe_parse_bytes("--bw", arg, &o->cost.bw); break;
    case LRMOE_PLAN_OPT_FLOPS: r = lrmoe_parse_f64("--flops", arg, 1, 1e21, &o->cost.flops); break;
    case 'D':
        r = lrmoe_parse_i64("--hidden", arg, 1, 1 << 24, &o->cost.D);
        c->set_D = 1;
        break;
    case 'F': r = lrmoe_parse_i64("--ffn", arg, 1, 1 << 24, &o->cost.F); break;
    case 'K':
        r = as_int(lrmoe_parse_i64("--topk", arg, 1, 1 << 20, &v), &v, &o->cost.K);
        c->set_K = 1;
        break;
    case 'T':
        r = lrmoe_parse_i64("--tokens", arg, 0, INT64_C(1) << 40, &o->cost.tokens);
        c->set_T = 1;
        break;
    case LRMOE_PLAN_OPT_DTYPE: {
        lrmoe_dtype_t dt;
        r = lrmoe_dtype_parse(arg, &dt);
        if (r == 0)
            o->cost.dtype_bytes = (int)lrmoe_dtype_size(dt);
        c->set_dtype = 1;
        break;
    }
    default: return 0;
    }
    return r < 0 ? -1 : 1;
}

int lrmoe_plan_cli_finish(lrmoe_plan_cli_t *c)
{
    if ((c->gpu >= 0) != (c->resident >= 0))
        return lrmoe_err("--gpu-mem and --resident go together");
    if (c->gpu < 0)
        return 0;
    if (!(c->resident < c->gpu))
        return lrmoe_err("--resident %.0f bytes leaves no memory of --gpu-mem %.0f bytes "
                         "for replicas and buffers", c->resident, c->gpu);
    c->o->cost.gpu_mem = c->gpu;
    c->o->cost.resident = c->resident;
    c->o->cost.hbm = c->gpu - c->resident;
    return 0;
}
