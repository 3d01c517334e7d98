/* libFuzzer harness: the stages on frames (route, plan, score, pack,
 * unpack, exec forward and backward: the handles of api.h that the tools,
 * the C API and the Python package share), structured. The stream
 * harnesses reach a stage's frame only through a valid stream; and the
 * bugs a stage can have sit where its tensors disagree with each other: a
 * quota of 0 experts beside ids that say 8, a bwd_alloc of 0 ranks, ids out
 * of range, a pack_pair past T*K. Here the input is a recipe:
 *   byte 0  the stage (or a pipeline of them), bytes 1-4  T, K, E, P
 *   then records of 6 bytes
 *     r0 < 48   an option of the stage: r1 picks it, r2 its value
 *     r0 < 64   an attribute: r1 its name, r2 its value
 *     else      a tensor: r1 its name; r0's bits say natural (the dtype,
 *               shape and value range the stages expect, built from T, K,
 *               E, P, D, F) or fuzzed (dtype, rank and dims from r2..r5,
 *               dims from the same symbols and the edges 0..3), and
 *               whether values stay in range or take edges (-1, E, P,
 *               huge, NaN, Inf)
 * Oracles: every stage returns 0, or -1 with a message; a frame a stage
 * accepted encodes and decodes to itself. ASan and UBSan watch the rest.
 * Exec runs against one of two weights streams made at start-up (E 4,
 * D 8, F 4; F32 and BF16), so an exec recipe takes E = 4. */
#include <inttypes.h>
#include "fuzz_common.h"
#include "api.h"
#include "pack.h"

enum { D_ = 8, F_ = 4, EW = 4 };

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* symbols of a dimension */
enum { S_T, S_K, S_E, S_P, S_D, S_F, S_TK, S_R, S_0, S_1, S_2, S_3, S_N };

typedef struct {
    const char *name;
    lrmoe_dtype_t dt;
    int ndim, dim[3];
    int range;   /* what in-range integer values are */
} spec_t;
enum { R_FLOAT, R_POS, R_ID, R_RANK, R_BIT, R_ONE, R_COUNT, R_PAIR, R_OFFS };

static const spec_t SPEC[] = {
    {"topk_ids", LRMOE_I32, 2, {S_T, S_K}, R_ID},
    {"topk_weights", LRMOE_F32, 2, {S_T, S_K}, R_POS},
    {"router_logits", LRMOE_F32, 2, {S_T, S_E}, R_FLOAT},
    {"hidden", LRMOE_BF16, 2, {S_T, S_D}, R_FLOAT},
    {"hidden", LRMOE_F32, 2, {S_T, S_D}, R_FLOAT},
    {"grad_output", LRMOE_F32, 2, {S_T, S_D}, R_FLOAT},
    {"grad_output", LRMOE_BF16, 2, {S_T, S_D}, R_FLOAT},
    {"phi_sqnorm", LRMOE_F32, 2, {S_T, S_K}, R_POS},
    {"saved_gate", LRMOE_F32, 3, {S_T, S_K, S_F}, R_FLOAT},
    {"saved_up", LRMOE_F32, 3, {S_T, S_K, S_F}, R_FLOAT},
    {"quota", LRMOE_I64, 1, {S_E}, R_COUNT},
    {"bwd_alloc", LRMOE_I64, 2, {S_E, S_P}, R_COUNT},
    {"fwd_alloc", LRMOE_I64, 2, {S_E, S_P}, R_COUNT},
    {"placement", LRMOE_U8, 2, {S_E, S_P}, R_ONE},
    {"pair_rank", LRMOE_I32, 2, {S_T, S_K}, R_RANK},
    {"keep", LRMOE_U8, 2, {S_T, S_K}, R_BIT},
    {"pair_weight", LRMOE_F32, 2, {S_T, S_K}, R_POS},
    {"pair_score", LRMOE_F32, 2, {S_T, S_K}, R_POS},
    {"expert_load", LRMOE_I64, 1, {S_E}, R_COUNT},
    {"pack_pair", LRMOE_I64, 1, {S_R}, R_PAIR},
    {"pack_rank", LRMOE_I32, 1, {S_R}, R_RANK},
    {"pack_counts", LRMOE_I64, 2, {S_P, S_E}, R_COUNT},
    {"pack_offsets", LRMOE_I64, 2, {S_P, S_E}, R_OFFS},
    {"pack_grad", LRMOE_F32, 2, {S_R, S_D}, R_FLOAT},
    {"pack_hidden", LRMOE_F32, 2, {S_R, S_D}, R_FLOAT},
    {"pack_gate", LRMOE_F32, 2, {S_R, S_F}, R_FLOAT},
    {"pack_up", LRMOE_F32, 2, {S_R, S_F}, R_FLOAT},
    {"router_weight", LRMOE_F32, 2, {S_E, S_D}, R_FLOAT},
    {"expert_bias", LRMOE_F32, 1, {S_E}, R_FLOAT},
    {"output", LRMOE_F32, 2, {S_T, S_D}, R_FLOAT},
    {"phi", LRMOE_F32, 3, {S_T, S_K, S_F}, R_FLOAT},
};
#define NSPEC (int)(sizeof SPEC / sizeof *SPEC)

