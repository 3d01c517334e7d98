/* lrmoe_exec_args_t (api.h) against the struct calls it holds the
 * arguments of: a forward and a compact backward (layout-only) on the same
 * buffers through both, which must give the same bits; F32 weights given
 * as the packed copy w_f32 only (w_gate, w_up, w_down NULL) under a plan
 * with replicas (their weights copied by p2p) against the three matrices;
 * then the misuse cases, each printed with its error, among them a full
 * backward with one argument broken at a time and a forward under a
 * plan with one row broken at a time. Built against the
 * staged tree. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <lrmoe/lrmoe.h>
#include <lrmoe/api.h>
#include <lrmoe/exec.h>
#include <lrmoe/pack.h>

enum { T = 12, E = 4, K = 2, D = 8, F = 6, P = 2 };

static float rnd(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xffff) / 65536.0f - 0.5f;
}

static void fill(float *x, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) x[i] = rnd(&seed);
}

typedef struct {
    float out[T * D], phi[T * K], sg[T * K * F], su[T * K * F], po[T * K * D];
    int32_t pr[T * K];
    float gh[T * D], gwg[E * F * D], gwu[E * F * D], gwd[E * D * F], gtw[T * K];
} result_t;

static float x[T * D], alpha[T * K], wg[E * F * D], wu[E * F * D], wd[E * D * F], g[T * D];
static int32_t ids[T * K];
static uint8_t keep[T * K];

/* The forward by the struct calls, the three F32 matrices, under plan pl. */
static int forward_under(result_t *r, const lrmoe_exec_plan_t *pl)
{
    lrmoe_exec_cfg_t cfg;
    lrmoe_exec_cfg_default(&cfg);
    lrmoe_exec_dims_t d = {T, E, K, D, F, P};
    lrmoe_exec_weights_t w = {.dtype = LRMOE_F32, .w_gate = wg, .w_up = wu, .w_down = wd};
    lrmoe_exec_fwd_t f = {.act_dtype = LRMOE_F32, .hidden = x, .topk_ids = ids,
                          .topk_weights = alpha, .output = r->out, .pair_rank = r->pr,
                          .phi_sqnorm = r->phi, .saved_gate = r->sg, .saved_up = r->su,
                          .pair_out = r->po};
    return lrmoe_exec_forward(&cfg, &d, &w, pl, &f, NULL);
}

static int by_structs(result_t *r)
{
    lrmoe_exec_plan_t pl = {NULL, NULL};
    if (forward_under(r, &pl) < 0) return -1;
    lrmoe_exec_cfg_t cfg;
    lrmoe_exec_cfg_default(&cfg);
    lrmoe_exec_dims_t d = {T, E, K, D, F, P};
    lrmoe_exec_weights_t w = {.dtype = LRMOE_F32, .w_gate = wg, .w_up = wu, .w_down = wd};
    lrmoe_pack_in_t in = {T, K, E, P, ids, keep, r->pr, NULL, NULL, NULL};
    lrmoe_pack_plan_t pp;
    if (lrmoe_pack_assign(&in, &pp) < 0) return -1;
    lrmoe_exec_bwd_t b = {.mode = LRMOE_MODE_COMPACT, .act_dtype = LRMOE_F32,
                          .grad_dtype = LRMOE_F32, .topk_ids = ids, .topk_weights = alpha,
                          .grad_output = g, .pair_out = r->po, .hidden = x,
                          .pair_rank = r->pr, .saved_gate = r->sg, .saved_up = r->su,
                          .R = pp.R, .pack_pair = pp.pair, .pack_rank = pp.rank,
                          .pack_counts = pp.counts, .pack_offsets = pp.offsets,
                          .grad_hidden = r->gh, .grad_w_gate = r->gwg, .grad_w_up = r->gwu,
                          .grad_w_down = r->gwd, .grad_topk_weights = r->gtw};
    int rc = lrmoe_exec_backward(&cfg, &d, &w, &pl, &b, NULL);
    lrmoe_pack_plan_free(&pp);
    return rc;
}

/* The struct calls under a plan with a replica of every expert on the
 * other rank, which runs half of its pairs: the three matrices only
 * (packed 0), their packed F32 copy only (1), the packed copy with three
 * other matrices beside it (2: they must not be read), or no weights (-1). */
