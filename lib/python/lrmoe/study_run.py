"""One training run of lrmoe-study: a tiny random-init Qwen3-MoE causal LM
(Hugging Face transformers) whose MoE experts run in liblrmoe through
lrmoe.torch.patch, and the per-step record of what happened in them.

What each step records, and where it comes from (nothing is modelled in
Python; the figures are liblrmoe's):
  loss                 training cross-entropy (nats/byte) of the step's batch
  val_loss             validation loss every --eval-every steps (else empty)
  moe_fwd_s/moe_bwd_s  wall seconds of the patched MoE layers' forward and
                       backward, all layers (Patch.stats fwd_seconds,
                       bwd_seconds), moe_fwd_cpu_s/moe_bwd_cpu_s the same
                       as the calling thread's CPU seconds (fwd/bwd_cpu_
                       seconds: with one thread all of the work, and robust
                       on a shared machine), and lib_fwd_s/lib_bwd_s: the
                       wall seconds inside liblrmoe calls
  gpu_model_s          modelled GPU seconds of the step's MoE layers:
                       lrmoe_cost_eval (lib/cost.h) of each layer's plan
                       (t_comm + forward and backward compute), summed; a
                       plan on EPLB's placement is evaluated without EPLB's
                       slot accounting (the planner's own figure differs)
  rho, mem_peak_bytes  the plan's retention rate (mean over layers) and the
                       modelled per-rank peak bytes (max over layers)
  kept, pairs          backward pairs retained / routed, all layers
  t_weights_s          the modelled weight-traffic seconds within gpu_model_s
                       (replicas and helpers receiving weights and returning
                       gradients), summed over layers
  grad_err             the relative error of dW_down of the kept (weighted)
                       pairs against every pair (lrmoe_score_fidelity_split,
                       lrmoe-score --fidelity), mean over layers; 0 when
                       nothing is dropped
  dw_down_cos, dw_down_bias, dx_err, dx_bias
                       the same split: cosine and closed-form bias
                       ||E[G^]-G||/||G|| of dW_down, relative error and bias
                       of the layer input's gradient dx (mean over layers)

Under lrmoe-study --nproc N (cfg.nproc: one process per rank, gloo) every
process runs the dense part of the model on the whole batch (same init,
batches and order of operations: the same bits, no all-reduce), while each
MoE layer runs through patch(group=WORLD): rank r feeds rows
[floor(r*T/P), floor((r+1)*T/P)) of the layer's tokens, the contiguous
slice the simulated ranks=P run gives rank r, and owns its native experts.
The layer's output, hidden and routing-weight gradients are all-gathered
back to the whole batch (copies: every rank's upstream gradient is the
same), and each expert's weight gradient is copied from its native rank;
so every rank trains the single-process run's model bit for bit.
"""
import ctypes
import math
import time
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed

from . import _lib
from ._lib import Error, check, lib

FIELDS = ["step", "loss", "val_loss", "moe_fwd_s", "moe_bwd_s", "moe_fwd_cpu_s",
          "moe_bwd_cpu_s", "lib_fwd_s", "lib_bwd_s", "gpu_model_s", "t_weights_s", "rho",
          "mem_peak_bytes", "kept", "pairs", "grad_err", "dw_down_cos", "dw_down_bias",
          "dx_err", "dx_bias", "step_s"]


# ---------------------------------------------------------------- cost model

_P = ctypes.c_void_p
# the cost model behind its handle (lrmoe_cost_cfg_t, cost.h): parameters
# set and the summary read by field name, no struct mirrored
lib.lrmoe_cost_cfg_new.restype = ctypes.c_void_p
lib.lrmoe_cost_cfg_new.argtypes = []
lib.lrmoe_cost_cfg_free.restype = None
lib.lrmoe_cost_cfg_free.argtypes = [ctypes.c_void_p]
lib.lrmoe_cost_cfg_set.restype = ctypes.c_int
lib.lrmoe_cost_cfg_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_double]
lib.lrmoe_cost_cfg_eval.restype = ctypes.c_int
lib.lrmoe_cost_cfg_eval.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int] + [_P] * 5
lib.lrmoe_cost_cfg_get.restype = ctypes.c_int
lib.lrmoe_cost_cfg_get.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                   ctypes.POINTER(ctypes.c_double)]
_SUMMARY = ("mem_peak", "mem_peak_rank", "t_dispatch", "t_combine", "t_bwd_dispatch",
            "t_bwd_combine", "t_weights", "t_comm", "t_fwd_compute", "t_bwd_compute",
            "t_total", "bytes_total")


