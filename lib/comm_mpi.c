/* MPI communicator: one process per expert-parallel rank (see comm.h).
 *
 * Built with MPI when the Makefile finds OpenMPI (LRMOE_HAVE_MPI); without
 * it every function below exists and fails with "MPI support is not built",
 * so tools can say so instead of silently running one process. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "clock.h"
#include "lrmoe.h"
#include "comm.h"
#include "exec.h"

int lrmoe_comm_mpi_launched(void)
{
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

#ifdef LRMOE_HAVE_MPI
#include <mpi.h>

enum { TAG_P2P = 7, TAG_PING = 8, TAG_PONG = 9 };
/* largest piece of one MPI call, in bytes (int counts) */
#define PIECE ((size_t)1 << 30)

typedef struct {
    MPI_Comm comm;
    int rank, size, local_rank;
    int64_t a2a_bytes, p2p_bytes;
    double a2a_sec;
    /* the watchdog (lrmoe_comm_mpi_set_timeout): timeout seconds (0: off,
     * every call blocks in MPI as it always did), idle (waits unbounded, for
     * the next job), wd: the communicator of its pings */
    double timeout;
    int idle;
    MPI_Comm wd;
} mpi_ctx_t;

static mpi_ctx_t *mx(const lrmoe_comm_t *c) { return (mpi_ctx_t *)c->ctx; }

static int mpi_fail(int rc, const char *what)
{
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS) snprintf(s, sizeof s, "error %d", rc);
    return lrmoe_err("%s: %s", what, s);
}

/* ---- the watchdog: with a timeout every MPI call of this file is
 * non-blocking and waited for here. A wait longer than the timeout asks
 * every other rank for a sign of life (a ping on wd, which each rank answers
 * whenever it waits here); the ranks that do not answer within another
 * timeout are named in the error, which ends the job (the tool's MPI_Abort).
 * A rank stopped (SIGSTOP), hung outside MPI, or computing for longer than
 * the timeout does not answer. */
enum { WD_FAIL = -1 };

static void wd_nap(double waited)
{
    if (waited < 1e-3) return; /* spin the first millisecond (latency) */
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
}

static void wd_answer(mpi_ctx_t *x)
{
    for (;;) {
        int flag = 0, v = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_PING, x->wd, &flag, &st) != MPI_SUCCESS || !flag)
            return;
        MPI_Recv(&v, 1, MPI_INT, st.MPI_SOURCE, TAG_PING, x->wd, MPI_STATUS_IGNORE);
        MPI_Request rq;
        static int pong = 1;
        if (MPI_Isend(&pong, 1, MPI_INT, st.MPI_SOURCE, TAG_PONG, x->wd, &rq) == MPI_SUCCESS)
            MPI_Request_free(&rq);
    }
}

/* After a wait of x->timeout in what: which ranks answer? The error names
 * the first that does not (or says that all answer). */
static int wd_diagnose(mpi_ctx_t *x, const char *what, double waited)
{
    const int P = x->size;
    char *ok = calloc((size_t)P, 1);
    if (!ok) return lrmoe_err("%s: no progress in %.3g s (--timeout)", what, waited);
    ok[x->rank] = 1;
    static int ping = 1;
    for (int r = 0; r < P; r++) {
        MPI_Request rq;
        if (r != x->rank && MPI_Isend(&ping, 1, MPI_INT, r, TAG_PING, x->wd, &rq) == MPI_SUCCESS)
            MPI_Request_free(&rq);
    }
    int left = P - 1;
    const double t0 = lrmoe_now();
    while (left > 0 && lrmoe_now() - t0 < x->timeout) {
        wd_answer(x);
        int flag = 0, v = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_PONG, x->wd, &flag, &st) == MPI_SUCCESS && flag) {
            MPI_Recv(&v, 1, MPI_INT, st.MPI_SOURCE, TAG_PONG, x->wd, MPI_STATUS_IGNORE);
            if (!ok[st.MPI_SOURCE]) { ok[st.MPI_SOURCE] = 1; left--; }
            continue;
        }
        wd_nap(1);
    }
    int silent = -1, n = 0;
    for (int r = 0; r < P; r++)
        if (!ok[r]) { if (silent < 0) silent = r; n++; }
    free(ok);
    if (silent < 0)
        return lrmoe_err("%s: no progress in %.3g s (--timeout %g), though every rank answers "
                         "(a deadlock?): ending the job", what, waited, x->timeout);
    return lrmoe_err("%s: no progress in %.3g s (--timeout %g): rank %d does not answer "
                     "(stopped, hung, or computing longer than the timeout)%s: ending the job",
                     what, waited, x->timeout, silent, n > 1 ? ", nor do others" : "");
}

