/* pack: backward assignment of retained pairs, physical compaction of their
 * rows into destination-major, expert-major segments, and the inverse
 * scatter-add. See pack.h for the layout and the assignment rule. */
#include "pack.h"
#include "par.h"
#include "clock.h"

#include <stdlib.h>
#include <string.h>

void lrmoe_pack_plan_free(lrmoe_pack_plan_t *pl)
{
    if (!pl)
        return;
    free(pl->pair);
    free(pl->rank);
    free(pl->counts);
    free(pl->offsets);
    memset(pl, 0, sizeof *pl);
}

/* The native rank of expert e: rank r owns experts [r*E/P, (r+1)*E/P). */
static int native_rank(int e, int E, int P)
{
    int r = (int)((int64_t)e * P / E);
    while (r > 0 && (int64_t)r * E / P > e)
        r--;
    while (r + 1 < P && (int64_t)(r + 1) * E / P <= e)
        r++;
    return r;
}

/* The plan's backward rows per (expert, rank) into rem, checked: none
 * negative, none on a rank without an instance of the expert, and each
 * expert's rows summing to its kept pairs. */
static int plan_rows(const lrmoe_pack_in_t *in, const int64_t *kept, int64_t *rem)
{
    const int E = in->E, P = in->P;
    for (int e = 0; e < E; e++) {
        int64_t s = 0;
        for (int p = 0; p < P; p++) {
            int64_t a = in->bwd_alloc[(int64_t)e * P + p];
            if (a < 0) {
                lrmoe_err("bwd_alloc: expert %d rank %d is negative (%lld)",
                          e, p, (long long)a);
                return -1;
            }
            if (a > 0 && in->placement && !in->placement[(int64_t)e * P + p]) {
                lrmoe_err("bwd_alloc: expert %d has %lld rows on rank %d, "
                          "which holds no instance of it", e, (long long)a, p);
                return -1;
            }
            if (__builtin_add_overflow(s, a, &s)) {
                lrmoe_err("bwd_alloc: expert %d allocates more than 2^63-1 rows in all", e);
                return -1;
            }
            rem[(int64_t)e * P + p] = a;
        }
        if (s != kept[e]) {
            lrmoe_err("bwd_alloc: expert %d allocates %lld rows but %lld "
                      "pairs are kept (the keep mask is not the plan's quotas, as after "
                      "lrmoe-score --drop: pack with --alloc forward)", e, (long long)s,
                      (long long)kept[e]);
            return -1;
        }
    }
    return 0;
}

