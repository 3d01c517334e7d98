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


Tg = 24 * P
lo, hi = ME * Tg // P, (ME + 1) * Tg // P


def case(tag, base, names, dims, kw, rt, shard=True, train=True, bump=None, seeds=(100, 200)):
    """One block patched three ways: the simulated run (ranks=P, the whole
    batch), the group run (this rank's tokens) and, with shard, the sharded
    group run; 3 steps of SGD (train) or of gradients only. The group run
    equals the simulated one to rt (outputs, hidden and routing-weight
    gradients of this rank's tokens, its native experts' gradients, the
    others' zero, kept/moved/replicas), the sharded run the group run bit
    for bit (the same, its parameters after each step, 1/P of the expert
    bytes and of the layer's device copies, full_state_dict); repeated
    forwards with unchanged weights send no weight by p2p. bump: the step
    before which rank 0 alone bumps its first expert parameter's version
    (the values unchanged)."""
    global checks
    E, D, K = dims
    nat = [e for e in range(E) if lt.lib.lrmoe_exec_native(e, E, P) == ME]
    other = [e for e in range(E) if e not in nat]
    s0, s1 = nat[0], nat[-1] + 1
    dtype = next(base.experts.parameters()).dtype
    ref, mine, shd = (copy.deepcopy(base).to(dev) for _ in range(3))
    hr = lt.patch(ref, ranks=P, **kw)
    hm = lt.patch(mine, group=dist.group.WORLD, **kw)
    runs = [(ref, 0, Tg), (mine, lo, hi)]
    if shard:
        hs = lt.patch(shd, group=dist.group.WORLD, shard=True, **kw)
        runs.append((shd, lo, hi))
        full_b, shd_b = nbytes(base.experts.parameters()), nbytes(shd.experts.parameters())
        checks += 1
        if shd_b * P != full_b:
            fail(f"{tag}: shard=True holds {shd_b} expert parameter bytes, the block "
                 f"{full_b}: not 1/{P}")
        for n in names:
            same(getattr(shd.experts, n).detach(), getattr(mine.experts, n).detach()[s0:s1],
                 f"{tag}: {n} of experts [{s0},{s1}) after patch", 0)
    opts = [torch.optim.SGD(m.experts.parameters(), lr=0.5) for m, _, _ in runs]
    reps = 0
    for step in range(3):
        gen = torch.Generator().manual_seed(seeds[0] + step)
        x = torch.randn(Tg, D, generator=gen).to(dev, dtype)
        G = torch.randn(Tg, D, generator=gen).to(dev, dtype)
        ids, w = routing(Tg, E, K, seeds[1] + step)
        ids, w = ids.to(dev), w.to(dev, dtype)
        if step == bump and ME == 0:
            with torch.no_grad():
                getattr(mine.experts, names[0]).mul_(1.0)
        res = []
        for m, a, b in runs:
            xm, wm = x[a:b].clone().requires_grad_(), w[a:b].clone().requires_grad_()
            out = m.experts(xm, ids[a:b], wm)
            out.backward(G[a:b])
            res.append((out.detach(), xm.grad, wm.grad))
        t = f"{tag} step {step}"
        for i, what in enumerate(("output", "grad hidden", "grad topk_weights")):
            same(res[1][i], res[0][i][lo:hi], f"{t}: {what}", rt)
            if shard:
                same(res[2][i], res[1][i], f"{t}: shard: {what}", 0)
        for n in names:
            gm, gr = getattr(mine.experts, n).grad, getattr(ref.experts, n).grad
            same(gm[nat], gr[nat], f"{t}: grad {n} of native experts {nat}", rt)
            same(gm[other], torch.zeros_like(gm[other]), f"{t}: grad {n} of others")
            if shard:
                same(getattr(shd.experts, n).grad, gm[s0:s1],
                     f"{t}: shard: grad {n} of experts [{s0},{s1})", 0)
        for h in (hm, hs) if shard else (hm,):
            rec, rr = h.stats[-1], hr.stats[-1]
            checks += 1
            if rec.get("device") is None or "rank" not in rec:
                fail(f"{t}: not the group's device path (stats {sorted(rec)})")
            if rec["kept"] != rr["kept"] or rec["moved"] != rr["moved"]:
                fail(f"{t}: kept/moved {rec['kept']}/{rec['moved']} vs simulated "
                     f"{rr['kept']}/{rr['moved']}")
            if kw["rate"] < 1 and kw["planner"] == "lrmoe" and not rec["kept"] < rec["pairs"]:
                fail(f"{t}: rate {kw['rate']} kept all {rec['pairs']} pairs")
            if rec.get("replicas") != rr.get("replicas"):
                fail(f"{t}: replicas {rec.get('replicas')} vs simulated "
                     f"{rr.get('replicas')}")
        reps += int(hm.stats[-1].get("replicas") or 0)
        for o in opts:
            if train:
                o.step()
            o.zero_grad()
        if shard:
            for n in names:
                same(getattr(shd.experts, n).detach(),
                     getattr(mine.experts, n).detach()[s0:s1],
                     f"{t}: shard: {n} after the step", 0)
    checks += 1
    if kw["planner"] == "llep" and reps == 0:
        fail(f"{tag}: no replica in 3 steps: the p2p path (weights to replicas, "
             "their gradients back) is not exercised")
    if ME == 0:
        print(f"dist_cuda: {tag}: {reps} replicas in 3 steps", flush=True)
    # weights that did not change cost no traffic: a second forward of the
    # same batch (no step between) finds every replica resident, so no
    # weight crosses by p2p, on either group run
    for h, m in ((hm, mine), (hs, shd)) if shard else ((hm, mine),):
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
            fail(f"{tag}{' shard' if h is not hm else ''}: unchanged weights sent again by "
                 f"p2p ({n.tolist()} bytes in two repeated forwards): the device copies were "
                 "refreshed and the resident replicas dropped")
    if shard:
        # the layer's device copies of the weights: the shard's experts only
        cw = hs.layers[0].cuda.w
        checks += 1
        if cw[0].shape[0] != s1 - s0 or cw[1].shape[0] != s1 - s0:
            fail(f"{tag}: shard=True: the device weight copies hold {cw[0].shape[0]} "
                 f"experts, not the shard's {s1 - s0}")
        # full_state_dict: every rank's trained rows, each the unsharded
        # group run's native rows (a collective on the device's tensors)
        full = hs.full_state_dict()
        for k, v in mine.state_dict().items():
            if not k.startswith("experts."):
                continue
            parts = [torch.empty_like(v) for _ in range(P)]
            dist.all_gather(parts, v.contiguous())
            want = torch.cat([parts[r][r * E // P:(r + 1) * E // P] for r in range(P)])
            same(full[k], want, f"{tag}: full_state_dict {k}", 0)
        hs.unpatch()
    hm.unpatch()
    hr.unpatch()


TINY = (tiny.E, tiny.D, tiny.K)
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
    # against the simulated run: TOL, bfloat16 results to their rounding
    # (2^-8 relative) where TOL admits any difference
    rt = tol if dtype == torch.float32 or tol == 0 else max(tol, 1e-2)
    case(tag, tiny.block("qwen3_moe", seed=3, dtype=dtype), WN, TINY,
         dict(planner=planner, select=select, seed=5, rate=rate, metric=metric), rt)
# Every stacked layout that register() accepts (test_register.py's
# LayoutMoE blocks: fused [E,2F,D]/[E,D,F], fused_t [E,D,2F]/[E,F,D],
# separate w1/w3 [E,F,D] + w2 [E,D,F], separate_t [E,D,F] + [E,F,D]),
# sharded on the device path (shard_device: dim 0 of every parameter)
import test_register as tr  # noqa: E402
tr.setUpModule()
for lay in tr.STORED:
    case(f"layout {lay} llep rate=0.7", tr.build_layout(lay, "softmax", seed=3),
         list(tr.STORED[lay]), (tr.E, tr.D, tr.K),
         dict(planner="llep", select="sample", seed=5, rate=0.7), tol)
tr.tearDownModule()
# The expert parameters changed on one rank only (a version bump of rank
# 0's before step 2, the values unchanged, no optimizer step): every rank
# refreshes its executor's resident weights and replicas together
# (Group.device_weights), or rank 0 would drop the replicas rank 1 still
# holds and the weight sends and receives of the next call would not pair
# up (a hang, or wrong rows).
case("weights changed on rank 0 only", tiny.block("qwen3_moe", seed=3), WN, TINY,
     dict(planner="llep", select="topk", seed=5, rate=1.0), tol, shard=False, train=False,
     bump=2, seeds=(300, 400))
print(f"dist_cuda: {ME} ok {checks} checks", flush=True)
ld.shutdown()
if ME == 0:
    print(f"dist_cuda ({mode}): PASS", flush=True)