/* Wait for rq: MPI_SUCCESS, an MPI error code, or WD_FAIL (error set). */
static int wd_wait(mpi_ctx_t *x, MPI_Request *rq, const char *what)
{
    const double t0 = lrmoe_now();
    for (;;) {
        int done = 0;
        int e = MPI_Test(rq, &done, MPI_STATUS_IGNORE);
        if (e != MPI_SUCCESS || done) return e;
        wd_answer(x);
        double waited = lrmoe_now() - t0;
        if (!x->idle && waited > x->timeout) {
            wd_diagnose(x, what, waited);
            return WD_FAIL;
        }
        wd_nap(waited);
    }
}

/* e from an MPI call of what (started non-blocking into rq when the watchdog
 * is on): 0, or -1 with the error set. */
static int wd_done(mpi_ctx_t *x, int e, MPI_Request *rq, const char *what)
{
    if (e == MPI_SUCCESS && x->timeout > 0) e = wd_wait(x, rq, what);
    if (e == WD_FAIL) return -1;
    return e == MPI_SUCCESS ? 0 : mpi_fail(e, what);
}

/* One MPI call: blocking without a timeout, else its non-blocking form waited
 * for by the watchdog. */
#define WD_CALL(x, rq, blocking, nonblocking) ((x)->timeout > 0 ? (nonblocking) : (blocking))

void lrmoe_comm_mpi_set_timeout(lrmoe_comm_t *c, double seconds)
{
    mx(c)->timeout = seconds > 0 ? seconds : 0;
}

int lrmoe_comm_mpi_idle(lrmoe_comm_t *c, int idle)
{
    int was = mx(c)->idle;
    mx(c)->idle = idle;
    return was;
}

int lrmoe_comm_mpi_built(void) { return 1; }

