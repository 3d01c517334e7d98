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

#include <stdint.h>
#include "lrmoe.h"

typedef enum {
    LRMOE_METRIC_LRM = 0,
    LRMOE_METRIC_GRADNORM,
    LRMOE_METRIC_ABSGRAD,
    LRMOE_METRIC_RANDOM,
    LRMOE_NMETRICS
} lrmoe_metric_t;

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

/* ------------------------------------------------------------ frames */

typedef struct {
    lrmoe_metric_t metric;
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
 * and pair_rank if present) and writes score.keep=by-rank. */
int lrmoe_score_frame(lrmoe_frame_t *f, int64_t index,
                      const lrmoe_score_opts_t *o, lrmoe_score_stats_t *st);

#endif
