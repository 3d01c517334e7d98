#!/usr/bin/env bats
# lrmoe-plan and the plan library: the DeepSeek EPLB README example, the
# exactness of the min-peak allocation (GLPK vs the closed-form T* vs
# max-flow on hundreds of random instances, brute force on tiny ones), LLEP
# hand-worked vectors, every planner against independent Python references
# (tests/helpers/plan_ref.py), the plan consistency check, the cost model's
# worked example, budgets and bad input.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

# The unit program (tests/unit/plan_test.c) is compiled from the library
# sources it needs, into the file's temp dir.
setup_file() {
    L="$BATS_TEST_DIRNAME/../lib"
    cc -std=c11 -O2 -D_GNU_SOURCE -I"$L" -o "$BATS_FILE_TMPDIR/plan_test" \
        "$BATS_TEST_DIRNAME/unit/plan_test.c" "$L/plan.c" "$L/plan_eplb.c" \
        "$L/plan_llep.c" "$L/plan_lrmoe.c" "$L/cost.c" "$L/error.c" "$L/frame.c" "$L/producers.c" \
        "$L/dtype.c" "$L/cli.c" "$L/stream.c" -lzstd -ljansson -lglpk -lm -lpthread
}

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    REF="python3 $BATS_TEST_DIRNAME/helpers/plan_ref.py"
    UT="$BATS_FILE_TMPDIR/plan_test"
    T="$BATS_TEST_TMPDIR"
}

truncated() {
    run python3 -c "import sys; sys.path.insert(0, '$BATS_TEST_DIRNAME/helpers')
from lrmoe_stream import read_stream
read_stream('$1')"
    assert_failure
    assert_output --partial "truncated"
}

@test "eplb reproduces the DeepSeek EPLB README example exactly" {
    run "$UT" eplb-readme
    assert_success
    assert_line "phy2log[0] = 5 6 5 7 8 4 3 4 10 9 10 2 0 1 11 1"
    assert_line "phy2log[1] = 7 10 6 8 6 11 8 9 2 4 5 1 5 0 3 1"
}

@test "min-peak: GLPK == closed-form T* == max-flow on 1200 random instances" {
    for s in 1 2 3; do
        run "$UT" random 400 $s
        assert_success
        assert_output "400 instances, 0 failures"
    done
    # 17..24 ranks: the bounds come from max-flow bisection
    run "$UT" random-large 100 4
    assert_success
    assert_output "100 instances, 0 failures"
}

@test "min-peak: fast path and max-flow search == full search on 600 instances, P up to 64" {
    # plan_minpeak (LB0 fast path against an upper bound, then Dinkelbach
    # steps over incremental max-flow) vs the bisection full search and, for
    # P <= 16, the closed form; each result certified by a witness subset and
    # an allocation. Both the fast path and the search must have been taken.
    for s in 1 2; do
        run "$UT" fastpath 300 $s
        assert_success
        assert_output --regexp '^300 instances, 0 failures \(fast path [1-9][0-9]*, max-flow search [1-9][0-9]*\)$'
    done
}

@test "min-peak: GLPK and T* equal the brute-force optimum on 300 tiny instances" {
    "$UT" dump 300 5 > "$T/tiny.txt"
    run python3 "$BATS_TEST_DIRNAME/helpers/plan_bruteforce.py" < "$T/tiny.txt"
    assert_success
    assert_output "ok 300"
    # the brute force catches a wrong peak
    awk -F'|' 'NR==7 { split($4, a, " "); $4 = " " a[1]+1 " " a[2] " " } 1' OFS='|' \
        "$T/tiny.txt" > "$T/bad.txt"
    run python3 "$BATS_TEST_DIRNAME/helpers/plan_bruteforce.py" < "$T/bad.txt"
    assert_failure
    assert_output --partial "MISMATCH"
}

@test "llep: native fits, partial spill, full spill (hand-worked)" {
    run "$UT" llep 4 0 1 1 10 10 10 10
    assert_output "$(printf 'ran 1\n10 0 0 0\n0 10 0 0\n0 0 10 0\n0 0 0 10')"
    # cap 15: e0 keeps 15, spills 10 to rank 2, 10 to rank 3, 5 to rank 1
    run "$UT" llep 4 0 1 1 40 10 5 5
    assert_output "$(printf 'ran 1\n15 5 10 10\n0 10 0 0\n0 0 5 0\n0 0 0 5')"
    # e0's native rank is full with e1 pending: all of e0 spills
    run "$UT" llep 2 0 1 1 30 30 0 0
    assert_output "$(printf 'ran 1\n0 30\n30 0\n0 0\n0 0')"
}

