#!/usr/bin/env bats
# lrmoe-import --map (lib/import_hf.c) against real Hugging Face tensors:
# tiny random-init transformers models of every MoE family, saved by
# save_pretrained (per-expert names), by safetensors from state_dict()
# (fused gate_up_proj / down_proj) and as one experts module, and the
# inputs of a layer's experts module as HF holds them (hidden [B,S,D],
# int64 topk_ids, bf16 topk_weights). tests/helpers/hf_models.py makes
# them and checks the imported weights bit for bit and lrmoe-exec's
# forward against the HF experts module.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

FAMILIES="qwen3_moe qwen2_moe olmoe deepseek_v3 glm4_moe mixtral"

setup_file() {
    H="$BATS_TEST_DIRNAME/helpers"
    export HF="$BATS_FILE_TMPDIR/hf"
    if python3 -c 'import torch, transformers, safetensors' 2>/dev/null; then
        python3 "$H/hf_models.py" make float32 "$HF/f32" $FAMILIES gpt_oss >/dev/null 2>&1 &&
            python3 "$H/hf_models.py" make bfloat16 "$HF/bf16" qwen3_moe mixtral deepseek_v3 \
                >/dev/null 2>&1 || echo "hf_models.py make failed" > "$HF.fail"
    else
        mkdir -p "$(dirname "$HF")"
        echo "Python packages torch and transformers missing (tests/deps.sh test installs them)" > "$HF.fail"
    fi
}

setup() {
    BIN="$BATS_TEST_DIRNAME/../bin"
    H="$BATS_TEST_DIRNAME/helpers"
    export PYTHONPATH="$H"
    T="$BATS_TEST_TMPDIR"
    CHECK="python3 -W ignore $H/hf_models.py check"
    [ ! -e "$HF.fail" ] || skip "$(cat "$HF.fail")"
}

# One line "lrmoe-import: what: why" on stderr, exit 1, containing $1.
assert_import_error() {
    assert_failure 1
    assert_equal "${#lines[@]}" 1
    assert_line --regexp '^lrmoe-import: .+: .+'
    assert_output --partial "$1"
}

@test "save_pretrained checkpoints (experts.N.gate_proj / w1 names): one weights frame per layer, bit-equal" {
    specs=()
    for f in $FAMILIES; do
        run "$BIN/lrmoe-import" -o "$T/$f.lrm" "$HF/f32/$f/pretrained/model.safetensors"
        assert_success
        run "$BIN/lrmoe-view" "$T/$f.lrm"
        assert_output --regexp "hf.layout=(per-expert|mixtral)"
        specs+=("$HF/f32/$f:$T/$f.lrm")
    done
    run $CHECK "${specs[@]}"
    assert_success
    assert_equal "$(grep -c '2 layers bit-equal' <<< "$output")" 6
    # DeepSeek-V3's and GLM4-MoE's selection bias arrives as expert_bias
    assert_equal "$(grep -c 'router_weight, expert_bias' <<< "$output")" 2
    # Mixtral's layout by its names
    run "$BIN/lrmoe-view" "$T/mixtral.lrm"
    assert_line "  hf.prefix=model.layers.0.block_sparse_moe"
    assert_line "  hf.layout=mixtral"
}

@test "state_dict() of transformers 5 modules (fused gate_up_proj [E,2F,D], down_proj [E,D,F]): bit-equal" {
    specs=()
    for f in $FAMILIES; do
        run "$BIN/lrmoe-import" -o "$T/$f.lrm" "$HF/f32/$f/state.safetensors"
        assert_success
        specs+=("$HF/f32/$f:$T/$f.lrm")
        run "$BIN/lrmoe-view" "$T/$f.lrm"
        assert_line "  layer=1"
        assert_line "  hf.prefix=model.layers.1.mlp"
        assert_line "  hf.layout=fused"
        # attention, norms, embeddings and shared experts are left out, and counted
        assert_output --regexp "hf.left_out=[1-9][0-9]*"
    done
    run $CHECK "${specs[@]}"
    assert_success
    assert_equal "$(grep -c '2 layers bit-equal' <<< "$output")" 6
}

