/* The min-peak solver under every planner: the closed-form optimum T*
 * (rank subsets, P <= LRMOE_PLAN_MAX_P), the exact parametric max-flow
 * search (any P), the max-flow allocation and the GLPK integer allocation
 * (fixed or free quotas). One max-flow implementation (Dinic, below) serves
 * the search, the allocations and the routing network. Depends on nothing
 * of the planners. */
#include <glpk.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "lrmoe.h"
#include "minpeak.h"
#include "minpeak_internal.h"

/* ---------------------------------------------------------------- bounds */

/* Fill sub[S] = sum of w[e] over experts whose eligible mask lies within S
 * (zeta transform over subsets). sub has 2^P entries. Returns the sum of w
 * over experts with an empty mask (no eligible rank) through *orphan. */
static int subset_sums(const uint8_t *placement, const int64_t *w, int E, int P,
                       int64_t *sub, int64_t *orphan)
{
    const size_t S = (size_t)1 << P;
    memset(sub, 0, S * sizeof *sub);
    *orphan = 0;
    for (int e = 0; e < E; e++) {
        uint32_t m = 0;
        for (int p = 0; p < P; p++)
            if (placement[(size_t)e * P + p])
                m |= 1u << p;
        if (!m)
            *orphan += w[e];
        sub[m] += w[e];
    }
    for (int b = 0; b < P; b++)
        for (size_t m = 0; m < S; m++)
            if (m & ((size_t)1 << b))
                sub[m] += sub[m ^ ((size_t)1 << b)];
    return 0;
}

static int64_t ceil_div(int64_t a, int64_t b) /* b > 0 */
{
    return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}

int64_t lrmoe_minpeak_lb(const uint8_t *placement, const int64_t *need, int E, int P)
{
    if (P <= 0 || E <= 0)
        return lrmoe_err("min-peak bound: bad shape");
    if (P > LRMOE_PLAN_MAX_P)
        return lrmoe_plan_minpeak(placement, NULL, need, 0, E, P, -1, NULL, NULL);
    int64_t *sub = malloc(((size_t)1 << P) * sizeof *sub), orphan;
    if (!sub)
        return lrmoe_err("min-peak bound: out of memory");
    subset_sums(placement, need, E, P, sub, &orphan);
    if (orphan > 0) {
        free(sub);
        return lrmoe_err("min-peak bound: an expert with pairs has no eligible rank");
    }
    int64_t best = 0;
    for (size_t m = 1; m < ((size_t)1 << P); m++) {
        int64_t v = ceil_div(sub[m], __builtin_popcount((unsigned)m));
        if (v > best)
            best = v;
    }
    free(sub);
    return best;
}

int64_t lrmoe_minpeak_quota_lb(const uint8_t *placement, const int64_t *lo,
                               const int64_t *n, int64_t total, int E, int P)
{
    int64_t slo = 0, sn = 0;
    for (int e = 0; e < E; e++) {
        if (lo[e] < 0 || lo[e] > n[e])
            return lrmoe_err("quota bound: lo[%d] outside [0,n]", e);
        slo += lo[e];
        sn += n[e];
    }
    if (total < slo || total > sn)
        return lrmoe_err("quota bound: total %lld outside [%lld,%lld]", (long long)total,
                         (long long)slo, (long long)sn);
    if (P > LRMOE_PLAN_MAX_P)
        return lrmoe_plan_minpeak(placement, lo, n, total, E, P, -1, NULL, NULL);
    const size_t S = (size_t)1 << P;
    int64_t *a = malloc(S * sizeof *a), *b = malloc(S * sizeof *b), oa, ob;
    if (!a || !b) {
        free(a);
        free(b);
        return lrmoe_err("quota bound: out of memory");
    }
    subset_sums(placement, lo, E, P, a, &oa);
    subset_sums(placement, n, E, P, b, &ob);
    int64_t best = 0;
    /* lower bounds must fit, and experts without ranks cannot retain */
    if (oa > 0 || total > sn - ob)
        best = -1;
    for (size_t m = 1; best >= 0 && m < S; m++) {
        int64_t k = __builtin_popcount((unsigned)m);
        int64_t v1 = ceil_div(a[m], k);
        int64_t v2 = ceil_div(total - sn + b[m], k);
        if (v1 > best)
            best = v1;
        if (v2 > best)
            best = v2;
    }
    free(a);
    free(b);
    if (best < 0)
        return lrmoe_err("quota bound: pairs of an expert without eligible rank");
    return best;
}

/* ---------------------------------------------------------------- Dinic */

typedef struct {
    int n, m, cap_e;
    int *head, *nxt, *to, *level, *it, *queue;
    int64_t *cap;
} flow_t;

static void flow_free(flow_t *g)
{
    free(g->head); free(g->nxt); free(g->to); free(g->level); free(g->it);
    free(g->queue); free(g->cap);
    memset(g, 0, sizeof *g);
}

static int flow_init(flow_t *g, int n, int max_edges)
{
    memset(g, 0, sizeof *g);
    g->n = n;
    g->cap_e = 2 * max_edges;
    g->head = malloc((size_t)n * sizeof(int));
    g->level = malloc((size_t)n * sizeof(int));
    g->it = malloc((size_t)n * sizeof(int));
    g->queue = malloc((size_t)n * sizeof(int));
    g->nxt = malloc((size_t)g->cap_e * sizeof(int));
    g->to = malloc((size_t)g->cap_e * sizeof(int));
    g->cap = malloc((size_t)g->cap_e * sizeof(int64_t));
    if (!g->head || !g->level || !g->it || !g->queue || !g->nxt || !g->to || !g->cap) {
        flow_free(g);
        return lrmoe_err("max-flow: out of memory");
    }
    for (int i = 0; i < n; i++)
        g->head[i] = -1;
    return 0;
}

