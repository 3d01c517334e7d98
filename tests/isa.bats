#!/usr/bin/env bats
# Other CPUs' instruction sets, run on this one under QEMU's user mode
# (qemu-x86_64, its TCG translator: package qemu-user). The environment
# switches of tests/helpers/bf16_kernels.bash choose which code a process
# takes but run it on this CPU, so they cannot show that a CPU without
# AVX-512 never executes an AVX-512 instruction (on such a host that is a
# SIGILL, not a failed test). Here the tools run on two emulated CPUs:
#   -cpu max         AVX2, FMA, F16C and PCLMUL; no AVX-512 of any kind (no
#                    AVX512_BF16, no AMX) and no VPCLMULQDQ: a Haswell..Zen 3
#                    class host, whose bf16 kernel is emulated-avx2;
#   -cpu Nehalem-v1  SSE4.2; no AVX, no FMA, no PCLMUL: a pre-2011 x86-64,
#                    whose bf16 kernel is emulated-sgemm and whose stages
#                    take their scalar forms.
# The first premise test checks that QEMU's models are what these lines say.
# What must hold: every stage runs; the kernel and paths fall back to what
# the CPU has; lrmoe's own forms give this CPU's bits (the AVX2 and AVX-512
# forms of the emulation sum the same products in the same order; the route
# scalar path is LRMOE_NO_SIMD's); OpenBLAS (f32 compute, emulated-sgemm)
# picks its kernel by CPU, so those agree within rounding only; and under
# mpirun a rank on another CPU runs rank 0's kernel bit for bit or ends the
# job naming itself (lrmoe-exec(1), MPI). TCG runs SIMD code 50-100x slower
# than the CPU does: the shapes are small. Plain pass only (tests/run.sh).

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load
load helpers/bf16_kernels
load helpers/unit

AVX2CPU="qemu-x86_64 -cpu max"
OLDCPU="qemu-x86_64 -cpu Nehalem-v1"

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    HELP="$BATS_TEST_DIRNAME/helpers"
    D="$BATS_TEST_TMPDIR"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export TMPDIR="$D"
    command -v qemu-x86_64 >/dev/null ||
        skip "qemu-x86_64 not installed (Debian: qemu-user; tests/deps.sh test installs it)"
    # an ASan tool under QEMU turns its shadow reservation into real pages
    # until the OOM killer ends it (tests/run.sh)
    [ "$(cat "$BIN/.variant" 2>/dev/null)" != san ] ||
        skip "bin/ holds the ASan+UBSan build (make SANITIZE=1): this file runs on the plain one"
}

# pipe DIR PREFIX COMPUTE: the README's pipeline at a small shape, each
# stage run as PREFIX TOOL (PREFIX empty: this CPU), streams kept in DIR
pipe() {
    local o=$1 p=$2 c=$3 r=--no-compress
    mkdir -p "$o"
    $p "$BIN/lrmoe-gen" --experts 8 --topk 2 --hidden 64 --ffn 48 --tokens 96 --skew hot:50:2 \
        --weights "$o/w.lrm" --seed 3 $r > "$o/in.lrm" &&
    $p "$BIN/lrmoe-route" -k 2 $r "$o/in.lrm" > "$o/r.lrm" &&
    $p "$BIN/lrmoe-plan" --planner lrmoe --ranks 2 --hbm 200K $r "$o/r.lrm" > "$o/p.lrm" &&
    $p "$BIN/lrmoe-exec" --phase forward --compute "$c" -@ 1 --weights "$o/w.lrm" $r \
        "$o/p.lrm" > "$o/f.lrm" &&
    $p "$BIN/lrmoe-score" $r "$o/f.lrm" > "$o/s.lrm" &&
    $p "$BIN/lrmoe-pack" $r "$o/s.lrm" > "$o/k.lrm" &&
    $p "$BIN/lrmoe-exec" --phase backward --mode compact --compute "$c" -@ 1 \
        --weights "$o/w.lrm" $r "$o/k.lrm" > "$o/b.lrm"
}

