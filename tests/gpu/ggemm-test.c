/* Host test of the Hopper grouped GEMM's logic (kernels/ggemm_setup.h, no
 * GPU, no CUDA): the per-group sizes and pointers the setup kernel derives
 * from the row offsets (kcu_gg_group, run here on the host), multiplied out
 * with a naive GEMM through exactly those pointers and compared with the
 * layer computed row by row (row-grouped) and expert by expert
 * (K-grouped); zero-row experts; bad offsets; argument checks; the split of
 * a lrmoe_gemm_t list into CUTLASS launches. Prints one line per part and
 * "ggemm-test: ok" last, or FAIL lines and exits 1. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ggemm_setup.h"

static int fails;
#define CHECK(cond, ...) do { if (!(cond)) { fails++; printf("ggemm-test: FAIL %s:%d: ", \
    __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

/* the operands as float (the BF16 values exactly: small integers) */
static float at(const float *p, int64_t ld, int64_t r, int64_t c) { return p[r * ld + c]; }

/* C (m,n) row-major = op(A) op(B) + beta*C, lrmoe_gemm_t's convention */
static void naive(int m, int n, int k, int ta, int tb, const float *a, int64_t lda, const float *b,
                  int64_t ldb, float *c, int64_t ldc, float beta)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int q = 0; q < k; q++)
                s += (double)(ta ? at(a, lda, q, i) : at(a, lda, i, q)) *
                     (tb ? at(b, ldb, j, q) : at(b, ldb, q, j));
            c[i * ldc + j] = (float)s + (beta != 0.0f ? c[i * ldc + j] : 0.0f);
        }
}

static void fill(float *x, int64_t n, int seed)
{
    for (int64_t i = 0; i < n; i++) x[i] = (float)((i * 7 + seed * 13) % 9) - 4.0f;
}

/* the setup kernel on the host: every group through kcu_gg_group, then the
 * GEMM of each group through its pointers (float arrays standing in for
 * the BF16 ones: element offsets are what the kernel adds), zeroing zm
 * rows; returns how many groups reported bad offsets */
static int run_groups(const lrmoe_ggemm_t *d, const int64_t *off, const float *a, int64_t na,
                      const float *b, int64_t nb, float *c, int64_t nc)
{
    int bad = 0;
    for (int g = 0; g < d->ngroups; g++) {
        kcu_gg_group_t q;
        bad += kcu_gg_group(d, g, off[g], off[g + 1], &q);
        CHECK(q.zm == 0 || q.m == 0, "group %d: zeroed and computed", g);
        /* every element the group touches lies inside its array */
        int64_t m = q.m ? q.m : q.zm, lastc = q.co + (m - 1) * d->ldc + q.n - 1;
        int64_t lasta = q.ao + (d->ta ? (q.k - 1) * d->lda + q.m - 1 : (q.m - 1) * d->lda + q.k - 1);
        int64_t lastb = q.bo + (d->tb ? (q.n - 1) * d->ldb + q.k - 1 : (q.k - 1) * d->ldb + q.n - 1);
        if (m && q.n && (q.co < 0 || lastc >= nc)) {
            CHECK(0, "group %d: C elements %lld..%lld outside 0..%lld", g, (long long)q.co,
                  (long long)lastc, (long long)nc - 1);
            continue;
        }
        if (q.m && q.n && q.k && (q.ao < 0 || lasta >= na || q.bo < 0 || lastb >= nb)) {
            CHECK(0, "group %d: A or B elements outside their arrays", g);
            continue;
        }
        if (q.m && q.n)
            naive(q.m, q.n, q.k, d->ta, d->tb, a + q.ao, d->lda, b + q.bo, d->ldb, c + q.co, d->ldc,
                  d->beta);
        for (int r = 0; r < q.zm; r++)
            for (int j = 0; j < q.n; j++) c[q.co + (int64_t)r * d->ldc + j] = 0.0f;
    }
    return bad;
}

