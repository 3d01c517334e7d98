"""route, plan, score and pack on arrays: each builds the frame the tool
would read, runs the library call the tool runs (lrmoe_route_topk,
lrmoe_plan_cfg_run = lrmoe_plan_compute + check + to_frame,
lrmoe_score_frame, lrmoe_pack_frame) and returns a Frame of the tensors
(and attributes) the tool adds. No algorithm is computed in Python."""
import ctypes
import os

import numpy as np

from . import _lib
from ._lib import Error, check, lib
from .frame import CFrame, Frame, dtype_of

_FLOAT = {"F32", "F16", "F64", "BF16"}


def _c(a, dtype):
    return np.ascontiguousarray(a, dtype=dtype)


def route(router_logits, k=8, router="softmax", renorm=False, scale=1.0, groups=0,
          topk_groups=0, expert_bias=None, threads=1, dtype=None):
    """Top-k routing of router_logits (T,E) as lrmoe-route does: returns a
    Frame with topk_ids (T,K) I32, topk_weights (T,K) F32, expert_load (E) I64.
    router: softmax | topk-softmax (gpt-oss) | sigmoid (DeepSeek-V3, GLM-4.5),
    groups/topk_groups: group-limited sigmoid routing, expert_bias: (E)
    selection-only bias. dtype="BF16" takes a uint16 array as BF16 bits."""
    lg = np.asarray(router_logits)
    dt = dtype or dtype_of(lg)
    if dt not in _FLOAT:
        raise Error(f"router_logits: dtype {dt}, expected a float dtype")
    if lg.ndim != 2:
        raise Error(f"router_logits: shape {list(lg.shape)}, expected [T,E]")
    lg = np.ascontiguousarray(lg)
    T, E = lg.shape
    o = _lib.RouteOpts()
    lib.lrmoe_route_opts_default(ctypes.byref(o))
    r = ctypes.c_int()
    check(lib.lrmoe_route_parse_router(str(router).encode(), ctypes.byref(r)))
    o.router, o.k, o.renorm, o.scale = r.value, int(k), int(bool(renorm)), float(scale)
    o.groups, o.topk_groups, o.threads = int(groups), int(topk_groups), int(threads)
    check(lib.lrmoe_route_check_opts(ctypes.byref(o)))
    check(lib.lrmoe_route_check(ctypes.byref(o), E))
    bias = None if expert_bias is None else _c(expert_bias, np.float32)
    if bias is not None and bias.shape != (E,):
        raise Error(f"expert_bias: shape {list(bias.shape)}, expected [{E}]")
    ids = np.empty((T, o.k), np.int32)
    w = np.empty((T, o.k), np.float32)
    load = np.empty(E, np.int64)
    check(lib.lrmoe_route_topk(ctypes.byref(o), T, E, _lib.DT[dt], lg.ctypes.data,
                               _lib.ptr(bias), ids.ctypes.data, w.ctypes.data,
                               load.ctypes.data))
    return Frame({"topk_ids": ids, "topk_weights": w, "expert_load": load})


