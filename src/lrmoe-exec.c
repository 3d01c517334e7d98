/* lrmoe-exec: expert-parallel forward and backward of each frame's MoE layer. */
#include <getopt.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "exec_frame.h"
#include "gemm_cpu.h"
#include "exec_mpi.h"
#include "lrmoe.h"
#include "tools.h"

static void usage(FILE *fp)
{
    fprintf(fp,
        "Usage: lrmoe-exec --phase forward|backward --weights FILE [options] [FILE]\n"
        "Run each frame's MoE layer on P expert-parallel ranks (one process, or\n"
        "one process per rank under mpirun -np P):\n"
        "forward adds output, pair_rank, phi_sqnorm, saved_gate, saved_up, pair_out;\n"
        "backward adds grad_hidden, grad_w_gate, grad_w_up, grad_w_down,\n"
        "grad_topk_weights. The plan (placement, fwd_alloc) is realised when the\n"
        "frame has one, else plain EP.\n\n"
        "Options:\n"
        "      --phase PH        forward or backward (required)\n"
        "      --weights FILE    weights stream, frames matched by attribute layer\n"
        "  -P, --ranks P         expert-parallel ranks (default: the plan's, else 1)\n"
        "      --mode M          backward: full (default), masked (keep) or compact\n"
        "      --backend B       cpu (default) or cuda\n"
        "      --compute C       cpu: expert GEMM numerics: f32 (exact, OpenBLAS),\n"
        "                        bf16 (BF16 operands, F32 accumulation, oneDNN;\n"
        "                        emulated where the CPU has no BF16 matmul or\n"
        "                        its F32 FMAs are faster) or\n"
        "                        auto (default: bf16 for BF16 weights where oneDNN\n"
        "                        runs BF16 natively, else f32)\n"
        "      --gpus N          cuda: devices to use (default 0: all visible)\n"
        "      --device N        cuda: first device (default 0); rank r runs on\n"
        "                        device (N + r mod G) mod visible, G = --gpus\n"
        "      --gemm G          cuda: expert GEMMs as a loop of cublasGemmEx\n"
        "                        (loop, default), grouped (cublasGemmGroupedBatchedEx)\n"
        "                        or cutlass (Hopper grouped GEMM writing F32 itself;\n"
        "                        sm_90 only, in a build that found CUTLASS)\n"
        "      --gemm-streams N  cuda: streams of the loop GEMM, 1 to 8 (default 4)\n"
        "      --launcher L      auto (default: mpi when started by mpirun/srun),\n"
        "                        mpi (one rank per MPI process) or none\n"
        "      --per-rank        under MPI: rank r reads FILE and writes --output\n"
        "                        with %%r replaced by r (its token rows), nothing\n"
        "                        goes through rank 0\n"
        "      --timeout S       under MPI: a rank that waits S seconds in one MPI\n"
        "                        call asks the others for a sign of life and ends\n"
        "                        the job naming the one that is silent (default 0:\n"
        "                        off, a stopped rank hangs the job)\n"
        "  -S, --stats FILE      write per-rank, per-stage seconds as TSV (- : stdout,\n"
        "                        or stderr when the stream goes there)\n"
        "      --timings FILE    old name of --stats\n"
        "      --repeat N        run the layer N times, report the median of each\n"
        "                        stage per rank (default 1)\n"
        "      --warmup M        untimed runs before the timed ones (default 0)\n"
        "      --allow-nonfinite accept NaN/Inf in the inputs\n"
        "  -o, --output FILE     write to FILE (default stdout)\n"
        "  -l, --level N         zstd level (default: 1 to a file, raw to a pipe)\n"
        "  -@, --threads N       GEMM (OpenBLAS, oneDNN) and zstd threads (default 0:\n"
        "                        the libraries' defaults)\n"
        "  -j, --rank-threads N  compute N ranks at a time, threads/N BLAS threads\n"
        "                        each (default 1: one rank at a time)\n"
        "      --clock C         stage clock: wall (default, monotonic) or cpu (CPU\n"
        "                        time of each rank's thread; needs 1 BLAS thread per rank)\n"
        "      --no-compress     write a raw stream\n"
        "  -f, --force           write binary to a terminal\n"
        "  -h, --help            this help\n"
        "  -V, --version         print the version\n");
}

