#!/bin/sh
# The one prepared script for a lent GPU machine (H200, no network, no
# package registry): build there, run the GPU checks in order of value within
# one overall budget, and leave every result under $OUT as it finishes.
#
#   on this (CPU) machine, once:   sh tests/gpu/device-check.sh --prepare
#       copies the build dependencies the CUDA image may lack (headers and
#       shared libraries of zstd, jansson, glpk, OpenBLAS), the CUTLASS
#       grouped GEMM objects compiled here (make cutlass-objs: the device
#       machine has no CUTLASS headers and the compile takes minutes) and
#       the commit into build/gpu-carry (git-ignored, ~40 MB)
#   on the device machine:          sh tests/gpu/device-check.sh
#       (run tool: carry ["build/gpu-carry"], timeout_s 480)
#   sh tests/gpu/device-check.sh --targets BUILD
#       prints the make targets the device build asks for (tests/cuda.bats
#       builds the same list in its simulation of the device machine)
#
# Budget: DEVICE_CHECK_BUDGET seconds of work in all (default 420, for a
# 480 s limit). Steps, most valuable first, each under its own timeout (its
# cap, or what is left of the budget when less) and recorded in
# summary.txt the moment it ends; a step that fails or times out is reported
# and the next one runs; one that has no budget left is SKIPPED:
#   env      commit, ldconfig -p, the toolkit's library listing, the library
#            directories found for cudart, cuBLAS and NCCL (toolkit, else the
#            nvidia-* wheels of the image's python3), nvidia-smi   -> env.txt
#   build    make NODEPS=1 -k of the targets below (no deps step: no
#            apt-get without network)                             -> build.log
#   kernels  test-kernels: every kernel against its CPU reference
#            (the only step that executes kernels on their own) -> kernels.txt
#   ggemm    bench-ggemm: the CUTLASS grouped GEMM against the cuBLAS loop,
#            cuBLAS grouped and dense cuBLAS, T 4096/16384 x E 128/16, then
#            tests/gpu/ggemm-torch.py (torch._grouped_mm on the same
#            rows, when torch with CUDA is there)           -> ggemm.txt
#   bench    bench-gpu                                            -> bench.txt
#   exec     check-gpu.sh without its kernel part: lrmoe-exec --backend cuda
#            against --backend cpu, in-process, pipeline          -> exec.txt
#   devio    devio-test: the CUDA executor with device pointers on a stream
#            (lrmoe.torch's entry) = its host-pointer frames, bitwise
#                                                       (appended to exec.txt)
#   tcuda    tests/gpu/torch_cuda.py: lrmoe.torch on CUDA tensors (a patched
#            tiny Qwen3-MoE on the GPU) = the CPU path within 3e-2, then
#            tests/gpu/score_device.py: the backward's scores on the device
#            (lrmoe_exec_cuda_score) = the host's within 1e-6 relative;
#            with >= 2 GPUs tests/gpu/dist_cuda.py under torchrun (NCCL:
#            group= = the simulated run within 1e-5, shard=True = group=
#            bit for bit)                               (appended to exec.txt)
#   mpi      check-mpi-cuda.sh (probes for a GPU first)       -> mpi-cuda.txt
#   sass     division-free check of the built kernel objects (cuobjdump)
#                                                        (appended to build.log)
# DEVICE_CHECK_BUILD (build/dev), DEVICE_CHECK_JOBS (16) and
# DEVICE_CHECK_BUILD_S (the build's cap, 170) are for tests/cuda.bats's
# simulation of the device machine on a 2-core one.
# $OUT holds at most these 8 files (the run tool returns 8). The last line
# says PASS (exit 0) only when every step ran and passed; NOT ALL PASSED
# when one failed, timed out or was skipped, INCOMPLETE when none did but
# one could not run (no GPU, no mpirun, no cuobjdump).
set -u
cd "$(dirname "$0")/../.." || exit 1
CARRY=build/gpu-carry
B=${DEVICE_CHECK_BUILD:-build/dev}

targets() { # BUILD
    echo "bin/lrmoe-exec bin/lrmoe-gen bin/lrmoe-route bin/lrmoe-score bin/lrmoe-pack" \
        "bin/lrmoe-plan $1/tests/gpu/test-kernels $1/tests/gpu/bench-gpu $1/tests/gpu/devio-test" \
        "$1/tests/gpu/bench-ggemm" \
        "$1/liblrmoe.so.2" \
        "$1/liblrmoe-cuda.so.1"
}
if [ "${1:-}" = --targets ]; then
    targets "${2:-$B}"
    exit 0
