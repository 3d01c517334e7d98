#!/usr/bin/env bats
# lib/blas.c: OpenBLAS is loaded at the first F32 GEMM, never linked: a
# process that runs none never loads it (nor starts its threads); the pool
# starts with the threads the caller asked for; the F32 path's outputs do not
# depend on -@; a library that does not load is one clear error.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load
load helpers/unit
load helpers/bf16_kernels

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    L="$BATS_TEST_DIRNAME/../lib"
    HELP="$BATS_TEST_DIRNAME/helpers"
    D="$BATS_TEST_TMPDIR"
    EXEC="$BIN/lrmoe-exec"
}

# gen | route, and the weights, at a small shape (F32 storage unless $1)
mkin() {
    "$BIN/lrmoe-gen" --tokens 96 --experts 8 --topk 2 --hidden 64 --ffn 32 --dtype "${1:-f32}" \
        --weights "$D/w.lrm" --seed 4 --no-compress > "$D/g.lrm"
    "$BIN/lrmoe-route" --topk 2 --no-compress -o "$D/r.lrm" "$D/g.lrm"
}

# the tensors and the attributes other than timings (*_s) of two streams are equal
same_stream() {
    python3 - "$1" "$2" <<EOF
import sys; sys.path.insert(0, '$HELP')
from lrmoe_stream import read_stream
a, b = read_stream(sys.argv[1], True), read_stream(sys.argv[2], True)
assert len(a) == len(b), 'frame count'
for (ta, aa, da), (tb, ab, db) in zip(a, b):
    assert ta.keys() == tb.keys(), (sorted(ta), sorted(tb))
    for k in ta:
        assert da[k] == db[k] and ta[k].shape == tb[k].shape and ta[k].tobytes() == tb[k].tobytes(), k
    ka = {k: v for k, v in aa.items() if not k.endswith('_s')}
    kb = {k: v for k, v in ab.items() if not k.endswith('_s')}
    assert ka == kb, {k for k in ka.keys() | kb.keys() if ka.get(k) != kb.get(k)}
print('same')
EOF
}

# oneDNN in this build and a native BF16 matmul on this CPU (as exec.bats)
have_bf16() {
    "$EXEC" --phase forward --compute bf16 --weights /nonexistent </dev/null >/dev/null 2>&1
    [ $? -ne 2 ]
}

