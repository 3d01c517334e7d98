/* libFuzzer harness: the stream reader (lrmoe_reader_*) on every way in.
 * The first input byte picks the mode, the rest is the stream:
 *   bit 0  compress the rest with zstd first (so the frame parser is also
 *          reached through the decompressor; raw zstd input is tried too,
 *          since the rest may itself start with the zstd magic)
 *   bit 1  read it from a file by path (lrmoe_reader_open), else from a
 *          buffer through fmemopen (lrmoe_reader_fdopen, as from a pipe)
 *   bit 2  write the frames back as zstd, else raw
 * Oracles: every frame read encodes and decodes to itself; the frames of a
 * stream that ends cleanly, written with lrmoe_writer_* and read back, are
 * the same frames, and that stream ends cleanly too. A raw stream read from
 * a file is also mapped as a weights file (lib/weights_map.c: its headers
 * parsed, every frame's header, each tensor and the whole frame checked
 * against its digest record, by parts where the record is): where the
 * mapping takes it and every check passes, the reader read it cleanly, to
 * the same frames. */
#include <unistd.h>
#include <zstd.h>
#include "fuzz_common.h"
#include "weights_map.h"

#define MAXKEEP 64

static char in_path[64], out_path[64];

static void tmp_paths(void)
{
    if (in_path[0]) return;
    snprintf(in_path, sizeof in_path, "/tmp/lrmoe-fuzz-in.XXXXXX");
    snprintf(out_path, sizeof out_path, "/tmp/lrmoe-fuzz-out.XXXXXX");
    int a = mkstemp(in_path), b = mkstemp(out_path);
    FUZZ_CHECK(a >= 0 && b >= 0, "cannot create temporary files in /tmp");
    close(a);
    close(b);
}

static void cleanup(void)
{
    if (in_path[0]) unlink(in_path);
    if (out_path[0]) unlink(out_path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    tmp_paths();
    atexit(cleanup);
    return 0;
}

/* Read every frame of r into keep[] (up to MAXKEEP); returns the reader's
 * final result (0 clean end, -1 error) and the frame count in *n. */
static int read_all(lrmoe_reader_t *r, lrmoe_frame_t *keep, int *n)
{
    lrmoe_frame_t f;
    lrmoe_frame_init(&f);
    int rc;
    *n = 0;
    while ((rc = lrmoe_reader_next(r, &f)) == 1) {
        fuzz_roundtrip(&f);
        if (*n < MAXKEEP) {
            keep[*n] = f;          /* moved: f's arrays now belong to keep[n] */
            lrmoe_frame_init(&f);
        }
        (*n)++;
    }
    lrmoe_frame_clear(&f);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int mode = data[0];
    const uint8_t *s = data + 1;
    size_t n = size - 1;
    uint8_t *z = NULL;
    if (mode & 1) {
        size_t cap = ZSTD_compressBound(n);
        z = malloc(cap ? cap : 1);
        size_t zn = ZSTD_compress(z, cap, s, n, 1);
        FUZZ_CHECK(!ZSTD_isError(zn), "zstd: %s", ZSTD_getErrorName(zn));
        s = z;
        n = zn;
    }
    lrmoe_reader_t *r;
    FILE *fp = NULL;
    if (mode & 2) {
        FILE *o = fopen(in_path, "wb");
        FUZZ_CHECK(o && fwrite(s, 1, n, o) == n && fclose(o) == 0, "cannot write %s", in_path);
        r = lrmoe_reader_open(in_path);
    } else {
        fp = n ? fmemopen((void *)s, n, "rb") : fopen("/dev/null", "rb");
        FUZZ_CHECK(fp, "fmemopen failed");
        r = lrmoe_reader_fdopen(fp, "<fuzz>");
    }
    static lrmoe_frame_t keep[MAXKEEP], back[MAXKEEP];
    int nf = 0;
    int rc = r ? read_all(r, keep, &nf) : -1;
    if (r) lrmoe_reader_close(r);
    if (fp) fclose(fp);
    free(z);

    lrmoe_weights_t mw;
    lrmoe_wmap_t mm;
    if ((mode & 3) == 2 && lrmoe_weights_map_pieces(in_path, &mw, &mm, 1, 4096) == 1) {
        int all = 1;
        for (int i = 0; i < mw.n; i++) {
            (void)lrmoe_weights_map_check_tensors(&mm, i, NULL, 0);
            for (int j = 0; j < mw.frames[i].ntensors; j++) {
                const char *nm = mw.frames[i].tensors[j]->name;
                (void)lrmoe_weights_map_check_tensors(&mm, i, &nm, 1);
            }
            if (lrmoe_weights_map_check(&mm, i) < 0) all = 0;
        }
        if (all) {
            FUZZ_CHECK(rc == 0 && nf == mw.n, "mapped and checked (%d frames) but read: %d frames, %s",
                       mw.n, nf, rc == 0 ? "a clean end" : lrmoe_errmsg());
            for (int i = 0; i < nf && i < MAXKEEP; i++)
                fuzz_frame_same(&keep[i], &mw.frames[i], "mapped vs read");
        }
        lrmoe_weights_unmap(&mw, &mm);
    }

    if (rc == 0 && nf <= MAXKEEP) { /* a clean stream: write it back, read it again */
        lrmoe_wopts_t o;
        lrmoe_wopts_default(&o);
        o.compress = (mode & 4) != 0;
        o.level = 1;
        lrmoe_writer_t *w = lrmoe_writer_open(out_path, &o);
        FUZZ_CHECK(w, "writer: %s", lrmoe_errmsg());
        for (int i = 0; i < nf; i++)
            FUZZ_CHECK(lrmoe_writer_write(w, &keep[i]) == 0, "write frame %d: %s", i, lrmoe_errmsg());
        FUZZ_CHECK(lrmoe_writer_close(w) == 0, "writer close: %s", lrmoe_errmsg());
        lrmoe_reader_t *r2 = lrmoe_reader_open(out_path);
        FUZZ_CHECK(r2, "reopen: %s", lrmoe_errmsg());
        int nb = 0;
        int rc2 = read_all(r2, back, &nb);
        lrmoe_reader_close(r2);
        FUZZ_CHECK(rc2 == 0, "the rewritten stream does not end cleanly: %s", lrmoe_errmsg());
        FUZZ_CHECK(nb == nf, "rewritten stream: %d frames, the input had %d", nb, nf);
        for (int i = 0; i < nb; i++) {
            fuzz_frame_same(&keep[i], &back[i], "stream write/read");
            lrmoe_frame_clear(&back[i]);
        }
    }
    for (int i = 0; i < nf && i < MAXKEEP; i++) lrmoe_frame_clear(&keep[i]);
    return 0;
}
