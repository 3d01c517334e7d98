/* stream_verify_test: lrmoe_reader_set_verify(r, 0), the reader "as before
 * digest records" that tests/bench/stream_digest.sh measures the records'
 * cost against, does what the bench assumes, and a checking reader still
 * checks. On one stream of three frames (frame 1 of random bytes, so that
 * zstd stores them), raw and zstd level 1, with CRC-64 and XXH64 records:
 *   intact: both readers read every frame, byte for byte what was written;
 *   one bit of frame 1's data flipped:
 *     the checking reader stops at frame 1 with "digest mismatch", having
 *     returned frame 0 only;
 *     raw, not checking: all three frames come back, frame 1 with the flip
 *     (no check at all, as raw streams had before records);
 *     zstd, not checking: zstd's own content checksum, which a record makes
 *     the checking reader skip, is checked again: an error, never a clean
 *     end (at the end of zstd's frame, here the whole stream, after every
 *     lrmoe frame was returned: what the records fixed).
 *   stream_verify_test DIR   (a directory for the streams)
 * prints one line per case and "stream_verify: N cases, F failed". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lrmoe.h"
#include "stream_internal.h"

#define N1 (300 * 1024 + 5)

static uint64_t s = 0x9E3779B97F4A7C15ull;
static uint8_t rnd8(void)
{
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return (uint8_t)(s >> 24);
}

static int write_stream(const char *path, int zstd, int digest)
{
    lrmoe_wopts_t o;
    lrmoe_wopts_default(&o);
    o.compress = zstd;
    o.level = 1;
    o.threads = 0;
    lrmoe_writer_t *w = lrmoe_writer_open(path, &o);
    if (!w) return -1;
    lrmoe_writer_set_digests(w, digest);
    s = 0x9E3779B97F4A7C15ull;
    for (int k = 0; k < 3; k++) {
        lrmoe_frame_t f;
        lrmoe_frame_init(&f);
        int64_t shape[1] = {k == 1 ? N1 : 64};
        lrmoe_tensor_t *t = lrmoe_frame_put(&f, "a", LRMOE_U8, 1, shape);
        if (!t) return -1;
        for (int64_t i = 0; i < shape[0]; i++) ((uint8_t *)t->data)[i] = rnd8();
        lrmoe_frame_set_attrf(&f, "step", "%d", k);
        if (lrmoe_writer_write(w, &f) < 0) return -1;
        lrmoe_frame_clear(&f);
    }
    return lrmoe_writer_close(w);
}

/* Read path: frames returned, the last call's result (1 never: 0 clean
 * end, -1 error), and whether frame 1's bytes equal want1 */
static int read_all(const char *path, int verify, int *nframes, int *same1, const uint8_t *want1)
{
    lrmoe_reader_t *r = lrmoe_reader_open(path);
    if (!r) return -2;
    lrmoe_reader_set_verify(r, verify);
    lrmoe_frame_t f;
    lrmoe_frame_init(&f);
    int rc;
    *nframes = 0;
    *same1 = -1;
    while ((rc = lrmoe_reader_next(r, &f)) == 1) {
        if (*nframes == 1) *same1 = f.ntensors == 1 && f.tensors[0]->nbytes == N1 &&
                                    !memcmp(f.tensors[0]->data, want1, N1);
        (*nframes)++;
    }
    lrmoe_frame_clear(&f);
    lrmoe_reader_close(r);
    return rc;
}

/* Flip one bit of the first occurrence of frame 1's bytes at offset k in the
 * file (raw: the data itself; zstd: its stored copy) */
static int flip(const char *path, const uint8_t *want1, size_t k)
{
    FILE *fp = fopen(path, "r+b");
    if (!fp) return -1;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    uint8_t *b = malloc((size_t)n);
    rewind(fp);
    if (!b || fread(b, 1, (size_t)n, fp) != (size_t)n) return -1;
    long at = -1;
    for (long i = 0; i + 32 <= n; i++)
        if (!memcmp(b + i, want1 + k, 32)) { at = i; break; }
    if (at < 0) return -1;
    b[at] ^= 4;
    fseek(fp, at, SEEK_SET);
    fputc(b[at], fp);
    free(b);
    return fclose(fp);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: stream_verify_test DIR\n");
        return 2;
    }
    uint8_t *want1 = malloc(N1);
    if (!want1) return 1;
    s = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 64; i++) rnd8();
    for (int i = 0; i < N1; i++) want1[i] = rnd8();
    int cases = 0, failed = 0;
    char path[4096];
    for (int zstd = 0; zstd < 2; zstd++)
        for (int dg = LRMOE_DIGEST_CRC64; dg <= LRMOE_DIGEST_XXH64; dg++) {
            const char *name = zstd ? "zstd" : "raw";
            const char *kind = dg == LRMOE_DIGEST_CRC64 ? "CRC-64" : "XXH64";
            snprintf(path, sizeof path, "%s/s.%s.%d", argv[1], name, dg);
            if (write_stream(path, zstd, dg) < 0) {
                printf("FAIL %s %s: write: %s\n", name, kind, lrmoe_errmsg());
                failed++;
                continue;
            }
            for (int v = 1; v >= 0; v--) {
                int nf, same, rc = read_all(path, v, &nf, &same, want1);
                cases++;
                int ok = rc == 0 && nf == 3 && same == 1;
                printf("%s %s %s, %s: intact: %d frames, rc %d\n", ok ? "ok  " : "FAIL", name, kind,
                       v ? "checked" : "not checked", nf, rc);
                failed += !ok;
            }
            if (flip(path, want1, N1 / 2) < 0) {
                printf("FAIL %s %s: frame 1's bytes not found in the file\n", name, kind);
                failed++;
                continue;
            }
            for (int v = 1; v >= 0; v--) {
                int nf, same, rc = read_all(path, v, &nf, &same, want1);
                const char *msg = rc < 0 ? lrmoe_errmsg() : "";
                int ok;
                if (v) ok = rc == -1 && nf == 1 && strstr(msg, "frame 1: digest mismatch");
                else if (!zstd) ok = rc == 0 && nf == 3 && same == 0;
                else ok = rc == -1 && strstr(msg, "zstd: Restored data doesn't match checksum");
                cases++;
                printf("%s %s %s, %s: flipped: %d frames, rc %d%s%s\n", ok ? "ok  " : "FAIL", name,
                       kind, v ? "checked" : "not checked", nf, rc, *msg ? ": " : "", msg);
                failed += !ok;
            }
        }
    printf("stream_verify: %d cases, %d failed\n", cases, failed);
    free(want1);
    return failed != 0;
}
