/* lrmoe-route: top-K routing of router logits and load statistics. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "blas.h"
#include "lrmoe.h"
#include "route.h"

#define HOT 3 /* hottest experts in the stats TSV */

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
    lrmoe_route_opts_t ro;
    int64_t ep;           /* 0: no per-rank load */
    int k_given;          /* -k given: ignore the frames' topk attribute */
    int from_hidden;
    int loads_only;       /* drop every tensor but the loads after routing */
    int verbose;
    int noted_k, noted_bias; /* each note once */
    lrmoe_weights_t w;
    int have_w;
    const char *wpath;
    FILE *stats;
} ctx_t;

/* The weights frame for this input frame's layer (NULL with error). */
static const lrmoe_frame_t *weights_for(const ctx_t *c, const lrmoe_frame_t *f)
{
    int64_t layer;
    int rc = lrmoe_frame_attr_i64(f, "layer", &layer);
    if (rc < 0)
        return NULL;
    if (rc == 0) {
        if (c->w.n == 1)
            return &c->w.frames[0];
        lrmoe_err("no layer attribute, and %s holds %d layers", c->wpath, c->w.n);
        return NULL;
    }
    const lrmoe_frame_t *wf = lrmoe_weights_layer(&c->w, layer);
    if (!wf)
        lrmoe_err("%s: no weights for layer %" PRId64, c->wpath, layer);
    return wf;
}

static void attr_or_na(FILE *fp, const lrmoe_frame_t *f, const char *key)
{
    const char *v = lrmoe_frame_attr(f, key);
    fprintf(fp, "\t%s", v && *v && !strpbrk(v, "\t\n") ? v : "NA");
}

