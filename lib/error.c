/* Thread-local error message: the library reports, the tools print. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "lrmoe.h"

static _Thread_local char errbuf[1024];

int lrmoe_err(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, sizeof errbuf, fmt, ap);
    va_end(ap);
    return -1;
}

int lrmoe_err_prefix(const char *fmt, ...)
{
    char old[sizeof errbuf], pre[512];
    memcpy(old, errbuf, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    snprintf(errbuf, sizeof errbuf, "%s: %s", pre, old);
    return -1;
}

const char *lrmoe_errmsg(void)
{
    return errbuf[0] ? errbuf : "unknown error";
}
