#!/usr/bin/env bats
# Capacity-factor token dropping (Megatron-Core's baseline; lib/capacity.c,
# lrmoe-plan(1) Capacity): the capacity formula against Python's
# math.ceil((T*K/E)*F), the selection against a brute force for both drop
# policies, the capacity planner's plan (quota = min(n_e, C), placement =
# fixed's, modelled figures = fixed's on the kept loads), lrmoe-exec
# refusing a plan that drops forward pairs, and bad options.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load
load helpers/unit

setup_file() {
    UT=$(unit_test capacity)
    export UT
}

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    T="$BATS_TEST_TMPDIR"
    export PYTHONPATH="$BATS_TEST_DIRNAME/helpers${PYTHONPATH:+:$PYTHONPATH}"
}

# a routed stream: 2 layers x 2 steps, E=16, K=4, 256 tokens, skewed
routed() {
    "$BIN/lrmoe-gen" --tokens 256 --hidden 32 --ffn 16 --experts 16 --topk 4 --layers 2 \
        --steps 2 --zipf 1.2 --seed 7 --weights "$T/w.lrm" -o "$T/g.lrm"
    "$BIN/lrmoe-route" -k 4 -o "$T/r.lrm" "$T/g.lrm"
}

@test "capacity: ceil((T*K/E)*F) as Megatron-Core's get_capacity computes it, in double" {
    # factors whose products round either way in binary, and exact ones
    python3 - > "$T/want.txt" <<'EOF'
import math
for T, K, E, F in [(4096, 8, 128, 1.0), (4096, 8, 128, 1.25), (1000, 2, 8, 1.1),
                   (333, 3, 7, 0.3), (10, 1, 3, 1.5), (0, 4, 16, 2.0), (1, 1, 1, 0.000001),
                   (32768, 8, 128, 1.2), (12345, 6, 64, 2.7), (7, 7, 49, 1.0)]:
    print(T, K, E, F, math.ceil((T * K / E) * F))
EOF
    while read -r t k e f want; do
        run "$UT" formula "$t" "$k" "$e" "$f"
        assert_success
        [ "$output" = "$want" ] || fail "capacity($t,$k,$e,$f) = $output, Python says $want"
    done < "$T/want.txt"
    [ "$(wc -l < "$T/want.txt")" -eq 10 ]
}

@test "capacity: keep and kept equal the brute force on 3000 random instances, both policies, ties to the lower pair index" {
    for s in 1 2 3; do
        run "$UT" random 1000 "$s"
        assert_success
        assert_output "1000 instances, 0 failures"
    done
}

@test "capacity: bad input is refused with a clear error (ids, NaN weights, factor <= 0 or not finite, sizes)" {
    run "$UT" errors
    assert_success
    assert_line "capacity factor 0 must be finite and > 0"
    assert_line "capacity factor -1 must be finite and > 0"
    assert_line "capacity factor nan must be finite and > 0"
    assert_line "capacity factor inf must be finite and > 0"
    assert_line "topk_ids[1,0]: expert 3 outside [0,3)"
    assert_line "topk_ids[1,0]: expert -1 outside [0,3)"
    assert_line "topk_weights[0,1]: NaN"
    assert_line "capacity: drop policy probs needs topk_weights"
    assert_line "unknown drop policy 'topk' (probs, position)"
    # the good input after them: expert 1 keeps its 0.5 pair (index 1), drops the 0.25
    assert_line "keep 1 1 0 1 kept 1 1 1"
}

@test "capacity: liblrmoe.so.2 exports the calls and installs capacity.h" {
    SO="$BATS_TEST_DIRNAME/../build/liblrmoe.so.2"
    syms=$(nm -D --defined-only "$SO" | awk '{ sub(/@.*/, "", $3); print $3 }')
    for s in lrmoe_capacity lrmoe_capacity_pairs lrmoe_capacity_keep \
             lrmoe_capacity_policy_parse lrmoe_capacity_policy_name \
             lrmoe_plan_set_capacity_factor lrmoe_plan_capacity_factor; do
        printf '%s\n' "$syms" | grep -qx "$s" || fail "$s not exported"
    done
    grep -q 'lib/capacity.h' "$BATS_TEST_DIRNAME/../Makefile"
}

