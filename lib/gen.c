/* gen: synthetic MoE workloads (see gen.h and lrmoe-gen(1)). */
#include "gen.h"
#include "rng.h"
#include "route.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- presets */

static const lrmoe_gen_preset_t PRESETS[] = {
    {"qwen3-30b-a3b", 128, 8, 2048, 768, "Qwen3-30B-A3B"},
    {"glm4.5-air", 128, 8, 4096, 1408, "GLM-4.5-Air (106B-A12B)"},
    {"gpt-oss-20b", 32, 4, 2880, 2880, "gpt-oss-20b"},
    {"gpt-oss-120b", 128, 4, 2880, 2880, "gpt-oss-120b"},
    {"deepseek-v3", 256, 8, 7168, 2048, "DeepSeek-V3 (671B-A37B)"},
    {"kimi-k2", 384, 8, 7168, 2048, "Kimi K2 (1T-A32B)"},
};
#define NPRESETS ((int)(sizeof PRESETS / sizeof PRESETS[0]))

const lrmoe_gen_preset_t *lrmoe_gen_presets(int *n)
{
    *n = NPRESETS;
    return PRESETS;
}

const lrmoe_gen_preset_t *lrmoe_gen_preset_find(const char *name)
{
    for (int i = 0; i < NPRESETS; i++)
        if (!strcmp(PRESETS[i].name, name))
            return &PRESETS[i];
    lrmoe_err("unknown preset '%s' (see --list-presets)", name);
    return NULL;
}

/* ---------------------------------------------------------------- options */

void lrmoe_gen_opts_default(lrmoe_gen_opts_t *o)
{
    memset(o, 0, sizeof *o);
    const lrmoe_gen_preset_t *p = &PRESETS[0];
    snprintf(o->model, sizeof o->model, "%s", p->name);
    o->T = 4096;
    o->E = p->E;
    o->K = p->K;
    o->D = p->D;
    o->F = p->F;
    o->dtype = LRMOE_BF16;
    o->logits_dtype = LRMOE_F32;
    o->seed = 1;
    o->skew = LRMOE_SKEW_BALANCED;
    o->margin = 1.0;
    o->grad_scale = 1.0;
    o->grad_sigma = 1.0;
    o->hidden_scale = 1.0;
    o->weight_scale = 1.0;
    o->threads = 1;
}

int lrmoe_gen_apply_preset(lrmoe_gen_opts_t *o, const char *name)
{
    const lrmoe_gen_preset_t *p = lrmoe_gen_preset_find(name);
    if (!p)
        return -1;
    snprintf(o->model, sizeof o->model, "%s", p->name);
    o->E = p->E;
    o->K = p->K;
    o->D = p->D;
    o->F = p->F;
    return 0;
}

/* Strict double: the whole string, finite. */
static int parse_num(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

static int parse_int(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno)
        return -1;
    *out = v;
    return 0;
}

int lrmoe_gen_parse_hot(lrmoe_gen_opts_t *o, const char *spec)
{
    char buf[128];
    if (snprintf(buf, sizeof buf, "%s", spec) >= (int)sizeof buf)
        return lrmoe_err("--hot: '%s' is too long", spec);
    char *colon = strchr(buf, ':');
    double pct;
    int64_t n;
    if (!colon)
        return lrmoe_err("--hot: '%s' is not PCT:N (e.g. 95:1)", spec);
    *colon = 0;
    if (parse_num(buf, &pct) < 0 || pct <= 0 || pct > 100)
        return lrmoe_err("--hot: percentage '%s' is not in (0,100]", buf);
    if (parse_int(colon + 1, &n) < 0 || n < 1 || n > LRMOE_GEN_MAX_HOT)
        return lrmoe_err("--hot: expert count '%s' is not in [1,%d]", colon + 1,
                         LRMOE_GEN_MAX_HOT);
    if (o->nhot_list > 0 && o->nhot_list != n)
        return lrmoe_err("--hot: %lld experts but --hot-experts lists %lld",
                         (long long)n, (long long)o->nhot_list);
    o->skew = LRMOE_SKEW_HOT;
    o->hot_pct = pct;
    o->hot_n = n;
    return 0;
}

