/* libFuzzer harness: lrmoe-import's Hugging Face mapping (lib/import_hf.c),
 * structured. The byte-level harnesses reach it only through a whole valid
 * safetensors file, and practically never build a frame whose expert
 * weights agree on shapes, least of all with a dimension of 0 or one near
 * 2^62. Here the input is a recipe: a mode byte, then records of 7 bytes
 *   prefix  kind  index  dtype|ndim<<4  dim0 dim1 dim2
 * each naming one tensor from small tables (transformers' expert weight
 * names in the fused, per-expert and Mixtral layouts, routers, biases and
 * the activation names), with dims from a table that holds 0..5 and the
 * edges (2^20, 2^31, 2^61, 2^62 ...; a shape the stream reader would refuse
 * is left out). Data come from a generator seeded by the record. Oracles:
 * every frame handed on is well formed (w_gate, w_up [E,F,D], w_down
 * [E,D,F] of BF16 or F32, a floating router [E,D], an F32 expert_bias [E];
 * or I32 topk_ids, each in range, and F32 topk_weights), its fused weights
 * equal the source's halves value for value, and it encodes and decodes to
 * itself. ASan and UBSan watch every copy (memcpy from NULL, 2F). */
#include <inttypes.h>
#include "fuzz_common.h"
#include "import_hf.h"

static const char *const PREFIX[] = {
    "", "mlp.", "model.layers.0.mlp.", "model.layers.1.mlp.", "model.layers.1.block_sparse_moe.",
    "model.layers.99999999999999999999.mlp.", "x.layers.007.y.", "layers.3.",
};
static const char *const KIND[] = {
    "experts.gate_up_proj", "experts.down_proj", "gate_up_proj", "down_proj",
    "experts.%s.gate_proj.weight", "experts.%s.up_proj.weight", "experts.%s.down_proj.weight",
    "experts.%s.w1.weight", "experts.%s.w3.weight", "experts.%s.w2.weight",
    "gate.weight", "gate.e_score_correction_bias", "experts.%s.gate_proj.bias",
    "experts.gate_up_proj_bias", "experts.%s.other", "router_weight", "expert_bias",
    "hidden", "hidden_states", "topk_ids", "top_k_index", "selected_experts", "topk_weights",
    "routing_weights", "router_logits", "expert_load", "grad_output", "w_gate",
};
#define NKIND (int)(sizeof KIND / sizeof *KIND)
#define NPREFIX (int)(sizeof PREFIX / sizeof *PREFIX)
static const char *const INDEX[] = {"0", "1", "2", "3", "1048575", "1048576", "+1", "-1",
                                    "99999999999999999999", "00", "x"};
#define NINDEX (int)(sizeof INDEX / sizeof *INDEX)
static const int64_t EDGE[] = {(int64_t)1 << 20, (int64_t)1 << 31, (int64_t)1 << 32,
                               (int64_t)1 << 61, (int64_t)1 << 62, ((int64_t)1 << 62) + 1,
                               INT64_MAX / 2 + 1, 7, 8, 16, 64, 1000};
#define NEDGE (int)(sizeof EDGE / sizeof *EDGE)
#define MAXBYTES 65536

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void fill(lrmoe_tensor_t *t, uint64_t seed)
{
    uint64_t s = seed | 1;
    size_t n = (size_t)lrmoe_tensor_numel(t);
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rng(&s);
        int64_t small = (int64_t)(r % 6) - (r % 97 == 0);       /* mostly 0..5, sometimes -1 */
        if (r % 211 == 0) small = (int64_t)(r >> 1);             /* sometimes huge */
        float v = (float)((int64_t)(r % 2001) - 1000) / 256.0f;
        void *p = (char *)t->data + i * lrmoe_dtype_size(t->dtype);
        if (lrmoe_dtype_is_float(t->dtype)) lrmoe_convert_from_f32(t->dtype, &v, p, 1);
        else if (t->dtype == LRMOE_U64) { uint64_t u = (uint64_t)small; memcpy(p, &u, 8); }
        else {
            int64_t x = small;
            switch (lrmoe_dtype_size(t->dtype)) {
            case 1: { uint8_t b = (uint8_t)x; memcpy(p, &b, 1); break; }
            case 2: { uint16_t b = (uint16_t)x; memcpy(p, &b, 2); break; }
            case 4: { uint32_t b = (uint32_t)x; memcpy(p, &b, 4); break; }
            default: memcpy(p, &x, 8);
            }
        }
    }
}

/* What the stream reader (lib/stream.c) accepts as a shape: the product of
 * the dimensions, left to right, times the element size stays below 2^62. */
