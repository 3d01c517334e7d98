/* DeepSeek EPLB (github.com/deepseek-ai/EPLB, eplb.py) in C: redundant
 * experts by greedy replication (the expert with the highest load per
 * replica gets the next slot, first index on ties), balanced packing with an
 * equal item count per pack (items by decreasing weight, stable; each to the
 * lightest pack with room, first index on ties), hierarchical over nodes.
 * Arithmetic is float32 as in the reference (weight.float()). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "plan_internal.h"

/* weight is (rows,n); pack_index, rank_in_pack are (rows,n). */
static void balanced_packing(const float *weight, int rows, int n, int packs, int *pack_index,
                             int *rank_in_pack, int *idx, float *pw, int *pi)
{
    const int per = n / packs;
    for (int r = 0; r < rows; r++) {
        const float *w = weight + (size_t)r * n;
        int *pidx = pack_index + (size_t)r * n, *prk = rank_in_pack + (size_t)r * n;
        if (per == 1) {
            for (int i = 0; i < n; i++) {
                pidx[i] = i;
                prk[i] = 0;
            }
            continue;
        }
        /* stable sort by decreasing weight (insertion sort: n is small) */
        for (int i = 0; i < n; i++) {
            int j = i;
            while (j > 0 && w[idx[j - 1]] < w[i]) {
                idx[j] = idx[j - 1];
                j--;
            }
            idx[j] = i;
        }
        for (int k = 0; k < packs; k++) {
            pw[k] = 0;
            pi[k] = 0;
        }
        for (int i = 0; i < n; i++) {
            int g = idx[i], best = -1;
            for (int k = 0; k < packs; k++)
                if (pi[k] < per && (best < 0 || pw[k] < pw[best]))
                    best = k;
            pidx[g] = best;
            prk[g] = pi[best];
            pw[best] += w[g];
            pi[best]++;
        }
    }
}

/* weight (rows,nlog) -> phy2log, rank (rows,nphy), logcnt (rows,nlog). */
static void replicate_experts(const float *weight, int rows, int nlog, int nphy, int *phy2log,
                              int *rank, int *logcnt)
{
    for (int r = 0; r < rows; r++) {
        const float *w = weight + (size_t)r * nlog;
        int *p2l = phy2log + (size_t)r * nphy, *rk = rank + (size_t)r * nphy;
        int *cnt = logcnt + (size_t)r * nlog;
        for (int i = 0; i < nphy; i++) {
            p2l[i] = i < nlog ? i : 0;
            rk[i] = 0;
        }
        for (int i = 0; i < nlog; i++)
            cnt[i] = 1;
        for (int i = nlog; i < nphy; i++) {
            int best = 0;
            float bv = w[0] / (float)cnt[0];
            for (int j = 1; j < nlog; j++) {
                float v = w[j] / (float)cnt[j];
                if (v > bv) {
                    bv = v;
                    best = j;
                }
            }
            p2l[i] = best;
            rk[i] = cnt[best];
            cnt[best]++;
        }
    }
}

