/* AVX2/FMA GEMM with B read in its stored BF16 or F32 layout. See gemm_avx2.h. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "gemm_avx2.h"
#if defined(__x86_64__)
#include "simd_bf16.h"
#include "simd_tr16.h"
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define T __attribute__((target("avx2,fma")))
#define T512 __attribute__((target("avx512f,avx2,fma")))

#ifndef AVX2_KC
#define AVX2_KC 256
#endif
#ifndef AVX2_MC
#define AVX2_MC 264
#endif
/* Two widths of one kernel: AVX2 (6x16 micro-tiles of ymm) and AVX-512F
 * (8x32 of zmm), the same K and M blocks and summation order, the packing
 * passes longer in the AVX-512 form (SPAN, WS_B below). COLS: the columns
 * of B stored (K,N) per pass over its rows in the AVX2 form. */
enum { KC = AVX2_KC, MC = AVX2_MC, COLS = 256, NT_BYTES = 1 << 20 };

int lrmoe_avx2_gemm_available(void)
{
    const char *e = getenv("LRMOE_AVX2_GEMM");
    if (e && !strcmp(e, "0")) return 0;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* wide_direct: the AVX-512 form's direct x W^T (direct_nt below) runs,
 * unless LRMOE_AVX2_DIRECT=0; read once with wide_cpu */
static int wide_cpu, wide_direct;
static void wide_probe(void)
{
    const char *e = getenv("LRMOE_AVX2_GEMM"), *d = getenv("LRMOE_AVX2_DIRECT");
    __builtin_cpu_init();
    wide_cpu = !(e && !strcmp(e, "256")) && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    wide_direct = !(d && !strcmp(d, "0"));
}

int lrmoe_avx2_gemm_wide(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, wide_probe);
    return wide_cpu;
}

/* ---- this CPU's F32 FMA rate against its BF16 dot-product rate */

static double thread_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* FLOP/s of n x 12 independent zmm instructions: vfmadd231ps (32 FLOP) or
 * vdpbf16ps (64: 32 products, 32 sums); the asm keeps the operands in
 * registers, the sum keeps the loop */
T512 static double fma_rate(long n)
{
    __m512 c[12], a = _mm512_set1_ps(1e-7f), b = _mm512_set1_ps(1.0f);
    for (int i = 0; i < 12; i++) c[i] = _mm512_setzero_ps();
    double t = thread_s();
    for (long i = 0; i < n; i++) {
#pragma GCC unroll 12
        for (int j = 0; j < 12; j++) c[j] = _mm512_fmadd_ps(a, b, c[j]);
        __asm__ volatile("" : "+v"(a), "+v"(b));
    }
    t = thread_s() - t;
    for (int i = 1; i < 12; i++) c[0] = _mm512_add_ps(c[0], c[i]);
    volatile float sink = _mm512_reduce_add_ps(c[0]);
    (void)sink;
    return t > 0 ? (double)n * 12 * 32 / t : 0;
}

__attribute__((target("avx512f,avx512bf16"))) static double dot_rate(long n)
{
    __m512 c[12];
    __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = a;
    for (int i = 0; i < 12; i++) c[i] = _mm512_setzero_ps();
    double t = thread_s();
    for (long i = 0; i < n; i++) {
#pragma GCC unroll 12
        for (int j = 0; j < 12; j++) c[j] = _mm512_dpbf16_ps(c[j], a, b);
        __asm__ volatile("" : "+v"(a), "+v"(b));
    }
    t = thread_s() - t;
    for (int i = 1; i < 12; i++) c[0] = _mm512_add_ps(c[0], c[i]);
    volatile float sink = _mm512_reduce_add_ps(c[0]);
    (void)sink;
    return t > 0 ? (double)n * 12 * 64 / t : 0;
}

static double fma_over_dot, fma_best, dot_best;
static void rates(void)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bf16")) return;
    double f = 0, d = 0;
    for (int r = 0; r < 5; r++) { /* the best of 5 each, interleaved: about 3 ms */
        double x = fma_rate(100000), y = dot_rate(40000);
        if (x > f) f = x;
        if (y > d) d = y;
    }
    fma_over_dot = d > 0 ? f / d : 0;
    fma_best = f;
    dot_best = d;
}

static pthread_once_t rates_once = PTHREAD_ONCE_INIT;

double lrmoe_avx2_fma_over_bf16dot(void)
{
    pthread_once(&rates_once, rates);
    return fma_over_dot;
}

