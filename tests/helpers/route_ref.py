#!/usr/bin/env python3
"""Independent NumPy (float64) reference for lrmoe-route, and test inputs.

    route_ref.py gen OUT --tokens T --experts E [--kind random|ties|extreme|inf|mix]
                 [--dtype F32|BF16] [--frames N] [--seed S] [--bias]
                 [--hidden D] [--nan FRAME,TOKEN,EXPERT]
    route_ref.py genw OUT --experts E --dim D [--layers L] [--bias] [--seed S]
    route_ref.py check IN OUT [-k K] [--router R] [--renorm] [--scale S]
                 [--groups G --topk-groups M] [--ep P] [--weights W]
                 [--from-hidden] [--stats TSV]

`check` routes every frame of IN itself and compares with what lrmoe-route
wrote to OUT: topk_ids and expert_load (and rank_load) exactly, topk_weights
within 1e-6 + 1e-5*|ref|, the route.* attributes and the --stats TSV; it
prints the first difference and exits 1. Everything here is written from the
router definitions in lrmoe-route(1), not from lib/route.c: selection is a
stable argsort (equal scores keep the lower expert first) over float64
scores.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lrmoe_stream import bf16_to_f32, f32_to_bf16, read_stream, write_stream  # noqa: E402

ATOL, RTOL = 1e-6, 1e-5


# ------------------------------------------------------------------ reference

def as_f64(arr, dtype):
    if dtype == "BF16":
        return bf16_to_f32(arr).astype(np.float64)
    return np.asarray(arr).astype(np.float64)


def top_order(score, k):
    """Indices of the k largest scores per row; ties keep the lower index."""
    return np.argsort(-score, axis=1, kind="stable")[:, :k]


def softmax_rows(x):
    """Row softmax in float64; rows with +inf share the mass among the +inf."""
    out = np.empty_like(x)
    m = x.max(axis=1)
    for t in range(x.shape[0]):
        if np.isposinf(m[t]):
            inf = np.isposinf(x[t])
            out[t] = inf / inf.sum()
        else:
            e = np.exp(x[t] - m[t])
            out[t] = e / e.sum()
    return out


def sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def route(x, k, router, renorm=False, scale=1.0, bias=None, groups=0, topk_groups=0):
    """x: (T,E) float64 logits. Returns ids (T,K), weights (T,K)."""
    T, E = x.shape
    if np.isnan(x).any():
        raise ValueError("NaN")
    if router in ("softmax", "topk-softmax"):
        if T and np.isneginf(x.max(axis=1)).any():
            raise ValueError("all -inf")
        ids = top_order(x, k)
        sel = np.take_along_axis(x, ids, axis=1)
        if router == "softmax":
            p = softmax_rows(x)
            w = np.take_along_axis(p, ids, axis=1)
            if renorm:
                w = w / w.sum(axis=1, keepdims=True)
        else:
            w = softmax_rows(sel)
    else:
        s = sigmoid(x)
        key = s + (bias if bias is not None else 0.0)
        if groups > 1:
            gsize = E // groups
            kg = np.sort(key.reshape(T, groups, gsize), axis=2)[:, :, ::-1]
            gscore = kg[:, :, :2].sum(axis=2)
            gsel = top_order(gscore, topk_groups)
            allow = np.zeros((T, groups), bool)
            np.put_along_axis(allow, gsel, True, axis=1)
            key = np.where(np.repeat(allow, gsize, axis=1), key, -np.inf)
        ids = top_order(key, k)
        w = np.take_along_axis(s, ids, axis=1)
        if renorm:
            w = w / (w.sum(axis=1, keepdims=True) + 1e-20)
    return ids, w * scale


# ------------------------------------------------------------------ inputs

def make_logits(rng, T, E, kind):
    if kind == "random":
        return rng.normal(0, 3, (T, E)).astype(np.float32)
    if kind == "ties":  # few distinct values: many exact ties
        return rng.integers(-2, 3, (T, E)).astype(np.float32)
    if kind in ("extreme", "inf"):
        pool = np.array([0.0, 1e-30, -1e-30, 1e-42, -1e-42, 1e30, -1e30, 3e38,
                         -3e38, -np.inf, 1.0, -1.0, 40.0, 50.0, -745.5, -800.0,
                         88.0, -88.0, 1e-7, 0.5], np.float32)
        if kind == "inf":
            pool = np.append(pool, np.float32(np.inf))
        x = rng.choice(pool, (T, E)).astype(np.float32)
        x += (rng.random((T, E)) < 0.3) * rng.normal(0, 1, (T, E)).astype(np.float32)
        for t in range(T):  # keep one finite logit per token
            if np.isneginf(x[t]).all():
                x[t, 0] = 0.0
        return x
    raise SystemExit("unknown kind " + kind)


def cmd_gen(a):
    rng = np.random.default_rng(a.seed)
    frames = []
    for i in range(a.frames):
        tens, dts = {}, {}
        if a.hidden:
            h = rng.integers(-2, 3, (a.tokens, a.hidden)).astype(np.float32)
            tens["hidden"] = f32_to_bf16(h) if a.dtype == "BF16" else h
            dts["hidden"] = a.dtype
        else:
            kind = a.kind
            if kind == "mix":  # frames cycle through the kinds
                kind = ("random", "ties", "extreme")[i % 3]
            x = make_logits(rng, a.tokens, a.experts, kind)
            if a.nan:
                f, t, e = (int(v) for v in a.nan.split(","))
                if f == i:
                    x[t, e] = np.nan
            tens["router_logits"] = f32_to_bf16(x) if a.dtype == "BF16" else x
            dts["router_logits"] = a.dtype
        if a.bias:
            tens["expert_bias"] = rng.normal(0, 0.05, a.experts).astype(np.float32)
        tens["grad_output"] = rng.normal(0, 1, (a.tokens, 2)).astype(np.float32)
        frames.append((tens, {"layer": i % 2, "step": i // 2, "model": "test"}, dts))
    write_stream(a.out, frames)


def cmd_genw(a):
    rng = np.random.default_rng(a.seed)
    frames = []
    for layer in range(a.layers):
        tens = {"router_weight": (rng.integers(-8, 9, (a.experts, a.dim)) / 4.0)
                .astype(np.float32)}
        if a.bias:
            tens["expert_bias"] = rng.normal(0, 0.05, a.experts).astype(np.float32)
        frames.append((tens, {"layer": layer}))
    write_stream(a.out, frames)


# ------------------------------------------------------------------ check

def fail(msg):
    print("route_ref: " + msg, file=sys.stderr)
    sys.exit(1)


def load_stats(x):
    n = len(x)
    total = int(x.sum())
    mean = total / n if n else 0.0
    mx = int(x.max()) if n else 0
    return mx, mean, (mx / mean if mean > 0 else 0.0), total


def cmd_check(a):
    fin = read_stream(a.input, with_dtypes=True)
    fout = read_stream(a.output, with_dtypes=True)
    if len(fin) != len(fout):
        fail("frame count %d != %d" % (len(fout), len(fin)))
    wts = {}
    if a.weights:
        for t, at in read_stream(a.weights):
            wts[int(at.get("layer", len(wts)))] = t
    rows = []
    for i, ((ti, ai, di), (to, ao, do)) in enumerate(zip(fin, fout)):
        wt = None
        if a.weights:
            wt = wts[int(ai["layer"])] if "layer" in ai else next(iter(wts.values()))
        if "router_logits" in ti and not a.from_hidden:
            x = as_f64(ti["router_logits"], di["router_logits"])
            # the tool widens to F32: so does the reference, exactly
            x = x.astype(np.float32).astype(np.float64)
        else:
            h = as_f64(ti["hidden"], di["hidden"])
            x = h @ wt["router_weight"].astype(np.float64).T
        bias = None
        if a.router == "sigmoid":
            b = ti.get("expert_bias")
            if b is None and wt is not None:
                b = wt.get("expert_bias")
            bias = None if b is None else b.astype(np.float64)
        ids, w = route(x, a.k, a.router, a.renorm, a.scale, bias, a.groups, a.topk_groups)
        T, E = x.shape
        got_ids = to["topk_ids"]
        if do["topk_ids"] != "I32" or do["topk_weights"] != "F32" or do["expert_load"] != "I64":
            fail("frame %d: output dtypes %s" % (i, do))
        if got_ids.shape != (T, a.k):
            fail("frame %d: topk_ids shape %s" % (i, got_ids.shape))
        bad = np.argwhere(got_ids != ids)
        if len(bad):
            t = bad[0][0]
            fail("frame %d token %d: ids %s, reference %s (logits %s)" %
                 (i, t, got_ids[t].tolist(), ids[t].tolist(), x[t].tolist()[:32]))
        gw = to["topk_weights"].astype(np.float64)
        err = np.abs(gw - w) > ATOL + RTOL * np.abs(w)
        if err.any():
            t = np.argwhere(err)[0][0]
            fail("frame %d token %d: weights %s, reference %s" %
                 (i, t, gw[t].tolist(), w[t].tolist()))
        load = np.bincount(ids.ravel(), minlength=E).astype(np.int64)
        if not np.array_equal(to["expert_load"], load):
            fail("frame %d: expert_load %s, reference %s" %
                 (i, to["expert_load"].tolist(), load.tolist()))
        # pass-through: every input tensor and attribute unchanged
        for name, arr in ti.items():
            if name not in to or to[name].tobytes() != arr.tobytes() or do[name] != di[name]:
                fail("frame %d: tensor %s not passed through" % (i, name))
        for key, val in ai.items():
            if ao.get(key) != val:
                fail("frame %d: attribute %s not passed through" % (i, key))
        emx, emean, eimb, total = load_stats(load)
        want = {"route.router": a.router, "route.topk": str(a.k),
                "route.expert_max": str(emx)}
        for key, val in want.items():
            if ao.get(key) != val:
                fail("frame %d: %s=%r, expected %r" % (i, key, ao.get(key), val))
        if abs(float(ao["route.expert_imbalance"]) - eimb) > 1e-5:
            fail("frame %d: route.expert_imbalance %s, reference %.6f" %
                 (i, ao["route.expert_imbalance"], eimb))
        rank = None
        if a.ep:
            rl = load.reshape(a.ep, E // a.ep).sum(axis=1)
            if not np.array_equal(to.get("rank_load"), rl):
                fail("frame %d: rank_load %s, reference %s" %
                     (i, to.get("rank_load"), rl.tolist()))
            rank = load_stats(rl)
            if abs(float(ao["route.rank_imbalance"]) - rank[2]) > 1e-5:
                fail("frame %d: route.rank_imbalance %s, reference %.6f" %
                     (i, ao["route.rank_imbalance"], rank[2]))
        elif "rank_load" in to:
            fail("frame %d: rank_load without --ep" % i)
        hot = np.argsort(-load, kind="stable")[:3]
        rows.append((i, ai.get("layer", "NA"), ai.get("step", "NA"), T, E, a.k, total,
                     emx, emean, eimb, rank, [(int(h), load[h] / total) for h in hot]))
    if a.stats:
        check_stats(a, rows)
    print("route_ref: %d frames match" % len(fin))


def check_stats(a, rows):
    lines = open(a.stats).read().splitlines()
    head = lines[0].split("\t")
    if head[:4] != ["frame", "layer", "step", "tokens"] or len(lines) != len(rows) + 1:
        fail("stats: header %s, %d rows for %d frames" % (head, len(lines) - 1, len(rows)))
    for line, r in zip(lines[1:], rows):
        c = dict(zip(head, line.split("\t")))
        i, layer, step, T, E, K, total, emx, emean, eimb, rank, hot = r
        exact = {"frame": str(i), "layer": str(layer), "step": str(step), "tokens": str(T),
                 "experts": str(E), "topk": str(K), "pairs": str(total),
                 "expert_max": str(emx)}
        for key, val in exact.items():
            if c.get(key) != val:
                fail("stats frame %d: %s=%r, expected %r" % (i, key, c.get(key), val))
        near = {"expert_mean": emean, "expert_imbalance": eimb}
        if rank:
            near.update(rank_mean=rank[1], rank_imbalance=rank[2])
            if c["rank_max"] != str(rank[0]) or c["ranks"] != str(a.ep):
                fail("stats frame %d: rank columns %s" % (i, line))
        elif c["rank_imbalance"] != "NA":
            fail("stats frame %d: rank_imbalance without --ep" % i)
        for j, (e, share) in enumerate(hot, 1):
            if c["hot%d" % j] != str(e):
                fail("stats frame %d: hot%d=%s, expected %d" % (i, j, c["hot%d" % j], e))
            near["hot%d_share" % j] = share
        for key, val in near.items():
            if abs(float(c[key]) - val) > 1e-5:
                fail("stats frame %d: %s=%s, expected %.6f" % (i, key, c[key], val))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("out")
    g.add_argument("--tokens", type=int, required=True)
    g.add_argument("--experts", type=int, required=True)
    g.add_argument("--kind", default="random")
    g.add_argument("--dtype", default="F32")
    g.add_argument("--frames", type=int, default=1)
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--bias", action="store_true")
    g.add_argument("--hidden", type=int, default=0)
    g.add_argument("--nan")
    w = sub.add_parser("genw")
    w.add_argument("out")
    w.add_argument("--experts", type=int, required=True)
    w.add_argument("--dim", type=int, required=True)
    w.add_argument("--layers", type=int, default=1)
    w.add_argument("--bias", action="store_true")
    w.add_argument("--seed", type=int, default=2)
    c = sub.add_parser("check")
    c.add_argument("input")
    c.add_argument("output")
    c.add_argument("-k", "--topk", dest="k", type=int, default=8)
    c.add_argument("-r", "--router", default="softmax")
    c.add_argument("-n", "--renorm", action="store_true")
    c.add_argument("--scale", type=float, default=1.0)
    c.add_argument("-G", "--groups", type=int, default=0)
    c.add_argument("--topk-groups", type=int, default=0)
    c.add_argument("-P", "--ranks", "--ep", dest="ep", type=int, default=0)
    c.add_argument("-w", "--weights")
    c.add_argument("--from-hidden", action="store_true")
    c.add_argument("-S", "--stats")
    c.add_argument("-@", "--threads", help="ignored (the output must not depend on it)")
    a = p.parse_args()
    if a.cmd == "gen":
        cmd_gen(a)
    elif a.cmd == "genw":
        cmd_genw(a)
    else:
        if a.router == "gpt-oss":
            a.router = "topk-softmax"
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            cmd_check(a)


if __name__ == "__main__":
    main()
