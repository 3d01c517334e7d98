/* route: top-K expert routing and load statistics (see route.h): options,
 * the choice of path (scalar in route_scalar.c, AVX2 in route_avx2.c,
 * AVX-512 in route_avx512.c), the worker threads, logits and statistics. */
#include "route.h"
#include "route_internal.h"

#include "blas.h"
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>


/* ------------------------------------------------------------ options */

void lrmoe_route_opts_default(lrmoe_route_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->router = LRMOE_ROUTER_SOFTMAX;
    o->k = 8;
    o->renorm = 0;
    o->scale = 1.0;
    o->groups = 0;
    o->topk_groups = 0;
    o->threads = 1;
}

static const char *router_names[] = {"softmax", "topk-softmax", "sigmoid"};

int lrmoe_route_parse_router(const char *s, lrmoe_router_t *r)
{
    for (int i = 0; i < 3; i++)
        if (strcmp(s, router_names[i]) == 0) {
            *r = (lrmoe_router_t)i;
            return 0;
        }
    if (strcmp(s, "gpt-oss") == 0) {
        *r = LRMOE_ROUTER_TOPK_SOFTMAX;
        return 0;
    }
    return lrmoe_err("unknown router '%s' (softmax, topk-softmax, sigmoid)", s);
}

const char *lrmoe_route_router_name(lrmoe_router_t r)
{
    return (unsigned)r < 3 ? router_names[r] : "?";
}

int lrmoe_route_check_opts(const lrmoe_route_opts_t *o)
{
    if ((unsigned)o->router > LRMOE_ROUTER_SIGMOID)
        return lrmoe_err("bad router");
    if (o->k < 1)
        return lrmoe_err("top-k %d: must be at least 1", o->k);
    if (!isfinite(o->scale))
        return lrmoe_err("scaling factor must be finite");
    if (o->threads < 1)
        return lrmoe_err("threads %d: must be at least 1", o->threads);
    if (o->groups < 0 || o->topk_groups < 0)
        return lrmoe_err("groups must not be negative");
    if (o->groups > 0 || o->topk_groups > 0) {
        if (o->router != LRMOE_ROUTER_SIGMOID)
            return lrmoe_err("group-limited selection needs the sigmoid router");
        if (o->groups < 1)
            return lrmoe_err("--topk-groups needs --groups");
        if (o->topk_groups < 1)
            return lrmoe_err("--groups needs --topk-groups");
        if (o->topk_groups > o->groups)
            return lrmoe_err("topk-groups %d exceeds the %d groups", o->topk_groups,
                             o->groups);
    }
    return 0;
}

int lrmoe_route_check(const lrmoe_route_opts_t *o, int64_t E)
{
    if (lrmoe_route_check_opts(o) < 0)
        return -1;
    if (E < 1)
        return lrmoe_err("no experts");
    if (E > INT32_MAX)
        return lrmoe_err("%lld experts: too many", (long long)E);
    if (o->k > E)
        return lrmoe_err("top-k %d exceeds the %lld experts", o->k, (long long)E);
    if (o->groups > 1) {
        if (E % o->groups)
            return lrmoe_err("%d groups do not divide the %lld experts", o->groups,
                             (long long)E);
        int64_t avail = (int64_t)o->topk_groups * (E / o->groups);
        if (o->k > avail)
            return lrmoe_err("top-k %d exceeds the %lld experts in %d of %d groups",
                             o->k, (long long)avail, o->topk_groups, o->groups);
    }
    return 0;
}

/* LRMOE_NO_SIMD=1 in the environment selects the portable scalar paths
 * (so tests can cover them on AVX2 machines). */
static int simd_ok(const char *feat2)
{
#ifdef ROUTE_X86
    const char *e = getenv("LRMOE_NO_SIMD");
    if (e && *e && strcmp(e, "0") != 0)
        return 0;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && (!feat2 || __builtin_cpu_supports("fma"));
#else
    (void)feat2;
    return 0;
#endif
}