@test "an experts module's own state_dict (bare gate_up_proj, down_proj) with --attr layer" {
    run "$BIN/lrmoe-import" --attr layer=1 -o "$T/w1.lrm" "$HF/f32/qwen3_moe/experts1.safetensors"
    assert_success
    run "$BIN/lrmoe-view" "$T/w1.lrm"
    assert_line "  layer=1"
    assert_line "  hf.layout=fused"
    assert_line "  hf.left_out=0"
    assert_line --regexp '^  w_gate +F32 +\[8,16,32\]'
    assert_line --regexp '^  w_down +F32 +\[8,32,16\]'
    # one block of a shard, its router renamed by hand as before --map existed
    python3 - "$HF/f32/qwen3_moe/state.safetensors" "$T/l1.safetensors" <<'PY'
import sys
from safetensors.torch import load_file, save_file
t = load_file(sys.argv[1])
save_file({k[len("model.layers.1."):]: v for k, v in t.items() if k.startswith("model.layers.1.mlp.")},
          sys.argv[2])
PY
    run "$BIN/lrmoe-import" --name mlp.gate.weight=router_weight --attr layer=1 -o "$T/l1.lrm" "$T/l1.safetensors"
    assert_success
    run "$BIN/lrmoe-view" "$T/l1.lrm"
    assert_line "  layer=1"
    assert_line "  hf.prefix=mlp"
    assert_line "  hf.layout=fused"
    assert_line "  hf.left_out=0"
    assert_line --regexp '^  router_weight +F32 +\[8,32\]'
}

@test "HF-shaped inputs + imported weights: lrmoe-exec forward equals the HF experts module (F32)" {
    specs=()
    for f in $FAMILIES; do
        "$BIN/lrmoe-import" -o "$T/w$f.lrm" "$HF/f32/$f/state.safetensors"
        run "$BIN/lrmoe-import" -o "$T/a.lrm" "$HF/f32/$f/act1.safetensors"
        assert_success
        run "$BIN/lrmoe-exec" --phase forward --weights "$T/w$f.lrm" -o "$T/o$f.lrm" "$T/a.lrm"
        assert_success
        specs+=("$HF/f32/$f:$T/w$f.lrm:$T/o$f.lrm")
    done
    run $CHECK "${specs[@]}"
    assert_success
    assert_equal "$(grep -c 'atol 1e-05 + rtol 0.0001 |HF|, F32' <<< "$output")" 6
    run "$BIN/lrmoe-view" "$T/a.lrm"
    assert_output --partial "batch_shape=[2,5]"
    assert_line --regexp '^  hidden +F32 +\[10,32\]'
    assert_line --regexp '^  topk_ids +I32 +\[10,2\]'
    assert_line --regexp '^  topk_weights +F32 +\[10,2\]'
}

@test "bfloat16 models: weights bit-equal, forward within 2x HF's own bf16 error" {
    specs=()
    for f in qwen3_moe mixtral deepseek_v3; do
        "$BIN/lrmoe-import" -o "$T/w$f.lrm" "$HF/bf16/$f/pretrained/model.safetensors"
        "$BIN/lrmoe-import" -o "$T/a.lrm" "$HF/bf16/$f/act1.safetensors"
        "$BIN/lrmoe-exec" --phase forward --weights "$T/w$f.lrm" -o "$T/o$f.lrm" "$T/a.lrm"
        specs+=("$HF/bf16/$f:$T/w$f.lrm:$T/o$f.lrm")
    done
    run $CHECK "${specs[@]}"
    assert_success
    assert_equal "$(grep -c "HF's own BF16" <<< "$output")" 3
    run "$BIN/lrmoe-view" "$T/wmixtral.lrm"
    assert_line --regexp '^  w_up +BF16 +\[8,16,32\]'
}

