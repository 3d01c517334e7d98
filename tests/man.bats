#!/usr/bin/env bats
# Every page lints clean; every tool has a page, --help, --version, exit 2 on
# a bad option (two lines: the error, a pointer to --help); every long option
# --help lists is documented in the page.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup() {
    TOP="$BATS_TEST_DIRNAME/.."
}

@test "mandoc -T lint -W warning accepts every page" {
    n=0
    for f in "$TOP"/man/man*/*.[1-9]; do
        run mandoc -T lint -W warning "$f"
        assert_success
        assert_output ""
        n=$((n + 1))
    done
    [ "$n" -ge 3 ]
}

@test "the overview and stream pages exist" {
    [ -f "$TOP/man/man7/lrmoe.7" ]
    [ -f "$TOP/man/man5/lrmoe-stream.5" ]
}

@test "every tool has a page, --help, --version and exits 2 on a bad option" {
    for b in "$TOP"/bin/lrmoe-*; do
        t=$(basename "$b")
        [ -f "$TOP/man/man1/$t.1" ] || fail "no man page for $t"
        run "$b" --help
        assert_success
        assert_output --partial "Usage: $t"
        run "$b" --version
        assert_success
        assert_output --regexp "^$t \(lrmoe\) [0-9]"
        run "$b" --no-such-option
        assert_failure 2
        # the error and a pointer to --help, not the whole help (which would
        # scroll the error off a terminal); lrmoe-study's are argparse's two
        # lines, its usage and the error
        assert_equal "${#lines[@]}" 2
        if [ "$t" = lrmoe-study ]; then
            assert_line --index 1 "$t: error: unrecognized arguments: --no-such-option"
        else
            assert_line --index 0 --regexp "^(.*/)?$t: unrecognized option '--no-such-option'\$"
            assert_line --index 1 "Try '$t --help' for more information."
        fi
    done
}

@test "a usage error found after the options is one line and a pointer to --help" {
    run "$TOP/bin/lrmoe-import"
    assert_failure 2
    assert_output "lrmoe-import: no input files (- for standard input)
Try 'lrmoe-import --help' for more information."
    run "$TOP/bin/lrmoe-score" --weights /nonexistent
    assert_failure 2
    assert_output "lrmoe-score: --weights is only read with --fidelity
Try 'lrmoe-score --help' for more information."
    run "$TOP/bin/lrmoe-exec" --phase sideways
    assert_failure 2
    assert_output "lrmoe-exec: --phase: must be forward or backward
Try 'lrmoe-exec --help' for more information."
    for t in pack score export; do
        run "$TOP/bin/lrmoe-$t" a b
        assert_failure 2
        assert_equal "${#lines[@]}" 2
        assert_line --index 1 "Try 'lrmoe-$t --help' for more information."
    done
}

@test "every long option in --help is documented in the man page" {
    for b in "$TOP"/bin/lrmoe-*; do
        t=$(basename "$b")
        page=$(mandoc -T ascii "$TOP/man/man1/$t.1" | col -b)
        for o in $("$b" --help | grep -oE -- '--[a-z][a-z0-9-]+' | sort -u); do
            printf '%s' "$page" | grep -q -- "$o" || fail "$t: $o is in --help but not in $t(1)"
        done
    done
}
