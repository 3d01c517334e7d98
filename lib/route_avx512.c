/* route_avx512: the softmax routers' top-K (K <= 8) with AVX-512, sixteen
 * logits a vector (see route_internal.h).
 *
 * Per row, without a data-dependent branch in the common case:
 * 1. the 16 column maxima of the row seen as vectors of 16 belong to 16
 *    distinct logits, so the 8th largest of them, b, is a lower bound of
 *    the K-th largest logit (K <= 8): both halves of the maxima vector are
 *    sorted by a bitonic network and merged to find b;
 * 2. the logits >= b (about 10 of 128 for random logits, at most 16 in
 *    99.6% of rows) are compressed, with their expert numbers and in expert
 *    order, into a candidate list (a NaN always compares as a candidate, so
 *    step 3 sees it);
 * 3. the (at most 16) candidates get int sort keys that order like the
 *    floats with the slot in the low 4 bits (distinct keys, the lower expert
 *    first among equal values) and go through a 16-lane bitonic network;
 *    unequal values whose keys agree above the slot bits (within 16 ulps)
 *    take a rank count that breaks ties by expert number instead;
 * 4. the weights are exps of the K largest.
 * The networks of steps 1 and 3 are long chains of dependent shuffles, so
 * four rows go through them interleaved. Steps 1, 2 and 3-4 each run over a
 * block of rows before the next: step 3 reads back as one vector what step 2
 * stored piecewise, which a store buffer cannot forward, while a block later
 * the stores have reached the cache. The caller's next block is prefetched
 * a few lines at a time during steps 2-3: a single core streams from memory
 * at about the rate it computes, and the two only overlap this way. */
#include "route_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define T512                                                                         \
    __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi2,avx2,fma,bmi,bmi2," \
                          "popcnt")))

int lrmoe_route_avx512_ok(void)
{
    const char *e = getenv("LRMOE_NO_SIMD");
    if (e && *e && strcmp(e, "0") != 0)
        return 0;
    e = getenv("LRMOE_NO_AVX512");
    if (e && *e && strcmp(e, "0") != 0)
        return 0;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vbmi2") &&
           __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt") &&
           __builtin_cpu_supports("fma");
}

/* One compare-exchange stage: lanes in kmax keep the larger of v and p. */
T512 static inline __m512 cx(__m512 v, __m512 p, __mmask16 kmax)
{
    return _mm512_mask_max_ps(_mm512_min_ps(v, p), kmax, v, p);
}

/* exp(x) for x <= 0: route_exp_neg256 on 16 lanes (Cephes expf,
 * about 1 ulp); arguments below -87 are clamped to -87. */
T512 static inline __m512 exp_neg512(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500E-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

/* Step 1 for four rows at once (the network is a long chain of dependent
 * shuffles; four independent ones keep the vector units busy): bnd = the
 * bound, mx = the maximum of each row (without NaN). */
T512 static inline void bounds4(const float *const xr[4], int E, float bnd[4], float mx[4])
{
    __m512 m[4];
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        const float *x = xr[q];
        __m512 a = _mm512_loadu_ps(x), b = E > 16 ? _mm512_loadu_ps(x + 16) : a;
        int j = 32;
        for (; j + 32 <= E; j += 32) {
            a = _mm512_max_ps(a, _mm512_loadu_ps(x + j));
            b = _mm512_max_ps(b, _mm512_loadu_ps(x + j + 16));
        }
        if (j < E)
            a = _mm512_max_ps(a, _mm512_loadu_ps(x + j));
        m[q] = _mm512_max_ps(a, b);
    }
    /* each half sorted in decreasing order: route.c's sort8_desc network */
#define STAGE(perm, kmax)                                                   \
    _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) m[q] = cx(m[q], perm, kmax)
    STAGE(_mm512_permute_ps(m[q], 0xB1), 0x9999);       /* swap neighbours */
    STAGE(_mm512_permute_ps(m[q], 0x4E), 0xC3C3);       /* swap pairs */
    STAGE(_mm512_permute_ps(m[q], 0xB1), 0xA5A5);
    STAGE(_mm512_shuffle_f32x4(m[q], m[q], 0xB1), 0x0F0F); /* swap quads */
    STAGE(_mm512_permute_ps(m[q], 0x4E), 0x3333);
    STAGE(_mm512_permute_ps(m[q], 0xB1), 0x5555);