# cmp_streams A B TOL: every frame's tensors (names, dtypes, shapes) and the
# attributes but exec.* and clock readings; TOL 0: the same bytes, else
# |a - b| <= TOL |b| + 1e-5 max|b| elementwise (TOL: the relative rounding
# two summation orders may leave, per dtype: "bf16=X,f32=Y")
cmp_streams() {
    python3 - "$HELP" "$1" "$2" "$3" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
from lrmoe_stream import read_stream, bf16_to_f32
a = read_stream(sys.argv[2], with_dtypes=True)
b = read_stream(sys.argv[3], with_dtypes=True)
tol = {} if sys.argv[4] == "0" else dict((k.upper(), float(v)) for k, v in
                                        (x.split("=") for x in sys.argv[4].split(",")))
bad = []
if len(a) != len(b):
    sys.exit("frames: %d vs %d" % (len(a), len(b)))
def kept(x):
    return {k: v for k, v in x.items() if not k.startswith("exec.") and not k.endswith(("seconds", "_s"))}
for i, ((ta, aa, da), (tb, ab, db)) in enumerate(zip(a, b)):
    if set(ta) != set(tb):
        bad.append("frame %d: tensors %s vs %s" % (i, sorted(ta), sorted(tb)))
        continue
    if kept(aa) != kept(ab):
        bad.append("frame %d: attributes differ" % i)
    for n in sorted(ta):
        x, y = ta[n], tb[n]
        if da[n] != db[n] or x.shape != y.shape:
            bad.append("frame %d: %s: %s%s vs %s%s" % (i, n, da[n], x.shape, db[n], y.shape))
        elif da[n].upper() not in tol:
            if x.tobytes() != y.tobytes():
                bad.append("frame %d: %s differs" % (i, n))
        else:
            if da[n].upper() == "BF16":
                x, y = bf16_to_f32(x), bf16_to_f32(y)
            x, y = x.astype(np.float64), y.astype(np.float64)
            lim = tol[da[n].upper()] * np.abs(y) + 1e-5 * np.abs(y).max()
            if not np.all(np.abs(x - y) <= lim):
                bad.append("frame %d: %s: max |a-b| %.3g beyond tolerance" % (i, n, np.abs(x - y).max()))
if bad:
    sys.exit("\n".join(bad))
print("%s: %d frames" % ("identical" if not tol else "within tolerance", len(a)))
EOF
}

# same_but_gemm_order A B: pipe's streams in dirs A and B where B's GEMMs
# (OpenBLAS, which picks its kernel by CPU) summed in another order: the
# generated, routing and plan streams are lrmoe's own code, the same bytes;
# the rest within rounding: sums of at most F=48 or T=96 products in
# another order differ by a few F32 ulps (2^-24 each) of the largest terms,
# and a BF16 output lands one BF16 ulp (2^-8 of the value) apart where that
# moved a rounding
same_but_gemm_order() {
    local s
    for s in in r p; do
        run cmp_streams "$1/$s.lrm" "$2/$s.lrm" 0
        assert_success
    done
    for s in f s k b; do
        run cmp_streams "$1/$s.lrm" "$2/$s.lrm" "bf16=0.0079,f32=1e-5"
        assert_success
    done
}

attr() { "$BIN/lrmoe-view" --no-stats "$2" | sed -n "s/^ *$1=//p" | head -1; }

have_bf16() {
    "$BIN/lrmoe-gen" --experts 4 --topk 1 --hidden 16 --ffn 8 --tokens 4 --weights "$D/w0.lrm" \
        --no-compress | "$BIN/lrmoe-route" -k 1 --no-compress |
        "$BIN/lrmoe-exec" --phase forward --compute bf16 --weights "$D/w0.lrm" --no-compress \
        > /dev/null 2>&1 || skip "this build has no bf16 compute (oneDNN missing at build time)"
}

@test "isa: the premises: QEMU's -cpu max has AVX2, FMA and F16C but no AVX-512 and no VPCLMULQDQ; Nehalem-v1 has SSE4.2 but no AVX, FMA or PCLMUL" {
    cat > "$D/cpu.c" <<'EOF'
#include <stdio.h>
int main(void)
{
    __builtin_cpu_init();
    printf("avx2=%d fma=%d f16c=%d avx512f=%d avx512bf16=%d pclmul=%d vpclmulqdq=%d sse4.2=%d avx=%d\n",
           !!__builtin_cpu_supports("avx2"), !!__builtin_cpu_supports("fma"),
           !!__builtin_cpu_supports("f16c"), !!__builtin_cpu_supports("avx512f"),
           !!__builtin_cpu_supports("avx512bf16"), !!__builtin_cpu_supports("pclmul"),
           !!__builtin_cpu_supports("vpclmulqdq"), !!__builtin_cpu_supports("sse4.2"),
           !!__builtin_cpu_supports("avx"));
    return 0;
}
EOF
    cc -O1 -o "$D/cpu" "$D/cpu.c"
    run $AVX2CPU "$D/cpu"
    assert_success
    assert_output "avx2=1 fma=1 f16c=1 avx512f=0 avx512bf16=0 pclmul=1 vpclmulqdq=0 sse4.2=1 avx=1"
    run $OLDCPU "$D/cpu"
    assert_success
    assert_output "avx2=0 fma=0 f16c=0 avx512f=0 avx512bf16=0 pclmul=0 vpclmulqdq=0 sse4.2=1 avx=0"
    # and an instruction the model lacks is a SIGILL there (what a real
    # host does), not emulated anyway: the tests below would see it
    printf 'int main(void){__asm__ volatile("vpxord %%%%zmm0,%%%%zmm0,%%%%zmm0":::"xmm0");return 0;}\n' |
        cc -x c -o "$D/z" -
    run $AVX2CPU "$D/z"
    assert_equal "$status" 132
}

