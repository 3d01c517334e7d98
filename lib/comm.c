/* CPU communicator: every all-to-all and point-to-point is a memcpy. */
#include <stdlib.h>
#include <string.h>
#include "lrmoe.h"
#include "comm.h"
#include "exec.h"
#include "clock.h"

typedef struct { double (*now)(void); } cpu_ctx_t;

static int cpu_alltoallv(lrmoe_comm_t *c, size_t es, const void *const *send,
                         const int64_t *counts, const int64_t *sdispls,
                         void *const *recv, const int64_t *rdispls, double *rank_sec)
{
    int P = c->P;
    double (*now)(void) = ((cpu_ctx_t *)c->ctx)->now;
    for (int d = 0; d < P; d++) {
        double t0 = rank_sec ? now() : 0;
        for (int s = 0; s < P; s++) {
            int64_t n = counts[s * P + d];
            if (n < 0) return lrmoe_err("alltoallv: negative count %lld from rank %d to %d",
                                        (long long)n, s, d);
            if (n == 0) continue;
            if (!send[s] || !recv[d]) return lrmoe_err("alltoallv: NULL buffer");
            memcpy((char *)recv[d] + (size_t)rdispls[d * P + s] * es,
                   (const char *)send[s] + (size_t)sdispls[s * P + d] * es, (size_t)n * es);
        }
        if (rank_sec) rank_sec[d] += now() - t0;
    }
    return 0;
}

static int cpu_p2p(lrmoe_comm_t *c, int src, const void *sendbuf, int dst,
                   void *recvbuf, size_t bytes)
{
    if (src < 0 || src >= c->P || dst < 0 || dst >= c->P)
        return lrmoe_err("p2p: rank out of range (%d -> %d, P=%d)", src, dst, c->P);
    if (bytes && sendbuf != recvbuf) memmove(recvbuf, sendbuf, bytes);
    return 0;
}

static void cpu_destroy(lrmoe_comm_t *c)
{
    free(c->ctx);
    c->ctx = NULL;
}

int lrmoe_comm_cpu_init(lrmoe_comm_t *c, int P)
{
    return lrmoe_comm_cpu_init_clock(c, P, NULL);
}

int lrmoe_comm_cpu_init_clock(lrmoe_comm_t *c, int P, double (*now)(void))
{
    memset(c, 0, sizeof *c);
    if (P < 1) return lrmoe_err("comm: P must be >= 1, got %d", P);
    cpu_ctx_t *x = malloc(sizeof *x);
    if (!x) return lrmoe_err("comm: out of memory");
    x->now = now ? now : lrmoe_now;
    c->ctx = x;
    c->P = P;
    c->backend = LRMOE_BACKEND_CPU;
    c->alltoallv = cpu_alltoallv;
    c->p2p = cpu_p2p;
    c->destroy = cpu_destroy;
    return 0;
}

void lrmoe_comm_free(lrmoe_comm_t *c)
{
    if (c && c->destroy) c->destroy(c);
    if (c) c->destroy = NULL;
}

void lrmoe_comm_displs(int P, const int64_t *counts, int64_t *sdispls, int64_t *rdispls)
{
    for (int s = 0; s < P; s++) {
        int64_t acc = 0;
        for (int d = 0; d < P; d++) { sdispls[s * P + d] = acc; acc += counts[s * P + d]; }
    }
    for (int d = 0; d < P; d++) {
        int64_t acc = 0;
        for (int s = 0; s < P; s++) { rdispls[d * P + s] = acc; acc += counts[s * P + d]; }
    }
}
