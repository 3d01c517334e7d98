/* lrmoe-score: score every (token, expert) pair of the backward pass and keep
 * the highest-scoring ones inside each expert's quota. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lrmoe.h"
#include "tools.h"
#include "score.h"

static void usage(FILE *fp)
{
    fprintf(fp,
        "Usage: lrmoe-score [options] [FILE]\n"
        "Score each routed pair and keep, inside each expert, its quota: the\n"
        "highest scores (ties: lower pair index first) or a draw by score. Reads topk_ids,\n"
        "topk_weights, grad_output, phi_sqnorm and quota; writes pair_score and keep.\n\n"
        "Options:\n"
        "  -m, --metric NAME   lrm (default: alpha^2 ||g||^2 ||phi||^2), gradnorm,\n"
        "                      absgrad, random or uniform (1 for every pair)\n"
        "      --select RULE   sample (default: an unbiased draw of exactly the\n"
        "                      quota, p ~ sqrt(score); writes pair_weight = 1/p\n"
        "                      for the backward) or topk (the quota highest\n"
        "                      scores, the LRMoE paper's rule, biased)\n"
        "      --drop C        drop C percent of each expert's pairs (0..100) instead\n"
        "                      of the plan's quota; writes quota\n"
        "      --seed N        seed of the random metric and of sample (default 0;\n"
        "                      frame i uses N + i)\n"
        "      --fidelity      also write score_fidelity, the relative error of\n"
        "                      each expert's dW_down (needs saved_gate, saved_up),\n"
        "                      and score.fidelity.<grad>.{rel_err,norm_ratio,cosine,\n"
        "                      bias}: the estimate's error and its bias\n"
        "      --weights FILE  with --fidelity: the layer's weights stream, for the\n"
        "                      same figures of dW_gate, dW_up and dx (needs hidden)\n"
        "  -S, --stats FILE    one TSV row per frame: pairs kept and dropped, time\n"
        "                      (- : stdout, or stderr when the stream goes there)\n"
        "  -v, --verbose       one line per frame on stderr\n"
        "  -o, --output FILE   write to FILE (default stdout)\n"
        "  -l, --level N       zstd level (default: 1 to a file, raw to a pipe)\n"
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
    FILE *stats;
    lrmoe_weights_t *w;   /* --weights (with --fidelity), or NULL */
    lrmoe_wmap_t wm;      /* its mapping (a raw file), base NULL: read */
} ctx_t;

/* The --stats table's header, a column per value of its rows */
static const char stats_header[] =
    "frame\tlayer\tstep\tmetric\tpairs\tkept\tdropped\tretained"
    "\tdropped_score_share\tfidelity\tscore_ms\tselect"
    "\tdw_down_rel_err\tdw_down_cosine\tdw_down_bias\tdx_rel_err"
    "\tdx_bias\n";

static int on_frame(lrmoe_frame_t *f, int64_t index, void *vctx)
{
    ctx_t *c = vctx;
    lrmoe_score_stats_t st;
    if (lrmoe_score_frame_w(f, index, &c->o, c->w, &c->wm, &st) < 0)
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
    if (c->stats) {
        FILE *fp = c->stats;
        fprintf(fp, "%lld", (long long)index);
        lrmoe_tsv_attr(fp, f, "layer");
        lrmoe_tsv_attr(fp, f, "step");
        fprintf(fp, "\t%s\t%lld\t%lld\t%lld\t%.6f\t%.6g", lrmoe_score_metric_name(c->o.metric),
                (long long)st.pairs, (long long)st.kept, (long long)(st.pairs - st.kept),
                st.retained, st.dropped_share);
        if (st.fidelity >= 0)
            fprintf(fp, "\t%.6g", st.fidelity);
        else
            fputs("\tNA", fp);
        fprintf(fp, "\t%.3f\t%s", st.seconds * 1e3, lrmoe_score_keep_rule_name(c->o.select));
        /* the fidelity split (NA without --fidelity, dW_gate/dx without --weights) */
        static const char *const fk[5] = {
            "score.fidelity.dw_down.rel_err", "score.fidelity.dw_down.cosine",
            "score.fidelity.dw_down.bias", "score.fidelity.dx.rel_err",
            "score.fidelity.dx.bias"};
        for (int i = 0; i < 5; i++)
            lrmoe_tsv_attr(fp, f, fk[i]);
        fputc('\n', fp);
        if (ferror(fp))
            return lrmoe_err("--stats: write error");
    }
    return 0;
}

