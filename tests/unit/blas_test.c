/* lib/blas.c on its own (tests/blas.bats):
 *   blas_test N   lrmoe_blas_threads(N) (N > 0) before the first GEMM, then
 *                 every transpose of lrmoe_blas_sgemm, with alpha and beta,
 *                 against a plain loop (small integers: exact in F32), and
 *                 prints the process's thread count and OPENBLAS_NUM_THREADS
 *                 after the load: "loaded=1 threads=T env=V"
 *   blas_test missing
 *                 with LRMOE_OPENBLAS naming no library: every call fails
 *                 with the same error, nothing loaded; prints the error */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "blas.h"
#include "lrmoe.h"

static int tasks(void)
{
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    struct dirent *e;
    if (!d) return -1;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

/* op(X)[i][j] of a row-major (r, c) matrix X stored with stride ld */
static float at(const float *X, int t, int ld, int i, int j) { return t ? X[j * ld + i] : X[i * ld + j]; }

static int check(int ta, int tb)
{
    enum { M = 37, N = 29, K = 41, LD = 50 };
    static float A[LD * LD], B[LD * LD], C[LD * LD], R[LD * LD];
    for (int i = 0; i < LD * LD; i++) {
        A[i] = (float)((i * 7) % 11 - 5);
        B[i] = (float)((i * 5) % 13 - 6);
        C[i] = R[i] = (float)(i % 9 - 4);
    }
    const float alpha = 2.0f, beta = -3.0f;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = 0;
            for (int k = 0; k < K; k++) s += at(A, ta, LD, i, k) * at(B, tb, LD, k, j);
            R[i * LD + j] = alpha * s + beta * R[i * LD + j];
        }
    if (lrmoe_blas_sgemm(ta, tb, M, N, K, alpha, A, LD, B, LD, beta, C, LD) < 0) {
        fprintf(stderr, "blas_test: %s\n", lrmoe_errmsg());
        return -1;
    }
    for (int i = 0; i < LD * LD; i++)
        if (C[i] != R[i]) {
            fprintf(stderr, "blas_test: ta=%d tb=%d: C[%d][%d] = %g, want %g\n", ta, tb, i / LD,
                    i % LD, C[i], R[i]);
            return -1;
        }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) return 2;
    if (!strcmp(argv[1], "missing")) {
        float a = 1, b = 1, c = 0;
        char first[1024];
        if (lrmoe_blas_sgemm(0, 0, 1, 1, 1, 1, &a, 1, &b, 1, 0, &c, 1) == 0) {
            fprintf(stderr, "blas_test: loaded %s\n", getenv(LRMOE_OPENBLAS_ENV));
            return 1;
        }
        snprintf(first, sizeof first, "%s", lrmoe_errmsg());
        if (lrmoe_blas_sgemm(0, 0, 1, 1, 1, 1, &a, 1, &b, 1, 0, &c, 1) == 0 ||
            strcmp(first, lrmoe_errmsg()) || lrmoe_blas_loaded()) {
            fprintf(stderr, "blas_test: second call: %s\n", lrmoe_errmsg());
            return 1;
        }
        printf("%s\n", first);
        return 0;
    }
    int n = atoi(argv[1]);
    if (lrmoe_blas_loaded() || tasks() != 1) {
        fprintf(stderr, "blas_test: loaded (%d) or threads (%d) before the first GEMM\n",
                lrmoe_blas_loaded(), tasks());
        return 1;
    }
    lrmoe_blas_threads(n);
    if (lrmoe_blas_loaded()) return 1;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            if (check(ta, tb) < 0) return 1;
    const char *env = getenv("OPENBLAS_NUM_THREADS");
    printf("loaded=%d threads=%d env=%s\n", lrmoe_blas_loaded(), tasks(), env ? env : "unset");
    return 0;
}
