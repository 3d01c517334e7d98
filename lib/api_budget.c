/* api_budget: the memory budget (lib/budget.c) behind an opaque handle
 * (budget.h), with options by lrmoe-budget(1)'s long names: the tool, the
 * Python package and C callers set the same names and read the same rows. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "budget_internal.h"
#include "lrmoe.h"
#include "options.h"
#include "parse.h"

struct lrmoe_budget_cfg {
    lrmoe_budget_model_t m;
    lrmoe_budget_opts_t o;
    lrmoe_budget_t r;
    int have_model, have_mem, have_run;
};

/* the rows of the breakdown, lrmoe-budget --tsv's columns after "model" */
enum {
    ROW_LAYERS, ROW_MOE_LAYERS, ROW_PARAMS_TOTAL, ROW_PARAMS_EXPERTS_TOTAL,
    ROW_PARAMS_OTHER_TOTAL, ROW_STAGE_LAYERS, ROW_STAGE_MOE_LAYERS, ROW_INFLIGHT, ROW_EDP,
    ROW_PARAMS_OTHER, ROW_PARAMS_EXPERTS, ROW_GPU_MEM, ROW_RESERVE, ROW_WEIGHTS, ROW_GRADS,
    ROW_OPTIM, ROW_ACT_STORED, ROW_ACT_WORKING, ROW_LOGITS, ROW_FREE, ROW_ALIVE, ROW_HBM,
    ROW_RESIDENT, ROW_FITS, NROWS
};
static const char *const ROWS[NROWS] = {
    "layers", "moe_layers", "params_total", "params_experts_total", "params_other_total",
    "stage_layers", "stage_moe_layers", "inflight", "edp", "params_other", "params_experts",
    "gpu_mem_bytes", "reserve_bytes", "weights_bytes", "grads_bytes", "optim_bytes",
    "act_stored_bytes", "act_working_bytes", "logits_bytes", "free_bytes", "alive",
    "hbm_bytes", "resident_bytes", "fits"};

static int64_t row_value(const lrmoe_budget_cfg_t *b, int i)
{
    const lrmoe_budget_model_t *m = &b->m;
    const lrmoe_budget_t *r = &b->r;
    const int64_t expert_total = m->expert_params * m->moe_layers;
    switch (i) {
    case ROW_LAYERS: return m->layers;
    case ROW_MOE_LAYERS: return m->moe_layers;
    case ROW_PARAMS_TOTAL: return m->dense_params + expert_total;
    case ROW_PARAMS_EXPERTS_TOTAL: return expert_total;
    case ROW_PARAMS_OTHER_TOTAL: return m->dense_params;
    case ROW_STAGE_LAYERS: return r->stage_layers;
    case ROW_STAGE_MOE_LAYERS: return r->stage_moe_layers;
    case ROW_INFLIGHT: return r->inflight;
    case ROW_EDP: return r->edp;
    case ROW_PARAMS_OTHER: return r->params_dense;
    case ROW_PARAMS_EXPERTS: return r->params_expert;
    case ROW_GPU_MEM: return b->o.gpu_mem;
    case ROW_RESERVE: return r->reserve;
    case ROW_WEIGHTS: return r->weights;
    case ROW_GRADS: return r->grads;
    case ROW_OPTIM: return r->optim;
    case ROW_ACT_STORED: return r->act_stored;
    case ROW_ACT_WORKING: return r->act_working;
    case ROW_LOGITS: return r->logits;
    case ROW_FREE: return r->free_bytes;
    case ROW_ALIVE: return r->alive;
    case ROW_HBM: return r->hbm;
    case ROW_RESIDENT: return r->resident;
    default: return r->fits;
    }
}

lrmoe_budget_cfg_t *lrmoe_budget_cfg_new(void)
{
    lrmoe_budget_cfg_t *b = calloc(1, sizeof *b);
    if (!b) {
        lrmoe_err("out of memory");
        return NULL;
    }
    lrmoe_budget_opts_default(&b->o);
    return b;
}

void lrmoe_budget_cfg_free(lrmoe_budget_cfg_t *b) { free(b); }

static int is(const char *name, const char *want) { return !strcmp(name, want); }