fi

if [ "${1:-}" = --prepare ]; then
    rm -rf "$CARRY" && mkdir -p "$CARRY/include" "$CARRY/lib" || exit 1
    for h in zstd.h zdict.h zstd_errors.h jansson.h jansson_config.h glpk.h; do
        cp -L "/usr/include/$h" "$CARRY/include/" || exit 1
    done
    for h in cblas.h openblas_config.h cblas-openblas.h cblas_mangling.h f77blas.h; do
        [ -e "/usr/include/x86_64-linux-gnu/$h" ] && cp -L "/usr/include/x86_64-linux-gnu/$h" "$CARRY/include/"
    done
    # the libraries and what they pull in, each under its soname, plus the
    # unversioned name the linker looks for
    for so in libzstd.so.1 libjansson.so.4 libglpk.so.40 libopenblas.so.0 libcolamd.so.2 \
              libamd.so.2 libltdl.so.7 libgmp.so.10 libgfortran.so.5 \
              libsuitesparseconfig.so.5 libquadmath.so.0; do
        cp -L "/lib/x86_64-linux-gnu/$so" "$CARRY/lib/" || exit 1
        ln -sf "$so" "$CARRY/lib/${so%%.so.*}.so"
    done
    # the CUTLASS objects (Makefile: CUTLASS_PREBUILT), when this build has them
    if make -s --no-print-directory print-cutlass | grep -q '^HAVE_CUTLASS=1'; then
        make -s --no-print-directory -j2 cutlass-objs || exit 1
        mkdir -p "$CARRY/cutlass" || exit 1
        for o in $(make -s --no-print-directory print-cutlass | sed -n 's/.* GG_OBJ=//p'); do
            cp "$o" "$CARRY/cutlass/" || exit 1
        done
    else
        echo "device-check: --prepare: no CUTLASS headers here: the device build has no --gemm cutlass" >&2
    fi
    # the device machine gets the tree without .git: the commit travels here
    { git rev-parse HEAD && git status --porcelain --untracked-files=no | sed 's/^/  modified: /'; } \
        > "$CARRY/commit" 2>/dev/null || echo "unknown (--prepare outside a git checkout)" > "$CARRY/commit"
    du -sh "$CARRY"
    exit 0
fi

OUT=${OUT:-/tmp/lrmoe-gpu-out}
BUDGET=${DEVICE_CHECK_BUDGET:-420}
mkdir -p "$OUT" || exit 1
S="$OUT/summary.txt"
ENV="$OUT/env.txt"
: > "$S"
T0=$(date +%s)
END=$((T0 + BUDGET))
now() { echo $(( $(date +%s) - T0 )); }
note() { echo "$*" | tee -a "$S"; }
rc_all=0     # a step failed, timed out or was skipped
notrun=0     # a step could not run here (no GPU, no mpirun, not built)

# ---- env: what is there, written first (ldconfig -p and the toolkit's
# libraries before anything that could hang)
NVCC_BIN=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
CH=$(dirname "$(dirname "$NVCC_BIN")")
COMMIT=$(git rev-parse HEAD 2>/dev/null || head -1 "$CARRY/commit" 2>/dev/null)
{
    echo "== commit"
    echo "${COMMIT:-unknown (no .git, no $CARRY/commit)}"
    tail -n +2 "$CARRY/commit" 2>/dev/null
    echo "== ldconfig -p"
    ldconfig -p 2>&1
    echo "== toolkit $CH: libraries"
    for d in "$CH/lib64" "$CH/targets/x86_64-linux/lib" "$CH/lib"; do
        [ -d "$d" ] && { echo "-- $d"; ls -l "$d" 2>&1; }
    done
} > "$ENV" 2>&1
note "commit: ${COMMIT:-unknown}"
note "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
note "nvcc: $(timeout 20 "$NVCC_BIN" --version 2>&1 | tail -1)"

# Build dependencies: the system's, else the carried ones.
if [ -d "$CARRY" ]; then
    export CPATH="$PWD/$CARRY/include${CPATH:+:$CPATH}"
    export LIBRARY_PATH="$PWD/$CARRY/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$PWD/$CARRY/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# CUDA's libraries (tests/gpu/cuda-libs.sh): cudart from the toolkit;
