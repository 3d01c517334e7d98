/* The MPI rank communicator entry of the fake CUDA module
 * (tests/gpu/build-fake-module.sh): the fake module serves one process's
 * ranks only (lrmoe.torch's simulated ranks); with an MPI rank
 * communicator it fails with one message instead of calling back into
 * liblrmoe's trampoline of the same name. */
#include <stddef.h>
#include "lrmoe.h"
#include "comm.h"

typedef struct lrmoe_kcu_ctx lrmoe_kcu_ctx_t;
int lrmoe_comm_cuda_init_rank(lrmoe_comm_t *c, int P, int rank, lrmoe_kcu_ctx_t *ctx,
                              int (*bcast)(void *buf, size_t bytes, void *arg), void *arg);

int lrmoe_comm_cuda_init_rank(lrmoe_comm_t *c, int P, int rank, lrmoe_kcu_ctx_t *ctx,
                              int (*bcast)(void *buf, size_t bytes, void *arg), void *arg)
{
    (void)c; (void)P; (void)rank; (void)ctx; (void)bcast; (void)arg;
    return lrmoe_err("fake CUDA module: no MPI rank communicator (one process's ranks only)");
}