static int dtype_bytes(const char *name, const char *s, int64_t *out)
{
    lrmoe_dtype_t d;
    if (lrmoe_dtype_parse(s, &d) < 0 || !(d == LRMOE_BF16 || d == LRMOE_F16 || d == LRMOE_F32))
        return lrmoe_err("%s: '%s' is not bf16, f16 or f32", name, s);
    *out = (int64_t)lrmoe_dtype_size(d);
    return 0;
}

static int set_model(lrmoe_budget_cfg_t *b, const char *name, const char *value)
{
    lrmoe_budget_model_t m;
    int rc = is(name, "preset") ? lrmoe_budget_model_preset(value, &m, NULL)
             : is(name, "config") ? lrmoe_budget_model_file(value, &m)
                                  : lrmoe_budget_model_json(value, &m);
    if (rc < 0) return -1;
    b->m = m;
    b->have_model = 1;
    return 0;
}

/* a byte size of BYTES (lrmoe(7)) into *out */
static int set_bytes(const char *name, const char *value, int64_t *out)
{
    double d;
    if (lrmoe_parse_bytes(name, value, &d) < 0) return -1;
    *out = (int64_t)d;
    return 0;
}

/* the integer options: name, lowest, highest, offset in the options struct */
static const struct {
    const char *name;
    int64_t lo, hi;
    size_t off;
} INTS[] = {
    {"tp", 1, 1 << 20, offsetof(lrmoe_budget_opts_t, tp)},
    {"pp", 1, 1 << 20, offsetof(lrmoe_budget_opts_t, pp)},
    {"dp", 1, 1 << 24, offsetof(lrmoe_budget_opts_t, dp)},
    {"ep", 1, 1 << 20, offsetof(lrmoe_budget_opts_t, ep)},
    {"seq", 1, (int64_t)1 << 32, offsetof(lrmoe_budget_opts_t, seq)},
    {"micro-batch", 1, 1 << 20, offsetof(lrmoe_budget_opts_t, micro_batch)},
    {"optim-bytes", 0, 1024, offsetof(lrmoe_budget_opts_t, optim_bytes)},
    {"param-bytes", 1, 64, offsetof(lrmoe_budget_opts_t, param_bytes)},
    {"grad-bytes", 1, 64, offsetof(lrmoe_budget_opts_t, grad_bytes)},
    {"act-bytes", 1, 64, offsetof(lrmoe_budget_opts_t, act_bytes)},
};

static int set_option(lrmoe_budget_cfg_t *b, const char *name, const char *value)
{
    lrmoe_budget_opts_t *o = &b->o;
    for (size_t i = 0; i < sizeof INTS / sizeof INTS[0]; i++)
        if (is(name, INTS[i].name)) {
            char opt[32];
            snprintf(opt, sizeof opt, "--%s", name);
            return lrmoe_parse_i64(opt, value, INTS[i].lo, INTS[i].hi,
                                   (int64_t *)((char *)o + INTS[i].off));
        }
    if (is(name, "gpu-mem")) {
        if (set_bytes("--gpu-mem", value, &o->gpu_mem) < 0) return -1;
        b->have_mem = o->gpu_mem > 0;
        return 0;
    }
    if (is(name, "reserve")) return set_bytes("--reserve", value, &o->reserve);
    if (is(name, "checkpoint")) {
        if (!strcmp(value, "full") || !strcmp(value, "none")) {
            o->checkpoint = !strcmp(value, "full") ? LRMOE_BUDGET_CKPT_FULL : LRMOE_BUDGET_CKPT_NONE;
            return 0;
        }
        return lrmoe_err("--checkpoint: '%s' is not full or none", value);
    }
    if (is(name, "zero1")) {
        if (value && strcmp(value, "1") && strcmp(value, "0"))
            return lrmoe_err("zero1: '%s' is not 1 or 0", value);
        o->zero1 = !value || !strcmp(value, "1");
        return 0;
    }
    if (is(name, "dtype")) {
        if (dtype_bytes("--dtype", value, &o->param_bytes) < 0) return -1;
        o->act_bytes = o->param_bytes;
        return 0;
    }
    return dtype_bytes("--grad-dtype", value, &o->grad_bytes); /* grad-dtype */
}

