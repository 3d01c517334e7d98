/* Built by tests/lib.bats against the INSTALLED liblrmoe (pkg-config lrmoe):
 * runs one stage on every frame of a stream through its opaque handle
 * (lrmoe_route_t, lrmoe_score_t, lrmoe_pack_t, lrmoe_exec_t of api.h),
 * options given as NAME=VALUE (NAME alone for a flag), and writes the
 * stream raw, which the test compares with the tool's output for the same
 * options.
 *   stage_inproc route|score|pack|exec IN OUT [NAME[=VALUE]...] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lrmoe/api.h>
#include <lrmoe/lrmoe.h>

/* one stage's handle as four calls */
typedef struct {
    const char *name;
    void *(*make)(void);
    int (*set)(void *, const char *, const char *);
    int (*run)(void *, lrmoe_frame_t *);
    void (*drop)(void *);
} stage_t;

#define STAGE(s) {#s, (void *(*)(void))lrmoe_##s##_new, \
                  (int (*)(void *, const char *, const char *))lrmoe_##s##_set, \
                  (int (*)(void *, lrmoe_frame_t *))lrmoe_##s##_run, \
                  (void (*)(void *))lrmoe_##s##_free}

int main(int argc, char **argv)
{
    static const stage_t stages[] = {STAGE(route), STAGE(score), STAGE(pack), STAGE(exec)};
    const stage_t *st = NULL;
    for (size_t i = 0; argc >= 4 && i < sizeof stages / sizeof stages[0]; i++)
        if (!strcmp(argv[1], stages[i].name)) st = &stages[i];
    if (!st) {
        fprintf(stderr, "usage: stage_inproc route|score|pack|exec IN OUT [NAME[=VALUE]...]\n");
        return 2;
    }
    void *h = st->make();
    lrmoe_reader_t *r = NULL;
    lrmoe_writer_t *w = NULL;
    lrmoe_frame_t f;
    lrmoe_frame_init(&f);
    int rc = -1;
    if (!h) goto done;
    for (int i = 4; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (eq) *eq = 0;
        if (st->set(h, argv[i], eq ? eq + 1 : NULL) < 0) goto done;
    }
    lrmoe_wopts_t wo;
    lrmoe_wopts_default(&wo);
    wo.compress = 0;
    if (!(r = lrmoe_reader_open(argv[2])) || !(w = lrmoe_writer_open(argv[3], &wo))) goto done;
    while ((rc = lrmoe_reader_next(r, &f)) == 1) {
        const int k = st->run(h, &f);
        if (k > 0) { /* api.h: 0 or -1, nothing else */
            fprintf(stderr, "stage_inproc: %s run returned %d\n", st->name, k);
            rc = -2;
            break;
        }
        if (k < 0 || lrmoe_writer_write(w, &f) < 0) {
            rc = -1;
            break;
        }
    }
done:
    if (w) {
        if (rc < 0) lrmoe_writer_abort(w);
        else if (lrmoe_writer_close(w) < 0) rc = -1;
    }
    if (rc == -1) fprintf(stderr, "stage_inproc: %s\n", lrmoe_errmsg());
    lrmoe_frame_clear(&f);
    lrmoe_reader_close(r);
    if (h) st->drop(h);
    return rc < 0;
}
