#!/usr/bin/env bats
# lrmoe-exec: forward/backward against a float64 NumPy reference
# (tests/helpers/exec_ref.py), plan invariance, masked/compact equivalences,
# bad input.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load
load helpers/unit
load helpers/bf16_kernels

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    REF="$BATS_TEST_DIRNAME/helpers/exec_ref.py"
    HELP="$BATS_TEST_DIRNAME/helpers"
    D="$BATS_TEST_TMPDIR"
    EXEC="$BIN/lrmoe-exec"
    GRADS="grad_hidden grad_w_gate grad_w_up grad_w_down grad_topk_weights"
}

# a python snippet with lrmoe_stream imported
pyedit() {
    python3 -c "import sys; sys.path.insert(0, '$HELP'); from lrmoe_stream import *; import numpy as np; $1"
}

# exit 1, a one-line "lrmoe-exec: ..." error, and no trailer on stdout
assert_fails_clean() {
    assert_equal "$status" 1
    assert_line --partial "lrmoe-exec: "
}

no_trailer() {
    run pyedit "read_stream('$1')"
    assert_failure
}

@test "exec: --help, --version, usage errors exit 2" {
    run "$EXEC" --help
    assert_success
    assert_output --partial "--phase"
    run "$EXEC" --version
    assert_success
    assert_output --regexp '^lrmoe-exec \(lrmoe\) [0-9]'
    run "$EXEC" --weights x
    assert_equal "$status" 2
    assert_line --partial "lrmoe-exec: --phase: required"
    run "$EXEC" --phase sideways --weights x
    assert_equal "$status" 2
    run "$EXEC" --phase forward
    assert_equal "$status" 2
    assert_line --partial "--weights: required"
    run "$EXEC" --phase forward --mode masked --weights x
    assert_equal "$status" 2
    run "$EXEC" --phase backward --mode partial --weights x
    assert_equal "$status" 2
    run "$EXEC" --phase forward --weights x --ranks 0
    assert_equal "$status" 2
}

@test "exec: forward and full backward match the float64 reference, P=1,2,4,8, T%P!=0, empty experts" {
    # T=37 is not divisible by 2, 4 or 8; skewed routing, expert 7 never chosen
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 37 --E 8 --K 2 --D 16 --F 12 \
        --skew 3 --zero-experts 1
    for P in 1 2 4 8; do
        run "$EXEC" --phase forward --weights "$D/w.lrm" --ranks "$P" --no-compress \
            -o "$D/f$P.lrm" "$D/in.lrm"
        assert_success
        run python3 "$REF" check-fwd "$D/f$P.lrm" "$D/w.lrm" --P "$P" --tol 1e-5
        assert_success
        run "$EXEC" --phase backward --weights "$D/w.lrm" --no-compress -o "$D/b$P.lrm" "$D/f$P.lrm"
        assert_success
        run python3 "$REF" check-bwd "$D/b$P.lrm" "$D/w.lrm" --tol 1e-5
        assert_success
    done
    # the rank split moves work only: P=8 equals P=1 closely
    run python3 "$REF" compare "$D/b8.lrm" "$D/b1.lrm" output $GRADS --tol 1e-6
    assert_success
}

@test "exec: the reference passes a finite-difference check, and exec matches it on that layer" {
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 6 --E 4 --K 2 --D 5 --F 3 --seed 11
    run python3 "$REF" fd "$D/w.lrm" "$D/in.lrm"
    assert_success
    assert_output --partial "finite differences"
    "$EXEC" --phase forward --weights "$D/w.lrm" -P 2 --no-compress "$D/in.lrm" |
        "$EXEC" --phase backward --weights "$D/w.lrm" --no-compress -o "$D/b.lrm"
    run python3 "$REF" check-bwd "$D/b.lrm" "$D/w.lrm" --tol 1e-5
    assert_success
}

@test "exec: BF16 storage, two layers matched by attribute layer" {
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 50 --E 8 --K 3 --D 32 --F 24 \
        --dtype bf16 --layers 2 --skew 1
    "$EXEC" --phase forward --weights "$D/w.lrm" -P 4 --no-compress -o "$D/f.lrm" "$D/in.lrm"
    run python3 "$REF" check-fwd "$D/f.lrm" "$D/w.lrm" --tol 2e-2
    assert_success
    "$EXEC" --phase backward --weights "$D/w.lrm" --no-compress -o "$D/b.lrm" "$D/f.lrm"
    run python3 "$REF" check-bwd "$D/b.lrm" "$D/w.lrm" --tol 2e-2
    assert_success
    # the weights of layer 1 differ from layer 0: swapping them must fail the check
    pyedit "f=read_stream('$D/w.lrm', True); write_stream('$D/wswap.lrm', [(f[1][0], {'layer': 0}, f[1][2]), (f[0][0], {'layer': 1}, f[0][2])])"
    run python3 "$REF" check-fwd "$D/f.lrm" "$D/wswap.lrm" --tol 2e-2
    assert_failure
}

@test "exec: a plan with replicas and split experts moves work but not the math" {
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 45 --E 8 --K 2 --D 16 --F 12 --skew 3
    python3 "$REF" plan "$D/in.lrm" "$D/pl.lrm" --P 4 --replicas --seed 4
    "$EXEC" --phase forward --weights "$D/w.lrm" -P 4 --no-compress -o "$D/f0.lrm" "$D/in.lrm"
    "$EXEC" --phase forward --weights "$D/w.lrm" --no-compress -o "$D/f1.lrm" "$D/pl.lrm"
    # pair_rank follows the assignment rule and per-rank counts equal fwd_alloc
    run python3 "$REF" check-fwd "$D/f1.lrm" "$D/w.lrm" --P 4 --tol 1e-5
    assert_success
    run pyedit "a=read_stream('$D/f0.lrm')[0][0]['pair_rank']; b=read_stream('$D/f1.lrm')[0][0]['pair_rank']; assert (a!=b).any()"
    assert_success
    run python3 "$REF" compare "$D/f1.lrm" "$D/f0.lrm" output pair_out phi_sqnorm --tol 1e-6
    assert_success
    "$EXEC" --phase backward --weights "$D/w.lrm" --no-compress -o "$D/b0.lrm" "$D/f0.lrm"
    "$EXEC" --phase backward --weights "$D/w.lrm" --no-compress -o "$D/b1.lrm" \
        --timings "$D/t.tsv" "$D/f1.lrm"
    run python3 "$REF" compare "$D/b1.lrm" "$D/b0.lrm" $GRADS --tol 1e-6
    assert_success
    # ranks computed concurrently (-j) give bit-identical results
    "$EXEC" --phase forward -j 3 -@ 3 --weights "$D/w.lrm" --no-compress "$D/pl.lrm" |
        "$EXEC" --phase backward -j 3 -@ 3 --weights "$D/w.lrm" --no-compress -o "$D/bj.lrm"
    run python3 "$REF" compare "$D/bj.lrm" "$D/b1.lrm" output pair_out $GRADS --tol 0
    assert_success
    run python3 "$REF" check-bwd "$D/b1.lrm" "$D/w.lrm" --tol 1e-5
    assert_success
    # helpers did weight-gradient reduction: gradred time recorded on some helper
    run awk -F'\t' 'NR>1 && $11>0 {n++} END {print n+0}' "$D/t.tsv"
    assert [ "$output" -gt 0 ]
}

@test "exec: every lrmoe-plan planner gives the same outputs and gradients" {
    [ -x "$BIN/lrmoe-plan" ] || skip "bin/lrmoe-plan not built"
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 64 --E 8 --K 2 --D 16 --F 12 --skew 4
    "$EXEC" --phase forward --weights "$D/w.lrm" -P 4 --no-compress "$D/in.lrm" |
        "$EXEC" --phase backward --weights "$D/w.lrm" --no-compress -o "$D/ref.lrm"
    for pl in fixed llep eplb lrmoe; do
        run sh -c "'$BIN/lrmoe-plan' --planner $pl --ranks 4 --rates 1.0 --min-chunk 4 --weights '$D/w.lrm' --no-compress '$D/in.lrm' > '$D/p.lrm'"
        assert_success
        "$EXEC" --phase forward --weights "$D/w.lrm" --no-compress "$D/p.lrm" |
            "$EXEC" --phase backward --weights "$D/w.lrm" --no-compress -o "$D/$pl.lrm"
        run python3 "$REF" compare "$D/$pl.lrm" "$D/ref.lrm" output $GRADS --tol 1e-6
        assert_success
    done
}

@test "exec: masked with all ones equals full exactly; masked equals the reference on retained pairs" {
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 40 --E 8 --K 2 --D 16 --F 12 --skew 2
    "$EXEC" --phase forward --weights "$D/w.lrm" -P 4 --no-compress -o "$D/f.lrm" "$D/in.lrm"
    python3 "$REF" keep "$D/f.lrm" "$D/k1.lrm" --ones
    python3 "$REF" keep "$D/f.lrm" "$D/k.lrm" --rate 0.6
    "$EXEC" --phase backward --weights "$D/w.lrm" --no-compress -o "$D/full.lrm" "$D/f.lrm"
    "$EXEC" --phase backward --mode masked --weights "$D/w.lrm" --no-compress -o "$D/m1.lrm" "$D/k1.lrm"
    run python3 "$REF" compare "$D/m1.lrm" "$D/full.lrm" $GRADS --tol 0
    assert_success
    "$EXEC" --phase backward --mode masked --weights "$D/w.lrm" --no-compress -o "$D/m.lrm" "$D/k.lrm"
    run python3 "$REF" check-bwd "$D/m.lrm" "$D/w.lrm" --mode masked --tol 1e-5
    assert_success
    # and differs from full (the mask matters)
    run python3 "$REF" compare "$D/m.lrm" "$D/full.lrm" grad_w_down --tol 1e-3
    assert_failure
    # masked without keep is an error
    run "$EXEC" --phase backward --mode masked --weights "$D/w.lrm" --no-compress -o "$D/x.lrm" "$D/f.lrm"
    assert_fails_clean
    assert_output --partial "keep"
}

@test "exec: compact (packed here, rows on forward or other ranks) equals masked and the reference" {
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 45 --E 8 --K 2 --D 16 --F 12 --skew 3
    python3 "$REF" plan "$D/in.lrm" "$D/pl.lrm" --P 4 --replicas --seed 2
    "$EXEC" --phase forward --weights "$D/w.lrm" --no-compress -o "$D/f.lrm" "$D/pl.lrm"
    python3 "$REF" keep "$D/f.lrm" "$D/k.lrm" --rate 0.55
    "$EXEC" --phase backward --mode masked --weights "$D/w.lrm" --no-compress -o "$D/m.lrm" "$D/k.lrm"
    python3 "$REF" pack "$D/k.lrm" "$D/p.lrm" --P 4
    python3 "$REF" pack "$D/k.lrm" "$D/ps.lrm" --P 4 --scatter 9
    for p in p ps; do
        "$EXEC" --phase backward --mode compact --weights "$D/w.lrm" --no-compress \
            --timings "$D/$p.tsv" -o "$D/c$p.lrm" "$D/$p.lrm"
        run python3 "$REF" check-bwd "$D/c$p.lrm" "$D/w.lrm" --mode compact --tol 1e-5
        assert_success
        run python3 "$REF" compare "$D/c$p.lrm" "$D/m.lrm" $GRADS --tol 1e-6
        assert_success
    done
    # compact of an all-dropped frame: zero dx/dW, router gradient intact
    python3 "$REF" keep "$D/f.lrm" "$D/k0.lrm" --rate 0
    python3 "$REF" pack "$D/k0.lrm" "$D/p0.lrm" --P 4
    "$EXEC" --phase backward --mode compact --weights "$D/w.lrm" --no-compress -o "$D/c0.lrm" "$D/p0.lrm"
    run python3 "$REF" check-bwd "$D/c0.lrm" "$D/w.lrm" --mode compact --tol 1e-5
    assert_success
}