int lrmoe_gen_parse_skew(lrmoe_gen_opts_t *o, const char *spec)
{
    if (!strcmp(spec, "balanced") || !strcmp(spec, "uniform")) {
        o->skew = LRMOE_SKEW_BALANCED;
        return 0;
    }
    if (!strncmp(spec, "hot:", 4))
        return lrmoe_gen_parse_hot(o, spec + 4);
    if (!strncmp(spec, "zipf:", 5)) {
        double s;
        if (parse_num(spec + 5, &s) < 0 || s < 0 || s > 100)
            return lrmoe_err("--zipf: exponent '%s' is not in [0,100]", spec + 5);
        o->skew = LRMOE_SKEW_ZIPF;
        o->zipf_s = s;
        return 0;
    }
    return lrmoe_err("--skew: '%s' is not balanced, hot:PCT:N or zipf:S", spec);
}

int lrmoe_gen_parse_hot_list(lrmoe_gen_opts_t *o, const char *spec)
{
    const char *p = spec;
    int64_t n = 0;
    if (!*p)
        return lrmoe_err("--hot-experts: empty list");
    while (*p) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || (*end && *end != ','))
            return lrmoe_err("--hot-experts: '%s' is not a list of expert ids", spec);
        if (n == LRMOE_GEN_MAX_HOT)
            return lrmoe_err("--hot-experts: more than %d experts", LRMOE_GEN_MAX_HOT);
        for (int64_t i = 0; i < n; i++)
            if (o->hot_list[i] == v)
                return lrmoe_err("--hot-experts: expert %lld listed twice", v);
        o->hot_list[n++] = v;
        p = *end ? end + 1 : end;
        if (*end && !*p)
            return lrmoe_err("--hot-experts: '%s' ends with a comma", spec);
    }
    if (o->skew == LRMOE_SKEW_HOT && o->hot_n != n)
        return lrmoe_err("--hot-experts: %lld experts listed but --hot asks for %lld",
                         (long long)n, (long long)o->hot_n);
    o->nhot_list = n;
    return 0;
}

int lrmoe_gen_check(const lrmoe_gen_opts_t *o)
{
    if (o->T < 1 || o->E < 1 || o->K < 1 || o->D < 1 || o->F < 1)
        return lrmoe_err("tokens, experts, topk, hidden and ffn must be >= 1");
    if (o->K > o->E)
        return lrmoe_err("--topk %lld is larger than --experts %lld", (long long)o->K,
                         (long long)o->E);
    if (!lrmoe_dtype_is_float(o->dtype) || !lrmoe_dtype_is_float(o->logits_dtype))
        return lrmoe_err("--dtype: only floating-point dtypes can be generated");
    if (!(o->margin >= 0.5 && o->margin <= 50))
        return lrmoe_err("--margin: %g is not in [0.5,50]", o->margin);
    if (!(o->drift >= 0 && o->drift <= 1e6))
        return lrmoe_err("--drift: %g is not in [0,1e6]", o->drift);
    if (o->skew == LRMOE_SKEW_HOT) {
        if (o->hot_n > o->E - o->K)
            return lrmoe_err("--hot %g:%lld: at most experts - topk = %lld hot experts",
                             o->hot_pct, (long long)o->hot_n, (long long)(o->E - o->K));
    }
    if (o->nhot_list > 0) {
        if (o->skew != LRMOE_SKEW_HOT)
            return lrmoe_err("--hot-experts needs --hot PCT:N");
        for (int64_t i = 0; i < o->nhot_list; i++)
            if (o->hot_list[i] >= o->E)
                return lrmoe_err("--hot-experts: expert %lld is not below %lld",
                                 (long long)o->hot_list[i], (long long)o->E);
    }
    /* keep every tensor's byte count representable */
    if (o->routing < LRMOE_GEN_FULL || o->routing > LRMOE_GEN_LOADS)
        return lrmoe_err("routing mode %d: not full, logits or loads", o->routing);
    double big = (double)o->E * o->F * o->D, tok = (double)o->T * (o->D > o->E ? o->D : o->E);
    if (big * 8 > 9e18 || tok * 8 > 9e18)
        return lrmoe_err("shapes are too large");
    return 0;
}

