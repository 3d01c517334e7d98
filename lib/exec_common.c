/* The backend-independent helpers of exec, below both backends (lib/exec_cpu.c,
 * kernels/exec_cuda.cu) and the dispatcher (lib/exec.c): names and parsers,
 * pair assignment, rank ownership, timings, input checks. See exec.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "exec.h"
#include "exec_internal.h"


int lrmoe_backend_parse(const char *s, lrmoe_backend_t *b)
{
    if (!strcmp(s, "cpu")) { *b = LRMOE_BACKEND_CPU; return 0; }
    if (!strcmp(s, "cuda")) { *b = LRMOE_BACKEND_CUDA; return 0; }
    return lrmoe_err("unknown backend '%s' (cpu, cuda)", s);
}

const char *lrmoe_backend_name(lrmoe_backend_t b)
{
    return b == LRMOE_BACKEND_CUDA ? "cuda" : "cpu";
}

int lrmoe_exec_mode_parse(const char *s, lrmoe_exec_mode_t *m)
{
    if (!strcmp(s, "full")) { *m = LRMOE_MODE_FULL; return 0; }
    if (!strcmp(s, "masked")) { *m = LRMOE_MODE_MASKED; return 0; }
    if (!strcmp(s, "compact")) { *m = LRMOE_MODE_COMPACT; return 0; }
    return lrmoe_err("unknown mode '%s' (full, masked, compact)", s);
}

const char *lrmoe_exec_mode_name(lrmoe_exec_mode_t m)
{
    switch (m) {
    case LRMOE_MODE_MASKED: return "masked";
    case LRMOE_MODE_COMPACT: return "compact";
    default: return "full";
    }
}

const char *lrmoe_exec_stage_name(int s)
{
    static const char *n[LRMOE_NSTAGES] = {
        "weights", "dispatch", "gemm", "act", "combine", "gradred"};
    return s >= 0 && s < LRMOE_NSTAGES ? n[s] : "?";
}

void lrmoe_exec_cfg_default(lrmoe_exec_cfg_t *c)
{
    memset(c, 0, sizeof *c);
    c->backend = LRMOE_BACKEND_CPU;
    c->gemm = LRMOE_EXEC_GEMM_LOOP;
}

int lrmoe_exec_gemm_parse(const char *s, lrmoe_exec_gemm_t *g)
{
    if (!strcmp(s, "loop")) { *g = LRMOE_EXEC_GEMM_LOOP; return 0; }
    if (!strcmp(s, "grouped")) { *g = LRMOE_EXEC_GEMM_GROUPED; return 0; }
    if (!strcmp(s, "cutlass")) { *g = LRMOE_EXEC_GEMM_CUTLASS; return 0; }
    return lrmoe_err("unknown GEMM implementation '%s' (loop, grouped, cutlass)", s);
}

const char *lrmoe_exec_gemm_name(lrmoe_exec_gemm_t g)
{
    return g == LRMOE_EXEC_GEMM_GROUPED ? "grouped" : g == LRMOE_EXEC_GEMM_CUTLASS ? "cutlass" : "loop";
}

int lrmoe_exec_native(int64_t e, int64_t E, int P)
{
    return (int)(((e + 1) * P - 1) / E);
}

int lrmoe_exec_token_owner(int64_t t, int64_t T, int P)
{
    return (int)(((t + 1) * P - 1) / T);
}

int lrmoe_exec_assign(int64_t T, int64_t K, int64_t E, int P,
                      const int32_t *topk_ids, const int64_t *fwd_alloc,
                      const uint8_t *placement, int32_t *pair_rank)
{
    int64_t n = T * K;
    for (int64_t u = 0; u < n; u++)
        if (topk_ids[u] < 0 || topk_ids[u] >= E)
            return lrmoe_err("topk_ids[%lld,%lld]: expert %d out of range [0,%lld)",
                             (long long)(u / K), (long long)(u % K), topk_ids[u],
                             (long long)E);
    if (!fwd_alloc) {
        for (int64_t u = 0; u < n; u++)
            pair_rank[u] = lrmoe_exec_native(topk_ids[u], E, P);
        return 0;
    }
    int64_t *load = calloc((size_t)E, sizeof *load);
    int64_t *left = malloc((size_t)(E * P) * sizeof *left);
    int *cur = malloc((size_t)E * sizeof *cur);
    if (!load || !left || !cur) {
        free(load); free(left); free(cur);
        return lrmoe_err("assign: out of memory");
    }
    int rc = 0;
    for (int64_t u = 0; u < n; u++) load[topk_ids[u]]++;
    for (int64_t e = 0; e < E && !rc; e++) {
        int64_t s = 0;
        for (int p = 0; p < P; p++) {
            int64_t a = fwd_alloc[e * P + p];
            if (a < 0) {
                rc = lrmoe_err("fwd_alloc[%lld,%d]: negative (%lld)", (long long)e, p,
                               (long long)a);
                break;
            }
            if (a > 0 && placement && !placement[e * P + p]) {
                rc = lrmoe_err("fwd_alloc[%lld,%d]: %lld pairs on a rank without an "
                               "instance of the expert (placement is 0)", (long long)e, p,
                               (long long)a);
                break;
            }
            left[e * P + p] = a;
            if (__builtin_add_overflow(s, a, &s)) {
                rc = lrmoe_err("fwd_alloc row %lld sums past 2^63-1", (long long)e);
                break;
            }
        }
        if (!rc && s != load[e])
            rc = lrmoe_err("fwd_alloc row %lld sums to %lld but expert %lld has %lld pairs",
                           (long long)e, (long long)s, (long long)e, (long long)load[e]);
        cur[e] = lrmoe_exec_native(e, E, P); /* native first */
    }
    /* order of ranks for expert e: native, then 0,1,..,P-1 skipping native */
    for (int64_t u = 0; u < n && !rc; u++) {
        int64_t e = topk_ids[u];
        int nat = lrmoe_exec_native(e, E, P);
        while (left[e * P + cur[e]] == 0) {
            int c = cur[e];
            int next = (c == nat) ? 0 : c + 1;
            if (next == nat) next++;
            cur[e] = next; /* never runs past P: the row sum equals load[e] */
        }
        pair_rank[u] = cur[e];
        left[e * P + cur[e]]--;
    }
    free(load); free(left); free(cur);
    return rc;
}

