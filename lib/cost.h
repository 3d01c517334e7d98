/* Memory and communication/time model of one MoE layer invocation under a
 * plan (documented with a worked example in lrmoe-plan(1)). Pure functions.
 *
 * Per rank p, with f_p forward rows (sum_e fwd_alloc[e,p]), r_p retained
 * backward rows (sum_e bwd_alloc[e,p]), c_p replicas, b = dtype bytes,
 * g = gradient bytes, W = 3*D*F elements per expert:
 *   base     = (E/P) * W * b              native weights (inside the resident
 *                                         footprint, not charged to hbm)
 *   replica  = c_p * W * (b + g)          weights + weight-gradient buffer
 *   fwd      = f_p * 2*D * b              dispatched x rows + expert outputs y
 *   saved    = f_p * 2*F * b              pre-activations h_g, h_u
 *   bwd      = r_p * (3*D + 2*F) * b      grad rows in, packed x/h_g/h_u,
 *                                         input-gradient rows out
 *   charged  = replica + fwd + saved + bwd  <= hbm
 * Traffic (token origins uniform over ranks, row = D*b bytes):
 *   dispatch recv_p = f_p (P-1)/P rows, send_p = (f_tot - f_p)/P rows;
 *   combine is the reverse; backward dispatch likewise with r_p plus the
 *   saved state (D+2F)*b of retained pairs that must move to another rank
 *   (worst case over the selected identities); backward combine is the
 *   reverse of the grad rows; weights: each replica receives W*b and returns
 *   W*b of gradient.
 *   t_phase = max_p max(send_p, recv_p) / bw ; t_comm = sum of the phases.
 *   compute: t_fwd = max_p f_p*6*D*F/flops, t_bwd = max_p r_p*12*D*F/flops.
 */
#ifndef LRMOE_COST_H
#define LRMOE_COST_H

/* Only what the installed headers declare is exported (the library is
 * built with -fvisibility=hidden, lrmoe(3)). */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int64_t D, F;         /* hidden, expert FFN width (2048, 768) */
    int K;                /* top-k (8) */
    int64_t tokens;       /* tokens per rank (32768) */
    int dtype_bytes;      /* activations and weights (2: BF16) */
    int grad_bytes;       /* weight-gradient buffer of a replica (4: F32) */
    double gpu_mem;       /* bytes per GPU (80 GiB), informational */
    double resident;      /* resident footprint (64 GiB), informational */
    double hbm;           /* budget for replicas + buffers per rank
                             (gpu_mem - resident = 16 GiB); 0 = unlimited */
    double window;        /* seconds allowed for all-to-all; 0 = unlimited */
    double bw;            /* all-to-all bytes/s per rank and direction (100e9) */
    double flops;         /* sustained expert GEMM FLOP/s per rank (400e12) */
    int keep_by_rank;     /* lrmoe-score keeps by forward rank (plan.keep=by-rank):
                             the state moved onto p for e is max(0, bwd - fwd);
                             0: the worst case over the selected identities */
} lrmoe_cost_model_t;

void lrmoe_cost_default(lrmoe_cost_model_t *m);

typedef struct {
    int64_t natives, replicas;      /* expert instances held */
    int64_t fwd_rows, bwd_rows;     /* f_p, r_p */
    int64_t moved_rows;             /* retained rows whose state moves in */
    double mem_base, mem_replica, mem_fwd, mem_saved, mem_bwd;
    double mem_charged;             /* replica + fwd + saved + bwd */
    double send_dispatch, recv_dispatch;     /* bytes; combine = reverse */
    double send_bwd, recv_bwd;               /* backward dispatch bytes */
    double send_bwd_combine, recv_bwd_combine;
    double send_weights, recv_weights;       /* replica weights + gradients */
} lrmoe_rank_cost_t;

typedef struct {
    double mem_peak;   int mem_peak_rank;     /* max charged bytes */
    double t_dispatch, t_combine;             /* forward all-to-all phases (s) */
    double t_bwd_dispatch, t_bwd_combine;     /* backward phases (s) */
    double t_weights;                         /* replica traffic (s) */
    double t_comm;                            /* sum of the five */
    double t_fwd_compute, t_bwd_compute;      /* slowest rank (s) */
    double t_total;                           /* t_comm + compute */
    double bytes_total;                       /* all bytes sent, all ranks */
} lrmoe_cost_summary_t;

