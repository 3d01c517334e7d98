/* lrmoe-exec under MPI: rank 0 scatters each job's shares, every process
 * runs its rank of the CPU backend, rank 0 gathers (see exec_mpi.h). All MPI
 * calls go through comm.h, so this file builds with and without MPI. */
#include <stdlib.h>
#include <string.h>
#include "exec_mpi.h"
#include "exec_internal.h"
#include "gemm_cpu.h"
#include "lrmoe.h"
#include "clock.h"
#include "crc64.h"
#include "crc64_par.h"
#include "weights_map.h"

struct lrmoe_exec_mpi_layer {
    int loaded;            /* the fields below are set (a mapped stream: at the
                            * first job of the layer) */
    int64_t layer, E, F, D;
    uint64_t digest;       /* of the whole w_gate, w_up, w_down (weights_digest) */
    lrmoe_dtype_t dtype;
    const void *w[3];      /* w_gate, w_up, w_down: global shape; in the mapped
                            * stream (all experts there), or a copy (owned)
                            * holding the native experts only */
    int owned;
    float *f32;            /* (E, 3*F*D) packed F32, native experts only; made at
                            * the first f32-compute job (bf16 compute needs none) */
};

enum { OP_END = 0, OP_FWD = 1, OP_BWD = 2 };
enum { HAVE_PLAN = 1, HAVE_PHI = 2, HAVE_SG = 4, HAVE_SU = 8, HAVE_PO = 16, HAVE_PACKRANK = 32 };

/* What rank 0 broadcasts before every job (int64s and one char array of a
 * multiple of 8 bytes, no padding, for one MPI_BYTE bcast).
 * compute: the CPU GEMM numerics rank 0 resolved (f32 or bf16, never auto),
 * which every rank uses: `auto` resolved per host could differ between hosts
 * (a rank whose CPU or oneDNN lacks native BF16 would pick f32).
 * kernel, dnnl_version, dnnl_impl: with bf16, rank 0's GEMM kernel
 * (lrmoe_gemm_kernel_t), which every rank pins or fails naming what it lacks
 * (a kernel chosen per host could differ too: one frame, two kernels). */
typedef struct {
    int64_t op, layer, T, E, K, D, F, P, R, mode, act, grad, wdtype, have, allow_nonfinite,
        compute, backend, kernel, dnnl_version, step, wdigest;
    char dnnl_impl[48];
} hdr_t;
_Static_assert(sizeof ((hdr_t *)0)->dnnl_impl == sizeof ((lrmoe_gemm_kernel_t *)0)->dnnl_impl,
               "the header carries lrmoe_gemm_kernel_t's dnnl_impl whole");
_Static_assert(sizeof(hdr_t) % 8 == 0, "no padding in the header");

/* The rows of one tensor a rank holds. */
enum { SEL_TOK, SEL_TOKPAIR, SEL_PAIR_ON, SEL_TOK_ON, SEL_PACK_SRC, SEL_PACK_DST, SEL_NATIVE };
typedef struct { int64_t n, lo; int64_t *idx; } sel_t;   /* idx NULL: rows [lo, lo+n) */

/* One job as every rank sees it (exec_cpu.c's job_t is one rank's compute
 * of a job). Metadata pointers are the caller's on rank 0 and owned
 * elsewhere. Every buffer job_alloc gives it is listed in own (grown as
 * needed) and freed by job_free; a zeroed mpi_job_t owns nothing. */
typedef struct {
    hdr_t h;
    int P, me;
    const int32_t *ids, *pair_rank, *pack_rank;
    const float *tw;
    const uint8_t *placement, *keep;
    const int64_t *fwd_alloc, *pack_pair, *pack_counts, *pack_offsets;
    void **own;
    size_t nown, own_cap;
} mpi_job_t;

/* n zeroed bytes owned by the job, or NULL (out of memory) */
static void *job_alloc(mpi_job_t *J, size_t n)
{
    if (J->nown == J->own_cap) {
        size_t cap = J->own_cap ? 2 * J->own_cap : 16;
        void **own = realloc(J->own, cap * sizeof *own);
        if (!own) return NULL;
        J->own = own;
        J->own_cap = cap;
    }
    void *p = calloc(n ? n : 1, 1);
    if (p) J->own[J->nown++] = p;
    return p;
}

static void job_free(mpi_job_t *J)
{
    for (size_t i = 0; i < J->nown; i++) free(J->own[i]);
    free(J->own);
    J->own = NULL;
    J->nown = J->own_cap = 0;
}

static int sel_make(const mpi_job_t *J, int kind, int r, sel_t *s)
{
    const hdr_t *h = &J->h;
    const int P = J->P;
    memset(s, 0, sizeof *s);
    int64_t tlo = h->T * r / P, thi = h->T * (r + 1) / P;
    switch (kind) {
    case SEL_TOK: s->lo = tlo; s->n = thi - tlo; return 0;
    case SEL_TOKPAIR: s->lo = tlo * h->K; s->n = (thi - tlo) * h->K; return 0;
    case SEL_PACK_DST:
        s->lo = J->pack_offsets[(int64_t)r * h->E];
        for (int64_t e = 0; e < h->E; e++) s->n += J->pack_counts[(int64_t)r * h->E + e];
        return 0;
    case SEL_NATIVE:
        s->lo = -1;
        for (int64_t e = 0; e < h->E; e++)
            if (lrmoe_exec_native(e, h->E, P) == r) {
                if (s->lo < 0) s->lo = e;
                s->n++;
            }
        if (s->lo < 0) s->lo = 0;
        return 0;
    default: break;
    }
    int64_t cap = kind == SEL_PACK_SRC ? h->R : kind == SEL_TOK_ON ? h->T : h->T * h->K;
    s->idx = malloc((size_t)(cap > 0 ? cap : 1) * sizeof *s->idx);
    if (!s->idx) return lrmoe_err("out of memory (row index)");
    if (kind == SEL_PAIR_ON) {
        for (int64_t u = 0; u < cap; u++)
            if (J->pair_rank[u] == r) s->idx[s->n++] = u;
    } else if (kind == SEL_TOK_ON) {
        for (int64_t t = 0; t < cap; t++)
            for (int64_t k = 0; k < h->K; k++)
                if (J->pair_rank[t * h->K + k] == r) { s->idx[s->n++] = t; break; }
    } else { /* SEL_PACK_SRC */
        for (int64_t i = 0; i < cap; i++)
            if (lrmoe_exec_token_owner(J->pack_pair[i] / h->K, h->T, P) == r)
                s->idx[s->n++] = i;
    }
    return 0;
}

static int sel_contiguous(int kind)
{
    return kind == SEL_TOK || kind == SEL_TOKPAIR || kind == SEL_PACK_DST || kind == SEL_NATIVE;
}

/* rows of s between a global-shaped array and a packed buffer */
static void sel_pack(const sel_t *s, size_t rowb, const void *arr, char *buf)
{
    for (int64_t j = 0; j < s->n; j++)
        memcpy(buf + (size_t)j * rowb, (const char *)arr + (size_t)s->idx[j] * rowb, rowb);
}

static void sel_unpack(const sel_t *s, size_t rowb, const char *buf, void *arr)
{
    for (int64_t j = 0; j < s->n; j++)
        memcpy((char *)arr + (size_t)s->idx[j] * rowb, buf + (size_t)j * rowb, rowb);
}

/* Move one tensor's rows: scatter (from rank 0's src into every rank's loc)
 * or gather (from every rank's loc into rank 0's src). Contiguous row sets
 * lie rank after rank from row 0, so they move without a copy. */
static int move_rows(lrmoe_exec_mpi_t *m, const mpi_job_t *J, int gather, int kind, size_t rowb,
                     void *src, void *loc)
{
    const int P = J->P, me = J->me;
    sel_t mine;
    int64_t *counts = NULL;
    char *buf = NULL, *mbuf = NULL;
    int rc = -1;
    if (sel_make(J, kind, me, &mine) < 0) return -1;
    int64_t total = 0;
    if (me == 0) {
        if (!(counts = malloc((size_t)P * sizeof *counts))) { lrmoe_err("out of memory"); goto out; }
        for (int r = 0; r < P; r++) {
            sel_t s;
            if (sel_make(J, kind, r, &s) < 0) goto out;
            counts[r] = s.n;
            total += s.n;
            free(s.idx);
        }
    }
    double t0 = lrmoe_now();
    if (sel_contiguous(kind)) {
        char *l = (char *)loc + (size_t)mine.lo * rowb;
        rc = gather ? lrmoe_comm_mpi_gatherv(&m->comm, rowb, l, mine.n, src, counts, 0)
                    : lrmoe_comm_mpi_scatterv(&m->comm, rowb, src, counts, l, mine.n, 0);
    } else {
        if (!(mbuf = malloc((size_t)(mine.n ? mine.n : 1) * rowb)) ||
            (me == 0 && !(buf = malloc((size_t)(total ? total : 1) * rowb)))) {
            lrmoe_err("out of memory (%lld rows of %zu bytes)", (long long)(me ? mine.n : total),
                      rowb);
            goto out;
        }
        if (gather) sel_pack(&mine, rowb, loc, mbuf);
        int64_t at = 0;
        for (int r = 0; me == 0 && !gather && r < P; r++) { /* pack per rank */
            sel_t s;
            if (sel_make(J, kind, r, &s) < 0) goto out;
            sel_pack(&s, rowb, src, buf + (size_t)at * rowb);
            at += s.n;
            free(s.idx);
        }
        rc = gather ? lrmoe_comm_mpi_gatherv(&m->comm, rowb, mbuf, mine.n, buf, counts, 0)
                    : lrmoe_comm_mpi_scatterv(&m->comm, rowb, buf, counts, mbuf, mine.n, 0);
        if (!rc && !gather) sel_unpack(&mine, rowb, mbuf, loc);
        at = 0;
        for (int r = 0; !rc && me == 0 && gather && r < P; r++) {
            sel_t s;
            if ((rc = sel_make(J, kind, r, &s)) < 0) break;
            sel_unpack(&s, rowb, buf + (size_t)at * rowb, src);
            at += s.n;
            free(s.idx);
        }
    }
    if (me == 0) {
        double dt = lrmoe_now() - t0;
        if (gather) { m->gather_s += dt; m->gather_bytes += total * (int64_t)rowb; }
        else { m->scatter_s += dt; m->scatter_bytes += total * (int64_t)rowb; }
    }
out:
    free(mine.idx); free(counts); free(buf); free(mbuf);
    return rc;
}

