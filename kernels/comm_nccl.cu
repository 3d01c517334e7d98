/* CUDA communicator: NCCL between distinct devices, device copies when ranks
 * share a device (see comm_cuda.h). */
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include "kcu_internal.h"
#include "comm_cuda.h"
#include "clock.h"

#define KCU_NCCL(call) do { ncclResult_t r_ = (call); if (r_ != ncclSuccess) \
    return lrmoe_err("%s: %s", kcu_callname(#call), ncclGetErrorString(r_)); } while (0)

typedef struct {
    int P, nccl;
    lrmoe_kcu_ctx_t **ctx;   /* (P) borrowed */
    ncclComm_t *comm;        /* (P) when nccl */
    int async;               /* lrmoe_comm_cuda_set_async: events, no host waits */
    cudaEvent_t *ev;         /* (P) one per rank, on its device, when async */
} cstate_t;

static cstate_t *st(lrmoe_comm_t *c) { return (cstate_t *)c->ctx; }

/* Wait for every rank's stream. */
static int sync_all(cstate_t *s)
{
    for (int r = 0; r < s->P; r++) {
        KCU_CUDA(cudaSetDevice(s->ctx[r]->device));
        KCU_CUDA(cudaStreamSynchronize(s->ctx[r]->stream));
    }
    return 0;
}

static int restore(void)
{
    lrmoe_kcu_ctx_t *c = lrmoe_kcu_current();
    if (c) KCU_CUDA(cudaSetDevice(c->device));
    return 0;
}

static int nccl_a2a(cstate_t *s, size_t es, const void *const *send, const int64_t *counts,
                    const int64_t *sdispls, void *const *recv, const int64_t *rdispls)
{
    int P = s->P;
    KCU_NCCL(ncclGroupStart());
    for (int a = 0; a < P; a++)
        for (int b = 0; b < P; b++) {
            /* rank a sends to b, and receives from b */
            int64_t ns = counts[(size_t)a * P + b], nr = counts[(size_t)b * P + a];
            if (ns > 0) {
                ncclResult_t r = ncclSend((const char *)send[a] + (size_t)sdispls[(size_t)a * P + b] * es,
                                          (size_t)ns * es, ncclUint8, b, s->comm[a], s->ctx[a]->stream);
                if (r != ncclSuccess) {
                    (void)ncclGroupEnd();
                    return lrmoe_err("ncclSend: %s", ncclGetErrorString(r));
                }
            }
            if (nr > 0) {
                ncclResult_t r = ncclRecv((char *)recv[a] + (size_t)rdispls[(size_t)a * P + b] * es,
                                          (size_t)nr * es, ncclUint8, b, s->comm[a], s->ctx[a]->stream);
                if (r != ncclSuccess) {
                    (void)ncclGroupEnd();
                    return lrmoe_err("ncclRecv: %s", ncclGetErrorString(r));
                }
            }
        }
    KCU_NCCL(ncclGroupEnd());
    return 0;
}

static int copy_a2a(cstate_t *s, size_t es, const void *const *send, const int64_t *counts,
                    const int64_t *sdispls, void *const *recv, const int64_t *rdispls)
{
    int P = s->P;
    for (int d = 0; d < P; d++) {
        KCU_CUDA(cudaSetDevice(s->ctx[d]->device));
        for (int r = 0; r < P; r++) {
            int64_t n = counts[(size_t)r * P + d];
            if (n <= 0) continue;
            KCU_CUDA(cudaMemcpyAsync((char *)recv[d] + (size_t)rdispls[(size_t)d * P + r] * es,
                                     (const char *)send[r] + (size_t)sdispls[(size_t)r * P + d] * es,
                                     (size_t)n * es, cudaMemcpyDefault, s->ctx[d]->stream));
        }
    }
    return 0;
}

/* Async mode: rank r's stream waits for rank q's queued work (an event
 * recorded on q's stream now). */
static int order_after(cstate_t *s, int r, int q)
{
    if (r == q || s->ctx[r]->stream == s->ctx[q]->stream) return 0;
    KCU_CUDA(cudaSetDevice(s->ctx[q]->device));
    KCU_CUDA(cudaEventRecord(s->ev[q], s->ctx[q]->stream));
    KCU_CUDA(cudaSetDevice(s->ctx[r]->device));
    KCU_CUDA(cudaStreamWaitEvent(s->ctx[r]->stream, s->ev[q], 0));
    return 0;
}

/* Async device copies: each receiver's stream first waits for every sender
 * that sends to it (its rows are written), copies on its own stream, and
 * every sender's stream then waits for its receivers (the send buffer
 * outlives the copies: stream-ordered frees on the sender's stream). */
static int async_copy_a2a(cstate_t *s, size_t es, const void *const *send,
                          const int64_t *counts, const int64_t *sdispls, void *const *recv,
                          const int64_t *rdispls)
{
    int P = s->P;
    for (int d = 0; d < P; d++)
        for (int r = 0; r < P; r++)
            if (counts[(size_t)r * P + d] > 0 && order_after(s, d, r) < 0) return -1;
    if (copy_a2a(s, es, send, counts, sdispls, recv, rdispls) < 0) return -1;
    for (int r = 0; r < P; r++)
        for (int d = 0; d < P; d++)
            if (counts[(size_t)r * P + d] > 0 && order_after(s, r, d) < 0) return -1;
    return 0;
}

static int cuda_alltoallv(lrmoe_comm_t *c, size_t es, const void *const *send,
                          const int64_t *counts, const int64_t *sdispls, void *const *recv,
                          const int64_t *rdispls, double *rank_sec)
{
    cstate_t *s = st(c);
    int P = s->P;
    for (int i = 0; i < P * P; i++)
        if (counts[i] < 0)
            return lrmoe_err("alltoallv: negative count from rank %d to %d", i / P, i % P);
    for (int r = 0; r < P; r++) {
        int out = 0, in = 0;
        for (int q = 0; q < P; q++) { out |= counts[r * P + q] > 0; in |= counts[q * P + r] > 0; }
        if ((out && !send[r]) || (in && !recv[r])) return lrmoe_err("alltoallv: NULL buffer");
    }
    if (s->async) { /* stream order (NCCL) or events (copies), no host wait */
        int rc = s->nccl ? nccl_a2a(s, es, send, counts, sdispls, recv, rdispls)
                         : async_copy_a2a(s, es, send, counts, sdispls, recv, rdispls);
        if (restore() < 0) rc = -1;
        return rc;
    }
    /* senders' buffers are ready once their streams drain */
    if (sync_all(s) < 0) return -1;
    double t0 = lrmoe_now();
    int rc = s->nccl ? nccl_a2a(s, es, send, counts, sdispls, recv, rdispls)
                     : copy_a2a(s, es, send, counts, sdispls, recv, rdispls);
    if (rc == 0) rc = sync_all(s);
    double dt = lrmoe_now() - t0;
    if (rank_sec)
        for (int r = 0; r < P; r++) rank_sec[r] += dt;
    if (restore() < 0 && rc == 0) rc = -1;
    return rc;
}

/* One NCCL send/recv pair from rank src to rank dst (src != dst), queued on
 * each side's stream; both modes of cuda_p2p use it. */
static int nccl_p2p(cstate_t *s, int src, const void *sendbuf, int dst, void *recvbuf,
                    size_t bytes)
{
    KCU_NCCL(ncclGroupStart());
    ncclResult_t r1 = ncclSend(sendbuf, bytes, ncclUint8, dst, s->comm[src], s->ctx[src]->stream);
    ncclResult_t r2 = ncclRecv(recvbuf, bytes, ncclUint8, src, s->comm[dst], s->ctx[dst]->stream);
    ncclResult_t r3 = ncclGroupEnd();
    if (r1 != ncclSuccess) return lrmoe_err("ncclSend: %s", ncclGetErrorString(r1));
    if (r2 != ncclSuccess) return lrmoe_err("ncclRecv: %s", ncclGetErrorString(r2));
    if (r3 != ncclSuccess) return lrmoe_err("ncclGroupEnd: %s", ncclGetErrorString(r3));
    return 0;
}

static int cuda_p2p(lrmoe_comm_t *c, int src, const void *sendbuf, int dst, void *recvbuf,
                    size_t bytes)
{
    cstate_t *s = st(c);
    if (src < 0 || src >= s->P || dst < 0 || dst >= s->P)
        return lrmoe_err("p2p: rank out of range (%d -> %d, P=%d)", src, dst, s->P);
    if (!bytes || sendbuf == recvbuf) return 0;
    if (s->async) {
        int rc = 0;
        if (s->nccl && src != dst) {
            if (nccl_p2p(s, src, sendbuf, dst, recvbuf, bytes) < 0) return -1;
        } else {
            if (order_after(s, dst, src) < 0) return -1;
            KCU_CUDA(cudaSetDevice(s->ctx[dst]->device));
            KCU_CUDA(cudaMemcpyAsync(recvbuf, sendbuf, bytes, cudaMemcpyDefault, s->ctx[dst]->stream));
            rc = order_after(s, src, dst);
        }
        if (restore() < 0) rc = -1;
        return rc;
    }
    if (sync_all(s) < 0) return -1;
    if (s->nccl && src != dst) {
        if (nccl_p2p(s, src, sendbuf, dst, recvbuf, bytes) < 0) return -1;
    } else {
        KCU_CUDA(cudaSetDevice(s->ctx[dst]->device));
        KCU_CUDA(cudaMemcpyAsync(recvbuf, sendbuf, bytes, cudaMemcpyDefault, s->ctx[dst]->stream));
    }
    if (sync_all(s) < 0) return -1;
    return restore();
}

static void cuda_destroy(lrmoe_comm_t *c)
{
    cstate_t *s = st(c);
    if (!s) return;
    if (s->comm)
        for (int r = 0; r < s->P; r++)
            if (s->comm[r]) (void)ncclCommDestroy(s->comm[r]);
    free(s->comm);
    if (s->ev)
        for (int r = 0; r < s->P; r++)
            if (s->ev[r]) (void)cudaEventDestroy(s->ev[r]);
    free(s->ev);
    free(s->ctx);
    free(s);
    c->ctx = NULL;
}

/* Every buffer comes from a device's default memory pool (cudaMallocAsync),
 * and peer access (cudaDeviceEnablePeerAccess) does not extend to pool
 * memory: another device reaches it only after cudaMemPoolSetAccess. Grant
 * each used device read/write access to every other used device's pool
 * wherever the hardware allows it (cudaDeviceCanAccessPeer), so NCCL's P2P
 * transport may touch a peer's buffers directly (all ranks live in this
 * process) and device copies between pools run peer to peer. Pairs without
 * peer capability stay as they are: NCCL picks another transport and the
 * copies are staged by the driver. */
static int pool_access(int P, lrmoe_kcu_ctx_t *const *ctx)
{
    for (int a = 0; a < P; a++) {
        int da = ctx[a]->device, seen = 0;
        for (int x = 0; x < a; x++) seen |= ctx[x]->device == da;
        if (seen) continue;
        cudaMemPool_t pool;
        KCU_CUDA(cudaDeviceGetDefaultMemPool(&pool, da));
        for (int b = 0; b < P; b++) {
            int db = ctx[b]->device, dup = db == da, can = 0;
            for (int x = 0; x < b; x++) dup |= ctx[x]->device == db;
            if (dup) continue;
            KCU_CUDA(cudaDeviceCanAccessPeer(&can, db, da));
            if (!can) continue;
            cudaMemAccessDesc d;
            memset(&d, 0, sizeof d);
            d.location.type = cudaMemLocationTypeDevice;
            d.location.id = db;
            d.flags = cudaMemAccessFlagsProtReadWrite;
            KCU_CUDA(cudaMemPoolSetAccess(pool, &d, 1));
        }
    }
    return 0;
}

int lrmoe_comm_cuda_init(lrmoe_comm_t *c, int P, lrmoe_kcu_ctx_t *const *ctx, int use_nccl)
{
    memset(c, 0, sizeof *c);
    if (P < 1) return lrmoe_err("comm: P must be >= 1, got %d", P);
    int distinct = 1;
    for (int a = 0; a < P; a++)
        for (int b = a + 1; b < P; b++)
            if (ctx[a]->device == ctx[b]->device) distinct = 0;
    if (use_nccl == 1 && !distinct)
        return lrmoe_err("comm: NCCL needs one device per rank (ranks share a device)");
    if (pool_access(P, ctx) < 0 || restore() < 0)
        return lrmoe_err_prefix("comm: pool access between devices");
    cstate_t *s = (cstate_t *)calloc(1, sizeof *s);
    if (!s) return lrmoe_err("out of memory");
    s->P = P;
    s->nccl = use_nccl == 1 || (use_nccl < 0 && distinct && P > 1);
    s->ctx = (lrmoe_kcu_ctx_t **)malloc((size_t)P * sizeof *s->ctx);
    if (!s->ctx) { free(s); return lrmoe_err("out of memory"); }
    memcpy(s->ctx, ctx, (size_t)P * sizeof *s->ctx);
    c->P = P;
    c->backend = 1; /* LRMOE_BACKEND_CUDA */
    c->ctx = s;
    c->alltoallv = cuda_alltoallv;
    c->p2p = cuda_p2p;
    c->destroy = cuda_destroy;
    if (s->nccl) {
        int *dev = (int *)malloc((size_t)P * sizeof *dev);
        s->comm = (ncclComm_t *)calloc((size_t)P, sizeof *s->comm);
        if (!dev || !s->comm) {
            free(dev);
            cuda_destroy(c);
            return lrmoe_err("out of memory");
        }
        for (int r = 0; r < P; r++) dev[r] = ctx[r]->device;
        ncclResult_t r = ncclCommInitAll(s->comm, P, dev);
        free(dev);
        if (r != ncclSuccess) {
            free(s->comm);
            s->comm = NULL;
            cuda_destroy(c);
            return lrmoe_err("ncclCommInitAll: %s", ncclGetErrorString(r));
        }
        if (restore() < 0) { cuda_destroy(c); return -1; }
    }
    return 0;
}

int lrmoe_comm_cuda_set_async(lrmoe_comm_t *c, int on)
{
    cstate_t *s = st(c);
    if (!s || c->alltoallv != cuda_alltoallv)
        return lrmoe_err("comm: set_async needs a communicator of lrmoe_comm_cuda_init");
    if (on && !s->ev) {
        s->ev = (cudaEvent_t *)calloc((size_t)s->P, sizeof *s->ev);
        if (!s->ev) return lrmoe_err("out of memory");
        for (int r = 0; r < s->P; r++) {
            KCU_CUDA(cudaSetDevice(s->ctx[r]->device));
            KCU_CUDA(cudaEventCreateWithFlags(&s->ev[r], cudaEventDisableTiming));
        }
        if (restore() < 0) return -1;
    }
    s->async = on != 0;
    return 0;
}

int lrmoe_comm_cuda_is_nccl(const lrmoe_comm_t *c)
{
    return c->ctx && ((const cstate_t *)c->ctx)->nccl;
}
