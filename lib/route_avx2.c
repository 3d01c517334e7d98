/* route_avx2: the AVX2 (and FMA) paths of the routers (lib/route.c picks
 * them at run time): the bounded top-K with compressed candidates, the
 * blocked softmax row loop (which hands blocks to the AVX-512 kernel when it
 * applies), and the sigmoid router's filtered group selection. */
#include "route.h"
#include "route_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#ifdef ROUTE_X86
/* Same as lrmoe_route_topk_scalar: eight logits at a time are compared with the
 * current K-th value and skipped when none beats it (or is NaN). */
__attribute__((target("avx2")))
static int topk_f32_avx2(const float *x, int E, int K, float *tv, int32_t *ti, int *bad)
{
    int j = 0;
    for (; j < K; j++) {
        float v = x[j];
        if (v != v) { *bad = j; return -1; }
        INSERT(tv, ti, j, v, j);
    }
    float thr = tv[K - 1];
    /* scalar up to a multiple of 8 */
    for (; j < E && (j & 7); j++) {
        float v = x[j];
        if (!(v <= thr)) {
            if (v != v) { *bad = j; return -1; }
            INSERT(tv, ti, K - 1, v, j);
            thr = tv[K - 1];
        }
    }
    for (; j + 8 <= E; j += 8) {
        __m256 a = _mm256_loadu_ps(x + j);
        unsigned mask = (unsigned)_mm256_movemask_ps(
            _mm256_cmp_ps(a, _mm256_set1_ps(thr), _CMP_NLE_UQ));
        while (mask) {
            int i = __builtin_ctz(mask);
            mask &= mask - 1;
            float v = x[j + i];
            if (v != v) { *bad = j + i; return -1; }
            if (v > thr) {
                INSERT(tv, ti, K - 1, v, j + i);
                thr = tv[K - 1];
            }
        }
    }
    for (; j < E; j++) {
        float v = x[j];
        if (!(v <= thr)) {
            if (v != v) { *bad = j; return -1; }
            INSERT(tv, ti, K - 1, v, j);
            thr = tv[K - 1];
        }
    }
    return 0;
}


/* Lane numbers of the set bits of each 8-bit mask, packed one per byte. */
static uint64_t compress_lut[256];
/* the same, one int32 per lane */
static _Alignas(32) int32_t compress_lut32[256][8];
static pthread_once_t compress_once = PTHREAD_ONCE_INIT;
static void compress_init(void)
{
    for (int m = 0; m < 256; m++) {
        uint64_t v = 0;
        int n = 0;
        for (int i = 0; i < 8; i++)
            if (m & (1 << i))
                v |= (uint64_t)i << (8 * n++);
        compress_lut[m] = v;
        for (int i = 0; i < 8; i++)
            compress_lut32[m][i] = (int32_t)((v >> (8 * i)) & 0xff);
    }
}

/* Sort 8 floats in decreasing order (bitonic network, no NaN). */
__attribute__((target("avx2")))
static inline __m256 sort8_desc(__m256 v)
{
    static const int32_t perm[6][8] = {
        {1, 0, 3, 2, 5, 4, 7, 6}, {2, 3, 0, 1, 6, 7, 4, 5}, {1, 0, 3, 2, 5, 4, 7, 6},
        {4, 5, 6, 7, 0, 1, 2, 3}, {2, 3, 0, 1, 6, 7, 4, 5}, {1, 0, 3, 2, 5, 4, 7, 6}};
    static const int32_t takemax[6][8] = {
        {-1, 0, 0, -1, -1, 0, 0, -1}, {-1, -1, 0, 0, 0, 0, -1, -1},
        {-1, 0, -1, 0, 0, -1, 0, -1}, {-1, -1, -1, -1, 0, 0, 0, 0},
        {-1, -1, 0, 0, -1, -1, 0, 0}, {-1, 0, -1, 0, -1, 0, -1, 0}};
#pragma GCC unroll 6
    for (int s = 0; s < 6; s++) {
        __m256 p = _mm256_permutevar8x32_ps(v, _mm256_loadu_si256((const __m256i *)perm[s]));
        v = _mm256_blendv_ps(_mm256_min_ps(v, p), _mm256_max_ps(v, p),
                             _mm256_castsi256_ps(
                                 _mm256_loadu_si256((const __m256i *)takemax[s])));
    }
    return v;
}

/* K <= 8 and E a multiple of 8, without data-dependent branches:
 * 1. the row seen as chunks of 8 has 8 column maxima over the even chunks
 *    and 8 over the odd ones: 16 distinct logits, so the 8th largest of
 *    them, m, is a lower bound of the K-th largest logit (K <= 8);
 * 2. the logits >= m (about a tenth of the row) are compressed, in index
 *    order, into a candidate list;
 * 3. candidate i's rank is the number of candidates j that beat it:
 *    x_j > x_i, or x_j == x_i and j < i (ties to the lower index); the
 *    ranks below K are the answer, in order.
 * A NaN (or a shape it does not cover) falls back to topk_f32_avx2. */
