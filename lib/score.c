/* score: backward pair scores, per-expert retention, gradient fidelity.
 * See score.h for the metrics, the order and the selection. */
#include "par.h"
#include "score.h"

#include "blas.h"
#include "clock.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *metric_names[LRMOE_NMETRICS] = {
    "lrm", "gradnorm", "absgrad", "random", "uniform"
};
static const char *select_names[LRMOE_NKEEP_RULES] = {"topk", "sample"};

int lrmoe_score_keep_rule_parse(const char *s, lrmoe_keep_rule_t *sel)
{
    for (int i = 0; i < LRMOE_NKEEP_RULES; i++)
        if (s && strcmp(s, select_names[i]) == 0) {
            *sel = (lrmoe_keep_rule_t)i;
            return 0;
        }
    return lrmoe_err("unknown selection '%s' (topk, sample)", s ? s : "");
}

const char *lrmoe_score_keep_rule_name(lrmoe_keep_rule_t sel)
{
    return (unsigned)sel < LRMOE_NKEEP_RULES ? select_names[sel] : "?";
}

int lrmoe_score_metric_parse(const char *s, lrmoe_metric_t *m)
{
    for (int i = 0; i < LRMOE_NMETRICS; i++)
        if (s && strcmp(s, metric_names[i]) == 0) {
            *m = (lrmoe_metric_t)i;
            return 0;
        }
    return lrmoe_err("unknown metric '%s' (lrm, gradnorm, absgrad, random, uniform)",
                     s ? s : "");
}

const char *lrmoe_score_metric_name(lrmoe_metric_t m)
{
    return (unsigned)m < LRMOE_NMETRICS ? metric_names[m] : "?";
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

float lrmoe_score_random(uint64_t seed, int64_t u)
{
    uint64_t h = splitmix64(seed ^ (((uint64_t)u + 1) * 0xD1B54A32D192ED03ull));
    return (float)(h >> 40) * (1.0f / 16777216.0f);
}

int64_t lrmoe_score_drop_quota(int64_t n, double C)
{
    if (n <= 0)
        return 0;
    int64_t d = (int64_t)floor((double)n * C / 100.0 + 1e-9);
    if (d < 0)
        d = 0;
    if (d > n)
        d = n;
    return n - d;
}

static int bad_score(int64_t u, int K, double s)
{
    return lrmoe_err("pair_score: %s score at pair %lld (token %lld, k %d)",
                     isnan(s) ? "NaN" : "infinite", (long long)u,
                     (long long)(u / K), (int)(u % K));
}

int lrmoe_score_pairs(lrmoe_metric_t m, int64_t T, int K, int64_t D,
                      const float *g, const float *alpha,
                      const float *phi_sqnorm, uint64_t seed, float *score)
{
    return lrmoe_score_pairs_dt(m, T, K, D, LRMOE_F32, g, alpha, phi_sqnorm,
                                seed, score);
}

typedef struct {
    lrmoe_metric_t m;
    int K;
    int64_t D;
    lrmoe_dtype_t gdt;
    const void *g;
    const float *alpha, *phi_sqnorm;
    uint64_t seed;
    float *score;
} pairs_job_t;

/* sum over d of |x_d| (absval) or x_d^2, in double: eight partial sums
 * (lane l takes d = l mod 8 up to the last multiple of 8, lane 0 the rest
 * in order), added in a fixed tree at the end, so
 * the result depends on D and the values only (not on threads or the
 * machine) and the adds do not wait on one another: a single running sum is
 * one chain of D dependent double adds per token, which was 70% of
 * lrmoe-score at 2048 tokens x D=2048 (perf). Each term is exact in double
 * (a float squared needs 48 bits); only the order of the adds changed. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
__attribute__((optimize("O3"), target_clones("avx512f", "avx2", "default")))
#endif
static double row_sum(const float *x, int64_t D, int absval)
{
    /* eight named partial sums (an array of them stays in memory at -O2) */
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    int64_t d = 0;
#define LANES(T)                                                                        \
    for (; d + 8 <= D; d += 8) {                                                        \
        a0 += T(x[d]); a1 += T(x[d + 1]); a2 += T(x[d + 2]); a3 += T(x[d + 3]);          \
        a4 += T(x[d + 4]); a5 += T(x[d + 5]); a6 += T(x[d + 6]); a7 += T(x[d + 7]);      \
    }                                                                                   \
    for (; d < D; d++) /* the D mod 8 last ones, in order */                            \
        a0 += T(x[d]);
#define ABS_(v) fabs((double)(v))
#define SQ_(v) ((double)(v) * (double)(v))
    if (absval) {
        LANES(ABS_)
    } else {
        LANES(SQ_)
    }
#undef LANES
#undef ABS_
#undef SQ_
    return ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7));
}

/* tokens [t0, t1) of lrmoe_score_pairs_dt */
static int score_tokens(void *vp, int64_t t0, int64_t t1)
{
    const pairs_job_t *j = vp;
    const lrmoe_metric_t m = j->m;
    const int K = j->K;
    const int64_t D = j->D;
    float *row = NULL;
    const int need_g = m != LRMOE_METRIC_RANDOM && m != LRMOE_METRIC_UNIFORM;
    if (need_g &&
        !(row = malloc((size_t)(D ? D : 1) * sizeof *row)))
        return lrmoe_err("out of memory");
    const size_t rb = (size_t)D * lrmoe_dtype_size(j->gdt);
    for (int64_t t = t0; t < t1; t++) {
        double gt = 0;
        if (need_g) {
            /* D = 0: an empty grad_output has no data (g NULL: no offset) */
            lrmoe_convert_to_f32(j->gdt, rb ? (const char *)j->g + (size_t)t * rb : j->g, row,
                                 (size_t)D);
            gt = row_sum(row, D, m == LRMOE_METRIC_ABSGRAD);
        }
        for (int k = 0; k < K; k++) {
            int64_t u = t * K + k;
            double s;
            switch (m) {
            case LRMOE_METRIC_LRM: {
                double a = j->alpha[u];
                s = a * a * gt * (double)j->phi_sqnorm[u];
                break;
            }
            case LRMOE_METRIC_RANDOM:
                s = lrmoe_score_random(j->seed, u);
                break;
            case LRMOE_METRIC_UNIFORM:
                s = 1.0;
                break;
            default:
                s = gt;
            }
            float sf = (float)s;
            if (!isfinite(sf)) {
                free(row);
                return bad_score(u, K, s);
            }
            j->score[u] = sf == 0.0f ? 0.0f : sf; /* no -0 */
        }
    }
    free(row);
    return 0;
}

/* lrmoe_score_pairs_dt over token ranges on `threads` threads (same bits) */
static int score_pairs_mt(lrmoe_metric_t m, int64_t T, int K, int64_t D,
                          lrmoe_dtype_t gdt, const void *g, const float *alpha,
                          const float *phi_sqnorm, uint64_t seed, float *score,
                          int threads)
{
    if (m == LRMOE_METRIC_LRM && (!alpha || !phi_sqnorm))
        return lrmoe_err("metric lrm needs topk_weights and phi_sqnorm");
    if (m != LRMOE_METRIC_RANDOM && m != LRMOE_METRIC_UNIFORM &&
        ((!g && T * D > 0) || !lrmoe_dtype_is_float(gdt)))
        return lrmoe_err("metric %s needs a float grad_output",
                         lrmoe_score_metric_name(m));
    pairs_job_t j = {m, K, D, gdt, g, alpha, phi_sqnorm, seed, score};
    return lrmoe_parallel_ranges(T, threads, 64, score_tokens, &j);
}

int lrmoe_score_pairs_dt(lrmoe_metric_t m, int64_t T, int K, int64_t D,
                         lrmoe_dtype_t gdt, const void *g, const float *alpha,
                         const float *phi_sqnorm, uint64_t seed, float *score)
{
    return score_pairs_mt(m, T, K, D, gdt, g, alpha, phi_sqnorm, seed, score, 1);
}

/* ---------------------------------------------------------------- select */

