"""Which MoE blocks lrmoe.torch can patch and dump, and how it reads them:
one Adapter per registered block class (lrmoe.torch.register).

An adapter names, relative to the block module (dotted attribute paths):

  experts   the module holding the routed experts' weights; patch() puts an
            LRMoEExperts module (the same Parameter objects) in its place
  layout    how the weights are stored (LAYOUTS): lrmoe computes
            silu(x Wg^T) * (x Wu^T) Wd^T with Wg, Wu (F,D) and Wd (D,F)
  weights   the parameter names of the layout's roles, e.g. {"gate": "w1",
            "up": "w3", "down": "w2"} ({e} in them, the expert index, for
            the per-expert layouts: "{e}.w1.weight")
  router    the router module; with route=None only read (dump's logits,
            the weights stream's router_weight)
  route     None: the block routes itself and calls
            experts(hidden (T,D), top_k_index (T,K), top_k_weights (T,K))
            (Hugging Face transformers 5), so patch() replaces the experts
            module only. "softmax", "topk-softmax" or "sigmoid": the block's
            forward is replaced by lrmoe's: logits = router(x) (a module
            mapping (T,D) to (T,E), e.g. an nn.Linear), the K experts chosen
            by liblrmoe's router (lrmoe_route_topk(3), the rules of
            lrmoe-route(1) with k, renorm, scale, groups, topk_groups and
            the selection-only expert_bias), the routing weights formed from
            the logits in torch (so the router trains), the experts in
            liblrmoe, plus the shared experts (in torch)
  shared    the shared-experts module, added to the routed output (route
            blocks only; None: none)
  act       the experts' activation: "silu"/"swish", torch.nn.functional.silu
            or nn.SiLU, or a function of the experts module returning its
            name (Hugging Face: config.hidden_act); anything else is refused

k, renorm, scale, groups, topk_groups may be values or attribute paths (a
str) read on each block. Nothing here computes an expert: the adapter only
finds tensors and hands (T,D) hidden states, routing and (E,2F,D)/(E,D,F)
weight views to lrmoe.torch's ops.
"""
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from ._lib import Error

# layout -> {role: (shape as a string of E, F, D, transposed)}: the stored
# shape of each role's tensor; transposed: stored as the transpose of
# lrmoe's (E,F,D) gate/up and (E,D,F) down
LAYOUTS: Dict[str, Dict[str, Tuple[str, bool]]] = {
    # Hugging Face transformers 5: gate_up_proj = [W_gate; W_up] per expert
    "fused": {"gate_up": ("E,2F,D", False), "down": ("E,D,F", False)},
    # the same, stored transposed (transformers' is_transposed experts)
    "fused_t": {"gate_up": ("E,D,2F", True), "down": ("E,F,D", True)},
    # torchtitan's GroupedExperts: w1 (gate), w3 (up) (E,F,D), w2 (down) (E,D,F)
    "separate": {"gate": ("E,F,D", False), "up": ("E,F,D", False), "down": ("E,D,F", False)},
    # per-expert [D,F] matrices used as x @ W: gate, up (E,D,F), down (E,F,D)
    "separate_t": {"gate": ("E,D,F", True), "up": ("E,D,F", True), "down": ("E,F,D", True)},
    # one module per expert (an nn.ModuleList: transformers 4's Mixtral,
    # Megatron-Core's SequentialMLP): the paths hold {e}, the expert index;
    # nn.Linear weights (F,D), (D,F) are lrmoe's per-expert layout
    "per_expert": {"gate": ("F,D", False), "up": ("F,D", False), "down": ("D,F", False)},
    "per_expert_fused": {"gate_up": ("2F,D", False), "down": ("D,F", False)},
}
DEFAULT_WEIGHTS = {"fused": {"gate_up": "gate_up_proj", "down": "down_proj"},
                   "fused_t": {"gate_up": "gate_up_proj", "down": "down_proj"},
                   "separate": {"gate": "w1", "up": "w3", "down": "w2"},
                   "separate_t": {"gate": "w1", "up": "w3", "down": "w2"},
                   "per_expert": {"gate": "{e}.gate_proj.weight", "up": "{e}.up_proj.weight",
                                  "down": "{e}.down_proj.weight"},
                   "per_expert_fused": {"gate_up": "local_experts.{e}.linear_fc1.weight",
                                        "down": "local_experts.{e}.linear_fc2.weight"}}
# offset of each role in an expert's packed row [W_gate; W_up; W_down], in F*D
_OFFSET = {"gate_up": 0, "gate": 0, "up": 1, "down": 2}
ROUTES = ("softmax", "topk-softmax", "sigmoid")
_MISSING = object()


def resolve(obj: Any, path: str, default: Any = _MISSING) -> Any:
    """obj.a.b.c for path "a.b.c" (default when a part is missing, if given)."""
    for part in path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            if default is not _MISSING:
                return default
            raise
    return obj


def _assign(obj: Any, path: str, value: Any) -> None:
    head, _, last = path.rpartition(".")
    setattr(resolve(obj, head) if head else obj, last, value)


