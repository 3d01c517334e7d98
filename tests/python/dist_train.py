"""README's "Training with torchrun" loop, as written there, under torchrun
(gloo, CPU): a tiny Qwen3-MoE trained STEPS AdamW steps with
patch(group=WORLD, shard=True), each rank its own sequences, the dense
gradients all-reduced (summed) and every rank's loss divided by the global
token count. Rank 0 also trains the same model in one process
(patch(ranks=P) on the whole batch) and compares the global loss of every
step: equal to 1e-5 (the all-reduce sums partial sums in another order than
one process does, so not bit for bit). Prints "train: all ok".

  torchrun --standalone --nproc-per-node P dist_train.py [STEPS]
"""
import copy
import datetime
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as Fn

import tiny
import lrmoe.dist
import lrmoe.torch

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 6
S, V = 16, 64


def batches(rank, P):
    """Every step's (x, y) of all P ranks: P sequences of S bytes; rank's row."""
    for step in range(STEPS):
        g = torch.Generator().manual_seed(500 + step)
        ids = torch.randint(0, V, (P, S + 1), generator=g)
        yield ids[:, :-1], ids[:, 1:]


# ---- the README's loop (rank r: rows [r*T/P, (r+1)*T/P) of the T tokens)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
P, r = dist.get_world_size(), dist.get_rank()
torch.set_num_threads(1)
model = tiny.model("qwen3_moe", seed=0)     # the same initial model on every rank
ref = copy.deepcopy(model)
h = lrmoe.torch.patch(model, rate=0.8, group=dist.group.WORLD, shard=True)
dense = [p for n, p in model.named_parameters() if ".experts." not in n]
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)  # after patch (shard=True)
losses = []
for x, y in batches(r, P):
    x, y = x[r:r + 1], y[r:r + 1]             # this rank's sequences
    n_global = P * y.numel()                  # tokens of all ranks
    loss = Fn.cross_entropy(model(input_ids=x).logits.flatten(0, 1), y.flatten(),
                            reduction="sum") / n_global
    loss.backward()
    for p in dense:                           # data parallel: summed over the ranks
        if p.grad is not None:
            dist.all_reduce(p.grad)
    opt.step()
    opt.zero_grad()
    t = loss.detach().clone()
    dist.all_reduce(t)
    losses.append(t.item())
# ---- end of the README's loop

ok = True
if r == 0:  # one process: the simulated ranks on the whole batch
    lrmoe.torch.patch(ref, rate=0.8, ranks=P)
    opt = torch.optim.AdamW(ref.parameters(), lr=3e-3)
    for step, (x, y) in enumerate(batches(0, P)):
        loss = Fn.cross_entropy(ref(input_ids=x).logits.flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        d = abs(loss.item() - losses[step])
        print(f"train: step {step} loss {losses[step]:.7f} one process {loss.item():.7f}",
              flush=True)
        if not d <= 1e-5 * abs(loss.item()):
            print(f"train: FAIL step {step}: |diff| {d}", flush=True)
            ok = False
lrmoe.dist.shutdown()  # barrier; the gloo threads end before Python exits
if r == 0 and ok:
    print("train: all ok", flush=True)
sys.exit(0 if ok else 1)
