/* lrmoe-sim: replay routing traces through every planner on a modelled
 * cluster; summary table on stdout, per-frame TSV, pressure experiment,
 * gnuplot figures. Options and printing only: the replay (worker pool,
 * accumulation, worst frame) and the figures are lrmoe_sim_run and
 * lrmoe_sim_plots (lib/sim_run.c), over lib/sim.c, lib/plan.c, lib/cost.c. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lrmoe.h"
#include "plan_cli.h"
#include "plot.h"
#include "sim.h"
#include "tools.h"

#define TOOL "lrmoe-sim"

static void usage(FILE *fp)
{
    fprintf(fp,
        "Usage: lrmoe-sim [options] [FILE]\n"
        "Replay a stream of routing frames (expert_load [E], or topk_ids [T,K] reduced\n"
        "to loads) through every planner on a modelled cluster. Per frame and planner:\n"
        "per-rank forward and backward load, peak/mean, lower bound, all-to-all bytes on\n"
        "the busiest rank, memory split (base experts, replicas, token buffers), the\n"
        "critical-path time of dispatch, compute and combine, and feasibility, all from\n"
        "the library code of lrmoe-plan. Prints a summary table (mean, p99, ratio to\n"
        "fixed) on stdout. Every memory and time figure is modelled, not measured.\n\n"
        "Replay:\n"
        "  -p, --planners LIST   planners to compare (default fixed,llep,eplb,lrmoe);\n"
        "                        lrmoe@R is lrmoe at the single rate R, capacity@F\n"
        "                        the capacity planner at capacity factor F\n"
        "  -E, --experts E       experts, for frames with topk_ids only\n"
        "  -S, --stats FILE      one TSV row per frame and planner (- : standard\n"
        "                        error, stdout carries the report)\n"
        "      --tsv FILE        old name of --stats\n"
        "      --rank-stats FILE one TSV row per frame, planner and rank: forward\n"
        "                        and backward pairs, modelled moved backward rows\n"
        "      --rank-tsv FILE   old name of --rank-stats\n"
        "  -x, --pressure LIST   effective-throughput experiment at these batch\n"
        "                        multipliers, e.g. 1,2,4,8,16,20\n"
        "      --pressure-base T tokens per rank at multiplier 1 (default: the trace's)\n"
        "      --pressure-every N  run the pressure experiment on every N-th frame (1)\n"
        "  -g, --plot DIR        write figures (gnuplot) into DIR\n"
        "      --plot-format F   svg (default) or png\n"
        "  -j, --jobs N          planner threads (default: online CPUs, at most 8)\n"
        "      --frames N        stop after N frames\n"
        "  -Q, --quiet           no progress line\n"
        "Cluster (defaults: the LRMoE paper's setup, one node of 8 GPUs):\n"
        "  -P, --ranks P         expert-parallel ranks (default 8; must divide E)\n"
        "  -N, --nodes N         nodes (default 1; must divide P)\n"
        "  -M, --hbm BYTES       budget for replicas + buffers per rank (default 16GiB;\n"
        "                        0 = unlimited)\n"
        "      --gpu-mem BYTES   with --resident: hbm = gpu-mem - resident\n"
        "      --resident BYTES\n"
        "  -B, --bw BYTES/S      all-to-all bandwidth per rank inside a node (100e9)\n"
        "      --bw-inter BYTES/S  per rank between nodes (default 50e9)\n"
        "  -W, --window SEC      all-to-all window (default 0 = unlimited)\n"
        "      --flops F         expert GEMM FLOP/s per rank (default 400e12)\n"
        "Model sizes, for frames that do not say them (lrmoe(7); an option that\n"
        "disagrees with a frame is an error):\n"
        "  -D, --hidden D        hidden size (default 2048; frames: hidden [T,D])\n"
        "      --ffn F           expert FFN width (no default: frames say it with\n"
        "                        saved_gate [T,K,F] or the attribute ffn)\n"
        "      --weights FILE    D and F from the model's weights stream (lrmoe-exec's)\n"
        "  -k, --topk K          top-k (default 8; frames: topk_ids [T,K], route.topk);\n"
        "                        converts --pressure-base tokens into pairs\n"
        "      --tokens T        tokens per rank (default 32768; frames: T/P)\n"
        "      --dtype NAME      storage dtype (of hidden, else BF16)\n"
        "Planner options (as lrmoe-plan):\n"
        "  -G, --groups G        eplb expert groups (default: nodes)\n"
        "  -s, --slots S         expert slots per rank (eplb, lrmoe; default E/P+2)\n"
        "      --rebalance-every N  eplb: frames of a layer between rearrangements\n"
        "                        (default 3000; 0 = every frame from its own loads)\n"
        "      --lambda L        llep imbalance threshold (default 1.3)\n"
        "      --alpha A         llep capacity factor (default 1.0)\n"
        "      --min-chunk M     llep minimum rows per spilled chunk (default 1024)\n"
        "      --rates LIST      lrmoe candidate rates (default 1.0,0.9,0.8,0.7)\n"
        "  -q, --quota POLICY    even (default), minpeak or proportional\n"
        "      --min-keep F      every expert keeps >= ceil(F*n_e) (default 0.25)\n"
        "      --longer-backward when no rate has a plan whose modelled backward is\n"
        "                        within that of keeping every pair, take a longer one\n"
        "      --glpk-time SEC   GLPK time limit per solve (default 10)\n"
        "      --capacity-factor F  capacity: each expert keeps at most\n"
        "                        ceil(N/E * F) of its pairs (default 1.0)\n"
        "      --drop-policy NAME  capacity: probs (default) or position\n"
        "BYTES: a number and a unit in any case: K, M, G, T or KiB, MiB, GiB, TiB are\n"
        "powers of 1024 (16g = 16GiB), KB, MB, GB, TB powers of 1000 (lrmoe(7)).\n"
        "  -h, --help            this help\n"
        "  -V, --version         print the version\n");
}

enum { OPT_BW_INTER = LRMOE_PLAN_OPT_END, OPT_PBASE, OPT_PEVERY, OPT_PLOTFMT, OPT_RANK_STATS,
       OPT_FRAMES };

/* "1,2,4" -> multipliers (each > 0). Returns the count or -1. */
static int parse_list(const char *opt, const char *s, double *out, int max)
{
    int n = 0;
    const char *p = s;
    if (!*p)
        return lrmoe_err("%s: empty list", opt);
    while (*p) {
        char *end;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || errno || !(v > 0) || v > 1e6)
            return lrmoe_err("%s: bad multiplier in '%s' (each > 0)", opt, s);
        if (n >= max)
            return lrmoe_err("%s: more than %d values", opt, max);
        out[n++] = v;
        p = end;
        if (*p == ',') {
            p++;
            if (!*p)
                return lrmoe_err("%s: trailing comma in '%s'", opt, s);
        } else if (*p) {
            return lrmoe_err("%s: bad multiplier in '%s'", opt, s);
        }
    }
    return n;
}