static int shape_ok(lrmoe_dtype_t dt, int ndim, const int64_t *s, uint64_t *bytes)
{
    uint64_t need = lrmoe_dtype_size(dt);
    for (int d = 0; d < ndim; d++) {
        uint64_t x = (uint64_t)s[d];
        if (x && need > (UINT64_MAX >> 2) / x) return 0;
        need *= x;
    }
    *bytes = need;
    return 1;
}

typedef struct {
    const lrmoe_frame_t *src;   /* a copy of the frame before the mapping */
    lrmoe_hf_map_t m;
    int frames;
} ctx_t;

static const lrmoe_tensor_t *src_get(const lrmoe_frame_t *f, const char *prefix, const char *name)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s%s%s", prefix, *prefix ? "." : "", name);
    return lrmoe_frame_get(f, buf);
}

/* a and b hold the same values once widened to F32 (bit for bit) */
static void same_values(const lrmoe_tensor_t *a, const void *b, lrmoe_dtype_t bdt, size_t n,
                        const char *what)
{
    if (!n) return;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    FUZZ_CHECK(x && y, "out of memory");
    lrmoe_convert_to_f32(a->dtype, a->data, x, n);
    lrmoe_convert_to_f32(bdt, b, y, n);
    FUZZ_CHECK(!memcmp(x, y, n * sizeof *x), "%s: values differ from the source", what);
    free(x);
    free(y);
}