@test "plan --planner capacity: quota = min(n_e, C), fixed's placement and fwd_alloc, the attributes; lrmoe_plan_check passes" {
    routed
    for f in 1.0 1.25 0.5; do
        run "$BIN/lrmoe-plan" -P 4 -M 0 -p capacity --capacity-factor "$f" -o "$T/c.lrm" "$T/r.lrm"
        assert_success
        "$BIN/lrmoe-plan" -P 4 -M 0 -p fixed -o "$T/x.lrm" "$T/r.lrm"
        run python3 - "$T/r.lrm" "$T/c.lrm" "$T/x.lrm" "$f" <<'EOF'
import math, sys
import numpy as np
from lrmoe_stream import read_stream
r, c, x = (read_stream(p) for p in sys.argv[1:4])
F = float(sys.argv[4])
drops = 0
for (rt, ra), (ct, ca), (xt, xa) in zip(r, c, x):
    n = rt["expert_load"].astype(np.int64)
    T, K = rt["topk_ids"].shape
    E, P = n.size, 4
    C = math.ceil((T * K / E) * F)
    q = np.minimum(n, C)
    assert ca["plan.planner"] == "capacity"
    assert int(ca["plan.capacity"]) == C, (ca["plan.capacity"], C)
    assert float(ca["plan.capacity_factor"]) == F
    assert ca["plan.drop_policy"] == "probs"
    assert int(ca["plan.dropped_fwd"]) == int(n.sum() - q.sum())
    assert np.array_equal(ct["quota"], q)
    assert np.array_equal(ct["placement"], xt["placement"])
    assert np.array_equal(ct["fwd_alloc"], xt["fwd_alloc"])    # every pair, rows = n_e
    b = np.zeros((E, P), np.int64)
    b[np.arange(E), np.arange(E) // (E // P)] = q
    assert np.array_equal(ct["bwd_alloc"], b)
    peak = int(b.sum(0).max())
    assert int(ca["plan.fwd_peak"]) == peak and int(ca["plan.bwd_peak"]) == peak
    assert abs(float(ca["plan.rho"]) - q.sum() / n.sum()) < 1e-6
    drops += int(ca["plan.dropped_fwd"])
print("dropped", drops)
EOF
        assert_success
        case "$f" in
        0.5) assert_output --regexp '^dropped [1-9][0-9]*$' ;;
        esac
    done
    # position keeps as many: the same plan, another plan.drop_policy
    "$BIN/lrmoe-plan" -P 4 -M 0 -p capacity --capacity-factor 0.5 -o "$T/a.lrm" "$T/r.lrm"
    "$BIN/lrmoe-plan" -P 4 -M 0 -p capacity --capacity-factor 0.5 --drop-policy position \
        -o "$T/b.lrm" "$T/r.lrm"
    run "$BIN/lrmoe-view" --diff "$T/a.lrm" "$T/b.lrm"
    assert_failure 1
    assert_output --partial "plan.drop_policy"
    refute_output --partial "quota"
}