int lrmoe_budget_cfg_set(lrmoe_budget_cfg_t *b, const char *name, const char *value)
{
    static const char *const names[] = {
        "preset", "config", "config-json", "gpu-mem", "reserve", "tp", "pp", "dp", "ep", "seq",
        "micro-batch", "checkpoint", "zero1!", "dtype", "grad-dtype", "optim-bytes",
        "param-bytes", "grad-bytes", "act-bytes", "expert-params", "dense-params", NULL};
    if (!b) return lrmoe_err("budget: no handle");
    if (is(name ? name : "", "zero1")) /* a flag that also takes 1 or 0 */
        return b->have_run = 0, set_option(b, name, value);
    if (lrmoe_parse_opt_name("budget", names, name, value) < 0) return -1;
    b->have_run = 0;
    if (is(name, "preset") || is(name, "config") || is(name, "config-json"))
        return set_model(b, name, value);
    if (is(name, "expert-params") || is(name, "dense-params")) {
        if (!b->have_model) return lrmoe_err("%s: set a model first", name);
        return lrmoe_parse_i64(name, value, 0, INT64_MAX / 4,
                               is(name, "expert-params") ? &b->m.expert_params
                                                         : &b->m.dense_params);
    }
    return set_option(b, name, value);
}

int lrmoe_budget_cfg_run(lrmoe_budget_cfg_t *b)
{
    if (!b) return lrmoe_err("budget: no handle");
    b->have_run = 0;
    if (!b->have_model) return lrmoe_err("budget: no model (set preset, config or config-json)");
    if (!b->have_mem) return lrmoe_err("budget: gpu-mem, the memory of one GPU, is required");
    if (lrmoe_budget_compute(&b->m, &b->o, &b->r) < 0) return -1;
    b->have_run = 1;
    return 0;
}

const char *lrmoe_budget_cfg_row(const lrmoe_budget_cfg_t *b, int i, int64_t *value)
{
    if (!b || !b->have_run || i < 0 || i >= NROWS) return NULL;
    if (value) *value = row_value(b, i);
    return ROWS[i];
}

/* the model's and the options' keys */
static int model_or_option(const lrmoe_budget_cfg_t *b, const char *key, int64_t *v)
{
    const lrmoe_budget_model_t *m = &b->m;
    const lrmoe_budget_opts_t *o = &b->o;
    const struct {
        const char *key;
        int64_t v;
        int model;
    } keys[] = {
        {"hidden", m->hidden, 1}, {"vocab", m->vocab, 1}, {"heads", m->heads, 1},
        {"experts", m->experts, 1}, {"topk", m->topk, 1}, {"expert_ffn", m->expert_ffn, 1},
        {"tied", m->tied, 1}, {"expert_params", m->expert_params, 1},
        {"dense_params", m->dense_params, 1}, {"tp", o->tp, 0}, {"pp", o->pp, 0},
        {"dp", o->dp, 0}, {"ep", o->ep, 0}, {"seq", o->seq, 0},
        {"micro_batch", o->micro_batch, 0}, {"checkpoint", o->checkpoint, 0},
        {"zero1", o->zero1, 0}, {"param_bytes", o->param_bytes, 0},
        {"grad_bytes", o->grad_bytes, 0}, {"optim_bytes_per_param", o->optim_bytes, 0},
        {"act_bytes", o->act_bytes, 0}, {"gpu_mem", o->gpu_mem, 0}, {"reserve", o->reserve, 0},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (is(key, keys[i].key)) {
            if (keys[i].model && !b->have_model)
                return lrmoe_err("budget: '%s' before a model is set", key);
            *v = keys[i].v;
            return 0;
        }
    return 1;
}

int lrmoe_budget_cfg_get(const lrmoe_budget_cfg_t *b, const char *key, int64_t *value)
{
    if (!b || !key || !value) return lrmoe_err("budget: no handle, key or value");
    /* "layers" and "moe_layers" are rows that need only the model */
    if (b->have_model && (is(key, "layers") || is(key, "moe_layers"))) {
        *value = is(key, "layers") ? b->m.layers : b->m.moe_layers;
        return 0;
    }
    int rc = model_or_option(b, key, value);
    if (rc <= 0) return rc;
    for (int i = 0; i < NROWS; i++)
        if (is(key, ROWS[i])) {
            if (!b->have_run) return lrmoe_err("budget: '%s' before a run", key);
            *value = row_value(b, i);
            return 0;
        }
    return lrmoe_err("budget: no value '%s'", key);
}

const char *lrmoe_budget_cfg_family(const lrmoe_budget_cfg_t *b)
{
    return b && b->have_model ? b->m.family : "";
}
