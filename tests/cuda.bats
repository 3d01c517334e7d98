#!/usr/bin/env bats
# The CUDA backend on a machine without a GPU: the build compiles it whenever
# nvcc exists, --backend cuda fails cleanly, check-gpu claims no pass, and the
# backend's host data path (kernels/exec_cuda.cu with the kernels replaced by
# their CPU references, tests/gpu/fake-kcu.c) matches --backend cpu.
# (The GPU checks themselves are `make check-gpu`, tests/gpu/.)

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    TOP="$BATS_TEST_DIRNAME/.."
    REF="$BATS_TEST_DIRNAME/helpers/exec_ref.py"
    D="$BATS_TEST_TMPDIR"
    EXEC="$BIN/lrmoe-exec"
}

have_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

@test "cuda: make builds the CUDA objects for sm_90 when nvcc exists, none without" {
    command -v nvcc >/dev/null 2>&1 || skip "nvcc not on PATH"
    # explicit targets: the Makefile's .SECONDARY keeps intermediates of an
    # up-to-date bin/ from being rebuilt, so ask for the objects themselves
    run make -C "$TOP" -n BUILD="$D/b" "$D/b/kernels/kcu.o" "$D/b/kernels/gemm.o" \
        "$D/b/kernels/comm_nccl.o" "$D/b/kernels/exec_cuda.o" "$D/b/lib/exec.o"
    assert_success
    assert_output --regexp 'nvcc [^
]*-arch=sm_90 [^
]*kernels/kcu\.cu'
    assert_output --partial "kernels/gemm.cu"
    assert_output --partial "kernels/comm_nccl.cu"
    assert_output --partial "kernels/exec_cuda.cu"
    assert_output --regexp 'cc [^
]*-DLRMOE_HAVE_CUDA [^
]*lib/exec\.c'
    run make -C "$TOP" -n BUILD="$D/b" CUDA_ARCH=sm_80 "$D/b/kernels/kcu.o"
    assert_output --partial "-arch=sm_80"
    # CUDA_HOME empty: CPU-only, the library has no CUDA object, no define
    run make -C "$TOP" -n BUILD="$D/c" CUDA_HOME= "$D/c/liblrmoe.a"
    assert_success
    assert_output --partial "lib/exec.c"
    refute_output --partial "nvcc"
    refute_output --partial "LRMOE_HAVE_CUDA"
    refute_output --partial "kernels/"
}

# The module of the build that linked bin/ (build/san under SANITIZE=1);
# skips in a CPU-only build, which has none.
cuda_module_built() {
    MOD="$(cd "$TOP" && pwd -P)/${LRMOE_BUILD:-build}/liblrmoe-cuda.so.1"
    [ -x "$EXEC" ] || skip "bin/lrmoe-exec not built"
    [ -f "$MOD" ] || skip "CPU-only build (no nvcc at build time): no $MOD"
}

@test "cuda: lrmoe-exec needs no CUDA library; it carries the module loader and a run path to the module" {
    cuda_module_built
    run readelf -d "$EXEC"
    assert_success
    refute_output --regexp 'NEEDED.*\[lib(cudart|cublas|cublasLt|nccl)\.so'
    assert_output --partial '$ORIGIN/../lib'
    assert_output --partial "$(dirname "$MOD")"
    # the CUDA entry points are the loader's trampolines, not the kernels
    run nm "$EXEC"
    assert_line --regexp ' [Tt] lrmoe_exec_forward_cuda$' # hidden (local) since API 2
    refute_line --regexp ' [Tt] lrmoe_kcu_gemm$'
    run ldd "$EXEC"
    refute_output --regexp 'lib(cudart|cublas|cublasLt|nccl)\.so'
}

@test "cuda: --backend cuda without a GPU fails with a clear error, exit 1, no trailer" {
    have_gpu && skip "a GPU is present: make check-gpu tests the backend"
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 20 --E 4 --K 2 --D 8 --F 6 --dtype bf16
    for ph in forward backward; do
        src="$D/in.lrm"
        if [ $ph = backward ]; then
            "$EXEC" --phase forward --weights "$D/w.lrm" --no-compress -o "$D/f.lrm" "$D/in.lrm"
            src="$D/f.lrm"
        fi
        run "$EXEC" --phase $ph --backend cuda --weights "$D/w.lrm" --no-compress \
            -o "$D/out.lrm" "$src"
        assert_equal "$status" 1
        assert_line --regexp '^lrmoe-exec: .*backend cuda: (no usable CUDA device: cudaGetDeviceCount: .+|this build has no CUDA support.*)$'
        # the failed run left a stream without trailer
        run python3 -c "import sys; sys.path.insert(0, '$BATS_TEST_DIRNAME/helpers'); from lrmoe_stream import read_stream; read_stream('$D/out.lrm')"
        assert_failure
    done
    # the CPU backend on the same input works
    run "$EXEC" --phase forward --backend cpu --weights "$D/w.lrm" --no-compress -o "$D/ok.lrm" "$D/in.lrm"
    assert_success
}

