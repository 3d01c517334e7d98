/* lrmoe-exec: expert-parallel forward and backward of each frame's MoE layer. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "exec.h"
#include "lrmoe.h"
#include "plan.h"

static void usage(FILE *fp)
{
    fprintf(fp,
        "Usage: lrmoe-exec --phase forward|backward --weights FILE [options] [FILE]\n"
        "Run each frame's MoE layer on P expert-parallel ranks (one process):\n"
        "forward adds output, pair_rank, phi_sqnorm, saved_gate, saved_up, pair_out;\n"
        "backward adds grad_hidden, grad_w_gate, grad_w_up, grad_w_down,\n"
        "grad_topk_weights. The plan (placement, fwd_alloc) is realised when the\n"
        "frame has one, else plain EP.\n\n"
        "Options:\n"
        "      --phase PH        forward or backward (required)\n"
        "      --weights FILE    weights stream, frames matched by attribute layer\n"
        "  -P, --ranks P         expert-parallel ranks (default: the plan's, else 1)\n"
        "      --mode M          backward: full (default), masked (keep) or compact\n"
        "      --backend B       cpu (default) or cuda\n"
        "      --gpus N          cuda: devices to use (default 0: all visible)\n"
        "      --device N        cuda: first device (default 0); rank r runs on\n"
        "                        device (N + r mod G) mod visible, G = --gpus\n"
        "      --gemm G          cuda: expert GEMMs as a loop of cublasGemmEx\n"
        "                        (loop, default) or grouped (cublasGemmGroupedBatchedEx)\n"
        "      --gemm-streams N  cuda: streams of the loop GEMM, 1 to 8 (default 4)\n"
        "      --timings FILE    write per-rank, per-stage seconds as TSV\n"
        "      --allow-nonfinite accept NaN/Inf in the inputs\n"
        "  -o, --output FILE     write to FILE (default stdout)\n"
        "  -l, --level N         zstd level (default 3)\n"
        "  -@, --threads N       BLAS and zstd threads (default 0: library default)\n"
        "  -j, --rank-threads N  compute N ranks at a time, threads/N BLAS threads\n"
        "                        each (default 1: one rank at a time)\n"
        "      --clock C         stage clock: wall (default, monotonic) or cpu (CPU\n"
        "                        time of each rank's thread; needs 1 BLAS thread per rank)\n"
        "      --no-compress     write a raw stream\n"
        "  -f, --force           write binary to a terminal\n"
        "  -h, --help            this help\n"
        "  -V, --version         print the version\n");
}

typedef struct {
    int backward;
    lrmoe_exec_mode_t mode;
    lrmoe_exec_cfg_t cfg;
    int ranks;               /* 0: from the plan, else 1 */
    const char *weights;     /* path, read lazily at the first frame */
    int w_loaded;
    lrmoe_weights_t w;
    FILE *tsv;
    int tsv_header;
    int64_t f32_layer;       /* layer whose weights are cached as packed F32, -1 none */
    float *f32;              /* (E, 3*F*D): per expert [W_gate; W_up; W_down] */
} ctx_t;

static void drop_f32(ctx_t *c)
{
    free(c->f32);
    c->f32 = NULL;
    c->f32_layer = -1;
}

/* The weights stream is read at the first input frame, not at startup, so
 * that `lrmoe-gen --weights w.lrm | ... | lrmoe-exec --weights w.lrm` has no
 * race: lrmoe-gen finishes w.lrm before it writes frame 0. */