/* A metadata array: rank 0's (*p, the caller's) to every rank (allocated). */
static int meta(lrmoe_exec_mpi_t *m, mpi_job_t *J, const void **p, size_t bytes)
{
    if (J->me != 0 && !(*p = job_alloc(J, bytes))) return lrmoe_err("out of memory");
    return lrmoe_comm_mpi_bcast(&m->comm, (void *)*p, bytes, 0);
}

/* ---------------------------------------------------------------- weights */

/* The digest of one layer's weights: the CRC-64 (crc64_par.h) of dtype, E,
 * F, D (8 bytes little-endian each), then w_gate, w_up, w_down (E*F*D each),
 * on up to `threads` threads (-@; 0: the CPUs this process may run on):
 * each rank maps or reads --weights itself, and a host with a stale copy
 * of the same shapes must not compute with it. Not cryptographic: it tells
 * copies apart, it does not resist forgery. A tensor in a mapped stream
 * whose frame's CRC-64 record was checked (wm, may be NULL) has its CRC
 * from that check (lrmoe_weights_map_crc): combined, not hashed again. */
static uint64_t weights_digest(const void *const w[3], int64_t E, int64_t F, int64_t D,
                               lrmoe_dtype_t dt, int threads, const lrmoe_wmap_t *wm)
{
    const size_t n = (size_t)(E * F * D) * lrmoe_dtype_size(dt);
    const uint64_t v[4] = {(uint64_t)dt, (uint64_t)E, (uint64_t)F, (uint64_t)D};
    uint8_t b[32];
    for (int i = 0; i < 32; i++) b[i] = (uint8_t)(v[i / 8] >> (8 * (i % 8)));
    uint64_t h = lrmoe_crc64_update(0, b, sizeof b);
    for (int j = 0; j < 3; j++) {
        uint64_t c;
        if (!w[j]) continue;
        h = lrmoe_weights_map_crc(wm, w[j], n, &c) ? lrmoe_crc64_combine(h, c, n)
                                                   : lrmoe_crc64_par(h, w[j], n, threads,
                                                                     LRMOE_CRC64_PIECE);
    }
    return h;
}

struct lrmoe_exec_mpi_digest { int64_t layer; const void *w[3]; uint64_t d; };

/* The digest of the weights w of a job (computed once per layer and arrays). */
static int job_digest(lrmoe_exec_mpi_t *m, int64_t layer, const lrmoe_exec_dims_t *d,
                      const lrmoe_exec_weights_t *w, int threads, uint64_t *out)
{
    for (int i = 0; i < m->ndigests; i++) {
        struct lrmoe_exec_mpi_digest *g = &m->digests[i];
        if (g->layer == layer && g->w[0] == w->w_gate && g->w[1] == w->w_up &&
            g->w[2] == w->w_down) {
            *out = g->d;
            return 0;
        }
    }
    if (!w->w_gate || !w->w_up || !w->w_down)
        return lrmoe_err("exec under MPI: the weights of layer %lld are missing",
                         (long long)layer);
    struct lrmoe_exec_mpi_digest *g =
        realloc(m->digests, (size_t)(m->ndigests + 1) * sizeof *g);
    if (!g) return lrmoe_err("out of memory");
    m->digests = g;
    g += m->ndigests++;
    g->layer = layer;
    g->w[0] = w->w_gate; g->w[1] = w->w_up; g->w[2] = w->w_down;
    g->d = weights_digest(g->w, d->E, d->F, d->D, w->dtype, threads, m->wmap);
    *out = g->d;
    return 0;
}

/* Ranks > 0: the weights stream closed (its mapping too), if open */
static void wsrc_close(lrmoe_exec_mpi_t *m)
{
    if (!m->wsrc) return;
    lrmoe_weights_close(&m->wsrc->W, &m->wsrc->wm);
    free(m->wsrc);
    m->wsrc = NULL;
}

static void layers_free(lrmoe_exec_mpi_t *m)
{
    wsrc_close(m);
    for (int i = 0; i < m->nlayers; i++) {
        for (int j = 0; j < 3; j++)
            if (m->layers[i].owned) free((void *)m->layers[i].w[j]);
        free(m->layers[i].f32);
    }
    free(m->layers);
    m->layers = NULL;
    m->nlayers = 0;
    free(m->digests);
    m->digests = NULL;
    m->ndigests = 0;
}

/* Layer i of the open weights stream W (m->layers[i]): its shapes, the
 * digest of all its experts (as rank 0 digests them) and its weights: in
 * place when W is mapped (its frame's digest record checked first), else
 * a copy of its native experts only (the others are never read: replicas
 * come from the owner by p2p). */
static int layer_load(lrmoe_exec_mpi_t *m, int i, int allow_nonfinite, int threads)
{
    static const char *nm[3] = {"w_gate", "w_up", "w_down"};
    const lrmoe_weights_t *W = &m->wsrc->W;
    struct lrmoe_exec_mpi_layer *L = &m->layers[i];
    for (int j = 0; j < 3; j++) { /* an earlier try that failed */
        if (L->owned) free((void *)L->w[j]);
        L->w[j] = NULL;
    }
    L->owned = 0;
    if (lrmoe_weights_use(&m->wsrc->wm, W, &W->frames[i]) < 0) return -1;
    lrmoe_tensor_t *t[3];
    for (int j = 0; j < 3; j++)
        if (!(t[j] = lrmoe_frame_need(&W->frames[i], nm[j])) || t[j]->ndim != 3)
            return lrmoe_err("%s: layer %lld: %s missing or not 3-D", m->weights,
                             (long long)L->layer, nm[j]);
    L->E = t[0]->shape[0]; L->F = t[0]->shape[1]; L->D = t[0]->shape[2];
    L->dtype = t[0]->dtype;
    const size_t n = (size_t)(L->F * L->D), es = lrmoe_dtype_size(L->dtype);
    for (int j = 0; j < 3; j++)
        if (lrmoe_tensor_numel(t[j]) != L->E * (int64_t)n || t[j]->dtype != L->dtype)
            return lrmoe_err("%s: layer %lld: w_gate, w_up, w_down differ in shape or dtype",
                             m->weights, (long long)L->layer);
    const void *wa[3] = {t[0]->data, t[1]->data, t[2]->data};
    L->digest = weights_digest(wa, L->E, L->F, L->D, L->dtype, threads, &m->wsrc->wm);
    /* a mapped stream stays open: its tensors are used in place (no copy,
     * no fresh pages); a read one is closed after the load: the native
     * experts are copied */
    const int copy = !m->wsrc->wm.base;
    void *cw[3] = {NULL, NULL, NULL};
    for (int j = 0; j < 3; j++) {
        if (copy && !(cw[j] = calloc((size_t)L->E * n, es))) {
            for (int k = 0; k < j; k++) free(cw[k]);
            return lrmoe_err("out of memory");
        }
        L->w[j] = copy ? cw[j] : t[j]->data;
    }
    L->owned = copy;
    for (int64_t e = 0; e < L->E; e++) {
        if (L->E < m->P || lrmoe_exec_native(e, L->E, m->P) != m->rank) continue;
        for (int j = 0; j < 3; j++) {
            const char *s = (const char *)t[j]->data + (size_t)e * n * es;
            if (!allow_nonfinite && lrmoe_exec_check_finite(L->dtype, s, n, nm[j]) < 0)
                return lrmoe_err_prefix("%s: layer %lld: expert %lld", m->weights,
                                        (long long)L->layer, (long long)e);
            if (copy) memcpy((char *)cw[j] + (size_t)e * n * es, s, n * es);
        }
    }
    L->loaded = 1;
    return 0;
}

/* Ranks > 0, first job: the weights stream opened as rank 0 opens it
 * (lib/weights_map.h). A raw file stays mapped, and each layer is loaded
 * (layer_load) at its first job: a rank reads only the layers its jobs
 * use. Any other stream is read whole, every layer loaded, and closed. */
static int layers_open(lrmoe_exec_mpi_t *m, int allow_nonfinite, int threads)
{
    if (!(m->wsrc = calloc(1, sizeof *m->wsrc))) return lrmoe_err("out of memory");
    if (lrmoe_weights_open(m->weights, &m->wsrc->W, &m->wsrc->wm, threads) < 0) {
        free(m->wsrc);
        m->wsrc = NULL;
        return -1;
    }
    const lrmoe_weights_t *W = &m->wsrc->W;
    if (!(m->layers = calloc((size_t)(W->n ? W->n : 1), sizeof *m->layers))) {
        wsrc_close(m);
        return lrmoe_err("out of memory");
    }
    m->nlayers = W->n;
    for (int i = 0; i < W->n; i++) m->layers[i].layer = W->layer[i];
    if (m->wsrc->wm.base) return 0;
    int rc = 0;
    for (int i = 0; i < W->n && !rc; i++) rc = layer_load(m, i, allow_nonfinite, threads);
    wsrc_close(m);
    return rc;
}

