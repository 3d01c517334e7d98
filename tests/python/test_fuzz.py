"""Property test of the binding (fuzz_binding.py, hypothesis): random dtypes,
shapes, strides, sizes and huge integers into every public function give a
result or lrmoe.Error. It runs in a child interpreter: a segfault there is
this test failing (exit -11), not the runner dying."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.path.join(TOP, "bin")

try:
    import hypothesis  # noqa: F401
    HAVE = True
except ImportError:
    HAVE = False


@unittest.skipUnless(HAVE, "hypothesis is not installed (tests/deps.sh test installs it)")
class Fuzz(unittest.TestCase):
    def test_result_or_error_never_a_crash(self):
        with tempfile.TemporaryDirectory() as d:
            subprocess.run(f"{BIN}/lrmoe-gen --tokens 64 --experts 8 --topk 2 --hidden 16 "
                           f"--ffn 8 --seed 3 --weights {d}/w.lrm | {BIN}/lrmoe-route -k 2 "
                           f"-o {d}/r.lrm", shell=True, check=True)
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                [os.path.join(TOP, "lib", "python"), HERE]))
            env.setdefault("LRMOE_LIBRARY", os.path.join(TOP, "build", "liblrmoe.so.2"))
            n = os.environ.get("LRMOE_FUZZ_EXAMPLES", "60")
            r = subprocess.run([sys.executable, "-W", "ignore", os.path.join(HERE,
                                "fuzz_binding.py"), d, n], env=env, capture_output=True,
                               text=True, timeout=300 + int(n))  # ~0.4 s an example under ASan
        self.assertEqual(r.returncode, 0, f"exit {r.returncode}\n{r.stdout[-4000:]}\n"
                                          f"{r.stderr[-4000:]}")
        self.assertIn("every call returned or raised lrmoe.Error", r.stdout)


if __name__ == "__main__":
    unittest.main()
