/* The AMX kernels of the bf16 compute (lib/gemm_amx.c, through lrmoe_gemm
 * and lrmoe_gemm2 of lib/gemm_cpu.c: C = A B^T and C = A B with B the
 * stored BF16 weights) against a float64 reference of the
 * BF16-rounded operands, on the shapes it takes (K % 32 == 0, N % 16 == 0):
 * row counts around the 16-row tile and the 32-row pair, N with an odd
 * 16-column tile, K of one, several and a partial 256-deep chunk, F32 and
 * BF16 activations, strides, and C = and C +=; and the weight gradients'
 * C = A^T B for any K. The same cases run on whichever bf16 kernel the
 * environment picks (LRMOE_AMX=0, LRMOE_BF16_EMULATE, LRMOE_AVX2_GEMM,
 * DNNL_MAX_CPU_ISA: tests/helpers/bf16_kernels.bash), and each kernel's
 * bit-equalities (gemm_cpu.h) are checked: on every kernel lrmoe_gemm2
 * gives the bits of two lrmoe_gemm calls with the same strides and
 * lrmoe_gemm_bf16out those of lrmoe_gemm with ldc = N rounded by
 * lrmoe_gemm_to_bf16; on lrmoe's own kernels (AMX, the emulation's AVX-512
 * and AVX2 forms, dpbf16), whose bits do not depend on strides, lrmoe_gemm at the
 * case's ldc gives the bits of ldc = N too (oneDNN's matmul and OpenBLAS
 * choose their kernels by stride: not promised there). Prints whether AMX
 * ran and the kernel; exits 1 on a miss.
 * usage: gemm_amx_test */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gemm_amx.h"
