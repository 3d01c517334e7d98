/* plot: write gnuplot scripts and data files (no processes, no printing). */
#include "plot.h"
#include "lrmoe.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void preamble(FILE *fp, const char *name, lrmoe_plot_fmt_t fmt, const char *title)
{
    if (fmt == LRMOE_PLOT_PNG)
        fprintf(fp, "set terminal png size 960,540\n");
    else
        fprintf(fp, "set terminal svg size 960,540 dynamic font \"sans,12\" background \"white\"\n");
    fprintf(fp, "set termoption noenhanced\n");
    fprintf(fp, "set output ");
    char out[1024];
    snprintf(out, sizeof out, "%s.%s", name, lrmoe_plot_fmt_ext(fmt));
    put_str(fp, out);
    fprintf(fp, "\nset title ");
    put_str(fp, title);
    fprintf(fp, "\nset datafile separator \"\\t\"\n");
    fprintf(fp, "set key outside right top\nset grid ytics\n");
}

int lrmoe_plot_stacked(const char *dir, const char *name, lrmoe_plot_fmt_t fmt,
                       const char *title, const char *ylabel,
                       int nbars, const char *const *bar_labels,
                       int nseg, const char *const *seg_labels,
                       const double *values)
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
    for (int b = 0; b < nbars; b++) {
        put_label(fp, bar_labels[b]);
        for (int s = 0; s < nseg; s++) fprintf(fp, "\t%.9g", values[(size_t)b * nseg + s]);
        fputc('\n', fp);
    }
    if (close_checked(fp, path) < 0) return -1;

    fp = open_in(dir, name, "gp", path, sizeof path);
    if (!fp) return -1;
    preamble(fp, name, fmt, title);
    fprintf(fp, "set ylabel ");
    put_str(fp, ylabel);
    fprintf(fp, "\nset yrange [0:*]\nset style data histograms\n"
                "set style histogram rowstacked\nset style fill solid 0.85 border -1\n"
                "set boxwidth 0.6\n");
    char dat[1024];
    snprintf(dat, sizeof dat, "%s.dat", name);
    fprintf(fp, "plot ");
    for (int s = 0; s < nseg; s++) {
        if (s == 0) {
            put_str(fp, dat);
            fprintf(fp, " using 2:xtic(1) title ");
        } else {
            fprintf(fp, ", \\\n     '' using %d title ", s + 2);
        }
        put_str(fp, seg_labels[s]);
    }
    fprintf(fp, "\n");
    return close_checked(fp, path);
}

int lrmoe_plot_lines(const char *dir, const char *name, lrmoe_plot_fmt_t fmt,
                     const char *title, const char *xlabel, const char *ylabel,
                     int npoints, const double *x,
                     int nseries, const char *const *series_labels,
                     const double *y, const int *dashed, int steps)
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
    preamble(fp, name, fmt, title);
    fprintf(fp, "set xlabel ");
    put_str(fp, xlabel);
    fprintf(fp, "\nset ylabel ");
    put_str(fp, ylabel);
    fprintf(fp, "\nset yrange [0:*]\n");
    if (steps && npoints > 1) {
        /* whole steps at both ends */
        double h = (x[npoints - 1] - x[0]) / (npoints - 1) / 2;
        fprintf(fp, "set xrange [%.9g:%.9g]\n", x[0] - h, x[npoints - 1] + h);
    }
    char dat[1024];
    snprintf(dat, sizeof dat, "%s.dat", name);
    fprintf(fp, "plot ");
    for (int s = 0; s < nseries; s++) {
        if (s) fprintf(fp, ", \\\n     ");
        put_str(fp, dat);
        /* earlier series drawn wider so that equal series stay visible */
        fprintf(fp, " using 1:%d with %s lw %.2f dashtype %d title ", s + 2,
                steps ? "histeps" : "linespoints", 1.5 + 0.75 * (nseries - 1 - s),
                dashed && dashed[s] ? 2 : 1);
        put_str(fp, series_labels[s]);
    }
    fprintf(fp, "\n");
    return close_checked(fp, path);
}
