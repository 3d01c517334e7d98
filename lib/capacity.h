/* capacity: the token-dropping baseline of Megatron-Core and DeepSpeed.
 *
 * Each expert takes at most C = ceil((T*K / E) * factor) of its (token,
 * expert) pairs, T tokens routed top-K over E experts (Megatron-Core
 * get_capacity(num_tokens = T*K, num_experts = E, capacity_factor), the
 * expert capacity of apply_router_token_dropping); the pairs above C are
 * dropped in forward and backward. Which pairs an expert keeps is the drop
 * policy (moe_token_drop_policy):
 *   probs     its C pairs of highest router weight (Megatron's default)
 *   position  its first C pairs in token order
 * Ties (equal weights; -0 equals +0) go to the lower pair index u = t*K + k,
 * so the selection is deterministic. lrmoe-plan(1) --planner capacity models
 * this baseline; lrmoe(3) describes the calls.
 *
 * The library never prints; errors return <0 with lrmoe_errmsg() set.
 */
#ifndef LRMOE_CAPACITY_H
#define LRMOE_CAPACITY_H

/* Only what the installed headers declare is exported (the library is
 * built with -fvisibility=hidden, lrmoe(3)). */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#include <stdint.h>

typedef enum {
    LRMOE_CAPACITY_PROBS = 0,  /* keep each expert's highest-weight pairs */
    LRMOE_CAPACITY_POSITION    /* keep each expert's first pairs in token order */
} lrmoe_capacity_policy_t;

/* "probs" / "position" -> 0; -1 with error otherwise. */
int lrmoe_capacity_policy_parse(const char *s, lrmoe_capacity_policy_t *out);
const char *lrmoe_capacity_policy_name(lrmoe_capacity_policy_t p);

/* The per-expert capacity ceil((T*K / E) * factor), computed in double as
 * Megatron-Core's math.ceil((num_tokens / num_experts) * capacity_factor)
 * with num_tokens = T*K. T >= 0, K >= 1, E >= 1, factor finite and > 0;
 * -1 with error otherwise (or when the capacity does not fit in int64). */
int64_t lrmoe_capacity(int64_t T, int K, int E, double factor);
/* The same from the pair count N = T*K (a frame's sum of expert_load). */
int64_t lrmoe_capacity_pairs(int64_t N, int E, double factor);

/* Which pairs survive capacity C under policy: topk_ids (T,K) I32 in
 * [0,E), topk_weights (T,K) F32 (needed by probs, may be NULL for
 * position; NaN refused either way) -> keep (T,K) U8 (1 kept, 0 dropped)
 * and kept (E) I64 (may be NULL): min(n_e, C) for each expert e. An
 * expert that appears twice in one token's row counts twice. O(T*K) for
 * position and for experts within capacity, O(n log n) over the pairs of
 * experts above it (probs). 0, or -1 with error (bad sizes, an id out of
 * range, a NaN weight, C < 0, out of memory); keep is then unspecified. */
int lrmoe_capacity_keep(int64_t T, int K, int E, const int32_t *topk_ids,
                        const float *topk_weights, int64_t capacity,
                        lrmoe_capacity_policy_t policy, uint8_t *keep, int64_t *kept);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#endif