static int64_t expert_of(const int64_t *off, int E, int64_t row)
{
    for (int e = 0; e < E; e++)
        if (row >= off[e] && row < off[e + 1]) return e;
    return -1;
}

/* forward FC1 / dphi / dx form: C (rows, n) = A (rows, k) op(B_e), tb 0/1 */
static void t_rows(int tb, float beta)
{
    enum { E = 5, N = 16, K = 24 };
    const int64_t cnt[E] = {3, 0, 8, 1, 0};
    int64_t off[E + 1] = {0};
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + cnt[e];
    int64_t R = off[E], lda = K + 8, ldb = tb ? K + 8 : N + 8, ldc = N + 4;
    int64_t sb = (tb ? N : K) * ldb + 8;
    float *a = calloc((size_t)(R * lda), 4), *b = calloc((size_t)(E * sb), 4);
    float *c = calloc((size_t)(R * ldc), 4), *ref = calloc((size_t)(R * ldc), 4);
    fill(a, R * lda, 1);
    fill(b, E * sb, 2);
    fill(c, R * ldc, 3);
    memcpy(ref, c, (size_t)(R * ldc) * 4);
    lrmoe_ggemm_t d;
    memset(&d, 0, sizeof d);
    d.kgrouped = 0; d.ngroups = E; d.offsets = off; d.rows = R;
    d.n = N; d.k = K; d.ta = 0; d.tb = tb;
    d.lda = lda; d.ldb = ldb; d.ldc = ldc; d.sb = sb; d.alpha = 1; d.beta = beta;
    CHECK(run_groups(&d, off, a, R * lda, b, E * sb, c, R * ldc) == 0, "rows: bad offsets reported");
    /* reference: row by row, each with its expert's weight */
    for (int64_t i = 0; i < R; i++) {
        int64_t e = expert_of(off, E, i);
        naive(1, N, K, 0, tb, a + i * lda, lda, b + e * sb, ldb, ref + i * ldc, ldc, beta);
    }
    int diff = 0;
    for (int64_t i = 0; i < R * ldc; i++) diff += c[i] != ref[i];
    CHECK(diff == 0, "rows tb=%d beta=%g: %d elements differ from the row-by-row layer", tb,
          beta, diff);
    /* the zero-row experts are empty groups (nothing computed or zeroed) */
    kcu_gg_group_t q;
    kcu_gg_group(&d, 1, off[1], off[2], &q);
    CHECK(q.m == 0 && q.zm == 0, "rows: expert 1 (0 rows): m %d zm %d", q.m, q.zm);
    kcu_gg_group(&d, 2, off[2], off[3], &q);
    CHECK(q.m == 8 && q.n == N && q.k == K && q.ao == 3 * lda && q.bo == 2 * sb && q.co == 3 * ldc,
          "rows: expert 2: %d %d %d ao %lld bo %lld co %lld", q.m, q.n, q.k, (long long)q.ao,
          (long long)q.bo, (long long)q.co);
    printf("ggemm-test: row-grouped tb=%d beta=%g: %lld rows of %d experts equal the row-by-row"
           " layer\n", tb, beta, (long long)R, E);
    free(a); free(b); free(c); free(ref);
}

