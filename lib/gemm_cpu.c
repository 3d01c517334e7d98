/* CPU GEMMs: OpenBLAS sgemm (f32) and oneDNN BF16 matmul (bf16). See gemm_cpu.h. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "blas.h"
#include "gemm_cpu.h"
#include "gemm_amx.h"
#include "gemm_avx2.h"
#include "gemm_dpbf16.h"
#ifdef LRMOE_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
void omp_set_num_threads(int n);
#endif

int lrmoe_compute_parse(const char *s, lrmoe_compute_t *c)
{
    if (!strcmp(s, "auto")) { *c = LRMOE_COMPUTE_AUTO; return 0; }
    if (!strcmp(s, "f32")) { *c = LRMOE_COMPUTE_F32; return 0; }
    if (!strcmp(s, "bf16")) { *c = LRMOE_COMPUTE_BF16; return 0; }
    return lrmoe_err("unknown compute '%s' (auto, f32, bf16)", s);
}

const char *lrmoe_compute_name(lrmoe_compute_t c)
{
    switch (c) {
    case LRMOE_COMPUTE_F32: return "f32";
    case LRMOE_COMPUTE_BF16: return "bf16";
    default: return "auto";
    }
}

int lrmoe_gemm_have_dnnl(void)
{
#ifdef LRMOE_HAVE_DNNL
    return 1;
#else
    return 0;
#endif
}

void lrmoe_gemm_to_bf16(const float *src, void *dst, size_t n)
{
    lrmoe_convert_from_f32(LRMOE_BF16, src, dst, n);   /* the vectorised kernel of lib/dtype.c */
}

/* Pack rows x cols of src (dtype sdt, row stride ld) into dst (dtype ddt)
 * as a (drows, dcols) row-major matrix, zero-filling the extra rows/columns. */
static void pack(const void *src, lrmoe_dtype_t sdt, int64_t rows, int64_t cols, int64_t ld,
                 void *dst, lrmoe_dtype_t ddt, int64_t drows, int64_t dcols)
{
    const size_t ss = lrmoe_dtype_size(sdt), ds = lrmoe_dtype_size(ddt);
    for (int64_t i = 0; i < rows; i++) {
        const char *s = (const char *)src + (size_t)(i * ld) * ss;
        char *d = (char *)dst + (size_t)(i * dcols) * ds;
        if (sdt == ddt) memcpy(d, s, (size_t)cols * ds);
        else if (ddt == LRMOE_F32) lrmoe_convert_to_f32(sdt, s, (float *)d, (size_t)cols);
        else lrmoe_gemm_to_bf16((const float *)s, d, (size_t)cols);
        if (dcols > cols) memset(d + (size_t)cols * ds, 0, (size_t)(dcols - cols) * ds);
    }
    if (drows > rows)
        memset((char *)dst + (size_t)(rows * dcols) * ds, 0, (size_t)((drows - rows) * dcols) * ds);
}

#ifdef LRMOE_HAVE_DNNL
typedef struct {
    int ta, tb, acc;
    int64_t M, N, K, lda, ldb, ldc;  /* fixed-shape entries; all -1 for the runtime ones */
    dnnl_primitive_t p;
} prim_t;
#endif

struct lrmoe_gemm {
    lrmoe_compute_t c;
    void *scr[6];             /* conversion scratch of A and B; [2]: lrmoe_gemm2's A;
                                 [3]: lrmoe_gemm_bf16out's F32 product; [4]: one
                                 BF16 row of the emulated bf16 compute; [5]: the
                                 AVX2 kernel's workspace (packed A and B) */
    size_t cap[6];
    int emul;                 /* bf16 compute, kernel EMUL_*: operands rounded to
                                 BF16, then lib/gemm_avx2.c's kernel (avx2 = 1;
                                 wide: its AVX-512F form where the CPU has it,
                                 else the AVX2 form, the same bits) or sgemm */
    int avx2, wide;
    lrmoe_amx_t *amx;         /* bf16 compute on a CPU with AMX: the A B^T kernel */
    lrmoe_dpbf16_t *dp;       /* bf16 compute, kernel DPBF16: every GEMM (gemm_dpbf16.h) */
#ifdef LRMOE_HAVE_DNNL
    dnnl_engine_t eng;
    dnnl_stream_t st;
    prim_t *pc;
    int npc, cpc;
#endif
};

static void *scratch(lrmoe_gemm_t *g, int i, size_t bytes)
{
    if (bytes > g->cap[i]) {
        void *p = realloc(g->scr[i], bytes);
        if (!p) { lrmoe_err("gemm: out of memory (%zu bytes of scratch)", bytes); return NULL; }
        g->scr[i] = p;
        g->cap[i] = bytes;
    }
    return g->scr[i];
}

