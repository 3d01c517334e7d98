"""Frames and streams (lrmoe-stream(5)) through liblrmoe's reader and writer.

A frame is a `Frame`: a dict of tensor name -> numpy array, plus `attrs`
(the string attributes of __metadata__) and `dtypes` (the stored dtype of
each tensor, "F32", "BF16", ...). NumPy has no bfloat16: a BF16 tensor is
read as its exact float32 widening (dtypes[name] stays "BF16", so writing
the frame back stores BF16 again, bit for bit), or as its raw uint16 bits
with read(..., bf16="raw").
"""
import ctypes
import os
from typing import IO, Any, Iterable, List, Mapping, Optional, Union

import numpy as np

from . import _lib
from ._lib import DT, DTYPES, Error, check, cstr, i32, lib

# a path, "-" (stdin/stdout), a file descriptor or an object with fileno()
PathOrFile = Union[str, "os.PathLike[str]", int, IO[Any]]
ArrayLike = Any  # what numpy.asarray takes

NP = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16,
      "U32": np.uint32, "I32": np.int32, "U64": np.uint64, "I64": np.int64,
      "F16": np.float16, "F32": np.float32, "F64": np.float64}
FROM_NP = {np.dtype(v).str: k for k, v in NP.items()}


class Frame(dict):
    """Tensors by name (numpy arrays) with .attrs (str -> str) and .dtypes."""

    def __init__(self, tensors: Optional[Mapping[str, Any]] = None,
                 attrs: Optional[Mapping[str, Any]] = None,
                 dtypes: Optional[Mapping[str, str]] = None) -> None:
        super().__init__(tensors or {})
        self.attrs = dict(attrs or {})
        self.dtypes = dict(dtypes or {})

    def __repr__(self):
        t = ", ".join(f"{k}: {self.dtype(k)}{list(v.shape)}" for k, v in self.items())
        return f"Frame({{{t}}}, attrs={self.attrs})"

    def dtype(self, name: str) -> str:
        """Stored dtype of a tensor: dtypes[name], else that of its array."""
        if name in self.dtypes:
            return self.dtypes[name]
        return dtype_of(self[name])


def _asarray(a, name="array"):
    try:
        return np.asarray(a)
    except (TypeError, ValueError, OverflowError) as e:
        raise Error(f"{name}: not an array ({e})") from None


def dtype_of(a):
    a = _asarray(a)
    k = FROM_NP.get(a.dtype.str)
    if k is None:
        raise Error(f"numpy dtype {a.dtype} has no lrmoe dtype")
    return k


def bf16_to_f32(bits: ArrayLike) -> np.ndarray:
    """uint16 BF16 bits -> float32 (exact), by the library's conversion."""
    x = _asarray(bits, "bits")
    if x.dtype != np.uint16:
        raise Error(f"bits: dtype {x.dtype}, expected uint16 (BF16 bits)")
    b = np.ascontiguousarray(x)
    out = np.empty(b.shape, np.float32)
    lib.lrmoe_convert_to_f32(DT["BF16"], _lib.buf("bits", b, "BF16", b.shape),
                             _lib.buf("out", out, "F32", b.shape, True), b.size)
    return out


def f32_to_bf16(x: ArrayLike) -> np.ndarray:
    """float32 -> uint16 BF16 bits, round to nearest even (the library's)."""
    a = _asarray(x, "x")
    if a.dtype.kind not in "fiub":
        raise Error(f"x: dtype {a.dtype}, expected numbers")
    x = np.ascontiguousarray(a, dtype=np.float32)
    out = np.empty(x.shape, np.uint16)
    lib.lrmoe_convert_from_f32(DT["BF16"], _lib.buf("x", x, "F32", x.shape),
                               _lib.buf("out", out, "BF16", x.shape, True), x.size)
    return out


# ------------------------------------------------------------ C frames

