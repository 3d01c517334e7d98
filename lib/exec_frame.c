/* Frame-level exec: a frame's tensors -> lrmoe_exec_forward/backward -> the
 * frame's new tensors and exec.* attributes (lib/exec_frame.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "exec_frame.h"
#include "par.h"
#include "exec_internal.h"
#include "gemm_cpu.h"
#include "weights_map.h"
#include "exec_mpi.h"
#include "plan.h"
#include "pack.h"
#include "clock.h"

void lrmoe_exec_frame_opts_default(lrmoe_exec_frame_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->mode = LRMOE_MODE_FULL;
    o->repeat = 1;
    lrmoe_exec_cfg_default(&o->cfg);
}

void lrmoe_exec_ctx_init(lrmoe_exec_ctx_t *c, const lrmoe_exec_frame_opts_t *o)
{
    memset(c, 0, sizeof *c);
    if (o) c->o = *o;
    else lrmoe_exec_frame_opts_default(&c->o);
    if (c->o.repeat < 1) c->o.repeat = 1;
    if (c->o.warmup < 0) c->o.warmup = 0;
    c->f32_layer = -1;
    c->layer = -1;
}

static void drop_f32(lrmoe_exec_ctx_t *c)
{
    free(c->f32);
    free(c->f32_done);
    c->f32 = NULL;
    c->f32_done = NULL;
    c->f32_layer = -1;
}

static void drop_weights(lrmoe_exec_ctx_t *c)
{
    if (c->w == &c->w_own) {
        lrmoe_weights_close(&c->w_own, &c->wmap);
    }
    free(c->wok);
    c->wok = NULL;
    c->wok_E = 0;
    if (c->cx) (void)lrmoe_exec_cuda_weights_changed(c->cx); /* pointers may be reused */
}

void lrmoe_exec_ctx_free(lrmoe_exec_ctx_t *c)
{
    drop_f32(c);
    drop_weights(c);
    if (c->cx) lrmoe_exec_cuda_free(c->cx);
    free(c->tim);
    free(c->rep);
    free(c->wall_rep);
    memset(c, 0, sizeof *c);
    c->f32_layer = -1;
}

void lrmoe_exec_ctx_weights_file(lrmoe_exec_ctx_t *c, const char *path)
{
    c->weights_path = path;
}

int lrmoe_exec_ctx_weights(lrmoe_exec_ctx_t *c, const lrmoe_weights_t *w)
{
    drop_f32(c);
    drop_weights(c);
    c->w = w;
    return 0;
}

/* A raw weights file is mapped (no copy: lib/weights_map.h), each frame's
 * digest record checked at its first use (frame_weights) on the -@ threads
 * (0: every CPU this process may run on); anything else is read. */
static int load_weights(lrmoe_exec_ctx_t *c)
{
    if (c->w) return 0;
    if (!c->weights_path) return lrmoe_err("weights: none given");
    if (lrmoe_weights_open(c->weights_path, &c->w_own, &c->wmap, c->o.cfg.threads) < 0) {
        /* the reader's errors name the file already ("PATH: ..." or
         * "<stdin>: ..."): the path once */
        const char *e = lrmoe_errmsg();
        const size_t n = strlen(c->weights_path);
        if ((!strncmp(e, c->weights_path, n) && e[n] == ':') || !strncmp(e, "<stdin>:", 8))
            return -1;
        return lrmoe_err_prefix("%s", c->weights_path);
    }
    c->w = &c->w_own;
    return 0;
}

/* used[e] = 1 for every expert some pair of the frame is routed to (ids are
 * range-checked by the caller's need() and the backend; out-of-range ones
 * are skipped here and reported there) */
static void used_experts(const lrmoe_tensor_t *ids, int64_t E, uint8_t *used)
{
    memset(used, 0, (size_t)E);
    const int32_t *id = ids->data;
    const int64_t n = ids->shape[0] * ids->shape[1];
    for (int64_t u = 0; u < n; u++)
        if (id[u] >= 0 && id[u] < E) used[id[u]] = 1;
}

/* The first non-finite value in each used, unchecked expert's matrices:
 * first[j * E + e] (-1: none, or not scanned), the experts cut into ranges
 * of at least LRMOE_SCAN_BYTES of weights, one per thread. */
#define LRMOE_SCAN_BYTES ((size_t)8 << 20)
typedef struct {
    const lrmoe_tensor_t *t[3];
    const uint8_t *used, *ok;
    int64_t E, *first;
} scan_t;

static int scan_experts(void *vp, int64_t lo, int64_t hi)
{
    scan_t *s = vp;
    for (int64_t e = lo; e < hi; e++)
        for (int j = 0; j < 3; j++) {
            const lrmoe_tensor_t *t = s->t[j];
            const size_t per = (size_t)(t->shape[1] * t->shape[2]), es = lrmoe_dtype_size(t->dtype);
            s->first[j * s->E + e] =
                s->used[e] && !s->ok[e]
                    ? lrmoe_exec_first_nonfinite(t->dtype, (const char *)t->data + (size_t)e * per * es,
                                                 per)
                    : -1;
        }
    return 0;
}

/* Each used expert's three matrices of weights frame wi, checked finite
 * once per context (c->wok remembers which were) on the -@ threads (0: the
 * CPUs this process may run on); the error is the one a scan of w_gate,
 * w_up, w_down in turn, each expert in order, meets first. F64 weights
 * take the common check over the whole tensor. */
