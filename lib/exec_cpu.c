/* lrmoe-exec, CPU backend: P expert-parallel ranks simulated in one process.
 *
 * Ranks run one after another (each timed on its own, as if it were alone on
 * its device); BLAS threads come from cfg->threads. Data crosses ranks only
 * through lib/comm.h (all-to-all-v for token rows, p2p for weights and weight
 * gradients), in the deterministic order a real EP step uses:
 *
 *   rows ("layout"): every row i belongs to a destination rank d (rows of d
 *   are [base[d], base[d+1])), ordered expert-major, pair u ascending inside
 *   an expert segment. Its source is the rank owning token u/K.
 *   send buffer of source s: destinations ascending, rows in layout order.
 *   receive buffer of d: sources ascending (that is what an all-to-all-v
 *   delivers), then permuted into layout order (expert-major) for the GEMMs.
 *   The reverse all-to-all mirrors it: d sends in its receive layout and s
 *   receives in its send layout.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "alloc.h"
#include "blas.h"
#include "comm.h"
#include "exec.h"
#include "exec_backend.h"
#include "gemm_cpu.h"
#include "swiglu.h"
#include "clock.h"

/* The stage clock: monotonic wall time, or the calling thread's CPU time
 * (cfg->cpu_clock). Set at the start of each call; one clock per process. */
static int g_cpu_clock;

static double thread_cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double now_(void)
{
    return g_cpu_clock ? thread_cpu_now() : lrmoe_now();
}

#define TIM(r, s) (tim[(size_t)(r) * LRMOE_NSTAGES + (s)])

typedef struct {
    int P;
    int64_t T, K, E;
    int64_t M;            /* rows */
    const int64_t *u;     /* (M) pair of each row */
    const int64_t *cnt;   /* (P,E) rows of expert e on rank d */
    const int64_t *seg;   /* (P,E) first row of segment (d,e) */
    int64_t *base;        /* (P+1) first row of rank d */
    int32_t *owner;       /* (M) token owner of each row */
    int64_t *counts;      /* (P,P) rows from source s to destination d, s-major */
    int64_t *sdispls, *rdispls; /* (P,P) */
    int64_t *sbase;       /* (P+1) first row of source s's send region */
    int64_t *xcounts;     /* (P,P) counts without the diagonal: what crosses ranks when
                             they all live in this process (a rank's rows for itself
                             go straight to their place: self_skip) */
    uint8_t *inorder;     /* (P) 1: rank d's rows arrive in layout order (their owners
                             ascend along the layout, as with P=1) */
    int64_t *ubuf, *cbuf, *sbuf; /* owned storage for u/cnt/seg when built here */
} layout_t;

static void layout_free(layout_t *L)
{
    free(L->base); free(L->owner); free(L->counts); free(L->sdispls);
    free(L->rdispls); free(L->sbase); free(L->ubuf); free(L->cbuf); free(L->sbuf);
    free(L->xcounts); free(L->inorder);
    memset(L, 0, sizeof *L);
}

/* Source-side bookkeeping shared by both constructors. */
static int layout_finish(layout_t *L)
{
    int P = L->P;
    L->base = malloc((size_t)(P + 1) * sizeof *L->base);
    L->owner = malloc((size_t)(L->M ? L->M : 1) * sizeof *L->owner);
    L->counts = calloc((size_t)P * P, sizeof *L->counts);
    L->sdispls = malloc((size_t)P * P * sizeof *L->sdispls);
    L->rdispls = malloc((size_t)P * P * sizeof *L->rdispls);
    L->sbase = malloc((size_t)(P + 1) * sizeof *L->sbase);
    L->xcounts = malloc((size_t)P * P * sizeof *L->xcounts);
    L->inorder = malloc((size_t)P);
    if (!L->base || !L->owner || !L->counts || !L->sdispls || !L->rdispls || !L->sbase ||
        !L->xcounts || !L->inorder)
        return lrmoe_err("exec: out of memory");
    int64_t acc = 0;
    for (int d = 0; d < P; d++) {
        L->base[d] = acc;
        for (int64_t e = 0; e < L->E; e++) acc += L->cnt[d * L->E + e];
    }
    L->base[P] = acc;
    for (int d = 0; d < P; d++) {
        L->inorder[d] = 1;
        for (int64_t i = L->base[d]; i < L->base[d + 1]; i++) {
            int s = lrmoe_exec_token_owner(L->u[i] / L->K, L->T, P);
            L->owner[i] = s;
            L->counts[(size_t)s * P + d]++;
            if (i > L->base[d] && s < L->owner[i - 1]) L->inorder[d] = 0;
        }
    }
    lrmoe_comm_displs(P, L->counts, L->sdispls, L->rdispls);
    for (int s = 0; s < P; s++)
        for (int d = 0; d < P; d++)
            L->xcounts[(size_t)s * P + d] = s == d ? 0 : L->counts[(size_t)s * P + d];
    acc = 0;
    for (int s = 0; s < P; s++) {
        L->sbase[s] = acc;
        for (int d = 0; d < P; d++) acc += L->counts[(size_t)s * P + d];
    }
    L->sbase[P] = acc;
    return 0;
}

/* Layout of all T*K pairs on their ranks pair_rank (forward, full, masked). */
static int layout_pairs(layout_t *L, int P, int64_t T, int64_t K, int64_t E,
                        const int32_t *topk, const int32_t *pair_rank)
{
    memset(L, 0, sizeof *L);
    L->P = P; L->T = T; L->K = K; L->E = E; L->M = T * K;
    L->ubuf = malloc((size_t)(L->M ? L->M : 1) * sizeof *L->ubuf);
    L->cbuf = calloc((size_t)P * E, sizeof *L->cbuf);
    L->sbuf = malloc((size_t)P * E * sizeof *L->sbuf);
    if (!L->ubuf || !L->cbuf || !L->sbuf) return lrmoe_err("exec: out of memory");
    for (int64_t u = 0; u < L->M; u++) {
        if (pair_rank[u] < 0 || pair_rank[u] >= P)
            return lrmoe_err("pair_rank[%lld,%lld]: rank %d out of range [0,%d)",
                             (long long)(u / K), (long long)(u % K), pair_rank[u], P);
        L->cbuf[(int64_t)pair_rank[u] * E + topk[u]]++;
    }
    int64_t acc = 0;
    for (int64_t j = 0; j < P * E; j++) { L->sbuf[j] = acc; acc += L->cbuf[j]; }
    int64_t *fill = malloc((size_t)P * E * sizeof *fill);
    if (!fill) return lrmoe_err("exec: out of memory");
    memcpy(fill, L->sbuf, (size_t)P * E * sizeof *fill);
    for (int64_t u = 0; u < L->M; u++)
        L->ubuf[fill[(int64_t)pair_rank[u] * E + topk[u]]++] = u;
    free(fill);
    L->u = L->ubuf; L->cnt = L->cbuf; L->seg = L->sbuf;
    return layout_finish(L);
}

/* Layout of the packed rows of lrmoe-pack (compact), validated. */
static int layout_packed(layout_t *L, int P, int64_t T, int64_t K, int64_t E,
                         const int32_t *topk, const lrmoe_exec_bwd_t *a,
                         const uint8_t *placement)
{
    memset(L, 0, sizeof *L);
    L->P = P; L->T = T; L->K = K; L->E = E; L->M = a->R;
    if (lrmoe_exec_check_pack_layout(P, T, K, E, topk, a, placement) < 0) return -1;
    L->u = a->pack_pair; L->cnt = a->pack_counts; L->seg = a->pack_offsets;
    return layout_finish(L);
}

/* Fault in (zero) the exchange buffers before the timed stages: by_src
 * holds rows by source rank (the forward exchange's send, the reverse's
 * receive), by_dst and rows by destination (layout order), row_bytes and
 * rows_bytes each. All M rows when every rank lives in this process; with
 * one rank per process only that rank's, so the rest is never touched. */
static void touch_rows(const lrmoe_comm_t *c, const layout_t *L, char *by_src, char *by_dst,
                       size_t row_bytes, char *rows, size_t rows_bytes)
{
    int64_t s0 = 0, s1 = L->M, d0 = 0, d1 = L->M;
    if (c->self) {
        int r = c->self - 1;
        s0 = L->sbase[r]; s1 = L->sbase[r + 1];
        d0 = L->base[r]; d1 = L->base[r + 1];
    }
    memset(by_src + (size_t)s0 * row_bytes, 0, (size_t)(s1 - s0) * row_bytes);
    memset(by_dst + (size_t)d0 * row_bytes, 0, (size_t)(d1 - d0) * row_bytes);
    memset(rows + (size_t)d0 * rows_bytes, 0, (size_t)(d1 - d0) * rows_bytes);
}

/* 1 when a rank's rows for itself skip the all-to-all: all ranks in this
 * process (the CPU communicator), not one rank per MPI process */
static int self_skip(const lrmoe_comm_t *c) { return !c->self; }

/* 1 when the exchanges need no buffer but the receive one: every rank in
 * this process (self_skip), no rank sends a row to another, every rank's rows
 * arrive in layout order and the rows keep their dtype (same_dt), as at P=1.
 * Then exchange_fwd's fill writes every row into recv and nothing else is
 * written (no send, no permutation into out), and exchange_rev reads the
 * rows in place; so only recv (and the GEMM outputs) need faulting in. */
static int lean_rows(const lrmoe_comm_t *c, const layout_t *L, int same_dt)
{
    if (!self_skip(c) || !same_dt) return 0;
    for (int d = 0; d < L->P; d++) {
        if (!L->inorder[d]) return 0;
        for (int s = 0; s < L->P; s++)
            if (s != d && L->counts[(size_t)s * L->P + d]) return 0;
    }
    return 1;
}

