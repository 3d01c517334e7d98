/* The by-name options of the in-process handles (api.h), lib/parse.c; not
 * installed. */
#ifndef LRMOE_OPTIONS_H
#define LRMOE_OPTIONS_H

/* A by-name option of an in-process handle (api.h) whose options are
 * names (NULL-terminated; a trailing '!' marks a flag): 0 when name is one
 * of them with a value (a flag: none); else -1, an unknown name named with
 * the list of lrmoe-STAGE(1)'s names. */
int lrmoe_parse_opt_name(const char *stage, const char *const *names, const char *name,
                         const char *value);

#endif
