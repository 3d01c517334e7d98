/* plot: gnuplot scripts and their data files for the lrmoe report tools.
 *
 * Every figure is DIR/NAME.dat (whitespace-separated columns, a header
 * comment naming them), DIR/NAME.gp, a self-contained gnuplot script that
 * reads the .dat file by relative name (run it with DIR as the working
 * directory) and writes DIR/NAME.svg (or .png), and, once
 * lrmoe_plot_render() has run gnuplot, the figure itself. No printing.
 *
 * Figures are made for reports: one font that every SVG renderer resolves
 * the same way (DejaVu Sans, what rsvg and ImageMagick both find), the
 * legend below the plot (which gets the figure's full width), every line series with its own colour, dash type
 * and point type (so they stay apart in greyscale), stacked segments in
 * colours of clearly different lightness, solid fills. The SVG gnuplot
 * writes is rewritten so that renderers without <use> or currentColor
 * (ImageMagick's own) draw the same picture (lrmoe_plot_svg_portable).
 * Titles are written as given; the caller labels modelled figures.
 */
#ifndef LRMOE_PLOT_H
#define LRMOE_PLOT_H

typedef enum { LRMOE_PLOT_SVG = 0, LRMOE_PLOT_PNG = 1 } lrmoe_plot_fmt_t;

/* Parse "svg" / "png". 0 ok, -1 with error. */
int lrmoe_plot_fmt_parse(const char *s, lrmoe_plot_fmt_t *fmt);
const char *lrmoe_plot_fmt_ext(lrmoe_plot_fmt_t fmt); /* "svg" / "png" */

typedef struct {
    const char *title, *xlabel, *ylabel;
    const char *note;       /* a line of small print under the legend (NULL: none) */
    /* lines */
    int steps;              /* step lines centred on integer x (per-rank loads) */
    int log2x;              /* log2 x axis with a tic at every x value */
    const char *const *xtic_notes; /* a second line under the tic of every x value
                                      (NULL: none), e.g. what a planner chose there */
    /* stacked */
    double ref_y;           /* > 0: a dashed horizontal line at ref_y (a budget) */
    const char *ref_label;  /* its legend entry */
    int nmarks;             /* crosses at (mark_bar[i], mark_y[i]) over the bars */
    const double *mark_bar, *mark_y;
    const char *mark_label; /* their legend entry */
    const char *const *bar_notes; /* a label above each bar (NULL, or NULL entries) */
    const char *const *seg_rgb;   /* "#RRGGBB" per segment (NULL: the default
                                     palette, which has 4 colours) */
} lrmoe_plot_opts_t;

void lrmoe_plot_opts_init(lrmoe_plot_opts_t *o);

/* Stacked bars: one bar per label, nseg stacked segments each.
 * values is (nbars,nseg), row-major. A reference line more than three times
 * above the highest bar or mark would squash the bars: it is left out and
 * named in a note under the plot instead. */
int lrmoe_plot_stacked(const char *dir, const char *name, lrmoe_plot_fmt_t fmt,
                       const lrmoe_plot_opts_t *o, int nbars, const char *const *bar_labels,
                       int nseg, const char *const *seg_labels, const double *values);

/* Line chart: nseries series over the same npoints x values.
 * y is (nseries,npoints), row-major. */
int lrmoe_plot_lines(const char *dir, const char *name, lrmoe_plot_fmt_t fmt,
                     const lrmoe_plot_opts_t *o, int npoints, const double *x, int nseries,
                     const char *const *series_labels, const double *y);

/* 1 when gnuplot is on PATH. */
int lrmoe_plot_have_gnuplot(void);
/* Run gnuplot on DIR/NAME.gp inside DIR (its output goes to stderr), then,
 * for SVG, lrmoe_plot_svg_portable on DIR/NAME.svg. 0, or -1 with error. */
int lrmoe_plot_render(const char *dir, const char *name, lrmoe_plot_fmt_t fmt);
/* Rewrite an SVG written by gnuplot in place so that it draws the same in
 * renderers without <use> or currentColor: every <use> of a <defs> element
 * becomes a copy of it with the colour written out. 0, or -1 with error. */
int lrmoe_plot_svg_portable(const char *path);

#endif