static int mpi_alltoallv(lrmoe_comm_t *c, size_t es, const void *const *send,
                         const int64_t *counts, const int64_t *sdispls, void *const *recv,
                         const int64_t *rdispls, double *rank_sec)
{
    mpi_ctx_t *x = mx(c);
    const int P = c->P, me = x->rank;
    int *v = malloc((size_t)P * 5 * sizeof *v);
    if (!v) return lrmoe_err("alltoallv: out of memory");
    int *sc = v, *sd = v + P, *rc = v + 2 * P, *rd = v + 3 * P, *got = v + 4 * P;
    int ret = -1;
    int64_t out = 0, in = 0;
    for (int p = 0; p < P; p++) {
        int64_t ns = counts[(size_t)me * P + p], nr = counts[(size_t)p * P + me];
        if (ns < 0 || nr < 0) {
            lrmoe_err("alltoallv: negative count between ranks %d and %d", me, p);
            goto out;
        }
        if (ns > INT_MAX || nr > INT_MAX || sdispls[(size_t)me * P + p] > INT_MAX ||
            rdispls[(size_t)me * P + p] > INT_MAX) {
            lrmoe_err("alltoallv: more than %d rows between ranks %d and %d", INT_MAX, me, p);
            goto out;
        }
        sc[p] = (int)ns;
        sd[p] = (int)sdispls[(size_t)me * P + p];
        rd[p] = (int)rdispls[(size_t)me * P + p];
        out += ns;
        in += nr;
    }
    if ((out && !send[me]) || (in && !recv[me])) {
        lrmoe_err("alltoallv: NULL buffer on rank %d", me);
        goto out;
    }
    double t0 = lrmoe_now();
    /* counts first: every rank learns what it receives from its peers */
    MPI_Request rq;
    int e = WD_CALL(x, rq, MPI_Alltoall(sc, 1, MPI_INT, got, 1, MPI_INT, x->comm),
                    MPI_Ialltoall(sc, 1, MPI_INT, got, 1, MPI_INT, x->comm, &rq));
    if (wd_done(x, e, &rq, "MPI_Alltoall (counts)") < 0) goto out;
    for (int s = 0; s < P; s++) {
        if (got[s] != counts[(size_t)s * P + me]) {
            lrmoe_err("alltoallv: rank %d sends %d rows to rank %d, which expects %lld "
                      "(the ranks disagree about the layout)", s, got[s], me,
                      (long long)counts[(size_t)s * P + me]);
            goto out;
        }
        rc[s] = got[s];
    }
    MPI_Datatype row;
    if ((e = MPI_Type_contiguous((int)es, MPI_BYTE, &row)) != MPI_SUCCESS ||
        (e = MPI_Type_commit(&row)) != MPI_SUCCESS) {
        mpi_fail(e, "MPI_Type_contiguous");
        goto out;
    }
    static char dummy[1];
    /* the counts exchange has lined the ranks up: from here on the time is
     * the transfer's (a2a_sec), not a wait for a slower rank */
    double t1 = lrmoe_now();
    e = WD_CALL(x, rq, MPI_Alltoallv(send[me] ? send[me] : dummy, sc, sd, row,
                                     recv[me] ? recv[me] : dummy, rc, rd, row, x->comm),
                MPI_Ialltoallv(send[me] ? send[me] : dummy, sc, sd, row,
                               recv[me] ? recv[me] : dummy, rc, rd, row, x->comm, &rq));
    e = wd_done(x, e, &rq, "MPI_Alltoallv");
    MPI_Type_free(&row);
    if (e < 0) goto out;
    double t2 = lrmoe_now();
    if (rank_sec) rank_sec[me] += t2 - t0;
    x->a2a_bytes += out * (int64_t)es;
    x->a2a_sec += t2 - t1;
    ret = 0;
out:
    free(v);
    return ret;
}

static int mpi_p2p(lrmoe_comm_t *c, int src, const void *sendbuf, int dst, void *recvbuf,
                   size_t bytes)
{
    mpi_ctx_t *x = mx(c);
    if (src < 0 || src >= c->P || dst < 0 || dst >= c->P)
        return lrmoe_err("p2p: rank out of range (%d -> %d, P=%d)", src, dst, c->P);
    if (src != x->rank && dst != x->rank) return 0;
    if (src == dst) {
        if (bytes && sendbuf != recvbuf) memmove(recvbuf, sendbuf, bytes);
        return 0;
    }
    for (size_t off = 0; off < bytes; off += PIECE) {
        int n = (int)(bytes - off < PIECE ? bytes - off : PIECE), e;
        MPI_Request rq;
        if (src == x->rank)
            e = WD_CALL(x, rq, MPI_Send((const char *)sendbuf + off, n, MPI_BYTE, dst, TAG_P2P,
                                        x->comm),
                        MPI_Isend((const char *)sendbuf + off, n, MPI_BYTE, dst, TAG_P2P,
                                  x->comm, &rq));
        else
            e = WD_CALL(x, rq, MPI_Recv((char *)recvbuf + off, n, MPI_BYTE, src, TAG_P2P,
                                        x->comm, MPI_STATUS_IGNORE),
                        MPI_Irecv((char *)recvbuf + off, n, MPI_BYTE, src, TAG_P2P, x->comm,
                                  &rq));
        if (wd_done(x, e, &rq, src == x->rank ? "MPI_Send" : "MPI_Recv") < 0) return -1;
    }
    if (src == x->rank) x->p2p_bytes += (int64_t)bytes;
    return 0;
}

