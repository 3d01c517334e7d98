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

#include "kcu.h"

#ifdef __cplusplus
extern "C" {
#endif
#include "comm.h"

/* ctx: (P) contexts, one per rank (devices may repeat). use_nccl: 1 force
 * NCCL (fails when devices repeat), 0 device copies, -1 NCCL when the P
 * devices are distinct and P > 1. */
int lrmoe_comm_cuda_init(lrmoe_comm_t *c, int P, lrmoe_kcu_ctx_t *const *ctx, int use_nccl);
/* 1 when c moves data through NCCL. */
int lrmoe_comm_cuda_is_nccl(const lrmoe_comm_t *c);

#ifdef __cplusplus
}
#endif

#endif
