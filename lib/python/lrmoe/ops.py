"""route, plan, score and pack on arrays: each builds the frame the tool
would read, runs the library call the tool runs (lrmoe_route_topk,
lrmoe_plan_cfg_run = lrmoe_plan_compute + check + to_frame,
lrmoe_score_frame, lrmoe_pack_frame) and returns a Frame of the tensors
(and attributes) the tool adds. No algorithm is computed in Python."""
import ctypes
import os
from typing import Any, Mapping, Optional, Tuple, Union

import numpy as np

from . import _lib
from ._lib import Error, check, cstr, f64, i32, i64, lib
from .frame import ArrayLike, CFrame, Frame, dtype_of

_FLOAT = {"F32", "F16", "F64", "BF16"}


def _array(name, a):
    """a as a numpy array of a dtype lrmoe has, or Error naming it."""
    try:
        x = np.asarray(a)
    except (TypeError, ValueError, OverflowError) as e:
        raise Error(f"{name}: not an array ({e})") from None
    if x.dtype.str not in _lib._NP_DT:
        raise Error(f"{name}: numpy dtype {x.dtype} has no lrmoe dtype")
    return x


def _c(a, dtype, name="array"):
    """a converted to dtype (an integer dtype only when every value fits)."""
    x = _array(name, a)
    y = np.ascontiguousarray(x, dtype=dtype)
    if np.dtype(dtype).kind in "iu" and x.dtype != y.dtype:
        with np.errstate(invalid="ignore"):
            if x.dtype.kind == "f" and not np.isfinite(x).all():
                raise Error(f"{name}: non-finite values for {np.dtype(dtype)}")
            if not np.array_equal(y, x):
                raise Error(f"{name}: values do not fit {np.dtype(dtype)}")
    return y


def route(router_logits: ArrayLike, k: int = 8, router: str = "softmax", renorm: bool = False,
          scale: float = 1.0, groups: int = 0, topk_groups: int = 0,
          expert_bias: Optional[ArrayLike] = None, threads: int = 1,
          dtype: Optional[str] = None) -> Frame:
    """Top-k routing of router_logits (T,E) as lrmoe-route does: returns a
    Frame with topk_ids (T,K) I32, topk_weights (T,K) F32, expert_load (E) I64.
    router: softmax | topk-softmax (gpt-oss) | sigmoid (DeepSeek-V3, GLM-4.5),
    groups/topk_groups: group-limited sigmoid routing, expert_bias: (E)
    selection-only bias. dtype="BF16" takes a uint16 array as BF16 bits."""
    lg = _array("router_logits", router_logits)
    if dtype is not None and dtype not in _FLOAT:
        raise Error(f"dtype: {dtype!r}, expected one of {', '.join(sorted(_FLOAT))}")
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
    check(lib.lrmoe_route_parse_router(cstr("router", str(router)), ctypes.byref(r)), "router")
    o.router, o.k, o.renorm = r.value, i32("k", k), int(bool(renorm))
    o.scale = f64("scale", scale)
    o.groups, o.topk_groups = i32("groups", groups), i32("topk_groups", topk_groups)
    o.threads = i32("threads", threads, 1, 1024)
    check(lib.lrmoe_route_check_opts(ctypes.byref(o)))
    check(lib.lrmoe_route_check(ctypes.byref(o), E))
    if T * max(o.k, 1) > 2**40:
        raise Error(f"router_logits: {T} tokens x k={o.k}: too many pairs")
    bias = None if expert_bias is None else _c(_array("expert_bias", expert_bias), np.float32)
    if bias is not None and bias.shape != (E,):
        raise Error(f"expert_bias: shape {list(bias.shape)}, expected [{E}]")
    ids = np.empty((T, o.k), np.int32)
    w = np.empty((T, o.k), np.float32)
    load = np.empty(E, np.int64)
    # the logits are read as T*E elements of dt: dtype= must be the array's
    check(lib.lrmoe_route_topk(ctypes.byref(o), T, E, _lib.DT[dt],
                               _lib.buf("router_logits", lg, dt, (T, E)),
                               _lib.buf("expert_bias", bias, "F32", (E,)),
                               _lib.buf("topk_ids", ids, "I32", (T, o.k), True),
                               _lib.buf("topk_weights", w, "F32", (T, o.k), True),
                               _lib.buf("expert_load", load, "I64", (E,), True)))
    return Frame({"topk_ids": ids, "topk_weights": w, "expert_load": load})


