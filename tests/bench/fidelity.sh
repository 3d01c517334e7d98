#!/bin/sh
# Fidelity of the backward pair-selection metrics (LRMoE Table 2's ablation,
# measured directly): for each metric (lrm, gradnorm, absgrad, random) and
# drop rate C10/C20/C30, the true relative error of every expert's
# down-projection weight gradient,
#   || sum_{dropped u} alpha_u g_t phi_u^T ||_F / || G_e ||_F
# pooled over experts (lrmoe-score --fidelity, attribute score.fidelity),
# averaged over the frames of an lrmoe-gen stream (forward by lrmoe-exec).
# Lower is better. The paper reports, by training-loss deviation, lrm best,
# then gradnorm, absgrad, random; this table is what we measure here.
# Usage: tests/bench/fidelity.sh [TOKENS [STEPS]]
#   env PRESET (qwen3-30b-a3b), SKEW (zipf:1.2), SEED (1),
#   GEN_OPTS (extra lrmoe-gen options), BENCH_QUICK=1 (128 tokens, 1 step).
set -eu
cd "$(dirname "$0")/../.."
if [ "${BENCH_QUICK:-0}" = 1 ]; then dT=128; dS=1; else dT=512; dS=2; fi
TOKENS=${1:-$dT}; STEPS=${2:-$dS}
PRESET=${PRESET:-qwen3-30b-a3b}; SKEW=${SKEW:-zipf:1.2}; SEED=${SEED:-1}
for t in gen route exec score view; do
    [ -x bin/lrmoe-$t ] || { echo "fidelity.sh: bin/lrmoe-$t missing: run make first" >&2; exit 1; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/lrmoe-bench-fidelity.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
raw="--no-compress"

echo "fidelity: preset $PRESET, tokens $TOKENS, frames $STEPS, skew $SKEW, seed $SEED ${GEN_OPTS:-}"
# shellcheck disable=SC2086
bin/lrmoe-gen --preset "$PRESET" --tokens "$TOKENS" --steps "$STEPS" \
    --skew "$SKEW" --seed "$SEED" ${GEN_OPTS:-} --weights "$tmp/w.lrm" $raw -o "$tmp/g.lrm"
bin/lrmoe-route --renorm $raw "$tmp/g.lrm" -o "$tmp/r.lrm"
bin/lrmoe-exec --phase forward --weights "$tmp/w.lrm" $raw "$tmp/r.lrm" -o "$tmp/f.lrm"

out="$tmp/fid.tsv"
: > "$out"
for m in lrm gradnorm absgrad random; do
    for C in 10 20 30; do
        bin/lrmoe-score --select topk --metric "$m" --drop "$C" --fidelity --seed "$SEED" $raw \
            "$tmp/f.lrm" -o "$tmp/s.lrm"
        bin/lrmoe-view --json --no-stats --tensor score_fidelity "$tmp/s.lrm" | python3 -c '
import json, sys
v = [float(json.loads(l)["attrs"]["score.fidelity"]) for l in sys.stdin if l.strip()]
print("%s\t%s\t%.6g\t%.6g\t%.6g" % (sys.argv[1], sys.argv[2], sum(v) / len(v), min(v), max(v)))
' "$m" "$C" >> "$out"
    done
done

python3 - "$out" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
tab = {(m, c): (float(a), float(lo), float(hi)) for m, c, a, lo, hi in rows}
metrics = ["lrm", "gradnorm", "absgrad", "random"]
print("relative error of dW_down (mean over frames; lower is better)")
print("%-9s %12s %12s %12s" % ("metric", "C10", "C20", "C30"))
for m in metrics:
    print("%-9s %12.5f %12.5f %12.5f" % ((m,) + tuple(tab[(m, c)][0] for c in ("10", "20", "30"))))
orders = []
best_all = True
for c in ("10", "20", "30"):
    o = sorted(metrics, key=lambda m: tab[(m, c)][0])
    orders.append("C%s: %s" % (c, " < ".join(o)))
    best_all &= o[0] == "lrm"
print("ordering  " + "; ".join(orders))
paper = all(" < ".join(metrics) in o for o in orders)
print("verdict: %s: lrm has the lowest error at %s; ordering %s the paper's "
      "(lrm < gradnorm < absgrad < random)" % (
          "PASS" if best_all else "FAIL",
          "every rate" if best_all else "not every rate",
          "matches" if paper else "differs from"))
PY

# ---------------------------------------------------------------- quotas
# The planner's quota policies (lrmoe-plan -q): per workload and rate, each
# policy's backward peak (plan.bwd_peak) and the dW_down error of the pairs
# its quotas drop (lrmoe-score --fidelity following the plan's quota).
# Small shapes (D 256, F 128) so the forward pass stays quick; P = 8.
QT=${QUOTA_TOKENS:-2048}
[ "${BENCH_QUICK:-0}" = 1 ] && QT=512
quota_oracle() { # plan_stream rate mode(own|prev) out: writes out, its last frame's peak to $tmp/qo.peak
    python3 - "$@" "$tmp/qo.peak" <<'PY'
import math, sys
import numpy as np
sys.path.insert(0, "tests/helpers")
from lrmoe_stream import read_stream, write_stream, bf16_to_f32
src, rate, mode, dst, peakf = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
frames = read_stream(src, with_dtypes=True)

def scores(fr):
    t, a, d = fr
    f32 = lambda k: bf16_to_f32(t[k]) if d[k] == "BF16" else t[k].astype(np.float32)
    ids = t["topk_ids"].reshape(-1).astype(np.int64)
    g = f32("grad_output").astype(np.float64)
    R = (f32("topk_weights").astype(np.float64).reshape(-1) ** 2 *
         np.repeat((g * g).sum(1), t["topk_ids"].shape[1]) *
         f32("phi_sqnorm").astype(np.float64).reshape(-1))
    return ids, R

t, a, d = frames[-1]
ids, R = scores(frames[-1])
pl = t["placement"].astype(bool)
E, P = pl.shape
n = np.bincount(ids, minlength=E)
# the marginal value of an expert's j-th pair (best first): its own sorted
# scores (own), or the previous frame's profile of the expert at the same
# quantile (prev; an expert without pairs there takes the pooled profile)
if mode == "own":
    prof = [np.sort(R[ids == e])[::-1] for e in range(E)]
else:
    pids, pR = scores(frames[-2])
    pool = np.sort(pR)[::-1]
    prof = []
    for e in range(E):
        v = np.sort(pR[pids == e])[::-1]
        v = v if len(v) else pool
        prof.append(v[np.minimum(len(v) - 1, (np.arange(n[e]) * len(v)) // max(n[e], 1))])
N = int(n.sum())
total = int(math.floor(rate * N + 1e-9))
lo = np.minimum(n, np.ceil(0.25 * n - 1e-9).astype(np.int64))  # --min-keep 0.25
T = int(a["plan.bwd_peak"])
S = np.arange(1 << P)
mask = (pl * (1 << np.arange(P))).sum(1)
pc = np.array([bin(x).count("1") for x in S])
cap = T * pc
sup = [np.nonzero((S & m) == m)[0] for m in mask]        # rank subsets holding e
load = np.zeros(1 << P, dtype=np.int64)
for e in range(E):
    load[sup[e]] += lo[e]
assert (load[1:] <= cap[1:]).all(), "the floors do not route at the plan's peak"
K = lo.copy()
cand = [(prof[e][j], e) for e in range(E) for j in range(lo[e], n[e])]
cand.sort(key=lambda x: -x[0])
left = total - int(K.sum())
for v, e in cand:
    if left == 0:
        break
    if (load[sup[e]] < cap[sup[e]]).all():
        load[sup[e]] += 1
        K[e] += 1
        left -= 1
assert left == 0, "the quotas do not reach the total at the plan's peak"
t["quota"] = K.astype(np.int64)
if a.get("plan.keep"):
    a["plan.keep"] = "global"  # the new quotas have no by-rank bwd_alloc
write_stream(dst, frames[:-1] + [(t, a, d)])
open(peakf, "w").write("%d\n" % int(np.max(-(-load[1:] // pc[1:]))))  # T* of the quotas
PY
}

set_keep() { # stream keep(global|by-rank) out: every frame's plan.keep set
    python3 - "$@" <<'PY'
import sys
sys.path.insert(0, "tests/helpers")
from lrmoe_stream import read_stream, write_stream
fr = read_stream(sys.argv[1], with_dtypes=True)
write_stream(sys.argv[3], [(t, dict(a, **{"plan.keep": sys.argv[2]}), d) for t, a, d in fr])
PY
}

echo
echo "quota policies: E=128 K=8 D=256 F=128, $QT tokens x 2 steps (rows: step 2), P=8, --hbm 0, --longer-backward, seed $SEED"
qt="$tmp/quota.tsv"
: > "$qt"
for wl in balanced hot:30:16 hot:80:4 hot:95:1 zipf:1.2; do
    bin/lrmoe-gen --tokens "$QT" --steps 2 --hidden 256 --ffn 128 --skew "$wl" --seed "$SEED" \
        --weights "$tmp/qw.lrm" $raw -o "$tmp/qg.lrm"
    bin/lrmoe-route $raw "$tmp/qg.lrm" -o "$tmp/qr.lrm"
    bin/lrmoe-exec --phase forward --weights "$tmp/qw.lrm" $raw "$tmp/qr.lrm" -o "$tmp/qf.lrm"
    for rate in 0.9 0.8 0.7; do
        for q in even minpeak proportional; do
            bin/lrmoe-plan --ranks 8 --hbm 0 --rate "$rate" --quota "$q" --longer-backward $raw \
                "$tmp/qf.lrm" -o "$tmp/qp.lrm"
            bin/lrmoe-score --select topk --fidelity $raw "$tmp/qp.lrm" -o "$tmp/qs.lrm"
            bin/lrmoe-view --json --no-stats "$tmp/qs.lrm" | python3 -c '
import json, sys
a = json.loads(sys.stdin.readlines()[1])["attrs"]
print("\t".join(sys.argv[1:] + [str(a["plan.bwd_peak"]), str(a["score.fidelity"])]))
' "$wl" "$rate" "$q" >> "$qt"
            if [ "$q" = even ]; then cp "$tmp/qp.lrm" "$tmp/qe.lrm"; fi
        done
        # the score-profile criterion on the default's plan (placement, least
        # backward peak T): the quotas that keep the most predicted score
        # mass among those that route at T, by greedy water-filling on the
        # marginal scores (exact: a separable concave objective over a
        # polymatroid); predicted by this step's own LRM scores (oracle) or
        # by the previous step's profile of each expert (prev)
        for mode in own prev; do
            quota_oracle "$tmp/qe.lrm" "$rate" "$mode" "$tmp/qo.lrm"
            bin/lrmoe-score --select topk --fidelity $raw "$tmp/qo.lrm" -o "$tmp/qs.lrm"
            bin/lrmoe-view --json --no-stats "$tmp/qs.lrm" | python3 -c '
import json, sys
a = json.loads(sys.stdin.readlines()[1])["attrs"]
print("\t".join(sys.argv[1:] + [str(a["score.fidelity"])]))
' "$wl" "$rate" "$mode" "$(cat "$tmp/qo.peak")" >> "$qt"
        done
    done
done
python3 - "$qt" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
pol = ["even", "minpeak", "proportional", "own", "prev"]
tab = {(w, r, q): (int(p), float(e)) for w, r, q, p, e in rows}
print("step 2 of 2; own, prev: the quotas that keep the most predicted LRM score mass at the "
      "default's peak, predicted by this step's own scores (an oracle: the planner runs before "
      "they exist) or by each expert's score profile of the previous step")
print("%-10s %-5s" % ("workload", "rate") +
      "".join(" %12s %10s" % (q + " peak", "dW err") for q in pol))
ok_peak = True
orc = []     # (row, default, proportional, own, prev)
eq = []      # rows where proportional reaches the default's backward peak
lower = []   # rows where the default's peak is lower than proportional's
for w in dict.fromkeys(r[0] for r in rows):
    for r in ("0.9", "0.8", "0.7"):
        v = [tab[(w, r, q)] for q in pol]
        print("%-10s %-5s" % (w, r) + "".join(" %12d %10.5f" % x for x in v))
        ok_peak &= v[0][0] <= min(x[0] for x in v[:3])
        orc.append(("%s@%s" % (w, r), v[0], v[2], v[3], v[4]))
        row = ("%s@%s" % (w, r), v[0], v[2])
        (eq if v[0][0] == v[2][0] else lower if v[0][0] < v[2][0] else []).append(row)
worse = lambda rs: [n for n, d, p in rs if d[1] > p[1] * (1 + 1e-9)]
we, wl = worse(eq), worse(lower)
print("verdict: %s: the default (even) has the least backward peak of the three policies on "
      "every workload and rate" % ("PASS" if ok_peak else "FAIL"))
print("verdict: %s: where proportional reaches the same backward peak as the default (%d rows), "
      "the default's dW_down error is <= proportional's%s" % (
          "PASS" if not we else "FAIL", len(eq), "" if not we else ": worse at " + ", ".join(we)))
print("verdict: %s: where the default reaches a lower backward peak than proportional (%d rows), "
      "its dW_down error is still <= proportional's%s" % (
          "PASS" if not wl else "FAIL", len(lower),
          "" if not wl else ": higher at " + ", ".join(
              "%s (peak %d vs %d, error %.5f vs %.5f)" % (n, d[0], p[0], d[1], p[1])
              for n, d, p in lower if n in wl)))
# the score-profile criterion (own: oracle, prev: the previous step's
# profile): same peak as the default; its error against proportional's where
# proportional reaches that peak, against proportional's where the default's
# peak is lower, and against the default's everywhere
for k, label in ((3, "own (oracle)"), (4, "prev")):
    rs = [(x[0], x[1], x[2], x[k]) for x in orc]
    o_peak = [n for n, dd, p, o in rs if o[0] != dd[0]]
    o_eq = [n for n, dd, p, o in rs if p[0] == dd[0] and o[1] > p[1] * (1 + 1e-9)]
    o_lo = [n for n, dd, p, o in rs if dd[0] < p[0] and o[1] > p[1] * (1 + 1e-9)]
    o_def = [n for n, dd, p, o in rs if o[1] > dd[1] * (1 + 1e-9)]
    nb = lambda l: "" if not l else " (NOT at " + ", ".join(l) + ")"
    print("verdict: %s: score-profile quotas, %s: the default's backward peak on every row%s; "
          "error <= proportional's where proportional reaches that peak%s and where the "
          "default's peak is lower%s; error <= the default's on every row%s" % (
              "PASS" if not (o_peak or o_eq or o_lo or o_def) else "FAIL", label,
              nb(o_peak), nb(o_eq), nb(o_lo), nb(o_def)))
PY
# keep rule (plan.keep): at the same plan (quotas and bwd_alloc), the global
# top-K_e of each expert against the top bwd_alloc[e,p] of the pairs that ran
# on each forward rank. Small shapes where lrmoe-plan's strict backward rule
# needs by-rank on some frames (E=16 K=4 D=48 F=32, P=4, as tests/by-rank.bats).
KT=512; KS=4
[ "${BENCH_QUICK:-0}" = 1 ] && KS=3
: > "$tmp/keep.tsv"
for wl in balanced hot:80:2 hot:95:1 zipf:1.2; do
  for ks in "$SEED" $((SEED + 4)); do
    bin/lrmoe-gen --tokens $KT --experts 16 --topk 4 --hidden 48 --ffn 32 --steps $KS \
        --skew "$wl" --seed "$ks" --weights "$tmp/kw.lrm" $raw -o "$tmp/kg.lrm"
    bin/lrmoe-route --topk 4 $raw "$tmp/kg.lrm" -o "$tmp/kr.lrm"
    for rate in 0.9 0.8 0.7; do
        # planned before the forward, which runs the plan: pair_rank is
        # where each pair ran under it
        bin/lrmoe-plan --ranks 4 --rate "$rate" --longer-backward $raw "$tmp/kr.lrm" \
            -o "$tmp/kq.lrm"
        bin/lrmoe-exec --phase forward --weights "$tmp/kw.lrm" $raw "$tmp/kq.lrm" \
            -o "$tmp/kp.lrm"
        for keep in global by-rank; do
            set_keep "$tmp/kp.lrm" "$keep" "$tmp/kk.lrm"
            bin/lrmoe-score --select topk --fidelity $raw "$tmp/kk.lrm" -o "$tmp/ks_$keep.lrm"
        done
        python3 - "$tmp/kp.lrm" "$tmp/ks_global.lrm" "$tmp/ks_by-rank.lrm" "$wl" "$rate" \
            >> "$tmp/keep.tsv" <<'PY'
import sys
sys.path.insert(0, "tests/helpers")
from lrmoe_stream import read_stream
p, g, b = (read_stream(f) for f in sys.argv[1:4])
for i, ((_, pa), (gt, ga), (bt, ba)) in enumerate(zip(p, g, b)):
    print("\t".join([sys.argv[4], sys.argv[5], str(i), pa.get("plan.keep", "global"),
                     str(int((gt["keep"] != bt["keep"]).sum())), str(gt["keep"].size),
                     ga["score.fidelity"], ba["score.fidelity"]]))
PY
    done
  done
done
python3 - "$tmp/keep.tsv" "$SEED" $((SEED + 4)) <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
print()
print("keep rule at the same plan (E=16 K=4 D=48 F=32, 512 tokens, P=4, seeds %s and %s): dW_down "
      "error of the global top-K_e and of the keep by forward rank, mean over the frames; "
      "'planned' counts the frames lrmoe-plan marked plan.keep=by-rank" % (sys.argv[2], sys.argv[3]))
print("%-10s %-5s %8s %12s %10s %10s %8s" % ("workload", "rate", "planned", "pairs differ",
                                             "global", "by-rank", "ratio"))
rat, rat_p = [], []
for w, r in dict.fromkeys((x[0], x[1]) for x in rows):
    v = [x for x in rows if x[0] == w and x[1] == r]
    nb = sum(x[3] == "by-rank" for x in v)
    dif = sum(int(x[4]) for x in v)
    g = sum(float(x[6]) for x in v) / len(v)
    b = sum(float(x[7]) for x in v) / len(v)
    print("%-10s %-5s %5d/%-2d %12d %10.5f %10.5f %8.3f" % (w, r, nb, len(v), dif, g, b,
                                                          b / g if g > 0 else float("nan")))
    for x in v:
        if float(x[6]) > 0 and int(x[4]) > 0:
            rat.append(float(x[7]) / float(x[6]))
            if x[3] == "by-rank":
                rat_p.append(rat[-1])
def st(l):
    l = sorted(l)
    return ("%d frames: median %.3f, min %.3f, max %.3f" % (len(l), l[(len(l) - 1) // 2], l[0],
                                                            l[-1])) if l else "no frames"
print("keep rule: by-rank / global dW_down error where the masks differ, %s; on the frames "
      "planned by-rank, %s" % (st(rat), st(rat_p)))
PY