enum { OPT_FIDELITY = 0x2001, OPT_DROP, OPT_SEED, OPT_SELECT, OPT_WEIGHTS };

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        LRMOE_STREAM_LONGOPTS,
        {"metric", required_argument, 0, 'm'},
        {"drop", required_argument, 0, OPT_DROP},
        {"seed", required_argument, 0, OPT_SEED},
        {"select", required_argument, 0, OPT_SELECT},
        {"weights", required_argument, 0, OPT_WEIGHTS},
        {"stats", required_argument, 0, 'S'},
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
    c.stats = NULL;
    const char *stats_path = NULL, *weights_path = NULL;
    lrmoe_weights_t wts;
    c.w = NULL;
    memset(&c.wm, 0, sizeof c.wm);
    int ch;
    int64_t seed;
    while ((ch = getopt_long(argc, argv, LRMOE_STREAM_SHORTOPTS "m:S:vhV",
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
        case OPT_SELECT:
            if (lrmoe_score_keep_rule_parse(optarg, &c.o.select) < 0)
                goto bad;
            break;
        case OPT_DROP:
            if (lrmoe_parse_f64("--drop", optarg, 0, 100, &c.o.drop_pct) < 0)
                goto bad;
            break;
        case OPT_SEED:
            if (lrmoe_parse_i64("--seed", optarg, 0, INT64_MAX, &seed) < 0)
                goto bad;
            c.o.seed = (uint64_t)seed;
            break;
        case OPT_FIDELITY: c.o.fidelity = 1; break;
        case OPT_WEIGHTS: weights_path = optarg; break;
        case 'S': stats_path = optarg; break;
        case 'v': c.verbose = 1; break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("lrmoe-score (lrmoe) %s\n", LRMOE_VERSION); return 0;
        default: return lrmoe_usage_error("lrmoe-score");
        }
    }
    if (argc - optind > 1) {
        fprintf(stderr, "lrmoe-score: too many input files\n");
        return lrmoe_usage_error("lrmoe-score");
    }
    c.o.threads = io.w.threads > 1 ? io.w.threads : 1;
    if (weights_path && !c.o.fidelity) {
        fprintf(stderr, "lrmoe-score: --weights is only read with --fidelity\n");
        return lrmoe_usage_error("lrmoe-score");
    }
    if (weights_path) {
        if (lrmoe_weights_open(weights_path, &wts, &c.wm, c.o.threads) < 0) {
            fprintf(stderr, "lrmoe-score: --weights %s: %s\n", weights_path, lrmoe_errmsg());
            return 1;
        }
        c.w = &wts;
    }
    if (lrmoe_check_tty_out(io.out, io.force) < 0)
        goto bad;
    const char *in = optind < argc ? argv[optind] : "-";
    lrmoe_filter_t run = {.in = in, .io = &io, .stats_path = stats_path,
                          .stats_header = stats_header, .stats = &c.stats,
                          .hooks = {.frame = on_frame, .ctx = &c}};
    int rc = lrmoe_filter_main(&run) < 0;
    if (rc)
        fprintf(stderr, "lrmoe-score: %s\n", lrmoe_errmsg());
    if (c.w)
        lrmoe_weights_close(c.w, &c.wm);
    return rc;
bad:
    fprintf(stderr, "lrmoe-score: %s\n", lrmoe_errmsg());
    return 2;
}
