"""lrmoe.torch over a real process group, run under torchrun (gloo, CPU):
every rank compares its share with the simulated single-process run
(patch(..., ranks=P)), which each rank computes itself on the whole batch.

  torchrun --standalone --nproc-per-node P dist_check.py experts [planners]
      the experts op alone: for each planner (capacity: factor 1.0 and
      0.7, see _rate), rate 1.0 and 0.7, select topk
      and sample, 3 SGD steps: outputs, the hidden and routing-weight
      gradients of this rank's tokens and the weight gradients of its native
      experts are the same bits (the others' zero), the backward all-to-alls
      carry exactly the kept rows (R*D*4 bytes over all ranks, each of the
      two), and with rate < 1 fewer rows than pairs.
  ... dist_check.py model FAMILY [RATE[,RATE...] [STEPS [PLANNER [shard]]]]
      a tiny Hugging Face model trained STEPS (10) SGD steps at RATE (0.7;
      several rates: one fresh run each, one after another, in one process),
      each rank one sequence of the batch: per step the logits and
      per-token losses of this rank's rows, the gradient of its input
      embeddings and every expert parameter's gradient equal bit for bit
      (non-expert gradients, all-reduced, to 1e-5: see model()).
  ... dist_check.py shard [planners]
      patch(group=, shard=True) against the unsharded group run (see
      shard()): the same bits, 1/P of the expert parameters per rank, and
      full_state_dict() / load_full_state_dict().
  ... dist_check.py shard-layouts [planner:rate ...]
      shard=True on blocks registered with each stacked layout (fused,
      fused_t, separate, separate_t: test_register.py's LayoutMoE blocks)
      against the unsharded group run (see shard_layouts()); blocks stored
      one module per expert are refused with shard=True.
  ... dist_check.py die early|inexec|plan
      rank 1 exits in its first forward (before the collectives or inside
      liblrmoe's exec), or plans for another rate: rank 0 (every rank, for
      plan) ends with one clear error, no hang (the group's timeout bounds it).
Prints "dist: RANK ok N checks" per rank (rank 0 also "dist: all ok"), then
"dist: RANK gloo threads N -> 0": lrmoe.dist.shutdown() ended the group and
joined its gloo threads before Python's exit (a gloo worker left running
into interpreter exit can abort the rank: SIGABRT, "terminate called without
an active exception").
"""
import copy
import ctypes
import datetime
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist

import tiny  # noqa: F401  (paths, LRMOE_LIBRARY)
import lrmoe.dist as ld
import lrmoe.torch as lt

TIMEOUT = float(os.environ.get("DIST_TIMEOUT", "60"))
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT))
ME, P = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)
checks = 0


def fail(msg):
    print(f"dist: rank {ME}: FAIL {msg}", flush=True)
    sys.exit(1)


def same(a, b, what):
    global checks
    checks += 1
    if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b):
        d = (a.float() - b.float()).abs().max().item() if a.shape == b.shape else "shape"
        fail(f"{what}: differs from the reference run (max |diff| {d}, {tuple(a.shape)} vs "
             f"{tuple(b.shape)})")


