#!/usr/bin/env bats
# lrmoe-study (lrmoe.study): the smoke version of the training study.
# C0 through liblrmoe trains exactly like the unpatched Hugging Face model;
# C30 with every selection rule and the capacity-factor baseline train
# (finite, decreasing loss), drop what they say and are paired with C0 by
# seed; the tables and figures are written; bad corpora are clear errors.
# The whole file takes about two minutes on two cores.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup_file() {
    export TOP="$BATS_TEST_DIRNAME/.."
    export STUDY="$TOP/bin/lrmoe-study"
    export OUT="$BATS_FILE_TMPDIR/out"
    # the smoke study, shared by the tests below
    if python3 -c 'import torch, transformers' 2>/dev/null &&
        [ -f /usr/share/games/fortunes/science ]; then
        "$STUDY" --quick --steps 30 --seeds 2 -j 2 --hbm-run \
            --runs C0,C30-lrm-topk,C30-lrm-sample,C30-uniform-sample,C30-gradnorm-topk,cap1,cap1.25,hbm-lrm-sample \
            -o "$OUT" >"$BATS_FILE_TMPDIR/stdout" 2>"$BATS_FILE_TMPDIR/stderr"
        echo $? >"$BATS_FILE_TMPDIR/rc"
    fi
}

setup() {
    python3 -c 'import torch, transformers' 2>/dev/null ||
        skip "torch or transformers not installed (tests/deps.sh test installs them)"
}

need_fortunes() {
    [ -f /usr/share/games/fortunes/science ] ||
        skip "the Debian package fortunes is not installed (tests/deps.sh test installs it)"
}

col() { # file column-name: the column's values, one a line (blank rows kept out)
    awk -F'\t' -v c="$2" 'NR==1{for(i=1;i<=NF;i++) if($i==c) k=i; next} k && $k!=""{print $k}' "$1"
}

@test "30 steps of C0 through liblrmoe equal 30 steps of the unpatched model (rel <= 1e-4, f32)" {
    need_fortunes
    run "$STUDY" --quick --check-hf 30
    assert_success
    assert_output --partial "largest relative training-loss difference"
    # an independent look at the printed per-step losses: step hf lrmoe rel
    n=$(printf '%s\n' "$output" | awk -F'\t' 'NF==4 && $1 ~ /^[0-9]+$/' | wc -l)
    [ "$n" -eq 30 ]
    printf '%s\n' "$output" | awk -F'\t' 'NF==4 && $1 ~ /^[0-9]+$/ {
        r = ($2 - $3) / $2; if (r < 0) r = -r; if (r > 1e-4 || $2 != $2 + 0) bad = 1 }
        END { exit bad }'
}

RULES="lrm-topk lrm-sample uniform-sample gradnorm-topk"

@test "the smoke study runs C0, C30 x four rules, capacity 1 and 1.25 and the memory-pressure run, two seeds each" {
    need_fortunes
    [ "$(cat "$BATS_FILE_TMPDIR/rc")" = 0 ] || fail "$(cat "$BATS_FILE_TMPDIR/stderr")"
    for s in 0 1; do
        for r in C0 C30-lrm-topk C30-lrm-sample C30-uniform-sample C30-gradnorm-topk cap1 cap1.25 hbm-lrm-sample; do
            f="$OUT/runs/seed$s/$r.tsv"
            [ -s "$f" ] || fail "no runs/seed$s/$r.tsv"
            [ "$(col "$f" loss | wc -l)" -eq 30 ] || fail "$r seed $s: not 30 rows"
        done
    done
}

@test "paired seeds: every run of a seed starts from C0's weights and batches (same step-0 loss), seeds differ" {
    need_fortunes
    for s in 0 1; do
        l0=$(col "$OUT/runs/seed$s/C0.tsv" loss | head -1)
        for r in C30-lrm-topk C30-lrm-sample C30-uniform-sample C30-gradnorm-topk hbm-lrm-sample; do
            [ "$(col "$OUT/runs/seed$s/$r.tsv" loss | head -1)" = "$l0" ] || fail "$r seed $s: step 0 differs from C0"
        done
    done
    [ "$(col "$OUT/runs/seed0/C0.tsv" loss | head -1)" != "$(col "$OUT/runs/seed1/C0.tsv" loss | head -1)" ] ||
        fail "seeds 0 and 1 start alike"
}

