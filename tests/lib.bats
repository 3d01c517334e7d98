#!/usr/bin/env bats
# liblrmoe as an installed C library (lrmoe(3)): the shared object's soname
# and exported symbols, `make install` into a staged DESTDIR/PREFIX, and a
# small C program built against that tree with `pkg-config --cflags --libs
# lrmoe` that plans a routed stream in-process exactly as lrmoe-plan does.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup_file() {
    TOP="$BATS_TEST_DIRNAME/.."
    export STAGE="$BATS_FILE_TMPDIR/stage" PFX=/opt/lrmoe-test
    make -C "$TOP" -s install DESTDIR="$STAGE" PREFIX="$PFX" >"$BATS_FILE_TMPDIR/install.log" 2>&1
}

setup() {
    TOP="$BATS_TEST_DIRNAME/.."
    BIN="$TOP/bin"
    SO="$TOP/build/liblrmoe.so.2"
    T="$BATS_TEST_TMPDIR"
    LIBD="$STAGE$PFX/lib"
}

# Build tests/lib/SRC.c against the staged tree into $T/NAME with
# `pkg-config --cflags --libs lrmoe` (the ASan + UBSan runtime first under
# make check SANITIZE=1, whose staged library is that build); more cc flags
# after SRC. Exports the pkg-config variables for the test's later calls.
staged_cc() {
    local name=$1 src=$2
    shift 2
    export PKG_CONFIG_SYSROOT_DIR="$STAGE" PKG_CONFIG_PATH="$LIBD/pkgconfig"
    run cc -std=c11 -Wall -Wextra -Werror "$@" ${SANITIZE:+-fsanitize=address,undefined} \
        -o "$T/$name" "$BATS_TEST_DIRNAME/lib/$src.c" $(pkg-config --cflags --libs lrmoe)
    assert_success
}

@test "build/liblrmoe.so.2 has soname liblrmoe.so.2 and is position independent" {
    [ -f "$SO" ]
    run readelf -d "$SO"
    assert_success
    assert_output --partial "Library soname: [liblrmoe.so.2]"
    run readelf -h "$SO"
    assert_output --partial "DYN (Shared object file)"
    # no text relocations: every object was compiled -fPIC
    run readelf -d "$SO"
    refute_output --partial "TEXTREL"
}

