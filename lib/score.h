/* score: backward pair scores, per-expert retention, and gradient fidelity.
 *
 * Pair index u = t*K + k (token-major); the pair's expert is topk_ids[u].
 *
 * Metrics (all non-negative):
 *   lrm       alpha_u^2 * ||g_t||^2 * ||phi_u||^2   (LRMoE eq. 3: the squared
 *             Frobenius norm of the pair's rank-one contribution to dW_down)
 *   gradnorm  ||g_t||^2
 *   absgrad   sum_d |g_t[d]|
 *   random    uniform in [0,1) from a seeded hash of (seed, u); see
 *             lrmoe_score_random()
 * Scores are computed in double and stored as f32; selection uses the stored
 * f32 values, so a reader can reproduce `keep` from `pair_score` alone.
 *
 * Selection: inside each expert the quota[e] pairs ranked highest are kept,
 * ranked by score descending, ties broken by the lower pair index u first.
 * This is a strict total order, so `keep` is unique. The selection is a
 * quickselect over 64-bit keys (order-preserving score bits, inverted pair
 * index): expected linear time per expert, no per-pair allocation (one
 * bucket array for all pairs per call).
 */
#ifndef LRMOE_SCORE_H
#define LRMOE_SCORE_H

/* Only what the installed headers declare is exported (the library is
 * built with -fvisibility=hidden, lrmoe(3)). */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#include <stdint.h>
#include "lrmoe.h"

typedef enum {
    LRMOE_METRIC_LRM = 0,
    LRMOE_METRIC_GRADNORM,
    LRMOE_METRIC_ABSGRAD,
    LRMOE_METRIC_RANDOM,
    LRMOE_METRIC_UNIFORM,   /* 1 for every pair: with sample, a uniform draw */
    LRMOE_NMETRICS
} lrmoe_metric_t;

/* Selection of each expert's quota from the scores:
 *   topk    the quota highest-ranked pairs (the LRMoE paper's rule; keep
 *           is a deterministic function of the scores). A biased estimator
 *           of the expert gradient: E[kept sum] != full sum.
 *   sample  (the default: it trains best in lrmoe-study's paired seeds)
 *           an unbiased probability-proportional draw of exactly the quota
 *           (lrmoe_score_sample): pair u is kept with probability
 *           p_u = min(1, c*sqrt(score_u)), c such that sum_u p_u = quota,
 *           and a kept pair's backward row is weighted by 1/p_u
 *           (pair_weight), so E[sum_kept w_u delta_u phi_u^T] is the full
 *           sum for every score. */
typedef enum {
    LRMOE_KEEP_TOPK = 0,
    LRMOE_KEEP_SAMPLE,
    LRMOE_NKEEP_RULES
} lrmoe_keep_rule_t;
int lrmoe_score_keep_rule_parse(const char *s, lrmoe_keep_rule_t *sel); /* 0 / -1 */
const char *lrmoe_score_keep_rule_name(lrmoe_keep_rule_t sel);

int lrmoe_score_metric_parse(const char *s, lrmoe_metric_t *m); /* 0 / -1 */
const char *lrmoe_score_metric_name(lrmoe_metric_t m);

/* The random metric's score of pair u: splitmix64 of
 * seed ^ ((u + 1) * 0xD1B54A32D192ED03), top 24 bits / 2^24. */
float lrmoe_score_random(uint64_t seed, int64_t u);

/* Scores of all T*K pairs. g is (T,D) f32; alpha and phi_sqnorm are (T,K)
 * f32 (both may be NULL unless metric is lrm; g may be NULL for random).
 * score is (T,K). Fails on a non-finite score (NaN or Inf), naming the pair. */
int lrmoe_score_pairs(lrmoe_metric_t m, int64_t T, int K, int64_t D,
                      const float *g, const float *alpha,
                      const float *phi_sqnorm, uint64_t seed, float *score);
/* The same with g of any float dtype gdt (converted one row at a time). */
int lrmoe_score_pairs_dt(lrmoe_metric_t m, int64_t T, int K, int64_t D,
                         lrmoe_dtype_t gdt, const void *g, const float *alpha,
                         const float *phi_sqnorm, uint64_t seed, float *score);

/* Retained pairs per expert for "drop C percent": q = n - floor(n*C/100). */
int64_t lrmoe_score_drop_quota(int64_t n, double C);

/* Select: keep[u] = 1 for the quota[e] highest-ranked pairs of each expert
 * (order above), else 0. load[e] (E) receives n_e. Fails when an expert id is
 * out of [0,E), quota[e] < 0 or quota[e] > n_e, or a score is NaN.
 * quota may be NULL with drop_pct >= 0: quota[e] = drop_quota(n_e, drop_pct)
 * (then quota_out (E), if not NULL, receives the quotas used). */