static void mpi_destroy(lrmoe_comm_t *c)
{
    mpi_ctx_t *x = mx(c);
    if (!x) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) {
        MPI_Comm_free(&x->comm);
        MPI_Comm_free(&x->wd);
    }
    free(x);
    c->ctx = NULL;
}

int lrmoe_comm_mpi_init(lrmoe_comm_t *c, int *argc, char ***argv)
{
    memset(c, 0, sizeof *c);
    int inited = 0, prov = 0, e;
    MPI_Initialized(&inited);
    if (!inited && (e = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &prov)) != MPI_SUCCESS)
        return mpi_fail(e, "MPI_Init_thread");
    mpi_ctx_t *x = calloc(1, sizeof *x);
    if (!x) return lrmoe_err("comm: out of memory");
    if ((e = MPI_Comm_dup(MPI_COMM_WORLD, &x->comm)) != MPI_SUCCESS) {
        free(x);
        return mpi_fail(e, "MPI_Comm_dup");
    }
    if ((e = MPI_Comm_dup(MPI_COMM_WORLD, &x->wd)) != MPI_SUCCESS) {
        MPI_Comm_free(&x->comm);
        free(x);
        return mpi_fail(e, "MPI_Comm_dup");
    }
    /* errors come back as return codes (the tool prints and aborts) */
    MPI_Comm_set_errhandler(x->comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(x->wd, MPI_ERRORS_RETURN);
    MPI_Comm_rank(x->comm, &x->rank);
    MPI_Comm_size(x->comm, &x->size);
    MPI_Comm node;
    x->local_rank = 0;
    if (MPI_Comm_split_type(x->comm, MPI_COMM_TYPE_SHARED, x->rank, MPI_INFO_NULL, &node) ==
        MPI_SUCCESS) {
        MPI_Comm_rank(node, &x->local_rank);
        MPI_Comm_free(&node);
    }
    c->P = x->size;
    c->self = x->rank + 1;
    c->backend = LRMOE_BACKEND_CPU;
    c->ctx = x;
    c->alltoallv = mpi_alltoallv;
    c->p2p = mpi_p2p;
    c->destroy = mpi_destroy;
    return 0;
}

int lrmoe_comm_mpi_rank(const lrmoe_comm_t *c) { return mx(c)->rank; }
int lrmoe_comm_mpi_local_rank(const lrmoe_comm_t *c) { return mx(c)->local_rank; }

void lrmoe_comm_mpi_sent(const lrmoe_comm_t *c, int64_t *a2a_bytes, int64_t *p2p_bytes,
                         double *a2a_sec)
{
    if (a2a_bytes) *a2a_bytes = mx(c)->a2a_bytes;
    if (p2p_bytes) *p2p_bytes = mx(c)->p2p_bytes;
    if (a2a_sec) *a2a_sec = mx(c)->a2a_sec;
}

void lrmoe_comm_mpi_reset(lrmoe_comm_t *c)
{
    mx(c)->a2a_bytes = mx(c)->p2p_bytes = 0;
    mx(c)->a2a_sec = 0;
}

void lrmoe_comm_mpi_abort(lrmoe_comm_t *c, int code)
{
    MPI_Abort(c && c->ctx ? mx(c)->comm : MPI_COMM_WORLD, code);
}

int lrmoe_comm_mpi_finalize(lrmoe_comm_t *c)
{
    lrmoe_comm_free(c);
    int e = MPI_Finalize();
    return e == MPI_SUCCESS ? 0 : mpi_fail(e, "MPI_Finalize");
}