static int check_weights(lrmoe_exec_ctx_t *c, int wi, int64_t layer, const uint8_t *used,
                         int64_t E)
{
    static const char *nm[3] = {"w_gate", "w_up", "w_down"};
    if (c->wok_E != E) {
        free(c->wok);
        c->wok_E = 0;
        if (!(c->wok = calloc((size_t)c->w->n * (size_t)E, 1))) return lrmoe_err("out of memory");
        c->wok_E = E;
    }
    uint8_t *ok = c->wok + (size_t)wi * (size_t)E;
    const lrmoe_frame_t *wf = &c->w->frames[wi];
    const char *what = c->weights_path && c->w == &c->w_own ? c->weights_path : "weights";
    scan_t s = {{NULL}, used, ok, E, NULL};
    for (int j = 0; j < 3; j++) s.t[j] = lrmoe_frame_get(wf, nm[j]);
    if (s.t[0]->dtype == LRMOE_F64) {   /* the three share one dtype (weights_layer) */
        for (int j = 0; j < 3; j++)
            if (!ok[0] && lrmoe_exec_check_finite(s.t[j]->dtype, s.t[j]->data,
                                                  (size_t)lrmoe_tensor_numel(s.t[j]), nm[j]) < 0)
                return lrmoe_err_prefix("%s: layer %lld", what, (long long)layer);
    } else if (E > 0) {
        if (!(s.first = malloc((size_t)(3 * E) * sizeof *s.first))) return lrmoe_err("out of memory");
        const size_t pe = 3 * (size_t)(s.t[0]->shape[1] * s.t[0]->shape[2]) *
                          lrmoe_dtype_size(s.t[0]->dtype);
        const int64_t min_chunk = pe ? (int64_t)((LRMOE_SCAN_BYTES + pe - 1) / pe) : E;
        lrmoe_parallel_ranges(E, lrmoe_parallel_cpus(c->o.cfg.threads), min_chunk, scan_experts,
                              &s);   /* never fails */
        for (int j = 0; j < 3; j++)
            for (int64_t e = 0; e < E; e++) {
                const int64_t i = s.first[j * E + e];
                if (i < 0) continue;
                const size_t per = (size_t)(s.t[j]->shape[1] * s.t[j]->shape[2]);
                free(s.first);
                return lrmoe_err("%s: layer %lld: %s: non-finite value at flat index %lld "
                                 "(use --allow-nonfinite)", what, (long long)layer, nm[j],
                                 (long long)((size_t)e * per + (size_t)i));
            }
        free(s.first);
    }
    for (int64_t e = 0; e < E; e++) ok[e] |= used[e];
    return 0;
}

/* Whether the layer's outputs stand in for the weights' finiteness scan
 * (out_check): the CPU backend in this process, weights of a dtype whose
 * GEMMs run in IEEE F32 arithmetic. CUDA, MPI and F64 weights keep the
 * scan of every used expert before the layer. */
static int defer_check(const lrmoe_exec_ctx_t *c, lrmoe_dtype_t wdt)
{
    return !c->o.cfg.allow_nonfinite && c->o.cfg.backend == LRMOE_BACKEND_CPU && !c->mpi &&
           (wdt == LRMOE_BF16 || wdt == LRMOE_F16 || wdt == LRMOE_F32);
}

/* The experts routed to but computing no row in this layer call: in the
 * compact backward those with no packed row (the forward and the full and
 * masked backward compute every routed pair; masked ones with dy = 0).
 * Their weights reach no output, so out_check cannot vouch for them: they
 * are scanned before the layer. */
static int idle_experts(lrmoe_exec_ctx_t *c, const lrmoe_frame_t *f, const lrmoe_tensor_t *ids,
                        int64_t E, const uint8_t *used, uint8_t *idle)
{
    memset(idle, 0, (size_t)E);
    if (!c->o.backward || c->o.mode != LRMOE_MODE_COMPACT) return 0;
    const lrmoe_tensor_t *pp = lrmoe_frame_get(f, "pack_pair");
    const int64_t M = ids->shape[0] * ids->shape[1];
    memcpy(idle, used, (size_t)E);
    if (!pp || pp->dtype != LRMOE_I64 || pp->ndim != 1) return 0; /* backward_inputs says why */
    const int32_t *id = ids->data;
    const int64_t *u = pp->data;
    for (int64_t r = 0; r < pp->shape[0]; r++)
        if (u[r] >= 0 && u[r] < M && id[u[r]] >= 0 && id[u[r]] < E) idle[id[u[r]]] = 0;
    return 1;
}

/* Finiteness of the weights, checked through the layer's outputs (after
 * the layer; defer_check says when). Why that is exact, for an expert that
 * computes at least one row (idle_experts scans the others first):
 *  - Every output element of a GEMM row is a sum of products over the
 *    whole shared dimension, and with IEEE arithmetic a NaN or +-Inf factor
 *    makes its product non-finite whatever the other factor (x * NaN = NaN,
 *    0 * Inf = NaN, x * Inf = +-Inf) and a sum with a non-finite term is
 *    non-finite (Inf + -Inf = NaN). The BLAS and oneDNN kernels skip no zero
 *    operand (tests/exec.bats puts the Inf against zero activations), BF16
 *    weights widen to F32 exactly (Inf and NaN included), and F32 -> BF16
 *    outputs keep NaN (lrmoe_f32_to_bf16) and Inf.
 *  - Forward: W_gate[e,f,:] / W_up[e,f,:] non-finite makes column f of the
 *    gate / up GEMM non-finite in every row of e: saved_gate / saved_up,
 *    stored before the SwiGLU (so no exp() can turn it finite). W_down[e,d,:]
 *    makes column d of pair_out non-finite in every row of e, and so column
 *    d of output in each of e's tokens: the combine adds alpha * y of every
 *    pair of a token into its output row in F32 (lib/exec_cpu.c: no pair or
 *    zero weight skipped; alpha = topk_weights, checked finite on input, and
 *    0 * Inf = NaN) and output's BF16 keeps Inf and NaN. Scanned:
 *    saved_gate, saved_up, output (T*(2*K*F+D) values; output instead of
 *    pair_out scans K times fewer values for W_down: at 4096 tokens of
 *    qwen3-30b-a3b 117 MB instead of 235 MB).
 *  - Backward: W_down[e,:,f] makes dphi = dy W_down non-finite in column f
 *    (also where dy = 0: 0 * Inf); dg and du are dphi times finite-or-not
 *    factors (lib/swiglu.c: products only), so they are too; dx = [dg du]
 *    [W_gate; W_up] is then non-finite in every column, and W_gate/W_up
 *    non-finite make dx non-finite directly. grad_hidden is the sum of a
 *    token's dx rows (every computed row is summed). Scanned: grad_hidden
 *    (T*D values).
 * A non-finite output is not always a weight's (large activations can
 * overflow, or the inputs hold NaN), so on one the used experts' weights
 * are scanned as before the change: their first non-finite value is the
 * error, and none means the outputs stand as they are, exactly today's
 * verdict and message. */
static int out_check(lrmoe_exec_ctx_t *c, const lrmoe_frame_t *f, int wi, int64_t layer,
                     const lrmoe_tensor_t *ids, int64_t E)
{
    static const char *fwd[] = {"saved_gate", "saved_up", "output", NULL};
    static const char *bwd[] = {"grad_hidden", NULL};
    int bad = 0;
    for (const char **n = c->o.backward ? bwd : fwd; *n && !bad; n++) {
        const lrmoe_tensor_t *t = lrmoe_frame_get(f, *n);
        if (!t) return lrmoe_err("exec: output %s missing", *n);
        bad = lrmoe_exec_first_nonfinite(t->dtype, t->data, (size_t)lrmoe_tensor_numel(t)) >= 0;
    }
    if (!bad) return 0;
    uint8_t *used = malloc((size_t)(E > 0 ? E : 1));
    if (!used) return lrmoe_err("out of memory");
    used_experts(ids, E, used);
    int rc = check_weights(c, wi, layer, used, E);
    free(used);
    return rc;
}

