#!/usr/bin/env python3
"""NumPy reference for lrmoe-score and lrmoe-pack (independent of liblrmoe).

    score_ref.py make OUT [--T N --K N --E N --D N --F N --P N --seed N
                           --dtype F32|BF16 --rate R --ties --noplan]
        a synthetic stream with everything score and pack read (forward
        state, a plan with replicas, quota and bwd_alloc at retention R).
    score_ref.py check-score IN OUT [--metric M --drop C --seed S --fidelity]
        pair_score, keep, quota, attributes and score_fidelity of OUT (the
        output of lrmoe-score on IN) against the reference.
    score_ref.py check-pack OUT [--alloc plan|forward]
        every pack_* tensor of OUT (the output of lrmoe-pack) against the
        reference assignment and gather, plus the minimal number of moves.
    score_ref.py check-unpack OUT [--pairs]
        `unpacked` of OUT (lrmoe-pack --unpack of a packed stream) bit for bit.
    score_ref.py corrupt IN OUT WHAT
        IN with one inconsistency: nophi nangrad nanphi bigquota keepmore
        keepless allocsum allocplace keepval duppair, and tensors with a
        dimension of 0 where it counts experts or ranks: emptyquota (quota
        of 0 experts, no bwd_alloc or placement), allocnoranks (bwd_alloc (E,0)), allocnoexperts (0,P), placenoranks (placement (E,0), no
        bwd_alloc), byranknoranks
        (allocnoranks with plan.keep=by-rank), hugeid (an id of 2^31-1 and
        no quota, bwd_alloc, placement or expert_load), allochuge (bwd_alloc rows
        of expert 0 summing past 2^63), byrankhuge (the same rows with
        plan.keep=by-rank).
    score_ref.py compare A B [--rtol R] [--differ]
        backward outputs (grad_*) of A and B equal up to summation order.
    score_ref.py fidelity IN
        print the reference fidelity of keep in IN (one line per frame).
Exit 0 when everything matches; otherwise a message on stderr and exit 1.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lrmoe_stream import bf16_to_f32, f32_to_bf16, read_stream, write_stream  # noqa: E402

M64 = (1 << 64) - 1


def fail(msg):
    print("score_ref: " + msg, file=sys.stderr)
    sys.exit(1)


def f32(t, dt):
    return bf16_to_f32(t) if dt == "BF16" else np.asarray(t, dtype=np.float32)


# ------------------------------------------------------------------ make

def make(a):
    rng = np.random.default_rng(a.seed)
    T, K, E, D, F, P = a.T, a.K, a.E, a.D, a.F, a.P
    frames = []
    for fi in range(a.frames):
        # skewed routing: a Zipf-like popularity, distinct experts per token
        pop = 1.0 / np.arange(1, E + 1) ** 0.8
        pop = rng.permutation(pop / pop.sum())
        # K distinct experts per token, weighted (Gumbel top-k)
        gum = np.log(pop)[None, :] - np.log(-np.log(rng.random((T, E))))
        ids = np.argsort(-gum, axis=1)[:, :K].astype(np.int32)
        w = rng.random((T, K)).astype(np.float32) + 0.05
        w = (w / w.sum(1, keepdims=True)).astype(np.float32)
        g = rng.standard_normal((T, D)).astype(np.float32) * \
            rng.lognormal(0, 0.7, (T, 1)).astype(np.float32)
        h = rng.standard_normal((T, D)).astype(np.float32)
        sg = rng.standard_normal((T, K, F)).astype(np.float32)
        su = (rng.standard_normal((T, K, F)) *
              rng.lognormal(0, 0.5, (T, K, 1))).astype(np.float32)
        if a.ties:
            # few distinct values: many exactly equal scores
            g = np.round(g).astype(np.float32)
            g[g == 0] = 1
            g = np.repeat(g[:1], T, 0) if a.ties > 1 else g
            w = np.full((T, K), 1.0 / K, np.float32)
            sg = np.repeat(sg[:1, :1], T, 0).repeat(K, 1)
            su = np.repeat(su[:1, :1], T, 0).repeat(K, 1)
            if a.ties == 1:
                su = su * np.round(rng.random((T, K, 1)) * 2 + 1).astype(np.float32)
        dt = a.dtype
        if dt == "BF16":
            store = f32_to_bf16
            g_s, h_s, sg_s, su_s = store(g), store(h), store(sg), store(su)
            g, h, sg, su = bf16_to_f32(g_s), bf16_to_f32(h_s), bf16_to_f32(sg_s), bf16_to_f32(su_s)
        else:
            g_s, h_s, sg_s, su_s = g, h, sg, su
        phi = (sg / (1 + np.exp(-sg.astype(np.float64)))) * su
        phisq = (phi.astype(np.float64) ** 2).sum(-1).astype(np.float32)
        # placement: native rank + one replica for the hottest experts
        native = np.array([(e * P) // E for e in range(E)])
        pl = np.zeros((E, P), np.uint8)
        pl[np.arange(E), native] = 1
        load = np.bincount(ids.ravel(), minlength=E)
        for e in np.argsort(-load)[:max(1, E // 4)]:
            pl[e, rng.integers(P)] = 1
        # forward rank: a random eligible instance of each pair's expert
        prank = np.empty(T * K, np.int32)
        for e in range(E):
            m = ids.ravel() == e
            el = np.flatnonzero(pl[e])
            prank[m] = el[rng.integers(len(el), size=int(m.sum()))]
        prank = prank.reshape(T, K)
        quota = np.array([n - int(np.floor(n * (1 - a.rate) + 1e-9)) for n in load],
                         np.int64)
        alloc = np.zeros((E, P), np.int64)
        for e in range(E):
            el = np.flatnonzero(pl[e])
            if quota[e]:
                alloc[e, el] = rng.multinomial(quota[e], np.ones(len(el)) / len(el))
        tens = {"topk_ids": ids, "topk_weights": w, "grad_output": g_s,
                "hidden": h_s, "saved_gate": sg_s, "saved_up": su_s,
                "phi_sqnorm": phisq, "pair_rank": prank,
                "expert_load": load.astype(np.int64)}
        if not a.noplan:
            tens.update({"placement": pl, "quota": quota, "bwd_alloc": alloc})
        dts = {n: "BF16" for n in ("grad_output", "hidden", "saved_gate", "saved_up")} \
            if dt == "BF16" else {}
        frames.append((tens, {"layer": str(fi), "step": "0"}, dts))
    write_stream(a.out, frames)


# ------------------------------------------------------------------ score

def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def ref_scores(t, d, metric, seed):
    T, K = t["topk_ids"].shape
    if metric == "random":
        s = np.empty(T * K, np.float32)
        for u in range(T * K):
            h = splitmix64(seed ^ (((u + 1) * 0xD1B54A32D192ED03) & M64))
            s[u] = np.float32(h >> 40) / np.float32(16777216.0)
        return s.reshape(T, K)
    g = f32(t["grad_output"], d["grad_output"]).astype(np.float64)
    if metric == "absgrad":
        gt = np.abs(g).sum(1)
    else:
        gt = (g * g).sum(1)
    if metric == "lrm":
        a = t["topk_weights"].astype(np.float64)
        s = a * a * gt[:, None] * t["phi_sqnorm"].astype(np.float64)
    else:
        s = np.repeat(gt[:, None], K, 1)
    return s.astype(np.float32)


def drop_quota(n, C):
    return n - int(np.floor(n * C / 100.0 + 1e-9))


def ref_keep(ids, score, quota):
    """Highest score first, then lower pair index, inside each expert."""
    u = np.arange(ids.size)
    e = ids.ravel()
    s = score.ravel().astype(np.float64)
    order = np.lexsort((u, -s, e))  # by expert, score desc, u asc
    keep = np.zeros(ids.size, np.uint8)
    start = 0
    for ex in range(len(quota)):
        n = int((e == ex).sum())
        keep[order[start:start + quota[ex]]] = 1
        start += n
    return keep.reshape(ids.shape)


def ref_fidelity(t, d, keep, E):
    ids = t["topk_ids"]
    T, K = ids.shape
    g = f32(t["grad_output"], d["grad_output"]).astype(np.float64)
    sg = f32(t["saved_gate"], d["saved_gate"]).astype(np.float64)
    su = f32(t["saved_up"], d["saved_up"]).astype(np.float64)
    phi = (sg / (1 + np.exp(-sg)) * su).reshape(T * K, -1)
    delta = (t["topk_weights"].astype(np.float64).reshape(-1, 1) *
             np.repeat(g, K, 0))
    err = np.zeros(E)
    tot_a = tot_d = 0.0
    for e in range(E):
        m = ids.ravel() == e
        if not m.any():
            continue
        G = delta[m].T @ phi[m]
        dm = m & (keep.ravel() == 0)
        Gd = delta[dm].T @ phi[dm]
        a2, d2 = (G * G).sum(), (Gd * Gd).sum()
        tot_a += a2
        tot_d += d2
        err[e] = np.sqrt(d2 / a2) if a2 > 0 else 0
    return err, (np.sqrt(tot_d / tot_a) if tot_a > 0 else 0.0)


def check_score(a):
    fin = read_stream(a.inp, with_dtypes=True)
    fout = read_stream(a.out, with_dtypes=True)
    if len(fin) != len(fout):
        fail("frame count %d != %d" % (len(fout), len(fin)))
    for i, ((t, at, d), (o, ao, do)) in enumerate(zip(fin, fout)):
        ids = t["topk_ids"]
        E = len(t["quota"]) if a.drop is None else \
            (len(t["expert_load"]) if "expert_load" in t else int(ids.max()) + 1)
        ref = ref_scores(t, d, a.metric, a.seed + i)
        got = o["pair_score"]
        if do["pair_score"] != "F32" or got.shape != ids.shape:
            fail("frame %d: pair_score %s %s" % (i, do["pair_score"], got.shape))
        if not np.allclose(got, ref, rtol=2e-6, atol=0):
            j = np.argmax(np.abs(got - ref) / np.maximum(np.abs(ref), 1e-30))
            fail("frame %d: pair_score[%d] = %r, reference %r" %
                 (i, j, got.flat[j], ref.flat[j]))
        load = np.bincount(ids.ravel(), minlength=E)
        if a.drop is None:
            quota = t["quota"]
        else:
            quota = np.array([drop_quota(int(n), a.drop) for n in load], np.int64)
            if not np.array_equal(o["quota"], quota):
                fail("frame %d: quota %s, expected %s" % (i, o["quota"], quota))
        # the keep mask must follow the documented order on the tool's scores
        # (exact), and agree with the reference scores except at near-ties
        k_exact = ref_keep(ids, got, quota)
        if do["keep"] != "U8" or not np.array_equal(o["keep"], k_exact):
            bad = np.flatnonzero(o["keep"].ravel() != k_exact.ravel())
            fail("frame %d: keep differs at %d pairs (first %s)" %
                 (i, len(bad), bad[:5].tolist()))
        k_ref = ref_keep(ids, ref, quota)
        if not np.array_equal(k_ref, k_exact):
            # allowed only where the two score sets round differently
            diff = np.flatnonzero(k_ref.ravel() != k_exact.ravel())
            s = ref.ravel()
            for u in diff:
                e = ids.flat[u]
                others = s[(ids.ravel() == e)]
                near = np.abs(others - s[u]) <= 4e-6 * max(abs(s[u]), 1e-30)
                if near.sum() < 2:
                    fail("frame %d: keep[%d] disagrees with the reference" % (i, u))
        kept = int(o["keep"].sum())
        if int(ao.get("score.kept", -1)) != kept:
            fail("frame %d: score.kept %s, counted %d" % (i, ao.get("score.kept"), kept))
        sd = got.astype(np.float64)
        share = sd[o["keep"] == 0].sum() / sd.sum() if sd.sum() > 0 else 0
        if abs(float(ao["score.dropped_share"]) - share) > 1e-5 * max(share, 1e-3):
            fail("frame %d: score.dropped_share %s, expected %.6g" %
                 (i, ao["score.dropped_share"], share))
        if abs(float(ao["score.retained"]) - kept / ids.size) > 2e-6:
            fail("frame %d: score.retained %s" % (i, ao["score.retained"]))
        if a.fidelity:
            err, tot = ref_fidelity(t, d, o["keep"], E)
            fe = o["score_fidelity"]
            if fe.shape != (E,) or not np.allclose(fe, err, rtol=2e-3, atol=1e-5):
                fail("frame %d: score_fidelity %s, reference %s" % (i, fe[:6], err[:6]))
            if abs(float(ao["score.fidelity"]) - tot) > 2e-3 * tot + 1e-6:
                fail("frame %d: score.fidelity %s, reference %.6g" %
                     (i, ao["score.fidelity"], tot))
        # everything else passes through untouched
        for n in t:
            if n not in ("quota",) and not np.array_equal(t[n], o[n]):
                fail("frame %d: tensor %s changed" % (i, n))
        for k, v in at.items():
            if ao.get(k) != v:
                fail("frame %d: attribute %s changed" % (i, k))
    print("score_ref: %d frames match" % len(fout))


# ------------------------------------------------------------------ pack

def ref_assign(t, alloc_mode):
    ids, keep = t["topk_ids"], t["keep"]
    T, K = ids.shape
    if "bwd_alloc" in t and alloc_mode != "forward":
        E, P = t["bwd_alloc"].shape
    else:
        E, P = t["placement"].shape
    prank = t["pair_rank"].ravel()
    kept = np.flatnonzero(keep.ravel())
    e_of = ids.ravel()
    if "bwd_alloc" in t and alloc_mode != "forward":
        rem = t["bwd_alloc"].astype(np.int64).copy()
    else:
        rem = np.zeros((E, P), np.int64)
        np.add.at(rem, (e_of[kept], prank[kept]), 1)
    alloc0 = rem.copy()
    dest = {}
    for u in kept:
        e, r = e_of[u], prank[u]
        if rem[e, r] > 0:
            rem[e, r] -= 1
            dest[u] = r
    moved = 0
    for u in kept:
        if u in dest:
            continue
        e = e_of[u]
        p = int(np.flatnonzero(rem[e] > 0)[0])
        rem[e, p] -= 1
        dest[u] = p
        moved += 1
    # the minimum possible number of moves, computed independently
    on = np.zeros((E, P), np.int64)
    np.add.at(on, (e_of[kept], prank[kept]), 1)
    minmoves = int(len(kept) - np.minimum(on, alloc0).sum())
    rows = sorted(kept, key=lambda u: (dest[u], e_of[u], u))
    counts = np.zeros((P, E), np.int64)
    for u in kept:
        counts[dest[u], e_of[u]] += 1
    offs = np.concatenate([[0], np.cumsum(counts.ravel())[:-1]]).reshape(P, E)
    return (np.array(rows, np.int64), np.array([dest[u] for u in rows], np.int32),
            counts, offs, moved, minmoves)


def check_pack(a):
    for i, (o, ao, do) in enumerate(read_stream(a.out, with_dtypes=True)):
        pair, rank, counts, offs, moved, minmoves = ref_assign(o, a.alloc)
        K = o["topk_ids"].shape[1]
        for n, ref in (("pack_pair", pair), ("pack_rank", rank),
                       ("pack_counts", counts), ("pack_offsets", offs)):
            if n not in o or not np.array_equal(o[n], ref) or o[n].dtype != ref.dtype:
                fail("frame %d: %s differs from the reference" % (i, n))
        if int(ao["pack.moved"]) != moved or moved != minmoves:
            fail("frame %d: pack.moved %s, reference %d, minimum %d" %
                 (i, ao["pack.moved"], moved, minmoves))
        if int(ao["pack.rows"]) != len(pair):
            fail("frame %d: pack.rows %s" % (i, ao["pack.rows"]))
        # plan: the counts realise bwd_alloc; forward: bwd_alloc is rewritten
        # to the realised allocation so the plan stays consistent
        if "bwd_alloc" in o and not np.array_equal(counts.T, o["bwd_alloc"]):
            fail("frame %d: counts do not equal bwd_alloc" % i)
        g = f32(o["grad_output"], do["grad_output"])
        alpha = o["topk_weights"].ravel()
        pg = alpha[pair][:, None] * g[pair // K]  # f32 * f32, like the tool
        if do["pack_grad"] != "F32" or not np.array_equal(o["pack_grad"], pg):
            fail("frame %d: pack_grad differs" % i)
        F = o["saved_gate"].shape[2]
        for n, src, idx in (("pack_hidden", o["hidden"], pair // K),
                            ("pack_gate", o["saved_gate"].reshape(-1, F), pair),
                            ("pack_up", o["saved_up"].reshape(-1, F), pair)):
            sn = {"pack_hidden": "hidden", "pack_gate": "saved_gate",
                  "pack_up": "saved_up"}[n]
            if do[n] != do[sn] or not np.array_equal(o[n], src[idx]):
                fail("frame %d: %s differs" % (i, n))
    print("score_ref: pack matches")


def check_unpack(a):
    for i, (o, ao, do) in enumerate(read_stream(a.out, with_dtypes=True)):
        T, K = o["topk_ids"].shape
        pair = o["pack_pair"]
        rows = f32(o[a.rows], do[a.rows])
        D = rows.shape[1]
        full = np.zeros((T * K, D), np.float32)
        full[pair] = rows
        if a.pairs:
            ref = full.reshape(T, K, D)
            # round trip: alpha*g on kept pairs, zero elsewhere
            if a.rows == "pack_grad":
                g = f32(o["grad_output"], do["grad_output"])
                al = o["topk_weights"]
                x = (al[:, :, None] * g[:, None, :]) * o["keep"][:, :, None]
                if not np.array_equal(x.astype(np.float32), ref):
                    fail("frame %d: round trip is not exact" % i)
        else:
            full = full.reshape(T, K, D)
            ref = np.zeros((T, D), np.float32)
            for k in range(K):  # ascending k, f32 adds: the documented order
                ref = ref + full[:, k, :]
        got = o[a.into]
        if do[a.into] != "F32" or got.shape != ref.shape or \
                not np.array_equal(got, ref):
            bad = np.argwhere(got != ref)[:3].tolist()
            fail("frame %d: %s differs at %s" % (i, a.into, bad))
    print("score_ref: unpack matches")


def fidelity(a):
    for i, (t, at, d) in enumerate(read_stream(a.inp, with_dtypes=True)):
        E = len(t["quota"]) if "quota" in t else int(t["topk_ids"].max()) + 1
        err, tot = ref_fidelity(t, d, t["keep"], E)
        print("%d %.6g" % (i, tot))


def corrupt(a):
    """Write IN with one inconsistency (for the bad-input tests)."""
    frames = read_stream(a.inp, with_dtypes=True)
    t, at, d = frames[0]
    t = {k: np.array(v) for k, v in t.items()}
    ids = t["topk_ids"]
    w = a.what
    if w == "nophi":
        del t["phi_sqnorm"]
    elif w == "nangrad":
        g = t["grad_output"]
        g.flat[len(g.ravel()) // 2] = 0x7FC0 if d["grad_output"] == "BF16" else np.nan
    elif w == "nanphi":
        t["phi_sqnorm"].flat[3] = np.nan
    elif w == "bigquota":
        load = np.bincount(ids.ravel(), minlength=len(t["quota"]))
        e = int(np.argmax(load))
        t["quota"][e] = load[e] + 1
    elif w == "keepmore":
        u = int(np.flatnonzero(t["keep"].ravel() == 0)[0])
        t["keep"].flat[u] = 1
    elif w == "keepless":
        u = int(np.flatnonzero(t["keep"].ravel() == 1)[0])
        t["keep"].flat[u] = 0
        del t["quota"]
    elif w == "allocsum":
        e = int(np.argmax(t["bwd_alloc"].sum(1)))
        p = int(np.flatnonzero(t["placement"][e])[0])
        t["bwd_alloc"][e, p] += 1
    elif w == "allocplace":
        e = int(np.argmax(t["bwd_alloc"].sum(1)))
        p = int(np.flatnonzero(t["bwd_alloc"][e])[0])
        q = int(np.flatnonzero(t["placement"][e] == 0)[0])
        t["bwd_alloc"][e, p] -= 1
        t["bwd_alloc"][e, q] += 1
    elif w == "emptyquota":      # no experts: 0 entries, the only tensor giving E
        t["quota"] = t["quota"][:0]
        for n in ("bwd_alloc", "placement"):
            t.pop(n, None)
    elif w == "allocnoranks":    # (E, 0)
        t["bwd_alloc"] = t["bwd_alloc"][:, :0]
    elif w == "allocnoexperts":  # (0, P)
        t["bwd_alloc"] = t["bwd_alloc"][:0]
    elif w == "placenoranks":    # placement (E, 0), no bwd_alloc
        t["placement"] = t["placement"][:, :0]
        del t["bwd_alloc"]
    elif w == "hugeid":          # an id of 2^31-1, and no tensor that says E
        t["topk_ids"] = t["topk_ids"].astype(np.int32)
        t["topk_ids"].flat[5] = 2**31 - 1
        for n in ("quota", "bwd_alloc", "placement", "expert_load", "fwd_alloc"):
            t.pop(n, None)
    elif w == "allochuge":       # expert 0: 2^63-1 rows on rank 0 and 2 on rank 1
        t["placement"][0, :] = 1
        t["bwd_alloc"][0, 0] = 2**63 - 1
        t["bwd_alloc"][0, 1] = 2
    elif w == "byrankhuge":      # allochuge where lrmoe-score keeps by rank
        t["bwd_alloc"][0, 0] = 2**63 - 1
        t["bwd_alloc"][0, 1] = 2
        at["plan.keep"] = "by-rank"
    elif w == "byranknoranks":   # (E, 0) where lrmoe-score keeps by rank
        t["bwd_alloc"] = t["bwd_alloc"][:, :0]
        at["plan.keep"] = "by-rank"
    elif w == "keepval":
        t["keep"].flat[0] = 2
    elif w == "duppair":
        t["pack_pair"][1] = t["pack_pair"][0]
    else:
        fail("unknown corruption " + w)
    frames[0] = (t, at, d)
    write_stream(a.out, frames)


GRADS = ("grad_hidden", "grad_w_gate", "grad_w_up", "grad_w_down",
         "grad_topk_weights")


def compare(a):
    """Backward outputs of A and B equal up to summation order
    (|a-b| <= rtol * max|a| per tensor); with --differ, A and B must
    differ in dW_down by more than that (the test can tell them apart)."""
    fa, fb = read_stream(a.a), read_stream(a.b)
    if len(fa) != len(fb):
        fail("frame count %d != %d" % (len(fa), len(fb)))
    for i, ((ta, _), (tb, _)) in enumerate(zip(fa, fb)):
        for n in GRADS:
            x, y = ta[n].astype(np.float64), tb[n].astype(np.float64)
            if x.shape != y.shape:
                fail("frame %d: %s shapes %s %s" % (i, n, x.shape, y.shape))
            scale = max(np.abs(x).max(), 1e-30)
            err = np.abs(x - y).max() / scale
            if a.differ:
                if n == "grad_w_down" and err <= a.rtol * 10:
                    fail("frame %d: %s does not differ (%.3g)" % (i, n, err))
            elif err > a.rtol:
                fail("frame %d: %s differs: max |a-b| / max|a| = %.3g > %g" %
                     (i, n, err, a.rtol))
    print("score_ref: backward outputs %s" % ("differ" if a.differ else "match"))


def main():
    ap = argparse.ArgumentParser()
    sp = ap.add_subparsers(dest="cmd", required=True)
    m = sp.add_parser("make")
    m.add_argument("out")
    for n, v in (("T", 64), ("K", 4), ("E", 16), ("D", 32), ("F", 24), ("P", 4),
                 ("seed", 1), ("frames", 1), ("ties", 0)):
        m.add_argument("--" + n, type=int, default=v)
    m.add_argument("--dtype", default="F32")
    m.add_argument("--rate", type=float, default=0.8)
    m.add_argument("--noplan", action="store_true")
    c = sp.add_parser("check-score")
    c.add_argument("inp")
    c.add_argument("out")
    c.add_argument("--metric", default="lrm")
    c.add_argument("--drop", type=float)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--fidelity", action="store_true")
    p = sp.add_parser("check-pack")
    p.add_argument("out")
    p.add_argument("--alloc", default="auto")
    u = sp.add_parser("check-unpack")
    u.add_argument("out")
    u.add_argument("--pairs", action="store_true")
    u.add_argument("--rows", default="pack_grad")
    u.add_argument("--into", default="unpacked")
    f = sp.add_parser("fidelity")
    f.add_argument("inp")
    b = sp.add_parser("corrupt")
    b.add_argument("inp")
    b.add_argument("out")
    b.add_argument("what")
    c = sp.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--rtol", type=float, default=1e-5)
    c.add_argument("--differ", action="store_true")
    a = ap.parse_args()
    {"compare": compare, "corrupt": corrupt, "make": make, "check-score": check_score, "check-pack": check_pack,
     "check-unpack": check_unpack, "fidelity": fidelity}[a.cmd](a)


if __name__ == "__main__":
    main()