class Planner:
    """lrmoe-plan's options, set by their long names (ranks=8, hbm="16GiB",
    planner="llep", rate=0.9, best_effort=True, min_keep=0.25, ...), kept in
    the library; run(load) plans one frame's per-expert loads. Like
    lrmoe-plan, a Planner keeps deployed EPLB's layout per layer from run to
    run (rebalance_every=N), so running it on the frames of a stream in
    order gives lrmoe-plan's plans frame by frame; reset() forgets them."""

    def __init__(self, **options):
        self.cfg = lib.lrmoe_plan_cfg_new()
        if not self.cfg:
            check(-1)
        for k, v in options.items():
            self.set(k, v)

    def set(self, name, value):
        if value is None or value is False:
            return
        n = name.replace("_", "-")
        if n == "rates" and not isinstance(value, str):
            value = ",".join(repr(float(x)) for x in value)
        val = None if value is True else str(value).encode()
        check(lib.lrmoe_plan_cfg_set(self.cfg, n.encode(), val))

    def reset(self):
        """Forget the EPLB layouts kept so far (a new stream)."""
        check(lib.lrmoe_plan_cfg_reset(self.cfg))

    def run_cframe(self, expert_load, layer=None, frame=None):
        """Plan into a CFrame holding `frame` (a Frame, or None) and the plan.
        The library takes D, F, K and tokens per rank from that frame (or
        the weights option) exactly as lrmoe-plan does."""
        load = _c(expert_load, np.int64)
        if load.ndim != 1 or load.size == 0:
            raise Error(f"expert_load: shape {list(load.shape)}, expected [E]")
        cf = CFrame(frame)
        if layer is not None:  # the key of the kept layout, as the frame's attribute
            check(lib.lrmoe_frame_set_attr(cf.ref, b"layer", str(layer).encode()), "layer")
        check(lib.lrmoe_plan_cfg_run(self.cfg, load.ctypes.data, load.size, cf.ref))
        return cf

    def run(self, expert_load, layer=None):
        """Plan expert_load of layer `layer` (the frame attribute; None: one
        unnamed layer, or the frame's own). expert_load is an array (E), or
        a Frame as lrmoe.read returns it: its expert_load is planned and its
        tensors and attributes say the model sizes, as lrmoe-plan reads them
        (an option that disagrees with the frame is an error; a frame that
        says nothing of F needs ffn= or weights=). Returns a Frame of the
        plan tensors and plan.* attributes (and layer)."""
        if isinstance(expert_load, Frame):
            fr = expert_load
            cf = self.run_cframe(fr["expert_load"], layer, fr)
            new = [n for n in cf.names() if n not in fr]
            out = cf.to_frame(names=set(new))
            out.attrs = {k: v for k, v in out.attrs.items()
                         if k not in fr.attrs or k == "layer"}
            return out
        return self.run_cframe(expert_load, layer).to_frame()

    def __del__(self):
        if lib is not None and getattr(self, "cfg", None):
            lib.lrmoe_plan_cfg_free(self.cfg)
            self.cfg = None


def plan(expert_load, ranks, topk_ids=None, hidden=None, **options):
    """Plan per-expert loads (E) for `ranks` ranks as lrmoe-plan does:
    returns a Frame with placement (E,P) U8, fwd_alloc, quota, bwd_alloc I64
    and the plan.* attributes (plan.rho, plan.fwd_peak, plan.bwd_peak,
    plan.replicas, plan.mem_peak, ...). Like the tool, the library takes K
    and tokens per rank from topk_ids (T,K) and D and the storage dtype from
    hidden (T,D) when given (an option that disagrees is an error); F from
    ffn= or weights= (a weights stream); options are lrmoe-plan's long
    options (planner, rate, rates, hbm, window, ffn, weights, min_keep,
    best_effort, ...). One call plans one frame: to plan a sequence of
    frames with the EPLB layouts kept between them (as lrmoe-plan does), use
    one Planner."""
    t = {"expert_load": np.asarray(expert_load)}
    if topk_ids is not None:
        t["topk_ids"] = np.asarray(topk_ids)
    if hidden is not None:
        t["hidden"] = np.asarray(hidden)
    fr = Frame(t)
    out = Planner(ranks=ranks, **options).run(fr)
    return out


def capacity(T, K, E, factor):
    """Megatron-Core's expert capacity ceil((T*K / E) * factor) for T
    tokens routed top-K over E experts (lrmoe_capacity, lrmoe-plan(1)
    CAPACITY): the most pairs each expert keeps under token dropping."""
    return check(lib.lrmoe_capacity(int(T), int(K), int(E), float(factor)))


