"""lrmoe.torch.register: MoE blocks that are not Hugging Face's, patched and
dumped through an adapter. Two reference blocks written here in plain torch:
a torchtitan-style MoE (TokenChoiceTopKRouter, GroupedExperts with w1/w3
(E,F,D) and w2 (E,D,F) run over expert-sorted tokens, a shared FeedForward,
load-balancing expert_bias) and a custom block whose experts are stored
transposed (per-expert [D,F] matrices used as x @ W). Patched, they equal
plain torch autograd at rate 1 (1e-6 relative) and the plain-torch drop
reference at rate < 1; dump() writes their frames and weights; bad
registrations raise lrmoe.Error naming what is wrong."""
import copy
import os
import unittest

import numpy as np
import torch
import torch.nn.functional as Fn
from torch import nn

import tiny
import lrmoe
import lrmoe.torch as lt

E, K, D, F = 8, 2, 32, 16
T = 40


def _pairs(y, keep, pw):
    """Per-pair outputs y (T,K,D) as the drop reference sees them: a dropped
    pair (keep False) keeps its value but sends no gradient into the experts
    or the input; a kept pair's gradient is scaled by pw (its pair_weight)."""
    if keep is None:
        return y
    m = torch.as_tensor(keep)[..., None]
    ys = y
    if pw is not None:
        ys = y * torch.as_tensor(pw)[..., None].to(y.dtype)
        ys = ys + (y - ys).detach()
    return torch.where(m, ys, y.detach())


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(Fn.silu(self.w1(x)) * self.w3(x))


