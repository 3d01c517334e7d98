"""Tiny random-init Hugging Face MoE models for tests/import-hf.bats.

    python3 hf_models.py make DTYPE DIR FAMILY...
        builds a 2-layer model of each FAMILY (qwen3_moe, qwen2_moe, olmoe,
        deepseek_v3, glm4_moe, mixtral, gpt_oss) in DTYPE (float32,
        bfloat16), runs a batch [B=2,S=5] through it and writes into
        DIR/FAMILY:
          pretrained/model.safetensors  save_pretrained (per-expert names:
                                        experts.N.gate_proj / w1 ...)
          state.safetensors             model.state_dict() (fused
                                        experts.gate_up_proj, down_proj)
          experts1.safetensors          layer 1's experts module state_dict
                                        (bare gate_up_proj, down_proj)
          act1.safetensors              layer 1's MoE input as HF holds it:
                                        hidden [B,S,D], topk_ids int64 [T,K],
                                        topk_weights bf16 [T,K],
                                        router_logits [T,E]
          ref1.safetensors              what the experts module returns for
                                        those inputs (output [T,D], float32
                                        math on the stored values), and the
                                        HF parameters of every layer
    python3 hf_models.py check DIR:WEIGHTS.lrm[:OUT.lrm]...
        checks, for each DIR (one python start for all), that WEIGHTS.lrm holds, per layer, w_gate/w_up/w_down (and
        router_weight, expert_bias) bit-equal to the HF parameters, and that
        every frame of OUT.lrm (lrmoe-exec --phase forward on act1) has an
        output that matches ref1 within atol + rtol*|ref| (stated on stdout).
"""
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file, load_file

sys.path.insert(0, os.path.dirname(__file__))
import lrmoe_stream as ls  # noqa: E402

B, S, D, F, E, K = 2, 5, 32, 16, 8, 2


def config(family):
    import transformers as tf
    common = dict(vocab_size=64, hidden_size=D, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, num_experts_per_tok=K)
    if family == "qwen3_moe":
        return tf.Qwen3MoeConfig(**common, head_dim=16, intermediate_size=48,
                                 moe_intermediate_size=F, num_experts=E, norm_topk_prob=True)
    if family == "qwen2_moe":
        return tf.Qwen2MoeConfig(**common, intermediate_size=48, moe_intermediate_size=F,
                                 shared_expert_intermediate_size=24, num_experts=E)
    if family == "olmoe":
        return tf.OlmoeConfig(**common, intermediate_size=F, num_experts=E)
    if family == "deepseek_v3":
        common["num_key_value_heads"] = 2
        return tf.DeepseekV3Config(**common, intermediate_size=48, moe_intermediate_size=F,
                                   n_shared_experts=1, n_routed_experts=E, n_group=2,
                                   topk_group=1, first_k_dense_replace=0, q_lora_rank=16,
                                   kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                                   v_head_dim=8)
    if family == "glm4_moe":
        return tf.Glm4MoeConfig(**common, head_dim=16, intermediate_size=48,
                                moe_intermediate_size=F, n_shared_experts=1, n_routed_experts=E,
                                n_group=1, topk_group=1, first_k_dense_replace=0)
    if family == "mixtral":
        return tf.MixtralConfig(**common, head_dim=16, intermediate_size=F, num_local_experts=E)
    if family == "gpt_oss":
        return tf.GptOssConfig(**common, head_dim=16, intermediate_size=F, num_local_experts=E,
                               layer_types=["full_attention"] * 2)
    raise SystemExit("unknown family " + family)


def make(family, dtype, out):
    import transformers as tf
    torch.manual_seed(7)
    cfg = config(family)
    model = tf.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # spread the routing: HF inits routers at 0 or tiny std
        for name, p in model.named_parameters():
            p.normal_(0, 0.3 if "norm" not in name else 0.1).add_(1.0 if "norm" in name else 0)
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.normal_(0, 0.1)
    model = model.to(getattr(torch, dtype)).eval()
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(os.path.join(out, "pretrained"))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(out, "state.safetensors"))
    if family == "gpt_oss":
        return
    mlp = model.model.layers[1].mlp
    save_file({k: v.contiguous() for k, v in mlp.experts.state_dict().items()},
              os.path.join(out, "experts1.safetensors"))
    seen = {}
    mlp.register_forward_pre_hook(lambda m, a: seen.__setitem__("hidden", a[0].detach().clone()))
    mlp.experts.register_forward_hook(
        lambda m, a, o: seen.update(ids=a[1].detach().clone(), w=a[2].detach().clone()))
    mlp.gate.register_forward_hook(lambda m, a, o: seen.__setitem__("logits", o[0].detach().clone()))
    ids = torch.randint(0, 64, (B, S))
    with torch.no_grad():
        model(ids)
    hidden, tids, tw = seen["hidden"], seen["ids"], seen["w"].to(torch.bfloat16)
    assert tids.dtype == torch.int64 and hidden.shape == (B, S, D)
    save_file({"hidden": hidden.contiguous(), "topk_ids": tids.contiguous(),
               "topk_weights": tw.contiguous(), "router_logits": seen["logits"].float().contiguous()},
              os.path.join(out, "act1.safetensors"), metadata={"layer": "1"})
    # reference: the experts module in float32 on exactly the stored values
    with torch.no_grad():  # and in the model's dtype, as HF computes it
        hf = mlp.experts(hidden.reshape(B * S, D), tids, tw.to(hidden.dtype)).float()
        ref = mlp.experts.float()(hidden.float().reshape(B * S, D), tids, tw.float())
    params = {"output": ref.contiguous(), "output_hf": hf.contiguous()}
    for i, layer in enumerate(model.model.layers):
        m = layer.mlp
        params["l%d.gate_up_proj" % i] = m.experts.gate_up_proj.detach().to(getattr(torch, dtype)).contiguous()
        params["l%d.down_proj" % i] = m.experts.down_proj.detach().to(getattr(torch, dtype)).contiguous()
        params["l%d.router" % i] = m.gate.weight.detach().contiguous()
        if hasattr(m.gate, "e_score_correction_bias"):
            params["l%d.bias" % i] = m.gate.e_score_correction_bias.detach().float().contiguous()
    save_file(params, os.path.join(out, "ref1.safetensors"))


