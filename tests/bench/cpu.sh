#!/bin/sh
# Benchmark the CPU expert layer (issue 17): lrmoe-exec forward and full
# backward with BF16 GEMMs (--compute bf16: BF16 operands, F32 accumulation;
# lib/gemm_amx.c's AMX kernels where the CPU has AMX-BF16, lib/gemm_dpbf16.c
# where it has AVX512_BF16 without AMX, unless its FMA/dot probe picks the
# AVX-512 emulation (Intel), else oneDNN or the emulation) and
# F32 GEMMs (--compute f32: OpenBLAS sgemm, the exact path)
# against PyTorch's fastest CPU path on the same tensors (tests/bench/
# exec_torch.py in BF16: a per-expert loop and torch._grouped_mm; the faster
# of the two per row counts), at several token counts. On a CPU where oneDNN
# has no BF16 matmul (AVX2 without AVX512_BF16/AMX) lrmoe's bf16 compute is
# emulated (exec.bf16=emulated: lib/gemm_avx2.c on BF16-rounded operands), PyTorch's
# BF16 matmul has no fast kernel either, so PyTorch runs F32 (its best path
# there) and the dense reference is oneDNN's F32 matmul.
# Shape: qwen3-30b-a3b (E=128 K=8 D=2048 F=768), BF16 storage, one rank, one
# thread on both sides, uniform routing. Clock: the CPU time of the computing
# thread on both sides (lrmoe-exec --clock cpu, exec.PHASE.critical_s = the
# whole layer call; PyTorch time.thread_time around the layer / backward), so
# other load on a shared machine does not inflate either; best of REPS rounds.
# A round runs lrmoe-exec (one process per compute and phase) and then
# PyTorch (one process per path) over one frame of each size, so the two
# sides alternate round by round; besides the best of each side, the table
# gives the range of the ratio within single rounds.
# GEMM efficiency = (expert GEMM FLOPs / gemm stage seconds, which include the
# operands' BF16 conversion) / rate of ONE dense oneDNN BF16 matmul of the same
# FLOPs (tests/bench/dense_bf16.c, a fixed-shape primitive, same clock, best of
# 5 runs in one process: more runs can only raise the reference).
# Memory bound per row: one thread's bandwidth on buffers the size of the
# layer's weights and weight gradients (tests/bench/membw.c, pre-faulted, same
# clock: best read of plain / prefetched / multi-stream loads, non-temporal
# write). mem_ms = the bytes the expert GEMMs must move at least (the BF16
# weights read once; in backward also the F32 weight gradients written once;
# activations not counted, so the bound is optimistic) / those rates;
# dense_ms = FLOPs / dense rate; eff_bound = dense_ms / max(dense_ms, mem_ms),
# the best gemm_eff a stage limited by that bandwidth could reach;
# of_bound = gemm_eff / eff_bound = max(dense_ms, mem_ms) / gemm stage time.
# The layer runs once untimed first (--warmup 1): its outputs are faulted in
# by their first writes, as persistent buffers are in a real step (PyTorch's
# figures include its fresh gradient allocations). PyTorch too runs each
# frame's layer once untimed first (exec_torch.py --warmup 1), so that each
# of its timed runs is a warm one (without it the first run of each size
# ran after no layer of that size, and PyTorch's best of two moved by 10-20%
# between runs).
# Process overhead: one-frame lrmoe-exec processes (the default --compute) at
# each size under /usr/bin/time: share of the process' elapsed time outside
# the layer's wall time, and of its CPU time (user+sys) outside the layer's
# (there the layer's own first writes fault its outputs in).
# Register peaks (issue 34): one thread's vdpbf16ps and F32 FMA rates on
# register operands (lrmoe_avx2_peak_rates, AVX512_BF16 CPUs); layer_pk and
# gemm_pk = the layer's and the gemm stage's FLOP rate over the vdpbf16ps peak.
# Targets (issues 17, 34): BF16 >= 1.3x PyTorch's best on every size and phase;
# GEMM efficiency >= 0.85; the gemm stage at 4096 tokens >= 0.85 of the
# vdpbf16ps peak; <= 20% of a one-frame process' elapsed time outside the
# layer.
# Usage: tests/bench/cpu.sh   env TOKENS (default "1024 2048 4096";
#   BENCH_QUICK=1: "256 512"), REPS (default 2), TORCH=0 skips PyTorch.
set -eu
cd "$(dirname "$0")/../.."
if [ "${BENCH_QUICK:-0}" = 1 ]; then dT="256 512"; else dT="1024 2048 4096"; fi
TOKENS=${TOKENS:-$dT}; REPS=${REPS:-2}; TORCH=${TORCH:-1}
for t in gen route exec cat; do
    [ -x bin/lrmoe-$t ] || { echo "cpu.sh: bin/lrmoe-$t missing: run make first" >&2; exit 1; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/lrmoe-bench-cpu.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
raw="--no-compress"
echo "lrmoe-exec CPU bench: qwen3-30b-a3b (E=128 K=8 D=2048 F=768, BF16 storage), tokens {$TOKENS},"
echo "  1 rank, 1 thread, uniform routing, thread CPU clock on both sides, best of $REPS rounds"
echo "  CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')," \
     "BF16 in hardware: $(grep -q amx_bf16 /proc/cpuinfo && echo AMX || { grep -q avx512_bf16 /proc/cpuinfo && echo AVX512_BF16 || echo no; })"
# a kernel switch or an ISA cap in the environment (both sides read it:
# LRMOE_AMX=0 with ONEDNN_MAX_CPU_ISA=DNNL_MAX_CPU_ISA=AVX512_CORE_BF16 runs
# an AMX Xeon as an AVX512_BF16 Xeon without AMX, lrmoe and PyTorch alike)
ov=$(env | grep -E '^(LRMOE_(AMX|BF16_EMULATE|DPBF16|AVX2_GEMM|AVX2_DIRECT)|DNNL_MAX_CPU_ISA|ONEDNN_MAX_CPU_ISA)=' | sort | tr '\n' ' ' | sed 's/ $//')
[ -z "$ov" ] || echo "  set in the environment: $ov"

computes="f32"
if echo 'int main(void){return dnnl_version() == 0;}' |
    cc -include oneapi/dnnl/dnnl.h -x c - -o "$tmp/probe" -ldnnl >/dev/null 2>&1 &&
    cc -O2 -o "$tmp/dense" tests/bench/dense_bf16.c -ldnnl -lgomp; then
    computes="bf16 f32"
else
    echo "  oneDNN (libdnnl-dev) not found: no BF16 path, no dense BF16 reference"
fi

# ---- inputs: one routed frame per size, in one stream
first=$(echo $TOKENS | cut -d' ' -f1)
bin/lrmoe-gen --tokens "$first" --weights "$tmp/w.lrm" --seed 1 $raw > /dev/null
frames=""
for T in $TOKENS; do
    bin/lrmoe-gen --tokens "$T" --seed 1 $raw | bin/lrmoe-route $raw > "$tmp/r$T.lrm"
    frames="$frames $tmp/r$T.lrm"
done
# shellcheck disable=SC2086
bin/lrmoe-cat $raw $frames > "$tmp/in.lrm"
last=$(echo $computes | cut -d' ' -f1)
# BF16 multiplied in hardware (oneDNN has a BF16 matmul here)? Else lrmoe's
# bf16 is emulated (exec.bf16), PyTorch's BF16 matmul has no fast kernel
# either, so PyTorch's best CPU path is F32 and the dense reference is F32.
ddt=bf16
[ -x "$tmp/dense" ] && { "$tmp/dense" 64 64 64 1 1 >/dev/null 2>&1 || ddt=f32; }
[ "$ddt" = bf16 ] || echo "  no BF16 matmul in oneDNN on this CPU: lrmoe's bf16 is emulated (lrmoe's AVX2 kernel on BF16-rounded" \
    "operands); PyTorch and the dense reference run F32"

# ---- REPS rounds, each: lrmoe-exec (each compute, one forward and one
# backward process over the frames), then PyTorch (per-expert loop and
# torch._grouped_mm, one process each over the same frames). The contenders
# alternate round by round, so that a slow stretch of the shared machine
# falls on both sides; every process runs each frame's layer once untimed
# before its timed run (--warmup 1 on both sides).
idx=$(seq 0 $(($(echo $TOKENS | wc -w) - 1)) | tr '\n' ' ')
torch_ok=$TORCH
r=1
while [ "$r" -le "$REPS" ]; do
    for c in $computes; do
        bin/lrmoe-exec --phase forward --compute "$c" -@ 1 --clock cpu --warmup 1 --weights "$tmp/w.lrm" \
            --timings "$tmp/f$c.$r.tsv" $raw -o "$tmp/f$c.lrm" "$tmp/in.lrm"
        bin/lrmoe-exec --phase backward --compute "$c" -@ 1 --clock cpu --warmup 1 --weights "$tmp/w.lrm" \
            --timings "$tmp/b$c.$r.tsv" $raw -o /dev/null "$tmp/f$c.lrm"
    done
    if [ "$torch_ok" = 1 ]; then
        for impl in loop grouped; do
            # shellcheck disable=SC2086
            python3 tests/bench/exec_torch.py --dtype "$ddt" --impl "$impl" --clock cpu --warmup 1 \
                "$tmp/f$last.lrm" "$tmp/w.lrm" 1 $idx > "$tmp/t$impl.$r.tsv" 2> "$tmp/t$impl.err" ||
                { echo "PyTorch $impl failed: $(tail -c 300 "$tmp/t$impl.err")"; : > "$tmp/t$impl.$r.tsv"; torch_ok=0; }
        done
    fi
    r=$((r + 1))
done

# ---- dense oneDNN BF16 matmul of each phase's FLOPs (forward 6*NP*D*F, backward 12*NP*D*F)
: > "$tmp/dense.tsv"
if [ -x "$tmp/dense" ]; then
    for T in $TOKENS; do
        NP=$((T * 8))
        echo "$T fwd $("$tmp/dense" $((3 * NP)) 768 2048 1 5 $ddt)" >> "$tmp/dense.tsv"
        echo "$T bwd $("$tmp/dense" $((6 * NP)) 768 2048 1 5 $ddt)" >> "$tmp/dense.tsv"
    done
fi
# one thread's bandwidth on the layer's weight bytes (BF16) and gradient bytes (F32)
if cc -O2 -o "$tmp/membw" tests/bench/membw.c; then
    "$tmp/membw" $((128 * 3 * 2048 * 768 * 2)) $((128 * 3 * 2048 * 768 * 4)) 3 > "$tmp/membw.tsv"
else
    echo "  tests/bench/membw.c did not compile: no memory bound"
fi

# ---- issue 34 item 3: the CPU's register peaks (lrmoe_avx2_peak_rates: one
# thread's AVX-512 F32 FMA and vdpbf16ps rates, register operands) and, where
# the bf16 compute runs lrmoe's vdpbf16ps kernel (lib/gemm_dpbf16.c), one
# expert GEMM of each form through lrmoe_gemm against oneDNN's matmul
# (LRMOE_DPBF16=0), cold weights (tests/bench/gemm_kernel.c), alternated.
: > "$tmp/peaks"
if cc -O2 -Ilib -o "$tmp/gk" tests/bench/gemm_kernel.c build/liblrmoe.a -ldnnl -lgomp -lopenblas \
        -lm -lpthread -ldl 2>/dev/null; then
    "$tmp/gk" peaks > "$tmp/peaks"
    read -r pf pd < "$tmp/peaks"
    echo "  register peaks, one thread: AVX-512 F32 FMA $pf GFLOP/s, vdpbf16ps $pd GFLOP/s (0: not on this CPU)"
    k0=$("$tmp/gk" nt 16 16 32 1 | cut -d' ' -f3)
    echo "  bf16 kernel: $k0 (lrmoe-exec(1), Kernels)"
    # the kernel against the one it was chosen over: dpbf16 against oneDNN's
    # matmul; the AVX-512 emulation, where the FMA/dot probe picked it on an
    # AVX512_BF16 CPU, against dpbf16 (LRMOE_BF16_EMULATE=0)
    other=
    case $k0 in
    dpbf16) other="LRMOE_DPBF16=0"; oname=oneDNN ;;
    emulated-avx512)
        [ "$(LRMOE_BF16_EMULATE=0 "$tmp/gk" nt 16 16 32 1 | cut -d' ' -f3)" = dpbf16 ] &&
            { other="LRMOE_BF16_EMULATE=0"; oname=dpbf16; } ;;
    esac
    if [ -n "$other" ]; then
        for f in "nt 64 768 2048" "nt 256 768 2048" "nt 256 2048 768" "nn 64 2048 768" \
                 "nn 256 768 2048" "tn 2048 768 64" "tn 2048 768 256"; do
            a=$("$tmp/gk" $f 3 | cut -d' ' -f2); b=$(env $other "$tmp/gk" $f 3 | cut -d' ' -f2)
            a2=$("$tmp/gk" $f 3 | cut -d' ' -f2); b2=$(env $other "$tmp/gk" $f 3 | cut -d' ' -f2)
            echo "  one expert GEMM $f (form M N K): $k0 $a, $a2 GFLOP/s; $oname $b, $b2;" \
                 "$k0/$oname $(echo "$a $a2 $b $b2" | awk '{x = $1 > $2 ? $1 : $2; y = $3 > $4 ? $3 : $4; printf "%.2f", x / y}')" \
                 "(best of each)"
        done
    fi
