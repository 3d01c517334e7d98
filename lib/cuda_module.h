/* The CUDA backend as a module of its own: liblrmoe-cuda.so.1.
 *
 * liblrmoe.so.2 has no DT_NEEDED entry for libcudart, libcublas or libnccl:
 * those belong to the module (the kernels/ sources and kernels/module.c), which
 * liblrmoe dlopens (RTLD_NOW | RTLD_LOCAL) the first time a CUDA entry
 * point is called (lib/cuda_module.c). Its dependencies resolve by soname,
 * so a libnccl.so.2 or libcudart.so.13 already loaded (PyTorch's) is the
 * one the module uses. The path: $LRMOE_CUDA_MODULE when set and not empty,
 * else liblrmoe-cuda.so.1 in the directory of the object holding the loader
 * (dladdr: liblrmoe.so.2, or a tool's executable) when it exists, else the
 * bare name through the dynamic loader's search (a tool's run path:
 * $ORIGIN/../lib, then its build directory). The tools link the loader too
 * ($(BUILD)/liblrmoe-tools.a); liblrmoe.a (installed, tests/gpu) links the
 * kernels directly instead and has no loader.
 *
 * The two sides call each other through tables of function pointers: the
 * module's entry points that liblrmoe calls (every one returns int, -1 on
 * failure, or nothing), and liblrmoe's functions that the kernels call,
 * which are not all exported. The lists below are the only place that names
 * them: X(ret, name, params, args) for functions with a result,
 * V(name, params, args) for void ones. Changing a list or a signature in it
 * changes LRMOE_CUDA_MODULE_ABI.
 */
#ifndef LRMOE_CUDA_MODULE_H
#define LRMOE_CUDA_MODULE_H

#include <stddef.h>
#include <stdint.h>
#include "comm_cuda.h"
#include "exec.h"
#include "exec_backend.h"
#include "lrmoe.h"
#include "clock.h"

#define LRMOE_CUDA_MODULE_NAME "liblrmoe-cuda.so.1"
#define LRMOE_CUDA_MODULE_ENV  "LRMOE_CUDA_MODULE"
#define LRMOE_CUDA_MODULE_INIT "lrmoe_cuda_module_init"
#define LRMOE_CUDA_MODULE_ABI  4

/* The module's functions that liblrmoe calls (lib/exec.c, comm_mpi.c,
 * exec_mpi.c). */
#define LRMOE_CUDA_MODULE_FUNCS(X)                                                          \
    X(int, lrmoe_exec_forward_cuda,                                                         \
      (const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,                             \
       const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan, lrmoe_exec_fwd_t *a,   \
       double *timings),                                                                    \
      (cfg, d, w, plan, a, timings))                                                        \
    X(int, lrmoe_exec_backward_cuda,                                                        \
      (const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,                             \
       const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan, lrmoe_exec_bwd_t *a,   \
       double *timings),                                                                    \
      (cfg, d, w, plan, a, timings))                                                        \
    X(int, lrmoe_exec_cuda_new, (const lrmoe_exec_cfg_t *cfg, int P, lrmoe_exec_cuda_t **out), \
      (cfg, P, out))                                                                        \
    X(int, lrmoe_exec_cuda_weights_changed, (lrmoe_exec_cuda_t *x), (x))                    \
    X(int, lrmoe_exec_cuda_set_io, (lrmoe_exec_cuda_t *x, int device_io, void *stream),     \
      (x, device_io, stream))                                                               \
    X(int, lrmoe_exec_cuda_forward,                                                         \
      (lrmoe_exec_cuda_t *x, const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,       \
       const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan, lrmoe_exec_fwd_t *a,   \
       double *timings),                                                                    \
      (x, cfg, d, w, plan, a, timings))                                                     \
    X(int, lrmoe_exec_cuda_backward,                                                        \
      (lrmoe_exec_cuda_t *x, const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,       \
       const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan, lrmoe_exec_bwd_t *a,   \
       double *timings),                                                                    \
      (x, cfg, d, w, plan, a, timings))                                                     \
    X(int, lrmoe_exec_cuda_score,                                                           \
      (lrmoe_exec_cuda_t *x, int metric, int64_t T, int K, int64_t D, lrmoe_dtype_t gdt,    \
       const void *g, const float *alpha, const float *phi_sqnorm, float *score),           \
      (x, metric, T, K, D, gdt, g, alpha, phi_sqnorm, score))                               \
    X(int, lrmoe_kcu_ctx_create, (int device, int nstreams, lrmoe_kcu_ctx_t **out),         \
      (device, nstreams, out))                                                              \
    X(int, lrmoe_kcu_use, (lrmoe_kcu_ctx_t *c), (c))                                        \
    X(int, lrmoe_kcu_sync, (void), ())                                                      \
    X(int, lrmoe_kcu_device_count, (void), ())                                              \
    X(int, lrmoe_kcu_h2d, (void *dst, const void *src, size_t bytes), (dst, src, bytes))    \
    X(int, lrmoe_kcu_d2h, (void *dst, const void *src, size_t bytes), (dst, src, bytes))    \
    X(int, lrmoe_kcu_d2d, (void *dst, const void *src, size_t bytes), (dst, src, bytes))    \
    X(int, lrmoe_comm_cuda_init_rank,                                                       \
      (lrmoe_comm_t *c, int P, int rank, lrmoe_kcu_ctx_t *ctx,                              \
       int (*bcast)(void *buf, size_t bytes, void *arg), void *arg),                        \
      (c, P, rank, ctx, bcast, arg))                                                        \
    X(int, lrmoe_comm_cuda_device_key, (lrmoe_kcu_ctx_t *ctx, char *buf, size_t n),         \
      (ctx, buf, n))
