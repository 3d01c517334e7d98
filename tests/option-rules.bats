#!/usr/bin/env bats
# The option rules of lrmoe(7) OPTIONS: the table of every option
# against each tool's --help both ways, one meaning per short letter, '-' as
# the statistics file, BYTES in any case, lrmoe-score/lrmoe-pack --stats,
# and the model sizes lrmoe-plan and lrmoe-sim take from the frame.

bats_require_minimum_version 1.5.0
load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup() {
    TOP="$BATS_TEST_DIRNAME/.."
    BIN="$TOP/bin"
    T="$BATS_TEST_TMPDIR"
    TABLE="python3 $BATS_TEST_DIRNAME/helpers/options_table.py"
    export PYTHONPATH="$BATS_TEST_DIRNAME/helpers${PYTHONPATH:+:$PYTHONPATH}"
    [ -x "$BIN/lrmoe-plan" ] || skip "tools not built (run make)"
}

# gen (D=32, F=16, E=8, K=2, 64 tokens, 2 frames) -> route -> plan -> exec
# forward -> score; weights in w.lrm
pipeline() {
    "$BIN/lrmoe-gen" --tokens 64 --hidden 32 --ffn 16 --experts 8 --topk 2 --steps 2 \
        --seed 5 --weights "$T/w.lrm" -o "$T/g.lrm"
    "$BIN/lrmoe-route" -o "$T/r.lrm" "$T/g.lrm"
    "$BIN/lrmoe-plan" -P 2 -M 0 --rate 0.7 -o "$T/p.lrm" "$T/r.lrm"
    "$BIN/lrmoe-exec" --phase forward --weights "$T/w.lrm" -@ 1 -o "$T/f.lrm" "$T/p.lrm"
    "$BIN/lrmoe-score" --select topk -o "$T/s.lrm" "$T/f.lrm"
}

# the value of column NAME in row ROW (1 = first data row) of a TSV
col() {
    python3 - "$1" "$2" "${3:-1}" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
print(rows[int(sys.argv[3])][rows[0].index(sys.argv[2])])
PY
}

@test "options: lrmoe(7)'s table lists every option of every tool's --help, and nothing else" {
    run $TABLE check "$TOP/man/man7/lrmoe.7" "$BIN"/lrmoe-*
    assert_success
    assert_output ""
    # the check can fail: an option missing from the table, one too many
    sed '/^lrmoe\\-plan\t\\-R\t/,/^T}$/d' "$TOP/man/man7/lrmoe.7" > "$T/less.7"
    run $TABLE check "$T/less.7" "$BIN"/lrmoe-*
    assert_failure 1
    assert_output "lrmoe-plan: -R, --rate ARG is in --help but not in the table of $T/less.7"
    # a row lrmoe-sim does not have, with the letter -R in another meaning
    awk '{ print } /^\.\\" options-table-begin/ { t = 1 }
         t && /^_$/ { print "lrmoe\\-sim\t\\-R\t\\-\\-rank\\-tsv\tFILE\tT{\nper rank\nT}"; t = 0 }' \
        "$TOP/man/man7/lrmoe.7" > "$T/more.7"
    run $TABLE check "$T/more.7" "$BIN"/lrmoe-*
    assert_failure 1
    assert_line "lrmoe-sim: -R, --rank-tsv ARG is in the table of $T/more.7 but not in --help"
    assert_line "-R means --rank-tsv, --rate in different tools"
}

