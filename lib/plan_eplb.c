/* DeepSeek EPLB (github.com/deepseek-ai/EPLB, eplb.py) in C: redundant
 * experts by greedy replication (the expert with the highest load per
 * replica gets the next slot, first index on ties), balanced packing with an
 * equal item count per pack (items by decreasing weight, stable; each to the
 * lightest pack with room, first index on ties), hierarchical over nodes.
 * Arithmetic is float32 as in the reference (weight.float()). */
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

/* The eplb planner: EPLB's physical slots become placement; each expert's
 * pairs are split over its replicas as evenly as possible (replica rank r
 * gets one extra pair while r < n_e mod count), summed per GPU. The native
 * rank keeps its resident copy (placement 1) even when EPLB puts no slot
 * there. */
int plan_eplb(const lrmoe_plan_opts_t *o, const int64_t *load, int E, lrmoe_plan_t *p)
{
    const int P = o->P, per = E / P;
    const int slots = o->slots ? o->slots : per + 2;
    const int groups = o->groups ? o->groups : o->nodes;
    const int nphy = slots * P;
    double *w = calloc((size_t)E, sizeof *w);
    int *p2l = malloc((size_t)nphy * sizeof(int)), *rk = malloc((size_t)nphy * sizeof(int));
    int *cnt = malloc((size_t)E * sizeof(int));
    int rc = -1;
    if (!w || !p2l || !rk || !cnt) {
        lrmoe_err("eplb: out of memory");
        goto out;
    }
    for (int e = 0; e < E; e++)
        w[e] = (double)load[e];
    if (lrmoe_eplb_rebalance(w, 1, E, nphy, groups, o->nodes, P, p2l, rk, cnt) < 0)
        goto out;
    for (int e = 0; e < E; e++)
        p->placement[(size_t)e * P + e / per] = 1;
    for (int i = 0; i < nphy; i++) {
        int e = p2l[i], g = i / slots;
        int64_t c = cnt[e], share = load[e] / c + (rk[i] < load[e] % c ? 1 : 0);
        p->placement[(size_t)e * P + g] = 1;
        p->fwd_alloc[(size_t)e * P + g] += share;
    }
    rc = 0;
out:
    free(w);
    free(p2l);
    free(rk);
    free(cnt);
    return rc;
}