#include "gemm_cpu.h"

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static float rnd(void)
{
    rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
    return (float)((double)(rs >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* rows x cols in dt with row stride ld, off bytes past a 64-byte boundary
 * (off < 0: plain malloc), the allocation in *base; ref: the BF16-rounded
 * values */
static void *mat_at(int64_t rows, int64_t cols, int64_t ld, lrmoe_dtype_t dt, double **ref, int off,
                    void **base)
{
    size_t es = lrmoe_dtype_size(dt);
    char *m = NULL;
    if (off < 0) m = *base = malloc((size_t)(rows * ld) * es);
    else if (!posix_memalign(base, 64, (size_t)(rows * ld) * es + 64)) m = (char *)*base + off;
    if (!m) abort();
    *ref = malloc((size_t)(rows * cols) * sizeof **ref);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < ld; j++) {
            float v = rnd();
            uint16_t h = lrmoe_f32_to_bf16(v);
            if (dt == LRMOE_BF16) memcpy(m + (size_t)(i * ld + j) * 2, &h, 2);
            else memcpy(m + (size_t)(i * ld + j) * 4, &v, 4);
            if (j < cols) (*ref)[i * cols + j] = lrmoe_bf16_to_f32(h);
        }
    return m;
}

static void *mat(int64_t rows, int64_t cols, int64_t ld, lrmoe_dtype_t dt, double **ref)
{
    void *base;
    return mat_at(rows, cols, ld, dt, ref, -1, &base);
}

/* one case of C = A B^T (tb) or A B (f: bit 0 acc, bit 1 BF16 A, bit 2 A B),
 * strides from mi, ni, ki's parity, B boff bytes past a 64-byte boundary
 * (< 0: malloc's); prints a miss; 1 when it passes */
/* the kernel's bits do not depend on the strides (gemm_cpu.h) */
static int stride_free;

static int check_case(lrmoe_gemm_t *g, int64_t M, int64_t N, int64_t K, int f, size_t mi, size_t ni,
                      size_t ki, int boff)
{
    const int acc = f & 1, tb = !(f & 4);
    const lrmoe_dtype_t adt = f & 2 ? LRMOE_BF16 : LRMOE_F32;
    const int64_t lda = K + (int64_t)(mi & 1) * 8,
                  ldb = (tb ? K : N) + (int64_t)(ni & 1) * 32,
                  ldc = 2 * N + (int64_t)(ki & 1) * 3;
    const int64_t br = tb ? N : K, bc = tb ? K : N;
    double *ra, *rb1, *rb2, *rc;
    void *A = mat(M, K, lda, adt, &ra);
    void *bb1, *bb2;
    void *B1 = mat_at(br, bc, ldb, LRMOE_BF16, &rb1, boff, &bb1),
         *B2 = mat_at(br, bc, ldb, LRMOE_BF16, &rb2, boff, &bb2);
    float *C = malloc((size_t)(M * ldc) * sizeof *C), *C2 = malloc((size_t)(M * ldc) * sizeof *C2);
    rc = malloc((size_t)(M * ldc) * sizeof *rc);
    for (int64_t i = 0; i < M * ldc; i++) { C[i] = rnd(); rc[i] = C[i]; }
    int rcode = lrmoe_gemm(g, 0, tb, M, N, K, A, adt, lda, B1, LRMOE_BF16, ldb, acc, C, ldc);
    double err = 0, mx = 1e-30;
    int untouched = 1;
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            double r = acc ? rc[i * ldc + j] : 0;
            for (int64_t k = 0; k < K; k++) r += ra[i * K + k] * (tb ? rb1[j * K + k] : rb1[k * N + j]);
            err = fmax(err, fabs(C[i * ldc + j] - r));
            mx = fmax(mx, fabs(r));
        }
        for (int64_t j = N; j < ldc; j++) untouched &= C[i * ldc + j] == (float)rc[i * ldc + j];
    }
    /* two products through lrmoe_gemm2: the bits of two lrmoe_gemm calls */
    int same = 1, dense = 1, strided = 1;
    if (!rcode && tb) {
        rcode = lrmoe_gemm(g, 0, 1, M, N, K, A, adt, lda, B1, LRMOE_BF16, ldb, 0, C, ldc) ||
                lrmoe_gemm(g, 0, 1, M, N, K, A, adt, lda, B2, LRMOE_BF16, ldb, 0, C + N, ldc) ||
                lrmoe_gemm2(g, M, N, K, A, adt, lda, B1, B2, LRMOE_BF16, ldb, C2, ldc);
        for (int64_t i = 0; i < M && !rcode; i++)
            same &= !memcmp(C + i * ldc, C2 + i * ldc, (size_t)(2 * N) * sizeof *C);
        /* BF16 output: the bits of the F32 product with ldc = N (the
         * scratch lrmoe_gemm_bf16out multiplies into where no kernel writes
         * BF16 itself) rounded by lrmoe_gemm_to_bf16 */
        float *Cd = malloc((size_t)(M * N) * sizeof *Cd);
        if (!rcode) rcode = lrmoe_gemm(g, 0, 1, M, N, K, A, adt, lda, B1, LRMOE_BF16, ldb, 0, Cd, N);
        uint16_t *h = malloc((size_t)(M * ldc) * 2), *h2 = malloc((size_t)N * 2);
        if (!rcode) rcode = lrmoe_gemm_bf16out(g, M, N, K, A, adt, lda, B1, LRMOE_BF16, ldb, h, ldc);
        for (int64_t i = 0; i < M && !rcode; i++) {
            lrmoe_gemm_to_bf16(Cd + i * N, h2, (size_t)N);
            dense &= !memcmp(h + i * ldc, h2, (size_t)N * 2);
            /* lrmoe's own kernels: the same bits at any ldc */
            if (stride_free) strided &= !memcmp(C + i * ldc, Cd + i * N, (size_t)N * sizeof *C);
        }
        free(h); free(h2); free(Cd);
    }
    int ok = rcode == 0 && err / mx <= 1e-5 && untouched && same && dense && strided;
    if (!ok) {
        printf("FAIL M=%lld N=%lld K=%lld tb=%d acc=%d A=%s relerr %.3e%s%s%s%s%s\n", (long long)M,
               (long long)N, (long long)K, tb, acc, lrmoe_dtype_name(adt), err / mx,
               untouched ? "" : ", wrote past N",
               same ? "" : ", gemm2 differs from two gemm calls",
               dense ? "" : ", bf16out differs from gemm at ldc=N",
               strided ? "" : ", gemm at this ldc differs from ldc=N (a stride-free kernel)",
               rcode ? lrmoe_errmsg() : "");
    }
    free(A); free(bb1); free(bb2); free(C); free(C2); free(ra); free(rb1); free(rb2); free(rc);
    return ok;
}

