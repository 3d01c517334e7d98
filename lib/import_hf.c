/* Hugging Face shapes and names -> the stream's (lib/import_hf.h). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include "import_hf.h"

int lrmoe_hf_map_parse(const char *s, lrmoe_hf_map_t *m)
{
    if (!strcmp(s, "auto")) *m = LRMOE_HF_AUTO;
    else if (!strcmp(s, "hf")) *m = LRMOE_HF_ON;
    else if (!strcmp(s, "none")) *m = LRMOE_HF_OFF;
    else return lrmoe_err("--map: '%s' is not auto, hf or none", s);
    return 0;
}

/* ------------------------------------------------------------ activations */

static int rename_tensor(lrmoe_frame_t *f, const char *from, const char *to)
{
    lrmoe_tensor_t *t = lrmoe_frame_get(f, from);
    if (!t) return 0;
    if (lrmoe_frame_get(f, to))
        return lrmoe_err("--map hf: both %s and %s in the frame", from, to);
    char *n = strdup(to);
    if (!n) return lrmoe_err("out of memory");
    free(t->name);
    t->name = n;
    return 0;
}

/* the tensors with one row per token, [T,X] in the stream */
static const char *const TOKEN_MAJOR[] = {"hidden", "grad_output", "router_logits",
                                          "topk_ids", "topk_weights"};
#define NTOKEN_MAJOR (int)(sizeof TOKEN_MAJOR / sizeof *TOKEN_MAJOR)

/* [B,S,X] -> [B*S,X] for the token-major tensors; they must agree on B,S
 * and the 2-D ones on T = B*S. */
static int flatten_batch(lrmoe_frame_t *f)
{
    int64_t B = -1, S = -1;
    const char *by = NULL;
    for (int i = 0; i < NTOKEN_MAJOR; i++) {
        lrmoe_tensor_t *t = lrmoe_frame_get(f, TOKEN_MAJOR[i]);
        if (!t || t->ndim != 3) continue;
        if (B >= 0 && (t->shape[0] != B || t->shape[1] != S))
            return lrmoe_err("%s [%" PRId64 ",%" PRId64 ",...] and %s [%" PRId64 ",%" PRId64
                             ",...] disagree on the batch shape", by, B, S, t->name,
                             t->shape[0], t->shape[1]);
        B = t->shape[0];
        S = t->shape[1];
        by = TOKEN_MAJOR[i];
        if (B && S > INT64_MAX / B) return lrmoe_err("%s: batch shape overflows", t->name);
        t->shape[0] = B * S;
        t->shape[1] = t->shape[2];
        t->ndim = 2;
    }
    if (B < 0) return 0;
    for (int i = 0; i < NTOKEN_MAJOR; i++) {
        lrmoe_tensor_t *t = lrmoe_frame_get(f, TOKEN_MAJOR[i]);
        if (t && t->ndim == 2 && t->shape[0] != B * S)
            return lrmoe_err("%s has %" PRId64 " rows, but %s [%" PRId64 ",%" PRId64
                             ",...] holds %" PRId64 " tokens", t->name, t->shape[0], by, B, S,
                             B * S);
    }
    return lrmoe_frame_set_attrf(f, "batch_shape", "[%" PRId64 ",%" PRId64 "]", B, S);
}

/* the number of experts the frame tells, or -1 */
static int64_t frame_experts(const lrmoe_frame_t *f)
{
    const lrmoe_tensor_t *t = lrmoe_frame_get(f, "router_logits");
    if (t && t->ndim == 2) return t->shape[1];
    t = lrmoe_frame_get(f, "expert_load");
    if (t && t->ndim == 1) return t->shape[0];
    return -1;
}

