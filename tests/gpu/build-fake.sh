#!/bin/sh
# Build lrmoe-exec-fake into DIR: lrmoe-exec whose --backend cuda runs
# kernels/exec_cuda.cu (compiled as plain C++) on tests/gpu/fake-kcu.c, i.e.
# the CUDA backend's host logic on the kernels' CPU references. GPU-free;
# needs only the CUDA headers (for the types kernels/kcu_internal.h names).
#   sh tests/gpu/build-fake.sh DIR
# FAKE_MPI=1: with MPI (mpicc's flags), for --backend cuda under mpirun
# (tests/mpi.bats): the per-rank CUDA path on the fake device.
set -u
cd "$(dirname "$0")/../.." || exit 1
O=${1:?usage: build-fake.sh DIR}
CC=${CC:-cc}
CXX=${CXX:-c++}
NVCC=$(command -v nvcc) || { echo "build-fake: nvcc not found (CUDA headers needed)" >&2; exit 1; }
CINC=$(dirname "$(dirname "$NVCC")")/include
mkdir -p "$O" || exit 1
CF="-std=c11 -O2 -Wall -Wextra -D_GNU_SOURCE -pthread -DLRMOE_HAVE_CUDA -Ilib"
LMPI=
if [ "${FAKE_MPI:-0}" = 1 ]; then
    CF="$CF -DLRMOE_HAVE_MPI $(mpicc --showme:compile)" || exit 1
    LMPI=$(mpicc --showme:link) || exit 1
fi
# two at a time (the machine has two cores)
ls lib/*.c src/lrmoe-exec.c tests/gpu/fake-kcu.c tests/gpu/fake-ggemm.c |
    xargs -P 2 -I{} sh -c "$CC $CF -Ikernels -c -o \"$O/\$(basename {} .c).o\" {}" || exit 1
$CXX -std=c++17 -O2 -Wall -Wextra -x c++ -DLRMOE_HAVE_CUDA -Ilib -Ikernels -I"$CINC" \
    -c -o "$O/exec_cuda.o" kernels/exec_cuda.cu || exit 1
$CC -pthread -o "$O/lrmoe-exec-fake" "$O"/*.o -lzstd -ljansson -lglpk -lopenblas -lm -lpthread \
    -lstdc++ $LMPI || exit 1
# and devio-test (tests/gpu/devio-test.c): the executor's device-pointer
# entry against its host-pointer frames, on the same fake device
$CXX -std=c++17 -O2 -Wall -Wextra -x c++ -D_GNU_SOURCE -Ilib -c -o "$O/devio-test.o.tmp" \
    tests/gpu/devio-test.cu || exit 1
$CC -pthread -o "$O/devio-test" "$O/devio-test.o.tmp" $(ls "$O"/*.o | grep -v '/lrmoe-exec\.o$') \
    -lzstd -ljansson -lglpk -lopenblas -lm -lpthread -lstdc++ $LMPI || exit 1