/* Order-preserving map of a (non-NaN) float to u32. */
static inline uint32_t ord32(float f)
{
    uint32_t b;
    if (f == 0.0f)
        f = 0.0f;
    memcpy(&b, &f, 4);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* Larger key = ranked higher: score first, then lower u. */
static inline uint64_t make_key(float s, int64_t u)
{
    return ((uint64_t)ord32(s) << 32) | (uint64_t)(0xFFFFFFFFu - (uint32_t)u);
}
static inline int64_t key_pair(uint64_t k)
{
    return (int64_t)(0xFFFFFFFFu - (uint32_t)(k & 0xFFFFFFFFu));
}

static inline void swap64(uint64_t *a, uint64_t *b)
{
    uint64_t t = *a;
    *a = *b;
    *b = t;
}

/* Rearrange a[0..n) so that a[0..q) holds the q largest keys (keys are
 * distinct). Quickselect with a median-of-three pseudo-random pivot:
 * expected O(n) on any input. */
static void select_top(uint64_t *a, int64_t n, int64_t q, uint64_t *rng)
{
    int64_t lo = 0, hi = n - 1;
    if (q <= 0 || q >= n)
        return;
    /* invariant: the answer boundary q lies in [lo, hi+1] */
    while (hi > lo) {
        int64_t len = hi - lo + 1;
        uint64_t r = splitmix64(*rng += 0x9E3779B97F4A7C15ull);
        int64_t i1 = lo + (int64_t)(r % (uint64_t)len);
        int64_t i2 = lo + (int64_t)((r >> 21) % (uint64_t)len);
        int64_t i3 = lo + (int64_t)((r >> 42) % (uint64_t)len);
        uint64_t x = a[i1], y = a[i2], z = a[i3], piv;
        if ((x < y) ^ (x < z))
            piv = x;
        else if ((y < x) ^ (y < z))
            piv = y;
        else
            piv = z;
        /* partition descending: [lo, i) > piv, then piv, then < piv */
        int64_t pi = i1;
        if (a[i2] == piv)
            pi = i2;
        else if (a[i3] == piv)
            pi = i3;
        swap64(&a[pi], &a[hi]);
        int64_t st = lo;
        for (int64_t i = lo; i < hi; i++)
            if (a[i] > piv)
                swap64(&a[i], &a[st++]);
        swap64(&a[st], &a[hi]);
        /* a[lo..st) > piv = a[st] > a(st..hi] */
        if (st == q || st + 1 == q)
            return;
        if (st > q)
            hi = st - 1;
        else
            lo = st + 1;
    }
}

typedef struct {
    uint64_t *keys;
    const int64_t *off, *load, *quota;
    double drop_pct;
    uint8_t *keep;
} select_job_t;

/* experts [e0, e1): the top quota of each bucket; the kept set does not
 * depend on the pivots (keys are distinct), so each expert has its own
 * pivot stream and experts can run in any order */
static int select_experts(void *vp, int64_t e0, int64_t e1)
{
    const select_job_t *j = vp;
    for (int64_t e = e0; e < e1; e++) {
        int64_t n = j->load[e];
        int64_t q = j->quota ? j->quota[e] : lrmoe_score_drop_quota(n, j->drop_pct);
        uint64_t *a = j->keys + j->off[e];
        uint64_t rng = 0x5EEDull ^ (uint64_t)e;
        select_top(a, n, q, &rng);
        for (int64_t i = 0; i < q; i++)
            j->keep[key_pair(a[i])] = 1;
    }
    return 0;
}

static int score_select_mt(int64_t T, int K, int E, const int32_t *topk_ids,
                           const float *score, const int64_t *quota,
                           double drop_pct, uint8_t *keep, int64_t *load,
                           int64_t *quota_out, int threads);

int lrmoe_score_select(int64_t T, int K, int E, const int32_t *topk_ids,
                       const float *score, const int64_t *quota,
                       double drop_pct, uint8_t *keep, int64_t *load,
                       int64_t *quota_out)
{
    return score_select_mt(T, K, E, topk_ids, score, quota, drop_pct, keep, load,
                           quota_out, 1);
}

/* Pair u's expert e in [0,E) and its score not NaN; -1 with the error set. */
static int check_pair(int64_t u, int32_t e, int E, int K, const float *score)
{
    if (e < 0 || e >= E)
        return lrmoe_err("topk_ids: expert %d at pair %lld out of range [0,%d)", (int)e,
                         (long long)u, E);
    return isnan(score[u]) ? bad_score(u, K, score[u]) : 0;
}

static int score_select_mt(int64_t T, int K, int E, const int32_t *topk_ids,
                           const float *score, const int64_t *quota,
                           double drop_pct, uint8_t *keep, int64_t *load,
                           int64_t *quota_out, int threads)
{
    int64_t N = T * K;
    if (N >= (int64_t)0xFFFFFFFF)
        return lrmoe_err("too many pairs (%lld) for one frame", (long long)N);
    if (!quota && drop_pct < 0)
        return lrmoe_err("no quota and no drop rate");
    int64_t *off = calloc((size_t)E + 1, sizeof *off);
    uint64_t *keys = malloc((size_t)(N ? N : 1) * sizeof *keys);
    if (!off || !keys) {
        free(off);
        free(keys);
        return lrmoe_err("out of memory");
    }
    int rc = -1;
    memset(load, 0, (size_t)E * sizeof *load);
    for (int64_t u = 0; u < N; u++) {
        int32_t e = topk_ids[u];
        if (check_pair(u, e, E, K, score) < 0)
            goto out;
        load[e]++;
    }
    for (int e = 0; e < E; e++) {
        int64_t q = quota ? quota[e] : lrmoe_score_drop_quota(load[e], drop_pct);
        if (q < 0 || q > load[e]) {
            lrmoe_err("quota: expert %d has quota %lld but %lld routed pairs",
                      e, (long long)q, (long long)load[e]);
            goto out;
        }
        if (quota_out)
            quota_out[e] = q;
        off[e + 1] = off[e] + load[e];
    }
    /* bucket keys by expert (u ascending inside each bucket) */
    {
        int64_t *pos = malloc((size_t)(E ? E : 1) * sizeof *pos);
        if (!pos) {
            lrmoe_err("out of memory");
            goto out;
        }
        memcpy(pos, off, (size_t)E * sizeof *pos);
        for (int64_t u = 0; u < N; u++)
            keys[pos[topk_ids[u]]++] = make_key(score[u], u);
        free(pos);
    }
    memset(keep, 0, (size_t)N);
    {
        select_job_t j = {keys, off, load, quota, drop_pct, keep};
        rc = lrmoe_parallel_ranges(E, threads, 1, select_experts, &j);
    }
out:
    free(off);
    free(keys);
    return rc;
}

/* ---------------------------------------------------------------- sample */

/* The offset r in [0,1) of bucket b's systematic draw: 53 bits of a
 * splitmix64 hash of (seed, b), a stream apart from lrmoe_score_random's. */
static double sample_offset(uint64_t seed, int64_t b)
{
    uint64_t h = splitmix64(seed ^ (((uint64_t)b + 1) * 0x8CB92BA72F3D8DD7ull));
    return (double)(splitmix64(h) >> 11) * (1.0 / 9007199254740992.0);
}

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* Water-filling of one bucket: s[0..n) = sqrt(score) >= 0, npos of them
 * positive, with sum S, and q < npos. Returns c with sum_i min(1, c s_i)
 * = q. Capping the pairs with c s_i >= 1 and spreading the rest again
 * converges in a few passes on real scores; past 32 passes (scores spread
 * over many orders of magnitude) the exact answer comes from the sorted
 * values: the least m with (q - m) s_(m) < sum_{i>=m} s_(i). tmp: n. */
static double waterfill(const double *s, int64_t n, int64_t q, double S, double *tmp)
{
    int64_t m = 0;
    double Su = S, c = (double)q / S;
    for (int pass = 0; pass < 32; pass++) {
        int64_t m2 = 0;
        double Su2 = 0;
        for (int64_t i = 0; i < n; i++) {
            if (c * s[i] >= 1.0)
                m2++;
            else
                Su2 += s[i];
        }
        if (m2 == m)
            return c;
        if (m2 >= q || !(Su2 > 0))
            break; /* rounding at the edge: settle it exactly below */
        m = m2;
        Su = Su2;
        c = (double)(q - m) / Su;
    }
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        if (s[i] > 0)
            tmp[k++] = s[i];
    qsort(tmp, (size_t)k, sizeof *tmp, cmp_desc);
    Su = 0;
    for (int64_t i = 0; i < k; i++)
        Su += tmp[i];
    for (m = 0; m < q; m++) {
        c = (double)(q - m) / Su;
        if (c * tmp[m] < 1.0)
            return c;
        Su -= tmp[m];
    }
    return c; /* not reached: q < npos */
}

/* Points r, r+1, ... below x: ceil(x - r) clamped to [0, qq]. */
static int64_t points_below(double x, double r, int64_t qq)
{
    double v = ceil(x - r);
    if (!(v > 0))
        return 0;
    return v >= (double)qq ? qq : (int64_t)v;
}

/* One bucket of n pairs (their indices us[0..n), ascending), quota q: the
 * inclusion probabilities and the systematic draw (lrmoe_score_sample). s,
 * p, tmp: scratch of n doubles. */
static void sample_bucket(const int64_t *us, int64_t n, int64_t q, const float *score,
                          double r, double *s, double *p, double *tmp, uint8_t *keep,
                          float *weight, float *prob)
{
    if (n == 0)
        return;
    int64_t npos = 0;
    double S = 0;
    for (int64_t i = 0; i < n; i++) {
        s[i] = sqrt((double)score[us[i]]);
        if (s[i] > 0) {
            npos++;
            S += s[i];
        }
    }
    if (q >= n) {
        for (int64_t i = 0; i < n; i++)
            p[i] = 1.0;
    } else if (q == 0) {
        for (int64_t i = 0; i < n; i++)
            p[i] = 0.0;
    } else if (npos <= q) { /* every positive kept; the zeros share the rest */
        const double pz = (double)(q - npos) / (double)(n - npos);
        for (int64_t i = 0; i < n; i++)
            p[i] = s[i] > 0 ? 1.0 : pz;
    } else {
        const double c = waterfill(s, n, q, S, tmp);
        for (int64_t i = 0; i < n; i++) {
            const double v = c * s[i];
            p[i] = v >= 1.0 ? 1.0 : v;
        }
    }
    /* the pairs with p = 1 are kept; the draw picks q' of the others */
    int64_t qq = q;
    double Sp = 0;
    for (int64_t i = 0; i < n; i++) {
        if (p[i] >= 1.0)
            qq--;
        else
            Sp += p[i];
    }
    const double scale = qq > 0 && Sp > 0 ? (double)qq / Sp : 0.0; /* rounding only */
    double cum = 0;
    int64_t got = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t u = us[i];
        float w = 1.0f;
        uint8_t k = 0;
        if (p[i] >= 1.0) {
            k = 1;
        } else if (p[i] > 0) {
            p[i] *= scale;
            const double lo = cum;
            cum += p[i];
            if (points_below(cum, r, qq) > points_below(lo, r, qq)) {
                k = 1;
                got++;
                w = (float)(1.0 / p[i]);
            }
        }
        keep[u] = k;
        if (weight)
            weight[u] = w;
        if (prob)
            prob[u] = (float)p[i];
    }
    /* a point lost to rounding at the very end: the last unkept ones */
    for (int64_t i = n - 1; i >= 0 && got < qq; i--) {
        const int64_t u = us[i];
        if (!keep[u] && p[i] > 0) {
            keep[u] = 1;
            got++;
            if (weight)
                weight[u] = (float)(1.0 / p[i]);
        }
    }
}

