"""Per-step cost of each weight layout of lrmoe.torch.register (E=32, K=4,
D=512, F=256, T tokens (argv[1], default 2048), ranks=2, rate 1, 1 thread):
the step time of a patched route block and the time to get the ops' (E,2F,D)
and (E,D,F) weights: a view where lrmoe adopted the float32 parameters, else
the copy made each step. Run: LRMOE_LIBRARY=build/liblrmoe.so.2
OPENBLAS_NUM_THREADS=1 python3 tests/helpers/layout_cost.py [T]"""
import os, sys, time, statistics, torch
from torch import nn
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "lib", "python"))
import lrmoe.torch as lt
torch.set_num_threads(1)
E, K, D, F, T = 32, 4, 512, 256, int(sys.argv[1]) if len(sys.argv) > 1 else 2048
SHAPES = {"fused": {"gate_up": (E, 2*F, D), "down": (E, D, F)},
          "fused_t": {"gate_up": (E, D, 2*F), "down": (E, F, D)},
          "separate": {"w1": (E, F, D), "w3": (E, F, D), "w2": (E, D, F)},
          "separate_t": {"w1": (E, D, F), "w3": (E, D, F), "w2": (E, F, D)},
          "per_expert": {"gate_proj": (F, D), "up_proj": (F, D), "down_proj": (D, F)},
          "per_expert_fused": {"linear_fc1": (2*F, D), "linear_fc2": (D, F)}}
class One(nn.Module):
    def __init__(s, shapes):
        super().__init__()
        for n, sh in shapes.items():
            setattr(s, n, nn.Linear(sh[1], sh[0], bias=False))
def Ex(lay):
    if lay == "per_expert":
        return nn.ModuleList(One(SHAPES[lay]) for _ in range(E))
    if lay == "per_expert_fused":
        m = nn.Module()
        m.local_experts = nn.ModuleList(One(SHAPES[lay]) for _ in range(E))
        return m
    m = nn.Module()
    for n, sh in SHAPES[lay].items():
        setattr(m, n, nn.Parameter(torch.randn(sh) * 0.05))
    return m
def make(lay):
    cls = type(f"Blk_{lay}", (nn.Module,), {})
    def init(s):
        nn.Module.__init__(s); s.router = nn.Linear(D, E, bias=False); s.experts = Ex(lay)
    cls.__init__ = init
    w = {"gate_up": "gate_up", "down": "down"} if lay.startswith("fused") else None
    if lay.startswith("per_expert"):
        w = None
    lt.register(cls, layout=lay, weights=w, router="router", route="softmax", k=K, renorm=True)
    return cls()
res = {}
for dt in (torch.float32, torch.bfloat16):
    for lay in SHAPES:
        torch.manual_seed(0)
        blk = make(lay).to(dt)
        h = lt.patch(blk, rate=1.0, ranks=2, threads=1)
        x = torch.randn(T, D, dtype=dt, requires_grad=True)
        ts = []
        for i in range(8):
            t0 = time.perf_counter()
            blk(x).float().sum().backward()
            ts.append(time.perf_counter() - t0)
        ad = h.layers[0].adopted
        step = statistics.median(ts[1:])
        # the copy the non-packed path makes per step: [gate; up] joined
        ex = blk.experts
        with torch.no_grad():
            t0 = time.perf_counter()
            for i in range(20):
                gu, dn = h.blocks[0].op_weights()
                if not ad: gu = gu.contiguous(); dn = dn.contiguous()
            cp = (time.perf_counter() - t0) / 20
        print(f"{str(dt)[6:]:8s} {lay:10s} adopted={int(ad)} step_s={step:.4f} "
              f"weights_view_or_copy_s={cp:.5f} share={cp/step:.3f}", flush=True)
        h.unpatch()
