/* BF16 GEMM on AVX512_BF16 (vdpbf16ps), outer-product form. See gemm_dpbf16.h. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "gemm_dpbf16.h"
#include "grow.h"
#include "lrmoe.h"

#if defined(__x86_64__) && defined(__GNUC__) && __GNUC__ >= 10
#define HAVE_DPBF16_BUILD 1
#include <immintrin.h>
#include "simd_bf16.h"
#include "simd_tr16.h"
#define DPT __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#endif

/* the C tile: MR rows of NR = 64 columns (4 zmm) */
enum { MR = 6, NR = 64 };
#ifndef NT_DIRECT_M
#define NT_DIRECT_M 96
#endif
#ifndef ABLOCK
#define ABLOCK (512 << 10)
#endif
#ifndef PFD
#define PFD 128
#endif

struct lrmoe_dpbf16 {
    uint32_t *A;          /* op(A) as pairs: row m, pair p at A[m * ams + p * aps] */
    size_t acap;
    uint32_t *B;          /* one panel of op(B): pair p, column j at B[p * NR + j] */
    size_t bcap;
    uint16_t *t;          /* F32 operands rounded to BF16, a few rows at a time */
    size_t tcap;
};

static pthread_once_t dp_once = PTHREAD_ONCE_INIT;
static int dp_ok;

static void dp_probe(void)
{
#ifdef HAVE_DPBF16_BUILD
    const char *e = getenv("LRMOE_DPBF16");
    if (e && !strcmp(e, "0")) return;
    __builtin_cpu_init();
    dp_ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
#endif
}

int lrmoe_dpbf16_available(void)
{
    pthread_once(&dp_once, dp_probe);
    return dp_ok;
}

lrmoe_dpbf16_t *lrmoe_dpbf16_new(void)
{
    lrmoe_dpbf16_t *x = calloc(1, sizeof *x);
    if (!x) lrmoe_err("gemm: out of memory");
    return x;
}

void lrmoe_dpbf16_free(lrmoe_dpbf16_t *x)
{
    if (!x) return;
    free(x->A);
    free(x->B);
    free(x->t);
    free(x);
}


#ifdef HAVE_DPBF16_BUILD

/* rows r0 and r1 (r1 NULL: zeros) of n BF16 values, interleaved into n dwords
 * (r0[j] low, r1[j] high), then zeros up to nout dwords */
DPT static void interleave2(const uint16_t *r0, const uint16_t *r1, int64_t n, uint32_t *dst,
                            int64_t nout)
{
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                        40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                        32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    int64_t j = 0;
    for (; j < nout; j += 32) {
        const int64_t left = n - j;
        __mmask32 m = left >= 32 ? 0xffffffffu : left <= 0 ? 0 : (__mmask32)((1u << left) - 1);
        __m512i a = _mm512_maskz_loadu_epi16(m, r0 + j);
        __m512i b = r1 ? _mm512_maskz_loadu_epi16(m, r1 + j) : _mm512_setzero_si512();
        const int64_t o = nout - j;
        __mmask16 m0 = o >= 16 ? 0xffff : (__mmask16)((1u << o) - 1);
        __mmask16 m1 = o >= 32 ? 0xffff : o <= 16 ? 0 : (__mmask16)((1u << (o - 16)) - 1);
        _mm512_mask_storeu_epi32(dst + j, m0, _mm512_permutex2var_epi16(a, lo, b));
        if (m1) _mm512_mask_storeu_epi32(dst + j + 16, m1, _mm512_permutex2var_epi16(a, hi, b));
    }
}

/* rows of F32 to BF16 scratch, or the BF16 rows as they are: n values of
 * row r of src (row stride ld) */
static const uint16_t *bf16_row(lrmoe_dpbf16_t *x, const void *src, int f32, int64_t ld,
                                int64_t r, int64_t c0, int64_t n, int slot)
{
    if (!f32) return (const uint16_t *)src + r * ld + c0;
    uint16_t *t = x->t + (size_t)slot * (size_t)(x->tcap / 2 / 16);
    lrmoe_convert_from_f32(LRMOE_BF16, (const float *)src + r * ld + c0, t, (size_t)n);
    return t;
}

