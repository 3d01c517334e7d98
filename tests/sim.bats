#!/usr/bin/env bats
# lrmoe-sim: per-frame figures against lrmoe-plan, hand-computed tiny clusters
# for the memory and time models, pressure, summary statistics, plots, errors.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    HELPERS="$BATS_TEST_DIRNAME/helpers"
    T="$BATS_TEST_TMPDIR"
    export PYTHONPATH="$HELPERS${PYTHONPATH:+:$PYTHONPATH}"
}

# gen OUT E LAYERS STEPS PAIRS ZIPF SEED [topk]: a trace of expert_load frames
# (or, with "topk", of topk_ids [T,2] frames only), of a model with F=$FFN (default 768).
gen() {
    python3 - "$@" <<'EOF'
import os
import sys
import numpy as np
from lrmoe_stream import write_stream
out, E, L, S, pairs, z, seed = sys.argv[1:8]
F = os.environ.get("FFN", "768")  # the model's F, as lrmoe-gen writes it
E, L, S, pairs, z, seed = int(E), int(L), int(S), int(pairs), float(z), int(seed)
topk = len(sys.argv) > 8
rng = np.random.default_rng(seed)
frames = []
for s in range(S):
    for l in range(L):
        w = (1.0 + rng.permutation(E)) ** -z * rng.uniform(0.7, 1.3, E)
        if topk:
            T = pairs // 2
            a = rng.choice(E, size=T, p=w / w.sum())
            b = (a + 1 + rng.integers(0, E - 1, T)) % E
            ids = np.stack([a, b], 1).astype(np.int32)
            frames.append(({"topk_ids": ids}, {"layer": l, "step": s, "ffn": F}))
        else:
            load = rng.multinomial(pairs, w / w.sum()).astype(np.int64)
            frames.append(({"expert_load": load}, {"layer": l, "step": s, "ffn": F}))
write_stream(out, frames)
EOF
}

# one expert_load frame from a comma list
one() {
    python3 - "$1" "$2" <<'EOF'
import sys
import numpy as np
from lrmoe_stream import write_stream
write_stream(sys.argv[1], [({"expert_load": np.array([int(x) for x in sys.argv[2].split(",")],
                                                       np.int64)}, {"layer": 3, "step": 7})])
EOF
}

# col TSV PLANNER NAME: the value of column NAME for the first row of PLANNER
col() {
    awk -F'\t' -v p="$2" -v c="$3" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == c) k = i; next }
        $4 == p { print $k; exit }' "$1"
}

TINY=(-P 2 -D 4 --ffn 2 --bw 1000 --flops 1000)

# a sim TSV without its plan_ms column (the planner's wall time), found by name
nowall() {
    awk -F'\t' -v OFS='\t' 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "plan_ms") k = i }
                            { $k = ""; print }' "$1"
}

@test "sim: --help, --version, usage errors exit 2" {
    run "$BIN/lrmoe-sim" --help
    assert_success
    assert_output --partial "Usage: lrmoe-sim"
    run "$BIN/lrmoe-sim" --version
    assert_output "lrmoe-sim (lrmoe) $("$BIN/lrmoe-sim" --version | awk '{print $3}')"
    run "$BIN/lrmoe-sim" --planners fixed,nope
    assert_failure 2
    assert_output --partial "lrmoe-sim: --planners: unknown planner 'nope'"
    run "$BIN/lrmoe-sim" --planners llep@0.5
    assert_failure 2
    run "$BIN/lrmoe-sim" --pressure 1,0
    assert_failure 2
    run "$BIN/lrmoe-sim" -P 8 -N 3
    assert_failure 2
    run "$BIN/lrmoe-sim" --bogus
    assert_failure 2
}

