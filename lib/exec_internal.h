/* What the CPU exec modules share below the installed headers (not
 * installed): exec_backend.h, the vectorised non-finite scan of
 * exec_common.c (which exec_frame.c's weights check also uses) and the
 * numerics resolution. */
#ifndef LRMOE_EXEC_INTERNAL_H
#define LRMOE_EXEC_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "lrmoe.h"
#include "exec.h"
#include "exec_backend.h"
#include "gemm_cpu.h"

/* Index of the first non-finite value of x[0..n) (BF16, F16 or F32), or -1
 * (also for any other dtype) */
int64_t lrmoe_exec_first_nonfinite(lrmoe_dtype_t dt, const void *x, size_t n);

/* The numerics of a job (lib/exec.c, the one place that resolves them): the
 * compute cfg asks for against the weights' dtype on the CPU backend
 * (lrmoe_gemm_resolve; the CUDA backend computes in F32), and, when kernel
 * is set and the compute is bf16, the kernel this process runs
 * (lrmoe_gemm_kernel: the pinned one under MPI). */
typedef struct {
    lrmoe_compute_t compute;
    const char *compute_name;
    lrmoe_gemm_kernel_t kernel;     /* kind LRMOE_KERNEL_NONE unless asked and bf16 */
    const char *kernel_name;        /* NULL unless asked and bf16 */
} lrmoe_exec_numerics_t;
int lrmoe_exec_numerics(const lrmoe_exec_cfg_t *cfg, lrmoe_dtype_t wdt, int kernel,
                        lrmoe_exec_numerics_t *n);

#endif
