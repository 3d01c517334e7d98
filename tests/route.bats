#!/usr/bin/env bats
# lrmoe-route against the independent float64 reference tests/helpers/route_ref.py.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load
load helpers/unit

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    REF="$BATS_TEST_DIRNAME/helpers/route_ref.py"
    T="$BATS_TEST_TMPDIR"
    [ -x "$BIN/lrmoe-route" ] || skip "bin/lrmoe-route not built (run make)"
    python3 -c 'import numpy' 2>/dev/null || skip "python3 numpy missing"
}

gen() { python3 "$REF" gen "$@"; }

# route IN with ARGS..., then compare every frame with the reference
route_check() {
    local in=$1; shift
    run "$BIN/lrmoe-route" "$@" -S "$T/stats.tsv" -o "$T/out.lrm" "$in"
    assert_success
    run python3 "$REF" check "$in" "$T/out.lrm" "$@" -S "$T/stats.tsv"
    assert_success
}

@test "route: --help and --version" {
    run "$BIN/lrmoe-route" --help
    assert_success
    assert_output --partial "Usage: lrmoe-route"
    run "$BIN/lrmoe-route" --version
    assert_success
    assert_output "lrmoe-route (lrmoe) $(sed -n 's/^#define LRMOE_VERSION "\(.*\)"/\1/p' "$BATS_TEST_DIRNAME/../lib/lrmoe.h")"
}

@test "route: the reference check fails on a different router" {
    gen "$T/in.lrm" --tokens 64 --experts 16 --kind random
    "$BIN/lrmoe-route" -k 4 -o "$T/out.lrm" "$T/in.lrm"
    run python3 "$REF" check "$T/in.lrm" "$T/out.lrm" -k 4
    assert_success
    run python3 "$REF" check "$T/in.lrm" "$T/out.lrm" -k 4 --renorm
    assert_failure
    assert_output --partial "weights"
    run python3 "$REF" check "$T/in.lrm" "$T/out.lrm" -k 4 -r sigmoid
    assert_failure
}

@test "route: softmax top-K, with and without renormalisation, F32 and BF16" {
    for dt in F32 BF16; do
        gen "$T/in.lrm" --tokens 200 --experts 16 --kind mix --dtype $dt --frames 3 --seed 3
        route_check "$T/in.lrm" -k 4
        route_check "$T/in.lrm" -k 8 --renorm
    done
}

@test "route: qwen3 shape E=128 K=8 (vector path), odd E=20 (scalar path)" {
    gen "$T/in.lrm" --tokens 300 --experts 128 --kind mix --frames 3 --seed 4
    route_check "$T/in.lrm" -k 8 --renorm -@ 2
    route_check "$T/in.lrm" -k 8
    route_check "$T/in.lrm" -k 3 -r topk-softmax
    gen "$T/in.lrm" --tokens 100 --experts 20 --kind mix --frames 3 --seed 5 --dtype BF16
    route_check "$T/in.lrm" -k 8 -n
    route_check "$T/in.lrm" -k 10 --scale 2.5
    # the portable scalar paths
    gen "$T/in.lrm" --tokens 300 --experts 128 --kind mix --frames 3 --seed 4
    LRMOE_NO_SIMD=1 route_check "$T/in.lrm" -k 8
    LRMOE_NO_SIMD=1 route_check "$T/in.lrm" -k 8 --renorm
}

@test "route: AVX-512, AVX2 (LRMOE_NO_AVX512) and scalar (LRMOE_NO_SIMD) paths pick the same experts" {
    for dt in F32 BF16; do
        for kind in ties extreme inf; do
            gen "$T/in.lrm" --tokens 400 --experts 128 --kind $kind --dtype $dt --seed 17
            for r in "-k 8 -n" "-k 5 -r topk-softmax" "-k 8 -r sigmoid -G 8 --topk-groups 4"; do
                "$BIN/lrmoe-route" $r --no-compress -o "$T/a.lrm" "$T/in.lrm"
                for path in LRMOE_NO_AVX512 LRMOE_NO_SIMD; do
                env "$path=1" "$BIN/lrmoe-route" $r --no-compress -o "$T/b.lrm" "$T/in.lrm"
                python3 - "$T/a.lrm" "$T/b.lrm" "$REF" <<'EOF'
import sys, os
sys.path.insert(0, os.path.dirname(sys.argv[3]))
import numpy as np
from lrmoe_stream import read_stream
(a, _), = read_stream(sys.argv[1])
(b, _), = read_stream(sys.argv[2])
assert np.array_equal(a["topk_ids"], b["topk_ids"]), "ids differ"
assert np.array_equal(a["expert_load"], b["expert_load"]), "load differs"
np.testing.assert_allclose(a["topk_weights"], b["topk_weights"], rtol=1e-5, atol=1e-6)
EOF
                done
            done
        done
    done
}

