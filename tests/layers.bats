#!/usr/bin/env bats
# The layer rule of liblrmoe (lib/LAYERS, lrmoe(7) THE LIBRARY): every call
# edge between the compiled modules goes down a layer (tests/helpers/layers.py
# reads them with nm), the table names every module, lrmoe(7)'s module map is
# the table's, and an upward call added to one object is caught by name.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup() {
    TOP="$BATS_TEST_DIRNAME/.."
    B="$TOP/${LRMOE_BUILD:-build}"
    LY="python3 $TOP/tests/helpers/layers.py"
    T="$BATS_TEST_TMPDIR"
}

@test "layers: every call between liblrmoe's modules goes down a layer of lib/LAYERS" {
    run $LY check "$B/lib" "$B/kernels"
    echo "$output"
    assert_success
    assert_output --partial "every call goes down a layer"
}

@test "layers: lrmoe(7)'s module map is lib/LAYERS' (layers.py update writes it)" {
    cp "$TOP/man/man7/lrmoe.7" "$T/lrmoe.7"
    run $LY update "$T/lrmoe.7"
    assert_success
    assert_output ""
    cmp "$TOP/man/man7/lrmoe.7" "$T/lrmoe.7"
}

@test "layers: an upward call, a call within a layer and a module without a layer are each named" {
    mkdir "$T/lib"
    cp "$B"/lib/*.o "$T/lib/"
    # clock (layer 0) made to call frame (layer 2) and error (layer 0)
    printf '%s\n' '#include "lrmoe.h"' \
        'double lrmoe_now(void) { lrmoe_frame_t f; lrmoe_frame_init(&f); return lrmoe_err("x"); }' \
        > "$T/clock.c"
    cc -I"$TOP/lib" -c -o "$T/lib/clock.o" "$T/clock.c"
    run $LY check "$T/lib" "$B/kernels"
    assert_failure
    assert_line "clock (layer 0) calls frame (layer 2, above it): lrmoe_frame_init"
    assert_line "clock (layer 0) calls error (its own layer): lrmoe_err"
    # an object the table does not know
    cp "$B/lib/parse.o" "$T/lib/newmod.o"
    run $LY check "$T/lib" "$B/kernels"
    assert_failure
    assert_line "newmod: a module without a layer (add it to lib/LAYERS)"
}