/* rank[i] = how many of the c candidates cv[] beat candidate i: a larger
 * value, or an equal one earlier in the list (lower expert index). cv and
 * rank are padded to a multiple of 8. */
__attribute__((target("avx2")))
static inline void rank_candidates(const float *cv, int c, int32_t *rank)
{
    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int i0 = 0; i0 < c; i0 += 8) {
        __m256 vi = _mm256_loadu_ps(cv + i0);
        __m256i cnt = _mm256_setzero_si256();
        int j = 0;
        /* candidates before the block beat on >=, after it on > */
        for (; j < i0; j++)
            cnt = _mm256_sub_epi32(cnt, _mm256_castps_si256(_mm256_cmp_ps(
                      _mm256_broadcast_ss(cv + j), vi, _CMP_GE_OQ)));
        __m256i ii = _mm256_add_epi32(lane, _mm256_set1_epi32(i0));
        for (; j < i0 + 8 && j < c; j++) {
            __m256 vj = _mm256_broadcast_ss(cv + j);
            __m256 beat = _mm256_or_ps(
                _mm256_cmp_ps(vj, vi, _CMP_GT_OQ),
                _mm256_and_ps(_mm256_cmp_ps(vj, vi, _CMP_EQ_OQ),
                              _mm256_castsi256_ps(
                                  _mm256_cmpgt_epi32(ii, _mm256_set1_epi32(j)))));
            cnt = _mm256_sub_epi32(cnt, _mm256_castps_si256(beat));
        }
        for (; j < c; j++)
            cnt = _mm256_sub_epi32(cnt, _mm256_castps_si256(_mm256_cmp_ps(
                      _mm256_broadcast_ss(cv + j), vi, _CMP_GT_OQ)));
        _mm256_storeu_si256((__m256i *)(rank + i0), cnt);
    }
}

__attribute__((target("avx2")))
static inline int topk_f32_avx2_bound(const float *x, int E, int K, float *tv, int32_t *ti, int *bad)
{
    if (K > 8 || (E & 7) || E > EMAX)
        return topk_f32_avx2(x, E, K, tv, ti, bad);
    /* column maxima of the even and of the odd chunks of 8 */
    __m256 mx = _mm256_loadu_ps(x), un = _mm256_cmp_ps(mx, mx, _CMP_UNORD_Q);
    __m256 my = _mm256_set1_ps(-INFINITY);
    int j0 = 8;
    for (; j0 + 16 <= E; j0 += 16) {
        __m256 a = _mm256_loadu_ps(x + j0), b = _mm256_loadu_ps(x + j0 + 8);
        my = _mm256_max_ps(my, a);
        mx = _mm256_max_ps(mx, b);
        un = _mm256_or_ps(un, _mm256_or_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q),
                                           _mm256_cmp_ps(b, b, _CMP_UNORD_Q)));
    }
    if (j0 < E) {
        __m256 a = _mm256_loadu_ps(x + j0);
        my = _mm256_max_ps(my, a);
        un = _mm256_or_ps(un, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    }
    if (_mm256_movemask_ps(un))
        return topk_f32_avx2(x, E, K, tv, ti, bad); /* finds and names the NaN */
    __m256 m;
    if (E >= 16) {
        /* the 16 maxima belong to 16 distinct logits: the 8th largest of them
         * (the minimum of the top half of the bitonic merge) is the bound */
        __m256 a = sort8_desc(mx), b = sort8_desc(my);
        b = _mm256_permutevar8x32_ps(b, _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0));
        m = _mm256_max_ps(a, b);
    } else {
        m = mx;
    }
    m = _mm256_min_ps(m, _mm256_permute2f128_ps(m, m, 1));
    m = _mm256_min_ps(m, _mm256_shuffle_ps(m, m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm256_min_ps(m, _mm256_shuffle_ps(m, m, _MM_SHUFFLE(2, 3, 0, 1)));

    float cv[EMAX + 8];
    int32_t ci[EMAX + 8], rank[EMAX + 8];
    int c = 0;
    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int j = 0; j < E; j += 8) {
        __m256 a = _mm256_loadu_ps(x + j);
        unsigned mask = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a, m, _CMP_GE_OQ));
        __m256i perm = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)compress_lut[mask]));
        _mm256_storeu_ps(cv + c, _mm256_permutevar8x32_ps(a, perm));
        _mm256_storeu_si256((__m256i *)(ci + c),
                            _mm256_add_epi32(perm, _mm256_set1_epi32(j)));
        c += __builtin_popcount(mask);
    }
    rank_candidates(cv, c, rank);
    float sv[9];
    int32_t si[9];
    for (int i = 0; i < c; i++) {
        int r = rank[i] < K ? rank[i] : K; /* slot K collects the rest */
        sv[r] = cv[i];
        si[r] = ci[i];
    }
    __m256i on = _mm256_cmpgt_epi32(_mm256_set1_epi32(K), lane);
    _mm256_maskstore_ps(tv, on, _mm256_loadu_ps(sv));
    _mm256_maskstore_epi32(ti, on, _mm256_loadu_si256((const __m256i *)si));
    return 0;
}