@test "llep: min-chunk skip, forced assignment, excess below m stays native" {
    # cap 42, m 15: rank 2's room 14 < m is skipped, then the remainder 16 is
    # forced onto the least-loaded helper (rank 2)
    run "$UT" llep 4 0 1 15 90 27 28 25
    assert_output "$(printf 'ran 1\n42 15 16 17\n0 27 0 0\n0 0 28 0\n0 0 0 25')"
    # alpha 0.5: cap 25, nobody has room for the last 50: forced to rank 1
    run "$UT" llep 2 0 0.5 1 100 0
    assert_output "$(printf 'ran 1\n25 75\n0 0')"
    # excess 5 < m 10: the native keeps it
    run "$UT" llep 2 0 1 10 55 45
    assert_output "$(printf 'ran 1\n55 0\n0 45')"
}

@test "llep: lambda fallback to plain EP below the threshold" {
    run "$UT" llep 2 1.3 1 10 55 45
    assert_output "$(printf 'ran 0\n55 0\n0 45')"
    run "$UT" llep 2 1.3 1 10 90 10
    assert_output "$(printf 'ran 1\n50 40\n0 10')"
}

@test "all four planners on E=128 P=8 skew and Zipf frames match the references" {
    $REF gen "$T/in.lrm" --frames 6 --seed 11
    for p in fixed llep eplb lrmoe; do
        run "$BIN/lrmoe-plan" -P 8 -p $p -M 0 -o "$T/$p.lrm" "$T/in.lrm"
        assert_success
        run $REF check "$T/in.lrm" "$T/$p.lrm" --planner $p --ranks 8 --rates 1.0
        assert_success
        run "$UT" check-stream "$T/$p.lrm"
        assert_success
    done
}

@test "llep options and eplb hierarchy (nodes, groups, slots) match the references" {
    $REF gen "$T/in.lrm" --frames 6 --seed 12 --experts 64 --pairs 100000
    "$BIN/lrmoe-plan" -P 8 -p llep --lambda 1.1 --alpha 1.2 -m 300 "$T/in.lrm" > "$T/l.lrm"
    run $REF check "$T/in.lrm" "$T/l.lrm" --planner llep --ranks 8 --lambda 1.1 --alpha 1.2 --min-chunk 300
    assert_success
    "$BIN/lrmoe-plan" -P 8 -p eplb -N 2 -G 8 -s 10 "$T/in.lrm" > "$T/e.lrm"
    run $REF check "$T/in.lrm" "$T/e.lrm" --planner eplb --ranks 8 --nodes 2 --groups 8 --slots 10
    assert_success
    # groups not divisible by nodes: the global policy
    "$BIN/lrmoe-plan" -P 8 -p eplb -N 4 -G 2 -s 9 "$T/in.lrm" > "$T/g.lrm"
    run $REF check "$T/in.lrm" "$T/g.lrm" --planner eplb --ranks 8 --nodes 4 --groups 2 --slots 9
    assert_success
}

@test "lrmoe with 16 and 32 ranks (estimate-based replicas) stays consistent and optimal" {
    $REF gen "$T/in.lrm" --frames 4 --seed 20 --scenario zipf
    for P in 16 32; do
        run "$BIN/lrmoe-plan" -P $P -M 0 -S "$T/s.tsv" -o "$T/o.lrm" "$T/in.lrm"
        assert_success
        run "$UT" check-stream "$T/o.lrm"
        assert_success
        # the emitted peaks equal the optimum for the emitted placement, and
        # replicas were placed
        run awk -F'\t' 'NR > 1 && ($9 != $11 || $10 != $12 || $15 < 1)' "$T/s.tsv"
        assert_output ""
    done
}

@test "lrmoe under a tight budget lowers rho; peaks stay optimal (both quota policies)" {
    $REF gen "$T/in.lrm" --frames 6 --seed 13
    for q in minpeak proportional; do
        run "$BIN/lrmoe-plan" -P 8 -M 6.3G -q $q -S "$T/s.tsv" -o "$T/o.lrm" "$T/in.lrm"
        assert_success
        run $REF check "$T/in.lrm" "$T/o.lrm" --planner lrmoe --ranks 8 --quota $q --rates 1.0,0.9,0.8,0.7
        assert_success
        assert_output --partial "rho 0.900"
        run awk -F'\t' 'NR > 1 && ($8 != "0.900000" || $20 != 1 || $23 !~ /rate 1.000: memory: rank [0-7] needs/)' "$T/s.tsv"
        assert_output ""
    done
}