typedef struct {
    const int64_t *us, *off, *q; /* bucket b: us[off[b] .. off[b+1]), quota q[b] */
    const float *score;
    uint64_t seed;
    double *s, *p, *tmp;
    uint8_t *keep;
    float *weight, *prob;
} sample_job_t;

static int sample_buckets(void *vp, int64_t b0, int64_t b1)
{
    const sample_job_t *j = vp;
    for (int64_t b = b0; b < b1; b++) {
        const int64_t o = j->off[b], n = j->off[b + 1] - o;
        sample_bucket(j->us + o, n, j->q[b], j->score, sample_offset(j->seed, b), j->s + o,
                      j->p + o, j->tmp + o, j->keep, j->weight, j->prob);
    }
    return 0;
}

/* Bucket the N pairs by bk[u] (nb buckets, u ascending inside each) and
 * sample bucket b's quota q[b] (checked by the callers). */
static int sample_run(int64_t N, int64_t nb, const int64_t *bk, const int64_t *q,
                      const float *score, uint64_t seed, uint8_t *keep, float *weight,
                      float *prob, int threads)
{
    int64_t *off = calloc((size_t)nb + 1, sizeof *off);
    int64_t *us = malloc((size_t)(N ? N : 1) * sizeof *us);
    double *buf = malloc((size_t)(N ? N : 1) * 3 * sizeof *buf);
    int rc = -1;
    if (!off || !us || !buf) {
        lrmoe_err("out of memory");
        goto out;
    }
    for (int64_t u = 0; u < N; u++)
        off[bk[u] + 1]++;
    for (int64_t b = 0; b < nb; b++)
        off[b + 1] += off[b];
    {
        int64_t *pos = malloc((size_t)(nb ? nb : 1) * sizeof *pos);
        if (!pos) {
            lrmoe_err("out of memory");
            goto out;
        }
        memcpy(pos, off, (size_t)nb * sizeof *pos);
        for (int64_t u = 0; u < N; u++)
            us[pos[bk[u]]++] = u;
        free(pos);
    }
    {
        sample_job_t j = {us, off, q, score, seed, buf, buf + N, buf + 2 * N,
                          keep, weight, prob};
        rc = lrmoe_parallel_ranges(nb, threads, 1, sample_buckets, &j);
    }
out:
    free(off);
    free(us);
    free(buf);
    return rc;
}

static int score_sample_mt(int64_t T, int K, int E, const int32_t *topk_ids,
                           const float *score, const int64_t *quota, double drop_pct,
                           uint64_t seed, uint8_t *keep, float *weight, float *prob,
                           int64_t *load, int64_t *quota_out, int threads)
{
    const int64_t N = T * K;
    if (!quota && drop_pct < 0)
        return lrmoe_err("no quota and no drop rate");
    int64_t *bk = malloc((size_t)(N ? N : 1) * sizeof *bk);
    int64_t *q = malloc((size_t)(E ? E : 1) * sizeof *q);
    int rc = -1;
    if (!bk || !q) {
        lrmoe_err("out of memory");
        goto out;
    }
    memset(load, 0, (size_t)E * sizeof *load);
    for (int64_t u = 0; u < N; u++) {
        if (check_pair(u, topk_ids[u], E, K, score) < 0)
            goto out;
        load[topk_ids[u]]++;
        bk[u] = topk_ids[u];
    }
    for (int e = 0; e < E; e++) {
        q[e] = quota ? quota[e] : lrmoe_score_drop_quota(load[e], drop_pct);
        if (q[e] < 0 || q[e] > load[e]) {
            lrmoe_err("quota: expert %d has quota %lld but %lld routed pairs", e,
                      (long long)q[e], (long long)load[e]);
            goto out;
        }
        if (quota_out)
            quota_out[e] = q[e];
    }
    rc = sample_run(N, E, bk, q, score, seed, keep, weight, prob, threads);
out:
    free(bk);
    free(q);
    return rc;
}

int lrmoe_score_sample(int64_t T, int K, int E, const int32_t *topk_ids,
                       const float *score, const int64_t *quota, double drop_pct,
                       uint64_t seed, uint8_t *keep, float *weight, float *prob,
                       int64_t *load, int64_t *quota_out)
{
    return score_sample_mt(T, K, E, topk_ids, score, quota, drop_pct, seed, keep, weight,
                           prob, load, quota_out, 1);
}

/* Expert e's row w[P] of bwd_alloc, for the by-rank selections: no entry
 * negative, and their sum (*sum) no more than the expert's routed pairs. */
static int alloc_row(const int64_t *w, int e, int P, int64_t load, int64_t *sum)
{
    int64_t s = 0;
    for (int p = 0; p < P; p++) {
        if (w[p] < 0)
            return lrmoe_err("bwd_alloc: expert %d rank %d is negative (%lld)", e, p,
                             (long long)w[p]);
        if (__builtin_add_overflow(s, w[p], &s))
            return lrmoe_err("bwd_alloc: expert %d allocates more than 2^63-1 rows in all", e);
    }
    if (s > load)
        return lrmoe_err("bwd_alloc: expert %d allocates %lld rows but has %lld routed pairs", e,
                         (long long)s, (long long)load);
    *sum = s;
    return 0;
}