@test "options: one short letter, one meaning; renamed options keep working" {
    # the letters issue 19 found doing two jobs
    for t in plan sim; do
        "$BIN/lrmoe-$t" --help | grep -q -- '^  -k, --topk K' || fail "$t: -k is not --topk"
        ! "$BIN/lrmoe-$t" --help | grep -qE -- '^  -[FTK], ' || fail "$t: -F/-T/-K still short"
    done
    for t in view export; do
        "$BIN/lrmoe-$t" --help | grep -q -- '^  -F, --frame' || fail "$t: -F is not --frame"
        "$BIN/lrmoe-$t" --help | grep -q -- '^  -T, --tensor' || fail "$t: -T is not --tensor"
    done
    "$BIN/lrmoe-sim" --help | grep -q -- '^  -S, --stats FILE' || fail "sim: -S is not --stats"
    ! "$BIN/lrmoe-sim" --help | grep -qE -- '^  -[tR], ' || fail "sim: -t/-R still short"
    ! "$BIN/lrmoe-view" --help | grep -qE -- '^  -S, ' || fail "view: -S is not --stats"
    pipeline
    # old long names are aliases of the new ones
    "$BIN/lrmoe-sim" -Q -P 2 -p fixed --tsv "$T/a.tsv" --rank-tsv "$T/ra.tsv" "$T/r.lrm" > "$T/a.txt"
    "$BIN/lrmoe-sim" -Q -P 2 -p fixed -S "$T/b.tsv" --rank-stats "$T/rb.tsv" "$T/r.lrm" > "$T/b.txt"
    # the same rows but for the planner's wall time (plan_ms, found by name)
    nowall() { awk -F'\t' -v OFS='\t' 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "plan_ms") k = i }
                                      { $k = ""; print }' "$1"; }
    cmp <(nowall "$T/a.tsv") <(nowall "$T/b.tsv")
    cmp "$T/ra.tsv" "$T/rb.tsv"
    "$BIN/lrmoe-route" --ep 2 -S "$T/ep.tsv" -o /dev/null "$T/g.lrm"
    "$BIN/lrmoe-route" -P 2 -S "$T/P.tsv" -o /dev/null "$T/g.lrm"
    cmp "$T/ep.tsv" "$T/P.tsv"
    [ "$(col "$T/P.tsv" ranks)" = 2 ]
    "$BIN/lrmoe-exec" --phase forward --weights "$T/w.lrm" -@ 1 --timings "$T/ti.tsv" \
        -o /dev/null "$T/p.lrm"
    head -1 "$T/ti.tsv" | grep -q '^frame	layer	phase'
}

# TOOL ARGS... : '-S -' with -o FILE writes the table on stdout; without -o
# (the stream on stdout) on stderr, and the stream is still a stream
stats_dash() {
    local tool=$1; shift
    cd "$T"
    run --separate-stderr "$BIN/$tool" "$@" -S - -o "$T/o.lrm"
    assert_success
    [ "${output%%$'\t'*}" = frame ] || fail "$tool -S - -o FILE: no table on stdout: ${output:0:80}"
    [ ! -e "$T/-" ] || fail "$tool wrote a file named -"
    "$BIN/$tool" "$@" -S - > "$T/o2.lrm" 2> "$T/err"
    [ "$(head -c 5 "$T/err")" = frame ] || fail "$tool -S - | ...: no table on stderr"
    [ "$(wc -l < "$T/err")" -ge 2 ]
    # the stream on stdout is whole (frames and trailer)
    [ "$("$BIN/lrmoe-view" --no-stats "$T/o2.lrm" | tail -1)" = \
      "$("$BIN/lrmoe-view" --no-stats "$T/o.lrm" | tail -1)" ]
    [ ! -e "$T/-" ]
}

@test "options: -S - is standard output, or standard error when the stream is there" {
    pipeline
    stats_dash lrmoe-route "$T/g.lrm"
    stats_dash lrmoe-plan -P 2 -M 0 "$T/r.lrm"
    stats_dash lrmoe-score "$T/f.lrm"
    stats_dash lrmoe-pack "$T/s.lrm"
    stats_dash lrmoe-exec --phase forward --weights "$T/w.lrm" -@ 1 "$T/p.lrm"
    # lrmoe-sim: stdout carries the report, so '-' is standard error
    cd "$T"
    run --separate-stderr "$BIN/lrmoe-sim" -Q -P 2 -p fixed,lrmoe -S - "$T/r.lrm"
    assert_success
    assert_output --partial "lrmoe-sim: 2 frames"
    [ "$(printf '%s\n' "$stderr" | head -1 | cut -f1-4)" = "frame	layer	step	planner" ]
    [ "$(printf '%s\n' "$stderr" | wc -l)" = 5 ]
    run --separate-stderr "$BIN/lrmoe-sim" -Q -P 2 -p fixed --rank-stats - "$T/r.lrm"
    assert_success
    [ "$(printf '%s\n' "$stderr" | head -1)" = "frame	layer	step	planner	rank	fwd_pairs	bwd_pairs	moved_rows" ]
    [ ! -e "$T/-" ]
}