/* The packed F32 copy [gate; up; down] of L's native experts (f32 compute). */
static int layer_f32(lrmoe_exec_mpi_t *m, struct lrmoe_exec_mpi_layer *L)
{
    if (L->f32) return 0;
    const size_t n = (size_t)(L->F * L->D), es = lrmoe_dtype_size(L->dtype);
    if (!(L->f32 = calloc((size_t)L->E * 3 * n, sizeof(float))))
        return lrmoe_err("%s: layer %lld: out of memory for the F32 copy", m->weights,
                         (long long)L->layer);
    for (int64_t e = 0; e < L->E; e++) {
        if (L->E < m->P || lrmoe_exec_native(e, L->E, m->P) != m->rank) continue;
        for (int j = 0; j < 3; j++)
            lrmoe_convert_to_f32(L->dtype, (const char *)L->w[j] + (size_t)e * n * es,
                                 L->f32 + ((size_t)e * 3 + j) * n, n);
    }
    return 0;
}

static int rank_weights(lrmoe_exec_mpi_t *m, const hdr_t *h, int threads, lrmoe_exec_weights_t *w)
{
    if (!m->layers && layers_open(m, (int)h->allow_nonfinite, threads) < 0) return -1;
    for (int i = 0; i < m->nlayers; i++) {
        struct lrmoe_exec_mpi_layer *L = &m->layers[i];
        if (L->layer != h->layer) continue;
        if (!L->loaded && (!m->wsrc || layer_load(m, i, (int)h->allow_nonfinite, threads) < 0))
            return m->wsrc ? -1 : lrmoe_err("%s: layer %lld failed to load", m->weights,
                                            (long long)h->layer);
        if (L->E != h->E || L->F != h->F || L->D != h->D || (int64_t)L->dtype != h->wdtype)
            return lrmoe_err("%s: layer %lld is [%lld,%lld,%lld] %s here but rank 0's is "
                             "[%lld,%lld,%lld] %s", m->weights, (long long)h->layer,
                             (long long)L->E, (long long)L->F, (long long)L->D,
                             lrmoe_dtype_name(L->dtype), (long long)h->E, (long long)h->F,
                             (long long)h->D, lrmoe_dtype_name((lrmoe_dtype_t)h->wdtype));
        if (L->digest != (uint64_t)h->wdigest)
            return lrmoe_err("%s: layer %lld differs from rank 0's copy (weights digest "
                             "%016llx here, %016llx on rank 0): a stale or other copy of "
                             "--weights on this host?", m->weights, (long long)h->layer,
                             (unsigned long long)L->digest, (unsigned long long)h->wdigest);
        int f32 = h->backend == LRMOE_BACKEND_CPU && h->compute == LRMOE_COMPUTE_F32 &&
                  (L->dtype == LRMOE_F32 || L->dtype == LRMOE_BF16);
        if (f32 && layer_f32(m, L) < 0) return -1;
        memset(w, 0, sizeof *w);
        w->dtype = L->dtype;
        w->w_gate = L->w[0]; w->w_up = L->w[1]; w->w_down = L->w[2];
        w->w_f32 = f32 ? L->f32 : NULL;
        return 0;
    }
    return lrmoe_err("%s: no frame for layer %lld", m->weights, (long long)h->layer);
}

/* ---------------------------------------------------------------- jobs */

/* The exec configuration of a job on this rank: the caller's, with rank 0's
 * backend and numerics and this rank's communicator (for CUDA: the NCCL one,
 * made at the first CUDA job; every rank reaches it at the same job). */
static int job_cfg(lrmoe_exec_mpi_t *m, const lrmoe_exec_cfg_t *cfg, const hdr_t *h,
                   lrmoe_exec_cfg_t *c)
{
    *c = *cfg;
    c->comm = &m->comm;
    c->compute = (int)h->compute;
    c->backend = (lrmoe_backend_t)h->backend;
    if (h->backend != LRMOE_BACKEND_CUDA) return 0;
#if defined(LRMOE_HAVE_MPI) && defined(LRMOE_HAVE_CUDA)
    if (!m->gpu_ok) {
        if (lrmoe_comm_mpi_nccl_init(&m->comm, cfg->gemm_streams > 0 ? cfg->gemm_streams : 4,
                                     &m->gpu_ctx, &m->gpu) < 0)
            return -1;
        m->gpu_ok = 1;
    }
    c->comm = &m->gpu;
    return 0;
#else
    return lrmoe_err("backend cuda under MPI: this build has no CUDA support");
#endif
}

/* The bf16 compute: every rank pins rank 0's GEMM kernel (the header's), so
 * that one job is computed by one kernel, or the job ends with one message,
 * from the lowest rank that cannot run it, saying what it lacks: that rank
 * returns its error (its caller prints it and aborts the job), the others
 * wait in a collective it never joins, which its MPI_Abort ends. A
 * collective of every rank, right after the header. */
static int job_kernel(lrmoe_exec_mpi_t *m, mpi_job_t *J)
{
    const hdr_t *h = &J->h;
    if (h->backend != LRMOE_BACKEND_CPU || h->compute != LRMOE_COMPUTE_BF16) return 0;
    lrmoe_gemm_kernel_t k;
    memset(&k, 0, sizeof k);
    k.kind = (int)h->kernel;
    k.dnnl_version = (int)h->dnnl_version;
    memcpy(k.dnnl_impl, h->dnnl_impl, sizeof k.dnnl_impl);
    k.dnnl_impl[sizeof k.dnnl_impl - 1] = 0;
    int64_t bad = k.kind == LRMOE_KERNEL_NONE
                      ? lrmoe_err("job header: compute bf16 without a kernel (bad header from "
                                  "rank 0)") < 0
                      : lrmoe_gemm_kernel_pin(&k) < 0;
    int64_t *all = job_alloc(J, (size_t)J->P * sizeof *all),
            *ones = job_alloc(J, (size_t)J->P * sizeof *ones);
    if (!all || !ones) return lrmoe_err("out of memory");
    for (int r = 0; r < J->P; r++) ones[r] = 1;
    char why[512];
    snprintf(why, sizeof why, "%s", bad ? lrmoe_errmsg() : "");
    if (lrmoe_comm_mpi_allgatherv(&m->comm, sizeof bad, &bad, 1, all, ones) < 0) return -1;
    int first = -1;
    for (int r = 0; r < J->P && first < 0; r++)
        if (all[r]) first = r;
    if (first < 0) return 0;
    if (first == J->me) return lrmoe_err("%s", why);
    int64_t never = 0;
    lrmoe_comm_mpi_bcast(&m->comm, &never, sizeof never, first);
    return lrmoe_err("rank %d cannot run the job's bf16 kernel", first);
}

static int job_meta(lrmoe_exec_mpi_t *m, mpi_job_t *J, const lrmoe_exec_plan_t *plan,
                    lrmoe_exec_plan_t *lp)
{
    const hdr_t *h = &J->h;
    const size_t TK = (size_t)(h->T * h->K), EP = (size_t)(h->E * h->P);
    memset(lp, 0, sizeof *lp);
    if (meta(m, J, (const void **)&J->ids, TK * sizeof(int32_t)) < 0 ||
        meta(m, J, (const void **)&J->tw, TK * sizeof(float)) < 0)
        return -1;
    if (h->have & HAVE_PLAN) {
        if (J->me == 0) { J->placement = plan->placement; J->fwd_alloc = plan->fwd_alloc; }
        if (meta(m, J, (const void **)&J->placement, EP) < 0 ||
            meta(m, J, (const void **)&J->fwd_alloc, EP * sizeof(int64_t)) < 0)
            return -1;
        lp->placement = J->placement;
        lp->fwd_alloc = J->fwd_alloc;
    }
    return 0;
}

/* This rank's bytes sent by all-to-all and p2p and its all-to-all seconds
 * since the job's exec call started (read right after it). */
static void job_sent(lrmoe_exec_mpi_t *m, double sent[3])
{
    int64_t a2a = 0, p2p = 0;
    double a2a_s = 0;
    lrmoe_comm_mpi_sent(&m->comm, &a2a, &p2p, &a2a_s);
#if defined(LRMOE_HAVE_MPI) && defined(LRMOE_HAVE_CUDA)
    if (m->gpu_ok) { /* what crossed NCCL */
        int64_t ga = 0, gp = 0;
        double gs = 0;
        lrmoe_comm_cuda_rank_take(&m->gpu, &ga, &gp, &gs);
        a2a += ga; p2p += gp; a2a_s += gs;
    }
#endif
    sent[0] = (double)a2a;
    sent[1] = (double)p2p;
    sent[2] = a2a_s;
}

/* This rank's stage times and sent (job_sent) to rank 0 (timings (P,
 * NSTAGES) there), or to every rank with per-rank inputs. */
static int job_stats(lrmoe_exec_mpi_t *m, const mpi_job_t *J, const double *tim, double *timings,
                     const double sent[3])
{
    const int P = J->P;
    const int all_ranks = m->shard;
    double mine[LRMOE_NSTAGES + 3];
    memcpy(mine, tim + (size_t)J->me * LRMOE_NSTAGES, LRMOE_NSTAGES * sizeof *mine);
    memcpy(mine + LRMOE_NSTAGES, sent, 3 * sizeof *mine);
    double *all = NULL;
    int64_t *ones = NULL;
    if (J->me == 0 || all_ranks) {
        all = malloc((size_t)P * sizeof mine);
        ones = malloc((size_t)P * sizeof *ones);
        if (!all || !ones) { free(all); free(ones); return lrmoe_err("out of memory"); }
        for (int r = 0; r < P; r++) ones[r] = 1;
    }
    int rc = all_ranks ? lrmoe_comm_mpi_allgatherv(&m->comm, sizeof mine, mine, 1, all, ones)
                       : lrmoe_comm_mpi_gatherv(&m->comm, sizeof mine, mine, 1, all, ones, 0);
    if (!rc && (J->me == 0 || all_ranks)) {
        for (int r = 0; r < P; r++) {
            const double *v = all + (size_t)r * (LRMOE_NSTAGES + 3);
            if (timings) memcpy(timings + (size_t)r * LRMOE_NSTAGES, v, LRMOE_NSTAGES * sizeof *v);
            m->a2a_bytes[r] = (int64_t)v[LRMOE_NSTAGES];
            m->p2p_bytes[r] = (int64_t)v[LRMOE_NSTAGES + 1];
            m->a2a_s[r] = v[LRMOE_NSTAGES + 2];
        }
    }
    free(all); free(ones);
    return rc;
}

