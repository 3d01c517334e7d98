/* LLEP: least-loaded assignment with the imbalance gate, rule for rule as
 * SalesforceAIResearch/LeastLoadedEP (llep/gpt_oss_llep.py:
 * compute_llep_lpt_plan and the gate in gptoss_llep_forward; llep/utils.py:
 * compute_gpu_imbalance_ratio). Restated, not copied:
 *
 * Gate: with lambda > 0, the per-rank native loads are summed in float32,
 * ratio = max / mean in float32 (1 when the mean is 0); the LPT plan runs
 * when ratio >= lambda, else plain EP. lambda == 0 turns the gate off (the
 * LPT plan always runs).
 *
 * LPT plan: capacity m_alpha = int(alpha * (N // P)) (N when N // P == 0),
 * at least 1. Experts by load, largest first (ties: lower id); experts
 * without pairs are skipped. A rank's effective load is its assigned pairs
 * plus the loads of its native experts not visited yet; visiting an expert
 * removes it from its native's pending load. With avail = m_alpha - eff(native):
 *   avail >= n_e  the native takes all of it;
 *   avail > 0     the native takes avail; the rest spills chunk by chunk:
 *                 each round the helpers (ranks other than the native) are
 *                 sorted by effective load, now (ties: lower rank); the first
 *                 one with room whose chunk min(rest, room) is >= m or is the
 *                 whole rest takes it; when none does, the whole rest goes to
 *                 the least-loaded helper of that round (forced);
 *   avail <= 0    everything spills: the helpers are sorted once, by their
 *                 effective load before this expert; one pass over them in
 *                 that order gives each helper with room the chunk
 *                 min(rest, room) unless it is < m and not the whole rest;
 *                 what is left goes to the first helper of that order.
 * With one rank everything stays native.
 *
 * Why the plan is what it is (lrmoe_llep_assign_why, plan.llep): "gate"
 * (the gate kept plain EP), "capacity" (the plan ran but no rank's native
 * load was over the capacity: nothing spilled, plain EP), "minchunk"
 * (pairs spilled, but every spilled chunk is below m: remainders and forced
 * chunks, as on small batches; the reference never keeps such a chunk on
 * the native, so m alone never leaves plain EP) and "spilled" (at least one
 * chunk of >= m rows spilled). */
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

int lrmoe_llep_gate(const int64_t *load, int E, int P, double lambda)
{
    if (!(lambda > 0))
        return 1;
    const int per = E / P;
    double sum = 0;
    float mx = 0;
    for (int p = 0; p < P; p++) {
        int64_t s = 0;
        for (int e = p * per; e < (p + 1) * per; e++)
            s += load[e];
        float f = (float)s;
        sum += f;
        if (f > mx)
            mx = f;
    }
    float mean = (float)sum / (float)P;
    float ratio = mean == 0.0f ? 1.0f : mx / mean;
    return (double)ratio >= lambda;
}

int64_t lrmoe_llep_capacity(int64_t N, int P, double alpha)
{
    const int64_t bal = N / P;
    int64_t cap = bal > 0 ? (int64_t)(alpha * (double)bal) : N;
    return cap < 1 ? 1 : cap;
}

/* Helpers of native rank nat sorted by effective load (stable: lower rank
 * first on ties) into h; returns their count (P - 1). */
static int sort_helpers(const int64_t *assigned, const int64_t *pending, int P, int nat,
                        int *h, int64_t *key)
{
    int k = 0;
    for (int p = 0; p < P; p++) {
        if (p == nat)
            continue;
        const int64_t v = assigned[p] + pending[p];
        int j = k++;
        while (j > 0 && key[j - 1] > v) { /* insertion: stable */
            key[j] = key[j - 1];
            h[j] = h[j - 1];
            j--;
        }
        key[j] = v;
        h[j] = p;
    }
    return k;
}

/* The plan; *maxchunk is the largest chunk given to a helper (0: none).
 * Returns 1 when the LPT plan ran, 0 when the gate kept plain EP, -1. */
