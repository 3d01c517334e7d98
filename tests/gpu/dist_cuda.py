"""patch(group=) with CUDA tensors under torchrun: each rank's CUDA executor
(one rank, the group's callback communicator) against the simulated run
(patch(ranks=P)) on the same kind of device, which each rank computes
itself on the whole batch. The experts op of a tiny Qwen3-MoE block, for
planners lrmoe and llep (replicas: weights and gradients by p2p) and fixed,
rate 1.0 and 0.7, select topk and sample (float32; and llep 0.7 sample in
bfloat16), 3 SGD steps: the outputs, the
hidden and routing-weight gradients of this rank's tokens, the weight
gradients of its native experts (the others' zero) and the kept/moved
counts. Each case also runs shard=True (the rank keeps only its native
experts' parameters [s0, s1) and its executor only their weights; replicas
get theirs from the owner by p2p, their gradients go back to it): the
same bits as the unsharded group run (outputs, gradients, the parameters
after each step), 1/P of the expert parameter bytes and of the layer's
device weight copies, and full_state_dict() the unsharded run's trained rows.
Metrics gradnorm and absgrad (scored on the device) run one case each.
Then one case per stacked registered layout (fused, fused_t, separate,
separate_t: tests/python/test_register.py's LayoutMoE blocks), llep at rate
0.7 (replicas by p2p): shard=True against the unsharded group run bit for
bit (outputs, gradients, the parameters after each step), 1/P of the
expert parameter bytes and of the device weight copies, full_state_dict()
the unsharded run's trained rows; both against the simulated run to TOL.
Last,
llep with the expert parameters changed on rank 0 only before step 2: every
rank refreshes its resident weights and replicas (else a hang: the gloo
timeout, 120 s, fails it), the simulated run's results.
  torchrun --standalone --nproc-per-node 2 dist_cuda.py fake [TOL]
      gloo, CPU tensors through the CUDA path on the fake CUDA module
      (LRMOE_CUDA_MODULE; LRMOE_TORCH_FAKE_DEVICE=1, set here): the
      kernels are their CPU references, so TOL defaults to 0 (bit for bit)
  torchrun ... dist_cuda.py cuda [TOL]
      NCCL, rank r on cuda:r (tests/gpu/device-check.sh, >= 2 GPUs)
TOL applies against the simulated run; sharded and unsharded group runs
are compared bit for bit in both modes.
Prints "dist_cuda: RANK ok N checks" per rank and "dist_cuda (MODE): PASS"
on rank 0; FAIL lines and exit 1 otherwise."""
import copy
import ctypes
import datetime
import os
import sys

mode = sys.argv[1] if len(sys.argv) > 1 else "cuda"
tol = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
if mode == "fake":
    os.environ["LRMOE_TORCH_FAKE_DEVICE"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import tiny  # noqa: E402,F401
import lrmoe.dist as ld  # noqa: E402
import lrmoe.torch as lt  # noqa: E402

if mode == "cuda":
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=120))
else:
    dev = torch.device("cpu")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
ME, P = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)
checks = 0


def fail(msg):
    print(f"dist_cuda: rank {ME}: FAIL {msg}", flush=True)
    sys.exit(1)


def same(a, b, what, tl=None):
    global checks
    checks += 1
    tl = tol if tl is None else tl
    if a.shape != b.shape or a.dtype != b.dtype:
        fail(f"{what}: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")
    d = (a.float() - b.float()).abs().max().item() if a.numel() else 0.0
    m = b.float().abs().max().item() if b.numel() else 0.0
    if (tl == 0 and not torch.equal(a, b)) or d > tl * max(m, 1e-30):
        fail(f"{what}: differs from the reference run (max |diff| {d}, max |ref| {m})")


def nbytes(ts):
    return sum(t.numel() * t.element_size() for t in ts)