def as_torch(a, dt):
    if dt == "BF16":
        return torch.from_numpy(a.astype(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.array(a))


def check(out, weights, result=None):
    ref = load_file(os.path.join(out, "ref1.safetensors"))
    frames = ls.read_stream(weights, with_dtypes=True)
    layers = {}
    for t, a, d in frames:
        layers[int(a["layer"])] = (t, a, d)
    nl = sum(1 for k in ref if k.endswith(".gate_up_proj"))
    assert sorted(layers) == list(range(nl)), "layers %s, expected 0-%d" % (sorted(layers), nl - 1)
    for i in range(nl):
        t, a, d = layers[i]
        gu, dn = ref["l%d.gate_up_proj" % i], ref["l%d.down_proj" % i]
        got = {n: as_torch(t[n], d[n]) for n in ("w_gate", "w_up", "w_down")}
        assert torch.equal(got["w_gate"], gu[:, :F]), "layer %d w_gate" % i
        assert torch.equal(got["w_up"], gu[:, F:]), "layer %d w_up" % i
        assert torch.equal(got["w_down"], dn), "layer %d w_down" % i
        assert torch.equal(as_torch(t["router_weight"], d["router_weight"]), ref["l%d.router" % i]), \
            "layer %d router_weight" % i
        if "l%d.bias" % i in ref:
            assert d["expert_bias"] == "F32"
            assert torch.equal(torch.from_numpy(np.array(t["expert_bias"])), ref["l%d.bias" % i]), \
                "expert_bias"
        else:
            assert "expert_bias" not in t, "an expert_bias from nowhere"
    print("weights: %d layers bit-equal (w_gate, w_up, w_down, router_weight%s)"
          % (nl, ", expert_bias" if "l0.bias" in ref else ""))
    for t, a, d in ls.read_stream(result, with_dtypes=True) if result else []:
        assert a.get("batch_shape") == "[%d,%d]" % (B, S), a.get("batch_shape")
        assert d["topk_ids"] == "I32" and d["topk_weights"] == "F32", d
        out_ = as_torch(t["output"], d["output"]).float()
        r = ref["output"]
        err = (out_ - r).abs()
        if d["output"] == "F32":
            atol, rtol = 1e-5, 1e-4
            bad = err > atol + rtol * r.abs()
            print("output: max |lrmoe - HF| = %.3g (atol %g + rtol %g |HF|, F32)"
                  % (err.max().item(), atol, rtol))
            assert not bad.any(), "output differs at %d places" % int(bad.sum())
        else:  # both round their intermediates to bf16: lrmoe no worse than 2x HF's own bf16
            ehf = (ref["output_hf"] - r).abs()
            print("output: max / rms |lrmoe - f32 math| = %.3g / %.3g, HF's own %s: %.3g / %.3g "
                  "(bound: 2x HF's)" % (err.max().item(), err.pow(2).mean().sqrt().item(),
                                        d["output"], ehf.max().item(), ehf.pow(2).mean().sqrt().item()))
            assert err.max() <= 2 * ehf.max() + 1e-6 and \
                err.pow(2).mean() <= 4 * ehf.pow(2).mean() + 1e-12, "bf16 output error beyond 2x HF's"


if __name__ == "__main__":
    if sys.argv[1] == "make":
        for fam in sys.argv[4:]:
            make(fam, sys.argv[2], os.path.join(sys.argv[3], fam))
    elif sys.argv[1] == "check":
        for spec in sys.argv[2:]:
            print("%s:" % spec.split(":")[0])
            check(*spec.split(":"))
    else:
        raise SystemExit(__doc__)
