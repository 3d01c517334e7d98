#!/usr/bin/env bats
# What the tools take from their inputs, and what they say when an input
# lacks it (first filed as issue 19's new-user report): lrmoe-plan and lrmoe-sim never
# assume the expert FFN width F (a frame that says nothing of it is an error
# naming --ffn and --weights), and --weights FILE says D and F from the
# model's weights stream (lib/plan_cli.c). The in-process planner's side is
# tests/python/test_ops.py; --plot on a pipe and the latency figure are in
# tests/plot.bats, --diff on numeric attributes in tests/view.bats.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load
bats_require_minimum_version 1.5.0

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    export PYTHONPATH="$BATS_TEST_DIRNAME/helpers"
    T="$BATS_TEST_TMPDIR"
    # a routed trace of a model with D=32 F=24 E=16 K=4 (lrmoe-gen writes
    # ffn; route keeps it) and its weights, raw and zstd
    "$BIN/lrmoe-gen" --tokens 512 --experts 16 --topk 4 --hidden 32 --ffn 24 --layers 2 \
        --skew zipf:1.2 --weights "$T/w.lrm" --no-compress -o "$T/g.lrm"
    "$BIN/lrmoe-route" --loads-only -o "$T/r.lrm" "$T/g.lrm"
    "$BIN/lrmoe-cat" --level 3 -o "$T/wz.lrm" "$T/w.lrm"
    # the same loads as an imported frame would have them: no ffn attribute
    python3 - "$T/r.lrm" "$T/bare.lrm" <<'PY'
import sys, lrmoe_stream as s
s.write_stream(sys.argv[2], [(t, {k: v for k, v in a.items() if k != "ffn"})
                             for t, a in s.read_stream(sys.argv[1])])
PY
}

# attr STREAM FRAME KEY
attr() {
    python3 -c "import sys, lrmoe_stream as s
print(s.read_stream(sys.argv[1])[int(sys.argv[2])][1].get(sys.argv[3], '-'))" "$@"
}

no_trailer() {
    run python3 -c "import sys, lrmoe_stream as s; s.read_stream(sys.argv[1])" "$1"
    assert_failure
}

@test "a frame that says nothing of F: lrmoe-plan and lrmoe-sim refuse, naming --ffn and --weights; no stream, no report" {
    want="frame 0: the frame says nothing of the expert FFN width F (no saved_gate, saved_up, w_gate, w_up, w_down or attribute ffn): give --ffn F or --weights FILE (the weights stream of the model)"
    run --separate-stderr "$BIN/lrmoe-plan" --ranks 4 -o "$T/p.lrm" "$T/bare.lrm"
    assert_failure 1
    assert_equal "$stderr" "lrmoe-plan: $want"
    no_trailer "$T/p.lrm"
    run --separate-stderr "$BIN/lrmoe-sim" --ranks 4 "$T/bare.lrm"
    assert_failure 1
    assert_equal "$stderr" "lrmoe-sim: $want"
    [ -z "$output" ]
    # what the message says to give works: --ffn, and the plan says so
    "$BIN/lrmoe-plan" --ranks 4 --ffn 24 -o "$T/p.lrm" "$T/bare.lrm"
    [ "$(attr "$T/p.lrm" 1 plan.ffn)" = 24 ]
    # the plan is the one of the trace that said ffn itself
    "$BIN/lrmoe-plan" --ranks 4 -o "$T/q.lrm" "$T/r.lrm"
    run "$BIN/lrmoe-view" --diff --no-stats "$T/p.lrm" "$T/q.lrm"
    assert_line --index 0 "frame 0: attribute ffn only in $T/q.lrm: 24"
    assert_line --index 2 "# 2 frames compared: 2 attribute and 0 tensor differences"
    # a planned stream says F for the next plan (plan.ffn), with no option
    "$BIN/lrmoe-plan" --ranks 4 --planner llep -o "$T/p2.lrm" "$T/p.lrm"
    [ "$(attr "$T/p2.lrm" 0 plan.ffn)" = 24 ]
    [ "$(attr "$T/p2.lrm" 0 plan.planner)" = llep ]
}