static const char *const ATTR[][6] = {
    {"plan.keep", "by-rank", "global", "neither", "", NULL},
    {"exec.ranks", "1", "2", "3", "0", "99999999999"},
    {"topk", "1", "2", "4", "0", "-1"},
    {"ffn", "4", "8", "0", "x", NULL},
    {"layer", "0", "1", "-1", "9223372036854775807", "x"},
    {"route.topk", "1", "2", "9", NULL, NULL},
    {"plan.ranks", "1", "2", "4", "0", NULL},
    {"pack.form", "rows", "layout", "x", NULL, NULL},
    {"plan.rho", "0.5", "1", "nan", "-1", NULL},
};
#define NATTR (int)(sizeof ATTR / sizeof *ATTR)

/* options by stage: name, then values (NULL ends; a flag's only value is "!") */
typedef struct {
    const char *name;
    const char *v[6];
} opt_t;
static const opt_t O_ROUTE[] = {
    {"topk", {"1", "2", "3", "4", "9", NULL}}, {"router", {"softmax", "sigmoid", "x", NULL}},
    {"renorm", {"!", NULL}}, {"scale", {"1", "0.5", "1e30", NULL}},
    {"groups", {"1", "2", "3", NULL}}, {"topk-groups", {"1", "2", NULL}},
    {"ranks", {"1", "2", "3", "5", NULL}}, {"loads-only", {"!", NULL}}};
static const opt_t O_PLAN[] = {
    {"ranks", {"1", "2", "3", "4", NULL}}, {"planner", {"lrmoe", "llep", "eplb", "fixed", "x", NULL}},
    {"rate", {"1.0", "0.8", "0.5", "0", NULL}}, {"hbm", {"1M", "16G", "100", "1", NULL}},
    {"ffn", {"4", "8", NULL}}, {"hidden", {"8", "16", NULL}}, {"topk", {"1", "2", "4", NULL}},
    {"slots", {"1", "2", "8", NULL}}, {"best-effort", {"!", NULL}},
    {"capacity-factor", {"1.0", "0.5", "2", NULL}}, {"drop-policy", {"probs", "position", NULL}},
    {"rates", {"1.0,0.5", "0.9", NULL}}, {"tokens", {"4", "12", NULL}},
    {"min-keep", {"0", "0.5", NULL}}, {"longer-backward", {"!", NULL}}};
static const opt_t O_SCORE[] = {
    {"metric", {"lrm", "random", "gradnorm", NULL}}, {"select", {"topk", "sample", NULL}},
    {"drop", {"0", "10", "50", "100", NULL}}, {"seed", {"0", "1", "9223372036854775807", NULL}},
    {"frame", {"0", "9223372036854775807", NULL}}};
static const opt_t O_PACK[] = {
    {"alloc", {"auto", "plan", "forward", NULL}}, {"ranks", {"1", "2", "3", "4", NULL}},
    {"strip", {"!", NULL}}, {"layout-only", {"!", NULL}}};
static const opt_t O_EXEC[] = {
    {"mode", {"full", "masked", "compact", NULL}}, {"ranks", {"1", "2", "3", "4", NULL}},
    {"compute", {"f32", "bf16", "auto", NULL}}, {"allow-nonfinite", {"!", NULL}},
    {"weights", {"0", "1", NULL}}};
#define NOPT(a) (int)(sizeof a / sizeof *a)

static char wpath[2][64];

