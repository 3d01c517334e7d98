/* devio-test: the CUDA executor's device-pointer entry (lrmoe_exec_cuda_set_io,
 * through the named-argument calls lrmoe.torch uses: lrmoe_exec_args_cuda_new,
 * _forward_cuda, _backward_cuda) against its host-pointer frames, which
 * tests/gpu/check-gpu.sh compares with the CPU backend.
 *
 * One layer, P = 4 ranks of this process (one device: --gpus 1), E = 16,
 * a plan with split experts and replicas, BF16 activations and weights:
 * forward, backward full and masked, each on a host-I/O executor and on a
 * device-I/O executor fed device copies of the same inputs on a stream of
 * the test's own; every output must be bitwise equal (the same kernels run
 * on the same rows; only where the rows come from and go to differs). The
 * device-I/O frames run twice each (the second reuses the first's staging
 * after the one host wait at its start).
 *
 * Built two ways: by make with nvcc like the other tests/gpu programs,
 * against liblrmoe.a (the kernels linked in) and cudart, for the GPU
 * (tests/gpu/device-check.sh's devio step); as plain C++ by
 * tests/gpu/build-fake.sh against the kernels' CPU references
 * (tests/gpu/fake-kcu.c, tests/cuda.bats), where "device memory" is host
 * memory.
 * Prints "devio: PASS" or the first difference; exit 0/1 (3: no GPU). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
extern "C" {
#include "api.h"
#include "exec.h"
#include "lrmoe.h"
}

#ifdef __CUDACC__ /* nvcc (make, the device check): real device memory */
#define DEVIO_CUDA 1
#endif
#ifdef DEVIO_CUDA
#include <cuda_runtime.h>
static void *stream;
static void *dput(const void *h, size_t n)
{
    void *d = NULL;
    if (cudaMalloc(&d, n ? n : 16) != cudaSuccess) { fprintf(stderr, "devio: cudaMalloc\n"); exit(1); }
    if (h && cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) != cudaSuccess) exit(1);
    if (!h && cudaMemset(d, 0xFF, n ? n : 16) != cudaSuccess) exit(1);
    return d;
}
static void dget(void *h, const void *d, size_t n)
{
    if (cudaStreamSynchronize((cudaStream_t)stream) != cudaSuccess ||
        cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) != cudaSuccess) {
        fprintf(stderr, "devio: copy back failed\n");
        exit(1);
    }
}
static void dfree(void *d) { cudaFree(d); }
static void stream_new(void)
{
    cudaStream_t s;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        printf("devio: NOT RUN (no CUDA device)\n");
        exit(3);
    }
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) exit(1);
    stream = s;
}
#else
static void *stream;
static void *dput(const void *h, size_t n)
{
    void *d = malloc(n ? n : 16);
    if (!d) exit(1);
    if (h) memcpy(d, h, n);
    else memset(d, 0xFF, n);
    return d;
}
static void dget(void *h, const void *d, size_t n) { memcpy(h, d, n); }
static void dfree(void *d) { free(d); }
static void stream_new(void) { stream = NULL; }
#endif

enum { T = 97, E = 16, K = 4, D = 32, F = 24, P = 4 };
#define M (T * K)

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)rs; }
static uint16_t bf(float f) { uint32_t u; memcpy(&u, &f, 4); return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16); }
static float unif(void) { return (float)(rnd() % 2001) / 1000.0f - 1.0f; }
static void *bfrand(size_t n, float scale)
{
    uint16_t *p = (uint16_t *)malloc(n * 2);
    for (size_t i = 0; i < n; i++) p[i] = bf(unif() * scale);
    return p;
}

static int fails;
static void same(const char *what, const void *a, const void *b, size_t n)
{
    if (!memcmp(a, b, n)) return;
    const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    size_t i = 0;
    while (x[i] == y[i]) i++;
    printf("devio: FAIL %s differs at byte %zu of %zu\n", what, i, n);
    fails++;
}

#define CK(x) do { if ((x) < 0) { printf("devio: FAIL %s: %s\n", #x, lrmoe_errmsg()); return 1; } } while (0)

static int setp(lrmoe_exec_args_t *a, const char *n, const void *p)
{
    return lrmoe_exec_args_set_ptr(a, n, p);
}

/* one side's arguments: the layer's shape on p ranks, BF16 throughout,
 * one GPU; NULL after printing the failure */
