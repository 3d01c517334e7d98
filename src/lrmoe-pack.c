/* lrmoe-pack: assign retained pairs to backward instances and gather their
 * rows into dense destination-major, expert-major segments; --unpack
 * scatter-adds packed row results back to token positions. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lrmoe.h"
#include "pack.h"

static void usage(FILE *fp)
{
    fprintf(fp,
        "Usage: lrmoe-pack [options] [FILE]\n"
        "       lrmoe-pack --unpack [--rows NAME] [--into NAME] [--pairs] [FILE]\n"
        "Assign the kept pairs to instances (per bwd_alloc, preferring the rank\n"
        "that ran their forward) and gather their gradient rows and saved state\n"
        "into pack_pair, pack_rank, pack_counts, pack_offsets, pack_grad,\n"
        "pack_hidden, pack_gate and pack_up.\n\n"
        "Options:\n"
        "  -a, --alloc HOW     auto (default: bwd_alloc if present, else forward),\n"
        "                      plan (bwd_alloc required) or forward (every kept\n"
        "                      pair stays on the rank that ran its forward)\n"
        "  -P, --ranks N       number of ranks when the frame has no placement,\n"
        "                      bwd_alloc or exec.ranks (the forward's ranks)\n"
        "      --strip         delete saved_gate and saved_up after packing\n"
        "  -u, --unpack        scatter-add the rows of --rows back to tokens\n"
        "      --rows NAME     packed row tensor to unpack (default pack_grad)\n"
        "      --into NAME     output tensor (default unpacked), [T,D] F32\n"
        "      --pairs         unpack to pair positions [T,K,D] without summing\n"
        "  -v, --verbose       one line per frame on stderr\n"
        "  -o, --output FILE   write to FILE (default stdout)\n"
        "  -l, --level N       zstd level (default 3)\n"
        "  -@, --threads N     zstd worker threads (default 0)\n"
        "      --no-compress   write a raw stream\n"
        "  -f, --force         write binary to a terminal\n"
        "  -h, --help          this help\n"
        "  -V, --version       print the version\n");
}

typedef struct {
    lrmoe_pack_opts_t o;
    int unpack, pairs, verbose;
    const char *rows, *into;
} ctx_t;

static int on_frame(lrmoe_frame_t *f, int64_t index, void *vctx)
{
    ctx_t *c = vctx;
    if (c->unpack)
        return lrmoe_pack_unpack_frame(f, c->rows, c->into, c->pairs);
    if (lrmoe_pack_frame(f, &c->o) < 0)
        return -1;
    if (c->verbose) {
        const char *rows = lrmoe_frame_attr(f, "pack.rows");
        const char *moved = lrmoe_frame_attr(f, "pack.moved");
        const char *rr = lrmoe_frame_attr(f, "pack.rank_rows");
        const char *sec = lrmoe_frame_attr(f, "pack.seconds");
        fprintf(stderr, "lrmoe-pack: frame %lld: %s rows (%s moved), per rank "
                "%s, %s s\n", (long long)index, rows ? rows : "?",
                moved ? moved : "?", rr ? rr : "?", sec ? sec : "?");
    }
    return 0;
}

enum { OPT_STRIP = 0x2001, OPT_ROWS, OPT_INTO, OPT_PAIRS };

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        LRMOE_STREAM_LONGOPTS,
        {"alloc", required_argument, 0, 'a'},
        {"ranks", required_argument, 0, 'P'},
        {"strip", no_argument, 0, OPT_STRIP},
        {"unpack", no_argument, 0, 'u'},
        {"rows", required_argument, 0, OPT_ROWS},
        {"into", required_argument, 0, OPT_INTO},
        {"pairs", no_argument, 0, OPT_PAIRS},
        {"verbose", no_argument, 0, 'v'},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0}};
    lrmoe_io_t io;
    ctx_t c = {0};
    lrmoe_io_init(&io);
    lrmoe_pack_opts_default(&c.o);
    c.rows = "pack_grad";
    c.into = "unpacked";
    int ch;
    int64_t v;
    while ((ch = getopt_long(argc, argv, LRMOE_STREAM_SHORTOPTS "a:P:uvhV",
                             longopts, NULL)) != -1) {
        int r = lrmoe_io_opt(&io, ch, optarg);
        if (r > 0)
            continue;
        if (r < 0)
            goto bad;
        switch (ch) {
        case 'a':
            if (!strcmp(optarg, "auto"))
                c.o.alloc = LRMOE_PACK_ALLOC_AUTO;
            else if (!strcmp(optarg, "plan"))
                c.o.alloc = LRMOE_PACK_ALLOC_PLAN;
            else if (!strcmp(optarg, "forward"))
                c.o.alloc = LRMOE_PACK_ALLOC_FORWARD;
            else {
                lrmoe_err("--alloc: '%s' is not auto, plan or forward", optarg);
                goto bad;
            }
            break;
        case 'P':
            if (lrmoe_parse_i64("--ranks", optarg, 1, 1 << 20, &v) < 0)
                goto bad;
            c.o.P = (int)v;
            break;
        case OPT_STRIP: c.o.strip = 1; break;
        case 'u': c.unpack = 1; break;
        case OPT_ROWS: c.rows = optarg; break;
        case OPT_INTO: c.into = optarg; break;
        case OPT_PAIRS: c.pairs = 1; break;
        case 'v': c.verbose = 1; break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("lrmoe-pack (lrmoe) %s\n", LRMOE_VERSION); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (argc - optind > 1) {
        fprintf(stderr, "lrmoe-pack: too many input files\n");
        usage(stderr);
        return 2;
    }
    if (lrmoe_check_tty_out(io.out, io.force) < 0)
        goto bad;
    const char *in = optind < argc ? argv[optind] : "-";
    if (lrmoe_filter_run(in, io.out, &io.w, on_frame, &c) < 0) {
        fprintf(stderr, "lrmoe-pack: %s\n", lrmoe_errmsg());
        return 1;
    }
    return 0;
bad:
    fprintf(stderr, "lrmoe-pack: %s\n", lrmoe_errmsg());
    return 2;
}