/* weight-gradient form: C_e (m, n) = A_e^T B_e, K = rows of expert e */
static void t_krows(float beta)
{
    enum { E = 4, M = 16, N = 8 };
    const int64_t cnt[E] = {5, 0, 2, 9};
    int64_t off[E + 1] = {0};
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + cnt[e];
    int64_t R = off[E], lda = M + 8, ldb = N + 8, ldc = N + 4, sc = M * ldc + 4;
    float *a = calloc((size_t)(R * lda), 4), *b = calloc((size_t)(R * ldb), 4);
    float *c = calloc((size_t)(E * sc), 4), *ref = calloc((size_t)(E * sc), 4);
    fill(a, R * lda, 4);
    fill(b, R * ldb, 5);
    fill(c, E * sc, 6);      /* garbage where beta = 0 */
    memcpy(ref, c, (size_t)(E * sc) * 4);
    lrmoe_ggemm_t d;
    memset(&d, 0, sizeof d);
    d.kgrouped = 1; d.ngroups = E; d.offsets = off; d.rows = R;
    d.m = M; d.n = N; d.ta = 1; d.tb = 0;
    d.lda = lda; d.ldb = ldb; d.ldc = ldc; d.sc = sc; d.alpha = 1; d.beta = beta;
    CHECK(run_groups(&d, off, a, R * lda, b, R * ldb, c, E * sc) == 0,
          "krows: bad offsets reported");
    /* reference: per expert, the sum of outer products of its rows */
    for (int e = 0; e < E; e++)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double s = 0;
                for (int64_t r = 0; r < R; r++)
                    if (expert_of(off, E, r) == e) s += (double)a[r * lda + i] * b[r * ldb + j];
                float *o = &ref[e * sc + i * ldc + j];
                *o = (float)s + (beta != 0.0f ? *o : 0.0f);
            }
    int diff = 0;
    for (int64_t i = 0; i < E * sc; i++) diff += c[i] != ref[i];
    CHECK(diff == 0, "krows beta=%g: %d elements differ from the per-expert sums", beta, diff);
    kcu_gg_group_t q;
    kcu_gg_group(&d, 1, off[1], off[2], &q);
    CHECK(q.m == 0 && q.zm == (beta == 0.0f ? M : 0), "krows: expert 1 (no rows): m %d zm %d", q.m,
          q.zm);
    kcu_gg_group(&d, 3, off[3], off[4], &q);
    CHECK(q.m == M && q.n == N && q.k == 9 && q.ao == 7 * lda && q.bo == 7 * ldb && q.co == 3 * sc,
          "krows: expert 3: %d %d %d", q.m, q.n, q.k);
    printf("ggemm-test: K-grouped beta=%g: %d experts (one without rows: %s) equal the "
           "per-expert sums\n", beta, E, beta == 0.0f ? "zeroed" : "kept");
    free(a); free(b); free(c); free(ref);
}

static void t_bad_offsets(void)
{
    lrmoe_ggemm_t d;
    memset(&d, 0, sizeof d);
    d.kgrouped = 0; d.ngroups = 3; d.rows = 10; d.n = 8; d.k = 8;
    d.lda = 8; d.ldb = 8; d.ldc = 8;
    kcu_gg_group_t q;
    CHECK(kcu_gg_group(&d, 0, 4, 2, &q) == 1 && q.m == 0 && q.zm == 0, "decreasing offsets");
    CHECK(kcu_gg_group(&d, 0, -1, 2, &q) == 1 && q.m == 0, "negative offset");
    CHECK(kcu_gg_group(&d, 0, 4, 11, &q) == 1 && q.m == 0, "offset past rows");
    CHECK(kcu_gg_group(&d, 0, 4, 10, &q) == 0 && q.m == 6, "last rows");
    d.rows = (int64_t)INT_MAX + 10;
    CHECK(kcu_gg_group(&d, 0, 0, (int64_t)INT_MAX + 1, &q) == 1 && q.m == 0, "group > INT_MAX");
    d.kgrouped = 1; d.m = 8; d.beta = 0;
    d.rows = 10;
    CHECK(kcu_gg_group(&d, 0, 5, 3, &q) == 1 && q.zm == 0, "K-grouped bad offsets zero nothing");
    printf("ggemm-test: bad offsets make empty groups and are reported\n");
}