static lrmoe_exec_args_t *args_new(int p, int gemm)
{
    lrmoe_exec_args_t *a = lrmoe_exec_args_new();
    const char *k[] = {"backend", "gpus", "gemm", "T", "E", "K", "D", "F", "P",
                       "weights_dtype", "act_dtype", "grad_dtype"};
    const int64_t v[] = {LRMOE_BACKEND_CUDA, 1, gemm, T, E, K, D, F, p,
                         LRMOE_BF16, LRMOE_BF16, LRMOE_BF16};
    for (size_t i = 0; a && i < sizeof k / sizeof *k; i++)
        if (lrmoe_exec_args_set(a, k[i], v[i]) < 0) {
            printf("devio: FAIL setting %s: %s\n", k[i], lrmoe_errmsg());
            return NULL;
        }
    return a;
}

/* one side's weights and hidden rows (host or device arrays) */
static int layer_set(lrmoe_exec_args_t *a, const void *wg, const void *wu, const void *wd,
                     const void *hid)
{
    return setp(a, "w_gate", wg) < 0 || setp(a, "w_up", wu) < 0 || setp(a, "w_down", wd) < 0 ||
           setp(a, "hidden", hid) < 0 ? -1 : 0;
}

/* one side's forward outputs (host arrays, or device ones poisoned) */
struct fwd_out { void *out, *sg, *su, *po, *sq; };
static fwd_out fwd_new(int dev)
{
    const size_t HB = (size_t)T * D * 2, SB = (size_t)M * F * 2, PB = (size_t)M * D * 2;
    if (dev) return fwd_out{dput(NULL, HB), dput(NULL, SB), dput(NULL, SB), dput(NULL, PB), dput(NULL, M * 4)};
    return fwd_out{malloc(HB), malloc(SB), malloc(SB), malloc(PB), malloc(M * 4)};
}
static int fwd_set(lrmoe_exec_args_t *a, const fwd_out &o)
{
    return setp(a, "output", o.out) < 0 || setp(a, "phi_sqnorm", o.sq) < 0 ||
           setp(a, "saved_gate", o.sg) < 0 || setp(a, "saved_up", o.su) < 0 ||
           setp(a, "pair_out", o.po) < 0 ? -1 : 0;
}
/* the device side's outputs against the host side's, bitwise */
static void fwd_same(const char *tag, const fwd_out &h, const fwd_out &d)
{
    const size_t HB = (size_t)T * D * 2, SB = (size_t)M * F * 2, PB = (size_t)M * D * 2;
    void *g = malloc(PB);
    char w[64];
    snprintf(w, sizeof w, "%soutput", tag); dget(g, d.out, HB); same(w, h.out, g, HB);
    snprintf(w, sizeof w, "%sphi_sqnorm", tag); dget(g, d.sq, M * 4); same(w, h.sq, g, M * 4);
    snprintf(w, sizeof w, "%ssaved_gate", tag); dget(g, d.sg, SB); same(w, h.sg, g, SB);
    snprintf(w, sizeof w, "%ssaved_up", tag); dget(g, d.su, SB); same(w, h.su, g, SB);
    snprintf(w, sizeof w, "%spair_out", tag); dget(g, d.po, PB); same(w, h.po, g, PB);
    free(g);
}

