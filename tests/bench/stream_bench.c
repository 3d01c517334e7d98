/* Stream write/read throughput on one realistic BF16 frame, through the
 * library calls the tools use. Driven by tests/bench/stream.sh.
 *   stream_bench gen MIB NFRAMES FILE   write a raw stream of NFRAMES frames
 *                                       of MIB MiB of BF16 activations
 *   stream_bench write FILE MODE IN     time writing IN's first frame to FILE
 *                                       (MODE raw | zstd:LEVEL:THREADS)
 *   stream_bench read FILE              time reading every frame of FILE
 *                                       ("seconds bytes cpu-seconds": the
 *                                       process's CPU time, all threads)
 *   stream_bench alt N SPEC...          read each SPEC (v:FILE checked, n:FILE
 *                                       as before records, x:FILE not at
 *                                       all) N times, rotated
 *                                       ("round spec seconds cpu-seconds")
 *   stream_bench copy IN OUT MODE DIG   rewrite IN as OUT (MODE as write),
 *                                       with (DIG 1) or without (0) digest
 *                                       records
 *   stream_bench par MIB                CRC-64 of MIB MiB (a 256 KiB buffer
 *                                       over and over) on one thread, then
 *                                       on two at once (each its own MIB):
 *                                       prints "t1 t2"; t2/t1 near 1 when a
 *                                       second core is free, near 2 when not
 *   stream_bench crc KIB                the checksums' speed on one KIB KiB
 *                                       buffer (in cache when it fits):
 *                                       "NAME GB/s" for XXH64, each CRC-64
 *                                       path this CPU runs, memcpy, memcpy
 *                                       then CRC-64, both in one pass
 *                                       (lrmoe_crc64_copy; on the default
 *                                       path, and crc64-copy-PATH on the
 *                                       other paths that have one)
 *   stream_bench copy IN OUT MODE DIG   (DIG: 0 none, 1 CRC-64 records,
 *                                       the default, 2 XXH64 records)
 * Timings go to stdout as "seconds bytes". */
#include <math.h>
#include <sys/resource.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lrmoe.h"
#include "xxh64.h"
#include "crc64.h"
#include "stream_internal.h"
#include "clock.h"

