"""Issue 36 item 1 (and the Python parts of item 2): every call that hands
liblrmoe a pointer or a number checks it first, and raises lrmoe.Error
naming the argument; a closed object raises. Each case runs in a child
interpreter, so a crash (the bugs these pin were segfaults) fails the test
instead of killing the runner."""
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.join(TOP, "bin")
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [os.path.join(TOP, "lib", "python"), os.path.dirname(os.path.abspath(__file__))]),
    LRMOE_LIBRARY=os.environ.get("LRMOE_LIBRARY",
                                 os.path.join(TOP, "build", "liblrmoe.so.2")))

try:
    import torch  # noqa: F401
    import transformers  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

PRELUDE = """
import numpy as np, lrmoe
def refused(fn, *words):
    try:
        fn()
    except lrmoe.Error as e:
        m = str(e)
        assert all(w in m for w in words), (m, words)
        print("REFUSED", m)
        return
    raise SystemExit("accepted: " + repr(words))
"""


def child(code, timeout=120):
    r = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=ENV,
                       capture_output=True, text=True, timeout=timeout)
    return r


class Harden(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.d = cls.tmp.name
        subprocess.run(f"{BIN}/lrmoe-gen --tokens 64 --experts 8 --topk 2 --hidden 16 "
                       f"--ffn 8 --seed 3 --weights {d}/w.lrm | {BIN}/lrmoe-route -k 2 "
                       f"-o {d}/r.lrm", shell=True, check=True)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def ok(self, code):
        r = child(code)
        self.assertEqual(r.returncode, 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r.stdout

    def test_route_dtype_against_itemsize(self):
        out = self.ok("""
            for dt, a in (("F64", np.zeros((1000, 64), np.float32)),
                          ("F64", np.zeros((1000, 64), np.float16)),
                          ("F32", np.zeros((1000, 64), np.float16)),
                          ("BF16", np.zeros((1000, 64), np.float32))):
                refused(lambda: lrmoe.route(a, k=2, dtype=dt), "router_logits", "dtype")
            refused(lambda: lrmoe.route(np.zeros((4, 8), np.float32), dtype="I32"), "dtype")
            # the right pairing still routes
            f = lrmoe.route(np.zeros((4, 8), np.float64), k=2, dtype="F64")
            assert f["topk_ids"].shape == (4, 2)
            print("ROUTED")
        """)
        self.assertEqual(out.count("REFUSED"), 5)
        self.assertIn("ROUTED", out)

    def test_numbers_are_range_checked(self):
        self.ok(f"""
            lg = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
            refused(lambda: lrmoe.route(lg, k=2**32 + 2), "k", "out of range")
            refused(lambda: lrmoe.route(lg, k=2.5), "k", "not an integer")
            refused(lambda: lrmoe.route(lg, k=2, threads=-2**40), "threads")
            refused(lambda: lrmoe.capacity(10, 2**32 + 2, 8, 1.0), "K", "out of range")
            f = lrmoe.read("{self.d}/r.lrm")[0]
            refused(lambda: lrmoe.forward(f, "{self.d}/w.lrm", ranks=2**32 + 2), "ranks")
            refused(lambda: lrmoe.Exec("{self.d}/w.lrm", threads=2**31), "threads")
            g = np.ones((64, 16), np.float32)
            refused(lambda: lrmoe.score(f["topk_ids"], f["topk_weights"], g, drop=float("nan")),
                    "drop")
            refused(lambda: lrmoe.score(f["topk_ids"], f["topk_weights"], g, drop=101), "drop")
            refused(lambda: lrmoe.score(f["topk_ids"], f["topk_weights"], g, drop=10,
                                        seed=-1), "seed")
            refused(lambda: lrmoe.Writer("{self.d}/x.lrm", level=2**32 + 3), "level")
        """)

    def test_nul_in_names(self):
        self.ok(f"""
            w = lrmoe.Writer("{self.d}/nul.lrm")
            refused(lambda: w.write({{"a\\0b": np.zeros(2), "a\\0c": np.ones(2)}}), "NUL")
            refused(lambda: w.write({{"a": np.zeros(2)}}, attrs={{"k\\0x": "v"}}), "NUL")
            refused(lambda: w.write({{"a": np.zeros(2)}}, attrs={{"k": "v\\0w"}}), "NUL")
            w.abort()
            refused(lambda: lrmoe.Reader("{self.d}/r.lrm\\0junk"), "path", "NUL")
            refused(lambda: lrmoe.Planner(ranks=2, planner="lrmoe\\0x"), "NUL")
        """)

    def test_closed_objects_raise(self):
        self.ok(f"""
            f = lrmoe.read("{self.d}/r.lrm")[0]
            x = lrmoe.Exec("{self.d}/w.lrm")
            x.run(f)
            x.close()
            refused(lambda: x.run(f), "closed")
            p = lrmoe.Planner(ranks=2, ffn=8)
            p.run(f["expert_load"])
            p.__del__()
            refused(lambda: p.run(f["expert_load"]), "closed")
            refused(lambda: p.set("rate", 0.5), "closed")
            refused(lambda: p.reset(), "closed")
            r = lrmoe.Reader("{self.d}/r.lrm"); r.close()
            assert list(r) == []
            w = lrmoe.Writer("{self.d}/c.lrm"); w.close()
            refused(lambda: w.write({{"a": np.zeros(1)}}), "closed")
        """)

    def test_counts_of_zero_refused(self):
        # a quota of 0 experts, a bwd_alloc or placement of 0 ranks or experts:
        # these were read past their end (found by fuzz_binding.py under ASan)
        out = self.ok(f"""
            f = lrmoe.read("{self.d}/r.lrm")[0]
            ids, tw = f["topk_ids"], f["topk_weights"]
            T, K = ids.shape
            keep = np.ones((T, K), np.uint8)
            g, h = np.ones((T, 16), np.float32), np.ones((T, 16), np.float32)
            sg = su = np.ones((T, K, 8), np.float32)
            i64 = lambda *s: np.zeros(s, np.int64)
            pk = lambda **kw: lrmoe.pack(keep, ids, tw, g, h, sg, su, ranks=2, **kw)
            refused(lambda: pk(quota=i64(0)), "tensor quota: dimension 0 is 0")
            refused(lambda: pk(bwd_alloc=i64(8, 0)), "tensor bwd_alloc: dimension 1 is 0")
            refused(lambda: pk(bwd_alloc=i64(0, 2)), "tensor bwd_alloc: dimension 0 is 0")
            refused(lambda: pk(placement=np.ones((8, 0), np.uint8)),
                    "tensor placement: dimension 1 is 0")
            refused(lambda: lrmoe.score(ids, tw, g, phi_sqnorm=np.ones((T, K), np.float32),
                                        quota=i64(0)), "tensor quota: dimension 0 is 0")
        """)
        self.assertEqual(out.count("REFUSED"), 5)

    def test_plan_hidden_scalar_is_D(self):
        out = self.ok("""
            load = np.array([40, 10, 10, 10, 5, 5, 5, 3], np.int64)
            a = lrmoe.plan(load, ranks=2, hidden=128, ffn=64)
            b = lrmoe.plan(load, ranks=2, hidden=np.zeros((4, 128), np.float32), ffn=64)
            c = lrmoe.plan(load, ranks=2, ffn=64)
            print("D", a.attrs["plan.hidden"], b.attrs["plan.hidden"], c.attrs["plan.hidden"])
            refused(lambda: lrmoe.plan(load, ranks=2, hidden=np.zeros(3), ffn=64), "hidden")
            refused(lambda: lrmoe.plan(load, ranks=2, hidden=0, ffn=64), "hidden")
        """)
        self.assertIn("D 128 128 2048", out)


@unittest.skipUnless(HAVE_TORCH, "torch and transformers are not installed")
class HardenTorch(unittest.TestCase):
    PATCHED = """
import torch, tiny
torch.manual_seed(0)
blk = tiny.block("qwen3_moe")
pt = lrmoe.torch.patch(blk, ranks=2)
ex = blk.experts
T, D, F, E, K = 12, tiny.D, tiny.F, tiny.E, tiny.K
x = torch.randn(T, D)
ids = torch.randint(0, E, (T, K))
w = torch.rand(T, K)
with torch.no_grad():
    ok = ex(x, ids, w)
assert torch.isfinite(ok).all()
"""

    def ok(self, code):
        r = child("import lrmoe.torch\n" + self.PATCHED + textwrap.dedent(code))
        self.assertEqual(r.returncode, 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r.stdout

    def test_shapes_and_ids_are_checked(self):
        out = self.ok("""
            with torch.no_grad():
                refused(lambda: ex(torch.randn(T, 512 * D), ids, w), "hidden")
                refused(lambda: ex(x, ids, w[:, :1].contiguous()), "topk_weights")
                refused(lambda: ex(x, ids + 2**31, w), "topk_ids", "out of range")
                refused(lambda: ex(x, ids - E, w), "topk_ids", "out of range")
                refused(lambda: ex(x, ids.float(), w), "topk_ids")
                ex.down_proj = torch.nn.Parameter(torch.randn(E, D // 2, F))
                refused(lambda: ex(x, ids, w), "down_proj")
        """)
        self.assertEqual(out.count("REFUSED"), 6)

    def test_nonfinite_weights_refused(self):
        out = self.ok("""
            with torch.no_grad():
                ex.gate_up_proj[3, 1, 2] = float("nan")
                refused(lambda: ex(x, ids, w), "non-finite")
                ex.gate_up_proj[3, 1, 2] = 0.5
                ex.down_proj[5, 0, 0] = float("inf")
                refused(lambda: ex(x, ids, w), "non-finite")
        """)
        self.assertEqual(out.count("REFUSED"), 2)


if __name__ == "__main__":
    unittest.main()