def capacity_keep(topk_ids, topk_weights, E, factor, policy="probs", kept=False):
    """The pairs capacity-factor token dropping keeps (Megatron-Core
    moe_expert_capacity_factor=factor, moe_token_drop_policy=policy, no
    padding to capacity): each of the E experts keeps at most
    C = capacity(T, K, E, factor) of its pairs, T, K = topk_ids.shape.

    topk_ids (T,K) integer expert ids in [0,E); topk_weights (T,K) router
    weights (float32; may be None with policy="position"). policy "probs"
    keeps each expert's C pairs of highest weight, "position" its first C
    pairs in token order; equal weights go to the lower pair index t*K+k.
    Returns keep (T,K) uint8 (1 kept, 0 dropped), and with kept=True also
    the kept pairs per expert (E) int64, min(n_e, C). The selection is
    lrmoe_capacity_keep's (lib/capacity.c); bad input (an id out of range,
    a NaN weight, factor <= 0) raises lrmoe.Error."""
    ids = _c(topk_ids, np.int32)
    if ids.ndim != 2:
        raise Error(f"topk_ids: shape {list(ids.shape)}, expected [T,K]")
    T, K = ids.shape
    if not np.array_equal(ids, np.asarray(topk_ids)):
        raise Error("topk_ids: values do not fit int32")
    w = None if topk_weights is None else _c(topk_weights, np.float32)
    if w is not None and w.shape != ids.shape:
        raise Error(f"topk_weights: shape {list(w.shape)}, expected {list(ids.shape)}")
    p = ctypes.c_int()
    check(lib.lrmoe_capacity_policy_parse(str(policy).encode(), ctypes.byref(p)))
    C = capacity(T, max(K, 1), E, factor) if K else 0
    keep = np.empty((T, K), np.uint8)
    counts = np.empty(int(E), np.int64) if int(E) > 0 else None
    if K:
        check(lib.lrmoe_capacity_keep(T, K, int(E), ids.ctypes.data, _lib.ptr(w), C, p.value,
                                      keep.ctypes.data, _lib.ptr(counts)))
    elif counts is not None:
        counts[:] = 0
    return (keep, counts) if kept else keep


def _frame_call(inputs, dtypes, fn, attrs=None):
    given = {k: v for k, v in inputs.items() if v is not None}
    cf = CFrame(Frame(given, attrs=attrs,
                      dtypes={k: v for k, v in (dtypes or {}).items() if k in given}))
    fn(cf)
    names = [n for n in cf.names() if n not in given]
    return cf.to_frame(names=set(names))


def score(topk_ids, topk_weights, grad_output, phi_sqnorm=None, quota=None, drop=None,
          metric="lrm", seed=0, index=0, saved_gate=None, saved_up=None, fidelity=False,
          dtypes=None, bwd_alloc=None, pair_rank=None, keep_rule=None, select="topk"):
    """Pair scores and per-expert retention as lrmoe-score does: returns
    pair_score (T,K) F32, keep (T,K) U8 (and quota when drop= percent is
    given, score_fidelity with fidelity=True, pair_weight (T,K) F32 with
    select="sample") and the score.* attributes. select: "topk" (the
    quota highest scores, the LRMoE paper's rule) or "sample" (the unbiased
    draw of lrmoe-score --select sample; pair_weight = 1/p of each kept pair).
    Without drop, quota (E) says how many pairs each expert keeps;
    keep_rule="by-rank" (a plan's plan.keep) keeps by forward rank from
    bwd_alloc (E,P) and pair_rank (T,K), as lrmoe-score(1) describes."""
    o = _lib.ScoreOpts()
    lib.lrmoe_score_opts_default(ctypes.byref(o))
    m = ctypes.c_int()
    check(lib.lrmoe_score_metric_parse(str(metric).encode(), ctypes.byref(m)))
    o.metric, o.seed, o.fidelity = m.value, int(seed), int(bool(fidelity))
    sel = ctypes.c_int()
    check(lib.lrmoe_score_keep_rule_parse(str(select).encode(), ctypes.byref(sel)))
    o.select = sel.value
    o.drop_pct = -1.0 if drop is None else float(drop)
    if drop is None and quota is None:
        raise Error("score: give quota (E) or drop= (percent)")
    st = _lib.ScoreStats()
    inputs = dict(topk_ids=topk_ids, topk_weights=topk_weights, grad_output=grad_output,
                  phi_sqnorm=phi_sqnorm, quota=None if drop is not None else quota,
                  saved_gate=saved_gate, saved_up=saved_up, bwd_alloc=bwd_alloc,
                  pair_rank=pair_rank)
    attrs = {"plan.keep": keep_rule} if keep_rule else None
    return _frame_call(inputs, dtypes, lambda cf: check(
        lib.lrmoe_score_frame(cf.ref, int(index), ctypes.byref(o), ctypes.byref(st))),
        attrs=attrs)


_ALLOC = {"auto": 0, "plan": 1, "forward": 2}