else
    echo "  tests/bench/gemm_kernel.c did not build (no oneDNN?): no register peaks"
fi

# ---- one-frame processes at the default compute, each size: time outside the layer
mid=$(echo $TOKENS | awk '{print $(int((NF + 1) / 2))}')
for T in $TOKENS; do
    bin/lrmoe-cat $raw "$tmp/r$T.lrm" > "$tmp/one.lrm"
    /usr/bin/time -f "%e %U %S %M" -o "$tmp/ptf$T" bin/lrmoe-exec --phase forward -@ 1 --clock cpu \
        --weights "$tmp/w.lrm" --timings "$tmp/of$T.tsv" $raw -o "$tmp/of.lrm" "$tmp/one.lrm"
    /usr/bin/time -f "%e %U %S %M" -o "$tmp/ptb$T" bin/lrmoe-exec --phase backward -@ 1 --clock cpu \
        --weights "$tmp/w.lrm" --timings "$tmp/ob$T.tsv" $raw -o /dev/null "$tmp/of.lrm"
    [ "$T" = "$mid" ] && cp "$tmp/of.lrm" "$tmp/ofmid.lrm"
done
dflt=$(python3 -c "
import sys; sys.path.insert(0, 'tests/helpers'); from lrmoe_stream import read_stream
print(read_stream('$tmp/ofmid.lrm')[0][1].get('exec.compute', '?'))")

python3 - "$tmp" "$TOKENS" "$REPS" "$computes" "$torch_ok" "$mid" "$dflt" "$ddt" <<'EOF'
import sys
ddt = sys.argv[8].upper()
tmp, toks, reps, computes = sys.argv[1], [int(x) for x in sys.argv[2].split()], int(sys.argv[3]), sys.argv[4].split()
torch_ok, mid, dflt = sys.argv[5] == "1", sys.argv[6], sys.argv[7]
nt = len(toks)

def tsv(p):
    rows = [l.rstrip("\n").split("\t") for l in open(p)]
    return [dict(zip(rows[0], r)) for r in rows[1:]]

def best_exec(c, ph):
    """per size: (best critical_s total, best gemm_s) over the REPS rounds;
    per (size, round): critical_s total"""
    out, rnd = {}, {}
    for k in range(1, reps + 1):
        for r in tsv(f"{tmp}/{ph[0]}{c}.{k}.tsv"):
            T = toks[int(r["frame"]) % nt]
            tot, gm = float(r["total_s"]), float(r["gemm_s"])
            o = out.get(T, (1e30, 1e30))
            out[T] = (min(o[0], tot), min(o[1], gm))
            rnd[(T, k)] = tot
    return out, rnd

ex, exr = {}, {}
for c in computes:
    for ph in ("fwd", "bwd"):
        ex[(c, ph)], exr[(c, ph)] = best_exec(c, ph)
try:
    peak_dot = float(open(f"{tmp}/peaks").read().split()[1])
except (IndexError, ValueError):
    peak_dot = 0.0
th, thr = {}, {}   # best over rounds per (impl, phase, size); per (phase, size, round): best impl
for impl in ("loop", "grouped"):
    for rd in range(1, reps + 1):
        try:
            for line in open(f"{tmp}/t{impl}.{rd}.tsv"):
                fr, tf, tb, rel = line.split()
                T = toks[int(fr) % nt]
                for ph, v in (("fwd", float(tf)), ("bwd", float(tb))):
                    k = (impl, ph, T)
                    th[k] = min(th.get(k, 1e30), v)
                    thr[(ph, T, rd)] = min(thr.get((ph, T, rd), 1e30), v)
        except FileNotFoundError:
            pass
dense = {}
for line in open(f"{tmp}/dense.tsv"):
    T, ph, sec, gf, impl = line.split()
    dense[(int(T), ph)] = (float(gf), impl)
if dense:
    print(f"dense oneDNN {ddt} reference (best of 5):", next(iter(dense.values()))[1],
          " ".join(f"{T}/{ph} {v[0]:.0f}" for (T, ph), v in sorted(dense.items())), "GFLOP/s")
bw = {}
try:
    bw = {r["test"]: float(r["GB_s"]) for r in tsv(f"{tmp}/membw.tsv")}
except (FileNotFoundError, KeyError, ValueError):
    pass
WB, GB = 128 * 3 * 2048 * 768 * 2, 128 * 3 * 2048 * 768 * 4   # weight bytes (BF16), gradient bytes (F32)
if bw:
    print(f"one thread's memory bandwidth (membw.c, {WB / 1e9:.2f} GB read, {GB / 1e9:.2f} GB written): read "
          + ", ".join(f"{k[5:] or 'plain'} {v:.1f}" for k, v in bw.items() if k.startswith("read"))
          + f" GB/s; non-temporal write {bw['ntwrite']:.1f}, plain write {bw['write']:.1f}, "
            f"read+write mix {bw['mix']:.1f} GB/s; bound uses read {bw['best_read']:.1f}, write {bw['ntwrite']:.1f}")
print()
hdr = f"{'tokens':>6s} {'phase':5s} {'bf16_ms':>9s} {'f32_ms':>9s} {'torch_loop':>10s} {'torch_grp':>10s} " \
      f"{'bf16/torch':>10s} {'rounds':>9s} {'f32/torch':>9s} {'bf16_vs_f32':>11s} {'gemm_GF/s':>9s} {'gemm_eff':>8s} " \
      f"{'dense_ms':>8s} {'mem_ms':>7s} {'eff_bound':>9s} {'of_bound':>8s} {'layer_pk':>8s} {'gemm_pk':>7s} " \
      f"{'pk_1.3x':>7s}"
print(hdr)
speed, effs, bounds, ofs, pk4096, need, rounds = [], [], [], [], [], [], []
for T in toks:
    NP = T * 8
    for ph in ("fwd", "bwd"):
        fl = (6 if ph == "fwd" else 12) * NP * 2048 * 768
        b = ex.get(("bf16", ph), {}).get(T)
        f = ex.get(("f32", ph), {}).get(T)
        tl, tg = th.get(("loop", ph, T)), th.get(("grouped", ph, T))
        tbest = min([v for v in (tl, tg) if v is not None], default=None)
        ms = lambda v: f"{v * 1e3:9.1f}" if v is not None else f"{'-':>9s}"
        ms10 = lambda v: f"{v * 1e3:10.1f}" if v is not None else f"{'-':>10s}"
        sb = tbest / b[0] if b and tbest else None
        sf = tbest / f[0] if f and tbest else None
        gfs = fl / b[1] / 1e9 if b else None
        eff = gfs / dense[(T, ph)][0] if b and (T, ph) in dense else None
        if sb is not None: speed.append(sb)
        # the ratio in each round (PyTorch's faster path of that round / lrmoe's run of that round)
        rr = [thr[(ph, T, k)] / exr[("bf16", ph)][(T, k)] for k in range(1, reps + 1)
              if (ph, T, k) in thr and (T, k) in exr.get(("bf16", ph), {})]
        rng = f"{min(rr):.2f}-{max(rr):.2f}" if rr else "-"
        if rr: rounds.append((min(rr), max(rr), T, ph))
        if eff is not None: effs.append(eff)
        x = lambda v, w: f"{v:{w - 1}.2f}x" if v is not None else f"{'-':>{w}s}"
        bnd = ""
        if (T, ph) in dense and bw:
            dense_s = fl / (dense[(T, ph)][0] * 1e9)
            mem_s = WB / (bw["best_read"] * 1e9) + (GB / (bw["ntwrite"] * 1e9) if ph == "bwd" else 0)
            eb = dense_s / max(dense_s, mem_s)
            bounds.append(eb)
            ob = eff / eb if eff is not None else None
            if ob is not None: ofs.append(ob)
            bnd = f" {dense_s * 1e3:8.1f} {mem_s * 1e3:7.1f} {eb:9.2f} " + (f"{ob:8.2f}" if ob is not None else f"{'-':>8s}")
        else:
            bnd = f" {'-':>8s} {'-':>7s} {'-':>9s} {'-':>8s}"
        if peak_dot > 0 and b:
            lp, gp = fl / b[0] / 1e9 / peak_dot, gfs / peak_dot
            bnd += f" {lp:8.2f} {gp:7.2f}"
            if T == 4096: pk4096.append(gp)
            if tbest:  # the layer's fraction of the peak that 1.3x PyTorch's best asks for
                nk = fl * 1.3 / tbest / 1e9 / peak_dot
                bnd += f" {nk:7.2f}"
                need.append((nk, T, ph, lp))
        print(f"{T:6d} {ph:5s} {ms(b[0] if b else None)} {ms(f[0] if f else None)} {ms10(tl)} {ms10(tg)} "
              f"{x(sb, 10)} {rng:>9s} {x(sf, 9)} {x(f[0] / b[0] if b and f else None, 11)} "
              f"{(f'{gfs:9.0f}' if gfs else f'{chr(45):>9s}')} {(f'{eff:8.2f}' if eff is not None else f'{chr(45):>8s}')}"
              + bnd)
print(f"(ms: thread CPU time of the layer call, best of {reps} rounds; x/torch = PyTorch's faster {ddt} path / lrmoe's: > 1 is faster;")
print(" rounds: the lowest and highest bf16/torch of a single round, the contenders run one after the other;")
print(f" gemm_GF/s and gemm_eff: the bf16 path's gemm stage against the dense oneDNN {ddt} matmul;")
print(" dense_ms: the FLOPs at the dense rate, mem_ms: the weight (and gradient) bytes at one thread's bandwidth,")
print(" eff_bound: the gemm_eff that bandwidth allows, of_bound: gemm_eff / eff_bound;")
print(" layer_pk, gemm_pk: the layer's and its gemm stage's FLOP rate over the vdpbf16ps register peak;")
print(" pk_1.3x: the layer_pk that 1.3x PyTorch's best would take: near or above 1, no kernel of this CPU gets there)")
print()

def proc(ph, tim, tsvp):
    e, u, s, rss = open(tim).read().split()[:4]
    r = tsv(tsvp)[0]
    lay_cpu = float(r["total_s"])
    lay_wall = float(next(v for k, v in r.items() if k.startswith("wall")))
    cpu = float(u) + float(s)
    oe, oc = 1 - lay_wall / float(e), 1 - lay_cpu / cpu
    return (f"{ph:8s} elapsed {float(e):6.2f} s (layer wall {lay_wall:5.2f} s, outside {oe:4.0%}); "
            f"cpu {cpu:6.2f} s = user {float(u):.2f} + sys {float(s):.2f} (layer {lay_cpu:5.2f} s, outside "
            f"{oc:4.0%}); max RSS {int(rss) / 1024:.0f} MiB"), oe, oc
print(f"one-frame processes, default compute ({dflt}), outputs and weights first touched in this process:")
oes, ocs = [], []
for T in toks:
    for ph, k in (("forward", "f"), ("backward", "b")):
        line, oe, oc = proc(ph, f"{tmp}/pt{k}{T}", f"{tmp}/o{k}{T}.tsv")
        oes.append(oe); ocs.append(oc)
        print(f"  {T:5d} " + line)
print()
v = []
if speed:
    v.append(f"BF16 vs PyTorch's best ({ddt}) min {min(speed):.2f}x (target >= 1.3x on every size): "
             + ("PASS" if min(speed) >= 1.3 else "BELOW TARGET"))
    if rounds:
        lo = min(rounds)
        v.append(f"round by round {lo[0]:.2f}-{lo[1]:.2f}x at {lo[2]} tokens {lo[3]} (the lowest round), "
                 f"{sum(1 for r in rounds if r[0] >= 1.3)} of {len(rounds)} sizes and phases at 1.3x or more in every round")
    if need and max(need)[0] >= 0.95:
        nk, T, ph, lp = max(need)
        v.append(f"1.3x at {T} tokens {ph} would take the whole layer at {nk:.2f} of the vdpbf16ps "
                 f"register peak (it runs at {lp:.2f})")
else:
    v.append("BF16 vs PyTorch: not measured (" + ("no oneDNN" if "bf16" not in computes else "PyTorch off or failed") + ")")
if effs:
    v.append(f"GEMM efficiency min {min(effs):.2f} (target >= 0.85"
             + (f"; the memory bound allows min {min(bounds):.2f}, kernels at min {min(ofs):.2f} of it" if ofs else "")
             + "): " + ("PASS" if min(effs) >= 0.85 else "BELOW TARGET"))
if pk4096:
    v.append(f"gemm stage at 4096 tokens {min(pk4096):.2f} of the vdpbf16ps peak (target >= 0.85): "
             + ("PASS" if min(pk4096) >= 0.85 else "BELOW TARGET"))
v.append(f"one-frame process outside the layer: elapsed max {max(oes):.0%}, CPU max {max(ocs):.0%} "
         "(target <= 20% of elapsed): " + ("PASS" if max(oes) <= 0.2 else "BELOW TARGET"))
print("verdict: " + "; ".join(v))
EOF
