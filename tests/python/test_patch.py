"""lrmoe.torch.patch against the unpatched Hugging Face blocks: same output
and gradients at rate 1 (float32 and bfloat16), the plain-torch reference
that drops the same pairs at rate < 1, a 20-step training loop, and one
clear error per kind of bad input."""
import copy
import subprocess
import sys
import unittest

import torch

import tiny
import lrmoe
import lrmoe.torch as lt

T = 40  # tokens per block call (batch 2 x 20)


def run(blk, x):
    x = x.clone().requires_grad_(True)
    out = blk(x)
    out = out[0] if isinstance(out, tuple) else out
    torch.manual_seed(123)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    grads = {n: p.grad.clone() for n, p in blk.named_parameters() if p.grad is not None}
    return out.detach(), x.grad.clone(), grads


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def drop_reference(blk, x, keep, w=None):
    """run() on blk with plain-torch experts: every pair in the forward and
    the routing-weight gradient, but only the kept pairs (keep (T,K)) in dW
    and dx, each scaled by w (T,K, its pair_weight) when given."""
    import types
    ex = blk.experts

    def fwd(mod, hidden, idx, wt):
        out = torch.zeros_like(hidden)
        Fh = mod.gate_up_proj.shape[1] // 2
        for k in range(idx.shape[1]):
            gu = torch.einsum("td,tfd->tf", hidden, mod.gate_up_proj[idx[:, k]])
            y = torch.einsum("tf,tdf->td", torch.nn.functional.silu(gu[:, :Fh]) * gu[:, Fh:],
                             mod.down_proj[idx[:, k]])
            m = torch.as_tensor(keep[:, k])[:, None]
            ys = y
            if w is not None:
                ys = y * torch.as_tensor(w[:, k])[:, None].to(y.dtype)
                ys = ys + (y - ys).detach()  # the value of y, the gradient of w*y
            out = out + wt[:, k, None] * torch.where(m, ys, y.detach())
        return out
    ex.forward = types.MethodType(fwd, ex)
    return run(blk, x)


