#!/bin/sh
# make check-fast: the everyday tier (under a minute on 2 cores): the unit
# programs on quick arguments (tests/unit/run.sh), the library's C API
# (tests/lib.bats), the layer rule (tests/layers.bats), the stream codec's round trips, truncation and integrity
# (part of tests/stream.bats) and the README's LRMoE pipeline end to end
# (tests/pack.bats). make check runs everything. Ends in
# "check-fast: N passed, N failed".
cd "$(dirname "$0")/.." || exit 1
B=${LRMOE_BUILD:-build}
pass=0 fail=0
count() {  # the output of one step: unit's summary line, or bats TAP lines
    p=$(printf '%s\n' "$1" | grep -c '^ok ')
    f=$(printf '%s\n' "$1" | grep -c '^not ok ')
    u=$(printf '%s\n' "$1" | sed -n 's/^unit: \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p')
    if [ -n "$u" ]; then p=${u% *} f=${u#* }; fi
    pass=$((pass + p)) fail=$((fail + f))
    [ "$2" = 0 ] || [ "$f" -gt 0 ] || fail=$((fail + 1))  # a step that failed without a TAP line
}
step() {
    echo "== $*"
    out=$("$@" 2>&1); rc=$?
    printf '%s\n' "$out"
    count "$out" $rc
}
step sh tests/unit/run.sh "$B/unit"
step bats --tap tests/lib.bats
step bats --tap tests/layers.bats
step bats --tap -f 'round trip|real zstd|truncated inside a frame|integrity: one flipped' tests/stream.bats
step bats --tap -f 'README LRMoE pipeline' tests/pack.bats
echo "check-fast: $pass passed, $fail failed"
[ "$fail" = 0 ]
