"""The parameter-count oracle of tests/budget.bats: tiny random-init Hugging
Face MoE models built from their config objects (no download).

    python3 budget_oracle.py DIR
        for each case below writes DIR/CASE/config.json (save_pretrained's)
        and prints one line "CASE EXPERT OTHER": the numel sums of the
        instantiated model's routed-expert parameters (the experts module of
        every MoE block) and of all its other parameters (tied weights once);
        then the same for each preset of lrmoe-budget (PRESETS, built on the
        meta device: shapes, no memory).
"""
import os
import sys

import torch
import transformers as tf

COMMON = dict(vocab_size=96, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
              num_experts_per_tok=2)


def cases():
    c = COMMON
    yield "qwen3_moe", tf.Qwen3MoeConfig(**c, num_key_value_heads=2, head_dim=12,
                                         intermediate_size=40, moe_intermediate_size=16,
                                         num_experts=8, tie_word_embeddings=False)
    # dense layers by decoder_sparse_step and mlp_only_layers, biases, tied embeddings
    yield "qwen3_moe_mixed", tf.Qwen3MoeConfig(**c, num_key_value_heads=1, head_dim=8,
                                               intermediate_size=40, moe_intermediate_size=16,
                                               num_experts=6, decoder_sparse_step=2,
                                               mlp_only_layers=[3], attention_bias=True,
                                               tie_word_embeddings=True)
    yield "qwen2_moe", tf.Qwen2MoeConfig(**c, num_key_value_heads=2, intermediate_size=40,
                                         moe_intermediate_size=16,
                                         shared_expert_intermediate_size=24, num_experts=8,
                                         tie_word_embeddings=False)
    yield "mixtral", tf.MixtralConfig(**c, num_key_value_heads=2, intermediate_size=24,
                                      num_local_experts=4, tie_word_embeddings=False)
    yield "deepseek_v3", tf.DeepseekV3Config(**c, num_key_value_heads=4, intermediate_size=48,
                                             moe_intermediate_size=16, n_shared_experts=2,
                                             n_routed_experts=8, n_group=2, topk_group=1,
                                             first_k_dense_replace=1, q_lora_rank=16,
                                             kv_lora_rank=12, qk_rope_head_dim=8,
                                             qk_nope_head_dim=6, v_head_dim=10,
                                             tie_word_embeddings=False)
    # no q low-rank, attention biases
    yield "deepseek_v3_noq", tf.DeepseekV3Config(**c, num_key_value_heads=4,
                                                 intermediate_size=48,
                                                 moe_intermediate_size=16, n_shared_experts=1,
                                                 n_routed_experts=4, n_group=1, topk_group=1,
                                                 first_k_dense_replace=2, q_lora_rank=None,
                                                 kv_lora_rank=12, qk_rope_head_dim=4,
                                                 qk_nope_head_dim=8, v_head_dim=8,
                                                 attention_bias=True,
                                                 tie_word_embeddings=False)
    yield "deepseek_v2", tf.DeepseekV2Config(**c, num_key_value_heads=4, intermediate_size=48,
                                             moe_intermediate_size=16, n_shared_experts=1,
                                             n_routed_experts=8, n_group=2, topk_group=1,
                                             first_k_dense_replace=1, q_lora_rank=16,
                                             kv_lora_rank=12, qk_rope_head_dim=8,
                                             qk_nope_head_dim=6, v_head_dim=10,
                                             mlp_bias=True, tie_word_embeddings=False)


# the presets of lrmoe-budget --preset, with their published config values,
# instantiated on the meta device (shapes only, no memory)
PRESETS = {
    "qwen3-30b-a3b": lambda: tf.Qwen3MoeConfig(
        vocab_size=151936, hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
        num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
        moe_intermediate_size=768, intermediate_size=6144, decoder_sparse_step=1,
        mlp_only_layers=[], attention_bias=False, tie_word_embeddings=False),
    "deepseek-v3": lambda: tf.DeepseekV3Config(
        vocab_size=129280, hidden_size=7168, num_hidden_layers=61, num_attention_heads=128,
        num_key_value_heads=128, n_routed_experts=256, num_experts_per_tok=8,
        moe_intermediate_size=2048, n_shared_experts=1, intermediate_size=18432,
        first_k_dense_replace=3, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, tie_word_embeddings=False),
    "kimi-k2": lambda: tf.DeepseekV3Config(
        vocab_size=163840, hidden_size=7168, num_hidden_layers=61, num_attention_heads=64,
        num_key_value_heads=64, n_routed_experts=384, num_experts_per_tok=8,
        moe_intermediate_size=2048, n_shared_experts=1, intermediate_size=18432,
        first_k_dense_replace=1, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, tie_word_embeddings=False),
}


def counts(model):
    """(routed-expert numel, other numel) of a model's parameters."""
    expert = other = 0
    for name, p in model.named_parameters():  # each shared (tied) tensor once
        if ".mlp.experts." in name or ".block_sparse_moe.experts." in name:
            expert += p.numel()
        else:
            other += p.numel()
    return expert, other


def main(out):
    torch.manual_seed(0)
    for name, cfg in cases():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        cfg.save_pretrained(d)
        model = tf.AutoModelForCausalLM.from_config(cfg)
        e, o = counts(model)
        print(name, e, o, flush=True)
    for name, make in PRESETS.items():
        cfg = make()
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        cfg.save_pretrained(d)
        with torch.device("meta"):
            model = tf.AutoModelForCausalLM.from_config(cfg)
        e, o = counts(model)
        print(name, e, o, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