@test "cuda: check-gpu without CUDA or without a GPU says so, exits 77 (skipped), claims no pass" {
    have_gpu && skip "a GPU is present"
    run env HAVE_CUDA= BUILD="$D/none" sh "$TOP/tests/gpu/check-gpu.sh"
    assert_equal "$status" 77
    assert_output --partial "GPU checks NOT run"
    refute_output --partial "PASS"
    tk=$(ls "$TOP"/build/tests/gpu/test-kernels /tmp/build-*/tests/gpu/test-kernels 2>/dev/null | head -1)
    [ -n "$tk" ] || skip "no built test-kernels to probe with"
    run "$tk" --probe
    assert_equal "$status" 3
    assert_output --partial "no CUDA device"
    run env HAVE_CUDA=1 BUILD="$(dirname "$(dirname "$(dirname "$tk")")")" sh "$TOP/tests/gpu/check-gpu.sh"
    assert_equal "$status" 77
    assert_output --partial "GPU checks NOT run (no pass claimed, exit 77)"
    refute_output --partial "PASS"
}

@test "cuda: the CUDA backend's data path (exec_cuda.cu on the kernels' CPU references) equals --backend cpu" {
    command -v nvcc >/dev/null 2>&1 || skip "nvcc not on PATH (the CUDA headers are needed)"
    run sh "$TOP/tests/gpu/build-fake.sh" "$D/fake"
    assert_success
    refute_output --partial "warning"
    run env LRMOE_CHECK_FAKE="$D/fake/lrmoe-exec-fake" sh "$TOP/tests/gpu/check-gpu.sh"
    assert_success
    assert_output --partial "backward compact cuda = cpu bf16 P=4"
    assert_output --partial "check-gpu (fake device): data path PASS"
    refute_output --partial "FAIL"
    # and the comparison can fail: a CUDA path that skipped the second FC1
    # GEMM (dx = dg W_gate only) is caught
    run env LRMOE_CHECK_FAKE="$D/fake/lrmoe-exec-fake" LRMOE_FAKE_BREAK=dx LRMOE_CHECK_PS=3 \
        sh "$TOP/tests/gpu/check-gpu.sh"
    assert_failure
    assert_output --partial "FAIL backward full cuda = cpu"
}

@test "cuda: the persistent executor (fake device): repeated frames on one executor give the first frame's results; device-pointer I/O equals host I/O bitwise" {
    command -v nvcc >/dev/null 2>&1 || skip "nvcc not on PATH (the CUDA headers are needed)"
    run sh "$TOP/tests/gpu/build-fake.sh" "$D/fake"
    assert_success
    REF="$TOP/tests/helpers/exec_ref.py"
    X="$D/fake/lrmoe-exec-fake"
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 101 --E 16 --K 4 --D 32 --F 24 --dtype bf16 --seed 5
    python3 "$REF" plan "$D/in.lrm" "$D/pl.lrm" --P 4 --replicas --seed 2
    # one frame, then the same frame three times on one executor (weights
    # resident from the first): equal, forward and backward
    run "$X" --phase forward --backend cuda --weights "$D/w.lrm" -P 4 --no-compress -o "$D/f1.lrm" "$D/pl.lrm"
    assert_success
    run "$X" --phase forward --backend cuda --warmup 2 --repeat 1 --weights "$D/w.lrm" -P 4 --no-compress -o "$D/f3.lrm" "$D/pl.lrm"
    assert_success
    run python3 "$REF" compare "$D/f3.lrm" "$D/f1.lrm" output pair_out phi_sqnorm saved_gate saved_up --tol 0
    assert_success
    run "$X" --phase backward --backend cuda --weights "$D/w.lrm" --no-compress -o "$D/b1.lrm" "$D/f1.lrm"
    assert_success
    run "$X" --phase backward --backend cuda --warmup 2 --weights "$D/w.lrm" --no-compress -o "$D/b3.lrm" "$D/f1.lrm"
    assert_success
    run python3 "$REF" compare "$D/b3.lrm" "$D/b1.lrm" grad_hidden grad_w_gate grad_w_up grad_w_down grad_topk_weights --tol 0
    assert_success
    run "$D/fake/devio-test"
    echo "$output"
    assert_success
    assert_output --partial "devio: PASS"
}

