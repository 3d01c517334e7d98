/* kref: CPU references of the CUDA kernels in kernels/.
 *
 * Every CUDA launcher lrmoe_kcu_NAME (kernels/kcu.h, device pointers) has a
 * CPU twin lrmoe_kref_NAME here (host pointers) with exactly the same
 * parameter list: both are declared from the one list LRMOE_KERNELS below, so
 * the signatures cannot drift apart. tests/gpu/test-kernels.cu runs both on
 * the same inputs and compares them with a tolerance stated per kernel.
 *
 * Where liblrmoe already has the CPU function (score.c, pack.c, swiglu.c,
 * dtype.c) the reference calls it, so the GPU is tested against the very code
 * the CPU tools run. All return 0, or -1 with lrmoe_err set; nothing prints.
 *
 * Pair index u = t*K + k (token-major); packed rows are destination-major,
 * expert-major, u ascending inside a segment (lib/pack.h).
 */
#ifndef LRMOE_KREF_H
#define LRMOE_KREF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One GEMM of a group, row-major: C (m,n) = op(A) (m,k) * op(B) (k,n) + beta*C.
 * ta = 0: A is stored (m,k) with row stride lda; ta = 1: A is stored (k,m).
 * tb = 0: B is stored (k,n) with row stride ldb; tb = 1: B is stored (n,k).
 * A and B are BF16 (uint16_t bits); C is F32 (c_bf16 = 0) or BF16 (c_bf16 = 1).
 * Accumulation is F32. beta is 0 (overwrite) or 1 (accumulate). m, n or k may
 * be 0 (k = 0 gives C = beta*C). */
typedef struct {
    int64_t m, n, k;
    int ta, tb;
    const void *a, *b;
    void *c;
    int64_t lda, ldb, ldc;
    int c_bf16;
    float beta;
} lrmoe_gemm_t;

/* The kernel list: X(name, (parameters)). Shapes:
 *
 * bf16_to_f32 / f32_to_bf16: n elements; exact, round to nearest even, NaN
 *   stays NaN (lrmoe_bf16_to_f32 / lrmoe_f32_to_bf16).
 * pair_score: the pair scores (T,K) of lrmoe_score_pairs for metric (an
 *   lrmoe_metric_t of score.h): LRMOE_METRIC_LRM alpha^2 * ||g_t||^2 *
 *   phi_sqnorm, LRMOE_METRIC_GRADNORM ||g_t||^2, LRMOE_METRIC_ABSGRAD
 *   sum_d |g_t[d]|; g (T,D) f32, alpha and phi_sqnorm (T,K) f32 (read by lrm
 *   only: NULL for the others). The sum in double, the score rounded to f32
 *   (-0 stored as +0). Fails on a non-finite score or another metric.
 * row_sqnorm: x (n,d) f32 -> out (n) = ||x_i||^2 accumulated in double.
 * select: per expert the quota[e] highest scores (ties: lower u first) ->
 *   keep (T,K) u8 and load (E) = n_e (lrmoe_score_select with a quota).
 * sample: per expert exactly quota[e] pairs drawn with p_u = min(1, c_e
 *   sqrt(score_u)) by systematic sampling, seeded -> keep (T,K) u8, weight
 *   (T,K) f32 = 1/p of a kept pair (else 1) and load (E) = n_e
 *   (lrmoe_score_sample with a quota, bit for bit).
 * pack_assign: retained pairs -> destination rank and packed position
 *   (lrmoe_pack_assign: stay on pair_rank while bwd_alloc allows, the rest in
 *   ascending rank order). pair_rank NULL: the native rank
 *   (lrmoe_exec_native); bwd_alloc NULL: every pair stays. R must equal the
 *   number of retained pairs.
 *   Outputs pair (R) i64, rank (R) i32, counts (P,E), offsets (P,E).
 * pack_gather: dst row i = src row (by_token ? pair[i]/K : pair[i]), a byte copy.
 * pack_gather_scaled: dst (R,D) f32 row i = alpha[u] * g[u/K], u = pair[i].
 * pack_gather_scaled_bf16: the same rows rounded to BF16 (one pass, for the
 *   GEMM operand).
 * pack_unpack: out (T,D) f32 = 0, out[u/K] += rows[i], summed per token in
 *   ascending k (deterministic, bit-exact against the CPU).
 * swiglu_fwd: phi = silu(g)*u for (n,F); sqnorm (n) or NULL (lib/swiglu.h).
 * swiglu_bwd: dg, du from dphi and saved g, u; phi recomputed unless NULL.
 * swiglu_bwd_bf16: swiglu_bwd on BF16 saved g, u (n,F) with BF16 dg, du and
 *   phi (phi may be NULL): the backward's operands in one pass.
 * combine: out (T,D) f32 = sum_k alpha[u] * y[row[u]] in ascending k, rows
 *   with row[u] < 0 skipped; y is (rows, D) f32.
 * pair_dot: out (T,K) = g_t . y[row[u]] accumulated in double (0 where
 *   row[u] < 0); g (T,D) f32, y (rows, D) f32.
 * gemm: the ngemm GEMMs of g[] (see lrmoe_gemm_t). */