int lrmoe_pack_assign(const lrmoe_pack_in_t *in, lrmoe_pack_plan_t *out)
{
    memset(out, 0, sizeof *out);
    const int64_t T = in->T, N = in->T * in->K;
    const int K = in->K, E = in->E, P = in->P;
    if (T < 0 || K <= 0 || E <= 0 || P <= 0)
        return lrmoe_err("bad sizes T=%lld K=%d E=%d P=%d", (long long)T, K, E, P);
    int64_t EP = (int64_t)E * P;
    int64_t *kept = calloc((size_t)E, sizeof *kept);
    int64_t *rem = calloc((size_t)EP, sizeof *rem);
    int32_t *dest = malloc((size_t)(N ? N : 1) * sizeof *dest);
    int32_t *fwd = malloc((size_t)(N ? N : 1) * sizeof *fwd);
    int *cur = calloc((size_t)E, sizeof *cur);
    int rc = -1;
    if (!kept || !rem || !dest || !fwd || !cur) {
        lrmoe_err("out of memory");
        goto out;
    }

    /* validate keep, ids, forward ranks; count kept pairs per expert */
    int64_t R = 0;
    for (int64_t u = 0; u < N; u++) {
        int32_t e = in->topk_ids[u];
        if (e < 0 || e >= E) {
            lrmoe_err("topk_ids: expert %d at pair %lld out of range [0,%d)",
                      (int)e, (long long)u, E);
            goto out;
        }
        if (in->keep[u] > 1) {
            lrmoe_err("keep: value %d at pair %lld (expected 0 or 1)",
                      in->keep[u], (long long)u);
            goto out;
        }
        int r = in->pair_rank ? in->pair_rank[u] : native_rank(e, E, P);
        if (r < 0 || r >= P) {
            lrmoe_err("pair_rank: rank %d at pair %lld out of range [0,%d)", r,
                      (long long)u, P);
            goto out;
        }
        fwd[u] = r;
        dest[u] = -1;
        if (in->keep[u]) {
            kept[e]++;
            R++;
            if (!in->bwd_alloc)
                rem[(int64_t)e * P + r]++;
        }
    }
    if (in->quota)
        for (int e = 0; e < E; e++)
            if (kept[e] != in->quota[e]) {
                lrmoe_err("keep: expert %d keeps %lld pairs but its quota is "
                          "%lld", e, (long long)kept[e], (long long)in->quota[e]);
                goto out;
            }
    if (in->bwd_alloc) {
        if (plan_rows(in, kept, rem) < 0)
            goto out;
    } else if (in->placement) {
        for (int64_t u = 0; u < N; u++)
            if (in->keep[u] &&
                !in->placement[(int64_t)in->topk_ids[u] * P + fwd[u]]) {
                lrmoe_err("pair_rank: pair %lld ran on rank %d, which holds no "
                          "instance of expert %d", (long long)u, fwd[u],
                          in->topk_ids[u]);
                goto out;
            }
    }

    /* pass 1: stay on the forward rank while its allocation lasts */
    int64_t moved = 0;
    for (int64_t u = 0; u < N; u++) {
        if (!in->keep[u])
            continue;
        int64_t c = (int64_t)in->topk_ids[u] * P + fwd[u];
        if (rem[c] > 0) {
            rem[c]--;
            dest[u] = fwd[u];
        }
    }
    /* pass 2: the rest fill what is left, lowest rank first */
    for (int64_t u = 0; u < N; u++) {
        if (!in->keep[u] || dest[u] >= 0)
            continue;
        int e = in->topk_ids[u];
        int64_t *re = rem + (int64_t)e * P;
        while (cur[e] < P && re[cur[e]] == 0)
            cur[e]++;
        if (cur[e] >= P) { /* cannot happen: sums were checked */
            lrmoe_err("bwd_alloc: expert %d has no room left", e);
            goto out;
        }
        re[cur[e]]--;
        dest[u] = cur[e];
        moved++;
    }

    out->T = T;
    out->K = K;
    out->E = E;
    out->P = P;
    out->R = R;
    out->moved = moved;
    out->pair = malloc((size_t)(R ? R : 1) * sizeof *out->pair);
    out->rank = malloc((size_t)(R ? R : 1) * sizeof *out->rank);
    out->counts = calloc((size_t)EP, sizeof *out->counts);
    out->offsets = calloc((size_t)EP, sizeof *out->offsets);
    if (!out->pair || !out->rank || !out->counts || !out->offsets) {
        lrmoe_pack_plan_free(out);
        lrmoe_err("out of memory");
        goto out;
    }
    for (int64_t u = 0; u < N; u++)
        if (in->keep[u])
            out->counts[(int64_t)dest[u] * E + in->topk_ids[u]]++;
    int64_t acc = 0;
    for (int64_t c = 0; c < EP; c++) {
        out->offsets[c] = acc;
        acc += out->counts[c];
    }
    /* rem reused as the fill cursor of each (p,e) segment */
    memcpy(rem, out->offsets, (size_t)EP * sizeof *rem);
    for (int64_t u = 0; u < N; u++)
        if (in->keep[u]) {
            int64_t i = rem[(int64_t)dest[u] * E + in->topk_ids[u]]++;
            out->pair[i] = u;
            out->rank[i] = dest[u];
        }
    rc = 0;
out:
    free(kept);
    free(rem);
    free(dest);
    free(fwd);
    free(cur);
    return rc;
}

void lrmoe_pack_gather(const int64_t *pair, int64_t R, int K, int by_token,
                       const void *src, size_t row_bytes, void *dst)
{
    const char *s = src;
    char *d = dst;
    if (!row_bytes) /* rows of nothing: an empty tensor's data may be NULL */
        return;
    for (int64_t i = 0; i < R; i++) {
        int64_t r = by_token ? pair[i] / K : pair[i];
        memcpy(d + (size_t)i * row_bytes, s + (size_t)r * row_bytes, row_bytes);
    }
}

void lrmoe_pack_gather_scaled(const int64_t *pair, int64_t R, int K, int64_t D,
                              const float *g, const float *alpha, float *dst)
{
    lrmoe_pack_gather_scaled_dt(pair, R, K, D, LRMOE_F32, g, alpha, dst);
}