/* lrmoe_route_topk_avx2 for K <= 8 and E a multiple of 8 up to EMAX, split in
 * two stages so that a block of rows runs stage 1 row after row and then
 * stage 2 row after row: stage 2 reads back whole vectors that stage 1
 * stored piecewise, which a store buffer cannot forward; a row later the
 * stores have reached the cache. Neither looks for NaN up front: an
 * unordered compare puts every NaN in the candidate list, and stage 2
 * checks only the candidates (-1: the caller takes a path that names it).
 * The picks are those of route_topk_avx2. */

/* Stage 1: the bound m (without NaN, that of lrmoe_route_topk_avx2; with one,
 * anything, NaN included) and the candidates x >= m or NaN, in index order,
 * into cv, ci (E + 16 each), then 16 -inf into cv. Returns their number. */
__attribute__((target("avx2")))
static inline int top8_stage1(const float *x, int E, float *cv, int32_t *ci)
{
    __m256 mx = _mm256_loadu_ps(x), my = _mm256_set1_ps(-INFINITY);
    int j0 = 8;
    for (; j0 + 16 <= E; j0 += 16) {
        my = _mm256_max_ps(my, _mm256_loadu_ps(x + j0));
        mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + j0 + 8));
    }
    if (j0 < E)
        my = _mm256_max_ps(my, _mm256_loadu_ps(x + j0));
    __m256 m;
    if (E >= 16) {
        __m256 a = sort8_desc(mx), b = sort8_desc(my);
        b = _mm256_permutevar8x32_ps(b, _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0));
        m = _mm256_max_ps(a, b);
    } else {
        m = mx;
    }
    m = _mm256_min_ps(m, _mm256_permute2f128_ps(m, m, 1));
    m = _mm256_min_ps(m, _mm256_shuffle_ps(m, m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm256_min_ps(m, _mm256_shuffle_ps(m, m, _MM_SHUFFLE(2, 3, 0, 1)));
    int c = 0;
    __m256i jv = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int j = 0; j < E; j += 8) {
        __m256 a = _mm256_loadu_ps(x + j);
        unsigned mask = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(m, a, _CMP_NGT_UQ));
        __m256i perm = _mm256_load_si256((const __m256i *)compress_lut32[mask]);
        _mm256_storeu_ps(cv + c, _mm256_permutevar8x32_ps(a, perm));
        _mm256_storeu_si256((__m256i *)(ci + c), _mm256_add_epi32(perm, jv));
        jv = _mm256_add_epi32(jv, _mm256_set1_epi32(8));
        c += __builtin_popcount(mask);
    }
    _mm256_storeu_ps(cv + c, _mm256_set1_ps(-INFINITY)); /* for top8_stage2_16 */
    _mm256_storeu_ps(cv + c + 8, _mm256_set1_ps(-INFINITY));
    return c;
}

/* Ranks of the 16 slots of cv (values v0, v1) when some are equal: the
 * number ahead, an equal value in an earlier slot being ahead too (the
 * padding comes after every candidate); a permutation of 0..15. */
__attribute__((target("avx2"), noinline))
static void top8_ties16(const float *cv, __m256 v0, __m256 v1, int32_t *rank)
{
    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i lane1 = _mm256_add_epi32(lane, _mm256_set1_epi32(8));
    __m256i c0 = _mm256_setzero_si256(), c1 = _mm256_setzero_si256();
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) {
        __m256 vj = _mm256_broadcast_ss(cv + j);
        __m256i jj = _mm256_set1_epi32(j);
        __m256 b0 = _mm256_or_ps(
            _mm256_cmp_ps(vj, v0, _CMP_GT_OQ),
            _mm256_and_ps(_mm256_cmp_ps(vj, v0, _CMP_EQ_OQ),
                          _mm256_castsi256_ps(_mm256_cmpgt_epi32(lane, jj))));
        __m256 b1 = _mm256_or_ps(
            _mm256_cmp_ps(vj, v1, _CMP_GT_OQ),
            _mm256_and_ps(_mm256_cmp_ps(vj, v1, _CMP_EQ_OQ),
                          _mm256_castsi256_ps(_mm256_cmpgt_epi32(lane1, jj))));
        c0 = _mm256_sub_epi32(c0, _mm256_castps_si256(b0));
        c1 = _mm256_sub_epi32(c1, _mm256_castps_si256(b1));
    }
    _mm256_storeu_si256((__m256i *)rank, c0);
    _mm256_storeu_si256((__m256i *)(rank + 8), c1);
}

