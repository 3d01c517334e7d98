#!/usr/bin/env bats
# lrmoe-pack against the NumPy reference in tests/helpers/score_ref.py:
# assignment per bwd_alloc with the fewest moves, the packed layout and
# rows, the exact unpack round trip, and bad input.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    REF="python3 $BATS_TEST_DIRNAME/helpers/score_ref.py"
    T="$BATS_TEST_TMPDIR"
}

# a scored two-frame synthetic stream (forward state, plan with replicas)
mk() {
    $REF make "$T/in.lrm" --frames 2 "$@"
    "$BIN/lrmoe-score" --select topk "$T/in.lrm" > "$T/scored.lrm"
}

truncated() { # no trailer: cut after some frames, or not one frame (an empty stream)
    run "$BIN/lrmoe-cat" "$1"
    assert_failure
    assert_output --regexp "truncated|empty stream \(no frame, no trailer\): the stage that wrote it failed"
}

@test "packed tensors match the reference (bwd_alloc, F32)" {
    mk --T 96 --E 12 --P 4 --rate 0.7
    run "$BIN/lrmoe-pack" -o "$T/p.lrm" "$T/scored.lrm"
    assert_success
    run $REF check-pack "$T/p.lrm"
    assert_success
}

@test "packed tensors match the reference (BF16 storage, 8 ranks, C0 and C50)" {
    for r in 1.0 0.5; do
        mk --dtype BF16 --T 120 --E 16 --P 8 --rate $r --seed 4
        "$BIN/lrmoe-pack" "$T/scored.lrm" > "$T/p.lrm"
        run $REF check-pack "$T/p.lrm"
        assert_success
    done
}

@test "--alloc forward keeps every row on its forward rank (no moves)" {
    mk --T 80 --E 8 --P 4
    "$BIN/lrmoe-pack" --alloc forward "$T/scored.lrm" > "$T/p.lrm"
    run $REF check-pack "$T/p.lrm" --alloc forward
    assert_success
    run python3 - "$T/p.lrm" "$BATS_TEST_DIRNAME/helpers" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
from lrmoe_stream import read_stream
for t, a in read_stream(sys.argv[1]):
    assert a["pack.moved"] == "0" and a["pack.alloc"] == "forward", a
    assert (t["pack_rank"] == t["pair_rank"].ravel()[t["pack_pair"]]).all()
print("ok")
PY
    assert_output "ok"
}

@test "without placement or bwd_alloc, --ranks gives P" {
    $REF make "$T/in.lrm" --noplan --T 40 --E 8 --P 4
    "$BIN/lrmoe-score" --select topk --drop 20 "$T/in.lrm" > "$T/s.lrm"
    run "$BIN/lrmoe-pack" -o "$T/p.lrm" "$T/s.lrm"
    assert_failure 1
    assert_output --partial "give --ranks"
    run "$BIN/lrmoe-pack" -P 4 -o "$T/p.lrm" "$T/s.lrm"
    assert_success
    run python3 - "$T/p.lrm" "$BATS_TEST_DIRNAME/helpers" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
from lrmoe_stream import read_stream
(t, a), = read_stream(sys.argv[1])
assert t["pack_counts"].shape == (4, 8)
assert (t["pack_rank"] == t["pair_rank"].ravel()[t["pack_pair"]]).all()
assert int(a["pack.rows"]) == int(t["keep"].sum())
print("ok")
PY
    assert_output "ok"
}

@test "unpack --pairs of pack_grad is alpha*g on kept pairs, zero elsewhere, exactly" {
    for dt in F32 BF16; do
        mk --dtype $dt --T 64 --rate 0.6
        "$BIN/lrmoe-pack" "$T/scored.lrm" | "$BIN/lrmoe-pack" -u --pairs > "$T/u.lrm"
        run $REF check-unpack "$T/u.lrm" --pairs
        assert_success
    done
}