static int check_frame(lrmoe_frame_t *o, int64_t index, void *vctx)
{
    ctx_t *c = vctx;
    FUZZ_CHECK(index == c->frames, "frame index %" PRId64 ", expected %d", index, c->frames);
    c->frames++;
    const lrmoe_tensor_t *wg = lrmoe_frame_get(o, "w_gate"), *wu = lrmoe_frame_get(o, "w_up"),
                         *wd = lrmoe_frame_get(o, "w_down");
    const char *layout = NULL;
    for (int i = 0; i < o->nattrs; i++)
        if (!strcmp(o->keys[i], "hf.layout")) layout = o->vals[i];
    if (layout) {
        FUZZ_CHECK(wg && wu && wd, "a weights frame without w_gate, w_up, w_down");
        FUZZ_CHECK(wg->ndim == 3 && wu->ndim == 3 && wd->ndim == 3, "weights not 3-D");
        int64_t E = wg->shape[0], F = wg->shape[1], D = wg->shape[2];
        FUZZ_CHECK(E >= 0 && F >= 0 && D >= 0, "negative dims");
        FUZZ_CHECK(wu->shape[0] == E && wu->shape[1] == F && wu->shape[2] == D, "w_up shape");
        FUZZ_CHECK(wd->shape[0] == E && wd->shape[1] == D && wd->shape[2] == F, "w_down shape");
        FUZZ_CHECK(wg->dtype == wu->dtype && wg->dtype == wd->dtype &&
                   (wg->dtype == LRMOE_BF16 || wg->dtype == LRMOE_F32),
                   "weights dtype %s", lrmoe_dtype_name(wg->dtype));
        const lrmoe_tensor_t *r = lrmoe_frame_get(o, "router_weight"),
                             *b = lrmoe_frame_get(o, "expert_bias");
        if (r)
            FUZZ_CHECK(lrmoe_dtype_is_float(r->dtype) && r->ndim == 2 && r->shape[0] == E &&
                       r->shape[1] == D, "router_weight");
        if (b) FUZZ_CHECK(b->dtype == LRMOE_F32 && b->ndim == 1 && b->shape[0] == E, "expert_bias");
        if (!strcmp(layout, "fused")) {   /* value for value against the source */
            const char *pre = "";
            for (int i = 0; i < o->nattrs; i++)
                if (!strcmp(o->keys[i], "hf.prefix")) pre = o->vals[i];
            const lrmoe_tensor_t *gu = src_get(c->src, pre, "experts.gate_up_proj"),
                                 *dn = src_get(c->src, pre, "experts.down_proj");
            if (!*pre && !gu) gu = src_get(c->src, pre, "gate_up_proj");   /* bare */
            if (!*pre && !dn) dn = src_get(c->src, pre, "down_proj");
            FUZZ_CHECK(gu && dn, "fused frame without its source (prefix '%s')", pre);
            size_t n = (size_t)(F * D), es = lrmoe_dtype_size(gu->dtype), os = lrmoe_dtype_size(wg->dtype);
            for (int64_t e = 0; E && F && D && e < E; e++) {
                lrmoe_tensor_t g1 = *wg, u1 = *wu;
                g1.data = (char *)wg->data + (size_t)e * n * os;
                u1.data = (char *)wu->data + (size_t)e * n * os;
                same_values(&g1, (const char *)gu->data + (size_t)e * 2 * n * es, gu->dtype, n, "w_gate");
                same_values(&u1, (const char *)gu->data + (size_t)(2 * e + 1) * n * es, gu->dtype, n, "w_up");
            }
            same_values(wd, dn->data, dn->dtype, (size_t)lrmoe_tensor_numel(wd), "w_down");
        }
    } else if (c->m != LRMOE_HF_OFF) {
        const lrmoe_tensor_t *ids = lrmoe_frame_get(o, "topk_ids"), *w = lrmoe_frame_get(o, "topk_weights");
        if (ids) {
            FUZZ_CHECK(ids->dtype == LRMOE_I32, "topk_ids is %s", lrmoe_dtype_name(ids->dtype));
            const int32_t *v = ids->data;
            for (int64_t i = 0; i < lrmoe_tensor_numel(ids); i++) FUZZ_CHECK(v[i] >= 0, "negative id");
        }
        if (w) FUZZ_CHECK(w->dtype == LRMOE_F32, "topk_weights is %s", lrmoe_dtype_name(w->dtype));
    }
    fuzz_roundtrip(o);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    lrmoe_hf_map_t m = (lrmoe_hf_map_t)(data[0] % 3);
    int probe = data[0] >> 2 & 1;
    lrmoe_frame_t f, src;
    lrmoe_frame_init(&f);
    lrmoe_frame_init(&src);
    size_t total = 0;
    for (size_t at = 1; at + 7 <= size && f.ntensors < 64; at += 7) {
        const uint8_t *r = data + at;
        char name[512], kind[128];
        const char *k = KIND[r[1] % NKIND];
        snprintf(kind, sizeof kind, k, INDEX[r[2] % NINDEX]);
        int bare = r[1] % NKIND >= 15;   /* router_weight ... w_gate: no prefix */
        snprintf(name, sizeof name, "%s%s", bare ? "" : PREFIX[r[0] % NPREFIX], kind);
        lrmoe_dtype_t dt = (lrmoe_dtype_t)((r[3] & 15) % LRMOE_NDTYPES);
        int ndim = r[3] >> 4 & 3;
        int64_t shape[3];
        for (int d = 0; d < 3; d++)
            shape[d] = r[4 + d] < 240 ? r[4 + d] % 6 : EDGE[(r[4 + d] - 240) % NEDGE];
        uint64_t bytes;
        if (lrmoe_frame_get(&f, name) || !shape_ok(dt, ndim, shape, &bytes) ||
            bytes > MAXBYTES || total + bytes > 4 * MAXBYTES)
            continue;
        lrmoe_tensor_t *t = lrmoe_frame_put(&f, name, dt, ndim, shape);
        FUZZ_CHECK(t, "put %s: %s", name, lrmoe_errmsg());
        fill(t, (uint64_t)r[0] << 48 ^ (uint64_t)r[1] << 40 ^ (uint64_t)r[2] << 32 ^ at);
        total += bytes;
    }
    if (size > 1 && data[size - 1] & 1) lrmoe_frame_set_attr(&f, "layer", "5");
    if (size > 1 && data[size - 1] & 2) lrmoe_frame_set_attr(&f, "step", "1");
    for (int i = 0; i < f.ntensors; i++) {   /* the source, for the value oracle */
        lrmoe_tensor_t *t = f.tensors[i], *c = lrmoe_frame_put(&src, t->name, t->dtype, t->ndim, t->shape);
        FUZZ_CHECK(c, "copy: %s", lrmoe_errmsg());
        if (t->nbytes) memcpy(c->data, t->data, t->nbytes);
    }
    if (probe) {
        int h = lrmoe_hf_has_weights(&f);
        FUZZ_CHECK(h >= -1 && h <= 1, "has_weights %d", h);
    }
    ctx_t c = {&src, m, 0};
    int64_t index = 0;
    int rc = lrmoe_hf_import(&f, m, check_frame, &c, &index);
    FUZZ_CHECK(rc == 0 || rc == -1, "import returned %d", rc);
    FUZZ_CHECK(rc < 0 || index == c.frames, "index %" PRId64 " after %d frames", index, c.frames);
    if (rc < 0) FUZZ_CHECK(*lrmoe_errmsg(), "an error without a message");
    lrmoe_frame_clear(&f);
    lrmoe_frame_clear(&src);
    return 0;
}
