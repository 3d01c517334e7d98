/* Who writes each tensor of a stream: the one table behind every "missing
 * tensor" error (lrmoe_frame_need), kept equal to lrmoe-stream(5)'s TENSORS
 * table by tests/stream.bats. */
#include <string.h>
#include "lrmoe.h"

static const struct {
    const char *tensor, *producer;
} producers[] = {
    {"hidden", "the input (lrmoe-gen, lrmoe-import or a dump from training)"},
    {"router_logits", "the input (lrmoe-gen, lrmoe-import or a dump from training)"},
    {"grad_output", "the input (lrmoe-gen, lrmoe-import or a dump from training)"},
    {"w_gate", "the weights stream (lrmoe-gen --weights, lrmoe-import)"},
    {"w_up", "the weights stream (lrmoe-gen --weights, lrmoe-import)"},
    {"w_down", "the weights stream (lrmoe-gen --weights, lrmoe-import)"},
    {"router_weight", "the weights stream (lrmoe-gen --weights, lrmoe-import)"},
    {"expert_bias", "the weights stream (lrmoe-gen --weights, lrmoe-import)"},
    {"topk_ids", "lrmoe-route"},
    {"topk_weights", "lrmoe-route"},
    {"expert_load", "lrmoe-route"},
    {"rank_load", "lrmoe-route --ep"},
    {"placement", "lrmoe-plan"},
    {"fwd_alloc", "lrmoe-plan"},
    {"quota", "lrmoe-plan"},
    {"bwd_alloc", "lrmoe-plan"},
    {"output", "lrmoe-exec --phase forward"},
    {"pair_rank", "lrmoe-exec --phase forward"},
    {"phi_sqnorm", "lrmoe-exec --phase forward"},
    {"saved_gate", "lrmoe-exec --phase forward"},
    {"saved_up", "lrmoe-exec --phase forward"},
    {"pair_out", "lrmoe-exec --phase forward"},
    {"pair_score", "lrmoe-score"},
    {"keep", "lrmoe-score"},
    {"pair_weight", "lrmoe-score --select sample"},
    {"score_fidelity", "lrmoe-score --fidelity"},
    {"pack_pair", "lrmoe-pack"},
    {"pack_rank", "lrmoe-pack"},
    {"pack_counts", "lrmoe-pack"},
    {"pack_offsets", "lrmoe-pack"},
    {"pack_grad", "lrmoe-pack"},
    {"pack_hidden", "lrmoe-pack"},
    {"pack_gate", "lrmoe-pack"},
    {"pack_up", "lrmoe-pack"},
    {"grad_hidden", "lrmoe-exec --phase backward"},
    {"grad_w_gate", "lrmoe-exec --phase backward"},
    {"grad_w_up", "lrmoe-exec --phase backward"},
    {"grad_w_down", "lrmoe-exec --phase backward"},
    {"grad_topk_weights", "lrmoe-exec --phase backward"},
    {"unpacked", "lrmoe-pack --unpack"},
};

const char *lrmoe_producer(const char *tensor)
{
    for (size_t i = 0; i < sizeof producers / sizeof *producers; i++)
        if (!strcmp(producers[i].tensor, tensor)) return producers[i].producer;
    return NULL;
}

const char *lrmoe_producer_at(int i, const char **tensor)
{
    if (i < 0 || (size_t)i >= sizeof producers / sizeof *producers) return NULL;
    if (tensor) *tensor = producers[i].tensor;
    return producers[i].producer;
}
