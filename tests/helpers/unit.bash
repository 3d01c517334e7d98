# unit_test NAME: build tests/unit/NAME_test.c through the Makefile (its
# module list there) and print the program's path. Plain build unless the
# suite runs sanitized and the program is linked against the library itself
# (score_test: liblrmoe.so.2 of the pass's build). make check builds them all
# before the files run (two at a time: tests/run.sh), so this make only finds
# the program up to date there; it builds it for a file run on its own.
unit_test() {
    local top="$BATS_TEST_DIRNAME/.." b=build san=
    if [ "$1" = score ] && [ -n "${SANITIZE:-}" ]; then b=${LRMOE_BUILD:-build/san} san=1; fi
    # SANITIZE given explicitly either way: under make check SANITIZE=1 it
    # reaches this make through the environment and MAKEFLAGS
    make -s -C "$top" NODEPS=1 SANITIZE=${san} "$b/unit/$1_test" >&2 || return 1
    echo "$(cd "$top" && pwd)/$b/unit/$1_test"
}
