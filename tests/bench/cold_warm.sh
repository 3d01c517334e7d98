#!/bin/sh
# Cold vs warm lrmoe-exec on the CPU (issue 34, item 4): what a one-frame
# process pays for its first frame against a later frame of the same process.
# Shape: qwen3-30b-a3b (E=128 K=8 D=2048 F=768, BF16 storage), one rank, one
# thread (-@ 1), uniform routing, the default --compute. For each size and
# phase, REPS times, alternating: a one-frame process (cold) and a two-frame
# process of the same frame twice (warm: its second frame, which reuses the
# first frame's output buffers). Reported, median and min over the REPS:
#   layer CPU: exec.PHASE.critical_s, --clock cpu (the computing thread's
#     user+sys time over the whole layer call, its outputs' first-touch page
#     faults included), cold = the one-frame process' frame, warm = frame 1
#     of the two-frame process; ratio cold/warm (target <= 1.25);
#   process CPU: user+sys of the whole one-frame process (getrusage of the
#     child), and what the second frame adds to it (two-frame process minus
#     one-frame process), so that no cost moves unseen out of the layer;
#   minor page faults of the one-frame process;
#   pooled: the layer CPU of a one-frame process whose outputs come from a
#     pool directory on tmpfs (LRMOE_POOL, lrmoe-exec(1)) that an earlier
#     process filled, and its ratio to warm (target <= 1.25 too).
# The cold cost is the kernel's first touch of the outputs: backward's F32
# weight gradients are 3*E*F*D*4 = 2.4 GB at every token count. How much a
# fresh page costs depends on the machine: on a VM whose balloon reports
# free memory to the host, pages of reported (host-discarded) blocks fault in
# the host as well; the bench prints the THP settings and whether free page
# reporting is on.
# The floor (first_touch.c) is printed under the table, and what mapping the
# weights and checking their digest records costs a process (wmap_check.c:
# one thread against lrmoe-exec's default -@ 0, every CPU it may run on),
# and mapping alone (a layer no frame uses is not checked, not read), and the
# parts lrmoe-plan and lrmoe-route read of a layer whose record is by parts.
# Usage: tests/bench/cold_warm.sh   env TOKENS (default "1024 2048 4096";
#   BENCH_QUICK=1: "512"), REPS (default 3), PHASES (default "forward backward"),
#   LRMOE_THP=1 or 0 (passed on: huge or 4 KiB pages for the big buffers).
set -eu
cd "$(dirname "$0")/../.."
if [ "${BENCH_QUICK:-0}" = 1 ]; then dT="512"; else dT="1024 2048 4096"; fi
TOKENS=${TOKENS:-$dT}; REPS=${REPS:-3}; PHASES=${PHASES:-forward backward}
for t in gen route exec cat; do
    [ -x bin/lrmoe-$t ] || { echo "cold_warm.sh: bin/lrmoe-$t missing: run make first" >&2; exit 1; }
done
[ -x /usr/bin/time ] || { echo "cold_warm.sh: /usr/bin/time missing (Debian: package time)" >&2; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/lrmoe-bench-cold.XXXXXX")
# the output pool (LRMOE_POOL, lrmoe-exec(1)): on tmpfs where there is one
pool=$(mktemp -d /dev/shm/lrmoe-bench-pool.XXXXXX 2>/dev/null || mktemp -d "$tmp/pool.XXXXXX")
trap 'rm -rf "$tmp" "$pool"' EXIT INT TERM
raw="--no-compress"
thp=/sys/kernel/mm/transparent_hugepage
rep=/sys/module/page_reporting/parameters
echo "lrmoe-exec cold vs warm: qwen3-30b-a3b (E=128 K=8 D=2048 F=768, BF16 storage), tokens {$TOKENS},"
echo "  1 rank, 1 thread, default compute, layer clock cpu; $REPS alternating runs of a one-frame (cold)"
echo "  and a two-frame process (warm: its second frame); median (min)"
echo "  LRMOE_THP: ${LRMOE_THP:-unset (the library decides: huge pages unless THP is never or free page reporting is on)}"
echo "  THP enabled: $(cat $thp/enabled 2>/dev/null || echo n/a), defrag: $(cat $thp/defrag 2>/dev/null || echo n/a);" \
     "free page reporting to a hypervisor: $( [ -r $rep/page_reporting_order ] &&
        echo "on, order $(cat $rep/page_reporting_order)" || echo "not seen")"

