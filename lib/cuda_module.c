/* liblrmoe.so.1's loader of the CUDA module liblrmoe-cuda.so.1
 * (kernels/cuda_module.h): the CUDA entry points of liblrmoe are
 * trampolines that load the module once, on first use, and call through
 * its table. A module that does not load is one error, the same for every
 * call: "backend cuda: cannot load the CUDA module PATH: WHY".
 *
 * Compiled into liblrmoe.so.1 only (the Makefile defines LRMOE_CUDA_LOADER
 * for this object in a CUDA build, and leaves it out of liblrmoe.a, where
 * the kernels are linked in directly). */
#ifdef LRMOE_CUDA_LOADER
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../kernels/cuda_module.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static lrmoe_cuda_module_t mod;
static int loaded;          /* mod is filled */
static char failure[8192];  /* why it is not, for every caller */

#define HOST(ret, name, params, args) .name = name,
#define VHOST(name, params, args) .name = name,
static const lrmoe_cuda_host_t host = {
    .abi = LRMOE_CUDA_MODULE_ABI,
    .size = sizeof(lrmoe_cuda_host_t),
    LRMOE_CUDA_HOST_FUNCS(HOST)
    LRMOE_CUDA_HOST_VOIDS(VHOST)
    .err = lrmoe_err,
    .err_prefix = lrmoe_err_prefix,
};

/* The module's path into buf: $LRMOE_CUDA_MODULE, else the module's name in
 * the directory of the object this function is in (liblrmoe.so.1), else
 * the bare name (the dynamic loader's search). -1 when it does not fit. */
static int module_path(char *buf, size_t n)
{
    const char *env = getenv(LRMOE_CUDA_MODULE_ENV);
    Dl_info info;
    const char *slash;
    int w;
    if (env && *env)
        w = snprintf(buf, n, "%s", env);
    else if (dladdr((void *)module_path, &info) && info.dli_fname &&
             (slash = strrchr(info.dli_fname, '/')))
        w = snprintf(buf, n, "%.*s/%s", (int)(slash - info.dli_fname), info.dli_fname,
                     LRMOE_CUDA_MODULE_NAME);
    else
        w = snprintf(buf, n, "%s", LRMOE_CUDA_MODULE_NAME);
    return w < 0 || (size_t)w >= n ? -1 : 0;
}

#define FAIL(...) snprintf(failure, sizeof failure, "backend cuda: " __VA_ARGS__)

static void load(void)
{
    char path[4096];
    if (module_path(path, sizeof path) < 0) {
        FAIL("the CUDA module's path (%s or next to liblrmoe.so.1) is longer than %zu bytes",
             LRMOE_CUDA_MODULE_ENV, sizeof path - 1);
        return;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        size_t n = strlen(path);
        if (!why) why = "unknown dlopen error";
        else if (!strncmp(why, path, n) && !strncmp(why + n, ": ", 2)) why += n + 2;
        const char *env = getenv(LRMOE_CUDA_MODULE_ENV);
        FAIL("cannot load the CUDA module %s: %s (%s)", path, why,
             env && *env ? "the path " LRMOE_CUDA_MODULE_ENV " names"
                         : "set " LRMOE_CUDA_MODULE_ENV " to its path");
        return;
    }
    lrmoe_cuda_module_init_fn *init;
    *(void **)&init = dlsym(h, LRMOE_CUDA_MODULE_INIT);
    if (!init) {
        FAIL("cannot load the CUDA module %s: it has no %s (not an lrmoe CUDA module)", path,
             LRMOE_CUDA_MODULE_INIT);
        dlclose(h);
        return;
    }
    memset(&mod, 0, sizeof mod);
    int rc = init(&host, &mod);
    if (mod.abi != LRMOE_CUDA_MODULE_ABI || mod.size != sizeof mod) {
        FAIL("cannot load the CUDA module %s: it was built for another liblrmoe (module "
             "interface %d, this library's %d)", path, mod.abi, LRMOE_CUDA_MODULE_ABI);
        dlclose(h);
        return;
    }
    if (rc < 0) {
        FAIL("cannot load the CUDA module %s: %s", path, lrmoe_errmsg());
        dlclose(h);
        return;
    }
    loaded = 1; /* never closed: its functions and objects live as long as the process */
}

static int ready(void)
{
    pthread_once(&once, load);
    return loaded ? 0 : lrmoe_err("%s", failure);
}

#define TRAMPOLINE(ret, name, params, args) \
    ret name params { if (ready() < 0) return -1; return mod.name args; }
#define VTRAMPOLINE(name, params, args) \
    void name params { if (ready() == 0) mod.name args; }
LRMOE_CUDA_MODULE_FUNCS(TRAMPOLINE)
LRMOE_CUDA_MODULE_VOIDS(VTRAMPOLINE)
#else
/* ISO C forbids an empty translation unit. */
typedef int lrmoe_cuda_loader_unused;
#endif