const char *lrmoe_gen_skew_str(const lrmoe_gen_opts_t *o, char *buf, size_t len)
{
    switch (o->skew) {
    case LRMOE_SKEW_HOT:
        snprintf(buf, len, "hot:%g:%lld", o->hot_pct, (long long)o->hot_n);
        break;
    case LRMOE_SKEW_ZIPF:
        snprintf(buf, len, "zipf:%g", o->zipf_s);
        break;
    default:
        snprintf(buf, len, "balanced");
    }
    return buf;
}

/* ---------------------------------------------------------------- streams */

/* Every random stream is keyed (seed, tag, layer, step, row). */
enum {
    TAG_PERM = 1,   /* expert popularity permutation (seed only) */
    TAG_TOKENS,     /* which tokens are hot (layer, step) */
    TAG_HIDDEN,
    TAG_LOGITS,
    TAG_GRAD,
    TAG_W_GATE = 16,
    TAG_W_UP,
    TAG_W_DOWN,
    TAG_ROUTER
};

int lrmoe_gen_expert_order(const lrmoe_gen_opts_t *o, int64_t layer, int64_t step,
                           int64_t *order)
{
    int64_t E = o->E;
    int64_t *base = malloc((size_t)E * sizeof *base);
    if (!base)
        return lrmoe_err("out of memory");
    lrmoe_rng_t r;
    lrmoe_rng_seed4(&r, o->seed, TAG_PERM, 0, 0, 0);
    lrmoe_rng_permutation(&r, base, E);
    if (o->nhot_list > 0) { /* listed experts first, then the rest in base order */
        int64_t n = 0;
        for (int64_t i = 0; i < o->nhot_list; i++)
            order[n++] = o->hot_list[i];
        for (int64_t i = 0; i < E; i++) {
            int listed = 0;
            for (int64_t j = 0; j < o->nhot_list; j++)
                listed |= o->hot_list[j] == base[i];
            if (!listed)
                order[n++] = base[i];
        }
        memcpy(base, order, (size_t)E * sizeof *base);
    }
    double sh = floor(o->drift * (double)(layer + step));
    int64_t shift = (int64_t)fmod(sh, (double)E);
    for (int64_t i = 0; i < E; i++)
        order[i] = base[(i + shift) % E];
    free(base);
    return 0;
}

/* ---------------------------------------------------------------- row work */

typedef enum { ROW_NORMAL, ROW_GRAD, ROW_LOGITS, ROW_LOADS } row_kind_t;

typedef struct {
    const lrmoe_gen_opts_t *o;
    row_kind_t kind;
    uint64_t tag;
    int64_t layer, step;
    int64_t nrows, ncols;
    float std;                 /* ROW_NORMAL: element std */
    lrmoe_tensor_t *t;         /* destination (nrows, ncols) */
    /* ROW_LOGITS */
    const int64_t *order;      /* (E) expert at popularity rank */
    const int64_t *rank_of;    /* (E) popularity rank of expert */
    const int32_t *hot_of;     /* (T) hot slot of a token, -1 cold */
    const float *prior;        /* (E) log-prior per expert (zipf), or NULL */
    int failed;
} rowjob_t;

typedef struct {
    rowjob_t *job;
    int64_t r0, r1;
    int64_t *load;             /* ROW_LOADS: this part's expert_load (E) */
    int failed;
} rowpart_t;

/* The value with k larger-or-equal values before it: k-th largest (0-based)
 * of v[0..n), which is reordered. */
static float kth_largest(float *v, int64_t n, int64_t k)
{
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        float piv = v[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] > piv) i++;
            while (v[j] < piv) j--;
            if (i <= j) {
                float t = v[i];
                v[i] = v[j];
                v[j] = t;
                i++;
                j--;
            }
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            return v[k];
    }
    return v[k];
}