/* n bytes aligned to 64 (free() releases them), NULL when out of memory */
static void *alloc64(size_t n)
{
    void *p = NULL;
    return posix_memalign(&p, 64, n) ? NULL : p;
}

/* Rows of the forward direction (token owner s -> destination d).
 * fill(ctx, i, dst) writes row i (row_bytes) for source rank owner[i].
 * After the all-to-all, rank d's rows go into out (M,width) in layout order,
 * as F32 (odt F32) or as sent (odt == dt). send/recv are scratch of
 * M*row_bytes each; out may be send (free once the all-to-all returns).
 * With every rank in this process (self_skip), a rank's rows for itself do
 * not cross the all-to-all: fill writes them where it would have put them
 * (under MPI they go through MPI_Alltoallv, which counts them in a2a_bytes).
 * *rows = out, or recv itself when no rank needs the permutation (odt == dt
 * and every local rank inorder, as with P=1): then out is not written, and
 * with P=1 the rows are copied once, by fill. */
typedef void (*fill_fn)(void *ctx, int64_t i, void *dst);

static int exchange_fwd(lrmoe_comm_t *c, const layout_t *L, size_t row_bytes,
                        lrmoe_dtype_t dt, int64_t width, fill_fn fill, void *ctx,
                        char *send, char *recv, void *out, lrmoe_dtype_t odt, double *tim,
                        void **rows)
{
    int P = L->P;
    int64_t *pos = malloc((size_t)P * sizeof *pos);
    const void **sp = calloc((size_t)P, sizeof *sp);
    void **rp = calloc((size_t)P, sizeof *rp);
    double *sec = calloc((size_t)P, sizeof *sec);
    if (!pos || !sp || !rp || !sec) {
        free(pos); free(sp); free(rp); free(sec);
        return lrmoe_err("exec: out of memory");
    }
    int direct = odt == dt, skip = self_skip(c);
    for (int d = 0; d < P; d++) {
        rp[d] = recv + (size_t)L->base[d] * row_bytes;
        if (lrmoe_comm_local(c, d)) direct &= L->inorder[d];
    }
    for (int s = 0; s < P; s++) {
        if (!lrmoe_comm_local(c, s)) continue;
        double t0 = now_();
        char *sb = send + (size_t)L->sbase[s] * row_bytes;
        for (int d = 0; d < P; d++) {
            int64_t k = L->sdispls[(size_t)s * P + d];
            char *dst = sb;
            if (!L->counts[(size_t)s * P + d]) continue;
            if (skip && d == s) { dst = rp[d]; k = L->rdispls[(size_t)d * P + s]; }
            for (int64_t i = L->base[d]; i < L->base[d + 1]; i++)
                if (L->owner[i] == s) fill(ctx, i, dst + (size_t)(k++) * row_bytes);
        }
        sp[s] = sb;
        TIM(s, LRMOE_STAGE_DISPATCH) += now_() - t0;
    }
    int rc = c->alltoallv(c, row_bytes, (const void *const *)sp,
                          skip ? L->xcounts : L->counts, L->sdispls, (void *const *)rp,
                          L->rdispls, sec);
    *rows = direct ? (void *)recv : out;
    for (int d = 0; d < P && !rc; d++) {
        if (!lrmoe_comm_local(c, d)) continue;
        if (direct) { TIM(d, LRMOE_STAGE_DISPATCH) += sec[d]; continue; }
        double t0 = now_();
        for (int s = 0; s < P; s++) pos[s] = L->rdispls[(size_t)d * P + s];
        for (int64_t i = L->base[d]; i < L->base[d + 1]; i++) {
            const char *src = (const char *)rp[d] + (size_t)(pos[L->owner[i]]++) * row_bytes;
            if (odt == dt) memcpy((char *)out + (size_t)i * row_bytes, src, row_bytes);
            else lrmoe_convert_to_f32(dt, src, (float *)out + i * width, (size_t)width);
        }
        TIM(d, LRMOE_STAGE_DISPATCH) += now_() - t0 + sec[d];
    }
    free(pos); free(sp); free(rp); free(sec);
    return rc;
}

/* Reverse direction: rank d sends rows in (M,width) `in` (layout order; F32,
 * or already dt when idt == dt) stored as dt back to their token owners. On
 * return, urow[u] (T*K, NULL when the pair has no row) is pair u's row (dt):
 * inside `recv` (M rows), or, for a rank's rows for itself when they do not
 * cross the all-to-all (self_skip), the row of `in` itself (idt == dt) or its
 * conversion, written straight into recv. */
static int exchange_rev(lrmoe_comm_t *c, const layout_t *L, lrmoe_dtype_t dt,
                        int64_t width, const void *in, lrmoe_dtype_t idt, char *send,
                        char *recv, const char **urow, double *tim)
{
    int P = L->P;
    size_t row_bytes = (size_t)width * lrmoe_dtype_size(dt);
    size_t in_bytes = idt == dt ? row_bytes : (size_t)width * sizeof(float);
    int64_t *pos = malloc((size_t)P * sizeof *pos);
    int64_t *cnt2 = malloc((size_t)P * P * sizeof *cnt2);
    int64_t *sd2 = malloc((size_t)P * P * sizeof *sd2);
    int64_t *rd2 = malloc((size_t)P * P * sizeof *rd2);
    const void **sp = calloc((size_t)P, sizeof *sp);
    void **rp = calloc((size_t)P, sizeof *rp);
    double *sec = calloc((size_t)P, sizeof *sec);
    int rc = 0, skip = self_skip(c);
    const int64_t *cnts = skip ? L->xcounts : L->counts;
    if (!pos || !cnt2 || !sd2 || !rd2 || !sp || !rp || !sec) {
        rc = lrmoe_err("exec: out of memory");
        goto out;
    }
    for (int s = 0; s < P; s++)
        for (int d = 0; d < P; d++) {
            cnt2[(size_t)d * P + s] = cnts[(size_t)s * P + d];
            sd2[(size_t)d * P + s] = L->rdispls[(size_t)d * P + s];
            rd2[(size_t)s * P + d] = L->sdispls[(size_t)s * P + d];
        }
    for (int64_t u = 0; u < L->T * L->K; u++) urow[u] = NULL;
    for (int s = 0; s < P; s++) rp[s] = recv + (size_t)L->sbase[s] * row_bytes;
    for (int d = 0; d < P; d++) {
        if (!lrmoe_comm_local(c, d)) continue;
        double t0 = now_();
        char *sb = send + (size_t)L->base[d] * row_bytes;
        char *own = (char *)rp[d] + (size_t)L->sdispls[(size_t)d * P + d] * row_bytes;
        for (int s = 0; s < P; s++) pos[s] = L->rdispls[(size_t)d * P + s];
        for (int64_t i = L->base[d]; i < L->base[d + 1]; i++) {
            const char *src = (const char *)in + (size_t)i * in_bytes;
            char *dst;
            if (skip && L->owner[i] == d && idt == dt) { urow[L->u[i]] = src; continue; }
            if (skip && L->owner[i] == d) { dst = own; own += row_bytes; urow[L->u[i]] = dst; }
            else dst = sb + (size_t)(pos[L->owner[i]]++) * row_bytes;
            if (idt == dt) memcpy(dst, src, row_bytes);
            else lrmoe_convert_from_f32(dt, (const float *)src, dst, (size_t)width);
        }
        sp[d] = sb;
        TIM(d, LRMOE_STAGE_COMBINE) += now_() - t0;
    }
    rc = c->alltoallv(c, row_bytes, (const void *const *)sp, cnt2, sd2,
                      (void *const *)rp, rd2, sec);
    for (int s = 0; s < P && !rc; s++) {
        if (!lrmoe_comm_local(c, s)) continue;
        double t0 = now_();
        for (int d = 0; d < P; d++) {
            const char *k = (const char *)rp[s] + (size_t)L->sdispls[(size_t)s * P + d] * row_bytes;
            if ((skip && d == s) || !L->counts[(size_t)s * P + d]) continue;
            for (int64_t i = L->base[d]; i < L->base[d + 1]; i++)
                if (L->owner[i] == s) { urow[L->u[i]] = k; k += row_bytes; }
        }
        TIM(s, LRMOE_STAGE_COMBINE) += now_() - t0 + sec[s];
    }
out:
    free(pos); free(cnt2); free(sd2); free(rd2); free(sp); free(rp); free(sec);
    return rc;
}

/* ---------------------------------------------------------------- weights */

/* Expert weights of one instance. f32 compute: in F32, the caller's F32
 * weights (or F32 copies) for native experts, the replica buffer (converted
 * to F32 when it arrives) for replicas/helpers, else converted into the
 * scratch. bf16 compute (raw): in their stored dtype, never copied for
 * native experts; a replica stays as it arrived. */
typedef struct {
    char **rep;            /* (E) replica (3 matrices: F32, or stored dtype when raw) */
    float *scratch;        /* 3*F*D */
    char *stage;           /* 3 matrices in storage dtype: p2p landing buffer */
    int raw;               /* bf16 compute: weights in their stored dtype */
} wcache_t;

/* One instance's three matrices and their dtype. */
typedef struct {
    const void *g, *u, *d;
    lrmoe_dtype_t dt;
} ew_t;

static size_t wmat_bytes(const lrmoe_exec_dims_t *d, const lrmoe_exec_weights_t *w)
{
    return (size_t)(d->F * d->D) * lrmoe_dtype_size(w->dtype);
}

/* Matrix k (0 gate, 1 up, 2 down) of expert e in the storage dtype. F32
 * storage with the packed copy given: the packed copy's block (the same
 * values), so w_gate/w_up/w_down are never read and may be NULL (exec.h). */
static const char *wmat(const lrmoe_exec_dims_t *d, const lrmoe_exec_weights_t *w, int64_t e,
                        int k)
{
    size_t mb = wmat_bytes(d, w);
    if (w->dtype == LRMOE_F32 && w->w_f32)
        return (const char *)(w->w_f32 + (size_t)e * 3 * (size_t)(d->F * d->D)) + k * mb;
    return (const char *)(k == 0 ? w->w_gate : k == 1 ? w->w_up : w->w_down) + e * mb;
}

