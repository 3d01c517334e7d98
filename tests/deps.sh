#!/bin/sh
# Make sure what lrmoe needs is installed. `deps.sh build` checks the build
# dependencies, `deps.sh test` those of the test suite and benchmarks.
# Missing Debian packages are installed with apt-get when we are root;
# otherwise we print exactly what to install and fail. Headers and libraries
# are looked for by the compiler ($CC, default cc), so CPATH, LIBRARY_PATH
# and -I/-L in CC count. The optional ones (OpenMPI, oneDNN) never fail it:
# a failed apt-get of those (no network) is reported and the build goes on
# without them. `make NODEPS=1` skips this script altogether.
set -u
what=${1:-build}
missing=""
CC=${CC:-cc}
need_hdr() { # header package: found by the compiler, so CPATH and CC's -I count
    printf '#include <%s>\n' "$1" | $CC -E -x c - -o /dev/null >/dev/null 2>&1 ||
        missing="$missing $2"
}
need_lib() { # library package: something may provide the header alone
    printf 'int main(void){return 0;}\n' | $CC -x c - -o /dev/null "-l$1" \
        >/dev/null 2>&1 || missing="$missing $2"
}
need_cmd() { command -v "$1" >/dev/null 2>&1 || missing="$missing $2"; }
# optional: installed when we are root, else named without failing
optional=""
want_cmd() { command -v "$1" >/dev/null 2>&1 || optional="$optional $2"; }
need_dir() { [ -d "$1" ] || missing="$missing $2"; }

need_hdr zstd.h libzstd-dev
need_hdr jansson.h libjansson-dev
need_hdr glpk.h libglpk-dev
need_hdr cblas.h libopenblas-dev
need_lib zstd libzstd-dev
need_lib jansson libjansson-dev
need_lib glpk libglpk-dev
need_lib openblas libopenblas-dev
need_cmd cc gcc
need_cmd make make
want_cmd mpicc libopenmpi-dev           # lrmoe-exec under mpirun (MPI)
want_cmd mpirun openmpi-bin
if [ "$what" = test ]; then
    need_cmd bats bats
    need_dir /usr/lib/bats/bats-support bats-support
    need_dir /usr/lib/bats/bats-assert bats-assert
    need_cmd mandoc mandoc
    need_cmd prove perl
    need_cmd zstd zstd
    need_cmd python3 python3
    need_cmd gnuplot gnuplot-nox
    need_cmd rsvg-convert librsvg2-bin  # plot.bats: SVGs drawn the same by rsvg...
    need_cmd convert imagemagick        # ...and by ImageMagick
    fc-list 2>/dev/null | grep -q 'DejaVu Sans' || missing="$missing fonts-dejavu-core" # the figures' font
    need_cmd bc bc                      # benchmarks' arithmetic
    need_cmd valgrind valgrind          # leak checks (interop.bats)
    need_cmd qemu-x86_64 qemu-user      # other CPUs' instruction sets (isa.bats)
    [ -x /usr/bin/time ] || missing="$missing time"   # benchmarks' peak RSS
    need_cmd clang-14 clang-14          # libFuzzer harnesses (tests/fuzz)
    ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a >/dev/null 2>&1 ||
        missing="$missing libclang-rt-14-dev"
    # lrmoe-study's corpus (tests/study.bats): the fortunes package's texts
    [ -f /usr/share/games/fortunes/science ] || missing="$missing fortunes"
fi

root_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }
apt_install() { # packages...: quiet apt-get update + install, status of both
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq "$@"; } >&2
}
if [ -n "$missing" ]; then
    if root_apt; then
        echo "lrmoe: installing:$missing" >&2
        # shellcheck disable=SC2086
        apt_install $missing || { echo "lrmoe: apt-get install$missing failed" >&2; exit 1; }
    else
        echo "lrmoe: missing build dependencies; install them with:" >&2
        echo "    sudo apt-get install$missing" >&2
        exit 1
    fi
fi
# Optional ones never fail the build: tried as root, else named (an
# apt-get that cannot reach its registry only costs the attempt).
if [ -n "$optional" ] && root_apt; then
    echo "lrmoe: installing (optional, MPI support of lrmoe-exec):$optional" >&2
    # shellcheck disable=SC2086
    apt_install $optional ||
        echo "lrmoe: optional$optional not installed (apt-get failed): lrmoe-exec without MPI" >&2
elif [ -n "$optional" ]; then
    echo "lrmoe: optional (MPI support of lrmoe-exec): sudo apt-get install$optional" >&2
fi

