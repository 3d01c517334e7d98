/* SwiGLU elementwise references (see swiglu.h).
 *
 * sigmoid(g) = 1 / (1 + expf(-g)) in float, with the C library's expf. On a
 * CPU with AVX-512F the rows run 16 lanes at a time with lrmoe's own expf,
 * which is glibc's expf algorithm (sysdeps/ieee754/flt-32/e_expf.c, the
 * variant glibc runs on an FMA CPU: the same double-precision operations,
 * the same FMAs, the same 32-entry table) written in AVX-512: it gives
 * libm's bits, so the vector rows equal the scalar ones bit for bit. Lanes
 * outside libm's fast path (|x| >= 88, Inf, NaN) go through libm itself.
 * The vector path is used only after a self-check against this process'
 * libm expf (on values spread over the whole finite range); a libm that
 * computes otherwise keeps the scalar loop. The products and the division
 * are the scalar code's, in its order (ISO C: no contraction). */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "swiglu.h"
#include "lrmoe.h"

static inline float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

/* scalar rows: the reference */
static void fwd_row_s(int64_t F, const float *g, const float *u, float *phi)
{
    for (int64_t j = 0; j < F; j++) phi[j] = g[j] * sigmoidf_(g[j]) * u[j];
}

static void bwd_row_s(int64_t F, const float *g, const float *u, const float *dphi,
                      float *dg, float *du, float *phi)
{
    for (int64_t j = 0; j < F; j++) {
        float sg = sigmoidf_(g[j]);
        float si = g[j] * sg;
        du[j] = dphi[j] * si;
        dg[j] = dphi[j] * u[j] * sg * (1.0f + g[j] * (1.0f - sg));
        if (phi) phi[j] = si * u[j];
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include "simd_bf16.h"
#define LRMOE_SWIGLU_VEC 1

/* glibc's __exp2f_data: 2^(i/32) as bits, minus i << 47 */
static const uint64_t exp2f_tab[32] = {
    0x3ff0000000000000ULL, 0x3fefd9b0d3158574ULL, 0x3fefb5586cf9890fULL, 0x3fef9301d0125b51ULL,
    0x3fef72b83c7d517bULL, 0x3fef54873168b9aaULL, 0x3fef387a6e756238ULL, 0x3fef1e9df51fdee1ULL,
    0x3fef06fe0a31b715ULL, 0x3feef1a7373aa9cbULL, 0x3feedea64c123422ULL, 0x3feece086061892dULL,
    0x3feebfdad5362a27ULL, 0x3feeb42b569d4f82ULL, 0x3feeab07dd485429ULL, 0x3feea47eb03a5585ULL,
    0x3feea09e667f3bcdULL, 0x3fee9f75e8ec5f74ULL, 0x3feea11473eb0187ULL, 0x3feea589994cce13ULL,
    0x3feeace5422aa0dbULL, 0x3feeb737b0cdc5e5ULL, 0x3feec49182a3f090ULL, 0x3feed503b23e255dULL,
    0x3feee89f995ad3adULL, 0x3feeff76f2fb5e47ULL, 0x3fef199bdd85529cULL, 0x3fef3720dcef9069ULL,
    0x3fef5818dcfba487ULL, 0x3fef7c97337b9b5fULL, 0x3fefa4afa2a490daULL, 0x3fefd0765b6e4540ULL,
};

/* expf of 8 floats (as doubles), libm's fast path (|x| < 88):
 *   z = x*32/ln2; kd = z + shift (one FMA), k = its low bits; r = x*32/ln2 - kd
 *   (one FMA); 2^(r/32) ~ (C0 r + C1) r^2 + (C2 r + 1) (FMAs);
 *   times s = 2^(k/32) from the table; rounded to float. */
__attribute__((target("avx512f")))
static inline __m256 vexp8(__m256 x, __m512i t0, __m512i t1)
{
    const __m512d invln2n = _mm512_set1_pd(0x1.71547652b82fep+5), shift = _mm512_set1_pd(0x1.8p+52);
    const __m512d c0 = _mm512_set1_pd(0x1.c6af84b912394p-20), c1 = _mm512_set1_pd(0x1.ebfce50fac4f3p-13),
                  c2 = _mm512_set1_pd(0x1.62e42ff0c52d6p-6), one = _mm512_set1_pd(1.0);
    __m512d xd = _mm512_cvtps_pd(x);
    __m512d kd = _mm512_fmadd_pd(invln2n, xd, shift);
    __m512i ki = _mm512_castpd_si512(kd);
    kd = _mm512_sub_pd(kd, shift);
    __m512d r = _mm512_fmsub_pd(invln2n, xd, kd);
    __m512i idx = _mm512_and_si512(ki, _mm512_set1_epi64(31));
    __m512i lo = _mm512_permutex2var_epi64(t0, idx, t1);              /* entries 0-15 */
    __m512i hi = _mm512_permutex2var_epi64(_mm512_loadu_si512(exp2f_tab + 16), idx,
                                           _mm512_loadu_si512(exp2f_tab + 24)); /* 16-31 */
    __mmask8 up = _mm512_test_epi64_mask(idx, _mm512_set1_epi64(16));
    __m512i t = _mm512_mask_blend_epi64(up, lo, hi);
    t = _mm512_add_epi64(t, _mm512_slli_epi64(ki, 47));
    __m512d s = _mm512_castsi512_pd(t);
    __m512d z = _mm512_fmadd_pd(c0, r, c1);
    __m512d r2 = _mm512_mul_pd(r, r);
    __m512d y = _mm512_fmadd_pd(r, c2, one);
    y = _mm512_fmadd_pd(z, r2, y);
    y = _mm512_mul_pd(y, s);
    return _mm512_cvtpd_ps(y);
}

/* sigmoid of 16 floats; 0 when a lane is off libm's fast path (the caller
 * then takes the scalar loop for these 16) */
__attribute__((target("avx512f")))
static inline int vsigmoid16(__m512 g, __m512 *sg)
{
    __m512i b = _mm512_xor_si512(_mm512_castps_si512(g), _mm512_set1_epi32((int)0x80000000u));
    __m512i ab = _mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff));
    if (_mm512_cmpge_epu32_mask(ab, _mm512_set1_epi32(0x42a00000))) return 0;
    __m512 x = _mm512_castsi512_ps(b);
    __m512i t0 = _mm512_loadu_si512(exp2f_tab), t1 = _mm512_loadu_si512(exp2f_tab + 8);
    __m256 e0 = vexp8(_mm512_castps512_ps256(x), t0, t1);
    __m256 e1 = vexp8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)), t0, t1);
    __m512 e = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(e0)),
                                                   _mm256_castps_pd(e1), 1));
    const __m512 one = _mm512_set1_ps(1.0f);
    *sg = _mm512_div_ps(one, _mm512_add_ps(one, e));
    return 1;
}

