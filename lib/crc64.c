/* crc64: CRC-64/NVME by carry-less multiply folding (crc64.h).
 *
 * The arithmetic, in the reflected bit order the CRC uses. A 16-byte block
 * loaded little-endian into a 128-bit register holds a polynomial of degree
 * < 128 with bit i the coefficient of x^(127-i): its low 64 bits (the first
 * 8 bytes) are the upper half H, its high 64 bits the lower half L, so the
 * block is X = H x^64 + L. A 64-bit constant K (degree < 64) is kept
 * bit-reversed (bit i: x^(63-i)). The carry-less product of two reversed
 * 64-bit values, read the same way as a 128-bit register, is their product
 * times x (the product has degree <= 126, one short of the register). So
 * moving X forward by d bits, X x^d = H x^(64+d) + L x^d (mod P), is
 *     clmul(X.lo, rev(x^(d+63) mod P)) xor clmul(X.hi, rev(x^(d-1) mod P))
 * a 128-bit value congruent to X x^d, which is xored onto the block d bits
 * later (fold). The running CRC state is xored into the first 8 bytes.
 * Several registers fold in parallel, each by the width of one loop
 * iteration; at the end they fold into one (each by its distance to the
 * last), and its 16 bytes, fed to the table with state 0, give the state
 * after them (the state is the message times x^64 mod P, and the folded
 * register is congruent to the message so far): no Barrett reduction. */
#include "crc64.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "lrmoe.h"

#define POLY 0xAD93D23594C93659ull   /* P = x^64 + POLY */

static uint64_t tab[8][256];   /* tab[k][b]: byte b followed by k zero bytes */
static uint64_t x2n[67];       /* x^(2^k) mod P, reflected (bit 63: x^0) */
static uint64_t K[17][2];      /* K[j]: the fold constants for d = 128 j bits */
static int path_cur;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static uint64_t rev64(uint64_t v)
{
    uint64_t r = 0;
    for (int i = 0; i < 64; i++) r |= ((v >> i) & 1) << (63 - i);
    return r;
}

/* x^n mod P, bit i the coefficient of x^i */
static uint64_t xpow(unsigned n)
{
    uint64_t r = 1;
    while (n--) r = (r << 1) ^ (r >> 63 ? POLY : 0);
    return r;
}

static int choose(void);

/* a b mod P, both reflected (bit 63 the coefficient of x^0): b times x
 * for each bit of a from x^0 up (zlib's multmodp, 64 bits wide) */
static uint64_t mulmodp(uint64_t a, uint64_t b)
{
    const uint64_t pr = rev64(POLY);
    uint64_t p = 0;
    for (uint64_t m = 1ull << 63; m; m >>= 1) {
        if (a & m) {
            p ^= b;
            if (!(a & (m - 1))) break;
        }
        b = b & 1 ? (b >> 1) ^ pr : b >> 1;
    }
    return p;
}

static void init(void)
{
    const uint64_t pr = rev64(POLY);
    for (int b = 0; b < 256; b++) {
        uint64_t c = (uint64_t)b;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ pr : c >> 1;
        tab[0][b] = c;
    }
    for (int k = 1; k < 8; k++)
        for (int b = 0; b < 256; b++)
            tab[k][b] = (tab[k - 1][b] >> 8) ^ tab[0][tab[k - 1][b] & 0xff];
    x2n[0] = 1ull << 62;   /* x^1 */
    for (int k = 1; k < 67; k++) x2n[k] = mulmodp(x2n[k - 1], x2n[k - 1]);
    for (unsigned j = 1; j < 17; j++) {
        K[j][0] = rev64(xpow(128 * j + 63));
        K[j][1] = rev64(xpow(128 * j - 1));
    }
    __atomic_store_n(&path_cur, choose(), __ATOMIC_RELAXED);
}

