/* LLEP: least-loaded assignment (LLA) with the lambda fallback to plain EP,
 * as restated in DESIGN.md.
 *
 * Experts are visited by load, largest first (ties: lower id first). The
 * capacity is m_alpha = alpha * N / P. A rank's effective load is the pairs
 * already assigned to it plus the loads of its native experts not visited
 * yet. The native rank takes what fits under capacity; if the excess would be
 * smaller than m it takes everything (spilling is not worth a GEMM). The rest
 * spills in chunks to the helper (a rank other than the native) with the
 * lowest effective load (ties: lower rank), each chunk as large as that
 * helper's room; a chunk smaller than m is skipped unless it is the whole
 * remainder. When no helper can take a chunk, the remainder goes to the
 * helper with the lowest effective load (forced assignment). */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

/* The visiting order sorts (load, id) pairs: no shared state, so planners
 * may run in several threads at once (lrmoe-sim --jobs). */
typedef struct {
    int64_t load;
    int id;
} llep_key_t;

static int cmp_load_desc(const void *a, const void *b)
{
    const llep_key_t *x = a, *y = b;
    if (x->load != y->load)
        return x->load < y->load ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

int lrmoe_llep_assign(const int64_t *load, int E, int P, double lambda, double alpha,
                      int64_t min_chunk, uint8_t *placement, int64_t *fwd)
{
    if (E <= 0 || P <= 0 || E % P)
        return lrmoe_err("llep: %d ranks do not divide %d experts", P, E);
    const int per = E / P;
    memset(placement, 0, (size_t)E * P);
    memset(fwd, 0, (size_t)E * P * sizeof *fwd);
    int64_t *eff_pending = calloc((size_t)P, sizeof(int64_t));
    int64_t *assigned = calloc((size_t)P, sizeof(int64_t));
    int *order = malloc((size_t)E * sizeof(int));
    char *skip = malloc((size_t)P);
    if (!eff_pending || !assigned || !order || !skip) {
        free(eff_pending);
        free(assigned);
        free(order);
        free(skip);
        return lrmoe_err("llep: out of memory");
    }
    int64_t N = 0, maxr = 0;
    for (int e = 0; e < E; e++) {
        placement[(size_t)e * P + e / per] = 1;
        eff_pending[e / per] += load[e];
        N += load[e];
    }
    for (int p = 0; p < P; p++)
        if (eff_pending[p] > maxr)
            maxr = eff_pending[p];
    /* lambda fallback: balanced enough, plain EP */
    int ran = 1;
    if (N == 0 || (double)maxr / ((double)N / P) < lambda) {
        for (int e = 0; e < E; e++)
            fwd[(size_t)e * P + e / per] = load[e];
        ran = 0;
        goto out;
    }
    const double cap = alpha * (double)N / P;
    llep_key_t *key = malloc((size_t)E * sizeof *key);
    if (!key) {
        ran = lrmoe_err("llep: out of memory");
        goto out;
    }
    for (int e = 0; e < E; e++) {
        key[e].load = load[e];
        key[e].id = e;
    }
    qsort(key, (size_t)E, sizeof *key, cmp_load_desc);
    for (int e = 0; e < E; e++)
        order[e] = key[e].id;
    free(key);
    for (int i = 0; i < E; i++) {
        const int e = order[i], nat = e / per;
        int64_t r = load[e];
        eff_pending[nat] -= r; /* now being visited */
        if (r == 0)
            continue;
        double eff = (double)(assigned[nat] + eff_pending[nat]);
        int64_t room = cap > eff ? (int64_t)(cap - eff) : 0;
        int64_t take = r < room ? r : room;
        if (r - take < min_chunk)
            take = r; /* excess below m: not worth spilling */
        fwd[(size_t)e * P + nat] += take;
        assigned[nat] += take;
        r -= take;
        memset(skip, 0, (size_t)P);
        while (r > 0) {
            int best = -1;
            for (int p = 0; p < P; p++) {
                if (p == nat || skip[p])
                    continue;
                if (best < 0 || assigned[p] + eff_pending[p] <
                                    assigned[best] + eff_pending[best])
                    best = p;
            }
            int64_t chunk = 0;
            if (best >= 0) {
                double e2 = (double)(assigned[best] + eff_pending[best]);
                room = cap > e2 ? (int64_t)(cap - e2) : 0;
                chunk = r < room ? r : room;
                if (chunk <= 0 || (chunk < min_chunk && chunk < r)) {
                    skip[best] = 1; /* no room, or a too-small chunk */
                    continue;
                }
            } else {
                /* nobody can take a chunk: the least-loaded helper takes all */
                for (int p = 0; p < P; p++)
                    if (p != nat && (best < 0 || assigned[p] + eff_pending[p] <
                                                     assigned[best] + eff_pending[best]))
                        best = p;
                if (best < 0)
                    best = nat; /* P == 1 */
                chunk = r;
            }
            fwd[(size_t)e * P + best] += chunk;
            placement[(size_t)e * P + best] = 1;
            assigned[best] += chunk;
            r -= chunk;
        }
    }
out:
    free(eff_pending);
    free(assigned);
    free(order);
    free(skip);
    return ran;
}