static void make_weights(void)
{
    if (wpath[0][0]) return;
    for (int i = 0; i < 2; i++) {
        snprintf(wpath[i], sizeof wpath[i], "/tmp/lrmoe-fuzz-w.XXXXXX");
        int fd = mkstemp(wpath[i]);
        FUZZ_CHECK(fd >= 0, "cannot create a weights file in /tmp");
        close(fd);
        lrmoe_frame_t w;
        lrmoe_frame_init(&w);
        const lrmoe_dtype_t dt = i ? LRMOE_BF16 : LRMOE_F32;
        const char *nm[3] = {"w_gate", "w_up", "w_down"};
        int64_t sh[3][3] = {{EW, F_, D_}, {EW, F_, D_}, {EW, D_, F_}};
        uint64_t s = 12345 + (uint64_t)i;
        for (int k = 0; k < 3; k++) {
            lrmoe_tensor_t *t = lrmoe_frame_put(&w, nm[k], dt, 3, sh[k]);
            FUZZ_CHECK(t, "weights tensor");
            for (int64_t j = 0; j < lrmoe_tensor_numel(t); j++) {
                float v = (float)((int64_t)(rng(&s) % 201) - 100) / 400.0f;
                lrmoe_convert_from_f32(dt, &v, (char *)t->data + j * lrmoe_dtype_size(dt), 1);
            }
        }
        lrmoe_frame_set_attr(&w, "layer", "0");
        lrmoe_writer_t *wr = lrmoe_writer_open(wpath[i], NULL);
        FUZZ_CHECK(wr && lrmoe_writer_write(wr, &w) == 0 && lrmoe_writer_close(wr) == 0,
                   "writing the weights: %s", lrmoe_errmsg());
        lrmoe_frame_clear(&w);
    }
}

static int64_t dimv(int sym, const int64_t *v)
{
    return sym < S_N ? v[sym] : 0;
}

static void fill(lrmoe_tensor_t *t, int range, int edge, uint64_t seed, const int64_t *v)
{
    uint64_t s = seed | 1;
    const size_t n = (size_t)lrmoe_tensor_numel(t), es = lrmoe_dtype_size(t->dtype);
    const int64_t T = v[S_T], K = v[S_K], E = v[S_E], P = v[S_P];
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rng(&s);
        int64_t x;
        switch (range) {
        case R_ID: x = E ? (int64_t)(r % (uint64_t)E) : 0; break;
        case R_RANK: x = P ? (int64_t)(r % (uint64_t)P) : 0; break;
        case R_BIT: x = (int64_t)(r & 1); break;
        case R_ONE: x = r % 5 != 0; break;
        case R_COUNT: x = (int64_t)(r % (uint64_t)(T * K + 1)); break;
        case R_PAIR: x = T * K ? (int64_t)(r % (uint64_t)(T * K)) : 0; break;
        case R_OFFS: x = (int64_t)i; break;
        default: x = (int64_t)(r % 7);
        }
        float f = range == R_POS ? (float)(r % 1000 + 1) / 500.0f
                                 : (float)((int64_t)(r % 2001) - 1000) / 256.0f;
        if (edge && r % 7 == 0) {
            static const int64_t EI[] = {-1, 0, 1, 2, INT32_MAX, INT64_MAX, INT64_MIN, -2};
            static const float EF[] = {0.0f, -1.0f, 1e30f, -0.0f, 1e-40f, 65536.0f};
            const uint64_t k = (r >> 8) % 12;
            x = k < 8 ? EI[k] : k == 8 ? E : k == 9 ? P : k == 10 ? T * K : T;
            f = (r >> 16) % 8 == 0 ? (r & 256 ? __builtin_nanf("") : __builtin_inff())
                                   : EF[(r >> 20) % 6];
        }
        void *p = (char *)t->data + i * es;
        if (lrmoe_dtype_is_float(t->dtype)) lrmoe_convert_from_f32(t->dtype, &f, p, 1);
        else if (es == 1) { uint8_t b = (uint8_t)x; memcpy(p, &b, 1); }
        else if (es == 2) { uint16_t b = (uint16_t)x; memcpy(p, &b, 2); }
        else if (es == 4) { uint32_t b = (uint32_t)x; memcpy(p, &b, 4); }
        else memcpy(p, &x, 8);
    }
}

typedef struct {
    lrmoe_route_t *route;
    lrmoe_plan_cfg_t *plan;
    lrmoe_score_t *score;
    lrmoe_pack_t *pack;
    lrmoe_exec_t *fwd, *bwd;
} handles_t;

