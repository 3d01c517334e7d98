#!/usr/bin/env bats
# make install PREFIX/DESTDIR puts every tool and page where they belong,
# the tools with PREFIX/lib ($ORIGIN/../lib) alone in their run path.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

@test "make install DESTDIR=... PREFIX=... installs every tool and man page" {
    TOP="$BATS_TEST_DIRNAME/.."
    D="$BATS_TEST_TMPDIR/root"
    run make -C "$TOP" -s install DESTDIR="$D" PREFIX=/opt/lrmoe
    assert_success
    for b in "$TOP"/bin/lrmoe-*; do
        t=$(basename "$b")
        [ -x "$D/opt/lrmoe/bin/$t" ] || fail "$t not installed"
        [ -f "$D/opt/lrmoe/share/man/man1/$t.1" ] || fail "$t.1 not installed"
    done
    [ -f "$D/opt/lrmoe/share/man/man5/lrmoe-stream.5" ]
    [ -f "$D/opt/lrmoe/share/man/man7/lrmoe.7" ]
    run "$D/opt/lrmoe/bin/lrmoe-cat" --version
    assert_success
    # an installed tool's run path is PREFIX/lib alone: no build directory
    for b in "$D"/opt/lrmoe/bin/lrmoe-*; do
        run readelf -d "$b"
        assert_output --regexp 'RUNPATH\).*\[\$ORIGIN/\.\./lib\]'
        refute_output --partial "$(cd "$TOP" && pwd -P)"
    done
    run mandoc -T lint -W warning "$D/opt/lrmoe/share/man/man5/lrmoe-stream.5"
    assert_output ""
}

# issue 39: the device machine has no package registry (apt-get fails), the
# build dependencies' headers only through CPATH, and no MPI
# (tests/gpu/sim-device.sh simulates it).
@test "deps.sh: headers through CPATH count; an optional MPI whose apt-get fails does not fail it; a missing header still does" {
    [ "$(id -u)" = 0 ] || skip "deps.sh tries apt-get only as root"
    source "$BATS_TEST_DIRNAME/gpu/sim-device.sh"
    D="$BATS_TEST_TMPDIR"
    sim_device "$D/sim"
    mkdir -p "$D/carry"
    for h in zstd.h zdict.h zstd_errors.h jansson.h jansson_config.h glpk.h; do cp -L "/usr/include/$h" "$D/carry/"; done
    for h in cblas.h openblas_config.h cblas-openblas.h cblas_mangling.h f77blas.h; do
        [ -e "/usr/include/x86_64-linux-gnu/$h" ] && cp -L "/usr/include/x86_64-linux-gnu/$h" "$D/carry/"
    done
    # the simulation hides them: not found without CPATH
    run sim_env sh -c 'echo "#include <zstd.h>" | $CC -E -x c - -o /dev/null'
    assert_failure
    run sim_env sh -c 'command -v mpicc || exit 1'
    assert_failure
    # with them through CPATH: passes, MPI tried, its failure reported, exit 0
    run sim_env CPATH="$D/carry" sh "$BATS_TEST_DIRNAME/deps.sh" build
    echo "$output"
    assert_success
    assert_output --partial "lrmoe: optional libopenmpi-dev openmpi-bin not installed (apt-get failed): lrmoe-exec without MPI"
    refute_output --partial "libzstd-dev"
    run cat "$D/sim/apt-get.log"
    assert_output "update -qq"
    # a dependency really missing (glpk.h not carried) still fails, named
    rm "$D/carry/glpk.h"
    run sim_env CPATH="$D/carry" sh "$BATS_TEST_DIRNAME/deps.sh" build
    assert_failure
    assert_output --partial "lrmoe: apt-get install libglpk-dev failed"
}