void lrmoe_avx2_peak_rates(double *fma, double *dot)
{
    pthread_once(&rates_once, rates);
    *fma = fma_best;
    *dot = dot_best;
}

/* 8 BF16 (uint16 bits) at p widened to F32: exact */
T static inline __m256 wide8(const uint16_t *p)
{
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

T static inline void tr8(__m256 r[8])
{
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

static inline float bval(const void *B, int bf, int64_t i)
{
    if (!bf) return ((const float *)B)[i];
    uint32_t u = (uint32_t)((const uint16_t *)B)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* d[k][0..7] (row stride NR, the panel width) = the 8 rows s, s + ld, ... at k, for k < kv
 * (a multiple of 8): BF16 widened, then F32. */
#define TPANEL(NAME, TYPE, LOAD)                                                      \
    T static inline __attribute__((always_inline)) void NAME(const TYPE *s, int64_t ld,   \
                                                             int64_t kv, float *d, int NR) \
    {                                                                                 \
        const TYPE *s0 = s, *s1 = s + ld, *s2 = s + 2 * ld, *s3 = s + 3 * ld;         \
        const TYPE *s4 = s + 4 * ld, *s5 = s + 5 * ld, *s6 = s + 6 * ld, *s7 = s + 7 * ld; \
        for (int64_t k = 0; k < kv; k += 8, d += 8 * NR) {                            \
            __m256 r[8] = {LOAD(s0 + k), LOAD(s1 + k), LOAD(s2 + k), LOAD(s3 + k),    \
                           LOAD(s4 + k), LOAD(s5 + k), LOAD(s6 + k), LOAD(s7 + k)};   \
            tr8(r);                                                                   \
            for (int t = 0; t < 8; t++) _mm256_store_ps(d + t * NR, r[t]);            \
        }                                                                             \
    }
TPANEL(tpanel_bf16, uint16_t, wide8)
TPANEL(tpanel_f32, float, _mm256_loadu_ps)
#undef TPANEL

/* The micro-panel bp[k][0..NR-1] = B^T[p0 + k][j0 + j] = B[j0 + j][p0 + k]
 * (B stored (N,K)), zero past nr: rows j0.. of B become columns of the
 * panel, eight rows by eight k at a time through an 8x8 transpose. */
T static inline __attribute__((always_inline)) void pack_bt(const void *B, int bf, int64_t ldb,
                                                            int64_t p0, int64_t kc, int64_t j0,
                                                            int nr, float *bp, int NR)
{
    int64_t k = 0;
    if (nr == NR) {
        const int64_t kv = kc & ~(int64_t)7;
        for (int h = 0; h < NR / 8; h++) {
            if (bf) tpanel_bf16((const uint16_t *)B + (j0 + h * 8) * ldb + p0, ldb, kv, bp + h * 8, NR);
            else tpanel_f32((const float *)B + (j0 + h * 8) * ldb + p0, ldb, kv, bp + h * 8, NR);
        }
        k = kv;
    }
    for (; k < kc; k++)
        for (int j = 0; j < NR; j++)
            bp[k * NR + j] = j < nr ? bval(B, bf, (j0 + j) * ldb + p0 + k) : 0.0f;
}

/* B stored (K,N): the columns j0 .. j0 + cols - 1 (cols <= 2 COLS) as
 * micro-panels bp + q KC NR, [k][0..NR-1] = B[p0 + k][j0 + NR q + j], zero
 * past cols, in one pass over B's rows: each row gives cols contiguous
 * values (up to 1 KiB of BF16), which the hardware prefetcher follows;
 * a narrower pass reads one line per row, each row in another page. */
T static inline __attribute__((always_inline)) void pack_bn(const void *B, int bf, int64_t ldb,
                                                            int64_t p0, int64_t kc, int64_t j0,
                                                            int64_t cols, float *bp, int NR)
{
    const int64_t full = cols / NR, rest = cols % NR;
    for (int64_t k = 0; k < kc; k++) {
        const int64_t o = (p0 + k) * ldb + j0;
        float *d = bp + k * NR;
        for (int64_t q = 0; q < full; q++, d += KC * NR) {
            if (bf) {
                const uint16_t *s = (const uint16_t *)B + o + q * NR;
                for (int h = 0; h < NR; h += 8) _mm256_store_ps(d + h, wide8(s + h));
            } else {
                const float *s = (const float *)B + o + q * NR;
                for (int h = 0; h < NR; h += 8) _mm256_store_ps(d + h, _mm256_loadu_ps(s + h));
            }
        }
        if (rest)
            for (int j = 0; j < NR; j++) d[j] = j < rest ? bval(B, bf, o + full * NR + j) : 0.0f;
    }
}

/* The source lines of the transposed micro-panel that is packed next (B
 * stored (N,K): rows j0 .. j0 + NR - 1, k p0 .. p0 + kc - 1), numbered row by
 * row. They are prefetched a part before each micro-kernel call on the
 * current panel, so that they stream in while it computes: prefetched all
 * at once, they arrived too late (measured: 3-8% slower at 64-256 rows).
 * B stored (K,N) has none: its NG-panel pass reads whole rows in sequence,
 * which the hardware prefetcher follows, and spreading its next pass gave
 * no clear gain. */
struct pf {
    const char *b;      /* the first source byte, or NULL: none */
    size_t ld;          /* B's row stride in bytes */
    int64_t lpr, lines; /* lines per row, lines in all */
};

static struct pf pf_next(const void *B, int bf, int64_t ldb, int64_t N, int64_t K, int64_t p0,
                         int64_t ks, int64_t j0, int NR)
{
    const size_t es = bf ? 2 : 4;
    struct pf f = {NULL, (size_t)ldb * es, 0, 0};
    if (j0 >= N || p0 >= K) return f;
    const int64_t kc = K - p0 < ks ? K - p0 : ks, rows = N - j0 < NR ? N - j0 : NR;
    f.b = (const char *)B + (size_t)(j0 * ldb + p0) * es;
    f.lpr = (int64_t)(((size_t)kc * es + 63) / 64);
    f.lines = rows * f.lpr;
    return f;
}

T static void pf_lines(const struct pf *f, int64_t l0, int64_t l1)
{
    if (l1 > f->lines) l1 = f->lines;
    for (int64_t l = l0; l < l1; l++)
        _mm_prefetch(f->b + (size_t)(l / f->lpr) * f->ld + (size_t)(l % f->lpr) * 64, _MM_HINT_T0);
}

/* The A block rows i0..i0+M-1, k p0..p0+kc-1 as MR-row micro-panels
 * ap[ib][k][r] (MR <= 8, rows past M zero): the micro-kernel reads it in
 * sequence. */
T static inline __attribute__((always_inline)) void pack_a(int ta, const float *A, int64_t lda,
                                                           int64_t i0, int64_t m, int64_t p0,
                                                           int64_t kc, float *ap, int MR)
{
    for (int64_t ib = 0; ib < m; ib += MR, ap += kc * MR) {
        const int mr = m - ib < MR ? (int)(m - ib) : MR;
        if (ta) {
            for (int64_t k = 0; k < kc; k++) {
                const float *s = A + (p0 + k) * lda + i0 + ib;
                float *d = ap + k * MR;
                for (int r = 0; r < MR; r++) d[r] = r < mr ? s[r] : 0.0f;
            }
            continue;
        }
        const float *row[8];
        for (int r = 0; r < MR; r++) row[r] = A + (i0 + ib + (r < mr ? r : 0)) * lda + p0;
        int64_t k = 0;
        if (mr == MR)
            for (; k + 8 <= kc; k += 8) {
                __m256 v[8];
                for (int r = 0; r < MR; r++) v[r] = _mm256_loadu_ps(row[r] + k);
                for (int r = MR; r < 8; r++) v[r] = _mm256_setzero_ps();
                tr8(v);
                /* 8 floats per k, the last 8 - MR overwritten by the next k
                 * (ap has 8 floats of slack past its end) */
                for (int t = 0; t < 8; t++) _mm256_storeu_ps(ap + (k + t) * MR, v[t]);
            }
        for (; k < kc; k++)
            for (int r = 0; r < MR; r++) ap[k * MR + r] = r < mr ? row[r][k] : 0.0f;
    }
}

/* The packing functions in one noinline instance per form (pack_*_8: the
 * AVX2 form, 6-row and 16-column panels; pack_*_16: the AVX-512 form, 8
 * and 32), the panel widths compile-time constants: with MR and NR runtime
 * values the AVX2 form executed 4% more instructions (callgrind, the
 * layer's four GEMM shapes at 64 rows). */
#define FORM(W, MR_, NR_)                                                                      \
    T __attribute__((noinline)) static void pack_a_##W(int ta, const float *A, int64_t lda,     \
                                                       int64_t i0, int64_t m, int64_t p0,       \
                                                       int64_t kc, float *ap)                   \
    {                                                                                          \
        pack_a(ta, A, lda, i0, m, p0, kc, ap, MR_);                                            \
    }                                                                                          \
    T __attribute__((noinline)) static void pack_bt_##W(const void *B, int bf, int64_t ldb,     \
                                                        int64_t p0, int64_t kc, int64_t j0,     \
                                                        int nr, float *bp)                      \
    {                                                                                          \
        pack_bt(B, bf, ldb, p0, kc, j0, nr, bp, NR_);                                          \
    }                                                                                          \
    T __attribute__((noinline)) static void pack_bn_##W(const void *B, int bf, int64_t ldb,     \
                                                        int64_t p0, int64_t kc, int64_t j0,     \
                                                        int64_t cols, float *bp)                \
    {                                                                                          \
        pack_bn(B, bf, ldb, p0, kc, j0, cols, bp, NR_);                                        \
    }
