/* plot: gnuplot scripts and data files, gnuplot run on them, and the SVG
 * made portable (no printing). */
#include "plot.h"
#include "lrmoe.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int lrmoe_plot_fmt_parse(const char *s, lrmoe_plot_fmt_t *fmt)
{
    if (!strcmp(s, "svg")) { *fmt = LRMOE_PLOT_SVG; return 0; }
    if (!strcmp(s, "png")) { *fmt = LRMOE_PLOT_PNG; return 0; }
    return lrmoe_err("plot format '%s': expected svg or png", s);
}

const char *lrmoe_plot_fmt_ext(lrmoe_plot_fmt_t fmt)
{
    return fmt == LRMOE_PLOT_PNG ? "png" : "svg";
}

/* fopen DIR/NAME.EXT for writing. */
static FILE *open_in(const char *dir, const char *name, const char *ext, char *path,
                     size_t plen)
{
    int n = snprintf(path, plen, "%s/%s.%s", dir, name, ext);
    if (n < 0 || (size_t)n >= plen) {
        lrmoe_err("%s/%s.%s: path too long", dir, name, ext);
        return NULL;
    }
    FILE *fp = fopen(path, "w");
    if (!fp) lrmoe_err("%s: %s", path, strerror(errno));
    return fp;
}

static int close_checked(FILE *fp, const char *path)
{
    int bad = ferror(fp);
    if (fclose(fp) != 0 || bad) return lrmoe_err("%s: write failed", path);
    return 0;
}

/* A gnuplot double-quoted string: escape backslash and double quote. */
static void put_str(FILE *fp, const char *s)
{
    fputc('"', fp);
    for (; *s; s++) {
        if (*s == '\n') { /* a line break inside titles */
            fputs("\\n", fp);
            continue;
        }
        if (*s == '"' || *s == '\\') fputc('\\', fp);
        fputc(*s, fp);
    }
    fputc('"', fp);
}

/* Data-file label: tabs and newlines would break the columns. */
static void put_label(FILE *fp, const char *s)
{
    for (; *s; s++) fputc((*s == '\t' || *s == '\n') ? ' ' : *s, fp);
}

void lrmoe_plot_opts_init(lrmoe_plot_opts_t *o)
{
    memset(o, 0, sizeof *o);
}

/* Series styles: colour (Okabe-Ito), dash type, point type; no two alike
 * in greyscale. Segment fills: colours far apart in lightness. */
#define NSTYLE 8
static const char *const LINE_RGB[NSTYLE] = {"#000000", "#E69F00", "#0072B2", "#009E73",
                                              "#D55E00", "#56B4E9", "#CC79A7", "#777777"};
static const char *const LINE_DT[NSTYLE] = {"1", "2", "3", "4", "5", "(16,5)", "(2,7)",
                                            "(11,4,2,4,2,4)"};
static const int LINE_PT[NSTYLE] = {6, 4, 8, 2, 1, 14, 7, 5}; /* none rotated */
static const char *const FILL_RGB[] = {"#1F3B73", "#D55E00", "#9ECAE1", "#F0E442"};
#define NFILL 4
#define MARK_RGB "#CC0000"

