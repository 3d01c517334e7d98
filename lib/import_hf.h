/* Hugging Face shapes and names -> the stream's (lrmoe-import --map).
 *
 * Activations, in place: hidden, grad_output, router_logits [B,S,X] become
 * [B*S,X] (attribute batch_shape "[B,S]"), topk_ids and topk_weights
 * [B,S,K] become [B*S,K]; integer topk_ids of any width become I32, each
 * id checked to fit I32 and lie in [0,E) (E from router_logits [T,E] or
 * expert_load [E] when the frame has one); floating topk_weights (BF16,
 * F16, F64) become F32. With LRMOE_HF_ON the HF names hidden_states,
 * top_k_index / selected_experts and top_k_weights / routing_weights are
 * renamed to hidden, topk_ids and topk_weights first.
 *
 * Expert weights: a frame holding the routed experts of transformers MoE
 * blocks becomes one weights frame per block (attributes layer from
 * "layers.N.", hf.prefix, hf.layout), with w_gate, w_up [E,F,D], w_down
 * [E,D,F] (BF16 and F32 kept, F16 and F64 as F32, integers refused) and,
 * when present, a floating router_weight [E,D] (PREFIX.gate.weight) and
 * expert_bias [E] F32 (PREFIX.gate.e_score_correction_bias). Layouts:
 *   fused      PREFIX.experts.gate_up_proj [E,2F,D] (gate rows first) and
 *              PREFIX.experts.down_proj [E,D,F]: transformers 5 modules
 *              (Qwen2/3-MoE, OLMoE, DeepSeek-V3, GLM4-MoE, Mixtral);
 *              also bare gate_up_proj / down_proj (an experts module's
 *              state_dict)
 *   per-expert PREFIX.experts.N.{gate,up,down}_proj.weight [F,D],[F,D],[D,F]
 *              (checkpoints on the Hub, save_pretrained)
 *   mixtral    PREFIX.experts.N.{w1,w3,w2}.weight (gate, up, down)
 * The frame's other tensors (attention, norms, embeddings, shared experts,
 * dense MLPs) are left out; the first frame counts them in hf.left_out.
 * Experts with biases (gpt-oss) are refused: no SwiGLU layout holds them.
 * Linear in the frame's tensors: groups and routers are found by hash, and
 * per-expert matrices are listed, never indexed by the index they claim.
 *
 * Nothing here prints or exits: -1 with lrmoe_err set. */
#ifndef LRMOE_IMPORT_HF_H
#define LRMOE_IMPORT_HF_H

#include <stdint.h>
#include "lrmoe.h"

typedef enum {
    LRMOE_HF_AUTO = 0, /* shapes, dtypes and expert weights when recognised */
    LRMOE_HF_ON,       /* also the HF activation names */
    LRMOE_HF_OFF       /* import as is */
} lrmoe_hf_map_t;

/* "auto", "hf" or "none". */
int lrmoe_hf_map_parse(const char *s, lrmoe_hf_map_t *m);

/* Activations of f in place (see above). */
int lrmoe_hf_activations(lrmoe_frame_t *f, lrmoe_hf_map_t m);

/* 1 if f holds HF routed-expert weights, 0 if not, -1 on a malformed name
 * set (e.g. gate_up_proj without down_proj, expert biases). */
int lrmoe_hf_has_weights(const lrmoe_frame_t *f);

/* Turn f (finished by lrmoe-import's options) into stream frames and hand
 * each to fn with index (*index)++: the weights frames when f holds HF
 * expert weights, else f itself after lrmoe_hf_activations. f may be
 * modified. LRMOE_HF_OFF passes f on untouched. */
int lrmoe_hf_import(lrmoe_frame_t *f, lrmoe_hf_map_t m, lrmoe_frame_fn fn, void *ctx,
                    int64_t *index);

#endif