static int route_frame(lrmoe_frame_t *f, int64_t index, void *arg)
{
    ctx_t *c = arg;
    const lrmoe_frame_t *wf = NULL;
    /* K: --topk, else the frame's topk attribute (lrmoe-gen writes it), else 8 */
    lrmoe_route_opts_t ro = c->ro;
    const char *k_from = c->k_given ? "option" : "default";
    if (!c->k_given) {
        int64_t k;
        int rc = lrmoe_frame_attr_i64(f, "topk", &k);
        if (rc < 0)
            return lrmoe_err("attribute topk '%s' is not an integer",
                             lrmoe_frame_attr(f, "topk"));
        if (rc > 0) {
            if (k < 1 || k > INT32_MAX)
                return lrmoe_err("attribute topk %" PRId64 ": must be at least 1", k);
            ro.k = (int)k;
            k_from = "frame";
        } else if (c->verbose && !c->noted_k) {
            fprintf(stderr, "lrmoe-route: note: frame %" PRId64 " has no topk attribute and "
                    "-k was not given: K=%d (route.topk_from=default)\n", index, ro.k);
            c->noted_k = 1;
        }
    }
    if (c->have_w && !(wf = weights_for(c, f)))
        return -1;

    /* the logits: router_logits, or hidden x router_weight */
    lrmoe_tensor_t *lg = lrmoe_frame_get(f, "router_logits");
    lrmoe_tensor_t *rw = wf ? lrmoe_frame_get(wf, "router_weight") : NULL;
    lrmoe_tensor_t *hid = NULL;
    if (c->from_hidden || !lg) {
        if (!wf || !rw) {
            if (wf)
                return lrmoe_err("%s: missing tensor router_weight", c->wpath);
            return lrmoe_err("missing tensor router_logits (or hidden with "
                             "router_weight from --weights)");
        }
        if (!(hid = lrmoe_frame_need(f, "hidden")))
            return -1;
    }
    int64_t T, E;
    float *computed = NULL;
    const void *logits;
    lrmoe_dtype_t dt;
    char b1[64], b2[64];
    if (hid) {
        if (hid->ndim != 2)
            return lrmoe_err("hidden: shape %s, expected [T,D]", lrmoe_shape_str(hid, b1, sizeof b1));
        if (rw->ndim != 2 || rw->shape[1] != hid->shape[1])
            return lrmoe_err("router_weight: shape %s does not match hidden %s (expected [E,%" PRId64 "])",
                             lrmoe_shape_str(rw, b1, sizeof b1),
                             lrmoe_shape_str(hid, b2, sizeof b2), hid->shape[1]);
        T = hid->shape[0];
        E = rw->shape[0];
        if (lrmoe_route_check(&ro, E) < 0)
            return -1;
        computed = malloc((size_t)(T * E > 0 ? T * E : 1) * sizeof(float));
        if (!computed)
            return lrmoe_err("out of memory");
        if (lrmoe_route_logits(T, hid->shape[1], E, hid->dtype, hid->data, rw->dtype,
                               rw->data, computed) < 0) {
            free(computed);
            return -1;
        }
        logits = computed;
        dt = LRMOE_F32;
    } else {
        if (lg->ndim != 2)
            return lrmoe_err("router_logits: shape %s, expected [T,E]",
                             lrmoe_shape_str(lg, b1, sizeof b1));
        T = lg->shape[0];
        E = lg->shape[1];
        if (rw && rw->shape[0] != E)
            return lrmoe_err("router_weight: shape %s does not match router_logits %s",
                             lrmoe_shape_str(rw, b1, sizeof b1),
                             lrmoe_shape_str(lg, b2, sizeof b2));
        if (lrmoe_route_check(&ro, E) < 0)
            return -1;
        logits = lg->data;
        dt = lg->dtype;
    }

    /* selection-only bias: the frame's expert_bias, else the weights'; the
     * softmax routers have none, so one found there is recorded as ignored */
    float *bias = NULL;
    const char *bias_use = "none";
    if (ro.router != LRMOE_ROUTER_SIGMOID &&
        (lrmoe_frame_get(f, "expert_bias") || (wf && lrmoe_frame_get(wf, "expert_bias")))) {
        bias_use = "ignored";
        if (c->verbose && !c->noted_bias) {
            fprintf(stderr, "lrmoe-route: note: frame %" PRId64 ": expert_bias ignored by the "
                    "%s router (only sigmoid uses it: -r sigmoid)\n", index,
                    lrmoe_route_router_name(ro.router));
            c->noted_bias = 1;
        }
    }
    if (ro.router == LRMOE_ROUTER_SIGMOID) {
        lrmoe_tensor_t *bt = lrmoe_frame_get(f, "expert_bias");
        if (!bt && wf)
            bt = lrmoe_frame_get(wf, "expert_bias");
        if (bt) {
            int64_t dims[1] = {E};
            if (lrmoe_tensor_check(bt, 1, dims) < 0 || !(bias = lrmoe_tensor_f32(bt))) {
                free(computed);
                return -1;
            }
            bias_use = "used";
        }
    }

    int K = ro.k;
    int64_t dtk[2] = {T, K}, de[1] = {E};
    lrmoe_tensor_t *ti = lrmoe_frame_put(f, "topk_ids", LRMOE_I32, 2, dtk);
    lrmoe_tensor_t *tw = ti ? lrmoe_frame_put(f, "topk_weights", LRMOE_F32, 2, dtk) : NULL;
    lrmoe_tensor_t *tl = tw ? lrmoe_frame_put(f, "expert_load", LRMOE_I64, 1, de) : NULL;
    int rc = tl ? 0 : -1;
    if (!rc) {
        /* hid == NULL: logits still points into router_logits, untouched by put */
        rc = lrmoe_route_topk(&ro, T, E, dt, logits, bias, ti->data, tw->data, tl->data);
    }
    free(computed);
    free(bias);
    if (rc < 0)
        return -1;

    const int64_t *load = tl->data;
    lrmoe_load_stats_t es, rs = {0, 0, 0, 0};
    lrmoe_route_load_stats(load, E, &es);
    if (c->ep > 0) {
        int64_t dp[1] = {c->ep};
        lrmoe_tensor_t *tr = lrmoe_frame_put(f, "rank_load", LRMOE_I64, 1, dp);
        if (!tr || lrmoe_route_rank_load(E, c->ep, load, tr->data) < 0)
            return -1;
        lrmoe_route_load_stats(tr->data, c->ep, &rs);
    }
    if (lrmoe_frame_set_attr(f, "route.router", lrmoe_route_router_name(ro.router)) < 0 ||
        lrmoe_frame_set_attrf(f, "route.topk", "%d", K) < 0 ||
        lrmoe_frame_set_attr(f, "route.topk_from", k_from) < 0 ||
        lrmoe_frame_set_attr(f, "route.expert_bias", bias_use) < 0 ||
        lrmoe_frame_set_attrf(f, "route.renorm", "%d", ro.renorm) < 0 ||
        lrmoe_frame_set_attrf(f, "route.scale", "%.17g", ro.scale) < 0 ||
        lrmoe_frame_set_attrf(f, "route.expert_max", "%" PRId64, es.max) < 0 ||
        lrmoe_frame_set_attrf(f, "route.expert_mean", "%.6f", es.mean) < 0 ||
        lrmoe_frame_set_attrf(f, "route.expert_imbalance", "%.6f", es.imbalance) < 0)
        return -1;
    if (ro.groups > 1 &&
        (lrmoe_frame_set_attrf(f, "route.groups", "%d", ro.groups) < 0 ||
         lrmoe_frame_set_attrf(f, "route.topk_groups", "%d", ro.topk_groups) < 0))
        return -1;
    if (c->ep > 0 &&
        (lrmoe_frame_set_attrf(f, "route.ep", "%" PRId64, c->ep) < 0 ||
         lrmoe_frame_set_attrf(f, "route.rank_max", "%" PRId64, rs.max) < 0 ||
         lrmoe_frame_set_attrf(f, "route.rank_mean", "%.6f", rs.mean) < 0 ||
         lrmoe_frame_set_attrf(f, "route.rank_imbalance", "%.6f", rs.imbalance) < 0))
        return -1;

    if (c->stats) {
        FILE *fp = c->stats;
        fprintf(fp, "%" PRId64, index);
        attr_or_na(fp, f, "layer");
        attr_or_na(fp, f, "step");
        fprintf(fp, "\t%" PRId64 "\t%" PRId64 "\t%d\t%" PRId64, T, E, K, es.total);
        fprintf(fp, "\t%" PRId64 "\t%.6f\t%.6f", es.max, es.mean, es.imbalance);
        if (c->ep > 0)
            fprintf(fp, "\t%" PRId64 "\t%" PRId64 "\t%.6f\t%.6f", c->ep, rs.max, rs.mean,
                    rs.imbalance);
        else
            fprintf(fp, "\tNA\tNA\tNA\tNA");
        int64_t hot[HOT];
        int nh = lrmoe_route_hottest(load, E, HOT, hot);
        for (int i = 0; i < HOT; i++) {
            if (i < nh)
                fprintf(fp, "\t%" PRId64 "\t%.6f", hot[i],
                        es.total ? (double)load[hot[i]] / (double)es.total : 0.0);
            else
                fprintf(fp, "\tNA\tNA");
        }
        fputc('\n', fp);
        if (ferror(fp))
            return lrmoe_err("--stats: write error");
    }
    if (c->loads_only) {
        /* the sizes the dropped tensors said, for lrmoe-plan and lrmoe-sim */
        static const char *keep[] = {"expert_load", "rank_load"};
        const lrmoe_tensor_t *h = lrmoe_frame_get(f, "hidden");
        if (h && h->ndim == 2 &&
            (lrmoe_frame_set_attrf(f, "route.hidden", "%" PRId64, h->shape[1]) < 0 ||
             lrmoe_frame_set_attrf(f, "route.tokens", "%" PRId64, h->shape[0]) < 0))
            return -1;
        if (lrmoe_frame_keep_only(f, keep, 2) < 0)
            return -1;
    }
    return 0;
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
    lrmoe_route_opts_default(&c.ro);
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
                c.ro.k = (int)v;
                c.k_given = 1;
                break;
            case 'r': r = lrmoe_route_parse_router(optarg, &c.ro.router); break;
            case 'n': c.ro.renorm = 1; break;
            case OPT_SCALE:
                r = lrmoe_parse_f64("--scale", optarg, -1e30, 1e30, &d);
                c.ro.scale = d;
                break;
            case 'G':
                r = lrmoe_parse_i64("--groups", optarg, 1, INT32_MAX, &v);
                c.ro.groups = (int)v;
                break;
            case OPT_TOPK_GROUPS:
                r = lrmoe_parse_i64("--topk-groups", optarg, 1, INT32_MAX, &v);
                c.ro.topk_groups = (int)v;
                break;
            case 'w': c.wpath = optarg; break;
            case OPT_FROM_HIDDEN: c.from_hidden = 1; break;
            case OPT_LOADS_ONLY: c.loads_only = 1; break;
            case 'v': c.verbose = 1; break;
            case 'P': r = lrmoe_parse_i64("--ranks", optarg, 1, INT32_MAX, &c.ep); break;
            case 'S': stats_path = optarg; break;
            case 'h': usage(stdout); return 0;
            case 'V': printf("lrmoe-route (lrmoe) %s\n", LRMOE_VERSION); return 0;
            default: usage(stderr); return 2;
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
    c.ro.threads = io.w.threads > 0 ? io.w.threads : 1;
    if (lrmoe_route_check_opts(&c.ro) < 0) {
        fprintf(stderr, "lrmoe-route: %s\n", lrmoe_errmsg());
        return 2;
    }
    if (c.from_hidden && !c.wpath) {
        fprintf(stderr, "lrmoe-route: --from-hidden needs --weights FILE\n");
        return 2;
    }
    /* the logits' F32 GEMM: OpenBLAS's pool at -@'s count, not one per core */
    if (c.from_hidden) lrmoe_blas_threads(c.ro.threads);
    if (lrmoe_check_tty_out(io.out, io.force) < 0) {
        fprintf(stderr, "lrmoe-route: %s\n", lrmoe_errmsg());
        return 2;
    }
    const char *in = optind < argc ? argv[optind] : "-";
    if (c.wpath) {
        if (lrmoe_weights_load(c.wpath, &c.w) < 0) {
            fprintf(stderr, "lrmoe-route: %s\n", lrmoe_errmsg());
            return 1;
        }
        c.have_w = 1;
    }
    if (stats_path) {
        if (!(c.stats = lrmoe_stats_open(stats_path, io.out))) {
            fprintf(stderr, "lrmoe-route: %s: ", stats_path);
            perror(NULL);
            if (c.have_w)
                lrmoe_weights_free(&c.w);
            return 1;
        }
        fprintf(c.stats, "frame\tlayer\tstep\ttokens\texperts\ttopk\tpairs"
                         "\texpert_max\texpert_mean\texpert_imbalance"
                         "\tranks\trank_max\trank_mean\trank_imbalance");
        for (int i = 1; i <= HOT; i++)
            fprintf(c.stats, "\thot%d\thot%d_share", i, i);
        fputc('\n', c.stats);
    }
    int64_t n = lrmoe_filter_run(in, io.out, &io.w, route_frame, &c);
    int rc = 0;
    if (n < 0) {
        fprintf(stderr, "lrmoe-route: %s\n", lrmoe_errmsg());
        rc = 1;
    }
    if (c.stats && lrmoe_stats_close(c.stats) != 0 && !rc) {
        fprintf(stderr, "lrmoe-route: %s: ", stats_path);
        perror(NULL);
        rc = 1;
    }
    if (c.have_w)
        lrmoe_weights_free(&c.w);
    return rc;
}