@test "options: BYTES in any case (16g = 16G = 16GiB, 16GB = 16e9); messages in adaptive units" {
    pipeline
    hbm() { "$BIN/lrmoe-sim" -Q -P 2 -p fixed -M "$1" "$T/r.lrm" | grep -o 'hbm [^;]* for'; }
    for v in 16g 16G 16GiB 16gib 17179869184 "16 GiB"; do
        [ "$(hbm "$v")" = "hbm 16 GiB for" ] || fail "-M $v: $(hbm "$v")"
    done
    for v in 16GB 16gb 16Gb 16e9; do
        [ "$(hbm "$v")" = "hbm 14.9 GiB for" ] || fail "-M $v: $(hbm "$v")"
    done
    [ "$(hbm 1.5G)" = "hbm 1.5 GiB for" ]
    [ "$(hbm 512M)" = "hbm 512 MiB for" ]
    [ "$(hbm 512m)" = "hbm 512 MiB for" ]
    [ "$(hbm 1023K)" = "hbm 1023 KiB for" ]   # not 1.02e+03 KiB
    [ "$(hbm 2T)" = "hbm 2 TiB for" ]
    for v in 16x 16Gx 16iB g 16GiBs -1G; do
        run "$BIN/lrmoe-plan" -P 2 -M "$v" "$T/r.lrm"
        assert_failure 2
        assert_output --regexp "^lrmoe-plan: --hbm: "
    done
    run "$BIN/lrmoe-plan" -P 2 --gpu-mem 10G --resident 20GiB "$T/r.lrm"
    assert_failure 2
    assert_output "lrmoe-plan: --resident 20 GiB leaves no memory of --gpu-mem 10 GiB for replicas and buffers"
    # an infeasible plan names its sizes in units too, never raw byte counts
    run "$BIN/lrmoe-plan" -P 2 -M 1K -o /dev/null "$T/r.lrm"
    assert_failure 1
    assert_output --partial "budget 1 KiB"
    refute_output --regexp '[0-9]{7}'
}

@test "options: lrmoe-score --stats, one row per frame: pairs kept and dropped, time" {
    pipeline
    "$BIN/lrmoe-score" --select topk --drop 25 -S "$T/sc.tsv" -o "$T/s2.lrm" "$T/f.lrm"
    [ "$(head -1 "$T/sc.tsv")" = "frame	layer	step	metric	pairs	kept	dropped	retained	dropped_score_share	fidelity	score_ms	select	dw_down_rel_err	dw_down_cosine	dw_down_bias	dx_rel_err	dx_bias" ]
    python3 - "$T/sc.tsv" "$T/s2.lrm" <<'PY'
import sys, lrmoe_stream as s
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
h, rows = rows[0], [dict(zip(rows[0], r)) for r in rows[1:]]
frames = s.read_stream(sys.argv[2])
assert len(rows) == len(frames) == 2, (len(rows), len(frames))
for i, (r, (t, a)) in enumerate(zip(rows, frames)):
    assert r["frame"] == str(i) and r["layer"] == a["layer"] and r["step"] == a["step"], r
    assert r["metric"] == "lrm" and r["fidelity"] == "NA" and r["select"] == "topk", r
    assert r["dw_down_bias"] == r["dx_rel_err"] == "NA", r
    pairs = t["topk_ids"].size
    assert int(r["pairs"]) == pairs == 128, r
    assert int(r["kept"]) == int(t["keep"].sum()) == int(a["score.kept"]), (r, a)
    assert int(r["kept"]) + int(r["dropped"]) == pairs and int(r["dropped"]) > 0, r
    assert abs(float(r["retained"]) - int(r["kept"]) / pairs) < 1e-6, r
    assert float(r["score_ms"]) >= 0, r
PY
    run "$BIN/lrmoe-score" --select topk --fidelity -S "$T/fi.tsv" -o /dev/null "$T/f.lrm"
    assert_success
    [ "$(col "$T/fi.tsv" fidelity)" != NA ]
    # the split: topk's dW_down error is all bias; without --weights no dx
    paste <(col "$T/fi.tsv" dw_down_rel_err) <(col "$T/fi.tsv" dw_down_bias) \
        <(col "$T/fi.tsv" dx_rel_err) | awk '$1 != $2 || !($1 > 0) || $3 != "NA" { bad = 1 } END { exit bad }'
    "$BIN/lrmoe-score" --fidelity -S "$T/fs.tsv" -o /dev/null "$T/f.lrm"
    [ "$(col "$T/fs.tsv" select | sort -u)" = sample ]
    col "$T/fs.tsv" dw_down_bias | awk '$1 != 0 { bad = 1 } END { exit bad }' 
    run "$BIN/lrmoe-score" --select topk -S "$T/nodir/x.tsv" -o /dev/null "$T/f.lrm"
    assert_failure 1
    assert_output --partial "$T/nodir/x.tsv"
}

