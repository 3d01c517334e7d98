/* lrmoe-exec under MPI: one expert-parallel rank per process (lib/exec_mpi.c).
 *
 * Rank 0 holds the frame. For every job (one forward or backward call) it
 * broadcasts a header and the routing metadata (topk_ids, topk_weights, the
 * plan, pair_rank/keep or the pack index: O(T*K) small integers), then
 * scatters each data tensor by rows (MPI_Scatterv): rank r receives only
 *   hidden, grad_output, pair_out   the rows of the tokens it owns
 *   hidden (backward full/masked)   the rows of tokens with a pair on r
 *   saved_gate, saved_up            the rows of the pairs that ran on r
 *   pack_grad                       packed rows whose token r owns
 *   pack_hidden, pack_gate, pack_up r's destination segments
 * Every rank then runs its own rank of the CPU backend (exec_cpu.c with the
 * MPI communicator of comm.h: MPI_Alltoallv for the rows, MPI_Send/Recv for
 * replica weights and helper weight gradients, summed at the owner) or of
 * the CUDA backend (kernels/exec_cuda.cu on one GPU per rank, the GPU of
 * index local rank mod visible devices, with the NCCL communicator that
 * rank 0's ncclUniqueId, broadcast over MPI, bootstraps), and
 * rank 0 gathers the results (MPI_Gatherv) into the caller's arrays, with
 * each rank's stage times and bytes sent.
 *
 * Weights: each rank reads the weights stream itself (a shared file system
 * on a cluster) at its first job and keeps only its native experts of every
 * layer (replicas and helpers receive theirs from the owner by p2p, as in a
 * training step where only the owner holds the current weights).
 *
 * Arrays on ranks > 0 are allocated in the global shape with calloc and
 * only their share is written, so untouched pages cost no memory.
 * Nothing prints or exits; an error after a job's header went out leaves the
 * ranks inside collectives: the caller must then lrmoe_comm_mpi_abort
 * (lrmoe_exec_mpi_t.in_flight says so).
 */
#ifndef LRMOE_EXEC_MPI_H
#define LRMOE_EXEC_MPI_H

#include "comm.h"
#include "exec.h"
#include "weights_map.h"

typedef struct lrmoe_exec_mpi {
    lrmoe_comm_t comm;
    int rank, P;
    const char *weights;   /* path of the weights stream (ranks > 0 read it) */
    int in_flight;         /* 1 between a job's header and its gather */
    /* ranks > 0: native experts of each layer of the weights stream, loaded
     * at the layer's first job from the stream kept mapped in wsrc (a raw
     * file; NULL: read whole and every layer loaded at the first job) */
    int nlayers;
    struct lrmoe_exec_mpi_layer *layers;
    struct lrmoe_exec_mpi_wsrc { lrmoe_weights_t W; lrmoe_wmap_t wm; } *wsrc;
    /* rank 0, after each job: per-rank bytes sent by all-to-all-v and p2p,
     * seconds inside MPI_Alltoallv (P each), and rank 0's scatter/gather */
    int64_t *a2a_bytes, *p2p_bytes;
    double *a2a_s;
    double scatter_s, gather_s;
    int64_t scatter_bytes, gather_bytes;
    /* --backend cuda: this rank's GPU context and NCCL communicator, made at
     * the first CUDA job (lrmoe_comm_mpi_nccl_init) */
    lrmoe_comm_t gpu;
    struct lrmoe_kcu_ctx *gpu_ctx;
    int gpu_ok;
    /* per-rank inputs (lrmoe_exec_mpi_per_rank): every rank reads and writes
     * its own stream; agreed: the last error was found alike on every rank
     * from data all of them hold (rank 0 alone reports it, nobody aborts) */
    int shard, agreed;
    int64_t jobs;          /* jobs run so far */
    /* the step attribute of the frame of the next job (LRMOE_EXEC_MPI_NO_STEP:
     * none), set by the caller: with per-rank inputs every rank's must agree */
    int64_t step;
    /* digests of the weights each job used (rank 0, or every rank with
     * per-rank inputs), by layer: ranks > 0 compare theirs with rank 0's */
    struct lrmoe_exec_mpi_digest *digests;
    int ndigests;
    /* the mapping of the weights this process's own jobs use (set by the
     * caller, lib/exec_frame.c; NULL: none), whose checked frames give
     * their tensors' CRCs to the digests */
    const lrmoe_wmap_t *wmap;
} lrmoe_exec_mpi_t;