#undef STAGE
    const __m512i rev = _mm512_setr_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        mx[q] = _mm_cvtss_f32(
            _mm_max_ss(_mm512_castps512_ps128(m[q]), _mm512_extractf32x4_ps(m[q], 2)));
        /* lanes 0-7 of max(m, reversed m) are the 8 largest maxima, and so
         * are lanes 8-15: the bound is their minimum */
        __m512 t = _mm512_max_ps(m[q], _mm512_permutexvar_ps(rev, m[q]));
        t = _mm512_min_ps(t, _mm512_shuffle_f32x4(t, t, 0xB1));
        t = _mm512_min_ps(t, _mm512_permute_ps(t, 0x4E));
        t = _mm512_min_ps(t, _mm512_permute_ps(t, 0xB1));
        bnd[q] = _mm512_cvtss_f32(t);
    }
}

/* Step 2 for one row: the candidates x >= bnd (or NaN) into cv, then 16
 * -inf into cv; their expert numbers into ci, as bytes when E <= 256 (one
 * compress per 64 experts instead of one per 16). Returns their number. */
T512 static inline int candidates512(const float *x, int E, float bnd, float *cv, int32_t *ci)
{
    __m512 b = _mm512_set1_ps(bnd);
    int c = 0;
    if (E <= 256) {
        uint8_t *cb = (uint8_t *)ci;
        const __m512i iota = _mm512_set_epi8(
            63, 62, 61, 60, 59, 58, 57, 56, 55, 54, 53, 52, 51, 50, 49, 48, 47, 46, 45, 44, 43,
            42, 41, 40, 39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22,
            21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        int nb = 0;
        uint64_t m = 0;
#pragma GCC unroll 8
        for (int j = 0; j < E; j += 16) {
            __m512 a = _mm512_loadu_ps(x + j);
            __mmask16 k = _mm512_cmp_ps_mask(b, a, _CMP_NGT_UQ); /* a >= b, or NaN */
            _mm512_storeu_ps(cv + c, _mm512_maskz_compress_ps(k, a));
            c += _mm_popcnt_u32(k);
            m |= (uint64_t)k << (j & 63);
            if ((j & 63) == 48 || j + 16 >= E) {
                _mm512_storeu_si512(cb + nb, _mm512_maskz_compress_epi8(
                                                 m, _mm512_add_epi8(iota, _mm512_set1_epi8(
                                                                              (char)(j & ~63)))));
                nb += (int)_mm_popcnt_u64(m);
                m = 0;
            }
        }
    } else {
        __m512i jv = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#pragma GCC unroll 8
        for (int j = 0; j < E; j += 16) {
            __m512 a = _mm512_loadu_ps(x + j);
            __mmask16 k = _mm512_cmp_ps_mask(b, a, _CMP_NGT_UQ);
            _mm512_storeu_ps(cv + c, _mm512_maskz_compress_ps(k, a));
            _mm512_storeu_si512(ci + c, _mm512_maskz_compress_epi32(k, jv));
            jv = _mm512_add_epi32(jv, _mm512_set1_epi32(16));
            c += _mm_popcnt_u32(k);
        }
    }
    _mm512_storeu_ps(cv + c, _mm512_set1_ps(-INFINITY));
    return c;
}

/* The expert numbers of the first 16 candidates, from candidates512's ci. */
T512 static inline __m512i candidate_ids(const int32_t *ci, int E)
{
    return E <= 256 ? _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)ci))
                    : _mm512_loadu_si512(ci);
}

/* Ranks of the 16 slots of cv (v) when some are equal: an equal value in
 * an earlier slot (a lower expert) counts as above. */
T512 __attribute__((noinline)) static __m512i ranks_ties512(const float *cv, __m512 v)
{
    __m512i rank = _mm512_setzero_si512(), one = _mm512_set1_epi32(1);
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) {
        __m512 vj = _mm512_set1_ps(cv[j]);
        __mmask16 beat = _mm512_cmp_ps_mask(vj, v, _CMP_GT_OQ) |
                         (_mm512_cmp_ps_mask(vj, v, _CMP_EQ_OQ) & (__mmask16)(0xFFFEu << j));
        rank = _mm512_mask_add_epi32(rank, beat, rank, one);
    }
    return rank;
}

/* Sort keys of the candidates: the float's bits as an int that orders
 * like the float (-0 made +0 first), the low 4 bits replaced by 15 - slot,
 * so that keys are distinct and an equal value in a lower slot (a lower
 * expert) sorts first. Values that agree but for those 4 bits may sort out
 * of order: weights512 checks the picks for that. */
T512 static inline __m512i sortkey(__m512 v)
{
    __m512i k = _mm512_castps_si512(_mm512_add_ps(v, _mm512_setzero_ps()));
    k = _mm512_xor_si512(k, _mm512_srli_epi32(_mm512_srai_epi32(k, 31), 1));
    return _mm512_or_si512(_mm512_and_si512(k, _mm512_set1_epi32(~15)),
                           _mm512_setr_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0));
}