@test "route: every kernel path against a brute-force reference (tests/unit/route_test.c)" {
    run "$(unit_test route)"
    assert_success
    assert_output --partial "all match"
    # which kernel the default path ran, in the TAP log
    echo "# ${lines[0]}" >&3
}

@test "route: gpt-oss softmax over the K selected logits" {
    for dt in F32 BF16; do
        gen "$T/in.lrm" --tokens 200 --experts 32 --kind mix --frames 3 --dtype $dt --seed 6
        route_check "$T/in.lrm" -k 4 --router topk-softmax
    done
    route_check "$T/in.lrm" -k 9 --router gpt-oss
}

@test "route: +inf logits share the softmax mass" {
    gen "$T/in.lrm" --tokens 200 --experts 16 --kind inf --seed 7
    route_check "$T/in.lrm" -k 4
    route_check "$T/in.lrm" -k 4 -n
    route_check "$T/in.lrm" -k 3 -r topk-softmax
}

@test "route: sigmoid with selection-only bias, renorm and scaling (DeepSeek-V3)" {
    for dt in F32 BF16; do
        gen "$T/in.lrm" --tokens 200 --experts 32 --kind mix --frames 3 --dtype $dt --bias --seed 8
        route_check "$T/in.lrm" -k 8 -r sigmoid
        route_check "$T/in.lrm" -k 8 -r sigmoid --renorm --scale 2.5
    done
}

@test "route: sigmoid group-limited selection" {
    gen "$T/in.lrm" --tokens 200 --experts 64 --kind mix --frames 3 --bias --seed 9
    route_check "$T/in.lrm" -k 8 -r sigmoid -G 8 --topk-groups 4 -n --scale 2.5
    route_check "$T/in.lrm" -k 6 -r sigmoid --groups 16 --topk-groups 3
    route_check "$T/in.lrm" -k 2 -r sigmoid --groups 64 --topk-groups 2
}

@test "route: K defaults to the frame's topk attribute, else 8; -k overrides" {
    gen "$T/in.lrm" --tokens 100 --experts 32 --kind mix --frames 2 --seed 16
    python3 - "$T/in.lrm" "$T/k.lrm" "$REF" <<'EOF'
import sys, os
sys.path.insert(0, os.path.dirname(sys.argv[3]))
from lrmoe_stream import read_stream, write_stream
fr = read_stream(sys.argv[1])
write_stream(sys.argv[2], [(t, {**a, "topk": "3"}) for t, a in fr])
for bad in ("0", "x"):
    write_stream(sys.argv[2] + "." + bad, [(t, {**a, "topk": bad}) for t, a in fr])
EOF
    run "$BIN/lrmoe-route" -o "$T/out.lrm" "$T/k.lrm"
    assert_success
    run python3 "$REF" check "$T/k.lrm" "$T/out.lrm" -k 3
    assert_success
    run python3 "$REF" check "$T/k.lrm" "$T/out.lrm" -k 8
    assert_failure
    route_check "$T/k.lrm" -k 5 -n      # -k wins over the attribute
    run "$BIN/lrmoe-route" -o "$T/out.lrm" "$T/in.lrm"   # no attribute: 8
    assert_success
    run python3 "$REF" check "$T/in.lrm" "$T/out.lrm" -k 8
    assert_success
    run "$BIN/lrmoe-route" -o "$T/out.lrm" "$T/k.lrm.0"
    assert_failure 1
    assert_output "lrmoe-route: frame 0: attribute topk 0: must be at least 1"
    run "$BIN/lrmoe-route" -o "$T/out.lrm" "$T/k.lrm.x"
    assert_failure 1
    assert_output "lrmoe-route: frame 0: attribute topk 'x' is not an integer"
    run "$BIN/lrmoe-route" -k 2 -o "$T/out.lrm" "$T/k.lrm.x"
    assert_success
}