static void preamble(FILE *fp, const char *name, lrmoe_plot_fmt_t fmt, const lrmoe_plot_opts_t *o)
{
    if (fmt == LRMOE_PLOT_PNG)
        fprintf(fp, "set terminal pngcairo size 960,600 rounded font \"DejaVu Sans,11\" "
                    "background \"white\"\n");
    else
        fprintf(fp, "set terminal svg size 960,600 fixed rounded font \"DejaVu Sans,12\" "
                    "background \"white\"\n");
    fprintf(fp, "set termoption noenhanced\n");
    fprintf(fp, "set output ");
    char out[1024];
    snprintf(out, sizeof out, "%s.%s", name, lrmoe_plot_fmt_ext(fmt));
    put_str(fp, out);
    fprintf(fp, "\nset title ");
    /* the note as the title's last line: the legend below keeps its
     * automatic margin */
    char title[2048]; /* and an empty line for the y label above the axis */
    snprintf(title, sizeof title, "%s%s%s%s", o->title ? o->title : "", o->note ? "\n" : "",
             o->note ? o->note : "", o->ylabel ? "\n" : "");
    put_str(fp, title);
    fprintf(fp, "\nset datafile separator \"\\t\"\n");
    /* the legend below the plot, in rows: the data gets the full width */
    fprintf(fp, "set key outside below center horizontal Left reverse samplen 3 spacing 1.3 "
                "width 2\n");
    fprintf(fp, "set grid ytics lc rgb \"#d0d0d0\" lw 1 dt 1\nset border lw 1\n");
    if (o->xlabel) {
        fprintf(fp, "set xlabel ");
        put_str(fp, o->xlabel);
        fputc('\n', fp);
    }
    if (o->ylabel) { /* horizontal, above the axis: renderers disagree on rotated text */
        fprintf(fp, "set label ");
        put_str(fp, o->ylabel);
        fprintf(fp, " at graph 0, graph 1 left offset -1,1\n");
    }
}

int lrmoe_plot_stacked(const char *dir, const char *name, lrmoe_plot_fmt_t fmt,
                       const lrmoe_plot_opts_t *o, int nbars, const char *const *bar_labels,
                       int nseg, const char *const *seg_labels, const double *values)
{
    if (nbars < 1 || nseg < 1) return lrmoe_err("plot %s: nothing to draw", name);
    char path[4096];
    FILE *fp = open_in(dir, name, "dat", path, sizeof path);
    if (!fp) return -1;
    fprintf(fp, "# bar");
    for (int s = 0; s < nseg; s++) {
        fputc('\t', fp);
        put_label(fp, seg_labels[s]);
    }
    fputc('\n', fp);
    double top = 0; /* the highest bar or mark */
    for (int b = 0; b < nbars; b++) {
        double sum = 0;
        put_label(fp, bar_labels[b]);
        for (int s = 0; s < nseg; s++) {
            fprintf(fp, "\t%.9g", values[(size_t)b * nseg + s]);
            sum += values[(size_t)b * nseg + s];
        }
        fputc('\n', fp);
        if (sum > top) top = sum;
    }
    if (o->nmarks) { /* block 1: the marks */
        fprintf(fp, "\n\n# bar\ty\n");
        for (int i = 0; i < o->nmarks; i++) {
            fprintf(fp, "%.9g\t%.9g\n", o->mark_bar[i], o->mark_y[i]);
            if (o->mark_y[i] > top) top = o->mark_y[i];
        }
    }
    if (close_checked(fp, path) < 0) return -1;

    fp = open_in(dir, name, "gp", path, sizeof path);
    if (!fp) return -1;
    int ref = o->ref_y > 0 && o->ref_y <= 3 * top;
    lrmoe_plot_opts_t oo = *o;
    char note[1024];
    if (o->ref_y > 0 && !ref) { /* far above the bars: say so instead of squashing them */
        snprintf(note, sizeof note, "%s%s%s = %.4g %s: above the plotted range",
                 o->note ? o->note : "", o->note ? "\n" : "", o->ref_label ? o->ref_label : "reference",
                 o->ref_y, o->ylabel ? o->ylabel : "");
        oo.note = note;
    }
    preamble(fp, name, fmt, &oo);
    double ymax = (ref && o->ref_y > top ? o->ref_y : top) * 1.2;
    fprintf(fp, "set yrange [0:%.9g]\nset xrange [-0.6:%d.6]\nset style data histograms\n"
                "set style histogram rowstacked\nset style fill solid 1.0 border lc rgb \"#000000\"\n"
                "set boxwidth 0.6\n", ymax > 0 ? ymax : 1, nbars - 1);
    for (int b = 0; o->bar_notes && b < nbars; b++) {
        if (!o->bar_notes[b]) continue;
        double at = 0; /* above the bar and its marks */
        for (int s = 0; s < nseg; s++) at += values[(size_t)b * nseg + s];
        for (int i = 0; i < o->nmarks; i++)
            if ((int)o->mark_bar[i] == b && o->mark_y[i] > at) at = o->mark_y[i];
        fprintf(fp, "set label ");
        put_str(fp, o->bar_notes[b]);
        fprintf(fp, " at %d, %.9g center offset 0,1.4 front\n", b, at);
    }
    if (ref)
        fprintf(fp, "set arrow from graph 0, first %.9g to graph 1, first %.9g nohead lw 2 dt 2 "
                    "lc rgb \"#000000\" front\n", o->ref_y, o->ref_y);
    char dat[1024];
    snprintf(dat, sizeof dat, "%s.dat", name);
    fprintf(fp, "plot ");
    for (int s = 0; s < nseg; s++) {
        if (s == 0) {
            put_str(fp, dat);
            fprintf(fp, " index 0 using 2:xtic(1)");
        } else {
            fprintf(fp, ", \\\n     '' index 0 using %d", s + 2);
        }
        fprintf(fp, " lc rgb \"%s\" title ", o->seg_rgb ? o->seg_rgb[s] : FILL_RGB[s % NFILL]);
        put_str(fp, seg_labels[s]);
    }
    if (o->nmarks) {
        fprintf(fp, ", \\\n     '' index 1 using 1:2 with points pt 2 ps 1.8 lw 2.5 lc rgb \"%s\" "
                    "title ", MARK_RGB);
        put_str(fp, o->mark_label ? o->mark_label : "mark");
    }
    if (ref) {
        fprintf(fp, ", \\\n     NaN with lines lw 2 dt 2 lc rgb \"#000000\" title ");
        put_str(fp, o->ref_label ? o->ref_label : "reference");
    }
    fprintf(fp, "\n");
    return close_checked(fp, path);
}

