/* The Hopper grouped GEMM's host-testable logic (kernels/ggemm.cu): argument
 * checks, the per-group sizes and pointers its setup kernel derives from the
 * device-side row offsets, and the split of a lrmoe_gemm_t list into
 * CUTLASS launches. Plain C99, __host__ __device__ under nvcc: the setup
 * kernel calls kcu_gg_group() on the device, tests/gpu/ggemm-test.c calls
 * the same function on the host. */
#ifndef LRMOE_GGEMM_SETUP_H
#define LRMOE_GGEMM_SETUP_H

#include <limits.h>
#include <stdint.h>
#include "kcu.h"
#include "ggemm_variant.h"

#ifdef __CUDACC__
#define KGG_HD __host__ __device__
#else
#define KGG_HD
#endif

/* The device arrays of one CUTLASS launch of G groups, carved out of one
 * block (8-byte fields first): pointers a, b, c, then strides lda, ldb,
 * ldc (int64, in elements), then shapes (3 ints a group: M, N, K) and zm
 * (rows the setup kernel zeroes in a group: k == 0 with beta == 0, else 0). */
typedef struct {
    const void **a, **b;
    void **c;
    int64_t *lda, *ldb, *ldc;
    int *shapes, *zm;
} kcu_gg_arrays_t;

static inline KGG_HD size_t kcu_gg_bytes(int64_t G)
{
    return (size_t)G * (6 * 8 + 4 * 4);
}
static inline KGG_HD void kcu_gg_carve(void *base, int64_t G, kcu_gg_arrays_t *x)
{
    char *p = (char *)base;
    x->a = (const void **)p;          p += G * 8;
    x->b = (const void **)p;          p += G * 8;
    x->c = (void **)p;                p += G * 8;
    x->lda = (int64_t *)p;            p += G * 8;
    x->ldb = (int64_t *)p;            p += G * 8;
    x->ldc = (int64_t *)p;            p += G * 8;
    x->shapes = (int *)p;             p += G * 12;
    x->zm = (int *)p;
}

/* One group's sizes and element offsets of its operands from the base
 * pointers of lrmoe_ggemm_t. */
typedef struct {
    int m, n, k;       /* what CUTLASS computes (m = 0: nothing) */
    int zm;            /* rows of C to zero instead (k == 0, beta == 0) */
    int64_t ao, bo, co;
} kcu_gg_group_t;

/* Group g of d from its row offsets o0 = offsets[g], o1 = offsets[g+1]
 * (device memory; read by the setup kernel). Returns 0, or 1 when the
 * offsets are bad (o0 < 0, o1 < o0, o1 > d->rows, or a group of more than
 * INT_MAX rows): then the group is empty (nothing computed, nothing
 * zeroed) and the caller raises its error flag. */
static inline KGG_HD int kcu_gg_group(const lrmoe_ggemm_t *d, int64_t g, int64_t o0, int64_t o1,
                                      kcu_gg_group_t *out)
{
    int64_t rows = o1 - o0, m, n = d->n, k;
    out->m = out->n = out->k = out->zm = 0;
    out->ao = out->bo = out->co = 0;
    if (o0 < 0 || o1 < o0 || o1 > d->rows || rows > INT_MAX) return 1;
    if (!d->kgrouped) {          /* C_g (rows, n) = A_g (rows, k) op(B_g) */
        m = rows; k = d->k;
        out->ao = o0 * d->lda;
        out->bo = g * d->sb;
        out->co = o0 * d->ldc;
    } else {                     /* C_g (m, n) = A_g^T B_g, K = rows */
        m = d->m; k = rows;
        out->ao = o0 * d->lda;
        out->bo = o0 * d->ldb;
        out->co = g * d->sc;
    }
    out->n = (int)n;
    if (m && n && !k) {          /* C = beta*C */
        out->zm = d->beta == 0.0f ? (int)m : 0;
        return 0;
    }
    if (m && n) {
        out->m = (int)m;
        out->k = (int)k;
    }
    return 0;
}

/* Host check of a lrmoe_ggemm_t; NULL when it can run, else why not.
 * The fixed sizes must be multiples of 8 and every pointer and stride 16
 * bytes aligned (TMA); the row-grouped form has ta = 0, the K-grouped form
 * ta = 1, tb = 0 (the forms of lrmoe's MoE layer). */
