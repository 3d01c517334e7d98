/* rng: a small deterministic random number generator.
 *
 * xoshiro256** seeded through splitmix64. Streams are addressed by a seed and
 * a tuple of keys (for example layer, step, tensor, row), so any piece of a
 * workload can be regenerated on its own, in any order and on any thread, and
 * the same (seed, keys) always gives the same numbers on every platform.
 * lrmoe_rng_normal uses Box-Muller (the second value of each pair is kept for
 * the next call); the bulk fills use the faster, equally exact Ziggurat.
 * Nothing here allocates, prints or fails.
 */
#ifndef LRMOE_RNG_H
#define LRMOE_RNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t s[4];
    double spare;   /* second Box-Muller value */
    int has_spare;
} lrmoe_rng_t;

/* splitmix64 finaliser: a bijective 64-bit mix. */
uint64_t lrmoe_rng_mix(uint64_t x);
/* Hash a seed and n keys into one 64-bit stream key (order matters). */
uint64_t lrmoe_rng_key(uint64_t seed, const uint64_t *keys, int n);

/* Seed the generator from one 64-bit value. */
void lrmoe_rng_seed(lrmoe_rng_t *r, uint64_t seed);
/* Seed the generator for the stream (seed, keys[0..n)). */
void lrmoe_rng_seedv(lrmoe_rng_t *r, uint64_t seed, const uint64_t *keys, int n);
/* Convenience: the stream (seed, a, b, c, d). */
void lrmoe_rng_seed4(lrmoe_rng_t *r, uint64_t seed, uint64_t a, uint64_t b,
                     uint64_t c, uint64_t d);

uint64_t lrmoe_rng_next(lrmoe_rng_t *r);        /* 64 random bits */
double lrmoe_rng_uniform(lrmoe_rng_t *r);       /* [0,1), 53 bits */
double lrmoe_rng_uniform_pos(lrmoe_rng_t *r);   /* (0,1), never 0 */
uint64_t lrmoe_rng_below(lrmoe_rng_t *r, uint64_t n); /* unbiased [0,n); 0 if n==0 */
double lrmoe_rng_normal(lrmoe_rng_t *r);        /* N(0,1), Box-Muller */
double lrmoe_rng_exp(lrmoe_rng_t *r);           /* Exp(1) */
double lrmoe_rng_gumbel(lrmoe_rng_t *r);        /* Gumbel(0,1): -log(-log U) */

double lrmoe_rng_normal_zig(lrmoe_rng_t *r);    /* N(0,1), Ziggurat */
/* dst[i] = mean + std * N(0,1) for i < n (Ziggurat, one 64-bit draw per
 * value except in the rare wedge and tail cases). */
void lrmoe_rng_normal_f32(lrmoe_rng_t *r, float *dst, size_t n, float mean, float std);
/* a[0..n) := a uniformly random permutation of 0..n-1 (Fisher-Yates). */
void lrmoe_rng_permutation(lrmoe_rng_t *r, int64_t *a, int64_t n);
/* Shuffle a[0..n) in place (Fisher-Yates). */
void lrmoe_rng_shuffle(lrmoe_rng_t *r, int64_t *a, int64_t n);

#endif
