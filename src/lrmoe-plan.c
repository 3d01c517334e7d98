/* lrmoe-plan: expert placement, forward allocation, backward quotas and
 * backward allocation per frame (fixed, llep, eplb, lrmoe, capacity planners). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lrmoe.h"
#include "tools.h"
#include "plan_cli.h"
#include "route.h"
#include "sim.h"

static void usage(FILE *fp)
{
    fprintf(fp,
        "Usage: lrmoe-plan -P RANKS [options] [FILE]\n"
        "Plan every frame's expert_load [E] I64 over P ranks: add placement [E,P] U8,\n"
        "fwd_alloc [E,P] I64, quota [E] I64, bwd_alloc [E,P] I64 and plan.* attributes.\n\n"
        "Planner:\n"
        "  -p, --planner NAME    fixed, llep, eplb, lrmoe or capacity (default lrmoe)\n"
        "  -P, --ranks P         expert-parallel ranks (required; must divide E)\n"
        "  -N, --nodes N         nodes (eplb hierarchy; default 1)\n"
        "  -G, --groups G        eplb expert groups (default: nodes)\n"
        "  -s, --slots S         expert slots per rank (eplb, lrmoe; default E/P+2;\n"
        "                        E/P means no replicas)\n"
        "      --rebalance-every N  eplb: frames of a layer between rearrangements\n"
        "                        (default 3000; 0 = every frame from its own loads)\n"
        "      --lambda L        llep imbalance threshold (default 1.3; 0 = no gate)\n"
        "      --alpha A         llep capacity factor (default 1.0)\n"
        "      --min-chunk M     llep minimum rows per spilled chunk (default 1024)\n"
        "      --rates LIST      lrmoe candidate rates (default 1.0,0.9,0.8,0.7)\n"
        "  -R, --rate X          lrmoe single rate X in (0,1]\n"
        "  -q, --quota POLICY    even (default), minpeak or proportional\n"
        "      --min-keep F      every expert keeps >= ceil(F*n_e) (default 0.25)\n"
        "      --longer-backward when no rate has a plan whose modelled backward is\n"
        "                        within that of keeping every pair, take a longer one\n"
        "  -b, --best-effort     when no rate fits, keep the last one (plan.feasible=0)\n"
        "      --capacity-factor F  capacity: each expert keeps at most\n"
        "                        ceil(N/E * F) of its pairs, N = T*K (default 1.0)\n"
        "      --drop-policy NAME  capacity: which pairs an expert keeps: probs\n"
        "                        (highest router weight; default) or position\n"
        "      --glpk-time SEC   GLPK time limit per solve (default 10)\n"
        "Cost model (defaults: the LRMoE paper's setup):\n"
        "  -M, --hbm BYTES       budget for replicas + buffers per rank (default 16GiB;\n"
        "                        0 = unlimited)\n"
        "      --gpu-mem BYTES   with --resident: hbm = gpu-mem - resident\n"
        "      --resident BYTES\n"
        "  -W, --window SEC      all-to-all window (default 0 = unlimited)\n"
        "  -B, --bw BYTES/S      all-to-all bandwidth per rank (default 100e9)\n"
        "      --flops F         expert GEMM FLOP/s per rank (default 400e12)\n"
        "Model sizes, for frames that do not say them (lrmoe(7); an option that\n"
        "disagrees with a frame is an error):\n"
        "  -D, --hidden D        hidden size (default 2048; frames: hidden [T,D])\n"
        "      --ffn F           expert FFN width (no default: frames say it with\n"
        "                        saved_gate [T,K,F] or the attribute ffn)\n"
        "      --weights FILE    D and F from the model's weights stream (lrmoe-exec's)\n"
        "  -k, --topk K          top-k (default 8; frames: topk_ids [T,K], route.topk)\n"
        "      --tokens T        tokens per rank (default 32768; frames: T/P)\n"
        "      --dtype NAME      storage dtype (default: of hidden, else BF16)\n"
        "  -S, --stats FILE      write one TSV row per frame to FILE (- : stdout, or\n"
        "                        stderr when the stream goes there)\n"
        "      --plot FILE       draw pairs per rank before and after fixed, llep, eplb\n"
        "                        and lrmoe on the trace's worst frame (FILE.svg or .png;\n"
        "                        gnuplot; the loads are kept, so stdin works)\n"
        "BYTES: a number and a unit in any case: K, M, G, T or KiB, MiB, GiB, TiB are\n"
        "powers of 1024 (16g = 16GiB), KB, MB, GB, TB powers of 1000 (lrmoe(7)).\n"
        "Stream options:\n"
        "  -o, --output FILE     write to FILE (default stdout)\n"
        "  -l, --level N         zstd level (default: 1 to a file, raw to a pipe)\n"
        "  -@, --threads N       zstd workers\n"
        "      --no-compress     write a raw stream\n"
        "  -f, --force           write binary to a terminal\n"
        "  -h, --help            this help\n"
        "  -V, --version         print the version\n");
}

typedef struct {
    lrmoe_plan_opts_t o;
    lrmoe_plan_cli_t cli; /* the options shared with lrmoe-sim */
    lrmoe_eplb_cache_t *eplb; /* deployed EPLB's layout per layer */
    FILE *stats;
    const char *stats_path, *out; /* --stats and --output, for messages */
    lrmoe_sim_trace_t *trace; /* --plot: the planned frames' loads */
} ctx_t;

