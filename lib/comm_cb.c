/* Callback communicator: one process per rank, data moved by the caller's
 * functions (exec.h, lrmoe_comm_callback_new). lrmoe.torch.dist puts
 * torch.distributed (all_to_all_single, send/recv) behind them. */
#include <stdlib.h>
#include <string.h>
#include "lrmoe.h"
#include "clock.h"
#include "comm.h"
#include "exec.h"

typedef struct {
    lrmoe_comm_a2a_fn a2a;
    lrmoe_comm_p2p_fn p2p;
    void *user;
    int64_t *v;                 /* (4P): scounts, sdispls, rcounts, rdispls */
    int64_t a2a_bytes, p2p_bytes;
} cb_ctx_t;

static cb_ctx_t *cx(const lrmoe_comm_t *c) { return (cb_ctx_t *)c->ctx; }

static int cb_alltoallv(lrmoe_comm_t *c, size_t es, const void *const *send,
                        const int64_t *counts, const int64_t *sdispls, void *const *recv,
                        const int64_t *rdispls, double *rank_sec)
{
    cb_ctx_t *x = cx(c);
    const int P = c->P, me = c->self - 1;
    int64_t *sc = x->v, *sd = sc + P, *rc = sc + 2 * P, *rd = sc + 3 * P, out = 0, in = 0;
    for (int p = 0; p < P; p++) {
        sc[p] = counts[(size_t)me * P + p];
        rc[p] = counts[(size_t)p * P + me];
        sd[p] = sdispls[(size_t)me * P + p];
        rd[p] = rdispls[(size_t)me * P + p];
        if (sc[p] < 0 || rc[p] < 0)
            return lrmoe_err("alltoallv: negative count between ranks %d and %d", me, p);
        out += sc[p];
        in += rc[p];
    }
    if ((out && !send[me]) || (in && !recv[me]))
        return lrmoe_err("alltoallv: NULL buffer on rank %d", me);
    double t0 = rank_sec ? lrmoe_now() : 0;
    if (x->a2a(x->user, es, send[me], sc, sd, recv[me], rc, rd) != 0)
        return lrmoe_err("alltoallv: the callback failed on rank %d", me);
    if (rank_sec) rank_sec[me] += lrmoe_now() - t0;
    x->a2a_bytes += out * (int64_t)es;
    return 0;
}

static int cb_p2p(lrmoe_comm_t *c, int src, const void *sendbuf, int dst, void *recvbuf,
                  size_t bytes)
{
    cb_ctx_t *x = cx(c);
    const int me = c->self - 1;
    if (src < 0 || src >= c->P || dst < 0 || dst >= c->P)
        return lrmoe_err("p2p: rank out of range (%d -> %d, P=%d)", src, dst, c->P);
    if (!bytes || (src != me && dst != me)) return 0;
    if (src == dst) {
        if (sendbuf != recvbuf) memmove(recvbuf, sendbuf, bytes);
        return 0;
    }
    if (x->p2p(x->user, src, src == me ? sendbuf : NULL, dst, dst == me ? recvbuf : NULL,
               bytes) != 0)
        return lrmoe_err("p2p: the callback failed (rank %d -> %d, %zu bytes)", src, dst, bytes);
    if (src == me) x->p2p_bytes += (int64_t)bytes;
    return 0;
}

static void cb_destroy(lrmoe_comm_t *c)
{
    if (c->ctx) free(cx(c)->v);
    free(c->ctx);
    c->ctx = NULL;
}

lrmoe_comm_t *lrmoe_comm_callback_new(int P, int rank, lrmoe_comm_a2a_fn a2a,
                                      lrmoe_comm_p2p_fn p2p, void *user)
{
    if (P < 1 || rank < 0 || rank >= P) {
        lrmoe_err("comm: rank %d of %d ranks", rank, P);
        return NULL;
    }
    if (!a2a || !p2p) {
        lrmoe_err("comm: the all-to-all and p2p callbacks are required");
        return NULL;
    }
    lrmoe_comm_t *c = calloc(1, sizeof *c);
    cb_ctx_t *x = calloc(1, sizeof *x);
    int64_t *v = calloc((size_t)P * 4, sizeof *v);
    if (!c || !x || !v) {
        free(c); free(x); free(v);
        lrmoe_err("comm: out of memory");
        return NULL;
    }
    x->a2a = a2a;
    x->p2p = p2p;
    x->user = user;
    x->v = v;
    c->P = P;
    c->self = rank + 1;
    c->backend = LRMOE_BACKEND_CPU;
    c->ctx = x;
    c->alltoallv = cb_alltoallv;
    c->p2p = cb_p2p;
    c->destroy = cb_destroy;
    return c;
}

void lrmoe_comm_callback_free(lrmoe_comm_t *c)
{
    if (!c) return;
    cb_destroy(c);
    free(c);
}

void lrmoe_comm_callback_sent(const lrmoe_comm_t *c, int64_t *a2a_bytes, int64_t *p2p_bytes)
{
    if (a2a_bytes) *a2a_bytes = c ? cx(c)->a2a_bytes : 0;
    if (p2p_bytes) *p2p_bytes = c ? cx(c)->p2p_bytes : 0;
}
