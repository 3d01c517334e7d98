/* Built by tests/lib.bats against the INSTALLED liblrmoe (pkg-config lrmoe):
 * plans every frame of a routed stream with ONE lrmoe_plan_cfg_t (options
 * set by name, lrmoe_plan_cfg_run per frame, so the cfg's EPLB layouts carry
 * over from frame to frame) and writes the planned stream, which the test
 * compares with lrmoe-plan's output for the same options.
 *   plan_cfg_inproc IN OUT NAME=VALUE...   (NAME alone: a flag) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lrmoe/api.h>
#include <lrmoe/lrmoe.h>
#include <lrmoe/plan.h>

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: plan_cfg_inproc IN OUT NAME=VALUE...\n");
        return 2;
    }
    lrmoe_plan_cfg_t *c = lrmoe_plan_cfg_new();
    if (!c) {
        fprintf(stderr, "plan_cfg_inproc: %s\n", lrmoe_errmsg());
        return 1;
    }
    for (int i = 3; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (eq)
            *eq = 0;
        if (lrmoe_plan_cfg_set(c, argv[i], eq ? eq + 1 : NULL) < 0) {
            fprintf(stderr, "plan_cfg_inproc: %s\n", lrmoe_errmsg());
            return 2;
        }
    }
    lrmoe_reader_t *r = lrmoe_reader_open(argv[1]);
    lrmoe_wopts_t wo;
    lrmoe_wopts_default(&wo);
    lrmoe_writer_t *w = r ? lrmoe_writer_open(argv[2], &wo) : NULL;
    if (!w) {
        fprintf(stderr, "plan_cfg_inproc: %s\n", lrmoe_errmsg());
        return 1;
    }
    lrmoe_frame_t f;
    lrmoe_frame_init(&f);
    int rc, fail = 0;
    while ((rc = lrmoe_reader_next(r, &f)) == 1) {
        lrmoe_tensor_t *tl = lrmoe_frame_need(&f, "expert_load");
        int64_t *load = tl ? lrmoe_tensor_i64(tl) : NULL;
        if (!load || lrmoe_plan_cfg_run(c, load, (int)tl->shape[0], &f) < 0) {
            fail = 1;
        } else {
            const char *l = lrmoe_frame_attr(&f, "layer");
            const char *m = lrmoe_frame_attr(&f, "plan.weight_moves");
            printf("frame %lld layer %s weight_moves %s\n", (long long)lrmoe_reader_index(r) - 1,
                   l ? l : "-", m ? m : "-");
            fail = lrmoe_writer_write(w, &f) < 0;
        }
        free(load);
        if (fail)
            break;
    }
    lrmoe_plan_cfg_free(c);
    if (rc < 0 || fail) {
        fprintf(stderr, "plan_cfg_inproc: %s\n", lrmoe_errmsg());
        lrmoe_writer_abort(w);
        lrmoe_reader_close(r);
        return 1;
    }
    lrmoe_frame_clear(&f);
    lrmoe_reader_close(r);
    lrmoe_plan_thread_cleanup();
    if (lrmoe_writer_close(w) < 0) {
        fprintf(stderr, "plan_cfg_inproc: %s\n", lrmoe_errmsg());
        return 1;
    }
    return 0;
}