@test "make NODEPS=1 skips the dependency step: deps-build, deps-test and before mpi.mk" {
    TOP="$BATS_TEST_DIRNAME/.."
    run make -C "$TOP" -n NODEPS=1 deps-build deps-test
    assert_success
    refute_output --partial "sh tests/deps.sh"
    assert_output --partial ": NODEPS=1 skips tests/deps.sh build"
    run make -C "$TOP" -n deps-build
    assert_output --partial "sh tests/deps.sh build"
    # mpi.mk of a fresh build directory: detected without deps.sh
    run make -C "$TOP" -n NODEPS=1 BUILD="$BATS_TEST_TMPDIR/b" "$BATS_TEST_TMPDIR/b/lib/error.o"
    assert_success
    refute_output --partial "sh tests/deps.sh"
}

# tests/run.sh on a tree of its own: two files that each wait for the
# other's start (they pass only when run at the same time), and a
# report.bats that passes only when both have ended before it starts
@test "tests/run.sh: two files at a time, the longest first; the sanitized pass runs report.bats alone after every other file; TEST_JOBS is checked" {
    TOP="$BATS_TEST_DIRNAME/.."
    D="$BATS_TEST_TMPDIR/t"
    mkdir -p "$D/tests/san" "$D/m"
    cp "$TOP/tests/run.sh" "$D/tests/"
    # (b ends 3 s after a: a report.bats started in a's freed slot would
    # not find b's end)
    for f in a b; do
        o=$([ $f = a ] && echo b || echo a)
        printf '@test "%s" {\n  touch %s/start-%s\n  for i in $(seq 100); do [ -e %s/start-%s ] && break; sleep 0.1; done\n  [ -e %s/start-%s ]\n  sleep %s\n  touch %s/end-%s\n}\n' \
            $f "$D/m" $f "$D/m" $o "$D/m" $o $([ $f = a ] && echo 0 || echo 3) "$D/m" $f > "$D/tests/$f.bats"
    done
    printf '@test "report" {\n  [ -e %s/end-a ] && [ -e %s/end-b ]\n}\n' "$D/m" "$D/m" > "$D/tests/san/report.bats"
    # a clean environment: bats inside bats must not see this run's BATS_*
    # nor find bats' own libexec before /usr/bin/bats
    P=$(printf '%s\n' "$PATH" | tr : '\n' | grep -v bats-core | paste -sd:)
    E="env -i PATH=$P HOME=$HOME"
    run $E sh "$D/tests/run.sh"
    assert_success
    assert_output --partial "Files=2, Tests=2"
    rm -f "$D"/m/*
    run $E SANITIZE=1 LRMOE_BUILD="$D/b" SANITIZE_TESTS="tests/a.bats tests/b.bats" sh "$D/tests/run.sh"
    assert_success
    assert_output --partial "Files=3, Tests=3"
    [ -e "$D/b/prove-rules.yml" ]
    # one at a time, the first waits 10 s for the other and fails
    rm -f "$D"/m/*
    run $E TEST_JOBS=1 timeout 120 sh "$D/tests/run.sh"
    assert_failure
    for j in 0 00 x -1; do
        run $E TEST_JOBS="$j" sh "$D/tests/run.sh"
        assert_equal "$status" 2
        assert_output "tests/run.sh: TEST_JOBS=$j: not a count of 1 or more"
    done
    # the order: the longest files first, every file once
    mkdir -p "$D/bin"
    printf '#!/bin/sh\necho "$@"\n' > "$D/bin/prove"
    chmod +x "$D/bin/prove"
    run env -i PATH="$D/bin:$P" HOME="$HOME" sh "$TOP/tests/run.sh"
    assert_success
    assert_output --regexp "^-j2 -f -o --timer -e bats --tap tests/dist\.bats tests/python\.bats tests/mpi\.bats "
    assert_equal "$(echo $output | tr ' ' '\n' | grep -c '\.bats$')" "$(ls "$TOP"/tests/*.bats | wc -l)"
    assert_equal "$(echo $output | tr ' ' '\n' | grep '\.bats$' | sort -u | wc -l)" "$(ls "$TOP"/tests/*.bats | wc -l)"
}