@test "only lrmoe_* functions declared in the installed headers are exported" {
    syms=$(nm -D --defined-only "$SO" | awk '{ sub(/@.*/, "", $3); print $3 }' |
        grep -v '^LRMOE_2$' | sort -u)
    n=$(printf '%s\n' "$syms" | wc -l)
    [ "$n" -gt 100 ]
    bad=$(printf '%s\n' "$syms" | grep -v '^lrmoe_' || true)
    [ -z "$bad" ] || fail "exported without the lrmoe_ prefix: $bad"
    for s in $syms; do
        grep -qw "$s" "$LIBD"/../include/lrmoe/*.h || fail "$s is exported but in no installed header"
    done
    # the entry points of lrmoe(3) are there, internals are not
    for s in lrmoe_plan_compute lrmoe_route_topk lrmoe_score_pairs lrmoe_pack_assign \
             lrmoe_exec_forward lrmoe_exec_backward lrmoe_reader_open lrmoe_writer_open \
             lrmoe_plan_cfg_set lrmoe_abi_sizeof lrmoe_version; do
        printf '%s\n' "$syms" | grep -qx "$s" || fail "$s not exported"
    done
    for s in lrmoe_plan_cli_opt lrmoe_gen_frame lrmoe_sim_run; do
        ! printf '%s\n' "$syms" | grep -qx "$s" || fail "internal $s exported"
    done
    # and every function they declare is exported: a declaration outside
    # a header's `#pragma GCC visibility push(default)` would stay hidden
    declared=$(perl -0777 -ne 's{/\*.*?\*/}{}gs; s{//[^\n]*}{}g; print "$1\n" while /\b(lrmoe_[a-z0-9_]+)\s*\(/g' \
        "$LIBD"/../include/lrmoe/*.h | sort -u)
    missing=$(comm -23 <(printf '%s\n' "$declared") <(printf '%s\n' "$syms"))
    [ -z "$missing" ] || fail "declared in an installed header but not exported: $missing"
}

@test "the staged liblrmoe.a defines only lrmoe_* globals (C objects hidden by default, CUDA objects' C++/CUB/NVTX symbols made local)" {
    [ -f "$LIBD/liblrmoe.a" ]
    syms=$(nm -g --defined-only "$LIBD/liblrmoe.a" | awk 'NF == 3 { print $3 }' | sort -u)
    [ "$(printf '%s\n' "$syms" | wc -l)" -gt 100 ]
    bad=$(printf '%s\n' "$syms" | grep -v '^lrmoe_' | head -20 || true)
    [ -z "$bad" ] || fail "liblrmoe.a defines globals without the lrmoe_ prefix: $bad"
    # the tools' plumbing and the backends are not in the installed headers
    for s in lrmoe_now lrmoe_filter_run lrmoe_io_opt lrmoe_parse_i64 lrmoe_exec_forward_cpu \
             lrmoe_exec_check_pack lrmoe_exec_ctx_init; do
        ! grep -qw "$s" "$LIBD"/../include/lrmoe/*.h || fail "$s is in an installed header"
    done
}

@test "make install stages the library, the headers, lrmoe.pc and the man3 pages" {
    local v
    v=$(sed -n 's/^#define LRMOE_VERSION "\(.*\)"/\1/p' "$BATS_TEST_DIRNAME/../lib/lrmoe.h")
    [ -n "$v" ]
    [ -f "$LIBD/liblrmoe.so.$v" ] || { cat "$BATS_FILE_TMPDIR/install.log"; false; }
    [ "$(readlink "$LIBD/liblrmoe.so.2")" = "liblrmoe.so.$v" ]
    [ "$(readlink "$LIBD/liblrmoe.so")" = liblrmoe.so.2 ]
    [ -f "$LIBD/liblrmoe.a" ]
    for h in lrmoe.h plan.h cost.h route.h score.h pack.h exec.h api.h; do
        [ -f "$STAGE$PFX/include/lrmoe/$h" ] || fail "header $h not installed"
    done
    # internal headers stay private
    for h in plan_internal.h route_internal.h plan_cli.h sim.h gen.h kref.h; do
        [ ! -e "$STAGE$PFX/include/lrmoe/$h" ] || fail "internal header $h installed"
    done
    run grep -x "prefix=$PFX" "$LIBD/pkgconfig/lrmoe.pc"
    assert_success
    [ -f "$STAGE$PFX/share/man/man3/lrmoe.3" ]
    [ -f "$STAGE$PFX/share/man/man3/lrmoe_plan_compute.3" ]
}

@test "every installed header compiles on its own as C and C++" {
    for h in "$STAGE$PFX"/include/lrmoe/*.h; do
        printf '#include <lrmoe/%s>\nint main(void){return 0;}\n' "$(basename "$h")" > "$T/h.c"
        run cc -std=c11 -Wall -Wextra -Werror -I"$STAGE$PFX/include" -c -o "$T/h.o" "$T/h.c"
        assert_success
        run g++ -x c++ -std=c++17 -fsyntax-only -I"$STAGE$PFX/include" "$T/h.c"
        assert_success
    done
}

@test "a C program built with pkg-config against the staged tree plans frames in-process like lrmoe-plan" {
    export PKG_CONFIG_SYSROOT_DIR="$STAGE" PKG_CONFIG_PATH="$LIBD/pkgconfig"
    run pkg-config --modversion lrmoe
    assert_success
    assert_output "$(sed -n 's/^#define LRMOE_VERSION "\(.*\)"/\1/p' "$TOP/lib/lrmoe.h")"
    flags=$(pkg-config --cflags --libs lrmoe)
    case "$flags" in *"$STAGE$PFX/include"*"-L$LIBD"*) ;; *) fail "pkg-config says: $flags" ;; esac
    # under make check SANITIZE=1 the staged library is the ASan + UBSan
    # build, whose runtime the program must then link first
    run cc -std=c11 -Wall -Wextra -Werror ${SANITIZE:+-fsanitize=address,undefined} \
        -o "$T/plan_inproc" "$BATS_TEST_DIRNAME/lib/plan_inproc.c" $flags
    assert_success
    # the program runs against the staged .so, not the build tree's
    run env LD_LIBRARY_PATH="$LIBD" ldd "$T/plan_inproc"
    assert_output --partial "$LIBD/liblrmoe.so.2"
    "$BIN/lrmoe-gen" --tokens 512 --experts 16 --topk 4 --hidden 64 --ffn 32 --layers 2 \
        --zipf 1.2 --seed 5 | "$BIN/lrmoe-route" -o "$T/routed.lrm"
    run env LD_LIBRARY_PATH="$LIBD" "$T/plan_inproc" "$T/routed.lrm" "$T/inproc.lrm" 4 64 32
    assert_success
    assert_line --regexp "^frame 1 rho [01]\.[0-9]+ fwd_peak [0-9]+ bwd_peak [0-9]+$"
    "$BIN/lrmoe-plan" -P 4 -D 64 --ffn 32 "$T/routed.lrm" -o "$T/tool.lrm"
    run python3 - "$BATS_TEST_DIRNAME/helpers" "$T/inproc.lrm" "$T/tool.lrm" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from lrmoe_stream import read_stream
import numpy as np
a, b = read_stream(sys.argv[2]), read_stream(sys.argv[3])
assert len(a) == len(b) == 2, (len(a), len(b))
for (ta, aa), (tb, ab) in zip(a, b):
    for n in ("placement", "fwd_alloc", "quota", "bwd_alloc"):
        assert np.array_equal(ta[n], tb[n]), n
    for k in ("plan.rho", "plan.fwd_peak", "plan.bwd_peak", "plan.replicas"):
        assert aa[k] == ab[k], (k, aa[k], ab[k])
print("same plans")
PY
    assert_success
    assert_output "same plans"
}

@test "a static link with pkg-config --static against the staged liblrmoe.a runs without the .so" {
    export PKG_CONFIG_SYSROOT_DIR="$STAGE" PKG_CONFIG_PATH="$LIBD/pkgconfig"
    [ -f "$LIBD/liblrmoe.a" ]
    # Libs.private must name every library the archive's objects need
    # (oneDNN, MPI and CUDA where this build has them): the whole archive
    # goes in place of -llrmoe, so every object's references must resolve,
    # and everything else comes from the .pc file
    flags=$(pkg-config --cflags --static --libs lrmoe)
    libs=$(printf '%s\n' $flags | grep -vx -- '-llrmoe' | tr '\n' ' ')
    run cc -std=c11 -Wall -Wextra -Werror ${SANITIZE:+-fsanitize=address,undefined} \
        -o "$T/plan_static" "$BATS_TEST_DIRNAME/lib/plan_inproc.c" \
        -Wl,--whole-archive "$LIBD/liblrmoe.a" -Wl,--no-whole-archive $libs
    assert_success
    run ldd "$T/plan_static"
    refute_output --partial liblrmoe.so
    "$BIN/lrmoe-gen" --tokens 256 --experts 16 --topk 4 --hidden 64 --ffn 32 --layers 2 \
        --zipf 1.2 --seed 5 | "$BIN/lrmoe-route" -o "$T/routed.lrm"
    run "$T/plan_static" "$T/routed.lrm" "$T/static.lrm" 4 64 32
    assert_success
    assert_line --regexp "^frame 1 rho [01]\.[0-9]+ fwd_peak [0-9]+ bwd_peak [0-9]+$"
}

@test "every function a man3 page names is exported, and every page lints clean" {
    syms=$(nm -D --defined-only "$SO" | awk '{ sub(/@.*/, "", $3); print $3 }')
    n=0
    for p in "$TOP"/man/man3/*.3; do
        run mandoc -T lint -W warning "$p"
        assert_output ""
        for f in $(sed -n '/^\.SH NAME/,/^\.SH/p' "$p" | grep -oE 'lrmoe_[a-z0-9_]+'); do
            printf '%s\n' "$syms" | grep -qx "$f" || fail "$(basename "$p") names $f, which is not exported"
            n=$((n + 1))
        done
    done
    [ "$n" -ge 40 ]
}

@test "one lrmoe_plan_cfg_t keeps EPLB's layouts: in-process plans equal lrmoe-plan's frame by frame with --rebalance-every 2" {
    staged_cc plan_cfg plan_cfg_inproc
    # 2 layers x 4 steps, loads drifting from step to step
    "$BIN/lrmoe-gen" --tokens 512 --experts 16 --topk 4 --hidden 64 --ffn 32 --layers 2 \
        --steps 4 --zipf 1.2 --drift 3 --seed 5 | "$BIN/lrmoe-route" -o "$T/routed.lrm"
    for p in eplb lrmoe; do
        run env LD_LIBRARY_PATH="$LIBD" "$T/plan_cfg" "$T/routed.lrm" "$T/in-$p.lrm" ranks=4 \
            planner=$p hidden=64 ffn=32 topk=4 tokens=128 rebalance-every=2
        assert_success
        if [ $p = eplb ]; then
            # weights move at a layer's frames 0 and 2 (stream frames 0,1 and 4,5) only
            assert_line --regexp "^frame 0 layer 0 weight_moves [1-9][0-9]*$"
            assert_line "frame 2 layer 0 weight_moves 0"
            assert_line --regexp "^frame 5 layer 1 weight_moves [1-9][0-9]*$"
        fi
        "$BIN/lrmoe-plan" --ranks 4 --planner $p --ffn 32 --rebalance-every 2 "$T/routed.lrm" \
            -o "$T/tool-$p.lrm"
    done
    run python3 - "$BATS_TEST_DIRNAME/helpers" "$T" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from lrmoe_stream import read_stream
import numpy as np
for p in ("eplb", "lrmoe"):
    a = read_stream(f"{sys.argv[2]}/in-{p}.lrm")
    b = read_stream(f"{sys.argv[2]}/tool-{p}.lrm")
    assert len(a) == len(b) == 8, (len(a), len(b))
    for i, ((ta, aa), (tb, ab)) in enumerate(zip(a, b)):
        for n in ("placement", "fwd_alloc", "quota", "bwd_alloc"):
            assert np.array_equal(ta[n], tb[n]), (p, i, n)
        ka = {k: v for k, v in aa.items() if k.startswith("plan.") and k != "plan.seconds"}
        kb = {k: v for k, v in ab.items() if k.startswith("plan.") and k != "plan.seconds"}
        assert ka == kb, (p, i, set(ka.items()) ^ set(kb.items()))
print("same plans")
PY
    assert_success
    assert_output "same plans"
}

# A CUDA build (liblrmoe.a has the kernels) must have built the module; a
# CPU-only one has neither. The build that make check built and installed
# (build/san under SANITIZE=1).
BD() { echo "$TOP/${LRMOE_BUILD:-build}"; }
cuda_build() {
    if [ -f "$(BD)/liblrmoe-cuda.so.1" ]; then return 0; fi
    if ar t "$(BD)/liblrmoe.a" | grep -qx cuda.o; then
        fail "liblrmoe.a has the CUDA kernels but $(BD)/liblrmoe-cuda.so.1 was not built"
    fi
    skip "CPU-only build (no nvcc at build time): no CUDA module"
}

@test "liblrmoe.so.2 needs no CUDA library; the CUDA module liblrmoe-cuda.so.1 does and exports only its entry point" {
    run readelf -d "$(BD)/liblrmoe.so.2"
    assert_success
    refute_output --regexp 'NEEDED.*\[lib(cudart|cublas|cublasLt|nccl)\.so'
    cuda_build
    run readelf -d "$(BD)/liblrmoe-cuda.so.1"
    assert_output --partial "Library soname: [liblrmoe-cuda.so.1]"
    for l in libcudart libcublas libnccl; do
        assert_output --regexp "NEEDED.*\[$l\.so"
    done
    run sh -c "nm -D --defined-only '$(BD)/liblrmoe-cuda.so.1' | awk '\$2 == \"T\" { print \$3 }'"
    assert_output "lrmoe_cuda_module_init@@LRMOE_CUDA_MODULE_1"
}

# cuda_inproc against the staged tree, with ENV... in front
cuda_inproc() {
    export PKG_CONFIG_SYSROOT_DIR="$STAGE" PKG_CONFIG_PATH="$LIBD/pkgconfig"
    cc -std=c11 -Wall -Wextra -Werror ${SANITIZE:+-fsanitize=address,undefined} \
        -o "$T/cuda_inproc" "$BATS_TEST_DIRNAME/lib/cuda_inproc.c" $(pkg-config --cflags --libs lrmoe) \
        -Wl,-rpath,"$LIBD" || return 1
    # a run path, not LD_LIBRARY_PATH, which dlopen would search for the
    # module's bare name; the CUDA runtime's own start-up allocations are
    # not this test's leaks
    run env ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" "$@" "$T/cuda_inproc"
}

@test "make install stages liblrmoe-cuda.so.1 next to liblrmoe.so.2, which loads it from there on the first CUDA call only" {
    cuda_build
    [ -f "$LIBD/liblrmoe-cuda.so.1" ] || { cat "$BATS_FILE_TMPDIR/install.log"; fail "module not installed"; }
    cuda_inproc
    assert_success
    # nothing CUDA before the first call; then the staged module, from the
    # staged directory, whatever the device says
    refute_line --regexp '^mapped before:'
    assert_line "mapped after: $LIBD/liblrmoe-cuda.so.1"
    assert_line --regexp '^mapped after: .*/libnccl\.so'
    refute_output --partial "cannot load the CUDA module"
    assert_line --regexp '^call 1: '
}