/* The keys of four rows sorted in decreasing order by a bitonic network,
 * the four networks interleaved (each is a chain of dependent shuffles). */
T512 static inline void sort16x4(__m512i k[4])
{
#define STAGE4(kmax, perm)                                                              \
    _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {                               \
        __m512i p_ = perm;                                                              \
        k[q] = _mm512_mask_max_epi32(_mm512_min_epi32(k[q], p_), (__mmask16)(kmax), k[q], \
                                     p_);                                               \
    }
    /* (block, distance) = (2,1) (4,2) (4,1) (8,4) (8,2) (8,1) (16,8) (16,4)
     * (16,2) (16,1); the mask: the lanes that keep the larger key */
    STAGE4(0x9999, _mm512_shuffle_epi32(k[q], 0xB1));
    STAGE4(0xc3c3, _mm512_shuffle_epi32(k[q], 0x4E));
    STAGE4(0xa5a5, _mm512_shuffle_epi32(k[q], 0xB1));
    STAGE4(0xf00f, _mm512_shuffle_i32x4(k[q], k[q], 0xB1));
    STAGE4(0xcc33, _mm512_shuffle_epi32(k[q], 0x4E));
    STAGE4(0xaa55, _mm512_shuffle_epi32(k[q], 0xB1));
    STAGE4(0x00ff, _mm512_shuffle_i32x4(k[q], k[q], 0x4E));
    STAGE4(0x0f0f, _mm512_shuffle_i32x4(k[q], k[q], 0xB1));
    STAGE4(0x3333, _mm512_shuffle_epi32(k[q], 0x4E));
    STAGE4(0x5555, _mm512_shuffle_epi32(k[q], 0xB1));
#undef STAGE4
}

/* The K picks, sorted, from the rank count of ranks_ties512 on the
 * unsorted candidates: for rows whose sort keys could not order them
 * (unequal values within 16 ulps; see weights512). */
T512 __attribute__((noinline)) static void picks_ties512(const float *cv, __m512i idv, int c,
                                                         int K, __m512 *pv, __m512i *pid)
{
    __m512 v = _mm512_loadu_ps(cv);
    __m512i rank = ranks_ties512(cv, v);
    _Alignas(64) float sv[16];
    _Alignas(64) int32_t si[16], ci[16];
    _mm512_store_si512(ci, idv);
    for (int r = 0; r < K; r++) {
        int p = __builtin_ctz(_mm512_mask_cmpeq_epi32_mask((__mmask16)((1u << c) - 1), rank,
                                                           _mm512_set1_epi32(r)));
        sv[r] = cv[p];
        si[r] = ci[p];
    }
    *pv = _mm512_maskz_loadu_ps((__mmask16)((1u << K) - 1), sv);
    *pid = _mm512_maskz_loadu_epi32((__mmask16)((1u << K) - 1), si);
}

/* Step 4 for one row whose candidates cv, ci (c <= 16) have the sorted
 * keys key. 0, or 1 to leave the row to the caller (a pick's exp below
 * FLT_MIN). */
T512 static inline int weights512(const float *x, int E, int K, int full, float scale,
                                  const float *cv, const int32_t *ci, int c, float mx,
                                  __m512i key, int32_t *ids, float *w)
{
    __mmask16 kk = (__mmask16)((1u << K) - 1);
    __m512 v;
    __m512i id, idv = candidate_ids(ci, E);
    __m512i slot = _mm512_sub_epi32(_mm512_set1_epi32(15),
                                    _mm512_and_si512(key, _mm512_set1_epi32(15)));
    v = _mm512_permutexvar_ps(slot, _mm512_loadu_ps(cv));
    id = _mm512_permutexvar_epi32(slot, idv);
    /* Equal keys but for the slot bits sort by slot, which is right for
     * equal values (the lower expert first) but maybe not for values that
     * differ in the 4 bits the slot replaced: any two such neighbours (a run
     * of equal high bits holding unequal values has some) and the exact rank
     * count decides instead. BF16 logits never get there: their low 16 bits
     * are zero. */
    __m512i hi = _mm512_srai_epi32(key, 4);
    __m512 vn = _mm512_castsi512_ps(
        _mm512_alignr_epi32(_mm512_castps_si512(v), _mm512_castps_si512(v), 1));
    if (_mm512_mask_cmp_ps_mask(_mm512_mask_cmpeq_epi32_mask(0x7fff, hi,
                                                             _mm512_alignr_epi32(hi, hi, 1)),
                                v, vn, _CMP_NEQ_OQ))
        picks_ties512(cv, idv, c, K, &v, &id);
    /* the K <= 8 picks are the low half: 256-bit arithmetic from here */
    __m256 d = _mm256_maskz_sub_ps(kk, _mm512_castps512_ps256(v), _mm256_set1_ps(mx));
    if (_mm256_cmp_ps_mask(d, _mm256_set1_ps(-87.0f), _CMP_LT_OQ))
        return 1;
    __m256 e = _mm256_maskz_mov_ps(kk, route_exp_neg256(d));
    float s;
    if (full) {
        __m512 acc = _mm512_setzero_ps(), vm = _mm512_set1_ps(mx);
        for (int j = 0; j < E; j += 16)
            acc = _mm512_add_ps(acc, exp_neg512(_mm512_sub_ps(_mm512_loadu_ps(x + j), vm)));
        s = _mm512_reduce_add_ps(acc);
    } else {
        __m128 q = _mm_add_ps(_mm256_castps256_ps128(e), _mm256_extractf128_ps(e, 1));
        q = _mm_add_ps(q, _mm_movehl_ps(q, q));
        s = _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
    }
    __m256 wv = _mm256_mul_ps(e, _mm256_set1_ps((float)((double)scale / (double)s)));
    if (K == 8) { /* plain stores where they fit: no store forwarding from masked ones */
        _mm256_storeu_ps(w, wv);
        _mm256_storeu_si256((__m256i *)ids, _mm512_castsi512_si256(id));
    } else {
        _mm256_mask_storeu_ps(w, kk, wv);
        _mm256_mask_storeu_epi32(ids, kk, _mm512_castsi512_si256(id));
    }
    return 0;
}