lrmoe_compute_t lrmoe_gemm_compute(const lrmoe_gemm_t *g) { return g->c; }

lrmoe_dtype_t lrmoe_gemm_dtype(const lrmoe_gemm_t *g)
{
    return g->c == LRMOE_COMPUTE_BF16 ? LRMOE_BF16 : LRMOE_F32;
}

/* ---------------------------------------------------------------- f32 */

static int gemm_f32(lrmoe_gemm_t *g, int ta, int tb, int64_t M, int64_t N, int64_t K,
                    const void *A, lrmoe_dtype_t adt, int64_t lda,
                    const void *B, lrmoe_dtype_t bdt, int64_t ldb,
                    int acc, float *C, int64_t ldc)
{
    const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    if (adt != LRMOE_F32) {
        void *s = scratch(g, 0, (size_t)(ar * ac) * sizeof(float));
        if (!s) return -1;
        pack(A, adt, ar, ac, lda, s, LRMOE_F32, ar, ac);
        A = s; lda = ac;
    }
    if (bdt != LRMOE_F32) {
        void *s = scratch(g, 1, (size_t)(br * bc) * sizeof(float));
        if (!s) return -1;
        pack(B, bdt, br, bc, ldb, s, LRMOE_F32, br, bc);
        B = s; ldb = bc;
    }
    return lrmoe_blas_sgemm(ta, tb, (int)M, (int)N, (int)K, 1.0f, A, (int)lda, B, (int)ldb,
                            acc ? 1.0f : 0.0f, C, (int)ldc);
}

/* ------------------------------------------------ bf16, emulated */

/* rows x cols of the F32 src (row stride ld) rounded to BF16 (nearest even,
 * lrmoe_gemm_to_bf16) and widened back into the F32 dst, row-major with row
 * stride cols. h: one BF16 row of scratch. */
static void round_rows(const float *src, int64_t rows, int64_t cols, int64_t ld, float *dst,
                       uint16_t *h)
{
    for (int64_t r = 0; r < rows; r++) {
        lrmoe_gemm_to_bf16(src + r * ld, h, (size_t)cols);
        lrmoe_convert_to_f32(LRMOE_BF16, h, dst + r * cols, (size_t)cols);
    }
}

/* The bf16 compute where oneDNN has no BF16 matmul for this CPU (AVX2
 * without AVX512_BF16/AMX): each F32 operand rounded to BF16 (nearest even,
 * lrmoe_gemm_to_bf16), BF16 operands as they are, then exact products and
 * F32 sums: the numerics of the native path in another summation order.
 * With AVX2 and FMA, lib/gemm_avx2.c multiplies, reading a BF16 B (the
 * weights) in place; A goes in as F32 (rounded or widened, scratch [0]), an
 * F32 B rounded to BF16 first (scratch [1]), the kernel's packed A and B
 * in [5].
 * Without AVX2, both operands are widened and OpenBLAS sgemm multiplies.
 * [4]: one BF16 row. */
static int gemm_bf16_emul(lrmoe_gemm_t *g, int ta, int tb, int64_t M, int64_t N, int64_t K,
                          const void *A, lrmoe_dtype_t adt, int64_t lda,
                          const void *B, lrmoe_dtype_t bdt, int64_t ldb,
                          int acc, float *C, int64_t ldc)
{
    const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    uint16_t *h = scratch(g, 4, (size_t)(ac > bc ? ac : bc) * 2);
    if (!h) return -1;
    if (g->avx2) {
        float *a = scratch(g, 0, (size_t)(ar * ac) * sizeof(float));
        if (!a) return -1;
        if (adt == LRMOE_F32) round_rows(A, ar, ac, lda, a, h);
        else pack(A, adt, ar, ac, lda, a, LRMOE_F32, ar, ac);
        A = a; lda = ac;
        if (bdt == LRMOE_F32) {
            uint16_t *d = scratch(g, 1, (size_t)(br * bc) * 2);
            if (!d) return -1;
            pack(B, bdt, br, bc, ldb, d, LRMOE_BF16, br, bc);
            B = d; ldb = bc;
        }
        float *ws = scratch(g, 5, lrmoe_avx2_gemm_ws());
        if (!ws) return -1;
        lrmoe_avx2_gemm_w(g->wide, ws, ta, tb, M, N, K, A, lda, B, 1, ldb, acc, C, ldc);
        return 0;
    }
    const void *op[2] = {A, B};
    int64_t rows[2] = {ar, br}, cols[2] = {ac, bc}, ld[2] = {lda, ldb};
    for (int i = 0; i < 2; i++) {
        if ((i ? bdt : adt) != LRMOE_F32) continue;
        float *d = scratch(g, i, (size_t)(rows[i] * cols[i]) * sizeof(float));
        if (!d) return -1;
        round_rows(op[i], rows[i], cols[i], ld[i], d, h);
        op[i] = d;
        ld[i] = cols[i];
    }
    return gemm_f32(g, ta, tb, M, N, K, op[0], adt, ld[0], op[1], bdt, ld[1], acc, C, ldc);
}