static weights_fn pick_weights(int K)
{
#ifdef ROUTE_X86
    if (K <= 8 && simd_ok("fma"))
        return lrmoe_route_weights_avx2;
#endif
    (void)K;
    return lrmoe_route_weights_scalar;
}

static topk_fn pick_topk(void)
{
#ifdef ROUTE_X86
    lrmoe_route_avx2_init();
    if (simd_ok(NULL))
        return lrmoe_route_topk_avx2;
#endif
    return lrmoe_route_topk_scalar;
}

static expsum_fn pick_expsum(void)
{
#ifdef ROUTE_X86
    if (simd_ok("fma"))
        return lrmoe_route_expsum_avx2;
#endif
    return lrmoe_route_expsum_scalar;
}


/* load[id] += 1 for each of the n ids (0 <= id < E). Four interleaved
 * counters per expert, so that a run of one hot expert is four chains of
 * increments, not one; they are summed into load at the end. */
static void count_ids(const int32_t *ids, size_t n, int E, int64_t *load)
{
    int64_t *c = calloc((size_t)4 * (size_t)E, sizeof *c);
    size_t i = 0;
    if (c) {
        for (; i + 4 <= n; i += 4) {
            c[ids[i]]++;
            c[(size_t)E + (size_t)ids[i + 1]]++;
            c[2 * (size_t)E + (size_t)ids[i + 2]]++;
            c[3 * (size_t)E + (size_t)ids[i + 3]]++;
        }
        for (int j = 0; j < E; j++)
            load[j] += c[j] + c[E + j] + c[2 * E + j] + c[3 * E + j];
        free(c);
    }
    for (; i < n; i++) /* the tail, or everything without memory */
        load[ids[i]]++;
}

/* the expert load of the job's rows (none: ids may be NULL when T = 0) */
static void count_rows(job_t *jb)
{
    if (jb->t1 > jb->t0)
        count_ids(jb->ids + jb->t0 * jb->K, (size_t)(jb->t1 - jb->t0) * (size_t)jb->K, jb->E,
                  jb->load);
}

