# unit_test NAME: build tests/unit/NAME_test.c through the Makefile (its
# module list there) and print the program's path. Plain build unless the
# suite runs sanitized and the program is linked against the library itself
# (score_test: liblrmoe.so.1 of the pass's build).
unit_test() {
    local top="$BATS_TEST_DIRNAME/.." b=build san=
    if [ "$1" = score ] && [ -n "${SANITIZE:-}" ]; then b=${LRMOE_BUILD:-build/san} san=1; fi
    make -s -C "$top" NODEPS=1 ${san:+SANITIZE=1} "$b/unit/$1_test" >&2 || return 1
    echo "$(cd "$top" && pwd)/$b/unit/$1_test"
}
