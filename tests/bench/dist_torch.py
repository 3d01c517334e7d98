"""patch(group=) at the shape of issue 38 (E=32, K=4, D=512, F=256, 4096 tokens per
rank, gloo, one BLAS thread): per rank the step time, the share outside liblrmoe and
the metadata collectives, the bytes of each all-to-all (the backward ones fall with
rho), then the simulated single-process run on rank 0.
  torchrun --standalone --nproc-per-node 2 tests/bench/dist_torch.py
(not yet a section of make bench)."""
import copy
import datetime
import os
import sys
import time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import tiny, torch, torch.distributed as dist
import lrmoe.torch as lt
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
ME, P = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)
E, K, D, F, Tl = 32, 4, 512, 256, 4096
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
for rate in (1.0, 0.7):
    m = copy.deepcopy(blk)
    h = lt.patch(m, rate=rate, group=dist.group.WORLD, threads=1)
    ts = []
    for it in range(3):
        xm, wm = x[lo:hi].clone().requires_grad_(), w[lo:hi].clone().requires_grad_()
        dist.barrier()
        t0 = time.perf_counter()
        out = m.experts(xm, ids[lo:hi], wm)
        out.backward(G[lo:hi])
        ts.append(time.perf_counter() - t0)
    rf, rb = h.stats[-1], h.stats[-1]
    wall = rf["fwd_seconds"] + rf["bwd_seconds"]
    lib_ = rf["fwd_lib_seconds"] + rf["bwd_lib_seconds"]
    comm = rf["fwd_comm_seconds"] + rf["bwd_comm_seconds"]
    print(f"rank {ME} rate {rate}: step {min(ts):.3f}s (fwd+bwd {wall:.3f}s, in liblrmoe incl. its a2a {lib_:.3f}s, "
          f"metadata collectives+moves {comm:.3f}s, outside {100*(wall-lib_-comm)/wall:.1f}%) "
          f"fwd a2a bytes {rf['fwd_a2a_bytes']} bwd a2a bytes {rf['bwd_a2a_bytes']} kept {rf['kept']}/{rf['pairs']} "
          f"moves fwd {rf['fwd_move_bytes']} bwd {rf['bwd_move_bytes']}", flush=True)
    h.unpatch()
dist.barrier()
if ME == 0:
    for rate in (1.0, 0.7):
        m = copy.deepcopy(blk)
        h = lt.patch(m, rate=rate, ranks=P, threads=1)
        ts = []
        for it in range(3):
            xm, wm = x.clone().requires_grad_(), w.clone().requires_grad_()
            t0 = time.perf_counter()
            m.experts(xm, ids, wm).backward(G)
            ts.append(time.perf_counter() - t0)
        print(f"simulated ranks={P} rate {rate}: step {min(ts):.3f}s (one process, all ranks)", flush=True)
dist.barrier()
dist.destroy_process_group()
