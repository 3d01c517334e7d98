"""lrmoe.torch on CUDA tensors against the CPU path: a patched tiny
Qwen3-MoE model (2 MoE layers, E=8, K=2, D=32, F=16, 24 tokens), the same
weights and batch on the device and on the CPU, two training steps (SGD
between them: the device path must see the changed weights, i.e. call
lrmoe_exec_cuda_weights_changed), for rate 1 and 0.7 and ranks 1 and 2:
the loss, the logits and every parameter's gradient of both steps within
TOL of max|cpu| (relative to the largest magnitude of each tensor).
    torch_cuda.py cuda [TOL]   the GPU (tests/gpu/device-check.sh: 3e-2)
    torch_cuda.py fake [TOL]   CPU tensors through the CUDA path on the fake
                               CUDA module (LRMOE_CUDA_MODULE, built by
                               tests/gpu/build-fake-module.sh;
                               LRMOE_TORCH_FAKE_DEVICE=1, set here)
Prints one line per comparison (with the host bytes per layer call from
the stats), FAIL for a failed one (exit 1). Exit 3: not run (no CUDA
device in cuda mode, or torch/transformers missing)."""
import copy
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
try:
    import torch  # noqa: E402
    import tiny  # noqa: E402  (sets LRMOE_LIBRARY, imports transformers)
except ImportError as e:
    print(f"torch_cuda: NOT RUN ({e})")
    sys.exit(3)
mode = sys.argv[1] if len(sys.argv) > 1 else "cuda"
tol = float(sys.argv[2]) if len(sys.argv) > 2 else 1e-3
if mode == "cuda":
    # before liblrmoe is loaded: without a device nothing else is looked at
    # (a sanitized build's library cannot load into python3, tests/cuda.bats)
    if not torch.cuda.is_available():
        print("torch_cuda: NOT RUN (no CUDA device)")
        sys.exit(3)
    dev = torch.device("cuda", 0)
else:
    dev = torch.device("cpu")
import lrmoe.torch as lt  # noqa: E402
T = 24


def model():
    torch.manual_seed(1)
    m = tiny.MODELS["qwen3_moe"](tiny.config("qwen3_moe"))
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.2)
    return m


def run(m, device, fake, rate, P):
    """Two steps of the patched model: [(loss, logits, {name: grad})]."""
    if fake:
        os.environ[lt.FAKE_DEVICE_ENV] = "1"
    else:
        os.environ.pop(lt.FAKE_DEVICE_ENV, None)
    m = m.to(device)
    h = lt.patch(m, rate=rate, ranks=P, seed=7)
    os.environ.pop(lt.FAKE_DEVICE_ENV, None)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 64, (1, T), generator=g).to(device)
    got = []
    for step in range(2):
        opt.zero_grad()
        out = m(input_ids=ids, labels=ids)
        out.loss.backward()
        got.append((out.loss.detach().cpu(), out.logits.detach().cpu(),
                    {n: p.grad.detach().cpu().clone() for n, p in m.named_parameters()
                     if p.grad is not None}))
        opt.step()
    stats = list(h.stats)
    h.unpatch()
    return got, stats


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / max(float(b.abs().max()), 1e-30))


def block_run(device, fake, rate, P, dtype):
    """One patched Qwen3-MoE block, one forward and backward with a fixed
    output gradient: (out, grads of x, routing weights, parameters), the
    keep masks and the stats."""
    if fake:
        os.environ[lt.FAKE_DEVICE_ENV] = "1"
    b = tiny.block("qwen3_moe", seed=0).to(device, dtype)
    h = lt.patch(b, rate=rate, ranks=P, seed=7, keep_masks=True)
    os.environ.pop(lt.FAKE_DEVICE_ENV, None)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(T, 32, generator=g).to(device, dtype).requires_grad_()
    ids = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(T)]).to(device)
    w = torch.rand(T, 2, generator=g).to(device, dtype).requires_grad_()
    gout = torch.randn(T, 32, generator=g).to(device, dtype)
    out = b.experts(x, ids, w)
    out.backward(gout)
    r = {"out": out, "grad x": x.grad, "grad topk_weights": w.grad}
    r.update({f"grad {n}": p.grad for n, p in b.experts.named_parameters()})
    r = {k: v.detach().cpu() for k, v in r.items()}
    stats = list(h.stats)
    h.unpatch()
    return r, stats


def report(what, errs, extra=""):
    global bad, worst
    e = max(errs.values())
    worst = max(worst, e)
    n = max(errs, key=errs.get)
    ok = e <= tol
    bad += not ok
    print(f"{'ok' if ok else 'FAIL'} {what}: {len(errs)} tensors, max rel err {e:.3g} ({n})"
          f"{extra}")


bad = worst = 0
# the whole model, rate 1 (continuous in the weights: no selection to flip)
for P in (1, 2):
    base = model()
    ref, rs = run(copy.deepcopy(base), torch.device("cpu"), False, 1.0, P)
    got, gs = run(copy.deepcopy(base), dev, mode == "fake", 1.0, P)
    if not gs or "fwd_d2h_bytes" not in gs[0]:
        print(f"FAIL model P={P}: the stats show no device call")
        bad += 1
        continue
    errs = {}
    for s, ((l1, o1, g1), (l2, o2, g2)) in enumerate(zip(got, ref)):
        errs[f"step{s} loss"] = rel(l1, l2)
        errs[f"step{s} logits"] = rel(o1, o2)
        if set(g1) != set(g2):
            errs[f"step{s} grad set"] = float("inf")
        for n in g2:
            if n in g1:
                errs[f"step{s} grad {n}"] = rel(g1[n], g2[n])
    report(f"model float32 rate=1 P={P}, 2 SGD steps", errs,
           f"; host bytes per layer call: fwd {gs[0]['fwd_d2h_bytes']} d2h, bwd "
           f"{gs[0]['bwd_d2h_bytes']} d2h + {gs[0]['bwd_h2d_bytes']} h2d")
# one block, rate < 1 too: the same pairs kept (keep masks equal), the
# same gradients within tol
for dtype in (torch.float32, torch.bfloat16):
    for rate in (1.0, 0.7):
        for P in (1, 2):
            ref, rs = block_run(torch.device("cpu"), False, rate, P, dtype)
            got, gs = block_run(dev, mode == "fake", rate, P, dtype)
            what = f"block {str(dtype)[6:]} rate={rate} P={P}"
            if "fwd_d2h_bytes" not in gs[0]:
                print(f"FAIL {what}: the stats show no device call")
                bad += 1
                continue
            if not (gs[0]["kept"] == rs[0]["kept"] and
                    (gs[0]["keep"] == rs[0]["keep"]).all()):
                print(f"FAIL {what}: other pairs kept ({gs[0]['kept']} vs {rs[0]['kept']})")
                bad += 1
            report(what, {k: rel(got[k], ref[k]) for k in ref}, f"; kept {gs[0]['kept']}")
print(f"torch_cuda ({mode}): {'FAIL' if bad else 'PASS'} (max rel err {worst:.3g}, tol {tol:g})")
sys.exit(1 if bad else 0)
