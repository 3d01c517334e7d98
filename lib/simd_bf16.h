/* BF16 <-> F32 for 16 lanes (AVX-512F), shared by the kernels that widen or
 * round BF16 in registers (gemm_amx.c, gemm_dpbf16.c, swiglu.c,
 * exec_cpu.c). Include only under an x86-64 GCC build. */
#ifndef LRMOE_SIMD_BF16_H
#define LRMOE_SIMD_BF16_H

#include <immintrin.h>
#include <stdint.h>

/* 16 F32 (as bits) to BF16 with lrmoe_f32_to_bf16's rounding: nearest
 * even; a NaN keeps its sign and is made quiet */
__attribute__((target("avx512f")))
static inline __m256i lrmoe_bf16_16(__m512i u)
{
    const __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i r = _mm512_add_epi32(u, _mm512_set1_epi32(0x7fff));
    r = _mm512_srli_epi32(_mm512_add_epi32(r, _mm512_and_si512(hi, _mm512_set1_epi32(1))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

/* 16 BF16 at p widened to F32 (exact: a shift) */
__attribute__((target("avx512f")))
static inline __m512 lrmoe_f32_16(const uint16_t *p)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

#endif
