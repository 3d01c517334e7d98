/* lrmoe-gen: synthetic MoE workloads (hidden, router_logits, grad_output) and
 * weights streams, with controlled routing skew. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen.h"
#include "lrmoe.h"
#include "tools.h"

static void usage(FILE *fp)
{
    fprintf(fp,
        "Usage: lrmoe-gen [options]\n"
        "Write a stream of synthetic MoE layer invocations: hidden [T,D],\n"
        "router_logits [T,E] and grad_output [T,D], --layers x --steps frames\n"
        "(step-major), with the routing skew asked for. Same seed, same bytes.\n\n"
        "Shape:\n"
        "      --preset NAME     model shapes (default qwen3-30b-a3b)\n"
        "      --list-presets    print the presets and exit\n"
        "      --tokens T        tokens per frame (default 4096)\n"
        "      --experts E       override the preset's experts\n"
        "      --topk K          override the preset's top-k\n"
        "      --hidden D        override the preset's hidden size\n"
        "      --ffn F           override the preset's expert FFN width\n"
        "      --layers L        layers per step (default 1)\n"
        "      --steps S         steps (default 1)\n"
        "      --dtype DT        hidden, grad_output, weights: bf16 (default), f32, f16\n"
        "      --logits-dtype DT router_logits: f32 (default), bf16, f16\n"
        "      --seed N          random seed (default 1)\n"
        "      --routing-only    write router_logits only (no hidden, grad_output):\n"
        "                        time and memory O(T*E); the attribute hidden says D\n"
        "      --loads-only      write expert_load [E] only, routed as lrmoe-route\n"
        "                        --loads-only would (softmax top-K): memory O(E)\n"
        "Routing skew (the last one given wins):\n"
        "      --skew SPEC       balanced (default), hot:PCT:N or zipf:S\n"
        "      --hot PCT:N       PCT%% of the tokens go to N hot experts, uniformly\n"
        "      --zipf S          expert popularity ~ 1/rank^S\n"
        "      --hot-experts L   comma-separated hot expert ids (default: seeded)\n"
        "      --drift R         popularity ranks move R experts per layer and step\n"
        "      --margin M        hot logit margin (default 1, at least 0.5)\n"
        "Values:\n"
        "      --hidden-scale X  std of hidden (default 1)\n"
        "      --grad-scale X    scale of grad_output (default 1)\n"
        "      --grad-sigma X    log-normal sigma of per-token grad scale (default 1)\n"
        "Weights:\n"
        "      --weights FILE    also write a weights stream, one frame per layer\n"
        "      --weight-scale X  multiply the init std 1/sqrt(D), 1/sqrt(F) (default 1)\n"
        "      --router-init M   router_weight: zero (default) or normal\n"
        "Output:\n"
        "  -o, --output FILE     write to FILE (default stdout)\n"
        "  -l, --level N         zstd level (default: 1 to a file, raw to a pipe)\n"
        "  -@, --threads N       generator and zstd worker threads (default 0: one)\n"
        "      --no-compress     write a raw stream\n"
        "  -f, --force           write binary to a terminal\n"
        "  -h, --help            this help\n"
        "  -V, --version         print the version\n");
}

static void list_presets(void)
{
    int n;
    const lrmoe_gen_preset_t *p = lrmoe_gen_presets(&n);
    printf("%-16s %5s %3s %6s %6s  %s\n", "preset", "E", "K", "D", "F", "model");
    for (int i = 0; i < n; i++)
        printf("%-16s %5" PRId64 " %3" PRId64 " %6" PRId64 " %6" PRId64 "  %s\n", p[i].name,
               p[i].E, p[i].K, p[i].D, p[i].F, p[i].note);
}

enum {
    OPT_PRESET = 0x2000, OPT_LIST, OPT_TOKENS, OPT_EXPERTS, OPT_TOPK, OPT_HIDDEN,
    OPT_FFN, OPT_LAYERS, OPT_STEPS, OPT_DTYPE, OPT_LDTYPE, OPT_SEED, OPT_SKEW,
    OPT_HOT, OPT_ZIPF, OPT_HOTLIST, OPT_DRIFT, OPT_MARGIN, OPT_HSCALE, OPT_GSCALE,
    OPT_GSIGMA, OPT_WEIGHTS, OPT_WSCALE, OPT_RINIT, OPT_ROUTING_ONLY, OPT_LOADS_ONLY
};

#define FAIL(code) do { fprintf(stderr, "lrmoe-gen: %s\n", lrmoe_errmsg()); return code; } while (0)

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        LRMOE_STREAM_LONGOPTS,
        {"preset", required_argument, 0, OPT_PRESET},
        {"list-presets", no_argument, 0, OPT_LIST},
        {"tokens", required_argument, 0, OPT_TOKENS},
        {"experts", required_argument, 0, OPT_EXPERTS},
        {"topk", required_argument, 0, OPT_TOPK},
        {"hidden", required_argument, 0, OPT_HIDDEN},
        {"ffn", required_argument, 0, OPT_FFN},
        {"layers", required_argument, 0, OPT_LAYERS},
        {"steps", required_argument, 0, OPT_STEPS},
        {"dtype", required_argument, 0, OPT_DTYPE},
        {"logits-dtype", required_argument, 0, OPT_LDTYPE},
        {"seed", required_argument, 0, OPT_SEED},
        {"skew", required_argument, 0, OPT_SKEW},
        {"hot", required_argument, 0, OPT_HOT},
        {"zipf", required_argument, 0, OPT_ZIPF},
        {"hot-experts", required_argument, 0, OPT_HOTLIST},
        {"drift", required_argument, 0, OPT_DRIFT},
        {"margin", required_argument, 0, OPT_MARGIN},
        {"hidden-scale", required_argument, 0, OPT_HSCALE},
        {"grad-scale", required_argument, 0, OPT_GSCALE},
        {"grad-sigma", required_argument, 0, OPT_GSIGMA},
        {"weights", required_argument, 0, OPT_WEIGHTS},
        {"weight-scale", required_argument, 0, OPT_WSCALE},
        {"router-init", required_argument, 0, OPT_RINIT},
        {"routing-only", no_argument, 0, OPT_ROUTING_ONLY},
        {"loads-only", no_argument, 0, OPT_LOADS_ONLY},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0}};
    lrmoe_io_t io;
    lrmoe_io_init(&io);
    lrmoe_gen_opts_t o;
    lrmoe_gen_opts_default(&o);
    const char *preset = NULL, *skew = NULL, *hotlist = NULL, *weights = NULL;
    char skewbuf[160];
    int64_t T = -1, E = -1, K = -1, D = -1, F = -1, layers = 1, steps = 1, v;
    double x;
    int c;
    while ((c = getopt_long(argc, argv, LRMOE_STREAM_SHORTOPTS "hV", longopts, NULL)) != -1) {
        int r = lrmoe_io_opt(&io, c, optarg);
        if (r > 0)
            continue;
        if (r < 0)
            FAIL(2);
        switch (c) {
        case 'h': usage(stdout); return 0;
        case 'V': printf("lrmoe-gen (lrmoe) %s\n", LRMOE_VERSION); return 0;
        case OPT_LIST: list_presets(); return 0;
        case OPT_PRESET: preset = optarg; break;
        case OPT_TOKENS:
            if (lrmoe_parse_i64("--tokens", optarg, 1, INT64_C(1) << 40, &T) < 0) FAIL(2);
            break;
        case OPT_EXPERTS:
            if (lrmoe_parse_i64("--experts", optarg, 1, 1 << 20, &E) < 0) FAIL(2);
            break;
        case OPT_TOPK:
            if (lrmoe_parse_i64("--topk", optarg, 1, 1 << 20, &K) < 0) FAIL(2);
            break;
        case OPT_HIDDEN:
            if (lrmoe_parse_i64("--hidden", optarg, 1, 1 << 24, &D) < 0) FAIL(2);
            break;
        case OPT_FFN:
            if (lrmoe_parse_i64("--ffn", optarg, 1, 1 << 24, &F) < 0) FAIL(2);
            break;
        case OPT_LAYERS:
            if (lrmoe_parse_i64("--layers", optarg, 1, 1 << 20, &layers) < 0) FAIL(2);
            break;
        case OPT_STEPS:
            if (lrmoe_parse_i64("--steps", optarg, 0, INT64_C(1) << 40, &steps) < 0) FAIL(2);
            break;
        case OPT_DTYPE:
        case OPT_LDTYPE: {
            lrmoe_dtype_t dt;
            if (lrmoe_dtype_parse(optarg, &dt) < 0 ||
                !(dt == LRMOE_BF16 || dt == LRMOE_F16 || dt == LRMOE_F32)) {
                fprintf(stderr, "lrmoe-gen: %s: '%s' is not bf16, f16 or f32\n",
                        c == OPT_DTYPE ? "--dtype" : "--logits-dtype", optarg);
                return 2;
            }
            *(c == OPT_DTYPE ? &o.dtype : &o.logits_dtype) = dt;
            break;
        }
        case OPT_SEED:
            if (lrmoe_parse_i64("--seed", optarg, 0, INT64_MAX, &v) < 0) FAIL(2);
            o.seed = (uint64_t)v;
            break;
        case OPT_SKEW: skew = optarg; break;
        case OPT_HOT:
            snprintf(skewbuf, sizeof skewbuf, "hot:%s", optarg);
            skew = skewbuf;
            break;
        case OPT_ZIPF:
            snprintf(skewbuf, sizeof skewbuf, "zipf:%s", optarg);
            skew = skewbuf;
            break;
        case OPT_HOTLIST: hotlist = optarg; break;
        case OPT_DRIFT:
            if (lrmoe_parse_f64("--drift", optarg, 0, 1e6, &o.drift) < 0) FAIL(2);
            break;
        case OPT_MARGIN:
            if (lrmoe_parse_f64("--margin", optarg, 0.5, 50, &o.margin) < 0) FAIL(2);
            break;
        case OPT_HSCALE:
            if (lrmoe_parse_f64("--hidden-scale", optarg, 0, 1e30, &o.hidden_scale) < 0) FAIL(2);
            break;
        case OPT_GSCALE:
            if (lrmoe_parse_f64("--grad-scale", optarg, 0, 1e30, &o.grad_scale) < 0) FAIL(2);
            break;
        case OPT_GSIGMA:
            if (lrmoe_parse_f64("--grad-sigma", optarg, 0, 10, &o.grad_sigma) < 0) FAIL(2);
            break;
        case OPT_WEIGHTS: weights = optarg; break;
        case OPT_ROUTING_ONLY:
        case OPT_LOADS_ONLY: {
            int m = c == OPT_LOADS_ONLY ? LRMOE_GEN_LOADS : LRMOE_GEN_LOGITS;
            if (o.routing != LRMOE_GEN_FULL && o.routing != m) {
                fprintf(stderr, "lrmoe-gen: --routing-only and --loads-only: give one\n");
                return 2;
            }
            o.routing = m;
            break;
        }
        case OPT_WSCALE:
            if (lrmoe_parse_f64("--weight-scale", optarg, 0, 1e30, &x) < 0) FAIL(2);
            o.weight_scale = x;
            break;
        case OPT_RINIT:
            if (!strcmp(optarg, "zero"))
                o.router_init = 0;
            else if (!strcmp(optarg, "normal"))
                o.router_init = 1;
            else {
                fprintf(stderr, "lrmoe-gen: --router-init: '%s' is not zero or normal\n", optarg);
                return 2;
            }
            break;
        default: return lrmoe_usage_error("lrmoe-gen");
        }
    }
    if (optind < argc) {
        fprintf(stderr, "lrmoe-gen: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (preset && lrmoe_gen_apply_preset(&o, preset) < 0)
        FAIL(2);
    if (E > 0 || K > 0 || D > 0 || F > 0)
        snprintf(o.model, sizeof o.model, "custom");
    if (T > 0) o.T = T;
    if (E > 0) o.E = E;
    if (K > 0) o.K = K;
    if (D > 0) o.D = D;
    if (F > 0) o.F = F;
    if (skew && lrmoe_gen_parse_skew(&o, skew) < 0)
        FAIL(2);
    if (hotlist && lrmoe_gen_parse_hot_list(&o, hotlist) < 0)
        FAIL(2);
    o.threads = io.w.threads > 0 ? io.w.threads : 1;
    if (lrmoe_gen_check(&o) < 0 || lrmoe_check_tty_out(io.out, io.force) < 0)
        FAIL(2);

    lrmoe_frame_t f;
    lrmoe_frame_init(&f);
    if (weights) {
        /* weights raw unless -l says otherwise: lrmoe-exec maps a raw
         * weights file instead of reading it (lrmoe-exec(1)) */
        lrmoe_wopts_t wo = io.w;
        if (wo.level == LRMOE_LEVEL_AUTO) wo.compress = 0;
        lrmoe_writer_t *w = lrmoe_writer_open(weights, &wo);
        if (!w)
            FAIL(1);
        for (int64_t l = 0; l < layers; l++)
            if (lrmoe_gen_weights(&o, l, &f) < 0 || lrmoe_writer_write(w, &f) < 0) {
                fprintf(stderr, "lrmoe-gen: %s\n", lrmoe_errmsg());
                lrmoe_writer_abort(w);
                lrmoe_frame_clear(&f);
                return 1;
            }
        lrmoe_frame_clear(&f);
        if (lrmoe_writer_close(w) < 0)
            FAIL(1);
    }
    lrmoe_writer_t *w = lrmoe_writer_open(io.out, &io.w);
    if (!w)
        FAIL(1);
    for (int64_t s = 0; s < steps; s++)
        for (int64_t l = 0; l < layers; l++)
            if (lrmoe_gen_frame(&o, l, s, &f) < 0 || lrmoe_writer_write(w, &f) < 0) {
                fprintf(stderr, "lrmoe-gen: %s\n", lrmoe_errmsg());
                lrmoe_writer_abort(w);
                lrmoe_frame_clear(&f);
                return 1;
            }
    lrmoe_frame_clear(&f);
    if (lrmoe_writer_close(w) < 0)
        FAIL(1);
    return 0;
}
