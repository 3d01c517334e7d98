/* lrmoe-exec: the backend dispatcher. The helpers both backends share live
 * below them in lib/exec_common.c. See exec.h. */
#include <string.h>
#include "exec.h"
#include "exec_internal.h"

/* The CUDA entry points are linked only when the build has CUDA
 * (LRMOE_HAVE_CUDA: nvcc found, kernels/ compiled): in liblrmoe.a the kernels'
 * own, in liblrmoe.so.2 the loader's, which load the module
 * liblrmoe-cuda.so.1 on first use (lib/cuda_module.c). */
#ifdef LRMOE_HAVE_CUDA
#define LRMOE_EXEC_CUDA 1
#endif

int lrmoe_exec_forward(const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                       const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan,
                       lrmoe_exec_fwd_t *a, double *timings)
{
    if (cfg->backend == LRMOE_BACKEND_CUDA) {
#ifdef LRMOE_EXEC_CUDA
        return lrmoe_exec_forward_cuda(cfg, d, w, plan, a, timings);
#else
        return lrmoe_err("backend cuda: this build has no CUDA support (nvcc and kernels/exec_cuda.cu)");
#endif
    }
    return lrmoe_exec_forward_cpu(cfg, d, w, plan, a, timings);
}

int lrmoe_exec_backward(const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                        const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan,
                        lrmoe_exec_bwd_t *a, double *timings)
{
    if (cfg->backend == LRMOE_BACKEND_CUDA) {
#ifdef LRMOE_EXEC_CUDA
        return lrmoe_exec_backward_cuda(cfg, d, w, plan, a, timings);
#else
        return lrmoe_err("backend cuda: this build has no CUDA support (nvcc and kernels/exec_cuda.cu)");
#endif
    }
    return lrmoe_exec_backward_cpu(cfg, d, w, plan, a, timings);
}

int lrmoe_exec_numerics(const lrmoe_exec_cfg_t *cfg, lrmoe_dtype_t wdt, int kernel,
                        lrmoe_exec_numerics_t *n)
{
    memset(n, 0, sizeof *n);
    n->compute = LRMOE_COMPUTE_F32;
    if (cfg->backend == LRMOE_BACKEND_CPU &&
        lrmoe_gemm_resolve((lrmoe_compute_t)cfg->compute, wdt, &n->compute) < 0)
        return -1;
    n->compute_name = lrmoe_compute_name(n->compute);
    if (kernel && n->compute == LRMOE_COMPUTE_BF16) {
        lrmoe_gemm_kernel(&n->kernel);
        n->kernel_name = lrmoe_gemm_kernel_name(n->kernel.kind);
    }
    return 0;
}
