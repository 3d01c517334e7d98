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
        if (t->dtype == LRMOE_U64 && x < 0) /* above INT64_MAX, not negative */
            return lrmoe_err("topk_ids: id %" PRIu64 " (token %zu, choice %zu) does not fit I32",
                             (uint64_t)x, i / (size_t)K, i % (size_t)K);
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

/* One per-expert matrix: expert idx, PART_GATE, _UP or _DOWN. */
typedef struct {
    int64_t idx;
    int part;
    const lrmoe_tensor_t *t;
} pexp_t;

/* Time and memory stay linear in the frame's names (lrmoe-import(1)): the
 * groups are found by a hash of their prefix, the router by a hash of the
 * tensor names, and per-expert matrices are kept as a list of what the
 * names hold, never as an array over the expert indices they claim. */
typedef struct {
    char *prefix;                /* "model.layers.3.mlp." (with the dot) or "" */
    size_t plen;
    int layout;
    int64_t layer;               /* from "layers.N.", else -1 */
    const lrmoe_tensor_t *fused[NPARTS];    /* PART_GATE_UP, PART_DOWN */
    pexp_t *ent;                 /* per-expert matrices, sorted by (idx, part) */
    size_t nent, cent;
    int64_t nexp;                /* largest expert index named + 1 */
    const lrmoe_tensor_t *router, *bias;
    int used;                    /* tensors of the frame this group takes */
    int pos;                     /* order of first appearance */
} group_t;

typedef struct {
    group_t *g;
    int n, cap;
    int *tab;                    /* open addressing: group index + 1, 0 empty */
    size_t tcap;                 /* a power of two, > 2n */
} groups_t;

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;         /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static void groups_free(groups_t *gs)
{
    for (int i = 0; i < gs->n; i++) {
        free(gs->g[i].prefix);
        free(gs->g[i].ent);
    }
    free(gs->g);
    free(gs->tab);
    memset(gs, 0, sizeof *gs);
}

static int groups_rehash(groups_t *gs, size_t tcap)
{
    int *tab = calloc(tcap, sizeof *tab);
    if (!tab) return lrmoe_err("out of memory");
    for (int i = 0; i < gs->n; i++) {
        size_t h = (size_t)hash_bytes(gs->g[i].prefix, gs->g[i].plen) & (tcap - 1);
        while (tab[h]) h = (h + 1) & (tcap - 1);
        tab[h] = i + 1;
    }
    free(gs->tab);
    gs->tab = tab;
    gs->tcap = tcap;
    return 0;
}

/* The layer number of "layers.N." in prefix (the last one), -1 if none. */
static int prefix_layer(const char *prefix, int64_t *layer)
{
    *layer = -1;
    for (const char *p = prefix; (p = strstr(p, "layers.")); p++) {
        if (p != prefix && p[-1] != '.') continue;
        const char *d = p + 7, *q = d;
        int64_t v = 0;
        int big = 0;
        for (; *q >= '0' && *q <= '9'; q++) {
            if (v > (INT64_MAX - (*q - '0')) / 10) big = 1;
            else v = v * 10 + (*q - '0');
        }
        if (q == d || *q != '.') continue;
        if (big)
            return lrmoe_err("%.*s: layer index %.*s does not fit a 64-bit integer",
                             (int)(q - prefix), prefix, (int)(q - d), d);
        *layer = v;
    }
    return 0;
}