@test "lrmoe-import -: safetensors.torch.save() blobs of HF tensors map the same way" {
    python3 - "$HF/f32/olmoe/act1.safetensors" > "$T/blobs" <<'PY'
import sys
from safetensors.torch import load_file, save
t = load_file(sys.argv[1])
for step in range(3):
    sys.stdout.buffer.write(save(t, metadata={"layer": "1", "step": str(step)}))
PY
    "$BIN/lrmoe-import" -o "$T/w.lrm" "$HF/f32/olmoe/state.safetensors"
    run "$BIN/lrmoe-import" -o "$T/a.lrm" - < "$T/blobs"
    assert_success
    "$BIN/lrmoe-exec" --phase forward --weights "$T/w.lrm" -o "$T/o.lrm" "$T/a.lrm"
    run $CHECK "$HF/f32/olmoe:$T/w.lrm:$T/o.lrm"
    assert_success
    assert_equal "$(grep -c '^output:' <<< "$output")" 3
}

@test "--map hf renames HF activation names; --map none imports as is" {
    python3 - "$T/hf.safetensors" <<'PY'
import sys, torch
from safetensors.torch import save_file
torch.manual_seed(0)
save_file({"hidden_states": torch.randn(2, 3, 4), "top_k_index": torch.randint(0, 8, (6, 2)),
           "top_k_weights": torch.rand(6, 2).half(), "router_logits": torch.randn(2, 3, 8)},
          sys.argv[1])
PY
    run "$BIN/lrmoe-import" --map hf -o "$T/x.lrm" "$T/hf.safetensors"
    assert_success
    run "$BIN/lrmoe-view" "$T/x.lrm"
    assert_output --partial "batch_shape=[2,3]"
    assert_line --regexp '^  hidden +F32 +\[6,4\]'
    assert_line --regexp '^  router_logits +F32 +\[6,8\]'
    assert_line --regexp '^  topk_ids +I32 +\[6,2\]'
    assert_line --regexp '^  topk_weights +F32 +\[6,2\]'
    # auto leaves HF activation names alone; none leaves everything alone
    "$BIN/lrmoe-import" -o "$T/y.lrm" "$T/hf.safetensors"
    run "$BIN/lrmoe-view" "$T/y.lrm"
    assert_line --regexp '^  hidden_states +F32 +\[2,3,4\]'
    assert_line --regexp '^  router_logits +F32 +\[6,8\]'
    "$BIN/lrmoe-import" --map none --attr layer=1 -o "$T/z.lrm" "$HF/f32/qwen3_moe/state.safetensors"
    run "$BIN/lrmoe-view" "$T/z.lrm"
    assert_output --partial "model.layers.0.mlp.experts.gate_up_proj"
    "$BIN/lrmoe-import" -o "$T/a.lrm" "$HF/f32/qwen3_moe/act1.safetensors"
    run "$BIN/lrmoe-exec" --phase forward --weights "$T/z.lrm" -o /dev/null "$T/a.lrm"
    assert_failure 1
    assert_output --partial "missing tensor w_down"
    run "$BIN/lrmoe-import" --map bogus "$T/hf.safetensors"
    assert_failure 2
    assert_output --partial "--map: 'bogus' is not auto, hf or none"
}

@test "bad HF-shaped inputs: one error naming the tensor, exit 1" {
    python3 - "$T" <<'PY'
import sys, torch
from safetensors.torch import save_file
d = sys.argv[1]
T, K, E, D = 6, 2, 8, 4
h = torch.randn(2, 3, D)
ok_ids = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7], [0, 2], [1, 2]])
def bad(name, **t):
    save_file(t, "%s/%s.safetensors" % (d, name))
bad("range", hidden=h, router_logits=torch.randn(T, E), topk_ids=ok_ids + (ok_ids == 7).long(),
    topk_weights=torch.rand(T, K).bfloat16())
