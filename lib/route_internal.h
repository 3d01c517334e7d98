/* route_internal.h: kernels of route.c that live in their own files
 * (liblrmoe-internal; not installed). */
#ifndef LRMOE_ROUTE_INTERNAL_H
#define LRMOE_ROUTE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* 1 when the CPU and the OS run route_softmax_rows512 (AVX-512 F, BW, DQ,
 * VL with BMI2 and POPCNT); 0 elsewhere, and always when the environment
 * sets LRMOE_NO_SIMD or LRMOE_NO_AVX512 (so tests reach the other paths). */
int route_avx512_ok(void);

/* Rows per call of route_softmax_rows512, and the scratch it needs. */
enum { ROUTE512_ROWS = 16 };
#define ROUTE512_SCRATCH(E) ((size_t)ROUTE512_ROWS * ((size_t)(E) + 32))

/* Softmax-router top-K of nb <= ROUTE512_ROWS rows x (nb, E) F32, for K <= 8
 * and E a multiple of 16 up to 1024. Row r gets ids[r*K + k], w[r*K + k]
 * for k < K: the K largest logits in decreasing order, ties to the lower
 * expert index, with weights scale * exp(x - max) / S, S = sum over all E
 * experts when `full`, else over the K picks; load[id] += 1 for each pick.
 * cv, ci: ROUTE512_SCRATCH(E) floats and ints of scratch. The nnext bytes
 * at next (the caller's next block, or 0 bytes) are prefetched meanwhile.
 * Rows it does not finish are left untouched, for the caller's general
 * path: a NaN anywhere in the row, an infinite maximum, more than 16
 * logits at or above its bound (about 0.4% of rows of random logits), or
 * a pick whose exp is below FLT_MIN. Returns those rows as a bit mask
 * (bit r = row r). */
uint32_t route_softmax_rows512(const float *x, int nb, int E, int K, int full,
                               float scale, int32_t *ids, float *w, int64_t *load,
                               float *cv, int32_t *ci, const void *next, size_t nnext);

#endif