static int score_sample_rank_mt(int64_t T, int K, int E, int P, const int32_t *topk_ids,
                                const float *score, const int32_t *pair_rank,
                                const int64_t *bwd_alloc, uint64_t seed, uint8_t *keep,
                                float *weight, float *prob, int64_t *load,
                                int64_t *quota_out, int threads)
{
    const int64_t N = T * K;
    if (P <= 0 || (!pair_rank && E % P))
        return lrmoe_err("by-rank selection: %d experts over %d ranks, and no pair_rank",
                         E, P);
    const int64_t EP = (int64_t)E * P;
    int64_t *bk = malloc((size_t)(N ? N : 1) * sizeof *bk);
    int64_t *n = calloc((size_t)EP + 1, sizeof *n);
    int64_t *q = malloc((size_t)(EP ? EP : 1) * sizeof *q);
    int rc = -1;
    if (!bk || !n || !q) {
        lrmoe_err("out of memory");
        goto out;
    }
    memset(load, 0, (size_t)E * sizeof *load);
    for (int64_t u = 0; u < N; u++) {
        const int32_t e = topk_ids[u];
        if (check_pair(u, e, E, K, score) < 0)
            goto out;
        const int32_t r = pair_rank ? pair_rank[u] : (int32_t)(e / (E / P));
        if (r < 0 || r >= P) {
            lrmoe_err("pair_rank: rank %d at pair %lld out of range [0,%d)", (int)r,
                      (long long)u, P);
            goto out;
        }
        load[e]++;
        bk[u] = (int64_t)e * P + r;
        n[bk[u]]++;
    }
    for (int e = 0; e < E; e++) {
        int64_t qe, extra = 0;
        if (alloc_row(bwd_alloc + (int64_t)e * P, e, P, load[e], &qe) < 0)
            goto out;
        for (int p = 0; p < P; p++) {
            const int64_t b = (int64_t)e * P + p, w = bwd_alloc[b];
            q[b] = w < n[b] ? w : n[b];
            extra += w - q[b];
        }
        for (int p = 0; p < P && extra > 0; p++) { /* the rest: strata with room */
            const int64_t b = (int64_t)e * P + p, add = n[b] - q[b] < extra ? n[b] - q[b]
                                                                              : extra;
            q[b] += add;
            extra -= add;
        }
        if (quota_out)
            quota_out[e] = qe;
    }
    rc = sample_run(N, EP, bk, q, score, seed, keep, weight, prob, threads);
out:
    free(bk);
    free(n);
    free(q);
    return rc;
}

int lrmoe_score_sample_by_rank(int64_t T, int K, int E, int P, const int32_t *topk_ids,
                               const float *score, const int32_t *pair_rank,
                               const int64_t *bwd_alloc, uint64_t seed, uint8_t *keep,
                               float *weight, float *prob, int64_t *load,
                               int64_t *quota_out)
{
    return score_sample_rank_mt(T, K, E, P, topk_ids, score, pair_rank, bwd_alloc, seed,
                                keep, weight, prob, load, quota_out, 1);
}

void lrmoe_score_weighted_alpha(int64_t N, const float *alpha, const float *weight,
                                float *out)
{
    for (int64_t u = 0; u < N; u++)
        out[u] = weight ? alpha[u] * weight[u] : alpha[u];
}

/* ------------------------------------------------- select by forward rank */

typedef struct {
    uint64_t *keys;
    const int64_t *off;   /* (E*P+1): bucket (e,p) is [off[e*P+p], off[e*P+p+1]) */
    const int64_t *bwd;   /* (E,P) */
    int P;
    uint8_t *keep;
} rank_job_t;

/* experts [e0, e1): the top min(bwd, n_ep) of each (e,p) bucket, then the
 * best of the rest of e up to quota_e = sum_p bwd[e,p] */
static int select_by_rank(void *vp, int64_t e0, int64_t e1)
{
    const rank_job_t *j = vp;
    const int P = j->P;
    for (int64_t e = e0; e < e1; e++) {
        uint64_t rng = 0x5EEDull ^ (uint64_t)e;
        int64_t extra = 0;
        for (int p = 0; p < P; p++) {
            const int64_t b = e * P + p, n = j->off[b + 1] - j->off[b];
            const int64_t w = j->bwd[b], q = w < n ? w : n;
            uint64_t *a = j->keys + j->off[b];
            extra += w - q;
            select_top(a, n, q, &rng);
            for (int64_t i = 0; i < q; i++)
                j->keep[key_pair(a[i])] = 1;
        }
        if (extra <= 0)
            continue;
        /* the unkept keys of e to the front, then their top extra */
        uint64_t *a = j->keys + j->off[e * P];
        const int64_t n = j->off[(e + 1) * P] - j->off[e * P];
        int64_t m = 0;
        for (int64_t i = 0; i < n; i++)
            if (!j->keep[key_pair(a[i])])
                swap64(&a[i], &a[m++]);
        select_top(a, m, extra, &rng);
        for (int64_t i = 0; i < extra; i++)
            j->keep[key_pair(a[i])] = 1;
    }
    return 0;
}

static int score_select_rank_mt(int64_t T, int K, int E, int P, const int32_t *topk_ids,
                                const float *score, const int32_t *pair_rank,
                                const int64_t *bwd_alloc, uint8_t *keep, int64_t *load,
                                int64_t *quota_out, int threads)
{
    int64_t N = T * K;
    if (N >= (int64_t)0xFFFFFFFF)
        return lrmoe_err("too many pairs (%lld) for one frame", (long long)N);
    if (P <= 0 || (!pair_rank && E % P))
        return lrmoe_err("by-rank selection: %d experts over %d ranks, and no pair_rank",
                         E, P);
    const int64_t EP = (int64_t)E * P;
    int64_t *off = calloc((size_t)EP + 1, sizeof *off);
    uint64_t *keys = malloc((size_t)(N ? N : 1) * sizeof *keys);
    int32_t *rk = malloc((size_t)(N ? N : 1) * sizeof *rk);
    int rc = -1;
    if (!off || !keys || !rk) {
        lrmoe_err("out of memory");
        goto out;
    }
    memset(load, 0, (size_t)E * sizeof *load);
    for (int64_t u = 0; u < N; u++) {
        int32_t e = topk_ids[u];
        if (check_pair(u, e, E, K, score) < 0)
            goto out;
        /* without pair_rank, as lrmoe-pack: the expert's native rank */
        int32_t r = pair_rank ? pair_rank[u] : (int32_t)(e / (E / P));
        if (r < 0 || r >= P) {
            lrmoe_err("pair_rank: rank %d at pair %lld out of range [0,%d)", (int)r,
                      (long long)u, P);
            goto out;
        }
        rk[u] = r;
        load[e]++;
        off[(int64_t)e * P + r + 1]++;
    }
    for (int e = 0; e < E; e++) {
        int64_t q;
        if (alloc_row(bwd_alloc + (int64_t)e * P, e, P, load[e], &q) < 0)
            goto out;
        if (quota_out)
            quota_out[e] = q;
    }
    for (int64_t b = 0; b < EP; b++)
        off[b + 1] += off[b];
    {
        int64_t *pos = malloc((size_t)(EP ? EP : 1) * sizeof *pos);
        if (!pos) {
            lrmoe_err("out of memory");
            goto out;
        }
        memcpy(pos, off, (size_t)EP * sizeof *pos);
        for (int64_t u = 0; u < N; u++)
            keys[pos[(int64_t)topk_ids[u] * P + rk[u]]++] = make_key(score[u], u);
        free(pos);
    }
    memset(keep, 0, (size_t)N);
    {
        rank_job_t j = {keys, off, bwd_alloc, P, keep};
        rc = lrmoe_parallel_ranges(E, threads, 1, select_by_rank, &j);
    }
out:
    free(off);
    free(keys);
    free(rk);
    return rc;
}

int lrmoe_score_select_by_rank(int64_t T, int K, int E, int P, const int32_t *topk_ids,
                               const float *score, const int32_t *pair_rank,
                               const int64_t *bwd_alloc, uint8_t *keep, int64_t *load,
                               int64_t *quota_out)
{
    return score_select_rank_mt(T, K, E, P, topk_ids, score, pair_rank, bwd_alloc, keep,
                                load, quota_out, 1);
}

