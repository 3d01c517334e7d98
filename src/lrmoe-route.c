/* lrmoe-route: top-K routing of router logits and load statistics. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "blas.h"
#include "lrmoe.h"
#include "route_frame.h"
#include "tools.h"

#define HOT 3 /* hottest experts in the stats TSV (hot1..hot3 in its header) */

static void usage(FILE *fp)
{
    fprintf(fp,
        "Usage: lrmoe-route [options] [FILE]\n"
        "Route every frame's router_logits [T,E] (or hidden [T,D] x router_weight\n"
        "[E,D] from --weights) to the top-K experts; add topk_ids [T,K] I32,\n"
        "topk_weights [T,K] F32 and expert_load [E] I64. Equal scores go to the\n"
        "lower expert index. See lrmoe-route(1).\n\n"
        "Router options:\n"
        "  -k, --topk K          experts per token (default: the frame's topk\n"
        "                        attribute, else 8)\n"
        "  -r, --router NAME     softmax (default), topk-softmax (gpt-oss), sigmoid\n"
        "  -n, --renorm          renormalise the K weights to sum to 1\n"
        "      --scale S         routed scaling factor (default 1)\n"
        "  -G, --groups G        sigmoid: split experts into G groups...\n"
        "      --topk-groups M   ...and pick only inside the M best groups\n"
        "  -w, --weights FILE    weights stream (router_weight, expert_bias per layer)\n"
        "      --from-hidden     compute logits from hidden even if router_logits exist\n"
        "      --loads-only      keep only expert_load (and rank_load) and the\n"
        "                        attributes: a trace for lrmoe-sim of kilobytes\n"
        "  -v, --verbose         notes on standard error (K's default, ignored bias)\n"
        "Statistics:\n"
        "  -P, --ranks P         also per-rank load under plain EP over P ranks\n"
        "      --ep P            old name of --ranks\n"
        "  -S, --stats FILE      write a TSV table, one row per frame, to FILE\n"
        "                        (- : stdout, or stderr when the stream goes there)\n"
        "Stream options:\n"
        "  -o, --output FILE     write to FILE (default stdout)\n"
        "  -l, --level N         zstd level (default: 1 to a file, raw to a pipe)\n"
        "  -@, --threads N       routing threads over token blocks, zstd workers\n"
        "      --no-compress     write a raw stream\n"
        "  -f, --force           write binary to a terminal\n"
        "  -h, --help            this help\n"
        "  -V, --version         print the version\n");
}

enum { OPT_FROM_HIDDEN = 0x2001, OPT_LOADS_ONLY, OPT_SCALE, OPT_TOPK_GROUPS };

typedef struct {
    lrmoe_route_frame_opts_t o;
    int verbose;
    int noted_k, noted_bias; /* each note once */
    lrmoe_weights_t w;
    lrmoe_wmap_t wm;      /* w's mapping (a raw file), base NULL: read */
    FILE *stats;
} ctx_t;

/* -v: why K is what it is, and a bias the router does not use */
static void notes(ctx_t *c, const lrmoe_route_frame_info_t *info, int64_t index)
{
    if (!c->verbose)
        return;
    if (info->k_from && !strcmp(info->k_from, "default") && !c->noted_k) {
        fprintf(stderr, "lrmoe-route: note: frame %" PRId64 " has no topk attribute and "
                "-k was not given: K=%d (route.topk_from=default)\n", index, c->o.ro.k);
        c->noted_k = 1;
    }
    if (info->bias_use && !strcmp(info->bias_use, "ignored") && !c->noted_bias) {
        fprintf(stderr, "lrmoe-route: note: frame %" PRId64 ": expert_bias ignored by the "
                "%s router (only sigmoid uses it: -r sigmoid)\n", index,
                lrmoe_route_router_name(c->o.ro.router));
        c->noted_bias = 1;
    }
}

/* The --stats table's header, a column per value of its rows */
static const char stats_header[] =
    "frame\tlayer\tstep\ttokens\texperts\ttopk\tpairs"
    "\texpert_max\texpert_mean\texpert_imbalance"
    "\tranks\trank_max\trank_mean\trank_imbalance"
    "\thot1\thot1_share\thot2\thot2_share\thot3\thot3_share\n";

static int stats_row(FILE *fp, const lrmoe_frame_t *f, int64_t index, int64_t ranks,
                     const lrmoe_route_frame_info_t *in)
{
    const lrmoe_load_stats_t *es = &in->expert, *rs = &in->rank;
    const lrmoe_tensor_t *tl = lrmoe_frame_get(f, "expert_load");
    const int64_t *load = tl->data;
    fprintf(fp, "%" PRId64, index);
    lrmoe_tsv_attr(fp, f, "layer");
    lrmoe_tsv_attr(fp, f, "step");
    fprintf(fp, "\t%" PRId64 "\t%" PRId64 "\t%d\t%" PRId64, in->T, in->E, in->K, es->total);
    fprintf(fp, "\t%" PRId64 "\t%.6f\t%.6f", es->max, es->mean, es->imbalance);
    if (ranks > 0)
        fprintf(fp, "\t%" PRId64 "\t%" PRId64 "\t%.6f\t%.6f", ranks, rs->max, rs->mean,
                rs->imbalance);
    else
        fprintf(fp, "\tNA\tNA\tNA\tNA");
    int64_t hot[HOT];
    int nh = lrmoe_route_hottest(load, in->E, HOT, hot);
    for (int i = 0; i < HOT; i++) {
        if (i < nh)
            fprintf(fp, "\t%" PRId64 "\t%.6f", hot[i],
                    es->total ? (double)load[hot[i]] / (double)es->total : 0.0);
        else
            fprintf(fp, "\tNA\tNA");
    }
    fputc('\n', fp);
    return ferror(fp) ? lrmoe_err("--stats: write error") : 0;
}