void lrmoe_pack_gather_scaled_dt(const int64_t *pair, int64_t R, int K,
                                 int64_t D, lrmoe_dtype_t gdt, const void *g,
                                 const float *alpha, float *dst)
{
    const size_t rb = (size_t)D * lrmoe_dtype_size(gdt);
    if (!rb) /* rows of nothing: an empty grad_output's data may be NULL */
        return;
    for (int64_t i = 0; i < R; i++) {
        int64_t u = pair[i];
        const float a = alpha[u];
        float *o = dst + i * D;
        lrmoe_convert_to_f32(gdt, (const char *)g + (size_t)(u / K) * rb, o,
                             (size_t)D);
        for (int64_t j = 0; j < D; j++)
            o[j] *= a;
    }
}

/* inv (T*K): packed row of each pair, -1 when not packed */
static int64_t *inverse_map(const int64_t *pair, int64_t R, int64_t N)
{
    int64_t *inv = malloc((size_t)(N ? N : 1) * sizeof *inv);
    if (!inv) {
        lrmoe_err("out of memory");
        return NULL;
    }
    for (int64_t u = 0; u < N; u++)
        inv[u] = -1;
    for (int64_t i = 0; i < R; i++) {
        int64_t u = pair[i];
        if (u < 0 || u >= N) {
            lrmoe_err("pack_pair: row %lld names pair %lld, out of range "
                      "[0,%lld)", (long long)i, (long long)u, (long long)N);
            free(inv);
            return NULL;
        }
        if (inv[u] >= 0) {
            lrmoe_err("pack_pair: pair %lld packed twice (rows %lld and %lld)",
                      (long long)u, (long long)inv[u], (long long)i);
            free(inv);
            return NULL;
        }
        inv[u] = i;
    }
    return inv;
}

int lrmoe_pack_unpack(const int64_t *pair, int64_t R, const float *rows,
                      int64_t D, int64_t T, int K, float *out)
{
    int64_t *inv = inverse_map(pair, R, T * K);
    if (!inv)
        return -1;
    for (int64_t t = 0; t < T; t++) {
        float *o = out + t * D;
        for (int64_t j = 0; j < D; j++)
            o[j] = 0.0f;
        for (int k = 0; k < K; k++) {
            int64_t i = inv[t * K + k];
            if (i < 0)
                continue;
            const float *r = rows + i * D;
            for (int64_t j = 0; j < D; j++)
                o[j] += r[j];
        }
    }
    free(inv);
    return 0;
}

int lrmoe_pack_unpack_pairs(const int64_t *pair, int64_t R, const float *rows,
                            int64_t D, int64_t T, int K, float *out)
{
    int64_t N = T * K;
    int64_t *inv = inverse_map(pair, R, N);
    if (!inv)
        return -1;
    for (int64_t u = 0; u < N; u++) {
        float *o = out + u * D;
        if (inv[u] < 0)
            memset(o, 0, (size_t)D * sizeof *o);
        else
            memcpy(o, rows + inv[u] * D, (size_t)D * sizeof *o);
    }
    free(inv);
    return 0;
}

/* ---------------------------------------------------------------- frames */

void lrmoe_pack_opts_default(lrmoe_pack_opts_t *o)
{
    o->alloc = LRMOE_PACK_ALLOC_AUTO;
    o->P = 0;
    o->strip = 0;
    o->threads = 1;
}

