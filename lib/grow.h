/* A scratch buffer that only grows: 64-byte aligned, reused while big
 * enough (the GEMM kernels' packed operands, lib/gemm_amx.c and
 * lib/gemm_dpbf16.c). Header-only: no call between modules. */
#ifndef LRMOE_GROW_H
#define LRMOE_GROW_H

#include <stdlib.h>
#include "lrmoe.h"

/* *p with at least bytes (its contents not kept when it grows), *cap its
 * size; NULL with the error set when out of memory (*p left as it was) */
static inline void *lrmoe_grow64(void **p, size_t *cap, size_t bytes)
{
    if (bytes > *cap) {
        void *q = NULL;
        if (posix_memalign(&q, 64, bytes)) {
            lrmoe_err("gemm: out of memory (%zu bytes of packed operand)", bytes);
            return NULL;
        }
        free(*p);
        *p = q;
        *cap = bytes;
    }
    return *p;
}

#endif