@test "lrmoe: min-keep floors, a fixed --rate, proportional quotas sum to floor(rho*N)" {
    $REF gen "$T/in.lrm" --frames 6 --seed 14 --experts 32 --pairs 50000
    run "$BIN/lrmoe-plan" -P 4 -R 0.6 -k 0.5 -M 0 -o "$T/o.lrm" "$T/in.lrm"
    assert_success
    run $REF check "$T/in.lrm" "$T/o.lrm" --planner lrmoe --ranks 4 --rates 0.6 --min-keep 0.5
    assert_success
    run "$BIN/lrmoe-plan" -P 4 -R 0.6 -q proportional -k 0 -s 8 -M 0 -o "$T/p.lrm" "$T/in.lrm"
    assert_success
    run $REF check "$T/in.lrm" "$T/p.lrm" --planner lrmoe --ranks 4 --rates 0.6 --min-keep 0 --quota proportional --slots 8
    assert_success
}

@test "lrmoe: no rate fits -> exit 1 naming rank, need and budget, no trailer" {
    $REF gen "$T/in.lrm" --frames 2 --seed 15 --scenario hot95
    run "$BIN/lrmoe-plan" -P 8 -M 4G -s 16 -o "$T/o.lrm" "$T/in.lrm"
    assert_failure 1
    assert_output --regexp "^lrmoe-plan: frame 0: infeasible at every rate \(4 tried\): rate 0\.700: memory: rank [0-7] needs [0-9.]+ GiB, budget 4\.000 GiB$"
    truncated "$T/o.lrm"
    run "$BIN/lrmoe-plan" -P 8 -M 4G -s 16 -b -o "$T/o.lrm" "$T/in.lrm"
    assert_success
    run $REF check "$T/in.lrm" "$T/o.lrm" --planner lrmoe --ranks 8 --slots 16
    assert_success
    assert_output --partial "rho 0.700"
    # min-keep larger than every rate
    run "$BIN/lrmoe-plan" -P 8 -R 0.5 -k 0.8 -M 0 "$T/in.lrm"
    assert_failure 1
    assert_output --partial "min-keep"
}

@test "lrmoe: the all-to-all window binds" {
    $REF gen "$T/in.lrm" --frames 2 --seed 16 --scenario uniform
    run "$BIN/lrmoe-plan" -P 8 -M 0 -W 0.001 -o "$T/o.lrm" "$T/in.lrm"
    assert_failure 1
    assert_output --regexp "window: all-to-all needs [0-9.]+ ms, window 1\.000 ms"
    run "$BIN/lrmoe-plan" -P 8 -M 0 -W 1 -o "$T/o.lrm" "$T/in.lrm"
    assert_success
}

@test "baselines over budget are reported (plan.feasible=0), not refused" {
    $REF gen "$T/in.lrm" --frames 2 --seed 17 --scenario hot80
    run "$BIN/lrmoe-plan" -P 8 -p fixed -S "$T/s.tsv" -o "$T/o.lrm" "$T/in.lrm"
    assert_success
    run awk -F'\t' 'NR > 1 { print $4, $20, ($23 ~ /^memory: rank [0-7] needs/) }' "$T/s.tsv"
    assert_output "$(printf 'fixed 0 1\nfixed 0 1')"
}

@test "cost model worked example: exact loads at the paper's setup" {
    # E=128, 32768 tokens x 8 ranks x top-8 pairs, every expert 16384 pairs:
    # f = r = 262144 rows per rank; (2*2048*2 + 2*768*2 + (3*2048+2*768)*2)
    # bytes per row = 26624 -> 6979321856 bytes = 6.5 GiB
    $REF gen "$T/in.lrm" --frames 1 --scenario exact
    run "$BIN/lrmoe-plan" -P 8 -p fixed -S "$T/s.tsv" -o "$T/o.lrm" "$T/in.lrm"
    assert_success
    run python3 -c "import sys; sys.path.insert(0, '$BATS_TEST_DIRNAME/helpers')
from lrmoe_stream import read_stream
a = read_stream('$T/o.lrm')[0][1]
print(a['plan.mem_peak'], a['plan.fwd_peak'], a['plan.replicas'], a['plan.feasible'])"
    assert_output "6979321856 262144 0 1"
    # dispatch: 262144*7/8 rows of 4096 B at 100e9 B/s, both ways, twice
    run awk -F'\t' 'NR == 2 { print $18 }' "$T/s.tsv"
    assert_output "37.580964"
}

