"""lrmoe.budget and lrmoe.torch.budget give what lrmoe-budget prints for the
same model: a preset, a config.json, and a tiny live model with its AdamW
optimizer (counted on the model, before and after patch())."""
import json
import os
import subprocess
import tempfile
import unittest

import torch

import tiny
import lrmoe
import lrmoe.torch

B = tiny.BIN


def tool(*args):
    r = subprocess.run([f"{B}/lrmoe-budget", *args, "--json"], capture_output=True, text=True)
    if r.returncode not in (0, 1):
        raise AssertionError(f"lrmoe-budget {args}: exit {r.returncode}: {r.stderr}")
    return json.loads(r.stdout)


def tiny_model(dtype=torch.float32):
    torch.manual_seed(0)
    cfg = tiny.tf.Qwen3MoeConfig(vocab_size=64, hidden_size=32, num_hidden_layers=3,
                                 num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                 intermediate_size=48, moe_intermediate_size=16, num_experts=8,
                                 num_experts_per_tok=2, mlp_only_layers=[1],
                                 tie_word_embeddings=False)
    return tiny.tf.AutoModelForCausalLM.from_config(cfg).to(dtype)


class Budget(unittest.TestCase):
    def test_preset_equals_tool(self):
        r = lrmoe.budget(preset="qwen3-30b-a3b", gpu_mem="80G", reserve="2G", dp=8, ep=8,
                         zero1=True)
        t = tool("--preset", "qwen3-30b-a3b", "--gpu-mem", "80G", "--reserve", "2G", "--dp", "8",
                 "--ep", "8", "--zero1")
        self.assertEqual(r, t)
        self.assertEqual(r["hbm_bytes"] + r["resident_bytes"], 80 * 2**30)

    def test_config_equals_tool_and_does_not_fit(self):
        with tempfile.TemporaryDirectory() as d:
            tiny_model().config.save_pretrained(d)
            p = os.path.join(d, "config.json")
            for kw, args in (
                    (dict(gpu_mem=2**24, tp=2, pp=3, dp=2, ep=4, checkpoint="none", seq=128),
                     ["--gpu-mem", str(2**24), "--tp", "2", "--pp", "3", "--dp", "2", "--ep",
                      "4", "--checkpoint", "none", "--seq", "128"]),
                    (dict(gpu_mem="1M", dtype="f32", grad_dtype="bf16", optim_bytes=8),
                     ["--gpu-mem", "1M", "--dtype", "f32", "--grad-dtype", "bf16",
                      "--optim-bytes", "8"])):
                r = lrmoe.budget(p, **kw)
                t = tool("--config", p, *args)
                t["model"] = "config"
                self.assertEqual(r, t)
            self.assertEqual(r["fits"], 0)  # 1 MiB: does not fit, a result, not an error
            self.assertLess(r["free_bytes"], 0)

    def test_errors(self):
        with self.assertRaisesRegex(lrmoe.Error, "ep 3 does not divide the 128 experts"):
            lrmoe.budget(preset="qwen3-30b-a3b", gpu_mem="80G", ep=3, dp=3)
        with self.assertRaisesRegex(lrmoe.Error, "field 'num_key_value_heads' missing"):
            c = tiny_model().config.to_dict()
            del c["num_key_value_heads"]
            lrmoe.budget(c, gpu_mem="1G")
        with self.assertRaisesRegex(lrmoe.Error, "checkpoint"):
            lrmoe.budget(preset="qwen3-30b-a3b", gpu_mem="1G", checkpoint="some")

    def test_live_model_equals_tool_on_its_config(self):
        model = tiny_model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with tempfile.TemporaryDirectory() as d:
            model.config.save_pretrained(d)
            p = os.path.join(d, "config.json")
            args = ["--config", p, "--gpu-mem", "1G", "--dp", "2", "--ep", "2", "--seq", "64",
                    "--dtype", "f32", "--grad-dtype", "f32", "--zero1"]
            kw = dict(gpu_mem="1G", dp=2, ep=2, seq=64, zero1=True)
            # before the first step: AdamW's two moments in the params' dtype (f32)
            t = tool(*args, "--optim-bytes", "8")
            t["model"] = "model"
            r = lrmoe.torch.budget(model, opt, **kw)
            self.assertEqual(r, t)
            # after a step: the state tensors themselves (exp_avg, exp_avg_sq), same answer
            x = torch.randint(0, 64, (2, 8))
            model(input_ids=x, labels=x).loss.backward()
            opt.step()
            self.assertEqual(lrmoe.torch.budget(model, opt, **kw), t)
            # patched experts are counted the same
            h = lrmoe.torch.patch(model, rate=1.0, ranks=2)
            try:
                self.assertEqual(lrmoe.torch.budget(model, opt, **kw), t)
            finally:
                h.unpatch()
            # a bf16 model: 2-byte params and activations, grads in the param dtype
            m16 = tiny_model(torch.bfloat16)
            t16 = tool("--config", p, "--gpu-mem", "1G", "--dtype", "bf16", "--grad-dtype",
                       "bf16", "--optim-bytes", "4")
            t16["model"] = "model"
            self.assertEqual(lrmoe.torch.budget(m16, torch.optim.AdamW(m16.parameters()),
                                                gpu_mem="1G"), t16)

    @unittest.skipIf(torch.cuda.is_available(), "a CUDA device answers mem_get_info")
    def test_no_cuda_needs_gpu_mem(self):
        with self.assertRaisesRegex(lrmoe.Error, "gpu_mem"):
            lrmoe.torch.budget(tiny_model(), None)


if __name__ == "__main__":
    unittest.main()
