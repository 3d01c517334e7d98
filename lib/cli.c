/* Plumbing shared by the tools: stream options, selections, the frame
 * loop, statistics files. Nothing here prints. Below the library's modules
 * nothing calls it (lrmoe(7), THE LIBRARY): the clock is lib/clock.c, the
 * number parsers lib/parse.c, the weights stream lib/weights.c. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "lrmoe.h"
#include "tools.h"

int lrmoe_check_tty_out(const char *path, int force)
{
    if (force) return 0;
    if ((!path || !strcmp(path, "-")) && isatty(STDOUT_FILENO))
        return lrmoe_err("refusing to write binary data to a terminal (use -o FILE, a pipe, or -f)");
    return 0;
}

FILE *lrmoe_tsv_open(const char *path)
{
    return lrmoe_stats_open(path, NULL);
}

FILE *lrmoe_stats_open(const char *path, const char *stream_out)
{
    FILE *fp;
    if (!strcmp(path, "-"))
        fp = stream_out && !strcmp(stream_out, "-") ? stderr : stdout;
    else
        fp = fopen(path, "w");
    /* line-buffered: each row is written out as it ends */
    if (fp && setvbuf(fp, NULL, _IOLBF, 0) != 0) {
        int e = errno;
        if (fp != stdout && fp != stderr)
            fclose(fp);
        errno = e;
        return NULL;
    }
    return fp;
}

void lrmoe_tsv_attr(FILE *fp, const lrmoe_frame_t *f, const char *key)
{
    const char *v = lrmoe_frame_attr(f, key);
    fprintf(fp, "\t%s", v && *v && !strpbrk(v, "\t\n") ? v : "NA");
}

int lrmoe_stats_close(FILE *fp)
{
    if (!fp)
        return 0;
    if (fp == stdout || fp == stderr)
        return fflush(fp) != 0 || ferror(fp) ? EOF : 0;
    /* a write that failed earlier (a line already flushed) counts too:
     * fclose itself fails only on what it still has to write */
    int failed = ferror(fp);
    return fclose(fp) != 0 || failed ? EOF : 0;
}

void lrmoe_select_init(lrmoe_select_t *s)
{
    memset(s, 0, sizeof *s);
    s->last = INT64_MAX;
}

int lrmoe_select_add_frames(lrmoe_select_t *s, const char *arg)
{
    int64_t a, b;
    if (lrmoe_parse_range("--frame", arg, &a, &b) < 0) return -1;
    int64_t (*r)[2] = realloc(s->ranges, (size_t)(s->nranges + 1) * sizeof *r);
    if (!r) return lrmoe_err("out of memory");
    s->ranges = r;
    r[s->nranges][0] = a;
    r[s->nranges][1] = b;
    s->last = s->nranges++ ? (b > s->last ? b : s->last) : b;
    return 0;
}

int lrmoe_select_add_tensor(lrmoe_select_t *s, const char *name)
{
    const char **t = realloc(s->tensors, (size_t)(s->ntensors + 1) * sizeof *t);
    if (t) s->tensors = t;
    int *seen = t ? realloc(s->seen, (size_t)(s->ntensors + 1) * sizeof *seen) : NULL;
    if (!seen) return lrmoe_err("out of memory");
    s->seen = seen;
    s->tensors[s->ntensors] = name;
    s->seen[s->ntensors++] = 0;
    return 0;
}

int lrmoe_select_opt(lrmoe_select_t *s, int c, const char *arg)
{
    if (c == 'F') return lrmoe_select_add_frames(s, arg) < 0 ? -1 : 1;
    if (c == 'T') return lrmoe_select_add_tensor(s, arg) < 0 ? -2 : 1;
    return 0;
}

int lrmoe_select_frame(const lrmoe_select_t *s, int64_t i)
{
    if (!s->nranges) return 1;
    for (int k = 0; k < s->nranges; k++)
        if (i >= s->ranges[k][0] && i <= s->ranges[k][1]) return 1;
    return 0;
}

int lrmoe_select_tensor(const lrmoe_select_t *s, const char *name)
{
    if (!s->ntensors) return 1;
    for (int k = 0; k < s->ntensors; k++)
        if (!strcmp(s->tensors[k], name)) {
            s->seen[k] = 1;
            return 1;
        }
    return 0;
}

void lrmoe_select_free(lrmoe_select_t *s)
{
    free(s->ranges);
    free(s->tensors);
    free(s->seen);
    lrmoe_select_init(s);
}

void lrmoe_io_init(lrmoe_io_t *io)
{
    /* A stage whose reader went away (| lrmoe-view -F 0, | head -c) gets
     * EPIPE from write and says so, instead of dying of SIGPIPE with its
     * TSVs unflushed: the tools' stream writer reports every failed write. */
    signal(SIGPIPE, SIG_IGN);
    io->out = "-";
    lrmoe_wopts_default(&io->w);
    io->force = 0;
}