/* The --stats table's header, a column per value of its rows */
static const char stats_header[] =
    "frame\tlayer\tstep\tplanner\texperts\tranks\tpairs\trho"
    "\tfwd_peak\tbwd_peak\tfwd_lb\tbwd_lb\tmean_ceil\tpeak_over_mean"
    "\treplicas\tmem_peak_gib\tmem_peak_rank\tt_comm_ms\tt_total_ms"
    "\tfeasible\tplan_ms\tsolver_ms\tbinding\thidden\tffn\ttopk"
    "\ttokens_per_rank\tsource\tllep\tplan_cpu_ms\n";

static int plan_frame(lrmoe_frame_t *f, int64_t index, void *arg)
{
    ctx_t *c = arg;
    lrmoe_plan_opts_t o;
    lrmoe_tensor_t *tl = lrmoe_frame_need(f, "expert_load");
    if (!tl)
        return -1;
    char b1[64], b2[64];
    if (tl->ndim != 1 || tl->shape[0] <= 0 || tl->shape[0] > (1 << 20))
        return lrmoe_err("expert_load: shape %s, expected [E]", lrmoe_shape_str(tl, b1, sizeof b1));
    const int E = (int)tl->shape[0];
    lrmoe_tensor_t *lg = lrmoe_frame_get(f, "router_logits");
    if (lg && (lg->ndim != 2 || lg->shape[1] != E))
        return lrmoe_err("expert_load: %d experts, router_logits is %s", E,
                         lrmoe_shape_str(lg, b2, sizeof b2));
    /* I64 from lrmoe-route; whole-number floats too (Megatron's F32) */
    int64_t *load = malloc((size_t)E * sizeof *load);
    if (!load)
        return lrmoe_err("out of memory");
    if (lrmoe_route_load_i64(tl->dtype, tl->data, E, load) < 0) {
        free(load);
        return -1;
    }
    lrmoe_plan_t p;
    lrmoe_plan_init(&p);
    /* model sizes from the frame (a given option must agree), then the plan */
    o.P = 0;
    int rc = lrmoe_plan_cli_plan(&c->cli, c->eplb, load, E, f, &p, &o);
    if (c->trace && o.P > 0 && lrmoe_sim_trace_add(c->trace, index, f, load, E, &o.cost) < 0)
        rc = -1;
    if (rc == 0 && c->stats) {
        FILE *fp = c->stats;
        errno = 0;
        const double G = 1024.0 * 1024.0 * 1024.0;
        fprintf(fp, "%" PRId64, index);
        lrmoe_tsv_attr(fp, f, "layer");
        lrmoe_tsv_attr(fp, f, "step");
        fprintf(fp, "\t%s\t%d\t%d\t%" PRId64 "\t%.6f\t%" PRId64 "\t%" PRId64 "\t%" PRId64
                    "\t%" PRId64 "\t%" PRId64 "\t%.6f\t%d\t%.6f\t%d\t%.6f\t%.6f\t%d\t%.3f\t%.3f\t%s"
                    "\t%" PRId64 "\t%" PRId64 "\t%d\t%" PRId64 "\t%s",
                p.planner, E, p.P, p.N, p.rho, p.fwd_peak, p.bwd_peak, p.fwd_lb, p.bwd_lb,
                p.mean_ceil, p.N ? (double)p.fwd_peak / ((double)p.N / p.P) : 1.0, p.replicas,
                p.mem_peak / G, p.mem_peak_rank, p.t_comm * 1e3, p.t_total * 1e3, p.feasible,
                p.plan_seconds * 1e3, p.glpk_seconds * 1e3,
                p.binding[0] && !strpbrk(p.binding, "\t\n") ? p.binding : "NA", p.D, p.F, p.K,
                p.tokens, p.source[0] ? p.source : "NA");
        fprintf(fp, "\t%s\t%.3f\n", p.llep[0] ? p.llep : "NA", p.plan_cpu_seconds * 1e3);
        if (ferror(fp))
            rc = lrmoe_stats_write_error(c->stats_path, c->out, errno);
    }
    lrmoe_plan_free(&p);
    free(load);
    return rc;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        LRMOE_STREAM_LONGOPTS,
        {"planner", required_argument, 0, 'p'},
        {"rate", required_argument, 0, 'R'},
        {"best-effort", no_argument, 0, 'b'},
        LRMOE_PLAN_LONGOPTS,
        {"stats", required_argument, 0, 'S'},
        {"plot", required_argument, 0, LRMOE_PLAN_OPT_END},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0}};
    lrmoe_io_t io;
    lrmoe_io_init(&io);
    ctx_t c;
    memset(&c, 0, sizeof c);
    lrmoe_plan_opts_default(&c.o);
    c.o.P = 0;
    lrmoe_plan_cli_init(&c.cli, &c.o);
    const char *stats_path = NULL, *plot_path = NULL;
    int ch;
    double d;
    while ((ch = getopt_long(argc, argv,
                             LRMOE_STREAM_SHORTOPTS LRMOE_PLAN_SHORTOPTS "p:R:bS:hV", longopts,
                             NULL)) != -1) {
        int r = lrmoe_io_opt(&io, ch, optarg);
        if (r > 0)
            continue;
        if (r == 0)
            r = lrmoe_plan_cli_opt(&c.cli, ch, optarg);
        if (r > 0)
            continue;
        if (r == 0) {
            switch (ch) {
            case 'p': r = lrmoe_planner_parse(optarg, &c.o.planner); break;
            case 'R':
                r = lrmoe_parse_f64("--rate", optarg, -1e9, 1e9, &d);
                if (r == 0 && !(d > 0 && d <= 1))
                    r = lrmoe_err("--rate: %g is outside (0,1]", d);
                c.o.nrates = 1;
                c.o.rates[0] = d;
                break;
            case 'b': c.o.best_effort = 1; break;
            case 'S': stats_path = optarg; break;
            case LRMOE_PLAN_OPT_END: plot_path = optarg; break;
            case 'h': usage(stdout); return 0;
            case 'V': printf("lrmoe-plan (lrmoe) %s\n", LRMOE_VERSION); return 0;
            default: return lrmoe_usage_error("lrmoe-plan");
            }
        }
        if (r < 0) {
            fprintf(stderr, "lrmoe-plan: %s\n", lrmoe_errmsg());
            return 2;
        }
    }
    if (argc - optind > 1) {
        fprintf(stderr, "lrmoe-plan: too many input files (one FILE or stdin)\n");
        return 2;
    }
    if (c.o.P <= 0) {
        fprintf(stderr, "lrmoe-plan: --ranks P is required\n");
        return 2;
    }
    if (lrmoe_plan_cli_finish(&c.cli) < 0) {
        fprintf(stderr, "lrmoe-plan: %s\n", lrmoe_errmsg());
        return 2;
    }
    if (lrmoe_plan_opts_check(&c.o, -1) < 0) {
        fprintf(stderr, "lrmoe-plan: %s\n", lrmoe_errmsg());
        return 2;
    }
    if (lrmoe_check_tty_out(io.out, io.force) < 0) {
        fprintf(stderr, "lrmoe-plan: %s\n", lrmoe_errmsg());
        return 2;
    }
    const char *in = optind < argc ? argv[optind] : "-";
    if (plot_path && lrmoe_sim_plot_check(plot_path) < 0) {
        fprintf(stderr, "lrmoe-plan: --plot %s: %s\n", plot_path, lrmoe_errmsg());
        return 2;
    }
    if (lrmoe_plan_cli_load(&c.cli) < 0) {
        fprintf(stderr, "lrmoe-plan: %s\n", lrmoe_errmsg());
        return 1;
    }
    lrmoe_sim_trace_t trace = {0};
    c.trace = plot_path ? &trace : NULL;
    if (!(c.eplb = lrmoe_eplb_cache_new())) {
        fprintf(stderr, "lrmoe-plan: %s\n", lrmoe_errmsg());
        return 1;
    }
    c.stats_path = stats_path;
    c.out = io.out;
    lrmoe_filter_t run = {.in = in, .io = &io, .stats_path = stats_path,
                          .stats_header = stats_header, .stats = &c.stats,
                          .hooks = {.frame = plan_frame, .ctx = &c}};
    int rc = lrmoe_filter_main(&run) < 0;
    if (rc)
        fprintf(stderr, "lrmoe-plan: %s\n", lrmoe_errmsg());
    lrmoe_eplb_cache_free(c.eplb);
    /* the figure of the frames planned, also when a later one failed */
    if (plot_path && (trace.n || !rc) && lrmoe_sim_plot_trace(&trace, &c.cli, plot_path) < 0) {
        fprintf(stderr, "lrmoe-plan: --plot %s: %s\n", plot_path, lrmoe_errmsg());
        rc = 1;
    }
    lrmoe_sim_trace_free(&trace);
    lrmoe_plan_cli_free(&c.cli);
    lrmoe_plan_thread_cleanup();
    return rc;
}
