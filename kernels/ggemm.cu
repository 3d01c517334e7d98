/* The Hopper grouped GEMM (issue 39): CUTLASS 3.x's sm90 ptr-array grouped
 * kernel (kernels/cutlass/ggemm_sm90.cu, one object per operand layout and
 * C type), fed on the device.
 *
 * kcu_gg_dev (lrmoe_kcu_ggemm, gemm.cu): group sizes from device-side
 * expert-major row offsets.
 * k_gg_setup turns them into CUTLASS's per-group problem shapes, pointers
 * and strides (kcu_gg_group, ggemm_setup.h: the same function the host test
 * runs), k_gg_zero writes C = 0 for the K-grouped groups without rows when
 * beta == 0, and the CUTLASS kernel reads the shapes on the device only:
 * nothing is copied back, nothing waits on the host.
 *
 * kcu_gg_launch: one CUTLASS launch over G groups whose arrays are already
 * in device memory (gemm.cu's --gemm cutlass path fills them from a
 * lrmoe_gemm_t list through its pinned staging).
 *
 * Built without the CUTLASS headers, lrmoe_kcu_have_cutlass() is 0 and both
 * entry points fail with "not built with CUTLASS". */
#include <string.h>
#include "kcu_internal.h"
#include "ggemm_setup.h"
#ifdef LRMOE_HAVE_CUTLASS
#include "ggemm_sm90.h"
#endif

int lrmoe_kcu_have_cutlass(void)
{
#ifdef LRMOE_HAVE_CUTLASS
    return 1;
#else
    return 0;
#endif
}

/* One thread per group: sizes, pointers and strides of group g. */
__global__ void k_gg_setup(lrmoe_ggemm_t d, kcu_gg_arrays_t x)
{
    int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= d.ngroups) return;
    kcu_gg_group_t q;
    if (kcu_gg_group(&d, g, d.offsets[g], d.offsets[g + 1], &q) && d.err) *d.err = 1;
    size_t ce = d.c_bf16 ? 2 : 4;
    x.a[g] = (const char *)d.a + q.ao * 2;
    x.b[g] = (const char *)d.b + q.bo * 2;
    x.c[g] = (char *)d.c + q.co * ce;
    x.lda[g] = d.lda;
    x.ldb[g] = d.ldb;
    x.ldc[g] = d.ldc;
    x.shapes[3 * g] = q.m;
    x.shapes[3 * g + 1] = q.n;
    x.shapes[3 * g + 2] = q.k;
    x.zm[g] = q.zm;
}

/* C = 0 on the zm[g] rows of every group that has them (block row walk, no
 * division); groups along y. */
__global__ void k_gg_zero(kcu_gg_arrays_t x, int G, int c_bf16)
{
    for (int g = blockIdx.y; g < G; g += gridDim.y) {
        int zm = x.zm[g], n = x.shapes[3 * g + 1];
        if (!zm) continue;
        int64_t ld = x.ldc[g];
        for (int64_t r = blockIdx.x; r < zm; r += gridDim.x) {
            if (c_bf16) {
                uint16_t *row = (uint16_t *)x.c[g] + r * ld;
                for (int q = threadIdx.x; q < n; q += blockDim.x) row[q] = 0;
            } else {
                float *row = (float *)x.c[g] + r * ld;
                for (int q = threadIdx.x; q < n; q += blockDim.x) row[q] = 0.0f;
            }
        }
    }
}

#ifdef LRMOE_HAVE_CUTLASS
static const kcu_gg_sm90_fn *variant_fn(int v)
{
    switch (v) {
    case 0: return &kcu_gg_sm90_0;
    case 1: return &kcu_gg_sm90_1;
    case 2: return &kcu_gg_sm90_2;
    case 3: return &kcu_gg_sm90_3;
    case 4: return &kcu_gg_sm90_4;
    case 5: return &kcu_gg_sm90_5;
    default: return NULL;
    }
}
#endif

