/* GPU-free check of the CUTLASS side of the grouped GEMM: each compiled
 * variant (kernels/cutlass/ggemm_sm90.cu objects) builds its CUTLASS
 * arguments from kcu_gg_sm90_args with device-only problem shapes,
 * can_implement accepts them, and the workspace (one TMA descriptor set per
 * SM) is sized: this is host code, run here without a device. Linked by
 * tests/cuda-resources.bats against the objects and cudart:
 *   ggemm-args VARIANT...   (0..5) */
#include <stdio.h>
#include <stdlib.h>
#include "ggemm_sm90.h"

static const struct kcu_gg_sm90_fn *fn(int v)
{
    switch (v) {
    case 0: return &kcu_gg_sm90_0;
    case 1: return &kcu_gg_sm90_1;
    case 2: return &kcu_gg_sm90_2;
    case 3: return &kcu_gg_sm90_3;
    case 4: return &kcu_gg_sm90_4;
    case 5: return &kcu_gg_sm90_5;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    static char fake[1 << 16] __attribute__((aligned(256)));
    int bad = 0;
    for (int i = 1; i < argc; i++) {
        int v = atoi(argv[i]);
        const struct kcu_gg_sm90_fn *f = fn(v);
        if (!f) { printf("ggemm-args: no variant %d\n", v); return 2; }
        struct kcu_gg_sm90_args a = {};
        a.shapes = (int *)fake;
        a.a = (const void **)fake; a.b = (const void **)fake; a.c = (void **)fake;
        a.lda = (int64_t *)fake; a.ldb = (int64_t *)fake; a.ldc = (int64_t *)fake;
        a.alpha = 1.0f;
        long long w[2];
        int sms[2] = {66, 132};
        for (int j = 0; j < 2; j++) {
            a.ngroups = 128;
            a.sm_count = sms[j];
            a.beta = (float)j;
            w[j] = (long long)f->workspace(&a);
        }
        /* accepted; the descriptors' workspace grows with the SM count */
        int ok = w[0] > 0 && w[1] > w[0];
        bad += !ok;
        printf("ggemm-args: variant %d: workspace %lld B at 66 SMs, %lld B at 132 SMs: %s\n", v,
               w[0], w[1], ok ? "ok" : "FAIL");
    }
    return bad ? 1 : 0;
}