/* -------------------------------------------------------------- fidelity */

static inline float silu(float x)
{
    return x / (1.0f + expf(-x));
}

static double fro2(const float *m, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)m[i] * m[i];
    return s;
}

int lrmoe_score_fidelity(int64_t T, int K, int E, int64_t D, int64_t F,
                         const int32_t *topk_ids, const uint8_t *keep,
                         const float *g, const float *alpha,
                         const float *gate, const float *up,
                         double *err, double *overall)
{
    int64_t N = T * K;
    int64_t *cnt = calloc((size_t)E + 1, sizeof *cnt);
    if (!cnt)
        return lrmoe_err("out of memory");
    int64_t nmax = 0;
    for (int64_t u = 0; u < N; u++) {
        if (topk_ids[u] < 0 || topk_ids[u] >= E) {
            free(cnt);
            return lrmoe_err("topk_ids: expert %d out of range [0,%d)",
                             (int)topk_ids[u], E);
        }
        cnt[topk_ids[u]]++;
    }
    for (int e = 0; e < E; e++)
        if (cnt[e] > nmax)
            nmax = cnt[e];
    /* per-expert order: dropped pairs first, then kept (u ascending each) */
    int64_t *idx = malloc((size_t)(N ? N : 1) * sizeof *idx);
    int64_t *off = calloc((size_t)E + 1, sizeof *off);
    int64_t *ndrop = calloc((size_t)E + 1, sizeof *ndrop);
    float *A = malloc((size_t)(nmax ? nmax : 1) * (size_t)D * sizeof *A);
    float *B = malloc((size_t)(nmax ? nmax : 1) * (size_t)F * sizeof *B);
    float *G = malloc((size_t)D * (size_t)F * sizeof *G);
    int rc = -1;
    if (!idx || !off || !ndrop || !A || !B || !G) {
        lrmoe_err("out of memory (fidelity needs %lld x %lld floats)",
                  (long long)D, (long long)F);
        goto out;
    }
    for (int e = 0; e < E; e++)
        off[e + 1] = off[e] + cnt[e];
    /* ndrop doubles as the fill cursor, then holds the dropped count */
    for (int pass = 0; pass < 2; pass++)
        for (int64_t u = 0; u < N; u++) {
            int e = topk_ids[u];
            if ((keep[u] != 0) == pass)
                idx[off[e] + ndrop[e]++] = u;
        }
    for (int e = 0; e < E; e++)
        ndrop[e] = 0;
    for (int64_t u = 0; u < N; u++)
        if (!keep[u])
            ndrop[topk_ids[u]]++;
    double tot_all = 0, tot_drop = 0;
    for (int e = 0; e < E; e++) {
        int64_t n = cnt[e], d = ndrop[e];
        err[e] = 0;
        if (n == 0)
            continue;
        for (int64_t i = 0; i < n; i++) {
            int64_t u = idx[off[e] + i];
            const float *gr = g + (u / K) * D;
            float a = alpha[u];
            float *ar = A + i * D;
            for (int64_t j = 0; j < D; j++)
                ar[j] = a * gr[j];
            const float *hg = gate + u * F, *hu = up + u * F;
            float *br = B + i * F;
            for (int64_t j = 0; j < F; j++)
                br[j] = silu(hg[j]) * hu[j];
        }
        /* G (D,F) = A^T B over all n rows */
        if (lrmoe_blas_sgemm(1, 0, (int)D, (int)F, (int)n, 1.0f, A, (int)D, B, (int)F, 0.0f, G,
                             (int)F) < 0)
            goto out;
        double all = fro2(G, D * F), drop = 0;
        if (d > 0) {
            if (lrmoe_blas_sgemm(1, 0, (int)D, (int)F, (int)d, 1.0f, A, (int)D, B, (int)F, 0.0f,
                                 G, (int)F) < 0)
                goto out;
            drop = fro2(G, D * F);
        }
        tot_all += all;
        tot_drop += drop;
        err[e] = all > 0 ? sqrt(drop / all) : 0;
    }
    *overall = tot_all > 0 ? sqrt(tot_drop / tot_all) : 0;
    rc = 0;
out:
    free(cnt);
    free(idx);
    free(off);
    free(ndrop);
    free(A);
    free(B);
    free(G);
    return rc;
}


/* ------------------------------------------------- fidelity: bias and noise */

const char *lrmoe_fidelity_name(int i)
{
    static const char *const nm[LRMOE_NFID] = {"dw_down", "dw_gate", "dw_up", "dx"};
    return i >= 0 && i < LRMOE_NFID ? nm[i] : "?";
}

/* running sums of one gradient: ||G||^2, ||Gh||^2, <Gh,G>, ||Gh-G||^2, ||Ge-G||^2 */
typedef struct {
    double gg, hh, hg, dh, de;
} fid_acc_t;

/* the three versions of one matrix (n values each): full f, estimate h,
 * expectation e */
static void fid_add(fid_acc_t *a, const float *f, const float *h, const float *e, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const double fv = f[i], hv = h[i], ev = e[i];
        a->gg += fv * fv;
        a->hh += hv * hv;
        a->hg += hv * fv;
        a->dh += (hv - fv) * (hv - fv);
        a->de += (ev - fv) * (ev - fv);
    }
}

static lrmoe_fidelity_t fid_out(const fid_acc_t *a)
{
    lrmoe_fidelity_t o = {0, 0, 0, 0};
    if (a->gg > 0) {
        o.rel_err = sqrt(a->dh / a->gg);
        o.norm_ratio = sqrt(a->hh / a->gg);
        o.bias = sqrt(a->de / a->gg);
        o.cosine = a->hh > 0 ? a->hg / sqrt(a->hh * a->gg) : 0;
    } else {
        o.norm_ratio = o.cosine = 1;
    }
    return o;
}

static inline float dsilu(float x)
{
    const float s = 1.0f / (1.0f + expf(-x));
    return s * (1.0f + x * (1.0f - s));
}

