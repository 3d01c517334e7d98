/* plot: gnuplot scripts and their data files for the lrmoe report tools.
 *
 * Every function writes DIR/NAME.dat (whitespace-separated columns, a
 * header comment naming them) and DIR/NAME.gp, a self-contained gnuplot
 * script that reads the .dat file by absolute-free relative name (run it
 * with DIR as the working directory) and writes DIR/NAME.svg (or .png).
 * Running gnuplot is the caller's business (see lrmoe-sim), so this module
 * stays free of processes and printing. Titles are written as given; the
 * caller labels modelled figures "modelled".
 */
#ifndef LRMOE_PLOT_H
#define LRMOE_PLOT_H

typedef enum { LRMOE_PLOT_SVG = 0, LRMOE_PLOT_PNG = 1 } lrmoe_plot_fmt_t;

/* Parse "svg" / "png". 0 ok, -1 with error. */
int lrmoe_plot_fmt_parse(const char *s, lrmoe_plot_fmt_t *fmt);
const char *lrmoe_plot_fmt_ext(lrmoe_plot_fmt_t fmt); /* "svg" / "png" */

/* Stacked bars: one bar per label, nseg stacked segments each.
 * values is (nbars,nseg), row-major. */
int lrmoe_plot_stacked(const char *dir, const char *name, lrmoe_plot_fmt_t fmt,
                       const char *title, const char *ylabel,
                       int nbars, const char *const *bar_labels,
                       int nseg, const char *const *seg_labels,
                       const double *values);

/* Line chart: nseries series over the same npoints x values.
 * y is (nseries,npoints), row-major. dashed (may be NULL) marks series
 * drawn dashed. steps != 0 draws each series as a histogram-like step line
 * (per-rank loads), else lines with points. */
int lrmoe_plot_lines(const char *dir, const char *name, lrmoe_plot_fmt_t fmt,
                     const char *title, const char *xlabel, const char *ylabel,
                     int npoints, const double *x,
                     int nseries, const char *const *series_labels,
                     const double *y, const int *dashed, int steps);

#endif
