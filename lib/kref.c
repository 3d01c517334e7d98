/* CPU references of the CUDA kernels (see kref.h). Where liblrmoe has the CPU
 * code already (score, pack, swiglu, dtype) these call it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "lrmoe.h"
#include "kref.h"
#include "pack.h"
#include "score.h"
#include "swiglu.h"

int lrmoe_kref_bf16_to_f32(int64_t n, const uint16_t *src, float *dst)
{
    if (n < 0) return lrmoe_err("bf16_to_f32: negative count");
    lrmoe_convert_to_f32(LRMOE_BF16, src, dst, (size_t)n);
    return 0;
}

int lrmoe_kref_f32_to_bf16(int64_t n, const float *src, uint16_t *dst)
{
    if (n < 0) return lrmoe_err("f32_to_bf16: negative count");
    lrmoe_convert_from_f32(LRMOE_BF16, src, dst, (size_t)n);
    return 0;
}

int lrmoe_kref_pair_score(int metric, int64_t T, int K, int64_t D, const float *g,
                          const float *alpha, const float *phi_sqnorm, float *score)
{
    if (metric != LRMOE_METRIC_LRM && metric != LRMOE_METRIC_GRADNORM &&
        metric != LRMOE_METRIC_ABSGRAD)
        return lrmoe_err("pair_score: metric %s has no kernel (lrm, gradnorm, absgrad)",
                         lrmoe_score_metric_name((lrmoe_metric_t)metric));
    return lrmoe_score_pairs((lrmoe_metric_t)metric, T, K, D, g, alpha, phi_sqnorm, 0, score);
}

int lrmoe_kref_row_sqnorm(int64_t n, int64_t d, const float *x, float *out)
{
    for (int64_t i = 0; i < n; i++) {
        double s = 0;
        for (int64_t j = 0; j < d; j++) s += (double)x[i * d + j] * x[i * d + j];
        out[i] = (float)s;
    }
    return 0;
}

int lrmoe_kref_select(int64_t T, int K, int E, const int32_t *topk_ids, const float *score,
                      const int64_t *quota, uint8_t *keep, int64_t *load)
{
    if (!quota) return lrmoe_err("select: quota required");
    return lrmoe_score_select(T, K, E, topk_ids, score, quota, -1, keep, load, NULL);
}

int lrmoe_kref_sample(int64_t T, int K, int E, const int32_t *topk_ids, const float *score,
                      const int64_t *quota, uint64_t seed, uint8_t *keep, float *weight,
                      int64_t *load)
{
    if (!quota) return lrmoe_err("sample: quota required");
    return lrmoe_score_sample(T, K, E, topk_ids, score, quota, -1, seed, keep, weight, NULL,
                              load, NULL);
}

int lrmoe_kref_pack_assign(int64_t T, int K, int E, int P, const int32_t *topk_ids,
                           const uint8_t *keep, const int32_t *pair_rank,
                           const int64_t *bwd_alloc, int64_t R, int64_t *pair, int32_t *rank,
                           int64_t *counts, int64_t *offsets)
{
    lrmoe_pack_in_t in;
    memset(&in, 0, sizeof in);
    in.T = T; in.K = K; in.E = E; in.P = P;
    in.topk_ids = topk_ids; in.keep = keep; in.pair_rank = pair_rank;
    in.bwd_alloc = bwd_alloc;
    lrmoe_pack_plan_t pl;
    memset(&pl, 0, sizeof pl);
    if (lrmoe_pack_assign(&in, &pl) < 0) return -1;
    int rc = 0;
    if (pl.R != R) {
        rc = lrmoe_err("pack_assign: %lld retained pairs, caller sized %lld",
                       (long long)pl.R, (long long)R);
    } else {
        if (R) {
            memcpy(pair, pl.pair, (size_t)R * sizeof *pair);
            memcpy(rank, pl.rank, (size_t)R * sizeof *rank);
        }
        memcpy(counts, pl.counts, (size_t)P * E * sizeof *counts);
        memcpy(offsets, pl.offsets, (size_t)P * E * sizeof *offsets);
    }
    lrmoe_pack_plan_free(&pl);
    return rc;
}

int lrmoe_kref_pack_gather(const int64_t *pair, int64_t R, int K, int by_token,
                           const void *src, size_t row_bytes, void *dst)
{
    lrmoe_pack_gather(pair, R, K, by_token, src, row_bytes, dst);
    return 0;
}

int lrmoe_kref_pack_gather_scaled(const int64_t *pair, int64_t R, int K, int64_t D,
                                  const float *g, const float *alpha, float *dst)
{
    lrmoe_pack_gather_scaled(pair, R, K, D, g, alpha, dst);
    return 0;
}

int lrmoe_kref_pack_gather_scaled_bf16(const int64_t *pair, int64_t R, int K, int64_t D,
                                       const float *g, const float *alpha, uint16_t *dst)
{
    float *tmp = malloc((size_t)(R * D > 0 ? R * D : 1) * sizeof *tmp);
    if (!tmp) return lrmoe_err("out of memory");
    lrmoe_pack_gather_scaled(pair, R, K, D, g, alpha, tmp);
    lrmoe_convert_from_f32(LRMOE_BF16, tmp, dst, (size_t)(R * D));
    free(tmp);
    return 0;
}

int lrmoe_kref_pack_unpack(const int64_t *pair, int64_t R, const float *rows, int64_t D,
                           int64_t T, int K, float *out)
{
    return lrmoe_pack_unpack(pair, R, rows, D, T, K, out);
}

int lrmoe_kref_swiglu_fwd(int64_t n, int64_t F, const float *g, const float *u, float *phi,
                          float *sqnorm)
{
    lrmoe_swiglu_fwd(n, F, g, u, phi, sqnorm);
    return 0;
}

int lrmoe_kref_swiglu_bwd(int64_t n, int64_t F, const float *g, const float *u,
                          const float *dphi, float *dg, float *du, float *phi)
{
    lrmoe_swiglu_bwd(n, F, g, u, dphi, dg, du, phi);
    return 0;
}

int lrmoe_kref_swiglu_bwd_bf16(int64_t n, int64_t F, const uint16_t *g, const uint16_t *u,
                               const float *dphi, uint16_t *dg, uint16_t *du, uint16_t *phi)
{
    size_t m = (size_t)(n * F > 0 ? n * F : 1);
    float *b = malloc(5 * m * sizeof *b);
    if (!b) return lrmoe_err("out of memory");
    float *gf = b, *uf = b + m, *dgf = b + 2 * m, *duf = b + 3 * m, *pf = b + 4 * m;
    size_t k = (size_t)(n * F);
    lrmoe_convert_to_f32(LRMOE_BF16, g, gf, k);
    lrmoe_convert_to_f32(LRMOE_BF16, u, uf, k);
    lrmoe_swiglu_bwd(n, F, gf, uf, dphi, dgf, duf, phi ? pf : NULL);
    lrmoe_convert_from_f32(LRMOE_BF16, dgf, dg, k);
    lrmoe_convert_from_f32(LRMOE_BF16, duf, du, k);
    if (phi) lrmoe_convert_from_f32(LRMOE_BF16, pf, phi, k);
    free(b);
    return 0;
}

int lrmoe_kref_combine(int64_t T, int K, int64_t D, const float *alpha, const int64_t *row,
                       const float *y, float *out)
{
    for (int64_t t = 0; t < T; t++) {
        float *o = out + t * D;
        for (int64_t j = 0; j < D; j++) o[j] = 0.0f;
        for (int k = 0; k < K; k++) {
            int64_t u = t * K + k, r = row[u];
            if (r < 0) continue;
            float a = alpha[u];
            const float *yr = y + r * D;
            for (int64_t j = 0; j < D; j++) o[j] += a * yr[j];
        }
    }
    return 0;
}

int lrmoe_kref_pair_dot(int64_t T, int K, int64_t D, const float *g, const int64_t *row,
                        const float *y, float *out)
{
    for (int64_t u = 0; u < T * K; u++) {
        int64_t r = row[u];
        double s = 0;
        if (r >= 0) {
            const float *gt = g + (u / K) * D, *yr = y + r * D;
            for (int64_t j = 0; j < D; j++) s += (double)gt[j] * yr[j];
        }
        out[u] = (float)s;
    }
    return 0;
}

/* C = op(A) op(B) + beta*C with BF16 operands, products and sums in double
 * (a reference more precise than the F32 accumulation it checks). */