/* logits (E) for token t; scratch holds E floats. */
static void logits_row(const rowjob_t *j, lrmoe_rng_t *r, int64_t t, float *row,
                       float *scratch)
{
    const lrmoe_gen_opts_t *o = j->o;
    int64_t E = o->E;
    for (int64_t e = 0; e < E; e++) {
        double g = lrmoe_rng_gumbel(r);
        if (j->prior)
            g += j->prior[j->rank_of[e]];
        row[e] = (float)g;
    }
    if (o->skew != LRMOE_SKEW_HOT)
        return;
    /* cold experts: everything but order[0..N) */
    int64_t N = o->hot_n, nc = 0;
    float mx = -INFINITY;
    for (int64_t e = 0; e < E; e++)
        if (j->rank_of[e] >= N) {
            scratch[nc++] = row[e];
            if (row[e] > mx)
                mx = row[e];
        }
    /* A hot token (hot index h) sends m = min(N,K) choices to the hot
     * experts at slots (h*m + j) mod N, j < m, with a margin over every cold
     * logit; the other hot experts go below the (K-m)-th largest cold logit
     * (below the largest when m == K), so its top-K is those m hot experts
     * plus the K-m best cold ones. A cold token keeps its K best cold ones. */
    int32_t h = j->hot_of[t];
    int64_t m = h < 0 ? 0 : (N < o->K ? N : o->K);
    float theta = m < o->K ? kth_largest(scratch, nc, o->K - m - 1) : mx;
    int64_t first = h < 0 ? 0 : ((int64_t)h * m) % N;
    for (int64_t i = 0; i < N; i++) {
        int64_t e = j->order[i];
        int64_t off = (i - first + N) % N; /* slot i is chosen when off < m */
        if (off < m)
            row[e] = mx + (float)(o->margin + lrmoe_rng_exp(r));
        else
            row[e] = theta - (float)(o->margin + lrmoe_rng_exp(r));
    }
}

static void *row_worker(void *arg)
{
    rowpart_t *p = arg;
    rowjob_t *j = p->job;
    const lrmoe_gen_opts_t *o = j->o;
    int64_t nc = j->ncols;
    size_t es = lrmoe_dtype_size(j->t->dtype);
    float *buf = malloc((size_t)nc * 2 * sizeof *buf);
    if (!buf) {
        p->failed = 1;
        return NULL;
    }
    float *scratch = buf + nc;
    for (int64_t row = p->r0; row < p->r1; row++) {
        lrmoe_rng_t r;
        lrmoe_rng_seed4(&r, o->seed, j->tag, (uint64_t)j->layer, (uint64_t)j->step,
                        (uint64_t)row);
        switch (j->kind) {
        case ROW_NORMAL:
            lrmoe_rng_normal_f32(&r, buf, (size_t)nc, 0.0f, j->std);
            break;
        case ROW_GRAD: {
            /* per-token log-normal scale with mean 1 */
            double sg = o->grad_sigma;
            double s = exp(sg * lrmoe_rng_normal(&r) - 0.5 * sg * sg) * o->grad_scale;
            r.has_spare = 0;
            lrmoe_rng_normal_f32(&r, buf, (size_t)nc, 0.0f, (float)s);
            break;
        }
        case ROW_LOGITS:
        case ROW_LOADS: /* loads_worker's */
            logits_row(j, &r, row, buf, scratch);
            break;
        }
        lrmoe_convert_from_f32(j->t->dtype, buf, (char *)j->t->data + (size_t)row * nc * es,
                               (size_t)nc);
    }
    free(buf);
    return NULL;
}

/* ROW_LOADS: the logits of rows r0..r1, a block at a time, rounded to
 * logits_dtype and routed as lrmoe-route's default softmax router routes
 * them; only the counts are kept, so memory is a block of logits. */
