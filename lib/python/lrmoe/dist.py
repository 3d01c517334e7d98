"""lrmoe.torch over a torch.distributed process group: one expert-parallel
rank per process (patch(model, ..., group=pg)).

Each process routes its own T_r tokens; rank r's tokens are rows
[floor(r*T/P), floor((r+1)*T/P)) of the global batch of T = sum T_r tokens
(equal T_r always qualify; unequal ones only when they are that floor
split, else every rank raises the same error). liblrmoe's exec runs as rank
r only (a callback communicator, lrmoe_comm_callback_new in exec.h, with
self = r+1): its all-to-alls are dist.all_to_all_single, its weight and
weight-gradient transfers dist.send/recv. All algorithmic work stays in
liblrmoe; this module moves tensors and small metadata:

forward: the routing (topk ids and weights, 8 bytes per pair) is
  all-gathered, so every rank counts the same per-expert loads and runs the
  same deterministic planner on them (a digest of the plan is compared
  across ranks: a disagreement is one error on every rank); the exec
  dispatches, computes this rank's pairs and combines; ||phi||^2 of each
  pair goes back to its token's owner (4 bytes per pair).
backward: LRM scores are formed where g_t is (the owner), all-gathered (4
  bytes per pair), and every rank runs the same selection and
  lrmoe_pack_assign on them; the saved state of a kept pair whose backward
  rank differs from its forward rank moves there, and the hidden rows its
  backward rank lacks come from the token's owner; then the compact
  backward, whose all-to-alls carry only the kept pairs' rows.

Arrays handed to the exec are global-shaped (T rows) with only this rank's
rows written (torch.empty: rows never touched cost no memory); the exec's
own finiteness check of whole arrays is replaced by a check of the rows this
rank holds. The simulated single-process run (patch(..., ranks=P)) is the
reference: outputs, router and hidden gradients of a rank's tokens and the
weight gradients of its native experts are the same bits. The parameters
of the other experts get a zero gradient here (their owner trains them).
"""
import ctypes
import gc
import hashlib
import os
import time
import weakref
from ctypes import POINTER, c_int, c_int64, c_size_t, c_void_p
from typing import Any, Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist

from . import _lib
from ._lib import Error, check, lib

A2A = ctypes.CFUNCTYPE(c_int, c_void_p, c_size_t, c_void_p, POINTER(c_int64), POINTER(c_int64),
                       c_void_p, POINTER(c_int64), POINTER(c_int64))
P2P = ctypes.CFUNCTYPE(c_int, c_void_p, c_int, c_void_p, c_int, c_void_p, c_size_t)
lib.lrmoe_comm_callback_new.restype = c_void_p
lib.lrmoe_comm_callback_new.argtypes = [c_int, c_int, A2A, P2P, c_void_p]
lib.lrmoe_comm_callback_free.restype = None
lib.lrmoe_comm_callback_free.argtypes = [c_void_p]
lib.lrmoe_comm_callback_sent.restype = None
lib.lrmoe_comm_callback_sent.argtypes = [c_void_p, POINTER(c_int64), POINTER(c_int64)]
lib.lrmoe_exec_assign.restype = c_int
lib.lrmoe_exec_assign.argtypes = [c_int64, c_int64, c_int64, c_int, c_void_p, c_void_p, c_void_p,
                                  c_void_p]
_U8 = torch.uint8
_GROUPS: "weakref.WeakSet[Group]" = weakref.WeakSet()  # every Group, for shutdown()
# the threads of a live ProcessGroupGloo (torch names them so on Linux)
_GLOO_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop")


def _mem(ptr: Optional[int], n: int) -> torch.Tensor:
    """n bytes at address ptr as a uint8 tensor (no copy)."""
    if n == 0:
        return torch.empty(0, dtype=_U8)
    if not ptr:
        raise Error(f"internal: NULL buffer of {n} bytes")
    return torch.frombuffer((ctypes.c_uint8 * n).from_address(ptr), dtype=_U8)


class _DevMem:
    """n bytes of device memory at ptr, for torch.as_tensor (no copy)."""

    def __init__(self, ptr: int, n: int) -> None:
        self.__cuda_array_interface__ = dict(shape=(n,), typestr="|u1", data=(ptr, False),
                                             version=3, strides=None)