def routing(Tg, E, K, seed):
    """Skewed top-K routing of Tg tokens (the same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    prob = torch.tensor([8.0 / (1 + e) for e in range(E)])
    ids = torch.stack([torch.multinomial(prob, K, generator=g) for _ in range(Tg)])
    w = torch.softmax(torch.randn(Tg, K, generator=g), -1)
    return ids, w


def _rate(planner, rate):
    """patch()'s rate option, or for planner="capacity" (Megatron-Core's
    capacity-factor dropping, no rate) capacity factor 1.0 for "rate 1.0"
    and 0.7 for "rate 0.7" (that drops pairs in forward and backward)."""
    return dict(capacity_factor=rate) if planner == "capacity" else dict(rate=rate)


def native(E):
    return [e for e in range(E) if lt.lib.lrmoe_exec_native(e, E, P) == ME]


def experts(planners):
    E, D = tiny.E, tiny.D
    S = 24
    Tg = S * P
    lo, hi = ME * Tg // P, (ME + 1) * Tg // P
    nat = native(E)
    for planner in planners:
        for rate in (1.0, 0.7):
            for select in ("topk", "sample"):
                tag = f"{planner} rate={rate} select={select}"
                base = tiny.block("qwen3_moe", seed=3)
                ref, mine = copy.deepcopy(base), copy.deepcopy(base)
                kw = dict(planner=planner, select=select, seed=5, **_rate(planner, rate))
                hr = lt.patch(ref, ranks=P, **kw)
                hm = lt.patch(mine, group=dist.group.WORLD, **kw)
                opt_r = torch.optim.SGD(ref.experts.parameters(), lr=0.5)
                opt_m = torch.optim.SGD(mine.experts.parameters(), lr=0.5)
                moved = 0
                for step in range(3):
                    gen = torch.Generator().manual_seed(100 + step)
                    x = torch.randn(Tg, D, generator=gen)
                    G = torch.randn(Tg, D, generator=gen)
                    ids, w = routing(Tg, E, tiny.K, 200 + step)
                    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
                    out_r = ref.experts(xr, ids, wr)
                    out_r.backward(G)
                    xm, wm = x[lo:hi].clone().requires_grad_(), w[lo:hi].clone().requires_grad_()
                    out_m = mine.experts(xm, ids[lo:hi], wm)
                    out_m.backward(G[lo:hi])
                    t = f"{tag} step {step}"
                    same(out_m, out_r[lo:hi].detach(), f"{t}: output")
                    same(xm.grad, xr.grad[lo:hi], f"{t}: grad hidden")
                    same(wm.grad, wr.grad[lo:hi], f"{t}: grad topk_weights")
                    for n in ("gate_up_proj", "down_proj"):
                        gm = getattr(mine.experts, n).grad
                        gr = getattr(ref.experts, n).grad
                        same(gm[nat], gr[nat], f"{t}: grad {n} of native experts {nat}")
                        other = [e for e in range(E) if e not in nat]
                        same(gm[other], torch.zeros_like(gm[other]), f"{t}: grad {n} of others")
                    rec, rr = hm.stats[-1], hr.stats[-1]
                    global checks
                    checks += 1
                    if rec["kept"] != rr["kept"] or rec["moved"] != rr["moved"]:
                        fail(f"{t}: kept/moved {rec['kept']}/{rec['moved']} vs simulated "
                             f"{rr['kept']}/{rr['moved']}")
                    b = torch.tensor(rec["bwd_a2a_bytes"], dtype=torch.int64)
                    if len(b) != 2:
                        fail(f"{t}: {len(b)} backward all-to-alls, expected 2")
                    dist.all_reduce(b)
                    want = rec["kept"] * D * 4
                    if b.tolist() != [want, want]:
                        fail(f"{t}: backward all-to-all bytes {b.tolist()} over all ranks, "
                             f"expected the kept rows {rec['kept']} x {D} x 4 = {want} each")
                    if rate < 1 and planner in ("lrmoe", "capacity") and \
                            not rec["kept"] < rec["pairs"]:
                        fail(f"{t}: rate {rate} kept all {rec['pairs']} pairs")
                    moved += rec["moved"]
                    opt_r.step()
                    opt_m.step()
                    opt_r.zero_grad()
                    opt_m.zero_grad()
                # planners with replicas sent weights and gradients by p2p
                a2a, p2p = ctypes.c_int64(), ctypes.c_int64()
                lt.lib.lrmoe_comm_callback_sent(hm.dist.comm, ctypes.byref(a2a), ctypes.byref(p2p))
                n = torch.tensor([p2p.value, a2a.value])
                dist.all_reduce(n)
                checks += 1
                if planner not in ("fixed", "capacity") and n[0] == 0:
                    fail(f"{tag}: no p2p bytes: no replica used")
                if planner in ("fixed", "capacity") and n[0] != 0:
                    fail(f"{tag}: {int(n[0])} p2p bytes without replicas")


def model(family, rate=0.7, steps=10, planner="lrmoe", sharded=""):
    """A training run of STEPS SGD steps on a tiny model, each rank one
    sequence of the batch: per step the per-token losses and logits of this
    rank's rows, the gradient of its input embeddings and of every expert
    parameter (its native experts' the same bits, the others' zero) equal
    the simulated run's; every non-expert parameter (attention, norms,
    router, shared experts) gets its gradient too, all-reduced over the
    ranks as data parallelism would: that sum of per-rank partial sums is
    not the simulated run's one sum over the batch, so it is checked to
    1e-5 of its largest entry; those parameters stay fixed (lr 0) so the
    expert trajectory can stay bit for bit over every step. sharded="shard":
    patch(shard=True): this rank's expert parameters are its native rows,
    their gradients those rows of the simulated run's, and at the end
    full_state_dict() holds every rank's trained rows."""
    global checks
    V, S = 64, 12
    if family == "deepseek_v3":
        torch.manual_seed(4)
        m0 = tiny.tf.DeepseekV3ForCausalLM(tiny.config(family)).float()
    else:
        m0 = tiny.model(family, seed=4)
    ref, mine = copy.deepcopy(m0), copy.deepcopy(m0)
    hr = lt.patch(ref, ranks=P, seed=9, planner=planner, **_rate(planner, rate))
    hm = lt.patch(mine, seed=9, planner=planner, group=dist.group.WORLD,
                  shard=sharded == "shard", **_rate(planner, rate))
    E = tiny.E
    nat = native(E)
    other = [e for e in range(E) if e not in nat]
    s0, s1 = nat[0], nat[-1] + 1

    def eparams(m):
        return [p for n, p in m.named_parameters() if ".experts." in n]
    for m in (ref, mine):
        m.requires_grad_(True)
    opt_r = torch.optim.SGD(eparams(ref), lr=0.5)
    opt_m = torch.optim.SGD(eparams(mine), lr=0.5)
    tag = f"{family} {planner} rate={rate}"
    nexp = 0
    for step in range(steps):
        gen = torch.Generator().manual_seed(300 + step)
        ids = torch.randint(0, V, (P, S), generator=gen)
        emb_r = ref.get_input_embeddings()(ids).detach().requires_grad_()
        emb_m = mine.get_input_embeddings()(ids[ME:ME + 1]).detach().requires_grad_()
        lr_ = ref(inputs_embeds=emb_r).logits
        lm = mine(inputs_embeds=emb_m).logits
        t = f"{tag} step {step}"
        same(lm[0], lr_[ME].detach(), f"{t}: logits")
        tgt = torch.roll(ids, -1, 1)
        N = P * S
        tok_r = torch.nn.functional.cross_entropy(lr_.reshape(-1, V), tgt.reshape(-1),
                                                  reduction="none")
        tok_m = torch.nn.functional.cross_entropy(lm.reshape(-1, V), tgt[ME].reshape(-1),
                                                  reduction="none")
        same(tok_m, tok_r.view(P, S)[ME].detach(), f"{t}: per-token losses")
        (tok_r.sum() / N).backward()
        (tok_m.sum() / N).backward()
        same(emb_m.grad[0], emb_r.grad[ME], f"{t}: grad of the input embeddings")
        for (n, pm), (_, pr) in zip(mine.named_parameters(), ref.named_parameters()):
            if ".experts." in n:
                nexp += 1
                if sharded:
                    same(pm.grad, pr.grad[s0:s1], f"{t}: grad {n} (shard [{s0},{s1}))")
                else:
                    same(pm.grad[nat], pr.grad[nat], f"{t}: grad {n}[{nat}]")
                    same(pm.grad[other], torch.zeros_like(pm.grad[other]),
                         f"{t}: grad {n}[{other}]")
            elif pm is not mine.get_input_embeddings().weight:  # (inputs_embeds: emb.grad)
                if pm.grad is None or pr.grad is None:
                    fail(f"{t}: {n}: no gradient ({pm.grad is None}, {pr.grad is None})")
                gsum = pm.grad.clone()
                dist.all_reduce(gsum)
                tol = 1e-5 * max(pr.grad.abs().max().item(), 1e-30)
                d = (gsum - pr.grad).abs().max().item()
                checks += 1
                if not d <= tol:
                    fail(f"{t}: all-reduced grad {n}: max |diff| {d} > {tol}")
        rec, rr = hm.stats[-1], hr.stats[-1]
        checks += 1
        drops = rec["kept"] < rec["pairs"]
        if rec["kept"] != rr["kept"] or (planner == "lrmoe" and (rate < 1) != drops) or \
                (planner == "capacity" and rate < 1 and not drops):
            fail(f"{t}: kept {rec['kept']} of {rec['pairs']} vs simulated {rr['kept']}")
        opt_r.step()
        opt_m.step()
        for m in (ref, mine):
            m.zero_grad(set_to_none=True)
    if nexp == 0:
        fail(f"{tag}: no expert parameters")
    if sharded:  # every rank's trained rows, gathered: the simulated run's parameters
        full, want = hm.full_state_dict(), ref.state_dict()
        for k in want:
            if ".experts." in k:
                same(full[k], want[k], f"{tag}: full_state_dict()[{k}] after {steps} steps")
    a2a, p2p = ctypes.c_int64(), ctypes.c_int64()
    lt.lib.lrmoe_comm_callback_sent(hm.dist.comm, ctypes.byref(a2a), ctypes.byref(p2p))
    n = torch.tensor([p2p.value])
    dist.all_reduce(n)
    checks += 1
    if planner == "llep" and n[0] == 0:
        fail(f"{tag}: no p2p bytes: no replica used")


