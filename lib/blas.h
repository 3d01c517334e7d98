/* The F32 BLAS of liblrmoe: OpenBLAS's cblas_sgemm, loaded on first use.
 *
 * liblrmoe and the tools do not link libopenblas: a process that never
 * runs an F32 GEMM (the BF16 forward and backward, plan, pack, cat...)
 * never loads it, and so never starts its thread pool, whose threads are
 * created when the library is loaded and spin (sched_yield) for a while
 * before they sleep. The first lrmoe_blas_sgemm of the process loads it
 * (dlopen, once, whichever thread comes first):
 *   $LRMOE_OPENBLAS, when set and not empty: that path and nothing else;
 *   else libopenblas.so.0 by name (the dynamic loader's search: run path,
 *   LD_LIBRARY_PATH, ld.so.cache; Debian's libopenblas0 alternatives).
 * A library that does not load, or has no cblas_sgemm, is one error for
 * every call: "blas: cannot load OpenBLAS ...: why".
 *
 * Threads: lrmoe_blas_threads(n) records the count the caller asks for.
 * Before the load it is the pool OpenBLAS starts with (OPENBLAS_NUM_THREADS
 * is n while dlopen runs, then restored), so no more than n threads are
 * ever created; after it, openblas_set_num_threads(n), as before. Never
 * called (or n <= 0): OpenBLAS's own default (OPENBLAS_NUM_THREADS, else
 * one per core). A library without openblas_set_num_threads is used as it
 * comes. Nothing here prints or exits. */
#ifndef LRMOE_BLAS_H
#define LRMOE_BLAS_H

#define LRMOE_OPENBLAS_ENV "LRMOE_OPENBLAS"
#define LRMOE_OPENBLAS_NAME "libopenblas.so.0"

/* C (M,N) = alpha op(A) op(B) + beta C, row-major, F32: cblas_sgemm with
 * CblasRowMajor and ta/tb selecting CblasTrans. 0, or -1 with the error
 * set when OpenBLAS cannot be loaded. */
int lrmoe_blas_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc);

/* The BLAS threads of the process from now on (n > 0; else ignored). */
void lrmoe_blas_threads(int n);

/* 1 when this process has loaded OpenBLAS, else 0. */
int lrmoe_blas_loaded(void);

#endif
