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
