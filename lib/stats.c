/* Tensor statistics, see stats.h. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "stats.h"

enum { CHUNK = 4096 };

void lrmoe_stats_init(lrmoe_stats_t *s, lrmoe_dtype_t d)
{
    memset(s, 0, sizeof *s);
    s->dtype = d;
    s->min = s->max = s->mean = s->std = NAN;
    s->is_int = !lrmoe_dtype_is_float(d);
    s->imin = INT64_MAX;
    s->imax = INT64_MIN;
    s->umin = UINT64_MAX;
    s->umax = 0;
}

void lrmoe_stats_add(lrmoe_stats_t *s, const void *data, size_t n)
{
    double x[CHUNK];
    int64_t iv[CHUNK];
    size_t es = lrmoe_dtype_size(s->dtype);
    const uint8_t *p = data;
    for (size_t off = 0; off < n; off += CHUNK) {
        size_t m = n - off < CHUNK ? n - off : CHUNK;
        const uint8_t *src = p + off * es;
        lrmoe_convert_to_f64(s->dtype, src, x, m);
        s->count += (int64_t)m;
        /* chunk pass 1: extrema and sum; four accumulators for ILP. A
         * finite sum means every value was finite (the common case); else
         * (or on overflow) recount with the per-value checks. */
        int64_t nf = (int64_t)m;
        double s4[4] = {0, 0, 0, 0}, mn = x[0], mx = x[0];
        size_t i = 0;
        for (; i + 4 <= m; i += 4)
            for (int k = 0; k < 4; k++) {
                double v = x[i + (size_t)k];
                s4[k] += v;
                mn = v < mn ? v : mn;
                mx = v > mx ? v : mx;
            }
        for (; i < m; i++) {
            s4[0] += x[i];
            mn = x[i] < mn ? x[i] : mn;
            mx = x[i] > mx ? x[i] : mx;
        }
        double sum = (s4[0] + s4[1]) + (s4[2] + s4[3]);
        if (!isfinite(sum)) {
            nf = 0;
            sum = 0;
            mn = INFINITY;
            mx = -INFINITY;
            for (i = 0; i < m; i++) {
                double v = x[i];
                if (isnan(v)) {
                    s->nan++;
                } else if (isinf(v)) {
                    if (v > 0)
                        s->posinf++;
                    else
                        s->neginf++;
                } else {
                    nf++;
                    sum += v;
                    if (v < mn)
                        mn = v;
                    if (v > mx)
                        mx = v;
                }
            }
        }
        if (nf == 0)
            continue;
        /* chunk pass 2: M2 about the chunk mean */
        double cm = sum / (double)nf, m2 = 0;
        if (nf == (int64_t)m) {
            double q[4] = {0, 0, 0, 0};
            for (i = 0; i + 4 <= m; i += 4)
                for (int k = 0; k < 4; k++) {
                    double d = x[i + (size_t)k] - cm;
                    q[k] += d * d;
                }
            for (; i < m; i++)
                q[0] += (x[i] - cm) * (x[i] - cm);
            m2 = (q[0] + q[1]) + (q[2] + q[3]);
        } else {
            for (i = 0; i < m; i++)
                if (isfinite(x[i])) {
                    double d = x[i] - cm;
                    m2 += d * d;
                }
        }
        /* combine (Chan, Golub, LeVeque) */
        if (s->finite == 0) {
            s->mean = cm;
            s->m2 = m2;
            s->min = mn;
            s->max = mx;
        } else {
            double na = (double)s->finite, nb = (double)nf, nt = na + nb;
            double delta = cm - s->mean;
            s->mean += delta * nb / nt;
            s->m2 += m2 + delta * delta * na * nb / nt;
            if (mn < s->min)
                s->min = mn;
            if (mx > s->max)
                s->max = mx;
        }
        s->finite += nf;
        /* exact integer extrema */
        if (s->is_int && s->dtype == LRMOE_U64) {
            for (i = 0; i < m; i++) {
                uint64_t u;
                memcpy(&u, src + i * 8, 8);
                if (u < s->umin)
                    s->umin = u;
                if (u > s->umax)
                    s->umax = u;
            }
        } else if (s->is_int) {
            lrmoe_convert_to_i64(s->dtype, src, iv, m);
            for (i = 0; i < m; i++) {
                if (iv[i] < s->imin)
                    s->imin = iv[i];
                if (iv[i] > s->imax)
                    s->imax = iv[i];
            }
        }
    }
}

void lrmoe_stats_finish(lrmoe_stats_t *s)
{
    if (s->finite > 0)
        s->std = sqrt(s->m2 / (double)s->finite);
}

void lrmoe_stats_tensor(const lrmoe_tensor_t *t, lrmoe_stats_t *s)
{
    lrmoe_stats_init(s, t->dtype);
    lrmoe_stats_add(s, t->data, (size_t)lrmoe_tensor_numel(t));
    lrmoe_stats_finish(s);
}

/* Does text x convert back to the value v in dtype d? */
static int same_in_dtype(lrmoe_dtype_t d, double x, double v)
{
    switch (d) {
    case LRMOE_F32:
        return (float)x == (float)v;
    case LRMOE_BF16:
        return lrmoe_f32_to_bf16((float)x) == lrmoe_f32_to_bf16((float)v);
    case LRMOE_F16:
        return lrmoe_f32_to_f16((float)x) == lrmoe_f32_to_f16((float)v);
    default:
        return x == v;
    }
}

static const char *float_str(lrmoe_dtype_t d, double v, char *buf, size_t len)
{
    if (isnan(v))
        snprintf(buf, len, "nan");
    else if (isinf(v))
        snprintf(buf, len, v > 0 ? "inf" : "-inf");
    else
        for (int p = 1; p <= 17; p++) {
            snprintf(buf, len, "%.*g", p, v);
            if (same_in_dtype(d, strtod(buf, NULL), v)) {
                /* plain digits rather than 1e+01 for integral magnitudes */
                int x = v != 0 ? (int)floor(log10(fabs(v))) : 0;
                if (x >= p && x < 16)
                    snprintf(buf, len, "%.*g", x + 1, v);
                break;
            }
        }
    return buf;
}

const char *lrmoe_stats_value_str(lrmoe_dtype_t d, const void *data, size_t i,
                                  char *buf, size_t len)
{
    const uint8_t *p = (const uint8_t *)data + i * lrmoe_dtype_size(d);
    if (d == LRMOE_U64) {
        uint64_t u;
        memcpy(&u, p, 8);
        snprintf(buf, len, "%" PRIu64, u);
    } else if (!lrmoe_dtype_is_float(d)) {
        int64_t v;
        lrmoe_convert_to_i64(d, p, &v, 1);
        snprintf(buf, len, "%" PRId64, v);
    } else {
        double v;
        lrmoe_convert_to_f64(d, p, &v, 1);
        float_str(d, v, buf, len);
    }
    return buf;
}

const char *lrmoe_stats_extreme_str(const lrmoe_stats_t *s, int which,
                                    char *buf, size_t len)
{
    if (s->finite == 0)
        snprintf(buf, len, "-");
    else if (s->is_int && s->dtype == LRMOE_U64)
        snprintf(buf, len, "%" PRIu64, which ? s->umax : s->umin);
    else if (s->is_int)
        snprintf(buf, len, "%" PRId64, which ? s->imax : s->imin);
    else
        float_str(s->dtype, which ? s->max : s->min, buf, len);
    return buf;
}
