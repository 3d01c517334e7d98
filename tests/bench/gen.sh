#!/bin/sh
# lrmoe-gen throughput: frames generated per second as uncompressed bytes,
# single- and multi-threaded, raw and zstd, against NumPy drawing and
# rounding the same number of normals to bf16 in the same run.
#
#   tests/bench/gen.sh [PRESET] [TOKENS] [FRAMES]   (default deepseek-v3 4096 2)
set -eu
cd "$(dirname "$0")/../.."
GEN=bin/lrmoe-gen
PRESET=${1:-deepseek-v3}
TOKENS=${2:-4096}
FRAMES=${3:-2}
NPROC=$(nproc 2>/dev/null || echo 1)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

[ -x "$GEN" ] || { echo "gen.sh: build $GEN first (make)" >&2; exit 1; }

now() { python3 -c 'import time; print(time.monotonic())'; }
# run NAME CMD...: time CMD (best of 2), print a row
BYTES=0
best=0
timeit() {
    best=""
    for _ in 1 2; do
        t0=$(now)
        "$@"
        t1=$(now)
        t=$(python3 -c "print($t1 - $t0)")
        if [ -z "$best" ] || python3 -c "import sys; sys.exit(not ($t < $best))"; then best=$t; fi
    done
}

"$GEN" --preset "$PRESET" --tokens "$TOKENS" --steps "$FRAMES" --no-compress -o "$TMP/raw.lrm"
BYTES=$(wc -c < "$TMP/raw.lrm")
line=$("$GEN" --list-presets | grep "^$PRESET ")
echo "lrmoe-gen benchmark"
echo "  preset      $line"
echo "  tokens      $TOKENS"
echo "  frames      $FRAMES (hidden, router_logits, grad_output; bf16/f32)"
echo "  raw bytes   $BYTES"
echo "  cpus        $NPROC"
echo

printf '%-34s %10s %10s %8s\n' "case" "seconds" "MB/s" "ratio"
printf '%-34s %10s %10s %8s\n' "----" "-------" "----" "-----"
row() { # name seconds base_seconds
    python3 -c "
b=$BYTES; t=$2; base=$3
print('%-34s %10.3f %10.1f %8.2f' % ('$1', t, b / t / 1e6, base / t))"
}

# NumPy reference: the same number of normals (2*T*D per frame; logits are
# small) drawn as float32 and rounded to bf16 bits.
cat > "$TMP/np.py" <<EOF
import sys, numpy as np
n = int(sys.argv[1])
rng = np.random.default_rng(1)
chunk = 1 << 22
done = 0
while done < n:
    m = min(chunk, n - done)
    x = rng.standard_normal(m, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    (((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)).tofile("/dev/null")
    done += m
EOF
D=$(echo "$line" | awk '{print $4}')
NORMALS=$((2 * TOKENS * D * FRAMES))
timeit python3 "$TMP/np.py" "$NORMALS"
T_NP=$best
row "numpy normal->bf16 (reference)" "$T_NP" "$T_NP"

timeit "$GEN" --preset "$PRESET" --tokens "$TOKENS" --steps "$FRAMES" --no-compress -o /dev/null
T_RAW1=$best
row "lrmoe-gen raw, 1 thread" "$T_RAW1" "$T_NP"
if [ "$NPROC" -gt 1 ]; then
    timeit "$GEN" --preset "$PRESET" --tokens "$TOKENS" --steps "$FRAMES" --no-compress -@ "$NPROC" -o /dev/null
    row "lrmoe-gen raw, $NPROC threads" "$best" "$T_NP"
fi
timeit "$GEN" --preset "$PRESET" --tokens "$TOKENS" --steps "$FRAMES" -l 1 -o /dev/null
row "lrmoe-gen zstd -1, 1 thread" "$best" "$T_NP"
timeit "$GEN" --preset "$PRESET" --tokens "$TOKENS" --steps "$FRAMES" -l 3 -@ "$NPROC" -o /dev/null
row "lrmoe-gen zstd -3, $NPROC threads" "$best" "$T_NP"
echo
python3 -c "
r = $T_NP / $T_RAW1
print('verdict: single-threaded raw generation runs at %.2fx NumPy (%s)' % (r, 'PASS' if r >= 1 else 'SLOWER than NumPy'))"