ids = ok_ids.clone(); ids[4, 1] = 2 ** 31
bad("i32", hidden=h, topk_ids=ids)
ids = ok_ids.clone(); ids[2, 1] = -1
bad("neg", hidden=h, topk_ids=ids)
bad("float_ids", hidden=h, topk_ids=ok_ids.float())
bad("int_weights", hidden=h, topk_ids=ok_ids, topk_weights=torch.ones(T, K, dtype=torch.int32))
bad("rows", hidden=h, router_logits=torch.randn(7, E))
bad("batch", hidden=h, grad_output=torch.randn(3, 2, D))
bad("nodown", **{"mlp.experts.gate_up_proj": torch.randn(E, 6, D)})
bad("fused", **{"mlp.experts.gate_up_proj": torch.randn(E, 6, D),
                "mlp.experts.down_proj": torch.randn(E, D, 4)})
m = {}
for e in range(4):
    for p, s in (("gate_proj", (3, D)), ("up_proj", (3, D)), ("down_proj", (D, 3))):
        if (e, p) != (2, "up_proj"):
            m["model.layers.0.mlp.experts.%d.%s.weight" % (e, p)] = torch.randn(*s)
bad("missing", **m)
bad("mixed", **{"mlp.experts.0.w1.weight": torch.randn(3, D), "mlp.experts.0.w3.weight": torch.randn(3, D),
                "mlp.experts.0.w2.weight": torch.randn(D, 3), "mlp.experts.gate_up_proj": torch.randn(1, 6, D),
                "mlp.experts.down_proj": torch.randn(1, D, 3)})
bad("both", **{"w_gate": torch.randn(1, 3, D), "mlp.experts.gate_up_proj": torch.randn(1, 6, D),
               "mlp.experts.down_proj": torch.randn(1, D, 3)})
bad("router", **{"mlp.experts.gate_up_proj": torch.randn(2, 6, D), "mlp.experts.down_proj": torch.randn(2, D, 3),
                 "mlp.gate.weight": torch.randn(3, D)})
PY
    while IFS='|' read -r name msg; do
        run "$BIN/lrmoe-import" -o "$T/x.lrm" "$T/$name.safetensors"
        assert_import_error "$msg"
    done <<'EOF'
range|topk_ids: id 8 (token 3, choice 1) is out of [0,8): the frame has 8 experts
i32|topk_ids: id 2147483648 (token 4, choice 1) does not fit I32
neg|topk_ids: id -1 (token 2, choice 1) is negative
float_ids|topk_ids is F32: expert ids must be integers
int_weights|topk_weights is I32
rows|router_logits has 7 rows, but hidden [2,3,...] holds 6 tokens
batch|hidden [2,3,...] and grad_output [3,2,...] disagree on the batch shape
nodown|mlp.experts: gate_up_proj without down_proj
fused|tensor mlp.experts.gate_up_proj: shape [8,6,4], expected [8,8,4]
missing|model.layers.0.mlp.experts.2.up_proj.weight missing (experts 0-3 are named)
mixed|mixtral and fused expert weights mixed under mlp.experts
both|the frame holds w_gate and HF expert weights
router|tensor mlp.gate.weight: shape [3,4], expected [2,4]
EOF
}

@test "gpt-oss experts (biases, interleaved gate/up, clamped SwiGLU) are refused" {
    run "$BIN/lrmoe-import" -o "$T/x.lrm" "$HF/f32/gpt_oss/state.safetensors"
    assert_import_error "experts with biases (gpt-oss: interleaved gate/up, clamped SwiGLU) have no lrmoe SwiGLU layout"
}