/* one side's backward outputs, and its inputs from a forward's saved state */
struct bwd_out { void *gh, *gg, *gu, *gd, *gt; };
static bwd_out bwd_new(int dev)
{
    const size_t HB = (size_t)T * D * 2, GW = (size_t)E * F * D * 4;
    if (dev) return bwd_out{dput(NULL, HB * 2), dput(NULL, GW), dput(NULL, GW), dput(NULL, GW), dput(NULL, M * 4)};
    return bwd_out{malloc(HB * 2), malloc(GW), malloc(GW), malloc(GW), malloc(M * 4)};
}
static int bwd_set(lrmoe_exec_args_t *a, const void *gout, const fwd_out &saved, const bwd_out &o)
{
    return setp(a, "grad_output", gout) < 0 || setp(a, "saved_gate", saved.sg) < 0 ||
           setp(a, "saved_up", saved.su) < 0 || setp(a, "pair_out", saved.po) < 0 ||
           setp(a, "grad_hidden", o.gh) < 0 || setp(a, "grad_w_gate", o.gg) < 0 ||
           setp(a, "grad_w_up", o.gu) < 0 || setp(a, "grad_w_down", o.gd) < 0 ||
           setp(a, "grad_topk_weights", o.gt) < 0 ? -1 : 0;
}
static void bwd_same(const char *tag, const bwd_out &h, const bwd_out &d)
{
    const size_t HB = (size_t)T * D * 2, GW = (size_t)E * F * D * 4;
    void *g = malloc(GW > HB * 2 ? GW : HB * 2);
    char w[64];
    snprintf(w, sizeof w, "%sgrad_hidden", tag); dget(g, d.gh, HB * 2); same(w, h.gh, g, HB * 2);
    snprintf(w, sizeof w, "%sgrad_w_gate", tag); dget(g, d.gg, GW); same(w, h.gg, g, GW);
    snprintf(w, sizeof w, "%sgrad_w_up", tag); dget(g, d.gu, GW); same(w, h.gu, g, GW);
    snprintf(w, sizeof w, "%sgrad_w_down", tag); dget(g, d.gd, GW); same(w, h.gd, g, GW);
    snprintf(w, sizeof w, "%sgrad_topk_weights", tag); dget(g, d.gt, M * 4); same(w, h.gt, g, M * 4);
    free(g);
}
#ifdef DEVIO_CUDA
/* a device side's backward outputs copied to the host */
static bwd_out bwd_get(const bwd_out &d)
{
    const size_t HB = (size_t)T * D * 2, GW = (size_t)E * F * D * 4;
    bwd_out h = bwd_new(0);
    dget(h.gh, d.gh, HB * 2); dget(h.gg, d.gg, GW); dget(h.gu, d.gu, GW); dget(h.gd, d.gd, GW);
    dget(h.gt, d.gt, M * 4);
    return h;
}
/* a device side's backward outputs overwritten with NaN bytes */
static int bwd_poison(const bwd_out &d)
{
    const size_t HB = (size_t)T * D * 2, GW = (size_t)E * F * D * 4;
    return cudaMemset(d.gh, 0xFF, HB * 2) != cudaSuccess || cudaMemset(d.gg, 0xFF, GW) != cudaSuccess ||
           cudaMemset(d.gu, 0xFF, GW) != cudaSuccess || cudaMemset(d.gd, 0xFF, GW) != cudaSuccess ||
           cudaMemset(d.gt, 0xFF, M * 4) != cudaSuccess ? -1 : 0;
}
#endif
/* a forward's saved state copied to the device */
static fwd_out saved_dev(const fwd_out &h)
{
    const size_t SB = (size_t)M * F * 2, PB = (size_t)M * D * 2;
    return fwd_out{NULL, dput(h.sg, SB), dput(h.su, SB), dput(h.po, PB), NULL};
}

/* Device routing (lrmoe_exec_cuda_set_io(x, 2, s): topk_ids, topk_weights
 * on the device, the layout computed there, one rank) against host I/O on
 * one rank, forward and full backward, each twice; on a GPU the host-I/O
 * executor runs --gemm cutlass too (the same kernel over the same rows),
 * and a forward captured into a CUDA graph, replayed on new routing written
 * into the same device arrays, must equal an uncaptured frame on that
 * routing; likewise a captured full backward replayed after the gradient
 * changed in place. Returns 0 (pass), 1 (fail), 3 (not run: no CUTLASS
 * GEMM here). */
