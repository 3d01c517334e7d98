/* mock-run: drive the CUDA backend's host logic (kernels/kcu.cu context,
 * gemm.cu, comm_nccl.cu) on tests/gpu/mock-cuda.c, for tests/cuda-mock.bats.
 *   mock-run loop     6 GEMMs over 4 side streams (MOCK_GEMM_FAIL=N fails one)
 *   mock-run grouped  three grouped calls of F32 and BF16 outputs
 *   mock-run cutlass  one --gemm cutlass call of the same 6 GEMMs
 *                     (MOCK_GEMM_MISALIGN=N: GEMM N's A off 16 bytes)
 *   mock-run comm     contexts on devices 0, 1, 1 and their communicator
 * Prints "rc=R" per call (and the error message when R < 0); the mock's log
 * ($MOCK_CUDA_LOG) is what the test reads. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lrmoe.h"
#include "kcu.h"
#include "comm_cuda.h"

void mock_mark(const char *what);

static void show(const char *what, int rc)
{
    printf("%s rc=%d%s%s\n", what, rc, rc < 0 ? " err=" : "", rc < 0 ? lrmoe_errmsg() : "");
}

/* n GEMMs (m, n, k = 16) on fresh 16-byte aligned "device" buffers; every
 * second one with a BF16 output */
static int gemms(int n)
{
    /* MOCK_GEMM_MISALIGN=i: GEMM i's A starts 2 bytes in (cuBLAS fallback) */
    const char *mis = getenv("MOCK_GEMM_MISALIGN");
    int mi = mis ? atoi(mis) : -1;
    lrmoe_gemm_t g[8];
    memset(g, 0, sizeof g);
    void *buf[24];
    int rc = 0;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < 3; j++)
            if (lrmoe_kcu_alloc(&buf[3 * i + j], 16 * 16 * 4) < 0) return -1;
        lrmoe_gemm_t x = {16, 16, 16, 0, 0, buf[3 * i], buf[3 * i + 1], buf[3 * i + 2],
                          16, 16, 16, i % 2, 0.0f};
        if (i == mi) x.a = (const char *)x.a + 2;
        g[i] = x;
    }
    rc = lrmoe_kcu_gemm(n, g);
    for (int i = 0; i < 3 * n; i++) lrmoe_kcu_free(buf[i]);
    return rc;
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "";
    lrmoe_kcu_ctx_t *c[3] = {NULL, NULL, NULL};
    if (!strcmp(what, "loop") || !strcmp(what, "grouped") || !strcmp(what, "cutlass")) {
        mock_mark("create");
        show("create", lrmoe_kcu_ctx_create(0, 4, &c[0]));
        show("use", lrmoe_kcu_use(c[0]));
        lrmoe_kcu_set_gemm(c[0], what[0] == 'g' ? LRMOE_GEMM_GROUPED
                                 : what[0] == 'c' ? LRMOE_GEMM_CUTLASS : LRMOE_GEMM_LOOP);
        for (int call = 0; call < (what[0] == 'g' ? 3 : 1); call++) {
            mock_mark("gemm");
            show("gemm", gemms(6));
        }
        mock_mark("destroy");
        lrmoe_kcu_ctx_destroy(c[0]);
        mock_mark("end");
        return 0;
    }
    if (!strcmp(what, "comm")) {
        int dev[3] = {0, 1, 1};
        mock_mark("create");
        for (int r = 0; r < 3; r++) show("create", lrmoe_kcu_ctx_create(dev[r], 1, &c[r]));
        lrmoe_comm_t comm;
        mock_mark("comm");
        int rc = lrmoe_comm_cuda_init(&comm, 3, c, -1);
        show("comm", rc);
        if (rc == 0) printf("nccl=%d\n", lrmoe_comm_cuda_is_nccl(&comm));
        mock_mark("destroy");
        if (rc == 0) lrmoe_comm_free(&comm);
        for (int r = 0; r < 3; r++) lrmoe_kcu_ctx_destroy(c[r]);
        mock_mark("end");
        return 0;
    }
    fprintf(stderr, "usage: mock-run loop|grouped|cutlass|comm\n");
    return 2;
}
