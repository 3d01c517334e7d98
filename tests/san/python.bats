#!/usr/bin/env bats
# `make check SANITIZE=1` only (tests/run.sh runs it before report.bats): the
# Python package's unittest modules on the ASan + UBSan build of the library.
# tests/python.bats runs them on the plain build; a sanitized liblrmoe.so.2
# loads only into an interpreter started with the ASan runtime, so python3
# starts here with it preloaded (LD_PRELOAD: the runtime the library was
# linked against, as ldd names it, then libstdc++.so.6, without which ASan's
# C++ exception interceptor has nothing to call once torch is loaded and
# throws), and LRMOE_LIBRARY names the sanitized library. A report fails
# the test (the interpreter exits non-zero) and lands in $LRMOE_SAN_REPORTS
# for report.bats. Leak detection is off in these processes only: the
# interpreter keeps allocations of its own at exit; the tools' own files
# check their leaks.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup() {
    [ -n "${LRMOE_SAN_REPORTS:-}" ] || skip "not a SANITIZE=1 run (LRMOE_SAN_REPORTS unset)"
    TOP="$BATS_TEST_DIRNAME/../.."
    LIB="$TOP/${LRMOE_BUILD:-build/san}/liblrmoe.so.2"
    [ -f "$LIB" ] || skip "no sanitized library at $LIB"
    ASAN_RT=$(ldd "$LIB" | awk '/libasan/ { print $3; exit }')
    [ -n "$ASAN_RT" ] || { echo "$LIB does not link an ASan runtime"; return 1; }
    export LRMOE_LIBRARY="$LIB" OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
}

need_torch() {
    python3 -c 'import torch, transformers' 2>/dev/null ||
        skip "torch and transformers are not installed (tests/deps.sh test installs them)"
}

# unittest MODULE...: under the ASan runtime, every module OK
san_unit() {
    cd "$TOP/tests/python" || return 1
    run env LD_PRELOAD="$ASAN_RT libstdc++.so.6" ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" \
        python3 -W ignore::ResourceWarning -m unittest -v "$@"
    [ "$status" -eq 0 ] || { printf '%s\n' "$output"; return 1; }
    assert_line --regexp '^OK'
}

@test "python on the sanitized library: the interpreter maps the ASan runtime and the sanitized liblrmoe.so.2, not the plain one" {
    # the premise of the tests below: what they call is the instrumented C
    cd "$TOP/tests/python" || return 1
    run env LD_PRELOAD="$ASAN_RT libstdc++.so.6" ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" \
        PYTHONPATH="$TOP/lib/python" python3 -c '
import os, lrmoe
maps = {l.split()[-1] for l in open("/proc/self/maps") if "/" in l}
print("\n".join(sorted(os.path.realpath(m) for m in maps if "libasan" in m or "liblrmoe" in m)))
'
    assert_success
    assert_line "$(readlink -f "$ASAN_RT")"
    assert_line "$(readlink -f "$LIB")"
    refute_line "$(readlink -f "$TOP/build/liblrmoe.so.2")"
}

@test "python on the sanitized library: streams, route/plan/score/pack against the tools, hardening, and the binding's property test" {
    san_unit test_stream test_ops test_harden test_fuzz
}

@test "python on the sanitized library: patch() on the six HF families, the torch API, register, budget, dump and by-rank keeping" {
    need_torch
    san_unit test_patch test_torch_api test_register test_budget test_dump test_byrank
}
