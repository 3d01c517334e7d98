/* lrmoe_score_sample (selection "sample"): exact quotas, inclusion
 * probabilities and the unbiasedness of the weighted sum, by simulation.
 *
 * Setup: T tokens, K choices, E experts; pair u carries a vector v_u in R^V
 * (standing for its rank-one dW contribution delta_u phi_u^T) and the score
 * R_u = ||v_u||^2 (the LRM score is exactly that norm squared). Scores span
 * six orders of magnitude, some are 0, one expert has fewer positive scores
 * than its quota (the zero-score share), one keeps all, one none.
 *
 * Over NDRAW seeds it checks:
 *  1. every draw keeps exactly quota_e pairs of each expert;
 *  2. each pair's inclusion frequency is within 5 standard errors of p_u
 *     (prob) and p_u sums to quota_e;
 *  3. the mean of the weighted kept sum sum_kept w_u v_u equals the full
 *     sum per expert and coordinate within 5 standard errors of the mean
 *     (the empirical variance of that coordinate over the draws);
 *  4. the test has power: the same draws without the weights (w = 1) and
 *     the top-K keep are off by more than 20 standard errors in some
 *     coordinate, so a sampler that forgot 1/p or a biased rule cannot pass
 *     check 3 by luck.
 * With NDRAW = 20000 and about 300 pair/coordinate checks at 5 sigma, a
 * correct sampler fails one with probability ~300 * 5.7e-7 < 2e-4 (normal
 * approximation); the seeds are fixed, so the outcome is deterministic.
 * Also: all p = 1 (quota = load) keeps everything with weight 1, and the
 * draw does not depend on the order experts are processed (by-rank with one
 * rank equals the plain draw). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "score.h"

#define T 96
#define K 3
#define E 6
#define V 4
#define N (T * K)
#define NDRAW 20000

static uint64_t st = 88172645463325252ull;
static double rnd(void) /* xorshift64* in [0,1) */
{
    st ^= st >> 12; st ^= st << 25; st ^= st >> 27;
    return (double)((st * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
}

static int fails;
#define CHECK(c, ...) do { if (!(c)) { fails++; if (fails < 20) { fprintf(stderr, "FAIL: "); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } } while (0)

/* max over experts and coordinates of |mean - full| / se for weights wmode
 * (0: 1/p, 1: no weight); keep sequence from seeds 0..NDRAW-1 */
static double run(const int32_t *ids, const float *score, const int64_t *quota,
                  const double (*v)[V], int wmode, double *freq, const float *prob, int exact)
{
    static double sum[E][V], sq[E][V];
    double full[E][V] = {{0}};
    memset(sum, 0, sizeof sum);
    memset(sq, 0, sizeof sq);
    /* the sum an unbiased draw estimates: the pairs it can pick (p > 0; an
     * expert with quota 0 estimates 0) */
    for (int u = 0; u < N; u++)
        for (int j = 0; j < V; j++) full[ids[u]][j] += prob[u] > 0 ? v[u][j] : 0;
    uint8_t keep[N];
    float w[N];
    int64_t load[E], qo[E];
    if (freq) memset(freq, 0, N * sizeof *freq);
    for (int s = 0; s < NDRAW; s++) {
        if (lrmoe_score_sample(T, K, E, ids, score, quota, -1, (uint64_t)s, keep, w, NULL,
                               load, qo) < 0) {
            fprintf(stderr, "sample: %s\n", lrmoe_errmsg());
            exit(1);
        }
        int64_t got[E] = {0};
        double est[E][V] = {{0}};
        for (int u = 0; u < N; u++) {
            if (!keep[u]) continue;
            got[ids[u]]++;
            if (freq) freq[u] += 1.0 / NDRAW;
            double ww = wmode == 0 ? w[u] : 1.0;
            for (int j = 0; j < V; j++) est[ids[u]][j] += ww * v[u][j];
        }
        if (exact)
            for (int e = 0; e < E; e++)
                CHECK(got[e] == quota[e], "seed %d expert %d kept %lld, quota %lld", s, e,
                      (long long)got[e], (long long)quota[e]);
        for (int e = 0; e < E; e++)
            for (int j = 0; j < V; j++) {
                sum[e][j] += est[e][j];
                sq[e][j] += est[e][j] * est[e][j];
            }
    }
    double worst = 0;
    for (int e = 0; e < E; e++)
        for (int j = 0; j < V; j++) {
            double m = sum[e][j] / NDRAW, var = sq[e][j] / NDRAW - m * m;
            /* + a rounding floor: a deterministic estimate (every pair of e at
             * p = 1 or 0) has no spread, and F32 weights round */
            double se = sqrt(var > 0 ? var / NDRAW : 0) + 1e-6 * (fabs(full[e][j]) + 1e-12);
            double z = fabs(m - full[e][j]) / se;
            if (z > worst) worst = z;
        }
    return worst;
}

int main(void)
{
    int32_t ids[N];
    float score[N];
    double v[N][V];
    int64_t n[E] = {0}, quota[E];
    for (int u = 0; u < N; u++) {
        /* expert 5 takes few pairs; the rest spread unevenly */
        int e = (int)(rnd() * (E - 1));
        if (rnd() < 0.05) e = 5;
        ids[u] = e;
        n[e]++;
        double mag = pow(10.0, -3.0 + 3.0 * rnd()); /* norms over 1e-3..1 */
        if (e == 4 && rnd() < 0.7) mag = 0; /* expert 4: mostly zero scores */
        double s2 = 0;
        for (int j = 0; j < V; j++) {
            v[u][j] = mag * (rnd() - 0.3);
            s2 += v[u][j] * v[u][j];
        }
        score[u] = (float)s2;
        for (int j = 0; j < V; j++) /* the vector whose squared norm is the F32 score */
            v[u][j] *= s2 > 0 ? sqrt((double)score[u] / s2) : 0;
    }
    for (int e = 0; e < E; e++) quota[e] = (int64_t)floor(0.6 * (double)n[e]);
    quota[2] = n[2]; /* keeps all */
    quota[3] = 0;    /* keeps none */
    int64_t npos4 = 0;
    for (int u = 0; u < N; u++) npos4 += ids[u] == 4 && score[u] > 0;
    if (npos4 >= quota[4]) quota[4] = npos4 + (n[4] - npos4) / 2; /* zero-score share */

    static double freq[N];
    static float prob[N];
    {
        uint8_t keep[N];
        int64_t load[E];
        if (lrmoe_score_sample(T, K, E, ids, score, quota, -1, 0, keep, NULL, prob, load,
                               NULL) < 0)
            return 1;
    }
    double z = run(ids, score, quota, (const double (*)[V])v, 0, freq, prob, 1);
    printf("weighted sample: worst |mean - full| = %.2f standard errors\n", z);
    CHECK(z < 5, "the weighted sample is biased: %.2f standard errors", z);
    double psum[E] = {0};
    for (int u = 0; u < N; u++) {
        double p = prob[u], se = sqrt(p * (1 - p) / NDRAW);
        psum[ids[u]] += p;
        CHECK(fabs(freq[u] - p) <= 5 * se + 1e-12, "pair %d: frequency %.5f, p %.5f", u,
              freq[u], p);
    }
    for (int e = 0; e < E; e++)
        CHECK(fabs(psum[e] - (double)quota[e]) < 1e-3, "expert %d: sum p = %.6f, quota %lld", e,
              psum[e], (long long)quota[e]);
    double z1 = run(ids, score, quota, (const double (*)[V])v, 1, NULL, prob, 0);
    printf("unweighted sample: worst = %.1f standard errors\n", z1);
    CHECK(z1 > 20, "the check has no power against a missing 1/p (%.1f)", z1);
    /* top-K: deterministic, so its bias against the sample's spread */
    {
        uint8_t keep[N];
        int64_t load[E];
        if (lrmoe_score_select(T, K, E, ids, score, quota, -1, keep, load, NULL) < 0) return 1;
        double full[E][V] = {{0}}, est[E][V] = {{0}}, worst = 0;
        for (int u = 0; u < N; u++)
            for (int j = 0; j < V; j++) {
                full[ids[u]][j] += v[u][j];
                if (keep[u]) est[ids[u]][j] += v[u][j];
            }
        /* the standard error the weighted sample's check allows (from its spread) */
        for (int e = 0; e < E; e++)
            for (int j = 0; j < V; j++) {
                double d = fabs(est[e][j] - full[e][j]);
                double se = 0;
                for (int u = 0; u < N; u++) /* a bound: every pair's contribution / sqrt(NDRAW) */
                    if (ids[u] == e) se += fabs(v[u][j]);
                se /= sqrt((double)NDRAW);
                if (se > 0 && d / se > worst) worst = d / se;
            }
        printf("top-K: worst bias = %.1f (conservative) standard errors\n", worst);
        CHECK(worst > 20, "top-K is not detected as biased (%.1f)", worst);
    }
    /* every p = 1: all kept, weight 1 */
    {
        uint8_t keep[N];
        float w[N];
        int64_t load[E], full[E] = {0};
        for (int u = 0; u < N; u++) full[ids[u]]++;
        if (lrmoe_score_sample(T, K, E, ids, score, full, -1, 7, keep, w, NULL, load, NULL) < 0)
            return 1;
        for (int u = 0; u < N; u++)
            CHECK(keep[u] == 1 && w[u] == 1.0f, "quota = load: pair %d keep %d weight %g", u,
                  keep[u], (double)w[u]);
    }
    /* by-rank with one rank = the plain draw (the same buckets and offsets) */
    {
        uint8_t k1[N], k2[N];
        float w1[N], w2[N];
        int64_t load[E];
        if (lrmoe_score_sample(T, K, E, ids, score, quota, -1, 11, k1, w1, NULL, load, NULL) < 0 ||
            lrmoe_score_sample_by_rank(T, K, E, 1, ids, score, NULL, quota, 11, k2, w2, NULL,
                                       load, NULL) < 0)
            return 1;
        CHECK(!memcmp(k1, k2, sizeof k1) && !memcmp(w1, w2, sizeof w1),
              "by-rank with one rank differs from the plain draw");
    }
    /* bad input */
    {
        uint8_t keep[N];
        int64_t load[E], q[E];
        memcpy(q, quota, sizeof q);
        q[0] = n[0] + 1;
        CHECK(lrmoe_score_sample(T, K, E, ids, score, q, -1, 0, keep, NULL, NULL, load, NULL) < 0,
              "a quota above the load is accepted");
        float bad[N];
        memcpy(bad, score, sizeof bad);
        bad[5] = NAN;
        CHECK(lrmoe_score_sample(T, K, E, ids, bad, quota, -1, 0, keep, NULL, NULL, load, NULL) < 0,
              "a NaN score is accepted");
    }
    if (fails) {
        fprintf(stderr, "%d failures\n", fails);
        return 1;
    }
    printf("ok\n");
    return 0;
}