@test "exec: compact rejects inconsistent packs" {
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 30 --E 8 --K 2 --D 8 --F 6
    "$EXEC" --phase forward --weights "$D/w.lrm" -P 2 --no-compress "$D/in.lrm" |
        python3 "$REF" keep - "$D/k.lrm" --rate 0.7
    python3 "$REF" pack "$D/k.lrm" "$D/p.lrm" --P 2
    # counts that do not sum to the rows
    pyedit "f=read_stream('$D/p.lrm', True); t,a,d=f[0]; t=dict(t); c=t['pack_counts'].copy(); c[0,0]+=1; t['pack_counts']=c; write_stream('$D/bad1.lrm', [(t,a,d)])"
    run sh -c "'$EXEC' --phase backward --mode compact --weights '$D/w.lrm' --no-compress '$D/bad1.lrm' > '$D/o1.lrm'"
    assert_fails_clean
    no_trailer "$D/o1.lrm"
    # a pair packed twice
    pyedit "f=read_stream('$D/p.lrm', True); t,a,d=f[0]; t=dict(t); p=t['pack_pair'].copy(); p[1]=p[0]; t['pack_pair']=p; write_stream('$D/bad2.lrm', [(t,a,d)])"
    run sh -c "'$EXEC' --phase backward --mode compact --weights '$D/w.lrm' --no-compress '$D/bad2.lrm' > '$D/o2.lrm'"
    assert_fails_clean
    assert_output --partial "pack_pair"
    # missing packed tensors
    run sh -c "'$EXEC' --phase backward --mode compact --weights '$D/w.lrm' --no-compress '$D/k.lrm' > '$D/o3.lrm'"
    assert_fails_clean
    assert_output --partial "pack_pair"
}

@test "exec: timings as attributes and TSV with one critical rank per frame" {
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 40 --E 8 --K 2 --D 16 --F 12 --layers 2
    "$EXEC" --phase forward --weights "$D/w.lrm" -P 4 --timings "$D/t.tsv" --no-compress \
        -o "$D/f.lrm" "$D/in.lrm"
    run head -1 "$D/t.tsv"
    assert_output "$(printf 'frame\tlayer\tphase\tmode\trank\tweights_s\tdispatch_s\tgemm_s\tact_s\tcombine_s\tgradred_s\ttotal_s\tcritical\twall_s')"
    run awk -F'\t' 'NR>1 {n++; c+=$13} END {print n, c}' "$D/t.tsv"
    assert_output "8 2"
    # the critical rank has the largest total
    run awk -F'\t' 'NR>1 {if ($12>m[$1]) m[$1]=$12; if ($13==1) c[$1]=$12} END {for (f in m) if (m[f]!=c[f]) print "bad", f}' "$D/t.tsv"
    assert_output ""
    run pyedit "a=read_stream('$D/f.lrm')[1][1]; print(a['exec.ranks'], len(a['exec.forward.gemm_s'].split(',')), a['exec.forward.critical_rank'] in '0123', float(a['exec.forward.critical_s'])>0)"
    assert_output "4 4 True True"
    # the CPU-time clock needs one BLAS thread per rank
    run "$EXEC" --phase forward --clock cpu -@ 2 --weights "$D/w.lrm" "$D/in.lrm"
    assert_equal "$status" 2
    run "$EXEC" --phase forward --clock sundial --weights "$D/w.lrm" "$D/in.lrm"
    assert_equal "$status" 2
    "$EXEC" --phase forward --clock cpu -j 2 -@ 2 -P 4 --timings "$D/c.tsv" --weights "$D/w.lrm" \
        --no-compress -o "$D/fc.lrm" "$D/in.lrm"
    run awk -F'\t' 'NR>1 && $8>0 {n++} END {print n+0}' "$D/c.tsv"
    assert_output "8"
    run python3 "$REF" compare "$D/fc.lrm" "$D/f.lrm" output --tol 0
    assert_success
}

@test "exec: bad input fails with exit 1 and no trailer" {
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 20 --E 8 --K 2 --D 8 --F 6
    # weights for another layer only
    pyedit "f=read_stream('$D/w.lrm', True); write_stream('$D/w5.lrm', [(f[0][0], {'layer': 5}, f[0][2])])"
    run sh -c "'$EXEC' --phase forward --weights '$D/w5.lrm' --no-compress '$D/in.lrm' > '$D/o.lrm'"
    assert_fails_clean
    assert_output --partial "no frame for layer 0"
    no_trailer "$D/o.lrm"
    # weights of a different D
    python3 "$REF" make "$D/in2.lrm" "$D/wD.lrm" --T 20 --E 8 --K 2 --D 10 --F 6
    run sh -c "'$EXEC' --phase forward --weights '$D/wD.lrm' --no-compress '$D/in.lrm' > '$D/o.lrm'"
    assert_fails_clean
    assert_output --partial "hidden"
    no_trailer "$D/o.lrm"
    # weights of a different E
    python3 "$REF" make "$D/in3.lrm" "$D/wE.lrm" --T 20 --E 16 --K 2 --D 8 --F 6
    run sh -c "'$EXEC' --phase forward --weights '$D/wE.lrm' --no-compress '$D/in.lrm' > '$D/o.lrm'"
    assert_fails_clean
    assert_output --partial "E=16"
    # a plan whose fwd_alloc does not sum to the expert loads
    python3 "$REF" plan "$D/in.lrm" "$D/pl.lrm" --P 2
    pyedit "f=read_stream('$D/pl.lrm', True); t,a,d=f[0]; t=dict(t); x=t['fwd_alloc'].copy(); x[0,0]+=1; t['fwd_alloc']=x; write_stream('$D/plbad.lrm', [(t,a,d)])"
    run sh -c "'$EXEC' --phase forward --weights '$D/w.lrm' --no-compress '$D/plbad.lrm' > '$D/o.lrm'"
    assert_fails_clean
    assert_output --partial "fwd_alloc"
    no_trailer "$D/o.lrm"
    # a fwd_alloc whose sum passes 2^63-1 (it overflowed: UBSan)
    pyedit "f=read_stream('$D/pl.lrm', True); t,a,d=f[0]; t=dict(t); x=t['fwd_alloc'].copy(); p=t['placement'].copy(); p[0,:]=1; x[0,0]=2**63-1; x[0,1]=2; t['fwd_alloc']=x; t['placement']=p; write_stream('$D/plhuge.lrm', [(t,a,d)])"
    run sh -c "'$EXEC' --phase forward --weights '$D/w.lrm' --no-compress '$D/plhuge.lrm' > '$D/o.lrm'"
    assert_fails_clean
    assert_output --partial "plan: fwd_alloc: sums past 2^63-1"
    no_trailer "$D/o.lrm"
    # --ranks that disagrees with the plan
    run sh -c "'$EXEC' --phase forward --weights '$D/w.lrm' -P 4 --no-compress '$D/pl.lrm' > '$D/o.lrm'"
    assert_fails_clean
    # NaN in hidden: error, accepted with --allow-nonfinite
    pyedit "f=read_stream('$D/in.lrm', True); t,a,d=f[0]; t=dict(t); h=t['hidden'].copy(); h[3,2]=np.nan; t['hidden']=h; write_stream('$D/nan.lrm', [(t,a,d)])"
    run sh -c "'$EXEC' --phase forward --weights '$D/w.lrm' --no-compress '$D/nan.lrm' > '$D/o.lrm'"
    assert_fails_clean
    assert_output --partial "non-finite"
    no_trailer "$D/o.lrm"
    run sh -c "'$EXEC' --phase forward --allow-nonfinite --weights '$D/w.lrm' --no-compress '$D/nan.lrm' > '$D/o.lrm'"
    assert_success
    # backward without the forward's saved state
    run sh -c "'$EXEC' --phase backward --weights '$D/w.lrm' --no-compress '$D/in.lrm' > '$D/o.lrm'"
    assert_fails_clean
    no_trailer "$D/o.lrm"
    # a truncated input
    head -c 300 "$D/in.lrm" > "$D/trunc.lrm"
    run sh -c "'$EXEC' --phase forward --weights '$D/w.lrm' --no-compress '$D/trunc.lrm' > '$D/o.lrm'"
    assert_fails_clean
    # a missing weights file: named once
    run "$EXEC" --phase forward --weights "$D/nope.lrm" "$D/in.lrm"
    assert_fails_clean
    assert_output "lrmoe-exec: frame 0: $D/nope.lrm: No such file or directory"
    # a damaged one read whole (a pipe): the reader's message, the frame named
    "$BIN/lrmoe-cat" --no-compress -o "$D/wc.lrm" "$D/w.lrm"   # with CRC-64 records
    python3 -c "
p = '$D/wc.lrm'; b = bytearray(open(p, 'rb').read()); b[len(b) - 100] ^= 4
open('$D/wbad.lrm', 'wb').write(b)"
    run sh -c "'$EXEC' --phase forward --weights - --no-compress '$D/in.lrm' < '$D/wbad.lrm' > '$D/o.lrm'"
    assert_fails_clean
    assert_output --regexp "^lrmoe-exec: frame 0: <stdin>: frame 0: digest mismatch: the frame's CRC-64 is"
}

@test "exec: full pipeline gen | route | exec | score | pack | exec compact equals masked" {
    for t in gen route score pack; do
        [ -x "$BIN/lrmoe-$t" ] || skip "bin/lrmoe-$t not built"
    done
    "$BIN/lrmoe-gen" --tokens 64 --experts 8 --topk 2 --hidden 32 --ffn 16 --dtype f32 \
        --skew hot:50:2 --weights "$D/w.lrm" --seed 3 --no-compress |
        "$BIN/lrmoe-route" -k 2 --no-compress |
        "$EXEC" --phase forward --weights "$D/w.lrm" -P 4 --no-compress |
        "$BIN/lrmoe-score" --select topk --drop 30 --no-compress -o "$D/s.lrm"
    "$BIN/lrmoe-pack" -P 4 --no-compress "$D/s.lrm" |
        "$EXEC" --phase backward --mode compact --weights "$D/w.lrm" --no-compress -o "$D/c.lrm"
    "$EXEC" --phase backward --mode masked --weights "$D/w.lrm" --no-compress -o "$D/m.lrm" "$D/s.lrm"
    run python3 "$REF" compare "$D/c.lrm" "$D/m.lrm" $GRADS --tol 1e-6
    assert_success
    run python3 "$REF" check-bwd "$D/c.lrm" "$D/w.lrm" --mode compact --tol 1e-5
    assert_success
    # with an lrmoe plan below rate 1: quota from the plan, rows per bwd_alloc
    [ -x "$BIN/lrmoe-plan" ] || skip "bin/lrmoe-plan not built"
    "$BIN/lrmoe-gen" --tokens 256 --experts 8 --topk 2 --hidden 32 --ffn 16 --dtype bf16 \
        --skew hot:50:2 --weights "$D/w2.lrm" --seed 4 --no-compress |
        "$BIN/lrmoe-route" -k 2 --no-compress |
        "$BIN/lrmoe-plan" --planner lrmoe -P 4 --rates 0.8,0.7 --no-compress |
        "$EXEC" --phase forward --weights "$D/w2.lrm" --no-compress |
        "$BIN/lrmoe-score" --select topk --no-compress -o "$D/s2.lrm"
    "$BIN/lrmoe-pack" --no-compress "$D/s2.lrm" |
        "$EXEC" --phase backward --mode compact --weights "$D/w2.lrm" --no-compress -o "$D/c2.lrm"
    "$EXEC" --phase backward --mode masked --weights "$D/w2.lrm" --no-compress -o "$D/m2.lrm" "$D/s2.lrm"
    run python3 "$REF" compare "$D/c2.lrm" "$D/m2.lrm" $GRADS --tol 1e-6
    assert_success
    run python3 "$REF" check-bwd "$D/c2.lrm" "$D/w2.lrm" --mode compact --tol 2e-2
    assert_success
}