/* ---------------------------------------------------------------- bf16 */

#ifdef LRMOE_HAVE_DNNL
#define RT DNNL_RUNTIME_DIM_VAL

static int dnnl_fail(const char *what, dnnl_status_t s)
{
    return lrmoe_err("gemm: oneDNN %s failed (status %d)", what, (int)s);
}

/* (rows, cols) with row stride ld, or its transpose view when t */
static dnnl_status_t md2(dnnl_memory_desc_t *m, int64_t r, int64_t c, int t, int64_t ld,
                         dnnl_data_type_t dt)
{
    dnnl_dims_t d = {0}, s = {0};
    d[0] = r; d[1] = c;
    if (t) { s[0] = 1; s[1] = ld; } else { s[0] = ld; s[1] = 1; }
    return dnnl_memory_desc_init_by_strides(m, 2, d, dt, s);
}

/* The matmul primitive for (ta, tb, acc) with runtime dims (M < 0) or this
 * fixed shape; made once per context, oneDNN's own cache shares the rest. */
static dnnl_primitive_t prim(lrmoe_gemm_t *g, int ta, int tb, int acc, int64_t M, int64_t N,
                             int64_t K, int64_t lda, int64_t ldb, int64_t ldc)
{
    for (int i = 0; i < g->npc; i++) {
        prim_t *q = &g->pc[i];
        if (q->ta == ta && q->tb == tb && q->acc == acc && q->M == M && q->N == N &&
            q->K == K && q->lda == lda && q->ldb == ldb && q->ldc == ldc)
            return q->p;
    }
    if (g->npc == g->cpc) {
        int nc = g->cpc ? 2 * g->cpc : 16;
        prim_t *np = realloc(g->pc, (size_t)nc * sizeof *np);
        if (!np) { lrmoe_err("gemm: out of memory"); return NULL; }
        g->pc = np; g->cpc = nc;
    }
    const int rt = M < 0;
    dnnl_memory_desc_t a, b, c;
    dnnl_status_t s;
    if (rt) {
        if ((s = md2(&a, RT, RT, ta, RT, dnnl_bf16)) || (s = md2(&b, RT, RT, tb, RT, dnnl_bf16)) ||
            (s = md2(&c, RT, RT, 0, RT, dnnl_f32))) {
            dnnl_fail("memory descriptor", s);
            return NULL;
        }
    } else if ((s = md2(&a, M, K, ta, lda, dnnl_bf16)) || (s = md2(&b, K, N, tb, ldb, dnnl_bf16)) ||
               (s = md2(&c, M, N, 0, ldc, dnnl_f32))) {
        dnnl_fail("memory descriptor", s);
        return NULL;
    }
    dnnl_matmul_desc_t d;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t p = NULL;
    if ((s = dnnl_matmul_desc_init(&d, &a, &b, NULL, &c))) { dnnl_fail("matmul descriptor", s); return NULL; }
    if ((s = dnnl_primitive_attr_create(&attr))) { dnnl_fail("attributes", s); return NULL; }
    if (acc && ((s = dnnl_post_ops_create(&po)) || (s = dnnl_post_ops_append_sum(po, 1.0f)) ||
                (s = dnnl_primitive_attr_set_post_ops(attr, po)))) {
        dnnl_fail("sum post-op", s);
        goto out;
    }
    if ((s = dnnl_primitive_desc_create(&pd, &d, attr, g->eng, NULL))) {
        dnnl_fail("BF16 matmul (is BF16 supported on this CPU?)", s);
        goto out;
    }
    if ((s = dnnl_primitive_create(&p, pd))) { dnnl_fail("primitive", s); p = NULL; goto out; }
    g->pc[g->npc++] = (prim_t){ta, tb, acc, M, N, K, lda, ldb, ldc, p};
out:
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    return p;
}