static int flow_edge(flow_t *g, int u, int v, int64_t c)
{
    int e = g->m;
    g->to[e] = v; g->cap[e] = c; g->nxt[e] = g->head[u]; g->head[u] = e;
    g->to[e + 1] = u; g->cap[e + 1] = 0; g->nxt[e + 1] = g->head[v]; g->head[v] = e + 1;
    g->m += 2;
    return e;
}

/* Levels from s; it stops once t has one: every node of a lower level has
 * its level by then (BFS order), and a node left without one could only lie
 * at t's level or beyond, a dead end for the level graph's paths to t. So
 * the blocking flow that follows finds the same paths. */
static int flow_bfs(flow_t *g, int s, int t)
{
    for (int i = 0; i < g->n; i++)
        g->level[i] = -1;
    int qh = 0, qt = 0;
    g->level[s] = 0;
    g->queue[qt++] = s;
    while (qh < qt) {
        int u = g->queue[qh++];
        for (int e = g->head[u]; e >= 0; e = g->nxt[e])
            if (g->cap[e] > 0 && g->level[g->to[e]] < 0) {
                g->level[g->to[e]] = g->level[u] + 1;
                if (g->to[e] == t)
                    return 1;
                g->queue[qt++] = g->to[e];
            }
    }
    return 0;
}

static int64_t flow_dfs(flow_t *g, int u, int t, int64_t f)
{
    if (u == t)
        return f;
    for (; g->it[u] >= 0; g->it[u] = g->nxt[g->it[u]]) {
        int e = g->it[u], v = g->to[e];
        if (g->cap[e] > 0 && g->level[v] == g->level[u] + 1) {
            int64_t d = flow_dfs(g, v, t, f < g->cap[e] ? f : g->cap[e]);
            if (d > 0) {
                g->cap[e] -= d;
                g->cap[e ^ 1] += d;
                return d;
            }
        }
    }
    return 0;
}

static int64_t flow_max(flow_t *g, int s, int t)
{
    int64_t tot = 0;
    while (flow_bfs(g, s, t)) {
        for (int i = 0; i < g->n; i++)
            g->it[i] = g->head[i];
        int64_t f;
        while ((f = flow_dfs(g, s, t, INT64_MAX)) > 0)
            tot += f;
    }
    return tot;
}

/* Max flow from the current one, at most limit more units. */
static int64_t flow_max_upto(flow_t *g, int s, int t, int64_t limit)
{
    int64_t tot = 0;
    while (tot < limit && flow_bfs(g, s, t)) {
        for (int i = 0; i < g->n; i++)
            g->it[i] = g->head[i];
        int64_t f;
        while (tot < limit && (f = flow_dfs(g, s, t, limit - tot)) > 0)
            tot += f;
    }
    return tot;
}

/* Push d along s -> e -> p -> t (arcs se, ep, pt). */
static void flow_push3(flow_t *g, int se, int ep, int pt, int64_t d)
{
    g->cap[se] -= d; g->cap[se ^ 1] += d;
    g->cap[ep] -= d; g->cap[ep ^ 1] += d;
    g->cap[pt] -= d; g->cap[pt ^ 1] += d;
}

/* ------------------------------------------------- min-peak search (any P) */

/* The exact optimum by a parametric max-flow search, for P above
 * LRMOE_PLAN_MAX_P (and whenever a witness subset is wanted).
 *
 * Cheap bound first: LB0 = the bound of the whole rank set and of every
 * single rank (for fixed needs max(ceil(N/P), max_p load of the experts whose
 * only eligible rank is p)). When the caller knows a feasible allocation
 * whose peak ub equals LB0, T* = LB0 and nothing else runs.
 *
 * Otherwise, starting at T = LB0: max-flow on the network source -> expert
 * (cap need) -> eligible rank -> sink (cap T). If not every pair routes, the
 * ranks R reachable from the source in the residual network form a violated
 * subset: every reachable expert has all its eligible ranks in R, so the
 * cut N - N_reach + T|R| < N gives N(R) > T|R| and ceil(N(R)/|R|) is a
 * lower bound above T. T rises to it and the search continues from the
 * current flow (raising the sink capacities keeps it feasible); a T where
 * every pair routes is feasible, hence T*. Each step raises T strictly to a
 * valid bound (Dinkelbach's ratio iteration), so a handful of steps suffice,
 * each an incremental Dinic. With free quotas the same holds for the two
 * families of the closed form: the floors lo must route (ceil(Lo(R)/|R|)),
 * and at least total of the loads n must (ceil((total - N + n(R))/|R|)). */

/* The nonzero entries of the placement pl (n entries): zero 8-byte words
 * skipped (plans are sparse). */
static int pl_count(const uint8_t *pl, size_t n)
{
    int nnz = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, pl + i, sizeof w);
        if (w)
            for (int k = 0; k < 8; k++)
                nnz += pl[i + k] != 0;
    }
    for (; i < n; i++)
        nnz += pl[i] != 0;
    return nnz;
}

/* The next rank from p (inclusive) where row (P entries) holds an
 * instance, or P: aligned zero 8-byte words skipped. */
static int pl_next(const uint8_t *row, int p, int P)
{
    while (p < P) {
        uint64_t w;
        if (!(p & 7) && p + 8 <= P && (memcpy(&w, row + p, sizeof w), !w)) {
            p += 8;
            continue;
        }
        if (row[p])
            return p;
        p++;
    }
    return P;
}