FORM(8, 6, 16)
FORM(16, 8, 32)
#undef FORM

/* C[0..mr)[0..nr) (+)= the packed 6 x kc micro-panel ap times the 16-wide
 * panel bp (AVX2).
 * nt: C is written once (no add), not read soon, and its rows are 64-byte
 * aligned: full rows are stored non-temporally (the caller fences).
 * Otherwise C's lines are prefetched first, so that they arrive while the
 * loop runs. */
T __attribute__((noinline)) static void ukr8(int64_t kc, const float *ap, const float *bp, float *C,
                                            int64_t ldc, int add, int nt, int mr, int nr)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    nt = nt && nr == 16;
    if (!nt)
        for (int r = 0; r < mr; r++) {
            _mm_prefetch((const char *)(C + r * ldc), _MM_HINT_T0);
            _mm_prefetch((const char *)(C + r * ldc + nr - 1), _MM_HINT_T0);
        }
    for (int64_t k = 0; k < kc; k++, ap += 6, bp += 16) {
        const __m256 b0 = _mm256_load_ps(bp), b1 = _mm256_load_ps(bp + 8);
        __m256 x;
        x = _mm256_broadcast_ss(ap + 0); c00 = _mm256_fmadd_ps(x, b0, c00); c01 = _mm256_fmadd_ps(x, b1, c01);
        x = _mm256_broadcast_ss(ap + 1); c10 = _mm256_fmadd_ps(x, b0, c10); c11 = _mm256_fmadd_ps(x, b1, c11);
        x = _mm256_broadcast_ss(ap + 2); c20 = _mm256_fmadd_ps(x, b0, c20); c21 = _mm256_fmadd_ps(x, b1, c21);
        x = _mm256_broadcast_ss(ap + 3); c30 = _mm256_fmadd_ps(x, b0, c30); c31 = _mm256_fmadd_ps(x, b1, c31);
        x = _mm256_broadcast_ss(ap + 4); c40 = _mm256_fmadd_ps(x, b0, c40); c41 = _mm256_fmadd_ps(x, b1, c41);
        x = _mm256_broadcast_ss(ap + 5); c50 = _mm256_fmadd_ps(x, b0, c50); c51 = _mm256_fmadd_ps(x, b1, c51);
    }
    __m256 acc[6][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    if (nr == 16) {
        for (int r = 0; r < mr; r++) {
            float *c = C + r * ldc;
            __m256 v0 = acc[r][0], v1 = acc[r][1];
            if (nt) {
                _mm256_stream_ps(c, v0);
                _mm256_stream_ps(c + 8, v1);
                continue;
            }
            if (add) {
                v0 = _mm256_add_ps(_mm256_loadu_ps(c), v0);
                v1 = _mm256_add_ps(_mm256_loadu_ps(c + 8), v1);
            }
            _mm256_storeu_ps(c, v0);
            _mm256_storeu_ps(c + 8, v1);
        }
        return;
    }
    float t[16];
    for (int r = 0; r < mr; r++) {
        float *c = C + r * ldc;
        _mm256_storeu_ps(t, acc[r][0]);
        _mm256_storeu_ps(t + 8, acc[r][1]);
        for (int j = 0; j < nr; j++) c[j] = add ? c[j] + t[j] : t[j];
    }
}

