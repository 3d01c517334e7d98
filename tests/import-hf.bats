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
