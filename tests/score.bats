#!/usr/bin/env bats
# lrmoe-score against the NumPy reference in tests/helpers/score_ref.py:
# every metric, plan quotas and --drop, tie-breaking, fidelity, bad input.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load
load helpers/unit

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
    run "$BIN/lrmoe-score" --select topk -o "$T/out.lrm" "$T/in.lrm"
    assert_success
    run $REF check-score "$T/in.lrm" "$T/out.lrm" --metric lrm
    assert_success
}

@test "gradnorm, absgrad and random match the reference (F32 and BF16)" {
    for dt in F32 BF16; do
        mk --dtype $dt --T 80 --seed 3
        for m in gradnorm absgrad random; do
            "$BIN/lrmoe-score" --select topk -m $m --seed 7 "$T/in.lrm" > "$T/out.lrm"
            run $REF check-score "$T/in.lrm" "$T/out.lrm" --metric $m --seed 7
            assert_success
        done
    done
}

@test "--drop C keeps n - floor(n*C/100) per expert and writes quota" {
    mk --noplan --T 100 --E 10
    for c in 0 10 20 30 100; do
        "$BIN/lrmoe-score" --select topk --drop $c "$T/in.lrm" > "$T/out.lrm"
        run $REF check-score "$T/in.lrm" "$T/out.lrm" --drop $c
        assert_success
    done
}

@test "ties break by the lower pair index, on quantised and all-equal scores" {
    for ties in 1 2; do
        mk --ties $ties --T 120 --E 6 --K 3
        "$BIN/lrmoe-score" --select topk --drop 37 "$T/in.lrm" > "$T/out.lrm"
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
    "$BIN/lrmoe-score" --select topk -m gradnorm --drop 25 "$T/in.lrm" > "$T/out.lrm"
    run $REF check-score "$T/in.lrm" "$T/out.lrm" --metric gradnorm --drop 25
    assert_success
}

@test "--fidelity matches the reference dW_down error, per expert and overall" {
    mk --T 64 --E 8 --D 24 --F 16
    for m in lrm random; do
        "$BIN/lrmoe-score" --select topk -m $m --drop 30 --fidelity "$T/in.lrm" > "$T/out.lrm"
        run $REF check-score "$T/in.lrm" "$T/out.lrm" --metric $m --drop 30 --fidelity
        assert_success
    done
}

@test "lrm loses less dW_down than random at C30 (fidelity attribute)" {
    mk --T 256 --E 8 --D 32 --F 24 --frames 1
    for m in lrm random; do
        "$BIN/lrmoe-score" --select topk -m $m --drop 30 --fidelity "$T/in.lrm" -v \
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
    run "$BIN/lrmoe-score" --select topk -o "$T/out.lrm" "$T/bad.lrm"
    assert_failure 1
    assert_output "lrmoe-score: frame 0: missing tensor phi_sqnorm (lrmoe-exec --phase forward writes it: run that first)"
    truncated "$T/out.lrm"
    # the gradient-only metrics do not need it
    run "$BIN/lrmoe-score" --select topk -m gradnorm -o "$T/out.lrm" "$T/bad.lrm"
    assert_success
}

@test "NaN in grad_output or phi_sqnorm: error naming the pair, exit 1, no trailer" {
    mk --dtype BF16
    for w in nangrad nanphi; do
        $REF corrupt "$T/in.lrm" "$T/bad.lrm" $w
        run "$BIN/lrmoe-score" --select topk -o "$T/out.lrm" "$T/bad.lrm"
        assert_failure 1
        assert_output --regexp "^lrmoe-score: frame 0: pair_score: NaN score at pair [0-9]+ \(token [0-9]+, k [0-9]+\)"
        truncated "$T/out.lrm"
    done
}

@test "a quota above the expert's load: error, exit 1, no trailer" {
    mk
    $REF corrupt "$T/in.lrm" "$T/bad.lrm" bigquota
    run "$BIN/lrmoe-score" --select topk -o "$T/out.lrm" "$T/bad.lrm"
    assert_failure 1
    assert_output --regexp "^lrmoe-score: frame 0: quota: expert [0-9]+ has quota [0-9]+ but [0-9]+ routed pairs$"
    truncated "$T/out.lrm"
}