int lrmoe_score_fidelity_split(int64_t T, int K, int E, int64_t D, int64_t F,
                               const int32_t *topk_ids, const float *g, const float *alpha,
                               const float *x, const float *gate, const float *up,
                               const float *w_gate, const float *w_up, const float *w_down,
                               const uint8_t *keep, const float *weight, const float *expect,
                               lrmoe_fidelity_t *out)
{
    const int64_t N = T * K;
    const int full = w_gate && w_up && w_down && x;
    if ((w_gate || w_up || w_down) && !full)
        return lrmoe_err("fidelity: give w_gate, w_up, w_down and hidden together, or none");
    int64_t *cnt = calloc((size_t)E + 1, sizeof *cnt), nmax = 0;
    if (!cnt)
        return lrmoe_err("out of memory");
    for (int64_t u = 0; u < N; u++) {
        if (topk_ids[u] < 0 || topk_ids[u] >= E) {
            free(cnt);
            return lrmoe_err("topk_ids: expert %d out of range [0,%d)", (int)topk_ids[u], E);
        }
        cnt[topk_ids[u] + 1]++;
    }
    for (int e = 0; e < E; e++) {
        if (cnt[e + 1] > nmax)
            nmax = cnt[e + 1];
        cnt[e + 1] += cnt[e];
    }
    const size_t nm = (size_t)(nmax ? nmax : 1), DF = (size_t)D * (size_t)F;
    /* per expert: rows u of its pairs; A_c (3 versions, n x D), phi (n x F),
     * dphi_c (n x F), dhg_c/dhu_c (n x F), X (n x D), three D x F / F x D
     * products; dx (3 x T x D) */
    int64_t *idx = malloc((size_t)(N ? N : 1) * sizeof *idx), *pos = NULL;
    float *A = malloc(3 * nm * (size_t)D * sizeof *A);
    float *B = malloc(nm * (size_t)F * sizeof *B);
    float *G = malloc(3 * DF * sizeof *G);
    float *dp = full ? malloc(3 * nm * (size_t)F * sizeof *dp) : NULL;
    float *hg = full ? malloc(3 * nm * (size_t)F * sizeof *hg) : NULL;
    float *hu = full ? malloc(3 * nm * (size_t)F * sizeof *hu) : NULL;
    float *X = full ? malloc(nm * (size_t)D * sizeof *X) : NULL;
    float *dxr = full ? malloc(nm * (size_t)D * sizeof *dxr) : NULL;
    float *dx = full ? calloc(3 * (size_t)(T ? T : 1) * (size_t)D, sizeof *dx) : NULL;
    fid_acc_t acc[LRMOE_NFID];
    memset(acc, 0, sizeof acc);
    int rc = -1;
    if (!idx || !A || !B || !G || (full && (!dp || !hg || !hu || !X || !dxr || !dx)) ||
        !(pos = malloc((size_t)(E ? E : 1) * sizeof *pos))) {
        lrmoe_err("out of memory (fidelity of %lld pairs, D=%lld, F=%lld)", (long long)N,
                  (long long)D, (long long)F);
        goto out;
    }
    memcpy(pos, cnt, (size_t)E * sizeof *pos);
    for (int64_t u = 0; u < N; u++)
        idx[pos[topk_ids[u]]++] = u;
    for (int e = 0; e < E; e++) {
        const int64_t n = cnt[e + 1] - cnt[e], *us = idx + cnt[e];
        if (n == 0)
            continue;
        for (int64_t i = 0; i < n; i++) {
            const int64_t u = us[i];
            const float *gr = g + (u / K) * D;
            const float a = alpha[u];
            const float sh = keep[u] ? (weight ? weight[u] : 1.0f) : 0.0f;
            const float se = expect ? expect[u] : sh;
            float *a0 = A + i * D, *a1 = A + (nm + i) * D, *a2 = A + (2 * nm + i) * D;
            for (int64_t j = 0; j < D; j++) {
                const float v = a * gr[j];
                a0[j] = v;
                a1[j] = sh * v;
                a2[j] = se * v;
            }
            const float *pg = gate + u * F, *pu = up + u * F;
            for (int64_t j = 0; j < F; j++)
                B[i * F + j] = silu(pg[j]) * pu[j];
            if (full)
                memcpy(X + i * D, x + (u / K) * D, (size_t)D * sizeof *X);
        }
        /* dW_down (D,F) = A_c^T phi for c = full, estimate, expectation */
        for (int c = 0; c < 3; c++)
            if (lrmoe_blas_sgemm(1, 0, (int)D, (int)F, (int)n, 1.0f, A + c * nm * D, (int)D, B,
                                 (int)F, 0.0f, G + c * DF, (int)F) < 0)
                goto out;
        fid_add(&acc[LRMOE_FID_DW_DOWN], G, G + DF, G + 2 * DF, (int64_t)DF);
        if (!full)
            continue;
        const float *Wd = w_down + (size_t)e * DF, *Wg = w_gate + (size_t)e * DF,
                    *Wu = w_up + (size_t)e * DF;
        for (int c = 0; c < 3; c++) {
            float *dpc = dp + c * nm * F, *hgc = hg + c * nm * F, *huc = hu + c * nm * F;
            /* dphi (n,F) = A_c (n,D) W_down (D,F) */
            if (lrmoe_blas_sgemm(0, 0, (int)n, (int)F, (int)D, 1.0f, A + c * nm * D, (int)D, Wd,
                                 (int)F, 0.0f, dpc, (int)F) < 0)
                goto out;
            for (int64_t i = 0; i < n; i++) {
                const int64_t u = us[i];
                const float *pg = gate + u * F, *pu = up + u * F;
                for (int64_t j = 0; j < F; j++) {
                    hgc[i * F + j] = dpc[i * F + j] * pu[j] * dsilu(pg[j]);
                    huc[i * F + j] = dpc[i * F + j] * silu(pg[j]);
                }
            }
        }
        /* dW_gate, dW_up (F,D) = dh^T X */
        for (int w = 0; w < 2; w++) {
            const float *H = w ? hu : hg;
            for (int c = 0; c < 3; c++)
                if (lrmoe_blas_sgemm(1, 0, (int)F, (int)D, (int)n, 1.0f, H + c * nm * F, (int)F, X,
                                     (int)D, 0.0f, G + c * DF, (int)D) < 0)
                    goto out;
            fid_add(&acc[w ? LRMOE_FID_DW_UP : LRMOE_FID_DW_GATE], G, G + DF, G + 2 * DF,
                    (int64_t)DF);
        }
        /* dx rows (n,D) = dh_g W_gate + dh_u W_up, added to their tokens */
        for (int c = 0; c < 3; c++) {
            if (lrmoe_blas_sgemm(0, 0, (int)n, (int)D, (int)F, 1.0f, hg + c * nm * F, (int)F, Wg,
                                 (int)D, 0.0f, dxr, (int)D) < 0 ||
                lrmoe_blas_sgemm(0, 0, (int)n, (int)D, (int)F, 1.0f, hu + c * nm * F, (int)F, Wu,
                                 (int)D, 1.0f, dxr, (int)D) < 0)
                goto out;
            float *dxc = dx + (size_t)c * (size_t)T * (size_t)D;
            for (int64_t i = 0; i < n; i++) {
                float *d = dxc + (us[i] / K) * D;
                for (int64_t j = 0; j < D; j++)
                    d[j] += dxr[i * D + j];
            }
        }
    }
    if (full)
        fid_add(&acc[LRMOE_FID_DX], dx, dx + (size_t)T * D, dx + 2 * (size_t)T * D, T * D);
    for (int i = 0; i < LRMOE_NFID; i++) {
        if (i > 0 && !full)
            out[i] = (lrmoe_fidelity_t){-1, -1, -1, -1};
        else
            out[i] = fid_out(&acc[i]);
    }
    rc = 0;
out:
    free(cnt);
    free(idx);
    free(pos);
    free(A);
    free(B);
    free(G);
    free(dp);
    free(hg);
    free(hu);
    free(X);
    free(dxr);
    free(dx);
    return rc;
}

/* ---------------------------------------------------------------- frames */

void lrmoe_score_opts_default(lrmoe_score_opts_t *o)
{
    o->metric = LRMOE_METRIC_LRM;
    o->select = LRMOE_KEEP_SAMPLE; /* lrmoe-study: trains best on paired seeds */
    o->drop_pct = -1;
    o->seed = 0;
    o->fidelity = 0;
    o->threads = 1;
}

/* (T,K) integer tensor -> malloc'd i32 */
static int32_t *ids_i32(const lrmoe_tensor_t *t)
{
    int64_t n = lrmoe_tensor_numel(t);
    int32_t *o = malloc((size_t)(n ? n : 1) * sizeof *o);
    if (!o) {
        lrmoe_err("out of memory");
        return NULL;
    }
    if (t->dtype == LRMOE_I32) {
        if (n)
            memcpy(o, t->data, (size_t)n * sizeof *o);
        return o;
    }
    if (lrmoe_dtype_is_float(t->dtype)) {
        free(o);
        lrmoe_err("tensor %s: dtype %s, expected an integer dtype", t->name,
                  lrmoe_dtype_name(t->dtype));
        return NULL;
    }
    int64_t *w = lrmoe_tensor_i64(t);
    if (!w) {
        free(o);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++)
        o[i] = (w[i] < INT32_MIN || w[i] > INT32_MAX) ? -1 : (int32_t)w[i];
    free(w);
    return o;
}

/* The weights of the frame's layer as F32 (E,F,D)/(E,D,F) copies when it
 * carries w_gate, w_up and w_down (lrmoe-score --weights puts them there for
 * the call), else NULLs; -1 on a bad shape or OOM. */
static int frame_weights_f32(const lrmoe_frame_t *f, int E, int64_t D, int64_t F, float **wg,
                             float **wu, float **wd)
{
    *wg = *wu = *wd = NULL;
    lrmoe_tensor_t *tg = lrmoe_frame_get(f, "w_gate"), *tu = lrmoe_frame_get(f, "w_up"),
                   *td = lrmoe_frame_get(f, "w_down");
    if (!tg && !tu && !td)
        return 0;
    if (!tg || !tu || !td || lrmoe_tensor_check(tg, 3, (int64_t[]){E, F, D}) < 0 ||
        lrmoe_tensor_check(tu, 3, (int64_t[]){E, F, D}) < 0 ||
        lrmoe_tensor_check(td, 3, (int64_t[]){E, D, F}) < 0)
        return lrmoe_err_prefix("fidelity: the layer's w_gate, w_up, w_down");
    if (!(*wg = lrmoe_tensor_f32(tg)) || !(*wu = lrmoe_tensor_f32(tu)) ||
        !(*wd = lrmoe_tensor_f32(td))) {
        free(*wg);
        free(*wu);
        *wg = *wu = NULL;
        return -1;
    }
    return 0;
}

