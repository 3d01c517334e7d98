/* The budget's model, options and breakdown as structs, and the functions
 * on them (lib/budget.c): not installed since API 2 (lrmoe(3)); callers use
 * the lrmoe_budget_cfg_t handle of budget.h (lib/api_budget.c), which holds
 * them. */
#ifndef LRMOE_BUDGET_INTERNAL_H
#define LRMOE_BUDGET_INTERNAL_H

#include <stdint.h>
#include "budget.h"

/* A model as the budget sees it (filled by lrmoe_budget_model_json/_file/
 * _preset, or by hand). Parameter counts are exact numel sums of the
 * Hugging Face model's parameters (buffers such as DeepSeek-V3's
 * e_score_correction_bias are not parameters); activations are elements per
 * token of one layer, in the activation dtype. */
typedef struct {
    char family[32];        /* model_type: qwen3_moe, qwen2_moe, mixtral, deepseek_v2, deepseek_v3 */
    int64_t layers;         /* L decoder layers */
    int64_t moe_layers;     /* layers with a routed-expert block */
    int64_t hidden;         /* D */
    int64_t vocab;          /* V */
    int64_t heads;          /* H attention heads */
    int64_t experts;        /* E routed experts per MoE layer */
    int64_t topk;           /* K */
    int64_t expert_ffn;     /* F of a routed expert */
    int64_t tied;           /* 1: lm_head shares the embedding */
    int64_t expert_params;  /* routed-expert parameters of ONE MoE layer (E*3*D*F) */
    int64_t dense_params;   /* every other parameter of the model (embeddings, attention,
                             * norms, routers, shared experts, dense MLPs, lm_head) */
    int64_t attn_act;       /* elements/token one layer's attention saves (q, k, v, output,
                             * and the inputs of q/k norms or MLA's low-rank norms) */
    int64_t moe_mlp_act;    /* elements/token an MoE layer's shared experts save (3*Fs) */
    int64_t dense_mlp_act;  /* elements/token a dense layer's MLP saves (3*Fd) */
} lrmoe_budget_model_t;

enum { LRMOE_BUDGET_CKPT_NONE = 0, LRMOE_BUDGET_CKPT_FULL = 1 };

typedef struct {
    int64_t tp, pp, dp, ep;   /* tensor, pipeline, data, expert parallel sizes (>= 1) */
    int64_t seq;              /* S tokens per sequence */
    int64_t micro_batch;      /* b sequences per micro-batch */
    int checkpoint;           /* LRMOE_BUDGET_CKPT_* (full: every layer recomputed) */
    int zero1;                /* 1: optimizer state sharded (distributed optimizer) */
    int64_t param_bytes;      /* per parameter (2: BF16) */
    int64_t grad_bytes;       /* per parameter gradient (4: FP32 main grads) */
    int64_t optim_bytes;      /* optimizer state per parameter (12: FP32 master + Adam m, v) */
    int64_t act_bytes;        /* per activation element (2: BF16) */
    int64_t gpu_mem;          /* bytes of one GPU */
    int64_t reserve;          /* bytes kept back: CUDA context, allocator, NCCL */
} lrmoe_budget_opts_t;

typedef struct {
    int64_t stage_layers, stage_moe_layers; /* layers on the busiest pipeline stage */
    int64_t inflight;         /* micro-batches whose activations are alive (pp, 1F1B) */
    int64_t edp;              /* expert data-parallel size dp*tp/ep */
    int64_t params_dense;     /* non-expert parameters on one GPU */
    int64_t params_expert;    /* routed-expert parameters on one GPU */
    int64_t weights, grads, optim, static_bytes;
    int64_t act_layer_moe, act_layer_dense; /* bytes one layer saves per micro-batch (non-expert part) */
    int64_t act_stored;       /* activations kept between forward and backward */
    int64_t act_working;      /* one layer's saved tensors while it is recomputed (full ckpt) */
    int64_t logits;           /* S*b*V*4/tp */
    int64_t activations;      /* act_stored + act_working + logits */
    int64_t reserve;
    int64_t free_bytes;       /* gpu_mem - reserve - static - activations (may be < 0) */
    int64_t alive;            /* MoE layers whose saved expert state is alive at once */
    int64_t hbm;              /* the per-layer budget: free / alive (0 when it does not fit) */
    int64_t resident;         /* gpu_mem - hbm: lrmoe-plan --gpu-mem G --resident this */
    int fits;                 /* 0: free < 0 (short by -free_bytes) */
} lrmoe_budget_t;

/* Defaults: tp=pp=dp=ep=1, seq 4096, micro_batch 1, full checkpointing, no
 * zero1, BF16 params and activations, FP32 grads, 12 optimizer bytes,
 * gpu_mem 0 (must be set), reserve 0. */
void lrmoe_budget_opts_default(lrmoe_budget_opts_t *o);

/* The model from a Hugging Face config.json text / file (model_type
 * qwen3_moe, qwen2_moe, mixtral, deepseek_v2, deepseek_v3); a missing or
 * mistyped field is an error naming it. 0, or -1 with error. */
int lrmoe_budget_model_json(const char *json, lrmoe_budget_model_t *m);
int lrmoe_budget_model_file(const char *path, lrmoe_budget_model_t *m);
/* A preset by name (those of lrmoe-gen --list-presets that have a full
 * config here); its config.json text through *json if not NULL. */
int lrmoe_budget_model_preset(const char *name, lrmoe_budget_model_t *m, const char **json);

/* The breakdown. Errors: a size < 1, ep not dividing E or dp*tp, pp not
 * dividing L, a model without MoE layers, overflow. A budget that does not
 * fit is not an error: out->fits = 0, out->free_bytes < 0, out->hbm = 0. */
int lrmoe_budget_compute(const lrmoe_budget_model_t *m, const lrmoe_budget_opts_t *o,
                         lrmoe_budget_t *out);

#endif
