#!/bin/sh
# Benchmark a whole training step's pipeline on the CPU (issue 17):
#   lrmoe-gen | lrmoe-route | lrmoe-plan | lrmoe-exec forward | lrmoe-score |
#   lrmoe-pack | lrmoe-exec backward --mode compact
# at qwen3-30b-a3b shape (E=128 K=8 D=2048 F=768, BF16), TOKENS tokens, P=4
# ranks simulated in each exec process, weights a raw file (mapped). Each
# stream setting runs twice: the stages connected by pipes, and by files.
#   settings: default (no -l, no --no-compress: the writer's rule), raw
#   (--no-compress), zstd level 1 (-l 1), level 3 (-l 3)
# Per run: every stage's CPU time (user + sys, /usr/bin/time), the
# pipeline's elapsed time, the two exec layers' wall time (--timings wall_s)
# and the layer share = (forward + backward layer wall) / pipeline elapsed.
# Stream cost: each intermediate stream of the file run is re-encoded at the
# same setting by lrmoe-cat (one decode, one encode: what the edge's writer
# and reader spend), summed over the edges, as a share of the pipeline's CPU.
# Targets (issue 17): at the defaults, layer share >= 0.7 of the pipes run's
# wall, stream I/O + compression <= 15% of its CPU.
# Usage: tests/bench/cpu_pipe.sh   env TOKENS (default 2048; BENCH_QUICK=1: 512)
set -eu
cd "$(dirname "$0")/../.."
if [ "${BENCH_QUICK:-0}" = 1 ]; then dT=512; else dT=2048; fi
T=${TOKENS:-$dT}; P=4
for t in gen route plan exec score pack cat; do
    [ -x bin/lrmoe-$t ] || { echo "cpu_pipe.sh: bin/lrmoe-$t missing: run make first" >&2; exit 1; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/lrmoe-bench-pipe.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
echo "pipeline bench: gen | route | plan --rate 0.7 | exec forward | score | pack | exec backward compact"
echo "  qwen3-30b-a3b (E=128 K=8 D=2048 F=768, BF16), $T tokens, P=$P, -@ 1, weights raw (mapped)"
bin/lrmoe-gen --tokens "$T" --weights "$tmp/w.lrm" --seed 1 --no-compress > /dev/null

tm() { # tm NAME cmd...: run under /usr/bin/time, CPU seconds into $tmp/NAME.t
    n=$1; shift
    /usr/bin/time -f "%U %S" -o "$tmp/$n.t" "$@"
}
stage() { # stage I OPTS: the pipeline's stage I (0..6) with stream options OPTS
    i=$1; shift
    case $i in
    0) tm "$run.0" bin/lrmoe-gen --tokens "$T" --seed 2 "$@" ;;
    1) tm "$run.1" bin/lrmoe-route "$@" ;;
    2) tm "$run.2" bin/lrmoe-plan --ranks "$P" --rate 0.7 "$@" ;;
    3) tm "$run.3" bin/lrmoe-exec --phase forward -@ 1 --weights "$tmp/w.lrm" \
           --timings "$tmp/$run.fwd.tsv" "$@" ;;
    4) tm "$run.4" bin/lrmoe-score "$@" ;;
    5) tm "$run.5" bin/lrmoe-pack "$@" ;;
    6) tm "$run.6" bin/lrmoe-exec --phase backward --mode compact -@ 1 --weights "$tmp/w.lrm" \
           --timings "$tmp/$run.bwd.tsv" "$@" ;;
    esac
}
now() { python3 -c 'import time; print(time.time())'; }

