/* A model's weights stream held in memory, one frame per layer
 * (lrmoe_weights_load): read by lrmoe-exec, the in-process executor and
 * the planners' --weights, above the stream reader. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include "lrmoe.h"

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