class Planner:
    """lrmoe-plan's options, set by their long names (ranks=8, hbm="16GiB",
    planner="llep", rate=0.9, best_effort=True, min_keep=0.25, ...), kept in
    the library; run(load) plans one frame's per-expert loads. Like
    lrmoe-plan, a Planner keeps deployed EPLB's layout per layer from run to
    run (rebalance_every=N), so running it on the frames of a stream in
    order gives lrmoe-plan's plans frame by frame; reset() forgets them."""

    def __init__(self, **options: Any) -> None:
        self.cfg = lib.lrmoe_plan_cfg_new()
        if not self.cfg:
            check(-1)
        for k, v in options.items():
            self.set(k, v)

    def _cfg(self):
        if lib is None or not getattr(self, "cfg", None):
            raise Error("Planner: closed (its configuration was freed)")
        return self.cfg

    def set(self, name: str, value: Any) -> None:
        cfg = self._cfg()
        if value is None or value is False:
            return
        n = str(name).replace("_", "-")
        if n == "rates" and not isinstance(value, str):
            value = ",".join(repr(f64("rates", x)) for x in value)
        val = None if value is True else cstr(n, str(value))
        check(lib.lrmoe_plan_cfg_set(cfg, cstr("option name", n), val))

    def reset(self) -> None:
        """Forget the EPLB layouts kept so far (a new stream)."""
        check(lib.lrmoe_plan_cfg_reset(self._cfg()))

    def run_cframe(self, expert_load: ArrayLike, layer: Optional[int] = None,
                   frame: Optional[Frame] = None) -> CFrame:
        """Plan into a CFrame holding `frame` (a Frame, or None) and the plan.
        The library takes D, F, K and tokens per rank from that frame (or
        the weights option) exactly as lrmoe-plan does."""
        cfg = self._cfg()
        load = _c(expert_load, np.int64, "expert_load")
        if load.ndim != 1 or load.size == 0 or load.size > _lib.I32[1]:
            raise Error(f"expert_load: shape {list(load.shape)}, expected [E]")
        cf = CFrame(frame)
        if layer is not None:  # the key of the kept layout, as the frame's attribute
            check(lib.lrmoe_frame_set_attr(cf.ref, b"layer", cstr("layer", str(layer))),
                  "layer")
        check(lib.lrmoe_plan_cfg_run(cfg, _lib.buf("expert_load", load, "I64", (load.size,)),
                                     load.size, cf.ref))
        return cf

    def run(self, expert_load: ArrayLike, layer: Optional[int] = None) -> Frame:
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

    def close(self) -> None:
        """Free the configuration; the Planner raises Error from then on."""
        if lib is not None and getattr(self, "cfg", None):
            cfg, self.cfg = self.cfg, None
            lib.lrmoe_plan_cfg_free(cfg)

    __del__ = close


