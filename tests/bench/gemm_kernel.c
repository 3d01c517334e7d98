/* One expert GEMM through lrmoe_gemm (lib/gemm_cpu.h) with the bf16 kernel
 * the environment picks (LRMOE_DPBF16=0: oneDNN's matmul instead of
 * lib/gemm_dpbf16.c), for tests/bench/cpu.sh (issue 34 item 3):
 *
 *   nt  C (M,N) = A (M,K) B^T, B stored (N,K)   the forward's x W^T
 *   nn  C (M,N) = A (M,K) B,   B stored (K,N)   the backward's dphi, dx
 *   tn  C (M,N) = A^T B, A (K,M), B (K,N)       the weight gradients
 *
 * A and B BF16, C F32 overwritten. B and C cycle over copies that
 * together exceed 64 MiB (tn: A too), so that each GEMM reads its weights
 * from memory and writes C to lines not in the cache, as the layer's 128
 * experts do. Prints "seconds GFLOP/s
 * kernel": the best over REPS passes of the mean time per GEMM, the
 * calling thread's CPU time.
 *   gemm_kernel peaks   prints "fma_GFLOPs dot_GFLOPs": one thread's AVX-512
 *                       F32 FMA and vdpbf16ps register peaks
 *                       (lrmoe_avx2_peak_rates)
 * usage: gemm_kernel nt|nn|tn M N K [REPS] | gemm_kernel peaks */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "gemm_avx2.h"
#include "gemm_cpu.h"

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *amalloc(size_t n)
{
    return aligned_alloc(64, (n + 63) / 64 * 64);
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "peaks")) {
        double f, d;
        lrmoe_avx2_peak_rates(&f, &d);
        printf("%.1f %.1f\n", f / 1e9, d / 1e9);
        return 0;
    }
    if (argc < 5 || argc > 6 || (strcmp(argv[1], "nt") && strcmp(argv[1], "nn") &&
                                 strcmp(argv[1], "tn"))) {
        fprintf(stderr, "usage: gemm_kernel nt|nn|tn M N K [REPS] | gemm_kernel peaks\n");
        return 2;
    }
    const int ta = !strcmp(argv[1], "tn"), tb = !strcmp(argv[1], "nt");
    const int64_t M = atoll(argv[2]), N = atoll(argv[3]), K = atoll(argv[4]);
    const int reps = argc > 5 ? atoi(argv[5]) : 3;
    if (M <= 0 || N <= 0 || K <= 0 || reps <= 0) return 2;
    const size_t na = (size_t)(M * K), nb = (size_t)(N * K);
    const size_t nc = (size_t)(M * N);
    const size_t per = (nb + (ta ? na : 0)) * 2 + nc * 4;
    const int copies = (int)((64u << 20) / per) + 2;
    /* 64-byte aligned, as the layer's buffers are: the weight gradients'
     * non-temporal stores (lib/gemm_dpbf16.c) need whole aligned lines */
    uint16_t *B = amalloc(nb * 2 * (size_t)copies);
    uint16_t *A = amalloc(na * 2 * (size_t)(ta ? copies : 1));
    float *C = amalloc(nc * sizeof *C * (size_t)copies);
    if (!A || !B || !C) return 1;
    for (size_t i = 0; i < nb * (size_t)copies; i++) B[i] = lrmoe_f32_to_bf16((float)(i % 97) / 97 - 0.5f);
    for (size_t i = 0; i < na * (size_t)(ta ? copies : 1); i++)
        A[i] = lrmoe_f32_to_bf16((float)(i % 89) / 89 - 0.5f);
    memset(C, 0, nc * sizeof *C * (size_t)copies);
    lrmoe_gemm_t *g = lrmoe_gemm_new(LRMOE_COMPUTE_BF16, 1);
    if (!g) { fprintf(stderr, "gemm_kernel: %s\n", lrmoe_errmsg()); return 1; }
    lrmoe_gemm_kernel_t k;
    lrmoe_gemm_kernel(&k);
    double best = 1e30;
    for (int r = 0; r <= reps; r++) { /* pass 0 untimed: primitives made, pages touched */
        double t = cpu_now();
        for (int c = 0; c < copies; c++) {
            const uint16_t *a = A + (ta ? (size_t)c * na : 0), *b = B + (size_t)c * nb;
            if (lrmoe_gemm(g, ta, tb, M, N, K, a, LRMOE_BF16, ta ? M : K, b, LRMOE_BF16,
                           tb ? K : N, 0, C + (size_t)c * nc, N) < 0) {
                fprintf(stderr, "gemm_kernel: %s\n", lrmoe_errmsg());
                return 1;
            }
        }
        t = (cpu_now() - t) / copies;
        if (r && t < best) best = t;
    }
    printf("%.6f %.1f %s\n", best, 2.0 * (double)M * (double)N * (double)K / best / 1e9,
           lrmoe_gemm_kernel_name(k.kind));
    lrmoe_gemm_free(g);
    free(A); free(B); free(C);
    return 0;
}