def routing(Tg, E, K, seed):
    g = torch.Generator().manual_seed(seed)
    prob = torch.tensor([8.0 / (1 + e) for e in range(E)])
    ids = torch.stack([torch.multinomial(prob, K, generator=g) for _ in range(Tg)])
    w = torch.softmax(torch.randn(Tg, K, generator=g), -1)
    return ids, w


E, D, K = tiny.E, tiny.D, tiny.K
Tg = 24 * P
lo, hi = ME * Tg // P, (ME + 1) * Tg // P
nat = [e for e in range(E) if lt.lib.lrmoe_exec_native(e, E, P) == ME]
other = [e for e in range(E) if e not in nat]
s0, s1 = nat[0], nat[-1] + 1
WN = ("gate_up_proj", "down_proj")
CASES = [(planner, rate, select, torch.float32, "lrm") for planner in ("lrmoe", "llep", "fixed")
         for rate in (1.0, 0.7) for select in ("topk", "sample")]
CASES.append(("llep", 0.7, "sample", torch.bfloat16, "lrm"))  # bfloat16 experts and activations
# the other metrics scored on the device (lrmoe_exec_cuda_score)
CASES += [("lrmoe", 0.7, "topk", torch.float32, m) for m in ("gradnorm", "absgrad")]
for planner, rate, select, dtype, metric in CASES:
    tag = f"{planner} rate={rate} select={select}" + (
        "" if dtype == torch.float32 else f" {dtype}") + (
        "" if metric == "lrm" else f" metric={metric}")
    base = tiny.block("qwen3_moe", seed=3, dtype=dtype)
    # against the simulated run: TOL, bfloat16 results to their rounding
    # (2^-8 relative) where TOL admits any difference
    rt = tol if dtype == torch.float32 or tol == 0 else max(tol, 1e-2)
    ref, mine, shd = (copy.deepcopy(base).to(dev) for _ in range(3))
    kw = dict(planner=planner, select=select, seed=5, rate=rate, metric=metric)
    hr = lt.patch(ref, ranks=P, **kw)
    hm = lt.patch(mine, group=dist.group.WORLD, **kw)
    hs = lt.patch(shd, group=dist.group.WORLD, shard=True, **kw)
    # memory: the shard's parameters are 1/P of the model's expert
    # parameter bytes, its rows [s0, s1) of them
    full_b, shd_b = nbytes(base.experts.parameters()), nbytes(shd.experts.parameters())
    checks += 1
    if shd_b * P != full_b:
        fail(f"{tag}: shard=True holds {shd_b} expert parameter bytes, the model "
             f"{full_b}: not 1/{P}")
    for n in WN:
        same(getattr(shd.experts, n).detach(), getattr(mine.experts, n).detach()[s0:s1],
             f"{tag}: {n} of experts [{s0},{s1}) after patch", 0)
    opt_r = torch.optim.SGD(ref.experts.parameters(), lr=0.5)
    opt_m = torch.optim.SGD(mine.experts.parameters(), lr=0.5)
    opt_s = torch.optim.SGD(shd.experts.parameters(), lr=0.5)
    reps = 0
    for step in range(3):
        gen = torch.Generator().manual_seed(100 + step)
        x = torch.randn(Tg, D, generator=gen).to(dev, dtype)
        G = torch.randn(Tg, D, generator=gen).to(dev, dtype)
        ids, w = routing(Tg, E, K, 200 + step)
        ids, w = ids.to(dev), w.to(dev, dtype)
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        out_r = ref.experts(xr, ids, wr)
        out_r.backward(G)
        xm, wm = x[lo:hi].clone().requires_grad_(), w[lo:hi].clone().requires_grad_()
        out_m = mine.experts(xm, ids[lo:hi], wm)
        out_m.backward(G[lo:hi])
        xs, ws = x[lo:hi].clone().requires_grad_(), w[lo:hi].clone().requires_grad_()
        out_s = shd.experts(xs, ids[lo:hi], ws)
        out_s.backward(G[lo:hi])
        t = f"{tag} step {step}"
        same(out_m.detach(), out_r[lo:hi].detach(), f"{t}: output", rt)
        same(xm.grad, xr.grad[lo:hi], f"{t}: grad hidden", rt)
        same(wm.grad, wr.grad[lo:hi], f"{t}: grad topk_weights", rt)
        same(out_s.detach(), out_m.detach(), f"{t}: shard: output", 0)
        same(xs.grad, xm.grad, f"{t}: shard: grad hidden", 0)
        same(ws.grad, wm.grad, f"{t}: shard: grad topk_weights", 0)
        for n in WN:
            gm = getattr(mine.experts, n).grad
            gr = getattr(ref.experts, n).grad
            same(gm[nat], gr[nat], f"{t}: grad {n} of native experts {nat}", rt)
            same(gm[other], torch.zeros_like(gm[other]), f"{t}: grad {n} of others")
            same(getattr(shd.experts, n).grad, gm[s0:s1],
                 f"{t}: shard: grad {n} of experts [{s0},{s1})", 0)
        for h in (hm, hs):
            rec, rr = h.stats[-1], hr.stats[-1]
            checks += 1
            if rec.get("device") is None or "rank" not in rec:
                fail(f"{t}: not the group's device path (stats {sorted(rec)})")
            if rec["kept"] != rr["kept"] or rec["moved"] != rr["moved"]:
                fail(f"{t}: kept/moved {rec['kept']}/{rec['moved']} vs simulated "
                     f"{rr['kept']}/{rr['moved']}")
            if rate < 1 and planner == "lrmoe" and not rec["kept"] < rec["pairs"]:
                fail(f"{t}: rate {rate} kept all {rec['pairs']} pairs")
            if rec.get("replicas") != rr.get("replicas"):
                fail(f"{t}: replicas {rec.get('replicas')} vs simulated "
                     f"{rr.get('replicas')}")
        reps += int(hs.stats[-1].get("replicas") or 0)
        for o in (opt_r, opt_m, opt_s):
            o.step()
            o.zero_grad()
        for n in WN:
            same(getattr(shd.experts, n).detach(),
                 getattr(mine.experts, n).detach()[s0:s1],
                 f"{t}: shard: {n} after the step", 0)
    checks += 1
    if planner == "llep" and reps == 0:
        fail(f"{tag}: no replica in 3 steps: the p2p path (weights to replicas, "
             "their gradients back) is not exercised")
    if ME == 0:
        print(f"dist_cuda: {tag}: {reps} replicas in 3 steps", flush=True)
    # the layer's device copies of the weights (w_gate, w_up split
    # from gate_up): the shard's experts only
    cw = hs.layers[0].cuda.w
    checks += 1
    if cw[0].shape[0] != s1 - s0 or cw[1].shape[0] != s1 - s0:
        fail(f"{tag}: shard=True: the device weight copies hold {cw[0].shape[0]} "
             f"experts, not the shard's {s1 - s0}")
    # full_state_dict: every rank's trained rows, each the unsharded
    # group run's native rows (a collective on the device's tensors)
    full = hs.full_state_dict()
    for k, v in mine.state_dict().items():
        if "experts." not in k:
            continue
        parts = [torch.empty_like(v) for _ in range(P)]
        dist.all_gather(parts, v.contiguous())
        want = torch.cat([parts[r][r * E // P:(r + 1) * E // P] for r in range(P)])
        same(full[k], want, f"{tag}: full_state_dict {k}", 0)
    hm.unpatch()
    hr.unpatch()
    hs.unpatch()
    del full, parts, opt_r, opt_m, opt_s
# Every stacked layout that register() accepts (test_register.py's
# LayoutMoE blocks: fused [E,2F,D]/[E,D,F], fused_t [E,D,2F]/[E,F,D],
# separate w1/w3 [E,F,D] + w2 [E,D,F], separate_t [E,D,F] + [E,F,D]),
# sharded on the device path (shard_device: dim 0 of every parameter)
import test_register as tr  # noqa: E402
tr.setUpModule()
LE, LD, LK = tr.E, tr.D, tr.K
lnat = [e for e in range(LE) if lt.lib.lrmoe_exec_native(e, LE, P) == ME]
l0, l1 = lnat[0], lnat[-1] + 1
for lay in tr.STORED:
    names = list(tr.STORED[lay])
    tag = f"layout {lay} llep rate=0.7"
    base = tr.build_layout(lay, "softmax", seed=3)
    ref, mine, shd = (copy.deepcopy(base).to(dev) for _ in range(3))
    kw = dict(planner="llep", select="sample", seed=5, rate=0.7)
    hr = lt.patch(ref, ranks=P, **kw)
    hm = lt.patch(mine, group=dist.group.WORLD, **kw)
    hs = lt.patch(shd, group=dist.group.WORLD, shard=True, **kw)
    full_b, shd_b = nbytes(base.experts.parameters()), nbytes(shd.experts.parameters())
    checks += 1
    if shd_b * P != full_b:
        fail(f"{tag}: shard=True holds {shd_b} expert parameter bytes, the block "
             f"{full_b}: not 1/{P}")
    for n in names:
        same(getattr(shd.experts, n).detach(), getattr(mine.experts, n).detach()[l0:l1],
             f"{tag}: {n} of experts [{l0},{l1}) after patch", 0)
    opts = [torch.optim.SGD(m.experts.parameters(), lr=0.5) for m in (ref, mine, shd)]
    reps = 0
    for step in range(3):
        gen = torch.Generator().manual_seed(100 + step)
        x = torch.randn(Tg, LD, generator=gen).to(dev)
        G = torch.randn(Tg, LD, generator=gen).to(dev)
        ids, w = routing(Tg, LE, LK, 200 + step)
        ids, w = ids.to(dev), w.to(dev)
        res = []
        for m, a, b in ((ref, 0, Tg), (mine, lo, hi), (shd, lo, hi)):
            xm, wm = x[a:b].clone().requires_grad_(), w[a:b].clone().requires_grad_()
            out = m.experts(xm, ids[a:b], wm)
            out.backward(G[a:b])
            res.append((out.detach(), xm.grad, wm.grad))
        t = f"{tag} step {step}"
        for i, what in enumerate(("output", "grad hidden", "grad topk_weights")):
            same(res[1][i], res[0][i][lo:hi], f"{t}: {what}")
            same(res[2][i], res[1][i], f"{t}: shard: {what}", 0)
        for n in names:
            gm, gr = getattr(mine.experts, n).grad, getattr(ref.experts, n).grad
            same(gm[lnat], gr[lnat], f"{t}: grad {n} of native experts {lnat}")
            same(getattr(shd.experts, n).grad, gm[l0:l1],
                 f"{t}: shard: grad {n} of experts [{l0},{l1})", 0)
        for h in (hm, hs):
            rec = h.stats[-1]
            checks += 1
            if rec.get("device") is None or "rank" not in rec:
                fail(f"{t}: not the group's device path (stats {sorted(rec)})")
        reps += int(hs.stats[-1].get("replicas") or 0)
        for o in opts:
            o.step()
            o.zero_grad()
        for n in names:
            same(getattr(shd.experts, n).detach(), getattr(mine.experts, n).detach()[l0:l1],
                 f"{t}: shard: {n} after the step", 0)
    checks += 1
    if reps == 0:
        fail(f"{tag}: no replica in 3 steps: the p2p path is not exercised")
    # weights that did not change cost no traffic: a second forward of the
    # same batch (no step between) finds every replica resident, so no
    # weight crosses by p2p, on either group run
    for h, m in ((hm, mine), (hs, shd)):
        sent = []
        with torch.no_grad():
            for _ in range(3):
                m.experts(x[lo:hi], ids[lo:hi], w[lo:hi])
                a2a, p2p = ctypes.c_int64(), ctypes.c_int64()
                lt.lib.lrmoe_comm_callback_sent(h.dist.comm, ctypes.byref(a2a),
                                                ctypes.byref(p2p))
                sent.append(p2p.value)
        n = torch.tensor([sent[1] - sent[0], sent[2] - sent[1]])
        dist.all_reduce(n)
        checks += 1
        if n.tolist() != [0, 0]:
            fail(f"{tag}{' shard' if h is hs else ''}: unchanged weights sent again by p2p "
                 f"({n.tolist()} bytes in two repeated forwards): the device copies were "
                 "refreshed and the resident replicas dropped")
    cw = hs.layers[0].cuda.w
    checks += 1
    if cw[0].shape[0] != l1 - l0 or cw[1].shape[0] != l1 - l0:
        fail(f"{tag}: shard=True: the device weight copies hold {cw[0].shape[0]} "
             f"experts, not the shard's {l1 - l0}")
    full = hs.full_state_dict()
    for k, v in mine.state_dict().items():
        if not k.startswith("experts."):
            continue
        parts = [torch.empty_like(v) for _ in range(P)]
        dist.all_gather(parts, v.contiguous())
        want = torch.cat([parts[r][r * LE // P:(r + 1) * LE // P] for r in range(P)])
        same(full[k], want, f"{tag}: full_state_dict {k}", 0)
    if ME == 0:
        print(f"dist_cuda: {tag}: {reps} replicas in 3 steps", flush=True)
    hm.unpatch()
    hr.unpatch()
    hs.unpatch()
    del full, parts, opts
tr.tearDownModule()
# The expert parameters changed on one rank only (here a version bump of
# rank 0's, the values unchanged): every rank refreshes its executor's
# resident weights and replicas together (Group.device_weights), or rank 0
# would drop the replicas rank 1 still holds and the weight sends and
# receives of the next call would not pair up (a hang, or wrong rows).
base = tiny.block("qwen3_moe", seed=3)
ref, mine = (copy.deepcopy(base).to(dev) for _ in range(2))
kw = dict(planner="llep", select="topk", seed=5, rate=1.0)
hr = lt.patch(ref, ranks=P, **kw)
hm = lt.patch(mine, group=dist.group.WORLD, **kw)
reps = 0
for step in range(3):
    gen = torch.Generator().manual_seed(300 + step)
    x = torch.randn(Tg, D, generator=gen).to(dev)
    G = torch.randn(Tg, D, generator=gen).to(dev)
    ids, w = routing(Tg, E, K, 400 + step)
    ids, w = ids.to(dev), w.to(dev)
    if step == 2 and ME == 0:
        with torch.no_grad():
            mine.experts.gate_up_proj.mul_(1.0)
    xr = x.clone().requires_grad_()
    out_r = ref.experts(xr, ids, w)
    out_r.backward(G)
    xm = x[lo:hi].clone().requires_grad_()
    out_m = mine.experts(xm, ids[lo:hi], w[lo:hi])
    out_m.backward(G[lo:hi])
    t = f"weights changed on rank 0 only, step {step}"
    same(out_m.detach(), out_r[lo:hi].detach(), f"{t}: output")
    same(xm.grad, xr.grad[lo:hi], f"{t}: grad hidden")
    for n in WN:
        same(getattr(mine.experts, n).grad[nat], getattr(ref.experts, n).grad[nat],
             f"{t}: grad {n} of native experts {nat}")
    reps += int(hm.stats[-1].get("replicas") or 0)
    for m in (ref, mine):
        m.experts.zero_grad()
checks += 1
if reps == 0:
    fail("weights changed on one rank: no replica, the p2p path is not exercised")
hm.unpatch()
hr.unpatch()
print(f"dist_cuda: {ME} ok {checks} checks", flush=True)
del hm, hr, hs, mine, ref, shd
ld.shutdown()
if ME == 0:
    print(f"dist_cuda ({mode}): PASS", flush=True)