/* Packed F32 copy of one layer's weights (--compute f32 only; BF16 weights
 * from a layer's second frame in a row, see weights_for), made lazily:
 * each used expert once per layer (not per frame or call), the others never
 * (their pages are never touched). Expert e's block is [W_gate (F,D); W_up
 * (F,D); W_down (D,F)] so the backend runs gate and up as one GEMM with
 * N = 2F. */
static int pack_f32(lrmoe_exec_ctx_t *c, int64_t layer, const lrmoe_tensor_t *wg,
                    const lrmoe_tensor_t *wu, const lrmoe_tensor_t *wd, const uint8_t *used)
{
    const int64_t E = wg->shape[0];
    const size_t n = (size_t)(wg->shape[1] * wg->shape[2]);
    const size_t es = lrmoe_dtype_size(wg->dtype);
    if (c->f32_layer != layer) {
        drop_f32(c);
        c->f32 = malloc((size_t)E * 3 * n * sizeof(float));
        c->f32_done = calloc((size_t)E, 1);
        if (!c->f32 || !c->f32_done) {
            drop_f32(c);
            return lrmoe_err("weights layer %lld: out of memory for the F32 copy",
                             (long long)layer);
        }
        c->f32_layer = layer;
    }
    for (int64_t e = 0; e < E; e++) {
        if (!used[e] || c->f32_done[e]) continue;
        float *b = c->f32 + (size_t)e * 3 * n;
        lrmoe_convert_to_f32(wg->dtype, (const char *)wg->data + (size_t)e * n * es, b, n);
        lrmoe_convert_to_f32(wu->dtype, (const char *)wu->data + (size_t)e * n * es, b + n, n);
        lrmoe_convert_to_f32(wd->dtype, (const char *)wd->data + (size_t)e * n * es, b + 2 * n, n);
        c->f32_done[e] = 1;
    }
    return 0;
}

/* tensor with the given rank and dims (-1: any) and one of the dtypes */
static lrmoe_tensor_t *need(lrmoe_frame_t *f, const char *name, int ndim,
                            const int64_t *dims, int nd, const lrmoe_dtype_t *dts)
{
    lrmoe_tensor_t *t = lrmoe_frame_need(f, name);
    if (!t || lrmoe_tensor_check(t, ndim, dims) < 0) return NULL;
    for (int i = 0; i < nd; i++)
        if (t->dtype == dts[i]) return t;
    lrmoe_err("tensor %s: dtype %s not accepted", name, lrmoe_dtype_name(t->dtype));
    return NULL;
}

/* need() for a tensor whose expected shape holds D or F, which come from the
 * weights: a mismatch names the weights stream and its dimensions, since
 * weights of another model are the likelier cause than bad data. */
static lrmoe_tensor_t *need_m(const lrmoe_exec_ctx_t *c, const lrmoe_exec_dims_t *d,
                              lrmoe_frame_t *f, const char *name, int ndim,
                              const int64_t *dims, int nd, const lrmoe_dtype_t *dts)
{
    lrmoe_tensor_t *t = lrmoe_frame_get(f, name);
    int shape_bad = t && lrmoe_tensor_check(t, ndim, dims) < 0;
    t = need(f, name, ndim, dims, nd, dts);
    if (!t && shape_bad) {
        char why[512];
        snprintf(why, sizeof why, "%s", lrmoe_errmsg());
        lrmoe_err("%s; the weights %s%s (layer %lld) have D=%lld F=%lld E=%lld: "
                  "are they this model's?", why,
                  c->weights_path && c->w == &c->w_own ? "stream " : "",
                  c->weights_path && c->w == &c->w_own ? c->weights_path : "given",
                  (long long)c->layer, (long long)d->D, (long long)d->F,
                  (long long)d->E);
    }
    return t;
}

/* A new output tensor. The CPU backend in this process writes every element
 * of every output (lib/exec_cpu.c), so its outputs are neither zeroed nor
 * pre-faulted here (lrmoe_frame_put would zero them): their pages are
 * faulted in once, by the layer (its own writes; the backward's weight
 * gradients an expert at a time, lrmoe_alloc_prefault; huge or 4 KiB pages
 * as lrmoe_alloc_big decides), repeat and warmup runs reuse them,
 * or not at all when sp (NULL: none) holds the previous frame's buffer of
 * that name and size (lrmoe_exec_frame_reuse). Other backends and MPI jobs
 * get zeroed outputs. */
static lrmoe_tensor_t *put(const lrmoe_exec_ctx_t *c, lrmoe_frame_t *sp, lrmoe_frame_t *f,
                           const char *name, lrmoe_dtype_t dt, int ndim, const int64_t *dims)
{
    if (c->o.cfg.backend != LRMOE_BACKEND_CPU || c->mpi)
        return lrmoe_frame_put(f, name, dt, ndim, dims);
    size_t nb = lrmoe_dtype_size(dt);
    for (int i = 0; i < ndim; i++) nb *= (size_t)dims[i];
    void *p = NULL;
    lrmoe_tensor_t *s = sp ? lrmoe_frame_get(sp, name) : NULL;
    if (s && s->data && s->nbytes == nb) {
        p = s->data; /* ownership passes from sp to f */
        s->data = NULL;
        lrmoe_frame_del(sp, name);
    }
    if (!p && nb) p = lrmoe_alloc_out(nb);
    if (nb && !p) {
        lrmoe_err("out of memory: %zu bytes for tensor %s", nb, name);
        return NULL;
    }
    return lrmoe_frame_adopt(f, name, dt, ndim, dims, p);
}

/* each phase's output tensors (run_forward, run_backward put them) */
static const char *const OUT_FWD[] = {"output", "pair_rank", "phi_sqnorm", "saved_gate",
                                      "saved_up", "pair_out", NULL};
static const char *const OUT_BWD[] = {"grad_hidden", "grad_w_gate", "grad_w_up", "grad_w_down",
                                      "grad_topk_weights", NULL};

int lrmoe_exec_ctx_recycle(const lrmoe_exec_ctx_t *c, lrmoe_frame_t *f, lrmoe_frame_t *spare)
{
    lrmoe_frame_clear(spare);
    if (c->o.cfg.backend != LRMOE_BACKEND_CPU || c->mpi) return 0;
    int n = 0;
    for (const char *const *nm = c->o.backward ? OUT_BWD : OUT_FWD; *nm; nm++) {
        lrmoe_tensor_t *t = lrmoe_frame_get(f, *nm);
        if (!t || !t->data) continue;
        /* the buffer moves: spare adopts it (or, failing, frees it), f forgets it */
        n += lrmoe_frame_adopt(spare, t->name, t->dtype, t->ndim, t->shape, t->data) != NULL;
        t->data = NULL;
        lrmoe_frame_del(f, *nm);
    }
    return n;
}