def _act_name(act: Any) -> Optional[str]:
    """"silu" for the silu spellings, the name of a string, None for a getter."""
    if act is torch.nn.functional.silu or act is torch.nn.SiLU or isinstance(act, torch.nn.SiLU):
        return "silu"
    if isinstance(act, str):
        return act
    return None


class _Join(torch.autograd.Function):
    """[gate; up] (E,2F,D) of two (E,F,D) tensors that already lie that way
    in one buffer (lrmoe's packed layout, _Layer.adopt_packed): a view, no
    copy; the gradient is split back into the two halves."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        E, F, D = gate.shape
        ctx.F = F
        return gate.as_strided((E, 2 * F, D), gate.stride())

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return g[:, :ctx.F], g[:, ctx.F:]


def _packed_rows(flat: List[torch.Tensor], roles: List[str]) -> bool:
    """flat (expert-major, roles in order) lies as lrmoe's packed (E, 3FD)
    buffer: expert e's role r at row e, offset _OFFSET[r]*F*D, contiguous."""
    t0 = flat[0]
    D = t0.shape[1]
    F = flat[len(roles) - 1].shape[1]  # down is (D,F)
    n, es, st = 3 * F * D, t0.element_size(), t0.untyped_storage().data_ptr()
    base = t0.data_ptr()
    for i, t in enumerate(flat):
        e, r = divmod(i, len(roles))
        if (not t.is_contiguous() or t.untyped_storage().data_ptr() != st or
                t.dtype != t0.dtype or
                t.data_ptr() != base + (e * n + _OFFSET[roles[r]] * F * D) * es):
            return False
    return True