static lrmoe_ggemm_t good_desc(int kgrouped)
{
    static const int64_t off[3] = {0, 8, 16};
    static uint16_t buf[4096] __attribute__((aligned(16)));
    lrmoe_ggemm_t d;
    memset(&d, 0, sizeof d);
    d.kgrouped = kgrouped; d.ngroups = 2; d.offsets = off; d.rows = 16;
    d.m = 32; d.n = 64; d.k = 48;
    d.ta = kgrouped; d.tb = 0;
    d.a = buf; d.b = buf; d.c = buf;
    d.lda = kgrouped ? 32 : 48; d.ldb = 64; d.ldc = 64;
    d.sb = kgrouped ? 0 : 48 * 64; d.sc = kgrouped ? 32 * 64 : 0;
    d.alpha = 1;
    return d;
}

static void t_check(void)
{
    lrmoe_ggemm_t d = good_desc(0);
    CHECK(kcu_gg_check(&d) == NULL, "good row-grouped rejected: %s", kcu_gg_check(&d));
    d = good_desc(1);
    CHECK(kcu_gg_check(&d) == NULL, "good K-grouped rejected: %s", kcu_gg_check(&d));
    int n = 0;
#define REJ(kg, stmt, want) do { lrmoe_ggemm_t x = good_desc(kg); stmt; const char *w = kcu_gg_check(&x); \
    CHECK(w && strstr(w, want), "%s: got %s, want %s", #stmt, w ? w : "(accepted)", want); n++; } while (0)
    REJ(0, x.ngroups = -1, "negative group count");
    REJ(0, x.offsets = NULL, "no offsets");
    REJ(0, x.beta = 0.5f, "beta");
    REJ(0, x.ta = 1, "ta = 0");
    REJ(1, x.ta = 0, "ta = 1, tb = 0");
    REJ(1, x.tb = 1, "ta = 1, tb = 0");
    REJ(0, x.n = 60, "multiples of 8");
    REJ(1, x.m = 20, "multiples of 8");
    REJ(0, x.lda = 40, "leading dimension");
    REJ(1, x.ldc = 60, "leading dimension");
    REJ(0, (x.ldb = 68, x.sb = 48 * 68), "16 bytes");
    REJ(0, x.a = (const char *)x.a + 2, "16-byte aligned");
    REJ(1, x.c = (char *)x.c + 8, "16-byte aligned");
    REJ(0, x.sb = 64, "overlaps");
    REJ(1, x.sc = 64, "overlaps");
    REJ(1, x.kgrouped = 2, "kgrouped");
    REJ(0, x.n = (int64_t)INT_MAX + 1, "out of range");
    /* ldc of a BF16 C needs 8 elements, of F32 C 4 */
    lrmoe_ggemm_t x = good_desc(0);
    x.ldc = 68;
    CHECK(kcu_gg_check(&x) == NULL, "F32 C with ldc 68 rejected");
    x.c_bf16 = 1;
    CHECK(kcu_gg_check(&x) != NULL, "BF16 C with ldc 68 accepted");
    printf("ggemm-test: argument checks: %d bad descriptions rejected with their reason\n", n + 1);
}

static lrmoe_gemm_t G(int64_t m, int64_t n, int64_t k, int ta, int tb, const void *a, int64_t lda,
                      const void *b, int64_t ldb, void *c, int64_t ldc, float beta, int cbf)
{
    lrmoe_gemm_t g;
    memset(&g, 0, sizeof g);
    g.m = m; g.n = n; g.k = k; g.ta = ta; g.tb = tb; g.a = a; g.b = b; g.c = c;
    g.lda = lda; g.ldb = ldb; g.ldc = ldc; g.beta = beta; g.c_bf16 = cbf;
    return g;
}

static void t_split(void)
{
    static uint16_t p[64] __attribute__((aligned(16)));
    const int64_t D = 2048, F = 768;
    lrmoe_gemm_t g[] = {
        G(100, F, D, 0, 1, p, D, p, D, p, F, 0, 0),   /* forward FC1: variant 010 */
        G(100, F, D, 0, 0, p, D, p, F, p, F, 0, 0),   /* dphi: 000 */
        G(D, F, 100, 1, 0, p, D, p, F, p, F, 0, 0),   /* dW_down: 100 */
        G(100, D, F, 0, 0, p, F, p, D, p, D, 1, 0),   /* dx, second half: 000 beta 1 */
        G(100, F, D, 0, 1, p, D, p, D, p, F, 0, 1),   /* BF16 C: 011 */
        G(100, F, D, 1, 1, p, 100, p, D, p, F, 0, 0), /* both transposed: cuBLAS */
        G(100, F, 0, 0, 0, p, 8, p, F, p, F, 0, 0),   /* k = 0: zeroed by gemm.cu */
        G(0, F, D, 0, 0, p, D, p, F, p, F, 0, 0),     /* m = 0: nothing */
        G(100, 70, D, 0, 0, p, D, p, 72, p, 72, 0, 0),/* n % 8: cuBLAS */
        G(100, F, D, 0, 0, p + 1, D, p, F, p, F, 0, 0), /* A off 16 bytes: cuBLAS */
        G(100, F, D, 0, 0, p, D + 4, p, F, p, F, 0, 0), /* lda % 8: cuBLAS */
        G(100, 4, D, 0, 0, p, D, p, 8, p, 4, 0, 0),     /* n = 4 with F32 C: B contig 4: cuBLAS */
    };
    int n = (int)(sizeof g / sizeof g[0]), launch[16];
    /* launch = variant (ta*4 + tb*2 + c_bf16) * 2 + beta */
    const int want[] = {2 * 2, 0 * 2, 4 * 2, 0 * 2 + 1, 3 * 2, -1, -1, -1, -1, -1, -1, -1};
    int got = kcu_gg_split(n, g, launch);
    CHECK(got == 5, "split: %d GEMMs to CUTLASS, want 5", got);
    for (int i = 0; i < n; i++)
        CHECK(launch[i] == want[i], "split: GEMM %d launch %d, want %d", i, launch[i], want[i]);
    int distinct = 0, seen[32] = {0};
    for (int i = 0; i < n; i++)
        if (launch[i] >= 0 && !seen[launch[i]]++) distinct++;
    CHECK(distinct == 5, "split: %d launches, want 5", distinct);
    printf("ggemm-test: split of a list: %d of %d GEMMs in %d launches, the rest to cuBLAS\n", got,
           n, distinct);
}

static void t_carve(void)
{
    for (int64_t G = 1; G <= 300; G += 37) {
        char *base = malloc(kcu_gg_bytes(G));
        kcu_gg_arrays_t x;
        kcu_gg_carve(base, G, &x);
        /* in order, disjoint, inside the block, 8-byte aligned */
        char *e[] = {(char *)x.a, (char *)x.b, (char *)x.c, (char *)x.lda, (char *)x.ldb,
                     (char *)x.ldc, (char *)x.shapes, (char *)x.zm, base + kcu_gg_bytes(G)};
        int64_t len[] = {8, 8, 8, 8, 8, 8, 12, 4};
        for (int i = 0; i < 8; i++) {
            CHECK(e[i] + len[i] * G <= e[i + 1], "carve G=%lld: array %d overlaps", (long long)G, i);
            CHECK(((uintptr_t)(e[i] - base)) % (i < 6 ? 8 : 4) == 0, "carve: array %d misaligned", i);
        }
        free(base);
    }
    printf("ggemm-test: device arrays carved disjoint and aligned\n");
}

int main(void)
{
    t_rows(0, 0.0f);
    t_rows(1, 0.0f);
    t_rows(0, 1.0f);
    t_krows(0.0f);
    t_krows(1.0f);
    t_bad_offsets();
    t_check();
    t_split();
    t_carve();
    if (fails) {
        printf("ggemm-test: FAIL (%d)\n", fails);
        return 1;
    }
    printf("ggemm-test: ok\n");
    return 0;
}
