/* The callback communicator (lrmoe_comm_callback_new, exec.h) without any
 * framework: P threads, each rank r of P with its own communicator whose
 * all-to-all-v and p2p move rows between the threads' buffers, run the
 * forward, the pack and the compact backward of one layer with a plan that
 * has a replica (so weights go out by p2p and weight gradients come back),
 * and every rank's part must equal the single-controller run (one call
 * computing all P ranks) bit for bit: output, grad_hidden and
 * grad_topk_weights of its tokens, phi_sqnorm of the pairs it ran, and the
 * weight gradients of its native experts. Prints "same bits" and the bytes
 * each rank sent, or what differs. Built against the staged tree. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <lrmoe/lrmoe.h>
#include <lrmoe/exec.h>
#include <lrmoe/pack.h>

enum { P = 3, T = 30, E = 6, K = 2, D = 8, F = 6 };

static float x[T * D], alpha[T * K], wg[E * F * D], wu[E * F * D], wd[E * D * F], g[T * D];
static int32_t ids[T * K], pr[T * K];
static uint8_t keep[T * K], placement[E * P];
static int64_t fwd_alloc[E * P];

typedef struct {
    float out[T * D], phi[T * K], sg[T * K * F], su[T * K * F], po[T * K * D];
    int32_t prs[T * K];
    float gh[T * D], gwg[E * F * D], gwu[E * F * D], gwd[E * D * F], gtw[T * K];
} result_t;

/* ------------------------------------------------------------ the "network":
 * an all-to-all posts every rank's send side, then each rank copies its rows
 * out of the others' buffers; a p2p is a rendezvous between src and dst. */
static pthread_barrier_t bar;
static struct {
    const char *send;
    const int64_t *scounts, *sdispls;
} post[P];
static struct box_s {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const void *buf;
    size_t bytes;
    int taken;
} box[P][P];

static int a2a(void *user, size_t es, const void *send, const int64_t *scounts,
               const int64_t *sdispls, void *recv, const int64_t *rcounts,
               const int64_t *rdispls)
{
    const int me = (int)(intptr_t)user;
    post[me].send = send, post[me].scounts = scounts, post[me].sdispls = sdispls;
    pthread_barrier_wait(&bar);
    for (int s = 0; s < P; s++) {
        if (post[s].scounts[me] != rcounts[s]) return -1; /* the counts must agree */
        memcpy((char *)recv + rdispls[s] * es, post[s].send + post[s].sdispls[me] * es,
               (size_t)rcounts[s] * es);
    }
    pthread_barrier_wait(&bar); /* the send buffers stay valid until all have copied */
    return 0;
}