static group_t *group_get(groups_t *gs, const char *prefix, size_t plen)
{
    size_t h = gs->tcap ? (size_t)hash_bytes(prefix, plen) & (gs->tcap - 1) : 0;
    for (; gs->tcap && gs->tab[h]; h = (h + 1) & (gs->tcap - 1)) {
        group_t *g = &gs->g[gs->tab[h] - 1];
        if (g->plen == plen && !memcmp(g->prefix, prefix, plen)) return g;
    }
    if (gs->n == gs->cap) {
        int cap = gs->cap ? 2 * gs->cap : 8;
        group_t *g = realloc(gs->g, (size_t)cap * sizeof *g);
        if (!g) {
            lrmoe_err("out of memory");
            return NULL;
        }
        gs->g = g;
        gs->cap = cap;
    }
    group_t *g = &gs->g[gs->n];
    memset(g, 0, sizeof *g);
    if (!(g->prefix = strndup(prefix, plen))) {
        lrmoe_err("out of memory");
        return NULL;
    }
    g->plen = plen;
    if (prefix_layer(g->prefix, &g->layer) < 0) {
        free(g->prefix);
        return NULL;
    }
    g->pos = gs->n++;
    if ((size_t)gs->n * 2 >= gs->tcap) {
        if (groups_rehash(gs, gs->tcap ? 2 * gs->tcap : 16) < 0) {
            free(g->prefix);
            gs->n--;
            return NULL;
        }
    } else {
        while (gs->tab[h]) h = (h + 1) & (gs->tcap - 1);
        gs->tab[h] = gs->n;
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

/* The decimal expert index at s, ended by '.': its length, or 0 if s does
 * not start with one. *idx saturates at INT64_MAX. */
static size_t expert_index(const char *s, int64_t *idx)
{
    size_t n = 0;
    int64_t v = 0;
    for (; s[n] >= '0' && s[n] <= '9'; n++)
        v = v > (INT64_MAX - (s[n] - '0')) / 10 ? INT64_MAX : v * 10 + (s[n] - '0');
    *idx = v;
    return n && s[n] == '.' ? n : 0;
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
            if (g->fused[p])   /* "gate_up_proj" and "experts.gate_up_proj": both prefix "" */
                return lrmoe_err("%s and %s: the same expert weights twice", g->fused[p]->name, name);
            g->fused[p] = t;
            g->used++;
            return 1;
        }
    if (!e) return 0;
    if (!strcmp(rest, "gate_up_proj_bias") || !strcmp(rest, "down_proj_bias"))
        return lrmoe_err("%s: experts with biases (gpt-oss: interleaved gate/up, clamped "
                         "SwiGLU) have no lrmoe SwiGLU layout", name);
    int64_t idx;
    size_t nd = expert_index(rest, &idx);
    if (!nd)
        return m == LRMOE_HF_ON
            ? lrmoe_err("%s: not an expert weight name transformers uses", name)
            : 0;
    const char *end = rest + nd;
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
        if (idx >= (1 << 20))
            return lrmoe_err("%s: expert index %.*s is absurd", name, (int)nd, rest);
        group_t *g = group_get(gs, name, plen);
        if (!g || set_layout(g, PARTS[k].layout, name) < 0) return -1;
        if (g->nent == g->cent) {
            size_t c = g->cent ? 2 * g->cent : 8;
            pexp_t *x = realloc(g->ent, c * sizeof *x);
            if (!x) return lrmoe_err("out of memory");
            g->ent = x;
            g->cent = c;
        }
        g->ent[g->nent++] = (pexp_t){idx, PARTS[k].part, t};
        if (idx >= g->nexp) g->nexp = idx + 1;
        g->used++;
        return 1;
    }
    size_t n = strlen(end + 1);
    if (n > 5 && !strcmp(end + 1 + n - 5, ".bias"))
        return lrmoe_err("%s: experts with biases have no lrmoe SwiGLU layout", name);
    return m == LRMOE_HF_ON ? lrmoe_err("%s: not an expert weight name transformers uses", name) : 0;
}

static int cmp_pexp(const void *a, const void *b)
{
    const pexp_t *x = a, *y = b;
    if (x->idx != y->idx) return x->idx < y->idx ? -1 : 1;
    return (x->part > y->part) - (x->part < y->part);
}

/* The frame's tensors by name: a hash table of tensor index + 1. */
typedef struct {
    int *tab;
    size_t cap;
} names_t;

static int names_build(const lrmoe_frame_t *f, names_t *nm)
{
    nm->cap = 16;
    while (nm->cap <= 2 * (size_t)f->ntensors) nm->cap *= 2;
    if (!(nm->tab = calloc(nm->cap, sizeof *nm->tab))) return lrmoe_err("out of memory");
    for (int i = 0; i < f->ntensors; i++) {
        const char *s = f->tensors[i]->name;
        size_t h = (size_t)hash_bytes(s, strlen(s)) & (nm->cap - 1);
        while (nm->tab[h]) h = (h + 1) & (nm->cap - 1);
        nm->tab[h] = i + 1;
    }
    return 0;
}

/* The tensor named prefix + suffix, or NULL. */
static const lrmoe_tensor_t *names_get(const lrmoe_frame_t *f, const names_t *nm, const char *prefix,
                                       size_t plen, const char *suffix)
{
    size_t sl = strlen(suffix);
    char *s = malloc(plen + sl + 1);
    if (!s) return NULL;    /* a lookup that cannot be made finds nothing; caught below */
    memcpy(s, prefix, plen);
    memcpy(s + plen, suffix, sl + 1);
    const lrmoe_tensor_t *t = NULL;
    for (size_t h = (size_t)hash_bytes(s, plen + sl) & (nm->cap - 1); nm->tab[h];
         h = (h + 1) & (nm->cap - 1))
        if (!strcmp(f->tensors[nm->tab[h] - 1]->name, s)) {
            t = f->tensors[nm->tab[h] - 1];
            break;
        }
    free(s);
    return t;
}

