#!/usr/bin/env bats
# lrmoe-cat --keep / --drop: tensors by name or glob (lib/frame_select.c).

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load
bats_require_minimum_version 1.5.0

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    export PYTHONPATH="$BATS_TEST_DIRNAME/helpers"
    T="$BATS_TEST_TMPDIR"
    python3 - "$T/s.lrm" <<'PY'
import sys, numpy as np, lrmoe_stream as s
f0 = ({"hidden": np.ones((2, 3), np.float32), "grad_output": np.zeros((2, 3), np.float32),
       "grad_hidden": np.zeros((2, 3), np.float32), "expert_load": np.arange(4, dtype=np.int64),
       "w_gate": np.zeros(2, np.float32)}, {"layer": 0, "route.topk": 2})
f1 = ({"hidden": np.ones((2, 3), np.float32), "expert_load": np.arange(4, dtype=np.int64)},
      {"layer": 1})
s.write_stream(sys.argv[1], [f0, f1])
PY
}

names() { # the tensor names of each frame, one frame a line
    python3 -c "
import sys, lrmoe_stream as s
for t, a in s.read_stream(sys.argv[1]): print(' '.join(t), '|', ' '.join(f'{k}={v}' for k, v in a.items()))" "$1"
}

@test "--keep and --drop: names, globs, comma lists, repeatable; attributes stay; order kept" {
    "$BIN/lrmoe-cat" --no-compress --keep 'expert_load,grad_*' -o "$T/k.lrm" "$T/s.lrm"
    run names "$T/k.lrm"
    assert_line --index 0 "grad_output grad_hidden expert_load | layer=0 route.topk=2"
    assert_line --index 1 "expert_load | layer=1"
    "$BIN/lrmoe-cat" --no-compress --drop 'grad_*' --drop w_gate -o "$T/d.lrm" "$T/s.lrm"
    run names "$T/d.lrm"
    assert_line --index 0 "hidden expert_load | layer=0 route.topk=2"
    assert_line --index 1 "hidden expert_load | layer=1"
    # --keep first, then --drop; globs with classes
    "$BIN/lrmoe-cat" --no-compress --keep 'grad_*,[eh]*' --drop grad_hidden,hidden -o "$T/b.lrm" "$T/s.lrm"
    run names "$T/b.lrm"
    assert_line --index 0 "grad_output expert_load | layer=0 route.topk=2"
    assert_line --index 1 "expert_load | layer=1"
    # the values pass through unchanged
    run "$BIN/lrmoe-view" --diff --tensor expert_load "$T/s.lrm" "$T/k.lrm"
    assert_success
}

@test "a --keep or --drop name that matches nothing is an error, and the output has no trailer" {
    run --separate-stderr "$BIN/lrmoe-cat" --keep hiden -o "$T/o.lrm" "$T/s.lrm"
    assert_failure 1
    [ "$stderr" = "lrmoe-cat: --keep hiden: no tensor of that name in any frame" ]
    run "$BIN/lrmoe-view" "$T/o.lrm"
    assert_failure 1
    assert_output --partial "truncated: the stream ends without a trailer"
    run --separate-stderr "$BIN/lrmoe-cat" --drop 'saved_*' -o "$T/o.lrm" "$T/s.lrm"
    assert_failure 1
    [ "$stderr" = "lrmoe-cat: --drop saved_*: no tensor matches it in any frame" ]
    # a name that only some frames have is fine
    run "$BIN/lrmoe-cat" --keep w_gate -o "$T/o.lrm" "$T/s.lrm"
    assert_success
    run --separate-stderr "$BIN/lrmoe-cat" --keep 'hidden,,x' -o "$T/o.lrm" "$T/s.lrm"
    assert_failure 2
    [ "$stderr" = "lrmoe-cat: --keep: 'hidden,,x': an empty name in the list" ]
}

@test "--set-attr sets or replaces an attribute in every frame; a bad spec is a usage error" {
    "$BIN/lrmoe-cat" --no-compress --set-attr route.topk=4 --set-attr hidden=7168 \
        --set-attr note=a=b -o "$T/a.lrm" "$T/s.lrm"
    run names "$T/a.lrm"
    assert_success
    assert_line --index 0 --partial "| layer=0 route.topk=4 hidden=7168 note=a=b"
    assert_line --index 1 --partial "| layer=1 route.topk=4 hidden=7168 note=a=b"
    for bad in =1 nokey ''; do
        run "$BIN/lrmoe-cat" --set-attr "$bad" "$T/s.lrm"
        assert_failure 2
        assert_output --partial "--set-attr: '$bad' is not KEY=VALUE"
    done
}

@test "--set-attr restates a loads-only trace's D for lrmoe-sim, which refuses it otherwise" {
    "$BIN/lrmoe-gen" --tokens 64 --hidden 16 --layers 2 | "$BIN/lrmoe-route" --loads-only -o "$T/o.lrm"
    run "$BIN/lrmoe-sim" -Q --hidden 4096 -p fixed "$T/o.lrm"
    assert_failure 1
    assert_output --partial "restate the trace: lrmoe-cat --set-attr route.hidden=4096 IN > OUT"
    "$BIN/lrmoe-cat" --set-attr route.hidden=4096 "$T/o.lrm" -o "$T/r.lrm"
    # the restated D is the one the model uses (column 30, plan_ms, is a wall time)
    "$BIN/lrmoe-sim" -Q --hidden 4096 -p fixed -S "$T/t.tsv" "$T/r.lrm" >/dev/null
    "$BIN/lrmoe-sim" -Q -p fixed -S "$T/u.tsv" "$T/r.lrm" >/dev/null
    "$BIN/lrmoe-sim" -Q -p fixed -S "$T/v.tsv" "$T/o.lrm" >/dev/null
    cmp <(cut -f1-29,31- "$T/t.tsv") <(cut -f1-29,31- "$T/u.tsv")
    run python3 - "$T/u.tsv" "$T/v.tsv" <<'PY'
import csv, sys
u, v = ([r for r in csv.DictReader(open(p), delimiter="\t")] for p in sys.argv[1:])
# all-to-all bytes are D-proportional: 4096/16 = 256 times the original's
print(sorted({int(a["a2a_bytes"]) / int(b["a2a_bytes"]) for a, b in zip(u, v)}))
PY
    assert_output "[256.0]"
}
