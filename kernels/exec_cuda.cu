/* lrmoe-exec, CUDA backend: the entry points lrmoe_exec_forward_cuda and
 * lrmoe_exec_backward_cuda of lib/exec.h.
 *
 * Same data path as the CPU backend (lib/exec_cpu.c), on devices: P ranks,
 * rank r on device (cfg->device + r mod G) mod visible (G = cfg->gpus, or
 * all visible devices when 0). Token rows and weight bytes cross ranks only through
 * the CUDA communicator (kernels/comm_nccl.cu: NCCL between distinct devices,
 * device copies when ranks share one). The host keeps only the metadata
 * (pair layout, send/receive orders), exactly the CPU backend's:
 *
 *   rows: every row i belongs to a destination rank d (rows of d are
 *   [base[d], base[d+1])), expert-major, pair u ascending inside an expert
 *   segment; its source is the owner of token u/K. Send buffer of s:
 *   destinations ascending, rows in layout order. Receive buffer of d:
 *   sources ascending, then permuted into layout order for the GEMMs.
 *
 * Expert GEMMs are cuBLAS with BF16 operands and F32 accumulation
 * (lrmoe_kcu_gemm; cfg->gemm picks loop or grouped, cfg->gemm_streams the
 * loop's streams). SwiGLU, conversions, gathers,
 * combine and the router gradient are the kernels of kcu.cu.
 *
 * Numerics against the CPU backend: the CPU runs F32 GEMMs on F32 copies of
 * the operands; here every GEMM operand is rounded to BF16 (x, the weights,
 * phi, dy, dphi-derived dg/du), so results agree to BF16 operand precision
 * (relative error ~1e-3..1e-2), exactly where operands were BF16 already.
 *
 * The executor (lrmoe_exec_cuda_t, exec.h) keeps the contexts, the
 * communicator (async mode: no host waits, events order the ranks) and each
 * layer's weights resident across frames; the one-shot entry points make and
 * free one per call. A frame queues every rank's work from this thread
 * before waiting for any: host-to-device transfers come from pinned staging
 * (the executor's block, reused frame after frame), device-to-host ones land
 * there and are copied or scattered into the caller's arrays after the one
 * host wait at the frame's end (run_finish). With device-pointer I/O
 * (lrmoe_exec_cuda_set_io) activations never cross to the host and the
 * caller's stream waits for the frame instead of the host.
 *
 * dy travels in BF16 (the dispatch rounds alpha_u g_t once, as the expert
 * rank did before: dy is only a BF16 GEMM operand), dx back in F32.
 *
 * Timings: each rank records an event on its stream at every stage boundary
 * (run_t::mark); a stage's seconds are the device time between its events,
 * read after the frame's wait (zero with device-pointer I/O).
 *
 * One rank per process (MPI, lib/exec_mpi.c): cfg->comm is then the rank's
 * NCCL communicator from lrmoe_comm_cuda_init_rank (self = rank+1), whose
 * context (the GPU that local rank picked) this rank runs on. Every loop over
 * ranks does only the local rank's device work; the host metadata (layout,
 * orders) is still computed for all ranks, identically everywhere, and the
 * p2p transfers (replica weights, helper gradients) are walked in one global
 * order by every process, each sending or receiving its part, so the NCCL
 * sends and receives pair up.
 */
#include <stdlib.h>
#include <string.h>
#include <functional>
#include <new>
#include <vector>
#include "kcu_internal.h"
#include "comm_cuda.h"
extern "C" {
#include "exec.h"
#include "exec_backend.h"
#include "clock.h"
#include "score.h"
}

#define TIM(r, s) (tim[(size_t)(r) * LRMOE_NSTAGES + (s)])
#define CK(x) do { if ((x) < 0) goto out; } while (0)
#define CKR(x) do { if ((x) < 0) return -1; } while (0)

namespace {

/* ---------------------------------------------------------------- layout */

struct layout_t {
    int P = 0;
    int64_t T = 0, K = 0, E = 0, M = 0;
    std::vector<int64_t> u, cnt, seg;    /* (M), (P,E), (P,E) */
    std::vector<int64_t> base, sbase;    /* (P+1) */
    std::vector<int32_t> owner;          /* (M) */
    std::vector<int64_t> counts, sdispls, rdispls; /* (P,P) */
};

static int layout_finish(layout_t &L)
{
    int P = L.P;
    L.base.assign(P + 1, 0);
    L.sbase.assign(P + 1, 0);
    L.owner.assign(L.M, 0);
    L.counts.assign((size_t)P * P, 0);
    L.sdispls.assign((size_t)P * P, 0);
    L.rdispls.assign((size_t)P * P, 0);
    int64_t acc = 0;
    for (int d = 0; d < P; d++) {
        L.base[d] = acc;
        for (int64_t e = 0; e < L.E; e++) acc += L.cnt[d * L.E + e];
    }
    L.base[P] = acc;
    for (int d = 0; d < P; d++)
        for (int64_t i = L.base[d]; i < L.base[d + 1]; i++) {
            int s = lrmoe_exec_token_owner(L.u[i] / L.K, L.T, P);
            L.owner[i] = s;
            L.counts[(size_t)s * P + d]++;
        }
    lrmoe_comm_displs(P, L.counts.data(), L.sdispls.data(), L.rdispls.data());
    acc = 0;
    for (int s = 0; s < P; s++) {
        L.sbase[s] = acc;
        for (int d = 0; d < P; d++) acc += L.counts[(size_t)s * P + d];
    }
    L.sbase[P] = acc;
    return 0;
}

static int layout_pairs(layout_t &L, int P, int64_t T, int64_t K, int64_t E,
                        const int32_t *topk, const int32_t *pair_rank)
{
    L.P = P; L.T = T; L.K = K; L.E = E; L.M = T * K;
    L.u.assign(L.M, 0);
    L.cnt.assign((size_t)P * E, 0);
    L.seg.assign((size_t)P * E, 0);
    for (int64_t u = 0; u < L.M; u++) {
        if (pair_rank[u] < 0 || pair_rank[u] >= P)
            return lrmoe_err("pair_rank[%lld,%lld]: rank %d out of range [0,%d)",
                             (long long)(u / K), (long long)(u % K), pair_rank[u], P);
        L.cnt[(int64_t)pair_rank[u] * E + topk[u]]++;
    }
    int64_t acc = 0;
    for (int64_t j = 0; j < P * E; j++) { L.seg[j] = acc; acc += L.cnt[j]; }
    std::vector<int64_t> fill(L.seg);
    for (int64_t u = 0; u < L.M; u++) L.u[fill[(int64_t)pair_rank[u] * E + topk[u]]++] = u;
    return layout_finish(L);
}

/* The packed rows of lrmoe-pack, validated like the CPU backend does. */
static int layout_packed(layout_t &L, int P, int64_t T, int64_t K, int64_t E,
                         const int32_t *topk, const lrmoe_exec_bwd_t *a, const uint8_t *placement)
{
    L.P = P; L.T = T; L.K = K; L.E = E; L.M = a->R;
    if (lrmoe_exec_check_pack(P, T, K, E, topk, a, placement) < 0) return -1;
    L.u.assign(a->pack_pair, a->pack_pair + a->R);
    L.cnt.assign(a->pack_counts, a->pack_counts + P * E);
    L.seg.assign(a->pack_offsets, a->pack_offsets + P * E);
    return layout_finish(L);
}

/* ---------------------------------------------------------------- executor */

} /* namespace */

/* The weights of one layer resident on the ranks: wst[r*E+e] the storage
 * dtype (3 matrices), wbf[r*E+e] its BF16 view; natives uploaded once,
 * replicas copied from the native rank the first time a frame needs them. */
struct xw_t {
    const void *g = nullptr, *u = nullptr, *dn = nullptr;
    lrmoe_dtype_t dtype = LRMOE_F32;
    int64_t E = 0, F = 0, D = 0;
    std::vector<void *> wst, wbf;
    std::vector<int> own_bf;        /* wbf[i] is an allocation of its own */
    std::vector<char> own_st;       /* wst[i] is an allocation of its own (a replica) */
    /* each rank's natives, consecutive in one block (expert lo + j at
     * j * 3 F D elements), and their BF16 view when the storage is F32:
     * (rank, allocation) */
    std::vector<std::pair<int, void *>> blk;
    std::vector<char> rep;          /* replica i copied (set alike in both processes) */
};

/* lrmoe_exec_cuda_t (exec.h): what lives across frames. */
struct lrmoe_exec_cuda {
    int P = 0;
    int self = 0;                   /* 0: all ranks here; r+1: only rank r (comm.h) */
    std::vector<lrmoe_kcu_ctx_t *> ctx;   /* (P); nullptr: a rank of another process */
    std::vector<int> own_ctx;
    lrmoe_comm_t comm;
    int comm_ok = 0;
    lrmoe_comm_t *cm = &comm;
    int async = 0;                  /* comm in async mode: no host waits inside a frame */
    int hostcomm = 0;               /* cm is a callback communicator (exec.h): its calls
                                       complete on return and see device memory only after
                                       the rank's queued work (synchronised before each) */
    std::vector<xw_t *> ws;         /* resident weight sets, one per layer */
    /* pinned staging: one block reused by every frame (bumped from 0), and
     * blocks added when a frame needed more, merged after it */
    char *pin = nullptr;
    size_t pin_cap = 0, pin_used = 0, pin_need = 0;
    std::vector<void *> pin_extra;  /* earlier blocks of this frame */
    std::vector<void *> pin_tmp;    /* blocks of this frame only */
    std::vector<std::vector<void *>> ev;  /* (P) timing events, reused */
    std::vector<void *> join;             /* (P) join events */
    /* lrmoe_exec_cuda_set_io: activations and outputs are device pointers,
     * the frame runs after `stream`'s queued work and `stream` waits for it */
    int dev = 0;
    int route = 0;                  /* device_io 2: topk_ids, topk_weights on the device too,
                                       the layout computed there (one rank): capturable */
    void *stream = nullptr;
    void *start = nullptr;          /* recorded on `stream` at a frame's start */
    int pending = 0;                /* a device-I/O frame not yet waited for */
    lrmoe_exec_cuda() { memset(&comm, 0, sizeof comm); }
};

namespace {

typedef lrmoe_exec_cuda xs_t;

struct rank_t {
    lrmoe_kcu_ctx_t *ctx = nullptr;       /* nullptr: a rank of another process */
    int64_t t_lo = 0, t_hi = 0;
    std::vector<void *> mem;              /* this frame's device allocations */
    void **wst = nullptr;                 /* (E) resident weights, storage dtype */
    const uint16_t *const *wbf = nullptr; /* (E) BF16 view */
    size_t nev = 0;                       /* timing events used this frame */
    std::vector<int> evstage;             /* the stage each event closes */
};

/* One frame on an executor. Nothing waits on the host until run_finish: every
 * host transfer goes through pinned staging; copies to the host and the
 * scatters by pair behind them are deferred to after the one wait. */
struct run_t {
    int P = 0;
    xs_t *X = nullptr;
    const lrmoe_exec_dims_t *d = nullptr;
    std::vector<rank_t> rk;
    lrmoe_comm_t *cm = nullptr;
    int self = 0;
    double *tim = nullptr;
    struct hcopy { void *dst; const void *src; size_t bytes; };
    std::vector<hcopy> later;                         /* host copies after the wait */
    std::vector<std::function<void()>> later_fn;      /* host scatters after the wait */
    /* device-I/O forward: each rank's saved rows (layout order) that go back
     * to the token owners like y: ||phi||^2, h_g, h_u */
    std::vector<void *> sv_sq, sv_g, sv_u;
    std::vector<int64_t *> dur;   /* (T_s*K) on owner s: the pair rows' receive rows */
    int capturing = 0;            /* device I/O: the caller's stream is capturing a graph */

    int loc(int r) const { return self == 0 || self == r + 1; }
    /* before a call of a callback communicator: the local rank's queued
     * work (the rows it sends, the buffers it receives into) is done */
    int comm_ready()
    {
        if (!X->hostcomm) return 0;
        for (int r = 0; r < P; r++)
            if (loc(r) && rk[r].ctx && (use(r) < 0 || lrmoe_kcu_sync() < 0)) return -1;
        return 0;
    }
    int use(int r) { return lrmoe_kcu_use(rk[r].ctx); }