@test "unpack scatter-adds per token in ascending k, bit for bit" {
    mk --dtype BF16 --T 64 --rate 0.6
    "$BIN/lrmoe-pack" "$T/scored.lrm" | "$BIN/lrmoe-pack" -u |
        "$BIN/lrmoe-pack" -u --rows pack_hidden --into uh > "$T/u.lrm"
    run $REF check-unpack "$T/u.lrm"
    assert_success
    run $REF check-unpack "$T/u.lrm" --rows pack_hidden --into uh
    assert_success
}

@test "no kept pairs: empty segments, zero unpack" {
    mk --T 32 --rate 0.0
    "$BIN/lrmoe-pack" "$T/scored.lrm" | "$BIN/lrmoe-pack" -u > "$T/u.lrm"
    run $REF check-unpack "$T/u.lrm"
    assert_success
    run $REF check-pack "$T/u.lrm"
    assert_success
}

@test "keep disagrees with quota (more or fewer kept): error, exit 1, no trailer" {
    mk
    $REF corrupt "$T/scored.lrm" "$T/bad.lrm" keepmore
    run "$BIN/lrmoe-pack" -o "$T/out.lrm" "$T/bad.lrm"
    assert_failure 1
    assert_output --regexp "^lrmoe-pack: frame 0: keep: expert [0-9]+ keeps [0-9]+ pairs but its quota is [0-9]+$"
    truncated "$T/out.lrm"
    # without quota the bwd_alloc sums catch it
    $REF corrupt "$T/scored.lrm" "$T/bad.lrm" keepless
    run "$BIN/lrmoe-pack" -o "$T/out.lrm" "$T/bad.lrm"
    assert_failure 1
    assert_output --regexp "^lrmoe-pack: frame 0: bwd_alloc: expert [0-9]+ allocates [0-9]+ rows but [0-9]+ pairs are kept \(the keep mask is not the plan.s quotas, as after lrmoe-score --drop: pack with --alloc forward\)$"
    truncated "$T/out.lrm"
}

@test "quota, bwd_alloc or placement counting 0 experts or 0 ranks: exit 1 naming the tensor, no trailer" {
    # such tensors used to be read past their end (ASan: heap-buffer-overflow)
    mk
    for w in emptyquota:quota:0 allocnoranks:bwd_alloc:1 allocnoexperts:bwd_alloc:0 \
             placenoranks:placement:1; do
        IFS=: read -r what name dim <<< "$w"
        $REF corrupt "$T/scored.lrm" "$T/bad.lrm" "$what"
        run "$BIN/lrmoe-pack" --ranks 4 -o "$T/out.lrm" "$T/bad.lrm"
        assert_failure 1
        assert_output "lrmoe-pack: frame 0: tensor $name: dimension $dim is 0 (it counts experts or ranks: at least 1)"
        truncated "$T/out.lrm"
    done
}

@test "an expert id of 2^31-1 with nothing else saying E: exit 1 naming it, no trailer" {
    # the largest id + 1 overflowed an int (UBSan); such an E is refused
    mk
    $REF corrupt "$T/scored.lrm" "$T/bad.lrm" hugeid
    run "$BIN/lrmoe-pack" --ranks 4 -o "$T/out.lrm" "$T/bad.lrm"
    assert_failure 1
    assert_output "lrmoe-pack: frame 0: topk_ids: expert 2147483647 at pair 5: more than 1048576 experts"
    truncated "$T/out.lrm"
}

@test "bwd_alloc rows summing past 2^63: exit 1 naming the expert, no trailer" {
    # the sum overflowed (UBSan, found by the stages fuzz harness)
    mk
    $REF corrupt "$T/scored.lrm" "$T/bad.lrm" allochuge
    run "$BIN/lrmoe-pack" -o "$T/out.lrm" "$T/bad.lrm"
    assert_failure 1
    assert_output "lrmoe-pack: frame 0: bwd_alloc: expert 0 allocates more than 2^63-1 rows in all"
    truncated "$T/out.lrm"
}