class _Stack(torch.autograd.Function):
    """(gate_up (E,2F,D), down (E,D,F)) as views of the packed buffer that
    every expert's tensors lie in (_packed_rows); the gradients are split
    back per expert and role."""

    @staticmethod
    def forward(ctx: Any, roles: Tuple[str, ...], *flat: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        t0 = flat[0]
        D, F = t0.shape[1], flat[len(roles) - 1].shape[1]
        E = len(flat) // len(roles)
        ctx.roles, ctx.E, ctx.F = roles, E, F
        n = 3 * F * D
        return (t0.as_strided((E, 2 * F, D), (n, D, 1)),
                t0.as_strided((E, D, F), (n, F, 1), t0.storage_offset() + 2 * F * D))

    @staticmethod
    def backward(ctx: Any, ggu: torch.Tensor, gdn: torch.Tensor) -> tuple:
        F, out = ctx.F, [None]
        part = {"gate_up": lambda e: ggu[e], "gate": lambda e: ggu[e, :F],
                "up": lambda e: ggu[e, F:], "down": lambda e: gdn[e]}
        for e in range(ctx.E):
            out += [part[r](e) for r in ctx.roles]
        return tuple(out)


def _compiling() -> bool:
    c = getattr(torch, "compiler", None)
    return bool(c is not None and hasattr(c, "is_compiling") and c.is_compiling())


def _adjacent(gate: torch.Tensor, up: torch.Tensor) -> bool:
    """up follows gate row by row in one buffer: [W_gate; W_up] per expert."""
    E, F, D = gate.shape
    s = gate.stride()
    return (s[1:] == (D, 1) and up.stride() == s and s[0] >= 2 * F * D and
            gate.untyped_storage().data_ptr() == up.untyped_storage().data_ptr() and
            up.data_ptr() == gate.data_ptr() + F * D * gate.element_size())


class Adapter:
    """How lrmoe.torch reads one registered MoE block class (see the module
    docstring; made by lrmoe.torch.register)."""

    def __init__(self, cls: Union[type, str], experts: str = "experts", layout: str = "fused",
                 weights: Optional[Dict[str, str]] = None, router: Optional[str] = "gate",
                 route: Optional[str] = None, k: Union[int, str, None] = None,
                 renorm: Union[bool, str] = False, scale: Union[float, str] = 1.0,
                 groups: Union[int, str] = 0, topk_groups: Union[int, str] = 0,
                 expert_bias: Optional[str] = None, shared: Optional[str] = None,
                 act: Any = "silu", load: Optional[str] = None, route_from: Optional[str] = None,
                 scaled_input: Optional[str] = None) -> None:
        if not isinstance(cls, (type, str)) or not cls:
            raise Error(f"register: cls is {cls!r}, expected a class or a class name")
        self.cls = cls
        self.name = cls if isinstance(cls, str) else cls.__name__
        w = f"register({self.name})"
        if layout not in LAYOUTS:
            raise Error(f"{w}: layout '{layout}': unknown; one of " + ", ".join(LAYOUTS))
        roles = LAYOUTS[layout]
        names = dict(DEFAULT_WEIGHTS[layout], **(weights or {}))
        extra = sorted(set(names) - set(roles))
        if extra:
            raise Error(f"{w}: weights {extra}: not roles of layout '{layout}' (" +
                        ", ".join(roles) + ")")
        for p in [experts] + list(names.values()):
            if not isinstance(p, str) or not p:
                raise Error(f"{w}: attribute path {p!r}: expected a non-empty str")
        self.per_expert = layout.startswith("per_expert")
        for role, p in names.items():
            if ("{e}" in p) != self.per_expert:
                raise Error(f"{w}: weights['{role}'] = '{p}': " + (
                    "a per-expert layout's paths hold {e}, the expert index" if self.per_expert
                    else "{e} belongs to the per_expert layouts"))
        if route is not None and route not in ROUTES:
            raise Error(f"{w}: route '{route}': unknown; one of None (the block routes and "
                        "calls experts(hidden, top_k_index, top_k_weights)), " + ", ".join(ROUTES))
        if route_from is not None and route is None:
            raise Error(f"{w}: route_from= needs route= (the default convention)")
        if route is not None:
            if router is None:
                raise Error(f"{w}: route='{route}' needs router= (the module giving the logits)")
            if k is None:
                raise Error(f"{w}: route='{route}' needs k= (experts per token, or the "
                            "attribute holding it)")
        elif shared is not None:
            raise Error(f"{w}: shared= goes with route=: a block that routes itself adds its "
                        "own shared experts")
        name = _act_name(act)
        if name is not None and name not in ("silu", "swish"):
            raise Error(f"{w}: activation '{name}' is not silu: lrmoe's experts are SwiGLU "
                        "(silu(x Wg^T) * (x Wu^T) Wd^T)")
        if name is None and (not callable(act) or isinstance(act, (type, torch.nn.Module)) or
                             str(getattr(act, "__module__", "")).startswith("torch")):
            raise Error(f"{w}: act={getattr(act, '__name__', act)!r}: expected 'silu', a silu "
                        "module or function, or a "
                        "function of the experts module giving the activation's name")
        self.experts, self.layout, self.weights = experts, layout, names
        self.router, self.route, self.shared, self.load = router, route, shared, load
        self.expert_bias, self.act = expert_bias, act
        self.route_from, self.scaled_input = route_from, scaled_input
        self.opts = {"k": k, "renorm": renorm, "scale": scale, "groups": groups,
                     "topk_groups": topk_groups}

    def __repr__(self) -> str:
        return (f"Adapter({self.name}, experts={self.experts!r}, layout={self.layout!r}, "
                f"weights={self.weights}, router={self.router!r}, route={self.route!r})")

    def route_for(self, block: torch.nn.Module) -> Optional[str]:
        """The route convention of one block (route_from read on it, else route)."""
        if self.route_from is None:
            return self.route
        return resolve(block, self.route_from, None) or self.route

    def check(self, block: torch.nn.Module, where: str) -> None:
        """What a found block must satisfy beyond its weights' shapes: a
        known route, an input not scaled by the routing weight."""
        rt = self.route_for(block)
        if rt not in ROUTES and rt is not None:
            raise Error(f"{where}: {self.route_from} is {rt!r}, expected one of " +
                        ", ".join(ROUTES))
        if self.scaled_input and resolve(block, self.scaled_input, False):
            raise Error(f"{where}: {self.scaled_input}=True scales the experts' input by the "
                        "routing weight (SwiGLU(a x)), which is not lrmoe's a SwiGLU(x); build "
                        f"the block with {self.scaled_input}=False")

    def opt(self, block: torch.nn.Module, key: str) -> Any:
        """An option's value for one block (an attribute path is read on it)."""
        v = self.opts[key]
        return resolve(block, v) if isinstance(v, str) else v

    # ---- weights

    def _per_expert(self, ex: torch.nn.Module, where: Optional[str]
                    ) -> Dict[str, List[torch.Tensor]]:
        """role -> the tensors of experts 0, 1, ... (as many as the first
        role's path finds), each checked to be a 2-d tensor when where is given."""
        out: Dict[str, List[torch.Tensor]] = {}
        E = None
        for role, attr in self.weights.items():
            ts = []
            while E is None or len(ts) < E:
                t = resolve(ex, attr.format(e=len(ts)), None)
                if t is None and E is None and ts:
                    break
                if where is not None and (not isinstance(t, torch.Tensor) or t.dim() != 2):
                    desc = (f"is {list(t.shape)}, expected [{LAYOUTS[self.layout][role][0]}]"
                            if isinstance(t, torch.Tensor) else
                            f"is {type(t).__name__}, not a tensor")
                    raise Error(f"{where}: {self.experts}.{attr.format(e=len(ts))} ({role} of "
                                f"layout '{self.layout}') {desc}")
                ts.append(t)
            E = len(ts)
            out[role] = ts
        return out

    def params(self, ex: torch.nn.Module, where: str) -> Dict[str, Any]:
        """role -> the stored tensor (a list of them, per expert), each
        checked to exist and have the layout's rank."""
        if self.per_expert:
            return self._per_expert(ex, where)
        out = {}
        for role, attr in self.weights.items():
            t = resolve(ex, attr, None)
            if not isinstance(t, torch.Tensor):
                raise Error(f"{where}: {self.experts}.{attr} ({role} of layout '{self.layout}') "
                            f"is {type(t).__name__}, not a tensor")
            if t.dim() != 3:
                raise Error(f"{where}: {self.experts}.{attr} is {list(t.shape)}, expected "
                            f"[{LAYOUTS[self.layout][role][0]}]")
            out[role] = t
        return out

    def dims(self, ex: torch.nn.Module, where: str) -> Tuple[int, int, int]:
        """(E, D, F) from the stored shapes, every role checked against them."""
        p = self.params(ex, where)
        roles = LAYOUTS[self.layout]
        if self.per_expert:
            E = len(p["down"])
            s = p["down"][0].shape
            D, F = s[0], s[1]
            val = {"F": F, "D": D, "2F": 2 * F}
            for role, ts in p.items():
                want = tuple(val[x] for x in roles[role][0].split(","))
                for e, t in enumerate(ts):
                    if tuple(t.shape) != want:
                        raise Error(f"{where}: {self.experts}."
                                    f"{self.weights[role].format(e=e)} ({role}) is "
                                    f"{list(t.shape)}, expected [{','.join(map(str, want))}] "
                                    f"({roles[role][0]}, layout '{self.layout}')")
            return E, D, F
        if "gate_up" in p:
            s = p["gate_up"].shape
            E, twoF, D = (s[0], s[2], s[1]) if roles["gate_up"][1] else tuple(s)
            if twoF % 2:
                raise Error(f"{where}: {self.experts}.{self.weights['gate_up']} is {list(s)}: "
                            f"{twoF} rows are not [W_gate; W_up] of equal size")
            F = twoF // 2
        else:
            s = p["gate"].shape
            E, F, D = (s[0], s[2], s[1]) if roles["gate"][1] else tuple(s)
        val = {"E": E, "F": F, "D": D, "2F": 2 * F}
        for role, t in p.items():
            want = tuple(val[x] for x in roles[role][0].split(","))
            if tuple(t.shape) != want:
                raise Error(f"{where}: {self.experts}.{self.weights[role]} ({role}) is "
                            f"{list(t.shape)}, expected [{','.join(map(str, want))}] "
                            f"({roles[role][0]}, layout '{self.layout}')")
        return E, D, F

    def op_weights(self, ex: torch.nn.Module) -> Tuple[torch.Tensor, torch.Tensor]:
        """(gate_up (E,2F,D), down (E,D,F)) for lrmoe.torch's ops: the
        parameters themselves, their transposes (views), or for separate
        gate/up their [gate; up], a view when they lie that way in lrmoe's
        packed buffer (float32 after patch()), else a copy (torch.cat)."""
        if self.per_expert:
            return self._stacked(ex)
        t = {r: resolve(ex, a) for r, a in self.weights.items()}
        roles = LAYOUTS[self.layout]
        v = {r: x.transpose(1, 2) if roles[r][1] else x for r, x in t.items()}
        if "gate_up" in v:
            return v["gate_up"], v["down"]
        g, u = v["gate"], v["up"]
        # torch.compile cannot trace the storage check: compiled, gate and up
        # are joined by a copy (and the layer then packs its own copy)
        gu = (_Join.apply(g, u) if not _compiling() and _adjacent(g, u)
              else torch.cat([g, u], dim=1))
        return gu, v["down"]

    def _stacked(self, ex: torch.nn.Module) -> Tuple[torch.Tensor, torch.Tensor]:
        """op_weights of a per-expert layout: a view of lrmoe's packed buffer
        when every expert's tensors lie there, else stacked copies."""
        ts = self._per_expert(ex, None)
        roles = list(ts)
        flat = [ts[r][e] for e in range(len(ts["down"])) for r in roles]
        if not _compiling() and _packed_rows(flat, roles):
            return _Stack.apply(tuple(roles), *flat)
        gu = (torch.stack(ts["gate_up"]) if "gate_up" in ts else
              torch.cat([torch.stack(ts["gate"]), torch.stack(ts["up"])], dim=1))
        return gu, torch.stack(ts["down"])

    def adopt(self, ex: torch.nn.Module, buf: torch.Tensor, E: int, D: int, F: int) -> None:
        """Let the parameters' .data be views into buf (E, 3FD), lrmoe's packed
        [W_gate; W_up; W_down] per expert (the values already copied there)."""
        n = F * D
        if self.per_expert:
            for role, attr in self.weights.items():
                size = 2 * n if role == "gate_up" else n
                shape = (D, F) if role == "down" else (size // D, D)
                o = _OFFSET[role] * n
                for e in range(E):
                    resolve(ex, attr.format(e=e)).data = buf[e, o:o + size].view(shape)
            return
        views = {"gate_up": buf[:, :2 * n].view(E, 2 * F, D), "gate": buf[:, :n].view(E, F, D),
                 "up": buf[:, n:2 * n].view(E, F, D), "down": buf[:, 2 * n:].view(E, D, F)}
        for role, attr in self.weights.items():
            v = views[role]
            resolve(ex, attr).data = v.transpose(1, 2) if LAYOUTS[self.layout][role][1] else v

    def release(self, ex: torch.nn.Module) -> None:
        """Give every parameter contiguous memory of its own again (a view of
        the packed buffer is contiguous yet shares it: copied)."""
        ps = ([t for ts in self._per_expert(ex, None).values() for t in ts] if self.per_expert
              else [resolve(ex, a) for a in self.weights.values()])
        for prm in ps:
            if (not prm.is_contiguous() or
                    prm.untyped_storage().nbytes() > prm.numel() * prm.element_size()):
                prm.data = prm.data.clone(memory_format=torch.contiguous_format)

    # ---- activation

    def activation(self, ex: torch.nn.Module) -> Any:
        name = _act_name(self.act)
        return name if name is not None else self.act(ex)

    # ---- routing (route blocks)

    def hook_logits(self, router: torch.nn.Module, args: tuple, output: Any) -> torch.Tensor:
        """The logits dump() records from the router module's forward hook."""
        return output[0] if isinstance(output, (tuple, list)) else output

    def route_pairs(self, block: torch.nn.Module, logits: torch.Tensor
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(topk_ids (T,K) int64, topk_weights (T,K) float32 with autograd to
        the logits): liblrmoe chooses (torch.ops.lrmoe.route_topk), torch
        weighs."""
        rt = self.route_for(block)
        k, renorm = int(self.opt(block, "k")), bool(self.opt(block, "renorm"))
        scale = float(self.opt(block, "scale"))
        bias = resolve(block, self.expert_bias, None) if self.expert_bias else None
        ids = _ROUTE(logits.detach(), None if bias is None or rt != "sigmoid" else bias.detach(),
                     k, rt, renorm, scale, int(self.opt(block, "groups")),
                     int(self.opt(block, "topk_groups")))
        x = logits.float()
        if rt == "softmax":
            w = torch.softmax(x, dim=-1).gather(1, ids)
            if renorm:
                w = w / w.sum(dim=-1, keepdim=True)
        elif rt == "topk-softmax":
            w = torch.softmax(x.gather(1, ids), dim=-1)
        else:
            w = torch.sigmoid(x).gather(1, ids)
            if renorm:
                w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return ids, w * scale

    def forward(self, block: torch.nn.Module, x: torch.Tensor, *args: Any,
                **kwargs: Any) -> torch.Tensor:
        """The forward patch() installs on a route block: x (...,D) -> (...,D)."""
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        logits = resolve(block, self.router)(x2)
        ids, w = self.route_pairs(block, logits)
        if self.load:
            acc = resolve(block, self.load, None)
            if isinstance(acc, torch.Tensor):
                with torch.no_grad():
                    acc.add_(torch.bincount(ids.view(-1), minlength=acc.numel()).to(acc.dtype))
        out = resolve(block, self.experts)(x2, ids, w.to(x2.dtype))
        sh = resolve(block, self.shared, None) if self.shared else None
        if sh is not None:
            out = out + sh(x2)
        return out.reshape(shape)


def route_topk(logits: torch.Tensor, expert_bias: Optional[torch.Tensor], k: int, router: str,
               renorm: bool, scale: float, groups: int, topk_groups: int) -> torch.Tensor:
    """The experts (T,k) int64 that liblrmoe's router (lrmoe.route,
    lrmoe_route_topk(3)) chooses for logits (T,E). Registered as the custom
    op torch.ops.lrmoe.route_topk, so torch.compile(fullgraph=True) keeps a
    route block in one graph."""
    from .ops import route
    if logits.device.type != "cpu":
        raise Error(f"route: logits on {logits.device}; lrmoe.torch runs on CPU tensors")
    f = route(logits.detach().float().contiguous().numpy(), k=k, router=router, renorm=renorm,
              scale=scale, groups=groups, topk_groups=topk_groups,
              expert_bias=None if expert_bias is None
              else expert_bias.detach().float().contiguous().numpy())
    return torch.from_numpy(f["topk_ids"]).long()


def _route_fake(logits: torch.Tensor, expert_bias: Optional[torch.Tensor], k: int, router: str,
                renorm: bool, scale: float, groups: int, topk_groups: int) -> torch.Tensor:
    return logits.new_empty((logits.shape[0], k), dtype=torch.int64)


if hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_fake"):
    _route_op = torch.library.custom_op("lrmoe::route_topk", route_topk, mutates_args=())
    _route_op.register_fake(_route_fake)
    _ROUTE = torch.ops.lrmoe.route_topk
else:  # torch < 2.4: eager only
    _ROUTE = route_topk


_REGISTRY: Dict[Union[type, str], Adapter] = {}


def register(cls: Union[type, str], *, experts: str = "experts", layout: str = "fused",
             weights: Optional[Dict[str, str]] = None, router: Optional[str] = "gate",
             route: Optional[str] = None, k: Union[int, str, None] = None,
             renorm: Union[bool, str] = False, scale: Union[float, str] = 1.0,
             groups: Union[int, str] = 0, topk_groups: Union[int, str] = 0,
             expert_bias: Optional[str] = None, shared: Optional[str] = None, act: Any = "silu",
             load: Optional[str] = None, route_from: Optional[str] = None,
             scaled_input: Optional[str] = None) -> Adapter:
    """Register (or replace) the adapter of block class cls (a class, or a
    class name matched on any class of that name); the arguments are
    Adapter's (module docstring, lrmoe-python(3)). Bad arguments raise
    lrmoe.Error naming them and register nothing."""
    ad = Adapter(cls, experts=experts, layout=layout, weights=weights, router=router,
                 route=route, k=k, renorm=renorm, scale=scale, groups=groups,
                 topk_groups=topk_groups, expert_bias=expert_bias, shared=shared, act=act,
                 load=load, route_from=route_from, scaled_input=scaled_input)
    _REGISTRY[cls] = ad
    return ad


def unregister(cls: Union[type, str]) -> bool:
    """Remove cls's adapter; whether there was one."""
    return _REGISTRY.pop(cls, None) is not None


def lookup(cls: type) -> Optional[Adapter]:
    """The adapter of a module class: its own or a base class's, registered
    as a class or by name (the nearest in the MRO)."""
    for c in cls.__mro__:
        ad = _REGISTRY.get(c) or _REGISTRY.get(c.__name__)
        if ad is not None:
            return ad
    return None


def registered() -> Dict[str, Adapter]:
    """name -> adapter of every registration."""
    return {ad.name: ad for ad in _REGISTRY.values()}


def hf_activation(ex: torch.nn.Module) -> Any:
    """A Hugging Face experts module's activation name (config.hidden_act)."""
    return getattr(getattr(ex, "config", None), "hidden_act", None)


def register_hf(name: str, router: str = "gate") -> Adapter:
    """A Hugging Face transformers 5 sparse MoE block: fused experts called
    as experts(hidden, top_k_index, top_k_weights), the router's DeepSeek
    correction bias read when present."""
    return register(name, experts="experts", layout="fused", router=router, route=None,
                    expert_bias=f"{router}.e_score_correction_bias", act=hf_activation)


for _n in ("Qwen3MoeSparseMoeBlock", "MixtralSparseMoeBlock", "OlmoeSparseMoeBlock",
           "Qwen2MoeSparseMoeBlock", "DeepseekV3MoE", "Glm4MoeMoE"):
    register_hf(_n)


def register_torchtitan(cls: Union[type, str] = "MoE", **over: Any) -> Adapter:
    """torchtitan's MoE block (torchtitan/models/moe): router.gate (nn.Linear)
    gives the logits, router.score_func ("softmax"/"sigmoid") the route,
    router.top_k, router.route_norm and router.route_scale its options,
    expert_bias the sigmoid's selection-only bias, experts a GroupedExperts
    with w1/w3 (E,F,D) and w2 (E,D,F), shared_experts added,
    tokens_per_expert accumulating the load. Blocks with
    score_before_experts=True (the routing weight scales the experts' input,
    not their output) are refused when found. over: Adapter arguments that
    differ (e.g. layout="separate_t" for [E,D,F] w1/w3)."""
    kw: Dict[str, Any] = dict(experts="experts", layout="separate", router="router.gate",
                              route="sigmoid", route_from="router.score_func", k="router.top_k",
                              renorm="router.route_norm", scale="router.route_scale",
                              expert_bias="expert_bias", shared="shared_experts", act="silu",
                              load="tokens_per_expert", scaled_input="score_before_experts")
    kw.update(over)
    return register(cls, **kw)


# ---- Megatron-Core (megatron-core on PyPI; measured with 0.16.1)

def _megatron_cfg(block: torch.nn.Module) -> Any:
    cfg = getattr(block, "config", None)
    if cfg is None or not hasattr(cfg, "moe_router_topk"):
        raise Error(f"{type(block).__name__}: no Megatron TransformerConfig at .config "
                    "(moe_router_topk missing)")
    return cfg


def _is_silu_fn(f: Any) -> bool:
    return (f is torch.nn.functional.silu or isinstance(f, torch.nn.SiLU) or
            (getattr(f, "__name__", None) == "silu" and
             str(getattr(f, "__module__", "")).startswith("torch")))


# (TransformerConfig field, test of its value, why lrmoe cannot map it): a
# block whose config has one of these set is refused, naming the field
_MEGATRON_REFUSED = (
    ("gated_linear_unit", lambda v: not v,
     "the experts are not gated; lrmoe's are SwiGLU (silu(x Wg^T) * (x Wu^T) Wd^T)"),
    ("activation_func", lambda v: not _is_silu_fn(v),
     "the experts' activation is not silu; lrmoe's experts are SwiGLU"),
    ("glu_linear_offset", lambda v: bool(v), "it adds an offset to the up projection"),
    ("activation_func_clamp_value", lambda v: v is not None,
     "it clamps the gate and up projections"),
    ("add_bias_linear", lambda v: bool(v),
     "the experts and the router carry biases, which lrmoe's experts have not"),
    ("moe_apply_probs_on_input", lambda v: bool(v),
     "it scales the experts' input by the routing weight (SwiGLU(a x)), not their output"),
    ("moe_router_load_balancing_type", lambda v: v == "sinkhorn" or
     (isinstance(v, list) and "sinkhorn" in v), "sinkhorn routing has no lrmoe router"),
    ("moe_aux_loss_coeff", lambda v: any(c for c in (v if isinstance(v, list) else [v])),
     "the auxiliary load-balancing loss is attached to the router's probabilities inside "
     "Megatron's router, which the patched forward does not run"),
    ("moe_z_loss_coeff", lambda v: bool(v),
     "the z-loss is attached inside Megatron's router, which the patched forward does not run"),
    ("moe_input_jitter_eps", lambda v: v is not None,
     "input jitter is random noise inside Megatron's router"),
    ("moe_expert_capacity_factor", lambda v: v is not None,
     "capacity token dropping changes the routing"),
    ("moe_router_force_load_balancing", lambda v: bool(v),
     "it routes on random logits (a benchmark mode)"),
    ("moe_router_padding_for_quantization", lambda v: bool(v),
     "it pads the routing map"),
    ("moe_enable_routing_replay", lambda v: bool(v), "it replays recorded routing"),
    ("moe_router_topk_limited_devices", lambda v: bool(v),
     "deprecated; use moe_router_num_groups/moe_router_group_topk"),
    ("moe_router_dtype", lambda v: v not in (None, "fp32"),
     "lrmoe's router reads F32 logits (moe_router_dtype None or 'fp32')"),
    ("moe_latent_size", lambda v: bool(v), "latent projections around the experts"),
)


class MegatronAdapter(Adapter):
    """Megatron-Core's MoELayer (megatron.core.transformer.moe.moe_layer):
    the conventions are read from block.config (a TransformerConfig) on each
    block, the logits are x @ router.weight^T (Megatron's TopKRouter.gating
    without its move to the GPU), the experts a SequentialMLP whose
    local_experts[e].linear_fc1.weight is [W_gate; W_up] (2F,D) and
    linear_fc2.weight (D,F), and the patched forward returns Megatron's
    (output, None). See register_megatron."""

    def route_for(self, block: torch.nn.Module) -> Optional[str]:
        cfg = _megatron_cfg(block)
        sf = cfg.moe_router_score_function
        if sf == "sigmoid":
            return "sigmoid"
        if sf == "softmax":
            # pre-softmax: softmax over E, top-K of it (no renormalisation);
            # else top-K of the logits, softmax over the K
            return "softmax" if cfg.moe_router_pre_softmax else "topk-softmax"
        return sf

    def opt(self, block: torch.nn.Module, key: str) -> Any:
        cfg = _megatron_cfg(block)
        k = int(cfg.moe_router_topk)
        if key == "k":
            return k
        if key == "renorm":  # Megatron's sigmoid scores are always renormalised when K > 1
            return self.route_for(block) == "sigmoid" and k > 1
        if key == "scale":
            return float(cfg.moe_router_topk_scaling_factor or 1.0)
        if key == "groups":
            return int(cfg.moe_router_num_groups or 0) if cfg.moe_router_group_topk else 0
        if key == "topk_groups":
            return int(cfg.moe_router_group_topk or 0)
        return super().opt(block, key)

    def dims(self, ex: torch.nn.Module, where: str) -> Tuple[int, int, int]:
        if not hasattr(ex, "local_experts"):
            raise Error(f"{where}: experts is {type(ex).__name__}, not SequentialMLP: lrmoe "
                        "registers Megatron-Core's SequentialMLP experts (moe_grouped_gemm="
                        "False); GroupedMLP needs the grouped_gemm package and TEGroupedMLP "
                        "Transformer Engine, which do not build on a CPU-only machine, so "
                        "their layouts are not registered")
        return super().dims(ex, where)

    def check(self, block: torch.nn.Module, where: str) -> None:
        super().check(block, where)
        cfg = _megatron_cfg(block)
        for field, bad, why in _MEGATRON_REFUSED:
            v = getattr(cfg, field, None)
            if bad(v):
                raise Error(f"{where}: config.{field}={getattr(v, '__name__', v)!r}: {why}; "
                            "lrmoe cannot patch this Megatron-Core MoE layer")
        E, k = int(cfg.num_moe_experts), int(cfg.moe_router_topk)
        G, M = int(cfg.moe_router_num_groups or 0), int(cfg.moe_router_group_topk or 0)
        if M and (self.route_for(block) != "sigmoid" or k != 2 * M):
            raise Error(f"{where}: config.moe_router_group_topk={M} with "
                        f"moe_router_topk={k}, score function "
                        f"'{cfg.moe_router_score_function}': Megatron scores a group by the "
                        "sum of its top moe_router_topk/moe_router_group_topk scores; lrmoe's "
                        "group limit is the sigmoid router's sum of the two best "
                        "(moe_router_topk = 2*moe_router_group_topk, score function sigmoid)")
        ex = resolve(block, self.experts)
        n = len(getattr(ex, "local_experts", ()))
        if n != E:
            raise Error(f"{where}: experts hold {n} of config.num_moe_experts={E} experts "
                        "(Megatron's expert parallelism): patch the unsharded layer; lrmoe "
                        "shards experts itself (patch(..., group=))")
        rw = getattr(resolve(block, self.router), "weight", None)
        if isinstance(rw, torch.Tensor) and rw.device.type != "cpu":
            raise Error(f"{where}: router.weight is on {rw.device}; lrmoe's Megatron-Core "
                        "adapter is tested on CPU tensors only")

    def logits(self, block: torch.nn.Module, x2: torch.Tensor) -> torch.Tensor:
        """Megatron's gating: x @ router.weight^T, in F32 when
        moe_router_dtype='fp32', else in x's dtype."""
        r = resolve(block, self.router)
        dt = torch.float32 if _megatron_cfg(block).moe_router_dtype == "fp32" else x2.dtype
        return torch.nn.functional.linear(x2.to(dt), r.weight.to(dt))

    def hook_logits(self, router: torch.nn.Module, args: tuple, output: Any) -> torch.Tensor:
        """dump()'s router hook: Megatron's router returns (probs, routing_map),
        so the logits are recomputed from its input."""
        x = args[0]
        return torch.nn.functional.linear(x.reshape(-1, x.shape[-1]).float(),
                                          router.weight.float())

    def forward(self, block: torch.nn.Module, x: torch.Tensor, *args: Any,
                **kwargs: Any) -> Any:
        """MoELayer.forward(hidden_states [S,B,H], intermediate_tensors=None,
        padding_mask=None) -> (output, None), as Megatron's."""
        inter = kwargs.pop("intermediate_tensors", args[0] if args else None)
        pad = kwargs.pop("padding_mask", args[1] if len(args) > 1 else None)
        if inter is not None:
            raise Error(f"{type(block).__name__}: intermediate_tensors (Megatron's partial "
                        "CUDA-graph forward) is not supported by lrmoe's patched forward")
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        ids, w = self.route_pairs(block, self.logits(block, x2))
        r = resolve(block, self.router)
        acc = getattr(r, "local_tokens_per_expert", None)
        if (getattr(r, "enable_expert_bias", False) and isinstance(acc, torch.Tensor) and
                torch.is_grad_enabled()):
            # Megatron's _apply_expert_bias: the routed pairs of the tokens
            # whose padding_mask ([B,S]: transposed to [S,B]) is False
            with torch.no_grad():
                sel = ids
                if pad is not None:
                    sel = ids[~pad.transpose(0, 1).bool().reshape(-1)]
                acc.add_(torch.bincount(sel.reshape(-1), minlength=acc.numel()).to(acc.dtype))
        out = resolve(block, self.experts)(x2, ids, w.to(x2.dtype))
        sh = resolve(block, self.shared, None) if self.shared else None
        if sh is not None:
            out = out + sh(x2)
        return out.reshape(shape), None


def register_megatron(cls: Union[type, str, None] = None) -> Adapter:
    """Megatron-Core's MoELayer (cls: default
    megatron.core.transformer.moe.moe_layer.MoELayer, imported here) with SequentialMLP experts (lrmoe-python(3)):
    router.weight (E,D), experts.local_experts[e].linear_fc1.weight (2F,D)
    = [W_gate; W_up] and linear_fc2.weight (D,F), shared_experts added,
    router.expert_bias the sigmoid's selection-only bias and
    router.local_tokens_per_expert its load. The route is read from the
    block's config: moe_router_score_function "softmax" with
    moe_router_pre_softmax -> lrmoe "softmax" (no renormalisation), without
    -> "topk-softmax"; "sigmoid" -> "sigmoid", renormalised when K > 1;
    moe_router_topk_scaling_factor -> scale; moe_router_num_groups /
    moe_router_group_topk -> groups / topk_groups (sigmoid, K = 2 *
    group_topk only). What lrmoe cannot map is refused when a block is found
    (MegatronAdapter.check), naming the config field."""
    if cls is None:
        try:
            from megatron.core.transformer.moe.moe_layer import MoELayer
        except ImportError as e:
            raise Error(f"register_megatron: megatron.core does not import: {e}") from None
        cls = MoELayer
    ad = MegatronAdapter(cls, experts="experts", layout="per_expert_fused",
                         weights={"gate_up": "local_experts.{e}.linear_fc1.weight",
                                  "down": "local_experts.{e}.linear_fc2.weight"},
                         router="router", route="softmax", k=0,
                         expert_bias="router.expert_bias", shared="shared_experts", act="silu")
    _REGISTRY[cls] = ad
    return ad
