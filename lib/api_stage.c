/* api_stage: the route, score and pack stages on frames behind opaque
 * handles (api.h), with options set by the long names of lrmoe-route(1),
 * lrmoe-score(1) and lrmoe-pack(1), so that no caller depends on the layout
 * of their option structs. Each run is the tool's work on one frame, by the
 * same library call. */
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "options.h"
#include "pack.h"
#include "route_frame.h"
#include "score.h"
#include "tools.h"
#include "weights_map.h"

/* -------------------------------------------------------------- common */

static int is(const char *name, const char *want) { return !strcmp(name, want); }

/* a weights stream for a handle: opened now (a missing file fails at the
 * set), mapped where it can be, a layer's frame checked at its first use
 * (lib/weights_map.h) on `threads` threads */
static int set_weights(lrmoe_weights_t *w, lrmoe_wmap_t *m, int *have, const char *path,
                       int threads)
{
    lrmoe_weights_t nw;
    lrmoe_wmap_t nm;
    if (lrmoe_weights_open(path, &nw, &nm, threads) < 0) return -1;
    if (*have) lrmoe_weights_close(w, m);
    *w = nw;
    *m = nm;
    *have = 1;
    return 0;
}

/* --------------------------------------------------------------- route */

struct lrmoe_route {
    lrmoe_route_frame_opts_t o;
    lrmoe_weights_t w;
    lrmoe_wmap_t wm;
    int have_w;
};

lrmoe_route_t *lrmoe_route_new(void)
{
    lrmoe_route_t *r = calloc(1, sizeof *r);
    if (!r) {
        lrmoe_err("out of memory");
        return NULL;
    }
    lrmoe_route_opts_default(&r->o.ro);
    r->o.ro.threads = 1;
    return r;
}

void lrmoe_route_free(lrmoe_route_t *r)
{
    if (!r) return;
    if (r->have_w) lrmoe_weights_close(&r->w, &r->wm);
    free(r);
}

int lrmoe_route_set(lrmoe_route_t *r, const char *name, const char *value)
{
    static const char *const names[] = {"topk", "router", "renorm!", "scale", "groups",
                                        "topk-groups", "threads", "ranks", "weights",
                                        "from-hidden!", "loads-only!", NULL};
    if (!r) return lrmoe_err("route: no handle");
    if (lrmoe_parse_opt_name("route", names, name, value) < 0) return -1;
    lrmoe_route_frame_opts_t o = r->o;
    double d;
    int64_t v;
    int rc = 0;
    if (is(name, "topk")) {
        rc = lrmoe_parse_int("topk", value, 1, INT32_MAX, &o.ro.k);
        o.k_given = 1;
    } else if (is(name, "router")) {
        rc = lrmoe_route_parse_router(value, &o.ro.router);
    } else if (is(name, "renorm")) {
        o.ro.renorm = 1;
    } else if (is(name, "scale")) {
        rc = lrmoe_parse_f64("scale", value, -1e30, 1e30, &d);
        o.ro.scale = d;
    } else if (is(name, "groups")) {
        rc = lrmoe_parse_int("groups", value, 1, INT32_MAX, &o.ro.groups);
    } else if (is(name, "topk-groups")) {
        rc = lrmoe_parse_int("topk-groups", value, 1, INT32_MAX, &o.ro.topk_groups);
    } else if (is(name, "threads")) {
        rc = lrmoe_parse_int("threads", value, 1, 4096, &o.ro.threads);
    } else if (is(name, "ranks")) {
        rc = lrmoe_parse_i64("ranks", value, 1, INT32_MAX, &v);
        o.ranks = v;
    } else if (is(name, "from-hidden")) {
        o.from_hidden = 1;
    } else if (is(name, "loads-only")) {
        o.loads_only = 1;
    } else if (is(name, "weights")) {
        if (set_weights(&r->w, &r->wm, &r->have_w, value, r->o.ro.threads) < 0) return -1;
        r->o.weights = &r->w;
        r->o.weights_map = &r->wm;
        r->o.weights_name = "weights";
        return 0;
    }
    if (rc < 0) return -1;
    r->o = o;
    return 0;
}

