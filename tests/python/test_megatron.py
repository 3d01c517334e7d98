"""lrmoe.torch.register_megatron: Megatron-Core's MoELayer (megatron-core on
PyPI, SequentialMLP experts, allgather dispatcher, no model parallelism:
parallel_state over a one-process gloo group) built on the CPU, patched.

The reference is Megatron's own forward and backward on the CPU. Its only
GPU-bound step is TopKRouter.gating, which moves the router weight to
torch.cuda.current_device() and (without Transformer Engine) ends in a
NameError on te_general_gemm; the reference replaces that one method by its
non-TE formula, x @ router.weight^T in F32 (what Megatron runs when the
names resolve). Routing (topk_routing_with_score_function), the dispatcher,
SequentialMLP's experts and the shared experts are Megatron's. A router with
moe_router_enable_expert_bias cannot be built on the CPU (its buffers are
made on torch.cuda.current_device()): that case sets the same three
attributes on a CPU router (enable_expert_bias, expert_bias,
local_tokens_per_expert), which Megatron's routing then reads as it would.

Patched at rate 1 the layer equals Megatron's (1e-6 of the largest
magnitude: output, input gradient, every parameter's gradient, the expert
bias load); at rate < 1 it equals the plain-torch drop reference built from
the layer's weights and Megatron's routing probabilities (checked to equal
Megatron's forward when nothing is dropped). Conventions lrmoe cannot map
are refused, naming the config field."""
import os
import tempfile
import types
import unittest
import warnings

import torch
import torch.nn.functional as Fn

import tiny  # noqa: F401  (sys.path and LRMOE_LIBRARY)
import lrmoe
import lrmoe.torch as lt

warnings.filterwarnings("ignore")
import torch.distributed as dist  # noqa: E402
from megatron.core import parallel_state as ps  # noqa: E402
from megatron.core.tensor_parallel.layers import (ColumnParallelLinear,  # noqa: E402
                                                  RowParallelLinear)
from megatron.core.transformer.mlp import MLPSubmodules  # noqa: E402
from megatron.core.transformer.moe.experts import SequentialMLP  # noqa: E402
from megatron.core.transformer.moe.moe_layer import MoELayer, MoESubmodules  # noqa: E402
from megatron.core.transformer.moe.shared_experts import SharedExpertMLP  # noqa: E402
from megatron.core.transformer.spec_utils import ModuleSpec  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

from test_register import _pairs, rel  # noqa: E402

E, D, F = 8, 32, 16
S, B = 20, 2
T = S * B
_TMP = tempfile.TemporaryDirectory()


def setUpModule():
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(_TMP.name, "pg"), 1),
                            rank=0, world_size=1)
    ps.initialize_model_parallel()
    lt.register_megatron()


def tearDownModule():
    lt.unregister(MoELayer)
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    _TMP.cleanup()


def config(**over):
    kw = dict(num_layers=1, hidden_size=D, num_attention_heads=2, ffn_hidden_size=F,
              moe_ffn_hidden_size=F, num_moe_experts=E, moe_router_topk=2,
              gated_linear_unit=True, activation_func=Fn.silu, use_cpu_initialization=True,
              add_bias_linear=False, bias_activation_fusion=False,
              moe_token_dispatcher_type="allgather", moe_router_dtype="fp32")
    kw.update(over)
    return TransformerConfig(**kw)


def _gating(self, inp):
    """TopKRouter.gating's non-Transformer-Engine formula, on the CPU."""
    return torch.mm(inp.reshape(-1, inp.shape[-1]).float(),
                    self.weight.float().t()).view(*inp.shape[:-1], -1)


def build(seed=0, bias=False, **over):
    """A Megatron MoELayer on the CPU, weights ~ N(0, 0.3^2) from seed."""
    cfg = config(**over)
    shared = ModuleSpec(module=SharedExpertMLP, submodules=MLPSubmodules(
        linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear))
    sub = MoESubmodules(experts=ModuleSpec(module=SequentialMLP, submodules=MLPSubmodules(
        linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)),
        shared_experts=shared if cfg.moe_shared_expert_intermediate_size else None)
    m = MoELayer(cfg, sub)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    if bias:  # what moe_router_enable_expert_bias builds on the GPU
        r = m.router
        r.enable_expert_bias = True
        del r.local_tokens_per_expert, r.expert_bias  # None attributes on a CPU build
        r.register_buffer("local_tokens_per_expert", torch.zeros(E), persistent=False)
        r.register_buffer("expert_bias", torch.randn(E, generator=g) * 0.1)
    return m


def reference(m):
    """m runs Megatron's own forward on the CPU (gating without the GPU move)."""
    m.router.gating = types.MethodType(_gating, m.router)
    return m


