/* api: what an in-process caller (a C program linked with liblrmoe.so, the
 * Python package over ctypes) needs beyond the module headers: the library
 * version, the sizes of the public structs (so a binding can check its
 * mirrors against the library it loaded), and planner options set by name
 * (the long option names of lrmoe-plan(1)), so no caller depends on the
 * layout of lrmoe_plan_opts_t. See lrmoe(3) for the ABI rule.
 */
#ifndef LRMOE_API_H
#define LRMOE_API_H

/* Only what the installed headers declare is exported (the library is
 * built with -fvisibility=hidden, lrmoe(3)). */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#include <stddef.h>
#include <stdint.h>
#include "lrmoe.h"

/* LRMOE_VERSION of the library actually loaded ("0.8.0"), and its
 * LRMOE_VERSION_NUMBER (800): a program built against newer headers checks
 * lrmoe_version_number() >= the LRMOE_VERSION_NUMBER it needs. */
const char *lrmoe_version(void);
int lrmoe_version_number(void);

/* sizeof of a public struct by its type name ("lrmoe_frame_t",
 * "lrmoe_exec_bwd_t", ...); 0 for a name that is not one of them. */
size_t lrmoe_abi_sizeof(const char *type);

/* ------------------------------------------------------------ executor */

typedef struct lrmoe_exec lrmoe_exec_t;

/* lrmoe-exec's work on frames in-process behind an opaque handle, with its
 * defaults (phase forward, backend cpu, compute auto); NULL when out of
 * memory. */
lrmoe_exec_t *lrmoe_exec_new(void);
void lrmoe_exec_free(lrmoe_exec_t *x);
/* Set one option by its lrmoe-exec(1) long name and its value as text:
 * phase, mode, weights (a weights stream's path), backend, compute, ranks,
 * threads (-@), rank-threads, gpus, device, gemm, gemm-streams, repeat,
 * warmup, clock, and the flag allow-nonfinite (value NULL). Setting one
 * after a run starts the next run afresh (weights read again). 0, or -1
 * with the error naming the option. */
int lrmoe_exec_set(lrmoe_exec_t *x, const char *name, const char *value);
/* Run the phase on f as lrmoe-exec does on one frame of its stream
 * (lrmoe_exec_frame): adds the phase's outputs and exec.* attributes.
 * The weights are read at the first run and kept. 0, or -1 with the error
 * set. */
int lrmoe_exec_run(lrmoe_exec_t *x, lrmoe_frame_t *f);

/* ---------------------------------------------- route, score and pack */

/* The route, score and pack stages on frames behind opaque handles, with
 * the tools' defaults; options set by the long names of lrmoe-route(1),
 * lrmoe-score(1) and lrmoe-pack(1) and their values as text (a flag:
 * value NULL); each run is the tool's work on one frame, by the same call.
 *   route: topk, router, renorm, scale, groups, topk-groups, threads, ranks,
 *          weights (a weights stream, opened at the set: a raw file
 *          mapped, each layer's frame read and checked at the first run
 *          that uses it, as the tools do; a compressed one read whole),
 *          from-hidden, loads-only
 *   score: metric, select, drop, seed, threads, fidelity, weights (opened
 *          at the set, as route's; only with fidelity); the n-th run of a handle seeds its
 *          draw with seed + n, as lrmoe-score does frame n of a stream
 *          (frame N: the next run is frame N, the one after N + 1, ...)
 *   pack:  alloc, ranks, threads, strip, layout-only
 * _new returns NULL when out of memory; _set and _run 0, or -1 with the
 * error naming the option or the failure; _free accepts NULL. */
typedef struct lrmoe_route lrmoe_route_t;
lrmoe_route_t *lrmoe_route_new(void);
int lrmoe_route_set(lrmoe_route_t *r, const char *name, const char *value);
int lrmoe_route_run(lrmoe_route_t *r, lrmoe_frame_t *f);
void lrmoe_route_free(lrmoe_route_t *r);
typedef struct lrmoe_score lrmoe_score_t;
lrmoe_score_t *lrmoe_score_new(void);
int lrmoe_score_set(lrmoe_score_t *s, const char *name, const char *value);
int lrmoe_score_run(lrmoe_score_t *s, lrmoe_frame_t *f);
void lrmoe_score_free(lrmoe_score_t *s);
typedef struct lrmoe_pack lrmoe_pack_t;
lrmoe_pack_t *lrmoe_pack_new(void);
int lrmoe_pack_set(lrmoe_pack_t *p, const char *name, const char *value);
int lrmoe_pack_run(lrmoe_pack_t *p, lrmoe_frame_t *f);
void lrmoe_pack_free(lrmoe_pack_t *p);

/* ------------------------------------------------------------ planner */

typedef struct lrmoe_plan_cfg lrmoe_plan_cfg_t;

/* Options of lrmoe-plan with its defaults (planner lrmoe, rates
 * 1.0,0.9,0.8,0.7, the paper's cost model); NULL when out of memory. */
