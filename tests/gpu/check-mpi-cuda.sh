#!/bin/sh
# The CUDA backend under mpirun (one rank per process, lib/exec_mpi.c): two
# ranks sharing the one GPU of the device machine (issue 18), against the
# CPU backend and against the in-process CUDA run (-P 2) of the same frames:
# forward, backward full and compact, plain EP and an llep plan (helpers:
# weights and weight gradients point to point). Prints one line per check
# and a verdict line "check-mpi-cuda: PASS|FAIL|NOT run (why)".
#
#   sh tests/gpu/check-mpi-cuda.sh          (run by tests/gpu/device-check.sh)
#   LRMOE_CHECK_FAKE=DIR/lrmoe-exec-fake    a GPU-free rehearsal on the fake
#       device (tests/gpu/build-fake.sh with FAKE_MPI=1): the data path only
#   MPI_CUDA_TOKENS=N                       tokens per frame (default 4096)
#   BUILD=DIR                               where test-kernels (the GPU probe) is
# Without a usable GPU (probed first) it says NOT run and exits 0.
#
# Expected: mpirun = in-process CUDA bit for bit (each rank's GEMMs see the
# same rows in the same order on the same device; tol 0), CUDA = CPU within
# check-gpu.sh's BF16-operand tolerance 3e-2.
set -u
cd "$(dirname "$0")/../.." || exit 1
EXEC=${LRMOE_CHECK_FAKE:-bin/lrmoe-exec}
REF=tests/helpers/exec_ref.py
TOKENS=${MPI_CUDA_TOKENS:-4096}
TOL=3e-2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="timeout 120 mpirun --oversubscribe --mca btl tcp,self"

notrun() { echo "check-mpi-cuda: NOT run ($*)"; exit 0; }
# a GPU first (unless on the fake device): test-kernels --probe of $BUILD
# (default build), else nvidia-smi -L
if [ -z "${LRMOE_CHECK_FAKE:-}" ]; then
    TK="${BUILD:-build}/tests/gpu/test-kernels"
    if [ -x "$TK" ]; then
        probe=$("$TK" --probe 2>&1) || notrun "no usable GPU: $probe"
    elif ! nvidia-smi -L >/dev/null 2>&1; then
        notrun "no GPU (nvidia-smi -L fails, no $TK to probe with)"
    fi
fi
command -v mpirun >/dev/null 2>&1 || notrun "mpirun not installed on this machine"
for t in gen route plan score pack; do
    [ -x bin/lrmoe-$t ] || notrun "bin/lrmoe-$t not built"