int lrmoe_exec_critical(int P, const double *timings)
{
    int best = 0;
    double bt = -1;
    for (int r = 0; r < P; r++) {
        double s = 0;
        for (int k = 0; k < LRMOE_NSTAGES; k++) s += timings[r * LRMOE_NSTAGES + k];
        if (s > bt) { bt = s; best = r; }
    }
    return best;
}

/* Index of the first non-finite value of x[0..n) or -1: BF16/F16 by the
 * exponent bits, F32 by its bits, a block at a time without an early exit so
 * that the scan vectorises (the weights are scanned at memory speed). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
__attribute__((optimize("O3"), target_clones("avx512f", "avx2", "default")))
#endif
int64_t lrmoe_exec_first_nonfinite(lrmoe_dtype_t dt, const void *x, size_t n)
{
    enum { B = 4096 };
    for (size_t i0 = 0; i0 < n; i0 += B) {
        size_t m = n - i0 < B ? n - i0 : B;
        unsigned any = 0;
        if (dt == LRMOE_BF16 || dt == LRMOE_F16) {
            const uint16_t *h = (const uint16_t *)x + i0, e = dt == LRMOE_BF16 ? 0x7f80 : 0x7c00;
            for (size_t i = 0; i < m; i++) any |= (h[i] & e) == e;
        } else if (dt == LRMOE_F32) {
            const uint32_t *f = (const uint32_t *)x + i0;
            for (size_t i = 0; i < m; i++) any |= (f[i] & 0x7f800000u) == 0x7f800000u;
        } else {
            return -1;
        }
        if (!any) continue;
        for (size_t i = 0; i < m; i++) {
            int bad = dt == LRMOE_F32
                          ? (((const uint32_t *)x)[i0 + i] & 0x7f800000u) == 0x7f800000u
                          : (((const uint16_t *)x)[i0 + i] & (dt == LRMOE_BF16 ? 0x7f80 : 0x7c00)) ==
                                (dt == LRMOE_BF16 ? 0x7f80 : 0x7c00);
            if (bad) return (int64_t)(i0 + i);
        }
    }
    return -1;
}

int lrmoe_exec_check_finite(lrmoe_dtype_t dt, const void *x, size_t n, const char *name)
{
    int64_t bad = -1;
    if (!x) return 0; /* absent: the caller's own checks name it */
    if (dt == LRMOE_F64) {
        const double *f = x;
        for (size_t i = 0; i < n; i++) if (!isfinite(f[i])) { bad = (int64_t)i; break; }
    } else {
        bad = lrmoe_exec_first_nonfinite(dt, x, n);
    }
    if (bad >= 0)
        return lrmoe_err("%s: non-finite value at flat index %lld (use --allow-nonfinite)",
                         name, (long long)bad);
    return 0;
}


