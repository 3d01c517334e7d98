/* stream_internal: what the stream reader offers benchmarks beside the
 * public calls of lrmoe.h. Internal to liblrmoe (lib/stream.c). */
#ifndef LRMOE_STREAM_INTERNAL_H
#define LRMOE_STREAM_INTERNAL_H

#include "lrmoe.h"

/* on = 0: the reader as it was before digest records (lrmoe-stream(5),
 * Integrity), on the same bytes: records are read and skipped, frames are
 * neither hashed nor compared, and a zstd frame's content checksum is
 * checked by zstd again (a record makes the reader skip it). What the
 * per-frame check costs is the difference (tests/bench/stream_digest.sh).
 * on < 0: no check at all, zstd's checksum skipped too where a record
 * starts its frame (what the hash itself costs in zstd). on > 0: a
 * reader's default. Never in a tool: a reader checks. */
void lrmoe_reader_set_verify(lrmoe_reader_t *r, int on);

#endif