#define LRMOE_EXEC_MPI_NO_STEP INT64_MIN

/* MPI_Init and the communicator; m->rank, m->P. weights: the path every
 * rank > 0 loads (rank 0 passes its weights to each call). */
int lrmoe_exec_mpi_open(lrmoe_exec_mpi_t *m, int *argc, char ***argv, const char *weights);
/* Rank 0: one job spread over the P = m->P processes. d->P must be m->P;
 * layer picks the weights frame of the ranks > 0. Same arguments and
 * results as lrmoe_exec_forward/backward (timings (P, NSTAGES)). */
int lrmoe_exec_mpi_forward(lrmoe_exec_mpi_t *m, const lrmoe_exec_cfg_t *cfg,
                           const lrmoe_exec_dims_t *d, int64_t layer,
                           const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan,
                           lrmoe_exec_fwd_t *a, double *timings);
int lrmoe_exec_mpi_backward(lrmoe_exec_mpi_t *m, const lrmoe_exec_cfg_t *cfg,
                            const lrmoe_exec_dims_t *d, int64_t layer,
                            const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan,
                            lrmoe_exec_bwd_t *a, double *timings);
/* Rank 0: no more jobs; the other ranks leave lrmoe_exec_mpi_serve (per-rank
 * inputs: every rank, and all must end at the same frame). */
int lrmoe_exec_mpi_end(lrmoe_exec_mpi_t *m);
/* Ranks > 0: run rank 0's jobs until it ends (0) or one fails (-1). */
int lrmoe_exec_mpi_serve(lrmoe_exec_mpi_t *m, const lrmoe_exec_cfg_t *cfg);
/* Per-rank inputs: from now on every rank calls lrmoe_exec_mpi_forward/
 * backward itself, with its own frame holding only its token rows: rows
 * [r*T/P, (r+1)*T/P) of the T tokens of all ranks' frames together, of every
 * [T,...] and [T,K,...] tensor (hidden, topk_ids, topk_weights, grad_output,
 * pair_rank, keep, saved_gate, saved_up, pair_out); the plan and the other
 * tensors alike on every rank. Nothing is scattered or gathered: the
 * routing is all-gathered, the rows whose pair runs on another rank than
 * their token's owner (backward hidden and saved state) are exchanged by
 * all-to-all, and the outputs come back the same way (forward saved state
 * and phi_sqnorm to the token owner). Each rank's outputs are its token
 * rows; its grad_w_* hold its native experts' gradients (other experts
 * zero). Compact backward needs the global pack: refused. Every rank ends
 * with lrmoe_exec_mpi_end, which fails when another rank still has frames. */
void lrmoe_exec_mpi_per_rank(lrmoe_exec_mpi_t *m);
/* pattern with every "%r" replaced by rank (out of n bytes: -1 when it does
 * not fit or holds no %r). */
int lrmoe_exec_mpi_rank_path(const char *pattern, int rank, char *out, size_t n);
/* 1 when --backend cuda can run one rank per process (built with MPI and CUDA). */
int lrmoe_exec_mpi_cuda_built(void);
/* MPI_Finalize and free. */
int lrmoe_exec_mpi_close(lrmoe_exec_mpi_t *m);

/* Rank 0, after a job: its MPI attributes on frame f (phase "forward" or
 * "backward"): exec.PH.a2a_bytes, .p2p_bytes (bytes each rank sent), .a2a_s
 * (each rank's seconds moving rows in MPI_Alltoallv, after the counts
 * exchange), exec.PH.scatter_s/.gather_s
 * and .scatter_bytes/.gather_bytes (rank 0's share traffic), exec.launcher mpi;
 * with --backend cuda exec.gpu_comm nccl (a GPU per rank) or mpi-staged
 * (ranks sharing a GPU: through host memory and MPI). Per-rank inputs: on
 * every rank, exec.inputs per-rank, and scatter_* / gather_* are this rank's
 * exchange of input / output rows that live off their token's owner. */
int lrmoe_exec_mpi_attrs(const lrmoe_exec_mpi_t *m, lrmoe_frame_t *f, const char *phase);

#endif