def plan(expert_load: ArrayLike, ranks: int, topk_ids: Optional[ArrayLike] = None,
         hidden: Union[ArrayLike, int, None] = None, **options: Any) -> Frame:
    """Plan per-expert loads (E) for `ranks` ranks as lrmoe-plan does:
    returns a Frame with placement (E,P) U8, fwd_alloc, quota, bwd_alloc I64
    and the plan.* attributes (plan.rho, plan.fwd_peak, plan.bwd_peak,
    plan.replicas, plan.mem_peak, ...). Like the tool, the library takes K
    and tokens per rank from topk_ids (T,K) and D and the storage dtype from
    hidden (T,D) when given (an option that disagrees is an error); a
    number for hidden is D itself (lrmoe-plan --hidden D); F from
    ffn= or weights= (a weights stream); options are lrmoe-plan's long
    options (planner, rate, rates, hbm, window, ffn, weights, min_keep,
    best_effort, ...). One call plans one frame: to plan a sequence of
    frames with the EPLB layouts kept between them (as lrmoe-plan does), use
    one Planner."""
    t = {"expert_load": _array("expert_load", expert_load)}
    if topk_ids is not None:
        t["topk_ids"] = _array("topk_ids", topk_ids)
    if hidden is not None:
        h = _array("hidden", hidden)
        if h.ndim == 0:  # a number: D, as lrmoe-plan --hidden
            if "hidden" in options:
                raise Error("hidden: given twice")
            options["hidden"] = i64("hidden", h.item(), 1)
        elif h.ndim != 2:
            raise Error(f"hidden: shape {list(h.shape)}, expected [T,D] (the activations) "
                        "or a number (D)")
        else:
            t["hidden"] = h
    fr = Frame(t)
    p = Planner(ranks=ranks, **options)
    try:
        return p.run(fr)
    finally:
        p.close()


def capacity(T: int, K: int, E: int, factor: float) -> int:
    """Megatron-Core's expert capacity ceil((T*K / E) * factor) for T
    tokens routed top-K over E experts (lrmoe_capacity, lrmoe-plan(1)
    CAPACITY): the most pairs each expert keeps under token dropping."""
    return check(lib.lrmoe_capacity(i64("T", T), i32("K", K), i32("E", E),
                                    f64("factor", factor)))


def capacity_keep(topk_ids: ArrayLike, topk_weights: ArrayLike, E: int, factor: float,
                  policy: str = "probs", kept: bool = False
                  ) -> Union[np.ndarray, Tuple[np.ndarray, np.ndarray]]:
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
    E = i32("E", E, 1, 1 << 24)  # the per-expert counts are allocated here
    ids = _c(topk_ids, np.int32, "topk_ids")
    if ids.ndim != 2:
        raise Error(f"topk_ids: shape {list(ids.shape)}, expected [T,K]")
    T, K = ids.shape
    w = None if topk_weights is None else _c(topk_weights, np.float32, "topk_weights")
    if w is not None and w.shape != ids.shape:
        raise Error(f"topk_weights: shape {list(w.shape)}, expected {list(ids.shape)}")
    p = ctypes.c_int()
    check(lib.lrmoe_capacity_policy_parse(cstr("policy", str(policy)), ctypes.byref(p)),
          "policy")
    C = capacity(T, max(K, 1), E, factor) if K else 0
    i32("K", K)
    keep = np.empty((T, K), np.uint8)
    counts = np.empty(E, np.int64) if E > 0 else None
    if K:
        check(lib.lrmoe_capacity_keep(T, K, E, _lib.buf("topk_ids", ids, "I32", (T, K)),
                                      _lib.buf("topk_weights", w, "F32", (T, K)), C, p.value,
                                      _lib.buf("keep", keep, "U8", (T, K), True),
                                      _lib.buf("counts", counts, "I64", (E,), True)))
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