static int run(lrmoe_gemm_t *g, dnnl_primitive_t p, int ta, int tb, int64_t M, int64_t N,
               int64_t K, const void *A, int64_t lda, const void *B, int64_t ldb, float *C,
               int64_t ldc)
{
    dnnl_memory_desc_t a, b, c;
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL;
    dnnl_status_t s;
    int rc = -1;
    if ((s = md2(&a, M, K, ta, lda, dnnl_bf16)) || (s = md2(&b, K, N, tb, ldb, dnnl_bf16)) ||
        (s = md2(&c, M, N, 0, ldc, dnnl_f32)) ||
        (s = dnnl_memory_create(&ma, &a, g->eng, (void *)A)) ||
        (s = dnnl_memory_create(&mb, &b, g->eng, (void *)B)) ||
        (s = dnnl_memory_create(&mc, &c, g->eng, C))) {
        dnnl_fail("memory", s);
        goto out;
    }
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
    if ((s = dnnl_primitive_execute(p, g->st, 3, args)) || (s = dnnl_stream_wait(g->st))) {
        dnnl_fail("matmul", s);
        goto out;
    }
    rc = 0;
out:
    if (ma) dnnl_memory_destroy(ma);
    if (mb) dnnl_memory_destroy(mb);
    if (mc) dnnl_memory_destroy(mc);
    return rc;
}

/* fixed-shape primitives a context keeps for the K-fixed GEMMs (one per row
 * count); past that (a long run of many segment sizes) the runtime-dims one */
#define MAXPRIM 512

/* K rounding of the fixed-shape (ta) GEMMs */
#define KQ 16

static int gemm_bf16(lrmoe_gemm_t *g, int ta, int tb, int64_t M, int64_t N, int64_t K,
                     const void *A, lrmoe_dtype_t adt, int64_t lda,
                     const void *B, lrmoe_dtype_t bdt, int64_t ldb,
                     int acc, float *C, int64_t ldc)
{
    const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    if (!ta && tb && bdt == LRMOE_BF16 && g->amx && lrmoe_amx_shape_ok(N, K)) {
        /* activations times stored BF16 weights: the AMX kernel (gemm_amx.h) */
        if (lrmoe_amx_pack(g->amx, M, K, A, adt == LRMOE_F32, lda) < 0) return -1;
        return lrmoe_amx_gemm(g->amx, N, B, ldb, C, ldc, acc);
    }
    if (!ta && !tb && bdt == LRMOE_BF16 && g->amx && lrmoe_amx_shape_ok(N, K))
        /* activations times untransposed stored BF16 weights */
        return lrmoe_amx_gemm_nn(g->amx, M, N, K, A, adt == LRMOE_F32, lda, B, ldb, C, ldc, acc);
    if (!ta) {
        /* K fixed by the layer (D, F): a fixed-shape primitive per (M, N, K)
         * (oneDNN 2.6 runs runtime-dims matmul with its slower gemm:jit) */
        if (adt != LRMOE_BF16) {
            void *s = scratch(g, 0, (size_t)(ar * ac) * 2);
            if (!s) return -1;
            pack(A, adt, ar, ac, lda, s, LRMOE_BF16, ar, ac);
            A = s; lda = ac;
        }
        if (bdt != LRMOE_BF16) {
            void *s = scratch(g, 1, (size_t)(br * bc) * 2);
            if (!s) return -1;
            pack(B, bdt, br, bc, ldb, s, LRMOE_BF16, br, bc);
            B = s; ldb = bc;
        }
        dnnl_primitive_t p = g->npc < MAXPRIM ? prim(g, ta, tb, acc, M, N, K, lda, ldb, ldc)
                                              : prim(g, ta, tb, acc, -1, -1, -1, -1, -1, -1);
        return p ? run(g, p, ta, tb, M, N, K, A, lda, B, ldb, C, ldc) : -1;
    }
    if (!tb && !acc && adt == LRMOE_BF16 && bdt == LRMOE_BF16 && g->amx && N % 16 == 0)
        /* weight gradients A^T B on AMX (K padded inside) */
        return lrmoe_amx_gemm_tn(g->amx, M, N, K, A, lda, B, ldb, C, ldc);
    /* weight gradients: K = the segment's rows, rounded up to KQ with zeros */
    const int64_t KP = (K + KQ - 1) / KQ * KQ;
    /* both operands packed (zero rows to KP) for the fixed-shape primitive */
    if (adt != LRMOE_BF16 || KP != K || lda != ac) {
        void *s = scratch(g, 0, (size_t)(KP * ac) * 2);
        if (!s) return -1;
        pack(A, adt, ar, ac, lda, s, LRMOE_BF16, KP, ac);
        A = s; lda = ac;
    }
    const int64_t pr = tb ? br : KP, pcol = tb ? KP : bc;
    if (bdt != LRMOE_BF16 || KP != K || ldb != pcol) {
        void *s = scratch(g, 1, (size_t)(pr * pcol) * 2);
        if (!s) return -1;
        pack(B, bdt, br, bc, ldb, s, LRMOE_BF16, pr, pcol);
        B = s; ldb = pcol;
    }
    dnnl_primitive_t p = prim(g, ta, tb, acc, M, N, KP, lda, ldb, ldc);
    return p ? run(g, p, ta, tb, M, N, KP, A, lda, B, ldb, C, ldc) : -1;
}
#undef KQ

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int probe_native, probe_any;
static char probe_impl[128] = "none";