# Optional: oneDNN for the BF16 expert GEMMs (lrmoe-exec --compute bf16);
# installed when we are root, else the build is F32-only (the Makefile says so).
if ! printf '#include <oneapi/dnnl/dnnl.h>\n' | $CC -E -x c - -o /dev/null >/dev/null 2>&1 &&
    root_apt; then
    echo "lrmoe: installing libdnnl-dev (oneDNN: BF16 GEMMs)" >&2
    apt_install libdnnl-dev ||
        echo "lrmoe: libdnnl-dev not installed: building without --compute bf16" >&2
fi

# Optional: CUTLASS 3.x headers (PyPI nvidia-cutlass, header-only, no
# dependencies needed for them) for the Hopper grouped GEMM of the CUDA
# backend (lrmoe-exec --gemm cutlass); only looked at when nvcc is there.
# Without them the CUDA build goes on without that kernel (the Makefile
# says so). tests/gpu/cutlass-inc.sh prints where the headers are.
CUTLASS_PIN=4.2.0.0
if command -v nvcc >/dev/null 2>&1 && ! sh tests/gpu/cutlass-inc.sh >/dev/null 2>&1; then
    echo "lrmoe: installing python module nvidia-cutlass==$CUTLASS_PIN (headers only)" >&2
    for bsp in "" --break-system-packages; do
        python3 -m pip install -q --no-deps $bsp "nvidia-cutlass==$CUTLASS_PIN" >&2 2>/dev/null && break
    done
    sh tests/gpu/cutlass-inc.sh >/dev/null 2>&1 ||
        echo "lrmoe: nvidia-cutlass not installed: building without --gemm cutlass" >&2
fi

if [ "$what" = test ]; then
    # Python helpers for the reference checks and interop tests.
    if ! python3 -c 'import numpy, safetensors' 2>/dev/null; then
        echo "lrmoe: installing python modules numpy safetensors" >&2
        python3 -m pip install -q numpy safetensors >&2 2>/dev/null ||
        python3 -m pip install -q --break-system-packages numpy safetensors >&2 || {
            echo "lrmoe: missing python modules; install them with:" >&2
            echo "    python3 -m pip install numpy safetensors" >&2
            exit 1; }
    fi
    # hypothesis: the property-based test of the Python binding
    # (tests/python/test_fuzz.py: random dtypes, shapes and sizes never crash)
    if ! python3 -c 'import hypothesis' 2>/dev/null; then
        echo "lrmoe: installing python module hypothesis" >&2
        python3 -m pip install -q hypothesis >&2 2>/dev/null ||
            python3 -m pip install -q --break-system-packages hypothesis >&2 ||
            echo "lrmoe: hypothesis not installed: tests/python.bats will skip the fuzz test" >&2
    fi
    # setuptools: `pip install ./lib/python` without build isolation (offline)
    if ! python3 -c 'import setuptools' 2>/dev/null; then
        python3 -m pip install -q setuptools >&2 2>/dev/null ||
            python3 -m pip install -q --break-system-packages setuptools >&2 ||
            echo "lrmoe: setuptools not installed: the pip install test will fail" >&2
    fi
    # PyTorch and transformers for tests/python (lrmoe.torch) and the CPU
    # bench, from the default index (PyPI's Linux wheel also brings CUDA's
    # runtime libraries, ~3 GB, about 2 minutes here; the tests use the CPU);
    # without them those tests skip and say why.
    if ! python3 -c 'import torch, transformers' 2>/dev/null; then
        echo "lrmoe: installing python modules torch transformers" >&2
        for bsp in "" --break-system-packages; do
            python3 -m pip install -q $bsp torch transformers >&2 2>/dev/null && break
        done
        python3 -c 'import torch, transformers' 2>/dev/null ||
            echo "lrmoe: torch/transformers not installed: tests/python.bats will skip them" >&2
    fi
    # Megatron-Core for the register_megatron test (tests/python/test_megatron.py:
    # its MoELayer built on the CPU); pinned, its own requirements are torch,
    # numpy and packaging (Transformer Engine, grouped_gemm and apex are
    # optional and not installed). Without it that test skips and says why.
    MCORE_PIN=0.16.1
    if python3 -c 'import torch' 2>/dev/null &&
        ! python3 -c 'import megatron.core' 2>/dev/null; then
        echo "lrmoe: installing python module megatron-core==$MCORE_PIN" >&2
        for bsp in "" --break-system-packages; do
            python3 -m pip install -q $bsp "megatron-core==$MCORE_PIN" >&2 2>/dev/null && break
        done
        python3 -c 'import megatron.core' 2>/dev/null ||
            echo "lrmoe: megatron-core not installed: tests/python.bats will skip its test" >&2
    fi
fi
exit 0
