#!/usr/bin/env bats
# The lrmoe planner's exact skips (issue 12): planned with and without
# LRMOE_PLAN_EXHAUSTIVE=1 (every bound prune, bwd_loses, the early return of
# bwd_in_place and the duplicate min-peak candidate of a baseline without
# replicas off), random traces at P = 4..128, E = 16..384, nodes 1..16, budgets
# from unlimited to below rate 1's, all three quota policies and
# --longer-backward, and keep.bats' P=4 trace (where follow and in-place
# backwards win) must give byte-identical streams and --stats rows (minus the
# *_ms columns). tests/helpers/plan_exact.py fails when the runs lose their
# power: no chosen follow or in-place plan, no frame at rho < 1 or at rho 1.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    H="$BATS_TEST_DIRNAME/helpers"
    T="$BATS_TEST_TMPDIR"
}

@test "plan: the exact skips change no plan (LRMOE_PLAN_EXHAUSTIVE=1 gives the same streams and stats)" {
    "$BIN/lrmoe-gen" --tokens 512 --experts 16 --topk 4 --hidden 48 --ffn 32 --dtype f32 \
        --skew hot:80:2 --seed 5 --steps 3 --weights "$T/w.lrm" |
        "$BIN/lrmoe-route" --topk 4 --renorm > "$T/r.lrm"
    run python3 "$H/plan_exact.py" "$BIN" "$T" "$T/r.lrm"
    echo "$output"
    assert_success
    assert_output --partial " with differences"
    refute_output --partial "DIFF:"
}
