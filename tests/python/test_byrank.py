"""lrmoe.torch.patch on a plan that keeps pairs by forward rank
(plan.keep=by-rank, lrmoe-score(1)): the patched layer's keep mask, moved
rows and gradients equal the tool pipeline's on the same dumped step, bit
for bit, and the mask is not the global top-K_e selection of the same
quotas (so the by-rank branch of the backward is what ran)."""
import copy
import unittest

import numpy as np
import torch

import tiny
import lrmoe
import lrmoe.torch as lt
from test_dump import sh
from test_patch import run

E, K, D, F, P, T, RATE = 16, 4, 48, 32, 4, 256, 0.7


def skewed_block():
    """A Qwen3-MoE block whose router sends most tokens to experts 0 and 1
    (both native on rank 0), and its input: at 4 ranks and rate 0.7 the
    strict backward rule needs the keep by forward rank."""
    blk = tiny.block("qwen3_moe", num_experts=E, num_experts_per_tok=K, hidden_size=D,
                     moe_intermediate_size=F)
    torch.manual_seed(5)
    u = torch.randn(D)
    u = u / u.norm()
    with torch.no_grad():
        blk.gate.weight[:2] += 4.0 * u
    return blk, torch.randn(1, T, D) + 2.0 * u


class ByRank(tiny.TmpDirCase):
    def test_by_rank_plan_matches_the_tool_pipeline(self):
        blk, x = skewed_block()
        with lt.dump(blk, self.p("d.lrm"), weights=self.p("w.lrm")):
            run(blk, x)
        f = lrmoe.read(self.p("d.lrm"))[0]
        B, w = tiny.BIN, self.p("w.lrm")
        sh(f"{B}/lrmoe-route --topk {K} --renorm {self.p('d.lrm')} | {B}/lrmoe-plan --ranks {P} "
           f"--rate {RATE} --ffn {F} | {B}/lrmoe-exec --phase forward --threads 1 --weights {w} | "
           f"{B}/lrmoe-score --select topk | {B}/lrmoe-pack --stats {self.p('pack.tsv')} | {B}/lrmoe-exec "
           f"--phase backward --mode compact --threads 1 --weights {w} -o {self.p('cli.lrm')}")
        c = lrmoe.read(self.p("cli.lrm"))[0]
        self.assertEqual(c.attrs.get("plan.keep"), "by-rank", "the setup no longer plans by rank")
        self.assertEqual(c.attrs.get("score.keep"), "by-rank")

        pat = copy.deepcopy(blk)
        h = lt.patch(pat, rate=RATE, ranks=P, threads=1, keep_masks=True, select="topk")
        hid = torch.from_numpy(f["hidden"]).requires_grad_(True)
        alpha = torch.from_numpy(c["topk_weights"]).requires_grad_(True)
        out = pat.experts(hid, torch.from_numpy(c["topk_ids"]).long(), alpha)
        out.backward(torch.from_numpy(f["grad_output"]))
        rec = h.stats[-1]
        self.assertEqual(rec["keep_rule"], "by-rank")
        self.assertEqual(rec["source"], c.attrs["plan.source"])
        keep, ckeep = rec["keep"], c["keep"].astype(bool)
        self.assertTrue(np.array_equal(keep, ckeep),
                        f"keep differs from lrmoe-score's at {int((keep != ckeep).sum())} pairs")
        self.assertEqual(rec["kept"], int(ckeep.sum()))
        with open(self.p("pack.tsv")) as fh:
            hdr, row = fh.readline().rstrip("\n").split("\t"), fh.readline().rstrip("\n").split("\t")
        self.assertEqual(rec["moved"], int(row[hdr.index("moved")]))

        # the global top-K_e of the same quotas keeps other pairs here
        glob = lrmoe.score(c["topk_ids"], c["topk_weights"], f["grad_output"],
                           phi_sqnorm=c["phi_sqnorm"], quota=c["quota"])
        self.assertFalse(np.array_equal(glob["keep"].astype(bool), keep),
                         "by-rank and global keep the same pairs: the test shows nothing")

        ex = pat.experts
        pairs = {"output": out.detach(), "grad_hidden": hid.grad,
                 "grad_topk_weights": alpha.grad,
                 "grad_w_gate": ex.gate_up_proj.grad[:, :F],
                 "grad_w_up": ex.gate_up_proj.grad[:, F:],
                 "grad_w_down": ex.down_proj.grad}
        for n, t in pairs.items():
            a, b = c[n], t.numpy()
            err = np.abs(a - b).max() / np.abs(b).max()
            self.assertTrue(np.array_equal(a, b), f"{n}: rel err {err}")


if __name__ == "__main__":
    unittest.main()
