/* budget: the per-layer memory budget of lrmoe-plan -M (budget.h,
 * lrmoe-budget(1) writes the formula down term by term). */
#include "budget_internal.h"
#include "lrmoe.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------- presets */

/* The full configs (the fields the budget reads) of lrmoe-gen's presets
 * whose family is parsed here: the models' published config.json values. */
static const struct {
    const char *name, *json;
} PRESETS[] = {
    {"qwen3-30b-a3b",
     "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 2048, \"num_hidden_layers\": 48,"
     " \"num_attention_heads\": 32, \"num_key_value_heads\": 4, \"head_dim\": 128,"
     " \"vocab_size\": 151936, \"num_experts\": 128, \"num_experts_per_tok\": 8,"
     " \"moe_intermediate_size\": 768, \"intermediate_size\": 6144,"
     " \"decoder_sparse_step\": 1, \"mlp_only_layers\": [], \"attention_bias\": false,"
     " \"tie_word_embeddings\": false}"},
    {"deepseek-v3",
     "{\"model_type\": \"deepseek_v3\", \"hidden_size\": 7168, \"num_hidden_layers\": 61,"
     " \"num_attention_heads\": 128, \"vocab_size\": 129280, \"n_routed_experts\": 256,"
     " \"num_experts_per_tok\": 8, \"moe_intermediate_size\": 2048, \"n_shared_experts\": 1,"
     " \"intermediate_size\": 18432, \"first_k_dense_replace\": 3, \"q_lora_rank\": 1536,"
     " \"kv_lora_rank\": 512, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64,"
     " \"v_head_dim\": 128, \"attention_bias\": false, \"tie_word_embeddings\": false}"},
    {"kimi-k2",
     "{\"model_type\": \"deepseek_v3\", \"hidden_size\": 7168, \"num_hidden_layers\": 61,"
     " \"num_attention_heads\": 64, \"vocab_size\": 163840, \"n_routed_experts\": 384,"
     " \"num_experts_per_tok\": 8, \"moe_intermediate_size\": 2048, \"n_shared_experts\": 1,"
     " \"intermediate_size\": 18432, \"first_k_dense_replace\": 1, \"q_lora_rank\": 1536,"
     " \"kv_lora_rank\": 512, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64,"
     " \"v_head_dim\": 128, \"attention_bias\": false, \"tie_word_embeddings\": false}"},
};
#define NPRESETS ((int)(sizeof PRESETS / sizeof PRESETS[0]))

const char *lrmoe_budget_preset_name(int i)
{
    return i >= 0 && i < NPRESETS ? PRESETS[i].name : NULL;
}

int lrmoe_budget_model_preset(const char *name, lrmoe_budget_model_t *m, const char **json)
{
    for (int i = 0; name && i < NPRESETS; i++)
        if (!strcmp(PRESETS[i].name, name)) {
            if (json)
                *json = PRESETS[i].json;
            return lrmoe_budget_model_json(PRESETS[i].json, m);
        }
    char names[256] = "";
    for (int i = 0; i < NPRESETS; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                 PRESETS[i].name);
    return lrmoe_err("unknown budget preset '%s' (%s; or give a config.json)",
                     name ? name : "(null)", names);
}

/* ---------------------------------------------------------------- checked arithmetic */

typedef struct {
    int ovf;
} acc_t;

static int64_t mul(acc_t *a, int64_t x, int64_t y)
{
    int64_t r;
    if (__builtin_mul_overflow(x, y, &r)) {
        a->ovf = 1;
        return 0;
    }
    return r;
}

static int64_t add(acc_t *a, int64_t x, int64_t y)
{
    int64_t r;
    if (__builtin_add_overflow(x, y, &r)) {
        a->ovf = 1;
        return 0;
    }
    return r;
}

static int64_t ceildiv(int64_t x, int64_t y)
{
    return x / y + (x % y != 0);
}

/* ---------------------------------------------------------------- config.json */

/* a positive (or, zero_ok, non-negative) integer field; -1 with the field named */
static int jint(json_t *o, const char *key, int zero_ok, int64_t *out)
{
    json_t *v = json_object_get(o, key);
    if (!v)
        return lrmoe_err("config: field '%s' missing", key);
    if (!json_is_integer(v))
        return lrmoe_err("config: field '%s' is not an integer", key);
    int64_t x = json_integer_value(v);
    if (x < 0 || (!zero_ok && x == 0) || x > ((int64_t)1 << 40))
        return lrmoe_err("config: field '%s' = %lld out of range", key, (long long)x);
    *out = x;
    return 0;
}