__attribute__((target("avx512f")))
static void fwd_row_v(int64_t F, const float *g, const float *u, float *phi)
{
    int64_t j = 0;
    for (; j + 16 <= F; j += 16) {
        __m512 gv = _mm512_loadu_ps(g + j), sg;
        if (!vsigmoid16(gv, &sg)) { fwd_row_s(16, g + j, u + j, phi + j); continue; }
        _mm512_storeu_ps(phi + j, _mm512_mul_ps(_mm512_mul_ps(gv, sg), _mm512_loadu_ps(u + j)));
    }
    fwd_row_s(F - j, g + j, u + j, phi + j);
}

/* bwd_row_s's operations on 16 lanes of g, u and dphi (sg their sigmoid):
 * o[0] = dg, o[1] = du, o[2] = phi */
__attribute__((target("avx512f")))
static inline void bwd16(__m512 gv, __m512 sg, __m512 uv, __m512 dv, __m512 o[3])
{
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 si = _mm512_mul_ps(gv, sg);
    o[1] = _mm512_mul_ps(dv, si);
    const __m512 q = _mm512_add_ps(one, _mm512_mul_ps(gv, _mm512_sub_ps(one, sg)));
    o[0] = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(dv, uv), sg), q);
    o[2] = _mm512_mul_ps(si, uv);
}

__attribute__((target("avx512f")))
static void bwd_row_v(int64_t F, const float *g, const float *u, const float *dphi,
                      float *dg, float *du, float *phi)
{
    int64_t j = 0;
    for (; j + 16 <= F; j += 16) {
        __m512 gv = _mm512_loadu_ps(g + j), sg, o[3];
        if (!vsigmoid16(gv, &sg)) {
            bwd_row_s(16, g + j, u + j, dphi + j, dg + j, du + j, phi ? phi + j : NULL);
            continue;
        }
        bwd16(gv, sg, _mm512_loadu_ps(u + j), _mm512_loadu_ps(dphi + j), o);
        _mm512_storeu_ps(dg + j, o[0]);
        _mm512_storeu_ps(du + j, o[1]);
        if (phi) _mm512_storeu_ps(phi + j, o[2]);
    }
    bwd_row_s(F - j, g + j, u + j, dphi + j, dg + j, du + j, phi ? phi + j : NULL);
}