@test "--weights FILE: D and F from the weights stream; the same plan as --hidden/--ffn; raw (mapped) or zstd" {
    "$BIN/lrmoe-plan" --ranks 4 --hbm 1M --best-effort --weights "$T/w.lrm" --stats "$T/w.tsv" \
        -o "$T/pw.lrm" "$T/bare.lrm"
    [ "$(attr "$T/pw.lrm" 0 plan.ffn)" = 24 ]
    [ "$(attr "$T/pw.lrm" 0 plan.hidden)" = 32 ]
    awk -F'\t' 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
                { if ($c["ffn"] != 24 || $c["hidden"] != 32) exit 1; n++ } END { exit n != 2 }' "$T/w.tsv"
    "$BIN/lrmoe-plan" --ranks 4 --hbm 1M --best-effort --hidden 32 --ffn 24 -o "$T/po.lrm" "$T/bare.lrm"
    run "$BIN/lrmoe-view" --diff "$T/pw.lrm" "$T/po.lrm"
    assert_success
    # a zstd weights stream cannot be mapped: read whole, the same plan
    "$BIN/lrmoe-plan" --ranks 4 --hbm 1M --best-effort --weights "$T/wz.lrm" -o "$T/pz.lrm" "$T/bare.lrm"
    run "$BIN/lrmoe-view" --diff "$T/pz.lrm" "$T/po.lrm"
    assert_success
    # the weights agreeing with the frame's own ffn is fine; so is the option
    "$BIN/lrmoe-plan" --ranks 4 --weights "$T/w.lrm" --ffn 24 -o /dev/null "$T/r.lrm"
    # lrmoe-sim: the header prints the sizes the weights gave
    run "$BIN/lrmoe-sim" --quiet --ranks 4 --weights "$T/w.lrm" "$T/bare.lrm"
    assert_success
    assert_line --index 0 --partial "D=32 F=24 K=4"
}

@test "--weights of another model, or none: errors that name both sides" {
    # F differs from the frame's attribute
    "$BIN/lrmoe-gen" --tokens 64 --experts 16 --topk 4 --hidden 32 --ffn 40 --layers 2 \
        --weights "$T/w40.lrm" --no-compress -o /dev/null
    run --separate-stderr "$BIN/lrmoe-plan" --ranks 4 --weights "$T/w40.lrm" -o /dev/null "$T/r.lrm"
    assert_failure 1
    assert_equal "$stderr" "lrmoe-plan: frame 0: the frame says F=24 (attribute ffn=24), its weights F=40 (--weights $T/w40.lrm layer 0: w_gate [16,40,32]): the weights of another model?"
    # an option against the weights
    run --separate-stderr "$BIN/lrmoe-plan" --ranks 4 --weights "$T/w.lrm" --ffn 768 -o /dev/null "$T/bare.lrm"
    assert_failure 1
    assert_equal "$stderr" "lrmoe-plan: frame 0: --ffn 768 disagrees with the frame: F=24 (--weights $T/w.lrm layer 0: w_gate [16,24,32]); drop --ffn or give 24"
    # another expert count
    "$BIN/lrmoe-gen" --tokens 64 --experts 32 --topk 4 --hidden 32 --ffn 24 --layers 2 \
        --weights "$T/w32.lrm" --no-compress -o /dev/null
    run --separate-stderr "$BIN/lrmoe-sim" --ranks 4 --weights "$T/w32.lrm" "$T/bare.lrm"
    assert_failure 1
    assert_equal "$stderr" "lrmoe-sim: frame 0: expert_load has 16 experts, --weights $T/w32.lrm layer 0 has 32 (w_gate): weights of another model?"
    # a layer the weights lack
    "$BIN/lrmoe-gen" --tokens 64 --experts 16 --topk 4 --hidden 32 --ffn 24 --layers 1 \
        --weights "$T/w1.lrm" --no-compress -o /dev/null
    run --separate-stderr "$BIN/lrmoe-plan" --ranks 4 --weights "$T/w1.lrm" -o "$T/p.lrm" "$T/bare.lrm"
    assert_failure 1
    assert_equal "$stderr" "lrmoe-plan: frame 1: --weights $T/w1.lrm: no frame for layer 1"
    no_trailer "$T/p.lrm"
    # a bit flipped in layer 1's weights: a mapped file's frames are checked
    # when a frame first takes its D and F from them, so frame 0 (layer 0)
    # is planned and frame 1 fails naming the weights' frame 1
    cp "$T/w.lrm" "$T/wb.lrm"
    python3 -c "
import sys, resident; a, e = resident.frames(sys.argv[1])[1]; f = open(sys.argv[1], 'r+b')
f.seek(e - 8); b = f.read(1); f.seek(e - 8); f.write(bytes([b[0] ^ 4]))" "$T/wb.lrm"
    run --separate-stderr "$BIN/lrmoe-plan" --ranks 4 --weights "$T/wb.lrm" -o "$T/p.lrm" "$T/bare.lrm"
    assert_failure 1
    assert_regex "$stderr" "^lrmoe-plan: frame 1: --weights: $T/wb.lrm: frame 1: digest mismatch: the frame's CRC-64 is [0-9a-f]{16}, its digest record says [0-9a-f]{16} \\(the stream changed after it was written\\)$"
    no_trailer "$T/p.lrm"
    # a weights file that is not there: exit 1 before any frame
    run --separate-stderr "$BIN/lrmoe-plan" --ranks 4 --weights "$T/nope.lrm" -o "$T/p.lrm" "$T/r.lrm"
    assert_failure 1
    assert_equal "$stderr" "lrmoe-plan: --weights: $T/nope.lrm: No such file or directory"
    [ ! -e "$T/p.lrm" ] || no_trailer "$T/p.lrm"
    run --separate-stderr "$BIN/lrmoe-sim" --ranks 4 --weights "$T/nope.lrm" "$T/r.lrm"
    assert_failure 1
    assert_equal "$stderr" "lrmoe-sim: --weights: $T/nope.lrm: No such file or directory"
}

