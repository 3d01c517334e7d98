/* The CUDA communicator behind lib/comm.h (kernels/comm_nccl.cu).
 *
 * Ranks whose contexts sit on P distinct devices talk through NCCL: one
 * communicator per rank from ncclCommInitAll, all-to-all-v as per-peer
 * ncclSend/ncclRecv inside ncclGroupStart/ncclGroupEnd, p2p as one
 * send/receive pair. When ranks share a device (one GPU with P > 1 ranks, or
 * more ranks than GPUs) NCCL cannot hold two ranks of one device, so every
 * transfer is a device copy (cudaMemcpyAsync, cudaMemcpyDefault) instead; the
 * data path is the same. Buffers are device pointers of each rank's device,
 * from its default memory pool; init grants every used device access to
 * the other used devices' pools where peer access is possible
 * (cudaMemPoolSetAccess: peer access does not cover pool memory).
 * Each operation completes before it returns (all ranks' streams are
 * synchronised), so the exec can time it per rank. Only built with CUDA.
 */
#ifndef LRMOE_COMM_CUDA_H
#define LRMOE_COMM_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "comm.h"

/* a CUDA device context (kernels/kcu.h) */
typedef struct lrmoe_kcu_ctx lrmoe_kcu_ctx_t;

/* ctx: (P) contexts, one per rank (devices may repeat). use_nccl: 1 force
 * NCCL (fails when devices repeat), 0 device copies, -1 NCCL when the P
 * devices are distinct and P > 1. */
int lrmoe_comm_cuda_init(lrmoe_comm_t *c, int P, lrmoe_kcu_ctx_t *const *ctx, int use_nccl);
/* One rank of P ranks living in P processes (MPI, across hosts): rank 0's
 * ncclUniqueId reaches every rank through bcast (the caller broadcasts the
 * bytes over MPI: lrmoe_comm_mpi_bcast), then ncclCommInitRank on ctx's
 * device. c->self = rank+1, c->device = ctx (comm.h). */
int lrmoe_comm_cuda_init_rank(lrmoe_comm_t *c, int P, int rank, lrmoe_kcu_ctx_t *ctx,
                              int (*bcast)(void *buf, size_t bytes, void *arg), void *arg);
/* The PCI bus id of ctx's device into buf (n bytes): which ranks share a GPU. */
int lrmoe_comm_cuda_device_key(lrmoe_kcu_ctx_t *ctx, char *buf, size_t n);
/* Bytes this rank sent by all-to-all-v and by p2p, and its seconds in the
 * all-to-all-v, since the last call (then zeroed); zeros for other comms. */
void lrmoe_comm_cuda_rank_take(lrmoe_comm_t *c, int64_t *a2a_bytes, int64_t *p2p_bytes,
                               double *a2a_sec);
/* Async mode (on = 1) of a communicator of lrmoe_comm_cuda_init: alltoallv
 * and p2p only enqueue: NCCL in stream order, device copies ordered by
 * events (each receiver's stream waits for its senders' queued work, each
 * sender's stream then waits for the copies out of its buffer); no host
 * waits, and rank_sec is left alone (time them with events). The caller
 * synchronises. Default off: each operation completes before it returns. */
int lrmoe_comm_cuda_set_async(lrmoe_comm_t *c, int on);
/* 1 when c moves data through NCCL. */
int lrmoe_comm_cuda_is_nccl(const lrmoe_comm_t *c);

#ifdef __cplusplus
}
#endif

#endif
