"""lrmoe.route/plan/score/pack on arrays return the tensors the tools
write for the same input, bit for bit."""
import os
import subprocess
import tempfile
import unittest

import numpy as np

import tiny
import lrmoe

B = tiny.BIN


def sh(cmd):
    r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True)
    if r.returncode:
        raise AssertionError(f"{cmd}: exit {r.returncode}: {r.stderr}")


class Ops(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.d = cls.tmp.name
        sh(f"{B}/lrmoe-gen --tokens 200 --experts 16 --topk 4 --hidden 32 --ffn 16 --zipf 1.1 "
           f"--seed 11 --weights {d}/w.lrm -o {d}/g.lrm")
        sh(f"{B}/lrmoe-route -k 4 -n {d}/g.lrm -o {d}/r.lrm")
        sh(f"{B}/lrmoe-plan -P 4 --ffn 16 --rate 0.7 --hbm 1GiB {d}/r.lrm -o {d}/p.lrm")
        sh(f"{B}/lrmoe-exec --phase forward --weights {d}/w.lrm {d}/p.lrm -o {d}/f.lrm")
        sh(f"{B}/lrmoe-score --select topk {d}/f.lrm -o {d}/s.lrm")
        sh(f"{B}/lrmoe-pack {d}/s.lrm -o {d}/k.lrm")
        sh(f"{B}/lrmoe-exec --phase backward --mode compact --weights {d}/w.lrm {d}/k.lrm -o {d}/b.lrm")
        cls.st = {n: lrmoe.read(f"{d}/{n}.lrm", bf16="raw")[0] for n in "grpfskb"}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def same(self, got, tool, names):
        for n in names:
            self.assertIn(n, got)
            self.assertEqual(got.dtype(n), tool.dtypes[n], n)
            a = lrmoe.f32_to_bf16(got[n]) if tool.dtypes[n] == "BF16" else got[n]
            self.assertTrue(np.array_equal(a, tool[n]), n)

    def test_route(self):
        g, r = self.st["g"], self.st["r"]
        got = lrmoe.route(g["router_logits"], k=4, renorm=True)
        self.same(got, r, ["topk_ids", "topk_weights", "expert_load"])
        # sigmoid, groups and a selection bias too
        bias = np.linspace(-0.1, 0.1, 16).astype(np.float32)
        np.save(os.path.join(self.d, "bias.npy"), bias)
        got = lrmoe.route(g["router_logits"], k=4, router="sigmoid", groups=4, topk_groups=2,
                          renorm=True, scale=2.5, expert_bias=bias)
        fr = lrmoe.Frame(g, dtypes=g.dtypes)
        fr["expert_bias"] = bias
        lrmoe.write(os.path.join(self.d, "gb.lrm"), [fr])
        sh(f"{B}/lrmoe-route -k 4 -r sigmoid --groups 4 --topk-groups 2 -n --scale 2.5 {self.d}/gb.lrm -o {self.d}/rb.lrm")
        self.same(got, lrmoe.read(f"{self.d}/rb.lrm")[0], ["topk_ids", "topk_weights"])

    def test_plan(self):
        r, p = self.st["r"], self.st["p"]
        got = lrmoe.plan(r["expert_load"], ranks=4, topk_ids=r["topk_ids"], hidden=r["hidden"],
                         ffn=16, rate=0.7, hbm="1GiB")
        self.same(got, p, ["placement", "fwd_alloc", "quota", "bwd_alloc"])
        self.assertEqual({k: v for k, v in got.attrs.items() if k != "plan.seconds"},
                         {k: v for k, v in p.attrs.items() if k.startswith("plan.") and k != "plan.seconds"})
        self.assertLess(float(got.attrs["plan.rho"]), 1.0)

    def test_capacity_keep(self):
        """lrmoe.capacity_keep equals a brute force of Megatron-Core's
        rule (an expert keeps its C pairs of highest weight, or its first C;
        ties to the lower pair index) and lrmoe.capacity its formula; bad
        input raises."""
        import math
        r = self.st["r"]
        ids, w = r["topk_ids"], r["topk_weights"]
        T, K = ids.shape
        wt = np.round(w * 4) / 4  # coarse weights: ties everywhere
        for F in (0.5, 1.0, 1.25):
            C = lrmoe.capacity(T, K, 16, F)
            self.assertEqual(C, math.ceil((T * K / 16) * F))
            for policy in ("probs", "position"):
                for ww in (w, wt):
                    keep, kept = lrmoe.capacity_keep(ids, ww, 16, F, policy=policy, kept=True)
                    u = np.arange(T * K)
                    fi, fw = ids.ravel(), ww.ravel().astype(np.float32)
                    ref = np.zeros(T * K, np.uint8)
                    for i in range(T * K):
                        same = fi == fi[i]
                        if policy == "position":
                            ahead = np.sum(same & (u < i))
                        else:
                            ahead = np.sum(same & ((fw > fw[i]) | ((fw == fw[i]) & (u < i))))
                        ref[i] = ahead < C
                    self.assertTrue(np.array_equal(keep.ravel(), ref), (F, policy))
                    n = np.bincount(fi, minlength=16)
                    self.assertTrue(np.array_equal(kept, np.minimum(n, C)))
        self.assertTrue(np.array_equal(lrmoe.capacity_keep(ids, None, 16, 0.5, "position"),
                                       lrmoe.capacity_keep(ids, w, 16, 0.5, "position")))
        bad = w.copy()
        bad[3, 1] = np.nan
        for args in ((ids, bad, 16, 1.0), (ids, w, 8, 1.0), (ids, w, 16, 0.0),
                     (ids, w, 16, float("inf")), (ids, None, 16, 1.0)):
            with self.assertRaises(lrmoe.Error):
                lrmoe.capacity_keep(*args)
        with self.assertRaises(lrmoe.Error):
            lrmoe.capacity_keep(ids, w, 16, 1.0, policy="random")

    def test_planner_capacity(self):
        """Planner(planner="capacity", capacity_factor=F) through the
        options by name equals lrmoe-plan --planner capacity frame for frame,
        and its quota is min(n_e, lrmoe.capacity)."""
        d, r = self.d, self.st["r"]
        for F in ("1.0", "0.75"):
            sh(f"{B}/lrmoe-plan -P 4 --ffn 16 --planner capacity --capacity-factor {F} "
               f"--drop-policy position {d}/r.lrm -o {d}/pc.lrm")
            t = lrmoe.read(f"{d}/pc.lrm")[0]
            got = lrmoe.Planner(ranks=4, planner="capacity", capacity_factor=F,
                                drop_policy="position").run(r)
            self.same(got, t, ["placement", "fwd_alloc", "quota", "bwd_alloc"])
            self.assertEqual({k: v for k, v in got.attrs.items() if k.startswith("plan.")},
                             {k: v for k, v in t.attrs.items() if k.startswith("plan.")})
            T, K = r["topk_ids"].shape
            C = lrmoe.capacity(T, K, 16, float(F))
            self.assertEqual(int(got.attrs["plan.capacity"]), C)
            self.assertTrue(np.array_equal(got["quota"], np.minimum(r["expert_load"], C)))
            # the keep mask of the same rule keeps exactly quota pairs per expert
            keep = lrmoe.capacity_keep(r["topk_ids"], r["topk_weights"], 16, float(F))
            self.assertTrue(np.array_equal(
                np.bincount(r["topk_ids"].ravel(), weights=keep.ravel(), minlength=16), got["quota"]))
        with self.assertRaises(lrmoe.Error):
            lrmoe.Planner(ranks=4, planner="capacity", capacity_factor=0)

    def test_planner_keeps_eplb_layouts(self):
        """One Planner over the frames of a 2-layer, 4-step stream equals
        lrmoe-plan --rebalance-every 2 frame by frame (eplb and lrmoe);
        a fresh Planner per frame (no kept layouts) does not."""
        d = self.d
        sh(f"{B}/lrmoe-gen --tokens 512 --experts 16 --topk 4 --hidden 64 --ffn 32 --layers 2 "
           f"--steps 4 --zipf 1.2 --drift 3 --seed 5 | {B}/lrmoe-route -o {d}/r2.lrm")
        frames = lrmoe.read(f"{d}/r2.lrm")
        for planner in ("eplb", "lrmoe"):
            sh(f"{B}/lrmoe-plan --ranks 4 --planner {planner} --ffn 32 --rebalance-every 2 "
               f"{d}/r2.lrm -o {d}/p2-{planner}.lrm")
            tool = lrmoe.read(f"{d}/p2-{planner}.lrm")
            opts = dict(ranks=4, planner=planner, hidden=64, ffn=32, topk=4, tokens=128,
                        rebalance_every=2)
            pl = lrmoe.Planner(**opts)
            fresh_differs = 0
            for i, (fr, t) in enumerate(zip(frames, tool)):
                got = pl.run(fr["expert_load"], layer=fr.attrs["layer"])
                self.assertEqual(got.attrs["layer"], fr.attrs["layer"])
                self.same(got, t, ["placement", "fwd_alloc", "quota", "bwd_alloc"])
                self.assertEqual({k: v for k, v in got.attrs.items()
                                  if k.startswith("plan.") and k != "plan.seconds"},
                                 {k: v for k, v in t.attrs.items()
                                  if k.startswith("plan.") and k != "plan.seconds"}, (planner, i))
                one = lrmoe.Planner(**opts).run(fr["expert_load"])
                fresh_differs += not np.array_equal(one["placement"], t["placement"])
            self.assertEqual(len(tool), 8)
            if planner == "eplb":  # frames 1, 3, 5, 7 of each layer use an older layout
                self.assertGreater(fresh_differs, 0)
            # reset(): the next frame is a layer's first again
            pl.reset()
            got = pl.run(frames[2]["expert_load"], layer=frames[2].attrs["layer"])
            self.assertTrue(np.array_equal(
                got["placement"], lrmoe.Planner(**opts).run(frames[2]["expert_load"])["placement"]))

    def test_planner_takes_model_sizes_from_the_frame(self):
        """Planner.run(frame) infers D, F, K and tokens per rank in the
        library as lrmoe-plan does (no sizes given here): the plan and its
        plan.* attributes equal the tool's; an option that disagrees with
        the frame, and a bare load with no ffn, are the tool's errors; F
        from a weights stream."""
        d = self.d
        r, p = self.st["r"], self.st["p"]  # r: a routed frame with ffn=16, hidden [200,32]
        got = lrmoe.Planner(ranks=4, rate=0.7, hbm="1GiB").run(r)
        self.same(got, p, ["placement", "fwd_alloc", "quota", "bwd_alloc"])
        plan_attrs = lambda a: {k: v for k, v in a.items()
                                if k.startswith("plan.") and k != "plan.seconds"}
        self.assertEqual(plan_attrs(got.attrs), plan_attrs(p.attrs))
        self.assertEqual(got.attrs["plan.ffn"], "16")
        self.assertEqual(got.attrs["plan.hidden"], "32")
        self.assertNotIn("placement", r)  # the input frame is not changed
        with self.assertRaisesRegex(lrmoe.Error, "--ffn 99 disagrees with the frame: F=16"):
            lrmoe.Planner(ranks=4, ffn=99).run(r)
        with self.assertRaisesRegex(lrmoe.Error, "says nothing of the expert FFN width F"):
            lrmoe.Planner(ranks=4).run(r["expert_load"])
        # F and D from the weights stream, for a load that says neither
        got = lrmoe.Planner(ranks=4, weights=f"{d}/w.lrm").run(r["expert_load"])
        self.assertEqual((got.attrs["plan.ffn"], got.attrs["plan.hidden"]), ("16", "32"))
        with self.assertRaisesRegex(lrmoe.Error, "nope.lrm"):
            lrmoe.Planner(ranks=4, weights=f"{d}/nope.lrm")

    def test_score(self):
        f, s = self.st["f"], self.st["s"]
        # the plan's keep rule too: the planner's in-place plans keep by forward rank
        kr = f.attrs.get("plan.keep")
        got = lrmoe.score(f["topk_ids"], f["topk_weights"], f["grad_output"], f["phi_sqnorm"],
                          quota=f["quota"], keep_rule=kr, select="topk",
                          bwd_alloc=f["bwd_alloc"] if kr == "by-rank" else None,
                          pair_rank=f["pair_rank"] if kr == "by-rank" else None,
                          dtypes={"grad_output": f.dtypes["grad_output"]})
        self.same(got, s, ["pair_score", "keep"])
        self.assertEqual(got.attrs["score.kept"], s.attrs["score.kept"])

    def test_score_sample_and_pack(self):
        """select="sample" and a pack with its pair_weight: the tools' bits."""
        f, d = self.st["f"], self.d
        sh(f"{B}/lrmoe-score --select sample --seed 3 {d}/f.lrm -o {d}/ss.lrm")
        sh(f"{B}/lrmoe-pack {d}/ss.lrm -o {d}/sk.lrm")
        ss = lrmoe.read(f"{d}/ss.lrm", bf16="raw")[0]
        sk = lrmoe.read(f"{d}/sk.lrm", bf16="raw")[0]
        kr = f.attrs.get("plan.keep")
        got = lrmoe.score(f["topk_ids"], f["topk_weights"], f["grad_output"], f["phi_sqnorm"],
                          quota=f["quota"], seed=3, select="sample", keep_rule=kr,
                          bwd_alloc=f["bwd_alloc"] if kr == "by-rank" else None,
                          pair_rank=f["pair_rank"] if kr == "by-rank" else None,
                          dtypes={"grad_output": f.dtypes["grad_output"]})
        self.same(got, ss, ["pair_score", "keep", "pair_weight"])
        self.assertEqual(got.attrs["score.select"], "sample")
        names = ["keep", "topk_ids", "topk_weights", "grad_output", "hidden", "saved_gate",
                 "saved_up", "pair_rank", "placement", "bwd_alloc", "quota", "pair_weight"]
        got = lrmoe.pack(**{n: ss[n] for n in names}, dtypes=ss.dtypes)
        self.same(got, sk, ["pack_pair", "pack_grad", "pack_hidden"])
        with self.assertRaisesRegex(lrmoe.Error, "unknown selection"):
            lrmoe.score(f["topk_ids"], f["topk_weights"], f["grad_output"], f["phi_sqnorm"],
                        quota=f["quota"], select="nope")

    def test_pack(self):
        s, k = self.st["s"], self.st["k"]
        names = ["keep", "topk_ids", "topk_weights", "grad_output", "hidden", "saved_gate",
                 "saved_up", "pair_rank", "placement", "bwd_alloc", "quota"]
        got = lrmoe.pack(**{n: s[n] for n in names}, dtypes=s.dtypes)
        self.same(got, k, ["pack_pair", "pack_rank", "pack_counts", "pack_offsets", "pack_grad",
                           "pack_hidden", "pack_gate", "pack_up"])

    def test_exec_forward_and_compact_backward(self):
        p, f, k, b = self.st["p"], self.st["f"], self.st["k"], self.st["b"]
        w = os.path.join(self.d, "w.lrm")
        got = lrmoe.forward(p, w)
        self.same(got, f, ["output", "pair_rank", "phi_sqnorm", "saved_gate", "saved_up",
                           "pair_out"])
        self.assertIn("exec.forward.wall_s", got.attrs)
        got = lrmoe.backward(k, w, mode="compact")
        self.same(got, b, ["grad_hidden", "grad_w_gate", "grad_w_up", "grad_w_down",
                           "grad_topk_weights"])
        with self.assertRaises(lrmoe.Error) as e:
            lrmoe.forward(p, os.path.join(self.d, "nope.lrm"))
        self.assertIn("nope.lrm", str(e.exception))
        with self.assertRaises(lrmoe.Error):
            lrmoe.backward(k, w, mode="sideways")

    def test_bad_input(self):
        g = self.st["g"]
        with self.assertRaises(lrmoe.Error) as e:
            lrmoe.route(g["router_logits"], k=99)
        self.assertIn("99", str(e.exception))
        with self.assertRaises(lrmoe.Error) as e:
            lrmoe.route(g["router_logits"], router="nope")
        with self.assertRaises(lrmoe.Error) as e:
            lrmoe.plan(np.array([5, 5, 5]), ranks=2)
        with self.assertRaises(lrmoe.Error) as e:
            lrmoe.plan(np.array([5, 5]), ranks=2, hbm="lots")
        self.assertIn("--hbm", str(e.exception))
        with self.assertRaises(lrmoe.Error) as e:
            lrmoe.score(g["router_logits"][:, :2].astype(np.int32), None, g["grad_output"],
                        drop=10, metric="gradnorm")
        self.assertIn("needs a float grad_output", str(e.exception))


if __name__ == "__main__":
    unittest.main()
