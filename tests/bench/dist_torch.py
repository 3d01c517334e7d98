"""make bench section "dist" (tests/bench/dist.sh): patch(group=) at the
shape of issue 38, E=32 K=4 D=512 F=256, TOKENS tokens per rank (4096),
float32, gloo on the CPU, one BLAS thread per rank, skewed routing. For rate
1.0 and 0.7, forward + backward of the patched experts op, best of REPS (3):
  step_s    wall time of the step (all ranks start together: a barrier)
  lib_s     seconds inside liblrmoe calls, its all-to-alls and replica
            transfers (dist.all_to_all_single / send / recv in the callback
            communicator) included
  comm_s    the metadata collectives and state moves around the exec
            (routing and score all-gathers, token counts, plan digest,
            phi / saved-state / hidden moves)
  outside   (wall - lib_s - comm_s) / wall of the op: Python marshalling
            (target < 10%)
  fwd/bwd a2a_B  bytes this rank sent in each of the two all-to-alls of
            the phase (dispatch, combine)
  move_B    bytes of the state moves of the phase
  expert_B  bytes of the expert parameters this rank holds
rows "sharded": rate 0.7 with patch(shard=True) (each rank keeps its
native experts only);
then the simulated single-process run (patch(ranks=P), one process, all
ranks one after the other) on rank 0 with the whole batch, best of REPS.
One table on rank 0 and verdict lines: the backward all-to-all bytes at rate
0.7 against 1.0 (must fall with rho: the kept pairs' rows only), the largest
share outside, and the step time against the simulated run's.
Usage: torchrun --standalone --nproc-per-node 2 tests/bench/dist_torch.py [TOKENS]"""
import copy
import datetime
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import tiny  # noqa: E402  (paths, LRMOE_LIBRARY)
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import lrmoe.dist as ld  # noqa: E402
import lrmoe.torch as lt  # noqa: E402

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
ME, P = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)
E, K, D, F = 32, 4, 512, 256
Tl = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
REPS = int(os.environ.get("REPS", "3"))
Tg = Tl * P
blk = tiny.block("qwen3_moe", seed=1, num_experts=E, num_experts_per_tok=K, hidden_size=D,
                 moe_intermediate_size=F)
g = torch.Generator().manual_seed(0)
prob = torch.tensor([4.0 / (1 + e) ** 0.5 for e in range(E)])
ids = torch.multinomial(prob.expand(Tg, E), K, generator=g)
w = torch.softmax(torch.randn(Tg, K, generator=g), -1)
x = torch.randn(Tg, D, generator=g) * 0.1
G = torch.randn(Tg, D, generator=g) * 0.01
lo, hi = ME * Tg // P, (ME + 1) * Tg // P
if ME == 0:
    print(f"dist: patch(group=) E={E} K={K} D={D} F={F} float32, {P} ranks (gloo, CPU, "
          f"{os.cpu_count()} cores), {Tl} tokens per rank, 1 thread per rank, "
          f"fwd+bwd best of {REPS}", flush=True)
rows = []
for rate, sharded in ((1.0, False), (0.7, False), (0.7, True)):
    m = copy.deepcopy(blk)
    h = lt.patch(m, rate=rate, group=dist.group.WORLD, threads=1, shard=sharded)
    best = None
    for it in range(REPS):
        xm, wm = x[lo:hi].clone().requires_grad_(), w[lo:hi].clone().requires_grad_()
        dist.barrier()
        t0 = time.perf_counter()
        m.experts(xm, ids[lo:hi], wm).backward(G[lo:hi])
        t = time.perf_counter() - t0
        if best is None or t < best[0]:
            best = (t, h.stats[-1])
    t, r = best
    wall = r["fwd_seconds"] + r["bwd_seconds"]
    lib_s = r["fwd_lib_seconds"] + r["bwd_lib_seconds"]
    comm = r["fwd_comm_seconds"] + r["bwd_comm_seconds"]
    rows.append(dict(rank=ME, rate=rate, shard=sharded, step=t,
                     wbytes=sum(p.numel() * p.element_size() for p in m.experts.parameters()),
                     lib=lib_s, comm=comm,
                     out=(wall - lib_s - comm) / wall, fa=list(r["fwd_a2a_bytes"]),
                     ba=list(r["bwd_a2a_bytes"]), fm=r["fwd_move_bytes"],
                     bm=r["bwd_move_bytes"], kept=r["kept"], pairs=r["pairs"]))
    h.unpatch()
# How the ranks agree on one plan (issue 38: "every rank runs the planner on
# the same loads, or rank 0 plans and broadcasts; measure and choose"), on
# this run's global loads and the patched layer's planner, best of 20, all
# ranks released by a barrier, rank 0's wall time:
#   every:  every rank plans, then the plan digest all-gather (Group.agree:
#           what lrmoe.dist does; it also catches ranks that disagree)
#   bcast:  rank 0 plans, then one broadcast of the four plan arrays
m = copy.deepcopy(blk)
h = lt.patch(m, rate=0.7, group=dist.group.WORLD, threads=1)
lay, grp = h.layers[0], h.dist
load = torch.bincount(ids.view(-1), minlength=E).numpy()
agree_t = {"every": [], "bcast": [], "plan": []}
for it in range(20):
    dist.barrier()
    t0 = time.perf_counter()
    pl = lt._plan(lay, lt._Call(), load, Tg, K, "f32")
    t1 = time.perf_counter()
    grp.agree("bench", *pl[:4])
    n = sum(a.size for a in pl[:4])  # the plan's int64 count (every rank)
    agree_t["every"].append(time.perf_counter() - t0)
    agree_t["plan"].append(t1 - t0)
    dist.barrier()
    t0 = time.perf_counter()
    if ME == 0:
        pl = lt._plan(lay, lt._Call(), load, Tg, K, "f32")
        buf = torch.from_numpy(np.concatenate([pl[0].astype(np.int64).ravel(), pl[1].ravel(),
                                               pl[2].ravel(), pl[3].ravel()]))
    else:
        buf = torch.empty(n, dtype=torch.int64)
    dist.broadcast(buf, 0)
    agree_t["bcast"].append(time.perf_counter() - t0)