/* Bring the replica/helper weights of rank r in by p2p (stage weights).
 * With one rank per process (c->self) every process walks the instances
 * (q, e) of all ranks in the same order, sending the experts it owns to the
 * ranks that need them and receiving its own, so sends and receives pair up. */
static int fetch_replicas(lrmoe_comm_t *c, const lrmoe_exec_dims_t *d,
                          const lrmoe_exec_weights_t *w, const uint8_t *placement,
                          const int64_t *cnt, int r, wcache_t *wc, double *tim)
{
    double t0 = now_();
    size_t mb = wmat_bytes(d, w);
    for (int q = c->self ? 0 : r; q < (c->self ? d->P : r + 1); q++)
    for (int64_t e = 0; e < d->E; e++) {
        int nat = lrmoe_exec_native(e, d->E, d->P);
        int need = nat != q && (cnt[q * d->E + e] > 0 || (placement && placement[e * d->P + q]));
        if (!need) continue;
        if (q != r) { /* another process's instance: send it when r owns e */
            if (nat == r &&
                (c->p2p(c, r, wmat(d, w, e, 0), q, NULL, mb) < 0 ||
                 c->p2p(c, r, wmat(d, w, e, 1), q, NULL, mb) < 0 ||
                 c->p2p(c, r, wmat(d, w, e, 2), q, NULL, mb) < 0))
                return -1;
            continue;
        }
        size_t n = (size_t)(d->F * d->D);
        char *rep = malloc(wc->raw ? 3 * mb : 3 * n * sizeof(float));
        if (!rep) return lrmoe_err("exec: out of memory (replica of expert %lld)", (long long)e);
        wc->rep[e] = rep;
        /* F32 storage (or raw) lands directly in the replica; BF16 in the staging buffer */
        char *buf = w->dtype == LRMOE_F32 || wc->raw ? rep : wc->stage;
        if (c->p2p(c, nat, wmat(d, w, e, 0), r, buf, mb) < 0 ||
            c->p2p(c, nat, wmat(d, w, e, 1), r, buf + mb, mb) < 0 ||
            c->p2p(c, nat, wmat(d, w, e, 2), r, buf + 2 * mb, mb) < 0)
            return -1;
        if (w->dtype != LRMOE_F32 && !wc->raw) lrmoe_convert_to_f32(w->dtype, buf, (float *)rep, 3 * n);
    }
    TIM(r, LRMOE_STAGE_WEIGHTS) += now_() - t0;
    return 0;
}

static void drop_replicas(int64_t E, wcache_t *wc)
{
    for (int64_t e = 0; e < E; e++) { free(wc->rep[e]); wc->rep[e] = NULL; }
}

/* Expert e's three matrices on the current rank (F32 views, or the stored
 * dtype when raw). */
static void expert_w(const lrmoe_exec_dims_t *d, const lrmoe_exec_weights_t *w,
                     wcache_t *wc, int64_t e, ew_t *o)
{
    size_t mb = wmat_bytes(d, w), n = (size_t)(d->F * d->D);
    if (wc->raw) {
        const char *b = wc->rep[e];
        o->dt = w->dtype;
        if (b) { o->g = b; o->u = b + mb; o->d = b + 2 * mb; return; }
        o->g = wmat(d, w, e, 0); o->u = wmat(d, w, e, 1); o->d = wmat(d, w, e, 2);
        return;
    }
    o->dt = LRMOE_F32;
    if (wc->rep[e]) {
        const float *b = (const float *)wc->rep[e];
        o->g = b; o->u = b + n; o->d = b + 2 * n;
        return;
    }
    if (w->w_f32) { /* packed [gate; up; down] per expert */
        const float *b = w->w_f32 + e * 3 * n;
        o->g = b; o->u = b + n; o->d = b + 2 * n;
        return;
    }
    if (w->dtype == LRMOE_F32) {
        o->g = (const float *)w->w_gate + e * n; o->u = (const float *)w->w_up + e * n;
        o->d = (const float *)w->w_down + e * n;
        return;
    }
    if (w->w_gate_f32 && w->w_up_f32 && w->w_down_f32) {
        o->g = w->w_gate_f32 + e * n; o->u = w->w_up_f32 + e * n; o->d = w->w_down_f32 + e * n;
        return;
    }
    const char *g = (const char *)w->w_gate + e * mb, *u = (const char *)w->w_up + e * mb,
               *dn = (const char *)w->w_down + e * mb;
    lrmoe_convert_to_f32(w->dtype, g, wc->scratch, n);
    lrmoe_convert_to_f32(w->dtype, u, wc->scratch + n, n);
    lrmoe_convert_to_f32(w->dtype, dn, wc->scratch + 2 * n, n);
    o->g = wc->scratch; o->u = wc->scratch + n; o->d = wc->scratch + 2 * n;
}

/* ---------------------------------------------------------------- checks */

static int check_common(const lrmoe_exec_dims_t *d, const lrmoe_exec_weights_t *w)
{
    if (d->P < 1) return lrmoe_err("ranks must be >= 1 (got %d)", d->P);
    if (d->T < 0 || d->E < 1 || d->K < 1 || d->D < 1 || d->F < 1)
        return lrmoe_err("bad dimensions T=%lld E=%lld K=%lld D=%lld F=%lld",
                         (long long)d->T, (long long)d->E, (long long)d->K,
                         (long long)d->D, (long long)d->F);
    if (d->K > d->E) return lrmoe_err("K=%lld exceeds E=%lld", (long long)d->K, (long long)d->E);
    if (d->P > d->E)
        return lrmoe_err("%d ranks for %lld experts: every rank needs a native expert",
                         d->P, (long long)d->E);
    if (w->dtype != LRMOE_F32 && w->dtype != LRMOE_BF16)
        return lrmoe_err("weights: dtype %s not supported (BF16 or F32)",
                         lrmoe_dtype_name(w->dtype));
    if ((!w->w_gate || !w->w_up || !w->w_down) && !(w->dtype == LRMOE_F32 && w->w_f32))
        return lrmoe_err("weights: missing matrices (w_gate, w_up, w_down: NULL only with F32 "
                         "weights and w_f32)");
    return 0;
}

static int act_ok(lrmoe_dtype_t dt, const char *what)
{
    if (dt != LRMOE_F32 && dt != LRMOE_BF16)
        return lrmoe_err("%s: dtype %s not supported (BF16 or F32)", what, lrmoe_dtype_name(dt));
    return 0;
}

/* BLAS threads per rank: all of cfg->threads when ranks run one at a time,
 * else cfg->threads split over the concurrent ranks (at least 1); 0 leaves
 * the library default. */
static int rank_blas_threads(const lrmoe_exec_cfg_t *cfg)
{
    if (cfg->rank_threads > 1) {
        int t = cfg->threads > 0 ? cfg->threads / cfg->rank_threads : 1;
        return t > 0 ? t : 1;
    }
    return cfg->threads > 0 ? cfg->threads : 0;
}

static void blas_threads(const lrmoe_exec_cfg_t *cfg)
{
    g_cpu_clock = cfg->cpu_clock;
    int t = rank_blas_threads(cfg);
    if (t > 0) lrmoe_blas_threads(t);
}

/* ---------------------------------------------------------------- rank pool */

/* What one rank's expert phase needs; shared by the workers (each rank only
 * writes its own rows of tim, its own pairs' outputs and its own gradients). */
typedef struct {
    const lrmoe_exec_dims_t *d;
    const lrmoe_exec_weights_t *w;
    const uint8_t *placement;
    lrmoe_comm_t *comm;
    const layout_t *L;
    double *tim;
    int64_t maxn;
    lrmoe_compute_t compute;  /* resolved: f32 or bf16 (gemm_cpu.h) */
    int gthreads;             /* GEMM threads of each rank (0: library default) */
    lrmoe_exec_fwd_t *fa;     /* forward */
    float *X;                 /* forward: (M,D) x rows, y written over them */
    const char *Xb;           /* forward, or NULL: the x rows in BF16; then X gets the y
                                 rows in BF16 (rounded as the reverse exchange would) */
    lrmoe_exec_bwd_t *ba;     /* backward */
    float *DY;                /* backward: (M,D) dy rows, dx written over them */
    float **rgrad;            /* backward: (P*E) helper weight gradients */
    /* pool state */
    pthread_mutex_t mu;
    int next, failed;
    char err[1024];
} job_t;

/* Per-worker scratch. */
typedef struct {
    wcache_t wc;
    float *Xs;                /* (maxn,D) */
    float *s[6];              /* (maxn,F) each, consecutive in one block (s[0]):
                                 s[i] and s[i+1] together form an (maxn,2F) buffer */
    float *sq;                /* (maxn) */
    lrmoe_gemm_t *gm;         /* this worker's GEMM context */
    void *ob[4];              /* bf16 compute: operands converted once, in one
                                 block: (maxn,D), (maxn,2F), (maxn,D), (maxn,F) */
    const uint16_t **rows;    /* backward, bf16 compute: 2 maxn saved-state rows */
} worker_t;

/* n F32 values as the GEMM's operand dtype: src itself (f32 compute) or
 * converted once into the worker's BF16 slot i (bf16 compute). */
static const void *opnd(worker_t *k, int i, const float *src, int64_t n)
{
    if (lrmoe_gemm_dtype(k->gm) == LRMOE_F32) return src;
    lrmoe_gemm_to_bf16(src, k->ob[i], (size_t)n);
    return k->ob[i];
}

