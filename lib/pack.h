/* pack: assignment of retained (token, expert) pairs to backward instances,
 * physical compaction of their rows, and the inverse scatter-add.
 *
 * Pair index u = t*K + k (token-major). A pair is retained when keep[u] != 0.
 *
 * Packed layout (lrmoe-pack(1), lrmoe-stream(5)): the R retained
 * pairs are ordered destination-major (rank p ascending), then expert-major
 * (expert e ascending), then by pair index u ascending inside a segment.
 * Segment (p,e) holds counts[p*E+e] rows starting at offsets[p*E+e], where
 * offsets is the exclusive prefix sum of counts in row-major order, so
 * offsets[p*E+e] + counts[p*E+e] == offsets[p*E+e+1] and the last segment
 * ends at R.
 *
 * Like the rest of liblrmoe nothing here prints or exits: a failing call
 * returns -1 and leaves its message in lrmoe_errmsg().
 */
#ifndef LRMOE_PACK_H
#define LRMOE_PACK_H

/* Only what the installed headers declare is exported (the library is
 * built with -fvisibility=hidden, lrmoe(3)). */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#include <stdint.h>
#include "lrmoe.h"

/* ------------------------------------------------------------ assignment */

/* What the assignment needs. Arrays are borrowed, not copied. */
typedef struct {
    int64_t T;                 /* tokens */
    int K;                     /* top-k */
    int E;                     /* experts */
    int P;                     /* ranks (expert-parallel instances) */
    const int32_t *topk_ids;   /* (T,K) expert of each pair, in [0,E) */
    const uint8_t *keep;       /* (T,K) 0 dropped, 1 retained */
    const int32_t *pair_rank;  /* (T,K) rank that ran the pair's forward, in
                                * [0,P); NULL: the expert's native rank
                                * e*P/E */
    const uint8_t *placement;  /* (E,P) nonzero where rank p holds an instance
                                * of expert e; NULL: no check */
    const int64_t *bwd_alloc;  /* (E,P) rows of expert e that rank p must take
                                * in backward; NULL: every retained pair stays
                                * on its forward rank */
    const int64_t *quota;      /* (E) retained pairs per expert; NULL: no check */
} lrmoe_pack_in_t;

/* The result of the assignment (all arrays malloc'd, owned). */
typedef struct {
    int64_t R;          /* retained pairs = rows of every packed tensor */
    int E, P, K;
    int64_t T;
    int64_t moved;      /* rows assigned to a rank other than pair_rank: their
                         * saved state must move before backward */
    int64_t *pair;      /* (R) pair index u of each packed row */
    int32_t *rank;      /* (R) destination rank of each packed row */
    int64_t *counts;    /* (P,E) rows of expert e on rank p */
    int64_t *offsets;   /* (P,E) exclusive prefix sum of counts, row-major */
} lrmoe_pack_plan_t;

/* Assign every retained pair exactly once to a rank so that the number of
 * rows of expert e on rank p equals bwd_alloc[e,p]. Within each expert, a
 * pair stays on its forward rank (pair_rank) whenever that rank still has
 * allocation left (pairs taken in ascending u); the remaining pairs fill the
 * remaining allocation in ascending rank order (ascending u). This keeps the
 * largest possible number of pairs on their forward rank; the rest are
 * counted in `moved`.
 *
 * Fails (-1, message) when the inputs disagree: keep not 0/1, expert id out
 * of range, pair_rank out of range, a kept count that differs from quota[e],
 * bwd_alloc negative or placed on a rank without an instance of e, or
 * sum_p bwd_alloc[e,p] != kept pairs of e. On failure *out is left empty. */
int lrmoe_pack_assign(const lrmoe_pack_in_t *in, lrmoe_pack_plan_t *out);
void lrmoe_pack_plan_free(lrmoe_pack_plan_t *pl);

/* ------------------------------------------------------------ gather */

/* dst row i = src row (by_token ? pair[i]/K : pair[i]), row_bytes bytes each
 * (a byte copy: any dtype, exact). dst is (R,row), src is (T,row) when
 * by_token, else (T*K,row). */
void lrmoe_pack_gather(const int64_t *pair, int64_t R, int K, int by_token,
                       const void *src, size_t row_bytes, void *dst);

/* dst row i = alpha[u] * g[u/K] in f32 (one f32 multiply), u = pair[i].
 * g is (T,D) f32, alpha is (T,K) f32, dst is (R,D). */
void lrmoe_pack_gather_scaled(const int64_t *pair, int64_t R, int K, int64_t D,
                              const float *g, const float *alpha, float *dst);
/* The same with g of any float dtype gdt (each row converted to f32, then
 * multiplied: bit-identical to converting g first). */
void lrmoe_pack_gather_scaled_dt(const int64_t *pair, int64_t R, int K,
                                 int64_t D, lrmoe_dtype_t gdt, const void *g,
                                 const float *alpha, float *dst);

/* ------------------------------------------------------------ unpack */

