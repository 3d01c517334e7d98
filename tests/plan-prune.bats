#!/usr/bin/env bats
# The lrmoe planner's exact skips (its search's prunes change no plan): planned with and without
# LRMOE_PLAN_EXHAUSTIVE=1 (every bound prune, bwd_loses, the early return of
# bwd_in_place and the duplicate min-peak candidate of a baseline without
# replicas off), random traces at P = 4..128, E = 16..384, nodes 1..16,
# budgets from unlimited to below rate 1's, all three quota policies and
# --longer-backward, and small routed P=4 traces (by-rank.bats' among them: follow
# and in-place backwards win there) must give byte-identical streams and
# --stats rows (minus the *_ms columns). The rate loop, which both runs share,
# is checked on its own: with --rates 1.0,0.9,0.8,0.7 each frame takes the
# plan of the first rate that fits alone. tests/helpers/plan_exact.py fails
# when the runs lose their power: no chosen follow or in-place plan, no frame
# at rho < 1 or at rho 1, a rate (or none fitting) that no frame took.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    H="$BATS_TEST_DIRNAME/helpers"
    T="$BATS_TEST_TMPDIR"
}

@test "plan: the exact skips change no plan (LRMOE_PLAN_EXHAUSTIVE=1 gives the same streams and stats), and the first fitting rate wins" {
    # by-rank.bats' trace (seed 5, hot:80:2) and two more: a follow backward
    # wins on some of their frames, and an inexact skip of it shows there
    # (bwd_loses always true once a plan fits changed only these runs)
    for g in 5:hot:80:2 2:zipf:1.2 6:hot:60:1; do
        "$BIN/lrmoe-gen" --tokens 512 --experts 16 --topk 4 --hidden 48 --ffn 32 --dtype f32 \
            --skew "${g#*:}" --seed "${g%%:*}" --steps 3 --weights "$T/w.lrm" |
            "$BIN/lrmoe-route" --topk 4 --renorm > "$T/r${g%%:*}.lrm"
    done
    run python3 "$H/plan_exact.py" "$BIN" "$T" "$T/r5.lrm" "$T/r2.lrm" "$T/r6.lrm"
    echo "$output"
    assert_success
    assert_output --partial " with differences"
    refute_output --partial "DIFF:"
}