/* op(A) into x->A; *ams, *aps: dword strides of a row and of a pair */
static int pack_a(lrmoe_dpbf16_t *x, int ta, int64_t M, int64_t K, const void *A, int f32,
                  int64_t lda, int64_t *ams, int64_t *aps)
{
    const int64_t K2 = (K + 1) / 2;
    if (!ta) {
        /* rows on a stride 64 bytes off a multiple of 64: consecutive rows in
         * consecutive L1 sets */
        const int64_t S = (K2 + 15) / 16 * 16 + 16;
        if (!lrmoe_grow64((void **)&x->A, &x->acap, (size_t)(M * S) * 4)) return -1;
        for (int64_t m = 0; m < M; m++) {
            uint16_t *d = (uint16_t *)(x->A + m * S);
            if (f32) lrmoe_convert_from_f32(LRMOE_BF16, (const float *)A + m * lda, d, (size_t)K);
            else memcpy(d, (const uint16_t *)A + m * lda, (size_t)K * 2);
            if (K & 1) d[K] = 0;
        }
        *ams = S; *aps = 1;
        return 0;
    }
    /* A stored (K,M): pair p of row m = (A[2p][m], A[2p+1][m]) */
    const int64_t S = (M + 15) / 16 * 16 + 16;
    if (!lrmoe_grow64((void **)&x->A, &x->acap, (size_t)(K2 * S) * 4)) return -1;
    for (int64_t p = 0; p < K2; p++) {
        const uint16_t *r0 = bf16_row(x, A, f32, lda, 2 * p, 0, M, 0);
        const uint16_t *r1 = 2 * p + 1 < K ? bf16_row(x, A, f32, lda, 2 * p + 1, 0, M, 1) : NULL;
        interleave2(r0, r1, M, x->A + p * S, M);
    }
    *ams = 1; *aps = S;
    return 0;
}

/* rows r0 .. r0+w-1 of src (K values each, row stride ld) transposed by
 * pairs: pair p of row r0+i goes to P[p * S + i], for i < W (a multiple
 * of 16; zeros past w): 16 rows x 16 pairs at a time */
DPT static void tpack(lrmoe_dpbf16_t *x, const void *src, int f32, int64_t ld, int64_t r0,
                      int64_t w, int64_t K, uint32_t *P, int64_t S, int64_t W)
{
    const int64_t K2 = (K + 1) / 2;
    for (int64_t g = 0; g < W; g += 16) {
        const uint16_t *row[16];
        for (int i = 0; i < 16; i++) {
            const int64_t n = g + i;
            row[i] = n < w ? bf16_row(x, src, f32, ld, r0 + n, 0, K, i) : NULL;
        }
        for (int64_t p = 0; p < K2; p += 16) {
            const int64_t left = K - 2 * p;
            const __mmask32 m = left >= 32 ? 0xffffffffu : (__mmask32)((1u << left) - 1);
            __m512i r[16];
            for (int i = 0; i < 16; i++) /* a few lines ahead: the rows are 16 streams */
                if (row[i]) /* an address, possibly past the row: no pointer arithmetic */
                    _mm_prefetch((const char *)((uintptr_t)row[i] + (uintptr_t)(2 * p + PFD) * 2),
                                 _MM_HINT_T0);
            for (int i = 0; i < 16; i++)
                r[i] = row[i] ? _mm512_maskz_loadu_epi16(m, row[i] + 2 * p) : _mm512_setzero_si512();
            lrmoe_tr16(r);
            const int64_t np = K2 - p < 16 ? K2 - p : 16;
            for (int64_t j = 0; j < np; j++)
                _mm512_store_si512((__m512i *)(P + (p + j) * S + g), r[j]);
        }
    }
}

/* columns n0 .. n0+w-1 of op(B) into the panel x->B (NR columns, zeros past w) */
DPT static void pack_b(lrmoe_dpbf16_t *x, int tb, int64_t K, const void *B, int f32, int64_t ldb,
                       int64_t n0, int64_t w)
{
    const int64_t K2 = (K + 1) / 2;
    uint32_t *P = x->B;
    if (!tb) {
        /* B stored (K,N): pair p = rows 2p and 2p+1 interleaved */
        for (int64_t p = 0; p < K2; p++) {
            const uint16_t *r0 = bf16_row(x, B, f32, ldb, 2 * p, n0, w, 0);
            const uint16_t *r1 = 2 * p + 1 < K ? bf16_row(x, B, f32, ldb, 2 * p + 1, n0, w, 1)
                                               : NULL;
            interleave2(r0, r1, w, P + p * NR, NR);
        }
        return;
    }
    /* B stored (N,K): a pair of row n is one dword */
    tpack(x, B, f32, ldb, n0, w, K, P, NR, NR);
}

/* The source lines of the next panel of B, prefetched into L2 one per step
 * of the micro-kernels that use the current panel, so that packing it reads
 * cache: rows of lpr lines, stride bytes apart. */
typedef struct {
    const char *p;
    int64_t stride, rows;
    int lpr, l;
} pfc_t;

static inline void pf_step(pfc_t *c)
{
    if (c->rows <= 0) return;
    _mm_prefetch(c->p + 64 * c->l, _MM_HINT_T1);
    if (++c->l == c->lpr) {
        c->l = 0;
        c->p += c->stride;
        c->rows--;
    }
}