@test "bwd_alloc that does not sum or sits on a rank without the expert: exit 1" {
    mk
    $REF corrupt "$T/scored.lrm" "$T/bad.lrm" allocsum
    run "$BIN/lrmoe-pack" -o "$T/out.lrm" "$T/bad.lrm"
    assert_failure 1
    assert_output --partial "bwd_alloc: expert"
    truncated "$T/out.lrm"
    $REF corrupt "$T/scored.lrm" "$T/bad.lrm" allocplace
    run "$BIN/lrmoe-pack" -o "$T/out.lrm" "$T/bad.lrm"
    assert_failure 1
    assert_output --partial "which holds no instance of it"
    truncated "$T/out.lrm"
}

@test "keep other than 0/1, missing keep, or a pair packed twice: exit 1" {
    mk
    $REF corrupt "$T/scored.lrm" "$T/bad.lrm" keepval
    run "$BIN/lrmoe-pack" -o "$T/out.lrm" "$T/bad.lrm"
    assert_failure 1
    assert_output "lrmoe-pack: frame 0: keep: value 2 at pair 0 (expected 0 or 1)"
    run "$BIN/lrmoe-pack" -o "$T/out.lrm" "$T/in.lrm"
    assert_failure 1
    assert_output "lrmoe-pack: frame 0: missing tensor keep (lrmoe-score writes it: run that first)"
    "$BIN/lrmoe-pack" "$T/scored.lrm" > "$T/p.lrm"
    $REF corrupt "$T/p.lrm" "$T/bad.lrm" duppair
    run "$BIN/lrmoe-pack" -u -o "$T/out.lrm" "$T/bad.lrm"
    assert_failure 1
    assert_output --partial "packed twice"
    truncated "$T/out.lrm"
}

@test "--alloc plan without bwd_alloc, and usage errors" {
    $REF make "$T/in.lrm" --noplan --T 16
    "$BIN/lrmoe-score" --select topk --drop 10 "$T/in.lrm" > "$T/s.lrm"
    run "$BIN/lrmoe-pack" --alloc plan -P 4 -o "$T/out.lrm" "$T/s.lrm"
    assert_failure 1
    assert_output --partial "missing tensor bwd_alloc"
    run "$BIN/lrmoe-pack" --alloc sideways
    assert_failure 2
    run "$BIN/lrmoe-pack" -P 0
    assert_failure 2
    run "$BIN/lrmoe-pack" --help
    assert_success
    assert_output --partial "Usage: lrmoe-pack"
    run "$BIN/lrmoe-pack" --version
    assert_output --regexp "^lrmoe-pack \(lrmoe\) [0-9]"
}

@test "man page passes mandoc lint" {
    run mandoc -T lint -W warning "$BATS_TEST_DIRNAME/../man/man1/lrmoe-pack.1"
    assert_success
    assert_output ""
}

# ---------------------------------------------------------------- pipeline
# gen | route | plan | exec forward | score | pack | exec backward, small shapes

pipe_inputs() {
    "$BIN/lrmoe-gen" --tokens 192 --experts 16 --topk 4 --hidden 48 --ffn 32 \
        --skew zipf:1.2 --seed 5 --weights "$T/w.lrm" | "$BIN/lrmoe-route" -k 4 -n > "$T/r.lrm"
}

@test "pipeline: compact backward equals masked with the same keep (fixed, llep, eplb, lrmoe)" {
    [ -x "$BIN/lrmoe-plan" ] && [ -x "$BIN/lrmoe-exec" ] || skip "lrmoe-plan or lrmoe-exec not built"
    pipe_inputs
    for pl in fixed llep eplb lrmoe; do
        case $pl in
        llep) opts="--min-chunk 1 --lambda 1.0" ;;
        lrmoe) opts="-R 0.7" ;;
        *) opts="" ;;
        esac
        "$BIN/lrmoe-plan" -p $pl -P 4 $opts "$T/r.lrm" |
            "$BIN/lrmoe-exec" --phase forward --weights "$T/w.lrm" > "$T/f.lrm"
        if [ $pl = lrmoe ]; then
            # the plan's quotas and backward allocation (rows move between instances)
            "$BIN/lrmoe-score" --select topk "$T/f.lrm" | "$BIN/lrmoe-pack" --alloc plan > "$T/p.lrm"
        else
            # baselines keep everything: drop 25% and keep rows where they ran
            "$BIN/lrmoe-score" --select topk --drop 25 "$T/f.lrm" | "$BIN/lrmoe-pack" --alloc forward > "$T/p.lrm"
        fi
        run $REF check-pack "$T/p.lrm" --alloc $([ $pl = lrmoe ] && echo plan || echo forward)
        assert_success
        for mode in masked compact full; do
            "$BIN/lrmoe-exec" --phase backward --mode $mode --weights "$T/w.lrm" \
                "$T/p.lrm" > "$T/b_$mode.lrm"
        done
        run $REF compare "$T/b_masked.lrm" "$T/b_compact.lrm" --rtol 1e-5
        assert_success
        # and the drop is real: compact is not the full backward
        run $REF compare "$T/b_full.lrm" "$T/b_compact.lrm" --differ
        assert_success
    done
}