/* integer tensor -> malloc'd i32 (values outside i32 become -1) */
static int32_t *to_i32(const lrmoe_tensor_t *t)
{
    int64_t n = lrmoe_tensor_numel(t);
    if (lrmoe_dtype_is_float(t->dtype)) {
        lrmoe_err("tensor %s: dtype %s, expected an integer dtype", t->name,
                  lrmoe_dtype_name(t->dtype));
        return NULL;
    }
    int32_t *o = malloc((size_t)(n ? n : 1) * sizeof *o);
    int64_t *w = o ? lrmoe_tensor_i64(t) : NULL;
    if (!o || !w) {
        free(o);
        if (!o)
            lrmoe_err("out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < n; i++)
        o[i] = (w[i] < INT32_MIN || w[i] > INT32_MAX) ? -1 : (int32_t)w[i];
    free(w);
    return o;
}

/* integer/bool tensor -> malloc'd u8 (values outside [0,255] become 255) */
static uint8_t *to_u8(const lrmoe_tensor_t *t)
{
    int64_t n = lrmoe_tensor_numel(t);
    if (lrmoe_dtype_is_float(t->dtype)) {
        lrmoe_err("tensor %s: dtype %s, expected U8 or BOOL", t->name,
                  lrmoe_dtype_name(t->dtype));
        return NULL;
    }
    uint8_t *o = malloc((size_t)(n ? n : 1));
    if (!o) {
        lrmoe_err("out of memory");
        return NULL;
    }
    if (t->dtype == LRMOE_U8 || t->dtype == LRMOE_BOOL) {
        if (n)
            memcpy(o, t->data, (size_t)n);
        return o;
    }
    int64_t *w = lrmoe_tensor_i64(t);
    if (!w) {
        free(o);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++)
        o[i] = (w[i] < 0 || w[i] > 255) ? 255 : (uint8_t)w[i];
    free(w);
    return o;
}

/* The gathers over packed-row ranges (each range writes only its rows). */
typedef struct {
    const int64_t *pair;
    int K, by_token;
    int64_t D;
    lrmoe_dtype_t gdt;
    const void *src;
    size_t row_bytes;
    const float *alpha;
    void *dst;
} gather_job_t;

static int gather_rows(void *vp, int64_t i0, int64_t i1)
{
    const gather_job_t *j = vp;
    lrmoe_pack_gather(j->pair + i0, i1 - i0, j->K, j->by_token, j->src, j->row_bytes,
                      (char *)j->dst + (size_t)i0 * j->row_bytes);
    return 0;
}

static int gather_scaled_rows(void *vp, int64_t i0, int64_t i1)
{
    const gather_job_t *j = vp;
    lrmoe_pack_gather_scaled_dt(j->pair + i0, i1 - i0, j->K, j->D, j->gdt, j->src, j->alpha,
                                (float *)j->dst + i0 * j->D);
    return 0;
}

static int put_rows(lrmoe_frame_t *f, const char *name, const lrmoe_tensor_t *src,
                    const lrmoe_pack_plan_t *pl, int by_token, int threads)
{
    int64_t W = src->shape[src->ndim - 1];
    size_t rb = (size_t)W * lrmoe_dtype_size(src->dtype);
    void *d = lrmoe_alloc_big((size_t)pl->R * rb);
    if (!d)
        return lrmoe_err("out of memory (%s)", name);
    gather_job_t j = {pl->pair, pl->K, by_token, 0, src->dtype, src->data, rb, NULL, d};
    lrmoe_parallel_ranges(pl->R, threads, 256, gather_rows, &j);
    /* adopt owns d from here, also on failure */
    return lrmoe_frame_adopt(f, name, src->dtype, 2, (int64_t[]){pl->R, W}, d)
               ? 0 : -1;
}

static const char *const pack_row_names[4] = {"pack_grad", "pack_hidden", "pack_gate",
                                              "pack_up"};

/* The four row tensors of the copying form, gathered by pack_pair (pl->pair,
 * R rows): pack_grad = alpha_u g_t (F32), pack_hidden, pack_gate, pack_up
 * (byte copies). alpha is topk_weights as F32. */
static int put_all_rows(lrmoe_frame_t *f, const lrmoe_pack_plan_t *pl, const float *alpha,
                        int threads)
{
    const lrmoe_tensor_t *tg = lrmoe_frame_get(f, "grad_output");
    const int64_t D = tg->shape[1];
    float *pg = lrmoe_alloc_big((size_t)(pl->R * D) * sizeof *pg);
    if (!pg)
        return lrmoe_err("out of memory");
    gather_job_t j = {pl->pair, pl->K, 1, D, tg->dtype, tg->data, 0, alpha, pg};
    lrmoe_parallel_ranges(pl->R, threads, 256, gather_scaled_rows, &j);
    /* adopt owns (and on failure frees) the buffer it is given */
    if (!lrmoe_frame_adopt(f, "pack_grad", LRMOE_F32, 2, (int64_t[]){pl->R, D}, pg))
        return -1;
    /* looked up again after each put: a put may grow the frame's tensor
     * table (data pointers stay valid, but be explicit about the source) */
    if (put_rows(f, "pack_hidden", lrmoe_frame_get(f, "hidden"), pl, 1, threads) < 0 ||
        put_rows(f, "pack_gate", lrmoe_frame_get(f, "saved_gate"), pl, 0, threads) < 0 ||
        put_rows(f, "pack_up", lrmoe_frame_get(f, "saved_up"), pl, 0, threads) < 0)
        return -1;
    return 0;
}

int lrmoe_pack_frame(lrmoe_frame_t *f, const lrmoe_pack_opts_t *o)
{
    return lrmoe_pack_frame_x(f, o, 0);
}

/* E and P of a pack from the plan's bwd_alloc and placement (which must
 * agree), else --ranks, else the exec.ranks the forward recorded; E stays 0
 * when no plan tensor says it. */
static int pack_ranks(lrmoe_frame_t *f, const lrmoe_pack_opts_t *o, lrmoe_tensor_t *tba,
                      lrmoe_tensor_t *tpl, int *Ep, int *Pp)
{
    int E = 0, P = 0;
    if (tba) {
        if (lrmoe_tensor_check(tba, 2, (int64_t[]){-1, -1}) < 0 ||
            lrmoe_tensor_dim_count(tba, 0, &E) < 0 || lrmoe_tensor_dim_count(tba, 1, &P) < 0)
            return -1;
    }
    if (tpl) {
        if (lrmoe_tensor_check(tpl, 2, (int64_t[]){E ? E : -1, P ? P : -1}) < 0 ||
            lrmoe_tensor_dim_count(tpl, 0, &E) < 0 || lrmoe_tensor_dim_count(tpl, 1, &P) < 0)
            return -1;
    }
    if (!P)
        P = o->P;
    int64_t xr = 0;
    if (!P && lrmoe_frame_attr_i64(f, "exec.ranks", &xr) == 1 && xr > 0 && xr <= 1 << 20)
        P = (int)xr; /* the ranks the forward ran on (lrmoe-exec records them) */
    if (!P)
        return lrmoe_err("cannot tell the number of ranks: no bwd_alloc or "
                         "placement tensor and no exec.ranks attribute (give --ranks)");
    if (o->P && o->P != P)
        return lrmoe_err("--ranks %d disagrees with the plan's %d ranks", o->P, P);
    *Ep = E;
    *Pp = P;
    return 0;
}

/* The layout a pack realised into f: pack_pair, pack_rank (R), pack_counts
 * and pack_offsets (P,E), adopted from pl (whose pointers are cleared:
 * the frame owns them). */
static int adopt_layout(lrmoe_frame_t *f, lrmoe_pack_plan_t *pl, int P, int E)
{
    struct { const char *name; lrmoe_dtype_t dt; int nd; void **d; } t[4] = {
        {"pack_pair", LRMOE_I64, 1, (void **)&pl->pair},
        {"pack_rank", LRMOE_I32, 1, (void **)&pl->rank},
        {"pack_counts", LRMOE_I64, 2, (void **)&pl->counts},
        {"pack_offsets", LRMOE_I64, 2, (void **)&pl->offsets}};
    for (int i = 0; i < 4; i++) {
        void *d = *t[i].d;
        *t[i].d = NULL;
        int64_t shape[2] = {t[i].nd == 1 ? pl->R : P, E};
        if (!lrmoe_frame_adopt(f, t[i].name, t[i].dt, t[i].nd, shape, d))
            return -1;
    }
    return 0;
}

/* The pack.* attributes: rows, moved state, ranks, rows per rank, the
 * allocation ("plan" or "forward"), the form and the time since t0. */
static int pack_attrs(lrmoe_frame_t *f, const lrmoe_pack_plan_t *pl, int P, int E,
                      const char *alloc_name, int layout_only, double t0)
{
    const int64_t *cnt = lrmoe_frame_get(f, "pack_counts")->data;
    char buf[4096];
    size_t n = 0;
    buf[0] = 0;
    for (int p = 0; p < P && n + 24 < sizeof buf; p++) {
        int64_t s = 0;
        for (int e = 0; e < E; e++)
            s += cnt[(int64_t)p * E + e];
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%lld",
                              p ? "," : "", (long long)s);
    }
    if (lrmoe_frame_set_attrf(f, "pack.rows", "%lld", (long long)pl->R) < 0 ||
        lrmoe_frame_set_attrf(f, "pack.moved", "%lld", (long long)pl->moved) < 0 ||
        lrmoe_frame_set_attrf(f, "pack.ranks", "%d", P) < 0 ||
        lrmoe_frame_set_attr(f, "pack.rank_rows", buf) < 0 ||
        lrmoe_frame_set_attr(f, "pack.alloc", alloc_name) < 0 ||
        lrmoe_frame_set_attr(f, "pack.form", layout_only ? "layout" : "rows") < 0 ||
        lrmoe_frame_set_attrf(f, "pack.seconds", "%.6f", lrmoe_now() - t0) < 0)
        return -1;
    return 0;
}

int lrmoe_pack_frame_x(lrmoe_frame_t *f, const lrmoe_pack_opts_t *o, unsigned flags)
{
    const int layout_only = (flags & LRMOE_PACK_LAYOUT_ONLY) != 0;
    if (flags & ~(unsigned)LRMOE_PACK_LAYOUT_ONLY)
        return lrmoe_err("pack: unknown flags 0x%x", flags & ~(unsigned)LRMOE_PACK_LAYOUT_ONLY);
    if (layout_only && o->strip)
        return lrmoe_err("--strip with --layout-only: a layout-only pack reads its rows "
                         "from saved_gate and saved_up, so they must stay");
    double t0 = lrmoe_now();
    lrmoe_tensor_t *tid = lrmoe_frame_need(f, "topk_ids");
    lrmoe_tensor_t *tkeep = tid ? lrmoe_frame_need(f, "keep") : NULL;
    if (!tkeep)
        return -1;
    if (lrmoe_tensor_check(tid, 2, (int64_t[]){-1, -1}) < 0)
        return -1;
    int64_t T = tid->shape[0];
    int K;
    if (lrmoe_tensor_dim_int(tid, 1, &K) < 0 ||
        lrmoe_tensor_check(tkeep, 2, (int64_t[]){T, K}) < 0)
        return -1;
    lrmoe_tensor_t *tw = lrmoe_frame_need(f, "topk_weights");
    lrmoe_tensor_t *tg = tw ? lrmoe_frame_need(f, "grad_output") : NULL;
    lrmoe_tensor_t *th = tg ? lrmoe_frame_need(f, "hidden") : NULL;
    lrmoe_tensor_t *tsg = th ? lrmoe_frame_need(f, "saved_gate") : NULL;
    lrmoe_tensor_t *tsu = tsg ? lrmoe_frame_need(f, "saved_up") : NULL;
    if (!tsu || lrmoe_tensor_check(tw, 2, (int64_t[]){T, K}) < 0 ||
        lrmoe_tensor_check(tg, 2, (int64_t[]){T, -1}) < 0 ||
        lrmoe_tensor_check(th, 2, (int64_t[]){T, -1}) < 0 ||
        lrmoe_tensor_check(tsg, 3, (int64_t[]){T, K, -1}) < 0 ||
        lrmoe_tensor_check(tsu, 3, (int64_t[]){T, K, tsg->shape[2]}) < 0)
        return -1;

    lrmoe_tensor_t *tpr = lrmoe_frame_get(f, "pair_rank");
    lrmoe_tensor_t *tpl = lrmoe_frame_get(f, "placement");
    lrmoe_tensor_t *tba = lrmoe_frame_get(f, "bwd_alloc");
    lrmoe_tensor_t *tq = lrmoe_frame_get(f, "quota");
    int had_alloc = tba != NULL;
    if (o->alloc == LRMOE_PACK_ALLOC_FORWARD)
        tba = NULL;
    else if (o->alloc == LRMOE_PACK_ALLOC_PLAN && !tba)
        return lrmoe_err("missing tensor bwd_alloc (run lrmoe-plan first, or "
                         "give --alloc forward)");
    int E = 0, P = 0;
    if (pack_ranks(f, o, tba, tpl, &E, &P) < 0)
        return -1;
    if (tq) {
        if (lrmoe_tensor_check(tq, 1, (int64_t[]){E ? E : -1}) < 0 ||
            lrmoe_tensor_dim_count(tq, 0, &E) < 0)
            return -1;
    }
    if (tpr && lrmoe_tensor_check(tpr, 2, (int64_t[]){T, K}) < 0)
        return -1;

    int rc = -1;
    lrmoe_pack_plan_t pl = {0};
    lrmoe_pack_in_t in = {0};
    int32_t *ids = NULL, *prank = NULL;
    uint8_t *keep = NULL, *place = NULL;
    int64_t *alloc = NULL, *quota = NULL;
    float *alpha = NULL;
    if (!(ids = to_i32(tid)) || !(keep = to_u8(tkeep)))
        goto out;
    if (!E && lrmoe_experts_from_ids(ids, T * K, &E) < 0)
        goto out;
    if (!E)
        E = 1;
    if (tpr && !(prank = to_i32(tpr)))
        goto out;
    if (tpl && !(place = to_u8(tpl)))
        goto out;
    if (tba && !(alloc = lrmoe_tensor_i64(tba)))
        goto out;
    if (tq && !(quota = lrmoe_tensor_i64(tq)))
        goto out;
    in.T = T;
    in.K = K;
    in.E = E;
    in.P = P;
    in.topk_ids = ids;
    in.keep = keep;
    in.pair_rank = prank;
    in.placement = place;
    in.bwd_alloc = alloc;
    in.quota = quota;
    if (lrmoe_pack_assign(&in, &pl) < 0)
        goto out;
    if (!lrmoe_dtype_is_float(tg->dtype)) {
        lrmoe_err("tensor grad_output: dtype %s, expected a float dtype",
                  lrmoe_dtype_name(tg->dtype));
        goto out;
    }
    if (layout_only) {
        /* rows of an earlier pack would not match the new layout */
        for (int i = 0; i < 4; i++)
            lrmoe_frame_del(f, pack_row_names[i]);
    } else if (!(alpha = lrmoe_frame_bwd_alpha(f, tw, T, K)) ||
               put_all_rows(f, &pl, alpha, o->threads) < 0) {
        goto out;
    }
    if (adopt_layout(f, &pl, P, E) < 0)
        goto out;
    if (had_alloc && !alloc) {
        /* forward allocation over a plan: record what was realised so the
         * plan's bwd_alloc keeps summing to the (new) quotas */
        const int64_t *cnt = lrmoe_frame_get(f, "pack_counts")->data;
        lrmoe_tensor_t *tb = lrmoe_frame_put(f, "bwd_alloc", LRMOE_I64, 2,
                                             (int64_t[]){E, P});
        if (!tb)
            goto out;
        int64_t *b = tb->data;
        for (int e = 0; e < E; e++)
            for (int p = 0; p < P; p++)
                b[(int64_t)e * P + p] = cnt[(int64_t)p * E + e];
    }
    if (o->strip) {
        lrmoe_frame_del(f, "saved_gate");
        lrmoe_frame_del(f, "saved_up");
    }
    if (pack_attrs(f, &pl, P, E, alloc ? "plan" : "forward", layout_only, t0) < 0)
        goto out;
    rc = 0;
out:
    lrmoe_pack_plan_free(&pl);
    free(ids);
    free(prank);
    free(keep);
    free(place);
    free(alloc);
    free(quota);
    free(alpha);
    return rc;
}

int lrmoe_pack_form(const lrmoe_frame_t *f)
{
    int n = 0;
    for (int i = 0; i < 4; i++)
        n += lrmoe_frame_get(f, pack_row_names[i]) != NULL;
    if (n == 4)
        return LRMOE_PACK_FORM_ROWS;
    if (n == 0)
        return LRMOE_PACK_FORM_LAYOUT;
    for (int i = 0; i < 4; i++)
        if (!lrmoe_frame_get(f, pack_row_names[i]))
            return lrmoe_err("packed frame has %d of the row tensors pack_grad, pack_hidden, "
                             "pack_gate, pack_up but not %s: a pack carries all four "
                             "(lrmoe-pack) or none (lrmoe-pack --layout-only)", n,
                             pack_row_names[i]);
    return -1;
}

int lrmoe_pack_rows_frame(lrmoe_frame_t *f, int threads)
{
    int form = lrmoe_pack_form(f);
    if (form < 0)
        return -1;
    if (form == LRMOE_PACK_FORM_ROWS)
        return 0;
    lrmoe_tensor_t *tid = lrmoe_frame_need(f, "topk_ids");
    lrmoe_tensor_t *tp = tid ? lrmoe_frame_need(f, "pack_pair") : NULL;
    lrmoe_tensor_t *tw = tp ? lrmoe_frame_need(f, "topk_weights") : NULL;
    lrmoe_tensor_t *tg = tw ? lrmoe_frame_need(f, "grad_output") : NULL;
    lrmoe_tensor_t *th = tg ? lrmoe_frame_need(f, "hidden") : NULL;
    lrmoe_tensor_t *tsg = th ? lrmoe_frame_need(f, "saved_gate") : NULL;
    lrmoe_tensor_t *tsu = tsg ? lrmoe_frame_need(f, "saved_up") : NULL;
    if (!tsu)
        return lrmoe_err_prefix("layout-only pack");
    if (lrmoe_tensor_check(tid, 2, (int64_t[]){-1, -1}) < 0)
        return -1;
    const int64_t T = tid->shape[0];
    int K;
    if (lrmoe_tensor_dim_int(tid, 1, &K) < 0 ||
        lrmoe_tensor_check(tp, 1, (int64_t[]){-1}) < 0 ||
        lrmoe_tensor_check(tw, 2, (int64_t[]){T, K}) < 0 ||
        lrmoe_tensor_check(tg, 2, (int64_t[]){T, -1}) < 0 ||
        lrmoe_tensor_check(th, 2, (int64_t[]){T, -1}) < 0 ||
        lrmoe_tensor_check(tsg, 3, (int64_t[]){T, K, -1}) < 0 ||
        lrmoe_tensor_check(tsu, 3, (int64_t[]){T, K, tsg->shape[2]}) < 0)
        return -1;
    if (!lrmoe_dtype_is_float(tg->dtype))
        return lrmoe_err("tensor grad_output: dtype %s, expected a float dtype",
                         lrmoe_dtype_name(tg->dtype));
    lrmoe_pack_plan_t pl = {0};
    pl.T = T;
    pl.K = K;
    pl.R = tp->shape[0];
    int rc = -1;
    float *alpha = NULL;
    if (!(pl.pair = lrmoe_tensor_i64(tp)))
        return -1;
    for (int64_t i = 0; i < pl.R; i++)
        if (pl.pair[i] < 0 || pl.pair[i] >= T * K) {
            lrmoe_err("pack_pair: row %lld names pair %lld, out of range [0,%lld)",
                      (long long)i, (long long)pl.pair[i], (long long)(T * K));
            goto out;
        }
    if (!(alpha = lrmoe_frame_bwd_alpha(f, tw, T, K)) || put_all_rows(f, &pl, alpha, threads) < 0)
        goto out;
    rc = lrmoe_frame_set_attr(f, "pack.form", "rows") < 0 ? -1 : 0;
out:
    free(pl.pair);
    free(alpha);
    return rc;
}

int lrmoe_pack_unpack_names(const char *rows_name, const char *out_name)
{
    if (!strcmp(out_name, rows_name) || !strcmp(out_name, "topk_ids") ||
        !strcmp(out_name, "pack_pair"))
        return lrmoe_err("output tensor %s would replace a tensor the unpack reads "
                         "(topk_ids, pack_pair, the rows %s)", out_name, rows_name);
    return 0;
}

int lrmoe_pack_unpack_frame(lrmoe_frame_t *f, const char *rows_name,
                            const char *out_name, int pairs)
{
    if (lrmoe_pack_unpack_names(rows_name, out_name) < 0)
        return -1;
    lrmoe_tensor_t *tid = lrmoe_frame_need(f, "topk_ids");
    lrmoe_tensor_t *tp = tid ? lrmoe_frame_need(f, "pack_pair") : NULL;
    if (tp && !strncmp(rows_name, "pack_", 5) && !lrmoe_frame_get(f, rows_name) &&
        lrmoe_pack_form(f) == LRMOE_PACK_FORM_LAYOUT)
        return lrmoe_err("missing tensor %s: the frame is a layout-only pack (lrmoe-pack "
                         "--layout-only), which carries no packed rows", rows_name);
    lrmoe_tensor_t *tr = tp ? lrmoe_frame_need(f, rows_name) : NULL;
    if (!tr || lrmoe_tensor_check(tid, 2, (int64_t[]){-1, -1}) < 0 ||
        lrmoe_tensor_check(tp, 1, (int64_t[]){-1}) < 0 ||
        lrmoe_tensor_check(tr, 2, (int64_t[]){tp->shape[0], -1}) < 0)
        return -1;
    if (!lrmoe_dtype_is_float(tr->dtype))
        return lrmoe_err("tensor %s: dtype %s, expected a float dtype", rows_name,
                         lrmoe_dtype_name(tr->dtype));
    int64_t T = tid->shape[0], R = tp->shape[0], D = tr->shape[1];
    int K;
    if (lrmoe_tensor_dim_int(tid, 1, &K) < 0)
        return -1;
    int64_t *pair = lrmoe_tensor_i64(tp);
    float *rows = pair ? lrmoe_tensor_f32(tr) : NULL;
    float *out = NULL;
    int rc = -1;
    if (!rows)
        goto done;
    size_t n = (size_t)(pairs ? T * K : T) * (size_t)D;
    if (!(out = malloc(n ? n * sizeof *out : 1))) {
        lrmoe_err("out of memory");
        goto done;
    }
    if ((pairs ? lrmoe_pack_unpack_pairs : lrmoe_pack_unpack)(pair, R, rows, D,
                                                              T, K, out) < 0)
        goto done;
    float *o = out;
    out = NULL; /* adopt owns it, even on failure */
    if (pairs ? !lrmoe_frame_adopt(f, out_name, LRMOE_F32, 3,
                                   (int64_t[]){T, K, D}, o)
              : !lrmoe_frame_adopt(f, out_name, LRMOE_F32, 2,
                                   (int64_t[]){T, D}, o))
        goto done;
    rc = 0;
done:
    free(pair);
    free(rows);
    free(out);
    return rc;
}
