"""lrmoe.read/write/Reader/Writer against the tools and the independent
Python reader of tests/helpers (lrmoe_stream.py)."""
import ctypes
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

import tiny
import lrmoe

sys.path.insert(0, tiny.HELPERS)
import lrmoe_stream as ref  # noqa: E402


class Stream(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name
        self.gen = os.path.join(self.d, "g.lrm")
        subprocess.run([os.path.join(tiny.BIN, "lrmoe-gen"), "--tokens", "64", "--experts", "8",
                        "--topk", "2", "--hidden", "16", "--ffn", "8", "--layers", "2",
                        "--seed", "4", "-o", self.gen], check=True)

    def tearDown(self):
        self.tmp.cleanup()

    def test_read_matches_independent_reader(self):
        fr = lrmoe.read(self.gen)
        rf = ref.read_stream(self.gen)
        self.assertEqual(len(fr), len(rf))
        for f, (t, a) in zip(fr, rf):
            self.assertEqual(f.attrs, a)
            self.assertEqual(set(f), set(t))
            for n in t:
                want = ref.bf16_to_f32(t[n]) if f.dtypes[n] == "BF16" else t[n]
                self.assertTrue(np.array_equal(f[n], want), n)
                self.assertEqual(f[n].dtype, np.float32 if f.dtypes[n] == "BF16" else t[n].dtype)
        self.assertEqual(fr[0].dtypes["hidden"], "BF16")

    def test_write_round_trip_is_bit_exact(self):
        out = os.path.join(self.d, "w.lrm")
        lrmoe.write(out, lrmoe.read(self.gen))           # BF16 widened then stored again
        a, b = lrmoe.read(self.gen, bf16="raw"), lrmoe.read(out, bf16="raw")
        for x, y in zip(a, b):
            self.assertEqual(x.attrs, y.attrs)
            self.assertEqual(x.dtypes, y.dtypes)
            for n in x:
                self.assertTrue(np.array_equal(x[n], y[n]), n)
        # and the tools read what Python wrote
        r = subprocess.run([os.path.join(tiny.BIN, "lrmoe-view"), "--no-stats", out], capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("hidden", r.stdout)

    def test_plain_dicts_attrs_and_dtypes(self):
        out = os.path.join(self.d, "p.lrm")
        x = np.arange(6, dtype=np.float32).reshape(2, 3) + 0.5
        with lrmoe.Writer(out, compress=False) as w:
            w.write({"x": x, "i": np.array([1, 2], np.int64)}, attrs={"layer": 3},
                    dtypes={"x": "BF16"})
        self.assertEqual(w.count, 0)  # closed
        (f,) = lrmoe.read(out)
        self.assertEqual(f.attrs, {"layer": "3"})
        self.assertEqual(f.dtypes, {"x": "BF16", "i": "I64"})
        self.assertTrue(np.array_equal(f["x"], x))  # exactly representable in BF16
        self.assertTrue(np.array_equal(lrmoe.f32_to_bf16(x), ref.f32_to_bf16(x)))
        t, _ = ref.read_stream(out)[0]
        self.assertTrue(np.array_equal(t["i"], [1, 2]))

    def test_exception_in_with_leaves_a_truncated_stream(self):
        out = os.path.join(self.d, "t.lrm")
        with self.assertRaises(KeyError):
            with lrmoe.Writer(out) as w:
                w.write({"x": np.zeros(3, np.float32)})
                raise KeyError("boom")
        with self.assertRaises(lrmoe.Error) as e:
            lrmoe.read(out)
        self.assertIn("truncated", str(e.exception))

    def test_bad_input(self):
        with self.assertRaises(lrmoe.Error) as e:
            lrmoe.read(os.path.join(self.d, "missing.lrm"))
        self.assertIn("missing.lrm", str(e.exception))
        with self.assertRaises(lrmoe.Error):
            lrmoe.write(os.path.join(self.d, "c.lrm"), [{"z": np.zeros(2, np.complex64)}])
        bad = os.path.join(self.d, "bad.lrm")
        with open(bad, "wb") as fp:
            fp.write(b"not a stream at all")
        with self.assertRaises(lrmoe.Error):
            lrmoe.read(bad)

    def test_version_and_abi(self):
        self.assertEqual(lrmoe.__version__,
                         subprocess.run([os.path.join(tiny.BIN, "lrmoe-cat"), "--version"],
                                        capture_output=True, text=True).stdout.split()[-1])

    def test_mirrors_match_the_library(self):
        """Every ctypes struct mirror has lrmoe_abi_sizeof's size; a wrong one is refused."""
        from lrmoe import _lib
        try:
            from lrmoe import study_run  # the fidelity mirror (needs torch)
        except ImportError as e:
            self.skipTest(f"lrmoe.study_run does not import: {e}")
        mirrors = list(_lib._MIRRORS.items()) + [("lrmoe_fidelity_t", study_run.Fidelity)]
        # API 2: the binding mirrors at most a handful of structs; the exec,
        # pack, budget and cost-model arguments go by name through handles
        self.assertLessEqual(len(mirrors), 5, [n for n, _ in mirrors])
        for name, st in mirrors:
            self.assertEqual(_lib.lib.lrmoe_abi_sizeof(name.encode()), ctypes.sizeof(st), name)

        class Short(ctypes.Structure):
            _fields_ = [("D", ctypes.c_int64)]
        with self.assertRaises(lrmoe.Error) as e:
            _lib.check_mirror("lrmoe_cost_model_t", Short)
        self.assertIn("lrmoe_cost_model_t of", str(e.exception))


if __name__ == "__main__":
    unittest.main()
