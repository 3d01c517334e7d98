/* A raw (uncompressed) weights stream in a regular file, mapped instead of
 * read: its layer frames' tensors point into the read-only mapping, so a
 * process reads only the layers it uses (each whole, for its digest
 * record), from the page cache, with no copy and no page zeroing
 * (lrmoe-exec(1), PERFORMANCE). */
#ifndef LRMOE_WEIGHTS_MAP_H
#define LRMOE_WEIGHTS_MAP_H

#include <stddef.h>
#include <stdint.h>
#include "crc64_par.h"
#include "lrmoe.h"

/* A frame's digest record, checked the first time the frame is used:
 * whole (kinds 1 and 2), or by parts (3: the header and each tensor, each
 * the first time it is used). */
typedef struct {
    size_t off, len;     /* the bytes it covers: the frame (header length, header, data) */
    uint64_t digest, got; /* the record's; the frame's, once checked (kinds 1, 2) */
    unsigned char kind;  /* 0 none, 1 CRC-64, 2 XXH64, 3 CRC-64 by parts */
    unsigned char state; /* 0 unchecked, 1 matches, 2 does not (kind 3: every part) */
    unsigned char hstate; /* kind 3, the header's: 0, 1, 2 as state */
    size_t hlen;         /* kind 3: the header's bytes (its length and JSON) */
    uint64_t hwant, hgot; /* kind 3: the header's CRC in the record, computed */
    int nt;              /* the frame's tensors, in data order (kinds 1, 2: the
                            non-empty ones): */
    size_t *toff, *tlen; /* offset in the mapping, bytes */
    uint64_t *tcrc;      /* CRC-64 of each, once checked (kinds 1, 3) */
    uint64_t *twant;     /* kind 3: each one's CRC in the record */
    unsigned char *tstate; /* kind 3: each one's state, as state */
    const char **tname;  /* kind 3: each one's name (the frame's) */
} lrmoe_wmap_rec_t;

typedef struct {
    void *base;      /* the mapping, NULL when none */
    size_t len;
    int n;           /* frames, as in the lrmoe_weights_t mapped with it */
    lrmoe_wmap_rec_t *rec;
    int threads;     /* lrmoe_crc64_par's threads and piece for the checks */
    size_t piece;
    char *path;      /* for the checks' errors */
} lrmoe_wmap_t;

/* 1: PATH was mapped and *w holds its layer frames (their tensor data
 * borrowed from *m); 0: not mappable (a pipe, "-", zstd, a misaligned tensor,
 * anything the mapping parser does not accept exactly): *w and *m are empty
 * and the caller reads the stream with lrmoe_weights_load, which reports
 * what is wrong with it. Never -1.
 * Only the frames' headers (and digest records) are read here: a frame's
 * data is read, and its digest record checked, when the frame is first
 * used, so that a process that uses one layer of a model's many reads
 * that layer alone (and where the record is by parts, one that uses a
 * layer's header or one tensor of it reads only those). Every caller
 * calls lrmoe_weights_map_check(m, i) before it reads anything of frame i
 * (its header's shapes included), in a stream without digest records too.
 * The CRC-64 records are checked on up to
 * `threads` threads (lrmoe_crc64_par: <= 0, the CPUs this process may run
 * on; at most 64), a piece of at least LRMOE_WMAP_PIECE bytes each; an XXH64
 * record (one sequential hash) on one. */
#define LRMOE_WMAP_PIECE LRMOE_CRC64_PIECE
int lrmoe_weights_map(const char *path, lrmoe_weights_t *w, lrmoe_wmap_t *m, int threads);
/* The same with pieces of at least `piece` bytes (tests: many pieces on
 * small files). */
int lrmoe_weights_map_pieces(const char *path, lrmoe_weights_t *w, lrmoe_wmap_t *m, int threads,
                             size_t piece);
/* Frame i's first use: its digest record checked once (later calls
 * answer the first call's verdict without reading the frame again), and
 * its bytes read ahead from then on as a file's usually are (the mapping's
 * other bytes are not: MADV_RANDOM). 0 when the record matches or the
 * stream has none (or m maps nothing), else -1 with the error the stream
 * reader gives, "PATH: frame I: digest mismatch: ...". */
int lrmoe_weights_map_check(const lrmoe_wmap_t *m, int i);
/* The same for the parts of frame i that a caller reads: its header (the
 * shapes) and the tensors named (nn of them; a name the frame lacks is
 * skipped). Where the record is by parts (written for frames of 64 MiB of
 * data or more, lrmoe-stream(5)) only those are read and checked, each
 * once, and a mismatch names the part: "PATH: frame I: tensor NAME: digest
 * mismatch: its CRC-64 is ..., the digest record says ..." ("header" for
 * the header); other records are checked whole, as lrmoe_weights_map_check. */
int lrmoe_weights_map_check_tensors(const lrmoe_wmap_t *m, int i, const char *const *names,
                                    int nn);
/* 1 with *crc the CRC-64 of the n bytes at p when they are exactly one
 * tensor's data in a frame of m whose CRC-64 record matched (the check
 * hashes a frame a tensor at a time and keeps each tensor's CRC, so that
 * a digest of tensors needs no second pass: lib/exec_mpi.c), else 0. */
int lrmoe_weights_map_crc(const lrmoe_wmap_t *m, const void *p, size_t n, uint64_t *crc);
/* Frees w's frames without freeing the borrowed data, then unmaps. */
void lrmoe_weights_unmap(lrmoe_weights_t *w, lrmoe_wmap_t *m);

/* A process's weights stream, as every tool and handle opens it: PATH
 * mapped where it can be (lrmoe_weights_map), else read whole and checked
 * (lrmoe_weights_load; m then maps nothing). 0, or -1 with the reader's
 * error. */
int lrmoe_weights_open(const char *path, lrmoe_weights_t *w, lrmoe_wmap_t *m, int threads);
/* lrmoe_weights_unmap or lrmoe_weights_free, as opened; w and m empty. */
void lrmoe_weights_close(lrmoe_weights_t *w, lrmoe_wmap_t *m);
/* Before anything of frame wf (one of w's) is read: lrmoe_weights_map_check
 * of its index when w is mapped by m (m NULL or mapping nothing: 0). */
int lrmoe_weights_use(const lrmoe_wmap_t *m, const lrmoe_weights_t *w, const lrmoe_frame_t *wf);
/* The same for wf's header and the tensors named only
 * (lrmoe_weights_map_check_tensors): nn 0 for a caller that reads the
 * shapes alone. */
int lrmoe_weights_use_tensors(const lrmoe_wmap_t *m, const lrmoe_weights_t *w,
                              const lrmoe_frame_t *wf, const char *const *names, int nn);

#endif
