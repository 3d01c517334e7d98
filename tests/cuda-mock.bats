#!/usr/bin/env bats
# The CUDA backend's host logic without a GPU: the context (kernels/kcu.cu),
# the GEMM paths (gemm.cu) and the communicator (comm_nccl.cu) from the
# built liblrmoe.a, linked against tests/gpu/mock-cuda.c (a recorder in
# place of libcudart, libcublas and libnccl) and driven by
# tests/gpu/mock-run.c. The mock's call log shows the stream forks and
# joins, staging, pool settings and teardown order. LRMOE_MOCK_RUN names
# another mock-run binary (to watch these tests fail on older sources).

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup() {
    TOP="$BATS_TEST_DIRNAME/.."
    D="$BATS_TEST_TMPDIR"
    LIB="$TOP/${BUILD:-build}/liblrmoe.a"
    RUN=${LRMOE_MOCK_RUN:-}
    if [ -z "$RUN" ]; then
        [ -f "$LIB" ] || skip "no $LIB (run make first)"
        ar t "$LIB" | grep -qx "kcu.o\|cuda.o" || skip "liblrmoe.a was built without CUDA (no kernels/kcu.o or cuda.o)"
        CF="-std=c11 -O1 -Wall -Wextra -D_GNU_SOURCE -I$TOP/lib -I$TOP/kernels"
        cc $CF -c -o "$D/mock-cuda.o" "$TOP/tests/gpu/mock-cuda.c"
        cc $CF -c -o "$D/mock-run.o" "$TOP/tests/gpu/mock-run.c"
        cc -o "$D/mock-run" "$D/mock-run.o" "$D/mock-cuda.o" "$LIB" -lstdc++ -lzstd -ljansson \
            -lglpk -lopenblas -lm -lpthread -ldl
        RUN="$D/mock-run"
    fi
    export MOCK_CUDA_LOG="$D/log"
    rm -f "$D/log"
}

# side streams of the first context: the streams cuBLAS handles are bound to
sides() { awk '$1 == "blas_stream" { print $3 }' "$D/log" | sort -u; }
main_stream() { awk '$1 == "stream_create" { print $2; exit }' "$D/log"; }

# the side streams $2 (default: all) are joined into the main stream after
# line pattern $1 and before the next "mark" line: event_record eK sX, then
# wait_event MAIN eK
joined_after() {
    awk -v pat="$1" -v main="$(main_stream)" -v sides="${2:-$(sides | tr '\n' ' ')}" '
        BEGIN { n = split(sides, s, " "); for (i = 1; i <= n; i++) want[s[i]] = 1 }
        !on && $0 ~ pat { on = 1; next }
        on && $1 == "mark" { exit }
        on && $1 == "event_record" { ev[$2] = $3 }
        on && $1 == "wait_event" && $2 == main && ($3 in ev) { done[ev[$3]] = 1 }
        END { if (!on) { print "pattern not found: " pat; exit 1 }
              for (x in want) if (!(x in done)) { print "side stream " x " not joined"; bad = 1 }
              exit bad }' "$D/log"
}

@test "cuda-mock: gemm loop joins every side stream, also after a failing GEMM" {
    run "$RUN" loop
    assert_success
    assert_line "gemm rc=0"
    [ "$(sides | wc -l)" -eq 4 ]
    run joined_after "^mark gemm"
    assert_success
    # six GEMMs round-robin over the four side streams
    [ "$(awk '$1 == "gemm" { print $3 }' "$D/log" | sort -u | wc -l)" -eq 4 ]

    rm -f "$D/log"
    MOCK_GEMM_FAIL=2 run "$RUN" loop
    assert_success
    assert_line "gemm rc=-1 err=cublasGemmEx: mock status"
    grep -q "^gemm h[0-9]* s[0-9]* FAIL$" "$D/log"
    # no GEMM after the failure, and every side stream joined after it
    [ "$(awk '/FAIL$/ { f = 1; next } f && $1 == "gemm"' "$D/log" | wc -l)" -eq 0 ]
    run joined_after "^gemm .* FAIL$"
    echo "$output"
    assert_success
}

@test "cuda-mock: ctx_destroy drains the main and every side stream before destroying any" {
    run "$RUN" loop
    assert_success
    run awk -v sides="$(sides | tr '\n' ' ')" -v main="$(main_stream)" '
        BEGIN { n = split(sides " " main, s, " "); for (i = 1; i <= n; i++) want[s[i]] = 1 }
        $0 == "mark destroy" { on = 1; next }
        on && $1 == "stream_sync" { synced[$2] = 1 }
        on && ($1 == "blas_destroy" || $1 == "stream_destroy") {
            for (x in want) if (!(x in synced)) { print $0 " before stream_sync " x; bad = 1; exit 1 }
            seen = 1 }
        END { if (bad) exit 1; if (!seen) { print "nothing destroyed"; exit 1 } }' "$D/log"
    echo "$output"
    assert_success
}