static uint64_t rd64le(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

/* slice-by-8 on the raw state (no inversion) */
static uint64_t crc_table(uint64_t r, const uint8_t *p, size_t n)
{
    for (; n && ((uintptr_t)p & 7); n--) r = tab[0][(r ^ *p++) & 0xff] ^ (r >> 8);
    for (; n >= 8; n -= 8, p += 8) {
        r ^= rd64le(p);
        r = tab[7][r & 0xff] ^ tab[6][(r >> 8) & 0xff] ^ tab[5][(r >> 16) & 0xff] ^
            tab[4][(r >> 24) & 0xff] ^ tab[3][(r >> 32) & 0xff] ^ tab[2][(r >> 40) & 0xff] ^
            tab[1][(r >> 48) & 0xff] ^ tab[0][r >> 56];
    }
    for (; n; n--) r = tab[0][(r ^ *p++) & 0xff] ^ (r >> 8);
    return r;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_CLMUL 1

#define T_PCL __attribute__((target("sse2,pclmul")))
#define T_Y __attribute__((target("avx2,vpclmulqdq,pclmul")))
#define T_Z __attribute__((target("avx512f,avx2,vpclmulqdq,pclmul")))

T_PCL static inline __m128i kx(int j) { return _mm_loadu_si128((const __m128i *)K[j]); }

T_PCL static inline __m128i fold(__m128i x, __m128i k)
{
    return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

T_PCL static inline __m128i ld(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }

/* x folded over the 16-byte blocks of p[0..n) (n a multiple of 16); the
 * raw state after them */
T_PCL static inline uint64_t tail16(__m128i x, const uint8_t *p, size_t n)
{
    const __m128i k1 = kx(1);
    for (; n; n -= 16, p += 16) x = _mm_xor_si128(fold(x, k1), ld(p));
    uint8_t b[16];
    _mm_storeu_si128((__m128i *)b, x);
    return crc_table(0, b, 16);
}

/* PCLMULQDQ, eight 128-bit registers: 128 bytes per iteration. n a
 * multiple of 16, at least 16. */
T_PCL static uint64_t crc_pclmul(uint64_t r, const uint8_t *p, size_t n)
{
    __m128i x = _mm_xor_si128(ld(p), _mm_cvtsi64_si128((long long)r));
    if (n < 128) return tail16(x, p + 16, n - 16);
    /* eight named registers: an array stays in memory at -O2 */
    __m128i a0 = x, a1 = ld(p + 16), a2 = ld(p + 32), a3 = ld(p + 48), a4 = ld(p + 64),
            a5 = ld(p + 80), a6 = ld(p + 96), a7 = ld(p + 112);
    p += 128, n -= 128;
    const __m128i k8 = kx(8);
    for (; n >= 128; n -= 128, p += 128) {
        a0 = _mm_xor_si128(fold(a0, k8), ld(p));
        a1 = _mm_xor_si128(fold(a1, k8), ld(p + 16));
        a2 = _mm_xor_si128(fold(a2, k8), ld(p + 32));
        a3 = _mm_xor_si128(fold(a3, k8), ld(p + 48));
        a4 = _mm_xor_si128(fold(a4, k8), ld(p + 64));
        a5 = _mm_xor_si128(fold(a5, k8), ld(p + 80));
        a6 = _mm_xor_si128(fold(a6, k8), ld(p + 96));
        a7 = _mm_xor_si128(fold(a7, k8), ld(p + 112));
    }
    x = _mm_xor_si128(_mm_xor_si128(_mm_xor_si128(a7, fold(a0, kx(7))),
                                    _mm_xor_si128(fold(a1, kx(6)), fold(a2, kx(5)))),
                      _mm_xor_si128(_mm_xor_si128(fold(a3, kx(4)), fold(a4, kx(3))),
                                    _mm_xor_si128(fold(a5, kx(2)), fold(a6, kx(1)))));
    return tail16(x, p, n);
}

T_Y static inline __m256i fold_y(__m256i x, __m256i k)
{
    return _mm256_xor_si256(_mm256_clmulepi64_epi128(x, k, 0x00),
                            _mm256_clmulepi64_epi128(x, k, 0x11));
}

T_Y static inline __m256i ky(int j) { return _mm256_broadcastsi128_si256(kx(j)); }
/* 32 bytes at p, also stored at d when copying (as ldz below) */
T_Y static inline __m256i ldy(const uint8_t *p, uint8_t *d, const int copy)
{
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    if (copy) _mm256_storeu_si256((__m256i *)d, v);
    return v;
}

/* the last 16-byte blocks folded onto y and copied to d when copying; the
 * raw state after them */
T_PCL static inline __attribute__((always_inline)) uint64_t
tail16c(__m128i y, const uint8_t *p, size_t n, uint8_t *d, const int copy)
{
    if (!copy) return tail16(y, p, n);
    const __m128i k1 = kx(1);
    for (; n; n -= 16, p += 16, d += 16) {
        __m128i v = ld(p);
        _mm_storeu_si128((__m128i *)d, v);
        y = _mm_xor_si128(fold(y, k1), v);
    }
    return tail16(y, p, 0);
}

/* VPCLMULQDQ on 256-bit registers, four of them: 128 bytes per iteration;
 * with copy, the bytes also stored to d (as avx512_body). n a multiple of
 * 16, at least 128. */
T_Y static inline __attribute__((always_inline)) uint64_t
avx2_body(uint64_t r, const uint8_t *p, size_t n, uint8_t *d, const int copy)
{
    __m256i a0 = _mm256_xor_si256(ldy(p, d, copy), _mm256_set_epi64x(0, 0, 0, (long long)r));
    __m256i a1 = ldy(p + 32, d + 32, copy), a2 = ldy(p + 64, d + 64, copy),
            a3 = ldy(p + 96, d + 96, copy);
    p += 128, d += 128, n -= 128;
    const __m256i k8 = ky(8);
    for (; n >= 128; n -= 128, p += 128, d += 128) {
        a0 = _mm256_xor_si256(fold_y(a0, k8), ldy(p, d, copy));
        a1 = _mm256_xor_si256(fold_y(a1, k8), ldy(p + 32, d + 32, copy));
        a2 = _mm256_xor_si256(fold_y(a2, k8), ldy(p + 64, d + 64, copy));
        a3 = _mm256_xor_si256(fold_y(a3, k8), ldy(p + 96, d + 96, copy));
    }
    __m256i x = _mm256_xor_si256(_mm256_xor_si256(a3, fold_y(a0, ky(6))),
                                 _mm256_xor_si256(fold_y(a1, ky(4)), fold_y(a2, ky(2))));
    for (const __m256i k2 = ky(2); n >= 32; n -= 32, p += 32, d += 32)
        x = _mm256_xor_si256(fold_y(x, k2), ldy(p, d, copy));
    __m128i y = _mm_xor_si128(_mm256_extracti128_si256(x, 1),
                              fold(_mm256_castsi256_si128(x), kx(1)));
    return tail16c(y, p, n, d, copy);
}

T_Y static uint64_t crc_avx2(uint64_t r, const uint8_t *p, size_t n)
{
    if (n < 128) return crc_pclmul(r, p, n);
    return avx2_body(r, p, n, (uint8_t *)(uintptr_t)p, 0);
}

T_Y static uint64_t crc_avx2_copy(uint64_t r, uint8_t *d, const uint8_t *p, size_t n)
{
    return avx2_body(r, p, n, d, 1);
}

T_Z static inline __m512i fold_z(__m512i x, __m512i k, __m512i d)
{
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00),
                                     _mm512_clmulepi64_epi128(x, k, 0x11), d, 0x96);
}

T_Z static inline __m512i kz(int j) { return _mm512_broadcast_i32x4(kx(j)); }
/* 64 bytes at p, also stored at d when copying (copy is a constant where
 * this is inlined: the store vanishes without it) */
T_Z static inline __m512i ldz(const uint8_t *p, uint8_t *d, const int copy)
{
    __m512i v = _mm512_loadu_si512(p);
    if (copy) _mm512_storeu_si512(d, v);
    return v;
}

/* VPCLMULQDQ on 512-bit registers, four of them: 256 bytes per iteration;
 * with copy, every byte is also stored to d as it is loaded (the stores
 * and the loads go beside the multiplies, which bound the loop). n a
 * multiple of 16, at least 256. */
T_Z static inline __attribute__((always_inline)) uint64_t
avx512_body(uint64_t r, const uint8_t *p, size_t n, uint8_t *d, const int copy)
{
    __m512i a0 = _mm512_xor_si512(ldz(p, d, copy),
                                  _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, (long long)r));
    __m512i a1 = ldz(p + 64, d + 64, copy), a2 = ldz(p + 128, d + 128, copy),
            a3 = ldz(p + 192, d + 192, copy);
    p += 256, d += 256, n -= 256;
    const __m512i k16 = kz(16);
    for (; n >= 256; n -= 256, p += 256, d += 256) {
        a0 = fold_z(a0, k16, ldz(p, d, copy));
        a1 = fold_z(a1, k16, ldz(p + 64, d + 64, copy));
        a2 = fold_z(a2, k16, ldz(p + 128, d + 128, copy));
        a3 = fold_z(a3, k16, ldz(p + 192, d + 192, copy));
    }
    const __m512i z = _mm512_setzero_si512();
    __m512i x = _mm512_ternarylogic_epi64(fold_z(a0, kz(12), z), fold_z(a1, kz(8), z),
                                          fold_z(a2, kz(4), a3), 0x96);
    for (const __m512i k4 = kz(4); n >= 64; n -= 64, p += 64, d += 64)
        x = fold_z(x, k4, ldz(p, d, copy));
    /* lanes 0..2 move forward by 384, 256, 128 bits onto lane 3 */
    __m512i kl = _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(z, kx(3), 0),
                                                         kx(2), 1), kx(1), 2);
    __m512i t = fold_z(x, kl, z);
    __m128i y = _mm_xor_si128(_mm_xor_si128(_mm512_extracti32x4_epi32(t, 0),
                                            _mm512_extracti32x4_epi32(t, 1)),
                              _mm_xor_si128(_mm512_extracti32x4_epi32(t, 2),
                                            _mm512_extracti32x4_epi32(x, 3)));
    return tail16c(y, p, n, d, copy);
}

