/* The tools' plumbing that is not in the installed API (lib/cli.c): the
 * filter tools' common run and its hooks. Included by src/ only; nothing
 * here prints or exits: -1 with lrmoe_err set. */
#ifndef LRMOE_TOOLS_H
#define LRMOE_TOOLS_H

#include <stdio.h>
#include "lrmoe.h"
#include "score.h"

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
 * lrmoe_score_frame itself) and removed again; st may be NULL
 * (lib/api_stage.c, which the score handle runs too). */
int lrmoe_score_frame_w(lrmoe_frame_t *f, int64_t index, const lrmoe_score_opts_t *o,
                        const lrmoe_weights_t *w, lrmoe_score_stats_t *st);

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