@test "cuda-mock: grouped GEMM uploads only from pinned staging kept for the context's life" {
    run "$RUN" grouped
    assert_success
    [ "$(grep -c '^gemm rc=0$' <<< "$output")" -eq 3 ]
    # pointer arrays and widen descriptors: two uploads a call, all pinned
    [ "$(grep -c '^memcpy H2D pinned' "$D/log")" -eq 6 ]
    ! grep -q '^memcpy H2D pageable' "$D/log"
    # the staging lives until the context goes: no host_free before destroy
    run awk '$0 == "mark destroy" { on = 1 } $1 == "host_free" && !on { print; exit 1 }
             $1 == "host_free" { n++ } END { if (n != 2) { print n " host_free"; exit 1 } }' "$D/log"
    echo "$output"
    assert_success
    # two slots in turn: the third call waits for the event the first
    # recorded behind its work, and nothing else waits on the host
    run awk '$0 == "mark gemm" { call++ }
             call == 1 && $1 == "event_record" && $3 == "s2" && first == "" { first = $2 }
             $1 == "event_sync" { if (call != 3 || $2 != first) { print "event_sync " $2 " in call " call; exit 1 } n++ }
             END { if (n != 1) { print n " event_sync"; exit 1 } }' "$D/log"
    echo "$output"
    assert_success
    # the grouped call runs on the first side stream only
    side0=$(awk '$1 == "blas_stream" { print $3; exit }' "$D/log")
    run joined_after "^mark gemm" "$side0"
    assert_success
    # the widen kernel runs at its launch-table block size
    grep -q '^launch grid=64,3 block=256 ' "$D/log"

    rm -f "$D/log"
    MOCK_GROUPED_FAIL=1 run "$RUN" grouped
    assert_line "gemm rc=-1 err=cublasGemmGroupedBatchedEx: mock status"
    run joined_after "^gemm_grouped .* FAIL$" "$side0"
    echo "$output"
    assert_success
}

@test "cuda-mock: --gemm cutlass: one pinned upload, the CUTLASS kernels on the first side stream, a misaligned GEMM on cuBLAS" {
    [ -n "${LRMOE_MOCK_RUN:-}" ] || nm "$LIB" 2>/dev/null | grep -q kcu_gg_sm90_0 ||
        skip "liblrmoe.a has no CUTLASS objects (built without the headers)"
    run "$RUN" cutlass
    echo "$output"
    cat "$D/log"
    assert_success
    assert_line "gemm rc=0"
    # six 16x16x16 GEMMs, F32 and BF16 C: two launches (variants 000 and
    # 001), their arrays in one upload from the pinned slot, no cuBLAS
    [ "$(grep -c '^memcpy H2D pinned' "$D/log")" -eq 1 ]
    ! grep -q '^memcpy H2D pageable' "$D/log"
    ! grep -q '^gemm h' "$D/log"
    ! grep -q '^gemm_grouped' "$D/log"
    side0=$(awk '$1 == "blas_stream" { print $3; exit }' "$D/log")
    [ "$(grep -c "^launch grid=.* block=384 shm=[0-9]* $side0\$" "$D/log")" -eq 2 ]
    grep -q '^driver_entry cuTensorMapEncodeTiled' "$D/log"
    run joined_after "^mark gemm" "$side0"
    assert_success

    rm -f "$D/log"
    MOCK_GEMM_MISALIGN=2 run "$RUN" cutlass
    assert_line "gemm rc=0"
    # GEMM 2 (F32 C) on cuBLAS, the other five still in two launches
    [ "$(grep -c '^gemm h' "$D/log")" -eq 1 ]
    [ "$(grep -c '^launch grid=.* block=384 ' "$D/log")" -eq 2 ]

    # not a Hopper GPU: one clear error, no launch, the side stream joined
    rm -f "$D/log"
    MOCK_CC=8.0 run "$RUN" cutlass
    assert_line "gemm rc=-1 err=ggemm: the CUTLASS grouped GEMM is built for sm_90a (Hopper) only; device 0 is sm_80"
    ! grep -q '^launch grid=.* block=384 ' "$D/log"
    run joined_after "^mark gemm" "$side0"
    assert_success
}

@test "cuda-mock: pools keep memory (threshold UINT64_MAX, trimmed at destroy) and open to peer devices" {
    run "$RUN" comm
    assert_success
    assert_line "comm rc=0"
    assert_line "nccl=0"   # ranks share device 1: device copies
    # cudaMemPoolAttrReleaseThreshold (4) on both devices' pools
    grep -q '^pool_attr pool0 attr=4 value=18446744073709551615$' "$D/log"
    grep -q '^pool_attr pool1 attr=4 value=18446744073709551615$' "$D/log"
    [ "$(grep -c '^pool_trim pool0 0$' "$D/log")" -ge 1 ]
    # each distinct device's pool opened read/write to the other, once
    run grep '^pool_access' "$D/log"
    assert_output "pool_access pool0 dev=1 type=1 flags=3
pool_access pool1 dev=0 type=1 flags=3"
    # device 1 cannot reach device 0: its pool stays closed to it
    rm -f "$D/log"
    MOCK_NOPEER=1:0 run "$RUN" comm
    assert_line "comm rc=0"
    run grep '^pool_access' "$D/log"
    assert_output "pool_access pool1 dev=0 type=1 flags=3"
}
