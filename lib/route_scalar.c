/* route_scalar: the portable paths of the routers (every CPU; the
 * reference the SIMD paths must agree with, and their fallback on the rows
 * they do not cover: NaN, infinite maxima, sigmoid groups). */
#include "route.h"
#include "route_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>



/* Top-K of a float row; -1 with *bad = expert on NaN. */
int lrmoe_route_topk_scalar(const float *x, int E, int K, float *tv, int32_t *ti, int *bad)
{
    int j = 0;
    for (; j < K; j++) {
        float v = x[j];
        if (v != v) { *bad = j; return -1; }
        INSERT(tv, ti, j, v, j);
    }
    float thr = tv[K - 1];
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

/* sum_j exp(x_j - m), x_j <= m, m finite. */
float lrmoe_route_expsum_scalar(const float *x, int E, float m)
{
    double s = 0; /* a float sum of E terms drifts by up to E ulps */
    for (int j = 0; j < E; j++)
        s += expf(x[j] - m);
    return (float)s;
}


void lrmoe_route_weights_scalar(const float *tv, int K, float m, float s, float scale, float *w)
{
    float sum = 0;
    for (int k = 0; k < K; k++) {
        w[k] = expf(tv[k] - m);
        sum += w[k];
    }
    if (!(s > 0))
        s = sum;
    float f = (float)((double)scale / (double)s);
    for (int k = 0; k < K; k++)
        w[k] *= f;
}

/* Top-K over double keys, optionally only experts whose group is allowed. */
void lrmoe_route_topk_f64(const double *key, int E, int K, const unsigned char *gok,
                     int gsize, double *tv, int32_t *ti)
{
    int n = 0;
    double thr = 0;
    for (int j = 0; j < E; j++) {
        if (gok && !gok[j / gsize])
            continue;
        double v = key[j];
        if (n < K) {
            INSERT(tv, ti, n, v, j);
            if (++n == K)
                thr = tv[K - 1];
        } else if (v > thr) {
            INSERT(tv, ti, K - 1, v, j);
            thr = tv[K - 1];
        }
    }
}

/* Softmax routers on one row. 0, or ERR_* with *bad set. */
int lrmoe_route_row_softmax(const job_t *jb, const float *x, int32_t *ids, float *w,
                       float *tv, int *bad)
{
    const lrmoe_route_opts_t *o = jb->o;
    int E = jb->E, K = jb->K;
    if (jb->topk(x, E, K, tv, ids, bad) < 0)
        return ERR_NAN;
    float m = tv[0];
    int full = o->router == LRMOE_ROUTER_SOFTMAX && !o->renorm;
    if (m == -INFINITY)
        return ERR_ALLNEG;
    if (m == INFINITY) {
        /* limit: the +inf experts share the mass equally */
        int64_t n = 0;
        if (full) {
            for (int j = 0; j < E; j++)
                n += x[j] == INFINITY;
        } else {
            for (int k = 0; k < K; k++)
                n += tv[k] == INFINITY;
        }
        for (int k = 0; k < K; k++)
            w[k] = tv[k] == INFINITY ? (float)(o->scale / (double)n) : 0.0f;
        return 0;
    }
    jb->weights(tv, K, m, full ? jb->expsum(x, E, m) : 0.0f, (float)o->scale, w);
    return 0;
}

/* Sigmoid router on one row; key (E) and gscore/gok (G) are scratch. */
int lrmoe_route_row_sigmoid(const job_t *jb, const float *x, int32_t *ids, float *w,
                       double *key, double *tv, double *gscore, unsigned char *gok,
                       int *bad)
{
    const lrmoe_route_opts_t *o = jb->o;
    int E = jb->E, K = jb->K;
    for (int j = 0; j < E; j++) {
        float v = x[j];
        if (v != v) { *bad = j; return ERR_NAN; }
        key[j] = route_sigmoid(v) + (jb->bias ? (double)jb->bias[j] : 0.0);
    }
    const unsigned char *allow = NULL;
    int gsize = E;
    if (o->groups > 1) {
        int G = o->groups, M = o->topk_groups;
        gsize = E / G;
        for (int g = 0; g < G; g++) {
            /* sum of the two best keys of the group (the one key if size 1) */
            const double *kg = key + (int64_t)g * gsize;
            double b1 = kg[0], b2 = -INFINITY;
            for (int i = 1; i < gsize; i++) {
                if (kg[i] > b1) { b2 = b1; b1 = kg[i]; }
                else if (kg[i] > b2) b2 = kg[i];
            }
            gscore[g] = gsize > 1 ? b1 + b2 : b1;
            gok[g] = 0;
        }
        /* M best groups, ties to the lower group index */
        for (int m = 0; m < M; m++) {
            int best = -1;
            for (int g = 0; g < G; g++)
                if (!gok[g] && (best < 0 || gscore[g] > gscore[best]))
                    best = g;
            gok[best] = 1;
        }
        allow = gok;
    }
    lrmoe_route_topk_f64(key, E, K, allow, gsize, tv, ids);
    double s = 0, *wd = tv; /* the top values are no longer needed */
    for (int k = 0; k < K; k++) {
        wd[k] = route_sigmoid(x[ids[k]]);
        s += wd[k];
    }
    double f = o->renorm ? o->scale / (s + 1e-20) : o->scale;
    for (int k = 0; k < K; k++)
        w[k] = (float)(wd[k] * f);
    return 0;
}