lrmoe_plan_cfg_t *lrmoe_plan_cfg_new(void);
void lrmoe_plan_cfg_free(lrmoe_plan_cfg_t *c);
/* Set one option by its lrmoe-plan(1) long name without the dashes and its
 * value as text, e.g. ("ranks","8"), ("hbm","16GiB"), ("planner","llep"),
 * ("rate","0.9"), ("best-effort",NULL). 0, or -1 with the error naming the
 * option (unknown name, bad value, a value given to a flag or missing). */
int lrmoe_plan_cfg_set(lrmoe_plan_cfg_t *c, const char *name, const char *value);
/* Plan the per-expert loads load[E] (as lrmoe-plan does for one frame:
 * the model sizes D, F, K and tokens per rank from f's tensors and
 * attributes, or from the "weights" stream, exactly as lrmoe-plan takes them
 * -- an option that disagrees with f is an error, and so is an f that says
 * nothing of F with no "ffn" or "weights" set (lrmoe(7), MODEL SIZES);
 * lrmoe_plan_compute, lrmoe_plan_check) and put the plan into f with
 * lrmoe_plan_to_frame (tensors placement, fwd_alloc, quota, bwd_alloc and
 * the plan.* attributes). Like lrmoe-plan, c keeps deployed EPLB's layout
 * per layer (the frame attribute "layer" of f, "" without one) for the
 * eplb and lrmoe planners: successive runs on the frames of a stream give
 * lrmoe-plan's plans frame by frame (--rebalance-every). 0, or -1 with the
 * error set (bad options, no --ranks, infeasible, a layer whose experts,
 * ranks or slots changed). */
int lrmoe_plan_cfg_run(lrmoe_plan_cfg_t *c, const int64_t *load, int E, lrmoe_frame_t *f);
/* Forget the kept EPLB layouts (a new stream, or options that change a
 * layer's shape). 0, or -1 (out of memory; c keeps its layouts). */
int lrmoe_plan_cfg_reset(lrmoe_plan_cfg_t *c);

/* ---------------------------------------------------------------- exec arguments by name
 * The arguments of lrmoe_exec_forward, lrmoe_exec_backward (exec.h) and
 * lrmoe_pack_assign (pack.h) held by the library and set by their field
 * names, for a caller that passes its own buffers without mirroring those
 * structs (lrmoe_exec_args_new(3); lib/api_args.c). A name sets every field
 * so named: "hidden" is the forward's and the backward's, "topk_ids" the
 * exec's and the pack's; the weights' dtype is "weights_dtype". Numbers
 * (dims, dtypes, modes and the cfg's ints) by _set, buffers by _set_ptr; an
 * unknown name, or a number for a pointer, is an error. new starts from
 * lrmoe_exec_cfg_default and every other field zero/NULL. pack runs
 * lrmoe_pack_assign on the pack's fields (T, K, E, P, topk_ids, keep,
 * pair_rank, placement, bwd_alloc, quota) and sets the backward's R and
 * pack_pair/pack_rank/pack_counts/pack_offsets to its plan, kept until the
 * next pack or free ("moved": its moved rows, through _get). */
typedef struct lrmoe_exec_args lrmoe_exec_args_t;
lrmoe_exec_args_t *lrmoe_exec_args_new(void);
void lrmoe_exec_args_free(lrmoe_exec_args_t *a);
int lrmoe_exec_args_set(lrmoe_exec_args_t *a, const char *name, int64_t value);
int lrmoe_exec_args_set_ptr(lrmoe_exec_args_t *a, const char *name, const void *p);
int lrmoe_exec_args_get(const lrmoe_exec_args_t *a, const char *name, int64_t *value);
/* a pointer field by name (NULL when unset or unknown) */
const void *lrmoe_exec_args_get_ptr(const lrmoe_exec_args_t *a, const char *name);
int lrmoe_exec_args_pack(lrmoe_exec_args_t *a);
/* lrmoe_exec_forward / lrmoe_exec_backward on the held arguments */
int lrmoe_exec_args_forward(lrmoe_exec_args_t *a, double *timings);
int lrmoe_exec_args_backward(lrmoe_exec_args_t *a, double *timings);
/* The CUDA executor (exec.h, lrmoe_exec_cuda_new(3)) on the held
 * arguments, for a caller without the structs (lrmoe.torch on CUDA
 * tensors): cuda_new makes one from the held cfg (device, gpus, gemm,
 * gemm_streams, comm) and P; forward_cuda/backward_cuda run a frame on it
 * with the held arguments (device pointers where lrmoe_exec_cuda_set_io
 * says so). */
struct lrmoe_exec_cuda;
int lrmoe_exec_args_cuda_new(const lrmoe_exec_args_t *a, struct lrmoe_exec_cuda **out);
int lrmoe_exec_args_forward_cuda(lrmoe_exec_args_t *a, struct lrmoe_exec_cuda *x,
                                 double *timings);
int lrmoe_exec_args_backward_cuda(lrmoe_exec_args_t *a, struct lrmoe_exec_cuda *x,
                                  double *timings);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#endif
