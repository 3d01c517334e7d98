#!/usr/bin/env python3
"""A Python port of SalesforceAIResearch/LeastLoadedEP's planner, as a test
oracle for lib/plan_llep.c: compute_llep_lpt_plan (llep/gpt_oss_llep.py)
and the imbalance gate of gptoss_llep_forward (compute_gpu_imbalance_ratio,
llep/utils.py), written from the reference's rules without torch: the
per-GPU loads of the gate are float32, as the reference's .float().

  plan_llep_ref.py P LAMBDA ALPHA M LOAD...
      prints "ran 0|1" and the fwd_alloc rows, as plan_test llep does.
  plan_llep_ref.py --random N SEED
      prints N random cases, one per line: "P lambda alpha m load..."
  plan_llep_ref.py --batch < CASES
      the output of the first form for every case line, one after another.
"""
import sys

import numpy as np


def gate(load, P, lam):
    if not lam > 0:
        return True
    per = len(load) // P
    g = np.array([sum(load[p * per:(p + 1) * per]) for p in range(P)], dtype=np.float32)
    mean = np.float32(np.float32(g.astype(np.float64).sum()) / np.float32(P))
    if mean == 0:
        return 1.0 >= lam
    return float(np.float32(g.max() / mean)) >= lam


def lpt(load, P, alpha, m):
    """compute_llep_lpt_plan: returns fwd[E][P]."""
    E = len(load)
    per = E // P
    total = sum(load)
    balanced = total // P if P > 0 else total
    cap = int(alpha * balanced) if balanced > 0 else total
    cap = max(cap, 1)
    pending = [sum(load[p * per:(p + 1) * per]) for p in range(P)]
    assigned = [0] * P
    fwd = [[0] * P for _ in range(E)]
    for e, t in sorted([(e, load[e]) for e in range(E)], key=lambda x: -x[1]):
        if t == 0:
            continue
        nat = e // per
        pending[nat] -= t

        def eff(g):
            return assigned[g] + pending[g]

        def others():
            return sorted([(g, eff(g), cap - eff(g)) for g in range(P) if g != nat],
                          key=lambda x: x[1])

        def give(g, c):
            fwd[e][g] += c
            assigned[g] += c

        avail = cap - eff(nat)
        if avail >= t:
            give(nat, t)
        elif avail > 0:
            give(nat, avail)
            rem = t - avail
            while rem > 0:
                o = others()
                if not o:
                    give(nat, rem)
                    break
                done = False
                for g, _, av in o:
                    if av <= 0:
                        continue
                    c = min(rem, av)
                    if c < m and rem > c:
                        continue
                    give(g, c)
                    rem -= c
                    done = True
                    break
                if not done:
                    give(o[0][0], rem)
                    rem = 0
        else:
            o = others()
            rem = t
            for g, _, av in o:
                if rem <= 0:
                    break
                if av <= 0:
                    continue
                c = min(rem, av)
                if c < m and rem > c:
                    continue
                give(g, c)
                rem -= c
            if rem > 0:
                give(o[0][0] if o else nat, rem)
    return fwd


def plan(load, P, lam, alpha, m):
    if not gate(load, P, lam):
        per = len(load) // P
        fwd = [[0] * P for _ in load]
        for e, n in enumerate(load):
            fwd[e][e // per] = n
        return 0, fwd
    return 1, lpt(load, P, alpha, m)


def main():
    a = sys.argv[1:]
    if a and a[0] == "--random":
        rng = np.random.default_rng(int(a[2]))
        for _ in range(int(a[1])):
            P = int(rng.choice([1, 2, 3, 4, 8]))
            E = P * int(rng.integers(1, 5))
            kind = rng.integers(3)
            if kind == 0:
                load = rng.integers(0, 60, E)
            elif kind == 1:
                load = rng.multinomial(int(rng.integers(1, 2000)), rng.dirichlet(np.full(E, 0.3)))
            else:
                load = rng.integers(0, 3, E) * int(rng.integers(1, 50))
            lam = float(rng.choice([0, 0, 1.0, 1.3, 2.0]))
            alpha = float(rng.choice([0.5, 1.0, 1.1, 1.5]))
            m = int(rng.choice([0, 1, 5, 16, 100]))
            print(P, lam, alpha, m, *[int(x) for x in load])
        return
    cases = [ln.split() for ln in sys.stdin if ln.strip()] if a == ["--batch"] else [a]
    for c in cases:
        P, lam, alpha, m = int(c[0]), float(c[1]), float(c[2]), int(c[3])
        load = [int(x) for x in c[4:]]
        ran, fwd = plan(load, P, lam, alpha, m)
        print("ran", int(ran))
        for row in fwd:
            print(" ".join(str(x) for x in row))


if __name__ == "__main__":
    main()