@test "a CUDA module that does not load is one clear error naming its path and why, for every CUDA call" {
    cuda_build
    cuda_inproc LRMOE_CUDA_MODULE="$T/nowhere/liblrmoe-cuda.so.1"
    assert_success
    for i in 1 2; do
        assert_line "call $i: backend cuda: cannot load the CUDA module $T/nowhere/liblrmoe-cuda.so.1: cannot open shared object file: No such file or directory (the path LRMOE_CUDA_MODULE names)"
    done
    refute_line --regexp '^mapped'
    # a file that is no lrmoe module
    cuda_inproc LRMOE_CUDA_MODULE="$LIBD/liblrmoe.so.2"
    assert_line "call 1: backend cuda: cannot load the CUDA module $LIBD/liblrmoe.so.2: it has no lrmoe_cuda_module_init (not an lrmoe CUDA module)"
    # the staged library without the module next to it
    mv "$LIBD/liblrmoe-cuda.so.1" "$T/moved.so"
    cuda_inproc
    mv "$T/moved.so" "$LIBD/liblrmoe-cuda.so.1"
    # (then the bare name, which nothing on this program's search finds)
    assert_line "call 1: backend cuda: cannot load the CUDA module: not at $LIBD/liblrmoe-cuda.so.1, and by name liblrmoe-cuda.so.1 (run path, LD_LIBRARY_PATH, system directories): cannot open shared object file: No such file or directory (set LRMOE_CUDA_MODULE to its path)"
}

