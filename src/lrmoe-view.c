/* lrmoe-view: list the frames of a stream, their attributes and tensors with
 * statistics, as aligned text or one JSON object per frame. */
#include <errno.h>
#include <fnmatch.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "lrmoe.h"
#include "tools.h"
#include "diff.h"
#include "stats.h"

static const char *prog = "lrmoe-view";

static void usage(FILE *fp)
{
    fprintf(fp,
            "Usage: %s [options] [FILE...]\n"
            "       %s --diff [options] A B\n"
            "List the frames of lrmoe streams (stdin when no FILE or '-', once): frame\n"
            "attributes one per line, grouped by prefix, then per tensor its dtype, shape,\n"
            "size, min, max, mean, std (over finite values) and NaN/Inf counts.\n"
            "With --diff, compare stream A with stream B frame by frame: attributes and\n"
            "tensors only in one, other values, shapes, dtypes; per tensor how many values\n"
            "differ, the max abs and max rel difference (against B) and the first index.\n"
            "Exit 0 same, 1 different, 2 trouble (like cmp).\n"
            "\n"
            "Options:\n"
            "      --json           one JSON object per frame and line\n"
            "  -F, --frame N[-M]    show frame N (or frames N..M); repeatable\n"
            "  -T, --tensor NAME    show tensor NAME only; repeatable\n"
            "      --values N       print values: N of a vector, N rows of N of a matrix\n"
            "      --diff           compare two streams (A B)\n"
            "      --atol X         --diff: values within X + rtol*|b| are the same (0)\n"
            "      --rtol X         --diff: relative tolerance (0)\n"
            "      --no-stats       skip min/max/mean/std/NaN/Inf (faster)\n"
            "  -h, --help           show this help\n"
            "  -V, --version        show the version\n",
            prog, prog);
}

