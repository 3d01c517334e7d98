/* route_frame: the route stage on a frame (lrmoe-route(1)'s work).
 *
 * lrmoe_route_frame() takes the logits from the frame's router_logits [T,E],
 * or from hidden [T,D] x router_weight [E,D] of the weights frame for the
 * frame's layer; routes them with lrmoe_route_topk (lib/route.h); adds
 * topk_ids [T,K] I32, topk_weights [T,K] F32, expert_load [E] I64 (and
 * rank_load [P] I64 with ranks > 0) and the route.* attributes. Nothing here
 * prints or exits: -1 with lrmoe_err set. Internal to the tools (not
 * installed): the installed API routes arrays (lrmoe_route_topk). */
#ifndef LRMOE_ROUTE_FRAME_H
#define LRMOE_ROUTE_FRAME_H

#include "lrmoe.h"
#include "route.h"
#include "weights_map.h"

typedef struct {
    lrmoe_route_opts_t ro;   /* the router; ro.k is K when k_given or the
                                frame has no topk attribute */
    int k_given;             /* ro.k was given: the topk attribute is not read */
    int from_hidden;         /* hidden x router_weight even if router_logits exist */
    int loads_only;          /* then keep only expert_load, rank_load and the
                                attributes (route.hidden, route.tokens added) */
    int64_t ranks;           /* > 0: rank_load and route.rank_* under plain EP */
    const lrmoe_weights_t *weights; /* router_weight, expert_bias per layer, or NULL */
    const lrmoe_wmap_t *weights_map; /* the mapping of weights (each layer's
                                        frame checked at its first use), or
                                        NULL: read whole */
    const char *weights_name;       /* the weights' name in messages */
} lrmoe_route_frame_opts_t;

/* What a call found, filled as it goes (so a caller can report the
 * choices made before an error): NULL strings are not reached yet. */
typedef struct {
    const char *k_from;      /* "option", "frame" or "default" */
    const char *bias_use;    /* "none", "used" or "ignored" (a softmax router) */
    int64_t T, E;
    int K;
    lrmoe_load_stats_t expert, rank; /* rank: zeros without ranks */
} lrmoe_route_frame_info_t;

int lrmoe_route_frame(lrmoe_frame_t *f, const lrmoe_route_frame_opts_t *o,
                      lrmoe_route_frame_info_t *info);

#endif