/* The AVX-512F form: an 8 x kc micro-panel times the 32-wide panel bp,
 * 16 zmm accumulators; the same order of operations per C element. */
T512 __attribute__((noinline)) static void ukr16(int64_t kc, const float *ap, const float *bp,
                                                 float *C, int64_t ldc, int add, int nt, int mr,
                                                 int nr)
{
    __m512 c[8][2];
    for (int r = 0; r < 8; r++) c[r][0] = c[r][1] = _mm512_setzero_ps();
    nt = nt && nr == 32;
    if (!nt)
        for (int r = 0; r < mr; r++) {
            _mm_prefetch((const char *)(C + r * ldc), _MM_HINT_T0);
            _mm_prefetch((const char *)(C + r * ldc + 16), _MM_HINT_T0);
            _mm_prefetch((const char *)(C + r * ldc + nr - 1), _MM_HINT_T0);
        }
    for (int64_t k = 0; k < kc; k++, ap += 8, bp += 32) {
        const __m512 b0 = _mm512_load_ps(bp), b1 = _mm512_load_ps(bp + 16);
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            const __m512 x = _mm512_set1_ps(ap[r]);
            c[r][0] = _mm512_fmadd_ps(x, b0, c[r][0]);
            c[r][1] = _mm512_fmadd_ps(x, b1, c[r][1]);
        }
    }
    if (nr == 32) {
        for (int r = 0; r < mr; r++) {
            float *d = C + r * ldc;
            __m512 v0 = c[r][0], v1 = c[r][1];
            if (nt) {
                _mm512_stream_ps(d, v0);
                _mm512_stream_ps(d + 16, v1);
                continue;
            }
            if (add) {
                v0 = _mm512_add_ps(_mm512_loadu_ps(d), v0);
                v1 = _mm512_add_ps(_mm512_loadu_ps(d + 16), v1);
            }
            _mm512_storeu_ps(d, v0);
            _mm512_storeu_ps(d + 16, v1);
        }
        return;
    }
    float t[32];
    for (int r = 0; r < mr; r++) {
        float *d = C + r * ldc;
        _mm512_storeu_ps(t, c[r][0]);
        _mm512_storeu_ps(t + 16, c[r][1]);
        for (int j = 0; j < nr; j++) d[j] = add ? d[j] + t[j] : t[j];
    }
}