static void probe(void)
{
    dnnl_engine_t eng;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0)) return;
    dnnl_memory_desc_t a, b, c;
    dnnl_matmul_desc_t d;
    dnnl_primitive_desc_t pd;
    if (!md2(&a, 64, 64, 0, 64, dnnl_bf16) && !md2(&b, 64, 64, 1, 64, dnnl_bf16) &&
        !md2(&c, 64, 64, 0, 64, dnnl_f32) && !dnnl_matmul_desc_init(&d, &a, &b, NULL, &c) &&
        !dnnl_primitive_desc_create(&pd, &d, NULL, eng, NULL)) {
        const char *impl = NULL;
        probe_any = 1;
        if (!dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) && impl) {
            snprintf(probe_impl, sizeof probe_impl, "%s", impl);
            /* brgemm names its ISA: AMX or AVX512_BF16 multiply BF16 in
             * hardware; plain AVX512/AVX2 emulate it (no faster than sgemm) */
            probe_native = !strstr(impl, "ref") && (strstr(impl, "amx") || strstr(impl, "bf16"));
        }
        dnnl_primitive_desc_destroy(pd);
    }
    dnnl_engine_destroy(eng);
}
#endif

int lrmoe_gemm_bf16_native(const char **impl)
{
#ifdef LRMOE_HAVE_DNNL
    pthread_once(&probe_once, probe);
    if (impl) *impl = probe_impl;
    return probe_native;
#else
    if (impl) *impl = "none (built without oneDNN)";
    return 0;
#endif
}

/* The emulated bf16 also wins where the CPU's F32 FMAs do this many times
 * the FLOPs of its BF16 dot product (no AMX): measured 2.0 on a Xeon with
 * AVX512_BF16 and no AMX, where the AVX-512 kernel's layer GEMMs ran
 * 1.2-1.6x faster than oneDNN's BF16 matmul, and 2.0 on an AMX Xeon with
 * LRMOE_AMX=0, where it ran one expert's GEMMs 1.12-1.44x as fast as
 * lib/gemm_dpbf16.c (tests/bench/cpu.sh); a CPU whose dot product does at
 * least the FMA's FLOPs (Zen 4: 0.5) takes dpbf16. */
#define FMA_OVER_DOT 1.4

int lrmoe_gemm_bf16_emulated(void)
{
#ifdef LRMOE_HAVE_DNNL
    const char *e = getenv("LRMOE_BF16_EMULATE"); /* 1: emulate anyway; 0: native where any */
    if (e && !strcmp(e, "1")) return 1;
    pthread_once(&probe_once, probe);
    if (!probe_any) return 1;
    if (e && !strcmp(e, "0")) return 0;
    return !lrmoe_amx_available() && lrmoe_avx2_gemm_wide() &&
           lrmoe_avx2_fma_over_bf16dot() >= FMA_OVER_DOT;
#else
    return 0;
#endif
}

const char *lrmoe_gemm_kernel_name(int kind)
{
    switch (kind) {
    case LRMOE_KERNEL_AMX: return "amx";
    case LRMOE_KERNEL_NATIVE: return "native";
    case LRMOE_KERNEL_EMUL_AVX512: return "emulated-avx512";
    case LRMOE_KERNEL_EMUL_AVX2: return "emulated-avx2";
    case LRMOE_KERNEL_EMUL_SGEMM: return "emulated-sgemm";
    case LRMOE_KERNEL_DPBF16: return "dpbf16";
    default: return "none";
    }
}

/* the kernel pinned by lrmoe_gemm_kernel_pin (kind NONE: none pinned) */
static lrmoe_gemm_kernel_t pinned;
static pthread_mutex_t pin_mu = PTHREAD_MUTEX_INITIALIZER;

/* oneDNN's identity for the kernels that call it: version and the probe's
 * implementation */
static void dnnl_ident(lrmoe_gemm_kernel_t *k)
{
#ifdef LRMOE_HAVE_DNNL
    const dnnl_version_t *v = dnnl_version();
    const char *impl = NULL;
    lrmoe_gemm_bf16_native(&impl);
    k->dnnl_version = (int)(v->major * 10000 + v->minor * 100 + v->patch);
    snprintf(k->dnnl_impl, sizeof k->dnnl_impl, "%.*s", (int)sizeof k->dnnl_impl - 1,
             impl ? impl : "");
#else
    (void)k;
#endif
}