@test "an installed lrmoe-exec needs no CUDA library and loads the module from PREFIX/lib (its \$ORIGIN/../lib) on --backend cuda only" {
    cuda_build
    X="$STAGE$PFX/bin/lrmoe-exec"
    run readelf -d "$X"
    refute_output --regexp 'NEEDED.*\[lib(cudart|cublas|cublasLt|nccl)\.so'
    python3 "$TOP/tests/helpers/exec_ref.py" make "$T/in.lrm" "$T/w.lrm" --T 20 --E 4 --K 2 --D 8 --F 6 --dtype bf16
    # the CPU backend maps nothing of CUDA
    run env LD_DEBUG=files "$X" --phase forward --weights "$T/w.lrm" --no-compress -o "$T/cpu.lrm" "$T/in.lrm"
    assert_success
    refute_output --regexp 'file=lib(lrmoe-cuda|cudart|cublas|nccl)\.so'
    run env -u LRMOE_CUDA_MODULE LD_DEBUG=files "$X" --phase forward --backend cuda --weights "$T/w.lrm" \
        --no-compress -o "$T/cuda.lrm" "$T/in.lrm"
    # the run path's $ORIGIN/../lib as the dynamic loader spells it
    assert_output --partial "opening file=$STAGE$PFX/bin/../lib/liblrmoe-cuda.so.1 [0]"
    refute_output --partial "cannot load the CUDA module"
}

