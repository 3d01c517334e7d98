/* Contiguous-range parallel loops (par.h). */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include "lrmoe.h"
#include "par.h"

typedef struct {
    lrmoe_range_fn fn;
    void *ctx;
    int64_t lo, hi;
    int rc;
    char err[512];
} chunk_t;

static void *run_chunk(void *vp)
{
    chunk_t *c = vp;
    c->rc = c->fn(c->ctx, c->lo, c->hi);
    if (c->rc < 0) snprintf(c->err, sizeof c->err, "%s", lrmoe_errmsg());
    return NULL;
}

int lrmoe_parallel_ranges(int64_t n, int threads, int64_t min_chunk, lrmoe_range_fn fn,
                          void *ctx)
{
    if (min_chunk < 1) min_chunk = 1;
    int64_t most = n / min_chunk;
    if (threads > most) threads = (int)most;
    if (threads <= 1) return fn(ctx, 0, n);
    chunk_t *c = calloc((size_t)threads, sizeof *c);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    int *started = calloc((size_t)threads, sizeof *started);
    if (!c || !th || !started) {
        free(c); free(th); free(started);
        return fn(ctx, 0, n); /* no memory for threads: one call */
    }
    for (int i = 0; i < threads; i++)
        c[i] = (chunk_t){fn, ctx, n * i / threads, n * (i + 1) / threads, 0, ""};
    for (int i = 1; i < threads; i++)
        started[i] = pthread_create(&th[i], NULL, run_chunk, &c[i]) == 0;
    run_chunk(&c[0]);
    for (int i = 1; i < threads; i++) {
        if (started[i]) pthread_join(th[i], NULL);
        else run_chunk(&c[i]); /* could not start: run it here */
    }
    int rc = 0;
    for (int i = 0; i < threads && !rc; i++)
        if (c[i].rc < 0) rc = lrmoe_err("%s", c[i].err);
    free(c); free(th); free(started);
    return rc;
}

int lrmoe_parallel_cpus(int threads)
{
    if (threads > 0) return threads;
    cpu_set_t cs;
    int n = sched_getaffinity(0, sizeof cs, &cs) == 0 ? CPU_COUNT(&cs) : 1;
    return n > 0 ? n : 1;
}
