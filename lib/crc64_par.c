/* CRC-64 on several threads (crc64_par.h). */
#include "crc64_par.h"

#include <stdlib.h>
#include "crc64.h"
#include "par.h"

typedef struct {
    const uint8_t *p;
    size_t len, piece;
    uint64_t *crc;
} pieces_t;

static int piece_crc(void *vp, int64_t lo, int64_t hi)
{
    pieces_t *c = vp;
    for (int64_t i = lo; i < hi; i++) {
        const size_t a = (size_t)i * c->piece, n = c->len - a < c->piece ? c->len - a : c->piece;
        c->crc[i] = lrmoe_crc64_update(0, c->p + a, n);
    }
    return 0;
}

uint64_t lrmoe_crc64_par(uint64_t crc, const void *p, size_t n, int threads, size_t piece)
{
    threads = lrmoe_parallel_cpus(threads);
    if (threads > 64) threads = 64;
    if (piece < 1) piece = 1;
    size_t np = n / piece;
    if (np > (size_t)threads) np = (size_t)threads;
    if (np < 2) return lrmoe_crc64_update(crc, p, n);
    const size_t psz = (n + np - 1) / np;
    np = (n + psz - 1) / psz;
    uint64_t *pc = malloc(np * sizeof *pc);
    if (!pc) return lrmoe_crc64_update(crc, p, n);
    pieces_t c = {p, n, psz, pc};
    lrmoe_parallel_ranges((int64_t)np, (int)np, 1, piece_crc, &c);   /* never fails */
    uint64_t r = crc;
    for (size_t i = 0; i < np; i++)
        r = lrmoe_crc64_combine(r, pc[i], i + 1 < np ? psz : n - i * psz);
    free(pc);
    return r;
}