# issue 36 item 2: lrmoe(3)'s EXAMPLES program, taken from the page as printed,
# plans what lrmoe-plan -P 8 plans on the same stream (F from the frame, not
# lrmoe_plan_opts_default's D=2048, F=768)
@test "lrmoe(3)'s EXAMPLES program, compiled as printed, plans like lrmoe-plan -P 8" {
    export PKG_CONFIG_SYSROOT_DIR="$STAGE" PKG_CONFIG_PATH="$LIBD/pkgconfig"
    awk '/^\.SH EXAMPLES/ {e = 1} e && /^\.RE/ {exit} e && p {print} e && /^\.RS/ {p = 1}' \
        "$TOP/man/man3/lrmoe.3" | sed -e 's/\\e/\\/g' -e 's/\\-/-/g' > "$T/example.c"
    grep -q 'int main' "$T/example.c"
    run cc -std=c11 -Wall -Wextra -Werror ${SANITIZE:+-fsanitize=address,undefined} \
        -o "$T/example" "$T/example.c" $(pkg-config --cflags --libs lrmoe)
    assert_success
    mkdir -p "$T/ex"
    "$BIN/lrmoe-gen" --tokens 512 --experts 16 --topk 4 --hidden 64 --ffn 64 --layers 2 \
        --zipf 1.2 --seed 5 | "$BIN/lrmoe-route" -o "$T/ex/routed.lrm"
    (cd "$T/ex" && LD_LIBRARY_PATH="$LIBD" "$T/example")
    "$BIN/lrmoe-plan" -P 8 "$T/ex/routed.lrm" -o "$T/ex/tool.lrm"
    run python3 - "$BATS_TEST_DIRNAME/helpers" "$T/ex/planned.lrm" "$T/ex/tool.lrm" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from lrmoe_stream import read_stream
import numpy as np
a, b = read_stream(sys.argv[2]), read_stream(sys.argv[3])
assert len(a) == len(b) == 2, (len(a), len(b))
for (ta, aa), (tb, ab) in zip(a, b):
    for n in ("placement", "fwd_alloc", "quota", "bwd_alloc"):
        assert np.array_equal(ta[n], tb[n]), n
    for k in ("plan.ffn", "plan.hidden", "plan.fwd_peak", "plan.bwd_peak", "plan.rho"):
        assert aa[k] == ab[k], (k, aa[k], ab[k])
print("same plans", aa["plan.ffn"], aa["plan.hidden"])
PY
    assert_success
    assert_output "same plans 64 64"
}

@test "planning threads that end without lrmoe_plan_thread_cleanup leak nothing (scratch plans and GLPK's environment freed at thread exit; ASan's leak checker)" {
    # under make check SANITIZE=1 the archive is the ASan + UBSan build
    cc -std=c11 -O1 -g -D_GNU_SOURCE -fsanitize=address${SANITIZE:+,undefined} -I"$TOP/lib" -o "$T/pt" \
        "$BATS_TEST_DIRNAME/lib/plan_threads.c" "$(BD)/liblrmoe.a" -lzstd -ljansson -lglpk -lm \
        -lpthread -ldl
    # the leak report on standard error (the sanitized pass's log_path would hide it)
    run env -u LSAN_OPTIONS ASAN_OPTIONS=detect_leaks=1 "$T/pt" 4
    assert_success
    assert_line "4 threads planned"
    refute_output --partial "LeakSanitizer"
}

