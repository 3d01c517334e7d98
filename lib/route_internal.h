/* route_internal.h: kernels of route.c that live in their own files
 * (liblrmoe-internal; not installed). */
#ifndef LRMOE_ROUTE_INTERNAL_H
#define LRMOE_ROUTE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* 1 when the CPU and the OS run route_softmax_rows512 (AVX-512 F, BW, DQ,
 * VL and VBMI2, with BMI2 and POPCNT: Ice Lake, Sapphire Rapids, Zen 4 and
 * later); 0 elsewhere, and always when the environment
 * sets LRMOE_NO_SIMD or LRMOE_NO_AVX512 (so tests reach the other paths). */
int route_avx512_ok(void);

/* Rows per call of route_softmax_rows512, and the scratch it needs. */
enum { ROUTE512_ROWS = 16 };
#define ROUTE512_SCRATCH(E) ((size_t)ROUTE512_ROWS * ((size_t)(E) + 32))

/* Softmax-router top-K of nb <= ROUTE512_ROWS rows x (nb, E) F32, for K <= 8
 * and E a multiple of 16 up to 1024. Row r gets ids[r*K + k], w[r*K + k]
 * for k < K: the K largest logits in decreasing order, ties to the lower
 * expert index, with weights scale * exp(x - max) / S, S = sum over all E
 * experts when `full`, else over the K picks.
 * cv, ci: ROUTE512_SCRATCH(E) floats and ints of scratch. The nnext bytes
 * at next (the caller's next block, or 0 bytes) are prefetched meanwhile.
 * Rows it does not finish are left untouched, for the caller's general
 * path: a NaN anywhere in the row, an infinite maximum, more than 16
 * logits at or above its bound (about 0.4% of rows of random logits), or
 * a pick whose exp is below FLT_MIN. Returns those rows as a bit mask
 * (bit r = row r). */
uint32_t route_softmax_rows512(const float *x, int nb, int E, int K, int full,
                               float scale, int32_t *ids, float *w, float *cv, int32_t *ci,
                               const void *next, size_t nnext);

/* Prefetching a block ahead, spread over the work on the current block (a
 * burst of prefetches would stall on the fill buffers, spread out they
 * overlap the work): route_prefetch_out touches the lines the outputs'
 * next block will be written to (n bytes at a, n at b); route_prefetch_step
 * fetches the lines of [*p, end) up to *p + n and moves *p past them. */
static inline void route_prefetch_out(const void *a, const void *b, size_t n)
{
    for (size_t i = 0; i < n; i += 64) {
        __builtin_prefetch((const char *)a + i, 1, 3);
        __builtin_prefetch((const char *)b + i, 1, 3);
    }
}

static inline void route_prefetch_step(const char **p, const char *end, size_t n)
{
    const char *e = (size_t)(end - *p) > n ? *p + n : end;
    for (; *p < e; *p += 64)
        __builtin_prefetch(*p, 0, 3);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* exp for x <= 0 (Cephes expf: range reduction by ln 2, degree-7 polynomial,
 * about 1 ulp); arguments below -87 are clamped (their terms are < 2^-125
 * against a sum >= 1). */
__attribute__((target("avx2,fma")))
static inline __m256 route_exp_neg256(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

#endif

#endif
