#!/bin/sh
# Selection rules (lrmoe-score --metric M --select S): for lrm-topk (the
# LRMoE paper's rule), lrm-sample (the unbiased draw), uniform-sample,
# gradnorm-topk and random-topk at C10/C20/C30, the fidelity of the kept
# gradients against every pair's (lrmoe-score --fidelity --weights: relative
# error, cosine and the closed-form bias ||E[G^]-G||/||G|| of dW_down and
# dx, mean over frames), on a generated workload and on frames dumped from a
# real training step (a tiny random-init Qwen3-MoE through lrmoe.torch.dump);
# then the score+select+pack time of sample against topk (score.seconds +
# pack.seconds, measured inside the library), alternating the two.
# Target: sample within 1.2x of topk's time.
# Usage: tests/bench/select.sh [TOKENS]   env ROUNDS (5), BENCH_QUICK=1
set -eu
cd "$(dirname "$0")/../.."
if [ "${BENCH_QUICK:-0}" = 1 ]; then dT=512; R=3; else dT=4096; R=${ROUNDS:-5}; fi
TOKENS=${1:-$dT}
for t in gen route plan exec score pack view; do
    [ -x bin/lrmoe-$t ] || { echo "select.sh: bin/lrmoe-$t missing: run make first" >&2; exit 1; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/lrmoe-bench-select.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
raw="--no-compress"
RULES="lrm-topk lrm-sample uniform-sample gradnorm-topk random-topk"

# ---------------------------------------------------------------- workloads
# generated: Qwen3-30B-A3B's expert shape scaled to 1024 hidden, zipf skew
bin/lrmoe-gen --experts 128 --topk 8 --hidden 1024 --ffn 384 --tokens "$TOKENS" --steps 2 \
    --skew zipf:1.2 --seed 3 --weights "$tmp/gw.lrm" $raw -o "$tmp/g.lrm"
bin/lrmoe-route --renorm $raw "$tmp/g.lrm" | bin/lrmoe-plan -P 8 --planner fixed $raw |
    bin/lrmoe-exec --phase forward --compute f32 --weights "$tmp/gw.lrm" $raw -o "$tmp/gen.lrm"
# dumped: one training step of the lrmoe-study model (4 layers, hidden 128,
# 16 experts, top-4, FFN 64) on random bytes, after 20 AdamW steps
have_torch=0
if python3 -c 'import torch, transformers' 2>/dev/null; then
    have_torch=1
    LRMOE_LIBRARY="$PWD/build/liblrmoe.so.2" PYTHONPATH="$PWD/lib/python" python3 - "$tmp" <<'PY'
import sys
import torch
import transformers as tf
import lrmoe.torch as lt
tf.logging.set_verbosity_error()
tmp = sys.argv[1]
torch.manual_seed(0)
c = tf.Qwen3MoeConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                      moe_intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, num_experts=16,
                      num_experts_per_tok=4, norm_topk_prob=True, max_position_embeddings=128,
                      use_cache=False)
m = tf.Qwen3MoeForCausalLM(c).float()
opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
g = torch.Generator().manual_seed(1)
def step():
    x = torch.randint(0, 256, (8, 128), generator=g)
    loss = m(input_ids=x, labels=x).loss
    opt.zero_grad()
    loss.backward()
    return loss
for _ in range(20):
    step()
    opt.step()
with lt.dump(m, tmp + "/d.lrm", weights=tmp + "/dw.lrm", compress=False):
    step()
PY
    bin/lrmoe-route -k 4 --renorm $raw "$tmp/d.lrm" | bin/lrmoe-plan -P 4 --planner fixed $raw |
        bin/lrmoe-exec --phase forward --compute f32 --weights "$tmp/dw.lrm" $raw -o "$tmp/dump.lrm"
fi

echo "select: generated E=128 K=8 D=1024 F=384, $TOKENS tokens, 2 frames, zipf 1.2, 8 ranks;" \
     "dumped: lrmoe-study's Qwen3-MoE (E=16 K=4 D=128 F=64), 4 layers x 1024 tokens" \
     "$([ $have_torch = 1 ] || echo '(skipped: no torch)')"

