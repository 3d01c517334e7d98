#!/bin/sh
# Benchmark lrmoe-exec under MPI (one rank per process, lib/exec_mpi.c)
# against the in-process run of the same frames (an llep plan each), forward
# and full backward, P = 2 and 4, over TCP (--mca btl tcp,self):
#   per-stage seconds of the critical rank (mean over frames), in process
#     (-P P, ranks one after another) and under mpirun -np P (ranks at once:
#     on a 2-core machine P=4 shares the cores, which inflates MPI stages);
#   all-to-all bytes (sum over ranks, per frame), the achieved bandwidth of
#     MPI_Alltoallv (bytes a rank sent / its seconds moving them, after the
#     counts exchange that lines the ranks up; mean over ranks) against a
#     memcpy of the same bytes per rank (numpy copy, best of 5);
#   scatter + gather through rank 0 per frame (rank 0's seconds and bytes) and
#     its share of the exec wall time;
#   how that cost scales with P and the frame size (forward at TOKENS/4 too);
#   the same frames with --per-rank inputs (each rank reads and writes its
#     own token rows; only rows whose pair runs elsewhere cross, by
#     all-to-all): exec wall against the scattered run;
#   the end-to-end wall of the whole command (MPI start-up included).
# Usage: tests/bench/mpi.sh [TOKENS [FRAMES]]   BENCH_QUICK=1: 512 tokens
set -eu
cd "$(dirname "$0")/../.."
if [ "${BENCH_QUICK:-0}" = 1 ]; then dT=512; else dT=4096; fi
TOKENS=${1:-$dT}; FRAMES=${2:-3}
E=8; K=2; HID=256; FFN=512; DT=bf16
for t in gen route plan exec; do
    [ -x bin/lrmoe-$t ] || { echo "mpi.sh: bin/lrmoe-$t missing: run make first" >&2; exit 1; }
done
if ! command -v mpirun >/dev/null 2>&1; then
    echo "mpi.sh: skipped: mpirun not installed (openmpi-bin)"; exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="timeout 600 mpirun --mca btl tcp,self --oversubscribe"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/lrmoe-bench-mpi.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
raw="--no-compress"
if $MPIRUN -np 1 bin/lrmoe-exec --phase forward --weights "$tmp/x" "$tmp/x" 2>&1 |
    grep -q "MPI support is not built"; then
    echo "mpi.sh: skipped: lrmoe-exec built without MPI (libopenmpi-dev)"; exit 0
fi

echo "mpi exec: tokens $TOKENS, frames $FRAMES, E $E, K $K, D $HID, F $FFN, $DT, skew hot:50:2, BLAS threads 1, TCP, $(nproc) cores"
bin/lrmoe-gen --tokens "$TOKENS" --experts $E --topk $K --hidden $HID --ffn $FFN --dtype $DT \
    --skew hot:50:2 --steps "$FRAMES" --weights "$tmp/w.lrm" --seed 1 $raw |
    bin/lrmoe-route -k $K $raw -o "$tmp/r.lrm"

now() { python3 -c 'import time; print(time.monotonic())'; }
# run NAME CMD...: time the command (end to end) into $tmp/NAME.wall
run() {
    n=$1; shift
    t0=$(now)
    "$@"
    t1=$(now)
    echo "$t0 $t1" | awk '{printf "%.6f\n", $2 - $1}' > "$tmp/$n.wall"
}
SMALL=$((TOKENS / 4))
bin/lrmoe-gen --tokens "$SMALL" --experts $E --topk $K --hidden $HID --ffn $FFN --dtype $DT \
    --skew hot:50:2 --steps "$FRAMES" --seed 1 $raw |
    bin/lrmoe-route -k $K $raw -o "$tmp/rs.lrm"