class Fidelity(ctypes.Structure):  # lrmoe_fidelity_t (lib/score.h)
    _fields_ = [(n, ctypes.c_double) for n in ("rel_err", "norm_ratio", "cosine", "bias")]


_lib.check_mirror("lrmoe_fidelity_t", Fidelity)


_NFID = 4  # LRMOE_NFID: dw_down, dw_gate, dw_up, dx
lib.lrmoe_score_fidelity_split.restype = ctypes.c_int
lib.lrmoe_score_fidelity_split.argtypes = [
    ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64] + [_P] * 12 + [
    ctypes.POINTER(Fidelity)]


def _np_ptr(a):
    return a.ctypes.data


def layer_cost(state, D, F, ranks):
    """lrmoe_cost_eval of one layer invocation's plan: (summary)."""
    ids = state["topk_ids"]
    T, K = ids.shape
    placement, fwd_alloc = state["placement"].numpy(), state["fwd_alloc"].numpy()
    E = placement.shape[0]
    load = np.bincount(ids.reshape(-1).numpy().astype(np.int64), minlength=E).astype(np.int64)
    quota = np.ascontiguousarray(state["quota"].numpy(), np.int64)
    bwd = np.ascontiguousarray(state["bwd_alloc"].numpy(), np.int64)
    pl = np.ascontiguousarray(placement, np.uint8)
    fa = np.ascontiguousarray(fwd_alloc, np.int64)
    if state["rec"].get("planner") == "capacity":
        # capacity-factor dropping: the forward runs the kept pairs only (the
        # planner models it so: its bwd_alloc rows on the native ranks)
        load, fa = quota.copy(), bwd
    h = lib.lrmoe_cost_cfg_new()
    if not h:
        check(-1, "cost model")
    try:
        # a plan that keeps pairs by forward rank is charged so (plan.keep=by-rank)
        for k, v in (("D", D), ("F", F), ("K", K), ("tokens", T // ranks),
                     ("dtype_bytes", state["hidden"].element_size()),
                     ("keep_by_rank", int(state["rec"].get("keep_rule") == "by-rank"))):
            check(lib.lrmoe_cost_cfg_set(h, k.encode(), float(v)), "cost model")
        check(lib.lrmoe_cost_cfg_eval(h, E, ranks, _np_ptr(pl), _np_ptr(load), _np_ptr(fa),
                                      _np_ptr(quota), _np_ptr(bwd)), "cost model")
        v = ctypes.c_double()
        out = {}
        for k in _SUMMARY:
            check(lib.lrmoe_cost_cfg_get(h, k.encode(), ctypes.byref(v)), "cost model")
            out[k] = v.value
    finally:
        lib.lrmoe_cost_cfg_free(h)
    return SimpleNamespace(**out)


def layer_fidelity(state, g, rec, block):
    """The fidelity split of one layer call (lrmoe_score_fidelity_split):
    dW_down, dW_gate, dW_up and dx of the kept pairs, each kept row scaled
    by its pair_weight, against every pair, and the closed-form bias (E of
    the estimate: the kept pairs for a deterministic rule, every pair with
    p > 0 for the sample). Returns the four lrmoe_fidelity_t."""
    ids = state["topk_ids"].to(torch.int32).contiguous()
    alpha = state["topk_weights"].detach().float().contiguous()
    T, K = ids.shape
    D = g.shape[-1]
    F = state["saved_gate"].shape[-1]
    E = block.E
    g = g.reshape(T, D).detach().float().contiguous()
    x = state["hidden"].detach().float().contiguous()
    sg = state["saved_gate"].float().contiguous()
    su = state["saved_up"].float().contiguous()
    ex = block.experts
    gu = ex.gate_up_proj.detach().float()
    wg, wu = gu[:, :F].contiguous(), gu[:, F:].contiguous()
    wd = ex.down_proj.detach().float().contiguous()
    keep = np.ascontiguousarray(rec["keep"], np.uint8)
    w = rec.get("pair_weight")
    w = None if w is None else np.ascontiguousarray(w, np.float32)
    e = rec.get("pair_prob")
    e = None if e is None else np.ascontiguousarray(e > 0, np.float32)
    out = (Fidelity * _NFID)()
    check(lib.lrmoe_score_fidelity_split(
        T, K, E, D, F, ids.data_ptr(), g.data_ptr(), alpha.data_ptr(), x.data_ptr(),
        sg.data_ptr(), su.data_ptr(), wg.data_ptr(), wu.data_ptr(), wd.data_ptr(),
        _np_ptr(keep), None if w is None else _np_ptr(w), None if e is None else _np_ptr(e),
        out), "fidelity")
    return list(out)


# ---------------------------------------------------------------- model

def build_model(cfg, seed):
    """The tiny Qwen3-MoE causal LM of the study, random init from seed."""
    import transformers as tf
    tf.logging.set_verbosity_error()
    c = tf.Qwen3MoeConfig(
        vocab_size=256, hidden_size=cfg.hidden, intermediate_size=2 * cfg.hidden,
        moe_intermediate_size=cfg.ffn, num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads, num_key_value_heads=max(1, cfg.heads // 2),
        head_dim=cfg.hidden // cfg.heads, num_experts=cfg.experts,
        num_experts_per_tok=cfg.topk, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], max_position_embeddings=max(64, cfg.seq),
        output_router_logits=cfg.aux_loss > 0, router_aux_loss_coef=cfg.aux_loss,
        tie_word_embeddings=False, use_cache=False)
    torch.manual_seed(seed)
    return tf.Qwen3MoeForCausalLM(c).float()


class BiasBalancer:
    """The auxiliary-loss-free balance of DeepSeek-V3: a per-expert bias
    added to the router's probabilities for the top-k choice only (the
    weights stay the unbiased probabilities), moved by `rate` against each
    expert's load error after every step. Training-loop logic, not lrmoe's."""

    def __init__(self, model, rate):
        from transformers.models.qwen3_moe import modeling_qwen3_moe as q3
        self.rate, self.routers = float(rate), []
        for m in model.modules():
            if isinstance(m, q3.Qwen3MoeTopKRouter):
                m.register_buffer("lrmoe_bias", torch.zeros(m.num_experts), persistent=False)
                m.lrmoe_load = torch.zeros(m.num_experts)
                m.forward = self._forward(m)
                self.routers.append(m)

    @staticmethod
    def _forward(r):
        def forward(hidden_states):
            h = hidden_states.reshape(-1, r.hidden_dim)
            logits = torch.nn.functional.linear(h, r.weight)
            probs = torch.softmax(logits, dtype=torch.float, dim=-1)
            ids = torch.topk(probs.detach() + r.lrmoe_bias, r.top_k, dim=-1).indices
            top = probs.gather(1, ids)
            if r.norm_topk_prob:
                top = top / top.sum(dim=-1, keepdim=True)
            if torch.is_grad_enabled():
                r.lrmoe_load += torch.bincount(ids.view(-1), minlength=r.num_experts)
            return logits, top.to(logits.dtype), ids
        return forward

    def update(self):
        for r in self.routers:
            err = r.lrmoe_load.mean() - r.lrmoe_load
            r.lrmoe_bias += self.rate * torch.sign(err)
            r.lrmoe_load.zero_()


# ---------------------------------------------------------------- capture

class Capture:
    """Forward hooks on the patched experts: keeps each invocation's saved
    state (lrmoe.torch.saved_state: the tensors its autograd node saved, and
    its stats record) and the gradient arriving at its output, for the
    fidelity and the cost model after the backward pass."""

    def __init__(self, patch):
        self.items, self.hooks = [], []
        for b in patch.blocks:
            self.hooks.append(b.experts.register_forward_hook(self._hook(b)))

    def _hook(self, b):
        def hook(module, args, output):
            if not (torch.is_grad_enabled() and output.requires_grad):
                return
            import lrmoe.torch as lt
            state = lt.saved_state(output)
            item = {"block": b, "state": state}
            output.register_hook(lambda g, item=item: item.__setitem__("g", g.detach()))
            self.items.append(item)
        return hook

    def take(self):
        items, self.items = self.items, []
        return items

    def close(self):
        for h in self.hooks:
            h.remove()


# ---------------------------------------------------------------- --nproc

def _split(T, P, r):
    """Rank r's rows [lo, hi) of T tokens (the exec's floor split)."""
    return T * r // P, T * (r + 1) // P


def _counts(T, P):
    """Every rank's row count of T tokens."""
    return [T * (r + 1) // P - T * r // P for r in range(P)]


class _Slice(torch.autograd.Function):
    """Forward: this rank's rows of a tensor every rank holds whole. Backward:
    every rank's gradient rows all-gathered back to the whole tensor."""

    @staticmethod
    def forward(ctx, t, grp):  # type: ignore[override]
        ctx.grp, ctx.T = grp, t.shape[0]
        lo, hi = _split(t.shape[0], grp.P, grp.rank)
        return t[lo:hi].clone()

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return ctx.grp.gather_rows("study: gradient rows", g.contiguous(),
                                   _counts(ctx.T, ctx.grp.P)), None


class _Gather(torch.autograd.Function):
    """Forward: every rank's rows all-gathered into the whole tensor.
    Backward: this rank's rows of the gradient (every rank's is the same)."""

    @staticmethod
    def forward(ctx, t, grp, T):  # type: ignore[override]
        ctx.grp, ctx.T = grp, T
        return grp.gather_rows("study: output rows", t.contiguous(), _counts(T, grp.P))

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        lo, hi = _split(ctx.T, ctx.grp.P, ctx.grp.rank)
        return g[lo:hi].contiguous(), None, None


def _gather(grp, t, T):
    """Every rank's rows of t (this rank's slice of T) as the whole tensor."""
    return grp.gather_rows("study: rows", t.contiguous(), _counts(T, grp.P))


class DistCapture:
    """Capture under --nproc: a patched experts call gets the whole batch
    (the dense part runs on every rank); a pre-hook hands the layer this
    rank's rows (_Slice), the hook records the call's state (saved_state of
    the rank's output, as Capture) and returns every rank's output rows
    (_Gather). take() returns items whose state is the whole batch's, as
    the single-process run's: hidden, routing and the gradient at the
    output all-gathered, saved_gate/saved_up of every pair copied from the
    rank that computed it (pair_rank)."""

    def __init__(self, patch):
        self.grp = patch.dist
        self.items, self.hooks = [], []
        for b in patch.blocks:
            self.hooks.append(b.experts.register_forward_pre_hook(self._pre))
            self.hooks.append(b.experts.register_forward_hook(self._hook(b)))

    def _pre(self, module, args):
        hidden, ids, w = args
        self.T = hidden.shape[0]
        lo, hi = _split(self.T, self.grp.P, self.grp.rank)
        return (_Slice.apply(hidden, self.grp), ids[lo:hi].contiguous(),
                _Slice.apply(w, self.grp))

    def _hook(self, b):
        def hook(module, args, output):
            if torch.is_grad_enabled() and output.requires_grad:
                import lrmoe.torch as lt
                item = {"block": b, "state": lt.saved_state(output)}
                output.register_hook(lambda g, item=item: item.__setitem__("g", g.detach()))
                self.items.append(item)
            return _Gather.apply(output, self.grp, self.T)
        return hook

    def _pairs_rows(self, t, pr):
        """The whole (T,K,...) saved tensor: each pair's rows from the rank
        that computed it (pair_rank), copied."""
        parts = [torch.empty_like(t) for _ in range(self.grp.P)]
        self.grp.collective("study: saved state", torch.distributed.all_gather, parts,
                            t.contiguous())
        out = torch.empty_like(t)
        for r in range(self.grp.P):
            m = pr == r
            out[m] = parts[r][m]
        return out

    def take(self):
        items, self.items = self.items, []
        for it in items:
            st = dict(it["state"])
            T = st["pair_rank"].shape[0]  # global-shaped (lrmoe.dist)
            for k in ("hidden", "topk_weights", "topk_ids"):
                st[k] = _gather(self.grp, st[k], T)
            it["g"] = _gather(self.grp, it["g"].reshape(-1, it["g"].shape[-1]), T)
            pr = st["pair_rank"].long()
            for k in ("saved_gate", "saved_up"):
                st[k] = self._pairs_rows(st[k], pr)
            it["state"] = st
        return items

    def close(self):
        for h in self.hooks:
            h.remove()


def sync_expert_grads(patch):
    """Each expert's weight gradient from its native rank (the group path
    leaves the others' zero there): every rank then holds the simulated
    run's gradients of every expert, copied, not summed."""
    grp = patch.dist
    for b in patch.blocks:
        E = b.E
        own = torch.tensor([lib.lrmoe_exec_native(e, E, grp.P) for e in range(E)])
        for p in b.experts.parameters():
            if p.grad is None or p.shape[0] != E:
                continue
            parts = [torch.empty_like(p.grad) for _ in range(grp.P)]
            grp.collective("study: expert gradients", torch.distributed.all_gather, parts,
                           p.grad.contiguous())
            for r in range(grp.P):
                m = own == r
                p.grad[m] = parts[r][m]


# ---------------------------------------------------------------- training

def _lr(cfg, step):
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    p = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))


