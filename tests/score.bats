#!/usr/bin/env bats
# lrmoe-score against the NumPy reference in tests/helpers/score_ref.py:
# every metric, plan quotas and --drop, tie-breaking, fidelity, bad input.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    REF="python3 $BATS_TEST_DIRNAME/helpers/score_ref.py"
    T="$BATS_TEST_TMPDIR"
}

# a two-frame synthetic stream with forward state and a plan
mk() { $REF make "$T/in.lrm" --frames 2 "$@"; }

# the output must end without a trailer
truncated() { # no trailer: cut after some frames, or not one frame (an empty stream)
    run "$BIN/lrmoe-cat" "$1"
    assert_failure
    assert_output --regexp "truncated|empty stream \(no frame, no trailer\): the stage that wrote it failed"
}

@test "lrm scores and keep match the reference with the plan's quotas" {
    mk --T 96 --E 12 --rate 0.7
    run "$BIN/lrmoe-score" -o "$T/out.lrm" "$T/in.lrm"
    assert_success
    run $REF check-score "$T/in.lrm" "$T/out.lrm" --metric lrm
    assert_success
}

@test "gradnorm, absgrad and random match the reference (F32 and BF16)" {
    for dt in F32 BF16; do
        mk --dtype $dt --T 80 --seed 3
        for m in gradnorm absgrad random; do
            "$BIN/lrmoe-score" -m $m --seed 7 "$T/in.lrm" > "$T/out.lrm"
            run $REF check-score "$T/in.lrm" "$T/out.lrm" --metric $m --seed 7
            assert_success
        done
    done
}

@test "--drop C keeps n - floor(n*C/100) per expert and writes quota" {
    mk --noplan --T 100 --E 10
    for c in 0 10 20 30 100; do
        "$BIN/lrmoe-score" --drop $c "$T/in.lrm" > "$T/out.lrm"
        run $REF check-score "$T/in.lrm" "$T/out.lrm" --drop $c
        assert_success
    done
}

@test "ties break by the lower pair index, on quantised and all-equal scores" {
    for ties in 1 2; do
        mk --ties $ties --T 120 --E 6 --K 3
        "$BIN/lrmoe-score" --drop 37 "$T/in.lrm" > "$T/out.lrm"
        run $REF check-score "$T/in.lrm" "$T/out.lrm" --drop 37
        assert_success
    done
    # all-equal scores: each expert keeps exactly its earliest pairs
    run python3 - "$T/in.lrm" "$T/out.lrm" "$BATS_TEST_DIRNAME/helpers" <<'PY'
import sys, numpy as np
sys.path.insert(0, sys.argv[3])
from lrmoe_stream import read_stream
(t, a), = read_stream(sys.argv[2])[:1]
ids, keep = t["topk_ids"].ravel(), t["keep"].ravel()
assert np.unique(t["pair_score"]).size == 1, "scores are not all equal"
for e in np.unique(ids):
    u = np.flatnonzero(ids == e)
    q = len(u) - int(np.floor(len(u) * 0.37 + 1e-9))
    assert keep[u[:q]].all() and not keep[u[q:]].any(), e
print("ok")
PY
    assert_success
    assert_output "ok"
}

@test "a large expert: selection agrees with a full sort" {
    mk --T 3000 --E 3 --K 2 --D 8 --F 4 --frames 1
    "$BIN/lrmoe-score" -m gradnorm --drop 25 "$T/in.lrm" > "$T/out.lrm"
    run $REF check-score "$T/in.lrm" "$T/out.lrm" --metric gradnorm --drop 25
    assert_success
}

@test "--fidelity matches the reference dW_down error, per expert and overall" {
    mk --T 64 --E 8 --D 24 --F 16
    for m in lrm random; do
        "$BIN/lrmoe-score" -m $m --drop 30 --fidelity "$T/in.lrm" > "$T/out.lrm"
        run $REF check-score "$T/in.lrm" "$T/out.lrm" --metric $m --drop 30 --fidelity
        assert_success
    done
}

@test "lrm loses less dW_down than random at C30 (fidelity attribute)" {
    mk --T 256 --E 8 --D 32 --F 24 --frames 1
    for m in lrm random; do
        "$BIN/lrmoe-score" -m $m --drop 30 --fidelity "$T/in.lrm" -v \
            2> "$T/$m.err" > /dev/null
    done
    lrm=$(sed -n 's/.*fidelity \([0-9.e+-]*\).*/\1/p' "$T/lrm.err")
    rnd=$(sed -n 's/.*fidelity \([0-9.e+-]*\).*/\1/p' "$T/random.err")
    run python3 -c "import sys; sys.exit(0 if 0 < $lrm < $rnd else 1)"
    assert_success
}