typedef struct {
    lrmoe_exec_ctx_t x;
    lrmoe_frame_t spare; /* the last frame's output buffers, for the next */
    FILE *tsv;
    int tsv_header;
} ctx_t;

static int on_frame(lrmoe_frame_t *f, int64_t index, void *vctx)
{
    ctx_t *c = vctx;
    if (lrmoe_exec_frame_reuse(&c->x, f, &c->spare) < 0) return -1;
    if (!c->tsv) return 0;
    if (lrmoe_exec_timings_tsv(c->tsv, !c->tsv_header, &c->x, index) < 0)
        return lrmoe_err_prefix("--stats");
    c->tsv_header = 1;
    return 0;
}

/* frame written: its output buffers serve the next frame */
static int on_written(lrmoe_frame_t *f, int64_t index, void *vctx)
{
    (void)index;
    ctx_t *c = vctx;
    lrmoe_exec_ctx_recycle(&c->x, f, &c->spare);
    return 0;
}

enum { OPT_PHASE = 0x2000, OPT_WEIGHTS, OPT_MODE, OPT_BACKEND, OPT_NONFINITE,
       OPT_CLOCK, OPT_GPUS, OPT_DEVICE, OPT_GEMM, OPT_GEMM_STREAMS, OPT_REPEAT, OPT_WARMUP,
       OPT_COMPUTE, OPT_LAUNCHER, OPT_PER_RANK, OPT_TIMEOUT };

/* --per-rank: an output gets its trailer only once every rank has agreed
 * that the job is complete (lrmoe_exec_mpi_end, the filter's end hook): a
 * rank whose input ends early would otherwise close a clean-looking stream
 * of a job that fails. */
static int shard_end(void *vctx)
{
    return lrmoe_exec_mpi_end(((ctx_t *)vctx)->x.mpi);
}

/* Under MPI: ranks > 0 serve rank 0's jobs; rank 0 runs the filter. An
 * error while a job is spread over the ranks kills the job (MPI_Abort)
 * after one message naming the rank; otherwise the ranks leave cleanly. */
static int run_mpi(lrmoe_exec_mpi_t *m, ctx_t *c, const lrmoe_exec_frame_opts_t *o,
                   const char *in, const char *out, const lrmoe_wopts_t *w)
{
    if (m->shard) { /* every rank runs the filter on its own streams */
        c->x.mpi = m;
        lrmoe_filter_hooks_t h = {.frame = on_frame, .end = shard_end, .ctx = c};
        int bad = lrmoe_filter_run_hooks(in, out, w, &h) < 0;
        if (bad && !m->agreed) { /* this rank alone: the others wait in a collective */
            fprintf(stderr, "lrmoe-exec: rank %d: %s\n", m->rank, lrmoe_errmsg());
            lrmoe_comm_mpi_abort(&m->comm, 1);
        }
        if (bad && m->rank == 0) fprintf(stderr, "lrmoe-exec: %s\n", lrmoe_errmsg());
        return lrmoe_exec_mpi_close(m) < 0 || bad;
    }
    if (m->rank != 0) {
        if (lrmoe_exec_mpi_serve(m, &o->cfg) < 0) {
            fprintf(stderr, "lrmoe-exec: rank %d: %s\n", m->rank, lrmoe_errmsg());
            lrmoe_comm_mpi_abort(&m->comm, 1);
            return 1;
        }
        return lrmoe_exec_mpi_close(m) < 0 ? 1 : 0;
    }
    c->x.mpi = m;
    int rc = 0;
    if (lrmoe_filter_run(in, out, w, on_frame, c) < 0) {
        if (m->in_flight) {
            fprintf(stderr, "lrmoe-exec: rank 0: %s\n", lrmoe_errmsg());
            lrmoe_comm_mpi_abort(&m->comm, 1);
        }
        fprintf(stderr, "lrmoe-exec: %s\n", lrmoe_errmsg());
        rc = 1;
    }
    if (lrmoe_exec_mpi_end(m) < 0 || lrmoe_exec_mpi_close(m) < 0) {
        if (!rc) fprintf(stderr, "lrmoe-exec: %s\n", lrmoe_errmsg());
        rc = 1;
    }
    return rc;
}

