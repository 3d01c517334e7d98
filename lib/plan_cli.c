/* plan_cli: options shared by lrmoe-plan and lrmoe-sim (see plan_cli.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_cli.h"
#include "route.h"
#include "parse.h"

void lrmoe_plan_cli_init(lrmoe_plan_cli_t *c, lrmoe_plan_opts_t *o)
{
    c->o = o;
    c->gpu = c->resident = -1;
    c->set_D = c->set_F = c->set_K = c->set_T = c->set_dtype = 0;
    c->weights_path = NULL;
    c->w = NULL;
    memset(&c->wmap, 0, sizeof c->wmap);
}

void lrmoe_plan_cli_free(lrmoe_plan_cli_t *c)
{
    if (!c->w)
        return;
    lrmoe_weights_close(c->w, &c->wmap);
    free(c->w);
    c->w = NULL;
}

int lrmoe_plan_cli_load(lrmoe_plan_cli_t *c)
{
    if (!c->weights_path || c->w)
        return 0;
    lrmoe_weights_t *w = calloc(1, sizeof *w);
    if (!w)
        return lrmoe_err("out of memory");
    /* the digests on every CPU this process may use (plan has no -@) */
    if (lrmoe_weights_open(c->weights_path, w, &c->wmap, 0) < 0) {
        free(w);
        return lrmoe_err_prefix("--weights"); /* the reader names the file */
    }
    c->w = w;
    return 0;
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
    case LRMOE_PLAN_OPT_MIN_CHUNK: r = lrmoe_parse_i64("--min-chunk", arg, 0, INT64_MAX / 4, &o->min_chunk); break;
    case LRMOE_PLAN_OPT_RATES: r = lrmoe_plan_parse_rates(o, arg); break;
    case 'q': r = lrmoe_quota_parse(arg, &o->quota); break;
    case LRMOE_PLAN_OPT_MIN_KEEP: r = lrmoe_parse_f64("--min-keep", arg, 0, 1, &o->min_keep); break;
    case LRMOE_PLAN_OPT_GLPK_TIME:
        r = lrmoe_parse_f64("--glpk-time", arg, 1e-3, 3600, &o->glpk_tm_lim);
        break;
    case LRMOE_PLAN_OPT_LONGER: o->longer_bwd = 1; r = 0; break;
    case LRMOE_PLAN_OPT_CAPACITY_FACTOR: {
        double f;
        r = lrmoe_parse_f64("--capacity-factor", arg, -1e300, 1e300, &f);
        if (r == 0 && lrmoe_plan_set_capacity_factor(o, f) < 0)
            r = lrmoe_err_prefix("--capacity-factor");
        break;
    }
    case LRMOE_PLAN_OPT_DROP_POLICY: {
        lrmoe_capacity_policy_t dp;
        r = lrmoe_capacity_policy_parse(arg, &dp);
        if (r == 0)
            o->capacity_policy = (int)dp;
        else
            r = lrmoe_err_prefix("--drop-policy");
        break;
    }
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
    case LRMOE_PLAN_OPT_FFN:
        r = lrmoe_parse_i64("--ffn", arg, 1, 1 << 24, &o->cost.F);
        c->set_F = 1;
        break;
    case 'k':
        r = as_int(lrmoe_parse_i64("--topk", arg, 1, 1 << 20, &v), &v, &o->cost.K);
        c->set_K = 1;
        break;
    case LRMOE_PLAN_OPT_TOKENS:
        r = lrmoe_parse_i64("--tokens", arg, 0, INT64_C(1) << 40, &o->cost.tokens);
        c->set_T = 1;
        break;
    case LRMOE_PLAN_OPT_WEIGHTS:
        lrmoe_plan_cli_free(c); /* a second --weights replaces the first */
        c->weights_path = arg;
        r = 0;
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
    if (!(c->resident < c->gpu)) {
        char r[24], g[24];
        return lrmoe_err("--resident %s leaves no memory of --gpu-mem %s for replicas and "
                         "buffers", lrmoe_cost_fmt_bytes(c->resident, r, sizeof r),
                         lrmoe_cost_fmt_bytes(c->gpu, g, sizeof g));
    }
    c->o->cost.gpu_mem = c->gpu;
    c->o->cost.resident = c->resident;
    c->o->cost.hbm = c->gpu - c->resident;
    return 0;
}

/* One size a frame may say: the first of its sources that is there. */
typedef struct {
    int64_t v;          /* 0: the frame does not say */
    char from[640];     /* "saved_gate [512,4,128]", "attribute ffn=16" */
} said_t;

/* tensor `name` of ndim dimensions: its dimension `dim` */
static void from_tensor(said_t *s, const lrmoe_frame_t *f, const char *name, int ndim, int dim)
{
    const lrmoe_tensor_t *t;
    if (s->v || !(t = lrmoe_frame_get(f, name)) || t->ndim != ndim || t->shape[dim] <= 0)
        return;
    char sh[64];
    s->v = t->shape[dim];
    snprintf(s->from, sizeof s->from, "%s %s", name, lrmoe_shape_str(t, sh, sizeof sh));
}

