#!/usr/bin/env bats
# Live pipes (lrmoe(7), lrmoe-stream(5)): every stage passes frame n on
# before frame n+1 exists, its --stats/--timings/--tsv rows are in the file
# by then, and a stage whose reader went away says so and exits 1 with its
# TSV rows kept. tests/helpers/live_pipe.py writes a frame, then waits for
# it to come out of the pipeline before it writes the next one.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    H="$BATS_TEST_DIRNAME/helpers"
    export PYTHONPATH="$H"
    T="$BATS_TEST_TMPDIR"
    LIVE="python3 $H/live_pipe.py --timeout ${LIVE_TIMEOUT:-20}"
    "$BIN/lrmoe-gen" --tokens 64 --hidden 64 --ffn 32 --experts 8 --topk 2 --steps 8 \
        --weights "$T/w.lrm" -o "$T/g.lrm"
}

# every line of a TSV has the header's column count; data rows count frames
# 0, 1, ... (each repeated per-frame times)
assert_tsv_rows() { # FILE ROWS_PER_FRAME
    run awk -F'\t' -v per="$2" 'NR == 1 { n = NF; next }
        NF != n { print "row " NR ": " NF " fields, header " n; bad = 1 }
        $1 != int((NR - 2) / per) { print "row " NR ": frame " $1; bad = 1 }
        END { if (NR < 2) { print "no data rows"; bad = 1 }; exit bad }' "$1"
    assert_success
}

@test "a frame crosses zstd and raw stages before the producer writes the next one" {
    run $LIVE "$T/g.lrm" "'$BIN/lrmoe-cat' | '$BIN/lrmoe-cat' -@ 2 | '$BIN/lrmoe-cat' --no-compress"
    assert_success
    assert_line --regexp "^frames 7-7 out after "
    assert_line "8 frames, exit 0"
    run $LIVE "$T/g.lrm" "'$BIN/lrmoe-cat' --no-compress | '$BIN/lrmoe-cat' -l 1 | '$BIN/lrmoe-cat' --no-compress"
    assert_success
    assert_line "8 frames, exit 0"
}

@test "route, plan and exec pass each frame and its TSV rows on before the next frame" {
    run $LIVE --rows "$T/r.tsv:1" --rows "$T/p.tsv:1" --rows "$T/t.tsv:2" "$T/g.lrm" \
        "'$BIN/lrmoe-route' --stats '$T/r.tsv' | '$BIN/lrmoe-plan' --ranks 2 --stats '$T/p.tsv' |
         '$BIN/lrmoe-exec' --phase forward --weights '$T/w.lrm' --timings '$T/t.tsv' --no-compress"
    assert_success
    assert_line "8 frames, exit 0"
    assert_tsv_rows "$T/r.tsv" 1
    assert_tsv_rows "$T/p.tsv" 1
    assert_tsv_rows "$T/t.tsv" 2
}

@test "score and pack pass each frame on before the next one" {
    "$BIN/lrmoe-route" "$T/g.lrm" | "$BIN/lrmoe-plan" --ranks 2 |
        "$BIN/lrmoe-exec" --phase forward --weights "$T/w.lrm" -o "$T/fw.lrm"
    run $LIVE "$T/fw.lrm" "'$BIN/lrmoe-score' --select topk | '$BIN/lrmoe-pack' --no-compress"
    assert_success
    assert_line "8 frames, exit 0"
}

@test "lrmoe-import - passes each safetensors blob on before the next one" {
    run $LIVE --no-trailer "$T/g.lrm" "'$BIN/lrmoe-import' - | '$BIN/lrmoe-cat' --no-compress"
    assert_success
    assert_line "8 frames, exit 0"
}

@test "lrmoe-sim writes a batch's TSV rows before it reads the next batch" {
    # -j 1 reads 4 frames per batch: rows of frames 0-3 come before frame 4
    mkfifo "$T/q"
    run $LIVE --batch 4 --rows "$T/s.tsv:2" --rows "$T/sr.tsv:4" "$T/g.lrm" \
        "'$BIN/lrmoe-sim' -Q -j 1 -P 2 -p fixed,lrmoe --stats '$T/s.tsv' --rank-stats '$T/sr.tsv' '$T/q' >/dev/null &
         '$BIN/lrmoe-route' --no-compress | tee '$T/q'; wait \$!"
    assert_success
    assert_line --regexp "^frames 4-7 out after "
    assert_tsv_rows "$T/s.tsv" 2
    assert_tsv_rows "$T/sr.tsv" 4
}

@test "a stage whose reader closed early: one-line error, exit 1, TSV rows kept" {
    "$BIN/lrmoe-gen" --tokens 512 --hidden 256 --ffn 64 --experts 16 --topk 2 --steps 20 \
        --weights "$T/w2.lrm" -o "$T/g2.lrm"
    # 20 frames of ~0.7 MB: far more than a pipe buffer, so every writer
    # upstream of lrmoe-view -F 0 sees the closed pipe
    run bash -c "cd '$T' && '$BIN/lrmoe-cat' g2.lrm 2>cat.err |
        '$BIN/lrmoe-route' --stats r.tsv 2>route.err |
        '$BIN/lrmoe-plan' --ranks 4 --stats s.tsv 2>plan.err |
        '$BIN/lrmoe-exec' --phase forward --weights w2.lrm --timings t.tsv 2>exec.err |
        '$BIN/lrmoe-view' -F 0 >view.out 2>view.err; echo \${PIPESTATUS[*]}"
    assert_output "1 1 1 1 0"
    for t in cat route plan exec; do
        run cat "$T/$t.err"
        assert_output "lrmoe-$t: <stdout>: write failed: broken pipe (the next stage stopped reading)"
    done
    run cat "$T/view.err"
    assert_output ""
    assert_tsv_rows "$T/r.tsv" 1
    assert_tsv_rows "$T/s.tsv" 1
    assert_tsv_rows "$T/t.tsv" 4
    run grep -c . "$T/view.out"
    refute_output 0
}

@test "a reader that is gone before the first write: the same error, exit 1" {
    # the pipe's read end is closed before lrmoe-cat starts (SIGPIPE at its
    # default disposition in the child: the tool itself must ignore it)
    run python3 -c '
import os, subprocess, sys
r, w = os.pipe()
os.close(r)
sys.exit(subprocess.run(sys.argv[1:], stdout=w).returncode)' "$BIN/lrmoe-cat" "$T/g.lrm"
    assert_failure 1
    assert_output "lrmoe-cat: <stdout>: write failed: broken pipe (the next stage stopped reading)"
}