/* Eligible ranks of each expert as lists (CSR). */
static int elig_lists(const uint8_t *pl, int E, int P, int **eoff, int **elist)
{
    const int nnz = pl_count(pl, (size_t)E * P);
    *eoff = malloc(((size_t)E + 1) * sizeof(int));
    *elist = malloc(((size_t)nnz + 1) * sizeof(int));
    if (!*eoff || !*elist) {
        free(*eoff);
        free(*elist);
        return lrmoe_err("min-peak search: out of memory");
    }
    int k = 0;
    for (int e = 0; e < E; e++) {
        (*eoff)[e] = k;
        const uint8_t *row = pl + (size_t)e * P;
        for (int p = pl_next(row, 0, P); p < P; p = pl_next(row, p + 1, P))
            (*elist)[k++] = p;
    }
    (*eoff)[E] = k;
    return 0;
}

/* The search's network (the Dinic network above): source -> expert e (cap
 * c[e], experts with c[e] > 0) -> its eligible ranks (eoff, elist) -> sink,
 * the sink arcs first (rank p's at 2p) at cap T, with a greedy start (each
 * expert fills its ranks in order); *flow: what the start routes. */
static int search_net(flow_t *g, const int64_t *c, const int *eoff, const int *elist, int E,
                      int P, int64_t T, int64_t *flow)
{
    int arcs = P;
    for (int e = 0; e < E; e++)
        if (c[e] > 0)
            arcs += 1 + eoff[e + 1] - eoff[e];
    if (flow_init(g, E + P + 2, arcs) < 0)
        return lrmoe_err("min-peak search: out of memory");
    const int t = E + P + 1;
    for (int p = 0; p < P; p++)
        flow_edge(g, 1 + E + p, t, T);
    *flow = 0;
    for (int e = 0; e < E; e++) {
        if (c[e] <= 0)
            continue;
        const int se = flow_edge(g, 0, 1 + e, c[e]);
        int64_t rem = c[e];
        for (int k = eoff[e]; k < eoff[e + 1]; k++) {
            const int p = elist[k], pt = 2 * p;
            const int ep = flow_edge(g, 1 + e, 1 + E + p, c[e]);
            const int64_t d = rem < g->cap[pt] ? rem : g->cap[pt];
            if (d > 0) {
                flow_push3(g, se, ep, pt, d);
                rem -= d;
                *flow += d;
            }
        }
    }
    return 0;
}

/* Raise the search network's sink caps from T to T2 (the flow stays
 * feasible) and route what more it can; *flow grows by that. Afterwards
 * level[] >= 0 marks the nodes reachable from the source in the residual
 * network (flow_max's last BFS, which did not reach the sink). The search
 * reads only the flow's value and that set, and both are the same for
 * every maximum flow (the set is the source side of the least minimum
 * cut), so its T* and witness do not depend on how Dinic routes: this was
 * a second Dinic with multi-push blocking flows, with the same results and
 * speed (tests/unit/plan_test fastpath 2000 3: 1.34 s both). */
static void search_net_at(flow_t *g, int P, int64_t T, int64_t T2, int64_t *flow)
{
    for (int p = 0; p < P; p++)
        g->cap[2 * p] += T2 - T;
    *flow += flow_max(g, 0, g->n - 1);
}

