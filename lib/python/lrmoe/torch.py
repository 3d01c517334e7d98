"""PyTorch side of lrmoe: dump hooks and the patched (LRMoE) expert layer
for the MoE blocks of Hugging Face transformers models.

Supported blocks (transformers 5: fused expert weights gate_up_proj
(E,2F,D) = [W_gate; W_up] per expert and down_proj (E,D,F), called as
experts(hidden (T,D), top_k_index (T,K), top_k_weights (T,K))):
Qwen3-MoE, Mixtral, OLMoE, Qwen2-MoE, DeepSeek-V3, GLM4-MoE. gpt-oss's
experts are not SwiGLU (interleaved gate/up, sigmoid(1.702 g) gating,
clamping, +1 on up, biases); no weights make lrmoe's silu(g)*u equal to
it, so patch() and the weights of dump() refuse it with a clear message.
Other blocks: register(cls, experts=, layout=, weights=, router=, route=,
...) (lrmoe.adapters; the six families above are its pre-registered
entries). Reference: lrmoe-python(3).

dump(model, out, every=N, weights=PATH)  hooks writing one frame per MoE
    block and dumped step: hidden (T,D), router_logits (T,E), grad_output
    (T,D) (the gradient at the routed experts' output, from a tensor hook)
    and attributes layer, step, model, topk, plus a weights stream (w_gate,
    w_up, w_down, router_weight, expert_bias) in lrmoe's layout.
patch(model, rate=, hbm=, metric=, ranks=)  replaces every supported
    block's experts module by an LRMoEExperts nn.Module (same parameters,
    same state_dict keys, shown by print(model); unpatch(model) or the
    returned Patch's unpatch() puts the originals back): forward = lrmoe
    plan + expert-parallel forward in liblrmoe; backward = score,
    per-expert selection, pack and the compact backward in liblrmoe, as the
    custom ops torch.ops.lrmoe.experts_forward/_backward (torch.compile
    keeps them in its graph) whose tensors are saved with save_for_backward.
    The router and shared experts stay in torch (the router trains through
    the returned routing-weight gradient). Per-step plan figures: .stats.
"""
import ctypes
import itertools
import mmap
import os
import re
import time
import weakref
from collections.abc import MutableMapping
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from . import _lib, adapters
from ._lib import Error, check, lib
from .frame import Frame, Writer, dtype_of
from .ops import Planner



class _Supported(MutableMapping):
    """The registered block classes by name -> their router attribute (the
    registry of lrmoe.torch.register, read live). Setting an entry,
    SUPPORTED["MyBlock"] = "gate", registers MyBlock as a Hugging Face-style
    block (fused gate_up_proj/down_proj experts called with (hidden,
    top_k_index, top_k_weights), activation config.hidden_act), as before
    register() existed; deleting one unregisters it."""

    def __getitem__(self, name: str) -> Optional[str]:
        ad = adapters.registered().get(name)
        if ad is None:
            raise KeyError(name)
        return ad.router

    def __setitem__(self, name: str, router: str) -> None:
        adapters.register_hf(name, router=router)

    def __delitem__(self, name: str) -> None:
        for key, ad in list(adapters._REGISTRY.items()):
            if ad.name == name:
                adapters.unregister(key)
                return
        raise KeyError(name)

    def __iter__(self):
        return iter(adapters.registered())

    def __len__(self) -> int:
        return len(adapters.registered())


SUPPORTED = _Supported()
register = adapters.register
unregister = adapters.unregister
register_torchtitan = adapters.register_torchtitan
register_megatron = adapters.register_megatron
Adapter = adapters.Adapter
MegatronAdapter = adapters.MegatronAdapter
REFUSED = {
    "GptOssMLP": "gpt-oss experts are not SwiGLU: gate and up are interleaved, the gate is "
                 "clamped and gated by sigmoid(alpha*g) with alpha=1.702 instead of silu, up is "
                 "clamped and shifted by +1, and both projections carry biases; no weights make "
                 "lrmoe's silu(x Wg^T) * (x Wu^T) Wd^T equal to it, so lrmoe refuses it",
}
# blocks whose routing (hidden, router_logits, grad_output) dump() writes
# without a weights stream
ROUTING_ONLY = {"GptOssMLP": "router"}
_TORCH_DT = {torch.float32: "F32", torch.bfloat16: "BF16"}
_STAGES = 6  # LRMOE_NSTAGES
_SAMPLE = 1  # LRMOE_KEEP_SAMPLE


def _ptr(t):
    """The address of a tensor this module allocated with its shape (or None)."""
    if t is None:
        return None
    if not t.is_contiguous() or t.device.type != "cpu":
        raise Error("internal: a non-contiguous or non-CPU buffer")
    return t.data_ptr()


_buf = _lib.buf


def _check_call(name, E, D, F, hidden, topk_ids, topk_weights, gate_up, down,
                ids_range=True, Ew=None):
    """What the patched experts are called with, against the block's E, D, F:
    every shape, dtype and id is checked before liblrmoe reads a byte. Ew:
    the experts the weights hold (a shard's, shard=True; default E)."""
    Ew = E if Ew is None else Ew
    for n, t in (("hidden", hidden), ("topk_ids", topk_ids), ("topk_weights", topk_weights),
                 ("gate_up_proj", gate_up), ("down_proj", down)):
        if not isinstance(t, torch.Tensor):
            raise Error(f"{name}: {n} is {type(t).__name__}, not a tensor")
        if t.device.type not in ("cpu", "cuda"):
            raise Error(f"{name}: {n} on {t.device}; lrmoe.torch runs on CPU tensors (CPU "
                        "backend) or CUDA tensors (CUDA backend)")
    devs = sorted({str(t.device) for t in (hidden, topk_ids, topk_weights, gate_up, down)})
    if len(devs) > 1:
        raise Error(f"{name}: tensors on several devices ({', '.join(devs)}); the experts' "
                    "weights, hidden states and routing must be on one device")
    if hidden.dim() != 2 or hidden.shape[1] != D:
        raise Error(f"{name}: hidden is {list(hidden.shape)}, expected [T,{D}]")
    T = hidden.shape[0]
    if topk_ids.dim() != 2 or topk_ids.shape[0] != T:
        raise Error(f"{name}: topk_ids is {list(topk_ids.shape)}, expected [{T},K]")
    K = topk_ids.shape[1]
    if tuple(topk_weights.shape) != (T, K):
        raise Error(f"{name}: topk_weights is {list(topk_weights.shape)}, expected [{T},{K}]")
    if T * K > 2**31 - 1:
        raise Error(f"{name}: {T}x{K} pairs: more than 2^31-1")
    if topk_ids.is_floating_point() or topk_ids.is_complex() or topk_ids.dtype == torch.bool:
        raise Error(f"{name}: topk_ids is {topk_ids.dtype}, expected an integer dtype")
    if not topk_weights.is_floating_point():
        raise Error(f"{name}: topk_weights is {topk_weights.dtype}, expected a float dtype")
    if tuple(gate_up.shape) != (Ew, 2 * F, D):
        raise Error(f"{name}: gate_up_proj is {list(gate_up.shape)}, expected [{Ew},{2 * F},{D}]")
    if tuple(down.shape) != (Ew, D, F):
        raise Error(f"{name}: down_proj is {list(down.shape)}, expected [{Ew},{D},{F}]")
    if ids_range:
        _check_ids(name, topk_ids, E)


def _check_ids(name, topk_ids, E):
    """Every id in [0,E) (reads the data: inside the ops, not in a graph)."""
    if topk_ids.numel():
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        if lo < 0 or hi >= E:  # before the int32 copy: 2^31 + e must not wrap to e
            raise Error(f"{name}: topk_ids holds expert {lo if lo < 0 else hi}, out of "
                        f"range [0,{E})")


def _is_moe_like(m):
    """An experts module with Hugging Face's or torchtitan's weight names."""
    ex = getattr(m, "experts", None)
    return ex is not None and (hasattr(ex, "gate_up_proj") and hasattr(ex, "down_proj") or
                               all(isinstance(getattr(ex, n, None), torch.Tensor)
                                   for n in ("w1", "w2", "w3")))


class _Block:
    """One registered MoE block: its adapter, experts module, router, names
    and E, D, F."""

    def __init__(self, name, module, index, adapter=None):
        self.name = name or type(module).__name__
        self.module, self.adapter = module, adapter
        cls = type(module).__name__
        m = re.search(r"layers\.(\d+)\.", name + ".")
        self.layer = int(m.group(1)) if m else index
        if adapter is None:  # gpt-oss, routing only: gate_up_proj is (E,D,2F)
            self.experts = module.experts
            self.router = getattr(module, ROUTING_ONLY[cls])
            self.E, self.D, twoF = self.experts.gate_up_proj.shape
            self.F = twoF // 2
            self.route, self.K = None, None
            return
        try:
            self.experts = adapters.resolve(module, adapter.experts)
            self.router = (adapters.resolve(module, adapter.router)
                           if adapter.router is not None else None)
        except AttributeError as e:
            raise Error(f"{self.name}: {cls} registered with {e.name!r} missing: {e}") from None
        if not isinstance(self.experts, torch.nn.Module):
            raise Error(f"{self.name}: {adapter.experts} is {type(self.experts).__name__}, not "
                        "an nn.Module")
        self.E, self.D, self.F = adapter.dims(self.experts, self.name)
        adapter.check(module, self.name)
        self.route = adapter.route_for(module)
        self.K = int(adapter.opt(module, "k")) if self.route is not None else None
        rw = getattr(self.router, "weight", None) if self.route is not None else None
        if isinstance(rw, torch.Tensor) and tuple(rw.shape) != (self.E, self.D):
            raise Error(f"{self.name}: {adapter.router}.weight is {list(rw.shape)}, expected "
                        f"[{self.E},{self.D}] (experts x hidden)")

    def check_swiglu(self):
        ex, ad = self.experts, self.adapter
        act = ad.activation(ex)
        if act not in ("silu", "swish"):
            raise Error(f"{self.name}: experts use activation '{act}', not silu: lrmoe's "
                        "experts are SwiGLU (silu(x Wg^T) * (x Wu^T) Wd^T)")
        if ad.layout == "fused" and (
                getattr(ex, "has_bias", False) or getattr(ex, "is_transposed", False) or
                not getattr(ex, "is_concatenated", True) or not getattr(ex, "has_gate", True)):
            raise Error(f"{self.name}: expert weights are not the fused [gate; up] layout "
                        "without biases that lrmoe maps")

    def op_weights(self, ex=None):
        """(gate_up (E,2F,D), down (E,D,F)) of the experts module (or ex, the
        LRMoEExperts holding the same parameters), as the ops take them."""
        return self.adapter.op_weights(self.experts if ex is None else ex)

    def installed(self):
        """The module now at the adapter's experts path."""
        return adapters.resolve(self.module, self.adapter.experts)

    def install(self, mod, patched):
        """Put mod at the experts path; a route block's forward becomes the
        adapter's while patched (an instance attribute, removed after)."""
        adapters._assign(self.module, self.adapter.experts, mod)
        self.experts = mod
        if self.route is not None:
            if patched:
                ad, blk = self.adapter, self.module
                self.module.__dict__["forward"] = \
                    lambda x, *a, **kw: ad.forward(blk, x, *a, **kw)
            else:
                self.module.__dict__.pop("forward", None)


def find_blocks(model: torch.nn.Module, swiglu: bool = True) -> List["_Block"]:
    """The registered MoE blocks of model (lrmoe.torch.register; the six
    Hugging Face families are pre-registered), in module order. One clear
    error for a refused (gpt-oss, unless swiglu=False: routing only),
    unregistered or malformed MoE block, or none at all."""
    blocks = []
    for name, m in model.named_modules():
        cls = type(m).__name__
        if cls in REFUSED and (swiglu or cls not in ROUTING_ONLY):
            raise Error(f"{name or cls}: {REFUSED[cls]}")
        ad = adapters.lookup(type(m))
        if ad is not None or cls in ROUTING_ONLY:
            b = _Block(name, m, len(blocks), ad)
            if swiglu:
                b.check_swiglu()
            blocks.append(b)
        elif _is_moe_like(m):
            raise Error(f"{name or cls}: unsupported MoE block {cls}; lrmoe.torch supports "
                        + ", ".join(sorted(SUPPORTED)) + " and what lrmoe.torch.register() adds")
    if not blocks:
        raise Error(f"{type(model).__name__} has no MoE block of a supported family ("
                    + ", ".join(sorted(SUPPORTED)) + ") or registered with "
                    "lrmoe.torch.register()")
    return blocks