int lrmoe_kref_gemm(int ngemm, const lrmoe_gemm_t *gs)
{
    for (int i = 0; i < ngemm; i++) {
        const lrmoe_gemm_t *g = &gs[i];
        if (g->m < 0 || g->n < 0 || g->k < 0)
            return lrmoe_err("gemm %d: negative size", i);
        const uint16_t *A = g->a, *B = g->b;
        for (int64_t r = 0; r < g->m; r++)
            for (int64_t c = 0; c < g->n; c++) {
                double s = 0;
                for (int64_t q = 0; q < g->k; q++) {
                    uint16_t a = g->ta ? A[q * g->lda + r] : A[r * g->lda + q];
                    uint16_t b = g->tb ? B[c * g->ldb + q] : B[q * g->ldb + c];
                    s += (double)lrmoe_bf16_to_f32(a) * lrmoe_bf16_to_f32(b);
                }
                if (g->c_bf16) {
                    uint16_t *C = g->c;
                    uint16_t *p = &C[r * g->ldc + c];
                    float old = g->beta != 0.0f ? g->beta * lrmoe_bf16_to_f32(*p) : 0.0f;
                    *p = lrmoe_f32_to_bf16((float)(s + old));
                } else {
                    float *C = g->c;
                    float *p = &C[r * g->ldc + c];
                    float old = g->beta != 0.0f ? g->beta * *p : 0.0f;
                    *p = (float)(s + old);
                }
            }
    }
    return 0;
}
