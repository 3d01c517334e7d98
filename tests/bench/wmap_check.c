/* wmap_check: what a one-frame lrmoe-exec process pays to map a raw
 * weights file and check the digest records of every frame (as a process
 * that uses every layer does; lib/weights_map.c), on one thread and on
 * THREADS (the -@ of lrmoe-exec; 0: every CPU this process may run on),
 * and to map it alone (the headers: what a layer no frame uses costs),
 * ROUNDS rounds alternating, each map in this process anew (the page-table
 * faults of a fresh mapping included; the file's pages stay in the page
 * cache, as for a pipeline's next process). Prints per round
 *   one_thread_s threads_s map_only_s
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

static double once(const char *path, int threads, int check)
{
    lrmoe_weights_t w;
    lrmoe_wmap_t m;
    double t = wall();
    if (lrmoe_weights_map(path, &w, &m, threads) != 1) {
        fprintf(stderr, "wmap_check: %s: not a mappable weights file\n", path);
        exit(1);
    }
    for (int i = 0; check && i < w.n; i++)
        if (lrmoe_weights_map_check(&m, i) < 0) {
            fprintf(stderr, "wmap_check: %s\n", lrmoe_errmsg());
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
        double a = r & 1 ? 0 : once(argv[1], 1, 1), b = once(argv[1], th, 1);
        if (r & 1) a = once(argv[1], 1, 1);
        printf("%.4f %.4f %.4f\n", a, b, once(argv[1], th, 0));
    }
    return 0;
}