/* Stage 2 for c <= 16 with the same picks, without a data-dependent branch
 * (loops whose length depends on c mispredict): slots c..15 of cv hold
 * -inf. A candidate's rank counts the candidates above it; without ties
 * among the c real ones these ranks are a permutation of 0..c-1 and the
 * candidates go straight to their slots of sv, si (16 each; the first K are
 * the picks; the padding goes to slot 15). Ties (the ranks then sum to less
 * than c(c-1)/2) are broken by index in a second count. 0, or -1 when a
 * candidate is NaN. */
__attribute__((target("avx2")))
static inline int top8_stage2_16(const float *cv, const int32_t *ci, int c, float *sv,
                                 int32_t *si)
{
    __m256 v0 = _mm256_loadu_ps(cv), v1 = _mm256_loadu_ps(cv + 8);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v0, v1, _CMP_UNORD_Q)))
        return -1;
    __m256i c0 = _mm256_setzero_si256(), c1 = _mm256_setzero_si256();
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) {
        __m256 vj = _mm256_broadcast_ss(cv + j);
        c0 = _mm256_sub_epi32(c0, _mm256_castps_si256(_mm256_cmp_ps(vj, v0, _CMP_GT_OQ)));
        c1 = _mm256_sub_epi32(c1, _mm256_castps_si256(_mm256_cmp_ps(vj, v1, _CMP_GT_OQ)));
    }
    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i in0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(c), lane);
    __m256i in1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(c - 8), lane);
    c0 = _mm256_and_si256(c0, in0);
    c1 = _mm256_and_si256(c1, in1);
    __m256i sum = _mm256_add_epi32(c0, c1);
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
    int32_t rank[16];
    if (_mm_cvtsi128_si32(h) == c * (c - 1) / 2) {
        /* the padding goes to slot 15 (c < 16 then) */
        __m256i pad = _mm256_set1_epi32(15);
        _mm256_storeu_si256((__m256i *)rank,
                            _mm256_or_si256(c0, _mm256_andnot_si256(in0, pad)));
        _mm256_storeu_si256((__m256i *)(rank + 8),
                            _mm256_or_si256(c1, _mm256_andnot_si256(in1, pad)));
    } else {
        top8_ties16(cv, v0, v1, rank);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) {
        int r = rank[i];
        sv[r] = cv[i];
        si[r] = ci[i];
    }
    return 0;
}

/* Stage 2: the K best of the c candidates into tv, ti; rank is (E + 8)
 * scratch. -1 when a candidate is NaN. */
__attribute__((target("avx2")))
static inline int top8_stage2(const float *cv, const int32_t *ci, int c, int K, float *tv,
                              int32_t *ti, int32_t *rank)
{
    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 un = _mm256_setzero_ps();
    for (int i0 = 0; i0 < c; i0 += 8) {
        __m256 v = _mm256_loadu_ps(cv + i0);
        __m256 in = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(c - i0), lane));
        un = _mm256_or_ps(un, _mm256_and_ps(in, _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    }
    if (_mm256_movemask_ps(un))
        return -1;
    rank_candidates(cv, c, rank);
    float dv;
    int32_t di;
    for (int i = 0; i < c; i++) {
        int r = rank[i];
        float *pv = r < K ? tv + r : &dv;
        int32_t *pi = r < K ? ti + r : &di;
        *pv = cv[i];
        *pi = ci[i];
    }
    return 0;
}

__attribute__((target("avx2,fma")))
float lrmoe_route_expsum_avx2(const float *x, int E, float m)
{
    __m256 acc = _mm256_setzero_ps(), vm = _mm256_set1_ps(m);
    int j = 0;
    for (; j + 8 <= E; j += 8)
        acc = _mm256_add_ps(acc, route_exp_neg256(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm)));
    float lane[8];
    _mm256_storeu_ps(lane, acc);
    float s = ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
              ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    for (; j < E; j++)
        s += expf(x[j] - m);
    return s;
}

/* w[k] = scale * exp(tv[k] - m) / S for k < K, where S = s when s > 0 (the
 * full softmax denominator) or else the sum of the K exps; tv[k] <= m, m
 * finite. For K <= 8; arguments below -87 (results under FLT_MIN, or 0 for
 * -inf) go through expf so denormals and zeros stay exact. */
