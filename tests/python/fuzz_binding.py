"""The property test of the Python binding (run by test_fuzz.py in a child
interpreter, so that a crash fails the test instead of killing the runner):
every public function of lrmoe (and the patched experts of lrmoe.torch when
torch is installed), called with random dtypes, shapes, strides, sizes and
huge integers, returns a result or raises lrmoe.Error, nothing else.

usage: fuzz_binding.py DIR EXAMPLES   (DIR holds w.lrm: a weights stream of
E=8, K=2, D=16, F=8, and r.lrm: a routed frame of it)
The examples are the same on every run (hypothesis' derandomize), so that
the suite passes or fails alike everywhere; LRMOE_FUZZ_RANDOM=1 draws new
ones each run, to explore (as make fuzz does for the C harnesses)."""
import os
import sys
import traceback

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

import lrmoe

D_, N = sys.argv[1], int(sys.argv[2])
W = os.path.join(D_, "w.lrm")
R = lrmoe.read(os.path.join(D_, "r.lrm"))[0]

HUGE = [2**31 - 1, 2**31, 2**32 + 2, 2**63 - 1, 2**63, 2**64, -1, -2**31 - 1, -2**63 - 1,
        -2**64]
ints = st.one_of(st.integers(-2, 12), st.sampled_from(HUGE))
reals = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 200),
                  st.sampled_from([2**64, -2**70]))
DTYPES = [np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.int32, np.uint32, np.int64,
          np.uint64, np.float16, np.float32, np.float64, np.complex64, object]


@st.composite
def arrays(draw, ndim=None, dims=None):
    """A random array: any dtype (object and complex included), shape,
    values (huge, NaN, out of range), contiguous or not."""
    dt = draw(st.sampled_from(DTYPES))
    nd = draw(st.integers(0, 3)) if ndim is None else ndim
    shape = tuple(draw(st.integers(0, 7)) if dims is None else dims[i] for i in range(nd))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    v = rng.integers(-3, 20, size=shape).astype(np.float64)
    if draw(st.booleans()) and v.size:
        v.flat[rng.integers(0, v.size)] = draw(st.sampled_from(
            [np.nan, np.inf, -np.inf, 2.0**40, -2.0**33, 2.0**31 + 1]))
    with np.errstate(all="ignore"):
        a = v.astype(dt) if dt is not object else np.array(v, dtype=object)
    how = draw(st.sampled_from(["c", "c", "stride", "T", "F"]))
    if how == "stride" and a.ndim:
        a = np.repeat(a, 2, axis=0)[::2]
    elif how == "T":
        a = a.T
    elif how == "F":
        a = np.asfortranarray(a)
    return a


def plausible(draw, shape, dt):
    """An array of the right shape and dtype most of the time, else any."""
    if draw(st.integers(0, 3)):
        if not draw(st.booleans()):
            return np.zeros(shape, dt)
        v = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).integers(0, 9, size=shape)
        return v.astype(dt)
    return draw(arrays())


T, K, E = R["topk_ids"].shape[0], 2, 8
BAD = []


def call(name, fn):
    try:
        fn()
    except lrmoe.Error:
        pass
    except Exception:
        BAD.append(f"{name}: {traceback.format_exc()}")
        raise


SET = settings(max_examples=N, deadline=None, database=None,
               derandomize=os.environ.get("LRMOE_FUZZ_RANDOM", "0") in ("", "0"),
               suppress_health_check=list(HealthCheck))


@SET
@given(st.data())
def fuzz_route(data):
    d = data.draw
    a = d(arrays()) if d(st.booleans()) else d(arrays(ndim=2))
    call("route", lambda: lrmoe.route(
        a, k=d(ints), router=d(st.sampled_from(["softmax", "sigmoid", "topk-softmax", "x\0"])),
        groups=d(ints), topk_groups=d(ints), threads=d(ints), scale=d(reals),
        expert_bias=d(st.none() | arrays()),
        dtype=d(st.sampled_from([None, "F16", "F32", "F64", "BF16", "I32", "nope"]))))


@SET
@given(st.data())
def fuzz_plan(data):
    d = data.draw
    load = d(arrays())
    hidden = d(st.none() | arrays() | ints)
    opts = {k: d(st.none() | ints) for k in ("ffn", "tokens", "topk")}
    call("plan", lambda: lrmoe.plan(load, ranks=d(ints), topk_ids=d(st.none() | arrays()),
                                    hidden=hidden, **{k: v for k, v in opts.items() if v}))
    p = lrmoe.Planner(ranks=2, ffn=8)
    call("Planner.set", lambda: p.set(d(st.sampled_from(["rate", "hbm", "window", "x\0y"])),
                                      d(reals | ints | st.text(max_size=4))))
    call("Planner.run", lambda: p.run(d(arrays()), layer=d(st.none() | ints)))
    p.close()
    call("Planner.run closed", lambda: p.run(np.ones(8, np.int64)))


