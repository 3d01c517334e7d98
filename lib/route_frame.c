/* The route stage on a frame (route_frame.h): K, the logits and the bias
 * from the frame and its weights, lrmoe_route_topk, the loads and the
 * route.* attributes. */
#include <inttypes.h>
#include <stdlib.h>
#include "route_frame.h"

/* K: the option, else the frame's topk attribute (lrmoe-gen writes it), else ro->k */
static int pick_k(const lrmoe_frame_t *f, const lrmoe_route_frame_opts_t *o,
                  lrmoe_route_opts_t *ro, lrmoe_route_frame_info_t *info)
{
    if (o->k_given) {
        info->k_from = "option";
        return 0;
    }
    int64_t k;
    int rc = lrmoe_frame_attr_i64(f, "topk", &k);
    if (rc < 0)
        return lrmoe_err("attribute topk '%s' is not an integer", lrmoe_frame_attr(f, "topk"));
    if (rc == 0) {
        info->k_from = "default";
        return 0;
    }
    if (k < 1 || k > INT32_MAX)
        return lrmoe_err("attribute topk %" PRId64 ": must be at least 1", k);
    ro->k = (int)k;
    info->k_from = "frame";
    return 0;
}

/* The weights frame for this frame's layer (NULL with error), checked at
 * its first use when the weights are mapped. */
static const lrmoe_frame_t *weights_for(const lrmoe_route_frame_opts_t *o,
                                        const lrmoe_frame_t *f)
{
    int64_t layer;
    int rc = lrmoe_frame_attr_i64(f, "layer", &layer);
    if (rc < 0)
        return NULL;
    const lrmoe_frame_t *wf = NULL;
    if (rc == 0) {
        if (o->weights->n != 1) {
            lrmoe_err("no layer attribute, and %s holds %d layers", o->weights_name,
                      o->weights->n);
            return NULL;
        }
        wf = &o->weights->frames[0];
    } else if (!(wf = lrmoe_weights_layer(o->weights, layer))) {
        lrmoe_err("%s: no weights for layer %" PRId64, o->weights_name, layer);
        return NULL;
    }
    /* the two tensors read here (frame_logits, frame_bias): where the
     * record is by parts, the layer's experts are not read */
    static const char *const used[] = {"router_weight", "expert_bias"};
    return lrmoe_weights_use_tensors(o->weights_map, o->weights, wf, used, 2) < 0 ? NULL : wf;
}

/* The logits to route, [T,E]: router_logits as they are, or hidden x
 * router_weight into a new F32 buffer (*computed, the caller's to free). */
typedef struct {
    int64_t T, E;
    const void *logits;
    lrmoe_dtype_t dt;
    float *computed;
} logits_t;

static int logits_from_hidden(const lrmoe_tensor_t *hid, const lrmoe_tensor_t *rw,
                              const lrmoe_route_opts_t *ro, logits_t *l)
{
    char b1[64], b2[64];
    if (hid->ndim != 2)
        return lrmoe_err("hidden: shape %s, expected [T,D]", lrmoe_shape_str(hid, b1, sizeof b1));
    if (rw->ndim != 2 || rw->shape[1] != hid->shape[1])
        return lrmoe_err("router_weight: shape %s does not match hidden %s (expected [E,%" PRId64 "])",
                         lrmoe_shape_str(rw, b1, sizeof b1),
                         lrmoe_shape_str(hid, b2, sizeof b2), hid->shape[1]);
    l->T = hid->shape[0];
    l->E = rw->shape[0];
    if (lrmoe_route_check(ro, l->E) < 0)
        return -1;
    int64_t n = l->T * l->E;
    if (!(l->computed = malloc((size_t)(n > 0 ? n : 1) * sizeof(float))))
        return lrmoe_err("out of memory");
    if (lrmoe_route_logits(l->T, hid->shape[1], l->E, hid->dtype, hid->data, rw->dtype,
                           rw->data, l->computed) < 0)
        return -1;
    l->logits = l->computed;
    l->dt = LRMOE_F32;
    return 0;
}

