/* lib/gemm_cpu.c against a float64 reference, for every (ta, tb, acc), both
 * operand dtypes, strided operands and sizes that are not multiples of the
 * K rounding (16) or of the AVX2 kernel's blocks (6 rows, 16 columns, 256
 * deep, 264 rows): compute f32 against the exact operands, compute bf16
 * against the operands rounded to BF16 (what the path promises: BF16
 * operands, F32 accumulation), on the bf16 kernel the environment picks
 * (printed: tests/helpers/bf16_kernels.bash). Prints one line per failed
 * case, exits 1 on a miss.
 * usage: gemm_test f32|bf16 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gemm_cpu.h"
#include "gemm_avx2.h"

static uint64_t rs = 88172645463325252ull;
static float rnd(void)
{
    rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
    return (float)((double)(rs >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* rows x cols matrix with row stride ld (ld >= cols) in dtype dt; *ref gets
 * the values the compute sees (rounded to BF16 when round) as doubles,
 * packed (rows, cols) */
static void *mat(int64_t rows, int64_t cols, int64_t ld, lrmoe_dtype_t dt, int round,
                 double **ref)
{
    size_t es = lrmoe_dtype_size(dt);
    /* 64-byte aligned, as the layer's buffers: lib/gemm_avx2.c's
     * non-temporal stores need aligned rows */
    void *p = NULL;
    if (posix_memalign(&p, 64, (size_t)(rows * ld) * es + 1)) abort();
    char *m = p;
    *ref = malloc((size_t)(rows * cols) * sizeof **ref + 1);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < ld; j++) {
            float v = rnd();
            if (dt == LRMOE_BF16) {
                uint16_t h = lrmoe_f32_to_bf16(v);
                memcpy(m + (size_t)(i * ld + j) * 2, &h, 2);
                v = lrmoe_bf16_to_f32(h);
            } else {
                memcpy(m + (size_t)(i * ld + j) * 4, &v, 4);
            }
            if (j < cols)
                (*ref)[i * cols + j] = round ? lrmoe_bf16_to_f32(lrmoe_f32_to_bf16(v)) : v;
        }
    return m;
}

/* Largest |C - float64 op(A) op(B) [+ C0]| over the largest |reference|:
 * ra (ac columns), rb (bc columns) and rc (C's initial values, N columns)
 * as mat() returned them. */
static double relerr(int ta, int tb, int acc, int64_t M, int64_t N, int64_t K, const double *ra,
                     int64_t ac, const double *rb, int64_t bc, const double *rc, const float *C,
                     int64_t ldc)
{
    double err = 0, mx = 1e-30;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double r = acc ? rc[i * N + j] : 0;
            for (int64_t k = 0; k < K; k++)
                r += (ta ? ra[k * ac + i] : ra[i * ac + k]) * (tb ? rb[j * bc + k] : rb[k * bc + j]);
            err = fmax(err, fabs(C[i * ldc + j] - r));
            mx = fmax(mx, fabs(r));
        }
    return err / mx;
}

