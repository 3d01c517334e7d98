/* wmap_check: what a one-frame lrmoe-exec process pays to map a raw
 * weights file and check the digest records of every frame (as a process
 * that uses every layer does; lib/weights_map.c), on one thread and on
 * THREADS (the -@ of lrmoe-exec; 0: every CPU this process may run on),
 * and to map it alone (the headers: what a layer no frame uses costs),
 * and, on THREADS, to map it and check what lrmoe-plan --weights reads of
 * every frame (its header) and what lrmoe-route -w reads (the header,
 * router_weight and expert_bias): with records by parts (lrmoe-stream(5),
 * written for frames of 64 MiB or more) only those parts are read, with a
 * record of the whole frame the whole frame is. ROUNDS rounds alternating,
 * each map in this process anew (the page-table faults of a fresh mapping
 * included; the file's pages stay in the page cache, as for a pipeline's
 * next process). Prints per round
 *   one_thread_s threads_s map_only_s header_s router_s
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

/* check: 0 none, 1 every frame whole, 2 every frame's header, 3 the
 * header and the router's tensors */
static double once(const char *path, int threads, int check)
{
    static const char *const router[] = {"router_weight", "expert_bias"};
    lrmoe_weights_t w;
    lrmoe_wmap_t m;
    double t = wall();
    if (lrmoe_weights_map(path, &w, &m, threads) != 1) {
        fprintf(stderr, "wmap_check: %s: not a mappable weights file\n", path);
        exit(1);
    }
    for (int i = 0; check && i < w.n; i++)
        if ((check == 1 ? lrmoe_weights_map_check(&m, i)
                        : lrmoe_weights_map_check_tensors(&m, i, router, check == 3 ? 2 : 0)) < 0) {
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
        double c = once(argv[1], th, 0), d = once(argv[1], th, 2);
        printf("%.6f %.6f %.6f %.6f %.6f\n", a, b, c, d, once(argv[1], th, 3));
    }
    return 0;
}
