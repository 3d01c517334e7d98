#!/usr/bin/env python3
"""torch._grouped_mm on the rows bench-ggemm used (its --counts file), next
to one dense torch.mm of the same FLOPs: the forward FC1 form (X (N, D) x
W_e (D, F) per expert, row offsets) and the weight-gradient form (dG^T (F,
N) x X (N, D), K offsets), BF16 in, BF16 out (torch's default), median of
5 CUDA-event times after 2 warm-ups. Prints one line per shape and form;
exits 0, or 3 (with the reason) when there is no torch with CUDA or no
torch._grouped_mm, which is not a failure of lrmoe.

    python3 tests/gpu/ggemm-torch.py COUNTS
"""
import sys


def main():
    if len(sys.argv) != 2:
        print("usage: ggemm-torch.py COUNTS", file=sys.stderr)
        return 2
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means no torch here
        print(f"ggemm-torch: NOT run: no torch ({e})")
        return 3
    if not torch.cuda.is_available():
        print(f"ggemm-torch: NOT run: torch {torch.__version__} without a CUDA device")
        return 3
    gm = getattr(torch, "_grouped_mm", None)
    if gm is None:
        print(f"ggemm-torch: NOT run: torch {torch.__version__} has no torch._grouped_mm")
        return 3
    D, F = 2048, 768
    dev = torch.device("cuda")
    print(f"ggemm-torch: torch {torch.__version__}, {torch.cuda.get_device_name(0)}")

    def timed(fn):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(2):
            fn()
        ts = []
        for _ in range(5):
            s.record()
            fn()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e))
        return sorted(ts)[2]

    with open(sys.argv[1]) as f:
        for line in f:
            v = [int(x) for x in line.split()]
            T, E, cnt = v[0], v[1], v[2:]
            N = sum(cnt)
            offs = torch.tensor(cnt, device=dev).cumsum(0).to(torch.int32)
            x = torch.randn(N, D, device=dev, dtype=torch.bfloat16)
            w = torch.randn(E, D, F, device=dev, dtype=torch.bfloat16) * 0.05
            dg = torch.randn(N, F, device=dev, dtype=torch.bfloat16)
            w0 = w[0]
            flop = 2.0 * N * D * F
            try:
                tg = timed(lambda: gm(x, w, offs=offs))
                tw = timed(lambda: gm(dg.t(), x, offs=offs))
            except Exception as e:  # noqa: BLE001 - report the reason, keep the step going
                print(f"ggemm-torch: T={T} E={E}: torch._grouped_mm failed: {e}")
                return 1
            td = timed(lambda: torch.mm(x, w0))
            tdw = timed(lambda: torch.mm(dg.t(), x))
            for form, t, tdn in (("fc1", tg, td), ("dW", tw, tdw)):
                print(f"ggemm-torch: T={T} E={E} {form}: grouped {t:.3f} ms "
                      f"{flop / t * 1e-9:.1f} TFLOP/s, dense {tdn:.3f} ms, "
                      f"grouped/dense {tdn / t:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