/* the source of columns n0 .. n0+w-1 of op(B) (see pack_b) as a cursor */
static pfc_t pf_panel(int tb, int64_t K, const void *B, int f32, int64_t ldb, int64_t n0,
                      int64_t w)
{
    const int64_t es = f32 ? 4 : 2;
    pfc_t c = {NULL, ldb * es, 0, 0, 0};
    if (w <= 0) return c;
    if (!tb) { /* K rows, w values each from column n0 */
        c.p = (const char *)B + n0 * es;
        c.rows = K;
        c.lpr = (int)((w * es + 63) / 64) + 1;   /* + 1: a row need not start a line */
    } else {   /* w rows of K values */
        c.p = (const char *)B + n0 * ldb * es;
        c.rows = w;
        c.lpr = (int)((K * es + 63) / 64) + 1;
    }
    c.p = (const char *)((uintptr_t)c.p & ~(uintptr_t)63);
    return c;
}

/* how a micro-kernel stores C: F32, F32 by non-temporal stores, or
 * rounded to BF16 (C = BF16(A B^T), no acc) */
enum { OUT_F32, OUT_NT, OUT_BF16 };

/* C rows m0.. (mr of them) x the panel's nv valid columns (of NR) =
 * [C +] sum over pairs of A's pairs x the panel */
#define UNROLL _Pragma("GCC unroll 8")
#define UK_BODY(R)                                                                            \
    float *C = (float *)Cv;   /* OUT_BF16: Cv is BF16, ldc in its elements */                 \
    __m512 c[R][4];                                                                           \
    const __mmask16 sm[4] = {                                                                 \
        nv >= 16 ? 0xffff : (__mmask16)((1u << nv) - 1),                                      \
        nv >= 32 ? 0xffff : nv <= 16 ? 0 : (__mmask16)((1u << (nv - 16)) - 1),                \
        nv >= 48 ? 0xffff : nv <= 32 ? 0 : (__mmask16)((1u << (nv - 32)) - 1),                \
        nv >= 64 ? 0xffff : nv <= 48 ? 0 : (__mmask16)((1u << (nv - 48)) - 1)};               \
    UNROLL for (int i = 0; i < R; i++)                                                        \
        UNROLL for (int j = 0; j < 4; j++)                                                    \
            c[i][j] = acc ? _mm512_maskz_loadu_ps(sm[j], C + i * ldc + 16 * j)                \
                          : _mm512_setzero_ps();                                              \
    const uint32_t *ap = a;                                                                   \
    const uint32_t *bp = b;                                                                   \
    for (int64_t p = 0; p < K2; p++) {                                                        \
        const __m512bh b0 = (__m512bh)_mm512_load_si512((const void *)bp);                    \
        const __m512bh b1 = (__m512bh)_mm512_load_si512((const void *)(bp + 16));             \
        const __m512bh b2 = (__m512bh)_mm512_load_si512((const void *)(bp + 32));             \
        const __m512bh b3 = (__m512bh)_mm512_load_si512((const void *)(bp + 48));             \
        UNROLL for (int i = 0; i < R; i++) {                                                  \
            const __m512bh v = (__m512bh)_mm512_set1_epi32((int)ap[i * ams]);                 \
            c[i][0] = _mm512_dpbf16_ps(c[i][0], v, b0);                                       \
            c[i][1] = _mm512_dpbf16_ps(c[i][1], v, b1);                                       \
            c[i][2] = _mm512_dpbf16_ps(c[i][2], v, b2);                                       \
            c[i][3] = _mm512_dpbf16_ps(c[i][3], v, b3);                                       \
        }                                                                                     \
        ap += aps;                                                                            \
        bp += NR;                                                                             \
        pf_step(pf);                                                                          \
    }                                                                                         \
    if (out == OUT_BF16) {                                                                    \
        UNROLL for (int i = 0; i < R; i++)                                                    \
            UNROLL for (int j = 0; j < 4; j++)                                                \
                if (sm[j]) _mm256_mask_storeu_epi16((uint16_t *)Cv + i * ldc + 16 * j, sm[j], \
                                            lrmoe_bf16_16(_mm512_castps_si512(c[i][j])));     \
    } else if (out == OUT_NT && nv == NR) /* whole lines, 64-byte aligned (see the caller) */   \
        UNROLL for (int i = 0; i < R; i++)                                                    \
            UNROLL for (int j = 0; j < 4; j++)                                                \
                _mm512_stream_ps(C + i * ldc + 16 * j, c[i][j]);                              \
    else                                                                                      \
        UNROLL for (int i = 0; i < R; i++)                                                    \
            UNROLL for (int j = 0; j < 4; j++)                                                \
                if (sm[j]) _mm512_mask_storeu_ps(C + i * ldc + 16 * j, sm[j], c[i][j]);

#define UK(R)                                                                                 \
    DPT static void uk##R(int64_t K2, const uint32_t *a, int64_t ams, int64_t aps,           \
                          const uint32_t *b, void *Cv, int64_t ldc, int nv, int acc, int out, \
                          pfc_t *pf)                                                          \
    {                                                                                         \
        UK_BODY(R)                                                                            \
    }