@test "isa: a CPU without AVX-512 (QEMU -cpu max): the pipeline runs, bf16 takes emulated-avx2, every stream is this CPU's AVX-512 and AVX2 emulation forms' bit for bit" {
    have_bf16
    pipe "$D/q" "$AVX2CPU" bf16
    run attr exec.bf16 "$D/q/b.lrm"
    assert_output emulated-avx2
    local k e n=0
    while read -r k e <&7; do
        [[ $k == emulated-avx512 || $k == emulated-avx2 ]] || continue
        pipe "$D/$k" "env $e" bf16
        run attr exec.bf16 "$D/$k/b.lrm"
        assert_output "$k"
        for s in in r p f s k b; do
            run cmp_streams "$D/q/$s.lrm" "$D/$k/$s.lrm" 0
            assert_success
        done
        n=$((n + 1))
    done 7< <(bf16_kernels)
    [ "$n" -gt 0 ]
}

@test "isa: a CPU without AVX-512 (QEMU -cpu max): f32 compute (OpenBLAS's AVX2 kernels) agrees with this CPU's within F32 rounding" {
    pipe "$D/q" "$AVX2CPU" f32
    pipe "$D/n" "" f32
    run attr exec.compute "$D/q/b.lrm"
    assert_output f32
    same_but_gemm_order "$D/q" "$D/n"
}

@test "isa: a CPU without AVX (QEMU -cpu Nehalem-v1): every stage runs, routing is the scalar path's bits, bf16 takes emulated-sgemm within rounding of this CPU's" {
    have_bf16
    pipe "$D/q" "$OLDCPU" bf16
    run attr exec.bf16 "$D/q/b.lrm"
    assert_output emulated-sgemm
    pipe "$D/n" "env LRMOE_NO_SIMD=1 LRMOE_BF16_EMULATE=1 LRMOE_AVX2_GEMM=0" bf16
    run attr exec.bf16 "$D/n/b.lrm"
    assert_output emulated-sgemm
    # OpenBLAS's SSE kernels there, its AVX-512 ones here
    same_but_gemm_order "$D/q" "$D/n"
    # and f32 compute runs there too
    pipe "$D/q32" "$OLDCPU" f32
    run attr exec.compute "$D/q32/b.lrm"
    assert_output f32
}

@test "isa: the kernel switches cannot take a CPU past what it has: LRMOE_AMX=1, LRMOE_DPBF16=1, LRMOE_BF16_EMULATE=0 or LRMOE_AVX2_GEMM=512 without AVX-512 still run emulated-avx2, the same bytes" {
    have_bf16
    "$BIN/lrmoe-gen" --experts 8 --topk 2 --hidden 64 --ffn 48 --tokens 64 --weights "$D/w.lrm" \
        --seed 5 --no-compress | "$BIN/lrmoe-route" -k 2 --no-compress > "$D/r.lrm"
    $AVX2CPU "$BIN/lrmoe-exec" --phase forward --compute bf16 -@ 1 --weights "$D/w.lrm" \
        --no-compress -o "$D/f0.lrm" "$D/r.lrm"
    local e
    for e in LRMOE_AMX=1 LRMOE_DPBF16=1 LRMOE_BF16_EMULATE=0 LRMOE_AVX2_GEMM=512 \
             "LRMOE_SWIGLU_VEC=1 LRMOE_COMBINE_VEC=1 LRMOE_AVX2_DIRECT=1"; do
        # shellcheck disable=SC2086
        run env $e $AVX2CPU "$BIN/lrmoe-exec" --phase forward --compute bf16 -@ 1 \
            --weights "$D/w.lrm" --no-compress -o "$D/f1.lrm" "$D/r.lrm"
        assert_success
        run attr exec.bf16 "$D/f1.lrm"
        assert_output emulated-avx2
        run cmp_streams "$D/f1.lrm" "$D/f0.lrm" 0
        assert_success
    done
}

