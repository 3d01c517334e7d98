/* Built by tests/lib.bats with AddressSanitizer's leak checker: NT threads
 * each plan frames with the lrmoe planner (its per-thread scratch plans) and
 * solve a min-peak allocation with GLPK (GLPK's per-thread environment), then
 * end WITHOUT lrmoe_plan_thread_cleanup. The library frees both when each
 * thread ends, so the leak checker finds nothing at exit.
 *   plan_threads NT   prints "NT threads planned: rho ... fwd_peak ..." */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lrmoe.h"
#include "minpeak.h"
#include "plan.h"

enum { E = 32, P = 4 };

static void *work(void *arg)
{
    int id = (int)(long)arg, *rc = malloc(sizeof *rc);
    *rc = 1;
    lrmoe_plan_opts_t o;
    lrmoe_plan_opts_default(&o);
    o.P = P;
    o.cost.D = 64;
    o.cost.F = 32;
    o.cost.K = 4;
    o.cost.tokens = 256;
    int64_t load[E];
    for (int e = 0; e < E; e++) load[e] = 10 + ((e * 37 + id * 11) % 97) * (e % 5 == 0 ? 9 : 1);
    lrmoe_plan_t p;
    lrmoe_plan_init(&p);
    for (int frame = 0; frame < 3; frame++)
        if (lrmoe_plan_compute(&o, load, E, &p) < 0) goto out;
    /* GLPK on the plan's placement */
    int64_t x[E * P];
    if (lrmoe_alloc_glpk(p.placement, load, E, P, 10.0, x) < 0) goto out;
    printf("thread %d: rho %.2f fwd_peak %lld\n", id, p.rho, (long long)p.fwd_peak);
    *rc = 0;
out:
    if (*rc) fprintf(stderr, "thread %d: %s\n", id, lrmoe_errmsg());
    lrmoe_plan_free(&p);
    return rc;
}

int main(int argc, char **argv)
{
    int nt = argc > 1 ? atoi(argv[1]) : 4, fail = 0;
    pthread_t t[16];
    if (nt < 1 || nt > 16) return 2;
    for (int i = 0; i < nt; i++)
        if (pthread_create(&t[i], NULL, work, (void *)(long)i)) return 1;
    for (int i = 0; i < nt; i++) {
        void *r;
        pthread_join(t[i], &r);
        fail |= *(int *)r;
        free(r);
    }
    if (!fail) printf("%d threads planned\n", nt);
    return fail;
}
