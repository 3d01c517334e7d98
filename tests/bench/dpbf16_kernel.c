/* A BF16 GEMM micro-kernel on AVX512_BF16's vdpbf16ps in its "dot" form,
 * measured against oneDNN's fixed-shape matmul of the same GEMM
 * (tests/bench/dense_bf16.c) for issue 34 item 3: does an lrmoe kernel that
 * reads the weights in place beat oneDNN 2.6.3 on a CPU with AVX512_BF16
 * and no AMX?
 *
 *   C (M,N) F32 = A (M,K) B^T,  A and B BF16 row-major, B stored (N,K)
 *
 * as the forward's expert GEMMs are (x W_gate^T, x W_up^T: B = W (F,D);
 * phi W_down^T: B = W_down (D,F)): both operands are read in place along K,
 * 32 BF16 values (16 pairs) per zmm, no packing. A 4x4 tile of C keeps 16
 * zmm accumulators whose lanes hold partial sums over K (lane j: the pairs
 * j, j+16, ...); at the end of K the 16 accumulators are reduced to one
 * zmm of 16 sums by a transposing tree (8+4+2+1 adds with unpack/shuffle),
 * so the reduction costs about two instructions per C element. Tails
 * (M % 4, N % 4, K % 32) take masked loads. Loop order: see gemm().
 *
 * Prints "seconds GFLOP/s dpbf16-dot" (best of REPS, the calling thread's
 * CPU time) and the largest relative difference from a double-precision
 * reference on a sample of C. usage: dpbf16_kernel M N K [REPS]
 * Build: cc -O2 -mavx512f -mavx512bf16 -mavx512bw -mavx512vl (tests/bench/cpu.sh). */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* 16 vectors to one: lane i of the result = the sum of v[i]'s lanes */
static __m512 reduce16(__m512 v[16])
{
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) { /* pairs: per 128-bit lane [x0+x2, y0+y2, x1+x3, y1+y3] */
        __m512 x = v[2 * i], y = v[2 * i + 1];
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
    }
    for (int i = 0; i < 4; i++) { /* per 128-bit lane [x, y, z, w] sums of 4 vectors */
        __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
        b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    for (int i = 0; i < 2; i++) { /* 128-bit lanes: pair them across vectors */
        __m512 x = b[2 * i], y = b[2 * i + 1];
        __m512 lo = _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(2, 0, 2, 0));
        __m512 hi = _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 1, 3, 1));
        c[i] = _mm512_add_ps(lo, hi);
    }
    __m512 lo = _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0));
    __m512 hi = _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1));
    return _mm512_add_ps(lo, hi);
}

/* lane order of reduce16's result: which input vector each lane sums */
static int lane_of[16];

static void find_lane_order(void)
{
    __m512 v[16];
    for (int i = 0; i < 16; i++) {
        float f[16] = {0};
        f[0] = (float)(i + 1);
        v[i] = _mm512_loadu_ps(f);
    }
    float r[16];
    _mm512_storeu_ps(r, reduce16(v));
    for (int j = 0; j < 16; j++) lane_of[j] = (int)r[j] - 1;
}

/* C[m0..m0+mr, n0..n0+nr) of A B^T, K in steps of 32 BF16 values */
static void tile(const uint16_t *A, const uint16_t *B, float *C, int64_t N, int64_t K,
                 int64_t m0, int mr, int64_t n0, int nr)
{
    __m512 acc[16];
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    const uint16_t *a[4], *b[4];
    for (int i = 0; i < 4; i++) {
        a[i] = A + (m0 + (i < mr ? i : 0)) * K;
        b[i] = B + (n0 + (i < nr ? i : 0)) * K;
    }
    /* the 16 accumulators as named registers (an array indexed in loops
     * would live in memory at -O2) */
    __m512 c00 = acc[0], c01 = acc[1], c02 = acc[2], c03 = acc[3], c10 = acc[4], c11 = acc[5],
           c12 = acc[6], c13 = acc[7], c20 = acc[8], c21 = acc[9], c22 = acc[10],
           c23 = acc[11], c30 = acc[12], c31 = acc[13], c32 = acc[14], c33 = acc[15];
    const uint16_t *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3];
    const uint16_t *b0 = b[0], *b1 = b[1], *b2 = b[2], *b3 = b[3];