@test "sim: hand-computed fixed EP on E=4, P=2 (memory, time, bytes)" {
    one "$T/h.lrm" 6,2,1,1
    run "$BIN/lrmoe-sim" "${TINY[@]}" -M 0 -p fixed --stats "$T/h.tsv" "$T/h.lrm"
    assert_success
    # rank 0 holds experts 0,1: 8 rows; W = 3*D*F = 24 elements, b = 2
    # fwd 8*2*4*2 = 128, saved 8*2*2*2 = 64, bwd 8*(3*4+2*2)*2 = 256
    [ "$(col "$T/h.tsv" fixed fwd_peak)" = 8 ]
    [ "$(col "$T/h.tsv" fixed lower_bound)" = 5 ]
    [ "$(col "$T/h.tsv" fixed peak_over_lb)" = 1.6 ]
    [ "$(col "$T/h.tsv" fixed mem_base_bytes)" = 96 ]
    [ "$(col "$T/h.tsv" fixed mem_replica_bytes)" = 0 ]
    [ "$(col "$T/h.tsv" fixed mem_tokens_bytes)" = 448 ]
    [ "$(col "$T/h.tsv" fixed mem_subtotal_bytes)" = 544 ]
    # rows of D*b = 8 bytes; rank 0 receives 8*(1/2) rows, rank 1 sends 4: 32 B
    # per phase at 1000 B/s, forward and backward: 0.064 s each way
    [ "$(col "$T/h.tsv" fixed t_dispatch_s)" = 0.064 ]
    [ "$(col "$T/h.tsv" fixed t_combine_s)" = 0.064 ]
    # 8 rows * 6*D*F = 384 FLOP forward, 768 backward at 1000 FLOP/s
    [ "$(col "$T/h.tsv" fixed t_compute_s)" = 1.152 ]
    [ "$(col "$T/h.tsv" fixed t_backward_s)" = 0.832 ]
    [ "$(col "$T/h.tsv" fixed t_total_s)" = 1.28 ]
    # rank 0 sends 8+32+8+32 and receives 32+8+32+8 bytes
    [ "$(col "$T/h.tsv" fixed a2a_bytes)" = 80 ]
    [ "$(col "$T/h.tsv" fixed layer)" = 3 ]
    [ "$(col "$T/h.tsv" fixed step)" = 7 ]
}

@test "sim: hand-computed LLEP spill with one replica on E=4, P=2" {
    one "$T/h.lrm" 10,0,0,0
    run "$BIN/lrmoe-sim" "${TINY[@]}" -M 0 -p llep --lambda 1 --min-chunk 0 --stats "$T/h.tsv" "$T/h.lrm"
    assert_success
    # capacity 10/2: rank 0 keeps 5, 5 spill to rank 1 which gets a replica:
    # W*(b+g) = 24*(2+4) = 144 bytes; rank 1 is the busiest (144 + 5*24 + 5*32)
    [ "$(col "$T/h.tsv" llep fwd_peak)" = 5 ]
    [ "$(col "$T/h.tsv" llep replicas)" = 1 ]
    [ "$(col "$T/h.tsv" llep mem_replica_bytes)" = 144 ]
    [ "$(col "$T/h.tsv" llep mem_tokens_bytes)" = 280 ]
    [ "$(col "$T/h.tsv" llep mem_charged_bytes)" = 424 ]
    [ "$(col "$T/h.tsv" llep mem_subtotal_bytes)" = 520 ]
    # weights 24*2 bytes out and the gradient back: 0.048 s
    [ "$(col "$T/h.tsv" llep t_weights_s)" = 0.048 ]
    [ "$(col "$T/h.tsv" llep t_dispatch_s)" = 0.04 ]
    [ "$(col "$T/h.tsv" llep t_compute_s)" = 0.72 ]
    [ "$(col "$T/h.tsv" llep t_total_s)" = 0.848 ]
    [ "$(col "$T/h.tsv" llep a2a_bytes)" = 128 ]
}

