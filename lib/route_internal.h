/* route_internal.h: what the router's dispatcher (route.c) and its paths
 * (route_scalar.c, route_avx2.c, route_avx512.c) share (liblrmoe-internal;
 * not installed). The dispatcher calls the paths; the paths call only each
 * other's row functions (a SIMD path's fallback rows) and what is here. */
#ifndef LRMOE_ROUTE_INTERNAL_H
#define LRMOE_ROUTE_INTERNAL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* 1 when the CPU and the OS run lrmoe_route_softmax_rows512 (AVX-512 F, BW, DQ,
 * VL and VBMI2, with BMI2 and POPCNT: Ice Lake, Sapphire Rapids, Zen 4 and
 * later); 0 elsewhere, and always when the environment
 * sets LRMOE_NO_SIMD or LRMOE_NO_AVX512 (so tests reach the other paths). */
int lrmoe_route_avx512_ok(void);

/* Rows per call of lrmoe_route_softmax_rows512, and the scratch it needs. */
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
uint32_t lrmoe_route_softmax_rows512(const float *x, int nb, int E, int K, int full,
                               float scale, int32_t *ids, float *w, float *cv, int32_t *ci,
                               const void *next, size_t nnext);
typedef uint32_t (*rows512_fn)(const float *x, int nb, int E, int K, int full, float scale,
                               int32_t *ids, float *w, float *cv, int32_t *ci, const void *next,
                               size_t nnext);

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


/* ------------------------------------------------------------ shared by route.c,
 * route_scalar.c and route_avx2.c (the dispatcher and its paths) */

#include "route.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define ROUTE_X86 1
#endif

enum { EMAX = 1024 }; /* vector top-K path: E <= EMAX (stack arrays) */

/* Insert (v, j) into the descending list tv/ti whose slot `pos` is free;
 * equal values stay ahead of the newcomer (lower index wins ties because
 * experts are visited in increasing index). */
#define INSERT(tv, ti, pos, v, j)                                  \
    do {                                                           \
        int p_ = (pos);                                            \
        while (p_ > 0 && (tv)[p_ - 1] < (v)) {                     \
            (tv)[p_] = (tv)[p_ - 1];                               \
            (ti)[p_] = (ti)[p_ - 1];                               \
            p_--;                                                  \
        }                                                          \
        (tv)[p_] = (v);                                            \
        (ti)[p_] = (j);                                            \
    } while (0)

typedef int (*topk_fn)(const float *, int, int, float *, int32_t *, int *);
typedef float (*expsum_fn)(const float *, int, float);
typedef void (*weights_fn)(const float *, int, float, float, float, float *);

enum { ERR_NONE = 0, ERR_NAN, ERR_ALLNEG, ERR_OOM };

typedef struct {
    const lrmoe_route_opts_t *o;
    int E, K;
    lrmoe_dtype_t dt;
    const void *logits;
    const float *bias;
    int32_t *ids;
    float *w;
    int64_t t0, t1;
    int64_t *load;       /* (E) private counts */
    int64_t err_token;
    int err_expert, err;
    topk_fn topk;
    expsum_fn expsum;
    weights_fn weights;
    int fast;            /* rows_softmax_avx2 applies */
    rows512_fn rows512;  /* ...and its blocks go to this AVX-512 kernel (route.c
                            chooses: lrmoe_route_softmax_rows512, or NULL) */
    int sigfast;         /* row_sigmoid_filter applies */
    double bmax;         /* max |expert_bias| (0 without) */
    float *cv, *row;     /* scratch of rows_softmax_avx2 */
    int32_t *ci, *rank;
} job_t;


static inline double route_sigmoid(double x)
{
    return 1.0 / (1.0 + exp(-x));
}

/* route_scalar.c */
int lrmoe_route_topk_scalar(const float *x, int E, int K, float *tv, int32_t *ti, int *bad);
float lrmoe_route_expsum_scalar(const float *x, int E, float m);
void lrmoe_route_weights_scalar(const float *tv, int K, float m, float s, float scale, float *w);
/* Top-K over double keys, optionally only experts whose group is allowed. */
void lrmoe_route_topk_f64(const double *key, int E, int K, const unsigned char *gok,
                    int gsize, double *tv, int32_t *ti);
/* Softmax routers on one row. 0, or ERR_* with *bad set. */
int lrmoe_route_row_softmax(const job_t *jb, const float *x, int32_t *ids, float *w,
                      float *tv, int *bad);
/* Sigmoid router on one row; key (E) and gscore/gok (G) are scratch. */
int lrmoe_route_row_sigmoid(const job_t *jb, const float *x, int32_t *ids, float *w,
                      double *key, double *tv, double *gscore, unsigned char *gok,
                      int *bad);

#ifdef ROUTE_X86
/* route_avx2.c (callers check AVX2/FMA first; lrmoe_route_avx2_init once before
 * lrmoe_route_topk_avx2) */
void lrmoe_route_avx2_init(void);
int lrmoe_route_topk_avx2(const float *x, int E, int K, float *tv, int32_t *ti, int *bad);
float lrmoe_route_expsum_avx2(const float *x, int E, float m);
void lrmoe_route_weights_avx2(const float *tv, int K, float m, float s, float scale, float *w);
int lrmoe_route_rows_softmax_avx2(job_t *jb, int64_t *bad_t, int *bad);
int lrmoe_route_row_sigmoid_filter(const job_t *jb, const float *x, int32_t *ids, float *w,
                             double *key, float *ka, int32_t *cj, float *tvf, double *tv,
                             double *gscore, unsigned char *gok, double *sge,
                             int64_t *seen, int64_t t, int *bad);
#endif

#endif
