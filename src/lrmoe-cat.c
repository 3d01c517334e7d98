/* lrmoe-cat: concatenate streams, re-encode (raw/zstd, level, threads). */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lrmoe.h"

static void usage(FILE *fp)
{
    fprintf(fp,
        "Usage: lrmoe-cat [options] [FILE...]\n"
        "Concatenate lrmoe streams (stdin when no FILE, or '-', at most once)\n"
        "into one stream, re-encoded: zstd by default, raw with --no-compress.\n\n"
        "Options:\n"
        "  -o, --output FILE   write to FILE (default stdout)\n"
        "  -l, --level N       zstd level (default: 1 to a file, raw to a pipe)\n"
        "  -@, --threads N     zstd worker threads (default 0)\n"
        "      --no-compress   write a raw stream\n"
        "  -f, --force         write binary to a terminal\n"
        "  -h, --help          this help\n"
        "  -V, --version       print the version\n");
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        LRMOE_STREAM_LONGOPTS,
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0}};
    lrmoe_io_t io;
    lrmoe_io_init(&io);
    int c;
    while ((c = getopt_long(argc, argv, LRMOE_STREAM_SHORTOPTS "hV", longopts, NULL)) != -1) {
        int r = lrmoe_io_opt(&io, c, optarg);
        if (r > 0) continue;
        if (r < 0) {
            fprintf(stderr, "lrmoe-cat: %s\n", lrmoe_errmsg());
            return 2;
        }
        switch (c) {
        case 'h': usage(stdout); return 0;
        case 'V': printf("lrmoe-cat (lrmoe) %s\n", LRMOE_VERSION); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (lrmoe_inputs_check(argc - optind, argv + optind) < 0 ||
        lrmoe_check_tty_out(io.out, io.force) < 0) {
        fprintf(stderr, "lrmoe-cat: %s\n", lrmoe_errmsg());
        return 2;
    }
    lrmoe_writer_t *w = lrmoe_writer_open(io.out, &io.w);
    if (!w) {
        fprintf(stderr, "lrmoe-cat: %s\n", lrmoe_errmsg());
        return 1;
    }
    lrmoe_frame_t f;
    lrmoe_frame_init(&f);
    int nin = argc - optind, rc = 0;
    for (int i = 0; i < (nin ? nin : 1) && !rc; i++) {
        lrmoe_reader_t *r = lrmoe_reader_open(nin ? argv[optind + i] : "-");
        if (!r) { rc = -1; break; }
        int k;
        while ((k = lrmoe_reader_next(r, &f)) == 1)
            if (lrmoe_writer_write(w, &f) < 0) { k = -1; break; }
        if (k < 0) rc = -1;
        lrmoe_reader_close(r);
    }
    lrmoe_frame_clear(&f);
    if (rc < 0) {
        fprintf(stderr, "lrmoe-cat: %s\n", lrmoe_errmsg());
        lrmoe_writer_abort(w);
        return 1;
    }
    if (lrmoe_writer_close(w) < 0) {
        fprintf(stderr, "lrmoe-cat: %s\n", lrmoe_errmsg());
        return 1;
    }
    return 0;
}
