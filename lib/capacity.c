/* capacity: expert capacity and the pairs it keeps (see capacity.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "capacity.h"
#include "lrmoe.h"

int lrmoe_capacity_policy_parse(const char *s, lrmoe_capacity_policy_t *out)
{
    if (s && !strcmp(s, "probs")) {
        *out = LRMOE_CAPACITY_PROBS;
        return 0;
    }
    if (s && !strcmp(s, "position")) {
        *out = LRMOE_CAPACITY_POSITION;
        return 0;
    }
    return lrmoe_err("unknown drop policy '%s' (probs, position)", s ? s : "");
}

const char *lrmoe_capacity_policy_name(lrmoe_capacity_policy_t p)
{
    return p == LRMOE_CAPACITY_POSITION ? "position" : p == LRMOE_CAPACITY_PROBS ? "probs" : "?";
}

int64_t lrmoe_capacity_pairs(int64_t N, int E, double factor)
{
    if (N < 0 || E <= 0)
        return lrmoe_err("capacity: need pairs >= 0 and experts >= 1 (got %lld, %d)",
                         (long long)N, E);
    if (!(factor > 0) || !isfinite(factor))
        return lrmoe_err("capacity factor %g must be finite and > 0", factor);
    /* Megatron-Core: math.ceil((num_tokens / num_experts) * capacity_factor),
     * num_tokens = T*K: the same two IEEE double operations, then ceil */
    double c = ceil(((double)N / (double)E) * factor);
    if (!(c < 0x1p62))
        return lrmoe_err("capacity: ceil(%lld/%d * %g) is too large", (long long)N, E, factor);
    return (int64_t)c;
}

int64_t lrmoe_capacity(int64_t T, int K, int E, double factor)
{
    if (T < 0 || K <= 0)
        return lrmoe_err("capacity: need tokens >= 0 and top-k >= 1 (got %lld, %d)",
                         (long long)T, K);
    if (T > INT64_MAX / K)
        return lrmoe_err("capacity: %lld tokens x %d pairs overflow", (long long)T, K);
    return lrmoe_capacity_pairs(T * K, E, factor);
}

typedef struct {
    float w;
    int64_t u;
} cand_t;

/* higher weight first, then the lower pair index */
static int cmp_cand(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->w != y->w)
        return x->w > y->w ? -1 : 1;
    return (x->u > y->u) - (x->u < y->u);
}

int lrmoe_capacity_keep(int64_t T, int K, int E, const int32_t *topk_ids,
                        const float *topk_weights, int64_t capacity,
                        lrmoe_capacity_policy_t policy, uint8_t *keep, int64_t *kept)
{
    if (T < 0 || K <= 0 || E <= 0 || T > INT64_MAX / K)
        return lrmoe_err("capacity: bad sizes T=%lld K=%d E=%d", (long long)T, K, E);
    if (capacity < 0)
        return lrmoe_err("capacity: %lld is negative", (long long)capacity);
    if (policy != LRMOE_CAPACITY_PROBS && policy != LRMOE_CAPACITY_POSITION)
        return lrmoe_err("capacity: unknown drop policy %d", (int)policy);
    const int64_t N = T * K;
    if (N > 0 && (!topk_ids || !keep))
        return lrmoe_err("capacity: topk_ids and keep are required");
    if (N > 0 && policy == LRMOE_CAPACITY_PROBS && !topk_weights)
        return lrmoe_err("capacity: drop policy probs needs topk_weights");
    int64_t *cnt = calloc((size_t)E + 1, sizeof *cnt);
    if (!cnt)
        return lrmoe_err("capacity: out of memory");
    for (int64_t u = 0; u < N; u++) {
        const int32_t e = topk_ids[u];
        if (e < 0 || e >= E) {
            free(cnt);
            return lrmoe_err("topk_ids[%lld,%lld]: expert %d outside [0,%d)", (long long)(u / K),
                             (long long)(u % K), (int)e, E);
        }
        if (topk_weights && isnan(topk_weights[u])) {
            free(cnt);
            return lrmoe_err("topk_weights[%lld,%lld]: NaN", (long long)(u / K),
                             (long long)(u % K));
        }
        cnt[e]++;
    }
    if (kept)
        for (int e = 0; e < E; e++)
            kept[e] = cnt[e] < capacity ? cnt[e] : capacity;
    int64_t over = 0; /* pairs of the experts above capacity */
    for (int e = 0; e < E; e++)
        if (cnt[e] > capacity)
            over += cnt[e];
    if (policy == LRMOE_CAPACITY_POSITION || over == 0) {
        /* the first C pairs of each expert in pair order (probs: every
         * expert is within capacity, so all of them) */
        int64_t *seen = calloc((size_t)E, sizeof *seen);
        if (!seen) {
            free(cnt);
            return lrmoe_err("capacity: out of memory");
        }
        for (int64_t u = 0; u < N; u++)
            keep[u] = seen[topk_ids[u]]++ < capacity;
        free(seen);
    } else {
        /* probs: every pair of an expert within capacity is kept; the pairs
         * of the others are bucketed by expert in pair order (a counting
         * sort), and each bucket sorted by (weight desc, index asc) */
        int64_t *start = malloc(((size_t)E + 1) * sizeof *start);
        cand_t *c = malloc((size_t)over * sizeof *c);
        if (!start || !c) {
            free(start);
            free(c);
            free(cnt);
            return lrmoe_err("capacity: out of memory (%lld pairs above capacity)",
                             (long long)over);
        }
        start[0] = 0;
        for (int e = 0; e < E; e++)
            start[e + 1] = start[e] + (cnt[e] > capacity ? cnt[e] : 0);
        int64_t *fill = cnt; /* reused: the next free slot of e's bucket, -1 none */
        for (int e = 0; e < E; e++)
            fill[e] = cnt[e] > capacity ? start[e] : -1;
        for (int64_t u = 0; u < N; u++) {
            const int32_t e = topk_ids[u];
            if (fill[e] < 0) {
                keep[u] = 1;
            } else {
                keep[u] = 0;
                c[fill[e]].w = topk_weights[u];
                c[fill[e]++].u = u;
            }
        }
        for (int e = 0; e < E; e++) {
            const int64_t n = start[e + 1] - start[e];
            if (!n)
                continue;
            qsort(c + start[e], (size_t)n, sizeof *c, cmp_cand);
            for (int64_t i = 0; i < capacity; i++)
                keep[c[start[e] + i].u] = 1;
        }
        free(start);
        free(c);
    }
    free(cnt);
    return 0;
}
