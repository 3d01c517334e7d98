#!/bin/sh
# Where the reader's hasher thread pays (lib/stream.c, HASH_THREAD_MIN): the
# reader built twice, hashing every frame inline and every frame of a
# threaded kind in its second thread, on streams of 64 MiB of frames of one
# size each (256 KiB to 16 MiB), raw with XXH64 records and zstd level 1
# with CRC-64 records (the kinds that use the thread: a raw frame with a
# CRC-64 record is always hashed inline, copied out of the input buffer
# with its CRC in one pass, which beat the thread: stream_digest.sh). Each
# build reads each stream alternately checked and as the reader before
# records (stream_bench alt, ROUNDS rounds, same file); printed: the median
# over the rounds of throughput checked / before, both builds, the same for
# CPU time (before / checked: what the check costs in all), and the
# "2cores" figure of stream_digest.sh (1.00: a free second core).
# Usage: tests/bench/stream_threshold.sh [ROUNDS]   (default 7)
set -eu
TOP=$(cd "$(dirname "$0")/../.." && pwd)
ROUNDS=${1:-7}
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
    "$SB" copy "$W/g.$s" "$W/raw.$s" raw 2
    "$SB" copy "$W/g.$s" "$W/zstd.$s" zstd:1:0 1
done
# median over the rounds of side 0's time / side 1's (column 3: wall, 4: cpu)
ratio() {
    awk -v col="$1" '{ t[$1, $2] = $col; if ($1 + 1 > n) n = $1 + 1 }
    END { for (i = 0; i < n; i++) r[i + 1] = t[i, 0] / t[i, 1]
          for (i = 2; i <= n; i++) { x = r[i]; for (j = i - 1; j >= 1 && r[j] > x; j--) r[j + 1] = r[j]; r[j + 1] = x }
          printf "%.3f", n % 2 ? r[(n + 1) / 2] : (r[n / 2] + r[n / 2 + 1]) / 2 }' "$2"
}
echo "64 MiB of frames of one size, $ROUNDS rounds: median ratio checked / before records, same file"
echo "(wall: throughput; cpu: CPU time before / checked, all threads)"
printf '%-22s %8s %8s %8s %8s\n' "frame MiB" "inline" "thread" "inline" "thread"
printf '%-22s %8s %8s %8s %8s\n' "" "wall" "wall" "cpu" "cpu"
for m in raw zstd; do
    for s in $sizes; do
        for b in inline thread; do "$W/sb.$b" alt "$ROUNDS" "n:$W/$m.$s" "v:$W/$m.$s" > "$W/alt.$b"; done
        case $m in raw) k="raw XXH64";; *) k="zstd CRC-64";; esac
        printf '%-22s %8s %8s %8s %8s\n' "$s $k" "$(ratio 3 "$W/alt.inline")" "$(ratio 3 "$W/alt.thread")" \
            "$(ratio 4 "$W/alt.inline")" "$(ratio 4 "$W/alt.thread")"
    done
done
echo "2cores (CRC-64 on two threads at once / on one; 1.00: a free second core): $("$SB" par 512 | awk '{ printf "%.2f", $2 / $1 }')"
