#!/bin/sh
# Build and run the libFuzzer harnesses of tests/fuzz (clang,
# -fsanitize=fuzzer,address,undefined) on seed corpora the tools make:
#   tests/fuzz/run.sh [SECONDS [HARNESS...]]
# SECONDS per harness (default 20); harnesses stream, safetensors, npy, hf,
# stages (all by default; stages is built from every lib/*.c, a CPU library
# without oneDNN, MPI or CUDA). New inputs collect in $BUILD/fuzz/corpus/HARNESS and are kept for
# the next run.
#   FUZZ_RUNS=SCALE tests/fuzz/run.sh 0 [HARNESS...]
# the reproducible form make check runs (tests/fuzz.bats): seed 1, a fixed
# number of inputs per harness (SCALE times its base count, about 20 s here
# at SCALE 1), from the seeds and past findings alone (a fresh corpus), so
# every machine and every run tries the same inputs and a clean tree passes
# or fails the same way; make fuzz explores with random seeds instead. Exit 1 on any finding (crash, sanitizer report, leak, failed
# round-trip oracle, timeout, out-of-memory): the reproducer is written to
# $BUILD/fuzz/findings/, the log tail printed; copy it to
# tests/fuzz/regress/HARNESS/ once fixed, and every later run replays it. Exit 77 when clang or its
# fuzzer runtime is missing (tests/deps.sh installs clang and
# libclang-rt-14-dev). Needs the tools built (make) for the seeds.
set -eu
TOP=$(cd "$(dirname "$0")/../.." && pwd)
SECS=${1:-20}
[ $# -gt 0 ] && shift
HARNESSES=${*:-stream safetensors npy hf stages}
B="$TOP/${BUILD:-build}/fuzz"
FUZZ_CC=${FUZZ_CC:-}
if [ -z "$FUZZ_CC" ]; then
    for c in clang-14 clang; do command -v $c >/dev/null 2>&1 && { FUZZ_CC=$c; break; }; done
fi
mkdir -p "$B/findings" "$B/corpus"
if [ -z "$FUZZ_CC" ] || ! printf 'int LLVMFuzzerTestOneInput(const char *d, long n){(void)d;(void)n;return 0;}\n' |
        "$FUZZ_CC" -x c -fsanitize=fuzzer,address,undefined -o "$B/probe" - >/dev/null 2>&1; then
    echo "fuzz: no clang with the libFuzzer runtime (install clang-14 libclang-rt-14-dev)" >&2
    exit 77
fi
LIBSRC="frame producers stream crc64 dtype error npy import_hf weights_map weights crc64_par par clock"
for h in $HARNESSES; do
    bin="$B/fuzz_$h"
    srcs="$TOP/tests/fuzz/fuzz_$h.c"
    libs="-lzstd -ljansson -lm"
    if [ $h = stages ]; then   # the stages call into most of the library
        srcs="$srcs $(ls "$TOP"/lib/*.c | tr '\n' ' ')"
        libs="$libs -lglpk -lpthread -ldl -Wno-unknown-attributes"   # gcc's optimize()
    else
        for m in $LIBSRC; do srcs="$srcs $TOP/lib/$m.c"; done
    fi
    stale=0
    [ -x "$bin" ] || stale=1
    for s in $srcs "$TOP"/tests/fuzz/*.h "$TOP"/lib/*.h; do [ "$s" -nt "$bin" ] && stale=1; done
    if [ $stale = 1 ]; then
        "$FUZZ_CC" -g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined \
            -fno-sanitize-recover=undefined -pthread -I"$TOP/lib" -I"$TOP/tests/fuzz" -o "$bin" \
            $srcs $libs
    fi
done
sh "$TOP/tests/fuzz/seeds.sh" "$TOP/bin" "$B/seeds"
rc=0
for h in $HARNESSES; do
    dict="-dict=$TOP/tests/fuzz/stream.dict"; [ $h = npy ] && dict="-dict=$TOP/tests/fuzz/npy.dict"
    [ $h = hf ] || [ $h = stages ] && dict=   # structured recipes: no byte dictionary
    mkdir -p "$B/corpus/$h"
    log="$B/$h.log"
    regress=   # past findings (tests/fuzz/regress/HARNESS), replayed by every run
    [ -d "$TOP/tests/fuzz/regress/$h" ] && regress="$TOP/tests/fuzz/regress/$h"
    corpus="$B/corpus/$h" budget="-max_total_time=$SECS" what="in ${SECS} s"
    if [ -n "${FUZZ_RUNS:-}" ]; then
        case $h in   # base counts: about 20 s each on a 2-core AMD EPYC (Zen 4)
            stream) base=40000 ;; safetensors) base=150000 ;; npy) base=2000000 ;;
            stages) base=30000 ;;   # about 10 s, after its 30 s build
            *) base=60000 ;;
        esac
        corpus="$B/corpus-fixed/$h"
        rm -rf "$corpus"
        mkdir -p "$corpus"
        budget="-seed=1 -runs=$((base * FUZZ_RUNS))" what="(seed 1, fixed count)"
    fi
    start=$(date +%s)
    if "$B/fuzz_$h" $budget -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
            $dict -artifact_prefix="$B/findings/$h-" \
            -print_final_stats=1 "$corpus" "$B/seeds/$h" $regress > "$log" 2>&1; then
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
        echo "fuzz $h: ${runs:-?} runs $what, $(($(date +%s) - start)) s, no finding (corpus $(ls "$corpus" | wc -l) inputs)"
    else
        echo "fuzz $h: FINDING (log $log):" >&2
        grep -v '^#[0-9]' "$log" | tail -40 >&2
        rc=1
    fi
done
exit $rc
