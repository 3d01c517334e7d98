/* The exec backends behind lrmoe_exec_forward and lrmoe_exec_backward, and
 * the input checks both backends run (not installed: moved out of exec.h
 * with API 2, lrmoe(3)). Shared by lib/exec*.c and the CUDA backend
 * (kernels/exec_cuda.cu, lib/cuda_module.h). */
#ifndef LRMOE_EXEC_BACKEND_H
#define LRMOE_EXEC_BACKEND_H

#include "exec.h"

/* Backend implementations behind the two entry points (same arguments).
 * lib/exec.c (the dispatcher) routes backend CUDA to the _cuda pair only
 * when the build defines LRMOE_HAVE_CUDA (the CUDA backend then defines
 * both); otherwise backend CUDA fails with "this build has no CUDA
 * support". */
int lrmoe_exec_forward_cpu(const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                           const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan,
                           lrmoe_exec_fwd_t *a, double *timings);
int lrmoe_exec_backward_cpu(const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                            const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan,
                            lrmoe_exec_bwd_t *a, double *timings);
/* every build has these: kernels/exec_cuda.cu's with CUDA, else
 * lib/exec_cuda_stub.c's, which fail with a clear message */
int lrmoe_exec_forward_cuda(const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                            const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan,
                            lrmoe_exec_fwd_t *a, double *timings);
int lrmoe_exec_backward_cuda(const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                             const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan,
                             lrmoe_exec_bwd_t *a, double *timings);

/* ---------------------------------------------------------------- input checks */

/* Every floating input the phase reads (hidden, topk_weights; backward:
 * grad_output, pair_out and the mode's saved state or packed rows) must be
 * finite unless cfg->allow_nonfinite. Both backends call these. */
int lrmoe_exec_check_fwd_inputs(const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                                const lrmoe_exec_fwd_t *a);
int lrmoe_exec_check_bwd_inputs(const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                                const lrmoe_exec_bwd_t *a);

/* The backward's arrays for its mode, as every backend needs them: the
 * inputs and outputs of every mode, the saved state and pair_rank of full
 * and masked, keep of masked; expert ids in [0,E), and pair_rank in [0,P)
 * (full, masked). 0, or -1 with the error naming the first problem. The
 * compact forms' rows are checked by each backend (which forms it takes):
 * lrmoe_exec_check_pack. */
int lrmoe_exec_check_bwd_args(const lrmoe_exec_dims_t *d, const lrmoe_exec_bwd_t *a);

/* Validate the packed rows of a compact backward (the CUDA and MPI
 * backends call it): the four row tensors must be given, then the layout
 * is checked as lrmoe_exec_check_pack_layout does. */
int lrmoe_exec_check_pack(int P, int64_t T, int64_t K, int64_t E, const int32_t *topk,
                          const lrmoe_exec_bwd_t *a, const uint8_t *placement);
/* The layout alone (pack_pair, pack_rank, pack_counts, pack_offsets): the
 * CPU backend calls it, which also takes the layout-only form (no
 * pack_grad/pack_hidden/pack_gate/pack_up: the rows are read from
 * grad_output, hidden, saved_gate and saved_up by pack_pair). */
int lrmoe_exec_check_pack_layout(int P, int64_t T, int64_t K, int64_t E, const int32_t *topk,
                                 const lrmoe_exec_bwd_t *a, const uint8_t *placement);

#endif