@test "exec: the weights stream is read at the first frame: gen --weights w.lrm | ... | exec --weights w.lrm has no race" {
    for t in gen route; do
        [ -x "$BIN/lrmoe-$t" ] || skip "bin/lrmoe-$t not built"
    done
    # lrmoe-gen starts 1 s late, so lrmoe-exec is running before w.lrm exists:
    # reading the weights at startup would fail here
    (sleep 1; "$BIN/lrmoe-gen" --tokens 48 --experts 8 --topk 2 --hidden 32 --ffn 16 \
        --dtype bf16 --weights "$D/w.lrm" --seed 5 --no-compress) |
        "$BIN/lrmoe-route" -k 2 --no-compress |
        "$EXEC" --phase forward --weights "$D/w.lrm" -P 2 --no-compress -o "$D/f.lrm"
    [ -s "$D/w.lrm" ]
    run python3 "$REF" check-fwd "$D/f.lrm" "$D/w.lrm" --tol 2e-2
    assert_success
    # the same frame from files gives the same result
    "$BIN/lrmoe-gen" --tokens 48 --experts 8 --topk 2 --hidden 32 --ffn 16 --dtype bf16 \
        --seed 5 --no-compress | "$BIN/lrmoe-route" -k 2 --no-compress -o "$D/r.lrm"
    "$EXEC" --phase forward --weights "$D/w.lrm" -P 2 --no-compress -o "$D/f2.lrm" "$D/r.lrm"
    run python3 "$REF" compare "$D/f.lrm" "$D/f2.lrm" output phi_sqnorm --tol 0
    assert_success
    # a missing weights file fails at frame 0, exit 1
    run "$EXEC" --phase forward --weights "$D/nope.lrm" --no-compress -o "$D/x.lrm" "$D/r.lrm"
    assert_fails_clean
    assert_line --partial "nope.lrm"
}

@test "exec: non-finite saved state or packed rows in backward is an error in every mode (--allow-nonfinite accepts it)" {
    for t in gen route score pack; do
        [ -x "$BIN/lrmoe-$t" ] || skip "bin/lrmoe-$t not built"
    done
    "$BIN/lrmoe-gen" --tokens 32 --experts 4 --topk 2 --hidden 16 --ffn 8 --dtype f32 \
        --weights "$D/w.lrm" --seed 5 --no-compress |
        "$BIN/lrmoe-route" -k 2 --no-compress |
        "$EXEC" --phase forward --weights "$D/w.lrm" -P 2 --no-compress |
        "$BIN/lrmoe-score" --select topk --drop 25 --no-compress -o "$D/s.lrm"
    "$BIN/lrmoe-pack" -P 2 --no-compress -o "$D/p.lrm" "$D/s.lrm"
    # mode:tensor pairs: each tensor the mode reads, poisoned with +Inf
    for mt in full:saved_gate full:saved_up full:pair_out masked:saved_up \
              compact:pack_gate compact:pack_up compact:pack_hidden compact:pair_out; do
        m=${mt%%:*} n=${mt#*:}
        src="$D/s.lrm"; [ "$m" = compact ] && src="$D/p.lrm"
        pyedit "f=read_stream('$src', True); t,a,d=f[0]; t=dict(t); x=t['$n'].copy(); x.reshape(-1)[1]=np.inf; t['$n']=x; write_stream('$D/inf.lrm', [(t,a,d)])"
        run sh -c "'$EXEC' --phase backward --mode $m --weights '$D/w.lrm' --no-compress '$D/inf.lrm' > '$D/o.lrm'"
        assert_fails_clean
        assert_output --partial "$n: non-finite"
        no_trailer "$D/o.lrm"
        run sh -c "'$EXEC' --phase backward --mode $m --allow-nonfinite --weights '$D/w.lrm' --no-compress '$D/inf.lrm' > '$D/o.lrm'"
        assert_success
    done
}

@test "exec: --repeat/--warmup give the same tensors and record themselves; bad values exit 2" {
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 40 --E 8 --K 2 --D 16 --F 12
    "$EXEC" --phase forward --weights "$D/w.lrm" -P 2 --no-compress -o "$D/a.lrm" "$D/in.lrm"
    "$EXEC" --phase forward --weights "$D/w.lrm" -P 2 --repeat 5 --warmup 2 --no-compress \
        --timings "$D/t.tsv" -o "$D/b.lrm" "$D/in.lrm"
    run pyedit "
a=read_stream('$D/a.lrm', True)[0]; b=read_stream('$D/b.lrm', True)[0]
ta=dict(a[0]); tb=dict(b[0])
for n in ('output','pair_rank','phi_sqnorm','saved_gate','saved_up','pair_out'):
    assert np.array_equal(ta[n], tb[n]), n
m=b[1]
assert m['exec.forward.repeat']=='5' and m['exec.forward.warmup']=='2', m
assert 'exec.forward.repeat' not in a[1]
print('ok')"
    assert_success
    assert_output "ok"
    [ "$(wc -l < "$D/t.tsv")" -eq 3 ]
    run "$EXEC" --phase forward --weights "$D/w.lrm" --repeat 0 "$D/in.lrm"
    assert_equal "$status" 2
    run "$EXEC" --phase forward --weights "$D/w.lrm" --warmup -1 "$D/in.lrm"
    assert_equal "$status" 2
}

@test "exec: weights of another model are named in the error, with their dimensions" {
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 16 --E 8 --K 2 --D 16 --F 12
    python3 "$REF" make "$D/in2.lrm" "$D/w2.lrm" --T 16 --E 8 --K 2 --D 32 --F 12
    run sh -c "'$EXEC' --phase forward --weights '$D/w2.lrm' --no-compress '$D/in.lrm' > '$D/o.lrm'"
    assert_fails_clean
    assert_output --partial "tensor hidden: shape [16,16], expected [16,32]"
    assert_output --partial "weights stream $D/w2.lrm (layer 0) have D=32 F=12 E=8"
}

# ---- --compute (lib/gemm_cpu.c): f32 is the exact reference (tolerance 1e-5
# of max|ref| on F32 storage, 2e-2 on BF16 storage as above); bf16 rounds every
# GEMM operand to BF16 and accumulates in F32: tolerance 2e-2 of max|ref| on
# either storage (measured 2e-3..8e-3 here).

# oneDNN in this build (the Makefile's test) and a native BF16 matmul on this CPU
have_bf16() {
    "$EXEC" --phase forward --compute bf16 --weights /nonexistent </dev/null >/dev/null 2>&1
    [ $? -ne 2 ]
}

@test "exec --compute: usage errors exit 2; bf16 without oneDNN says so" {
    run "$EXEC" --phase forward --compute fp8 --weights x
    assert_equal "$status" 2
    assert_line --partial "lrmoe-exec: --compute: unknown compute 'fp8'"
    run "$EXEC" --phase forward --compute bf16 --backend cuda --weights x
    assert_equal "$status" 2
    assert_line --partial "--compute: only with --backend cpu"
    run "$EXEC" --help
    assert_output --partial "--compute C"
    if ! have_bf16; then
        run "$EXEC" --phase forward --compute bf16 --weights x
        assert_equal "$status" 2
        assert_line --partial "this build has no oneDNN"
    fi
}

@test "exec --compute: the GEMM module against float64 for every transpose, dtype, stride and odd K (tests/unit/gemm_test.c)" {
    DN=""
    if echo 'int main(void){return dnnl_version() == 0;}' |
        cc -include oneapi/dnnl/dnnl.h -x c - -o /dev/null -ldnnl >/dev/null 2>&1; then
        DN=1   # the Makefile builds lib/gemm_cpu.c with oneDNN
    fi
    cp "$(unit_test gemm)" "$D/gt"
    run "$D/gt" f32
    assert_success
    assert_output --partial "gemm f32: 448 cases, 0 failed"
    # lib/gemm_avx2.c itself with an F32 and a BF16 B, in its AVX2 form and,
    # with AVX-512F, its AVX-512 form, which must give the AVX2 form's bits
    if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
        if grep -qw avx512f /proc/cpuinfo; then
            assert_output --partial "avx2 kernel (AVX2 and AVX-512 forms), F32 and BF16 B: 448 cases, 0 failed"
        else
            assert_output --partial "avx2 kernel (AVX2 form; no AVX-512F here), F32 and BF16 B: 224 cases, 0 failed"
        fi
    else
        assert_output --partial "avx2 kernel: skipped"
    fi
    [ -n "$DN" ] || skip "oneDNN (libdnnl-dev) not installed: the bf16 GEMM path is not built"
    # this CPU's default kernel, then every bf16 kernel it can run, each
    # forced (tests/helpers/bf16_kernels.bash): AMX, oneDNN's BF16 matmul,
    # the emulation (operands it rounds itself) in lib/gemm_avx2.c's AVX-512
    # and AVX2 forms, and on OpenBLAS sgemm
    run "$D/gt" bf16
    assert_success
    assert_output --partial "gemm bf16: 448 cases, 0 failed"
    local k e
    while read -r k e <&7; do
        # shellcheck disable=SC2086
        run env $e "$D/gt" bf16
        assert_success
        assert_line "kernel: $k"
        assert_output --partial "gemm bf16: 448 cases, 0 failed"
    done 7< <(bf16_kernels)
}

@test "exec --compute: f32 and bf16 match the float64 reference on F32 and BF16 storage, P=1,3, replicas, compact" {
    have_bf16 || skip "this build has no oneDNN: --compute bf16 unavailable"
    for dt in f32 bf16; do
        python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 37 --E 8 --K 2 --D 16 --F 12 \
            --skew 3 --zero-experts 1 --dtype "$dt"
        tf=1e-5; [ "$dt" = bf16 ] && tf=2e-2
        for c in f32 bf16; do
            tol=$tf; [ "$c" = bf16 ] && tol=2e-2
            for P in 1 3; do
                run "$EXEC" --phase forward --compute "$c" --weights "$D/w.lrm" -P "$P" \
                    --no-compress -o "$D/f.lrm" "$D/in.lrm"
                assert_success
                run python3 "$REF" check-fwd "$D/f.lrm" "$D/w.lrm" --P "$P" --tol "$tol"
                assert_success
                run "$EXEC" --phase backward --compute "$c" --weights "$D/w.lrm" --no-compress \
                    -o "$D/b$c.lrm" "$D/f.lrm"
                assert_success
                run python3 "$REF" check-bwd "$D/b$c.lrm" "$D/w.lrm" --tol "$tol"
                assert_success
                run pyedit "a=read_stream('$D/b$c.lrm')[0][1]; assert a['exec.compute'] == '$c', a"
                assert_success
            done
        done
        # bf16 really rounds (it is not the f32 path under another name) ...
        run python3 "$REF" compare "$D/bbf16.lrm" "$D/bf32.lrm" grad_w_down --tol 1e-6
        assert_failure
        # ... but stays within BF16 rounding of it
        run python3 "$REF" compare "$D/bbf16.lrm" "$D/bf32.lrm" output $GRADS --tol 2e-2
        assert_success
    done
    # replicas and helpers (weights by p2p, kept in their stored dtype), compact
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 45 --E 8 --K 2 --D 16 --F 12 --skew 3 --dtype bf16
    python3 "$REF" plan "$D/in.lrm" "$D/pl.lrm" --P 4 --replicas --seed 2
    "$EXEC" --phase forward --compute bf16 --weights "$D/w.lrm" --no-compress -o "$D/f.lrm" "$D/pl.lrm"
    run python3 "$REF" check-fwd "$D/f.lrm" "$D/w.lrm" --P 4 --tol 2e-2
    assert_success
    python3 "$REF" keep "$D/f.lrm" "$D/k.lrm" --rate 0.55
    python3 "$REF" pack "$D/k.lrm" "$D/p.lrm" --P 4 --scatter 9
    "$EXEC" --phase backward --compute bf16 --mode compact --weights "$D/w.lrm" --no-compress \
        -o "$D/c.lrm" "$D/p.lrm"
    run python3 "$REF" check-bwd "$D/c.lrm" "$D/w.lrm" --mode compact --tol 2e-2
    assert_success
    # ranks computed concurrently give bit-identical bf16 results
    "$EXEC" --phase backward --compute bf16 --mode compact -j 2 -@ 2 --weights "$D/w.lrm" \
        --no-compress -o "$D/cj.lrm" "$D/p.lrm"
    run python3 "$REF" compare "$D/cj.lrm" "$D/c.lrm" $GRADS --tol 0
    assert_success
}

# the tensors of two streams have the same bytes
same_bits() {
    pyedit "
a, b = read_stream('$1'), read_stream('$2')
assert len(a) == len(b)
for (ta, _), (tb, _) in zip(a, b):
    assert ta.keys() == tb.keys()
    for n in ta: assert ta[n].tobytes() == tb[n].tobytes(), n
print('same bits')"
}

@test "exec --compute bf16 on every kernel this CPU runs (AMX, oneDNN, the emulation's AVX-512, AVX2 and sgemm forms): matches float64, rounds its operands, names itself in exec.bf16; the emulation's two forms give the same bits" {
    have_bf16 || skip "this build has no oneDNN: --compute bf16 unavailable"
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 37 --E 8 --K 2 --D 16 --F 12 --skew 3 --dtype bf16
    "$EXEC" --phase forward --compute f32 --weights "$D/w.lrm" --no-compress -o "$D/ff32.lrm" "$D/in.lrm"
    "$EXEC" --phase backward --compute f32 --weights "$D/w.lrm" --no-compress -o "$D/bf32.lrm" "$D/ff32.lrm"
    # this CPU's default kernel is one of those it can run
    "$EXEC" --phase forward --compute bf16 --weights "$D/w.lrm" --no-compress -o "$D/fd.lrm" "$D/in.lrm"
    run pyedit "print(read_stream('$D/fd.lrm')[0][1]['exec.bf16'])"
    assert_success
    bf16_kernels | cut -d' ' -f1 | grep -qx "$output" || fail "default kernel '$output' is not one this CPU runs: $(bf16_kernels | cut -d' ' -f1)"
    local k e P ks=""
    while read -r k e <&7; do
        for P in 1 3; do
            # shellcheck disable=SC2086
            run env $e "$EXEC" --phase forward --compute bf16 --weights "$D/w.lrm" -P $P \
                --no-compress -o "$D/f-$k.lrm" "$D/in.lrm"
            assert_success
            run python3 "$REF" check-fwd "$D/f-$k.lrm" "$D/w.lrm" --P $P --tol 2e-2
            assert_success
            # shellcheck disable=SC2086
            run env $e "$EXEC" --phase backward --compute bf16 --weights "$D/w.lrm" \
                --no-compress -o "$D/b-$k.lrm" "$D/f-$k.lrm"
            assert_success
            run python3 "$REF" check-bwd "$D/b-$k.lrm" "$D/w.lrm" --tol 2e-2
            assert_success
        done
        # the kernel that ran, by name; oneDNN's version and implementation
        # with the kernels that call it
        run pyedit "a=read_stream('$D/b-$k.lrm')[0][1]; print(a['exec.bf16'], a.get('exec.bf16_dnnl', '-'))"
        assert_success
        case $k in
        amx | native) assert_output --regexp "^$k [0-9]+\.[0-9]+\.[0-9]+ [a-z]" ;;
        *) assert_output "$k -" ;;
        esac
        # the activations are rounded to BF16 (not the f32 path under another name)
        run python3 "$REF" compare "$D/b-$k.lrm" "$D/bf32.lrm" grad_w_down --tol 1e-6
        assert_failure
        ks="$ks $k"
    done 7< <(bf16_kernels)
    # every two kernels agree far inside BF16 rounding (the same operands and
    # exact products, F32 sums in other orders)
    local a b
    for a in $ks; do
        for b in $ks; do
            [ "$a" \< "$b" ] || continue
            run python3 "$REF" compare "$D/b-$a.lrm" "$D/b-$b.lrm" output $GRADS --tol 1e-5
            assert_success
        done
    done
    # lib/gemm_avx2.c's AVX-512F and AVX2 forms: one kernel, the same bits
    # (a CPU without AVX-512F runs an emulated-avx512 job with the AVX2 form)
    [[ " $ks " == *" emulated-avx512 "* ]] || skip "no AVX-512F here: the emulation's AVX2 form only"
    run same_bits "$D/f-emulated-avx512.lrm" "$D/f-emulated-avx2.lrm"
    assert_success
    run same_bits "$D/b-emulated-avx512.lrm" "$D/b-emulated-avx2.lrm"
    assert_success
}