PAGE = os.sysconf("SC_PAGE_SIZE")


def resident(t):
    """Bytes of tensor t's pages in memory (mincore(2))."""
    libc = ctypes.CDLL(None, use_errno=True)
    a, n = t.data_ptr(), t.numel() * t.element_size()
    a0 = a - a % PAGE
    npg = (a + n - a0 + PAGE - 1) // PAGE
    v = (ctypes.c_ubyte * npg)()
    if libc.mincore(ctypes.c_void_p(a0), ctypes.c_size_t(npg * PAGE), v) != 0:
        fail(f"mincore: errno {ctypes.get_errno()}")
    return sum(x & 1 for x in v) * PAGE


def shard_steps(tag, ref, mine, names, dims, s0, s1):
    """3 SGD steps of the experts op on this rank's tokens, ref the
    unsharded group run and mine the sharded one: outputs, hidden and
    routing-weight gradients, mine's gradients (ref's native rows [s0, s1),
    dim 0 in every layout) and its parameters after each step are the same
    bits."""
    E, D, K = dims
    Tg = 24 * P
    lo, hi = ME * Tg // P, (ME + 1) * Tg // P
    opt_r = torch.optim.SGD(ref.experts.parameters(), lr=0.5)
    opt_m = torch.optim.SGD(mine.experts.parameters(), lr=0.5)
    for step in range(3):
        gen = torch.Generator().manual_seed(100 + step)
        x = torch.randn(Tg, D, generator=gen)
        G = torch.randn(Tg, D, generator=gen)
        ids, w = routing(Tg, E, K, 200 + step)
        outs = []
        for m in (ref, mine):
            xm, wm = x[lo:hi].clone().requires_grad_(), w[lo:hi].clone().requires_grad_()
            out = m.experts(xm, ids[lo:hi], wm)
            out.backward(G[lo:hi])
            outs.append((out.detach(), xm.grad, wm.grad))
        t = f"{tag} step {step}"
        for what, a, b in zip(("output", "grad hidden", "grad topk_weights"), outs[1], outs[0]):
            same(a, b, f"{t}: {what}")
        for n in names:
            gm, gr = getattr(mine.experts, n).grad, getattr(ref.experts, n).grad
            same(gm, gr[s0:s1], f"{t}: grad {n} of experts [{s0},{s1})")
        for o in (opt_r, opt_m):
            o.step()
            o.zero_grad()
        for n in names:
            same(getattr(mine.experts, n).detach(), getattr(ref.experts, n).detach()[s0:s1],
                 f"{t}: {n} after the step")


