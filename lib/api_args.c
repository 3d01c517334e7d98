/* api_args: the arguments of lrmoe_exec_forward, lrmoe_exec_backward and
 * lrmoe_pack_assign held by the library and set by name (api.h), so that a
 * caller passing its own buffers (the Python package's lrmoe.torch) mirrors
 * none of their structs. A name sets every struct field of that name: the
 * forward's and the backward's "hidden", the exec's and the pack's
 * "topk_ids". */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "exec.h"
#include "pack.h"

struct lrmoe_exec_args {
    lrmoe_exec_cfg_t cfg;
    lrmoe_exec_dims_t d;
    lrmoe_exec_weights_t w;
    lrmoe_exec_plan_t plan;
    lrmoe_exec_fwd_t f;
    lrmoe_exec_bwd_t b;
    lrmoe_pack_in_t pin;
    lrmoe_pack_plan_t pp;
    int have_pp;
};

/* which struct of the args, and what kind of field */
enum { S_CFG, S_DIMS, S_W, S_PLAN, S_FWD, S_BWD, S_PIN };
enum { K_INT, K_I64, K_ENUM, K_PTR };

#define F(s, st, field, kind, name) {name, s, offsetof(st, field), kind}
#define CFG(field, kind) F(S_CFG, lrmoe_exec_cfg_t, field, kind, #field)
#define DIM(field, kind) F(S_DIMS, lrmoe_exec_dims_t, field, kind, #field)
#define WGT(field) F(S_W, lrmoe_exec_weights_t, field, K_PTR, #field)
#define FWD(field, kind) F(S_FWD, lrmoe_exec_fwd_t, field, kind, #field)
#define BWD(field, kind) F(S_BWD, lrmoe_exec_bwd_t, field, kind, #field)
#define PIN(field, kind) F(S_PIN, lrmoe_pack_in_t, field, kind, #field)

static const struct {
    const char *name;
    int s;
    size_t off;
    int kind;
} FIELDS[] = {
    CFG(backend, K_ENUM), CFG(threads, K_INT), CFG(allow_nonfinite, K_INT), CFG(device, K_INT),
    CFG(rank_threads, K_INT), CFG(cpu_clock, K_INT), CFG(gpus, K_INT), CFG(gemm, K_INT),
    CFG(gemm_streams, K_INT), CFG(compute, K_INT), CFG(comm, K_PTR),
    DIM(T, K_I64), DIM(E, K_I64), DIM(K, K_I64), DIM(D, K_I64), DIM(F, K_I64), DIM(P, K_INT),
    F(S_W, lrmoe_exec_weights_t, dtype, K_ENUM, "weights_dtype"),
    WGT(w_gate), WGT(w_up), WGT(w_down), WGT(w_gate_f32), WGT(w_up_f32), WGT(w_down_f32),
    WGT(w_f32),
    F(S_PLAN, lrmoe_exec_plan_t, placement, K_PTR, "placement"),
    F(S_PLAN, lrmoe_exec_plan_t, fwd_alloc, K_PTR, "fwd_alloc"),
    FWD(act_dtype, K_ENUM), FWD(hidden, K_PTR), FWD(topk_ids, K_PTR), FWD(topk_weights, K_PTR),
    FWD(output, K_PTR), FWD(pair_rank, K_PTR), FWD(phi_sqnorm, K_PTR), FWD(saved_gate, K_PTR),
    FWD(saved_up, K_PTR), FWD(pair_out, K_PTR),
    BWD(mode, K_ENUM), BWD(act_dtype, K_ENUM), BWD(grad_dtype, K_ENUM), BWD(topk_ids, K_PTR),
    BWD(topk_weights, K_PTR), BWD(grad_output, K_PTR), BWD(pair_out, K_PTR), BWD(hidden, K_PTR),
    BWD(pair_rank, K_PTR), BWD(saved_gate, K_PTR), BWD(saved_up, K_PTR), BWD(keep, K_PTR),
    BWD(R, K_I64), BWD(pack_pair, K_PTR), BWD(pack_rank, K_PTR), BWD(pack_counts, K_PTR),
    BWD(pack_offsets, K_PTR), BWD(pack_grad, K_PTR), BWD(pack_hidden, K_PTR),
    BWD(pack_gate, K_PTR), BWD(pack_up, K_PTR), BWD(grad_hidden, K_PTR),
    BWD(grad_w_gate, K_PTR), BWD(grad_w_up, K_PTR), BWD(grad_w_down, K_PTR),
    BWD(grad_topk_weights, K_PTR),
    PIN(T, K_I64), PIN(K, K_INT), PIN(E, K_INT), PIN(P, K_INT), PIN(topk_ids, K_PTR),
    PIN(keep, K_PTR), PIN(pair_rank, K_PTR), PIN(placement, K_PTR), PIN(bwd_alloc, K_PTR),
    PIN(quota, K_PTR),
};
#define NFIELDS (sizeof FIELDS / sizeof FIELDS[0])

static char *base(lrmoe_exec_args_t *a, int s)
{
    switch (s) {
    case S_CFG: return (char *)&a->cfg;
    case S_DIMS: return (char *)&a->d;
    case S_W: return (char *)&a->w;
    case S_PLAN: return (char *)&a->plan;
    case S_FWD: return (char *)&a->f;
    case S_BWD: return (char *)&a->b;
    default: return (char *)&a->pin;
    }
}

lrmoe_exec_args_t *lrmoe_exec_args_new(void)
{
    lrmoe_exec_args_t *a = calloc(1, sizeof *a);
    if (!a) {
        lrmoe_err("out of memory");
        return NULL;
    }
    lrmoe_exec_cfg_default(&a->cfg);
    return a;
}

