/* Memory and communication/time model (see cost.h and lrmoe-plan(1)). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "lrmoe.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

void lrmoe_cost_default(lrmoe_cost_model_t *m)
{
    memset(m, 0, sizeof *m);
    m->D = 2048;
    m->F = 768;
    m->K = 8;
    m->tokens = 32768;
    m->dtype_bytes = 2;
    m->grad_bytes = 4;
    m->gpu_mem = 80 * GIB;
    m->resident = 64 * GIB;
    m->hbm = 16 * GIB;
    m->window = 0;
    m->bw = 100e9;
    m->flops = 400e12;
}

const char *lrmoe_cost_fmt_bytes(double bytes, char *buf, size_t len)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    double v = bytes;
    while ((v >= 1024 || v <= -1024) && u < 6) {
        v /= 1024;
        u++;
    }
    /* three significant digits, but no exponent: 1000..1023 of a unit as is */
    if (u == 0 || v >= 100 || v <= -100)
        snprintf(buf, len, "%.0f %s", v, unit[u]);
    else
        snprintf(buf, len, "%.3g %s", v, unit[u]);
    return buf;
}

double lrmoe_cost_expert_elems(const lrmoe_cost_model_t *m)
{
    return 3.0 * (double)m->D * (double)m->F;
}

double lrmoe_cost_replica_bytes(const lrmoe_cost_model_t *m)
{
    return lrmoe_cost_expert_elems(m) * (double)(m->dtype_bytes + m->grad_bytes);
}

double lrmoe_cost_fwd_row_bytes(const lrmoe_cost_model_t *m)
{
    return 2.0 * (double)m->D * m->dtype_bytes;
}

double lrmoe_cost_saved_row_bytes(const lrmoe_cost_model_t *m)
{
    return 2.0 * (double)m->F * m->dtype_bytes;
}

double lrmoe_cost_bwd_row_bytes(const lrmoe_cost_model_t *m)
{
    return (3.0 * (double)m->D + 2.0 * (double)m->F) * m->dtype_bytes;
}

double lrmoe_cost_state_row_bytes(const lrmoe_cost_model_t *m)
{
    return ((double)m->D + 2.0 * (double)m->F) * m->dtype_bytes;
}

double lrmoe_cost_rank_mem(const lrmoe_cost_model_t *m, int64_t replicas,
                           int64_t fwd_rows, int64_t bwd_rows)
{
    return (double)replicas * lrmoe_cost_replica_bytes(m) +
           (double)fwd_rows * (lrmoe_cost_fwd_row_bytes(m) + lrmoe_cost_saved_row_bytes(m)) +
           (double)bwd_rows * lrmoe_cost_bwd_row_bytes(m);
}

static double dmax(double a, double b) { return a > b ? a : b; }

/* 1 when the 8 entries at pl, f, b are all zero (plans are sparse). */
static inline int zero8(const uint8_t *pl, const int64_t *f, const int64_t *b)
{
    uint64_t w;
    memcpy(&w, pl, sizeof w);
    int64_t acc = 0;
    for (int k = 0; k < 8; k++)
        acc |= f[k] | b[k];
    return !w && !acc;
}

int lrmoe_cost_eval(const lrmoe_cost_model_t *m, int E, int P,
                    const uint8_t *placement, const int64_t *load,
                    const int64_t *fwd, const int64_t *quota, const int64_t *bwd,
                    lrmoe_rank_cost_t *rank, lrmoe_cost_summary_t *sum)
{
    return lrmoe_cost_eval_slots(m, E, P, placement, load, fwd, quota, bwd, NULL, rank, sum);
}

/* 1 when the 8 placement entries at pl are all zero. */
static inline int zero8p(const uint8_t *pl)
{
    uint64_t w;
    memcpy(&w, pl, sizeof w);
    return !w;
}

/* The model; placed: the caller guarantees fwd and bwd are zero wherever
 * placement is (every valid plan: lrmoe_plan_check), so only the placement
 * is scanned for the entries to visit. */