/* a positive integer field that Hugging Face's attribute_map also writes
 * under another name (num_experts / num_local_experts / n_routed_experts):
 * the one present; both present must agree */
static int jint_alias(json_t *o, const char *key, const char *alias, int64_t *out)
{
    int hk = json_object_get(o, key) != NULL, ha = json_object_get(o, alias) != NULL;
    int64_t a = 0;
    if (!hk && !ha)
        return lrmoe_err("config: field '%s' (or '%s') missing", key, alias);
    if ((hk && jint(o, key, 0, out) < 0) || (ha && jint(o, alias, 0, &a) < 0))
        return -1;
    if (hk && ha && a != *out)
        return lrmoe_err("config: fields '%s' %lld and '%s' %lld disagree", key,
                         (long long)*out, alias, (long long)a);
    if (!hk)
        *out = a;
    return 0;
}

/* an optional positive integer: absent or null -> 0 */
static int jint_opt(json_t *o, const char *key, int64_t *out)
{
    json_t *v = json_object_get(o, key);
    *out = 0;
    if (!v || json_is_null(v))
        return 0;
    return jint(o, key, 0, out);
}

static int jbool(json_t *o, const char *key, int64_t *out)
{
    json_t *v = json_object_get(o, key);
    if (!v)
        return lrmoe_err("config: field '%s' missing", key);
    if (!json_is_boolean(v))
        return lrmoe_err("config: field '%s' is not true or false", key);
    *out = json_is_true(v);
    return 0;
}

/* Qwen2/3-MoE: is layer i an MoE layer (decoder_sparse_step, mlp_only_layers)? */
static int qwen_is_moe(json_t *only, int64_t step, int64_t E, int64_t i)
{
    size_t k;
    json_t *v;
    json_array_foreach(only, k, v) if (json_integer_value(v) == i) return 0;
    return E > 0 && (i + 1) % step == 0;
}

/* a SwiGLU MLP of width f: parameters (with biases when bias) */
static int64_t mlp_params(acc_t *a, int64_t D, int64_t f, int64_t bias)
{
    return add(a, mul(a, mul(a, 3, D), f), bias ? add(a, mul(a, 2, f), D) : 0);
}

