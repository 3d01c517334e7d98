#!/usr/bin/env bats
# The libFuzzer harnesses of tests/fuzz (stream reader, safetensors decoder,
# .npy parser, lrmoe-import's HF mapping, the stages on structured frames), each on a fixed seed and a fixed
# number of inputs from the seeds and past findings (tests/fuzz/regress),
# about 20 s each: the same inputs on every machine and every run, so a tree
# that passes here passes in CI; any finding fails. `make fuzz FUZZ_SECONDS=N`
# explores with random seeds for longer (its findings go to
# tests/fuzz/regress/ once fixed). FUZZ_RUNS scales the counts. Skipped, with the reason, where clang's
# fuzzer runtime is missing (tests/deps.sh installs clang-14 and
# libclang-rt-14-dev).

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

FUZZ_RUNS=${FUZZ_RUNS:-1}

fuzz() {
    run env FUZZ_RUNS="$FUZZ_RUNS" sh "$BATS_TEST_DIRNAME/fuzz/run.sh" 0 "$1"
    if [ "$status" = 77 ]; then skip "$output"; fi
    echo "$output"
    assert_success
    assert_output --partial "fuzz $1: "
    assert_output --partial "no finding"
}

@test "fuzz: stream reader (buffer and file, raw and zstd, write/read round trip)" {
    fuzz stream
}

@test "fuzz: safetensors decoder (decode and fread agree, encode/decode round trip)" {
    fuzz safetensors
}

@test "fuzz: .npy parser (prefixes, own header, save/load round trip)" {
    fuzz npy
}

@test "fuzz: HF mapping of lrmoe-import (structured frames, zero and 2^62 dims, value oracle)" {
    fuzz hf
}

@test "fuzz: the stages on structured frames (route, plan, score, pack, unpack, exec forward and backward, and the pipeline; 0 or -1 with a message, accepted frames round-trip)" {
    fuzz stages
}