/* Forward on every rank; ca/cplan/w/timings are rank 0's caller's (NULL elsewhere). */
static int job_forward(lrmoe_exec_mpi_t *m, const lrmoe_exec_cfg_t *cfg, mpi_job_t *J,
                       const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *cplan,
                       lrmoe_exec_fwd_t *ca, double *timings)
{
    const hdr_t *h = &J->h;
    const int64_t T = h->T, K = h->K, D = h->D, F = h->F;
    const lrmoe_dtype_t adt = (lrmoe_dtype_t)h->act;
    const size_t as = lrmoe_dtype_size(adt), TK = (size_t)(T * K);
    lrmoe_exec_plan_t lp;
    lrmoe_exec_weights_t lw;
    if (J->me == 0) { J->ids = ca->topk_ids; J->tw = ca->topk_weights; }
    if (job_kernel(m, J) < 0 || job_meta(m, J, cplan, &lp) < 0) return -1;
    if (J->me != 0 && rank_weights(m, h, cfg->threads, &lw) < 0) return -1;
    lrmoe_exec_fwd_t a;
    memset(&a, 0, sizeof a);
    a.act_dtype = adt;
    a.topk_ids = J->ids;
    a.topk_weights = J->tw;
    void *hid = job_alloc(J, (size_t)(T * D) * as);
    a.output = job_alloc(J, (size_t)(T * D) * as);
    a.pair_rank = job_alloc(J, TK * sizeof(int32_t));
    if (h->have & HAVE_PHI) a.phi_sqnorm = job_alloc(J, TK * sizeof(float));
    if (h->have & HAVE_SG) a.saved_gate = job_alloc(J, TK * (size_t)F * as);
    if (h->have & HAVE_SU) a.saved_up = job_alloc(J, TK * (size_t)F * as);
    if (h->have & HAVE_PO) a.pair_out = job_alloc(J, TK * (size_t)D * as);
    double *tim = job_alloc(J, (size_t)J->P * LRMOE_NSTAGES * sizeof(double));
    if (!hid || !a.output || !a.pair_rank || !tim || ((h->have & HAVE_PHI) && !a.phi_sqnorm) ||
        ((h->have & HAVE_SG) && !a.saved_gate) || ((h->have & HAVE_SU) && !a.saved_up) ||
        ((h->have & HAVE_PO) && !a.pair_out))
        return lrmoe_err("out of memory (T=%lld, K=%lld, D=%lld, F=%lld)", (long long)T,
                         (long long)K, (long long)D, (long long)F);
    a.hidden = hid;
    if (move_rows(m, J, 0, SEL_TOK, (size_t)D * as, J->me ? NULL : (void *)ca->hidden, hid) < 0)
        return -1;
    lrmoe_exec_cfg_t c;
    if (job_cfg(m, cfg, h, &c) < 0) return -1;
    lrmoe_exec_dims_t d = {T, h->E, K, D, F, J->P};
    lrmoe_comm_mpi_reset(&m->comm);
    if (lrmoe_exec_forward(&c, &d, J->me ? &lw : w, (h->have & HAVE_PLAN) ? &lp : NULL,
                               &a, tim) < 0)
        return -1;
    double sent[3];
    job_sent(m, sent);
    J->pair_rank = a.pair_rank;
    int g = 0;
    g |= move_rows(m, J, 1, SEL_TOK, (size_t)D * as, J->me ? NULL : ca->output, a.output);
    if (!g && a.phi_sqnorm)
        g |= move_rows(m, J, 1, SEL_PAIR_ON, sizeof(float), J->me ? NULL : ca->phi_sqnorm,
                       a.phi_sqnorm);
    if (!g && a.saved_gate)
        g |= move_rows(m, J, 1, SEL_PAIR_ON, (size_t)F * as, J->me ? NULL : ca->saved_gate,
                       a.saved_gate);
    if (!g && a.saved_up)
        g |= move_rows(m, J, 1, SEL_PAIR_ON, (size_t)F * as, J->me ? NULL : ca->saved_up,
                       a.saved_up);
    if (!g && a.pair_out)
        g |= move_rows(m, J, 1, SEL_TOKPAIR, (size_t)D * as, J->me ? NULL : ca->pair_out,
                       a.pair_out);
    if (g) return -1;
    if (J->me == 0) memcpy(ca->pair_rank, a.pair_rank, TK * sizeof(int32_t));
    return job_stats(m, J, tim, timings, sent);
}

static int job_backward(lrmoe_exec_mpi_t *m, const lrmoe_exec_cfg_t *cfg, mpi_job_t *J,
                        const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *cplan,
                        lrmoe_exec_bwd_t *ca, double *timings)
{
    const hdr_t *h = &J->h;
    const int64_t T = h->T, K = h->K, D = h->D, F = h->F, E = h->E, R = h->R;
    const int P = J->P;
    const lrmoe_dtype_t adt = (lrmoe_dtype_t)h->act, gdt = (lrmoe_dtype_t)h->grad;
    const size_t as = lrmoe_dtype_size(adt), gs = lrmoe_dtype_size(gdt), TK = (size_t)(T * K);
    const size_t FD = (size_t)(F * D);
    const lrmoe_exec_mode_t mode = (lrmoe_exec_mode_t)h->mode;
    const int compact = mode == LRMOE_MODE_COMPACT;
    lrmoe_exec_plan_t lp;
    lrmoe_exec_weights_t lw;
    if (J->me == 0) {
        J->ids = ca->topk_ids; J->tw = ca->topk_weights;
        J->pair_rank = ca->pair_rank; J->keep = ca->keep;
        J->pack_pair = ca->pack_pair; J->pack_rank = ca->pack_rank;
        J->pack_counts = ca->pack_counts; J->pack_offsets = ca->pack_offsets;
    }
    if (job_kernel(m, J) < 0 || job_meta(m, J, cplan, &lp) < 0) return -1;
    if (!compact && meta(m, J, (const void **)&J->pair_rank, TK * sizeof(int32_t)) < 0) return -1;
    if (mode == LRMOE_MODE_MASKED && meta(m, J, (const void **)&J->keep, TK) < 0) return -1;
    if (compact &&
        (meta(m, J, (const void **)&J->pack_pair, (size_t)R * sizeof(int64_t)) < 0 ||
         meta(m, J, (const void **)&J->pack_counts, (size_t)(P * E) * sizeof(int64_t)) < 0 ||
         meta(m, J, (const void **)&J->pack_offsets, (size_t)(P * E) * sizeof(int64_t)) < 0 ||
         ((h->have & HAVE_PACKRANK) &&
          meta(m, J, (const void **)&J->pack_rank, (size_t)R * sizeof(int32_t)) < 0)))
        return -1;
    if (J->me != 0 && rank_weights(m, h, cfg->threads, &lw) < 0) return -1;
    lrmoe_exec_bwd_t a;
    memset(&a, 0, sizeof a);
    a.mode = mode;
    a.act_dtype = adt;
    a.grad_dtype = gdt;
    a.topk_ids = J->ids;
    a.topk_weights = J->tw;
    a.pair_rank = J->pair_rank;
    a.keep = J->keep;
    a.R = R;
    a.pack_pair = J->pack_pair; a.pack_rank = J->pack_rank;
    a.pack_counts = J->pack_counts; a.pack_offsets = J->pack_offsets;
    void *go = job_alloc(J, (size_t)(T * D) * gs), *po = job_alloc(J, TK * (size_t)D * as);
    void *hid = NULL, *sg = NULL, *su = NULL, *pg = NULL, *ph = NULL, *pa = NULL, *pu = NULL;
    int ok = go && po;
    if (!compact) {
        ok &= (hid = job_alloc(J, (size_t)(T * D) * as)) && (sg = job_alloc(J, TK * (size_t)F * as)) &&
              (su = job_alloc(J, TK * (size_t)F * as));
    } else {
        ok &= (pg = job_alloc(J, (size_t)(R * D) * sizeof(float))) &&
              (ph = job_alloc(J, (size_t)(R * D) * as)) && (pa = job_alloc(J, (size_t)(R * F) * as)) &&
              (pu = job_alloc(J, (size_t)(R * F) * as));
    }
    a.grad_hidden = job_alloc(J, (size_t)(T * D) * sizeof(float));
    a.grad_topk_weights = job_alloc(J, TK * sizeof(float));
    a.grad_w_gate = job_alloc(J, (size_t)E * FD * sizeof(float));
    a.grad_w_up = job_alloc(J, (size_t)E * FD * sizeof(float));
    a.grad_w_down = job_alloc(J, (size_t)E * FD * sizeof(float));
    double *tim = job_alloc(J, (size_t)P * LRMOE_NSTAGES * sizeof(double));
    if (!ok || !a.grad_hidden || !a.grad_topk_weights || !a.grad_w_gate || !a.grad_w_up ||
        !a.grad_w_down || !tim)
        return lrmoe_err("out of memory (T=%lld, K=%lld, D=%lld, F=%lld, R=%lld)", (long long)T,
                         (long long)K, (long long)D, (long long)F, (long long)R);
    a.grad_output = go; a.pair_out = po;
    a.hidden = hid; a.saved_gate = sg; a.saved_up = su;
    a.pack_grad = pg; a.pack_hidden = ph; a.pack_gate = pa; a.pack_up = pu;
    const int z = J->me != 0;
#define SRC(x) (z ? NULL : (void *)(x))
    int g = move_rows(m, J, 0, SEL_TOK, (size_t)D * gs, SRC(ca->grad_output), go);
    if (!g) g = move_rows(m, J, 0, SEL_TOKPAIR, (size_t)D * as, SRC(ca->pair_out), po);
    if (!g && !compact) {
        g = move_rows(m, J, 0, SEL_TOK_ON, (size_t)D * as, SRC(ca->hidden), hid);
        if (!g) g = move_rows(m, J, 0, SEL_PAIR_ON, (size_t)F * as, SRC(ca->saved_gate), sg);
        if (!g) g = move_rows(m, J, 0, SEL_PAIR_ON, (size_t)F * as, SRC(ca->saved_up), su);
    } else if (!g) {
        g = move_rows(m, J, 0, SEL_PACK_SRC, (size_t)D * sizeof(float), SRC(ca->pack_grad), pg);
        if (!g) g = move_rows(m, J, 0, SEL_PACK_DST, (size_t)D * as, SRC(ca->pack_hidden), ph);
        if (!g) g = move_rows(m, J, 0, SEL_PACK_DST, (size_t)F * as, SRC(ca->pack_gate), pa);
        if (!g) g = move_rows(m, J, 0, SEL_PACK_DST, (size_t)F * as, SRC(ca->pack_up), pu);
    }
    if (g) return -1;
    lrmoe_exec_cfg_t c;
    if (job_cfg(m, cfg, h, &c) < 0) return -1;
    lrmoe_exec_dims_t d = {T, E, K, D, F, P};
    lrmoe_comm_mpi_reset(&m->comm);
    if (lrmoe_exec_backward(&c, &d, z ? &lw : w, (h->have & HAVE_PLAN) ? &lp : NULL, &a,
                                tim) < 0)
        return -1;
    double sent[3];
    job_sent(m, sent);
    g = move_rows(m, J, 1, SEL_TOK, (size_t)D * sizeof(float), SRC(ca->grad_hidden), a.grad_hidden);
    if (!g) g = move_rows(m, J, 1, SEL_TOK, (size_t)K * sizeof(float), SRC(ca->grad_topk_weights),
                          a.grad_topk_weights);
    if (!g) g = move_rows(m, J, 1, SEL_NATIVE, FD * sizeof(float), SRC(ca->grad_w_gate), a.grad_w_gate);
    if (!g) g = move_rows(m, J, 1, SEL_NATIVE, FD * sizeof(float), SRC(ca->grad_w_up), a.grad_w_up);
    if (!g) g = move_rows(m, J, 1, SEL_NATIVE, FD * sizeof(float), SRC(ca->grad_w_down), a.grad_w_down);
#undef SRC
    if (g) return -1;
    return job_stats(m, J, tim, timings, sent);
}