for set in default raw 1 3; do
    case $set in default) o="" ;; raw) o="--no-compress" ;; *) o="--level $set" ;; esac
    # shellcheck disable=SC2086
    {
        run="pipe.$set"
        t0=$(now)
        stage 0 $o | stage 1 $o | stage 2 $o | stage 3 $o | stage 4 $o | stage 5 $o |
            stage 6 $o > /dev/null
        t1=$(now)
        echo "$t0 $t1" > "$tmp/$run.e"
        run="file.$set"
        t0=$(now)
        stage 0 $o -o "$tmp/s0.$set"
        for i in 1 2 3 4 5; do stage $i $o -o "$tmp/s$i.$set" "$tmp/s$((i - 1)).$set"; done
        stage 6 $o -o /dev/null "$tmp/s5.$set"
        t1=$(now)
        echo "$t0 $t1" > "$tmp/$run.e"
        # the edges' cost at what the writer used on each: the default is raw
        # on a pipe and level 1 on a file (lib/stream.c)
        for via in pipe file; do
            e=$o
            [ "$set" = default ] && { [ $via = pipe ] && e="--no-compress" || e="--level 1"; }
            : > "$tmp/cat.$via.$set"
            for i in 0 1 2 3 4 5; do
                bin/lrmoe-cat $e -o "$tmp/e.lrm" "$tmp/s$i.$set"
                tm "cat$i.$set" bin/lrmoe-cat $e -o /dev/null "$tmp/e.lrm"
                echo "$(stat -c %s "$tmp/e.lrm") $(cat "$tmp/cat$i.$set.t")" >> "$tmp/cat.$via.$set"
            done
        done
        rm -f "$tmp"/s[0-5]."$set" "$tmp/e.lrm"
    }
done

python3 - "$tmp" <<'EOF'
import sys
tmp = sys.argv[1]
names = ["gen", "route", "plan", "exec_fwd", "score", "pack", "exec_bwd"]

def cpu(p):
    u, s = open(p).read().split()[:2]
    return float(u) + float(s)

def wall(p):
    rows = [l.rstrip("\n").split("\t") for l in open(p)]
    col = next(i for i, h in enumerate(rows[0]) if h.startswith("wall"))
    return max(float(r[col]) for r in rows[1:])

res = {}
print("%-8s %-5s %8s %8s %8s %7s | %s" % ("setting", "via", "elapsed", "cpu_s", "layer_s", "layer%",
                                          " ".join("%8s" % n for n in names)))
for st in ("default", "raw", "1", "3"):
    for via in ("pipe", "file"):
        run = f"{via}.{st}"
        t0, t1 = map(float, open(f"{tmp}/{run}.e").read().split())
        c = [cpu(f"{tmp}/{run}.{i}.t") for i in range(7)]
        lw = wall(f"{tmp}/{run}.fwd.tsv") + wall(f"{tmp}/{run}.bwd.tsv")
        res[run] = (t1 - t0, sum(c), lw)
        print("%-8s %-5s %8.2f %8.2f %8.2f %6.0f%% | %s" % (st, via, t1 - t0, sum(c), lw,
              100 * lw / (t1 - t0), " ".join("%8.2f" % x for x in c)))
print("(cpu_s: user + sys of all stages; layer_s: the two exec layer calls' wall time)")
print()
print("%-8s %-5s %12s %12s %10s" % ("setting", "via", "stream_MB", "stream_cpu", "of_cpu"))
share = {}
for st in ("default", "raw", "1", "3"):
    for via in ("pipe", "file"):
        rows = [l.split() for l in open(f"{tmp}/cat.{via}.{st}")]
        mb = sum(int(r[0]) for r in rows) / 1e6
        sc = sum(float(r[1]) + float(r[2]) for r in rows)
        share[(st, via)] = sc / res[f"{via}.{st}"][1]
        print("%-8s %-5s %12.1f %12.2f %9.1f%%" % (st, via, mb, sc, 100 * share[(st, via)]))
print("(stream_MB: the six intermediate streams' bytes as the writer made them on that medium; "
      "stream_cpu: lrmoe-cat re-encoding each alike, one decode + one encode per edge; "
      "of_cpu: share of that run's pipeline CPU)")
e, c, lw = res["pipe.default"]
print()
print("verdict: pipeline layer share at the defaults %.2f (target >= 0.7): %s; "
      "stream I/O + compression %.1f%% of the pipeline CPU at the defaults (target <= 15%%): %s"
      % (lw / e, "PASS" if lw / e >= 0.7 else "BELOW TARGET", 100 * share[("default", "pipe")],
         "PASS" if share[("default", "pipe")] <= 0.15 else "ABOVE TARGET"))
EOF