class CFrame:
    """An lrmoe_frame_t owned by Python (cleared when collected)."""

    def __init__(self, frame=None):
        self.f = _lib.Frame()
        lib.lrmoe_frame_init(ctypes.byref(self.f))
        if frame is not None:
            self.put_all(frame)

    def __del__(self):
        if lib is not None and getattr(self, "f", None) is not None:
            lib.lrmoe_frame_clear(ctypes.byref(self.f))

    @property
    def ref(self):
        return ctypes.byref(self.f)

    def put(self, name, a, dtype=None):
        """Copy array a into tensor name, stored as dtype (default: a's own;
        "BF16" converts float data, or takes uint16 bits as they are)."""
        if not isinstance(name, str):
            raise Error(f"tensor name {name!r}: not a string")
        a = _asarray(a, f"tensor {name}")
        if not isinstance(dtype, (str, type(None))) or (dtype is not None and dtype not in DT):
            raise Error(f"tensor {name}: unknown dtype {dtype!r}")
        dt = dtype or dtype_of(a)
        if a.ndim > _lib.MAX_DIMS:
            raise Error(f"tensor {name}: {a.ndim} dimensions (at most {_lib.MAX_DIMS})")
        if dt == "BF16":
            a = a if a.dtype == np.uint16 else f32_to_bf16(a)
        elif dtype_of(a) != dt:
            a = a.astype(NP[dt])
        a = np.ascontiguousarray(a)
        shape = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
        t = lib.lrmoe_frame_put(self.ref, cstr("tensor name", name), DT[dt], a.ndim, shape)
        if not t:
            check(-1, f"tensor {name}")
        # the library's tensor is shape's elements of dt: exactly a's bytes
        src = _lib.buf(f"tensor {name}", a, dt, a.shape)
        if t.contents.nbytes != a.nbytes:
            raise Error(f"tensor {name}: {t.contents.nbytes} bytes allocated for {a.nbytes}")
        if a.nbytes:
            ctypes.memmove(t.contents.data, src, a.nbytes)

    def put_all(self, frame):
        dts = getattr(frame, "dtypes", {})
        for k, v in frame.items():
            self.put(k, v, dts.get(k))
        for k, v in getattr(frame, "attrs", {}).items():
            check(lib.lrmoe_frame_set_attr(self.ref, cstr("attribute name", str(k)),
                                           cstr(f"attribute {k}", str(v))), f"attribute {k}")

    def names(self):
        f = self.f
        return [f.tensors[i].contents.name.decode() for i in range(f.ntensors)]

    def attrs(self):
        f = self.f
        return {f.keys[i].decode(): f.vals[i].decode() for i in range(f.nattrs)}

    def get(self, name, bf16="f32"):
        """(array copy, stored dtype) of tensor name, or None if absent."""
        t = lib.lrmoe_frame_get(self.ref, cstr("tensor name", name))
        if not t:
            return None
        return _array(t.contents, bf16)

    def to_frame(self, names=None, bf16="f32", attrs=None):
        out = Frame()
        f = self.f
        for i in range(f.ntensors):
            t = f.tensors[i].contents
            n = t.name.decode()
            if names is None or n in names:
                out[n], out.dtypes[n] = _array(t, bf16)
        a = self.attrs()
        out.attrs = a if attrs is None else {k: v for k, v in a.items() if k in attrs}
        return out


def _array(t, bf16):
    dt = DTYPES[t.dtype]
    shape = tuple(t.shape[i] for i in range(t.ndim))
    raw = np.empty(t.nbytes, np.uint8)
    if t.nbytes:
        ctypes.memmove(raw.ctypes.data, t.data, t.nbytes)
    if dt == "BF16":
        bits = raw.view(np.uint16).reshape(shape)
        return (bits if bf16 == "raw" else bf16_to_f32(bits)), dt
    return raw.view(NP[dt]).reshape(shape), dt


# ------------------------------------------------------------ streams