/* ---------------------------------------------------------------- rank 0 */

static int hdr_common(lrmoe_exec_mpi_t *m, const lrmoe_exec_cfg_t *cfg,
                      const lrmoe_exec_dims_t *d, int64_t layer,
                      const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan, hdr_t *h);

/* ---------------------------------------------------------------- per-rank inputs */

/* Rows of a global-shaped array that move between ranks, in the one order
 * every rank walks: MV_TO_PAIR pair rows u from the owner of token u/K to
 * the rank computing u; MV_TO_OWNER back; MV_TOK_TO_PAIRS token rows t from
 * their owner to every other rank computing a pair of t. */
enum { MV_TO_PAIR, MV_TO_OWNER, MV_TOK_TO_PAIRS };

typedef struct {
    int P, me, fill;
    int64_t *counts;         /* (P,P) rows source s -> destination d */
    int64_t *spos, *rpos;    /* (P) next slot per destination / source */
    int64_t *sidx, *ridx;    /* rows this rank sends / receives, in slot order */
} mv_t;

static void mv_add(mv_t *v, int64_t i, int s, int d)
{
    if (s == d) return;
    if (!v->fill) { v->counts[(size_t)s * v->P + d]++; return; }
    if (s == v->me) v->sidx[v->spos[d]++] = i;
    if (d == v->me) v->ridx[v->rpos[s]++] = i;
}

static void mv_walk(const mpi_job_t *J, int kind, mv_t *v)
{
    const int64_t T = J->h.T, K = J->h.K;
    for (int64_t t = 0; t < T; t++) {
        int o = lrmoe_exec_token_owner(t, T, J->P);
        for (int64_t k = 0; k < K; k++) {
            int q = J->pair_rank[t * K + k], dup = 0;
            if (kind == MV_TO_PAIR) mv_add(v, t * K + k, o, q);
            else if (kind == MV_TO_OWNER) mv_add(v, t * K + k, q, o);
            else {
                for (int64_t j = 0; j < k && !dup; j++) dup = J->pair_rank[t * K + j] == q;
                if (!dup) mv_add(v, t, o, q);
            }
        }
    }
}

/* Move the rows of arr (global shape, rows of rowb bytes) as kind says, by
 * all-to-all-v; time and bytes sent go to rank's scatter (out = 0) or
 * gather (out = 1) figures. */
static int redistribute(lrmoe_exec_mpi_t *m, const mpi_job_t *J, int kind, int out, size_t rowb,
                        void *arr)
{
    const int P = J->P, me = J->me;
    mv_t v;
    memset(&v, 0, sizeof v);
    v.P = P; v.me = me;
    int64_t *sd = calloc((size_t)P * P * 3 + 2 * (size_t)P, sizeof *sd);
    const void **sv = calloc((size_t)P, sizeof *sv);
    void **rv = calloc((size_t)P, sizeof *rv);
    char *sb = NULL, *rb = NULL;
    int rc = -1;
    if (!sd || !sv || !rv) { lrmoe_err("out of memory (row exchange)"); goto out; }
    v.counts = sd + (size_t)P * P;
    int64_t *rd = sd + 2 * (size_t)P * P;
    v.spos = sd + 3 * (size_t)P * P;
    v.rpos = v.spos + P;
    mv_walk(J, kind, &v);
    lrmoe_comm_displs(P, v.counts, sd, rd);
    int64_t ns = 0, nr = 0;
    for (int p = 0; p < P; p++) {
        ns += v.counts[(size_t)me * P + p];
        nr += v.counts[(size_t)p * P + me];
        v.spos[p] = sd[(size_t)me * P + p];
        v.rpos[p] = rd[(size_t)me * P + p];
    }
    v.sidx = malloc((size_t)(ns + nr + 1) * sizeof *v.sidx);
    sb = malloc((size_t)(ns ? ns : 1) * rowb);
    rb = malloc((size_t)(nr ? nr : 1) * rowb);
    if (!v.sidx || !sb || !rb) {
        lrmoe_err("out of memory (row exchange: %lld + %lld rows of %zu bytes)", (long long)ns,
                  (long long)nr, rowb);
        goto out;
    }
    v.ridx = v.sidx + ns;
    v.fill = 1;
    mv_walk(J, kind, &v);
    double t0 = lrmoe_now();
    for (int64_t j = 0; j < ns; j++)
        memcpy(sb + (size_t)j * rowb, (const char *)arr + (size_t)v.sidx[j] * rowb, rowb);
    sv[me] = sb;
    rv[me] = rb;
    if (m->comm.alltoallv(&m->comm, rowb, sv, v.counts, sd, rv, rd, NULL) < 0) goto out;
    for (int64_t j = 0; j < nr; j++)
        memcpy((char *)arr + (size_t)v.ridx[j] * rowb, rb + (size_t)j * rowb, rowb);
    double dt = lrmoe_now() - t0;
    if (out) { m->gather_s += dt; m->gather_bytes += ns * (int64_t)rowb; }
    else { m->scatter_s += dt; m->scatter_bytes += ns * (int64_t)rowb; }
    rc = 0;
out:
    free(sd); free(sv); free(rv); free(sb); free(rb); free(v.sidx);
    return rc;
}

/* An error every rank finds alike from data all of them hold. */
static int agreed(lrmoe_exec_mpi_t *m)
{
    m->agreed = 1;
    return -1;
}

/* Every rank's job header to every rank: the frames must agree (but for T,
 * and the numerics, which are rank 0's); T becomes the total; Tr[r] each
 * rank's tokens. An END header meeting a job is an error on both sides. */
static int shard_hdr(lrmoe_exec_mpi_t *m, mpi_job_t *J, int64_t *Tr)
{
    const int P = J->P;
    hdr_t *all = job_alloc(J, (size_t)P * sizeof *all);
    int64_t *ones = job_alloc(J, (size_t)P * sizeof *ones);
    if (!all || !ones) return lrmoe_err("out of memory");
    for (int r = 0; r < P; r++) ones[r] = 1;
    m->scatter_s = m->gather_s = 0;
    m->scatter_bytes = m->gather_bytes = 0;
    /* every rank's next frame waits on its own input: no --timeout here */
    int was = lrmoe_comm_mpi_idle(&m->comm, 1);
    int rc0 = lrmoe_comm_mpi_allgatherv(&m->comm, sizeof *all, &J->h, 1, all, ones);
    lrmoe_comm_mpi_idle(&m->comm, was);
    if (rc0 < 0) return -1;
    int64_t T = 0;
    for (int r = 0; r < P; r++) {
        if ((all[r].op == OP_END) != (all[0].op == OP_END)) {
            int e = all[r].op == OP_END ? r : 0, g = e == r ? 0 : r;
            lrmoe_err("per-rank inputs: rank %d's input ended after %lld frames, rank %d's has "
                      "more", e, (long long)m->jobs, g);
            return agreed(m);
        }
        if (all[r].wdigest != all[0].wdigest && all[r].layer == all[0].layer) {
            lrmoe_err("per-rank inputs: frame %lld: rank %d's --weights of layer %lld differ "
                      "from rank 0's (weights digest %016llx vs %016llx): a stale or other "
                      "copy on that host?", (long long)m->jobs, r, (long long)all[r].layer,
                      (unsigned long long)all[r].wdigest, (unsigned long long)all[0].wdigest);
            return agreed(m);
        }
        if (all[r].step != all[0].step) {
            char a[24] = "none", b[24] = "none";
            if (all[r].step != LRMOE_EXEC_MPI_NO_STEP)
                snprintf(a, sizeof a, "%lld", (long long)all[r].step);
            if (all[0].step != LRMOE_EXEC_MPI_NO_STEP)
                snprintf(b, sizeof b, "%lld", (long long)all[0].step);
            lrmoe_err("per-rank inputs: frame %lld of rank %d is of step %s, rank 0's of step "
                      "%s", (long long)m->jobs, r, a, b);
            return agreed(m);
        }
        hdr_t x = all[r];
        x.T = all[0].T;
        x.compute = all[0].compute;
        x.kernel = all[0].kernel;
        x.dnnl_version = all[0].dnnl_version;
        memcpy(x.dnnl_impl, all[0].dnnl_impl, sizeof x.dnnl_impl);
        if (memcmp(&x, &all[0], sizeof x)) {
            lrmoe_err("per-rank inputs: frame %lld of rank %d differs from rank 0's (layer %lld "
                      "vs %lld, or the dimensions, dtypes, plan or options)", (long long)m->jobs,
                      r, (long long)all[r].layer, (long long)all[0].layer);
            return agreed(m);
        }
        Tr[r] = all[r].T;
        T += all[r].T;
    }
    for (int r = 0; r < P && J->h.op != OP_END; r++)
        if (Tr[r] != T * (r + 1) / P - T * r / P) {
            lrmoe_err("per-rank inputs: frame %lld: rank %d has %lld tokens, but rank r must "
                      "hold rows [r*T/P, (r+1)*T/P) of all T=%lld: %lld", (long long)m->jobs, r,
                      (long long)Tr[r], (long long)T, (long long)(T * (r + 1) / P - T * r / P));
            return agreed(m);
        }
    J->h.T = T;
    J->h.compute = all[0].compute;
    J->h.kernel = all[0].kernel;
    J->h.dnnl_version = all[0].dnnl_version;
    memcpy(J->h.dnnl_impl, all[0].dnnl_impl, sizeof J->h.dnnl_impl);
    return 0;
}

