/* rng: xoshiro256** seeded through splitmix64 (see rng.h). */
#include "rng.h"

#include <math.h>
#include <pthread.h>

#define GOLDEN 0x9e3779b97f4a7c15ULL

uint64_t lrmoe_rng_mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

uint64_t lrmoe_rng_key(uint64_t seed, const uint64_t *keys, int n)
{
    uint64_t h = lrmoe_rng_mix(seed + GOLDEN);
    for (int i = 0; i < n; i++)
        h = lrmoe_rng_mix(h + GOLDEN * (uint64_t)(i + 2) + lrmoe_rng_mix(keys[i] + GOLDEN));
    return h;
}

void lrmoe_rng_seed(lrmoe_rng_t *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) {
        x += GOLDEN;
        r->s[i] = lrmoe_rng_mix(x);
    }
    if (!(r->s[0] | r->s[1] | r->s[2] | r->s[3]))
        r->s[0] = 1; /* the all-zero state is a fixed point */
    r->spare = 0;
    r->has_spare = 0;
}

void lrmoe_rng_seedv(lrmoe_rng_t *r, uint64_t seed, const uint64_t *keys, int n)
{
    lrmoe_rng_seed(r, lrmoe_rng_key(seed, keys, n));
}

void lrmoe_rng_seed4(lrmoe_rng_t *r, uint64_t seed, uint64_t a, uint64_t b,
                     uint64_t c, uint64_t d)
{
    uint64_t k[4] = {a, b, c, d};
    lrmoe_rng_seedv(r, seed, k, 4);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t lrmoe_rng_next(lrmoe_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double lrmoe_rng_uniform(lrmoe_rng_t *r)
{
    return (double)(lrmoe_rng_next(r) >> 11) * 0x1.0p-53;
}

double lrmoe_rng_uniform_pos(lrmoe_rng_t *r)
{
    return ((double)(lrmoe_rng_next(r) >> 11) + 0.5) * 0x1.0p-53;
}

uint64_t lrmoe_rng_below(lrmoe_rng_t *r, uint64_t n)
{
    if (n == 0)
        return 0;
    /* Lemire's multiply-shift with rejection: exact and unbiased. */
    uint64_t x = lrmoe_rng_next(r);
    __uint128_t m = (__uint128_t)x * n;
    uint64_t lo = (uint64_t)m;
    if (lo < n) {
        uint64_t thresh = (0 - n) % n;
        while (lo < thresh) {
            x = lrmoe_rng_next(r);
            m = (__uint128_t)x * n;
            lo = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

double lrmoe_rng_normal(lrmoe_rng_t *r)
{
    if (r->has_spare) {
        r->has_spare = 0;
        return r->spare;
    }
    double u1 = lrmoe_rng_uniform_pos(r), u2 = lrmoe_rng_uniform(r);
    double rad = sqrt(-2.0 * log(u1)), th = 2.0 * M_PI * u2;
    r->spare = rad * sin(th);
    r->has_spare = 1;
    return rad * cos(th);
}

double lrmoe_rng_exp(lrmoe_rng_t *r)
{
    return -log(lrmoe_rng_uniform_pos(r));
}

double lrmoe_rng_gumbel(lrmoe_rng_t *r)
{
    return -log(-log(lrmoe_rng_uniform_pos(r)));
}

/* Ziggurat (Marsaglia & Tsang 2000, with Doornik's 2005 fix: the layer index
 * and the uniform come from disjoint bits of one 64-bit draw). 128 layers. */
#define ZIG_C 128
#define ZIG_R 3.442619855899
#define ZIG_V 9.91256303526217e-3
static double zig_x[ZIG_C + 1], zig_r[ZIG_C];
static pthread_once_t zig_once = PTHREAD_ONCE_INIT;

static void zig_init(void)
{
    double f = exp(-0.5 * ZIG_R * ZIG_R);
    zig_x[0] = ZIG_V / f; /* the base strip, tail included */
    zig_x[1] = ZIG_R;
    zig_x[ZIG_C] = 0;
    for (int i = 2; i < ZIG_C; i++) {
        zig_x[i] = sqrt(-2 * log(ZIG_V / zig_x[i - 1] + f));
        f = exp(-0.5 * zig_x[i] * zig_x[i]);
    }
    for (int i = 0; i < ZIG_C; i++)
        zig_r[i] = zig_x[i + 1] / zig_x[i];
}

static double zig_tail(lrmoe_rng_t *r, int neg)
{
    double x, y;
    do {
        x = log(lrmoe_rng_uniform_pos(r)) / ZIG_R;
        y = log(lrmoe_rng_uniform_pos(r));
    } while (-2 * y < x * x);
    return neg ? x - ZIG_R : ZIG_R - x;
}

static inline double zig_one(lrmoe_rng_t *r)
{
    for (;;) {
        uint64_t b = lrmoe_rng_next(r);
        unsigned i = (unsigned)(b & 0x7f);
        double u = ((double)(b >> 11) + 0.5) * 0x1.0p-52 - 1.0; /* (-1,1) */
        if (fabs(u) < zig_r[i])
            return u * zig_x[i];
        if (i == 0)
            return zig_tail(r, u < 0);
        double x = u * zig_x[i];
        double f0 = exp(-0.5 * (zig_x[i] * zig_x[i] - x * x));
        double f1 = exp(-0.5 * (zig_x[i + 1] * zig_x[i + 1] - x * x));
        if (f1 + lrmoe_rng_uniform(r) * (f0 - f1) < 1.0)
            return x;
    }
}

double lrmoe_rng_normal_zig(lrmoe_rng_t *r)
{
    pthread_once(&zig_once, zig_init);
    return zig_one(r);
}

void lrmoe_rng_normal_f32(lrmoe_rng_t *r, float *dst, size_t n, float mean, float std)
{
    pthread_once(&zig_once, zig_init);
    for (size_t i = 0; i < n; i++)
        dst[i] = mean + std * (float)zig_one(r);
}

void lrmoe_rng_shuffle(lrmoe_rng_t *r, int64_t *a, int64_t n)
{
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)lrmoe_rng_below(r, (uint64_t)i + 1);
        int64_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

void lrmoe_rng_permutation(lrmoe_rng_t *r, int64_t *a, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        a[i] = i;
    lrmoe_rng_shuffle(r, a, n);
}