/* this process's default choice (see gemm_cpu.h) */
static void kernel_default(lrmoe_gemm_kernel_t *k)
{
    memset(k, 0, sizeof *k);
    if (!lrmoe_gemm_have_dnnl()) return;
    if (lrmoe_gemm_bf16_emulated()) {
        k->kind = !lrmoe_avx2_gemm_available() ? LRMOE_KERNEL_EMUL_SGEMM
                  : lrmoe_avx2_gemm_wide()     ? LRMOE_KERNEL_EMUL_AVX512
                                               : LRMOE_KERNEL_EMUL_AVX2;
        return;
    }
    if (!lrmoe_amx_available() && lrmoe_dpbf16_available()) {
        k->kind = LRMOE_KERNEL_DPBF16;   /* lrmoe's own: no oneDNN identity */
        return;
    }
    k->kind = lrmoe_amx_available() ? LRMOE_KERNEL_AMX : LRMOE_KERNEL_NATIVE;
    dnnl_ident(k);
}

void lrmoe_gemm_kernel(lrmoe_gemm_kernel_t *k)
{
    pthread_mutex_lock(&pin_mu);
    *k = pinned;
    pthread_mutex_unlock(&pin_mu);
    if (k->kind == LRMOE_KERNEL_NONE) kernel_default(k);
}

int lrmoe_gemm_kernel_check(const lrmoe_gemm_kernel_t *k)
{
    const char *name = lrmoe_gemm_kernel_name(k->kind);
    switch (k->kind) {
    case LRMOE_KERNEL_NONE:
        return 0;
    case LRMOE_KERNEL_EMUL_AVX512:
    case LRMOE_KERNEL_EMUL_AVX2:
        /* one kernel in two widths with the same bits: either form will do */
        if (!lrmoe_avx2_gemm_available())
            return lrmoe_err("the job's bf16 kernel is %s (lib/gemm_avx2.c), which needs AVX2 "
                             "and FMA: this process has not both (or LRMOE_AVX2_GEMM=0 is set)",
                             name);
        return 0;
    case LRMOE_KERNEL_EMUL_SGEMM:
        return 0;   /* OpenBLAS sgemm on BF16-rounded operands: any CPU */
    case LRMOE_KERNEL_DPBF16:
        if (!lrmoe_gemm_have_dnnl())
            return lrmoe_err("the job's bf16 kernel is dpbf16 (lib/gemm_dpbf16.c): this build "
                             "has no oneDNN, so no bf16 compute");
        if (!lrmoe_dpbf16_available())
            return lrmoe_err("the job's bf16 kernel is dpbf16 (lib/gemm_dpbf16.c), which needs "
                             "AVX-512F/BW/VL and AVX512_BF16: this process has not all of them "
                             "(or LRMOE_DPBF16=0 is set)");
        return 0;
    case LRMOE_KERNEL_AMX:
    case LRMOE_KERNEL_NATIVE: {
        if (!lrmoe_gemm_have_dnnl())
            return lrmoe_err("the job's bf16 kernel is %s (oneDNN's BF16 matmul): this build "
                             "has no oneDNN", name);
        if (k->kind == LRMOE_KERNEL_AMX && !lrmoe_amx_available())
            return lrmoe_err("the job's bf16 kernel is amx (lib/gemm_amx.c): this process has "
                             "no AMX BF16 (CPU, kernel permission, or LRMOE_AMX=0)");
        const char *impl = NULL;
        if (!lrmoe_gemm_bf16_native(&impl))
            return lrmoe_err("the job's bf16 kernel is %s (oneDNN %d.%d.%d, %s): this "
                             "process's oneDNN has no native BF16 matmul (%s; AVX512_BF16 or "
                             "AMX needed, or DNNL_MAX_CPU_ISA caps it)", name,
                             k->dnnl_version / 10000, k->dnnl_version / 100 % 100,
                             k->dnnl_version % 100, k->dnnl_impl, impl ? impl : "none");
        lrmoe_gemm_kernel_t me;
        memset(&me, 0, sizeof me);
        dnnl_ident(&me);
        if (me.dnnl_version != k->dnnl_version || strcmp(me.dnnl_impl, k->dnnl_impl))
            return lrmoe_err("the job's bf16 kernel is %s on oneDNN %d.%d.%d's %s, this "
                             "process's oneDNN is %d.%d.%d with %s (another summation order; "
                             "DNNL_MAX_CPU_ISA can cap the ISA)", name,
                             k->dnnl_version / 10000, k->dnnl_version / 100 % 100,
                             k->dnnl_version % 100, k->dnnl_impl, me.dnnl_version / 10000,
                             me.dnnl_version / 100 % 100, me.dnnl_version % 100, me.dnnl_impl);
        return 0;
    }
    default:
        return lrmoe_err("bf16 kernel %d: unknown", k->kind);
    }
}