shard() { python3 tests/helpers/lrmoe_shard.py "$@"; }
for P in 2 4; do
    # an llep plan: spilled experts run on helpers, so weights and weight
    # gradients cross point to point too
    bin/lrmoe-plan --planner llep --ranks $P --min-chunk 16 $raw "$tmp/r.lrm" > "$tmp/p$P.lrm"
    bin/lrmoe-plan --planner llep --ranks $P --min-chunk 16 $raw "$tmp/rs.lrm" > "$tmp/ps$P.lrm"
    run in$P.f bin/lrmoe-exec --phase forward --weights "$tmp/w.lrm" -@ 1 $raw \
        -o "$tmp/in$P.f.lrm" "$tmp/p$P.lrm"
    run in$P.b bin/lrmoe-exec --phase backward --weights "$tmp/w.lrm" -@ 1 $raw \
        -o "$tmp/in$P.b.lrm" "$tmp/in$P.f.lrm"
    run mpi$P.f $MPIRUN -np $P bin/lrmoe-exec --phase forward --weights "$tmp/w.lrm" -@ 1 $raw \
        -o "$tmp/mpi$P.f.lrm" "$tmp/p$P.lrm"
    run mpi$P.b $MPIRUN -np $P bin/lrmoe-exec --phase backward --weights "$tmp/w.lrm" -@ 1 $raw \
        -o "$tmp/mpi$P.b.lrm" "$tmp/in$P.f.lrm"
    run small$P.f $MPIRUN -np $P bin/lrmoe-exec --phase forward --weights "$tmp/w.lrm" -@ 1 $raw \
        -o "$tmp/small$P.f.lrm" "$tmp/ps$P.lrm"
    shard split "$tmp/p$P.lrm" $P "$tmp/p$P.%r.lrm"
    shard split "$tmp/in$P.f.lrm" $P "$tmp/in$P.f.%r.lrm"
    run pr$P.f $MPIRUN -np $P bin/lrmoe-exec --phase forward --weights "$tmp/w.lrm" -@ 1 $raw \
        --per-rank -o "$tmp/pr$P.f.%r.lrm" "$tmp/p$P.%r.lrm"
    run pr$P.b $MPIRUN -np $P bin/lrmoe-exec --phase backward --weights "$tmp/w.lrm" -@ 1 $raw \
        --per-rank -o "$tmp/pr$P.b.%r.lrm" "$tmp/in$P.f.%r.lrm"
done

python3 - "$tmp" "$TOKENS" "$SMALL" <<'EOF'
import sys, time
import numpy as np
sys.path.insert(0, "tests/helpers")
from lrmoe_stream import read_stream
tmp = sys.argv[1]
STAGES = ["weights", "dispatch", "gemm", "act", "combine", "gradred"]

def lst(a, k):
    return [float(x) for x in a[k].split(",")]

def stats(path, ph):
    fr = read_stream(path)
    crit, wall, a2a, bw, sg, sgb = [], [], [], [], [], []
    for t, a in fr:
        c = int(a["exec.%s.critical_rank" % ph])
        crit.append([lst(a, "exec.%s.%s_s" % (ph, s))[c] for s in STAGES])
        wall.append(float(a["exec.%s.wall_s" % ph]))
        if a.get("exec.launcher") == "mpi":
            b = lst(a, "exec.%s.a2a_bytes" % ph)
            s = lst(a, "exec.%s.a2a_s" % ph)
            a2a.append(sum(b))
            bw.append(np.mean([x / y for x, y in zip(b, s) if y > 0]))
            sg.append(float(a["exec.%s.scatter_s" % ph]) + float(a["exec.%s.gather_s" % ph]))
            sgb.append(float(a["exec.%s.scatter_bytes" % ph]) + float(a["exec.%s.gather_bytes" % ph]))
    r = dict(stage=np.mean(crit, axis=0), wall=np.mean(wall))
    if a2a:
        r.update(a2a=np.mean(a2a), bw=np.mean(bw), sg=np.mean(sg), sgb=np.mean(sgb))
    return r

def memcpy_bw(nbytes):
    n = max(int(nbytes), 1)
    src = np.random.randint(0, 255, n, dtype=np.uint8)
    dst = np.empty_like(src)
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter(); np.copyto(dst, src); best = min(best, time.perf_counter() - t0)
    return n / best

def e2e(n):
    return float(open("%s/%s.wall" % (tmp, n)).read())

print()
print("%-10s %-9s" % ("run", "phase") + "".join("%10s" % (s + "_s") for s in STAGES) +
      "%10s %10s" % ("crit_s", "e2e_s"))
rows = {}
for P in (2, 4):
    for ph, tag in (("forward", "f"), ("backward", "b")):
        for kind in ("in", "mpi"):
            r = stats("%s/%s%d.%s.lrm" % (tmp, kind, P, tag), ph)
            rows[(kind, P, ph)] = r
            name = ("in-proc" if kind == "in" else "mpi") + " P=%d" % P
            print("%-10s %-9s" % (name, ph) + "".join("%10.5f" % x for x in r["stage"]) +
                  "%10.5f %10.3f" % (sum(r["stage"]), e2e("%s%d.%s" % (kind, P, tag))))
print()
print("%-6s %-9s %12s %12s %12s %8s %12s %12s %8s" % (
    "P", "phase", "a2a_B/frame", "mpi_GB/s", "memcpy_GB/s", "ratio", "sg_B/frame",
    "sg_s/frame", "sg/wall"))