int lrmoe_score_select(int64_t T, int K, int E, const int32_t *topk_ids,
                       const float *score, const int64_t *quota,
                       double drop_pct, uint8_t *keep, int64_t *load,
                       int64_t *quota_out);

/* Sample (selection "sample"): per expert e with n_e pairs and quota q_e,
 * inclusion probabilities p_u = min(1, c_e sqrt(score_u)) with
 * sum_u p_u = q_e (water-filling: the pairs whose c_e sqrt(score) reaches 1
 * are kept with p = 1, c_e spreads the rest; when the positive scores cannot
 * fill q_e, every positive pair has p = 1 and the zero-score pairs share
 * the remainder evenly), then exactly q_e pairs by systematic PPS: the pairs
 * with p < 1 in ascending u lay out intervals of length p_u on [0, q'),
 * q' = q_e - #(p = 1), and the points r, r+1, ..., r+q'-1 pick them, r
 * uniform in [0,1) from (seed, e) (splitmix64). Each pair's inclusion
 * probability is exactly p_u, so weight[u] = 1/p_u (F32; 1 for p = 1 and
 * for dropped pairs) makes the weighted kept sum an unbiased estimator of
 * the full one. keep, load, quota and drop_pct as lrmoe_score_select;
 * weight (T,K) may be NULL; prob (T,K), if not NULL, receives p_u (double
 * precision rounded to F32). Deterministic for a seed; does not depend on
 * the thread count. */
int lrmoe_score_sample(int64_t T, int K, int E, const int32_t *topk_ids,
                       const float *score, const int64_t *quota, double drop_pct,
                       uint64_t seed, uint8_t *keep, float *weight, float *prob,
                       int64_t *load, int64_t *quota_out);

/* The same under plan.keep=by-rank (see lrmoe_score_select_by_rank): a
 * stratified draw. Stratum (e,p) (the pairs of e that ran on p) first gets
 * min(bwd_alloc[e,p], n_ep); what e's quota has left goes to its strata
 * with room in ascending p (a function of the plan and the counts only,
 * never of the draw), then each stratum is sampled as above with its own
 * offset (seed, e*P+p). Unbiased in the same sense. */
int lrmoe_score_sample_by_rank(int64_t T, int K, int E, int P, const int32_t *topk_ids,
                               const float *score, const int32_t *pair_rank,
                               const int64_t *bwd_alloc, uint64_t seed, uint8_t *keep,
                               float *weight, float *prob, int64_t *load,
                               int64_t *quota_out);

/* out[u] = alpha[u] * weight[u] in F32 (weight NULL: alpha): the effective
 * routing weight of a sampled pair's backward row, alpha_u g_t / p_u. The
 * compact and masked backward (lrmoe-pack, lrmoe-exec) and lrmoe.torch use
 * it; the router gradient g_t . y_u never does. */
void lrmoe_score_weighted_alpha(int64_t N, const float *alpha, const float *weight,
                                float *out);

/* Select by forward rank (the plan's attribute plan.keep=by-rank): quota_e =
 * sum_p bwd_alloc[e,p] (bwd_alloc (E,P)); inside each bucket of pairs of
 * expert e that ran on rank p (pair_rank (T,K); NULL: the native rank
 * e/(E/P), as lrmoe-pack assumes) keep the min(bwd_alloc[e,p], n_ep)
 * highest-ranked pairs, then the highest-ranked of e's remaining pairs up
 * to quota_e. So at most max(0, bwd_alloc[e,p] - n_ep) retained rows of e
 * need state moved onto p by lrmoe-pack. load (E) receives n_e and
 * quota_out (E, may be NULL) quota_e. Fails as lrmoe_score_select, and when
 * a pair_rank is outside [0,P), an entry of bwd_alloc is negative, or
 * quota_e > n_e. */
int lrmoe_score_select_by_rank(int64_t T, int K, int E, int P, const int32_t *topk_ids,
                               const float *score, const int32_t *pair_rank,
                               const int64_t *bwd_alloc, uint8_t *keep, int64_t *load,
                               int64_t *quota_out);

/* Fidelity of a keep mask for the protected projection (FC2, dW_down):
 * per expert e, err[e] = ||sum_{u of e, dropped} delta_u phi_u^T||_F /
 * ||sum_{u of e} delta_u phi_u^T||_F with delta_u = alpha_u g_t, and
 * phi_u = silu(h_g) * h_u from the saved pre-activations.
 * g (T,D) f32, alpha (T,K) f32, gate/up (T*K,F) f32, err (E) (0 where the
 * expert has no pairs or G_e = 0). *overall receives
 * sqrt(sum_e ||drop_e||^2 / sum_e ||G_e||^2). */
