#!/usr/bin/env python3
"""Plan traces with and without LRMOE_PLAN_EXHAUSTIVE=1 and require the same
plans: lrmoe-plan's output stream byte for byte, its exit code and stderr, and
its --stats TSV minus the timing columns (*_ms, looked up by name).

  plan_exact.py BIN TMP [SMALL.lrm ...]

BIN: the directory of lrmoe-plan; TMP: a scratch directory; SMALL.lrm: routed
P=4 traces on which follow and in-place backwards win (tests/plan-prune.bats
builds by-rank.bats' trace and two more). Prints one line per difference and a
summary; exits 1 on any difference, or when the runs lost their power: no
chosen plan named follow or in-place, no frame at rho < 1 or none at rho 1.

It also checks the rate loop on its own (the comparison cannot see what both
runs share): with --rates 1.0,0.9,0.8,0.7 every frame takes the plan that the
first of those rates gives alone, and each rate (and none) is taken.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOPK = 8


def gen(path, experts, frames, seed, scenario, pairs, ffn=768):
    subprocess.run([sys.executable, os.path.join(HERE, "plan_ref.py"), "gen", path,
                    "--experts", str(experts), "--frames", str(frames), "--seed", str(seed),
                    "--scenario", scenario, "--pairs", str(pairs), "--ffn", str(ffn)],
                   check=True)


def read_tsv(path):
    """Rows as dicts without the timing columns (a column name ending _ms)."""
    with open(path) as f:
        rows = [l.rstrip("\n").split("\t") for l in f]
    if not rows:
        return []
    h = rows[0]
    keep = [i for i, c in enumerate(h) if not c.endswith("_ms")]
    return [{h[i]: r[i] for i in keep} for r in rows[1:]]


def plan(binary, args, trace, out, tsv, exhaustive):
    env = dict(os.environ)
    env.pop("LRMOE_PLAN_EXHAUSTIVE", None)
    if exhaustive:
        env["LRMOE_PLAN_EXHAUSTIVE"] = "1"
    r = subprocess.run([binary] + args + ["--stats", tsv, "-o", out, trace], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return r.returncode, r.stderr


class Tally:
    def __init__(self):
        self.runs = self.diffs = self.frames = self.low = self.full = 0
        self.follow = self.inplace = 0

    def compare(self, binary, tmp, trace, args):
        a = [os.path.join(tmp, "a." + x) for x in ("lrm", "tsv")]
        b = [os.path.join(tmp, "b." + x) for x in ("lrm", "tsv")]
        for p in a + b:
            if os.path.exists(p):
                os.unlink(p)
        ra = plan(binary, args, trace, a[0], a[1], False)
        rb = plan(binary, args, trace, b[0], b[1], True)
        self.runs += 1
        what = " ".join(args) + " " + os.path.basename(trace)
        bad = []
        if ra != rb:
            bad.append("exit code/stderr: %r against exhaustive %r" % (ra, rb))
        sa = open(a[0], "rb").read() if os.path.exists(a[0]) else None
        sb = open(b[0], "rb").read() if os.path.exists(b[0]) else None
        if sa != sb:
            bad.append("output streams differ")
        ta = read_tsv(a[1]) if os.path.exists(a[1]) else []
        tb = read_tsv(b[1]) if os.path.exists(b[1]) else []
        if len(ta) != len(tb):
            bad.append("--stats: %d rows against exhaustive %d" % (len(ta), len(tb)))
        for x, y in zip(ta, tb):
            if x != y:
                d = [k for k in x if x[k] != y.get(k)]
                bad.append("--stats frame %s: %s" % (
                    x.get("frame"), ", ".join("%s %s against %s" % (k, x[k], y.get(k))
                                              for k in d)))
                break
        for x in ta:
            if x.get("planner") != "lrmoe":
                continue
            self.frames += 1
            src = x.get("source", "")
            self.follow += "/follow" in src
            self.inplace += "/in-place" in src
            if x.get("feasible") == "1":
                if float(x["rho"]) < 1:
                    self.low += 1
                else:
                    self.full += 1
        if bad:
            self.diffs += 1
            print("DIFF: lrmoe-plan %s: %s" % (what, "; ".join(bad)))
        return ra[0]


def first_fitting_rate(binary, tmp, trace, base, rates):
    """Plan trace with --rates RATES and with each rate alone (all
    --best-effort): every frame must take the first listed rate at which it
    has a plan alone, with that plan (its --stats row minus *_ms and
    binding), or be infeasible when no rate has one. Returns the list of
    problems and the rate index each frame took (-1: none)."""
    a = os.path.join(tmp, "a.tsv")

    def rows(args):
        if os.path.exists(a):
            os.unlink(a)
        rc, err = plan(binary, base + args + ["--best-effort"], trace, os.devnull, a, False)
        if rc != 0:
            raise SystemExit("lrmoe-plan %s failed: %s" % (" ".join(base + args), err))
        return [{k: v for k, v in r.items() if k != "binding"} for r in read_tsv(a)]

    multi = rows(["--rates", ",".join(rates)])
    alone = [rows(["--rate", r]) for r in rates]
    bad, took = [], []
    for f, m in enumerate(multi):
        want = next((i for i in range(len(rates)) if alone[i][f]["feasible"] == "1"), -1)
        took.append(want)
        what = "%s frame %d" % (" ".join(base), f)
        if want < 0:
            if m["feasible"] != "0":
                bad.append("%s: fits with --rates %s (rho %s), at no rate alone"
                           % (what, ",".join(rates), m["rho"]))
        elif m != alone[want][f]:
            bad.append("%s: --rates %s took rho %s (feasible %s), the first rate that fits "
                       "alone is %s" % (what, ",".join(rates), m["rho"], m["feasible"],
                                        rates[want]))
    return bad, took


def main():
    bindir, tmp = sys.argv[1], sys.argv[2]
    small = sys.argv[3:]
    binary = os.path.join(bindir, "lrmoe-plan")
    t = Tally()
    quotas = ("even", "minpeak", "proportional")
    # small routed P=4 traces: follow and in-place variants win here
    for sm in small:
        for q in quotas:
            for r in (["--rate", "0.7"], ["--rate", "0.8"], ["--rate", "0.9"],
                      ["--rates", "1.0,0.7", "--hbm", "1M", "--best-effort"]):
                for lb in ([], ["--longer-backward"]):
                    t.compare(binary, tmp, sm, ["--ranks", "4", "--quota", q] + r + lb)
    # small random traces (D=48, F=32, top-4, 128 tokens per rank): in-place
    # and follow backwards win here too
    for i, (E, P, scen) in enumerate([(16, 4, "hot80"), (16, 4, "zipf"), (32, 4, "hot50"),
                                      (32, 8, "hot80"), (32, 8, "zipf")]):
        trace = os.path.join(tmp, "s%d.lrm" % i)
        gen(trace, E, 4, 20 + i, scen, 128 * P * 4, ffn=32)
        for j, r in enumerate(("0.7", "0.8", "0.9")):
            for lb in ([], ["--longer-backward"]):
                t.compare(binary, tmp, trace, ["--ranks", str(P), "--tokens", "128", "--topk",
                                               "4", "--hidden", "48", "--rate", r,
                                               "--quota", quotas[(i + j) % 3]] + lb)
    # random traces: (E, P, nodes, scenario, seed)
    traces = [(16, 4, 1, "hot80", 1), (32, 4, 2, "zipf", 2), (64, 8, 1, "zipf", 3),
              (128, 8, 4, "hot50", 4), (128, 16, 2, "zipf", 5), (256, 16, 16, "uniform", 6),
              (256, 32, 8, "zipf", 7), (256, 64, 8, "hot80", 8), (384, 64, 16, "zipf", 9),
              (128, 128, 16, "zipf", 10), (384, 128, 4, "hot30", 11)]
    for i, (E, P, nodes, scen, seed) in enumerate(traces):
        tokens = 4096
        trace = os.path.join(tmp, "t%d.lrm" % i)
        gen(trace, E, 3, seed, scen, tokens * P * TOPK)
        base = ["--ranks", str(P), "--nodes", str(nodes), "--tokens", str(tokens),
                "--topk", str(TOPK), "--hidden", "7168"]
        # the budget rate 1 needs (unlimited), then budgets below it: a
        # planner that fits them drops pairs (rho < 1) or replicas
        t.compare(binary, tmp, trace, base + ["--hbm", "0"])
        need = max(float(r["mem_peak_gib"]) for r in read_tsv(os.path.join(tmp, "a.tsv")))
        for j, f in enumerate((0.97, 0.9, 0.8)):
            hbm = "%.4fG" % (need * f)
            q = quotas[(i + j) % 3]
            for lb in ([], ["--longer-backward"]):
                t.compare(binary, tmp, trace, base + ["--hbm", hbm, "--quota", q,
                                                      "--best-effort"] + lb)
        t.compare(binary, tmp, trace, base + ["--hbm", "%.4fG" % (need * 0.9), "--quota",
                                              quotas[(i + 2) % 3], "--longer-backward"])
    # the rate loop: the first listed rate with a fitting plan wins
    took = []
    for i in (2, 4, 7):
        E, P, nodes, scen, seed = traces[i]
        base = ["--ranks", str(P), "--nodes", str(nodes), "--tokens", "4096", "--topk",
                str(TOPK), "--hidden", "7168"]
        trace = os.path.join(tmp, "t%d.lrm" % i)
        t.compare(binary, tmp, trace, base + ["--hbm", "0"])
        need = max(float(r["mem_peak_gib"]) for r in read_tsv(os.path.join(tmp, "a.tsv")))
        for f in (0.97, 0.9, 0.86, 0.83, 0.75):
            for q in quotas:
                bad, tk = first_fitting_rate(binary, tmp, trace, base + [
                    "--hbm", "%.4fG" % (need * f), "--quota", q], ["1.0", "0.9", "0.8", "0.7"])
                took += tk
                for b in bad:
                    print("RATE: " + b)
                t.diffs += len(bad) > 0
    print("rate loop: %d frames; by the rate index they took (-1: none): %s"
          % (len(took), " ".join("%d:%d" % (k, took.count(k)) for k in sorted(set(took)))))
    print("%d runs compared, %d with differences; lrmoe frames %d: %d fit at rho < 1, "
          "%d at rho 1; %d chose a follow backward, %d an in-place one"
          % (t.runs, t.diffs, t.frames, t.low, t.full, t.follow, t.inplace))
    ok = t.diffs == 0
    if small and (t.follow == 0 or t.inplace == 0):
        print("LOST POWER: no chosen plan has a follow backward, or none an in-place one")
        ok = False
    if any(k not in took for k in range(-1, 4)):
        print("LOST POWER: some rate index (or none fitting) was taken by no frame")
        ok = False
    if t.low == 0 or t.full == 0:
        print("LOST POWER: no frame fit at rho < 1, or none at rho 1")
        ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
