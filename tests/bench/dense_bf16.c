/* One dense oneDNN matmul, BF16 operands, F32 output (the GEMM-efficiency
 * reference of tests/bench/cpu.sh): C (M,N) = A (M,K) B^T, B stored (N,K)
 * like the expert weights, a fixed-shape primitive (oneDNN's best kernel for
 * the shape). Prints "seconds GFLOP/s implementation", best of REPS runs
 * (default 2; more runs can only raise the rate), timed with the calling
 * thread's CPU time when THREADS = 1 (like lrmoe-exec --clock cpu), else the
 * monotonic clock. DTYPE f32 makes both operands F32 instead (the reference
 * on a CPU where oneDNN has no BF16 matmul: the best dense GEMM it has).
 * usage: dense_bf16 M N K THREADS [REPS [bf16|f32]] */
#include <oneapi/dnnl/dnnl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
void omp_set_num_threads(int n);

static double now(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define CK(x) do { dnnl_status_t s_ = (x); if (s_) { \
    fprintf(stderr, "dense_bf16: %s: status %d\n", #x, (int)s_); return 1; } } while (0)

int main(int argc, char **argv)
{
    if (argc < 5 || argc > 7 || (argc == 7 && strcmp(argv[6], "bf16") && strcmp(argv[6], "f32"))) {
        fprintf(stderr, "usage: dense_bf16 M N K THREADS [REPS [bf16|f32]]\n");
        return 2;
    }
    int64_t M = atoll(argv[1]), N = atoll(argv[2]), K = atoll(argv[3]);
    int th = atoi(argv[4]), reps = argc >= 6 ? atoi(argv[5]) : 2;
    const int f32 = argc == 7 && !strcmp(argv[6], "f32");
    const size_t es = f32 ? 4 : 2;
    const dnnl_data_type_t dt = f32 ? dnnl_f32 : dnnl_bf16;
    if (M < 1 || N < 1 || K < 1 || reps < 1) { fprintf(stderr, "dense_bf16: M, N, K and REPS must be positive\n"); return 2; }
    if (th > 0) omp_set_num_threads(th);
    dnnl_engine_t eng;
    dnnl_stream_t st;
    CK(dnnl_engine_create(&eng, dnnl_cpu, 0));
    CK(dnnl_stream_create(&st, eng, dnnl_stream_default_flags));
    dnnl_dims_t ad = {M, K}, as = {K, 1}, bd = {K, N}, bs = {1, K}, cd = {M, N}, cs = {N, 1};
    dnnl_memory_desc_t a, b, c;
    CK(dnnl_memory_desc_init_by_strides(&a, 2, ad, dt, as));
    CK(dnnl_memory_desc_init_by_strides(&b, 2, bd, dt, bs));
    CK(dnnl_memory_desc_init_by_strides(&c, 2, cd, dnnl_f32, cs));
    dnnl_matmul_desc_t md;
    CK(dnnl_matmul_desc_init(&md, &a, &b, NULL, &c));
    dnnl_primitive_desc_t pd;
    CK(dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL));
    const char *impl = "?";
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    char name[128];
    snprintf(name, sizeof name, "%s", impl);
    dnnl_primitive_t p;
    CK(dnnl_primitive_create(&p, pd));
    dnnl_primitive_desc_destroy(pd);
    void *A = malloc((size_t)(M * K) * es), *B = malloc((size_t)(N * K) * es);
    float *C = malloc((size_t)(M * N) * 4);
    if (!A || !B || !C) { fprintf(stderr, "dense_bf16: out of memory\n"); return 1; }
    /* BF16 bit patterns of values in [0.0039, 0.0078) (A) and their negatives (B);
     * F32: the same values widened */
    for (int64_t i = 0; i < M * K; i++) {
        const uint16_t h = (uint16_t)(0x3c00 + (i * 7919) % 1024);
        if (f32) ((uint32_t *)A)[i] = (uint32_t)h << 16; else ((uint16_t *)A)[i] = h;
    }
    for (int64_t i = 0; i < N * K; i++) {
        const uint16_t h = (uint16_t)(0xbc00 + (i * 104729) % 1024);
        if (f32) ((uint32_t *)B)[i] = (uint32_t)h << 16; else ((uint16_t *)B)[i] = h;
    }
    memset(C, 0, (size_t)(M * N) * 4);
    dnnl_memory_t ma, mb, mc;
    CK(dnnl_memory_create(&ma, &a, eng, A));
    CK(dnnl_memory_create(&mb, &b, eng, B));
    CK(dnnl_memory_create(&mc, &c, eng, C));
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
    clockid_t clk = th == 1 ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now(clk);
        CK(dnnl_primitive_execute(p, st, 3, args));
        CK(dnnl_stream_wait(st));
        double t = now(clk) - t0;
        if (t < best) best = t;
    }
    printf("%.6f %.3f %s\n", best, 2.0 * (double)M * (double)N * (double)K / best / 1e9, name);
    return C[0] == 12345.0f;
}