# cuBLAS and NCCL from it, else from the image's nvidia-* wheels.
LIBLINKS="$PWD/$B/cuda-links"
. tests/gpu/cuda-libs.sh
cuda_libs "$CH" "$LIBLINKS" >> "$ENV" 2>&1
note "cuda: $CH (CUDA_LIBDIR ${CUDA_LIBDIR:-not found})"
for l in $CUDA_LIBS_FOUND; do note "lib $l"; done
[ -n "$CUDA_LIBS_MISSING" ] && note "lib NOT FOUND:$CUDA_LIBS_MISSING (the build will fail at link)"
{
    echo "== CPATH=${CPATH:-}"; echo "== LIBRARY_PATH=${LIBRARY_PATH:-}"
    echo "== LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    echo "== nvidia-smi"; timeout 20 nvidia-smi 2>&1
    echo "== cuobjdump: $(command -v cuobjdump || echo none), nvdisasm: $(command -v nvdisasm || echo none)"
    echo "== mpirun: $(command -v mpirun || echo none), mpicc: $(command -v mpicc || echo none)"
} >> "$ENV" 2>&1
note "step env: done ($(now)s)"

# ---- a step: NAME CAP LOG command... -> sets $src (exit status, 124 = timed
# out) and $sdt (seconds); returns 1 when there was no budget left for it
run_step() {
    name=$1; cap=$2; log=$3; shift 3
    left=$((END - $(date +%s)))
    if [ "$left" -lt 15 ]; then
        note "step $name: SKIPPED (no budget left: ${left}s of $BUDGET)"
        rc_all=1; src=; sdt=0
        return 1
    fi
    t=$cap; [ "$t" -gt "$left" ] && t=$left
    s0=$(date +%s)
    timeout -k 5 "$t" "$@" >> "$log" 2>&1
    src=$?
    sdt=$(( $(date +%s) - s0 ))
    [ "$src" = 137 ] && src=124
    [ "$src" = 124 ] && echo "(timed out after ${t}s)" >> "$log"
    return 0
}
verdict() { # name status detail: one line, written now
    note "step $1: $2 (${sdt}s, at $(now)s)${3:+: $3}"
    case $2 in PASS|ok) ;; "NOT RUN"*) notrun=1 ;; *) rc_all=1 ;; esac
}

# ---- build: the targets alone, not `all`; NODEPS=1: no tests/deps.sh (its
# apt-get has no network there); -k: what can be built is built
TARGETS=$(targets "$B")
: > "$OUT/build.log"
# shellcheck disable=SC2086
# the carried CUTLASS objects stand in for the compile (no headers there)
CUTLASS_ARG=
[ -f "$CARRY/cutlass/gg_000.o" ] && CUTLASS_ARG="CUTLASS_PREBUILT=$PWD/$CARRY/cutlass"
note "cutlass: ${CUTLASS_ARG:-no carried objects (the build looks for headers)}"
if run_step build "${DEVICE_CHECK_BUILD_S:-170}" "$OUT/build.log" make -k -j"${DEVICE_CHECK_JOBS:-16}" NODEPS=1 BUILD="$B" CUDA_HOME="$CH" \
        ${CUDA_LIBDIR:+CUDA_LIBDIR="$CUDA_LIBDIR"} $CUTLASS_ARG $TARGETS; then
    missing=
    for t in $TARGETS; do [ -e "$t" ] || missing="$missing $(basename "$t")"; done
    if [ "$src" = 0 ]; then verdict build ok
    elif [ "$src" = 124 ]; then verdict build TIMEOUT "not built:$missing"
    else verdict build FAIL "exit $src, not built:$missing"; fi
    [ "$src" = 0 ] || tail -15 "$OUT/build.log" | sed 's/^/     /' | tee -a "$S"
fi
TK="$B/tests/gpu/test-kernels"

# ---- kernels: every kernel against its CPU reference
: > "$OUT/kernels.txt"
if [ ! -x "$TK" ]; then
    note "step kernels: NOT RUN (test-kernels not built)"; notrun=1
elif run_step kernels 90 "$OUT/kernels.txt" "$TK"; then
    line=$(grep 'kernel checks passed' "$OUT/kernels.txt")
    nf=$(grep -c '^FAIL' "$OUT/kernels.txt")
    case $src in
    0) verdict kernels PASS "$line" ;;
    3) verdict kernels "NOT RUN" "$(head -1 "$OUT/kernels.txt")" ;;
    124) verdict kernels TIMEOUT "$(grep -c '^ok' "$OUT/kernels.txt") ok, $nf FAIL before it" ;;
    *) verdict kernels FAIL "exit $src, $nf FAIL lines; $line"
       grep '^FAIL\|^test-kernels:' "$OUT/kernels.txt" | head -20 | sed 's/^/     /' | tee -a "$S" ;;
    esac
