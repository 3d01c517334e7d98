#!/bin/sh
# The whole test suite: every tests/*.bats through prove (TAP), so the output
# ends in prove's summary ("Result: PASS" / "Files=..., Tests=...").
# With SANITIZE set (make check SANITIZE=1) the tools in bin/ are the ASan +
# UBSan build: every sanitizer report goes to $BUILD/sanitizer-reports/ (the
# tool then exits non-zero, so its test fails), and tests/san/report.bats,
# run last, lists them grouped by kind and place and fails if there is any.
# SANITIZE_TESTS overrides the files run in that pass (default:
# tests/san/python.bats, see below, and all of tests/*.bats but
# tests/fuzz.bats, whose harnesses are sanitized builds of their own and ran
# in the plain pass, tests/mpi.bats, see below, the three files whose C
# runs inside a Python interpreter, see below, and tests/cuda-resources.bats,
# whose checks read nvcc's and ptxas' output for the kernels and compile
# their host-side tests with flags of their own: nothing in them uses the
# sanitized build, so the pass would repeat the plain one's, about 50 s),
# and tests/isa.bats, which runs the tools on other CPUs' instruction sets
# under QEMU's user mode: there an ASan tool's shadow-memory reservation
# becomes real pages (seen: qemu-x86_64 grew to 24 GiB and the OOM killer
# ended it), and which instructions a CPU executes is the plain build's
# question (the sanitized build selects the same paths).
#
# TEST_JOBS files run at once (default 2: prove -j; 1 runs them one after
# another). Each file works in its own temporary directories and the unit
# programs are built before (make check), so files share nothing they write;
# the longest files start first (SLOW) so that the workers end together.
cd "$(dirname "$0")/.." || exit 1
JOBS=${TEST_JOBS:-2}
case $JOBS in '' | *[!0-9]*) JOBS=0 ;; esac
if [ "$JOBS" -lt 1 ]; then
    echo "tests/run.sh: TEST_JOBS=$TEST_JOBS: not a count of 1 or more" >&2
    exit 2
fi
SLOW="tests/dist.bats tests/python.bats tests/mpi.bats tests/study.bats tests/exec.bats
      tests/cuda.bats tests/fuzz.bats tests/san/python.bats tests/stream.bats
      tests/import-hf.bats tests/cuda-resources.bats tests/route.bats tests/plan-prune.bats
      tests/plan.bats"
# slow_first FILE...: the files, those named in SLOW first, in SLOW's order
slow_first() {
    for s in $SLOW; do
        for f in "$@"; do [ "$f" = "$s" ] && echo "$f"; done
    done
    for f in "$@"; do
        for s in $SLOW; do [ "$f" = "$s" ] && continue 2; done
        echo "$f"
    done
}
if [ -z "${SANITIZE:-}" ]; then
    # shellcheck disable=SC2046
    exec prove -j"$JOBS" -f -o --timer -e 'bats --tap' $(slow_first tests/*.bats)
fi
B=${LRMOE_BUILD:-build/san}
case $B in /*) ;; *) B="$PWD/$B" ;; esac
R="$B/sanitizer-reports"
rm -rf "$R"
mkdir -p "$R"
export LRMOE_SAN_REPORTS="$R"
export ASAN_OPTIONS="detect_leaks=1:log_path=$R/asan:log_exe_name=1:protect_shadow_gap=0:abort_on_error=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$R/ubsan:log_exe_name=1"
export LSAN_OPTIONS="log_path=$R/lsan:log_exe_name=1"
# tests/mpi.bats stays out as well: OpenMPI never frees its own start-up
# allocations (LeakSanitizer reports inside libmpi, libopen-pal, hwloc and
# components it has unloaded, which no suppression can name), and its
# out-of-memory fault test limits the address space below what ASan's shadow
# needs. The plain pass runs it.
# tests/python.bats, tests/dist.bats and tests/study.bats load liblrmoe.so.2 into python3 by
# ctypes: an ASan library loads only into an interpreter started with the
# ASan runtime, so they load the plain build/liblrmoe.so.2 in this pass too
# and would only repeat the plain pass (3-4 minutes of torch). Instead
# tests/san/python.bats (this pass only) starts python3 with the runtime
# preloaded and runs the Python unittest modules (the binding's property
# test among them) on the sanitized library, about a minute.
files=${SANITIZE_TESTS:-$(ls tests/*.bats | grep -v -e '^tests/fuzz.bats$' -e '^tests/mpi.bats$' \
    -e '^tests/python.bats$' -e '^tests/dist.bats$' -e '^tests/study.bats$' \
    -e '^tests/cuda-resources.bats$' -e '^tests/isa.bats$') tests/san/python.bats}
# report.bats reads what every other file left in $R: it runs alone, after
# them all (prove's rules: the files in parallel, then it; a file that no
# rule names would run after it, so every one is named)
rules="$B/prove-rules.yml"
# shellcheck disable=SC2086
files=$(slow_first $files)
# prove reads a rules file with CPAN::Meta::YAML (perl's core modules);
# without it every file could run at once: then one at a time
perl -MCPAN::Meta::YAML -e 1 2>/dev/null || JOBS=1
# shellcheck disable=SC2086
{
    printf -- '---\nseq:\n  - par:\n'
    printf '%s\n' $files | sed 's/^/      - /'
    printf '  - seq: tests/san/report.bats\n'
} > "$rules" || exit 1
# shellcheck disable=SC2086
HARNESS_RULESFILE="$rules" exec prove -j"$JOBS" -f -o --timer -e 'bats --tap' \
    $files tests/san/report.bats