int lrmoe_eplb_rebalance(const double *weight_in, int L, int E, int num_phy, int groups,
                         int nodes, int gpus, int *out_phy2log, int *out_phyrank,
                         int *out_logcnt)
{
    if (L <= 0 || E <= 0 || groups <= 0 || nodes <= 0 || gpus <= 0)
        return lrmoe_err("eplb: bad sizes");
    if (groups % nodes) { /* global policy */
        groups = 1;
        nodes = 1;
    }
    if (E % groups)
        return lrmoe_err("eplb: %d groups do not divide %d experts", groups, E);
    if (gpus % nodes)
        return lrmoe_err("eplb: %d nodes do not divide %d gpus", nodes, gpus);
    if (num_phy < E || num_phy % gpus)
        return lrmoe_err("eplb: %d physical slots: need >= %d experts and a multiple of %d gpus",
                         num_phy, E, gpus);
    const int gsize = E / groups, gpn = groups / nodes, lpn = E / nodes;
    const int ppn = num_phy / nodes, ppg = num_phy / gpus, gpus_pn = gpus / nodes;
    const int R = L * nodes;
    int nmax = E > num_phy ? E : num_phy;
    float *w = malloc((size_t)L * E * sizeof *w);
    float *tpg = malloc((size_t)L * groups * sizeof *tpg);
    int *gpi = malloc((size_t)L * groups * sizeof *gpi), *grk = malloc((size_t)L * groups * sizeof *grk);
    int *log2mlog = malloc((size_t)L * E * sizeof(int)), *mlog2log = malloc((size_t)L * E * sizeof(int));
    float *tpm = malloc((size_t)L * E * sizeof *tpm);
    int *phy2mlog = malloc((size_t)R * ppn * sizeof(int)), *phyrank = malloc((size_t)R * ppn * sizeof(int));
    int *mlogcnt = malloc((size_t)L * E * sizeof(int));
    float *tpp = malloc((size_t)R * ppn * sizeof *tpp);
    int *pk = malloc((size_t)R * ppn * sizeof(int)), *rip = malloc((size_t)R * ppn * sizeof(int));
    int *pphy2phy = malloc((size_t)R * ppn * sizeof(int));
    int *idx = malloc((size_t)nmax * sizeof(int)), *pi = malloc((size_t)nmax * sizeof(int));
    float *pw = malloc((size_t)nmax * sizeof(float));
    int rc = 0;
    if (!w || !tpg || !gpi || !grk || !log2mlog || !mlog2log || !tpm || !phy2mlog || !phyrank ||
        !mlogcnt || !tpp || !pk || !rip || !pphy2phy || !idx || !pi || !pw) {
        rc = lrmoe_err("eplb: out of memory");
        goto out;
    }
    for (size_t i = 0; i < (size_t)L * E; i++)
        w[i] = (float)weight_in[i];
    /* step 1: pack groups to nodes */
    for (int l = 0; l < L; l++)
        for (int g = 0; g < groups; g++) {
            float s = 0;
            for (int j = 0; j < gsize; j++)
                s += w[(size_t)l * E + g * gsize + j];
            tpg[(size_t)l * groups + g] = s;
        }
    balanced_packing(tpg, L, groups, nodes, gpi, grk, idx, pw, pi);
    for (int l = 0; l < L; l++) {
        for (int g = 0; g < groups; g++)
            for (int j = 0; j < gsize; j++) {
                int m = (gpi[(size_t)l * groups + g] * gpn + grk[(size_t)l * groups + g]) * gsize + j;
                log2mlog[(size_t)l * E + g * gsize + j] = m;
            }
        for (int e = 0; e < E; e++)
            mlog2log[(size_t)l * E + log2mlog[(size_t)l * E + e]] = e;
    }
    /* step 2: replicate within nodes; rows are (layer, node) */
    for (int l = 0; l < L; l++)
        for (int i = 0; i < E; i++)
            tpm[(size_t)l * E + i] = w[(size_t)l * E + mlog2log[(size_t)l * E + i]];
    replicate_experts(tpm, R, lpn, ppn, phy2mlog, phyrank, mlogcnt);
    /* step 3: pack physical experts to GPUs */
    for (int r = 0; r < R; r++)
        for (int i = 0; i < ppn; i++) {
            int m = phy2mlog[(size_t)r * ppn + i];
            tpp[(size_t)r * ppn + i] = tpm[(size_t)r * lpn + m] / (float)mlogcnt[(size_t)r * lpn + m];
        }
    balanced_packing(tpp, R, ppn, gpus_pn, pk, rip, idx, pw, pi);
    for (int r = 0; r < R; r++)
        for (int i = 0; i < ppn; i++) {
            int pp = pk[(size_t)r * ppn + i] * ppg + rip[(size_t)r * ppn + i];
            pphy2phy[(size_t)r * ppn + pp] = i;
        }
    for (int l = 0; l < L; l++)
        for (int nd = 0; nd < nodes; nd++) {
            int r = l * nodes + nd;
            for (int j = 0; j < ppn; j++) {
                int phy = pphy2phy[(size_t)r * ppn + j];
                int mlog = phy2mlog[(size_t)r * ppn + phy] + nd * lpn;
                out_phy2log[(size_t)l * num_phy + nd * ppn + j] = mlog2log[(size_t)l * E + mlog];
                if (out_phyrank)
                    out_phyrank[(size_t)l * num_phy + nd * ppn + j] = phyrank[(size_t)r * ppn + phy];
            }
        }
    if (out_logcnt)
        for (int l = 0; l < L; l++)
            for (int e = 0; e < E; e++)
                out_logcnt[(size_t)l * E + e] = mlogcnt[(size_t)l * E + log2mlog[(size_t)l * E + e]];
out:
    free(w); free(tpg); free(gpi); free(grk); free(log2mlog); free(mlog2log); free(tpm);
    free(phy2mlog); free(phyrank); free(mlogcnt); free(tpp); free(pk); free(rip);
    free(pphy2phy); free(idx); free(pi); free(pw);
    return rc;
}

/* ------------------------------------------------------------ layouts */

void lrmoe_eplb_layout_free(lrmoe_eplb_layout_t *l)
{
    free(l->phy2log);
    free(l->phyrank);
    free(l->logcnt);
    free(l->moved);
    memset(l, 0, sizeof *l);
}

static int eplb_slots(const lrmoe_plan_opts_t *o, int E)
{
    return o->slots ? o->slots : E / o->P + 2;
}

