/* lrmoe-study: the launcher of the training study lrmoe.study (Python,
 * lib/python/lrmoe/study.py). It finds the package and liblrmoe.so.2 of
 * the build tree when run from one (bin/ next to lib/python and build/),
 * else uses the installed ones, then execs the interpreter. The options,
 * --help and --version are the module's (lrmoe-study(1)). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TOOL "lrmoe-study"

/* torch is imported before the package so that PyTorch's own NCCL is
 * loaded first when liblrmoe was built with the CUDA backend (which links
 * the toolkit's libnccl; loaded the other way round, libtorch_cuda fails
 * on an undefined NCCL symbol); a missing torch is the module's error to
 * report, a package or library that does not load is one line here */
static const char BOOT[] =
    "import runpy, sys\n"
    "try:\n"
    "    import torch\n"
    "except ImportError:\n"
    "    pass\n"
    "sys.argv[0] = '" TOOL "'\n"
    "try:\n"
    "    import lrmoe\n"
    "except Exception as e:\n"
    "    sys.stderr.write('" TOOL ": %s\\n' % e)\n"
    "    sys.exit(1)\n"
    "runpy.run_module('lrmoe.study', run_name='__main__', alter_sys=True)\n";

static int exists(const char *dir, const char *rel, char *out, size_t n)
{
    int w = snprintf(out, n, "%s/%s", dir, rel);
    return w > 0 && (size_t)w < n && access(out, R_OK) == 0;
}

/* The build tree above the executable (TOP/bin/lrmoe-study), if any:
 * PYTHONPATH gets TOP/lib/python in front, LRMOE_LIBRARY (unless set)
 * TOP/$BUILD/liblrmoe.so.2 (BUILD: the environment's, else build). */
static void use_build_tree(void)
{
    char exe[PATH_MAX], top[PATH_MAX], py[PATH_MAX + 32], so[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return;
    exe[n] = 0;
    char *s = strrchr(exe, '/');
    if (!s)
        return;
    *s = 0; /* .../bin */
    s = strrchr(exe, '/');
    if (!s || strcmp(s, "/bin"))
        return;
    *s = 0;
    snprintf(top, sizeof top, "%s", exe[0] ? exe : "/");
    if (!exists(top, "lib/python/lrmoe/study.py", py, sizeof py))
        return;
    snprintf(py, sizeof py, "%s/lib/python", top);
    const char *old = getenv("PYTHONPATH");
    if (old && *old) {
        size_t len = strlen(py) + strlen(old) + 2;
        char *v = malloc(len);
        if (!v)
            return;
        snprintf(v, len, "%s:%s", py, old);
        setenv("PYTHONPATH", v, 1);
        free(v);
    } else {
        setenv("PYTHONPATH", py, 1);
    }
    const char *build = getenv("BUILD");
    char rel[PATH_MAX];
    snprintf(rel, sizeof rel, "%s/liblrmoe.so.2", build && *build ? build : "build");
    if (!getenv("LRMOE_LIBRARY") && exists(top, rel, so, sizeof so))
        setenv("LRMOE_LIBRARY", so, 1);
}

int main(int argc, char **argv)
{
    use_build_tree();
    const char *python = getenv("LRMOE_PYTHON");
    if (!python || !*python)
        python = "python3";
    char **av = calloc((size_t)argc + 4, sizeof *av);
    if (!av) {
        fprintf(stderr, TOOL ": out of memory\n");
        return 1;
    }
    int k = 0;
    av[k++] = (char *)python;
    av[k++] = "-c";
    av[k++] = (char *)BOOT;
    for (int i = 1; i < argc; i++)
        av[k++] = argv[i];
    av[k] = NULL;
    execvp(python, av);
    fprintf(stderr, TOOL ": %s: %s (set LRMOE_PYTHON to the interpreter with lrmoe, "
            "torch and transformers)\n", python, strerror(errno));
    free(av);
    return 1;
}