static void worker_free(worker_t *k, int64_t E)
{
    if (k->wc.rep) drop_replicas(E, &k->wc);
    free(k->wc.rep); free(k->wc.scratch); free(k->wc.stage);
    free(k->Xs); free(k->sq);
    free(k->s[0]);
    free(k->ob[0]);
    free(k->rows);
    lrmoe_gemm_free(k->gm);
    memset(k, 0, sizeof *k);
}

static int worker_init(worker_t *k, const job_t *J)
{
    const lrmoe_exec_dims_t *d = J->d;
    memset(k, 0, sizeof *k);
    size_t nf = (size_t)(J->maxn * d->F) * sizeof(float);
    int ok = 1;
    ok &= (k->s[0] = malloc(6 * nf)) != NULL;
    for (int i = 1; i < 6 && ok; i++) k->s[i] = k->s[0] + (size_t)i * (size_t)(J->maxn * d->F);
    k->Xs = J->ba ? malloc((size_t)(J->maxn * d->D) * sizeof(float)) : NULL;
    k->sq = malloc((size_t)J->maxn * sizeof(float));
    k->wc.rep = calloc((size_t)d->E, sizeof *k->wc.rep);
    k->wc.raw = J->compute == LRMOE_COMPUTE_BF16;
    if (k->wc.raw) {
        size_t m = (size_t)J->maxn;
        ok &= (k->ob[0] = malloc(m * (size_t)(2 * d->D + 3 * d->F) * 2)) != NULL;
        if (ok) {
            k->ob[1] = (char *)k->ob[0] + m * (size_t)d->D * 2;
            k->ob[2] = (char *)k->ob[1] + m * (size_t)(2 * d->F) * 2;
            k->ob[3] = (char *)k->ob[2] + m * (size_t)d->D * 2;
        }
        if (J->ba) ok &= (k->rows = malloc(2 * m * sizeof *k->rows)) != NULL;
    } else if (J->w->dtype != LRMOE_F32) {
        k->wc.scratch = malloc((size_t)(3 * d->F * d->D) * sizeof(float));
        k->wc.stage = malloc(3 * wmat_bytes(d, J->w));
        ok &= k->wc.scratch && k->wc.stage;
    }
    if (ok && !(k->gm = lrmoe_gemm_new(J->compute, J->gthreads))) {
        worker_free(k, d->E);
        return -1;
    }
    if (!ok || (J->ba && !k->Xs) || !k->sq || !k->wc.rep) {
        worker_free(k, d->E);
        return lrmoe_err("exec: out of memory (rank scratch: %lld rows, D=%lld, F=%lld)",
                         (long long)J->maxn, (long long)d->D, (long long)d->F);
    }
    /* touch the scratch now so page faults do not land in the timed stages */
    memset(k->s[0], 0, 6 * nf);
    if (k->Xs) memset(k->Xs, 0, (size_t)(J->maxn * d->D) * sizeof(float));
    if (k->ob[0]) memset(k->ob[0], 0, (size_t)J->maxn * (size_t)(2 * d->D + 3 * d->F) * 2);
    return 0;
}

typedef int (*rank_fn)(job_t *J, worker_t *k, int r);

typedef struct { job_t *J; rank_fn fn; } pool_arg_t;

static void *pool_main(void *vp)
{
    pool_arg_t *pa = vp;
    job_t *J = pa->J;
    worker_t k;
    int rc = worker_init(&k, J);
    for (;;) {
        pthread_mutex_lock(&J->mu);
        if (rc < 0 && !J->failed) {
            J->failed = 1;
            snprintf(J->err, sizeof J->err, "%s", lrmoe_errmsg());
        }
        int r = J->failed ? J->d->P : J->next++;
        pthread_mutex_unlock(&J->mu);
        if (r >= J->d->P) break;
        rc = pa->fn(J, &k, r);
        drop_replicas(J->d->E, &k.wc);
    }
    if (k.s[0]) worker_free(&k, J->d->E);
    return NULL;
}

/* Run fn for every rank: one at a time (nthreads <= 1) or on nthreads
 * workers taking ranks in ascending order; with one rank per process, for
 * this process's rank only. */
static int run_ranks(job_t *J, rank_fn fn, int nthreads)
{
    int P = J->d->P;
    if (nthreads > P || J->comm->self) nthreads = J->comm->self ? 1 : P;
    if (nthreads <= 1) {
        worker_t k;
        if (worker_init(&k, J) < 0) return -1;
        int rc = 0;
        for (int r = 0; r < P && !rc; r++) {
            if (!lrmoe_comm_local(J->comm, r)) continue;
            rc = fn(J, &k, r);
            drop_replicas(J->d->E, &k.wc);
        }
        worker_free(&k, J->d->E);
        return rc;
    }
    pthread_t *th = malloc((size_t)nthreads * sizeof *th);
    if (!th) return lrmoe_err("exec: out of memory");
    pthread_mutex_init(&J->mu, NULL);
    J->next = 0; J->failed = 0; J->err[0] = 0;
    pool_arg_t pa = {J, fn};
    int started = 0;
    for (int i = 0; i < nthreads; i++) {
        if (pthread_create(&th[i], NULL, pool_main, &pa) != 0) break;
        started++;
    }
    if (!started) pool_main(&pa); /* no thread could start: run here */
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    free(th);
    pthread_mutex_destroy(&J->mu);
    if (J->failed) return lrmoe_err("%s", J->err);
    return 0;
}

/* ---------------------------------------------------------------- forward */

/* A BF16 value widened to F32 (exact: the bits shifted up), inline so the
 * loops below vectorise; lrmoe_bf16_to_f32 is the exported one. */
static inline float bf16f(uint16_t h)
{
    uint32_t b = (uint32_t)h << 16;
    float v;
    memcpy(&v, &b, sizeof v);
    return v;
}

/* acc += al * y for one row y stored as dt (tmp: D floats of scratch), in
 * F32, element by element: y's conversion is exact, a product then a sum
 * (no contraction: ISO C), so every dtype and ISA gives the same bits. */
__attribute__((optimize("O3"), target_clones("avx512f", "avx2", "default")))
static void axpy_bf16(float al, const uint16_t *restrict y, float *restrict acc, int64_t n)
{
    for (int64_t j = 0; j < n; j++) {
        acc[j] += al * bf16f(y[j]);
    }
}

__attribute__((optimize("O3"), target_clones("avx512f", "avx2", "default")))
static void axpy_f32(float al, const float *restrict y, float *restrict acc, int64_t n)
{
    for (int64_t j = 0; j < n; j++) acc[j] += al * y[j];
}

static void axpy_row(lrmoe_dtype_t dt, float al, const void *y, float *tmp, float *acc, int64_t n)
{
    if (dt == LRMOE_BF16) { axpy_bf16(al, y, acc, n); return; }
    if (dt != LRMOE_F32) { lrmoe_convert_to_f32(dt, y, tmp, (size_t)n); y = tmp; }
    axpy_f32(al, y, acc, n);
}

/* 1 when the AVX-512 forms of the combine and the BF16 saved state run */
static int cpu_avx512f(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    return __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}

/* 1 when the combines' AVX-512 forms run: an AVX-512F CPU, unless
 * LRMOE_COMBINE_VEC=0 (the scalar loops, for comparison: the same bits) */
static int combine_vec(void)
{
    const char *e = getenv("LRMOE_COMBINE_VEC");
    return cpu_avx512f() && !(e && !strcmp(e, "0"));
}

/* One token's combine in one pass, BF16 rows: acc (D) = sum_k al[k] y[k]
 * over ascending k from +0, each product then its sum (the bits of memset +
 * axpy_bf16 K times), and y[k] copied to cp + k*D (NULL: no copy) with
 * non-temporal stores (the rows are not read again here) where cp's rows
 * are 64-byte aligned. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include "simd_bf16.h"
#define LRMOE_COMBINE_VEC 1
__attribute__((target("avx512f")))
static void combine_bf16_v(int64_t K, int64_t D, const char *const *y, const float *al,
                           uint16_t *cp, float *acc)
{
    const int nt = cp && !((uintptr_t)cp & 63) && !((D * 2) & 63);
    int64_t j = 0;
    for (; j + 32 <= D; j += 32) {
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        for (int64_t k = 0; k < K; k++) {
            __m512i v = _mm512_loadu_si512(y[k] + j * 2);
            if (nt) _mm512_stream_si512((void *)(cp + k * D + j), v);
            else if (cp) _mm512_storeu_si512(cp + k * D + j, v);
            __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)), 16));
            __m512 hi = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1)), 16));
            __m512 w = _mm512_set1_ps(al[k]);
            a0 = _mm512_add_ps(a0, _mm512_mul_ps(w, lo));
            a1 = _mm512_add_ps(a1, _mm512_mul_ps(w, hi));
        }
        _mm512_storeu_ps(acc + j, a0);
        _mm512_storeu_ps(acc + j + 16, a1);
    }
    for (; j < D; j++) {
        acc[j] = 0;
        for (int64_t k = 0; k < K; k++) {
            uint16_t h;
            memcpy(&h, y[k] + j * 2, 2);
            if (cp) cp[k * D + j] = h;
            acc[j] += al[k] * bf16f(h);
        }
    }
}

/* One token's backward combine, BF16 pair outputs: gh (D) = sum over
 * ascending k of the K dx rows dx[k] (NULL: skipped) from +0, and out[k] =
 * g . y[k] (y[k] BF16, D values) summed in float64 in ascending j: the bits
 * of memset + the row sums and dots_f64 (each product of two floats is
 * exact in float64, so a product then a sum is what the scalar code does).
 * Eight rows' sums sit in the lanes of one vector: 8x8 blocks of y are
 * transposed so that column j is a vector over k. */