static const lrmoe_dtype_t DT_ACT[2] = {LRMOE_BF16, LRMOE_F32};
static const lrmoe_dtype_t DT_F32[1] = {LRMOE_F32};
static const lrmoe_dtype_t DT_I32[1] = {LRMOE_I32};
static const lrmoe_dtype_t DT_I64[1] = {LRMOE_I64};
static const lrmoe_dtype_t DT_U8[2] = {LRMOE_U8, LRMOE_BOOL};

/* The layer's weights (E, F, D from them), validated; *wi their frame. */
static int frame_weights(lrmoe_exec_ctx_t *c, int64_t layer, lrmoe_exec_weights_t *W,
                         int *wi, int64_t *E, int64_t *F, int64_t *D)
{
    if (load_weights(c) < 0) return -1;
    const lrmoe_frame_t *wf = lrmoe_weights_layer(c->w, layer);
    if (!wf) return lrmoe_err("weights: no frame for layer %lld", (long long)layer);
    *wi = (int)(wf - c->w->frames);
    if (c->w == &c->w_own && lrmoe_weights_use(&c->wmap, c->w, wf) < 0) return -1;
    lrmoe_tensor_t *wg = lrmoe_frame_need(wf, "w_gate"), *wu = lrmoe_frame_need(wf, "w_up"),
                   *wd = lrmoe_frame_need(wf, "w_down");
    if (!wg || !wu || !wd) return lrmoe_err_prefix("weights layer %lld", (long long)layer);
    if (wg->ndim != 3) return lrmoe_err("weights: w_gate must be [E,F,D]");
    *E = wg->shape[0]; *F = wg->shape[1]; *D = wg->shape[2];
    const int64_t efd[3] = {*E, *F, *D}, edf[3] = {*E, *D, *F};
    if (lrmoe_tensor_check(wu, 3, efd) < 0 || lrmoe_tensor_check(wd, 3, edf) < 0)
        return lrmoe_err_prefix("weights layer %lld", (long long)layer);
    if (wu->dtype != wg->dtype || wd->dtype != wg->dtype)
        return lrmoe_err("weights: w_gate, w_up, w_down have different dtypes");
    memset(W, 0, sizeof *W);
    W->dtype = wg->dtype; W->w_gate = wg->data; W->w_up = wu->data; W->w_down = wd->data;
    return 0;
}

/* What the frame's routing needs of the weights before the layer runs: its
 * experts checked finite (once each) and, on the CPU with f32 compute, in
 * the packed F32 copy. bf16 compute multiplies the stored dtype: no copy. */
static int weights_for(lrmoe_exec_ctx_t *c, const lrmoe_frame_t *f, int wi, int64_t layer,
                       const lrmoe_tensor_t *ids, lrmoe_exec_weights_t *W, int64_t E)
{
    uint8_t *used = malloc((size_t)(E > 0 ? E : 1) * 2);
    if (!used) return lrmoe_err("out of memory");
    uint8_t *idle = used + (E > 0 ? E : 1);
    used_experts(ids, E, used);
    int rc = 0;
    if (!defer_check(c, W->dtype)) {
        if (!c->o.cfg.allow_nonfinite) rc = check_weights(c, wi, layer, used, E);
    } else if (idle_experts(c, f, ids, E, used, idle) && check_weights(c, wi, layer, idle, E) < 0) {
        rc = check_weights(c, wi, layer, used, E); /* today's first error */
    }
    lrmoe_exec_numerics_t nm;
    if (!rc) rc = lrmoe_exec_numerics(&c->o.cfg, W->dtype, 0, &nm);
    lrmoe_compute_t cm = rc ? LRMOE_COMPUTE_F32 : nm.compute;
    /* F32 weights: always packed (gate and up as one GEMM; other bits
     * without). BF16 weights: the packed F32 copy from the second frame of a
     * layer in a row on (or one already begun): a process's first frame, and
     * a stream alternating layers, convert each expert into the backend's
     * scratch at its GEMM (the same bits) instead, which faults in nothing
     * new (a copy is all experts' weights in fresh F32 memory: 2.4 GB at the
     * qwen3-30b-a3b shape, measured 2.2 s of a 4.5-5.0 s one-frame forward
     * at 1024 tokens on an AMD EPYC VM, against 2.5-2.7 s without it, whose
     * layer was 20-27% slower) */
    if (!rc && c->o.cfg.backend == LRMOE_BACKEND_CPU && cm == LRMOE_COMPUTE_F32 &&
        (W->dtype == LRMOE_F32 ||
         (W->dtype == LRMOE_BF16 && (c->f32_layer == layer || c->layer == layer)))) {
        const lrmoe_frame_t *wf = &c->w->frames[wi];
        /* under MPI with --per-rank inputs this frame holds rank 0's token rows
         * only, which need not route to every expert rank 0 computes: copy all
         * (the other ranks' copies hold all too, lib/exec_mpi.c layer_f32) */
        if (c->mpi) memset(used, 1, (size_t)E);
        rc = pack_f32(c, layer, lrmoe_frame_get(wf, "w_gate"), lrmoe_frame_get(wf, "w_up"),
                      lrmoe_frame_get(wf, "w_down"), used);
        if (!rc) W->w_f32 = c->f32;
    }
    free(used);
    return rc;
}

/* P and the plan: the plan's when the frame has one (checked against the
 * routing), else --ranks, else (backward) pack_counts' rows or the forward's
 * exec.ranks, else 1. */
