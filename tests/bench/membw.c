/* One thread's memory bandwidth (the roofline of tests/bench/cpu.sh's GEMM
 * table): how fast this thread streams a buffer the size of the expert
 * layer's weights from memory, and writes one the size of its weight
 * gradients with non-temporal stores. Buffers are allocated, pre-faulted
 * (written once) and then each pass is timed with the calling thread's CPU
 * clock (like lrmoe-exec --clock cpu); each figure is the best of REPS passes.
 *
 * usage: membw READ_BYTES WRITE_BYTES [REPS]
 * Prints a TSV, one row per pattern (columns: test, read_bytes, write_bytes,
 * s, GB_s; GB = 1e9 bytes, read + written bytes over s):
 *   read          plain 64-byte loads, one stream
 *   read_pf<D>    loads with a software prefetch (L2 hint) D KiB ahead
 *   read_s<S>     S streams read in lockstep (S equal parts of the buffer,
 *                 one line of each in turn: a GEMM reading S weight rows),
 *                 each with a prefetch 4 KiB ahead
 *   ntwrite       non-temporal 64-byte stores, then sfence
 *   write         plain stores (read for ownership: the line is fetched)
 *   mix           the backward's pattern: reads and non-temporal writes
 *                 interleaved in the ratio READ_BYTES : WRITE_BYTES
 *                 (read prefetched 4 KiB ahead)
 * A best_read row repeats the fastest read row, best_write the faster of
 * ntwrite and write.
 * Without AVX-512 at build or run time, 16-byte SSE2 loads and stores. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define X86 1
#endif

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int avx512;
static volatile uint64_t sink;

#ifdef X86
/* sum of the 64-byte lines [p, p+n), prefetching pf bytes ahead (0: none) */
__attribute__((target("avx512f"))) static uint64_t rd512(const char *p, size_t n, size_t pf)
{
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n; i += 256) {
        if (pf) {
            _mm_prefetch(p + i + pf, _MM_HINT_T1);
            _mm_prefetch(p + i + pf + 64, _MM_HINT_T1);
            _mm_prefetch(p + i + pf + 128, _MM_HINT_T1);
            _mm_prefetch(p + i + pf + 192, _MM_HINT_T1);
        }
        a0 = _mm512_add_epi64(a0, _mm512_load_si512((const void *)(p + i)));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512((const void *)(p + i + 64)));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512((const void *)(p + i + 128)));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512((const void *)(p + i + 192)));
    }
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1),
                                                              _mm512_add_epi64(a2, a3)));
}

static uint64_t rd128(const char *p, size_t n, size_t pf)
{
    __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n; i += 64) {
        if (pf) _mm_prefetch(p + i + pf, _MM_HINT_T1);
        a0 = _mm_add_epi64(a0, _mm_load_si128((const __m128i *)(p + i)));
        a1 = _mm_add_epi64(a1, _mm_load_si128((const __m128i *)(p + i + 16)));
        a2 = _mm_add_epi64(a2, _mm_load_si128((const __m128i *)(p + i + 32)));
        a3 = _mm_add_epi64(a3, _mm_load_si128((const __m128i *)(p + i + 48)));
    }
    a0 = _mm_add_epi64(_mm_add_epi64(a0, a1), _mm_add_epi64(a2, a3));
    return (uint64_t)_mm_cvtsi128_si64(a0) + (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(a0, a0));
}

/* S lockstep streams over S equal parts of [p, p+n), 64 bytes each in turn */
__attribute__((target("avx512f"))) static uint64_t rds512(const char *p, size_t n, int S)
{
    const size_t part = n / (size_t)S / 64 * 64;
    __m512i a = _mm512_setzero_si512();
    for (size_t i = 0; i < part; i += 64)
        for (int s = 0; s < S; s++) {
            const char *q = p + (size_t)s * part + i;
            _mm_prefetch(q + 4096, _MM_HINT_T1);
            a = _mm512_add_epi64(a, _mm512_load_si512((const void *)q));
        }
    return (uint64_t)_mm512_reduce_add_epi64(a);
}

static uint64_t rds128(const char *p, size_t n, int S)
{
    const size_t part = n / (size_t)S / 64 * 64;
    __m128i a = _mm_setzero_si128();
    for (size_t i = 0; i < part; i += 64)
        for (int s = 0; s < S; s++) {
            const char *q = p + (size_t)s * part + i;
            _mm_prefetch(q + 4096, _MM_HINT_T1);
            a = _mm_add_epi64(a, _mm_load_si128((const __m128i *)q));
            a = _mm_add_epi64(a, _mm_load_si128((const __m128i *)(q + 16)));
            a = _mm_add_epi64(a, _mm_load_si128((const __m128i *)(q + 32)));
            a = _mm_add_epi64(a, _mm_load_si128((const __m128i *)(q + 48)));
        }
    return (uint64_t)_mm_cvtsi128_si64(a);
}

/* 64-byte lines [p, p+n) written with value v: non-temporal (nt) or plain */
__attribute__((target("avx512f"))) static void wr512(char *p, size_t n, int nt, uint64_t v)
{
    const __m512i x = _mm512_set1_epi64((long long)v);
    if (nt)
        for (size_t i = 0; i < n; i += 64) _mm512_stream_si512((void *)(p + i), x);
    else
        for (size_t i = 0; i < n; i += 64) _mm512_store_si512((void *)(p + i), x);
    _mm_sfence();
}