def pack(keep, topk_ids, topk_weights, grad_output, hidden, saved_gate, saved_up,
         pair_rank=None, placement=None, bwd_alloc=None, quota=None, ranks=0,
         alloc="auto", strip=False, dtypes=None, pair_weight=None):
    """Physical packing of the retained pairs as lrmoe-pack does: returns
    pack_pair, pack_rank, pack_counts, pack_offsets, pack_grad, pack_hidden,
    pack_gate, pack_up and the pack.* attributes; pack_grad rows are scaled
    by pair_weight (T,K) when given (score(select="sample")). dtypes names the stored
    dtype of inputs given as float32 that the tool would see as BF16."""
    if alloc not in _ALLOC:
        raise Error(f"pack: alloc '{alloc}': expected auto, plan or forward")
    o = _lib.PackOpts()
    lib.lrmoe_pack_opts_default(ctypes.byref(o))
    o.alloc, o.P, o.strip = _ALLOC[alloc], int(ranks), int(bool(strip))
    inputs = dict(keep=keep, topk_ids=topk_ids, topk_weights=topk_weights,
                  grad_output=grad_output, hidden=hidden, saved_gate=saved_gate,
                  saved_up=saved_up, pair_rank=pair_rank, placement=placement,
                  bwd_alloc=bwd_alloc, quota=quota, pair_weight=pair_weight)
    return _frame_call(inputs, dtypes, lambda cf: check(
        lib.lrmoe_pack_frame(cf.ref, ctypes.byref(o))))


class Exec:
    """lrmoe-exec in-process (lrmoe_exec_frame): one phase over frames with
    a weights stream, keeping the weights and the packed F32 copy of the
    current layer between frames. run(frame) returns the tensors and exec.*
    attributes the phase adds."""

    def __init__(self, weights, phase="forward", mode="full", ranks=0, threads=0,
                 backend="cpu", allow_nonfinite=False):
        if phase not in ("forward", "backward"):
            raise Error(f"exec: phase '{phase}': expected forward or backward")
        o = _lib.ExecFrameOpts()
        lib.lrmoe_exec_frame_opts_default(ctypes.byref(o))
        m, b = ctypes.c_int(), ctypes.c_int()
        check(lib.lrmoe_exec_mode_parse(str(mode).encode(), ctypes.byref(m)))
        check(lib.lrmoe_backend_parse(str(backend).encode(), ctypes.byref(b)))
        o.backward, o.mode, o.ranks = int(phase == "backward"), m.value, int(ranks)
        o.cfg.backend, o.cfg.threads = b.value, int(threads)
        o.cfg.allow_nonfinite = int(bool(allow_nonfinite))
        self._path = os.fsencode(weights)  # borrowed by the context
        self.ctx = ctypes.create_string_buffer(_lib.EXEC_CTX_SIZE)
        lib.lrmoe_exec_ctx_init(self.ctx, ctypes.byref(o))
        lib.lrmoe_exec_ctx_weights_file(self.ctx, self._path)

    def run(self, frame, dtypes=None):
        given = dict(frame)
        cf = CFrame(Frame(given, getattr(frame, "attrs", {}),
                          {**getattr(frame, "dtypes", {}), **(dtypes or {})}))
        check(lib.lrmoe_exec_frame(self.ctx, cf.ref))
        before = set(getattr(frame, "attrs", {}))
        out = cf.to_frame(names={n for n in cf.names() if n not in given})
        out.attrs = {k: v for k, v in out.attrs.items() if k not in before or k.startswith("exec.")}
        return out

    def close(self):
        if getattr(self, "ctx", None) is not None and lib is not None:
            lib.lrmoe_exec_ctx_free(self.ctx)
            self.ctx = None

    __del__ = close


def forward(frame, weights, ranks=0, threads=0, backend="cpu"):
    """The expert-parallel forward of one frame (routing, and a plan when
    present) with the weights stream at `weights`, as lrmoe-exec --phase
    forward: output, pair_rank, phi_sqnorm, saved_gate, saved_up, pair_out."""
    return Exec(weights, "forward", ranks=ranks, threads=threads, backend=backend).run(frame)


def backward(frame, weights, mode="full", ranks=0, threads=0, backend="cpu"):
    """The backward of one frame as lrmoe-exec --phase backward --mode MODE
    (full, masked or compact): grad_hidden, grad_w_gate, grad_w_up,
    grad_w_down, grad_topk_weights."""
    return Exec(weights, "backward", mode=mode, ranks=ranks, threads=threads,
                backend=backend).run(frame)