@test "plan --planner capacity: memory, time and peaks are fixed's on the kept loads min(n_e, C)" {
    routed
    "$BIN/lrmoe-plan" -P 4 -p capacity --capacity-factor 0.8 --hbm 1MiB -S "$T/c.tsv" \
        -o "$T/c.lrm" "$T/r.lrm"
    # the same frames with expert_load replaced by the kept loads, planned by fixed
    python3 - "$T/r.lrm" "$T/k.lrm" <<'EOF'
import math, sys
import numpy as np
from lrmoe_stream import read_stream, write_stream
out = []
for t, a in read_stream(sys.argv[1]):
    T, K = t["topk_ids"].shape
    n = t["expert_load"]
    C = math.ceil((T * K / n.size) * 0.8)
    out.append(({"expert_load": np.minimum(n, C).astype(np.int64)},
                {"ffn": "16", "layer": a["layer"], "step": a["step"]}))
write_stream(sys.argv[2], out)
EOF
    "$BIN/lrmoe-plan" -P 4 -p fixed --hbm 1MiB -D 32 -k 4 --tokens 64 -S "$T/x.tsv" \
        -o /dev/null "$T/k.lrm"
    # every modelled column but the planner, pairs, rho and timings agree
    run python3 - "$T/c.tsv" "$T/x.tsv" <<'EOF'
import sys
rows = [[l.rstrip("\n").split("\t") for l in open(p)] for p in sys.argv[1:]]
h = rows[0][0]
same = ["fwd_peak", "bwd_peak", "fwd_lb", "bwd_lb", "mem_peak_gib", "mem_peak_rank",
        "t_comm_ms", "t_total_ms", "feasible", "binding", "hidden", "ffn", "topk"]
for a, b in zip(rows[0][1:], rows[1][1:]):
    for c in same:
        i = h.index(c)
        assert a[i] == b[i], (c, a[i], b[i])
print(len(rows[0]) - 1, "frames", [r[h.index("feasible")] for r in rows[0][1:]])
EOF
    assert_success
    assert_output --regexp "^4 frames"
}

@test "plan: a capacity plan that drops forward pairs is refused by lrmoe-exec; one that drops none runs; re-planning removes the attributes" {
    routed
    "$BIN/lrmoe-plan" -P 2 -M 0 -p capacity --capacity-factor 0.5 -o "$T/c.lrm" "$T/r.lrm"
    run "$BIN/lrmoe-exec" --phase forward --weights "$T/w.lrm" -@ 1 -o "$T/f.lrm" "$T/c.lrm"
    assert_failure 1
    assert_output --regexp "^lrmoe-exec: frame 0: plan: planner capacity drops [0-9]+ forward pairs \(plan.dropped_fwd\)"
    # a factor so large nothing is dropped: the plan is fixed's, and it runs
    "$BIN/lrmoe-plan" -P 2 -M 0 -p capacity --capacity-factor 100 -o "$T/n.lrm" "$T/r.lrm"
    run "$BIN/lrmoe-exec" --phase forward --weights "$T/w.lrm" -@ 1 -o "$T/f.lrm" "$T/n.lrm"
    assert_success
    # re-planned by fixed: no plan.capacity* attribute survives
    "$BIN/lrmoe-plan" -P 2 -M 0 -p fixed -o "$T/x.lrm" "$T/c.lrm"
    run "$BIN/lrmoe-view" "$T/x.lrm"
    refute_output --partial "plan.capacity"
    refute_output --partial "plan.dropped_fwd"
    run "$BIN/lrmoe-exec" --phase forward --weights "$T/w.lrm" -@ 1 -o "$T/f.lrm" "$T/x.lrm"
    assert_success
}

@test "plan: bad capacity options exit 2 with the option named" {
    routed
    for f in 0 -1 nan inf 1.1234567 3000; do
        run "$BIN/lrmoe-plan" -P 2 -p capacity --capacity-factor "$f" "$T/r.lrm"
        assert_failure 2
        assert_output --regexp "^lrmoe-plan: --capacity-factor"
    done
    run "$BIN/lrmoe-plan" -P 2 -p capacity --drop-policy random "$T/r.lrm"
    assert_failure 2
    assert_output "lrmoe-plan: --drop-policy: unknown drop policy 'random' (probs, position)"
    run "$BIN/lrmoe-plan" -P 2 -p capped "$T/r.lrm"
    assert_failure 2
    assert_output "lrmoe-plan: unknown planner 'capped' (fixed, llep, eplb, lrmoe, capacity)"
    run "$BIN/lrmoe-plan" --help
    assert_output --partial "--capacity-factor F"
    assert_output --partial "--drop-policy NAME"
}
