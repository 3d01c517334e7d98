"""Tiny random-init Hugging Face MoE blocks and models for the lrmoe Python
tests (transformers 5). E=8 experts, K=2, D=32, F=16 unless said."""
import os
import sys
import tempfile
import unittest

import torch

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(TOP, "lib", "python"))
os.environ.setdefault("LRMOE_LIBRARY", os.path.join(TOP, "build", "liblrmoe.so.2"))
BIN = os.path.join(TOP, "bin")
HELPERS = os.path.join(TOP, "tests", "helpers")

import transformers as tf  # noqa: E402
tf.logging.set_verbosity_error()
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds  # noqa: E402
from transformers.models.glm4_moe import modeling_glm4_moe as glm  # noqa: E402
from transformers.models.gpt_oss import modeling_gpt_oss as goss  # noqa: E402
from transformers.models.mixtral import modeling_mixtral as mix  # noqa: E402
from transformers.models.olmoe import modeling_olmoe as olm  # noqa: E402
from transformers.models.qwen2_moe import modeling_qwen2_moe as q2  # noqa: E402
from transformers.models.qwen3_moe import modeling_qwen3_moe as q3  # noqa: E402

E, K, D, F = 8, 2, 32, 16
COMMON = dict(vocab_size=64, hidden_size=D, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, max_position_embeddings=64)


def config(family, **over):
    if family == "qwen3_moe":
        c = tf.Qwen3MoeConfig(**COMMON, head_dim=16, intermediate_size=48,
                              moe_intermediate_size=F, num_experts=E, num_experts_per_tok=K,
                              norm_topk_prob=True)
    elif family == "mixtral":
        c = tf.MixtralConfig(**COMMON, head_dim=16, intermediate_size=F, num_local_experts=E,
                             num_experts_per_tok=K)
    elif family == "olmoe":
        c = tf.OlmoeConfig(**COMMON, intermediate_size=F, num_experts=E,
                           num_experts_per_tok=K, norm_topk_prob=False)
    elif family == "qwen2_moe":
        c = tf.Qwen2MoeConfig(**COMMON, intermediate_size=48, moe_intermediate_size=F,
                              shared_expert_intermediate_size=24, num_experts=E,
                              num_experts_per_tok=K, norm_topk_prob=False)
    elif family == "deepseek_v3":
        c = tf.DeepseekV3Config(**COMMON, intermediate_size=48, moe_intermediate_size=F,
                                n_routed_experts=E, n_shared_experts=1, num_experts_per_tok=K,
                                n_group=2, topk_group=1, first_k_dense_replace=0,
                                routed_scaling_factor=2.5, norm_topk_prob=True,
                                kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
                                v_head_dim=16, qk_nope_head_dim=8)
    elif family == "glm4_moe":
        c = tf.Glm4MoeConfig(**COMMON, intermediate_size=48, moe_intermediate_size=F,
                             n_routed_experts=E, n_shared_experts=1, num_experts_per_tok=K,
                             n_group=2, topk_group=1, first_k_dense_replace=0,
                             routed_scaling_factor=1.5, norm_topk_prob=True, head_dim=16)
    elif family == "gpt_oss":
        c = tf.GptOssConfig(**COMMON, head_dim=16, intermediate_size=F, num_local_experts=E,
                            num_experts_per_tok=K)
    else:
        raise KeyError(family)
    for k, v in over.items():
        setattr(c, k, v)
    return c


BLOCKS = {"qwen3_moe": q3.Qwen3MoeSparseMoeBlock, "mixtral": mix.MixtralSparseMoeBlock,
          "olmoe": olm.OlmoeSparseMoeBlock, "qwen2_moe": q2.Qwen2MoeSparseMoeBlock,
          "deepseek_v3": ds.DeepseekV3MoE, "glm4_moe": glm.Glm4MoeMoE, "gpt_oss": goss.GptOssMLP}
FAMILIES = ["qwen3_moe", "mixtral", "olmoe", "qwen2_moe", "deepseek_v3", "glm4_moe"]
MODELS = {"qwen3_moe": tf.Qwen3MoeForCausalLM, "mixtral": tf.MixtralForCausalLM}


def block(family, seed=0, dtype=torch.float32, **over):
    """A block with every parameter and buffer random (HF leaves the fused
    expert weights uninitialised when a block is built alone)."""
    torch.manual_seed(seed)
    b = BLOCKS[family](config(family, **over))
    with torch.no_grad():
        for n, p in b.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 0.1))
        for n, buf in b.named_buffers():
            if "bias" in n:
                buf.copy_(torch.randn_like(buf) * 0.05)
    return b.to(dtype)


def model(family, seed=0, **over):
    torch.manual_seed(seed)
    return MODELS[family](config(family, **over)).float()


class TmpDirCase(unittest.TestCase):
    """A test case with a fresh temporary directory self.d per test;
    self.p(name) is a path in it."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def p(self, name):
        return os.path.join(self.d, name)
