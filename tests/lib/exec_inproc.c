/* Built by tests/lib.bats against the INSTALLED liblrmoe (pkg-config lrmoe):
 * runs lrmoe-exec's phase on every frame of a stream through the opaque
 * handle (lrmoe_exec_new / _set / _run, api.h), options given as
 * NAME=VALUE (NAME alone for a flag), and writes the stream, which the test
 * compares with lrmoe-exec's output for the same options.
 *   exec_inproc IN OUT WEIGHTS [NAME[=VALUE]...] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lrmoe/api.h>
#include <lrmoe/lrmoe.h>

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: exec_inproc IN OUT WEIGHTS [NAME[=VALUE]...]\n");
        return 2;
    }
    lrmoe_exec_t *x = lrmoe_exec_new();
    if (!x || lrmoe_exec_set(x, "weights", argv[3]) < 0) goto fail;
    for (int i = 4; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (eq) *eq = 0;
        if (lrmoe_exec_set(x, argv[i], eq ? eq + 1 : NULL) < 0) goto fail;
    }
    lrmoe_reader_t *r = lrmoe_reader_open(argv[1]);
    lrmoe_wopts_t wo;
    lrmoe_wopts_default(&wo);
    wo.compress = 0;
    lrmoe_writer_t *w = r ? lrmoe_writer_open(argv[2], &wo) : NULL;
    if (!w) goto fail;
    lrmoe_frame_t f;
    lrmoe_frame_init(&f);
    int rc;
    while ((rc = lrmoe_reader_next(r, &f)) == 1)
        if (lrmoe_exec_run(x, &f) < 0 || lrmoe_writer_write(w, &f) < 0) {
            rc = -1;
            break;
        }
    if (rc < 0) lrmoe_writer_abort(w);
    else if (lrmoe_writer_close(w) < 0) rc = -1;
    lrmoe_frame_clear(&f);
    lrmoe_reader_close(r);
    if (rc < 0) goto fail;
    lrmoe_exec_free(x);
    return 0;
fail:
    fprintf(stderr, "exec_inproc: %s\n", lrmoe_errmsg());
    lrmoe_exec_free(x);
    return 1;
}