@test "blas: no tool links libopenblas; cat, plan, score, pack and a BF16 forward and backward (AMX, native, emulated on AVX-512 or AVX2) never load it; an F32 forward and the emulated BF16 on sgemm do" {
    for t in "$BIN"/lrmoe-*; do
        run ldd "$t"
        refute_output --partial libopenblas
    done
    have_bf16 || skip "this build has no oneDNN: no bf16 compute"
    mkin bf16
    # every bf16 kernel this CPU runs (tests/helpers/bf16_kernels.bash) but
    # sgemm's loads no OpenBLAS: AMX, oneDNN's BF16 matmul and lib/gemm_avx2.c's
    # kernel (the emulation's AVX-512 and AVX2 forms); the emulation on OpenBLAS
    # sgemm (no AVX2 and FMA, or LRMOE_AVX2_GEMM=0) must load it
    "$EXEC" --phase forward --compute bf16 --threads 1 --weights "$D/w.lrm" --no-compress \
        -o "$D/probe.lrm" "$D/r.lrm"
    bf=$(python3 -c "import sys; sys.path.insert(0, '$HELP'); from lrmoe_stream import read_stream
print(read_stream('$D/probe.lrm')[0][1]['exec.bf16'])")
    loadless() { # the command succeeds and its loader never names libopenblas
        run env LD_DEBUG=files "$@"
        assert_success
        refute_output --partial "libopenblas"
    }
    bf16run() { # the default kernel, then each kernel this CPU runs, forced
        local k e
        case $bf in
        emulated-sgemm)
            run env LD_DEBUG=files "$@"
            assert_success
            assert_output --partial "file=libopenblas"
            ;;
        *) loadless "$@" ;;
        esac
        while read -r k e <&7; do
            if [ "$k" = emulated-sgemm ]; then
                # shellcheck disable=SC2086
                run env LD_DEBUG=files $e "$@"
                assert_success
                assert_output --partial "file=libopenblas"
            else
                # shellcheck disable=SC2086
                loadless env $e "$@"
            fi
        done 7< <(bf16_kernels)
    }
    loadless "$BIN/lrmoe-cat" --no-compress -o "$D/c.lrm" "$D/r.lrm"
    loadless "$BIN/lrmoe-plan" --ranks 2 --no-compress -o "$D/p.lrm" "$D/r.lrm"
    bf16run "$EXEC" --phase forward --compute bf16 --threads 1 --weights "$D/w.lrm" \
        --no-compress -o "$D/f.lrm" "$D/p.lrm"
    loadless "$BIN/lrmoe-score" --select topk --drop 30 --no-compress -o "$D/s.lrm" "$D/f.lrm"
    loadless "$BIN/lrmoe-pack" --alloc forward --no-compress -o "$D/k.lrm" "$D/s.lrm"
    bf16run "$EXEC" --phase backward --mode compact --compute bf16 --threads 1 \
        --weights "$D/w.lrm" --no-compress -o "$D/b.lrm" "$D/k.lrm"
    run env LD_DEBUG=files "$EXEC" --phase forward --compute f32 --threads 1 \
        --weights "$D/w.lrm" --no-compress -o "$D/f32.lrm" "$D/r.lrm"
    assert_success
    assert_output --partial "file=libopenblas"
}

@test "blas: the pool starts with the threads asked for, OPENBLAS_NUM_THREADS is the caller's again, every transpose exact (tests/unit/blas_test.c)" {
    cp "$(unit_test blas)" "$D/bt"
    for n in 1 2 3; do
        run "$D/bt" $n
        assert_success
        assert_output "loaded=1 threads=$n env=unset"
    done
    # the count asked for wins over the environment's, which stays as it was
    run env OPENBLAS_NUM_THREADS=3 "$D/bt" 1
    assert_output "loaded=1 threads=1 env=3"
    # nothing asked: OpenBLAS's own default, here the environment's
    run env OPENBLAS_NUM_THREADS=2 "$D/bt" 0
    assert_output "loaded=1 threads=2 env=2"
    run env LRMOE_OPENBLAS="$D/none.so" "$D/bt" missing
    assert_success
    assert_output "blas: cannot load OpenBLAS for the F32 GEMMs: $D/none.so: cannot open shared object file: No such file or directory (the path LRMOE_OPENBLAS names)"
    # a library without cblas_sgemm
    libm=$(ldd "$D/bt" | awk '/libm\.so/ {print $3}')
    [ -n "$libm" ] || libm=$(ldd "$D/bt" | awk '/libc\.so/ {print $3}')
    run env LRMOE_OPENBLAS="$libm" "$D/bt" missing
    assert_output "blas: cannot load OpenBLAS for the F32 GEMMs: $libm has no cblas_sgemm (the path LRMOE_OPENBLAS names)"
}

