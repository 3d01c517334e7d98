#!/usr/bin/env bats
# Figures for reports (lib/plot.c, lib/sim_run.c): lrmoe-sim --plot and
# lrmoe-plan --plot. The scripts are checked against the TSV the same run
# wrote (columns looked up by name), and the SVGs are rendered by rsvg and by
# ImageMagick, which must draw the same picture.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load
bats_require_minimum_version 1.5.0

setup_file() {
    command -v gnuplot > /dev/null || return 0
    BIN="$BATS_TEST_DIRNAME/../bin"
    D="$BATS_FILE_TMPDIR"
    "$BIN/lrmoe-gen" --tokens 8192 --layers 2 --steps 4 --skew zipf:1.2 |
        "$BIN/lrmoe-route" --loads-only > "$D/tr.lrm"
    # a budget that fixed overruns on every frame; pressure at 1..20
    "$BIN/lrmoe-sim" --ranks 8 --hbm 300M --pressure 1,2,4,8,16,20 --pressure-base 5000 \
        --tsv "$D/s.tsv" --plot "$D/figs" "$D/tr.lrm" > "$D/sim.out"
}

setup() {
    command -v gnuplot > /dev/null || skip "gnuplot not installed (tests/deps.sh installs gnuplot-nox)"
    BIN="$BATS_TEST_DIRNAME/../bin"
    D="$BATS_FILE_TMPDIR"
    T="$BATS_TEST_TMPDIR"
}

# column of the TSV whose name starts with $2 (old or new unit suffix)
col() { head -1 "$1" | tr '\t' '\n' | grep -n "^$2" | head -1 | cut -d: -f1; }