__attribute__((target("avx2,fma")))
static inline void weights_avx2(const float *tv, int K, float m, float s, float scale,
                                float *w)
{
    __m256i on = _mm256_cmpgt_epi32(_mm256_set1_epi32(K),
                                    _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    /* K == 8: plain load and store (masked stores are slow on some CPUs) */
    __m256 d = _mm256_sub_ps(K == 8 ? _mm256_loadu_ps(tv) : _mm256_maskload_ps(tv, on),
                             _mm256_set1_ps(m));
    __m256 e = route_exp_neg256(d);
    unsigned low = (unsigned)_mm256_movemask_ps(
        _mm256_cmp_ps(d, _mm256_set1_ps(-87.0f), _CMP_LT_OQ)) & ((1u << K) - 1);
    if (low) {
        float tmp[8];
        _mm256_storeu_ps(tmp, e);
        for (int k = 0; k < K; k++)
            if ((low >> k) & 1)
                tmp[k] = expf(tv[k] - m);
        e = _mm256_loadu_ps(tmp);
    }
    e = _mm256_and_ps(e, _mm256_castsi256_ps(on));
    if (!(s > 0)) {
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(e), _mm256_extractf128_ps(e, 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
        s = _mm_cvtss_f32(h);
    }
    __m256 f = _mm256_set1_ps((float)((double)scale / (double)s));
    if (K == 8)
        _mm256_storeu_ps(w, _mm256_mul_ps(e, f));
    else
        _mm256_maskstore_ps(w, on, _mm256_mul_ps(e, f));
}
#endif

#ifdef ROUTE_X86
/* lrmoe_route_row_softmax over all rows of a job, everything inlined: a softmax router,
 * K <= 8, E a multiple of 8 up to EMAX. Rows go in blocks of B, each stage
 * of the top-K (top8_stage1, top8_stage2_16) over the whole block before the
 * next, then the weights; with AVX-512 and E a multiple of 16 a block goes
 * to the kernel lib/route.c chose for it (jb->rows512) instead. Other dtypes than F32 are
 * widened a block at a time into jb->row (B*E), which stays in L1/L2. Rows
 * that need the special cases (NaN, +-inf maximum) go through route_row_softmax. */
__attribute__((target("avx2,fma")))
int lrmoe_route_rows_softmax_avx2(job_t *jb, int64_t *bad_t, int *bad)
{
    const lrmoe_route_opts_t *o = jb->o;
    int E = jb->E, K = jb->K;
    int full = o->router == LRMOE_ROUTER_SOFTMAX && !o->renorm;
    float scale = (float)o->scale;
    size_t esz = lrmoe_dtype_size(jb->dt);
    enum { B = ROUTE512_ROWS };
    float tb[B][16], sb[B];
    int32_t ib[B][16];
    int nc[B];
    size_t stride = (size_t)E + 16;
    for (int64_t t0 = jb->t0; t0 < jb->t1; t0 += B) {
        int nb = jb->t1 - t0 < B ? (int)(jb->t1 - t0) : B;
        int special = 0, sorted = 0;
        const float *xb; /* (nb,E) logits of the block */
        if (jb->dt == LRMOE_F32) {
            xb = (const float *)jb->logits + t0 * E;
        } else if (jb->dt == LRMOE_BF16) {
            /* BF16 is the top half of an F32: widening is a shift */
            const uint16_t *src = (const uint16_t *)jb->logits + t0 * E;
            for (size_t i = 0; i < (size_t)nb * E; i += 8)
                _mm256_storeu_si256((__m256i *)(jb->row + i),
                                    _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(
                                                          (const __m128i *)(src + i))), 16));
            xb = jb->row;
        } else {
            lrmoe_convert_to_f32(jb->dt, (const char *)jb->logits + (size_t)t0 * E * esz,
                                 jb->row, (size_t)nb * E);
            xb = jb->row;
        }
        /* the next block, in the input's dtype, to prefetch meanwhile */
        int64_t n1 = jb->t1 - (t0 + nb) < B ? jb->t1 - (t0 + nb) : B;
        const char *pfp = (const char *)jb->logits + (size_t)(t0 + nb) * E * esz;
        size_t nnext = (size_t)n1 * E * esz;
        if (jb->rows512) {
            uint32_t left = jb->rows512(xb, nb, E, K, full, scale, jb->ids + t0 * K,
                                         jb->w + t0 * K, jb->cv, jb->ci, pfp, nnext);
            for (; left; left &= left - 1) {
                int r = __builtin_ctz(left);
                int64_t t = t0 + r;
                int32_t *ids = jb->ids + t * K;
                int rc = lrmoe_route_row_softmax(jb, xb + (size_t)r * E, ids, jb->w + t * K, tb[r], bad);
                if (rc) {
                    *bad_t = t;
                    return rc;
                }
            }
            continue;
        }
        /* the next block's input lines, a few per row, and its output lines */
        const char *pfe = pfp + nnext;
        size_t pfrow = (nnext + 2 * (size_t)nb - 1) / (2 * (size_t)nb);
        if (nnext)
            route_prefetch_out(jb->ids + (t0 + nb) * K, jb->w + (t0 + nb) * K,
                               (size_t)nb * K * 4);
        for (int r = 0; r < nb; r++) {
            route_prefetch_step(&pfp, pfe, pfrow);
            nc[r] = top8_stage1(xb + (size_t)r * E, E, jb->cv + r * stride,
                                jb->ci + r * stride);
        }
        for (int r = 0; r < nb; r++) {
            route_prefetch_step(&pfp, pfe, pfrow);
            int64_t t = t0 + r;
            const float *cv = jb->cv + r * stride;
            const int32_t *ci = jb->ci + r * stride;
            int32_t *ids = jb->ids + t * K;
            int rc = nc[r] <= 16 ? top8_stage2_16(cv, ci, nc[r], tb[r], ib[r]) : 1;
            if (rc == 0)
                sorted |= 1 << r;
            else if (rc > 0)
                rc = top8_stage2(cv, ci, nc[r], K, tb[r], ids, jb->rank);
            if (rc < 0 || !isfinite(tb[r][0])) {
                special |= 1 << r;
                continue;
            }
            sb[r] = full ? lrmoe_route_expsum_avx2(xb + (size_t)r * E, E, tb[r][0]) : 0.0f;
        }
        for (int r = 0; r < nb; r++) {
            int64_t t = t0 + r;
            int32_t *ids = jb->ids + t * K;
            float *w = jb->w + t * K;
            if ((special >> r) & 1) {
                int rc = lrmoe_route_row_softmax(jb, xb + (size_t)r * E, ids, w, tb[r], bad);
                if (rc) {
                    *bad_t = t;
                    return rc;
                }
            } else {
                if ((sorted >> r) & 1) {
                    if (K == 8)
                        _mm256_storeu_si256((__m256i *)ids,
                                            _mm256_loadu_si256((const __m256i *)ib[r]));
                    else
                        memcpy(ids, ib[r], (size_t)K * sizeof *ids);
                }
                weights_avx2(tb[r], K, tb[r][0], sb[r], scale, w);
            }
        }
    }
    return 0;
}
#endif

