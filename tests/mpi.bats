#!/usr/bin/env bats
# lrmoe-exec under mpirun (one EP rank per process, lib/exec_mpi.c): the
# output of `mpirun -np P lrmoe-exec` equals the single-process `-P P` run bit
# for bit; per-rank attributes; faults end the job quickly with one message
# naming the rank. OpenMPI over TCP (--mca btl tcp,self), as root.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load
load helpers/bf16_kernels

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    TOP="$BATS_TEST_DIRNAME/.."
    HELP="$BATS_TEST_DIRNAME/helpers"
    D="$BATS_TEST_TMPDIR"
    EXEC="$BIN/lrmoe-exec"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    # OpenMPI's session directory (TMPDIR/ompi.HOST.UID) per test, so that two
    # suites running at once on one machine cannot race on a shared one
    export TMPDIR="$D"
    # every job ends (or is killed) within this bound: nothing may hang
    MPIRUN="timeout 120 mpirun --mca btl tcp,self --oversubscribe"
}

teardown() {
    # the namespaces of the two-host test (their veth pair goes with them)
    [ -z "${NS_A:-}" ] || ip netns del "$NS_A" 2>/dev/null || true
    [ -z "${NS_B:-}" ] || ip netns del "$NS_B" 2>/dev/null || true
}

# skip (saying why) unless mpirun exists and lrmoe-exec was built with MPI
need_mpi() {
    command -v mpirun >/dev/null || skip "mpirun not installed (openmpi-bin)"
    run $MPIRUN -np 1 "$EXEC" --phase forward --weights "$D/none.lrm" "$D/none.lrm"
    if [[ "$output" == *"MPI support is not built"* ]]; then
        skip "lrmoe-exec built without MPI (libopenmpi-dev missing at build time)"
    fi
}

# the two streams have the same tensors, bytes, dtypes and non-exec attributes
same() {
    python3 - "$HELP" "$1" "$2" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1])
from lrmoe_stream import read_stream
a = read_stream(sys.argv[2], with_dtypes=True)
b = read_stream(sys.argv[3], with_dtypes=True)
bad = []
if len(a) != len(b):
    sys.exit("frames: %d vs %d" % (len(a), len(b)))
for i, ((ta, aa, da), (tb, ab, db)) in enumerate(zip(a, b)):
    if set(ta) != set(tb):
        bad.append("frame %d: tensors %s vs %s" % (i, sorted(ta), sorted(tb)))
        continue
    for n in sorted(ta):
        if da[n] != db[n] or ta[n].shape != tb[n].shape or ta[n].tobytes() != tb[n].tobytes():
            bad.append("frame %d: %s differs" % (i, n))
    # exec.* and every stage's own clock readings (score.seconds, ...) vary
    def kept(x):
        return {k: v for k, v in x.items()
                if not k.startswith("exec.") and not k.endswith(("seconds", "_s"))}
    ka, kb = kept(aa), kept(ab)
    if ka != kb:
        bad.append("frame %d: attributes differ" % i)
    for k in ("exec.ranks", "exec.backend", "exec.backward.mode"):
        if aa.get(k) != ab.get(k):
            bad.append("frame %d: %s %s vs %s" % (i, k, aa.get(k), ab.get(k)))
if bad:
    sys.exit("\n".join(bad))
print("identical: %d frames" % len(a))
EOF
}

no_trailer() {
    run python3 -c "import sys; sys.path.insert(0, '$HELP'); from lrmoe_stream import read_stream; read_stream('$1')"
    assert_failure
    assert_output --partial "no trailer"
}

# exactly one "lrmoe-exec:" line in $output, naming rank $1 and containing $2
one_message() {
    local n
    n=$(printf '%s\n' "$output" | grep -c '^lrmoe-exec: ')
    assert_equal "$n" 1
    assert_line --regexp "^lrmoe-exec: rank $1: .*$2"
}

# gen | route into $D/r.lrm: T tokens, E=8, K=2, D=32, F=16
routed() { # T dtype [extra gen options]
    "$BIN/lrmoe-gen" --tokens "$1" --experts 8 --topk 2 --hidden 32 --ffn 16 --dtype "$2" \
        --skew hot:50:2 --weights "$D/w.lrm" --seed 3 --no-compress "${@:3}" |
        "$BIN/lrmoe-route" -k 2 --no-compress -o "$D/r.lrm"
}

# forward, then full, masked and compact backward, under mpirun -np P and
# in one process with -P P: every output stream identical. $1 = P, then the
# planners, one frame each (none: plain EP without a plan, alone in its
# stream: score drops 30%, pack -P P; with plans the quotas are the plan's).
compare_all() {
    local P=$1 pl PP="" m in
    shift
    if [ "$1" = none ]; then
        cp "$D/r.lrm" "$D/p.lrm"
        PP="-P $P"
    else
        for pl in "$@"; do
            "$BIN/lrmoe-plan" --planner "$pl" --ranks "$P" --rates 1.0,0.8,0.7 --min-chunk 4 \
                --no-compress "$D/r.lrm" > "$D/p-$pl.lrm"
        done
        (cd "$D" && "$BIN/lrmoe-cat" --no-compress $(printf 'p-%s.lrm ' "$@") > p.lrm)
    fi
    "$EXEC" --phase forward --weights "$D/w.lrm" $PP -@ 1 --no-compress "$D/p.lrm" > "$D/f1.lrm"
    run $MPIRUN -np "$P" "$EXEC" --phase forward --weights "$D/w.lrm" -@ 1 --no-compress \
        -o "$D/f2.lrm" "$D/p.lrm"
    assert_success
    run same "$D/f2.lrm" "$D/f1.lrm"
    assert_success
    assert_output "identical: $# frames"
    if [ "$1" = none ]; then
        "$BIN/lrmoe-score" --select topk --drop 30 --no-compress "$D/f1.lrm" > "$D/s.lrm"
        "$BIN/lrmoe-pack" -P "$P" --no-compress "$D/s.lrm" > "$D/pk.lrm"
    else
        "$BIN/lrmoe-score" --select topk --no-compress "$D/f1.lrm" > "$D/s.lrm"
        "$BIN/lrmoe-pack" --no-compress "$D/s.lrm" > "$D/pk.lrm"
    fi
    for m in full masked compact; do
        in="$D/s.lrm"
        [ "$m" = compact ] && in="$D/pk.lrm"
        "$EXEC" --phase backward --mode "$m" --weights "$D/w.lrm" -@ 1 --no-compress "$in" \
            > "$D/b1.lrm"
        run $MPIRUN -np "$P" "$EXEC" --phase backward --mode "$m" --weights "$D/w.lrm" -@ 1 \
            --no-compress -o "$D/b2.lrm" "$in"
        assert_success
        run same "$D/b2.lrm" "$D/b1.lrm"
        assert_success
    done
}