static int cost_eval(const lrmoe_cost_model_t *m, int E, int P, const uint8_t *placement,
                     const int64_t *load, const int64_t *fwd, const int64_t *quota,
                     const int64_t *bwd, const lrmoe_cost_slots_t *slots,
                     lrmoe_rank_cost_t *rank, lrmoe_cost_summary_t *sum, int placed);

int lrmoe_cost_eval_slots(const lrmoe_cost_model_t *m, int E, int P,
                          const uint8_t *placement, const int64_t *load,
                          const int64_t *fwd, const int64_t *quota, const int64_t *bwd,
                          const lrmoe_cost_slots_t *slots, lrmoe_rank_cost_t *rank,
                          lrmoe_cost_summary_t *sum)
{
    return cost_eval(m, E, P, placement, load, fwd, quota, bwd, slots, rank, sum, 0);
}

int lrmoe_cost_eval_placed(const lrmoe_cost_model_t *m, int E, int P, const uint8_t *placement,
                     const int64_t *load, const int64_t *fwd, const int64_t *quota,
                     const int64_t *bwd, const lrmoe_cost_slots_t *slots,
                     lrmoe_rank_cost_t *rank, lrmoe_cost_summary_t *sum)
{
    return cost_eval(m, E, P, placement, load, fwd, quota, bwd, slots, rank, sum, 1);
}