def _dmem(ptr: Optional[int], n: int, dev: Optional[torch.device]) -> torch.Tensor:
    """n bytes at ptr: host memory (dev None) or memory of CUDA device dev."""
    if dev is None or n == 0:
        t = _mem(ptr, n)
        return t if dev is None else t.to(dev)
    if not ptr:
        raise Error(f"internal: NULL device buffer of {n} bytes")
    return torch.as_tensor(_DevMem(ptr, n), device=dev)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor as (rows, bytes per row) uint8 (no copy)."""
    return t.view(t.shape[0], -1).view(_U8) if t.numel() else t.new_empty(t.shape[0], 0,
                                                                             dtype=_U8)


def _prefix(counts: List[int]) -> List[int]:
    out, acc = [], 0
    for c in counts:
        out.append(acc)
        acc += c
    return out


class Group:
    """The process group of a patch(group=...): rank, size and the callback
    communicator that liblrmoe's exec drives. .sent lists (phase, bytes this
    rank sent) per all-to-all of the exec; .moved the bytes of the state
    moves (phi to owners, saved state to backward ranks) per phase."""

    def __init__(self, group: Any) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise Error("group=: torch.distributed is not initialized "
                        "(dist.init_process_group first, e.g. under torchrun)")
        self.group = group if group is not None else dist.group.WORLD
        self.P = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        if self.rank < 0:
            raise Error("group=: this process is not a member of the group")
        self.glob = [dist.get_global_rank(self.group, r) for r in range(self.P)]
        self.sent: List[tuple] = []
        self.moved: Dict[str, int] = {}
        self.phase = ""
        self.comm_s = 0.0
        self.error: Optional[BaseException] = None
        # the CUDA device whose memory the exec's buffers are in (the CUDA
        # executor's callbacks: device pointers), else None (host memory)
        self.dev: Optional[torch.device] = None
        # torch's NCCL backend collects CUDA tensors only: metadata goes there
        self.meta_dev = (torch.device("cuda", torch.cuda.current_device())
                         if dist.get_backend(self.group) == "nccl" else None)
        self._a2a, self._p2p = A2A(self._a2a_cb), P2P(self._p2p_cb)
        self.comm = lib.lrmoe_comm_callback_new(self.P, self.rank, self._a2a, self._p2p, None)
        if not self.comm:
            raise Error(f"group=: {_lib.errmsg()}")
        _GROUPS.add(self)

    def __del__(self) -> None:
        c, self.comm = getattr(self, "comm", None), None
        if c:
            lib.lrmoe_comm_callback_free(c)

    # ---- the callbacks liblrmoe calls (no exception may cross into C)
    def _a2a_cb(self, user, es, send, sc, sd, recv, rc, rd):
        try:
            P, dv = self.P, self.dev
            m = (lambda p, n: _dmem(p, n, dv))  # noqa: E731
            sc, sd = [sc[i] for i in range(P)], [sd[i] for i in range(P)]
            rc, rd = [rc[i] for i in range(P)], [rd[i] for i in range(P)]
            ns, nr = sum(sc), sum(rc)
            if sd == _prefix(sc):
                inp = m(send, ns * es).view(ns, es)
            else:
                inp = torch.cat([m(send + sd[d] * es, sc[d] * es).view(sc[d], es)
                                 for d in range(P)]) if ns else torch.empty(0, es, dtype=_U8,
                                                                            device=dv)
            direct = rd == _prefix(rc)
            out = m(recv, nr * es).view(nr, es) if direct else torch.empty(nr, es, dtype=_U8,
                                                                              device=dv)
            dist.all_to_all_single(out, inp, rc, sc, group=self.group)
            if not direct:
                at = 0
                for s in range(P):
                    if rc[s]:
                        m(recv + rd[s] * es, rc[s] * es).copy_(out[at:at + rc[s]].view(-1))
                    at += rc[s]
            self._done()
            self.sent.append((self.phase, ns * es))
            return 0
        except BaseException as e:  # noqa: B902 (reported after the exec returns)
            self.error = e
            return -1

    def _p2p_cb(self, user, src, sbuf, dst, rbuf, n):
        try:
            if src == self.rank:
                dist.send(_dmem(sbuf, n, self.dev), self.glob[dst], group=self.group)
            else:
                dist.recv(_dmem(rbuf, n, self.dev), self.glob[src], group=self.group)
            self._done()
            return 0
        except BaseException as e:  # noqa: B902
            self.error = e
            return -1

    def _done(self) -> None:
        """A callback completes before it returns (the exec's contract):
        NCCL's work on device memory is waited for."""
        if self.dev is not None:
            torch.cuda.current_stream(self.dev).synchronize()

    def run(self, what: str, fn, *args) -> None:
        """One exec call: a failed collective is named as such."""
        self.error = None
        rc = fn(*args)
        if rc < 0:
            if self.error is not None:
                raise Error(f"{what}: rank {self.rank} of {self.P}: the process group failed "
                            f"({type(self.error).__name__}: {self.error}); did a peer rank "
                            "die or raise?") from None
            check(rc, what)

    def collective(self, what: str, fn, *args, **kw) -> Any:
        t0 = time.perf_counter()
        md = self.meta_dev
        try:
            if md is not None and fn is not dist.all_to_all_single:  # host metadata via NCCL
                conv = [[x.to(md) for x in a] if isinstance(a, list) else
                        (a.to(md) if isinstance(a, torch.Tensor) else a) for a in args]
                r = fn(*conv, group=self.group, **kw)
                for a, c in zip(args, conv):
                    if isinstance(a, list):
                        for x, y in zip(a, c):
                            x.copy_(y)
                return r
            return fn(*args, group=self.group, **kw)
        except RuntimeError as e:
            raise Error(f"{what}: rank {self.rank} of {self.P}: the process group failed "
                        f"({e}); did a peer rank die or raise?") from None
        finally:
            self.comm_s += time.perf_counter() - t0

    # ---- collectives on small metadata
    def tokens(self, name: str, T: int):
        """Every rank's token count; rank r's first global row."""
        t = torch.tensor([T], dtype=torch.int64)
        lst = [torch.empty(1, dtype=torch.int64) for _ in range(self.P)]
        self.collective(f"{name}: token counts", dist.all_gather, lst, t)
        Tr = [int(x) for x in lst]
        Tg, P = sum(Tr), self.P
        for r in range(P):
            want = Tg * (r + 1) // P - Tg * r // P
            if Tr[r] != want:
                raise Error(f"{name}: rank {r} has {Tr[r]} tokens, but rank r must hold rows "
                            f"[r*T/P, (r+1)*T/P) of all T={Tg} (counts {Tr}): {want}")
        return Tr, Tg * self.rank // P

    def routing(self, name: str, T: int, K: int, ids: torch.Tensor, alpha: torch.Tensor):
        """The start of a call: comm_s reset, every rank's token count, this
        rank's first global row, all T of them, and every rank's routing
        (ids int32 and weights f32, (T, K) each) all-gathered."""
        self.comm_s = 0.0
        Tr, lo = self.tokens(name, T)
        ga = self.gather_rows(f"{name}: routing", torch.cat([ids, alpha.view(torch.int32)], 1), Tr)
        return Tr, lo, sum(Tr), ga[:, :K].contiguous(), ga[:, K:].contiguous().view(torch.float32)

    def gather_rows(self, what: str, t: torch.Tensor, Tr: List[int]) -> torch.Tensor:
        """Every rank's rows, rank after rank."""
        m = max(Tr)
        pad = t.new_zeros((m,) + tuple(t.shape[1:]))
        pad[:t.shape[0]] = t
        lst = [torch.empty_like(pad) for _ in range(self.P)]
        self.collective(what, dist.all_gather, lst, pad)
        return torch.cat([x[:n] for x, n in zip(lst, Tr)])

    def any(self, what: str, flag: bool) -> bool:
        """Whether flag is true on any rank (an all-reduce of one int)."""
        t = torch.tensor([int(bool(flag))], dtype=torch.int64)
        self.collective(what, dist.all_reduce, t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def device_weights(self, layer, cu, gate_up: torch.Tensor, down: torch.Tensor,
                       dt: str) -> Dict[str, Any]:
        """cu.weights, refreshed on every rank when any rank's expert
        parameters changed: a rank's CUDA executor keeps the replicas it
        received, so a refresh (dropping them) on one rank alone would leave
        the owner's weight sends without their receives (a hang)."""
        gu, dn = gate_up.detach(), down.detach()
        force = self.any(f"{layer.block.name}: weights changed", cu.stale(layer, gu, dn))
        return cu.weights(layer, gu, dn, dt, force=force)

    def agree(self, name: str, *arrays: np.ndarray) -> None:
        """Every rank must hold the same plan: its bytes' digest is compared."""
        h = hashlib.blake2b(digest_size=8)
        for a in arrays:
            h.update(np.ascontiguousarray(a).tobytes())
        d = torch.tensor([int.from_bytes(h.digest(), "little") >> 2], dtype=torch.int64)
        lst = [torch.empty(1, dtype=torch.int64) for _ in range(self.P)]
        self.collective(f"{name}: plan digest", dist.all_gather, lst, d)
        bad = [r for r in range(self.P) if int(lst[r]) != int(lst[0])]
        if bad:
            raise Error(f"{name}: the ranks disagree on the plan: rank {bad[0]}'s differs from "
                        "rank 0's (different loads, planner options or liblrmoe builds?)")

    def move(self, what: str, arr: torch.Tensor, idx: np.ndarray, src: np.ndarray,
             dst: np.ndarray) -> int:
        """Rows idx of the global-shaped arr from rank src to rank dst (the
        same lists on every rank; rows with src == dst stay); bytes sent."""
        m = src != dst
        idx, src, dst = idx[m], src[m], dst[m]
        me, P = self.rank, self.P
        rows = _rows(arr)
        s = src == me
        so = np.argsort(dst[s], kind="stable")
        sidx = torch.from_numpy(np.ascontiguousarray(idx[s][so], np.int64)).to(arr.device)
        sc = np.bincount(dst[s], minlength=P).tolist()
        r = dst == me
        ro = np.argsort(src[r], kind="stable")
        ridx = torch.from_numpy(np.ascontiguousarray(idx[r][ro], np.int64)).to(arr.device)
        rc = np.bincount(src[r], minlength=P).tolist()
        inp = rows.index_select(0, sidx)
        out = rows.new_empty(len(ridx), rows.shape[1])
        self.collective(what, dist.all_to_all_single, out, inp, rc, sc)
        rows.index_copy_(0, ridx, out)
        n = inp.numel()
        self.moved[self.phase] = self.moved.get(self.phase, 0) + n
        return n

    def owners(self, Tg: int, t: np.ndarray) -> np.ndarray:
        """The owning rank of global token rows t (the exec's floor split:
        rank r owns [floor(r*T/P), floor((r+1)*T/P)))."""
        b = np.array([r * Tg // self.P for r in range(self.P + 1)], np.int64)
        return (np.searchsorted(b, t, side="right") - 1).astype(np.int64)

    def cfg(self, base: Dict[str, Any]) -> Dict[str, Any]:
        """The exec's cfg by name (lrmoe_exec_args_t) on this rank's
        communicator; the rows this rank holds are checked instead of the
        whole global-shaped arrays."""
        return dict(base, comm=self.comm, allow_nonfinite=1)

    def sent_bytes(self, phase: str) -> List[int]:
        return [n for p, n in self.sent if p == phase]


def _gloo_threads() -> List[str]:
    """The names of this process's gloo threads that are alive (Linux:
    /proc/self/task; elsewhere none are seen)."""
    out = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                name = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name in _GLOO_THREADS:
            out.append(name)
    return sorted(out)


def _release_defaults(pgs: List[Any]) -> None:
    """torch.distributed.nn.functional's collectives take group=group.WORLD
    as a default argument: imported after init_process_group (as happens
    lazily under lrmoe-study --nproc), they keep the group alive. Those defaults go back to None
    (what they are when imported before init: the default group)."""
    import sys
    mod = sys.modules.get("torch.distributed.nn.functional")
    if mod is None:
        return
    dead = [r() for r in pgs]
    for f in list(vars(mod).values()):
        d = getattr(f, "__defaults__", None)
        if callable(f) and d and any(v is p for v in d for p in dead if p is not None):
            f.__defaults__ = tuple(None if any(v is p for p in dead if p is not None) else v
                                   for v in d)


def shutdown(barrier: bool = True) -> None:
    """End this process's torch.distributed use so that it can exit cleanly:
    a barrier (barrier=True), destroy_process_group(), then every process
    group object freed while the interpreter is still whole.

    Why: destroy_process_group() does not stop ProcessGroupGloo's worker
    threads; they live as long as some Python object holds the group (every
    patch(group=...) does, through its Group), i.e. into interpreter exit. A
    worker that releases a finished collective's tensors after Python began
    finalizing must take the GIL for the tensors' Python objects, and Python
    then ends that thread with pthread_exit inside a C++ destructor:
    "terminate called without an active exception", SIGABRT, now and then
    (a race with the exit; seen with 4 ranks on a loaded machine). Freeing
    the group here runs its destructor, which waits for the workers and
    joins them while they can still take the GIL. Afterwards no gloo thread
    may be left: one that is (someone else still holds the group) is an
    Error, raised after the group was destroyed.
    """
    pgs, failed = [], None
    if dist.is_available() and dist.is_initialized():
        held = {id(g.group): g.group for g in list(_GROUPS) if g.group is not None}
        held[id(dist.group.WORLD)] = dist.group.WORLD
        pgs = [weakref.ref(pg) for pg in held.values()]
        del held
        try:
            if barrier:
                dist.barrier()
        except RuntimeError as e:  # a peer died: still end this rank's threads
            failed = str(e)  # not e: its traceback's frames hold the group
        finally:
            dist.destroy_process_group()
    for g in list(_GROUPS):  # lrmoe's own references to the group
        g.group = None
    _release_defaults(pgs)
    gc.collect()  # patch handles and models in reference cycles hold Groups
    alive = sum(r() is not None for r in pgs)
    left = _gloo_threads()
    if failed is not None:
        raise Error(f"shutdown: the final barrier failed ({failed}); did a peer rank die or "
                    "raise?")
    if alive or left:
        raise Error(f"shutdown: {alive} process group(s) still referenced, gloo threads "
                    f"alive: {', '.join(left) or 'none'}: "
                    "its worker threads would outlive the interpreter and can abort the "
                    "process at exit (drop every reference to the group before "
                    "lrmoe.dist.shutdown())")


def _finite(call, dt: str, t: torch.Tensor, name: str, what: str) -> None:
    """liblrmoe's finiteness check of t, timed in call (a _Call)."""
    check(call(lib.lrmoe_exec_check_finite, _lib.DT[dt], _lib.buf(name, t, dt, tuple(t.shape)),
               t.numel(), name.encode()), what)


def _plan_assign(layer, call, gids: torch.Tensor, Tg: int, dt: str):
    """The plan of every rank's routing gids (Tg, K), agreed by every rank,
    and each pair's forward rank (lrmoe_exec_assign): placement, fwd_alloc,
    quota, bwd_alloc, the plan's attributes, pair_rank."""
    from . import torch as lt
    g: Group = layer.owner.dist
    blk, (_, K) = layer.block, gids.shape
    E, P = blk.E, layer.owner.ranks
    load = torch.bincount(gids.view(-1).long(), minlength=E).numpy()
    placement, fwd_alloc, quota, bwd_alloc, attrs = lt._plan(layer, call, load, Tg, K, dt)
    g.agree(blk.name, placement, fwd_alloc, quota, bwd_alloc)
    pr = np.empty((Tg, K), np.int32)
    check(call(lib.lrmoe_exec_assign, Tg, K, E, P, gids.data_ptr(), fwd_alloc.ctypes.data,
               placement.ctypes.data, pr.ctypes.data), f"{blk.name}: assign")
    return placement, fwd_alloc, quota, bwd_alloc, attrs, pr


def _pack(call, cfg: Dict[str, Any], dims: Dict[str, int], W: Dict[str, Any],
          placement: np.ndarray, fwd_alloc: np.ndarray, gids: torch.Tensor, keep: torch.Tensor,
          pair_rank: torch.Tensor, bwd_alloc: np.ndarray, quota: np.ndarray):
    """The backward's exec arguments and liblrmoe's pack of the kept pairs
    (lrmoe_exec_args_pack), CPU and device paths alike: the arguments, R,
    and each packed row's pair and backward rank (int64 arrays of R)."""
    b = _lib.ExecArgs(cfg, dims, W,
                      dict(placement=placement.ctypes.data, fwd_alloc=fwd_alloc.ctypes.data),
                      topk_ids=gids.data_ptr(), keep=keep.data_ptr(),
                      pair_rank=pair_rank.data_ptr(), bwd_alloc=bwd_alloc.ctypes.data,
                      quota=quota.ctypes.data)
    check(call(lib.lrmoe_exec_args_pack, b.h), "pack")
    R = b.get("R")
    upair = np.ctypeslib.as_array(ctypes.cast(b.get_ptr("pack_pair"), POINTER(c_int64)),
                                  (R,)).copy() if R else np.empty(0, np.int64)
    urank = np.ctypeslib.as_array(ctypes.cast(b.get_ptr("pack_rank"), POINTER(ctypes.c_int32)),
                                  (R,)).astype(np.int64) if R else np.empty(0, np.int64)
    return b, R, upair, urank


def _fwd_stats(layer, call, Tg: int, K: int, T: int, attrs: Dict[str, str], train: bool,
               head: Optional[Dict[str, Any]] = None,
               tail: Optional[Dict[str, Any]] = None) -> torch.Tensor:
    """The forward's stats record, CPU and device paths alike (head: keys
    after the rank's, tail: after the all-to-all bytes), kept until the
    backward when train, and the step's meta tensor [step, by-rank keeps]."""
    from . import torch as lt
    o, blk = layer.owner, layer.block
    g: Group = o.dist
    rec: Dict[str, Any] = {"layer": blk.layer, "step": o.steps.get(blk.layer, 0),
                           "pairs": Tg * K, "tokens": Tg, "rank": g.rank, "rank_tokens": T,
                           **(head or {})}
    for k, v in attrs.items():
        if k.startswith("plan."):
            rec["keep_rule" if k == "plan.keep" else k[5:]] = lt._num(v)
    rec["fwd_a2a_bytes"] = g.sent_bytes("fwd")
    rec.update(tail or {})
    o.steps[blk.layer] = rec["step"] + 1
    o.stats.append(rec)
    meta = torch.tensor([rec["step"], int(rec.get("keep_rule") == "by-rank")], dtype=torch.int64)
    if train:
        layer.hold(rec)
    call.record(rec, "fwd")
    rec["fwd_comm_seconds"] = g.comm_s
    return meta


def _bwd_stats(o, g: "Group", rec: Dict[str, Any], b, R: int, keep: torch.Tensor,
               w: Optional[torch.Tensor], prob: Optional[torch.Tensor]) -> None:
    """The backward's stats record, CPU and device paths alike: kept and
    moved pairs, the bytes of its all-to-alls and moves, and the keep mask
    (with select="sample" the pair weights and probabilities too)."""
    rec["kept"], rec["moved"] = int(R), b.get("moved")
    rec["bwd_a2a_bytes"] = g.sent_bytes("bwd")
    rec["bwd_move_bytes"] = g.moved.get("bwd", 0)
    if o.keep_masks:
        rec["keep"] = keep.numpy().astype(bool)
        if w is not None:
            rec["pair_weight"] = w.numpy().copy()
            rec["pair_prob"] = prob.numpy().copy()


def capacity_keep(layer, topk_ids, topk_weights):
    """The capacity planner's keep mask (lrmoe.torch.capacity_keep) as rank
    r: the routing is all-gathered and every rank runs liblrmoe's
    lrmoe_capacity_keep on all T tokens (the capacity is per expert over the
    whole batch), the simulated run's mask; this rank's rows of it."""
    o, blk = layer.owner, layer.block
    g: Group = o.dist
    T, K = topk_ids.shape
    Tr, lo = g.tokens(blk.name, T)
    ids = topk_ids.detach().to(torch.int32).contiguous()
    w = topk_weights.detach().to(torch.float32).contiguous()
    ga = g.gather_rows(f"{blk.name}: capacity routing", torch.cat([ids, w.view(torch.int32)], 1),
                       Tr)
    keep = o.capacity_keep(ga[:, :K], ga[:, K:].contiguous().view(torch.float32), blk.E)
    return torch.from_numpy(np.ascontiguousarray(keep[lo:lo + T]))


def forward(layer, hidden, topk_weights, gate_up, down, topk_ids, cap_keep, train):
    """experts_forward (lrmoe.torch) as rank r of the group."""
    from . import torch as lt
    o, call, blk = layer.owner, lt._Call(), layer.block
    g: Group = o.dist
    dt = lt._act_dtype(blk.name, hidden, gate_up, down)
    lt._check_call(blk.name, blk.E, blk.D, blk.F, hidden, topk_ids, topk_weights, gate_up, down,
                   Ew=layer.experts_held())
    T, D = hidden.shape
    E, F, K, P = blk.E, blk.F, topk_ids.shape[1], o.ranks
    x, ids, alpha = lt._pairs(hidden, topk_ids, topk_weights)
    _finite(call, dt, x, "hidden", blk.name)
    _finite(call, "F32", alpha, "topk_weights", blk.name)
    Tr, lo, Tg, gids, galpha = g.routing(blk.name, T, K, ids, alpha)
    placement, fwd_alloc, quota, bwd_alloc, attrs, pr = _plan_assign(layer, call, gids, Tg, dt)
    W, keep_alive = lt._exec_weights(layer, gate_up, down, dt, placement, fwd_alloc, True, call,
                                     g.rank)
    dims = dict(T=Tg, E=E, K=K, D=D, F=F, P=P)
    Pl = dict(placement=placement.ctypes.data, fwd_alloc=fwd_alloc.ctypes.data)
    xg = torch.empty(Tg, D, dtype=hidden.dtype)
    xg[lo:lo + T] = x
    out = torch.empty(Tg, D, dtype=hidden.dtype)
    prs = torch.empty(Tg, K, dtype=torch.int32)
    n = Tg if train else 0
    phi, sg, su, po = lt._saved_buffers(n, K, F, D, hidden.dtype)
    tr = (lambda t: t.data_ptr()) if train else (lambda t: None)
    a = _lib.ExecArgs(g.cfg(o.cfg), dims, W, Pl, act_dtype=_lib.DT[dt], hidden=xg.data_ptr(),
                      topk_ids=gids.data_ptr(), topk_weights=galpha.data_ptr(),
                      output=out.data_ptr(), pair_rank=prs.data_ptr(), phi_sqnorm=tr(phi),
                      saved_gate=tr(sg), saved_up=tr(su), pair_out=tr(po))
    tim = (ctypes.c_double * (P * lt._STAGES))()
    g.phase, g.sent, g.moved = "fwd", [], {}
    call(g.run, f"{blk.name}: forward", lib.lrmoe_exec_args_forward, a.h, tim)
    del keep_alive
    if train:  # ||phi||^2 where the pair ran -> its token's owner, who scores it
        u = np.arange(Tg * K, dtype=np.int64)
        g.move(f"{blk.name}: phi", phi.view(Tg * K, 1), u, pr.reshape(-1).astype(np.int64),
             g.owners(Tg, u // K))
    meta = _fwd_stats(layer, call, Tg, K, T, attrs, train,
                      tail={"fwd_move_bytes": g.moved.get("fwd", 0)})
    k0, k1 = lo * K, (lo + T) * K
    return (out[lo:lo + T], torch.from_numpy(pr), phi.view(-1)[k0:k1].view(T, K) if train else phi,
            sg, su, po.view(-1, D)[k0:k1].view(T, K, D) if train else po,
            torch.from_numpy(placement), torch.from_numpy(fwd_alloc), torch.from_numpy(quota),
            torch.from_numpy(bwd_alloc), meta)


def _keep(o, call, blk, g: "Group", Tr, gids, galpha, cap_keep, pair_rank, quota, bwd_alloc,
          by_rank, seed, gdt, own_scores):
    """The backward's keep mask over all Tg tokens, the same on every rank
    (liblrmoe's selection on the all-gathered scores or capacity mask), the
    routing weights the kept rows are scaled by (alpha_b) and, with
    select="sample", the pair weights and probabilities (w, prob; else
    None). own_scores(): this rank's (T,K) F32 host scores."""
    from . import torch as lt
    Tg, K = gids.shape
    E, P, D = blk.E, o.ranks, blk.D
    keep = torch.empty(Tg, K, dtype=torch.uint8)
    load = np.empty(E, np.int64)
    alpha_b, w, prob = galpha, None, None
    pr_p = pair_rank.data_ptr()
    if cap_keep is not None:
        # capacity-factor dropping: backward keeps exactly the forward's
        # pairs, every rank's mask rows gathered (1 byte a pair); no scores
        keep = g.gather_rows(f"{blk.name}: capacity keep",
                             cap_keep.to("cpu", torch.uint8).contiguous(), Tr)
        kq = np.bincount(gids.view(-1).long().numpy()[keep.view(-1).numpy() > 0], minlength=E)
        if not np.array_equal(kq, quota):
            raise Error(f"{blk.name}: the capacity plan's quotas are not the forward's kept "
                        "pairs per expert")
        return keep, alpha_b, w, prob
    # scores where g_t is, then every rank's to every rank (4 bytes a pair)
    if o.metric_name in ("random", "uniform"):  # no g: the global pair index only
        gscore = torch.empty(Tg, K, dtype=torch.float32)
        check(call(lib.lrmoe_score_pairs_dt, o.metric, Tg, K, D, _lib.DT[gdt], None,
                   galpha.data_ptr(), None, seed, gscore.data_ptr()), "score")
    else:
        gscore = g.gather_rows(f"{blk.name}: scores", own_scores(), Tr)
    if o.select == lt._SAMPLE:
        w = torch.empty(Tg, K, dtype=torch.float32)
        prob = torch.empty(Tg, K, dtype=torch.float32) if o.keep_masks else None
        pp_ = prob.data_ptr() if prob is not None else None
        if by_rank:
            check(call(lib.lrmoe_score_sample_by_rank, Tg, K, E, P, gids.data_ptr(),
                       gscore.data_ptr(), pr_p, bwd_alloc.ctypes.data, seed, keep.data_ptr(),
                       w.data_ptr(), pp_, load.ctypes.data, None), "select")
        else:
            check(call(lib.lrmoe_score_sample, Tg, K, E, gids.data_ptr(), gscore.data_ptr(),
                       quota.ctypes.data, -1.0, seed, keep.data_ptr(), w.data_ptr(), pp_,
                       load.ctypes.data, None), "select")
        alpha_b = torch.empty(Tg, K, dtype=torch.float32)
        lib.lrmoe_score_weighted_alpha(Tg * K, galpha.data_ptr(), w.data_ptr(),
                                       alpha_b.data_ptr())
    elif by_rank:
        check(call(lib.lrmoe_score_select_by_rank, Tg, K, E, P, gids.data_ptr(),
                   gscore.data_ptr(), pr_p, bwd_alloc.ctypes.data, keep.data_ptr(),
                   load.ctypes.data, None), "select")
    else:
        check(call(lib.lrmoe_score_select, Tg, K, E, gids.data_ptr(), gscore.data_ptr(),
                   quota.ctypes.data, -1.0, keep.data_ptr(), load.ctypes.data, None), "select")
    return keep, alpha_b, w, prob


def backward(layer, grad_out, hidden, topk_weights, gate_up, down, topk_ids, cap_keep,
             pair_rank, phi, sg, su, pair_out, placement, fwd_alloc, quota, bwd_alloc, meta):
    """experts_backward (lrmoe.torch) as rank r of the group: pair_rank, sg
    and su are global-shaped (the forward's rows where each pair ran), phi
    and pair_out this rank's tokens'."""
    from . import torch as lt
    o, call, blk = layer.owner, lt._Call(), layer.block
    g: Group = o.dist
    step, by_rank = (int(v) for v in meta.tolist())
    rec = layer.release(step)
    dt = lt._act_dtype(blk.name, hidden, gate_up, down)
    T, D = hidden.shape
    E, F, K, P = blk.E, blk.F, topk_ids.shape[1], o.ranks
    c = torch.Tensor.contiguous
    x, ids, alpha = lt._pairs(hidden, topk_ids, topk_weights)
    pair_rank, phi, sg, su, pair_out = c(pair_rank), c(phi), c(sg), c(su), c(pair_out)
    placement, fwd_alloc, quota, bwd_alloc = lt._plan_arrays(placement, fwd_alloc, quota,
                                                              bwd_alloc)
    gr = grad_out.contiguous()
    gdt = lt._TORCH_DT.get(gr.dtype)
    if gdt is None:
        gr, gdt = gr.float(), "F32"
    _finite(call, gdt, gr, "grad_output", blk.name)
    g.phase, g.sent, g.moved = "bwd", [], {}
    Tr, lo, Tg, gids, galpha = g.routing(blk.name, T, K, ids, alpha)
    seed = o.seed + step

    def own_scores():  # this rank's pairs' scores, where g_t is (host arrays)
        score = torch.empty(T, K, dtype=torch.float32)
        check(call(lib.lrmoe_score_pairs_dt, o.metric, T, K, D, _lib.DT[gdt], gr.data_ptr(),
                   alpha.data_ptr(), phi.data_ptr(), seed, score.data_ptr()), "score")
        return score

    keep, alpha_b, w, prob = _keep(o, call, blk, g, Tr, gids, galpha, cap_keep, pair_rank,
                                   quota, bwd_alloc, by_rank, seed, gdt, own_scores)
    W, keep_alive = lt._exec_weights(layer, gate_up, down, dt, placement, fwd_alloc, False,
                                     rank=g.rank)
    b, R, upair, urank = _pack(call, g.cfg(o.cfg), dict(T=Tg, E=E, K=K, D=D, F=F, P=P), W,
                               placement, fwd_alloc, gids, keep, pair_rank, bwd_alloc, quota)
    # the saved state of kept pairs to their backward rank, the hidden
    # rows it lacks from the token's owner
    qrank = pair_rank.numpy().reshape(-1)[upair].astype(np.int64)
    g.move(f"{blk.name}: saved_gate", sg.view(Tg * K, F), upair, qrank, urank)
    g.move(f"{blk.name}: saved_up", su.view(Tg * K, F), upair, qrank, urank)
    xg = torch.empty(Tg, D, dtype=hidden.dtype)
    xg[lo:lo + T] = x
    tp = np.unique((upair // K) * P + urank)
    g.move(f"{blk.name}: hidden", xg, tp // P, g.owners(Tg, tp // P), tp % P)
    gg = torch.empty(Tg, D, dtype=gr.dtype)
    gg[lo:lo + T] = gr
    if (pair_out.untyped_storage().nbytes() == Tg * K * D * pair_out.element_size() and
            pair_out.storage_offset() == lo * K * D):
        # the forward's global-shaped buffer, of which pair_out is this
        # rank's rows (as saved; a saved-tensor hook may have moved it)
        pog = pair_out.as_strided((Tg, K, D), (K * D, D, 1), 0)
    else:
        pog = torch.empty(Tg, K, D, dtype=hidden.dtype)
        pog[lo:lo + T] = pair_out
    gh = torch.empty(Tg, D, dtype=torch.float32)
    gwg, gwu = o.scratch_grad(E, F, D)
    # float32 or sharded: zero-filled pages, of which liblrmoe writes the
    # native experts' rows only (the others cost no memory and no zeroing)
    gwd = (lt._virtual((E, D, F)) if layer.shard is not None or gate_up.dtype == torch.float32
           else torch.empty(E, D, F, dtype=torch.float32))
    gtw = torch.empty(Tg, K, dtype=torch.float32)
    b.set(mode=2, act_dtype=_lib.DT[dt], grad_dtype=_lib.DT[gdt],
          topk_weights=alpha_b.data_ptr(), grad_output=gg.data_ptr(), pair_out=pog.data_ptr(),
          hidden=xg.data_ptr(), saved_gate=sg.data_ptr(), saved_up=su.data_ptr(),
          grad_hidden=gh.data_ptr(), grad_w_gate=gwg.data_ptr(), grad_w_up=gwu.data_ptr(),
          grad_w_down=gwd.data_ptr(), grad_topk_weights=gtw.data_ptr())
    tim = (ctypes.c_double * (P * lt._STAGES))()
    call(g.run, f"{blk.name}: backward", lib.lrmoe_exec_args_backward, b.h, tim)
    del keep_alive
    _bwd_stats(o, g, rec, b, R, keep, w, prob)
    # the weight gradients of this rank's native experts; the others' owners
    # train them (zero here; sharded, the parameters are the native rows)
    wdt = gate_up.dtype
    if layer.shard is not None:  # the shard's rows, the only ones liblrmoe wrote
        s0, s1 = layer.shard
        gate_up_grad = torch.cat([gwg[s0:s1], gwu[s0:s1]], dim=1).to(wdt)
        down_grad = gwd[s0:s1].to(wdt, copy=True)
    else:  # the native experts are one range [s0, s1) (lrmoe_exec_native)
        nat = np.nonzero(np.array([lib.lrmoe_exec_native(e, E, P) for e in range(E)]) ==
                         g.rank)[0]
        s0, s1 = int(nat[0]), int(nat[-1]) + 1
        if wdt == torch.float32:  # zero-filled pages (_virtual): the others' rows are 0
            gate_up_grad, down_grad = lt._virtual((E, 2 * F, D)), gwd
        else:
            gate_up_grad = torch.empty(E, 2 * F, D, dtype=wdt)
            for t in (gate_up_grad, gwd):
                t[:s0].zero_()
                t[s1:].zero_()
            down_grad = gwd.to(wdt)
        gate_up_grad[s0:s1, :F] = gwg[s0:s1]
        gate_up_grad[s0:s1, F:] = gwu[s0:s1]
    call.record(rec, "bwd")
    rec["bwd_comm_seconds"] = g.comm_s
    return (gh[lo:lo + T].to(hidden.dtype), gtw[lo:lo + T].to(topk_weights.dtype),
            gate_up_grad, down_grad)


# ------------------------------------------------------------ CUDA tensors
# group= with CUDA tensors: rank r's CUDA executor (lrmoe_exec_cuda_new on
# this process's device, the group's callback communicator: one rank, its
# all-to-alls and p2p through torch.distributed on device memory, NCCL on
# GPUs) in device-pointer mode; the plan, selection and pack layout as above
# on host arrays. The executor returns the outputs and the saved state
# (||phi||^2, h_g, h_u) to the token owners, so the backward's moves carry
# the packed rows (x_t, h_g, h_u of each kept pair) from the owner to the
# pair's backward rank. shard=True: the rank's parameters, its layer's
# device weight copies and its weight gradients are the native experts'
# rows [lo, hi) only, handed to the executor as rows of global arrays
# (lt._dptr's lo: it addresses no other row, lrmoe_exec_cuda_new(3));
# replicas get their weights from the owner and return their gradients to
# it through the p2p callbacks, as unsharded.

def _device_cfg(o, g: "Group", idx: int) -> Dict[str, Any]:
    from . import torch as lt
    return g.cfg(lt._cuda_cfg(o, idx))


def device_forward(layer, idx, hidden, topk_weights, gate_up, down, topk_ids, cap_keep, train):
    """experts_forward as rank r of the group on CUDA tensors."""
    from . import torch as lt
    o, call, blk = layer.owner, lt._Call(), layer.block
    g: Group = o.dist
    dt = lt._act_dtype(blk.name, hidden, gate_up, down)
    lt._check_call(blk.name, blk.E, blk.D, blk.F, hidden, topk_ids, topk_weights, gate_up, down,
                   ids_range=False, Ew=layer.experts_held())
    cu = lt._cuda_of(layer, idx)
    g.dev = None if cu.fake else hidden.device
    T, D = hidden.shape
    E, F, K, P = blk.E, blk.F, topk_ids.shape[1], o.ranks
    dev = hidden.device
    x = hidden.detach().contiguous()
    ids_h = topk_ids.detach().to("cpu")
    lt._check_ids(blk.name, ids_h, E)
    ids = ids_h.to(torch.int32).contiguous()
    alpha = topk_weights.detach().to("cpu", torch.float32).contiguous()
    d2h = ids_h.numel() * ids_h.element_size() + alpha.numel() * 4
    Tr, lo, Tg, gids, galpha = g.routing(blk.name, T, K, ids, alpha)
    placement, fwd_alloc, quota, bwd_alloc, attrs, pr = _plan_assign(layer, call, gids, Tg, dt)
    W = g.device_weights(layer, cu, gate_up, down, dt)
    dims = dict(T=Tg, E=E, K=K, D=D, F=F, P=P)
    Pl = dict(placement=placement.ctypes.data, fwd_alloc=fwd_alloc.ctypes.data)
    xg = torch.empty(Tg, D, dtype=hidden.dtype, device=dev)
    xg[lo:lo + T] = x
    out = torch.empty(Tg, D, dtype=hidden.dtype, device=dev)
    prs = torch.empty(Tg, K, dtype=torch.int32)
    n = Tg if train else 0
    phi = torch.empty(n, K, dtype=torch.float32, device=dev)
    sg = torch.empty(n, K, F, dtype=hidden.dtype, device=dev)
    su = torch.empty(n, K, F, dtype=hidden.dtype, device=dev)
    po = torch.empty(n, K, D, dtype=hidden.dtype, device=dev)
    q = lambda nm, t: lt._dptr(nm, t, idx, cu.fake)  # noqa: E731
    tr = (lambda nm, t: q(nm, t)) if train else (lambda nm, t: None)
    a = _lib.ExecArgs(_device_cfg(o, g, idx), dims, W, Pl, act_dtype=_lib.DT[dt],
                      hidden=q("hidden", xg), topk_ids=gids.data_ptr(),
                      topk_weights=galpha.data_ptr(), output=q("output", out),
                      pair_rank=prs.data_ptr(), phi_sqnorm=tr("phi_sqnorm", phi),
                      saved_gate=tr("saved_gate", sg), saved_up=tr("saved_up", su),
                      pair_out=tr("pair_out", po))
    g.phase, g.sent, g.moved = "fwd", [], {}
    xh = cu.executor(a)
    call(g.run, f"{blk.name}: forward", lib.lrmoe_exec_args_forward_cuda, a.h, xh, None)
    meta = _fwd_stats(layer, call, Tg, K, T, attrs, train,
                      head={"device": str(dev), "fwd_d2h_bytes": d2h, "fwd_h2d_bytes": 0})
    own = (lambda t: t[lo:lo + T].clone()) if train else (lambda t: t)
    return (out[lo:lo + T], torch.from_numpy(pr), own(phi), own(sg), own(su), own(po),
            torch.from_numpy(placement), torch.from_numpy(fwd_alloc), torch.from_numpy(quota),
            torch.from_numpy(bwd_alloc), meta)


def device_backward(layer, idx, grad_out, hidden, topk_weights, gate_up, down, topk_ids,
                    cap_keep, pair_rank, phi, sg, su, pair_out, placement, fwd_alloc, quota,
                    bwd_alloc, meta):
    """experts_backward as rank r of the group on CUDA tensors: pair_rank
    is global (Tg,K) on the host, phi, sg, su and pair_out this rank's
    tokens' (device). The weight gradients: (E,...) with the other experts'
    rows zero, or sharded the native rows (the parameters' shapes)."""
    from . import torch as lt
    o, call, blk = layer.owner, lt._Call(), layer.block
    g: Group = o.dist
    cu = lt._cuda_of(layer, idx)
    g.dev = None if cu.fake else hidden.device
    step, by_rank = (int(v) for v in meta.tolist())
    rec = layer.release(step)
    dt = lt._act_dtype(blk.name, hidden, gate_up, down)
    T, D = hidden.shape
    E, F, K, P = blk.E, blk.F, topk_ids.shape[1], o.ranks
    dev = hidden.device
    c = torch.Tensor.contiguous
    x, phi, sg, su, pair_out = c(hidden.detach()), c(phi), c(sg), c(su), c(pair_out)
    pair_rank = pair_rank.to("cpu").contiguous()
    ids = topk_ids.detach().to("cpu").to(torch.int32).contiguous()
    alpha = topk_weights.detach().to("cpu", torch.float32).contiguous()
    placement, fwd_alloc, quota, bwd_alloc = lt._plan_arrays(placement.cpu(), fwd_alloc.cpu(),
                                                              quota.cpu(), bwd_alloc.cpu())
    gr = grad_out.contiguous()
    gdt = lt._TORCH_DT.get(gr.dtype)
    if gdt is None:
        gr, gdt = gr.float(), "F32"
    if tuple(gr.shape) != (T, D):
        raise Error(f"{blk.name}: grad_output has shape {tuple(gr.shape)}, expected {(T, D)}")
    g.phase, g.sent, g.moved = "bwd", [], {}
    Tr, lo, Tg, gids, galpha = g.routing(blk.name, T, K, ids, alpha)
    seed = o.seed + step

    def own_scores():  # on the device where lrmoe_exec_cuda_score has the metric
        s, _, _ = lt._score_device(o, cu, call, blk, T, K, D, gdt, gr, topk_weights, alpha, phi,
                                   seed)
        return s

    keep, alpha_b, w, prob = _keep(o, call, blk, g, Tr, gids, galpha, cap_keep, pair_rank,
                                   quota, bwd_alloc, by_rank, seed, gdt, own_scores)
    W = g.device_weights(layer, cu, gate_up, down, dt)
    b, R, upair, urank = _pack(call, _device_cfg(o, g, idx), dict(T=Tg, E=E, K=K, D=D, F=F, P=P),
                               W, placement, fwd_alloc, gids, keep, pair_rank, bwd_alloc, quota)
    # the packed rows (global-shaped, R rows): the owner fills its pairs'
    # rows as lrmoe-pack gathers them (x_t, h_g, h_u; alpha_b[u] g_t in F32),
    # then x_t, h_g, h_u move to the pair's backward rank
    owner = g.owners(Tg, upair // K)
    mine = np.nonzero(owner == g.rank)[0]
    u_d = torch.from_numpy(upair[mine] - lo * K).to(dev)
    i_d = torch.from_numpy(mine).to(dev)
    t_d = torch.div(u_d, K, rounding_mode="floor")
    a_d = alpha_b.view(-1).index_select(0, torch.from_numpy(upair[mine])).to(dev)
    Rn = max(R, 1)  # no kept row: non-NULL empty buffers
    pk_hidden = torch.empty(Rn, D, dtype=x.dtype, device=dev)
    pk_gate = torch.empty(Rn, F, dtype=x.dtype, device=dev)
    pk_up = torch.empty(Rn, F, dtype=x.dtype, device=dev)
    pk_grad = torch.empty(Rn, D, dtype=torch.float32, device=dev)
    pk_hidden.index_copy_(0, i_d, x.index_select(0, t_d))
    pk_gate.index_copy_(0, i_d, sg.view(T * K, F).index_select(0, u_d))
    pk_up.index_copy_(0, i_d, su.view(T * K, F).index_select(0, u_d))
    pk_grad.index_copy_(0, i_d, gr.index_select(0, t_d).float() * a_d.unsqueeze(1))
    ri = np.arange(R, dtype=np.int64)
    for nm, t in (("hidden", pk_hidden), ("saved_gate", pk_gate), ("saved_up", pk_up)):
        g.move(f"{blk.name}: {nm}", t[:R], ri, owner, urank)
    # global-shaped arrays with this rank's token rows
    xg = torch.empty(Tg, D, dtype=x.dtype, device=dev)
    xg[lo:lo + T] = x
    gg = torch.empty(Tg, D, dtype=gr.dtype, device=dev)
    gg[lo:lo + T] = gr
    pog = torch.empty(Tg, K, D, dtype=x.dtype, device=dev)
    pog[lo:lo + T] = pair_out
    sgg = torch.empty(Tg, K, F, dtype=x.dtype, device=dev)
    sgg[lo:lo + T] = sg
    sug = torch.empty(Tg, K, F, dtype=x.dtype, device=dev)
    sug[lo:lo + T] = su
    f32 = dict(dtype=torch.float32, device=dev)
    gh, gtw = torch.empty(Tg, D, **f32), torch.empty(Tg, K, **f32)
    # the weight gradients: the executor writes its native experts' rows
    # only (the replicas' come back to it by p2p and are summed there);
    # sharded, the arrays are the shard's rows [s0, s1), addressed as rows
    # of global (E,...) arrays (lt._dptr's lo), unsharded global arrays
    s0, s1 = layer.shard if layer.shard is not None else (0, E)
    gwg, gwu = torch.empty(s1 - s0, F, D, **f32), torch.empty(s1 - s0, F, D, **f32)
    gwd = torch.empty(s1 - s0, D, F, **f32)
    q = lambda nm, t: lt._dptr(nm, t, idx, cu.fake)  # noqa: E731
    qw = lambda nm, t: lt._dptr(nm, t, idx, cu.fake, s0)  # noqa: E731
    b.set(mode=2, act_dtype=_lib.DT[dt], grad_dtype=_lib.DT[gdt],
          topk_weights=alpha_b.data_ptr(), grad_output=q("grad_output", gg),
          pair_out=q("pair_out", pog), hidden=q("hidden", xg), saved_gate=q("saved_gate", sgg),
          saved_up=q("saved_up", sug), pack_grad=q("pack_grad", pk_grad),
          pack_hidden=q("pack_hidden", pk_hidden), pack_gate=q("pack_gate", pk_gate),
          pack_up=q("pack_up", pk_up), grad_hidden=q("grad_hidden", gh),
          grad_w_gate=qw("grad_w_gate", gwg), grad_w_up=qw("grad_w_up", gwu),
          grad_w_down=qw("grad_w_down", gwd), grad_topk_weights=q("grad_topk_weights", gtw))
    xh = cu.executor(b)
    call(g.run, f"{blk.name}: backward", lib.lrmoe_exec_args_backward_cuda, b.h, xh, None)
    _bwd_stats(o, g, rec, b, R, keep, w, prob)
    if layer.shard is None:
        # the weight gradients of this rank's native experts (the others' zero)
        nat = np.array([lib.lrmoe_exec_native(e, E, P) for e in range(E)]) == g.rank
        other = torch.from_numpy(np.nonzero(~nat)[0]).to(dev)
        for t in (gwg, gwu, gwd):
            t.index_fill_(0, other, 0.0)
    wdt = gate_up.dtype
    call.record(rec, "bwd")
    rec["bwd_comm_seconds"] = g.comm_s
    return (gh[lo:lo + T].to(hidden.dtype), gtw[lo:lo + T].to(topk_weights.dtype),
            torch.cat([gwg, gwu], dim=1).to(wdt), gwd.to(wdt))