int lrmoe_score_fidelity(int64_t T, int K, int E, int64_t D, int64_t F,
                         const int32_t *topk_ids, const uint8_t *keep,
                         const float *g, const float *alpha,
                         const float *gate, const float *up,
                         double *err, double *overall);

/* Fidelity of a (possibly weighted) keep, split into bias and noise, for
 * the four gradients a dropped pair changes. Each is a sum over pairs of a
 * per-pair term M_u linear in the pair's gradient row delta_u = alpha_u g_t
 * (dW_down: delta_u phi_u^T; dW_gate, dW_up: dh_{g,u} x_t^T, dh_{u,u} x_t^T
 * with dphi_u = delta_u W_down, dh_g = dphi silu'(h_g) h_u, dh_u =
 * dphi silu(h_g); dx_t: sum over the token's pairs of dh_g W_gate + dh_u
 * W_up). With G = sum_u M_u (the full gradient), Gh = sum_u s_u M_u (the
 * estimate: s_u = keep_u * weight_u) and Ge = sum_u e_u M_u (its
 * expectation over the draw: e_u = E[s_u], 1 for an unbiased sample, keep_u
 * for top-K), each of the four gets
 *   rel_err    ||Gh - G|| / ||G||
 *   norm_ratio ||Gh|| / ||G||
 *   cosine     <Gh, G> / (||Gh|| ||G||)
 *   bias       ||Ge - G|| / ||G||   (0 for an unbiased rule; = rel_err for
 *                                    a deterministic one such as top-K)
 * over all experts together (Frobenius norms of the concatenated
 * matrices), in double from F32 GEMMs. */
typedef struct {
    double rel_err, norm_ratio, cosine, bias;
} lrmoe_fidelity_t;

enum { LRMOE_FID_DW_DOWN = 0, LRMOE_FID_DW_GATE, LRMOE_FID_DW_UP, LRMOE_FID_DX, LRMOE_NFID };
const char *lrmoe_fidelity_name(int i); /* "dw_down", "dw_gate", "dw_up", "dx" */

/* g (T,D), alpha (T,K), x (T,D) hidden, gate/up (T*K,F) pre-activations,
 * all F32; w_gate, w_up (E,F,D) and w_down (E,D,F) F32, or all three NULL
 * (then only dW_down is computed and out[1..3] are set to -1; x may be
 * NULL then). keep (T,K); weight (T,K) or NULL (1); expect (T,K) or NULL
 * (keep_u * weight_u: a deterministic rule). out: LRMOE_NFID entries. */
int lrmoe_score_fidelity_split(int64_t T, int K, int E, int64_t D, int64_t F,
                               const int32_t *topk_ids, const float *g, const float *alpha,
                               const float *x, const float *gate, const float *up,
                               const float *w_gate, const float *w_up, const float *w_down,
                               const uint8_t *keep, const float *weight, const float *expect,
                               lrmoe_fidelity_t *out);

/* ------------------------------------------------------------ frames */

typedef struct {
    lrmoe_metric_t metric;
    lrmoe_keep_rule_t select; /* sample (default) or topk (in the padding after
                              metric: the struct's size and offsets are 0.4's) */
    double drop_pct;      /* < 0: use the frame's quota tensor */
    uint64_t seed;        /* random metric; frame index is added */
    int fidelity;         /* also compute score_fidelity */
    int threads;          /* scoring and selection threads (<= 1: one); the
                             results do not depend on it */
} lrmoe_score_opts_t;
void lrmoe_score_opts_default(lrmoe_score_opts_t *o);

/* Per-frame results (also written as attributes score.*). */
typedef struct {
    int64_t pairs, kept;
    double retained;      /* kept / pairs */
    double dropped_share; /* dropped score / total score (0 when total 0) */
    double fidelity;      /* overall relative error; -1 if not computed */
    double seconds;       /* wall time of score + select */
} lrmoe_score_stats_t;

/* One frame: read topk_ids, topk_weights, grad_output, phi_sqnorm (lrm),
 * quota (unless drop_pct >= 0; then quota is written), saved_gate/saved_up
 * (fidelity); write pair_score, keep, score_fidelity (E) F32 (fidelity) and
 * attributes score.metric, score.kept, score.retained, score.dropped_share,
 * score.fidelity. With the attribute plan.keep=by-rank (and drop_pct < 0)
 * it selects by forward rank (lrmoe_score_select_by_rank, reading bwd_alloc
 * and pair_rank if present) and writes score.keep=by-rank. index: the
 * frame's number, added to o->seed (mod 2^64) for the random metric and
 * the sample. */
int lrmoe_score_frame(lrmoe_frame_t *f, uint64_t index,
                      const lrmoe_score_opts_t *o, lrmoe_score_stats_t *st);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#endif
