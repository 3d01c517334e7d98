/* XXH64 (Yann Collet's xxHash, 64-bit, seed 0), streaming, as the frames'
 * digest records of lrmoe-stream(5) use it. Internal to liblrmoe (static
 * functions); the same function zstd's content checksum takes the low 32
 * bits of, which tests/stream.bats uses as an independent oracle. */
#ifndef LRMOE_XXH64_H
#define LRMOE_XXH64_H

#include <stdint.h>
#include <string.h>

#define XXP1 0x9E3779B185EBCA87ull
#define XXP2 0xC2B2AE3D27D4EB4Full
#define XXP3 0x165667B19E3779F9ull
#define XXP4 0x85EBCA77C2B2AE63ull
#define XXP5 0x27D4EB2F165667C5ull

typedef struct {
    uint64_t v[4], total;
    uint8_t buf[32];
    unsigned nbuf;
} lrmoe_xxh64_t;

static inline uint64_t xxh_rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t xxh_rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t xxh_rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline uint64_t xxh_round(uint64_t acc, uint64_t in)
{
    acc += in * XXP2;
    return xxh_rotl(acc, 31) * XXP1;
}

static inline uint64_t xxh_merge(uint64_t acc, uint64_t v)
{
    acc ^= xxh_round(0, v);
    return acc * XXP1 + XXP4;
}

static inline void lrmoe_xxh64_reset(lrmoe_xxh64_t *s)
{
    s->v[0] = XXP1 + XXP2;
    s->v[1] = XXP2;
    s->v[2] = 0;
    s->v[3] = (uint64_t)0 - XXP1;
    s->total = 0;
    s->nbuf = 0;
}

/* the 32-byte stripes of p[0..n), n a multiple of 32 */
static inline void xxh_stripes(uint64_t *v, const uint8_t *p, size_t n)
{
    uint64_t a = v[0], b = v[1], c = v[2], d = v[3];
    for (const uint8_t *e = p + n; p < e; p += 32) {
        a = xxh_round(a, xxh_rd64(p));
        b = xxh_round(b, xxh_rd64(p + 8));
        c = xxh_round(c, xxh_rd64(p + 16));
        d = xxh_round(d, xxh_rd64(p + 24));
    }
    v[0] = a, v[1] = b, v[2] = c, v[3] = d;
}

static inline void lrmoe_xxh64_update(lrmoe_xxh64_t *s, const void *data, size_t n)
{
    const uint8_t *p = data;
    s->total += n;
    if (s->nbuf) {
        size_t k = 32 - s->nbuf < n ? 32 - s->nbuf : n;
        memcpy(s->buf + s->nbuf, p, k);
        s->nbuf += (unsigned)k;
        p += k;
        n -= k;
        if (s->nbuf < 32) return;
        xxh_stripes(s->v, s->buf, 32);
        s->nbuf = 0;
    }
    size_t body = n & ~(size_t)31;
    if (body) xxh_stripes(s->v, p, body);
    if (n - body) memcpy(s->buf, p + body, n - body);
    s->nbuf = (unsigned)(n - body);
}

static inline uint64_t lrmoe_xxh64_digest(const lrmoe_xxh64_t *s)
{
    uint64_t h;
    if (s->total >= 32) {
        h = xxh_rotl(s->v[0], 1) + xxh_rotl(s->v[1], 7) + xxh_rotl(s->v[2], 12) + xxh_rotl(s->v[3], 18);
        for (int i = 0; i < 4; i++) h = xxh_merge(h, s->v[i]);
    } else {
        h = s->v[2] + XXP5;   /* seed + P5 */
    }
    h += s->total;
    const uint8_t *p = s->buf, *e = s->buf + s->nbuf;
    for (; p + 8 <= e; p += 8) h = xxh_rotl(h ^ xxh_round(0, xxh_rd64(p)), 27) * XXP1 + XXP4;
    if (p + 4 <= e) {
        h = xxh_rotl(h ^ (uint64_t)xxh_rd32(p) * XXP1, 23) * XXP2 + XXP3;
        p += 4;
    }
    for (; p < e; p++) h = xxh_rotl(h ^ (uint64_t)*p * XXP5, 11) * XXP1;
    h ^= h >> 33;
    h *= XXP2;
    h ^= h >> 29;
    h *= XXP3;
    h ^= h >> 32;
    return h;
}

static inline uint64_t lrmoe_xxh64(const void *p, size_t n)
{
    lrmoe_xxh64_t s;
    lrmoe_xxh64_reset(&s);
    lrmoe_xxh64_update(&s, p, n);
    return lrmoe_xxh64_digest(&s);
}

#endif
