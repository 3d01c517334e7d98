"""lrmoe.torch as PyTorch users expect it (issue 37 item 5): patch()
installs an nn.Module (visible in print(model), same parameters and
state_dict keys, removable), the layer saves its tensors with
save_for_backward (autograd's in-place check and saved-tensor hooks
apply), its gradients pass torch.autograd.gradcheck, and the ops are
registered with torch.library so torch.compile(fullgraph=True) runs a
patched model to the eager loss and gradients."""
import copy
import inspect
import os
import unittest
import warnings

import torch

import tiny
import lrmoe
import lrmoe.torch as lt

T = 12


def routed(E=tiny.E, K=tiny.K, D=tiny.D, T=T, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    w = torch.rand(T, K, generator=g)
    return x, ids, w


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


class InstalledModule(unittest.TestCase):
    """patch() puts an LRMoEExperts module in place of each experts module:
    print(model) shows it, parameters are the same objects under the same
    names (state_dict keys and optimizers unchanged), unpatch (the handle's
    or lrmoe.torch.unpatch(model)) puts the original modules back."""

    def test_shard_needs_a_group(self):
        m = tiny.model("qwen3_moe", seed=3)
        with self.assertRaisesRegex(lrmoe.Error, r"shard=True needs group="):
            lt.patch(m, rate=1.0, shard=True)
        self.assertNotIsInstance(m.model.layers[0].mlp.experts, lt.LRMoEExperts)

    def test_module_in_place(self):
        m = tiny.model("qwen3_moe", seed=3)
        text0, keys0 = repr(m), list(m.state_dict())
        params0 = dict(m.named_parameters())
        origs = [layer.mlp.experts for layer in m.model.layers]
        opt = torch.optim.SGD(m.parameters(), lr=0.1)  # made before patch()
        h = lt.patch(m, rate=1.0, ranks=2)
        text = repr(m)  # print(model) (its two identical layers shown once)
        self.assertIn("(experts): LRMoEExperts(Qwen3MoeExperts: experts=8, hidden=32, ffn=16, "
                      "ranks=2, planner=lrmoe, rate=1.0, metric=lrm, select=sample)", text)
        self.assertNotIn("Qwen3MoeExperts()", text)
        for layer, orig, mod in zip(m.model.layers, origs, h.modules):
            self.assertIn("(experts): LRMoEExperts(", repr(layer.mlp))
            self.assertIs(layer.mlp.experts, mod)
            self.assertIsInstance(mod, lt.LRMoEExperts)
            self.assertIs(mod.original, orig)
            self.assertIs(mod.gate_up_proj, orig.gate_up_proj)
            self.assertEqual(mod.num_experts, orig.num_experts)  # the original's attributes
        self.assertEqual(list(m.state_dict()), keys0)
        self.assertEqual(list(dict(m.named_parameters())), list(params0))
        for n, p in m.named_parameters():
            self.assertIs(p, params0[n], n)
        # a training step through the patched module moves the shared parameters
        ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
        before = origs[0].down_proj.detach().clone()
        opt.zero_grad()
        m(ids, labels=ids).loss.backward()
        opt.step()
        self.assertFalse(torch.equal(origs[0].down_proj.detach(), before))
        sd = copy.deepcopy(m.state_dict())
        m.load_state_dict(sd, strict=True)  # the same keys load into the patched model
        self.assertEqual(lt.unpatch(m), 2)
        self.assertEqual(repr(m), text0)
        for layer, orig in zip(m.model.layers, origs):
            self.assertIs(layer.mlp.experts, orig)
        self.assertEqual(list(m.state_dict()), keys0)
        for n, p in m.named_parameters():
            self.assertIs(p, params0[n], n)
            self.assertTrue(p.is_contiguous(), n)
            self.assertTrue(torch.equal(p.detach(), sd[n]), n)
        h.unpatch()  # a second time: nothing left to do
        self.assertEqual(lt.unpatch(m), 0)

    def test_hooks_of_the_original_fire(self):
        blk = tiny.block("qwen3_moe")
        seen = []
        hk = blk.experts.register_forward_hook(lambda mod, a, out: seen.append(out.shape))
        with lt.patch(blk, rate=1.0, ranks=2) as h:
            self.assertIsInstance(blk.experts, lt.LRMoEExperts)
            blk(torch.randn(1, 5, tiny.D))
            self.assertEqual(seen, [torch.Size([5, tiny.D])])
            self.assertEqual(len(h.stats), 1)
        self.assertNotIsInstance(blk.experts, lt.LRMoEExperts)
        hk.remove()
        blk(torch.randn(1, 5, tiny.D))
        self.assertEqual(len(seen), 1)


class SavedTensors(unittest.TestCase):
    """The layer's backward state goes through ctx.save_for_backward."""

    def setUp(self):
        self.blk = tiny.block("qwen3_moe")
        self.h = lt.patch(self.blk, rate=0.75, ranks=2, select="topk")
        self.ex = self.blk.experts
        self.x, self.ids, self.w = routed()

    def grads(self, hooks=None):
        x = self.x.clone().requires_grad_(True)
        w = self.w.clone().requires_grad_(True)
        for p in self.ex.parameters():
            p.grad = None
        if hooks:
            with torch.autograd.graph.saved_tensors_hooks(*hooks):
                out = self.ex(x, self.ids, w)
        else:
            out = self.ex(x, self.ids, w)
        out.backward(torch.ones_like(out))
        return [out.detach(), x.grad, w.grad, self.ex.gate_up_proj.grad.clone(),
                self.ex.down_proj.grad.clone()]

    def test_inplace_input_detected(self):
        x = self.x.clone().requires_grad_(True)
        h = x * 1.0
        out = self.ex(h, self.ids, self.w)
        h.add_(1.0)  # the saved hidden changes between forward and backward
        with self.assertRaisesRegex(RuntimeError, "modified by an inplace operation"):
            out.sum().backward()

    def test_inplace_weight_detected(self):
        out = self.ex(self.x.requires_grad_(True), self.ids, self.w)
        with torch.no_grad():
            self.ex.down_proj.mul_(2.0)  # an optimizer step before the backward
        with self.assertRaisesRegex(RuntimeError, "modified by an inplace operation"):
            out.sum().backward()

    def test_saved_tensor_hooks(self):
        """Hooks that move every saved tensor out (an offload: the graph
        keeps an integer) and back: all of the layer's state goes through
        them, and the gradients are the same bits as without."""
        ref = self.grads()
        store, unpacked = {}, []

        def pack(t):
            store[len(store)] = t.clone()
            return len(store) - 1

        def unpack(k):
            unpacked.append(k)
            return store.pop(k)
        got = self.grads((pack, unpack))
        for a, b in zip(got, ref):
            self.assertTrue(torch.equal(a, b))
        # hidden, topk_weights, the two weights, ids and the forward's state
        # (cap_keep is None: not a tensor)
        self.assertEqual(len(unpacked), len(lt.SAVED) - 1)
        self.assertEqual(store, {})

    def test_saved_state(self):
        x = self.x.clone().requires_grad_(True)
        out = self.ex(x, self.ids, self.w)
        st = lt.saved_state(out)
        self.assertIs(st["hidden"], x)
        self.assertIs(st["rec"], self.h.stats[-1])
        self.assertEqual(tuple(st["saved_gate"].shape), (T, tiny.K, tiny.F))
        out.sum().backward()
        self.assertEqual(int(st["quota"].sum()), self.h.stats[-1]["kept"])
        with self.assertRaisesRegex(lrmoe.Error, "not the output of a patched experts call"):
            lt.saved_state(x * 2)


def swiglu_f64(x, ids, w, gu, dn):
    """The patched layer's math in float64 autograd: sum_k w_tk
    (silu(x Wg^T) * (x Wu^T)) Wd^T over the routed experts."""
    F = dn.shape[2]
    out = torch.zeros_like(x)
    for k in range(ids.shape[1]):
        h = torch.einsum("td,tfd->tf", x, gu[ids[:, k]])
        y = torch.einsum("tf,tdf->td", torch.nn.functional.silu(h[:, :F]) * h[:, F:],
                         dn[ids[:, k]])
        out = out + w[:, k, None] * y
    return out


class GradCheck(unittest.TestCase):
    """A tiny layer (E=4, D=6, F=3, K=2, T=5, 2 ranks, rate 1: every pair
    kept, so the backward is the exact gradient; below rate 1 it is the
    estimate by design) against finite differences."""

    def setUp(self):
        self.blk = tiny.block("qwen3_moe", hidden_size=6, moe_intermediate_size=3,
                              num_experts=4)
        self.h = lt.patch(self.blk, rate=1.0, ranks=2, threads=1)
        self.ex = self.blk.experts
        self.x, self.ids, self.w = routed(E=4, K=2, D=6, T=5, seed=4)

    def f(self, x, w, gu, dn):
        return torch.func.functional_call(self.ex, {"gate_up_proj": gu, "down_proj": dn},
                                          (x, self.ids, w))

    def inputs(self):
        return tuple(t.detach().clone().requires_grad_(True) for t in
                     (self.x, self.w, self.ex.gate_up_proj, self.ex.down_proj))

    def test_gradcheck_f32(self):
        # liblrmoe computes in F32 or BF16, not F64: gradcheck runs in F32.
        # Central differences in F32 with eps=1e-3 err by rounding about
        # u*|f|*sqrt(D)/eps ~ 6e-8*3*2.5/1e-3 ~ 5e-4 at most here (outputs
        # |f| <~ 3) and by truncation eps^2/6*|f'''| ~ 1e-6: atol 2e-3 with
        # rtol 1e-2 is above that and far below the errors of a wrong
        # gradient (a missing term, a swapped weight: O(0.1..1)). The
        # float64 reference below checks the same gradients at 1e-5.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "not a double precision" input warning
            self.assertTrue(torch.autograd.gradcheck(self.f, self.inputs(), eps=1e-3,
                                                     atol=2e-3, rtol=1e-2))
        self.assertGreater(len(self.h.stats), 200)  # each perturbation ran the layer

    def test_f64_reference(self):
        a = self.inputs()
        b = tuple(t.detach().double().requires_grad_(True) for t in a)
        out = self.f(*a)
        ref = swiglu_f64(b[0], self.ids, b[1], b[2], b[3])
        self.assertLess(rel(out, ref), 1e-6)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
        ga = torch.autograd.grad(out, a, g)
        gb = torch.autograd.grad(ref, b, g.double())
        for n, u, v in zip(("hidden", "topk_weights", "gate_up_proj", "down_proj"), ga, gb):
            self.assertLess(rel(u, v), 1e-5, n)


@unittest.skipUnless(lt.CUSTOM_OPS, "torch.library.custom_op needs torch >= 2.4 (installed: "
                     + torch.__version__ + "): torch.compile breaks the graph at the layer")
class Compile(unittest.TestCase):
    """torch.ops.lrmoe.* with fake kernels and an autograd formula: the
    opcheck of torch.library, and torch.compile(fullgraph=True) of a
    patched tiny causal LM (backend aot_eager: inductor took 151 s on this
    2-core machine, above the suite's 60 s per test) to eager's loss and
    gradients over two training steps: rate 1, rate 0.7 sampled, and the
    capacity planner (its keep mask is the op lrmoe::capacity_keep)."""

    def test_opcheck(self):
        blk = tiny.block("qwen3_moe")
        h = lt.patch(blk, rate=1.0, ranks=2)
        x, ids, w = routed()
        args = (x.requires_grad_(True), w.requires_grad_(True), blk.experts.gate_up_proj,
                blk.experts.down_proj, ids, None, h.modules[0].handle, True)
        # schema, autograd registration and fake kernel; not opcheck's
        # test_aot_dispatch_dynamic, which compares two calls: each call is a
        # new step of the layer (meta[0], the seed of the sampled selection),
        # so two calls differ there by design. test_compile_fullgraph runs
        # the ops under AOTAutograd end to end.
        torch.library.opcheck(torch.ops.lrmoe.experts_forward.default, args,
                              test_utils=("test_schema", "test_autograd_registration",
                                          "test_faketensor"))

    def test_compile_fullgraph(self):
        for kw in (dict(rate=1.0), dict(rate=0.7, select="sample"),
                   dict(planner="capacity", capacity_factor=1.0)):
            with self.subTest(str(kw)):
                self.compiled_like_eager(**kw)

    def compiled_like_eager(self, **kw):
        m0 = tiny.model("qwen3_moe", seed=3, use_cache=False)
        m1 = copy.deepcopy(m0)
        h0 = lt.patch(m0, ranks=2, **kw)
        h1 = lt.patch(m1, ranks=2, **kw)
        c1 = torch.compile(m1, fullgraph=True, backend="aot_eager")
        o0 = torch.optim.SGD(m0.parameters(), lr=0.5)
        o1 = torch.optim.SGD(m1.parameters(), lr=0.5)
        ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(5))
        for step in range(2):
            l0 = m0(ids, labels=ids).loss
            l0.backward()
            l1 = c1(ids, labels=ids).loss
            l1.backward()
            self.assertLess(abs(l1.item() - l0.item()) / abs(l0.item()), 1e-6, step)
            for (n, p), q in zip(m0.named_parameters(), m1.parameters()):
                self.assertLess(rel(q.grad, p.grad), 1e-6, f"step {step}: {n}")
            o0.step()
            o1.step()
            o0.zero_grad()
            o1.zero_grad()
        # the compiled model ran the layer in liblrmoe, forward and backward
        self.assertEqual([r["step"] for r in h1.stats], [0, 0, 1, 1])
        self.assertEqual([r["kept"] for r in h1.stats], [r["kept"] for r in h0.stats])
        if kw.get("rate", 1.0) < 1 or "capacity_factor" in kw:
            self.assertLess(h1.stats[0]["kept"], h1.stats[0]["pairs"])  # pairs dropped

    def test_without_ops_the_graph_breaks(self):
        """The autograd.Function path (torch < 2.4) gives the same bits in
        eager mode, and torch.compile(fullgraph=True) refuses it: the
        registration is what keeps the graph whole."""
        blk = tiny.block("qwen3_moe")
        lt.patch(blk, rate=1.0, ranks=2)
        x = torch.randn(1, T, tiny.D)

        def run():
            xx = x.clone().requires_grad_(True)
            out = blk(xx)
            out.sum().backward()
            return out.detach(), xx.grad
        ref = run()
        saved = lt._FWD, lt._BWD, lt._CAP
        lt._FWD, lt._BWD, lt._CAP = (lt._ExpertsFunction.apply, lt.experts_backward,
                                     lt.capacity_keep)  # as where custom_op is missing
        try:
            got = run()
            self.assertTrue(torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]))
            torch._dynamo.reset()
            with self.assertRaises(Exception) as e:
                torch.compile(blk, fullgraph=True, backend="aot_eager")(x)
            self.assertNotIsInstance(e.exception, lrmoe.Error)
        finally:
            lt._FWD, lt._BWD, lt._CAP = saved
            torch._dynamo.reset()