@test "cuda: --gpus, --device, --gemm, --gemm-streams parse; bad values exit 2; cpu ignores them; cuda without a GPU exits 1" {
    run "$EXEC" --help
    assert_success
    assert_output --partial "--gpus N"
    assert_output --partial "--gemm G"
    assert_output --partial "--gemm-streams N"
    assert_output --partial "or cutlass (Hopper grouped GEMM"
    for bad in "--gemm fast" "--gemm-streams 0" "--gemm-streams 9" "--gpus -1" "--gpus x" "--device -2"; do
        # shellcheck disable=SC2086
        run "$EXEC" --phase forward --weights x $bad
        assert_equal "$status" 2
        assert_line --regexp "^lrmoe-exec: --(gemm|gemm-streams|gpus|device)"
    done
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 20 --E 4 --K 2 --D 8 --F 6 --dtype bf16
    "$EXEC" --phase forward --weights "$D/w.lrm" -P 2 --no-compress -o "$D/a.lrm" "$D/in.lrm"
    for g in grouped cutlass; do
        run "$EXEC" --phase forward --weights "$D/w.lrm" -P 2 --gpus 2 --device 1 --gemm $g \
            --gemm-streams 8 --no-compress -o "$D/b.lrm" "$D/in.lrm"
        assert_success
        run python3 "$REF" compare "$D/a.lrm" "$D/b.lrm" output phi_sqnorm --tol 0
        assert_success
    done
    run "$EXEC" --phase forward --weights x --gemm cutlas
    assert_equal "$status" 2
    assert_line --partial "unknown GEMM implementation 'cutlas' (loop, grouped, cutlass)"
    have_gpu && skip "a GPU is present: make check-gpu tests the backend"
    run "$EXEC" --phase forward --backend cuda --gpus 1 --gemm grouped --gemm-streams 2 \
        --weights "$D/w.lrm" --no-compress -o "$D/c.lrm" "$D/in.lrm"
    assert_equal "$status" 1
    assert_line --regexp '^lrmoe-exec: .*backend cuda: (no usable CUDA device: cudaGetDeviceCount: .+|this build has no CUDA support.*)$'
}

@test "cuda: lrmoe-exec --backend cuda loads the module through its run path; a module that is not there is the loader's error, exit 1, no trailer" {
    cuda_module_built
    python3 "$REF" make "$D/in.lrm" "$D/w.lrm" --T 20 --E 4 --K 2 --D 8 --F 6 --dtype bf16
    run env LRMOE_CUDA_MODULE="$D/nowhere/liblrmoe-cuda.so.1" "$EXEC" --phase forward --backend cuda \
        --weights "$D/w.lrm" --no-compress -o "$D/out.lrm" "$D/in.lrm"
    assert_equal "$status" 1
    assert_line "lrmoe-exec: frame 0: backend cuda: cannot load the CUDA module $D/nowhere/liblrmoe-cuda.so.1: cannot open shared object file: No such file or directory (the path LRMOE_CUDA_MODULE names)"
    run python3 -c "import sys; sys.path.insert(0, '$BATS_TEST_DIRNAME/helpers'); from lrmoe_stream import read_stream; read_stream('$D/out.lrm')"
    assert_failure
    # no module next to bin/: the bare name, found in the build directory
    # through the run path, is opened (then, without a GPU, CUDA's own error)
    [ ! -e "$(dirname "$EXEC")/liblrmoe-cuda.so.1" ] || skip "a module next to bin/lrmoe-exec"
    run env -u LRMOE_CUDA_MODULE LD_DEBUG=files "$EXEC" --phase forward --backend cuda \
        --weights "$D/w.lrm" --no-compress -o "$D/out.lrm" "$D/in.lrm"
    assert_output --partial "opening file=$MOD [0]"
    refute_output --partial "cannot load the CUDA module"
    if ! have_gpu; then
        assert_equal "$status" 1
        assert_line --regexp '^lrmoe-exec: .*backend cuda: no usable CUDA device: cudaGetDeviceCount: .+$'
    fi
}

