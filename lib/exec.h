/* Expert-parallel execution of one MoE layer invocation (lrmoe-exec).
 *
 * One forward and one backward call run the whole layer for P expert-parallel
 * ranks held by one process (the "single controller" view: every array below
 * is the global array; rank r only ever touches its own part of it, and data
 * crosses ranks only through lib/comm.h).
 *
 *   rank r owns token rows  [floor(r*T/P), floor((r+1)*T/P))   (lrmoe_exec_token_owner)
 *   rank r owns experts     [floor(r*E/P), floor((r+1)*E/P))   (lrmoe_exec_native)
 *   pair u = t*K + k, expert topk_ids[u], weight alpha_u = topk_weights[u]
 *
 * T need not be divisible by P (nor E by P): the floor split above gives every
 * rank floor(T/P) or ceil(T/P) rows; a rank may own zero rows when T < P.
 *
 * SwiGLU expert e (weights w_gate[e], w_up[e] are (F,D), w_down[e] is (D,F)):
 *   h_g = x W_gate^T, h_u = x W_up^T, phi = silu(h_g) * h_u, y = phi W_down^T,
 *   out_t = sum_k alpha_tk y_tk.
 * Compute is F32 (OpenBLAS sgemm on the CPU, cuBLAS on CUDA); storage of the
 * activations (hidden, output, saved state, pair_out) and of the weights is
 * BF16 or F32 independently ("act dtype" and "weight dtype").
 *
 * The layout and semantics here are the stable contract shared by the CPU
 * backend (lib/exec_cpu.c), the CUDA backend (kernels/, entry points
 * lrmoe_exec_forward_cuda/lrmoe_exec_backward_cuda with the same arguments)
 * and the benchmarks. All arrays are dense, row-major, caller-allocated.
 * Nothing here prints or exits: calls return 0, or -1 with lrmoe_err set.
 */
#ifndef LRMOE_EXEC_H
#define LRMOE_EXEC_H

/* Only what the installed headers declare is exported (the library is
 * built with -fvisibility=hidden, lrmoe(3)). */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#include <stdint.h>
#include "lrmoe.h"

typedef enum {
    LRMOE_BACKEND_CPU = 0,
    LRMOE_BACKEND_CUDA = 1
} lrmoe_backend_t;

/* "cpu"/"cuda" -> 0; name for printing. */
int lrmoe_backend_parse(const char *s, lrmoe_backend_t *b);
const char *lrmoe_backend_name(lrmoe_backend_t b);

typedef enum {
    LRMOE_MODE_FULL = 0,    /* every pair */
    LRMOE_MODE_MASKED = 1,  /* full-size buffers, rows with keep==0 zeroed */
    LRMOE_MODE_COMPACT = 2  /* only the packed retained rows (lrmoe-pack) */
} lrmoe_exec_mode_t;
int lrmoe_exec_mode_parse(const char *s, lrmoe_exec_mode_t *m);
const char *lrmoe_exec_mode_name(lrmoe_exec_mode_t m);

/* Timing stages, per rank, seconds of a monotonic clock. */
enum {
    LRMOE_STAGE_WEIGHTS = 0,  /* point-to-point weight copies to replicas/helpers
                                 (and, on the CPU, their F32 conversion) */
    LRMOE_STAGE_DISPATCH,     /* send-buffer build, all-to-all, receive permute
                                 (rows converted to F32 there) */
    LRMOE_STAGE_GEMM,         /* expert GEMMs (and, without F32 weight copies,
                                 the per-call F32 conversion of the weights) */
    LRMOE_STAGE_ACT,          /* SwiGLU forward / backward elementwise, saved
                                 state stored (forward) / loaded to F32 (backward) */
    LRMOE_STAGE_COMBINE,      /* reverse all-to-all, combine / scatter-add, router grad */
    LRMOE_STAGE_GRADRED,      /* weight-gradient p2p to the owner and sum */
    LRMOE_NSTAGES
};
const char *lrmoe_exec_stage_name(int stage); /* "weights","dispatch","gemm",... */

