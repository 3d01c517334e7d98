#!/bin/sh
# The pressure experiment of the LRMoE paper (section 4.4, Figure 6) in our
# cost model, through lrmoe-sim --pressure.
#
# The paper's setup: 8 GPUs (EP8), Qwen3-30B-A3B's MoE layer (E=128, top-8,
# H=2048, F=768, BF16), an 80 GiB GPU with a 64 GiB resident footprint, so
# 16 GiB per GPU for token buffers and replicas; a base batch of 512 tokens
# per GPU scaled by 1, 2, 4, 8, 16, 20. "Effective throughput" is the
# fraction of the offered batch whose backward workload fits the per-GPU
# budget; "ideal full" is an uncompressed, perfectly balanced backward with
# zero memory charged for replicas, and the paper puts its memory limit at
# 16x (so 80% at 20x). The paper reports 100% for LRMoE at 20x.
#
# lrmoe-sim uses the same definitions (lrmoe-sim(1) "Pressure"): 1 when the
# plan fits the budget, else the largest fraction s of the batch that would
# fit with the same plan; ideal = hbm / (a balanced rank's need, no
# replicas). Its memory model is lrmoe-plan(1)'s, per pair:
#   forward buffers 2*D*b + saved state 2*F*b   (charged at every rate)
#   backward payload (3*D + 2*F)*b              (shrinks with rho)
# The paper does not give its own per-pair figure. Two runs:
#   1. literal: the paper's base of 512 tokens per rank;
#   2. anchored: the base at which our ideal full reaches the budget at 16x,
#      as the paper's vertical line does: base = hbm / (16 K (5D+4F) b).
# Nothing is tuned to the paper's LRMoE figure: the planners run with their
# defaults (lrmoe's candidate rates 1.0,0.9,0.8,0.7).
# Trace: lrmoe-gen Zipf(1.2) routing, 4096 tokens per frame (512 per rank).
# Usage: tests/bench/pressure.sh [FRAMES]   (BENCH_QUICK=1: 2 frames)
set -eu
cd "$(dirname "$0")/../.."
FRAMES=${1:-8}
[ "${BENCH_QUICK:-0}" = 1 ] && FRAMES=2
for t in lrmoe-gen lrmoe-route lrmoe-sim; do
    [ -x bin/$t ] || { echo "pressure.sh: bin/$t missing: run make first" >&2; exit 1; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/lrmoe-bench-pressure.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

E=128 P=8 K=8 D=2048 F=768 B=2 HBM=17179869184 X=1,2,4,8,16,20
BASE=512
# per-pair bytes of lrmoe-plan(1)'s model
FWD=$((2 * D * B + 2 * F * B)) BWD=$(((3 * D + 2 * F) * B))
ANCHOR=$((HBM / (16 * K * (FWD + BWD))))

bin/lrmoe-gen --tokens $((BASE * P)) --experts $E --topk $K --hidden $D --ffn $F \
    --steps "$FRAMES" --zipf 1.2 --seed 3 -o "$tmp/g.lrm"
bin/lrmoe-route "$tmp/g.lrm" -o "$tmp/r.lrm"
rm -f "$tmp/g.lrm"

echo "pressure experiment (LRMoE paper, Figure 6): E=$E K=$K D=$D F=$F BF16, P=$P, hbm 16 GiB"
echo "  (80 GiB GPU - 64 GiB resident), multipliers $X, $FRAMES frames of Zipf(1.2) routing,"
echo "  planners with their defaults (lrmoe rates 1.0,0.9,0.8,0.7, min-keep 0.25)"
echo "  per pair: forward buffers + saved state $FWD B (every rate), backward payload $BWD B (x rho)"
echo "  anchored base: $ANCHOR tokens/rank = hbm / (16 K $((FWD + BWD)) B), our ideal full's limit at 16x"
echo

run() { # label base -> $tmp/label.txt
    bin/lrmoe-sim --quiet --ranks $P --hidden $D --ffn $F --topk $K --hbm $HBM \
        --pressure $X --pressure-base "$2" --planners fixed,llep,eplb,lrmoe \
        "$tmp/r.lrm" > "$tmp/$1.txt"
}
run literal $BASE
run anchored "$ANCHOR"
# a diagnostic, not the paper's setting: the anchored run with one more
# candidate rate below the bound computed at the end (0.6)
bin/lrmoe-sim --quiet --ranks $P --hidden $D --ffn $F --topk $K --hbm $HBM \
    --pressure 16,20 --pressure-base "$ANCHOR" --planners lrmoe --rates 1.0,0.9,0.8,0.7,0.6 \
    "$tmp/r.lrm" > "$tmp/rate06.txt"

# The pressure table of lrmoe-sim's report, columns looked up by name from
# its header line ("batch multiplier  fixed llep ... ideal").
table() { # label file
    awk -v lab="$1" '
        /^batch multiplier/ { n = 0; for (i = 3; i <= NF; i++) col[++n] = $i; on = 1; next }
        on && /^x[0-9.]+ / { x = $1; for (i = 1; i <= n; i++) pct[x, col[i]] = $(i + 3); xs[++m] = x; next }
        on && $1 == "rho" { for (i = 1; i < n; i++) rho[x, col[i]] = $(i + 2); next }
        END {
            printf "%-9s %-5s", lab, "x"
            for (i = 1; i <= n; i++) printf " %9s", col[i]
            printf "   (effective throughput %%; lrmoe rho)\n"
            for (k = 1; k <= m; k++) {
                x = xs[k]; printf "%-9s %-5s", "", x
                for (i = 1; i <= n; i++) printf " %9.2f", pct[x, col[i]]
                printf "   %s\n", rho[x, "lrmoe"]
            }
        }' "$2"
}
table literal "$tmp/literal.txt"
echo
table anchored "$tmp/anchored.txt"
echo

get() { # file row column
    awk -v row="$2" -v c="$3" '
        /^batch multiplier/ { for (i = 3; i <= NF; i++) if ($i == c) k = i - 2; on = 1; next }
        on && $1 == row && k { print $(k + 3); exit }' "$1"
}
lit=$(get "$tmp/literal.txt" x20 lrmoe)
anc=$(get "$tmp/anchored.txt" x20 lrmoe)
id16=$(get "$tmp/anchored.txt" x16 ideal)
id20=$(get "$tmp/anchored.txt" x20 ideal)
fix=$(get "$tmp/anchored.txt" x20 fixed)
# The retention rate a perfectly balanced rank needs at 20x of the anchored
# base: 20 N (FWD + rho BWD) <= 16 N (FWD + BWD).
need=$(awk -v f=$FWD -v b=$BWD 'BEGIN { printf "%.3f", (16 * (f + b) / 20 - f) / b }')
# ... and what that rank needs at lrmoe's last default rate, 0.7
at07=$(awk -v f=$FWD -v b=$BWD 'BEGIN { printf "%.1f", 100 * 16 * (f + b) / (20 * (f + 0.7 * b)) }')

awk -v a="$id16" -v b="$id20" 'BEGIN { exit !(a >= 99.9 && b > 79.9 && b < 80.1) }' \
    && v=PASS || v=FAIL
echo "verdict: $v: the anchored run reproduces the paper's ideal full: ${id16}% at 16x, ${id20}% at 20x" \
     "(paper: limit at 16x, 80.0% at 20x)"
awk -v a="$lit" 'BEGIN { exit !(a >= 99.95) }' && v=PASS || v=FAIL
echo "verdict: $v: literal base 512: lrmoe ${lit}% at 20x (paper 100%); our ideal full reaches" \
     "16 GiB only at $(awk -v a=$ANCHOR 'BEGIN { printf "%.0f", 16 * a / 512 }')x of 512 tokens/rank"
awk -v a="$anc" 'BEGIN { exit !(a >= 99.95) }' && v=PASS || v=FAIL
echo "verdict: $v: anchored base $ANCHOR: lrmoe ${anc}% at 20x (paper 100%; fixed here ${fix}%, paper's Megatron 40.0%)"
echo "  why: forward buffers and saved state ($FWD B per pair, $(awk -v f=$FWD -v b=$BWD \
    'BEGIN { printf "%.0f", 100 * f / (f + b) }')% of a pair's bytes) are charged at every rate;"
echo "  at 20x a balanced rank fits only for rho <= $need, below lrmoe's last default rate 0.7," \
     "where a balanced rank fits ${at07}% of the batch"
echo "  diagnostic (not the paper's setting): with --rates 1.0,...,0.6 lrmoe keeps" \
     "$(get "$tmp/rate06.txt" x20 lrmoe)% at 20x (rho $(awk '/^x20 /{ x = 1; next } x && $1 == "rho" { print $3; exit }' "$tmp/rate06.txt"))"