int lrmoe_route_run(lrmoe_route_t *r, lrmoe_frame_t *f)
{
    if (!r || !f) return lrmoe_err("route: no handle or no frame");
    if (lrmoe_route_check_opts(&r->o.ro) < 0) return -1;
    if (r->o.from_hidden && !r->have_w)
        return lrmoe_err("route: from-hidden needs weights");
    lrmoe_route_frame_info_t info;
    return lrmoe_route_frame(f, &r->o, &info);
}

/* --------------------------------------------------------------- score */

struct lrmoe_score {
    lrmoe_score_opts_t o;
    lrmoe_weights_t w;
    lrmoe_wmap_t wm;
    int have_w;
    uint64_t index;    /* frames scored: the seed's offset, as lrmoe-score's
                        * (one past the frame option's 2^63-1 is 2^63) */
};

lrmoe_score_t *lrmoe_score_new(void)
{
    lrmoe_score_t *s = calloc(1, sizeof *s);
    if (!s) {
        lrmoe_err("out of memory");
        return NULL;
    }
    lrmoe_score_opts_default(&s->o);
    return s;
}

void lrmoe_score_free(lrmoe_score_t *s)
{
    if (!s) return;
    if (s->have_w) lrmoe_weights_close(&s->w, &s->wm);
    free(s);
}

int lrmoe_score_set(lrmoe_score_t *s, const char *name, const char *value)
{
    static const char *const names[] = {"metric", "select", "drop", "seed", "threads",
                                        "fidelity!", "weights", "frame", NULL};
    if (!s) return lrmoe_err("score: no handle");
    if (lrmoe_parse_opt_name("score", names, name, value) < 0) return -1;
    lrmoe_score_opts_t o = s->o;
    int64_t v;
    int rc = 0;
    if (is(name, "metric")) {
        rc = lrmoe_score_metric_parse(value, &o.metric);
    } else if (is(name, "select")) {
        rc = lrmoe_score_keep_rule_parse(value, &o.select);
    } else if (is(name, "drop")) {
        rc = lrmoe_parse_f64("drop", value, 0, 100, &o.drop_pct);
    } else if (is(name, "seed")) {
        rc = lrmoe_parse_i64("seed", value, 0, INT64_MAX, &v);
        o.seed = (uint64_t)v;
    } else if (is(name, "threads")) {
        rc = lrmoe_parse_int("threads", value, 1, 4096, &o.threads);
    } else if (is(name, "fidelity")) {
        o.fidelity = 1;
    } else if (is(name, "weights")) {
        return set_weights(&s->w, &s->wm, &s->have_w, value, s->o.threads);
    } else if (is(name, "frame")) { /* the next run's frame index (the seed's offset) */
        if (lrmoe_parse_i64("frame", value, 0, INT64_MAX, &v) < 0) return -1;
        s->index = (uint64_t)v;
        return 0;
    }
    if (rc < 0) return -1;
    s->o = o;
    return 0;
}

int lrmoe_score_run(lrmoe_score_t *s, lrmoe_frame_t *f)
{
    if (!s || !f) return lrmoe_err("score: no handle or no frame");
    if (s->have_w && !s->o.fidelity)
        return lrmoe_err("score: weights are only read with fidelity");
    if (lrmoe_score_frame_w(f, s->index, &s->o, s->have_w ? &s->w : NULL, &s->wm, NULL) < 0)
        return -1;
    s->index++;
    return 0;
}

static const char *const wnames[3] = {"w_gate", "w_up", "w_down"};

/* w's frame for f's layer (checked at its first use, when w is mapped by
 * m) put into f for lrmoe_score_frame's fidelity */