/* The packed rows of lrmoe-pack, validated for the backends that read them
 * (CUDA, MPI): the four row tensors, then the layout. */
int lrmoe_exec_check_pack(int P, int64_t T, int64_t K, int64_t E, const int32_t *topk,
                          const lrmoe_exec_bwd_t *a, const uint8_t *placement)
{
    if (a->R > 0 && (!a->pack_grad || !a->pack_hidden || !a->pack_gate || !a->pack_up))
        return lrmoe_err("compact mode needs pack_pair, pack_counts, pack_offsets, "
                         "pack_grad, pack_hidden, pack_gate and pack_up (a layout-only "
                         "pack, without the last four, runs on the CPU backend in one "
                         "process; lrmoe_pack_rows_frame materialises them)");
    return lrmoe_exec_check_pack_layout(P, T, K, E, topk, a, placement);
}

/* The layout of a compact backward: counts, prefix offsets, eligibility,
 * every pair at most once, in its expert's segment, ascending inside it. */
int lrmoe_exec_check_pack_layout(int P, int64_t T, int64_t K, int64_t E, const int32_t *topk,
                                 const lrmoe_exec_bwd_t *a, const uint8_t *placement)
{
    if (a->R < 0 || a->R > T * K)
        return lrmoe_err("pack: %lld packed rows for %lld pairs", (long long)a->R,
                         (long long)(T * K));
    if (!a->pack_counts || !a->pack_offsets || (a->R && !a->pack_pair))
        return lrmoe_err("compact mode needs pack_pair, pack_counts and pack_offsets");
    int64_t acc = 0;
    for (int64_t j = 0; j < P * E; j++) {
        int64_t c = a->pack_counts[j];
        if (c < 0)
            return lrmoe_err("pack_counts[%lld,%lld]: negative (%lld)", (long long)(j / E),
                             (long long)(j % E), (long long)c);
        if (a->pack_offsets[j] != acc)
            return lrmoe_err("pack_offsets[%lld,%lld] is %lld, expected %lld (exclusive "
                             "prefix sum of pack_counts)", (long long)(j / E),
                             (long long)(j % E), (long long)a->pack_offsets[j],
                             (long long)acc);
        if (c > 0 && placement && !placement[(j % E) * P + j / E])
            return lrmoe_err("pack_counts[%lld,%lld]: %lld rows on a rank without an "
                             "instance of the expert", (long long)(j / E),
                             (long long)(j % E), (long long)c);
        acc += c;
    }
    if (acc != a->R)
        return lrmoe_err("pack_counts sum to %lld but there are %lld packed rows",
                         (long long)acc, (long long)a->R);
    uint8_t *seen = calloc((size_t)(T * K > 0 ? T * K : 1), 1);
    if (!seen) return lrmoe_err("exec: out of memory");
    int rc = 0;
    for (int64_t j = 0; j < P * E && !rc; j++) {
        int64_t e = j % E, d = j / E;
        for (int64_t i = a->pack_offsets[j]; i < a->pack_offsets[j] + a->pack_counts[j]; i++) {
            int64_t u = a->pack_pair[i];
            if (u < 0 || u >= T * K) {
                rc = lrmoe_err("pack_pair[%lld]: pair %lld out of range [0,%lld)",
                               (long long)i, (long long)u, (long long)(T * K));
                break;
            }
            if (seen[u]) {
                rc = lrmoe_err("pack_pair[%lld]: pair %lld packed twice", (long long)i,
                               (long long)u);
                break;
            }
            seen[u] = 1;
            if (topk[u] != e) {
                rc = lrmoe_err("pack_pair[%lld]: pair %lld is of expert %d but sits in the "
                               "segment of expert %lld", (long long)i, (long long)u,
                               topk[u], (long long)e);
                break;
            }
            if (i > a->pack_offsets[j] && a->pack_pair[i - 1] >= u) {
                rc = lrmoe_err("pack_pair[%lld]: pairs not ascending inside segment (%lld,%lld)",
                               (long long)i, (long long)d, (long long)e);
                break;
            }
            if (a->pack_rank && a->pack_rank[i] != d) {
                rc = lrmoe_err("pack_rank[%lld] is %d but the row lies in rank %lld's segment",
                               (long long)i, a->pack_rank[i], (long long)d);
                break;
            }
        }
    }
    free(seen);
    return rc;
}

