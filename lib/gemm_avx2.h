/* F32 GEMM kernel on AVX2 and FMA (and AVX-512F where the CPU has it),
 * built for the expert layer's emulated bf16 on CPUs without a BF16 matmul
 * (AVX2 only: no AVX512_BF16, no AMX) or with a slow one (a BF16 dot
 * product with fewer FLOPs than the AVX-512 FMAs), whose weight operand it
 * reads in its stored BF16 (or F32) layout:
 *
 *   C (M,N) F32  =  op(A) op(B)  [+ C when acc]
 *
 * op(A) = A (stored (M,K), row stride lda) or A^T (ta: stored (K,M)); A is
 * F32. op(B) = B (stored (K,N), row stride ldb) or B^T (tb: stored (N,K));
 * B is BF16 (b_bf16 = 1: uint16 bits, widened exactly in the kernel) or F32.
 *
 * Blocking: K in blocks of 256 and M in blocks of 264 rows; per block, A
 * packed into 6-row micro-panels, B into 16-column micro-panels (8 rows and
 * 32 columns in the AVX-512 form, whose B^T panels span two K blocks and
 * whose passes over B stored (K,N) take 512 columns; widened;
 * when tb, one at a time, transposed, the next one's source prefetched a
 * part before each micro-kernel call on this one; when
 * B is stored (K,N), sixteen at a time, 256 columns in one pass over B's
 * rows), both in the caller's workspace; each micro-panel of B (in L1 while
 * it is used) is multiplied with every 6-row micro-panel of A by the 6x16
 * FMA micro-kernel, which broadcasts A's values. In the AVX-512 form, A B^T
 * with a BF16 B and at most 64 rows of A (the forward's x W^T at 64 rows
 * per expert) skips B's panels: A is transposed once, B's rows are widened
 * as they are stored, six at a time, and broadcast against up to four
 * vectors of A^T (C^T = B A^T), the same sums in the same order
 * (LRMOE_AVX2_DIRECT=0 keeps the panels). The weights are read from their stored
 * layout once per (K block, M block): no F32 copy of a weight matrix is
 * made. The micro-kernel prefetches its C lines before its loop; a C that
 * is written in one K block without acc and is 1 MiB or more (the weight
 * gradients) is stored non-temporally where its rows are 64-byte aligned,
 * fenced before the call returns.
 *
 * Numerics: each C element is a sum in F32 with fused multiply-adds, in
 * ascending k within a K block, the blocks' partial sums added to C in
 * ascending order. The caller rounds the operands first for the BF16 compute
 * (then every product is exact in F32). Not bit-identical to OpenBLAS sgemm
 * (another summation order). Nothing here prints or exits; no allocation. */
#ifndef LRMOE_GEMM_AVX2_H
#define LRMOE_GEMM_AVX2_H

#include <stddef.h>
#include <stdint.h>

/* 1 when this CPU runs AVX2 and FMA (and LRMOE_AVX2_GEMM is not 0 in the
 * environment), else 0. */
int lrmoe_avx2_gemm_available(void);

/* 1 when the AVX-512F form (8x32 micro-tiles of zmm) runs: the CPU has
 * AVX-512F, AVX2 and FMA and LRMOE_AVX2_GEMM is not 256 (which keeps the
 * AVX2 form, for comparison and the tests); else 0. */
int lrmoe_avx2_gemm_wide(void);

/* This CPU's F32 FLOP rate with AVX-512 FMAs over its BF16 dot-product
 * rate (vdpbf16ps, AVX512_BF16), one thread, register operands, measured
 * once per process (about 3 ms, the best of 5 each); 0 where the CPU has
 * not both. Above 1, the form above on BF16-rounded operands has more
 * arithmetic than a BF16 matmul built on the dot product (oneDNN's). */
double lrmoe_avx2_fma_over_bf16dot(void);
/* The two rates behind it, FLOP/s of one thread (a product and a sum count
 * two): *fma with AVX-512 FMAs, *dot with vdpbf16ps, the same measurement
 * (both 0 where the CPU has not both): the register peaks of the F32 and
 * BF16 GEMM kernels (tests/bench/cpu.sh prints them). */
void lrmoe_avx2_peak_rates(double *fma, double *dot);

/* Bytes of the workspace lrmoe_avx2_gemm takes (the packed A block and B's
 * micro-panels: about 1 MiB). */
size_t lrmoe_avx2_gemm_ws(void);

/* ws: lrmoe_avx2_gemm_ws() bytes, any alignment; one per thread. */
void lrmoe_avx2_gemm(float *ws, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                     const void *B, int b_bf16, int64_t ldb, int acc, float *C, int64_t ldc);
/* The same with the width chosen: wide = 0 the AVX2 form, 1 the AVX-512F
 * form where lrmoe_avx2_gemm_wide() (lrmoe_avx2_gemm is wide = 1). The two
 * give the same bits (the same products summed in the same order per
 * element; tests/unit/gemm_test.c compares them). */
void lrmoe_avx2_gemm_w(int wide, float *ws, int ta, int tb, int64_t M, int64_t N, int64_t K,
                       const float *A, int64_t lda, const void *B, int b_bf16, int64_t ldb,
                       int acc, float *C, int64_t ldc);

#endif