int kcu_gg_launch(lrmoe_kcu_ctx_t *c, int variant, int G, void *block, float alpha, float beta,
                  cudaStream_t s)
{
#ifdef LRMOE_HAVE_CUTLASS
    const kcu_gg_sm90_fn *fn = variant_fn(variant);
    if (!fn) return lrmoe_err("ggemm: no CUTLASS kernel for variant %d", variant);
    if (!G) return 0;
    if (!c->sm_count) {
        /* the kernels are sm_90a machine code only: say so on another GPU
         * instead of failing the launch */
        int major = 0, minor = 0, sms = 0;
        KCU_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device));
        KCU_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, c->device));
        if (major != 9 || minor != 0)
            return lrmoe_err("ggemm: the CUTLASS grouped GEMM is built for sm_90a (Hopper) only; "
                             "device %d is sm_%d%d", c->device, major, minor);
        KCU_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, c->device));
        c->sm_count = sms;
    }
    kcu_gg_arrays_t x;
    kcu_gg_carve(block, G, &x);
    kcu_gg_sm90_args a;
    a.ngroups = G;
    a.sm_count = c->sm_count;
    a.shapes = x.shapes;
    a.a = x.a;
    a.b = x.b;
    a.c = x.c;
    a.lda = x.lda;
    a.ldb = x.ldb;
    a.ldc = x.ldc;
    a.alpha = alpha;
    a.beta = beta;
    int64_t wsb = fn->workspace(&a);
    if (wsb < 0) return lrmoe_err("ggemm: CUTLASS cannot implement the arguments");
    void *ws = NULL;
    if (wsb) KCU_CUDA(cudaMallocAsync(&ws, (size_t)wsb, s));
    const char *why = NULL;
    int rc = fn->run(&a, ws, s, &why);
    if (ws) (void)cudaFreeAsync(ws, s);
    if (rc < 0) return lrmoe_err("ggemm: CUTLASS: %s", why ? why : "failed");
    return 0;
#else
    (void)c; (void)variant; (void)G; (void)block; (void)alpha; (void)beta; (void)s;
    return lrmoe_err("ggemm: not built with CUTLASS (tests/gpu/cutlass-inc.sh found no headers)");
#endif
}

int kcu_gg_dev(lrmoe_kcu_ctx_t *c, const lrmoe_ggemm_t *d, cudaStream_t s)
{
    const char *why = kcu_gg_check(d);
    if (why) return lrmoe_err("ggemm: %s", why);
    if (!lrmoe_kcu_have_cutlass()) return kcu_gg_launch(c, 0, 0, NULL, 0, 0, s);
    int G = d->ngroups;
    if (!G) return 0;
    void *block = NULL;
    KCU_CUDA(cudaMallocAsync(&block, kcu_gg_bytes(G), s));
    kcu_gg_arrays_t x;
    kcu_gg_carve(block, G, &x);
    int rc = 0;
    k_gg_setup<<<kcu_blocks(G, KCU_THREADS(k_gg_setup)), KCU_THREADS(k_gg_setup), 0, s>>>(*d, x);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) rc = lrmoe_err("kernel gg_setup: %s", cudaGetErrorString(e));
    /* groups with rows but K = 0 (K-grouped: an expert without rows;
     * row-grouped: k == 0) get C = 0 here when beta == 0 */
    if (!rc && d->beta == 0.0f && (d->kgrouped || !d->k)) {
        unsigned gy = G < 65535 ? (unsigned)G : 65535u;
        k_gg_zero<<<dim3(16, gy), KCU_THREADS(k_gg_zero), 0, s>>>(x, G, d->c_bf16);
        e = cudaGetLastError();
        if (e != cudaSuccess) rc = lrmoe_err("kernel gg_zero: %s", cudaGetErrorString(e));
    }
    if (!rc)
        rc = kcu_gg_launch(c, KCU_GG_VARIANT(d->ta, d->tb, d->c_bf16), G, block, d->alpha, d->beta, s);
    (void)cudaFreeAsync(block, s);
    return rc;
}