def score(topk_ids: ArrayLike, topk_weights: ArrayLike, grad_output: ArrayLike,
          phi_sqnorm: Optional[ArrayLike] = None, quota: Optional[ArrayLike] = None,
          drop: Optional[float] = None, metric: str = "lrm", seed: int = 0, index: int = 0,
          saved_gate: Optional[ArrayLike] = None, saved_up: Optional[ArrayLike] = None,
          fidelity: bool = False, dtypes: Optional[Mapping[str, str]] = None,
          bwd_alloc: Optional[ArrayLike] = None, pair_rank: Optional[ArrayLike] = None,
          keep_rule: Optional[str] = None, select: str = "sample") -> Frame:
    """Pair scores and per-expert retention as lrmoe-score does: returns
    pair_score (T,K) F32, keep (T,K) U8 (and quota when drop= percent is
    given, score_fidelity with fidelity=True, pair_weight (T,K) F32 with
    select="sample") and the score.* attributes. select: "sample" (default:
    the unbiased draw of lrmoe-score; pair_weight = 1/p of each kept pair) or
    "topk" (the quota highest scores, the LRMoE paper's rule).
    Without drop, quota (E) says how many pairs each expert keeps;
    keep_rule="by-rank" (a plan's plan.keep) keeps by forward rank from
    bwd_alloc (E,P) and pair_rank (T,K), as lrmoe-score(1) describes."""
    m, sel = ctypes.c_int(), ctypes.c_int()
    check(lib.lrmoe_score_metric_parse(cstr("metric", str(metric)), ctypes.byref(m)), "metric")
    check(lib.lrmoe_score_keep_rule_parse(cstr("select", str(select)), ctypes.byref(sel)),
          "select")
    # lrmoe-score's ranges: --seed 0..2^63-1, --drop a percent in [0, 100] (NaN refused)
    opts = [("metric", str(metric)), ("select", str(select)), ("seed", str(i64("seed", seed, 0))),
            ("frame", str(i64("index", index, 0)))]
    if drop is not None:
        opts.append(("drop", repr(f64("drop", drop, 0, 100))))
    if fidelity:
        opts.append(("fidelity", None))
    if drop is None and quota is None:
        raise Error("score: give quota (E) or drop= (percent)")
    inputs = dict(topk_ids=topk_ids, topk_weights=topk_weights, grad_output=grad_output,
                  phi_sqnorm=phi_sqnorm, quota=None if drop is not None else quota,
                  saved_gate=saved_gate, saved_up=saved_up, bwd_alloc=bwd_alloc,
                  pair_rank=pair_rank)
    attrs = {"plan.keep": keep_rule} if keep_rule else None
    with _Handle("score", opts) as h:
        return _frame_call(inputs, dtypes, lambda cf: check(lib.lrmoe_score_run(h.x, cf.ref)),
                           attrs=attrs)


class _Handle:
    """A stage's opaque handle of api.h (lrmoe_STAGE_new), its options set by
    the tool's long names (value None: a flag), freed on leaving the block."""

    def __init__(self, stage: str, opts) -> None:
        self.stage = stage
        self.x = getattr(lib, f"lrmoe_{stage}_new")()
        if not self.x:
            raise Error(_lib.errmsg())
        for name, value in opts:
            v = None if value is None else cstr(name, value)
            if getattr(lib, f"lrmoe_{stage}_set")(self.x, name.encode(), v) < 0:
                err = _lib.errmsg()
                self.close()
                raise Error(err)

    def close(self) -> None:
        if self.x:
            getattr(lib, f"lrmoe_{self.stage}_free")(self.x)
            self.x = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_ALLOC = {"auto": 0, "plan": 1, "forward": 2}


def pack(keep: ArrayLike, topk_ids: ArrayLike, topk_weights: ArrayLike, grad_output: ArrayLike,
         hidden: ArrayLike, saved_gate: ArrayLike, saved_up: ArrayLike,
         pair_rank: Optional[ArrayLike] = None, placement: Optional[ArrayLike] = None,
         bwd_alloc: Optional[ArrayLike] = None, quota: Optional[ArrayLike] = None,
         ranks: int = 0, alloc: str = "auto", strip: bool = False,
         dtypes: Optional[Mapping[str, str]] = None,
         pair_weight: Optional[ArrayLike] = None) -> Frame:
    """Physical packing of the retained pairs as lrmoe-pack does: returns
    pack_pair, pack_rank, pack_counts, pack_offsets, pack_grad, pack_hidden,
    pack_gate, pack_up and the pack.* attributes; pack_grad rows are scaled
    by pair_weight (T,K) when given (score(select="sample")). dtypes names the stored
    dtype of inputs given as float32 that the tool would see as BF16."""
    if not isinstance(alloc, str) or alloc not in _ALLOC:
        raise Error(f"pack: alloc '{alloc}': expected auto, plan or forward")
    opts = [("alloc", alloc)]
    if i32("ranks", ranks, 0):  # 0: the plan's (lrmoe-pack without --ranks)
        opts.append(("ranks", str(int(ranks))))
    if strip:
        opts.append(("strip", None))
    inputs = dict(keep=keep, topk_ids=topk_ids, topk_weights=topk_weights,
                  grad_output=grad_output, hidden=hidden, saved_gate=saved_gate,
                  saved_up=saved_up, pair_rank=pair_rank, placement=placement,
                  bwd_alloc=bwd_alloc, quota=quota, pair_weight=pair_weight)
    with _Handle("pack", opts) as h:
        return _frame_call(inputs, dtypes, lambda cf: check(lib.lrmoe_pack_run(h.x, cf.ref)))