static int frame_plan(lrmoe_exec_ctx_t *c, lrmoe_frame_t *f, const lrmoe_tensor_t *ids,
                      int64_t E, lrmoe_plan_t *plan, lrmoe_exec_plan_t *XP, int *Pout)
{
    int P = c->o.ranks;
    if (!P && c->o.backward) {
        lrmoe_tensor_t *pc = lrmoe_frame_get(f, "pack_counts");
        int64_t v = 0;
        if (c->o.mode == LRMOE_MODE_COMPACT && pc && pc->ndim == 2 && pc->shape[0] > 0 &&
            pc->shape[0] <= 4096)
            P = (int)pc->shape[0];
        else if (lrmoe_frame_attr_i64(f, "exec.ranks", &v) == 1 && v > 0 && v <= 4096)
            P = (int)v;
    }
    if (!P) P = 1;
    *Pout = P;
    XP->placement = NULL;
    XP->fwd_alloc = NULL;
    if (!lrmoe_frame_get(f, "placement")) return 0;
    if (lrmoe_plan_from_frame(f, plan) < 0) return lrmoe_err_prefix("plan");
    const int64_t T = ids->shape[0], K = ids->shape[1];
    int64_t *load = calloc((size_t)plan->E, sizeof *load);
    if (!load) return lrmoe_err("out of memory");
    const int32_t *id = ids->data;
    int bad = 0;
    for (int64_t u = 0; u < T * K; u++) {
        if (id[u] < 0 || id[u] >= plan->E) { bad = 1; break; }
        load[id[u]]++;
    }
    int rc = 0;
    if (plan->E != E)
        rc = lrmoe_err("plan has E=%d experts but the weights have %lld", plan->E, (long long)E);
    else if (c->o.ranks && c->o.ranks != plan->P)
        rc = lrmoe_err("--ranks %d but the plan is for %d ranks", c->o.ranks, plan->P);
    /* per-rank inputs (MPI): this frame holds one rank's tokens, so the loads
     * are checked against all ranks' routing there (lrmoe_exec_assign) */
    else if (lrmoe_plan_check(plan, bad || (c->mpi && c->mpi->shard) ? NULL : load) < 0)
        rc = lrmoe_err_prefix("plan");
    free(load);
    if (rc < 0) return -1;
    *Pout = plan->P;
    XP->placement = plan->placement;
    XP->fwd_alloc = plan->fwd_alloc;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The layer call, warmup untimed runs then repeat timed ones; c->tim and
 * c->wall get the medians (the outputs are those of the last run: every run
 * writes the same values). */
typedef int (*layer_fn)(const lrmoe_exec_ctx_t *, const lrmoe_exec_dims_t *,
                        const lrmoe_exec_weights_t *, const lrmoe_exec_plan_t *, void *,
                        double *);

/* Backend cuda in this process: the job's executor (made at the first
 * frame, again only if P changes), kept until lrmoe_exec_ctx_free. NULL
 * (plain calls) otherwise, and in a build without CUDA. */
static lrmoe_exec_cuda_t *cuda_exec(const lrmoe_exec_ctx_t *cc, int P, int *rc)
{
    *rc = 0;
#ifdef LRMOE_HAVE_CUDA
    lrmoe_exec_ctx_t *c = (lrmoe_exec_ctx_t *)cc; /* the executor is the call's cache */
    if (c->mpi || c->o.cfg.backend != LRMOE_BACKEND_CUDA) return NULL;
    if (c->cx && c->cx_P == P) return c->cx;
    if (c->cx) lrmoe_exec_cuda_free(c->cx);
    c->cx = NULL;
    if (lrmoe_exec_cuda_new(&c->o.cfg, P, &c->cx) < 0) { *rc = -1; return NULL; }
    c->cx_P = P;
    return c->cx;
#else
    (void)cc; (void)P;
    return NULL;
#endif
}

/* One layer call: in this process, or (c->mpi) spread over the MPI ranks. */
static int fwd_call(const lrmoe_exec_ctx_t *c, const lrmoe_exec_dims_t *d,
                    const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *p, void *a,
                    double *tim)
{
    if (c->mpi) { /* the digest takes its tensors' CRCs from the mapping's check */
        c->mpi->wmap = c->w == &c->w_own ? &c->wmap : NULL;
        return lrmoe_exec_mpi_forward(c->mpi, &c->o.cfg, d, c->layer, w, p, a, tim);
    }
    int rc;
    lrmoe_exec_cuda_t *x = cuda_exec(c, d->P, &rc);
    if (rc < 0) return -1;
    if (x) return lrmoe_exec_cuda_forward(x, &c->o.cfg, d, w, p, a, tim);
    return lrmoe_exec_forward(&c->o.cfg, d, w, p, a, tim);
}

static int bwd_call(const lrmoe_exec_ctx_t *c, const lrmoe_exec_dims_t *d,
                    const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *p, void *a,
                    double *tim)
{
    if (c->mpi) { /* the digest takes its tensors' CRCs from the mapping's check */
        c->mpi->wmap = c->w == &c->w_own ? &c->wmap : NULL;
        return lrmoe_exec_mpi_backward(c->mpi, &c->o.cfg, d, c->layer, w, p, a, tim);
    }
    int rc;
    lrmoe_exec_cuda_t *x = cuda_exec(c, d->P, &rc);
    if (rc < 0) return -1;
    if (x) return lrmoe_exec_cuda_backward(x, &c->o.cfg, d, w, p, a, tim);
    return lrmoe_exec_backward(&c->o.cfg, d, w, p, a, tim);
}

static int timed(lrmoe_exec_ctx_t *c, layer_fn fn, const lrmoe_exec_dims_t *d,
                 const lrmoe_exec_weights_t *W, const lrmoe_exec_plan_t *XP, void *a)
{
    const int N = c->o.repeat, P = d->P;
    const size_t per = (size_t)P * LRMOE_NSTAGES;
    for (int i = 0; i < c->o.warmup; i++)
        if (fn(c, d, W, XP, a, c->tim) < 0) return -1;
    if (N == 1) {
        double t0 = lrmoe_now();
        if (fn(c, d, W, XP, a, c->tim) < 0) return -1;
        c->wall = lrmoe_now() - t0;
        return 0;
    }
    if ((size_t)N * per > (size_t)c->rep_cap) {
        double *r = realloc(c->rep, (size_t)N * per * sizeof *r);
        if (!r) return lrmoe_err("out of memory");
        c->rep = r;
        double *wr = realloc(c->wall_rep, (size_t)N * sizeof *wr);
        if (!wr) return lrmoe_err("out of memory");
        c->wall_rep = wr;
        c->rep_cap = (int)((size_t)N * per);
    }
    for (int i = 0; i < N; i++) {
        double t0 = lrmoe_now();
        if (fn(c, d, W, XP, a, c->rep + (size_t)i * per) < 0) return -1;
        c->wall_rep[i] = lrmoe_now() - t0;
    }
    double *col = c->wall_rep; /* reused as scratch after the wall median */
    c->wall = median(c->wall_rep, N);
    for (size_t j = 0; j < per; j++) {
        for (int i = 0; i < N; i++) col[i] = c->rep[(size_t)i * per + j];
        c->tim[j] = median(col, N);
    }
    return 0;
}

static int run_forward(lrmoe_exec_ctx_t *c, lrmoe_frame_t *sp, lrmoe_frame_t *f,
                       const lrmoe_exec_dims_t *d,
                       const lrmoe_exec_weights_t *W, const lrmoe_exec_plan_t *XP,
                       const lrmoe_tensor_t *ids, const lrmoe_tensor_t *tw)
{
    const int64_t T = d->T, K = d->K, D = d->D, F = d->F;
    const int64_t td[2] = {T, D}, tk[2] = {T, K}, tkf[3] = {T, K, F}, tkd[3] = {T, K, D};
    lrmoe_tensor_t *h = need_m(c, d, f, "hidden", 2, td, 2, DT_ACT);
    if (!h) return -1;
    const lrmoe_dtype_t adt = h->dtype;
    lrmoe_exec_fwd_t a = {0};
    a.act_dtype = adt;
    a.hidden = h->data;
    a.topk_ids = ids->data;
    a.topk_weights = tw->data;
    lrmoe_tensor_t *o = put(c, sp, f, "output", adt, 2, td),
                   *pr = put(c, sp, f, "pair_rank", LRMOE_I32, 2, tk),
                   *pn = put(c, sp, f, "phi_sqnorm", LRMOE_F32, 2, tk),
                   *sg = put(c, sp, f, "saved_gate", adt, 3, tkf),
                   *su = put(c, sp, f, "saved_up", adt, 3, tkf),
                   *po = put(c, sp, f, "pair_out", adt, 3, tkd);
    if (!o || !pr || !pn || !sg || !su || !po) return -1;
    a.output = o->data; a.pair_rank = pr->data; a.phi_sqnorm = pn->data;
    a.saved_gate = sg->data; a.saved_up = su->data; a.pair_out = po->data;
    return timed(c, fwd_call, d, W, XP, &a);
}

/* The backward inputs of a mode into a. */
static int backward_inputs(lrmoe_exec_ctx_t *c, lrmoe_frame_t *f, const lrmoe_exec_dims_t *d,
                           const lrmoe_dtype_t *adt, lrmoe_exec_bwd_t *a)
{
    const int64_t T = d->T, K = d->K, D = d->D, F = d->F, E = d->E, P = d->P;
    const int64_t tk[2] = {T, K}, tkf[3] = {T, K, F};
    const char *mode = lrmoe_exec_mode_name(c->o.mode);
    if (c->o.mode != LRMOE_MODE_COMPACT) {
        const int64_t td[2] = {T, D};
        lrmoe_tensor_t *h = need_m(c, d, f, "hidden", 2, td, 1, adt),
                       *pr = need(f, "pair_rank", 2, tk, 1, DT_I32),
                       *sg = need_m(c, d, f, "saved_gate", 3, tkf, 1, adt),
                       *su = need_m(c, d, f, "saved_up", 3, tkf, 1, adt);
        if (!h || !pr || !sg || !su) return lrmoe_err_prefix("backward %s", mode);
        a->hidden = h->data; a->pair_rank = pr->data;
        a->saved_gate = sg->data; a->saved_up = su->data;
        if (c->o.mode == LRMOE_MODE_MASKED) {
            lrmoe_tensor_t *kp = need(f, "keep", 2, tk, 2, DT_U8);
            if (!kp) return lrmoe_err_prefix("backward masked");
            a->keep = kp->data;
        }
        return 0;
    }
    /* the copying form carries the four packed row tensors, the layout-only
     * form none (lrmoe_pack_form); CUDA and MPI read packed rows, so for them
     * a layout-only frame's rows are gathered here (lrmoe_pack_rows_frame:
     * the bytes lrmoe-pack writes) and dropped again after the layer */
    int form = lrmoe_pack_form(f), mat = 0;
    if (form < 0) return lrmoe_err_prefix("backward compact");
    const lrmoe_tensor_t *pp0 = lrmoe_frame_get(f, "pack_pair");
    if (form == LRMOE_PACK_FORM_LAYOUT && pp0 && pp0->ndim == 1 && pp0->shape[0] > 0 &&
        (c->o.cfg.backend != LRMOE_BACKEND_CPU || c->mpi)) {
        if (lrmoe_pack_rows_frame(f, c->o.cfg.threads > 1 ? c->o.cfg.threads : 1) < 0)
            return lrmoe_err_prefix("backward compact, layout-only pack (rows for the %s)",
                                    c->mpi ? "MPI path" : "CUDA backend");
        form = LRMOE_PACK_FORM_ROWS;
        mat = 1;
    }
    const int64_t any1[1] = {-1};
    lrmoe_tensor_t *pp = need(f, "pack_pair", 1, any1, 1, DT_I64);
    if (!pp) return lrmoe_err_prefix("backward compact");
    const int64_t R = pp->shape[0];
    const int64_t r1[1] = {R}, pe[2] = {P, E}, rd[2] = {R, D}, rf[2] = {R, F};
    lrmoe_tensor_t *pk = need(f, "pack_rank", 1, r1, 1, DT_I32),
                   *pc = need(f, "pack_counts", 2, pe, 1, DT_I64),
                   *pf = need(f, "pack_offsets", 2, pe, 1, DT_I64);
    if (!pk || !pc || !pf) return lrmoe_err_prefix("backward compact");
    a->R = R; a->pack_pair = pp->data; a->pack_rank = pk->data;
    a->pack_counts = pc->data; a->pack_offsets = pf->data;
    if (form == LRMOE_PACK_FORM_LAYOUT) {
        const int64_t td[2] = {T, D};
        lrmoe_tensor_t *h = need_m(c, d, f, "hidden", 2, td, 1, adt),
                       *sg = need_m(c, d, f, "saved_gate", 3, tkf, 1, adt),
                       *su = need_m(c, d, f, "saved_up", 3, tkf, 1, adt);
        if (!h || !sg || !su) return lrmoe_err_prefix("backward compact, layout-only pack");
        a->hidden = h->data; a->saved_gate = sg->data; a->saved_up = su->data;
        return 0;
    }
    lrmoe_tensor_t *pg = need_m(c, d, f, "pack_grad", 2, rd, 1, DT_F32),
                   *ph = need_m(c, d, f, "pack_hidden", 2, rd, 1, adt),
                   *pa = need_m(c, d, f, "pack_gate", 2, rf, 1, adt),
                   *pu = need_m(c, d, f, "pack_up", 2, rf, 1, adt);
    if (!pg || !ph || !pa || !pu) return lrmoe_err_prefix("backward compact");
    a->pack_grad = pg->data;
    a->pack_hidden = ph->data; a->pack_gate = pa->data; a->pack_up = pu->data;
    return mat;
}

/* After the layer: the rows backward_inputs gathered for a layout-only frame
 * go again, so the output keeps the input's form. */
static int drop_rows(lrmoe_frame_t *f)
{
    static const char *const nm[4] = {"pack_grad", "pack_hidden", "pack_gate", "pack_up"};
    for (int i = 0; i < 4; i++) lrmoe_frame_del(f, nm[i]);
    return lrmoe_frame_set_attr(f, "pack.form", "layout");
}

static int run_backward(lrmoe_exec_ctx_t *c, lrmoe_frame_t *sp, lrmoe_frame_t *f,
                        const lrmoe_exec_dims_t *d,
                        const lrmoe_exec_weights_t *W, const lrmoe_exec_plan_t *XP,
                        const lrmoe_tensor_t *ids, const lrmoe_tensor_t *tw)
{
    const int64_t T = d->T, K = d->K, D = d->D, F = d->F, E = d->E;
    const int64_t td[2] = {T, D}, tk[2] = {T, K}, tkd[3] = {T, K, D};
    lrmoe_exec_bwd_t a = {0};
    a.mode = c->o.mode;
    lrmoe_tensor_t *g = need_m(c, d, f, "grad_output", 2, td, 2, DT_ACT);
    lrmoe_tensor_t *po = need_m(c, d, f, "pair_out", 3, tkd, 2, DT_ACT);
    if (!g || !po) return -1;
    a.act_dtype = po->dtype;
    a.grad_dtype = g->dtype;
    a.topk_ids = ids->data;
    a.topk_weights = tw->data;
    a.grad_output = g->data;
    a.pair_out = po->data;
    const lrmoe_dtype_t adt[1] = {po->dtype};
    const int mat = backward_inputs(c, f, d, adt, &a);
    if (mat < 0) return -1;
    /* masked and compact: a sampled keep's rows scaled by pair_weight (1/p_u;
     * the copying form's pack_grad has it already, lrmoe-pack); full keeps
     * every pair unweighted. The router gradient g_t . y_u never uses alpha. */
    float *aw = NULL;
    if (c->o.mode != LRMOE_MODE_FULL && lrmoe_frame_get(f, "pair_weight")) {
        if (!(aw = lrmoe_frame_bwd_alpha(f, tw, T, K)))
            return lrmoe_err_prefix("backward %s", lrmoe_exec_mode_name(c->o.mode));
        a.topk_weights = aw;
    }
    const int64_t efd[3] = {E, F, D}, edf[3] = {E, D, F};
    lrmoe_tensor_t *gh = put(c, sp, f, "grad_hidden", LRMOE_F32, 2, td),
                   *gg = put(c, sp, f, "grad_w_gate", LRMOE_F32, 3, efd),
                   *gu = put(c, sp, f, "grad_w_up", LRMOE_F32, 3, efd),
                   *gd = put(c, sp, f, "grad_w_down", LRMOE_F32, 3, edf),
                   *gt = put(c, sp, f, "grad_topk_weights", LRMOE_F32, 2, tk);
    if (!gh || !gg || !gu || !gd || !gt) { free(aw); return -1; }
    a.grad_hidden = gh->data; a.grad_w_gate = gg->data; a.grad_w_up = gu->data;
    a.grad_w_down = gd->data; a.grad_topk_weights = gt->data;
    int rc = timed(c, bwd_call, d, W, XP, &a);
    free(aw);
    if (mat && drop_rows(f) < 0) rc = -1;
    return rc;
}

/* exec.<phase>.<stage>_s (per rank, comma-separated), .critical_rank,
 * .critical_s, .wall_s, exec.ranks, exec.backend, exec.backward.mode. */
static int timing_attrs(const lrmoe_exec_ctx_t *c, lrmoe_frame_t *f)
{
    const int P = c->P;
    const double *tim = c->tim;
    const char *ph = c->o.backward ? "backward" : "forward";
    char key[64];
    size_t cap = (size_t)P * 24 + 16;
    char *buf = malloc(cap);
    if (!buf) return lrmoe_err("out of memory");
    double ctot = 0;
    for (int s = 0; s <= LRMOE_NSTAGES; s++) {
        size_t len = 0;
        buf[0] = 0;
        for (int r = 0; r < P; r++) {
            double v = 0;
            if (s < LRMOE_NSTAGES) v = tim[r * LRMOE_NSTAGES + s];
            else for (int k = 0; k < LRMOE_NSTAGES; k++) v += tim[r * LRMOE_NSTAGES + k];
            if (s == LRMOE_NSTAGES && r == c->critical) ctot = v;
            len += (size_t)snprintf(buf + len, cap - len, "%s%.6g", r ? "," : "", v);
        }
        snprintf(key, sizeof key, "exec.%s.%s_s", ph,
                 s < LRMOE_NSTAGES ? lrmoe_exec_stage_name(s) : "total");
        if (lrmoe_frame_set_attr(f, key, buf) < 0) { free(buf); return -1; }
    }
    free(buf);
    snprintf(key, sizeof key, "exec.%s.critical_rank", ph);
    if (lrmoe_frame_set_attrf(f, key, "%d", c->critical) < 0) return -1;
    snprintf(key, sizeof key, "exec.%s.critical_s", ph);
    if (lrmoe_frame_set_attrf(f, key, "%.6g", ctot) < 0) return -1;
    snprintf(key, sizeof key, "exec.%s.wall_s", ph);
    if (lrmoe_frame_set_attrf(f, key, "%.6g", c->wall) < 0) return -1;
    if (lrmoe_frame_set_attrf(f, "exec.ranks", "%d", P) < 0 ||
        lrmoe_frame_set_attr(f, "exec.backend", lrmoe_backend_name(c->o.cfg.backend)) < 0)
        return -1;
    if (c->o.backward &&
        lrmoe_frame_set_attr(f, "exec.backward.mode", lrmoe_exec_mode_name(c->o.mode)) < 0)
        return -1;
    if (c->o.repeat > 1 || c->o.warmup > 0) {
        snprintf(key, sizeof key, "exec.%s.repeat", ph);
        if (lrmoe_frame_set_attrf(f, key, "%d", c->o.repeat) < 0) return -1;
        snprintf(key, sizeof key, "exec.%s.warmup", ph);
        if (lrmoe_frame_set_attrf(f, key, "%d", c->o.warmup) < 0) return -1;
    }
    if (c->mpi && lrmoe_exec_mpi_attrs(c->mpi, f, ph) < 0) return -1;
    return 0;
}

int lrmoe_exec_frame(lrmoe_exec_ctx_t *c, lrmoe_frame_t *f)
{
    return lrmoe_exec_frame_reuse(c, f, NULL);
}

static int exec_frame(lrmoe_exec_ctx_t *c, lrmoe_frame_t *f, lrmoe_frame_t *sp);

int lrmoe_exec_frame_reuse(lrmoe_exec_ctx_t *c, lrmoe_frame_t *f, lrmoe_frame_t *spare)
{
    int rc = exec_frame(c, f, spare);
    if (spare) lrmoe_frame_clear(spare); /* what this frame did not reuse */
    return rc;
}

/* The model sizes the frame states (its generator's ffn, the plan's
 * plan.ffn and plan.hidden) against the weights': a forward frame carries no
 * tensor of width F, so weights of another model would otherwise run. */
static int frame_sizes(const lrmoe_frame_t *f, int64_t layer, int64_t F, int64_t D)
{
    static const struct { const char *key; int d; } said[] = {
        {"ffn", 0}, {"plan.ffn", 0}, {"plan.hidden", 1}};
    for (size_t i = 0; i < sizeof said / sizeof *said; i++) {
        int64_t v = 0;
        int rc = lrmoe_frame_attr_i64(f, said[i].key, &v);
        if (rc < 0) return lrmoe_err("attribute %s: not an integer", said[i].key);
        const int64_t w = said[i].d ? D : F;
        if (rc == 1 && v != w)
            return lrmoe_err("the frame's %s=%lld but the weights of layer %lld have %s=%lld "
                             "(weights of another model?)", said[i].key, (long long)v,
                             (long long)layer, said[i].d ? "D" : "F", (long long)w);
    }
    return 0;
}

static int exec_frame(lrmoe_exec_ctx_t *c, lrmoe_frame_t *f, lrmoe_frame_t *sp)
{
    int64_t layer = 0;
    if (lrmoe_frame_attr_i64(f, "layer", &layer) < 0)
        return lrmoe_err("attribute layer: not an integer");
    lrmoe_exec_weights_t W;
    int64_t E = 0, F = 0, D = 0;
    int wi = 0;
    if (frame_weights(c, layer, &W, &wi, &E, &F, &D) < 0 || frame_sizes(f, layer, F, D) < 0)
        return -1;
    if (c->mpi) { /* per-rank inputs: every rank's frame must be of one step */
        int64_t st = 0;
        int r = lrmoe_frame_attr_i64(f, "step", &st);
        if (r < 0) return lrmoe_err("attribute step: not an integer");
        c->mpi->step = r == 1 ? st : LRMOE_EXEC_MPI_NO_STEP;
    }

    const int64_t any2[2] = {-1, -1};
    lrmoe_tensor_t *ids = need(f, "topk_ids", 2, any2, 1, DT_I32);
    if (!ids) return -1;
    const int64_t T = ids->shape[0], K = ids->shape[1];
    const int64_t tk[2] = {T, K};
    lrmoe_tensor_t *tw = need(f, "topk_weights", 2, tk, 1, DT_F32);
    if (!tw) return -1;
    lrmoe_tensor_t *lg = lrmoe_frame_get(f, "router_logits");
    if (lg && lg->ndim == 2 && lg->shape[1] != E)
        return lrmoe_err("weights have E=%lld experts but router_logits has %lld",
                         (long long)E, (long long)lg->shape[1]);
    if (weights_for(c, f, wi, layer, ids, &W, E) < 0) return -1;

    lrmoe_plan_t plan;
    lrmoe_plan_init(&plan);
    lrmoe_exec_plan_t XP;
    int P = 1, rc = -1;
    if (frame_plan(c, f, ids, E, &plan, &XP, &P) < 0) goto out;
    if (P > c->tim_cap) {
        double *t = realloc(c->tim, (size_t)P * LRMOE_NSTAGES * sizeof *t);
        if (!t) { lrmoe_err("out of memory"); goto out; }
        c->tim = t;
        c->tim_cap = P;
    }
    memset(c->tim, 0, (size_t)P * LRMOE_NSTAGES * sizeof *c->tim);
    c->layer = layer;
    c->P = P;
    c->wall = 0;
    const lrmoe_exec_dims_t d = {T, E, K, D, F, P};
    if ((c->o.backward ? run_backward : run_forward)(c, sp, f, &d, &W, &XP, ids, tw) < 0 ||
        (defer_check(c, W.dtype) && out_check(c, f, wi, layer, ids, E) < 0))
        goto out;
    c->critical = lrmoe_exec_critical(P, c->tim);
    rc = timing_attrs(c, f);
    if (!rc && c->o.cfg.backend == LRMOE_BACKEND_CPU) { /* the GEMMs' numerics */
        lrmoe_exec_numerics_t nm;
        rc = lrmoe_exec_numerics(&c->o.cfg, W.dtype, 1, &nm);
        if (!rc) rc = lrmoe_frame_set_attr(f, "exec.compute", nm.compute_name);
        if (!rc && nm.compute == LRMOE_COMPUTE_BF16) { /* the kernel that ran (rank 0's under MPI) */
            const lrmoe_gemm_kernel_t k = nm.kernel;
            rc = lrmoe_frame_set_attr(f, "exec.bf16", nm.kernel_name);
            if (!rc && k.dnnl_version) /* oneDNN's part: its version and implementation */
                rc = lrmoe_frame_set_attrf(f, "exec.bf16_dnnl", "%d.%d.%d %s",
                                           k.dnnl_version / 10000, k.dnnl_version / 100 % 100,
                                           k.dnnl_version % 100, k.dnnl_impl);
        }
    }
    if (!rc) /* how the weights came in: mapped (a raw file), read, or the caller's */
        rc = lrmoe_frame_set_attr(f, "exec.weights", c->w != &c->w_own ? "given"
                                                     : c->wmap.base ? "mapped" : "read");
out:
    lrmoe_plan_free(&plan);
    return rc;
}

int lrmoe_exec_timings_tsv(FILE *fp, int header, const lrmoe_exec_ctx_t *c, int64_t frame)
{
    if (header) {
        fprintf(fp, "frame\tlayer\tphase\tmode\trank");
        for (int s = 0; s < LRMOE_NSTAGES; s++) fprintf(fp, "\t%s_s", lrmoe_exec_stage_name(s));
        fprintf(fp, "\ttotal_s\tcritical\twall_s\n");
    }
    const char *ph = c->o.backward ? "backward" : "forward";
    for (int r = 0; r < c->P; r++) {
        double tot = 0;
        fprintf(fp, "%lld\t%lld\t%s\t%s\t%d", (long long)frame, (long long)c->layer, ph,
                c->o.backward ? lrmoe_exec_mode_name(c->o.mode) : "-", r);
        for (int s = 0; s < LRMOE_NSTAGES; s++) {
            fprintf(fp, "\t%.6f", c->tim[r * LRMOE_NSTAGES + s]);
            tot += c->tim[r * LRMOE_NSTAGES + s];
        }
        fprintf(fp, "\t%.6f\t%d\t%.6f\n", tot, r == c->critical, c->wall);
    }
    if (ferror(fp)) return lrmoe_err("write error");
    return 0;
}