static int replicas(result_t *r, int packed)
{
    static float wf[E * 3 * F * D], decoy[E * 3 * F * D];
    fill(decoy, sizeof decoy / 4, 9);
    for (int e = 0; e < E; e++) {
        memcpy(wf + e * 3 * F * D, wg + e * F * D, sizeof(float) * F * D);
        memcpy(wf + e * 3 * F * D + F * D, wu + e * F * D, sizeof(float) * F * D);
        memcpy(wf + e * 3 * F * D + 2 * F * D, wd + e * D * F, sizeof(float) * D * F);
    }
    uint8_t placement[E * P];
    int64_t fa[E * P] = {0};
    memset(placement, 1, sizeof placement);
    for (int u = 0; u < T * K; u++) fa[ids[u] * P + lrmoe_exec_native(ids[u], E, P)]++;
    int64_t moved = 0; /* half of every expert's pairs run on its replica */
    for (int e = 0; e < E; e++) {
        int nat = lrmoe_exec_native(e, E, P), o = (nat + 1) % P;
        fa[e * P + o] = fa[e * P + nat] / 2, fa[e * P + nat] -= fa[e * P + o];
        moved += fa[e * P + o];
    }
    if (packed == 1) printf("pairs on replicas: %lld\n", (long long)moved);
    lrmoe_exec_cfg_t cfg;
    lrmoe_exec_cfg_default(&cfg);
    lrmoe_exec_dims_t d = {T, E, K, D, F, P};
    lrmoe_exec_weights_t w = {.dtype = LRMOE_F32};
    if (packed >= 1) w.w_f32 = wf;
    if (packed == 0) w.w_gate = wg, w.w_up = wu, w.w_down = wd;
    if (packed == 2) w.w_gate = decoy, w.w_up = decoy + E * F * D, w.w_down = decoy + 2 * E * F * D;
    lrmoe_exec_plan_t pl = {placement, fa};
    lrmoe_exec_fwd_t f = {.act_dtype = LRMOE_F32, .hidden = x, .topk_ids = ids,
                          .topk_weights = alpha, .output = r->out, .pair_rank = r->pr,
                          .phi_sqnorm = r->phi, .saved_gate = r->sg, .saved_up = r->su,
                          .pair_out = r->po};
    if (lrmoe_exec_forward(&cfg, &d, &w, &pl, &f, NULL) < 0) return -1;
    lrmoe_exec_bwd_t b = {.mode = LRMOE_MODE_FULL, .act_dtype = LRMOE_F32,
                          .grad_dtype = LRMOE_F32, .topk_ids = ids, .topk_weights = alpha,
                          .grad_output = g, .pair_out = r->po, .hidden = x,
                          .pair_rank = r->pr, .saved_gate = r->sg, .saved_up = r->su,
                          .grad_hidden = r->gh, .grad_w_gate = r->gwg, .grad_w_up = r->gwu,
                          .grad_w_down = r->gwd, .grad_topk_weights = r->gtw};
    return lrmoe_exec_backward(&cfg, &d, &w, &pl, &b, NULL);
}

/* A forward under a broken plan (a caller's fwd_alloc, not lrmoe-plan's):
 * expert 0's row sums past 2^63-1 (0), has a negative entry (1), puts
 * pairs on a rank without an instance (2), or sums to other than the
 * expert's pairs (3); lrmoe_exec_assign must refuse each. */
static int plan_broken(result_t *r, int what)
{
    uint8_t placement[E * P];
    int64_t fa[E * P] = {0};
    memset(placement, 1, sizeof placement);
    for (int u = 0; u < T * K; u++) fa[ids[u] * P + lrmoe_exec_native(ids[u], E, P)]++;
    int nat = lrmoe_exec_native(0, E, P), o = (nat + 1) % P;
    if (what == 0) fa[nat] = INT64_MAX, fa[o] = 2;
    if (what == 1) fa[nat] += 1, fa[o] = -1;
    if (what == 2) fa[nat] -= 1, fa[o] = 1, placement[o] = 0;
    if (what == 3) fa[nat] += 1;
    lrmoe_exec_plan_t pl = {placement, fa};
    return forward_under(r, &pl);
}

