/* route_test: the softmax routers' kernels against a brute-force reference.
 *
 * Softmax routers: for many shapes (E = 16 .. 1024, K = 1 .. 8, token counts that are not a
 * multiple of the 16-row blocks, 1-3 threads) and adversarial logits (ties,
 * -inf, spreads wide enough that picks' exps fall below FLT_MIN, rows with
 * far more than 16 logits at the top, BF16 input) it routes the same tokens
 * on every path this CPU has: the AVX-512 kernel, LRMOE_NO_AVX512=1 (AVX2)
 * and LRMOE_NO_SIMD=1 (scalar). Each must pick exactly the experts of a
 * stable sort by (logit decreasing, expert increasing), count the same load,
 * and give weights within 4e-6 relative (+1e-30 absolute) of a double
 * precision softmax of the F32 differences x - max, plus 2e-8 E relative
 * for a sum over all E experts in F32 (the exps are about 1 ulp, the sums
 * reassociated). NaN must fail on every path naming the same token.
 * Prints one line per path and exits 0, or names the first mismatch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "route.h"
#include "route_internal.h"

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static double unif(void) { return (double)(next() >> 11) * 0x1.0p-53; }
static double gauss(void)
{
    double u = unif() + 1e-300, v = unif();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

enum { NORMAL, TIES, NEGINF, WIDE, FLAT, POSINF, NEAR, NKIND };
static const char *kind_name[] = {"normal", "ties", "-inf", "wide", "flat", "+inf", "near"};

static void fill(float *x, int64_t T, int E, int kind)
{
    for (int64_t t = 0; t < T; t++) {
        float *r = x + t * E;
        for (int j = 0; j < E; j++) {
            double g = 2 * gauss();
            switch (kind) {
            case TIES: g = round(g * 2) / 2; break;               /* ~20 distinct values */
            case NEGINF: if (unif() < 0.3) g = -INFINITY; break;
            case WIDE: g *= 40; break;                            /* exps below FLT_MIN */
            case FLAT: g = unif() < 0.9 ? 1.0 : g; break;         /* > 16 at the top */
            case POSINF: if (unif() < 0.01) g = INFINITY; break;
            case NEAR: /* a few ulps apart: equal but for the low bits */
                if (unif() < 0.5) g = 4.0 + (double)(next() % 40) * 0x1p-21;
                break;
            }
            r[j] = (float)g;
        }
        if (kind == NEGINF)
            r[next() % E] = 0; /* not all -inf */
    }
}

/* reference: stable order by (x decreasing, j increasing) */
static const float *cmp_row;
static int cmp_j(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    if (cmp_row[i] != cmp_row[j])
        return cmp_row[i] > cmp_row[j] ? -1 : 1;
    return i - j;
}

static int check(const char *path, const lrmoe_route_opts_t *o, int64_t T, int E,
                 const float *x, const int32_t *ids, const float *w, const int64_t *load,
                 const char *what)
{
    int K = o->k;
    int *ord = malloc((size_t)E * sizeof *ord);
    int64_t *ld = calloc((size_t)E, sizeof *ld);
    int bad = 0, full = o->router == LRMOE_ROUTER_SOFTMAX && !o->renorm;
    double rtol = 4e-6 + (full ? 2e-8 * E : 0);
    for (int64_t t = 0; t < T && !bad; t++) {
        const float *r = x + t * E;
        for (int j = 0; j < E; j++)
            ord[j] = j;
        cmp_row = r;
        qsort(ord, (size_t)E, sizeof *ord, cmp_j);
        double m = r[ord[0]], den = 0, p[8];
        int ninf = 0;
        for (int k = 0; k < K; k++)
            ninf += r[ord[k]] == INFINITY;
        for (int k = 0; k < K; k++)
            p[k] = m == INFINITY ? (r[ord[k]] == INFINITY) : exp((double)(r[ord[k]] - (float)m));
        if (m == INFINITY) {
            den = 0;
            if (o->router == LRMOE_ROUTER_SOFTMAX && !o->renorm) {
                for (int j = 0; j < E; j++)
                    den += r[j] == INFINITY;
            } else {
                den = ninf;
            }
        } else if (o->router == LRMOE_ROUTER_SOFTMAX && !o->renorm) {
            for (int j = 0; j < E; j++)
                den += exp((double)(r[j] - (float)m));
        } else {
            for (int k = 0; k < K; k++)
                den += p[k];
        }
        for (int k = 0; k < K; k++) {
            ld[ord[k]]++;
            double want = o->scale * p[k] / den, got = w[t * K + k];
            if (ids[t * K + k] != ord[k]) {
                fprintf(stderr, "%s %s: token %lld pick %d: expert %d, want %d (%.9g vs %.9g)\n",
                        path, what, (long long)t, k, ids[t * K + k], ord[k],
                        ids[t * K + k] >= 0 && ids[t * K + k] < E ? r[ids[t * K + k]] : NAN,
                        r[ord[k]]);
                bad = 1;
                break;
            }
            if (!(fabs(got - want) <= rtol * fabs(want) + 1e-30)) {
                fprintf(stderr, "%s %s: token %lld pick %d: weight %.9g, want %.9g\n", path,
                        what, (long long)t, k, got, want);
                bad = 1;
                break;
            }
        }
    }
    for (int j = 0; j < E && !bad; j++)
        if (ld[j] != load[j]) {
            fprintf(stderr, "%s %s: load of expert %d is %lld, want %lld\n", path, what, j,
                    (long long)load[j], (long long)ld[j]);
            bad = 1;
        }
    free(ord);
    free(ld);
    return bad;
}