attrs() { # stream -> one line per frame: the attributes we report
    bin/lrmoe-view --json --no-stats --tensor keep "$1" | python3 -c '
import json, sys
for l in sys.stdin:
    if not l.strip(): continue
    a = json.loads(l)["attrs"]
    f = lambda k: str(a.get(k, "nan"))
    print("\t".join([f("score.fidelity.dw_down.rel_err"), f("score.fidelity.dw_down.cosine"),
                     f("score.fidelity.dw_down.bias"), f("score.fidelity.dx.rel_err"),
                     f("score.fidelity.dx.bias"), f("score.seconds"), f("pack.seconds")]))'
}

out="$tmp/fid.tsv"
: > "$out"
for w in gen dump; do
    [ -f "$tmp/$w.lrm" ] || continue
    W=$([ $w = gen ] && echo "$tmp/gw.lrm" || echo "$tmp/dw.lrm")
    for r in $RULES; do
        for C in 10 20 30; do
            bin/lrmoe-score --metric "${r%-*}" --select "${r#*-}" --drop "$C" --fidelity \
                --weights "$W" $raw "$tmp/$w.lrm" -o "$tmp/s.lrm"
            attrs "$tmp/s.lrm" | sed "s/^/$w\t$r\t$C\t/" >> "$out"
        done
    done
done

# time: score+select+pack of lrm-topk and lrm-sample at C30, alternating
tim="$tmp/time.tsv"
: > "$tim"
for w in gen dump; do
    [ -f "$tmp/$w.lrm" ] || continue
    i=0
    while [ $i -lt "$R" ]; do
        for s in topk sample; do
            bin/lrmoe-score --select $s --drop 30 $raw "$tmp/$w.lrm" |
                bin/lrmoe-pack --alloc forward $raw -o "$tmp/p.lrm"
            attrs "$tmp/p.lrm" | awk -v w=$w -v s=$s -v i=$i -F'\t' \
                '{ t += $6 + $7 } END { printf "%s\t%s\t%d\t%.9g\n", w, s, i, t }' >> "$tim"
        done
        i=$((i + 1))
    done
done

python3 - "$out" "$tim" <<'PY'
import statistics as st
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
acc = {}
for w, r, c, *v in rows:
    acc.setdefault((w, r, c), []).append([float(x) for x in v[:5]])
for w, title in (("gen", "generated workload"), ("dump", "dumped training frames")):
    keys = [k for k in acc if k[0] == w]
    if not keys:
        continue
    print(f"\nfidelity, {title} (mean over frames; bias = ||E[G^]-G||/||G||, 0 = unbiased)")
    print("%-15s %4s %11s %11s %11s %9s %9s" % ("rule", "C", "dWd_rel_err", "dWd_cosine",
                                                "dWd_bias", "dx_rel_err", "dx_bias"))
    for r in ("lrm-topk", "lrm-sample", "uniform-sample", "gradnorm-topk", "random-topk"):
        for c in ("10", "20", "30"):
            v = acc.get((w, r, c))
            if not v:
                continue
            m = [sum(x[i] for x in v) / len(v) for i in range(5)]
            print("%-15s %4s %11.4f %11.5f %11.4f %9.4f %9.4f" % (r, "C" + c, *m))
t = {}
for w, s, i, v in (l.rstrip("\n").split("\t") for l in open(sys.argv[2]) if l.strip()):
    t.setdefault((w, s), []).append(float(v))
print("\nscore+select+pack time at C30 (ms, sum over frames; min / median / max over rounds)")
print("%-6s %-7s %9s %9s %9s" % ("frames", "select", "min", "median", "max"))
verdict = True
for w in ("gen", "dump"):
    if (w, "topk") not in t:
        continue
    for s in ("topk", "sample"):
        v = t[(w, s)]
        print("%-6s %-7s %9.3f %9.3f %9.3f" % (w, s, 1e3 * min(v), 1e3 * st.median(v), 1e3 * max(v)))
    ratios = [b / a for a, b in zip(t[(w, "topk")], t[(w, "sample")])]
    ratio = st.median(t[(w, "sample")]) / st.median(t[(w, "topk")])
    print("%-6s sample/topk: median ratio %.3f (per round %.3f..%.3f)" % (
        w, ratio, min(ratios), max(ratios)))
    verdict &= ratio <= 1.2
print("verdict: %s: sample's score+select+pack time is %s 1.2x topk's" % (
    "PASS" if verdict else "FAIL", "within" if verdict else "NOT within"))
PY
