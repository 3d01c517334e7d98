/* first_touch: what a fresh process pays to fault in the backward's F32
 * weight gradients, the floor under cold_warm.sh's cold frame. Allocates
 * 3 matrices of E*F*D floats with lrmoe_alloc_big (the library's page
 * policy), faults each expert's matrix in as the backward does
 * (lrmoe_alloc_prefault) and writes it once (the GEMM's store); then writes
 * the same bytes again (what a warm frame pays for them). Prints
 *   first_s rewrite_s bytes
 * in thread CPU seconds. Usage: first_touch E F D */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "lrmoe.h"
#include "alloc.h"

static double tcpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc != 4) { fprintf(stderr, "usage: first_touch E F D\n"); return 2; }
    size_t E = strtoul(argv[1], 0, 10), F = strtoul(argv[2], 0, 10), D = strtoul(argv[3], 0, 10);
    size_t FD = F * D, n = 3 * E * FD;
    float *g = lrmoe_alloc_big(n * sizeof(float));
    if (!g) { fprintf(stderr, "first_touch: %s\n", lrmoe_errmsg()); return 1; }
    double t0 = tcpu();
    for (size_t m = 0; m < 3 * E; m++) {
        lrmoe_alloc_prefault(g + m * FD, FD * sizeof(float));
        memset(g + m * FD, 0, FD * sizeof(float));
    }
    double t1 = tcpu();
    for (size_t m = 0; m < 3 * E; m++) memset(g + m * FD, 1, FD * sizeof(float));
    double t2 = tcpu();
    printf("%.3f %.3f %zu\n", t1 - t0, t2 - t1, n * sizeof(float));
    return g[n - 1] == 0.0f;   /* keeps the writes */
}
