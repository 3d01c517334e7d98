#!/bin/sh
# make check-gpu: the CUDA backend against the CPU.
#  1. every kernel against its CPU reference (test-kernels: random and edge
#     sizes, tolerance per kernel stated in tests/gpu/test-kernels.cu);
#  2. lrmoe-exec --backend cuda against --backend cpu on the same streams:
#     forward, and backward full, masked and compact (LOOP and GROUPED GEMMs,
#     P = 1, 3, 4, BF16 and F32 storage).
#  3. the in-process forward through liblrmoe.so.2 and its CUDA module
#     (tests/gpu/inproc.py) against lrmoe-exec's, with and without torch
#     imported first.
# Exit 0 when every check ran and passed, 1 when any check fails, and 77
# (automake's "skipped") without CUDA in the build or without a usable
# device: it says so and claims no pass. `make check-gpu` then fails too
# (make exits 2 for any failing recipe, "Error 77" in its message); scripts
# that must tell "not run" from "failed" run this script and test for 77.
#
# LRMOE_CHECK_SKIP_KERNELS=1: part 1 left out (tests/gpu/device-check.sh
# runs test-kernels as a step of its own).
# LRMOE_CHECK_FAKE=DIR/lrmoe-exec-fake (tests/gpu/build-fake.sh): GPU-free,
# part 2 only, on a lrmoe-exec whose CUDA backend runs the kernels' CPU
# references (a check of exec_cuda.cu's data path, not of the kernels).
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build}
TK="$BUILD/tests/gpu/test-kernels"
EXEC=bin/lrmoe-exec
REF=tests/helpers/exec_ref.py
FAKE=${LRMOE_CHECK_FAKE:-}
DTS="bf16 f32"
PS="1 3 4"

if [ -n "$FAKE" ]; then
    EXEC=$FAKE
    DTS=bf16
    PS=${LRMOE_CHECK_PS:-3 4}
    echo "check-gpu: FAKE device (kernels replaced by their CPU references): data path only"
elif [ "$HAVE_CUDA" != 1 ] || [ ! -x "$TK" ]; then
    echo "check-gpu: this build has no CUDA (nvcc not found): GPU checks NOT run (exit 77)"
    exit 77
fi
fail=0
if [ -z "$FAKE" ]; then
    probe=$("$TK" --probe)
    case $? in
    0) ;;
    3) echo "check-gpu: $probe: GPU checks NOT run (no pass claimed, exit 77)"; exit 77 ;;
    *) echo "check-gpu: device probe failed: $probe"; exit 1 ;;
    esac
    if [ "${LRMOE_CHECK_SKIP_KERNELS:-0}" = 1 ]; then
        echo "== kernels vs CPU references: skipped (LRMOE_CHECK_SKIP_KERNELS=1, run on their own)"
    else
        echo "== kernels vs CPU references"
        # bounded, so a hung kernel still leaves time for the exec checks below
        to=; command -v timeout >/dev/null 2>&1 && to="timeout ${LRMOE_TK_TIMEOUT:-120}"
        $to "$TK"; trc=$?
        [ $trc = 124 ] && echo "FAIL test-kernels: timed out"
        [ $trc = 0 ] || fail=1
    fi
fi