@test "the opaque stage handles (lrmoe_route_t, lrmoe_score_t, lrmoe_pack_t, lrmoe_exec_t; options by the tools' long names) give the tools' tensors bit for bit and their attributes but the timings; bad options named" {
    staged_cc stage stage_inproc
    X() { env LD_LIBRARY_PATH="$LIBD" "$T/stage" "$@"; }
    # the exec.*/score.*/pack.* seconds and the slowest rank are timings:
    # every tensor and every other attribute must be equal
    same() {
        python3 - "$BATS_TEST_DIRNAME/helpers" "$1" "$2" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from lrmoe_stream import read_stream
import numpy as np
a, b = read_stream(sys.argv[2]), read_stream(sys.argv[3])
assert len(a) == len(b) == 2, (len(a), len(b))
def timed(k):
    return k.split(".")[0] in ("exec", "score", "pack", "route") and (
        k.endswith("_s") or k.endswith("seconds") or k.endswith("critical_rank"))
for (ta, aa), (tb, ab) in zip(a, b):
    assert sorted(ta) == sorted(tb), (sorted(ta), sorted(tb))
    for n in ta:
        assert ta[n].dtype == tb[n].dtype and np.array_equal(ta[n], tb[n], equal_nan=True), n
    ka = {k: v for k, v in aa.items() if not timed(k)}
    kb = {k: v for k, v in ab.items() if not timed(k)}
    assert ka == kb, set(ka.items()) ^ set(kb.items())
print("same", len(a), "frames")
PY
    }
    "$BIN/lrmoe-gen" --tokens 256 --experts 16 --topk 4 --hidden 64 --ffn 32 --layers 2 \
        --zipf 1.2 --seed 5 --weights "$T/w.lrm" --no-compress -o "$T/g.lrm"
    # route (from the frame's logits; the second run from hidden x router_weight)
    run X route "$T/g.lrm" "$T/xr.lrm" topk=4 ranks=4 threads=1
    assert_success
    "$BIN/lrmoe-route" -k 4 -P 4 -@ 1 --no-compress -o "$T/r.lrm" "$T/g.lrm"
    run same "$T/xr.lrm" "$T/r.lrm"
    assert_success
    run X route "$T/g.lrm" "$T/xr2.lrm" topk=4 renorm weights="$T/w.lrm" from-hidden threads=1
    assert_success
    "$BIN/lrmoe-route" -k 4 --renorm --weights "$T/w.lrm" --from-hidden -@ 1 --no-compress \
        -o "$T/r2.lrm" "$T/g.lrm"
    run same "$T/xr2.lrm" "$T/r2.lrm"
    assert_success
    # loads-only (its run returned the number of tensors it deleted, not 0)
    run X route "$T/g.lrm" "$T/xr3.lrm" topk=4 ranks=4 loads-only threads=1
    assert_success
    "$BIN/lrmoe-route" -k 4 -P 4 --loads-only -@ 1 --no-compress -o "$T/r3.lrm" "$T/g.lrm"
    run same "$T/xr3.lrm" "$T/r3.lrm"
    assert_success
    "$BIN/lrmoe-plan" -P 4 --rate 0.8 --no-compress -o "$T/p.lrm" "$T/r.lrm"
    # exec forward
    run X exec "$T/p.lrm" "$T/xf.lrm" weights="$T/w.lrm" phase=forward ranks=4 threads=1 compute=f32
    assert_success
    "$BIN/lrmoe-exec" --phase forward -P 4 -@ 1 --compute f32 --weights "$T/w.lrm" \
        --no-compress -o "$T/f.lrm" "$T/p.lrm"
    run same "$T/xf.lrm" "$T/f.lrm"
    assert_success
    # score: the sampled draw (the n-th frame seeded seed + n, as the tool)
    # and topk with --fidelity and --weights
    run X score "$T/f.lrm" "$T/xs.lrm" seed=9 threads=1
    assert_success
    "$BIN/lrmoe-score" --seed 9 -@ 1 --no-compress -o "$T/s.lrm" "$T/f.lrm"
    run same "$T/xs.lrm" "$T/s.lrm"
    assert_success
    # the run counter past 2^63-1: frame=2^63-1 seeds the two frames' draws with
    # 2^63-1 and 2^63, as --seed 2^63-1 seeds frames 0 and 1 (the counter was a
    # signed 64-bit integer that overflowed: UBSan in the sanitized pass)
    run X score "$T/f.lrm" "$T/xs3.lrm" frame=9223372036854775807 threads=1
    assert_success
    "$BIN/lrmoe-score" --seed 9223372036854775807 -@ 1 --no-compress -o "$T/s3.lrm" "$T/f.lrm"
    run same "$T/xs3.lrm" "$T/s3.lrm"
    assert_success
    run X score "$T/f.lrm" "$T/xs2.lrm" select=topk fidelity weights="$T/w.lrm"
    assert_success
    "$BIN/lrmoe-score" --select topk --fidelity --weights "$T/w.lrm" --no-compress \
        -o "$T/s2.lrm" "$T/f.lrm"
    run same "$T/xs2.lrm" "$T/s2.lrm"
    assert_success
    # pack (copying and layout-only forms)
    for form in "" layout-only; do
        run X pack "$T/s.lrm" "$T/xk.lrm" $form
        assert_success
        "$BIN/lrmoe-pack" ${form:+--$form} --no-compress -o "$T/k.lrm" "$T/s.lrm"
        run same "$T/xk.lrm" "$T/k.lrm"
        assert_success
    done
    # exec backward in each mode (compact on the packed rows)
    for m in full masked compact; do
        in="$T/s.lrm"; [ $m = compact ] && in="$T/k.lrm"
        run X exec "$in" "$T/xb.lrm" weights="$T/w.lrm" phase=backward mode=$m ranks=4 threads=1 \
            compute=f32
        assert_success
        "$BIN/lrmoe-exec" --phase backward --mode $m -P 4 -@ 1 --compute f32 --weights "$T/w.lrm" \
            --no-compress -o "$T/b.lrm" "$in"
        run same "$T/xb.lrm" "$T/b.lrm"
        assert_success
    done
    # errors name the option
    run X exec "$T/p.lrm" "$T/e.lrm" speed=11
    assert_failure
    assert_output --partial "exec: unknown option 'speed'"
    run X exec "$T/p.lrm" "$T/e.lrm" ranks=0
    assert_output "stage_inproc: ranks: 0 is out of range [1, 4096]"
    run X exec "$T/p.lrm" "$T/e.lrm" allow-nonfinite=1
    assert_output "stage_inproc: exec: allow-nonfinite takes no value"
    run X exec "$T/p.lrm" "$T/e.lrm" weights="$T/w.lrm" mode=masked
    assert_output "stage_inproc: mode: only the backward phase has modes (set phase backward)"
    run X exec "$T/p.lrm" "$T/e.lrm" phase=sideways
    assert_output "stage_inproc: phase: 'sideways' is not forward or backward"
    run X exec "$T/p.lrm" "$T/e.lrm"
    assert_output "stage_inproc: exec: no weights (set \"weights\" to a weights stream)"
    run X route "$T/g.lrm" "$T/e.lrm" topk
    assert_output "stage_inproc: route: topk needs a value"
    run X route "$T/g.lrm" "$T/e.lrm" router=argmax
    assert_failure
    assert_output --partial "argmax"
    run X route "$T/g.lrm" "$T/e.lrm" from-hidden
    assert_output "stage_inproc: route: from-hidden needs weights"
    run X score "$T/f.lrm" "$T/e.lrm" weights="$T/nothere.lrm"
    assert_failure
    assert_output --partial "nothere.lrm"
    run X score "$T/f.lrm" "$T/e.lrm" drop=101
    assert_output "stage_inproc: drop: 101 is out of range [0, 100]"
    run X pack "$T/s.lrm" "$T/e.lrm" alloc=later
    assert_output "stage_inproc: alloc: 'later' is not auto, plan or forward"
    run X pack "$T/s.lrm" "$T/e.lrm" unpack
    assert_output --partial "pack: unknown option 'unpack'"
}