/* ------------------------------------------------------------ main */

typedef struct {
    double last;
    int shown;
} progress_t;

/* A progress line on the terminal, at most four times a second. */
static void progress(int64_t frames, double secs, void *arg)
{
    progress_t *p = arg;
    if (secs > 1.0 && secs - p->last > 0.25) {
        fprintf(stderr, "\r" TOOL ": %lld frames, %.1f frames/s ", (long long)frames,
                frames / secs);
        p->last = secs;
        p->shown = 1;
    }
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"planners", required_argument, 0, 'p'},
        {"experts", required_argument, 0, 'E'},
        {"stats", required_argument, 0, 'S'},
        {"tsv", required_argument, 0, 'S'},
        {"rank-stats", required_argument, 0, OPT_RANK_STATS},
        {"rank-tsv", required_argument, 0, OPT_RANK_STATS},
        {"pressure", required_argument, 0, 'x'},
        {"pressure-base", required_argument, 0, OPT_PBASE},
        {"pressure-every", required_argument, 0, OPT_PEVERY},
        {"plot", required_argument, 0, 'g'},
        {"plot-format", required_argument, 0, OPT_PLOTFMT},
        {"jobs", required_argument, 0, 'j'},
        {"frames", required_argument, 0, OPT_FRAMES},
        {"quiet", no_argument, 0, 'Q'},
        {"bw-inter", required_argument, 0, OPT_BW_INTER},
        LRMOE_PLAN_LONGOPTS,
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0}};
    lrmoe_sim_cfg_t c;
    memset(&c, 0, sizeof c);
    lrmoe_plan_opts_default(&c.base);
    c.pevery = 1;
    const char *planners = "fixed,llep,eplb,lrmoe", *tsv_path = NULL, *plot_dir = NULL,
               *rank_path = NULL;
    lrmoe_plot_fmt_t fmt = LRMOE_PLOT_SVG;
    double bw_inter = 50e9;
    int64_t jobs = 0, max_frames = -1, v;
    int quiet = 0, ch;
    lrmoe_plan_cli_t cli;
    lrmoe_plan_cli_init(&cli, &c.base);
    while ((ch = getopt_long(argc, argv, "p:E:S:x:g:j:Q" LRMOE_PLAN_SHORTOPTS "hV", longopts,
                             NULL)) != -1) {
        int r = lrmoe_plan_cli_opt(&cli, ch, optarg);
        if (r > 0)
            continue;
        switch (r < 0 ? 0 : ch) { /* 0: a bad value of a shared option */
        case 0: break;
        case 'p': planners = optarg; break;
        case 'E':
            r = lrmoe_parse_i64("--experts", optarg, 1, 1 << 20, &v);
            c.experts = (int)v;
            break;
        case 'S': tsv_path = optarg; break;
        case OPT_RANK_STATS: rank_path = optarg; break;
        case 'x': r = c.npress = parse_list("--pressure", optarg, c.pressure, LRMOE_SIM_MAX_PRESSURE); break;
        case OPT_PBASE: r = lrmoe_parse_i64("--pressure-base", optarg, 1, INT64_C(1) << 40, &c.pbase); break;
        case OPT_PEVERY: r = lrmoe_parse_i64("--pressure-every", optarg, 1, INT64_C(1) << 40, &c.pevery); break;
        case 'g': plot_dir = optarg; break;
        case OPT_PLOTFMT: r = lrmoe_plot_fmt_parse(optarg, &fmt); break;
        case 'j': r = lrmoe_parse_i64("--jobs", optarg, 1, 256, &jobs); break;
        case OPT_FRAMES: r = lrmoe_parse_i64("--frames", optarg, 0, INT64_MAX, &max_frames); break;
        case 'Q': quiet = 1; break;
        case OPT_BW_INTER: r = lrmoe_parse_bytes("--bw-inter", optarg, &bw_inter); break;
        case 'h': usage(stdout); return 0;
        case 'V': printf(TOOL " (lrmoe) %s\n", LRMOE_VERSION); return 0;
        default: return lrmoe_usage_error(TOOL);
        }
        if (r < 0) {
            fprintf(stderr, TOOL ": %s\n", lrmoe_errmsg());
            return 2;
        }
    }
    if (argc - optind > 1) {
        fprintf(stderr, TOOL ": too many input files (one FILE or stdin)\n");
        return 2;
    }
    if (lrmoe_plan_cli_finish(&cli) < 0) {
        fprintf(stderr, TOOL ": %s\n", lrmoe_errmsg());
        return 2;
    }
    if (lrmoe_plan_cli_load(&cli) < 0) {
        fprintf(stderr, TOOL ": %s\n", lrmoe_errmsg());
        return 1;
    }
    c.given = cli;
    c.P = c.base.P;
    if (c.base.nodes <= 0 || c.P % c.base.nodes) {
        fprintf(stderr, TOOL ": %d nodes do not divide %d ranks\n", c.base.nodes, c.P);
        return 2;
    }
    const double bw_intra = c.base.cost.bw;
    double bw_eff = lrmoe_sim_bw_effective(c.P, c.base.nodes, bw_intra, bw_inter);
    if (bw_eff < 0) {
        fprintf(stderr, TOOL ": %s\n", lrmoe_errmsg());
        return 2;
    }
    c.base.cost.bw = bw_eff;
    c.np = lrmoe_sim_parse_planners(planners, &c.base, c.pl, LRMOE_SIM_MAX_PLANNERS);
    if (c.np < 0) {
        fprintf(stderr, TOOL ": %s\n", lrmoe_errmsg());
        return 2;
    }
    if (jobs <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        jobs = n < 1 ? 1 : n > 8 ? 8 : n;
    }
    if (plot_dir) {
        if (!lrmoe_sim_have_gnuplot()) {
            fprintf(stderr, TOOL ": --plot: gnuplot not found in PATH "
                            "(Debian: apt-get install gnuplot-nox)\n");
            return 1;
        }
        if (mkdir(plot_dir, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, TOOL ": %s: %s\n", plot_dir, strerror(errno));
            return 1;
        }
    }

    const char *in = optind < argc ? argv[optind] : "-";
    lrmoe_reader_t *rd = lrmoe_reader_open(in);
    if (!rd) {
        fprintf(stderr, TOOL ": %s\n", lrmoe_errmsg());
        return 1;
    }
    FILE *tsv = NULL;
    if (tsv_path) {
        tsv = lrmoe_stats_open(tsv_path, "-");
        if (!tsv) {
            fprintf(stderr, TOOL ": %s: %s\n", tsv_path, strerror(errno));
            lrmoe_reader_close(rd);
            return 1;
        }
        lrmoe_sim_tsv_header(tsv);
    }
    FILE *rtsv = NULL;
    if (rank_path) {
        rtsv = lrmoe_stats_open(rank_path, "-");
        if (!rtsv) {
            fprintf(stderr, TOOL ": %s: %s\n", rank_path, strerror(errno));
            lrmoe_reader_close(rd);
            return 1;
        }
        fprintf(rtsv, "frame\tlayer\tstep\tplanner\trank\tfwd_pairs\tbwd_pairs\tmoved_rows\n");
    }

    c.jobs = (int)jobs;
    c.max_frames = max_frames;
    c.tsv = tsv;
    c.rank_tsv = rtsv;
    c.track_worst = plot_dir != NULL;
    progress_t pr = {0, 0};
    if (!quiet && isatty(2)) {
        c.progress = progress;
        c.progress_arg = &pr;
    }
    lrmoe_sim_result_t res;
    int rc = 0;
    if (lrmoe_sim_run(&c, rd, &res) < 0) {
        fprintf(stderr, TOOL ": %s\n", lrmoe_errmsg());
        rc = 1;
    }
    const int64_t nframes = res.frames, E0 = res.E;
    const int P = c.P;
    if (pr.shown)
        fprintf(stderr, "\r\033[K");
    lrmoe_reader_close(rd);
    if (rtsv && lrmoe_stats_close(rtsv) != 0 && !rc) {
        fprintf(stderr, TOOL ": %s: write failed\n", rank_path);
        rc = 1;
    }
    if (tsv && lrmoe_stats_close(tsv) != 0 && !rc) {
        fprintf(stderr, TOOL ": %s: write failed\n", tsv_path);
        rc = 1;
    }
    if (!rc) {
        /* the sizes the run used: the first frame's (from the frame or the
         * options, lrmoe_plan_cli_frame) */
        const lrmoe_cost_model_t *m = nframes > 0 ? &res.model : &c.base.cost;
        char hb[24];
        printf("lrmoe-sim: %lld frames, E=%lld, P=%d over %d node(s); D=%lld F=%lld K=%d, "
               "%d-byte storage%s; hbm %s for replicas and buffers",
               (long long)nframes, (long long)E0, P, c.base.nodes, (long long)m->D,
               (long long)m->F, m->K, m->dtype_bytes,
               res.model_varies ? " (frame 0; later frames differ)" : "",
               m->hbm > 0 ? lrmoe_cost_fmt_bytes(m->hbm, hb, sizeof hb) : "unlimited");
        if (m->window > 0)
            printf(", window %.3g ms", m->window * 1e3);
        printf(";\n  bandwidth %.4g GB/s inside, %.4g GB/s between nodes (effective %.4g GB/s); "
               "%.4g TFLOP/s per rank. Memory and time are modelled (lrmoe-plan(1)).\n\n",
               bw_intra / 1e9, bw_inter / 1e9, bw_eff / 1e9, m->flops / 1e12);
        if (nframes == 0)
            printf("no frames\n");
        else if (lrmoe_sim_report(stdout, &res.acc, c.pl, c.pressure) < 0) {
            fprintf(stderr, TOOL ": %s\n", lrmoe_errmsg());
            rc = 1;
        }
    }
    if (!rc && plot_dir && nframes > 0 &&
        lrmoe_sim_plots(plot_dir, fmt, &c, &res.acc, &res.worst) < 0) {
        fprintf(stderr, TOOL ": --plot %s: %s\n", plot_dir, lrmoe_errmsg());
        rc = 1;
    }
    lrmoe_sim_result_free(&res);
    lrmoe_plan_cli_free(&cli);
    lrmoe_plan_thread_cleanup();
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, TOOL ": stdout: write failed\n");
        rc = 1;
    }
    return rc;
}