@test "memory: the budget line at base experts + --hbm, every infeasible frame marked and counted" {
    gp="$D/figs/memory.gp"
    base=$(col "$D/s.tsv" mem_base)
    pl=$(col "$D/s.tsv" planner)
    fe=$(col "$D/s.tsv" feasible)
    [ -n "$base" ] && [ -n "$fe" ]
    # the line: the largest planner's mean base + 300 MiB, in GiB
    want=$(awk -F'\t' -v b="$base" -v p="$pl" 'NR > 1 { s[$p] += $b; n[$p]++ }
        END { m = 0; for (k in s) if (s[k] / n[k] > m) m = s[k] / n[k]; printf "%.6f", (m + 300 * 2^20) / 2^30 }' "$D/s.tsv")
    got=$(sed -n 's/^set arrow from graph 0, first \([0-9.e+-]*\) to graph 1.*nohead.*dt 2.*/\1/p' "$gp")
    [ -n "$got" ] || fail "no budget line in memory.gp"
    awk -v a="$got" -v b="$want" 'BEGIN { exit !(a - b < 1e-6 && b - a < 1e-6) }' || fail "budget $got, want $want"
    grep -q 'title "budget: base experts + --hbm 300 MiB"' "$gp"
    # one cross per infeasible (frame, planner) of the TSV, at its planner's bar
    ninf=$(awk -F'\t' -v f="$fe" 'NR > 1 && $f == 0' "$D/s.tsv" | wc -l)
    [ "$ninf" -gt 0 ]
    nmark=$(awk 'blk == 1 && /^[0-9]/ { n++ } /^$/ { e++; if (e == 2) blk = 1 } END { print n + 0 }' "$D/figs/memory.dat")
    assert_equal "$nmark" "$ninf"
    grep -q "index 1 using 1:2 with points pt 2 .*title \"an infeasible frame\"" "$gp"
    nfixed=$(awk -F'\t' -v f="$fe" -v p="$pl" 'NR > 1 && $f == 0 && $p == "fixed"' "$D/s.tsv" | wc -l)
    grep -q "set label \"$nfixed of 8 infeasible\" at 0," "$gp"
    # a budget far above the bars is named, not drawn
    "$BIN/lrmoe-sim" --ranks 8 --plot "$T/f" "$D/tr.lrm" > /dev/null
    if grep -q '^set arrow' "$T/f/memory.gp"; then fail "a budget line 40x above the bars"; fi
    grep -q 'budget: base experts + --hbm 16 GiB = 16.* GiB (modelled): above the plotted range' "$T/f/memory.gp"
    if grep -q 'infeasible"' "$T/f/memory.gp"; then fail "infeasible marks without infeasible frames"; fi
}

@test "latency: dispatch, compute and combine of the forward and of the backward on its own, and replica weights, each the TSV's mean" {
    head -1 "$D/figs/latency.dat" | grep -q $'\tforward: dispatch\tforward: compute\tforward: combine\tbackward: dispatch\tbackward: compute\tbackward: combine\treplica weights'
    python3 - "$D/s.tsv" "$D/figs/latency.dat" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
h = rows[0]
col = lambda r, n: float(r[h.index(n)])
bars = {l.split("\t")[0]: [float(x) for x in l.split("\t")[1:8]]
        for l in open(sys.argv[2]).read().splitlines()[1:] if l and not l.startswith("#")}
assert sorted(bars) == ["eplb", "fixed", "llep", "lrmoe"], bars
for p, bar in bars.items():
    rs = [r for r in rows[1:] if r[h.index("planner")] == p]
    mean = lambda f: sum(f(r) for r in rs) / len(rs) * 1e3
    want = [mean(lambda r, s=s: col(r, f"t_{s}_s") - col(r, f"t_bwd_{s}_s"))
            for s in ("dispatch", "compute", "combine")]
    want += [mean(lambda r, s=s: col(r, f"t_bwd_{s}_s")) for s in ("dispatch", "compute", "combine")]
    want += [mean(lambda r: col(r, "t_weights_s"))]
    for g, w in zip(bar, want):
        assert abs(g - w) <= 1e-6 * max(abs(w), 1e-9), (p, bar, want)
    # the backward parts are the backward path, all seven the layer total
    assert abs(sum(bar[3:6]) - mean(lambda r: col(r, "t_backward_s"))) <= 1e-6 * sum(bar), p
    assert abs(sum(bar) - mean(lambda r: col(r, "t_total_s"))) <= 1e-6 * sum(bar), p
    assert all(x >= 0 for x in bar) and min(bar[:6]) > 0, (p, bar)
PY
    grep -q "set label \"backward [0-9.]* ms\" at" "$D/figs/latency.gp"
    # seven fills, no two alike, and no two alike in greyscale either: Rec.
    # 601 luma (what a greyscale print or `convert -colorspace Gray` keeps)
    # at least 20 of 255 apart, so each segment reads without colour
    grep -o 'index 0 using [0-9]*\(:xtic(1)\)\? lc rgb "#[0-9A-F]*"' "$D/figs/latency.gp" |
        sed 's/.*rgb "#//; s/"//' > "$D/fills"
    [ "$(sort -u "$D/fills" | wc -l)" -eq 7 ]
    run python3 -c '
import sys
y = sorted(0.299 * int(h[0:2], 16) + 0.587 * int(h[2:4], 16) + 0.114 * int(h[4:6], 16)
           for h in open(sys.argv[1]).read().split())
gap = min(b - a for a, b in zip(y, y[1:]))
print(len(y), "fills, least luma gap %.0f" % gap)
assert gap >= 20, y' "$D/fills"
    assert_success
    assert_output --regexp "^7 fills, least luma gap (2[0-9]|[3-9][0-9])$"
}

@test "pressure: a log2 axis with a tic at 1,2,4,8,16,20; the ideal curve says it keeps every pair" {
    gp="$D/figs/pressure.gp"
    grep -q '^set logscale x 2$' "$gp"
    r='\\nrho [0-9.]*"'
    grep -q "^set xtics (\"1$r 1, \"2$r 2, \"4$r 4, \"8$r 8, \"16$r 16, \"20$r 20)\$" "$gp"
    grep -q 'title "ideal (keeps every pair)"' "$gp"
    grep -q 'ideal: keeps every pair (no dropping)' "$gp"
    # the lines are the TSV-independent pressure table of the summary
    grep -q '^x20 ' "$D/sim.out"
}

@test "every figure: the legend below the plot, which gets the full width; one style per series (dash type and point type), one font" {
    for f in load pressure; do
        gp="$D/figs/$f.gp"
        n=$(grep -c '^set style line' "$gp")
        [ "$n" -ge 4 ]
        # no two series share a dash type or a point type
        [ "$(sed -n 's/^set style line [0-9]* .* dt \([^ ]*\) pt \([0-9]*\) .*/\1/p' "$gp" | sort -u | wc -l)" -eq "$n" ]
        [ "$(sed -n 's/^set style line [0-9]* .* pt \([0-9]*\) .*/\1/p' "$gp" | sort -u | wc -l)" -eq "$n" ]
        # every series is drawn and has a legend entry of its own style
        for k in $(seq 1 "$n"); do
            grep -q "ls $k notitle" "$gp"
            grep -q "NaN with linespoints ls $k title" "$gp"
        done
    done
    for f in load memory latency pressure; do
        grep -q '^set key outside below' "$D/figs/$f.gp"
        grep -q 'font "DejaVu Sans,12"' "$D/figs/$f.gp"
        grep -q '<svg' "$D/figs/$f.svg"
        grep -qi 'modelled' "$D/figs/$f.svg"
        # in the drawn SVG: the plot area (its grid lines) spans at least 85 %
        # of the width, and every legend entry (the .dat header's names) lies
        # below the plot's bottom edge, where no data is drawn
        python3 - "$D/figs/$f.svg" "$D/figs/$f.dat" <<'PY' || fail "$f.svg"
import re, sys
svg = open(sys.argv[1]).read()
w = float(re.search(r"<svg[^>]* width=\"(\d+)", svg).group(1))
grid = [tuple(map(float, m)) for m in
        re.findall(r'class="gridline"\s+d=\'M([\d.]+),([\d.]+) L([\d.]+),([\d.]+)', svg)]
assert grid, "no grid lines"
x0, x1 = min(g[0] for g in grid), max(g[2] for g in grid)
bottom = max(g[1] for g in grid)  # the y = 0 grid line: the plot's bottom
assert x1 - x0 >= 0.85 * w, f"plot area {x1 - x0:.0f} of {w:.0f} px wide"
texts = {}
for x, y, body in re.findall(r'translate\(([\d.]+),([\d.]+)\)"[^>]*>\s*<text>(.*?)</text>', svg, re.S):
    t = re.sub(r"<[^>]+>", "", body).strip()
    texts.setdefault(t, []).append((float(x), float(y)))
names = open(sys.argv[2]).readline().rstrip("\n").split("\t")[1:]
assert names, "no series"
for n in names:
    assert n in texts, f"no legend entry {n!r}"
    ys = [y for _, y in texts[n]]
    assert max(ys) > bottom + 20, f"legend entry {n!r} at y {ys}, plot bottom {bottom}"
PY
    done
}

@test "pressure: under each multiplier, the rho lrmoe chose there, the value the table prints" {
    "$BIN/lrmoe-gen" --tokens 8192 --layers 4 --steps 4 --zipf 1.1 --drift 2 --loads-only > "$T/tr.lrm"
    "$BIN/lrmoe-sim" -P 8 -x 1,2,4,8,16,20 --pressure-base 5000 -g "$T/g" "$T/tr.lrm" > "$T/out"
    # the table: the lrmoe column of every rho row, in multiplier order
    col=$(awk '/^batch multiplier/ { for (i = 3; i <= NF; i++) if ($i == "lrmoe") print i - 1 }' "$T/out")
    [ -n "$col" ]
    want=$(awk -v c="$col" '/^batch multiplier/ { on = 1; next } on && $1 == "rho" { print $(c + 1) }' "$T/out")
    [ "$(printf '%s\n' "$want" | wc -l)" -eq 6 ]
    # a choice below 1 somewhere and 1 elsewhere: a label at the wrong multiplier shows
    [ "$(printf '%s\n' "$want" | sort -u | wc -l)" -ge 2 ]
    got=$(grep '^set xtics (' "$T/g/pressure.gp" | grep -o '"[0-9.]*\\nrho [0-9.]*" [0-9.]*' |
        sed 's/^"\([0-9.]*\)\\nrho \([0-9.]*\)" \([0-9.]*\)$/\1 \2 \3/')
    assert_equal "$(printf '%s\n' "$got" | awk '{ print $2 }')" "$want"
    # each at its own multiplier (the tic's label and position)
    assert_equal "$(printf '%s\n' "$got" | awk '{ print $1, $3 }')" "$(printf '%s\n' 1 2 4 8 16 20 | awk '{ print $1, $1 }')"
    # and drawn: one "rho" label per multiplier in the SVG, the axis says whose
    [ "$(grep -c '<text>rho [0-9.]*</text>' "$T/g/pressure.svg")" -eq 6 ]
    grep -q 'rho lrmoe chose' "$T/g/pressure.gp"
}

@test "SVGs draw the same in rsvg and ImageMagick (gnuplot's own SVG does not)" {
    command -v rsvg-convert > /dev/null || skip "rsvg-convert not installed (tests/deps.sh installs librsvg2-bin)"
    command -v convert > /dev/null || skip "ImageMagick's convert not installed (tests/deps.sh installs imagemagick)"
    # differing pixels at a quarter of the size (fonts and antialiasing
    # differ by a pixel; a missing marker or a stray line does not)
    differ() {
        rsvg-convert -b white -o "$T/a.png" "$1"
        convert "$1" -background white -flatten "$T/b.png"
        convert "$T/a.png" -resize 25% "$T/a4.png"
        convert "$T/b.png" -resize 25% "$T/b4.png"
        compare -metric AE -fuzz 20% "$T/a4.png" "$T/b4.png" null: 2>&1 || true
    }
    mkdir "$T/raw"
    for f in load memory latency pressure; do
        n=$(differ "$D/figs/$f.svg")
        [ "$n" -lt 120 ] || fail "$f.svg: $n of 36000 pixels differ between rsvg and ImageMagick"
        if sed '/<defs>/,/<\/defs>/d' "$D/figs/$f.svg" | grep -q -e '<use ' -e currentColor; then
            fail "$f.svg: <use> or currentColor outside <defs>"
        fi
        # the control: the same script's SVG straight from gnuplot
        cp "$D/figs/$f.gp" "$D/figs/$f.dat" "$T/raw/"
        (cd "$T/raw" && gnuplot "$f.gp")
        n=$(differ "$T/raw/$f.svg")
        [ "$n" -gt 300 ] || fail "raw $f.svg: only $n pixels differ: the check cannot tell"
    done
}

@test "lrmoe-plan --plot FILE: pairs per rank before and after every planner on the trace's worst frame" {
    "$BIN/lrmoe-gen" --tokens 4096 --skew hot:50:2 | "$BIN/lrmoe-route" > "$T/one.lrm"
    run "$BIN/lrmoe-plan" --ranks 8 --rates 1,0.8,0.6 --hbm 100M --plot "$T/p.svg" -o "$T/out.lrm" "$T/one.lrm"
    assert_success
    grep -q '<svg' "$T/p.svg"
    cp "$T/p.dat" "$T/file.dat"
    head -1 "$T/p.dat" | grep -q $'^# x\tbefore: plain EP (= fixed)\tllep forward\teplb forward\tlrmoe forward'
    # the plan's stream is the same as without --plot
    "$BIN/lrmoe-plan" --ranks 8 --rates 1,0.8,0.6 --hbm 100M -o "$T/ref.lrm" "$T/one.lrm"
    run "$BIN/lrmoe-view" --diff "$T/out.lrm" "$T/ref.lrm"
    assert_success
    # before: expert_load summed over each rank's native experts (E/P each)
    python3 - "$T" "$BATS_TEST_DIRNAME/helpers" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
import numpy as np
from lrmoe_stream import read_stream
d = sys.argv[1]
(t, a), = read_stream(f"{d}/out.lrm")
load = t["expert_load"].astype(np.int64)
before = load.reshape(8, -1).sum(1)
fwd = t["fwd_alloc"].astype(np.int64).sum(0)
rows = [l.split("\t") for l in open(f"{d}/p.dat").read().splitlines()[1:]]
assert [int(float(r[1])) for r in rows] == before.tolist(), (rows, before)
# lrmoe's forward column is the plan lrmoe-plan wrote (same options, same frame)
assert [int(float(r[4])) for r in rows] == fwd.tolist(), (rows, fwd)
assert sum(int(float(r[2])) for r in rows) == load.sum()
PY
    # PNG by the extension; errors say what to do
    run "$BIN/lrmoe-plan" --ranks 8 --plot "$T/p.png" -o /dev/null "$T/one.lrm"
    assert_success
    [ "$(head -c 4 "$T/p.png" | od -An -c | tr -d ' ')" = '211PNG' ]
    # a trace on a pipe: the loads are kept, the figure is the FILE's
    cat "$T/one.lrm" | "$BIN/lrmoe-plan" --ranks 8 --rates 1,0.8,0.6 --hbm 100M --plot "$T/p.svg" -o "$T/pipe.lrm"
    cmp "$T/file.dat" "$T/p.dat"
    run "$BIN/lrmoe-view" --diff "$T/pipe.lrm" "$T/ref.lrm"
    assert_success
    # each frame is replayed with its own model sizes (here F=32 from the frame, far
    # from the defaults, which would not fit 100M): lrmoe's column is the plan
    "$BIN/lrmoe-gen" --tokens 4096 --hidden 64 --ffn 32 --skew hot:50:2 |
        "$BIN/lrmoe-route" --loads-only | "$BIN/lrmoe-plan" --ranks 8 --hidden 64 --hbm 100M --plot "$T/s.svg" -o "$T/s.lrm"
    python3 - "$T" "$BATS_TEST_DIRNAME/helpers" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
import numpy as np
from lrmoe_stream import read_stream
d = sys.argv[1]
(t, a), = read_stream(f"{d}/s.lrm")
assert (a["plan.hidden"], a["plan.ffn"], a["plan.feasible"]) == ("64", "32", "1"), a
fwd = t["fwd_alloc"].astype(np.int64).sum(0)
rows = [l.split("\t") for l in open(f"{d}/s.dat").read().splitlines()[1:]]
assert [int(float(r[4])) for r in rows] == fwd.tolist(), (rows, fwd)
PY
    run "$BIN/lrmoe-plan" --ranks 8 --plot "$T/p.pdf" -o /dev/null "$T/one.lrm"
    assert_failure 2
    assert_output "lrmoe-plan: --plot $T/p.pdf: the name must end in .svg or .png"
}
