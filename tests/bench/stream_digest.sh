#!/bin/sh
# Per-frame integrity (lrmoe-stream(5), Integrity): the library reader on the
# same frames with digest records (hashed and compared before each frame is
# returned; frames of 4 MiB and more hashed by a second thread while they are
# read) and without them (the format before the records), raw and zstd level
# 1, one frame of MIB MiB and 2000 small frames (lrmoe-gen, 36 KiB each).
# ROUNDS rounds; in each, every case's two files are read alternately, 3
# times each, best of each: ratio = throughput with / without. Reported:
# min, median and max of the rounds' ratios; the verdict takes the median.
# Each round also times XXH64 on one thread and on two at once ("2 cores":
# t2/t1, 1.00 when a second core is free, 2.00 when it is not): the second
# thread hides the hash only when the machine has a core to give it.
# Usage: tests/bench/stream_digest.sh [MIB] [ROUNDS]   (default 256 5)
# (tests/bench/stream.sh runs it; SB=stream_bench binary to reuse one)
set -eu
TOP=$(cd "$(dirname "$0")/../.." && pwd)
MIB=${1:-256}
ROUNDS=${2:-5}
W=$(mktemp -d "${TMPDIR:-/tmp}/lrmoe-bench-dig.XXXXXX")
trap 'rm -rf "$W"' EXIT
cc -std=c11 -O2 -D_GNU_SOURCE -I"$TOP/lib" -o "$W/sb" "$TOP/tests/bench/stream_bench.c" \
    "$TOP/build/liblrmoe.a" -lzstd -ljansson -lm -lpthread
"$W/sb" gen "$MIB" 1 - "$W/frame.raw"
"$TOP/bin/lrmoe-gen" --tokens 16 --hidden 512 --experts 64 --steps 2000 --no-compress \
    -o "$W/small.raw"
skib=$(($(stat -c %s "$W/small.raw") / 2000 / 1024))
cases=""
for src in big small; do
    for mode in raw zstd:1:0; do
        if [ $src = big ]; then in=$W/frame.raw; else in=$W/small.raw; fi
        c=$src.$(echo $mode | cut -d: -f1)
        "$W/sb" copy "$in" "$W/$c.1" "$mode" 1
        "$W/sb" copy "$in" "$W/$c.0" "$mode" 0
        cases="$cases $c"
    done
done
lt() { [ "$(echo "$1 < $2" | bc -l)" = 1 ]; }
for r in $(seq "$ROUNDS"); do
    pt=$("$W/sb" par 64)
    echo "$pt" | awk '{ printf "%.2f\n", $2 / $1 }' >> "$W/par"
    for c in $cases; do
        b1=""; b0=""
        for i in 1 2 3; do
            t1=$("$W/sb" read "$W/$c.1" | cut -d' ' -f1); t0=$("$W/sb" read "$W/$c.0" | cut -d' ' -f1)
            if [ -z "$b1" ] || lt "$t1" "$b1"; then b1=$t1; fi
            if [ -z "$b0" ] || lt "$t0" "$b0"; then b0=$t0; fi
        done
        echo "$b0 $b1" | awk '{ printf "%.3f\n", $1 / $2 }' >> "$W/$c.ratio"
        echo "$b1" >> "$W/$c.t1"; echo "$b0" >> "$W/$c.t0"
    done
done
stats() { sort -n "$1" | awk '{ v[NR] = $1 } END { printf "%s %s %s", v[1], v[int((NR + 1) / 2)], v[NR] }'; }
med() { sort -n "$1" | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "reader with and without digest records, same frames, $ROUNDS rounds (best of 3 alternated reads each)"
printf '%-28s %10s %10s %7s %7s %7s\n' "case" "with GB/s" "w/o GB/s" "min" "median" "max"
iverdict=PASS
for c in $cases; do
    bytes=$("$W/sb" read "$W/$c.1" | cut -d' ' -f2)
    case $c in big.*) label="1 x $MIB MiB";; *) label="2000 x $skib KiB";; esac
    label="$label ${c#*.}"
    g1=$(echo "scale=3; $bytes / $(med "$W/$c.t1") / 1000000000" | bc -l)
    g0=$(echo "scale=3; $bytes / $(med "$W/$c.t0") / 1000000000" | bc -l)
    set -- $(stats "$W/$c.ratio")
    printf '%-28s %10s %10s %7s %7s %7s\n' "$label" "$g1" "$g0" "$1" "$2" "$3"
    if [ "$(echo "$2 >= 0.98" | bc -l)" != 1 ]; then
        iverdict=FAIL
        fails="${fails:-}${fails:+, }$label $2"
    fi
done
set -- $(stats "$W/par")
echo "2 cores (XXH64 on two threads at once / on one; 1.00: a free second core): min $1 median $2 max $3"
busy=""
[ "$(echo "$2 >= 1.5" | bc -l)" = 1 ] && busy="; no second core was free in this run (2 cores >= 1.5): the hasher thread could not overlap the hash with reading"
echo "verdict: $iverdict${fails:+ ($fails)} (target: the digests cost <= 2% of the reader's throughput, median ratio >= 0.98; frames under 4 MiB are hashed inline$busy)"