def untied(m, seed=7):
    """An input whose selection scores have no tie among each token's K+1 best."""
    K = m.config.moe_router_topk
    eb = getattr(m.router, "expert_bias", None)
    while True:
        torch.manual_seed(seed)
        x = torch.randn(S, B, D)
        s = x.reshape(-1, D) @ m.router.weight.t()
        if m.config.moe_router_score_function == "sigmoid":
            s = torch.sigmoid(s).double() + (0 if eb is None else eb.double())
        top = s.topk(K + 1, dim=-1).values
        if (top[:, :-1] - top[:, 1:]).min() > 1e-6:
            return x
        seed += 1


def run(m, x, **kw):
    x = x.clone().requires_grad_(True)
    out, bias = m(x, **kw)
    assert bias is None
    torch.manual_seed(123)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    return out.detach(), x.grad.clone(), grads


def drop_reference(m, x, ids, keep=None, pw=None):
    """Plain torch from m's weights: the pairs (T,K) of ids, weighted by
    Megatron's routing probabilities (router.routing of the logits), the
    dropped pairs sending no gradient into the experts and the input."""
    x = x.clone().requires_grad_(True)
    x2 = x.reshape(-1, D)
    logits = (x2 @ m.router.weight.t()).view(S, B, E)
    probs, rmap = m.router.routing(logits)
    assert torch.equal(rmap, torch.zeros_like(rmap).scatter(1, ids, True)), "routing set"
    w = probs.gather(1, ids)
    y = []
    for k in range(ids.shape[1]):
        fc1 = torch.stack([m.experts.local_experts[e].linear_fc1.weight for e in range(E)])
        fc2 = torch.stack([m.experts.local_experts[e].linear_fc2.weight for e in range(E)])
        a, b = fc1[ids[:, k]], fc2[ids[:, k]]
        h = torch.einsum("tfd,td->tf", a, x2)
        h = Fn.silu(h[:, :F]) * h[:, F:]
        y.append(torch.einsum("tdf,tf->td", b, h))
    y = _pairs(torch.stack(y, 1), keep, pw)
    out = (y * w[..., None]).sum(1)
    if m.shared_experts is not None:
        out = out + m.shared_experts(x2)
    out = out.reshape(S, B, D)
    torch.manual_seed(123)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    return out.detach(), x.grad.clone(), grads


CASES = [
    # Mixtral-like: top-K of the logits, softmax over the K
    dict(),
    # Qwen2-MoE-like: softmax over E, top-K, scaled; gated shared experts
    dict(moe_router_pre_softmax=True, moe_router_topk_scaling_factor=2.0,
         moe_shared_expert_intermediate_size=2 * F, moe_shared_expert_gate=True),
    # DeepSeek-V3-like: sigmoid, expert bias, 4 groups keep 2, K=4, scaled
    dict(moe_router_score_function="sigmoid", moe_router_topk=4, moe_router_num_groups=4,
         moe_router_group_topk=2, moe_router_topk_scaling_factor=2.5, bias=True,
         moe_shared_expert_intermediate_size=F),
    # sigmoid, K=1: not renormalised
    dict(moe_router_score_function="sigmoid", moe_router_topk=1),
]


def _ids(m, x):
    ad = lt.adapters.lookup(type(m))
    logits = x.reshape(-1, D) @ m.router.weight.t()
    return ad.route_pairs(m, logits.detach())[0]


class Rate1(unittest.TestCase):
    """patch(rate=1.0) equals Megatron's own forward/backward on the CPU."""

    def test_rate1(self):
        for kw in CASES:
            with self.subTest(str(kw)):
                ref, pat = reference(build(**kw)), build(**kw)
                keys = list(pat.state_dict())
                h = lt.patch(pat, rate=1.0, ranks=2)
                self.assertIn("LRMoEExperts", repr(pat))
                self.assertEqual(list(pat.state_dict()), keys)
                x = untied(ref)
                # padding_mask ([B,S], True: padding) leaves a token out of
                # the expert-bias load only (Megatron 0.16.1's own
                # _apply_expert_bias fails on it: [T,E] & [T] do not
                # broadcast; its reference runs without the mask)
                pad = torch.zeros(B, S, dtype=torch.bool)
                pad[1, -3:] = True
                o0, gx0, g0 = run(ref, x, **({} if kw.get("bias") else dict(padding_mask=pad)))
                o1, gx1, g1 = run(pat, x, padding_mask=pad)
                self.assertLess(rel(o1, o0), 1e-6, "output")
                self.assertLess(rel(gx1, gx0), 1e-6, "grad hidden")
                self.assertEqual(sorted(g0), sorted(g1))
                for n in g0:
                    self.assertLess(rel(g1[n], g0[n]), 1e-6, f"grad {n}")
                K = pat.config.moe_router_topk
                rec = h.stats[-1]
                self.assertEqual((rec["rho"], rec["kept"], rec["pairs"]), (1.0, T * K, T * K))
                if kw.get("bias"):
                    ids = _ids(pat, x)
                    load = ref.router.local_tokens_per_expert
                    self.assertTrue(torch.equal(load, torch.bincount(ids.reshape(-1),
                                                                     minlength=E).float()))
                    kept = ids[~pad.t().reshape(-1)]
                    self.assertTrue(torch.equal(pat.router.local_tokens_per_expert,
                                                torch.bincount(kept.reshape(-1),
                                                               minlength=E).float()))
                    self.assertEqual(int(pat.router.local_tokens_per_expert.sum()), (T - 3) * K)
                # the drop reference with nothing dropped is Megatron's layer
                ref.zero_grad()
                o2, gx2, g2 = drop_reference(ref, x, _ids(pat, x))
                self.assertLess(rel(o2, o0), 1e-6, "drop reference output")
                self.assertLess(rel(gx2, gx0), 1e-6, "drop reference grad hidden")
                h.unpatch()
                self.assertNotIn("forward", vars(pat))


