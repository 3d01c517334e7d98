/* One MoE layer invocation from a frame: the frame-level entry point of the
 * exec stage, shared by lrmoe-exec, the Python package and any C caller.
 *
 * lrmoe_exec_frame() reads the tensors a phase needs from the frame (routing,
 * the plan when the frame has one, hidden or the backward state), checks
 * their shapes and dtypes against the layer's weights, runs
 * lrmoe_exec_forward/lrmoe_exec_backward (lib/exec.h) and adds the results
 * and the exec.* timing attributes to the same frame:
 *   forward  adds output, pair_rank, phi_sqnorm, saved_gate, saved_up, pair_out;
 *   backward adds grad_hidden, grad_w_gate, grad_w_up, grad_w_down,
 *            grad_topk_weights.
 * Weights are matched to the frame by its `layer` attribute. A context keeps
 * the weights (a raw weights file is mapped: lib/weights_map.h) and, on the
 * CPU with --compute f32, one packed F32 copy of the current layer between
 * frames. Nothing here prints or exits: -1 with lrmoe_err set. */
#ifndef LRMOE_EXEC_FRAME_H
#define LRMOE_EXEC_FRAME_H

#include <stdio.h>
#include "exec.h"
#include "lrmoe.h"
#include "weights_map.h"

typedef struct {
    int backward;            /* 0: forward, 1: backward */
    lrmoe_exec_mode_t mode;  /* backward: full, masked or compact */
    lrmoe_exec_cfg_t cfg;    /* backend, threads, ... (lrmoe_exec_cfg_default) */
    int ranks;               /* P: 0 = the plan's, else (backward) the frame's
                                record (pack_counts rows, exec.ranks), else 1 */
    int warmup;              /* untimed runs of the layer before the timed ones */
    int repeat;              /* timed runs (>= 1): each stage's time per rank and
                                the wall time are the medians over them */
} lrmoe_exec_frame_opts_t;
void lrmoe_exec_frame_opts_default(lrmoe_exec_frame_opts_t *o);

typedef struct {
    lrmoe_exec_frame_opts_t o;
    /* weights: a stream read at the first frame (lrmoe_exec_ctx_weights_file)
     * or a caller's lrmoe_weights_t (lrmoe_exec_ctx_weights, borrowed) */
    const char *weights_path;
    lrmoe_weights_t w_own;
    const lrmoe_weights_t *w;
    int64_t f32_layer;       /* layer cached as packed F32, -1 none */
    float *f32;              /* (E, 3*F*D): per expert [W_gate; W_up; W_down] */
    /* the last frame run */
    int64_t layer;
    int P;
    double *tim;             /* (P, LRMOE_NSTAGES) seconds (medians over repeats) */
    double *rep;             /* (repeat, P, LRMOE_NSTAGES) scratch */
    double *wall_rep;        /* (repeat) */
    int tim_cap, rep_cap;
    double wall;             /* seconds of the whole exec call */
    int critical;            /* rank with the largest stage total */
    /* NULL: the P ranks run in this process; else this is rank 0 of an MPI
     * job and every frame is spread over its processes (lib/exec_mpi.h) */
    struct lrmoe_exec_mpi *mpi;
    /* a raw weights file is mapped, not read (w_own then borrows from it;
     * lib/weights_map.h): the mapping (base NULL when none), each frame's
     * digest record checked at the frame's first use */
    lrmoe_wmap_t wmap;
    /* experts whose weights were checked finite: (w->n, wok_E) flags, each
     * expert checked once, the first time a frame routes pairs to it */
    uint8_t *wok;
    int64_t wok_E;
    uint8_t *f32_done;       /* (E): experts of f32_layer already in f32 */
    /* backend cuda in this process: the executor every frame runs on (made
     * at the first frame: contexts, communicator and weights stay resident
     * across frames), and its P */
    lrmoe_exec_cuda_t *cx;
    int cx_P;
} lrmoe_exec_ctx_t;

void lrmoe_exec_ctx_init(lrmoe_exec_ctx_t *c, const lrmoe_exec_frame_opts_t *o);
/* The weights stream at PATH is read at the first frame, not now, so that
 * `lrmoe-gen --weights w.lrm | ... | lrmoe-exec --weights w.lrm` has no race.
 * PATH is borrowed. */
void lrmoe_exec_ctx_weights_file(lrmoe_exec_ctx_t *c, const char *path);
/* Use weights the caller holds (borrowed for the context's life). Unless
 * cfg.allow_nonfinite, the weights of the experts a frame uses are checked
 * for non-finite values: on the CPU backend through the layer's outputs
 * (lib/exec_frame.c, out_check), else each expert the first time a frame
 * routes pairs to it (weights of experts no frame uses are never read). */
int lrmoe_exec_ctx_weights(lrmoe_exec_ctx_t *c, const lrmoe_weights_t *w);
void lrmoe_exec_ctx_free(lrmoe_exec_ctx_t *c);

/* Run the phase on frame f and add its outputs and exec.* attributes. */
int lrmoe_exec_frame(lrmoe_exec_ctx_t *c, lrmoe_frame_t *f);

/* Output buffers reused from one frame to the next, so that their pages
 * are faulted in once per process, not once per frame (a backward's weight
 * gradients are 3*E*F*D floats). lrmoe_exec_frame_reuse is lrmoe_exec_frame
 * whose outputs take the buffers of spare's tensors of the same name and
 * size (the CPU backend in this process only: it writes every element);
 * spare is cleared after, so what it did not use is freed. Once f is written
 * and before it is cleared, lrmoe_exec_ctx_recycle moves the phase's output
 * tensors from f (the frame the context last ran on) into spare, replacing
 * spare's; it returns the number moved (0 where no buffers are reused: other
 * backends, MPI). spare is an ordinary frame the caller owns. */
int lrmoe_exec_frame_reuse(lrmoe_exec_ctx_t *c, lrmoe_frame_t *f, lrmoe_frame_t *spare);
int lrmoe_exec_ctx_recycle(const lrmoe_exec_ctx_t *c, lrmoe_frame_t *f, lrmoe_frame_t *spare);

/* The per-rank timing rows of the last frame as TSV (header first when
 * header != 0): frame layer phase mode rank <stage>_s... total_s critical wall_s. */
int lrmoe_exec_timings_tsv(FILE *fp, int header, const lrmoe_exec_ctx_t *c, int64_t frame);

#endif