fi

# ---- ggemm: the Hopper grouped GEMM against cuBLAS (loop, grouped, dense),
# then torch._grouped_mm on the same rows
: > "$OUT/ggemm.txt"
if [ ! -x "$B/tests/gpu/bench-ggemm" ]; then
    note "step ggemm: NOT RUN (bench-ggemm not built)"; notrun=1
elif run_step ggemm 75 "$OUT/ggemm.txt" "$B/tests/gpu/bench-ggemm" --counts "$B/ggemm-counts.txt"; then
    case $src in
    0) verdict ggemm ok "$(grep 'grouped/dense' "$OUT/ggemm.txt" | sed 's/ (cutlass-dev, four kinds)//' | tr '\n' ';')" ;;
    3|4) verdict ggemm "NOT RUN" "$(tail -1 "$OUT/ggemm.txt")" ;;
    124) verdict ggemm TIMEOUT "$(grep -c 'grouped/dense' "$OUT/ggemm.txt") of 4 shapes" ;;
    *) verdict ggemm FAIL "exit $src: $(grep -m3 'FAIL\|bench-ggemm:' "$OUT/ggemm.txt" | tr '\n' ';')" ;;
    esac
    if [ -s "$B/ggemm-counts.txt" ] && run_step torch 40 "$OUT/ggemm.txt" python3 tests/gpu/ggemm-torch.py \
            "$B/ggemm-counts.txt"; then
        case $src in
        0) verdict torch ok "$(grep -c '^ggemm-torch: T=' "$OUT/ggemm.txt") lines" ;;
        3) note "step torch: not run ($(grep -m1 'NOT run' "$OUT/ggemm.txt"))" ;;
        124) verdict torch TIMEOUT ;;
        *) verdict torch FAIL "exit $src" ;;
        esac
    fi
fi

# ---- bench: the GPU benchmark
: > "$OUT/bench.txt"
if [ ! -x "$B/tests/gpu/bench-gpu" ]; then
    note "step bench: NOT RUN (bench-gpu not built)"; notrun=1
elif run_step bench 90 "$OUT/bench.txt" "$B/tests/gpu/bench-gpu"; then
    case $src in
    0) verdict bench ok "$(tail -1 "$OUT/bench.txt")" ;;
    3) verdict bench "NOT RUN" "no device" ;;
    124) verdict bench TIMEOUT ;;
    *) verdict bench FAIL "exit $src: $(tail -1 "$OUT/bench.txt")" ;;
    esac
fi

# ---- exec: lrmoe-exec --backend cuda against the CPU backend (check-gpu.sh
# without its kernel part, which ran above)
: > "$OUT/exec.txt"
if run_step exec 120 "$OUT/exec.txt" env BUILD="$B" HAVE_CUDA=1 LRMOE_CHECK_SKIP_KERNELS=1 \
        sh tests/gpu/check-gpu.sh; then
    nok=$(grep -c '^ok' "$OUT/exec.txt"); nf=$(grep -c '^FAIL' "$OUT/exec.txt")
    if grep -q 'NOT run' "$OUT/exec.txt"; then verdict exec "NOT RUN" "$(grep -m1 'NOT run' "$OUT/exec.txt")"
    elif [ "$src" = 0 ] && grep -q '^check-gpu: PASS' "$OUT/exec.txt"; then verdict exec PASS "$nok ok"
    elif [ "$src" = 124 ]; then verdict exec TIMEOUT "$nok ok, $nf FAIL before it"
    else verdict exec FAIL "exit $src, $nok ok, $nf FAIL"
         grep '^FAIL' "$OUT/exec.txt" | head -20 | sed 's/^/     /' | tee -a "$S"; fi
fi

# ---- devio: the CUDA executor's device-pointer entry (lrmoe.torch's path)
# against its host-pointer frames, bitwise (appended to exec.txt)
DV="$B/tests/gpu/devio-test"
if [ ! -x "$DV" ]; then
    note "step devio: NOT RUN (devio-test not built)"; notrun=1
elif echo "== devio-test" >> "$OUT/exec.txt" && run_step devio 30 "$OUT/exec.txt" "$DV"; then
    case $src in
    0) verdict devio PASS "$(grep -m1 '^devio: PASS' "$OUT/exec.txt")" ;;
    3) verdict devio "NOT RUN" "no device" ;;
    124) verdict devio TIMEOUT ;;
    *) verdict devio FAIL "exit $src: $(grep -m1 '^devio: FAIL' "$OUT/exec.txt")" ;;
    esac