typedef struct {
    int64_t T, E, K, D, F;
    int P;
} lrmoe_exec_dims_t;

typedef struct {
    lrmoe_backend_t backend;
    int threads;          /* BLAS threads (CPU); <=0: leave the library default */
    int allow_nonfinite;  /* 0: NaN/Inf in inputs is an error */
    int device;           /* CUDA: first device id (rank r uses device+r mod count) */
    int rank_threads;     /* CPU: ranks computed concurrently (<=1: one at a time,
                             each with `threads` BLAS threads; N > 1: N ranks at a
                             time, each with max(1, threads/N) BLAS threads) */
    int cpu_clock;        /* CPU: time the stages with the CPU time of the thread
                             running each rank (CLOCK_THREAD_CPUTIME_ID) instead of
                             the monotonic clock: robust on a shared machine, exact
                             only with one BLAS thread per rank */
    int gpus;             /* CUDA: devices used, G (0: all visible); rank r runs on
                             device (device + r mod G) mod visible */
    int gemm;             /* CUDA: lrmoe_exec_gemm_t, the expert GEMM implementation */
    int gemm_streams;     /* CUDA: streams of the loop GEMM (0: backend default, 4) */
    int compute;          /* CPU: lrmoe_compute_t (lib/gemm_cpu.h), the expert GEMMs'
                             numerics: auto (0), f32 (exact) or bf16 (oneDNN) */
    struct lrmoe_comm *comm; /* CPU: NULL, the backend's in-process communicator;
                             else the caller's (lib/comm.h), e.g. MPI with one
                             rank per process (comm->self: this process
                             computes only that rank; lib/exec_mpi.h) */
} lrmoe_exec_cfg_t;
void lrmoe_exec_cfg_default(lrmoe_exec_cfg_t *c);

/* CUDA expert GEMMs: a loop of cublasGemmEx over gemm_streams streams
 * (default), one cublasGemmGroupedBatchedEx per GEMM kind, or the Hopper
 * grouped GEMM (CUTLASS sm90 ptr-array kernel writing F32 or BF16 C itself;
 * only in a CUDA build that found the CUTLASS headers). */
typedef enum {
    LRMOE_EXEC_GEMM_LOOP = 0,
    LRMOE_EXEC_GEMM_GROUPED = 1,
    LRMOE_EXEC_GEMM_CUTLASS = 2
} lrmoe_exec_gemm_t;
int lrmoe_exec_gemm_parse(const char *s, lrmoe_exec_gemm_t *g); /* loop/grouped/cutlass */
const char *lrmoe_exec_gemm_name(lrmoe_exec_gemm_t g);

/* Weights of all E experts (the full logical copy; rank r reads only its
 * native experts directly, every other instance receives them by p2p). */
typedef struct {
    lrmoe_dtype_t dtype;   /* BF16 or F32 */
    const void *w_gate;    /* (E,F,D) */
    const void *w_up;      /* (E,F,D) */
    const void *w_down;    /* (E,D,F) */
    /* Optional F32 copies of the same BF16 weights, made once by the caller
     * (NULL: converted per call). The CPU backend computes native experts
     * from them; point-to-point copies still move the storage dtype. */
    const float *w_gate_f32, *w_up_f32, *w_down_f32;
    /* Optional packed F32 copy made once per layer by the caller (preferred
     * over the three above, for BF16 or F32 storage): expert e is the block
     * w_f32 + e*3*F*D = [W_gate (F,D); W_up (F,D); W_down (D,F)], so W_gate
     * and W_up form one (2F,D) matrix and the CPU backend runs the gate and
     * up projections as ONE GEMM with N = 2F (and dx as one with K = 2F).
     * F32 storage with w_f32 (CPU backend): every read of a matrix, the
     * p2p copies to replicas and helpers included, takes it from w_f32 (the
     * same values), and w_gate, w_up, w_down may be NULL. */
    const float *w_f32;
} lrmoe_exec_weights_t;

