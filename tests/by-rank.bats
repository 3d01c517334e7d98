#!/usr/bin/env bats
# The keep by forward rank, plan.keep=by-rank: lrmoe-score keeps by forward rank when the
# plan's backward relies on it, and lrmoe-pack then moves no state that the
# plan's cost model did not charge.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    H="$BATS_TEST_DIRNAME/helpers"
    T="$BATS_TEST_TMPDIR"
}

# the pipeline up to pack: hot:80:2, 3 steps, 4 ranks, rate 0.7 (the strict
# rule: the modelled backward may not be longer than keeping every pair)
pipeline() {
    "$BIN/lrmoe-gen" --tokens 512 --experts 16 --topk 4 --hidden 48 --ffn 32 --dtype f32 \
        --skew hot:80:2 --seed 5 --steps 3 --weights "$T/w.lrm" |
        "$BIN/lrmoe-route" --topk 4 -n > "$T/r.lrm"
    "$BIN/lrmoe-plan" --ranks 4 --rate 0.7 --stats "$T/plan.tsv" "$T/r.lrm" |
        "$BIN/lrmoe-exec" --phase forward --weights "$T/w.lrm" > "$T/f.lrm"
    "$BIN/lrmoe-score" --select topk "$T/f.lrm" > "$T/s.lrm"
    "$BIN/lrmoe-pack" --alloc plan --stats "$T/pack.tsv" "$T/s.lrm" > "$T/p.lrm"
    # the plan's modelled moved rows per rank, as lrmoe-sim prints them
    "$BIN/lrmoe-sim" --quiet --ranks 4 --planners lrmoe@0.7 --rank-stats "$T/rank.tsv" \
        "$T/r.lrm" > /dev/null
}

@test "by-rank: the realised pack moves exactly the state the plan modelled, per rank" {
    pipeline
    # the selection against a numpy reference, and the moved rows per rank
    # (pack_rank != pair_rank) against the plan's model as lrmoe-sim
    # --rank-stats prints it (moved_rows; the same plan: its bwd_pairs are
    # the frame's): by-rank frames exactly, the others at most that (the
    # worst case over the pairs lrmoe-score may keep)
    run python3 - "$H" "$T/p.lrm" "$T/pack.tsv" "$T/rank.tsv" <<'PY'
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from lrmoe_stream import read_stream
frames = read_stream(sys.argv[2])
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[3])]
h = rows[0]
moved_col = next(i for i, c in enumerate(h) if c == "moved" or c.startswith("moved_"))
rk = [l.rstrip("\n").split("\t") for l in open(sys.argv[4])]
rc = {c: i for i, c in enumerate(rk[0])}
sim = {}
for r in rk[1:]:
    sim.setdefault(int(r[rc["frame"]]), {})[int(r[rc["rank"]])] = (
        int(r[rc["bwd_pairs"]]), int(r[rc["moved_rows"]]))
nby = 0
for i, (t, a) in enumerate(frames):
    ids, keep, score = t["topk_ids"].ravel(), t["keep"].ravel(), t["pair_score"].ravel()
    prank = t["pair_rank"].ravel()
    fwd, bwd, quota = t["fwd_alloc"], t["bwd_alloc"], t["quota"]
    E, P = fwd.shape
    byr = a.get("plan.keep") == "by-rank"
    nby += byr
    # reference selection
    u = np.arange(ids.size)
    ref = np.zeros(ids.size, np.uint8)
    for e in range(E):
        extra = 0
        for p in range(P):
            if not byr:
                break
            m = np.where((ids == e) & (prank == p))[0]
            o = m[np.lexsort((m, -score[m].astype(np.float64)))]
            q = min(int(bwd[e, p]), len(o))
            ref[o[:q]] = 1
            extra += int(bwd[e, p]) - q
        m = np.where((ids == e) & (ref == 0))[0]
        o = m[np.lexsort((m, -score[m].astype(np.float64)))]
        ref[o[:extra if byr else int(quota[e])]] = 1
    if not np.array_equal(ref, keep):
        sys.exit("frame %d (%s): keep differs from the reference at %d pairs" %
                 (i, a.get("plan.keep"), int((ref != keep).sum())))
    pp, pr = t["pack_pair"].ravel(), t["pack_rank"].ravel()
    real = np.bincount(pr[prank[pp] != pr], minlength=P)
    if [sim[i][p][0] for p in range(P)] != bwd.sum(axis=0).tolist():
        sys.exit("frame %d: lrmoe-sim planned another backward (%s, the frame %s)" %
                 (i, [sim[i][p][0] for p in range(P)], bwd.sum(axis=0).tolist()))
    model = np.array([sim[i][p][1] for p in range(P)])
    if byr and not np.array_equal(real, model):
        sys.exit("frame %d: by-rank: moved rows per rank %s, the model %s" % (i, real, model))
    if (real > model).any():
        sys.exit("frame %d: moved rows per rank %s above the model %s" % (i, real, model))
    if int(rows[1 + i][moved_col]) != int(real.sum()):
        sys.exit("frame %d: pack --stats moved %s, the packed tensors %d" %
                 (i, rows[1 + i][moved_col], int(real.sum())))
    print("frame %d %s: moved per rank %s, modelled %s" % (i, a.get("plan.keep", "global"),
                                                           real.tolist(), model.tolist()))
