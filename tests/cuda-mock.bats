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
        # liblrmoe.a holds the kernels as one partially linked cuda.o whose
        # CUDA symbols would come from libcudart; link the build's own
        # kernel objects and the library's C objects against the mock
        K="$TOP/${BUILD:-build}/kernels"
        [ -f "$LIB" ] || skip "no $LIB (run make first)"
        [ -f "$K/kcu.o" ] || skip "built without CUDA (no $K/kcu.o)"
        CF="-std=c11 -O1 -Wall -Wextra -D_GNU_SOURCE -I$TOP/lib -I$TOP/kernels"
        cc $CF -c -o "$D/mock-cuda.o" "$TOP/tests/gpu/mock-cuda.c"
        cc $CF -c -o "$D/mock-run.o" "$TOP/tests/gpu/mock-run.c"
        (cd "$D" && ar x "$LIB" && rm -f cuda.o)
        # the build's libraries less CUDA's (lrmoe.pc's Libs.private)
        LP=$(sed -n 's/^Libs.private: //p' "$TOP/${BUILD:-build}/lrmoe.pc" |
             sed -e 's/-L[^ ]*cuda[^ ]*//g' -e 's/-Wl,-rpath,[^ ]*cuda[^ ]*//g' \
                 -e 's/-lcudart//; s/-lcublas//; s/-lnccl//')
        objs=$(ar t "$LIB" | grep -vx cuda.o | sed "s,^,$D/,")
        # the CUTLASS variants (--gemm cutlass) where the build has them
        gg=$(ls "$K"/cutlass/gg_*.o 2>/dev/null || true)
        cc -o "$D/mock-run" "$D/mock-run.o" "$D/mock-cuda.o" "$K"/kcu.o "$K"/gemm.o \
            "$K"/comm_nccl.o "$K"/comm_nccl_rank.o "$K"/exec_cuda.o "$K"/ggemm.o $gg $objs $LP -lstdc++
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
    [ "$(grep -c '^gemm rc=0$' <<< "$output")" -eq 5 ]
    # pointer arrays and widen descriptors: two uploads a call, all pinned
    [ "$(grep -c '^memcpy H2D pinned' "$D/log")" -eq 10 ]
    ! grep -q '^memcpy H2D pageable' "$D/log"
    # the staging lives until the context goes: no host_free before destroy
    run awk '$0 == "mark destroy" { on = 1 } $1 == "host_free" && !on { print; exit 1 }
             $1 == "host_free" { n++ } END { if (n != 4) { print n " host_free"; exit 1 } }' "$D/log"
    echo "$output"
    assert_success
    # four slots in turn: the fifth call waits for the event the first
    # recorded behind its work (not yet covered by a host wait), and
    # nothing else waits on the host
    run awk '$0 == "mark gemm" { call++ }
             call == 1 && $1 == "event_record" && $3 == "s2" && first == "" { first = $2 }
             $1 == "event_sync" { if (call != 5 || $2 != first) { print "event_sync " $2 " in call " call; exit 1 } n++ }
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

# host synchronisations per phase of mock-run exec: stream, event and device
# syncs, and copies from or to pageable memory (synchronous for the host)
host_syncs() {
    awk '$1 == "mark" { ph = $2 }
         $1 == "stream_sync" || $1 == "event_sync" || $1 == "device_sync" ||
         ($1 == "memcpy" && $3 == "pageable") { n[ph]++ }
         END { for (p in n) print p, n[p] }' "$D/log" | sort
}
syncs_in() { host_syncs | awk -v p="$1" '$1 == p { print $2; f = 1 } END { if (!f) print 0 }'; }