/* rows of a local array (n rows of rowb) at row lo of a global-shaped copy */
static void *spread(mpi_job_t *J, const void *loc, int64_t n, int64_t lo, int64_t rows, size_t rowb)
{
    char *g = job_alloc(J, (size_t)rows * rowb);
    if (g && n) memcpy(g + (size_t)lo * rowb, loc, (size_t)n * rowb);
    return g;
}

/* the routing of all ranks: every rank's n rows of rowb to everyone */
static void *gather_all(lrmoe_exec_mpi_t *m, mpi_job_t *J, const void *loc, int64_t n,
                        const int64_t *Tr, size_t rowb)
{
    char *g = job_alloc(J, (size_t)J->h.T * rowb);
    if (!g) { lrmoe_err("out of memory"); return NULL; }
    return lrmoe_comm_mpi_allgatherv(&m->comm, rowb, loc, n, g, Tr) < 0 ? NULL : g;
}

static int shard_begin(lrmoe_exec_mpi_t *m, const lrmoe_exec_cfg_t *cfg,
                       const lrmoe_exec_dims_t *d, int64_t layer, const lrmoe_exec_weights_t *w,
                       const lrmoe_exec_plan_t *plan, mpi_job_t *J)
{
    memset(J, 0, sizeof *J);
    m->agreed = 0;
    J->P = m->P;
    J->me = m->rank;
    return hdr_common(m, cfg, d, layer, w, plan, &J->h);
}

/* the plan (rank 0's) and the global routing on every rank */
static int shard_meta(lrmoe_exec_mpi_t *m, mpi_job_t *J, const lrmoe_exec_dims_t *d,
                      const int32_t *ids, const float *tw, const lrmoe_exec_plan_t *plan,
                      lrmoe_exec_plan_t *lp, const int64_t *Tr)
{
    const int64_t K = J->h.K, EP = J->h.E * J->h.P;
    memset(lp, 0, sizeof *lp);
    if (!(J->ids = gather_all(m, J, ids, d->T, Tr, (size_t)K * sizeof *ids)) ||
        !(J->tw = gather_all(m, J, tw, d->T, Tr, (size_t)K * sizeof *tw)))
        return -1;
    if (J->h.have & HAVE_PLAN) {
        /* every rank's copy, rank 0's values */
        uint8_t *pl = job_alloc(J, (size_t)EP);
        int64_t *fa = job_alloc(J, (size_t)EP * sizeof *fa);
        if (!pl || !fa) return lrmoe_err("out of memory");
        memcpy(pl, plan->placement, (size_t)EP);
        memcpy(fa, plan->fwd_alloc, (size_t)EP * sizeof *fa);
        if (lrmoe_comm_mpi_bcast(&m->comm, pl, (size_t)EP, 0) < 0 ||
            lrmoe_comm_mpi_bcast(&m->comm, fa, (size_t)EP * sizeof *fa, 0) < 0)
            return -1;
        J->placement = pl; J->fwd_alloc = fa;
        lp->placement = pl; lp->fwd_alloc = fa;
    }
    return 0;
}

static int shard_forward(lrmoe_exec_mpi_t *m, const lrmoe_exec_cfg_t *cfg,
                         const lrmoe_exec_dims_t *d, int64_t layer,
                         const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan,
                         lrmoe_exec_fwd_t *a, double *timings)
{
    mpi_job_t J;
    const int P = m->P;
    int64_t *Tr = calloc((size_t)P, sizeof *Tr);
    int rc = -1;
    if (!Tr) return lrmoe_err("out of memory");
    if (shard_begin(m, cfg, d, layer, w, plan, &J) < 0) goto out;
    J.h.op = OP_FWD;
    J.h.act = a->act_dtype;
    J.h.have |= (a->phi_sqnorm ? HAVE_PHI : 0) | (a->saved_gate ? HAVE_SG : 0) |
                (a->saved_up ? HAVE_SU : 0) | (a->pair_out ? HAVE_PO : 0);
    if (shard_hdr(m, &J, Tr) < 0 || job_kernel(m, &J) < 0) goto out;
    {
    const int64_t T = J.h.T, K = J.h.K, D = J.h.D, F = J.h.F, n = d->T;
    const int64_t lo = T * J.me / P;
    const size_t as = lrmoe_dtype_size(a->act_dtype), TK = (size_t)(T * K);
    lrmoe_exec_plan_t lp;
    if (shard_meta(m, &J, d, a->topk_ids, a->topk_weights, plan, &lp, Tr) < 0) goto out;
    lrmoe_exec_fwd_t g = *a;
    g.topk_ids = J.ids;
    g.topk_weights = J.tw;
    int32_t *pr = job_alloc(&J, TK * sizeof *pr);
    if (!pr) { lrmoe_err("out of memory"); goto out; }
    if (lrmoe_exec_assign(T, K, J.h.E, P, J.ids, lp.fwd_alloc, lp.placement, pr) < 0) {
        agreed(m);
        goto out;
    }
    g.hidden = spread(&J, a->hidden, n, lo, T, (size_t)D * as);
    g.output = job_alloc(&J, (size_t)(T * D) * as);
    g.pair_rank = pr;
    g.phi_sqnorm = a->phi_sqnorm ? job_alloc(&J, TK * sizeof(float)) : NULL;
    g.saved_gate = a->saved_gate ? job_alloc(&J, TK * (size_t)F * as) : NULL;
    g.saved_up = a->saved_up ? job_alloc(&J, TK * (size_t)F * as) : NULL;
    g.pair_out = a->pair_out ? job_alloc(&J, TK * (size_t)D * as) : NULL;
    double *tim = job_alloc(&J, (size_t)P * LRMOE_NSTAGES * sizeof *tim);
    if (!g.hidden || !g.output || !tim || (a->phi_sqnorm && !g.phi_sqnorm) ||
        (a->saved_gate && !g.saved_gate) || (a->saved_up && !g.saved_up) ||
        (a->pair_out && !g.pair_out)) {
        lrmoe_err("out of memory (T=%lld, K=%lld, D=%lld, F=%lld)", (long long)T, (long long)K,
                  (long long)D, (long long)F);
        goto out;
    }
    lrmoe_exec_cfg_t c;
    if (job_cfg(m, cfg, &J.h, &c) < 0) goto out;
    lrmoe_exec_dims_t gd = {T, J.h.E, K, D, F, P};
    lrmoe_comm_mpi_reset(&m->comm);
    if (lrmoe_exec_forward(&c, &gd, w, (J.h.have & HAVE_PLAN) ? &lp : NULL, &g, tim) < 0)
        goto out;
    double sent[3];
    job_sent(m, sent);
    J.pair_rank = g.pair_rank;
    /* phi_sqnorm and saved state were written where the pair ran */
    if ((g.phi_sqnorm && redistribute(m, &J, MV_TO_OWNER, 1, sizeof(float), g.phi_sqnorm) < 0) ||
        (g.saved_gate &&
         redistribute(m, &J, MV_TO_OWNER, 1, (size_t)F * as, g.saved_gate) < 0) ||
        (g.saved_up && redistribute(m, &J, MV_TO_OWNER, 1, (size_t)F * as, g.saved_up) < 0))
        goto out;
    const size_t nk = (size_t)(n * K), ok = (size_t)(lo * K);
    memcpy(a->output, (char *)g.output + (size_t)(lo * D) * as, (size_t)(n * D) * as);
    memcpy(a->pair_rank, pr + ok, nk * sizeof *pr);
    if (a->phi_sqnorm) memcpy(a->phi_sqnorm, g.phi_sqnorm + ok, nk * sizeof(float));
    if (a->saved_gate)
        memcpy(a->saved_gate, (char *)g.saved_gate + ok * F * as, nk * (size_t)F * as);
    if (a->saved_up) memcpy(a->saved_up, (char *)g.saved_up + ok * F * as, nk * (size_t)F * as);
    if (a->pair_out) memcpy(a->pair_out, (char *)g.pair_out + ok * D * as, nk * (size_t)D * as);
    rc = job_stats(m, &J, tim, timings, sent);
    }
out:
    job_free(&J);
    free(Tr);
    if (!rc) m->jobs++;
    return rc;
}