static int load_weights(ctx_t *c)
{
    if (c->w_loaded) return 0;
    if (lrmoe_weights_load(c->weights, &c->w) < 0)
        return lrmoe_err_prefix("%s", c->weights);
    c->w_loaded = 1;
    if (c->cfg.allow_nonfinite) return 0;
    for (int i = 0; i < c->w.n; i++) {
        const char *nm[3] = {"w_gate", "w_up", "w_down"};
        for (int j = 0; j < 3; j++) {
            lrmoe_tensor_t *t = lrmoe_frame_get(&c->w.frames[i], nm[j]);
            if (t && lrmoe_exec_check_finite(t->dtype, t->data,
                                             (size_t)lrmoe_tensor_numel(t), nm[j]) < 0)
                return lrmoe_err_prefix("%s: layer %lld", c->weights,
                                        (long long)c->w.layer[i]);
        }
    }
    return 0;
}

/* Packed F32 copy of one layer's weights, made once per layer (not per
 * frame or call): expert e's block is [W_gate (F,D); W_up (F,D); W_down (D,F)]
 * so the backend runs gate and up as one GEMM with N = 2F. */
static int pack_f32(ctx_t *c, int64_t layer, const lrmoe_tensor_t *wg,
                    const lrmoe_tensor_t *wu, const lrmoe_tensor_t *wd)
{
    if (c->f32_layer == layer) return 0;
    drop_f32(c);
    const int64_t E = wg->shape[0];
    const size_t n = (size_t)(wg->shape[1] * wg->shape[2]);
    const size_t es = lrmoe_dtype_size(wg->dtype);
    c->f32 = malloc((size_t)E * 3 * n * sizeof(float));
    if (!c->f32)
        return lrmoe_err("weights layer %lld: out of memory for the F32 copy",
                         (long long)layer);
    for (int64_t e = 0; e < E; e++) {
        float *b = c->f32 + (size_t)e * 3 * n;
        lrmoe_convert_to_f32(wg->dtype, (const char *)wg->data + (size_t)e * n * es, b, n);
        lrmoe_convert_to_f32(wu->dtype, (const char *)wu->data + (size_t)e * n * es, b + n, n);
        lrmoe_convert_to_f32(wd->dtype, (const char *)wd->data + (size_t)e * n * es, b + 2 * n, n);
    }
    c->f32_layer = layer;
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

/* Output buffers are persistent in a real step: fault the (calloc'd) pages
 * in before the timed call. */
static void touch(lrmoe_tensor_t *t)
{
    if (t->data) memset(t->data, 0, t->nbytes);
}

static const lrmoe_dtype_t DT_ACT[2] = {LRMOE_BF16, LRMOE_F32};
static const lrmoe_dtype_t DT_F32[1] = {LRMOE_F32};
static const lrmoe_dtype_t DT_I32[1] = {LRMOE_I32};
static const lrmoe_dtype_t DT_I64[1] = {LRMOE_I64};
static const lrmoe_dtype_t DT_U8[2] = {LRMOE_U8, LRMOE_BOOL};

static int write_timings(ctx_t *c, lrmoe_frame_t *f, int64_t index, int64_t layer,
                         int P, const double *tim, double wall)
{
    const char *ph = c->backward ? "backward" : "forward";
    int crit = lrmoe_exec_critical(P, tim);
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
            if (s == LRMOE_NSTAGES && r == crit) ctot = v;
            len += (size_t)snprintf(buf + len, cap - len, "%s%.6g", r ? "," : "", v);
        }
        snprintf(key, sizeof key, "exec.%s.%s_s", ph,
                 s < LRMOE_NSTAGES ? lrmoe_exec_stage_name(s) : "total");
        if (lrmoe_frame_set_attr(f, key, buf) < 0) { free(buf); return -1; }
    }
    free(buf);
    snprintf(key, sizeof key, "exec.%s.critical_rank", ph);
    if (lrmoe_frame_set_attrf(f, key, "%d", crit) < 0) return -1;
    snprintf(key, sizeof key, "exec.%s.critical_s", ph);
    if (lrmoe_frame_set_attrf(f, key, "%.6g", ctot) < 0) return -1;
    snprintf(key, sizeof key, "exec.%s.wall_s", ph);
    if (lrmoe_frame_set_attrf(f, key, "%.6g", wall) < 0) return -1;
    if (lrmoe_frame_set_attrf(f, "exec.ranks", "%d", P) < 0 ||
        lrmoe_frame_set_attr(f, "exec.backend", lrmoe_backend_name(c->cfg.backend)) < 0)
        return -1;
    if (c->backward &&
        lrmoe_frame_set_attr(f, "exec.backward.mode", lrmoe_exec_mode_name(c->mode)) < 0)
        return -1;
    if (!c->tsv) return 0;
    if (!c->tsv_header) {
        fprintf(c->tsv, "frame\tlayer\tphase\tmode\trank");
        for (int s = 0; s < LRMOE_NSTAGES; s++) fprintf(c->tsv, "\t%s_s", lrmoe_exec_stage_name(s));
        fprintf(c->tsv, "\ttotal_s\tcritical\twall_s\n");
        c->tsv_header = 1;
    }
    for (int r = 0; r < P; r++) {
        double tot = 0;
        fprintf(c->tsv, "%lld\t%lld\t%s\t%s\t%d", (long long)index, (long long)layer, ph,
                c->backward ? lrmoe_exec_mode_name(c->mode) : "-", r);
        for (int s = 0; s < LRMOE_NSTAGES; s++) {
            fprintf(c->tsv, "\t%.6f", tim[r * LRMOE_NSTAGES + s]);
            tot += tim[r * LRMOE_NSTAGES + s];
        }
        fprintf(c->tsv, "\t%.6f\t%d\t%.6f\n", tot, r == crit, wall);
    }
    if (ferror(c->tsv)) return lrmoe_err("--timings: write error");
    return 0;
}