int lrmoe_eplb_layout_make(const lrmoe_plan_opts_t *o, const int64_t *load, int E,
                           const lrmoe_eplb_layout_t *prev, lrmoe_eplb_layout_t *out)
{
    const int P = o->P, per = E / P, slots = eplb_slots(o, E), nphy = slots * P;
    const int groups = o->groups ? o->groups : o->nodes;
    if (out->E != E || out->P != P || out->slots != slots || !out->phy2log) {
        lrmoe_eplb_layout_free(out);
        out->phy2log = malloc((size_t)nphy * sizeof(int));
        out->phyrank = malloc((size_t)nphy * sizeof(int));
        out->logcnt = malloc((size_t)E * sizeof(int));
        out->moved = malloc((size_t)nphy);
        if (!out->phy2log || !out->phyrank || !out->logcnt || !out->moved) {
            lrmoe_eplb_layout_free(out);
            return lrmoe_err("eplb: out of memory");
        }
        out->E = E;
        out->P = P;
        out->slots = slots;
    }
    double *w = malloc((size_t)E * sizeof *w);
    if (!w)
        return lrmoe_err("eplb: out of memory");
    for (int e = 0; e < E; e++)
        w[e] = (double)load[e];
    int rc = lrmoe_eplb_rebalance(w, 1, E, nphy, groups, o->nodes, P, out->phy2log,
                                  out->phyrank, out->logcnt);
    free(w);
    if (rc < 0)
        return -1;
    const int same = prev && prev->E == E && prev->P == P && prev->slots == slots;
    out->nmoved = 0;
    for (int i = 0; i < nphy; i++) {
        const int j = i % slots, q = i / slots;
        const int before = same ? prev->phy2log[i] : j < per ? q * per + j : -1;
        out->moved[i] = out->phy2log[i] != before;
        out->nmoved += out->moved[i];
    }
    return 0;
}

int lrmoe_eplb_layout_copy(lrmoe_eplb_layout_t *dst, const lrmoe_eplb_layout_t *src)
{
    const size_t nphy = (size_t)src->P * src->slots;
    if (dst->E != src->E || dst->P != src->P || dst->slots != src->slots || !dst->phy2log) {
        lrmoe_eplb_layout_free(dst);
        dst->phy2log = malloc(nphy * sizeof(int));
        dst->phyrank = malloc(nphy * sizeof(int));
        dst->logcnt = malloc((size_t)src->E * sizeof(int));
        dst->moved = malloc(nphy);
        if (!dst->phy2log || !dst->phyrank || !dst->logcnt || !dst->moved) {
            lrmoe_eplb_layout_free(dst);
            return lrmoe_err("eplb: out of memory");
        }
    }
    dst->E = src->E;
    dst->P = src->P;
    dst->slots = src->slots;
    dst->nmoved = src->nmoved;
    memcpy(dst->phy2log, src->phy2log, nphy * sizeof(int));
    memcpy(dst->phyrank, src->phyrank, nphy * sizeof(int));
    memcpy(dst->logcnt, src->logcnt, (size_t)src->E * sizeof(int));
    memcpy(dst->moved, src->moved, nphy);
    return 0;
}

typedef struct {
    char *layer;
    lrmoe_eplb_layout_t cur, next;
    double *window;     /* (E) loads since the last rearrangement */
    int64_t frames;     /* frames of the layer since then */
} eplb_layer_t;

struct lrmoe_eplb_cache {
    eplb_layer_t *l;
    int n, cap;
};

lrmoe_eplb_cache_t *lrmoe_eplb_cache_new(void)
{
    lrmoe_eplb_cache_t *c = calloc(1, sizeof *c);
    if (!c)
        lrmoe_err("eplb: out of memory");
    return c;
}

void lrmoe_eplb_cache_free(lrmoe_eplb_cache_t *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n; i++) {
        free(c->l[i].layer);
        lrmoe_eplb_layout_free(&c->l[i].cur);
        lrmoe_eplb_layout_free(&c->l[i].next);
        free(c->l[i].window);
    }
    free(c->l);
    free(c);
}

