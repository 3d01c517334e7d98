/* weights_map_test: a mapped weights stream's digest records are checked
 * whatever the threads and pieces (lib/weights_map.c: each frame's CRC-64
 * cut into pieces hashed on several threads and combined), each frame's
 * at its first use (lrmoe_weights_map_check) and that frame's alone. On a
 * raw weights stream of three layer frames (w_gate, w_up, w_down of random
 * BF16 bits, E=4 F=24 D=40 and one frame of E=5), written here with CRC-64
 * records, again with XXH64 ones (hashed on one thread) and again with
 * CRC-64 records by parts (the header's and each tensor's: "tensors"), for
 * threads 1, 2, 3, 7 and pieces of at least 1 byte, 4 KiB, 64 KiB and the
 * library's default:
 *   intact: mapped, every tensor where the sequential check put it, every
 *   frame's check passes; each tensor's CRC-64 (lrmoe_weights_map_crc) is
 *   known after its frame's check alone, equals a sequential CRC of its
 *   bytes, and is not given for a range that is not exactly a tensor
 *   (nor with XXH64 records);
 *   one bit flipped in a tensor's data (its first, middle and last byte and
 *   five more at random, every tensor of every frame, in a copy of FILE):
 *   mapped (the headers are intact); the check of the frame holding the
 *   byte fails, twice (the verdict is kept), with the reader's error naming
 *   the file and that frame; the other frames' checks pass.
 * Records by parts, also: a tensor's CRC is known after the check of that
 * tensor alone (lrmoe_weights_map_check_tensors), not its neighbours'; a
 * flipped bit fails the check of the tensor holding it (naming it: "frame
 * I: tensor NAME: digest mismatch: "), and the frame's, and no other
 * tensor's nor the header's; a flipped bit in a tensor's CRC in the record
 * fails that tensor's check alone; one in the header (a digit of the layer
 * attribute: the frame still maps) fails every check of that frame as
 * "frame I: header: digest mismatch: " and no other frame's.
 *   weights_map_test DIR   (DIR: where the streams are written)
 * prints the cases per setting and "weights_map: N cases, F failed". */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "crc64.h"
#include "lrmoe.h"
#include "weights_map.h"

static uint64_t s = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return s;
}

static int flip(const char *path, size_t at)
{
    int fd = open(path, O_RDWR);
    unsigned char b;
    int ok = fd >= 0 && pread(fd, &b, 1, (off_t)at) == 1;
    b ^= 4;
    ok = ok && pwrite(fd, &b, 1, (off_t)at) == 1;
    if (fd >= 0) close(fd);
    return ok ? 0 : -1;
}

static int write_weights(const char *path, int digest)
{
    lrmoe_wopts_t o;
    lrmoe_wopts_default(&o);
    o.compress = 0;
    lrmoe_writer_t *w = lrmoe_writer_open(path, &o);
    if (!w) return -1;
    lrmoe_writer_set_digests(w, digest);
    static const char *nm[3] = {"w_gate", "w_up", "w_down"};
    for (int k = 0; k < 3; k++) {
        lrmoe_frame_t f;
        lrmoe_frame_init(&f);
        const int64_t E = k == 1 ? 5 : 4, F = 24, D = 40;
        for (int j = 0; j < 3; j++) {
            int64_t shape[3] = {E, j < 2 ? F : D, j < 2 ? D : F};
            lrmoe_tensor_t *t = lrmoe_frame_put(&f, nm[j], LRMOE_BF16, 3, shape);
            if (!t) return -1;
            for (int64_t i = 0; i < E * F * D; i++) ((uint16_t *)t->data)[i] = (uint16_t)rnd();
        }
        lrmoe_frame_set_attrf(&f, "layer", "%d", k);
        if (lrmoe_writer_write(w, &f) < 0) return -1;
        lrmoe_frame_clear(&f);
    }
    return lrmoe_writer_close(w);
}