@test "route: -@ threads give the same stream as one thread" {
    gen "$T/in.lrm" --tokens 1000 --experts 64 --kind ties --seed 10 --bias
    for r in "-k 8" "-k 8 -r sigmoid -G 8 --topk-groups 2 -n"; do
        "$BIN/lrmoe-route" $r --no-compress -o "$T/a.lrm" "$T/in.lrm"
        "$BIN/lrmoe-route" $r --no-compress -@ 3 -o "$T/b.lrm" "$T/in.lrm"
        cmp "$T/a.lrm" "$T/b.lrm"
    done
}

@test "route: --ep rank load, imbalance attributes and the stats TSV" {
    gen "$T/in.lrm" --tokens 300 --experts 32 --frames 3 --seed 11
    route_check "$T/in.lrm" -k 4 --ep 4
    route_check "$T/in.lrm" -k 4 -P 8 -r sigmoid
    run head -1 "$T/stats.tsv"
    assert_output --partial "expert_imbalance"
    [ "$(wc -l < "$T/stats.tsv")" -eq 4 ]
}

@test "route: hidden x router_weight from --weights (per layer), bias from weights" {
    python3 "$REF" genw "$T/w.lrm" --experts 16 --dim 24 --layers 2 --bias
    for dt in F32 BF16; do
        gen "$T/in.lrm" --tokens 100 --experts 16 --hidden 24 --frames 3 --dtype $dt --seed 12
        route_check "$T/in.lrm" -k 4 -w "$T/w.lrm"
        route_check "$T/in.lrm" -k 4 -r sigmoid -n -w "$T/w.lrm"
    done
    # both present: --from-hidden picks hidden
    gen "$T/in.lrm" --tokens 100 --experts 16 --hidden 24 --seed 13
    python3 - "$T/in.lrm" "$T/both.lrm" "$REF" <<'EOF'
import sys, os
sys.path.insert(0, os.path.dirname(sys.argv[3]))
import numpy as np
from lrmoe_stream import read_stream, write_stream
fr = read_stream(sys.argv[1])
write_stream(sys.argv[2], [({**t, "router_logits": np.zeros((100, 16), np.float32)}, a) for t, a in fr])
EOF
    route_check "$T/both.lrm" -k 4 -w "$T/w.lrm" --from-hidden
}

@test "route: a raw --weights file is mapped, each layer's frame checked at its first use: a flipped bit in a layer no frame uses is not an error, in one that a frame uses is that frame's" {
    local H="$BATS_TEST_DIRNAME/helpers"
    python3 "$REF" genw "$T/w0.lrm" --experts 16 --dim 24 --layers 2 --bias
    "$BIN/lrmoe-cat" --no-compress -o "$T/w.lrm" "$T/w0.lrm"   # with CRC-64 records
    gen "$T/g.lrm" --tokens 100 --experts 16 --hidden 24 --frames 3 --seed 12
    # frames of layers 0, 0 and 1; and the first two alone
    python3 -c "
import sys; sys.path.insert(0, '$H'); from lrmoe_stream import read_stream, write_stream
fr = [(t, {**a, 'layer': l}) for (t, a), l in zip(read_stream('$T/g.lrm'), ['0', '0', '1'])]
write_stream('$T/in.lrm', fr); write_stream('$T/in0.lrm', fr[:2])"
    "$BIN/lrmoe-route" -k 4 -w "$T/w.lrm" -o "$T/ok.lrm" "$T/in.lrm"
    # a bit of layer 1's frame (its last tensor's data) flipped
    cp "$T/w.lrm" "$T/wb.lrm"
    python3 -c "
import sys; sys.path.insert(0, '$H'); import resident
a, e = resident.frames('$T/wb.lrm')[1]; f = open('$T/wb.lrm', 'r+b')
f.seek(e - 4); b = f.read(1); f.seek(e - 4); f.write(bytes([b[0] ^ 4]))"
    run "$BIN/lrmoe-route" -k 4 -w "$T/wb.lrm" -o "$T/o0.lrm" "$T/in0.lrm"
    assert_success
    run python3 -c "
import sys; sys.path.insert(0, '$H'); from lrmoe_stream import read_stream
a, b = read_stream('$T/ok.lrm'), read_stream('$T/o0.lrm')
assert len(b) == 2 and all(a[i][0][k].tobytes() == b[i][0][k].tobytes() for i in range(2) for k in b[i][0])
print('same')"
    assert_output same
    run "$BIN/lrmoe-route" -k 4 -w "$T/wb.lrm" -o "$T/o.lrm" "$T/in.lrm"
    assert_failure 1
    assert_output --regexp "^lrmoe-route: frame 2: .*$T/wb.lrm: frame 1: digest mismatch: the frame's CRC-64 is"
    # a zstd copy could only be read whole: the reader refuses the stream
    run "$BIN/lrmoe-cat" -o "$T/wbz.lrm" "$T/wb.lrm"
    assert_failure
    assert_output --partial "frame 1: digest mismatch"
}