# issue 39: tests/gpu/device-check.sh on a simulated device machine
# (tests/gpu/sim-device.sh: apt-get fails, no mpicc or ompi-c, the
# dependencies' headers only through CPATH from build/gpu-carry) whose
# toolkit directory has cudart but neither cuBLAS nor NCCL, which come from
# nvidia-* wheel directories as the image ships them. In a copy of the tree
# (the build writes bin/). Without a GPU every GPU step says NOT RUN.
@test "cuda: device-check.sh builds on a simulated device machine (NODEPS, CPATH, no MPI, cuBLAS/NCCL from wheels) and leaves every step's status" {
    # it copies the tree and builds it plain, as the device machine does:
    # under SANITIZE=1 nothing sanitized would run, only the plain pass again
    [ -z "${SANITIZE:-}" ] || skip "builds and runs a plain copy of the tree, nothing sanitized: the plain make check runs it"
    command -v nvcc >/dev/null 2>&1 || skip "nvcc not on PATH"
    have_gpu && skip "a GPU is present"
    source "$BATS_TEST_DIRNAME/gpu/sim-device.sh"
    CU=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    for l in cudart cublas cublasLt nccl; do
        ls "$CU"/lib64/lib$l.so.* >/dev/null 2>&1 || skip "the toolkit has no lib$l to stand in for a wheel"
    done
    # the tree, as the device tool copies it (no .git)
    mkdir -p "$D/tree"
    (cd "$TOP" && git ls-files -co --exclude-standard | grep -v '^shared/' | tar -cf - -T -) |
        tar -C "$D/tree" -xf -
    [ -f "$D/tree/tests/gpu/device-check.sh" ]
    # the CUTLASS objects of this build stand in for --prepare's compile of
    # them (minutes); it copies them into the carry, and the device build
    # links them from there (CUTLASS_PREBUILT)
    if [ -f "$TOP/${BUILD:-build}/kernels/cutlass/gg_000.o" ]; then
        mkdir -p "$D/tree/build/kernels/cutlass"
        cp -p "$TOP/${BUILD:-build}"/kernels/cutlass/gg_*.o "$D/tree/build/kernels/cutlass/"
    fi
    # --prepare runs in the checkout (its commit travels in the carry)
    (cd "$D/tree" && GIT_DIR="$(cd "$TOP" && git rev-parse --absolute-git-dir)" GIT_WORK_TREE="$D/tree" \
        sh tests/gpu/device-check.sh --prepare) > /dev/null
    [ -f "$D/tree/build/gpu-carry/include/zstd.h" ]
    # the toolkit: nvcc, cudart only; the wheels: cuBLAS and NCCL
    mkdir -p "$D/cuda/bin" "$D/cuda/lib64" "$D/nvidia/cu13/lib" "$D/nvidia/nccl/lib"
    printf '#!/bin/sh\nexec %s/bin/nvcc "$@"\n' "$CU" > "$D/cuda/bin/nvcc"
    chmod +x "$D/cuda/bin/nvcc"
    ln -s "$CU"/lib64/libcudart.so* "$D/cuda/lib64/"
    for l in cublas cublasLt; do
        f=$(ls "$CU"/lib64/lib$l.so.[0-9]* | head -1)
        ln -s "$(readlink -f "$f")" "$D/nvidia/cu13/lib/$(basename "$f")"
    done
    f=$(ls "$CU"/lib64/libnccl.so.[0-9]* | head -1)
    ln -s "$(readlink -f "$f")" "$D/nvidia/nccl/lib/$(basename "$f")"
    sim_device "$D/sim"
    SIM_PATH_PRE="$D/cuda/bin"
    run sim_env OUT="$D/out" LRMOE_NVIDIA_DIRS="$D/nvidia" DEVICE_CHECK_JOBS=2 \
        DEVICE_CHECK_BUILD_S=900 DEVICE_CHECK_BUDGET=1200 sh "$D/tree/tests/gpu/device-check.sh"
    echo "$output"
    cat "$D/out/summary.txt"
    # not all passed (no GPU), but the build did, with cuBLAS and NCCL from the wheels
    assert_failure
    assert_line --regexp '^device-check: INCOMPLETE \(a step could not run here; no pass claimed\)'
    assert_line "commit: $(git -C "$TOP" rev-parse HEAD)"
    assert_line --regexp '^step build: ok '
    assert_line "lib cublas:$D/nvidia/cu13/lib/$(ls "$D/nvidia/cu13/lib" | grep '^libcublas\.so' | head -1)(wheel)"
    assert_line --regexp "^lib nccl:$D/nvidia/nccl/lib/libnccl\.so\.[0-9]+\(wheel\)$"
    assert_line --regexp "^lib cudart:$D/cuda/lib64/libcudart\.so\(toolkit\)$"
    for t in $(sh "$D/tree/tests/gpu/device-check.sh" --targets build/dev); do
        [ -e "$D/tree/$t" ] || fail "$t not built"
    done
    # no apt-get, no MPI, the dependency headers from the carry alone
    assert_equal "$(cat "$D/sim/apt-get.log")" ""
    run grep '^MPI_LIBS' "$D/tree/build/dev/mpi.mk"
    assert_output "MPI_LIBS := "
    grep -q 'gpu-carry/include' "$D/tree/build/dev/lib/stream.d"
    # each step's status, in order of value, each GPU step NOT RUN
    run grep -o '^step [a-z]*: [A-Z]*[a-z]*' "$D/out/summary.txt"
    assert_output "$(printf 'step env: done\nstep build: ok\nstep kernels: NOT\nstep ggemm: NOT\nstep bench: NOT\nstep exec: NOT\nstep devio: NOT\nstep tcuda: NOT\nstep mpi: NOT\nstep sass: NOT')"
    # the CUTLASS grouped GEMM linked from the carried objects
    if [ -f "$TOP/${BUILD:-build}/kernels/cutlass/gg_000.o" ]; then
        grep -qx "cutlass: CUTLASS_PREBUILT=$D/tree/build/gpu-carry/cutlass" "$D/out/summary.txt"
        [ "$(ls "$D/tree/build/gpu-carry/cutlass" | wc -l)" = 6 ]
        nm "$D/tree/build/dev/liblrmoe-cuda.so.1" | grep -q kcu_gg_sm90_5
    fi
    run grep '^step mpi:' "$D/out/summary.txt"
    assert_output --partial "no usable GPU"
    # env.txt: the commit, ldconfig -p, the toolkit's listing, the search
    run cat "$D/out/env.txt"
    assert_line "$(git -C "$TOP" rev-parse HEAD)"
    assert_line "== ldconfig -p"
    assert_output --regexp "libc\.so\.6 .*=> "
    assert_line "-- $D/cuda/lib64"
    assert_output --partial "libcublas: $D/nvidia/cu13/lib/"
    # at most 8 files come back, none below a folder
    assert_equal "$(find "$D/out" -mindepth 1 | wc -l)" "$(find "$D/out" -maxdepth 1 -type f | wc -l)"
    [ "$(find "$D/out" -type f | wc -l)" -le 8 ]
}

