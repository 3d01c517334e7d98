/* diff: compare two frames tensor by tensor and attribute by attribute
 * (lrmoe-view --diff). No printing: differences go to a callback.
 *
 * Two elements a (of A) and b (of B, the reference) are the same when
 * a == b (so -0 == +0), both are NaN, or |a - b| <= atol + rtol * |b|.
 * Integers are compared exactly (as i64; U64 as u64); floats as doubles.
 * max_abs is max |a - b| and max_rel max |a - b| / |b| (inf where b is 0
 * and a is not) over the pairs that differ and are not NaN; a NaN on one
 * side only differs and is counted in nan_only. */
#ifndef LRMOE_DIFF_H
#define LRMOE_DIFF_H

#include <stdint.h>
#include "lrmoe.h"

typedef struct {
    int64_t n;          /* elements compared */
    int64_t ndiff;      /* elements that differ */
    int64_t nan_only;   /* of those, NaN on one side only */
    int64_t first;      /* flat (row-major) index of the first that differs; -1 none */
    double max_abs, max_rel;
} lrmoe_diff_t;

/* Element-wise comparison of a and b, which must hold the same number of
 * elements (dtypes may differ: values are compared as numbers). 0, or -1
 * with an error when the element counts differ. */
int lrmoe_diff_tensor(const lrmoe_tensor_t *a, const lrmoe_tensor_t *b, double atol, double rtol,
                      lrmoe_diff_t *d);

/* Two attribute values: 1 the same, 0 different. Values that both read
 * whole as decimal numbers are compared as numbers, with the rule above
 * (integers that fit int64 exactly, so "1" is "1.000000" and "1e3" is
 * "1000"); anything else as text. */
int lrmoe_diff_attr(const char *a, const char *b, double atol, double rtol);

typedef enum {
    LRMOE_DIFF_ATTR_ONLY_A, LRMOE_DIFF_ATTR_ONLY_B, LRMOE_DIFF_ATTR_VALUE,
    LRMOE_DIFF_TENSOR_ONLY_A, LRMOE_DIFF_TENSOR_ONLY_B,
    LRMOE_DIFF_SHAPE,   /* shapes differ: values not compared */
    LRMOE_DIFF_DTYPE,   /* dtypes differ (d: the values compared as numbers) */
    LRMOE_DIFF_VALUES   /* same dtype and shape, some values differ */
} lrmoe_diff_kind_t;

typedef struct {
    lrmoe_diff_kind_t kind;
    const char *name;            /* attribute key or tensor name */
    const char *va, *vb;         /* attributes: the values (NULL when absent) */
    const lrmoe_tensor_t *ta, *tb; /* tensors (NULL when absent) */
    const lrmoe_diff_t *d;       /* DTYPE and VALUES */
} lrmoe_diff_item_t;

typedef int (*lrmoe_diff_fn)(const lrmoe_diff_item_t *it, void *ctx);

/* Walk A's attributes, then B's that A lacks, then A's tensors and B's
 * that A lacks (each in frame order), calling fn for every difference (a
 * negative return stops the walk with it). O(n log n) in the names.
 * Returns the number of differences, or -1. */
int64_t lrmoe_diff_frames(const lrmoe_frame_t *a, const lrmoe_frame_t *b, double atol, double rtol,
                          lrmoe_diff_fn fn, void *ctx);

#endif