def natives_state(ref, E):
    """ref's state_dict with every expert tensor's rows those of each row's
    native rank's ref (gathered): an unsharded group run trains only its
    native rows, so this is the full state the sharded runs hold."""
    want = {}
    for k, v in ref.state_dict().items():
        v = v.clone()
        if k.startswith("experts."):
            parts = [torch.empty_like(v) for _ in range(P)]
            dist.all_gather(parts, v.contiguous())
            for r in range(P):
                rr = [e for e in range(E) if lt.lib.lrmoe_exec_native(e, E, P) == r]
                v[rr[0]:rr[-1] + 1] = parts[r][rr[0]:rr[-1] + 1]
        want[k] = v
    return want


def shard(planners):
    """patch(group=, shard=True) against the unsharded group run: each rank
    keeps experts [lo, hi) = its native ones, 1/P of the expert parameters;
    for each planner at rate 1.0 and 0.7, 3 SGD steps: outputs, hidden and
    routing-weight gradients and its experts' gradients and parameters are
    the same bits; the pages of the packed weights and gradient scratch
    ever written are the shard's rows (mincore: about 1/P of the memory);
    full_state_dict() is the unsharded model's state_dict
    (every rank), and load_full_state_dict() of it restores the shard."""
    global checks
    E, D = tiny.E, tiny.D
    nat = native(E)
    s0, s1 = nat[0], nat[-1] + 1
    for planner in planners:
        for rate in (1.0, 0.7):
            tag = f"shard {planner} rate={rate}"
            base = tiny.block("qwen3_moe", seed=3)
            ref, mine = copy.deepcopy(base), copy.deepcopy(base)
            lt.patch(ref, planner=planner, seed=5, group=dist.group.WORLD, **_rate(planner, rate))
            hm = lt.patch(mine, planner=planner, seed=5, group=dist.group.WORLD, shard=True,
                          **_rate(planner, rate))
            for n in ("gate_up_proj", "down_proj"):
                pm, pr = getattr(mine.experts, n), getattr(ref.experts, n)
                checks += 1
                if pm.shape[0] * P != pr.shape[0] or pm.shape[0] != s1 - s0:
                    fail(f"{tag}: {n} holds {pm.shape[0]} of {pr.shape[0]} experts, expected "
                         f"[{s0},{s1})")
                same(pm.detach(), pr.detach()[s0:s1], f"{tag}: {n} after patch")
            shard_steps(tag, ref, mine, ("gate_up_proj", "down_proj"), (E, D, tiny.K), s0, s1)
            # memory: the pages of the packed buffer and of the gradient
            # scratch ever written are the shard's (mincore(2))
            for name, t in [("packed buffer", hm.layers[0].w_f32), *[
                    ("gradient scratch", x) for x in hm._scratch]]:
                n = t.numel() * 4
                own = (s1 - s0) * n // E
                res = resident(t)
                checks += 1
                if not res <= own + 2 * PAGE or not res < n:
                    fail(f"{tag}: {name}: {res} of {n} bytes resident, the shard's rows are {own}")
            # the unsharded ref trains only its native rows: the full state is
            # every rank's native rows of its ref
            full, want = hm.full_state_dict(), natives_state(ref, E)
            for k in want:
                same(full[k], want[k], f"{tag}: full_state_dict()[{k}]")
            fresh = copy.deepcopy(base)
            fresh.load_state_dict(full)  # loadable into the unsharded block
            other = copy.deepcopy(base)
            ho = lt.patch(other, planner=planner, group=dist.group.WORLD, shard=True,
                          **_rate(planner, rate))
            ptr = other.experts.gate_up_proj.data_ptr()
            ho.load_full_state_dict(full)
            checks += 1
            if other.experts.gate_up_proj.data_ptr() != ptr:
                fail(f"{tag}: load_full_state_dict moved the shard out of the packed buffer")
            for n in ("gate_up_proj", "down_proj"):
                same(getattr(other.experts, n).detach(), full[f"experts.{n}"][s0:s1],
                     f"{tag}: {n} after load_full_state_dict")


