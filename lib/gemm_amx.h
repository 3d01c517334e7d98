/* BF16 GEMM kernel on Intel AMX (tdpbf16ps: BF16 products, F32 sums), for
 * the expert layer's "activations times a weight matrix" GEMMs, whose weight
 * operand is read straight from its stored (N,K) row-major BF16 layout (the
 * weights file mapping), with no repacking pass:
 *
 *   C (M,N) F32 = A (M,K) B^T  [+ C when acc],  B stored (N,K), row stride K
 *
 * The kernel computes C^T = B A^T in 16x16 tiles: rows of B are AMX "A"
 * tiles as stored; A (the smaller operand, reused by every column block)
 * is packed once per call into AMX's pair-interleaved layout, converting
 * from F32 on the way when it is F32; C tiles are transposed on the way out.
 * Weight tiles are loaded straight from the rows of B: each tile load reads
 * one line from each of 16 rows, which the hardware prefetcher streams from
 * memory while the tiles compute (the weight stream is the layer's memory
 * traffic; a software prefetch was measured slower, see gemm_amx.c).
 *
 * Numerics: products of two BF16 values are exact in F32; each tile step sums
 * 32 of them in F32 (AMX's internal order), then adds to the F32 accumulator,
 * K/32 steps in ascending k. F32 A operands are rounded to BF16 (nearest
 * even, lrmoe_f32_to_bf16) first. Not bit-identical to oneDNN's kernels (a
 * different summation order); within BF16-operand GEMM tolerances.
 *
 * Shapes: K % 32 == 0 and N % 16 == 0; any M > 0. Nothing here prints or
 * exits. One context per thread. */
#ifndef LRMOE_GEMM_AMX_H
#define LRMOE_GEMM_AMX_H

#include <stddef.h>
#include <stdint.h>

/* 1 when this CPU and kernel run AMX BF16 (CPUID and the Linux permission
 * request for the tile state, made once per process), else 0. LRMOE_AMX=0 in
 * the environment turns it off (then the caller uses oneDNN). */
int lrmoe_amx_available(void);

/* 1 when the kernel takes this shape (K % 32 == 0, N % 16 == 0). */
int lrmoe_amx_shape_ok(int64_t N, int64_t K);

typedef struct lrmoe_amx lrmoe_amx_t;

lrmoe_amx_t *lrmoe_amx_new(void);
void lrmoe_amx_free(lrmoe_amx_t *x);

/* Pack A (M,K) row stride lda, BF16 (a_f32 = 0, uint16 bits) or F32
 * (a_f32 = 1, rounded to BF16), as the operand of the following
 * lrmoe_amx_gemm calls. -1 on out of memory (error set). */
int lrmoe_amx_pack(lrmoe_amx_t *x, int64_t M, int64_t K, const void *A, int a_f32, int64_t lda);

/* C (M,N) = packed A times B^T (B BF16 (N,K), row stride ldb), or C += when
 * acc; C row stride ldc. M and K are the packed operand's. -1 on out of
 * memory (error set). */
int lrmoe_amx_gemm(lrmoe_amx_t *x, int64_t N, const uint16_t *B, int64_t ldb, float *C,
                   int64_t ldc, int acc);

/* lrmoe_amx_gemm with C stored in BF16 (C = packed A B^T, each F32 sum
 * rounded as lrmoe_f32_to_bf16 does), row stride ldc. */
int lrmoe_amx_gemm_bf16(lrmoe_amx_t *x, int64_t N, const uint16_t *B, int64_t ldb, uint16_t *C,
                        int64_t ldc);

/* C (M,N) = A (M,K) B (K,N) [+ C when acc], B BF16 stored (K,N) with row
 * stride ldb (a weight matrix used untransposed: the backward's dphi and
 * dx), A BF16 or F32 (rounded) with row stride lda, C row stride ldc; the
 * same shapes (K % 32 == 0, N % 16 == 0) and numerics as lrmoe_amx_gemm.
 * Each 32-column panel of B is interleaved by row pairs into AMX's layout
 * while the next one is prefetched. -1 on out of memory (error set). */
int lrmoe_amx_gemm_nn(lrmoe_amx_t *x, int64_t M, int64_t N, int64_t K, const void *A, int a_f32,
                      int64_t lda, const uint16_t *B, int64_t ldb, float *C, int64_t ldc, int acc);

/* C (M,N) = A^T B with A (K,M) and B (K,N) both BF16 with K rows (any K >
 * 0: padded to 32 with zero rows, which add exact zeros), row strides lda,
 * ldb; N % 16 == 0. The weight gradients: C (a gradient, overwritten, not
 * read) is written with non-temporal stores where 64-byte aligned, so its
 * lines are not read first. -1 on out of memory (error set). */
int lrmoe_amx_gemm_tn(lrmoe_amx_t *x, int64_t M, int64_t N, int64_t K, const uint16_t *A,
                      int64_t lda, const uint16_t *B, int64_t ldb, float *C, int64_t ldc);

#endif
