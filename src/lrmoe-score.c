/* lrmoe-score: score every (token, expert) pair of the backward pass and keep
 * the highest-scoring ones inside each expert's quota. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lrmoe.h"
#include "score.h"

static void usage(FILE *fp)
{
    fprintf(fp,
        "Usage: lrmoe-score [options] [FILE]\n"
        "Score each routed pair and keep, inside each expert, its quota of the\n"
        "highest scores (ties: lower pair index first). Reads topk_ids,\n"
        "topk_weights, grad_output, phi_sqnorm and quota; writes pair_score and keep.\n\n"
        "Options:\n"
        "  -m, --metric NAME   lrm (default: alpha^2 ||g||^2 ||phi||^2), gradnorm,\n"
        "                      absgrad or random\n"
        "  -d, --drop C        drop C percent of each expert's pairs (0..100) instead\n"
        "                      of the plan's quota; writes quota\n"
        "  -s, --seed N        seed of the random metric (default 0)\n"
        "      --fidelity      also write score_fidelity, the relative error of\n"
        "                      each expert's dW_down (needs saved_gate, saved_up)\n"
        "  -v, --verbose       one line per frame on stderr\n"
        "  -o, --output FILE   write to FILE (default stdout)\n"
        "  -l, --level N       zstd level (default 3)\n"
        "  -@, --threads N     scoring threads and zstd workers (default 0: one\n"
        "                      scoring thread); results do not depend on N\n"
        "      --no-compress   write a raw stream\n"
        "  -f, --force         write binary to a terminal\n"
        "  -h, --help          this help\n"
        "  -V, --version       print the version\n");
}

typedef struct {
    lrmoe_score_opts_t o;
    int verbose;
} ctx_t;

static int on_frame(lrmoe_frame_t *f, int64_t index, void *vctx)
{
    ctx_t *c = vctx;
    lrmoe_score_stats_t st;
    if (lrmoe_score_frame(f, index, &c->o, &st) < 0)
        return -1;
    if (c->verbose) {
        fprintf(stderr, "lrmoe-score: frame %lld: %s kept %lld/%lld (%.4f), "
                "dropped score share %.6g", (long long)index,
                lrmoe_score_metric_name(c->o.metric), (long long)st.kept,
                (long long)st.pairs, st.retained, st.dropped_share);
        if (st.fidelity >= 0)
            fprintf(stderr, ", fidelity %.6g", st.fidelity);
        fprintf(stderr, ", %.3f ms\n", st.seconds * 1e3);
    }
    return 0;
}

enum { OPT_FIDELITY = 0x2001 };

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        LRMOE_STREAM_LONGOPTS,
        {"metric", required_argument, 0, 'm'},
        {"drop", required_argument, 0, 'd'},
        {"seed", required_argument, 0, 's'},
        {"fidelity", no_argument, 0, OPT_FIDELITY},
        {"verbose", no_argument, 0, 'v'},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0}};
    lrmoe_io_t io;
    ctx_t c;
    lrmoe_io_init(&io);
    lrmoe_score_opts_default(&c.o);
    c.verbose = 0;
    int ch;
    int64_t seed;
    while ((ch = getopt_long(argc, argv, LRMOE_STREAM_SHORTOPTS "m:d:s:vhV",
                             longopts, NULL)) != -1) {
        int r = lrmoe_io_opt(&io, ch, optarg);
        if (r > 0)
            continue;
        if (r < 0)
            goto bad;
        switch (ch) {
        case 'm':
            if (lrmoe_score_metric_parse(optarg, &c.o.metric) < 0)
                goto bad;
            break;
        case 'd':
            if (lrmoe_parse_f64("--drop", optarg, 0, 100, &c.o.drop_pct) < 0)
                goto bad;
            break;
        case 's':
            if (lrmoe_parse_i64("--seed", optarg, 0, INT64_MAX, &seed) < 0)
                goto bad;
            c.o.seed = (uint64_t)seed;
            break;
        case OPT_FIDELITY: c.o.fidelity = 1; break;
        case 'v': c.verbose = 1; break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("lrmoe-score (lrmoe) %s\n", LRMOE_VERSION); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (argc - optind > 1) {
        fprintf(stderr, "lrmoe-score: too many input files\n");
        usage(stderr);
        return 2;
    }
    c.o.threads = io.w.threads > 1 ? io.w.threads : 1;
    if (lrmoe_check_tty_out(io.out, io.force) < 0)
        goto bad;
    const char *in = optind < argc ? argv[optind] : "-";
    if (lrmoe_filter_run(in, io.out, &io.w, on_frame, &c) < 0) {
        fprintf(stderr, "lrmoe-score: %s\n", lrmoe_errmsg());
        return 1;
    }
    return 0;
bad:
    fprintf(stderr, "lrmoe-score: %s\n", lrmoe_errmsg());
    return 2;
}