/* score.fidelity.<gradient>.<figure> attributes (lrmoe_score_fidelity_split):
 * dW_down always, dW_gate, dW_up and dx when the frame carries the layer's
 * weights and hidden. pw: pair_weight (NULL: 1), pp: the sample's p (NULL:
 * a deterministic rule, E[s_u] = keep_u). */
static int fidelity_split_attrs(lrmoe_frame_t *f, int64_t T, int K, int E, int64_t D, int64_t F,
                                const int32_t *ids, const float *g, const float *alpha,
                                const float *gate, const float *up, const uint8_t *keep,
                                const float *pw, const float *pp)
{
    float *wg, *wu, *wd, *x = NULL, *ex = NULL;
    if (frame_weights_f32(f, E, D, F, &wg, &wu, &wd) < 0)
        return -1;
    int rc = -1;
    if (wg) {
        lrmoe_tensor_t *th = lrmoe_frame_need(f, "hidden");
        if (!th || lrmoe_tensor_check(th, 2, (int64_t[]){T, D}) < 0 || !(x = lrmoe_tensor_f32(th)))
            goto out;
    }
    if (pp) {
        if (!(ex = malloc((size_t)(T * K > 0 ? T * K : 1) * sizeof *ex))) {
            lrmoe_err("out of memory");
            goto out;
        }
        for (int64_t u = 0; u < T * K; u++)
            ex[u] = pp[u] > 0 ? 1.0f : 0.0f;
    }
    lrmoe_fidelity_t fo[LRMOE_NFID];
    if (lrmoe_score_fidelity_split(T, K, E, D, F, ids, g, alpha, x, gate, up, wg, wu, wd, keep,
                                   pw, ex, fo) < 0)
        goto out;
    for (int i = 0; i < LRMOE_NFID; i++) {
        if (fo[i].rel_err < 0)
            continue;
        char k[64];
        const char *nm = lrmoe_fidelity_name(i);
        const double v[4] = {fo[i].rel_err, fo[i].norm_ratio, fo[i].cosine, fo[i].bias};
        static const char *const fig[4] = {"rel_err", "norm_ratio", "cosine", "bias"};
        for (int j = 0; j < 4; j++) {
            snprintf(k, sizeof k, "score.fidelity.%s.%s", nm, fig[j]);
            if (lrmoe_frame_set_attrf(f, k, "%.6g", v[j]) < 0)
                goto out;
        }
    }
    rc = 0;
out:
    free(wg);
    free(wu);
    free(wd);
    free(x);
    free(ex);
    return rc;
}

/* The score.* attributes of a selection and its stats (st may be NULL):
 * pairs kept, the dropped share of the total score, the time, the
 * fidelity (-1: not computed). */
static int score_attrs(lrmoe_frame_t *f, const lrmoe_score_opts_t *o, const float *score,
                       const uint8_t *keep, int64_t N, double tsel, double fid, int by_rank,
                       lrmoe_score_stats_t *st)
{
    int64_t kept = 0;
    double all = 0, dropped = 0;
    for (int64_t u = 0; u < N; u++) {
        all += score[u];
        if (keep[u])
            kept++;
        else
            dropped += score[u];
    }
    double retained = N ? (double)kept / (double)N : 1.0;
    double share = all > 0 ? dropped / all : 0.0;
    if (lrmoe_frame_set_attr(f, "score.metric",
                             lrmoe_score_metric_name(o->metric)) < 0 ||
        lrmoe_frame_set_attrf(f, "score.kept", "%lld", (long long)kept) < 0 ||
        lrmoe_frame_set_attrf(f, "score.retained", "%.6f", retained) < 0 ||
        lrmoe_frame_set_attrf(f, "score.dropped_share", "%.6g", share) < 0 ||
        lrmoe_frame_set_attrf(f, "score.seconds", "%.6f", tsel) < 0 ||
        (by_rank && lrmoe_frame_set_attr(f, "score.keep", "by-rank") < 0))
        return -1;
    if (o->drop_pct >= 0 &&
        lrmoe_frame_set_attrf(f, "score.drop", "%g", o->drop_pct) < 0)
        return -1;
    if (o->fidelity &&
        lrmoe_frame_set_attrf(f, "score.fidelity", "%.6g", fid) < 0)
        return -1;
    if (st) {
        st->pairs = N;
        st->kept = kept;
        st->retained = retained;
        st->dropped_share = share;
        st->fidelity = fid;
        st->seconds = tsel;
    }
    return 0;
}

/* --fidelity: the expert-wise dW_down errors (score_fidelity) and the
 * overall one (*fid) of the selection keep against every pair, with the
 * split attributes score.fidelity.* (fidelity_split_attrs). */
static int fidelity_attrs(lrmoe_frame_t *f, int threads, int64_t T, int K, int E, int64_t D,
                          const int32_t *ids, const uint8_t *keep, const float *g,
                          const float *alpha, const float *pw, const float *pp, double *fid)
{
    lrmoe_tensor_t *ts_g = lrmoe_frame_need(f, "saved_gate");
    lrmoe_tensor_t *ts_u = ts_g ? lrmoe_frame_need(f, "saved_up") : NULL;
    if (!ts_u || lrmoe_tensor_check(ts_g, 3, (int64_t[]){T, K, -1}) < 0 ||
        lrmoe_tensor_check(ts_u, 3, (int64_t[]){T, K, ts_g->shape[2]}) < 0)
        return -1;
    const int64_t F = ts_g->shape[2];
    int rc = -1;
    float *gate = NULL, *up = NULL, *ef = NULL;
    double *err = malloc((size_t)(E ? E : 1) * sizeof *err);
    if (!err) {
        lrmoe_err("out of memory");
        goto out;
    }
    if (!(gate = lrmoe_tensor_f32(ts_g)) || !(up = lrmoe_tensor_f32(ts_u)))
        goto out;
    lrmoe_blas_threads(threads); /* its F32 GEMMs: -@'s count, not one per core */
    if (lrmoe_score_fidelity(T, K, E, D, F, ids, keep, g, alpha, gate, up, err, fid) < 0)
        goto out;
    if (!(ef = malloc((size_t)(E ? E : 1) * sizeof *ef))) {
        lrmoe_err("out of memory");
        goto out;
    }
    for (int e = 0; e < E; e++)
        ef[e] = (float)err[e];
    if (fidelity_split_attrs(f, T, K, E, D, F, ids, g, alpha, gate, up, keep, pw, pp) < 0)
        goto out;
    float *owned = ef;  /* adopt owns (and on failure frees) the buffer */
    ef = NULL;
    if (!lrmoe_frame_adopt(f, "score_fidelity", LRMOE_F32, 1, (int64_t[]){E}, owned))
        goto out;
    rc = 0;
out:
    free(err);
    free(gate);
    free(up);
    free(ef);
    return rc;
}

/* The tensors lrmoe_score_frame reads, checked: their shapes agree, and
 * what the metric, the selection and the plan's keep rule need is there. */
typedef struct {
    lrmoe_tensor_t *tid, *tw, *tg, *tphi, *tq;
    lrmoe_tensor_t *tba, *tpr;  /* plan.keep=by-rank: bwd_alloc, pair_rank */
    int64_t T, N, D;
    int K, E;                   /* E 0: from the ids */
} score_in_t;