/* The K span of one pass over B^T's rows in the AVX-512 form: two K blocks,
 * so that each row of the weights gives 1 KiB in sequence, which the
 * hardware prefetcher follows (one 512-byte block per row packed at half
 * the rate from memory). The AVX2 form keeps one block: its CPUs' L2 is
 * smaller (Zen 3: 512 KiB) than two A blocks. */
enum { SPAN = 2 };

/* ws: the packed A blocks of a span, then (64-byte aligned) the B
 * micro-panels: of B^T a span's, of B one pass's, COLS columns (AVX2) or
 * 2 COLS (AVX-512: 1 KiB of each BF16 row in sequence; measured from
 * memory at 2048 columns: 0.43 ns per value against 0.67 at COLS) */
enum { WS_A = SPAN * MC * KC + 8, WS_B = 2 * COLS * KC };

size_t lrmoe_avx2_gemm_ws(void) { return (size_t)(WS_A + WS_B) * sizeof(float) + 64; }

/* The blocked GEMM in the form wide (a constant in each instance below) */
T static inline __attribute__((always_inline)) void gemm_form(const int wide, float *ws, int ta,
                                                              int tb, int64_t M, int64_t N,
                                                              int64_t K, const float *A,
                                                              int64_t lda, const void *B,
                                                              int b_bf16, int64_t ldb, int acc,
                                                              float *C, int64_t ldc)
{
    const int MR = wide ? 8 : 6, NR = wide ? 32 : 16;
    float *bp = (float *)(((uintptr_t)(ws + WS_A) + 63) & ~(uintptr_t)63);
    /* B^T (weights stored (N,K)): one transposed micro-panel at a time, the
     * next one's source prefetched a part before each micro-kernel call; B
     * stored (K,N): COLS (AVX2) or 2 COLS columns of micro-panels per pass
     * over its rows */
    const int64_t step = tb ? NR : wide ? 2 * COLS : COLS;
    /* C written once, in one K block, and larger than L2 (the weight
     * gradients): non-temporal stores, which skip reading C's lines first,
     * where its rows are 64-byte aligned (every micro-tile's rows then are:
     * tiles start at multiples of 16 columns) */
    const int nt = !acc && K <= KC && (size_t)M * (size_t)N * sizeof *C >= NT_BYTES &&
                   !((uintptr_t)C & 63) && !((ldc * sizeof *C) & 63);
    /* K in spans of nb blocks; per span and M block, A's blocks packed once,
     * each B^T micro-panel packed over the whole span (the C tile then
     * takes the span's blocks in ascending order, as it would one span per
     * block: the same sums in the same order) */
    const int64_t nb = tb && wide ? SPAN : 1, KS = nb * KC;
    for (int64_t s0 = 0; s0 < K; s0 += KS) {
        const int64_t ks = K - s0 < KS ? K - s0 : KS;
        for (int64_t i0 = 0; i0 < M; i0 += MC) {
            const int64_t m = M - i0 < MC ? M - i0 : MC, calls = (m + MR - 1) / MR;
            for (int64_t p0 = s0; p0 < s0 + ks; p0 += KC) {
                const int64_t kc = K - p0 < KC ? K - p0 : KC;
                float *a = ws + (p0 - s0) / KC * MC * KC;
                if (wide) pack_a_16(ta, A, lda, i0, m, p0, kc, a);
                else pack_a_8(ta, A, lda, i0, m, p0, kc, a);
            }
            for (int64_t j0 = 0; j0 < N; j0 += step) {
                const int64_t cols = N - j0 < step ? N - j0 : step;
                for (int64_t p0 = s0; p0 < s0 + ks; p0 += KC) {
                    const int64_t kc = K - p0 < KC ? K - p0 : KC;
                    float *b = bp + (p0 - s0) / KC * KC * NR;
                    if (tb && wide) pack_bt_16(B, b_bf16, ldb, p0, kc, j0, (int)cols, b);
                    else if (tb) pack_bt_8(B, b_bf16, ldb, p0, kc, j0, (int)cols, b);
                    else if (wide) pack_bn_16(B, b_bf16, ldb, p0, kc, j0, cols, bp);
                    else pack_bn_8(B, b_bf16, ldb, p0, kc, j0, cols, bp);
                }
                /* tb: the panel packed next, the next columns', else the first
                 * ones of the next M block or span */
                struct pf f = {NULL, 0, 0, 0};
                if (tb)
                    f = j0 + NR < N   ? pf_next(B, b_bf16, ldb, N, K, s0, KS, j0 + NR, NR)
                        : i0 + MC < M ? pf_next(B, b_bf16, ldb, N, K, s0, KS, 0, NR)
                                      : pf_next(B, b_bf16, ldb, N, K, s0 + KS, KS, 0, NR);
                const int64_t nblk = (ks + KC - 1) / KC, per = (f.lines + calls * nblk - 1) / (calls * nblk);
                int64_t c = 0;
                for (int64_t p0 = s0; p0 < s0 + ks; p0 += KC) {
                    const int64_t kc = K - p0 < KC ? K - p0 : KC;
                    const int add = acc || p0 > 0;
                    const float *a = ws + (p0 - s0) / KC * MC * KC, *b = bp + (p0 - s0) / KC * KC * NR;
                    for (int64_t q = 0; q * NR < cols; q++) {
                        const int64_t jq = j0 + q * NR;
                        const int nr = N - jq < NR ? (int)(N - jq) : NR;
                        for (int64_t ib = 0; ib < m; ib += MR, c++) {
                            if (f.b) pf_lines(&f, c * per, (c + 1) * per);
                            const int mr = m - ib < MR ? (int)(m - ib) : MR;
                            float *c0 = C + (i0 + ib) * ldc + jq;
                            if (wide) ukr16(kc, a + ib * kc, b + q * KC * NR, c0, ldc, add, nt, mr, nr);
                            else ukr8(kc, a + ib * kc, b + q * KC * NR, c0, ldc, add, nt, mr, nr);
                        }
                    }
                }
            }
        }
    }
    if (nt) _mm_sfence();
}

