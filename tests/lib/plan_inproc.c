/* Built by tests/lib.bats against the INSTALLED liblrmoe (pkg-config lrmoe):
 * plans every frame of a routed stream in-process with the public C API
 * (lrmoe_plan_compute, lrmoe_plan_to_frame) and writes the planned stream,
 * which the test compares with lrmoe-plan's output for the same options.
 *   plan_inproc IN OUT P D F */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lrmoe/api.h>
#include <lrmoe/lrmoe.h>
#include <lrmoe/plan.h>

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: plan_inproc IN OUT P D F\n");
        return 2;
    }
    if (strcmp(lrmoe_version(), LRMOE_VERSION)) {
        fprintf(stderr, "plan_inproc: header %s, library %s\n", LRMOE_VERSION, lrmoe_version());
        return 1;
    }
    /* the version as numbers: the header's macros, the library's call and
     * the string are one version */
    char vs[32];
    snprintf(vs, sizeof vs, "%d.%d.%d", LRMOE_VERSION_MAJOR, LRMOE_VERSION_MINOR,
             LRMOE_VERSION_PATCH);
    if (strcmp(vs, LRMOE_VERSION) || lrmoe_version_number() != LRMOE_VERSION_NUMBER ||
        LRMOE_VERSION_NUMBER != LRMOE_VERSION_MAJOR * 10000 + LRMOE_VERSION_MINOR * 100 +
                                    LRMOE_VERSION_PATCH) {
        fprintf(stderr, "plan_inproc: version %s, numbers %s, library number %d, header %d\n",
                LRMOE_VERSION, vs, lrmoe_version_number(), LRMOE_VERSION_NUMBER);
        return 1;
    }
    lrmoe_plan_opts_t o;
    lrmoe_plan_opts_default(&o);
    o.P = atoi(argv[3]);
    o.cost.D = atoll(argv[4]);
    o.cost.F = atoll(argv[5]);
    lrmoe_reader_t *r = lrmoe_reader_open(argv[1]);
    lrmoe_wopts_t wo;
    lrmoe_wopts_default(&wo);
    lrmoe_writer_t *w = r ? lrmoe_writer_open(argv[2], &wo) : NULL;
    if (!w) {
        fprintf(stderr, "plan_inproc: %s\n", lrmoe_errmsg());
        return 1;
    }
    lrmoe_frame_t f;
    lrmoe_frame_init(&f);
    int rc, fail = 0;
    while ((rc = lrmoe_reader_next(r, &f)) == 1) {
        lrmoe_tensor_t *tl = lrmoe_frame_need(&f, "expert_load");
        lrmoe_tensor_t *ti = lrmoe_frame_need(&f, "topk_ids");
        int64_t *load = tl ? lrmoe_tensor_i64(tl) : NULL;
        lrmoe_plan_t p;
        lrmoe_plan_init(&p);
        if (ti) {
            o.cost.K = (int)ti->shape[1];
            o.cost.tokens = ti->shape[0] / o.P;
        }
        if (!load || lrmoe_plan_compute(&o, load, (int)tl->shape[0], &p) < 0 ||
            lrmoe_plan_to_frame(&p, &f) < 0 || lrmoe_writer_write(w, &f) < 0)
            fail = 1;
        else
            printf("frame %lld rho %.6f fwd_peak %lld bwd_peak %lld\n",
                   (long long)lrmoe_reader_index(r) - 1, p.rho, (long long)p.fwd_peak,
                   (long long)p.bwd_peak);
        lrmoe_plan_free(&p);
        free(load);
        if (fail)
            break;
    }
    if (rc < 0 || fail) {
        fprintf(stderr, "plan_inproc: %s\n", lrmoe_errmsg());
        lrmoe_writer_abort(w);
        lrmoe_reader_close(r);
        return 1;
    }
    lrmoe_frame_clear(&f);
    lrmoe_reader_close(r);
    lrmoe_plan_thread_cleanup();
    if (lrmoe_writer_close(w) < 0) {
        fprintf(stderr, "plan_inproc: %s\n", lrmoe_errmsg());
        return 1;
    }
    return 0;
}