int lrmoe_plot_lines(const char *dir, const char *name, lrmoe_plot_fmt_t fmt,
                     const lrmoe_plot_opts_t *o, int npoints, const double *x, int nseries,
                     const char *const *series_labels, const double *y)
{
    if (npoints < 1 || nseries < 1) return lrmoe_err("plot %s: nothing to draw", name);
    char path[4096];
    FILE *fp = open_in(dir, name, "dat", path, sizeof path);
    if (!fp) return -1;
    fprintf(fp, "# x");
    for (int s = 0; s < nseries; s++) {
        fputc('\t', fp);
        put_label(fp, series_labels[s]);
    }
    fputc('\n', fp);
    for (int i = 0; i < npoints; i++) {
        fprintf(fp, "%.9g", x[i]);
        for (int s = 0; s < nseries; s++) fprintf(fp, "\t%.9g", y[(size_t)s * npoints + i]);
        fputc('\n', fp);
    }
    if (close_checked(fp, path) < 0) return -1;

    fp = open_in(dir, name, "gp", path, sizeof path);
    if (!fp) return -1;
    preamble(fp, name, fmt, o);
    fprintf(fp, "set yrange [0:*]\n");
    for (int s = 0; s < nseries; s++) /* earlier series wider: equal ones stay visible */
        fprintf(fp, "set style line %d lc rgb \"%s\" dt %s pt %d ps 1.3 lw %.2f\n", s + 1,
                LINE_RGB[s % NSTYLE], LINE_DT[s % NSTYLE], LINE_PT[s % NSTYLE],
                1.5 + 0.6 * (nseries - 1 - s) > 4 ? 4 : 1.5 + 0.6 * (nseries - 1 - s));
    if (o->steps && npoints > 1) {
        /* whole steps at both ends */
        double h = (x[npoints - 1] - x[0]) / (npoints - 1) / 2;
        fprintf(fp, "set xrange [%.9g:%.9g]\n", x[0] - h, x[npoints - 1] + h);
    }
    if (o->log2x || o->xtic_notes) { /* a tic at every x, with its note under it */
        if (o->log2x) fprintf(fp, "set logscale x 2\n");
        fprintf(fp, "set xtics (");
        for (int i = 0; i < npoints; i++) {
            char tic[256];
            snprintf(tic, sizeof tic, "%.6g%s%s", x[i], o->xtic_notes ? "\n" : "",
                     o->xtic_notes && o->xtic_notes[i] ? o->xtic_notes[i] : "");
            fprintf(fp, "%s", i ? ", " : "");
            put_str(fp, tic);
            fprintf(fp, " %.9g", x[i]);
        }
        fprintf(fp, ")\n");
        if (o->xtic_notes && o->xlabel) /* gnuplot leaves room for one line of tics */
            fprintf(fp, "set xlabel offset 0,-1\n");
        if (o->log2x) fprintf(fp, "set xrange [%.9g:%.9g]\n", x[0] / 1.15, x[npoints - 1] * 1.15);
    }
    char dat[1024];
    snprintf(dat, sizeof dat, "%s.dat", name);
    fprintf(fp, "plot ");
    /* the data without titles, then one NaN plot per series for its legend
     * entry: a legend sample in its own path (a path of several dashed
     * pieces is joined up by some SVG renderers) */
    for (int s = 0; s < nseries; s++) {
        if (s) fprintf(fp, ", \\\n     ");
        put_str(fp, dat);
        if (o->steps)
            fprintf(fp, " using 1:%d with histeps ls %d notitle, \\\n     '' using 1:%d with "
                        "points ls %d notitle", s + 2, s + 1, s + 2, s + 1);
        else
            fprintf(fp, " using 1:%d with linespoints ls %d notitle", s + 2, s + 1);
    }
    for (int s = 0; s < nseries; s++) {
        fprintf(fp, ", \\\n     NaN with linespoints ls %d title ", s + 1);
        put_str(fp, series_labels[s]);
    }
    fprintf(fp, "\n");
    return close_checked(fp, path);
}