static int parse(json_t *c, lrmoe_budget_model_t *m)
{
    acc_t a = {0};
    memset(m, 0, sizeof *m);
    json_t *mt = json_object_get(c, "model_type");
    if (!mt)
        return lrmoe_err("config: field 'model_type' missing");
    if (!json_is_string(mt))
        return lrmoe_err("config: field 'model_type' is not a string");
    const char *fam = json_string_value(mt);
    int qwen3 = !strcmp(fam, "qwen3_moe"), qwen2 = !strcmp(fam, "qwen2_moe");
    int mixtral = !strcmp(fam, "mixtral");
    int dsv2 = !strcmp(fam, "deepseek_v2"), dsv3 = !strcmp(fam, "deepseek_v3");
    if (!(qwen3 || qwen2 || mixtral || dsv2 || dsv3))
        return lrmoe_err("config: model_type '%s' is not one lrmoe-budget knows (qwen3_moe, "
                         "qwen2_moe, mixtral, deepseek_v2, deepseek_v3)", fam);
    snprintf(m->family, sizeof m->family, "%s", fam);
    int64_t D, L, V, H;
    if (jint(c, "hidden_size", 0, &D) < 0 || jint(c, "num_hidden_layers", 0, &L) < 0 ||
        jint(c, "vocab_size", 0, &V) < 0 || jint(c, "num_attention_heads", 0, &H) < 0 ||
        jbool(c, "tie_word_embeddings", &m->tied) < 0)
        return -1;
    m->hidden = D, m->layers = L, m->vocab = V, m->heads = H;
    if (jint(c, "num_experts_per_tok", 0, &m->topk) < 0)
        return -1;

    /* attention: parameters and saved elements per token of one layer */
    int64_t attn = 0, act = 0;
    if (dsv2 || dsv3) {
        int64_t qr, kvr, nope, rope, vh, ab;
        if (jint_opt(c, "q_lora_rank", &qr) < 0 || jint(c, "kv_lora_rank", 0, &kvr) < 0 ||
            jint(c, "qk_nope_head_dim", 0, &nope) < 0 ||
            jint(c, "qk_rope_head_dim", 0, &rope) < 0 || jint(c, "v_head_dim", 0, &vh) < 0 ||
            jbool(c, "attention_bias", &ab) < 0)
            return -1;
        int64_t qk = nope + rope;
        if (qr) /* q_a_proj (+bias), q_a_layernorm, q_b_proj */
            attn = add(&a, add(&a, mul(&a, D, qr), ab ? qr : 0),
                       add(&a, qr, mul(&a, mul(&a, qr, H), qk)));
        else /* q_proj */
            attn = mul(&a, mul(&a, D, H), qk);
        /* kv_a_proj_with_mqa (+bias), kv_a_layernorm, kv_b_proj, o_proj (+bias) */
        attn = add(&a, attn, add(&a, mul(&a, D, kvr + rope), ab ? kvr + rope : 0));
        attn = add(&a, attn, add(&a, kvr, mul(&a, mul(&a, kvr, H), nope + vh)));
        attn = add(&a, attn, add(&a, mul(&a, mul(&a, H, vh), D), ab ? D : 0));
        /* saved: q_a output and its norm's output, kv_a's compressed part and its
         * norm's output, q and k (H*qk each), v and the attention output (H*vh each) */
        act = add(&a, add(&a, 2 * qr, 2 * kvr), add(&a, mul(&a, 2 * H, qk), mul(&a, 2 * H, vh)));
    } else {
        int64_t KV, hd = 0, qkv_bias = 0, o_bias = 0;
        if (jint(c, "num_key_value_heads", 0, &KV) < 0 || jint_opt(c, "head_dim", &hd) < 0)
            return -1;
        if (!hd) { /* the model's own definition when the config has none */
            if (D % H)
                return lrmoe_err("config: no head_dim and hidden_size %lld not a multiple of "
                                 "num_attention_heads %lld", (long long)D, (long long)H);
            hd = D / H;
        }
        if (qwen3) {
            if (jbool(c, "attention_bias", &qkv_bias) < 0)
                return -1;
            o_bias = qkv_bias;
        } else if (qwen2) {
            /* Qwen2-MoE's q/k/v always had biases; newer configs say so in qkv_bias */
            qkv_bias = 1;
            if (json_object_get(c, "qkv_bias") && jbool(c, "qkv_bias", &qkv_bias) < 0)
                return -1;
        }
        int64_t q = mul(&a, H, hd), kv = mul(&a, KV, hd);
        attn = add(&a, mul(&a, D, add(&a, 2 * q, 2 * kv)), qkv_bias ? q + 2 * kv : 0);
        attn = add(&a, attn, o_bias ? D : 0);
        if (qwen3)
            attn = add(&a, attn, 2 * hd); /* q_norm, k_norm */
        /* saved: q, k, v, the attention output; with q/k norms their inputs too */
        act = add(&a, 2 * q, 2 * kv);
        if (qwen3)
            act = add(&a, act, q + kv);
    }
    m->attn_act = act;

    /* the MLP blocks */
    int64_t E, F, shared_f = 0, dense_f = 0, mlp_bias = 0, shared_gate = 0;
    int64_t moe_layers = 0;
    if (qwen3 || qwen2) {
        int64_t step;
        if (jint_alias(c, "num_experts", "num_local_experts", &E) < 0 || jint(c, "moe_intermediate_size", 0, &F) < 0 ||
            jint(c, "decoder_sparse_step", 0, &step) < 0)
            return -1;
        json_t *only = json_object_get(c, "mlp_only_layers");
        if (!only)
            return lrmoe_err("config: field 'mlp_only_layers' missing");
        if (!json_is_array(only))
            return lrmoe_err("config: field 'mlp_only_layers' is not a list");
        size_t k;
        json_t *v;
        json_array_foreach(only, k, v) if (!json_is_integer(v)) return lrmoe_err(
            "config: field 'mlp_only_layers' holds a non-integer");
        for (int64_t i = 0; i < L; i++)
            moe_layers += qwen_is_moe(only, step, E, i);
        if (qwen2) {
            if (jint(c, "shared_expert_intermediate_size", 1, &shared_f) < 0)
                return -1;
            shared_gate = 1; /* shared_expert_gate: built even at width 0 */
        }
    } else if (mixtral) {
        if (jint_alias(c, "num_local_experts", "num_experts", &E) < 0 || jint(c, "intermediate_size", 0, &F) < 0)
            return -1;
        moe_layers = L;
    } else {
        int64_t ns, fk;
        if (jint_alias(c, "n_routed_experts", "num_local_experts", &E) < 0 ||
            jint(c, "moe_intermediate_size", 0, &F) < 0 ||
            jint(c, "n_shared_experts", 1, &ns) < 0 ||
            jint(c, "first_k_dense_replace", 1, &fk) < 0)
            return -1;
        shared_f = mul(&a, F, ns);
        moe_layers = fk < L ? L - fk : 0;
        if (dsv2 && jbool(c, "mlp_bias", &mlp_bias) < 0)
            return -1;
    }
    if (moe_layers < L && jint(c, "intermediate_size", 0, &dense_f) < 0)
        return -1;
    if (moe_layers == 0)
        return lrmoe_err("config: no MoE layer (every layer is dense)");
    m->experts = E, m->expert_ffn = F, m->moe_layers = moe_layers;
    m->expert_params = mul(&a, mul(&a, E, 3), mul(&a, D, F));
    m->moe_mlp_act = mul(&a, 3, shared_f);
    m->dense_mlp_act = mul(&a, 3, dense_f);

    /* every parameter but the routed experts */
    int64_t per_moe = mul(&a, E, D); /* router */
    if (shared_f)
        per_moe = add(&a, per_moe, mlp_params(&a, D, shared_f, mlp_bias));
    if (shared_gate)
        per_moe = add(&a, per_moe, D);
    int64_t per_dense = dense_f ? mlp_params(&a, D, dense_f, mlp_bias) : 0;
    int64_t per_layer = add(&a, attn, 2 * D); /* + input/post-attention norms */
    int64_t n = mul(&a, L, per_layer);
    n = add(&a, n, mul(&a, moe_layers, per_moe));
    n = add(&a, n, mul(&a, L - moe_layers, per_dense));
    n = add(&a, n, add(&a, mul(&a, V, D), D)); /* embedding, final norm */
    if (!m->tied)
        n = add(&a, n, mul(&a, V, D));     /* lm_head */
    m->dense_params = n;
    if (a.ovf)
        return lrmoe_err("config: sizes overflow 64 bits");
    return 0;
}