@test "lrmoe_budget_cfg_t: options by lrmoe-budget's long names give its --tsv rows; misuse is named" {
    staged_cc budget budget_inproc
    X() { env LD_LIBRARY_PATH="$LIBD" "$T/budget" "$@"; }
    run X preset=qwen3-30b-a3b gpu-mem=80G tp=2 pp=4 ep=8 dp=8 checkpoint=none micro-batch=2 \
        seq=8192 reserve=5G grad-dtype=bf16 optim-bytes=8 zero1
    assert_success
    want=$("$BIN/lrmoe-budget" --preset qwen3-30b-a3b --gpu-mem 80G --tp 2 --pp 4 --ep 8 --dp 8 \
        --checkpoint none --micro-batch 2 --seq 8192 --reserve 5G --grad-dtype bf16 \
        --optim-bytes 8 --zero1 --tsv | cut -f 2-)
    [ "$output" = "$want" ] || fail "handle rows differ from the tool's: $output vs $want"
    run X errors
    assert_success
    assert_line "run: -1 budget: no model (set preset, config or config-json)"
    assert_line --regexp "^unknown: -1 .*gpu_mem.*gpu-mem"
    assert_line "params: -1 expert-params: set a model first"
    assert_line "hidden: -1 budget: 'hidden' before a model is set"
    assert_line --regexp "^preset: -1 unknown budget preset 'nope'"
    assert_line --regexp "^tp: -1 --tp"
    assert_line "mem: -1 budget: gpu-mem, the memory of one GPU, is required"
    assert_line "row: none before a run"
    assert_line "fits: -1 budget: 'fits' before a run"
    assert_line --regexp "^ep: -1 .*ep"
}