/* Per-item sizes. */
double lrmoe_cost_expert_elems(const lrmoe_cost_model_t *m);     /* 3*D*F */
double lrmoe_cost_replica_bytes(const lrmoe_cost_model_t *m);    /* W*(b+g) */
double lrmoe_cost_fwd_row_bytes(const lrmoe_cost_model_t *m);    /* 2*D*b */
double lrmoe_cost_saved_row_bytes(const lrmoe_cost_model_t *m);  /* 2*F*b */
double lrmoe_cost_bwd_row_bytes(const lrmoe_cost_model_t *m);    /* (3D+2F)*b */
double lrmoe_cost_state_row_bytes(const lrmoe_cost_model_t *m);  /* (D+2F)*b */

/* Bytes in adaptive binary units, three significant digits and no exponent
 * ("512 B", "1.5 KiB", "6.49 GiB", "1000 KiB"), into
 * buf (>= 16 bytes); returns buf. */
const char *lrmoe_cost_fmt_bytes(double bytes, char *buf, size_t len);

/* Charged bytes of a rank from its counts (the formula above). */
double lrmoe_cost_rank_mem(const lrmoe_cost_model_t *m, int64_t replicas,
                           int64_t fwd_rows, int64_t bwd_rows);

/* Per-rank overrides for planners whose weights are not "native + one
 * copy per non-native placement" (EPLB's physical slots): replicas[p]
 * instances charged to rank p's memory, and the weight bytes it sends and
 * receives this step (weights moved in at a rebalance, gradients of
 * redundant copies back to their holder). Each array (P). */
typedef struct {
    const int64_t *replicas;
    const double *send_weights, *recv_weights;
} lrmoe_cost_slots_t;

/* Evaluate a plan. placement, fwd, bwd are (E,P); load and quota (E);
 * quota/bwd may be NULL (then K_e = n_e and bwd = fwd). rank (P) may be NULL.
 * Returns 0, or -1 (error set) on shapes E % P != 0 etc. */
int lrmoe_cost_eval(const lrmoe_cost_model_t *m, int E, int P,
                    const uint8_t *placement, const int64_t *load,
                    const int64_t *fwd, const int64_t *quota, const int64_t *bwd,
                    lrmoe_rank_cost_t *rank, lrmoe_cost_summary_t *sum);
/* The same with the overrides (slots may be NULL: lrmoe_cost_eval). */
int lrmoe_cost_eval_slots(const lrmoe_cost_model_t *m, int E, int P,
                          const uint8_t *placement, const int64_t *load,
                          const int64_t *fwd, const int64_t *quota, const int64_t *bwd,
                          const lrmoe_cost_slots_t *slots, lrmoe_rank_cost_t *rank,
                          lrmoe_cost_summary_t *sum);

/* The cost model behind an opaque handle (lib/api_cost.c): the model's
 * parameters set by their field names above ("D", "F", "K", "tokens",
 * "dtype_bytes", "grad_bytes", "gpu_mem", "resident", "hbm", "window",
 * "bw", "flops", "keep_by_rank"; whole numbers where the field is an
 * integer), a plan evaluated as lrmoe_cost_eval does, and its summary read
 * by the field names of lrmoe_cost_summary_t ("mem_peak", "t_total", ...;
 * the model's parameters too), so no caller depends on either struct's
 * layout. new starts from lrmoe_cost_default. 0, or -1 with the error set
 * (an unknown name, a summary value before an evaluation). */
typedef struct lrmoe_cost_cfg lrmoe_cost_cfg_t;
lrmoe_cost_cfg_t *lrmoe_cost_cfg_new(void);
void lrmoe_cost_cfg_free(lrmoe_cost_cfg_t *c);
int lrmoe_cost_cfg_set(lrmoe_cost_cfg_t *c, const char *name, double value);
int lrmoe_cost_cfg_eval(lrmoe_cost_cfg_t *c, int E, int P, const uint8_t *placement,
                        const int64_t *load, const int64_t *fwd, const int64_t *quota,
                        const int64_t *bwd);
int lrmoe_cost_cfg_get(const lrmoe_cost_cfg_t *c, const char *name, double *value);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#endif