class PatchRate1(unittest.TestCase):
    """patch(rate=1.0): output, grad of the input and of every parameter of
    the block equal the unpatched block's; float32 within 2e-5 of the max
    magnitude, bfloat16 within 2e-2 (different summation order, BF16
    rounding of h_g/h_u/y)."""

    def check_family(self, fam, dtype, tol, ranks):
        ref = tiny.block(fam, dtype=dtype)
        pat = copy.deepcopy(ref)
        h = lt.patch(pat, rate=1.0, ranks=ranks)
        torch.manual_seed(7)
        x = torch.randn(2, T // 2, tiny.D).to(dtype)
        o0, gx0, g0 = run(ref, x)
        o1, gx1, g1 = run(pat, x)
        self.assertLess(rel(o1, o0), tol, f"{fam} output")
        self.assertLess(rel(gx1, gx0), tol, f"{fam} grad hidden")
        self.assertEqual(sorted(g0), sorted(g1))
        for n in g0:
            self.assertLess(rel(g1[n], g0[n]), tol, f"{fam} grad {n}")
        # the router got its gradient through grad_topk_weights
        self.assertTrue(any("gate" in n and "experts" not in n or "router" in n for n in g1))
        rec = h.stats[-1]
        self.assertEqual(rec["rho"], 1.0)
        self.assertEqual(rec["kept"], rec["pairs"])
        self.assertEqual(rec["ranks"], ranks)
        for k in ("fwd_peak", "bwd_peak", "replicas", "mem_peak", "feasible"):
            self.assertIn(k, rec)
        with torch.no_grad():  # inference: no saved state, same output
            o3 = pat(x)
            o3 = o3[0] if isinstance(o3, tuple) else o3
        self.assertTrue(torch.equal(o3, o1), f"{fam} no_grad output")
        self.assertNotIn("kept", h.stats[-1])
        h.unpatch()
        o2, _, _ = run(pat, x)
        self.assertTrue(torch.equal(o2, o0), f"{fam}: unpatch restores HF's forward")

    def test_families_f32(self):
        for fam in tiny.FAMILIES:
            with self.subTest(fam):
                self.check_family(fam, torch.float32, 2e-5, ranks=2)

    def test_families_bf16(self):
        for fam in tiny.FAMILIES:
            with self.subTest(fam):
                self.check_family(fam, torch.bfloat16, 2e-2, ranks=4)


class PackedWeights(unittest.TestCase):
    """float32 experts live in lrmoe's packed layout after patch() (no copy
    per step); parameters moved elsewhere afterwards still work (copied)."""

    def test_views_and_fallback(self):
        ref = tiny.block("qwen3_moe")
        pat = copy.deepcopy(ref)
        h = lt.patch(pat, rate=1.0, ranks=2)
        ex, buf = pat.experts, h.layers[0].w_f32
        self.assertEqual(ex.gate_up_proj.data_ptr(), buf.data_ptr())
        self.assertFalse(ex.down_proj.is_contiguous())
        self.assertTrue(torch.equal(ex.gate_up_proj, ref.experts.gate_up_proj))
        self.assertTrue(torch.equal(ex.down_proj, ref.experts.down_proj))
        x = torch.randn(2, T // 2, tiny.D)
        o0, gx0, g0 = run(ref, x)
        with torch.no_grad():
            ex.gate_up_proj.data = ex.gate_up_proj.data.contiguous() * 1.0
        o1, gx1, g1 = run(pat, x)
        self.assertLess(rel(o1, o0), 2e-5)
        self.assertLess(rel(g1["experts.down_proj"], g0["experts.down_proj"]), 2e-5)
        self.assertFalse(h.layers[0].adopted)
        self.assertNotEqual(h.layers[0].w_f32.data_ptr(), buf.data_ptr())
        self.assertTrue(torch.equal(ex.down_proj, ref.experts.down_proj))  # untouched
        h.unpatch()
        self.assertTrue(ex.down_proj.is_contiguous())


class PatchDrop(unittest.TestCase):
    """rate < 1: the gradients equal plain torch where the dropped pairs
    (the keep mask lrmoe reports) contribute nothing to dW and dx but every
    pair still counts in the forward and in the routing-weight gradient."""

    def reference(self, blk, x, keep):
        return drop_reference(blk, x, keep)

    def test_drop_matches_reference(self):
        cases = [(f, r, torch.float32, 2e-5) for f, r in (
            ("qwen3_moe", 2), ("mixtral", 4), ("olmoe", 2), ("qwen2_moe", 4), ("deepseek_v3", 2),
            ("glm4_moe", 4))] + [("qwen3_moe", 2, torch.bfloat16, 2e-2),
                                 ("deepseek_v3", 4, torch.bfloat16, 2e-2)]
        for fam, ranks, dtype, tol in cases:
            with self.subTest(f"{fam} {dtype}"):
                ref = tiny.block(fam, dtype=dtype)
                pat = copy.deepcopy(ref)
                h = lt.patch(pat, rate=0.6, ranks=ranks, keep_masks=True, select="topk")
                torch.manual_seed(9)
                x = torch.randn(2, T // 2, tiny.D).to(dtype)
                o1, gx1, g1 = run(pat, x)
                rec = h.stats[-1]
                keep = rec["keep"]
                self.assertLess(rec["kept"], rec["pairs"])
                self.assertEqual(int(keep.sum()), rec["kept"])
                self.assertAlmostEqual(rec["rho"], rec["kept"] / rec["pairs"], places=5)
                o0, gx0, g0 = self.reference(ref, x, keep)
                self.assertLess(rel(o1, o0), tol)
                self.assertLess(rel(gx1, gx0), tol)
                for n in g0:
                    self.assertLess(rel(g1[n], g0[n]), tol, f"{fam} grad {n}")
                # and they differ from the full gradient: the drop is real
                full = tiny.block(fam, dtype=dtype)
                _, gxf, _ = run(full, x)
                self.assertGreater(rel(gx1, gxf), 1e-3)


class PatchSample(unittest.TestCase):
    """select="sample": the gradients equal plain torch where each kept
    pair's contribution to dW and dx is scaled by its pair_weight (1/p) and
    the dropped ones contribute nothing, while the forward and the
    routing-weight gradient see every pair unscaled; at rate 1 the same
    bits as select="topk"."""

    def reference(self, blk, x, keep, w):
        return drop_reference(blk, x, keep, w)

    def test_sample_matches_reference(self):
        for fam, ranks in (("qwen3_moe", 2), ("deepseek_v3", 4), ("mixtral", 2)):
            with self.subTest(fam):
                ref = tiny.block(fam)
                pat = copy.deepcopy(ref)
                h = lt.patch(pat, rate=0.6, ranks=ranks, keep_masks=True, select="sample")
                torch.manual_seed(9)
                x = torch.randn(2, T // 2, tiny.D)
                o1, gx1, g1 = run(pat, x)
                rec = h.stats[-1]
                keep, w = rec["keep"], rec["pair_weight"]
                self.assertLess(rec["kept"], rec["pairs"])
                self.assertEqual(int(keep.sum()), rec["kept"])
                self.assertTrue((w[keep] >= 1).all() and (w[~keep] == 1).all())
                self.assertTrue((w[keep] > 1).any())  # some pair is reweighted
                o0, gx0, g0 = self.reference(ref, x, keep, w)
                self.assertLess(rel(o1, o0), 2e-5)
                self.assertLess(rel(gx1, gx0), 2e-5)
                for n in g0:
                    self.assertLess(rel(g1[n], g0[n]), 2e-5, f"{fam} grad {n}")
                # the weights matter: the unweighted (topk-style) reference differs
                _, gxu, _ = self.reference(tiny.block(fam), x, keep, w * 0 + 1)
                self.assertGreater(rel(gx1, gxu), 1e-3)

    def test_rate1_is_topk(self):
        ref = tiny.block("qwen3_moe")
        a, b = copy.deepcopy(ref), copy.deepcopy(ref)
        lt.patch(a, rate=1.0, ranks=2)
        lt.patch(b, rate=1.0, ranks=2, select="sample")
        x = torch.randn(2, T // 2, tiny.D)
        ra, rb = run(a, x), run(b, x)
        self.assertTrue(torch.equal(ra[0], rb[0]) and torch.equal(ra[1], rb[1]))
        for n in ra[2]:
            self.assertTrue(torch.equal(ra[2][n], rb[2][n]), n)

    def test_bad_select(self):
        with self.assertRaisesRegex(lrmoe.Error, "unknown selection 'best'"):
            lt.patch(tiny.block("qwen3_moe"), rate=0.8, select="best")


class PatchCapacity(unittest.TestCase):
    """planner="capacity": Megatron-Core's capacity-factor token dropping.
    Output and every gradient equal the unpatched block whose experts see
    the routing weights of the dropped pairs (lrmoe.capacity_keep) zeroed:
    the dropped pairs leave forward and backward and get no router
    gradient; the kept pairs per expert are the plan's quotas."""

    def test_capacity_matches_reference(self):
        import types
        for fam, cf in (("qwen3_moe", 1.0), ("mixtral", 1.25), ("deepseek_v3", 1.0)):
            with self.subTest(f"{fam} {cf}"):
                ref = tiny.block(fam)
                pat = copy.deepcopy(ref)
                h = lt.patch(pat, planner="capacity", capacity_factor=cf, ranks=2,
                             keep_masks=True)
                ex = ref.experts
                orig = type(ex).forward

                def fwd(mod, hidden, idx, w, orig=orig):
                    keep = lrmoe.capacity_keep(idx.to(torch.int32).numpy(),
                                               w.detach().float().numpy(), tiny.E, cf)
                    return orig(mod, hidden, idx, w * torch.from_numpy(keep).to(w.dtype))
                ex.forward = types.MethodType(fwd, ex)
                torch.manual_seed(4)
                x = torch.randn(2, T // 2, tiny.D)
                o1, gx1, g1 = run(pat, x)
                o0, gx0, g0 = run(ref, x)
                rec = h.stats[-1]
                self.assertEqual(rec["planner"], "capacity")
                self.assertEqual(int(rec["keep"].sum()), rec["kept"])
                if cf == 1.0:
                    self.assertGreater(rec["dropped_fwd"], 0)
                    self.assertLess(rec["kept"], rec["pairs"])
                self.assertLess(rel(o1, o0), 2e-5)
                self.assertLess(rel(gx1, gx0), 2e-5)
                for n in g0:
                    self.assertLess(rel(g1[n], g0[n]), 2e-5, f"{fam} grad {n}")

    def test_capacity_options(self):
        with self.assertRaisesRegex(lrmoe.Error, "needs capacity_factor"):
            lt.patch(tiny.block("qwen3_moe"), planner="capacity")
        with self.assertRaisesRegex(lrmoe.Error, "goes with planner"):
            lt.patch(tiny.block("qwen3_moe"), capacity_factor=1.0)


class Training(unittest.TestCase):
    """20 AdamW steps of a tiny Qwen3-MoE and Mixtral causal LM through
    patch(rate=1.0) follow the unpatched loss curve (rel diff <= 1e-4)."""

    def test_loss_curve(self):
        for fam in ("qwen3_moe", "mixtral"):
            with self.subTest(fam):
                m0 = tiny.model(fam, seed=3)
                m1 = copy.deepcopy(m0)
                h = lt.patch(m1, rate=1.0, ranks=2)
                o0 = torch.optim.AdamW(m0.parameters(), lr=3e-3)
                o1 = torch.optim.AdamW(m1.parameters(), lr=3e-3)
                g = torch.Generator().manual_seed(5)
                ids = torch.randint(0, 64, (2, 16), generator=g)
                worst, l0s = 0.0, []
                for step in range(20):
                    losses = []
                    for m, o in ((m0, o0), (m1, o1)):
                        o.zero_grad()
                        loss = m(ids, labels=ids).loss
                        loss.backward()
                        o.step()
                        losses.append(loss.item())
                    l0s.append(losses[0])
                    worst = max(worst, abs(losses[1] - losses[0]) / abs(losses[0]))
                self.assertLessEqual(worst, 1e-4)
                self.assertLess(l0s[-1], l0s[0])  # it did train
                self.assertEqual(len(h.stats), 20 * 2)  # 2 MoE layers x 20 steps


class BadInput(unittest.TestCase):
    def test_gpt_oss_refused(self):
        with self.assertRaises(lrmoe.Error) as e:
            lt.patch(tiny.block("gpt_oss"))
        self.assertIn("not SwiGLU", str(e.exception))

    def test_non_swiglu(self):
        with self.assertRaises(lrmoe.Error) as e:
            lt.patch(tiny.block("qwen3_moe", hidden_act="gelu"))
        self.assertIn("activation 'gelu', not silu", str(e.exception))

    def test_unsupported_block(self):
        class MyMoE(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.experts = tiny.block("qwen3_moe").experts
        with self.assertRaises(lrmoe.Error) as e:
            lt.patch(torch.nn.Sequential(MyMoE()))
        self.assertIn("unsupported MoE block MyMoE", str(e.exception))
        with self.assertRaises(lrmoe.Error) as e:
            lt.patch(torch.nn.Linear(2, 2))
        self.assertIn("no MoE block", str(e.exception))

    def test_mismatched_dtypes(self):
        blk = tiny.block("qwen3_moe")
        blk.experts.to(torch.bfloat16)
        lt.patch(blk)
        with self.assertRaises(lrmoe.Error) as e:
            blk(torch.randn(1, 4, tiny.D))
        self.assertIn("mismatched dtypes", str(e.exception))

    def test_bad_options(self):
        with self.assertRaises(lrmoe.Error) as e:
            lt.patch(tiny.block("qwen3_moe"), ranks=3)
        self.assertIn("do not split over ranks=3", str(e.exception))
        with self.assertRaises(lrmoe.Error) as e:
            lt.patch(tiny.block("qwen3_moe"), rate=1.5)
        self.assertIn("--rate", str(e.exception))
        with self.assertRaises(lrmoe.Error) as e:
            lt.patch(tiny.block("qwen3_moe"), metric="nope")
        with self.assertRaises(lrmoe.Error) as e:
            lt.patch(tiny.block("qwen3_moe"), no_such_option=1)
        self.assertIn("unknown planner option 'no-such-option'", str(e.exception))

    def test_infeasible_budget(self):
        blk = tiny.block("qwen3_moe")
        lt.patch(blk, rate=1.0, hbm=1, ranks=2)
        with self.assertRaises(lrmoe.Error) as e:
            blk(torch.randn(1, 8, tiny.D))
        self.assertIn("Qwen3MoeSparseMoeBlock: plan: infeasible at every rate", str(e.exception))
        self.assertIn("memory: rank 0 needs", str(e.exception))

    def test_missing_library(self):
        r = subprocess.run([sys.executable, "-c", "import lrmoe"], capture_output=True, text=True,
                           env={"PYTHONPATH": tiny.os.path.join(tiny.TOP, "lib", "python"),
                                "LRMOE_LIBRARY": "/nonexistent/liblrmoe.so.2"})
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("lrmoe: cannot load /nonexistent/liblrmoe.so.2", r.stderr)
        self.assertIn("LibraryNotFound", r.stderr)


if __name__ == "__main__":
    unittest.main()