int64_t lrmoe_plan_minpeak(const uint8_t *pl, const int64_t *lo, const int64_t *n, int64_t total,
                     int E, int P, int64_t ub, uint8_t *witness, int *how)
{
    if (P <= 0 || E <= 0)
        return lrmoe_err("min-peak bound: bad shape");
    int *eoff = NULL, *elist = NULL;
    int64_t *s1 = calloc((size_t)P, sizeof *s1), *l1 = calloc((size_t)P, sizeof *l1);
    int64_t rc = -1;
    /* the floors' network (free quotas) and the loads' */
    flow_t A, B;
    int64_t Aflow = 0, Bflow = 0, Anet_T = 0, Bnet_T = 0;
    memset(&A, 0, sizeof A);
    memset(&B, 0, sizeof B);
    if (how)
        *how = 0;
    if (!s1 || !l1 || elig_lists(pl, E, P, &eoff, &elist) < 0) {
        lrmoe_err("min-peak search: out of memory");
        goto out;
    }
    /* totals, orphans, single-rank experts */
    int64_t N = 0, slo = 0, on = 0, ol = 0;
    for (int e = 0; e < E; e++) {
        const int64_t l = lo ? lo[e] : 0;
        if (n[e] < 0 || (lo && (l < 0 || l > n[e]))) {
            lrmoe_err("min-peak bound: need of expert %d is negative or lo outside [0,n]", e);
            goto out;
        }
        N += n[e];
        slo += l;
        const int k = eoff[e + 1] - eoff[e];
        if (k == 0) {
            on += n[e];
            ol += l;
        } else if (k == 1) {
            s1[elist[eoff[e]]] += n[e];
            l1[elist[eoff[e]]] += l;
        }
    }
    if (!lo)
        total = N;
    if (lo && (total < slo || total > N)) {
        lrmoe_err("quota bound: total %lld outside [%lld,%lld]", (long long)total,
                  (long long)slo, (long long)N);
        goto out;
    }
    if (lo ? (ol > 0 || total > N - on) : on > 0) {
        lrmoe_err(lo ? "quota bound: pairs of an expert without eligible rank"
                     : "min-peak bound: an expert with pairs has no eligible rank");
        goto out;
    }
    /* LB0: the whole rank set and every single rank */
    int64_t T = ceil_div(total, P);
    int wrank = -1; /* witness: -1 all ranks, else one rank */
    for (int p = 0; p < P; p++) {
        int64_t v = lo ? l1[p] : s1[p];
        if (lo && total - N + on + s1[p] > v)
            v = total - N + on + s1[p];
        if (v > T) {
            T = v;
            wrank = p;
        }
    }
    if (witness)
        for (int p = 0; p < P; p++)
            witness[p] = wrank < 0 || p == wrank;
    if (ub >= 0 && T >= ub) {
        rc = T; /* LB0 <= T* <= ub */
        if (how)
            *how = 1;
        goto out;
    }
    if (P <= LRMOE_PLAN_MAX_P && !witness) {
        if (how)
            *how = 2;
        rc = lo ? lrmoe_minpeak_quota_lb(pl, lo, n, total, E, P) : lrmoe_minpeak_lb(pl, n, E, P);
        goto out;
    }
    if (how)
        *how = 3;
    if ((lo && search_net(&A, lo, eoff, elist, E, P, T, &Aflow) < 0) ||
        search_net(&B, n, eoff, elist, E, P, T, &Bflow) < 0)
        goto out;
    Anet_T = Bnet_T = T;
    for (;;) {
        flow_t *g = NULL;
        int fam = 0; /* 0: the needs (or floors) exceed T|R|; 1: total - N + n(R) does */
        if (lo) {
            search_net_at(&A, P, Anet_T, T, &Aflow);
            Anet_T = T;
            if (Aflow < slo)
                g = &A;
        }
        if (!g) {
            search_net_at(&B, P, Bnet_T, T, &Bflow);
            Bnet_T = T;
            if (Bflow < total) {
                g = &B;
                fam = lo != NULL;
            }
        }
        if (!g) {
            rc = T; /* every pair routes at T, and T is a lower bound */
            break;
        }
        /* the violated subset R: ranks reachable in the residual network */
        int64_t k = 0, w = 0;
        for (int p = 0; p < P; p++)
            k += g->level[1 + E + p] >= 0;
        const int64_t *c = g == &A ? lo : n;
        for (int e = 0; e < E; e++) {
            int in = 1;
            for (int j = eoff[e]; in && j < eoff[e + 1]; j++)
                in = g->level[1 + E + elist[j]] >= 0;
            if (in)
                w += c[e];
        }
        if (k == 0) {
            lrmoe_err("min-peak search: pairs cannot be routed at any peak");
            goto out;
        }
        int64_t nt = ceil_div(fam ? total - N + w : w, k);
        if (nt <= T) {
            lrmoe_err("min-peak search: no progress at T=%lld (internal error)", (long long)T);
            goto out;
        }
        T = nt;
        if (witness)
            for (int p = 0; p < P; p++)
                witness[p] = g->level[1 + E + p] >= 0;
        if (ub >= 0 && T >= ub) {
            rc = T;
            break;
        }
    }
out:
    flow_free(&A);
    flow_free(&B);
    free(s1);
    free(l1);
    free(eoff);
    free(elist);
    return rc;
}

int64_t lrmoe_alloc_flow_quota(const uint8_t *pl, const int64_t *lo, const int64_t *n,
                               int64_t total, const int64_t *pref, int E, int P, int64_t T,
                               int64_t *K, int64_t *x)
{
    flow_t g;
    const int nel = pl_count(pl, (size_t)E * P);
    int64_t slo = 0;
    for (int e = 0; e < E; e++) {
        if (lo[e] < 0 || lo[e] > n[e])
            return lrmoe_err("quota allocation: lower quota of expert %d outside [0,n]", e);
        slo += lo[e];
    }
    if (flow_init(&g, E + P + 2, E + P + nel) < 0)
        return -1;
    const int s = 0, t = E + P + 1;
    /* each expert's arcs to its ranks, ranks increasing (CSR: eoff, earc,
     * erank), for experts with pairs */
    int *sid = malloc((size_t)E * sizeof(int)), *eoff = malloc(((size_t)E + 1) * sizeof(int));
    int *earc = malloc(((size_t)nel + 1) * sizeof(int)), *erank = malloc(((size_t)nel + 1) * sizeof(int));
    int64_t rc = -1;
    if (!sid || !eoff || !earc || !erank) {
        lrmoe_err("quota allocation: out of memory");
        goto out;
    }
    for (int e = 0; e < E; e++)
        sid[e] = n[e] > 0 ? flow_edge(&g, s, 1 + e, lo[e]) : -1;
    int na = 0;
    for (int e = 0; e < E; e++) {
        const uint8_t *row = pl + (size_t)e * P;
        eoff[e] = na;
        for (int p = pl_next(row, 0, P); n[e] > 0 && p < P; p = pl_next(row, p + 1, P)) {
            earc[na] = flow_edge(&g, 1 + e, 1 + E + p, n[e]);
            erank[na++] = p;
        }
    }
    eoff[E] = na;
    const int pt0 = g.m;
    for (int p = 0; p < P; p++)
        flow_edge(&g, 1 + E + p, t, T);
    /* the floors first, greedily where pref lies, then by max-flow; then
     * the rest up to total (augmenting paths never lower a source arc's
     * flow, so the floors hold): a share of each expert's pref room in
     * proportion, what pref still has room for, and max-flow */
    int64_t f = 0, room = 0;
    for (int pass = 0; pass < 4; pass++) {
        if (pass == 2) {
            for (int e = 0; e < E; e++)
                if (sid[e] >= 0)
                    g.cap[sid[e]] += n[e] - lo[e];
            room = 0;
            for (int e = 0; pref && e < E; e++)
                for (int j = eoff[e]; j < eoff[e + 1]; j++) {
                    const size_t i = (size_t)e * P + erank[j];
                    if (pref[i] > g.cap[earc[j] ^ 1])
                        room += pref[i] - g.cap[earc[j] ^ 1];
                }
        }
        const int64_t want = pass < 2 ? slo : total;
        const double share = pass == 2 && room > 0 ? (double)(total - f) / (double)room : 1;
        for (int e = 0; pref && e < E && f < want; e++) {
            if (sid[e] < 0)
                continue;
            for (int j = eoff[e]; j < eoff[e + 1] && f < want && g.cap[sid[e]] > 0; j++) {
                const int p = erank[j], a = earc[j];
                const size_t i = (size_t)e * P + p;
                if (pref[i] <= g.cap[a ^ 1])
                    continue;
                int64_t d = pref[i] - g.cap[a ^ 1];
                if (share < 1)
                    d = (int64_t)((double)d * share);
                if (d > g.cap[sid[e]])
                    d = g.cap[sid[e]];
                if (d > g.cap[pt0 + 2 * p])
                    d = g.cap[pt0 + 2 * p];
                if (d > want - f)
                    d = want - f;
                if (d > 0) {
                    flow_push3(&g, sid[e], a, pt0 + 2 * p, d);
                    f += d;
                }
            }
        }
        if (pass == 1 || pass == 3)
            f += flow_max_upto(&g, s, t, want - f);
        if (pass == 1 && f != slo) {
            lrmoe_err("quota allocation: the floors do not route at peak %lld", (long long)T);
            goto out;
        }
    }
    if (f != total) {
        lrmoe_err("quota allocation: %lld of %lld retained pairs route at peak %lld",
                  (long long)f, (long long)total, (long long)T);
        goto out;
    }
    memset(K, 0, (size_t)E * sizeof *K);
    memset(x, 0, (size_t)E * P * sizeof *x);
    int64_t peak = 0;
    for (int e = 0; e < E; e++)
        for (int j = eoff[e]; j < eoff[e + 1]; j++) {
            x[(size_t)e * P + erank[j]] = g.cap[earc[j] ^ 1];
            K[e] += g.cap[earc[j] ^ 1];
        }
    for (int p = 0; p < P; p++)
        if (g.cap[pt0 + 2 * p + 1] > peak)
            peak = g.cap[pt0 + 2 * p + 1];
    rc = peak;
out:
    free(sid);
    free(eoff);
    free(earc);
    free(erank);
    flow_free(&g);
    return rc;
}