static void *run_job(void *arg)
{
    job_t *jb = arg;
    int E = jb->E, K = jb->K;
    size_t esz = lrmoe_dtype_size(jb->dt);
    int G = jb->o->groups > 1 ? jb->o->groups : 1;
    /* scratch: converted row, float/double top values, keys, groups */
    float *row = malloc((size_t)E * sizeof(float));
    float *ka = malloc((size_t)E * sizeof(float));
    int32_t *cj = malloc(((size_t)E + 8) * sizeof(int32_t));
    double *sge = malloc((size_t)E * sizeof(double));   /* sigmoid by expert... */
    int64_t *seen = malloc((size_t)E * sizeof(int64_t)); /* ...of token seen[j] */
    float *tvf = malloc((size_t)K * sizeof(float));
    double *tvd = malloc((size_t)K * sizeof(double));
    double *key = malloc((size_t)E * sizeof(double));
    double *gscore = malloc((size_t)G * sizeof(double));
    unsigned char *gok = malloc((size_t)G);
    /* candidates of a block of ROUTE512_ROWS rows, ranks of one, a block of widened
     * rows (lrmoe_route_rows_softmax_avx2; lrmoe_route_row_sigmoid_filter uses the first two) */
    jb->cv = calloc(ROUTE512_SCRATCH(E), sizeof(float));
    jb->ci = calloc(ROUTE512_SCRATCH(E), sizeof(int32_t));
    jb->rank = calloc((size_t)E + 16, sizeof(int32_t));
    jb->row = jb->fast && jb->dt != LRMOE_F32
                  ? malloc((size_t)ROUTE512_ROWS * E * sizeof(float)) : NULL;
    if (!row || !ka || !cj || !sge || !seen || !tvf || !tvd || !key || !gscore || !gok ||
        !jb->cv || !jb->ci || !jb->rank || (jb->fast && jb->dt != LRMOE_F32 && !jb->row)) {
        jb->err = ERR_OOM;
        jb->err_token = jb->t0;
        goto out;
    }
    for (int j = 0; j < E; j++)
        seen[j] = -1;
#ifdef ROUTE_X86
    if (jb->fast) {
        int64_t bt = jb->t0;
        int bad = 0, rc = lrmoe_route_rows_softmax_avx2(jb, &bt, &bad);
        if (rc) {
            jb->err = rc;
            jb->err_token = bt;
            jb->err_expert = bad;
        } else {
            count_rows(jb);
        }
        goto out;
    }
#endif
    int sig = jb->o->router == LRMOE_ROUTER_SIGMOID;
    for (int64_t t = jb->t0; t < jb->t1; t++) {
        const float *x;
        if (jb->dt == LRMOE_F32) {
            x = (const float *)jb->logits + t * E;
            /* the row loop is bursty; fetch a few rows ahead of it */
            if (t + 4 < jb->t1) {
                const char *pf = (const char *)(x + 4 * (int64_t)E);
                for (size_t b = 0; b < (size_t)E * sizeof(float); b += 64)
                    __builtin_prefetch(pf + b);
            }
        } else {
            lrmoe_convert_to_f32(jb->dt, (const char *)jb->logits + (size_t)t * E * esz,
                                 row, (size_t)E);
            x = row;
        }
        int32_t *ids = jb->ids + t * K;
        float *w = jb->w + t * K;
        int bad = 0;
        int rc;
#ifdef ROUTE_X86
        if (sig && jb->sigfast)
            rc = lrmoe_route_row_sigmoid_filter(jb, x, ids, w, key, ka, cj, tvf, tvd, gscore, gok, sge,
                                    seen, t, &bad);
        else
#endif
        rc = sig ? lrmoe_route_row_sigmoid(jb, x, ids, w, key, tvd, gscore, gok, &bad)
                 : lrmoe_route_row_softmax(jb, x, ids, w, tvf, &bad);
        if (rc) {
            jb->err = rc;
            jb->err_token = t;
            jb->err_expert = bad;
            goto out;
        }
    }
    count_rows(jb);
out:
    free(jb->cv); free(jb->ci); free(jb->rank); free(jb->row);
    free(row); free(ka); free(cj); free(sge); free(seen); free(tvf); free(tvd); free(key); free(gscore); free(gok);
    return NULL;
}