int lrmoe_budget_model_json(const char *text, lrmoe_budget_model_t *m)
{
    json_error_t e;
    json_t *c = json_loads(text, 0, &e);
    if (!c)
        return lrmoe_err("config: line %d: %s", e.line, e.text);
    int rc = json_is_object(c) ? parse(c, m) : lrmoe_err("config: not a JSON object");
    json_decref(c);
    return rc;
}

int lrmoe_budget_model_file(const char *path, lrmoe_budget_model_t *m)
{
    json_error_t e;
    json_t *c = json_load_file(path, 0, &e);
    if (!c)
        return lrmoe_err("%s: line %d: %s", path, e.line, e.text);
    int rc = json_is_object(c) ? parse(c, m) : lrmoe_err("config: not a JSON object");
    json_decref(c);
    if (rc < 0)
        lrmoe_err_prefix("%s", path);
    return rc;
}

/* ---------------------------------------------------------------- the budget */

void lrmoe_budget_opts_default(lrmoe_budget_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->tp = o->pp = o->dp = o->ep = 1;
    o->seq = 4096;
    o->micro_batch = 1;
    o->checkpoint = LRMOE_BUDGET_CKPT_FULL;
    o->param_bytes = 2;
    o->grad_bytes = 4;
    o->optim_bytes = 12;
    o->act_bytes = 2;
}