int lrmoe_io_opt(lrmoe_io_t *io, int c, const char *arg)
{
    int64_t v;
    switch (c) {
    case 'o': io->out = arg; return 1;
    case 'f': io->force = 1; return 1;
    case LRMOE_OPT_NO_COMPRESS: io->w.compress = 0; return 1;
    case 'l':
        if (lrmoe_parse_i64("--level", arg, -7, 22, &v) < 0) return -1;
        io->w.level = (int)v;
        return 1;
    case '@':
        if (lrmoe_parse_i64("--threads", arg, 0, 256, &v) < 0) return -1;
        io->w.threads = (int)v;
        return 1;
    }
    return 0;
}

int lrmoe_int_opt(const lrmoe_int_opt_t *t, int n, int c, const char *arg, void *base)
{
    for (int i = 0; i < n; i++) {
        if (t[i].c != c) continue;
        int64_t v;
        if (lrmoe_parse_i64(t[i].name, arg, t[i].lo, t[i].hi, &v) < 0) return -1;
        *(int *)((char *)base + t[i].off) = (int)v;
        return 1;
    }
    return 0;
}

int64_t lrmoe_filter_run(const char *in, const char *out, const lrmoe_wopts_t *o,
                         lrmoe_frame_fn fn, void *ctx)
{
    lrmoe_filter_hooks_t h = {.frame = fn, .ctx = ctx};
    return lrmoe_filter_run_hooks(in, out, o, &h);
}

int64_t lrmoe_filter_run_done(const char *in, const char *out, const lrmoe_wopts_t *o,
                              lrmoe_frame_fn fn, lrmoe_frame_fn done, void *ctx)
{
    lrmoe_filter_hooks_t h = {.frame = fn, .written = done, .ctx = ctx};
    return lrmoe_filter_run_hooks(in, out, o, &h);
}

int64_t lrmoe_filter_run_hooks(const char *in, const char *out, const lrmoe_wopts_t *o,
                               const lrmoe_filter_hooks_t *h)
{
    lrmoe_reader_t *r = lrmoe_reader_open(in);
    if (!r) return -1;
    lrmoe_writer_t *w = lrmoe_writer_open(out, o);
    if (!w) { lrmoe_reader_close(r); return -1; }
    lrmoe_frame_t f;
    lrmoe_frame_init(&f);
    int64_t n = 0;
    int rc;
    while ((rc = lrmoe_reader_next(r, &f)) == 1) {
        if (h->frame && h->frame(&f, n, h->ctx) < 0) {
            lrmoe_err_prefix("frame %" PRId64, n);
            rc = -1;
            break;
        }
        if (lrmoe_writer_write(w, &f) < 0) { rc = -1; break; }
        if (h->written && h->written(&f, n, h->ctx) < 0) {
            lrmoe_err_prefix("frame %" PRId64, n);
            rc = -1;
            break;
        }
        n++;
    }
    if (rc == 0 && h->end && h->end(h->ctx) < 0) rc = -1;
    /* the output is closed first: the next stage gets its end of stream
     * before this one frees its last frame (hundreds of MiB to unmap) */
    if (rc < 0) lrmoe_writer_abort(w);
    else if (lrmoe_writer_close(w) < 0) rc = -1;
    lrmoe_frame_clear(&f);
    lrmoe_reader_close(r);
    return rc < 0 ? -1 : n;
}

const char *lrmoe_stats_label(const char *path, const char *stream_out)
{
    if (strcmp(path, "-"))
        return path;
    return stream_out && !strcmp(stream_out, "-") ? "<stderr>" : "<stdout>";
}

int lrmoe_stats_write_error(const char *path, const char *stream_out, int err)
{
    const char *label = lrmoe_stats_label(path, stream_out);
    /* a reader that stopped (EPIPE: SIGPIPE is ignored) is named as such,
     * like the stream's own broken pipe, not as a generic write error */
    if (err == EPIPE)
        return lrmoe_err("--stats %s: write failed: broken pipe (the next stage stopped "
                         "reading)", label);
    return lrmoe_err("--stats %s: write failed: %s", label, err ? strerror(err) : "I/O error");
}

int lrmoe_filter_main(const lrmoe_filter_t *fl)
{
    const char *out = fl->io->out;
    FILE *fp = NULL;
    int header_err = 0; /* why the header's write failed: a close that fails
                         * on the error flag alone has no errno of its own */
    if (fl->stats_path) {
        if (!(fp = lrmoe_stats_open(fl->stats_path, out)))
            return lrmoe_err("%s: %s", fl->stats_path, strerror(errno));
        errno = 0;
        fputs(fl->stats_header, fp);
        if (ferror(fp)) header_err = errno;
    }
    if (fl->stats) *fl->stats = fp;
    int rc = lrmoe_filter_run_hooks(fl->in, out, &fl->io->w, &fl->hooks) < 0 ? -1 : 0;
    errno = 0;
    if (fp && lrmoe_stats_close(fp) != 0 && rc == 0)
        rc = lrmoe_stats_write_error(fl->stats_path, out, errno ? errno : header_err);
    if (fl->stats) *fl->stats = NULL;
    return rc;
}