@test "--stats writes a header and one row per frame; pass-through kept" {
    $REF gen "$T/in.lrm" --frames 5 --seed 18
    run "$BIN/lrmoe-plan" -P 8 -p llep -S "$T/s.tsv" -o "$T/o.lrm" "$T/in.lrm"
    assert_success
    run awk -F'\t' 'END { print NR, NF } NR == 1 { print $1, $4, $9, $14, $23 }' "$T/s.tsv"
    assert_output "$(printf 'frame planner fwd_peak peak_over_mean binding\n6 23')"
}

@test "the consistency check rejects broken plans" {
    $REF gen "$T/in.lrm" --frames 2 --seed 19
    "$BIN/lrmoe-plan" -P 8 -M 0 "$T/in.lrm" > "$T/o.lrm"
    run "$UT" check-stream "$T/o.lrm"
    assert_success
    for w in rowsum native ineligible negative quota; do
        $REF corrupt "$T/o.lrm" "$T/c.lrm" $w
        run "$UT" check-stream "$T/c.lrm"
        assert_failure
    done
    $REF corrupt "$T/o.lrm" "$T/c.lrm" ineligible
    run "$UT" check-stream "$T/c.lrm"
    assert_output --regexp "fwd_alloc\[[0-9]+,[0-9]+\]: 1 pairs on a rank without expert"
}

@test "bad input: clear error, exit 1, no trailer" {
    for b in float negative missing logits shape; do
        $REF gen "$T/in.lrm" --frames 2 --experts 16 --pairs 1000 --bad $b
        run "$BIN/lrmoe-plan" -P 4 -o "$T/o.lrm" "$T/in.lrm"
        assert_failure 1
        assert_output --regexp "^lrmoe-plan: frame 0: "
        truncated "$T/o.lrm"
    done
    $REF gen "$T/in.lrm" --frames 2 --experts 12 --pairs 1000
    run "$BIN/lrmoe-plan" -P 8 -o "$T/o.lrm" "$T/in.lrm"
    assert_failure 1
    assert_output --partial "8 ranks do not divide 12 experts"
    # a truncated input
    head -c 200 "$T/in.lrm" > "$T/cut.lrm"
    run "$BIN/lrmoe-plan" -P 4 -o "$T/o.lrm" "$T/cut.lrm"
    assert_failure 1
}

@test "bad options: exit 2" {
    $REF gen "$T/in.lrm" --frames 1 --experts 16 --pairs 100
    run "$BIN/lrmoe-plan" "$T/in.lrm"
    assert_failure 2
    assert_output --partial "--ranks P is required"
    for o in "-R 0" "-R 1.5" "-r 1.0,0" "-r 0.9,,0.8" "-M -1G" "-M 5X" "-B 0" "-W -1" \
             "-p nope" "-q nope" "-k 1.5" "--glpk-time 0" "--gpu-mem 80G" \
             "--gpu-mem 10G --resident 20G"; do
        run "$BIN/lrmoe-plan" -P 4 $o "$T/in.lrm"
        assert_failure 2
        assert_output --regexp "^lrmoe-plan: "
    done
}

@test "lrmoe-plan and lrmoe-sim read the shared planner options alike (lib/plan_cli.c)" {
    $REF gen "$T/in.lrm" --frames 1 --experts 16 --pairs 100
    for o in "-P 0" "-P x" "-K 0" "-D 0" "--dtype nope" "--gpu-mem 80G" \
             "--resident 8G" "--gpu-mem 10G --resident 10G" "--gpu-mem 10G --resident 20G" \
             "--lambda -1" "-m -1" "-s 0"; do
        run "$BIN/lrmoe-plan" -P 4 $o "$T/in.lrm"
        assert_failure 2
        a=${output#lrmoe-plan: }
        run "$BIN/lrmoe-sim" -P 4 $o "$T/in.lrm"
        assert_failure 2
        assert_output "lrmoe-sim: $a"
    done
    # good values of the same options are accepted
    run "$BIN/lrmoe-plan" -P 4 -K 2 -D 64 -F 32 -T 100 --gpu-mem 1G --resident 999M \
        "$T/in.lrm"
    assert_success
}

@test "--help and --version" {
    run "$BIN/lrmoe-plan" --help
    assert_success
    assert_output --partial "Usage: lrmoe-plan"
    run "$BIN/lrmoe-plan" --version
    assert_success
    assert_output --regexp "^lrmoe-plan \(lrmoe\) [0-9]"
}
