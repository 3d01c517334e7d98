/* Communication between the P expert-parallel ranks of one process.
 *
 * Single-controller view: one call moves the data of all P ranks at once
 * (as an NCCL group over P devices would). Buffers are given per rank.
 * On the CPU backend every operation is a memory copy; the CUDA backend puts
 * NCCL (ncclSend/ncclRecv inside a group) behind the same function pointers.
 *
 * Counts and displacements are in elements of elem_size bytes (exec uses one
 * element = one row). Nothing prints; calls return 0 or -1 with lrmoe_err.
 */
#ifndef LRMOE_COMM_H
#define LRMOE_COMM_H

#include <stddef.h>
#include <stdint.h>

typedef struct lrmoe_comm lrmoe_comm_t;

struct lrmoe_comm {
    int P;
    int backend;   /* lrmoe_backend_t of exec.h */
    void *ctx;     /* backend state (NCCL communicators, streams), NULL on CPU */
    /* 0: all P ranks live in this process (the single-controller view).
     * r+1: this process is rank r only (one process per rank, MPI): the
     * exec touches only rank r's buffers and a call moves only what rank r
     * sends and receives (send[r], recv[r]; the others are not read). */
    int self;
    /* CUDA rank communicators (one process per rank): the rank's device
     * context (lrmoe_kcu_ctx_t), which the CUDA exec runs on; else NULL. */
    void *device;

    /* All-to-all-v. For every source rank s and destination d:
     *   send[s] + sdispls[s*P+d]*elem_size  holds  counts[s*P+d] elements
     *   that land at recv[d] + rdispls[d*P+s]*elem_size.
     * counts is (P,P) source-major; the receive count of d from s is
     * counts[s*P+d]. Buffers of different ranks must not overlap.
     * rank_sec: NULL or (P) seconds added to each receiving rank. */
    int (*alltoallv)(lrmoe_comm_t *c, size_t elem_size,
                     const void *const *send, const int64_t *counts,
                     const int64_t *sdispls,
                     void *const *recv, const int64_t *rdispls,
                     double *rank_sec);

    /* Point-to-point: bytes from rank src's sendbuf to rank dst's recvbuf
     * (weights to replicas/helpers, weight gradients back to the owner).
     * src == dst is allowed (a local copy). */
    int (*p2p)(lrmoe_comm_t *c, int src, const void *sendbuf,
               int dst, void *recvbuf, size_t bytes);

    void (*destroy)(lrmoe_comm_t *c);
};

/* 1 when rank r's work is done by this process (see self). */
static inline int lrmoe_comm_local(const lrmoe_comm_t *c, int r)
{
    return c->self == 0 || c->self == r + 1;
}

/* A CPU communicator (memcpy) for P ranks. Free with lrmoe_comm_free.
 * rank_sec is measured with lrmoe_now (monotonic), or with now (NULL:
 * lrmoe_now) in the _clock variant. */
int lrmoe_comm_cpu_init(lrmoe_comm_t *c, int P);
int lrmoe_comm_cpu_init_clock(lrmoe_comm_t *c, int P, double (*now)(void));
void lrmoe_comm_free(lrmoe_comm_t *c);

/* Exclusive prefix sums of the rows of a (P,P) count matrix, as displacements:
 * sdispls[s*P+d] = sum_{d'<d} counts[s*P+d'];  rdispls[d*P+s] = sum_{s'<s} counts[s'*P+d]. */
void lrmoe_comm_displs(int P, const int64_t *counts, int64_t *sdispls, int64_t *rdispls);

/* ---------------------------------------------------------------- MPI
 * One process per rank (lib/comm_mpi.c, built when OpenMPI is found; the
 * functions exist in every build and fail with "MPI support is not built").
 * all-to-all-v: every rank first sends its row of counts to every peer
 * (MPI_Alltoall) and checks them against the counts it expects, then
 * MPI_Alltoallv moves the rows (one MPI datatype of elem_size bytes, so
 * counts are rows). p2p: MPI_Send on src, MPI_Recv on dst, nothing on the
 * others; every process must walk the same sequence of p2p calls. */

/* 1 when this build has MPI support. */
int lrmoe_comm_mpi_built(void);
/* 1 when the environment says this process was started by an MPI launcher
 * (mpirun/mpiexec: OMPI_COMM_WORLD_SIZE; srun/PMIx: PMIX_RANK; PMI_RANK). */
int lrmoe_comm_mpi_launched(void);
/* MPI_Init and a communicator over MPI_COMM_WORLD: c->P is the world size,
 * c->self the world rank + 1. */