/* Bipartite network: source 0, experts 1..E, ranks E+1..E+P, sink E+P+1.
 * Returns the max flow with source caps srccap[e] and rank caps T; fills x
 * when non-NULL. */
static int64_t bip_flow(const uint8_t *pl, const int64_t *srccap, int E, int P, int64_t T,
                        int64_t *x)
{
    flow_t g;
    if (flow_init(&g, E + P + 2, E + P + pl_count(pl, (size_t)E * P)) < 0)
        return -1;
    const int s = 0, t = E + P + 1;
    for (int e = 0; e < E; e++)
        if (srccap[e] > 0)
            flow_edge(&g, s, 1 + e, srccap[e]);
    for (int e = 0; e < E; e++) {
        const uint8_t *row = pl + (size_t)e * P;
        for (int p = pl_next(row, 0, P); srccap[e] > 0 && p < P; p = pl_next(row, p + 1, P))
            flow_edge(&g, 1 + e, 1 + E + p, srccap[e]);
    }
    const int pt0 = g.m;
    for (int p = 0; p < P; p++)
        flow_edge(&g, 1 + E + p, t, T);
    /* greedy start: each expert fills its ranks in order; Dinic the rest */
    int64_t f = 0;
    for (int e = 0, se = 0; e < E; e++) {
        if (srccap[e] <= 0)
            continue;
        int64_t rem = srccap[e];
        for (int a = g.head[1 + e]; rem > 0 && a >= 0; a = g.nxt[a]) {
            const int v = g.to[a];
            if ((a & 1) || v <= E || v > E + P)
                continue; /* the reverse of the source arc */
            const int pt = pt0 + 2 * (v - 1 - E);
            int64_t d = rem < g.cap[pt] ? rem : g.cap[pt];
            if (d > 0 && g.cap[a] >= d) {
                flow_push3(&g, se, a, pt, d);
                rem -= d;
                f += d;
            }
        }
        se += 2;
    }
    f += flow_max(&g, s, t);
    if (x) { /* each expert's arcs to its ranks (even ids; odd: reverses) */
        memset(x, 0, (size_t)E * P * sizeof *x);
        for (int e = 0; e < E; e++)
            for (int a = g.head[1 + e]; a >= 0; a = g.nxt[a])
                if (!(a & 1) && g.to[a] > E && g.to[a] <= E + P)
                    x[(size_t)e * P + (g.to[a] - 1 - E)] = g.cap[a ^ 1];
    }
    flow_free(&g);
    return f;
}

/* An incremental routing network (see minpeak.h): the bipartite network
 * at sink caps T with the committed needs routed; a try raises the source
 * caps, routes greedily along each expert's arcs and then by max-flow, and
 * keeps the result only when everything routes (else the snapshot of the
 * capacities comes back). */
struct lrmoe_route_net {
    flow_t g;
    int E, P, pt0;
    int *sid, *eoff, *earc, *erank;
    int64_t *need, *save, flow, want;
};

void lrmoe_route_net_free(lrmoe_route_net_t *r)
{
    if (!r)
        return;
    flow_free(&r->g);
    free(r->sid);
    free(r->eoff);
    free(r->earc);
    free(r->erank);
    free(r->need);
    free(r->save);
    free(r);
}

