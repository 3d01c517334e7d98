/* The by-name options of the in-process handles (api.h), lib/parse.c; not
 * installed. */
#ifndef LRMOE_OPTIONS_H
#define LRMOE_OPTIONS_H

#include <stdint.h>

/* A by-name option of an in-process handle (api.h) whose options are
 * names (NULL-terminated; a trailing '!' marks a flag): 0 when name is one
 * of them with a value (a flag: none); else -1, an unknown name named with
 * the list of lrmoe-STAGE(1)'s names. */
int lrmoe_parse_opt_name(const char *stage, const char *const *names, const char *name,
                         const char *value);
/* lrmoe_parse_i64 into an int (lo and hi within int's range): a handle's
 * integer option, named in the message. */
int lrmoe_parse_int(const char *name, const char *s, int64_t lo, int64_t hi, int *out);

#endif