@test "pipeline: the README LRMoE pipeline runs end to end" {
    [ -x "$BIN/lrmoe-plan" ] && [ -x "$BIN/lrmoe-exec" ] || skip "lrmoe-plan or lrmoe-exec not built"
    for rates in "" "-R 0.8"; do
        "$BIN/lrmoe-gen" --tokens 192 --experts 16 --topk 4 --hidden 48 --ffn 32 \
            --skew zipf:1.2 --seed 5 --weights "$T/w.lrm" |
            "$BIN/lrmoe-route" -k 4 -n | "$BIN/lrmoe-plan" --planner lrmoe -P 4 $rates |
            "$BIN/lrmoe-exec" --phase forward --weights "$T/w.lrm" | "$BIN/lrmoe-score" --select topk |
            "$BIN/lrmoe-pack" | "$BIN/lrmoe-exec" --phase backward --mode compact \
            --weights "$T/w.lrm" > "$T/out.lrm"
        run python3 - "$T/out.lrm" "$BATS_TEST_DIRNAME/helpers" <<'PY'
import sys, numpy as np
sys.path.insert(0, sys.argv[2])
from lrmoe_stream import read_stream
(t, a), = read_stream(sys.argv[1])
need = ["grad_hidden", "grad_w_gate", "grad_w_up", "grad_w_down", "pack_pair", "keep"]
assert all(n in t for n in need), [n for n in need if n not in t]
assert a["exec.backward.mode"] == "compact"
assert int(a["pack.rows"]) == int(t["keep"].sum()) == int(t["quota"].sum())
assert abs(float(a["plan.rho"]) - t["keep"].mean()) < 1e-6
assert np.isfinite(t["grad_hidden"]).all()
print("ok", a["plan.rho"])
PY
        assert_success
        assert_output --partial "ok"
    done
}

@test "pack: the rank count comes from the forward's exec.ranks; a --drop keep mask against a plan names --alloc forward" {
    for t in gen route plan exec score; do
        [ -x "$BIN/lrmoe-$t" ] || skip "bin/lrmoe-$t not built"
    done
    "$BIN/lrmoe-gen" --tokens 128 --experts 8 --topk 2 --hidden 16 --ffn 8 --weights "$T/w.lrm" \
        --no-compress | "$BIN/lrmoe-route" --no-compress -o "$T/r.lrm"
    # unplanned forward on 2 ranks: pack needs no --ranks
    "$BIN/lrmoe-exec" --phase forward --weights "$T/w.lrm" -P 2 --no-compress "$T/r.lrm" |
        "$BIN/lrmoe-score" --select topk --drop 20 --no-compress -o "$T/s.lrm"
    run "$BIN/lrmoe-pack" --no-compress -o "$T/p.lrm" "$T/s.lrm"
    assert_success
    run python3 -c "
import sys; sys.path.insert(0, '$BATS_TEST_DIRNAME/helpers'); from lrmoe_stream import read_stream
t, a, d = read_stream('$T/p.lrm', True)[0]; print(a['pack.ranks'], dict(t)['pack_counts'].shape[0])"
    assert_output "2 2"
    # planned forward, then --drop: the plan's bwd_alloc no longer sums to the kept pairs
    "$BIN/lrmoe-plan" -P 2 -D 16 --ffn 8 --no-compress "$T/r.lrm" |
        "$BIN/lrmoe-exec" --phase forward --weights "$T/w.lrm" --no-compress |
        "$BIN/lrmoe-score" --select topk --drop 20 --no-compress -o "$T/sp.lrm"
    run "$BIN/lrmoe-pack" --no-compress -o "$T/p.lrm" "$T/sp.lrm"
    assert_failure 1
    assert_output --partial "pack with --alloc forward"
    run "$BIN/lrmoe-pack" --alloc forward --no-compress -o "$T/p.lrm" "$T/sp.lrm"
    assert_success
}

