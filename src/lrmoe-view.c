/* lrmoe-view: list the frames of a stream, their attributes and tensors with
 * statistics, as aligned text or one JSON object per frame. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "lrmoe.h"
#include "stats.h"

static const char *prog = "lrmoe-view";

static void usage(FILE *fp)
{
    fprintf(fp,
            "Usage: %s [options] [FILE...]\n"
            "List the frames of lrmoe streams (stdin when no FILE or '-', once): frame\n"
            "attributes, then per tensor its dtype, shape, size, min, max, mean, std\n"
            "(over finite values) and NaN/Inf counts.\n"
            "\n"
            "Options:\n"
            "  -j, --json           one JSON object per frame and line\n"
            "  -F, --frame N[-M]    show frame N (or frames N..M); repeatable\n"
            "  -T, --tensor NAME    show tensor NAME only; repeatable\n"
            "  -n, --values N       print the first N values of each tensor\n"
            "  -S, --no-stats       skip min/max/mean/std/NaN/Inf (faster)\n"
            "  -h, --help           show this help\n"
            "  -V, --version        show the version\n",
            prog);
}

typedef struct {
    int json, stats;
    int64_t values;
    lrmoe_select_t sel;
} opts_t;

static const char *human(uint64_t b, char *buf, size_t len)
{
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    if (b < 1024) {
        snprintf(buf, len, "%" PRIu64 " B", b);
        return buf;
    }
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, len, "%.1f %s", v, unit[u]);
    return buf;
}

/* ------------------------------------------------------------ text */

enum { C_NAME, C_DTYPE, C_SHAPE, C_SIZE, C_MIN, C_MAX, C_MEAN, C_STD, C_NAN, C_INF, NCOL };
static const char *col_head[NCOL] = {"tensor", "dtype", "shape", "size", "min",
                                     "max",    "mean",  "std",   "nan",  "inf"};
static const int col_right[NCOL] = {0, 0, 0, 1, 1, 1, 1, 1, 1, 1};

typedef struct {
    char c[NCOL][64];
} row_t;

static void print_attr_value(const char *v)
{
    int plain = *v != 0;
    for (const char *p = v; *p; p++)
        if (*p == ' ' || *p == '"' || *p == '\t' || *p == '\n' || *p == '=')
            plain = 0;
    if (plain) {
        fputs(v, stdout);
        return;
    }
    putchar('"');
    for (const char *p = v; *p; p++) {
        if (*p == '"' || *p == '\\')
            putchar('\\');
        if (*p == '\n')
            fputs("\\n", stdout);
        else
            putchar(*p);
    }
    putchar('"');
}

static void print_values(const lrmoe_tensor_t *t, int64_t n)
{
    int64_t numel = lrmoe_tensor_numel(t);
    if (n > numel)
        n = numel;
    char buf[64];
    int col = printf("    values[0:%" PRId64 "]:", n);
    int indent = col;
    for (int64_t i = 0; i < n; i++) {
        const char *s = lrmoe_stats_value_str(t->dtype, t->data, (size_t)i, buf, sizeof buf);
        int w = (int)strlen(s) + 1;
        if (col + w > 100 && col > indent) {
            printf("\n%*s", indent, "");
            col = indent;
        }
        col += printf(" %s", s);
    }
    if (n < numel)
        printf(" ...");
    putchar('\n');
}