/* The AVX-512 form's C = A B^T with BF16 B stored (N,K) (the forward's
 * x W^T) at up to DM = 64 rows of A, without transposing B into panels:
 * C^T = B A^T. A is transposed once per chunk of K (up to KCH blocks, at
 * [k][DM]); for each strip of DR rows of B (columns of C) and each K block,
 * the strip's rows are widened as they are stored (DR x KC F32, in L1), and
 * the micro-kernel broadcasts them against V vectors of A^T (V = M / 16
 * rounded up): DR x V zmm accumulators. The strip's C^T (ct, DR x DM) takes
 * the block sums in ascending order, from C's values where the sum goes on
 * from C (acc, or a later chunk of K), and is written into C once per
 * chunk. Each C element thus sums its products in ascending k within a
 * block from zero, the block sums added in ascending order: the packed
 * form's operations, so its bits (tests/unit/gemm_test.c compares the
 * forms). Measured on an AMX Xeon with LRMOE_AMX=0 (one expert's x W^T at
 * 64 rows, F=768, D=2048): the packed form spent about a fifth of its time
 * transposing B. LRMOE_AVX2_DIRECT=0 keeps the packed form, for comparison. */
enum { DR = 6, DM = 64, KCH = 8 };
_Static_assert(KCH * KC * DM + DR * KC + DR * DM + 16 <= WS_A + WS_B,
               "the direct form's A^T chunk, weight strip and C^T fit the workspace");