UK(1)
UK(2)
UK(3)
UK(4)
UK(5)
UK(6)

/* The stored-weights form of C = A B^T (B stored (N,K), the forward's
 * x W^T): C^T = B A^T with the pairs of B's rows broadcast from where they
 * are stored (no packing of the weights) against A transposed by pairs
 * (A^T: pair p of row m at a[p * S + m]). A tile is R rows of B (R <= 6: six
 * 4 KiB-strided rows stay in an 8-way L1 set) by J vectors of 16 rows of A
 * (mv valid); it is transposed into C on the way out. The same vdpbf16ps
 * steps on the same pairs in the same order as the packed form: the same
 * bits. */
static inline uint32_t ld32(const uint16_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

#define J1(J) ((J) ? (J) : 1)
#define UKT_BODY(R, J, H)                                                                     \
    __m512 c[R][J1(J)];                                                                       \
    __m256 h[R];                                                                              \
    float T[R][96] __attribute__((aligned(64)));                                              \
    if (acc) {                                                                                \
        for (int i = 0; i < R; i++)                                                           \
            for (int m = 0; m < 16 * J + 8 * H; m++) T[i][m] = m < mv ? C[m * ldc + i] : 0.0f; \
        UNROLL for (int i = 0; i < R; i++) {                                                  \
            UNROLL for (int j = 0; j < J; j++) c[i][j] = _mm512_load_ps(&T[i][16 * j]);      \
            if (H) h[i] = _mm256_load_ps(&T[i][16 * J]);                                      \
        }                                                                                     \
    } else {                                                                                  \
        UNROLL for (int i = 0; i < R; i++) {                                                  \
            UNROLL for (int j = 0; j < J; j++) c[i][j] = _mm512_setzero_ps();                \
            if (H) h[i] = _mm256_setzero_ps();                                                \
        }                                                                                     \
    }                                                                                         \
    const int64_t K2 = (K + 1) / 2, K2f = K / 2;                                              \
    const uint32_t *ap = a;                                                                   \
    for (int64_t p = 0; p < K2; p++) {                                                        \
        __m512bh v[J1(J)];                                                                    \
        __m256bh vh = (__m256bh)_mm256_setzero_si256();                                       \
        UNROLL for (int j = 0; j < J; j++)                                                    \
            v[j] = (__m512bh)_mm512_load_si512((const void *)(ap + 16 * j));                  \
        if (H) vh = (__m256bh)_mm256_load_si256((const __m256i *)(ap + 16 * J));              \
        UNROLL for (int i = 0; i < R; i++) {                                                  \
            /* an odd K's last pair: B's second half is past the row (A's is 0) */             \
            const uint32_t bw = p < K2f ? ld32(b + i * ldb + 2 * p) : b[i * ldb + K - 1];     \
            const __m512bh w = (__m512bh)_mm512_set1_epi32((int)bw);                          \
            UNROLL for (int j = 0; j < J; j++) c[i][j] = _mm512_dpbf16_ps(c[i][j], w, v[j]);  \
            if (H) h[i] = _mm256_dpbf16_ps(h[i], (__m256bh)_mm512_castsi512_si256((__m512i)w), vh); \
        }                                                                                     \
        ap += S;                                                                              \
        if (p < npf) _mm_prefetch(pf + 64 * p, _MM_HINT_T0);                                  \
    }                                                                                         \
    if (ct) { /* C^T rows into the chunk buffer, transposed later */                          \
        UNROLL for (int i = 0; i < R; i++) {                                                  \
            UNROLL for (int j = 0; j < J; j++) _mm512_store_ps(ct + i * ctl + 16 * j, c[i][j]); \
            if (H) _mm256_store_ps(ct + i * ctl + 16 * J, h[i]);                              \
        }                                                                                     \
        return;                                                                               \
    }                                                                                         \
    /* 16 rows of C at a time: R columns of 16 transposed into 16 rows of R */                \
    UNROLL for (int j = 0; j < J + H; j++) {                                                  \
        __m512i t[16];                                                                        \
        UNROLL for (int i = 0; i < 16; i++)                                                   \
            t[i] = i >= R ? _mm512_setzero_si512()                                            \
                   : j < J ? _mm512_castps_si512(c[i < R ? i : 0][j < J ? j : 0])             \
                           : _mm512_castps_si512(_mm512_zextps256_ps512(h[i < R ? i : 0])); \
        lrmoe_tr16(t);                                                                        \
        const int l1 = mv - 16 * j < 16 ? mv - 16 * j : 16;                                   \
        for (int l = 0; l < l1; l++)                                                          \
            _mm512_mask_storeu_ps(C + (16 * j + l) * ldc, (__mmask16)((1u << R) - 1),         \
                                  _mm512_castsi512_ps(t[l]));                                 \
    }

/* a tile of R rows of B by 8q rows of A (q = 2J + H: J zmm and H ymm of
 * A's rows; vdpbf16ps on ymm runs at the zmm's FLOP rate on Zen 4, so a
 * tail of up to 8 rows costs half a zmm's) */
#define UKT(R, J, H)                                                                          \
    DPT static void ukt##R##J##H(int64_t K, const uint16_t *b, int64_t ldb, const uint32_t *a, \
                                 int64_t S, float *C, int64_t ldc, int mv, int acc,           \
                                 const char *pf, int64_t npf, float *ct, int64_t ctl)         \
    {                                                                                         \
        UKT_BODY(R, J, H)                                                                     \
    }