static int route_frame(lrmoe_frame_t *f, int64_t index, void *arg)
{
    ctx_t *c = arg;
    lrmoe_route_frame_info_t info;
    int rc = lrmoe_route_frame(f, &c->o, &info);
    notes(c, &info, index);
    if (rc < 0)
        return -1;
    return c->stats ? stats_row(c->stats, f, index, c->o.ranks, &info) : 0;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        LRMOE_STREAM_LONGOPTS,
        {"topk", required_argument, 0, 'k'},
        {"router", required_argument, 0, 'r'},
        {"renorm", no_argument, 0, 'n'},
        {"scale", required_argument, 0, OPT_SCALE},
        {"groups", required_argument, 0, 'G'},
        {"topk-groups", required_argument, 0, OPT_TOPK_GROUPS},
        {"weights", required_argument, 0, 'w'},
        {"from-hidden", no_argument, 0, OPT_FROM_HIDDEN},
        {"loads-only", no_argument, 0, OPT_LOADS_ONLY},
        {"verbose", no_argument, 0, 'v'},
        {"ranks", required_argument, 0, 'P'},
        {"ep", required_argument, 0, 'P'},
        {"stats", required_argument, 0, 'S'},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0}};
    lrmoe_io_t io;
    lrmoe_io_init(&io);
    ctx_t c;
    memset(&c, 0, sizeof c);
    lrmoe_route_opts_default(&c.o.ro);
    const char *stats_path = NULL;
    int ch;
    int64_t v;
    double d;
    while ((ch = getopt_long(argc, argv, LRMOE_STREAM_SHORTOPTS "k:r:nG:w:P:S:vhV",
                             longopts, NULL)) != -1) {
        int r = lrmoe_io_opt(&io, ch, optarg);
        if (r > 0)
            continue;
        if (r == 0) {
            switch (ch) {
            case 'k':
                r = lrmoe_parse_i64("--topk", optarg, 1, INT32_MAX, &v);
                c.o.ro.k = (int)v;
                c.o.k_given = 1;
                break;
            case 'r': r = lrmoe_route_parse_router(optarg, &c.o.ro.router); break;
            case 'n': c.o.ro.renorm = 1; break;
            case OPT_SCALE:
                r = lrmoe_parse_f64("--scale", optarg, -1e30, 1e30, &d);
                c.o.ro.scale = d;
                break;
            case 'G':
                r = lrmoe_parse_i64("--groups", optarg, 1, INT32_MAX, &v);
                c.o.ro.groups = (int)v;
                break;
            case OPT_TOPK_GROUPS:
                r = lrmoe_parse_i64("--topk-groups", optarg, 1, INT32_MAX, &v);
                c.o.ro.topk_groups = (int)v;
                break;
            case 'w': c.o.weights_name = optarg; break;
            case OPT_FROM_HIDDEN: c.o.from_hidden = 1; break;
            case OPT_LOADS_ONLY: c.o.loads_only = 1; break;
            case 'v': c.verbose = 1; break;
            case 'P': r = lrmoe_parse_i64("--ranks", optarg, 1, INT32_MAX, &c.o.ranks); break;
            case 'S': stats_path = optarg; break;
            case 'h': usage(stdout); return 0;
            case 'V': printf("lrmoe-route (lrmoe) %s\n", LRMOE_VERSION); return 0;
            default: return lrmoe_usage_error("lrmoe-route");
            }
        }
        if (r < 0) {
            fprintf(stderr, "lrmoe-route: %s\n", lrmoe_errmsg());
            return 2;
        }
    }
    if (argc - optind > 1) {
        fprintf(stderr, "lrmoe-route: too many input files (one FILE or stdin)\n");
        return 2;
    }
    c.o.ro.threads = io.w.threads > 0 ? io.w.threads : 1;
    if (lrmoe_route_check_opts(&c.o.ro) < 0) {
        fprintf(stderr, "lrmoe-route: %s\n", lrmoe_errmsg());
        return 2;
    }
    if (c.o.from_hidden && !c.o.weights_name) {
        fprintf(stderr, "lrmoe-route: --from-hidden needs --weights FILE\n");
        return 2;
    }
    /* the logits' F32 GEMM: OpenBLAS's pool at -@'s count, not one per core */
    if (c.o.from_hidden) lrmoe_blas_threads(c.o.ro.threads);
    if (lrmoe_check_tty_out(io.out, io.force) < 0) {
        fprintf(stderr, "lrmoe-route: %s\n", lrmoe_errmsg());
        return 2;
    }
    const char *in = optind < argc ? argv[optind] : "-";
    if (c.o.weights_name) {
        if (lrmoe_weights_open(c.o.weights_name, &c.w, &c.wm, c.o.ro.threads) < 0) {
            fprintf(stderr, "lrmoe-route: %s\n", lrmoe_errmsg());
            return 1;
        }
        c.o.weights = &c.w;
        c.o.weights_map = &c.wm;
    }
    lrmoe_filter_t run = {.in = in, .io = &io, .stats_path = stats_path,
                          .stats_header = stats_header, .stats = &c.stats,
                          .hooks = {.frame = route_frame, .ctx = &c}};
    int rc = lrmoe_filter_main(&run) < 0;
    if (rc)
        fprintf(stderr, "lrmoe-route: %s\n", lrmoe_errmsg());
    if (c.o.weights)
        lrmoe_weights_close(&c.w, &c.wm);
    return rc;
}