@test "C30 with each rule and the capacity runs: finite, decreasing training and validation loss" {
    need_fortunes
    for r in $RULES cap1 cap1.25; do
        f="$OUT/runs/seed0/C30-$r.tsv"
        [ -f "$f" ] || f="$OUT/runs/seed0/$r.tsv"
        col "$f" loss | awk '{ if ($1 != $1 + 0 || $1 ~ /nan|inf/) bad = 1; v[NR] = $1 }
            END { a = (v[1] + v[2] + v[3] + v[4] + v[5]) / 5
                  b = (v[NR] + v[NR-1] + v[NR-2] + v[NR-3] + v[NR-4]) / 5
                  exit bad || !(b < a - 0.5) }' || fail "$r: training loss not finite and decreasing"
        col "$f" val_loss | awk '{ v[NR] = $1 } END { exit !(NR >= 3 && v[NR] < v[1]) }' ||
            fail "$r: validation loss did not decrease"
    done
}

@test "C30 keeps 70% of the backward pairs; top-K's error is all bias, the samples' is mostly noise; C0 drops none" {
    need_fortunes
    for r in $RULES; do
        f="$OUT/runs/seed0/C30-$r.tsv"
        paste <(col "$f" kept) <(col "$f" pairs) <(col "$f" rho) <(col "$f" grad_err) \
            <(col "$f" dw_down_bias) <(col "$f" dx_bias) | awk -v r="$r" '{
            s = $1 / $2; if (s < 0.69 || s > 0.71 || $3 < 0.69 || $3 > 0.71 || !($4 > 0)) bad = 1
            # a sample is unbiased wherever its expert keeps a pair (p > 0); an
            # expert whose proportional quota rounds to 0 keeps none, a bias no
            # rule avoids, so the sample'\''s bias is small, not always 0
            if (r ~ /sample/ && $5 > 0.5 * $4) bad = 1
            if (r ~ /topk/ && ($5 != $4 || !($6 > 0))) bad = 1 }
            END { exit bad }' || fail "C30-$r: kept share, rho, grad_err or bias off"
    done
    paste <(col "$OUT/runs/seed0/C0.tsv" kept) <(col "$OUT/runs/seed0/C0.tsv" pairs) \
        <(col "$OUT/runs/seed0/C0.tsv" grad_err) | awk '$1 != $2 || $3 != 0 { bad = 1 } END { exit bad }'
    # capacity 1 drops pairs (forward and backward) and keeps at most what 1.25 keeps
    paste <(col "$OUT/runs/seed0/cap1.tsv" kept) <(col "$OUT/runs/seed0/cap1.tsv" pairs) |
        awk '{ k += $1; p += $2 } END { exit !(k < p) }' || fail "cap1 drops nothing"
    # every measured and modelled time is there and positive
    for c in moe_fwd_s moe_bwd_s moe_fwd_cpu_s moe_bwd_cpu_s gpu_model_s; do
        col "$OUT/runs/seed0/C30-lrm-sample.tsv" "$c" | awk '!($1 > 0) { bad = 1 } END { exit bad || NR != 30 }' ||
            fail "$c missing or not positive"
    done
}

@test "the memory-pressure run's retention comes from the planner under the budget" {
    need_fortunes
    # the budget is 0.9 x C0's modelled peak, so some step keeps less than everything
    col "$OUT/runs/seed0/hbm-lrm-sample.tsv" rho | awk '$1 < 1 { n++ } END { exit !(n > 0) }'
}