int lrmoe_route_topk(const lrmoe_route_opts_t *o, int64_t T, int64_t E,
                     lrmoe_dtype_t dt, const void *logits, const float *bias,
                     int32_t *ids, float *weights, int64_t *load)
{
    if (lrmoe_route_check(o, E) < 0)
        return -1;
    if (T < 0)
        return lrmoe_err("negative token count");
    if (dt != LRMOE_F32 && dt != LRMOE_BF16 && dt != LRMOE_F16 && dt != LRMOE_F64)
        return lrmoe_err("router logits: dtype %s is not a float type",
                         lrmoe_dtype_name(dt));
    if (o->router == LRMOE_ROUTER_SIGMOID && bias) {
        for (int64_t j = 0; j < E; j++)
            if (!isfinite(bias[j]))
                return lrmoe_err("expert_bias: expert %lld is not finite", (long long)j);
    }
    int nt = o->threads;
    if (nt > T)
        nt = T > 0 ? (int)T : 1;
    job_t *jobs = calloc((size_t)nt, sizeof *jobs);
    int64_t *loads = calloc((size_t)nt * (size_t)E, sizeof *loads);
    pthread_t *th = calloc((size_t)nt, sizeof *th);
    if (!jobs || !loads || !th) {
        free(jobs); free(loads); free(th);
        return lrmoe_err("out of memory");
    }
    topk_fn tk = pick_topk();
    expsum_fn es = pick_expsum();
    weights_fn wf = pick_weights(o->k);
    double bmax = 0;
    if (o->router == LRMOE_ROUTER_SIGMOID && bias)
        for (int64_t j = 0; j < E; j++)
            bmax = fmax(bmax, fabs((double)bias[j]));
    int sigfast = E % 8 == 0 && simd_ok("fma");
#ifdef ROUTE_X86
    int fast = o->router != LRMOE_ROUTER_SIGMOID && o->k <= 8 &&
               E % 8 == 0 && E <= EMAX && tk == lrmoe_route_topk_avx2 && wf == lrmoe_route_weights_avx2 &&
               es == lrmoe_route_expsum_avx2;
    int k512 = fast && E % 16 == 0 && lrmoe_route_avx512_ok();
#else
    int fast = 0, k512 = 0;
#endif
    for (int i = 0; i < nt; i++) {
        job_t *jb = &jobs[i];
        jb->o = o;
        jb->E = (int)E;
        jb->K = o->k;
        jb->dt = dt;
        jb->logits = logits;
        jb->bias = o->router == LRMOE_ROUTER_SIGMOID ? bias : NULL;
        jb->ids = ids;
        jb->w = weights;
        jb->t0 = T * i / nt;
        jb->t1 = T * (i + 1) / nt;
        jb->load = loads + (size_t)i * E;
        jb->topk = tk;
        jb->expsum = es;
        jb->weights = wf;
        jb->fast = fast;
        jb->rows512 = k512 ? lrmoe_route_softmax_rows512 : NULL;
        jb->sigfast = sigfast;
        jb->bmax = bmax;
    }
    int started = 1;
    for (int i = 1; i < nt; i++) {
        if (pthread_create(&th[i], NULL, run_job, &jobs[i]) != 0)
            break;
        started++;
    }
    run_job(&jobs[0]);
    for (int i = started; i < nt; i++)
        run_job(&jobs[i]); /* threads that could not start run here */
    for (int i = 1; i < started; i++)
        pthread_join(th[i], NULL);

    int rc = 0;
    const job_t *fail = NULL;
    for (int i = 0; i < nt; i++)
        if (jobs[i].err && (!fail || jobs[i].err_token < fail->err_token))
            fail = &jobs[i];
    if (fail) {
        long long t = (long long)fail->err_token;
        if (fail->err == ERR_NAN)
            rc = lrmoe_err("token %lld: router logit of expert %d is NaN", t,
                           fail->err_expert);
        else if (fail->err == ERR_ALLNEG)
            rc = lrmoe_err("token %lld: all router logits are -inf", t);
        else
            rc = lrmoe_err("out of memory");
    } else {
        memset(load, 0, (size_t)E * sizeof *load);
        for (int i = 0; i < nt; i++)
            for (int64_t j = 0; j < E; j++)
                load[j] += jobs[i].load[j];
    }
    free(jobs); free(loads); free(th);
    return rc;
}

/* ------------------------------------------------------------ logits */

