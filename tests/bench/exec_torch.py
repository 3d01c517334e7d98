#!/usr/bin/python3
"""PyTorch CPU baseline for tests/bench/exec.sh: the same per-expert SwiGLU
forward and backward as lrmoe-exec, on the same tensors (F32 compute).

usage: exec_torch.py STREAM WEIGHTS THREADS FRAME...
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


def tt(arr, dt):
    if dt == "BF16":
        return torch.from_numpy(np.array(arr).view(np.int16)).view(torch.bfloat16).float()
    return torch.from_numpy(np.array(arr, dtype=np.float32))


def main():
    stream, weights, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    want = set(int(x) for x in sys.argv[4:])
    torch.set_num_threads(max(1, threads))
    t, _, d = next(frames(weights))
    Wg, Wu, Wd = (tt(t[n], d[n]) for n in ("w_gate", "w_up", "w_down"))
    E = Wg.shape[0]
    for i, (t, a, d) in enumerate(frames(stream)):
        if i not in want:
            continue
        x = tt(t["hidden"], d["hidden"])
        g = tt(t["grad_output"], d["grad_output"])
        ids = torch.from_numpy(np.array(t["topk_ids"], dtype=np.int64))
        alpha = torch.from_numpy(np.array(t["topk_weights"], dtype=np.float32))
        ref = tt(t["output"], d["output"])
        T, K = ids.shape
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=E).tolist()
        # per-expert leaves (indexing one big [E,F,D] leaf would make
        # autograd write a full-size gradient per expert)
        used = [e for e in range(E) if counts[e]]
        wg = {e: Wg[e].clone().requires_grad_(True) for e in used}
        wu = {e: Wu[e].clone().requires_grad_(True) for e in used}
        wd = {e: Wd[e].clone().requires_grad_(True) for e in used}
        xg = x.clone().requires_grad_(True)
        al = alpha.clone().requires_grad_(True)
        starts = np.cumsum([0] + counts)
        t0 = time.perf_counter()
        alf = al.reshape(-1)
        ys, toks = [], []
        for e in used:
            u = order[starts[e]:starts[e + 1]]
            tok = u // K
            xe = xg.index_select(0, tok)
            hg = xe @ wg[e].t()
            hu = xe @ wu[e].t()
            y = (torch.nn.functional.silu(hg) * hu) @ wd[e].t()
            ys.append(alf.index_select(0, u)[:, None] * y)
            toks.append(tok)
        out = torch.zeros(T, x.shape[1]).index_add(0, torch.cat(toks), torch.cat(ys))
        t1 = time.perf_counter()
        (out * g).sum().backward()
        t2 = time.perf_counter()
        with torch.no_grad():
            rel = float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
        print(f"{i}\t{t1 - t0:.6f}\t{t2 - t1:.6f}\t{rel:.3e}", flush=True)


if __name__ == "__main__":
    main()