@test "tables (Markdown and TSV) and figures (PNG and SVG) are written, rounded, with mean and std over the seeds" {
    need_fortunes
    for f in table1.tsv table2.tsv summary.tsv report.md loss-C30.png loss-C30.svg \
        loss-capacity.png loss-capacity.svg; do
        [ -s "$OUT/$f" ] || fail "no $f"
    done
    [ "$(head -c 4 "$OUT/loss-C30.png" | od -An -c | tr -d ' ')" = '211PNG' ]
    grep -q '<svg' "$OUT/loss-C30.svg"
    run cat "$OUT/report.md"
    assert_output --partial "## Table 1"
    assert_output --partial "## Table 2"
    assert_output --partial "![loss-C30.png](loss-C30.png)"
    assert_output --regexp "\| C30-lrm-sample \| lrm-sample \| 2 \| [0-9]\.[0-9]{4} ± [0-9]\.[0-9]{4} \|"
    # Table 2 has a number for every run but C0
    [ "$(col "$OUT/table2.tsv" delta_ppl | wc -l)" -eq 7 ]
    # Table 1: both targets for each run; C0 reaches its own targets in both seeds
    [ "$(awk -F'\t' 'NR>1' "$OUT/table1.tsv" | wc -l)" -eq 16 ]
    awk -F'\t' '$3 == "C0" && $4 != "2/2" { bad = 1 } END { exit bad }' "$OUT/table1.tsv"
    # rounded figures: no more than 4 decimals in the summary
    ! grep -Eq '[0-9]\.[0-9]{5,}' "$OUT/summary.tsv"
    # times in ms with 2 decimals, percentages with 1, losses with 4 (lrmoe-study(1))
    for c in gpu_model_ms moe_cpu_s; do
        col "$OUT/summary.tsv" "$c" | grep -Evq '^[0-9]+\.[0-9]{2}$' && fail "summary $c not 2 decimals"
        col "$OUT/table1.tsv" "$c" | grep -Evq '^[0-9]+\.[0-9]{2}$' && fail "table1 $c not 2 decimals"
    done
    for c in moe_saving_pct gpu_saving_pct; do
        col "$OUT/table1.tsv" "$c" | grep -Evq '^[+-][0-9]+\.[0-9]$' && fail "table1 $c not 1 decimal"
    done
    col "$OUT/table1.tsv" target_loss | grep -Evq '^[0-9]+\.[0-9]{4}$' && fail "target_loss not 4 decimals"
    # the run TSVs: no exponents, every time (a column ending in _s) 4 significant digits
    for f in "$OUT"/runs/seed*/*.tsv; do
        awk -F'\t' 'NR == 1 { for (i = 1; i <= NF; i++) t[i] = $i ~ /_s$/; next }
            { for (i = 1; i <= NF; i++) {
                if ($i ~ /[eE]/) { print FILENAME ": exponent: " $i; bad = 1 }
                if (t[i] && $i != "") { d = $i; sub(/^[0.]*/, "", d); gsub(/\./, "", d)
                    if (length(d) > 4) { print FILENAME ": more than 4 digits: " $i; bad = 1 } } } }
            END { exit bad }' "$f" || fail "$f not rounded"
    done
}

@test "loss figures: eight runs get eight dash patterns and point types (they read in greyscale)" {
    cd "$BATS_TEST_TMPDIR"
    PYTHONPATH="$TOP/lib/python" LRMOE_LIBRARY="$TOP/build/liblrmoe.so.2" python3 - <<'PY'
from lrmoe.study_report import figure
rows = lambda k: [{"step": s, "val_loss": 3.0 - 0.1 * s - 0.01 * k, "gpu_model_s": 1e-4,
                   "moe_fwd_cpu_s": 0.01, "moe_bwd_cpu_s": 0.01} for s in range(10)]
names = ["C0"] + [f"r{k}" for k in range(1, 8)]
runs = {n: {"seeds": {0: rows(k)}} for k, n in enumerate(names)}
figure(".", "f", "t", names, runs, [("loose", 2.5), ("strict", 2.2)])
PY
    [ -s f.svg ] && [ -s f.png ]
    styles=$(grep -o "with linespoints lc [0-9]* dt [^ ]* pt [0-9]*" plot-data/f.gp | sort -u)
    [ "$(printf '%s\n' "$styles" | wc -l)" -eq 8 ]
    [ "$(printf '%s\n' "$styles" | awk '{ print $6 }' | sort -u | wc -l)" -eq 8 ]
    [ "$(printf '%s\n' "$styles" | awk '{ print $8 }' | sort -u | wc -l)" -eq 8 ]
}

