/* crc64_test: every CRC-64/NVME path this CPU can run (lib/crc64.c) against
 * a bitwise reference written from the CRC's definition, on all lengths up
 * to 1100 bytes, random lengths up to 300 KiB, random alignments and random
 * splits into pieces; and the catalogue's check value. lrmoe_crc64_copy
 * too: the same CRC, and the bytes copied, nothing written around them.
 *   crc64_test [quick|full] [SEED]
 * prints the paths run and skipped, then "crc64: N cases, F failed". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "crc64.h"
#include "crc64_par.h"
#include "lrmoe.h"

/* reflected 0xAD93D23594C93659, written out, not computed */
#define PREF 0x9A6C9329AC4BC9B5ull

static uint64_t ref(uint64_t crc, const uint8_t *p, size_t n)
{
    uint64_t r = ~crc;
    for (size_t i = 0; i < n; i++) {
        r ^= p[i];
        for (int k = 0; k < 8; k++) r = r & 1 ? (r >> 1) ^ PREF : r >> 1;
    }
    return ~r;
}

static uint64_t s = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void)
{
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    return s;
}

int main(int argc, char **argv)
{
    int full = argc > 1 && !strcmp(argv[1], "full");
    if (argc > 2) s = strtoull(argv[2], NULL, 0) | 1;
    size_t cap = (300u << 10) + 128;
    uint8_t *buf = malloc(cap), *dst = malloc(cap + 128);
    if (!buf || !dst) return 1;
    for (size_t i = 0; i < cap; i++) buf[i] = (uint8_t)rnd();
    int cases = 0, failed = 0;
    int def = lrmoe_crc64_path();
    printf("crc64: default path %s\n", lrmoe_crc64_path_name(def));
    for (int path = 0; path < LRMOE_CRC64_NPATHS; path++) {
        if (lrmoe_crc64_path_set(path) < 0) {
            printf("crc64: path %s skipped: %s\n", lrmoe_crc64_path_name(path), lrmoe_errmsg());
            continue;
        }
        int f0 = failed;
        /* the catalogue's check value */
        cases++;
        if (lrmoe_crc64_update(0, "123456789", 9) != 0xAE8B14860A799888ull) {
            printf("FAIL %s: check value %016llx\n", lrmoe_crc64_path_name(path),
                   (unsigned long long)lrmoe_crc64_update(0, "123456789", 9));
            failed++;
        }
        int nrand = full ? 3000 : 150;
        for (int c = 0; c < 1100 + nrand; c++) {
            size_t n = c < 1100 ? (size_t)c : (size_t)(rnd() % (cap - 128));
            size_t off = rnd() % 64;
            uint64_t seed = rnd() % 4 ? 0 : rnd();   /* a continued CRC now and then */
            uint64_t want = ref(seed, buf + off, n);
            uint64_t got = lrmoe_crc64_update(seed, buf + off, n);
            /* the same bytes in random pieces */
            uint64_t pc = seed;
            for (size_t at = 0; at < n;) {
                size_t k = rnd() % 3 == 0 ? rnd() % 17 : rnd() % (n - at + 1);
                if (k > n - at) k = n - at;
                pc = lrmoe_crc64_update(pc, buf + off + at, k);
                at += k;
            }
            /* copy and CRC in one: to another alignment, the bytes around
             * the copy untouched */
            size_t doff = rnd() % 64;
            memset(dst, 0xA5, cap + 128);
            uint64_t cc = lrmoe_crc64_copy(seed, dst + doff, buf + off, n);
            int copied = !memcmp(dst + doff, buf + off, n);
            for (size_t i = 0; i < doff; i++) copied &= dst[i] == 0xA5;
            for (size_t i = doff + n; i < doff + n + 64; i++) copied &= dst[i] == 0xA5;
            cases++;
            if (cc != want || !copied) {
                if (failed - f0 < 5)
                    printf("FAIL %s copy: n=%zu off=%zu doff=%zu: %016llx want %016llx, bytes %s\n",
                           lrmoe_crc64_path_name(path), n, off, doff, (unsigned long long)cc,
                           (unsigned long long)want, copied ? "ok" : "wrong");
                failed++;
            }
            cases++;
            if (got != want || pc != want) {
                if (failed - f0 < 5)
                    printf("FAIL %s: n=%zu off=%zu seed=%016llx: whole %016llx pieces %016llx "
                           "want %016llx\n", lrmoe_crc64_path_name(path), n, off,
                           (unsigned long long)seed, (unsigned long long)got,
                           (unsigned long long)pc, (unsigned long long)want);
                failed++;
            }
        }
        printf("crc64: path %s run: %d failed\n", lrmoe_crc64_path_name(path), failed - f0);
    }
    /* combining pieces' CRCs: A then B split at every kind of point (empty
     * A or B among them) against the reference over A B; and, for lengths
     * no buffer here holds (up to 2^62 bytes), the combination's own law:
     * (a b) c = a (b c) with |b c| = |b| + |c| */
    int f1 = failed;
    for (int c = 0; c < (full ? 3000 : 300); c++) {
        size_t n = c < 40 ? (size_t)c : (size_t)(rnd() % (cap - 128));
        size_t a = c < 40 ? (size_t)(rnd() % (n + 1)) : c % 3 == 0 ? 0 : c % 3 == 1 ? n
                 : (size_t)(rnd() % (n + 1));
        uint64_t ca = ref(0, buf, a), cb = ref(0, buf + a, n - a);
        cases++;
        if (lrmoe_crc64_combine(ca, cb, n - a) != ref(0, buf, n)) {
            if (failed - f1 < 5)
                printf("FAIL combine: n=%zu split %zu: %016llx want %016llx\n", n, a,
                       (unsigned long long)lrmoe_crc64_combine(ca, cb, n - a),
                       (unsigned long long)ref(0, buf, n));
            failed++;
        }
    }
    for (int c = 0; c < 200; c++) {
        uint64_t a = rnd(), b = rnd(), d = rnd(), lb = rnd() >> (2 + rnd() % 62),
                 ld = rnd() >> (2 + rnd() % 62);
        cases++;
        if (lrmoe_crc64_combine(lrmoe_crc64_combine(a, b, lb), d, ld) !=
            lrmoe_crc64_combine(a, lrmoe_crc64_combine(b, d, ld), lb + ld)) {
            if (failed - f1 < 5)
                printf("FAIL combine law: |b| %llu |c| %llu\n", (unsigned long long)lb,
                       (unsigned long long)ld);
            failed++;
        }
    }
    printf("crc64: combine: %d failed\n", failed - f1);
    /* lrmoe_crc64_par: the same CRC on 1, 2, 3 and 7 threads, pieces of at
     * least 1 byte, 4 KiB and 64 KiB, continued CRCs now and then */
    int f2 = failed;
    static const int th[] = {1, 2, 3, 7};
    static const size_t pc[] = {1, 4096, 65536};
    for (int t = 0; t < 4; t++)
        for (int q = 0; q < 3; q++)
            for (int c = 0; c < 20; c++) {
                size_t n = c < 4 ? (size_t)c : (size_t)(rnd() % (cap - 128));
                uint64_t seed = c % 2 ? rnd() : 0, want = ref(seed, buf, n),
                         got = lrmoe_crc64_par(seed, buf, n, th[t], pc[q]);
                cases++;
                if (got != want) {
                    if (failed - f2 < 5)
                        printf("FAIL par: threads %d piece %zu n=%zu: %016llx want %016llx\n", th[t],
                               pc[q], n, (unsigned long long)got, (unsigned long long)want);
                    failed++;
                }
            }
    printf("crc64: threads: %d failed\n", failed - f2);
    printf("crc64: %d cases, %d failed\n", cases, failed);
    free(buf);
    free(dst);
    return failed != 0;
}