static int by_name(result_t *r)
{
    lrmoe_exec_args_t *a = lrmoe_exec_args_new();
    const struct { const char *n; int64_t v; } nums[] = {
        {"T", T}, {"E", E}, {"K", K}, {"D", D}, {"F", F}, {"P", P},
        {"weights_dtype", LRMOE_F32}, {"act_dtype", LRMOE_F32}};
    const struct { const char *n; const void *p; } ptrs[] = {
        {"w_gate", wg}, {"w_up", wu}, {"w_down", wd}, {"hidden", x}, {"topk_ids", ids},
        {"topk_weights", alpha}, {"output", r->out}, {"pair_rank", r->pr},
        {"phi_sqnorm", r->phi}, {"saved_gate", r->sg}, {"saved_up", r->su},
        {"pair_out", r->po}, {"keep", keep}};
    int rc = 0;
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        rc |= lrmoe_exec_args_set(a, nums[i].n, nums[i].v);
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        rc |= lrmoe_exec_args_set_ptr(a, ptrs[i].n, ptrs[i].p);
    if (rc || lrmoe_exec_args_forward(a, NULL) < 0 || lrmoe_exec_args_pack(a) < 0) {
        lrmoe_exec_args_free(a);
        return -1;
    }
    lrmoe_exec_args_set(a, "mode", LRMOE_MODE_COMPACT);
    lrmoe_exec_args_set(a, "grad_dtype", LRMOE_F32);
    lrmoe_exec_args_set_ptr(a, "grad_output", g);
    lrmoe_exec_args_set_ptr(a, "grad_hidden", r->gh);
    lrmoe_exec_args_set_ptr(a, "grad_w_gate", r->gwg);
    lrmoe_exec_args_set_ptr(a, "grad_w_up", r->gwu);
    lrmoe_exec_args_set_ptr(a, "grad_w_down", r->gwd);
    lrmoe_exec_args_set_ptr(a, "grad_topk_weights", r->gtw);
    int64_t R = -1, moved = -1;
    lrmoe_exec_args_get(a, "R", &R);
    lrmoe_exec_args_get(a, "moved", &moved);
    printf("R %lld moved %lld pack_pair %s\n", (long long)R, (long long)moved,
           lrmoe_exec_args_get_ptr(a, "pack_pair") ? "set" : "NULL");
    rc = lrmoe_exec_args_backward(a, NULL);
    lrmoe_exec_args_free(a);
    return rc;
}

static void show(const char *what, int rc)
{
    printf("%s: %d %s\n", what, rc, lrmoe_errmsg());
}

/* A full backward on the forward's results in r with one argument broken
 * (lrmoe_exec_check_bwd_args, and the CPU backend's compact forms):
 * 0 grad_hidden NULL, 1 masked without keep, 2 full without saved_gate,
 * 3 an expert id out of range, 4 a pair_rank out of range, 5 compact with
 * pack_grad alone, 6 nothing broken. */
static int bwd_broken(result_t *r, int what)
{
    lrmoe_exec_cfg_t cfg;
    lrmoe_exec_cfg_default(&cfg);
    lrmoe_exec_dims_t d = {T, E, K, D, F, P};
    lrmoe_exec_weights_t w = {.dtype = LRMOE_F32, .w_gate = wg, .w_up = wu, .w_down = wd};
    lrmoe_exec_plan_t pl = {NULL, NULL};
    static float gh[T * D], gwg[E * F * D], gwu[E * F * D], gwd[E * D * F], gtw[T * K];
    static int32_t id2[T * K], pr2[T * K];
    memcpy(id2, ids, sizeof id2), memcpy(pr2, r->pr, sizeof pr2);
    lrmoe_exec_bwd_t b = {.mode = LRMOE_MODE_FULL, .act_dtype = LRMOE_F32,
                          .grad_dtype = LRMOE_F32, .topk_ids = id2, .topk_weights = alpha,
                          .grad_output = g, .pair_out = r->po, .hidden = x, .pair_rank = pr2,
                          .saved_gate = r->sg, .saved_up = r->su, .grad_hidden = gh,
                          .grad_w_gate = gwg, .grad_w_up = gwu, .grad_w_down = gwd,
                          .grad_topk_weights = gtw};
    switch (what) {
    case 0: b.grad_hidden = NULL; break;
    case 1: b.mode = LRMOE_MODE_MASKED; break;
    case 2: b.saved_gate = NULL; break;
    case 3: id2[3 * K + 1] = E; break;
    case 4: pr2[2 * K] = P; break;
    case 5: b.mode = LRMOE_MODE_COMPACT, b.R = 4, b.pack_grad = g; break;
    }
    return lrmoe_exec_backward(&cfg, &d, &w, &pl, &b, NULL);
}

