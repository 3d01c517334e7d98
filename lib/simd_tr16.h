/* A 16x16 transpose of 32-bit values in 16 zmm registers (AVX-512F), shared
 * by the kernels that pack or unpack pair-interleaved BF16 operands
 * (gemm_amx.c, gemm_dpbf16.c). Include only under an x86-64 GCC build. */
#ifndef LRMOE_SIMD_TR16_H
#define LRMOE_SIMD_TR16_H

#include <immintrin.h>

/* r[i] = row i of a 16x16 block of 32-bit values -> r[i] = column i */
__attribute__((target("avx512f")))
static inline void lrmoe_tr16(__m512i r[16])
{
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int g = 0; g < 16; g += 4) {
        u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
        u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
        u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
        u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    /* u[4g + c], 128-bit lane L: column 4L + c of rows 4g..4g+3 */
    for (int c = 0; c < 4; c++) {
        __m512i w0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
        __m512i w1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
        __m512i w2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
        __m512i w3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
        r[c] = _mm512_shuffle_i32x4(w0, w2, 0x88);
        r[4 + c] = _mm512_shuffle_i32x4(w0, w2, 0xDD);
        r[8 + c] = _mm512_shuffle_i32x4(w1, w3, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(w1, w3, 0xDD);
    }
}

#endif
