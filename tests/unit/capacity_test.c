/* lib/capacity.c against a brute-force reference (tests/capacity.bats).
 *
 *   capacity_test formula T K E F      print lrmoe_capacity(T, K, E, F)
 *   capacity_test random N SEED        N random instances, both policies:
 *                                      keep and kept against the brute force;
 *                                      prints "N instances, F failures"
 *   capacity_test errors               each bad input refused: one line per case
 *
 * The brute force is the definition, pair by pair: under position, pair u of
 * expert e is kept when fewer than C pairs of e come before it; under probs,
 * when fewer than C pairs of e rank above it (a higher weight, or the same
 * weight and a lower index). O(n^2) per expert, no sorting.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capacity.h"
#include "lrmoe.h"

static uint64_t rng_state;
static uint64_t next_u64(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int64_t below(int64_t n) { return (int64_t)(next_u64() % (uint64_t)n); }

static void brute(int64_t N, const int32_t *ids, const float *w, int64_t C, int policy,
                  uint8_t *keep)
{
    for (int64_t u = 0; u < N; u++) {
        int64_t ahead = 0;
        for (int64_t v = 0; v < N; v++) {
            if (v == u || ids[v] != ids[u])
                continue;
            if (policy == LRMOE_CAPACITY_POSITION)
                ahead += v < u;
            else
                ahead += w[v] > w[u] || (w[v] == w[u] && v < u);
        }
        keep[u] = ahead < C;
    }
}

static int random_cases(int n, uint64_t seed)
{
    rng_state = seed;
    int fails = 0;
    for (int it = 0; it < n; it++) {
        const int64_t T = below(60);
        const int K = 1 + (int)below(4);
        const int E = 1 + (int)below(12);
        const int64_t N = T * K;
        int32_t *ids = malloc((size_t)(N ? N : 1) * sizeof *ids);
        float *w = malloc((size_t)(N ? N : 1) * sizeof *w);
        uint8_t *keep = malloc((size_t)(N ? N : 1)), *ref = malloc((size_t)(N ? N : 1));
        int64_t *kept = malloc((size_t)E * sizeof *kept);
        /* skewed ids: a few hot experts overflow; distinct experts per token
         * when K <= E (as a router picks them), duplicates otherwise */
        for (int64_t t = 0; t < T; t++)
            for (int k = 0; k < K; k++) {
                int32_t e;
                int dup;
                do {
                    e = (int32_t)(below(3) ? below(E < 3 ? E : 3) : below(E));
                    dup = 0;
                    for (int j = 0; j < k && K <= E; j++)
                        dup |= ids[t * K + j] == e;
                } while (dup);
                ids[t * K + k] = e;
            }
        /* weights from a small set so ties are common; -0 and +0 both */
        static const float vals[] = {0.5f, 0.25f, 0.125f, 0.0f, -0.0f, 0.75f, 1e-30f, -1.0f};
        for (int64_t u = 0; u < N; u++)
            w[u] = below(2) ? vals[below(8)] : (float)below(1000) / 997.0f;
        const double factors[] = {0.1, 0.5, 1.0, 1.25, 1.5, 2.0, 3.3};
        const double F = factors[below(7)];
        const int64_t C = lrmoe_capacity(T, K, E, F);
        const int64_t Cref = (int64_t)ceil(((double)(T * K) / (double)E) * F);
        if (C != Cref) {
            printf("case %d: capacity %lld, reference %lld\n", it, (long long)C, (long long)Cref);
            fails++;
        }
        for (int policy = 0; policy < 2; policy++) {
            /* the position policy needs no weights: NULL half the time */
            const float *wp = policy == LRMOE_CAPACITY_POSITION && below(2) ? NULL : w;
            memset(keep, 7, (size_t)(N ? N : 1));
            if (lrmoe_capacity_keep(T, K, E, ids, wp, C, (lrmoe_capacity_policy_t)policy, keep,
                                    kept) < 0) {
                printf("case %d: %s\n", it, lrmoe_errmsg());
                fails++;
                continue;
            }
            brute(N, ids, w, C, policy, ref);
            int bad = 0;
            for (int64_t u = 0; u < N; u++)
                bad |= keep[u] != ref[u];
            for (int e = 0; e < E; e++) {
                int64_t ne = 0, ke = 0;
                for (int64_t u = 0; u < N; u++) {
                    ne += ids[u] == e;
                    ke += ids[u] == e && ref[u];
                }
                bad |= kept[e] != ke || ke != (ne < C ? ne : C);
            }
            if (bad) {
                printf("case %d (T=%lld K=%d E=%d C=%lld %s): keep differs from the brute force\n",
                       it, (long long)T, K, E, (long long)C,
                       lrmoe_capacity_policy_name((lrmoe_capacity_policy_t)policy));
                fails++;
            }
        }
        free(ids);
        free(w);
        free(keep);
        free(ref);
        free(kept);
    }
    printf("%d instances, %d failures\n", n, fails);
    return fails != 0;
}