#define LOADS_BLOCK 256
static void *loads_worker(void *arg)
{
    rowpart_t *p = arg;
    rowjob_t *j = p->job;
    const lrmoe_gen_opts_t *o = j->o;
    int64_t E = o->E, K = o->K;
    size_t es = lrmoe_dtype_size(o->logits_dtype);
    float *buf = malloc((size_t)E * 2 * sizeof *buf);
    char *blk = malloc((size_t)LOADS_BLOCK * E * es);
    int32_t *ids = malloc((size_t)LOADS_BLOCK * K * sizeof *ids);
    float *w = malloc((size_t)LOADS_BLOCK * K * sizeof *w);
    int64_t *bl = malloc((size_t)E * sizeof *bl);
    lrmoe_route_opts_t ro;
    lrmoe_route_opts_default(&ro);
    ro.k = (int)K;
    if (!buf || !blk || !ids || !w || !bl) {
        p->failed = 1;
        goto out;
    }
    memset(p->load, 0, (size_t)E * sizeof *p->load);
    for (int64_t r0 = p->r0; r0 < p->r1; r0 += LOADS_BLOCK) {
        int64_t n = p->r1 - r0 < LOADS_BLOCK ? p->r1 - r0 : LOADS_BLOCK;
        for (int64_t i = 0; i < n; i++) {
            lrmoe_rng_t r;
            lrmoe_rng_seed4(&r, o->seed, j->tag, (uint64_t)j->layer, (uint64_t)j->step,
                            (uint64_t)(r0 + i));
            logits_row(j, &r, r0 + i, buf, buf + E);
            lrmoe_convert_from_f32(o->logits_dtype, buf, blk + (size_t)i * E * es, (size_t)E);
        }
        if (lrmoe_route_topk(&ro, n, E, o->logits_dtype, blk, NULL, ids, w, bl) < 0) {
            p->failed = 2;
            goto out;
        }
        for (int64_t e = 0; e < E; e++)
            p->load[e] += bl[e];
    }
out:
    free(buf);
    free(blk);
    free(ids);
    free(w);
    free(bl);
    return NULL;
}

static int run_rows(rowjob_t *j)
{
    void *(*worker)(void *) = j->kind == ROW_LOADS ? loads_worker : row_worker;
    int nt = j->o->threads < 1 ? 1 : j->o->threads;
    if (nt > 256)
        nt = 256;
    double work = (double)j->nrows * j->ncols;
    if (work < 65536)
        nt = 1;
    if (nt > j->nrows)
        nt = (int)j->nrows;
    rowpart_t parts[256];
    pthread_t tid[256];
    int started[256] = {0};
    int64_t E = j->o->E, *loads = NULL;
    if (j->kind == ROW_LOADS && !(loads = calloc((size_t)nt * E, sizeof *loads)))
        return lrmoe_err("out of memory");
    for (int i = 0; i < nt; i++) {
        parts[i].job = j;
        parts[i].r0 = j->nrows * i / nt;
        parts[i].r1 = j->nrows * (i + 1) / nt;
        parts[i].load = loads ? loads + (size_t)i * E : NULL;
        parts[i].failed = 0;
    }
    for (int i = 1; i < nt; i++)
        started[i] = pthread_create(&tid[i], NULL, worker, &parts[i]) == 0;
    worker(&parts[0]);
    int failed = parts[0].failed;
    for (int i = 1; i < nt; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        else
            worker(&parts[i]); /* no thread: do it here */
        failed |= parts[i].failed;
    }
    if (!failed && loads) { /* integer sums: the same for any thread count */
        int64_t *load = j->t->data;
        memset(load, 0, (size_t)E * sizeof *load);
        for (int i = 0; i < nt; i++)
            for (int64_t e = 0; e < E; e++)
                load[e] += parts[i].load[e];
    }
    free(loads);
    if (failed & 2)
        return -1; /* the router's message */
    if (failed)
        return lrmoe_err("out of memory");
    return 0;
}

static lrmoe_tensor_t *put2(lrmoe_frame_t *f, const char *name, lrmoe_dtype_t dt,
                            int64_t a, int64_t b)
{
    int64_t shape[2] = {a, b};
    return lrmoe_frame_put(f, name, dt, 2, shape);
}

static lrmoe_tensor_t *put3(lrmoe_frame_t *f, const char *name, lrmoe_dtype_t dt,
                            int64_t a, int64_t b, int64_t c)
{
    int64_t shape[3] = {a, b, c};
    return lrmoe_frame_put(f, name, dt, 3, shape);
}