@test "no leaks on the mapping paths, good or bad (valgrind)" {
    command -v valgrind >/dev/null 2>&1 || skip "valgrind not installed (tests/deps.sh installs it)"
    [ -z "${SANITIZE:-}" ] || skip "valgrind cannot run the ASan build: the sanitized pass checks leaks with LeakSanitizer"
    VG="valgrind -q --leak-check=full --show-leak-kinds=definite,indirect,possible --errors-for-leak-kinds=definite,indirect,possible --error-exitcode=9"
    python3 - "$T" <<'PY'
import sys, torch
from safetensors.torch import save_file
d, D = sys.argv[1], 4
save_file({"hidden": torch.randn(2, 3, D), "router_logits": torch.randn(6, 8),
           "topk_ids": torch.full((6, 2), 9)}, d + "/range.safetensors")
save_file({"model.layers.0.mlp.experts.0.gate_proj.weight": torch.randn(3, D),
           "model.layers.0.mlp.experts.1.gate_proj.weight": torch.randn(3, D)}, d + "/missing.safetensors")
save_file({"mlp.experts.gate_up_proj": torch.randn(2, 6, D), "mlp.experts.down_proj": torch.randn(2, D, 3),
           "mlp.gate.weight": torch.randn(3, D)}, d + "/router.safetensors")
PY
    for f in "$HF/f32/deepseek_v3/state.safetensors" "$HF/f32/mixtral/pretrained/model.safetensors" \
             "$HF/f32/qwen3_moe/act1.safetensors"; do
        run $VG "$BIN/lrmoe-import" -o /dev/null "$f"
        assert_success
    done
    for f in range missing router; do
        run $VG "$BIN/lrmoe-import" -o /dev/null "$T/$f.safetensors"
        assert_failure 1
    done
    run $VG "$BIN/lrmoe-import" -o /dev/null "$HF/f32/gpt_oss/state.safetensors"
    assert_failure 1
}

# A safetensors file written by hand (no torch needed): st.py OUT NAME=DTYPE:SHAPE[:FILL] ...
# FILL is a Python expression of i (the element index) giving the element's value.
mkst() {
    python3 - "$@" <<'PY'
import json, struct, sys
out, specs = sys.argv[1], sys.argv[2:]
fmt = {"F32": "<f", "F64": "<d", "F16": "<e", "I8": "<b", "U64": "<Q", "I64": "<q", "BF16": "<H"}
hdr, blobs, off = {}, [], 0
for s in specs:
    name, rest = s.split("=", 1)
    parts = rest.split(":")
    dt, shape = parts[0], json.loads(parts[1])
    n = 1
    for d in shape: n *= d
    fill = parts[2] if len(parts) > 2 else "i % 7 - 3"
    b = b"".join(struct.pack(fmt[dt], eval(fill, {"i": i})) for i in range(n))
    hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
open(out, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
}

@test "HF mapping is linear: sparse expert indices allocate nothing, 65536 blocks in seconds" {
    # 100 blocks, each naming one expert at index 2^20-1 (before: 3.3 GB, 20 s)
    python3 - "$T/sparse.safetensors" <<'PY'
import json, struct, sys
hdr = {"model.layers.%d.mlp.experts.1048575.down_proj.weight" % l:
       {"dtype": "F32", "shape": [0, 4], "data_offsets": [0, 0]} for l in range(100)}
h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h)
PY
    run /usr/bin/time -f "maxrss_kb %M" "$BIN/lrmoe-import" -o "$T/x.lrm" "$T/sparse.safetensors"
    assert_failure 1
    assert_line --partial "model.layers.0.mlp.experts.0.gate_proj.weight missing (experts 0-1048575 are named)"
    kb=$(sed -n 's/^maxrss_kb //p' <<< "$output")
    echo "max RSS $kb KiB"
    [ "$kb" -lt 65536 ]
    # 65536 blocks of empty fused experts (131072 tensors, the frame's limit):
    # one frame each, in layer order (before: group lookups scanned every
    # block, minutes)
    python3 - "$T/many.safetensors" <<'PY'
import json, struct, sys
hdr = {}
for l in reversed(range(65536)):
    p = "model.layers.%d.mlp.experts." % l
    hdr[p + "gate_up_proj"] = {"dtype": "BF16", "shape": [0, 2, 4], "data_offsets": [0, 0]}
    hdr[p + "down_proj"] = {"dtype": "BF16", "shape": [0, 4, 1], "data_offsets": [0, 0]}
h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h)
PY
    t0=$(date +%s.%N)
    run "$BIN/lrmoe-import" --no-compress -o "$T/many.lrm" "$T/many.safetensors"
    t1=$(date +%s.%N)
    assert_success
    s=$(echo "$t1 - $t0" | bc -l)
    echo "65536 blocks: $s s"
    [ "$(echo "$s < 20" | bc -l)" = 1 ]
    # the trailer counts 65536 frames
    assert_equal "$(tail -c 8 "$T/many.lrm" | od -An -tu8 | tr -d ' ')" 65536
    run "$BIN/lrmoe-view" --frame 65535 --no-stats "$T/many.lrm"
    assert_output --partial "layer=65535"
}