bin/lrmoe-gen --tokens 16 --weights "$tmp/w.lrm" --seed 1 $raw > /dev/null
for T in $TOKENS; do
    bin/lrmoe-gen --tokens "$T" --seed 1 $raw | bin/lrmoe-route $raw > "$tmp/r1.lrm"
    bin/lrmoe-exec --phase forward -@ 1 --weights "$tmp/w.lrm" $raw -o "$tmp/f1.lrm" "$tmp/r1.lrm"
    for ph in $PHASES; do
        if [ "$ph" = forward ]; then in1=$tmp/r1.lrm; else in1=$tmp/f1.lrm; fi
        bin/lrmoe-cat $raw "$in1" "$in1" > "$tmp/in2.lrm"
        # a process before the pooled ones leaves its outputs' pages in the pool
        LRMOE_POOL=$pool bin/lrmoe-exec --phase "$ph" -@ 1 --weights "$tmp/w.lrm" $raw -o /dev/null "$in1"
        r=0
        while [ "$r" -lt "$REPS" ]; do
            for n in 1 2 p; do
                if [ "$n" = 2 ]; then in=$tmp/in2.lrm; else in=$in1; fi
                if [ "$n" = p ]; then pe="LRMOE_POOL=$pool"; else pe="LRMOE_POOL="; fi
                /usr/bin/time -f "%U %S %R" -o "$tmp/time" env "$pe" bin/lrmoe-exec --phase "$ph" -@ 1 \
                    --clock cpu --weights "$tmp/w.lrm" -S "$tmp/st.tsv" $raw -o /dev/null "$in"
                # T phase frames rep user sys minflt; then each frame's layer CPU (total_s)
                printf '%s %s %s %s %s ' "$T" "$ph" "$n" "$r" "$(cat "$tmp/time")" >> "$tmp/runs"
                awk -F'\t' 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "total_s") c = i; next }
                            { printf " %s", $c } END { print "" }' "$tmp/st.tsv" >> "$tmp/runs"
            done
            r=$((r + 1))
        done
    done
done

# The floor: a fresh process' first touch of the backward's 2.4 GB of weight
# gradients (tests/bench/first_touch.c: the same allocator, prefault and one
# write per expert matrix) against writing them again, REPS times; the
# backward's cold/warm can fall no lower than (warm + first - rewrite) / warm
# while the gradients are fresh F32 memory.
ft="$tmp/first_touch"
LIBS=$(sed -n 's/^Libs.private: //p' build/lrmoe.pc 2>/dev/null || true)
if cc -std=c11 -O2 -D_GNU_SOURCE -Ilib -o "$ft" tests/bench/first_touch.c build/liblrmoe.a \
        $LIBS -lstdc++ 2> "$tmp/ft.err"; then
    for r in $(seq "$REPS"); do "$ft" 128 768 2048 >> "$tmp/floor"; done
else
    echo "cold_warm.sh: first_touch did not build (no floor): $(head -1 "$tmp/ft.err")"
fi

# The weights' digest check when a process maps them (tests/bench/wmap_check.c):
# one thread against the CPUs this process may run on (lrmoe-exec -@ 0)
wc="$tmp/wmap_check"
if cc -std=c11 -O2 -D_GNU_SOURCE -Ilib -o "$wc" tests/bench/wmap_check.c build/liblrmoe.a \
        $LIBS -lstdc++ 2> "$tmp/wc.err"; then
    "$wc" "$tmp/w.lrm" 0 $((2 * REPS + 1)) > "$tmp/wmap"
else
    echo "cold_warm.sh: wmap_check did not build: $(head -1 "$tmp/wc.err")"
fi

python3 - "$tmp/runs" "$TOKENS" "$PHASES" "$tmp/floor" "$tmp/wmap" "$(nproc)" <<'EOF'
import statistics as st, sys
runs = [l.split() for l in open(sys.argv[1])]
toks, phases = sys.argv[2].split(), sys.argv[3].split()
def med(v): return st.median(v)
print()
print(f"{'tokens':>6s} {'phase':8s} {'cold_s':>12s} {'warm_s':>12s} {'cold/warm':>9s}  "
      f"{'proc_cold_s':>12s} {'proc_2nd_s':>12s} {'cold_sys_s':>10s} {'minflt':>8s} "
      f"{'pooled_s':>12s} {'pooled/warm':>11s} {'proc_pooled_s':>13s}")
