/* lrmoe-pack: assign retained pairs to backward instances and gather their
 * rows into dense destination-major, expert-major segments; --unpack
 * scatter-adds packed row results back to token positions. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lrmoe.h"
#include "tools.h"
#include "pack.h"

static void usage(FILE *fp)
{
    fprintf(fp,
        "Usage: lrmoe-pack [options] [FILE]\n"
        "       lrmoe-pack --unpack [--rows NAME] [--into NAME] [--pairs] [FILE]\n"
        "Assign the kept pairs to instances (per bwd_alloc, preferring the rank\n"
        "that ran their forward) and gather their gradient rows and saved state\n"
        "into pack_pair, pack_rank, pack_counts, pack_offsets, pack_grad,\n"
        "pack_hidden, pack_gate and pack_up (--layout-only: the layout alone).\n\n"
        "Options:\n"
        "      --alloc HOW     auto (default: bwd_alloc if present, else forward),\n"
        "                      plan (bwd_alloc required) or forward (every kept\n"
        "                      pair stays on the rank that ran its forward)\n"
        "  -P, --ranks N       number of ranks when the frame has no placement,\n"
        "                      bwd_alloc or exec.ranks (the forward's ranks)\n"
        "      --strip         delete saved_gate and saved_up after packing\n"
        "      --layout-only   write the layout (pack_pair, pack_rank, pack_counts,\n"
        "                      pack_offsets) but not the rows: lrmoe-exec's CPU\n"
        "                      backward reads them from the unpacked tensors\n"
        "  -u, --unpack        scatter-add the rows of --rows back to tokens\n"
        "      --rows NAME     packed row tensor to unpack (default pack_grad)\n"
        "      --into NAME     output tensor (default unpacked), [T,D] F32; not\n"
        "                      topk_ids, pack_pair or the --rows tensor\n"
        "      --pairs         unpack to pair positions [T,K,D] without summing\n"
        "  -S, --stats FILE    one TSV row per frame: pairs kept and dropped, rows\n"
        "                      moved, bytes packed, time (- : stdout, or stderr\n"
        "                      when the stream goes there)\n"
        "  -v, --verbose       one line per frame on stderr\n"
        "  -o, --output FILE   write to FILE (default stdout)\n"
        "  -l, --level N       zstd level (default: 1 to a file, raw to a pipe)\n"
        "  -@, --threads N     gather threads and zstd workers (default 0: one\n"
        "                      gather thread); output does not depend on N\n"
        "      --no-compress   write a raw stream\n"
        "  -f, --force         write binary to a terminal\n"
        "  -h, --help          this help\n"
        "  -V, --version       print the version\n");
}

typedef struct {
    lrmoe_pack_opts_t o;
    int unpack, pairs, verbose;
    unsigned flags; /* lrmoe_pack_frame_x's */
    const char *rows, *into;
    FILE *stats;
} ctx_t;

/* The --stats row of a frame just packed or unpacked: pairs routed, rows
 * kept (packed) or unpacked, pairs dropped, rows moved off their forward
 * rank, bytes of the tensors written, wall time. */
static int stats_row(FILE *fp, const lrmoe_frame_t *f, int64_t index, const ctx_t *c,
                     double seconds)
{
    const lrmoe_tensor_t *ti = lrmoe_frame_get(f, "topk_ids");
    int64_t pairs = ti && ti->ndim == 2 ? ti->shape[0] * ti->shape[1] : -1, rows = -1,
            moved = -1;
    double bytes = 0;
    if (c->unpack) {
        const lrmoe_tensor_t *r = lrmoe_frame_get(f, c->rows), *o = lrmoe_frame_get(f, c->into);
        rows = r && r->ndim >= 1 ? r->shape[0] : -1;
        bytes = o ? (double)o->nbytes : 0;
    } else {
        if (lrmoe_frame_attr_i64(f, "pack.rows", &rows) != 1)
            rows = -1;
        if (lrmoe_frame_attr_i64(f, "pack.moved", &moved) != 1)
            moved = -1;
        for (int i = 0; i < f->ntensors; i++)
            if (!strncmp(f->tensors[i]->name, "pack_", 5))
                bytes += (double)f->tensors[i]->nbytes;
    }
    fprintf(fp, "%lld", (long long)index);
    lrmoe_tsv_attr(fp, f, "layer");
    lrmoe_tsv_attr(fp, f, "step");
    fprintf(fp, "\t%s", c->unpack ? "unpack" : "pack");
    const int64_t cell[4] = {pairs, rows, pairs >= 0 && rows >= 0 && !c->unpack ? pairs - rows : -1,
                             moved};
    for (int k = 0; k < 4; k++)
        if (cell[k] >= 0)
            fprintf(fp, "\t%lld", (long long)cell[k]);
        else
            fputs("\tNA", fp);
    fprintf(fp, "\t%.0f\t%.3f\n", bytes, seconds * 1e3);
    return ferror(fp) ? lrmoe_err("--stats: write error") : 0;
}