#define LRMOE_KERNELS(X) \
    X(bf16_to_f32, (int64_t n, const uint16_t *src, float *dst)) \
    X(f32_to_bf16, (int64_t n, const float *src, uint16_t *dst)) \
    X(pair_score, (int metric, int64_t T, int K, int64_t D, const float *g, \
                   const float *alpha, const float *phi_sqnorm, float *score)) \
    X(row_sqnorm, (int64_t n, int64_t d, const float *x, float *out)) \
    X(select, (int64_t T, int K, int E, const int32_t *topk_ids, const float *score, \
               const int64_t *quota, uint8_t *keep, int64_t *load)) \
    X(sample, (int64_t T, int K, int E, const int32_t *topk_ids, const float *score, \
               const int64_t *quota, uint64_t seed, uint8_t *keep, float *weight, \
               int64_t *load)) \
    X(pack_assign, (int64_t T, int K, int E, int P, const int32_t *topk_ids, \
                    const uint8_t *keep, const int32_t *pair_rank, \
                    const int64_t *bwd_alloc, int64_t R, int64_t *pair, int32_t *rank, \
                    int64_t *counts, int64_t *offsets)) \
    X(pack_gather, (const int64_t *pair, int64_t R, int K, int by_token, const void *src, \
                    size_t row_bytes, void *dst)) \
    X(pack_gather_scaled, (const int64_t *pair, int64_t R, int K, int64_t D, \
                           const float *g, const float *alpha, float *dst)) \
    X(pack_gather_scaled_bf16, (const int64_t *pair, int64_t R, int K, int64_t D, \
                                const float *g, const float *alpha, uint16_t *dst)) \
    X(pack_unpack, (const int64_t *pair, int64_t R, const float *rows, int64_t D, \
                    int64_t T, int K, float *out)) \
    X(swiglu_fwd, (int64_t n, int64_t F, const float *g, const float *u, float *phi, \
                   float *sqnorm)) \
    X(swiglu_bwd, (int64_t n, int64_t F, const float *g, const float *u, \
                   const float *dphi, float *dg, float *du, float *phi)) \
    X(swiglu_bwd_bf16, (int64_t n, int64_t F, const uint16_t *g, const uint16_t *u, \
                        const float *dphi, uint16_t *dg, uint16_t *du, uint16_t *phi)) \
    X(combine, (int64_t T, int K, int64_t D, const float *alpha, const int64_t *row, \
                const float *y, float *out)) \
    X(pair_dot, (int64_t T, int K, int64_t D, const float *g, const int64_t *row, \
                 const float *y, float *out)) \
    X(gemm, (int ngemm, const lrmoe_gemm_t *g))

#define LRMOE_KREF_DECL(name, args) int lrmoe_kref_##name args;
LRMOE_KERNELS(LRMOE_KREF_DECL)
#undef LRMOE_KREF_DECL

#ifdef __cplusplus
}
#endif

#endif