int lrmoe_comm_mpi_bcast(lrmoe_comm_t *c, void *buf, size_t n, int root)
{
    for (size_t off = 0; off < n; off += PIECE) {
        int k = (int)(n - off < PIECE ? n - off : PIECE);
        mpi_ctx_t *x = mx(c);
        MPI_Request rq;
        int e = WD_CALL(x, rq, MPI_Bcast((char *)buf + off, k, MPI_BYTE, root, x->comm),
                        MPI_Ibcast((char *)buf + off, k, MPI_BYTE, root, x->comm, &rq));
        if (wd_done(x, e, &rq, "MPI_Bcast") < 0) return -1;
    }
    return 0;
}

/* counts (P) rows as ints with rank-major displacements; -1 past INT_MAX */
static int int_counts(int P, const int64_t *counts, int *ic, int *id)
{
    int64_t acc = 0;
    for (int r = 0; r < P; r++) {
        if (counts[r] < 0 || counts[r] > INT_MAX || acc > INT_MAX)
            return lrmoe_err("more than %d rows in one scatter/gather", INT_MAX);
        ic[r] = (int)counts[r];
        id[r] = (int)acc;
        acc += counts[r];
    }
    return 0;
}

/* Scatter (gather = 0), gather (1) of rows of row_bytes through root, or
 * allgather (2: counts on every rank, root unused). */
static int rows_v(lrmoe_comm_t *c, int gather, size_t row_bytes, const void *sendbuf,
                  const int64_t *counts, void *recvbuf, int64_t mine, int root)
{
    mpi_ctx_t *x = mx(c);
    const int P = c->P;
    if (mine < 0 || mine > INT_MAX) return lrmoe_err("%lld rows in one call", (long long)mine);
    if (row_bytes == 0 || row_bytes > INT_MAX) return lrmoe_err("row of %zu bytes", row_bytes);
    int *v = NULL;
    if (x->rank == root || gather == 2) {
        if (!(v = malloc((size_t)P * 2 * sizeof *v))) return lrmoe_err("out of memory");
        if (int_counts(P, counts, v, v + P) < 0) { free(v); return -1; }
    }
    MPI_Datatype row;
    int e;
    if ((e = MPI_Type_contiguous((int)row_bytes, MPI_BYTE, &row)) != MPI_SUCCESS ||
        (e = MPI_Type_commit(&row)) != MPI_SUCCESS) {
        free(v);
        return mpi_fail(e, "MPI_Type_contiguous");
    }
    static char dummy[1];
    void *sb = sendbuf ? (void *)sendbuf : dummy, *rb = recvbuf ? recvbuf : dummy;
    MPI_Request rq;
    if (gather == 2)
        e = WD_CALL(x, rq, MPI_Allgatherv(sb, (int)mine, row, rb, v, v + P, row, x->comm),
                    MPI_Iallgatherv(sb, (int)mine, row, rb, v, v + P, row, x->comm, &rq));
    else if (gather)
        e = WD_CALL(x, rq, MPI_Gatherv(sb, (int)mine, row, rb, v, v ? v + P : NULL, row, root,
                                       x->comm),
                    MPI_Igatherv(sb, (int)mine, row, rb, v, v ? v + P : NULL, row, root,
                                 x->comm, &rq));
    else
        e = WD_CALL(x, rq, MPI_Scatterv(sb, v, v ? v + P : NULL, row, rb, (int)mine, row, root,
                                        x->comm),
                    MPI_Iscatterv(sb, v, v ? v + P : NULL, row, rb, (int)mine, row, root,
                                  x->comm, &rq));
    e = wd_done(x, e, &rq, gather == 2 ? "MPI_Allgatherv" : gather ? "MPI_Gatherv"
                                                           : "MPI_Scatterv");
    MPI_Type_free(&row);
    free(v);
    return e;
}