static int frame_logits(lrmoe_frame_t *f, const lrmoe_frame_t *wf,
                        const lrmoe_route_frame_opts_t *o, const lrmoe_route_opts_t *ro,
                        logits_t *l)
{
    lrmoe_tensor_t *lg = lrmoe_frame_get(f, "router_logits");
    lrmoe_tensor_t *rw = wf ? lrmoe_frame_get(wf, "router_weight") : NULL;
    if (o->from_hidden || !lg) {
        if (!wf || !rw) {
            if (wf)
                return lrmoe_err("%s: missing tensor router_weight", o->weights_name);
            return lrmoe_err("missing tensor router_logits (or hidden with "
                             "router_weight from --weights)");
        }
        lrmoe_tensor_t *hid = lrmoe_frame_need(f, "hidden");
        return hid ? logits_from_hidden(hid, rw, ro, l) : -1;
    }
    char b1[64], b2[64];
    if (lg->ndim != 2)
        return lrmoe_err("router_logits: shape %s, expected [T,E]",
                         lrmoe_shape_str(lg, b1, sizeof b1));
    l->T = lg->shape[0];
    l->E = lg->shape[1];
    if (rw && rw->shape[0] != l->E)
        return lrmoe_err("router_weight: shape %s does not match router_logits %s",
                         lrmoe_shape_str(rw, b1, sizeof b1), lrmoe_shape_str(lg, b2, sizeof b2));
    if (lrmoe_route_check(ro, l->E) < 0)
        return -1;
    l->logits = lg->data;
    l->dt = lg->dtype;
    return 0;
}

/* The selection-only bias: the frame's expert_bias, else the weights'. The
 * softmax routers have none, so one found there is recorded as ignored.
 * *bias: an F32 copy (the caller's to free) or NULL. */
static int frame_bias(const lrmoe_frame_t *f, const lrmoe_frame_t *wf, const lrmoe_route_opts_t *ro,
                      int64_t E, float **bias, lrmoe_route_frame_info_t *info)
{
    lrmoe_tensor_t *bt = lrmoe_frame_get(f, "expert_bias");
    if (!bt && wf)
        bt = lrmoe_frame_get(wf, "expert_bias");
    *bias = NULL;
    info->bias_use = "none";
    if (ro->router != LRMOE_ROUTER_SIGMOID) {
        if (bt)
            info->bias_use = "ignored";
        return 0;
    }
    if (!bt)
        return 0;
    int64_t dims[1] = {E};
    if (lrmoe_tensor_check(bt, 1, dims) < 0 || !(*bias = lrmoe_tensor_f32(bt)))
        return -1;
    info->bias_use = "used";
    return 0;
}

static int set_attrs(lrmoe_frame_t *f, const lrmoe_route_opts_t *ro, int64_t ranks,
                     const lrmoe_route_frame_info_t *info)
{
    const lrmoe_load_stats_t *es = &info->expert, *rs = &info->rank;
    if (lrmoe_frame_set_attr(f, "route.router", lrmoe_route_router_name(ro->router)) < 0 ||
        lrmoe_frame_set_attrf(f, "route.topk", "%d", info->K) < 0 ||
        lrmoe_frame_set_attr(f, "route.topk_from", info->k_from) < 0 ||
        lrmoe_frame_set_attr(f, "route.expert_bias", info->bias_use) < 0 ||
        lrmoe_frame_set_attrf(f, "route.renorm", "%d", ro->renorm) < 0 ||
        lrmoe_frame_set_attrf(f, "route.scale", "%.17g", ro->scale) < 0 ||
        lrmoe_frame_set_attrf(f, "route.expert_max", "%" PRId64, es->max) < 0 ||
        lrmoe_frame_set_attrf(f, "route.expert_mean", "%.6f", es->mean) < 0 ||
        lrmoe_frame_set_attrf(f, "route.expert_imbalance", "%.6f", es->imbalance) < 0)
        return -1;
    if (ro->groups > 1 &&
        (lrmoe_frame_set_attrf(f, "route.groups", "%d", ro->groups) < 0 ||
         lrmoe_frame_set_attrf(f, "route.topk_groups", "%d", ro->topk_groups) < 0))
        return -1;
    if (ranks > 0 &&
        (lrmoe_frame_set_attrf(f, "route.ep", "%" PRId64, ranks) < 0 ||
         lrmoe_frame_set_attrf(f, "route.rank_max", "%" PRId64, rs->max) < 0 ||
         lrmoe_frame_set_attrf(f, "route.rank_mean", "%.6f", rs->mean) < 0 ||
         lrmoe_frame_set_attrf(f, "route.rank_imbalance", "%.6f", rs->imbalance) < 0))
        return -1;
    return 0;
}