@test "missing phi_sqnorm: error, exit 1, no trailer" {
    mk
    $REF corrupt "$T/in.lrm" "$T/bad.lrm" nophi
    run "$BIN/lrmoe-score" -o "$T/out.lrm" "$T/bad.lrm"
    assert_failure 1
    assert_output "lrmoe-score: frame 0: missing tensor phi_sqnorm (lrmoe-exec --phase forward writes it: run that first)"
    truncated "$T/out.lrm"
    # the gradient-only metrics do not need it
    run "$BIN/lrmoe-score" -m gradnorm -o "$T/out.lrm" "$T/bad.lrm"
    assert_success
}

@test "NaN in grad_output or phi_sqnorm: error naming the pair, exit 1, no trailer" {
    mk --dtype BF16
    for w in nangrad nanphi; do
        $REF corrupt "$T/in.lrm" "$T/bad.lrm" $w
        run "$BIN/lrmoe-score" -o "$T/out.lrm" "$T/bad.lrm"
        assert_failure 1
        assert_output --regexp "^lrmoe-score: frame 0: pair_score: NaN score at pair [0-9]+ \(token [0-9]+, k [0-9]+\)"
        truncated "$T/out.lrm"
    done
}

@test "a quota above the expert's load: error, exit 1, no trailer" {
    mk
    $REF corrupt "$T/in.lrm" "$T/bad.lrm" bigquota
    run "$BIN/lrmoe-score" -o "$T/out.lrm" "$T/bad.lrm"
    assert_failure 1
    assert_output --regexp "^lrmoe-score: frame 0: quota: expert [0-9]+ has quota [0-9]+ but [0-9]+ routed pairs$"
    truncated "$T/out.lrm"
}

@test "no quota and no --drop is an error" {
    mk --noplan
    run "$BIN/lrmoe-score" -o "$T/out.lrm" "$T/in.lrm"
    assert_failure 1
    assert_output --partial "missing tensor quota"
}

@test "usage errors exit 2; --help and --version" {
    run "$BIN/lrmoe-score" --metric nope
    assert_failure 2
    assert_output --partial "lrmoe-score: unknown metric 'nope'"
    run "$BIN/lrmoe-score" --drop 101
    assert_failure 2
    run "$BIN/lrmoe-score" --drop x
    assert_failure 2
    run "$BIN/lrmoe-score" --help
    assert_success
    assert_output --partial "Usage: lrmoe-score"
    run "$BIN/lrmoe-score" --version
    assert_output --regexp "^lrmoe-score \(lrmoe\) [0-9]"
}

@test "man page passes mandoc lint" {
    run mandoc -T lint -W warning "$BATS_TEST_DIRNAME/../man/man1/lrmoe-score.1"
    assert_success
    assert_output ""
}

@test "-@ N: threaded scoring and selection give the same bits as one thread (every metric, --drop)" {
    mk --T 700 --E 12 --rate 0.6 --dtype BF16
    for m in lrm gradnorm absgrad random; do
        "$BIN/lrmoe-score" --metric "$m" -@ 1 -o "$T/s1.lrm" "$T/in.lrm"
        for n in 2 3 4; do
            "$BIN/lrmoe-score" --metric "$m" -@ "$n" -o "$T/s$n.lrm" "$T/in.lrm"
            run python3 -c "
import sys; sys.path.insert(0, '$BATS_TEST_DIRNAME/helpers'); from lrmoe_stream import read_stream
import numpy as np
a, b = read_stream('$T/s1.lrm'), read_stream('$T/s$n.lrm')
assert len(a) == len(b) == 2
for (ta, _), (tb, _) in zip(a, b):
    assert sorted(ta) == sorted(tb)
    for k in ta: assert np.array_equal(ta[k], tb[k]), k
print('same')"
            assert_success
            assert_output "same"
        done
    done
    "$BIN/lrmoe-score" --drop 30 -@ 3 -o "$T/d3.lrm" "$T/in.lrm"
    run $REF check-score "$T/in.lrm" "$T/d3.lrm" --metric lrm --drop 30
    assert_success
}