static int p2p(void *user, int src, const void *sendbuf, int dst, void *recvbuf, size_t bytes)
{
    (void)user;
    struct box_s *b = &box[src][dst];
    pthread_mutex_lock(&b->mu);
    if (sendbuf) { /* on src: post, wait until dst took it */
        b->buf = sendbuf, b->bytes = bytes, b->taken = 0;
        pthread_cond_broadcast(&b->cv);
        while (!b->taken) pthread_cond_wait(&b->cv, &b->mu);
        b->buf = NULL;
    } else { /* on dst */
        while (!b->buf || b->taken) pthread_cond_wait(&b->cv, &b->mu);
        if (b->bytes != bytes) {
            pthread_mutex_unlock(&b->mu);
            return -1;
        }
        memcpy(recvbuf, b->buf, bytes);
        b->taken = 1;
        pthread_cond_broadcast(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
    return 0;
}

/* ------------------------------------------------------------ one layer step */
static int step(struct lrmoe_comm *comm, result_t *r)
{
    lrmoe_exec_cfg_t cfg;
    lrmoe_exec_cfg_default(&cfg);
    cfg.threads = 1;
    cfg.comm = comm;
    lrmoe_exec_dims_t d = {T, E, K, D, F, P};
    lrmoe_exec_weights_t w = {.dtype = LRMOE_F32, .w_gate = wg, .w_up = wu, .w_down = wd};
    lrmoe_exec_plan_t pl = {placement, fwd_alloc};
    lrmoe_exec_fwd_t f = {.act_dtype = LRMOE_F32, .hidden = x, .topk_ids = ids,
                          .topk_weights = alpha, .output = r->out, .pair_rank = r->prs,
                          .phi_sqnorm = r->phi, .saved_gate = r->sg, .saved_up = r->su,
                          .pair_out = r->po};
    if (lrmoe_exec_forward(&cfg, &d, &w, &pl, &f, NULL) < 0) return -1;
    lrmoe_pack_in_t in = {T, K, E, P, ids, keep, pr, placement, NULL, NULL};
    lrmoe_pack_plan_t pp;
    if (lrmoe_pack_assign(&in, &pp) < 0) return -1;
    lrmoe_exec_bwd_t b = {.mode = LRMOE_MODE_COMPACT, .act_dtype = LRMOE_F32,
                          .grad_dtype = LRMOE_F32, .topk_ids = ids, .topk_weights = alpha,
                          .grad_output = g, .pair_out = r->po, .hidden = x, .pair_rank = pr,
                          .saved_gate = r->sg, .saved_up = r->su, .R = pp.R,
                          .pack_pair = pp.pair, .pack_rank = pp.rank,
                          .pack_counts = pp.counts, .pack_offsets = pp.offsets,
                          .grad_hidden = r->gh, .grad_w_gate = r->gwg, .grad_w_up = r->gwu,
                          .grad_w_down = r->gwd, .grad_topk_weights = r->gtw};
    int rc = lrmoe_exec_backward(&cfg, &d, &w, &pl, &b, NULL);
    lrmoe_pack_plan_free(&pp);
    return rc;
}

static result_t all, mine[P];
static int rcs[P];
static int64_t sent[P][2];

static void *rank_main(void *arg)
{
    const int r = (int)(intptr_t)arg;
    struct lrmoe_comm *c = lrmoe_comm_callback_new(P, r, a2a, p2p, arg);
    rcs[r] = c ? step(c, &mine[r]) : -1;
    if (rcs[r] < 0) fprintf(stderr, "rank %d: %s\n", r, lrmoe_errmsg());
    if (c) lrmoe_comm_callback_sent(c, &sent[r][0], &sent[r][1]);
    lrmoe_comm_callback_free(c);
    return NULL;
}

static float rnd(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xffff) / 65536.0f - 0.5f;
}

/* n floats of a and b at [off, off+n) equal bit for bit; else print what */
static int same(const char *what, int r, const float *a, const float *b, size_t off, size_t n)
{
    if (!memcmp(a + off, b + off, n * sizeof *a)) return 1;
    printf("rank %d: %s differs\n", r, what);
    return 0;
}

int main(void)
{
    unsigned s = 11;
    for (size_t i = 0; i < sizeof x / 4; i++) x[i] = rnd(&s);
    for (size_t i = 0; i < sizeof wg / 4; i++) wg[i] = rnd(&s), wu[i] = rnd(&s), wd[i] = rnd(&s);
    for (size_t i = 0; i < sizeof g / 4; i++) g[i] = rnd(&s);
    int64_t load[E] = {0};
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int u = t * K + k;
            /* skewed: expert 0 is hot, and the two experts of a token differ */
            ids[u] = k == 0 ? (rnd(&s) < 0.2f ? 0 : (int32_t)(t % E)) : (int32_t)((t + 1 + k) % E);
            if (k && ids[u] == ids[u - 1]) ids[u] = (ids[u] + 1) % E;
            alpha[u] = 0.5f + rnd(&s);
            keep[u] = (uint8_t)((u * 7) % 5 != 0);
            load[ids[u]]++;
        }
    /* every expert on its native rank; expert 0 (native rank 0) also on rank 2 */
    for (int e = 0; e < E; e++) {
        int n = lrmoe_exec_native(e, E, P);
        placement[e * P + n] = 1;
        fwd_alloc[e * P + n] = load[e];
    }
    placement[0 * P + 2] = 1;
    fwd_alloc[0 * P + 2] = load[0] / 2;
    fwd_alloc[0 * P + 0] = load[0] - load[0] / 2;
    if (lrmoe_exec_assign(T, K, E, P, ids, fwd_alloc, placement, pr) < 0) {
        fprintf(stderr, "assign: %s\n", lrmoe_errmsg());
        return 1;
    }
    /* the single controller: one call computes every rank */
    struct lrmoe_comm *none = NULL;
    if (step(none, &all) < 0) {
        fprintf(stderr, "single controller: %s\n", lrmoe_errmsg());
        return 1;
    }
    pthread_barrier_init(&bar, NULL, P);
    for (int a = 0; a < P; a++)
        for (int b = 0; b < P; b++) {
            pthread_mutex_init(&box[a][b].mu, NULL);
            pthread_cond_init(&box[a][b].cv, NULL);
        }
    pthread_t th[P];
    for (int r = 0; r < P; r++) pthread_create(&th[r], NULL, rank_main, (void *)(intptr_t)r);
    for (int r = 0; r < P; r++) pthread_join(th[r], NULL);
    int ok = 1;
    for (int r = 0; r < P; r++) {
        if (rcs[r] < 0) return 1;
        const size_t t0 = (size_t)r * T / P, t1 = (size_t)(r + 1) * T / P;
        ok &= same("output", r, all.out, mine[r].out, t0 * D, (t1 - t0) * D);
        ok &= same("grad_hidden", r, all.gh, mine[r].gh, t0 * D, (t1 - t0) * D);
        ok &= same("grad_topk_weights", r, all.gtw, mine[r].gtw, t0 * K, (t1 - t0) * K);
        for (int u = 0; u < T * K; u++)
            if (pr[u] == r) ok &= same("phi_sqnorm", r, all.phi, mine[r].phi, (size_t)u, 1);
        for (int e = 0; e < E; e++) {
            if (lrmoe_exec_native(e, E, P) != r) continue;
            ok &= same("grad_w_gate", r, all.gwg, mine[r].gwg, (size_t)e * F * D, F * D);
            ok &= same("grad_w_up", r, all.gwu, mine[r].gwu, (size_t)e * F * D, F * D);
            ok &= same("grad_w_down", r, all.gwd, mine[r].gwd, (size_t)e * D * F, D * F);
        }
        printf("rank %d sent %lld a2a bytes, %lld p2p bytes\n", r, (long long)sent[r][0],
               (long long)sent[r][1]);
    }
    if (ok) printf("same bits\n");
    return !ok;
}