int lrmoe_comm_mpi_allgatherv(lrmoe_comm_t *c, size_t row_bytes, const void *sendbuf,
                              int64_t nsend, void *recvbuf, const int64_t *counts)
{
    return rows_v(c, 2, row_bytes, sendbuf, counts, recvbuf, nsend, 0);
}

int lrmoe_comm_mpi_scatterv(lrmoe_comm_t *c, size_t row_bytes, const void *sendbuf,
                            const int64_t *counts, void *recvbuf, int64_t nrecv, int root)
{
    return rows_v(c, 0, row_bytes, sendbuf, counts, recvbuf, nrecv, root);
}

int lrmoe_comm_mpi_gatherv(lrmoe_comm_t *c, size_t row_bytes, const void *sendbuf,
                           int64_t nsend, void *recvbuf, const int64_t *counts, int root)
{
    return rows_v(c, 1, row_bytes, sendbuf, counts, recvbuf, nsend, root);
}

#ifdef LRMOE_HAVE_CUDA
#include <unistd.h>
#include "comm_cuda.h"
#include "cuda_module.h"

static int bcast_cb(void *buf, size_t n, void *arg)
{
    return lrmoe_comm_mpi_bcast((lrmoe_comm_t *)arg, buf, n, 0);
}

int lrmoe_comm_mpi_nccl_devices(void)
{
    return lrmoe_kcu_device_count(); /* < 0 with the reason when none */
}

/* ---- ranks sharing a GPU: every transfer through host memory and MPI */

typedef struct {
    lrmoe_comm_t *mpi;
    lrmoe_kcu_ctx_t *ctx;
} staged_t;

/* bytes from the device to a fresh host buffer (or back: up = 0) */
static int stage(lrmoe_kcu_ctx_t *ctx, int up, void *dev, void *host, size_t bytes)
{
    if (!bytes) return 0;
    if (lrmoe_kcu_use(ctx) < 0) return -1;
    int rc = up ? lrmoe_kcu_d2h(host, dev, bytes) : lrmoe_kcu_h2d(dev, host, bytes);
    return rc < 0 ? -1 : lrmoe_kcu_sync();
}

static int staged_alltoallv(lrmoe_comm_t *c, size_t es, const void *const *send,
                            const int64_t *counts, const int64_t *sdispls, void *const *recv,
                            const int64_t *rdispls, double *rank_sec)
{
    staged_t *st = (staged_t *)c->ctx;
    const int P = c->P, me = c->self - 1;
    int64_t ns = 0, nr = 0; /* extents in elements */
    for (int p = 0; p < P; p++) {
        int64_t a = sdispls[(size_t)me * P + p] + counts[(size_t)me * P + p];
        int64_t b = rdispls[(size_t)me * P + p] + counts[(size_t)p * P + me];
        if (a > ns) ns = a;
        if (b > nr) nr = b;
    }
    char *hs = malloc((size_t)(ns ? ns : 1) * es), *hr = malloc((size_t)(nr ? nr : 1) * es);
    const void **sv = calloc((size_t)P, sizeof *sv);
    void **rv = calloc((size_t)P, sizeof *rv);
    int rc = -1;
    if (!hs || !hr || !sv || !rv) {
        lrmoe_err("alltoallv: out of memory for %lld + %lld host rows", (long long)ns,
                  (long long)nr);
        goto out;
    }
    sv[me] = hs;
    rv[me] = hr;
    if (stage(st->ctx, 1, (void *)send[me], hs, (size_t)ns * es) < 0 ||
        st->mpi->alltoallv(st->mpi, es, sv, counts, sdispls, rv, rdispls, rank_sec) < 0 ||
        stage(st->ctx, 0, recv[me], hr, (size_t)nr * es) < 0)
        goto out;
    rc = 0;
out:
    free(hs); free(hr); free(sv); free(rv);
    return rc;
}