@test "sim: two-level bandwidth (P=4 over 2 nodes)" {
    one "$T/h.lrm" 6,2,1,1,0,0,0,0
    # a rank sends 1/3 of its bytes inside its node, 2/3 outside:
    # max(B/3/300, 2B/3/100) = B/150
    run "$BIN/lrmoe-sim" -P 4 -N 2 -D 4 --ffn 2 --bw 300 --bw-inter 100 --flops 1000 -M 0 \
        -p fixed --stats "$T/a.tsv" "$T/h.lrm"
    assert_success
    assert_output --partial "effective 1.5e-07 GB/s"
    run "$BIN/lrmoe-sim" -P 4 -D 4 --ffn 2 --bw 150 --flops 1000 -M 0 -p fixed --stats "$T/b.tsv" "$T/h.lrm"
    assert_success
    [ "$(col "$T/a.tsv" fixed t_dispatch_s)" = "$(col "$T/b.tsv" fixed t_dispatch_s)" ]
    # rank 0: 8 rows in, (3/4)*8 rows of 8 bytes = 48 B per phase at 150 B/s
    [ "$(col "$T/a.tsv" fixed t_dispatch_s)" = 0.64 ]
}

@test "sim: pressure by hand (fixed and the ideal bound)" {
    one "$T/h.lrm" 6,2,1,1
    run "$BIN/lrmoe-sim" "${TINY[@]}" -M 1000 -p fixed -x 1,2,4 "$T/h.lrm"
    assert_success
    # x2: rank 0 holds 16 rows * 56 B = 896 <= 1000: all fits.
    # x4: 32 rows * 56 = 1792 B: 1000/1792 = 55.8%; ideal 20 rows: 1000/1120 = 89.29%
    run awk '$1 == "x2" && $3 == "mean" { print $4, $5 } $1 == "x4" && $3 == "mean" { print $4, $5 }' <<<"$output"
    assert_line --index 0 "100 100"
    assert_line --index 1 "55.8 89.29"
}

