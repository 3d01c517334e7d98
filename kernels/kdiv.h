/* Division-free helpers of the memory-bound kernels (issue 39): an integer
 * division by a run-time divisor costs a called 64-bit routine (or a
 * reciprocal and corrections) per use on the GPU; these replace it. Plain
 * C as well as CUDA, so tests/gpu/kdiv-test.c checks kdiv_q on the host.
 *
 * kdiv_q(u, kdiv_make(d)) = u / d for 0 <= u < 2^63, 1 <= d < 2^63:
 * m = floor((2^64-1)/d) >= 2^64/d - 1, so q = floor(u*m / 2^64) lies in
 * (u/d - u/2^64 - 1, u/d], i.e. is floor(u/d) or one less (u < 2^63 makes
 * u/2^64 < 1/2); one comparison of the remainder corrects it. The divisor's
 * only division, for m, is on the host.
 *
 * kdiv_row_shift(nv, tpb): the row walk of a grid-stride kernel whose rows
 * have nv items: 1 << shift threads per row (the least power of two >= nv,
 * at most tpb, a power of two), tpb >> shift rows per block; a thread's row
 * is its global index >> shift and its first item its index & mask, so no
 * division is needed for either. */
#ifndef LRMOE_KDIV_H
#define LRMOE_KDIV_H
#include <stdint.h>

#ifdef __CUDACC__
#define KDIV_FN __host__ __device__ static inline
#else
#define KDIV_FN static inline
#endif

typedef struct {
    uint64_t m; /* floor((2^64-1)/d) */
    uint64_t d;
} kdiv_t;

static inline kdiv_t kdiv_make(int64_t d)
{
    kdiv_t v;
    v.d = d > 0 ? (uint64_t)d : 1;
    v.m = UINT64_MAX / v.d;
    return v;
}

KDIV_FN int64_t kdiv_q(int64_t u, kdiv_t v)
{
#ifdef __CUDA_ARCH__
    uint64_t q = __umul64hi((uint64_t)u, v.m);
#else
    uint64_t q = (uint64_t)(((unsigned __int128)(uint64_t)u * v.m) >> 64);
#endif
    if ((uint64_t)u - q * v.d >= v.d) q++;
    return (int64_t)q;
}

static inline int kdiv_row_shift(int64_t nv, int tpb)
{
    int s = 0;
    while ((INT64_C(1) << s) < nv && (1 << s) < tpb) s++;
    return s;
}
#endif