int lrmoe_budget_compute(const lrmoe_budget_model_t *m, const lrmoe_budget_opts_t *o,
                         lrmoe_budget_t *r)
{
    acc_t a = {0};
    memset(r, 0, sizeof *r);
    const struct {
        const char *name;
        int64_t v;
    } pos[] = {{"tp", o->tp}, {"pp", o->pp}, {"dp", o->dp}, {"ep", o->ep},
               {"seq", o->seq}, {"micro-batch", o->micro_batch},
               {"param bytes", o->param_bytes}, {"act bytes", o->act_bytes},
               {"gpu-mem", o->gpu_mem}};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v < 1)
            return lrmoe_err("budget: %s %lld must be >= 1", pos[i].name, (long long)pos[i].v);
    if (o->grad_bytes < 0 || o->optim_bytes < 0 || o->reserve < 0)
        return lrmoe_err("budget: grad bytes, optimizer bytes and reserve must be >= 0");
    if (o->checkpoint != LRMOE_BUDGET_CKPT_NONE && o->checkpoint != LRMOE_BUDGET_CKPT_FULL)
        return lrmoe_err("budget: checkpoint %d is neither none nor full", o->checkpoint);
    if (m->layers < 1 || m->moe_layers < 1 || m->moe_layers > m->layers || m->experts < 1 ||
        m->hidden < 1 || m->vocab < 1 || m->heads < 1 || m->expert_params < 0 ||
        m->dense_params < 0 || m->attn_act < 0 || m->moe_mlp_act < 0 || m->dense_mlp_act < 0)
        return lrmoe_err("budget: the model has no MoE layer or a size < 0");
    if (m->experts % o->ep)
        return lrmoe_err("budget: ep %lld does not divide the %lld experts", (long long)o->ep,
                         (long long)m->experts);
    if (m->layers % o->pp)
        return lrmoe_err("budget: pp %lld does not divide the %lld layers", (long long)o->pp,
                         (long long)m->layers);
    int64_t dptp = mul(&a, o->dp, o->tp);
    if (!a.ovf && dptp % o->ep)
        return lrmoe_err("budget: ep %lld does not divide dp*tp = %lld (experts are not "
                         "tensor-parallel: ep ranks come from the dp*tp GPUs of a stage)",
                         (long long)o->ep, (long long)dptp);
    r->edp = dptp / o->ep;
    r->stage_layers = m->layers / o->pp;
    r->stage_moe_layers = ceildiv(m->moe_layers, o->pp);
    if (r->stage_moe_layers > r->stage_layers)
        r->stage_moe_layers = r->stage_layers;
    r->inflight = o->pp;

    /* static: weights, gradients, optimizer state */
    r->params_dense = ceildiv(m->dense_params, mul(&a, o->tp, o->pp));
    r->params_expert = mul(&a, m->expert_params / o->ep, r->stage_moe_layers);
    int64_t p = add(&a, r->params_dense, r->params_expert);
    r->weights = mul(&a, p, o->param_bytes);
    r->grads = mul(&a, p, o->grad_bytes);
    if (o->zero1)
        r->optim = add(&a, ceildiv(mul(&a, r->params_dense, o->optim_bytes), o->dp),
                       ceildiv(mul(&a, r->params_expert, o->optim_bytes), r->edp));
    else
        r->optim = mul(&a, p, o->optim_bytes);
    r->static_bytes = add(&a, add(&a, r->weights, r->grads), r->optim);

    /* activations of one micro-batch, per layer (non-expert part), on 1/tp of
     * the tokens (sequence parallelism): 4 D-vectors (the two norms' inputs and
     * outputs), the attention's saved elements, the MLP's (shared experts or a
     * dense layer), all in act_bytes; FP32 softmax statistics H and, in MoE
     * layers, router logits E */
    int64_t tok = ceildiv(mul(&a, o->seq, o->micro_batch), o->tp);
    int64_t base = add(&a, mul(&a, 4, m->hidden), m->attn_act);
    int64_t moe_tok = add(&a, mul(&a, add(&a, base, m->moe_mlp_act), o->act_bytes),
                          mul(&a, 4, add(&a, m->heads, m->experts)));
    int64_t dense_tok = add(&a, mul(&a, add(&a, base, m->dense_mlp_act), o->act_bytes),
                            mul(&a, 4, m->heads));
    r->act_layer_moe = mul(&a, tok, moe_tok);
    r->act_layer_dense = mul(&a, tok, dense_tok);
    int64_t stage_dense = r->stage_layers - r->stage_moe_layers;
    int64_t has_dense = m->moe_layers < m->layers && stage_dense > 0;
    if (o->checkpoint == LRMOE_BUDGET_CKPT_FULL) {
        /* every layer keeps its input; the layer being recomputed its saved set */
        r->act_stored = mul(&a, mul(&a, r->inflight, r->stage_layers),
                            mul(&a, tok, mul(&a, m->hidden, o->act_bytes)));
        r->act_working = r->act_layer_moe;
        if (has_dense && r->act_layer_dense > r->act_working)
            r->act_working = r->act_layer_dense;
        r->alive = 1;
    } else {
        r->act_stored = mul(&a, r->inflight,
                            add(&a, mul(&a, r->stage_moe_layers, r->act_layer_moe),
                                mul(&a, stage_dense, r->act_layer_dense)));
        r->act_working = 0;
        r->alive = mul(&a, r->stage_moe_layers, r->inflight);
    }
    r->logits = ceildiv(mul(&a, mul(&a, o->seq, o->micro_batch), mul(&a, m->vocab, 4)), o->tp);
    r->activations = add(&a, add(&a, r->act_stored, r->act_working), r->logits);
    r->reserve = o->reserve;
    int64_t used = add(&a, add(&a, r->reserve, r->static_bytes), r->activations);
    if (a.ovf)
        return lrmoe_err("budget: sizes overflow 64 bits");
    r->free_bytes = o->gpu_mem - used;
    r->fits = r->free_bytes >= 0;
    r->hbm = r->fits ? r->free_bytes / r->alive : 0;
    r->resident = o->gpu_mem - r->hbm;
    return 0;
}