/* The backward's arrays, every backend (see exec_backend.h). */
int lrmoe_exec_check_bwd_args(const lrmoe_exec_dims_t *d, const lrmoe_exec_bwd_t *a)
{
    const int64_t T = d->T, K = d->K, E = d->E;
    const int compact = a->mode == LRMOE_MODE_COMPACT;
    if (!a->topk_ids || !a->topk_weights || !a->grad_output || !a->pair_out ||
        !a->grad_hidden || !a->grad_w_gate || !a->grad_w_up || !a->grad_w_down ||
        !a->grad_topk_weights)
        return lrmoe_err("backward: missing topk_ids, topk_weights, grad_output, pair_out "
                         "or an output array");
    if (!compact && (!a->hidden || !a->pair_rank || !a->saved_gate || !a->saved_up))
        return lrmoe_err("backward %s: needs hidden, pair_rank, saved_gate and saved_up",
                         lrmoe_exec_mode_name(a->mode));
    if (a->mode == LRMOE_MODE_MASKED && !a->keep) return lrmoe_err("backward masked: needs keep");
    for (int64_t u = 0; u < T * K; u++) {
        if (a->topk_ids[u] < 0 || a->topk_ids[u] >= E)
            return lrmoe_err("topk_ids[%lld,%lld]: expert %d out of range [0,%lld)",
                             (long long)(u / K), (long long)(u % K), a->topk_ids[u],
                             (long long)E);
        if (!compact && (a->pair_rank[u] < 0 || a->pair_rank[u] >= d->P))
            return lrmoe_err("pair_rank[%lld,%lld]: rank %d out of range [0,%d)",
                             (long long)(u / K), (long long)(u % K), a->pair_rank[u], d->P);
    }
    return 0;
}

/* Every floating input a phase reads must be finite (unless allow_nonfinite):
 * NaN/Inf in saved state would otherwise give all-NaN gradients. */
int lrmoe_exec_check_fwd_inputs(const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                                const lrmoe_exec_fwd_t *a)
{
    if (cfg->allow_nonfinite) return 0;
    const size_t TD = (size_t)(d->T * d->D), TK = (size_t)(d->T * d->K);
    if (lrmoe_exec_check_finite(a->act_dtype, a->hidden, TD, "hidden") < 0 ||
        lrmoe_exec_check_finite(LRMOE_F32, a->topk_weights, TK, "topk_weights") < 0)
        return -1;
    return 0;
}

int lrmoe_exec_check_bwd_inputs(const lrmoe_exec_cfg_t *cfg, const lrmoe_exec_dims_t *d,
                                const lrmoe_exec_bwd_t *a)
{
    if (cfg->allow_nonfinite) return 0;
    const lrmoe_dtype_t adt = a->act_dtype;
    const size_t TD = (size_t)(d->T * d->D), TK = (size_t)(d->T * d->K);
    const size_t TKF = TK * (size_t)d->F, TKD = TK * (size_t)d->D;
    if (lrmoe_exec_check_finite(a->grad_dtype, a->grad_output, TD, "grad_output") < 0 ||
        lrmoe_exec_check_finite(LRMOE_F32, a->topk_weights, TK, "topk_weights") < 0 ||
        (a->pair_out && lrmoe_exec_check_finite(adt, a->pair_out, TKD, "pair_out") < 0))
        return -1;
    if (a->mode == LRMOE_MODE_COMPACT && a->pack_hidden) { /* else layout-only: the sources */
        const size_t RD = (size_t)(a->R * d->D), RF = (size_t)(a->R * d->F);
        return lrmoe_exec_check_finite(LRMOE_F32, a->pack_grad, RD, "pack_grad") < 0 ||
               lrmoe_exec_check_finite(adt, a->pack_hidden, RD, "pack_hidden") < 0 ||
               lrmoe_exec_check_finite(adt, a->pack_gate, RF, "pack_gate") < 0 ||
               lrmoe_exec_check_finite(adt, a->pack_up, RF, "pack_up") < 0 ? -1 : 0;
    }
    return lrmoe_exec_check_finite(adt, a->hidden, TD, "hidden") < 0 ||
           lrmoe_exec_check_finite(adt, a->saved_gate, TKF, "saved_gate") < 0 ||
           lrmoe_exec_check_finite(adt, a->saved_up, TKF, "saved_up") < 0 ? -1 : 0;
}