__attribute__((target("avx512f")))
static void combine_bwd_v(int64_t K, int64_t D, const char *const *dx, const float *g,
                          const uint16_t *y, float *gh, float *out)
{
    int64_t j = 0;
    for (; j + 16 <= D; j += 16) {
        __m512 a = _mm512_setzero_ps();
        for (int64_t k = 0; k < K; k++)
            if (dx[k]) a = _mm512_add_ps(a, _mm512_loadu_ps((const float *)dx[k] + j));
        _mm512_storeu_ps(gh + j, a);
    }
    for (; j < D; j++) {
        gh[j] = 0;
        for (int64_t k = 0; k < K; k++)
            if (dx[k]) gh[j] += ((const float *)dx[k])[j];
    }
    for (int64_t k0 = 0; k0 < K; k0 += 8) {
        const int64_t nk = K - k0 < 8 ? K - k0 : 8;
        const uint16_t *r[8];
        for (int64_t k = 0; k < 8; k++) r[k] = y + (k0 + (k < nk ? k : 0)) * D;
        __m512d s = _mm512_setzero_pd();
        for (j = 0; j + 8 <= D; j += 8) {
            __m128i a[8], t[8], u[8], c[8];
            for (int k = 0; k < 8; k++) a[k] = _mm_loadu_si128((const __m128i *)(r[k] + j));
            for (int k = 0; k < 8; k += 2) {
                t[k] = _mm_unpacklo_epi16(a[k], a[k + 1]);
                t[k + 1] = _mm_unpackhi_epi16(a[k], a[k + 1]);
            }
            for (int h = 0; h < 8; h += 4) { /* rows h..h+3 */
                u[h] = _mm_unpacklo_epi32(t[h], t[h + 2]);     /* columns 0, 1 */
                u[h + 1] = _mm_unpackhi_epi32(t[h], t[h + 2]); /* 2, 3 */
                u[h + 2] = _mm_unpacklo_epi32(t[h + 1], t[h + 3]);
                u[h + 3] = _mm_unpackhi_epi32(t[h + 1], t[h + 3]);
            }
            for (int q = 0; q < 4; q++) {
                c[2 * q] = _mm_unpacklo_epi64(u[q], u[q + 4]);
                c[2 * q + 1] = _mm_unpackhi_epi64(u[q], u[q + 4]);
            }
            for (int q = 0; q < 8; q++) {
                const __m256 col = _mm256_castsi256_ps(
                    _mm256_slli_epi32(_mm256_cvtepu16_epi32(c[q]), 16));
                s = _mm512_add_pd(s, _mm512_mul_pd(_mm512_set1_pd((double)g[j + q]),
                                                   _mm512_cvtps_pd(col)));
            }
        }
        double sv[8];
        _mm512_storeu_pd(sv, s);
        for (int64_t k = 0; k < nk; k++) {
            for (int64_t jj = j; jj < D; jj++)
                sv[k] += (double)g[jj] * (double)bf16f(r[k][jj]);
            out[k0 + k] = (float)sv[k];
        }
    }
}

/* n F32 values to BF16 with lrmoe_f32_to_bf16's rounding (nearest even, NaN
 * kept quiet with its sign: lib/dtype.c's formula, 16 lanes at a time),
 * stored non-temporally where dst is 32-byte aligned: the saved state is
 * written once and read by the next stage, not here. */
__attribute__((target("avx512f")))
static void to_bf16_nt(const float *src, uint16_t *dst, int64_t n)
{
    const int nt = !((uintptr_t)dst & 31);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m256i h = lrmoe_bf16_16(_mm512_loadu_si512(src + j));
        if (nt) _mm256_stream_si256((__m256i *)(dst + j), h);
        else _mm256_storeu_si256((__m256i *)(dst + j), h);
    }
    if (j < n) lrmoe_convert_from_f32(LRMOE_BF16, src + j, dst + j, (size_t)(n - j));
}
#endif

/* Orders the non-temporal stores above before what follows (another thread
 * reading the rows): after each batch of them */
static void nt_fence(void)
{
#ifdef LRMOE_COMBINE_VEC
    if (cpu_avx512f()) _mm_sfence();
#endif
}

/* F32 row to the saved state's BF16 (same bits either way) */
static void save_bf16(int vec, const float *src, void *dst, int64_t n)
{
#ifdef LRMOE_COMBINE_VEC
    if (vec) { to_bf16_nt(src, dst, n); return; }
#endif
    (void)vec;
    lrmoe_gemm_to_bf16(src, dst, (size_t)n);
}

typedef struct {
    const layout_t *L;
    const char *src;       /* (T,D) storage rows */
    size_t row_bytes;
} fill_tok_t;

static void fill_token_row(void *ctx, int64_t i, void *dst)
{
    fill_tok_t *f = ctx;
    memcpy(dst, f->src + (size_t)(f->L->u[i] / f->L->K) * f->row_bytes, f->row_bytes);
}

/* Rank r's experts in forward: weights for replicas, then per expert
 * segment h_g, h_u (GEMMs), SwiGLU and saved state, y (GEMM). */
static int fwd_rank(job_t *J, worker_t *k, int r)
{
    const lrmoe_exec_dims_t *d = J->d;
    const layout_t *L = J->L;
    lrmoe_exec_fwd_t *a = J->fa;
    const int64_t E = d->E, D = d->D, F = d->F;
    const lrmoe_dtype_t adt = a->act_dtype;
    const size_t as = lrmoe_dtype_size(adt);
    double *tim = J->tim;
    float *H = k->s[0], *phi = k->s[2], *sq = k->sq; /* H (n,2F) = [h_g | h_u] */
    const size_t FD = (size_t)(F * D);
    const int vec = cpu_avx512f();
    if (fetch_replicas(J->comm, d, J->w, J->placement, L->cnt, r, &k->wc, tim) < 0) return -1;
    for (int64_t e = 0; e < E; e++) {
        int64_t n = L->cnt[r * E + e], i0 = L->seg[r * E + e];
        if (!n) continue;
        double t0 = now_();
        ew_t w;
        expert_w(d, J->w, &k->wc, e, &w);
        const size_t ws = lrmoe_dtype_size(w.dt);
        float *x = J->X + i0 * D;
        const void *xi = J->Xb ? (const void *)(J->Xb + (size_t)(i0 * D) * 2) : (const void *)x;
        const lrmoe_dtype_t xdt = J->Xb ? LRMOE_BF16 : LRMOE_F32;
        // x is (n,D), [wg; wu] is (2F,D): H = x [W_gate; W_up]^T is (n,2F),
        // one GEMM when the two matrices are consecutive (packed copies,
        // replicas), else two sharing x's conversion, writing the halves of H
        // (the GEMM converts the F32 operands to its dtype: gemm_cpu.h)
        if ((const char *)w.u == (const char *)w.g + FD * ws) {
            if (lrmoe_gemm(k->gm, 0, 1, n, 2 * F, D, xi, xdt, D, w.g, w.dt, D, 0, H, 2 * F) < 0)
                return -1;
        } else if (lrmoe_gemm2(k->gm, n, F, D, xi, xdt, D, w.g, w.u, w.dt, D, H, 2 * F) < 0) {
            return -1;
        }
        double t1 = now_();
        lrmoe_swiglu_fwd_ld(n, F, H, H + F, 2 * F, phi, F, sq);
        for (int64_t j = 0; j < n; j++) {
            int64_t u = L->u[i0 + j];
            if (a->phi_sqnorm) a->phi_sqnorm[u] = sq[j];
            /* BF16 saved state: the vectorised rounding (same bits) */
            if (a->saved_gate && adt == LRMOE_BF16)
                save_bf16(vec, H + j * 2 * F, (char *)a->saved_gate + (size_t)(u * F) * as, F);
            else if (a->saved_gate)
                lrmoe_convert_from_f32(adt, H + j * 2 * F, (char *)a->saved_gate + (size_t)(u * F) * as, (size_t)F);
            if (a->saved_up && adt == LRMOE_BF16)
                save_bf16(vec, H + j * 2 * F + F, (char *)a->saved_up + (size_t)(u * F) * as, F);
            else if (a->saved_up)
                lrmoe_convert_from_f32(adt, H + j * 2 * F + F, (char *)a->saved_up + (size_t)(u * F) * as, (size_t)F);
        }
        double t2 = now_();
        // phi is (n,F), wd is (D,F): y = phi W_down^T is (n,D), written over x
        if (J->Xb ? lrmoe_gemm_bf16out(k->gm, n, D, F, phi, LRMOE_F32, F, w.d, w.dt, F,
                                       (uint16_t *)J->X + i0 * D, D) < 0
                  : lrmoe_gemm(k->gm, 0, 1, n, D, F, phi, LRMOE_F32, F, w.d, w.dt, F, 0, x, D) < 0)
            return -1;
        double t3 = now_();
        TIM(r, LRMOE_STAGE_GEMM) += (t1 - t0) + (t3 - t2);
        TIM(r, LRMOE_STAGE_ACT) += t2 - t1;
    }
    nt_fence();
    return 0;
}

