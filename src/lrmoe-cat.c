/* lrmoe-cat: concatenate streams, re-encode (raw/zstd, level, threads),
 * keep or drop tensors by name, set attributes. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lrmoe.h"
#include "tools.h"

static void usage(FILE *fp)
{
    fprintf(fp,
        "Usage: lrmoe-cat [options] [FILE...]\n"
        "Concatenate lrmoe streams (stdin when no FILE, or '-', at most once)\n"
        "into one stream, re-encoded: zstd by default, raw with --no-compress.\n\n"
        "Options:\n"
        "      --keep LIST     keep only the tensors named in LIST (comma-separated\n"
        "                      names or shell globs: --keep 'expert_load,plan_*')\n"
        "      --drop LIST     drop the tensors named in LIST (after --keep)\n"
        "                      (both repeatable; a name or glob that matches no tensor\n"
        "                      in any frame is an error; attributes always stay)\n"
        "      --set-attr KEY=VALUE  set attribute KEY to VALUE in every frame,\n"
        "                      replacing the frame's own (repeatable): restate a\n"
        "                      trace's model sizes, e.g. --set-attr hidden=7168\n"
        "      --digests MODE  the digest record before each frame: auto (default:\n"
        "                      a CRC-64 of the header and of each tensor for a\n"
        "                      frame of 64 MiB of data or more, which a mapped\n"
        "                      weights file is checked by, one CRC-64 of the\n"
        "                      frame otherwise), tensors (by parts, every frame),\n"
        "                      frame (one CRC-64, every frame: for readers older\n"
        "                      than the records by parts) or none\n"
        "  -o, --output FILE   write to FILE (default stdout)\n"
        "  -l, --level N       zstd level (default: 1 to a file, raw to a pipe)\n"
        "  -@, --threads N     zstd worker threads (default 0)\n"
        "      --no-compress   write a raw stream\n"
        "  -f, --force         write binary to a terminal\n"
        "  -h, --help          this help\n"
        "  -V, --version       print the version\n");
}

enum { OPT_KEEP = 0x2001, OPT_DROP, OPT_SET_ATTR, OPT_DIGESTS };

#define MAX_SET 256

/* Thin one frame: --keep's names, then --drop's; then --set-attr. */
typedef struct {
    lrmoe_names_t keep, drop;
    int nset;
    const char *set[MAX_SET]; /* "KEY=VALUE" (argv) */
} thin_t;

static int thin(lrmoe_frame_t *f, const thin_t *t)
{
    if (t->keep.n && lrmoe_frame_thin(f, (const char *const *)t->keep.v, t->keep.n, 1, t->keep.hits) < 0)
        return -1;
    if (t->drop.n && lrmoe_frame_thin(f, (const char *const *)t->drop.v, t->drop.n, 0, t->drop.hits) < 0)
        return -1;
    for (int i = 0; i < t->nset; i++) {
        const char *eq = strchr(t->set[i], '=');
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)(eq - t->set[i]), t->set[i]);
        if (lrmoe_frame_set_attr(f, key, eq + 1) < 0)
            return -1;
    }
    return 0;
}

/* main without the --keep/--drop lists, which main frees on every path */
static int cat_main(int argc, char **argv, thin_t *th)
{
    static const struct option longopts[] = {
        LRMOE_STREAM_LONGOPTS,
        {"keep", required_argument, 0, OPT_KEEP},
        {"drop", required_argument, 0, OPT_DROP},
        {"set-attr", required_argument, 0, OPT_SET_ATTR},
        {"digests", required_argument, 0, OPT_DIGESTS},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0}};
    int digests = LRMOE_DIGEST_CRC64;   /* --digests */
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
        case OPT_KEEP:
        case OPT_DROP:
            if (lrmoe_names_add(c == OPT_KEEP ? &th->keep : &th->drop, optarg) < 0) {
                fprintf(stderr, "lrmoe-cat: --%s: %s\n", c == OPT_KEEP ? "keep" : "drop", lrmoe_errmsg());
                return 2;
            }
            break;
        case OPT_SET_ATTR: {
            const char *eq = strchr(optarg, '=');
            if (!eq || eq == optarg || eq - optarg >= 256) {
                fprintf(stderr, "lrmoe-cat: --set-attr: '%s' is not KEY=VALUE\n", optarg);
                return 2;
            }
            if (th->nset >= MAX_SET) {
                fprintf(stderr, "lrmoe-cat: --set-attr: more than %d\n", MAX_SET);
                return 2;
            }
            th->set[th->nset++] = optarg;
            break;
        }
        case OPT_DIGESTS: {
            static const char *const modes[] = {"none", "auto", NULL, "tensors", "frame"};
            digests = -1;
            for (int k = 0; k < 5; k++)
                if (modes[k] && !strcmp(optarg, modes[k])) digests = k;
            if (digests < 0) {
                fprintf(stderr, "lrmoe-cat: --digests: '%s' is not auto, tensors, frame or none\n",
                        optarg);
                return lrmoe_usage_error("lrmoe-cat");
            }
            break;
        }
        case 'h': usage(stdout); return 0;
        case 'V': printf("lrmoe-cat (lrmoe) %s\n", LRMOE_VERSION); return 0;
        default: return lrmoe_usage_error("lrmoe-cat");
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
    lrmoe_writer_set_digests(w, digests);   /* the LRMOE_DIGEST_* of the mode */
    lrmoe_frame_t f;
    lrmoe_frame_init(&f);
    int nin = argc - optind, rc = 0;
    for (int i = 0; i < (nin ? nin : 1) && !rc; i++) {
        lrmoe_reader_t *r = lrmoe_reader_open(nin ? argv[optind + i] : "-");
        if (!r) { rc = -1; break; }
        int k;
        while ((k = lrmoe_reader_next(r, &f)) == 1)
            if (thin(&f, th) < 0 || lrmoe_writer_write(w, &f) < 0) { k = -1; break; }
        if (k < 0) rc = -1;
        lrmoe_reader_close(r);
    }
    lrmoe_frame_clear(&f);
    if (!rc && (lrmoe_names_unmatched(&th->keep, "--keep") < 0 ||
                lrmoe_names_unmatched(&th->drop, "--drop") < 0))
        rc = -1;  /* a misspelt name: no trailer, so the next stage fails too */
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

int main(int argc, char **argv)
{
    thin_t th = {{0}, {0}, 0, {0}};
    int rc = cat_main(argc, argv, &th);
    lrmoe_names_free(&th.keep);
    lrmoe_names_free(&th.drop);
    return rc;
}
