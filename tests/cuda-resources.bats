#!/usr/bin/env bats
# Build-time resource check of the CUDA kernels, no GPU needed
# (tests/gpu/check-resources.sh, tests/gpu/resources.py): every kernel's
# registers, shared and local memory from the ptxas report of a compile
# with make's NVCCFLAGS, joined with its row of the launch table
# (kernels/kcu_launch.h). A kernel that could not launch at the block size
# its launcher uses fails `make check` here, not on the first GPU run.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup() {
    TOP="$BATS_TEST_DIRNAME/.."
    RES="$TOP/tests/gpu/resources.py"
    D="$BATS_TEST_TMPDIR"
}

# a copy of the sources the check compiles (kernels/, lib/ headers)
copy_tree() {
    mkdir -p "$D/tree/kernels" "$D/tree/lib"
    cp "$TOP"/kernels/*.cu "$TOP"/kernels/*.h "$D/tree/kernels/"
    cp "$TOP"/lib/*.h "$D/tree/lib/"
}

@test "cuda-resources: every kernel of kernels/ fits the launch its launcher makes (sm_90)" {
    command -v nvcc >/dev/null 2>&1 || skip "nvcc not on PATH: no CUDA objects to check"
    run make -s --no-print-directory -C "$TOP" check-resources
    echo "$output"
    assert_success
    assert_output --regexp 'check-resources: [0-9]+ kernels of the launch table checked, [0-9]+ library \(CUB\) kernels checked per thread only, 0 problem\(s\)'
    refute_output --partial "FAIL"
    # the two single-block scans run at 512 threads, every file was read
    assert_line --regexp '^k_scan_small +kcu\.cu +512 '
    assert_line --regexp '^k_counts_offsets +kcu\.cu +512 '
    assert_line --regexp '^k_pack_walk +kcu\.cu +1024 .* 128\+38912 '
    assert_line --regexp '^k_widen +gemm\.cu +256 '
    # one line per row of the table: none missing, none extra
    n=$(cc -std=c11 -I"$TOP/kernels" -o "$D/lt" "$TOP/tests/gpu/launch-table.c" && "$D/lt" | wc -l)
    [ "$n" -gt 20 ]
    assert_output --regexp "check-resources: $n kernels of the launch table"
    # and the memory-bound kernels' PTX has no integer division (issue 39)
    assert_output --regexp 'check-divfree: [0-9]+ memory-bound kernel instantiations checked \(ptx\), 0 problem\(s\)'
    for k in k_gather k_gather_scaled k_gather_scaled_bf16 k_unpack k_combine k_widen; do
        assert_line --regexp "^ok   $k \(_Z[0-9]+${k}[A-Za-z0-9_]*, ptx\): no integer division$"
    done
}

@test "cuda-resources: a division put back into a memory-bound kernel fails the division-free check" {
    command -v nvcc >/dev/null 2>&1 || skip "nvcc not on PATH"
    copy_tree
    # k_gather's token row back to a 64-bit division by K, k_widen's row
    # walk back to a flat index split by a division by n
    sed -i 's/(by_token ? kdiv_q(u, K) : u)/(by_token ? u \/ (int64_t)K.d : u)/' "$D/tree/kernels/kcu.cu"
    sed -i 's/F v = widen_bf(t\[q\]);/F v = widen_bf(t[q % (nv + 1)]);/' "$D/tree/kernels/gemm.cu"
    ! cmp -s "$TOP/kernels/kcu.cu" "$D/tree/kernels/kcu.cu"
    ! cmp -s "$TOP/kernels/gemm.cu" "$D/tree/kernels/gemm.cu"
    run sh "$TOP/tests/gpu/check-resources.sh" "$D/tree"
    echo "$output"
    assert_equal "$status" 1
    assert_line --regexp '^FAIL k_gather \(_Z8k_gatherI5uint4E.*, ptx\): [0-9]+ integer division instruction\(s\): .*div\.[su]64'
    assert_line --regexp '^FAIL k_widen \(_Z7k_widen.*, ptx\): [0-9]+ integer division instruction\(s\): .*rem\.[su]64'
    assert_line --regexp '^ok   k_combine '
    assert_output --regexp 'check-divfree: [0-9]+ memory-bound kernel instantiations checked \(ptx\), 5 problem\(s\)'
    # the resource check of the same copy still passes
    assert_output --partial "0 problem(s)"
}

@test "cuda-resources: kdiv_q (the kernels' division by K) equals C's division; row shifts" {
    cc -std=c11 -O2 -Wall -Wextra -Werror -I"$TOP/kernels" -o "$D/kdiv" "$TOP/tests/gpu/kdiv-test.c"
    run "$D/kdiv"
    assert_success
    assert_output --regexp '^kdiv-test: [0-9]+ quotients equal to C.s, row shifts ok$'
    # without its correction step it is wrong (the test can fail)
    mkdir -p "$D/bad"
    sed 's/if ((uint64_t)u - q \* v.d >= v.d) q++;//' "$TOP/kernels/kdiv.h" > "$D/bad/kdiv.h"
    ! cmp -s "$TOP/kernels/kdiv.h" "$D/bad/kdiv.h"
    cc -std=c11 -O2 -I"$D/bad" -o "$D/kdiv-bad" "$TOP/tests/gpu/kdiv-test.c"
    run "$D/kdiv-bad"
    assert_failure
    assert_output --partial "kdiv-test: FAIL"
}

@test "cuda-resources: the original defect fails it: k_scan_small at 1024 threads, no bound" {
    command -v nvcc >/dev/null 2>&1 || skip "nvcc not on PATH"
    copy_tree
    # back to the first version: BlockScan<long long, 1024>, launched with
    # 1024 threads, no __launch_bounds__ (ptxas gives it ~89 registers)
    sed -i 's/X(k_scan_small, *KCU_SCAN_TPB,/X(k_scan_small, 1024,/' "$D/tree/kernels/kcu_launch.h"
    sed -i 's/^__global__ void __launch_bounds__(KCU_THREADS(k_scan_small))$/__global__ void/' \
        "$D/tree/kernels/kcu.cu"
    ! cmp -s "$TOP/kernels/kcu.cu" "$D/tree/kernels/kcu.cu"
    ! cmp -s "$TOP/kernels/kcu_launch.h" "$D/tree/kernels/kcu_launch.h"
    run sh "$TOP/tests/gpu/check-resources.sh" "$D/tree"
    echo "$output"
    assert_equal "$status" 1
    assert_line --regexp '^k_scan_small +kcu\.cu +1024 +(6[5-9]|[7-9][0-9]|1[0-9][0-9]) .* FAIL$'
    assert_output --regexp 'FAIL kcu\.cu: kernel k_scan_small: [0-9]+ registers x 1024 threads = [0-9]+ a block > 65536 on sm_90'
    assert_output --regexp 'FAIL kcu\.cu:[0-9]+: kernel k_scan_small: 1024 threads a block and no __launch_bounds__'
    # the others still pass
    assert_line --regexp '^k_counts_offsets +kcu\.cu +512 .* ok$'
}

# A fake ptxas report and table for the checker alone (no nvcc needed).
fake_report() {
    cat > "$D/k.ptxas" <<'EOF'
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z5k_bigPf' for 'sm_90'
ptxas info    : Function properties for _Z5k_bigPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 16384 bytes smem, 360 bytes cmem[0]
ptxas info    : Compiling entry function '_Z7k_spillPf' for 'sm_90'
ptxas info    : Function properties for _Z7k_spillPf
    24 bytes stack frame, 16 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 24 bytes cumulative stack size
ptxas info    : Compiling entry function '_Z6k_tmplIiEvPT_' for 'sm_90'
ptxas info    : Function properties for _Z6k_tmplIiEvPT_
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 65 registers, used 0 barriers
ptxas info    : Compiling entry function '_ZN3cub6detail11EmptyKernelIvEEvv' for 'sm_90'
ptxas info    : Function properties for _ZN3cub6detail11EmptyKernelIvEEvv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 4 registers, used 0 barriers
EOF
    cat > "$D/k.cu" <<'EOF'
__global__ void __launch_bounds__(KCU_THREADS(k_big)) k_big(float *x) { }
__global__ void k_spill(float *x) { }
template <typename V>
__global__ void __launch_bounds__(KCU_THREADS(k_tmpl)) k_tmpl(V *x) { }
void go(float *x, int *y)
{
    k_big<<<1, KCU_THREADS(k_big), 0, 0>>>(x);
    k_spill<<<KCU_GRID(k_spill, 5), KCU_THREADS(k_spill), 0, s>>>(x);
    k_tmpl<int><<<dim3(4, 2), KCU_THREADS(k_tmpl), 0, s>>>(y);
}
EOF
}

@test "cuda-resources: the checker passes a report that fits and fails each limit on its own" {
    fake_report
    printf 'k_big 512 0 0\nk_spill 256 0 24\nk_tmpl 1024 0 0\n' > "$D/t"
    # 65 registers at 1024 threads: 72 allocated a thread, 73728 a block
    run python3 "$RES" --table "$D/t" --ptxas "$D/k.ptxas" --src "$D/k.cu"
    echo "$output"
    assert_failure
    assert_line --regexp '^k_tmpl +k\.cu +1024 +65 +73728/65536 .* FAIL$'
    assert_output --partial "FAIL k.cu: kernel k_tmpl: 65 registers x 1024 threads = 73728 a block > 65536 on sm_90"
    assert_output --partial "1 problem(s)"
    # 64 fit exactly
    sed -i "s/Used 65 registers/Used 64 registers/" "$D/k.ptxas"
    run python3 "$RES" --table "$D/t" --ptxas "$D/k.ptxas" --src "$D/k.cu"
    echo "$output"
    assert_success
    assert_line --regexp '^k_big +k\.cu +512 +64 +32768/65536 +16384\+0 .* ok$'
    assert_line --regexp '^k_tmpl +k\.cu +1024 +64 +65536/65536 .* ok$'
    assert_output --partial "0 problem(s)"
    # shared memory: 16 KiB static + 40 KiB dynamic > 48 KiB
    printf 'k_big 512 40960 0\nk_spill 256 0 24\nk_tmpl 512 0 0\n' > "$D/t"
    run python3 "$RES" --table "$D/t" --ptxas "$D/k.ptxas" --src "$D/k.cu"
    assert_failure
    assert_output --partial "FAIL k.cu: kernel k_big: shared 16384 B static + 40960 B dynamic > 49152 B"
    assert_output --partial "1 problem(s)"
    # local memory past the budget
    printf 'k_big 512 0 0\nk_spill 256 0 8\nk_tmpl 512 0 0\n' > "$D/t"
    run python3 "$RES" --table "$D/t" --ptxas "$D/k.ptxas" --src "$D/k.cu"
    assert_failure
    assert_output --partial "FAIL k.cu: kernel k_spill: local memory 24 B stack frame, 16 B spill stores > budget 8 B"
    assert_output --partial "1 problem(s)"
}

@test "cuda-resources: the checker fails a kernel without a row, a stale row, a wrong launch or bound" {
    fake_report
    sed -i "s/Used 65 registers/Used 40 registers/" "$D/k.ptxas"
    # no row for k_tmpl; a row for a kernel that is gone
    printf 'k_big 512 0 0\nk_spill 256 0 24\nk_gone 256 0 0\n' > "$D/t"
    run python3 "$RES" --table "$D/t" --ptxas "$D/k.ptxas" --src "$D/k.cu"
    assert_failure
    assert_output --partial "FAIL k.cu: kernel k_tmpl has no row in the launch table"
    assert_output --partial "FAIL launch table row k_gone names no compiled kernel"
    # a launch with a literal block size; a bound that is not the table's
    printf 'k_big 512 0 0\nk_spill 256 0 24\nk_tmpl 512 0 0\n' > "$D/t"
    sed -i 's/k_spill<<<KCU_GRID(k_spill, 5), KCU_THREADS(k_spill)/k_spill<<<KCU_GRID(k_spill, 5), 256/' "$D/k.cu"
    sed -i 's/__launch_bounds__(KCU_THREADS(k_big)) k_big/__launch_bounds__(512) k_big/' "$D/k.cu"
    run python3 "$RES" --table "$D/t" --ptxas "$D/k.ptxas" --src "$D/k.cu"
    assert_failure
    assert_output --partial "FAIL k.cu:8: launch of k_spill: block size '256', not KCU_THREADS(k_spill)"
    assert_output --partial "FAIL k.cu:1: kernel k_big: __launch_bounds__(512), not KCU_THREADS(k_big)"
    # a 512-thread kernel without its bound (even though today's 64 fit)
    sed -i 's/__launch_bounds__(512) k_big/k_big/' "$D/k.cu"
    run python3 "$RES" --table "$D/t" --ptxas "$D/k.ptxas" --src "$D/k.cu"
    assert_failure
    assert_output --partial "FAIL k.cu:1: kernel k_big: 512 threads a block and no __launch_bounds__(KCU_THREADS(k_big))"
    # library kernels are listed, not looked up in the table
    assert_line --regexp '^EmptyKernel +k\.cu .* ok \(library\)$'
}

# ---- the Hopper grouped GEMM (kernels/ggemm.cu, issue 39)

@test "cuda-resources: ggemm's setup logic (offsets -> shapes, pointers; K-grouped split; zero-row experts; checks; list split) on the host" {
    cc -std=c11 -O2 -Wall -Wextra -Werror -I"$TOP/lib" -I"$TOP/kernels" -o "$D/gg" "$TOP/tests/gpu/ggemm-test.c"
    run "$D/gg"
    echo "$output"
    assert_success
    assert_line "ggemm-test: row-grouped tb=0 beta=0: 12 rows of 5 experts equal the row-by-row layer"
    assert_line "ggemm-test: row-grouped tb=1 beta=0: 12 rows of 5 experts equal the row-by-row layer"
    assert_line "ggemm-test: K-grouped beta=0: 4 experts (one without rows: zeroed) equal the per-expert sums"
    assert_line "ggemm-test: K-grouped beta=1: 4 experts (one without rows: kept) equal the per-expert sums"
    assert_line "ggemm-test: split of a list: 5 of 12 GEMMs in 5 launches, the rest to cuBLAS"
    assert_line --regexp '^ggemm-test: argument checks: [0-9]+ bad descriptions rejected with their reason$'
    assert_line "ggemm-test: ok"
    # the test can fail: C of a row group at the wrong row stride, a
    # K-grouped expert without rows left unzeroed, B of a K group at the
    # expert index instead of its rows
    mkdir -p "$D/bad"
    for mut in 's/out->co = o0 \* d->ldc;/out->co = o0 * d->lda;/' \
               's/out->zm = d->beta == 0.0f ? (int)m : 0;/out->zm = 0;/' \
               's/out->bo = o0 \* d->ldb;/out->bo = g * d->ldb;/'; do
        sed "$mut" "$TOP/kernels/ggemm_setup.h" > "$D/bad/ggemm_setup.h"
        ! cmp -s "$TOP/kernels/ggemm_setup.h" "$D/bad/ggemm_setup.h"
        cc -std=c11 -O2 -I"$D/bad" -I"$TOP/lib" -I"$TOP/kernels" -o "$D/gg-bad" "$TOP/tests/gpu/ggemm-test.c"
        run "$D/gg-bad"
        assert_failure
        assert_output --partial "ggemm-test: FAIL"
    done
}

@test "cuda-resources: the CUTLASS grouped GEMM objects are Hopper wgmma code (HGMMA), no local memory, under sm_90's register limit" {
    command -v nvcc >/dev/null 2>&1 || skip "nvcc not on PATH"
    B="$TOP/${BUILD:-build}"
    make -s --no-print-directory -C "$TOP" print-cutlass | grep -q '^HAVE_CUTLASS=1' ||
        skip "built without the CUTLASS headers (tests/gpu/cutlass-inc.sh finds none)"
    # cuobjdump: the toolkit's, else the one Triton's wheel ships
    CO=$(command -v cuobjdump || python3 -c 'import importlib.util as u, os
s = u.find_spec("triton")
print(os.path.join(list(s.submodule_search_locations)[0], "backends/nvidia/bin/cuobjdump") if s else "")' 2>/dev/null)
    [ -n "$CO" ] && [ -x "$CO" ] || skip "no cuobjdump"
    for v in 000 001 010 011 100 101; do
        o="$B/kernels/cutlass/gg_$v.o"
        [ -f "$o" ] || { echo "no $o (run make)"; false; }
        # ptxas's report of the make that built it: one kernel, no spill
        r="$B/kernels/cutlass/gg_$v.ptxas"
        run grep -c "Compiling entry function '_ZN7cutlass13device_kernel" "$r"
        assert_output 1
        run grep -A2 "Compiling entry function '_ZN7cutlass13device_kernel" "$r"
        assert_output --partial "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"
        regs=$(grep -A3 "Compiling entry function '_ZN7cutlass13device_kernel" "$r" |
               sed -n 's/.*Used \([0-9]*\) registers.*/\1/p')
        [ -n "$regs" ] && [ "$regs" -le 255 ]
        # sm_90a machine code with warpgroup MMAs (not the HMMA path)
        run sh -c "'$CO' -sass '$o' | grep -c HGMMA"
        [ "$output" -gt 0 ]
        run "$CO" -lelf "$o"
        assert_output --partial "sm_90a"
        echo "gg_$v: $regs registers, $("$CO" -sass "$o" | grep -c HGMMA) HGMMA"
    done
}

@test "cuda-resources: CUTLASS accepts the grouped GEMM's arguments with device-only problem shapes and sizes its workspace (host code, no GPU)" {
    command -v nvcc >/dev/null 2>&1 || skip "nvcc not on PATH"
    B="$TOP/${BUILD:-build}"
    make -s --no-print-directory -C "$TOP" print-cutlass | grep -q '^HAVE_CUTLASS=1' ||
        skip "built without the CUTLASS headers"
    nvcc -std=c++17 -I"$TOP/kernels" -o "$D/gga" "$TOP/tests/gpu/ggemm-args.cpp" \
        "$B"/kernels/cutlass/gg_*.o
    run "$D/gga" 0 1 2 3 4 5
    echo "$output"
    assert_success
    for v in 0 1 2 3 4 5; do
        assert_line --regexp "^ggemm-args: variant $v: workspace [0-9]+ B at 66 SMs, [0-9]+ B at 132 SMs: ok$"
    done
}