static void text_frame(const lrmoe_frame_t *f, int64_t index, opts_t *o)
{
    uint64_t total = 0;
    for (int i = 0; i < f->ntensors; i++)
        total += f->tensors[i]->nbytes;
    char hb[32];
    printf("frame %" PRId64 "  (%d tensor%s, %s)", index, f->ntensors, f->ntensors == 1 ? "" : "s",
           human(total, hb, sizeof hb));
    for (int i = 0; i < f->nattrs; i++) {
        printf(i ? " %s=" : "  %s=", f->keys[i]);
        print_attr_value(f->vals[i]);
    }
    putchar('\n');
    int ncol = o->stats ? NCOL : C_SIZE + 1;
    row_t *rows = calloc((size_t)f->ntensors + 1, sizeof *rows);
    const lrmoe_tensor_t **ts = calloc((size_t)f->ntensors + 1, sizeof *ts);
    if (!rows || !ts) {
        free(rows);
        free(ts);
        return;
    }
    int nr = 0;
    for (int i = 0; i < f->ntensors; i++) {
        const lrmoe_tensor_t *t = f->tensors[i];
        if (!lrmoe_select_tensor(&o->sel, t->name))
            continue;
        row_t *r = &rows[nr];
        ts[nr++] = t;
        snprintf(r->c[C_NAME], 64, "%s", t->name);
        snprintf(r->c[C_DTYPE], 64, "%s", lrmoe_dtype_name(t->dtype));
        lrmoe_shape_str(t, r->c[C_SHAPE], 64);
        human(t->nbytes, r->c[C_SIZE], 64);
        if (o->stats) {
            lrmoe_stats_t s;
            lrmoe_stats_tensor(t, &s);
            lrmoe_stats_extreme_str(&s, 0, r->c[C_MIN], 64);
            lrmoe_stats_extreme_str(&s, 1, r->c[C_MAX], 64);
            if (s.finite) {
                snprintf(r->c[C_MEAN], 64, "%.6g", s.mean);
                snprintf(r->c[C_STD], 64, "%.6g", s.std);
            } else {
                strcpy(r->c[C_MEAN], "-");
                strcpy(r->c[C_STD], "-");
            }
            snprintf(r->c[C_NAN], 64, "%" PRId64, s.nan);
            snprintf(r->c[C_INF], 64, "%" PRId64, s.posinf + s.neginf);
        }
    }
    if (nr) {
        int w[NCOL];
        for (int c = 0; c < ncol; c++) {
            w[c] = (int)strlen(col_head[c]);
            for (int i = 0; i < nr; i++)
                if ((int)strlen(rows[i].c[c]) > w[c])
                    w[c] = (int)strlen(rows[i].c[c]);
        }
        for (int i = -1; i < nr; i++) {
            fputs("  ", stdout);
            for (int c = 0; c < ncol; c++) {
                const char *s = i < 0 ? col_head[c] : rows[i].c[c];
                int last = c == ncol - 1;
                if (col_right[c])
                    printf("%*s", w[c], s);
                else if (last)
                    fputs(s, stdout);
                else
                    printf("%-*s", w[c], s);
                if (!last)
                    fputs("  ", stdout);
            }
            putchar('\n');
            if (i >= 0 && o->values > 0)
                print_values(ts[i], o->values);
        }
    }
    free(rows);
    free(ts);
}

/* ------------------------------------------------------------ JSON */

static json_t *json_value(lrmoe_dtype_t d, const void *data, size_t i)
{
    const uint8_t *p = (const uint8_t *)data + i * lrmoe_dtype_size(d);
    if (d == LRMOE_U64) {
        uint64_t u;
        memcpy(&u, p, 8);
        return u > (uint64_t)INT64_MAX ? json_real((double)u) : json_integer((json_int_t)u);
    }
    if (!lrmoe_dtype_is_float(d)) {
        int64_t v;
        lrmoe_convert_to_i64(d, p, &v, 1);
        return json_integer((json_int_t)v);
    }
    double v;
    lrmoe_convert_to_f64(d, p, &v, 1);
    if (isnan(v))
        return json_string("nan");
    if (isinf(v))
        return json_string(v > 0 ? "inf" : "-inf");
    return json_real(v);
}

static json_t *json_extreme(const lrmoe_stats_t *s, int which)
{
    if (!s->finite)
        return json_null();
    if (s->is_int && s->dtype == LRMOE_U64) {
        uint64_t u = which ? s->umax : s->umin;
        return u > (uint64_t)INT64_MAX ? json_real((double)u) : json_integer((json_int_t)u);
    }
    if (s->is_int)
        return json_integer((json_int_t)(which ? s->imax : s->imin));
    return json_real(which ? s->max : s->min);
}