/* The plan (lrmoe-plan). Both pointers NULL means plain EP ("fixed"): each
 * expert runs only on its native rank. */
typedef struct {
    const uint8_t *placement;  /* (E,P) 1 where rank p holds an instance of e */
    const int64_t *fwd_alloc;  /* (E,P) pairs of e run on p; row sums = n_e */
} lrmoe_exec_plan_t;

/* ---------------------------------------------------------------- forward */

typedef struct {
    /* inputs */
    lrmoe_dtype_t act_dtype;     /* BF16 or F32: hidden, output, saved_*, pair_out */
    const void *hidden;          /* (T,D) act_dtype */
    const int32_t *topk_ids;     /* (T,K) */
    const float *topk_weights;   /* (T,K) alpha */
    /* outputs (caller-allocated; any of the optional ones may be NULL) */
    void *output;                /* (T,D) act_dtype, required */
    int32_t *pair_rank;          /* (T,K) rank each pair ran on, required */
    float *phi_sqnorm;           /* (T,K) ||phi_u||^2 from the F32 phi, optional */
    void *saved_gate;            /* (T,K,F) act_dtype h_g of each pair, optional */
    void *saved_up;              /* (T,K,F) act_dtype h_u of each pair, optional */
    void *pair_out;              /* (T,K,D) act_dtype y_u of each pair, optional */
} lrmoe_exec_fwd_t;

/* ---------------------------------------------------------------- backward */

/* full/masked: each pair's backward runs on the rank that ran its forward
 * (pair_rank), where its saved state lives: the gradient rows dy_u =
 * alpha_u g_t (F32) travel token owner -> pair_rank by all-to-all, the dx
 * rows come back by the reverse all-to-all and are summed per token. masked
 * zeroes the dy rows with keep_u == 0 but keeps the full-size GEMMs.
 *
 * compact: the rows are the packed ones of lrmoe-pack (R rows, destination-
 * major then expert-major, u ascending inside a segment; segment (p,e) is rows
 * [pack_offsets[p*E+e], +pack_counts[p*E+e]) and runs on rank p). Only those
 * rows cross the all-to-all (pack_grad rows from the token owner of
 * pack_pair/K to p) and every expert GEMM has exactly its retained row count.
 * The saved state is taken from pack_hidden/pack_gate/pack_up (already
 * gathered at the destination by lrmoe-pack). The layout-only form
 * (lrmoe-pack --layout-only; CPU backend in one process only):
 * pack_grad, pack_hidden, pack_gate and pack_up all NULL, and the backward
 * gathers row i from hidden[u/K], saved_gate[u], saved_up[u] and
 * alpha_u grad_output[u/K] (u = pack_pair[i]) as it copies its segments:
 * the same bits as the copying form.
 *
 * All modes: grad_hidden is zeroed then scatter-added; weight gradients of
 * replicas/helpers are sent (p2p) to the native rank and summed there;
 * grad_topk_weights[u] = g_t . y_u over ALL pairs (from pair_out). */