#define UKT8(R) UKT(R, 0, 1) UKT(R, 1, 0) UKT(R, 1, 1) UKT(R, 2, 0) UKT(R, 2, 1) UKT(R, 3, 0) \
    UKT(R, 3, 1) UKT(R, 4, 0)
UKT8(1)
UKT8(2)
UKT8(3)
UKT8(4)
UKT8(5)
UKT8(6)
/* 65 to 96 rows of A in one pass: tiles of at most 4 rows of B */
#define UKT12(R) UKT(R, 4, 1) UKT(R, 5, 0) UKT(R, 5, 1) UKT(R, 6, 0)
UKT12(1)
UKT12(2)
UKT12(3)
UKT12(4)

typedef void (*ukt_fn)(int64_t, const uint16_t *, int64_t, const uint32_t *, int64_t, float *,
                       int64_t, int, int, const char *, int64_t, float *, int64_t);

/* rows n0 .. n0+nn-1 of C^T (ct, row stride ctl, columns 0 .. M-1) into
 * columns n0.. of C: 16x16 blocks, whole 16-float rows where they fit */
DPT static void ct_out(const float *ct, int64_t ctl, int64_t nn, int64_t M, float *C,
                       uint16_t *Cb, int64_t ldc, int64_t n0)
{
    for (int64_t m = 0; m < M; m += 16) {
        const int lm = M - m < 16 ? (int)(M - m) : 16;
        for (int64_t n = 0; n < nn; n += 16) {
            const int ln = nn - n < 16 ? (int)(nn - n) : 16;
            __m512i t[16];
            for (int i = 0; i < 16; i++)
                t[i] = i < ln ? _mm512_load_si512((const void *)(ct + (n + i) * ctl + m))
                              : _mm512_setzero_si512();
            lrmoe_tr16(t);
            const __mmask16 k = ln == 16 ? 0xffff : (__mmask16)((1u << ln) - 1);
            if (Cb) /* rounded to BF16 on the way out, as lrmoe_gemm_to_bf16 rounds */
                for (int l = 0; l < lm; l++)
                    _mm256_mask_storeu_epi16(Cb + (m + l) * ldc + n0 + n, k, lrmoe_bf16_16(t[l]));
            else
                for (int l = 0; l < lm; l++)
                    _mm512_mask_storeu_ps(C + (m + l) * ldc + n0 + n, k, _mm512_castsi512_ps(t[l]));
        }
    }
}
#define UKTQ(R) {NULL, ukt##R##01, ukt##R##10, ukt##R##11, ukt##R##20, ukt##R##21, ukt##R##30, \
                 ukt##R##31, ukt##R##40}
#define UKTQ12(R) {NULL, ukt##R##01, ukt##R##10, ukt##R##11, ukt##R##20, ukt##R##21, ukt##R##30, \
                   ukt##R##31, ukt##R##40, ukt##R##41, ukt##R##50, ukt##R##51, ukt##R##60}
/* ukt[R][q]: R rows of B by 8q rows of A (q <= 8, R <= 6; q <= 12, R <= 4) */
static const ukt_fn ukt[MR + 1][13] = {{NULL}, UKTQ12(1), UKTQ12(2), UKTQ12(3), UKTQ12(4), UKTQ(5),
                                       UKTQ(6)};

/* A pass over the tiles of B takes up to 96 rows of A (NT_DIRECT_M: every
 * row in one pass), in tiles of 6 rows of B up to 64 rows of A and of 4
 * beyond (24 accumulators): a second pass for a few rows past 64 ran
 * latency-bound on 6 accumulators (72 rows: 191 against 204 GFLOP/s for
 * one pass, tests/bench/gemm_kernel.c nt 72 1536 2048) */
enum { PASS_M = 96 };
static inline int64_t pass_rows(int64_t left) { return left < PASS_M ? left : PASS_M; }
static inline int64_t tile_rows(int64_t pass) { return pass > 64 ? 4 : MR; }

/* the rows of A a block of the direct form takes: its pairs (K2 x mb x 4
 * bytes, at most ABLOCK) stay in L2 while every tile of B passes */
static int64_t direct_block(int64_t M, int64_t K)
{
    int64_t mb = ABLOCK / (((K + 1) / 2) * 4) / 64 * 64;
    if (mb < 64) mb = 64;
    return M <= mb ? M : mb;
}