/* Write the list v[0..n) as "a,b,c" into a malloc'd string. */
static char *join_ids(const int64_t *v, int64_t n)
{
    size_t cap = (size_t)n * 21 + 1, len = 0;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    s[0] = 0;
    for (int64_t i = 0; i < n; i++)
        len += (size_t)snprintf(s + len, cap - len, i ? ",%lld" : "%lld", (long long)v[i]);
    return s;
}

static int set_common_attrs(const lrmoe_gen_opts_t *o, int64_t layer, lrmoe_frame_t *f)
{
    if (lrmoe_frame_set_attrf(f, "layer", "%lld", (long long)layer) < 0 ||
        lrmoe_frame_set_attr(f, "model", o->model) < 0 ||
        lrmoe_frame_set_attrf(f, "seed", "%llu", (unsigned long long)o->seed) < 0)
        return -1;
    return 0;
}

int lrmoe_gen_frame(const lrmoe_gen_opts_t *o, int64_t layer, int64_t step,
                    lrmoe_frame_t *f)
{
    if (lrmoe_gen_check(o) < 0)
        return -1;
    lrmoe_frame_clear(f);
    int64_t T = o->T, E = o->E, D = o->D;
    int rc = -1;
    int64_t *order = malloc((size_t)E * sizeof *order);
    int64_t *rank_of = malloc((size_t)E * sizeof *rank_of);
    float *prior = NULL;
    int32_t *hot_of = NULL;
    int64_t *tperm = NULL;
    char *ids = NULL;
    char skew[64];
    if (!order || !rank_of)
        goto oom;
    if (lrmoe_gen_expert_order(o, layer, step, order) < 0)
        goto out;
    for (int64_t i = 0; i < E; i++)
        rank_of[order[i]] = i;
    if (o->skew == LRMOE_SKEW_ZIPF) {
        prior = malloc((size_t)E * sizeof *prior);
        if (!prior)
            goto oom;
        for (int64_t i = 0; i < E; i++)
            prior[i] = (float)(-o->zipf_s * log((double)(i + 1)));
    }
    if (o->skew == LRMOE_SKEW_HOT) {
        hot_of = malloc((size_t)T * sizeof *hot_of);
        tperm = malloc((size_t)T * sizeof *tperm);
        if (!hot_of || !tperm)
            goto oom;
        lrmoe_rng_t r;
        lrmoe_rng_seed4(&r, o->seed, TAG_TOKENS, (uint64_t)layer, (uint64_t)step, 0);
        lrmoe_rng_permutation(&r, tperm, T);
        int64_t H = llround(o->hot_pct / 100.0 * (double)T);
        if (H > T)
            H = T;
        for (int64_t t = 0; t < T; t++)
            hot_of[t] = -1;
        for (int64_t i = 0; i < H; i++)
            hot_of[tperm[i]] = (int32_t)(i % o->hot_n); /* hot index, mod N */
    }

    /* hidden is (T,D), router_logits is (T,E), grad_output is (T,D) */
    rowjob_t j = {.o = o, .layer = layer, .step = step, .nrows = T};
    j.kind = ROW_NORMAL;
    j.tag = TAG_HIDDEN;
    j.ncols = D;
    j.std = (float)o->hidden_scale;
    if (o->routing == LRMOE_GEN_FULL &&
        (!(j.t = put2(f, "hidden", o->dtype, T, D)) || run_rows(&j) < 0))
        goto out;
    j.kind = ROW_LOGITS;
    j.tag = TAG_LOGITS;
    j.ncols = E;
    j.order = order;
    j.rank_of = rank_of;
    j.hot_of = hot_of;
    j.prior = prior;
    if (o->routing == LRMOE_GEN_LOADS) {
        int64_t de[1] = {E};
        j.kind = ROW_LOADS;
        if (!(j.t = lrmoe_frame_put(f, "expert_load", LRMOE_I64, 1, de)) || run_rows(&j) < 0)
            goto out;
    } else if (!(j.t = put2(f, "router_logits", o->logits_dtype, T, E)) || run_rows(&j) < 0)
        goto out;
    j.kind = ROW_GRAD;
    j.tag = TAG_GRAD;
    j.ncols = D;
    if (o->routing == LRMOE_GEN_FULL &&
        (!(j.t = put2(f, "grad_output", o->dtype, T, D)) || run_rows(&j) < 0))
        goto out;
    /* routing-only: the size of the tensors not written, for lrmoe-plan and
     * lrmoe-sim (hidden = D), and how the loads were routed */
    if (o->routing != LRMOE_GEN_FULL &&
        lrmoe_frame_set_attrf(f, "hidden", "%lld", (long long)D) < 0)
        goto out;
    if (o->routing == LRMOE_GEN_LOADS &&
        (lrmoe_frame_set_attr(f, "route.router", "softmax") < 0 ||
         lrmoe_frame_set_attrf(f, "route.topk", "%lld", (long long)o->K) < 0))
        goto out;

    if (set_common_attrs(o, layer, f) < 0 ||
        lrmoe_frame_set_attrf(f, "step", "%lld", (long long)step) < 0 ||
        lrmoe_frame_set_attrf(f, "topk", "%lld", (long long)o->K) < 0 ||
        lrmoe_frame_set_attrf(f, "ffn", "%lld", (long long)o->F) < 0 ||
        lrmoe_frame_set_attr(f, "gen.skew", lrmoe_gen_skew_str(o, skew, sizeof skew)) < 0)
        goto out;
    if (o->drift > 0 && lrmoe_frame_set_attrf(f, "gen.drift", "%g", o->drift) < 0)
        goto out;
    if (o->skew == LRMOE_SKEW_HOT || o->skew == LRMOE_SKEW_ZIPF) {
        int64_t n = o->skew == LRMOE_SKEW_HOT ? o->hot_n : E;
        if (!(ids = join_ids(order, n)))
            goto oom;
        if (lrmoe_frame_set_attr(f, o->skew == LRMOE_SKEW_HOT ? "gen.hot" : "gen.order",
                                 ids) < 0)
            goto out;
    }
    rc = 0;
    goto out;
oom:
    lrmoe_err("out of memory");
out:
    free(order);
    free(rank_of);
    free(prior);
    free(hot_of);
    free(tperm);
    free(ids);
    return rc;
}

