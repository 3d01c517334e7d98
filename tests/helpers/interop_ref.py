"""Reference-library side of tests/interop.bats: NumPy's own .npy files and the
PyPI `safetensors` package, independent of liblrmoe.

    python3 interop_ref.py npy-make DIR        write .npy files of every dtype
    python3 interop_ref.py npy-check SRC OUT   np.load OUT/f000.NAME.npy == SRC/NAME.npy
    python3 interop_ref.py st-make FILE        safetensors package writes FILE
    python3 interop_ref.py st-check REF FILE   FILE holds the same tensors+metadata
"""
import glob
import os
import sys

import numpy as np
import safetensors

# name -> array; covers every NumPy dtype lrmoe maps, odd shapes, non-finite
# values and sizes that straddle the 64-byte header alignment.
def npy_arrays():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, 7)).astype(np.float32)
    x[0, 0], x[1, 1], x[2, 2] = np.nan, np.inf, -np.inf
    return {
        "bool": rng.integers(0, 2, (3, 4)).astype(np.bool_),
        "u8": rng.integers(0, 256, (17,), dtype=np.uint8),
        "i8": rng.integers(-128, 128, (2, 3, 4), dtype=np.int8),
        "u16": rng.integers(0, 65536, (9,), dtype=np.uint16),
        "i16": rng.integers(-32768, 32768, (3, 3), dtype=np.int16),
        "u32": rng.integers(0, 2**32, (4,), dtype=np.uint32),
        "i32": rng.integers(-2**31, 2**31, (2, 2, 2, 2), dtype=np.int32),
        "u64": np.array([0, 1, 2**63, 2**64 - 1], dtype=np.uint64),
        "i64": np.array([-2**63, -1, 0, 2**63 - 1], dtype=np.int64),
        "f16": rng.standard_normal((6, 6)).astype(np.float16),
        "f32": x,
        "f64": rng.standard_normal((3, 1, 5)),
        "scalar": np.array(2.5, dtype=np.float64),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "wide": rng.standard_normal((1, 2, 1, 2, 1, 2, 1, 2)).astype(np.float32),
        "big": rng.standard_normal((123457,)).astype(np.float32),
    }


def npy_make(d):
    os.makedirs(d, exist_ok=True)
    for name, a in npy_arrays().items():
        np.save(os.path.join(d, name + ".npy"), a)


def npy_check(src, out):
    n = 0
    for path in sorted(glob.glob(os.path.join(src, "*.npy"))):
        name = os.path.basename(path)[:-4]
        ref = np.load(path)
        got = np.load(os.path.join(out, "f000.%s.npy" % name))
        assert got.dtype == ref.dtype, (name, got.dtype, ref.dtype)
        assert got.shape == ref.shape, (name, got.shape, ref.shape)
        assert got.flags.c_contiguous
        assert got.tobytes() == ref.tobytes(), name
        n += 1
    assert n > 0
    print("npy-check: %d arrays byte-identical" % n)


def st_serialize(tensors, metadata):
    """The reference package's writer for raw (dtype, shape, bytes) tensors:
    BF16 included, which safetensors.numpy cannot express."""
    keep = []
    if hasattr(safetensors, "TensorSpec"):
        spec = {}
        for name, (dt, shape, raw) in tensors.items():
            buf = np.frombuffer(raw, dtype=np.uint8).copy()
            keep.append(buf)
            spec[name] = safetensors.TensorSpec(dtype=dt, shape=list(shape),
                                                data_ptr=buf.ctypes.data,
                                                data_len=buf.nbytes)
        return bytes(safetensors.serialize(spec, metadata=metadata))
    spec = {name: {"dtype": dt, "shape": list(shape), "data": raw}
            for name, (dt, shape, raw) in tensors.items()}
    return bytes(safetensors.serialize(spec, metadata=metadata))


def st_tensors():
    rng = np.random.default_rng(11)
    bf = rng.integers(0, 65536, (4, 8), dtype=np.uint16)
    return {
        "hidden": ("bfloat16", (4, 8), bf.tobytes()),
        "router_logits": ("float32", (4, 3), rng.standard_normal((4, 3)).astype(np.float32).tobytes()),
        "topk_ids": ("int32", (4, 2), rng.integers(0, 3, (4, 2), dtype=np.int32).tobytes()),
        "load": ("int64", (3,), np.array([5, 0, 3], np.int64).tobytes()),
        "keep": ("bool", (4, 2), rng.integers(0, 2, (4, 2)).astype(np.bool_).tobytes()),
        "half": ("float16", (2,), np.array([1.5, -0.25], np.float16).tobytes()),
        "dbl": ("float64", (), np.array(3.25).tobytes()),
        "u8": ("uint8", (5,), bytes([0, 1, 2, 254, 255])),
    }


def st_make(path):
    data = st_serialize(st_tensors(), {"layer": "3", "step": "17", "note": "from safetensors"})
    with open(path, "wb") as f:
        f.write(data)


def st_load(path):
    """name -> (DTYPE, shape, bytes), metadata; parsed by the reference package."""
    with open(path, "rb") as f:
        data = f.read()
    out = {name: (t["dtype"], tuple(t["shape"]), bytes(t["data"]))
           for name, t in safetensors.deserialize(data)}
    with safetensors.safe_open(path, "np") as f:
        meta = f.metadata() or {}
    return out, meta


def st_check(ref, path):
    a, ma = st_load(ref)
    b, mb = st_load(path)
    assert a == b, sorted(set(a.items()) ^ set(b.items()))
    assert ma == mb, (ma, mb)
    # and the package's NumPy front end loads every tensor NumPy can express
    with safetensors.safe_open(path, "np") as f:
        for name, (dt, shape, raw) in b.items():
            if dt != "BF16":
                arr = f.get_tensor(name)
                assert arr.shape == shape and arr.tobytes() == raw, name
    print("st-check: %d tensors and %d metadata keys identical" % (len(b), len(mb)))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "npy-make":
        npy_make(sys.argv[2])
    elif cmd == "npy-check":
        npy_check(sys.argv[2], sys.argv[3])
    elif cmd == "st-make":
        st_make(sys.argv[2])
    elif cmd == "st-check":
        st_check(sys.argv[2], sys.argv[3])
    else:
        sys.exit("unknown command " + cmd)
