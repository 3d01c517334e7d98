/* route: top-K expert routing and load statistics.
 *
 * Pure functions over arrays: no frames, no printing, no exits. A failing call
 * returns <0 and leaves a message in lrmoe_errmsg().
 *
 * Routers (T tokens, E experts, K picks per token):
 *   SOFTMAX      p = softmax(x) over all E experts, pick the K largest,
 *                weights p_k (renorm: p_k / sum of the K picked).      Qwen3
 *   TOPK_SOFTMAX pick the K largest logits, weights = softmax over those
 *                K logits only.                                        gpt-oss
 *   SIGMOID      s = sigmoid(x); pick by s + expert_bias (bias used for the
 *                choice only), optionally only inside the M best of G equal
 *                contiguous expert groups (group score = sum of the two best
 *                s + bias in the group); weights s_k (renorm: s_k / (sum +
 *                1e-20)).                          DeepSeek-V3, GLM-4.5, Kimi-K2
 * Every router then multiplies the weights by the routed scaling factor.
 *
 * Selection order and ties: the K picks of a token are written in decreasing
 * selection score; equal scores go to the lower expert index (the same for
 * groups). Softmax routers select on the F32 logit itself (softmax is
 * monotone); the sigmoid router computes s + bias in double precision.
 * Logits in any float dtype are widened to F32 first. A NaN logit is an error;
 * so is a token whose logits are all -inf under a softmax router. +inf logits
 * take the softmax limit: the +inf experts share the mass equally.
 */
#ifndef LRMOE_ROUTE_H
#define LRMOE_ROUTE_H

/* Only what the installed headers declare is exported (the library is
 * built with -fvisibility=hidden, lrmoe(3)). */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#include "lrmoe.h"

typedef enum {
    LRMOE_ROUTER_SOFTMAX = 0,
    LRMOE_ROUTER_TOPK_SOFTMAX,
    LRMOE_ROUTER_SIGMOID,
} lrmoe_router_t;

typedef struct {
    lrmoe_router_t router;
    int k;            /* picks per token, 1 <= k <= E */
    int renorm;       /* renormalise the K weights (SOFTMAX, SIGMOID) */
    double scale;     /* routed scaling factor, default 1 */
    int groups;       /* G: 0 or 1 = no group limit (SIGMOID only) */
    int topk_groups;  /* M: groups kept, 1 <= M <= G */
    int threads;      /* worker threads over token blocks, >= 1 */
} lrmoe_route_opts_t;

void lrmoe_route_opts_default(lrmoe_route_opts_t *o);
/* "softmax", "topk-softmax" (alias "gpt-oss"), "sigmoid": 0, else -1. */
int lrmoe_route_parse_router(const char *s, lrmoe_router_t *r);
const char *lrmoe_route_router_name(lrmoe_router_t r);
/* Options that make sense without knowing E (usage errors): 0 or -1. */
int lrmoe_route_check_opts(const lrmoe_route_opts_t *o);
/* The same against E experts: K <= E, G divides E, K <= M*E/G. */
int lrmoe_route_check(const lrmoe_route_opts_t *o, int64_t E);

/* Route T tokens.
 *   logits is (T,E) of float dtype dt (F32, BF16, F16 or F64), row-major
 *   bias   is (E) F32 or NULL; used by SIGMOID only, must be finite
 *   ids    is (T,K) int32 out, weights is (T,K) f32 out, load is (E) i64 out
 * Errors name the token: "token 17: router logit of expert 3 is NaN". */
int lrmoe_route_topk(const lrmoe_route_opts_t *o, int64_t T, int64_t E,
                     lrmoe_dtype_t dt, const void *logits, const float *bias,
                     int32_t *ids, float *weights, int64_t *load);

/* logits = hidden @ router_weight^T in F32 (OpenBLAS sgemm over row blocks).
 *   hidden is (T,D) of dtype hdt, rw is (E,D) of dtype wdt, logits is (T,E) */
int lrmoe_route_logits(int64_t T, int64_t D, int64_t E,
                       lrmoe_dtype_t hdt, const void *hidden,
                       lrmoe_dtype_t wdt, const void *rw, float *logits);

/* Per-rank load under plain expert parallelism: experts split contiguously,
 * E/P per rank. load is (E), rank_load is (P). -1 if P does not divide E. */
int lrmoe_route_rank_load(int64_t E, int64_t P, const int64_t *load,
                          int64_t *rank_load);

/* Per-expert loads (n) from a vector of any numeric dtype dt: integers as
 * they are; floats (Megatron's tokens_per_expert is F32) when every value is
 * a whole number below 2^53 in magnitude. A fractional, NaN or infinite
 * value is an error naming the first one and how to convert the vector;
 * signs are the caller's to check. 0 or -1. */
int lrmoe_route_load_i64(lrmoe_dtype_t dt, const void *data, int64_t n, int64_t *load);

/* max, mean and max/mean (0 when the mean is 0) of n counts. */
typedef struct {
    int64_t max, total;
    double mean, imbalance;
} lrmoe_load_stats_t;
void lrmoe_route_load_stats(const int64_t *x, int64_t n, lrmoe_load_stats_t *s);

/* The n most loaded entries of x (ties: lower index first) into idx; returns
 * how many were written (min(n, nx)). */
int lrmoe_route_hottest(const int64_t *x, int64_t nx, int n, int64_t *idx);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#endif
