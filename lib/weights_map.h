/* A raw (uncompressed) weights stream in a regular file, mapped instead of
 * read: its layer frames' tensors point into the read-only mapping, so a
 * process faults in only the experts it multiplies, from the page cache,
 * with no copy and no page zeroing (lrmoe-exec(1), PERFORMANCE). */
#ifndef LRMOE_WEIGHTS_MAP_H
#define LRMOE_WEIGHTS_MAP_H

#include <stddef.h>
#include "crc64_par.h"
#include "lrmoe.h"

typedef struct {
    void *base;      /* the mapping, NULL when none */
    size_t len;
} lrmoe_wmap_t;

/* 1: PATH was mapped and *w holds its layer frames (their tensor data
 * borrowed from *m); 0: not mappable (a pipe, "-", zstd, a misaligned tensor,
 * anything the mapping parser does not accept exactly, a digest that does
 * not match): *w and *m are empty and the caller reads the stream with
 * lrmoe_weights_load, which reports what is wrong with it. Never -1.
 * Each frame's CRC-64 record is checked on up to `threads` threads
 * (lrmoe_crc64_par: <= 0, the CPUs this process may run on; at most 64),
 * a piece of at least LRMOE_WMAP_PIECE bytes each; an XXH64 record (one
 * sequential hash) on one. */
#define LRMOE_WMAP_PIECE LRMOE_CRC64_PIECE
int lrmoe_weights_map(const char *path, lrmoe_weights_t *w, lrmoe_wmap_t *m, int threads);
/* The same with pieces of at least `piece` bytes (tests: many pieces on
 * small files). */
int lrmoe_weights_map_pieces(const char *path, lrmoe_weights_t *w, lrmoe_wmap_t *m, int threads,
                             size_t piece);
/* Frees w's frames without freeing the borrowed data, then unmaps. */
void lrmoe_weights_unmap(lrmoe_weights_t *w, lrmoe_wmap_t *m);

#endif