/* the direct form's rows of A padded to whole vectors of 16 lanes */
static inline int64_t direct_rows(int64_t M) { return (M + 15) / 16 * 16; }

/* the direct form can round C to BF16 on its way out: C overwritten by one
 * block of rows, through the C^T buffer */
static int direct_ct(int64_t M, int64_t K)
{
    return direct_block(M, K) == M && direct_rows(M) <= PASS_M;
}

/* the direct form's A^T (pair p of row m at x->A[p * S + m]): its S */
static int64_t direct_stride(int64_t M)
{
    const int64_t MP = direct_rows(M);
    return MP % 256 ? MP : MP + 16;   /* pairs not 1 KiB apart */
}

/* A (M,K) transposed by pairs into x->A for direct_run */
static int direct_pack(lrmoe_dpbf16_t *x, int64_t M, int64_t K, const void *A, int a_f32,
                       int64_t lda)
{
    const int64_t K2 = (K + 1) / 2, S = direct_stride(M);
    if (!lrmoe_grow64((void **)&x->A, &x->acap, (size_t)(K2 * S) * 4)) return -1;
    tpack(x, A, a_f32, lda, 0, M, K, x->A, S, direct_rows(M));
    return 0;
}

/* C = A B^T with A packed by direct_pack, B BF16 stored (N,K); Cb non-NULL
 * (direct_ct, no acc): C rounded to BF16 into Cb instead (C unused) */
static void direct_run(lrmoe_dpbf16_t *x, int64_t M, int64_t N, int64_t K, const uint16_t *B,
                       int64_t ldb, int acc, float *C, uint16_t *Cb, int64_t ldc)
{
    const int64_t MP = direct_rows(M), S = direct_stride(M);
    /* blocks of rows of A (direct_block); B is read again per block (from
     * L3 after the first: one expert's weights fit) */
    const int64_t mb = direct_block(M, K);
    /* C overwritten by one block of rows: the tiles' C^T rows go to a
     * chunk of CTN rows of C^T (L1) instead of each tile storing 4 to 6
     * floats into every row of C (rows 8 KiB apart in the forward's W_down
     * GEMM: one L1 set), and the chunk goes into C by whole 16-float rows
     * when full; the same values. With the one-pass tiles: the forward's
     * gemm stage at 1024 tokens 0.394-0.406 s against 0.418-0.437 s before
     * (8 frames of each, alternated in one process; 2048 tokens unchanged) */
    enum { CTN = 48 };
    _Static_assert(CTN % MR == 0 && CTN % 4 == 0, "a chunk holds whole tiles");
    static _Thread_local float ctb[CTN * PASS_M] __attribute__((aligned(64)));
    const int use_ct = !acc && direct_ct(M, K);
    for (int64_t m1 = 0; m1 < M; m1 += mb) {
        const int64_t me = M - m1 < mb ? M : m1 + mb;
        const int64_t mr = tile_rows(pass_rows(me - m1));
        int64_t c0 = 0;   /* the first row of C^T in ctb */
        for (int64_t n0 = 0; n0 < N; n0 += mr) {
            const int64_t r = N - n0 < mr ? N - n0 : mr;
            /* the next tile's rows of B into L1 while this one computes (rows of
             * a few lines are too short for the hardware prefetcher) */
            const int64_t r2 = N - n0 - mr < mr ? N - n0 - mr : mr;
            const char *pf = r2 > 0 ? (const char *)((uintptr_t)(B + (n0 + mr) * ldb) &
                                                     ~(uintptr_t)63)
                                    : NULL;
            const int64_t npf = r2 > 0 ? ((r2 - 1) * ldb + K) * 2 / 64 + 2 : 0;
            for (int64_t m0 = m1, mv; m0 < me; m0 += mv) {
                mv = pass_rows(me - m0);
                ukt[r][(mv + 7) / 8](K, B + n0 * ldb, ldb, x->A + m0, S, C + m0 * ldc + n0,
                                       ldc, (int)mv, acc, pf, m0 == m1 ? npf : 0,
                                       use_ct ? ctb + (n0 - c0) * MP + m0 : NULL, MP);
            }
            if (use_ct && (n0 + r - c0 == CTN || n0 + r == N)) {
                ct_out(ctb, MP, n0 + r - c0, M, C, Cb, ldc, c0);
                c0 = n0 + r;
            }
        }
    }
}

static int gemm_nt_direct(lrmoe_dpbf16_t *x, int64_t M, int64_t N, int64_t K, const void *A,
                          int a_f32, int64_t lda, const uint16_t *B, int64_t ldb, int acc,
                          float *C, uint16_t *Cb, int64_t ldc)
{
    if (direct_pack(x, M, K, A, a_f32, lda) < 0) return -1;
    direct_run(x, M, N, K, B, ldb, acc, C, Cb, ldc);
    return 0;
}

