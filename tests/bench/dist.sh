#!/bin/sh
# make bench section "dist": lrmoe.torch.patch(group=) over a real process
# group (torchrun, gloo, 2 processes on the CPU) against the simulated
# single-process run: step time, bytes per all-to-all phase at rate 1.0 and
# 0.7, share outside liblrmoe and the collectives (tests/bench/dist_torch.py
# says what is measured). Skips, saying why, without torch/transformers,
# torchrun or gloo.   BENCH_QUICK=1: 1024 tokens per rank instead of 4096.
cd "$(dirname "$0")/../.." || exit 1
if ! python3 -c 'import torch, transformers' 2>/dev/null; then
    echo "dist: skipped: torch and transformers are not installed"
    exit 0
fi
if ! command -v torchrun >/dev/null 2>&1; then
    echo "dist: skipped: torchrun is not on PATH (it comes with torch)"
    exit 0
fi
if ! python3 -c 'import torch.distributed as d, sys; sys.exit(not (d.is_available() and d.is_gloo_available()))'; then
    echo "dist: skipped: this torch has no gloo backend"
    exit 0
fi
if [ "${BENCH_QUICK:-0}" = 1 ]; then T=1024; else T=4096; fi
export LRMOE_LIBRARY="$PWD/build/liblrmoe.so.2" OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
out=$(mktemp "${TMPDIR:-/tmp}/lrmoe-bench-dist.XXXXXX")
trap 'rm -f "$out"' EXIT INT TERM
timeout 600 torchrun --standalone --nproc-per-node 2 tests/bench/dist_torch.py "$T" >"$out" 2>&1
rc=$?
grep -v '^W[0-9]' "$out"   # less torchrun's own warnings
[ $rc -eq 0 ] || echo "dist: torchrun failed (exit $rc)"
exit $rc
