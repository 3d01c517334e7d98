#!/bin/sh
# Build a fake liblrmoe-cuda.so.1 into DIR: the CUDA module that
# liblrmoe.so.2 loads (lib/cuda_module.c; point LRMOE_CUDA_MODULE at it),
# made of kernels/exec_cuda.cu compiled as plain C++ on the kernels' CPU
# references (tests/gpu/fake-kcu.c, lib/kref.c; lib/comm.c and lib/swiglu.c,
# which liblrmoe.so.2 does not export, compiled in), as build-fake.sh does for
# lrmoe-exec-fake. "Device memory" is host memory, so device pointers are
# CPU addresses: lrmoe.torch's CUDA path runs on CPU tensors with
# LRMOE_TORCH_FAKE_DEVICE=1 (tests/python/test_torch_cuda.py). GPU-free;
# needs only the CUDA headers and a built build/liblrmoe.so.2 (the module
# resolves liblrmoe's other functions from it, as the real one does
# through kernels/module.c's table).
#   sh tests/gpu/build-fake-module.sh DIR
set -u
cd "$(dirname "$0")/../.." || exit 1
O=${1:?usage: build-fake-module.sh DIR}
CC=${CC:-cc}
CXX=${CXX:-c++}
LIB=${LRMOE_LIBRARY:-build/liblrmoe.so.2}
[ -f "$LIB" ] || { echo "build-fake-module: $LIB not built (make)" >&2; exit 1; }
NVCC=$(command -v nvcc) || { echo "build-fake-module: nvcc not found (CUDA headers needed)" >&2; exit 1; }
CINC=$(dirname "$(dirname "$NVCC")")/include
mkdir -p "$O/obj" || exit 1
CF="-std=c11 -O2 -fPIC -fvisibility=hidden -Wall -Wextra -D_GNU_SOURCE -pthread -DLRMOE_HAVE_CUDA -Ilib -Ikernels"
for f in tests/gpu/fake-kcu.c tests/gpu/fake-ggemm.c tests/gpu/fake-module.c lib/kref.c lib/swiglu.c; do
    $CC $CF -c -o "$O/obj/$(basename "$f" .c).o" "$f" || exit 1
done
# the entry point, visible (the version script keeps only it)
$CC $(echo "$CF" | sed 's/ -fvisibility=hidden//') -c -o "$O/obj/module.o" kernels/module.c || exit 1
# lib/comm.c for lrmoe_comm_cpu_init (the fake's device copies); the two
# functions kernels/module.c forwards to liblrmoe are renamed out of the way
$CC $CF -Dlrmoe_comm_free=fake_unused_comm_free -Dlrmoe_comm_displs=fake_unused_comm_displs \
    -c -o "$O/obj/comm.o" lib/comm.c || exit 1
$CXX -std=c++17 -O2 -fPIC -fvisibility=hidden -Wall -Wextra -x c++ -DLRMOE_HAVE_CUDA -Ilib -Ikernels \
    -I"$CINC" -c -o "$O/obj/exec_cuda.o" kernels/exec_cuda.cu || exit 1
$CC -shared -Wl,-soname,liblrmoe-cuda.so.1 -Wl,--no-undefined \
    -Wl,--version-script=kernels/cuda_module.map -o "$O/liblrmoe-cuda.so.1" "$O"/obj/*.o \
    "$LIB" -lstdc++ -lm -lpthread || exit 1
