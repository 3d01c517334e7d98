#!/bin/sh
# The one prepared script for a lent GPU machine (H200): build there, run the
# GPU checks (make check-gpu) and the GPU benchmark, write everything under
# $OUT, all within 8 minutes.
#
#   on this (CPU) machine, once:   sh tests/gpu/device-check.sh --prepare
#       copies the build dependencies the CUDA image may lack (headers and
#       shared libraries of zstd, jansson, glpk, OpenBLAS) into
#       build/gpu-carry (git-ignored, ~40 MB)
#   on the device machine:          sh tests/gpu/device-check.sh
#       (run tool: carry ["build/gpu-carry"], timeout_s 540)
#
# Results: $OUT/summary.txt (short table, also printed last), build.log,
# check-gpu.txt, bench-gpu.txt, mpi-cuda.txt (tests/gpu/check-mpi-cuda.sh),
# nvidia-smi.txt. Exit 0 when the checks pass.
set -u
cd "$(dirname "$0")/../.." || exit 1
CARRY=build/gpu-carry

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
    du -sh "$CARRY"
    exit 0
fi

OUT=${OUT:-/tmp/lrmoe-gpu-out}
mkdir -p "$OUT"
S="$OUT/summary.txt"
: > "$S"
note() { echo "$*" | tee -a "$S"; }
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 ))s; }

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
note "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
note "nvcc: $(nvcc --version 2>&1 | tail -1)"

# Build dependencies: the system's, else the carried ones.
if [ -d "$CARRY" ]; then
    export CPATH="$PWD/$CARRY/include${CPATH:+:$CPATH}"
    export LIBRARY_PATH="$PWD/$CARRY/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$PWD/$CARRY/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# CUDA: the nvcc on PATH, else /usr/local/cuda; its library directory (the
# Makefile looks in lib64 and targets/x86_64-linux/lib only; a toolkit laid
# out from wheels has lib/).
NVCC_BIN=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
CH=$(dirname "$(dirname "$NVCC_BIN")")
CLD=
for d in "$CH/lib64" "$CH/targets/x86_64-linux/lib" "$CH/lib"; do
    if [ -e "$d/libcudart.so" ]; then CLD=$d; break; fi
done
note "cuda: $CH (libraries: ${CLD:-not found})"
# NCCL: CUDA's own, else the one of the nvidia-nccl wheel PyTorch brings.
have_nccl=0
for d in "$CH/lib64" "$CH/targets/x86_64-linux/lib" "$CH/lib"; do
    ls "$d"/libnccl.so* >/dev/null 2>&1 && have_nccl=1
done
if [ $have_nccl = 0 ]; then
    ND=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)
    if [ -n "$ND" ]; then
        [ -e "$ND/lib/libnccl.so" ] || { mkdir -p "$OUT/nccl" && ln -sf "$ND"/lib/libnccl.so.* "$OUT/nccl/libnccl.so" && ND2="$OUT/nccl"; }
        export CPATH="$ND/include${CPATH:+:$CPATH}"
        export LIBRARY_PATH="${ND2:-$ND/lib}:$ND/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
        export LD_LIBRARY_PATH="$ND/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        note "nccl: from the wheel at $ND"
    else
        note "nccl: not found (build will fail at link)"
    fi
fi

B=build/dev
TARGETS="bin/lrmoe-exec bin/lrmoe-gen bin/lrmoe-route bin/lrmoe-score bin/lrmoe-pack bin/lrmoe-plan $B/tests/gpu/test-kernels $B/tests/gpu/bench-gpu $B/liblrmoe.so.1 $B/liblrmoe-cuda.so.1"
# the targets themselves, not `all`: deps-build would try apt-get, which has
# no network there
if timeout 150 make -j16 BUILD=$B CUDA_HOME="$CH" ${CLD:+CUDA_LIBDIR=$CLD} $TARGETS > "$OUT/build.log" 2>&1; then
    note "build: ok ($(el))"
else
    note "build: FAILED ($(el)); last lines:"
    tail -15 "$OUT/build.log" | tee -a "$S"
    exit 1
fi

rc=0
timeout 230 env BUILD=$B HAVE_CUDA=1 sh tests/gpu/check-gpu.sh > "$OUT/check-gpu.txt" 2>&1
crc=$?
if [ $crc = 0 ] && grep -q '^check-gpu: PASS' "$OUT/check-gpu.txt"; then
    note "check-gpu: PASS ($(el)): $(grep -c '^ok' "$OUT/check-gpu.txt") ok lines"
elif grep -q 'NOT run' "$OUT/check-gpu.txt"; then
    rc=1
    note "check-gpu: NOT RUN ($(el)): $(grep 'NOT run' "$OUT/check-gpu.txt")"
else
    rc=1
    note "check-gpu: FAIL (exit $crc, 124 = timeout) ($(el)):"
    grep -E '^(FAIL|check-gpu)' "$OUT/check-gpu.txt" | head -20 | tee -a "$S"
fi
grep 'kernel checks passed' "$OUT/check-gpu.txt" | tee -a "$S"

if timeout 90 "$B/tests/gpu/bench-gpu" > "$OUT/bench-gpu.txt" 2>&1; then
    note "bench-gpu: ran ($(el))"
else
    note "bench-gpu: FAILED or timeout ($(el))"
    rc=1
fi
cat "$OUT/bench-gpu.txt" >> "$S"

# issue 18: the CUDA backend under mpirun -np 2, the two ranks sharing the
# GPU, against --backend cpu and the in-process CUDA run (needs OpenMPI on
# this machine at build time; otherwise it says NOT run)
timeout 150 sh tests/gpu/check-mpi-cuda.sh > "$OUT/mpi-cuda.txt" 2>&1
mrc=$?
if grep -q '^check-mpi-cuda: PASS' "$OUT/mpi-cuda.txt"; then
    note "mpi-cuda: PASS ($(el)): $(grep -c '^ok' "$OUT/mpi-cuda.txt") ok lines, $(grep -m1 'exec.gpu_comm' "$OUT/mpi-cuda.txt" | sed 's/^ *//')"
elif grep -q '^check-mpi-cuda: NOT run' "$OUT/mpi-cuda.txt"; then
    note "mpi-cuda: $(grep '^check-mpi-cuda: NOT run' "$OUT/mpi-cuda.txt") ($(el))"
else
    rc=1
    note "mpi-cuda: FAIL (exit $mrc, 124 = timeout) ($(el)):"
    grep -E '^(FAIL|check-mpi-cuda)' "$OUT/mpi-cuda.txt" | head -20 | tee -a "$S"
fi
echo "----"
cat "$OUT/bench-gpu.txt"
echo "----"
grep -E '^(build|check-gpu|bench-gpu|mpi-cuda|device|[0-9]+ of)' "$S"
exit $rc