@test "cuda: device-check.sh: a failing or timed-out step is reported and the next runs; no budget left is SKIPPED" {
    # a fake build directory: test-kernels that fails one case, a bench that
    # hangs, no make (build fails), within a budget that runs out
    mkdir -p "$D/tree/tests/gpu" "$D/tree/build/dev/tests/gpu" "$D/bin"
    cp "$TOP/tests/gpu/device-check.sh" "$TOP/tests/gpu/cuda-libs.sh" "$D/tree/tests/gpu/"
    printf '#!/bin/sh\necho "ok   a"\necho "FAIL b"\necho "1 of 2 kernel checks passed"\nexit 1\n' \
        > "$D/tree/build/dev/tests/gpu/test-kernels"
    printf '#!/bin/sh\nsleep 100\n' > "$D/tree/build/dev/tests/gpu/bench-gpu"
    printf '#!/bin/sh\necho "make: simulated failure" >&2\nexit 2\n' > "$D/bin/make"
    chmod +x "$D"/tree/build/dev/tests/gpu/* "$D/bin/make"
    run env PATH="$D/bin:$PATH" OUT="$D/out" LRMOE_NVIDIA_DIRS= DEVICE_CHECK_BUDGET=20 \
        sh "$D/tree/tests/gpu/device-check.sh"
    echo "$output"
    assert_failure
    assert_line --regexp '^step build: FAIL \([0-9]+s, at [0-9]+s\): exit 2, not built: lrmoe-exec'
    assert_line --regexp '^step kernels: FAIL .*1 FAIL lines; 1 of 2 kernel checks passed$'
    assert_line --regexp "^step bench: TIMEOUT \\((19|2[0-9])s"
    assert_line --regexp '^step exec: SKIPPED \(no budget left'
    assert_line --regexp '^step mpi: SKIPPED \(no budget left'
    assert_line --regexp '^device-check: NOT ALL PASSED'
    run cat "$D/out/kernels.txt"
    assert_line "FAIL b"
}