@test "--report-only redraws the report from the run TSVs and trains nothing" {
    need_fortunes
    cp -r "$OUT" "$BATS_TEST_TMPDIR/re"
    rm "$BATS_TEST_TMPDIR/re/report.md" "$BATS_TEST_TMPDIR/re/loss-C30.png"
    run "$STUDY" --quick --steps 30 --seeds 2 --hbm-run --report-only \
        --runs C0,C30-lrm-topk,C30-lrm-sample,C30-uniform-sample,C30-gradnorm-topk,cap1,cap1.25,hbm-lrm-sample \
        -o "$BATS_TEST_TMPDIR/re"
    assert_success
    refute_output --partial "seed 0:"   # no run trained
    [ -s "$BATS_TEST_TMPDIR/re/report.md" ] && [ -s "$BATS_TEST_TMPDIR/re/loss-C30.png" ]
    # the same tables to the last digit: the run's report is computed from the
    # rounded run TSVs too, so their rounding changes nothing between the two
    for f in summary.tsv table1.tsv table2.tsv; do
        diff "$OUT/$f" "$BATS_TEST_TMPDIR/re/$f" || fail "$f differs under --report-only"
    done
    diff <(sed 1,3d "$OUT/report.md") <(sed 1,3d "$BATS_TEST_TMPDIR/re/report.md")
    run "$STUDY" --quick --report-only -o "$BATS_TEST_TMPDIR/nothing"
    assert_failure 1
    assert_output --partial "none of the runs' TSVs is there"
}

@test "a missing corpus file is a clear error (exit 1)" {
    run "$STUDY" --quick -c "$BATS_TEST_TMPDIR/nothing-here" -o "$BATS_TEST_TMPDIR/o"
    assert_failure 1
    assert_output --partial "lrmoe-study: corpus: $BATS_TEST_TMPDIR/nothing-here: no such file or directory"
}

@test "a corpus too small for the windows is a clear error (exit 1)" {
    # fortune format ('%' between records), just too little of it (a text
    # without '%' lines is a format error: tests/inputs.bats)
    head -c 2000 "$TOP/README.md" | fold -w 40 | sed 's/^/%\n/' >"$BATS_TEST_TMPDIR/small.txt"
    run "$STUDY" --quick -c "$BATS_TEST_TMPDIR/small.txt" -o "$BATS_TEST_TMPDIR/o"
    assert_failure 1
    assert_output --regexp "lrmoe-study: corpus: .*small.txt: too small: [0-9]+ training and [0-9]+ validation bytes"
    [ ! -e "$BATS_TEST_TMPDIR/o/runs" ]
}

@test "an output directory that cannot be made is one clear error naming the path (exit 1)" {
    need_fortunes
    run "$STUDY" --quick --runs C0 --steps 2 -o /etc/passwd/out
    assert_failure 1
    assert_output --regexp "^lrmoe-study: /etc/passwd/out[^ ]*: Not a directory$"
    refute_output --partial "Errno"
    # under --nproc too, before torchrun starts
    run "$STUDY" --quick --runs C0 --steps 2 --nproc 2 -o /etc/passwd/out
    assert_failure 1
    assert_output --regexp "^lrmoe-study: /etc/passwd/out: Not a directory$"
}

@test "bad options and lists are usage errors (exit 2)" {
    run "$STUDY" --drops 100
    assert_failure 2
    assert_output --partial "--drops: 100 is outside (0,100)"
    run "$STUDY" --metrics lrm,nope
    assert_failure 2
    run "$STUDY" --rules lrm-best
    assert_failure 2
    assert_output --partial "--rules: unknown rule 'lrm-best'"
    run "$STUDY" --capacity 0
    assert_failure 2
    run "$STUDY" --runs C0,C99-lrm-topk
    assert_failure 2
    run "$STUDY" --jobs 0
    assert_failure 2
    run "$STUDY" --experts 10 --ranks 4
    assert_failure 2
}

# notime FILE: the TSV without its measured-time columns (wall and CPU
# seconds, and what is computed from them), which no two runs share
notime() {
    awk -F'\t' 'NR == 1 { for (i = 1; i <= NF; i++)
            k[i] = $i !~ /^(moe_(fwd|bwd)(_cpu)?_s|lib_(fwd|bwd)_s|step_s|moe_cpu_s|moe_saving_pct)(_std)?$/ }
        { o = ""; n = 0; for (i = 1; i <= NF; i++) if (k[i]) o = o (n++ ? "\t" : "") $i; print o }' "$1"
}