# $T/bad.lrm refused with message $1 (exit 1, no trailer) by both selections
refused_by_both() {
    for sel in topk sample; do
        run "$BIN/lrmoe-score" --select $sel -o "$T/out.lrm" "$T/bad.lrm"
        assert_failure 1
        assert_output "$1"
        truncated "$T/out.lrm"
    done
}

@test "quota of 0 experts, bwd_alloc of 0 ranks (keeping by rank): error naming the tensor, exit 1, no trailer" {
    # a quota of 0 entries used to be read past its end (ASan: heap-buffer-overflow)
    mk
    for w in emptyquota:quota:0 byranknoranks:bwd_alloc:1; do
        IFS=: read -r what name dim <<< "$w"
        $REF corrupt "$T/in.lrm" "$T/bad.lrm" "$what"
        refused_by_both "lrmoe-score: frame 0: tensor $name: dimension $dim is 0 (it counts experts or ranks: at least 1)"
    done
}

@test "an expert id of 2^31-1 with nothing else saying E (--drop): error naming it, exit 1, no trailer" {
    # the largest id + 1 overflowed an int (UBSan); such an E is refused
    mk
    $REF corrupt "$T/in.lrm" "$T/bad.lrm" hugeid
    run "$BIN/lrmoe-score" --drop 10 -o "$T/out.lrm" "$T/bad.lrm"
    assert_failure 1
    assert_output "lrmoe-score: frame 0: topk_ids: expert 2147483647 at pair 5: more than 1048576 experts"
    truncated "$T/out.lrm"
}

@test "keeping by rank, bwd_alloc rows summing past 2^63: error naming the expert, exit 1, no trailer" {
    # the sum overflowed in both by-rank selections (UBSan, found by the stages fuzz harness)
    mk
    $REF corrupt "$T/in.lrm" "$T/bad.lrm" byrankhuge
    refused_by_both "lrmoe-score: frame 0: bwd_alloc: expert 0 allocates more than 2^63-1 rows in all"
}

@test "no quota and no --drop is an error" {
    mk --noplan
    run "$BIN/lrmoe-score" --select topk -o "$T/out.lrm" "$T/in.lrm"
    assert_failure 1
    assert_output --partial "missing tensor quota"
}

@test "usage errors exit 2; --help and --version" {
    run "$BIN/lrmoe-score" --select topk --metric nope
    assert_failure 2
    assert_output --partial "lrmoe-score: unknown metric 'nope'"
    run "$BIN/lrmoe-score" --select topk --drop 101
    assert_failure 2
    run "$BIN/lrmoe-score" --select topk --drop x
    assert_failure 2
    run "$BIN/lrmoe-score" --select topk --help
    assert_success
    assert_output --partial "Usage: lrmoe-score"
    run "$BIN/lrmoe-score" --select topk --version
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
        "$BIN/lrmoe-score" --select topk --metric "$m" -@ 1 -o "$T/s1.lrm" "$T/in.lrm"
        for n in 2 3 4; do
            "$BIN/lrmoe-score" --select topk --metric "$m" -@ "$n" -o "$T/s$n.lrm" "$T/in.lrm"
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
    "$BIN/lrmoe-score" --select topk --drop 30 -@ 3 -o "$T/d3.lrm" "$T/in.lrm"
    run $REF check-score "$T/in.lrm" "$T/d3.lrm" --metric lrm --drop 30
    assert_success
}

@test "sample: the unbiased draw by expert (exact quotas, inclusion probabilities, E[weighted sum] = full sum; tests/unit/score_test.c)" {
    run "$(unit_test score)"
    assert_success
    assert_output --partial "ok"
}