int lrmoe_route_logits(int64_t T, int64_t D, int64_t E,
                       lrmoe_dtype_t hdt, const void *hidden,
                       lrmoe_dtype_t wdt, const void *rw, float *logits)
{
    if (!lrmoe_dtype_is_float(hdt) || !lrmoe_dtype_is_float(wdt))
        return lrmoe_err("hidden and router_weight must be float tensors");
    if (D < 1 || E < 1 || D > INT32_MAX || E > INT32_MAX)
        return lrmoe_err("bad router shape [%lld,%lld]", (long long)E, (long long)D);
    enum { B = 1024 };
    float *wf = malloc((size_t)E * (size_t)D * sizeof(float));
    float *hb = hdt == LRMOE_F32 ? NULL : malloc((size_t)B * (size_t)D * sizeof(float));
    if (!wf || (hdt != LRMOE_F32 && !hb)) {
        free(wf); free(hb);
        return lrmoe_err("out of memory");
    }
    lrmoe_convert_to_f32(wdt, rw, wf, (size_t)(E * D));
    size_t hsz = lrmoe_dtype_size(hdt);
    int rc = 0;
    for (int64_t t0 = 0; t0 < T && rc == 0; t0 += B) {
        int nb = (int)(T - t0 < B ? T - t0 : B);
        const float *h;
        if (hb) {
            lrmoe_convert_to_f32(hdt, (const char *)hidden + (size_t)t0 * D * hsz, hb,
                                 (size_t)nb * D);
            h = hb;
        } else {
            h = (const float *)hidden + t0 * D;
        }
        // h is (nb,D), wf is (E,D): logits rows (nb,E) = h wf^T
        rc = lrmoe_blas_sgemm(0, 1, nb, (int)E, (int)D, 1.0f, h, (int)D, wf, (int)D, 0.0f,
                              logits + t0 * E, (int)E);
    }
    free(wf);
    free(hb);
    return rc;
}

/* ------------------------------------------------------------ statistics */

int lrmoe_route_rank_load(int64_t E, int64_t P, const int64_t *load, int64_t *rank_load)
{
    if (P < 1)
        return lrmoe_err("ranks %lld: must be at least 1", (long long)P);
    if (E % P)
        return lrmoe_err("%lld ranks do not divide the %lld experts", (long long)P,
                         (long long)E);
    int64_t per = E / P;
    for (int64_t r = 0; r < P; r++) {
        int64_t s = 0;
        for (int64_t j = r * per; j < (r + 1) * per; j++)
            s += load[j];
        rank_load[r] = s;
    }
    return 0;
}

void lrmoe_route_load_stats(const int64_t *x, int64_t n, lrmoe_load_stats_t *s)
{
    s->max = 0;
    s->total = 0;
    for (int64_t i = 0; i < n; i++) {
        s->total += x[i];
        if (i == 0 || x[i] > s->max)
            s->max = x[i];
    }
    s->mean = n > 0 ? (double)s->total / (double)n : 0.0;
    s->imbalance = s->mean > 0 ? (double)s->max / s->mean : 0.0;
}

int lrmoe_route_hottest(const int64_t *x, int64_t nx, int n, int64_t *idx)
{
    int got = 0;
    if (n < 0)
        n = 0;
    for (int64_t j = 0; j < nx; j++) {
        int p;
        if (got < n) {
            p = got++;
        } else if (got > 0 && x[j] > x[idx[got - 1]]) {
            p = got - 1;
        } else {
            continue;
        }
        while (p > 0 && x[idx[p - 1]] < x[j]) {
            idx[p] = idx[p - 1];
            p--;
        }
        idx[p] = j;
    }
    return got;
}


int lrmoe_route_load_i64(lrmoe_dtype_t dt, const void *data, int64_t n, int64_t *load)
{
    if (!lrmoe_dtype_is_float(dt)) {
        lrmoe_convert_to_i64(dt, data, load, (size_t)n);
        return 0;
    }
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    if (!v)
        return lrmoe_err("out of memory");
    lrmoe_convert_to_f64(dt, data, v, (size_t)n);
    for (int64_t e = 0; e < n; e++) {
        if (!(isfinite(v[e]) && v[e] == floor(v[e]) && fabs(v[e]) < 9007199254740992.0)) {
            lrmoe_err("expert_load[%lld] is %g (%s): a load counts pairs, so a float vector "
                      "must hold whole numbers (convert it: torch's tokens_per_expert.long(), "
                      "numpy's .astype(np.int64))", (long long)e, v[e], lrmoe_dtype_name(dt));
            free(v);
            return -1;
        }
        load[e] = (int64_t)v[e];
    }
    free(v);
    return 0;
}