@test "cuda-mock: the persistent executor waits on the host once per forward and per backward at P=8, E=128" {
    MOCK_NDEV=8 run "$RUN" exec
    echo "$output"
    assert_success
    out=$output
    for p in oneshot_fwd oneshot_bwd new fwd1 bwd1 fwd2 bwd2 fwd3 bwd3 new1 set_io dfwd1 dbwd1 \
             dfwd2 dbwd2 dfwd3 dbwd3; do
        grep -qx "$p rc=0" <<< "$out" || { echo "no '$p rc=0'"; false; }
    done
    host_syncs
    # the one-shot calls (lrmoe_exec_forward/backward: an executor made and
    # freed per call, its contexts drained at teardown) for comparison
    echo "one-shot forward: $(syncs_in oneshot_fwd) host syncs, backward: $(syncs_in oneshot_bwd)" >&3
    echo "steady forward: $(syncs_in fwd2) host syncs, backward: $(syncs_in bwd2)" >&3
    for p in fwd2 bwd2 fwd3 bwd3; do
        n=$(syncs_in "$p")
        [ "$n" -ge 1 ] && [ "$n" -le 2 ] || { echo "$p: $n host syncs"; false; }
    done
    # the first frame too (weights uploaded through pinned staging)
    [ "$(syncs_in fwd1)" -le 2 ] && [ "$(syncs_in bwd1)" -le 2 ]
    # steady state: no pinned allocation, no pageable copy, weights not uploaded again
    run awk '$1 == "mark" { on = ($2 == "fwd2" || $2 == "bwd2" || $2 == "fwd3" || $2 == "bwd3") }
             on && ($1 == "host_alloc" || $1 == "host_free" || $3 == "pageable" || $1 == "pool_trim" ||
                    $1 == "blas_create" || $1 == "nccl_init") { print; bad = 1 }
             END { exit bad }' "$D/log"
    echo "$output"
    assert_success
    # device-pointer I/O: no host wait at a frame's end, one at the next
    # frame's start (the last frame's staging is reused)
    echo "device I/O steady forward: $(syncs_in dfwd2) host syncs, backward: $(syncs_in dbwd2)" >&3
    for p in dbwd1 dfwd2 dbwd2 dfwd3 dbwd3; do
        [ "$(syncs_in "$p")" -eq 1 ] || { echo "$p: $(syncs_in "$p") host syncs"; false; }
    done
    run awk '$1 == "mark" { on = ($2 ~ /^d(fwd|bwd)[23]$/) }
             on && ($1 == "host_alloc" || $1 == "host_free" || $3 == "pageable") { print; bad = 1 }
             END { exit bad }' "$D/log"
    echo "$output"
    assert_success
    # --gemm grouped: its pinned slots (four per context) are reused across
    # frames without a wait (their calls ended before the last frame's wait)
    rm -f "$D/log"
    MOCK_NDEV=8 MOCK_GEMM_GROUPED=1 run "$RUN" exec
    assert_success
    echo "--gemm grouped steady forward: $(syncs_in fwd2) host syncs, backward: $(syncs_in bwd2)" >&3
    for p in fwd2 bwd2 fwd3 bwd3 dfwd2 dbwd2 dfwd3 dbwd3; do
        n=$(syncs_in "$p")
        [ "$n" -ge 1 ] && [ "$n" -le 2 ] || { echo "grouped $p: $n host syncs"; false; }
    done
    grep -q '^gemm_grouped ' "$D/log"
    # every rank's stream ran work: 8 streams joined by events into one
    run awk '$1 == "mark" { on = ($2 == "fwd2") } on && $1 == "wait_event" { n++ }
             END { if (n < 7) { print n " waits"; exit 1 } }' "$D/log"
    assert_success
}

@test "cuda-mock: lrmoe_exec_cuda_score runs after the caller's stream and brings back only the scores (lrm, gradnorm, absgrad)" {
    MOCK_NDEV=8 run "$RUN" exec
    assert_success
    out=$output
    # in each metric's phase: the context's stream waits for an event
    # recorded on the caller's stream, the kernels run (BF16 g widened,
    # pair_score), and the two copies to the host are pair_score's error
    # flag and the scores (g and ||phi||^2 never come back); nothing goes up
    # (gradnorm uploads no unit weights)
    for m in lrm gradnorm absgrad; do
        grep -qx "dscore_$m rc=0" <<< "$out" || { echo "no 'dscore_$m rc=0'"; false; }
        run awk -v ph="dscore_$m" '$1 == "mark" { on = ($2 == ph) }
             on && $1 == "event_record" { rec[$2] = 1 }
             on && $1 == "wait_event" && ($3 in rec) { waited = 1 }
             on && $1 == "launch" { n++ }
             on && $1 == "memcpy" && $2 == "D2H" && $3 == "pageable" { d2h++ }
             on && $1 == "memcpy" && $2 == "H2D" { h2d++ }
             END { print "waited", waited + 0, "launches", n + 0, "d2h", d2h + 0, "h2d", h2d + 0 }' "$D/log"
        echo "$m: $output"
        assert_output "waited 1 launches 2 d2h 2 h2d 0"
        echo "score $m: $(syncs_in "dscore_$m") host syncs" >&3
    done
}

