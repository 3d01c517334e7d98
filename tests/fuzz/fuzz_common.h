/* Shared by the libFuzzer harnesses in tests/fuzz: frame comparison for the
 * round-trip oracles, and a crash that names what differed. */
#ifndef LRMOE_FUZZ_COMMON_H
#define LRMOE_FUZZ_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "lrmoe.h"

/* Allocations above 512 MiB fail (the library reports "out of memory")
 * instead of costing their shadow memory: a header may declare any size,
 * and the reader allocates what it declares before the data arrives. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "max_allocation_size_mb=512:allocator_may_return_null=1:detect_leaks=1";
}

#define FUZZ_CHECK(cond, ...)                                                   \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "fuzz oracle failed at %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
            abort();                                                            \
        }                                                                       \
    } while (0)

/* A copy of the input that ends exactly at an inaccessible page, so that a
 * read past its end faults even inside the uninstrumented system libraries
 * (jansson, zstd), which ASan does not see. Free with fuzz_unguard(). */
static inline const uint8_t *fuzz_guarded(const uint8_t *data, size_t size, size_t *maplen)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), body = (size + pg - 1) / pg * pg;
    *maplen = body + pg;
    uint8_t *m = mmap(NULL, *maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    FUZZ_CHECK(m != MAP_FAILED, "mmap of %zu bytes failed", *maplen);
    FUZZ_CHECK(mprotect(m + body, pg, PROT_NONE) == 0, "mprotect failed");
    uint8_t *p = m + body - size;
    if (size) memcpy(p, data, size);
    return p;
}

static inline void fuzz_unguard(const uint8_t *p, size_t size, size_t maplen)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), body = (size + pg - 1) / pg * pg;
    munmap((uint8_t *)p - (body - size), maplen);
}

static inline int fuzz_tensor_equal(const lrmoe_tensor_t *a, const lrmoe_tensor_t *b)
{
    if (strcmp(a->name, b->name) || a->dtype != b->dtype || a->ndim != b->ndim ||
        a->nbytes != b->nbytes)
        return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    return !a->nbytes || !memcmp(a->data, b->data, a->nbytes);
}

/* Same tensors in the same order, same attributes in the same order. */
static inline void fuzz_frame_same(const lrmoe_frame_t *a, const lrmoe_frame_t *b, const char *what)
{
    FUZZ_CHECK(a->ntensors == b->ntensors, "%s: %d tensors, then %d", what, a->ntensors, b->ntensors);
    for (int i = 0; i < a->ntensors; i++)
        FUZZ_CHECK(fuzz_tensor_equal(a->tensors[i], b->tensors[i]), "%s: tensor %d (%s) differs",
                   what, i, a->tensors[i]->name);
    FUZZ_CHECK(a->nattrs == b->nattrs, "%s: %d attributes, then %d", what, a->nattrs, b->nattrs);
    for (int i = 0; i < a->nattrs; i++)
        FUZZ_CHECK(!strcmp(a->keys[i], b->keys[i]) && !strcmp(a->vals[i], b->vals[i]),
                   "%s: attribute %d (%s) differs", what, i, a->keys[i]);
}

/* encode(f) decodes to f again, and encoding that gives the same bytes. */
static inline void fuzz_roundtrip(const lrmoe_frame_t *f)
{
    uint8_t *b1 = NULL, *b2 = NULL;
    size_t n1, n2;
    FUZZ_CHECK(lrmoe_frame_encode(f, &b1, &n1) == 0, "encode of a decoded frame: %s", lrmoe_errmsg());
    lrmoe_frame_t g;
    lrmoe_frame_init(&g);
    FUZZ_CHECK(lrmoe_frame_decode(b1, n1, &g) == 0, "decode of an encoded frame: %s", lrmoe_errmsg());
    fuzz_frame_same(f, &g, "encode/decode");
    FUZZ_CHECK(lrmoe_frame_encode(&g, &b2, &n2) == 0, "re-encode: %s", lrmoe_errmsg());
    FUZZ_CHECK(n1 == n2 && !memcmp(b1, b2, n1), "encode is not stable (%zu vs %zu bytes)", n1, n2);
    lrmoe_frame_clear(&g);
    free(b1);
    free(b2);
}

#endif