@test "--select sample: quota kept per expert, pair_weight = 1/p >= 1, reproducible by seed, -@ N the same bits" {
    mk --T 300 --E 12 --rate 0.7
    "$BIN/lrmoe-score" --select topk --select sample --seed 5 -o "$T/a.lrm" "$T/in.lrm"
    "$BIN/lrmoe-score" --select topk --select sample --seed 5 -@ 3 -o "$T/b.lrm" "$T/in.lrm"
    "$BIN/lrmoe-score" --select topk --select sample --seed 6 -o "$T/c.lrm" "$T/in.lrm"
    "$BIN/lrmoe-score" --select topk -o "$T/k.lrm" "$T/in.lrm"
    run python3 -c "
import sys; sys.path.insert(0, '$BATS_TEST_DIRNAME/helpers'); from lrmoe_stream import read_stream
import numpy as np
a, b, c, k = (read_stream('$T/%s.lrm' % n) for n in 'abck')
assert len(a) == 2
for (ta, aa), (tb, _), (tc, _), (tk, ak) in zip(a, b, c, k):
    assert aa['score.select'] == 'sample' and 'score.select' not in ak and 'pair_weight' not in tk
    for n in ta: assert np.array_equal(ta[n], tb[n]), n
    ids, q = ta['topk_ids'].astype(np.int64), ta['quota']
    keep, w = ta['keep'].astype(bool), ta['pair_weight']
    assert (np.bincount(ids[keep], minlength=len(q)) == q).all(), 'quota'
    assert (w >= 1).all() and (w[~keep] == 1).all() and np.isfinite(w).all()
    assert not np.array_equal(ta['keep'], tc['keep']), 'seed ignored'
    assert np.array_equal(ta['pair_score'], tk['pair_score'])
print('ok')"
    assert_success
    assert_output "ok"
}