fi

# ---- tcuda: lrmoe.torch on CUDA tensors (one process, simulated ranks on
# one device: a patched tiny Qwen3-MoE on cuda against the same on the CPU,
# tests/gpu/torch_cuda.py; 3e-2 of max|cpu|: the CUDA GEMMs' BF16 operands,
# as check-gpu.sh bounds them). Needs torch with CUDA and transformers on
# the image (exit 3: not run). With >= 2 GPUs also patch(group=) on CUDA
# tensors under torchrun (NCCL, tests/gpu/dist_cuda.py, 1e-5 of max|ref|
# against the simulated run on each rank's GPU; its shard=True cases bit for
# bit the unsharded group run, 1/P of the expert parameter bytes; skipped
# with a message on fewer GPUs).
echo "== torch_cuda" >> "$OUT/exec.txt"
if run_step tcuda 240 "$OUT/exec.txt" env LRMOE_LIBRARY="$PWD/$B/liblrmoe.so.2" \
        sh -c 'python3 tests/gpu/torch_cuda.py cuda 3e-2 && python3 tests/gpu/score_device.py cuda 1e-6 &&
               if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
                   (cd tests/gpu && torchrun --standalone --nproc-per-node 2 dist_cuda.py cuda 1e-5)
               else echo "dist_cuda: skipped: fewer than 2 GPUs"; fi'; then
    case $src in
    0) verdict tcuda PASS "$(grep -m1 '^torch_cuda (cuda): PASS' "$OUT/exec.txt"); $(grep -m1 '^score_device (cuda): PASS' "$OUT/exec.txt"); $(grep -m1 -E '^dist_cuda( \(cuda\): PASS|: skipped)' "$OUT/exec.txt")" ;;
    3) verdict tcuda "NOT RUN" "$(grep -m1 '^torch_cuda: NOT RUN' "$OUT/exec.txt")" ;;
    124) verdict tcuda TIMEOUT ;;
    *) verdict tcuda FAIL "exit $src"
       grep '^FAIL' "$OUT/exec.txt" | head -10 | sed 's/^/     /' | tee -a "$S" ;;
    esac
fi

# ---- mpi: the CUDA backend under mpirun -np 2 (issue 18)
: > "$OUT/mpi-cuda.txt"
if run_step mpi 90 "$OUT/mpi-cuda.txt" env BUILD="$B" sh tests/gpu/check-mpi-cuda.sh; then
    if grep -q '^check-mpi-cuda: NOT run' "$OUT/mpi-cuda.txt"; then
        verdict mpi "NOT RUN" "$(grep -m1 '^check-mpi-cuda: NOT run' "$OUT/mpi-cuda.txt" | sed 's/^check-mpi-cuda: NOT run //')"
    elif [ "$src" = 0 ] && grep -q '^check-mpi-cuda: PASS' "$OUT/mpi-cuda.txt"; then
        verdict mpi PASS "$(grep -c '^ok' "$OUT/mpi-cuda.txt") ok, $(grep -m1 'exec.gpu_comm' "$OUT/mpi-cuda.txt" | sed 's/^ *//')"
    elif [ "$src" = 124 ]; then verdict mpi TIMEOUT
    else verdict mpi FAIL "exit $src"
         grep '^FAIL' "$OUT/mpi-cuda.txt" | head -20 | sed 's/^/     /' | tee -a "$S"; fi
fi

# ---- sass: no integer division left in the memory-bound kernels' machine code
if command -v cuobjdump >/dev/null 2>&1; then
    echo "== check-divfree (SASS)" >> "$OUT/build.log"
    if run_step sass 30 "$OUT/build.log" python3 tests/gpu/divfree.py --sass "$B"/kernels/kcu.o \
            "$B"/kernels/gemm.o; then
        if [ "$src" = 0 ]; then verdict sass PASS "$(tail -1 "$OUT/build.log")"
        else verdict sass FAIL "$(tail -1 "$OUT/build.log")"; fi
    fi
else
    note "step sass: NOT RUN (no cuobjdump)"; notrun=1
fi

echo "----"
grep 'grouped/dense\|agreement' "$OUT/ggemm.txt"
cat "$OUT/bench.txt"
echo "----"
if [ $rc_all != 0 ]; then v="NOT ALL PASSED"
elif [ $notrun != 0 ]; then v="INCOMPLETE (a step could not run here; no pass claimed)"
else v=PASS; fi
note "device-check: $v ($(now)s of $BUDGET)"
[ "$v" = PASS ]
