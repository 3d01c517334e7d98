#!/usr/bin/env python3
"""Reference checks for lrmoe-plan (independent of the C code).

  plan_ref.py gen OUT --experts E --frames N --seed S --scenario NAME [--pairs N] [--ffn F]
      write a raw stream of frames holding only expert_load [E] I64, and the
      attribute ffn=F (default 768: the model the loads stand for; lrmoe-plan
      never assumes F).
      Scenarios (LLEP's skew set and Zipf): uniform, hot30, hot50, hot80,
      hot95 (that share of pairs on one expert), zipf (s=1.2), mixed (cycle).
  plan_ref.py check IN OUT --planner NAME --ranks P [--lambda L --alpha A
      --min-chunk M] [--slots S --nodes N --groups G] [--min-keep F]
      verify every frame of OUT against the loads of IN:
      * tensors/shapes/dtypes, native placement, non-negativity, row sums
        (fwd to n_e, bwd to quota), eligibility;
      * fixed: exactly plain EP;  llep: equal to the port of the reference (plan_llep_ref.py);
        eplb: equal to a Python port of DeepSeek's eplb.py;
      * lrmoe: forward and backward peaks equal the brute-force optimum over
        rank subsets for the emitted placement (and quotas), quotas within
        [ceil(min_keep*n_e), n_e], sum of quotas = floor(rho*N);
      * every non-input tensor/attribute of IN passes through unchanged.
      Prints one line per frame; exit 1 on the first failure.
"""
import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lrmoe_stream import read_stream, write_stream  # noqa: E402
import plan_llep_ref  # noqa: E402


# ------------------------------------------------------------------ loads
def make_load(E, N, scenario, rng):
    if scenario == "uniform":
        w = np.ones(E)
    elif scenario.startswith("hot"):
        share = int(scenario[3:]) / 100.0
        w = np.full(E, (1 - share) / (E - 1))
        w[rng.integers(E)] = share
    elif scenario == "zipf":
        w = 1.0 / np.arange(1, E + 1) ** 1.2
        rng.shuffle(w)
    else:
        raise SystemExit("unknown scenario " + scenario)
    return rng.multinomial(N, w / w.sum()).astype(np.int64)