lrmoe_route_net_t *lrmoe_route_net_new(const uint8_t *pl, int E, int P, int64_t T)
{
    lrmoe_route_net_t *r = calloc(1, sizeof *r);
    const int nel = pl_count(pl, (size_t)E * P);
    if (!r || flow_init(&r->g, E + P + 2, E + P + nel) < 0) {
        free(r);
        lrmoe_err("routing network: out of memory");
        return NULL;
    }
    r->E = E;
    r->P = P;
    r->sid = malloc((size_t)E * sizeof(int));
    r->eoff = malloc(((size_t)E + 1) * sizeof(int));
    r->earc = malloc(((size_t)nel + 1) * sizeof(int));
    r->erank = malloc(((size_t)nel + 1) * sizeof(int));
    r->need = calloc((size_t)E, sizeof *r->need);
    r->save = malloc((size_t)r->g.cap_e * sizeof *r->save);
    if (!r->sid || !r->eoff || !r->earc || !r->erank || !r->need || !r->save) {
        lrmoe_route_net_free(r);
        lrmoe_err("routing network: out of memory");
        return NULL;
    }
    const int s = 0, t = E + P + 1;
    for (int e = 0; e < E; e++)
        r->sid[e] = flow_edge(&r->g, s, 1 + e, 0);
    int k = 0;
    for (int e = 0; e < E; e++) {
        r->eoff[e] = k;
        const uint8_t *row = pl + (size_t)e * P;
        for (int p = pl_next(row, 0, P); p < P; p = pl_next(row, p + 1, P)) {
            r->earc[k] = flow_edge(&r->g, 1 + e, 1 + E + p, INT64_MAX / 4);
            r->erank[k++] = p;
        }
    }
    r->eoff[E] = k;
    r->pt0 = r->g.m;
    for (int p = 0; p < P; p++)
        flow_edge(&r->g, 1 + E + p, t, T);
    return r;
}

int lrmoe_route_net_try(lrmoe_route_net_t *r, const int64_t *need)
{
    flow_t *g = &r->g;
    const int E = r->E, P = r->P;
    int64_t add = 0;
    for (int e = 0; e < E; e++) {
        if (need[e] < r->need[e])
            return lrmoe_err("routing network: need of expert %d went down", e);
        add += need[e] - r->need[e];
    }
    memcpy(r->save, g->cap, (size_t)g->m * sizeof *g->cap);
    int64_t f = 0;
    for (int e = 0; e < E; e++) {
        int64_t d = need[e] - r->need[e];
        g->cap[r->sid[e]] += d;
        for (int j = r->eoff[e]; d > 0 && j < r->eoff[e + 1]; j++) {
            const int pt = r->pt0 + 2 * r->erank[j];
            const int64_t x = d < g->cap[pt] ? d : g->cap[pt];
            if (x > 0) {
                flow_push3(g, r->sid[e], r->earc[j], pt, x);
                d -= x;
                f += x;
            }
        }
    }
    if (f < add)
        f += flow_max_upto(g, 0, E + P + 1, add - f);
    if (f < add) {
        memcpy(g->cap, r->save, (size_t)g->m * sizeof *g->cap);
        return 0;
    }
    memcpy(r->need, need, (size_t)E * sizeof *need);
    return 1;
}

int lrmoe_flow_routes_x(const uint8_t *pl, const int64_t *need, int E, int P, int64_t T,
                        int64_t *x)
{
    int64_t sum = 0;
    for (int e = 0; e < E; e++)
        sum += need[e];
    if (sum > T * P)
        return 0;
    int64_t f = bip_flow(pl, need, E, P, T, x);
    return f < 0 ? -1 : f == sum;
}

int lrmoe_flow_routes(const uint8_t *pl, const int64_t *need, int E, int P, int64_t T)
{
    return lrmoe_flow_routes_x(pl, need, E, P, T, NULL);
}