def shard_layouts(cases):
    """patch(group=, shard=True) of a block registered with each stacked
    layout (test_register.py's LayoutMoE: fused [E,2F,D]/[E,D,F], fused_t
    [E,D,2F]/[E,F,D], separate w1/w3 [E,F,D] + w2 [E,D,F], separate_t
    [E,D,F] + [E,F,D]) against the same block patched unsharded on the same
    group, for each planner:rate of cases, 3 SGD steps of the experts op on
    this rank's tokens: outputs, hidden and routing-weight gradients, the
    shard's parameter gradients (the unsharded run's native rows
    [s0, s1), dim 0 in every layout) and the parameters after each step
    are the same bits; the shard holds 1/P of the expert parameter bytes,
    its pages of the packed buffer written are its rows (mincore);
    full_state_dict() is the unsharded runs' trained native rows, gathered,
    loadable into the unpatched block; load_full_state_dict() of it gives
    the shard its rows in place. Last, the per-expert layouts (one module
    per expert: test_register.py's MixtralV4MoE, SequentialMoE) are refused
    with shard=True, naming why."""
    global checks
    import test_register as tr
    tr.setUpModule()  # registers test_register's blocks (its LayoutMoE classes among them)
    E, D, K = tr.E, tr.D, tr.K
    nat = native(E)
    s0, s1 = nat[0], nat[-1] + 1
    for lay in tr.STORED:
        names = list(tr.STORED[lay])
        for case in cases:
            planner, rate = case.split(":")
            rate = float(rate)
            tag = f"shard-layouts {lay} {planner} rate={rate}"
            base = tr.build_layout(lay, "softmax", seed=3)
            ref, mine = copy.deepcopy(base), copy.deepcopy(base)
            kw = dict(planner=planner, seed=5, group=dist.group.WORLD, **_rate(planner, rate))
            lt.patch(ref, **kw)
            hm = lt.patch(mine, shard=True, **kw)
            checks += 1
            if hm.layers[0].block.adapter.layout != lay:
                fail(f"{tag}: patched as layout {hm.layers[0].block.adapter.layout}")
            nb = [sum(p.numel() * p.element_size() for p in m.experts.parameters())
                  for m in (base, mine)]
            checks += 1
            if nb[1] * P != nb[0]:
                fail(f"{tag}: the shard holds {nb[1]} expert parameter bytes of {nb[0]}: "
                     f"not 1/{P}")
            for n in names:
                pm, pr = getattr(mine.experts, n), getattr(ref.experts, n)
                checks += 1
                if pm.shape[0] != s1 - s0 or pm.shape[1:] != pr.shape[1:]:
                    fail(f"{tag}: {n} is {list(pm.shape)} of {list(pr.shape)}, expected "
                         f"experts [{s0},{s1})")
                same(pm.detach(), pr.detach()[s0:s1], f"{tag}: {n} after patch")
            shard_steps(tag, ref, mine, names, (E, D, K), s0, s1)
            buf = hm.layers[0].w_f32
            n = buf.numel() * 4
            own = (s1 - s0) * n // E
            res = resident(buf)
            checks += 1
            if not res <= own + 2 * PAGE or not res < n:
                fail(f"{tag}: packed buffer: {res} of {n} bytes resident, the shard's rows "
                     f"are {own}")
            a2a, p2p = ctypes.c_int64(), ctypes.c_int64()
            lt.lib.lrmoe_comm_callback_sent(hm.dist.comm, ctypes.byref(a2a), ctypes.byref(p2p))
            sent = torch.tensor([p2p.value])
            dist.all_reduce(sent)
            checks += 1
            if (planner != "fixed") != (sent[0] > 0):  # fixed places no replica
                fail(f"{tag}: {int(sent[0])} p2p bytes (replicas' weights and gradients)")
            # the full state: every rank's trained native rows of its
            # unsharded run (which trains only those)
            full, want = hm.full_state_dict(), natives_state(ref, E)
            checks += 1
            if sorted(full) != sorted(want):
                fail(f"{tag}: full_state_dict keys {sorted(full)} vs {sorted(want)}")
            for k in want:
                same(full[k], want[k], f"{tag}: full_state_dict()[{k}]")
            fresh = copy.deepcopy(base)
            fresh.load_state_dict(full)  # loadable into the unpatched block
            for k, v in fresh.state_dict().items():
                same(v, full[k], f"{tag}: {k} of the unpatched block loaded with it")
            other = copy.deepcopy(base)
            ho = lt.patch(other, shard=True, **kw)
            ptr = getattr(other.experts, names[0]).data_ptr()
            ho.load_full_state_dict(full)
            checks += 1
            if getattr(other.experts, names[0]).data_ptr() != ptr or not ho.layers[0].adopted:
                fail(f"{tag}: load_full_state_dict moved the shard out of the packed buffer")
            for nm in names:
                same(getattr(other.experts, nm).detach(), full[f"experts.{nm}"][s0:s1],
                     f"{tag}: {nm} after load_full_state_dict")
    for cls in (tr.MixtralV4MoE, tr.SequentialMoE):
        torch.manual_seed(0)
        blk = cls()
        checks += 1
        try:
            lt.patch(blk, group=dist.group.WORLD, shard=True, rate=0.7)
        except lt.Error as e:
            if "shard=True takes experts stacked as [E, ...] parameters" not in str(e):
                fail(f"{cls.__name__}: shard=True refused with {e}")
        else:
            fail(f"{cls.__name__} (one module per expert) patched with shard=True")
    tr.tearDownModule()