def evaluate(model, vx, vy, chunk):
    """Mean validation cross-entropy over the fixed windows."""
    tot, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, vx.shape[0], chunk):
            x = torch.from_numpy(vx[i:i + chunk])
            y = torch.from_numpy(vy[i:i + chunk])
            logits = model(input_ids=x).logits
            tot += torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
            n += y.numel()
    return tot / n


def _plan_extra(spec):
    """Planner options of a run: the quota policy (every dropping rule
    under the same per-step quotas), the capacity-factor baseline, and for
    the memory-pressure run its candidate rates and best effort (a step
    whose loads fit no candidate keeps the last one, marked infeasible,
    instead of failing the run)."""
    out = {}
    if spec.get("quota"):
        out["quota"] = spec["quota"]
    if spec.get("capacity") is not None:
        out.update(planner="capacity", capacity_factor=spec["capacity"])
    if spec.get("hbm") is not None:
        out["best_effort"] = True
        if spec.get("rates"):
            out["rates"] = spec["rates"]
    return out


def train(cfg, corpus, spec, row_cb=None):
    """Train one run. spec: dict(name, patched, rate, hbm, metric).
    Returns the list of per-step rows (dicts of FIELDS)."""
    import lrmoe.torch as lt
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    model = build_model(cfg, cfg.seed)
    model.train()
    patch = cap = None
    nproc = getattr(cfg, "nproc", None)
    if spec["patched"]:
        group = None
        if nproc:  # one rank of the group per process (DistCapture)
            import torch.distributed as dist
            group = dist.group.WORLD
        patch = lt.patch(model, rate=spec.get("rate"), hbm=spec.get("hbm"),
                         metric=spec.get("metric", "lrm"), select=spec.get("select", "topk"),
                         ranks=cfg.ranks, seed=cfg.seed, threads=cfg.threads, keep_masks=True,
                         group=group, **_plan_extra(spec))
        cap = DistCapture(patch) if nproc else Capture(patch)
    balancer = BiasBalancer(model, cfg.bias_rate) if cfg.bias_rate > 0 else None
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                            weight_decay=0.0)
    data = corpus.batches(cfg.data_seed, cfg.batch, cfg.seq)
    vx, vy = corpus.validation(cfg.val_batches, cfg.seq)
    rows = []
    try:
        for step in range(cfg.steps):
            t0 = time.perf_counter()
            x, y = next(data)
            for gr in opt.param_groups:
                gr["lr"] = _lr(cfg, step)
            if patch is not None:
                del patch.stats[:]
            # the loss on the targets y (x shifted by one) as evaluate() computes
            # it; HF's labels= would shift them once more
            out = model(input_ids=torch.from_numpy(x))
            logits = out.logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     torch.from_numpy(y).reshape(-1))
            if cfg.aux_loss > 0 and getattr(out, "aux_loss", None) is not None:
                loss = loss + cfg.aux_loss * out.aux_loss
            if not torch.isfinite(loss):
                raise Error(f"{spec['name']}: step {step}: training loss is {loss.item()}")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if nproc and patch is not None:
                sync_expert_grads(patch)
            if cfg.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            row = {"step": step, "loss": loss.item()}
            if patch is not None:
                row.update(_moe_row(cfg, patch, cap, spec))
            opt.step()
            if balancer is not None:
                balancer.update()
            row["step_s"] = time.perf_counter() - t0
            if step % cfg.eval_every == 0 or step == cfg.steps - 1:
                if patch is not None:
                    del patch.stats[:]
                model.eval()
                row["val_loss"] = evaluate(model, vx, vy, cfg.batch)
                model.train()
            rows.append(row)
            if row_cb:
                row_cb(row)
    finally:
        if cap is not None:
            cap.close()
        if patch is not None:
            patch.unpatch()
    return rows


