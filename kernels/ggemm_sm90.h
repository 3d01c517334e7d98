/* The CUTLASS side of the Hopper grouped GEMM (kernels/ggemm.cu): what one
 * instantiation of kernels/cutlass/ggemm_sm90.cu runs. Plain types only, so
 * that ggemm.cu compiles without the CUTLASS headers.
 *
 * Per group g (all arrays device memory, ngroups long, filled by ggemm.cu's
 * setup kernel): shapes[3g..3g+2] = (M, N, K) of C (M,N) row-major =
 * op(A) (M,K) op(B) (K,N); a[g], b[g] the BF16 operands, c[g] = d[g] the
 * output (F32 or BF16 by instantiation); lda/ldb/ldc[g] the row strides in
 * elements. D = alpha*acc + beta*C, alpha and beta scalars. A group with M,
 * N or K == 0 must not be passed with K == 0 and M*N > 0 (the setup kernel
 * gives such a group M = 0 and zeroes/keeps C itself). */
#ifndef LRMOE_GGEMM_SM90_H
#define LRMOE_GGEMM_SM90_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>

struct kcu_gg_sm90_args {
    int ngroups;
    int sm_count;            /* persistent grid: the device's multiprocessors */
    int *shapes;             /* 3 * ngroups ints */
    const void **a, **b;
    void **c;
    int64_t *lda, *ldb, *ldc;
    float alpha, beta;
};

/* One instantiation per (ta, tb, C type): variant = ta*4 + tb*2 + c_bf16;
 * (1,1) is not built (no GEMM of lrmoe has both operands transposed). */
#include "ggemm_variant.h"
struct kcu_gg_sm90_fn {
    /* bytes of workspace the run needs (>= 0), -1 when CUTLASS rejects the
     * arguments (can_implement) */
    int64_t (*workspace)(const struct kcu_gg_sm90_args *x);
    /* 0, or -1 with *why set to a static string */
    int (*run)(const struct kcu_gg_sm90_args *x, void *ws, cudaStream_t s, const char **why);
};
#define KCU_GG_DECL(v) \
    extern const struct kcu_gg_sm90_fn kcu_gg_sm90_##v;
KCU_GG_DECL(0) KCU_GG_DECL(1) KCU_GG_DECL(2) KCU_GG_DECL(3) KCU_GG_DECL(4) KCU_GG_DECL(5)
#undef KCU_GG_DECL

#endif