T_Z static uint64_t crc_avx512(uint64_t r, const uint8_t *p, size_t n)
{
    if (n < 256) return crc_pclmul(r, p, n);
    return avx512_body(r, p, n, (uint8_t *)(uintptr_t)p, 0);
}

T_Z static uint64_t crc_avx512_copy(uint64_t r, uint8_t *d, const uint8_t *p, size_t n)
{
    return avx512_body(r, p, n, d, 1);
}
#endif

int lrmoe_crc64_path_ok(int path)
{
    if (path == LRMOE_CRC64_TABLE) return 1;
#ifdef HAVE_CLMUL
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("pclmul")) return 0;
    if (path == LRMOE_CRC64_PCLMUL) return 1;
    if (!__builtin_cpu_supports("vpclmulqdq")) return 0;
    if (path == LRMOE_CRC64_AVX2) return __builtin_cpu_supports("avx2");
    if (path == LRMOE_CRC64_AVX512) return __builtin_cpu_supports("avx512f");
#endif
    return 0;
}

static int choose(void)
{
    const char *e = getenv("LRMOE_NO_SIMD");
    if (e && *e && strcmp(e, "0") != 0) return LRMOE_CRC64_TABLE;
    for (int p = LRMOE_CRC64_NPATHS - 1; p > 0; p--)
        if (lrmoe_crc64_path_ok(p)) return p;
    return LRMOE_CRC64_TABLE;
}