typedef struct {
    lrmoe_exec_mode_t mode;
    lrmoe_dtype_t act_dtype;     /* dtype of hidden, saved_*, pair_out, pack_hidden/gate/up */
    lrmoe_dtype_t grad_dtype;    /* dtype of grad_output: BF16 or F32 */
    const int32_t *topk_ids;     /* (T,K) */
    const float *topk_weights;   /* (T,K) */
    const void *grad_output;     /* (T,D) g */
    const void *pair_out;        /* (T,K,D) y_u, for grad_topk_weights */
    /* full / masked */
    const void *hidden;          /* (T,D) */
    const int32_t *pair_rank;    /* (T,K) forward rank of each pair */
    const void *saved_gate;      /* (T,K,F) h_g */
    const void *saved_up;        /* (T,K,F) h_u */
    const uint8_t *keep;         /* (T,K) masked only (0 drop, else keep) */
    /* compact (lrmoe-pack) */
    int64_t R;                   /* packed rows */
    const int64_t *pack_pair;    /* (R) pair index u */
    const int32_t *pack_rank;    /* (R) destination rank (checked against counts) */
    const int64_t *pack_counts;  /* (P,E) */
    const int64_t *pack_offsets; /* (P,E) exclusive prefix sum, row-major */
    const float *pack_grad;      /* (R,D) alpha_u g_t */
    const void *pack_hidden;     /* (R,D) x_t */
    const void *pack_gate;       /* (R,F) h_g */
    const void *pack_up;         /* (R,F) h_u */
    /* outputs (F32, caller-allocated, all required) */
    float *grad_hidden;          /* (T,D) */
    float *grad_w_gate;          /* (E,F,D) */
    float *grad_w_up;            /* (E,F,D) */
    float *grad_w_down;          /* (E,D,F) */
    float *grad_topk_weights;    /* (T,K) */
} lrmoe_exec_bwd_t;

/* ---------------------------------------------------------------- entry points */

/* timings: NULL or (P, LRMOE_NSTAGES) seconds, overwritten. */
int lrmoe_exec_forward(const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                       const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan,
                       lrmoe_exec_fwd_t *a, double *timings);
int lrmoe_exec_backward(const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                        const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan,
                        lrmoe_exec_bwd_t *a, double *timings);

/* ---------------------------------------------------------------- CUDA executor
 * What the CUDA backend keeps across frames (lrmoe(3), "CUDA executor"):
 * the ranks' device contexts (streams, cuBLAS handles), the communicator
 * (NCCL or device copies, in async mode), each layer's weights resident on
 * the ranks (keyed by the three weight pointers, dtype and shape: natives
 * uploaded the first time, replicas copied on first use), pinned staging
 * and timing events. A frame queues every rank's work, ordered across
 * ranks by events, and waits on the host once, at its end. Results are
 * those of lrmoe_exec_forward/backward with backend CUDA (which make and
 * free an executor per call). cfg gives device, gpus, gemm, gemm_streams
 * and comm at creation (an MPI rank communicator: NCCL between the ranks'
 * GPUs; or a callback rank communicator, lrmoe_comm_callback_new: this
 * process's rank on cfg.device, its stream synchronised before each call of
 * the callbacks, which move device memory, e.g. through a torch.distributed
 * process group); forward/backward take
 * the same cfg (input checks) and P must be the executor's. A rank
 * communicator's rank r (MPI or callback: this process runs rank r only)
 * reads only its native experts' rows of w_gate/w_up/w_down (expert e at
 * e*F*D elements, lrmoe_exec_native(e, E, P) == r; uploaded once), every
 * replica or helper instance it runs gets its weights from the native rank
 * by p2p, and the backward writes only the native rows of grad_w_gate/
 * grad_w_up/grad_w_down (replicas' and helpers' gradients are sent there
 * and summed): a caller that holds only its native experts [lo, hi) (e.g.
 * lrmoe.torch's shard=True) may pass each of those arrays as its address
 * less lo rows, since no other row is addressed. Not
 * thread-safe: one thread per executor. Built with CUDA only (else
 * lrmoe_exec_cuda_new fails with the backend's message). */
typedef struct lrmoe_exec_cuda lrmoe_exec_cuda_t;
int lrmoe_exec_cuda_new(const lrmoe_exec_cfg_t *cfg, int P, lrmoe_exec_cuda_t **out);
void lrmoe_exec_cuda_free(lrmoe_exec_cuda_t *x);
/* The caller changed weight values in place: drop every resident copy (the
 * next frame uploads again). Frees in stream order: no host wait. */
