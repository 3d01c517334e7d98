/* mock-run: drive the CUDA backend's host logic (kernels/kcu.cu context,
 * gemm.cu, comm_nccl.cu) on tests/gpu/mock-cuda.c, for tests/cuda-mock.bats.
 *   mock-run loop     6 GEMMs over 4 side streams (MOCK_GEMM_FAIL=N fails one)
 *   mock-run grouped  five grouped calls of F32 and BF16 outputs
 *   mock-run cutlass  one --gemm cutlass call of the same 6 GEMMs
 *                     (MOCK_GEMM_MISALIGN=N: GEMM N's A off 16 bytes)
 *   mock-run comm     contexts on devices 0, 1, 1 and their communicator
 *   mock-run flags    the compact step's checking kernels, each reading its
 *                     check back, then deferred to one lrmoe_kcu_flags_check
 *   mock-run route    device-routing frames (one rank), then two under capture
 *   mock-run exec     a layer step at P ranks (MOCK_P, default 8) on P
 *                     (MOCK_GEMM_GROUPED=1: --gemm grouped)
 *                     devices, E = 128: the one-shot lrmoe_exec_forward and
 *                     _backward (marks oneshot_fwd, oneshot_bwd), then an
 *                     executor's forward and backward three times each
 *                     (marks fwd1..3, bwd1..3), then on one device with
 *                     device-pointer I/O (dfwd1..3, dbwd1..3); nothing is
 *                     computed (the
 *                     mock runs no kernel), the host logic and its waits are
 *                     what the log shows
 * Prints "rc=R" per call (and the error message when R < 0); the mock's log
 * ($MOCK_CUDA_LOG) is what the test reads. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lrmoe.h"
#include "kcu.h"
#include "comm_cuda.h"
#include "exec.h"

void mock_mark(const char *what);

static void show(const char *what, int rc)
{
    printf("%s rc=%d%s%s\n", what, rc, rc < 0 ? " err=" : "", rc < 0 ? lrmoe_errmsg() : "");
}

/* n GEMMs (m, n, k = 16) on fresh 16-byte aligned "device" buffers; every
 * second one with a BF16 output */
static int gemms(int n)
{
    /* MOCK_GEMM_MISALIGN=i: GEMM i's A starts 2 bytes in (cuBLAS fallback) */
    const char *mis = getenv("MOCK_GEMM_MISALIGN");
    int mi = mis ? atoi(mis) : -1;
    lrmoe_gemm_t g[8];
    memset(g, 0, sizeof g);
    void *buf[24];
    int rc = 0;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < 3; j++)
            if (lrmoe_kcu_alloc(&buf[3 * i + j], 16 * 16 * 4) < 0) return -1;
        lrmoe_gemm_t x = {16, 16, 16, 0, 0, buf[3 * i], buf[3 * i + 1], buf[3 * i + 2],
                          16, 16, 16, i % 2, 0.0f};
        if (i == mi) x.a = (const char *)x.a + 2;
        g[i] = x;
    }
    rc = lrmoe_kcu_gemm(n, g);
    for (int i = 0; i < 3 * n; i++) lrmoe_kcu_free(buf[i]);
    return rc;
}

/* The compact step's checking kernels (pair_score, select, pack_assign,
 * pack_unpack) on one context: marks immediate (each reads its check word
 * back) and deferred (lrmoe_kcu_flags_defer(1), one lrmoe_kcu_flags_check). */