    /* device memory on rank r (freed, stream-ordered, at the end) */
    int dalloc(int r, void **p, size_t bytes)
    {
        if (use(r) < 0) return -1;
        if (lrmoe_kcu_alloc(p, bytes ? bytes : 16) < 0) return -1;
        rk[r].mem.push_back(*p);
        return 0;
    }
    template <typename X> int dalloc(int r, X **p, size_t bytes)
    {
        void *v = nullptr;
        int rc = dalloc(r, &v, bytes);
        *p = (X *)v;
        return rc;
    }
    /* pinned staging of `bytes`, valid until run_finish, bumped from the
     * executor's block; when that is short, from added blocks (at least
     * 4 MiB, doubling), merged into one block of the frame's need after it.
     * keep 0: a block of its own, not counted (the weights' upload). */
    void *stage(size_t bytes, int keep = 1)
    {
        bytes = (bytes + 255) & ~(size_t)255;
        if (!bytes) bytes = 256;
        void *p = nullptr;
        if (!keep) {
            if (lrmoe_kcu_host_alloc(&p, bytes) < 0) return nullptr;
            X->pin_tmp.push_back(p);
            return p;
        }
        X->pin_need += bytes;
        if (X->pin_used + bytes > X->pin_cap) {
            size_t n = X->pin_cap * 2 > bytes ? X->pin_cap * 2 : bytes;
            if (n < ((size_t)4 << 20)) n = (size_t)4 << 20;
            if (lrmoe_kcu_host_alloc(&p, n) < 0) return nullptr;
            if (X->pin) X->pin_extra.push_back(X->pin);
            X->pin = (char *)p;
            X->pin_cap = n;
            X->pin_used = 0;
        }
        p = X->pin + X->pin_used;
        X->pin_used += bytes;
        return p;
    }
    /* host -> rank r's device memory, through pinned staging */
    int put(int r, void *dst, const void *src, size_t bytes)
    {
        if (!bytes) return 0;
        void *p = stage(bytes);
        if (!p || use(r) < 0) return -1;
        memcpy(p, src, bytes);
        return lrmoe_kcu_h2d(dst, p, bytes);
    }
    /* rank r's device memory -> pinned staging (returned); read after run_finish */
    void *fetch(int r, const void *src, size_t bytes)
    {
        void *p = stage(bytes);
        if (!p || use(r) < 0) return nullptr;
        if (bytes && lrmoe_kcu_d2h(p, src, bytes) < 0) return nullptr;
        return p;
    }
    int get(int r, void *dst, const void *src, size_t bytes)
    {
        if (!bytes) return 0;
        void *p = fetch(r, src, bytes);
        if (!p) return -1;
        later.push_back(hcopy{dst, p, bytes});
        return 0;
    }
    /* an input of the caller (activations, device pointers in device-I/O
     * mode) into rank r's device memory */
    int in(int r, void *dst, const void *src, size_t bytes)
    {
        if (!X->dev) return put(r, dst, src, bytes);
        if (use(r) < 0) return -1;
        return lrmoe_kcu_copy(dst, src, bytes);
    }
    /* rank r's device memory into an output of the caller */
    int out(int r, void *dst, const void *src, size_t bytes)
    {
        if (!X->dev) return get(r, dst, src, bytes);
        if (!bytes) return 0;
        if (use(r) < 0) return -1;
        return lrmoe_kcu_copy(dst, src, bytes);
    }
    /* the work rank r queued since its last mark belongs to `stage` */
    int mark(int r, int stage)
    {
        if (X->route) return 0; /* no timing events: nothing a CUDA graph would not need */
        rank_t &k = rk[r];
        std::vector<void *> &ev = X->ev[r];
        if (use(r) < 0) return -1;
        if (k.nev == ev.size()) {
            void *e;
            if (lrmoe_kcu_event_create(&e, 1) < 0) return -1;
            ev.push_back(e);
        }
        k.evstage.push_back(stage);
        return lrmoe_kcu_event_record(ev[k.nev++]);
    }
};

static void xw_free(xs_t *X, xw_t *W)
{
    for (int r = 0; r < X->P; r++) {
        if (!X->ctx[r] || lrmoe_kcu_use(X->ctx[r]) < 0) continue;
        for (int64_t e = 0; e < W->E; e++) {
            size_t i = (size_t)r * W->E + e;
            if (W->own_bf[i]) (void)lrmoe_kcu_free(W->wbf[i]);
            if (W->own_st[i]) (void)lrmoe_kcu_free(W->wst[i]);
        }
        for (auto &b : W->blk)
            if (b.first == r) (void)lrmoe_kcu_free(b.second);
    }
    delete W;
}

static void x_free(xs_t *X)
{
    if (!X) return;
    for (int r = 0; r < X->P; r++)
        if (X->ctx.size() && X->ctx[r] && lrmoe_kcu_use(X->ctx[r]) == 0) (void)lrmoe_kcu_sync();
    for (xw_t *W : X->ws) xw_free(X, W);
    for (int r = 0; r < (int)X->ev.size(); r++) {
        for (void *e : X->ev[r]) lrmoe_kcu_event_destroy(e);
        if (X->join[r]) lrmoe_kcu_event_destroy(X->join[r]);
    }
    lrmoe_kcu_event_destroy(X->start);
    for (int r = 0; r < X->P; r++)
        if (X->ctx.size() && X->ctx[r] && lrmoe_kcu_use(X->ctx[r]) == 0) (void)lrmoe_kcu_sync();
    lrmoe_kcu_host_free(X->pin);
    for (void *p : X->pin_extra) lrmoe_kcu_host_free(p);
    for (void *p : X->pin_tmp) lrmoe_kcu_host_free(p);
    if (X->comm_ok) lrmoe_comm_free(&X->comm);
    for (int r = 0; r < (int)X->ctx.size(); r++)
        if (X->own_ctx[r]) lrmoe_kcu_ctx_destroy(X->ctx[r]);
    (void)lrmoe_kcu_use(nullptr);
    delete X;
}

static int x_new(const lrmoe_exec_cfg_t *cfg, int P, xs_t **out)
{
    *out = nullptr;
    if (P < 1) return lrmoe_err("ranks must be >= 1 (got %d)", P);
    int ndev = lrmoe_kcu_device_count();
    if (ndev < 0) return lrmoe_err_prefix("backend cuda: no usable CUDA device");
    int gpus = cfg->gpus > 0 ? cfg->gpus : ndev;
    int streams = cfg->gemm_streams > 0 ? cfg->gemm_streams : 4;
    if (gpus > ndev)
        return lrmoe_err("backend cuda: --gpus %d but only %d devices are visible", gpus, ndev);
    if (streams > KCU_MAX_STREAMS)
        return lrmoe_err("backend cuda: --gemm-streams %d exceeds %d", streams, KCU_MAX_STREAMS);
    lrmoe_gemm_impl_t impl;
    if (cfg->gemm == LRMOE_EXEC_GEMM_LOOP) impl = LRMOE_GEMM_LOOP;
    else if (cfg->gemm == LRMOE_EXEC_GEMM_GROUPED) impl = LRMOE_GEMM_GROUPED;
    else if (cfg->gemm == LRMOE_EXEC_GEMM_CUTLASS) impl = LRMOE_GEMM_CUTLASS;
    else return lrmoe_err("backend cuda: unknown GEMM implementation %d", cfg->gemm);
    if (cfg->device < 0 || cfg->device >= ndev)
        return lrmoe_err("backend cuda: device %d out of range (%d devices)", cfg->device, ndev);
    xs_t *X = new (std::nothrow) xs_t;
    if (!X) return lrmoe_err("out of memory");
    X->P = P;
    X->ctx.assign(P, nullptr);
    X->own_ctx.assign(P, 0);
    X->ev.resize(P);
    X->join.assign(P, nullptr);
    if (cfg->comm && cfg->comm->self && cfg->comm->backend == LRMOE_BACKEND_CUDA) {
        /* one rank of an MPI job: its comm and GPU */
        lrmoe_comm_t *c = cfg->comm;
        if (c->P != P || c->self > P) {
            x_free(X);
            return lrmoe_err("backend cuda: the communicator is not a CUDA one of %d ranks", P);
        }
        X->cm = c;
        X->self = c->self;
        if (!(X->ctx[c->self - 1] = (lrmoe_kcu_ctx_t *)c->device)) {
            x_free(X);
            return lrmoe_err("backend cuda: the rank communicator has no device context");
        }
        lrmoe_kcu_set_gemm(X->ctx[c->self - 1], impl);
        if (lrmoe_kcu_use(X->ctx[c->self - 1]) < 0 ||
            lrmoe_kcu_event_create(&X->join[c->self - 1], 0) < 0) {
            x_free(X);
            return -1;
        }
        (void)lrmoe_kcu_use(nullptr);
        *out = X;
        return 0;
    }
    if (cfg->comm && cfg->comm->self) { /* a callback rank communicator: this process's GPU */
        lrmoe_comm_t *c = cfg->comm;
        int r = c->self - 1;
        if (c->P != P || c->self > P) {
            x_free(X);
            return lrmoe_err("backend cuda: the communicator is not one of %d ranks", P);
        }
        X->cm = c;
        X->self = c->self;
        X->hostcomm = 1;
        if (lrmoe_kcu_ctx_create(cfg->device, streams, &X->ctx[r]) < 0) { x_free(X); return -1; }
        X->own_ctx[r] = 1;
        lrmoe_kcu_set_gemm(X->ctx[r], impl);
        if (lrmoe_kcu_use(X->ctx[r]) < 0 || lrmoe_kcu_event_create(&X->join[r], 0) < 0) {
            x_free(X);
            return -1;
        }
        (void)lrmoe_kcu_use(nullptr);
        *out = X;
        return 0;
    }
    for (int r = 0; r < P; r++) {
        int dev = (cfg->device + r % gpus) % ndev;
        if (lrmoe_kcu_ctx_create(dev, streams, &X->ctx[r]) < 0) { x_free(X); return -1; }
        X->own_ctx[r] = 1;
        lrmoe_kcu_set_gemm(X->ctx[r], impl);
        if (lrmoe_kcu_use(X->ctx[r]) < 0 || lrmoe_kcu_event_create(&X->join[r], 0) < 0) {
            x_free(X);
            return -1;
        }
    }
    if (lrmoe_comm_cuda_init(&X->comm, P, X->ctx.data(), -1) < 0) { x_free(X); return -1; }
    X->comm_ok = 1;
    if (lrmoe_comm_cuda_set_async(&X->comm, 1) < 0) { x_free(X); return -1; }
    X->async = 1;
    *out = X;
    return 0;
}

static int run_init(run_t &R, xs_t *X, const lrmoe_exec_dims_t *d, double *tim)
{
    R.P = d->P;
    R.X = X;
    R.d = d;
    R.tim = tim;
    R.cm = X->cm;
    R.self = X->self;
    if (d->P != X->P)
        return lrmoe_err("backend cuda: the executor has %d ranks, the call %d", X->P, d->P);
    int first = 0;
    while (!X->ctx[first]) first++;
    if (X->dev) { /* see lrmoe_exec_cuda_new(3), NOTES: only device routing is capturable */
        int cap = lrmoe_kcu_stream_capturing(X->stream);
        if (cap < 0) return -1;
        if (cap && !X->route)
            return lrmoe_err("backend cuda: a frame cannot be captured into a CUDA graph (its "
                             "index arrays are staged from the host per frame); run it outside "
                             "the capture, or route on the device (device I/O 2)");
        if (cap && X->pending)
            return lrmoe_err("backend cuda: the last frame (host routing) is not waited for: "
                             "run a device-routing frame outside the capture first");
        R.capturing = cap;
    }
    if (X->pending) { /* the last device-I/O frame: its staging is reused now */
        X->pending = 0;
        if (lrmoe_kcu_use(X->ctx[first]) < 0 || lrmoe_kcu_event_sync(X->join[first]) < 0)
            return -1;
        if (!X->pin_extra.empty()) {
            lrmoe_kcu_host_free(X->pin);
            for (void *p : X->pin_extra) lrmoe_kcu_host_free(p);
            X->pin_extra.clear();
            X->pin = nullptr;
            X->pin_cap = 0;
            size_t n = X->pin_need + X->pin_need / 4;
            if (lrmoe_kcu_host_alloc((void **)&X->pin, n) == 0) X->pin_cap = n;
        }
        for (void *p : X->pin_tmp) lrmoe_kcu_host_free(p);
        X->pin_tmp.clear();
    }
    X->pin_used = X->pin_need = 0;
    R.rk.resize(R.P);
    R.sv_sq.assign(R.P, nullptr);
    R.sv_g.assign(R.P, nullptr);
    R.sv_u.assign(R.P, nullptr);
    R.dur.assign(R.P, nullptr);
    for (int r = 0; r < R.P; r++) {
        R.rk[r].t_lo = (int64_t)r * d->T / R.P;
        R.rk[r].t_hi = (int64_t)(r + 1) * d->T / R.P;
        R.rk[r].ctx = X->ctx[r];
    }
    if (X->dev) { /* after the caller's queued work */
        if (lrmoe_kcu_use(X->ctx[first]) < 0 || lrmoe_kcu_event_record_on(X->start, X->stream) < 0)
            return -1;
        for (int r = 0; r < R.P; r++)
            if (R.loc(r) && (R.use(r) < 0 || lrmoe_kcu_event_wait(X->start) < 0)) return -1;
    }
    for (int r = 0; r < R.P; r++)
        if (R.loc(r) && R.mark(r, -1) < 0) return -1; /* the frame's start */
    return 0;
}

/* End of a frame, also after an error: this frame's memory freed in stream
 * order; one host wait for all ranks (every other rank's stream joined into
 * rank 0's by events, then rank 0's join event waited for); the deferred
 * host copies and scatters (only after success); stage times from the
 * events; staging merged into one block for the next frame. */
static int run_finish(run_t &R, int ok)
{
    xs_t *X = R.X;
    int rc = ok ? 0 : -1;
    if (!X || (int)R.rk.size() != R.P) return rc; /* run_init stopped before queueing */
    int first = -1;
    for (int r = 0; r < R.P; r++) {
        if (!R.loc(r) || !R.rk[r].ctx) continue;
        if (R.use(r) < 0) { rc = -1; continue; }
        for (void *p : R.rk[r].mem) if (lrmoe_kcu_free(p) < 0) rc = -1;
        R.rk[r].mem.clear();
        if (ok && R.mark(r, -2) < 0) rc = -1;
        if (first < 0) first = r;
    }
    if (X->dev && first >= 0 && (X->async || X->self)) {
        /* device I/O: the caller's stream waits for every rank; the host
         * waits only when the next frame reuses the staging (run_init) */
        for (int r = 0; r < R.P; r++) {
            if (r == first || !R.loc(r) || !R.rk[r].ctx) continue;
            if (R.use(r) < 0 || lrmoe_kcu_event_record(X->join[r]) < 0 || R.use(first) < 0 ||
                lrmoe_kcu_event_wait(X->join[r]) < 0)
                rc = -1;
        }
        if (R.use(first) < 0 || lrmoe_kcu_event_record(X->join[first]) < 0 ||
            lrmoe_kcu_stream_wait(X->stream, X->join[first]) < 0)
            rc = -1;
        X->pending = !X->route; /* device routing stages nothing */
        if (rc < 0)
            for (int r = 0; r < R.P; r++)
                if (R.rk[r].ctx && R.use(r) == 0) (void)lrmoe_kcu_sync();
        if (!ok) { /* a weight copy may have stopped half way */
            for (xw_t *W : X->ws) xw_free(X, W);
            X->ws.clear();
        }
        (void)lrmoe_kcu_use(nullptr);
        return rc; /* no host copies to make; stage times stay 0 */
    }
    if (X->async && first >= 0) {
        for (int r = 0; r < R.P; r++) {
            if (r == first || !R.rk[r].ctx) continue;
            if (R.use(r) < 0 || lrmoe_kcu_event_record(X->join[r]) < 0 || R.use(first) < 0 ||
                lrmoe_kcu_event_wait(X->join[r]) < 0)
                rc = -1;
        }
        if (R.use(first) < 0 || lrmoe_kcu_event_record(X->join[first]) < 0 ||
            lrmoe_kcu_event_sync(X->join[first]) < 0) {
            rc = -1;
            for (int r = 0; r < R.P; r++) /* make sure nothing still reads staging */
                if (R.rk[r].ctx && R.use(r) == 0) (void)lrmoe_kcu_sync();
        }
    } else if (first >= 0) {
        if (R.use(first) < 0 || lrmoe_kcu_sync() < 0) rc = -1;
    }
    if (!ok) { /* a weight upload or copy may have stopped half way */
        for (xw_t *W : X->ws) xw_free(X, W);
        X->ws.clear();
    }
    if (rc == 0) {
        for (const run_t::hcopy &c : R.later) memcpy(c.dst, c.src, c.bytes);
        for (auto &f : R.later_fn) f();
        double *tim = R.tim;
        for (int r = 0; r < R.P; r++) {
            rank_t &k = R.rk[r];
            for (size_t i = 1; i < k.nev; i++) {
                float ms = 0.0f;
                if (lrmoe_kcu_event_ms(X->ev[r][i - 1], X->ev[r][i], &ms) < 0) { rc = -1; break; }
                if (k.evstage[i] >= 0) TIM(r, k.evstage[i]) += ms * 1e-3;
            }
        }
    }
    for (void *p : X->pin_tmp) lrmoe_kcu_host_free(p);
    X->pin_tmp.clear();
    if (!X->pin_extra.empty()) {
        lrmoe_kcu_host_free(X->pin);
        for (void *p : X->pin_extra) lrmoe_kcu_host_free(p);
        X->pin_extra.clear();
        X->pin = nullptr;
        X->pin_cap = 0;
        size_t n = X->pin_need + X->pin_need / 4; /* room for frames a little larger */
        if (rc == 0 && lrmoe_kcu_host_alloc((void **)&X->pin, n) == 0) X->pin_cap = n;
    }
    X->pin_used = 0;
    (void)lrmoe_kcu_use(nullptr);
    return rc;
}

/* ---------------------------------------------------------------- weights */

/* The resident weight set of w (same matrices, dtype and shape), made when
 * new: every rank's native experts uploaded (through pinned staging) and
 * converted to BF16. */
static xw_t *weights_find(xs_t *X, const lrmoe_exec_dims_t *d, const lrmoe_exec_weights_t *w)
{
    for (xw_t *W : X->ws)
        if (W->g == w->w_gate && W->u == w->w_up && W->dn == w->w_down && W->dtype == w->dtype &&
            W->E == d->E && W->F == d->F && W->D == d->D)
            return W;
    return nullptr;
}

static xw_t *weights_set(run_t &R, const lrmoe_exec_weights_t *w)
{
    xs_t *X = R.X;
    const lrmoe_exec_dims_t *d = R.d;
    if (xw_t *F = weights_find(X, d, w)) return F;
    xw_t *W = new (std::nothrow) xw_t;
    if (!W) { lrmoe_err("out of memory"); return nullptr; }
    W->g = w->w_gate; W->u = w->w_up; W->dn = w->w_down; W->dtype = w->dtype;
    W->E = d->E; W->F = d->F; W->D = d->D;
    W->wst.assign((size_t)R.P * d->E, nullptr);
    W->wbf.assign((size_t)R.P * d->E, nullptr);
    W->own_bf.assign((size_t)R.P * d->E, 0);
    W->own_st.assign((size_t)R.P * d->E, 0);
    W->rep.assign((size_t)R.P * d->E, 0);
    X->ws.push_back(W);
    const size_t FD = (size_t)(d->F * d->D), mb = FD * lrmoe_dtype_size(w->dtype);
    for (int r = 0; r < R.P; r++) {
        if (!R.loc(r)) continue;
        int64_t nn = 0;
        for (int64_t e = 0; e < d->E; e++) nn += lrmoe_exec_native(e, d->E, R.P) == r;
        if (!nn) {
            if (R.mark(r, LRMOE_STAGE_WEIGHTS) < 0) return nullptr;
            continue;
        }
        char *p = X->dev ? nullptr : (char *)R.stage(3 * mb * (size_t)nn, 0);
        if (!p && !X->dev) return nullptr;
        char *block;
        if (R.use(r) < 0 || lrmoe_kcu_alloc((void **)&block, 3 * mb * (size_t)nn) < 0) return nullptr;
        W->blk.push_back({r, block});
        for (int64_t e = 0; e < d->E; e++) {
            if (lrmoe_exec_native(e, d->E, R.P) != r) continue;
            size_t i = (size_t)r * d->E + e;
            char *buf = block;
            block += 3 * mb;
            W->wst[i] = buf;
            if (X->dev) { /* device weights: the expert's three matrices consecutive */
                if (lrmoe_kcu_copy(buf, (const char *)w->w_gate + e * mb, mb) < 0 ||
                    lrmoe_kcu_copy(buf + mb, (const char *)w->w_up + e * mb, mb) < 0 ||
                    lrmoe_kcu_copy(buf + 2 * mb, (const char *)w->w_down + e * mb, mb) < 0)
                    return nullptr;
                continue;
            }
            memcpy(p, (const char *)w->w_gate + e * mb, mb);
            memcpy(p + mb, (const char *)w->w_up + e * mb, mb);
            memcpy(p + 2 * mb, (const char *)w->w_down + e * mb, mb);
            if (lrmoe_kcu_h2d(buf, p, 3 * mb) < 0) return nullptr;
            p += 3 * mb;
        }
        if (R.mark(r, LRMOE_STAGE_WEIGHTS) < 0) return nullptr;
    }
    return W;
}

/* Rank r's BF16 view of expert e (converted when F32), kept. */
static int weights_bf16(run_t &R, xw_t *W, int r, int64_t e)
{
    size_t i = (size_t)r * W->E + e;
    if (W->wbf[i]) return 0;
    if (W->dtype == LRMOE_BF16) { W->wbf[i] = W->wst[i]; return 0; }
    const size_t FD = (size_t)(W->F * W->D);
    void *b;
    if (R.use(r) < 0 || lrmoe_kcu_alloc(&b, 3 * FD * 2) < 0) return -1;
    W->wbf[i] = b;
    W->own_bf[i] = 1;
    return lrmoe_kcu_f32_to_bf16((int64_t)(3 * FD), (const float *)W->wst[i], (uint16_t *)b);
}

/* Rank r's BF16 view of its natives from F32 storage, kept: one converted
 * block, so that the view is consecutive like the block (expert lo + j at
 * j * 3 F D: lrmoe_kcu_ggemm's uniform expert stride). BF16 storage is its
 * own view (weights_bf16). */
static int weights_bf16_natives(run_t &R, xw_t *W, int r)
{
    if (W->dtype == LRMOE_BF16) return 0;
    int64_t lo = -1, nn = 0;
    for (int64_t e = 0; e < W->E; e++)
        if (lrmoe_exec_native(e, W->E, R.P) == r) { if (lo < 0) lo = e; nn++; }
    if (!nn || W->wbf[(size_t)r * W->E + lo]) return 0;
    const size_t FD3 = (size_t)(3 * W->F * W->D);
    uint16_t *b;
    if (R.use(r) < 0 || lrmoe_kcu_alloc((void **)&b, FD3 * (size_t)nn * 2) < 0) return -1;
    W->blk.push_back({r, b});
    for (int64_t j = 0; j < nn; j++) W->wbf[(size_t)r * W->E + lo + j] = b + FD3 * (size_t)j;
    return lrmoe_kcu_f32_to_bf16((int64_t)(FD3 * (size_t)nn),
                                 (const float *)W->wst[(size_t)r * W->E + lo], b);
}

/* Rank r's BF16 views of every instance it holds, and its frame's pointers
 * to them. */
static int rank_weights(run_t &R, xw_t *W, int r)
{
    const int64_t E = W->E;
    CKR(weights_bf16_natives(R, W, r));
    for (int64_t e = 0; e < E; e++)
        if (W->wst[(size_t)r * E + e] && weights_bf16(R, W, r, e) < 0) return -1;
    R.rk[r].wst = &W->wst[(size_t)r * E];
    R.rk[r].wbf = (const uint16_t *const *)&W->wbf[(size_t)r * E];
    return 0;
}

/* The weights this frame needs resident: natives (the set), then each
 * replica or helper instance not yet there copied from the native rank;
 * need(r,e) as the CPU backend: rows of e on r, or an instance in the
 * placement. Steady state: nothing moves. */
static int load_weights(run_t &R, const lrmoe_exec_weights_t *w, const layout_t &L,
                        const uint8_t *placement)
{
    const lrmoe_exec_dims_t *d = R.d;
    int P = R.P;
    int64_t E = d->E;
    xw_t *W = weights_set(R, w);
    if (!W) return -1;
    const size_t mb = (size_t)(d->F * d->D) * lrmoe_dtype_size(w->dtype);
    for (int r = 0; r < P; r++)
        for (int64_t e = 0; e < E; e++) {
            int nat = lrmoe_exec_native(e, E, P);
            size_t i = (size_t)r * E + e;
            int need = nat != r && (L.cnt[r * E + e] > 0 || (placement && placement[e * P + r]));
            if (!need || (!R.loc(r) && !R.loc(nat))) continue;
            /* every process walks the same order and marks the copy alike,
             * so sends and receives pair up across processes */
            if (W->rep[i]) continue;
            W->rep[i] = 1;
            char *buf = nullptr;
            if (R.loc(r)) {
                if (R.use(r) < 0 || lrmoe_kcu_alloc((void **)&buf, 3 * mb) < 0) return -1;
                W->wst[i] = buf;
                W->own_st[i] = 1;
            }
            if (R.comm_ready() < 0 || R.cm->p2p(R.cm, nat, R.loc(nat) ? W->wst[(size_t)nat * E + e] : nullptr, r, buf,
                          3 * mb) < 0)
                return -1;
        }
    for (int r = 0; r < P; r++) {
        if (!R.loc(r)) continue;
        CKR(rank_weights(R, W, r));
        if (R.mark(r, LRMOE_STAGE_WEIGHTS) < 0) return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- exchange */

/* Forward direction. sendbuf[s] holds source s's rows in send order (built by
 * the caller); after the all-to-all each rank d's rows are permuted into
 * layout order into out[d] (M_d rows of row_bytes). */
static int exchange_fwd(run_t &R, const layout_t &L, size_t row_bytes,
                        std::vector<void *> &sendbuf, std::vector<void *> &out, int stage)
{
    int P = R.P;
    std::vector<void *> recv(P, nullptr);
    std::vector<double> sec(P, 0.0);
    for (int d = 0; d < P; d++)
        if (R.loc(d) && R.dalloc(d, &recv[d], (size_t)(L.base[d + 1] - L.base[d]) * row_bytes) < 0)
            return -1;
    if (R.comm_ready() < 0 || R.cm->alltoallv(R.cm, row_bytes, (const void *const *)sendbuf.data(), L.counts.data(),
                         L.sdispls.data(), (void *const *)recv.data(), L.rdispls.data(),
                         sec.data()) < 0)
        return -1;
    for (int d = 0; d < P; d++) {
        if (!R.loc(d)) continue;
        int64_t n = L.base[d + 1] - L.base[d];
        std::vector<int64_t> perm(n ? n : 1);
        std::vector<int64_t> pos(P);
        for (int s = 0; s < P; s++) pos[s] = L.rdispls[(size_t)d * P + s];
        for (int64_t i = L.base[d]; i < L.base[d + 1]; i++) perm[i - L.base[d]] = pos[L.owner[i]]++;
        int64_t *dperm;
        if (R.dalloc(d, &out[d], (size_t)n * row_bytes) < 0 || R.dalloc(d, &dperm, (size_t)n * 8) < 0 ||
            R.put(d, dperm, perm.data(), (size_t)n * 8) < 0 ||
            lrmoe_kcu_pack_gather(dperm, n, 1, 0, recv[d], row_bytes, out[d]) < 0 ||
            R.mark(d, stage) < 0)
            return -1;
    }
    return 0;
}

/* Reverse direction: rank d sends its rows in[d] (layout order, row_bytes)
 * back to the token owners; recv[s] receives them in s's send order, and
 * upos[u] is the row of pair u inside recv[s] (s = owner of u/K), -1 when
 * the pair has no row. */
static int exchange_rev(run_t &R, const layout_t &L, size_t row_bytes, std::vector<void *> &in,
                        std::vector<void *> &recv, std::vector<int64_t> &upos, int stage)
{
    int P = R.P;
    std::vector<int64_t> cnt2((size_t)P * P), sd2((size_t)P * P), rd2((size_t)P * P);
    std::vector<void *> send(P, nullptr);
    std::vector<double> sec(P, 0.0);
    for (int s = 0; s < P; s++)
        for (int d = 0; d < P; d++) {
            cnt2[(size_t)d * P + s] = L.counts[(size_t)s * P + d];
            sd2[(size_t)d * P + s] = L.rdispls[(size_t)d * P + s];
            rd2[(size_t)s * P + d] = L.sdispls[(size_t)s * P + d];
        }
    for (int d = 0; d < P; d++) {
        if (!R.loc(d)) continue;
        int64_t n = L.base[d + 1] - L.base[d];
        /* send position of row i is its receive position; as a gather:
         * send[pos] = in[i] */
        std::vector<int64_t> src(n ? n : 1);
        std::vector<int64_t> pos(P);
        for (int s = 0; s < P; s++) pos[s] = L.rdispls[(size_t)d * P + s];
        for (int64_t i = L.base[d]; i < L.base[d + 1]; i++) src[pos[L.owner[i]]++] = i - L.base[d];
        int64_t *dsrc;
        if (R.dalloc(d, &send[d], (size_t)n * row_bytes) < 0 || R.dalloc(d, &dsrc, (size_t)n * 8) < 0 ||
            R.put(d, dsrc, src.data(), (size_t)n * 8) < 0 ||
            lrmoe_kcu_pack_gather(dsrc, n, 1, 0, in[d], row_bytes, send[d]) < 0 ||
            R.mark(d, stage) < 0)
            return -1;
    }
    for (int s = 0; s < P; s++)
        if (R.loc(s) && R.dalloc(s, &recv[s], (size_t)(L.sbase[s + 1] - L.sbase[s]) * row_bytes) < 0)
            return -1;
    if (R.comm_ready() < 0 || R.cm->alltoallv(R.cm, row_bytes, (const void *const *)send.data(), cnt2.data(),
                         sd2.data(), (void *const *)recv.data(), rd2.data(), sec.data()) < 0)
        return -1;
    upos.assign((size_t)(L.T * L.K), -1);
    for (int s = 0; s < P; s++) {
        if (!R.loc(s)) continue;
        for (int d = 0; d < P; d++) {
            int64_t k = L.sdispls[(size_t)s * P + d];
            if (!L.counts[(size_t)s * P + d]) continue;
            for (int64_t i = L.base[d]; i < L.base[d + 1]; i++)
                if (L.owner[i] == s) upos[L.u[i]] = k++;
        }
        if (R.mark(s, stage) < 0) return -1; /* the all-to-all */
    }
    return 0;
}

/* Send order of source s: destinations ascending, rows in layout order. */
static std::vector<int64_t> send_rows(const layout_t &L, int s)
{
    std::vector<int64_t> v;
    v.reserve((size_t)(L.sbase[s + 1] - L.sbase[s]));
    for (int d = 0; d < L.P; d++) {
        if (!L.counts[(size_t)s * L.P + d]) continue;
        for (int64_t i = L.base[d]; i < L.base[d + 1]; i++)
            if (L.owner[i] == s) v.push_back(i);
    }
    return v;
}

/* ---------------------------------------------------------------- checks */

static int check_common(const lrmoe_exec_dims_t *d, const lrmoe_exec_weights_t *w)
{
    if (d->P < 1) return lrmoe_err("ranks must be >= 1 (got %d)", d->P);
    if (d->T < 0 || d->E < 1 || d->K < 1 || d->D < 1 || d->F < 1)
        return lrmoe_err("bad dimensions T=%lld E=%lld K=%lld D=%lld F=%lld", (long long)d->T,
                         (long long)d->E, (long long)d->K, (long long)d->D, (long long)d->F);
    if (d->K > d->E) return lrmoe_err("K=%lld exceeds E=%lld", (long long)d->K, (long long)d->E);
    if (d->P > d->E)
        return lrmoe_err("%d ranks for %lld experts: every rank needs a native expert", d->P,
                         (long long)d->E);
    if (w->dtype != LRMOE_F32 && w->dtype != LRMOE_BF16)
        return lrmoe_err("weights: dtype %s not supported (BF16 or F32)", lrmoe_dtype_name(w->dtype));
    if (!w->w_gate || !w->w_up || !w->w_down) return lrmoe_err("weights: missing matrices");
    return 0;
}

static int act_ok(lrmoe_dtype_t dt, const char *what)
{
    if (dt != LRMOE_F32 && dt != LRMOE_BF16)
        return lrmoe_err("%s: dtype %s not supported (BF16 or F32)", what, lrmoe_dtype_name(dt));
    return 0;
}

/* BF16 copy of n elements of dtype dt on the current device (or dt's own
 * buffer when it is BF16 already). */
static int as_bf16(run_t &R, int r, lrmoe_dtype_t dt, const void *src, int64_t n,
                   const uint16_t **out)
{
    if (dt == LRMOE_BF16) { *out = (const uint16_t *)src; return 0; }
    uint16_t *b;
    if (R.dalloc(r, &b, (size_t)n * 2) < 0 || lrmoe_kcu_f32_to_bf16(n, (const float *)src, b) < 0)
        return -1;
    *out = b;
    return 0;
}

static lrmoe_gemm_t G(int64_t m, int64_t n, int64_t k, int ta, int tb, const void *a, int64_t lda,
                      const void *b, int64_t ldb, void *c, int64_t ldc, float beta)
{
    lrmoe_gemm_t g;
    g.m = m; g.n = n; g.k = k; g.ta = ta; g.tb = tb; g.a = a; g.b = b; g.c = c;
    g.lda = lda; g.ldb = ldb; g.ldc = ldc; g.c_bf16 = 0; g.beta = beta;
    return g;
}

} /* namespace */

/* ---------------------------------------------------------------- forward */

namespace {

/* The caller's per-rank stage seconds zeroed, or local ones when it passed
 * none. */
static double *stage_times(int P, double *timings, std::vector<double> &tloc)
{
    if (!timings) {
        tloc.assign((size_t)P * LRMOE_NSTAGES, 0.0);
        return tloc.data();
    }
    memset(timings, 0, (size_t)P * LRMOE_NSTAGES * sizeof *timings);
    return timings;
}

/* Forward dispatch: token rows (storage dtype) from their owners into each
 * owner's send buffer sendb[s], in send order. */
static int fwd_dispatch(run_t &R, const layout_t &L, const lrmoe_exec_fwd_t *a, size_t rowb,
                        std::vector<void *> &sendb)
{
    const int64_t K = R.d->K;
    for (int s = 0; s < R.P; s++) {
        if (!R.loc(s)) continue;
        rank_t &rs = R.rk[s];
        int64_t nt = rs.t_hi - rs.t_lo;
        std::vector<int64_t> rows = send_rows(L, s), idx(rows.size() ? rows.size() : 1);
        for (size_t j = 0; j < rows.size(); j++) idx[j] = L.u[rows[j]] - rs.t_lo * K;
        void *hid;
        int64_t *didx;
        CKR(R.dalloc(s, &hid, (size_t)nt * rowb));
        CKR(R.dalloc(s, &didx, idx.size() * 8));
        CKR(R.dalloc(s, &sendb[s], rows.size() * rowb));
        CKR(R.in(s, hid, (const char *)a->hidden + (size_t)rs.t_lo * rowb, (size_t)nt * rowb));
        CKR(R.put(s, didx, idx.data(), rows.size() * 8));
        CKR(lrmoe_kcu_pack_gather(didx, (int64_t)rows.size(), (int)K, 1, hid, rowb, sendb[s]));
        CKR(R.mark(s, LRMOE_STAGE_DISPATCH));
    }
    return 0;
}

/* Rank r's n rows (from b0): the saved state h_g, h_u (storage dtype) and
 * ||phi||^2 (sq) back to the host, by pair. */
static int fwd_save_state(run_t &R, const layout_t &L, lrmoe_exec_fwd_t *a, int r, int64_t n,
                          int64_t b0, const float *hg, const float *hu, const float *sq)
{
    const int64_t F = R.d->F;
    const size_t as = lrmoe_dtype_size(a->act_dtype);
    const int abf = a->act_dtype == LRMOE_BF16;
    const std::vector<int64_t> *u = &L.u;
    if (R.X->dev) { /* kept in layout order; they go back to the owners like y */
        R.sv_sq[r] = (void *)sq;
        for (int which = 0; which < 2; which++) {
            if (!(which ? a->saved_up : a->saved_gate)) continue;
            void *st;
            CKR(R.dalloc(r, &st, (size_t)(n * F) * as));
            CKR(lrmoe_kcu_from_f32(n * F, which ? hu : hg, abf, st));
            (which ? R.sv_u : R.sv_g)[r] = st;
        }
        return 0;
    }
    if (a->phi_sqnorm) {
        const float *hsq = (const float *)R.fetch(r, sq, (size_t)n * 4);
        if (!hsq) return -1;
        float *dst = a->phi_sqnorm;
        R.later_fn.push_back([=] { for (int64_t j = 0; j < n; j++) dst[(*u)[b0 + j]] = hsq[j]; });
    }
    for (int which = 0; which < 2; which++) {
        char *dst = (char *)(which ? a->saved_up : a->saved_gate);
        if (!dst) continue;
        void *st;
        CKR(R.dalloc(r, &st, (size_t)(n * F) * as));
        CKR(lrmoe_kcu_from_f32(n * F, which ? hu : hg, abf, st));
        const char *h = (const char *)R.fetch(r, st, (size_t)(n * F) * as);
        if (!h) return -1;
        R.later_fn.push_back([=] {
            for (int64_t j = 0; j < n; j++)
                memcpy(dst + (size_t)((*u)[b0 + j] * F) * as, h + (size_t)(j * F) * as,
                       (size_t)F * as);
        });
    }
    return 0;
}

/* Rank r's experts on its rows X (layout order, storage dtype):
 * h_g, h_u = x W^T (F32), phi = silu(h_g) h_u, y = phi W_down^T; *Yst gets
 * the y rows in the storage dtype, as they travel. */
static int fwd_experts(run_t &R, const layout_t &L, lrmoe_exec_fwd_t *a, int r, const void *X,
                       void **Yst)
{
    const int64_t E = R.d->E, D = R.d->D, F = R.d->F;
    const lrmoe_dtype_t adt = a->act_dtype;
    const size_t rowb = (size_t)D * lrmoe_dtype_size(adt);
    int64_t n = L.base[r + 1] - L.base[r], b0 = L.base[r];
    if (!n) return 0;
    const uint16_t *xb;
    float *hg, *hu, *phi, *sq, *y;
    uint16_t *phib;
    CKR(as_bf16(R, r, adt, X, n * D, &xb));
    CKR(R.dalloc(r, &hg, (size_t)(n * F) * 4));
    CKR(R.dalloc(r, &hu, (size_t)(n * F) * 4));
    CKR(R.dalloc(r, &phi, (size_t)(n * F) * 4));
    CKR(R.dalloc(r, &phib, (size_t)(n * F) * 2));
    CKR(R.dalloc(r, &sq, (size_t)n * 4));
    CKR(R.dalloc(r, &y, (size_t)(n * D) * 4));
    std::vector<lrmoe_gemm_t> g1, g2;
    for (int64_t e = 0; e < E; e++) {
        int64_t c = L.cnt[r * E + e], i0 = L.seg[r * E + e] - b0;
        if (!c) continue;
        const uint16_t *W = R.rk[r].wbf[e];
        size_t FD = (size_t)(F * D);
        // x is (c,D), W_gate/W_up are (F,D): h = x W^T is (c,F)
        g1.push_back(G(c, F, D, 0, 1, xb + i0 * D, D, W, D, hg + i0 * F, F, 0.0f));
        g1.push_back(G(c, F, D, 0, 1, xb + i0 * D, D, W + FD, D, hu + i0 * F, F, 0.0f));
        // phi is (c,F), W_down is (D,F): y = phi W_down^T is (c,D)
        g2.push_back(G(c, D, F, 0, 1, phib + i0 * F, F, W + 2 * FD, F, y + i0 * D, D, 0.0f));
    }
    CKR(lrmoe_kcu_gemm((int)g1.size(), g1.data()));
    CKR(R.mark(r, LRMOE_STAGE_GEMM));
    CKR(lrmoe_kcu_swiglu_fwd(n, F, hg, hu, phi, sq));
    CKR(lrmoe_kcu_f32_to_bf16(n * F, phi, phib));
    CKR(fwd_save_state(R, L, a, r, n, b0, hg, hu, sq));
    CKR(R.mark(r, LRMOE_STAGE_ACT));
    CKR(lrmoe_kcu_gemm((int)g2.size(), g2.data()));
    CKR(R.dalloc(r, Yst, (size_t)n * rowb));
    CKR(lrmoe_kcu_from_f32(n * D, y, adt == LRMOE_BF16, *Yst));
    CKR(R.mark(r, LRMOE_STAGE_GEMM));
    return 0;
}

/* Forward combine on each owner s, after the reverse exchange (recv[s], upos):
 * out_t = sum_k alpha_tk y_tk, and the pair rows y_u when asked. */
static int fwd_combine(run_t &R, const layout_t &L, lrmoe_exec_fwd_t *a,
                       const std::vector<void *> &recv, const std::vector<int64_t> &upos)
{
    const int64_t K = R.d->K, D = R.d->D;
    const int abf = a->act_dtype == LRMOE_BF16;
    const size_t rowb = (size_t)D * lrmoe_dtype_size(a->act_dtype);
    for (int s = 0; s < R.P; s++) {
        if (!R.loc(s)) continue;
        rank_t &rs = R.rk[s];
        int64_t nt = rs.t_hi - rs.t_lo, nr = L.sbase[s + 1] - L.sbase[s];
        if (!nt) continue;
        std::vector<int64_t> row((size_t)(nt * K));
        for (int64_t j = 0; j < nt * K; j++) row[j] = upos[rs.t_lo * K + j];
        float *yf, *al, *o;
        int64_t *drow;
        void *ost;
        CKR(R.dalloc(s, &yf, (size_t)(nr * D) * 4));
        CKR(R.dalloc(s, &al, (size_t)(nt * K) * 4));
        CKR(R.dalloc(s, &drow, (size_t)(nt * K) * 8));
        CKR(R.dalloc(s, &o, (size_t)(nt * D) * 4));
        CKR(R.dalloc(s, &ost, (size_t)nt * rowb));
        CKR(lrmoe_kcu_to_f32(nr * D, abf, recv[s], yf));
        CKR(R.put(s, al, a->topk_weights + rs.t_lo * K, (size_t)(nt * K) * 4));
        CKR(R.put(s, drow, row.data(), (size_t)(nt * K) * 8));
        CKR(lrmoe_kcu_combine(nt, (int)K, D, al, drow, yf, o));
        CKR(lrmoe_kcu_from_f32(nt * D, o, abf, ost));
        CKR(R.out(s, (char *)a->output + (size_t)rs.t_lo * rowb, ost, (size_t)nt * rowb));
        if (R.X->dev) { /* pair rows gathered on the device, straight into pair_out */
            R.dur[s] = drow;
            if (a->pair_out)
                CKR(lrmoe_kcu_pack_gather(drow, nt * K, 1, 0, recv[s], rowb,
                                          (char *)a->pair_out + (size_t)(rs.t_lo * K) * rowb));
        } else if (a->pair_out) {
            const char *h = (const char *)R.fetch(s, recv[s], (size_t)nr * rowb);
            if (!h) return -1;
            char *dst = (char *)a->pair_out + (size_t)(rs.t_lo * K) * rowb;
            const int64_t *ur = &upos[rs.t_lo * K];
            R.later_fn.push_back([=] {
                for (int64_t j = 0; j < nt * K; j++)
                    memcpy(dst + (size_t)j * rowb, h + (size_t)ur[j] * rowb, rowb);
            });
        }
        CKR(R.mark(s, LRMOE_STAGE_COMBINE));
    }
    return 0;
}


/* Device I/O: ||phi||^2, h_g and h_u travel back to the token owners as y
 * did (same receive rows, R.dur) and are gathered there straight into the
 * caller's pair-major arrays. */
static int fwd_saved_back(run_t &R, const layout_t &L, lrmoe_exec_fwd_t *a)
{
    const int64_t K = R.d->K, F = R.d->F;
    const size_t as = lrmoe_dtype_size(a->act_dtype);
    struct { std::vector<void *> *rows; void *dst; size_t rb; } what[3] = {
        {&R.sv_sq, a->phi_sqnorm, 4}, {&R.sv_g, a->saved_gate, (size_t)F * as},
        {&R.sv_u, a->saved_up, (size_t)F * as}};
    for (auto &w : what) {
        if (!w.dst) continue;
        std::vector<void *> recv(R.P, nullptr);
        std::vector<int64_t> upos;
        CKR(exchange_rev(R, L, w.rb, *w.rows, recv, upos, LRMOE_STAGE_COMBINE));
        for (int s = 0; s < R.P; s++) {
            rank_t &rs = R.rk[s];
            int64_t nt = rs.t_hi - rs.t_lo;
            if (!R.loc(s) || !nt) continue;
            CKR(R.use(s));
            CKR(lrmoe_kcu_pack_gather(R.dur[s], nt * K, 1, 0, recv[s], w.rb,
                                      (char *)w.dst + (size_t)(rs.t_lo * K) * w.rb));
            CKR(R.mark(s, LRMOE_STAGE_COMBINE));
        }
    }
    return 0;
}

/* The forward's input checks and pair assignment (before any device work). */
static int fwd_check(const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                     const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan,
                     lrmoe_exec_fwd_t *a, int dev)
{
    if (check_common(d, w) < 0 || act_ok(a->act_dtype, "hidden") < 0) return -1;
    if (!a->hidden || !a->topk_ids || !a->topk_weights || !a->output || !a->pair_rank)
        return lrmoe_err("forward: missing hidden, topk_ids, topk_weights, output or pair_rank");
    const int P = d->P;
    /* device I/O: the activations are not readable here (not checked) */
    if (!dev && lrmoe_exec_check_fwd_inputs(cfg, d, a) < 0) return -1;
    const uint8_t *placement = plan ? plan->placement : NULL;
    return lrmoe_exec_assign(d->T, d->K, d->E, P, a->topk_ids, plan ? plan->fwd_alloc : NULL,
                             placement, a->pair_rank) < 0 ? -1 : 0;
}

static int x_forward_dr(xs_t *X, const lrmoe_exec_dims_t *d, const lrmoe_exec_weights_t *w,
                        lrmoe_exec_fwd_t *a, double *timings);
static int x_backward_dr(xs_t *X, const lrmoe_exec_dims_t *d, const lrmoe_exec_weights_t *w,
                         lrmoe_exec_bwd_t *a, double *timings);

/* A forward frame on executor X (also the one-shot lrmoe_exec_forward_cuda);
 * checked: fwd_check has run. */
static int x_forward(xs_t *X, const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                     const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan,
                     lrmoe_exec_fwd_t *a, double *timings, int checked)
{
    if (X->route) return x_forward_dr(X, d, w, a, timings);
    if (!checked && fwd_check(cfg, d, w, plan, a, X->dev) < 0) return -1;
    const int P = d->P;
    const uint8_t *placement = plan ? plan->placement : NULL;
    std::vector<double> tloc;
    double *tim = stage_times(P, timings, tloc);

    layout_t L;
    run_t R;
    int ok = 0;
    const size_t rowb = (size_t)d->D * lrmoe_dtype_size(a->act_dtype);
    std::vector<void *> sendb(P, nullptr), Xr(P, nullptr), Yst(P, nullptr), recv(P, nullptr);
    std::vector<int64_t> upos;
    if (layout_pairs(L, P, d->T, d->K, d->E, a->topk_ids, a->pair_rank) < 0) return -1;
    CK(run_init(R, X, d, tim));
    CK(load_weights(R, w, L, placement));
    /* dispatch: token rows to the ranks; experts; combine: y rows back to
     * the token owners. Every rank's work is queued before any is waited
     * for (run_finish). */
    CK(fwd_dispatch(R, L, a, rowb, sendb));
    CK(exchange_fwd(R, L, rowb, sendb, Xr, LRMOE_STAGE_DISPATCH));
    for (int r = 0; r < P; r++)
        if (R.loc(r)) CK(fwd_experts(R, L, a, r, Xr[r], &Yst[r]));
    CK(exchange_rev(R, L, rowb, Yst, recv, upos, LRMOE_STAGE_COMBINE));
    CK(fwd_combine(R, L, a, recv, upos));
    if (X->dev) CK(fwd_saved_back(R, L, a));
    ok = 1;
out:
    return run_finish(R, ok);
}

} /* namespace */

extern "C" int lrmoe_exec_forward_cuda(const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                                       const lrmoe_exec_weights_t *w,
                                       const lrmoe_exec_plan_t *plan, lrmoe_exec_fwd_t *a,
                                       double *timings)
{
    xs_t *X;
    if (fwd_check(cfg, d, w, plan, a, 0) < 0 || x_new(cfg, d->P, &X) < 0) return -1;
    int rc = x_forward(X, cfg, d, w, plan, a, timings, 1);
    x_free(X);
    return rc;
}

/* ---------------------------------------------------------------- backward */

namespace {

static int bwd_check(const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                     const lrmoe_exec_weights_t *w, const lrmoe_exec_bwd_t *a, int dev)
{
    if (check_common(d, w) < 0 || act_ok(a->act_dtype, "saved state") < 0 ||
        act_ok(a->grad_dtype, "grad_output") < 0)
        return -1;
    if (lrmoe_exec_check_bwd_args(d, a) < 0) return -1;
    return !dev && lrmoe_exec_check_bwd_inputs(cfg, d, a) < 0 ? -1 : 0;
}

/* The rows of the backward: lrmoe-pack's (compact), else the forward's
 * pairs, each on a rank that holds an instance of its expert. */
static int bwd_layout(layout_t &L, const lrmoe_exec_dims_t *d, const lrmoe_exec_bwd_t *a,
                      const uint8_t *placement)
{
    const int64_t T = d->T, K = d->K, E = d->E;
    const int P = d->P;
    if (a->mode == LRMOE_MODE_COMPACT) return layout_packed(L, P, T, K, E, a->topk_ids, a, placement);
    CKR(layout_pairs(L, P, T, K, E, a->topk_ids, a->pair_rank));
    if (placement)
        for (int64_t u = 0; u < T * K; u++)
            if (!placement[(int64_t)a->topk_ids[u] * P + a->pair_rank[u]])
                return lrmoe_err("pair_rank[%lld,%lld]: rank %d holds no instance of expert %d",
                                 (long long)(u / K), (long long)(u % K), a->pair_rank[u],
                                 a->topk_ids[u]);
    return 0;
}

/* Owner s's dy rows alpha_u g_t into send (send order rows, pairs u) in
 * BF16, zeroed where keep_u == 0 when masked; g is s's (T_s, D) F32
 * gradient. The rows are rounded to BF16 once, from the same F32 product,
 * as the expert rank did before they travelled in BF16. */
static int bwd_dispatch_pairs(run_t &R, const layout_t &L, const lrmoe_exec_bwd_t *a, int s,
                              const std::vector<int64_t> &rows, const float *g, uint16_t *send)
{
    const int64_t K = R.d->K, D = R.d->D;
    const int masked = a->mode == LRMOE_MODE_MASKED;
    rank_t &rs = R.rk[s];
    int64_t nt = rs.t_hi - rs.t_lo, ns = (int64_t)rows.size();
    std::vector<int64_t> idx(ns);
    std::vector<uint8_t> mk(ns);
    for (int64_t j = 0; j < ns; j++) {
        int64_t u = L.u[rows[j]];
        idx[j] = u - rs.t_lo * K;
        mk[j] = masked ? (a->keep[u] != 0) : 1;
    }
    float *al;
    int64_t *didx;
    uint8_t *dmk;
    CKR(R.dalloc(s, &al, (size_t)(nt * K) * 4));
    CKR(R.dalloc(s, &didx, (size_t)ns * 8));
    CKR(R.put(s, al, a->topk_weights + rs.t_lo * K, (size_t)(nt * K) * 4));
    CKR(R.put(s, didx, idx.data(), (size_t)ns * 8));
    if (!masked) return lrmoe_kcu_pack_gather_scaled_bf16(didx, ns, (int)K, D, g, al, send);
    float *f;
    CKR(R.dalloc(s, &f, (size_t)(ns * D) * 4));
    CKR(lrmoe_kcu_pack_gather_scaled(didx, ns, (int)K, D, g, al, f));
    CKR(R.dalloc(s, &dmk, (size_t)ns));
    CKR(R.put(s, dmk, mk.data(), (size_t)ns));
    CKR(lrmoe_kcu_mask_rows(ns, D, dmk, f));
    return lrmoe_kcu_f32_to_bf16(ns * D, f, send);
}

/* Backward dispatch on each owner s: grad_output to F32 (gtok[s], kept for
 * the router gradient), and the dy rows (BF16, the expert GEMMs' operand)
 * in send order into sendb[s]: alpha_u g_t (masked: zero where keep_u == 0),
 * compact: the pack_grad rows. */
static int bwd_dispatch(run_t &R, const layout_t &L, const lrmoe_exec_bwd_t *a,
                        std::vector<float *> &gtok, std::vector<void *> &sendb)
{
    const int64_t D = R.d->D;
    const size_t rowf = (size_t)D * 4, rowh = (size_t)D * 2, gs = lrmoe_dtype_size(a->grad_dtype);
    for (int s = 0; s < R.P; s++) {
        if (!R.loc(s)) continue;
        rank_t &rs = R.rk[s];
        int64_t nt = rs.t_hi - rs.t_lo;
        std::vector<int64_t> rows = send_rows(L, s);
        int64_t ns = (int64_t)rows.size();
        void *graw;
        CKR(R.dalloc(s, &graw, (size_t)nt * D * gs));
        CKR(R.dalloc(s, &gtok[s], (size_t)nt * rowf));
        CKR(R.dalloc(s, &sendb[s], (size_t)ns * rowh));
        CKR(R.in(s, graw, (const char *)a->grad_output + (size_t)(rs.t_lo * D) * gs,
                 (size_t)nt * D * gs));
        CKR(lrmoe_kcu_to_f32(nt * D, a->grad_dtype == LRMOE_BF16, graw, gtok[s]));
        if (a->mode == LRMOE_MODE_COMPACT && ns && R.X->dev) {
            /* the packed gradient rows this owner holds, gathered on the device */
            float *f;
            int64_t *didx;
            CKR(R.dalloc(s, &f, (size_t)ns * rowf));
            CKR(R.dalloc(s, &didx, (size_t)ns * 8));
            CKR(R.put(s, didx, rows.data(), (size_t)ns * 8));
            CKR(lrmoe_kcu_pack_gather(didx, ns, 1, 0, a->pack_grad, rowf, f));
            CKR(lrmoe_kcu_f32_to_bf16(ns * D, f, (uint16_t *)sendb[s]));
        } else if (a->mode == LRMOE_MODE_COMPACT && ns) {
            /* the packed gradient rows this owner holds, in send order */
            float *h = (float *)R.stage((size_t)ns * rowf), *f;
            if (!h) return -1;
            for (int64_t j = 0; j < ns; j++)
                memcpy(h + (size_t)j * D, a->pack_grad + rows[j] * D, rowf);
            CKR(R.dalloc(s, &f, (size_t)ns * rowf));
            CKR(R.use(s));
            CKR(lrmoe_kcu_h2d(f, h, (size_t)ns * rowf));
            CKR(lrmoe_kcu_f32_to_bf16(ns * D, f, (uint16_t *)sendb[s]));
        } else if (ns) {
            CKR(bwd_dispatch_pairs(R, L, a, s, rows, gtok[s], (uint16_t *)sendb[s]));
        }
        CKR(R.mark(s, LRMOE_STAGE_DISPATCH));
    }
    return 0;
}

/* Rank r's weight-gradient buffers (3 F*D F32) of every instance with rows;
 * the owner of an expert without local rows gets zeros. */
static int bwd_wgrad_alloc(run_t &R, const layout_t &L, int r, std::vector<float *> &wgrad)
{
    const int64_t E = R.d->E;
    const size_t FD = (size_t)(R.d->F * R.d->D);
    for (int64_t e = 0; e < E; e++) {
        int nat = lrmoe_exec_native(e, E, R.P);
        if (L.cnt[r * E + e] == 0 && nat != r) continue;
        CKR(R.dalloc(r, &wgrad[(size_t)r * E + e], 3 * FD * 4));
        if (L.cnt[r * E + e] == 0) CKR(lrmoe_kcu_memset(wgrad[(size_t)r * E + e], 0, 3 * FD * 4));
    }
    return 0;
}

/* The saved state of rank r's n rows (from b0), gathered where the rows run:
 * x (n,D), h_g and h_u (n,F), storage dtype, on the device. */
static int bwd_saved_state(run_t &R, const layout_t &L, const lrmoe_exec_bwd_t *a, int r,
                           int64_t n, int64_t b0, void **xs, void **gst, void **ust)
{
    const int64_t K = R.d->K, D = R.d->D, F = R.d->F;
    const size_t as = lrmoe_dtype_size(a->act_dtype);
    CKR(R.dalloc(r, xs, (size_t)(n * D) * as));
    CKR(R.dalloc(r, gst, (size_t)(n * F) * as));
    CKR(R.dalloc(r, ust, (size_t)(n * F) * as));
    if (a->mode == LRMOE_MODE_COMPACT) {
        CKR(R.in(r, *xs, (const char *)a->pack_hidden + (size_t)(b0 * D) * as, (size_t)(n * D) * as));
        CKR(R.in(r, *gst, (const char *)a->pack_gate + (size_t)(b0 * F) * as, (size_t)(n * F) * as));
        CKR(R.in(r, *ust, (const char *)a->pack_up + (size_t)(b0 * F) * as, (size_t)(n * F) * as));
        return 0;
    }
    if (R.X->dev) { /* gathered by pair on the device from the caller's arrays */
        int64_t *didx;
        CKR(R.dalloc(r, &didx, (size_t)n * 8));
        CKR(R.put(r, didx, &L.u[b0], (size_t)n * 8));
        CKR(lrmoe_kcu_pack_gather(didx, n, (int)K, 1, a->hidden, (size_t)D * as, *xs));
        CKR(lrmoe_kcu_pack_gather(didx, n, (int)K, 0, a->saved_gate, (size_t)F * as, *gst));
        CKR(lrmoe_kcu_pack_gather(didx, n, (int)K, 0, a->saved_up, (size_t)F * as, *ust));
        return 0;
    }
    /* gathered by pair straight into pinned staging */
    char *hx = (char *)R.stage((size_t)(n * D) * as), *hg_ = (char *)R.stage((size_t)(n * F) * as),
         *hu_ = (char *)R.stage((size_t)(n * F) * as);
    if (!hx || !hg_ || !hu_) return -1;
    for (int64_t j = 0; j < n; j++) {
        int64_t u = L.u[b0 + j];
        memcpy(hx + (size_t)(j * D) * as, (const char *)a->hidden + (size_t)((u / K) * D) * as, (size_t)D * as);
        memcpy(hg_ + (size_t)(j * F) * as, (const char *)a->saved_gate + (size_t)(u * F) * as, (size_t)F * as);
        memcpy(hu_ + (size_t)(j * F) * as, (const char *)a->saved_up + (size_t)(u * F) * as, (size_t)F * as);
    }
    CKR(R.use(r));
    CKR(lrmoe_kcu_h2d(*xs, hx, (size_t)(n * D) * as));
    CKR(lrmoe_kcu_h2d(*gst, hg_, (size_t)(n * F) * as));
    CKR(lrmoe_kcu_h2d(*ust, hu_, (size_t)(n * F) * as));
    return 0;
}

/* Device operands of rank r's backward GEMMs (rows in layout order). */
struct bwd_ops_t {
    const uint16_t *xb;        /* x (n,D) BF16 */
    const uint16_t *dyb;       /* dy (n,D) BF16 */
    const uint16_t *phib, *dgb, *dub; /* phi, dg, du (n,F) BF16 */
    float *dphi;               /* (n,F) */
    float *dx;                 /* (n,D) F32 */
};

/* Rank r's GEMMs, expert by expert: g1 dphi; g2 the weight gradients and
 * dx = dg W_gate; g3 dx += du W_up (after g2). */
static void bwd_gemms(const run_t &R, const layout_t &L, int r, const bwd_ops_t &o,
                      const std::vector<float *> &wgrad, std::vector<lrmoe_gemm_t> &g1,
                      std::vector<lrmoe_gemm_t> &g2, std::vector<lrmoe_gemm_t> &g3)
{
    const int64_t E = R.d->E, D = R.d->D, F = R.d->F;
    const size_t FD = (size_t)(F * D);
    const int64_t b0 = L.base[r];
    for (int64_t e = 0; e < E; e++) {
        int64_t c = L.cnt[r * E + e], i0 = L.seg[r * E + e] - b0;
        if (!c) continue;
        const uint16_t *W = R.rk[r].wbf[e];
        float *gw = wgrad[(size_t)r * E + e];
        // dy is (c,D), W_down is (D,F): dphi = dy W_down is (c,F)
        g1.push_back(G(c, F, D, 0, 0, o.dyb + i0 * D, D, W + 2 * FD, F, o.dphi + i0 * F, F, 0.0f));
        // grad W_down (D,F) = dy^T phi: the retained rows are the K dimension
        g2.push_back(G(D, F, c, 1, 0, o.dyb + i0 * D, D, o.phib + i0 * F, F, gw + 2 * FD, F, 0.0f));
        // grad W_gate, W_up (F,D) = dg^T x, du^T x
        g2.push_back(G(F, D, c, 1, 0, o.dgb + i0 * F, F, o.xb + i0 * D, D, gw, D, 0.0f));
        g2.push_back(G(F, D, c, 1, 0, o.dub + i0 * F, F, o.xb + i0 * D, D, gw + FD, D, 0.0f));
        // dx (c,D) = dg W_gate + du W_up
        g2.push_back(G(c, D, F, 0, 0, o.dgb + i0 * F, F, W, D, o.dx + i0 * D, D, 0.0f));
        g3.push_back(G(c, D, F, 0, 0, o.dub + i0 * F, F, W + FD, D, o.dx + i0 * D, D, 1.0f));
    }
}

/* SwiGLU backward of rank r's n rows: dg, du, phi as BF16 GEMM operands. */
static int bwd_swiglu(run_t &R, int r, int64_t n, int abf, const void *gst, const void *ust,
                      const float *dphi, uint16_t *dgb, uint16_t *dub, uint16_t *phib)
{
    const int64_t F = R.d->F;
    if (abf) {
        /* BF16 saved state: dg, du, phi straight to BF16 operands (the
         * same F32 arithmetic as below, without F32 copies in memory) */
        return lrmoe_kcu_swiglu_bwd_bf16(n, F, (const uint16_t *)gst, (const uint16_t *)ust, dphi,
                                         dgb, dub, phib);
    }
    float *dg, *du, *phi;
    CKR(R.dalloc(r, &dg, (size_t)(n * F) * 4));
    CKR(R.dalloc(r, &du, (size_t)(n * F) * 4));
    CKR(R.dalloc(r, &phi, (size_t)(n * F) * 4));
    CKR(lrmoe_kcu_swiglu_bwd(n, F, (const float *)gst, (const float *)ust, dphi, dg, du, phi));
    CKR(lrmoe_kcu_f32_to_bf16(n * F, phi, phib));
    CKR(lrmoe_kcu_f32_to_bf16(n * F, dg, dgb));
    CKR(lrmoe_kcu_f32_to_bf16(n * F, du, dub));
    return 0;
}

/* Rank r's experts on its dy rows DY (layout order, BF16): the weight
 * gradients into wgrad, and dx (n,D) F32 into *DX. */
static int bwd_experts(run_t &R, const layout_t &L, const lrmoe_exec_bwd_t *a, int r, void *DY,
                       void **DX, std::vector<float *> &wgrad)
{
    const int64_t D = R.d->D, F = R.d->F;
    const int abf = a->act_dtype == LRMOE_BF16;
    int64_t n = L.base[r + 1] - L.base[r], b0 = L.base[r];
    CKR(bwd_wgrad_alloc(R, L, r, wgrad));
    if (!n) return R.mark(r, LRMOE_STAGE_GEMM);
    void *xs, *gst, *ust;
    CKR(bwd_saved_state(R, L, a, r, n, b0, &xs, &gst, &ust));
    const uint16_t *xb, *dyb = (const uint16_t *)DY;
    uint16_t *phib, *dgb, *dub;
    float *dphi;
    CKR(as_bf16(R, r, a->act_dtype, xs, n * D, &xb));
    CKR(R.dalloc(r, &dphi, (size_t)(n * F) * 4));
    CKR(R.dalloc(r, &phib, (size_t)(n * F) * 2));
    CKR(R.dalloc(r, &dgb, (size_t)(n * F) * 2));
    CKR(R.dalloc(r, &dub, (size_t)(n * F) * 2));
    CKR(R.dalloc(r, DX, (size_t)(n * D) * 4));
    std::vector<lrmoe_gemm_t> g1, g2, g3;
    bwd_gemms(R, L, r, bwd_ops_t{xb, dyb, phib, dgb, dub, dphi, (float *)*DX}, wgrad, g1, g2, g3);
    CKR(lrmoe_kcu_gemm((int)g1.size(), g1.data()));
    CKR(R.mark(r, LRMOE_STAGE_GEMM));
    CKR(bwd_swiglu(R, r, n, abf, gst, ust, dphi, dgb, dub, phib));
    CKR(R.mark(r, LRMOE_STAGE_ACT));
    CKR(lrmoe_kcu_gemm((int)g2.size(), g2.data()));
    CKR(lrmoe_kcu_gemm((int)g3.size(), g3.data())); /* after g2: accumulates into dx */
    CKR(R.mark(r, LRMOE_STAGE_GEMM));
    return 0;
}

/* Gradient reduction: helpers send their weight gradients to the owner,
 * which adds them in ascending helper rank; then the owners' sums go to the
 * host. */
static int bwd_gradred(run_t &R, const layout_t &L, lrmoe_exec_bwd_t *a,
                       const std::vector<float *> &wgrad)
{
    const int P = R.P;
    const int64_t E = R.d->E;
    const size_t FD = (size_t)(R.d->F * R.d->D);
    for (int64_t e = 0; e < E; e++) {
        int nat = lrmoe_exec_native(e, E, P);
        float *own = wgrad[(size_t)nat * E + e];
        float *rb = nullptr;
        for (int p = 0; p < P; p++) {
            /* a helper's buffer exists where it ran rows of e (also when
             * that rank lives in another process) */
            if (p == nat || L.cnt[(size_t)p * E + e] == 0 || (!R.loc(p) && !R.loc(nat))) continue;
            if (R.loc(nat) && !rb) CKR(R.dalloc(nat, &rb, 3 * FD * 4));
            CKR(R.comm_ready());
            CKR(R.cm->p2p(R.cm, p, R.loc(p) ? wgrad[(size_t)p * E + e] : nullptr, nat, rb,
                          3 * FD * 4));
            if (!R.loc(nat)) continue;
            CKR(R.use(nat));
            CKR(lrmoe_kcu_add((int64_t)(3 * FD), rb, own));
        }
        if (!R.loc(nat)) continue;
        CKR(R.out(nat, a->grad_w_gate + e * FD, own, FD * 4));
        CKR(R.out(nat, a->grad_w_up + e * FD, own + FD, FD * 4));
        CKR(R.out(nat, a->grad_w_down + e * FD, own + 2 * FD, FD * 4));
    }
    for (int r = 0; r < P; r++)
        if (R.loc(r)) CKR(R.mark(r, LRMOE_STAGE_GRADRED));
    return 0;
}

/* Backward combine on each owner s, after the reverse exchange (recv[s],
 * upos): grad_hidden_t = sum_k dx_tk (ascending k); the router gradient
 * g_t . y_u over all pairs (gtok[s]: g in F32). */
static int bwd_combine(run_t &R, lrmoe_exec_bwd_t *a,
                       const std::vector<void *> &recv, const std::vector<int64_t> &upos,
                       const std::vector<float *> &gtok)
{
    const int64_t K = R.d->K, D = R.d->D;
    const size_t rowf = (size_t)D * 4, as = lrmoe_dtype_size(a->act_dtype);
    for (int s = 0; s < R.P; s++) {
        if (!R.loc(s)) continue;
        rank_t &rs = R.rk[s];
        int64_t nt = rs.t_hi - rs.t_lo;
        if (!nt) continue;
        std::vector<int64_t> row((size_t)(nt * K)), ident((size_t)(nt * K));
        std::vector<float> ones((size_t)(nt * K), 1.0f);
        for (int64_t j = 0; j < nt * K; j++) { row[j] = upos[rs.t_lo * K + j]; ident[j] = j; }
        float *on, *gh, *yf, *gtw;
        int64_t *drow, *did;
        void *yst;
        CKR(R.dalloc(s, &on, (size_t)(nt * K) * 4));
        CKR(R.dalloc(s, &drow, (size_t)(nt * K) * 8));
        CKR(R.dalloc(s, &did, (size_t)(nt * K) * 8));
        CKR(R.dalloc(s, &gh, (size_t)nt * rowf));
        CKR(R.dalloc(s, &yst, (size_t)(nt * K) * D * as));
        CKR(R.dalloc(s, &yf, (size_t)(nt * K) * rowf));
        CKR(R.dalloc(s, &gtw, (size_t)(nt * K) * 4));
        CKR(R.put(s, on, ones.data(), (size_t)(nt * K) * 4));
        CKR(R.put(s, drow, row.data(), (size_t)(nt * K) * 8));
        CKR(R.put(s, did, ident.data(), (size_t)(nt * K) * 8));
        /* 1.0f * row is exact: this is the plain ascending-k sum */
        CKR(lrmoe_kcu_combine(nt, (int)K, D, on, drow, (const float *)recv[s], gh));
        CKR(R.out(s, a->grad_hidden + rs.t_lo * D, gh, (size_t)nt * rowf));
        CKR(R.in(s, yst, (const char *)a->pair_out + (size_t)(rs.t_lo * K * D) * as,
                 (size_t)(nt * K) * D * as));
        CKR(lrmoe_kcu_to_f32(nt * K * D, a->act_dtype == LRMOE_BF16, yst, yf));
        CKR(lrmoe_kcu_pair_dot(nt, (int)K, D, gtok[s], did, yf, gtw));
        CKR(R.out(s, a->grad_topk_weights + rs.t_lo * K, gtw, (size_t)(nt * K) * 4));
        CKR(R.mark(s, LRMOE_STAGE_COMBINE));
    }
    return 0;
}


/* A backward frame on executor X (also the one-shot lrmoe_exec_backward_cuda);
 * checked: bwd_check has run. */
static int x_backward(xs_t *X, const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                      const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan,
                      lrmoe_exec_bwd_t *a, double *timings, int checked)
{
    if (X->route) return x_backward_dr(X, d, w, a, timings);
    if (!checked && bwd_check(cfg, d, w, a, X->dev) < 0) return -1;
    const int P = d->P;
    const uint8_t *placement = plan ? plan->placement : NULL;
    std::vector<double> tloc;
    double *tim = stage_times(P, timings, tloc);

    layout_t L;
    run_t R;
    int ok = 0;
    const size_t rowf = (size_t)d->D * 4, rowh = (size_t)d->D * 2;
    std::vector<void *> sendb(P, nullptr), DY(P, nullptr), DX(P, nullptr), recv(P, nullptr);
    std::vector<float *> gtok(P, nullptr);              /* (T_s, D) f32 g on its owner */
    std::vector<float *> wgrad((size_t)P * d->E, nullptr); /* (3*FD) per instance */
    std::vector<int64_t> upos;
    if (bwd_layout(L, d, a, placement) < 0) return -1;
    CK(run_init(R, X, d, tim));
    CK(load_weights(R, w, L, placement));
    /* dispatch: dy rows (BF16) to the ranks; experts; gradient reduction;
     * combine: dx rows back to the token owners. Every rank's work is
     * queued before any is waited for (run_finish). */
    CK(bwd_dispatch(R, L, a, gtok, sendb));
    CK(exchange_fwd(R, L, rowh, sendb, DY, LRMOE_STAGE_DISPATCH));
    for (int r = 0; r < P; r++)
        if (R.loc(r)) CK(bwd_experts(R, L, a, r, DY[r], &DX[r], wgrad));
    CK(bwd_gradred(R, L, a, wgrad));
    CK(exchange_rev(R, L, rowf, DX, recv, upos, LRMOE_STAGE_COMBINE));
    CK(bwd_combine(R, a, recv, upos, gtok));
    ok = 1;
out:
    return run_finish(R, ok);
}

/* ---------------------------------------------------------------- device routing */

/* Device routing (lrmoe_exec_cuda_set_io(x, 2, stream), one rank): topk_ids
 * and topk_weights are device arrays too and the layout is computed on the
 * device (lrmoe_kcu_pack_assign: expert-major rows, pairs ascending in an
 * expert, the host layout's order), the expert GEMMs run as
 * lrmoe_kcu_ggemm over the device-side row offsets, and nothing crosses to
 * the host: no staging, no host wait, no timing event, every launch of a
 * fixed shape for given T. So a frame can be captured into a CUDA graph
 * once the executor has run one frame of the weights outside the capture
 * (they are made resident then) and replayed with new routing in the same
 * device arrays. Numerics: the same kernels on the same rows as the
 * host-routing frame, the GEMMs CUTLASS's (the fake device: bit for bit
 * the host-routing frame). An expert id out of range is found on the
 * device; its frame's rows are then wrong (never out of bounds) and the
 * error is reported by the next frame run outside a capture. */

struct dlayout_t {
    int64_t *pair = nullptr;   /* (M) the pair of each row */
    int64_t *row = nullptr;    /* (M) the row of each pair */
    int64_t *offs = nullptr;   /* (E+1) first row of each expert, then M */
};

static int dr_layout(run_t &R, const int32_t *topk, dlayout_t &L)
{
    const int64_t T = R.d->T, K = R.d->K, E = R.d->E, M = T * K;
    uint8_t *keep;
    int32_t *rank;
    int64_t *counts;
    CKR(R.use(0));
    if (!R.capturing) CKR(lrmoe_kcu_flags_check()); /* the last frame's input checks */
    CKR(R.dalloc(0, &keep, (size_t)M));
    CKR(R.dalloc(0, &rank, (size_t)M * 4));
    CKR(R.dalloc(0, &counts, (size_t)E * 8));
    CKR(R.dalloc(0, &L.pair, (size_t)M * 8));
    CKR(R.dalloc(0, &L.row, (size_t)M * 8));
    CKR(R.dalloc(0, &L.offs, (size_t)(E + 1) * 8));
    CKR(lrmoe_kcu_memset(keep, 1, (size_t)M));
    /* what an invalid expert id leaves unplaced stays pair 0 and row 0: in bounds */
    CKR(lrmoe_kcu_memset(L.pair, 0, (size_t)M * 8));
    CKR(lrmoe_kcu_memset(L.row, 0, (size_t)M * 8));
    CKR(lrmoe_kcu_flags_hold(1));
    int rc = lrmoe_kcu_pack_assign(T, (int)K, (int)E, 1, topk, keep, nullptr, nullptr, M, L.pair,
                                   rank, counts, L.offs);
    if (lrmoe_kcu_flags_hold(0) < 0 || rc < 0) return -1;
    CKR(lrmoe_kcu_seq_i64(1, M, 0, L.offs + E));
    return lrmoe_kcu_invert_i64(M, L.pair, L.row);
}

/* The resident BF16 weights of one rank, expert e at e * 3 F D: made on a
 * frame outside a capture, only looked up inside one. */
static int dr_weights(run_t &R, const lrmoe_exec_weights_t *w, const uint16_t **wb)
{
    xw_t *W = weights_find(R.X, R.d, w);
    if (R.capturing && (!W || !W->wbf[0]))
        return lrmoe_err("backend cuda: these weights are not resident yet: run one frame "
                         "outside the CUDA graph capture first");
    if (!W && !(W = weights_set(R, w))) return -1;
    CKR(rank_weights(R, W, 0));
    *wb = (const uint16_t *)W->wbf[0];
    return 0;
}

/* One grouped GEMM over the experts' rows (lrmoe_ggemm_t, kcu.h). */
static int GG(const run_t &R, const dlayout_t &L, int kgrouped, int64_t m, int64_t n, int64_t k,
              int tb, const void *a, int64_t lda, const void *b, int64_t ldb, int64_t sb,
              void *c, int64_t ldc, int64_t sc, float beta)
{
    lrmoe_ggemm_t g;
    memset(&g, 0, sizeof g);
    g.kgrouped = kgrouped;
    g.ngroups = (int)R.d->E;
    g.offsets = L.offs;
    g.rows = R.d->T * R.d->K;
    g.m = m; g.n = n; g.k = k;
    g.ta = kgrouped; g.tb = tb;
    g.a = a; g.b = b; g.c = c;
    g.lda = lda; g.ldb = ldb; g.ldc = ldc;
    g.sb = sb; g.sc = sc;
    g.alpha = 1.0f; g.beta = beta;
    return lrmoe_kcu_ggemm(&g);
}

static int dr_common(xs_t *X, const lrmoe_exec_dims_t *d, const lrmoe_exec_weights_t *w)
{
    if (check_common(d, w) < 0) return -1;
    if (d->P != 1 || X->P != 1)
        return lrmoe_err("backend cuda: device routing runs one rank (P=%d)", d->P);
    if (!lrmoe_kcu_have_cutlass())
        return lrmoe_err("backend cuda: device routing needs the CUTLASS grouped GEMM (a build "
                         "that found the CUTLASS headers, an sm_90 GPU)");
    if (d->E > INT32_MAX || d->K > INT32_MAX)
        return lrmoe_err("backend cuda: device routing: E or K above 2^31-1");
    return 0;
}

static int x_forward_dr(xs_t *X, const lrmoe_exec_dims_t *d, const lrmoe_exec_weights_t *w,
                        lrmoe_exec_fwd_t *a, double *timings)
{
    if (dr_common(X, d, w) < 0 || act_ok(a->act_dtype, "hidden") < 0) return -1;
    if (!a->hidden || !a->topk_ids || !a->topk_weights || !a->output)
        return lrmoe_err("forward: missing hidden, topk_ids, topk_weights or output");
    const int64_t T = d->T, K = d->K, D = d->D, F = d->F, M = T * K;
    const size_t FD = (size_t)(F * D), as = lrmoe_dtype_size(a->act_dtype),
                 rowb = (size_t)D * as;
    const int abf = a->act_dtype == LRMOE_BF16;
    std::vector<double> tloc;
    (void)stage_times(1, timings, tloc);
    if (a->pair_rank) memset(a->pair_rank, 0, (size_t)M * sizeof *a->pair_rank); /* one rank */
    run_t R;
    dlayout_t L;
    int ok = 0;
    const uint16_t *wb, *xb;
    void *xs, *Yst;
    float *hg, *hu, *phi, *sq, *y, *yf, *o;
    uint16_t *phib;
    CK(run_init(R, X, d, nullptr));
    CK(dr_weights(R, w, &wb));
    CK(dr_layout(R, a->topk_ids, L));
    /* x rows, expert-major; h_g, h_u = x W^T; phi = silu(h_g) h_u; y = phi W_down^T */
    CK(R.dalloc(0, &xs, (size_t)M * rowb));
    CK(lrmoe_kcu_pack_gather(L.pair, M, (int)K, 1, a->hidden, rowb, xs));
    CK(as_bf16(R, 0, a->act_dtype, xs, M * D, &xb));
    CK(R.dalloc(0, &hg, (size_t)(M * F) * 4));
    CK(R.dalloc(0, &hu, (size_t)(M * F) * 4));
    CK(R.dalloc(0, &phi, (size_t)(M * F) * 4));
    CK(R.dalloc(0, &phib, (size_t)(M * F) * 2));
    CK(R.dalloc(0, &sq, (size_t)M * 4));
    CK(R.dalloc(0, &y, (size_t)(M * D) * 4));
    CK(GG(R, L, 0, 0, F, D, 1, xb, D, wb, D, (int64_t)(3 * FD), hg, F, 0, 0.0f));
    CK(GG(R, L, 0, 0, F, D, 1, xb, D, wb + FD, D, (int64_t)(3 * FD), hu, F, 0, 0.0f));
    CK(lrmoe_kcu_swiglu_fwd(M, F, hg, hu, phi, sq));
    CK(lrmoe_kcu_f32_to_bf16(M * F, phi, phib));
    /* the saved state by pair, in the storage dtype as on the host path */
    if (a->phi_sqnorm) CK(lrmoe_kcu_pack_gather(L.row, M, 1, 0, sq, 4, a->phi_sqnorm));
    for (int which = 0; which < 2; which++) {
        void *dst = which ? a->saved_up : a->saved_gate, *st;
        if (!dst) continue;
        CK(R.dalloc(0, &st, (size_t)(M * F) * as));
        CK(lrmoe_kcu_from_f32(M * F, which ? hu : hg, abf, st));
        CK(lrmoe_kcu_pack_gather(L.row, M, 1, 0, st, (size_t)F * as, dst));
    }
    CK(GG(R, L, 0, 0, D, F, 1, phib, F, wb + 2 * FD, F, (int64_t)(3 * FD), y, D, 0, 0.0f));
    /* y in the storage dtype (as it travels), combined by token */
    CK(R.dalloc(0, &Yst, (size_t)M * rowb));
    CK(lrmoe_kcu_from_f32(M * D, y, abf, Yst));
    CK(R.dalloc(0, &yf, (size_t)(M * D) * 4));
    CK(lrmoe_kcu_to_f32(M * D, abf, Yst, yf));
    CK(R.dalloc(0, &o, (size_t)(T * D) * 4));
    CK(lrmoe_kcu_combine(T, (int)K, D, a->topk_weights, L.row, yf, o));
    CK(lrmoe_kcu_from_f32(T * D, o, abf, a->output));
    if (a->pair_out) CK(lrmoe_kcu_pack_gather(L.row, M, 1, 0, Yst, rowb, a->pair_out));
    ok = 1;
out:
    return run_finish(R, ok);
}

static int x_backward_dr(xs_t *X, const lrmoe_exec_dims_t *d, const lrmoe_exec_weights_t *w,
                         lrmoe_exec_bwd_t *a, double *timings)
{
    if (dr_common(X, d, w) < 0 || act_ok(a->act_dtype, "saved state") < 0 ||
        act_ok(a->grad_dtype, "grad_output") < 0)
        return -1;
    if (a->mode != LRMOE_MODE_FULL)
        return lrmoe_err("backend cuda: device routing runs the full backward only");
    if (!a->hidden || !a->saved_gate || !a->saved_up || !a->pair_out || !a->grad_output ||
        !a->topk_ids || !a->topk_weights || !a->grad_hidden || !a->grad_w_gate ||
        !a->grad_w_up || !a->grad_w_down || !a->grad_topk_weights)
        return lrmoe_err("backward: missing an input (hidden, saved_gate, saved_up, pair_out, "
                         "grad_output, topk_ids, topk_weights) or output array");
    const int64_t T = d->T, K = d->K, D = d->D, F = d->F, M = T * K;
    const size_t FD = (size_t)(F * D), as = lrmoe_dtype_size(a->act_dtype);
    const int abf = a->act_dtype == LRMOE_BF16;
    std::vector<double> tloc;
    (void)stage_times(1, timings, tloc);
    run_t R;
    dlayout_t L;
    int ok = 0;
    const uint16_t *wb, *xb;
    void *xs, *gst, *ust;
    float *gtok, *dphi, *dx, *yf;
    uint16_t *dy, *phib, *dgb, *dub;
    int64_t *ident;
    CK(run_init(R, X, d, nullptr));
    CK(dr_weights(R, w, &wb));
    CK(dr_layout(R, a->topk_ids, L));
    /* dy = alpha_u g_t by row (BF16); the rows' x, h_g, h_u */
    CK(R.dalloc(0, &gtok, (size_t)(T * D) * 4));
    CK(lrmoe_kcu_to_f32(T * D, a->grad_dtype == LRMOE_BF16, a->grad_output, gtok));
    CK(R.dalloc(0, &dy, (size_t)(M * D) * 2));
    CK(lrmoe_kcu_pack_gather_scaled_bf16(L.pair, M, (int)K, D, gtok, a->topk_weights, dy));
    CK(R.dalloc(0, &xs, (size_t)(M * D) * as));
    CK(R.dalloc(0, &gst, (size_t)(M * F) * as));
    CK(R.dalloc(0, &ust, (size_t)(M * F) * as));
    CK(lrmoe_kcu_pack_gather(L.pair, M, (int)K, 1, a->hidden, (size_t)D * as, xs));
    CK(lrmoe_kcu_pack_gather(L.pair, M, (int)K, 0, a->saved_gate, (size_t)F * as, gst));
    CK(lrmoe_kcu_pack_gather(L.pair, M, (int)K, 0, a->saved_up, (size_t)F * as, ust));
    CK(as_bf16(R, 0, a->act_dtype, xs, M * D, &xb));
    CK(R.dalloc(0, &dphi, (size_t)(M * F) * 4));
    CK(R.dalloc(0, &phib, (size_t)(M * F) * 2));
    CK(R.dalloc(0, &dgb, (size_t)(M * F) * 2));
    CK(R.dalloc(0, &dub, (size_t)(M * F) * 2));
    CK(R.dalloc(0, &dx, (size_t)(M * D) * 4));
    /* dphi = dy W_down; SwiGLU backward; the weight gradients (K-grouped,
     * straight into the caller's arrays; an expert without rows gets 0);
     * dx = dg W_gate + du W_up */
    CK(GG(R, L, 0, 0, F, D, 0, dy, D, wb + 2 * FD, F, (int64_t)(3 * FD), dphi, F, 0, 0.0f));
    CK(bwd_swiglu(R, 0, M, abf, gst, ust, dphi, dgb, dub, phib));
    CK(GG(R, L, 1, D, F, 0, 0, dy, D, phib, F, 0, a->grad_w_down, F, (int64_t)FD, 0.0f));
    CK(GG(R, L, 1, F, D, 0, 0, dgb, F, xb, D, 0, a->grad_w_gate, D, (int64_t)FD, 0.0f));
    CK(GG(R, L, 1, F, D, 0, 0, dub, F, xb, D, 0, a->grad_w_up, D, (int64_t)FD, 0.0f));
    CK(GG(R, L, 0, 0, D, F, 0, dgb, F, wb, D, (int64_t)(3 * FD), dx, D, 0, 0.0f));
    CK(GG(R, L, 0, 0, D, F, 0, dub, F, wb + FD, D, (int64_t)(3 * FD), dx, D, 0, 1.0f));
    /* grad_hidden_t = sum_k dx_tk in ascending k; the router gradient g_t . y_u */
    {   /* its check of the rows' pairs deferred like pack_assign's */
        if (lrmoe_kcu_flags_hold(1) < 0) goto out;
        int rc = lrmoe_kcu_pack_unpack(L.pair, M, dx, D, T, (int)K, a->grad_hidden);
        if (lrmoe_kcu_flags_hold(0) < 0 || rc < 0) goto out;
    }
    CK(R.dalloc(0, &yf, (size_t)(M * D) * 4));
    CK(lrmoe_kcu_to_f32(M * D, abf, a->pair_out, yf));
    CK(R.dalloc(0, &ident, (size_t)M * 8));
    CK(lrmoe_kcu_seq_i64(M, 0, 1, ident));
    CK(lrmoe_kcu_pair_dot(T, (int)K, D, gtok, ident, yf, a->grad_topk_weights));
    ok = 1;
out:
    return run_finish(R, ok);
}

} /* namespace */

extern "C" int lrmoe_exec_backward_cuda(const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                                        const lrmoe_exec_weights_t *w,
                                        const lrmoe_exec_plan_t *plan, lrmoe_exec_bwd_t *a,
                                        double *timings)
{
    xs_t *X;
    if (bwd_check(cfg, d, w, a, 0) < 0 || x_new(cfg, d->P, &X) < 0) return -1;
    int rc = x_backward(X, cfg, d, w, plan, a, timings, 1);
    x_free(X);
    return rc;
}

/* ---------------------------------------------------------------- the executor (exec.h) */

extern "C" int lrmoe_exec_cuda_new(const lrmoe_exec_cfg_t *cfg, int P, lrmoe_exec_cuda_t **out)
{
    return x_new(cfg, P, out);
}

extern "C" void lrmoe_exec_cuda_free(lrmoe_exec_cuda_t *x) { x_free(x); }

extern "C" int lrmoe_exec_cuda_set_io(lrmoe_exec_cuda_t *x, int device_io, void *stream)
{
    int first = -1;
    for (int r = 0; r < x->P; r++) {
        if (!x->ctx[r]) continue;
        if (first < 0) first = r;
        else if (device_io && lrmoe_kcu_device(x->ctx[r]) != lrmoe_kcu_device(x->ctx[first]))
            return lrmoe_err("backend cuda: device I/O needs every rank of this process on one "
                             "device (ranks %d and %d are on devices %d and %d)", first, r,
                             lrmoe_kcu_device(x->ctx[first]), lrmoe_kcu_device(x->ctx[r]));
    }
    if (device_io < 0 || device_io > 2)
        return lrmoe_err("backend cuda: device I/O %d (0 host arrays, 1 device activations, "
                         "2 device routing too)", device_io);
    if (device_io == 2 && (x->P != 1 || x->self))
        return lrmoe_err("backend cuda: device routing runs one rank in this process (the "
                         "executor has %d%s)", x->P, x->self ? ", one of a job" : "");
    if (x->pending) { /* the last device-I/O frame's staging and events */
        if (lrmoe_kcu_use(x->ctx[first]) < 0 || lrmoe_kcu_event_sync(x->join[first]) < 0) return -1;
        x->pending = 0;
    }
    if (device_io && !x->start &&
        (lrmoe_kcu_use(x->ctx[first]) < 0 || lrmoe_kcu_event_create(&x->start, 0) < 0))
        return -1;
    x->dev = device_io != 0;
    x->route = device_io == 2;
    x->stream = stream;
    (void)lrmoe_kcu_use(nullptr);
    return 0;
}

extern "C" int lrmoe_exec_cuda_weights_changed(lrmoe_exec_cuda_t *x)
{
    /* the resident copies are freed in each rank's stream order: no wait */
    for (xw_t *W : x->ws) xw_free(x, W);
    x->ws.clear();
    (void)lrmoe_kcu_use(nullptr);
    return 0;
}

extern "C" int lrmoe_exec_cuda_forward(lrmoe_exec_cuda_t *x, const lrmoe_exec_cfg_t *cfg,
                                       const lrmoe_exec_dims_t *d, const lrmoe_exec_weights_t *w,
                                       const lrmoe_exec_plan_t *plan, lrmoe_exec_fwd_t *a,
                                       double *timings)
{
    return x_forward(x, cfg, d, w, plan, a, timings, 0);
}

extern "C" int lrmoe_exec_cuda_backward(lrmoe_exec_cuda_t *x, const lrmoe_exec_cfg_t *cfg,
                                        const lrmoe_exec_dims_t *d, const lrmoe_exec_weights_t *w,
                                        const lrmoe_exec_plan_t *plan, lrmoe_exec_bwd_t *a,
                                        double *timings)
{
    return x_backward(x, cfg, d, w, plan, a, timings, 0);
}

/* ---------------------------------------------------------------- pair scores (exec.h) */

/* On the first local rank's context, after the set_io stream's queued work
 * (g and phi_sqnorm are written there: autograd, the forward frame):
 * g to F32 when BF16, the kernel, one copy of the scores back and one host
 * wait; the temporaries freed in stream order. */
extern "C" int lrmoe_exec_cuda_score(lrmoe_exec_cuda_t *x, int metric, int64_t T, int K,
                                     int64_t D, lrmoe_dtype_t gdt, const void *g,
                                     const float *alpha, const float *phi_sqnorm, float *score)
{
    if (!x->dev)
        return lrmoe_err("backend cuda: device scores need device-pointer I/O "
                         "(lrmoe_exec_cuda_set_io)");
    /* the module calls liblrmoe only through its table: score.h's names here */
    static const char *const names[LRMOE_NMETRICS] = {"lrm", "gradnorm", "absgrad", "random",
                                                      "uniform"};
    const char *mname = (unsigned)metric < LRMOE_NMETRICS ? names[metric] : "?";
    if (metric != LRMOE_METRIC_LRM && metric != LRMOE_METRIC_GRADNORM &&
        metric != LRMOE_METRIC_ABSGRAD)
        return lrmoe_err("backend cuda: metric %s has no device kernel (lrm, gradnorm, absgrad)",
                         mname);
    if (T < 0 || K < 1 || D < 0) return lrmoe_err("pair_score: bad sizes");
    if (gdt != LRMOE_F32 && gdt != LRMOE_BF16)
        return lrmoe_err("pair_score: grad_output is %s (F32 or BF16 on the device)",
                         lrmoe_dtype_name(gdt));
    if (!T) return 0;
    if (!score || (!g && D) || (metric == LRMOE_METRIC_LRM && (!alpha || !phi_sqnorm)))
        return lrmoe_err("pair_score: a NULL array (metric %s needs grad_output%s)",
                         mname, metric == LRMOE_METRIC_LRM ? ", topk_weights and phi_sqnorm" : "");
    int first = 0;
    while (first < x->P && !x->ctx[first]) first++;
    if (first == x->P) return lrmoe_err("backend cuda: the executor has no local rank");
    const size_t n = (size_t)T * K;
    float *g32 = nullptr, *sc = nullptr;
    int rc = -1;
    if (lrmoe_kcu_use(x->ctx[first]) < 0) return -1;
    if (lrmoe_kcu_event_record_on(x->start, x->stream) < 0 ||
        lrmoe_kcu_event_wait(x->start) < 0 ||
        lrmoe_kcu_alloc((void **)&sc, n * sizeof(float)) < 0)
        goto out;
    if (gdt == LRMOE_BF16 && D) {
        if (lrmoe_kcu_alloc((void **)&g32, (size_t)T * D * sizeof(float)) < 0 ||
            lrmoe_kcu_to_f32(T * D, 1, g, g32) < 0)
            goto out;
    }
    if (metric != LRMOE_METRIC_LRM) alpha = phi_sqnorm = nullptr; /* not read */
    if (lrmoe_kcu_pair_score(metric, T, K, D, g32 ? g32 : (const float *)g, alpha, phi_sqnorm,
                             sc) < 0 ||
        lrmoe_kcu_d2h(score, sc, n * sizeof(float)) < 0 || lrmoe_kcu_sync() < 0)
        goto out;
    rc = 0;
out:
    (void)lrmoe_kcu_free(sc);
    (void)lrmoe_kcu_free(g32);
    (void)lrmoe_kcu_use(nullptr);
    return rc;
}