static int add_weights(lrmoe_frame_t *f, const lrmoe_weights_t *w, const lrmoe_wmap_t *m)
{
    int64_t layer = 0;
    if (lrmoe_frame_attr(f, "layer") && lrmoe_frame_attr_i64(f, "layer", &layer) < 0)
        return -1;
    const lrmoe_frame_t *wf = lrmoe_weights_layer(w, layer);
    if (!wf)
        return lrmoe_err("--weights: no weights for layer %lld", (long long)layer);
    if (lrmoe_weights_use_tensors(m, w, wf, wnames, 3) < 0)
        return lrmoe_err_prefix("--weights");
    for (int i = 0; i < 3; i++) {
        if (lrmoe_frame_get(f, wnames[i]))
            return lrmoe_err("--weights: the frame already has a tensor %s", wnames[i]);
        const lrmoe_tensor_t *t = lrmoe_frame_need(wf, wnames[i]);
        lrmoe_tensor_t *c = t ? lrmoe_frame_put(f, wnames[i], t->dtype, t->ndim, t->shape) : NULL;
        if (!c)
            return -1;
        if (t->nbytes)
            memcpy(c->data, t->data, t->nbytes);
    }
    return 0;
}

int lrmoe_score_frame_w(lrmoe_frame_t *f, uint64_t index, const lrmoe_score_opts_t *o,
                        const lrmoe_weights_t *w, const lrmoe_wmap_t *m,
                        lrmoe_score_stats_t *st)
{
    lrmoe_score_stats_t local;
    if (w && add_weights(f, w, m) < 0)
        return -1;
    int rc = lrmoe_score_frame(f, index, o, st ? st : &local);
    if (w)
        for (int i = 0; i < 3; i++)
            lrmoe_frame_del(f, wnames[i]);
    return rc;
}

/* ---------------------------------------------------------------- pack */

struct lrmoe_pack {
    lrmoe_pack_opts_t o;
    unsigned flags;
};

lrmoe_pack_t *lrmoe_pack_new(void)
{
    lrmoe_pack_t *p = calloc(1, sizeof *p);
    if (!p) {
        lrmoe_err("out of memory");
        return NULL;
    }
    lrmoe_pack_opts_default(&p->o);
    return p;
}

void lrmoe_pack_free(lrmoe_pack_t *p) { free(p); }

int lrmoe_pack_set(lrmoe_pack_t *p, const char *name, const char *value)
{
    static const char *const names[] = {"alloc", "ranks", "threads", "strip!", "layout-only!",
                                        NULL};
    if (!p) return lrmoe_err("pack: no handle");
    if (lrmoe_parse_opt_name("pack", names, name, value) < 0) return -1;
    if (is(name, "alloc")) {
        if (is(value, "auto")) p->o.alloc = LRMOE_PACK_ALLOC_AUTO;
        else if (is(value, "plan")) p->o.alloc = LRMOE_PACK_ALLOC_PLAN;
        else if (is(value, "forward")) p->o.alloc = LRMOE_PACK_ALLOC_FORWARD;
        else return lrmoe_err("alloc: '%s' is not auto, plan or forward", value);
        return 0;
    }
    if (is(name, "ranks")) return lrmoe_parse_int("ranks", value, 1, 1 << 20, &p->o.P);
    if (is(name, "threads")) return lrmoe_parse_int("threads", value, 1, 4096, &p->o.threads);
    if (is(name, "strip")) {
        p->o.strip = 1;
        return 0;
    }
    p->flags |= LRMOE_PACK_LAYOUT_ONLY; /* layout-only */
    return 0;
}

int lrmoe_pack_run(lrmoe_pack_t *p, lrmoe_frame_t *f)
{
    if (!p || !f) return lrmoe_err("pack: no handle or no frame");
    return lrmoe_pack_frame_x(f, &p->o, p->flags);
}