static int staged_p2p(lrmoe_comm_t *c, int src, const void *sendbuf, int dst, void *recvbuf,
                      size_t bytes)
{
    staged_t *st = (staged_t *)c->ctx;
    const int me = c->self - 1;
    if (!bytes || (src != me && dst != me)) return 0;
    if (src == dst) {
        if (lrmoe_kcu_use(st->ctx) < 0 || lrmoe_kcu_d2d(recvbuf, sendbuf, bytes) < 0) return -1;
        return lrmoe_kcu_sync();
    }
    char *h = malloc(bytes);
    if (!h) return lrmoe_err("p2p: out of memory for %zu host bytes", bytes);
    int rc = src == me ? (stage(st->ctx, 1, (void *)sendbuf, h, bytes) < 0 ||
                          st->mpi->p2p(st->mpi, src, h, dst, NULL, bytes) < 0 ? -1 : 0)
                       : (st->mpi->p2p(st->mpi, src, NULL, dst, h, bytes) < 0 ||
                          stage(st->ctx, 0, recvbuf, h, bytes) < 0 ? -1 : 0);
    free(h);
    return rc;
}

static void staged_destroy(lrmoe_comm_t *c)
{
    free(c->ctx);
    c->ctx = NULL;
}

int lrmoe_comm_mpi_nccl_is_nccl(const lrmoe_comm_t *gpu)
{
    return gpu->alltoallv != staged_alltoallv;
}

/* "host/PCI bus id" of this rank's GPU from every rank: 1 when two ranks
 * share one (the same answer on every rank). */
static int shared_gpu(lrmoe_comm_t *mpi, lrmoe_kcu_ctx_t *ctx, int *shared)
{
    enum { KEY = 192 };
    char key[KEY], *all = NULL;
    memset(key, 0, sizeof key);
    if (gethostname(key, 96) != 0) snprintf(key, 96, "?");
    key[95] = 0;
    size_t n = strlen(key);
    key[n++] = '/';
    if (lrmoe_comm_cuda_device_key(ctx, key + n, KEY - n - 1) < 0) return -1;
    if (!(all = malloc((size_t)mpi->P * KEY))) return lrmoe_err("out of memory");
    int e = MPI_Allgather(key, KEY, MPI_BYTE, all, KEY, MPI_BYTE, mx(mpi)->comm);
    if (e != MPI_SUCCESS) { free(all); return mpi_fail(e, "MPI_Allgather"); }
    *shared = 0;
    for (int a = 0; a < mpi->P && !*shared; a++)
        for (int b = a + 1; b < mpi->P; b++)
            if (!memcmp(all + (size_t)a * KEY, all + (size_t)b * KEY, KEY)) { *shared = 1; break; }
    free(all);
    return 0;
}

/* The communicator of this MPI rank: one GPU per rank, the one of index
 * (local rank mod visible devices) on this host; NCCL with rank 0's
 * ncclUniqueId broadcast over MPI (so it spans hosts), or staged through
 * MPI when ranks share a GPU. */
int lrmoe_comm_mpi_nccl_init(lrmoe_comm_t *mpi, int nstreams, lrmoe_kcu_ctx_t **ctx,
                             lrmoe_comm_t *out)
{
    memset(out, 0, sizeof *out);
    int n = lrmoe_comm_mpi_nccl_devices(), shared = 0;
    if (n < 1) return lrmoe_err_prefix("backend cuda: no usable CUDA device");
    if (lrmoe_kcu_ctx_create(mx(mpi)->local_rank % n, nstreams, ctx) < 0) return -1;
    int rc = shared_gpu(mpi, *ctx, &shared);
    if (!rc && !shared) {
        rc = lrmoe_comm_cuda_init_rank(out, mpi->P, mx(mpi)->rank, *ctx, bcast_cb, mpi);
    } else if (!rc) {
        staged_t *st = calloc(1, sizeof *st);
        if (!st) {
            rc = lrmoe_err("out of memory");
        } else {
            st->mpi = mpi;
            st->ctx = *ctx;
            out->P = mpi->P;
            out->self = mpi->self;
            out->backend = LRMOE_BACKEND_CUDA;
            out->ctx = st;
            out->alltoallv = staged_alltoallv;
            out->p2p = staged_p2p;
            out->destroy = staged_destroy;
        }
    }
    if (rc < 0) {
        lrmoe_kcu_ctx_destroy(*ctx);
        *ctx = NULL;
        return -1;
    }
    out->device = *ctx;
    return 0;
}