if nby == 0:
    sys.exit("no frame was planned by-rank: the test no longer exercises it")
PY
    echo "$output"
    assert_success
    # the backward runs on the pack: compact equals masked
    for mode in masked compact; do
        "$BIN/lrmoe-exec" --phase backward --mode $mode --weights "$T/w.lrm" "$T/p.lrm" \
            > "$T/b_$mode.lrm"
    done
    run python3 "$H/score_ref.py" compare "$T/b_masked.lrm" "$T/b_compact.lrm" --rtol 1e-5
    assert_success
}

@test "by-rank: the frame the strict rule refused now plans, and its backward is not longer" {
    python3 "$H/plan_ref.py" gen --frames 6 --seed 13 "$T/g.lrm"
    run "$BIN/lrmoe-plan" --ranks 8 --hbm 6.3G --stats "$T/s.tsv" -o "$T/p.lrm" "$T/g.lrm"
    assert_success
    run python3 - "$H" "$T/s.tsv" "$T/p.lrm" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from lrmoe_stream import read_stream
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[2])]
h = rows[0]
src, rho = h.index("source"), h.index("rho")
fr = read_stream(sys.argv[3])
assert len(rows) == 7 and len(fr) == 6, (len(rows), len(fr))
for r, (t, a) in zip(rows[1:], fr):
    assert float(r[rho]) < 1, r
    assert (a.get("plan.keep") == "by-rank") == r[src].endswith("+by-rank"), (r[src], a)
assert fr[4][1].get("plan.keep") == "by-rank", fr[4][1]
PY
    echo "$output"
    assert_success
}

@test "by-rank: a bad plan.keep value, and a by-rank frame without bwd_alloc, are refused" {
    pipeline
    python3 - "$H" "$T/f.lrm" "$T/bad.lrm" "$T/nob.lrm" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from lrmoe_stream import read_stream, write_stream
fr = read_stream(sys.argv[2])
t, a = fr[0]
write_stream(sys.argv[3], [(t, dict(a, **{"plan.keep": "sideways"}))])
t2 = {k: v for k, v in t.items() if k != "bwd_alloc"}
write_stream(sys.argv[4], [(t2, dict(a, **{"plan.keep": "by-rank"}))])
PY
    run "$BIN/lrmoe-score" --select topk -o /dev/null "$T/bad.lrm"
    assert_failure
    assert_output --partial "plan.keep: 'sideways'"
    run "$BIN/lrmoe-score" --select topk -o /dev/null "$T/nob.lrm"
    assert_failure
    assert_output --partial "bwd_alloc"
}

@test "by-rank: the Python API (lrmoe.ops.score with keep_rule) keeps what lrmoe-score keeps" {
    python3 -c 'import numpy' 2>/dev/null || skip "numpy is not installed"
    pipeline
    run env LRMOE_LIBRARY="$BATS_TEST_DIRNAME/../build/liblrmoe.so.2" \
        PYTHONPATH="$BATS_TEST_DIRNAME/../lib/python" python3 - "$H" "$T/f.lrm" "$T/s.lrm" <<'PY'
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from lrmoe_stream import read_stream
from lrmoe import ops
nby = 0
for i, ((t, a), (o, _)) in enumerate(zip(read_stream(sys.argv[2]), read_stream(sys.argv[3]))):
    rule = a.get("plan.keep")
    nby += rule == "by-rank"
    r = ops.score(t["topk_ids"], t["topk_weights"], t["grad_output"], phi_sqnorm=t["phi_sqnorm"],
                  quota=t["quota"], index=i, bwd_alloc=t["bwd_alloc"], pair_rank=t["pair_rank"],
                  keep_rule=rule, select="topk")
    assert np.array_equal(r["keep"], o["keep"]), (i, rule)
    assert (r.attrs.get("score.keep") == "by-rank") == (rule == "by-rank"), (i, r.attrs)
assert nby > 0, "no by-rank frame"
print("ok", nby)
PY
    echo "$output"
    assert_success
    assert_output --regexp '^ok [1-9]'
}