static int shard_backward(lrmoe_exec_mpi_t *m, const lrmoe_exec_cfg_t *cfg,
                          const lrmoe_exec_dims_t *d, int64_t layer,
                          const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan,
                          lrmoe_exec_bwd_t *a, double *timings)
{
    mpi_job_t J;
    const int P = m->P;
    int64_t *Tr = calloc((size_t)P, sizeof *Tr);
    int rc = -1;
    if (!Tr) return lrmoe_err("out of memory");
    if (shard_begin(m, cfg, d, layer, w, plan, &J) < 0) goto out;
    if (a->mode == LRMOE_MODE_COMPACT) {
        lrmoe_err("per-rank inputs: backward compact needs the global pack of lrmoe-pack "
                  "(use full or masked)");
        agreed(m);
        goto out;
    }
    if (!a->hidden || !a->pair_rank || !a->saved_gate || !a->saved_up ||
        (a->mode == LRMOE_MODE_MASKED && !a->keep)) {
        lrmoe_err("backward %s: needs hidden, pair_rank, saved_gate and saved_up%s",
                  lrmoe_exec_mode_name(a->mode), a->mode == LRMOE_MODE_MASKED ? " and keep" : "");
        goto out;
    }
    J.h.op = OP_BWD;
    J.h.mode = a->mode;
    J.h.act = a->act_dtype;
    J.h.grad = a->grad_dtype;
    if (shard_hdr(m, &J, Tr) < 0 || job_kernel(m, &J) < 0) goto out;
    {
    const int64_t T = J.h.T, K = J.h.K, D = J.h.D, F = J.h.F, E = J.h.E, n = d->T;
    const int64_t lo = T * J.me / P;
    const size_t as = lrmoe_dtype_size(a->act_dtype), gs = lrmoe_dtype_size(a->grad_dtype);
    const size_t TK = (size_t)(T * K), FD = (size_t)(F * D);
    lrmoe_exec_plan_t lp;
    if (shard_meta(m, &J, d, a->topk_ids, a->topk_weights, plan, &lp, Tr) < 0) goto out;
    int32_t *pr = gather_all(m, &J, a->pair_rank, n, Tr, (size_t)K * sizeof(int32_t));
    if (!pr) goto out;
    for (size_t u = 0; u < TK; u++)
        if (pr[u] < 0 || pr[u] >= P) {
            lrmoe_err("pair_rank[%lld,%lld]: rank %d out of range [0,%d)", (long long)(u / K),
                      (long long)(u % K), pr[u], P);
            agreed(m);
            goto out;
        }
    J.pair_rank = pr;
    lrmoe_exec_bwd_t g = *a;
    g.topk_ids = J.ids;
    g.topk_weights = J.tw;
    g.pair_rank = pr;
    if (a->mode == LRMOE_MODE_MASKED && !(g.keep = gather_all(m, &J, a->keep, n, Tr, (size_t)K)))
        goto out;
    g.grad_output = spread(&J, a->grad_output, n, lo, T, (size_t)D * gs);
    g.pair_out = spread(&J, a->pair_out, n * K, lo * K, T * K, (size_t)D * as);
    g.hidden = spread(&J, a->hidden, n, lo, T, (size_t)D * as);
    g.saved_gate = spread(&J, a->saved_gate, n * K, lo * K, T * K, (size_t)F * as);
    g.saved_up = spread(&J, a->saved_up, n * K, lo * K, T * K, (size_t)F * as);
    g.grad_hidden = job_alloc(&J, (size_t)(T * D) * sizeof(float));
    g.grad_topk_weights = job_alloc(&J, TK * sizeof(float));
    g.grad_w_gate = job_alloc(&J, (size_t)E * FD * sizeof(float));
    g.grad_w_up = job_alloc(&J, (size_t)E * FD * sizeof(float));
    g.grad_w_down = job_alloc(&J, (size_t)E * FD * sizeof(float));
    double *tim = job_alloc(&J, (size_t)P * LRMOE_NSTAGES * sizeof *tim);
    if (!g.grad_output || !g.pair_out || !g.hidden || !g.saved_gate || !g.saved_up ||
        !g.grad_hidden || !g.grad_topk_weights || !g.grad_w_gate || !g.grad_w_up ||
        !g.grad_w_down || !tim) {
        lrmoe_err("out of memory (T=%lld, K=%lld, D=%lld, F=%lld)", (long long)T, (long long)K,
                  (long long)D, (long long)F);
        goto out;
    }
    /* the hidden rows and saved state of pairs that run off their token's rank */
    if (redistribute(m, &J, MV_TOK_TO_PAIRS, 0, (size_t)D * as, (void *)g.hidden) < 0 ||
        redistribute(m, &J, MV_TO_PAIR, 0, (size_t)F * as, (void *)g.saved_gate) < 0 ||
        redistribute(m, &J, MV_TO_PAIR, 0, (size_t)F * as, (void *)g.saved_up) < 0)
        goto out;
    lrmoe_exec_cfg_t c;
    if (job_cfg(m, cfg, &J.h, &c) < 0) goto out;
    lrmoe_exec_dims_t gd = {T, E, K, D, F, P};
    lrmoe_comm_mpi_reset(&m->comm);
    if (lrmoe_exec_backward(&c, &gd, w, (J.h.have & HAVE_PLAN) ? &lp : NULL, &g, tim) < 0)
        goto out;
    double sent[3];
    job_sent(m, sent);
    memcpy(a->grad_hidden, g.grad_hidden + lo * D, (size_t)(n * D) * sizeof(float));
    memcpy(a->grad_topk_weights, g.grad_topk_weights + lo * K, (size_t)(n * K) * sizeof(float));
    for (int64_t e = 0; e < E; e++) { /* the gradients this rank owns */
        if (lrmoe_exec_native(e, E, P) != J.me) continue;
        memcpy(a->grad_w_gate + e * FD, g.grad_w_gate + e * FD, FD * sizeof(float));
        memcpy(a->grad_w_up + e * FD, g.grad_w_up + e * FD, FD * sizeof(float));
        memcpy(a->grad_w_down + e * FD, g.grad_w_down + e * FD, FD * sizeof(float));
    }
    rc = job_stats(m, &J, tim, timings, sent);
    }
out:
    job_free(&J);
    free(Tr);
    if (!rc) m->jobs++;
    return rc;
}

static int shard_end(lrmoe_exec_mpi_t *m)
{
    mpi_job_t J;
    memset(&J, 0, sizeof J);
    m->agreed = 0;
    J.P = m->P;
    J.me = m->rank;
    J.h.op = OP_END;
    int64_t *Tr = calloc((size_t)m->P, sizeof *Tr);
    int rc = Tr ? shard_hdr(m, &J, Tr) : lrmoe_err("out of memory");
    job_free(&J);
    free(Tr);
    return rc;
}

void lrmoe_exec_mpi_per_rank(lrmoe_exec_mpi_t *m)
{
    m->shard = 1;
}

int lrmoe_exec_mpi_rank_path(const char *pattern, int rank, char *out, size_t n)
{
    size_t k = 0;
    int found = 0;
    for (const char *p = pattern; *p; p++) {
        if (p[0] == '%' && p[1] == 'r') {
            int w = snprintf(out + k, k < n ? n - k : 0, "%d", rank);
            if (w < 0) return -1;
            k += (size_t)w;
            p++;
            found = 1;
            continue;
        }
        if (k + 1 < n) out[k] = *p;
        k++;
    }
    if (k >= n || !found) return -1;
    out[k] = 0;
    return 0;
}

static int hdr_send(lrmoe_exec_mpi_t *m, hdr_t *h)
{
    m->in_flight = h->op != OP_END;
    m->scatter_s = m->gather_s = 0;
    m->scatter_bytes = m->gather_bytes = 0;
    return lrmoe_comm_mpi_bcast(&m->comm, h, sizeof *h, 0);
}

static int hdr_common(lrmoe_exec_mpi_t *m, const lrmoe_exec_cfg_t *cfg,
                      const lrmoe_exec_dims_t *d, int64_t layer,
                      const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan, hdr_t *h)
{
    if (m->rank != 0 && !m->shard) return lrmoe_err("exec: only rank 0 submits jobs");
    if (d->P != m->P)
        return lrmoe_err("%d ranks but the job was started with %d MPI processes "
                         "(mpirun -np must match the plan's or --ranks' P)", d->P, m->P);
    if (cfg->backend != LRMOE_BACKEND_CPU && !lrmoe_exec_mpi_cuda_built())
        return lrmoe_err("backend %s under MPI: this build has no CUDA support",
                         lrmoe_backend_name(cfg->backend));
#if defined(LRMOE_HAVE_MPI) && defined(LRMOE_HAVE_CUDA)
    /* rank 0 without a GPU: a plain error before any rank starts the job */
    if (cfg->backend == LRMOE_BACKEND_CUDA && !m->gpu_ok && lrmoe_comm_mpi_nccl_devices() < 1)
        return lrmoe_err_prefix("backend cuda: no usable CUDA device");
#endif
    if (d->P > d->E)
        return lrmoe_err("%d ranks for %lld experts: every rank needs a native expert",
                         d->P, (long long)d->E);
    memset(h, 0, sizeof *h);
    h->layer = layer;
    h->step = m->step;
    uint64_t dg = 0;
    if (job_digest(m, layer, d, w, cfg->threads, &dg) < 0) return -1;
    h->wdigest = (int64_t)dg;
    h->T = d->T; h->E = d->E; h->K = d->K; h->D = d->D; h->F = d->F; h->P = d->P;
    h->wdtype = w->dtype;
    h->allow_nonfinite = cfg->allow_nonfinite;
    h->backend = cfg->backend;
    lrmoe_exec_numerics_t nm;
    if (lrmoe_exec_numerics(cfg, w->dtype, 1, &nm) < 0) return -1;
    h->compute = nm.compute;
    if (nm.compute == LRMOE_COMPUTE_BF16) { /* the kernel too: one per job */
        const lrmoe_gemm_kernel_t k = nm.kernel;
        h->kernel = k.kind;
        h->dnnl_version = k.dnnl_version;
        memcpy(h->dnnl_impl, k.dnnl_impl, sizeof h->dnnl_impl);
    }
    if (plan && plan->placement && plan->fwd_alloc) h->have |= HAVE_PLAN;
    else if (plan && (plan->placement || plan->fwd_alloc))
        return lrmoe_err("exec under MPI: a plan needs both placement and fwd_alloc");
    return 0;
}