typedef void (*uk_fn)(int64_t, const uint32_t *, int64_t, int64_t, const uint32_t *, void *,
                      int64_t, int, int, int, pfc_t *);
static const uk_fn ukern[MR + 1] = {NULL, uk1, uk2, uk3, uk4, uk5, uk6};

/* the conversion rows of F32 operands: 16 of the longest row one has */
static int grow_t(lrmoe_dpbf16_t *x, int64_t M, int64_t K)
{
    const int64_t n = K > M ? K : M, trow = n > NR ? n : NR;
    return lrmoe_grow64((void **)&x->t, &x->tcap, (size_t)(16 * trow) * 2) != NULL;
}

/* x W^T by the direct form for up to NT_DIRECT_M rows of A (in the layer
 * it beat packing at 64 rows per expert, 0.408 against 0.418 s of forward
 * gemm stage at 1024 tokens, and lost at 128 and 256: 0.80 against 0.77 s,
 * 1.64 against 1.47 s). Tried for 97-192 rows of the gate/up shape (K >=
 * 8M) with two passes of about M/2 rows each (starting on 16-row bounds)
 * and the C^T chunk: alone it beat packing (nt 128 768 2048 with cold
 * weights, tests/bench/gemm_kernel.c: 205-209 against 185-198 GFLOP/s),
 * but not in the layer: 2048-token forward gemm stage, frames alternated
 * in one process, faster in 1 of 6 pairs and 1.007x the time in all (perf:
 * the direct kernels' samples grew by about what tpack's fell) */
static int use_direct(int64_t M)
{
    return M <= NT_DIRECT_M && !getenv("LRMOE_DPBF16_PACKNT");
}

/* The packed form's panels of op(B) against op(A) packed by pack_a (row
 * and pair strides ams, aps): C (F32, or BF16 with out = OUT_BF16) =
 * op(A) op(B) [+ C] */
static int packed_run(lrmoe_dpbf16_t *x, int tb, int64_t M, int64_t N, int64_t K, int64_t ams,
                      int64_t aps, const void *B, int b_f32, int64_t ldb, int acc, void *C,
                      int64_t ldc, int out)
{
    const int64_t K2 = (K + 1) / 2;
    if (!lrmoe_grow64((void **)&x->B, &x->bcap, (size_t)(K2 * NR) * 4)) return -1;
    const size_t cs = out == OUT_BF16 ? 2 : 4;
    for (int64_t n0 = 0; n0 < N; n0 += NR) {
        const int64_t w = N - n0 < NR ? N - n0 : NR;
        pack_b(x, tb, K, B, b_f32, ldb, n0, w);
        const int64_t w2 = N - n0 - NR < NR ? N - n0 - NR : NR;
        pfc_t pf = pf_panel(tb, K, B, b_f32, ldb, n0 + NR, w2);
        for (int64_t m0 = 0; m0 < M; m0 += MR) {
            const int64_t r = M - m0 < MR ? M - m0 : MR;
            ukern[r](K2, x->A + m0 * ams, ams, aps, x->B,
                     (char *)C + (size_t)(m0 * ldc + n0) * cs, ldc, (int)w, acc, out, &pf);
        }
    }
    if (out == OUT_NT) _mm_sfence();
    return 0;
}

/* The packed form: C (F32, or BF16 with out = OUT_BF16) = op(A) op(B) [+ C] */
static int gemm_packed(lrmoe_dpbf16_t *x, int ta, int tb, int64_t M, int64_t N, int64_t K,
                       const void *A, int a_f32, int64_t lda, const void *B, int b_f32,
                       int64_t ldb, int acc, void *C, int64_t ldc, int out)
{
    int64_t ams, aps;
    if (pack_a(x, ta, M, K, A, a_f32, lda, &ams, &aps) < 0) return -1;
    return packed_run(x, tb, M, N, K, ams, aps, B, b_f32, ldb, acc, C, ldc, out);
}

int lrmoe_dpbf16_gemm(lrmoe_dpbf16_t *x, int ta, int tb, int64_t M, int64_t N, int64_t K,
                      const void *A, int a_f32, int64_t lda, const void *B, int b_f32,
                      int64_t ldb, int acc, float *C, int64_t ldc)
{
    if (M <= 0 || N <= 0) return 0;
    if (K <= 0) {
        if (!acc)
            for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, (size_t)N * sizeof *C);
        return 0;
    }
    if ((a_f32 || b_f32) && !grow_t(x, M, K)) return -1;
    if (!ta && tb && !b_f32 && use_direct(M))
        return gemm_nt_direct(x, M, N, K, A, a_f32, lda, B, ldb, acc, C, NULL, ldc);
    /* the weight gradients (ta, C overwritten): C with non-temporal stores
     * where its rows are whole 64-byte lines, so that its lines are not read
     * first; the bits are the same */
    const int nt = ta && !acc && ((uintptr_t)C & 63) == 0 && (ldc & 15) == 0;
    return gemm_packed(x, ta, tb, M, N, K, A, a_f32, lda, B, b_f32, ldb, acc, C, ldc,
                       nt ? OUT_NT : OUT_F32);
}