@test "sim: per-frame plan figures equal lrmoe-plan's for every planner" {
    FFN=128 gen "$T/tr.lrm" 32 2 3 16384 1.2 5
    M=(-P 4 -D 256 --ffn 128 -M 7M)
    # three threads: GLPK in worker threads must give the single-threaded plans
    run "$BIN/lrmoe-sim" "${M[@]}" -j 3 --stats "$T/sim.tsv" --rank-stats "$T/rank.tsv" "$T/tr.lrm"
    assert_success
    for p in fixed llep eplb lrmoe; do
        "$BIN/lrmoe-plan" -p "$p" "${M[@]}" -b --stats "$T/plan-$p.tsv" -o "$T/plan-$p.lrm" \
            "$T/tr.lrm"
    done
    run python3 - "$T" <<'EOF'
import csv, sys
import numpy as np
from lrmoe_stream import read_stream
T = sys.argv[1]
sim = {(r["frame"], r["planner"]): r for r in csv.DictReader(open(T + "/sim.tsv"), delimiter="\t")}
ranks = {}
for r in csv.DictReader(open(T + "/rank.tsv"), delimiter="\t"):
    ranks.setdefault((r["frame"], r["planner"]), []).append((int(r["fwd_pairs"]), int(r["bwd_pairs"])))
G = 1024.0 ** 3
D, F, b, g = 256, 128, 2, 4
W = 3 * D * F
n, reduced = 0, 0
for p in ["fixed", "llep", "eplb", "lrmoe"]:
    frames = read_stream(T + "/plan-%s.lrm" % p)
    for r, (t, a) in zip(csv.DictReader(open(T + "/plan-%s.tsv" % p), delimiter="\t"), frames):
        s = sim[(r["frame"], p)]
        for k in ["fwd_peak", "bwd_peak", "fwd_lb", "bwd_lb", "replicas", "feasible"]:
            assert float(s[k]) == float(r[k]), (p, r["frame"], k, s[k], r[k])
        assert abs(float(s["rho"]) - float(r["rho"])) < 1e-6, (p, "rho")
        assert abs(float(s["mem_charged_bytes"]) / G - float(r["mem_peak_gib"])) < 2e-6, (p, "mem")
        t_comm = float(s["t_dispatch_s"]) + float(s["t_combine_s"]) + float(s["t_weights_s"])
        assert abs(t_comm * 1e3 - float(r["t_comm_ms"])) < 2e-6, (p, "t_comm")
        assert abs(float(s["t_total_s"]) * 1e3 - float(r["t_total_ms"])) < 2e-6, (p, "t_total_s")
        # the memory split, independently from the plan tensors
        pl, fw, bw = t["placement"], t["fwd_alloc"], t["bwd_alloc"]
        E, P = pl.shape
        rep = np.array([sum(int(pl[e, q] != 0 and q != e // (E // P)) for e in range(E)) for q in range(P)], np.int64)
        if p == "eplb":  # EPLB holds E/P+2 physical slots on every rank: 2 redundant each
            rep = np.full(P, 2, np.int64)
            assert int(a["plan.replicas"]) == 2 * P, (p, "redundant slots")
        f, k = fw.sum(0).astype(np.int64), bw.sum(0).astype(np.int64)
        tok = f * 2 * D * b + f * 2 * F * b + k * (3 * D + 2 * F) * b
        charged = rep * W * (b + g) + tok
        q = int(np.argmax(charged))
        assert float(s["mem_replica_bytes"]) == rep[q] * W * (b + g), (p, "replica")
        assert float(s["mem_tokens_bytes"]) == tok[q], (p, "tokens")
        assert float(s["mem_base_bytes"]) == (E // P) * W * b
        assert float(s["fwd_peak"]) == f.max() and float(s["bwd_peak"]) == k.max()
        assert ranks[(r["frame"], p)] == list(zip(f.tolist(), k.tolist())), (p, "per-rank loads")
        reduced += float(s["rho"]) < 1
        n += 1
assert n == 24, n
assert reduced > 0, "no frame needed a reduced rate: the budget does not bind"
print("ok", n, reduced)
EOF
    assert_success
    assert_output --partial "ok 24"
}

@test "sim: topk_ids frames give the same figures as their expert_load" {
    gen "$T/k.lrm" 16 1 3 4000 1.0 9 topk
    python3 - "$T" <<'EOF'
import sys
import numpy as np
from lrmoe_stream import read_stream, write_stream
T = sys.argv[1]
out = []
for t, a in read_stream(T + "/k.lrm"):
    out.append(({"expert_load": np.bincount(t["topk_ids"].ravel(), minlength=16).astype(np.int64)}, a))
write_stream(T + "/l.lrm", out)
EOF
    run "$BIN/lrmoe-sim" -P 4 -E 16 -p fixed,llep,lrmoe --stats "$T/k.tsv" "$T/k.lrm"
    assert_success
    run "$BIN/lrmoe-sim" -P 4 --topk 2 -p fixed,llep,lrmoe --stats "$T/l.tsv" "$T/l.lrm"
    assert_success
    # everything but the planner wall time
    diff <(nowall "$T/k.tsv") <(nowall "$T/l.tsv")
    [ "$(wc -l < "$T/k.tsv")" -eq 10 ]
    run "$BIN/lrmoe-sim" -P 4 "$T/k.lrm"
    assert_failure 1
    assert_output --partial "give --experts"
}

@test "sim: table means and p99 equal numpy over the TSV; -j 1 and -j 2 agree" {
    gen "$T/tr.lrm" 32 4 30 8192 1.1 3
    run "$BIN/lrmoe-sim" -P 8 -j 2 -p fixed,llep,eplb --stats "$T/a.tsv" "$T/tr.lrm"
    assert_success
    echo "$output" > "$T/table.txt"
    "$BIN/lrmoe-sim" -P 8 -j 1 -p fixed,llep,eplb --stats "$T/b.tsv" "$T/tr.lrm" > /dev/null
    diff <(nowall "$T/a.tsv") <(nowall "$T/b.tsv")
    run python3 - "$T" <<'EOF'
import csv, math, sys
import numpy as np
T = sys.argv[1]
rows = list(csv.DictReader(open(T + "/a.tsv"), delimiter="\t"))
lines = open(T + "/table.txt").read().splitlines()
def row(label):
    i = [k for k, l in enumerate(lines) if l.startswith(label)][0]
    return [float(x) for x in lines[i].split()[-3:]], [float(x) for x in lines[i + 1].split()[-3:]]
checks = {"forward peak  ": ("fwd_peak", 1), "memory: token buffers": ("mem_tokens_bytes", 1024.0 ** -3),
          "time: layer total": ("t_total_s", 1e3), "all-to-all, busiest rank": ("a2a_bytes", 1024.0 ** -2)}
for label, (k, sc) in checks.items():
    mean, p99 = row(label)
    for j, p in enumerate(["fixed", "llep", "eplb"]):
        v = np.array([float(r[k]) for r in rows if r["planner"] == p]) * sc
        ref_mean = v.mean()
        ref_p99 = np.sort(v)[math.ceil(0.99 * len(v)) - 1]
        assert abs(mean[j] - ref_mean) <= 6e-4 * abs(ref_mean), (label, p, mean[j], ref_mean)
        assert abs(p99[j] - ref_p99) <= 6e-4 * abs(ref_p99), (label, p, p99[j], ref_p99)
print("ok")
EOF
    assert_success
    assert_output "ok"
    grep -q "^ratio to fixed" "$T/table.txt"
}

@test "sim: E=256 P=64 in 8 nodes, -j 2 equals -j 1 frame by frame (thread-safe planners)" {
    # the scale of issue 8 on a short trace: worker threads must not share
    # planner state (LLEP once sorted through a global and diverged here)
    gen "$T/big.lrm" 256 48 20 2097152 1.1 8
    "$BIN/lrmoe-sim" -Q -P 64 -N 8 -j 2 -p fixed,llep,eplb,lrmoe --stats "$T/a.tsv" "$T/big.lrm" > /dev/null
    "$BIN/lrmoe-sim" -Q -P 64 -N 8 -j 1 -p fixed,llep,eplb,lrmoe --stats "$T/b.tsv" "$T/big.lrm" > /dev/null
    [ "$(wc -l < "$T/a.tsv")" -eq $((48 * 20 * 4 + 1)) ]
    diff <(nowall "$T/a.tsv") <(nowall "$T/b.tsv")
    # every plan reaches or certifies its bound: fixed peak == T*, lrmoe at T*
    run awk -F'\t' 'NR > 1 && ($6 < $13 || ($4 == "fixed" || $4 == "lrmoe") && $6 != $13) { bad++ }
        END { print bad + 0 }' "$T/a.tsv"
    assert_output "0"
}

@test "sim: plots are produced and labelled modelled" {
    command -v gnuplot > /dev/null || skip "gnuplot not installed"
    gen "$T/tr.lrm" 16 2 2 8192 1.2 4
    run "$BIN/lrmoe-sim" -P 4 -M 4M -x 1,2,4 -g "$T/plots" "$T/tr.lrm"
    assert_success
    for f in load memory latency pressure; do
        [ -s "$T/plots/$f.svg" ]
        grep -q "<svg" "$T/plots/$f.svg"
        grep -qi "modelled" "$T/plots/$f.svg"
    done
    # the stacked memory bars hold the table's means
    awk -F'\t' '$1 == "lrmoe"' "$T/plots/memory.dat" | grep -q .
    run "$BIN/lrmoe-sim" -P 4 -g "$T/png" --plot-format png "$T/tr.lrm"
    assert_success
    [ "$(head -c 4 "$T/png/load.png" | od -An -c | tr -d ' ')" = '211PNG' ]
    [ ! -e "$T/png/pressure.png" ]
}

@test "sim: --plot without gnuplot says what to install" {
    gen "$T/tr.lrm" 16 1 1 1000 1.0 1
    mkdir "$T/path"
    for c in python3 awk; do ln -s "$(command -v $c)" "$T/path/$c"; done
    PATH="$T/path" run "$BIN/lrmoe-sim" -P 4 -g "$T/plots" "$T/tr.lrm"
    assert_failure 1
    assert_output --partial "gnuplot not found"
    assert_output --partial "gnuplot-nox"
}

@test "sim: bad input fails with exit 1 and a message" {
    gen "$T/tr.lrm" 16 1 3 1000 1.0 1
    head -c 300 "$T/tr.lrm" > "$T/cut.lrm"
    run "$BIN/lrmoe-sim" -P 4 "$T/cut.lrm"
    assert_failure 1
    assert_output --regexp "^lrmoe-sim: "
    run "$BIN/lrmoe-sim" -P 3 "$T/tr.lrm"
    assert_failure 1
    assert_output --partial "3 ranks do not divide 16 experts"
    # 2^20 experts: refused before planning (not a gigabyte of plans)
    python3 -c '
import sys, numpy as np
from lrmoe_stream import write_stream
write_stream(sys.argv[1], [({"expert_load": np.ones(1 << 20, np.int64)}, {"ffn": "768"})])' "$T/big.lrm"
    run "$BIN/lrmoe-sim" -Q "$T/big.lrm"
    assert_failure 1
    assert_output --partial "1048576 experts over 8 ranks: above the planner's limits"
    python3 -c '
import sys, numpy as np
from lrmoe_stream import write_stream
write_stream(sys.argv[1], [({"hidden": np.zeros((2, 4), np.float32)}, {})])
write_stream(sys.argv[2], [({"expert_load": np.array([1, -2, 3, 4], np.int64)}, {})])' \
        "$T/none.lrm" "$T/neg.lrm"
    run "$BIN/lrmoe-sim" -P 2 "$T/none.lrm"
    assert_failure 1
    assert_output --partial "neither expert_load nor topk_ids"
    run "$BIN/lrmoe-sim" -P 2 "$T/neg.lrm"
    assert_failure 1
    assert_output --partial "negative"
    run "$BIN/lrmoe-sim" -P 4 "$T/missing.lrm"
    assert_failure 1
}

@test "sim: capacity@F replays Megatron-style token dropping; every figure equals lrmoe-plan --planner capacity's" {
    gen "$T/t.lrm" 16 2 2 2048 1.2 9
    run "$BIN/lrmoe-sim" -Q -P 4 --ffn 768 -p fixed,capacity,capacity@1.25,lrmoe -x 1,4 \
        --stats "$T/s.tsv" "$T/t.lrm"
    assert_success
    assert_line --regexp '^figure \(modelled\) +unit +stat +fixed +capacity capacity@1.25 +lrmoe$'
    # capacity keeps fewer pairs than fixed, more at 1.25 than at 1.0
    run awk -F'\t' 'NR > 1 && $4 == "capacity" { a += $5 } NR > 1 && $4 == "capacity@1.25" { b += $5 }
                    END { print (a < 4 && b > a) ? "ok" : "bad " a " " b }' "$T/s.tsv"
    assert_output "ok"
    # frame by frame as lrmoe-plan: rho, peaks, memory and time
    for f in 1.0 1.25; do
        lab=capacity; [ "$f" = 1.0 ] || lab="capacity@$f"
        "$BIN/lrmoe-plan" -P 4 --ffn 768 -p capacity --capacity-factor "$f" -S "$T/p.tsv" \
            -o /dev/null "$T/t.lrm"
        run python3 - "$T/s.tsv" "$T/p.tsv" "$lab" <<'PY'
import sys
s = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
p = [l.rstrip("\n").split("\t") for l in open(sys.argv[2])]
hs, hp = s[0], p[0]
rows = [r for r in s[1:] if r[hs.index("planner")] == sys.argv[3]]
assert len(rows) == len(p) - 1 == 4, (len(rows), len(p))
for a, b in zip(rows, p[1:]):
    assert abs(float(a[hs.index("rho")]) - float(b[hp.index("rho")])) < 1e-6
    for cs, cp in (("fwd_peak", "fwd_peak"), ("bwd_peak", "bwd_peak"), ("fwd_lb", "fwd_lb")):
        assert float(a[hs.index(cs)]) == float(b[hp.index(cp)]), (cs, a, b)
    assert abs(float(a[hs.index("mem_charged_bytes")]) / 2**30 - float(b[hp.index("mem_peak_gib")])) < 1e-5
    assert abs(float(a[hs.index("t_total_s")]) * 1e3 - float(b[hp.index("t_total_ms")])) < 1e-5
print("ok")
PY
        assert_success
        assert_output "ok"
    done
    run "$BIN/lrmoe-sim" -Q -P 4 --ffn 768 -p capacity@0 "$T/t.lrm"
    assert_failure 2
    run "$BIN/lrmoe-sim" -Q -P 4 --ffn 768 -p llep@1.5 "$T/t.lrm"
    assert_failure 2
    assert_output --partial "applies to lrmoe and capacity only"
}
