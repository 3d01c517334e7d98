/* The tools' plumbing, not in the installed API (lib/cli.c): streams and
 * tables, option parsing, the filter tools' common run and its hooks.
 * Included by src/ and the modules defining these (cli.c, stream.c) only;
 * nothing here prints or exits: -1 with lrmoe_err set. */
#ifndef LRMOE_TOOLS_H
#define LRMOE_TOOLS_H

#include <stdio.h>
#include "clock.h"
#include "lrmoe.h"
#include "parse.h"
#include "score.h"
#include "weights_map.h"

/* ---------------------------------------------------------------- streams and tables
 * (lib/cli.c, lib/stream.c; moved out of lrmoe.h with API 2, lrmoe(3)) */

/* The input list of a tool that reads several streams: 0, or -1 when "-"
 * (standard input, read once) is named twice. n == 0 means stdin alone. */
int lrmoe_inputs_check(int n, char *const *paths);

/* Refuse to write binary to a terminal unless force. */
int lrmoe_check_tty_out(const char *path, int force);
/* fopen(path, "w") for a --stats/--timings table: line-buffered, so every
 * row reaches the file when it ends (a live pipeline's table can be
 * followed with tail -f, and a stage that fails keeps the rows it wrote).
 * NULL with errno set, like fopen. */
FILE *lrmoe_tsv_open(const char *path);
/* A tool's statistics file (--stats and the like): "-" is standard output,
 * or standard error when the tool's own output goes there (stream_out is
 * "-": its -o value, or "-" for a tool whose report is on stdout); NULL
 * stream_out: the tool writes nothing else to stdout. Line-buffered; NULL
 * with errno set. lrmoe_tsv_open(p) is lrmoe_stats_open(p, NULL). */
FILE *lrmoe_stats_open(const char *path, const char *stream_out);
/* Close what lrmoe_stats_open returned (flushes a standard stream, closes a
 * file): 0, or EOF on a write error. NULL is a no-op. */
int lrmoe_stats_close(FILE *fp);
/* A TSV cell: a tab, then attribute key of f, or NA when it is absent,
 * empty or holds a tab or newline. */
void lrmoe_tsv_attr(FILE *fp, const lrmoe_frame_t *f, const char *key);

/* The frame loop every filter runs: read each frame of `in`, call fn (which
 * may read, add, replace or delete tensors and attributes; <0 stops with its
 * error), write the frame to `out`; at a clean end write the trailer. On any
 * error the output is closed WITHOUT a trailer so the next stage fails too.
 * fn may be NULL (a plain copy). Returns frames processed, or -1. */
int64_t lrmoe_filter_run(const char *in, const char *out, const lrmoe_wopts_t *o,
                         lrmoe_frame_fn fn, void *ctx);
/* lrmoe_filter_run, and done(f, index, ctx) after each frame is written and
 * before it is cleared for the next (e.g. to take back buffers fn put in it:
 * lrmoe_exec_ctx_recycle); done may be NULL, <0 stops with its error. */
int64_t lrmoe_filter_run_done(const char *in, const char *out, const lrmoe_wopts_t *o,
                              lrmoe_frame_fn fn, lrmoe_frame_fn done, void *ctx);

/* Standard stream options shared by every tool (getopt_long):
 *   -o, --output FILE   -l, --level N   -@, --threads N   --no-compress
 *   -f, --force  (write binary to a terminal)
 * Put LRMOE_STREAM_SHORTOPTS in the short-option string and
 * LRMOE_STREAM_LONGOPTS in the long-option table; pass every option to
 * lrmoe_io_opt(): 1 handled, 0 not a stream option, -1 bad value (error set). */
typedef struct {
    const char *out;   /* default "-" */
    lrmoe_wopts_t w;
    int force;
} lrmoe_io_t;
#define LRMOE_OPT_NO_COMPRESS 0x1001
#define LRMOE_STREAM_SHORTOPTS "o:l:@:f"
#define LRMOE_STREAM_LONGOPTS \
    {"output", required_argument, 0, 'o'}, \
    {"level", required_argument, 0, 'l'}, \
    {"threads", required_argument, 0, '@'}, \
    {"no-compress", no_argument, 0, LRMOE_OPT_NO_COMPRESS}, \
    {"force", no_argument, 0, 'f'}
void lrmoe_io_init(lrmoe_io_t *io);
int lrmoe_io_opt(lrmoe_io_t *io, int c, const char *arg);
/* Frame and tensor selection of the reading tools (--frame N[-M] and
 * --tensor NAME, both repeatable; none given selects everything). */