def _moe_row(cfg, patch, cap, spec):
    recs = [r for r in patch.stats if "bwd_seconds" in r]
    items = cap.take()
    if len(items) != len(recs) or len(recs) != len(patch.blocks):
        raise Error(f"{spec['name']}: {len(recs)} MoE backward records and {len(items)} "
                    f"captured invocations for {len(patch.blocks)} layers")
    gpu, tw, fids = 0.0, 0.0, []
    for it, rec in zip(items, recs):
        st = it["state"]
        if st["rec"] is not rec:
            raise Error("captured invocation and stats record disagree")
        b = it["block"]
        s = layer_cost(st, b.D, b.F, cfg.ranks)
        # a plan built on EPLB's placement is charged by EPLB's physical
        # slots (lrmoe_cost_eval_slots inside the planner), which this plain
        # evaluation does not see: the mirror check holds for every other plan
        eplb = str(rec.get("source", "")).startswith("eplb")
        if not eplb and abs(s.mem_peak - rec["mem_peak"]) > 1e-6 * max(1.0, rec["mem_peak"]):
            raise Error(f"cost model mirror: mem_peak {s.mem_peak} != the plan's "
                        f"{rec['mem_peak']} (plan source {rec.get('source')})")
        gpu += s.t_total
        tw += s.t_weights
        fids.append(layer_fidelity(st, it["g"], rec, b))
        for k in ("keep", "pair_weight", "pair_prob"):
            rec.pop(k, None)
    return {"moe_fwd_s": sum(r["fwd_seconds"] for r in recs),
            "moe_bwd_s": sum(r["bwd_seconds"] for r in recs),
            "moe_fwd_cpu_s": sum(r["fwd_cpu_seconds"] for r in recs),
            "moe_bwd_cpu_s": sum(r["bwd_cpu_seconds"] for r in recs),
            "lib_fwd_s": sum(r["fwd_lib_seconds"] for r in recs),
            "lib_bwd_s": sum(r["bwd_lib_seconds"] for r in recs),
            "gpu_model_s": gpu, "t_weights_s": tw,
            "rho": float(np.mean([r["rho"] for r in recs])),
            "mem_peak_bytes": max(r["mem_peak"] for r in recs),
            "kept": sum(r["kept"] for r in recs), "pairs": sum(r["pairs"] for r in recs),
            "grad_err": float(np.mean([f[0].rel_err for f in fids])),
            "dw_down_cos": float(np.mean([f[0].cosine for f in fids])),
            "dw_down_bias": float(np.mean([f[0].bias for f in fids])),
            "dx_err": float(np.mean([f[3].rel_err for f in fids])),
            "dx_bias": float(np.mean([f[3].bias for f in fids]))}