class TypeHints(unittest.TestCase):
    """The public API carries type hints and the package ships py.typed."""

    def test_annotated(self):
        import lrmoe.torch
        missing = []
        for mod, names in ((lrmoe, lrmoe.__all__),
                           (lrmoe.torch, ["dump", "Dump", "patch", "Patch", "unpatch",
                                          "LRMoEExperts", "budget", "find_blocks",
                                          "weights_frame", "saved_state", "experts_forward",
                                          "experts_backward", "capacity_keep", "register",
                                          "unregister", "register_torchtitan", "register_megatron",
                                          "Adapter", "MegatronAdapter"])):
            for n in names:
                obj = getattr(mod, n)
                fns = [obj] if inspect.isfunction(obj) else [
                    f for k, f in vars(obj).items() if inspect.isfunction(f) and
                    (not k.startswith("_") or k == "__init__")] if inspect.isclass(obj) else []
                for f in fns:
                    sig = inspect.signature(f)
                    for p in sig.parameters.values():
                        if p.name != "self" and p.annotation is inspect.Parameter.empty:
                            missing.append(f"{n}.{f.__name__}({p.name})")
                    if sig.return_annotation is inspect.Signature.empty:
                        missing.append(f"{n}.{f.__name__} -> ?")
        self.assertEqual(missing, [])
        self.assertTrue(os.path.isfile(os.path.join(os.path.dirname(lrmoe.__file__),
                                                    "py.typed")))


if __name__ == "__main__":
    unittest.main()
