/* lib/swiglu.c against the scalar formulas with libm's expf, bit for bit:
 *   argv[1] = stride: sigmoid of every stride-th float bit pattern (1: all
 *   2^32), 16 at a time through lrmoe_swiglu_fwd (u = 1, so phi = silu(g));
 *   then whole layers: fwd_ld and bwd_ld on random and special rows
 *   (Inf, NaN, |g| >= 88, denormals) at widths with and without a 16-lane
 *   tail, strides ldi > F, and sqnorm for 1..19 rows; the backward on
 *   BF16 rows with BF16 outputs (lrmoe_swiglu_bwd_bf16_rows).
 * Prints "vec: yes|no" (which form ran), then "N cases, M failed". */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lrmoe.h"
#include "swiglu.h"

static float sig(float x) { return 1.0f / (1.0f + expf(-x)); }

static int same(float a, float b) { return !memcmp(&a, &b, sizeof a) || (isnan(a) && isnan(b)); }

/* BF16 bits equal, or both NaN (a NaN's sign follows which operand the
 * compiler put first, as same() allows for F32) */
static int bnan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }
static int sameb(uint16_t a, uint16_t b) { return a == b || (bnan(a) && bnan(b)); }

static uint64_t rs = 88172645463325252ULL;
static uint32_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)(rs >> 32); }

static float pick(void)
{
    static const uint32_t sp[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x42b00000u, 0xc2b00000u,
                                  0x42a00000u, 0xc2a00000u, 0x00000001u, 0x80000001u, 0u};
    uint32_t r = rnd();
    if (r % 61 == 0) {
        float f;
        memcpy(&f, &sp[rnd() % 10], sizeof f);
        return f;
    }
    return ((float)(rnd() % 2000001) - 1e6f) * 1e-5f * (r % 7 == 0 ? 12 : 1);
}