#define DUKR(V)                                                                                \
    T512 __attribute__((noinline)) static void dukr##V(int64_t kc, const float *a,              \
                                                       const float *w, float *ct, int first)    \
    {                                                                                          \
        __m512 c[DR][V];                                                                       \
        _Pragma("GCC unroll 6") for (int j = 0; j < DR; j++)                                   \
            _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) c[j][v] = _mm512_setzero_ps();  \
        for (int64_t k = 0; k < kc; k++, a += DM) {                                            \
            __m512 x[V];                                                                       \
            _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) x[v] = _mm512_load_ps(a + 16 * v); \
            _Pragma("GCC unroll 6") for (int j = 0; j < DR; j++) {                             \
                const __m512 b = _mm512_set1_ps(w[j * KC + k]);                                \
                _Pragma("GCC unroll 4") for (int v = 0; v < V; v++)                            \
                    c[j][v] = _mm512_fmadd_ps(x[v], b, c[j][v]);                               \
            }                                                                                  \
        }                                                                                      \
        _Pragma("GCC unroll 6") for (int j = 0; j < DR; j++)                                   \
            _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) {                              \
                float *d = ct + j * DM + 16 * v;                                               \
                _mm512_store_ps(d, first ? c[j][v] : _mm512_add_ps(_mm512_load_ps(d), c[j][v])); \
            }                                                                                  \
    }
DUKR(1)
DUKR(2)
DUKR(3)
DUKR(4)
#undef DUKR

T512 __attribute__((noinline)) static void direct_nt(float *ws, int64_t M, int64_t N, int64_t K,
                                                     const float *A, int64_t lda,
                                                     const uint16_t *B, int64_t ldb, int acc,
                                                     float *C, int64_t ldc)
{
    const int V = (int)((M + 15) / 16);
    float *at = (float *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);   /* KCH KC x DM */
    float *w = at + KCH * KC * DM;                                     /* DR x KC */
    float *ct = w + DR * KC;                                           /* DR x DM */
    for (int64_t c0 = 0; c0 < K; c0 += KCH * KC) {
        const int64_t kch = K - c0 < KCH * KC ? K - c0 : KCH * KC;
        /* A^T of this chunk: 16 rows by 16 k at a time, rows past M and k
         * past the chunk zero */
        for (int g = 0; g < V; g++)
            for (int64_t k = 0; k < kch; k += 16) {
                const __mmask16 mk = kch - k >= 16 ? 0xFFFF : (__mmask16)((1u << (kch - k)) - 1);
                __m512i r[16];
                for (int i = 0; i < 16; i++)
                    r[i] = 16 * g + i < M
                               ? _mm512_castps_si512(_mm512_maskz_loadu_ps(
                                     mk, A + (16 * g + i) * lda + c0 + k))
                               : _mm512_setzero_si512();
                lrmoe_tr16(r);
                for (int t = 0; t < 16; t++)
                    _mm512_store_si512((__m512i *)(at + (k + t) * DM + 16 * g), r[t]);
            }
        for (int64_t j0 = 0; j0 < N; j0 += DR) {
            const int nr = N - j0 < DR ? (int)(N - j0) : DR;
            if (acc || c0 > 0)
                for (int j = 0; j < DR; j++)
                    for (int64_t r = 0; r < 16 * V; r++)
                        ct[j * DM + r] = j < nr && r < M ? C[r * ldc + j0 + j] : 0.0f;
            for (int64_t p0 = c0; p0 < c0 + kch; p0 += KC) {
                const int64_t kc = K - p0 < KC ? K - p0 : KC;
                for (int j = 0; j < DR; j++) {
                    const uint16_t *src = B + (j0 + (j < nr ? j : nr - 1)) * ldb + p0;
                    float *d = w + j * KC;
                    int64_t k = 0;
                    for (; k + 16 <= kc; k += 16) _mm512_store_ps(d + k, lrmoe_f32_16(src + k));
                    for (; k < kc; k++) d[k] = bval(src, 1, k);
                }
                const float *a = at + (p0 - c0) * DM;
                const int first = !acc && p0 == 0;
                switch (V) {
                case 1: dukr1(kc, a, w, ct, first); break;
                case 2: dukr2(kc, a, w, ct, first); break;
                case 3: dukr3(kc, a, w, ct, first); break;
                default: dukr4(kc, a, w, ct, first); break;
                }
            }
            for (int64_t r = 0; r < M; r++)
                for (int j = 0; j < nr; j++) C[r * ldc + j0 + j] = ct[j * DM + r];
        }
    }
}

