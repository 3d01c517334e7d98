#!/usr/bin/python3
"""PyTorch CPU baseline for tests/bench/exec.sh and cpu.sh: the same
per-expert SwiGLU forward and backward as lrmoe-exec, on the same tensors.

usage: exec_torch.py [--dtype f32|bf16] [--impl loop|grouped] [--clock wall|cpu]
                     [--warmup N] STREAM WEIGHTS THREADS FRAME...
--dtype: compute and store in F32 (default) or BF16 (weights, activations and
gradients BF16; PyTorch's matmuls accumulate in F32 inside oneDNN/MKL).
--impl loop (default): a Python loop over the experts; grouped: one
torch._grouped_mm per projection over the expert-sorted rows.
--clock cpu: time with the calling thread's CPU time (time.thread_time; exact
with THREADS=1, where PyTorch computes in the calling thread).
--warmup N: run each frame's layer forward and backward N times untimed
before the timed run (as lrmoe-exec --warmup N; default 0).
STREAM is a raw lrmoe-exec forward output (hidden, topk_ids, topk_weights,
grad_output, output); WEIGHTS a raw weights stream. For every FRAME index it
prints: frame fwd_s bwd_s relerr_output (against lrmoe-exec's output).
Forward: gather each expert's token rows, h_g = x W_gate^T, h_u = x W_up^T,
phi = silu(h_g) h_u, y = phi W_down^T, out.index_add_(alpha y). Backward:
autograd of sum(out * grad_output) w.r.t. hidden, the three weights and
topk_weights. Conversions BF16 -> F32 are outside the timed regions.
"""
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "helpers"))
from lrmoe_stream import decode_frame  # noqa: E402


def frames(path):
    buf = open(path, "rb").read()
    pos = 0
    while buf[pos:pos + 8] != b"LRMOEEND":
        t, a, d, pos = decode_frame(buf, pos)
        yield t, a, d


def tt(arr, dt, out=torch.float32):
    if dt == "BF16":
        v = torch.from_numpy(np.array(arr).view(np.int16)).view(torch.bfloat16)
    else:
        v = torch.from_numpy(np.array(arr, dtype=np.float32))
    return v.to(out)


def layer_loop(xg, Wg, Wu, Wd, order, counts, K, T, alf):
    """per-expert loop: gather, three matmuls, weighted index_add"""
    starts = np.cumsum([0] + counts)
    ys, toks = [], []
    for e in range(len(counts)):
        if not counts[e]:
            continue
        u = order[starts[e]:starts[e + 1]]
        tok = u // K
        xe = xg.index_select(0, tok)
        hg = xe @ Wg[e].t()
        hu = xe @ Wu[e].t()
        y = (torch.nn.functional.silu(hg) * hu) @ Wd[e].t()
        ys.append(alf.index_select(0, u)[:, None] * y)
        toks.append(tok)
    return torch.zeros(T, xg.shape[1], dtype=xg.dtype).index_add(0, torch.cat(toks), torch.cat(ys))


def layer_grouped(xg, Wg, Wu, Wd, order, counts, K, T, alf):
    """one torch._grouped_mm per projection over the expert-sorted rows"""
    offs = torch.tensor(np.cumsum(counts), dtype=torch.int32)
    tok = order // K
    xs = xg.index_select(0, tok)
    hg = torch._grouped_mm(xs, Wg.transpose(-2, -1), offs=offs)
    hu = torch._grouped_mm(xs, Wu.transpose(-2, -1), offs=offs)
    y = torch._grouped_mm(torch.nn.functional.silu(hg) * hu, Wd.transpose(-2, -1), offs=offs)
    y = alf.index_select(0, order)[:, None] * y
    return torch.zeros(T, xg.shape[1], dtype=xg.dtype).index_add(0, tok, y)


def main():
    args = sys.argv[1:]
    opt = {"--dtype": "f32", "--impl": "loop", "--clock": "wall", "--warmup": "0"}
    while args and args[0] in opt:
        opt[args[0]] = args[1]
        args = args[2:]
    stream, weights, threads = args[0], args[1], int(args[2])
    want = set(int(x) for x in args[3:])
    cdt = torch.bfloat16 if opt["--dtype"] == "bf16" else torch.float32
    layer = layer_grouped if opt["--impl"] == "grouped" else layer_loop
    clock = time.thread_time if opt["--clock"] == "cpu" else time.perf_counter
    torch.set_num_threads(max(1, threads))
    warm = int(opt["--warmup"])
    t, _, d = next(frames(weights))
    W = [tt(t[n], d[n], cdt) for n in ("w_gate", "w_up", "w_down")]
    E = W[0].shape[0]
    for i, (t, a, d) in enumerate(frames(stream)):
        if i not in want:
            continue
        x = tt(t["hidden"], d["hidden"], cdt)
        g = tt(t["grad_output"], d["grad_output"], cdt)
        ids = torch.from_numpy(np.array(t["topk_ids"], dtype=np.int64))
        alpha = torch.from_numpy(np.array(t["topk_weights"], dtype=np.float32)).to(cdt)
        ref = tt(t["output"], d["output"])
        T, K = ids.shape
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=E).tolist()
        def leaves():
            if layer is layer_loop:
                # per-expert leaves (indexing one big [E,F,D] leaf would make
                # autograd write a full-size gradient per expert)
                ws = [[w[e].clone().requires_grad_(bool(counts[e])) for e in range(E)] for w in W]
            else:
                ws = [w.clone().requires_grad_(True) for w in W]
            return ws, x.clone().requires_grad_(True), alpha.clone().requires_grad_(True)
        for _ in range(warm):  # untimed, on leaves of their own
            ws, xg, al = leaves()
            (layer(xg, ws[0], ws[1], ws[2], order, counts, K, T, al.reshape(-1)) * g).sum().backward()
        ws, xg, al = leaves()
        t0 = clock()
        out = layer(xg, ws[0], ws[1], ws[2], order, counts, K, T, al.reshape(-1))
        t1 = clock()
        (out * g).sum().backward()
        t2 = clock()
        with torch.no_grad():
            o = out.float()
            rel = float((o - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
        print(f"{i}\t{t1 - t0:.6f}\t{t2 - t1:.6f}\t{rel:.3e}", flush=True)


if __name__ == "__main__":
    main()