static int flag_steps(void)
{
    enum { T = 64, K = 4, E = 8, D = 16, P = 2 };
    const int64_t N = T * K;
    lrmoe_kcu_ctx_t *c;
    show("create", lrmoe_kcu_ctx_create(0, 1, &c));
    show("use", lrmoe_kcu_use(c));
    void *g, *al, *sq, *sc, *ids, *q, *keep, *load, *alloc, *pair, *rank, *cnt, *off, *rows, *out;
    size_t sz[] = {T * D * 4, N * 4, N * 4, N * 4, N * 4, E * 8, N, E * 8, E * P * 8, N * 8,
                   N * 4, E * P * 8, E * P * 8, N * D * 4, T * D * 4};
    void **p[] = {&g, &al, &sq, &sc, &ids, &q, &keep, &load, &alloc, &pair, &rank, &cnt, &off,
                  &rows, &out};
    for (int i = 0; i < 15; i++) {
        if (lrmoe_kcu_alloc(p[i], sz[i]) < 0) return 1;
        memset(*p[i], 0, sz[i]);
    }
    for (int pass = 0; pass < 2; pass++) {
        mock_mark(pass ? "deferred" : "immediate");
        if (pass) show("defer", lrmoe_kcu_flags_defer(1));
        show("pair_score", lrmoe_kcu_pair_score(0 /* lrm */, T, K, D, g, al, sq, sc));
        show("select", lrmoe_kcu_select(T, K, E, ids, sc, q, keep, load));
        show("pack_assign", lrmoe_kcu_pack_assign(T, K, E, P, ids, keep, NULL, alloc, 0, pair,
                                                  rank, cnt, off));
        show("pack_unpack", lrmoe_kcu_pack_unpack(pair, 0, rows, D, T, K, out));
        if (pass) show("check", lrmoe_kcu_flags_defer(0));
    }
    mock_mark("destroy");
    lrmoe_kcu_ctx_destroy(c);
    mock_mark("end");
    return 0;
}

/* zeroed host arrays of one layer step */
static void *z(size_t n) { return calloc(n ? n : 1, 1); }

/* BF16 weights, a forward's and a full backward's arrays of shape d, all
 * zeroed (the backward reads the forward's saved state and routing) */
static void step_arrays(const lrmoe_exec_dims_t *d, lrmoe_exec_weights_t *w,
                        lrmoe_exec_fwd_t *f, lrmoe_exec_bwd_t *b)
{
    const int64_t T = d->T, K = d->K, E = d->E, D = d->D, F = d->F, M = T * K;
    memset(w, 0, sizeof *w);
    w->dtype = LRMOE_BF16;
    w->w_gate = z((size_t)(E * F * D) * 2);
    w->w_up = z((size_t)(E * F * D) * 2);
    w->w_down = z((size_t)(E * F * D) * 2);
    memset(f, 0, sizeof *f);
    f->act_dtype = LRMOE_BF16;
    f->hidden = z((size_t)(T * D) * 2);
    f->topk_ids = z((size_t)M * 4);
    f->topk_weights = z((size_t)M * 4);
    f->output = z((size_t)(T * D) * 2);
    f->pair_rank = z((size_t)M * 4);
    f->phi_sqnorm = z((size_t)M * 4);
    f->saved_gate = z((size_t)(M * F) * 2);
    f->saved_up = z((size_t)(M * F) * 2);
    f->pair_out = z((size_t)(M * D) * 2);
    memset(b, 0, sizeof *b);
    b->mode = LRMOE_MODE_FULL;
    b->act_dtype = LRMOE_BF16;
    b->grad_dtype = LRMOE_BF16;
    b->hidden = f->hidden;
    b->topk_ids = f->topk_ids;
    b->topk_weights = f->topk_weights;
    b->pair_rank = f->pair_rank;
    b->saved_gate = f->saved_gate;
    b->saved_up = f->saved_up;
    b->pair_out = f->pair_out;
    b->grad_output = z((size_t)(T * D) * 2);
    b->grad_hidden = z((size_t)(T * D) * 4);
    b->grad_w_gate = z((size_t)(E * F * D) * 4);
    b->grad_w_up = z((size_t)(E * F * D) * 4);
    b->grad_w_down = z((size_t)(E * F * D) * 4);
    b->grad_topk_weights = z((size_t)M * 4);
}

/* three forward and backward frames on x, marked PREfwdI and PREbwdI */
static void frames(lrmoe_exec_cuda_t *x, const char *pre, const lrmoe_exec_cfg_t *cfg,
                   const lrmoe_exec_dims_t *d, const lrmoe_exec_weights_t *w,
                   lrmoe_exec_fwd_t *f, lrmoe_exec_bwd_t *b, double *tim)
{
    char m[16];
    for (int i = 1; i <= 3; i++) {
        snprintf(m, sizeof m, "%sfwd%d", pre, i);
        mock_mark(m);
        show(m, lrmoe_exec_cuda_forward(x, cfg, d, w, NULL, f, tim));
        snprintf(m, sizeof m, "%sbwd%d", pre, i);
        mock_mark(m);
        show(m, lrmoe_exec_cuda_backward(x, cfg, d, w, NULL, b, tim));
    }
}

