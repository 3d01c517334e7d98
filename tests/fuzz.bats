#!/usr/bin/env bats
# The libFuzzer harnesses of tests/fuzz (stream reader, safetensors decoder,
# .npy parser, lrmoe-import's HF mapping) for a short fixed budget each; any finding fails. `make fuzz
# FUZZ_SECONDS=N` runs them longer. Skipped, with the reason, where clang's
# fuzzer runtime is missing (tests/deps.sh installs clang-14 and
# libclang-rt-14-dev).

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

FUZZ_SECONDS=${FUZZ_SECONDS:-20}

fuzz() {
    run sh "$BATS_TEST_DIRNAME/fuzz/run.sh" "$FUZZ_SECONDS" "$1"
    if [ "$status" = 77 ]; then skip "$output"; fi
    echo "$output"
    assert_success
    assert_output --partial "fuzz $1: "
    assert_output --partial "no finding"
}

@test "fuzz: stream reader (buffer and file, raw and zstd, write/read round trip) ${FUZZ_SECONDS} s" {
    fuzz stream
}

@test "fuzz: safetensors decoder (decode and fread agree, encode/decode round trip) ${FUZZ_SECONDS} s" {
    fuzz safetensors
}

@test "fuzz: .npy parser (prefixes, own header, save/load round trip) ${FUZZ_SECONDS} s" {
    fuzz npy
}

@test "fuzz: HF mapping of lrmoe-import (structured frames, zero and 2^62 dims, value oracle) ${FUZZ_SECONDS} s" {
    fuzz hf
}