/* Group the frame's expert weights; routers attached. gs->n = 0: none. */
static int find_groups(const lrmoe_frame_t *f, lrmoe_hf_map_t m, groups_t *gs)
{
    memset(gs, 0, sizeof *gs);
    for (int i = 0; i < f->ntensors; i++)
        if (classify(gs, f->tensors[i], m) < 0) goto fail;
    if (gs->n == 0) return 0;
    names_t nm;
    if (names_build(f, &nm) < 0) goto fail;
    for (int i = 0; i < gs->n; i++) {
        group_t *g = &gs->g[i];
        if (g->nent > 1) qsort(g->ent, g->nent, sizeof *g->ent, cmp_pexp);
        for (size_t k = 1; k < g->nent; k++)
            if (!cmp_pexp(&g->ent[k - 1], &g->ent[k])) {
                free(nm.tab);
                lrmoe_err("%s: given twice", g->ent[k].t->name);
                goto fail;
            }
        if ((g->router = names_get(f, &nm, g->prefix, g->plen, "gate.weight"))) g->used++;
        if ((g->bias = names_get(f, &nm, g->prefix, g->plen, "gate.e_score_correction_bias")))
            g->used++;
    }
    free(nm.tab);
    /* one block whose router was renamed already (--name ...=router_weight) */
    if (gs->n == 1 && !gs->g[0].router && (gs->g[0].router = lrmoe_frame_get(f, "router_weight")))
        gs->g[0].used++;
    if (gs->n == 1 && !gs->g[0].bias && (gs->g[0].bias = lrmoe_frame_get(f, "expert_bias")))
        gs->g[0].used++;
    return 0;
fail:
    groups_free(gs);
    return -1;
}

static int check_dims(const lrmoe_tensor_t *t, int ndim, const int64_t *dims, const char *what)
{
    if (lrmoe_tensor_check(t, ndim, dims) < 0) return lrmoe_err_prefix("%s", what);
    return 0;
}

/* The stream's dtype for expert weights of dtype dt: BF16 and F32 as they
 * are, F16 and F64 as F32 (lrmoe-exec computes from BF16 or F32); anything
 * else is an error naming t. */
static int weight_dtype(const lrmoe_tensor_t *t, lrmoe_dtype_t *out)
{
    if (t->dtype == LRMOE_BF16 || t->dtype == LRMOE_F32) *out = t->dtype;
    else if (t->dtype == LRMOE_F16 || t->dtype == LRMOE_F64) *out = LRMOE_F32;
    else return lrmoe_err("%s is %s: expert weights must be BF16, F16, F32 or F64", t->name,
                          lrmoe_dtype_name(t->dtype));
    return 0;
}

/* n elements of dtype sdt at src into dst of dtype ddt (the same, or F32) */
static void copy_elems(void *dst, lrmoe_dtype_t ddt, const void *src, lrmoe_dtype_t sdt, size_t n)
{
    if (!n) return;
    if (ddt == sdt) memcpy(dst, src, n * lrmoe_dtype_size(sdt));
    else lrmoe_convert_to_f32(sdt, src, dst, n);
}