ratios, shares = [], []
for P in (2, 4):
    for ph in ("forward", "backward"):
        r = rows[("mpi", P, ph)]
        per_rank = r["a2a"] / P
        m = memcpy_bw(per_rank)
        ratios.append(r["bw"] / m)
        shares.append(r["sg"] / r["wall"])
        print("%-6d %-9s %12.0f %12.3f %12.3f %8.3f %12.0f %12.5f %7.1f%%" % (
            P, ph, r["a2a"], r["bw"] / 1e9, m / 1e9, r["bw"] / m, r["sgb"], r["sg"],
            100 * r["sg"] / r["wall"]))
print()
# scatter + gather against P and frame size (forward)
TOK, SMALL = int(sys.argv[2]), int(sys.argv[3])
print("%-6s %-8s %12s %12s %12s %8s" % ("P", "tokens", "sg_B/frame", "sg_s/frame",
                                        "sg_MB/s", "sg/wall"))
sgs = {}
for P in (2, 4):
    for n, path in ((SMALL, "%s/small%d.f.lrm" % (tmp, P)), (TOK, "%s/mpi%d.f.lrm" % (tmp, P))):
        r = stats(path, "forward")
        sgs[(P, n)] = r
        print("%-6d %-8d %12.0f %12.5f %12.1f %7.1f%%" % (P, n, r["sgb"], r["sg"],
              r["sgb"] / r["sg"] / 1e6, 100 * r["sg"] / r["wall"]))
size_x = [sgs[(P, TOK)]["sg"] / sgs[(P, SMALL)]["sg"] for P in (2, 4)]
bytes_x = [sgs[(P, TOK)]["sgb"] / sgs[(P, SMALL)]["sgb"] for P in (2, 4)]
p_x = [sgs[(4, n)]["sg"] / sgs[(2, n)]["sg"] for n in (SMALL, TOK)]
print()

# per-rank inputs: every rank's own stream (per rank: exchange of rows off
# their owner, and its wall). Every rank's exec ends at the same collective
# but starts when it has read its frame, so a rank that came early also
# waits for the others: the frame's wall is the smallest (the last rank's)
def shard_stats(pattern, P, ph):
    ex, exb, wall = [], [], []
    for r in range(P):
        for i, (t, a) in enumerate(read_stream(pattern.replace("%r", str(r)))):
            x = float(a["exec.%s.scatter_s" % ph]) + float(a["exec.%s.gather_s" % ph])
            b = float(a["exec.%s.scatter_bytes" % ph]) + float(a["exec.%s.gather_bytes" % ph])
            w = float(a["exec.%s.wall_s" % ph])
            if r == 0:
                ex.append(x); exb.append(b); wall.append(w)
            else:
                ex[i] = max(ex[i], x); exb[i] += b; wall[i] = min(wall[i], w)
    return dict(ex=np.mean(ex), exb=np.mean(exb), wall=np.mean(wall))

print("%-6s %-9s %12s %12s %8s %14s %12s %12s" % ("P", "phase", "scat_wall_s", "perrank_s",
      "ratio", "xchg_B/frame", "sg_B/frame", "xchg_s"))
prr = []
for P in (2, 4):
    for ph, tag in (("forward", "f"), ("backward", "b")):
        s_ = rows[("mpi", P, ph)]
        q = shard_stats("%s/pr%d.%s.%%r.lrm" % (tmp, P, tag), P, ph)
        prr.append(q["wall"] / s_["wall"])
        print("%-6d %-9s %12.5f %12.5f %8.3f %14.0f %12.0f %12.5f" % (
            P, ph, s_["wall"], q["wall"], q["wall"] / s_["wall"], q["exb"], s_["sgb"], q["ex"]))
print()
print("verdict: scatter+gather seconds per frame x%.2f-%.2f for x%.2f the bytes (tokens %d -> %d); "
      "x%.2f-%.2f from P=2 to P=4 at the same frame; --per-rank exec wall is %.2f-%.2f of the "
      "scattered run's" % (min(size_x), max(size_x), min(bytes_x), SMALL, TOK, min(p_x), max(p_x),
                           min(prr), max(prr)))
sp = [rows[("in", P, ph)]["wall"] / rows[("mpi", P, ph)]["wall"]
      for P in (2, 4) for ph in ("forward", "backward")]
print("verdict: MPI_Alltoallv over TCP reaches %.3f-%.3f of memcpy bandwidth; "
      "scatter+gather through rank 0 is %.1f-%.1f%% of the exec wall per frame; "
      "in-process/mpi exec wall %.2f-%.2f (P=2,4, forward and backward)" % (
          min(ratios), max(ratios), 100 * min(shares), 100 * max(shares), min(sp), max(sp)))
EOF