int lrmoe_exec_cuda_weights_changed(lrmoe_exec_cuda_t *x);
/* Device-pointer I/O (device_io 1): every activation, weight and output
 * array of the frames that follow is a device pointer on the device of
 * this process's ranks (all must share one: --gpus 1, or an MPI rank):
 * weights w_gate/w_up/w_down; forward hidden, output, phi_sqnorm,
 * saved_gate, saved_up, pair_out; backward hidden, saved_gate, saved_up,
 * pair_out, grad_output, pack_grad, pack_hidden, pack_gate, pack_up and
 * every grad_ output. Routing and layout stay host arrays (topk_ids,
 * topk_weights, pair_rank, keep, the plan, pack_pair/rank/counts/offsets).
 * stream (a cudaStream_t of that device, NULL the legacy default stream,
 * e.g. torch.cuda.current_stream().cuda_stream): a frame starts after the
 * work queued on it and it waits for the frame (events), so the host does
 * not wait at the end: the call returns once everything is queued, and
 * the outputs are ready in stream order. The host waits once, at the next
 * frame's start, for the last frame (its pinned staging is reused). Input
 * activations are not checked for finiteness here; timings stay zero.
 * device_io 2 (device routing; an executor of one rank, P = 1): as 1, and
 * topk_ids and topk_weights are device arrays too: the layout is computed
 * on the device and the expert GEMMs run as the CUTLASS grouped GEMM over
 * device-side row offsets (lrmoe_kcu_ggemm: a build with CUTLASS, an sm_90
 * GPU), so a frame stages nothing, waits for nothing and can be captured
 * into a CUDA graph on `stream` and replayed with new routing written into
 * the same device arrays. pair_rank is optional there (host, zeros: one
 * rank), a plan changes nothing on one rank, the backward is mode full.
 * The weights must have run one frame outside a capture (they are made
 * resident then); an expert id out of range is found on the device, keeps
 * the frame in bounds and fails the next frame run outside a capture.
 * device_io 0: host arrays again (stream ignored). */
int lrmoe_exec_cuda_set_io(lrmoe_exec_cuda_t *x, int device_io, void *stream);
int lrmoe_exec_cuda_forward(lrmoe_exec_cuda_t *x, const lrmoe_exec_cfg_t *cfg,
                            const lrmoe_exec_dims_t *d, const lrmoe_exec_weights_t *w,
                            const lrmoe_exec_plan_t *plan, lrmoe_exec_fwd_t *a,
                            double *timings);
int lrmoe_exec_cuda_backward(lrmoe_exec_cuda_t *x, const lrmoe_exec_cfg_t *cfg,
                             const lrmoe_exec_dims_t *d, const lrmoe_exec_weights_t *w,
                             const lrmoe_exec_plan_t *plan, lrmoe_exec_bwd_t *a,
                             double *timings);
/* The backward's pair scores on the device (device-pointer I/O only):
 * score (T,K), a host array, receives lrmoe_score_pairs_dt(metric, T, K,
 * D, gdt, g, alpha, phi_sqnorm) computed from device arrays by the kernel
 * lrmoe_kcu_pair_score (kernels/kcu.h; bit for bit the CPU scores where the
 * kernels are their CPU references), so only the T*K scores cross to the
 * host, not g. metric (lrmoe_metric_t, score.h): LRMOE_METRIC_LRM (g (T,D)
 * of dtype gdt F32 or BF16, alpha and phi_sqnorm (T,K) F32, all device
 * pointers), LRMOE_METRIC_GRADNORM (||g_t||^2) or LRMOE_METRIC_ABSGRAD
 * (sum_d |g_t[d]|): these two read g only (alpha and phi_sqnorm are
 * ignored and may be NULL; nothing is uploaded). random and uniform have
 * no device kernel (they read no g: lrmoe_score_pairs_dt on the host).
 * Runs on the first local rank's context after the work queued on the
 * set_io stream, and waits on the host for the scores. Fails on a
 * non-finite score, naming the pair. */