int lrmoe_dpbf16_gemm_bf16out(lrmoe_dpbf16_t *x, int64_t M, int64_t N, int64_t K, const void *A,
                              int a_f32, int64_t lda, const uint16_t *B, int64_t ldb,
                              uint16_t *C, int64_t ldc)
{
    if (M <= 0 || N <= 0) return 0;
    if (K <= 0) {
        for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, (size_t)N * sizeof *C);
        return 0;
    }
    if (!lrmoe_dpbf16_bf16out_ok(M, K))
        return lrmoe_err("gemm: BF16 output of %lld rows, K %lld: not rounded in the stores",
                         (long long)M, (long long)K);
    if (a_f32 && !grow_t(x, M, K)) return -1;
    if (!use_direct(M)) /* the packed form rounds in its stores */
        return gemm_packed(x, 0, 1, M, N, K, A, a_f32, lda, B, 0, ldb, 0, C, ldc, OUT_BF16);
    /* and the direct form in its C^T buffer's */
    return gemm_nt_direct(x, M, N, K, A, a_f32, lda, B, ldb, 0, NULL, C, ldc);
}

int lrmoe_dpbf16_bf16out_ok(int64_t M, int64_t K)
{
    return !use_direct(M) || direct_ct(M, K);
}

int lrmoe_dpbf16_gemm2(lrmoe_dpbf16_t *x, int64_t M, int64_t N, int64_t K, const void *A,
                       int a_f32, int64_t lda, const uint16_t *B1, const uint16_t *B2,
                       int64_t ldb, float *C, int64_t ldc)
{
    if (M <= 0 || N <= 0) return 0;
    if (K <= 0) {
        for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, (size_t)(2 * N) * sizeof *C);
        return 0;
    }
    if (a_f32 && !grow_t(x, M, K)) return -1;
    if (use_direct(M)) {
        if (direct_pack(x, M, K, A, a_f32, lda) < 0) return -1;
        direct_run(x, M, N, K, B1, ldb, 0, C, NULL, ldc);
        direct_run(x, M, N, K, B2, ldb, 0, C + N, NULL, ldc);
        return 0;
    }
    int64_t ams, aps;
    if (pack_a(x, 0, M, K, A, a_f32, lda, &ams, &aps) < 0) return -1;
    return packed_run(x, 1, M, N, K, ams, aps, B1, 0, ldb, 0, C, ldc, OUT_F32) < 0 ||
           packed_run(x, 1, M, N, K, ams, aps, B2, 0, ldb, 0, C + N, ldc, OUT_F32) < 0 ? -1 : 0;
}

#else /* no AVX512_BF16 build: lrmoe_dpbf16_available() is 0 and nothing calls this */

int lrmoe_dpbf16_gemm(lrmoe_dpbf16_t *x, int ta, int tb, int64_t M, int64_t N, int64_t K,
                      const void *A, int a_f32, int64_t lda, const void *B, int b_f32,
                      int64_t ldb, int acc, float *C, int64_t ldc)
{
    (void)x; (void)ta; (void)tb; (void)M; (void)N; (void)K; (void)A; (void)a_f32; (void)lda;
    (void)B; (void)b_f32; (void)ldb; (void)acc; (void)C; (void)ldc;
    return lrmoe_err("gemm: this build has no AVX512_BF16 kernel");
}

int lrmoe_dpbf16_gemm_bf16out(lrmoe_dpbf16_t *x, int64_t M, int64_t N, int64_t K, const void *A,
                              int a_f32, int64_t lda, const uint16_t *B, int64_t ldb,
                              uint16_t *C, int64_t ldc)
{
    (void)x; (void)M; (void)N; (void)K; (void)A; (void)a_f32; (void)lda; (void)B; (void)ldb;
    (void)C; (void)ldc;
    return lrmoe_err("gemm: this build has no AVX512_BF16 kernel");
}

int lrmoe_dpbf16_bf16out_ok(int64_t M, int64_t K)
{
    (void)M; (void)K;
    return 0;
}

int lrmoe_dpbf16_gemm2(lrmoe_dpbf16_t *x, int64_t M, int64_t N, int64_t K, const void *A,
                       int a_f32, int64_t lda, const uint16_t *B1, const uint16_t *B2,
                       int64_t ldb, float *C, int64_t ldc)
{
    (void)x; (void)M; (void)N; (void)K; (void)A; (void)a_f32; (void)lda; (void)B1; (void)B2;
    (void)ldb; (void)C; (void)ldc;
    return lrmoe_err("gemm: this build has no AVX512_BF16 kernel");
}

#endif
