/* The CUDA entry points of lib/exec_backend.h in a build without nvcc: they exist so
 * that any caller links, and fail with a clear message. (lrmoe_exec_forward/
 * lrmoe_exec_backward in exec.c report the same condition themselves; these
 * cover direct callers.) With CUDA the real ones are kernels/exec_cuda.cu. */
#ifndef LRMOE_HAVE_CUDA
#include "exec.h"
#include "exec_backend.h"

int lrmoe_exec_forward_cuda(const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                            const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan,
                            lrmoe_exec_fwd_t *a, double *timings)
{
    (void)cfg; (void)d; (void)w; (void)plan; (void)a; (void)timings;
    return lrmoe_err("backend cuda: built without CUDA (nvcc was not found at build time)");
}

int lrmoe_exec_backward_cuda(const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                             const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan,
                             lrmoe_exec_bwd_t *a, double *timings)
{
    (void)cfg; (void)d; (void)w; (void)plan; (void)a; (void)timings;
    return lrmoe_err("backend cuda: built without CUDA (nvcc was not found at build time)");
}

#define NOCUDA lrmoe_err("backend cuda: built without CUDA (nvcc was not found at build time)")
int lrmoe_exec_cuda_new(const lrmoe_exec_cfg_t *cfg, int P, lrmoe_exec_cuda_t **out)
{
    (void)cfg; (void)P;
    *out = NULL;
    return NOCUDA;
}
void lrmoe_exec_cuda_free(lrmoe_exec_cuda_t *x) { (void)x; }
int lrmoe_exec_cuda_weights_changed(lrmoe_exec_cuda_t *x) { (void)x; return NOCUDA; }
int lrmoe_exec_cuda_set_io(lrmoe_exec_cuda_t *x, int device_io, void *stream)
{
    (void)x; (void)device_io; (void)stream;
    return NOCUDA;
}
int lrmoe_exec_cuda_forward(lrmoe_exec_cuda_t *x, const lrmoe_exec_cfg_t *cfg,
                            const lrmoe_exec_dims_t *d, const lrmoe_exec_weights_t *w,
                            const lrmoe_exec_plan_t *plan, lrmoe_exec_fwd_t *a, double *timings)
{
    (void)x; (void)cfg; (void)d; (void)w; (void)plan; (void)a; (void)timings;
    return NOCUDA;
}
int lrmoe_exec_cuda_backward(lrmoe_exec_cuda_t *x, const lrmoe_exec_cfg_t *cfg,
                             const lrmoe_exec_dims_t *d, const lrmoe_exec_weights_t *w,
                             const lrmoe_exec_plan_t *plan, lrmoe_exec_bwd_t *a, double *timings)
{
    (void)x; (void)cfg; (void)d; (void)w; (void)plan; (void)a; (void)timings;
    return NOCUDA;
}
int lrmoe_exec_cuda_score(lrmoe_exec_cuda_t *x, int metric, int64_t T, int K, int64_t D,
                          lrmoe_dtype_t gdt, const void *g, const float *alpha,
                          const float *phi_sqnorm, float *score)
{
    (void)x; (void)metric; (void)T; (void)K; (void)D; (void)gdt; (void)g; (void)alpha;
    (void)phi_sqnorm; (void)score;
    return NOCUDA;
}
#else
/* ISO C forbids an empty translation unit. */
typedef int lrmoe_exec_cuda_stub_unused;
#endif