/* each stage's options (unpack has no handle: it takes pack's) */
static const struct {
    const opt_t *tab;
    int n;
} OPTS[7] = {{O_ROUTE, NOPT(O_ROUTE)}, {O_PLAN, NOPT(O_PLAN)}, {O_SCORE, NOPT(O_SCORE)},
             {O_PACK, NOPT(O_PACK)},   {O_PACK, NOPT(O_PACK)}, {O_EXEC, NOPT(O_EXEC)},
             {O_EXEC, NOPT(O_EXEC)}};

/* option a (value b) of stage st (0..6) on its handle */
static void set_opt(const handles_t *h, int st, uint8_t a, uint8_t b)
{
    const opt_t *o = &OPTS[st].tab[a % OPTS[st].n];
    int nv = 0;
    while (nv < 6 && o->v[nv]) nv++;
    const char *val = o->v[b % nv];
    if (!strcmp(val, "!")) val = NULL;
    if (st >= 5 && !strcmp(o->name, "weights")) val = wpath[b % 2];
    int rc;
    switch (st) {
    case 0: rc = lrmoe_route_set(h->route, o->name, val); break;
    case 1: rc = lrmoe_plan_cfg_set(h->plan, o->name, val); break;
    case 2: rc = lrmoe_score_set(h->score, o->name, val); break;
    case 3: case 4: rc = lrmoe_pack_set(h->pack, o->name, val); break;
    default: rc = lrmoe_exec_set(st == 5 ? h->fwd : h->bwd, o->name, val);
    }
    FUZZ_CHECK(rc == 0 || (rc == -1 && *lrmoe_errmsg()), "%s=%s: rc %d, message '%s'", o->name,
               val ? val : "(flag)", rc, lrmoe_errmsg());
}

/* a stage's result: 0, or -1 with a message; an accepted frame round-trips */
static int ran(int rc, lrmoe_frame_t *f, const char *what)
{
    FUZZ_CHECK(rc == 0 || (rc == -1 && *lrmoe_errmsg()), "%s: rc %d, message '%s'", what, rc,
               lrmoe_errmsg());
    if (rc == 0) fuzz_roundtrip(f);
    return rc;
}