int lrmoe_exec_forward_cpu(const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                           const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan,
                           lrmoe_exec_fwd_t *a, double *timings)
{
    if (check_common(d, w) < 0 || act_ok(a->act_dtype, "hidden") < 0) return -1;
    if (!a->hidden || !a->topk_ids || !a->topk_weights || !a->output || !a->pair_rank)
        return lrmoe_err("forward: missing hidden, topk_ids, topk_weights, output or pair_rank");
    const int64_t T = d->T, K = d->K, E = d->E, D = d->D, F = d->F;
    const int P = d->P;
    const lrmoe_dtype_t adt = a->act_dtype;
    const size_t as = lrmoe_dtype_size(adt);
    if (lrmoe_exec_check_fwd_inputs(cfg, d, a) < 0) return -1;
    const uint8_t *placement = plan ? plan->placement : NULL;
    if (lrmoe_exec_assign(T, K, E, P, a->topk_ids, plan ? plan->fwd_alloc : NULL,
                          placement, a->pair_rank) < 0)
        return -1;
    blas_threads(cfg);

    double *tim = timings, *tloc = NULL;
    if (!tim) tim = tloc = calloc((size_t)P * LRMOE_NSTAGES, sizeof *tim);
    else memset(tim, 0, (size_t)P * LRMOE_NSTAGES * sizeof *tim);
    layout_t L;
    lrmoe_comm_t comm;
    char *bufA = NULL, *bufB = NULL;
    float *X = NULL;
    const char **urow = NULL;
    int rc = -1;
    memset(&L, 0, sizeof L);
    if (cfg->comm && cfg->comm->P != P) {
        free(tloc);
        return lrmoe_err("exec: %d ranks but the communicator has %d", P, cfg->comm->P);
    }
    if (cfg->comm) comm = *cfg->comm; /* borrowed: not freed here */
    if (!tim || (!cfg->comm && lrmoe_comm_cpu_init_clock(&comm, P, now_) < 0)) { free(tloc); return lrmoe_err("exec: out of memory"); }
    if (layout_pairs(&L, P, T, K, E, a->topk_ids, a->pair_rank) < 0) goto out;

    const int64_t M = L.M;
    int64_t maxn = 1;
    for (int64_t j = 0; j < P * E; j++)
        if (L.cnt[j] > maxn && lrmoe_comm_local(&comm, (int)(j / E))) maxn = L.cnt[j];
    size_t rowb = (size_t)D * as;
    /* 64-byte aligned (the combine's loads of y rows: one cache line each) */
    bufA = alloc64((size_t)(M ? M : 1) * rowb);
    bufB = alloc64((size_t)(M ? M : 1) * rowb);
    X = alloc64((size_t)(M ? M : 1) * D * sizeof *X);
    urow = malloc((size_t)(M ? M : 1) * sizeof *urow);
    if (!bufA || !bufB || !X || !urow) {
        lrmoe_err("exec: out of memory (%lld pairs, D=%lld, F=%lld)", (long long)M,
                  (long long)D, (long long)F);
        goto out;
    }
    /* dispatch: token rows (storage dtype) to the ranks running their pairs */
    fill_tok_t ft = {&L, a->hidden, rowb};
    job_t J;
    memset(&J, 0, sizeof J);
    if (lrmoe_gemm_resolve((lrmoe_compute_t)cfg->compute, w->dtype, &J.compute) < 0) goto out;
    /* bf16 compute on BF16 activations: the GEMMs take the rows as they
     * arrive (in bufA, free after the all-to-all), no F32 round trip */
    const int xraw = J.compute == LRMOE_COMPUTE_BF16 && adt == LRMOE_BF16;
    /* communication buffers are persistent in a real step: fault them in
     * before the timed stages, only those the exchanges will write (with
     * lean rows: recv, which holds x, and X, which gets y: BF16 rows when
     * xraw, else X is never written, y going over x in recv) */
    if (lean_rows(&comm, &L, xraw || adt == LRMOE_F32)) {
        memset(bufB, 0, (size_t)M * rowb);
        if (xraw) memset(X, 0, (size_t)M * rowb);
    } else {
        touch_rows(&comm, &L, bufA, bufB, rowb, (char *)X, (size_t)D * sizeof *X);
    }
    void *xrows;
    if (exchange_fwd(&comm, &L, rowb, adt, D, fill_token_row, &ft, bufA, bufB,
                     xraw ? (void *)bufA : (void *)X, xraw ? adt : LRMOE_F32, tim, &xrows) < 0)
        goto out;
    if (xrows == bufB) { /* the rows are where they arrived (same size): swap */
        if (xraw) { bufB = bufA; bufA = xrows; }
        else { bufB = (char *)X; X = xrows; }
    }

    /* experts, rank by rank (or ranks in parallel) */
    J.d = d; J.w = w; J.placement = placement; J.comm = &comm; J.L = &L; J.tim = tim;
    J.maxn = maxn; J.fa = a; J.X = X; J.Xb = xraw ? bufA : NULL;
    J.gthreads = rank_blas_threads(cfg);
    if (run_ranks(&J, fwd_rank, cfg->rank_threads) < 0) goto out;

    /* combine: y rows back to the token owners, out_t = sum_k alpha_tk y_tk */
    if (exchange_rev(&comm, &L, adt, D, X, xraw ? adt : LRMOE_F32, bufB, bufA, urow, tim) < 0)
        goto out;
    {
        float *acc = malloc((size_t)D * 2 * sizeof *acc);
        if (!acc) { lrmoe_err("exec: out of memory"); goto out; }
        float *yrow = acc + D;
        int vec = adt == LRMOE_BF16 && combine_vec();
        for (int s = 0; s < P; s++) {
            if (!lrmoe_comm_local(&comm, s)) continue;
            double t0 = now_();
            int64_t t_lo = (int64_t)s * T / P, t_hi = (int64_t)(s + 1) * T / P;
            for (int64_t t = t_lo; t < t_hi; t++) {
#ifdef LRMOE_COMBINE_VEC
                if (vec) {
                    combine_bf16_v(K, D, urow + t * K, a->topk_weights + t * K,
                                   a->pair_out ? (uint16_t *)a->pair_out + t * K * D : NULL, acc);
                    lrmoe_convert_from_f32(adt, acc, (char *)a->output + (size_t)t * rowb, (size_t)D);
                    continue;
                }
#endif
                memset(acc, 0, (size_t)D * sizeof *acc);
                for (int64_t k = 0; k < K; k++) {
                    int64_t u = t * K + k;
                    const char *src = urow[u];
                    if (a->pair_out) memcpy((char *)a->pair_out + (size_t)u * rowb, src, rowb);
                    axpy_row(adt, a->topk_weights[u], src, yrow, acc, D);
                }
                lrmoe_convert_from_f32(adt, acc, (char *)a->output + (size_t)t * rowb, (size_t)D);
            }
            nt_fence();
            TIM(s, LRMOE_STAGE_COMBINE) += now_() - t0;
        }
        free(acc);
    }
    rc = 0;
out:
    free(bufA); free(bufB); free(X); free(urow);
    layout_free(&L);
    if (!cfg->comm) lrmoe_comm_free(&comm);
    free(tloc);
    return rc;
}

/* ---------------------------------------------------------------- backward */

/* out[k] = sum_j g[j] y[k][j] for K rows y (K,D), each summed in float64 in
 * ascending j (the products of two floats are exact in float64): the same
 * bits as one row at a time, with up to 8 rows' sums interleaved so that
 * their dependency chains overlap. */
static void dots_f64(const float *g, const float *y, int64_t K, int64_t D, float *out)
{
    for (int64_t k0 = 0; k0 < K; k0 += 8) {
        const int64_t nk = K - k0 < 8 ? K - k0 : 8;
        double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        const float *r = y + k0 * D;
        if (nk == 8) {
            for (int64_t j = 0; j < D; j++) {
                const double gj = g[j];
                for (int k = 0; k < 8; k++) s[k] += gj * (double)r[k * D + j];
            }
        } else {
            for (int64_t j = 0; j < D; j++) {
                const double gj = g[j];
                for (int64_t k = 0; k < nk; k++) s[k] += gj * (double)r[k * D + j];
            }
        }
        for (int64_t k = 0; k < nk; k++) out[k0 + k] = (float)s[k];
    }
}

typedef struct {
    const layout_t *L;
    const lrmoe_exec_bwd_t *a;
    int64_t D;
    size_t gs;             /* grad_output element size */
    float *tmp;            /* (D) */
} fill_grad_t;

/* o = al * g for a BF16 row g, in one pass: the conversion is exact (a
 * shift), so the bits are those of converting first, then multiplying
 * (lrmoe_pack_gather_scaled_dt, the copying pack's pack_grad). */
__attribute__((optimize("O3"), target_clones("avx512f", "avx2", "default")))
static void scale_bf16(float al, const uint16_t *restrict g, float *restrict o, int64_t n)
{
    for (int64_t j = 0; j < n; j++) {
        o[j] = bf16f(g[j]) * al;
    }
}

/* dy_u = alpha_u g_t (F32); masked: 0 where keep_u == 0; compact
 * layout-only: u = pack_pair[i], the pack_grad row of the copying form */
static void fill_grad_row(void *ctx, int64_t i, void *dst)
{
    fill_grad_t *f = ctx;
    int64_t u = f->L->u[i], t = u / f->L->K, D = f->D;
    float *o = dst;
    if (f->a->mode == LRMOE_MODE_MASKED && !f->a->keep[u]) {
        memset(o, 0, (size_t)D * sizeof *o);
        return;
    }
    const char *g = (const char *)f->a->grad_output + (size_t)(t * D) * f->gs;
    float al = f->a->topk_weights[u];
    if (f->a->grad_dtype == LRMOE_BF16) {
        scale_bf16(al, (const uint16_t *)g, o, D);
        return;
    }
    lrmoe_convert_to_f32(f->a->grad_dtype, g, o, (size_t)D);
    for (int64_t j = 0; j < D; j++) o[j] *= al;
}

/* compact: the packed row i of pack_grad */
static void fill_pack_row(void *ctx, int64_t i, void *dst)
{
    fill_grad_t *f = ctx;
    memcpy(dst, f->a->pack_grad + i * f->D, (size_t)f->D * sizeof(float));
}

/* Rank r's experts in backward: per expert segment dphi (GEMM), SwiGLU
 * backward, the three weight-gradient GEMMs and dx (two GEMMs). Native
 * experts write grad_w_* directly; helpers keep theirs in rgrad. */
