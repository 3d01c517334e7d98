#!/bin/sh
# Seed corpora for the fuzz harnesses, made by the tools themselves:
#   seeds.sh BIN OUTDIR   -> OUTDIR/stream, OUTDIR/safetensors, OUTDIR/npy, OUTDIR/hf,
#                            OUTDIR/stages
# A stream seed starts with the harness's mode byte (fuzz_stream.c); an hf
# seed is a recipe of 7-byte records (fuzz_hf.c).
set -eu
BIN=$1
OUT=$2
rm -rf "$OUT"
mkdir -p "$OUT/stream" "$OUT/safetensors" "$OUT/npy" "$OUT/hf" "$OUT/stages" "$OUT/tmp"
W="$OUT/tmp"
"$BIN/lrmoe-gen" --tokens 4 --experts 4 --topk 2 --hidden 8 --ffn 8 --steps 2 \
    --no-compress -o "$W/gen.lrm" --weights "$W/w.lrm"
"$BIN/lrmoe-route" --no-compress -o "$W/route.lrm" "$W/gen.lrm"
"$BIN/lrmoe-gen" --tokens 3 --experts 2 --topk 1 --hidden 4 --ffn 4 --dtype f32 \
    --logits-dtype f16 --no-compress -o "$W/f32.lrm"
"$BIN/lrmoe-cat" -l 1 -o "$W/route.zst.lrm" "$W/route.lrm"
printf 'LRMOEEND\000\000\000\000\000\000\000\000' > "$W/empty.lrm"
# the writers' records are CRC-64 (LRMOECRC); the same stream with the XXH64
# records (LRMOEXXH) of earlier writers, which readers still verify
python3 -c "import sys; sys.path.insert(0, sys.argv[1]); import lrmoe_stream as s
s.write_stream(sys.argv[3], s.read_stream(sys.argv[2], True), digests='xxh')" \
    "$(cd "$(dirname "$0")/../helpers" && pwd)" "$W/route.lrm" "$W/xxh.lrm"
# and with the records by parts (LRMOECRT) that writers put before frames of
# 64 MiB or more
"$BIN/lrmoe-cat" --digests tensors --no-compress -o "$W/crt.lrm" "$W/route.lrm"
"$BIN/lrmoe-cat" --digests tensors --no-compress -o "$W/wcrt.lrm" "$W/w.lrm"
i=0
for f in gen route f32 empty w xxh crt wcrt; do
    for mode in 0 1 2 6; do   # raw: by buffer, through zstd, by file, written back as zstd
        i=$((i + 1))
        { printf "\\$(printf %03o $mode)"; cat "$W/$f.lrm"; } > "$OUT/stream/$i-$f-m$mode"
    done
done
for mode in 0 2; do            # zstd streams as they are
    { printf "\\$(printf %03o $mode)"; cat "$W/route.zst.lrm"; } > "$OUT/stream/zst-m$mode"
done
"$BIN/lrmoe-export" -O both -d "$W/x" "$W/route.lrm"
"$BIN/lrmoe-export" -O npy --bf16-as f32 -d "$W/x32" "$W/gen.lrm"
cp "$W"/x/*.safetensors "$OUT/safetensors/"
cp "$W"/x/*.npy "$OUT/npy/"
for f in "$W"/x32/*.npy; do cp "$f" "$OUT/npy/f32-$(basename "$f")"; done
# and by hand, the smallest valid blob: header "{}" padded to 8, no data (so
# the header ends where the input does), alone and as a one-frame stream
printf '\010\000\000\000\000\000\000\000{}      ' > "$OUT/safetensors/empty-header"
printf '{"__metadata__":{"a":"b"}}      ' > "$W/meta.json"
{ printf '\040\000\000\000\000\000\000\000'; cat "$W/meta.json"; } > "$OUT/safetensors/attr-only"
{ printf '\000'; cat "$OUT/safetensors/empty-header"; printf 'LRMOEEND\001\000\000\000\000\000\000\000'; } \
    > "$OUT/stream/empty-header-m0"
rm -rf "$W"
# hf recipes: mode byte, then records "prefix kind index dtype|ndim<<4 d0 d1 d2"
# (fuzz_hf.c's tables): fused E=2 F=2 D=3 with a router, the same with E=0,
# per-expert F16 E=2, HF activations, and F = 2^62 beside a zero dimension
hf() { printf "$2" > "$OUT/hf/$1"; }
hf fused '\000\002\000\000\073\002\004\003\002\001\000\073\002\003\002\002\012\000\053\002\003\000'
hf fused0 '\004\002\000\000\073\000\004\003\002\001\000\073\000\003\002'
hf perexp '\000\001\004\000\051\002\003\000\001\005\000\051\002\003\000\001\006\000\051\003\002\000\001\004\001\051\002\003\000\001\005\001\051\002\003\000\001\006\001\051\003\002\000'
hf act '\001\000\021\000\073\002\003\004\000\023\000\070\002\003\001\000\026\000\072\002\003\001'
hf f62 '\000\002\001\000\073\000\004\364\002\000\000\073\000\005\004'
# stages recipes (fuzz_stages.c): stage T K E P, then 6-byte records; a
# tensor record "\101 spec 0 0 0 0" is spec's natural shape, dtype and range
# (spec: 0 topk_ids, 1 topk_weights, 2 router_logits, 4 hidden F32, 5
# grad_output, 7 phi_sqnorm, 8 saved_gate, 9 saved_up, 10 quota, 11
# bwd_alloc, 13 placement, 15 keep); "\060 3 0" the attribute ffn=4; "\001
# 0 1" plan's ranks=2 in the pipeline. T=8, K=2, E=4, P=2 in each.
st() { printf "$2" > "$OUT/stages/$1"; }
N='\101\000\000\000\000\000'   # topk_ids
st pipeline "\007\010\001\004\001\101\002\000\000\000\000\101\004\000\000\000\000\101\005\000\000\000\000\060\003\000\000\000\000\001\000\001\000\000\000"
st score "\002\010\001\004\001$N\101\001\000\000\000\000\101\005\000\000\000\000\101\007\000\000\000\000\101\012\000\000\000\000"
st pack "\003\010\001\004\001$N\101\001\000\000\000\000\101\005\000\000\000\000\101\004\000\000\000\000\101\010\000\000\000\000\101\011\000\000\000\000\101\013\000\000\000\000\101\015\000\000\000\000\101\017\000\000\000\000"
st forward "\005\010\001\004\001$N\101\001\000\000\000\000\101\004\000\000\000\000"