#define LRMOE_CUDA_MODULE_VOIDS(V)                                                          \
    V(lrmoe_kcu_ctx_destroy, (lrmoe_kcu_ctx_t *c), (c))                                     \
    V(lrmoe_exec_cuda_free, (lrmoe_exec_cuda_t *x), (x))                                    \
    V(lrmoe_comm_cuda_rank_take,                                                            \
      (lrmoe_comm_t *c, int64_t *a2a_bytes, int64_t *p2p_bytes, double *a2a_sec),           \
      (c, a2a_bytes, p2p_bytes, a2a_sec))

/* Their prototypes: the kernels define them in the module; in liblrmoe.so
 * the loader (lib/cuda_module.c) defines functions of the same names that
 * call the module's (liblrmoe.a links the kernels' own). */
#define LRMOE_CUDA_PROTO(ret, name, params, args) ret name params;
#define LRMOE_CUDA_VPROTO(name, params, args) void name params;
LRMOE_CUDA_MODULE_FUNCS(LRMOE_CUDA_PROTO)
LRMOE_CUDA_MODULE_VOIDS(LRMOE_CUDA_VPROTO)

/* liblrmoe's functions that the kernels call (besides lrmoe_err and
 * lrmoe_err_prefix, which are variadic: host.err / host.err_prefix). */
#define LRMOE_CUDA_HOST_FUNCS(X)                                                            \
    X(const char *, lrmoe_dtype_name, (lrmoe_dtype_t d), (d))                               \
    X(size_t, lrmoe_dtype_size, (lrmoe_dtype_t d), (d))                                     \
    X(const char *, lrmoe_exec_mode_name, (lrmoe_exec_mode_t m), (m))                       \
    X(int, lrmoe_exec_native, (int64_t e, int64_t E, int P), (e, E, P))                     \
    X(int, lrmoe_exec_token_owner, (int64_t t, int64_t T, int P), (t, T, P))                \
    X(int, lrmoe_exec_assign,                                                               \
      (int64_t T, int64_t K, int64_t E, int P, const int32_t *topk_ids,                     \
       const int64_t *fwd_alloc, const uint8_t *placement, int32_t *pair_rank),             \
      (T, K, E, P, topk_ids, fwd_alloc, placement, pair_rank))                              \
    X(int, lrmoe_exec_check_fwd_inputs,                                                     \
      (const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d, const lrmoe_exec_fwd_t *a), \
      (cfg, d, a))                                                                          \
    X(int, lrmoe_exec_check_bwd_inputs,                                                     \
      (const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d, const lrmoe_exec_bwd_t *a), \
      (cfg, d, a))                                                                          \
    X(int, lrmoe_exec_check_bwd_args, (const lrmoe_exec_dims_t *d, const lrmoe_exec_bwd_t *a), \
      (d, a))                                                                               \
    X(int, lrmoe_exec_check_pack,                                                           \
      (int P, int64_t T, int64_t K, int64_t E, const int32_t *topk,                         \
       const lrmoe_exec_bwd_t *a, const uint8_t *placement),                                \
      (P, T, K, E, topk, a, placement))                                                     \
    X(double, lrmoe_now, (void), ())
#define LRMOE_CUDA_HOST_VOIDS(V)                                                            \
    V(lrmoe_comm_free, (lrmoe_comm_t *c), (c))                                              \
    V(lrmoe_comm_displs,                                                                    \
      (int P, const int64_t *counts, int64_t *sdispls, int64_t *rdispls),                   \
      (P, counts, sdispls, rdispls))

#define LRMOE_CUDA_FIELD(ret, name, params, args) ret (*name) params;
#define LRMOE_CUDA_VFIELD(name, params, args) void (*name) params;

/* liblrmoe's side, kept by the module for its life. */
typedef struct {
    int abi;     /* LRMOE_CUDA_MODULE_ABI */
    size_t size; /* sizeof (lrmoe_cuda_host_t) */
    LRMOE_CUDA_HOST_FUNCS(LRMOE_CUDA_FIELD)
    LRMOE_CUDA_HOST_VOIDS(LRMOE_CUDA_VFIELD)
    int (*err)(const char *fmt, ...);        /* lrmoe_err */
    int (*err_prefix)(const char *fmt, ...); /* lrmoe_err_prefix */
} lrmoe_cuda_host_t;

/* The module's side, filled by its init. */
typedef struct {
    int abi;     /* LRMOE_CUDA_MODULE_ABI of the module */
    size_t size; /* sizeof (lrmoe_cuda_module_t) of the module */
    LRMOE_CUDA_MODULE_FUNCS(LRMOE_CUDA_FIELD)
    LRMOE_CUDA_MODULE_VOIDS(LRMOE_CUDA_VFIELD)
} lrmoe_cuda_module_t;

/* The module's one exported function (LRMOE_CUDA_MODULE_INIT). It always
 * writes mod->abi and mod->size; only when host->abi and host->size are its
 * own does it keep host, fill the rest of *mod and return 0. Else -1 (with
 * host->err when the ABI matches, so the caller compares mod->abi first). */
typedef int lrmoe_cuda_module_init_fn(const lrmoe_cuda_host_t *host, lrmoe_cuda_module_t *mod);
lrmoe_cuda_module_init_fn lrmoe_cuda_module_init;

#endif
