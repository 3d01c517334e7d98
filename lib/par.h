/* Contiguous-range parallel loops for the library's embarrassingly parallel
 * passes (score, pack): [0,n) is cut into one chunk per thread, in order;
 * chunk i runs on thread i (chunk 0 on the caller). Results are the same as
 * a single call over [0,n) whenever fn(lo,hi) writes only its own range's
 * outputs. Nothing here prints or exits. */
#ifndef LRMOE_PAR_H
#define LRMOE_PAR_H

#include <stdint.h>

/* fn(ctx, lo, hi): 0, or -1 with lrmoe_err set. */
typedef int (*lrmoe_range_fn)(void *ctx, int64_t lo, int64_t hi);

/* Run fn over [0,n) on up to `threads` threads (<= 1: one call here; never
 * more chunks than n / min_chunk, at least one). Returns 0, or -1 with the
 * error of the lowest failing chunk (the one a single call would report). */
int lrmoe_parallel_ranges(int64_t n, int threads, int64_t min_chunk, lrmoe_range_fn fn,
                          void *ctx);

/* threads when > 0, else the CPUs this process may run on
 * (sched_getaffinity: under mpirun's core binding, the rank's), at least 1:
 * what a -@ of 0 ("the libraries' own defaults") means for lrmoe's own
 * parallel passes. */
int lrmoe_parallel_cpus(int threads);

#endif