int lrmoe_gemm_kernel_pin(const lrmoe_gemm_kernel_t *k)
{
    if (k->kind == LRMOE_KERNEL_NONE) return 0;
    if (lrmoe_gemm_kernel_check(k) < 0) return -1;
    pthread_mutex_lock(&pin_mu);
    pinned = *k;
    pinned.dnnl_impl[sizeof pinned.dnnl_impl - 1] = 0;
    pthread_mutex_unlock(&pin_mu);
    return 0;
}

int lrmoe_gemm_resolve(lrmoe_compute_t want, lrmoe_dtype_t wdt, lrmoe_compute_t *out)
{
    if (want == LRMOE_COMPUTE_BF16 && !lrmoe_gemm_have_dnnl())
        return lrmoe_err("--compute bf16: this build has no oneDNN (install libdnnl-dev "
                         "and rebuild); --compute f32 is the exact path");
    if (want == LRMOE_COMPUTE_AUTO)
        want = wdt == LRMOE_BF16 && lrmoe_gemm_bf16_native(NULL) ? LRMOE_COMPUTE_BF16
                                                                 : LRMOE_COMPUTE_F32;
    *out = want;
    return 0;
}

lrmoe_gemm_t *lrmoe_gemm_new(lrmoe_compute_t compute, int threads)
{
    lrmoe_gemm_t *g = calloc(1, sizeof *g);
    if (!g) { lrmoe_err("gemm: out of memory"); return NULL; }
    g->c = compute == LRMOE_COMPUTE_BF16 ? LRMOE_COMPUTE_BF16 : LRMOE_COMPUTE_F32;
    if (g->c == LRMOE_COMPUTE_BF16) {
#ifdef LRMOE_HAVE_DNNL
        dnnl_status_t s;
        if ((s = dnnl_engine_create(&g->eng, dnnl_cpu, 0))) {
            dnnl_fail("engine", s);
            free(g);
            return NULL;
        }
        if ((s = dnnl_stream_create(&g->st, g->eng, dnnl_stream_default_flags))) {
            dnnl_fail("stream", s);
            dnnl_engine_destroy(g->eng);
            free(g);
            return NULL;
        }
        if (threads > 0) omp_set_num_threads(threads);
        lrmoe_gemm_kernel_t k;
        lrmoe_gemm_kernel(&k);
        g->emul = k.kind >= LRMOE_KERNEL_EMUL_AVX512 && k.kind <= LRMOE_KERNEL_EMUL_SGEMM;
        g->avx2 = k.kind == LRMOE_KERNEL_EMUL_AVX512 || k.kind == LRMOE_KERNEL_EMUL_AVX2;
        g->wide = k.kind == LRMOE_KERNEL_EMUL_AVX512;
        if ((k.kind == LRMOE_KERNEL_AMX && !(g->amx = lrmoe_amx_new())) ||
            (k.kind == LRMOE_KERNEL_DPBF16 && !(g->dp = lrmoe_dpbf16_new()))) {
            lrmoe_gemm_free(g);
            return NULL;
        }
#else
        (void)threads;
        free(g);
        lrmoe_gemm_resolve(LRMOE_COMPUTE_BF16, LRMOE_BF16, &compute);
        return NULL;
#endif
    }
    return g;
}

void lrmoe_gemm_free(lrmoe_gemm_t *g)
{
    if (!g) return;
#ifdef LRMOE_HAVE_DNNL
    for (int i = 0; i < g->npc; i++) dnnl_primitive_destroy(g->pc[i].p);
    free(g->pc);
    if (g->st) dnnl_stream_destroy(g->st);
    if (g->eng) dnnl_engine_destroy(g->eng);
#endif
    lrmoe_amx_free(g->amx);
    lrmoe_dpbf16_free(g->dp);
    for (int i = 0; i < 6; i++) free(g->scr[i]);
    free(g);
}

int lrmoe_gemm(lrmoe_gemm_t *g, int ta, int tb, int64_t M, int64_t N, int64_t K,
               const void *A, lrmoe_dtype_t adt, int64_t lda,
               const void *B, lrmoe_dtype_t bdt, int64_t ldb,
               int acc, float *C, int64_t ldc)
{
    if (M <= 0 || N <= 0) return 0;
    if (K <= 0) { /* an empty sum */
        if (!acc)
            for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, (size_t)N * sizeof *C);
        return 0;
    }
    if ((adt != LRMOE_F32 && adt != LRMOE_BF16) || (bdt != LRMOE_F32 && bdt != LRMOE_BF16))
        return lrmoe_err("gemm: operands must be F32 or BF16");
    if (g->dp)
        return lrmoe_dpbf16_gemm(g->dp, ta, tb, M, N, K, A, adt == LRMOE_F32, lda, B,
                                 bdt == LRMOE_F32, ldb, acc, C, ldc);
    if (g->c == LRMOE_COMPUTE_BF16 && g->emul)
        return gemm_bf16_emul(g, ta, tb, M, N, K, A, adt, lda, B, bdt, ldb, acc, C, ldc);