static void from_attr(said_t *s, const lrmoe_frame_t *f, const char *key)
{
    int64_t v;
    if (s->v || lrmoe_frame_attr_i64(f, key, &v) != 1 || v <= 0 || v > (INT64_C(1) << 40))
        return;
    s->v = v;
    snprintf(s->from, sizeof s->from, "attribute %s=%lld", key, (long long)v);
}

/* the option's value *opt against what the frame said: given and different
 * is an error; not given, the frame's value (or the earlier plan's hint).
 * 1: the frame, the option or the hint set it; 0: the default stands; -1. */
static int settle(const char *opt, const char *sym, int given, const said_t *s,
                  const lrmoe_frame_t *f, const char *hint, int64_t *opt_v)
{
    if (s->v) {
        if (given && *opt_v != s->v) {
            /* an attribute can be restated explicitly (lrmoe-cat(1)) */
            char hint[320] = "";
            if (!strncmp(s->from, "attribute ", 10))
                snprintf(hint, sizeof hint, ", or restate the trace: lrmoe-cat --set-attr "
                         "%.*s=%lld IN > OUT", (int)strcspn(s->from + 10, "="), s->from + 10,
                         (long long)*opt_v);
            return lrmoe_err("%s %lld disagrees with the frame: %s=%lld (%s); drop %s or "
                             "give %lld%s", opt, (long long)*opt_v, sym, (long long)s->v,
                             s->from, opt, (long long)s->v, hint);
        }
        *opt_v = s->v;
        return 1;
    }
    int64_t v;
    if (!given && hint && lrmoe_frame_attr_i64(f, hint, &v) == 1 && v > 0 && v <= (INT64_C(1) << 40)) {
        *opt_v = v;
        return 1;
    }
    return given;
}

/* what the frame said (fr) and what its weights said (wt): two that differ
 * are an error, else the one that said it goes into fr */
static int merge(said_t *fr, const said_t *wt, const char *sym)
{
    if (!wt->v)
        return 0;
    if (fr->v && fr->v != wt->v)
        return lrmoe_err("the frame says %s=%lld (%s), its weights %s=%lld (%s): the weights "
                         "of another model?", sym, (long long)fr->v, fr->from, sym,
                         (long long)wt->v, wt->from);
    if (!fr->v)
        *fr = *wt;
    return 0;
}

static void prefix(said_t *s, const char *pre)
{
    size_t n = strlen(pre), m = strlen(s->from);
    if (n >= sizeof s->from)
        n = sizeof s->from - 1;
    if (n + m >= sizeof s->from)
        m = sizeof s->from - 1 - n;
    memmove(s->from + n, s->from, m);
    memcpy(s->from, pre, n);
    s->from[n + m] = 0;
}

/* D and F from the --weights frame of f's layer (lrmoe-exec's matching) */
static int from_weights(const lrmoe_plan_cli_t *c, const lrmoe_frame_t *f, said_t *D, said_t *F)
{
    int64_t layer = 0;
    if (lrmoe_frame_attr_i64(f, "layer", &layer) < 0)
        return lrmoe_err("attribute layer: not an integer");
    const lrmoe_frame_t *wf = lrmoe_weights_layer(c->w, layer);
    if (!wf)
        return lrmoe_err("--weights %s: no frame for layer %lld", c->weights_path,
                         (long long)layer);
    /* the frame's digest record, checked at its first use (a mapped file:
     * the layers no frame names are not read; where the record is by
     * parts, only the header, which holds the shapes taken here) */
    if (lrmoe_weights_use_tensors(&c->wmap, c->w, wf, NULL, 0) < 0)
        return lrmoe_err_prefix("--weights");
    said_t wd = {0}, wfn = {0};
    from_tensor(&wd, wf, "w_gate", 3, 2);
    from_tensor(&wd, wf, "w_up", 3, 2);
    from_tensor(&wd, wf, "w_down", 3, 1);
    from_tensor(&wfn, wf, "w_gate", 3, 1);
    from_tensor(&wfn, wf, "w_up", 3, 1);
    from_tensor(&wfn, wf, "w_down", 3, 2);
    if (!wd.v || !wfn.v)
        return lrmoe_err("--weights %s: layer %lld has no w_gate, w_up or w_down [E,F,D]",
                         c->weights_path, (long long)layer);
    const lrmoe_tensor_t *wg = lrmoe_frame_get(wf, "w_gate"), *tl = lrmoe_frame_get(f, "expert_load");
    if (wg && wg->ndim == 3 && tl && tl->ndim == 1 && wg->shape[0] != tl->shape[0])
        return lrmoe_err("expert_load has %lld experts, --weights %s layer %lld has %lld "
                         "(w_gate): weights of another model?", (long long)tl->shape[0],
                         c->weights_path, (long long)layer, (long long)wg->shape[0]);
    char pre[512];
    snprintf(pre, sizeof pre, "--weights %s layer %lld: ", c->weights_path, (long long)layer);
    prefix(&wd, pre);
    prefix(&wfn, pre);
    return merge(D, &wd, "D") < 0 || merge(F, &wfn, "F") < 0 ? -1 : 0;
}