class Drop(unittest.TestCase):
    """rate < 1: equals the plain-torch drop reference (lrmoe's keep mask)."""

    def test_drop(self):
        for select in ("topk", "sample"):
            for kw in CASES:
                with self.subTest(f"{select} {kw}"):
                    ref, pat = build(**kw), build(**kw)
                    h = lt.patch(pat, rate=0.6, ranks=2, keep_masks=True, select=select)
                    x = untied(ref, seed=9)
                    o1, gx1, g1 = run(pat, x)
                    rec = h.stats[-1]
                    self.assertLess(rec["kept"], rec["pairs"])
                    ids = _ids(pat, x)
                    o0, gx0, g0 = drop_reference(ref, x, ids, rec["keep"],
                                                 rec.get("pair_weight"))
                    self.assertLess(rel(o1, o0), 1e-6)
                    self.assertLess(rel(gx1, gx0), 1e-6)
                    for n in g0:
                        self.assertLess(rel(g1[n], g0[n]), 1e-6, f"grad {n}")
                    _, gxf, _ = drop_reference(build(**kw), x, ids)  # the drop is real
                    self.assertGreater(rel(gx1, gxf), 1e-3)


class Refused(unittest.TestCase):
    """What lrmoe cannot map raises lrmoe.Error naming the config field."""

    def err(self, m, *words):
        with self.assertRaises(lrmoe.Error) as e:
            lt.patch(m, rate=1.0)
        for w in words:
            self.assertIn(w, str(e.exception))
        self.assertNotIn("forward", vars(m))

    def test_refused(self):
        for field, value in (("moe_aux_loss_coeff", 0.01), ("moe_z_loss_coeff", 1e-3),
                             ("moe_router_dtype", "fp64"), ("activation_func", Fn.gelu),
                             ("moe_apply_probs_on_input", True),
                             ("moe_expert_capacity_factor", 1.0),
                             ("moe_input_jitter_eps", 0.01)):
            with self.subTest(field):
                m = build()
                setattr(m.config, field, value)
                self.err(m, f"config.{field}=")

    def test_groups(self):
        m = build(moe_router_score_function="sigmoid", moe_router_topk=2,
                  moe_router_num_groups=4, moe_router_group_topk=2)
        self.err(m, "moe_router_group_topk=2", "moe_router_topk=2")
        m = build(moe_router_topk=4, moe_router_num_groups=4, moe_router_group_topk=2)
        self.err(m, "moe_router_group_topk=2", "'softmax'")

    def test_not_sequential(self):
        m = build()
        m.experts = torch.nn.Module()  # GroupedMLP's place: not buildable here
        self.err(m, "not SequentialMLP", "moe_grouped_gemm")


class Dump(tiny.TmpDirCase):
    """dump() of Megatron's layer records the router logits (Megatron's
    router returns probabilities; the hook recomputes x W^T)."""

    def test_dump(self):
        m = reference(build())
        out, wp = self.p("m.lrmoe"), self.p("w.lrmoe")
        x = untied(m)
        with lt.dump(m, out, weights=wp) as d:
            run(m, x)
        self.assertEqual(d.frames, 1)
        f = lrmoe.read(out)[0]
        self.assertTrue(torch.allclose(torch.from_numpy(f["router_logits"]),
                                       x.reshape(-1, D) @ m.router.weight.t().detach(),
                                       rtol=0, atol=1e-6))
        w = lrmoe.read(wp)[0]
        fc1 = torch.stack([e.linear_fc1.weight for e in m.experts.local_experts]).detach()
        self.assertTrue(torch.equal(torch.from_numpy(w["w_gate"]), fc1[:, :F]))
        self.assertTrue(torch.equal(torch.from_numpy(w["w_up"]), fc1[:, F:]))


if __name__ == "__main__":
    unittest.main()