static int devroute(const int32_t *ids, const float *tw, void *hid, void *wg, void *wu, void *wd,
                    void *gout)
{
    const size_t WB = (size_t)E * F * D * 2, HB = (size_t)T * D * 2;
#ifdef DEVIO_CUDA
    const int gemm = LRMOE_EXEC_GEMM_CUTLASS;
#else
    const int gemm = LRMOE_EXEC_GEMM_LOOP;
#endif
    lrmoe_exec_args_t *ah = args_new(1, gemm), *ag = args_new(1, gemm);
    if (!ah || !ag) return 1;
    fwd_out hf = fwd_new(0), df = fwd_new(1);
    int32_t *prh = (int32_t *)malloc(M * 4);
    CK(setp(ah, "topk_ids", ids)); CK(setp(ah, "topk_weights", tw));
    CK(layer_set(ah, wg, wu, wd, hid)); CK(setp(ah, "pair_rank", prh)); CK(fwd_set(ah, hf));
    void *d_ids = dput(ids, M * 4), *d_tw = dput(tw, M * 4);
    void *d_wg = dput(wg, WB), *d_wu = dput(wu, WB), *d_wd = dput(wd, WB), *d_hid = dput(hid, HB);
    void *d_gout = dput(gout, HB);
    CK(setp(ag, "topk_ids", d_ids)); CK(setp(ag, "topk_weights", d_tw));
    CK(layer_set(ag, d_wg, d_wu, d_wd, d_hid)); CK(setp(ag, "pair_rank", NULL)); CK(fwd_set(ag, df));
    lrmoe_exec_cuda_t *xh, *xg;
    CK(lrmoe_exec_args_cuda_new(ah, &xh));
    CK(lrmoe_exec_args_cuda_new(ag, &xg));
    CK(lrmoe_exec_cuda_set_io(xg, 2, stream));
    CK(lrmoe_exec_args_forward_cuda(ah, xh, NULL));
    if (lrmoe_exec_args_forward_cuda(ag, xg, NULL) < 0) {
        if (strstr(lrmoe_errmsg(), "CUTLASS")) {
            printf("devio: device routing NOT RUN: %s\n", lrmoe_errmsg());
            return 3;
        }
        printf("devio: FAIL device-routing forward: %s\n", lrmoe_errmsg());
        return 1;
    }
    CK(lrmoe_exec_args_forward_cuda(ag, xg, NULL));
    fwd_same("routed ", hf, df);
    /* full backward on the host forward's saved state */
    bwd_out hb = bwd_new(0), db = bwd_new(1);
    CK(bwd_set(ah, gout, hf, hb));
    CK(bwd_set(ag, d_gout, saved_dev(hf), db));
    CK(lrmoe_exec_args_backward_cuda(ah, xh, NULL));
    for (int rep = 0; rep < 2; rep++) CK(lrmoe_exec_args_backward_cuda(ag, xg, NULL));
    bwd_same("routed ", hb, db);
    /* an expert id out of range: found on the device and reported by the
     * next frame (the frame itself stays in bounds); the fake device's
     * references check at once, failing the frame itself */
    int32_t *bad = (int32_t *)malloc(M * 4);
    memcpy(bad, ids, M * 4);
    bad[5] = E + 3;
    void *d_bad = dput(bad, M * 4);
    CK(setp(ag, "topk_ids", d_bad));
    int rc1 = lrmoe_exec_args_forward_cuda(ag, xg, NULL);
    CK(setp(ag, "topk_ids", d_ids));
    int rc2 = rc1 < 0 ? rc1 : lrmoe_exec_args_forward_cuda(ag, xg, NULL);
    if (rc2 >= 0 || !strstr(lrmoe_errmsg(), "out of range")) {
        printf("devio: FAIL an expert id out of range was not reported (%d %d: %s)\n", rc1, rc2,
               lrmoe_errmsg());
        fails++;
    }
    CK(lrmoe_exec_args_forward_cuda(ag, xg, NULL)); /* reported once: the next frame runs */
#ifdef DEVIO_CUDA
    {
        /* capture one forward, replay it on other routing in the same arrays */
        cudaStream_t cs = (cudaStream_t)stream;
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        if (cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return 1;
        int rc = lrmoe_exec_args_forward_cuda(ag, xg, NULL);
        cudaError_t e = cudaStreamEndCapture(cs, &graph);
        if (rc < 0 || e != cudaSuccess) {
            printf("devio: FAIL capturing a device-routing forward: %s / %s\n", lrmoe_errmsg(),
                   cudaGetErrorString(e));
            return 1;
        }
        if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
            printf("devio: FAIL cudaGraphInstantiate\n");
            return 1;
        }
        int32_t *ids2 = (int32_t *)malloc(M * 4);
        for (int u = 0; u < M; u++) ids2[u] = (ids[u] * 5 + u / K) % E;
        for (int t = 0; t < T; t++) /* distinct experts per token */
            for (int k = 0; k < K; k++) ids2[t * K + k] = (ids2[t * K] + k * 3) % E;
        void *ref = malloc(HB), *g = malloc(HB);
        if (cudaMemcpy(d_ids, ids2, M * 4, cudaMemcpyHostToDevice) != cudaSuccess) return 1;
        CK(lrmoe_exec_args_forward_cuda(ag, xg, NULL));
        dget(ref, df.out, HB);
        if (cudaMemset(df.out, 0xFF, HB) != cudaSuccess || cudaGraphLaunch(exec, cs) != cudaSuccess)
            return 1;
        dget(g, df.out, HB);
        same("graph replay on new routing", ref, g, HB);
        CK(lrmoe_exec_args_forward_cuda(ag, xg, NULL)); /* the replay's checks, outside */
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        printf("devio: CUDA graph of a device-routing forward replayed on new routing\n");
        /* and a full backward: captured on this routing, replayed after the
         * gradient changes in place, against an uncaptured frame on it */
        cudaGraph_t gb;
        cudaGraphExec_t eb;
        if (cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return 1;
        rc = lrmoe_exec_args_backward_cuda(ag, xg, NULL);
        e = cudaStreamEndCapture(cs, &gb);
        if (rc < 0 || e != cudaSuccess || cudaGraphInstantiate(&eb, gb, 0) != cudaSuccess) {
            printf("devio: FAIL capturing a device-routing backward: %s / %s\n", lrmoe_errmsg(),
                   cudaGetErrorString(e));
            return 1;
        }
        uint16_t *g2 = (uint16_t *)malloc(HB);
        dget(g2, d_gout, HB);
        for (size_t i = 0; i < HB / 2; i++) g2[i] ^= (uint16_t)(i % 3 == 0 ? 0x8000 : 0); /* signs */
        if (cudaMemcpy(d_gout, g2, HB, cudaMemcpyHostToDevice) != cudaSuccess) return 1;
        CK(lrmoe_exec_args_backward_cuda(ag, xg, NULL));
        bwd_out rb = bwd_get(db);
        if (bwd_poison(db) < 0 || cudaGraphLaunch(eb, cs) != cudaSuccess) return 1;
        bwd_same("backward graph replay ", rb, db);
        CK(lrmoe_exec_args_backward_cuda(ag, xg, NULL));
        free(g2); free(rb.gh); free(rb.gg); free(rb.gu); free(rb.gd); free(rb.gt);
        cudaGraphExecDestroy(eb);
        cudaGraphDestroy(gb);
        printf("devio: CUDA graph of a device-routing backward replayed on a new gradient\n");
    }
#endif
    lrmoe_exec_cuda_free(xh);
    lrmoe_exec_cuda_free(xg);
    lrmoe_exec_args_free(ah);
    lrmoe_exec_args_free(ag);
    return fails ? 1 : 0;
}

int main(void)
{
    stream_new();
    /* inputs: distinct experts per token, a plan splitting every expert
     * between its native rank and the next (a replica there) */
    int32_t *ids = (int32_t *)malloc(M * 4);
    float *tw = (float *)malloc(M * 4);
    for (int t = 0; t < T; t++) {
        int base = (int)(rnd() % E);
        for (int k = 0; k < K; k++) {
            ids[t * K + k] = (base + k * 3) % E;
            tw[t * K + k] = 0.25f + (float)(rnd() % 100) / 400.0f;
        }
    }
    int64_t n_e[E] = {0}, alloc[E * P];
    uint8_t place[E * P];
    for (int u = 0; u < M; u++) n_e[ids[u]]++;
    memset(alloc, 0, sizeof alloc);
    memset(place, 0, sizeof place);
    for (int e = 0; e < E; e++) {
        int nat = lrmoe_exec_native(e, E, P), nx = (nat + 1) % P;
        alloc[e * P + nat] = n_e[e] - n_e[e] / 3;
        alloc[e * P + nx] = n_e[e] / 3;
        place[e * P + nat] = place[e * P + nx] = 1;
    }
    void *hid = bfrand((size_t)T * D, 1.0f);
    void *wg = bfrand((size_t)E * F * D, 0.2f), *wu = bfrand((size_t)E * F * D, 0.2f),
         *wd = bfrand((size_t)E * D * F, 0.2f);
    void *gout = bfrand((size_t)T * D, 1.0f);
    uint8_t *keep = (uint8_t *)malloc(M);
    for (int u = 0; u < M; u++) keep[u] = rnd() % 4 != 0;

    /* the two executors' arguments: h host, g device */
    lrmoe_exec_args_t *ah = args_new(P, LRMOE_EXEC_GEMM_LOOP), *ag = args_new(P, LRMOE_EXEC_GEMM_LOOP);
    if (!ah || !ag) return 1;
    lrmoe_exec_args_t *both[2] = {ah, ag};
    for (int i = 0; i < 2; i++) {
        lrmoe_exec_args_t *a = both[i];
        CK(setp(a, "topk_ids", ids)); CK(setp(a, "topk_weights", tw));
        CK(setp(a, "placement", place)); CK(setp(a, "fwd_alloc", alloc));
    }
    const size_t WB = (size_t)E * F * D * 2, HB = (size_t)T * D * 2;
    /* host side */
    fwd_out hf = fwd_new(0), df = fwd_new(1);
    int32_t *prh = (int32_t *)malloc(M * 4), *prg = (int32_t *)malloc(M * 4);
    CK(layer_set(ah, wg, wu, wd, hid)); CK(setp(ah, "pair_rank", prh)); CK(fwd_set(ah, hf));
    /* device side: the same inputs copied, outputs poisoned */
    void *d_wg = dput(wg, WB), *d_wu = dput(wu, WB), *d_wd = dput(wd, WB), *d_hid = dput(hid, HB);
    void *d_gout = dput(gout, HB);
    CK(layer_set(ag, d_wg, d_wu, d_wd, d_hid)); CK(setp(ag, "pair_rank", prg)); CK(fwd_set(ag, df));

    lrmoe_exec_cuda_t *xh, *xg;
    CK(lrmoe_exec_args_cuda_new(ah, &xh));
    CK(lrmoe_exec_args_cuda_new(ag, &xg));
    CK(lrmoe_exec_cuda_set_io(xg, 1, stream));

    CK(lrmoe_exec_args_forward_cuda(ah, xh, NULL));
    for (int rep = 0; rep < 2; rep++) CK(lrmoe_exec_args_forward_cuda(ag, xg, NULL));
    same("pair_rank", prh, prg, M * 4);
    fwd_same("", hf, df);

    /* backward on the host forward's saved state (copied to the device) */
    bwd_out hb = bwd_new(0), db = bwd_new(1);
    CK(bwd_set(ah, gout, hf, hb)); CK(setp(ah, "pair_rank", prh));
    CK(bwd_set(ag, d_gout, saved_dev(hf), db)); CK(setp(ag, "pair_rank", prh));
    const char *modes[2] = {"full", "masked"};
    for (int m = 0; m < 2; m++) {
        char w[64];
        for (int i = 0; i < 2; i++) {
            CK(lrmoe_exec_args_set(both[i], "mode", m ? LRMOE_MODE_MASKED : LRMOE_MODE_FULL));
            CK(setp(both[i], "keep", m ? keep : NULL));
        }
        CK(lrmoe_exec_args_backward_cuda(ah, xh, NULL));
        for (int rep = 0; rep < 2; rep++) CK(lrmoe_exec_args_backward_cuda(ag, xg, NULL));
        snprintf(w, sizeof w, "%s ", modes[m]);
        bwd_same(w, hb, db);
    }
    /* weights changed in place on the device: the next frame sees them */
    uint16_t *wg2 = (uint16_t *)malloc(WB);
    memcpy(wg2, wg, WB);
    for (size_t i = 0; i < WB / 2; i += 7) wg2[i] = bf(0.5f);
    void *tmp = dput(wg2, WB);
#ifdef DEVIO_CUDA
    if (cudaMemcpy(d_wg, tmp, WB, cudaMemcpyDeviceToDevice) != cudaSuccess) return 1;
#else
    memcpy(d_wg, tmp, WB);
#endif
    CK(setp(ah, "w_gate", wg2));
    CK(lrmoe_exec_cuda_weights_changed(xg));
    CK(lrmoe_exec_cuda_weights_changed(xh));
    CK(fwd_set(ah, hf)); CK(fwd_set(ag, df)); /* the backward set the saved state as inputs */
    CK(lrmoe_exec_args_forward_cuda(ah, xh, NULL));
    CK(lrmoe_exec_args_forward_cuda(ag, xg, NULL));
    fwd_same("after weights_changed: ", hf, df);
    lrmoe_exec_cuda_free(xh);
    lrmoe_exec_cuda_free(xg);
    lrmoe_exec_args_free(ah);
    lrmoe_exec_args_free(ag);
    dfree(tmp);
    if (fails) return 1;
    int dr = devroute(ids, tw, hid, wg, wu, wd, gout);
    if (dr == 1) return 1;
    printf("devio: PASS (forward, backward full and masked, P=%d E=%d, device I/O = host I/O bitwise%s)\n",
           P, E, dr == 3 ? "; device routing not run" : "; device routing = host routing bitwise, P=1");
    return 0;
}
