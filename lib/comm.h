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

/* A CPU communicator (memcpy) for P ranks. Free with lrmoe_comm_free.
 * rank_sec is measured with lrmoe_now (monotonic), or with now (NULL:
 * lrmoe_now) in the _clock variant. */
int lrmoe_comm_cpu_init(lrmoe_comm_t *c, int P);
int lrmoe_comm_cpu_init_clock(lrmoe_comm_t *c, int P, double (*now)(void));
void lrmoe_comm_free(lrmoe_comm_t *c);

/* Exclusive prefix sums of the rows of a (P,P) count matrix, as displacements:
 * sdispls[s*P+d] = sum_{d'<d} counts[s*P+d'];  rdispls[d*P+s] = sum_{s'<s} counts[s'*P+d]. */
void lrmoe_comm_displs(int P, const int64_t *counts, int64_t *sdispls, int64_t *rdispls);

#endif