static int errors(void)
{
    int32_t ids[4] = {0, 1, 1, 2};
    float w[4] = {0.5f, 0.5f, 0.25f, 0.75f};
    uint8_t keep[4];
    int64_t kept[3];
    lrmoe_capacity_policy_t p;
#define REFUSE(call)                                                         \
    do {                                                                     \
        if ((call) >= 0) {                                                   \
            printf("accepted: %s\n", #call);                                 \
            return 1;                                                        \
        }                                                                    \
        printf("%s\n", lrmoe_errmsg());                                      \
    } while (0)
    REFUSE(lrmoe_capacity(4, 2, 8, 0.0));
    REFUSE(lrmoe_capacity(4, 2, 8, -1.0));
    REFUSE(lrmoe_capacity(4, 2, 8, NAN));
    REFUSE(lrmoe_capacity(4, 2, 8, INFINITY));
    REFUSE(lrmoe_capacity(4, 0, 8, 1.0));
    REFUSE(lrmoe_capacity(4, 2, 0, 1.0));
    REFUSE(lrmoe_capacity(-1, 2, 8, 1.0));
    REFUSE(lrmoe_capacity(INT64_MAX / 2, 4, 8, 1.0));
    REFUSE(lrmoe_capacity_pairs(INT64_MAX, 1, 4.0));
    ids[2] = 3;
    REFUSE(lrmoe_capacity_keep(2, 2, 3, ids, w, 1, LRMOE_CAPACITY_PROBS, keep, kept));
    ids[2] = -1;
    REFUSE(lrmoe_capacity_keep(2, 2, 3, ids, w, 1, LRMOE_CAPACITY_POSITION, keep, kept));
    ids[2] = 1;
    w[1] = NAN;
    REFUSE(lrmoe_capacity_keep(2, 2, 3, ids, w, 1, LRMOE_CAPACITY_PROBS, keep, kept));
    REFUSE(lrmoe_capacity_keep(2, 2, 3, ids, w, 1, LRMOE_CAPACITY_POSITION, keep, kept));
    w[1] = 0.5f;
    REFUSE(lrmoe_capacity_keep(2, 2, 3, ids, NULL, 1, LRMOE_CAPACITY_PROBS, keep, kept));
    REFUSE(lrmoe_capacity_keep(2, 2, 3, ids, w, -1, LRMOE_CAPACITY_PROBS, keep, kept));
    REFUSE(lrmoe_capacity_keep(2, 2, 3, ids, w, 1, (lrmoe_capacity_policy_t)7, keep, kept));
    REFUSE(lrmoe_capacity_keep(2, 0, 3, ids, w, 1, LRMOE_CAPACITY_PROBS, keep, kept));
    REFUSE(lrmoe_capacity_policy_parse("topk", &p));
    /* and the good input passes */
    if (lrmoe_capacity_keep(2, 2, 3, ids, w, 1, LRMOE_CAPACITY_PROBS, keep, kept) < 0) {
        printf("refused: %s\n", lrmoe_errmsg());
        return 1;
    }
    printf("keep %u %u %u %u kept %lld %lld %lld\n", keep[0], keep[1], keep[2], keep[3],
           (long long)kept[0], (long long)kept[1], (long long)kept[2]);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 6 && !strcmp(argv[1], "formula")) {
        int64_t c = lrmoe_capacity(atoll(argv[2]), atoi(argv[3]), atoi(argv[4]),
                                   strtod(argv[5], NULL));
        if (c < 0) {
            printf("error: %s\n", lrmoe_errmsg());
            return 1;
        }
        printf("%lld\n", (long long)c);
        return 0;
    }
    if (argc == 4 && !strcmp(argv[1], "random"))
        return random_cases(atoi(argv[2]), strtoull(argv[3], NULL, 10));
    if (argc == 2 && !strcmp(argv[1], "errors"))
        return errors();
    fprintf(stderr, "usage: capacity_test formula T K E F | random N SEED | errors\n");
    return 2;
}