class GroupedExperts(nn.Module):
    """torchtitan's layout: w1, w3 (E,F,D), w2 (E,D,F); tokens sorted by expert."""

    def __init__(self, dim, hidden, n):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(n, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(n, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(n, hidden, dim))

    def forward(self, x, counts):
        outs = []
        for e, xe in enumerate(torch.split(x, counts.tolist())):
            h = Fn.silu(xe @ self.w1[e].T) * (xe @ self.w3[e].T)
            outs.append(h @ self.w2[e].T)
        return torch.cat(outs)


class TokenChoiceTopKRouter(nn.Module):
    def __init__(self, dim, n, top_k, score_func, route_norm, route_scale):
        super().__init__()
        self.gate = nn.Linear(dim, n, bias=False)
        self.num_experts, self.top_k, self.score_func = n, top_k, score_func
        self.route_norm, self.route_scale = route_norm, route_scale

    def forward(self, x, expert_bias=None):
        s = self.gate(x).float()
        s = torch.sigmoid(s) if self.score_func == "sigmoid" else Fn.softmax(s, dim=1)
        if expert_bias is not None:
            _, ids = torch.topk(s + expert_bias, self.top_k, dim=1)
            top = s.gather(1, ids)
        else:
            top, ids = torch.topk(s, self.top_k, dim=1)
        if self.route_norm:
            top = top / (top.sum(-1, keepdim=True) + 1e-20)
        top = top * self.route_scale
        counts = torch.bincount(ids.view(-1), minlength=self.num_experts)
        return top, ids, counts


class TitanMoE(nn.Module):
    """A torchtitan-style MoE block (score after the experts)."""

    def __init__(self, score_func="sigmoid", route_norm=True, route_scale=2.5, bias=True,
                 score_before_experts=False):
        super().__init__()
        self.experts = GroupedExperts(D, F, E)
        self.router = TokenChoiceTopKRouter(D, E, K, score_func, route_norm, route_scale)
        self.shared_experts = FeedForward(D, F)
        self.score_before_experts = score_before_experts
        if bias:
            self.register_buffer("expert_bias", torch.zeros(E))
        else:
            self.expert_bias = None
        self.register_buffer("tokens_per_expert", torch.zeros(E), persistent=False)
        self.keep = self.pw = None  # the drop reference's mask (T,K) and pair weights

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        top, ids, counts = self.router(x, self.expert_bias)
        with torch.no_grad():
            self.tokens_per_expert.add_(counts)
        order = torch.argsort(ids.view(-1), stable=True)
        ys = self.experts(x[order // K], counts)
        y = torch.empty_like(ys)
        y[order] = ys
        y = _pairs(y.view(-1, K, shape[-1]), self.keep, self.pw)
        out = (y * top[..., None].to(y.dtype)).sum(1)
        return (out + self.shared_experts(x)).reshape(shape)


class TExperts(nn.Module):
    """Experts stored transposed: gate, up (E,D,F), down (E,F,D), x @ W."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Parameter(torch.empty(E, D, F))
        self.up = nn.Parameter(torch.empty(E, D, F))
        self.down = nn.Parameter(torch.empty(E, F, D))


class CustomMoE(nn.Module):
    """softmax over E, top-K, renormalised (Qwen3's convention), a shared MLP."""

    def __init__(self):
        super().__init__()
        self.router = nn.Linear(D, E, bias=False)
        self.experts = TExperts()
        self.shared = FeedForward(D, 24)
        self.top_k = K
        self.keep = self.pw = None

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        p = Fn.softmax(self.router(x).float(), dim=-1)
        w, ids = torch.topk(p, self.top_k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        ex = self.experts
        y = torch.stack([(Fn.silu(torch.einsum("td,tdf->tf", x, ex.gate[ids[:, k]])) *
                          torch.einsum("td,tdf->tf", x, ex.up[ids[:, k]])).unsqueeze(1)
                         .bmm(ex.down[ids[:, k]]).squeeze(1) for k in range(self.top_k)], 1)
        y = _pairs(y, self.keep, self.pw)
        out = (y * w[..., None].to(y.dtype)).sum(1)
        return (out + self.shared(x)).reshape(shape)


STORED = {"fused": {"gate_up": (E, 2 * F, D), "down": (E, D, F)},
          "fused_t": {"gate_up": (E, D, 2 * F), "down": (E, F, D)},
          "separate": {"wg": (E, F, D), "wu": (E, F, D), "wd": (E, D, F)},
          "separate_t": {"wg": (E, D, F), "wu": (E, D, F), "wd": (E, F, D)}}


class LayoutMoE(nn.Module):
    """Experts stored in one of the four layouts; the reference reads W_gate,
    W_up (E,F,D) and W_down (E,D,F) out of them in plain torch. Routing:
    softmax + renorm, or DeepSeek-V3's sigmoid with a selection-only bias,
    limited to the 2 best of 4 groups (group score: sum of its two best),
    renormalised and scaled by 2.5."""
    layout, route = "fused", "softmax"

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(D, E, bias=False)
        self.experts = nn.Module()
        for n, sh in STORED[self.layout].items():
            setattr(self.experts, n, nn.Parameter(torch.empty(sh)))
        self.register_buffer("bias", torch.zeros(E))
        self.keep = self.pw = None

    def mats(self):
        ex, lay = self.experts, self.layout
        if lay.startswith("fused"):
            gu = ex.gate_up.transpose(1, 2) if lay == "fused_t" else ex.gate_up
            dn = ex.down.transpose(1, 2) if lay == "fused_t" else ex.down
            return gu[:, :F], gu[:, F:], dn
        t = (lambda w: w.transpose(1, 2)) if lay == "separate_t" else (lambda w: w)
        return t(ex.wg), t(ex.wu), t(ex.wd)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        lg = self.gate(x).float()
        if self.route == "softmax":
            p = Fn.softmax(lg, dim=-1)
            w, ids = torch.topk(p, K, dim=-1)
            w = w / w.sum(-1, keepdim=True)
        else:
            s = torch.sigmoid(lg)
            c = (s + self.bias).detach()
            g = c.view(-1, 4, E // 4).topk(2, dim=-1).values.sum(-1)
            gm = torch.zeros_like(g).scatter_(1, g.topk(2, dim=-1).indices, 1.0)
            c = c.masked_fill(gm.repeat_interleave(E // 4, 1) == 0, float("-inf"))
            ids = c.topk(K, dim=-1).indices
            w = s.gather(1, ids)
            w = w / (w.sum(-1, keepdim=True) + 1e-20) * 2.5
        wg, wu, wd = self.mats()
        y = torch.stack([torch.einsum("tf,tdf->td", Fn.silu(torch.einsum("td,tfd->tf", x,
                                                                         wg[ids[:, k]])) *
                                      torch.einsum("td,tfd->tf", x, wu[ids[:, k]]),
                                      wd[ids[:, k]]) for k in range(K)], 1)
        y = _pairs(y, self.keep, self.pw)
        return (y * w[..., None].to(y.dtype)).sum(1).reshape(shape)


LAYOUT_CLASSES = {}
for _lay in STORED:
    for _rt in ("softmax", "sigmoid"):
        LAYOUT_CLASSES[_lay, _rt] = type(f"LayoutMoE_{_lay}_{_rt}", (LayoutMoE,),
                                         {"layout": _lay, "route": _rt})


def build_layout(layout, route, seed=0):
    torch.manual_seed(seed)
    b = LAYOUT_CLASSES[layout, route]()
    with torch.no_grad():
        for p in b.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        b.bias.copy_(torch.randn(E) * 0.1)
    return b


class MixtralV4MoE(nn.Module):
    """transformers 4's Mixtral block: experts an nn.ModuleList of w1 (gate),
    w3 (up), w2 (down) nn.Linear; top-K of the logits, softmax over them."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(D, E, bias=False)
        self.experts = nn.ModuleList(FeedForward(D, F) for _ in range(E))
        self.keep = self.pw = None

    def pairs(self, x, ids):
        y = x.new_zeros(x.shape[0], K, D)
        for e, m in enumerate(self.experts):
            t, k = torch.nonzero(ids == e, as_tuple=True)
            if len(t):
                y = y.index_put((t, k), m(x[t]))
        return y

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        lg, ids = torch.topk(self.gate(x).float(), K, dim=-1)
        w = Fn.softmax(lg, dim=-1)
        y = _pairs(self.pairs(x, ids), self.keep, self.pw)
        return (y * w[..., None].to(y.dtype)).sum(1).reshape(shape)


class GLUExpert(nn.Module):
    """Megatron-Core's SequentialMLP expert: linear_fc1 (2F,D) = [gate; up]."""

    def __init__(self):
        super().__init__()
        self.linear_fc1 = nn.Linear(D, 2 * F, bias=False)
        self.linear_fc2 = nn.Linear(F, D, bias=False)

    def forward(self, x):
        g, u = torch.chunk(self.linear_fc1(x), 2, dim=-1)
        return self.linear_fc2(Fn.silu(g) * u)


class SequentialMoE(MixtralV4MoE):
    """Megatron-Core-style: experts.local_experts[e] GLU experts, softmax over
    E then top-K, not renormalised (Qwen2-MoE/OLMoE's convention)."""

    def __init__(self):
        super().__init__()
        self.experts = nn.Module()
        self.experts.local_experts = nn.ModuleList(GLUExpert() for _ in range(E))

    def pairs(self, x, ids):
        y = x.new_zeros(x.shape[0], K, D)
        for e, m in enumerate(self.experts.local_experts):
            t, k = torch.nonzero(ids == e, as_tuple=True)
            if len(t):
                y = y.index_put((t, k), m(x[t]))
        return y

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        w, ids = torch.topk(Fn.softmax(self.gate(x).float(), dim=-1), K, dim=-1)
        y = _pairs(self.pairs(x, ids), self.keep, self.pw)
        return (y * w[..., None].to(y.dtype)).sum(1).reshape(shape)


def build(kind, seed=0, dtype=torch.float32, **kw):
    torch.manual_seed(seed)
    b = {"titan": TitanMoE, "custom": CustomMoE, "mixtral4": MixtralV4MoE,
         "sequential": SequentialMoE}[kind](**kw)
    with torch.no_grad():
        for n, p in b.named_parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        if getattr(b, "expert_bias", None) is not None:
            b.expert_bias.copy_(torch.randn(E) * 0.1)
    return b.to(dtype)


def setUpModule():
    for (lay, rt), cls in LAYOUT_CLASSES.items():
        w = None if lay.startswith("fused") else {"gate": "wg", "up": "wu", "down": "wd"}
        if lay.startswith("fused"):
            w = {"gate_up": "gate_up", "down": "down"}
        opts = dict(renorm=True) if rt == "softmax" else dict(
            renorm=True, scale=2.5, groups=4, topk_groups=2, expert_bias="bias")
        lt.register(cls, layout=lay, weights=w, router="gate", route=rt, k=K, **opts)
    lt.register_torchtitan(TitanMoE)
    lt.register(MixtralV4MoE, layout="per_expert", router="gate", route="topk-softmax", k=K,
                weights={"gate": "{e}.w1.weight", "up": "{e}.w3.weight",
                         "down": "{e}.w2.weight"})
    lt.register(SequentialMoE, layout="per_expert_fused", router="gate", route="softmax", k=K)
    lt.register(CustomMoE, experts="experts", layout="separate_t",
                weights={"gate": "gate", "up": "up", "down": "down"}, router="router",
                route="softmax", k="top_k", renorm=True, shared="shared")


def tearDownModule():
    for cls in LAYOUT_CLASSES.values():
        lt.unregister(cls)
    for cls in (TitanMoE, CustomMoE, MixtralV4MoE, SequentialMoE):
        lt.unregister(cls)


def untied(blk, dtype, seed=7):
    """An input whose router scores have no tie among each token's K+1 best
    (bfloat16 logits tie often; ties may be broken either way)."""
    r = blk.router.gate if isinstance(blk, TitanMoE) else getattr(blk, "router", None) or blk.gate
    bias = getattr(blk, "expert_bias", None)
    while True:
        torch.manual_seed(seed)
        x = torch.randn(2, T // 2, D).to(dtype)
        s = r(x.reshape(-1, D)).float()
        s = s if bias is None else torch.sigmoid(s).double() + bias.double()
        top = s.topk(K + 1, dim=-1).values
        if (top[:, :-1] - top[:, 1:]).min() > 0:
            return x
        seed += 1


def run(blk, x):
    x = x.clone().requires_grad_(True)
    out = blk(x)
    torch.manual_seed(123)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    grads = {n: p.grad.clone() for n, p in blk.named_parameters() if p.grad is not None}
    return out.detach(), x.grad.clone(), grads


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


CASES = [("titan", dict(score_func="sigmoid", route_norm=True, route_scale=2.5)),
         ("titan", dict(score_func="softmax", route_norm=False, route_scale=1.0, bias=False)),
         ("custom", {}), ("mixtral4", {}), ("sequential", {})]


class Rate1(unittest.TestCase):
    """patch(rate=1.0) of a registered block equals plain torch autograd:
    output, input gradient and every parameter's gradient (experts, router,
    shared experts) within 1e-6 of the largest magnitude."""

    def check(self, kind, kw, dtype=torch.float32, tol=1e-6, ranks=2):
        ref = build(kind, dtype=dtype, **kw)
        pat = copy.deepcopy(ref)
        keys = list(pat.state_dict())
        h = lt.patch(pat, rate=1.0, ranks=ranks)
        self.assertIn("LRMoEExperts", repr(pat))
        self.assertEqual(list(pat.state_dict()), keys)
        x = untied(ref, dtype)
        o0, gx0, g0 = run(ref, x)
        o1, gx1, g1 = run(pat, x)
        self.assertLess(rel(o1, o0), tol, "output")
        self.assertLess(rel(gx1, gx0), tol, "grad hidden")
        self.assertEqual(sorted(g0), sorted(g1))
        for n in g0:
            self.assertLess(rel(g1[n], g0[n]), tol, f"grad {n}")
        rec = h.stats[-1]
        self.assertEqual((rec["rho"], rec["kept"], rec["pairs"]), (1.0, T * K, T * K))
        for old, new in lt.UNIT_KEYS.items():  # unit-suffixed keys, the old as aliases
            self.assertEqual(rec[new], rec[old], new)
        self.assertTrue({"mem_peak_bytes", "t_comm_s", "fwd_s", "bwd_lib_cpu_s"} <= set(rec))
        if kind == "titan":  # the load accumulates as the block's own forward does
            self.assertTrue(torch.equal(pat.tokens_per_expert, ref.tokens_per_expert))
        h.unpatch()
        self.assertNotIn("forward", vars(pat))
        o2, _, _ = run(pat, x)
        self.assertTrue(torch.equal(o2, o0), "unpatch restores the block's forward")
        return h

    def test_f32(self):
        for kind, kw in CASES:
            with self.subTest(f"{kind} {kw}"):
                self.check(kind, kw)

    def test_bf16(self):
        for kind, kw in CASES:
            with self.subTest(f"{kind} {kw}"):
                self.check(kind, kw, torch.bfloat16, 2e-2, ranks=4)

    def test_packed_views(self):
        """float32: w1/w3/w2 (or the transposed gate/up/down) become views of
        lrmoe's packed buffer, and the steps run on it (no copy: a copy would
        have left the layer's adopted flag False)."""
        for kind, kw in CASES[::2] + [CASES[3]]:
            with self.subTest(kind):
                blk = build(kind, **kw)
                h = lt.patch(blk, rate=1.0, ranks=2)
                layer = h.layers[0]
                for p in blk.experts.parameters():
                    self.assertEqual(p.untyped_storage().data_ptr(), layer.w_f32.data_ptr())
                run(blk, torch.randn(2, T // 2, D))
                self.assertTrue(layer.adopted)
                buf = layer.w_f32.data_ptr()
                h.unpatch()
                for p in blk.experts.parameters():  # memory of their own again
                    self.assertTrue(p.is_contiguous())
                    self.assertNotEqual(p.untyped_storage().data_ptr(), buf)
                    self.assertEqual(p.untyped_storage().nbytes(), p.numel() * 4)


class Drop(unittest.TestCase):
    """rate < 1: the gradients equal the plain-torch reference in which the
    pairs lrmoe dropped (its keep mask) send no gradient into the experts
    and the input, while the forward and the routing weights' gradient see
    every pair; select="sample" scales each kept pair by its pair_weight."""

    def test_drop(self):
        for select in ("topk", "sample"):
            for kind, kw in CASES:
                with self.subTest(f"{select} {kind} {kw}"):
                    ref = build(kind, **kw)
                    pat = copy.deepcopy(ref)
                    h = lt.patch(pat, rate=0.6, ranks=2, keep_masks=True, select=select)
                    torch.manual_seed(9)
                    x = torch.randn(2, T // 2, D)
                    o1, gx1, g1 = run(pat, x)
                    rec = h.stats[-1]
                    self.assertLess(rec["kept"], rec["pairs"])
                    ref.keep = rec["keep"]
                    ref.pw = rec.get("pair_weight")
                    o0, gx0, g0 = run(ref, x)
                    self.assertLess(rel(o1, o0), 1e-6)
                    self.assertLess(rel(gx1, gx0), 1e-6)
                    for n in g0:
                        self.assertLess(rel(g1[n], g0[n]), 1e-6, f"grad {n}")
                    _, gxf, _ = run(build(kind, **kw), x)  # the drop is real
                    self.assertGreater(rel(gx1, gxf), 1e-3)


class Compile(unittest.TestCase):
    """torch.compile(fullgraph=True) keeps a patched route block in one
    graph (routing is the custom op torch.ops.lrmoe.route_topk) and gives
    eager's output and gradients."""

    def test_fullgraph(self):
        blk = build("titan")
        lt.patch(blk, rate=1.0, ranks=2)
        x = torch.randn(2, T // 2, D)
        e = run(blk, x)
        blk.zero_grad(set_to_none=True)
        torch._dynamo.reset()
        try:
            c = run(torch.compile(blk, fullgraph=True, backend="aot_eager"), x)
        finally:
            torch._dynamo.reset()
        self.assertTrue(torch.equal(c[0], e[0]) and torch.equal(c[1], e[1]))
        self.assertEqual(len(c[2]), len(e[2]))
        for n in e[2]:
            self.assertTrue(torch.equal(c[2]["_orig_mod." + n], e[2][n]), n)


class Layouts(unittest.TestCase):
    """Each of the four layouts, with softmax and group-limited sigmoid
    routing: rate 1 equals plain torch autograd (1e-6), rate 0.6 the drop
    reference (1e-6); float32 weights of every layout run on views of the
    packed buffer."""

    def test_layouts(self):
        for lay, rt in LAYOUT_CLASSES:
            for rate in (1.0, 0.6):
                with self.subTest(f"{lay} {rt} {rate}"):
                    ref = build_layout(lay, rt)
                    pat = copy.deepcopy(ref)
                    h = lt.patch(pat, rate=rate, ranks=2, keep_masks=True, select="topk")
                    torch.manual_seed(11)
                    x = torch.randn(2, T // 2, D)
                    o1, gx1, g1 = run(pat, x)
                    rec = h.stats[-1]
                    if rate < 1:
                        self.assertLess(rec["kept"], rec["pairs"])
                        ref.keep = rec["keep"]
                    o0, gx0, g0 = run(ref, x)
                    self.assertLess(rel(o1, o0), 1e-6)
                    self.assertLess(rel(gx1, gx0), 1e-6)
                    self.assertEqual(sorted(g0), sorted(g1))
                    for n in g0:
                        self.assertLess(rel(g1[n], g0[n]), 1e-6, f"grad {n}")
                    self.assertTrue(h.layers[0].adopted)


class DumpRegistered(tiny.TmpDirCase):
    """dump() of a registered block: frames (hidden, router_logits,
    grad_output at the routed output, topk) and the weights stream in
    lrmoe's layout (transposed storage undone)."""

    def test_dump(self):
        for kind, kw in (CASES[0], CASES[2]):
            with self.subTest(kind):
                blk = build(kind, **kw)
                out, wp = self.p(f"{kind}.lrmoe"), self.p(f"{kind}.w.lrmoe")
                x = torch.randn(2, T // 2, D, requires_grad=True)
                with lt.dump(blk, out, weights=wp) as d:
                    y = blk(x)
                    g = torch.randn_like(y)
                    (y * g).sum().backward()
                self.assertEqual(d.frames, 1)
                f = lrmoe.read(out)[0]
                self.assertEqual(f.attrs["topk"], str(K))
                self.assertTrue(np.array_equal(f["hidden"], x.detach().reshape(-1, D).numpy()))
                self.assertTrue(np.array_equal(f["grad_output"], g.reshape(-1, D).numpy()))
                r = blk.router.gate if kind == "titan" else blk.router
                self.assertTrue(np.array_equal(f["router_logits"],
                                               r(x.reshape(-1, D)).detach().numpy()))
                w = lrmoe.read(wp)[0]
                ex = blk.experts
                if kind == "titan":
                    want = (ex.w1, ex.w3, ex.w2)
                    self.assertTrue(np.array_equal(w["expert_bias"], blk.expert_bias.numpy()))
                else:
                    want = (ex.gate.transpose(1, 2), ex.up.transpose(1, 2),
                            ex.down.transpose(1, 2))
                for n, t in zip(("w_gate", "w_up", "w_down"), want):
                    self.assertTrue(np.array_equal(w[n], t.detach().contiguous().numpy()), n)
                self.assertTrue(np.array_equal(w["router_weight"], r.weight.detach().numpy()))


class BadRegistration(unittest.TestCase):
    def err(self, fn, *words):
        with self.assertRaises(lrmoe.Error) as e:
            fn()
        for w in words:
            self.assertIn(w, str(e.exception))

    def test_register_arguments(self):
        try:
            self.arguments()
        finally:
            setUpModule()

    def arguments(self):
        self.err(lambda: lt.register(CustomMoE, layout="packed"), "layout 'packed': unknown",
                 "fused, fused_t, separate, separate_t")
        self.err(lambda: lt.register(CustomMoE, layout="separate", act="gelu"),
                 "register(CustomMoE)", "activation 'gelu' is not silu")
        self.err(lambda: lt.register(CustomMoE, act=torch.nn.GELU()),
                 "act=GELU(approximate='none')")
        self.err(lambda: lt.register(CustomMoE, act=Fn.gelu), "act='gelu'")
        self.err(lambda: lt.register(CustomMoE, layout="separate", weights={"gate_up": "w"}),
                 "weights ['gate_up']: not roles of layout 'separate'")
        self.err(lambda: lt.register(CustomMoE, route="relu", k=2), "route 'relu': unknown")
        self.err(lambda: lt.register(CustomMoE, route="softmax"), "needs k=")
        self.err(lambda: lt.register(CustomMoE, shared="shared"), "shared= goes with route=")
        self.err(lambda: lt.register(42), "cls is 42")
        self.err(lambda: lt.register(CustomMoE, layout="per_expert",
                                     weights={"gate": "w1.weight"}),
                 "weights['gate'] = 'w1.weight': a per-expert layout's paths hold {e}")
        self.err(lambda: lt.register(CustomMoE, layout="separate", weights={"gate": "{e}.w"}),
                 "{e} belongs to the per_expert layouts")

    def test_unregistered(self):
        lt.unregister(TitanMoE)
        try:
            with self.assertRaisesRegex(lrmoe.Error, "unsupported MoE block TitanMoE.*"
                                        "lrmoe.torch.register"):
                lt.patch(build("titan"))
        finally:
            setUpModule()

    def test_found_blocks(self):
        try:
            blk = build("custom")
            blk.experts.up = nn.Parameter(torch.zeros(E, D, F + 1))
            self.err(lambda: lt.patch(blk), "experts.up (up) is [8, 32, 17], expected [8,32,16]",
                     "layout 'separate_t'")
            blk = build("custom")
            del blk.experts.down
            self.err(lambda: lt.patch(blk), "experts.down (down of layout 'separate_t') is "
                     "NoneType, not a tensor")
            blk = build("custom")
            blk.router = nn.Linear(D, E + 1, bias=False)
            self.err(lambda: lt.patch(blk), "router.weight is [9, 32], expected [8,32]")
            self.err(lambda: lt.patch(build("titan", score_before_experts=True)),
                     "score_before_experts=True scales the experts' input")
            blk = build("mixtral4")
            blk.experts[5].w2 = nn.Linear(F + 1, D, bias=False)
            self.err(lambda: lt.patch(blk), "experts.5.w2.weight (down) is [32, 17], expected "
                     "[32,16]")
            blk = build("titan")
            blk.router.score_func = "relu"
            self.err(lambda: lt.patch(blk), "router.score_func is 'relu'")
            lt.register(CustomMoE, experts="mlp", layout="separate_t", router="router",
                        route="softmax", k=2)
            self.err(lambda: lt.patch(build("custom")), "CustomMoE registered with 'mlp' missing")
            lt.register(CustomMoE, layout="separate_t", router="router", route="softmax", k=2,
                        weights={"gate": "gate", "up": "up", "down": "down"},
                        act=lambda ex: "gelu")
            self.err(lambda: lt.patch(build("custom")), "experts use activation 'gelu', not silu")
        finally:
            setUpModule()


class Supported(unittest.TestCase):
    """The pre-registered Hugging Face entries are visible in SUPPORTED, and
    the old way in (SUPPORTED[name] = router attribute) still registers a
    Hugging Face-style block; del removes it."""

    def test_supported(self):
        self.assertEqual(lt.SUPPORTED["Qwen3MoeSparseMoeBlock"], "gate")
        self.assertIn("CustomMoE", lt.SUPPORTED)

        class MyHF(nn.Module):
            def __init__(self):
                super().__init__()
                q = tiny.block("qwen3_moe")
                self.gate, self.experts = q.gate, q.experts
                self.q = [q]

            def forward(self, x):
                return self.q[0].__class__.forward(self, x)
        blk = MyHF()
        with self.assertRaisesRegex(lrmoe.Error, "unsupported MoE block MyHF"):
            lt.patch(blk)
        lt.SUPPORTED["MyHF"] = "gate"
        try:
            ref = copy.deepcopy(blk)
            lt.patch(blk, rate=1.0, ranks=2)
            x = torch.randn(1, 8, tiny.D)
            o0, _, _ = run(ref, x)
            o1, _, _ = run(blk, x)
            self.assertLess(rel(o1, o0), 2e-5)
        finally:
            del lt.SUPPORTED["MyHF"]
        self.assertNotIn("MyHF", lt.SUPPORTED)


if __name__ == "__main__":
    unittest.main()