#ifdef LRMOE_HAVE_DNNL
    if (g->c == LRMOE_COMPUTE_BF16)
        return gemm_bf16(g, ta, tb, M, N, K, A, adt, lda, B, bdt, ldb, acc, C, ldc);
#endif
    return gemm_f32(g, ta, tb, M, N, K, A, adt, lda, B, bdt, ldb, acc, C, ldc);
}

int lrmoe_gemm2(lrmoe_gemm_t *g, int64_t M, int64_t N, int64_t K, const void *A,
                lrmoe_dtype_t adt, int64_t lda, const void *B1, const void *B2,
                lrmoe_dtype_t bdt, int64_t ldb, float *C, int64_t ldc)
{
    if (M <= 0 || N <= 0 || K <= 0)
        return lrmoe_gemm(g, 0, 1, M, N, K, A, adt, lda, B1, bdt, ldb, 0, C, ldc) < 0 ||
               lrmoe_gemm(g, 0, 1, M, N, K, A, adt, lda, B2, bdt, ldb, 0, C + N, ldc) < 0 ? -1 : 0;
    if ((adt != LRMOE_F32 && adt != LRMOE_BF16) || (bdt != LRMOE_F32 && bdt != LRMOE_BF16))
        return lrmoe_err("gemm: operands must be F32 or BF16");
    if (g->amx && bdt == LRMOE_BF16 && lrmoe_amx_shape_ok(N, K)) {
        /* one packing of A for both products */
        if (lrmoe_amx_pack(g->amx, M, K, A, adt == LRMOE_F32, lda) < 0) return -1;
        return lrmoe_amx_gemm(g->amx, N, B1, ldb, C, ldc, 0) < 0 ||
               lrmoe_amx_gemm(g->amx, N, B2, ldb, C + N, ldc, 0) < 0 ? -1 : 0;
    }
    if (g->dp && bdt == LRMOE_BF16) /* one packing of A for both products, as above */
        return lrmoe_dpbf16_gemm2(g->dp, M, N, K, A, adt == LRMOE_F32, lda, B1, B2, ldb, C, ldc);
    const lrmoe_dtype_t odt = lrmoe_gemm_dtype(g);
    if (adt != odt) { /* A in the compute's operand dtype once, for both */
        void *s = scratch(g, 2, (size_t)(M * K) * lrmoe_dtype_size(odt));
        if (!s) return -1;
        pack(A, adt, M, K, lda, s, odt, M, K);
        A = s; adt = odt; lda = K;
    }
    if (lrmoe_gemm(g, 0, 1, M, N, K, A, adt, lda, B1, bdt, ldb, 0, C, ldc) < 0 ||
        lrmoe_gemm(g, 0, 1, M, N, K, A, adt, lda, B2, bdt, ldb, 0, C + N, ldc) < 0)
        return -1;
    return 0;
}

int lrmoe_gemm_bf16out(lrmoe_gemm_t *g, int64_t M, int64_t N, int64_t K, const void *A,
                       lrmoe_dtype_t adt, int64_t lda, const void *B, lrmoe_dtype_t bdt,
                       int64_t ldb, uint16_t *C, int64_t ldc)
{
    if (M <= 0 || N <= 0) return 0;
    if (g->amx && K > 0 && bdt == LRMOE_BF16 && (adt == LRMOE_F32 || adt == LRMOE_BF16) &&
        lrmoe_amx_shape_ok(N, K)) {
        if (lrmoe_amx_pack(g->amx, M, K, A, adt == LRMOE_F32, lda) < 0) return -1;
        return lrmoe_amx_gemm_bf16(g->amx, N, B, ldb, C, ldc);
    }
    if (g->dp && bdt == LRMOE_BF16 && (adt == LRMOE_F32 || adt == LRMOE_BF16) &&
        lrmoe_dpbf16_bf16out_ok(M, K) && !getenv("LRMOE_DPBF16_F32OUT"))
        return lrmoe_dpbf16_gemm_bf16out(g->dp, M, N, K, A, adt == LRMOE_F32, lda, B, ldb, C, ldc);
    float *c = scratch(g, 3, (size_t)(M * N) * sizeof *c);
    if (!c || lrmoe_gemm(g, 0, 1, M, N, K, A, adt, lda, B, bdt, ldb, 0, c, N) < 0) return -1;
    for (int64_t i = 0; i < M; i++) lrmoe_gemm_to_bf16(c + i * N, C + i * ldc, (size_t)N);
    return 0;
}
