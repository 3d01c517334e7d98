/* api_exec: lrmoe-exec's work on one frame behind an opaque handle
 * (lrmoe_exec_new, api.h): options set by the long names of lrmoe-exec(1),
 * so that no caller depends on the layout of lrmoe_exec_frame_opts_t or of
 * lrmoe_exec_ctx_t, whose internal state already cost one soname. */
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "options.h"
#include "exec_frame.h"
#include "gemm_cpu.h"

struct lrmoe_exec {
    lrmoe_exec_frame_opts_t o;
    lrmoe_exec_ctx_t c;
    int live;          /* c was initialised from o (a run happened) */
    char *weights;     /* the weights stream's path (owned) */
    int mode_set;
};

lrmoe_exec_t *lrmoe_exec_new(void)
{
    lrmoe_exec_t *x = calloc(1, sizeof *x);
    if (!x) {
        lrmoe_err("out of memory");
        return NULL;
    }
    lrmoe_exec_frame_opts_default(&x->o);
    return x;
}

/* options change what the context caches (weights, packed F32 copies):
 * the next run starts a fresh one */
static void drop_ctx(lrmoe_exec_t *x)
{
    if (x->live) lrmoe_exec_ctx_free(&x->c);
    x->live = 0;
}

void lrmoe_exec_free(lrmoe_exec_t *x)
{
    if (!x) return;
    drop_ctx(x);
    free(x->weights);
    free(x);
}

int lrmoe_exec_set(lrmoe_exec_t *x, const char *name, const char *value)
{
    static const char *const names[] = {"phase", "mode", "weights", "backend", "compute",
                                        "ranks", "threads", "rank-threads", "gpus", "device",
                                        "gemm", "gemm-streams", "repeat", "warmup", "clock",
                                        "allow-nonfinite!", NULL};
    if (!x) return lrmoe_err("exec: no handle");
    if (lrmoe_parse_opt_name("exec", names, name, value) < 0) return -1;
    const int flag = !strcmp(name, "allow-nonfinite");
    lrmoe_exec_frame_opts_t o = x->o;
    int rc = 0;
    if (!strcmp(name, "phase")) {
        if (strcmp(value, "forward") && strcmp(value, "backward"))
            return lrmoe_err("phase: '%s' is not forward or backward", value);
        o.backward = !strcmp(value, "backward");
    } else if (!strcmp(name, "mode")) {
        rc = lrmoe_exec_mode_parse(value, &o.mode);
        if (!rc) x->mode_set = 1;
    } else if (!strcmp(name, "backend")) {
        rc = lrmoe_backend_parse(value, &o.cfg.backend);
    } else if (!strcmp(name, "compute")) {
        lrmoe_compute_t cm;
        rc = lrmoe_compute_parse(value, &cm) < 0 ? lrmoe_err_prefix("compute") : 0;
        if (!rc) o.cfg.compute = (int)cm;
    } else if (!strcmp(name, "ranks")) {
        rc = lrmoe_parse_int("ranks", value, 1, 4096, &o.ranks);
    } else if (!strcmp(name, "threads")) {
        rc = lrmoe_parse_int("threads", value, 0, 4096, &o.cfg.threads);
    } else if (!strcmp(name, "rank-threads")) {
        rc = lrmoe_parse_int("rank-threads", value, 1, 4096, &o.cfg.rank_threads);
    } else if (!strcmp(name, "gpus")) {
        rc = lrmoe_parse_int("gpus", value, 0, 4096, &o.cfg.gpus);
    } else if (!strcmp(name, "device")) {
        rc = lrmoe_parse_int("device", value, 0, 4096, &o.cfg.device);
    } else if (!strcmp(name, "gemm")) {
        lrmoe_exec_gemm_t g;
        rc = lrmoe_exec_gemm_parse(value, &g) < 0 ? lrmoe_err_prefix("gemm") : 0;
        if (!rc) o.cfg.gemm = (int)g;
    } else if (!strcmp(name, "gemm-streams")) {
        rc = lrmoe_parse_int("gemm-streams", value, 1, 8, &o.cfg.gemm_streams);
    } else if (!strcmp(name, "repeat")) {
        rc = lrmoe_parse_int("repeat", value, 1, 1000, &o.repeat);
    } else if (!strcmp(name, "warmup")) {
        rc = lrmoe_parse_int("warmup", value, 0, 1000, &o.warmup);
    } else if (!strcmp(name, "clock")) {
        if (!strcmp(value, "cpu")) o.cfg.cpu_clock = 1;
        else if (!strcmp(value, "wall")) o.cfg.cpu_clock = 0;
        else rc = lrmoe_err("clock: '%s' is not wall or cpu", value);
    } else if (flag) {
        o.cfg.allow_nonfinite = 1;
    } else if (!strcmp(name, "weights")) {
        char *w = strdup(value);
        if (!w) return lrmoe_err("out of memory");
        drop_ctx(x);
        free(x->weights);
        x->weights = w;
        return 0;
    }
    if (rc < 0) return -1;
    drop_ctx(x);
    x->o = o;
    return 0;
}

int lrmoe_exec_run(lrmoe_exec_t *x, lrmoe_frame_t *f)
{
    if (!x || !f) return lrmoe_err("exec: no handle or no frame");
    if (x->mode_set && !x->o.backward)
        return lrmoe_err("mode: only the backward phase has modes (set phase backward)");
    if (!x->weights) return lrmoe_err("exec: no weights (set \"weights\" to a weights stream)");
    if (!x->live) {
        lrmoe_exec_ctx_init(&x->c, &x->o);
        lrmoe_exec_ctx_weights_file(&x->c, x->weights);
        x->live = 1;
    }
    return lrmoe_exec_frame(&x->c, f);
}