/* ------------------------------------------------------------ gnuplot */

int lrmoe_plot_have_gnuplot(void)
{
    const char *path = getenv("PATH");
    if (!path) return 0;
    char *dup = strdup(path), *save = NULL;
    int ok = 0;
    for (char *d = dup ? strtok_r(dup, ":", &save) : NULL; d && !ok; d = strtok_r(NULL, ":", &save)) {
        char buf[4096];
        snprintf(buf, sizeof buf, "%s/gnuplot", *d ? d : ".");
        ok = access(buf, X_OK) == 0;
    }
    free(dup);
    return ok;
}

int lrmoe_plot_render(const char *dir, const char *name, lrmoe_plot_fmt_t fmt)
{
    char gp[1024];
    snprintf(gp, sizeof gp, "%s.gp", name);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return lrmoe_err("gnuplot: fork: %s", strerror(errno));
    if (pid == 0) {
        if (chdir(dir) != 0) _exit(127);
        if (!freopen("/dev/null", "r", stdin) || dup2(2, 1) < 0) _exit(127);
        execlp("gnuplot", "gnuplot", gp, (char *)NULL);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return lrmoe_err("gnuplot: wait: %s", strerror(errno));
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return lrmoe_err("gnuplot %s/%s failed (status %d)", dir, gp,
                         WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    if (fmt != LRMOE_PLOT_SVG) return 0;
    char svg[4096];
    snprintf(svg, sizeof svg, "%s/%s.svg", dir, name);
    return lrmoe_plot_svg_portable(svg);
}

/* ------------------------------------------------------------ SVG */

/* The whole file, NUL-terminated; NULL with error. */
static char *slurp(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        lrmoe_err("%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    for (size_t m; b && (m = fread(b + n, 1, cap - n - 1, fp)) > 0;) {
        n += m;
        if (cap - n - 1 == 0) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) { free(b); b = NULL; }
            else b = nb;
        }
    }
    int bad = ferror(fp);
    fclose(fp);
    if (!b || bad) {
        free(b);
        lrmoe_err("%s: %s", path, bad ? "read error" : "out of memory");
        return NULL;
    }
    b[n] = 0;
    *len = n;
    return b;
}