const char *lrmoe_crc64_path_name(int path)
{
    static const char *const names[] = {"table", "pclmul", "avx2", "avx512"};
    return path >= 0 && path < LRMOE_CRC64_NPATHS ? names[path] : "?";
}

int lrmoe_crc64_path(void)
{
    pthread_once(&once, init);
    return __atomic_load_n(&path_cur, __ATOMIC_RELAXED);
}

int lrmoe_crc64_path_set(int path)
{
    pthread_once(&once, init);
    if (path < 0 || path >= LRMOE_CRC64_NPATHS || !lrmoe_crc64_path_ok(path))
        return lrmoe_err("crc64: this CPU cannot run the %s path", lrmoe_crc64_path_name(path));
    __atomic_store_n(&path_cur, path, __ATOMIC_RELAXED);
    return 0;
}

/* pieces shorter than this go to the table whole */
#define SIMD_MIN 64

uint64_t lrmoe_crc64_update(uint64_t crc, const void *data, size_t n)
{
    pthread_once(&once, init);
    const uint8_t *p = data;
    uint64_t r = ~crc;
#ifdef HAVE_CLMUL
    int path = __atomic_load_n(&path_cur, __ATOMIC_RELAXED);
    if (n >= SIMD_MIN && path != LRMOE_CRC64_TABLE) {
        size_t m = n & ~(size_t)15;
        r = path == LRMOE_CRC64_AVX512 ? crc_avx512(r, p, m)
          : path == LRMOE_CRC64_AVX2   ? crc_avx2(r, p, m)
                                       : crc_pclmul(r, p, m);
        p += m;
        n -= m;
    }
#endif
    return ~crc_table(r, p, n);
}

/* The CRC of A then B from crc(A), crc(B) and |B| (zlib's crc32_combine):
 * the CRC is linear, the all-ones start and end cancel between the two
 * (crc(A B) = crc(A) x^(8|B|) + crc(B) mod P, in the registers' reflected
 * form), so pieces hashed apart, in any order or on other threads, combine
 * in order. x^(8 n) by squaring: x^(2^k) for each bit k of 8 n. */
uint64_t lrmoe_crc64_combine(uint64_t crc_a, uint64_t crc_b, uint64_t len_b)
{
    pthread_once(&once, init);
    uint64_t p = 1ull << 63;   /* x^0 */
    for (int k = 3; len_b; len_b >>= 1, k++)
        if (len_b & 1) p = mulmodp(x2n[k], p);   /* k <= 66 */
    return mulmodp(p, crc_a) ^ crc_b;
}

uint64_t lrmoe_crc64_copy(uint64_t crc, void *dst, const void *src, size_t n)
{
    pthread_once(&once, init);
    uint8_t *d = dst;
    const uint8_t *p = src;
#ifdef HAVE_CLMUL
    int path = __atomic_load_n(&path_cur, __ATOMIC_RELAXED);
    if ((n >= 256 && path == LRMOE_CRC64_AVX512) || (n >= 128 && path == LRMOE_CRC64_AVX2)) {
        size_t m = n & ~(size_t)15;
        uint64_t r = path == LRMOE_CRC64_AVX512 ? crc_avx512_copy(~crc, d, p, m)
                                                : crc_avx2_copy(~crc, d, p, m);
        if (n > m) memcpy(d + m, p + m, n - m);
        return ~crc_table(r, d + m, n - m);
    }
#endif
    if (n) memcpy(d, p, n);
    return lrmoe_crc64_update(crc, d, n);
}