static int on_frame(lrmoe_frame_t *f, int64_t index, void *vctx)
{
    ctx_t *c = vctx;
    int64_t layer = 0;
    int k = lrmoe_frame_attr_i64(f, "layer", &layer);
    if (k < 0) return lrmoe_err("attribute layer: not an integer");
    if (load_weights(c) < 0) return -1;
    const lrmoe_frame_t *wf = lrmoe_weights_layer(&c->w, layer);
    if (!wf) return lrmoe_err("weights: no frame for layer %lld", (long long)layer);

    /* weights define E, F, D */
    lrmoe_tensor_t *wg = lrmoe_frame_need(wf, "w_gate"), *wu = lrmoe_frame_need(wf, "w_up"),
                   *wd = lrmoe_frame_need(wf, "w_down");
    if (!wg || !wu || !wd) return lrmoe_err_prefix("weights layer %lld", (long long)layer);
    if (wg->ndim != 3) return lrmoe_err("weights: w_gate must be [E,F,D]");
    const int64_t E = wg->shape[0], F = wg->shape[1], D = wg->shape[2];
    const int64_t efd[3] = {E, F, D}, edf[3] = {E, D, F};
    if (lrmoe_tensor_check(wu, 3, efd) < 0 || lrmoe_tensor_check(wd, 3, edf) < 0)
        return lrmoe_err_prefix("weights layer %lld", (long long)layer);
    if (wu->dtype != wg->dtype || wd->dtype != wg->dtype)
        return lrmoe_err("weights: w_gate, w_up, w_down have different dtypes");
    lrmoe_exec_weights_t W;
    memset(&W, 0, sizeof W);
    W.dtype = wg->dtype; W.w_gate = wg->data; W.w_up = wu->data; W.w_down = wd->data;
    if (c->cfg.backend == LRMOE_BACKEND_CPU &&
        (W.dtype == LRMOE_F32 || W.dtype == LRMOE_BF16)) {
        if (pack_f32(c, layer, wg, wu, wd) < 0) return -1;
        W.w_f32 = c->f32;
    }

    /* routing */
    const int64_t any2[2] = {-1, -1};
    lrmoe_tensor_t *ids = need(f, "topk_ids", 2, any2, 1, DT_I32);
    if (!ids) return -1;
    const int64_t T = ids->shape[0], K = ids->shape[1];
    const int64_t tk[2] = {T, K}, td[2] = {T, D};
    lrmoe_tensor_t *tw = need(f, "topk_weights", 2, tk, 1, DT_F32);
    if (!tw) return -1;
    lrmoe_tensor_t *lg = lrmoe_frame_get(f, "router_logits");
    if (lg && lg->ndim == 2 && lg->shape[1] != E)
        return lrmoe_err("weights have E=%lld experts but router_logits has %lld",
                         (long long)E, (long long)lg->shape[1]);

    /* plan */
    lrmoe_plan_t plan;
    lrmoe_plan_init(&plan);
    lrmoe_exec_plan_t XP = {NULL, NULL};
    /* ranks: the plan's, else --ranks, else (backward) pack_counts' rows or
     * the forward's exec.ranks, else 1 */
    int P = c->ranks;
    if (!P && c->backward) {
        lrmoe_tensor_t *pc = lrmoe_frame_get(f, "pack_counts");
        int64_t v = 0;
        if (c->mode == LRMOE_MODE_COMPACT && pc && pc->ndim == 2 && pc->shape[0] > 0 &&
            pc->shape[0] <= 4096)
            P = (int)pc->shape[0];
        else if (lrmoe_frame_attr_i64(f, "exec.ranks", &v) == 1 && v > 0 && v <= 4096)
            P = (int)v;
    }
    if (!P) P = 1;
    if (lrmoe_frame_get(f, "placement")) {
        if (lrmoe_plan_from_frame(f, &plan) < 0) {
            lrmoe_plan_free(&plan);
            return lrmoe_err_prefix("plan");
        }
        int64_t *load = calloc((size_t)plan.E, sizeof *load);
        if (!load) { lrmoe_plan_free(&plan); return lrmoe_err("out of memory"); }
        const int32_t *id = ids->data;
        int bad = 0;
        for (int64_t u = 0; u < T * K; u++) {
            if (id[u] < 0 || id[u] >= plan.E) { bad = 1; break; }
            load[id[u]]++;
        }
        int rc = 0;
        if (plan.E != E)
            rc = lrmoe_err("plan has E=%d experts but the weights have %lld", plan.E, (long long)E);
        else if (c->ranks && c->ranks != plan.P)
            rc = lrmoe_err("--ranks %d but the plan is for %d ranks", c->ranks, plan.P);
        else if (lrmoe_plan_check(&plan, bad ? NULL : load) < 0)
            rc = lrmoe_err_prefix("plan");
        free(load);
        if (rc < 0) { lrmoe_plan_free(&plan); return -1; }
        P = plan.P;
        XP.placement = plan.placement;
        XP.fwd_alloc = plan.fwd_alloc;
    }
    lrmoe_exec_dims_t dims = {T, E, K, D, F, P};
    double *tim = calloc((size_t)P * LRMOE_NSTAGES, sizeof *tim);
    int rc = -1;
    double wall = 0;
    if (!tim) { lrmoe_err("out of memory"); goto out; }
    const int64_t tkf[3] = {T, K, F}, tkd[3] = {T, K, D};

    if (!c->backward) {
        lrmoe_tensor_t *h = need(f, "hidden", 2, td, 2, DT_ACT);
        if (!h) goto out;
        lrmoe_dtype_t adt = h->dtype;
        lrmoe_exec_fwd_t a = {0};
        a.act_dtype = adt;
        a.hidden = h->data;
        a.topk_ids = ids->data;
        a.topk_weights = tw->data;
        lrmoe_tensor_t *o = lrmoe_frame_put(f, "output", adt, 2, td),
                       *pr = lrmoe_frame_put(f, "pair_rank", LRMOE_I32, 2, tk),
                       *pn = lrmoe_frame_put(f, "phi_sqnorm", LRMOE_F32, 2, tk),
                       *sg = lrmoe_frame_put(f, "saved_gate", adt, 3, tkf),
                       *su = lrmoe_frame_put(f, "saved_up", adt, 3, tkf),
                       *po = lrmoe_frame_put(f, "pair_out", adt, 3, tkd);
        if (!o || !pr || !pn || !sg || !su || !po) goto out;
        touch(o); touch(pr); touch(pn); touch(sg); touch(su); touch(po);
        a.output = o->data; a.pair_rank = pr->data; a.phi_sqnorm = pn->data;
        a.saved_gate = sg->data; a.saved_up = su->data; a.pair_out = po->data;
        double t0 = lrmoe_now();
        if (lrmoe_exec_forward(&c->cfg, &dims, &W, &XP, &a, tim) < 0) goto out;
        wall = lrmoe_now() - t0;
    } else {
        lrmoe_exec_bwd_t a = {0};
        a.mode = c->mode;
        lrmoe_tensor_t *g = need(f, "grad_output", 2, td, 2, DT_ACT);
        lrmoe_tensor_t *po = need(f, "pair_out", 3, tkd, 2, DT_ACT);
        if (!g || !po) goto out;
        a.act_dtype = po->dtype;
        a.grad_dtype = g->dtype;
        a.topk_ids = ids->data;
        a.topk_weights = tw->data;
        a.grad_output = g->data;
        a.pair_out = po->data;
        const lrmoe_dtype_t adt[1] = {po->dtype};
        if (c->mode != LRMOE_MODE_COMPACT) {
            lrmoe_tensor_t *h = need(f, "hidden", 2, td, 1, adt),
                           *pr = need(f, "pair_rank", 2, tk, 1, DT_I32),
                           *sg = need(f, "saved_gate", 3, tkf, 1, adt),
                           *su = need(f, "saved_up", 3, tkf, 1, adt);
            if (!h || !pr || !sg || !su) {
                lrmoe_err_prefix("backward %s", lrmoe_exec_mode_name(c->mode));
                goto out;
            }
            a.hidden = h->data; a.pair_rank = pr->data;
            a.saved_gate = sg->data; a.saved_up = su->data;
            if (c->mode == LRMOE_MODE_MASKED) {
                lrmoe_tensor_t *kp = need(f, "keep", 2, tk, 2, DT_U8);
                if (!kp) { lrmoe_err_prefix("backward masked"); goto out; }
                a.keep = kp->data;
            }
        } else {
            const int64_t any1[1] = {-1};
            lrmoe_tensor_t *pp = need(f, "pack_pair", 1, any1, 1, DT_I64);
            if (!pp) { lrmoe_err_prefix("backward compact"); goto out; }
            const int64_t R = pp->shape[0];
            const int64_t r1[1] = {R}, pe[2] = {P, E}, rd[2] = {R, D}, rf[2] = {R, F};
            lrmoe_tensor_t *pk = need(f, "pack_rank", 1, r1, 1, DT_I32),
                           *pc = need(f, "pack_counts", 2, pe, 1, DT_I64),
                           *pf = need(f, "pack_offsets", 2, pe, 1, DT_I64),
                           *pg = need(f, "pack_grad", 2, rd, 1, DT_F32),
                           *ph = need(f, "pack_hidden", 2, rd, 1, adt),
                           *pa = need(f, "pack_gate", 2, rf, 1, adt),
                           *pu = need(f, "pack_up", 2, rf, 1, adt);
            if (!pk || !pc || !pf || !pg || !ph || !pa || !pu) {
                lrmoe_err_prefix("backward compact");
                goto out;
            }
            a.R = R; a.pack_pair = pp->data; a.pack_rank = pk->data;
            a.pack_counts = pc->data; a.pack_offsets = pf->data; a.pack_grad = pg->data;
            a.pack_hidden = ph->data; a.pack_gate = pa->data; a.pack_up = pu->data;
        }
        const int64_t efd3[3] = {E, F, D}, edf3[3] = {E, D, F};
        lrmoe_tensor_t *gh = lrmoe_frame_put(f, "grad_hidden", LRMOE_F32, 2, td),
                       *gg = lrmoe_frame_put(f, "grad_w_gate", LRMOE_F32, 3, efd3),
                       *gu = lrmoe_frame_put(f, "grad_w_up", LRMOE_F32, 3, efd3),
                       *gd = lrmoe_frame_put(f, "grad_w_down", LRMOE_F32, 3, edf3),
                       *gt = lrmoe_frame_put(f, "grad_topk_weights", LRMOE_F32, 2, tk);
        if (!gh || !gg || !gu || !gd || !gt) goto out;
        touch(gh); touch(gg); touch(gu); touch(gd); touch(gt);
        a.grad_hidden = gh->data; a.grad_w_gate = gg->data; a.grad_w_up = gu->data;
        a.grad_w_down = gd->data; a.grad_topk_weights = gt->data;
        double t0 = lrmoe_now();
        if (lrmoe_exec_backward(&c->cfg, &dims, &W, &XP, &a, tim) < 0) goto out;
        wall = lrmoe_now() - t0;
    }
    if (write_timings(c, f, index, layer, P, tim, wall) < 0) goto out;
    rc = 0;
out:
    free(tim);
    lrmoe_plan_free(&plan);
    return rc;
}

