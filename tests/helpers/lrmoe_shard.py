"""Per-rank streams of lrmoe-exec --per-rank (lrmoe-exec(1), MPI).

split IN P PATTERN   rank r's token rows of every frame of IN into PATTERN
                     (%r = r): rows [r*T/P, (r+1)*T/P) of the [T,...]
                     tensors, the others whole
join PATTERN P OUT   the reverse; grad_w_* rows from each expert's owner
                     (native rank ((e+1)*P-1)//E; the other shards hold
                     zeros there)
"""
import sys

import numpy as np

from lrmoe_stream import read_stream, write_stream

TOKEN = {'hidden', 'router_logits', 'grad_output', 'topk_ids', 'topk_weights', 'pair_rank',
         'keep', 'saved_gate', 'saved_up', 'pair_out', 'phi_sqnorm', 'output', 'pair_score',
         'grad_hidden', 'grad_topk_weights'}
GRAD_W = ('grad_w_gate', 'grad_w_up', 'grad_w_down')


def split(src, P, pattern):
    frames = read_stream(src, with_dtypes=True)
    for r in range(P):
        out = []
        for t, a, d in frames:
            T = t['topk_ids'].shape[0]
            lo, hi = T * r // P, T * (r + 1) // P
            out.append(({n: (v[lo:hi] if n in TOKEN else v) for n, v in t.items()}, a, d))
        write_stream(pattern.replace('%r', str(r)), out)


def join(pattern, P, dst):
    shards = [read_stream(pattern.replace('%r', str(r)), with_dtypes=True) for r in range(P)]
    out = []
    for i, (t0, a0, d0) in enumerate(shards[0]):
        t = {}
        for n, v in t0.items():
            if n in TOKEN:
                t[n] = np.concatenate([s[i][0][n] for s in shards])
            elif n in GRAD_W:
                E = v.shape[0]
                t[n] = np.stack([shards[((e + 1) * P - 1) // E][i][0][n][e] for e in range(E)])
            else:
                t[n] = v
        out.append((t, a0, d0))
    write_stream(dst, out)


if __name__ == '__main__':
    if len(sys.argv) != 5 or sys.argv[1] not in ('split', 'join'):
        sys.exit(__doc__)
    (split if sys.argv[1] == 'split' else join)(sys.argv[2], int(sys.argv[3]), sys.argv[4])
