"""The backward's pair scores on the device (lrmoe_exec_cuda_score, the
CUDA path of lrmoe.torch) against liblrmoe's host scores
(lrmoe_score_pairs_dt), on the fake CUDA module (its kernels are their CPU
references, so the two must be equal bit for bit) or on a GPU (within a
relative TOL: the kernel's double sums are ordered otherwise):
  1. direct: lrmoe_exec_cuda_score on device arrays, metrics lrm,
     gradnorm and absgrad (the last two with NULL alpha and phi_sqnorm: not
     read), g F32 and BF16, D 32 and 37 (not a multiple of 8), T 1 and 24
     (and 0), scores spanning magnitudes, compared with the host scores;
  2. through a patched Qwen3-MoE block at rate 0.7 (P 2, select topk and
     sample): for every metric the CUDA path keeps the pairs the CPU path
     keeps, and the stats say what crossed per backward: to the host the
     routing (ids, alpha) plus the scores T*K*4 for lrm, gradnorm and
     absgrad (g stays on the device), nothing else for random and uniform;
     to the device the kept rows' pair and alpha only.
    score_device.py fake [TOL]   CPU tensors as "device memory" of the fake
                                 module (LRMOE_CUDA_MODULE), TOL 0: bitwise
    score_device.py cuda [TOL]   a GPU (default TOL 1e-6)
Prints one line per check, FAIL for a failed one (exit 1); exit 3: not run."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
try:
    import torch  # noqa: E402
    import tiny  # noqa: E402
except ImportError as e:
    print(f"score_device: NOT RUN ({e})")
    sys.exit(3)
mode = sys.argv[1] if len(sys.argv) > 1 else "cuda"
tol = float(sys.argv[2]) if len(sys.argv) > 2 else (0.0 if mode == "fake" else 1e-6)
if mode == "cuda":
    if not torch.cuda.is_available():
        print("score_device: NOT RUN (no CUDA device)")
        sys.exit(3)
    dev = torch.device("cuda", 0)
else:
    dev = torch.device("cpu")
import lrmoe  # noqa: E402
import lrmoe.torch as lt  # noqa: E402
from lrmoe import _lib  # noqa: E402

T, K = 24, 2
bad = 0


def say(ok, what):
    global bad
    bad += not ok
    print(f"{'ok' if ok else 'FAIL'} {what}")


def block_run(device, fake, rate, metric, select):
    """One patched block, one forward and backward: keep mask and stats."""
    if fake:
        os.environ[lt.FAKE_DEVICE_ENV] = "1"
    b = tiny.block("qwen3_moe", seed=0).to(device)
    h = lt.patch(b, rate=rate, ranks=2, seed=7, keep_masks=True, metric=metric, select=select)
    os.environ.pop(lt.FAKE_DEVICE_ENV, None)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(T, 32, generator=g).to(device).requires_grad_()
    ids = torch.stack([torch.randperm(8, generator=g)[:K] for _ in range(T)]).to(device)
    w = torch.rand(T, K, generator=g).to(device).requires_grad_()
    out = b.experts(x, ids, w)
    out.backward(torch.randn(T, 32, generator=g).to(device))
    return b, h, list(h.stats)


# 1. direct, on the executor of a block that ran on the device
b, h, _ = block_run(dev, mode == "fake", 0.7, "lrm", "topk")
layer = h.layers[0]
cu = layer.cuda
if cu is None or cu.x is None:
    print("FAIL the block's CUDA executor was not made")
    sys.exit(1)
metrics = {"lrm": 0, "gradnorm": 1, "absgrad": 2}
gen = torch.Generator().manual_seed(11)
worst = 0.0
for metric, m in metrics.items():
    for gdt in (torch.float32, torch.bfloat16):
        for Tn, D in ((24, 32), (1, 37), (24, 37), (0, 32)):
            # magnitudes over many binades, so rounding matters
            g = (torch.randn(Tn, D, generator=gen) *
                 torch.exp2(torch.randint(-20, 20, (Tn, 1), generator=gen).float())).to(gdt)
            alpha = torch.rand(Tn, K, generator=gen)
            phi = torch.rand(Tn, K, generator=gen) * 100
            ref = torch.empty(Tn, K)
            if Tn:  # (T=0: nothing to score; the device call must just succeed)
                lt.check(lt.lib.lrmoe_score_pairs_dt(m, Tn, K, D, _lib.DT[lt._TORCH_DT[gdt]],
                                                     g.data_ptr(), alpha.data_ptr(),
                                                     phi.data_ptr(), 0, ref.data_ptr()), "host")
            got = torch.full((Tn, K), float("nan"))
            gd = g.to(dev)
            # alpha and ||phi||^2 are read by lrm only: NULL for the others
            ad, pd = (alpha.to(dev), phi.to(dev)) if m == 0 else (None, None)
            lt.check(lt.lib.lrmoe_exec_cuda_score(cu.x, m, Tn, K, D,
                                                     _lib.DT[lt._TORCH_DT[gdt]], gd.data_ptr(),
                                                     ad.data_ptr() if m == 0 else None,
                                                     pd.data_ptr() if m == 0 else None,
                                                     got.data_ptr()), "device")
            if tol == 0:
                ok = torch.equal(got.view(torch.int32), ref.view(torch.int32))
                err = 0.0 if ok else float("inf")
            else:
                err = float(((got.double() - ref.double()).abs() /
                             ref.double().abs().clamp_min(1e-300)).max()) if Tn else 0.0
                ok = err <= tol
            worst = max(worst, err)
            say(ok, f"score {metric} g {str(gdt)[6:]} T={Tn} D={D}: device "
                    f"{'== host bitwise' if tol == 0 else f'rel err {err:.3g}'}")
# a metric without a device kernel, and a NULL g: one error each
for m, gp, want in ((3, 1, "metric random has no device kernel"),
                    (0, 0, "pair_score: a NULL array")):
    try:
        z = torch.zeros(4, 32, device=dev)
        a = torch.zeros(4, K, device=dev)
        out = torch.empty(4, K)
        lt.check(lt.lib.lrmoe_exec_cuda_score(cu.x, m, 4, K, 32, _lib.DT["F32"],
                                                 z.data_ptr() if gp else None, a.data_ptr(),
                                                 a.data_ptr(), out.data_ptr()), "device")
        say(False, f"'{want}' not raised")
    except lrmoe.Error as e:
        say(want in str(e), f"refused: {e}")
h.unpatch()

# 2. the patched block: same keep masks as the CPU path, bytes per backward
route = T * K * 8 + T * K * 4  # int64 ids + F32 alpha
cross = {"lrm": T * K * 4, "gradnorm": T * K * 4, "absgrad": T * K * 4,
         "random": 0, "uniform": 0}
for metric in ("lrm", "gradnorm", "absgrad", "random", "uniform"):
    for select in ("topk", "sample"):
        _, hr, rs = block_run(torch.device("cpu"), False, 0.7, metric, select)
        hr.unpatch()
        _, hg, gs = block_run(dev, mode == "fake", 0.7, metric, select)
        hg.unpatch()
        same = gs[0]["kept"] == rs[0]["kept"] and (gs[0]["keep"] == rs[0]["keep"]).all()
        by, up = gs[0].get("bwd_d2h_bytes"), gs[0].get("bwd_h2d_bytes")
        # to the device: the kept rows' pair and alpha (nothing for the scores)
        want_up = gs[0]["kept"] * 12
        say(bool(same) and by == route + cross[metric] and up == want_up,
            f"block metric={metric} select={select}: kept {gs[0]['kept']} (cpu "
            f"{rs[0]['kept']}, masks {'equal' if same else 'differ'}), bwd {by} B d2h "
            f"(want {route} routing + {cross[metric]}), {up} B h2d (want {want_up})")
print(f"score_device ({mode}): {'FAIL' if bad else 'PASS'}")
sys.exit(1 if bad else 0)