void lrmoe_exec_args_free(lrmoe_exec_args_t *a)
{
    if (!a) return;
    if (a->have_pp) lrmoe_pack_plan_free(&a->pp);
    free(a);
}

/* Every field of that name: 0 when there is one of the kind asked for
 * (integers: int, int64 and enum fields; else pointer fields). */
static int set(lrmoe_exec_args_t *a, const char *name, int ptr, int64_t v, const void *p)
{
    if (!a || !name) return lrmoe_err("exec args: no handle or name");
    int hit = 0, other = 0;
    for (size_t i = 0; i < NFIELDS; i++) {
        if (strcmp(FIELDS[i].name, name)) continue;
        if ((FIELDS[i].kind == K_PTR) != ptr) {
            other = 1;
            continue;
        }
        char *at = base(a, FIELDS[i].s) + FIELDS[i].off;
        if (FIELDS[i].kind == K_PTR) {
            memcpy(at, &p, sizeof p);
        } else if (FIELDS[i].kind == K_I64) {
            memcpy(at, &v, sizeof v);
        } else {
            if (v < INT32_MIN || v > INT32_MAX)
                return lrmoe_err("exec args: %s = %lld is out of int range", name, (long long)v);
            int iv = (int)v; /* an int field, or an enum (int-sized here) */
            memcpy(at, &iv, sizeof iv);
        }
        hit = 1;
    }
    if (hit) return 0;
    if (other)
        return lrmoe_err("exec args: '%s' is %s", name,
                         ptr ? "a number (lrmoe_exec_args_set)" : "a pointer (lrmoe_exec_args_set_ptr)");
    return lrmoe_err("exec args: no argument '%s' (lrmoe_exec_args_new(3) lists them)", name);
}

int lrmoe_exec_args_set(lrmoe_exec_args_t *a, const char *name, int64_t value)
{
    return set(a, name, 0, value, NULL);
}

int lrmoe_exec_args_set_ptr(lrmoe_exec_args_t *a, const char *name, const void *p)
{
    return set(a, name, 1, 0, p);
}

int lrmoe_exec_args_get(const lrmoe_exec_args_t *a, const char *name, int64_t *value)
{
    if (!a || !name || !value) return lrmoe_err("exec args: no handle, name or value");
    if (!strcmp(name, "moved")) {
        *value = a->have_pp ? a->pp.moved : 0;
        return 0;
    }
    for (size_t i = 0; i < NFIELDS; i++) {
        if (strcmp(FIELDS[i].name, name) || FIELDS[i].kind == K_PTR) continue;
        const char *at = base((lrmoe_exec_args_t *)a, FIELDS[i].s) + FIELDS[i].off;
        if (FIELDS[i].kind == K_I64) {
            memcpy(value, at, sizeof *value);
        } else {
            int iv;
            memcpy(&iv, at, sizeof iv);
            *value = iv;
        }
        return 0;
    }
    return lrmoe_err("exec args: no number '%s'", name);
}

const void *lrmoe_exec_args_get_ptr(const lrmoe_exec_args_t *a, const char *name)
{
    if (!a || !name) return NULL;
    for (size_t i = 0; i < NFIELDS; i++) {
        if (strcmp(FIELDS[i].name, name) || FIELDS[i].kind != K_PTR) continue;
        const void *p;
        memcpy(&p, base((lrmoe_exec_args_t *)a, FIELDS[i].s) + FIELDS[i].off, sizeof p);
        return p;
    }
    return NULL;
}

int lrmoe_exec_args_pack(lrmoe_exec_args_t *a)
{
    if (!a) return lrmoe_err("exec args: no handle");
    lrmoe_pack_plan_t pp;
    if (lrmoe_pack_assign(&a->pin, &pp) < 0) return -1;
    if (a->have_pp) lrmoe_pack_plan_free(&a->pp);
    a->pp = pp;
    a->have_pp = 1;
    a->b.R = pp.R;
    a->b.pack_pair = pp.pair;
    a->b.pack_rank = pp.rank;
    a->b.pack_counts = pp.counts;
    a->b.pack_offsets = pp.offsets;
    return 0;
}

int lrmoe_exec_args_forward(lrmoe_exec_args_t *a, double *timings)
{
    if (!a) return lrmoe_err("exec args: no handle");
    return lrmoe_exec_forward(&a->cfg, &a->d, &a->w, &a->plan, &a->f, timings);
}

int lrmoe_exec_args_backward(lrmoe_exec_args_t *a, double *timings)
{
    if (!a) return lrmoe_err("exec args: no handle");
    return lrmoe_exec_backward(&a->cfg, &a->d, &a->w, &a->plan, &a->b, timings);
}

int lrmoe_exec_args_cuda_new(const lrmoe_exec_args_t *a, lrmoe_exec_cuda_t **out)
{
    if (!a || !out) return lrmoe_err("exec args: no handle");
    *out = NULL;
    return lrmoe_exec_cuda_new(&a->cfg, a->d.P, out);
}

int lrmoe_exec_args_forward_cuda(lrmoe_exec_args_t *a, lrmoe_exec_cuda_t *x, double *timings)
{
    if (!a || !x) return lrmoe_err("exec args: no handle");
    return lrmoe_exec_cuda_forward(x, &a->cfg, &a->d, &a->w, &a->plan, &a->f, timings);
}

int lrmoe_exec_args_backward_cuda(lrmoe_exec_args_t *a, lrmoe_exec_cuda_t *x, double *timings)
{
    if (!a || !x) return lrmoe_err("exec args: no handle");
    return lrmoe_exec_cuda_backward(x, &a->cfg, &a->d, &a->w, &a->plan, &a->b, timings);
}
