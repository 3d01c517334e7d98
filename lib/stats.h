/* Tensor statistics for lrmoe-view: min, max, mean, std, NaN and Inf counts.
 *
 * Values are converted to double in fixed-size chunks (no second full copy of
 * a large tensor). min/max/mean/std are taken over the finite values only;
 * std is the population standard deviation (ddof = 0, NumPy's default),
 * accumulated with Chan et al.'s pairwise update of (count, mean, M2) per
 * chunk. Integer tensors also keep their exact min/max. */
#ifndef LRMOE_STATS_H
#define LRMOE_STATS_H

#include <stddef.h>
#include <stdint.h>
#include "lrmoe.h"

typedef struct {
    lrmoe_dtype_t dtype;
    int64_t count;            /* values seen (all of them) */
    int64_t finite;           /* finite values (the ones min..std describe) */
    int64_t nan, posinf, neginf;
    double min, max, mean, std; /* NaN when finite == 0 */
    double m2;                /* running sum of squared deviations */
    int is_int;               /* integer dtype: exact extrema below */
    int64_t imin, imax;       /* signed (and BOOL, U8..U32) */
    uint64_t umin, umax;      /* U64 */
} lrmoe_stats_t;

void lrmoe_stats_init(lrmoe_stats_t *s, lrmoe_dtype_t d);
/* Add n elements of data (dtype given at init). */
void lrmoe_stats_add(lrmoe_stats_t *s, const void *data, size_t n);
/* Finish: fills std. */
void lrmoe_stats_finish(lrmoe_stats_t *s);
/* All of the above for one tensor. */
void lrmoe_stats_tensor(const lrmoe_tensor_t *t, lrmoe_stats_t *s);

/* Element i of data (dtype d) as the shortest decimal text that converts back
 * to the same value in that dtype ("nan", "inf", "-inf" for non-finite
 * values; integers exactly). Returns buf. */
const char *lrmoe_stats_value_str(lrmoe_dtype_t d, const void *data, size_t i,
                                  char *buf, size_t len);
/* min or max (which 0/1) of s as text: exact for integers, shortest
 * round-trip for floats in the tensor's dtype; "-" when there is none. */
const char *lrmoe_stats_extreme_str(const lrmoe_stats_t *s, int which,
                                    char *buf, size_t len);

#endif