@test "ux: a --loads-only trace keeps D and T as route.hidden and route.tokens, and plan and sim use them" {
    [ "$(attr "$T/r.lrm" 0 route.hidden)" = 32 ]
    [ "$(attr "$T/r.lrm" 0 route.tokens)" = 512 ]
    "$BIN/lrmoe-plan" --ranks 4 --no-compress -o "$T/p.lrm" "$T/r.lrm"
    [ "$(attr "$T/p.lrm" 0 plan.hidden)" = 32 ]
    [ "$(attr "$T/p.lrm" 1 plan.tokens_per_rank)" = 128 ]
    run "$BIN/lrmoe-sim" --ranks 4 --planners fixed "$T/r.lrm"
    assert_success
    assert_output --partial "D=32"
    # an option that disagrees with what the trace says is an error
    run "$BIN/lrmoe-plan" --ranks 4 --hidden 64 --no-compress -o "$T/q.lrm" "$T/r.lrm"
    assert_failure
    assert_output --partial "--hidden 64 disagrees with the frame: D=32 (attribute route.hidden=32)"
}

@test "plan: --stats to a reader that stopped says broken pipe, a full disk says so; neither is a bare 'write error'" {
    # 300 frames: their stats rows outlast the pipe buffer head leaves behind
    "$BIN/lrmoe-gen" --tokens 64 --experts 16 --topk 4 --hidden 32 --ffn 24 --layers 300 \
        --loads-only --no-compress -o "$T/many.lrm"
    run bash -c '"$1" -P 4 -S - -o /dev/null "$2" | head -1 >/dev/null; exit ${PIPESTATUS[0]}' _ \
        "$BIN/lrmoe-plan" "$T/many.lrm"
    assert_failure 1
    assert_output --regexp '^lrmoe-plan: frame [0-9]+: --stats <stdout>: write failed: broken pipe \(the next stage stopped reading\)$'
    run "$BIN/lrmoe-plan" -P 4 -S /dev/full -o /dev/null "$T/r.lrm"
    assert_failure 1
    assert_output "lrmoe-plan: frame 0: --stats /dev/full: write failed: No space left on device"
}