def die(how):
    """inexec: rank 1 exits where the exec starts (rank 0 is then inside
    liblrmoe's all-to-all); early: in the token count; plan: rank 1 plans
    for another rate."""
    blk = tiny.block("qwen3_moe", seed=3)
    lt.patch(blk, rate=0.5 if how == "plan" and ME == 1 else 0.7, group=dist.group.WORLD)
    if how == "inexec" and ME == 1:
        ld.Group.run = lambda *a: os._exit(3)
    Tg, D = 16 * P, tiny.D
    ids, w = routing(Tg, tiny.E, tiny.K, 1)
    lo, hi = ME * Tg // P, (ME + 1) * Tg // P
    # early: rank 1 exits once rank 0 is about to count tokens (a file rank 0
    # makes), so that rank 0 meets the dead peer in the collective before
    # torchrun, seeing rank 1's exit, stops it (a loaded machine delayed rank
    # 0 past that once)
    mark = os.path.join(tempfile.gettempdir(), "lrmoe-dist-die-%s-%s" % (
        os.environ.get("TORCHELASTIC_RUN_ID", "run"), os.environ.get("MASTER_PORT", "0")))
    if how == "early" and ME == 1:
        t0 = time.monotonic()
        while not os.path.exists(mark) and time.monotonic() - t0 < 60:
            time.sleep(0.005)
        os._exit(3)
    if how == "early":
        open(mark, "w").close()
    try:
        blk.experts(torch.randn(hi - lo, D, requires_grad=True), ids[lo:hi], w[lo:hi])
    except lt.Error as e:
        print(f"dist: rank {ME}: error: {e}", flush=True)
        if how == "early":
            os.unlink(mark)
        try:  # no barrier: a peer is gone; the gloo threads end before exit
            ld.shutdown(barrier=False)
        except Exception as e2:  # noqa: B902 (the error above is the one that counts)
            print(f"dist: rank {ME}: shutdown: {e2}", flush=True)
        sys.exit(2)
    fail("no error though rank 1 died or disagreed")