#define DP(c, x, y) c = _mm512_dpbf16_ps(c, x, y)
#define STEP(LOAD)                                                                         \
    do {                                                                                   \
        __m512bh x0 = LOAD(a0), x1 = LOAD(a1), x2 = LOAD(a2), x3 = LOAD(a3);               \
        __m512bh y0 = LOAD(b0), y1 = LOAD(b1), y2 = LOAD(b2), y3 = LOAD(b3);               \
        DP(c00, x0, y0); DP(c01, x0, y1); DP(c02, x0, y2); DP(c03, x0, y3);                \
        DP(c10, x1, y0); DP(c11, x1, y1); DP(c12, x1, y2); DP(c13, x1, y3);                \
        DP(c20, x2, y0); DP(c21, x2, y1); DP(c22, x2, y2); DP(c23, x2, y3);                \
        DP(c30, x3, y0); DP(c31, x3, y1); DP(c32, x3, y2); DP(c33, x3, y3);                \
    } while (0)
#define FULL(p) ((__m512bh)_mm512_loadu_si512((p) + k))
#define PART(p) ((__m512bh)_mm512_maskz_loadu_epi16(m, (p) + k))
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) STEP(FULL);
    if (k < K) {
        __mmask32 m = (__mmask32)((1ull << (K - k)) - 1);
        STEP(PART);
    }
    acc[0] = c00, acc[1] = c01, acc[2] = c02, acc[3] = c03, acc[4] = c10, acc[5] = c11;
    acc[6] = c12, acc[7] = c13, acc[8] = c20, acc[9] = c21, acc[10] = c22, acc[11] = c23;
    acc[12] = c30, acc[13] = c31, acc[14] = c32, acc[15] = c33;
    float r[16];
    _mm512_storeu_ps(r, reduce16(acc));
    for (int l = 0; l < 16; l++) {
        int v = lane_of[l], i = v / 4, j = v % 4;
        if (i < mr && j < nr) C[(m0 + i) * N + n0 + j] = r[l];
    }
}

/* blocks of MB rows of A (MB*K*2 bytes: 512 KiB of Zen 4's 1 MiB L2 at K =
 * 2048), within which a block of 4 B rows stays in L1 while every 4-row
 * tile of the A block streams past it */
static void gemm(const uint16_t *A, const uint16_t *B, float *C, int64_t M, int64_t N, int64_t K)
{
    int64_t MB = (512 * 1024) / (2 * K);
    MB = MB < 4 ? 4 : MB - MB % 4;
    for (int64_t mb = 0; mb < M; mb += MB) {
        const int64_t me = mb + MB < M ? mb + MB : M;
        for (int64_t n0 = 0; n0 < N; n0 += 4)
            for (int64_t m0 = mb; m0 < me; m0 += 4)
                tile(A, B, C, N, K, m0, me - m0 < 4 ? (int)(me - m0) : 4, n0,
                     N - n0 < 4 ? (int)(N - n0) : 4);
    }
}

int main(int argc, char **argv)
{
    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: dpbf16_kernel M N K [REPS]\n");
        return 2;
    }
    int64_t M = atoll(argv[1]), N = atoll(argv[2]), K = atoll(argv[3]);
    int reps = argc == 5 ? atoi(argv[4]) : 3;
    if (M < 1 || N < 1 || K < 1 || reps < 1) {
        fprintf(stderr, "dpbf16_kernel: M, N, K and REPS must be positive\n");
        return 2;
    }
    find_lane_order();
    uint16_t *A = malloc((size_t)(M * K) * 2), *B = malloc((size_t)(N * K) * 2);
    float *C = malloc((size_t)(M * N) * 4);
    if (!A || !B || !C) return 1;
    uint32_t s = 1;
    for (int64_t i = 0; i < M * K; i++) A[i] = to_bf16((float)((s = s * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f);
    for (int64_t i = 0; i < N * K; i++) B[i] = to_bf16((float)((s = s * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = cpu_now();
        gemm(A, B, C, M, N, K);
        double t = cpu_now() - t0;
        if (t < best) best = t;
    }
    double err = 0;
    for (int64_t i = 0; i < M; i += (M > 16 ? M / 16 : 1))
        for (int64_t j = 0; j < N; j += (N > 16 ? N / 16 : 1)) {
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                double p = (double)from_bf16(A[i * K + k]) * from_bf16(B[j * K + k]);
                ref += p;
                mag += fabs(p);
            }
            double e = fabs(C[i * N + j] - ref) / (mag > 0 ? mag : 1);
            if (e > err) err = e;
        }
    printf("%.6f %.1f dpbf16-dot relerr %.2e\n", best, 2.0 * M * N * K / best * 1e-9, err);
    free(A), free(B), free(C);
    return err < 1e-5 ? 0 : 1;
}