int lrmoe_exec_cuda_score(lrmoe_exec_cuda_t *x, int metric, int64_t T, int K, int64_t D,
                          lrmoe_dtype_t gdt, const void *g, const float *alpha,
                          const float *phi_sqnorm, float *score);

/* ---------------------------------------------------------------- helpers */

/* Native rank of expert e: the r with floor(r*E/P) <= e < floor((r+1)*E/P). */
int lrmoe_exec_native(int64_t e, int64_t E, int P);
/* Rank owning token row t (same floor split over T). */
int lrmoe_exec_token_owner(int64_t t, int64_t T, int P);

/* Assign every pair to its forward rank (pure, deterministic):
 * within expert e, take its pairs in ascending u = t*K+k; the first
 * fwd_alloc[e, native(e)] go to the native rank, then the other ranks in
 * ascending rank order take fwd_alloc[e,p] each. fwd_alloc NULL = plain EP
 * (all on the native rank). Errors if a row of fwd_alloc is negative or does
 * not sum to n_e, if topk_ids is out of [0,E), or (placement non-NULL) if a
 * rank gets pairs of an expert it holds no instance of.
 *   topk_ids (T,K), fwd_alloc (E,P), placement (E,P) or NULL, pair_rank (T,K) out. */
int lrmoe_exec_assign(int64_t T, int64_t K, int64_t E, int P,
                      const int32_t *topk_ids, const int64_t *fwd_alloc,
                      const uint8_t *placement, int32_t *pair_rank);

/* The critical rank: largest total over stages; timings is (P, LRMOE_NSTAGES). */
int lrmoe_exec_critical(int P, const double *timings);

/* 0 if all n values are finite, else -1 "NAME: non-finite value at index I". */
int lrmoe_exec_check_finite(lrmoe_dtype_t dt, const void *x, size_t n, const char *name);


/* ---------------------------------------------------------------- callback communicator
 * One process per rank whose data the caller moves (lib/comm_cb.c): the
 * communicator of rank `rank` of P (comm.h's self = rank+1: the exec then
 * computes and fills only that rank's part of the global arrays), for
 * lrmoe_exec_cfg_t.comm. Every process makes the same exec calls.
 *   a2a: this rank's all-to-all-v: scounts[d] elements of elem_size bytes at
 *     send + sdispls[d]*elem_size go to rank d; rcounts[s] elements from
 *     rank s land at recv + rdispls[s]*elem_size (all arrays (P); rows to
 *     this rank itself included). Every rank calls it, in the same order.
 *   p2p: bytes from rank src's sendbuf to rank dst's recvbuf, called on src
 *     (recvbuf NULL) and on dst (sendbuf NULL) only, never with src == dst
 *     (a local copy); every process walks the same sequence of transfers.
 * Both return 0, or nonzero (the exec call then fails). */
struct lrmoe_comm;
typedef int (*lrmoe_comm_a2a_fn)(void *user, size_t elem_size, const void *send,
                                 const int64_t *scounts, const int64_t *sdispls, void *recv,
                                 const int64_t *rcounts, const int64_t *rdispls);
typedef int (*lrmoe_comm_p2p_fn)(void *user, int src, const void *sendbuf, int dst,
                                 void *recvbuf, size_t bytes);
/* NULL with lrmoe_err on bad arguments or no memory. */
struct lrmoe_comm *lrmoe_comm_callback_new(int P, int rank, lrmoe_comm_a2a_fn a2a,
                                           lrmoe_comm_p2p_fn p2p, void *user);
void lrmoe_comm_callback_free(struct lrmoe_comm *c);
/* Bytes this rank sent by all-to-all-v (rows to itself included) and by p2p. */
void lrmoe_comm_callback_sent(const struct lrmoe_comm *c, int64_t *a2a_bytes,
                              int64_t *p2p_bytes);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#endif
