/* Built by tests/lib.bats against the INSTALLED liblrmoe (pkg-config lrmoe):
 * asks for the CUDA backend twice (lrmoe_exec_forward, backend
 * LRMOE_BACKEND_CUDA, arguments left empty: whatever the module answers,
 * the device count or the input checks, shows it was reached), printing
 * "call N: MESSAGE" (or "call N: ok"), then every mapped file of the
 * process whose name is the CUDA module's or a CUDA library's, one
 * "mapped: PATH" line each, before the first call and after the last.
 *   cuda_inproc */
#include <stdio.h>
#include <string.h>

#include <lrmoe/exec.h>
#include <lrmoe/lrmoe.h>

static void mapped(const char *when)
{
    static const char *names[] = {"liblrmoe-cuda.so", "libcudart.so", "libcublas", "libnccl.so"};
    char line[4096], seen[64][512];
    int n = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        char *p = strchr(line, '/'), *base;
        if (!p) continue;
        p[strcspn(p, "\n")] = 0;
        base = strrchr(p, '/') + 1;
        int hit = 0, dup = 0;
        for (size_t i = 0; i < sizeof names / sizeof *names; i++) hit |= !!strstr(base, names[i]);
        for (int i = 0; i < n; i++) dup |= !strcmp(seen[i], p);
        if (!hit || dup || n == 64) continue;
        snprintf(seen[n++], sizeof seen[0], "%s", p);
        printf("mapped %s: %s\n", when, p);
    }
    fclose(f);
}

int main(void)
{
    lrmoe_exec_cfg_t cfg;
    lrmoe_exec_dims_t d = {0};
    lrmoe_exec_weights_t w = {0};
    lrmoe_exec_fwd_t a = {0};
    lrmoe_exec_cfg_default(&cfg);
    cfg.backend = LRMOE_BACKEND_CUDA;
    d.T = 4; d.E = 2; d.K = 1; d.D = 2; d.F = 2; d.P = 1;
    mapped("before");
    for (int i = 1; i <= 2; i++) {
        int rc = lrmoe_exec_forward(&cfg, &d, &w, NULL, &a, NULL);
        printf("call %d: %s\n", i, rc < 0 ? lrmoe_errmsg() : "ok");
    }
    mapped("after");
    return 0;
}