@test "exec --compute f32 on BF16 weights: a one-frame process makes no F32 copy of the weights (peak RSS), and its bits equal a stream's, which makes one from its second frame" {
    [ -x /usr/bin/time ] || skip "/usr/bin/time (package time) is not installed: no peak RSS"
    # 64 experts of 3 x 256 x 512: 50 MB in BF16, an F32 copy of every expert 100 MB
    "$BIN/lrmoe-gen" --tokens 64 --experts 64 --topk 2 --hidden 512 --ffn 256 --dtype bf16 \
        --weights "$D/w.lrm" --seed 3 --no-compress | "$BIN/lrmoe-route" --topk 2 --no-compress > "$D/r.lrm"
    "$BIN/lrmoe-cat" --no-compress "$D/r.lrm" "$D/r.lrm" "$D/r.lrm" > "$D/r3.lrm"
    /usr/bin/time -f %M -o "$D/rss" "$EXEC" --phase forward --compute f32 --weights "$D/w.lrm" \
        --no-compress -o "$D/f1.lrm" "$D/r.lrm"
    rss=$(cat "$D/rss")
    # below the mapped BF16 weights plus half the copy (measured: 63 MB without, 142 MB with)
    [ "$rss" -lt 100000 ] || fail "one-frame f32 forward peaked at $rss KB: an F32 copy of the weights?"
    "$EXEC" --phase forward --compute f32 --weights "$D/w.lrm" --no-compress -o "$D/f3.lrm" "$D/r3.lrm"
    "$EXEC" --phase backward --compute f32 --weights "$D/w.lrm" --no-compress -o "$D/b1.lrm" "$D/f1.lrm"
    "$EXEC" --phase backward --compute f32 --weights "$D/w.lrm" --no-compress -o "$D/b3.lrm" "$D/f3.lrm"
    run pyedit "
for ph in 'fb':
    one = read_stream('$D/%s1.lrm' % ph)[0][0]
    for i, (t, _) in enumerate(read_stream('$D/%s3.lrm' % ph)):
        for n in one: assert one[n].tobytes() == t[n].tobytes(), (ph, i, n)
print('same')"
    assert_output same
}

@test "exec --compute auto: bf16 for BF16 weights where BF16 is native, f32 for F32 weights" {
    for dt in f32 bf16; do
        python3 "$REF" make "$D/in$dt.lrm" "$D/w$dt.lrm" --T 20 --E 4 --K 2 --D 8 --F 6 --dtype "$dt"
        "$EXEC" --phase forward --weights "$D/w$dt.lrm" --no-compress -o "$D/f$dt.lrm" "$D/in$dt.lrm"
    done
    run pyedit "print(read_stream('$D/ff32.lrm')[0][1]['exec.compute'])"
    assert_output "f32"
    run pyedit "print(read_stream('$D/fbf16.lrm')[0][1]['exec.compute'])"
    if have_bf16 && grep -q -E 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
        assert_output "bf16"
    else
        assert_output "f32"
    fi
}

@test "exec: a raw weights file is mapped, zstd or piped weights are read, with the same bits; a truncated raw file keeps the reader's error" {
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 24 --E 8 --K 2 --D 16 --F 12 --dtype bf16
    "$BIN/lrmoe-cat" --no-compress -o "$D/wr.lrm" "$D/w.lrm"
    "$BIN/lrmoe-cat" -o "$D/wz.lrm" "$D/w.lrm"
    for c in f32 bf16; do
        for src in wr wz pipe; do
            wf="$D/$src.lrm"; [ $src = pipe ] && wf=/dev/stdin
            run sh -c "cat '$D/wr.lrm' | '$EXEC' --phase forward --compute $c --weights $wf --no-compress -o '$D/f$src.lrm' '$D/in.lrm' &&
                       cat '$D/wr.lrm' | '$EXEC' --phase backward --compute $c --weights $wf --no-compress -o '$D/b$src.lrm' '$D/f$src.lrm'"
            assert_success
        done
        run pyedit "
for src, how in (('wr', 'mapped'), ('wz', 'read'), ('pipe', 'read')):
    t, a = read_stream('$D/b%s.lrm' % src)[0]
    assert a['exec.weights'] == how, (src, a['exec.weights'])
    r, _ = read_stream('$D/bwr.lrm')[0]
    for n in r: assert r[n].tobytes() == t[n].tobytes(), (src, n)
print('same')"
        assert_success
        assert_output same
    done
    head -c 3000 "$D/wr.lrm" > "$D/wt.lrm"
    run sh -c "'$EXEC' --phase forward --weights '$D/wt.lrm' --no-compress '$D/in.lrm' > '$D/o.lrm'"
    assert_fails_clean
    assert_output --partial "$D/wt.lrm: frame 0: truncated"
}

@test "exec: a mapped raw weights file with CRC-64 or XXH64 records is verified: a flipped bit is refused naming the frame" {
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 24 --E 8 --K 2 --D 16 --F 12 --dtype bf16
    "$BIN/lrmoe-cat" --no-compress -o "$D/wc.lrm" "$D/w.lrm"
    pyedit "write_stream('$D/wx.lrm', read_stream('$D/w.lrm', True), digests='xxh')"
    for k in wc wx; do
        run sh -c "'$EXEC' --phase forward --weights '$D/$k.lrm' --no-compress -o '$D/o.lrm' '$D/in.lrm'"
        assert_success
        run pyedit "print(read_stream('$D/o.lrm')[0][1]['exec.weights'])"
        assert_output mapped
        # a bit of the last tensor's data, 100 bytes before the trailer
        python3 -c "
import os; p = '$D/$k.lrm'; n = os.path.getsize(p); f = open(p, 'r+b'); f.seek(n - 100); b = f.read(1); f.seek(n - 100); f.write(bytes([b[0] ^ 4]))"
        run sh -c "'$EXEC' --phase forward --weights '$D/$k.lrm' --no-compress '$D/in.lrm' > '$D/o.lrm'"
        assert_fails_clean
        assert_output --partial "$D/$k.lrm: frame 0: digest mismatch"
    done
}