@test "cuda-mock: a device-pointer frame with host routing under CUDA graph capture is refused before it queues anything" {
    MOCK_NDEV=8 MOCK_CAPTURE_AT_END=1 run "$RUN" exec
    assert_success
    assert_line "capture_fwd rc=-1 err=backend cuda: a frame cannot be captured into a CUDA graph (its index arrays are staged from the host per frame); run it outside the capture, or route on the device (device I/O 2)"
    run awk '$1 == "mark" { on = ($2 == "capture") } on && ($1 == "launch" || $1 == "memcpy" || $1 == "gemm") { print; bad = 1 }
             END { exit bad }' "$D/log"
    assert_success
}

@test "cuda-mock: the compact step's input checks, deferred, are read once (4 read-backs -> 1)" {
    run "$RUN" flags
    echo "$output"
    assert_success
    for c in pair_score select pack_assign pack_unpack; do
        [ "$(grep -c "^$c rc=0$" <<< "$output")" -eq 2 ] || { echo "$c did not succeed twice"; false; }
    done
    assert_line "check rc=0"
    host_syncs
    echo "compact step checks: $(syncs_in immediate) host syncs immediate, $(syncs_in deferred) deferred" >&3
    # immediate: each kernel copies its word to pageable memory and waits
    [ "$(grep -c . <<< "$(awk '$1 == "mark" { ph = $2 } ph == "immediate" && $1 == "stream_sync"' "$D/log")")" -eq 4 ]
    # deferred: one copy of the words into pinned memory, one wait
    [ "$(syncs_in deferred)" -eq 1 ]
    run awk '$1 == "mark" { ph = $2 } ph == "deferred" && $1 == "memcpy" && $2 == "D2H" { print $3 }' "$D/log"
    assert_output "pinned"
}

@test "cuda-mock: device routing (one rank) queues a frame with no host transfer and no wait; it runs under CUDA graph capture" {
    [ -n "${LRMOE_MOCK_RUN:-}" ] || nm "$LIB" 2>/dev/null | grep -q kcu_gg_sm90_0 ||
        skip "liblrmoe.a has no CUTLASS objects (built without the headers): device routing needs them"
    run "$RUN" route
    echo "$output"
    assert_success
    for p in new set_io rfwd1 rbwd1 rfwd2 rbwd2 rfwd3 rbwd3 cfwd cbwd after; do
        assert_line "$p rc=0"
    done
    assert_line "cnew rc=-1 err=backend cuda: these weights are not resident yet: run one frame outside the CUDA graph capture first"
    host_syncs
    # uncaptured steady frames: the one wait is the last frame's input
    # checks read back (lrmoe_kcu_flags_check); captured: none at all
    for p in rfwd2 rbwd2 rfwd3 rbwd3; do
        n=$(syncs_in "$p")
        [ "$n" -le 1 ] || { echo "$p: $n host syncs"; false; }
    done
    echo "device routing: steady forward $(syncs_in rfwd3), backward $(syncs_in rbwd3) host syncs; captured $(syncs_in cfwd) and $(syncs_in cbwd)" >&3
    [ "$(syncs_in cfwd)" -eq 0 ] && [ "$(syncs_in cbwd)" -eq 0 ]
    # nothing crosses to or from the host in a steady or captured frame, no
    # pinned memory is made, and the frames do queue their kernels (the
    # layout, gathers, SwiGLU, the CUTLASS GEMMs)
    run awk '$1 == "mark" { on = ($2 ~ /^(rfwd[23]|rbwd[23]|cfwd|cbwd)$/); ph = $2 }
             on && $1 == "memcpy" && ($2 == "H2D" || ($2 == "D2H" && ph ~ /^c/)) { print ph, $0; bad = 1 }
             on && ($1 == "host_alloc" || $1 == "host_free") { print ph, $0; bad = 1 }
             END { exit bad }' "$D/log"
    echo "$output"
    assert_success
    for p in cfwd cbwd; do
        n=$(awk -v ph="$p" '$1 == "mark" { on = ($2 == ph) } on && $1 == "launch" { n++ } END { print n + 0 }' "$D/log")
        [ "$n" -ge 8 ] || { echo "$p: $n launches"; false; }
    done
    # the refused frame queued nothing
    run awk '$1 == "mark" { on = ($2 == "cnew") } on && ($1 == "launch" || $1 == "memcpy") { print; bad = 1 }
             END { exit bad }' "$D/log"
    assert_success
}