@test "unpack --into a tensor it reads (topk_ids, pack_pair, --rows) is refused, exit 2" {
    mk --T 16 --E 4 --P 2
    "$BIN/lrmoe-pack" "$T/scored.lrm" > "$T/p.lrm"
    for into in topk_ids pack_pair pack_grad; do
        run "$BIN/lrmoe-pack" -u --into $into -o "$T/u.lrm" "$T/p.lrm"
        assert_failure 2
        assert_output --partial "lrmoe-pack: --into $into: output tensor $into would replace a tensor the unpack reads"
    done
    run "$BIN/lrmoe-pack" -u --rows pack_hidden --into pack_hidden -o "$T/u.lrm" "$T/p.lrm"
    assert_failure 2
    run "$BIN/lrmoe-pack" -u --into unpacked2 -o "$T/u.lrm" "$T/p.lrm"
    assert_success
}

@test "a top-k of 2^32+2 is named as it is, not truncated to an int" {
    python3 - "$T/k.lrm" <<'PY'
import json, struct, sys
hdr = {"topk_ids": {"dtype": "I32", "shape": [0, 2**32 + 2], "data_offsets": [0, 0]},
       "keep": {"dtype": "U8", "shape": [0, 2], "data_offsets": [0, 0]},
       "pack_pair": {"dtype": "I64", "shape": [0], "data_offsets": [0, 0]},
       "pack_grad": {"dtype": "F32", "shape": [0, 4], "data_offsets": [0, 0]}}
h = json.dumps(hdr).encode()
h += b" " * ((8 - len(h) % 8) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + b"LRMOEEND" + struct.pack("<Q", 1))
PY
    for args in "" "-u"; do
        run "$BIN/lrmoe-pack" $args -o /dev/null "$T/k.lrm"
        assert_failure 1
        assert_output "lrmoe-pack: frame 0: tensor topk_ids: dimension 1 is 4294967298, more than 2147483647"
    done
    run "$BIN/lrmoe-score" --select topk --metric random -o /dev/null "$T/k.lrm"
    assert_failure 1
    assert_output "lrmoe-score: frame 0: tensor topk_ids: dimension 1 is 4294967298, more than 2147483647"
}

@test "-@ N: threaded gathers give the same packed tensors as one thread" {
    mk --T 700 --E 12 --P 4 --rate 0.7 --dtype BF16
    "$BIN/lrmoe-pack" -@ 1 -o "$T/p1.lrm" "$T/scored.lrm"
    for n in 2 3 4; do
        "$BIN/lrmoe-pack" -@ "$n" -o "$T/p$n.lrm" "$T/scored.lrm"
        run python3 -c "
import sys; sys.path.insert(0, '$BATS_TEST_DIRNAME/helpers'); from lrmoe_stream import read_stream
import numpy as np
a, b = read_stream('$T/p1.lrm'), read_stream('$T/p$n.lrm')
assert len(a) == len(b) == 2
for (ta, _), (tb, _) in zip(a, b):
    assert sorted(ta) == sorted(tb)
    for k in ta: assert np.array_equal(ta[k], tb[k]), k
print('same')"
        assert_success
        assert_output "same"
    done
    run $REF check-pack "$T/p3.lrm"
    assert_success
}