int main(void)
{
    unsigned s = 7;
    fill(x, sizeof x / 4, 1), fill(wg, sizeof wg / 4, 2), fill(wu, sizeof wu / 4, 3);
    fill(wd, sizeof wd / 4, 4), fill(g, sizeof g / 4, 5), fill(alpha, sizeof alpha / 4, 6);
    for (int u = 0; u < T * K; u++) {
        ids[u] = (int32_t)((u / K * 3 + (u % K) * (1 + (int)(rnd(&s) > 0))) % E);
        keep[u] = (uint8_t)(u % 3 != 1);
    }
    for (int t = 0; t < T; t++) /* two distinct experts per token */
        if (ids[t * K] == ids[t * K + 1]) ids[t * K + 1] = (ids[t * K] + 1) % E;
    static result_t r1, r2;
    memset(&r1, 0xa5, sizeof r1), memset(&r2, 0x5a, sizeof r2);
    if (by_structs(&r1) < 0 || by_name(&r2) < 0) {
        fprintf(stderr, "exec: %s\n", lrmoe_errmsg());
        return 1;
    }
    printf("%s\n", memcmp(&r1, &r2, sizeof r1) ? "DIFFERENT" : "same bits");
    memset(&r1, 0xa5, sizeof r1), memset(&r2, 0x5a, sizeof r2);
    if (replicas(&r1, 0) < 0 || replicas(&r2, 1) < 0) {
        fprintf(stderr, "exec with replicas: %s\n", lrmoe_errmsg());
        return 1;
    }
    /* the packed GEMM (gate and up as one) against three: rounding only */
    float dmax = 0, *a1 = (float *)&r1, *a2 = (float *)&r2;
    for (size_t i = 0; i < sizeof r1 / 4; i++)
        dmax = fabsf(a1[i] - a2[i]) > dmax ? fabsf(a1[i] - a2[i]) : dmax;
    printf("replicas, w_f32 only against the matrices: %s\n",
           dmax < 1e-5f ? "within 1e-5" : "DIFFERENT");
    memset(&r1, 0xa5, sizeof r1);
    if (replicas(&r1, 2) < 0) {
        fprintf(stderr, "exec with replicas: %s\n", lrmoe_errmsg());
        return 1;
    }
    printf("replicas, w_f32 beside other matrices: %s\n",
           memcmp(&r1, &r2, sizeof r1) ? "DIFFERENT" : "same bits");
    show("no weights", replicas(&r1, -1));
    memset(&r1, 0, sizeof r1);
    if (by_structs(&r1) < 0) {
        fprintf(stderr, "exec: %s\n", lrmoe_errmsg());
        return 1;
    }
    static const char *broken[] = {"bwd no grad_hidden", "bwd masked no keep",
                                   "bwd no saved_gate", "bwd expert", "bwd rank",
                                   "bwd compact rows", "bwd intact"};
    for (int i = 0; i < 7; i++) show(broken[i], bwd_broken(&r1, i));
    static const char *bad_plan[] = {"plan sum", "plan negative", "plan placement",
                                     "plan row"};
    for (int i = 0; i < 4; i++) show(bad_plan[i], plan_broken(&r1, i));
    lrmoe_exec_args_t *a = lrmoe_exec_args_new();
    show("unknown", lrmoe_exec_args_set(a, "hiden", 1));
    show("number for a pointer", lrmoe_exec_args_set(a, "hidden", 1));
    show("pointer for a number", lrmoe_exec_args_set_ptr(a, "T", x));
    show("int range", lrmoe_exec_args_set(a, "P", (int64_t)1 << 40));
    show("get", lrmoe_exec_args_get(a, "w_gate", &(int64_t){0}));
    show("forward", lrmoe_exec_args_forward(a, NULL));
    printf("unset ptr: %s\n", lrmoe_exec_args_get_ptr(a, "hidden") ? "set" : "NULL");
    lrmoe_exec_args_free(a);
    lrmoe_exec_args_free(NULL);
    return 0;
}