/* w_gate, w_up [E,F,D] and w_down [E,D,F] of one group into o */
static int build_experts(const group_t *g, lrmoe_frame_t *o, int64_t *Eo, int64_t *Do)
{
    const char *pre = g->prefix;
    int64_t E, F, D;
    lrmoe_dtype_t sdt, dt = LRMOE_F32;
    if (g->layout == LAYOUT_FUSED) {
        const lrmoe_tensor_t *gu = g->fused[PART_GATE_UP], *dn = g->fused[PART_DOWN];
        if (!gu || !dn)
            return lrmoe_err("%sexperts: %s without %s", pre, gu ? "gate_up_proj" : "down_proj",
                             gu ? "down_proj" : "gate_up_proj");
        if (dn->ndim != 3) return check_dims(dn, 3, (int64_t[]){-1, -1, -1}, "fused experts");
        E = dn->shape[0], D = dn->shape[1], F = dn->shape[2];
        if (F > INT64_MAX / 2)  /* 2F would wrap to the "any size" of check_dims */
            return lrmoe_err("%s: F = %" PRId64 " is too large (gate_up_proj holds 2F rows)", dn->name, F);
        if (check_dims(gu, 3, (int64_t[]){E, 2 * F, D}, "down_proj [E,D,F] needs gate_up_proj [E,2F,D]") < 0)
            return -1;
        if (gu->dtype != dn->dtype)
            return lrmoe_err("%sexperts: gate_up_proj is %s, down_proj %s", pre,
                             lrmoe_dtype_name(gu->dtype), lrmoe_dtype_name(dn->dtype));
        sdt = dn->dtype;
        if (weight_dtype(dn, &dt) < 0) return -1;
        int64_t s[3] = {E, F, D};
        lrmoe_tensor_t *wg = lrmoe_frame_put(o, "w_gate", dt, 3, s);
        lrmoe_tensor_t *wu = wg ? lrmoe_frame_put(o, "w_up", dt, 3, s) : NULL;
        lrmoe_tensor_t *wd = wu ? lrmoe_frame_put(o, "w_down", dt, 3, dn->shape) : NULL;
        if (!wd) return -1;
        if (E > 0 && F > 0 && D > 0) {   /* else every tensor is empty */
            size_t n = (size_t)(F * D), ss = lrmoe_dtype_size(sdt), ds = lrmoe_dtype_size(dt);
            for (int64_t e = 0; e < E; e++) { /* gate rows first, then up (chunk(2)) */
                const char *src = (const char *)gu->data + (size_t)e * 2 * n * ss;
                copy_elems((char *)wg->data + (size_t)e * n * ds, dt, src, sdt, n);
                copy_elems((char *)wu->data + (size_t)e * n * ds, dt, src + n * ss, sdt, n);
            }
            copy_elems(wd->data, dt, dn->data, sdt, (size_t)lrmoe_tensor_numel(dn));
        }
    } else {
        static const char *const PART_NAME[2][3] = {{"gate_proj", "up_proj", "down_proj"},
                                                    {"w1", "w3", "w2"}};
        const char *const *pn = PART_NAME[g->layout == LAYOUT_MIXTRAL];
        E = g->nexp;
        /* sorted by (idx, part) without repeats: complete iff entry k is
         * expert k/3's part k%3; the first that is not names the gap */
        for (size_t k = 0; k < (size_t)E * 3; k++)
            if (k >= g->nent || g->ent[k].idx != (int64_t)(k / 3) || g->ent[k].part != (int)(k % 3))
                return lrmoe_err("%sexperts.%" PRId64 ".%s.weight missing (experts 0-%" PRId64
                                 " are named)", pre, (int64_t)(k / 3), pn[k % 3], E - 1);
        const lrmoe_tensor_t *d0 = g->ent[PART_DOWN].t;
        if (d0->ndim != 2) return check_dims(d0, 2, (int64_t[]){-1, -1}, "expert down weight");
        D = d0->shape[0], F = d0->shape[1];
        sdt = d0->dtype;
        if (weight_dtype(d0, &dt) < 0) return -1;
        int64_t s[3] = {E, F, D}, sd[3] = {E, D, F};
        lrmoe_tensor_t *w[3];
        if (!(w[0] = lrmoe_frame_put(o, "w_gate", dt, 3, s)) ||
            !(w[1] = lrmoe_frame_put(o, "w_up", dt, 3, s)) ||
            !(w[2] = lrmoe_frame_put(o, "w_down", dt, 3, sd)))
            return -1;
        size_t n = (size_t)(F * D), ds = lrmoe_dtype_size(dt);
        for (int64_t e = 0; e < E; e++)   /* checked even when empty (n == 0) */
            for (int p = PART_GATE; p <= PART_DOWN; p++) {
                const lrmoe_tensor_t *t = g->ent[e * 3 + p].t;
                int64_t want[2] = {p == PART_DOWN ? D : F, p == PART_DOWN ? F : D};
                if (check_dims(t, 2, want, p == PART_DOWN ? "down is [D,F]" : "gate and up are [F,D]") < 0)
                    return -1;
                if (t->dtype != sdt)
                    return lrmoe_err("%s is %s, %s %s", t->name, lrmoe_dtype_name(t->dtype),
                                     d0->name, lrmoe_dtype_name(sdt));
                if (n)   /* an empty tensor's data may be NULL: no offset from it */
                    copy_elems((char *)w[p]->data + (size_t)e * n * ds, dt, t->data, sdt, n);
            }
    }
    *Eo = E;
    *Do = D;
    return 0;
}

/* One group -> one weights frame (attributes of f copied). */
static int build_frame(const group_t *g, const lrmoe_frame_t *f, lrmoe_frame_t *o)
{
    for (int i = 0; i < f->nattrs; i++)   /* f's keys are unique: appended */
        if (lrmoe_frame_set_attr_new(o, f->keys[i], f->vals[i]) < 0) return -1;
    int64_t E = 0, D = 0;
    if (build_experts(g, o, &E, &D) < 0) return -1;
    if (g->router) {
        if (check_dims(g->router, 2, (int64_t[]){E, D}, "router gate.weight is [E,D]") < 0) return -1;
        if (!lrmoe_dtype_is_float(g->router->dtype))  /* lrmoe-route computes with it */
            return lrmoe_err("%s is %s: a router's weights are floating-point", g->router->name,
                             lrmoe_dtype_name(g->router->dtype));
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
    if (g->plen && lrmoe_frame_set_attrf(o, "hf.prefix", "%.*s", (int)g->plen - 1, g->prefix) < 0)
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