typedef struct {
    int json, stats, diff;
    int64_t values;
    double atol, rtol;
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

/* Values from flat index i0 (n of them) on one or more lines of at most
 * 100 columns, each after `indent` columns; "(+left more)" at the end. */
static void print_run(const lrmoe_tensor_t *t, int64_t i0, int64_t n, int64_t left, int col,
                      int indent)
{
    char buf[64];
    for (int64_t i = i0; i < i0 + n; i++) {
        const char *s = lrmoe_stats_value_str(t->dtype, t->data, (size_t)i, buf, sizeof buf);
        int w = (int)strlen(s) + 1;
        if (col + w > 100 && col > indent) {
            printf("\n%*s", indent, "");
            col = indent;
        }
        col += printf(" %s", s);
    }
    if (left > 0)
        printf(" ... (+%" PRId64 " more)", left);
    putchar('\n');
}

/* --values N: a vector's first N values; anything of 2 or more dimensions
 * as rows of its last dimension, the first N rows of the first N values,
 * each row headed by its index, with how much was left out. */
static void print_values(const lrmoe_tensor_t *t, int64_t n)
{
    int64_t numel = lrmoe_tensor_numel(t);
    if (t->ndim < 2) {
        int64_t k = n < numel ? n : numel;
        int col = printf("    values[0:%" PRId64 "]:", k);
        print_run(t, 0, k, numel - k, col, col);
        return;
    }
    int64_t cols = t->shape[t->ndim - 1], rows = cols ? numel / cols : 0;
    if (!cols) { /* rows of nothing */
        for (int d = 0; d < t->ndim - 1; d++)
            rows = d ? rows * t->shape[d] : t->shape[d];
    }
    int64_t nr = n < rows ? n : rows, nc = n < cols ? n : cols;
    for (int64_t r = 0; r < nr; r++) {
        char idx[160];
        size_t o = 0;
        int64_t rem = r;
        int64_t pos[LRMOE_MAX_DIMS];
        for (int d = t->ndim - 2; d >= 0; d--) {
            pos[d] = t->shape[d] ? rem % t->shape[d] : 0;
            rem = t->shape[d] ? rem / t->shape[d] : 0;
        }
        for (int d = 0; d < t->ndim - 1 && o < sizeof idx; d++)
            o += (size_t)snprintf(idx + o, sizeof idx - o, d ? ",%" PRId64 : "%" PRId64, pos[d]);
        int col = printf("    [%s]:", idx);
        print_run(t, r * cols, nc, cols - nc, col, col);
    }
    if (rows > nr)
        printf("    ... (+%" PRId64 " more row%s of %" PRId64 ")\n", rows - nr,
               rows - nr == 1 ? "" : "s", cols);
}

/* An attribute's place in the listing: its prefix (what comes before the
 * first '.', length 0 without one) and the group it falls in. */
typedef struct {
    const char *key;
    size_t pl;
    int idx, grp;
} akey_t;

static int cmp_prefix(const void *x, const void *y)
{
    const akey_t *a = x, *b = y;
    size_t m = a->pl < b->pl ? a->pl : b->pl;
    int c = memcmp(a->key, b->key, m);
    if (c || a->pl != b->pl)
        return c ? c : a->pl < b->pl ? -1 : 1;
    return a->idx - b->idx;
}

static int cmp_group(const void *x, const void *y)
{
    const akey_t *a = x, *b = y;
    return a->grp != b->grp ? (a->grp < b->grp ? -1 : 1) : a->idx - b->idx;
}

/* Attributes one per line, KEY=VALUE: those without a prefix first, then
 * each prefix's group (route.*, plan.*, exec.*) in the order its first key
 * appears, keys in frame order within a group. O(n log n). */
static void print_attrs(const lrmoe_frame_t *f)
{
    akey_t *a = malloc((size_t)(f->nattrs ? f->nattrs : 1) * sizeof *a);
    for (int i = 0; a && i < f->nattrs; i++) {
        const char *d = strchr(f->keys[i], '.');
        a[i] = (akey_t){f->keys[i], d ? (size_t)(d - f->keys[i]) : 0, i, 0};
    }
    if (a) {
        qsort(a, (size_t)f->nattrs, sizeof *a, cmp_prefix);
        for (int i = 0; i < f->nattrs; i++) /* a run's first key has its lowest index */
            a[i].grp = !a[i].pl ? -1
                       : i && a[i - 1].pl == a[i].pl && !memcmp(a[i - 1].key, a[i].key, a[i].pl)
                           ? a[i - 1].grp
                           : a[i].idx;
        qsort(a, (size_t)f->nattrs, sizeof *a, cmp_group);
    }
    for (int i = 0; i < f->nattrs; i++) { /* without memory: frame order */
        int k = a ? a[i].idx : i;
        printf("  %s=", f->keys[k]);
        print_attr_value(f->vals[k]);
        putchar('\n');
    }
    free(a);
}

static void text_frame(const lrmoe_frame_t *f, int64_t index, opts_t *o)
{
    uint64_t total = 0;
    for (int i = 0; i < f->ntensors; i++)
        total += f->tensors[i]->nbytes;
    char hb[32];
    printf("frame %" PRId64 "  (%d tensor%s, %s; %d attribute%s)\n", index, f->ntensors,
           f->ntensors == 1 ? "" : "s", human(total, hb, sizeof hb), f->nattrs,
           f->nattrs == 1 ? "" : "s");
    print_attrs(f);
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

/* Attributes that hold one value per rank or expert, comma-separated: a
 * string always, also with one element, so that their type does not depend
 * on the number of ranks (lrmoe-view(1), --json): gen.hot, gen.order,
 * pack.rank_rows and exec.<phase>.<stage>_s (but .critical_s, .wall_s). */
static int list_attr(const char *key)
{
    static const char *exact[] = {"gen.hot", "gen.order", "pack.rank_rows"};
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
        if (!strcmp(key, exact[i]))
            return 1;
    size_t n = strlen(key);
    return !fnmatch("exec.*_s", key, 0) &&
           !(n >= 11 && !strcmp(key + n - 11, ".critical_s")) &&
           !(n >= 7 && !strcmp(key + n - 7, ".wall_s"));
}

/* An attribute as JSON: a decimal number (-?digits[.digits][e[+-]digits],
 * no leading zeros, no sign +, finite; integers within int64) is a JSON
 * number, anything else (lists, words, "nan", "inf", hex, "", integers
 * beyond int64) a string. */
static json_t *json_attr(const char *key, const char *v)
{
    if (list_attr(key))
        return json_string(v);
    const char *p = v;
    int real = 0;
    if (*p == '-')
        p++;
    if (!(*p >= '0' && *p <= '9'))
        return json_string(v);
    if (*p == '0' && p[1] >= '0' && p[1] <= '9')
        return json_string(v); /* leading zero: an id, keep it */
    while (*p >= '0' && *p <= '9')
        p++;
    if (*p == '.') {
        real = 1;
        p++;
        if (!(*p >= '0' && *p <= '9'))
            return json_string(v);
        while (*p >= '0' && *p <= '9')
            p++;
    }
    if (*p == 'e' || *p == 'E') {
        real = 1;
        p++;
        if (*p == '+' || *p == '-')
            p++;
        if (!(*p >= '0' && *p <= '9'))
            return json_string(v);
        while (*p >= '0' && *p <= '9')
            p++;
    }
    if (*p)
        return json_string(v);
    errno = 0;
    if (!real) { /* beyond int64 stays a string: a real would round it */
        long long x = strtoll(v, NULL, 10);
        return errno ? json_string(v) : json_integer((json_int_t)x);
    }
    double d = strtod(v, NULL);
    if (errno || !isfinite(d))
        return json_string(v);
    return json_real(d);
}

static int json_frame(const lrmoe_frame_t *f, int64_t index, opts_t *o)
{
    json_t *root = json_object(), *attrs = json_object(), *arr = json_array();
    json_object_set_new(root, "frame", json_integer(index));
    for (int i = 0; i < f->nattrs; i++)
        json_object_set_new(attrs, f->keys[i], json_attr(f->keys[i], f->vals[i]));
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

/* ------------------------------------------------------------ --diff */

typedef struct {
    const char *a, *b; /* the paths */
    int64_t frame;
    int64_t attrs, tensors; /* differences of each kind */
} diff_ctx_t;

/* Flat index i of t as [i,j,...]. */
static const char *index_str(const lrmoe_tensor_t *t, int64_t i, char *buf, size_t len)
{
    int64_t pos[LRMOE_MAX_DIMS];
    for (int d = t->ndim - 1; d >= 0; d--) {
        pos[d] = t->shape[d] ? i % t->shape[d] : 0;
        i = t->shape[d] ? i / t->shape[d] : 0;
    }
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < t->ndim && o < len; d++)
        o += (size_t)snprintf(buf + o, len - o, d ? ",%" PRId64 : "%" PRId64, pos[d]);
    if (o < len)
        snprintf(buf + o, len - o, "]");
    return buf;
}

static void print_values_differ(const lrmoe_tensor_t *ta, const lrmoe_tensor_t *tb, const lrmoe_diff_t *d)
{
    char ix[200], va[64], vb[64];
    printf("%" PRId64 " of %" PRId64 " values differ", d->ndiff, d->n);
    if (d->ndiff > d->nan_only)
        printf(", max abs %.6g, max rel %.6g", d->max_abs, d->max_rel);
    if (d->nan_only)
        printf(", %" PRId64 " NaN on one side", d->nan_only);
    printf("; first at %s: %s vs %s", index_str(ta, d->first, ix, sizeof ix),
           lrmoe_stats_value_str(ta->dtype, ta->data, (size_t)d->first, va, sizeof va),
           lrmoe_stats_value_str(tb->dtype, tb->data, (size_t)d->first, vb, sizeof vb));
}

static int diff_item(const lrmoe_diff_item_t *it, void *arg)
{
    diff_ctx_t *c = arg;
    char sa[128], sb[128];
    printf("frame %" PRId64 ": ", c->frame);
    switch (it->kind) {
    case LRMOE_DIFF_ATTR_ONLY_A:
    case LRMOE_DIFF_ATTR_ONLY_B:
        printf("attribute %s only in %s: ", it->name, it->va ? c->a : c->b);
        print_attr_value(it->va ? it->va : it->vb);
        c->attrs++;
        break;
    case LRMOE_DIFF_ATTR_VALUE:
        printf("attribute %s: ", it->name);
        print_attr_value(it->va);
        fputs(" vs ", stdout);
        print_attr_value(it->vb);
        c->attrs++;
        break;
    case LRMOE_DIFF_TENSOR_ONLY_A:
    case LRMOE_DIFF_TENSOR_ONLY_B: {
        const lrmoe_tensor_t *t = it->ta ? it->ta : it->tb;
        printf("tensor %s only in %s (%s %s)", it->name, it->ta ? c->a : c->b,
               lrmoe_dtype_name(t->dtype), lrmoe_shape_str(t, sa, sizeof sa));
        c->tensors++;
        break;
    }
    case LRMOE_DIFF_SHAPE:
        printf("tensor %s: shape %s vs %s (values not compared)", it->name,
               lrmoe_shape_str(it->ta, sa, sizeof sa), lrmoe_shape_str(it->tb, sb, sizeof sb));
        c->tensors++;
        break;
    case LRMOE_DIFF_DTYPE:
        printf("tensor %s: dtype %s vs %s; ", it->name, lrmoe_dtype_name(it->ta->dtype),
               lrmoe_dtype_name(it->tb->dtype));
        if (it->d->ndiff)
            print_values_differ(it->ta, it->tb, it->d);
        else
            printf("the values are the same as numbers");
        c->tensors++;
        break;
    case LRMOE_DIFF_VALUES:
        printf("tensor %s: ", it->name);
        print_values_differ(it->ta, it->tb, it->d);
        c->tensors++;
        break;
    }
    putchar('\n');
    return ferror(stdout) ? lrmoe_err("write error on stdout: %s", strerror(errno)) : 0;
}

/* Drop the tensors --tensor did not select (both frames). */
static int select_tensors(lrmoe_frame_t *f, opts_t *o)
{
    if (!o->sel.ntensors)
        return 0;
    for (int i = f->ntensors - 1; i >= 0; i--)
        if (!lrmoe_select_tensor(&o->sel, f->tensors[i]->name) &&
            lrmoe_frame_del(f, f->tensors[i]->name) != 1)
            return lrmoe_err("tensor %s: could not be removed", f->tensors[i]->name);
    return 0;
}

/* 0 same, 1 different, -1 trouble (error set). */
static int view_diff(const char *pa, const char *pb, opts_t *o)
{
    lrmoe_reader_t *ra = lrmoe_reader_open(pa), *rb = ra ? lrmoe_reader_open(pb) : NULL;
    lrmoe_frame_t fa, fb;
    lrmoe_frame_init(&fa);
    lrmoe_frame_init(&fb);
    diff_ctx_t c = {pa, pb, 0, 0, 0};
    int64_t frames = 0, only = 0;
    int rc = ra && rb ? 0 : -1;
    while (rc == 0) {
        int ka = lrmoe_reader_next(ra, &fa);
        int kb = ka < 0 ? 0 : lrmoe_reader_next(rb, &fb);
        if (ka < 0 || kb < 0) {
            rc = -1;
            break;
        }
        if (!ka && !kb)
            break;
        if (lrmoe_select_frame(&o->sel, c.frame)) {
            if (!ka || !kb) { /* one stream ended: count what the other has left */
                lrmoe_reader_t *r = ka ? ra : rb;
                lrmoe_frame_t *f = ka ? &fa : &fb;
                int k = 1;
                for (; k == 1 && c.frame + only <= o->sel.last; k = lrmoe_reader_next(r, f))
                    only += lrmoe_select_frame(&o->sel, c.frame + only) ? 1 : 0;
                if (k < 0 && c.frame + only <= o->sel.last) {
                    rc = -1;
                    break;
                }
                printf("frames %" PRId64 " on: %" PRId64 " only in %s (%s ends after %" PRId64
                       " frame%s)\n", c.frame, only, ka ? pa : pb, ka ? pb : pa, c.frame,
                       c.frame == 1 ? "" : "s");
                break;
            }
            if (select_tensors(&fa, o) < 0 || select_tensors(&fb, o) < 0 ||
                lrmoe_diff_frames(&fa, &fb, o->atol, o->rtol, diff_item, &c) < 0) {
                rc = -1;
                break;
            }
            frames++;
        }
        c.frame++;
        if (c.frame > o->sel.last)
            break;
    }
    lrmoe_frame_clear(&fa);
    lrmoe_frame_clear(&fb);
    lrmoe_reader_close(ra);
    lrmoe_reader_close(rb);
    if (rc < 0)
        return -1;
    if (o->sel.nranges && o->sel.last != INT64_MAX && o->sel.last >= c.frame + only)
        return lrmoe_err("--frame %" PRId64 ": the streams have %" PRId64 " frame%s", o->sel.last,
                         c.frame + only, c.frame + only == 1 ? "" : "s");
    int differ = c.attrs || c.tensors || only;
    printf("# %" PRId64 " frame%s compared: ", frames, frames == 1 ? "" : "s");
    if (!differ)
        printf("the same\n");
    else if (only)
        printf("%" PRId64 " attribute and %" PRId64 " tensor difference%s, %" PRId64
               " frame%s in one stream only\n", c.attrs, c.tensors,
               c.attrs + c.tensors == 1 ? "" : "s", only, only == 1 ? "" : "s");
    else
        printf("%" PRId64 " attribute and %" PRId64 " tensor difference%s\n", c.attrs, c.tensors,
               c.attrs + c.tensors == 1 ? "" : "s");
    return differ;
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
    int64_t kinds[4] = {0}; /* frames by digest record: none, CRC-64, XXH64, by parts */
    uint64_t bytes = 0;
    int stopped = 0;
    while ((rc = lrmoe_reader_next(r, &f)) == 1) {
        const int dk = lrmoe_reader_digest(r);
        kinds[dk >= 0 && dk < 4 ? dk : 0]++;
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
        char hb[32], rec[160] = "";
        /* which digest records the frames read had (lrmoe-stream(5)): a
         * weights file's records by parts let a tool check only what it reads */
        static const char *const kname[4] = {"none", "CRC-64", "XXH64", "CRC-64 by parts"};
        for (int k = 1, n = 0; k < 4; k++)
            if (kinds[k]) {
                size_t l = strlen(rec);
                snprintf(rec + l, sizeof rec - l, "%s%" PRId64 " %s", n++ ? ", " : "; digest records: ",
                         kinds[k], kname[k]);
            }
        if (kinds[0] && !rec[0] && i && !plain) snprintf(rec, sizeof rec, "; no digest records");
        printf("%s# %" PRId64 " frame%s%s, %" PRId64 " tensor%s, %s; %s, %s%s\n", shown ? "\n" : "",
               i, i == 1 ? "" : "s", stopped ? " read" : "", ntens, ntens == 1 ? "" : "s", human(bytes, hb, sizeof hb),
               plain ? "plain safetensors file" : compressed ? "zstd stream" : "raw stream",
               stopped ? "reading stopped after the last selected frame"
                       : plain ? "one frame, no trailer" : "clean end", rec);
    }
    if (o->sel.nranges && o->sel.last != INT64_MAX && o->sel.last >= i)
        return lrmoe_err("--frame %" PRId64 ": the stream has %" PRId64 " frame%s", o->sel.last, i,
                         i == 1 ? "" : "s");
    return 0;
}

/* long only: -j, -n and -S mean --jobs, --renorm and --stats (lrmoe(7)) */
enum { OPT_JSON = 0x100, OPT_VALUES, OPT_NO_STATS, OPT_DIFF, OPT_ATOL, OPT_RTOL };

/* --diff A B: exit 0 same, 1 different, 2 trouble (cmp's convention). */
static int diff_main(int nfiles, char *const *files, opts_t *o)
{
    if (nfiles != 2 || o->json || o->values) {
        fprintf(stderr, "%s: --diff compares two streams: --diff [--frame R] [--tensor NAME] "
                        "[--atol X] [--rtol X] A B\n", prog);
        lrmoe_select_free(&o->sel);
        return 2;
    }
    int r = view_diff(files[0], files[1], o);
    if (r < 0)
        fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
    for (int k = 0; k < o->sel.ntensors && r >= 0; k++)
        if (!o->sel.seen[k]) {
            fprintf(stderr, "%s: --tensor %s: no such tensor in the selected frames\n", prog,
                    o->sel.tensors[k]);
            r = -1;
        }
    if (fflush(stdout) != 0 || ferror(stdout) || fclose(stdout) != 0) {
        if (r >= 0)
            fprintf(stderr, "%s: write error on stdout: %s\n", prog, errno ? strerror(errno) : "I/O error");
        r = -1;
    }
    lrmoe_select_free(&o->sel);
    return r < 0 ? 2 : r;
}

int main(int argc, char **argv)
{
    static const struct option lopts[] = {
        {"json", no_argument, 0, OPT_JSON},
        {"frame", required_argument, 0, 'F'},
        {"tensor", required_argument, 0, 'T'},
        {"values", required_argument, 0, OPT_VALUES},
        {"no-stats", no_argument, 0, OPT_NO_STATS},
        {"diff", no_argument, 0, OPT_DIFF},
        {"atol", required_argument, 0, OPT_ATOL},
        {"rtol", required_argument, 0, OPT_RTOL},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0}};
    opts_t o;
    memset(&o, 0, sizeof o);
    lrmoe_select_init(&o.sel);
    o.stats = 1;
    int c;
    while ((c = getopt_long(argc, argv, "F:T:hV", lopts, NULL)) != -1) {
        int sel = lrmoe_select_opt(&o.sel, c, optarg);
        if (sel < 0) /* -1: a bad --frame, a usage error */
            return lrmoe_tool_fail(prog, sel == -1 ? 2 : 1);
        if (sel > 0)
            continue;
        switch (c) {
        case OPT_JSON:
            o.json = 1;
            break;
        case OPT_VALUES:
            if (lrmoe_parse_i64("--values", optarg, 0, INT64_MAX, &o.values) < 0) {
                fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
                return 2;
            }
            break;
        case OPT_NO_STATS:
            o.stats = 0;
            break;
        case OPT_DIFF:
            o.diff = 1;
            break;
        case OPT_ATOL:
        case OPT_RTOL:
            if (lrmoe_parse_f64(c == OPT_ATOL ? "--atol" : "--rtol", optarg, 0, INFINITY,
                                c == OPT_ATOL ? &o.atol : &o.rtol) < 0) {
                fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("%s (lrmoe) %s\n", prog, LRMOE_VERSION); return 0;
        default: return lrmoe_usage_error(prog);
        }
    }
    int nfiles = argc - optind, rc = 0;
    if (lrmoe_inputs_check(nfiles, argv + optind) < 0) {
        fprintf(stderr, "%s: %s\n", prog, lrmoe_errmsg());
        return 2;
    }
    if (o.diff)
        return diff_main(nfiles, argv + optind, &o);
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