#ifdef ROUTE_X86
/* ka = route_sigmoid(x) + bias in F32 (|error| < 1e-6 * (1 + |bias|)), E a
 * multiple of 8; returns the NaN lane mask (0: no NaN). */
__attribute__((target("avx2,fma")))
static unsigned approx_keys_avx2(const float *x, const float *bias, int E, float *ka)
{
    __m256 un = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    for (int j = 0; j < E; j += 8) {
        __m256 a = _mm256_loadu_ps(x + j);
        un = _mm256_or_ps(un, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
        __m256 t = route_exp_neg256(_mm256_or_ps(a, sign)); /* e^-|x| */
        /* 1/(1+t) by reciprocal estimate and one Newton step (~1e-7 rel.) */
        __m256 d = _mm256_add_ps(one, t), inv = _mm256_rcp_ps(d);
        inv = _mm256_mul_ps(inv, _mm256_fnmadd_ps(d, inv, _mm256_set1_ps(2.0f)));
        __m256 sg = _mm256_blendv_ps(_mm256_mul_ps(t, inv), inv,
                                     _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_GE_OQ));
        if (bias)
            sg = _mm256_add_ps(sg, _mm256_loadu_ps(bias + j));
        _mm256_storeu_ps(ka + j, sg);
    }
    return (unsigned)_mm256_movemask_ps(un);
}

/* Largest and second largest (the largest again if it occurs twice) of n
 * floats, n a multiple of 8, no NaN. */
__attribute__((target("avx2,fma")))
static void top2_avx2(const float *v, int n, double *b1, double *b2)
{
    __m256 t1 = _mm256_loadu_ps(v), t2 = _mm256_set1_ps(-INFINITY);
    for (int i = 8; i < n; i += 8) {
        __m256 a = _mm256_loadu_ps(v + i);
        t2 = _mm256_max_ps(t2, _mm256_min_ps(t1, a));
        t1 = _mm256_max_ps(t1, a);
    }
    /* per lane t1 >= t2: the largest is max t1; the second, max t2 or the
     * largest of t1 without one lane holding the largest */
    __m256 h = _mm256_max_ps(t1, _mm256_permute2f128_ps(t1, t1, 1));
    h = _mm256_max_ps(h, _mm256_shuffle_ps(h, h, _MM_SHUFFLE(1, 0, 3, 2)));
    h = _mm256_max_ps(h, _mm256_shuffle_ps(h, h, _MM_SHUFFLE(2, 3, 0, 1)));
    __m256 eq = _mm256_cmp_ps(t1, h, _CMP_EQ_OQ);
    *b1 = _mm256_cvtss_f32(h);
    if (__builtin_popcount((unsigned)_mm256_movemask_ps(eq)) > 1) {
        *b2 = *b1;
        return;
    }
    __m256 r = _mm256_max_ps(_mm256_blendv_ps(t1, _mm256_set1_ps(-INFINITY), eq), t2);
    r = _mm256_max_ps(r, _mm256_permute2f128_ps(r, r, 1));
    r = _mm256_max_ps(r, _mm256_shuffle_ps(r, r, _MM_SHUFFLE(1, 0, 3, 2)));
    r = _mm256_max_ps(r, _mm256_shuffle_ps(r, r, _MM_SHUFFLE(2, 3, 0, 1)));
    *b2 = _mm256_cvtss_f32(r);
}