class Exec:
    """lrmoe-exec in-process (the opaque lrmoe_exec_t of api.h, options by
    lrmoe-exec's long names): one phase over frames with a weights stream,
    keeping the weights and the packed F32 copy of the current layer between
    frames. run(frame) returns the tensors and exec.* attributes the phase
    adds."""

    def __init__(self, weights: Any, phase: str = "forward", mode: str = "full", ranks: int = 0,
                 threads: int = 0, backend: str = "cpu", allow_nonfinite: bool = False) -> None:
        self.ctx = None
        if phase not in ("forward", "backward"):
            raise Error(f"exec: phase '{phase}': expected forward or backward")
        m, b = ctypes.c_int(), ctypes.c_int()
        check(lib.lrmoe_exec_mode_parse(cstr("mode", str(mode)), ctypes.byref(m)), "mode")
        check(lib.lrmoe_backend_parse(cstr("backend", str(backend)), ctypes.byref(b)),
              "backend")
        # lrmoe-exec's ranges: --ranks 0..4096 (0: the plan's), --threads 0..1024
        opts = [("weights", cstr("weights", weights)), ("phase", phase),
                ("backend", str(backend))]
        if phase == "backward":  # the forward has no modes
            opts.append(("mode", str(mode)))
        nranks = i32("ranks", ranks, 0, 4096)
        if nranks:
            opts.append(("ranks", str(nranks)))
        opts.append(("threads", str(i32("threads", threads, 0, 1024))))
        if allow_nonfinite:
            opts.append(("allow-nonfinite", None))
        self.ctx = _Handle("exec", opts)

    def run(self, frame: Mapping[str, Any], dtypes: Optional[Mapping[str, str]] = None
            ) -> Frame:
        if self.ctx is None or lib is None:
            raise Error("Exec: closed")
        if not isinstance(frame, dict):
            raise Error(f"frame: {type(frame).__name__}, expected a Frame or a dict of arrays")
        given = dict(frame)
        cf = CFrame(Frame(given, getattr(frame, "attrs", {}),
                          {**getattr(frame, "dtypes", {}), **(dtypes or {})}))
        check(lib.lrmoe_exec_run(self.ctx.x, cf.ref))
        before = set(getattr(frame, "attrs", {}))
        out = cf.to_frame(names={n for n in cf.names() if n not in given})
        out.attrs = {k: v for k, v in out.attrs.items() if k not in before or k.startswith("exec.")}
        return out

    def close(self) -> None:
        """Free the handle; run() raises Error from then on."""
        if getattr(self, "ctx", None) is not None and lib is not None:
            ctx, self.ctx = self.ctx, None
            ctx.close()

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def forward(frame: Mapping[str, Any], weights: Any, ranks: int = 0, threads: int = 0,
            backend: str = "cpu") -> Frame:
    """The expert-parallel forward of one frame (routing, and a plan when
    present) with the weights stream at `weights`, as lrmoe-exec --phase
    forward: output, pair_rank, phi_sqnorm, saved_gate, saved_up, pair_out."""
    with Exec(weights, "forward", ranks=ranks, threads=threads, backend=backend) as x:
        return x.run(frame)


def backward(frame: Mapping[str, Any], weights: Any, mode: str = "full", ranks: int = 0,
             threads: int = 0, backend: str = "cpu") -> Frame:
    """The backward of one frame as lrmoe-exec --phase backward --mode MODE
    (full, masked or compact): grad_hidden, grad_w_gate, grad_w_up,
    grad_w_down, grad_topk_weights."""
    with Exec(weights, "backward", mode=mode, ranks=ranks, threads=threads,
              backend=backend) as x:
        return x.run(frame)