ratios, pratios = [], []
for T in toks:
    for ph in phases:
        one = [r for r in runs if r[0] == T and r[1] == ph and r[2] == "1"]
        two = [r for r in runs if r[0] == T and r[1] == ph and r[2] == "2"]
        if not one or not two:
            continue
        cold = [float(r[7]) for r in one]
        warm = [float(r[8]) for r in two]
        pc = [float(r[4]) + float(r[5]) for r in one]
        p2 = [float(b[4]) + float(b[5]) - float(a[4]) - float(a[5]) for a, b in zip(one, two)]
        ratio = med(cold) / med(warm)
        ratios.append((T, ph, ratio))
        pool = [float(r[7]) for r in runs if r[0] == T and r[1] == ph and r[2] == "p"]
        ppc = [float(r[4]) + float(r[5]) for r in runs if r[0] == T and r[1] == ph and r[2] == "p"]
        pr = med(pool) / med(warm) if pool else None
        if pr is not None: pratios.append((T, ph, pr))
        print(f"{T:>6s} {ph:8s} {med(cold):6.3f} ({min(cold):.3f}) {med(warm):6.3f} ({min(warm):.3f}) "
              f"{ratio:9.2f}  {med(pc):6.2f} ({min(pc):.2f}) {med(p2):6.2f} ({min(p2):.2f}) "
              f"{med(float(r[5]) for r in one):10.2f} {int(med(int(r[6]) for r in one)):8d} "
              + (f"{med(pool):6.3f} ({min(pool):.3f}) {pr:11.2f}  {med(ppc):6.2f} ({min(ppc):.2f})"
                 if pool else ""))
try:
    fl = [list(map(float, l.split())) for l in open(sys.argv[4]) if l.strip()]
except OSError:
    fl = []
floor = {}
if fl:
    first, again = med(f[0] for f in fl), med(f[1] for f in fl)
    print()
    print(f"floor: first touch of the weight gradients ({fl[0][2] / 1e9:.2f} GB) {first:.3f} s, "
          f"writing them again {again:.3f} s (thread CPU, median of {len(fl)})")
    for T in toks:
        two = [r for r in runs if r[0] == T and r[1] == "backward" and r[2] == "2"]
        if two:
            w = med(float(r[8]) for r in two)
            floor[T] = (w + first - again) / w
            print(f"  {T} tokens backward: lowest cold/warm while the gradients are fresh memory "
                  f"= {floor[T]:.2f}")
try:
    wm = [list(map(float, l.split())) for l in open(sys.argv[5]) if l.strip()]
except OSError:
    wm = []
if wm:
    a, b = med(x[0] for x in wm), med(x[1] for x in wm)
    print()
    print(f"weights map + digest check ({len(wm)} rounds, wall, median (min-max)): one thread "
          f"{a:.3f} s ({min(x[0] for x in wm):.3f}-{max(x[0] for x in wm):.3f}), "
          f"{sys.argv[6]} CPUs (-@ 0) {b:.3f} s ({min(x[1] for x in wm):.3f}-{max(x[1] for x in wm):.3f}); "
          f"ratio {b / a:.2f}")
    if all(len(x) > 2 for x in wm):
        c = med(x[2] for x in wm)
        print(f"weights map alone (the headers: what a layer no frame uses costs a process) {c:.4f} s "
              f"({min(x[2] for x in wm):.4f}-{max(x[2] for x in wm):.4f})")
    if all(len(x) > 4 for x in wm):
        # the layer's record is by parts (a frame of 64 MiB or more)
        h, r = med(x[3] for x in wm), med(x[4] for x in wm)
        ms = lambda k: f"{1e3 * med(x[k] for x in wm):.3f} ms ({1e3 * min(x[k] for x in wm):.3f}-" \
                       f"{1e3 * max(x[k] for x in wm):.3f})"
        print(f"weights map + the parts a tool reads, {sys.argv[6]} CPUs (records by parts): the header "
              f"(lrmoe-plan --weights) {ms(3)}, router_weight and expert_bias (lrmoe-route -w) {ms(4)}; "
              f"against map + the whole layer's check: {h / b:.4f}, {r / b:.4f}")
print()
print("cold_s/warm_s: layer CPU of a one-frame process' frame / of a two-frame process' second frame;")
print("proc_cold_s: user+sys of the one-frame process; proc_2nd_s: what its second frame adds;")
print("pooled_s: layer CPU of a one-frame process with LRMOE_POOL (its outputs on the pages an")
print("earlier process left in the pool directory, tmpfs); proc_pooled_s: that process' user+sys")
if ratios:
    worst = max(ratios, key=lambda x: x[2])
    ok = worst[2] <= 1.25
    print(f"verdict: cold/warm worst {worst[2]:.2f} ({worst[0]} tokens {worst[1]}), target <= 1.25: "
          f"{'met' if ok else 'NOT met'}"
          + (f"; fresh-memory floor there {floor[worst[0]]:.2f}" if worst[1] == "backward" and worst[0] in floor else ""))
if pratios:
    pw = max(pratios, key=lambda x: x[2])
    print(f"verdict with LRMOE_POOL: pooled/warm worst {pw[2]:.2f} ({pw[0]} tokens {pw[1]}), target <= 1.25: "
          f"{'met' if pw[2] <= 1.25 else 'NOT met'}")
EOF