/* The value of attribute name (quoted with ' or ") inside the tag
 * [tag, end): its start and length, or NULL. */
static const char *attr_in(const char *tag, const char *end, const char *name, size_t *len)
{
    size_t nl = strlen(name);
    for (const char *p = tag + 1; p + nl + 2 < end; p++) {
        if ((p[-1] != ' ' && p[-1] != '\t' && p[-1] != '\n') || strncmp(p, name, nl) || p[nl] != '=')
            continue;
        char q = p[nl + 1];
        if (q != '\'' && q != '"') continue;
        const char *v = p + nl + 2, *e = memchr(v, q, (size_t)(end - v));
        if (!e) return NULL;
        *len = (size_t)(e - v);
        return v;
    }
    return NULL;
}

/* fputs of [s, e) with every "currentColor" replaced by color (len cl). */
static void put_colored(FILE *fp, const char *s, const char *e, const char *color, size_t cl)
{
    static const char CC[] = "currentColor";
    while (s < e) {
        const char *c = strstr(s, CC);
        if (!c || c >= e) {
            fwrite(s, 1, (size_t)(e - s), fp);
            return;
        }
        fwrite(s, 1, (size_t)(c - s), fp);
        fwrite(color, 1, cl, fp);
        s = c + sizeof CC - 1;
    }
}

/* The element of [defs, de) whose id is [id, id+il): its start and end
 * (after its "/>"), or 0 when there is none (or it is not one tag). */
static int find_def(const char *defs, const char *de, const char *id, size_t il, const char **el,
                    const char **ee)
{
    char key[96];
    snprintf(key, sizeof key, "id='%.*s'", (int)(il < 80 ? il : 80), id);
    const char *at = strstr(defs, key);
    if (!at || at >= de) return 0;
    const char *b = at;
    while (b > defs && *b != '<') b--;
    const char *e = strstr(at, "/>");
    if (*b != '<' || !e || e >= de || memchr(b + 1, '<', (size_t)(e - b - 1))) return 0;
    *el = b;
    *ee = e + 2;
    return 1;
}

/* A copy of def [id] in colour col: a <use> inside the defs becomes a <g>
 * with its transform, fill and stroke around the element it uses (what
 * the use's attributes mean: inherited where the element sets none). */
static int emit_def(FILE *fp, const char *defs, const char *de, const char *id, size_t il,
                    const char *col, size_t cl, int depth)
{
    const char *el, *ee;
    if (depth > 4 || !find_def(defs, de, id, il, &el, &ee)) return 0;
    if (!strncmp(el, "<use ", 5)) {
        size_t hl = 0, n = 0;
        const char *href = attr_in(el, ee, "xlink:href", &hl);
        if (!href || hl < 2 || *href != '#') return 0;
        fprintf(fp, "<g");
        static const char *const pass[] = {"transform", "fill", "stroke"};
        for (int k = 0; k < 3; k++) {
            const char *v = attr_in(el, ee, pass[k], &n);
            if (!v) continue;
            fprintf(fp, " %s='", pass[k]);
            put_colored(fp, v, v + n, col, cl);
            fputc('\'', fp);
        }
        fputc('>', fp);
        int ok = emit_def(fp, defs, de, href + 1, hl - 1, col, cl, depth + 1);
        fprintf(fp, "</g>");
        return ok;
    }
    const char *idp = strstr(el, " id='"), *ide = idp ? strchr(idp + 5, '\'') : NULL;
    if (idp && ide && ide < ee) {
        put_colored(fp, el, idp, col, cl);
        put_colored(fp, ide + 1, ee, col, cl);
    } else {
        put_colored(fp, el, ee, col, cl);
    }
    return 1;
}