static int run(const char *path, const char *copy, const char *what, int *pcases, int *pfailed);

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: weights_map_test DIR\n");
        return 2;
    }
    char path[4096], copy[4096];
    int cases = 0, failed = 0;
    snprintf(path, sizeof path, "%s/weights_map_test.lrm", argv[1]);
    snprintf(copy, sizeof copy, "%s/weights_map_test.copy.lrm", argv[1]);
    static const struct { int kind; const char *name; } dg[] = {
        {LRMOE_DIGEST_CRC64, "crc64"}, {LRMOE_DIGEST_XXH64, "xxh64"},
        {LRMOE_DIGEST_CRC64_TENSORS, "tensors"}};
    for (int d = 0; d < 3; d++) {
        if (write_weights(path, dg[d].kind) < 0) {
            fprintf(stderr, "weights_map_test: %s: %s\n", path, lrmoe_errmsg());
            return 1;
        }
        if (run(path, copy, dg[d].name, &cases, &failed) < 0) return 1;
        unlink(path);
    }
    printf("weights_map: %d cases, %d failed\n", cases, failed);
    return failed != 0;
}

static int run(const char *path, const char *copy, const char *what, int *pcases, int *pfailed)
{
    int cases = *pcases, failed = *pfailed;
    const int parts = !strcmp(what, "tensors");
    /* the reference: one thread, one piece per frame */
    lrmoe_weights_t w0;
    lrmoe_wmap_t m0;
    if (lrmoe_weights_map_pieces(path, &w0, &m0, 1, (size_t)-1) != 1) {
        fprintf(stderr, "weights_map_test: %s is not a mappable weights stream\n", path);
        return -1;
    }
    /* every tensor's data: offset in the file and bytes */
    size_t nt = 0, cap = 0, *off = NULL, *len = NULL;
    for (int i = 0; i < w0.n; i++)
        for (int j = 0; j < w0.frames[i].ntensors; j++) {
            const lrmoe_tensor_t *t = w0.frames[i].tensors[j];
            if (nt == cap) {
                cap = cap ? 2 * cap : 16;
                off = realloc(off, cap * sizeof *off);
                len = realloc(len, cap * sizeof *len);
                if (!off || !len) return -1;
            }
            off[nt] = (size_t)((const char *)t->data - (const char *)m0.base);
            len[nt] = (size_t)lrmoe_tensor_numel(t) * lrmoe_dtype_size(t->dtype);
            nt++;
        }
    {   /* the copy whose bits are flipped */
        FILE *in = fopen(path, "rb"), *out = fopen(copy, "wb");
        char buf[1 << 16];
        size_t n;
        if (!in || !out) { perror("weights_map_test"); return -1; }
        while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
        if (fclose(out) || fclose(in)) { perror("weights_map_test"); return -1; }
    }
    static const int threads[] = {1, 2, 3, 7};
    const size_t pieces[] = {1, 4096, 65536, LRMOE_WMAP_PIECE};
    for (size_t ti = 0; ti < sizeof threads / sizeof threads[0]; ti++)
        for (size_t pi = 0; pi < sizeof pieces / sizeof pieces[0]; pi++) {
            const int th = threads[ti];
            const size_t pc = pieces[pi];
            int c0 = cases, f0 = failed;
            lrmoe_weights_t w;
            lrmoe_wmap_t m;
            cases++;
            if (lrmoe_weights_map_pieces(copy, &w, &m, th, pc) != 1) {
                printf("FAIL %s threads %d piece %zu: intact stream not mapped\n", what, th, pc);
                failed++;
            } else {
                int same = w.n == w0.n;
                for (int i = 0; same && i < w.n; i++)
                    for (int j = 0; same && j < w.frames[i].ntensors; j++)
                        same = (const char *)w.frames[i].tensors[j]->data - (const char *)m.base ==
                               (const char *)w0.frames[i].tensors[j]->data -
                                   (const char *)m0.base;
                /* each tensor's CRC: none before its frame's check; after it,
                 * the CRC-64 of its bytes (CRC-64 records; none with XXH64
                 * ones), and none for bytes that are not exactly a tensor */
                int crcs = 1;
                for (int i = 0; same && i < w.n; i++) {
                    const lrmoe_tensor_t *t0 = w.frames[i].tensors[0];
                    uint64_t c;
                    if (lrmoe_weights_map_crc(&m, t0->data, t0->nbytes, &c)) crcs = 0;
                    if (parts) {    /* w_up alone: its CRC, not w_gate's */
                        const lrmoe_tensor_t *t1 = w.frames[i].tensors[1];
                        const char *nm = t1->name;
                        if (lrmoe_weights_map_check_tensors(&m, i, &nm, 1) != 0 ||
                            !lrmoe_weights_map_crc(&m, t1->data, t1->nbytes, &c) ||
                            c != lrmoe_crc64_update(0, t1->data, t1->nbytes) ||
                            lrmoe_weights_map_crc(&m, t0->data, t0->nbytes, &c))
                            crcs = 0;
                    }
                    same = lrmoe_weights_map_check(&m, i) == 0;
                    for (int j = 0; same && j < w.frames[i].ntensors; j++) {
                        const lrmoe_tensor_t *x = w.frames[i].tensors[j];
                        const int want = strcmp(what, "xxh64") != 0;
                        int got = lrmoe_weights_map_crc(&m, x->data, x->nbytes, &c);
                        if (got != want || (got && c != lrmoe_crc64_update(0, x->data, x->nbytes)))
                            crcs = 0;
                        if (lrmoe_weights_map_crc(&m, (const char *)x->data + 1, x->nbytes - 1, &c) ||
                            lrmoe_weights_map_crc(&m, x->data, x->nbytes - 1, &c))
                            crcs = 0;
                    }
                }
                cases++;
                if (!crcs) {
                    printf("FAIL %s threads %d piece %zu: tensor CRCs wrong\n", what, th, pc);
                    failed++;
                }
                if (!same) {
                    printf("FAIL %s threads %d piece %zu: tensors elsewhere, or an intact "
                           "frame refused\n", what, th, pc);
                    failed++;
                }
                lrmoe_weights_unmap(&w, &m);
            }
            for (size_t t = 0; t < nt; t++)
                for (int k = 0; k < 8 && len[t]; k++) {
                    size_t at = off[t] + (k == 0 ? 0 : k == 1 ? len[t] / 2 : k == 2 ? len[t] - 1
                                                      : (size_t)(rnd() % len[t]));
                    if (flip(copy, at) < 0) { perror("weights_map_test"); return -1; }
                    cases++;
                    int r = lrmoe_weights_map_pieces(copy, &w, &m, th, pc), bad = 0;
                    char why[256] = "";
                    if (r != 1) {
                        snprintf(why, sizeof why, "not mapped");
                        bad = 1;
                    }
                    for (int i = 0; !bad && i < w.n; i++) {
                        /* the frame holding byte `at`: its tensors' span */
                        const char *b0 = (const char *)m.base;
                        size_t lo = (size_t)((const char *)w.frames[i].tensors[0]->data - b0),
                               hi = lo;
                        for (int j = 0; j < w.frames[i].ntensors; j++) {
                            const lrmoe_tensor_t *x = w.frames[i].tensors[j];
                            size_t o = (size_t)((const char *)x->data - b0),
                                   e = o + (size_t)lrmoe_tensor_numel(x) * lrmoe_dtype_size(x->dtype);
                            if (o < lo) lo = o;
                            if (e > hi) hi = e;
                        }
                        const int holds = at >= lo && at < hi;
                        char want[4096 + 64];
                        snprintf(want, sizeof want, "%s: frame %d: digest mismatch: ", copy, i);
                        for (int twice = 0; parts && twice < 2 && !bad; twice++) {
                            /* each tensor alone, then the frame: the one
                             * holding the byte fails, naming it */
                            const char *hn = NULL;
                            for (int j = 0; j < w.frames[i].ntensors; j++) {
                                const lrmoe_tensor_t *x = w.frames[i].tensors[j];
                                size_t o = (size_t)((const char *)x->data - b0);
                                if (at >= o && at < o + x->nbytes) hn = x->name;
                            }
                            if (hn)
                                snprintf(want, sizeof want, "%s: frame %d: tensor %s: digest mismatch: ",
                                         copy, i, hn);
                            for (int j = 0; j <= w.frames[i].ntensors && !bad; j++) {
                                const char *nm = j < w.frames[i].ntensors ? w.frames[i].tensors[j]->name : NULL;
                                int c = nm ? lrmoe_weights_map_check_tensors(&m, i, &nm, 1)
                                           : lrmoe_weights_map_check(&m, i);
                                int fails = hn && (!nm || !strcmp(nm, hn));
                                if (fails ? c != -1 || strncmp(lrmoe_errmsg(), want, strlen(want)) : c != 0) {
                                    snprintf(why, sizeof why, "frame %d, %s (call %d): %d, '%.120s'",
                                             i, nm ? nm : "whole", twice + 1, c, c ? lrmoe_errmsg() : "");
                                    bad = 1;
                                }
                            }
                        }
                        for (int twice = 0; !parts && twice < 2 && !bad; twice++) {
                            int c = lrmoe_weights_map_check(&m, i);
                            if (holds && (c != -1 || strncmp(lrmoe_errmsg(), want, strlen(want)))) {
                                snprintf(why, sizeof why, "frame %d's check (call %d): %d, '%.120s'",
                                         i, twice + 1, c, c ? lrmoe_errmsg() : "");
                                bad = 1;
                            } else if (!holds && c != 0) {
                                snprintf(why, sizeof why, "frame %d (intact) refused", i);
                                bad = 1;
                            }
                        }
                    }
                    if (bad) {
                        if (failed - f0 < 5)
                            printf("FAIL %s threads %d piece %zu: a bit of byte %zu flipped: %s\n",
                                   what, th, pc, at, why);
                        failed++;
                    }
                    if (r == 1) lrmoe_weights_unmap(&w, &m);
                    if (flip(copy, at) < 0) { perror("weights_map_test"); return -1; }
                }
            for (int i = 0; parts && i < w0.n; i++)
                for (int k = -1; k < w0.frames[i].ntensors; k++) {
                    /* k < 0: a digit of frame i's layer attribute in its
                     * header; else a bit of tensor k's CRC in the record */
                    const lrmoe_wmap_rec_t *r0 = &m0.rec[i];
                    size_t at = r0->off - 8 * (size_t)(w0.frames[i].ntensors - k);
                    if (k < 0) {
                        const char *h = (const char *)m0.base + r0->off + 8;
                        const char *l = memmem(h, r0->hlen - 8, "\"layer\":\"", 9);
                        if (!l) { fprintf(stderr, "weights_map_test: no layer attribute\n"); return -1; }
                        at = (size_t)(l + 9 - (const char *)m0.base);
                    }
                    if (flip(copy, at) < 0) { perror("weights_map_test"); return -1; }
                    cases++;
                    lrmoe_weights_t w;
                    lrmoe_wmap_t m;
                    char why[256] = "";
                    if (lrmoe_weights_map_pieces(copy, &w, &m, th, pc) != 1) {
                        snprintf(why, sizeof why, "not mapped");
                    } else {
                        for (int f = 0; f < w.n && !*why; f++)
                            for (int j = -1; j <= w.frames[f].ntensors && !*why; j++) {
                                /* j -1: the header alone; ntensors: the frame */
                                const char *nm = j >= 0 && j < w.frames[f].ntensors
                                                     ? w.frames[f].tensors[j]->name : NULL;
                                int c = j == w.frames[f].ntensors ? lrmoe_weights_map_check(&m, f)
                                      : lrmoe_weights_map_check_tensors(&m, f, &nm, nm ? 1 : 0);
                                char want[4096 + 64] = "";
                                if (f == i && k < 0)
                                    snprintf(want, sizeof want, "%s: frame %d: header: digest mismatch: ", copy, f);
                                else if (f == i && (j == k || j == w.frames[f].ntensors))
                                    snprintf(want, sizeof want, "%s: frame %d: tensor %s: digest mismatch: ",
                                             copy, f, w.frames[f].tensors[k]->name);
                                if (*want ? c != -1 || strncmp(lrmoe_errmsg(), want, strlen(want)) : c != 0)
                                    snprintf(why, sizeof why, "frame %d part %d: %d, '%.120s'", f, j, c,
                                             c ? lrmoe_errmsg() : "");
                            }
                        lrmoe_weights_unmap(&w, &m);
                    }
                    if (*why) {
                        printf("FAIL %s threads %d piece %zu: %s of frame %d flipped: %s\n", what, th,
                               pc, k < 0 ? "the header" : "a tensor's record", i, why);
                        failed++;
                    }
                    if (flip(copy, at) < 0) { perror("weights_map_test"); return -1; }
                }
            printf("%s threads %d piece %zu: %d cases, %d failed\n", what, th, pc, cases - c0,
                   failed - f0);
        }
    unlink(copy);
    lrmoe_weights_unmap(&w0, &m0);
    free(off);
    free(len);
    *pcases = cases;
    *pfailed = failed;
    return 0;
}
