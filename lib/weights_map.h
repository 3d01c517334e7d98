/* A raw (uncompressed) weights stream in a regular file, mapped instead of
 * read: its layer frames' tensors point into the read-only mapping, so a
 * process faults in only the experts it multiplies, from the page cache,
 * with no copy and no page zeroing (lrmoe-exec(1), PERFORMANCE). */
#ifndef LRMOE_WEIGHTS_MAP_H
#define LRMOE_WEIGHTS_MAP_H

#include <stddef.h>
#include "lrmoe.h"

typedef struct {
    void *base;      /* the mapping, NULL when none */
    size_t len;
} lrmoe_wmap_t;

/* 1: PATH was mapped and *w holds its layer frames (their tensor data
 * borrowed from *m); 0: not mappable (a pipe, "-", zstd, a misaligned tensor,
 * anything the mapping parser does not accept exactly): *w and *m are empty
 * and the caller reads the stream with lrmoe_weights_load, which reports
 * what is wrong with it. Never -1. */
int lrmoe_weights_map(const char *path, lrmoe_weights_t *w, lrmoe_wmap_t *m);
/* Frees w's frames without freeing the borrowed data, then unmaps. */
void lrmoe_weights_unmap(lrmoe_weights_t *w, lrmoe_wmap_t *m);

#endif