static int bwd_rank(job_t *J, worker_t *k, int r)
{
    const lrmoe_exec_dims_t *d = J->d;
    const layout_t *L = J->L;
    lrmoe_exec_bwd_t *a = J->ba;
    const int64_t E = d->E, D = d->D, F = d->F, K = d->K;
    const int P = d->P;
    const lrmoe_dtype_t adt = a->act_dtype;
    const size_t as = lrmoe_dtype_size(adt);
    /* compact, copying form: row i of pack_*; else (also compact layout-only)
     * gathered from the sources by pair u */
    const int packed = a->mode == LRMOE_MODE_COMPACT && a->pack_hidden;
    const size_t FD = (size_t)(F * D);
    double *tim = J->tim;
    /* G (n,2F) = [dg | du] spans s[3] and s[4] */
    float *hg = k->s[0], *hu = k->s[1], *dphi = k->s[2], *G = k->s[3], *phi = k->s[5],
          *Xs = k->Xs;
    if (fetch_replicas(J->comm, d, J->w, J->placement, L->cnt, r, &k->wc, tim) < 0) return -1;
    /* Fresh weight-gradient memory (a cold process' first frame) is faulted
     * in here, each native expert's three matrices with one call apiece,
     * instead of a page at a time inside the GEMMs: the kernel then takes no
     * exception per 4 KiB page (lrmoe_alloc_prefault; nothing to do where
     * the memory is resident already, as in a later frame). Counted in the
     * GEMM stage, where those faults were. */
    {
        double t0 = now_();
        for (int64_t e = 0; e < E; e++)
            if (lrmoe_exec_native(e, E, P) == r) {
                lrmoe_alloc_prefault(a->grad_w_gate + e * FD, FD * sizeof(float));
                lrmoe_alloc_prefault(a->grad_w_up + e * FD, FD * sizeof(float));
                lrmoe_alloc_prefault(a->grad_w_down + e * FD, FD * sizeof(float));
            }
        TIM(r, LRMOE_STAGE_GEMM) += now_() - t0;
    }
    for (int64_t e = 0; e < E; e++) {
        int64_t n = L->cnt[r * E + e], i0 = L->seg[r * E + e];
        int nat = lrmoe_exec_native(e, E, P);
        double t0 = now_();
        if (!n) {
            if (nat == r) { /* no local pairs: the owner's share is zero */
                memset(a->grad_w_gate + e * FD, 0, FD * sizeof(float));
                memset(a->grad_w_up + e * FD, 0, FD * sizeof(float));
                memset(a->grad_w_down + e * FD, 0, FD * sizeof(float));
                TIM(r, LRMOE_STAGE_GEMM) += now_() - t0;
            }
            continue;
        }
        float *gwg, *gwu, *gwd;
        if (nat == r) {
            gwg = a->grad_w_gate + e * FD; gwu = a->grad_w_up + e * FD;
            gwd = a->grad_w_down + e * FD;
        } else {
            float *b = J->rgrad[r * E + e]; /* allocated by the caller */
            gwg = b; gwu = b + FD; gwd = b + 2 * FD;
        }
        ew_t w;
        expert_w(d, J->w, &k->wc, e, &w);
        const size_t ws = lrmoe_dtype_size(w.dt);
        const lrmoe_dtype_t odt = lrmoe_gemm_dtype(k->gm);
        const size_t os = lrmoe_dtype_size(odt);
        /* saved state of the segment: x, h_g, h_u (n rows), loaded to F32
         * (bf16 compute: x straight to BF16; elementwise: counted with the
         * activation stage). bf16 compute on BF16 saved state: h_g, h_u
         * stay where they are (their rows in k->rows) and the SwiGLU
         * backward writes the GEMMs' BF16 operands in one pass. */
        const int fused = odt == LRMOE_BF16 && adt == LRMOE_BF16;
        double ts = now_();
        for (int64_t j = 0; j < n; j++) {
            int64_t i = i0 + j, u = L->u[i];
            const char *xs, *gs, *us;
            if (packed) {
                xs = (const char *)a->pack_hidden + (size_t)(i * D) * as;
                gs = (const char *)a->pack_gate + (size_t)(i * F) * as;
                us = (const char *)a->pack_up + (size_t)(i * F) * as;
            } else {
                xs = (const char *)a->hidden + (size_t)((u / K) * D) * as;
                gs = (const char *)a->saved_gate + (size_t)(u * F) * as;
                us = (const char *)a->saved_up + (size_t)(u * F) * as;
            }
            if (fused) {
                memcpy((char *)k->ob[2] + (size_t)(j * D) * 2, xs, (size_t)D * 2);
                k->rows[j] = (const uint16_t *)gs;
                k->rows[n + j] = (const uint16_t *)us;
                continue;
            }
            if (odt == LRMOE_F32) lrmoe_convert_to_f32(adt, xs, Xs + j * D, (size_t)D);
            else if (adt == LRMOE_BF16) memcpy((char *)k->ob[2] + (size_t)(j * D) * 2, xs, (size_t)D * 2);
            else lrmoe_gemm_to_bf16((const float *)xs, (char *)k->ob[2] + (size_t)(j * D) * 2,
                                    (size_t)D);
            lrmoe_convert_to_f32(adt, gs, hg + j * F, (size_t)F);
            lrmoe_convert_to_f32(adt, us, hu + j * F, (size_t)F);
        }
        double te = now_();
        float *dy = J->DY + i0 * D;
        const void *dyo = opnd(k, 0, dy, n * D), *xso = odt == LRMOE_F32 ? (const void *)Xs : k->ob[2];
        // dy is (n,D), wd is (D,F): dphi = dy W_down is (n,F)
        if (lrmoe_gemm(k->gm, 0, 0, n, F, D, dyo, odt, D, w.d, w.dt, F, 0, dphi, F) < 0) return -1;
        double t1 = now_();
        if (fused)
            lrmoe_swiglu_bwd_bf16_rows(n, F, k->rows, k->rows + n, dphi, k->ob[1],
                                       (uint16_t *)k->ob[1] + F, 2 * F, k->ob[3]);
        else
            lrmoe_swiglu_bwd_ld(n, F, hg, hu, F, dphi, G, G + F, 2 * F, phi);
        double t2 = now_();
        // grad W_down (D,F) = dy^T phi; grad W_gate/W_up (F,D) = dg^T x, du^T x
        // (dg, du are the halves of G, row stride 2F)
        const char *Go = fused ? k->ob[1] : opnd(k, 1, G, n * 2 * F);
        const void *phio = fused ? k->ob[3] : opnd(k, 3, phi, n * F);
        if (lrmoe_gemm(k->gm, 1, 0, D, F, n, dyo, odt, D, phio, odt, F, 0, gwd, F) < 0 ||
            lrmoe_gemm(k->gm, 1, 0, F, D, n, Go, odt, 2 * F, xso, odt, D, 0, gwg, D) < 0 ||
            lrmoe_gemm(k->gm, 1, 0, F, D, n, Go + F * os, odt, 2 * F, xso, odt, D, 0, gwu, D) < 0)
            return -1;
        // dx (n,D) = dg W_gate + du W_up = G [W_gate; W_up], written over dy:
        // one GEMM with K = 2F when the matrices are consecutive
        if ((const char *)w.u == (const char *)w.g + FD * ws) {
            if (lrmoe_gemm(k->gm, 0, 0, n, D, 2 * F, Go, odt, 2 * F, w.g, w.dt, D, 0, dy, D) < 0)
                return -1;
        } else if (lrmoe_gemm(k->gm, 0, 0, n, D, F, Go, odt, 2 * F, w.g, w.dt, D, 0, dy, D) < 0 ||
                   lrmoe_gemm(k->gm, 0, 0, n, D, F, Go + F * os, odt, 2 * F, w.u, w.dt, D, 1,
                              dy, D) < 0) {
            return -1;
        }
        double t3 = now_();
        TIM(r, LRMOE_STAGE_GEMM) += (ts - t0) + (t1 - te) + (t3 - t2);
        TIM(r, LRMOE_STAGE_ACT) += (te - ts) + (t2 - t1);
    }
    return 0;
}

/* The backward's arguments for its mode: every backend's checks
 * (lrmoe_exec_check_bwd_args), then the compact forms this backend takes:
 * all four packed row arrays (copying form) or none (layout-only). */
static int bwd_check_args(const lrmoe_exec_dims_t *d, const lrmoe_exec_bwd_t *a)
{
    if (lrmoe_exec_check_bwd_args(d, a) < 0) return -1;
    if (a->mode != LRMOE_MODE_COMPACT || a->R <= 0) return 0;
    const int nrows = !!a->pack_grad + !!a->pack_hidden + !!a->pack_gate + !!a->pack_up;
    if (nrows && nrows < 4)
        return lrmoe_err("backward compact: give all of pack_grad, pack_hidden, pack_gate "
                         "and pack_up, or none of them (the layout-only form)");
    if (!nrows && (!a->hidden || !a->saved_gate || !a->saved_up))
        return lrmoe_err("backward compact, layout-only form (no pack_grad, pack_hidden, "
                         "pack_gate, pack_up): needs hidden, saved_gate and saved_up");
    return 0;
}

/* gradient reduction: helpers send their weight gradients to the owner,
 * which adds them in ascending helper rank (with one rank per process,
 * each process takes the sends and receives that are its own) */