/* integer topk_ids -> I32, every id in [0,E) (E < 0: in [0,INT32_MAX]) */
static int ids_to_i32(lrmoe_frame_t *f)
{
    lrmoe_tensor_t *t = lrmoe_frame_get(f, "topk_ids");
    if (!t) return 0;
    if (lrmoe_dtype_is_float(t->dtype) || t->dtype == LRMOE_BOOL)
        return lrmoe_err("topk_ids is %s: expert ids must be integers", lrmoe_dtype_name(t->dtype));
    int64_t E = frame_experts(f);
    int64_t *v = lrmoe_tensor_i64(t);
    if (!v) return -1;
    size_t n = (size_t)lrmoe_tensor_numel(t);
    int64_t K = t->ndim >= 2 ? t->shape[t->ndim - 1] : 1;
    for (size_t i = 0; i < n; i++) {
        int64_t hi = E >= 0 ? E : (int64_t)INT32_MAX + 1;
        if (v[i] >= 0 && v[i] < hi) continue;
        int64_t x = v[i];
        free(v);
        if (E >= 0 && x >= 0 && x <= INT32_MAX)
            return lrmoe_err("topk_ids: id %" PRId64 " (token %zu, choice %zu) is out of [0,%" PRId64
                             "): the frame has %" PRId64 " experts", x, i / (size_t)K,
                             i % (size_t)K, E, E);
        return lrmoe_err("topk_ids: id %" PRId64 " (token %zu, choice %zu) %s", x, i / (size_t)K,
                         i % (size_t)K, x < 0 ? "is negative" : "does not fit I32");
    }
    if (t->dtype == LRMOE_I32) {
        free(v);
        return 0;
    }
    int ndim = t->ndim;
    int64_t shape[LRMOE_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    lrmoe_tensor_t *o = lrmoe_frame_put(f, "topk_ids", LRMOE_I32, ndim, shape);
    if (!o) {
        free(v);
        return -1;
    }
    int32_t *d = o->data;
    for (size_t i = 0; i < n; i++) d[i] = (int32_t)v[i];
    free(v);
    return 0;
}

/* floating tensor NAME -> F32 */
static int to_f32(lrmoe_frame_t *f, const char *name)
{
    lrmoe_tensor_t *t = lrmoe_frame_get(f, name);
    if (!t || t->dtype == LRMOE_F32) return 0;
    if (!lrmoe_dtype_is_float(t->dtype))
        return lrmoe_err("%s is %s: it holds weights, a floating dtype", name,
                         lrmoe_dtype_name(t->dtype));
    float *v = lrmoe_tensor_f32(t);
    if (!v) return -1;
    int64_t shape[LRMOE_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    int rc = lrmoe_frame_put_f32(f, name, LRMOE_F32, t->ndim, shape, v) ? 0 : -1;
    free(v);
    return rc;
}

int lrmoe_hf_activations(lrmoe_frame_t *f, lrmoe_hf_map_t m)
{
    if (m == LRMOE_HF_OFF) return 0;
    if (m == LRMOE_HF_ON &&
        (rename_tensor(f, "hidden_states", "hidden") < 0 ||
         rename_tensor(f, "top_k_index", "topk_ids") < 0 ||
         rename_tensor(f, "selected_experts", "topk_ids") < 0 ||
         rename_tensor(f, "top_k_weights", "topk_weights") < 0 ||
         rename_tensor(f, "routing_weights", "topk_weights") < 0))
        return -1;
    if (flatten_batch(f) < 0 || ids_to_i32(f) < 0 || to_f32(f, "topk_weights") < 0) return -1;
    return 0;
}

/* ------------------------------------------------------------ expert weights */

enum { PART_GATE, PART_UP, PART_DOWN, PART_GATE_UP, NPARTS };
enum { LAYOUT_FUSED = 1, LAYOUT_PER_EXPERT, LAYOUT_MIXTRAL };
static const char *const LAYOUT_NAME[] = {"", "fused", "per-expert", "mixtral"};

typedef struct {
    char *prefix;                /* "model.layers.3.mlp." (with the dot) or "" */
    int layout;
    int64_t layer;               /* from "layers.N.", else -1 */
    const lrmoe_tensor_t *fused[NPARTS];    /* PART_GATE_UP, PART_DOWN */
    const lrmoe_tensor_t *(*exp)[NPARTS];  /* per expert: PART_GATE, _UP, _DOWN */
    int64_t nexp;
    const lrmoe_tensor_t *router, *bias;
    int used;                    /* tensors of the frame this group takes */
    int pos;                     /* order of first appearance */
} group_t;

typedef struct {
    group_t *g;
    int n;
} groups_t;

static void groups_free(groups_t *gs)
{
    for (int i = 0; i < gs->n; i++) {
        free(gs->g[i].prefix);
        free(gs->g[i].exp);
    }
    free(gs->g);
    gs->g = NULL;
    gs->n = 0;
}

static group_t *group_get(groups_t *gs, const char *prefix, size_t plen)
{
    for (int i = 0; i < gs->n; i++)
        if (strlen(gs->g[i].prefix) == plen && !strncmp(gs->g[i].prefix, prefix, plen))
            return &gs->g[i];
    group_t *g = realloc(gs->g, (size_t)(gs->n + 1) * sizeof *g);
    if (!g) {
        lrmoe_err("out of memory");
        return NULL;
    }
    gs->g = g;
    g = &gs->g[gs->n];
    memset(g, 0, sizeof *g);
    if (!(g->prefix = strndup(prefix, plen))) {
        lrmoe_err("out of memory");
        return NULL;
    }
    g->pos = gs->n++;
    g->layer = -1;
    for (const char *p = g->prefix; (p = strstr(p, "layers.")); p++) {
        if (p != g->prefix && p[-1] != '.') continue;
        char *end;
        long long v = strtoll(p + 7, &end, 10);
        if (end != p + 7 && *end == '.' && v >= 0) g->layer = v;
    }
    return g;
}

static int set_layout(group_t *g, int layout, const char *name)
{
    if (g->layout && g->layout != layout)
        return lrmoe_err("%s: %s and %s expert weights mixed under %sexperts", name,
                         LAYOUT_NAME[g->layout], LAYOUT_NAME[layout], g->prefix);
    g->layout = layout;
    return 0;
}

/* Where "experts." starts in name as a whole dotted component, or NULL. */
static const char *find_experts(const char *name)
{
    const char *hit = NULL;
    for (const char *p = name; (p = strstr(p, "experts.")); p++)
        if (p == name || p[-1] == '.') hit = p;
    return hit;
}

/* One tensor name: into its group, or not an expert weight (0). */
static int classify(groups_t *gs, const lrmoe_tensor_t *t, lrmoe_hf_map_t m)
{
    const char *name = t->name, *e = find_experts(name), *rest;
    size_t plen;
    if (e) {
        plen = (size_t)(e - name);
        rest = e + 8;
    } else if (!strcmp(name, "gate_up_proj") || !strcmp(name, "down_proj")) {
        plen = 0;             /* an experts module's own state_dict */
        rest = name;
    } else {
        return 0;
    }
    static const char *const FUSED[] = {[PART_GATE_UP] = "gate_up_proj", [PART_DOWN] = "down_proj"};
    for (int p = PART_DOWN; p <= PART_GATE_UP; p++)
        if (!strcmp(rest, FUSED[p])) {
            group_t *g = group_get(gs, name, plen);
            if (!g || set_layout(g, LAYOUT_FUSED, name) < 0) return -1;
            g->fused[p] = t;
            g->used++;
            return 1;
        }
    if (!e) return 0;
    if (!strcmp(rest, "gate_up_proj_bias") || !strcmp(rest, "down_proj_bias"))
        return lrmoe_err("%s: experts with biases (gpt-oss: interleaved gate/up, clamped "
                         "SwiGLU) have no lrmoe SwiGLU layout", name);
    char *end;
    long long idx = strtoll(rest, &end, 10);
    if (end == rest || *end != '.' || idx < 0 || rest[0] == '-' || rest[0] == '+')
        return m == LRMOE_HF_ON
            ? lrmoe_err("%s: not an expert weight name transformers uses", name)
            : 0;
    static const struct { const char *s; int part, layout; } PARTS[] = {
        {"gate_proj.weight", PART_GATE, LAYOUT_PER_EXPERT},
        {"up_proj.weight", PART_UP, LAYOUT_PER_EXPERT},
        {"down_proj.weight", PART_DOWN, LAYOUT_PER_EXPERT},
        {"w1.weight", PART_GATE, LAYOUT_MIXTRAL},
        {"w3.weight", PART_UP, LAYOUT_MIXTRAL},
        {"w2.weight", PART_DOWN, LAYOUT_MIXTRAL},
    };
    for (size_t k = 0; k < sizeof PARTS / sizeof *PARTS; k++) {
        if (strcmp(end + 1, PARTS[k].s)) continue;
        if (idx >= (1 << 20)) return lrmoe_err("%s: expert index %lld is absurd", name, idx);
        group_t *g = group_get(gs, name, plen);
        if (!g || set_layout(g, PARTS[k].layout, name) < 0) return -1;
        if (idx >= g->nexp) {
            void *x = realloc(g->exp, (size_t)(idx + 1) * sizeof *g->exp);
            if (!x) return lrmoe_err("out of memory");
            g->exp = x;
            memset(g->exp + g->nexp, 0, (size_t)(idx + 1 - g->nexp) * sizeof *g->exp);
            g->nexp = idx + 1;
        }
        if (g->exp[idx][PARTS[k].part]) return lrmoe_err("%s: given twice", name);
        g->exp[idx][PARTS[k].part] = t;
        g->used++;
        return 1;
    }
    size_t n = strlen(end + 1);
    if (n > 5 && !strcmp(end + 1 + n - 5, ".bias"))
        return lrmoe_err("%s: experts with biases have no lrmoe SwiGLU layout", name);
    return m == LRMOE_HF_ON ? lrmoe_err("%s: not an expert weight name transformers uses", name) : 0;
}

/* Group the frame's expert weights; routers attached. gs->n = 0: none. */
static int find_groups(const lrmoe_frame_t *f, lrmoe_hf_map_t m, groups_t *gs)
{
    memset(gs, 0, sizeof *gs);
    for (int i = 0; i < f->ntensors; i++)
        if (classify(gs, f->tensors[i], m) < 0) {
            groups_free(gs);
            return -1;
        }
    for (int i = 0; i < gs->n; i++) {
        group_t *g = &gs->g[i];
        char name[1024];
        snprintf(name, sizeof name, "%sgate.weight", g->prefix);
        if ((g->router = lrmoe_frame_get(f, name))) g->used++;
        snprintf(name, sizeof name, "%sgate.e_score_correction_bias", g->prefix);
        if ((g->bias = lrmoe_frame_get(f, name))) g->used++;
    }
    /* one block whose router was renamed already (--name ...=router_weight) */
    if (gs->n == 1 && !gs->g[0].router && (gs->g[0].router = lrmoe_frame_get(f, "router_weight")))
        gs->g[0].used++;
    if (gs->n == 1 && !gs->g[0].bias && (gs->g[0].bias = lrmoe_frame_get(f, "expert_bias")))
        gs->g[0].used++;
    return 0;
}

static int check_dims(const lrmoe_tensor_t *t, int ndim, const int64_t *dims, const char *what)
{
    if (lrmoe_tensor_check(t, ndim, dims) < 0) return lrmoe_err_prefix("%s", what);
    return 0;
}

/* w_gate, w_up [E,F,D] and w_down [E,D,F] of one group into o */
static int build_experts(const group_t *g, lrmoe_frame_t *o, int64_t *Eo, int64_t *Do)
{
    const char *pre = g->prefix;
    int64_t E, F, D;
    lrmoe_dtype_t dt;
    if (g->layout == LAYOUT_FUSED) {
        const lrmoe_tensor_t *gu = g->fused[PART_GATE_UP], *dn = g->fused[PART_DOWN];
        if (!gu || !dn)
            return lrmoe_err("%sexperts: %s without %s", pre, gu ? "gate_up_proj" : "down_proj",
                             gu ? "down_proj" : "gate_up_proj");
        if (dn->ndim != 3) return check_dims(dn, 3, (int64_t[]){-1, -1, -1}, "fused experts");
        E = dn->shape[0], D = dn->shape[1], F = dn->shape[2];
        if (check_dims(gu, 3, (int64_t[]){E, 2 * F, D}, "down_proj [E,D,F] needs gate_up_proj [E,2F,D]") < 0)
            return -1;
        if (gu->dtype != dn->dtype)
            return lrmoe_err("%sexperts: gate_up_proj is %s, down_proj %s", pre,
                             lrmoe_dtype_name(gu->dtype), lrmoe_dtype_name(dn->dtype));
        dt = dn->dtype;
        size_t es = lrmoe_dtype_size(dt), blk = (size_t)(F * D) * es;
        int64_t s[3] = {E, F, D};
        lrmoe_tensor_t *wg = lrmoe_frame_put(o, "w_gate", dt, 3, s);
        lrmoe_tensor_t *wu = wg ? lrmoe_frame_put(o, "w_up", dt, 3, s) : NULL;
        lrmoe_tensor_t *wd = wu ? lrmoe_frame_put(o, "w_down", dt, 3, dn->shape) : NULL;
        if (!wd) return -1;
        for (int64_t e = 0; e < E; e++) { /* gate rows first, then up (chunk(2)) */
            const char *src = (const char *)gu->data + (size_t)e * 2 * blk;
            memcpy((char *)wg->data + (size_t)e * blk, src, blk);
            memcpy((char *)wu->data + (size_t)e * blk, src + blk, blk);
        }
        if (dn->nbytes) memcpy(wd->data, dn->data, dn->nbytes);
    } else {
        static const char *const PART_NAME[2][3] = {{"gate_proj", "up_proj", "down_proj"},
                                                    {"w1", "w3", "w2"}};
        const char *const *pn = PART_NAME[g->layout == LAYOUT_MIXTRAL];
        E = g->nexp;
        for (int64_t e = 0; e < E; e++)
            for (int p = PART_GATE; p <= PART_DOWN; p++)
                if (!g->exp[e][p])
                    return lrmoe_err("%sexperts.%" PRId64 ".%s.weight missing (experts 0-%" PRId64
                                     " are named)", pre, e, pn[p], E - 1);
        const lrmoe_tensor_t *d0 = g->exp[0][PART_DOWN];
        if (d0->ndim != 2) return check_dims(d0, 2, (int64_t[]){-1, -1}, "expert down weight");
        D = d0->shape[0], F = d0->shape[1];
        dt = d0->dtype;
        int64_t s[3] = {E, F, D}, sd[3] = {E, D, F};
        lrmoe_tensor_t *w[3];
        if (!(w[0] = lrmoe_frame_put(o, "w_gate", dt, 3, s)) ||
            !(w[1] = lrmoe_frame_put(o, "w_up", dt, 3, s)) ||
            !(w[2] = lrmoe_frame_put(o, "w_down", dt, 3, sd)))
            return -1;
        size_t blk = (size_t)(F * D) * lrmoe_dtype_size(dt);
        for (int64_t e = 0; e < E; e++)
            for (int p = PART_GATE; p <= PART_DOWN; p++) {
                const lrmoe_tensor_t *t = g->exp[e][p];
                int64_t want[2] = {p == PART_DOWN ? D : F, p == PART_DOWN ? F : D};
                if (check_dims(t, 2, want, p == PART_DOWN ? "down is [D,F]" : "gate and up are [F,D]") < 0)
                    return -1;
                if (t->dtype != dt)
                    return lrmoe_err("%s is %s, %s %s", t->name, lrmoe_dtype_name(t->dtype),
                                     d0->name, lrmoe_dtype_name(dt));
                memcpy((char *)w[p]->data + (size_t)e * blk, t->data, blk);
            }
    }
    *Eo = E;
    *Do = D;
    return 0;
}

/* One group -> one weights frame (attributes of f copied). */
static int build_frame(const group_t *g, const lrmoe_frame_t *f, lrmoe_frame_t *o)
{
    for (int i = 0; i < f->nattrs; i++)
        if (lrmoe_frame_set_attr(o, f->keys[i], f->vals[i]) < 0) return -1;
    int64_t E = 0, D = 0;
    if (build_experts(g, o, &E, &D) < 0) return -1;
    if (g->router) {
        if (check_dims(g->router, 2, (int64_t[]){E, D}, "router gate.weight is [E,D]") < 0) return -1;
        lrmoe_tensor_t *r = lrmoe_frame_put(o, "router_weight", g->router->dtype, 2, g->router->shape);
        if (!r) return -1;
        if (r->nbytes) memcpy(r->data, g->router->data, r->nbytes);
    }
    if (g->bias) {
        if (check_dims(g->bias, 1, (int64_t[]){E}, "e_score_correction_bias is [E]") < 0) return -1;
        if (!lrmoe_dtype_is_float(g->bias->dtype))
            return lrmoe_err("%s is %s, not floating", g->bias->name, lrmoe_dtype_name(g->bias->dtype));
        float *v = lrmoe_tensor_f32(g->bias);
        if (!v) return -1;
        lrmoe_tensor_t *b = lrmoe_frame_put_f32(o, "expert_bias", LRMOE_F32, 1, &E, v);
        free(v);
        if (!b) return -1;
    }
    if (g->layer >= 0 && lrmoe_frame_set_attrf(o, "layer", "%" PRId64, g->layer) < 0) return -1;
    if (*g->prefix && lrmoe_frame_set_attrf(o, "hf.prefix", "%.*s", (int)strlen(g->prefix) - 1,
                                            g->prefix) < 0)
        return -1;
    return lrmoe_frame_set_attr(o, "hf.layout", LAYOUT_NAME[g->layout]);
}

int lrmoe_hf_has_weights(const lrmoe_frame_t *f)
{
    groups_t gs;
    if (find_groups(f, LRMOE_HF_AUTO, &gs) < 0) return -1;
    int n = gs.n;
    groups_free(&gs);
    return n > 0;
}

/* groups with a layer number by layer, the others after them in file order */
static int cmp_group(const void *a, const void *b)
{
    const group_t *x = a, *y = b;
    if ((x->layer < 0) != (y->layer < 0)) return x->layer < 0 ? 1 : -1;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return x->pos - y->pos;
}

int lrmoe_hf_import(lrmoe_frame_t *f, lrmoe_hf_map_t m, lrmoe_frame_fn fn, void *ctx,
                    int64_t *index)
{
    if (m == LRMOE_HF_OFF) return fn(f, (*index)++, ctx);
    groups_t gs;
    if (find_groups(f, m, &gs) < 0) return -1;
    if (gs.n == 0) {
        if (lrmoe_hf_activations(f, m) < 0) return -1;
        return fn(f, (*index)++, ctx);
    }
    int rc = 0, used = 0;
    static const char *const OURS[] = {"w_gate", "w_up", "w_down"};
    for (int i = 0; i < 3; i++)
        if (lrmoe_frame_get(f, OURS[i]))
            rc = lrmoe_err("the frame holds %s and HF expert weights (%sexperts): import one kind "
                           "(--map none keeps the names)", OURS[i], gs.g[0].prefix);
    group_t *sorted = rc ? NULL : malloc((size_t)gs.n * sizeof *sorted);
    if (!rc && !sorted) rc = lrmoe_err("out of memory");
    if (sorted) {
        memcpy(sorted, gs.g, (size_t)gs.n * sizeof *sorted);
        qsort(sorted, (size_t)gs.n, sizeof *sorted, cmp_group);
    }
    for (int i = 0; !rc && i < gs.n; i++) used += sorted[i].used;
    for (int i = 0; !rc && i < gs.n; i++) {
        const group_t *g = &sorted[i];
        if (i && g->layer >= 0 && g->layer == sorted[i - 1].layer)
            rc = lrmoe_err("%sexperts and %sexperts: two MoE blocks in layer %" PRId64, sorted[i - 1].prefix,
                           g->prefix, g->layer);
        lrmoe_frame_t o;
        lrmoe_frame_init(&o);
        if (!rc) rc = build_frame(g, f, &o); /* its errors name the tensors */
        if (!rc && i == 0) rc = lrmoe_frame_set_attrf(&o, "hf.left_out", "%d", f->ntensors - used);
        if (!rc) rc = fn(&o, (*index)++, ctx);
        lrmoe_frame_clear(&o);
    }
    free(sorted);
    groups_free(&gs);
    return rc;
}
