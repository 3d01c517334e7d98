#!/bin/sh
# Build-time resource check of the CUDA kernels (no GPU needed): compile
# every kernels/*.cu for the device only, with the flags `make` uses
# (NVCCFLAGS, from `make print-nvccflags`) and ptxas's report (-Xptxas -v),
# and join each kernel's registers, shared memory and local memory with its
# row of the launch table (kernels/kcu_launch.h, printed by
# tests/gpu/launch-table.c); tests/gpu/resources.py says what fails.
# Then tests/gpu/divfree.py: no integer division in the PTX of the
# memory-bound kernels (gather, unpack, combine, widen).
#   sh tests/gpu/check-resources.sh [ROOT]
# ROOT (default: this tree) holds the kernels/ and lib/ to check, so a test
# can check a modified copy. Exit 0 all fit, 1 a kernel does not, 2 no
# nvcc or a compile error (the report says which).
set -u
HERE=$(cd "$(dirname "$0")/../.." && pwd)
ROOT=$(cd "${1:-$HERE}" && pwd) || exit 2
NVCC=${NVCC:-$(command -v nvcc)} || { echo "check-resources: nvcc not found" >&2; exit 2; }
FLAGS=${NVCCFLAGS:-$(make -s --no-print-directory -C "$HERE" print-nvccflags)}
case "$FLAGS" in *-arch=*) ;; *) echo "check-resources: no -arch in NVCCFLAGS ($FLAGS)" >&2; exit 2 ;; esac
TMP=$(mktemp -d "${TMPDIR:-/tmp}/lrmoe-res.XXXXXX") || exit 2
trap 'rm -rf "$TMP"' EXIT
${CC:-cc} -std=c11 -Wall -Wextra -Werror -I"$ROOT/kernels" -o "$TMP/launch-table" \
    "$HERE/tests/gpu/launch-table.c" || exit 2
"$TMP/launch-table" > "$TMP/table" || exit 2
for f in "$ROOT"/kernels/*.cu; do
    b=$(basename "$f" .cu)
    # shellcheck disable=SC2086
    mkdir -p "$TMP/keep-$b" || exit 2
    if ! (cd "$ROOT" && "$NVCC" $FLAGS -cubin -Xptxas -v -keep -keep-dir "$TMP/keep-$b" \
            -o "$TMP/$b.cubin" "kernels/$b.cu") \
        > "$TMP/$b.ptxas" 2>&1; then
        grep -v '^ptxas info\|^    [0-9]* bytes stack frame' "$TMP/$b.ptxas" >&2
        echo "check-resources: kernels/$b.cu does not compile" >&2
        exit 2
    fi
done
python3 "$HERE/tests/gpu/resources.py" --table "$TMP/table" --ptxas "$TMP"/*.ptxas \
    --src "$ROOT"/kernels/*.cu
rc=$?
# the memory-bound kernels carry no integer division (the PTX nvcc kept)
python3 "$HERE/tests/gpu/divfree.py" --ptx "$TMP"/keep-*/*.ptx || rc=1
exit $rc
