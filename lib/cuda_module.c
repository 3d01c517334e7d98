/* liblrmoe.so.2's loader of the CUDA module liblrmoe-cuda.so.1
 * (lib/cuda_module.h): the CUDA entry points of liblrmoe are
 * trampolines that load the module once, on first use, and call through
 * its table. A module that does not load is one error, the same for every
 * call: "backend cuda: cannot load the CUDA module PATH: WHY".
 *
 * Compiled into liblrmoe.so.2 and the tools (the Makefile defines
 * LRMOE_CUDA_LOADER for this object in a CUDA build; the tools link
 * $(BUILD)/liblrmoe-tools.a, the .so's objects), so neither needs a CUDA
 * library until --backend cuda; left out of the installed liblrmoe.a, where
 * the kernels are linked in directly. */
#ifdef LRMOE_CUDA_LOADER
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cuda_module.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static lrmoe_cuda_module_t mod;
static int loaded;          /* mod is filled */
static char failure[16384]; /* why it is not, for every caller (two paths fit) */

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

/* The candidates, tried in this order, the first one that exists (or the
 * last one) the one opened:
 *   $LRMOE_CUDA_MODULE, when set and not empty: that path and nothing else;
 *   the module's name in the directory of the object this function is in
 *   (liblrmoe.so.2; for a tool linked with the loader, the executable);
 *   the name in each directory of the dynamic loader's search for that
 *   object, which for a tool starts with its run path ($ORIGIN/../lib of
 *   an installed tool, the build directory of an in-tree one), then
 *   LD_LIBRARY_PATH and the system's directories;
 *   the bare name, dlopen's own search (ld.so.cache) as the last resort.
 * next_to_self writes the second one into buf: 0, or -1 when there is none
 * (no directory known) or it does not fit in n bytes. */
static int next_to_self(char *buf, size_t n)
{
    Dl_info info;
    const char *slash;
    if (!dladdr((void *)next_to_self, &info) || !info.dli_fname ||
        !(slash = strrchr(info.dli_fname, '/')))
        return -1;
    int w = snprintf(buf, n, "%.*s/%s", (int)(slash - info.dli_fname), info.dli_fname,
                     LRMOE_CUDA_MODULE_NAME);
    return w < 0 || (size_t)w >= n ? -1 : 0;
}

/* The directories the dynamic loader searches for the libraries the object
 * holding this loader needs, in its order: its run path ($ORIGIN expanded),
 * LD_LIBRARY_PATH, the system's (dlinfo RTLD_DI_SERINFO; a glibc dlopen
 * handle is the object's link map). Searched here rather than left to
 * dlopen(bare name), which takes the run path of its caller, and under ASan
 * the caller is the sanitizer's dlopen interceptor. NULL when unknown;
 * the caller frees. */
static Dl_serinfo *search_dirs(void)
{
    Dl_info info;
    struct link_map *map = NULL;
    Dl_serinfo size;
    if (!dladdr1((void *)search_dirs, &info, (void **)&map, RTLD_DL_LINKMAP) || !map ||
        dlinfo(map, RTLD_DI_SERINFOSIZE, &size) != 0)
        return NULL;
    Dl_serinfo *si = malloc(size.dls_size);
    if (si && (dlinfo(map, RTLD_DI_SERINFOSIZE, si) != 0 || dlinfo(map, RTLD_DI_SERINFO, si) != 0)) {
        free(si);
        si = NULL;
    }
    return si;
}

/* path = the first DIR/liblrmoe-cuda.so.1 of the search directories that
 * exists: 0, else -1 */
static int on_search_path(char *path, size_t n)
{
    Dl_serinfo *si = search_dirs();
    int found = -1;
    for (unsigned i = 0; si && i < si->dls_cnt && found < 0; i++) {
        int w = snprintf(path, n, "%s/%s", si->dls_serpath[i].dls_name, LRMOE_CUDA_MODULE_NAME);
        if (w > 0 && (size_t)w < n && access(path, F_OK) == 0) found = 0;
    }
    free(si);
    return found;
}

#define FAIL(...) snprintf(failure, sizeof failure, "backend cuda: " __VA_ARGS__)

/* dlerror() without the "PATH: " it repeats */
static const char *dl_why(const char *path)
{
    const char *why = dlerror();
    size_t n = strlen(path);
    if (!why) return "unknown dlopen error";
    if (!strncmp(why, path, n) && !strncmp(why + n, ": ", 2)) why += n + 2;
    return why;
}

/* Opens the first candidate that exists; on failure writes the error,
 * naming what was tried, and returns NULL. *path gets what was opened. */
static void *open_module(char *path, size_t n)
{
    const char *env = getenv(LRMOE_CUDA_MODULE_ENV);
    void *h;
    if (env && *env) {
        if ((size_t)snprintf(path, n, "%s", env) >= n) {
            FAIL("the CUDA module's path in %s is longer than %zu bytes", LRMOE_CUDA_MODULE_ENV,
                 n - 1);
            return NULL;
        }
        if (!(h = dlopen(path, RTLD_NOW | RTLD_LOCAL)))
            FAIL("cannot load the CUDA module %s: %s (the path %s names)", path, dl_why(path),
                 LRMOE_CUDA_MODULE_ENV);
        return h;
    }
    char near[4096];
    int have_near = next_to_self(near, sizeof near) == 0;
    if (have_near && access(near, F_OK) == 0) {
        snprintf(path, n, "%s", near);
        if (!(h = dlopen(path, RTLD_NOW | RTLD_LOCAL)))
            FAIL("cannot load the CUDA module %s: %s (set %s to its path)", path, dl_why(path),
                 LRMOE_CUDA_MODULE_ENV);
        return h;
    }
    if (on_search_path(path, n) == 0) {
        if (!(h = dlopen(path, RTLD_NOW | RTLD_LOCAL)))
            FAIL("cannot load the CUDA module %s: %s (set %s to its path)", path, dl_why(path),
                 LRMOE_CUDA_MODULE_ENV);
        return h;
    }
    /* none there: the bare name (the loader's cache, its caller's run path) */
    snprintf(path, n, "%s", LRMOE_CUDA_MODULE_NAME);
    if (!(h = dlopen(path, RTLD_NOW | RTLD_LOCAL)))
        FAIL("cannot load the CUDA module%s%s%s by name %s (run path, LD_LIBRARY_PATH, system "
             "directories): %s (set %s to its path)", have_near ? ": not at " : "",
             have_near ? near : "", have_near ? ", and" : "", path, dl_why(path),
             LRMOE_CUDA_MODULE_ENV);
    return h;
}

static void load(void)
{
    char path[4096];
    void *h = open_module(path, sizeof path);
    if (!h) return;
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