static uint64_t s = 0x9e3779b97f4a7c15ull;
static double unif(void)
{
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    return ((s >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static void die(void)
{
    fprintf(stderr, "stream_bench: %s\n", lrmoe_errmsg());
    exit(1);
}

static int64_t frame_bytes(const lrmoe_frame_t *f)
{
    int64_t n = 0;
    for (int i = 0; i < f->ntensors; i++) n += (int64_t)f->tensors[i]->nbytes;
    return n;
}

typedef struct { const uint8_t *p; size_t n; int reps; uint64_t h; } hjob_t;
static void *hash_job(void *a)
{
    hjob_t *j = a;
    for (int i = 0; i < j->reps; i++) j->h = lrmoe_crc64_update(j->h, j->p, j->n);
    return NULL;
}

/* the best of 7 runs of enough calls for ~20 ms each: GB/s of path (a
 * CRC-64 path), or XXH64 (-1), memcpy to d (-2), memcpy then CRC-64 of the
 * copy (-3), lrmoe_crc64_copy (-4) */
static uint8_t *d;
static double rate(int path, const uint8_t *p, size_t n)
{
    static volatile uint64_t sink;
    size_t reps = (size_t)(20e6 / (double)n) + 1;
    double best = 1e30;
    for (int k = 0; k < 7; k++) {
        double t0 = lrmoe_now();
        uint64_t h = 0;
        for (size_t i = 0; i < reps; i++)
            switch (path) {
            case -1: h ^= lrmoe_xxh64(p, n); break;
            case -2: memcpy(d, p, n); h ^= d[i % n]; break;
            case -3: memcpy(d, p, n); h = lrmoe_crc64_update(h, d, n); break;
            case -4: h = lrmoe_crc64_copy(h, d, p, n); break;
            default: h = lrmoe_crc64_update(h, p, n);
            }
        double t = lrmoe_now() - t0;
        sink = h;
        if (t < best) best = t;
    }
    return (double)n * (double)reps / best / 1e9;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "crc")) {
        size_t n = (size_t)atoll(argv[2]) << 10;
        uint8_t *a = malloc(n);
        d = malloc(n);
        if (!a || !d) return 1;
        for (size_t i = 0; i < n; i++) a[i] = (uint8_t)(unif() * 256);
        printf("xxh64 %.2f\n", rate(-1, a, n));
        int def = lrmoe_crc64_path();
        for (int p = 0; p < LRMOE_CRC64_NPATHS; p++)
            if (lrmoe_crc64_path_set(p) == 0)
                printf("crc64-%s %.2f%s\n", lrmoe_crc64_path_name(p), rate(p, a, n),
                       p == def ? " (default)" : "");
        for (int p = LRMOE_CRC64_AVX2; p < LRMOE_CRC64_NPATHS; p++)
            if (p != def && lrmoe_crc64_path_set(p) == 0)
                printf("crc64-copy-%s %.2f\n", lrmoe_crc64_path_name(p), rate(-4, a, n));
        lrmoe_crc64_path_set(def);
        printf("memcpy %.2f\nmemcpy+crc64 %.2f\ncrc64-copy %.2f\n", rate(-2, a, n), rate(-3, a, n),
               rate(-4, a, n));
        free(a);
        free(d);
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "par")) {
        /* MIB MiB as a 256 KiB buffer hashed again and again: in each
         * core's own cache, so that two threads measure whether there are
         * two cores, not the memory's bandwidth */
        size_t n = 256u << 10;
        int reps = (int)(atoll(argv[2]) * 4);
        uint8_t *a = malloc(n), *b = malloc(n);
        if (!a || !b || reps < 1) return 1;
        memset(a, 1, n);
        memset(b, 2, n);
        hjob_t ja = {a, n, reps, 0}, jb = {b, n, reps, 0};
        hash_job(&ja);      /* warm */
        double t0 = lrmoe_now();
        hash_job(&ja);
        double t1 = lrmoe_now();
        pthread_t t;
        if (pthread_create(&t, NULL, hash_job, &jb) != 0) return 1;
        hash_job(&ja);
        pthread_join(t, NULL);
        double t2 = lrmoe_now();
        static volatile uint64_t sink;
        sink = ja.h ^ jb.h;
        printf("%.6f %.6f\n", t1 - t0, t2 - t1);
        free(a);
        free(b);
        return 0;
    }
    if (argc == 6 && !strcmp(argv[1], "gen")) {
        /* hidden-like activations: per-row scale times N(0,1), rounded to BF16 */
        int64_t mib = atoll(argv[2]), nf = atoll(argv[3]), D = 2048;
        int64_t T = mib * 1024 * 1024 / 2 / D;
        lrmoe_wopts_t o = {0, 3, 0};
        lrmoe_writer_t *w = lrmoe_writer_open(argv[5], &o);
        if (!w) die();
        (void)argv[4];
        for (int64_t k = 0; k < nf; k++) {
            lrmoe_frame_t f;
            lrmoe_frame_init(&f);
            int64_t shape[2] = {T, D};
            lrmoe_tensor_t *t = lrmoe_frame_put(&f, "hidden", LRMOE_BF16, 2, shape);
            if (!t) die();
            uint16_t *p = t->data;
            for (int64_t r = 0; r < T; r++) {
                double scale = exp(0.5 * (unif() - 0.5));
                for (int64_t c = 0; c < D; c += 2) {
                    double u1 = unif(), u2 = unif(), m = sqrt(-2 * log(u1)) * scale;
                    p[r * D + c] = lrmoe_f32_to_bf16((float)(m * cos(6.283185307179586 * u2)));
                    p[r * D + c + 1] = lrmoe_f32_to_bf16((float)(m * sin(6.283185307179586 * u2)));
                }
            }
            lrmoe_frame_set_attrf(&f, "layer", "%lld", (long long)k);
            if (lrmoe_writer_write(w, &f) < 0) die();
            lrmoe_frame_clear(&f);
        }
        if (lrmoe_writer_close(w) < 0) die();
        return 0;
    }
    if (argc == 5 && !strcmp(argv[1], "write")) {
        lrmoe_reader_t *r = lrmoe_reader_open(argv[4]);
        lrmoe_frame_t f;
        lrmoe_frame_init(&f);
        if (!r || lrmoe_reader_next(r, &f) != 1) die();
        lrmoe_reader_close(r);
        lrmoe_wopts_t o = {0, 3, 0};
        if (strncmp(argv[3], "raw", 3)) {
            o.compress = 1;
            if (sscanf(argv[3], "zstd:%d:%d", &o.level, &o.threads) != 2) return 2;
        }
        double t0 = lrmoe_now();
        lrmoe_writer_t *w = lrmoe_writer_open(argv[2], &o);
        if (!w || lrmoe_writer_write(w, &f) < 0 || lrmoe_writer_close(w) < 0) die();
        printf("%.6f %lld\n", lrmoe_now() - t0, (long long)frame_bytes(&f));
        lrmoe_frame_clear(&f);
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "read")) {
        struct rusage u0, u1;
        getrusage(RUSAGE_SELF, &u0);
        double t0 = lrmoe_now();
        lrmoe_reader_t *r = lrmoe_reader_open(argv[2]);
        lrmoe_frame_t f;
        lrmoe_frame_init(&f);
        int64_t bytes = 0;
        int rc;
        if (!r) die();
        while ((rc = lrmoe_reader_next(r, &f)) == 1) bytes += frame_bytes(&f);
        if (rc < 0) die();
        lrmoe_reader_close(r);
        lrmoe_frame_clear(&f);
        double t = lrmoe_now() - t0;
        getrusage(RUSAGE_SELF, &u1);
#define TV(x) ((double)(x).tv_sec + (double)(x).tv_usec * 1e-6)
        double cpu = TV(u1.ru_utime) - TV(u0.ru_utime) + TV(u1.ru_stime) - TV(u0.ru_stime);
        printf("%.6f %lld %.6f\n", t, (long long)bytes, cpu);
        return 0;
    }
    if (argc >= 4 && !strcmp(argv[1], "alt")) {
        /* alt N SPEC...: each SPEC read N times in one process, in rotated
         * order (round i starts at SPEC i mod count, so none always follows
         * the same one); SPEC is M:FILE, M v (records checked: a reader),
         * n (the reader before records: lrmoe_reader_set_verify(r, 0)) or
         * x (no check at all: lrmoe_reader_set_verify(r, -1)).
         * Prints each read as "round spec seconds cpu-seconds" (cpu: the
         * process's, all threads). */
        int n = atoi(argv[2]), ns = argc - 3;
        if (n < 1) return 2;
        for (int k = 0; k < ns; k++)
            if (strlen(argv[3 + k]) < 3 || argv[3 + k][1] != ':' || !strchr("vnx", argv[3 + k][0]))
                return 2;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < ns; j++) {
                int k = (i + j) % ns;
                const char *spec = argv[3 + k];
                struct rusage u0, u1;
                getrusage(RUSAGE_SELF, &u0);
                double t0 = lrmoe_now();
                lrmoe_reader_t *r = lrmoe_reader_open(spec + 2);
                lrmoe_frame_t f;
                lrmoe_frame_init(&f);
                int rc;
                if (!r) die();
                lrmoe_reader_set_verify(r, spec[0] == 'v' ? 1 : spec[0] == 'n' ? 0 : -1);
                while ((rc = lrmoe_reader_next(r, &f)) == 1) continue;
                if (rc < 0) die();
                lrmoe_reader_close(r);
                lrmoe_frame_clear(&f);
                double t = lrmoe_now() - t0;
                getrusage(RUSAGE_SELF, &u1);
                double cpu = TV(u1.ru_utime) - TV(u0.ru_utime) + TV(u1.ru_stime) - TV(u0.ru_stime);
                printf("%d %d %.6f %.6f\n", i, k, t, cpu);
            }
        return 0;
    }
    if (argc == 6 && !strcmp(argv[1], "copy")) {
        lrmoe_wopts_t o = {0, 3, 0};
        if (strncmp(argv[4], "raw", 3)) {
            o.compress = 1;
            if (sscanf(argv[4], "zstd:%d:%d", &o.level, &o.threads) != 2) return 2;
        }
        lrmoe_reader_t *r = lrmoe_reader_open(argv[2]);
        lrmoe_writer_t *w = r ? lrmoe_writer_open(argv[3], &o) : NULL;
        if (!w) die();
        lrmoe_writer_set_digests(w, atoi(argv[5]));
        lrmoe_frame_t f;
        lrmoe_frame_init(&f);
        int rc;
        while ((rc = lrmoe_reader_next(r, &f)) == 1)
            if (lrmoe_writer_write(w, &f) < 0) die();
        if (rc < 0 || lrmoe_writer_close(w) < 0) die();
        lrmoe_reader_close(r);
        lrmoe_frame_clear(&f);
        return 0;
    }
    fprintf(stderr, "usage: stream_bench gen MIB NFRAMES - FILE | write FILE MODE IN | read FILE | crc KIB | par MIB | "
            "copy IN OUT MODE DIGESTS | alt N v:FILE|n:FILE|x:FILE...\n");
    return 2;
}
