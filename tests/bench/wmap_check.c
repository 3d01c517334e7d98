/* wmap_check: what a one-frame lrmoe-exec process pays to map a raw
 * weights file and check its digest records (lib/weights_map.c), on one
 * thread and on THREADS (the -@ of lrmoe-exec; 0: every CPU this process
 * may run on), ROUNDS rounds alternating, each map in this process anew
 * (the page-table faults of a fresh mapping included; the file's pages stay
 * in the page cache, as for a pipeline's next process). Prints per round
 *   one_thread_s threads_s
 * in wall seconds. Usage: wmap_check FILE THREADS ROUNDS */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "lrmoe.h"
#include "weights_map.h"

static double wall(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double once(const char *path, int threads)
{
    lrmoe_weights_t w;
    lrmoe_wmap_t m;
    double t = wall();
    if (lrmoe_weights_map(path, &w, &m, threads) != 1) {
        fprintf(stderr, "wmap_check: %s: not a mappable weights file (or a digest mismatch)\n", path);
        exit(1);
    }
    t = wall() - t;
    lrmoe_weights_unmap(&w, &m);
    return t;
}

int main(int argc, char **argv)
{
    if (argc != 4) { fprintf(stderr, "usage: wmap_check FILE THREADS ROUNDS\n"); return 2; }
    int th = atoi(argv[2]), rounds = atoi(argv[3]);
    for (int r = 0; r < rounds; r++) {
        double a = r & 1 ? 0 : once(argv[1], 1), b = once(argv[1], th);
        if (r & 1) a = once(argv[1], 1);
        printf("%.4f %.4f\n", a, b);
    }
    return 0;
}