int lrmoe_plan_cli_frame(const lrmoe_plan_cli_t *c, const lrmoe_frame_t *f, int P, int k_hint,
                         lrmoe_cost_model_t *m)
{
    static const lrmoe_plan_cli_t none = {0};
    if (!c)
        c = &none;
    said_t D = {0}, F = {0}, K = {0}, T = {0};
    from_tensor(&D, f, "hidden", 2, 1);
    from_tensor(&D, f, "grad_output", 2, 1);
    from_tensor(&D, f, "output", 2, 1);
    from_tensor(&D, f, "pack_hidden", 2, 1);
    from_tensor(&D, f, "w_gate", 3, 2);
    from_attr(&D, f, "route.hidden"); /* lrmoe-route --loads-only */
    from_attr(&D, f, "hidden");       /* lrmoe-gen --routing-only, --loads-only */
    from_tensor(&F, f, "saved_gate", 3, 2);
    from_tensor(&F, f, "saved_up", 3, 2);
    from_tensor(&F, f, "w_gate", 3, 1);
    from_tensor(&F, f, "w_up", 3, 1);
    from_tensor(&F, f, "w_down", 3, 2);
    from_attr(&F, f, "ffn");
    from_tensor(&K, f, "topk_ids", 2, 1);
    from_tensor(&K, f, "saved_gate", 3, 1);
    from_attr(&K, f, "route.topk");
    from_attr(&K, f, "topk");
    if (!K.v && k_hint > 0) {
        K.v = k_hint;
        snprintf(K.from, sizeof K.from, "its pairs per token");
    }
    from_tensor(&T, f, "topk_ids", 2, 0);
    from_tensor(&T, f, "hidden", 2, 0);
    from_attr(&T, f, "route.tokens");
    const lrmoe_tensor_t *tl = lrmoe_frame_get(f, "expert_load");
    if (!T.v && K.v && tl && tl->ndim == 1 && tl->shape[0] > 0) {
        int64_t *load = malloc((size_t)tl->shape[0] * sizeof *load);
        if (!load)
            return lrmoe_err("out of memory");
        /* whole-number floats count too; other floats say nothing of T here
         * (the planner's own read of the loads reports them) */
        if (lrmoe_route_load_i64(tl->dtype, tl->data, tl->shape[0], load) == 0) {
            /* a negative load or a sum past 2^63 says nothing of T either
             * (the planner's own read refuses such loads) */
            int64_t n = 0;
            for (int64_t e = 0; e < tl->shape[0] && n >= 0; e++)
                if (load[e] < 0 || __builtin_add_overflow(n, load[e], &n))
                    n = -1;
            if (n > 0 && n % K.v == 0) {
                T.v = n / K.v;
                snprintf(T.from, sizeof T.from, "expert_load: %lld pairs over K=%lld",
                         (long long)n, (long long)K.v);
            }
        }
        free(load);
    }
    if (c->w && from_weights(c, f, &D, &F) < 0)
        return -1;
    if (T.v && P > 0) { /* tokens per rank */
        T.v /= P;
        size_t n = strlen(T.from);
        snprintf(T.from + n, sizeof T.from - n, " over %d ranks", P);
    }
    int64_t k = m->K;
    int fset;
    if (settle("--hidden", "D", c->set_D, &D, f, "plan.hidden", &m->D) < 0 ||
        (fset = settle("--ffn", "F", c->set_F, &F, f, "plan.ffn", &m->F)) < 0 ||
        settle("--topk", "K", c->set_K, &K, f, "plan.topk", &k) < 0 ||
        settle("--tokens", "tokens per rank", c->set_T, &T, f, "plan.tokens_per_rank",
               &m->tokens) < 0)
        return -1;
    if (!fset) /* F decides every replica's memory: never assumed */
        return lrmoe_err("the frame says nothing of the expert FFN width F (no saved_gate, "
                         "saved_up, w_gate, w_up, w_down or attribute ffn): give --ffn F or "
                         "--weights FILE (the weights stream of the model)");
    m->K = (int)k;
    const lrmoe_tensor_t *hd = lrmoe_frame_get(f, "hidden");
    if (hd && hd->ndim == 2 && !c->set_dtype)
        m->dtype_bytes = (int)lrmoe_dtype_size(hd->dtype);
    return 0;
}

int lrmoe_plan_cli_plan(const lrmoe_plan_cli_t *c, lrmoe_eplb_cache_t *eplb, const int64_t *load,
                        int E, lrmoe_frame_t *f, lrmoe_plan_t *p, lrmoe_plan_opts_t *used)
{
    lrmoe_plan_opts_t o = *c->o;
    if (lrmoe_plan_cli_frame(c, f, o.P, 0, &o.cost) < 0)
        return -1;
    if (used)
        *used = o;
    return lrmoe_plan_frame(&o, eplb, load, E, f, p);
}
