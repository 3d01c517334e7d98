"""An independent restatement of lrmoe-budget(1)'s formula for tests/budget.bats.

    python3 budget_ref.py CONFIG.json EXPERT_TOTAL OTHER_TOTAL KEY=VALUE... < TSV

reads lrmoe-budget --tsv on stdin and checks every byte term against the
formula computed here from the config's fields and the options (tp, pp, dp,
ep, seq, mb, ckpt, zero1, pb, gb, ob, ab, gpu, reserve); the parameter totals
come from the Hugging Face oracle (budget_oracle.py). Prints "ok N terms" or
each mismatch, exit 1.
"""
import json
import sys


def main():
    cfg = json.load(open(sys.argv[1]))
    expert_total, other_total = int(sys.argv[2]), int(sys.argv[3])
    o = dict(tp=1, pp=1, dp=1, ep=1, seq=4096, mb=1, ckpt="full", zero1=0, pb=2, gb=4, ob=12,
             ab=2, reserve=0)
    for kv in sys.argv[4:]:
        k, v = kv.split("=")
        o[k] = v if k == "ckpt" else int(v)
    rows = [l.rstrip("\n").split("\t") for l in sys.stdin]
    got = dict(zip(rows[0], rows[1]))
    mt = cfg["model_type"]
    D, L, V, H = (cfg[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size",
                                   "num_attention_heads"))
    E = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")
    dense_w = cfg.get("intermediate_size", 0)
    # which layers are MoE, the shared-expert width, the attention's saved elements
    if mt.startswith("qwen"):
        moe = [i not in cfg["mlp_only_layers"] and (i + 1) % cfg["decoder_sparse_step"] == 0
               for i in range(L)]
        shared = cfg.get("shared_expert_intermediate_size", 0)
    elif mt == "mixtral":
        moe, shared = [True] * L, 0
    else:
        moe = [i >= cfg["first_k_dense_replace"] for i in range(L)]
        shared = cfg["moe_intermediate_size"] * cfg["n_shared_experts"]
    if mt.startswith("deepseek"):
        qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
        attn = (2 * (cfg["q_lora_rank"] or 0) + 2 * cfg["kv_lora_rank"] + 2 * H * qk
                + 2 * H * cfg["v_head_dim"])
    else:
        hd = cfg.get("head_dim") or D // H
        q, kv = H * hd, cfg["num_key_value_heads"] * hd
        attn = 2 * q + 2 * kv + ((q + kv) if mt == "qwen3_moe" else 0)
    Lm = sum(moe)
    tp, pp, dp, ep = o["tp"], o["pp"], o["dp"], o["ep"]
    st_layers, st_moe = L // pp, min(L // pp, -(-Lm // pp))
    pd = -(-other_total // (tp * pp))
    pe = expert_total // Lm // ep * st_moe
    edp = dp * tp // ep
    want = {}
    want["weights_bytes"] = (pd + pe) * o["pb"]
    want["grads_bytes"] = (pd + pe) * o["gb"]
    want["optim_bytes"] = (-(-pd * o["ob"] // dp) - (-pe * o["ob"] // edp) if o["zero1"]
                           else (pd + pe) * o["ob"])
    tok = -(-o["seq"] * o["mb"] // tp)
    moe_l = tok * ((4 * D + attn + 3 * shared) * o["ab"] + 4 * H + 4 * E)
    dense_l = tok * ((4 * D + attn + 3 * dense_w) * o["ab"] + 4 * H)
    if o["ckpt"] == "full":
        want["act_stored_bytes"] = pp * st_layers * tok * D * o["ab"]
        want["act_working_bytes"] = max(moe_l, dense_l if Lm < L and st_layers > st_moe else 0)
        alive = 1
    else:
        want["act_stored_bytes"] = pp * (st_moe * moe_l + (st_layers - st_moe) * dense_l)
        want["act_working_bytes"] = 0
        alive = st_moe * pp
    want["logits_bytes"] = -(-o["seq"] * o["mb"] * V * 4 // tp)
    want["reserve_bytes"] = o["reserve"]
    want["gpu_mem_bytes"] = o["gpu"]
    free = o["gpu"] - o["reserve"] - sum(want[k] for k in (
        "weights_bytes", "grads_bytes", "optim_bytes", "act_stored_bytes",
        "act_working_bytes", "logits_bytes"))
    want["free_bytes"] = free
    want["alive"] = alive
    want["hbm_bytes"] = free // alive if free >= 0 else 0
    want["resident_bytes"] = o["gpu"] - want["hbm_bytes"]
    want["params_experts"], want["params_other"] = pe, pd
    bad = [f"{k}: tool {got.get(k)} formula {v}" for k, v in want.items() if str(v) != got.get(k)]
    for b in bad:
        print(b)
    if not bad:
        print(f"ok {len(want)} terms")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