enum { OPT_PHASE = 0x2000, OPT_WEIGHTS, OPT_MODE, OPT_BACKEND, OPT_TIMINGS, OPT_NONFINITE,
       OPT_CLOCK, OPT_GPUS, OPT_DEVICE, OPT_GEMM, OPT_GEMM_STREAMS };

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        LRMOE_STREAM_LONGOPTS,
        {"phase", required_argument, 0, OPT_PHASE},
        {"weights", required_argument, 0, OPT_WEIGHTS},
        {"ranks", required_argument, 0, 'P'},
        {"rank-threads", required_argument, 0, 'j'},
        {"mode", required_argument, 0, OPT_MODE},
        {"backend", required_argument, 0, OPT_BACKEND},
        {"timings", required_argument, 0, OPT_TIMINGS},
        {"allow-nonfinite", no_argument, 0, OPT_NONFINITE},
        {"clock", required_argument, 0, OPT_CLOCK},
        {"gpus", required_argument, 0, OPT_GPUS},
        {"device", required_argument, 0, OPT_DEVICE},
        {"gemm", required_argument, 0, OPT_GEMM},
        {"gemm-streams", required_argument, 0, OPT_GEMM_STREAMS},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0}};
    lrmoe_io_t io;
    lrmoe_io_init(&io);
    ctx_t c;
    memset(&c, 0, sizeof c);
    lrmoe_exec_cfg_default(&c.cfg);
    c.f32_layer = -1;
    const char *phase = NULL, *weights = NULL, *timings = NULL;
    int mode_set = 0, ch;
    int64_t v;
    while ((ch = getopt_long(argc, argv, LRMOE_STREAM_SHORTOPTS "P:j:hV", longopts, NULL)) != -1) {
        int r = lrmoe_io_opt(&io, ch, optarg);
        if (r > 0) continue;
        if (r < 0) goto usage_err;
        switch (ch) {
        case OPT_PHASE: phase = optarg; break;
        case OPT_WEIGHTS: weights = optarg; break;
        case 'P':
            if (lrmoe_parse_i64("--ranks", optarg, 1, 4096, &v) < 0) goto usage_err;
            c.ranks = (int)v;
            break;
        case 'j':
            if (lrmoe_parse_i64("--rank-threads", optarg, 1, 4096, &v) < 0) goto usage_err;
            c.cfg.rank_threads = (int)v;
            break;
        case OPT_MODE:
            if (lrmoe_exec_mode_parse(optarg, &c.mode) < 0) goto usage_err;
            mode_set = 1;
            break;
        case OPT_BACKEND:
            if (lrmoe_backend_parse(optarg, &c.cfg.backend) < 0) goto usage_err;
            break;
        case OPT_TIMINGS: timings = optarg; break;
        case OPT_GPUS:
            if (lrmoe_parse_i64("--gpus", optarg, 0, 4096, &v) < 0) goto usage_err;
            c.cfg.gpus = (int)v;
            break;
        case OPT_DEVICE:
            if (lrmoe_parse_i64("--device", optarg, 0, 4096, &v) < 0) goto usage_err;
            c.cfg.device = (int)v;
            break;
        case OPT_GEMM: {
            lrmoe_exec_gemm_t g;
            if (lrmoe_exec_gemm_parse(optarg, &g) < 0) {
                lrmoe_err_prefix("--gemm");
                goto usage_err;
            }
            c.cfg.gemm = (int)g;
            break;
        }
        case OPT_GEMM_STREAMS:
            if (lrmoe_parse_i64("--gemm-streams", optarg, 1, 8, &v) < 0) goto usage_err;
            c.cfg.gemm_streams = (int)v;
            break;
        case OPT_NONFINITE: c.cfg.allow_nonfinite = 1; break;
        case OPT_CLOCK:
            if (!strcmp(optarg, "cpu")) c.cfg.cpu_clock = 1;
            else if (strcmp(optarg, "wall")) {
                lrmoe_err("--clock: '%s' is not wall or cpu", optarg);
                goto usage_err;
            }
            break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("lrmoe-exec (lrmoe) %s\n", LRMOE_VERSION); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!phase || (strcmp(phase, "forward") && strcmp(phase, "backward"))) {
        lrmoe_err("--phase: %s", phase ? "must be forward or backward" : "required");
        goto usage_err;
    }
    c.backward = !strcmp(phase, "backward");
    if (mode_set && !c.backward) {
        lrmoe_err("--mode: only with --phase backward");
        goto usage_err;
    }
    if (!weights) { lrmoe_err("--weights: required"); goto usage_err; }
    if (argc - optind > 1) { lrmoe_err("at most one input FILE"); goto usage_err; }
    c.cfg.threads = io.w.threads;
    if (c.cfg.cpu_clock) {
        int per = c.cfg.rank_threads > 1 ? c.cfg.threads / c.cfg.rank_threads : c.cfg.threads;
        if (per != 1 && !(c.cfg.rank_threads > 1 && per < 1)) {
            lrmoe_err("--clock cpu: needs one BLAS thread per rank (-@ N -j N, or -@ 1)");
            goto usage_err;
        }
        if (c.cfg.backend != LRMOE_BACKEND_CPU) {
            lrmoe_err("--clock cpu: only with --backend cpu");
            goto usage_err;
        }
    }
    if (lrmoe_check_tty_out(io.out, io.force) < 0) goto usage_err;

    c.weights = weights;
    if (timings && !(c.tsv = lrmoe_tsv_open(timings))) {
        fprintf(stderr, "lrmoe-exec: %s: cannot open for writing\n", timings);
        return 1;
    }
    const char *in = optind < argc ? argv[optind] : "-";
    int rc = 0;
    if (lrmoe_filter_run(in, io.out, &io.w, on_frame, &c) < 0) {
        fprintf(stderr, "lrmoe-exec: %s\n", lrmoe_errmsg());
        rc = 1;
    }
    if (c.tsv && fclose(c.tsv) != 0 && !rc) {
        fprintf(stderr, "lrmoe-exec: %s: write error\n", timings);
        rc = 1;
    }
    drop_f32(&c);
    if (c.w_loaded) lrmoe_weights_free(&c.w);
    return rc;

usage_err:
    fprintf(stderr, "lrmoe-exec: %s\n", lrmoe_errmsg());
    usage(stderr);
    return 2;
}