static int llep_run(const int64_t *load, int E, int P, double lambda, double alpha,
                    int64_t min_chunk, uint8_t *placement, int64_t *fwd, int64_t *maxchunk)
{
    if (E <= 0 || P <= 0 || E % P)
        return lrmoe_err("llep: %d ranks do not divide %d experts", P, E);
    const int per = E / P;
    memset(placement, 0, (size_t)E * P);
    memset(fwd, 0, (size_t)E * P * sizeof *fwd);
    int64_t *pending = calloc((size_t)P, sizeof(int64_t));
    int64_t *assigned = calloc((size_t)P, sizeof(int64_t));
    int64_t *key = malloc((size_t)P * sizeof(int64_t)), *avail0 = malloc((size_t)P * sizeof(int64_t));
    int *h = malloc((size_t)P * sizeof(int));
    llep_key_t *ord = malloc((size_t)E * sizeof *ord);
    int ran = 1;
    *maxchunk = 0;
    if (!pending || !assigned || !key || !avail0 || !h || !ord) {
        ran = lrmoe_err("llep: out of memory");
        goto out;
    }
    int64_t N = 0;
    for (int e = 0; e < E; e++) {
        placement[(size_t)e * P + e / per] = 1;
        pending[e / per] += load[e];
        N += load[e];
    }
    if (!lrmoe_llep_gate(load, E, P, lambda)) {
        for (int e = 0; e < E; e++)
            fwd[(size_t)e * P + e / per] = load[e];
        ran = 0;
        goto out;
    }
    const int64_t cap = lrmoe_llep_capacity(N, P, alpha);
    for (int e = 0; e < E; e++) {
        ord[e].load = load[e];
        ord[e].id = e;
    }
    qsort(ord, (size_t)E, sizeof *ord, cmp_load_desc);
#define GIVE(p, c)                                                                         \
    do {                                                                                   \
        fwd[(size_t)e * P + (p)] += (c);                                                   \
        placement[(size_t)e * P + (p)] = 1;                                                \
        assigned[p] += (c);                                                                \
        if ((p) != nat && (c) > *maxchunk)                                                 \
            *maxchunk = (c);                                                               \
    } while (0)
    for (int i = 0; i < E; i++) {
        const int e = ord[i].id, nat = e / per;
        const int64_t n = load[e];
        if (n == 0)
            continue;
        pending[nat] -= n;
        const int64_t avail = cap - (assigned[nat] + pending[nat]);
        if (avail >= n) {
            GIVE(nat, n);
            continue;
        }
        int64_t rest = n;
        if (avail > 0) {
            GIVE(nat, avail);
            rest -= avail;
            while (rest > 0) {
                const int k = sort_helpers(assigned, pending, P, nat, h, key);
                if (k == 0) { /* one rank: over capacity on the native */
                    GIVE(nat, rest);
                    break;
                }
                int done = 0;
                for (int j = 0; j < k && !done; j++) {
                    const int64_t room = cap - key[j];
                    if (room <= 0)
                        continue;
                    const int64_t chunk = rest < room ? rest : room;
                    if (chunk < min_chunk && rest > chunk)
                        continue;
                    GIVE(h[j], chunk);
                    rest -= chunk;
                    done = 1;
                }
                if (!done) { /* every helper full: the least loaded, forced */
                    GIVE(h[0], rest);
                    rest = 0;
                }
            }
            continue;
        }
        /* the native is at or over capacity: everything spills */
        const int k = sort_helpers(assigned, pending, P, nat, h, key);
        for (int j = 0; j < k; j++)
            avail0[j] = cap - key[j];
        for (int j = 0; j < k && rest > 0; j++) {
            if (avail0[j] <= 0)
                continue;
            const int64_t chunk = rest < avail0[j] ? rest : avail0[j];
            if (chunk < min_chunk && rest > chunk)
                continue;
            GIVE(h[j], chunk);
            rest -= chunk;
        }
        if (rest > 0)
            GIVE(k > 0 ? h[0] : nat, rest);
    }
#undef GIVE
out:
    free(pending);
    free(assigned);
    free(key);
    free(avail0);
    free(h);
    free(ord);
    return ran;
}

int lrmoe_llep_assign(const int64_t *load, int E, int P, double lambda, double alpha,
                      int64_t min_chunk, uint8_t *placement, int64_t *fwd)
{
    int64_t mc;
    return llep_run(load, E, P, lambda, alpha, min_chunk, placement, fwd, &mc);
}

int lrmoe_llep_assign_why(const int64_t *load, int E, int P, double lambda, double alpha,
                          int64_t min_chunk, uint8_t *placement, int64_t *fwd,
                          lrmoe_llep_reason_t *why)
{
    int64_t mc;
    const int ran = llep_run(load, E, P, lambda, alpha, min_chunk, placement, fwd, &mc);
    if (ran >= 0)
        *why = !ran      ? LRMOE_LLEP_GATE
               : mc == 0 ? LRMOE_LLEP_CAPACITY
               : mc < min_chunk ? LRMOE_LLEP_MINCHUNK
                                : LRMOE_LLEP_SPILLED;
    return ran;
}

const char *lrmoe_llep_reason_name(lrmoe_llep_reason_t r)
{
    switch (r) {
    case LRMOE_LLEP_GATE: return "gate";
    case LRMOE_LLEP_CAPACITY: return "capacity";
    case LRMOE_LLEP_MINCHUNK: return "minchunk";
    case LRMOE_LLEP_SPILLED: return "spilled";
    }
    return "?";
}
