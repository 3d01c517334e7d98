"""Benchmark of lrmoe.torch.patch (issue 14): one Qwen3-MoE-shaped block,
E=32 K=4 D=512 F=256, 4096 tokens, float32, ONE thread (torch and BLAS).
Rows: Hugging Face's eager block (its per-expert loop) and the patched
block at several (ranks, rate); time = forward + backward of the whole
block (router included, the same in both), best of REPS. For the patched
rows: the seconds inside liblrmoe calls (plan, exec forward, score, select,
pack, exec backward, wall time around each ctypes call) and the share of
the LRMoEExperts forward+backward spent outside them (marshalling: weight
layout copies, buffer allocation, dtype casts; target < 5%), in CPU time of
the calling thread (with one thread it does all the work, and other load
on a shared machine does not inflate it).
Usage: python3 tests/bench/inproc.py [TOKENS]   (env REPS, default 3)"""
import copy
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(TOP, "lib", "python"))
os.environ.setdefault("LRMOE_LIBRARY", os.path.join(TOP, "build", "liblrmoe.so.2"))

import torch  # noqa: E402
import transformers as tf  # noqa: E402
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock  # noqa: E402

import lrmoe.torch as lt  # noqa: E402

E, K, D, F = 32, 4, 512, 256
T = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
REPS = int(os.environ.get("REPS", "3"))
torch.set_num_threads(1)
tf.logging.set_verbosity_error()


def block():
    torch.manual_seed(0)
    cfg = tf.Qwen3MoeConfig(hidden_size=D, moe_intermediate_size=F, num_experts=E,
                            num_experts_per_tok=K, norm_topk_prob=True)
    b = Qwen3MoeSparseMoeBlock(cfg)
    with torch.no_grad():
        for p in b.parameters():
            p.copy_(torch.randn_like(p) * (1 / D ** 0.5))
    return b


def step(b, x, g):
    xx = x.clone().requires_grad_(True)
    t0 = time.perf_counter()
    out = b(xx)
    out.backward(g)
    return time.perf_counter() - t0


def best(b, x, g, h=None):
    ts, recs = [], []
    for _ in range(REPS):
        b.zero_grad(set_to_none=True)
        n0 = len(h.stats) if h else 0
        ts.append(step(b, x, g))
        if h:
            recs.append(h.stats[n0])
    i = min(range(REPS), key=ts.__getitem__)
    return ts[i], (recs[i] if h else None)


torch.manual_seed(1)
x = torch.randn(1, T, D)
g = torch.randn(1, T, D)
hf = block()
print(f"inproc: Qwen3-MoE block E={E} K={K} D={D} F={F} tokens={T} float32, 1 thread, "
      f"fwd+bwd best of {REPS}")
t_hf, _ = best(hf, x, g)
print(f"{'variant':<24} {'ranks':>5} {'rate':>5} {'time_s':>8} {'vs_hf':>6} {'lib_s':>8} "
      f"{'outside_lib':>11} {'kept':>6} {'rho':>6}")
print(f"{'hf eager':<24} {'-':>5} {'-':>5} {t_hf:8.3f} {1.0:6.2f} {'-':>8} {'-':>11} {'-':>6} {'-':>6}")
worst = 0.0
for ranks, rate in ((1, 1.0), (4, 1.0), (4, 0.8)):
    b = copy.deepcopy(hf)
    h = lt.patch(b, rate=rate, ranks=ranks, threads=1)
    t, r = best(b, x, g, h)
    lib_s = r["fwd_lib_seconds"] + r["bwd_lib_seconds"]
    fn_cpu = r["fwd_cpu_seconds"] + r["bwd_cpu_seconds"]
    out = (fn_cpu - r["fwd_lib_cpu_seconds"] - r["bwd_lib_cpu_seconds"]) / fn_cpu
    worst = max(worst, out)
    if ranks == 1:
        t1 = t
    print(f"{'lrmoe.torch.patch':<24} {ranks:>5} {rate:>5.2f} {t:8.3f} {t_hf / t:6.2f} "
          f"{lib_s:8.3f} {100 * out:10.1f}% {r['kept']:>6} {r['rho']:6.3f}")
print(f"verdict: patched block (1 rank, rate 1) {t_hf / t1:.2f}x HF eager's speed; "
      f"largest share outside liblrmoe {100 * worst:.1f}% "
      f"({'meets' if worst < 0.05 else 'misses'} the 5% target)")
