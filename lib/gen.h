/* gen: synthetic MoE workloads that stand in for dumps.
 *
 * One call fills one frame for (layer, step): `hidden` (T,D), `router_logits`
 * (T,E) and `grad_output` (T,D), with attributes layer, step, model, seed,
 * topk and gen.*; another fills the weights frame of a layer. Every row of
 * every tensor comes from its own RNG stream keyed by (seed, tensor, layer,
 * step, row), so frames are reproducible byte for byte, independent of each
 * other and of the number of threads.
 *
 * Routing skew is realised through the logits so that a softmax top-K router
 * picks the intended experts (the model is in lrmoe-gen(1)):
 *   balanced   logits are i.i.d. Gumbel(0,1): every expert equally likely.
 *   hot P:N    exactly H = round(P% of T) tokens are hot (chosen by a seeded
 *              shuffle); each hot token sends m = min(N,K) of its K choices
 *              to hot experts, cycling through them (hot token i takes hot
 *              slots i*m .. i*m+m-1 mod N), with a margin over every other
 *              logit; its other K-m choices, and all K choices of a cold
 *              token, avoid the hot experts. Each hot expert therefore
 *              receives floor or ceil of H*m/N tokens, exactly, and the hot
 *              experts hold H*m/(T*K) of all pairs (P% when N >= K).
 *   zipf S     logit_e = log p_e + Gumbel, p at popularity rank r is
 *              proportional to 1/(r+1)^S: the top-1 choice follows p exactly
 *              (Gumbel-max) and the top-K set is Plackett-Luce sampling
 *              without replacement from p.
 * Popularity ranks map to experts through a seeded permutation; drift R moves
 * the map by floor(R*(layer+step)) positions.
 */
#ifndef LRMOE_GEN_H
#define LRMOE_GEN_H

#include <stdint.h>
#include <stddef.h>

#include "lrmoe.h"

typedef struct {
    const char *name;
    int64_t E, K, D, F;
    const char *note;
} lrmoe_gen_preset_t;

/* The presets table (n entries) and lookup by name (NULL, error set, if none). */
const lrmoe_gen_preset_t *lrmoe_gen_presets(int *n);
const lrmoe_gen_preset_t *lrmoe_gen_preset_find(const char *name);

typedef enum {
    LRMOE_SKEW_BALANCED = 0,
    LRMOE_SKEW_HOT,
    LRMOE_SKEW_ZIPF
} lrmoe_skew_t;

#define LRMOE_GEN_MAX_HOT 4096

/* What lrmoe_gen_frame writes:
 *   FULL    hidden, router_logits, grad_output (the default)
 *   LOGITS  router_logits only (the same bytes as FULL's), attribute hidden=D
 *   LOADS   expert_load (E) I64 only: the logits a block of rows at a time,
 *           routed by lrmoe_route_topk's default softmax router with K picks
 *           (what lrmoe-route --loads-only counts from LOGITS' frame);
 *           attributes hidden=D, route.router, route.topk.
 * LOGITS costs time and memory O(T*E), LOADS time O(T*E) and memory O(E). */
typedef enum {
    LRMOE_GEN_FULL = 0,
    LRMOE_GEN_LOGITS,
    LRMOE_GEN_LOADS
} lrmoe_gen_routing_t;

typedef struct {
    char model[64];          /* attribute "model": preset name or "custom" */
    int64_t T, E, K, D, F;   /* tokens, experts, top-k, hidden, ffn */
    lrmoe_dtype_t dtype;     /* hidden, grad_output, w_* (default BF16) */
    lrmoe_dtype_t logits_dtype; /* router_logits (default F32) */
    uint64_t seed;
    lrmoe_skew_t skew;
    double hot_pct;          /* percent of tokens on the hot experts */
    int64_t hot_n;           /* number of hot experts */
    int64_t nhot_list;       /* > 0: explicit hot experts (ranks 0..n-1) */
    int64_t hot_list[LRMOE_GEN_MAX_HOT];
    double zipf_s;           /* Zipf exponent */
    double drift;            /* rank shift per layer and per step */
    double margin;           /* hot logit margin over the others (default 1) */
    double grad_scale;       /* grad_output element scale (default 1) */
    double grad_sigma;       /* log-normal sigma of per-token grad scale (default 1) */
    double hidden_scale;     /* hidden element std (default 1) */
    double weight_scale;     /* multiplies the weight init std (default 1) */
    int router_init;         /* weights: 0 router_weight zeros, 1 N(0,1/sqrt(D)) */
    int threads;             /* generator threads (<=1: one) */
    int routing;             /* lrmoe_gen_routing_t: which tensors a frame holds */
} lrmoe_gen_opts_t;

void lrmoe_gen_opts_default(lrmoe_gen_opts_t *o);
/* Copy a preset's E, K, D, F and name into o. */
int lrmoe_gen_apply_preset(lrmoe_gen_opts_t *o, const char *name);
/* Parse "balanced", "hot:PCT:N", "zipf:S" (and "PCT:N" for parse_hot). */
int lrmoe_gen_parse_skew(lrmoe_gen_opts_t *o, const char *spec);
int lrmoe_gen_parse_hot(lrmoe_gen_opts_t *o, const char *spec);
/* Parse a comma-separated list of hot expert ids (sets hot_n if not set). */
int lrmoe_gen_parse_hot_list(lrmoe_gen_opts_t *o, const char *spec);
/* Validate the whole option set (shapes, skew against E and K). */
int lrmoe_gen_check(const lrmoe_gen_opts_t *o);
/* The skew as text: "balanced", "hot:95:1", "zipf:1.2" (buf NUL-terminated). */
const char *lrmoe_gen_skew_str(const lrmoe_gen_opts_t *o, char *buf, size_t len);

/* order (E): order[r] = expert at popularity rank r for (layer, step), after
 * drift. Hot experts are order[0..hot_n). */
int lrmoe_gen_expert_order(const lrmoe_gen_opts_t *o, int64_t layer, int64_t step,
                           int64_t *order);

/* Fill f (cleared first) with the frame for (layer, step). */
int lrmoe_gen_frame(const lrmoe_gen_opts_t *o, int64_t layer, int64_t step,
                    lrmoe_frame_t *f);
/* Fill f (cleared first) with the weights of a layer: w_gate, w_up (E,F,D),
 * w_down (E,D,F) in o->dtype, router_weight (E,D) and expert_bias (E) in F32. */
int lrmoe_gen_weights(const lrmoe_gen_opts_t *o, int64_t layer, lrmoe_frame_t *f);

#endif