/* The sigmoid router's reference: keys s + bias in double, the M best groups
 * by the sum of their two best keys (ties to the lower group), the K best
 * allowed keys (ties to the lower expert), weights s (renormalised). */
static int check_sigmoid(const char *path, const lrmoe_route_opts_t *o, int64_t T, int E,
                         const float *x, const float *bias, const int32_t *ids,
                         const float *w, const char *what)
{
    int K = o->k, G = o->groups > 1 ? o->groups : 1, M = G > 1 ? o->topk_groups : 1;
    int gs = E / G;
    double *key = malloc((size_t)E * sizeof *key), *gsc = malloc((size_t)G * sizeof *gsc);
    char *ok = malloc((size_t)G);
    int bad = 0;
    for (int64_t t = 0; t < T && !bad; t++) {
        const float *r = x + t * E;
        for (int j = 0; j < E; j++)
            key[j] = 1.0 / (1.0 + exp(-(double)r[j])) + bias[j];
        for (int g = 0; g < G; g++) {
            double b1 = -INFINITY, b2 = -INFINITY;
            for (int i = 0; i < gs; i++) {
                double v = key[g * gs + i];
                if (v > b1) { b2 = b1; b1 = v; }
                else if (v > b2) b2 = v;
            }
            gsc[g] = gs > 1 ? b1 + b2 : b1;
            ok[g] = 0;
        }
        for (int m = 0; m < M; m++) {
            int best = -1;
            for (int g = 0; g < G; g++)
                if (!ok[g] && (best < 0 || gsc[g] > gsc[best]))
                    best = g;
            ok[best] = 1;
        }
        double sum = 0, sv[8];
        int pick[8];
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int j = 0; j < E; j++) {
                int used = 0;
                for (int q = 0; q < k; q++)
                    used |= pick[q] == j;
                if (!used && ok[j / gs] && (best < 0 || key[j] > key[best]))
                    best = j;
            }
            pick[k] = best;
            sv[k] = 1.0 / (1.0 + exp(-(double)r[best]));
            sum += sv[k];
        }
        double f = o->renorm ? o->scale / (sum + 1e-20) : o->scale;
        for (int k = 0; k < K && !bad; k++) {
            double want = sv[k] * f, got = w[t * K + k];
            if (ids[t * K + k] != pick[k]) {
                fprintf(stderr, "%s %s: token %lld pick %d: expert %d, want %d\n", path, what,
                        (long long)t, k, ids[t * K + k], pick[k]);
                bad = 1;
            } else if (!(fabs(got - want) <= 1e-6 * fabs(want) + 1e-30)) {
                fprintf(stderr, "%s %s: token %lld pick %d: weight %.9g, want %.9g\n", path,
                        what, (long long)t, k, got, want);
                bad = 1;
            }
        }
    }
    free(key); free(gsc); free(ok);
    return bad;
}