/* The --stats table's header, a column per value of its rows */
static const char stats_header[] =
    "frame\tlayer\tstep\top\tpairs\trows\tdropped\tmoved\twritten_bytes"
    "\ttime_ms\n";

static int on_frame(lrmoe_frame_t *f, int64_t index, void *vctx)
{
    ctx_t *c = vctx;
    const double t0 = lrmoe_now();
    if (c->unpack) {
        if (lrmoe_pack_unpack_frame(f, c->rows, c->into, c->pairs) < 0)
            return -1;
        return c->stats ? stats_row(c->stats, f, index, c, lrmoe_now() - t0) : 0;
    }
    if (lrmoe_pack_frame_x(f, &c->o, c->flags) < 0)
        return -1;
    if (c->stats && stats_row(c->stats, f, index, c, lrmoe_now() - t0) < 0)
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

enum { OPT_STRIP = 0x2001, OPT_ROWS, OPT_INTO, OPT_PAIRS, OPT_ALLOC, OPT_LAYOUT };

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        LRMOE_STREAM_LONGOPTS,
        {"alloc", required_argument, 0, OPT_ALLOC},
        {"ranks", required_argument, 0, 'P'},
        {"strip", no_argument, 0, OPT_STRIP},
        {"layout-only", no_argument, 0, OPT_LAYOUT},
        {"unpack", no_argument, 0, 'u'},
        {"rows", required_argument, 0, OPT_ROWS},
        {"into", required_argument, 0, OPT_INTO},
        {"pairs", no_argument, 0, OPT_PAIRS},
        {"stats", required_argument, 0, 'S'},
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
    const char *stats_path = NULL;
    int ch;
    int64_t v;
    while ((ch = getopt_long(argc, argv, LRMOE_STREAM_SHORTOPTS "P:uS:vhV",
                             longopts, NULL)) != -1) {
        int r = lrmoe_io_opt(&io, ch, optarg);
        if (r > 0)
            continue;
        if (r < 0)
            goto bad;
        switch (ch) {
        case OPT_ALLOC:
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
        case OPT_LAYOUT: c.flags |= LRMOE_PACK_LAYOUT_ONLY; break;
        case 'u': c.unpack = 1; break;
        case OPT_ROWS: c.rows = optarg; break;
        case OPT_INTO: c.into = optarg; break;
        case OPT_PAIRS: c.pairs = 1; break;
        case 'S': stats_path = optarg; break;
        case 'v': c.verbose = 1; break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("lrmoe-pack (lrmoe) %s\n", LRMOE_VERSION); return 0;
        default: return lrmoe_usage_error("lrmoe-pack");
        }
    }
    if (argc - optind > 1) {
        fprintf(stderr, "lrmoe-pack: too many input files\n");
        return lrmoe_usage_error("lrmoe-pack");
    }
    if ((c.flags & LRMOE_PACK_LAYOUT_ONLY) && (c.unpack || c.o.strip)) {
        lrmoe_err("--layout-only and --%s: %s", c.unpack ? "unpack" : "strip",
                  c.unpack ? "--layout-only is a form of packing"
                           : "a layout-only pack reads its rows from saved_gate and "
                             "saved_up, so they must stay");
        goto bad;
    }
    if (c.unpack && lrmoe_pack_unpack_names(c.rows, c.into) < 0) {
        lrmoe_err_prefix("--into %s", c.into);
        goto bad;
    }
    c.o.threads = io.w.threads > 1 ? io.w.threads : 1;
    if (lrmoe_check_tty_out(io.out, io.force) < 0)
        goto bad;
    const char *in = optind < argc ? argv[optind] : "-";
    lrmoe_filter_t run = {.in = in, .io = &io, .stats_path = stats_path,
                          .stats_header = stats_header, .stats = &c.stats,
                          .hooks = {.frame = on_frame, .ctx = &c}};
    int rc = lrmoe_filter_main(&run) < 0;
    if (rc)
        fprintf(stderr, "lrmoe-pack: %s\n", lrmoe_errmsg());
    return rc;
bad:
    fprintf(stderr, "lrmoe-pack: %s\n", lrmoe_errmsg());
    return 2;
}