h.unpatch()
agree_ms = {k: 1e3 * min(v) for k, v in agree_t.items()}
everyone = [None] * P
dist.all_gather_object(everyone, rows)
sim = {}
if ME == 0:
    for rate in (1.0, 0.7):
        m = copy.deepcopy(blk)
        lt.patch(m, rate=rate, ranks=P, threads=1)
        ts = []
        for it in range(REPS):
            xm, wm = x.clone().requires_grad_(), w.clone().requires_grad_()
            t0 = time.perf_counter()
            m.experts(xm, ids, wm).backward(G)
            ts.append(time.perf_counter() - t0)
        sim[rate] = min(ts)
    print(f"{'run':<10} {'rank':>4} {'rate':>5} {'expert_B':>9} {'step_s':>7} {'lib_s':>7} "
          f"{'comm_s':>7} "
          f"{'outside':>7} {'fwd_a2a_B':>19} {'bwd_a2a_B':>19} {'fwd_move_B':>10} "
          f"{'bwd_move_B':>10} {'kept/pairs':>12}")
    for rate in (1.0, 0.7):
        for rr in everyone:
            for q in rr:
                if q["rate"] != rate:
                    continue
                print(f"{'sharded' if q['shard'] else 'group':<10} {q['rank']:>4} {rate:5.2f} "
                      f"{q['wbytes']:>9} {q['step']:7.3f} {q['lib']:7.3f} "
                      f"{q['comm']:7.3f} {100 * q['out']:6.1f}% "
                      f"{','.join(map(str, q['fa'])):>19} {','.join(map(str, q['ba'])):>19} "
                      f"{q['fm']:>10} {q['bm']:>10} {str(q['kept']) + '/' + str(q['pairs']):>12}")
        print(f"{'simulated':<10} {'all':>4} {rate:5.2f} {'-':>9} {sim[rate]:7.3f} {'-':>7} "
              f"{'-':>7} "
              f"{'-':>7} {'-':>19} {'-':>19} {'-':>10} {'-':>10} {'-':>12}")
    flat = [q for rr in everyone for q in rr if not q["shard"]]
    shd = [q for rr in everyone for q in rr if q["shard"]]

    def bwd(rate):
        return sum(sum(q["ba"]) for q in flat if q["rate"] == rate)

    kept = {rate: next(q["kept"] / q["pairs"] for q in flat if q["rate"] == rate)
            for rate in (1.0, 0.7)}
    b1, b7 = bwd(1.0), bwd(0.7)
    worst = max(q["out"] for q in flat)
    step = {rate: max(q["step"] for q in flat if q["rate"] == rate) for rate in (1.0, 0.7)}
    print(f"verdict: backward all-to-all bytes (all ranks) {b7} at rate 0.7 = {b7 / b1:.3f} of "
          f"{b1} at 1.0 (kept pairs {kept[0.7]:.3f} of {kept[1.0]:.3f}): "
          f"{'falls' if b7 < b1 else 'does NOT fall'} with rho")
    print(f"verdict: largest share outside liblrmoe and the collectives {100 * worst:.1f}% "
          f"({'meets' if worst < 0.10 else 'misses'} the 10% target); group step / simulated "
          f"step {step[1.0] / sim[1.0]:.2f} at rate 1.0, {step[0.7] / sim[0.7]:.2f} at 0.7 "
          f"({P} processes on {os.cpu_count()} cores)", flush=True)
    un = {q["rank"]: q for q in flat if q["rate"] == 0.7}
    print(f"verdict: shard=True keeps {max(q['wbytes'] for q in shd)} expert parameter bytes per "
          f"rank = {max(q['wbytes'] / un[q['rank']]['wbytes'] for q in shd):.3f} of unsharded "
          f"(1/P = {1 / P:.3f}); its step {max(q['step'] for q in shd) / step[0.7]:.2f}x the "
          f"unsharded one at rate 0.7", flush=True)
    print(f"verdict: plan agreement (rank 0, best of 20): every rank plans "
          f"({agree_ms['plan']:.3f} ms) + digest all-gather = {agree_ms['every']:.3f} ms; rank 0 "
          f"plans + broadcast of the plan = {agree_ms['bcast']:.3f} ms; ratio every/bcast "
          f"{agree_ms['every'] / agree_ms['bcast']:.2f} (lrmoe.dist: every rank plans, and the "
          f"digest catches a rank that disagrees)", flush=True)
ld.shutdown()  # barrier; the gloo threads end before Python exits
