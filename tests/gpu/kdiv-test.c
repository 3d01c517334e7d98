/* kdiv_q (kernels/kdiv.h) against the C division, on the host: every
 * divisor 1..4096 with edge dividends, the divisors near powers of two and
 * near 2^31, 2^62, and 2^22 random (dividend, divisor) pairs. GPU-free: the
 * device runs the same function with __umul64hi for the 128-bit product.
 * Prints one line and exits 0 when all agree; names the first that does
 * not otherwise. kdiv_row_shift: the least power of two >= nv, capped. */
#include <inttypes.h>
#include <stdio.h>
#include "kdiv.h"

static uint64_t st = 0x243F6A8885A308D3ull;
static uint64_t rnd(void)
{
    uint64_t z = (st += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static long n_checked;
static int check(int64_t u, int64_t d)
{
    n_checked++;
    int64_t q = kdiv_q(u, kdiv_make(d));
    if (q != u / d) {
        printf("kdiv-test: FAIL %" PRId64 " / %" PRId64 " = %" PRId64 ", kdiv_q says %" PRId64 "\n",
               u, d, u / d, q);
        return 1;
    }
    return 0;
}

int main(void)
{
    const int64_t top = INT64_MAX;
    int64_t ds[64];
    int nd = 0;
    for (int b = 1; b < 63; b += 3) { ds[nd++] = (INT64_C(1) << b) - 1; ds[nd++] = INT64_C(1) << b; }
    ds[nd++] = INT32_MAX; ds[nd++] = top; ds[nd++] = top - 1;
    for (int64_t d = 1; d <= 4096; d++)
        for (int64_t j = 0; j < 3 * d + 3; j++) /* every remainder of the first quotients */
            if (check(j, d) || check(top - j, d) || check(top / d * d - 1 + (j & 1), d)) return 1;
    for (int i = 0; i < nd; i++)
        for (int64_t j = 0; j < 64; j++)
            if (check(j, ds[i]) || check(top - j, ds[i]) || check(ds[i] * (top / ds[i]) - 1, ds[i]) ||
                (ds[i] < top / 65 && (check(ds[i] * (j + 1) - 1, ds[i]) || check(ds[i] * (j + 1), ds[i]))))
                return 1;
    for (long i = 0; i < (1L << 22); i++) {
        int64_t u = (int64_t)(rnd() >> (1 + rnd() % 63)), d = (int64_t)(rnd() >> (1 + rnd() % 63));
        if (d < 1) d = 1;
        if (check(u, d)) return 1;
    }
    int sh[][3] = {{0, 256, 0}, {1, 256, 0}, {2, 256, 1}, {3, 256, 2}, {4, 256, 2}, {5, 256, 3},
                   {256, 256, 8}, {257, 256, 8}, {100000, 256, 8}, {16, 8, 3}};
    for (unsigned i = 0; i < sizeof sh / sizeof sh[0]; i++)
        if (kdiv_row_shift(sh[i][0], sh[i][1]) != sh[i][2]) {
            printf("kdiv-test: FAIL kdiv_row_shift(%d, %d) = %d, want %d\n", sh[i][0], sh[i][1],
                   kdiv_row_shift(sh[i][0], sh[i][1]), sh[i][2]);
            return 1;
        }
    printf("kdiv-test: %ld quotients equal to C's, row shifts ok\n", n_checked);
    return 0;
}