int lrmoe_gen_weights(const lrmoe_gen_opts_t *o, int64_t layer, lrmoe_frame_t *f)
{
    if (lrmoe_gen_check(o) < 0)
        return -1;
    lrmoe_frame_clear(f);
    int64_t E = o->E, D = o->D, F = o->F;
    rowjob_t j = {.o = o, .kind = ROW_NORMAL, .layer = layer, .step = 0};
    /* w_gate, w_up are (E,F,D): rows (e,f) of D values, std 1/sqrt(D) */
    j.nrows = E * F;
    j.ncols = D;
    j.std = (float)(o->weight_scale / sqrt((double)D));
    j.tag = TAG_W_GATE;
    if (!(j.t = put3(f, "w_gate", o->dtype, E, F, D)) || run_rows(&j) < 0)
        return -1;
    j.tag = TAG_W_UP;
    if (!(j.t = put3(f, "w_up", o->dtype, E, F, D)) || run_rows(&j) < 0)
        return -1;
    /* w_down is (E,D,F): rows (e,d) of F values, std 1/sqrt(F) */
    j.nrows = E * D;
    j.ncols = F;
    j.std = (float)(o->weight_scale / sqrt((double)F));
    j.tag = TAG_W_DOWN;
    if (!(j.t = put3(f, "w_down", o->dtype, E, D, F)) || run_rows(&j) < 0)
        return -1;
    /* router_weight is (E,D) F32, expert_bias is (E) F32 zeros */
    if (!(j.t = put2(f, "router_weight", LRMOE_F32, E, D)))
        return -1;
    if (o->router_init) {
        j.nrows = E;
        j.ncols = D;
        j.std = (float)(1.0 / sqrt((double)D));
        j.tag = TAG_ROUTER;
        if (run_rows(&j) < 0)
            return -1;
    }
    int64_t shape[1] = {E};
    if (!lrmoe_frame_put(f, "expert_bias", LRMOE_F32, 1, shape))
        return -1;
    if (set_common_attrs(o, layer, f) < 0)
        return -1;
    return 0;
}