int main(void)
{
    lrmoe_gemm_t *g = lrmoe_gemm_new(LRMOE_COMPUTE_BF16, 1);
    if (!g) { fprintf(stderr, "gemm_amx_test: %s\n", lrmoe_errmsg()); return 1; }
    printf("amx: %s\n", lrmoe_amx_available() ? "yes" : "no");
    lrmoe_gemm_kernel_t kern;
    lrmoe_gemm_kernel(&kern);
    stride_free = kern.kind == LRMOE_KERNEL_AMX || kern.kind == LRMOE_KERNEL_EMUL_AVX512 ||
                  kern.kind == LRMOE_KERNEL_EMUL_AVX2 || kern.kind == LRMOE_KERNEL_DPBF16;
    printf("kernel: %s", lrmoe_gemm_kernel_name(kern.kind));
    if (kern.dnnl_version)
        printf(" (oneDNN %d.%d.%d %s)", kern.dnnl_version / 10000, kern.dnnl_version / 100 % 100,
               kern.dnnl_version % 100, kern.dnnl_impl);
    printf(", bits %s of strides\n", stride_free ? "independent" : "not promised independent");
    static const int64_t Ms[] = {1, 15, 16, 17, 32, 33, 70};
    static const int64_t Ns[] = {16, 48, 64};
    static const int64_t Ks[] = {32, 96, 288, 544};
    int fails = 0, cases = 0;
    for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++)
    for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++)
    for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
    for (int f = 0; f < 8; f++) {
        cases++;
        fails += !check_case(g, Ms[mi], Ns[ni], Ks[ki], f, mi, ni, ki, -1);
    }
    /* A B with wide B: more row pairs or panels than the nn kernel keeps partial
     * C tiles for (whole K, 256-deep chunks per panel: M=70 N=1360) and fewer
     * (whole rows 256 at a time, many panels: M=33) */
    /* A B^T with more rows of A than the kernel's direct tile loads take
     * from unaligned B (M=100), B rows aligned (direct) and 48 bytes past a
     * line (copied into tile order), as a weights file's are */
    for (int f = 0; f < 4; f++)
    for (int off = 0; off <= 48; off += 48) {
        cases++;
        fails += !check_case(g, 100, 48, 288, f, 0, 0, 0, off);
    }
    static const int64_t Mw[] = {33, 70}, Kw[] = {288, 544};
    for (size_t mi = 0; mi < 2; mi++)
    for (size_t ki = 0; ki < 2; ki++)
    for (int f = 4; f < 8; f++) {
        cases++;
        fails += !check_case(g, Mw[mi], 1360, Kw[ki], f, mi, 1, ki, -1);
    }
    /* A B with K of one chunk and more row pairs than one group of the
     * grouped order (M=300: 19 16-row blocks, 3 groups, the last partial) */
    for (int f = 4; f < 8; f++) {
        cases++;
        fails += !check_case(g, 300, 48, 96, f, 1, 1, 1, -1);
    }
    /* weight gradients: C = A^T B, A (K,M), B (K,N) BF16, K any (padded to
     * 32 inside), C overwritten (non-temporal stores) */
    static const int64_t Kt[] = {1, 7, 32, 33, 100, 300};
    static const int64_t Mt[] = {1, 16, 17, 40, 300};
    for (size_t ki = 0; ki < sizeof Kt / sizeof *Kt; ki++)
    for (size_t mi = 0; mi < sizeof Mt / sizeof *Mt; mi++)
    for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++) {
        const int64_t M = Mt[mi], N = Ns[ni], K = Kt[ki];
        const int64_t lda = M + (int64_t)(ki & 1) * 16, ldb = N + (int64_t)(mi & 1) * 32, ldc = N + (int64_t)(ni & 1) * 16;
        double *ra, *rb;
        void *A = mat(K, M, lda, LRMOE_BF16, &ra), *B = mat(K, N, ldb, LRMOE_BF16, &rb);
        float *C = NULL;
        if (posix_memalign((void **)&C, 64, (size_t)(M * ldc) * sizeof *C)) return 1;
        for (int64_t i = 0; i < M * ldc; i++) C[i] = 7.0f;
        int rcode = lrmoe_gemm(g, 1, 0, M, N, K, A, LRMOE_BF16, lda, B, LRMOE_BF16, ldb, 0, C, ldc);
        double err = 0, mx = 1e-30;
        int untouched = 1;
        for (int64_t i = 0; i < M; i++) {
            for (int64_t j = 0; j < N; j++) {
                double r = 0;
                for (int64_t k = 0; k < K; k++) r += ra[k * M + i] * rb[k * N + j];
                err = fmax(err, fabs(C[i * ldc + j] - r));
                mx = fmax(mx, fabs(r));
            }
            for (int64_t j = N; j < ldc; j++) untouched &= C[i * ldc + j] == 7.0f;
        }
        cases++;
        if (rcode || err / mx > 1e-5 || !untouched) {
            fails++;
            printf("FAIL A^T B M=%lld N=%lld K=%lld relerr %.3e%s%s\n", (long long)M, (long long)N,
                   (long long)K, err / mx, untouched ? "" : ", wrote past N", rcode ? lrmoe_errmsg() : "");
        }
        free(A); free(B); free(C); free(ra); free(rb);
    }
    /* dpbf16: C = A B^T in its two forms (the stored weights broadcast in
     * place, and B packed as for the other GEMMs: LRMOE_DPBF16_PACKNT=1)
     * give the same bits (the same vdpbf16ps steps on the same pairs) */
    if (kern.kind == LRMOE_KERNEL_DPBF16) {
        /* rows: the direct form's passes (one up to 96 rows, in tiles of 6
         * rows of B up to 64 and of 4 beyond) and the packed form past 96;
         * N: one chunk of C^T (13 + mi) and several with a partial one
         * (101: 48 + 48 + 5), with both C = and C += */
        static const int64_t Mf[] = {1, 7, 8, 9, 16, 24, 63, 64, 65, 72, 80, 88, 96, 97, 130, 300};
        /* 4101 (at 65-96 rows only): too long for the direct form's one
         * block of rows, so its BF16 output is rounded after */
        static const int64_t Kf[] = {1, 2, 31, 96, 545, 4101};
        int forms = 0, fdiff = 0, outs = 0, odiff = 0;
        for (size_t mi = 0; mi < sizeof Mf / sizeof *Mf; mi++)
        for (int ni = 0; ni < 2; ni++)
        for (size_t ki = 0; ki < sizeof Kf / sizeof *Kf; ki++)
        for (int f32 = 0; f32 < 2; f32++) {
            const int64_t M = Mf[mi], N = ni ? 101 : 13 + (int64_t)mi, K = Kf[ki], ldc = N + 5;
            if (K > 545 && (M <= 64 || M > 96 || ni)) continue;
            const lrmoe_dtype_t adt = f32 ? LRMOE_F32 : LRMOE_BF16;
            double *ra, *rb;
            void *A = mat(M, K, K + 3, adt, &ra), *B = mat(N, K, K + 1, LRMOE_BF16, &rb);
            /* every other case: row 0 of A holds infinities, a NaN and
             * values whose products overflow (NaN, infinite and huge C in
             * the BF16 rounding below) */
            if (ki & 1) {
                static const float sp[] = {INFINITY, -INFINITY, NAN, 3e38f, -3e38f};
                for (int64_t k = 0; k < K && k < 5; k++) {
                    if (f32) ((float *)A)[k] = sp[k];
                    else lrmoe_convert_from_f32(LRMOE_BF16, &sp[k], (uint16_t *)A + k, 1);
                }
            }
            float *C1 = malloc((size_t)(M * ldc) * sizeof *C1), *C2 = malloc((size_t)(M * ldc) * sizeof *C2);
            for (int64_t i = 0; i < M * ldc; i++) C1[i] = C2[i] = rnd();
            const int acc = (int)((mi + (size_t)ni) & 1);
            int rc1 = lrmoe_gemm(g, 0, 1, M, N, K, A, adt, K + 3, B, LRMOE_BF16, K + 1, acc, C1, ldc);
            setenv("LRMOE_DPBF16_PACKNT", "1", 1);
            int rc2 = lrmoe_gemm(g, 0, 1, M, N, K, A, adt, K + 3, B, LRMOE_BF16, K + 1, acc, C2, ldc);
            unsetenv("LRMOE_DPBF16_PACKNT");
            forms++;
            if (rc1 || rc2 || memcmp(C1, C2, (size_t)(M * ldc) * sizeof *C1)) {
                fdiff++;
                printf("FAIL dpbf16 forms M=%lld N=%lld K=%lld acc=%d A=%s: the packed form's bits differ\n",
                       (long long)M, (long long)N, (long long)K, acc, lrmoe_dtype_name(adt));
            }
            /* lrmoe_gemm_bf16out, in both forms (each rounding C in its
             * stores, or after where K is too long): the F32 product's bits
             * rounded by lrmoe_gemm_to_bf16, and nothing written past N */
            uint16_t *h = malloc((size_t)(M * ldc) * 2), *hr = malloc((size_t)N * 2);
            for (int pk = 0; pk < 2; pk++) {
                for (int64_t i = 0; i < M * ldc; i++) h[i] = 0x5a5a;
                if (pk) setenv("LRMOE_DPBF16_PACKNT", "1", 1);
                int rc3 = lrmoe_gemm(g, 0, 1, M, N, K, A, adt, K + 3, B, LRMOE_BF16, K + 1, 0, C1, ldc) ||
                          lrmoe_gemm_bf16out(g, M, N, K, A, adt, K + 3, B, LRMOE_BF16, K + 1, h, ldc);
                unsetenv("LRMOE_DPBF16_PACKNT");
                int ok = !rc3;
                for (int64_t i = 0; i < M && ok; i++) {
                    lrmoe_gemm_to_bf16(C1 + i * ldc, hr, (size_t)N);
                    ok &= !memcmp(h + i * ldc, hr, (size_t)N * 2);
                    for (int64_t j = N; j < ldc; j++) ok &= h[i * ldc + j] == 0x5a5a;
                }
                outs++;
                if (!ok) {
                    odiff++;
                    printf("FAIL dpbf16 bf16out M=%lld N=%lld K=%lld A=%s form %s: not the F32 product rounded%s\n",
                           (long long)M, (long long)N, (long long)K, lrmoe_dtype_name(adt),
                           pk ? "packed" : "default", rc3 ? lrmoe_errmsg() : "");
                }
            }
            free(h); free(hr);
            free(A); free(B); free(C1); free(C2); free(ra); free(rb);
        }
        printf("dpbf16 forms: %d cases, %d differ; bf16out: %d cases, %d differ\n", forms, fdiff,
               outs, odiff);
        fails += fdiff + odiff;
    }
    printf("gemm amx: %d cases, %d failed\n", cases, fails);
    lrmoe_gemm_free(g);
    return fails ? 1 : 0;
}