int lrmoe_exec_mpi_forward(lrmoe_exec_mpi_t *m, const lrmoe_exec_cfg_t *cfg,
                           const lrmoe_exec_dims_t *d, int64_t layer,
                           const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan,
                           lrmoe_exec_fwd_t *a, double *timings)
{
    if (m->shard) return shard_forward(m, cfg, d, layer, w, plan, a, timings);
    mpi_job_t J;
    memset(&J, 0, sizeof J);
    if (hdr_common(m, cfg, d, layer, w, plan, &J.h) < 0) return -1;
    if (!a->hidden || !a->topk_ids || !a->topk_weights || !a->output || !a->pair_rank)
        return lrmoe_err("forward: missing hidden, topk_ids, topk_weights, output or pair_rank");
    /* what every rank would find wrong, found here before any rank starts */
    if (lrmoe_exec_assign(d->T, d->K, d->E, d->P, a->topk_ids,
                          (J.h.have & HAVE_PLAN) ? plan->fwd_alloc : NULL,
                          (J.h.have & HAVE_PLAN) ? plan->placement : NULL, a->pair_rank) < 0)
        return -1;
    J.h.op = OP_FWD;
    J.h.act = a->act_dtype;
    J.h.have |= (a->phi_sqnorm ? HAVE_PHI : 0) | (a->saved_gate ? HAVE_SG : 0) |
                (a->saved_up ? HAVE_SU : 0) | (a->pair_out ? HAVE_PO : 0);
    J.P = m->P;
    J.me = 0;
    int rc = hdr_send(m, &J.h);
    if (!rc) rc = job_forward(m, cfg, &J, w, plan, a, timings);
    job_free(&J);
    if (!rc) m->in_flight = 0;
    return rc;
}

int lrmoe_exec_mpi_backward(lrmoe_exec_mpi_t *m, const lrmoe_exec_cfg_t *cfg,
                            const lrmoe_exec_dims_t *d, int64_t layer,
                            const lrmoe_exec_weights_t *w, const lrmoe_exec_plan_t *plan,
                            lrmoe_exec_bwd_t *a, double *timings)
{
    if (m->shard) return shard_backward(m, cfg, d, layer, w, plan, a, timings);
    mpi_job_t J;
    memset(&J, 0, sizeof J);
    if (hdr_common(m, cfg, d, layer, w, plan, &J.h) < 0) return -1;
    const int compact = a->mode == LRMOE_MODE_COMPACT;
    if (lrmoe_exec_check_bwd_args(d, a) < 0) return -1;
    if (compact && lrmoe_exec_check_pack(d->P, d->T, d->K, d->E, a->topk_ids, a,
                                         (J.h.have & HAVE_PLAN) ? plan->placement : NULL) < 0)
        return -1;
    J.h.op = OP_BWD;
    J.h.mode = a->mode;
    J.h.act = a->act_dtype;
    J.h.grad = a->grad_dtype;
    J.h.R = compact ? a->R : 0;
    J.h.have |= (compact && a->pack_rank) ? HAVE_PACKRANK : 0;
    J.P = m->P;
    J.me = 0;
    int rc = hdr_send(m, &J.h);
    if (!rc) rc = job_backward(m, cfg, &J, w, plan, a, timings);
    job_free(&J);
    if (!rc) m->in_flight = 0;
    return rc;
}

int lrmoe_exec_mpi_end(lrmoe_exec_mpi_t *m)
{
    if (m->shard) return shard_end(m);
    hdr_t h;
    memset(&h, 0, sizeof h);
    h.op = OP_END;
    return hdr_send(m, &h);
}

/* ---------------------------------------------------------------- ranks > 0 */

int lrmoe_exec_mpi_serve(lrmoe_exec_mpi_t *m, const lrmoe_exec_cfg_t *cfg)
{
    for (;;) {
        mpi_job_t J;
        memset(&J, 0, sizeof J);
        /* the next job waits on rank 0's input: no --timeout on this wait */
        int was = lrmoe_comm_mpi_idle(&m->comm, 1);
        int rc0 = lrmoe_comm_mpi_bcast(&m->comm, &J.h, sizeof J.h, 0);
        lrmoe_comm_mpi_idle(&m->comm, was);
        if (rc0 < 0) return -1;
        if (J.h.op == OP_END) return 0;
        m->in_flight = 1;
        J.P = m->P;
        J.me = m->rank;
        int rc;
        if (J.h.P != m->P || (J.h.op != OP_FWD && J.h.op != OP_BWD))
            rc = lrmoe_err("job header: op %lld for %lld ranks (bad header from rank 0)",
                           (long long)J.h.op, (long long)J.h.P);
        else if (J.h.op == OP_FWD)
            rc = job_forward(m, cfg, &J, NULL, NULL, NULL, NULL);
        else
            rc = job_backward(m, cfg, &J, NULL, NULL, NULL, NULL);
        job_free(&J);
        if (rc < 0) return -1;
        m->in_flight = 0;
    }
}

/* ---------------------------------------------------------------- attributes */

static int list_attr(lrmoe_frame_t *f, const char *key, int P, const int64_t *iv,
                     const double *dv)
{
    size_t cap = (size_t)P * 24 + 16, len = 0;
    char *buf = malloc(cap);
    if (!buf) return lrmoe_err("out of memory");
    buf[0] = 0;
    for (int r = 0; r < P; r++)
        len += iv ? (size_t)snprintf(buf + len, cap - len, "%s%lld", r ? "," : "", (long long)iv[r])
                  : (size_t)snprintf(buf + len, cap - len, "%s%.6g", r ? "," : "", dv[r]);
    int rc = lrmoe_frame_set_attr(f, key, buf);
    free(buf);
    return rc;
}

int lrmoe_exec_mpi_attrs(const lrmoe_exec_mpi_t *m, lrmoe_frame_t *f, const char *phase)
{
    char key[64];
    snprintf(key, sizeof key, "exec.%s.a2a_bytes", phase);
    if (list_attr(f, key, m->P, m->a2a_bytes, NULL) < 0) return -1;
    snprintf(key, sizeof key, "exec.%s.p2p_bytes", phase);
    if (list_attr(f, key, m->P, m->p2p_bytes, NULL) < 0) return -1;
    snprintf(key, sizeof key, "exec.%s.a2a_s", phase);
    if (list_attr(f, key, m->P, NULL, m->a2a_s) < 0) return -1;
    snprintf(key, sizeof key, "exec.%s.scatter_s", phase);
    if (lrmoe_frame_set_attrf(f, key, "%.6g", m->scatter_s) < 0) return -1;
    snprintf(key, sizeof key, "exec.%s.gather_s", phase);
    if (lrmoe_frame_set_attrf(f, key, "%.6g", m->gather_s) < 0) return -1;
    snprintf(key, sizeof key, "exec.%s.scatter_bytes", phase);
    if (lrmoe_frame_set_attrf(f, key, "%lld", (long long)m->scatter_bytes) < 0) return -1;
    snprintf(key, sizeof key, "exec.%s.gather_bytes", phase);
    if (lrmoe_frame_set_attrf(f, key, "%lld", (long long)m->gather_bytes) < 0) return -1;
#if defined(LRMOE_HAVE_MPI) && defined(LRMOE_HAVE_CUDA)
    if (m->gpu_ok &&
        lrmoe_frame_set_attr(f, "exec.gpu_comm",
                             lrmoe_comm_mpi_nccl_is_nccl(&m->gpu) ? "nccl" : "mpi-staged") < 0)
        return -1;
#endif
    if (m->shard && lrmoe_frame_set_attr(f, "exec.inputs", "per-rank") < 0) return -1;
    return lrmoe_frame_set_attr(f, "exec.launcher", "mpi");
}

/* ---------------------------------------------------------------- setup */

int lrmoe_exec_mpi_open(lrmoe_exec_mpi_t *m, int *argc, char ***argv, const char *weights)
{
    memset(m, 0, sizeof *m);
    if (lrmoe_comm_mpi_init(&m->comm, argc, argv) < 0) return -1;
    m->rank = lrmoe_comm_mpi_rank(&m->comm);
    m->P = m->comm.P;
    m->weights = weights;
    m->step = LRMOE_EXEC_MPI_NO_STEP;
    m->a2a_bytes = calloc((size_t)m->P, sizeof *m->a2a_bytes);
    m->p2p_bytes = calloc((size_t)m->P, sizeof *m->p2p_bytes);
    m->a2a_s = calloc((size_t)m->P, sizeof *m->a2a_s);
    if (!m->a2a_bytes || !m->p2p_bytes || !m->a2a_s) return lrmoe_err("out of memory");
    return 0;
}

int lrmoe_exec_mpi_cuda_built(void)
{
#if defined(LRMOE_HAVE_MPI) && defined(LRMOE_HAVE_CUDA)
    return 1;
#else
    return 0;
#endif
}

int lrmoe_exec_mpi_close(lrmoe_exec_mpi_t *m)
{
    layers_free(m);
#if defined(LRMOE_HAVE_MPI) && defined(LRMOE_HAVE_CUDA)
    if (m->gpu_ok) {
        lrmoe_comm_mpi_nccl_free(&m->gpu, m->gpu_ctx);
        m->gpu_ok = 0;
        m->gpu_ctx = NULL;
    }
#endif
    free(m->a2a_bytes); free(m->p2p_bytes); free(m->a2a_s);
    m->a2a_bytes = m->p2p_bytes = NULL;
    m->a2a_s = NULL;
    return lrmoe_comm_mpi_finalize(&m->comm);
}
