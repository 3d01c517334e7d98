/* CUDA communicator of ONE rank when every rank is its own process (MPI,
 * possibly on several hosts): NCCL bootstrapped through the caller's
 * broadcast (see comm_cuda.h, lrmoe_comm_cuda_init_rank). Apart from
 * comm_nccl.cu (the single-process communicators) so that only programs
 * that run under MPI link ncclGetUniqueId and ncclCommInitRank. */
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include "kcu_internal.h"
#include "comm_cuda.h"
#include "clock.h"

#define KCU_NCCL(call) do { ncclResult_t r_ = (call); if (r_ != ncclSuccess) \
    return lrmoe_err("%s: %s", kcu_callname(#call), ncclGetErrorString(r_)); } while (0)

/* The communicator of ONE rank when every rank is its own process (MPI,
 * possibly on several hosts): rank 0 makes the ncclUniqueId, the caller's
 * bcast hands its bytes to every rank (lrmoe_comm_mpi_bcast over MPI), and
 * ncclCommInitRank joins rank `rank` of P on ctx's device (one GPU per
 * rank: the caller picks it from the MPI local rank). c->self is rank+1:
 * alltoallv moves only send[rank]/recv[rank], p2p only what this rank
 * sends or receives. */
typedef struct {
    int P, rank;
    lrmoe_kcu_ctx_t *ctx;
    ncclComm_t comm;
    int64_t a2a_bytes, p2p_bytes; /* sent by this rank since the last take */
    double a2a_sec;
} rstate_t;

static int rank_alltoallv(lrmoe_comm_t *c, size_t es, const void *const *send,
                          const int64_t *counts, const int64_t *sdispls, void *const *recv,
                          const int64_t *rdispls, double *rank_sec)
{
    rstate_t *s = (rstate_t *)c->ctx;
    const int P = s->P, me = s->rank;
    cudaStream_t st = (cudaStream_t)lrmoe_kcu_stream(s->ctx);
    KCU_CUDA(cudaStreamSynchronize(st));
    double t0 = lrmoe_now();
    KCU_NCCL(ncclGroupStart());
    for (int p = 0; p < P; p++) {
        int64_t ns = counts[(size_t)me * P + p], nr = counts[(size_t)p * P + me];
        ncclResult_t r = ncclSuccess;
        if (ns > 0) s->a2a_bytes += ns * (int64_t)es;
        if (ns > 0)
            r = ncclSend((const char *)send[me] + (size_t)sdispls[(size_t)me * P + p] * es,
                         (size_t)ns * es, ncclUint8, p, s->comm, st);
        if (r == ncclSuccess && nr > 0)
            r = ncclRecv((char *)recv[me] + (size_t)rdispls[(size_t)me * P + p] * es,
                         (size_t)nr * es, ncclUint8, p, s->comm, st);
        if (r != ncclSuccess) {
            (void)ncclGroupEnd();
            return lrmoe_err("ncclSend/ncclRecv (rank %d, peer %d): %s", me, p,
                             ncclGetErrorString(r));
        }
    }
    KCU_NCCL(ncclGroupEnd());
    KCU_CUDA(cudaStreamSynchronize(st));
    s->a2a_sec += lrmoe_now() - t0;
    if (rank_sec) rank_sec[me] += lrmoe_now() - t0;
    return 0;
}

static int rank_p2p(lrmoe_comm_t *c, int src, const void *sendbuf, int dst, void *recvbuf,
                    size_t bytes)
{
    rstate_t *s = (rstate_t *)c->ctx;
    if (src < 0 || src >= s->P || dst < 0 || dst >= s->P)
        return lrmoe_err("p2p: rank out of range (%d -> %d, P=%d)", src, dst, s->P);
    if (!bytes || (src != s->rank && dst != s->rank)) return 0;
    cudaStream_t st = (cudaStream_t)lrmoe_kcu_stream(s->ctx);
    if (src == dst) {
        if (sendbuf != recvbuf)
            KCU_CUDA(cudaMemcpyAsync(recvbuf, sendbuf, bytes, cudaMemcpyDefault, st));
    } else if (src == s->rank) {
        s->p2p_bytes += (int64_t)bytes;
        KCU_NCCL(ncclSend(sendbuf, bytes, ncclUint8, dst, s->comm, st));
    } else {
        KCU_NCCL(ncclRecv(recvbuf, bytes, ncclUint8, src, s->comm, st));
    }
    KCU_CUDA(cudaStreamSynchronize(st));
    return 0;
}

static void rank_destroy(lrmoe_comm_t *c)
{
    rstate_t *s = (rstate_t *)c->ctx;
    if (!s) return;
    if (s->comm) (void)ncclCommDestroy(s->comm);
    free(s);
    c->ctx = NULL;
}

int lrmoe_comm_cuda_init_rank(lrmoe_comm_t *c, int P, int rank, lrmoe_kcu_ctx_t *ctx,
                              int (*bcast)(void *buf, size_t bytes, void *arg), void *arg)
{
    memset(c, 0, sizeof *c);
    if (P < 1 || rank < 0 || rank >= P)
        return lrmoe_err("comm: rank %d of %d", rank, P);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (rank == 0) KCU_NCCL(ncclGetUniqueId(&id));
    if (bcast(&id, sizeof id, arg) < 0) return -1;
    rstate_t *s = (rstate_t *)calloc(1, sizeof *s);
    if (!s) return lrmoe_err("out of memory");
    s->P = P; s->rank = rank; s->ctx = ctx;
    KCU_CUDA(cudaSetDevice(lrmoe_kcu_device(ctx)));
    ncclResult_t r = ncclCommInitRank(&s->comm, P, id, rank);
    if (r != ncclSuccess) {
        free(s);
        return lrmoe_err("ncclCommInitRank (rank %d of %d): %s", rank, P, ncclGetErrorString(r));
    }
    c->P = P;
    c->self = rank + 1;
    c->backend = 1; /* LRMOE_BACKEND_CUDA */
    c->ctx = s;
    c->device = ctx;
    c->alltoallv = rank_alltoallv;
    c->p2p = rank_p2p;
    c->destroy = rank_destroy;
    return 0;
}

int lrmoe_comm_cuda_device_key(lrmoe_kcu_ctx_t *ctx, char *buf, size_t n)
{
    KCU_CUDA(cudaDeviceGetPCIBusId(buf, (int)n, lrmoe_kcu_device(ctx)));
    return 0;
}

void lrmoe_comm_cuda_rank_take(lrmoe_comm_t *c, int64_t *a2a_bytes, int64_t *p2p_bytes,
                               double *a2a_sec)
{
    rstate_t *s = c && c->self ? (rstate_t *)c->ctx : NULL;
    *a2a_bytes = s ? s->a2a_bytes : 0;
    *p2p_bytes = s ? s->p2p_bytes : 0;
    *a2a_sec = s ? s->a2a_sec : 0;
    if (s) { s->a2a_bytes = s->p2p_bytes = 0; s->a2a_sec = 0; }
}
