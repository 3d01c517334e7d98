/* Plumbing shared by the tools: stream options, the frame loop, number
 * parsing, clocks. Nothing here prints. */
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

double lrmoe_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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
    return fclose(fp);
}

int lrmoe_parse_i64(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end)
        return lrmoe_err("%s: '%s' is not an integer", opt, s);
    if (v < lo || v > hi)
        return lrmoe_err("%s: %lld is out of range [%" PRId64 ", %" PRId64 "]", opt, v, lo, hi);
    *out = v;
    return 0;
}

int lrmoe_parse_f64(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno == ERANGE || end == s || *end || isnan(v))
        return lrmoe_err("%s: '%s' is not a number", opt, s);
    if (v < lo || v > hi)
        return lrmoe_err("%s: %g is out of range [%g, %g]", opt, v, lo, hi);
    *out = v;
    return 0;
}

int lrmoe_parse_bytes(const char *opt, const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v))
        return lrmoe_err("%s: '%s' is not a size (e.g. 16GiB, 512M, 1.5g, 100e9)", opt, s);
    const char *u = end;
    while (*u == ' ')
        u++;
    double mul = 1;
    if (*u) {
        /* K, M, G, T, P, any case: alone or with iB powers of 1024, with B
         * powers of 1000; B alone: bytes */
        static const char letters[] = "kmgtp";
        const char *l = strchr(letters, tolower((unsigned char)*u));
        const char *rest = l ? u + 1 : u;
        int n = l ? (int)(l - letters) + 1 : 0;
        double base = 1024;
        if (tolower((unsigned char)rest[0]) == 'i' && tolower((unsigned char)rest[1]) == 'b' &&
            !rest[2] && n)
            base = 1024;
        else if (tolower((unsigned char)rest[0]) == 'b' && !rest[1])
            base = 1000;
        else if (rest[0] || !n)
            return lrmoe_err("%s: bad unit in '%s' (B, K, M, G, T, P: powers of 1024, also "
                             "KiB...; KB, MB, GB...: powers of 1000; any case)", opt, s);
        while (n--)
            mul *= base;
    }
    v *= mul;
    if (!(v >= 0) || v > 1e18)
        return lrmoe_err("%s: '%s' is negative or absurd", opt, s);
    *out = v;
    return 0;
}

int lrmoe_parse_range(const char *opt, const char *s, int64_t *lo, int64_t *hi)
{
    const char *dash = *s ? strchr(s + 1, '-') : NULL;
    if (!dash) {
        if (lrmoe_parse_i64(opt, s, 0, INT64_MAX, lo) < 0) return -1;
        *hi = *lo;
        return 0;
    }
    char first[64];
    snprintf(first, sizeof first, "%.*s", (int)(dash - s), s);
    if (lrmoe_parse_i64(opt, first, 0, INT64_MAX, lo) < 0) return -1;
    return lrmoe_parse_i64(opt, dash + 1, *lo, INT64_MAX, hi);
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

int64_t lrmoe_filter_run(const char *in, const char *out, const lrmoe_wopts_t *o,
                         lrmoe_frame_fn fn, void *ctx)
{
    return lrmoe_filter_run_done(in, out, o, fn, NULL, ctx);
}

int64_t lrmoe_filter_run_done(const char *in, const char *out, const lrmoe_wopts_t *o,
                              lrmoe_frame_fn fn, lrmoe_frame_fn done, void *ctx)
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
        if (fn && fn(&f, n, ctx) < 0) {
            lrmoe_err_prefix("frame %" PRId64, n);
            rc = -1;
            break;
        }
        if (lrmoe_writer_write(w, &f) < 0) { rc = -1; break; }
        if (done && done(&f, n, ctx) < 0) {
            lrmoe_err_prefix("frame %" PRId64, n);
            rc = -1;
            break;
        }
        n++;
    }
    /* the output is closed first: the next stage gets its end of stream
     * before this one frees its last frame (hundreds of MiB to unmap) */
    if (rc < 0) lrmoe_writer_abort(w);
    else if (lrmoe_writer_close(w) < 0) rc = -1;
    lrmoe_frame_clear(&f);
    lrmoe_reader_close(r);
    return rc < 0 ? -1 : n;
}

/* ------------------------------------------------------------ weights */

int lrmoe_weights_load(const char *path, lrmoe_weights_t *w)
{
    memset(w, 0, sizeof *w);
    lrmoe_reader_t *r = lrmoe_reader_open(path);
    if (!r) return -1;
    int cap = 0, rc;
    for (;;) {
        if (w->n == cap) {
            cap = cap ? 2 * cap : 8;
            lrmoe_frame_t *fr = realloc(w->frames, (size_t)cap * sizeof *fr);
            int64_t *ly = fr ? realloc(w->layer, (size_t)cap * sizeof *ly) : NULL;
            if (fr) w->frames = fr;
            if (!ly) { lrmoe_err("out of memory"); rc = -1; break; }
            w->layer = ly;
        }
        lrmoe_frame_init(&w->frames[w->n]);
        rc = lrmoe_reader_next(r, &w->frames[w->n]);
        if (rc <= 0) break;
        int64_t l = w->n;
        if (lrmoe_frame_attr_i64(&w->frames[w->n], "layer", &l) < 0) {
            lrmoe_err_prefix("%s: frame %d", path ? path : "<stdin>", w->n);
            rc = -1;
            w->n++;
            break;
        }
        for (int i = 0; i < w->n; i++)
            if (w->layer[i] == l) {
                lrmoe_err("%s: layer %" PRId64 " appears twice", path ? path : "<stdin>", l);
                rc = -1;
            }
        w->layer[w->n++] = l;
        if (rc < 0) break;
    }
    lrmoe_reader_close(r);
    if (rc < 0) {
        lrmoe_weights_free(w);
        return -1;
    }
    return 0;
}

const lrmoe_frame_t *lrmoe_weights_layer(const lrmoe_weights_t *w, int64_t layer)
{
    for (int i = 0; i < w->n; i++)
        if (w->layer[i] == layer) return &w->frames[i];
    lrmoe_err("weights: no frame for layer %" PRId64, layer);
    return NULL;
}

void lrmoe_weights_free(lrmoe_weights_t *w)
{
    for (int i = 0; i < w->n; i++) lrmoe_frame_clear(&w->frames[i]);
    free(w->frames);
    free(w->layer);
    memset(w, 0, sizeof *w);
}
