#!/bin/sh
# make unit / make check-fast: every unit program of tests/unit once, on
# quick arguments (the bats files run them at full size: tests/README).
# Each case passes when the program exits 0 and prints its own success line;
# the last line is "unit: N passed, N failed".
#   tests/unit/run.sh [DIR]   (DIR holds the programs; default build/unit)
cd "$(dirname "$0")/../.." || exit 1
U=${1:-build/unit}
pass=0 fail=0
# NAME  SUCCESS-TEXT  ARGS...
t() {
    name=$1 want=$2
    shift 2
    start=$(date +%s%N)
    if out=$("$U/${name}_test" "$@" 2>&1) && printf '%s\n' "$out" | grep -qF -- "$want"; then
        pass=$((pass + 1))
        printf 'ok   %-9s %-24s %5d ms\n' "$name" "$*" $((($(date +%s%N) - start) / 1000000))
    else
        fail=$((fail + 1))
        printf 'FAIL %-9s %s (wanted "%s"):\n%s\n' "$name" "$*" "$want" "$out" | head -20
    fi
}
t alloc "alloc: ok" 0
t alloc "alloc: ok" 1
t blas "loaded=1 threads=2" 2
t capacity "0 failures" random 300 1
t capacity "" errors
t crc64 "crc64: 10744 cases, 0 failed" quick
t dtype "" empty
t gemm "448 cases, 0 failed" f32
t gemm_amx "cases, 0 failed"
t plan "phy2log[0] = 5 6 5 7 8 4 3 4 10 9 10 2 0 1 11 1" eplb-readme
t plan "" random 40 1
t plan "" fastpath 30 1
t route "all match" quick
t score "ok"
t swiglu "cases, 0 failed" 65537
D=$(mktemp -d "${TMPDIR:-/tmp}/lrmoe-unit.XXXXXX")
t stream_verify "stream_verify: 16 cases, 0 failed" "$D"
t weights_map "weights_map: 3744 cases, 0 failed" "$D"
rm -rf "$D"
echo "unit: $pass passed, $fail failed"
[ "$fail" = 0 ]
