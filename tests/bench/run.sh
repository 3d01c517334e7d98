#!/bin/sh
# make bench: every benchmark in turn. Each prints its parameters, a table
# with units, and a verdict line. BENCH_QUICK=1 shrinks the sizes.
cd "$(dirname "$0")/../.." || exit 1
status=0
for b in stream route plan exec cpu cold_warm cpu_pipe compact fidelity select pressure sim inproc dist mpi; do
    s=tests/bench/$b.sh
    [ -f "$s" ] || continue
    echo "================================================================ $b"
    sh "$s" || { echo "bench $b: failed (exit $?)"; status=1; }
done
exit $status