static void wr128(char *p, size_t n, int nt, uint64_t v)
{
    const __m128i x = _mm_set1_epi64x((long long)v);
    for (size_t i = 0; i < n; i += 16) {
        if (nt) _mm_stream_si128((__m128i *)(p + i), x);
        else _mm_store_si128((__m128i *)(p + i), x);
    }
    _mm_sfence();
}

static uint64_t rd(const char *p, size_t n, size_t pf)
{
    return avx512 ? rd512(p, n, pf) : rd128(p, n, pf);
}

static uint64_t rds(const char *p, size_t n, int S)
{
    return avx512 ? rds512(p, n, S) : rds128(p, n, S);
}

static void wr(char *p, size_t n, int nt, uint64_t v)
{
    if (avx512) wr512(p, n, nt, v);
    else wr128(p, n, nt, v);
}
#else
static uint64_t rd(const char *p, size_t n, size_t pf)
{
    (void)pf;
    uint64_t s = 0;
    for (size_t i = 0; i < n; i += 8) s += *(const uint64_t *)(p + i);
    return s;
}

static uint64_t rds(const char *p, size_t n, int S)
{
    const size_t part = n / (size_t)S / 64 * 64;
    uint64_t a = 0;
    for (size_t i = 0; i < part; i += 64)
        for (int s = 0; s < S; s++)
            for (int j = 0; j < 64; j += 8) a += *(const uint64_t *)(p + (size_t)s * part + i + j);
    return a;
}

static void wr(char *p, size_t n, int nt, uint64_t v)
{
    (void)nt;
    for (size_t i = 0; i < n; i += 8) *(uint64_t *)(p + i) = v;
}
#endif

/* the backward's pattern: chunks of the read buffer and of the write buffer
 * in turn, in proportion to their sizes */
static uint64_t mix(const char *r, size_t nr, char *w, size_t nw)
{
    const size_t rc = 16384, wc = nr ? (size_t)((double)rc * (double)nw / (double)nr) / 64 * 64 : nw;
    uint64_t s = 0;
    size_t i = 0, j = 0;
    while (i < nr || j < nw) {
        if (i < nr) {
            size_t k = nr - i < rc ? nr - i : rc;
            s += rd(r + i, k, 4096);
            i += k;
        }
        if (j < nw) {
            size_t k = nw - j < wc || !wc ? nw - j : wc;
            wr(w + j, k, 1, s);
            j += k;
        }
    }
    return s;
}

static void row(const char *test, size_t nr, size_t nw, double s)
{
    printf("%s\t%zu\t%zu\t%.6f\t%.3f\n", test, nr, nw, s, (double)(nr + nw) / s / 1e9);
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: membw READ_BYTES WRITE_BYTES [REPS]\n");
        return 2;
    }
    const size_t pad = 65536;   /* prefetches past the end stay in the buffer */
    size_t nr = (size_t)strtoull(argv[1], NULL, 10) / 4096 * 4096;
    size_t nw = (size_t)strtoull(argv[2], NULL, 10) / 4096 * 4096;
    int reps = argc == 4 ? atoi(argv[3]) : 3;
    if (nr < 4096 || nw < 4096 || reps < 1) {
        fprintf(stderr, "membw: sizes must be at least 4096 bytes, REPS at least 1\n");
        return 2;
    }
#ifdef X86
    __builtin_cpu_init();
    avx512 = __builtin_cpu_supports("avx512f");
#endif
    char *r = NULL, *w = NULL;
    if (posix_memalign((void **)&r, 4096, nr + pad) || posix_memalign((void **)&w, 4096, nw + pad)) {
        fprintf(stderr, "membw: out of memory (%zu + %zu bytes)\n", nr, nw);
        return 1;
    }
    for (size_t i = 0; i < nr + pad; i += 8) *(uint64_t *)(r + i) = i;   /* fault in */
    memset(w, 1, nw + pad);
    printf("test\tread_bytes\twrite_bytes\ts\tGB_s\n");
    static const size_t pfs[] = {1024, 4096, 16384};
    static const int ss[] = {4, 16, 32};
    double best_r = 1e30, best_w = 1e30;
    char name[32];
    for (int t = 0; t < 10; t++) {
        double best = 1e30;
        for (int k = 0; k < reps; k++) {
            double t0 = now();
            if (t == 0) sink += rd(r, nr, 0);
            else if (t <= 3) sink += rd(r, nr, pfs[t - 1]);
            else if (t <= 6) sink += rds(r, nr, ss[t - 4]);
            else if (t == 7) wr(w, nw, 1, (uint64_t)k);
            else if (t == 8) wr(w, nw, 0, (uint64_t)k);
            else sink += mix(r, nr, w, nw);
            double dt = now() - t0;
            if (dt < best) best = dt;
        }
        if (t == 0) snprintf(name, sizeof name, "read");
        else if (t <= 3) snprintf(name, sizeof name, "read_pf%zu", pfs[t - 1] / 1024);
        else if (t <= 6) snprintf(name, sizeof name, "read_s%d", ss[t - 4]);
        else snprintf(name, sizeof name, "%s", t == 7 ? "ntwrite" : t == 8 ? "write" : "mix");
        if (t <= 6 && best < best_r) best_r = best;
        if ((t == 7 || t == 8) && best < best_w) best_w = best;
        row(name, t <= 6 || t == 9 ? nr : 0, t >= 7 ? nw : 0, best);
    }
    row("best_read", nr, 0, best_r);
    row("best_write", 0, nw, best_w);
    free(r);
    free(w);
    return 0;
}