/* Scatter-add packed row results back to token positions:
 *   out (T,D) = 0;  out[u/K] += rows[i]  for every packed row i, u = pair[i].
 * Deterministic: each token's rows are added in ascending k order (whatever
 * the packed order), starting from +0.0f, so the result does not depend on
 * the destination layout and equals a plain per-token loop over k.
 * rows is (R,D) f32, out is (T,D) f32 and is fully overwritten.
 * Fails when a pair index is out of [0,T*K) or appears twice.
 * Allocates one (T*K) index map internally. */
int lrmoe_pack_unpack(const int64_t *pair, int64_t R, const float *rows,
                      int64_t D, int64_t T, int K, float *out);

/* Same, but without summing over k: out (T*K,D) = 0; out[u] = rows[i].
 * unpack_pairs(pack(x)) equals x on retained pairs and zero elsewhere,
 * bit for bit. */
int lrmoe_pack_unpack_pairs(const int64_t *pair, int64_t R, const float *rows,
                            int64_t D, int64_t T, int K, float *out);

/* ------------------------------------------------------------ frames */

typedef enum {
    LRMOE_PACK_ALLOC_AUTO = 0, /* bwd_alloc when the frame has it, else forward */
    LRMOE_PACK_ALLOC_PLAN,     /* bwd_alloc required */
    LRMOE_PACK_ALLOC_FORWARD   /* ignore bwd_alloc: keep pairs on pair_rank;
                                * a bwd_alloc in the frame is replaced by the
                                * realised allocation (counts transposed) */
} lrmoe_pack_alloc_t;

typedef struct {
    lrmoe_pack_alloc_t alloc;
    int P;        /* ranks when no tensor says (placement/bwd_alloc); 0 = unknown */
    int strip;    /* delete saved_gate/saved_up after packing */
    int threads;  /* gather threads (<= 1: one); the output does not depend on it */
} lrmoe_pack_opts_t;
void lrmoe_pack_opts_default(lrmoe_pack_opts_t *o);

/* One frame: read keep, topk_ids, topk_weights, grad_output, hidden,
 * saved_gate, saved_up, pair_rank, placement, bwd_alloc, quota; write
 * pack_pair, pack_rank, pack_counts, pack_offsets, pack_grad, pack_hidden,
 * pack_gate, pack_up and attributes pack.rows, pack.moved, pack.ranks,
 * pack.rank_rows, pack.alloc, pack.seconds. */
int lrmoe_pack_frame(lrmoe_frame_t *f, const lrmoe_pack_opts_t *o);

/* lrmoe_pack_frame with flags (0: the same call). LRMOE_PACK_LAYOUT_ONLY:
 * the layout-only form (lrmoe-pack --layout-only): write the layout
 * (pack_pair, pack_rank, pack_counts, pack_offsets and the attributes) but
 * not the four row tensors pack_grad, pack_hidden, pack_gate, pack_up (any
 * an earlier pack left are deleted); the frame keeps the sources they would
 * be gathered from (grad_output, topk_weights, hidden, saved_gate,
 * saved_up), and the CPU backward reads its rows from them by pack_pair.
 * Attribute pack.form is "rows" (copying form) or "layout". Fails with
 * o->strip (the rows live in saved_gate/saved_up) or an unknown flag. */
#define LRMOE_PACK_LAYOUT_ONLY 1u
int lrmoe_pack_frame_x(lrmoe_frame_t *f, const lrmoe_pack_opts_t *o, unsigned flags);

/* Which form a packed frame is in: LRMOE_PACK_FORM_ROWS (all four row
 * tensors), LRMOE_PACK_FORM_LAYOUT (none of them), or -1 (some but not all:
 * message names the missing one). */
#define LRMOE_PACK_FORM_ROWS 1
#define LRMOE_PACK_FORM_LAYOUT 0
int lrmoe_pack_form(const lrmoe_frame_t *f);

/* Materialise the rows of a layout-only frame: pack_grad, pack_hidden,
 * pack_gate and pack_up gathered by pack_pair from the sources, byte for
 * byte what lrmoe_pack_frame writes for the same layout; pack.form becomes
 * "rows". A frame already in the copying form is left as it is (0). Fails
 * when a source is missing or mis-shaped or a pack_pair entry is out of
 * [0,T*K). threads as lrmoe_pack_opts_t's. */
int lrmoe_pack_rows_frame(lrmoe_frame_t *f, int threads);

/* One frame of the inverse: rows tensor `rows_name` (R,D) (any float dtype)
 * and pack_pair -> `out_name` (T,D) F32 (pairs: (T,K,D)). T and K come from
 * topk_ids. */
int lrmoe_pack_unpack_frame(lrmoe_frame_t *f, const char *rows_name,
                            const char *out_name, int pairs);
/* 0, or -1 when out_name is a tensor the unpack reads (topk_ids, pack_pair,
 * rows_name): the output would silently replace its own input. */
int lrmoe_pack_unpack_names(const char *rows_name, const char *out_name);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#endif
