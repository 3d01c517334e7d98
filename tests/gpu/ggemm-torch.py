#!/usr/bin/env python3
"""torch._grouped_mm on the rows bench-ggemm used (its --counts file), next
to one dense torch.mm of the same FLOPs: the forward FC1 form (X (N, D) x
W_e (D, F) per expert, row offsets) and the weight-gradient form (dG^T (F,
N) x X (N, D), K offsets), BF16 in, BF16 out (torch's default), median of
5 CUDA-event times after 2 warm-ups. Prints one line per shape and form
(or why torch refused that form: its layout and alignment rules are
torch's); exits 0, or 3 (with the reason) when there is no torch with CUDA
or no torch._grouped_mm, which is not a failure of lrmoe.

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

    refused = 0
    with open(sys.argv[1]) as f:
        for line in f:
            v = [int(x) for x in line.split()]
            T, E, cnt = v[0], v[1], v[2:]
            N = sum(cnt)
            offs = torch.tensor(cnt, device=dev).cumsum(0).to(torch.int32)
            # the layouts torch's own tests give _grouped_mm: A row-major,
            # B column-major per group (K contiguous in both)
            x = torch.randn(N, D, device=dev, dtype=torch.bfloat16)
            w = (torch.randn(E, F, D, device=dev, dtype=torch.bfloat16) * 0.05).transpose(-2, -1)
            dgt = torch.randn(F, N, device=dev, dtype=torch.bfloat16)   # dG^T, row-major
            xc = x.t().contiguous().t()                                  # X column-major
            w0 = w[0]
            flop = 2.0 * N * D * F
            forms = (("fc1", lambda: gm(x, w, offs=offs), lambda: torch.mm(x, w0)),
                     ("dW", lambda: gm(dgt, xc, offs=offs), lambda: torch.mm(dgt, xc)))
            for form, fg, fd in forms:
                try:
                    t = timed(fg)
                except Exception as e:  # noqa: BLE001 - torch's limits, reported, not lrmoe's failure
                    print(f"ggemm-torch: T={T} E={E} {form}: torch._grouped_mm refused: "
                          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}")
                    refused += 1
                    continue
                tdn = timed(fd)
                print(f"ggemm-torch: T={T} E={E} {form}: grouped {t:.3f} ms "
                      f"{flop / t * 1e-9:.1f} TFLOP/s, dense {tdn:.3f} ms, "
                      f"grouped/dense {tdn / t:.2f}")
    print(f"ggemm-torch: done ({refused} form(s) refused by torch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
