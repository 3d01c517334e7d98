/* Strict number parsing for option values (lib/parse.c): not installed
 * (lrmoe_parse_bytes, the one a caller may want, is in lrmoe.h). Every call
 * returns 0, or -1 with an error naming opt. */
#ifndef LRMOE_PARSE_H
#define LRMOE_PARSE_H

#include <stdint.h>

int lrmoe_parse_i64(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);
int lrmoe_parse_f64(const char *opt, const char *s, double lo, double hi, double *out);
/* "N" or "A-B" (inclusive, A <= B), non-negative: frame selections. */
int lrmoe_parse_range(const char *opt, const char *s, int64_t *lo, int64_t *hi);

#endif