static int json_frame(const lrmoe_frame_t *f, int64_t index, opts_t *o)
{
    json_t *root = json_object(), *attrs = json_object(), *arr = json_array();
    json_object_set_new(root, "frame", json_integer(index));
    for (int i = 0; i < f->nattrs; i++)
        json_object_set_new(attrs, f->keys[i], json_string(f->vals[i]));
    json_object_set_new(root, "attrs", attrs);
    for (int i = 0; i < f->ntensors; i++) {
        const lrmoe_tensor_t *t = f->tensors[i];
        if (!lrmoe_select_tensor(&o->sel, t->name))
            continue;
        json_t *e = json_object(), *sh = json_array();
        json_object_set_new(e, "name", json_string(t->name));
        json_object_set_new(e, "dtype", json_string(lrmoe_dtype_name(t->dtype)));
        for (int d = 0; d < t->ndim; d++)
            json_array_append_new(sh, json_integer(t->shape[d]));
        json_object_set_new(e, "shape", sh);
        json_object_set_new(e, "bytes", json_integer((json_int_t)t->nbytes));
        if (o->stats) {
            lrmoe_stats_t s;
            lrmoe_stats_tensor(t, &s);
            json_object_set_new(e, "min", json_extreme(&s, 0));
            json_object_set_new(e, "max", json_extreme(&s, 1));
            json_object_set_new(e, "mean", s.finite ? json_real(s.mean) : json_null());
            json_object_set_new(e, "std", s.finite ? json_real(s.std) : json_null());
            json_object_set_new(e, "nan", json_integer(s.nan));
            json_object_set_new(e, "inf", json_integer(s.posinf + s.neginf));
        }
        if (o->values > 0) {
            json_t *vals = json_array();
            int64_t n = lrmoe_tensor_numel(t);
            if (n > o->values)
                n = o->values;
            for (int64_t k = 0; k < n; k++)
                json_array_append_new(vals, json_value(t->dtype, t->data, (size_t)k));
            json_object_set_new(e, "values", vals);
        }
        json_array_append_new(arr, e);
    }
    json_object_set_new(root, "tensors", arr);
    errno = 0;
    int rc = json_dumpf(root, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (putchar('\n') == EOF || ferror(stdout)) /* a full disk, a closed pipe */
        return lrmoe_err("write error on stdout: %s", errno ? strerror(errno) : "I/O error");
    return rc < 0 ? lrmoe_err("cannot encode JSON") : 0;
}

/* ------------------------------------------------------------ main loop */

static int view(const char *path, opts_t *o)
{
    lrmoe_reader_t *r = lrmoe_reader_open(path);
    if (!r)
        return -1;
    lrmoe_frame_t f;
    lrmoe_frame_init(&f);
    int rc;
    int64_t i = 0, shown = 0, ntens = 0;
    uint64_t bytes = 0;
    int stopped = 0;
    while ((rc = lrmoe_reader_next(r, &f)) == 1) {
        if (lrmoe_select_frame(&o->sel, i)) {
            if (!o->json && shown)
                putchar('\n');
            if (o->json ? json_frame(&f, i, o) < 0 : (text_frame(&f, i, o), 0)) {
                rc = -1;
                break;
            }
            shown++;
        }
        ntens += f.ntensors;
        for (int k = 0; k < f.ntensors; k++)
            bytes += f.tensors[k]->nbytes;
        i++;
        if (i > o->sel.last) { /* past the last selected frame: stop reading */
            stopped = 1;
            rc = 0;
            break;
        }
    }
    int compressed = lrmoe_reader_compressed(r), plain = lrmoe_reader_plain(r);
    lrmoe_frame_clear(&f);
    lrmoe_reader_close(r);
    if (rc < 0)
        return -1;
    if (!o->json) {
        char hb[32];
        printf("%s# %" PRId64 " frame%s%s, %" PRId64 " tensor%s, %s; %s, %s\n", shown ? "\n" : "",
               i, i == 1 ? "" : "s", stopped ? " read" : "", ntens, ntens == 1 ? "" : "s", human(bytes, hb, sizeof hb),
               plain ? "plain safetensors file" : compressed ? "zstd stream" : "raw stream",
               stopped ? "reading stopped after the last selected frame"
                       : plain ? "one frame, no trailer" : "clean end");
    }
    if (o->sel.nranges && o->sel.last != INT64_MAX && o->sel.last >= i)
        return lrmoe_err("--frame %" PRId64 ": the stream has %" PRId64 " frame%s", o->sel.last, i,
                         i == 1 ? "" : "s");
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option lopts[] = {
        {"json", no_argument, 0, 'j'},
        {"frame", required_argument, 0, 'F'},
        {"tensor", required_argument, 0, 'T'},
        {"values", required_argument, 0, 'n'},
        {"no-stats", no_argument, 0, 'S'},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0}};
    opts_t o;
    memset(&o, 0, sizeof o);
    lrmoe_select_init(&o.sel);
    o.stats = 1;
    int c;
    while ((c = getopt_long(argc, argv, "jF:T:n:ShV", lopts, NULL)) != -1) {
        switch (c) {
        case 'j':
            o.json = 1;
            break;
        case 'F': {
            if (lrmoe_select_add_frames(&o.sel, optarg) < 0) {
                fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
                return 2;
            }
            break;
        }
        case 'T':
            if (lrmoe_select_add_tensor(&o.sel, optarg) < 0) {
                fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
                return 1;
            }
            break;
        case 'n':
            if (lrmoe_parse_i64("--values", optarg, 0, INT64_MAX, &o.values) < 0) {
                fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
                return 2;
            }
            break;
        case 'S':
            o.stats = 0;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("%s (lrmoe) %s\n", prog, LRMOE_VERSION);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    int nfiles = argc - optind, rc = 0;
    if (lrmoe_inputs_check(nfiles, argv + optind) < 0) {
        fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
        return 2;
    }
    for (int k = 0; k < (nfiles ? nfiles : 1); k++) {
        const char *path = nfiles ? argv[optind + k] : "-";
        if (nfiles > 1 && !o.json)
            printf("%s==> %s <==\n", k ? "\n" : "", path);
        fflush(stdout);
        if (view(path, &o) < 0) {
            fflush(stdout);
            fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
            rc = 1;
        }
    }
    for (int k = 0; k < o.sel.ntensors && rc == 0; k++)
        if (!o.sel.seen[k]) {
            fprintf(stderr, "%s: --tensor %s: no such tensor in the selected frames\n", prog,
                    o.sel.tensors[k]);
            rc = 1;
        }
    if (fflush(stdout) != 0 || ferror(stdout) || fclose(stdout) != 0) {
        if (rc == 0)
            fprintf(stderr, "%s: write error on stdout: %s\n", prog, errno ? strerror(errno) : "I/O error");
        return 1;
    }
    lrmoe_select_free(&o.sel);
    return rc;
}