int lrmoe_comm_mpi_init(lrmoe_comm_t *c, int *argc, char ***argv);
int lrmoe_comm_mpi_rank(const lrmoe_comm_t *c);
/* Rank among the processes of this host (MPI_COMM_TYPE_SHARED): picks the GPU. */
int lrmoe_comm_mpi_local_rank(const lrmoe_comm_t *c);
/* Bytes this process sent by all-to-all-v and by p2p since the last reset
 * (to itself included: a rank's rows to itself still cross its buffers), and
 * its seconds inside MPI_Alltoallv after the counts exchange (which lines
 * the ranks up, so this is transfer time rather than waiting). */
void lrmoe_comm_mpi_sent(const lrmoe_comm_t *c, int64_t *a2a_bytes, int64_t *p2p_bytes,
                         double *a2a_sec);
void lrmoe_comm_mpi_reset(lrmoe_comm_t *c);
/* Kill the whole job (MPI_Abort): the caller has printed why. */
void lrmoe_comm_mpi_abort(lrmoe_comm_t *c, int code);
/* MPI_Finalize; c is unusable afterwards. */
int lrmoe_comm_mpi_finalize(lrmoe_comm_t *c);
/* Broadcast n bytes from rank root (any size: sent in pieces). */
int lrmoe_comm_mpi_bcast(lrmoe_comm_t *c, void *buf, size_t n, int root);
/* The watchdog: with seconds > 0 every MPI call of c waits at most that
 * long; then every other rank is asked for a sign of life (each rank answers
 * while it waits in one of these calls), and the call fails with an error
 * naming the first rank that does not answer within another timeout (the
 * tool ends the job). 0 (the default): calls block in MPI without bound. */
void lrmoe_comm_mpi_set_timeout(lrmoe_comm_t *c, double seconds);
/* While idle (1), waits are unbounded (the next job, which waits on rank
 * 0's input) but still answer; returns the previous setting. */
int lrmoe_comm_mpi_idle(lrmoe_comm_t *c, int idle);
/* Rows of row_bytes through root: scatterv sends counts[r] rows of sendbuf
 * (rank-major) to rank r, which receives its nrecv rows into recvbuf;
 * gatherv is the reverse (counts and recvbuf are read on root only). */
int lrmoe_comm_mpi_scatterv(lrmoe_comm_t *c, size_t row_bytes, const void *sendbuf,
                            const int64_t *counts, void *recvbuf, int64_t nrecv, int root);
int lrmoe_comm_mpi_gatherv(lrmoe_comm_t *c, size_t row_bytes, const void *sendbuf,
                           int64_t nsend, void *recvbuf, const int64_t *counts, int root);
/* Every rank's nsend rows to every rank: recvbuf holds counts[r] rows of
 * rank r, rank after rank (counts given on every rank). */
int lrmoe_comm_mpi_allgatherv(lrmoe_comm_t *c, size_t row_bytes, const void *sendbuf,
                              int64_t nsend, void *recvbuf, const int64_t *counts);
#if defined(LRMOE_HAVE_MPI) && defined(LRMOE_HAVE_CUDA)
/* CUDA under MPI: a context on GPU (local rank mod visible devices) and the
 * communicator of this rank, out->device = the context. When every rank has
 * a GPU of its own: NCCL (ncclGetUniqueId on rank 0, broadcast over mpi,
 * ncclCommInitRank: lrmoe_comm_cuda_init_rank, kernels/comm_nccl_rank.cu).
 * When two ranks share a GPU (host name and PCI bus id, gathered from every
 * rank), which one NCCL communicator cannot hold: every transfer is staged
 * through host memory and mpi (device to host, MPI_Alltoallv or
 * MPI_Send/Recv, host to device). */
struct lrmoe_kcu_ctx;
int lrmoe_comm_mpi_nccl_init(lrmoe_comm_t *mpi, int nstreams, struct lrmoe_kcu_ctx **ctx,
                             lrmoe_comm_t *out);
/* 1 when gpu (from lrmoe_comm_mpi_nccl_init) uses NCCL, 0 when it stages
 * through host memory and MPI. */
int lrmoe_comm_mpi_nccl_is_nccl(const lrmoe_comm_t *gpu);
/* CUDA devices this process sees (< 0 with the reason set when none). */
int lrmoe_comm_mpi_nccl_devices(void);
/* Free what lrmoe_comm_mpi_nccl_init made (the communicator, then the context). */
void lrmoe_comm_mpi_nccl_free(lrmoe_comm_t *gpu, struct lrmoe_kcu_ctx *ctx);
/* Bytes this rank sent through NCCL by all-to-all-v and p2p, and its seconds
 * in the all-to-all-v, since the last call (kernels/comm_nccl_rank.cu). */
void lrmoe_comm_cuda_rank_take(lrmoe_comm_t *c, int64_t *a2a_bytes, int64_t *p2p_bytes,
                               double *a2a_sec);
#endif

#endif