/* the options that set one int of lrmoe_exec_frame_opts_t */
#define FOPT(c, name, lo, hi, field) {c, name, lo, hi, offsetof(lrmoe_exec_frame_opts_t, field)}
static const lrmoe_int_opt_t int_opts[] = {
    FOPT('P', "--ranks", 1, 4096, ranks),
    FOPT('j', "--rank-threads", 1, 4096, cfg.rank_threads),
    FOPT(OPT_GPUS, "--gpus", 0, 4096, cfg.gpus),
    FOPT(OPT_DEVICE, "--device", 0, 4096, cfg.device),
    FOPT(OPT_GEMM_STREAMS, "--gemm-streams", 1, 8, cfg.gemm_streams),
    FOPT(OPT_REPEAT, "--repeat", 1, 1000, repeat),
    FOPT(OPT_WARMUP, "--warmup", 0, 1000, warmup),
};
#undef FOPT

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        LRMOE_STREAM_LONGOPTS,
        {"phase", required_argument, 0, OPT_PHASE},
        {"weights", required_argument, 0, OPT_WEIGHTS},
        {"ranks", required_argument, 0, 'P'},
        {"rank-threads", required_argument, 0, 'j'},
        {"mode", required_argument, 0, OPT_MODE},
        {"backend", required_argument, 0, OPT_BACKEND},
        {"stats", required_argument, 0, 'S'},
        {"timings", required_argument, 0, 'S'},
        {"allow-nonfinite", no_argument, 0, OPT_NONFINITE},
        {"clock", required_argument, 0, OPT_CLOCK},
        {"gpus", required_argument, 0, OPT_GPUS},
        {"device", required_argument, 0, OPT_DEVICE},
        {"gemm", required_argument, 0, OPT_GEMM},
        {"gemm-streams", required_argument, 0, OPT_GEMM_STREAMS},
        {"compute", required_argument, 0, OPT_COMPUTE},
        {"launcher", required_argument, 0, OPT_LAUNCHER},
        {"per-rank", no_argument, 0, OPT_PER_RANK},
        {"timeout", required_argument, 0, OPT_TIMEOUT},
        {"repeat", required_argument, 0, OPT_REPEAT},
        {"warmup", required_argument, 0, OPT_WARMUP},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0}};
    lrmoe_io_t io;
    lrmoe_io_init(&io);
    ctx_t c;
    memset(&c, 0, sizeof c);
    lrmoe_exec_frame_opts_t o;
    lrmoe_exec_frame_opts_default(&o);
    const char *phase = NULL, *weights = NULL, *timings = NULL;
    double timeout = 0;
    int mode_set = 0, ch, launcher = -1, per_rank = 0; /* launcher -1 auto, 0 none, 1 mpi */
    while ((ch = getopt_long(argc, argv, LRMOE_STREAM_SHORTOPTS "P:j:S:hV", longopts, NULL)) != -1) {
        int r = lrmoe_io_opt(&io, ch, optarg);
        if (r == 0) r = lrmoe_int_opt(int_opts, sizeof int_opts / sizeof *int_opts, ch, optarg, &o);
        if (r > 0) continue;
        if (r < 0) goto usage_err;
        switch (ch) {
        case OPT_PHASE: phase = optarg; break;
        case OPT_WEIGHTS: weights = optarg; break;
        case OPT_MODE:
            if (lrmoe_exec_mode_parse(optarg, &o.mode) < 0) goto usage_err;
            mode_set = 1;
            break;
        case OPT_BACKEND:
            if (lrmoe_backend_parse(optarg, &o.cfg.backend) < 0) goto usage_err;
            break;
        case 'S': timings = optarg; break;
        case OPT_GEMM: {
            lrmoe_exec_gemm_t g;
            if (lrmoe_exec_gemm_parse(optarg, &g) < 0) {
                lrmoe_err_prefix("--gemm");
                goto usage_err;
            }
            o.cfg.gemm = (int)g;
            break;
        }
        case OPT_COMPUTE: {
            lrmoe_compute_t cm;
            if (lrmoe_compute_parse(optarg, &cm) < 0) {
                lrmoe_err_prefix("--compute");
                goto usage_err;
            }
            o.cfg.compute = (int)cm;
            break;
        }
        case OPT_NONFINITE: o.cfg.allow_nonfinite = 1; break;
        case OPT_PER_RANK: per_rank = 1; break;
        case OPT_TIMEOUT:
            if (lrmoe_parse_f64("--timeout", optarg, 0, 1e7, &timeout) < 0) goto usage_err;
            break;
        case OPT_LAUNCHER:
            if (!strcmp(optarg, "auto")) launcher = -1;
            else if (!strcmp(optarg, "none")) launcher = 0;
            else if (!strcmp(optarg, "mpi")) launcher = 1;
            else {
                lrmoe_err("--launcher: '%s' is not auto, mpi or none", optarg);
                goto usage_err;
            }
            break;
        case OPT_CLOCK:
            if (!strcmp(optarg, "cpu")) o.cfg.cpu_clock = 1;
            else if (strcmp(optarg, "wall")) {
                lrmoe_err("--clock: '%s' is not wall or cpu", optarg);
                goto usage_err;
            }
            break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("lrmoe-exec (lrmoe) %s\n", LRMOE_VERSION); return 0;
        default: return lrmoe_usage_error("lrmoe-exec");
        }
    }
    if (!phase || (strcmp(phase, "forward") && strcmp(phase, "backward"))) {
        lrmoe_err("--phase: %s", phase ? "must be forward or backward" : "required");
        goto usage_err;
    }
    o.backward = !strcmp(phase, "backward");
    if (mode_set && !o.backward) {
        lrmoe_err("--mode: only with --phase backward");
        goto usage_err;
    }
    if (!weights) { lrmoe_err("--weights: required"); goto usage_err; }
    if (argc - optind > 1) { lrmoe_err("at most one input FILE"); goto usage_err; }
    o.cfg.threads = io.w.threads;
    if (o.cfg.cpu_clock) {
        int per = o.cfg.rank_threads > 1 ? o.cfg.threads / o.cfg.rank_threads : o.cfg.threads;
        if (per != 1 && !(o.cfg.rank_threads > 1 && per < 1)) {
            lrmoe_err("--clock cpu: needs one BLAS thread per rank (-@ N -j N, or -@ 1)");
            goto usage_err;
        }
        if (o.cfg.backend != LRMOE_BACKEND_CPU) {
            lrmoe_err("--clock cpu: only with --backend cpu");
            goto usage_err;
        }
    }
    if (o.cfg.compute != LRMOE_COMPUTE_AUTO && o.cfg.backend != LRMOE_BACKEND_CPU) {
        lrmoe_err("--compute: only with --backend cpu (the CUDA backend computes in BF16 "
                  "with F32 accumulation)");
        goto usage_err;
    }
    if (o.cfg.compute == LRMOE_COMPUTE_BF16 && !lrmoe_gemm_have_dnnl()) {
        lrmoe_err("--compute bf16: this build has no oneDNN (install libdnnl-dev and "
                  "rebuild; --compute f32 is the exact path)");
        goto usage_err;
    }
    int mpi = launcher == 1 || (launcher < 0 && lrmoe_comm_mpi_launched());
    if (per_rank && !mpi) {
        lrmoe_err("--per-rank: only under an MPI launcher (mpirun, srun)");
        goto usage_err;
    }
    if (mpi && !lrmoe_comm_mpi_built()) {
        lrmoe_err("%s: MPI support is not built into this lrmoe-exec (install "
                  "libopenmpi-dev and openmpi-bin, then make clean all)",
                  launcher == 1 ? "--launcher mpi" : "started by an MPI launcher");
        goto usage_err;
    }
    if (mpi && o.cfg.backend != LRMOE_BACKEND_CPU && !lrmoe_exec_mpi_cuda_built()) {
        lrmoe_err("--backend %s under MPI: this lrmoe-exec is built without CUDA",
                  lrmoe_backend_name(o.cfg.backend));
        goto usage_err;
    }
    lrmoe_exec_mpi_t m;
    if (mpi) {
        if (lrmoe_exec_mpi_open(&m, &argc, &argv, weights) < 0) {
            fprintf(stderr, "lrmoe-exec: MPI: %s\n", lrmoe_errmsg());
            return 1;
        }
        if (o.ranks && o.ranks != m.P) {
            if (m.rank == 0)
                fprintf(stderr, "lrmoe-exec: --ranks %d but the MPI job has %d processes "
                        "(mpirun -np)\n", o.ranks, m.P);
            lrmoe_exec_mpi_close(&m);
            return 2;
        }
        o.ranks = m.P;
        lrmoe_comm_mpi_set_timeout(&m.comm, timeout);
    }
    char in_r[4096], out_r[4096];
    if (per_rank) { /* every rank its own FILE and --output */
        const char *why = NULL;
        if (optind >= argc || !io.out)
            why = "needs FILE and --output, each with %r for the rank";
        else if (lrmoe_exec_mpi_rank_path(argv[optind], m.rank, in_r, sizeof in_r) < 0 ||
                 lrmoe_exec_mpi_rank_path(io.out, m.rank, out_r, sizeof out_r) < 0)
            why = "FILE and --output must each hold %r (the rank)";
        else if (o.backward && o.mode == LRMOE_MODE_COMPACT)
            why = "backward compact needs the global pack of lrmoe-pack (use full or masked)";
        if (why) {
            if (m.rank == 0) fprintf(stderr, "lrmoe-exec: --per-rank: %s\n", why);
            lrmoe_exec_mpi_close(&m);
            return 2;
        }
        argv[optind] = in_r;
        io.out = out_r;
        lrmoe_exec_mpi_per_rank(&m);
    }
    /* under mpirun stdout is always a pty (OpenMPI forwards it to mpirun's
     * stdout): the terminal check would refuse every run */
    if (!mpi && lrmoe_check_tty_out(io.out, io.force) < 0) goto usage_err;

    lrmoe_exec_ctx_init(&c.x, &o);
    lrmoe_frame_init(&c.spare);
    lrmoe_exec_ctx_weights_file(&c.x, weights);
    if (timings && (!mpi || m.rank == 0) && !(c.tsv = lrmoe_stats_open(timings, io.out))) {
        fprintf(stderr, "lrmoe-exec: %s: cannot open for writing\n", timings);
        if (mpi) lrmoe_comm_mpi_abort(&m.comm, 1);
        return 1;
    }
    const char *in = optind < argc ? argv[optind] : "-";
    int rc = 0;
    if (mpi) {
        rc = run_mpi(&m, &c, &o, in, io.out, &io.w);
    } else if (lrmoe_filter_run_done(in, io.out, &io.w, on_frame, on_written, &c) < 0) {
        fprintf(stderr, "lrmoe-exec: %s\n", lrmoe_errmsg());
        rc = 1;
    }
    if (c.tsv && lrmoe_stats_close(c.tsv) != 0 && !rc) {
        fprintf(stderr, "lrmoe-exec: %s: write error\n", timings);
        rc = 1;
    }
    lrmoe_exec_ctx_free(&c.x);
    lrmoe_frame_clear(&c.spare);
    return rc;

usage_err:
    fprintf(stderr, "lrmoe-exec: %s\n", lrmoe_errmsg());
    return lrmoe_usage_error("lrmoe-exec");
}