static int cost_eval(const lrmoe_cost_model_t *m, int E, int P, const uint8_t *placement,
                     const int64_t *load, const int64_t *fwd, const int64_t *quota,
                     const int64_t *bwd, const lrmoe_cost_slots_t *slots,
                     lrmoe_rank_cost_t *rank, lrmoe_cost_summary_t *sum, int placed)
{
    if (E <= 0 || P <= 0 || E % P)
        return lrmoe_err("cost model: %d experts not divisible over %d ranks", E, P);
    if (m->D <= 0 || m->F <= 0 || m->dtype_bytes <= 0 || m->bw <= 0 || m->flops <= 0)
        return lrmoe_err("cost model: D, F, dtype bytes, bandwidth and flops must be > 0");
    lrmoe_rank_cost_t *rc = rank ? rank : calloc((size_t)P, sizeof *rc);
    if (!rc)
        return lrmoe_err("cost model: out of memory");
    memset(rc, 0, (size_t)P * sizeof *rc);
    if (!bwd) {
        bwd = fwd;
        quota = NULL;
    }
    const int per = E / P;
    const double b = m->dtype_bytes, D = (double)m->D;
    const double W = lrmoe_cost_expert_elems(m);
    const double state = lrmoe_cost_state_row_bytes(m);
    double ftot = 0, rtot = 0;

    for (int e = 0; e < E; e++) {
        int nat = e / per;
        int64_t n = 0, K;
        if (load)
            n = load[e];
        else
            for (int p = 0; p < P; p++)
                n += fwd[(size_t)e * P + p];
        K = quota ? quota[e] : n;
        /* retained pairs of e known to stay on p at least: the worst case
         * over which K_e of the n_e are selected (all drops on p), or, when
         * lrmoe-score keeps by forward rank, min(fwd, bwd) */
        int64_t moved_e = 0;
        for (int p = 0; p < P; p++) {
            size_t i = (size_t)e * P + p;
            /* plans are sparse: an entry without an instance or pairs adds
             * nothing below (stay <= 0 when fwd is 0, so nothing moves) */
            if (!(p & 7) && p + 8 <= P &&
                (placed ? zero8p(placement + i) : zero8(placement + i, fwd + i, bwd + i))) {
                p += 7;
                continue;
            }
            if (!placement[i] && (placed || !(fwd[i] | bwd[i])))
                continue;
            rc[p].fwd_rows += fwd[i];
            rc[p].bwd_rows += bwd[i];
            int64_t stay = m->keep_by_rank ? fwd[i] : fwd[i] - (n - K);
            if (stay < 0)
                stay = 0;
            int64_t mv = bwd[i] - stay;
            if (mv > 0) {
                rc[p].moved_rows += mv;
                rc[p].recv_bwd += (double)mv * state;
                moved_e += mv;
            }
            if (placement[i] && p != nat && !slots) {
                rc[p].replicas++;
                rc[p].recv_weights += W * b;   /* weights in */
                rc[p].send_weights += W * b;   /* gradient back */
                rc[nat].send_weights += W * b;
                rc[nat].recv_weights += W * b;
            }
        }
        /* the moved state leaves ranks in proportion to their forward rows */
        if (moved_e > 0 && n > 0)
            for (int p = 0; p < P; p++)
                if ((!placed || placement[(size_t)e * P + p]) && fwd[(size_t)e * P + p])
                    rc[p].send_bwd += (double)moved_e * state *
                                      (double)fwd[(size_t)e * P + p] / (double)n;
    }
    for (int p = 0; slots && p < P; p++) {
        rc[p].replicas = slots->replicas ? slots->replicas[p] : 0;
        rc[p].send_weights = slots->send_weights ? slots->send_weights[p] : 0;
        rc[p].recv_weights = slots->recv_weights ? slots->recv_weights[p] : 0;
    }
    for (int p = 0; p < P; p++) {
        ftot += (double)rc[p].fwd_rows;
        rtot += (double)rc[p].bwd_rows;
    }
    lrmoe_cost_summary_t s;
    memset(&s, 0, sizeof s);
    s.mem_peak = -1;
    const double row = D * b, q = (double)(P - 1) / P;
    for (int p = 0; p < P; p++) {
        lrmoe_rank_cost_t *r = &rc[p];
        double f = (double)r->fwd_rows, g = (double)r->bwd_rows;
        r->natives = per;
        r->mem_base = per * W * b;
        r->mem_replica = (double)r->replicas * lrmoe_cost_replica_bytes(m);
        r->mem_fwd = f * lrmoe_cost_fwd_row_bytes(m);
        r->mem_saved = f * lrmoe_cost_saved_row_bytes(m);
        r->mem_bwd = g * lrmoe_cost_bwd_row_bytes(m);
        r->mem_charged = r->mem_replica + r->mem_fwd + r->mem_saved + r->mem_bwd;
        r->recv_dispatch = f * q * row;
        r->send_dispatch = (ftot - f) / P * row;
        r->recv_bwd += g * q * row;
        r->send_bwd += (rtot - g) / P * row;
        r->recv_bwd_combine = (rtot - g) / P * row;
        r->send_bwd_combine = g * q * row;
        if (r->mem_charged > s.mem_peak) {
            s.mem_peak = r->mem_charged;
            s.mem_peak_rank = p;
        }
        s.t_dispatch = dmax(s.t_dispatch, dmax(r->send_dispatch, r->recv_dispatch));
        s.t_bwd_dispatch = dmax(s.t_bwd_dispatch, dmax(r->send_bwd, r->recv_bwd));
        s.t_bwd_combine = dmax(s.t_bwd_combine, dmax(r->send_bwd_combine, r->recv_bwd_combine));
        s.t_weights = dmax(s.t_weights, dmax(r->send_weights, r->recv_weights));
        s.t_fwd_compute = dmax(s.t_fwd_compute, f * 6.0 * D * (double)m->F);
        s.t_bwd_compute = dmax(s.t_bwd_compute, g * 12.0 * D * (double)m->F);
        s.bytes_total += 2 * r->send_dispatch + r->send_bwd + r->send_bwd_combine +
                         r->send_weights;
    }
    s.t_dispatch /= m->bw;
    s.t_combine = s.t_dispatch; /* the exact reverse */
    s.t_bwd_dispatch /= m->bw;
    s.t_bwd_combine /= m->bw;
    s.t_weights /= m->bw;
    s.t_comm = s.t_dispatch + s.t_combine + s.t_bwd_dispatch + s.t_bwd_combine + s.t_weights;
    s.t_fwd_compute /= m->flops;
    s.t_bwd_compute /= m->flops;
    s.t_total = s.t_comm + s.t_fwd_compute + s.t_bwd_compute;
    if (sum)
        *sum = s;
    if (!rank)
        free(rc);
    return 0;
}
