#!/usr/bin/env python3
"""Brute-force reference for the min-peak allocation (independent of the C
code). Reads the lines of `plan_test dump` and, for each tiny instance,
enumerates every integer allocation of every expert's pairs to its eligible
ranks (dynamic programming over reachable rank-load vectors) to find the
true minimum peak, for fixed quotas (= loads) and for free quotas
lo <= K_e <= n_e with sum K_e = total. Checks GLPK's peak and the
closed-form bound against it. Prints "ok N" or the failing lines; exit 1 on
any mismatch."""
import sys


def splits(n, ranks):
    """All ways to put n pairs on the given ranks (tuples of counts)."""
    if len(ranks) == 1:
        yield (n,)
        return
    for a in range(n + 1):
        for rest in splits(n - a, ranks[1:]):
            yield (a,) + rest


def best_peak(P, elig, need_lo, need_hi, total=None):
    states = {tuple([0] * P)}
    for ranks, lo, hi in zip(elig, need_lo, need_hi):
        nxt = set()
        if not ranks:
            if lo > 0:
                return None
            continue
        for k in range(lo, hi + 1):
            for sp in splits(k, ranks):
                for st in states:
                    v = list(st)
                    for r, c in zip(ranks, sp):
                        v[r] += c
                    nxt.add(tuple(v))
        states = nxt
    cands = [max(s) for s in states if total is None or sum(s) == total]
    return min(cands) if cands else None


def main():
    bad = n = 0
    for line in sys.stdin:
        parts = [p.split() for p in line.split("|")]
        P, E = map(int, parts[0])
        elig = [[r for r, ch in enumerate(row) if ch == "1"] for row in parts[1]]
        need = list(map(int, parts[2]))
        glpk, lb = map(int, parts[3])
        lo = list(map(int, parts[4]))
        total, qglpk, qlb = map(int, parts[5])
        assert len(elig) == E == len(need) and all(len(r) == P for r in parts[1])
        t = best_peak(P, elig, need, need)
        q = best_peak(P, elig, lo, need, total)
        n += 1
        if not (t == glpk == lb and q == qglpk == qlb):
            bad += 1
            print("MISMATCH brute %s/%s glpk %d/%d bound %d/%d: %s" %
                  (t, q, glpk, qglpk, lb, qlb, line.strip()))
    print("ok %d" % n if not bad else "%d of %d mismatched" % (bad, n))
    return 1 if bad or n == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