@test "options: lrmoe-pack --stats, one row per frame: pairs, rows, dropped, moved, bytes, time" {
    pipeline
    "$BIN/lrmoe-score" --select topk --drop 25 -o "$T/s2.lrm" "$T/f.lrm"
    "$BIN/lrmoe-pack" --alloc forward -S "$T/pk.tsv" -o "$T/k.lrm" "$T/s2.lrm"
    [ "$(head -1 "$T/pk.tsv")" = "frame	layer	step	op	pairs	rows	dropped	moved	written_bytes	time_ms" ]
    "$BIN/lrmoe-pack" -u -S "$T/up.tsv" -o "$T/u.lrm" "$T/k.lrm"
    python3 - "$T/pk.tsv" "$T/k.lrm" "$T/up.tsv" "$T/u.lrm" <<'PY'
import sys, lrmoe_stream as s
def tsv(p):
    rows = [l.rstrip("\n").split("\t") for l in open(p)]
    return [dict(zip(rows[0], r)) for r in rows[1:]]
pk, frames = tsv(sys.argv[1]), s.read_stream(sys.argv[2])
assert len(pk) == len(frames) == 2
for r, (t, a) in zip(pk, frames):
    assert r["op"] == "pack", r
    kept = int(t["keep"].sum())
    assert int(r["pairs"]) == t["topk_ids"].size and int(r["rows"]) == kept == int(a["pack.rows"]), r
    assert int(r["dropped"]) == int(r["pairs"]) - kept > 0, r
    assert int(r["moved"]) == int(a["pack.moved"]), (r, a)
    nb = sum(v.nbytes for k, v in t.items() if k.startswith("pack_"))
    assert int(r["written_bytes"]) == nb, (r["written_bytes"], nb)
up, uframes = tsv(sys.argv[3]), s.read_stream(sys.argv[4])
for r, (t, a) in zip(up, uframes):
    assert r["op"] == "unpack" and r["dropped"] == "NA" and r["moved"] == "NA", r
    assert int(r["rows"]) == t["pack_grad"].shape[0], r
    assert int(r["written_bytes"]) == t["unpacked"].nbytes, r
PY
}

@test "options: lrmoe-plan takes D, F, K and tokens per rank from the frame; a disagreeing option is an error" {
    pipeline
    "$BIN/lrmoe-plan" -P 2 -M 0 -S "$T/a.tsv" -o /dev/null "$T/r.lrm"
    # F from lrmoe-gen's ffn attribute (was the default 768), D from hidden,
    # K and T from topk_ids
    [ "$(col "$T/a.tsv" ffn)" = 16 ]
    [ "$(col "$T/a.tsv" hidden)" = 32 ]
    [ "$(col "$T/a.tsv" topk)" = 2 ]
    [ "$(col "$T/a.tsv" tokens_per_rank)" = 32 ]
    # the same value given is fine
    "$BIN/lrmoe-plan" -P 2 -M 0 --ffn 16 -D 32 -k 2 --tokens 32 -S "$T/b.tsv" -o /dev/null "$T/r.lrm"
    cmp <(cut -f1-20 "$T/a.tsv") <(cut -f1-20 "$T/b.tsv")
    for o in "--ffn 768|--ffn 768 disagrees with the frame: F=16 (attribute ffn=16)" \
             "-D 2048|--hidden 2048 disagrees with the frame: D=32 (hidden [64,32])" \
             "-k 8|--topk 8 disagrees with the frame: K=2 (topk_ids [64,2])" \
             "--tokens 100|--tokens 100 disagrees with the frame: tokens per rank=32 (topk_ids [64,2] over 2 ranks)"; do
        run "$BIN/lrmoe-plan" -P 2 -M 0 ${o%%|*} -o /dev/null "$T/r.lrm"
        assert_failure 1
        assert_output --partial "lrmoe-plan: frame 0: ${o#*|}"
    done
    # F from saved_gate [T,K,F] on a frame without the attribute
    python3 - "$T/f.lrm" "$T/sg.lrm" <<'PY'
import sys, lrmoe_stream as s
t, a = s.read_stream(sys.argv[1])[0]
s.write_stream(sys.argv[2], [({"expert_load": t["expert_load"], "saved_gate": t["saved_gate"]}, {})])
PY
    "$BIN/lrmoe-plan" -P 2 -M 0 -S "$T/sg.tsv" -o /dev/null "$T/sg.lrm"
    [ "$(col "$T/sg.tsv" ffn)" = 16 ]
    [ "$(col "$T/sg.tsv" topk)" = 2 ]
    run "$BIN/lrmoe-plan" -P 2 -M 0 --ffn 64 -o /dev/null "$T/sg.lrm"
    assert_failure 1
    assert_output --partial "--ffn 64 disagrees with the frame: F=16 (saved_gate [64,2,16])"
}