static int reduce_helper_grads(lrmoe_comm_t *comm, const layout_t *L, lrmoe_exec_bwd_t *a,
                               float **rgrad, int64_t E, int P, size_t FD, double *tim)
{
    float *recvb = NULL;
    for (int64_t e = 0; e < E; e++) {
        int nat = lrmoe_exec_native(e, E, P);
        for (int p = 0; p < P; p++) {
            float *g = rgrad[p * E + e];
            if (!L->cnt[p * E + e] || nat == p) continue; /* no helper gradient */
            if (!lrmoe_comm_local(comm, p) && !lrmoe_comm_local(comm, nat)) continue;
            if (!recvb && !(recvb = malloc(3 * FD * sizeof(float)))) {
                lrmoe_err("exec: out of memory"); return -1;
            }
            double t0 = now_();
            if (comm->p2p(comm, p, g, nat, recvb, 3 * FD * sizeof(float)) < 0) {
                free(recvb); return -1;
            }
            double t1 = now_();
            float *og = a->grad_w_gate + e * FD, *ou = a->grad_w_up + e * FD,
                  *od = a->grad_w_down + e * FD;
            if (lrmoe_comm_local(comm, nat))
                for (size_t j = 0; j < FD; j++) {
                    og[j] += recvb[j]; ou[j] += recvb[FD + j]; od[j] += recvb[2 * FD + j];
                }
            double t2 = now_();
            if (lrmoe_comm_local(comm, p)) TIM(p, LRMOE_STAGE_GRADRED) += t1 - t0;
            if (lrmoe_comm_local(comm, nat)) TIM(nat, LRMOE_STAGE_GRADRED) += t2 - t0;
            free(g);
            rgrad[p * E + e] = NULL;
        }
    }
    free(recvb);
    return 0;
}

/* combine, after the dx rows are back at their token owners (urow):
 * grad_hidden_t = sum_k dx_tk (ascending k), and the router gradient
 * g_t . y_u over all pairs, each rank its share of the tokens */
static int combine_grads(const lrmoe_comm_t *comm, lrmoe_exec_bwd_t *a, const char **urow,
                         float *tmp, const lrmoe_exec_dims_t *d, double *tim)
{
    const int64_t T = d->T, K = d->K, D = d->D;
    const int P = d->P;
    const lrmoe_dtype_t adt = a->act_dtype;
    const size_t as = lrmoe_dtype_size(adt), rowf = (size_t)D * sizeof(float);
    size_t gs = lrmoe_dtype_size(a->grad_dtype);
    float *yrow = malloc((size_t)K * rowf);
    if (!yrow) return lrmoe_err("exec: out of memory");
#ifdef LRMOE_COMBINE_VEC
    const int vec = adt == LRMOE_BF16 && combine_vec();
#endif
    for (int s = 0; s < P; s++) {
        if (!lrmoe_comm_local(comm, s)) continue;
        double t0 = now_();
        int64_t t_lo = (int64_t)s * T / P, t_hi = (int64_t)(s + 1) * T / P;
        for (int64_t t = t_lo; t < t_hi; t++) {
            float *gh = a->grad_hidden + t * D;
            lrmoe_convert_to_f32(a->grad_dtype, (const char *)a->grad_output + (size_t)(t * D) * gs,
                                 tmp, (size_t)D);
#ifdef LRMOE_COMBINE_VEC
            if (vec) {
                combine_bwd_v(K, D, urow + t * K, tmp, (const uint16_t *)a->pair_out + t * K * D,
                              gh, a->grad_topk_weights + t * K);
                continue;
            }
#endif
            memset(gh, 0, rowf);
            for (int64_t k = 0; k < K; k++) {
                int64_t u = t * K + k;
                if (urow[u]) {
                    const float *src = (const float *)urow[u];
                    for (int64_t j = 0; j < D; j++) gh[j] += src[j];
                }
                lrmoe_convert_to_f32(adt, (const char *)a->pair_out + (size_t)(u * D) * as,
                                     yrow + k * D, (size_t)D);
            }
            dots_f64(tmp, yrow, K, D, a->grad_topk_weights + t * K);
        }
        TIM(s, LRMOE_STAGE_COMBINE) += now_() - t0;
    }
    free(yrow);
    return 0;
}

int lrmoe_exec_backward_cpu(const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                            const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan,
                            lrmoe_exec_bwd_t *a, double *timings)
{
    if (check_common(d, w) < 0 || act_ok(a->act_dtype, "saved state") < 0 ||
        act_ok(a->grad_dtype, "grad_output") < 0)
        return -1;
    const int64_t T = d->T, K = d->K, E = d->E, D = d->D, F = d->F;
    const int P = d->P;
    const int compact = a->mode == LRMOE_MODE_COMPACT;
    if (bwd_check_args(d, a) < 0) return -1;
    if (lrmoe_exec_check_bwd_inputs(cfg, d, a) < 0) return -1;
    const uint8_t *placement = plan ? plan->placement : NULL;
    blas_threads(cfg);

    double *tim = timings, *tloc = NULL;
    if (!tim) tim = tloc = calloc((size_t)P * LRMOE_NSTAGES, sizeof *tim);
    else memset(tim, 0, (size_t)P * LRMOE_NSTAGES * sizeof *tim);
    layout_t L;
    lrmoe_comm_t comm;
    char *bufA = NULL, *bufB = NULL;
    float *DY = NULL, *tmp = NULL;
    float **rgrad = NULL;   /* (P*E) replica/helper weight gradients */
    const char **urow = NULL;
    int rc = -1;
    memset(&L, 0, sizeof L);
    if (cfg->comm && cfg->comm->P != P) {
        free(tloc);
        return lrmoe_err("exec: %d ranks but the communicator has %d", P, cfg->comm->P);
    }
    if (cfg->comm) comm = *cfg->comm; /* borrowed: not freed here */
    if (!tim || (!cfg->comm && lrmoe_comm_cpu_init_clock(&comm, P, now_) < 0)) { free(tloc); return lrmoe_err("exec: out of memory"); }
    if (compact) {
        if (layout_packed(&L, P, T, K, E, a->topk_ids, a, placement) < 0) goto out;
    } else {
        if (layout_pairs(&L, P, T, K, E, a->topk_ids, a->pair_rank) < 0) goto out;
        if (placement)
            for (int64_t u = 0; u < T * K; u++)
                if (!placement[(int64_t)a->topk_ids[u] * P + a->pair_rank[u]]) {
                    lrmoe_err("pair_rank[%lld,%lld]: rank %d holds no instance of expert %d",
                              (long long)(u / K), (long long)(u % K), a->pair_rank[u],
                              a->topk_ids[u]);
                    goto out;
                }
    }

    const int64_t M = L.M;
    int64_t maxn = 1;
    for (int64_t j = 0; j < P * E; j++)
        if (L.cnt[j] > maxn && lrmoe_comm_local(&comm, (int)(j / E))) maxn = L.cnt[j];
    size_t rowf = (size_t)D * sizeof(float);
    size_t FD = (size_t)(F * D);
    bufA = malloc((size_t)(M ? M : 1) * rowf);
    bufB = malloc((size_t)(M ? M : 1) * rowf);
    DY = malloc((size_t)(M ? M : 1) * rowf);
    tmp = malloc(rowf);
    rgrad = calloc((size_t)(P * E), sizeof *rgrad);
    urow = malloc((size_t)(T * K > 0 ? T * K : 1) * sizeof *urow);
    if (!bufA || !bufB || !DY || !tmp || !rgrad || !urow) {
        lrmoe_err("exec: out of memory (%lld rows, D=%lld, F=%lld)", (long long)M,
                  (long long)D, (long long)F);
        goto out;
    }
    /* with lean rows only the dispatch's recv is written (dy, then dx over it) */
    if (lean_rows(&comm, &L, 1)) memset(bufB, 0, (size_t)M * rowf);
    else touch_rows(&comm, &L, bufA, bufB, rowf, (char *)DY, rowf);
    /* helper weight-gradient buffers, allocated and faulted in up front */
    for (int r = 0; r < P; r++)
        for (int64_t e = 0; e < E; e++)
            if (L.cnt[r * E + e] && lrmoe_exec_native(e, E, P) != r &&
                lrmoe_comm_local(&comm, r)) {
                float *b = malloc(3 * FD * sizeof(float));
                if (!b) { lrmoe_err("exec: out of memory (helper gradients)"); goto out; }
                memset(b, 0, 3 * FD * sizeof(float));
                rgrad[r * E + e] = b;
            }

    /* dispatch: dy rows (F32) from the token owners to the ranks */
    fill_grad_t fg = {&L, a, D, lrmoe_dtype_size(a->grad_dtype), tmp};
    void *dyrows;
    if (exchange_fwd(&comm, &L, rowf, LRMOE_F32, D,
                     compact && a->pack_grad ? fill_pack_row : fill_grad_row,
                     &fg, bufA, bufB, DY, LRMOE_F32, tim, &dyrows) < 0)
        goto out;
    if (dyrows == bufB) { bufB = (char *)DY; DY = dyrows; } /* where they arrived: swap */

    /* experts, rank by rank (or ranks in parallel) */
    job_t J;
    memset(&J, 0, sizeof J);
    J.d = d; J.w = w; J.placement = placement; J.comm = &comm; J.L = &L; J.tim = tim;
    J.maxn = maxn; J.ba = a; J.DY = DY; J.rgrad = rgrad;
    J.gthreads = rank_blas_threads(cfg);
    if (lrmoe_gemm_resolve((lrmoe_compute_t)cfg->compute, w->dtype, &J.compute) < 0) goto out;
    if (run_ranks(&J, bwd_rank, cfg->rank_threads) < 0) goto out;

    /* gradient reduction: helpers' weight gradients to the owners */
    if (reduce_helper_grads(&comm, &L, a, rgrad, E, P, FD, tim) < 0) goto out;

    /* combine: dx rows back to the token owners; grad_hidden_t = sum_k dx_tk
     * (ascending k); router gradient g_t . y_u over all pairs */
    if (exchange_rev(&comm, &L, LRMOE_F32, D, DY, LRMOE_F32, bufB, bufA, urow, tim) < 0) goto out;
    if (combine_grads(&comm, a, urow, tmp, d, tim) < 0) goto out;
    rc = 0;
out:
    if (rgrad) for (int64_t j = 0; j < P * E; j++) free(rgrad[j]);
    free(rgrad);
    free(bufA); free(bufB); free(DY); free(tmp); free(urow);
    layout_free(&L);
    if (!cfg->comm) lrmoe_comm_free(&comm);
    free(tloc);
    return rc;
}