static void bwd_bf16_row_s(int64_t F, const uint16_t *g, const uint16_t *u, const float *dphi,
                           uint16_t *dg, uint16_t *du, uint16_t *phi);

/* bwd_row_v on BF16 g, u with BF16 dg, du, phi: widened on load, rounded on
 * store, the F32 operations of bwd_row_v (bwd16) between */
__attribute__((target("avx512f")))
static void bwd_bf16_row_v(int64_t F, const uint16_t *g, const uint16_t *u, const float *dphi,
                           uint16_t *dg, uint16_t *du, uint16_t *phi)
{
    int64_t j = 0;
    for (; j + 16 <= F; j += 16) {
        __m512 gv = lrmoe_f32_16(g + j), sg, o[3];
        if (!vsigmoid16(gv, &sg)) {
            bwd_bf16_row_s(16, g + j, u + j, dphi + j, dg + j, du + j, phi ? phi + j : NULL);
            continue;
        }
        bwd16(gv, sg, lrmoe_f32_16(u + j), _mm512_loadu_ps(dphi + j), o);
        uint16_t *dst[3] = {dg + j, du + j, phi ? phi + j : NULL};
        for (int q = 0; q < 3; q++)
            if (dst[q])
                _mm256_storeu_si256((__m256i *)dst[q], lrmoe_bf16_16(_mm512_castps_si512(o[q])));
    }
    bwd_bf16_row_s(F - j, g + j, u + j, dphi + j, dg + j, du + j, phi ? phi + j : NULL);
}

/* The self-check: every 40961st float bit pattern (both signs, all of the
 * finite range, so libm's special cases too) and the boundaries of the
 * fast path, through the vector and the scalar sigmoid. */
__attribute__((target("avx512f")))
static int vec_matches(void)
{
    enum { B = 16 };
    float g[B], s[B];
    for (uint64_t k = 0, n = 0; k < 0x100000000ULL; k += 40961, n++) {
        uint32_t w = (uint32_t)k;
        if (n < 8) w = (uint32_t[]){0x42a00000u, 0xc2a00000u, 0x429fffffu, 0xc29fffffu,
                                    0x42b17217u, 0xc2cff1b4u, 0, 0x80000000u}[n];
        memcpy(&g[n % B], &w, sizeof w);
        if (n % B != B - 1) continue;
        __m512 sg;
        if (!vsigmoid16(_mm512_loadu_ps(g), &sg)) continue; /* scalar there anyway */
        _mm512_storeu_ps(s, sg);
        for (int i = 0; i < B; i++) {
            float ref = sigmoidf_(g[i]);
            if (memcmp(&ref, &s[i], sizeof ref) && !(isnan(ref) && isnan(s[i]))) return 0;
        }
    }
    return 1;
}

static int g_vec;
static pthread_once_t vec_once = PTHREAD_ONCE_INIT;

static void vec_probe(void)
{
    const char *e = getenv("LRMOE_SWIGLU_VEC");
    if (e && !strcmp(e, "0")) return;
    __builtin_cpu_init();
    g_vec = __builtin_cpu_supports("avx512f") && vec_matches();
}
#endif

int lrmoe_swiglu_vec(void)
{
#ifdef LRMOE_SWIGLU_VEC
    pthread_once(&vec_once, vec_probe);
    return g_vec;
#else
    return 0;
#endif
}

static void fwd_row(int v, int64_t F, const float *g, const float *u, float *phi)
{
#ifdef LRMOE_SWIGLU_VEC
    if (v) { fwd_row_v(F, g, u, phi); return; }
#endif
    (void)v;
    fwd_row_s(F, g, u, phi);
}

static void bwd_row(int v, int64_t F, const float *g, const float *u, const float *dphi,
                    float *dg, float *du, float *phi)
{
#ifdef LRMOE_SWIGLU_VEC
    if (v) { bwd_row_v(F, g, u, dphi, dg, du, phi); return; }
#endif
    (void)v;
    bwd_row_s(F, g, u, dphi, dg, du, phi);
}