static int exec_steps(void)
{
    const char *ps = getenv("MOCK_P");
    int P = ps ? atoi(ps) : 8;
    lrmoe_exec_dims_t d = {256, 128, 8, 64, 32, P};
    const int64_t T = d.T, K = d.K, E = d.E, D = d.D, M = T * K;
    lrmoe_exec_cfg_t cfg;
    lrmoe_exec_cfg_default(&cfg);
    cfg.backend = LRMOE_BACKEND_CUDA;
    cfg.allow_nonfinite = 1; /* the mock's "device" results are not computed */
    if (getenv("MOCK_GEMM_GROUPED")) cfg.gemm = LRMOE_EXEC_GEMM_GROUPED;
    lrmoe_exec_weights_t w;
    lrmoe_exec_fwd_t f;
    lrmoe_exec_bwd_t b;
    step_arrays(&d, &w, &f, &b);
    int32_t *ids = (int32_t *)f.topk_ids;
    float *tw = (float *)f.topk_weights;
    for (int64_t u = 0; u < M; u++) { ids[u] = (int32_t)((u * 37 + u / K) % E); tw[u] = 0.125f; }
    for (int64_t t = 0; t < T; t++) /* distinct experts per token */
        for (int64_t k = 0; k < K; k++) ids[t * K + k] = (int32_t)((t * 5 + k * 16) % E);
    double *tim = z((size_t)P * LRMOE_NSTAGES * sizeof(double));
    mock_mark("oneshot_fwd");
    show("oneshot_fwd", lrmoe_exec_forward(&cfg, &d, &w, NULL, &f, tim));
    mock_mark("oneshot_bwd");
    show("oneshot_bwd", lrmoe_exec_backward(&cfg, &d, &w, NULL, &b, tim));
#ifndef MOCK_ONESHOT_ONLY /* -DMOCK_ONESHOT_ONLY: for sources before the executor */
    lrmoe_exec_cuda_t *x = NULL;
    mock_mark("new");
    show("new", lrmoe_exec_cuda_new(&cfg, P, &x));
    if (!x) return 1;
    frames(x, "", &cfg, &d, &w, &f, &b, tim);
    /* device-pointer I/O on a stream of the caller ("device" memory is host
     * memory here) */
    mock_mark("free");
    lrmoe_exec_cuda_free(x);
    cfg.gpus = 1; /* device I/O: every rank on the pointers' device */
    mock_mark("set_io");
    show("new1", lrmoe_exec_cuda_new(&cfg, P, &x));
    if (!x) return 1;
    show("set_io", lrmoe_exec_cuda_set_io(x, 1, NULL));
    frames(x, "d", &cfg, &d, &w, &f, &b, tim);
    /* the backward's scores on the device (lrmoe.torch's CUDA path), for
     * each metric with a device kernel: lrm, gradnorm, absgrad (the last
     * two read no alpha or phi_sqnorm: NULL) */
    float *score = z((size_t)M * 4);
    static const char *const dsc[] = {"dscore_lrm", "dscore_gradnorm", "dscore_absgrad"};
    for (int m = 0; m < 3; m++) {
        mock_mark(dsc[m]);
        show(dsc[m], lrmoe_exec_cuda_score(x, m, T, (int)K, D, LRMOE_BF16, b.grad_output,
                                           m ? NULL : tw, m ? NULL : f.phi_sqnorm, score));
    }
    if (getenv("MOCK_CAPTURE_AT_END")) { /* a frame under graph capture: refused */
        setenv("MOCK_CAPTURING", "1", 1);
        mock_mark("capture");
        show("capture_fwd", lrmoe_exec_cuda_forward(x, &cfg, &d, &w, NULL, &f, tim));
        unsetenv("MOCK_CAPTURING");
    }
    mock_mark("free");
    lrmoe_exec_cuda_free(x);
#endif
    mock_mark("end");
    return 0;
}

