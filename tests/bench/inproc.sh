#!/bin/sh
# make bench section "inproc": lrmoe.torch.patch on a Qwen3-MoE-shaped block
# against Hugging Face's eager block (tests/bench/inproc.py says what is
# measured). Skips, saying why, without torch/transformers.
cd "$(dirname "$0")/../.." || exit 1
if ! python3 -c 'import torch, transformers' 2>/dev/null; then
    echo "inproc: skipped: torch and transformers are not installed"
    exit 0
fi
if [ "${BENCH_QUICK:-0}" = 1 ]; then T=1024; else T=4096; fi
exec python3 tests/bench/inproc.py "$T"
