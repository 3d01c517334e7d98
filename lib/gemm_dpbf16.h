/* BF16 GEMM kernel on AVX512_BF16's vdpbf16ps (BF16 pair products, F32
 * sums) for CPUs with AVX512_BF16 and no AMX (AMD Zen 4 and later, Intel
 * Cooper Lake): lrmoe's own kernel for every GEMM form of the expert layer,
 * one call per GEMM with no primitive to create or cache:
 *
 *   C (M,N) F32 = op(A) op(B) [+ C when acc]
 *
 * op as in gemm_cpu.h: A stored (M,K), or (K,M) when ta; B stored (K,N), or
 * (N,K) when tb; each operand BF16 or F32 (F32 rounded to BF16 first,
 * nearest even, as lrmoe_gemm_to_bf16).
 *
 * The outer-product form: B is packed, 64 columns at a time, into the
 * instruction's pair-interleaved layout (for each pair of k, 64 dwords of
 * (B[k][n], B[k+1][n]): a row-pair interleave of a stored (K,N) weight
 * matrix) and the packed panel is reused for every row of A, while the
 * next panel's source is prefetched into L2; A is copied once per call
 * (rows on a padded stride so that 6 rows never share an L1 set, or
 * pair-interleaved when ta); a 6x64 tile of C keeps 24 zmm accumulators and
 * each step broadcasts one pair of A per row against 4 vectors of the panel.
 * The weight gradients (ta, no acc) are written with non-temporal stores.
 * C = A B^T with B BF16 stored (N,K) (the forward's x W^T) leaves the
 * weights where they are: C^T = B A^T, pairs of 6 rows of B (4 when A has
 * more than 64 rows: every row of A up to 96 in one pass, 24 accumulators)
 * broadcast in place against A transposed by pairs (vectors of 16 rows of
 * A, a tail of 8 in a ymm), the next rows of B prefetched into L1; the
 * tiles' C^T go to a small buffer written into C by whole 16-float rows
 * (C +=: each tile transposed into C itself); the same steps on the same pairs, so
 * the same bits as packing B (LRMOE_DPBF16_PACKNT=1 packs it anyway, for
 * the test that compares the two). The conversions of F32 operands happen
 * in the copies.
 *
 * Numerics: each C element is C0 (0, or C when acc) followed by one
 * vdpbf16ps step per pair of k, pairs in ascending order (an odd K's last
 * pair has a zero second half). The instruction multiplies BF16 exactly and
 * adds in F32 with round-to-nearest-even, treating denormal inputs as zero
 * and flushing denormal results (DAZ/FTZ are implied by vdpbf16ps). The
 * bits of a C element depend only on its row of op(A) and its column of
 * op(B): not on M, N, the strides or the position in C.
 *
 * Any shape; nothing here prints or exits. One context per thread. */
#ifndef LRMOE_GEMM_DPBF16_H
#define LRMOE_GEMM_DPBF16_H

#include <stdint.h>

/* 1 when this CPU runs AVX-512F/BW/VL and AVX512_BF16 and the build has the
 * kernel; LRMOE_DPBF16=0 in the environment turns it off (the bf16 compute
 * then uses oneDNN's matmul). */
int lrmoe_dpbf16_available(void);

typedef struct lrmoe_dpbf16 lrmoe_dpbf16_t;

lrmoe_dpbf16_t *lrmoe_dpbf16_new(void);
void lrmoe_dpbf16_free(lrmoe_dpbf16_t *x);

/* C = op(A) op(B) [+ C], the operands BF16 (a_f32/b_f32 = 0, uint16 bits)
 * or F32 (1); M, N > 0 and K >= 0 (K = 0: C = 0, or C unchanged when acc).
 * -1 on out of memory (error set). */
int lrmoe_dpbf16_gemm(lrmoe_dpbf16_t *x, int ta, int tb, int64_t M, int64_t N, int64_t K,
                      const void *A, int a_f32, int64_t lda, const void *B, int b_f32,
                      int64_t ldb, int acc, float *C, int64_t ldc);

/* C (M,N) BF16 = A B^T rounded to BF16 as lrmoe_gemm_to_bf16 rounds (the
 * forward's y = phi W_down^T into its BF16 rows), B BF16 stored (N,K), A
 * BF16 or F32 (a_f32) stored (M,K), ldc in BF16 elements: the products of
 * lrmoe_dpbf16_gemm(x, 0, 1, ..., acc 0), each rounded in the store that
 * writes it (no F32 C in memory). The same bits as lrmoe_dpbf16_gemm
 * followed by lrmoe_gemm_to_bf16. Only where lrmoe_dpbf16_bf16out_ok(M, K)
 * (else -1, error set; the caller rounds an F32 product itself); -1 on out
 * of memory (error set). */
int lrmoe_dpbf16_gemm_bf16out(lrmoe_dpbf16_t *x, int64_t M, int64_t N, int64_t K, const void *A,
                              int a_f32, int64_t lda, const uint16_t *B, int64_t ldb,
                              uint16_t *C, int64_t ldc);

/* 1 when the form lrmoe_dpbf16_gemm picks for M rows of A by K rounds C in
 * its stores: all but the stored-weights form with more than one block of
 * rows (K over about 4096 at 65 to 96 rows); 0 in a build without the
 * kernel */
int lrmoe_dpbf16_bf16out_ok(int64_t M, int64_t K);

/* C[:, 0:N] = A B1^T and C[:, N:2N] = A B2^T (C F32 (M, 2N) overwritten,
 * B1 and B2 BF16 stored (N,K), A BF16 or F32 (a_f32) stored (M,K)): the
 * forward's h_g and h_u, with A packed once for both instead of once per
 * product. The same bits as two lrmoe_dpbf16_gemm(x, 0, 1, ..., acc 0)
 * calls. -1 on out of memory (error set). */
int lrmoe_dpbf16_gemm2(lrmoe_dpbf16_t *x, int64_t M, int64_t N, int64_t K, const void *A,
                       int a_f32, int64_t lda, const uint16_t *B1, const uint16_t *B2,
                       int64_t ldb, float *C, int64_t ldc);

#endif