/* Device routing (lrmoe_exec_cuda_set_io(x, 2, NULL), one rank): three
 * forward and backward frames, then one of each under a (mock) CUDA graph
 * capture; topk_ids and topk_weights are "device" arrays here too. */
static int route_steps(void)
{
    lrmoe_exec_dims_t d = {256, 128, 8, 64, 32, 1};
    const int64_t E = d.E, D = d.D, F = d.F;
    lrmoe_exec_cfg_t cfg;
    lrmoe_exec_cfg_default(&cfg);
    cfg.backend = LRMOE_BACKEND_CUDA;
    cfg.gpus = 1;
    lrmoe_exec_weights_t w;
    lrmoe_exec_fwd_t f;
    lrmoe_exec_bwd_t b;
    step_arrays(&d, &w, &f, &b);
    lrmoe_exec_cuda_t *x = NULL;
    mock_mark("new");
    show("new", lrmoe_exec_cuda_new(&cfg, 1, &x));
    if (!x) return 1;
    show("set_io", lrmoe_exec_cuda_set_io(x, 2, NULL));
    frames(x, "r", &cfg, &d, &w, &f, &b, NULL);
    setenv("MOCK_CAPTURING", "1", 1);
    mock_mark("cfwd");
    show("cfwd", lrmoe_exec_cuda_forward(x, &cfg, &d, &w, NULL, &f, NULL));
    mock_mark("cbwd");
    show("cbwd", lrmoe_exec_cuda_backward(x, &cfg, &d, &w, NULL, &b, NULL));
    unsetenv("MOCK_CAPTURING");
    mock_mark("after");
    show("after", lrmoe_exec_cuda_forward(x, &cfg, &d, &w, NULL, &f, NULL));
    /* weights not resident yet: refused under capture, before queueing */
    lrmoe_exec_weights_t w2 = w;
    w2.w_gate = z((size_t)(E * F * D) * 2);
    setenv("MOCK_CAPTURING", "1", 1);
    mock_mark("cnew");
    show("cnew", lrmoe_exec_cuda_forward(x, &cfg, &d, &w2, NULL, &f, NULL));
    unsetenv("MOCK_CAPTURING");
    mock_mark("free");
    lrmoe_exec_cuda_free(x);
    mock_mark("end");
    return 0;
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "";
    lrmoe_kcu_ctx_t *c[3] = {NULL, NULL, NULL};
    if (!strcmp(what, "loop") || !strcmp(what, "grouped") || !strcmp(what, "cutlass")) {
        mock_mark("create");
        show("create", lrmoe_kcu_ctx_create(0, 4, &c[0]));
        show("use", lrmoe_kcu_use(c[0]));
        lrmoe_kcu_set_gemm(c[0], what[0] == 'g' ? LRMOE_GEMM_GROUPED
                                 : what[0] == 'c' ? LRMOE_GEMM_CUTLASS : LRMOE_GEMM_LOOP);
        for (int call = 0; call < (what[0] == 'g' ? 5 : 1); call++) {
            mock_mark("gemm");
            show("gemm", gemms(6));
        }
        mock_mark("destroy");
        lrmoe_kcu_ctx_destroy(c[0]);
        mock_mark("end");
        return 0;
    }
    if (!strcmp(what, "comm")) {
        int dev[3] = {0, 1, 1};
        mock_mark("create");
        for (int r = 0; r < 3; r++) show("create", lrmoe_kcu_ctx_create(dev[r], 1, &c[r]));
        lrmoe_comm_t comm;
        mock_mark("comm");
        int rc = lrmoe_comm_cuda_init(&comm, 3, c, -1);
        show("comm", rc);
        if (rc == 0) printf("nccl=%d\n", lrmoe_comm_cuda_is_nccl(&comm));
        mock_mark("destroy");
        if (rc == 0) lrmoe_comm_free(&comm);
        for (int r = 0; r < 3; r++) lrmoe_kcu_ctx_destroy(c[r]);
        mock_mark("end");
        return 0;
    }
    if (!strcmp(what, "exec")) return exec_steps();
    if (!strcmp(what, "flags")) return flag_steps();
    if (!strcmp(what, "route")) return route_steps();
    fprintf(stderr, "usage: mock-run loop|grouped|cutlass|comm|exec|flags|route\n");
    return 2;
}