void lrmoe_comm_mpi_nccl_free(lrmoe_comm_t *gpu, lrmoe_kcu_ctx_t *ctx)
{
    lrmoe_comm_free(gpu);
    lrmoe_kcu_ctx_destroy(ctx);
}
#endif

#else /* no MPI in this build */

#define NOT_BUILT "MPI support is not built (install libopenmpi-dev and openmpi-bin, " \
                  "then rebuild: make clean all)"

int lrmoe_comm_mpi_built(void) { return 0; }
void lrmoe_comm_mpi_set_timeout(lrmoe_comm_t *c, double seconds) { (void)c; (void)seconds; }
int lrmoe_comm_mpi_idle(lrmoe_comm_t *c, int idle) { (void)c; (void)idle; return 0; }
int lrmoe_comm_mpi_init(lrmoe_comm_t *c, int *argc, char ***argv)
{
    (void)argc; (void)argv;
    memset(c, 0, sizeof *c);
    return lrmoe_err(NOT_BUILT);
}
int lrmoe_comm_mpi_rank(const lrmoe_comm_t *c) { (void)c; return 0; }
int lrmoe_comm_mpi_local_rank(const lrmoe_comm_t *c) { (void)c; return 0; }
void lrmoe_comm_mpi_sent(const lrmoe_comm_t *c, int64_t *a, int64_t *p, double *s)
{
    (void)c;
    if (a) *a = 0;
    if (p) *p = 0;
    if (s) *s = 0;
}
void lrmoe_comm_mpi_reset(lrmoe_comm_t *c) { (void)c; }
void lrmoe_comm_mpi_abort(lrmoe_comm_t *c, int code) { (void)c; (void)code; }
int lrmoe_comm_mpi_finalize(lrmoe_comm_t *c) { (void)c; return lrmoe_err(NOT_BUILT); }
int lrmoe_comm_mpi_bcast(lrmoe_comm_t *c, void *buf, size_t n, int root)
{
    (void)c; (void)buf; (void)n; (void)root;
    return lrmoe_err(NOT_BUILT);
}
int lrmoe_comm_mpi_scatterv(lrmoe_comm_t *c, size_t row_bytes, const void *sendbuf,
                            const int64_t *counts, void *recvbuf, int64_t nrecv, int root)
{
    (void)c; (void)row_bytes; (void)sendbuf; (void)counts; (void)recvbuf; (void)nrecv;
    (void)root;
    return lrmoe_err(NOT_BUILT);
}
int lrmoe_comm_mpi_gatherv(lrmoe_comm_t *c, size_t row_bytes, const void *sendbuf,
                           int64_t nsend, void *recvbuf, const int64_t *counts, int root)
{
    (void)c; (void)row_bytes; (void)sendbuf; (void)nsend; (void)recvbuf; (void)counts;
    (void)root;
    return lrmoe_err(NOT_BUILT);
}
int lrmoe_comm_mpi_allgatherv(lrmoe_comm_t *c, size_t row_bytes, const void *sendbuf,
                              int64_t nsend, void *recvbuf, const int64_t *counts)
{
    (void)c; (void)row_bytes; (void)sendbuf; (void)nsend; (void)recvbuf; (void)counts;
    return lrmoe_err(NOT_BUILT);
}
#endif