T512 uint32_t lrmoe_route_softmax_rows512(const float *x, int nb, int E, int K, int full,
                                    float scale, int32_t *ids, float *w, float *cv,
                                    int32_t *ci, const void *next, size_t nnext)
{
    size_t stride = (size_t)E + 32;
    int nc[ROUTE512_ROWS];
    float mx[ROUTE512_ROWS];
    uint32_t left = 0;
    float bnd[ROUTE512_ROWS];
    for (int r0 = 0; r0 < nb; r0 += 4) {
        const float *xr[4];
        float b4[4], m4[4];
        for (int q = 0; q < 4; q++)
            xr[q] = x + (size_t)(r0 + q < nb ? r0 + q : nb - 1) * E;
        bounds4(xr, E, b4, m4);
        for (int q = 0; q < 4 && r0 + q < nb; q++) {
            bnd[r0 + q] = b4[q];
            mx[r0 + q] = m4[q];
        }
    }
    /* the next block's lines, spread over the candidate and the pick loops */
    const char *pfp = (const char *)next, *pfe = pfp + nnext;
    size_t pfrow = (nnext + 2 * (size_t)nb - 1) / (2 * (size_t)nb);
    if (nnext)
        route_prefetch_out(ids + nb * K, w + nb * K, (size_t)nb * K * 4);
    for (int r = 0; r < nb; r++) {
        route_prefetch_step(&pfp, pfe, pfrow);
        nc[r] = candidates512(x + (size_t)r * E, E, bnd[r], cv + r * stride, ci + r * stride);
    }
    for (int r0 = 0; r0 < nb; r0 += 4) {
        __m512i key[4];
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            int r = r0 + q < nb ? r0 + q : nb - 1;
            __m512 v = _mm512_loadu_ps(cv + r * stride);
            /* NaN, an infinite maximum, too many candidates: the caller's */
            if (nc[r] > 16 || _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) ||
                !(mx[r] > -INFINITY && mx[r] < INFINITY))
                left |= 1u << r;
            key[q] = sortkey(v);
        }
        route_prefetch_step(&pfp, pfe, 4 * pfrow);
        sort16x4(key);
        for (int q = 0; q < 4 && r0 + q < nb; q++) {
            int r = r0 + q;
            if (!((left >> r) & 1) &&
                weights512(x + (size_t)r * E, E, K, full, scale, cv + r * stride,
                           ci + r * stride, nc[r], mx[r], key[q], ids + (size_t)r * K,
                           w + (size_t)r * K))
                left |= 1u << r;
        }
    }
    route_prefetch_step(&pfp, pfe, nnext);
    return left;
}

#else

int lrmoe_route_avx512_ok(void)
{
    return 0;
}

uint32_t lrmoe_route_softmax_rows512(const float *x, int nb, int E, int K, int full,
                               float scale, int32_t *ids, float *w, float *cv, int32_t *ci,
                               const void *next, size_t nnext)
{
    (void)x; (void)E; (void)K; (void)full; (void)scale; (void)ids; (void)w;
    (void)cv; (void)ci; (void)next; (void)nnext;
    return nb >= 32 ? 0xffffffffu : (1u << nb) - 1; /* all left to the caller */
}

#endif
