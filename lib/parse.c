/* Number, size and range parsers for options and option strings
 * (lrmoe_parse_*): used by the tools and by the in-process planner's
 * option-by-name setter alike, so they sit at the bottom with error.c. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lrmoe.h"
#include "options.h"
#include "parse.h"

int lrmoe_parse_i64(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end)
        return lrmoe_err("%s: '%s' is not an integer", opt, s);
    if (v < lo || v > hi)
        return lrmoe_err("%s: %lld is out of range [%" PRId64 ", %" PRId64 "]", opt, v, lo, hi);
    *out = v;
    return 0;
}

int lrmoe_parse_f64(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno == ERANGE || end == s || *end || isnan(v))
        return lrmoe_err("%s: '%s' is not a number", opt, s);
    if (v < lo || v > hi)
        return lrmoe_err("%s: %g is out of range [%g, %g]", opt, v, lo, hi);
    *out = v;
    return 0;
}

int lrmoe_parse_bytes(const char *opt, const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v))
        return lrmoe_err("%s: '%s' is not a size (e.g. 16GiB, 512M, 1.5g, 100e9)", opt, s);
    const char *u = end;
    while (*u == ' ')
        u++;
    double mul = 1;
    if (*u) {
        /* K, M, G, T, P, any case: alone or with iB powers of 1024, with B
         * powers of 1000; B alone: bytes */
        static const char letters[] = "kmgtp";
        const char *l = strchr(letters, tolower((unsigned char)*u));
        const char *rest = l ? u + 1 : u;
        int n = l ? (int)(l - letters) + 1 : 0;
        double base = 1024;
        if (tolower((unsigned char)rest[0]) == 'i' && tolower((unsigned char)rest[1]) == 'b' &&
            !rest[2] && n)
            base = 1024;
        else if (tolower((unsigned char)rest[0]) == 'b' && !rest[1])
            base = 1000;
        else if (rest[0] || !n)
            return lrmoe_err("%s: bad unit in '%s' (B, K, M, G, T, P: powers of 1024, also "
                             "KiB...; KB, MB, GB...: powers of 1000; any case)", opt, s);
        while (n--)
            mul *= base;
    }
    v *= mul;
    if (!(v >= 0) || v > 1e18)
        return lrmoe_err("%s: '%s' is negative or absurd", opt, s);
    *out = v;
    return 0;
}

int lrmoe_parse_range(const char *opt, const char *s, int64_t *lo, int64_t *hi)
{
    const char *dash = *s ? strchr(s + 1, '-') : NULL;
    if (!dash) {
        if (lrmoe_parse_i64(opt, s, 0, INT64_MAX, lo) < 0) return -1;
        *hi = *lo;
        return 0;
    }
    char first[64];
    snprintf(first, sizeof first, "%.*s", (int)(dash - s), s);
    if (lrmoe_parse_i64(opt, first, 0, INT64_MAX, lo) < 0) return -1;
    return lrmoe_parse_i64(opt, dash + 1, *lo, INT64_MAX, hi);
}

int lrmoe_parse_opt_name(const char *stage, const char *const *names, const char *name,
                         const char *value)
{
    if (!name) return lrmoe_err("%s: no option name", stage);
    for (const char *const *n = names; *n; n++) {
        size_t len = strlen(*n);
        int flag = (*n)[len - 1] == '!';
        if (strncmp(*n, name, len - flag) || name[len - flag]) continue;
        if (flag && value) return lrmoe_err("%s: %s takes no value", stage, name);
        if (!flag && !value) return lrmoe_err("%s: %s needs a value", stage, name);
        return 0;
    }
    char list[512];
    size_t k = 0;
    list[0] = 0;
    for (const char *const *n = names; *n && k < sizeof list; n++)
        k += (size_t)snprintf(list + k, sizeof list - k, "%s%.*s", k ? ", " : "",
                              (int)(strlen(*n) - ((*n)[strlen(*n) - 1] == '!')), *n);
    return lrmoe_err("%s: unknown option '%s' (the long options of lrmoe-%s(1)%s: %s)", stage,
                     name, stage, strcmp(stage, "pack") ? "" : " that pack a frame", list);
}

int lrmoe_parse_int(const char *name, const char *s, int64_t lo, int64_t hi, int *out)
{
    int64_t v;
    if (lrmoe_parse_i64(name, s, lo, hi, &v) < 0) return -1;
    *out = (int)v;
    return 0;
}
