/* fake-ggemm: lrmoe_kcu_ggemm (kernels/kcu.h) on the host for the fake
 * device (tests/gpu/fake-kcu.c, build-fake.sh): the groups of the
 * device-side row offsets through kcu_gg_group (kernels/ggemm_setup.h, the
 * function the setup kernel runs), each multiplied by the CPU reference
 * lrmoe_kref_gemm with the shapes and pointers a per-expert lrmoe_gemm_t
 * list would have, so that a frame whose layout lives on the device gives
 * the bits of the same frame with a host layout. Argument checks as on the
 * GPU (kcu_gg_check). Not part of liblrmoe. */
#include <string.h>
#include "ggemm_setup.h"
#include "lrmoe.h"

int lrmoe_kcu_have_cutlass(void) { return 1; }

int lrmoe_kcu_ggemm(const lrmoe_ggemm_t *d)
{
    const char *why = kcu_gg_check(d);
    if (why) return lrmoe_err("ggemm: %s", why);
    const size_t ce = d->c_bf16 ? 2 : 4;
    for (int64_t g = 0; g < d->ngroups; g++) {
        kcu_gg_group_t q;
        if (kcu_gg_group(d, g, d->offsets[g], d->offsets[g + 1], &q)) {
            if (d->err) *d->err = 1;
            continue;
        }
        char *c = (char *)d->c + (size_t)q.co * ce;
        if (q.zm)
            for (int64_t r = 0; r < q.zm; r++) memset(c + (size_t)(r * d->ldc) * ce, 0, (size_t)q.n * ce);
        if (!q.m) continue;
        lrmoe_gemm_t x;
        x.m = q.m; x.n = q.n; x.k = q.k;
        x.ta = d->kgrouped; x.tb = d->kgrouped ? 0 : d->tb;
        x.a = (const uint16_t *)d->a + q.ao;
        x.b = (const uint16_t *)d->b + q.bo;
        x.c = c;
        x.lda = d->lda; x.ldb = d->ldb; x.ldc = d->ldc;
        x.c_bf16 = d->c_bf16;
        x.beta = d->beta;
        if (d->alpha != 1.0f) return lrmoe_err("ggemm (fake): alpha %g not 1", (double)d->alpha);
        if (lrmoe_kref_gemm(1, &x) < 0) return -1;
    }
    return 0;
}