@test "options: on a frame that does not say, --ffn, --topk and --tokens change the output" {
    python3 - "$T/load.lrm" <<'PY'
import sys, numpy as np, lrmoe_stream as s
s.write_stream(sys.argv[1], [({"expert_load": np.array([40, 10, 20, 30], np.int64)}, {})])
PY
    # F is never assumed (it decides every replica's memory): refused, naming the ways out
    run "$BIN/lrmoe-plan" -P 2 -M 0 -o /dev/null "$T/load.lrm"
    assert_failure 1
    assert_output "lrmoe-plan: frame 0: the frame says nothing of the expert FFN width F (no saved_gate, saved_up, w_gate, w_up, w_down or attribute ffn): give --ffn F or --weights FILE (the weights stream of the model)"
    "$BIN/lrmoe-plan" -P 2 -M 0 --ffn 768 -S "$T/d.tsv" -o /dev/null "$T/load.lrm"
    "$BIN/lrmoe-plan" -P 2 -M 0 --ffn 64 -k 4 --tokens 12 -S "$T/o.tsv" -o /dev/null "$T/load.lrm"
    [ "$(col "$T/d.tsv" ffn)" = 768 ] && [ "$(col "$T/o.tsv" ffn)" = 64 ]
    [ "$(col "$T/d.tsv" topk)" = 8 ] && [ "$(col "$T/o.tsv" topk)" = 4 ]
    [ "$(col "$T/o.tsv" tokens_per_rank)" = 12 ]
    [ "$(col "$T/d.tsv" mem_peak_gib)" != "$(col "$T/o.tsv" mem_peak_gib)" ]
    # with K known (route.topk), the tokens per rank follow from the loads
    python3 - "$T/k.lrm" <<'PY'
import sys, numpy as np, lrmoe_stream as s
s.write_stream(sys.argv[1], [({"expert_load": np.array([40, 10, 20, 30], np.int64)}, {"route.topk": "2"})])
PY
    "$BIN/lrmoe-plan" -P 2 -M 0 --ffn 768 -S "$T/k.tsv" -o /dev/null "$T/k.lrm"
    [ "$(col "$T/k.tsv" topk)" = 2 ]
    [ "$(col "$T/k.tsv" tokens_per_rank)" = 25 ]
    # lrmoe-sim: --topk scales --pressure-base on such a frame
    "$BIN/lrmoe-sim" -Q -P 2 -p fixed -x 1,4 --pressure-base 25 -k 2 --ffn 768 "$T/load.lrm" > "$T/k2.txt"
    "$BIN/lrmoe-sim" -Q -P 2 -p fixed -x 1,4 --pressure-base 25 -k 8 --ffn 768 "$T/load.lrm" > "$T/k8.txt"
    ! cmp -s <(sed '/wall time/,+1d' "$T/k2.txt") <(sed '/wall time/,+1d' "$T/k8.txt")
}

@test "options: the lrmoe-sim header prints the D, F and K the run used; disagreeing options fail" {
    pipeline
    run "$BIN/lrmoe-sim" -Q -P 2 -p fixed "$T/r.lrm"
    assert_success
    assert_line --index 0 --partial "D=32 F=16 K=2, 2-byte storage;"
    run "$BIN/lrmoe-sim" -Q -P 2 -p fixed --ffn 768 "$T/r.lrm"
    assert_failure 1
    assert_output --partial "lrmoe-sim: frame 0: --ffn 768 disagrees with the frame: F=16 (attribute ffn=16)"
    # frames that do not say: the options' values, printed
    python3 - "$T/load.lrm" <<'PY'
import sys, numpy as np, lrmoe_stream as s
s.write_stream(sys.argv[1], [({"expert_load": np.array([40, 10, 20, 30], np.int64)}, {})])
PY
    run "$BIN/lrmoe-sim" -Q -P 2 -p fixed -D 128 --ffn 64 -k 4 "$T/load.lrm"
    assert_success
    assert_line --index 0 --partial "D=128 F=64 K=4,"
}