@SET
@given(st.data())
def fuzz_score_pack(data):
    d = data.draw
    ids = plausible(d, (T, K), np.int32)
    tw = plausible(d, (T, K), np.float32)
    g = plausible(d, (T, 16), np.float32)
    q = d(st.none() | arrays())
    call("score", lambda: lrmoe.score(ids, tw, g, phi_sqnorm=d(st.none() | arrays()),
                                      quota=q, drop=d(st.none() | reals), seed=d(ints),
                                      index=d(ints),
                                      metric=d(st.sampled_from(["lrm", "random", "nope"])),
                                      select=d(st.sampled_from(["topk", "sample", "x"]))))
    keep, h = plausible(d, (T, K), np.uint8), plausible(d, (T, 16), np.float32)
    sg, su = plausible(d, (T, K, 8), np.float32), plausible(d, (T, K, 8), np.float32)
    call("pack", lambda: lrmoe.pack(keep, ids, tw, g, h, sg, su,
                                    pair_rank=d(st.none() | arrays()), ranks=d(ints),
                                    quota=q, alloc=d(st.sampled_from(["auto", "plan", 3]))))


@SET
@given(st.data())
def fuzz_capacity(data):
    d = data.draw
    call("capacity", lambda: lrmoe.capacity(d(ints), d(ints), d(ints), d(reals)))
    call("capacity_keep", lambda: lrmoe.capacity_keep(
        d(arrays()), d(st.none() | arrays()), d(ints), d(reals),
        policy=d(st.sampled_from(["probs", "position", "p\0"])), kept=d(st.booleans())))


@SET
@given(st.data())
def fuzz_exec(data):
    d = data.draw
    f = lrmoe.Frame(dict(R), dict(R.attrs))
    for name in d(st.lists(st.sampled_from(["hidden", "topk_ids", "topk_weights",
                                            "router_logits", "grad_output", "pair_out"]),
                           max_size=2)):
        f[name] = d(arrays())
    if d(st.booleans()):
        f.attrs["layer"] = str(d(ints))
    phase = d(st.sampled_from(["forward", "backward", "sideways"]))
    call("Exec.run", lambda: lrmoe.Exec(W, phase, ranks=d(ints), threads=d(st.integers(0, 2)),
                                        mode=d(st.sampled_from(["full", "compact"])))
         .run(f))
    call("forward", lambda: lrmoe.forward(f, W, ranks=d(ints), threads=d(ints)))


@SET
@given(st.data())
def fuzz_streams(data):
    d = data.draw
    path = os.path.join(D_, "fz.lrm")
    names = d(st.lists(st.text(max_size=3), max_size=3))
    fr = {n: d(arrays()) for n in names}
    attrs = {d(st.text(max_size=3)): d(st.text(max_size=3))}
    dtypes = {n: d(st.sampled_from(["F32", "BF16", "I8", "Q7", 5])) for n in names[:1]}

    def wr():
        with lrmoe.Writer(path, level=d(ints), threads=d(st.integers(-1, 2))) as w:
            w.write(fr, attrs=attrs, dtypes=dtypes)
        lrmoe.read(path, bf16=d(st.sampled_from(["f32", "raw"])))
    call("write/read", wr)
    call("bf16_to_f32", lambda: lrmoe.bf16_to_f32(d(arrays())))
    call("f32_to_bf16", lambda: lrmoe.f32_to_bf16(d(arrays())))
    call("Reader", lambda: lrmoe.read(d(st.sampled_from([path + "\0x", -3, 3.5, path]))))


def fuzz_torch():
    import torch
    import tiny
    blk = tiny.block("qwen3_moe")
    lrmoe.torch.patch(blk, ranks=2)
    ex = blk.experts
    TD = {np.float32: torch.float32, np.float64: torch.float64, np.int32: torch.int32,
          np.int64: torch.int64, np.uint8: torch.uint8, np.float16: torch.float16}

    def tensor(d, shape):
        dt = d(st.sampled_from(list(TD)))
        if d(st.integers(0, 2)):
            shape = tuple(s if d(st.integers(0, 3)) else d(st.integers(0, 40)) for s in shape)
        t = torch.from_numpy(np.ascontiguousarray(d(arrays(ndim=len(shape), dims=shape)))
                             .astype(dt, copy=False) if shape else np.zeros((), dt))
        big = d(st.sampled_from([0, 0, 2**31, -2**31, 2**40]))
        if big and t.numel() and not t.is_floating_point() and t.dtype != torch.uint8:
            t = t.to(torch.int64)
            t.view(-1)[0] = big
        return t.t() if t.dim() == 2 and d(st.booleans()) else t

    @SET
    @given(st.data())
    def run(data):
        d = data.draw
        T_ = d(st.integers(0, 9))
        x = tensor(d, (T_, tiny.D))
        ids = tensor(d, (T_, tiny.K))
        if not d(st.integers(0, 2)):
            ids = ids.clamp(0, tiny.E - 1) if not ids.is_floating_point() else ids
        w = tensor(d, (T_, tiny.K))

        def go():
            with torch.no_grad():
                ex(x, ids, w)
        call("patched experts", go)
    run()


if __name__ == "__main__":
    fns = [fuzz_route, fuzz_plan, fuzz_score_pack, fuzz_capacity, fuzz_exec, fuzz_streams]
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import lrmoe.torch  # noqa: F401
        fns.append(fuzz_torch)
    except ImportError:
        print("fuzz: no torch/transformers: the patched experts are left out")
    for fn in fns:
        try:
            fn()
        except Exception:
            pass
        print(f"fuzz: {fn.__name__}: done", flush=True)
    if BAD:
        print("\n".join(BAD[:3]))
        print(f"fuzz: {len(BAD)} calls raised something other than lrmoe.Error")
        sys.exit(1)
    print("fuzz: every call returned or raised lrmoe.Error")