@test "route, plan: with records by parts (lrmoe-stream(5)) route reads a layer's router_weight and expert_bias, plan its header, not its experts; a flipped bit in the experts is not their error, in what they read is, naming the part" {
    local H="$BATS_TEST_DIRNAME/helpers"
    # four layers of 48 MiB (E=16 D=1024 F=512 BF16: 16 MiB a matrix), the
    # records by parts that writers put before frames of 64 MiB or more
    "$BIN/lrmoe-gen" --experts 16 --topk 4 --hidden 1024 --ffn 512 --layers 4 --tokens 64 \
        --seed 3 --weights "$T/w0.lrm" --no-compress -o "$T/g.lrm"
    "$BIN/lrmoe-cat" --digests tensors --no-compress -o "$T/w.lrm" "$T/w0.lrm"
    python3 -c "
import sys; sys.path.insert(0, '$H'); from lrmoe_stream import *
b = open('$T/w.lrm', 'rb').read(); assert b[:8] == DIGEST_CRT
f = read_stream('$T/g.lrm', True); assert [a['layer'] for _, a, _ in f] == ['0', '1', '2', '3']
write_stream('$T/in2.lrm', f[2:3])"
    "$BIN/lrmoe-route" -k 4 --from-hidden -w "$T/w0.lrm" -o "$T/ref.lrm" "$T/in2.lrm"
    "$BIN/lrmoe-route" -k 4 --from-hidden -w "$T/w.lrm" -o "$T/o.lrm" "$T/in2.lrm"
    cmp "$T/o.lrm" "$T/ref.lrm"
    "$BIN/lrmoe-plan" -P 4 --weights "$T/w0.lrm" -o "$T/pref.lrm" "$T/ref.lrm"
    run python3 "$H/resident.py" evict "$T/w.lrm"
    [ "$output" = 0.000 ] || skip "this filesystem keeps the file's pages cached after POSIX_FADV_DONTNEED (resident fraction $output): cannot see which parts a process reads"
    "$BIN/lrmoe-plan" -P 4 --weights "$T/w.lrm" -o "$T/p.lrm" "$T/ref.lrm"
    "$BIN/lrmoe-view" --diff "$T/p.lrm" "$T/pref.lrm" | grep -q "the same"
    # plan: the headers' pages only (no read-around: MADV_RANDOM)
    run python3 "$H/resident.py" tensors "$T/w.lrm"
    echo "$output"
    assert_equal "$(grep -c ' w_[a-z]* 0\.00[0-9]$' <<< "$output")" 12
    "$BIN/lrmoe-route" -k 4 --from-hidden -w "$T/w.lrm" -o "$T/o.lrm" "$T/in2.lrm"
    run python3 "$H/resident.py" tensors "$T/w.lrm"
    echo "$output"
    # route: layer 2's router tensors, and of its experts at most the
    # read-around of a fault next to them (a few MiB of 16)
    assert_line "frame 2 router_weight 1.000"
    assert_line "frame 2 expert_bias 1.000"
    assert_equal "$(grep -c ' w_up 0\.0[0-9][0-9]$' <<< "$output")" 4
    for m in w_gate w_down; do
        assert_equal "$(grep -c " $m 0\.[0-4][0-9][0-9]$" <<< "$output")" 4
    done
    # a bit flipped in layer 2's w_up: route and plan run as before; the
    # CPU step, which computes with the experts, refuses it naming the part
    local at
    at=$(python3 -c "
import sys; sys.path.insert(0, '$H'); import resident
k, a, e = resident.frames('$T/w.lrm', tensors=True)[2][1]; assert k == 'w_up'; print((a + e) // 2)")
    cp "$T/w.lrm" "$T/wb.lrm"
    python3 -c "
f = open('$T/wb.lrm', 'r+b'); f.seek($at); b = f.read(1); f.seek($at); f.write(bytes([b[0] ^ 4]))"
    run "$BIN/lrmoe-route" -k 4 --from-hidden -w "$T/wb.lrm" -o "$T/o.lrm" "$T/in2.lrm"
    assert_success
    cmp "$T/o.lrm" "$T/ref.lrm"
    run "$BIN/lrmoe-plan" -P 4 --weights "$T/wb.lrm" -o "$T/p.lrm" "$T/ref.lrm"
    assert_success
    run "$BIN/lrmoe-exec" --phase forward --weights "$T/wb.lrm" -o "$T/x.lrm" "$T/p.lrm"
    assert_failure 1
    assert_output --regexp "^lrmoe-exec: frame 0: .*$T/wb.lrm: frame 2: tensor w_up: digest mismatch: its CRC-64 is [0-9a-f]{16}, the digest record says [0-9a-f]{16} \(the stream changed after it was written\)$"
    # a bit of layer 2's router_weight: route refuses it; plan does not read it
    at=$(python3 -c "
import sys; sys.path.insert(0, '$H'); import resident
k, a, e = resident.frames('$T/w.lrm', tensors=True)[2][3]; assert k == 'router_weight'; print(a + 5)")
    cp "$T/w.lrm" "$T/wb.lrm"
    python3 -c "
f = open('$T/wb.lrm', 'r+b'); f.seek($at); b = f.read(1); f.seek($at); f.write(bytes([b[0] ^ 4]))"
    run "$BIN/lrmoe-route" -k 4 --from-hidden -w "$T/wb.lrm" -o "$T/o.lrm" "$T/in2.lrm"
    assert_failure 1
    assert_output --regexp "^lrmoe-route: frame 0: .*$T/wb.lrm: frame 2: tensor router_weight: digest mismatch: "
    run "$BIN/lrmoe-plan" -P 4 --weights "$T/wb.lrm" -o "$T/p.lrm" "$T/ref.lrm"
    assert_success
    # a digit of layer 2's header (its ffn attribute: the header still
    # parses): both refuse it
    at=$(python3 -c "
import sys; sys.path.insert(0, '$H'); import resident
b = open('$T/w.lrm', 'rb').read(); a = resident.frames('$T/w.lrm')[2][0]
print(b.index(b'\"seed\":\"', a) + 8)")
    cp "$T/w.lrm" "$T/wb.lrm"
    python3 -c "
f = open('$T/wb.lrm', 'r+b'); f.seek($at); b = f.read(1); f.seek($at); f.write(bytes([b[0] ^ 4]))"
    for t in route plan; do
        if [ $t = route ]; then
            run "$BIN/lrmoe-route" -k 4 --from-hidden -w "$T/wb.lrm" -o "$T/o.lrm" "$T/in2.lrm"
        else
            run "$BIN/lrmoe-plan" -P 4 --weights "$T/wb.lrm" -o "$T/p.lrm" "$T/ref.lrm"
        fi
        assert_failure 1
        assert_output --regexp "^lrmoe-$t: frame 0: .*$T/wb.lrm: frame 2: header: digest mismatch: "
    done
}

@test "route: zstd-compressed input and output" {
    gen "$T/in.lrm" --tokens 100 --experts 16 --seed 14
    "$BIN/lrmoe-route" -k 2 --no-compress -o "$T/raw.lrm" "$T/in.lrm"
    zstd -q -c "$T/in.lrm" | "$BIN/lrmoe-route" -k 2 -o "$T/z.lrm"
    run python3 "$REF" check "$T/in.lrm" "$T/z.lrm" -k 2
    assert_success
}

@test "route: NaN logit is an error naming frame and token" {
    gen "$T/in.lrm" --tokens 100 --experts 16 --frames 3 --nan 1,37,5
    run "$BIN/lrmoe-route" -k 4 -o "$T/out.lrm" "$T/in.lrm"
    assert_failure 1
    assert_output "lrmoe-route: frame 1: token 37: router logit of expert 5 is NaN"
    run python3 "$REF" check "$T/in.lrm" "$T/out.lrm" -k 4
    assert_failure   # no trailer: the next stage fails too
    gen "$T/in.lrm" --tokens 100 --experts 128 --frames 2 --nan 0,99,127 --dtype BF16
    run "$BIN/lrmoe-route" -k 8 -@ 2 -r sigmoid -o "$T/out.lrm" "$T/in.lrm"
    assert_failure 1
    assert_output "lrmoe-route: frame 0: token 99: router logit of expert 127 is NaN"
}

@test "route: a token with only -inf logits is an error under softmax" {
    python3 - "$T/in.lrm" "$REF" <<'EOF'
import sys, os
sys.path.insert(0, os.path.dirname(sys.argv[2]))
import numpy as np
from lrmoe_stream import write_stream
x = np.zeros((10, 8), np.float32); x[6] = -np.inf
write_stream(sys.argv[1], [({"router_logits": x}, {})])
EOF
    run "$BIN/lrmoe-route" -k 2 -o "$T/out.lrm" "$T/in.lrm"
    assert_failure 1
    assert_output "lrmoe-route: frame 0: token 6: all router logits are -inf"
    run "$BIN/lrmoe-route" -k 2 -r sigmoid -o "$T/out.lrm" "$T/in.lrm"
    assert_success
}

@test "route: bad input exits 1 with one error line" {
    gen "$T/in.lrm" --tokens 20 --experts 16 --seed 15
    python3 "$REF" genw "$T/w12.lrm" --experts 12 --dim 8
    python3 "$REF" genw "$T/w16.lrm" --experts 16 --dim 8
    gen "$T/h.lrm" --tokens 20 --experts 16 --hidden 24
    check1() { # expected-message args...
        local msg=$1; shift
        run "$BIN/lrmoe-route" "$@" -o "$T/out.lrm"
        assert_failure 1
        assert_output "lrmoe-route: $msg"
    }
    check1 "frame 0: top-k 17 exceeds the 16 experts" -k 17 "$T/in.lrm"
    check1 "frame 0: 3 groups do not divide the 16 experts" -r sigmoid -G 3 --topk-groups 1 "$T/in.lrm"
    check1 "frame 0: top-k 8 exceeds the 4 experts in 1 of 4 groups" -r sigmoid -k 8 -G 4 --topk-groups 1 "$T/in.lrm"
    check1 "frame 0: 3 ranks do not divide the 16 experts" -k 2 --ep 3 "$T/in.lrm"
    check1 "frame 0: router_weight: shape [12,8] does not match router_logits [20,16]" -w "$T/w12.lrm" "$T/in.lrm"
    check1 "frame 0: router_weight: shape [16,8] does not match hidden [20,24] (expected [E,24])" -w "$T/w16.lrm" "$T/h.lrm"
    check1 "frame 0: missing tensor router_logits (or hidden with router_weight from --weights)" "$T/h.lrm"
    check1 "frame 0: missing tensor hidden (it comes from the input (lrmoe-gen, lrmoe-import or a dump from training))" -w "$T/w16.lrm" --from-hidden "$T/in.lrm"
    run "$BIN/lrmoe-route" -w "$T/nope.lrm" "$T/in.lrm" -o "$T/out.lrm"
    assert_failure 1
    assert_output --partial "nope.lrm"
    head -c 300 "$T/in.lrm" > "$T/cut.lrm"
    run "$BIN/lrmoe-route" -o "$T/out.lrm" "$T/cut.lrm"
    assert_failure 1
    assert_output --partial "truncated"
    [ "${#lines[@]}" -eq 1 ]
}

@test "route: usage errors exit 2" {
    gen "$T/in.lrm" --tokens 20 --experts 16
    for args in "-k 0" "-k x" "-r foo" "-r sigmoid -G 4 --topk-groups 5" "-G 4 --topk-groups 2" \
                "-r sigmoid -G 4" "--ep 0" "--from-hidden" "--bogus" "a b"; do
        run "$BIN/lrmoe-route" $args -o "$T/out.lrm" "$T/in.lrm"
        assert_failure 2
    done
    run "$BIN/lrmoe-route" -k 0 -o "$T/out.lrm" "$T/in.lrm"
    assert_output "lrmoe-route: --topk: 0 is out of range [1, 2147483647]"
    run "$BIN/lrmoe-route" -r sigmoid --groups 4 --topk-groups 5 -o "$T/out.lrm" "$T/in.lrm"
    assert_output "lrmoe-route: topk-groups 5 exceeds the 4 groups"
}

@test "route: man page passes mandoc lint" {
    command -v mandoc >/dev/null || skip "mandoc missing"
    run mandoc -T lint -W warning "$BATS_TEST_DIRNAME/../man/man1/lrmoe-route.1"
    assert_success
    assert_output ""
}

@test "route: lrmoe-gen streams (F32 and BF16 logits, skewed) match the reference" {
    [ -x "$BIN/lrmoe-gen" ] || skip "bin/lrmoe-gen not built"
    for dt in f32 bf16; do
        "$BIN/lrmoe-gen" --preset qwen3-30b-a3b --tokens 512 --hidden 8 --ffn 8 --steps 2 \
            --logits-dtype $dt --zipf 1.2 --seed 3 -o "$T/g.lrm"
        route_check "$T/g.lrm" -k 8 -n -P 8
        route_check "$T/g.lrm" -k 4 -r topk-softmax
    done
}

@test "route: K's source and an ignored expert_bias are recorded (route.topk_from, route.expert_bias) and noted with -v" {
    gen "$T/in.lrm" --tokens 32 --experts 8 --bias
    run sh -c "'$BIN/lrmoe-route' -v --no-compress '$T/in.lrm' 2>'$T/err' > '$T/o.lrm'"
    assert_success
    run cat "$T/err"
    assert_output --partial "has no topk attribute and -k was not given: K=8"
    assert_output --partial "expert_bias ignored by the softmax router"
    [ "$(grep -c note: "$T/err")" -eq 2 ]   # once each, not per frame
    run python3 -c "
import sys; sys.path.insert(0, '$BATS_TEST_DIRNAME/helpers'); from lrmoe_stream import read_stream
for t, a, d in read_stream('$T/o.lrm', True):
    assert a['route.topk_from'] == 'default' and a['route.expert_bias'] == 'ignored', a
print('ok')"
    assert_output "ok"
    # -k given, sigmoid router: the bias is used; without -v nothing is printed
    run sh -c "'$BIN/lrmoe-route' -k 2 -r sigmoid --no-compress '$T/in.lrm' 2>'$T/err' > '$T/o.lrm'"
    assert_success
    [ ! -s "$T/err" ]
    run python3 -c "
import sys; sys.path.insert(0, '$BATS_TEST_DIRNAME/helpers'); from lrmoe_stream import read_stream
t, a, d = read_stream('$T/o.lrm', True)[0]
print(a['route.topk_from'], a['route.expert_bias'])"
    assert_output "option used"
}

@test "route: --loads-only keeps expert_load (and rank_load) and the attributes; lrmoe-sim reads it like the full trace" {
    [ -x "$BIN/lrmoe-sim" ] || skip "bin/lrmoe-sim not built"
    gen "$T/in.lrm" --tokens 256 --experts 16 --frames 2
    "$BIN/lrmoe-route" -k 2 --ranks 4 --no-compress -o "$T/full.lrm" "$T/in.lrm"
    "$BIN/lrmoe-route" -k 2 --ranks 4 --loads-only --no-compress -o "$T/lo.lrm" "$T/in.lrm"
    run python3 -c "
import sys, numpy as np; sys.path.insert(0, '$BATS_TEST_DIRNAME/helpers'); from lrmoe_stream import read_stream
F = read_stream('$T/full.lrm', True); L = read_stream('$T/lo.lrm', True)
assert len(F) == len(L) == 2
for (tf, af, _), (tl, al, _) in zip(F, L):
    tf, tl = dict(tf), dict(tl)
    assert sorted(tl) == ['expert_load', 'rank_load'], sorted(tl)
    assert np.array_equal(tf['expert_load'], tl['expert_load']) and af == al
print('ok')"
    assert_output "ok"
    # the same report, but for the measured planner wall time (a line and its
    # p99); -D is the full trace's own (grad_output [T,2]): the loads-only one
    # no longer says it, and an option that disagrees with a frame is an error
    a=$("$BIN/lrmoe-sim" -P 4 -E 16 -D 2 --ffn 32 "$T/full.lrm" 2>&1 | sed "/wall time/,+1d")
    b=$("$BIN/lrmoe-sim" -P 4 -E 16 -D 2 --ffn 32 "$T/lo.lrm" 2>&1 | sed "/wall time/,+1d")
    [ -n "$a" ] && [ "$a" = "$b" ]
}