@test "--nproc 2: the study under torchrun (gloo) writes the single-process numbers, every digit (--exact)" {
    need_fortunes
    python3 -c 'import torch.distributed as d, sys; sys.exit(not (d.is_available() and d.is_gloo_available()))' ||
        skip "this torch has no torch.distributed with gloo"
    local a=(--quick --layers 1 --steps 3 --seeds 1 --val-batches 2 --eval-every 2 --exact --hbm-run
        --runs C0,C30-lrm-sample,C30-lrm-topk,cap1,hbm-lrm-sample -o)
    "$STUDY" "${a[@]}" "$BATS_TEST_TMPDIR/one" -j 1 2>"$BATS_TEST_TMPDIR/one.err" ||
        fail "one process: $(cat "$BATS_TEST_TMPDIR/one.err")"
    # bounded: a hung rank ends the test with a message, not a stuck CI job
    run timeout -k 30 900 "$STUDY" "${a[@]}" "$BATS_TEST_TMPDIR/two" --nproc 2
    [ "$status" -ne 124 ] && [ "$status" -ne 137 ] ||
        fail "--nproc 2 did not end within 900 s: $(printf '%s\n' "$output" | grep -v '^W[0-9]' | tail -20)"
    [ "$status" -eq 0 ] || fail "$(printf '%s\n' "$output" | grep -v '^W[0-9]' | tail -20)"
    assert_output --partial "lrmoe-study: --nproc 2: torchrun --standalone --nproc-per-node 2"
    # rank 0 alone logs and writes
    [ "$(printf '%s\n' "$output" | grep -c 'C0 seed 0:')" -eq 1 ]
    n=0
    for r in C0 C30-lrm-sample C30-lrm-topk cap1 hbm-lrm-sample; do
        f=runs/seed0/$r.tsv
        [ "$(col "$BATS_TEST_TMPDIR/two/$f" loss | wc -l)" -eq 3 ] || fail "$r: not 3 rows"
        # every digit: a loss is the float32's repr (more than 6 significant digits)
        col "$BATS_TEST_TMPDIR/two/$f" loss | grep -Eq '^[0-9]\.[0-9]{8,}$' || fail "$r: losses rounded"
        diff <(notime "$BATS_TEST_TMPDIR/one/$f") <(notime "$BATS_TEST_TMPDIR/two/$f") ||
            fail "$r: the --nproc 2 run's numbers differ from one process's"
        n=$((n + 1))
    done
    [ "$n" -eq 5 ]
    for f in summary.tsv table1.tsv table2.tsv; do
        diff <(notime "$BATS_TEST_TMPDIR/one/$f") <(notime "$BATS_TEST_TMPDIR/two/$f") ||
            fail "report $f differs"
    done
    # the dropped runs dropped (capacity: forward too, its keep mask over
    # both ranks' routing): the comparison covers backwards that keep fewer
    # pairs than they route
    for r in C30-lrm-sample cap1; do
        paste <(col "$BATS_TEST_TMPDIR/two/runs/seed0/$r.tsv" kept) \
            <(col "$BATS_TEST_TMPDIR/two/runs/seed0/$r.tsv" pairs) |
            awk '!($1 < $2) { bad = 1 } END { exit bad || NR != 3 }' || fail "$r: dropped nothing"
    done
}

@test "--nproc with a torch that has no gloo backend is one clear error (exit 1), before torchrun" {
    need_fortunes
    mkdir -p "$BATS_TEST_TMPDIR/nogloo"
    printf '%s\n' 'import torch.distributed as d' 'd.is_gloo_available = lambda: False' \
        >"$BATS_TEST_TMPDIR/nogloo/sitecustomize.py"
    PYTHONPATH="$BATS_TEST_TMPDIR/nogloo" run "$STUDY" --quick --runs C0 --steps 1 --nproc 2 \
        -o "$BATS_TEST_TMPDIR/o"
    assert_failure 1
    assert_output --partial "lrmoe-study: --nproc: this torch has no torch.distributed with the gloo backend"
    refute_output --partial "torchrun --standalone"
    [ ! -e "$BATS_TEST_TMPDIR/o" ]
}

@test "--nproc: one process per rank (--ranks must agree), runs one at a time, not with --check-hf" {
    run "$STUDY" --nproc 2 --ranks 4
    assert_failure 2
    assert_output --partial "--ranks 4 and --nproc 2: one process per rank"
    run "$STUDY" --nproc 2 --check-hf 3
    assert_failure 2
    run "$STUDY" --nproc 2 -j 2
    assert_failure 2
    assert_output --partial "under --nproc the runs train one at a time"
    run "$STUDY" --nproc 0
    assert_failure 2
    run "$STUDY" --nproc 3 --experts 8
    assert_failure 2
    assert_output --partial "do not split over --ranks 3"
}
