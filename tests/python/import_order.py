"""`import lrmoe` and `import torch` in the order argv[1] names
(lrmoe-first or torch-first), then a patched block's forward and backward
and a route call. liblrmoe.so.2 loads no CUDA library of its own: after
`import lrmoe` alone none is mapped, and when the CUDA backend's module
loads (argv[2] = the frame and weights of a tiny step, or -), it uses the
libnccl/libcudart/libcublas torch already mapped, by soname. Prints one
line per check; exit 1 with the reason on the first failure."""
import sys

CUDA_LIBS = ("libcudart.so", "libcublas", "libnccl.so")


def mapped(names=CUDA_LIBS):
    with open("/proc/self/maps") as f:
        paths = {ln.split()[-1] for ln in f if "/" in ln}
    return sorted(p for p in paths if any(n in p.rsplit("/", 1)[-1] for n in names))


def fail(msg):
    sys.stderr.write(f"import_order: {msg}\n")
    sys.exit(1)


order, step = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "-"
if order == "lrmoe-first":
    import lrmoe
    if mapped():
        fail(f"import lrmoe mapped CUDA libraries: {mapped()}")
    print("ok import lrmoe maps no CUDA library")
    import torch
elif order == "torch-first":
    import torch
    import lrmoe
else:
    fail(f"order '{order}': expected lrmoe-first or torch-first")
print(f"ok {order}: import torch and import lrmoe")

import copy  # noqa: E402
import numpy as np  # noqa: E402
import lrmoe.torch as lt  # noqa: E402
import tiny  # noqa: E402

blk = tiny.block("qwen3_moe")
pat = copy.deepcopy(blk)
h = lt.patch(pat, rate=1.0, ranks=2, threads=1)
torch.manual_seed(3)
x = torch.randn(2, 10, tiny.D)
outs = []
for b in (blk, pat):
    xi = x.clone().requires_grad_(True)
    o = b(xi)
    o = o[0] if isinstance(o, tuple) else o
    o.sum().backward()
    outs.append((o.detach(), xi.grad))
err = max((a - b).abs().max().item() / b.abs().max().item() for a, b in zip(outs[1], outs[0]))
if not err < 2e-5 or h.stats[-1]["kept"] != h.stats[-1]["pairs"]:
    fail(f"patched block differs from the unpatched one (rel err {err})")
print(f"ok patched forward and backward equal torch's (rel err {err:.2e})")
r = lrmoe.route(np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32), k=2)
if r["topk_ids"].shape != (16, 2):
    fail(f"route: topk_ids {r['topk_ids'].shape}")
print("ok route")

if step != "-":
    frame, weights = step.split(",")
    before = mapped()
    try:
        lrmoe.forward(lrmoe.read(frame)[0], weights, backend="cuda")
        print("ok cuda forward ran")
    except lrmoe.Error as e:
        if "cannot load the CUDA module" in str(e):
            fail(f"cuda forward: {e}")
        print(f"ok cuda forward loaded the module ({e})")
    if not any("liblrmoe-cuda.so.1" in p for p in mapped(("liblrmoe-cuda",))):
        fail("the CUDA module is not mapped after a cuda call")
    after = mapped()
    for n in CUDA_LIBS:
        b, a = [p for p in before if n in p], [p for p in after if n in p]
        if b and a != b:
            fail(f"{n}: torch mapped {b}, the CUDA module added {sorted(set(a) - set(b))}")
    print("ok the CUDA module uses the CUDA libraries already mapped" if before else
          "ok the CUDA module loaded its own CUDA libraries (torch had mapped none)")