/* ||row||^2 of up to 8 rows of F (row r at p + r*ld), each summed in double
 * in ascending j as a row alone would be; the chains are interleaved so
 * that their additions overlap. */
__attribute__((optimize("O3")))
static void sqnorm8(int nr, int64_t F, const float *p, int64_t ld, float *out)
{
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (nr == 8) {
        for (int64_t j = 0; j < F; j++)
            for (int r = 0; r < 8; r++) {
                double v = p[r * ld + j];
                s[r] += v * v;
            }
    } else {
        for (int64_t j = 0; j < F; j++)
            for (int r = 0; r < nr; r++) {
                double v = p[r * ld + j];
                s[r] += v * v;
            }
    }
    for (int r = 0; r < nr; r++) out[r] = (float)s[r];
}

void lrmoe_swiglu_fwd(int64_t n, int64_t F, const float *g, const float *u,
                      float *phi, float *sqnorm)
{
    lrmoe_swiglu_fwd_ld(n, F, g, u, F, phi, F, sqnorm);
}

void lrmoe_swiglu_bwd(int64_t n, int64_t F, const float *g, const float *u,
                      const float *dphi, float *dg, float *du, float *phi)
{
    lrmoe_swiglu_bwd_ld(n, F, g, u, F, dphi, dg, du, F, phi);
}

void lrmoe_swiglu_fwd_ld(int64_t n, int64_t F, const float *g, const float *u,
                         int64_t ldi, float *phi, int64_t ldp, float *sqnorm)
{
    int v = lrmoe_swiglu_vec();
    for (int64_t i0 = 0; i0 < n; i0 += 8) {
        int nr = n - i0 < 8 ? (int)(n - i0) : 8;
        for (int r = 0; r < nr; r++)
            fwd_row(v, F, g + (i0 + r) * ldi, u + (i0 + r) * ldi, phi + (i0 + r) * ldp);
        if (sqnorm) sqnorm8(nr, F, phi + i0 * ldp, ldp, sqnorm + i0);
    }
}

void lrmoe_swiglu_bwd_ld(int64_t n, int64_t F, const float *g, const float *u,
                         int64_t ldi, const float *dphi, float *dg, float *du,
                         int64_t ldo, float *phi)
{
    int v = lrmoe_swiglu_vec();
    for (int64_t i = 0; i < n; i++)
        bwd_row(v, F, g + i * ldi, u + i * ldi, dphi + i * F, dg + i * ldo, du + i * ldo,
                phi ? phi + i * F : NULL);
}

/* bwd_row_s on BF16 g, u with BF16 outputs, 16 values at a time */
static void bwd_bf16_row_s(int64_t F, const uint16_t *g, const uint16_t *u, const float *dphi,
                           uint16_t *dg, uint16_t *du, uint16_t *phi)
{
    float gf[16], uf[16], dgf[16], duf[16], pf[16];
    for (int64_t j0 = 0; j0 < F; j0 += 16) {
        const int64_t w = F - j0 < 16 ? F - j0 : 16;
        lrmoe_convert_to_f32(LRMOE_BF16, g + j0, gf, (size_t)w);
        lrmoe_convert_to_f32(LRMOE_BF16, u + j0, uf, (size_t)w);
        bwd_row_s(w, gf, uf, dphi + j0, dgf, duf, phi ? pf : NULL);
        lrmoe_convert_from_f32(LRMOE_BF16, dgf, dg + j0, (size_t)w);
        lrmoe_convert_from_f32(LRMOE_BF16, duf, du + j0, (size_t)w);
        if (phi) lrmoe_convert_from_f32(LRMOE_BF16, pf, phi + j0, (size_t)w);
    }
}

void lrmoe_swiglu_bwd_bf16_rows(int64_t n, int64_t F, const uint16_t *const *g,
                                const uint16_t *const *u, const float *dphi, uint16_t *dg,
                                uint16_t *du, int64_t ldo, uint16_t *phi)
{
    int v = lrmoe_swiglu_vec();
    for (int64_t i = 0; i < n; i++) {
        uint16_t *p = phi ? phi + i * F : NULL;
#ifdef LRMOE_SWIGLU_VEC
        if (v) {
            bwd_bf16_row_v(F, g[i], u[i], dphi + i * F, dg + i * ldo, du + i * ldo, p);
            continue;
        }
#endif
        (void)v;
        bwd_bf16_row_s(F, g[i], u[i], dphi + i * F, dg + i * ldo, du + i * ldo, p);
    }
}