done
[ -x "$EXEC" ] || notrun "$EXEC not built"
T=$(mktemp -d "${TMPDIR:-/tmp}/check-mpi-cuda.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
if $MPIRUN -np 1 "$EXEC" --phase forward --weights "$T/x" "$T/x" 2>&1 |
    grep -q "MPI support is not built"; then
    notrun "$EXEC was built without MPI (no mpicc/libopenmpi-dev at build time)"
fi

fail=0
step() { # name, command...
    name=$1; shift
    if "$@" > "$T/log" 2>&1; then
        echo "ok   $name"
    else
        echo "FAIL $name"; sed 's/^/     /' "$T/log" | tail -20; fail=1
    fi
}
cmp() { python3 "$REF" compare "$@"; }
# seconds of the command, appended to $T/walls as "NAME SECONDS"
timed() {
    n=$1; shift
    t0=$(python3 -c 'import time; print(time.monotonic())')
    "$@"; r=$?
    python3 -c "import time; print('$n', round(time.monotonic() - $t0, 3))" >> "$T/walls"
    return $r
}
attr() { # file key: the attribute of frame 0
    python3 -c "import sys; sys.path.insert(0, 'tests/helpers'); from lrmoe_stream import read_stream
print(read_stream('$1')[0][1].get('$2', '-'))"
}
FWD="output pair_out phi_sqnorm saved_gate saved_up"
GRADS="grad_hidden grad_w_gate grad_w_up grad_w_down grad_topk_weights"
R="--no-compress"

echo "check-mpi-cuda: $EXEC, mpirun -np 2 --backend cuda on $(nvidia-smi -L 2>/dev/null | wc -l) GPU(s), tokens $TOKENS, E 8, K 2, D 256, F 512, bf16"
bin/lrmoe-gen --tokens "$TOKENS" --experts 8 --topk 2 --hidden 256 --ffn 512 --dtype bf16 \
    --skew hot:50:2 --weights "$T/w.lrm" --seed 11 $R |
    bin/lrmoe-route -k 2 $R -o "$T/r.lrm" || exit 1
bin/lrmoe-plan --planner llep --ranks 2 --min-chunk 16 $R "$T/r.lrm" > "$T/llep.lrm" || exit 1
for case in none llep; do
    if [ $case = none ]; then in="$T/r.lrm"; PP="-P 2"; else in="$T/llep.lrm"; PP=; fi
    tag="P=2 $case"
    # shellcheck disable=SC2086
    step "forward cpu $tag" $EXEC --phase forward --weights "$T/w.lrm" $PP $R -o "$T/fc.lrm" "$in"
    # shellcheck disable=SC2086
    step "forward cuda in-process $tag" timed "in.f.$case" $EXEC --phase forward --backend cuda \
        --weights "$T/w.lrm" $PP $R -o "$T/f1.lrm" "$in"
    step "forward cuda mpirun -np 2 $tag" timed "mpi.f.$case" $MPIRUN -np 2 $EXEC --phase forward \
        --backend cuda --weights "$T/w.lrm" $R -o "$T/f2.lrm" "$in"
    echo "     exec.gpu_comm $(attr "$T/f2.lrm" exec.gpu_comm), a2a_bytes $(attr "$T/f2.lrm" exec.forward.a2a_bytes), p2p_bytes $(attr "$T/f2.lrm" exec.forward.p2p_bytes)"
    step "forward mpirun = in-process cuda (bit for bit) $tag" cmp "$T/f2.lrm" "$T/f1.lrm" $FWD pair_rank --tol 0
    step "forward mpirun cuda = cpu $tag" cmp "$T/f2.lrm" "$T/fc.lrm" $FWD --tol $TOL
    # backward on the CPU forward's stream, so every run sees identical inputs
    if [ $case = none ]; then
        bin/lrmoe-score --drop 30 $R "$T/fc.lrm" > "$T/s.lrm" &&
            bin/lrmoe-pack -P 2 $R "$T/s.lrm" > "$T/pk.lrm" || fail=1
    else
        bin/lrmoe-score $R "$T/fc.lrm" > "$T/s.lrm" && bin/lrmoe-pack $R "$T/s.lrm" > "$T/pk.lrm" ||
            fail=1
    fi
    for m in full compact; do
        src="$T/s.lrm"; [ $m = compact ] && src="$T/pk.lrm"
        step "backward $m cpu $tag" $EXEC --phase backward --mode $m --weights "$T/w.lrm" $R \
            -o "$T/bc.lrm" "$src"
        step "backward $m cuda in-process $tag" timed "in.b$m.$case" $EXEC --phase backward \
            --mode $m --backend cuda --weights "$T/w.lrm" $R -o "$T/b1.lrm" "$src"
        step "backward $m cuda mpirun -np 2 $tag" timed "mpi.b$m.$case" $MPIRUN -np 2 $EXEC \
            --phase backward --mode $m --backend cuda --weights "$T/w.lrm" $R -o "$T/b2.lrm" "$src"
        step "backward $m mpirun = in-process cuda (bit for bit) $tag" cmp "$T/b2.lrm" "$T/b1.lrm" $GRADS --tol 0
        step "backward $m mpirun cuda = cpu $tag" cmp "$T/b2.lrm" "$T/bc.lrm" $GRADS --tol $TOL
    done
done
echo "wall seconds of each command (mpirun start-up included):"
sed 's/^/     /' "$T/walls" 2>/dev/null
if [ $fail = 0 ]; then echo "check-mpi-cuda: PASS"; else echo "check-mpi-cuda: FAIL"; fi
exit $fail