/* Indices i < n (n a multiple of 8) with v[i] >= thr, in order, into out
 * (n + 8); returns their number. */
__attribute__((target("avx2")))
static int append_ge_avx2(const float *v, int n, float thr, int32_t *out)
{
    __m256 t = _mm256_set1_ps(thr);
    __m256i jv = _mm256_setzero_si256();
    int c = 0;
    for (int j = 0; j < n; j += 8) {
        unsigned mask = (unsigned)_mm256_movemask_ps(
            _mm256_cmp_ps(_mm256_loadu_ps(v + j), t, _CMP_GE_OQ));
        _mm256_storeu_si256((__m256i *)(out + c),
                            _mm256_add_epi32(jv, _mm256_load_si256(
                                                     (const __m256i *)compress_lut32[mask])));
        jv = _mm256_add_epi32(jv, _mm256_set1_epi32(8));
        c += __builtin_popcount(mask);
    }
    return c;
}

/* The same with a double threshold (v[i] widened, compared exactly). */
__attribute__((target("avx2")))
static int append_ge_f64_avx2(const float *v, int n, double thr, int32_t *out)
{
    __m256d t = _mm256_set1_pd(thr);
    __m256i jv = _mm256_setzero_si256();
    int c = 0;
    for (int j = 0; j < n; j += 8) {
        __m256 a = _mm256_loadu_ps(v + j);
        unsigned lo = (unsigned)_mm256_movemask_pd(
            _mm256_cmp_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(a)), t, _CMP_GE_OQ));
        unsigned hi = (unsigned)_mm256_movemask_pd(
            _mm256_cmp_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)), t, _CMP_GE_OQ));
        unsigned mask = lo | hi << 4;
        _mm256_storeu_si256((__m256i *)(out + c),
                            _mm256_add_epi32(jv, _mm256_load_si256(
                                                     (const __m256i *)compress_lut32[mask])));
        jv = _mm256_add_epi32(jv, _mm256_set1_epi32(8));
        c += __builtin_popcount(mask);
    }
    return c;
}

/* lrmoe_route_row_sigmoid with the same result, computing the double-precision keys only
 * where they can matter: with F32 keys ka within delta of the exact ones, an
 * expert whose ka is below (K-th largest ka) - 2 delta has an exact key
 * strictly below the K-th largest exact key, and a group whose approximate
 * score (error <= 2 delta) is below (M-th largest) - 4 delta scores strictly
 * below M other groups; neither can be chosen, ties included. */