T __attribute__((noinline)) static void gemm_8(float *ws, int ta, int tb, int64_t M, int64_t N,
                                               int64_t K, const float *A, int64_t lda,
                                               const void *B, int b_bf16, int64_t ldb, int acc,
                                               float *C, int64_t ldc)
{
    gemm_form(0, ws, ta, tb, M, N, K, A, lda, B, b_bf16, ldb, acc, C, ldc);
}

T __attribute__((noinline)) static void gemm_16(float *ws, int ta, int tb, int64_t M, int64_t N,
                                                int64_t K, const float *A, int64_t lda,
                                                const void *B, int b_bf16, int64_t ldb, int acc,
                                                float *C, int64_t ldc)
{
    if (tb && !ta && b_bf16 && M <= DM && wide_direct)   /* set: gemm_16 runs after wide_probe */
        direct_nt(ws, M, N, K, A, lda, B, ldb, acc, C, ldc);
    else gemm_form(1, ws, ta, tb, M, N, K, A, lda, B, b_bf16, ldb, acc, C, ldc);
}

void lrmoe_avx2_gemm_w(int wide, float *ws, int ta, int tb, int64_t M, int64_t N, int64_t K,
                       const float *A, int64_t lda, const void *B, int b_bf16, int64_t ldb,
                       int acc, float *C, int64_t ldc)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!acc)
            for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, (size_t)N * sizeof *C);
        return;
    }
    if (wide && lrmoe_avx2_gemm_wide()) gemm_16(ws, ta, tb, M, N, K, A, lda, B, b_bf16, ldb, acc, C, ldc);
    else gemm_8(ws, ta, tb, M, N, K, A, lda, B, b_bf16, ldb, acc, C, ldc);
}

void lrmoe_avx2_gemm(float *ws, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A,
                     int64_t lda, const void *B, int b_bf16, int64_t ldb, int acc, float *C,
                     int64_t ldc)
{
    lrmoe_avx2_gemm_w(1, ws, ta, tb, M, N, K, A, lda, B, b_bf16, ldb, acc, C, ldc);
}

#else /* not x86: never available; lib/gemm_cpu.c then uses OpenBLAS */

int lrmoe_avx2_gemm_available(void) { return 0; }

int lrmoe_avx2_gemm_wide(void) { return 0; }

double lrmoe_avx2_fma_over_bf16dot(void) { return 0; }

void lrmoe_avx2_peak_rates(double *fma, double *dot) { *fma = 0; *dot = 0; }

size_t lrmoe_avx2_gemm_ws(void) { return 0; }

void lrmoe_avx2_gemm(float *ws, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A,
                     int64_t lda, const void *B, int b_bf16, int64_t ldb, int acc, float *C,
                     int64_t ldc)
{
    (void)ws; (void)ta; (void)tb; (void)M; (void)N; (void)K; (void)A; (void)lda; (void)B; (void)b_bf16;
    (void)ldb; (void)acc; (void)C; (void)ldc;
    abort();
}

void lrmoe_avx2_gemm_w(int wide, float *ws, int ta, int tb, int64_t M, int64_t N, int64_t K,
                       const float *A, int64_t lda, const void *B, int b_bf16, int64_t ldb,
                       int acc, float *C, int64_t ldc)
{
    (void)wide;
    lrmoe_avx2_gemm(ws, ta, tb, M, N, K, A, lda, B, b_bf16, ldb, acc, C, ldc);
}
#endif