static inline const char *kcu_gg_check(const lrmoe_ggemm_t *d)
{
    if (d->ngroups < 0) return "negative group count";
    if (d->ngroups > 0 && !d->offsets) return "no offsets";
    if (d->rows < 0) return "negative row count";
    if (d->beta != 0.0f && d->beta != 1.0f) return "beta must be 0 or 1";
    if (d->c_bf16 != 0 && d->c_bf16 != 1) return "c_bf16 must be 0 or 1";
    if (!d->kgrouped) {
        if (d->ta) return "row-grouped: A must not be transposed (ta = 0)";
        if (d->n < 0 || d->k < 0 || d->n > INT_MAX || d->k > INT_MAX) return "n or k out of range";
        if (d->lda < d->k || d->ldb < (d->tb ? d->k : d->n) || d->ldc < d->n)
            return "leading dimension too small";
        if (d->sb < 0 || (d->ngroups > 1 && d->sb < (d->tb ? d->n * d->ldb : d->k * d->ldb) &&
                          d->sb != 0))
            return "group stride of B overlaps";
        if (d->n % 8 || d->k % 8) return "n and k must be multiples of 8";
    } else {
        if (d->kgrouped != 1) return "kgrouped must be 0 or 1";
        if (!d->ta || d->tb) return "K-grouped: ta = 1, tb = 0 (A^T B)";
        if (d->m < 0 || d->n < 0 || d->m > INT_MAX || d->n > INT_MAX) return "m or n out of range";
        if (d->lda < d->m || d->ldb < d->n || d->ldc < d->n) return "leading dimension too small";
        if (d->sc < 0 || (d->ngroups > 1 && d->sc < d->m * d->ldc)) return "group stride of C overlaps";
        if (d->m % 8 || d->n % 8) return "m and n must be multiples of 8";
    }
    int cal = d->c_bf16 ? 8 : 4;   /* C elements in 16 bytes */
    if (d->lda % 8 || d->ldb % 8 || d->ldc % cal || d->sb % 8 || d->sc % cal)
        return "strides must be multiples of 16 bytes";
    if (((uintptr_t)d->a | (uintptr_t)d->b | (uintptr_t)d->c) % 16)
        return "operands must be 16-byte aligned";
    return 0;
}

/* The CUTLASS variant (ggemm_sm90.h) of one GEMM of a lrmoe_gemm_t list, or
 * -1 when it runs as cublasGemmEx instead: both operands transposed, a size
 * or stride the kernel cannot take (sizes multiples of 8 in the operands'
 * contiguous dimensions, 16-byte aligned pointers and strides), or nothing
 * to multiply (m, n or k == 0: gemm.cu skips or zeroes those). */
static inline int kcu_gg_variant_of(const lrmoe_gemm_t *x)
{
    if (!x->m || !x->n || !x->k) return -1;
    if (x->ta && x->tb) return -1;
    if (x->m > INT_MAX || x->n > INT_MAX || x->k > INT_MAX) return -1;
    int64_t ca = x->ta ? x->m : x->k, cb = x->tb ? x->k : x->n;
    int cal = x->c_bf16 ? 8 : 4;
    if (ca % 8 || cb % 8 || x->n % cal) return -1;
    if (x->lda % 8 || x->ldb % 8 || x->ldc % cal) return -1;
    if (((uintptr_t)x->a | (uintptr_t)x->b | (uintptr_t)x->c) % 16) return -1;
    return KCU_GG_VARIANT(x->ta, x->tb, x->c_bf16);
}

/* Split a list into launches: launch[i] = variant * 2 + (beta == 1) of GEMM
 * i (one CUTLASS launch per distinct value, beta being a launch scalar), or
 * -1 (cublasGemmEx or nothing). Returns how many GEMMs go to CUTLASS. */
static inline int kcu_gg_split(int ngemm, const lrmoe_gemm_t *g, int *launch)
{
    int n = 0;
    for (int i = 0; i < ngemm; i++) {
        int v = kcu_gg_variant_of(&g[i]);
        launch[i] = v < 0 ? -1 : v * 2 + (g[i].beta != 0.0f);
        n += v >= 0;
    }
    return n;
}

#endif