static int score_inputs(lrmoe_frame_t *f, const lrmoe_score_opts_t *o, score_in_t *in)
{
    *in = (score_in_t){0};
    lrmoe_tensor_t *tid = lrmoe_frame_need(f, "topk_ids");
    if (!tid)
        return -1;
    if (tid->ndim != 2)
        return lrmoe_tensor_check(tid, 2, (int64_t[]){-1, -1});
    int64_t T = tid->shape[0];
    int K;
    if (lrmoe_tensor_dim_int(tid, 1, &K) < 0)
        return -1;
    if ((unsigned)o->select >= LRMOE_NKEEP_RULES)
        return lrmoe_err("unknown selection %d", (int)o->select);
    int need_alpha = o->metric == LRMOE_METRIC_LRM || o->fidelity;
    int need_g = (o->metric != LRMOE_METRIC_RANDOM && o->metric != LRMOE_METRIC_UNIFORM) ||
                 o->fidelity;
    lrmoe_tensor_t *tw = NULL, *tg = NULL, *tphi = NULL, *tq = NULL;
    lrmoe_tensor_t *tba = NULL, *tpr = NULL; /* plan.keep=by-rank */
    if (need_alpha) {
        if (!(tw = lrmoe_frame_need(f, "topk_weights")) ||
            lrmoe_tensor_check(tw, 2, (int64_t[]){T, K}) < 0)
            return -1;
    }
    int64_t D = 0;
    if (need_g) {
        if (!(tg = lrmoe_frame_need(f, "grad_output")) ||
            lrmoe_tensor_check(tg, 2, (int64_t[]){T, -1}) < 0)
            return -1;
        D = tg->shape[1];
    }
    if (o->metric == LRMOE_METRIC_LRM) {
        if (!(tphi = lrmoe_frame_need(f, "phi_sqnorm")) ||
            lrmoe_tensor_check(tphi, 2, (int64_t[]){T, K}) < 0)
            return -1;
    }
    int E = 0;
    if (o->drop_pct < 0) {
        if (!(tq = lrmoe_frame_get(f, "quota")))
            return lrmoe_err("missing tensor quota (run lrmoe-plan first, or "
                             "give --drop)");
        if (lrmoe_tensor_check(tq, 1, (int64_t[]){-1}) < 0 ||
            lrmoe_tensor_dim_count(tq, 0, &E) < 0)
            return -1;
        const char *kp = lrmoe_frame_attr(f, "plan.keep");
        if (kp && strcmp(kp, "by-rank") && strcmp(kp, "global"))
            return lrmoe_err("attribute plan.keep: '%s' (expected by-rank or global)", kp);
        if (kp && !strcmp(kp, "by-rank")) {
            int P;
            if (!(tba = lrmoe_frame_need(f, "bwd_alloc")) ||
                lrmoe_tensor_check(tba, 2, (int64_t[]){E, -1}) < 0 ||
                lrmoe_tensor_dim_count(tba, 1, &P) < 0)
                return -1;
            if ((tpr = lrmoe_frame_get(f, "pair_rank")) &&
                lrmoe_tensor_check(tpr, 2, (int64_t[]){T, K}) < 0)
                return -1;
        }
    } else {
        lrmoe_tensor_t *t;
        if ((t = lrmoe_frame_get(f, "expert_load")) && t->ndim == 1)
            E = (int)t->shape[0];
        else if ((t = lrmoe_frame_get(f, "placement")) && t->ndim == 2)
            E = (int)t->shape[0];
    }

    *in = (score_in_t){tid, tw, tg, tphi, tq, tba, tpr, T, T * K, D, K, E};
    return 0;
}

int lrmoe_score_frame(lrmoe_frame_t *f, uint64_t index,
                      const lrmoe_score_opts_t *o, lrmoe_score_stats_t *st)
{
    double t0 = lrmoe_now();
    score_in_t in;
    if (score_inputs(f, o, &in) < 0)
        return -1;
    const int64_t T = in.T, N = in.N, D = in.D;
    const int K = in.K;
    int E = in.E;
    const int sample = o->select == LRMOE_KEEP_SAMPLE;
    lrmoe_tensor_t *tid = in.tid, *tw = in.tw, *tg = in.tg, *tphi = in.tphi, *tq = in.tq;
    lrmoe_tensor_t *tba = in.tba, *tpr = in.tpr;

    int rc = -1;
    int32_t *ids = NULL;
    float *alpha = NULL, *g = NULL, *phi = NULL;
    float *score = malloc((size_t)(N ? N : 1) * sizeof *score);
    uint8_t *keep = malloc((size_t)(N ? N : 1));
    float *pw = sample ? malloc((size_t)(N ? N : 1) * sizeof *pw) : NULL;
    /* the sample's p_u, for the fidelity's expectation (E[s_u] = 1 where p_u > 0) */
    float *pp = sample && o->fidelity ? malloc((size_t)(N ? N : 1) * sizeof *pp) : NULL;
    int64_t *quota = NULL, *load = NULL, *qout = NULL, *ba = NULL;
    int32_t *prank = NULL;
    if (!score || !keep || (sample && !pw) || (sample && o->fidelity && !pp)) {
        lrmoe_err("out of memory");
        goto out;
    }
    if (!(ids = ids_i32(tid)))
        goto out;
    if (E == 0 && lrmoe_experts_from_ids(ids, N, &E) < 0)
        goto out;
    if (tw && !(alpha = lrmoe_tensor_f32(tw)))
        goto out;
    if (tg && o->fidelity && !(g = lrmoe_tensor_f32(tg)))
        goto out;
    if (tphi && !(phi = lrmoe_tensor_f32(tphi)))
        goto out;
    if (tq && !(quota = lrmoe_tensor_i64(tq)))
        goto out;
    load = malloc((size_t)(E ? E : 1) * sizeof *load);
    qout = malloc((size_t)(E ? E : 1) * sizeof *qout);
    if (!load || !qout) {
        lrmoe_err("out of memory");
        goto out;
    }
    if (score_pairs_mt(o->metric, T, K, D, tg ? tg->dtype : LRMOE_F32,
                       tg ? tg->data : NULL, alpha, phi,
                       o->seed + index, score, o->threads) < 0)
        goto out;
    if (tba) {
        const int P = (int)tba->shape[1];
        if (!(ba = lrmoe_tensor_i64(tba)) || (tpr && !(prank = ids_i32(tpr))))
            goto out;
        if (sample ? score_sample_rank_mt(T, K, E, P, ids, score, prank, ba,
                                          o->seed + index, keep, pw, pp, load,
                                          qout, o->threads) < 0
                   : score_select_rank_mt(T, K, E, P, ids, score, prank, ba, keep, load, qout,
                                          o->threads) < 0)
            goto out;
        for (int e = 0; e < E; e++)
            if (qout[e] != quota[e]) {
                lrmoe_err("bwd_alloc: expert %d allocates %lld rows but its quota is %lld",
                          e, (long long)qout[e], (long long)quota[e]);
                goto out;
            }
    } else if (sample ? score_sample_mt(T, K, E, ids, score, quota, o->drop_pct,
                                        o->seed + index, keep, pw, pp, load,
                                        qout, o->threads) < 0
                      : score_select_mt(T, K, E, ids, score, quota, o->drop_pct, keep, load,
                                        qout, o->threads) < 0)
        goto out;
    double tsel = lrmoe_now() - t0;

    double fid = -1;
    if (o->fidelity && fidelity_attrs(f, o->threads, T, K, E, D, ids, keep, g, alpha, pw, pp,
                                      &fid) < 0)
        goto out;

    /* adopt owns (and on failure frees) the buffer it is given */
    float *sc = score;
    score = NULL;
    if (!lrmoe_frame_adopt(f, "pair_score", LRMOE_F32, 2, (int64_t[]){T, K}, sc))
        goto out;
    uint8_t *kp = keep;
    keep = NULL;
    if (!lrmoe_frame_adopt(f, "keep", LRMOE_U8, 2, (int64_t[]){T, K}, kp))
        goto out;
    if (sample) {
        float *w = pw;
        pw = NULL;
        if (!lrmoe_frame_adopt(f, "pair_weight", LRMOE_F32, 2, (int64_t[]){T, K}, w) ||
            lrmoe_frame_set_attr(f, "score.select", "sample") < 0)
            goto out;
    } else {
        lrmoe_frame_del(f, "pair_weight"); /* a stale one would reweight this keep */
    }
    if (o->drop_pct >= 0) {
        int64_t *qo = qout;
        qout = NULL;
        if (!lrmoe_frame_adopt(f, "quota", LRMOE_I64, 1, (int64_t[]){E}, qo))
            goto out;
    }
    if (score_attrs(f, o, sc, kp, N, tsel, fid, tba != NULL, st) < 0)
        goto out;
    rc = 0;
out:
    free(ids);
    free(alpha);
    free(g);
    free(phi);
    free(score);
    free(keep);
    free(pw);
    free(pp);
    free(quota);
    free(load);
    free(qout);
    free(ba);
    free(prank);
    return rc;
}