@test "exec: a mapped weights file is read a layer at a time: a frame's process reads and checks only its layer's weights, a flipped bit in another layer is not its error" {
    # four layers of 9.4 MB (E=8 D=512 F=384 BF16); the input: frames of
    # layers 0..3, and one frame of layer 3 alone
    "$BIN/lrmoe-gen" --experts 8 --topk 2 --hidden 512 --ffn 384 --layers 4 --tokens 64 \
        --seed 4 --weights "$D/w.lrm" --no-compress | "$BIN/lrmoe-route" -k 2 --no-compress > "$D/r.lrm"
    pyedit "f=read_stream('$D/r.lrm', True); assert [a['layer'] for _, a, _ in f] == ['0', '1', '2', '3']
write_stream('$D/r3.lrm', f[3:])"
    "$EXEC" --phase forward --weights "$D/w.lrm" --no-compress -o "$D/o.lrm" "$D/r.lrm"
    # which frames of the weights the layer-3 process read: none of layers
    # 0 and 1 (their header pages only: the mapping reads no data around a
    # header, and a used frame's read-around reaches at most 4 MiB before
    # it), all of layer 3; the old eager check read all four
    run python3 "$HELP/resident.py" evict "$D/w.lrm"
    [ "$output" = 0.000 ] || skip "this filesystem keeps the file's pages cached after POSIX_FADV_DONTNEED (resident fraction $output): cannot see which frames a process reads"
    "$EXEC" --phase forward --weights "$D/w.lrm" --no-compress -o "$D/o3.lrm" "$D/r3.lrm"
    run python3 "$HELP/resident.py" frames "$D/w.lrm"
    echo "$output"
    assert_line --regexp "^frame 0 0\.0[0-4][0-9]$"
    assert_line --regexp "^frame 1 0\.0[0-4][0-9]$"
    assert_line "frame 3 1.000"
    # the same outputs as the four-frame run's last frame
    run pyedit "a=read_stream('$D/o.lrm')[3]; b=read_stream('$D/o3.lrm')[0]
assert b[1]['exec.weights'] == 'mapped'
assert all(a[0][k].tobytes() == b[0][k].tobytes() for k in a[0]); print('same')"
    assert_output same
    # a bit flipped in layer 1's data: layer 3's frame runs (same bits),
    # the four-frame stream fails at its frame 1 naming weights frame 1
    local at
    at=$(python3 -c "
import sys; sys.path.insert(0, '$HELP'); import resident
a, e = resident.frames('$D/w.lrm')[1]; print((a + e) // 2)")
    python3 -c "
f = open('$D/w.lrm', 'r+b'); f.seek($at); b = f.read(1); f.seek($at); f.write(bytes([b[0] ^ 4]))"
    "$EXEC" --phase forward --weights "$D/w.lrm" --no-compress -o "$D/o3b.lrm" "$D/r3.lrm"
    run pyedit "a=read_stream('$D/o3.lrm')[0]; b=read_stream('$D/o3b.lrm')[0]
assert all(a[0][k].tobytes() == b[0][k].tobytes() for k in a[0]); print('same')"
    assert_output same
    run sh -c "'$EXEC' --phase forward --weights '$D/w.lrm' --no-compress '$D/r.lrm' > '$D/o.lrm'"
    assert_fails_clean
    assert_output --regexp "lrmoe-exec: frame 1: .*$D/w.lrm: frame 1: digest mismatch: the frame's CRC-64 is"
    no_trailer "$D/o.lrm"
}

@test "exec: a mapped weights file's CRC-64 records are checked on the -@ threads: every cut into pieces verifies, a flipped bit in any piece is refused naming the frame" {
    # the library: threads 1, 2, 3, 7 and pieces from 1 byte up, every
    # tensor of a three-frame file (CRC-64 records, then XXH64 ones) flipped
    # at its first, middle, last and five random bytes
    # (tests/unit/weights_map_test.c)
    run "$(unit_test weights_map)" "$D"
    assert_success
    assert_line --regexp "^weights_map: [0-9]+ cases, 0 failed$"
    # the tool, at the default piece (8 MiB): a 28 MiB frame is cut into
    # three pieces under -@ 3; the same output as one thread, and a bit
    # flipped in the second or the third piece is refused
    "$BIN/lrmoe-gen" --experts 24 --topk 2 --hidden 512 --ffn 384 --tokens 64 --seed 4 \
        --weights "$D/w.lrm" --no-compress | "$BIN/lrmoe-route" -k 2 --no-compress > "$D/r.lrm"
    local n
    n=$(stat -c %s "$D/w.lrm")
    [ "$n" -gt $((24 << 20)) ]
    "$EXEC" --phase forward -@ 1 --weights "$D/w.lrm" --no-compress -o "$D/o1.lrm" "$D/r.lrm"
    "$EXEC" --phase forward -@ 3 --weights "$D/w.lrm" --no-compress -o "$D/o3.lrm" "$D/r.lrm"
    run pyedit "a=read_stream('$D/o1.lrm')[0]; b=read_stream('$D/o3.lrm')[0]
assert a[1]['exec.weights'] == b[1]['exec.weights'] == 'mapped'
assert all(a[0][k].tobytes() == b[0][k].tobytes() for k in a[0]); print('same')"
    assert_output same
    for at in $((n / 2)) $((n - 100)); do
        python3 -c "
f = open('$D/w.lrm', 'r+b'); f.seek($at); b = f.read(1); f.seek($at); f.write(bytes([b[0] ^ 4]))"
        run sh -c "'$EXEC' --phase forward -@ 3 --weights '$D/w.lrm' --no-compress '$D/r.lrm' > '$D/o.lrm'"
        assert_fails_clean
        assert_output --partial "$D/w.lrm: frame 0: digest mismatch"
        python3 -c "
f = open('$D/w.lrm', 'r+b'); f.seek($at); b = f.read(1); f.seek($at); f.write(bytes([b[0] ^ 4]))"
    done
}

@test "exec: non-finite weights are an error in the experts a frame uses, once per expert; unused experts are not read" {
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 24 --E 8 --K 2 --D 16 --F 12 --dtype bf16
    # route every token to experts 0..5: experts 6 and 7 are unused
    pyedit "f=read_stream('$D/in.lrm', True); t,a,d=f[0]; t=dict(t); T=t['topk_ids'].shape[0]
t['topk_ids']=np.array([[i % 3, 3 + i % 3] for i in range(T)], dtype=np.int32); write_stream('$D/in6.lrm', [(t,a,d)])"
    for c in f32 bf16; do
        # NaN in unused expert 7's w_gate: accepted, outputs finite
        pyedit "f=read_stream('$D/w.lrm', True); t,a,d=f[0]; t=dict(t); x=t['w_gate'].copy(); x[7,1,2]=0x7fc0 if x.dtype == np.uint16 else np.nan; t['w_gate']=x; write_stream('$D/wn.lrm', [(t,a,d)])"
        run sh -c "'$EXEC' --phase forward --compute $c --weights '$D/wn.lrm' --no-compress -o '$D/o.lrm' '$D/in6.lrm'"
        assert_success
        run pyedit "t=read_stream('$D/o.lrm')[0][0]; assert np.isfinite(t['output']).all(); print('finite')"
        assert_output finite
        # Inf in used expert 2's w_up: an error naming the flat index, unless --allow-nonfinite
        pyedit "f=read_stream('$D/w.lrm', True); t,a,d=f[0]; t=dict(t); x=t['w_up'].copy(); x[2,3,4]=0x7f80 if x.dtype == np.uint16 else np.inf; t['w_up']=x; write_stream('$D/wi.lrm', [(t,a,d)])"
        run sh -c "'$EXEC' --phase forward --compute $c --weights '$D/wi.lrm' --no-compress '$D/in6.lrm' > '$D/o.lrm'"
        assert_fails_clean
        assert_output --partial "$D/wi.lrm: layer 0: w_up: non-finite value at flat index $((2 * 12 * 16 + 3 * 16 + 4)) (use --allow-nonfinite)"
        no_trailer "$D/o.lrm"
        # the backward's input: the forward of the finite weights
        "$EXEC" --phase forward --compute $c --weights "$D/w.lrm" --no-compress -o "$D/f6.lrm" "$D/in6.lrm"
        run sh -c "'$EXEC' --phase backward --compute $c --weights '$D/wi.lrm' --no-compress '$D/f6.lrm' > '$D/o.lrm'"
        assert_fails_clean
        assert_output --partial "$D/wi.lrm: layer 0: w_up: non-finite value at flat index $((2 * 12 * 16 + 3 * 16 + 4)) (use --allow-nonfinite)"
        run sh -c "'$EXEC' --phase forward --compute $c --allow-nonfinite --weights '$D/wi.lrm' --no-compress -o '$D/o.lrm' '$D/in6.lrm'"
        assert_success
    done
}

@test "exec: the weights' finiteness scan runs on the -@ threads and reports what the scan in order meets first (w_gate, w_up, w_down, each expert in turn), in-process and under mpirun" {
    # 24 experts of 1.2 MB (D=512 F=384 BF16): ranges of 8 MiB, three of
    # them under -@ 3; NaN in w_down of expert 2 (the first range) and in
    # w_up of expert 20 (the last): w_up's is the first error
    "$BIN/lrmoe-gen" --experts 24 --topk 4 --hidden 512 --ffn 384 --tokens 96 --seed 4 \
        --weights "$D/w.lrm" --no-compress | "$BIN/lrmoe-route" -k 4 --no-compress > "$D/r.lrm"
    run pyedit "t=read_stream('$D/r.lrm')[0][0]; print(len(set(t['topk_ids'].ravel().tolist())))"
    assert_output 24
    local F=384 Dm=512
    pyedit "f=read_stream('$D/w.lrm', True); t,a,d=f[0]; t=dict(t)
x=t['w_down'].copy(); x[2,5,7]=0x7fc0; t['w_down']=x
y=t['w_up'].copy(); y[20,3,4]=0x7f80; t['w_up']=y; write_stream('$D/wn.lrm', [(t,a,d)])"
    local want="$D/wn.lrm: layer 0: w_up: non-finite value at flat index $((20 * F * Dm + 3 * Dm + 4))"
    local MPIRUN="timeout 120 mpirun --mca btl tcp,self --oversubscribe"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    local t
    for t in 1 3; do
        run sh -c "'$EXEC' --phase forward -@ $t --weights '$D/wn.lrm' --no-compress '$D/r.lrm' > '$D/o.lrm'"
        assert_fails_clean
        assert_output --partial "$want (use --allow-nonfinite)"
        # under mpirun (the scan not deferred to the outputs), but not in the
        # sanitized pass: LeakSanitizer reports OpenMPI's own start-up
        # allocations (tests/run.sh); the plain pass runs it
        if command -v mpirun >/dev/null && [ -z "${LRMOE_SAN_REPORTS:-}" ]; then
            run $MPIRUN -np 1 "$EXEC" --phase forward -@ $t --weights "$D/wn.lrm" --no-compress \
                -o "$D/o.lrm" "$D/r.lrm"
            assert_failure
            [[ $output == *"MPI support is not built"* ]] ||
                assert_output --partial "$want (use --allow-nonfinite)"
        fi
    done
    # w_down alone, experts 22 and 2: expert 2's, in the first range
    pyedit "f=read_stream('$D/w.lrm', True); t,a,d=f[0]; t=dict(t)
x=t['w_down'].copy(); x[22,0,1]=0x7fc0; x[2,5,7]=0x7fc0; t['w_down']=x; write_stream('$D/wn.lrm', [(t,a,d)])"
    run sh -c "'$EXEC' --phase forward -@ 3 --weights '$D/wn.lrm' --no-compress '$D/r.lrm' > '$D/o.lrm'"
    assert_fails_clean
    assert_output --partial "$D/wn.lrm: layer 0: w_down: non-finite value at flat index $((2 * F * Dm + 5 * F + 7))"
}

@test "exec: non-finite weights are found through the layer's outputs: each matrix, NaN and Inf, against zero activations, every backward mode, an expert without packed rows" {
    # The CPU backend checks the used experts' weights through the layer's
    # outputs (lib/exec_frame.c out_check); the verdict and the message must
    # be those of a scan of every used expert before the layer.
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 24 --E 8 --K 2 --D 16 --F 12 --dtype bf16
    # every expert used; tokens of expert 2 (i % 4 == 2) have zero hidden and
    # zero grad_output, so the poisoned weights meet 0 (0 * Inf = NaN)
    pyedit "f=read_stream('$D/in.lrm', True); t,a,d=f[0]; t=dict(t); T=t['topk_ids'].shape[0]
t['topk_ids']=np.array([[i % 4, 4 + i % 4] for i in range(T)], dtype=np.int32)
for n in ('hidden', 'grad_output'):
    x=t[n].copy(); x[2::4]=0; t[n]=x
write_stream('$D/in6.lrm', [(t,a,d)])"
    # keep: all pairs (kA), or all but expert 2's (k2: expert 2 computes no packed row)
    for k in A 2; do
        "$EXEC" --phase forward --weights "$D/w.lrm" -P 2 --no-compress -o "$D/f.lrm" "$D/in6.lrm"
        pyedit "f=read_stream('$D/f.lrm', True); t,a,d=f[0]; t=dict(t); ids=t['topk_ids']
t['keep']=np.ones(ids.shape, np.uint8) if '$k' == 'A' else (ids != 2).astype(np.uint8)
write_stream('$D/k$k.lrm', [(t,a,d)])"
        "$BIN/lrmoe-pack" -P 2 --no-compress -o "$D/p$k.lrm" "$D/k$k.lrm"
    done
    for c in f32 bf16; do
        for mv in w_gate:inf w_up:nan w_down:inf w_down:-inf w_gate:nan; do
            m=${mv%%:*} v=${mv#*:}
            pyedit "f=read_stream('$D/w.lrm', True); t,a,d=f[0]; t=dict(t); x=t['$m'].copy()
bits={'inf': 0x7f80, '-inf': 0xff80, 'nan': 0x7fc0}['$v']
x[2,3,4]=bits if x.dtype == np.uint16 else float('$v'); t['$m']=x; write_stream('$D/wb.lrm', [(t,a,d)])"
            if [ "$m" = w_down ]; then i=$((2 * 12 * 16 + 3 * 12 + 4)); else i=$((2 * 12 * 16 + 3 * 16 + 4)); fi
            msg="$D/wb.lrm: layer 0: $m: non-finite value at flat index $i (use --allow-nonfinite)"
            for run in "forward:$D/in6.lrm" "backward --mode full:$D/kA.lrm" \
                       "backward --mode masked:$D/k2.lrm" "backward --mode compact:$D/pA.lrm" \
                       "backward --mode compact:$D/p2.lrm"; do
                ph=${run%%:*} in=${run#*:}
                run sh -c "'$EXEC' --phase $ph --compute $c --weights '$D/wb.lrm' --no-compress '$in' > '$D/o.lrm'"
                echo "# $c $m=$v --phase $ph $in" >&3
                assert_fails_clean
                assert_output --partial "$msg"
                no_trailer "$D/o.lrm"
            done
        done
    done
    # two bad experts: the message is the first of the scan order (w_gate before
    # w_up, then by expert), not the first output to show it
    pyedit "f=read_stream('$D/w.lrm', True); t,a,d=f[0]; t=dict(t)
g=t['w_gate'].copy(); g[4,0,1]=0x7f80; u=t['w_up'].copy(); u[1,0,0]=0x7fc0; t['w_gate']=g; t['w_up']=u
write_stream('$D/w2.lrm', [(t,a,d)])"
    for ph in forward backward; do
        in="$D/kA.lrm"; [ $ph = forward ] && in="$D/in6.lrm"
        run sh -c "'$EXEC' --phase $ph --weights '$D/w2.lrm' --no-compress '$in' > '$D/o.lrm'"
        assert_fails_clean
        assert_output --partial "w_gate: non-finite value at flat index $((4 * 192 + 1)) (use --allow-nonfinite)"
    done
    # finite weights whose products overflow: non-finite outputs, no error (as
    # with the scan before the layer: only the weights' own values are errors)
    pyedit "f=read_stream('$D/w.lrm', True); t,a,d=f[0]; t=dict(t); x=t['w_up'].copy(); x[1]=0x7f7f; t['w_up']=x; write_stream('$D/wo.lrm', [(t,a,d)])"
    pyedit "f=read_stream('$D/in6.lrm', True); t,a,d=f[0]; t=dict(t); x=t['hidden'].copy(); x[1::4]=0x3f80; t['hidden']=x; write_stream('$D/in1.lrm', [(t,a,d)])"
    run "$EXEC" --phase forward --weights "$D/wo.lrm" --no-compress -o "$D/o.lrm" "$D/in1.lrm"
    assert_success
    run pyedit "x=read_stream('$D/o.lrm')[0][0]['saved_up']; print('inf' if ((x & 0x7f80) == 0x7f80).any() else 'finite')"
    assert_output inf
}

@test "exec: output buffers reused across frames give the same bits as one process per frame (shapes changing between frames too)" {
    G="--experts 4 --topk 2 --hidden 16 --ffn 8 --dtype bf16 --no-compress"
    "$BIN/lrmoe-gen" --tokens 32 $G --weights "$D/w.lrm" --seed 5 > /dev/null
    # frames of 32, 32, 32, 48, 32 tokens, each of its own seed
    i=0
    for T in 32 32 32 48 32; do
        "$BIN/lrmoe-gen" --tokens $T $G --seed $((10 + i)) | "$BIN/lrmoe-route" -k 2 --no-compress > "$D/r$i.lrm"
        i=$((i + 1))
    done
    "$BIN/lrmoe-cat" --no-compress "$D"/r[0-4].lrm > "$D/all.lrm"
    for c in f32 bf16; do
        "$EXEC" --phase forward --compute $c --weights "$D/w.lrm" -P 2 --no-compress -o "$D/f.lrm" "$D/all.lrm"
        "$EXEC" --phase backward --compute $c --weights "$D/w.lrm" --no-compress -o "$D/b.lrm" "$D/f.lrm"
        for i in 0 1 2 3 4; do
            pyedit "write_stream('$D/f$i.lrm', [read_stream('$D/f.lrm', True)[$i]])"
            "$EXEC" --phase forward --compute $c --weights "$D/w.lrm" -P 2 --no-compress -o "$D/g$i.lrm" "$D/r$i.lrm"
            "$EXEC" --phase backward --compute $c --weights "$D/w.lrm" --no-compress -o "$D/b$i.lrm" "$D/f$i.lrm"
        done
        run pyedit "
a = read_stream('$D/f.lrm', True); b = read_stream('$D/b.lrm', True)
assert len(a) == len(b) == 5
for i in range(5):
    for (x, _, _), y in ((a[i], read_stream('$D/g%d.lrm' % i, True)[0][0]), (b[i], read_stream('$D/b%d.lrm' % i, True)[0][0])):
        assert sorted(x) == sorted(y), i
        for k in x: assert x[k].tobytes() == y[k].tobytes(), (i, k)
print('same')"
        assert_success
        assert_output same
    done
}

@test "exec --compute bf16: every kernel this CPU runs against float64 on every AMX tile edge, with the bit-equalities each promises (lrmoe_gemm2, lrmoe_gemm_bf16out, strides; tests/unit/gemm_amx_test.c)" {
    have_bf16 || skip "this build has no oneDNN: --compute bf16 unavailable"
    cp "$(unit_test gemm_amx)" "$D/gat"
    # the same cases on this CPU's default kernel and on every bf16 kernel it
    # can run (tests/helpers/bf16_kernels.bash), each checking the
    # bit-equalities that kernel promises (lib/gemm_cpu.h): lrmoe_gemm2 and
    # lrmoe_gemm_bf16out against lrmoe_gemm on all; on AMX, dpbf16 and the
    # emulation's AVX-512 and AVX2 forms also the same bits at any ldc
    run "$D/gat"
    assert_success
    assert_output --partial "790 cases, 0 failed"
    local k e n=0
    while read -r k e <&7; do
        # shellcheck disable=SC2086
        run env $e "$D/gat"
        assert_success
        assert_line --regexp "^kernel: $k[ ,]"
        assert_output --partial "790 cases, 0 failed"
        case $k in
        amx | emulated-avx* | dpbf16) assert_output --partial "bits independent of strides" ;;
        *) assert_output --partial "bits not promised independent of strides" ;;
        esac
        [ "$k" = amx ] && n=$((n + 1))
        [ "$k" != amx ] || assert_line "amx: yes"
    done 7< <(bf16_kernels)
    run env LRMOE_AMX=0 "$D/gat"
    assert_success
    assert_line "amx: no"
    refute_line --regexp "^kernel: amx"
    [ "$n" = 1 ] || skip "this CPU has no AMX BF16: the AMX kernel ran on no case (the others did)"
}

@test "exec --compute bf16: a layer of AMX shapes (D=96 F=64) matches float64 and the kernel taken without AMX (LRMOE_AMX=0), forward and backward, P=1,2" {
    have_bf16 || skip "this build has no oneDNN: --compute bf16 unavailable"
    for dt in f32 bf16; do
        python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 53 --E 6 --K 2 --D 96 --F 64 --skew 3 --dtype "$dt"
        for P in 1 2; do
            rm -f "$D"/[fb][01].lrm
            for amx in 0 1; do
                run env LRMOE_AMX=$amx "$EXEC" --phase forward --compute bf16 --weights "$D/w.lrm" -P "$P" \
                    --no-compress -o "$D/f$amx.lrm" "$D/in.lrm"
                assert_success
                run python3 "$REF" check-fwd "$D/f$amx.lrm" "$D/w.lrm" --P "$P" --tol 2e-2
                assert_success
            done
            # both backwards read the AMX forward's stream, so that they
            # differ by their kernels only, not by the forward's roundings
            for amx in 0 1; do
                run env LRMOE_AMX=$amx "$EXEC" --phase backward --compute bf16 --weights "$D/w.lrm" \
                    --no-compress -o "$D/b$amx.lrm" "$D/f1.lrm"
                assert_success
                run python3 "$REF" check-bwd "$D/b$amx.lrm" "$D/w.lrm" --tol 2e-2
                assert_success
            done
            # same operands, F32 accumulation in another order (on an AMX CPU
            # the other kernel is dpbf16, oneDNN or the AVX-512 emulation):
            # the F32 results agree far inside one BF16 rounding (measured
            # <= 3.8e-7 on an AMX Xeon). A BF16 output (dt=bf16) is rounded
            # once per element, and two orders of the same sum that straddle
            # a rounding boundary land one BF16 ulp apart: there it is
            # 1 element of 5,088, relerr 4.8e-5, so its tolerance is 2.5e-4
            # (2^-12, a sixteenth of one BF16 ulp over the whole tensor: a
            # few elements at most); phi_sqnorm, F32 before any rounding,
            # keeps 1e-5
            local otol=1e-5
            [ "$dt" = f32 ] || otol=2.5e-4
            run python3 "$REF" compare "$D/f1.lrm" "$D/f0.lrm" output --tol "$otol"
            assert_success
            run python3 "$REF" compare "$D/f1.lrm" "$D/f0.lrm" phi_sqnorm --tol 1e-5
            assert_success
            run python3 "$REF" compare "$D/b1.lrm" "$D/b0.lrm" $GRADS --tol 1e-5
            assert_success
        done
    done
}

@test "exec output buffers: lrmoe_alloc_big advises huge or 4 KiB pages as chosen (LRMOE_THP, smaps VmFlags and AnonHugePages), lrmoe_alloc_prefault faults a fresh buffer in with one call (tests/unit/alloc_test.c)" {
    cp "$(unit_test alloc)" "$D/at"
    run "$D/at" 0
    assert_success
    assert_line "alloc: ok"
    assert_line --partial "VmFlags"
    run "$D/at" 1
    assert_success
    assert_line "alloc: ok"
    # the process' own choice (free page reporting, THP never, or huge pages)
    run "$D/at" auto
    assert_success
    assert_line "alloc: ok"
    assert_line --regexp "^alloc: huge pages (yes \(default\)|no \((THP never|free page reporting)\))$"
}

@test "exec LRMOE_POOL: outputs in files of a pool directory that outlive the process (the next process maps their resident pages), the same bits, reused not regrown, one file per concurrent process, a missing directory ignored" {
    "$BIN/lrmoe-gen" --tokens 256 --experts 16 --topk 2 --hidden 512 --ffn 256 --seed 4 \
        --weights "$D/w.lrm" --no-compress | "$BIN/lrmoe-route" -k 2 --no-compress -o "$D/r.lrm"
    "$EXEC" --phase forward -@ 1 --weights "$D/w.lrm" --no-compress -o "$D/f.lrm" "$D/r.lrm"
    "$EXEC" --phase backward -@ 1 --weights "$D/w.lrm" --no-compress -o "$D/b.lrm" "$D/f.lrm"
    mkdir "$D/pool"
    local pool="$D/pool/lrmoe-pool-$(id -u)-" n1 n2
    LRMOE_POOL="$D/pool" "$EXEC" --phase backward -@ 1 --weights "$D/w.lrm" --no-compress \
        -o "$D/b1.lrm" "$D/f.lrm"
    run same_bits "$D/b.lrm" "$D/b1.lrm"
    assert_success
    # the three 8 MiB weight gradients (16 x 256 x 512 F32) lived in pool
    # files: each file holds the last bytes its output had
    n1=$(ls "$pool"* | wc -l)
    [ "$n1" -ge 3 ]
    run pyedit "
import glob, numpy as np
t = read_stream('$D/b1.lrm')[0][0]
files = [open(f, 'rb').read() for f in glob.glob('$pool*')]
for n in ('grad_w_gate', 'grad_w_up', 'grad_w_down'):
    assert any(f[:t[n].nbytes] == t[n].tobytes() for f in files), n
print('in the pool')"
    assert_success
    assert_output "in the pool"
    LRMOE_POOL="$D/pool" "$EXEC" --phase backward -@ 1 --weights "$D/w.lrm" --no-compress \
        -o "$D/b2.lrm" "$D/f.lrm"
    run same_bits "$D/b.lrm" "$D/b2.lrm"
    assert_success
    n2=$(ls "$pool"* | wc -l)
    [ "$n2" = "$n1" ]
    # two processes at once: each its own files (flock), both right
    LRMOE_POOL="$D/pool" "$EXEC" --phase backward -@ 1 --repeat 2 --weights "$D/w.lrm" \
        --no-compress -o "$D/c1.lrm" "$D/f.lrm" &
    LRMOE_POOL="$D/pool" "$EXEC" --phase backward -@ 1 --repeat 2 --weights "$D/w.lrm" \
        --no-compress -o "$D/c2.lrm" "$D/f.lrm"
    wait $!
    for c in c1 c2; do
        run same_bits "$D/b.lrm" "$D/$c.lrm"
        assert_success
    done
    # no such directory: the process' own memory, no error
    LRMOE_POOL="$D/nowhere" "$EXEC" --phase backward -@ 1 --weights "$D/w.lrm" --no-compress \
        -o "$D/b3.lrm" "$D/f.lrm"
    run same_bits "$D/b.lrm" "$D/b3.lrm"
    assert_success
}

@test "exec SwiGLU: the AVX-512 rows (lrmoe's expf) equal the scalar rows with libm's expf bit for bit, forward, backward, sqnorm and the backward on BF16 rows with BF16 outputs (tests/unit/swiglu_test.c)" {
    cp "$(unit_test swiglu)" "$D/sw"
    # every 257th float bit pattern (16.7M sigmoids) and 49 layers of special and random rows
    run "$D/sw" 257
    assert_success
    assert_output --partial "cases, 0 failed"
    vec="${lines[0]}"
    run env LRMOE_SWIGLU_VEC=0 "$D/sw" 65537
    assert_success
    assert_line "vec: no"
    assert_output --partial "cases, 0 failed"
    grep -qw avx512f /proc/cpuinfo || skip "this CPU has no AVX-512F: only the scalar rows ran"
    # on an AVX-512F CPU the vector rows must run: "vec: no" there means they
    # failed their self-check against libm's expf
    echo "$vec"
    [ "$vec" = "vec: yes" ]
}

@test "exec combine: the AVX-512 combines (forward sum, backward grad_hidden and router gradient, BF16 pair outputs) give the scalar loops' bits (LRMOE_COMBINE_VEC=0): K=11 over D=37, K=8 over D=64; full, masked and compact" {
    grep -qw avx512f /proc/cpuinfo || skip "this CPU has no AVX-512F: only the scalar loops run"
    # K=11: a group of 8 router-gradient lanes and one of 3; D=37: a tail
    # after the 16- and 8-wide blocks; compact drops pairs (no dx row)
    for s in "11 37 3" "8 64 5"; do
        set -- $s
        python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 29 --E 16 --K $1 --D $2 --F 20 --seed $3 --dtype bf16
        for v in 1 0; do
            LRMOE_COMBINE_VEC=$v "$EXEC" --phase forward --compute f32 --weights "$D/w.lrm" \
                --no-compress -o "$D/f$v.lrm" "$D/in.lrm"
            LRMOE_COMBINE_VEC=$v "$EXEC" --phase backward --compute f32 --weights "$D/w.lrm" \
                --no-compress -o "$D/b$v.lrm" "$D/f$v.lrm"
        done
        run same_bits "$D/f1.lrm" "$D/f0.lrm"
        assert_success
        run same_bits "$D/b1.lrm" "$D/b0.lrm"
        assert_success
        run python3 "$REF" check-bwd "$D/b1.lrm" "$D/w.lrm" --tol 2e-2
        assert_success
        python3 "$REF" keep "$D/f1.lrm" "$D/k.lrm" --rate 0.6
        python3 "$REF" pack "$D/k.lrm" "$D/p.lrm" --P 1
        for m in masked:k compact:p; do
            for v in 1 0; do
                LRMOE_COMBINE_VEC=$v "$EXEC" --phase backward --mode ${m%%:*} --compute f32 \
                    --weights "$D/w.lrm" --no-compress -o "$D/m$v.lrm" "$D/${m##*:}.lrm"
            done
            run same_bits "$D/m1.lrm" "$D/m0.lrm"
            assert_success
        done
    done
}

@test "exec: P=1 (no all-to-all, no permutation), P=2 with one expert a rank (rows arrive in layout order) and P=3 (permuted) give the same bits, forward and backward" {
    # a rank's rows for itself skip the all-to-all and, when every rank's
    # rows arrive in layout order, the permutation is skipped too: every
    # tensor but pair_rank must be the same bytes whatever the rank count
    for dt in bf16 f32; do
        for E in 2 6; do
            python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 53 --E $E --K 2 --D 96 --F 64 --skew 3 --dtype "$dt"
            for c in $(have_bf16 && echo bf16) f32; do
                for P in 1 2 3; do
                    [ "$E" = 2 ] && [ "$P" = 3 ] && continue
                    "$EXEC" --phase forward --compute $c --weights "$D/w.lrm" -P $P --no-compress -o "$D/f$P.lrm" "$D/in.lrm"
                    "$EXEC" --phase backward --compute $c --weights "$D/w.lrm" --no-compress -o "$D/b$P.lrm" "$D/f$P.lrm"
                done
                run pyedit "
for P in (2, 3) if $E == 6 else (2,):
    for ph in 'fb':
        x = read_stream('$D/%s1.lrm' % ph)[0][0]; y = read_stream('$D/%s%d.lrm' % (ph, P))[0][0]
        assert sorted(x) == sorted(y), (ph, P)
        for k in x:
            if k != 'pair_rank': assert x[k].tobytes() == y[k].tobytes(), ('$dt', $E, '$c', ph, P, k)
print('same')"
                assert_success
                assert_output same
            done
        done
    done
}

@test "exec: the forward output is the F32 sum of topk_weights * pair_out rows in ascending k from +0, rounded once (bit for bit; widths with and without a 32-column tail)" {
    for dt in bf16 f32; do
        for Dm in 96 40; do
            python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 37 --E 4 --K 3 --D $Dm --F 32 --skew 2 --dtype "$dt"
            "$EXEC" --phase forward --weights "$D/w.lrm" --no-compress -o "$D/f.lrm" "$D/in.lrm"
            run pyedit "
t, a, d = read_stream('$D/f.lrm', True)[0]
K = t['topk_ids'].shape[1]
y = t['pair_out']; y = bf16_to_f32(y) if d['pair_out'] == 'BF16' else y
y = y.reshape(-1, K, y.shape[-1]).astype(np.float32)
al = t['topk_weights'].astype(np.float32)
acc = np.zeros((y.shape[0], y.shape[2]), np.float32)
for k in range(K): acc = acc + al[:, k:k + 1] * y[:, k, :]
ref = f32_to_bf16(acc) if d['output'] == 'BF16' else acc
assert ref.tobytes() == t['output'].tobytes(), int((ref != t['output']).sum())
print('same')"
            assert_success
            assert_output same
        done
    done
}

# every tensor of stream $2 (layout-only pack) is in stream $1 (copying pack)
# with the same dtype, shape and bytes; $1 has only pack_grad, pack_hidden,
# pack_gate and pack_up besides; same attributes but the clocks and
# pack.form. Prints "same N" (N tensors compared).
same_but_rows() {
    pyedit "
a = read_stream('$1', True); b = read_stream('$2', True)
assert len(a) == len(b) and a, (len(a), len(b))
n = 0
for (ta, aa, da), (tb, ab, db) in zip(a, b):
    extra = sorted(set(ta) - set(tb))
    assert extra == ['pack_gate', 'pack_grad', 'pack_hidden', 'pack_up'], extra
    assert set(tb) <= set(ta), sorted(set(tb) - set(ta))
    for k in tb:
        assert da[k] == db[k] and ta[k].shape == tb[k].shape, k
        assert ta[k].tobytes() == tb[k].tobytes(), k + ' differs'
        n += 1
    assert aa['pack.form'] == 'rows' and ab['pack.form'] == 'layout', (aa['pack.form'], ab['pack.form'])
    clk = lambda x: {k: v for k, v in x.items() if not k.startswith('exec.') and not k.endswith(('seconds', '_s')) and k != 'pack.form'}
    assert clk(aa) == clk(ab), set(clk(aa).items()) ^ set(clk(ab).items())
print('same', n)"
}

@test "exec: compact from a layout-only pack (lrmoe-pack --layout-only) gives the bytes of the copying pack: P=1,2,4,8, --alloc forward and a plan's moved rows, F32 and BF16, both --compute" {
    for t in gen route plan score pack; do
        [ -x "$BIN/lrmoe-$t" ] || skip "bin/lrmoe-$t not built"
    done
    moved=0
    for dt in f32 bf16; do
        # one hot expert, so the planner replicates it (and rows can move)
        "$BIN/lrmoe-gen" --tokens 75 --experts 8 --topk 2 --hidden 24 --ffn 16 --dtype $dt \
            --hot 90:1 --weights "$D/w.lrm" --seed 7 --no-compress |
            "$BIN/lrmoe-route" -k 2 --no-compress -o "$D/r.lrm"
        for P in 1 2 4 8; do
            for how in forward plan; do
                if [ $how = plan ]; then
                    [ $P = 1 ] && continue
                    # the keep taken by score over each expert's pairs (no plan.keep=by-rank,
                    # which the planner's in-place plans set): the retained rows of a
                    # replicated expert then move to the plan's backward instances
                    "$BIN/lrmoe-plan" --planner lrmoe --ranks $P --rates 0.7 --no-compress \
                        -o "$D/pl.lrm" "$D/r.lrm"
                    pyedit "fr = read_stream('$D/pl.lrm', with_dtypes=True)
for t, a, d in fr: a.pop('plan.keep', None)
write_stream('$D/pg.lrm', fr)"
                    "$EXEC" --phase forward --weights "$D/w.lrm" --no-compress "$D/pg.lrm" |
                        "$BIN/lrmoe-score" --select topk --no-compress -o "$D/s.lrm"
                else
                    "$EXEC" --phase forward --weights "$D/w.lrm" -P $P --no-compress "$D/r.lrm" |
                        "$BIN/lrmoe-score" --select topk --drop 30 --no-compress -o "$D/s.lrm"
                fi
                "$BIN/lrmoe-pack" --alloc $how -P $P --no-compress -o "$D/pc.lrm" "$D/s.lrm"
                "$BIN/lrmoe-pack" --alloc $how -P $P --layout-only --no-compress -o "$D/pl.lrm" "$D/s.lrm"
                m=$(pyedit "print(read_stream('$D/pl.lrm')[0][1]['pack.moved'])")
                moved=$((moved + m))
                for c in f32 bf16; do
                    for p in pc pl; do
                        "$EXEC" --phase backward --mode compact --compute $c --weights "$D/w.lrm" \
                            --no-compress -o "$D/b$p.lrm" "$D/$p.lrm"
                    done
                    run same_but_rows "$D/bpc.lrm" "$D/bpl.lrm"
                    assert_success
                    assert_output --regexp "^same [0-9]+$"
                done
            done
        done
    done
    # the plan cases did move rows off their forward rank (else the test lost its power)
    [ "$moved" -gt 0 ] || { echo "LOST POWER: no pack moved a row"; return 1; }
}

@test "exec: layout-only packs: missing hidden or saved_up, a row tensor without the others, a mismatched pack_pair: exit 1 naming it, no trailer" {
    for t in gen route score pack; do
        [ -x "$BIN/lrmoe-$t" ] || skip "bin/lrmoe-$t not built"
    done
    "$BIN/lrmoe-gen" --tokens 40 --experts 4 --topk 2 --hidden 16 --ffn 8 --dtype f32 \
        --weights "$D/w.lrm" --seed 5 --no-compress | "$BIN/lrmoe-route" -k 2 --no-compress |
        "$EXEC" --phase forward --weights "$D/w.lrm" -P 2 --no-compress |
        "$BIN/lrmoe-score" --select topk --drop 25 --no-compress -o "$D/s.lrm"
    "$BIN/lrmoe-pack" --layout-only --no-compress -o "$D/pl.lrm" "$D/s.lrm"
    "$BIN/lrmoe-pack" --no-compress -o "$D/pc.lrm" "$D/s.lrm"
    bwd() {
        run sh -c "'$EXEC' --phase backward --mode compact --weights '$D/w.lrm' --no-compress '$1' > '$D/o.lrm'"
        assert_fails_clean
        if pyedit "read_stream('$D/o.lrm')" 2>/dev/null; then # keeps $output
            echo "a trailer after the error"; return 1
        fi
    }
    for n in hidden saved_up; do
        pyedit "f=read_stream('$D/pl.lrm', True); t,a,d=f[0]; t=dict(t); del t['$n']; write_stream('$D/bad.lrm', [(t,a,d)])"
        bwd "$D/bad.lrm"
        assert_output --partial "lrmoe-exec: frame 0: backward compact, layout-only pack: missing tensor $n"
    done
    # one of the four row tensors alone: neither form
    pyedit "f=read_stream('$D/pl.lrm', True); t,a,d=f[0]; t=dict(t); c=dict(read_stream('$D/pc.lrm', True)[0][0]); t['pack_grad']=c['pack_grad']; write_stream('$D/bad.lrm', [(t,a,d)])"
    bwd "$D/bad.lrm"
    assert_output --partial "has 1 of the row tensors pack_grad, pack_hidden, pack_gate, pack_up but not pack_hidden"
    # pack_pair naming a pair of another expert, or out of range
    pyedit "f=read_stream('$D/pl.lrm', True); t,a,d=f[0]; t=dict(t); p=t['pack_pair'].copy(); ids=t['topk_ids'].ravel(); j=int(np.flatnonzero(ids != ids[p[0]])[0]); p[0]=j; t['pack_pair']=p; write_stream('$D/bad.lrm', [(t,a,d)])"
    bwd "$D/bad.lrm"
    assert_output --regexp "pack_pair\[0\]: pair [0-9]+ is of expert [0-9]+ but sits in the segment of expert"
    pyedit "f=read_stream('$D/pl.lrm', True); t,a,d=f[0]; t=dict(t); p=t['pack_pair'].copy(); p[-1]=80; t['pack_pair']=p; write_stream('$D/bad.lrm', [(t,a,d)])"
    bwd "$D/bad.lrm"
    assert_output --partial "pair 80 out of range [0,80)"
    # non-finite saved state of a kept pair is still found (the sources are checked)
    pyedit "f=read_stream('$D/pl.lrm', True); t,a,d=f[0]; t=dict(t); x=t['saved_gate'].copy(); x.reshape(-1, x.shape[-1])[int(t['pack_pair'][0])][0]=np.inf; t['saved_gate']=x; write_stream('$D/bad.lrm', [(t,a,d)])"
    bwd "$D/bad.lrm"
    assert_output --partial "saved_gate: non-finite"
}

@test "exec: a layout-only pack under mpirun gets its rows gathered for the MPI path: the bytes of the copying pack" {
    command -v mpirun >/dev/null || skip "mpirun not installed (openmpi-bin)"
    # as tests/mpi.bats is (tests/run.sh): LeakSanitizer reports OpenMPI's
    # own start-up allocations, which no suppression can name
    [ -z "${LRMOE_SAN_REPORTS:-}" ] || skip "MPI runs stay out of the sanitized pass (OpenMPI's start-up allocations are reported as leaks); the plain pass runs this"
    for t in gen route score pack; do
        [ -x "$BIN/lrmoe-$t" ] || skip "bin/lrmoe-$t not built"
    done
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TMPDIR="$D"
    MPIRUN="timeout 120 mpirun --mca btl tcp,self --oversubscribe"
    run $MPIRUN -np 1 "$EXEC" --phase forward --weights "$D/none.lrm" "$D/none.lrm"
    [[ "$output" != *"MPI support is not built"* ]] || skip "lrmoe-exec built without MPI"
    "$BIN/lrmoe-gen" --tokens 50 --experts 8 --topk 2 --hidden 16 --ffn 8 --dtype bf16 \
        --skew zipf:1.2 --weights "$D/w.lrm" --seed 3 --no-compress | "$BIN/lrmoe-route" -k 2 --no-compress |
        "$EXEC" --phase forward --weights "$D/w.lrm" -P 2 -@ 1 --no-compress |
        "$BIN/lrmoe-score" --select topk --drop 30 --no-compress -o "$D/s.lrm"
    "$BIN/lrmoe-pack" --no-compress -o "$D/pc.lrm" "$D/s.lrm"
    "$BIN/lrmoe-pack" --layout-only --no-compress -o "$D/pl.lrm" "$D/s.lrm"
    for p in pc pl; do
        run $MPIRUN -np 2 "$EXEC" --phase backward --mode compact --weights "$D/w.lrm" -@ 1 \
            --no-compress -o "$D/m$p.lrm" "$D/$p.lrm"
        assert_success
    done
    "$EXEC" --phase backward --mode compact --weights "$D/w.lrm" -@ 1 --no-compress -o "$D/one.lrm" "$D/pl.lrm"
    # the MPI output keeps the layout-only form (the gathered rows are dropped again)
    run same_but_rows "$D/mpc.lrm" "$D/mpl.lrm"
    assert_success
    run pyedit "
a = read_stream('$D/mpl.lrm', True)[0][0]; b = read_stream('$D/one.lrm', True)[0][0]
assert sorted(a) == sorted(b)
for k in a: assert a[k].tobytes() == b[k].tobytes(), k
print('same')"
    assert_output same
}

# issue 36 item 2: a forward frame has no tensor of width F, so weights of
# another model (same E and D, other F) ran and wrote a full output
@test "exec: forward refuses weights whose F differs from the frame's ffn or plan.ffn" {
    "$BIN/lrmoe-gen" --tokens 64 --experts 8 --topk 2 --hidden 16 --ffn 64 --seed 1 \
        --weights "$D/w64.lrm" -o "$D/g.lrm"
    "$BIN/lrmoe-gen" --tokens 8 --experts 8 --topk 2 --hidden 16 --ffn 32 --seed 2 \
        --weights "$D/w32.lrm" -o "$D/g32.lrm"
    "$BIN/lrmoe-route" -k 2 "$D/g.lrm" -o "$D/r.lrm"
    run "$EXEC" --phase forward --weights "$D/w32.lrm" "$D/r.lrm" -o "$D/o.lrm"
    assert_fails_clean
    assert_output --partial "ffn=64 but the weights of layer 0 have F=32"
    no_trailer "$D/o.lrm"
    # the frame without its ffn attribute, planned with --ffn 64: plan.ffn says it
    pyedit "f,a,t=read_stream('$D/r.lrm', True)[0]; a.pop('ffn'); write_stream('$D/r0.lrm', [(f,a,t)])"
    "$BIN/lrmoe-plan" -P 2 --ffn 64 "$D/r0.lrm" -o "$D/p.lrm"
    run "$EXEC" --phase forward --weights "$D/w32.lrm" "$D/p.lrm" -o "$D/o.lrm"
    assert_fails_clean
    assert_output --partial "plan.ffn=64 but the weights of layer 0 have F=32"
    run "$EXEC" --phase forward --weights "$D/w64.lrm" "$D/p.lrm" -o "$D/ok.lrm"
    assert_success
    run "$EXEC" --phase forward --weights "$D/w64.lrm" "$D/r.lrm" -o "$D/ok.lrm"
    assert_success
}