int lrmoe_eplb_step(lrmoe_eplb_cache_t *c, const char *layer, const lrmoe_plan_opts_t *o,
                    const int64_t *load, int E, const lrmoe_eplb_layout_t **out)
{
    if (!layer)
        layer = "";
    eplb_layer_t *L = NULL;
    for (int i = 0; i < c->n && !L; i++)
        if (!strcmp(c->l[i].layer, layer))
            L = &c->l[i];
    if (L && (L->cur.E != E || L->cur.P != o->P || L->cur.slots != eplb_slots(o, E)))
        return lrmoe_err("eplb: layer '%s' changed shape (%d experts over %d ranks)", layer, E,
                         o->P);
    if (!L) {
        if (c->n == c->cap) {
            int cap = c->cap ? 2 * c->cap : 16;
            eplb_layer_t *nl = realloc(c->l, (size_t)cap * sizeof *nl);
            if (!nl)
                return lrmoe_err("eplb: out of memory");
            c->l = nl;
            c->cap = cap;
        }
        L = &c->l[c->n];
        memset(L, 0, sizeof *L);
        L->layer = strdup(layer);
        L->window = calloc((size_t)E, sizeof *L->window);
        if (!L->layer || !L->window ||
            lrmoe_eplb_layout_make(o, load, E, NULL, &L->cur) < 0) {
            free(L->layer);
            free(L->window);
            lrmoe_eplb_layout_free(&L->cur);
            return L->layer && L->window ? -1 : lrmoe_err("eplb: out of memory");
        }
        c->n++;
    } else if (o->rebalance_every == 0) {
        if (lrmoe_eplb_layout_make(o, load, E, &L->cur, &L->next) < 0)
            return -1;
        lrmoe_eplb_layout_t t = L->cur;
        L->cur = L->next;
        L->next = t;
    } else if (L->frames >= o->rebalance_every) {
        /* rearranged after the last frame of the interval: applies now */
        int64_t *wl = malloc((size_t)E * sizeof *wl);
        if (!wl)
            return lrmoe_err("eplb: out of memory");
        for (int e = 0; e < E; e++)
            wl[e] = (int64_t)llround(L->window[e]);
        int r = lrmoe_eplb_layout_make(o, wl, E, &L->cur, &L->next);
        free(wl);
        if (r < 0)
            return -1;
        lrmoe_eplb_layout_t t = L->cur;
        L->cur = L->next;
        L->next = t;
        memset(L->window, 0, (size_t)E * sizeof *L->window);
        L->frames = 0;
    } else if (L->cur.nmoved) {
        memset(L->cur.moved, 0, (size_t)L->cur.slots * L->cur.P); /* nothing moves now */
        L->cur.nmoved = 0;
    }
    for (int e = 0; e < E; e++)
        L->window[e] += (double)load[e];
    L->frames++;
    *out = &L->cur;
    return 0;
}

/* The eplb planner: the layout's physical slots become placement (the
 * native rank keeps its resident copy, placement 1, even without a slot);
 * each expert's pairs are split over its copies as evenly as possible (copy
 * r gets one extra pair while r < n_e mod count), summed per GPU. Every rank
 * is charged its slots - E/P redundant slots; weights arrive at the slots
 * the layout moved (sent by the expert's native rank), and every redundant
 * copy returns its weight gradient to the expert's first copy. */
int lrmoe_plan_eplb(const lrmoe_plan_opts_t *o, const int64_t *load, int E, lrmoe_plan_t *p)
{
    const int P = o->P, per = E / P;
    lrmoe_eplb_layout_t own;
    memset(&own, 0, sizeof own);
    const lrmoe_eplb_layout_t *L = o->eplb_layout;
    if (L && (L->E != E || L->P != P || L->slots != eplb_slots(o, E)))
        return lrmoe_err("eplb: the layout given is for %d experts, %d ranks, %d slots",
                         L->E, L->P, L->slots);
    if (!L) {
        if (lrmoe_eplb_layout_make(o, load, E, NULL, &own) < 0)
            return -1;
        L = &own;
    }
    const int slots = L->slots, nphy = slots * P;
    int *first = malloc((size_t)E * sizeof(int));
    if (!first) {
        lrmoe_eplb_layout_free(&own);
        return lrmoe_err("eplb: out of memory");
    }
    const double wb = lrmoe_cost_expert_elems(&o->cost) * o->cost.dtype_bytes;
    for (int e = 0; e < E; e++) {
        p->placement[(size_t)e * P + e / per] = 1;
        first[e] = -1;
    }
    for (int q = 0; q < P; q++)
        p->held[q] = slots - per;
    for (int i = 0; i < nphy; i++) {
        const int e = L->phy2log[i], g = i / slots;
        const int64_t c = L->logcnt[e];
        const int64_t share = load[e] / c + (L->phyrank[i] < load[e] % c ? 1 : 0);
        p->placement[(size_t)e * P + g] = 1;
        p->fwd_alloc[(size_t)e * P + g] += share;
        if (L->moved[i]) {
            p->wrecv[g] += wb;
            p->wsend[e / per] += wb;
        }
        if (first[e] < 0) {
            first[e] = g;
        } else if (first[e] != g) {
            p->wsend[g] += wb;
            p->wrecv[first[e]] += wb;
        }
    }
    p->have_slots = 1;
    p->weight_moves = L->nmoved;
    free(first);
    lrmoe_eplb_layout_free(&own);
    return 0;
}
