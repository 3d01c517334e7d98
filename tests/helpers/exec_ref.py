#!/usr/bin/env python3
"""Independent float64 NumPy reference for lrmoe-exec (tests only).

Subcommands (streams are read/written with lrmoe_stream.py):
  make OUT WEIGHTS [--T --E --K --D --F --seed --dtype f32|bf16 --layers N
                    --zero-experts N --skew X]
        a routed input stream (hidden, router_logits, topk_ids, topk_weights,
        grad_output, attr layer) and its weights stream (w_gate, w_up, w_down)
  plan IN OUT --P P [--seed S] [--replicas]
        add a plan (placement, fwd_alloc, quota=n_e, bwd_alloc=fwd_alloc) with
        random replicas and a random split of every expert over its instances
  keep IN OUT [--rate R] [--seed S] [--ones]
        add a random keep [T,K] U8
  pack IN OUT --P P [--scatter SEED]
        add the packed tensors of lrmoe-pack (CONTRACT.md) built here: every
        retained pair on its forward rank, or (--scatter) on a random rank
        holding an instance of its expert
  check-fwd OUT WEIGHTS [--P P] [--tol X]
        compare a forward output stream with the reference (output, phi_sqnorm,
        saved_gate, saved_up, pair_out, pair_rank and its per-rank counts)
  check-bwd OUT WEIGHTS [--mode full|masked|compact] [--tol X]
        compare a backward output stream with the reference (masked/compact:
        dW and dx over the retained pairs only; router gradient over all)
  compare A B NAME... [--tol X]
        two streams' tensors agree within relative tolerance (max|a-b|/max|b|)
  fd WEIGHTS IN
        finite-difference check of the reference backward on the first frame
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lrmoe_stream import bf16_to_f32, f32_to_bf16, read_stream, write_stream  # noqa: E402


def f64(a, dt):
    if dt == "BF16":
        return bf16_to_f32(a).astype(np.float64)
    return np.asarray(a, dtype=np.float64)


def store(a, dt):
    """float array -> (array, dtype name) in storage dtype dt ('F32'/'BF16')."""
    a = np.asarray(a, dtype=np.float32)
    return (f32_to_bf16(a), "BF16") if dt == "BF16" else (a, "F32")


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# ------------------------------------------------------------- reference math

def forward(x, ids, alpha, wg, wu, wd):
    """x (T,D), ids (T,K), alpha (T,K), wg/wu (E,F,D), wd (E,D,F); float64."""
    T, K = ids.shape
    D, F = x.shape[1], wg.shape[1]
    hg = np.zeros((T, K, F)); hu = np.zeros((T, K, F)); y = np.zeros((T, K, D))
    for e in np.unique(ids):
        t, k = np.nonzero(ids == e)
        xe = x[t]
        g = xe @ wg[e].T
        u = xe @ wu[e].T
        phi = g * sigmoid(g) * u
        hg[t, k], hu[t, k], y[t, k] = g, u, phi @ wd[e].T
    phi = hg * sigmoid(hg) * hu
    out = np.einsum("tk,tkd->td", alpha, y)
    return dict(output=out, saved_gate=hg, saved_up=hu, pair_out=y,
                phi_sqnorm=(phi ** 2).sum(-1))


def backward(x, ids, alpha, wg, wu, wd, g, keep=None):
    """Gradients of L = sum(g * out); keep (T,K) restricts dx/dW to retained pairs."""
    E = wg.shape[0]
    fw = forward(x, ids, alpha, wg, wu, wd)
    hg, hu, y = fw["saved_gate"], fw["saved_up"], fw["pair_out"]
    w = alpha if keep is None else alpha * (keep != 0)
    dy = w[:, :, None] * g[:, None, :]                  # (T,K,D)
    dwg = np.zeros_like(wg); dwu = np.zeros_like(wu); dwd = np.zeros_like(wd)
    dx = np.zeros_like(x)
    for e in range(E):
        t, k = np.nonzero(ids == e)
        if len(t) == 0:
            continue
        d = dy[t, k]
        a, b = hg[t, k], hu[t, k]
        s = sigmoid(a)
        phi = a * s * b
        dphi = d @ wd[e]
        dgate = dphi * b * s * (1 + a * (1 - s))
        dup = dphi * a * s
        dwd[e] = d.T @ phi
        dwg[e] = dgate.T @ x[t]
        dwu[e] = dup.T @ x[t]
        np.add.at(dx, t, dgate @ wg[e] + dup @ wu[e])
    return dict(grad_hidden=dx, grad_w_gate=dwg, grad_w_up=dwu, grad_w_down=dwd,
                grad_topk_weights=np.einsum("td,tkd->tk", g, y))


def native(e, E, P):
    return ((e + 1) * P - 1) // E


def assign(ids, E, P, fwd_alloc=None):
    """The documented rule: per expert, pairs in ascending u; native first,
    then the other ranks in ascending order."""
    flat = ids.reshape(-1)
    pr = np.empty(flat.shape, dtype=np.int32)
    for e in range(E):
        us = np.nonzero(flat == e)[0]
        nat = native(e, E, P)
        if fwd_alloc is None:
            pr[us] = nat
            continue
        order = [nat] + [p for p in range(P) if p != nat]
        pos = 0
        for p in order:
            c = int(fwd_alloc[e, p])
            pr[us[pos:pos + c]] = p
            pos += c
        assert pos == len(us)
    return pr.reshape(ids.shape)


# ------------------------------------------------------------- stream helpers

def load_weights(path):
    out = {}
    for i, (t, a, d) in enumerate(read_stream(path, with_dtypes=True)):
        layer = int(a.get("layer", i))
        out[layer] = {n: f64(t[n], d[n]) for n in ("w_gate", "w_up", "w_down")}
    return out


def frame_inputs(t, d):
    return (f64(t["hidden"], d["hidden"]), t["topk_ids"].astype(np.int64),
            t["topk_weights"].astype(np.float64))


def relerr(a, b):
    a = np.asarray(a, dtype=np.float64); b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return np.inf
    if a.size == 0:
        return 0.0
    den = max(np.abs(b).max(), 1e-30)
    return float(np.abs(a - b).max() / den)


def check(name, got, ref, tol, fails):
    e = relerr(got, ref)
    ok = e <= tol
    print(f"{name:20s} relerr {e:.3e} (tol {tol:g}) {'ok' if ok else 'FAIL'}")
    if not ok:
        fails.append(name)


# ------------------------------------------------------------- subcommands

def cmd_make(o):
    rng = np.random.default_rng(o.seed)
    T, E, K, D, F = o.T, o.E, o.K, o.D, o.F
    dt = o.dtype.upper()
    frames, wframes = [], []
    for layer in range(o.layers):
        wg = rng.standard_normal((E, F, D)) / np.sqrt(D)
        wu = rng.standard_normal((E, F, D)) / np.sqrt(D)
        wd = rng.standard_normal((E, D, F)) / np.sqrt(F)
        ws, wdt = {}, {}
        for n, v in (("w_gate", wg), ("w_up", wu), ("w_down", wd)):
            ws[n], wdt[n] = store(v, dt)
        wframes.append((ws, {"layer": layer}, wdt))
        x = rng.standard_normal((T, D))
        g = rng.standard_normal((T, D)) * np.exp(0.5 * rng.standard_normal((T, 1)))
        logits = rng.standard_normal((T, E))
        # skew: expert popularity; the last zero_experts experts never chosen
        logits += o.skew * np.linspace(1, 0, E)[None, :]
        if o.zero_experts:
            logits[:, E - o.zero_experts:] = -1e9
        ids = np.argsort(-logits, axis=1, kind="stable")[:, :K].astype(np.int32)
        sel = np.take_along_axis(logits, ids, 1)
        p = np.exp(sel - sel.max(1, keepdims=True))
        alpha = (p / p.sum(1, keepdims=True)).astype(np.float32)
        t, d = {}, {}
        t["hidden"], d["hidden"] = store(x, dt)
        t["router_logits"], d["router_logits"] = store(np.clip(logits, -1e4, 1e4), "F32")
        t["topk_ids"], d["topk_ids"] = ids, "I32"
        t["topk_weights"], d["topk_weights"] = alpha, "F32"
        t["grad_output"], d["grad_output"] = store(g, dt)
        load = np.bincount(ids.reshape(-1), minlength=E).astype(np.int64)
        t["expert_load"], d["expert_load"] = load, "I64"
        frames.append((t, {"layer": layer, "step": 0}, d))
    write_stream(o.out, frames)
    write_stream(o.weights, wframes)


def cmd_plan(o):
    rng = np.random.default_rng(o.seed)
    frames = []
    for t, a, d in read_stream(o.inp, with_dtypes=True):
        ids = t["topk_ids"]
        E = t["router_logits"].shape[1]
        P = o.P
        load = np.bincount(ids.reshape(-1), minlength=E)
        pl = np.zeros((E, P), dtype=np.uint8)
        fa = np.zeros((E, P), dtype=np.int64)
        for e in range(E):
            pl[e, native(e, E, P)] = 1
            if o.replicas and P > 1:
                extra = rng.choice(P, size=rng.integers(0, P), replace=False)
                pl[e, extra] = 1
            ranks = np.nonzero(pl[e])[0]
            fa[e, ranks] = rng.multinomial(load[e], np.ones(len(ranks)) / len(ranks))
        t = dict(t); d = dict(d)
        t["placement"], d["placement"] = pl, "U8"
        t["fwd_alloc"], d["fwd_alloc"] = fa, "I64"
        t["quota"], d["quota"] = load.astype(np.int64), "I64"
        t["bwd_alloc"], d["bwd_alloc"] = fa.copy(), "I64"
        a = dict(a); a["plan.planner"] = "test-random"
        frames.append((t, a, d))
    write_stream(o.out, frames)


def cmd_keep(o):
    rng = np.random.default_rng(o.seed)
    frames = []
    for t, a, d in read_stream(o.inp, with_dtypes=True):
        shape = t["topk_ids"].shape
        k = np.ones(shape, np.uint8) if o.ones else (rng.random(shape) < o.rate).astype(np.uint8)
        t = dict(t); d = dict(d)
        t["keep"], d["keep"] = k, "U8"
        frames.append((t, a, d))
    write_stream(o.out, frames)


def cmd_pack(o):
    rng = np.random.default_rng(o.scatter if o.scatter is not None else 0)
    frames = []
    for t, a, d in read_stream(o.inp, with_dtypes=True):
        ids = t["topk_ids"].reshape(-1).astype(np.int64)
        T, K = t["topk_ids"].shape
        D = t["hidden"].shape[1]
        F = t["saved_gate"].shape[2]
        E = t["router_logits"].shape[1] if "router_logits" in t else int(ids.max()) + 1
        P = o.P
        keep = t["keep"].reshape(-1)
        prank = t["pair_rank"].reshape(-1)
        us = np.nonzero(keep)[0]
        ranks = prank[us].astype(np.int64)
        if o.scatter is not None:
            for j, u in enumerate(us):
                e = ids[u]
                cand = np.nonzero(t["placement"][e])[0] if "placement" in t else [native(e, E, P)]
                ranks[j] = rng.choice(cand)
        order = np.lexsort((us, ids[us], ranks))      # rank, expert, u
        us, ranks = us[order], ranks[order]
        counts = np.zeros((P, E), np.int64)
        np.add.at(counts, (ranks, ids[us]), 1)
        offsets = (np.cumsum(counts.reshape(-1)) - counts.reshape(-1)).reshape(P, E)
        gdt = d["grad_output"]
        g = f64(t["grad_output"], gdt).astype(np.float32)
        alpha = t["topk_weights"].reshape(-1)
        tok = us // K
        t = dict(t); d = dict(d)
        t["pack_pair"], d["pack_pair"] = us.astype(np.int64), "I64"
        t["pack_rank"], d["pack_rank"] = ranks.astype(np.int32), "I32"
        t["pack_counts"], d["pack_counts"] = counts, "I64"
        t["pack_offsets"], d["pack_offsets"] = offsets.astype(np.int64), "I64"
        t["pack_grad"], d["pack_grad"] = (alpha[us, None] * g[tok]).astype(np.float32), "F32"
        t["pack_hidden"], d["pack_hidden"] = t["hidden"][tok], d["hidden"]
        t["pack_gate"], d["pack_gate"] = t["saved_gate"].reshape(T * K, F)[us], d["saved_gate"]
        t["pack_up"], d["pack_up"] = t["saved_up"].reshape(T * K, F)[us], d["saved_up"]
        assert D == t["pack_hidden"].shape[1]
        frames.append((t, a, d))
    write_stream(o.out, frames)


def cmd_check_fwd(o):
    W = load_weights(o.weights)
    fails = []
    for i, (t, a, d) in enumerate(read_stream(o.inp, with_dtypes=True)):
        w = W[int(a.get("layer", i))]
        x, ids, alpha = frame_inputs(t, d)
        ref = forward(x, ids, alpha, w["w_gate"], w["w_up"], w["w_down"])
        for n in ("output", "saved_gate", "saved_up", "pair_out", "phi_sqnorm"):
            check(f"[{i}] {n}", f64(t[n], d[n]), ref[n], o.tol, fails)
        E = w["w_gate"].shape[0]
        P = int(a["exec.ranks"])
        if o.P is not None and o.P != P:
            fails.append("exec.ranks")
        fa = t.get("fwd_alloc")
        pr = assign(ids, E, P, fa)
        if not np.array_equal(pr, t["pair_rank"]):
            print(f"[{i}] pair_rank differs from the assignment rule: FAIL")
            fails.append("pair_rank")
        if fa is not None:
            cnt = np.zeros((E, P), np.int64)
            np.add.at(cnt, (ids.reshape(-1), t["pair_rank"].reshape(-1)), 1)
            if not np.array_equal(cnt, fa):
                print(f"[{i}] per-rank counts differ from fwd_alloc: FAIL")
                fails.append("fwd_alloc")
    if fails:
        print("FAILED:", " ".join(fails))
        sys.exit(1)


def cmd_check_bwd(o):
    W = load_weights(o.weights)
    fails = []
    for i, (t, a, d) in enumerate(read_stream(o.inp, with_dtypes=True)):
        w = W[int(a.get("layer", i))]
        x, ids, alpha = frame_inputs(t, d)
        g = f64(t["grad_output"], d["grad_output"])
        keep = None
        if o.mode == "masked":
            keep = t["keep"]
        elif o.mode == "compact":
            keep = np.zeros(ids.size, np.uint8)
            keep[t["pack_pair"]] = 1
            keep = keep.reshape(ids.shape)
        ref = backward(x, ids, alpha, w["w_gate"], w["w_up"], w["w_down"], g, keep)
        for n in ("grad_hidden", "grad_w_gate", "grad_w_up", "grad_w_down", "grad_topk_weights"):
            check(f"[{i}] {n}", f64(t[n], d[n]), ref[n], o.tol, fails)
    if fails:
        print("FAILED:", " ".join(fails))
        sys.exit(1)


def cmd_compare(o):
    A = read_stream(o.a, with_dtypes=True)
    B = read_stream(o.b, with_dtypes=True)
    fails = []
    if len(A) != len(B):
        print("frame counts differ: FAIL"); sys.exit(1)
    for i, ((ta, _, da), (tb, _, db)) in enumerate(zip(A, B)):
        for n in o.names:
            check(f"[{i}] {n}", f64(ta[n], da[n]), f64(tb[n], db[n]), o.tol, fails)
    if fails:
        print("FAILED:", " ".join(fails))
        sys.exit(1)


def cmd_fd(o):
    W = load_weights(o.weights)
    t, a, d = read_stream(o.inp, with_dtypes=True)[0]
    w = W[int(a.get("layer", 0))]
    x, ids, alpha = frame_inputs(t, d)
    g = f64(t["grad_output"], d["grad_output"])
    wg, wu, wd = w["w_gate"].copy(), w["w_up"].copy(), w["w_down"].copy()
    grads = backward(x, ids, alpha, wg, wu, wd, g)
    rng = np.random.default_rng(7)

    def loss():
        return float((g * forward(x, ids, alpha, wg, wu, wd)["output"]).sum())

    worst = 0.0
    for name, arr, gname in (("hidden", x, "grad_hidden"), ("w_gate", wg, "grad_w_gate"),
                             ("w_up", wu, "grad_w_up"), ("w_down", wd, "grad_w_down"),
                             ("topk_weights", alpha, "grad_topk_weights")):
        flat = arr.reshape(-1)
        gflat = grads[gname].reshape(-1)
        # probe coordinates with non-zero analytic gradient plus random ones
        idx = list(rng.choice(flat.size, size=min(6, flat.size), replace=False))
        nz = np.nonzero(gflat)[0]
        if nz.size:
            idx += list(rng.choice(nz, size=min(6, nz.size), replace=False))
        for j in idx:
            h = 1e-6 * max(1.0, abs(flat[j]))
            old = flat[j]
            flat[j] = old + h; lp = loss()
            flat[j] = old - h; lm = loss()
            flat[j] = old
            num = (lp - lm) / (2 * h)
            err = abs(num - gflat[j]) / max(1e-3, abs(num), abs(gflat[j]))
            worst = max(worst, err)
            if err > 1e-5:
                print(f"fd {name}[{j}]: numeric {num:.9g} analytic {gflat[j]:.9g}: FAIL")
                sys.exit(1)
    print(f"finite differences: worst relative error {worst:.2e} ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sp = ap.add_subparsers(dest="cmd", required=True)
    m = sp.add_parser("make")
    m.add_argument("out"); m.add_argument("weights")
    for k, v in (("T", 40), ("E", 8), ("K", 2), ("D", 16), ("F", 12), ("seed", 1),
                 ("layers", 1), ("zero_experts", 0)):
        m.add_argument("--" + k.replace("_", "-"), dest=k, type=int, default=v)
    m.add_argument("--skew", type=float, default=0.0)
    m.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    p = sp.add_parser("plan")
    p.add_argument("inp"); p.add_argument("out")
    p.add_argument("--P", type=int, required=True)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--replicas", action="store_true")
    k = sp.add_parser("keep")
    k.add_argument("inp"); k.add_argument("out")
    k.add_argument("--rate", type=float, default=0.7)
    k.add_argument("--seed", type=int, default=5)
    k.add_argument("--ones", action="store_true")
    pk = sp.add_parser("pack")
    pk.add_argument("inp"); pk.add_argument("out")
    pk.add_argument("--P", type=int, required=True)
    pk.add_argument("--scatter", type=int, default=None)
    cf = sp.add_parser("check-fwd")
    cf.add_argument("inp"); cf.add_argument("weights")
    cf.add_argument("--P", type=int, default=None)
    cf.add_argument("--tol", type=float, default=1e-4)
    cb = sp.add_parser("check-bwd")
    cb.add_argument("inp"); cb.add_argument("weights")
    cb.add_argument("--mode", default="full", choices=["full", "masked", "compact"])
    cb.add_argument("--tol", type=float, default=1e-4)
    c = sp.add_parser("compare")
    c.add_argument("a"); c.add_argument("b"); c.add_argument("names", nargs="+")
    c.add_argument("--tol", type=float, default=1e-5)
    f = sp.add_parser("fd")
    f.add_argument("weights"); f.add_argument("inp")
    o = ap.parse_args()
    {"make": cmd_make, "plan": cmd_plan, "keep": cmd_keep, "pack": cmd_pack,
     "check-fwd": cmd_check_fwd, "check-bwd": cmd_check_bwd, "compare": cmd_compare,
     "fd": cmd_fd}[o.cmd](o)


if __name__ == "__main__":
    main()
