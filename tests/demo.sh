#!/bin/sh
# make demo: one LRMoE layer step end to end on an embedded default workload
# (a Qwen3-like layer scaled down: E=32 experts, top-8, D=256, F=128,
# 8192 tokens over 4 ranks, 80% of the tokens on 4 hot experts), then the
# same frame under every planner.
set -eu
TOP=$(cd "$(dirname "$0")/.." && pwd)
PATH="$TOP/bin:$PATH"
W=${DEMO_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/lrmoe-demo.XXXXXX")}
mkdir -p "$W"
P=4
MODEL="--experts 32 --topk 8 --hidden 256 --ffn 128"

echo "== workload: 8192 tokens, E=32, K=8, D=256, F=128, hot 80:4, $P ranks (in $W)"
lrmoe-gen $MODEL --tokens 8192 --hot 80:4 --seed 7 --weights "$W/weights.lrm" -o "$W/input.lrm"

echo "== the LRMoE step: route | plan | forward | score | pack | compact backward"
lrmoe-route -k 8 --ep $P --stats "$W/route.tsv" "$W/input.lrm" |
  lrmoe-plan --planner lrmoe --ranks $P --ffn 128 --hbm 53M --stats "$W/plan.tsv" |
  lrmoe-exec --phase forward --weights "$W/weights.lrm" --ranks $P |
  lrmoe-score |
  lrmoe-pack |
  lrmoe-exec --phase backward --mode compact --weights "$W/weights.lrm" --ranks $P \
    --timings "$W/timings.tsv" -o "$W/step.lrm"

echo
echo "-- routing (lrmoe-route --stats):"
column -t -s "$(printf '\t')" "$W/route.tsv"
echo
echo "-- plan (lrmoe-plan --stats): rho is the retention rate the memory budget admits"
column -t -s "$(printf '\t')" "$W/plan.tsv"
echo
echo "-- the frame after the step (lrmoe-view --no-stats):"
lrmoe-view --no-stats "$W/step.lrm" | sed -n '2,$p'
echo
echo "-- per-rank backward timings (lrmoe-exec --timings):"
column -t -s "$(printf '\t')" "$W/timings.tsv" | head -12

echo
echo "== every planner on the same frame (peak = busiest rank's pairs)"
printf '%-8s %10s %10s %10s %8s %s\n' planner fwd_peak bwd_peak lower_bnd rho feasible
for pl in fixed llep eplb lrmoe; do
    lrmoe-route -k 8 "$W/input.lrm" |
      lrmoe-plan --planner $pl --ranks $P --ffn 128 --hbm 53M --best-effort |
      lrmoe-view --json --no-stats | python3 -c '
import json, sys
a = json.loads(sys.stdin.readline())["attrs"]
print("%-8s %10s %10s %10s %8s %s" % (a["plan.planner"], a["plan.fwd_peak"], a["plan.bwd_peak"],
      a["plan.fwd_lb"], "%.3f" % a["plan.rho"], a["plan.feasible"]))'
done
echo
echo "demo: done; the streams are in $W"