int main(int argc, char **argv)
{
    lrmoe_compute_t cm;
    if (argc != 2 || lrmoe_compute_parse(argv[1], &cm) < 0 || cm == LRMOE_COMPUTE_AUTO) {
        fprintf(stderr, "usage: gemm_test f32|bf16\n");
        return 2;
    }
    /* the vectorised F32 -> BF16 rounding equals the scalar one on every
     * kind of value (random bit patterns: normals, denormals, Inf, NaN) */
    {
        enum { NV = 1 << 16 };
        static float v[NV];
        static uint16_t h[NV];
        for (int i = 0; i < NV; i++) {
            rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
            uint32_t u = (uint32_t)(rs >> 32);
            if (i < 8) u = (uint32_t[]){0, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u,
                                        0x7f800001u, 0x00000001u, 0x7f7fffffu}[i];
            memcpy(&v[i], &u, 4);
        }
        lrmoe_gemm_to_bf16(v, h, NV);
        for (int i = 0; i < NV; i++)
            if (h[i] != lrmoe_f32_to_bf16(v[i])) {
                printf("FAIL to_bf16 at %d: %04x, scalar %04x\n", i, h[i], lrmoe_f32_to_bf16(v[i]));
                return 1;
            }
        printf("to_bf16: %d values equal the scalar rounding\n", NV);
    }
    lrmoe_gemm_t *g = lrmoe_gemm_new(cm, 1);
    if (!g) { fprintf(stderr, "gemm_test: %s\n", lrmoe_errmsg()); return 1; }
    if (cm == LRMOE_COMPUTE_BF16) { /* the kernel the environment picked */
        lrmoe_gemm_kernel_t k;
        lrmoe_gemm_kernel(&k);
        printf("kernel: %s\n", lrmoe_gemm_kernel_name(k.kind));
    }
    const int round = cm == LRMOE_COMPUTE_BF16;
    static const int64_t sz[][3] = {{1, 1, 1}, {7, 5, 3}, {37, 48, 64}, {64, 96, 33},
                                    {130, 72, 200}, {5, 300, 17}, {33, 17, 0},
                                    /* lib/gemm_avx2.c's blocks: K past two of its
                                     * 256-deep blocks, M past its 264-row block */
                                    {270, 40, 530}, {13, 33, 264},
                                    /* the AVX-512 form's 8 x 32 tiles: both
                                     * past a multiple */
                                    {41, 70, 40},
                                    /* one K block and C over 1 MiB: its
                                     * non-temporal stores, on rows of 517
                                     * floats (not 64-byte aligned: plain
                                     * stores) and of 528 (aligned) */
                                    {520, 512, 9}, {512, 528, 24},
                                    /* the AVX-512 form's direct x W^T (BF16
                                     * B^T, at most 64 rows): K past a chunk
                                     * of 8 blocks, N past a multiple of 6
                                     * rows, M past a multiple of 16 */
                                    {50, 13, 2100}, {64, 50, 600}};
    int fails = 0, cases = 0;
    for (size_t s = 0; s < sizeof sz / sizeof sz[0]; s++)
        for (int f = 0; f < 32; f++) {
            int ta = f & 1, tb = (f >> 1) & 1, acc = (f >> 2) & 1;
            lrmoe_dtype_t adt = (f >> 3) & 1 ? LRMOE_BF16 : LRMOE_F32;
            lrmoe_dtype_t bdt = (f >> 4) & 1 ? LRMOE_BF16 : LRMOE_F32;
            int64_t M = sz[s][0], N = sz[s][1], K = sz[s][2];
            int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
            int64_t lda = ac + (s & 1) * 3, ldb = bc + (s & 2), ldc = N + (s & 1) * 5;
            double *ra, *rb, *rc;
            void *A = mat(ar, ac, lda, adt, round, &ra), *B = mat(br, bc, ldb, bdt, round, &rb);
            float *C = (float *)mat(M, N, ldc, LRMOE_F32, 0, &rc);
            int rcode = lrmoe_gemm(g, ta, tb, M, N, K, A, adt, lda, B, bdt, ldb, acc, C, ldc);
            /* F32 accumulation of K terms of size <= 1: a few ulps of F32 */
            const double rel = relerr(ta, tb, acc, M, N, K, ra, ac, rb, bc, rc, C, ldc);
            int ok = rcode == 0 && rel <= 1e-5;
            cases++;
            if (!ok) {
                fails++;
                printf("FAIL %s M=%lld N=%lld K=%lld ta=%d tb=%d acc=%d A=%s B=%s relerr %.3e%s%s\n",
                       argv[1], (long long)M, (long long)N, (long long)K, ta, tb, acc,
                       lrmoe_dtype_name(adt), lrmoe_dtype_name(bdt), rel,
                       rcode ? ": " : "", rcode ? lrmoe_errmsg() : "");
            }
            free(A); free(B); free(C); free(ra); free(rb); free(rc);
        }
    printf("gemm %s: %d cases, %d failed\n", argv[1], cases, fails);
    lrmoe_gemm_free(g);
    /* lib/gemm_avx2.c directly with an F32 or a BF16 B (lrmoe_gemm hands it
     * BF16 only), exact operands against float64, in its AVX2 form and,
     * where the CPU has AVX-512F, its AVX-512 form, which must give the
     * same bits (the same products summed in the same order) */
    if (lrmoe_avx2_gemm_available()) {
        int kf = 0, kc = 0, wide = lrmoe_avx2_gemm_wide();
        float *ws = malloc(lrmoe_avx2_gemm_ws());
        for (size_t s = 0; s < sizeof sz / sizeof sz[0]; s++)
            for (int f = 0; f < 16; f++) {
                int ta = f & 1, tb = (f >> 1) & 1, acc = (f >> 2) & 1, bbf = (f >> 3) & 1;
                int64_t M = sz[s][0], N = sz[s][1], K = sz[s][2];
                int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
                int64_t lda = ac + (s & 1) * 3, ldb = bc + (s & 2), ldc = N + (s & 1) * 5;
                double *ra, *rb, *rc;
                float *A = mat(ar, ac, lda, LRMOE_F32, 0, &ra);
                void *B = mat(br, bc, ldb, bbf ? LRMOE_BF16 : LRMOE_F32, 0, &rb);
                float *C = (float *)mat(M, N, ldc, LRMOE_F32, 0, &rc), *C2 = NULL;
                const size_t cb = (size_t)(M * ldc) * sizeof *C;
                if (wide) {
                    if (posix_memalign((void **)&C2, 64, cb + 1)) abort();
                    memcpy(C2, C, cb);
                }
                lrmoe_avx2_gemm_w(0, ws, ta, tb, M, N, K, A, lda, B, bbf, ldb, acc, C, ldc);
                const double rel = relerr(ta, tb, acc, M, N, K, ra, ac, rb, bc, rc, C, ldc);
                kc++;
                if (!(rel <= 1e-5)) {
                    kf++;
                    printf("FAIL avx2 %s B M=%lld N=%lld K=%lld ta=%d tb=%d acc=%d relerr %.3e\n",
                           bbf ? "BF16" : "F32", (long long)M, (long long)N, (long long)K, ta, tb,
                           acc, rel);
                }
                if (wide) {
                    lrmoe_avx2_gemm_w(1, ws, ta, tb, M, N, K, A, lda, B, bbf, ldb, acc, C2, ldc);
                    kc++;
                    if (memcmp(C, C2, cb)) {
                        kf++;
                        printf("FAIL avx512 %s B M=%lld N=%lld K=%lld ta=%d tb=%d acc=%d: not the "
                               "AVX2 form's bits (relerr %.3e)\n", bbf ? "BF16" : "F32",
                               (long long)M, (long long)N, (long long)K, ta, tb, acc,
                               relerr(ta, tb, acc, M, N, K, ra, ac, rb, bc, rc, C2, ldc));
                    }
                }
                free(A); free(B); free(C); free(C2); free(ra); free(rb); free(rc);
            }
        free(ws);
        printf("avx2 kernel%s, F32 and BF16 B: %d cases, %d failed\n",
               wide ? " (AVX2 and AVX-512 forms)" : " (AVX2 form; no AVX-512F here)", kc, kf);
        fails += kf;
    } else {
        printf("avx2 kernel: skipped (no AVX2 and FMA here, or LRMOE_AVX2_GEMM=0)\n");
    }
    return fails ? 1 : 0;
}