@test "mpi: --launcher is documented and checked; usage errors exit 2" {
    run "$EXEC" --help
    assert_success
    assert_output --partial "--launcher"
    run "$EXEC" --phase forward --weights x --launcher ssh
    assert_equal "$status" 2
    assert_line --partial "--launcher: 'ssh' is not auto, mpi or none"
}

@test "mpi: a build without MPI says so under --launcher mpi and under an MPI launcher" {
    # the library and lrmoe-exec compiled here without LRMOE_HAVE_MPI (and CUDA)
    mkdir -p "$D/o"
    for f in "$TOP"/lib/*.c "$TOP"/src/lrmoe-exec.c; do
        cc -O0 -std=c11 -D_GNU_SOURCE -pthread -I"$TOP/lib" -c -o "$D/o/$(basename "$f" .c).o" "$f" ||
            return 1
    done
    cc -o "$D/exec-nompi" "$D"/o/*.o -lzstd -ljansson -lglpk -lopenblas -lm -lpthread
    run "$D/exec-nompi" --phase forward --weights x --launcher mpi
    assert_equal "$status" 2
    assert_line --partial "lrmoe-exec: --launcher mpi: MPI support is not built"
    run env OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 "$D/exec-nompi" --phase forward --weights x
    assert_equal "$status" 2
    assert_line --partial "started by an MPI launcher: MPI support is not built"
    # --launcher none still runs one process
    routed 20 f32
    run "$D/exec-nompi" --phase forward --weights "$D/w.lrm" -P 2 --launcher none -o "$D/f.lrm" "$D/r.lrm"
    assert_success
}

@test "mpi: forward and full/masked/compact backward equal -P P bit for bit, F32, no plan (P=2, 4) and every planner (P=4)" {
    need_mpi
    routed 61 f32
    compare_all 2 none
    compare_all 4 none
    compare_all 4 fixed llep eplb lrmoe
}

@test "mpi: BF16, P=3 (T and E not divisible by P), lrmoe and eplb plans (replicas), bit for bit" {
    need_mpi
    routed 61 bf16
    compare_all 3 none
    compare_all 4 lrmoe eplb
    # EPLB's plan holds redundant experts (lrmoe's may need none), so weights
    # and gradients crossed point to point
    run python3 -c "import sys; sys.path.insert(0, '$HELP'); from lrmoe_stream import read_stream
t, a = read_stream('$D/b2.lrm')[1]
print(a['plan.planner'], a['plan.replicas'], a['exec.backward.p2p_bytes'])"
    assert_success
    assert_output --regexp '^eplb '
    refute_output --regexp '^eplb 0 '
    refute_output --regexp ' 0,0,0,0$'
}

# the exec.compute attribute of every frame of $1
compute_of() {
    python3 -c "import sys; sys.path.insert(0, '$HELP'); from lrmoe_stream import read_stream
print(' '.join(sorted({a['exec.compute'] for t, a in read_stream('$1')})))"
}

@test "mpi: BF16 weights under --compute f32, bf16 and auto: every rank uses rank 0's numerics, bit for bit" {
    need_mpi
    routed 61 bf16
    local c
    # explicit numerics, forward and full backward, P=3
    for c in f32 bf16; do
        "$EXEC" --phase forward --compute $c --weights "$D/w.lrm" -P 3 -@ 1 --no-compress \
            "$D/r.lrm" > "$D/f1-$c.lrm"
        run $MPIRUN -np 3 "$EXEC" --phase forward --compute $c --weights "$D/w.lrm" -@ 1 \
            --no-compress -o "$D/f2.lrm" "$D/r.lrm"
        assert_success
        run same "$D/f2.lrm" "$D/f1-$c.lrm"
        assert_success
        run compute_of "$D/f2.lrm"
        assert_output "$c"
        "$EXEC" --phase backward --compute $c --weights "$D/w.lrm" -@ 1 --no-compress \
            "$D/f1-$c.lrm" > "$D/b1.lrm"
        run $MPIRUN -np 3 "$EXEC" --phase backward --compute $c --weights "$D/w.lrm" -@ 1 \
            --no-compress -o "$D/b2.lrm" "$D/f1-$c.lrm"
        assert_success
        run same "$D/b2.lrm" "$D/b1.lrm"
        assert_success
    done
    # auto resolved by each host alone would differ between hosts of
    # different CPUs; DNNL_MAX_CPU_ISA=AVX2 plays such a host (no native BF16:
    # auto is f32 there). Rank 0 on that host: all ranks run f32.
    "$EXEC" --phase forward --weights "$D/w.lrm" -P 3 -@ 1 --no-compress "$D/r.lrm" > "$D/fa.lrm"
    DNNL_MAX_CPU_ISA=AVX2 "$EXEC" --phase forward --weights "$D/w.lrm" -P 3 -@ 1 \
        --no-compress "$D/r.lrm" > "$D/fx.lrm"
    if [ "$(compute_of "$D/fa.lrm")" != bf16 ] || [ "$(compute_of "$D/fx.lrm")" != f32 ]; then
        skip "auto is $(compute_of "$D/fa.lrm") here and $(compute_of "$D/fx.lrm") under DNNL_MAX_CPU_ISA=AVX2: no mixed hosts to play"
    fi
    local A="--phase forward --weights $D/w.lrm -@ 1 --no-compress -o $D/fm.lrm $D/r.lrm"
    run $MPIRUN -np 1 -x DNNL_MAX_CPU_ISA=AVX2 "$EXEC" $A : -np 2 "$EXEC" $A
    assert_success
    run same "$D/fm.lrm" "$D/f1-f32.lrm"
    assert_success
    # rank 0 on a native-BF16 host, the others not: rank 0's kernel is every
    # rank's, so the answer is rank 0's bf16 one where they can run it (rank
    # 0 emulates: an AVX512_BF16 CPU whose FMAs outrun its dot product), else
    # the job fails naming a rank and what it lacks; never a mix
    run $MPIRUN -np 1 "$EXEC" $A : -np 2 -x DNNL_MAX_CPU_ISA=AVX2 "$EXEC" $A
    case $(bf16_of "$D/f1-bf16.lrm") in
    native | amx)
        assert_failure
        [ "$status" -ne 124 ]
        one_message 1 "the job's bf16 kernel is (native|amx) .*: this process's oneDNN has no native BF16 matmul"
        no_trailer "$D/fm.lrm"
        ;;
    *)
        assert_success
        run same "$D/fm.lrm" "$D/f1-bf16.lrm"
        assert_success
        ;;
    esac
}

# the exec.bf16 attribute of every frame of $1
bf16_of() {
    python3 -c "import sys; sys.path.insert(0, '$HELP'); from lrmoe_stream import read_stream
print(' '.join(sorted({a.get('exec.bf16', '-') for t, a in read_stream('$1')})))"
}

@test "mpi: one bf16 kernel per job: each kernel this CPU runs, chosen on rank 0 alone, is every rank's, bit for bit, named in exec.bf16; a rank that cannot run it ends the job with one message naming it and what it lacks" {
    need_mpi
    routed 61 bf16
    "$EXEC" --phase forward --compute bf16 --weights "$D/w.lrm" -P 3 -@ 1 --no-compress \
        "$D/r.lrm" > "$D/fd.lrm" 2>/dev/null || skip "this build has no oneDNN: no bf16 compute"
    local k e A B r kd ran=0
    kd=$(bf16_of "$D/fd.lrm")
    # every kernel this CPU runs (tests/helpers/bf16_kernels.bash), forced on
    # rank 0 only: ranks 1 and 2 (this CPU's default kernel, $kd) run it
    while read -r k e <&7; do
        # shellcheck disable=SC2086
        env $e "$EXEC" --phase forward --compute bf16 --weights "$D/w.lrm" -P 3 -@ 1 \
            --no-compress "$D/r.lrm" > "$D/f1.lrm"
        # shellcheck disable=SC2086
        env $e "$EXEC" --phase backward --compute bf16 --weights "$D/w.lrm" -@ 1 \
            --no-compress "$D/f1.lrm" > "$D/b1.lrm"
        A="--phase forward --compute bf16 --weights $D/w.lrm -@ 1 --no-compress -o $D/f2.lrm $D/r.lrm"
        B="--phase backward --compute bf16 --weights $D/w.lrm -@ 1 --no-compress -o $D/b2.lrm $D/f1.lrm"
        # shellcheck disable=SC2086
        run $MPIRUN -np 1 env $e "$EXEC" $A : -np 2 "$EXEC" $A
        if [[ $e == *DNNL_MAX_CPU_ISA* ]]; then
            # an AMX CPU's oneDNN capped on rank 0 only: the others' oneDNN
            # runs another implementation (another summation order)
            assert_failure
            one_message 1 "this process's oneDNN is .* with .*amx"
            no_trailer "$D/f2.lrm"
            continue
        fi
        assert_success
        run same "$D/f2.lrm" "$D/f1.lrm"
        assert_success
        run bf16_of "$D/f2.lrm"
        assert_output "$k"
        # shellcheck disable=SC2086
        run $MPIRUN -np 1 env $e "$EXEC" $B : -np 2 "$EXEC" $B
        assert_success
        run same "$D/b2.lrm" "$D/b1.lrm"
        assert_success
        run bf16_of "$D/b2.lrm"
        assert_output "$k"
        [ "$k" = "$kd" ] || ran=$((ran + 1))
    done 7< <(bf16_kernels)
    [ "$ran" -gt 0 ] # at least one kernel that is not the ranks' own default
    # --per-rank inputs: every rank writes its own frames, with rank 0's kernel
    # (OpenBLAS sgemm's emulation, no CPU's default) and its name
    LRMOE_BF16_EMULATE=1 LRMOE_AVX2_GEMM=0 "$EXEC" --phase forward --compute bf16 \
        --weights "$D/w.lrm" -P 3 -@ 1 --no-compress "$D/r.lrm" > "$D/f1.lrm"
    shard_py split "$D/r.lrm" 3 "$D/r.%r.lrm"
    A="--phase forward --compute bf16 --weights $D/w.lrm -@ 1 --no-compress --per-rank -o $D/f.%r.lrm $D/r.%r.lrm"
    run $MPIRUN -np 1 env LRMOE_BF16_EMULATE=1 LRMOE_AVX2_GEMM=0 "$EXEC" $A : -np 2 "$EXEC" $A
    assert_success
    shard_py join "$D/f.%r.lrm" 3 "$D/fj.lrm"
    run same "$D/fj.lrm" "$D/f1.lrm"
    assert_success
    for r in 0 1 2; do
        run bf16_of "$D/f.$r.lrm"
        assert_output emulated-sgemm
    done
    # rank 0 on the AVX-512 form of the emulation, ranks 1 and 2 playing a
    # Zen 3 host (no BF16 matmul, no AVX-512F): they run the AVX2 form, which
    # gives the same bits
    if bf16_kernels | grep -q '^emulated-avx512 '; then
        A="--phase forward --compute bf16 --weights $D/w.lrm -@ 1 --no-compress -o $D/f2.lrm $D/r.lrm"
        LRMOE_BF16_EMULATE=1 "$EXEC" --phase forward --compute bf16 --weights "$D/w.lrm" -P 3 \
            -@ 1 --no-compress "$D/r.lrm" > "$D/f1.lrm"
        run $MPIRUN -np 1 env LRMOE_BF16_EMULATE=1 "$EXEC" $A : \
            -np 2 env DNNL_MAX_CPU_ISA=AVX2 LRMOE_AVX2_GEMM=256 "$EXEC" $A
        assert_success
        run same "$D/f2.lrm" "$D/f1.lrm"
        assert_success
        run bf16_of "$D/f2.lrm"
        assert_output emulated-avx512
    fi
    # rank 0 on lib/gemm_avx2.c's kernel, rank 2 without it (LRMOE_AVX2_GEMM=0
    # plays a CPU without AVX2 and FMA): one message naming rank 2
    if bf16_kernels | grep -q '^emulated-avx2 '; then
        run $MPIRUN -np 1 env LRMOE_BF16_EMULATE=1 LRMOE_AVX2_GEMM=256 "$EXEC" $A : \
            -np 1 "$EXEC" $A : -np 1 env LRMOE_AVX2_GEMM=0 "$EXEC" $A
        assert_failure
        [ "$status" -ne 124 ]
        one_message 2 "the job's bf16 kernel is emulated-avx2 .*needs AVX2 and FMA"
        no_trailer "$D/f2.lrm"
    fi
    # rank 0 on lrmoe's vdpbf16ps kernel, rank 2 without AVX512_BF16
    # (LRMOE_DPBF16=0 plays such a CPU): one message naming rank 2
    if bf16_kernels | grep -q '^dpbf16 '; then
        e=$(bf16_kernels | grep -m1 '^dpbf16 ' | cut -d' ' -f2-)
        # shellcheck disable=SC2086
        run $MPIRUN -np 1 env $e "$EXEC" $A : -np 1 "$EXEC" $A : -np 1 env LRMOE_DPBF16=0 "$EXEC" $A
        assert_failure
        [ "$status" -ne 124 ]
        one_message 2 "the job's bf16 kernel is dpbf16 .*needs AVX-512F/BW/VL and AVX512_BF16"
        no_trailer "$D/f2.lrm"
    fi
    # rank 0 on oneDNN's BF16 matmul (or AMX), ranks 1 and 2 whose oneDNN has
    # none: one message, from the lowest of them
    e=$(bf16_kernels | grep -m1 -E '^(amx|native) ' | cut -d' ' -f2-)
    [ -n "$e" ] || skip "this CPU has no BF16 matmul: no native kernel to lack"
    # shellcheck disable=SC2086
    run $MPIRUN -np 1 env $e "$EXEC" $A : -np 2 env DNNL_MAX_CPU_ISA=AVX2 "$EXEC" $A
    assert_failure
    [ "$status" -ne 124 ]
    one_message 1 "this process's oneDNN has no native BF16 matmul"
    no_trailer "$D/f2.lrm"
}

@test "mpi: in a pipeline (stdin and stdout through mpirun, zstd, several steps and layers)" {
    need_mpi
    "$BIN/lrmoe-gen" --tokens 40 --experts 8 --topk 2 --hidden 32 --ffn 16 --dtype bf16 \
        --steps 2 --layers 2 --weights "$D/w.lrm" --seed 5 |
        "$BIN/lrmoe-route" -k 2 | "$BIN/lrmoe-plan" --planner llep --ranks 2 --min-chunk 2 > "$D/p.lrm"
    $MPIRUN -np 2 "$EXEC" --phase forward --weights "$D/w.lrm" -@ 1 < "$D/p.lrm" |
        "$BIN/lrmoe-score" --select topk | "$BIN/lrmoe-pack" |
        $MPIRUN -np 2 "$EXEC" --phase backward --mode compact --weights "$D/w.lrm" -@ 1 \
        > "$D/mpi.lrm"
    "$EXEC" --phase forward --weights "$D/w.lrm" -@ 1 < "$D/p.lrm" |
        "$BIN/lrmoe-score" --select topk | "$BIN/lrmoe-pack" |
        "$EXEC" --phase backward --mode compact --weights "$D/w.lrm" -@ 1 > "$D/one.lrm"
    run same "$D/mpi.lrm" "$D/one.lrm"
    assert_success
    assert_output "identical: 4 frames"
}

@test "mpi: per-rank times, bytes and the critical rank are frame attributes; --timings on rank 0" {
    need_mpi
    routed 64 bf16
    run $MPIRUN -np 2 "$EXEC" --phase forward --weights "$D/w.lrm" -@ 1 --no-compress \
        --timings "$D/t.tsv" -o "$D/f.lrm" "$D/r.lrm"
    assert_success
    # bytes each rank sent by all-to-all: its tokens' pairs out, the rows it
    # computed back, D=32 BF16 each
    run python3 -c "import sys; sys.path.insert(0, '$HELP'); from lrmoe_stream import read_stream
import numpy as np
t, a = read_stream('$D/f.lrm')[0]
T, K = t['topk_ids'].shape; P = 2
pr = t['pair_rank'].reshape(-1)
want = [((T * (r + 1) // P - T * r // P) * K + int((pr == r).sum())) * 32 * 2 for r in range(P)]
got = [int(x) for x in a['exec.forward.a2a_bytes'].split(',')]
assert got == want, (got, want)
for k in ('exec.forward.total_s', 'exec.forward.gemm_s', 'exec.forward.a2a_s'):
    v = [float(x) for x in a[k].split(',')]
    assert len(v) == P and all(x > 0 for x in v), (k, v)
tot = [float(x) for x in a['exec.forward.total_s'].split(',')]
assert int(a['exec.forward.critical_rank']) == int(np.argmax(tot))
assert a['exec.launcher'] == 'mpi' and a['exec.ranks'] == '2'
assert int(a['exec.forward.scatter_bytes']) == T * 32 * 2
print('ok')"
    assert_success
    assert_output "ok"
    # one TSV, written by rank 0: a header and one row per rank
    run awk -F'\t' 'NR > 1 {n++} END {print NR, n}' "$D/t.tsv"
    assert_output "3 2"
}

# per-rank streams (tests/helpers/lrmoe_shard.py): split IN P PATTERN, join PATTERN P OUT
shard_py() { python3 "$HELP/lrmoe_shard.py" "$@"; }

@test "mpi: --per-rank: each rank reads and writes its own token rows; the shards joined equal the scattered run bit for bit" {
    need_mpi
    routed 61 bf16
    local P pl m
    # P=3: plain EP, T and E not divisible by P; P=4: an EPLB plan (replicas)
    for P in 3 4; do
        if [ $P = 4 ]; then
            "$BIN/lrmoe-plan" --planner eplb --ranks $P --min-chunk 4 --no-compress "$D/r.lrm" \
                > "$D/p.lrm"
        else
            cp "$D/r.lrm" "$D/p.lrm"
        fi
        "$BIN/lrmoe-cat" --no-compress "$D/p.lrm" "$D/p.lrm" > "$D/p2.lrm" # two frames
        run $MPIRUN -np $P "$EXEC" --phase forward --weights "$D/w.lrm" -@ 1 --no-compress \
            -o "$D/f.lrm" "$D/p2.lrm"
        assert_success
        shard_py split "$D/p2.lrm" $P "$D/p.%r.lrm"
        run $MPIRUN -np $P "$EXEC" --phase forward --weights "$D/w.lrm" -@ 1 --no-compress \
            --per-rank -o "$D/f.%r.lrm" "$D/p.%r.lrm"
        assert_success
        shard_py join "$D/f.%r.lrm" $P "$D/fj.lrm"
        run same "$D/fj.lrm" "$D/f.lrm"
        assert_success
        assert_output "identical: 2 frames"
        # --compute f32 too (auto is bf16 on a CPU with a BF16 matmul): rank 0's
        # F32 weight copy must hold the experts it computes, not only those its
        # own rows route to
        run $MPIRUN -np $P "$EXEC" --phase forward --compute f32 --weights "$D/w.lrm" -@ 1 \
            --no-compress -o "$D/f32.lrm" "$D/p2.lrm"
        assert_success
        run $MPIRUN -np $P "$EXEC" --phase forward --compute f32 --weights "$D/w.lrm" -@ 1 \
            --no-compress --per-rank -o "$D/f32.%r.lrm" "$D/p.%r.lrm"
        assert_success
        shard_py join "$D/f32.%r.lrm" $P "$D/f32j.lrm"
        run same "$D/f32j.lrm" "$D/f32.lrm"
        assert_success
        assert_output "identical: 2 frames"
        if [ $P = 4 ]; then
            "$BIN/lrmoe-score" --select topk --no-compress "$D/f.lrm" > "$D/s.lrm"
        else
            "$BIN/lrmoe-score" --select topk --drop 30 --no-compress "$D/f.lrm" > "$D/s.lrm"
        fi
        shard_py split "$D/s.lrm" $P "$D/s.%r.lrm"
        for m in full masked; do
            run $MPIRUN -np $P "$EXEC" --phase backward --mode $m --weights "$D/w.lrm" -@ 1 \
                --no-compress -o "$D/b.lrm" "$D/s.lrm"
            assert_success
            run $MPIRUN -np $P "$EXEC" --phase backward --mode $m --weights "$D/w.lrm" -@ 1 \
                --no-compress --per-rank -o "$D/b.%r.lrm" "$D/s.%r.lrm"
            assert_success
            shard_py join "$D/b.%r.lrm" $P "$D/bj.lrm"
            run same "$D/bj.lrm" "$D/b.lrm"
            assert_success
        done
    done
    # the EPLB plan's replicas crossed point to point; every shard says so
    run python3 -c "import sys; sys.path.insert(0, '$HELP'); from lrmoe_stream import read_stream
t, a = read_stream('$D/b.2.lrm')[0]
print(a['exec.inputs'], a['exec.launcher'], a['exec.backward.p2p_bytes'])"
    assert_output --regexp '^per-rank mpi '
    refute_output --regexp ' 0,0,0,0$'
}

@test "mpi: --per-rank refuses what it cannot run, and inputs that disagree end the job with one message" {
    need_mpi
    routed 40 f32
    run "$EXEC" --phase forward --weights "$D/w.lrm" --per-rank -o "$D/o.%r.lrm" "$D/r.%r.lrm"
    assert_equal "$status" 2
    assert_line --partial "--per-rank: only under an MPI launcher"
    run $MPIRUN -np 2 "$EXEC" --phase forward --weights "$D/w.lrm" --per-rank -o "$D/o.lrm" \
        "$D/r.%r.lrm"
    assert_equal "$status" 2
    [ "$(grep -c '^lrmoe-exec: --per-rank: FILE and --output must each hold %r' <<< "$output")" = 1 ]
    run $MPIRUN -np 2 "$EXEC" --phase backward --mode compact --weights "$D/w.lrm" --per-rank \
        -o "$D/o.%r.lrm" "$D/r.%r.lrm"
    assert_equal "$status" 2
    assert_line --partial "backward compact needs the global pack"
    # rows not in the ranks' ranges: 40 tokens as 25 + 15
    python3 -c "import sys; sys.path.insert(0, '$HELP'); from lrmoe_stream import *
fr = read_stream('$D/r.lrm', with_dtypes=True)
for r, (lo, hi) in enumerate(((0, 25), (25, 40))):
    write_stream('$D/u.%d.lrm' % r, [({n: (v[lo:hi] if v.shape[:1] == (40,) else v) for n, v in t.items()}, a, d) for t, a, d in fr])"
    run $MPIRUN -np 2 "$EXEC" --phase forward --weights "$D/w.lrm" --per-rank -o "$D/o.%r.lrm" \
        "$D/u.%r.lrm"
    assert_failure
    [ "$status" -ne 124 ]
    [ "$(grep -c '^lrmoe-exec: ' <<< "$output")" = 1 ]
    assert_line --partial "rank 0 has 25 tokens, but rank r must hold rows [r*T/P, (r+1)*T/P) of all T=40: 20"
    no_trailer "$D/o.0.lrm"
    # rank 1's input has one frame more than rank 0's
    shard_py split "$D/r.lrm" 2 "$D/v.%r.lrm"
    "$BIN/lrmoe-cat" --no-compress "$D/v.1.lrm" "$D/v.1.lrm" > "$D/v2.lrm"
    mv "$D/v2.lrm" "$D/v.1.lrm"
    run $MPIRUN -np 2 "$EXEC" --phase forward --weights "$D/w.lrm" --per-rank -o "$D/o.%r.lrm" \
        "$D/v.%r.lrm"
    assert_failure
    [ "$status" -ne 124 ]
    [ "$(grep -c '^lrmoe-exec: ' <<< "$output")" = 1 ]
    assert_line --partial "per-rank inputs: rank 0's input ended after 1 frames, rank 1's has more"
    # issue 36 item 2: no rank writes a trailer unless the whole job succeeded
    # (rank 0's input ended cleanly, yet the job failed)
    no_trailer "$D/o.0.lrm"
    no_trailer "$D/o.1.lrm"
    # frames of different steps (compared as layer is)
    shard_py split "$D/r.lrm" 2 "$D/s.%r.lrm"
    python3 -c "import sys; sys.path.insert(0, '$HELP'); from lrmoe_stream import *
for r in (0, 1):
    fr = read_stream('$D/s.%d.lrm' % r, with_dtypes=True)
    write_stream('$D/s.%d.lrm' % r, [(t, dict(a, step=str(7 + r)), d) for t, a, d in fr])"
    run $MPIRUN -np 2 "$EXEC" --phase forward --weights "$D/w.lrm" --per-rank -o "$D/o.%r.lrm" \
        "$D/s.%r.lrm"
    assert_failure
    [ "$status" -ne 124 ]
    [ "$(grep -c '^lrmoe-exec: ' <<< "$output")" = 1 ]
    assert_line --partial "per-rank inputs: frame 0 of rank 1 is of step 8, rank 0's of step 7"
    no_trailer "$D/o.0.lrm"
    no_trailer "$D/o.1.lrm"
}

# issue 36 item 2: every rank reads --weights itself; a host whose copy has
# the same shapes but other values must end the job, not change pair_out
@test "mpi: a rank whose --weights differ from rank 0's (a stale copy) ends the job naming it, scattered and --per-rank" {
    need_mpi
    routed 48 f32
    "$BIN/lrmoe-gen" --tokens 8 --experts 8 --topk 2 --hidden 32 --ffn 16 --dtype f32 \
        --weights "$D/stale.lrm" --seed 4 --no-compress > /dev/null
    printf '%s\n' '#!/bin/sh' \
        'w="$1"; [ "$OMPI_COMM_WORLD_RANK" = 1 ] && w="$2"; shift 2' \
        'exec "$@" --weights "$w"' > "$D/wr.sh"
    run $MPIRUN -np 2 sh "$D/wr.sh" "$D/w.lrm" "$D/stale.lrm" "$EXEC" --phase forward -@ 1 \
        -o "$D/o.lrm" "$D/r.lrm"
    assert_failure
    [ "$status" -ne 124 ]
    one_message 1 "layer 0 differs from rank 0's copy \(weights digest [0-9a-f]{16} here"
    no_trailer "$D/o.lrm"
    # the same file on both ranks still runs
    run $MPIRUN -np 2 sh "$D/wr.sh" "$D/w.lrm" "$D/w.lrm" "$EXEC" --phase forward -@ 1 \
        -o "$D/o.lrm" "$D/r.lrm"
    assert_success
    shard_py split "$D/r.lrm" 2 "$D/r.%r.lrm"
    run $MPIRUN -np 2 sh "$D/wr.sh" "$D/w.lrm" "$D/stale.lrm" "$EXEC" --phase forward -@ 1 \
        --per-rank -o "$D/o.%r.lrm" "$D/r.%r.lrm"
    assert_failure
    [ "$status" -ne 124 ]
    [ "$(grep -c '^lrmoe-exec: ' <<< "$output")" = 1 ]
    assert_line --regexp "rank 1's --weights of layer 0 differ from rank 0's \(weights digest"
    no_trailer "$D/o.0.lrm"
    no_trailer "$D/o.1.lrm"
}

@test "mpi: ranks > 0 read a mapped --weights file a layer at a time: a flipped bit in a layer no frame uses is not an error, in a used one it ends the job naming the rank" {
    need_mpi
    # two layers; frames of layer 0 (steps 0, 1) and of layers 0, 1
    routed 48 f32 --layers 2 --steps 2
    python3 -c "import sys; sys.path.insert(0, '$HELP'); from lrmoe_stream import *
f = read_stream('$D/r.lrm'); assert [a['layer'] for _, a in f] == ['0', '1', '0', '1']
write_stream('$D/r0.lrm', [f[0], f[2]])"
    # rank 1's copy: a bit of layer 1's last tensor flipped (rank 0 keeps w.lrm)
    cp "$D/w.lrm" "$D/wb.lrm"
    python3 -c "
import sys; sys.path.insert(0, '$HELP'); import resident
a, e = resident.frames('$D/wb.lrm')[1]; f = open('$D/wb.lrm', 'r+b')
f.seek(e - 4); b = f.read(1); f.seek(e - 4); f.write(bytes([b[0] ^ 4]))"
    printf '%s\n' '#!/bin/sh' \
        'w="$1"; [ "$OMPI_COMM_WORLD_RANK" = 1 ] && w="$2"; shift 2' \
        'exec "$@" --weights "$w"' > "$D/wr.sh"
    "$EXEC" --phase forward -@ 1 -P 2 --weights "$D/w.lrm" --no-compress -o "$D/one.lrm" "$D/r0.lrm"
    run $MPIRUN -np 2 sh "$D/wr.sh" "$D/w.lrm" "$D/wb.lrm" "$EXEC" --phase forward -@ 1 \
        --no-compress -o "$D/o.lrm" "$D/r0.lrm"
    assert_success
    run same "$D/one.lrm" "$D/o.lrm"
    assert_success
    # the digests agree between a mapped copy (its tensors' CRCs combined
    # from the frame's check), one whose records are by parts (the CRCs
    # from its record, each part checked) and a compressed one (read and
    # hashed), either way round
    "$BIN/lrmoe-cat" -o "$D/wz.lrm" "$D/w.lrm"
    "$BIN/lrmoe-cat" --digests tensors --no-compress -o "$D/wt.lrm" "$D/w.lrm"
    for pair in "w.lrm wz.lrm" "wz.lrm w.lrm" "wt.lrm wz.lrm" "w.lrm wt.lrm"; do
        set -- $pair
        run $MPIRUN -np 2 sh "$D/wr.sh" "$D/$1" "$D/$2" "$EXEC" --phase forward -@ 1 \
            --no-compress -o "$D/o.lrm" "$D/r.lrm"
        assert_success
    done
    run $MPIRUN -np 2 sh "$D/wr.sh" "$D/w.lrm" "$D/wb.lrm" "$EXEC" --phase forward -@ 1 \
        --no-compress -o "$D/o.lrm" "$D/r.lrm"
    assert_failure
    [ "$status" -ne 124 ]
    one_message 1 "$D/wb.lrm: frame 1: digest mismatch: the frame's CRC-64 is"
    no_trailer "$D/o.lrm"
}

@test "mpi: a rank whose share is bad (NaN in its rows) ends the job: one message naming it, no trailer" {
    need_mpi
    routed 64 f32
    # token 50 belongs to rank 1 of 2
    python3 -c "import sys; sys.path.insert(0, '$HELP'); from lrmoe_stream import *
import numpy as np
fr = read_stream('$D/r.lrm')
t, a = fr[0]
h = t['hidden'].copy(); h[50, 3] = np.nan; t['hidden'] = h
write_stream('$D/nan.lrm', [(t, a)])"
    run $MPIRUN -np 2 "$EXEC" --phase forward --weights "$D/w.lrm" -@ 1 --no-compress \
        -o "$D/o.lrm" "$D/nan.lrm"
    assert_failure
    [ "$status" -ne 124 ]
    one_message 1 "hidden: non-finite value at flat index $((50 * 32 + 3))"
    no_trailer "$D/o.lrm"
}

@test "mpi: a rank out of memory ends the job: one message naming it, no trailer" {
    need_mpi
    "$BIN/lrmoe-gen" --tokens 8192 --experts 8 --topk 2 --hidden 256 --ffn 512 --dtype bf16 \
        --weights "$D/w.lrm" --seed 3 --no-compress |
        "$BIN/lrmoe-route" -k 2 --no-compress -o "$D/r.lrm"
    # rank 1's address space is capped at what it has once MPI is up (read
    # while rank 0 waits on an empty fifo) plus 64 MiB; the job needs more
    printf '%s\n' '#!/bin/sh' \
        'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then echo $$ > "$0.pid"; [ -n "$3" ] && ulimit -v "$3"; fi' \
        'exec "$1" --phase forward --weights "$2" -@ 1 -o "$0.out" "$4"' > "$D/rank.sh"
    mkfifo "$D/in"
    $MPIRUN -np 2 sh "$D/rank.sh" "$EXEC" "$D/w.lrm" "" "$D/in" 2>/dev/null &
    local job=$! vm="" i
    for i in $(seq 100); do
        [ -s "$D/rank.sh.pid" ] && break
        sleep 0.1
    done
    sleep 2
    vm=$(awk '/^VmSize/ {print $2}' "/proc/$(cat "$D/rank.sh.pid")/status")
    : > "$D/in" # an empty input: that job ends by itself
    wait "$job" || true
    [ -n "$vm" ]
    run $MPIRUN -np 2 sh "$D/rank.sh" "$EXEC" "$D/w.lrm" $((vm + 65536)) "$D/r.lrm"
    assert_failure
    [ "$status" -ne 124 ]
    one_message 1 "out of memory"
    no_trailer "$D/rank.sh.out"
}

@test "mpi: a rank killed with SIGKILL ends the job within the bound, naming the rank; no trailer" {
    need_mpi
    routed 64 f32
    # rank 1 dies 1 s in, while rank 0 still waits for its input
    printf '%s\n' '#!/bin/sh' \
        'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then (sleep 1; kill -9 $$) & fi' \
        'exec "$1" --phase forward --weights "$2" -@ 1 -o "$0.out"' > "$D/kill.sh"
    local t0=$SECONDS
    run sh -c "(sleep 4; cat '$D/r.lrm') | $MPIRUN -np 2 sh '$D/kill.sh' '$EXEC' '$D/w.lrm'"
    assert_failure
    [ "$status" -ne 124 ]
    [ $((SECONDS - t0)) -lt 60 ]
    assert_output --regexp "rank 1 .*signal 9"
    no_trailer "$D/kill.sh.out"
}

@test "mpi: P mismatches are refused before any rank starts work; --backend cuda without a GPU (or without CUDA) fails cleanly" {
    need_mpi
    routed 40 f32
    run $MPIRUN -np 2 "$EXEC" --phase forward --weights "$D/w.lrm" --ranks 4 -o "$D/o.lrm" "$D/r.lrm"
    assert_failure
    assert_line --partial "lrmoe-exec: --ranks 4 but the MPI job has 2 processes"
    "$BIN/lrmoe-plan" --planner fixed --ranks 4 --no-compress "$D/r.lrm" > "$D/p4.lrm"
    run $MPIRUN -np 2 "$EXEC" --phase forward --weights "$D/w.lrm" -o "$D/o.lrm" "$D/p4.lrm"
    assert_failure
    [ "$status" -ne 124 ]
    assert_line --partial "but the plan is for 4 ranks"
    no_trailer "$D/o.lrm"
    # --backend cuda: refused by a build without CUDA; with CUDA and no GPU,
    # rank 0 says so before the job starts
    run $MPIRUN -np 2 "$EXEC" --phase forward --backend cuda --weights "$D/w.lrm" -o "$D/o.lrm" "$D/r.lrm"
    assert_failure
    [ "$status" -ne 124 ]
    if nm "$EXEC" | grep -q ' [Tt] lrmoe_exec_forward_cuda$'; then
        if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
            skip "a GPU is present (tests/gpu/device-check.sh runs the CUDA backend under mpirun)"
        fi
        assert_line --regexp "^lrmoe-exec: frame 0: backend cuda: no usable CUDA device: "
    else
        assert_line --partial "--backend cuda under MPI: this lrmoe-exec is built without CUDA"
    fi
}

@test "mpi: --backend cuda, one GPU per rank: exec_cuda.cu's per-rank path (fake device, NCCL bootstrap over MPI) equals the in-process CUDA path bit for bit" {
    need_mpi
    command -v nvcc >/dev/null 2>&1 || skip "nvcc not on PATH (the CUDA headers are needed)"
    command -v mpicc >/dev/null 2>&1 || skip "mpicc not installed (libopenmpi-dev)"
    # lrmoe-exec whose CUDA backend runs on the kernels' CPU references
    # (tests/gpu/fake-kcu.c: device memory is host memory, poisoned when
    # allocated), built with MPI: under mpirun each rank makes its context
    # on GPU local-rank mod visible and its communicator: from rank 0's id
    # sent over MPI when every rank has its own GPU, else staged through MPI
    run env FAKE_MPI=1 sh "$TOP/tests/gpu/build-fake.sh" "$D/fake"
    assert_success
    local X="$D/fake/lrmoe-exec-fake" P pl m in
    routed 61 bf16
    for P in 2 4; do
        pl=none
        [ $P = 4 ] && pl=eplb
        if [ $pl = none ]; then
            "$X" --phase forward --backend cuda --weights "$D/w.lrm" -P $P --no-compress \
                "$D/r.lrm" > "$D/c1.lrm"
            in="$D/r.lrm"
        else
            "$BIN/lrmoe-plan" --planner eplb --ranks $P --min-chunk 4 --no-compress "$D/r.lrm" \
                > "$D/p.lrm"
            "$X" --phase forward --backend cuda --weights "$D/w.lrm" --no-compress "$D/p.lrm" \
                > "$D/c1.lrm"
            in="$D/p.lrm"
        fi
        # P=2: two fake devices, a GPU per rank (the NCCL path); P=4: one
        # device shared by all ranks (staged through host memory and MPI)
        run $MPIRUN -np $P -x LRMOE_FAKE_DEVICES=$((P == 2 ? 2 : 1)) "$X" --phase forward \
            --backend cuda --weights "$D/w.lrm" --no-compress -o "$D/c2.lrm" "$in"
        assert_success
        run same "$D/c2.lrm" "$D/c1.lrm"
        assert_success
        run python3 -c "import sys; sys.path.insert(0, '$HELP'); from lrmoe_stream import read_stream
print(read_stream('$D/c2.lrm')[0][1]['exec.gpu_comm'])"
        assert_output "$([ $P = 2 ] && echo nccl || echo mpi-staged)"
        if [ $pl = none ]; then
            "$BIN/lrmoe-score" --select topk --drop 30 --no-compress "$D/c1.lrm" > "$D/s.lrm"
            "$BIN/lrmoe-pack" -P $P --no-compress "$D/s.lrm" > "$D/pk.lrm"
        else
            "$BIN/lrmoe-score" --select topk --no-compress "$D/c1.lrm" > "$D/s.lrm"
            "$BIN/lrmoe-pack" --no-compress "$D/s.lrm" > "$D/pk.lrm"
        fi
        for m in full masked compact; do
            in="$D/s.lrm"
            [ $m = compact ] && in="$D/pk.lrm"
            "$X" --phase backward --mode $m --backend cuda --weights "$D/w.lrm" --no-compress \
                "$in" > "$D/b1.lrm"
            run $MPIRUN -np $P -x LRMOE_FAKE_DEVICES=$((P == 2 ? 2 : 1)) "$X" --phase backward \
                --mode $m --backend cuda --weights "$D/w.lrm" --no-compress -o "$D/b2.lrm" "$in"
            assert_success
            run same "$D/b2.lrm" "$D/b1.lrm"
            assert_success
        done
    done
    # --per-rank on the CUDA path too (P=4, EPLB forward, then full backward)
    shard_py split "$D/p.lrm" 4 "$D/p.%r.lrm"
    run $MPIRUN -np 4 "$X" --phase forward --backend cuda --weights "$D/w.lrm" --no-compress \
        --per-rank -o "$D/c.%r.lrm" "$D/p.%r.lrm"
    assert_success
    shard_py join "$D/c.%r.lrm" 4 "$D/cj.lrm"
    run same "$D/cj.lrm" "$D/c1.lrm"
    assert_success
    shard_py split "$D/s.lrm" 4 "$D/s.%r.lrm"
    "$X" --phase backward --backend cuda --weights "$D/w.lrm" --no-compress "$D/s.lrm" > "$D/b1.lrm"
    run $MPIRUN -np 4 "$X" --phase backward --backend cuda --weights "$D/w.lrm" --no-compress \
        --per-rank -o "$D/b.%r.lrm" "$D/s.%r.lrm"
    assert_success
    shard_py join "$D/b.%r.lrm" 4 "$D/bj.lrm"
    run same "$D/bj.lrm" "$D/b1.lrm"
    assert_success
    # the EPLB plan's replicas moved weights and gradients point to point
    run python3 -c "import sys; sys.path.insert(0, '$HELP'); from lrmoe_stream import read_stream
t, a = read_stream('$D/b2.lrm')[0]
print(a['exec.backend'], a['exec.launcher'], a['plan.replicas'], a['exec.backward.p2p_bytes'])"
    assert_success
    assert_output --regexp '^cuda mpi [1-9][0-9]* '
    refute_output --regexp ' 0,0,0,0$'
    # no device on rank 1: one message naming it, no trailer, no hang
    local A="--phase forward --backend cuda --weights $D/w.lrm --no-compress -o $D/o.lrm $D/r.lrm"
    run $MPIRUN -np 1 "$X" $A : -np 1 -x LRMOE_FAKE_DEVICES=0 "$X" $A
    assert_failure
    [ "$status" -ne 124 ]
    one_message 1 "backend cuda: no usable CUDA device"
    no_trailer "$D/o.lrm"
}

@test "mpi: two hosts in network namespaces joined by a veth pair: the same answer over TCP between them" {
    need_mpi
    command -v ip >/dev/null || skip "ip (iproute2) not installed"
    NS_A="lrmA$$" NS_B="lrmB$$"
    ip netns add "$NS_A" 2>/dev/null || skip "cannot create network namespaces here (needs root and CAP_SYS_ADMIN)"
    ip netns add "$NS_B"
    local net="10.$((64 + $$ % 64)).$(($$ % 250)).0"
    local a="${net%.0}.1" b="${net%.0}.2"
    ip link add "va$$" type veth peer name "vb$$"
    ip link set "va$$" netns "$NS_A"
    ip link set "vb$$" netns "$NS_B"
    ip -n "$NS_A" addr add "$a/24" dev "va$$"
    ip -n "$NS_B" addr add "$b/24" dev "vb$$"
    ip -n "$NS_A" link set "va$$" up
    ip -n "$NS_B" link set "vb$$" up
    ip -n "$NS_A" link set lo up
    ip -n "$NS_B" link set lo up
    # mpirun starts its daemon on "host" $b through this agent instead of ssh
    printf '%s\n' '#!/bin/sh' "echo \"\$1\" >> '$D/agent.log'" \
        "case \$1 in $a) ns=$NS_A ;; $b) ns=$NS_B ;; *) exit 1 ;; esac" \
        'shift; exec ip netns exec "$ns" sh -c "$*"' > "$D/agent.sh"
    chmod +x "$D/agent.sh"
    printf '%s slots=1\n%s slots=1\n' "$a" "$b" > "$D/hosts"
    local NSRUN="timeout 120 ip netns exec $NS_A mpirun --hostfile $D/hosts -np 2 \
        --mca plm_rsh_agent $D/agent.sh --mca btl tcp,self \
        --mca btl_tcp_if_include $net/24 --mca oob_tcp_if_include $net/24"
    routed 48 bf16
    "$BIN/lrmoe-plan" --planner eplb --ranks 2 --no-compress "$D/r.lrm" > "$D/p.lrm"
    run $NSRUN "$EXEC" --phase forward --weights "$D/w.lrm" -@ 1 --no-compress -o "$D/f2.lrm" "$D/p.lrm"
    assert_success
    run $NSRUN "$EXEC" --phase backward --weights "$D/w.lrm" -@ 1 --no-compress -o "$D/b2.lrm" "$D/f2.lrm"
    assert_success
    "$EXEC" --phase forward --weights "$D/w.lrm" -@ 1 --no-compress "$D/p.lrm" |
        "$EXEC" --phase backward --weights "$D/w.lrm" -@ 1 --no-compress -o "$D/b1.lrm"
    run same "$D/b2.lrm" "$D/b1.lrm"
    assert_success
    # rank 1 ran on the other "host"
    run grep -c "^$b\$" "$D/agent.log"
    assert_output 2
}

@test "mpi: README's one-host recipes: more ranks than cores needs --oversubscribe, which then equals -P (yield when idle on)" {
    need_mpi
    "$BIN/lrmoe-gen" --experts 16 --topk 4 --hidden 64 --ffn 128 --tokens 512 --hot 80:1 \
        --weights "$D/w.lrm" -o "$D/in.lrm"
    "$BIN/lrmoe-route" "$D/in.lrm" | "$BIN/lrmoe-plan" -P 4 --ffn 128 -o "$D/p.lrm"
    "$EXEC" --phase forward --weights "$D/w.lrm" -P 4 -o "$D/one.lrm" "$D/p.lrm"
    cores=$(nproc)
    if [ "$cores" -lt 4 ]; then
        # the command without --oversubscribe, as a new user types it
        run timeout 120 mpirun --mca btl tcp,self -np 4 "$EXEC" --phase forward \
            --weights "$D/w.lrm" -o "$D/no.lrm" "$D/p.lrm"
        assert_failure
        assert_output --partial "not enough slots"
    fi
    run timeout 120 mpirun --mca btl tcp,self --oversubscribe --mca mpi_yield_when_idle 1 -np 4 \
        "$EXEC" --phase forward --weights "$D/w.lrm" -o "$D/mpi.lrm" "$D/p.lrm"
    assert_success
    run same "$D/mpi.lrm" "$D/one.lrm"
    assert_success
}

# issue 36 item 7: collectives wait without bound, so a stopped rank hung the
# job forever; --timeout S ends it with one message naming the silent rank
@test "mpi: --timeout: a rank stopped with SIGSTOP ends the job within the bound, naming the rank; no trailer" {
    need_mpi
    routed 64 f32
    printf '%s\n' '#!/bin/sh' \
        'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then echo $$ > "$0.pid"; fi' \
        'exec "$1" --phase forward --weights "$2" -@ 1 --timeout 2 -o "$0.out" "$3"' \
        > "$D/stop.sh"
    mkfifo "$D/in"
    $MPIRUN -np 2 sh "$D/stop.sh" "$EXEC" "$D/w.lrm" "$D/in" > "$D/job.txt" 2>&1 &
    local job=$! i pid status=0 t0
    for i in $(seq 100); do
        [ -s "$D/stop.sh.pid" ] && break
        sleep 0.1
    done
    pid=$(cat "$D/stop.sh.pid")
    # rank 1 past MPI_Init, waiting for rank 0's first job (rank 0 waits on
    # the fifo): stop it, then give rank 0 its input
    sleep 3
    kill -STOP "$pid"
    t0=$SECONDS
    cat "$D/r.lrm" > "$D/in"
    wait "$job" || status=$?
    kill -CONT "$pid" 2>/dev/null || true
    cat "$D/job.txt"
    [ "$status" -ne 0 ]
    [ "$status" -ne 124 ]
    [ $((SECONDS - t0)) -lt 60 ]
    [ "$(grep -c '^lrmoe-exec: ' "$D/job.txt")" = 1 ]
    grep -q '^lrmoe-exec: rank 0: .*no progress in [0-9.]* s (--timeout 2): rank 1 does not answer' \
        "$D/job.txt"
    no_trailer "$D/stop.sh.out"
}

@test "mpi: --timeout is checked, and a job that makes progress runs under it bit for bit" {
    need_mpi
    routed 61 f32
    run "$EXEC" --phase forward --weights "$D/w.lrm" --timeout -1 "$D/r.lrm"
    assert_equal "$status" 2
    assert_line --partial "--timeout"
    run $MPIRUN -np 3 "$EXEC" --phase forward --weights "$D/w.lrm" -@ 1 --no-compress \
        -o "$D/a.lrm" "$D/r.lrm"
    assert_success
    run $MPIRUN -np 3 "$EXEC" --phase forward --weights "$D/w.lrm" -@ 1 --no-compress \
        --timeout 30 -o "$D/b.lrm" "$D/r.lrm"
    assert_success
    run same "$D/b.lrm" "$D/a.lrm"
    assert_success
}