@test "HF mapping with zero-size expert weights (no NULL memcpy) and F = 2^62 (no 2F overflow)" {
    mkst "$T/z1.safetensors" "mlp.experts.gate_up_proj=F32:[0,6,4]" "mlp.experts.down_proj=F32:[0,4,3]"
    run "$BIN/lrmoe-import" -o "$T/z1.lrm" "$T/z1.safetensors"
    assert_success
    run "$BIN/lrmoe-view" --no-stats "$T/z1.lrm"
    assert_line --regexp '^  w_gate +F32 +\[0,3,4\]'
    assert_line --regexp '^  w_down +F32 +\[0,4,3\]'
    mkst "$T/z2.safetensors" "mlp.experts.gate_up_proj=F32:[2,0,4]" "mlp.experts.down_proj=F32:[2,4,0]" \
        "mlp.gate.weight=F32:[2,4]"
    run "$BIN/lrmoe-import" -o "$T/z2.lrm" "$T/z2.safetensors"
    assert_success
    run "$BIN/lrmoe-view" --no-stats "$T/z2.lrm"
    assert_line --regexp '^  w_up +F32 +\[2,0,4\]'
    assert_line --regexp '^  router_weight +F32 +\[2,4\]'
    mkst "$T/z3.safetensors" "mlp.experts.0.gate_proj.weight=F32:[0,4]" \
        "mlp.experts.0.up_proj.weight=F32:[0,4]" "mlp.experts.0.down_proj.weight=F32:[4,0]"
    run "$BIN/lrmoe-import" -o "$T/z3.lrm" "$T/z3.safetensors"
    assert_success
    run "$BIN/lrmoe-view" --no-stats "$T/z3.lrm"
    assert_line --regexp '^  w_gate +F32 +\[1,0,4\]'
    # F = 2^62: 2F wrapped to -2^63, which the shape check took for "any size"
    mkst "$T/big.safetensors" "mlp.experts.gate_up_proj=F32:[0,5,4]" \
        "mlp.experts.down_proj=F32:[0,4,4611686018427387904]"
    run "$BIN/lrmoe-import" -o "$T/x.lrm" "$T/big.safetensors"
    assert_import_error "mlp.experts.down_proj: F = 4611686018427387904 is too large"
}