def _path(out):
    """A path, "-", an int file descriptor or an object with fileno()."""
    if isinstance(out, bool) or (isinstance(out, int) and out < 0):
        raise Error(f"path: {out!r} is not a file descriptor")
    if isinstance(out, int):
        return f"/dev/fd/{out}"
    if hasattr(out, "fileno") and not isinstance(out, (str, bytes, os.PathLike)):
        if hasattr(out, "flush"):
            out.flush()
        return f"/dev/fd/{out.fileno()}"
    try:
        p = os.fspath(out)
    except TypeError:
        raise Error(f"path: {out!r} is not a path") from None
    return os.fsdecode(p)


class Reader:
    """Iterate the frames of a stream (zstd or raw): `for f in Reader(path)`.
    A truncated or malformed stream raises Error naming the frame."""

    def __init__(self, path: PathOrFile = "-", bf16: str = "f32") -> None:
        if bf16 not in ("f32", "raw"):
            raise ValueError("bf16 must be 'f32' or 'raw'")
        self.bf16 = bf16
        self.r = None
        self.path = _path(path)
        self.r = lib.lrmoe_reader_open(cstr("path", self.path))
        if not self.r:
            check(-1)

    def __iter__(self):
        return self

    def __next__(self):
        if not self.r:
            raise StopIteration
        cf = CFrame()
        rc = lib.lrmoe_reader_next(self.r, cf.ref)
        if rc < 0:
            msg = _lib.errmsg()
            self.close()
            raise Error(msg)
        if rc == 0:
            self.close()
            raise StopIteration
        return cf.to_frame(bf16=self.bf16)

    def close(self) -> None:
        if self.r:
            lib.lrmoe_reader_close(self.r)
            self.r = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Writer:
    """Write frames (Frame or plain dicts of arrays) to a stream; close()
    writes the trailer. Leaving a `with` block by an exception aborts: the
    stream stays without trailer, so the next stage reports it truncated."""

    def __init__(self, path: PathOrFile = "-", compress: bool = True, level: int = 3,
                 threads: int = 0) -> None:
        self.w = None
        o = _lib.WOpts()
        lib.lrmoe_wopts_default(ctypes.byref(o))
        # the tools' ranges: --level -7..22, --threads 0..256
        o.compress, o.level = int(bool(compress)), i32("level", level, -7, 22)
        o.threads = i32("threads", threads, 0, 256)
        self.path = _path(path)
        self.w = lib.lrmoe_writer_open(cstr("path", self.path), ctypes.byref(o))
        if not self.w:
            check(-1)

    def write(self, frame: Mapping[str, Any], attrs: Optional[Mapping[str, Any]] = None,
              dtypes: Optional[Mapping[str, str]] = None) -> None:
        if not self.w:
            raise Error(f"{self.path}: writer is closed")
        if not isinstance(frame, Frame):
            frame = Frame(frame)
        if attrs or dtypes:
            frame = Frame(frame, {**frame.attrs, **(attrs or {})},
                          {**frame.dtypes, **(dtypes or {})})
        cf = CFrame(frame)  # kept alive across the call (its __del__ clears it)
        check(lib.lrmoe_writer_write(self.w, cf.ref))

    @property
    def count(self):
        return lib.lrmoe_writer_count(self.w) if self.w else 0

    def close(self) -> None:
        if self.w:
            w, self.w = self.w, None
            check(lib.lrmoe_writer_close(w))

    def abort(self) -> None:
        if self.w:
            lib.lrmoe_writer_abort(self.w)
            self.w = None

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if et is None:
            self.close()
        else:
            self.abort()


def read(path: PathOrFile = "-", bf16: str = "f32") -> List[Frame]:
    """All frames of a stream as a list (see Reader to iterate)."""
    with Reader(path, bf16) as r:
        return list(r)


def write(path: PathOrFile, frames: Iterable[Mapping[str, Any]], **opts: Any) -> None:
    """Write frames (with trailer) to path; opts as Writer's."""
    with Writer(path, **opts) as w:
        for f in frames:
            w.write(f)
