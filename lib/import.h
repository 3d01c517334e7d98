/* Import: .safetensors files, .npy files (grouped into frames by name) and
 * safetensors blobs on standard input -> frames (lrmoe-import, and any caller
 * that turns dumps into frames in-process).
 *
 *   .npy names:  fN.NAME.npy -> frame N, tensor NAME
 *                NAME.N.npy  -> frame N, tensor NAME
 *                NAME.npy    -> frame 0, tensor NAME
 *   fN.frame.json (lrmoe-export's sidecar) restores frame N's attributes,
 *   tensor order and dtypes; a directory stands for its *.npy, *.frame.json
 *   and *.safetensors files, sorted by name; "-" is standard input.
 *
 * Nothing here prints or exits: -1 with lrmoe_err set. */
#ifndef LRMOE_IMPORT_H
#define LRMOE_IMPORT_H

#include <stddef.h>
#include "lrmoe.h"

typedef struct {
    struct lrmoe_import_rename *ren;   /* --name OLD=NEW */
    int nren;
    struct lrmoe_import_retype *ret;   /* --dtype [NAME=]DT */
    int nret;
    char **akey, **aval;               /* --attr KEY=VAL */
    int nattr;
    int one_frame;                     /* every .npy file in one frame */
} lrmoe_import_opts_t;

void lrmoe_import_opts_init(lrmoe_import_opts_t *o);
void lrmoe_import_opts_free(lrmoe_import_opts_t *o);
/* "OLD=NEW": rename tensor OLD to NEW in every frame. */
int lrmoe_import_opts_rename(lrmoe_import_opts_t *o, const char *arg);
/* "[NAME=]DT": reinterpret tensor NAME's bytes as DT (same element size);
 * without NAME, every integer tensor of DT's element size. */
int lrmoe_import_opts_retype(lrmoe_import_opts_t *o, const char *arg);
/* "KEY=VAL": a frame attribute on every frame. */
int lrmoe_import_opts_attr(lrmoe_import_opts_t *o, const char *arg);

typedef struct {
    struct lrmoe_import_input *v;
    size_t n, cap;
} lrmoe_import_inputs_t;

/* Add a file, a directory (its importable files, sorted) or "-" (once). */
int lrmoe_import_add(lrmoe_import_inputs_t *in, const char *arg);
void lrmoe_import_inputs_free(lrmoe_import_inputs_t *in);

/* Import every input in order, calling fn on each finished frame (options
 * applied); fn's index counts frames from 0. Errors name the input. */
int lrmoe_import_run(lrmoe_import_inputs_t *in, lrmoe_import_opts_t *o,
                     lrmoe_frame_fn fn, void *ctx);

/* One safetensors file as a frame. */
int lrmoe_import_safetensors(const char *path, lrmoe_frame_t *f);

#endif