int lrmoe_plot_svg_portable(const char *path)
{
    size_t n;
    char *svg = slurp(path, &n);
    if (!svg) return -1;
    char *out = NULL;
    size_t outlen = 0;
    FILE *fp = open_memstream(&out, &outlen);
    if (!fp) {
        free(svg);
        return lrmoe_err("out of memory");
    }
    const char *defs = strstr(svg, "<defs>"), *de = defs ? strstr(defs, "</defs>") : NULL;
    const char *p = svg;
    for (const char *u; (u = strstr(p, "<use ")) != NULL;) {
        const char *ue = strstr(u, "/>");
        if (!ue) break;
        ue += 2;
        fwrite(p, 1, (size_t)(u - p), fp);
        p = ue;
        size_t hl = 0, cl = 0, tl = 0;
        const char *href = attr_in(u, ue, "xlink:href", &hl), *col = attr_in(u, ue, "color", &cl),
                   *tr = attr_in(u, ue, "transform", &tl);
        if (!defs || !de || (u > defs && u < de) || !href || hl < 2 || *href != '#') {
            fwrite(u, 1, (size_t)(ue - u), fp); /* the definitions themselves, or not ours */
            continue;
        }
        if (!col) {
            col = "black";
            cl = 5;
        }
        /* the expansion goes to a buffer first: a use it cannot resolve stays as it was */
        char *buf = NULL;
        size_t bl = 0;
        FILE *mf = open_memstream(&buf, &bl);
        if (!mf) {
            fclose(fp);
            free(out);
            free(svg);
            return lrmoe_err("out of memory");
        }
        fprintf(mf, "<g");
        if (tr) fprintf(mf, " transform='%.*s'", (int)tl, tr);
        fprintf(mf, " color='%.*s'>", (int)cl, col);
        int ok = emit_def(mf, defs, de, href + 1, hl - 1, col, cl, 0);
        fprintf(mf, "</g>");
        fclose(mf);
        if (ok) fwrite(buf, 1, bl, fp);
        else fwrite(u, 1, (size_t)(ue - u), fp);
        free(buf);
    }
    fputs(p, fp);
    free(svg);
    if (fclose(fp) != 0 || !out) {
        free(out);
        return lrmoe_err("out of memory");
    }
    /* then, tag by tag: a <rect> without a stroke gets stroke='none'
     * (ImageMagick would draw a black frame around the figure's
     * background), and currentColor in a tag that sets color is written out */
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    fp = fopen(tmp, "wb");
    if (!fp) {
        free(out);
        return lrmoe_err("%s: %s", tmp, strerror(errno));
    }
    p = out;
    const char *od = strstr(out, "<defs>"), *ode = od ? strstr(od, "</defs>") : NULL;
    for (const char *t; (t = strchr(p, '<')) != NULL;) {
        const char *te = strchr(t, '>');
        if (!te) break;
        te++;
        fwrite(p, 1, (size_t)(t - p), fp);
        p = te;
        size_t cl = 0;
        const char *col = od && ode && t > od && t < ode ? NULL : attr_in(t, te, "color", &cl);
        if (!strncmp(t, "<rect ", 6) && !memmem(t, (size_t)(te - t), "stroke", 6)) {
            fwrite(t, 1, 5, fp);
            fputs(" stroke='none'", fp);
            fwrite(t + 5, 1, (size_t)(te - t - 5), fp);
        } else if (col && memmem(t, (size_t)(te - t), "currentColor", 12)) {
            put_colored(fp, t, te, col, cl);
        } else {
            fwrite(t, 1, (size_t)(te - t), fp);
        }
    }
    fputs(p, fp);
    free(out);
    int bad = ferror(fp);
    if (fclose(fp) != 0 || bad) {
        unlink(tmp);
        return lrmoe_err("%s: write failed", tmp);
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return lrmoe_err("%s: %s", path, strerror(errno));
    }
    return 0;
}