int main(int argc, char **argv)
{
    static const int Es[] = {16, 32, 48, 128, 256, 1024, 24};
    /* "route_test quick" (make unit): E <= 48 only */
    size_t nE = argc > 1 && !strcmp(argv[1], "quick") ? 3 : sizeof Es / sizeof Es[0];
    static const struct { const char *name, *var; } paths[] = {
        {"default", NULL}, {"no-avx512", "LRMOE_NO_AVX512"}, {"scalar", "LRMOE_NO_SIMD"}};
    int fails = 0;
    long cases = 0;
    printf("route_test: the default path %s the AVX-512 kernel on this CPU\n",
           lrmoe_route_avx512_ok() ? "is" : "is not (no AVX-512 here; it runs the AVX2 one)");
    for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
        unsetenv("LRMOE_NO_AVX512");
        unsetenv("LRMOE_NO_SIMD");
        if (paths[pi].var)
            setenv(paths[pi].var, "1", 1);
        rng = 88172645463325252ull; /* the same cases on every path */
        long n = 0;
        for (size_t ei = 0; ei < nE; ei++) {
            int E = Es[ei];
            for (int kind = 0; kind < NKIND; kind++) {
                for (int K = 1; K <= 8; K++) {
                    int64_t T = 1 + (int64_t)(next() % (E >= 512 ? 90 : 333));
                    float *x = malloc((size_t)(T * E) * sizeof *x);
                    uint16_t *xb = malloc((size_t)(T * E) * sizeof *xb);
                    int32_t *ids = malloc((size_t)(T * K) * sizeof *ids);
                    float *w = malloc((size_t)(T * K) * sizeof *w);
                    int64_t *load = malloc((size_t)E * sizeof *load);
                    fill(x, T, E, kind);
                    for (int64_t i = 0; i < T * E; i++) {
                        xb[i] = lrmoe_f32_to_bf16(x[i]);
                    }
                    for (int variant = 0; variant < 4; variant++) {
                        lrmoe_route_opts_t o;
                        lrmoe_route_opts_default(&o);
                        o.k = K;
                        o.threads = 1 + (int)(next() % 3);
                        o.router = variant == 2 ? LRMOE_ROUTER_TOPK_SOFTMAX : LRMOE_ROUTER_SOFTMAX;
                        o.renorm = variant == 1 || variant == 3;
                        o.scale = variant == 3 ? 2.5 : 1.0;
                        int bf = variant == 3;
                        char what[96];
                        snprintf(what, sizeof what, "E=%d K=%d T=%lld %s %s%s", E, K, (long long)T,
                                 kind_name[kind],
                                 variant == 2 ? "topk-softmax" : o.renorm ? "renorm" : "softmax",
                                 bf ? " BF16" : "");
                        if (lrmoe_route_topk(&o, T, E, bf ? LRMOE_BF16 : LRMOE_F32,
                                             bf ? (const void *)xb : (const void *)x, NULL, ids,
                                             w, load) < 0) {
                            fprintf(stderr, "%s %s: %s\n", paths[pi].name, what, lrmoe_errmsg());
                            fails++;
                            continue;
                        }
                        if (bf) /* the reference sees what the router saw */
                            for (int64_t i = 0; i < T * E; i++)
                                x[i] = lrmoe_bf16_to_f32(xb[i]);
                        fails += check(paths[pi].name, &o, T, E, x, ids, w, load, what);
                        n++;
                    }
                    /* the sigmoid router: bias (zero half the time, so keys
                     * tie), groups dividing E */
                    {
                        float *bias = malloc((size_t)E * sizeof *bias);
                        int zero = next() & 1;
                        for (int j = 0; j < E; j++)
                            bias[j] = zero ? 0.0f : (float)(0.05 * gauss());
                        lrmoe_route_opts_t o;
                        lrmoe_route_opts_default(&o);
                        o.router = LRMOE_ROUTER_SIGMOID;
                        o.k = K;
                        o.threads = 1 + (int)(next() % 3);
                        o.renorm = (int)(next() & 1);
                        o.scale = 1.5;
                        int G = 1 << (next() % 4);
                        if (E % G == 0 && G > 1) {
                            int gs = E / G, mmin = (K + gs - 1) / gs;
                            o.groups = G;
                            o.topk_groups = mmin + (int)(next() % (uint64_t)(G - mmin + 1));
                        }
                        char what[96];
                        snprintf(what, sizeof what, "E=%d K=%d T=%lld %s sigmoid G=%d M=%d%s", E, K,
                                 (long long)T, kind_name[kind], o.groups, o.topk_groups,
                                 zero ? " bias 0" : "");
                        if (lrmoe_route_topk(&o, T, E, LRMOE_F32, x, bias, ids, w, load) < 0) {
                            fprintf(stderr, "%s %s: %s\n", paths[pi].name, what, lrmoe_errmsg());
                            fails++;
                        } else {
                            fails += check_sigmoid(paths[pi].name, &o, T, E, x, bias, ids, w,
                                                   what);
                            n++;
                        }
                        free(bias);
                    }
                    /* a NaN in one token: every path names it */
                    int64_t tn = (int64_t)(next() % (uint64_t)T);
                    int jn = (int)(next() % (uint64_t)E);
                    x[tn * E + jn] = NAN;
                    lrmoe_route_opts_t o;
                    lrmoe_route_opts_default(&o);
                    o.k = K;
                    char want[64];
                    snprintf(want, sizeof want, "token %lld:", (long long)tn);
                    if (lrmoe_route_topk(&o, T, E, LRMOE_F32, x, NULL, ids, w, load) == 0 ||
                        !strstr(lrmoe_errmsg(), want) || !strstr(lrmoe_errmsg(), "NaN")) {
                        fprintf(stderr, "%s E=%d K=%d: NaN at token %lld not reported (%s)\n",
                                paths[pi].name, E, K, (long long)tn, lrmoe_errmsg());
                        fails++;
                    }
                    free(x); free(xb); free(ids); free(w); free(load);
                }
            }
        }
        printf("route_test: %s path: %ld cases\n", paths[pi].name, n);
        cases += n;
    }
    if (fails) {
        fprintf(stderr, "route_test: %d failures\n", fails);
        return 1;
    }
    printf("route_test: %ld cases, all match\n", cases);
    return 0;
}