int64_t lrmoe_minpeak_lb_flow(const uint8_t *pl, const int64_t *need, int E, int P)
{
    int64_t sum = 0;
    for (int e = 0; e < E; e++)
        sum += need[e];
    int64_t lo = 0, hi = sum;
    if (bip_flow(pl, need, E, P, hi, NULL) != sum)
        return lrmoe_err("min-peak bound: an expert with pairs has no eligible rank");
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int64_t f = bip_flow(pl, need, E, P, mid, NULL);
        if (f < 0)
            return -1;
        if (f == sum)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

int64_t lrmoe_minpeak_quota_lb_flow(const uint8_t *pl, const int64_t *lo_e, const int64_t *n,
                                    int64_t total, int E, int P)
{
    int64_t slo = 0, sn = 0;
    for (int e = 0; e < E; e++) {
        slo += lo_e[e];
        sn += n[e];
    }
    int64_t lo = 0, hi = sn;
    if (bip_flow(pl, lo_e, E, P, hi, NULL) != slo || bip_flow(pl, n, E, P, hi, NULL) < total)
        return lrmoe_err("quota bound: pairs of an expert without eligible rank");
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int64_t a = bip_flow(pl, lo_e, E, P, mid, NULL), b = bip_flow(pl, n, E, P, mid, NULL);
        if (a < 0 || b < 0)
            return -1;
        if (a == slo && b >= total)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

int64_t lrmoe_alloc_flow(const uint8_t *pl, const int64_t *need, int E, int P, int64_t *x)
{
    int64_t T = lrmoe_minpeak_lb(pl, need, E, P);
    if (T < 0)
        return -1;
    return lrmoe_alloc_flow_at(pl, need, E, P, T, x);
}

int64_t lrmoe_alloc_flow_at(const uint8_t *pl, const int64_t *need, int E, int P, int64_t T,
                            int64_t *x)
{
    int64_t sum = 0;
    for (int e = 0; e < E; e++)
        sum += need[e];
    int64_t f = bip_flow(pl, need, E, P, T, x);
    if (f < 0)
        return -1;
    if (f != sum)
        return lrmoe_err("max-flow: routed %lld of %lld pairs at the bound %lld", (long long)f,
                         (long long)sum, (long long)T);
    return T;
}

/* ---------------------------------------------------------------- GLPK */

typedef struct {
    int *ia, *ja;
    double *ar;
    int nnz, cap;
} triplets_t;

static int trip_add(triplets_t *t, int i, int j, double v)
{
    if (t->nnz + 1 >= t->cap) {
        int c = t->cap ? 2 * t->cap : 1024;
        int *ia = realloc(t->ia, (size_t)c * sizeof(int));
        if (ia)
            t->ia = ia;
        int *ja = realloc(t->ja, (size_t)c * sizeof(int));
        if (ja)
            t->ja = ja;
        double *ar = realloc(t->ar, (size_t)c * sizeof(double));
        if (ar)
            t->ar = ar;
        if (!ia || !ja || !ar)
            return lrmoe_err("GLPK: out of memory");
        t->cap = c;
    }
    t->nnz++;
    t->ia[t->nnz] = i;
    t->ja[t->nnz] = j;
    t->ar[t->nnz] = v;
    return 0;
}

static void trip_free(triplets_t *t)
{
    free(t->ia);
    free(t->ja);
    free(t->ar);
}

/* GLPK keeps an environment per thread (it makes one at its first call in a
 * thread): a thread-specific key frees it when the thread ends, so callers
 * need not call lrmoe_minpeak_thread_cleanup (lrmoe_plan_thread_cleanup). */
static pthread_key_t glpk_key;
static pthread_once_t glpk_once = PTHREAD_ONCE_INIT;
static int glpk_key_ok;
static _Thread_local int glpk_noted;

static void glpk_exit(void *unused)
{
    (void)unused;
    glp_free_env();
}

static void glpk_key_make(void)
{
    glpk_key_ok = pthread_key_create(&glpk_key, glpk_exit) == 0;
}

static void glpk_thread_note(void)
{
    if (glpk_noted) return;
    pthread_once(&glpk_once, glpk_key_make);
    if (glpk_key_ok) pthread_setspecific(glpk_key, &glpk_noted);
    glpk_noted = 1;
}

/* Solve the loaded MIP to proven optimality within tm_lim seconds: 0, or
 * -1 naming why not (time limit, infeasible, GLPK's failure). */
static int glpk_optimise(glp_prob *lp, double tm_lim)
{
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_ON;
    parm.msg_lev = GLP_MSG_OFF;
    double ms = tm_lim * 1000.0;
    parm.tm_lim = ms > 2e9 ? 2000000000 : (int)ms;
    int ret = glp_intopt(lp, &parm);
    int st = glp_mip_status(lp);
    if (ret == GLP_ETMLIM || (ret == 0 && st == GLP_FEAS))
        return lrmoe_err("GLPK: time limit %.3g s reached before proving optimality", tm_lim);
    if (ret == GLP_ENOPFS || ret == GLP_ENODFS || st == GLP_NOFEAS)
        return lrmoe_err("GLPK: allocation problem has no feasible solution");
    if (ret != 0 || st != GLP_OPT)
        return lrmoe_err("GLPK: glp_intopt failed (return %d, status %d)", ret, st);
    return 0;
}

/* Shared model: columns x_ep for eligible (e,p) with n[e] > 0, then T.
 * Experts: fixed row sum need[e] (lo == NULL) or lo[e] <= K_e <= n[e] with
 * sum K_e = total. Objective: T, minus (quota mode, pref given) a tie-break
 * below 0.4 in total that prefers x where pref is large; T stays optimal. */
static int64_t glpk_solve(const uint8_t *pl, const int64_t *lo, const int64_t *n,
                          int64_t total, const int64_t *pref, int E, int P, double tm_lim,
                          int64_t *K, int64_t *x)
{
    const int quota = lo != NULL;
    int64_t sum = 0;
    int ncol = 0;
    for (int e = 0; e < E; e++) {
        int cnt = 0;
        for (int p = 0; p < P; p++)
            cnt += pl[(size_t)e * P + p] != 0;
        if (n[e] < 0)
            return lrmoe_err("GLPK: negative row total for expert %d", e);
        if (n[e] > 0 && !cnt && (!quota || lo[e] > 0))
            return lrmoe_err("GLPK: expert %d has pairs and no eligible rank", e);
        sum += n[e];
        if (n[e] > 0)
            ncol += cnt;
    }
    if (!quota)
        total = sum;
    /* columns 1..ncol: eligible (e,p) with n[e] > 0 in row-major order, so
     * an expert's columns are consecutive; cexp/crank name them, rstart and
     * rlist list each rank's columns in increasing order (counting sort) */
    int *cexp = malloc(((size_t)ncol + 1) * sizeof(int));
    int *crank = malloc(((size_t)ncol + 1) * sizeof(int));
    int *rstart = calloc((size_t)P + 1, sizeof(int));
    int *rlist = malloc(((size_t)ncol + 1) * sizeof(int));
    int64_t *rs = calloc((size_t)P, sizeof *rs);
    triplets_t tr = {0};
    glp_prob *lp = NULL;
    int64_t rc = -1;
    if (!cexp || !crank || !rstart || !rlist || !rs) {
        lrmoe_err("GLPK: out of memory");
        goto out;
    }
    int c = 0;
    for (int e = 0; e < E; e++) {
        if (n[e] <= 0)
            continue;
        for (int p = 0; p < P; p++)
            if (pl[(size_t)e * P + p]) {
                ++c;
                cexp[c] = e;
                crank[c] = p;
                rstart[p + 1]++;
            }
    }
    for (int p = 0; p < P; p++)
        rstart[p + 1] += rstart[p];
    for (int j = 1; j <= ncol; j++)
        rlist[rstart[crank[j]]++] = j;
    for (int p = P; p > 0; p--)
        rstart[p] = rstart[p - 1];
    rstart[0] = 0;
    /* the whole matrix in one allocation: expert rows, quota row, ranks */
    tr.cap = 2 * ncol + (quota ? ncol : 0) + P + 2;
    tr.ia = malloc((size_t)tr.cap * sizeof(int));
    tr.ja = malloc((size_t)tr.cap * sizeof(int));
    tr.ar = malloc((size_t)tr.cap * sizeof(double));
    if (!tr.ia || !tr.ja || !tr.ar) {
        lrmoe_err("GLPK: out of memory");
        goto out;
    }
    glpk_thread_note();
    glp_term_out(GLP_OFF);
    lp = glp_create_prob();
    glp_set_obj_dir(lp, GLP_MIN);
    const int cT = ncol + 1;
    glp_add_cols(lp, ncol + 1);
    const double eps = 0.4 / ((double)total + 1.0);
    for (int j = 1; j <= ncol; j++) {
        const int e = cexp[j];
        glp_set_col_kind(lp, j, GLP_IV);
        glp_set_col_bnds(lp, j, GLP_DB, 0.0, (double)n[e]);
        if (quota && pref && n[e] > 0)
            glp_set_obj_coef(lp, j, -eps * (double)pref[(size_t)e * P + crank[j]] / (double)n[e]);
    }
    glp_set_col_kind(lp, cT, GLP_IV);
    glp_set_col_bnds(lp, cT, GLP_LO, 0.0, 0.0);
    glp_set_obj_coef(lp, cT, 1.0);
    int row = 0;
    for (int j = 1; j <= ncol;) {
        /* expert e = cexp[j] owns columns j..; lo = 0 experts without a
         * rank have no column and no row (quota mode: K_e = 0) */
        const int e = cexp[j];
        row = glp_add_rows(lp, 1);
        if (!quota || lo[e] == n[e])
            glp_set_row_bnds(lp, row, GLP_FX, (double)n[e], (double)n[e]);
        else
            glp_set_row_bnds(lp, row, GLP_DB, (double)lo[e], (double)n[e]);
        for (; j <= ncol && cexp[j] == e; j++)
            if (trip_add(&tr, row, j, 1.0) < 0)
                goto out;
    }
    if (quota) {
        row = glp_add_rows(lp, 1);
        glp_set_row_bnds(lp, row, GLP_FX, (double)total, (double)total);
        for (int j = 1; j <= ncol; j++)
            if (trip_add(&tr, row, j, 1.0) < 0)
                goto out;
    }
    for (int p = 0; p < P; p++) {
        row = glp_add_rows(lp, 1);
        glp_set_row_bnds(lp, row, GLP_UP, 0.0, 0.0);
        for (int k = rstart[p]; k < rstart[p + 1]; k++)
            if (trip_add(&tr, row, rlist[k], 1.0) < 0)
                goto out;
        if (trip_add(&tr, row, cT, -1.0) < 0)
            goto out;
    }
    glp_load_matrix(lp, tr.nnz, tr.ia, tr.ja, tr.ar);
    if (glpk_optimise(lp, tm_lim) < 0)
        goto out;
    memset(x, 0, (size_t)E * P * sizeof *x);
    if (K)
        memset(K, 0, (size_t)E * sizeof *K);
    for (int j = 1; j <= ncol; j++) {
        const int64_t v = (int64_t)llround(glp_mip_col_val(lp, j));
        x[(size_t)cexp[j] * P + crank[j]] = v;
        if (K)
            K[cexp[j]] += v;
        rs[crank[j]] += v;
    }
    int64_t peak = 0;
    for (int p = 0; p < P; p++)
        if (rs[p] > peak)
            peak = rs[p];
    rc = peak;
out:
    if (lp)
        glp_delete_prob(lp);
    trip_free(&tr);
    free(cexp);
    free(crank);
    free(rstart);
    free(rlist);
    free(rs);
    return rc;
}

void lrmoe_minpeak_thread_cleanup(void)
{
    glp_free_env();
}


int64_t lrmoe_alloc_glpk(const uint8_t *placement, const int64_t *need, int E, int P,
                         double tm_lim, int64_t *x)
{
    return glpk_solve(placement, NULL, need, 0, NULL, E, P, tm_lim, NULL, x);
}

int64_t lrmoe_alloc_glpk_quota(const uint8_t *placement, const int64_t *lo, const int64_t *n,
                               int64_t total, const int64_t *pref, int E, int P,
                               double tm_lim, int64_t *K, int64_t *x)
{
    int64_t slo = 0, sn = 0;
    for (int e = 0; e < E; e++) {
        if (lo[e] < 0 || lo[e] > n[e])
            return lrmoe_err("GLPK: lower quota of expert %d outside [0,n]", e);
        slo += lo[e];
        sn += n[e];
    }
    if (total < slo || total > sn)
        return lrmoe_err("GLPK: retained total %lld outside [%lld,%lld]", (long long)total,
                         (long long)slo, (long long)sn);
    return glpk_solve(placement, lo, n, total, pref, E, P, tm_lim, K, x);
}