@test "--stats a full disk took even the header of, on an empty stream: every filter fails naming it (no exit 0)" {
    # no frame: no row fails, only the header did; the runner's close must say so
    python3 -c "import lrmoe_stream as s; s.write_stream('$T/empty.lrm', [])"
    for t in route plan score pack; do
        args=(); [ "$t" = plan ] && args=(-P 4)
        run "$BIN/lrmoe-$t" "${args[@]}" -S /dev/full -o "$T/o.lrm" "$T/empty.lrm"
        assert_failure 1
        assert_output "lrmoe-$t: --stats /dev/full: write failed: No space left on device"
        run bash -c '"$@" > /dev/full' _ "$BIN/lrmoe-$t" "${args[@]}" -S - -o "$T/o.lrm" "$T/empty.lrm"
        assert_failure 1
        assert_output "lrmoe-$t: --stats <stdout>: write failed: No space left on device"
    done
}

@test "expert_load as whole-number floats (Megatron's tokens_per_expert) plans as I64; a fraction names the fix" {
    python3 - "$T" <<'PY'
import sys, numpy as np, lrmoe_stream as s
d = sys.argv[1]
load = np.array([100, 30, 50, 20, 10, 40, 30, 40])
a = {"topk": "2", "ffn": "64", "layer": "0"}
s.write_stream(f"{d}/i64.lrm", [({"expert_load": load.astype(np.int64)}, a)])
s.write_stream(f"{d}/f32.lrm", [({"expert_load": load.astype(np.float32)}, a)])
bad = load.astype(np.float64); bad[3] = 2.5
s.write_stream(f"{d}/bad.lrm", [({"expert_load": bad}, a)])
PY
    # the same plan tensors and report (the last TSV column is a CPU time)
    for f in i64 f32; do
        "$BIN/lrmoe-plan" -P 4 -S "$T/$f.tsv" -o "$T/p$f.lrm" "$T/$f.lrm"
        "$BIN/lrmoe-sim" -Q -P 4 -p fixed,lrmoe -S "$T/s$f.tsv" "$T/$f.lrm" > "$T/s$f.txt"
    done
    "$BIN/lrmoe-cat" --drop expert_load --no-compress -o "$T/a.lrm" "$T/pi64.lrm"
    "$BIN/lrmoe-cat" --drop expert_load --no-compress -o "$T/b.lrm" "$T/pf32.lrm"
    run "$BIN/lrmoe-view" --diff "$T/a.lrm" "$T/b.lrm"
    assert_success
    cmp <(cut -f1-20,23-27 "$T/i64.tsv") <(cut -f1-20,23-27 "$T/f32.tsv")
    cmp <(cut -f1-29,31- "$T/si64.tsv") <(cut -f1-29,31- "$T/sf32.tsv")
    for tool in plan sim; do
        run "$BIN/lrmoe-$tool" -P 4 -o /dev/null "$T/bad.lrm"
        [ $tool = sim ] && run "$BIN/lrmoe-sim" -Q -P 4 "$T/bad.lrm"
        assert_failure 1
        assert_output "lrmoe-$tool: frame 0: expert_load[3] is 2.5 (F64): a load counts pairs, so a float vector must hold whole numbers (convert it: torch's tokens_per_expert.long(), numpy's .astype(np.int64))"
    done
}

@test "study: a corpus without record separators says so (and a binary one that it holds NUL bytes), not 'too small'" {
    export LRMOE_LIBRARY="$BATS_TEST_DIRNAME/../build/liblrmoe.so.2"
    head -c 300001 /dev/urandom | tr -d '%' > "$T/bin.dat"
    printf '\0' >> "$T/bin.dat"
    run "$BIN/lrmoe-study" --quick -c "$T/bin.dat" -o "$T/o"
    assert_failure 1
    assert_output --regexp "^lrmoe-study: corpus: .*/bin.dat: 1 record\(s\) in [0-9]+ bytes: no validation text, since every 20th record goes to validation and records are separated by lines holding a single '%' \(the fortune format\); the file holds NUL bytes: is it text at all\?$"
    refute_output --partial "too small"
    yes 'a line of plain text' | head -c 300000 > "$T/txt.dat"
    run "$BIN/lrmoe-study" --quick -c "$T/txt.dat" -o "$T/o"
    assert_failure 1
    assert_output --partial "$T/txt.dat: 1 record(s) in 300000 bytes: no validation text"
    assert_output --partial "add '%' lines between the texts"
    [ ! -e "$T/o/runs" ]
}