echo "== lrmoe-exec --backend cuda vs --backend cpu"
T=$(mktemp -d "${TMPDIR:-/tmp}/check-gpu.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
GRADS="grad_hidden grad_w_gate grad_w_up grad_w_down grad_topk_weights"
FWD="output pair_out phi_sqnorm saved_gate saved_up"
# Tolerance (max|cuda-cpu| / max|cpu| per tensor): the CPU runs F32 GEMMs on
# F32 copies of the operands, CUDA rounds every GEMM operand to BF16 (2^-9
# relative each) through up to three chained GEMMs and SwiGLU: expect 1e-3 to
# 1e-2 (bf16-operand range); 3e-2 bounds it, while a wrong row, expert or
# segment is an O(1) error. pair_rank is integer: exact.
TOL=3e-2

step() { # name, command...
    name=$1; shift
    if "$@" > "$T/log" 2>&1; then
        echo "ok   $name"
    else
        echo "FAIL $name"; sed 's/^/     /' "$T/log"; fail=1
    fi
}
cmp() { python3 "$REF" compare "$@"; }
# --gemm cutlass too where the module has the CUTLASS grouped GEMM
GEMMS="loop grouped"
nm "$BUILD/liblrmoe-cuda.so.1" 2>/dev/null | grep -q kcu_gg_sm90_0 && GEMMS="$GEMMS cutlass"
echo "== GEMM implementations compared: $GEMMS"

for dt in $DTS; do
    python3 "$REF" make "$T/in.lrm" "$T/w.lrm" --T 301 --E 16 --K 4 --D 64 --F 48 \
        --skew 2 --zero-experts 1 --dtype "$dt" --seed 7 || exit 1
    python3 "$REF" plan "$T/in.lrm" "$T/pl.lrm" --P 4 --replicas --seed 3 || exit 1
    for P in $PS; do
        src="$T/in.lrm"; [ "$P" = 4 ] && src="$T/pl.lrm"   # P=4: replicas and split experts
        tag="$dt P=$P"
        step "forward cpu $tag" $EXEC --phase forward --weights "$T/w.lrm" -P "$P" --no-compress -o "$T/fc.lrm" "$src"
        step "forward cuda $tag" $EXEC --phase forward --backend cuda --weights "$T/w.lrm" -P "$P" --no-compress -o "$T/fg.lrm" "$src"
        step "forward cuda = cpu $tag" cmp "$T/fg.lrm" "$T/fc.lrm" $FWD --tol $TOL
        step "pair_rank cuda = cpu $tag" cmp "$T/fg.lrm" "$T/fc.lrm" pair_rank --tol 0
        # backward on the CPU forward's stream, so both see identical inputs
        for gi in $GEMMS; do
            step "backward full cpu $tag" $EXEC --phase backward --weights "$T/w.lrm" --no-compress -o "$T/bc.lrm" "$T/fc.lrm"
            step "backward full cuda $tag $gi" $EXEC --phase backward --backend cuda --gemm $gi --weights "$T/w.lrm" --no-compress -o "$T/bg.lrm" "$T/fc.lrm"
            step "backward full cuda = cpu $tag $gi" cmp "$T/bg.lrm" "$T/bc.lrm" $GRADS --tol $TOL
            step "backward full cuda = float64 reference $tag $gi" python3 "$REF" check-bwd "$T/bg.lrm" "$T/w.lrm" --tol $TOL
            [ "$P" = 4 ] || break
        done
        [ "$P" = 4 ] || continue
        python3 "$REF" keep "$T/fc.lrm" "$T/k.lrm" --rate 0.6 || exit 1
        step "backward masked cpu $tag" $EXEC --phase backward --mode masked --weights "$T/w.lrm" --no-compress -o "$T/mc.lrm" "$T/k.lrm"
        step "backward masked cuda $tag" $EXEC --phase backward --mode masked --backend cuda --weights "$T/w.lrm" --no-compress -o "$T/mg.lrm" "$T/k.lrm"
        step "backward masked cuda = cpu $tag" cmp "$T/mg.lrm" "$T/mc.lrm" $GRADS --tol $TOL
        for sc in "" "--scatter 9"; do
            # shellcheck disable=SC2086
            python3 "$REF" pack "$T/k.lrm" "$T/p.lrm" --P 4 $sc || exit 1
            step "backward compact cpu $tag $sc" $EXEC --phase backward --mode compact --weights "$T/w.lrm" --no-compress -o "$T/cc.lrm" "$T/p.lrm"
            step "backward compact cuda $tag $sc" $EXEC --phase backward --mode compact --backend cuda --weights "$T/w.lrm" --no-compress -o "$T/cg.lrm" "$T/p.lrm"
            step "backward compact cuda = cpu $tag $sc" cmp "$T/cg.lrm" "$T/cc.lrm" $GRADS --tol $TOL
            # compact and masked run the same retained rows: same GEMM
            # operands on the device, only the row grouping differs
            step "backward compact cuda = masked cuda $tag $sc" cmp "$T/cg.lrm" "$T/mg.lrm" $GRADS --tol 1e-3
        done
    done
done

# in-process: liblrmoe.so.2 loads the CUDA module on the first CUDA call;
# its forward equals the tool's (f32, P=4: the last of the loop above), and
# again with torch imported first (the module then on torch's CUDA libraries)
if [ -n "$FAKE" ]; then
    echo "skip in-process: fake device"
elif [ -f "$BUILD/liblrmoe-cuda.so.1" ] && [ -f "$BUILD/liblrmoe.so.2" ]; then
    for first in plain torch; do
        step "in-process forward cuda (liblrmoe.so.2 + module, $first) = lrmoe-exec cuda" \
            env LRMOE_LIBRARY="$BUILD/liblrmoe.so.2" PYTHONPATH=lib/python \
            python3 tests/gpu/inproc.py "$T/pl.lrm" "$T/w.lrm" "$T/fg.lrm" 4 cuda $first
    done
else
    echo "skip in-process: $BUILD/liblrmoe.so.2 or $BUILD/liblrmoe-cuda.so.1 not built"
fi

# the real pipeline: gen | route | exec | score | pack | exec compact, cuda vs cpu
if [ -n "$FAKE" ]; then
    echo "skip pipeline: fake device"
elif [ -x bin/lrmoe-gen ] && [ -x bin/lrmoe-route ] && [ -x bin/lrmoe-score ] && [ -x bin/lrmoe-pack ]; then
    bin/lrmoe-gen --tokens 512 --experts 16 --topk 4 --hidden 128 --ffn 64 --dtype bf16 \
        --skew hot:50:2 --weights "$T/gw.lrm" --seed 5 --no-compress |
        bin/lrmoe-route -k 4 --no-compress |
        $EXEC --phase forward --backend cuda --weights "$T/gw.lrm" -P 4 --no-compress |
        bin/lrmoe-score --drop 30 --no-compress -o "$T/gs.lrm" && ok=1 || ok=0
    if [ $ok = 1 ]; then
        echo "ok   pipeline gen | route | exec cuda | score"
        bin/lrmoe-pack -P 4 --no-compress -o "$T/gp.lrm" "$T/gs.lrm" || fail=1
        step "pipeline compact cpu" $EXEC --phase backward --mode compact --weights "$T/gw.lrm" --no-compress -o "$T/gc.lrm" "$T/gp.lrm"
        step "pipeline compact cuda" $EXEC --phase backward --mode compact --backend cuda --weights "$T/gw.lrm" --no-compress -o "$T/gg.lrm" "$T/gp.lrm"
        step "pipeline compact cuda = cpu" cmp "$T/gg.lrm" "$T/gc.lrm" $GRADS --tol $TOL
    else
        echo "FAIL pipeline gen | route | exec cuda | score"; fail=1
    fi
else
    echo "skip pipeline: bin/lrmoe-gen, -route, -score or -pack not built"
fi

# a bad pack is refused by the CUDA backend as by the CPU one
python3 - "$T/p.lrm" "$T/bad.lrm" <<'EOF' || fail=1
import sys; sys.path.insert(0, "tests/helpers")
from lrmoe_stream import read_stream, write_stream
t, a, d = read_stream(sys.argv[1], True)[0]
t = dict(t); p = t["pack_pair"].copy(); p[1] = p[0]; t["pack_pair"] = p
write_stream(sys.argv[2], [(t, a, d)])
EOF
if $EXEC --phase backward --mode compact --backend cuda --weights "$T/w.lrm" --no-compress \
        -o "$T/x.lrm" "$T/bad.lrm" 2> "$T/err"; then
    echo "FAIL cuda accepted a pair packed twice"; fail=1
elif grep -q "pack_pair" "$T/err"; then
    echo "ok   cuda refuses a pair packed twice: $(cat "$T/err")"
else
    echo "FAIL unexpected error: $(cat "$T/err")"; fail=1
fi

if [ -n "$FAKE" ]; then
    if [ $fail = 0 ]; then echo "check-gpu (fake device): data path PASS"; else echo "check-gpu (fake device): FAIL"; fi
elif [ $fail = 0 ]; then echo "check-gpu: PASS"; else echo "check-gpu: FAIL"; fi
exit $fail
