"""lrmoe.torch.dump: the frames and the weights stream it writes, and the
CLI pipeline over them reproducing the patched layer's numbers."""
import copy
import os
import subprocess
import unittest

import numpy as np
import torch

import tiny
import lrmoe
import lrmoe.torch as lt
from test_patch import run


def sh(cmd):
    r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True)
    if r.returncode:
        raise AssertionError(f"{cmd}: exit {r.returncode}: {r.stderr}")
    return r


class Dump(tiny.TmpDirCase):
    def test_frames_and_weights_every_family(self):
        for fam in tiny.FAMILIES:
            with self.subTest(fam):
                blk = tiny.block(fam)
                x = torch.randn(2, 10, tiny.D)
                with lt.dump(blk, self.p("a.lrm"), every=2, weights=self.p("w.lrm")) as d:
                    for _ in range(3):
                        run(blk, x)
                self.assertEqual(d.frames, 2)
                fr = lrmoe.read(self.p("a.lrm"))
                self.assertEqual([f.attrs["step"] for f in fr], ["0", "2"])
                f = fr[0]
                self.assertEqual(f["hidden"].shape, (20, tiny.D))
                self.assertEqual(f["router_logits"].shape, (20, tiny.E))
                self.assertEqual(f["grad_output"].shape, (20, tiny.D))
                self.assertEqual(f.attrs["topk"], str(tiny.K))
                self.assertTrue(np.array_equal(f["hidden"], x.reshape(-1, tiny.D).numpy()))
                w = lrmoe.read(self.p("w.lrm"))[0]
                ex = blk.experts
                self.assertTrue(np.array_equal(w["w_gate"], ex.gate_up_proj[:, :tiny.F].detach().numpy()))
                self.assertTrue(np.array_equal(w["w_up"], ex.gate_up_proj[:, tiny.F:].detach().numpy()))
                self.assertTrue(np.array_equal(w["w_down"], ex.down_proj.detach().numpy()))
                self.assertEqual(w["router_weight"].shape, (tiny.E, tiny.D))
                self.assertEqual("expert_bias" in w, fam in ("deepseek_v3", "glm4_moe"))

    def test_bf16_frames(self):
        blk = tiny.block("mixtral", dtype=torch.bfloat16)
        x = torch.randn(1, 8, tiny.D).bfloat16()
        with lt.dump(blk, self.p("b.lrm")):
            run(blk, x)
        f = lrmoe.read(self.p("b.lrm"), bf16="raw")[0]
        self.assertEqual(f.dtypes["hidden"], "BF16")
        self.assertTrue(np.array_equal(f["hidden"], x.reshape(-1, tiny.D).view(torch.int16).numpy().view(np.uint16)))

    def test_gpt_oss_routing_only(self):
        blk = tiny.block("gpt_oss")
        with lt.dump(blk, self.p("g.lrm")):
            run(blk, torch.randn(1, 6, tiny.D))
        f = lrmoe.read(self.p("g.lrm"))[0]
        self.assertEqual(f["router_logits"].shape, (6, tiny.E))
        with self.assertRaises(lrmoe.Error) as e:
            lt.dump(blk, self.p("g2.lrm"), weights=self.p("gw.lrm"))
        self.assertIn("not SwiGLU", str(e.exception))

    def test_pipe_into_lrmoe_route(self):
        blk = tiny.block("qwen3_moe")
        p = subprocess.Popen([os.path.join(tiny.BIN, "lrmoe-route"), "-k", "2", "-n",
                              "-o", self.p("r.lrm")], stdin=subprocess.PIPE)
        with lt.dump(blk, p.stdin):
            for _ in range(2):
                run(blk, torch.randn(1, 8, tiny.D))
        p.stdin.close()
        self.assertEqual(p.wait(), 0)
        fr = lrmoe.read(self.p("r.lrm"))
        self.assertEqual(len(fr), 2)
        self.assertEqual(fr[1]["topk_ids"].shape, (8, 2))

    def test_cli_pipeline_reproduces_patched_layer(self):
        """dump -> lrmoe-route | lrmoe-plan | lrmoe-exec forward | lrmoe-score
        | lrmoe-pack | lrmoe-exec backward --mode compact gives the patched
        layer's output and gradients bit for bit (same library code, same
        plan, same kept pairs), at rate 1 and below."""
        cases = (("qwen3_moe", "-n", 1.0), ("qwen3_moe", "-n", 0.6), ("mixtral", "-n", 1.0),
                 ("deepseek_v3", f"-r sigmoid --groups 2 --topk-groups 1 -n --scale 2.5 --weights {self.p('w.lrm')}", 0.8))
        for fam, router, rate in cases:
            with self.subTest(f"{fam} rate {rate}"):
                blk = tiny.block(fam)
                with lt.dump(blk, self.p("d.lrm"), weights=self.p("w.lrm")):
                    run(blk, torch.randn(2, 20, tiny.D))
                f = lrmoe.read(self.p("d.lrm"))[0]
                B = tiny.BIN
                sh(f"{B}/lrmoe-route -k 2 {router} {self.p('d.lrm')} | {B}/lrmoe-plan -P 2 "
                   f"--rate {rate} --ffn {tiny.F} | {B}/lrmoe-exec --phase forward -@ 1 --weights "
                   f"{self.p('w.lrm')} | {B}/lrmoe-score --select topk | {B}/lrmoe-pack | {B}/lrmoe-exec "
                   f"--phase backward --mode compact -@ 1 --weights {self.p('w.lrm')} "
                   f"-o {self.p('cli.lrm')}")
                c = lrmoe.read(self.p("cli.lrm"))[0]
                pat = copy.deepcopy(blk)
                h = lt.patch(pat, rate=rate, ranks=2, threads=1, select="topk")
                hid = torch.from_numpy(f["hidden"]).requires_grad_(True)
                _, w, ids = pat.gate(hid.detach())
                # HF's routing and lrmoe-route's agree: the same experts per
                # token (HF's DeepSeek order is unsorted), weights to F32
                # rounding; the patched layer then runs on lrmoe-route's
                # choice, so both sides compute exactly the same thing
                o_hf, o_c = ids.argsort(1), np.argsort(c["topk_ids"], 1)
                self.assertTrue(np.array_equal(np.take_along_axis(c["topk_ids"], o_c, 1),
                                               ids.gather(1, o_hf).numpy()))
                self.assertLess(np.abs(np.take_along_axis(c["topk_weights"], o_c, 1) -
                                       w.detach().gather(1, o_hf).numpy()).max(), 1e-6)
                alpha = torch.from_numpy(c["topk_weights"]).requires_grad_(True)
                out = pat.experts(hid, torch.from_numpy(c["topk_ids"]).long(), alpha)
                out.backward(torch.from_numpy(f["grad_output"]))
                rec = h.stats[-1]
                for k in ("rho", "bwd_peak", "fwd_peak", "replicas"):
                    self.assertEqual(str(rec[k]) if k != "rho" else f"{rec[k]:.6f}",
                                     c.attrs[f"plan.{k}"], k)
                self.assertEqual(rec["kept"], int(c["keep"].sum()))
                if rate < 1:
                    self.assertLess(rec["kept"], rec["pairs"])
                ex = pat.experts
                pairs = {"output": out.detach(), "grad_hidden": hid.grad,
                         "grad_topk_weights": alpha.grad,
                         "grad_w_gate": ex.gate_up_proj.grad[:, :tiny.F],
                         "grad_w_up": ex.gate_up_proj.grad[:, tiny.F:],
                         "grad_w_down": ex.down_proj.grad}
                for n, t in pairs.items():
                    a, b = c[n], t.numpy()
                    err = np.abs(a - b).max() / np.abs(b).max()
                    self.assertTrue(np.array_equal(a, b), f"{fam} {n}: rel err {err}")

    def test_frames_in_layer_order_within_a_step(self):
        """Backward reaches the last layer first; the frames still come out
        layer 0, 1 per step, each with its own grad_output (issue 40)."""
        m = tiny.model("qwen3_moe", seed=1)
        ids = torch.randint(0, 64, (2, 6))
        seen = {}

        def grab(i):  # the gradient at layer i's experts' output
            def fwd(mod, args, out):
                out.register_hook(lambda g: seen.__setitem__(i, g.detach().clone()))
            return fwd
        hooks = [b.mlp.experts.register_forward_hook(grab(i))
                 for i, b in enumerate(m.model.layers)]
        with lt.dump(m, self.p("o.lrm")) as d:
            for _ in range(2):
                seen.clear()
                m(ids).logits.sum().backward()
                grads = dict(seen)
        for h in hooks:
            h.remove()
        fr = lrmoe.read(self.p("o.lrm"))
        self.assertEqual(d.frames, 4)
        self.assertEqual([(f.attrs["step"], f.attrs["layer"]) for f in fr],
                         [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")])
        # the grad_output of each frame is its own layer's (the last step's)
        for f in fr[2:]:
            g = grads[int(f.attrs["layer"])].reshape(-1, tiny.D).numpy()
            self.assertTrue(np.array_equal(f["grad_output"], g), f.attrs["layer"])
        # a forward-only step: written at once, in layer order
        with torch.no_grad(), lt.dump(m, self.p("n.lrm")):
            m(ids)
        fr = lrmoe.read(self.p("n.lrm"))
        self.assertEqual([f.attrs["layer"] for f in fr], ["0", "1"])
        self.assertTrue(all("grad_output" not in f for f in fr))



if __name__ == "__main__":
    unittest.main()