int main(int argc, char **argv)
{
    uint64_t stride = argc > 1 ? strtoull(argv[1], NULL, 10) : 257;
    long cases = 0, failed = 0;
    printf("vec: %s\n", lrmoe_swiglu_vec() ? "yes" : "no");

    /* sigmoid over the bit patterns */
    float g[16], one[16], phi[16];
    for (int i = 0; i < 16; i++) one[i] = 1.0f;
    int n = 0;
    for (uint64_t k = 0; k < 0x100000000ULL; k += stride) {
        uint32_t w = (uint32_t)k;
        memcpy(&g[n++], &w, sizeof w);
        if (n < 16 && k + stride < 0x100000000ULL) continue;
        lrmoe_swiglu_fwd(1, n, g, one, phi, NULL);
        for (int i = 0; i < n; i++) {
            float ref = g[i] * sig(g[i]) * 1.0f;
            cases++;
            if (!same(ref, phi[i])) {
                if (failed++ < 10) printf("sigmoid: g=%a phi=%a, libm: %a\n", g[i], phi[i], ref);
            }
        }
        n = 0;
    }

    /* layers */
    static const int64_t Fs[] = {1, 15, 16, 17, 48, 100, 768};
    for (size_t fi = 0; fi < sizeof Fs / sizeof *Fs; fi++)
        for (int64_t rows = 1; rows <= 19; rows += 3) {
            int64_t F = Fs[fi], ldi = 2 * F + 3, m = rows * ldi;
            float *G = malloc((size_t)m * 4), *U = malloc((size_t)m * 4), *P = malloc((size_t)m * 4),
                  *DP = malloc((size_t)(rows * F) * 4), *DG = malloc((size_t)m * 4),
                  *DU = malloc((size_t)m * 4), *PB = malloc((size_t)(rows * F) * 4),
                  *sq = malloc((size_t)rows * 4);
            for (int64_t j = 0; j < m; j++) { G[j] = pick(); U[j] = pick(); }
            for (int64_t j = 0; j < rows * F; j++) DP[j] = pick();
            lrmoe_swiglu_fwd_ld(rows, F, G, U, ldi, P, ldi, sq);
            lrmoe_swiglu_bwd_ld(rows, F, G, U, ldi, DP, DG, DU, ldi, PB);
            for (int64_t i = 0; i < rows; i++) {
                double s = 0;
                for (int64_t j = 0; j < F; j++) {
                    float gg = G[i * ldi + j], uu = U[i * ldi + j], d = DP[i * F + j];
                    float sg = sig(gg), si = gg * sg;
                    float v = gg * sig(gg) * uu;
                    s += (double)v * v;
                    float du = d * si, dg = d * uu * sg * (1.0f + gg * (1.0f - sg)), pb = si * uu;
                    cases += 4;
                    int bad = !same(v, P[i * ldi + j]) + !same(du, DU[i * ldi + j]) +
                              !same(dg, DG[i * ldi + j]) + !same(pb, PB[i * F + j]);
                    if (bad && failed < 10)
                        printf("F=%lld row %lld col %lld g=%a u=%a: phi %a/%a du %a/%a dg %a/%a\n",
                               (long long)F, (long long)i, (long long)j, gg, uu, P[i * ldi + j], v,
                               DU[i * ldi + j], du, DG[i * ldi + j], dg);
                    failed += bad;
                }
                cases++;
                if (!same((float)s, sq[i])) {
                    if (failed < 10) printf("F=%lld row %lld: sqnorm %a, reference %a\n",
                                            (long long)F, (long long)i, sq[i], (float)s);
                    failed++;
                }
            }
            free(G); free(U); free(P); free(DP); free(DG); free(DU); free(PB); free(sq);
        }

    /* BF16 saved state, BF16 outputs (lrmoe_swiglu_bwd_bf16_rows): rows
     * gathered through pointers (reverse order, so row i is not at i * F),
     * dg and du interleaved at stride ldo = 2F + 5, phi and no phi; the
     * reference widens g and u, applies the scalar formulas with libm's
     * expf and rounds each result with lrmoe_f32_to_bf16 */
    for (size_t fi = 0; fi < sizeof Fs / sizeof *Fs; fi++)
        for (int64_t rows = 1; rows <= 19; rows += 6)
            for (int wp = 0; wp < 2; wp++) {
                int64_t F = Fs[fi], ldo = 2 * F + 5, m = rows * F;
                uint16_t *G = malloc((size_t)m * 2), *U = malloc((size_t)m * 2),
                         *O = malloc((size_t)(rows * ldo) * 2), *PB = malloc((size_t)m * 2);
                float *DP = malloc((size_t)m * 4);
                const uint16_t **gp = malloc((size_t)rows * sizeof *gp),
                               **up = malloc((size_t)rows * sizeof *up);
                for (int64_t j = 0; j < m; j++) {
                    G[j] = lrmoe_f32_to_bf16(pick());
                    U[j] = lrmoe_f32_to_bf16(pick());
                    DP[j] = pick();
                }
                for (int64_t i = 0; i < rows; i++) {
                    gp[i] = G + (rows - 1 - i) * F;
                    up[i] = U + (rows - 1 - i) * F;
                }
                lrmoe_swiglu_bwd_bf16_rows(rows, F, gp, up, DP, O, O + F, ldo, wp ? PB : NULL);
                for (int64_t i = 0; i < rows; i++)
                    for (int64_t j = 0; j < F; j++) {
                        float gg = lrmoe_bf16_to_f32(gp[i][j]), uu = lrmoe_bf16_to_f32(up[i][j]);
                        float d = DP[i * F + j], sg = sig(gg), si = gg * sg;
                        uint16_t du = lrmoe_f32_to_bf16(d * si),
                                 dg = lrmoe_f32_to_bf16(d * uu * sg * (1.0f + gg * (1.0f - sg))),
                                 pb = lrmoe_f32_to_bf16(si * uu);
                        cases += 2 + wp;
                        int bad = !sameb(dg, O[i * ldo + j]) + !sameb(du, O[i * ldo + F + j]) +
                                  (wp && !sameb(pb, PB[i * F + j]));
                        if (bad && failed < 10)
                            printf("bf16 F=%lld row %lld col %lld g=%a u=%a: dg %04x/%04x du "
                                   "%04x/%04x phi %04x/%04x\n", (long long)F, (long long)i,
                                   (long long)j, gg, uu, O[i * ldo + j], dg, O[i * ldo + F + j],
                                   du, wp ? PB[i * F + j] : 0, pb);
                        failed += bad;
                    }
                free(G); free(U); free(O); free(PB); free(DP); free(gp); free(up);
            }
    printf("%ld cases, %ld failed\n", cases, failed);
    return failed != 0;
}