what = sys.argv[1]
if what == "experts":
    experts(sys.argv[2:] or ["fixed", "lrmoe", "llep", "eplb", "capacity"])
elif what == "model":  # model FAMILY [RATE[,RATE...] [STEPS [PLANNER [shard]]]]
    # several rates: one run each, in one process (one torchrun start)
    for r in (sys.argv[3].split(",") if len(sys.argv) > 3 else ["0.7"]):
        model(sys.argv[2], float(r), *[f(v) for f, v in zip((int, str, str), sys.argv[4:])])
elif what == "shard":
    shard(sys.argv[2:] or ["fixed", "lrmoe", "llep", "eplb", "capacity"])
elif what == "shard-layouts":
    shard_layouts(sys.argv[2:] or ["lrmoe:0.7", "llep:0.7", "fixed:1.0"])
elif what == "die":
    die(sys.argv[2])
print(f"dist: {ME} ok {checks} checks", flush=True)
# barrier, destroy_process_group and the gloo threads joined before Python
# exits (else a rank can end in SIGABRT at exit: see lrmoe.dist.shutdown)
before = len(ld._gloo_threads())
ld.shutdown()
print(f"dist: {ME} gloo threads {before} -> {len(ld._gloo_threads())}", flush=True)
if ME == 0:
    print("dist: all ok", flush=True)
