/* liblrmoe-cuda.so.1's C part (lib/cuda_module.h): its entry point, and
 * liblrmoe's functions that the kernels call, forwarded to the liblrmoe that
 * loaded the module. The error message is liblrmoe's thread-local one, so
 * lrmoe_errmsg() after a failed CUDA call reads what the kernels reported.
 * Only this object and the kernels/ objects make the module; liblrmoe.a links the
 * kernels against the library's own functions and has none of this. */
#include <stdarg.h>
#include <stdio.h>
#include "cuda_module.h"
#include "kcu.h"

static const lrmoe_cuda_host_t *host;

int lrmoe_cuda_module_init(const lrmoe_cuda_host_t *h, lrmoe_cuda_module_t *m)
{
    m->abi = LRMOE_CUDA_MODULE_ABI;
    m->size = sizeof *m;
    if (h->abi != LRMOE_CUDA_MODULE_ABI) return -1;
    if (h->size != sizeof *h)
        return h->err("liblrmoe's CUDA module table is %zu bytes, the module's %zu",
                      h->size, sizeof *h);
    host = h;
#define FILL(ret, name, params, args) m->name = name;
#define VFILL(name, params, args) m->name = name;
    LRMOE_CUDA_MODULE_FUNCS(FILL)
    LRMOE_CUDA_MODULE_VOIDS(VFILL)
    return 0;
}

#define FORWARD(ret, name, params, args) ret name params { return host->name args; }
#define VFORWARD(name, params, args) void name params { host->name args; }
LRMOE_CUDA_HOST_FUNCS(FORWARD)
LRMOE_CUDA_HOST_VOIDS(VFORWARD)

int lrmoe_err(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return host->err("%s", msg);
}

int lrmoe_err_prefix(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return host->err_prefix("%s", msg);
}