@test "isa: unit programs on the emulated CPUs: CRC-64 with PCLMUL and no VPCLMULQDQ, and with the table alone; SwiGLU's scalar form" {
    local crc sw
    crc=$(unit_test crc64)
    sw=$(unit_test swiglu)
    run $AVX2CPU "$crc" quick
    assert_success
    assert_line "crc64: default path pclmul"
    assert_line "crc64: path pclmul run: 0 failed"
    assert_line --partial "crc64: path avx512 skipped"
    assert_line --regexp "^crc64: [0-9]+ cases, 0 failed$"
    run $OLDCPU "$crc" quick
    assert_success
    assert_line "crc64: default path table"
    assert_line --partial "crc64: path pclmul skipped"
    assert_line --regexp "^crc64: [0-9]+ cases, 0 failed$"
    for q in "$AVX2CPU" "$OLDCPU"; do
        run $q "$sw" 65537
        assert_success
        assert_line "vec: no"
        assert_line --regexp "^[0-9]+ cases, 0 failed$"
    done
}

@test "isa: mpirun with ranks on CPUs without AVX-512 or AVX: rank 0's emulation form runs on them bit for bit; a kernel they cannot run ends the job naming the rank" {
    have_bf16
    command -v mpirun >/dev/null || skip "mpirun not installed (openmpi-bin)"
    local MPIRUN="timeout 120 mpirun --mca btl tcp,self --oversubscribe"
    "$BIN/lrmoe-gen" --tokens 61 --experts 8 --topk 2 --hidden 32 --ffn 16 --skew hot:50:2 \
        --weights "$D/w.lrm" --seed 3 --no-compress | "$BIN/lrmoe-route" -k 2 --no-compress -o "$D/r.lrm"
    run $MPIRUN -np 1 "$BIN/lrmoe-exec" --phase forward --weights "$D/w.lrm" "$D/r.lrm"
    [[ "$output" != *"MPI support is not built"* ]] ||
        skip "lrmoe-exec built without MPI (libopenmpi-dev missing at build time)"
    local A="--phase forward --compute bf16 --weights $D/w.lrm -@ 1 --no-compress -o $D/f2.lrm $D/r.lrm"
    # rank 0 here on the AVX-512 form (or the AVX2 form on a CPU without
    # AVX-512F), ranks 1 and 2 without AVX-512: the AVX2 form, the same bits
    local e="LRMOE_BF16_EMULATE=1"
    bf16_kernels | grep -q '^emulated-avx512 ' || e="LRMOE_BF16_EMULATE=1 LRMOE_AVX2_GEMM=256"
    # shellcheck disable=SC2086
    env $e "$BIN/lrmoe-exec" --phase forward --compute bf16 --weights "$D/w.lrm" -P 3 -@ 1 \
        --no-compress -o "$D/f1.lrm" "$D/r.lrm"
    # shellcheck disable=SC2086
    run $MPIRUN -np 1 env $e "$BIN/lrmoe-exec" $A : -np 2 $AVX2CPU "$BIN/lrmoe-exec" $A
    assert_success
    run cmp_streams "$D/f2.lrm" "$D/f1.lrm" 0
    assert_success
    run attr exec.bf16 "$D/f2.lrm"
    assert_output "$(attr exec.bf16 "$D/f1.lrm")"
    # rank 0 on the AVX2 form, rank 2 on a CPU without AVX2 and FMA
    # shellcheck disable=SC2086
    run $MPIRUN -np 1 env LRMOE_BF16_EMULATE=1 LRMOE_AVX2_GEMM=256 "$BIN/lrmoe-exec" $A : \
        -np 1 "$BIN/lrmoe-exec" $A : -np 1 $OLDCPU "$BIN/lrmoe-exec" $A
    assert_failure
    [ "$status" -ne 124 ]
    assert_equal "$(printf '%s\n' "$output" | grep -c '^lrmoe-exec: ')" 1
    assert_line --regexp "^lrmoe-exec: rank 2: the job's bf16 kernel is emulated-avx2 .*needs AVX2 and FMA"
    # rank 0 on this CPU's own BF16 instructions (amx, dpbf16 or oneDNN's
    # native matmul), rank 1 without AVX-512: it names itself and what it lacks
    local k
    k=$(bf16_kernels | grep -m1 -E '^(amx|dpbf16|native) ' | cut -d' ' -f1)
    [ -n "$k" ] || skip "this CPU has no BF16 instructions: no kernel for the emulated ranks to lack"
    e=$(bf16_kernels | grep -m1 "^$k " | cut -d' ' -f2-)
    # shellcheck disable=SC2086
    run $MPIRUN -np 1 env $e "$BIN/lrmoe-exec" $A : -np 2 $AVX2CPU "$BIN/lrmoe-exec" $A
    assert_failure
    [ "$status" -ne 124 ]
    assert_equal "$(printf '%s\n' "$output" | grep -c '^lrmoe-exec: ')" 1
    assert_line --regexp "^lrmoe-exec: rank 1: the job's bf16 kernel is $k .*"
}
