"""check-gpu: the CUDA backend in-process, through liblrmoe.so.2 and the
module liblrmoe-cuda.so.1 it loads on the first CUDA call (LRMOE_LIBRARY),
against lrmoe-exec's --backend cuda forward of the same stream (the same
kernels, linked into the tool): pair_rank exact, the rest within 1e-3 of
max|ref| (cuBLAS may pick other algorithms in another process).
    inproc.py IN WEIGHTS REF P BACKEND [torch]
With "torch", torch is imported first, so the module runs on the CUDA
libraries torch loaded (by soname)."""
import sys

if len(sys.argv) > 6 and sys.argv[6] == "torch":
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch is not installed: run without it")
import numpy as np  # noqa: E402
import lrmoe  # noqa: E402

src, weights, ref, P, backend = sys.argv[1:6]
got = lrmoe.forward(lrmoe.read(src)[0], weights, ranks=int(P), backend=backend)
want = lrmoe.read(ref)[0]
bad = 0
for n in ("output", "pair_rank", "pair_out", "phi_sqnorm", "saved_gate", "saved_up"):
    a, b = np.asarray(got[n], np.float64), np.asarray(want[n], np.float64)
    err = np.abs(a - b).max() / max(np.abs(b).max(), 1e-30) if a.shape == b.shape else np.inf
    ok = err == 0 if n == "pair_rank" else err <= 1e-3
    print(f"{'ok' if ok else 'FAIL'} {n}: rel err {err:.3g}")
    bad += not ok
with open("/proc/self/maps") as f:
    mods = sorted({ln.split()[-1] for ln in f if "liblrmoe-cuda" in ln})
print("module:", mods or "not mapped")
if backend == "cuda" and not mods:
    bad += 1
sys.exit(1 if bad else 0)