@test "blas: the F32 forward and backward give the same bytes at --threads 1 and 2, through the library's default name and through LRMOE_OPENBLAS" {
    mkin f32
    # the path the loader found by name, named again through LRMOE_OPENBLAS
    so=$(env LD_DEBUG=files "$EXEC" --phase forward --compute f32 --threads 1 --weights "$D/w.lrm" \
        --no-compress -o /dev/null "$D/r.lrm" 2>&1 |
        sed -n 's/.*calling init: \(\/[^ ]*libopenblas[^ ]*\).*/\1/p' | head -n 1)
    [ -n "$so" ] || fail "no libopenblas path in LD_DEBUG=files output"
    for t in 1 2; do
        "$EXEC" --phase forward --compute f32 --threads $t --weights "$D/w.lrm" --no-compress \
            -o "$D/f$t.lrm" "$D/r.lrm"
        "$EXEC" --phase backward --compute f32 --threads $t --weights "$D/w.lrm" --no-compress \
            -o "$D/b$t.lrm" "$D/f$t.lrm"
        LRMOE_OPENBLAS="$so" "$EXEC" --phase forward --compute f32 --threads $t \
            --weights "$D/w.lrm" --no-compress -o "$D/e$t.lrm" "$D/r.lrm"
    done
    run same_stream "$D/f1.lrm" "$D/f2.lrm"
    assert_output same
    run same_stream "$D/b1.lrm" "$D/b2.lrm"
    assert_output same
    run same_stream "$D/f1.lrm" "$D/e2.lrm"
    assert_output same
    run same_stream "$D/f2.lrm" "$D/e1.lrm"
    assert_output same
}

@test "blas: without OpenBLAS the F32 forward, route's logits and score --fidelity fail with exit 1 and one error naming it" {
    mkin f32
    "$EXEC" --phase forward --compute f32 --weights "$D/w.lrm" --no-compress -o "$D/f.lrm" "$D/r.lrm"
    export LRMOE_OPENBLAS="$D/no-such-libopenblas.so"
    why="blas: cannot load OpenBLAS for the F32 GEMMs: $D/no-such-libopenblas.so: cannot open shared object file: No such file or directory (the path LRMOE_OPENBLAS names)"
    run "$EXEC" --phase forward --compute f32 --weights "$D/w.lrm" --no-compress -o "$D/x.lrm" "$D/r.lrm"
    assert_equal "$status" 1
    assert_output "lrmoe-exec: frame 0: $why"
    run "$BIN/lrmoe-route" --topk 2 --from-hidden --weights "$D/w.lrm" --no-compress \
        -o "$D/x.lrm" "$D/g.lrm"
    assert_equal "$status" 1
    assert_output "lrmoe-route: frame 0: $why"
    run "$BIN/lrmoe-score" --select topk --drop 30 --fidelity --no-compress -o "$D/x.lrm" "$D/f.lrm"
    assert_equal "$status" 1
    assert_output "lrmoe-score: frame 0: $why"
}

@test "blas: route's logits and score --fidelity start OpenBLAS with -@'s threads (none past the main one at the default); route's bytes do not depend on it" {
    command -v strace >/dev/null || skip "strace is not installed: cannot count the threads created"
    [ -z "${SANITIZE:-}" ] || skip "LeakSanitizer does not run under ptrace (strace): the plain pass counts the threads"
    [ "$(nproc)" -ge 2 ] || skip "one CPU: OpenBLAS's own default is one thread too, so the count cannot tell"
    mkin f32
    "$EXEC" --phase forward --compute f32 --weights "$D/w.lrm" --no-compress -o "$D/f.lrm" "$D/r.lrm"
    clones() { strace -f -qq -e trace=clone,clone3 -o "$D/st" "$@" && grep -c clone "$D/st" || :; }
    for t in 0 1; do # -@ 0 is route's and score's default of one thread
        run clones "$BIN/lrmoe-route" --topk 2 -@ $t --from-hidden --weights "$D/w.lrm" \
            --no-compress -o "$D/x$t.lrm" "$D/g.lrm"
        assert_output 0
        run clones "$BIN/lrmoe-score" --select topk -@ $t --drop 30 --fidelity --no-compress -o "$D/s$t.lrm" "$D/f.lrm"
        assert_output 0
    done
    # two threads asked: the routing pool's second thread and OpenBLAS's second one
    run clones "$BIN/lrmoe-route" --topk 2 -@ 2 --from-hidden --weights "$D/w.lrm" --no-compress \
        -o "$D/x2.lrm" "$D/g.lrm"
    assert_output 2
    run same_stream "$D/x0.lrm" "$D/x2.lrm"
    assert_output same
}