@test "lrmoe_exec_args_t: forward, pack and compact backward by field name give the struct calls' bits; F32 weights as w_f32 only (replicas) read no other matrix; misuse is named, a broken backward argument or plan row too" {
    staged_cc args args_inproc
    run env LD_LIBRARY_PATH="$LIBD" "$T/args"
    assert_success
    assert_line "R 16 moved 0 pack_pair set"
    assert_line "same bits"
    assert_line --regexp "^pairs on replicas: [1-9][0-9]*$"
    assert_line "replicas, w_f32 only against the matrices: within 1e-5"
    assert_line "replicas, w_f32 beside other matrices: same bits"
    assert_line "no weights: -1 weights: missing matrices (w_gate, w_up, w_down: NULL only with F32 weights and w_f32)"
    # the backward's argument checks (lrmoe_exec_check_bwd_args, every
    # backend's; then the CPU backend's compact forms)
    assert_line "bwd no grad_hidden: -1 backward: missing topk_ids, topk_weights, grad_output, pair_out or an output array"
    assert_line "bwd masked no keep: -1 backward masked: needs keep"
    assert_line "bwd no saved_gate: -1 backward full: needs hidden, pair_rank, saved_gate and saved_up"
    assert_line "bwd expert: -1 topk_ids[3,1]: expert 4 out of range [0,4)"
    assert_line "bwd rank: -1 pair_rank[2,0]: rank 2 out of range [0,2)"
    assert_line --regexp "^bwd compact rows: -1 backward compact: give all of pack_grad, pack_hidden, pack_gate and pack_up, or none"
    assert_line --regexp "^bwd intact: 0 "
    # a caller's plan with one row of fwd_alloc broken (lrmoe_exec_assign)
    assert_line "plan sum: -1 fwd_alloc row 0 sums past 2^63-1"
    assert_line --regexp "^plan negative: -1 fwd_alloc\[0,[01]\]: negative \(-1\)$"
    assert_line --regexp "^plan placement: -1 fwd_alloc\[0,[01]\]: 1 pairs on a rank without an instance of the expert \(placement is 0\)$"
    assert_line --regexp "^plan row: -1 fwd_alloc row 0 sums to [0-9]+ but expert 0 has [0-9]+ pairs$"
    assert_line "unknown: -1 exec args: no argument 'hiden' (lrmoe_exec_args_new(3) lists them)"
    assert_line "number for a pointer: -1 exec args: 'hidden' is a pointer (lrmoe_exec_args_set_ptr)"
    assert_line "pointer for a number: -1 exec args: 'T' is a number (lrmoe_exec_args_set)"
    assert_line "int range: -1 exec args: P = 1099511627776 is out of int range"
    assert_line "get: -1 exec args: no number 'w_gate'"
    assert_line --regexp "^forward: -1 "
    assert_line "unset ptr: NULL"
}

@test "lrmoe_comm_callback_new: 3 ranks on 3 threads (forward with a replica, pack, compact backward) equal the single-controller run bit for bit" {
    staged_cc comm comm_threads -pthread
    run env LD_LIBRARY_PATH="$LIBD" "$T/comm"
    assert_success
    assert_line "same bits"
    # the replica of expert 0 on rank 2: its weights leave rank 0 by p2p,
    # its weight gradients come back from rank 2
    assert_line --regexp "^rank 0 sent [1-9][0-9]* a2a bytes, [1-9][0-9]* p2p bytes$"
    assert_line --regexp "^rank 2 sent [1-9][0-9]* a2a bytes, [1-9][0-9]* p2p bytes$"
}

@test "lrmoe_cost_cfg_t: the cost model by field name gives lrmoe_cost_eval's summary; misuse is named" {
    staged_cc cost cost_inproc
    run env LD_LIBRARY_PATH="$LIBD" "$T/cost"
    assert_success
    assert_line "same summary"
    assert_line "before eval: -1 cost: 't_total' before an evaluation"
    assert_line "unknown: -1 cost: no model parameter 'tokenz' (cost.h lists them)"
    assert_line --regexp "^fraction: -1 cost: K = 2.5 is not a whole number"
    assert_line --regexp "^negative: -1 cost: tokens = -1 is not a whole number"
    assert_line "get: -1 cost: no value 'nope'"
}