static int plan_run(lrmoe_plan_cfg_t *c, lrmoe_frame_t *f, int E)
{
    const lrmoe_tensor_t *t = lrmoe_frame_get(f, "expert_load");
    int64_t *load = NULL;
    if (t && t->ndim == 1 && !lrmoe_dtype_is_float(t->dtype) && t->shape[0] == E)
        load = lrmoe_tensor_i64(t);
    if (!load) {
        load = calloc((size_t)(E ? E : 1), sizeof *load);
        FUZZ_CHECK(load, "out of memory");
        for (int e = 0; e < E; e++) load[e] = e % 3 + 1;
    }
    int rc = lrmoe_plan_cfg_run(c, load, E, f);
    free(load);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 5) return 0;
    make_weights();
    /* stage: 0 route, 1 plan, 2 score, 3 pack, 4 unpack, 5 exec forward,
     * 6 exec backward, 7 the pipeline route, plan, exec forward, score,
     * pack, exec backward (each on what the last left, until one fails) */
    const int stage = data[0] % 8;
    const int exec = stage >= 5;
    int64_t v[S_N];
    v[S_T] = data[1] % 13;
    v[S_K] = 1 + data[2] % 4;
    v[S_E] = exec ? EW : data[3] % 9;
    v[S_P] = 1 + data[4] % 4;
    v[S_D] = D_;
    v[S_F] = F_;
    v[S_TK] = v[S_T] * v[S_K];
    v[S_R] = (v[S_TK] + 1) / 2;
    v[S_0] = 0; v[S_1] = 1; v[S_2] = 2; v[S_3] = 3;

    handles_t h = {lrmoe_route_new(), lrmoe_plan_cfg_new(), lrmoe_score_new(),
                   lrmoe_pack_new(), lrmoe_exec_new(), lrmoe_exec_new()};
    FUZZ_CHECK(h.route && h.plan && h.score && h.pack && h.fwd && h.bwd, "out of memory");
    lrmoe_route_set(h.route, "threads", "1");
    lrmoe_score_set(h.score, "threads", "1");
    lrmoe_pack_set(h.pack, "threads", "1");
    FUZZ_CHECK(lrmoe_exec_set(h.fwd, "weights", wpath[0]) == 0 &&
               lrmoe_exec_set(h.fwd, "threads", "1") == 0 &&
               lrmoe_exec_set(h.bwd, "weights", wpath[0]) == 0 &&
               lrmoe_exec_set(h.bwd, "phase", "backward") == 0 &&
               lrmoe_exec_set(h.bwd, "threads", "1") == 0, "exec options: %s", lrmoe_errmsg());
    lrmoe_frame_t f;
    lrmoe_frame_init(&f);
    lrmoe_frame_set_attr(&f, "layer", "0");
    for (size_t at = 5; at + 6 <= size && f.ntensors < 48; at += 6) {
        const uint8_t *r = data + at;
        if (r[0] < 48) {   /* an option: of the stage, or of one in the pipeline */
            set_opt(&h, stage == 7 ? r[0] % 7 : stage, r[1], r[2]);
            continue;
        }
        if (r[0] < 64) {   /* an attribute */
            const char *const *a = ATTR[r[1] % NATTR];
            int nv = 1;
            while (nv < 6 && a[nv]) nv++;
            lrmoe_frame_set_attr(&f, a[0], a[1 + r[2] % (nv - 1)]);
            continue;
        }
        const spec_t *sp = &SPEC[r[1] % NSPEC];
        const int natural = (r[0] & 3) != 0, edge = (r[0] & 12) == 12;
        lrmoe_dtype_t dt = sp->dt;
        int ndim = sp->ndim;
        int64_t shape[3] = {0, 0, 0};
        if (natural) {
            for (int d = 0; d < ndim; d++) shape[d] = dimv(sp->dim[d], v);
        } else {
            dt = (lrmoe_dtype_t)(r[2] % LRMOE_NDTYPES);
            ndim = r[2] >> 4 & 3;
            for (int d = 0; d < ndim; d++) shape[d] = dimv(r[3 + d] % S_N, v);
        }
        if (lrmoe_frame_get(&f, sp->name)) lrmoe_frame_del(&f, sp->name);
        lrmoe_tensor_t *t = lrmoe_frame_put(&f, sp->name, dt, ndim, shape);
        FUZZ_CHECK(t, "frame_put %s: %s", sp->name, lrmoe_errmsg());
        fill(t, sp->range, edge, (uint64_t)at * 0x9E3779B97F4A7C15ULL ^ r[5] ^ (uint64_t)r[4] << 8,
             v);
    }
    const int E = (int)v[S_E];
    switch (stage) {
    case 0: ran(lrmoe_route_run(h.route, &f), &f, "route"); break;
    case 1: ran(plan_run(h.plan, &f, E), &f, "plan"); break;
    case 2: ran(lrmoe_score_run(h.score, &f), &f, "score"); break;
    case 3: ran(lrmoe_pack_run(h.pack, &f), &f, "pack"); break;
    case 4:
        ran(lrmoe_pack_unpack_frame(&f, data[2] & 1 ? "pack_hidden" : "pack_grad", "unpacked",
                                    data[2] >> 1 & 1), &f, "unpack");
        break;
    case 5: ran(lrmoe_exec_run(h.fwd, &f), &f, "exec forward"); break;
    case 6: ran(lrmoe_exec_run(h.bwd, &f), &f, "exec backward"); break;
    default:
        if (!lrmoe_frame_get(&f, "topk_ids") && ran(lrmoe_route_run(h.route, &f), &f, "route"))
            break;
        if (!lrmoe_frame_get(&f, "quota") && ran(plan_run(h.plan, &f, E), &f, "plan")) break;
        if (ran(lrmoe_exec_run(h.fwd, &f), &f, "exec forward")) break;
        if (ran(lrmoe_score_run(h.score, &f), &f, "score")) break;
        if (ran(lrmoe_pack_run(h.pack, &f), &f, "pack")) break;
        ran(lrmoe_exec_run(h.bwd, &f), &f, "exec backward");
    }
    lrmoe_frame_clear(&f);
    lrmoe_route_free(h.route);
    lrmoe_plan_cfg_free(h.plan);
    lrmoe_score_free(h.score);
    lrmoe_pack_free(h.pack);
    lrmoe_exec_free(h.fwd);
    lrmoe_exec_free(h.bwd);
    return 0;
}
