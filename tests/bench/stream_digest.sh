#!/bin/sh
# Per-frame integrity (lrmoe-stream(5), Integrity): what checking the
# digest records costs the library reader. Each stream is read by one
# process, alternately as a reader reads it (records checked) and as the
# reader did before there were records (lrmoe_reader_set_verify(r, 0):
# records skipped, frames not hashed, and a zstd frame's content checksum
# checked by zstd, which a record otherwise makes the reader skip), ROUNDS
# rounds in rotated order (stream_bench alt). Both sides read the same
# file: where a file's pages sit in the page cache moved the time to read
# the same frames by up to 25% between two copies of one file on this
# project's VM, far more than the 2% measured, and gave the earlier form of
# this bench (a file with records against one without) medians from 0.92
# to 1.09 on one quiet machine. Each round's ratio is the throughput
# checked / not checked (wall time); printed: min, first quartile, median,
# third quartile and max of the rounds' ratios, the median GB/s of both
# sides, and the median CPU-time ratio (all threads: what a hasher thread
# costs beside the wall time it saves). In zstd a third side reads with no
# check at all (lrmoe_reader_set_verify(r, -1): zstd's checksum skipped
# too): "none", the median ratio against it, is what the hash itself costs.
# Cases: raw and zstd level 1; one frame of MIB MiB and 2000 small frames
# (lrmoe-gen, 36 KiB each); CRC-64 records, what the writers write, and
# XXH64 records, what earlier writers wrote, for comparison.
# First, the checksums alone on one buffer (36 KiB, the small frames' size,
# and 1 MiB, the reader's piece): GB/s of XXH64, of every CRC-64 path this
# CPU runs, of memcpy, memcpy then CRC-64, and both in one pass. And once
# per case the CRC-64 of 512 MiB (a 256 KiB buffer over and over, in each
# core's cache) on one thread and on two at once ("2cores": t2/t1, 1.00
# when a second core is free, 2.00 when it is not; on 64 MiB, the figure
# this bench used before, the second thread's start on an idle virtual CPU
# alone gave 1.6-2.1): the hasher thread of a large frame hides its hash
# only when the machine has a core to give it.
# Verdict: every CRC-64 case's median ratio >= 0.98 (the records cost at
# most 2% of the reader's throughput).
# Usage: tests/bench/stream_digest.sh [MIB] [ROUNDS]   (default 256 11)
# (tests/bench/stream.sh runs it)
set -eu
TOP=$(cd "$(dirname "$0")/../.." && pwd)
MIB=${1:-256}
ROUNDS=${2:-11}
W=$(mktemp -d "${TMPDIR:-/tmp}/lrmoe-bench-dig.XXXXXX")
trap 'rm -rf "$W"' EXIT
cc -std=c11 -O2 -D_GNU_SOURCE -I"$TOP/lib" -o "$W/sb" "$TOP/tests/bench/stream_bench.c" \
    "$TOP/build/liblrmoe.a" -lzstd -ljansson -lm -lpthread
for k in 36 1024; do
    echo "checksum GB/s on one $k KiB buffer: $("$W/sb" crc $k | tr '\n' ' ' | sed 's/ (default)/*/')"
done | tee "$W/crc"
echo "(* the path this CPU uses)"
"$W/sb" gen "$MIB" 1 - "$W/frame.raw"
"$TOP/bin/lrmoe-gen" --tokens 16 --hidden 512 --experts 64 --steps 2000 --no-compress \
    -o "$W/small.raw"
skib=$(($(stat -c %s "$W/small.raw") / 2000 / 1024))
# paired A B < ALT-OUTPUT: "min q1 median q3 max" of the rounds' ratios
# side A / side B (alt's lines: round side seconds cpu-seconds), then the
# median seconds of each side and the median of the rounds' CPU ratios
paired() {
    awk -v A="$1" -v B="$2" '{ t[$1, $2] = $3; c[$1, $2] = $4; if ($1 + 1 > n) n = $1 + 1 }
    function med(a, k,   i, j, x) {   # a[1..k] sorted in place; the median
        for (i = 2; i <= k; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
        return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
    }
    END {
        for (i = 0; i < n; i++) { r[i + 1] = t[i, A] / t[i, B]; q[i + 1] = c[i, A] / c[i, B]
                                  t0[i + 1] = t[i, A]; t1[i + 1] = t[i, B] }
        m = med(r, n)
        printf "%.3f %.3f %.3f %.3f %.3f %.6f %.6f %.3f\n", r[1], r[int((n + 3) / 4)], m,
               r[n + 1 - int((n + 3) / 4)], r[n], med(t0, n), med(t1, n), med(q, n)
    }'
}
echo "what checking the records costs the reader: the same stream read alternately as a reader reads it and as the reader before records did, $ROUNDS rounds in one process"
printf '%-22s %-7s %8s %8s %32s %6s %6s %6s\n' "case" records checked "before" "ratio: min/q1/median/q3/max" "cpu" "none" "2cores"
printf '%-22s %-7s %8s %8s %32s %6s %6s %6s\n' "" "" "GB/s" "GB/s" "" "" "" ""
verdict=PASS
for src in big small; do
    for mode in raw zstd:1:0; do
        if [ $src = big ]; then in=$W/frame.raw; label="1 x $MIB MiB"; else in=$W/small.raw; label="2000 x $skib KiB"; fi
        m=$(echo $mode | cut -d: -f1)
        for d in 1 2; do
            f=$W/$src.$m.$d
            "$W/sb" copy "$in" "$f" "$mode" $d
            if [ $d = 1 ]; then kind=CRC-64; else kind=XXH64; fi
            par=$("$W/sb" par 512 | awk '{ printf "%.2f", $2 / $1 }')
            # ratio: before's time / checked's = checked's throughput / before's;
            # in zstd also against no check at all (x: zstd's checksum skipped)
            none=-
            if [ $m = raw ]; then
                "$W/sb" alt "$ROUNDS" "n:$f" "v:$f" > "$W/alt"
            else
                "$W/sb" alt "$ROUNDS" "n:$f" "v:$f" "x:$f" > "$W/alt"
                none=$(paired 2 1 < "$W/alt" | cut -d' ' -f3)
            fi
            set -- $(paired 0 1 < "$W/alt")
            bytes=$("$W/sb" read "$f" | cut -d' ' -f2)
            gn=$(echo "scale=3; $bytes / $6 / 1000000000" | bc -l)
            gv=$(echo "scale=3; $bytes / $7 / 1000000000" | bc -l)
            printf '%-22s %-7s %8s %8s %32s %6s %6s %6s\n' "$label $m" $kind "$gv" "$gn" "$1/$2/$3/$4/$5" "$8" "$none" "$par"
            if [ $d = 1 ] && [ "$(echo "$3 < 0.98" | bc -l)" = 1 ]; then
                verdict=FAIL
                fails="${fails:-}${fails:+, }$label $m $3"
            fi
        done
    done
done
echo "(zstd: before = zstd's own content checksum, which the records replace; raw: before = no check; none: the median ratio against no check at all, zstd's checksum skipped too)"
echo "verdict: $verdict${fails:+ ($fails)} (target: CRC-64 records cost <= 2% of the reader's throughput, median ratio >= 0.98 in every case)"