/* --loads-only: the loads and the sizes the dropped tensors said (for
 * lrmoe-plan and lrmoe-sim) */
static int keep_loads(lrmoe_frame_t *f)
{
    static const char *keep[] = {"expert_load", "rank_load"};
    const lrmoe_tensor_t *h = lrmoe_frame_get(f, "hidden");
    if (h && h->ndim == 2 &&
        (lrmoe_frame_set_attrf(f, "route.hidden", "%" PRId64, h->shape[1]) < 0 ||
         lrmoe_frame_set_attrf(f, "route.tokens", "%" PRId64, h->shape[0]) < 0))
        return -1;
    return lrmoe_frame_keep_only(f, keep, 2) < 0 ? -1 : 0;   /* not the count deleted */
}

/* Route the logits into topk_ids, topk_weights and expert_load (the last
 * returned in *load). */
static int route_into(lrmoe_frame_t *f, const lrmoe_route_opts_t *ro, const logits_t *l,
                      const float *bias, const int64_t **load)
{
    int64_t dtk[2] = {l->T, ro->k}, de[1] = {l->E};
    lrmoe_tensor_t *ti = lrmoe_frame_put(f, "topk_ids", LRMOE_I32, 2, dtk);
    lrmoe_tensor_t *tw = ti ? lrmoe_frame_put(f, "topk_weights", LRMOE_F32, 2, dtk) : NULL;
    lrmoe_tensor_t *tl = tw ? lrmoe_frame_put(f, "expert_load", LRMOE_I64, 1, de) : NULL;
    if (!tl)
        return -1;
    /* logits from router_logits still point into it: put leaves it alone */
    if (lrmoe_route_topk(ro, l->T, l->E, l->dt, l->logits, bias, ti->data, tw->data, tl->data) < 0)
        return -1;
    *load = tl->data;
    return 0;
}

int lrmoe_route_frame(lrmoe_frame_t *f, const lrmoe_route_frame_opts_t *o,
                      lrmoe_route_frame_info_t *info)
{
    lrmoe_route_opts_t ro = o->ro;
    *info = (lrmoe_route_frame_info_t){0};
    const lrmoe_frame_t *wf = NULL;
    if (pick_k(f, o, &ro, info) < 0 || (o->weights && !(wf = weights_for(o, f))))
        return -1;
    info->K = ro.k;
    logits_t l = {0};
    float *bias = NULL;
    const int64_t *load = NULL;
    int rc = frame_logits(f, wf, o, &ro, &l);
    if (rc == 0)
        rc = frame_bias(f, wf, &ro, l.E, &bias, info);
    if (rc == 0)
        rc = route_into(f, &ro, &l, bias, &load);
    free(l.computed);
    free(bias);
    if (rc < 0)
        return -1;
    info->T = l.T;
    info->E = l.E;
    lrmoe_route_load_stats(load, l.E, &info->expert);
    if (o->ranks > 0) {
        int64_t dp[1] = {o->ranks};
        lrmoe_tensor_t *tr = lrmoe_frame_put(f, "rank_load", LRMOE_I64, 1, dp);
        if (!tr || lrmoe_route_rank_load(l.E, o->ranks, load, tr->data) < 0)
            return -1;
        lrmoe_route_load_stats(tr->data, o->ranks, &info->rank);
    }
    if (set_attrs(f, &ro, o->ranks, info) < 0)
        return -1;
    return o->loads_only ? keep_loads(f) : 0;
}
