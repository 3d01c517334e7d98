#!/bin/sh
# Where the reader's hasher thread pays (lib/stream.c, HASH_THREAD_MIN): the
# reader built twice, hashing every frame inline and every frame in its
# second thread, on raw streams of 64 MiB of frames of one size each (256
# KiB to 16 MiB), with digest records; and the same frames without records.
# ROUNDS rounds of alternated reads, best of each round; printed: the median
# over the rounds of throughput with records / without, both ways, the same
# for CPU time (without / with: what the records cost in all), and the
# "2 cores" figure of stream_digest.sh (1.00: a free second core).
# Usage: tests/bench/stream_threshold.sh [ROUNDS]   (default 5)
set -eu
TOP=$(cd "$(dirname "$0")/../.." && pwd)
ROUNDS=${1:-5}
W=$(mktemp -d "${TMPDIR:-/tmp}/lrmoe-bench-thr.XXXXXX")
trap 'rm -rf "$W"' EXIT
for v in inline:UINT64_MAX thread:0; do
    cc -std=c11 -O2 -D_GNU_SOURCE -pthread -I"$TOP/lib" -DHASH_THREAD_MIN="${v#*:}" \
        -o "$W/sb.${v%%:*}" "$TOP/tests/bench/stream_bench.c" "$TOP/lib/stream.c" \
        "$TOP/build/liblrmoe.a" -lzstd -ljansson -lm -lpthread
done
SB=$W/sb.inline
sizes="0.25 1 2 4 8 16"
for s in $sizes; do
    if [ "$s" = 0.25 ]; then   # hidden and grad_output 128 KiB each, logits 4 KiB
        "$TOP/bin/lrmoe-gen" --tokens 128 --hidden 512 --experts 8 --steps 256 --no-compress \
            -o "$W/g.$s"
    else
        "$SB" gen "$s" $((64 / s)) - "$W/g.$s"
    fi
    "$SB" copy "$W/g.$s" "$W/d1.$s" raw 1
    "$SB" copy "$W/g.$s" "$W/d0.$s" raw 0
done
lt() { [ "$(echo "$1 < $2" | bc -l)" = 1 ]; }
for r in $(seq "$ROUNDS"); do
    "$SB" par 512 | awk '{ printf "%.2f\n", $2 / $1 }' >> "$W/par"
    for s in $sizes; do
        bi=""; bt=""; b0=""; ci=""; ct=""; c0=""
        for i in 1 2 3; do
            set -- $("$W/sb.inline" read "$W/d1.$s"); ti=$1; ui=$3
            set -- $("$W/sb.thread" read "$W/d1.$s"); tt=$1; ut=$3
            set -- $("$W/sb.inline" read "$W/d0.$s"); t0=$1; u0=$3
            if [ -z "$bi" ] || lt "$ti" "$bi"; then bi=$ti; fi
            if [ -z "$bt" ] || lt "$tt" "$bt"; then bt=$tt; fi
            if [ -z "$b0" ] || lt "$t0" "$b0"; then b0=$t0; fi
            if [ -z "$ci" ] || lt "$ui" "$ci"; then ci=$ui; fi
            if [ -z "$ct" ] || lt "$ut" "$ct"; then ct=$ut; fi
            if [ -z "$c0" ] || lt "$u0" "$c0"; then c0=$u0; fi
        done
        echo "$b0 $bi" | awk '{ printf "%.3f\n", $1 / $2 }' >> "$W/i.$s"
        echo "$b0 $bt" | awk '{ printf "%.3f\n", $1 / $2 }' >> "$W/t.$s"
        echo "$c0 $ci" | awk '{ printf "%.3f\n", $1 / $2 }' >> "$W/ci.$s"
        echo "$c0 $ct" | awk '{ printf "%.3f\n", $1 / $2 }' >> "$W/ct.$s"
    done
done
med() { sort -n "$1" | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "raw frames, 64 MiB in all, $ROUNDS rounds: median ratio with records / without"
echo "(wall: throughput; cpu: CPU time without / with, all threads)"
printf '%-12s %8s %8s %8s %8s\n' "frame MiB" "inline" "thread" "inline" "thread"
printf '%-12s %8s %8s %8s %8s\n' "" "wall" "wall" "cpu" "cpu"
for s in $sizes; do printf '%-12s %8s %8s %8s %8s\n' "$s" "$(med "$W/i.$s")" "$(med "$W/t.$s")" \
    "$(med "$W/ci.$s")" "$(med "$W/ct.$s")"; done
echo "2 cores (CRC-64 on two threads at once / on one; 1.00: a free second core): median $(med "$W/par")"