@test "--select sample through pack and the compact/masked backward: rows scaled by pair_weight, router gradient exact; quota = load gives topk's bits" {
    "$BIN/lrmoe-gen" --experts 8 --topk 2 --hidden 32 --ffn 16 --tokens 256 --seed 4 \
        --weights "$T/w.lrm" -o "$T/g.lrm"
    "$BIN/lrmoe-route" -k 2 "$T/g.lrm" | "$BIN/lrmoe-plan" --ranks 2 --rate 0.7 |
        "$BIN/lrmoe-exec" --phase forward --weights "$T/w.lrm" > "$T/f.lrm"
    for s in topk sample; do
        "$BIN/lrmoe-score" --select topk --select $s "$T/f.lrm" > "$T/s_$s.lrm"
        "$BIN/lrmoe-pack" "$T/s_$s.lrm" | "$BIN/lrmoe-exec" --phase backward --mode compact \
            --weights "$T/w.lrm" > "$T/c_$s.lrm"
        "$BIN/lrmoe-pack" --layout-only "$T/s_$s.lrm" | "$BIN/lrmoe-exec" --phase backward \
            --mode compact --weights "$T/w.lrm" > "$T/l_$s.lrm"
        "$BIN/lrmoe-exec" --phase backward --mode masked --weights "$T/w.lrm" "$T/s_$s.lrm" > "$T/m_$s.lrm"
    done
    "$BIN/lrmoe-exec" --phase backward --mode full --weights "$T/w.lrm" "$T/s_sample.lrm" > "$T/full.lrm"
    "$BIN/lrmoe-exec" --phase backward --mode full --weights "$T/w.lrm" "$T/f.lrm" > "$T/full0.lrm"
    run python3 -c "
import sys; sys.path.insert(0, '$BATS_TEST_DIRNAME/helpers'); from lrmoe_stream import read_stream
import numpy as np
R = lambda n: read_stream('$T/%s.lrm' % n)[0][0]
s, c, l, m, full, full0 = R('s_sample'), R('c_sample'), R('l_sample'), R('m_sample'), R('full'), R('full0')
ids, keep, w = s['topk_ids'], s['keep'].astype(bool), s['pair_weight']
alpha = s['topk_weights'] * w
# the packed rows: (alpha_u * w_u) g_t, rounded once as lrmoe_frame_bwd_alpha
pair = c['pack_pair']; K = ids.shape[1]
g = s['grad_output']
g = (g.astype(np.uint32) << 16).view(np.float32) if g.dtype == np.uint16 else g.astype(np.float32)
ref = (alpha.reshape(-1)[pair][:, None] * g[pair // K]).astype(np.float32)
assert np.array_equal(c['pack_grad'], ref), 'pack_grad'
for n in ('grad_hidden', 'grad_w_down', 'grad_w_gate', 'grad_w_up'):
    assert np.array_equal(c[n], l[n]), n + ': copying and layout-only forms differ'
    assert np.allclose(c[n], m[n], rtol=1e-4, atol=1e-5), n + ': compact vs masked'
# the router gradient never sees the weights: every mode equals full's
for o in (c, l, m):
    assert np.array_equal(o['grad_topk_weights'], full['grad_topk_weights'])
# full ignores pair_weight
for n in ('grad_hidden', 'grad_w_down'): assert np.array_equal(full[n], full0[n]), n
# the weighted dW_down differs from the unweighted kept sum
ck = R('c_topk')
assert not np.array_equal(c['grad_w_down'], ck['grad_w_down'])
print('ok')"
    assert_success
    assert_output "ok"
    # quota = load (every p = 1): sample keeps all with weight 1, the bits of topk
    "$BIN/lrmoe-route" -k 2 "$T/g.lrm" | "$BIN/lrmoe-plan" --ranks 2 --rate 1 |
        "$BIN/lrmoe-exec" --phase forward --weights "$T/w.lrm" > "$T/f1.lrm"
    for s in topk sample; do
        "$BIN/lrmoe-score" --select topk --select $s "$T/f1.lrm" | "$BIN/lrmoe-pack" |
            "$BIN/lrmoe-exec" --phase backward --mode compact --weights "$T/w.lrm" > "$T/one_$s.lrm"
    done
    run python3 -c "
import sys; sys.path.insert(0, '$BATS_TEST_DIRNAME/helpers'); from lrmoe_stream import read_stream
import numpy as np
a, b = read_stream('$T/one_topk.lrm')[0][0], read_stream('$T/one_sample.lrm')[0][0]
assert (b['pair_weight'] == 1).all() and b['keep'].all()
for n in ('grad_hidden', 'grad_w_down', 'grad_w_gate', 'grad_w_up', 'grad_topk_weights', 'pack_grad'):
    assert np.array_equal(a[n], b[n]), n
print('ok')"
    assert_success
    assert_output "ok"
}

@test "pair_weight that is not finite and positive: lrmoe-pack refuses it (lrmoe_frame_bwd_alpha, which lrmoe-exec shares), exit 1" {
    mk --T 64 --E 8 --rate 0.7
    "$BIN/lrmoe-score" --select topk --select sample -o "$T/s.lrm" "$T/in.lrm"
    python3 -c "
import sys; sys.path.insert(0, '$BATS_TEST_DIRNAME/helpers'); from lrmoe_stream import read_stream, write_stream
import numpy as np
fr = read_stream('$T/s.lrm')
w = fr[0][0]['pair_weight'].copy(); w[3, 1] = 0; fr[0][0]['pair_weight'] = w
write_stream('$T/bad.lrm', fr)"
    run "$BIN/lrmoe-pack" -o "$T/p.lrm" "$T/bad.lrm"
    assert_failure 1
    assert_output --partial "pair_weight[3,1] is 0"
}

@test "--fidelity --weights: rel_err, norm_ratio and cosine of dW_down, dW_gate, dW_up and dx equal the backward's own (compact against full); bias 0 for sample, = rel_err for topk" {
    "$BIN/lrmoe-gen" --experts 8 --topk 2 --hidden 32 --ffn 16 --tokens 256 --seed 6 \
        --weights "$T/w.lrm" -o "$T/g.lrm"
    "$BIN/lrmoe-route" -k 2 "$T/g.lrm" | "$BIN/lrmoe-plan" --ranks 2 --rate 0.7 |
        "$BIN/lrmoe-exec" --phase forward --compute f32 --weights "$T/w.lrm" > "$T/f.lrm"
    "$BIN/lrmoe-exec" --phase backward --mode full --compute f32 --weights "$T/w.lrm" "$T/f.lrm" > "$T/full.lrm"
    for s in topk sample; do
        "$BIN/lrmoe-score" --select topk --select $s --fidelity --weights "$T/w.lrm" "$T/f.lrm" |
            "$BIN/lrmoe-pack" | "$BIN/lrmoe-exec" --phase backward --mode compact --compute f32 \
            --weights "$T/w.lrm" > "$T/c_$s.lrm"
    done
    run python3 -c "
import sys; sys.path.insert(0, '$BATS_TEST_DIRNAME/helpers'); from lrmoe_stream import read_stream
import numpy as np
(full, _), = read_stream('$T/full.lrm')
for s in ('topk', 'sample'):
    (c, a), = read_stream('$T/c_%s.lrm' % s)
    for key, t in (('dw_down', 'grad_w_down'), ('dw_gate', 'grad_w_gate'), ('dw_up', 'grad_w_up'), ('dx', 'grad_hidden')):
        G, H = full[t].astype(np.float64), c[t].astype(np.float64)
        want = {'rel_err': np.linalg.norm(H - G) / np.linalg.norm(G),
                'norm_ratio': np.linalg.norm(H) / np.linalg.norm(G),
                'cosine': (H * G).sum() / np.linalg.norm(H) / np.linalg.norm(G)}
        for fig, v in want.items():
            got = float(a['score.fidelity.%s.%s' % (key, fig)])
            assert abs(got - v) <= 2e-4 * max(1.0, abs(v)), (s, key, fig, got, v)
        b = float(a['score.fidelity.%s.bias' % key])
        if s == 'sample': assert b == 0, (key, b)
        else: assert b == float(a['score.fidelity.%s.rel_err' % key]) > 0, (key, b)
print('ok')"
    assert_success
    assert_output "ok"
    # a raw copy of the weights is mapped (its frame checked when first
    # used): the same figures; a flipped bit in it is that frame's error
    "$BIN/lrmoe-cat" --no-compress -o "$T/wr.lrm" "$T/w.lrm"
    "$BIN/lrmoe-score" --select topk --fidelity --weights "$T/w.lrm" --no-compress -o "$T/s1.lrm" "$T/f.lrm"
    "$BIN/lrmoe-score" --select topk --fidelity --weights "$T/wr.lrm" --no-compress -o "$T/s2.lrm" "$T/f.lrm"
    run python3 -c "
import sys; sys.path.insert(0, '$BATS_TEST_DIRNAME/helpers'); from lrmoe_stream import read_stream
(a, x), = read_stream('$T/s1.lrm'); (b, y), = read_stream('$T/s2.lrm')
assert all(a[k].tobytes() == b[k].tobytes() for k in a) and a.keys() == b.keys()
f = {k: v for k, v in x.items() if k.startswith('score.fidelity.')}
assert f and f == {k: v for k, v in y.items() if k.startswith('score.fidelity.')}; print('same')"
    assert_output same
    python3 -c "
import os; p = '$T/wr.lrm'; n = os.path.getsize(p); f = open(p, 'r+b'); f.seek(n - 100); b = f.read(1); f.seek(n - 100); f.write(bytes([b[0] ^ 4]))"
    run "$BIN/lrmoe-score" --select topk --fidelity --weights "$T/wr.lrm" -o "$T/s3.lrm" "$T/f.lrm"
    assert_failure 1
    assert_output --regexp "^lrmoe-score: frame 0: --weights: $T/wr.lrm: frame 0: digest mismatch: the frame's CRC-64 is"
    run "$BIN/lrmoe-score" --select topk --weights "$T/w.lrm" "$T/f.lrm"
    assert_failure 2
    assert_output --partial "--weights is only read with --fidelity"
}

@test "the default selection is sample (the study's finding); --select topk is the paper's rule" {
    mk --T 120 --E 8 --rate 0.7
    "$BIN/lrmoe-score" -o "$T/d.lrm" "$T/in.lrm"
    "$BIN/lrmoe-score" --select sample -o "$T/s.lrm" "$T/in.lrm"
    run python3 -c "
import sys; sys.path.insert(0, '$BATS_TEST_DIRNAME/helpers'); from lrmoe_stream import read_stream
import numpy as np
for (a, aa), (b, ab) in zip(read_stream('$T/d.lrm'), read_stream('$T/s.lrm')):
    assert sorted(a) == sorted(b) and all(np.array_equal(a[n], b[n]) for n in a)
    assert aa['score.select'] == ab['score.select'] == 'sample'
print('same')"
    assert_output "same"
    run "$BIN/lrmoe-view" --no-stats "$T/d.lrm"
    assert_output --partial "score.select=sample"
    assert_output --partial "pair_weight"
    run "$BIN/lrmoe-score" --help
    assert_output --partial "sample (default"
}