# stream $2 (--layout-only) = stream $1 (copying pack) without pack_grad,
# pack_hidden, pack_gate, pack_up: every other tensor (the layout included)
# byte for byte, the attributes but pack.seconds and pack.form
same_but_rows() {
    python3 - "$BATS_TEST_DIRNAME/helpers" "$1" "$2" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from lrmoe_stream import read_stream
a, b = read_stream(sys.argv[2], True), read_stream(sys.argv[3], True)
assert len(a) == len(b) and a
rows = ["pack_gate", "pack_grad", "pack_hidden", "pack_up"]
for (ta, aa, da), (tb, ab, db) in zip(a, b):
    ta, tb = dict(ta), dict(tb)
    assert sorted(set(ta) - set(tb)) == rows and set(tb) <= set(ta), sorted(set(ta) ^ set(tb))
    for k in tb:
        assert da[k] == db[k] and ta[k].shape == tb[k].shape and ta[k].tobytes() == tb[k].tobytes(), k
    assert (aa["pack.form"], ab["pack.form"]) == ("rows", "layout")
    nc = lambda x: {k: v for k, v in x.items() if k not in ("pack.seconds", "pack.form")}
    assert nc(aa) == nc(ab), set(nc(aa).items()) ^ set(nc(ab).items())
print("same")
PY
}

@test "--layout-only: the copying pack's layout and every other tensor, without the four row tensors (bwd_alloc with moves, forward, BF16, no kept pair)" {
    for args in "--T 96 --E 12 --P 4 --rate 0.7" "--dtype BF16 --T 120 --E 16 --P 8 --rate 0.5 --seed 4" \
                "--T 32 --rate 0.0"; do
        mk $args
        for how in auto forward; do
            "$BIN/lrmoe-pack" --alloc $how -o "$T/pc.lrm" "$T/scored.lrm"
            "$BIN/lrmoe-pack" --alloc $how --layout-only -o "$T/pl.lrm" "$T/scored.lrm"
            run same_but_rows "$T/pc.lrm" "$T/pl.lrm"
            assert_success
            assert_output "same"
            # the copying pack is the reference's (so the layout is too)
            run $REF check-pack "$T/pc.lrm" --alloc $([ $how = auto ] && echo plan || echo forward)
            assert_success
        done
    done
    # the power of the plan case: rows did move
    mk --T 96 --E 12 --P 4 --rate 0.7
    "$BIN/lrmoe-pack" --layout-only -o "$T/pl.lrm" "$T/scored.lrm"
    run python3 -c "
import sys; sys.path.insert(0, '$BATS_TEST_DIRNAME/helpers'); from lrmoe_stream import read_stream
print(sum(int(a['pack.moved']) for _, a in read_stream('$T/pl.lrm')) > 0)"
    assert_output "True"
}

@test "--layout-only over a copying pack drops its rows; with --strip or --unpack exit 2; --unpack of a layout-only frame says it has no rows" {
    mk --T 64 --E 8 --P 4 --rate 0.6
    "$BIN/lrmoe-pack" -o "$T/pc.lrm" "$T/scored.lrm"
    "$BIN/lrmoe-pack" --layout-only -o "$T/pl.lrm" "$T/scored.lrm"
    "$BIN/lrmoe-pack" --layout-only -o "$T/pl2.lrm" "$T/pc.lrm"
    run same_but_rows "$T/pc.lrm" "$T/pl2.lrm"
    assert_success
    for o in --strip --unpack; do
        run "$BIN/lrmoe-pack" --layout-only $o -o "$T/x.lrm" "$T/scored.lrm"
        assert_failure 2
        assert_output --partial "lrmoe-pack: --layout-only and ${o}: "
    done
    run "$BIN/lrmoe-pack" --unpack -o "$T/u.lrm" "$T/pl.lrm"
    assert_failure 1
    assert_output "lrmoe-pack: frame 0: missing tensor pack_grad: the frame is a layout-only pack (lrmoe-pack --layout-only), which carries no packed rows"
    truncated "$T/u.lrm"
    run "$BIN/lrmoe-pack" --help
    assert_output --partial "--layout-only"
}
