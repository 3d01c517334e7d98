/* Internal to kernels/: status checks and the context. C++ (nvcc) only. */
#ifndef LRMOE_KCU_INTERNAL_H
#define LRMOE_KCU_INTERNAL_H

#include <cuda_runtime.h>
#include <cublas_v2.h>
extern "C" {
#include "lrmoe.h"
}
#include "kcu.h"
#include "kcu_launch.h"

#define KCU_MAX_STREAMS 8
#define KCU_FLAG_SLOTS 32

/* Pinned host staging of the grouped GEMM's argument arrays (gemm.cu), kept
 * for the context's life. cudaMemcpyAsync from pageable memory promises
 * nothing about when the source has been read, so the arrays the device
 * reads are copied from pinned memory. `done` is recorded after all the
 * work of the call that filled a slot (its copies, and cuBLAS, which reads
 * the size arrays on the host), and the slot is refilled only once it has
 * passed (a completed event is not waited for). Four slots used in turn
 * let the host run three calls ahead: a backward frame's three grouped
 * calls per rank never wait inside the frame (the persistent executor). */
#define KCU_STAGE_SLOTS 4
struct kcu_stage {
    void *host;        /* cudaMallocHost, `bytes` long */
    size_t bytes;
    cudaEvent_t done;
    int pending;       /* `done` recorded since the slot was last waited for */
};

struct lrmoe_kcu_ctx {
    int device;
    int nstreams;
    cudaStream_t stream;                   /* main stream */
    cudaStream_t side[KCU_MAX_STREAMS];    /* GEMM loop streams */
    cublasHandle_t blas[KCU_MAX_STREAMS];  /* one per side stream */
    cudaEvent_t ev_fork, ev_join[KCU_MAX_STREAMS];
    lrmoe_gemm_impl_t gemm_impl;
    struct kcu_stage stage[KCU_STAGE_SLOTS];
    int stage_next;
    /* deferred input checks (lrmoe_kcu_flags_defer): each checking kernel
     * gets a word of `flags` (device) instead of a read-back of its own;
     * lrmoe_kcu_flags_check reads the used words at once */
    unsigned long long *flags, *flags_host;
    int defer, nflags;
    struct { const char *what; int K, P; } flag_meta[KCU_FLAG_SLOTS];
    int sm_count;                          /* multiprocessors, 0 until ggemm asks */
};

/* gemm.cu: the next pinned staging slot, at least `bytes` long, once the
 * call that last used it has run. */
int kcu_stage_take(lrmoe_kcu_ctx_t *c, size_t bytes, struct kcu_stage **out);
/* ggemm.cu: one CUTLASS grouped launch (variant KCU_GG_VARIANT(ta, tb,
 * c_bf16)) over G groups whose arrays (kcu_gg_carve) are in device memory
 * at `block`, on stream s; asynchronous. */
int kcu_gg_launch(lrmoe_kcu_ctx_t *c, int variant, int G, void *block, float alpha, float beta,
                  cudaStream_t s);
/* ggemm.cu: lrmoe_kcu_ggemm of context c on stream s (kcu.h). */
int kcu_gg_dev(lrmoe_kcu_ctx_t *c, const lrmoe_ggemm_t *d, cudaStream_t s);

/* Every call is checked; the message names the call and its status string. */
#define KCU_CUDA(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) \
    return lrmoe_err("%s: %s", kcu_callname(#call), cudaGetErrorString(e_)); } while (0)
#define KCU_BLAS(call) do { cublasStatus_t s_ = (call); if (s_ != CUBLAS_STATUS_SUCCESS) \
    return lrmoe_err("%s: %s", kcu_callname(#call), cublasGetStatusString(s_)); } while (0)
/* After a kernel launch: launch errors (bad config) surface here. */
#define KCU_LAUNCHED(name) do { cudaError_t e_ = cudaGetLastError(); if (e_ != cudaSuccess) \
    return lrmoe_err("kernel %s: %s", name, cudaGetErrorString(e_)); } while (0)

/* "cudaMemcpyAsync(dst, src, ...)" -> "cudaMemcpyAsync" (static buffer per
 * thread; the name is copied into the error message right away). */
static inline const char *kcu_callname(const char *expr)
{
    static thread_local char buf[64];
    int i = 0;
    while (expr[i] && expr[i] != '(' && i < 63) { buf[i] = expr[i]; i++; }
    buf[i] = 0;
    return buf;
}

/* The calling thread's stream (0 = legacy default when no context). */
cudaStream_t kcu_stream(void);

static inline unsigned kcu_blocks(int64_t work, int per_block, unsigned cap = 65535u * 16)
{
    int64_t b = (work + per_block - 1) / per_block;
    if (b < 1) b = 1;
    if (b > (int64_t)cap) b = cap;
    return (unsigned)b;
}
/* Grid of a grid-stride kernel k over `work` threads' worth of items, at the
 * block size of its launch table row (kcu_launch.h). */
#define KCU_GRID(k, work) kcu_blocks((work), KCU_THREADS(k))

#endif