def _model_type(model):
    return str(getattr(getattr(model, "config", None), "model_type", type(model).__name__))


def _np(t):
    """A CPU tensor as (numpy array, lrmoe dtype); BF16 as its raw bits."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), "BF16"
    a = t.numpy()
    return a, dtype_of(a)


def _put(frame, name, t):
    frame[name], frame.dtypes[name] = _np(t)


def weights_frame(block: "_Block") -> Frame:
    """lrmoe's weights layout of one block: w_gate, w_up (E,F,D), w_down
    (E,D,F), router_weight (E,D), expert_bias (E) when the router has one."""
    F = block.F
    with torch.no_grad():
        gu, dn = block.op_weights()
    f = Frame(attrs={"layer": str(block.layer)})
    _put(f, "w_gate", gu[:, :F])
    _put(f, "w_up", gu[:, F:])
    _put(f, "w_down", dn)
    rw = getattr(block.router, "weight", None)
    if rw is not None:
        _put(f, "router_weight", rw)
    ad = block.adapter
    eb = adapters.resolve(block.module, ad.expert_bias, None) if ad and ad.expert_bias else None
    if eb is not None:
        _put(f, "expert_bias", eb.float())
    return f


# ------------------------------------------------------------ dump

class Dump:
    """Returned by dump(); close() (or the end of a `with`) writes the trailer
    and removes the hooks. .frames counts the frames written.

    Frames are written in forward (layer) order within a step: a frame waits
    for its grad_output, and backward delivers those last layer first, so a
    finished frame is held until every frame before it is finished too (the
    frames of one step, with their grad_output, are in memory at most until
    layer 0's gradient arrives). A frame whose backward never comes is left
    out, as before; close() writes the finished ones still held."""

    def __init__(self, model: torch.nn.Module, out: Any, every: int, weights: Any,
                 compress: bool) -> None:
        if every < 1:
            raise Error("dump: every must be >= 1")
        self.blocks = find_blocks(model, swiglu=weights is not None)
        self.model_type = _model_type(model)
        self.every, self.step, self.frames = int(every), -1, 0
        self.hooks, self.pending = [], {}
        self.queue = []  # [frame, finished] in forward order, not yet written
        if weights is not None:
            with Writer(weights, compress=compress) as w:
                for b in self.blocks:
                    wf = weights_frame(b)
                    wf.attrs["model"] = self.model_type
                    w.write(wf)
        self.w = Writer(out, compress=compress)
        first = self.blocks[0]
        for b in self.blocks:
            if b.router is not None:
                self.hooks.append(b.router.register_forward_hook(self._router_hook(b)))
            # a route block's routed output is its output less the shared
            # experts': the gradient at it is the block output's
            self.hooks.append((b.module if b.route is not None else b.experts)
                              .register_forward_hook(self._experts_hook(b)))
            if b is first:
                self.hooks.append(b.module.register_forward_pre_hook(self._step_hook))

    def _step_hook(self, module, args):
        self.step += 1

    def _dumping(self):
        return self.w is not None and self.step >= 0 and self.step % self.every == 0

    def _router_hook(self, b):
        def hook(module, args, output):
            if self._dumping():
                logits = (b.adapter.hook_logits(module, args, output) if b.adapter else
                          output[0] if isinstance(output, (tuple, list)) else output)
                self.pending.setdefault(b.layer, {})["router_logits"] = logits.detach()
        return hook

    def _experts_hook(self, b):
        def hook(module, args, output):
            if not self._dumping():
                return
            p = self.pending.pop(b.layer, {})
            hidden = args[0]
            K = b.K if b.route is not None else args[1].shape[-1]
            f = Frame(attrs={"layer": str(b.layer), "step": str(self.step),
                             "model": self.model_type, "topk": str(K),
                             "ffn": str(b.F)})
            _put(f, "hidden", hidden.reshape(-1, hidden.shape[-1]))
            if "router_logits" in p:
                _put(f, "router_logits", p["router_logits"].reshape(-1, b.E))
            entry = [f, False]
            self.queue.append(entry)
            if isinstance(output, tuple):  # Megatron's MoELayer: (output, bias)
                output = output[0]
            if torch.is_grad_enabled() and output.requires_grad:
                def grad_hook(g, entry=entry):
                    _put(entry[0], "grad_output", g.reshape(-1, g.shape[-1]))
                    entry[1] = True
                    self._flush()
                output.register_hook(grad_hook)
            else:
                entry[1] = True
                self._flush()
        return hook

    def _flush(self, final=False):
        """Write the finished frames at the head of the queue, in forward
        order; with final, every finished one (an unfinished frame never got
        its backward: it is dropped)."""
        while self.queue and (self.queue[0][1] or final):
            f, done = self.queue.pop(0)
            if done:
                self._write(f)

    def _write(self, f):
        if self.w is not None:
            self.w.write(f)
            self.frames += 1

    def close(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []
        if self.w is not None:
            self._flush(final=True)
            w, self.w = self.w, None
            w.close()

    def abort(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []
        self.queue = []
        if self.w is not None:
            self.w.abort()
            self.w = None

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        self.close() if et is None else self.abort()


def dump(model: torch.nn.Module, out: Any, every: int = 1, weights: Any = None,
         compress: bool = True) -> Dump:
    """Hook every supported MoE block of model: every `every`-th step
    (a step = one forward of the first block) write one frame per block to
    out (a path, "-" for stdout, a file descriptor or a file object, e.g. a
    pipe into `lrmoe-route`), completed with grad_output when the backward
    pass reaches the block (frames of forward-only steps have none).
    weights: a path for the weights stream (written once, now)."""
    return Dump(model, out, every, weights, compress)


# ------------------------------------------------------------ patch

def _virtual(shape: Tuple[int, ...]) -> torch.Tensor:
    """A zero float32 tensor of shape (E, ...) in an anonymous mapping of
    its own: a page costs memory only once written, so a global-shaped
    array of which a rank writes only its native experts' rows (shard=True)
    holds about 1/P of its size. liblrmoe reads and writes only those rows
    of the global-shaped arrays it is given as one rank (exec.h)."""
    n = int(np.prod(shape)) * 4
    if n == 0:
        return torch.zeros(shape, dtype=torch.float32)
    mm = mmap.mmap(-1, n)  # torch.frombuffer keeps it alive with the tensor
    return torch.frombuffer(mm, dtype=torch.float32).view(shape)


class _Layer:
    """Per-block state of a patched model: the planner and the records."""

    def __init__(self, owner, block):
        self.owner, self.block = owner, block
        self.planner, self.key = None, None
        self.handle = next(_HANDLES)  # the ops' name for this layer
        _LAYERS[self.handle] = self
        self.held = {}  # step -> stats record of a forward whose backward is to come
        self.w_f32 = None  # the packed F32 weights, reused step to step
        self.adopted = False  # w_f32 is the parameters' own memory
        self.shard = None  # (lo, hi): the native experts a sharded rank keeps
        self.cuda: Optional[_Cuda] = None  # the CUDA executor, on CUDA tensors

    def adopt_packed(self):
        """Float32 experts: let gate_up_proj and down_proj become views into
        one (E, 3FD) buffer laid out as lrmoe's packed weights, [W_gate; W_up;
        W_down] per expert, so the forward passes the parameters' own memory
        and copies nothing (the parameter objects stay, only .data moves)."""
        blk = self.block
        ex = blk.experts
        with torch.no_grad():
            gu, dn = blk.op_weights()
        if self.shard is not None and (gu.device.type == "cuda" or self.owner.fake_device):
            self.shard_device()
            return
        if gu.dtype != torch.float32 or dn.dtype != torch.float32 or gu.device.type != "cpu":
            if self.shard is not None:
                raise Error(f"{blk.name}: shard=True takes float32 CPU experts or CUDA "
                            f"experts (they are {gu.dtype} on {gu.device})")
            return
        if self.shard is not None:
            # the global-shaped packed buffer; the parameters become views of
            # its native rows only, the other experts' memory is let go
            lo, hi = self.shard
            E, n1, n2 = gu.shape[0], gu[0].numel(), dn[0].numel()
            buf = _virtual((E, n1 + n2))
            with torch.no_grad():
                buf[lo:hi, :n1].view(gu[lo:hi].shape).copy_(gu[lo:hi])
                buf[lo:hi, n1:].view(dn[lo:hi].shape).copy_(dn[lo:hi])
            blk.adapter.adopt(ex, buf[lo:hi], hi - lo, blk.D, blk.F)
            self.w_f32, self.adopted = buf, True
            return
        E, n1, n2 = gu.shape[0], gu[0].numel(), dn[0].numel()
        buf = torch.empty(E, n1 + n2, dtype=torch.float32)
        with torch.no_grad():
            buf[:, :n1].view(gu.shape).copy_(gu)
            buf[:, n1:].view(dn.shape).copy_(dn)
        blk.adapter.adopt(ex, buf, blk.E, blk.D, blk.F)
        self.w_f32, self.adopted = buf, True

    def shard_device(self):
        """shard=True on the device path (CUDA tensors): every expert
        parameter becomes its native rows [lo, hi) (dim 0, in any layout),
        memory of its own; the other experts' memory is let go. The CUDA
        executor of a rank reads only its native experts' rows (exec.h),
        replicas come from their owners by p2p (lrmoe.dist)."""
        blk = self.block
        lo, hi = self.shard
        with torch.no_grad():
            for attr in blk.adapter.weights.values():
                p = adapters.resolve(blk.experts, attr)
                p.data = p.data[lo:hi].clone()

    def experts_held(self) -> int:
        """How many experts the parameters hold (E, or the shard's)."""
        return self.block.E if self.shard is None else self.shard[1] - self.shard[0]

    def hold(self, rec):
        """Keep the stats record of a forward until its backward (the
        oldest dropped past _HELD: forwards whose backward never came)."""
        self.held[rec["step"]] = rec
        while len(self.held) > _HELD:
            self.held.pop(next(iter(self.held)))

    def release(self, step):
        """The held record of step (a fresh one if it was dropped)."""
        return self.held.pop(step, None) or {"layer": self.block.layer, "step": step}

    def release_packed(self):
        self.block.adapter.release(self.block.experts)  # back to the block's own layout
        self.w_f32, self.adopted = None, False

    def packed(self, gu, down):
        """[W_gate; W_up; W_down] per expert in F32 (lrmoe-exec's packed copy):
        the parameters' own buffer when they still live in it (adopt_packed),
        else a copy written into this layer's buffer of the previous step (a
        fresh 50 MB tensor costs its page faults every step)."""
        E = gu.shape[0]
        n = gu[0].numel() + down[0].numel()
        w = self.w_f32
        if self.shard is not None:  # gu, down: the native rows [lo, hi)
            lo, hi = self.shard
            if not (self.adopted and gu.data_ptr() == w[lo].data_ptr() and
                    down.data_ptr() == w[lo].data_ptr() + 4 * gu[0].numel() and
                    gu.stride() == (n, gu.shape[2], 1) and
                    down.stride() == (n, down.shape[2], 1)):
                if self.adopted:  # a parameter was given other memory: a buffer of our own
                    self.adopted, self.w_f32 = False, _virtual(w.shape)
                elif w is None:  # sharded on the device (shard_device), now on the CPU
                    self.w_f32 = _virtual((self.block.E, n))
                self.w_f32[lo:hi].copy_(torch.cat([gu.reshape(E, -1).float(),
                                                   down.reshape(E, -1).float()], dim=1))
            return self.w_f32
        if self.adopted:
            if (w.shape == (E, n) and gu.data_ptr() == w.data_ptr() and
                    down.data_ptr() == w.data_ptr() + 4 * gu[0].numel() and
                    gu.stride() == (n, gu.shape[2], 1) and down.stride() == (n, down.shape[2], 1)):
                return w
            # a parameter was given other memory: the buffer may still back the
            # other one, so it is never written; copies go to a buffer of our own
            self.adopted, self.w_f32 = False, None
        if self.w_f32 is None or self.w_f32.shape != (E, n):
            self.w_f32 = torch.empty(E, n, dtype=torch.float32)
        torch.cat([gu.reshape(E, -1), down.reshape(E, -1)], dim=1, out=self.w_f32) \
            if gu.dtype == torch.float32 else self.w_f32.copy_(
                torch.cat([gu.reshape(E, -1), down.reshape(E, -1)], dim=1))
        return self.w_f32

    def plan(self, load, T, K, dtype_name):
        o = self.owner
        key = (T, K, dtype_name)
        if key != self.key:
            shape = {"tokens": max(T // o.ranks, 0), "topk": K, "dtype": dtype_name.lower()}
            shape = {k: v for k, v in shape.items() if o.plan_options.get(k) is None}
            if self.planner is None:
                opts = dict(o.plan_options, **shape)
                opts.setdefault("hidden", self.block.D)
                opts.setdefault("ffn", self.block.F)
                self.planner = Planner(ranks=o.ranks, **opts)
            else:  # the same planner: its EPLB layout carries over, as in lrmoe-plan
                for k, v in shape.items():
                    self.planner.set(k, v)
            self.key = key
        return self.planner.run_cframe(load)


class _Call:
    """Accumulated seconds inside liblrmoe for one layer invocation: wall
    time and the calling thread's CPU time (robust on a shared machine, and
    all of the work when BLAS runs one thread)."""

    def __init__(self):
        self.lib = self.lib_cpu = 0.0
        self.t0, self.c0 = time.perf_counter(), time.thread_time()

    def __call__(self, fn, *args):
        t0, c0 = time.perf_counter(), time.thread_time()
        rc = fn(*args)
        self.lib += time.perf_counter() - t0
        self.lib_cpu += time.thread_time() - c0
        return rc

    def record(self, rec, phase):
        rec[f"{phase}_seconds"] = time.perf_counter() - self.t0
        rec[f"{phase}_cpu_seconds"] = time.thread_time() - self.c0
        rec[f"{phase}_lib_seconds"] = self.lib
        rec[f"{phase}_lib_cpu_seconds"] = self.lib_cpu
        _units(rec)


# stats keys with the TSVs' unit suffixes (lrmoe-python(3)); the older
# names stay in the record as aliases of the same values
UNIT_KEYS = {"mem_peak": "mem_peak_bytes", "t_comm": "t_comm_s"}
for _ph in ("fwd", "bwd"):
    UNIT_KEYS.update({f"{_ph}_seconds": f"{_ph}_s", f"{_ph}_cpu_seconds": f"{_ph}_cpu_s",
                      f"{_ph}_lib_seconds": f"{_ph}_lib_s",
                      f"{_ph}_lib_cpu_seconds": f"{_ph}_lib_cpu_s"})


def _units(rec: Dict[str, Any]) -> None:
    for old, new in UNIT_KEYS.items():
        if old in rec:
            rec[new] = rec[old]


# The expert layer as two torch ops over liblrmoe. They take tensors, the
# layer's handle (an int naming its _Layer in _LAYERS: a torch op carries
# no Python object) and flags, and return fresh tensors, so torch.library
# registers them as custom ops (torch >= 2.4) with fake kernels for their
# shapes: torch.compile then keeps a patched model in one graph, each op an
# opaque call into liblrmoe. What the backward needs is returned by the
# forward op and saved with ctx.save_for_backward (autograd's in-place
# check and saved-tensor hooks apply); the stats record of the call waits
# in its layer (_Layer.hold) until the backward fills it.

_LAYERS: "weakref.WeakValueDictionary[int, _Layer]" = weakref.WeakValueDictionary()
_HANDLES = itertools.count(1)
_HELD = 1024  # stats records a layer holds for backwards still to come
Tensor = torch.Tensor
# experts_forward's outputs: out, then the backward's state
_FwdOut = Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                Tensor]
SAVED = ("hidden", "topk_weights", "gate_up_proj", "down_proj", "topk_ids", "cap_keep",
         "pair_rank", "phi_sqnorm", "saved_gate", "saved_up", "pair_out", "placement",
         "fwd_alloc", "quota", "bwd_alloc", "meta")


def _layer_of(handle: int) -> "_Layer":
    layer = _LAYERS.get(handle)
    if layer is None:
        raise Error(f"lrmoe.torch: patched layer {handle} no longer exists")
    return layer


def _exec_weights(layer: "_Layer", gate_up: Tensor, down: Tensor, dt: str, placement: np.ndarray,
                  fwd_alloc: np.ndarray, check_finite: bool, call: Optional["_Call"] = None,
                  rank: Optional[int] = None) -> Tuple[Any, tuple]:
    """The weights' exec arguments (lrmoe_exec_weights_t's fields by name)
    of the expert parameters for one call, and the tensors they point into,
    to keep alive while they are used. call: the _Call that times the
    liblrmoe check (check_finite). rank: this process's rank of a group
    (lrmoe.dist), which sends only its native experts."""
    blk = layer.block
    E, D, F = blk.E, blk.D, blk.F
    gu, dn = gate_up.detach(), down.detach()
    if dt == "F32":  # the CPU backend reads every matrix from w_f32 (exec.h): no split
        w_gate = w_up = w_down = None
    else:
        w_gate, w_up, w_down = _storage_split(gu, dn, F, placement, fwd_alloc, layer.owner.ranks,
                                              E, rank)
    # the packed F32 copy lrmoe-exec makes too: [W_gate; W_up; W_down] per
    # expert, so gate and up run as one GEMM (HF's gate_up_proj is [W_gate; W_up])
    w_f32 = layer.packed(gu, dn)
    wf = _buf("expert weights (packed F32)", w_f32, "F32", (E, 3 * F * D))
    if check_finite:
        # non-finite weights are refused, as lrmoe-exec refuses them (its
        # --allow-nonfinite has no counterpart here): one pass of the library's
        # check (a shard: its rows, the only ones liblrmoe reads)
        lo, hi = layer.shard or (0, E)
        fin = call if call is not None else (lambda fn, *a: fn(*a))
        check(fin(lib.lrmoe_exec_check_finite, _lib.DT["F32"], wf + lo * 3 * F * D * 4,
                  (hi - lo) * 3 * F * D, b"expert weights"), blk.name)
    W = dict(weights_dtype=_lib.DT[dt], w_gate=_buf("w_gate", w_gate, dt, (E, F, D)),
             w_up=_buf("w_up", w_up, dt, (E, F, D)),
             w_down=_buf("down_proj", w_down, dt, (E, D, F)), w_f32=wf)
    return W, (w_gate, w_up, w_down, w_f32)


def _act_dtype(name: str, hidden: Tensor, gate_up: Tensor, down: Tensor) -> str:
    dt = _TORCH_DT.get(hidden.dtype)
    if dt is None:
        raise Error(f"{name}: hidden is {hidden.dtype}; lrmoe computes float32 or bfloat16 "
                    "activations")
    if gate_up.dtype != hidden.dtype or down.dtype != hidden.dtype:
        raise Error(f"{name}: mismatched dtypes: hidden is {hidden.dtype}, expert weights are "
                    f"{gate_up.dtype}/{down.dtype}; convert the model to one dtype "
                    "(model.to(dtype))")
    return dt


def _pairs(hidden: Tensor, topk_ids: Tensor, topk_weights: Tensor
           ) -> Tuple[Tensor, Tensor, Tensor]:
    """The layer call's rows as liblrmoe takes them: hidden, int32 ids and
    float32 routing weights, detached and contiguous."""
    return (hidden.detach().contiguous(), topk_ids.detach().to(torch.int32).contiguous(),
            topk_weights.detach().to(torch.float32).contiguous())


def _plan_arrays(placement: Tensor, fwd_alloc: Tensor, quota: Tensor, bwd_alloc: Tensor
                 ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The plan the forward saved for the backward, as the arrays liblrmoe
    takes (placement uint8, the rest int64)."""
    return (np.ascontiguousarray(placement.numpy(), np.uint8),
            np.ascontiguousarray(fwd_alloc.numpy(), np.int64),
            np.ascontiguousarray(quota.numpy(), np.int64),
            np.ascontiguousarray(bwd_alloc.numpy(), np.int64))


def _saved_buffers(n: int, K: int, F: int, D: int, dtype: torch.dtype
                   ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The forward's state for the backward, n tokens' worth (0 when no
    gradient will be asked for): ||phi||^2 (F32), h_g and h_u (n,K,F) and
    y (n,K,D) in the activations' dtype."""
    return (torch.empty(n, K, dtype=torch.float32), torch.empty(n, K, F, dtype=dtype),
            torch.empty(n, K, F, dtype=dtype), torch.empty(n, K, D, dtype=dtype))


def _plan(layer: "_Layer", call: "_Call", load: np.ndarray, T: int, K: int,
          dt: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Dict[str, str]]:
    """The layer's plan for these loads (liblrmoe's planner, _Layer.plan):
    placement, fwd_alloc, quota, bwd_alloc as arrays, and its attributes."""
    try:
        cf = call(layer.plan, load, T, K, dt)
    except Error as e:
        raise Error(f"{layer.block.name}: plan: {e}") from None
    return (np.ascontiguousarray(cf.get("placement")[0], np.uint8),
            np.ascontiguousarray(cf.get("fwd_alloc")[0], np.int64),
            np.ascontiguousarray(cf.get("quota")[0], np.int64),
            np.ascontiguousarray(cf.get("bwd_alloc")[0], np.int64), cf.attrs())


def experts_forward(hidden: Tensor, topk_weights: Tensor, gate_up: Tensor, down: Tensor,
                    topk_ids: Tensor, cap_keep: Optional[Tensor], handle: int,
                    train: bool) -> _FwdOut:
    """out = sum_k alpha_tk SwiGLU_e(x_t) over the routed pairs (lrmoe plan +
    expert-parallel forward in liblrmoe) and, with train, the backward's
    state: pair_rank, phi_sqnorm, saved_gate, saved_up, pair_out (T rows, 0
    without train), the plan's placement, fwd_alloc, quota, bwd_alloc, and
    meta = [step, keeps by forward rank]. hidden (T,D), topk_weights (T,K),
    gate_up (E,2F,D), down (E,D,F), topk_ids (T,K); cap_keep (T,K) uint8:
    the capacity planner's keep mask, or None. Registered as
    torch.ops.lrmoe.experts_forward."""
    layer = _layer_of(handle)
    idx = _device_io(layer.owner, layer.block.name, hidden, topk_weights, gate_up, down, topk_ids)
    if idx is not None and layer.owner.dist is not None:  # one rank of a group, on the device
        from . import dist as _dist
        return _dist.device_forward(layer, idx, hidden, topk_weights, gate_up, down, topk_ids,
                                    cap_keep, train)
    if idx is not None:  # CUDA tensors: the layer's CUDA executor
        return _forward_device(layer, idx, hidden, topk_weights, gate_up, down, topk_ids,
                               cap_keep, train)
    if layer.owner.dist is not None:  # one rank of a process group (lrmoe.dist)
        return layer.owner.dist_forward(layer, hidden, topk_weights, gate_up, down, topk_ids,
                                        cap_keep, train)
    o, call, blk = layer.owner, _Call(), layer.block
    dt = _act_dtype(blk.name, hidden, gate_up, down)
    _check_call(blk.name, blk.E, blk.D, blk.F, hidden, topk_ids, topk_weights, gate_up, down)
    T, D = hidden.shape
    E, F, K, P = blk.E, blk.F, topk_ids.shape[1], o.ranks
    x, ids, alpha = _pairs(hidden, topk_ids, topk_weights)
    load = torch.bincount(ids.view(-1).long(), minlength=E).numpy()
    placement, fwd_alloc, quota, bwd_alloc, attrs = _plan(layer, call, load, T, K, dt)
    W, keep_alive = _exec_weights(layer, gate_up, down, dt, placement, fwd_alloc, True, call)
    dims = dict(T=T, E=E, K=K, D=D, F=F, P=P)
    Pl = dict(placement=_buf("placement", placement, "U8", (E, P)),
              fwd_alloc=_buf("fwd_alloc", fwd_alloc, "I64", (E, P)))
    out = torch.empty(T, D, dtype=hidden.dtype)
    pair_rank = torch.empty(T, K, dtype=torch.int32)
    # the backward's state only when a gradient will be asked for
    n = T if train else 0
    phi, sg, su, pair_out = _saved_buffers(n, K, F, D, hidden.dtype)
    tr = (lambda t: t) if train else (lambda t: None)
    a = _lib.ExecArgs(o.cfg, dims, W, Pl, act_dtype=_lib.DT[dt],
                      hidden=_buf("hidden", x, dt, (T, D)),
                      topk_ids=_buf("topk_ids", ids, "I32", (T, K)),
                      topk_weights=_buf("topk_weights", alpha, "F32", (T, K)),
                      output=_buf("output", out, dt, (T, D), True),
                      pair_rank=_buf("pair_rank", pair_rank, "I32", (T, K), True),
                      phi_sqnorm=_buf("phi_sqnorm", tr(phi), "F32", (T, K), True),
                      saved_gate=_buf("saved_gate", tr(sg), dt, (T, K, F), True),
                      saved_up=_buf("saved_up", tr(su), dt, (T, K, F), True),
                      pair_out=_buf("pair_out", tr(pair_out), dt, (T, K, D), True))
    tim = (ctypes.c_double * (P * _STAGES))()
    check(call(lib.lrmoe_exec_args_forward, a.h, tim), f"{blk.name}: forward")
    del keep_alive
    rec: Dict[str, Any] = {"layer": blk.layer, "step": o.steps.get(blk.layer, 0), "pairs": T * K,
                           "tokens": T}
    return _forward_done(layer, call, rec, attrs, train, out, pair_rank, phi, sg, su, pair_out,
                         placement, fwd_alloc, quota, bwd_alloc)


def _forward_done(layer: "_Layer", call: "_Call", rec: Dict[str, Any], attrs: Dict[str, str],
                  train: bool, out: Tensor, pair_rank: Tensor, phi: Tensor, sg: Tensor,
                  su: Tensor, pair_out: Tensor, placement: np.ndarray, fwd_alloc: np.ndarray,
                  quota: np.ndarray, bwd_alloc: np.ndarray) -> _FwdOut:
    """The forward's stats record (plan attributes, step count, held for
    the backward) and the op's outputs (both paths)."""
    o = layer.owner
    for k, v in attrs.items():
        if k.startswith("plan."):  # plan.keep as keep_rule: "keep" is the mask
            rec["keep_rule" if k == "plan.keep" else k[5:]] = _num(v)
    o.steps[layer.block.layer] = rec["step"] + 1
    o.stats.append(rec)
    meta = torch.tensor([rec["step"], int(rec.get("keep_rule") == "by-rank")], dtype=torch.int64)
    if train:
        layer.hold(rec)
    call.record(rec, "fwd")
    return (out, pair_rank, phi, sg, su, pair_out, torch.from_numpy(placement),
            torch.from_numpy(fwd_alloc), torch.from_numpy(quota), torch.from_numpy(bwd_alloc),
            meta)


# ------------------------------------------------------------ CUDA tensors
# When the experts' weights and the activations are CUDA tensors, a
# patched layer stays on the device: each layer has one persistent CUDA
# executor of liblrmoe (lrmoe_exec_cuda_new(3), made at its first call,
# freed at unpatch() or at interpreter exit) in device-pointer mode on
# torch's current stream: activations, weights and outputs are passed by
# data_ptr(), the frame starts after the work queued on the stream and the
# stream waits for its end (no host wait at the end of a call). Routing,
# plan, scores, selection and the pack layout are host arrays, as the API
# takes them; what crosses per layer call is in the stats record
# (fwd_d2h_bytes, bwd_d2h_bytes, bwd_h2d_bytes) and lrmoe-python(3).
# LRMOE_TORCH_FAKE_DEVICE=1 (test only): CPU tensors take this path, as
# "device memory" of the fake CUDA module (tests/gpu/build-fake-module.sh),
# which runs the CUDA backend's host logic on the kernels' CPU references.

FAKE_DEVICE_ENV = "LRMOE_TORCH_FAKE_DEVICE"


def _device_io(o: "Patch", name: str, *ts: Optional[Tensor]) -> Optional[int]:
    """The CUDA device index the call runs on (the device path), or None
    (the CPU backend on CPU tensors). One clear error for tensors on
    several devices or on a device that is neither."""
    devs = sorted({str(t.device) for t in ts if isinstance(t, torch.Tensor)})
    if len(devs) > 1:
        raise Error(f"{name}: tensors on several devices ({', '.join(devs)}); the experts' "
                    "weights, hidden states and routing must be on one device")
    dev = torch.device(devs[0]) if devs else torch.device("cpu")
    if dev.type == "cpu":
        if not o.fake_device:
            return None
        idx = 0
    elif dev.type == "cuda":
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
    else:
        raise Error(f"{name}: tensors on {dev}; lrmoe.torch runs on CPU tensors (CPU backend) "
                    "or CUDA tensors (CUDA backend)")
    return idx


def _dptr(name: str, t: Optional[Tensor], idx: int, fake: bool, lo: int = 0) -> Optional[int]:
    """A device tensor's address for the executor: contiguous and on the
    executor's device, else one clear error (never a bad pointer). lo > 0:
    t holds rows [lo, ...) of a global array (a shard, (n, ...)) of which
    the executor addresses only those rows; the address of its row 0 (t's
    address less lo rows) is returned."""
    if t is None:
        return None
    want = "cpu" if fake else f"cuda:{idx}"
    if str(t.device) != want and not (not fake and t.device.type == "cuda" and
                                     t.device.index == idx):
        raise Error(f"{name}: a tensor on {t.device}; this layer's CUDA executor runs on "
                    f"{want}")
    if not t.is_contiguous():
        raise Error(f"{name}: a non-contiguous tensor (stride {t.stride()}); the CUDA "
                    "executor reads dense row-major arrays")
    if lo:
        return t.data_ptr() - lo * (t[0].numel() * t.element_size())
    return t.data_ptr()


class _Cuda:
    """One layer's CUDA executor and the device copies of its expert
    weights in lrmoe's layout (w_gate, w_up (E,F,D): HF's fused gate_up
    (E,2F,D) is split once; w_down (E,D,F): the parameter itself when
    contiguous). The executor keeps resident copies keyed by these
    pointers; when the parameters' version counters or addresses move (an
    optimizer step, load_state_dict, .data = ...) the copies are refreshed
    in place and lrmoe_exec_cuda_weights_changed drops the resident ones.
    A step that changes nothing costs no weight traffic."""

    def __init__(self, layer: "_Layer", idx: int, fake: bool) -> None:
        self.idx, self.fake, self.name = idx, fake, layer.block.name
        self.x: Optional[ctypes.c_void_p] = None
        self.stream: Any = False  # the stream set_io was given (False: none yet)
        self.wkey: Any = None
        self.w: Optional[Tuple[Tensor, Tensor, Optional[Tensor]]] = None
        self._fin: Any = None

    def executor(self, args: Optional["_lib.ExecArgs"]) -> ctypes.c_void_p:
        """The executor (made at the first call from args' cfg and P; args
        None: the forward made it) with device-pointer I/O on the current
        stream (set only when it changed: lrmoe_exec_cuda_set_io waits for
        the previous frame)."""
        if self.x is None:
            if args is None:
                raise Error(f"{self.name}: CUDA executor: a backward without its forward on "
                            "the device")
            x = ctypes.c_void_p()
            check(lib.lrmoe_exec_args_cuda_new(args.h, ctypes.byref(x)),
                  f"{self.name}: CUDA executor")
            self.x = x
            self._fin = weakref.finalize(self, lib.lrmoe_exec_cuda_free, x)
        stream = None if self.fake else torch.cuda.current_stream(self.idx).cuda_stream
        if stream != self.stream:
            check(lib.lrmoe_exec_cuda_set_io(self.x, 1, stream), f"{self.name}: CUDA executor")
            self.stream = stream
        return self.x

    def _wkey(self, layer: "_Layer", gu: Tensor, dn: Tensor) -> tuple:
        """What the device copies were made from: the expert parameters'
        addresses and version counters (gu and dn are views of them or, for
        the separate layouts, gu a fresh [gate; up] copy each call, whose
        address says nothing: not in the key, or every call would refresh
        the copies and drop the resident replicas), dn's address (passed to
        the executor as it is when contiguous), the shape and dtype."""
        params = list(layer.block.experts.parameters())
        return (tuple((p.data_ptr(), p._version) for p in params), dn.data_ptr(),
                tuple(gu.shape), gu.dtype)

    def stale(self, layer: "_Layer", gu: Tensor, dn: Tensor) -> bool:
        """Whether weights() would refresh the device copies (the expert
        parameters moved or changed since the last call)."""
        return self._wkey(layer, gu, dn) != self.wkey

    def weights(self, layer: "_Layer", gu: Tensor, dn: Tensor, dt: str,
                force: bool = False) -> Dict[str, Any]:
        """The weights' exec arguments (device pointers), the copies
        refreshed and the executor's resident weights dropped
        (lrmoe_exec_cuda_weights_changed) when stale or force. One rank of
        a group passes force = any rank stale (dist.py: the ranks must drop
        their resident replicas together, or the owner's weight sends would
        not pair with the receives). Sharded (shard=True, one rank of a
        group): gu, dn and the copies hold the native experts [lo, hi) only,
        and each pointer is given as that of a global (E,...) array whose row
        lo is the shard's first (its address less lo rows): a rank's CUDA
        executor reads only its native experts' rows (lrmoe_exec_cuda_new(3)),
        so the rows outside the shard are never addressed."""
        D, F = layer.block.D, layer.block.F
        E = gu.shape[0]  # the shard's experts when sharded
        key = self._wkey(layer, gu, dn)
        if key != self.wkey or force:
            with torch.no_grad():
                if self.w is None or self.w[0].shape != (E, F, D) or self.w[0].dtype != gu.dtype:
                    self.w = (torch.empty(E, F, D, dtype=gu.dtype, device=gu.device),
                              torch.empty(E, F, D, dtype=gu.dtype, device=gu.device), None)
                self.w[0].copy_(gu[:, :F])
                self.w[1].copy_(gu[:, F:])
                wd = None
                if not dn.is_contiguous():
                    wd = self.w[2] if self.w[2] is not None else torch.empty_like(
                        dn, memory_format=torch.contiguous_format)
                    wd.copy_(dn)
                self.w = (self.w[0], self.w[1], wd)
            if self.x is not None and self.wkey is not None:
                check(lib.lrmoe_exec_cuda_weights_changed(self.x), f"{self.name}: CUDA executor")
            self.wkey = key
        wd = self.w[2] if self.w[2] is not None else dn
        self.keep = wd  # dn may be a view made for this call (a transposed layout)
        lo = layer.shard[0] if layer.shard is not None else 0
        p = lambda n, t: _dptr(n, t, self.idx, self.fake, lo)  # noqa: E731
        return dict(weights_dtype=_lib.DT[dt], w_gate=p("w_gate", self.w[0]),
                    w_up=p("w_up", self.w[1]), w_down=p("down_proj", wd), w_f32=None)

    def free(self) -> None:
        if self._fin is not None:
            self._fin()  # lrmoe_exec_cuda_free: waits for the queued frames
        self.x, self._fin, self.w, self.wkey, self.stream = None, None, None, None, False


def _cuda_of(layer: "_Layer", idx: int) -> "_Cuda":
    cu = layer.cuda
    if cu is None:
        cu = layer.cuda = _Cuda(layer, idx, layer.owner.fake_device)
    elif cu.idx != idx:
        raise Error(f"{layer.block.name}: tensors on cuda:{idx}, but this layer's CUDA executor "
                    f"runs on cuda:{cu.idx} (unpatch and patch again after moving the model)")
    return cu


def _cuda_cfg(o: "Patch", idx: int) -> Dict[str, Any]:
    # every simulated rank of this process on the one device (gpus=1)
    return dict(backend=1, gpus=1, device=idx, threads=o.cfg["threads"])


def _forward_device(layer: "_Layer", idx: int, hidden: Tensor, topk_weights: Tensor,
                    gate_up: Tensor, down: Tensor, topk_ids: Tensor,
                    cap_keep: Optional[Tensor], train: bool) -> _FwdOut:
    """experts_forward on the device (CUDA tensors): the same plan and
    arguments as the CPU path, activations by device pointer."""
    o, call, blk = layer.owner, _Call(), layer.block
    dt = _act_dtype(blk.name, hidden, gate_up, down)
    _check_call(blk.name, blk.E, blk.D, blk.F, hidden, topk_ids, topk_weights, gate_up, down,
                ids_range=False)
    cu = _cuda_of(layer, idx)
    T, D = hidden.shape
    E, F, K, P = blk.E, blk.F, topk_ids.shape[1], o.ranks
    dev = hidden.device
    x = hidden.detach().contiguous()
    # routing to the host (the API's host arrays): ids in their dtype (the
    # range check before the int32 cast), alpha as F32
    ids_h = topk_ids.detach().to("cpu")
    _check_ids(blk.name, ids_h, E)
    ids = ids_h.to(torch.int32).contiguous()
    alpha = topk_weights.detach().to("cpu", torch.float32).contiguous()
    d2h = ids_h.numel() * ids_h.element_size() + alpha.numel() * 4
    load = torch.bincount(ids.view(-1).long(), minlength=E).numpy()
    placement, fwd_alloc, quota, bwd_alloc, attrs = _plan(layer, call, load, T, K, dt)
    W = cu.weights(layer, gate_up.detach(), down.detach(), dt)
    dims = dict(T=T, E=E, K=K, D=D, F=F, P=P)
    Pl = dict(placement=_buf("placement", placement, "U8", (E, P)),
              fwd_alloc=_buf("fwd_alloc", fwd_alloc, "I64", (E, P)))
    out = torch.empty(T, D, dtype=hidden.dtype, device=dev)
    pair_rank = torch.empty(T, K, dtype=torch.int32)  # host: written by the forward
    n = T if train else 0
    phi = torch.empty(n, K, dtype=torch.float32, device=dev)
    sg = torch.empty(n, K, F, dtype=hidden.dtype, device=dev)
    su = torch.empty(n, K, F, dtype=hidden.dtype, device=dev)
    pair_out = torch.empty(n, K, D, dtype=hidden.dtype, device=dev)
    p = lambda nm, t: _dptr(nm, t if train else None, idx, cu.fake)  # noqa: E731
    a = _lib.ExecArgs(_cuda_cfg(o, idx), dims, W, Pl, act_dtype=_lib.DT[dt],
                      hidden=_dptr("hidden", x, idx, cu.fake),
                      topk_ids=_buf("topk_ids", ids, "I32", (T, K)),
                      topk_weights=_buf("topk_weights", alpha, "F32", (T, K)),
                      output=_dptr("output", out, idx, cu.fake),
                      pair_rank=_buf("pair_rank", pair_rank, "I32", (T, K), True),
                      phi_sqnorm=p("phi_sqnorm", phi), saved_gate=p("saved_gate", sg),
                      saved_up=p("saved_up", su), pair_out=p("pair_out", pair_out))
    xh = cu.executor(a)
    check(call(lib.lrmoe_exec_args_forward_cuda, a.h, xh, None), f"{blk.name}: forward")
    rec: Dict[str, Any] = {"layer": blk.layer, "step": o.steps.get(blk.layer, 0), "pairs": T * K,
                           "tokens": T, "device": str(dev), "fwd_d2h_bytes": d2h,
                           "fwd_h2d_bytes": 0}
    return _forward_done(layer, call, rec, attrs, train, out, pair_rank, phi, sg, su, pair_out,
                         placement, fwd_alloc, quota, bwd_alloc)


def _backward_device(layer: "_Layer", idx: int, grad_out: Tensor, hidden: Tensor,
                     topk_weights: Tensor, gate_up: Tensor, down: Tensor, topk_ids: Tensor,
                     cap_keep: Optional[Tensor], pair_rank: Tensor, phi: Tensor, sg: Tensor,
                     su: Tensor, pair_out: Tensor, placement: Tensor, fwd_alloc: Tensor,
                     quota: Tensor, bwd_alloc: Tensor, meta: Tensor
                     ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """experts_backward on the device: the pairs' scores on the device
    (_score_device: only the T*K scores cross to the host), the selection
    and the pack layout on the host, the packed rows gathered on the device
    by pack_pair, and the compact backward by device pointers."""
    o, call, blk = layer.owner, _Call(), layer.block
    cu = _cuda_of(layer, idx)
    step, by_rank = (int(v) for v in meta.tolist())
    rec = layer.release(step)
    dt = _act_dtype(blk.name, hidden, gate_up, down)
    T, D = hidden.shape
    E, F, K, P = blk.E, blk.F, topk_ids.shape[1], o.ranks
    dev = hidden.device
    d = dict(T=T, E=E, K=K, D=D, F=F, P=P)
    c = torch.Tensor.contiguous  # saved-tensor hooks may unpack any layout
    x, sg, su, pair_out = c(hidden.detach()), c(sg), c(su), c(pair_out)
    pair_rank = pair_rank.to("cpu").contiguous()
    ids_d = topk_ids.detach().to("cpu")
    ids = ids_d.to(torch.int32).contiguous()
    alpha = topk_weights.detach().to("cpu", torch.float32).contiguous()
    placement, fwd_alloc, quota, bwd_alloc = _plan_arrays(placement.cpu(), fwd_alloc.cpu(),
                                                          quota.cpu(), bwd_alloc.cpu())
    W = cu.weights(layer, gate_up.detach(), down.detach(), dt)
    Pl = dict(placement=_buf("placement", placement, "U8", (E, P)),
              fwd_alloc=_buf("fwd_alloc", fwd_alloc, "I64", (E, P)))
    g = grad_out.contiguous()
    gdt = _TORCH_DT.get(g.dtype)
    if gdt is None:
        g, gdt = g.float(), "F32"
    if tuple(g.shape) != (T, D):
        raise Error(f"{blk.name}: grad_output has shape {tuple(g.shape)}, expected {(T, D)}")
    seed = o.seed + step
    score, sd2h, sh2d = _score_device(o, cu, call, blk, T, K, D, gdt, g, topk_weights, alpha, phi, seed)
    d2h = ids_d.numel() * ids_d.element_size() + alpha.numel() * 4 + sd2h
    keep, alpha_b, w, pr = _select(o, call, blk, T, K, E, P, score, ids, alpha, cap_keep,
                                   pair_rank, quota, bwd_alloc, by_rank, seed)
    b = _lib.ExecArgs(_cuda_cfg(o, idx), d, W, Pl, topk_ids=_ptr(ids), keep=_ptr(keep),
                      pair_rank=_ptr(pair_rank), bwd_alloc=bwd_alloc.ctypes.data,
                      quota=quota.ctypes.data)
    check(call(lib.lrmoe_exec_args_pack, b.h), "pack")
    R = b.get("R")
    pp = b.get_ptr("pack_pair")
    pair = (torch.from_numpy(np.ctypeslib.as_array((ctypes.c_int64 * R).from_address(pp))).clone()
            if R else torch.empty(0, dtype=torch.int64))
    # the packed rows, gathered on the device as lrmoe-pack gathers them:
    # x_t, h_g, h_u of pair u = pack_pair[i], and alpha_b[u] g_t in F32
    # (g converted to F32, then one F32 multiply: lrmoe_pack_gather_scaled)
    a_rows = alpha_b.view(-1).index_select(0, pair)
    pair_d, a_d = pair.to(dev), a_rows.to(dev)
    h2d = pair.numel() * 8 + a_rows.numel() * 4 + sh2d
    tok = torch.div(pair_d, K, rounding_mode="floor")
    pk_hidden = x.index_select(0, tok)
    pk_gate = sg.view(T * K, F).index_select(0, pair_d)
    pk_up = su.view(T * K, F).index_select(0, pair_d)
    pk_grad = g.index_select(0, tok).float() * a_d.unsqueeze(1)
    if R == 0:  # no kept row: non-NULL empty buffers (NULL is the layout-only form)
        pk_hidden, pk_gate, pk_up, pk_grad = (t.new_empty((1,) + t.shape[1:])[:0] for t in
                                              (pk_hidden, pk_gate, pk_up, pk_grad))
    f32 = dict(dtype=torch.float32, device=dev)
    gh, gtw = torch.empty(T, D, **f32), torch.empty(T, K, **f32)
    gwg, gwu = torch.empty(E, F, D, **f32), torch.empty(E, F, D, **f32)
    gwd = torch.empty(E, D, F, **f32)
    q = lambda nm, t: _dptr(nm, t, idx, cu.fake)  # noqa: E731
    b.set(mode=2, act_dtype=_lib.DT[dt], grad_dtype=_lib.DT[gdt], topk_weights=_ptr(alpha_b),
          grad_output=q("grad_output", g), pair_out=q("pair_out", pair_out),
          hidden=q("hidden", x), saved_gate=q("saved_gate", sg), saved_up=q("saved_up", su),
          pack_grad=q("pack_grad", pk_grad), pack_hidden=q("pack_hidden", pk_hidden),
          pack_gate=q("pack_gate", pk_gate), pack_up=q("pack_up", pk_up),
          grad_hidden=q("grad_hidden", gh), grad_w_gate=q("grad_w_gate", gwg),
          grad_w_up=q("grad_w_up", gwu), grad_w_down=q("grad_w_down", gwd),
          grad_topk_weights=q("grad_topk_weights", gtw))
    xh = cu.executor(b)
    check(call(lib.lrmoe_exec_args_backward_cuda, b.h, xh, None), f"{blk.name}: backward")
    rec["kept"], rec["moved"] = R, b.get("moved")
    rec["bwd_d2h_bytes"], rec["bwd_h2d_bytes"] = d2h, h2d
    return _bwd_done(o, call, rec, keep, w, pr, gh, gtw, gwg, gwu, gwd, hidden, topk_weights,
                     gate_up)


_NO_G = ("random", "uniform")    # metrics whose score reads no g
_ON_DEVICE = ("lrm", "gradnorm", "absgrad")  # metrics lrmoe_exec_cuda_score computes


def _score_device(o: "Patch", cu: "_Cuda", call: "_Call", blk: "_Block", T: int, K: int,
                  D: int, gdt: str, g: Tensor, topk_weights: Tensor, alpha: Tensor,
                  phi: Tensor, seed: int) -> Tuple[Tensor, int, int]:
    """The pairs' scores (T,K) F32 on the host for the selection, and the
    bytes that crossed to the host and to the device for them: lrm,
    gradnorm and absgrad on the device (lrmoe_exec_cuda_score on g, and for
    lrm the routing weights and ||phi||^2, by device pointer: T*K*4 bytes
    back, nothing up), random and uniform from the routing alone (0). g
    never crosses."""
    if o.metric_name in _ON_DEVICE:
        score = torch.empty(T, K, dtype=torch.float32)
        p = lambda nm, t: _dptr(nm, t, cu.idx, cu.fake)  # noqa: E731
        lrm = o.metric_name == "lrm"  # alpha and ||phi||^2: read by lrm only
        a_d = topk_weights.detach().to(torch.float32).contiguous() if lrm else None
        ph = phi.contiguous() if lrm else None
        check(call(lib.lrmoe_exec_cuda_score, cu.executor(None), o.metric, T, K, D,
                   _lib.DT[gdt], p("grad_output", g), p("topk_weights", a_d),
                   p("phi_sqnorm", ph), _ptr(score)), f"{blk.name}: score")
        return score, score.numel() * 4, 0
    return _score_host(o, call, T, K, D, gdt, None, alpha, None, seed), 0, 0  # _NO_G


def _bwd_done(o: "Patch", call: "_Call", rec: Dict[str, Any], keep: Tensor,
              w: Optional[Tensor], pr: Optional[Tensor], gh: Tensor, gtw: Tensor, gwg: Tensor,
              gwu: Tensor, gwd: Tensor, hidden: Tensor, topk_weights: Tensor,
              gate_up: Tensor) -> tuple:
    """The backward's end, CPU and CUDA alike: the keep mask into the stats
    (with select="sample", _select's w not None, the pair weights and
    probabilities too), the record, and the gradients in the inputs' dtypes
    (gate_up's as the fused [E, 2F, D])."""
    if o.keep_masks:
        rec["keep"] = keep.numpy().astype(bool)
        if w is not None:
            rec["pair_weight"] = w.numpy().copy()
            rec["pair_prob"] = pr.numpy().copy()
    wdt = gate_up.dtype
    gate_up_grad = torch.cat([gwg, gwu], dim=1).to(wdt)
    call.record(rec, "bwd")
    return gh.to(hidden.dtype), gtw.to(topk_weights.dtype), gate_up_grad, gwd.to(wdt)


def _score_host(o: "Patch", call: "_Call", T: int, K: int, D: int, gdt: str,
                g: Optional[Tensor], alpha: Tensor, phi: Optional[Tensor], seed: int) -> Tensor:
    """The pairs' scores (T,K) F32 by liblrmoe's score on host arrays (g
    may be None for the metrics that read none: random, uniform)."""
    score = torch.empty(T, K, dtype=torch.float32)
    check(call(lib.lrmoe_score_pairs_dt, o.metric, T, K, D, _lib.DT[gdt],
               None if g is None else _ptr(g), _ptr(alpha), None if phi is None else _ptr(phi),
               seed, _ptr(score)), "score")
    return score


def _select(o: "Patch", call: "_Call", blk: "_Block", T: int, K: int, E: int, P: int,
            score: Tensor, ids: Tensor, alpha: Tensor,
            cap_keep: Optional[Tensor], pair_rank: Tensor, quota: np.ndarray,
            bwd_alloc: np.ndarray, by_rank: int, seed: int
            ) -> Tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor]]:
    """The backward's keep mask (T,K) uint8 and the routing weights the kept
    rows are scaled by (alpha_b), from the pairs' scores (T,K) F32
    (_score_host, or on the device: _score_device) by liblrmoe's per-expert
    selection at the plan's quotas; with select="sample" also the pair
    weights and probabilities (w, pr; else None). Every argument is a CPU
    tensor or array."""
    keep = torch.empty(T, K, dtype=torch.uint8)
    load = np.empty(E, np.int64)
    # alpha_b: the routing weights the kept rows are scaled by; with
    # select="sample" alpha_u / p_u (pair_weight), else alpha
    alpha_b, w, pr = alpha, None, None
    if cap_keep is not None:
        # capacity-factor dropping: backward keeps exactly the forward's pairs
        keep = cap_keep.to("cpu", torch.uint8).contiguous()
        kq = np.bincount(ids.view(-1).long().numpy()[keep.view(-1).numpy() > 0], minlength=E)
        if not np.array_equal(kq, quota):
            raise Error(f"{blk.name}: the capacity plan's quotas are not the forward's kept "
                        "pairs per expert")
    elif o.select == _SAMPLE:
        w = torch.empty(T, K, dtype=torch.float32)
        pr = torch.empty(T, K, dtype=torch.float32) if o.keep_masks else None
        if by_rank:
            check(call(lib.lrmoe_score_sample_by_rank, T, K, E, P, _ptr(ids), _ptr(score),
                       _ptr(pair_rank), bwd_alloc.ctypes.data, seed, _ptr(keep), _ptr(w),
                       _ptr(pr), load.ctypes.data, None), "select")
        else:
            check(call(lib.lrmoe_score_sample, T, K, E, _ptr(ids), _ptr(score),
                       quota.ctypes.data, -1.0, seed, _ptr(keep), _ptr(w), _ptr(pr),
                       load.ctypes.data, None), "select")
        alpha_b = torch.empty(T, K, dtype=torch.float32)
        lib.lrmoe_score_weighted_alpha(T * K, _ptr(alpha), _ptr(w), _ptr(alpha_b))
    elif by_rank:
        # the plan's backward relies on the keep by forward rank
        # (plan.keep=by-rank, lrmoe-score(1)): bwd_alloc's row sums are the quotas
        check(call(lib.lrmoe_score_select_by_rank, T, K, E, P, _ptr(ids), _ptr(score),
                   _ptr(pair_rank), bwd_alloc.ctypes.data, _ptr(keep), load.ctypes.data,
                   None), "select")
    else:
        check(call(lib.lrmoe_score_select, T, K, E, _ptr(ids), _ptr(score), quota.ctypes.data,
                   -1.0, _ptr(keep), load.ctypes.data, None), "select")
    return keep, alpha_b, w, pr


def experts_backward(grad_out: Tensor, hidden: Tensor, topk_weights: Tensor, gate_up: Tensor,
                     down: Tensor, topk_ids: Tensor, cap_keep: Optional[Tensor],
                     pair_rank: Tensor, phi: Tensor, sg: Tensor, su: Tensor, pair_out: Tensor,
                     placement: Tensor, fwd_alloc: Tensor, quota: Tensor, bwd_alloc: Tensor,
                     meta: Tensor, handle: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients of hidden, topk_weights, gate_up and down from
    grad_out (T,D) and experts_forward's inputs and state (SAVED): score,
    per-expert selection at the plan's quotas, pack and the compact backward
    in liblrmoe. Registered as torch.ops.lrmoe.experts_backward."""
    layer = _layer_of(handle)
    idx = _device_io(layer.owner, layer.block.name, grad_out, hidden, topk_weights, gate_up, down,
                     topk_ids)
    if idx is not None and layer.owner.dist is not None:
        from . import dist as _dist
        return _dist.device_backward(layer, idx, grad_out, hidden, topk_weights, gate_up, down,
                                     topk_ids, cap_keep, pair_rank, phi, sg, su, pair_out,
                                     placement, fwd_alloc, quota, bwd_alloc, meta)
    if idx is not None:
        return _backward_device(layer, idx, grad_out, hidden, topk_weights, gate_up, down,
                                topk_ids, cap_keep, pair_rank, phi, sg, su, pair_out, placement,
                                fwd_alloc, quota, bwd_alloc, meta)
    if layer.owner.dist is not None:
        return layer.owner.dist_backward(layer, grad_out, hidden, topk_weights, gate_up, down,
                                         topk_ids, cap_keep, pair_rank, phi, sg, su, pair_out,
                                         placement, fwd_alloc, quota, bwd_alloc, meta)
    o, call, blk = layer.owner, _Call(), layer.block
    step, by_rank = (int(v) for v in meta.tolist())
    rec = layer.release(step)
    dt = _act_dtype(blk.name, hidden, gate_up, down)
    T, D = hidden.shape
    E, F, K, P = blk.E, blk.F, topk_ids.shape[1], o.ranks
    d = dict(T=T, E=E, K=K, D=D, F=F, P=P)
    c = torch.Tensor.contiguous  # saved-tensor hooks may unpack any layout
    x, ids, alpha = _pairs(hidden, topk_ids, topk_weights)
    pair_rank, phi, sg, su, pair_out = c(pair_rank), c(phi), c(sg), c(su), c(pair_out)
    placement, fwd_alloc, quota, bwd_alloc = _plan_arrays(placement, fwd_alloc, quota, bwd_alloc)
    W, keep_alive = _exec_weights(layer, gate_up, down, dt, placement, fwd_alloc, False)
    Pl = dict(placement=_buf("placement", placement, "U8", (E, P)),
              fwd_alloc=_buf("fwd_alloc", fwd_alloc, "I64", (E, P)))
    g = grad_out.contiguous()
    gdt = _TORCH_DT.get(g.dtype)
    if gdt is None:
        g, gdt = g.float(), "F32"
    _buf("grad_output", g, gdt, (T, D))
    seed = o.seed + step
    score = _score_host(o, call, T, K, D, gdt, g, alpha, phi, seed)
    keep, alpha_b, w, pr = _select(o, call, blk, T, K, E, P, score, ids, alpha, cap_keep,
                                   pair_rank, quota, bwd_alloc, by_rank, seed)
    # pack: assignment to the plan's backward allocation (the rows' layout)
    b = _lib.ExecArgs(o.cfg, d, W, Pl, topk_ids=_ptr(ids), keep=_ptr(keep),
                      pair_rank=_ptr(pair_rank), bwd_alloc=bwd_alloc.ctypes.data,
                      quota=quota.ctypes.data)
    check(call(lib.lrmoe_exec_args_pack, b.h), "pack")
    # the layout-only form (lrmoe-pack --layout-only): the CPU backend
    # gathers each segment's rows from x, sg, su and alpha*g by pack_pair
    # while it fills its buffers, the bits of the packed copies
    gh = torch.empty(T, D, dtype=torch.float32)
    gwg, gwu = o.scratch_grad(E, F, D)
    gwd = torch.empty(E, D, F, dtype=torch.float32)
    gtw = torch.empty(T, K, dtype=torch.float32)
    b.set(mode=2, act_dtype=_lib.DT[dt], grad_dtype=_lib.DT[gdt], topk_weights=_ptr(alpha_b),
          grad_output=_ptr(g), pair_out=_ptr(pair_out), hidden=_ptr(x), saved_gate=_ptr(sg),
          saved_up=_ptr(su), grad_hidden=_ptr(gh), grad_w_gate=_ptr(gwg),
          grad_w_up=_ptr(gwu), grad_w_down=_ptr(gwd), grad_topk_weights=_ptr(gtw))
    tim = (ctypes.c_double * (P * _STAGES))()
    check(call(lib.lrmoe_exec_args_backward, b.h, tim), f"{blk.name}: backward")
    rec["kept"], rec["moved"] = b.get("R"), b.get("moved")
    del keep_alive
    return _bwd_done(o, call, rec, keep, w, pr, gh, gtw, gwg, gwu, gwd, hidden, topk_weights,
                     gate_up)


def capacity_keep(topk_ids: Tensor, topk_weights: Tensor, handle: int) -> Tensor:
    """The capacity planner's keep mask (T,K) uint8 of one layer call
    (Patch.capacity_keep). Registered as torch.ops.lrmoe.capacity_keep."""
    layer = _layer_of(handle)
    blk = layer.block
    _check_ids(blk.name, topk_ids, blk.E)
    if layer.owner.dist is not None:  # over every rank's routing (lrmoe.dist)
        return layer.owner.dist_capacity_keep(layer, topk_ids, topk_weights)
    return torch.from_numpy(layer.owner.capacity_keep(topk_ids, topk_weights, blk.E))


def _forward_fake(hidden: Tensor, topk_weights: Tensor, gate_up: Tensor, down: Tensor,
                  topk_ids: Tensor, cap_keep: Optional[Tensor], handle: int,
                  train: bool) -> _FwdOut:
    layer = _layer_of(handle)
    E, F, P = layer.block.E, layer.block.F, layer.owner.ranks
    T, D = hidden.shape
    K = topk_ids.shape[1]
    n = T if train else 0
    e = hidden.new_empty
    i64 = torch.int64
    h = lambda *a, **k: torch.empty(*a, device="cpu", **k)  # noqa: E731  host arrays
    return (e(T, D), h((T, K), dtype=torch.int32), e((n, K), dtype=torch.float32), e((n, K, F)),
            e((n, K, F)), e((n, K, D)), h((E, P), dtype=torch.uint8), h((E, P), dtype=i64),
            h((E,), dtype=i64), h((E, P), dtype=i64), h((2,), dtype=i64))


def _backward_fake(grad_out: Tensor, hidden: Tensor, topk_weights: Tensor, gate_up: Tensor,
                   down: Tensor, *rest: Any) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    return (hidden.new_empty(hidden.shape), topk_weights.new_empty(topk_weights.shape),
            gate_up.new_empty(gate_up.shape), down.new_empty(down.shape))


def _capacity_fake(topk_ids: Tensor, topk_weights: Tensor, handle: int) -> Tensor:
    return topk_ids.new_empty(topk_ids.shape, dtype=torch.uint8)


def _setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    hidden, topk_weights, gate_up, down, topk_ids, cap_keep, handle, train = inputs
    ctx.handle = handle
    ctx.mark_non_differentiable(*output[1:])
    ctx.save_for_backward(hidden, topk_weights, gate_up, down, topk_ids, cap_keep, *output[1:])


def _backward(ctx: Any, grad_out: Tensor, *unused: Any) -> tuple:
    grads = _BWD(grad_out, *ctx.saved_tensors, ctx.handle)
    return (*grads, None, None, None, None)


class _ExpertsFunction(torch.autograd.Function):
    """experts_forward/experts_backward as an autograd.Function: the path
    where torch.library.custom_op is missing (torch < 2.4)."""

    @staticmethod
    def forward(ctx: Any, *inputs: Any) -> _FwdOut:  # type: ignore[override]
        out = experts_forward(*inputs)
        _setup_context(ctx, inputs, out)
        return out

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple:  # type: ignore[override]
        return _backward(ctx, *grads)


CUSTOM_OPS = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_fake")
if CUSTOM_OPS:
    _fwd_op = torch.library.custom_op("lrmoe::experts_forward", experts_forward,
                                      mutates_args=())
    _fwd_op.register_fake(_forward_fake)
    _bwd_op = torch.library.custom_op("lrmoe::experts_backward", experts_backward,
                                      mutates_args=())
    _bwd_op.register_fake(_backward_fake)
    _fwd_op.register_autograd(_backward, setup_context=_setup_context)
    _cap_op = torch.library.custom_op("lrmoe::capacity_keep", capacity_keep, mutates_args=())
    _cap_op.register_fake(_capacity_fake)
    _FWD: Callable[..., _FwdOut] = torch.ops.lrmoe.experts_forward
    _BWD: Callable[..., Tuple[Tensor, Tensor, Tensor, Tensor]] = torch.ops.lrmoe.experts_backward
    _CAP: Callable[..., Tensor] = torch.ops.lrmoe.capacity_keep
else:  # torch < 2.4: the same functions, eager only (torch.compile breaks the graph here)
    _FWD, _BWD, _CAP = _ExpertsFunction.apply, experts_backward, capacity_keep


def saved_state(output: Tensor) -> Dict[str, Any]:
    """The state a patched experts call saved for its backward, by name
    (SAVED), from its output while the backward has not run: the saved
    tensors (through any saved-tensor hooks), the call's stats record
    ("rec") and its block ("block"). For analysis (lrmoe.study_run)."""
    node = output.grad_fn
    handle = getattr(node, "handle", None)
    if handle is None:
        raise Error("saved_state: not the output of a patched experts call that saved state")
    st: Dict[str, Any] = dict(zip(SAVED, node.saved_tensors))
    layer = _layer_of(handle)
    st["rec"] = layer.held.get(int(st["meta"][0]))
    st["block"] = layer.block
    return st


class LRMoEExperts(torch.nn.Module):
    """What patch() installs in place of a Hugging Face experts module: the
    same Parameter objects under the same names (state_dict keys, optimizers
    and tied references unchanged), the same call, experts(hidden_states
    (T,D), top_k_index (T,K), top_k_weights (T,K)) -> (T,D), computed by
    torch.ops.lrmoe.experts_forward/_backward in liblrmoe. The original
    module is kept (not as a submodule) for unpatch() and answers the
    attributes this one lacks (config, act_fn, ...); forward hooks are
    shared with it, so a hook on either fires on the patched layer."""

    _HOOKS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
              "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs")

    def __init__(self, original: torch.nn.Module, layer: "_Layer") -> None:
        super().__init__()
        for n, p in original._parameters.items():
            self._parameters[n] = p
        for n, b in original._buffers.items():
            self._buffers[n] = b
        if layer.block.adapter.per_expert:
            # one module per expert: the same submodules (their parameters,
            # state_dict keys and optimizer entries unchanged)
            for n, m in original._modules.items():
                self._modules[n] = m
        self._non_persistent_buffers_set = set(original._non_persistent_buffers_set)
        for h in self._HOOKS:
            if hasattr(original, h):
                self.__dict__[h] = getattr(original, h)
        self.training = original.training
        self.__dict__["_lrmoe_original"] = original
        self.__dict__["_lrmoe_layer"] = layer
        self.handle = layer.handle

    @property
    def original(self) -> torch.nn.Module:
        """The Hugging Face experts module this one replaces."""
        return self.__dict__["_lrmoe_original"]

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            orig = self.__dict__.get("_lrmoe_original")
            if orig is None or name.startswith("__"):
                raise
            return getattr(orig, name)

    def extra_repr(self) -> str:
        layer = self.__dict__["_lrmoe_layer"]
        b, o = layer.block, layer.owner
        opts = "".join(f", {k}={v}" for k, v in o.plan_options.items() if k != "planner")
        return (f"{type(self.original).__name__}: experts={b.E}, hidden={b.D}, ffn={b.F}, "
                f"ranks={o.ranks}, planner={o.plan_options['planner']}{opts}, "
                f"metric={o.metric_name}, select={o.select_name}")

    def forward(self, hidden_states: Tensor, top_k_index: Tensor,
                top_k_weights: Tensor) -> Tensor:
        layer = self.__dict__["_lrmoe_layer"]
        b = layer.block
        gu, dn = b.op_weights(self)
        # what needs no data is checked here, before the op (and its fake
        # kernel) sees it; the ids' range inside the op
        _check_call(b.name, b.E, b.D, b.F, hidden_states, top_k_index, top_k_weights, gu, dn,
                    ids_range=False, Ew=layer.experts_held())
        _act_dtype(b.name, hidden_states, gu, dn)
        cap = None
        if layer.owner.capacity_factor is not None:
            # Megatron-Core's token dropping (planner="capacity"): the pairs
            # above each expert's capacity leave the layer in forward and
            # backward; their routing weight is zeroed here, in torch, so
            # they add nothing to the output and get no router gradient
            cap = _CAP(top_k_index, top_k_weights.detach(), self.handle)
            top_k_weights = top_k_weights * cap.to(top_k_weights.device, top_k_weights.dtype)
        train = torch.is_grad_enabled() and (
            hidden_states.requires_grad or top_k_weights.requires_grad or gu.requires_grad or
            dn.requires_grad)
        return _FWD(hidden_states, top_k_weights, gu, dn, top_k_index, cap, self.handle,
                    train)[0]


def _storage_split(gu, dn, F, placement, fwd_alloc, P, E=None, rank=None):
    """w_gate, w_up (E,F,D) and w_down (E,D,F) in the storage dtype from HF's
    (E,2F,D) and (E,D,F), for bfloat16 storage (float32 needs none: the CPU
    backend takes every matrix from the packed F32 copy, exec.h; shard=True
    is float32 only). With the packed F32 copy given, the CPU backend reads
    the storage arrays only to send an expert to the ranks holding a replica
    or helper instance of it (lrmoe_exec_weights_t in exec.h), so only those
    experts are copied; the rows of the others are never read. rank: one
    process of a group (lrmoe.dist) sends its native experts only, so only
    those of them are copied. down_proj is passed as it is when contiguous."""
    E = gu.shape[0] if E is None else E
    nat = np.array([lib.lrmoe_exec_native(e, E, P) for e in range(E)])
    remote = placement.astype(bool)
    remote[np.arange(E), nat] = False
    fa = fwd_alloc.copy()
    fa[np.arange(E), nat] = 0
    need = remote.any(1) | (fa > 0).any(1)
    if rank is not None:
        need &= nat == rank
    sent = np.nonzero(need)[0]
    w_gate = torch.empty(E, F, gu.shape[2], dtype=gu.dtype)
    w_up = torch.empty_like(w_gate)
    w_down = dn if dn.is_contiguous() else torch.empty(dn.shape, dtype=dn.dtype)
    if len(sent):
        idx = torch.from_numpy(sent)
        w_gate[idx] = gu[idx, :F]
        w_up[idx] = gu[idx, F:]
        if w_down is not dn:
            w_down[idx] = dn[idx]
    return w_gate, w_up, w_down


def _num(v):
    try:
        f = float(v)
        return int(f) if f.is_integer() and "." not in v and "e" not in v.lower() else f
    except ValueError:
        return v


class Patch:
    """Returned by patch(): .stats is the list of per-invocation records
    (layer, step, rho, fwd_peak, bwd_peak, fwd_lb, bwd_lb, replicas,
    feasible, mem_peak (modelled bytes), binding, pairs, kept, moved,
    keep_rule ("by-rank" when the plan keeps pairs by forward rank,
    plan.keep of lrmoe-stream(5)), keep (the mask, with keep_masks=True;
    with select="sample" also pair_weight, 1/p of each kept pair, and
    pair_prob, p), and
    {fwd,bwd}_seconds / _cpu_seconds / _lib_seconds / _lib_cpu_seconds: wall
    and thread-CPU time of the whole forward/backward and inside liblrmoe;
    each also under its unit-suffixed name, UNIT_KEYS: mem_peak_bytes,
    t_comm_s, fwd_s, fwd_cpu_s, fwd_lib_s, fwd_lib_cpu_s, bwd_...);
    .modules the installed LRMoEExperts; unpatch() puts the original
    experts modules back (with the parameters they share, trained)."""

    def __init__(self, model: torch.nn.Module, rate: Optional[float], hbm: Any, metric: str,
                 ranks: int, planner: str, threads: Optional[int], seed: int, keep_masks: bool,
                 options: Dict[str, Any], select: str = "sample", group: Any = None,
                 shard: bool = False) -> None:
        self.blocks = find_blocks(model)
        self.model, self.sharded = model, bool(shard)
        self.dist = None
        # test only (lrmoe-python(3)): CPU tensors take the CUDA path, on the
        # fake CUDA module of tests/gpu/build-fake-module.sh
        self.fake_device = os.environ.get(FAKE_DEVICE_ENV, "") == "1"
        if shard and group is None:
            raise Error("shard=True needs group= (each process keeps its native experts)")
        if group is not None:  # one process per rank (lrmoe.dist)
            from . import dist as _dist
            self.dist = _dist.Group(group)
            self.dist_forward, self.dist_backward = _dist.forward, _dist.backward
            self.dist_capacity_keep = _dist.capacity_keep
            if ranks not in (1, self.dist.P):
                raise Error(f"ranks={ranks} but the process group has {self.dist.P} ranks")
            ranks = self.dist.P
        self.ranks = _lib.i32("ranks", ranks, 1, 4096)
        for b in self.blocks:
            if b.E % self.ranks:
                raise Error(f"{b.name}: {b.E} experts do not split over ranks={self.ranks}")
        m = ctypes.c_int()
        check(lib.lrmoe_score_metric_parse(_lib.cstr("metric", str(metric)), ctypes.byref(m)))
        self.metric, self.seed, self.keep_masks = m.value, _lib.u64("seed", seed), keep_masks
        sel = ctypes.c_int()
        check(lib.lrmoe_score_keep_rule_parse(_lib.cstr("select", str(select)), ctypes.byref(sel)))
        self.select = sel.value
        self.metric_name, self.select_name = str(metric), str(select)
        self.plan_options: Dict[str, Any] = {"planner": planner, **options}
        if rate is not None:
            self.plan_options["rate"] = rate
        if hbm is not None:
            self.plan_options["hbm"] = hbm
        self.capacity_factor = self.plan_options.get("capacity_factor")
        if self.capacity_factor is not None:
            if planner != "capacity":
                raise Error("capacity_factor= goes with planner=\"capacity\" (Megatron-Core's "
                            "token dropping), not with planner=\"%s\"" % planner)
            self.capacity_factor = _lib.f64("capacity_factor", self.capacity_factor)
            pol = ctypes.c_int()
            check(lib.lrmoe_capacity_policy_parse(_lib.cstr(
                "drop_policy", str(self.plan_options.get("drop_policy", "probs"))),
                ctypes.byref(pol)), "drop_policy")
            self.drop_policy = pol.value
        elif planner == "capacity":
            raise Error('planner="capacity" needs capacity_factor= (e.g. 1.0 or 1.25)')
        Planner(ranks=self.ranks, **self.plan_options)  # bad options fail here, once
        # the exec's cfg by name (lrmoe_exec_args_t); F32 numerics: the layer
        # hands liblrmoe packed F32 weights (w_f32) and, for bfloat16
        # storage, the experts that cross ranks in it (F32: w_f32 only)
        self.cfg: Dict[str, Any] = dict(
            threads=_lib.i32("threads", threads if threads is not None
                             else torch.get_num_threads(), 0, 1024),
            compute=_lib.COMPUTE_F32)
        self.stats: List[Dict[str, Any]] = []
        self.steps: Dict[int, int] = {}
        self.layers: List[_Layer] = []
        self.modules: List[LRMoEExperts] = []
        self._scratch: Optional[Tensor] = None
        if shard:
            nat = [[e for e in range(b.E) if lib.lrmoe_exec_native(e, b.E, self.ranks) ==
                    self.dist.rank] for b in self.blocks]
            for b in self.blocks:
                if b.adapter is None or b.adapter.per_expert:
                    raise Error(f"{b.name}: shard=True takes experts stacked as [E, ...] "
                                "parameters (not one module per expert)")
        for i, b in enumerate(self.blocks):
            layer = _Layer(self, b)
            if shard:
                layer.shard = (nat[i][0], nat[i][-1] + 1)
            layer.adopt_packed()
            self.layers.append(layer)
            mod = LRMoEExperts(b.experts, layer)
            b.install(mod, True)  # nn.Module.__setattr__: registered as the submodule
            self.modules.append(mod)

    def capacity_keep(self, ids: Tensor, weights: Tensor, E: int) -> np.ndarray:
        """The keep mask (T,K) uint8 of capacity-factor dropping
        (lrmoe_capacity_keep, lib/capacity.h) for one layer call."""
        T, K = ids.shape
        idc = ids.detach().to("cpu", torch.int32).contiguous()
        wc = weights.detach().to("cpu", torch.float32).contiguous()
        cap = lib.lrmoe_capacity(T, K, E, self.capacity_factor)
        check(cap, "capacity")
        keep = np.empty((T, K), np.uint8)
        check(lib.lrmoe_capacity_keep(T, K, E, _buf("topk_ids", idc, "I32", (T, K)),
                                      _buf("topk_weights", wc, "F32", (T, K)), cap,
                                      self.drop_policy, _buf("keep", keep, "U8", (T, K), True),
                                      None), "capacity")
        return keep

    def scratch_grad(self, E: int, F: int, D: int) -> Tuple[Tensor, Tensor]:
        """Two (E,F,D) F32 buffers for grad_w_gate/grad_w_up, shared by the
        layers (each backward concatenates them into a new gate_up gradient);
        sharded, with only the native rows ever written (_virtual)."""
        if self._scratch is None or self._scratch[0].shape != (E, F, D):
            mk = _virtual if self.sharded else (lambda s: torch.empty(s, dtype=torch.float32))
            self._scratch = (mk((E, F, D)), mk((E, F, D)))
        return self._scratch[0], self._scratch[1]

    def _shards(self) -> Dict[str, Tuple[int, int, int]]:
        """state_dict key -> (lo, hi, E) of every sharded expert parameter."""
        ids = {}
        for layer in self.layers:
            b = layer.block
            if layer.shard is None:
                continue
            for attr in b.adapter.weights.values():
                ids[id(adapters.resolve(b.installed(), attr))] = (*layer.shard, b.E)
        return {n: ids[id(p)] for n, p in self.model.named_parameters(remove_duplicate=False)
                if id(p) in ids}

    def full_state_dict(self) -> Dict[str, Tensor]:
        """model.state_dict() with every sharded expert parameter whole (E
        rows: the ranks' shards all-gathered, rank after rank), loadable
        into the unsharded model; a collective: every rank calls it. Without
        shard=True, model.state_dict()."""
        sd = self.model.state_dict()
        if not self.sharded:
            return sd
        import torch.distributed as tdist
        g = self.dist
        for k, (lo, hi, E) in sorted(self._shards().items()):
            t = sd[k].detach().contiguous()
            parts = [t.new_empty(t.shape) for _ in range(g.P)]
            g.collective(f"full_state_dict: {k}", tdist.all_gather, parts, t)
            sd[k] = torch.cat(parts, 0)
            if sd[k].shape[0] != E:
                raise Error(f"full_state_dict: {k}: {sd[k].shape[0]} experts gathered, not {E}")
        return sd

    def load_full_state_dict(self, sd: Dict[str, Tensor], strict: bool = True) -> Any:
        """Load a full (unsharded) state dict: each rank copies its native
        experts' rows [lo, hi) into its shard (in place: the packed buffer
        stays), everything else as model.load_state_dict does."""
        sh = self._shards() if self.sharded else {}
        part = {k: (v[sh[k][0]:sh[k][1]] if k in sh else v) for k, v in sd.items()}
        return self.model.load_state_dict(part, strict=strict)

    def unpatch(self) -> None:
        """Put every block's original experts module back, holding the
        parameters the patched one holds now (the same objects unless one
        was replaced), their memory contiguous again. A second call does
        nothing."""
        for layer, mod in zip(self.layers, self.modules):
            b = layer.block
            if layer.cuda is not None:  # waits for its queued frames, frees it
                layer.cuda.free()
                layer.cuda = None
            if b.installed() is not mod:
                continue
            layer.release_packed()
            orig = mod.original
            for n, p in mod._parameters.items():
                orig._parameters[n] = p
            for n, t in mod._buffers.items():
                orig._buffers[n] = t
            for n, m in mod._modules.items():
                orig._modules[n] = m
            orig.train(mod.training)
            b.install(orig, False)

    def __enter__(self) -> "Patch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.unpatch()


def patch(model: torch.nn.Module, rate: Optional[float] = None, hbm: Any = None,
          metric: str = "lrm", ranks: int = 1, planner: str = "lrmoe",
          threads: Optional[int] = None, seed: int = 0, keep_masks: bool = False,
          select: str = "sample", group: Any = None, shard: bool = False,
          **plan_options: Any) -> Patch:
    """Replace the experts module of every supported MoE block by an
    LRMoEExperts module (visible in print(model); same parameters and
    state_dict keys) computing on `ranks` simulated expert-parallel ranks in
    liblrmoe. rate: the one
    retention rate to plan for (None: lrmoe-plan's candidate list), hbm:
    the per-rank budget ("16GiB" or bytes), metric: lrm, gradnorm, absgrad,
    random or uniform; select: "sample" (default: the unbiased draw, p ~
    sqrt(score), kept rows weighted 1/p, lrmoe-score(1); it trains best in
    lrmoe-study's paired seeds) or "topk" (each expert's quota highest
    scores, the LRMoE paper's rule, a biased estimator); planner=
    "capacity" with capacity_factor=F (and drop_policy="probs"|"position"):
    Megatron-Core's capacity-factor token dropping (the pairs above an
    expert's capacity leave forward and backward; lrmoe-plan(1)); other lrmoe-plan options by name (window=, min_keep=,
    best_effort=True, ...). keep_masks=True keeps each backward's keep mask
    in its stats record. threads: BLAS threads (default torch's).
    float32 expert parameters are moved (their .data, not the Parameter
    objects) into one buffer in lrmoe's packed layout, so no step copies
    them; unpatch() (or lrmoe.torch.unpatch(model)) gives them contiguous
    memory of their own again and puts the original modules back.
    group=pg: one expert-parallel rank per process (lrmoe.dist); with
    shard=True each process then keeps only its native experts
    [floor(rE/P), floor((r+1)E/P)) (float32 CPU or CUDA experts stacked as
    [E, ...] parameters; on CUDA the rank's executor holds only those and
    its replicas' weights): the parameters become those rows (state_dict
    shapes too),
    Patch.full_state_dict() gathers the whole ones, load_full_state_dict()
    loads them (unpatch() leaves the shards)."""
    return Patch(model, rate, hbm, metric, ranks, planner, threads, seed, keep_masks,
                 plan_options, select=select, group=group, shard=shard)


def unpatch(model: torch.nn.Module) -> int:
    """Put back the original experts module of every LRMoEExperts in model
    (Patch.unpatch of the patches that installed them); the count."""
    n = 0
    for _, m in list(model.named_modules()):
        if isinstance(m, LRMoEExperts):
            layer = m.__dict__["_lrmoe_layer"]
            before = m
            layer.owner.unpatch()
            n += layer.block.installed() is not before
    return n


# ------------------------------------------------------------ memory budget

def _expert_param_ids(model):
    """ids of the routed-expert parameters: those of the experts module of
    every MoE block (fused gate_up_proj/down_proj, patched or not)."""
    ids = set()
    for _, m in model.named_modules():
        if _is_moe_like(m):
            ids.update(id(p) for p in m.experts.parameters())
    if not ids:
        raise Error(f"{type(model).__name__} has no MoE experts module (gate_up_proj, "
                    "down_proj)")
    return ids


def _optim_bytes(optimizer, params):
    """Optimizer state bytes per parameter: from its state tensors (those of a
    parameter's size; the scalar step is not per-parameter state) when it has
    taken a step, else by type (Adam, AdamW: two moments in the parameter's
    dtype, as torch keeps them; SGD: a momentum buffer if momentum)."""
    state = getattr(optimizer, "state", {})
    if state:
        nbytes = nparams = 0
        for p in params:
            st = state.get(p)
            if not st:
                continue
            nparams += p.numel()
            nbytes += sum(t.numel() * t.element_size() for t in st.values()
                          if torch.is_tensor(t) and t.numel() == p.numel())
        if nparams:
            return -(-nbytes // nparams)
    es = max((p.element_size() for p in params), default=4)
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return 2 * es
    if isinstance(optimizer, torch.optim.SGD):
        return es if any(g.get("momentum", 0) for g in optimizer.param_groups) else 0
    raise Error(f"{type(optimizer).__name__}: its state size is not known before its first "
                "step; pass optim_bytes=")


def budget(model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, *,
           gpu_mem: Union[int, str, None] = None, reserve: Union[int, str] = 0, tp: int = 1,
           pp: int = 1, dp: int = 1, ep: int = 1, seq: int = 4096, micro_batch: int = 1,
           checkpoint: str = "full", zero1: bool = False, grad_dtype: Optional[str] = None,
           act_dtype: Optional[str] = None, optim_bytes: Optional[int] = None
           ) -> Dict[str, Any]:
    """The per-layer budget -M of lrmoe-plan for a live Hugging Face MoE model
    (patched by lrmoe.torch.patch or not) and its optimizer: lrmoe-budget's
    breakdown (a dict keyed as its --tsv columns), computed by the same C
    function from model.config, with the expert and other parameter counts
    counted on the model (one shard's model counts as the whole model: pass
    the unsharded one), parameter bytes from the parameters' dtype (the
    dtype holding most of them), gradient and activation bytes the same unless
    grad_dtype/act_dtype ("f32", "bf16", "f16") say otherwise, and optimizer
    bytes per parameter from its state (or optim_bytes=). gpu_mem: where CUDA is
    available and none is given, torch.cuda.mem_get_info()'s total, and the
    memory in use outside PyTorch's allocator (CUDA context, NCCL: total - free
    - memory_reserved) is added to reserve; without CUDA gpu_mem is required."""
    from . import _budget
    cfg = getattr(model, "config", None)
    if cfg is None:
        raise Error(f"{type(model).__name__} has no .config (a Hugging Face model)")
    m = _budget.model(cfg)
    params = list(model.parameters())  # each shared (tied) tensor once
    ex = _expert_param_ids(model)
    expert_total = sum(p.numel() for p in params if id(p) in ex)
    other_total = sum(p.numel() for p in params if id(p) not in ex)
    moe_layers = m.get("moe_layers")
    if expert_total % moe_layers:
        raise Error(f"{expert_total} expert parameters do not split over {moe_layers} MoE "
                    "layers of the config")
    m.set("expert-params", expert_total // moe_layers).set("dense-params", other_total)
    by_size = {}
    for p in params:
        by_size[p.element_size()] = by_size.get(p.element_size(), 0) + p.numel()
    pb = max(by_size, key=by_size.get)
    gb = _budget._dtype_bytes("grad_dtype", grad_dtype) if grad_dtype else pb
    ab = _budget._dtype_bytes("act_dtype", act_dtype) if act_dtype else pb
    if optim_bytes is None:
        optim_bytes = _optim_bytes(optimizer, params) if optimizer is not None else 0
    reserve = _budget.size_bytes("reserve", reserve)
    if gpu_mem is None:
        if not torch.cuda.is_available():
            raise Error("gpu_mem: no CUDA device to ask (torch.cuda.mem_get_info): give gpu_mem=")
        free, total = torch.cuda.mem_get_info()
        gpu_mem = total
        reserve += max(0, total - free - torch.cuda.memory_reserved())
    return _budget.compute(m, gpu_mem, reserve, tp, pp, dp, ep, seq, micro_batch, checkpoint,
                           zero1, pb, gb, optim_bytes, ab, name="model")