def cmd_gen(a):
    rng = np.random.default_rng(a.seed)
    scen = ["uniform", "hot30", "hot50", "hot80", "hot95", "zipf"]
    frames = []
    for i in range(a.frames):
        s = scen[i % len(scen)] if a.scenario == "mixed" else a.scenario
        if s == "exact":  # every expert exactly N/E pairs
            load = np.full(a.experts, a.pairs // a.experts, dtype=np.int64)
        else:
            load = make_load(a.experts, a.pairs, s, rng)
        t = {"expert_load": load, "keepme": np.arange(3, dtype=np.float32)}
        if a.bad == "float":
            # integral floats (Megatron's tokens_per_expert) are accepted: a
            # fractional load is not
            t["expert_load"] = load.astype(np.float32) + np.float32(0.5)
        elif a.bad == "negative":
            load[1] = -5
        elif a.bad == "missing":
            del t["expert_load"]
        elif a.bad == "logits":
            t["router_logits"] = np.zeros((4, a.experts + 1), dtype=np.float32)
        elif a.bad == "shape":
            t["expert_load"] = load.reshape(2, -1)
        frames.append((t, {"layer": str(i), "scenario": s, "ffn": str(a.ffn)}))
    write_stream(a.out, frames)


def cmd_corrupt(a):
    """Break one plan invariant in every frame of a planned stream."""
    frames = read_stream(a.inp)
    out = []
    for t, at in frames:
        t = {k: np.array(v) for k, v in t.items()}
        fw, bw, q, pl = t["fwd_alloc"], t["bwd_alloc"], t["quota"], t["placement"]
        E, P = pl.shape
        e = int(np.argmax(t["expert_load"]))
        nat = e // (E // P)
        if a.what == "rowsum":
            fw[e, nat] += 1
        elif a.what == "native":
            pl[e, nat] = 0
        elif a.what == "ineligible":
            q2 = (nat + 1) % P
            pl[e, q2] = 0  # rank q2 loses expert e but gets one of its pairs
            fw[e, nat] += fw[e, q2] - 1
            fw[e, q2] = 1
        elif a.what == "negative":
            bw[e, nat] = -1
        elif a.what == "quota":
            q[e] = t["expert_load"][e] + 1
        out.append((t, at))
    write_stream(a.out, out)


# ------------------------------------------------------------------ references
def lla(load, P, lam, alpha, m):
    """LLEP as the reference code (plan_llep_ref.py); returns fwd (E,P)."""
    _, fwd = plan_llep_ref.plan([int(x) for x in load], P, lam, alpha, m)
    return np.array(fwd, dtype=np.int64).reshape(len(load), P)


def _packing(weight, packs):
    n = weight.shape[0]
    per = n // packs
    if per == 1:
        return np.arange(n), np.zeros(n, dtype=np.int64)
    order = sorted(range(n), key=lambda i: -float(weight[i]))  # stable
    pw = [np.float32(0)] * packs
    cnt = [0] * packs
    idx = np.zeros(n, dtype=np.int64)
    rank = np.zeros(n, dtype=np.int64)
    for g in order:
        p = min((k for k in range(packs) if cnt[k] < per), key=lambda k: pw[k])
        idx[g], rank[g] = p, cnt[p]
        pw[p] = np.float32(pw[p] + weight[g])
        cnt[p] += 1
    return idx, rank


def _replicate(weight, nphy):
    nlog = weight.shape[0]
    phy2log = list(range(nlog))
    rank = [0] * nlog
    cnt = np.ones(nlog, dtype=np.int64)
    for _ in range(nlog, nphy):
        v = weight / cnt.astype(np.float32)
        j = int(np.argmax(v))
        phy2log.append(j)
        rank.append(int(cnt[j]))
        cnt[j] += 1
    return np.array(phy2log), np.array(rank), cnt


def eplb(weight, nphy, groups, nodes, gpus):
    """Port of deepseek-ai/EPLB rebalance_experts for one layer."""
    weight = np.asarray(weight, dtype=np.float32)
    E = weight.shape[0]
    if groups % nodes:
        groups, nodes = 1, 1
    gs, gpn = E // groups, groups // nodes
    tpg = weight.reshape(groups, gs).sum(-1, dtype=np.float32)
    gpi, grk = _packing(tpg, nodes)
    log2mlog = np.array([(gpi[g] * gpn + grk[g]) * gs + j for g in range(groups) for j in range(gs)])
    mlog2log = np.empty(E, dtype=np.int64)
    mlog2log[log2mlog] = np.arange(E)
    tpm = weight[mlog2log].reshape(nodes, E // nodes)
    ppn, ppg = nphy // nodes, nphy // gpus
    out = np.empty(nphy, dtype=np.int64)
    rk = np.empty(nphy, dtype=np.int64)
    cnt_log = np.empty(E, dtype=np.int64)
    for nd in range(nodes):
        p2m, prank, mcnt = _replicate(tpm[nd], ppn)
        tpp = (tpm[nd] / mcnt.astype(np.float32))[p2m]
        pk, rip = _packing(tpp, gpus // nodes)
        phy2pphy = pk * ppg + rip
        pphy2phy = np.empty(ppn, dtype=np.int64)
        pphy2phy[phy2pphy] = np.arange(ppn)
        out[nd * ppn:(nd + 1) * ppn] = mlog2log[p2m[pphy2phy] + nd * (E // nodes)]
        rk[nd * ppn:(nd + 1) * ppn] = prank[pphy2phy]
        for i in range(E // nodes):
            cnt_log[mlog2log[nd * (E // nodes) + i]] = mcnt[i]
    return out, rk, cnt_log


def subset_sums(elig, w, P):
    """N(S) for every S: sum of w over experts whose eligible set lies in S."""
    masks = [sum(1 << p for p in np.nonzero(row)[0]) for row in elig]
    sub = np.zeros(1 << P, dtype=np.int64)
    for S in range(1, 1 << P):
        sub[S] = sum(int(x) for mk, x in zip(masks, w) if mk & ~S == 0)
    return sub


def opt_peak(elig, need, P):
    sub = subset_sums(elig, need, P)
    return max(-(-int(sub[S]) // bin(S).count("1")) for S in range(1, 1 << P))


def opt_peak_quota(elig, lo, n, total, P):
    a, b = subset_sums(elig, lo, P), subset_sums(elig, n, P)
    N = int(sum(n))
    best = 0
    for S in range(1, 1 << P):
        k = bin(S).count("1")
        best = max(best, -(-int(a[S]) // k), -(-(total - N + int(b[S])) // k))
    return best


# ------------------------------------------------------------------ check
def fail(i, msg):
    print("FAIL frame %d: %s" % (i, msg))
    sys.exit(1)


def cmd_check(a):
    fin, fout = read_stream(a.inp), read_stream(a.out)
    if len(fin) != len(fout):
        fail(-1, "%d frames in, %d out" % (len(fin), len(fout)))
    P = a.ranks
    for i, ((ti, ai), (to, ao)) in enumerate(zip(fin, fout)):
        load = ti["expert_load"].astype(np.int64)
        E = len(load)
        per = E // P
        for k, v in ti.items():
            if k not in to or not np.array_equal(v, to[k]):
                fail(i, "tensor %s not passed through" % k)
        for k, v in ai.items():
            if ao.get(k) != v:
                fail(i, "attribute %s not passed through" % k)
        pl, fw, q, bw = to["placement"], to["fwd_alloc"], to["quota"], to["bwd_alloc"]
        if pl.dtype != np.uint8 or fw.dtype != np.int64 or q.dtype != np.int64 or bw.dtype != np.int64:
            fail(i, "dtypes")
        if pl.shape != (E, P) or fw.shape != (E, P) or bw.shape != (E, P) or q.shape != (E,):
            fail(i, "shapes")
        for e in range(E):
            if pl[e, e // per] != 1:
                fail(i, "native of %d not placed" % e)
        if (fw < 0).any() or (bw < 0).any() or (q < 0).any() or (q > load).any():
            fail(i, "negative or quota > load")
        if ((fw > 0) & (pl == 0)).any() or ((bw > 0) & (pl == 0)).any():
            fail(i, "pairs on an ineligible rank")
        if not np.array_equal(fw.sum(1), load) or not np.array_equal(bw.sum(1), q):
            fail(i, "row sums")
        if ao.get("plan.planner") != a.planner:
            fail(i, "plan.planner %s" % ao.get("plan.planner"))
        fpk, bpk = int(fw.sum(0).max()), int(bw.sum(0).max())
        if int(ao["plan.fwd_peak"]) != fpk or int(ao["plan.bwd_peak"]) != bpk:
            fail(i, "plan.fwd_peak/bwd_peak attributes")
        N = int(load.sum())
        extra = ""
        if a.planner == "fixed":
            ref = np.zeros((E, P), dtype=np.int64)
            ref[np.arange(E), np.arange(E) // per] = load
            if not np.array_equal(fw, ref) or pl.sum() != E:
                fail(i, "fixed is not plain EP")
        elif a.planner == "llep":
            ref = lla(load, P, a.lam, a.alpha, a.min_chunk)
            if not np.array_equal(fw, ref):
                fail(i, "llep differs from the reference LLA")
            nat = np.zeros((E, P), dtype=bool)
            nat[np.arange(E), np.arange(E) // per] = True
            if not np.array_equal(pl, ((ref > 0) | nat).astype(np.uint8)):
                fail(i, "llep placement is not native + helpers with pairs")
        elif a.planner == "eplb":
            slots = a.slots or per + 2
            p2l, rk, cnt = eplb(load, slots * P, a.groups or a.nodes, a.nodes, P)
            ref = np.zeros((E, P), dtype=np.int64)
            for s, e in enumerate(p2l):
                c = cnt[e]
                ref[e, s // slots] += load[e] // c + (1 if rk[s] < load[e] % c else 0)
            if not np.array_equal(fw, ref):
                fail(i, "eplb differs from the reference port")
        if a.planner != "lrmoe":
            if not np.array_equal(q, load) or not np.array_equal(bw, fw):
                fail(i, "baseline must retain everything where forward ran")
        else:
            rho = float(ao["plan.rho"])
            K = int(q.sum())
            lo = np.array([min(int(x), math.ceil(a.min_keep * int(x) - 1e-9)) for x in load])
            if (q < lo).any():
                fail(i, "quota below min-keep floor")
            elig = pl.astype(bool)
            # plan.source "placement:forward/backward": a min-peak forward
            # (backward) is the optimum for the placement (and quotas); a
            # baseline's own forward or the in-place / follow backward only
            # bound it from above
            src = ao.get("plan.source", "")
            fsrc, bsrc = (src.split(":", 1)[1].split("/", 1) + [""])[:2] if ":" in src else ("", "")
            tf = opt_peak(elig, load, P)
            if int(ao["plan.fwd_lb"]) != tf or fpk < tf or (fsrc == "minpeak" and fpk != tf):
                fail(i, "forward peak %d (%s), optimum %d" % (fpk, src, tf))
            if K == N:
                tb = tf
            elif a.quota in ("minpeak", "even"):
                tb = opt_peak_quota(elig, lo, load, K, P)
            else:
                tb = opt_peak(elig, q, P)
            if bpk < tb or (bsrc.startswith("minpeak") and bpk != tb) or (K == N and bpk != fpk):
                fail(i, "backward peak %d (%s), optimum %d" % (bpk, src, tb))
            if bsrc.startswith("in-place"):
                # only experts whose forward ran on one rank drop, there
                for e in range(E):
                    if q[e] < load[e] and ((fw[e] > 0).sum() != 1 or (bw[e] > fw[e]).any()):
                        fail(i, "in-place backward moved expert %d" % e)
            if a.rates:
                ok = [math.floor(r * N + 1e-9) if r < 1 else N for r in a.rates]
                if K not in ok:
                    fail(i, "retained %d is not floor(rate*N) of a candidate" % K)
            extra = " rho %.3f fwd %d (T* %d) bwd %d (T* %d) %s" % (rho, fpk, tf, bpk, tb, src)
        print("ok frame %d %s E=%d P=%d peak %d replicas %s%s" %
              (i, a.planner, E, P, fpk, ao.get("plan.replicas"), extra))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("out")
    g.add_argument("--experts", type=int, default=128)
    g.add_argument("--frames", type=int, default=6)
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--scenario", default="mixed")
    g.add_argument("--pairs", type=int, default=32768 * 8 * 8)
    g.add_argument("--ffn", type=int, default=768)
    g.add_argument("--bad", default="")
    k = sub.add_parser("corrupt")
    k.add_argument("inp")
    k.add_argument("out")
    k.add_argument("what")
    c = sub.add_parser("check")
    c.add_argument("inp")
    c.add_argument("out")
    c.add_argument("--planner", required=True)
    c.add_argument("--ranks", type=int, required=True)
    c.add_argument("--lambda", dest="lam", type=float, default=1.3)
    c.add_argument("--alpha", type=float, default=1.0)
    c.add_argument("--min-chunk", type=int, default=1024)
    c.add_argument("--slots", type=int, default=0)
    c.add_argument("--nodes", type=int, default=1)
    c.add_argument("--groups", type=int, default=0)
    c.add_argument("--min-keep", type=float, default=0.25)
    c.add_argument("--quota", default="minpeak")
    c.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=None)
    a = ap.parse_args()
    {"gen": cmd_gen, "check": cmd_check, "corrupt": cmd_corrupt}[a.cmd](a)


if __name__ == "__main__":
    main()