typedef struct {
    int64_t (*ranges)[2];
    int nranges;
    int64_t last;          /* highest selected frame (INT64_MAX: all) */
    const char **tensors;
    int ntensors;
    int *seen;             /* seen[k]: tensors[k] matched in some frame */
} lrmoe_select_t;
void lrmoe_select_init(lrmoe_select_t *s);
int lrmoe_select_add_frames(lrmoe_select_t *s, const char *arg); /* -1: bad range */
int lrmoe_select_add_tensor(lrmoe_select_t *s, const char *name);
int lrmoe_select_frame(const lrmoe_select_t *s, int64_t i);
int lrmoe_select_tensor(const lrmoe_select_t *s, const char *name); /* marks it seen */
void lrmoe_select_free(lrmoe_select_t *s);

/* ---------------------------------------------------------------- the filter runner */

/* What a filter does to its stream (every hook may be NULL):
 *   frame    each frame before it is written (lrmoe_filter_run's fn);
 *   written  each frame after it is written, before it is cleared (its
 *            buffers can be taken back: lrmoe_exec_ctx_recycle);
 *   end      the input ended cleanly, before the output gets its trailer
 *            (<0: the output is closed without one, like a failed frame).
 * A hook's error stops the run; frame and written errors are prefixed with
 * "frame N". */
typedef struct {
    lrmoe_frame_fn frame;
    lrmoe_frame_fn written;
    int (*end)(void *ctx);
    void *ctx;
} lrmoe_filter_hooks_t;

/* lrmoe_filter_run with hooks: frames processed, or -1. */
int64_t lrmoe_filter_run_hooks(const char *in, const char *out, const lrmoe_wopts_t *o,
                               const lrmoe_filter_hooks_t *h);

/* lrmoe_score_frame with the layer's w_gate, w_up and w_down taken from w
 * (lrmoe-score --weights, for --fidelity's dW_gate, dW_up and dx; w NULL:
 * lrmoe_score_frame itself) and removed again; the layer's frame checked
 * at its first use when m maps w (lib/weights_map.h; m NULL: w was read);
 * st may be NULL (lib/api_stage.c, which the score handle runs too). */
int lrmoe_score_frame_w(lrmoe_frame_t *f, uint64_t index, const lrmoe_score_opts_t *o,
                        const lrmoe_weights_t *w, const lrmoe_wmap_t *m,
                        lrmoe_score_stats_t *st);

/* A tool's failure: "prog: <the library's error>" on standard error, and
 * code, the exit status to return (the tools print; the library does not). */
static inline int lrmoe_tool_fail(const char *prog, int code)
{
    fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
    return code;
}

/* After a usage error's own line (getopt's, or the tool's): a pointer to
 * --help instead of the whole help, whose 30 to 80 lines would scroll the
 * error off a terminal. Returns 2, a usage error's exit status. */
static inline int lrmoe_usage_error(const char *prog)
{
    fprintf(stderr, "Try '%s --help' for more information.\n", prog);
    return 2;
}

/* -F/--frame N[-M] and -T/--tensor NAME of a tool that selects (c is
 * getopt's value): 1 handled, 0 neither, -1 a bad --frame (a usage error),
 * -2 --tensor out of memory; the error set. */
int lrmoe_select_opt(lrmoe_select_t *s, int c, const char *arg);

/* Integer options set from a table: an option whose getopt value is c
 * sets the int at offset off of the caller's options struct to the
 * argument, a whole number in [lo, hi] (lrmoe_parse_i64, name in the
 * message). 1 handled, 0 not in the table, -1 a bad value (error set). */
typedef struct {
    int c;
    const char *name;
    int64_t lo, hi;
    size_t off;
} lrmoe_int_opt_t;
int lrmoe_int_opt(const lrmoe_int_opt_t *t, int n, int c, const char *arg, void *base);

/* How a --stats PATH is named in messages: PATH, or "<stdout>"/"<stderr>"
 * for "-" (lrmoe_stats_open's choice for the tool's stream_out). */
const char *lrmoe_stats_label(const char *path, const char *stream_out);
/* Set the error for a failed write to a --stats table (err: errno, 0 when
 * unknown): "--stats LABEL: write failed: why", a reader that stopped
 * (EPIPE) named as a broken pipe. Returns -1. */
int lrmoe_stats_write_error(const char *path, const char *stream_out, int err);

/* A filter tool's run, its main after the options: the --stats table opened
 * (lrmoe_stats_open against the tool's --output) and its header written,
 * the frames run through the hooks (lrmoe_filter_run_hooks; *stats holds
 * the open table meanwhile, NULL without one), the table closed. 0, or -1
 * with the first error set: "PATH: why" when the table does not open, the
 * frame loop's, or lrmoe_stats_write_error's when it does not close. */
typedef struct {
    const char *in;           /* input stream, "-": standard input */
    const lrmoe_io_t *io;     /* --output and the stream options */
    const char *stats_path;   /* --stats PATH, or NULL */
    const char *stats_header; /* the table's first line, '\n' included */
    FILE **stats;             /* where the hooks find the table (may be NULL) */
    lrmoe_filter_hooks_t hooks;
} lrmoe_filter_t;
int lrmoe_filter_main(const lrmoe_filter_t *fl);

#endif
