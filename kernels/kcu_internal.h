/* Internal to kernels/: status checks and the context. C++ (nvcc) only. */
#ifndef LRMOE_KCU_INTERNAL_H
#define LRMOE_KCU_INTERNAL_H

#include <cuda_runtime.h>
#include <cublas_v2.h>
extern "C" {
#include "lrmoe.h"
}
#include "kcu.h"

#define KCU_MAX_STREAMS 8

struct lrmoe_kcu_ctx {
    int device;
    int nstreams;
    cudaStream_t stream;                   /* main stream */
    cudaStream_t side[KCU_MAX_STREAMS];    /* GEMM loop streams */
    cublasHandle_t blas[KCU_MAX_STREAMS];  /* one per side stream */
    cudaEvent_t ev_fork, ev_join[KCU_MAX_STREAMS];
    lrmoe_gemm_impl_t gemm_impl;
};

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

#endif
