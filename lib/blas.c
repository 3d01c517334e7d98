/* OpenBLAS loaded on first use; see blas.h. */
#include <cblas.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "blas.h"
#include "lrmoe.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static __typeof__(cblas_sgemm) *sgemm;
static void (*set_threads)(int);
static atomic_int loaded;     /* sgemm is set */
static atomic_int want;       /* the threads asked for, 0 = OpenBLAS's default */
static char failure[4352];    /* why it is not loaded, for every caller */

#define THREADS_ENV "OPENBLAS_NUM_THREADS"

/* dlopen(path) with OPENBLAS_NUM_THREADS = n (n > 0) while OpenBLAS's
 * constructor reads it and starts its pool, the caller's value put back
 * after (setenv is not safe against a concurrent getenv: this runs once,
 * at the first F32 GEMM, and the process's own environment is what its
 * children see again) */
static void *open_with_threads(const char *path, int n)
{
    const char *cur = getenv(THREADS_ENV);
    char val[16];
    snprintf(val, sizeof val, "%d", n);
    if (n <= 0 || (cur && !strcmp(cur, val))) return dlopen(path, RTLD_NOW | RTLD_LOCAL);
    char *old = cur ? strdup(cur) : NULL;
    if (cur && !old) return dlopen(path, RTLD_NOW | RTLD_LOCAL); /* keep theirs untouched */
    setenv(THREADS_ENV, val, 1);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (old) setenv(THREADS_ENV, old, 1);
    else unsetenv(THREADS_ENV);
    free(old);
    return h;
}

static void load(void)
{
    const char *env = getenv(LRMOE_OPENBLAS_ENV);
    const int named = env && *env;
    const char *path = named ? env : LRMOE_OPENBLAS_NAME;
    const char *hint = named ? "the path " LRMOE_OPENBLAS_ENV " names"
                             : "install libopenblas0, or set " LRMOE_OPENBLAS_ENV " to its path";
    void *h = open_with_threads(path, atomic_load(&want));
    if (!h) {
        const char *why = dlerror();
        snprintf(failure, sizeof failure, "blas: cannot load OpenBLAS for the F32 GEMMs: %s (%s)",
                 why ? why : path, hint);
        return;
    }
    *(void **)&sgemm = dlsym(h, "cblas_sgemm");
    if (!sgemm) {
        snprintf(failure, sizeof failure,
                 "blas: cannot load OpenBLAS for the F32 GEMMs: %.4000s has no cblas_sgemm (%s)",
                 path, hint);
        dlclose(h);
        return;
    }
    *(void **)&set_threads = dlsym(h, "openblas_set_num_threads");
    atomic_store(&loaded, 1); /* never closed: the process keeps it */
    int n = atomic_load(&want);
    if (n > 0 && set_threads) set_threads(n);
}

static int ready(void)
{
    pthread_once(&once, load);
    return atomic_load(&loaded) ? 0 : lrmoe_err("%s", failure);
}

void lrmoe_blas_threads(int n)
{
    if (n <= 0) return;
    atomic_store(&want, n);
    /* once loaded, as it was; a load in progress applies the count it reads
     * after it has set `loaded`, so one of the two sees the new count */
    if (atomic_load(&loaded) && set_threads) set_threads(n);
}

int lrmoe_blas_loaded(void) { return atomic_load(&loaded); }

int lrmoe_blas_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc)
{
    if (ready() < 0) return -1;
    sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K,
          alpha, A, lda, B, ldb, beta, C, ldc);
    return 0;
}