__attribute__((target("avx2,fma")))
int lrmoe_route_row_sigmoid_filter(const job_t *jb, const float *x, int32_t *ids, float *w,
                              double *key, float *ka, int32_t *cj, float *tvf, double *tv,
                              double *gscore, unsigned char *gok, double *sge,
                              int64_t *seen, int64_t t, int *bad)
{
    const lrmoe_route_opts_t *o = jb->o;
    int E = jb->E, K = jb->K;
    const float *b = jb->bias;
    if (approx_keys_avx2(x, b, E, ka))
        return lrmoe_route_row_sigmoid(jb, x, ids, w, key, tv, gscore, gok, bad); /* names the NaN */
    double delta = 1e-5 * (1.0 + jb->bmax);
    float tau;
    if (o->groups > 1) {
        int G = o->groups, M = o->topk_groups, gsize = E / G;
        /* approximate group scores into gscore (second best ka of each group
         * into key[G + g]), then their M-th largest */
        for (int g = 0; g < G; g++) {
            const float *kg = ka + (int64_t)g * gsize;
            double b1 = kg[0], b2 = -INFINITY;
            if (gsize % 8 == 0) {
                top2_avx2(kg, gsize, &b1, &b2);
            } else {
                for (int i = 1; i < gsize; i++) {
                    if (kg[i] > b1) { b2 = b1; b1 = kg[i]; }
                    else if (kg[i] > b2) b2 = kg[i];
                }
            }
            gscore[g] = gsize > 1 ? b1 + b2 : b1;
            if (gsize > 1)
                key[G + g] = b2; /* 2G <= E here */
            gok[g] = 0;
        }
        double gt = 0, gnext = -INFINITY;
        for (int m = 0; m < M; m++) {
            int best = -1;
            for (int g = 0; g < G; g++)
                if (!gok[g] && (best < 0 || gscore[g] > gscore[best]))
                    best = g;
            gok[best] = 1;
            gt = gscore[best];
        }
        for (int g = 0; g < G; g++) /* the best score left out */
            if (!gok[g] && gscore[g] > gnext)
                gnext = gscore[g];
        gt -= 4 * delta;
        /* every group left out scores below gt: the exact scores (error
         * <= 2 delta each way) choose the same M groups */
        int clear = gnext < gt;
        /* else the exact scores of the candidate groups (approximate score
         * >= gt) decide */
        for (int g = 0; g < G && !clear; g++) {
            gok[g] = 0;
            if (!(gscore[g] >= gt)) {
                gscore[g] = -INFINITY;
                continue;
            }
            /* the group's exact top two are among its ka >= b2 - 2 delta */
            const float *kg = ka + (int64_t)g * gsize;
            double lim = gsize > 1 ? key[G + g] - 2 * delta : -INFINITY;
            int n = 0;
            if (gsize % 8 == 0) {
                n = append_ge_f64_avx2(kg, gsize, lim, cj);
            } else {
                for (int i = 0; i < gsize; i++) {
                    cj[n] = i;
                    n += kg[i] >= lim;
                }
            }
            double e1 = -INFINITY, e2 = -INFINITY;
            for (int q = 0; q < n; q++) {
                int64_t j = (int64_t)g * gsize + cj[q];
                double sg = route_sigmoid(x[j]);
                sge[j] = sg; /* for the exact keys below */
                seen[j] = t;
                double v = sg + (b ? (double)b[j] : 0.0);
                if (v > e1) { e2 = e1; e1 = v; }
                else if (v > e2) e2 = v;
            }
            gscore[g] = gsize > 1 ? e1 + e2 : e1;
        }
        for (int m = 0; m < M && !clear; m++) {
            int best = -1;
            for (int g = 0; g < G; g++)
                if (!gok[g] && (best < 0 || gscore[g] > gscore[best]))
                    best = g;
            gok[best] = 1;
        }
        /* experts outside the chosen groups drop out of ka */
        for (int g = 0; g < G; g++) {
            if (gok[g])
                continue;
            float *kg = ka + (int64_t)g * gsize;
            int i = 0;
            for (; i + 8 <= gsize; i += 8)
                _mm256_storeu_ps(kg + i, _mm256_set1_ps(-INFINITY));
            for (; i < gsize; i++)
                kg[i] = -INFINITY;
        }
    }
    {
        /* the K-th largest ka (no NaN in ka) */
        float kth;
        int c;
        if (K <= 8 && E <= EMAX && (c = top8_stage1(ka, E, jb->cv, jb->ci)) <= 16 &&
            top8_stage2_16(jb->cv, jb->ci, c, jb->cv + E + 16, jb->ci + E + 16) == 0) {
            kth = jb->cv[E + 16 + K - 1];
        } else {
            int dummy;
            jb->topk(ka, E, K, tvf, ids, &dummy);
            kth = tvf[K - 1];
        }
        tau = (float)((double)kth - 2 * delta);
        /* candidates in index order (branch-free append), then exact keys */
        int n = append_ge_avx2(ka, E, tau, cj);
        for (int i = 0; i < n; i++) {
            int j = cj[i];
            if (seen[j] != t) {
                sge[j] = route_sigmoid(x[j]); /* also for the weights */
                seen[j] = t;
            }
            key[i] = sge[j] + (b ? (double)b[j] : 0.0);
        }
        int got = 0;
        double thr = 0;
        for (int i = 0; i < n; i++) {
            double v = key[i];
            if (got < K) {
                INSERT(tv, ids, got, v, cj[i]);
                if (++got == K)
                    thr = tv[K - 1];
            } else if (v > thr) {
                INSERT(tv, ids, K - 1, v, cj[i]);
                thr = tv[K - 1];
            }
        }
    }
    double sum = 0, *wd = tv;
    for (int k = 0; k < K; k++) {
        wd[k] = sge[ids[k]];
        sum += wd[k];
    }
    double f = o->renorm ? o->scale / (sum + 1e-20) : o->scale;
    for (int k = 0; k < K; k++)
        w[k] = (float)(wd[k] * f);
    return 0;
}
#endif

#ifdef ROUTE_X86
/* the exported entry points of the two kernels above (the row loops here
 * call the static inline ones, so they stay inlined) */
__attribute__((target("avx2")))
int lrmoe_route_topk_avx2(const float *x, int E, int K, float *tv, int32_t *ti, int *bad)
{
    return topk_f32_avx2_bound(x, E, K, tv, ti, bad);
}

__attribute__((target("avx2,fma")))
void lrmoe_route_weights_avx2(const float *tv, int K, float m, float s, float scale, float *w)
{
    weights_avx2(tv, K, m, s, scale, w);
}

void lrmoe_route_avx2_init(void)
{
    pthread_once(&compress_once, compress_init);
}
#endif