@test "HF expert weights: F16 and F64 become F32; integer routers, U64 ids, huge layer numbers, long prefixes" {
    D=4 F=3 E=2
    for dt in F16 F64; do
        mkst "$T/w$dt.safetensors" "model.layers.0.mlp.experts.gate_up_proj=$dt:[$E,$((2*F)),$D]:(i % 5 - 2) / 4" \
            "model.layers.0.mlp.experts.down_proj=$dt:[$E,$D,$F]:(i % 3 - 1) / 8" \
            "model.layers.0.mlp.gate.weight=$dt:[$E,$D]"
        run "$BIN/lrmoe-import" -o "$T/w$dt.lrm" "$T/w$dt.safetensors"
        assert_success
        run "$BIN/lrmoe-view" --no-stats "$T/w$dt.lrm"
        assert_line --regexp '^  w_gate +F32 +\[2,3,4\]'
        assert_line --regexp '^  w_down +F32 +\[2,4,3\]'
        # the values, exactly (all of them representable in F16)
        run "$BIN/lrmoe-export" -O npy -d "$T/x$dt" "$T/w$dt.lrm"
        assert_success
        python3 - "$T/x$dt" <<'PY'
import glob, sys, numpy as np
d = sys.argv[1]
g = np.load(glob.glob(d + "/*.w_gate.npy")[0]); u = np.load(glob.glob(d + "/*.w_up.npy")[0])
dn = np.load(glob.glob(d + "/*.w_down.npy")[0])
gu = ((np.arange(2 * 6 * 4) % 5 - 2) / 4).reshape(2, 6, 4)
assert g.dtype == np.float32 and (g == gu[:, :3]).all() and (u == gu[:, 3:]).all(), (g, u)
assert (dn == ((np.arange(2 * 4 * 3) % 3 - 1) / 8).reshape(2, 4, 3)).all()
PY
        # and lrmoe-exec computes with them (it refused F16 and F64)
        "$BIN/lrmoe-gen" --tokens 8 --experts $E --topk 1 --hidden $D --ffn $F --dtype f32 -o "$T/in.lrm"
        "$BIN/lrmoe-route" -k 1 "$T/in.lrm" > "$T/r.lrm"
        run "$BIN/lrmoe-exec" --phase forward --weights "$T/w$dt.lrm" -o "$T/o.lrm" "$T/r.lrm"
        assert_success
    done
    mkst "$T/i8.safetensors" "mlp.experts.gate_up_proj=I8:[$E,6,$D]" "mlp.experts.down_proj=I8:[$E,$D,$F]"
    run "$BIN/lrmoe-import" -o "$T/x.lrm" "$T/i8.safetensors"
    assert_import_error "mlp.experts.down_proj is I8: expert weights must be BF16, F16, F32 or F64"
    mkst "$T/r8.safetensors" "mlp.experts.gate_up_proj=F32:[$E,6,$D]" "mlp.experts.down_proj=F32:[$E,$D,$F]" \
        "mlp.gate.weight=I8:[$E,$D]"
    run "$BIN/lrmoe-import" -o "$T/x.lrm" "$T/r8.safetensors"
    assert_import_error "mlp.gate.weight is I8: a router's weights are floating-point"
    # a U64 id above INT64_MAX is too large, not negative
    mkst "$T/u64.safetensors" "hidden=F32:[2,$D]" "topk_ids=U64:[2,1]:[1, 2**63 + 5][i]"
    run "$BIN/lrmoe-import" -o "$T/x.lrm" "$T/u64.safetensors"
    assert_import_error "topk_ids: id 9223372036854775813 (token 1, choice 0) does not fit I32"
    # a layer number of 20 digits is an error, not INT64_MAX
    mkst "$T/l20.safetensors" "model.layers.99999999999999999999.mlp.experts.gate_up_proj=F32:[1,2,$D]" \
        "model.layers.99999999999999999999.mlp.experts.down_proj=F32:[1,$D,1]"
    run "$BIN/lrmoe-import" -o "$T/x.lrm" "$T/l20.safetensors"
    assert_import_error "model.layers.99999999999999999999: layer index 99999999999999999999 does not fit a 64-bit integer"
    # a router under a 2000-byte prefix is found (it was dropped silently)
    p=$(printf 'a%.0s' $(seq 2000)).mlp
    mkst "$T/long.safetensors" "$p.experts.gate_up_proj=F32:[$E,6,$D]" "$p.experts.down_proj=F32:[$E,$D,$F]" \
        "$p.gate.weight=F32:[$E,$D]"
    run "$BIN/lrmoe-import" -o "$T/x.lrm" "$T/long.safetensors"
    assert_success
    run "$BIN/lrmoe-view" --no-stats "$T/x.lrm"
    assert_line --regexp '^  router_weight +F32 +\[2,4\]'
    assert_line "  hf.left_out=0"
}
