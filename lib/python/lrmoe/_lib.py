"""ctypes view of liblrmoe.so.2: loading, the few mirrored public structs
(a frame and its tensors, the writer's and the router's options), the exec
arguments by name (ExecArgs), and the error convention (a call that returns
< 0 raises lrmoe.Error with the library's own message). Every struct
mirrored here is checked against
lrmoe_abi_sizeof() of the library actually loaded, so a binding/library
mismatch is one clear error at import instead of memory corruption."""
import ctypes
import ctypes.util
import os
from typing import Any, Dict, Optional

from ctypes import (POINTER, Structure, c_char_p, c_double, c_int, c_int32,
                    c_int64, c_size_t, c_uint64, c_void_p)

SONAME = "liblrmoe.so.2"
MAX_DIMS = 8


class Error(RuntimeError):
    """A liblrmoe call failed; the message is the library's (lrmoe_errmsg)."""


class LibraryNotFound(Error, OSError):
    """liblrmoe.so.2 could not be loaded."""


def _load():
    tried = []
    env = os.environ.get("LRMOE_LIBRARY")
    cands = [env] if env else []
    cands += [SONAME, ctypes.util.find_library("lrmoe")]
    for c in cands:
        if not c:
            continue
        try:
            return ctypes.CDLL(c)
        except OSError as e:
            tried.append(f"{c}: {e}")
            if env and c == env:
                break
    raise LibraryNotFound(
        "lrmoe: cannot load " + (env or SONAME) + " (" + "; ".join(tried) + "); build it with "
        "`make` and point LRMOE_LIBRARY at build/liblrmoe.so.2, or `make install` it "
        "where the dynamic loader finds it")


lib = _load()

# dtypes: the order of lrmoe_dtype_t
DTYPES = ["BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "BF16",
          "F32", "F64"]
DT = {n: i for i, n in enumerate(DTYPES)}


class Tensor(Structure):
    _fields_ = [("name", c_char_p), ("dtype", c_int), ("ndim", c_int),
                ("shape", c_int64 * MAX_DIMS), ("nbytes", c_size_t), ("data", c_void_p)]


class Frame(Structure):
    _fields_ = [("ntensors", c_int), ("tcap", c_int), ("tensors", POINTER(POINTER(Tensor))),
                ("nattrs", c_int), ("acap", c_int), ("keys", POINTER(c_char_p)),
                ("vals", POINTER(c_char_p))]


class WOpts(Structure):
    _fields_ = [("compress", c_int), ("level", c_int), ("threads", c_int)]


class RouteOpts(Structure):
    _fields_ = [("router", c_int), ("k", c_int), ("renorm", c_int), ("scale", c_double),
                ("groups", c_int), ("topk_groups", c_int), ("threads", c_int)]


# lrmoe_compute_t (lib/gemm_cpu.h): the exec argument "compute"
COMPUTE_AUTO, COMPUTE_F32, COMPUTE_BF16 = 0, 1, 2


def _sig(name, res, *args):
    f = getattr(lib, name)
    f.restype = res
    f.argtypes = list(args)
    return f


P = c_void_p
_sig("lrmoe_errmsg", c_char_p)
_sig("lrmoe_version", c_char_p)
_sig("lrmoe_version_number", c_int)
_sig("lrmoe_abi_sizeof", c_size_t, c_char_p)
_sig("lrmoe_dtype_size", c_size_t, c_int)
_sig("lrmoe_convert_to_f32", None, c_int, P, P, c_size_t)
_sig("lrmoe_convert_from_f32", None, c_int, P, P, c_size_t)
# frames
_sig("lrmoe_frame_init", None, POINTER(Frame))
_sig("lrmoe_frame_clear", None, POINTER(Frame))
_sig("lrmoe_frame_get", POINTER(Tensor), POINTER(Frame), c_char_p)
_sig("lrmoe_frame_put", POINTER(Tensor), POINTER(Frame), c_char_p, c_int, c_int,
     POINTER(c_int64))
_sig("lrmoe_frame_set_attr", c_int, POINTER(Frame), c_char_p, c_char_p)
# streams
_sig("lrmoe_reader_open", P, c_char_p)
_sig("lrmoe_reader_next", c_int, P, POINTER(Frame))
_sig("lrmoe_reader_index", c_int64, P)
_sig("lrmoe_reader_close", None, P)
_sig("lrmoe_wopts_default", None, POINTER(WOpts))
_sig("lrmoe_writer_open", P, c_char_p, POINTER(WOpts))
_sig("lrmoe_writer_write", c_int, P, POINTER(Frame))
_sig("lrmoe_writer_close", c_int, P)
_sig("lrmoe_writer_abort", None, P)
_sig("lrmoe_writer_count", c_int64, P)
# route
_sig("lrmoe_route_opts_default", None, POINTER(RouteOpts))
_sig("lrmoe_route_parse_router", c_int, c_char_p, POINTER(c_int))
_sig("lrmoe_route_check_opts", c_int, POINTER(RouteOpts))
_sig("lrmoe_route_check", c_int, POINTER(RouteOpts), c_int64)
_sig("lrmoe_route_topk", c_int, POINTER(RouteOpts), c_int64, c_int64, c_int, P, P, P, P, P)
# plan
_sig("lrmoe_plan_cfg_new", P)
_sig("lrmoe_plan_cfg_free", None, P)
_sig("lrmoe_plan_cfg_set", c_int, P, c_char_p, c_char_p)
_sig("lrmoe_plan_cfg_run", c_int, P, P, c_int, POINTER(Frame))
_sig("lrmoe_plan_cfg_reset", c_int, P)
_sig("lrmoe_plan_thread_cleanup", None)
# capacity (Megatron-Core's token dropping; capacity.h)
_sig("lrmoe_capacity", c_int64, c_int64, c_int, c_int, c_double)
_sig("lrmoe_capacity_pairs", c_int64, c_int64, c_int, c_double)
_sig("lrmoe_capacity_policy_parse", c_int, c_char_p, POINTER(c_int))
_sig("lrmoe_capacity_keep", c_int, c_int64, c_int, c_int, P, P, c_int64, c_int, P, P)
# budget (the per-layer memory budget; budget.h)
_sig("lrmoe_budget_cfg_new", c_void_p)
_sig("lrmoe_budget_cfg_free", None, c_void_p)
_sig("lrmoe_budget_cfg_set", c_int, c_void_p, c_char_p, c_char_p)
_sig("lrmoe_budget_cfg_run", c_int, c_void_p)
_sig("lrmoe_budget_cfg_row", c_char_p, c_void_p, c_int, POINTER(c_int64))
_sig("lrmoe_budget_cfg_get", c_int, c_void_p, c_char_p, POINTER(c_int64))
_sig("lrmoe_budget_cfg_family", c_char_p, c_void_p)
_sig("lrmoe_budget_preset_name", c_char_p, c_int)
_sig("lrmoe_parse_bytes", c_int, c_char_p, c_char_p, POINTER(c_double))
# score
_sig("lrmoe_score_metric_parse", c_int, c_char_p, POINTER(c_int))
for _st in ("score", "pack"):  # the stages' opaque handles (api.h)
    _sig(f"lrmoe_{_st}_new", c_void_p)
    _sig(f"lrmoe_{_st}_set", c_int, c_void_p, c_char_p, c_char_p)
    _sig(f"lrmoe_{_st}_run", c_int, c_void_p, POINTER(Frame))
    _sig(f"lrmoe_{_st}_free", None, c_void_p)
_sig("lrmoe_score_pairs_dt", c_int, c_int, c_int64, c_int, c_int64, c_int, P, P, P, c_uint64, P)
_sig("lrmoe_score_select", c_int, c_int64, c_int, c_int, P, P, P, c_double, P, P, P)
_sig("lrmoe_score_select_by_rank", c_int, c_int64, c_int, c_int, c_int, P, P, P, P, P, P, P)
_sig("lrmoe_score_keep_rule_parse", c_int, c_char_p, POINTER(c_int))
_sig("lrmoe_score_sample", c_int, c_int64, c_int, c_int, P, P, P, c_double, c_uint64, P, P, P,
     P, P)
_sig("lrmoe_score_sample_by_rank", c_int, c_int64, c_int, c_int, c_int, P, P, P, P, c_uint64,
     P, P, P, P, P)
_sig("lrmoe_score_weighted_alpha", None, c_int64, P, P, P)
# pack
_sig("lrmoe_pack_gather", None, P, c_int64, c_int, c_int, P, c_size_t, P)
_sig("lrmoe_pack_gather_scaled_dt", None, P, c_int64, c_int, c_int64, c_int, P, P, P)
# exec
# lrmoe_exec_forward/backward's and lrmoe_pack_assign's arguments by name (api.h)
_sig("lrmoe_exec_args_new", c_void_p)
_sig("lrmoe_exec_args_free", None, c_void_p)
_sig("lrmoe_exec_args_set", c_int, c_void_p, c_char_p, c_int64)
_sig("lrmoe_exec_args_set_ptr", c_int, c_void_p, c_char_p, c_void_p)
_sig("lrmoe_exec_args_get", c_int, c_void_p, c_char_p, POINTER(c_int64))
_sig("lrmoe_exec_args_get_ptr", c_void_p, c_void_p, c_char_p)
_sig("lrmoe_exec_args_pack", c_int, c_void_p)
_sig("lrmoe_exec_args_forward", c_int, c_void_p, P)
_sig("lrmoe_exec_args_backward", c_int, c_void_p, P)
# the CUDA executor (lrmoe_exec_cuda_new(3)): lrmoe.torch on CUDA tensors
_sig("lrmoe_exec_args_cuda_new", c_int, c_void_p, POINTER(c_void_p))
_sig("lrmoe_exec_args_forward_cuda", c_int, c_void_p, c_void_p, P)
_sig("lrmoe_exec_args_backward_cuda", c_int, c_void_p, c_void_p, P)
_sig("lrmoe_exec_cuda_set_io", c_int, c_void_p, c_int, c_void_p)
_sig("lrmoe_exec_cuda_weights_changed", c_int, c_void_p)
_sig("lrmoe_exec_cuda_score", c_int, c_void_p, c_int, c_int64, c_int, c_int64, c_int, P, P, P, P)
_sig("lrmoe_exec_cuda_free", None, c_void_p)
_sig("lrmoe_exec_stage_name", c_char_p, c_int)
_sig("lrmoe_exec_native", c_int, c_int64, c_int64, c_int)
_sig("lrmoe_exec_check_finite", c_int, c_int, P, c_size_t, c_char_p)
_sig("lrmoe_exec_mode_parse", c_int, c_char_p, POINTER(c_int))
_sig("lrmoe_backend_parse", c_int, c_char_p, POINTER(c_int))
# the executor behind its opaque handle (api.h): options by lrmoe-exec's names
_sig("lrmoe_exec_new", c_void_p)
_sig("lrmoe_exec_set", c_int, c_void_p, c_char_p, c_char_p)
_sig("lrmoe_exec_run", c_int, c_void_p, POINTER(Frame))
_sig("lrmoe_exec_free", None, c_void_p)

VERSION = lib.lrmoe_version().decode()
VERSION_NUMBER = lib.lrmoe_version_number()

_MIRRORS = {"lrmoe_tensor_t": Tensor, "lrmoe_frame_t": Frame, "lrmoe_wopts_t": WOpts,
            "lrmoe_route_opts_t": RouteOpts}


def check_mirror(name, struct):
    """Refuse a ctypes mirror whose size is not the loaded library's."""
    have = lib.lrmoe_abi_sizeof(name.encode())
    if have != ctypes.sizeof(struct):
        raise Error(f"lrmoe: the loaded liblrmoe {VERSION} has {name} of {have} bytes, this "
                    f"binding expects {ctypes.sizeof(struct)}: install matching versions")


for _n, _s in _MIRRORS.items():
    check_mirror(_n, _s)


def errmsg():
    m = lib.lrmoe_errmsg()
    return m.decode("utf-8", "replace") if m else "unknown error"


def check(rc, what=None):
    """rc < 0 (or a NULL pointer passed as None) raises Error."""
    if rc is None or (isinstance(rc, int) and rc < 0):
        raise Error(f"{what}: {errmsg()}" if what else errmsg())
    return rc


# ------------------------------------------------------------ argument checks
#
# The one place where a Python value becomes something liblrmoe reads: every
# pointer handed to the library goes through buf() (dtype, itemsize, shape,
# contiguity and the byte size checked against what the call will read),
# every number through i32/i64/u64/f64 (range-checked, never wrapped into a
# C int) and every string through cstr() (no NUL to truncate it). Anything
# else raises Error naming the argument.

I32 = (-2**31, 2**31 - 1)
I64 = (-2**63, 2**63 - 1)
U64 = (0, 2**64 - 1)


def integer(name, v, lo=I64[0], hi=I64[1]):
    """v as a Python int in [lo, hi]: ints, numpy integers, bools and
    integral floats; anything else, or out of range, raises Error."""
    import numbers
    import operator
    if isinstance(v, numbers.Integral) or hasattr(v, "__index__"):
        try:
            i = operator.index(v)
        except TypeError:
            raise Error(f"{name}: {v!r} is not an integer") from None
    elif isinstance(v, numbers.Real):
        f = float(v)
        if f != f or f in (float("inf"), float("-inf")) or not f.is_integer():
            raise Error(f"{name}: {v!r} is not an integer")
        i = int(f)
    else:
        raise Error(f"{name}: {v!r} is not an integer")
    if not lo <= i <= hi:
        raise Error(f"{name}: {i} out of range [{lo}, {hi}]")
    return i


def i32(name, v, lo=I32[0], hi=I32[1]):
    return integer(name, v, max(lo, I32[0]), min(hi, I32[1]))


def i64(name, v, lo=I64[0], hi=I64[1]):
    return integer(name, v, max(lo, I64[0]), min(hi, I64[1]))


def u64(name, v):
    return integer(name, v, *U64)


def f64(name, v, lo=None, hi=None, finite=True):
    """v as a float; finite unless finite=False, within [lo, hi] if given."""
    import numbers
    if isinstance(v, (str, bytes)) or not isinstance(v, numbers.Real):
        raise Error(f"{name}: {v!r} is not a number")
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        raise Error(f"{name}: {v!r} is not a number") from None
    if finite and (f != f or f in (float("inf"), float("-inf"))):
        raise Error(f"{name}: {v!r} is not a finite number")
    if (lo is not None and not f >= lo) or (hi is not None and not f <= hi):
        raise Error(f"{name}: {v!r} out of range [{lo}, {hi}]")
    return f


def cstr(name, s):
    """s (str, bytes or os.PathLike) as bytes for a char * argument: a NUL
    would end the string early in C, so it is refused."""
    if isinstance(s, str):
        b = s.encode("utf-8", "surrogateescape")
    elif isinstance(s, bytes):
        b = s
    elif isinstance(s, os.PathLike):
        b = os.fsencode(s)
    else:
        raise Error(f"{name}: {s!r} is not a string")
    if b"\0" in b:
        raise Error(f"{name}: {s!r} holds a NUL character")
    return b


def _torch_dtypes():
    import sys
    t = sys.modules.get("torch")
    if t is None:
        return {}
    return {t.bool: "BOOL", t.uint8: "U8", t.int8: "I8", t.int16: "I16", t.int32: "I32",
            t.int64: "I64", t.float16: "F16", t.bfloat16: "BF16", t.float32: "F32",
            t.float64: "F64"}


# numpy dtype.str -> lrmoe dtype; BF16 is held as uint16 bits in numpy
_NP_DT = {"|b1": "BOOL", "|u1": "U8", "|i1": "I8", "<u2": "U16", "<i2": "I16", "<u4": "U32",
          "<i4": "I32", "<u8": "U64", "<i8": "I64", "<f2": "F16", "<f4": "F32", "<f8": "F64"}


def buf(name, a, dt, shape, writable=False):
    """The address of array a (a numpy array or a CPU torch tensor) for a
    liblrmoe call that reads (or, writable, writes) it as lrmoe dtype dt
    (a name, or a tuple of the names allowed) of exactly shape (a tuple;
    None in it: any extent): a C-contiguous buffer of prod(shape) elements
    of that dtype's size. None passes as NULL. Anything else raises Error."""
    if a is None:
        return None
    dts = (dt,) if isinstance(dt, str) else tuple(dt)
    tdt = _torch_dtypes()
    if tdt and type(a).__module__.startswith("torch"):
        have = tdt.get(a.dtype)
        if a.device.type != "cpu":
            raise Error(f"{name}: a tensor on {a.device}; liblrmoe reads CPU memory")
        contig = a.is_contiguous()
        got, size, addr = tuple(a.shape), a.numel() * a.element_size(), a.data_ptr()
        itemsize = a.element_size()
        if writable and a.requires_grad and a.is_leaf:
            raise Error(f"{name}: a leaf tensor that requires grad cannot be written")
    else:
        import numpy as np
        if not isinstance(a, np.ndarray):
            raise Error(f"{name}: {type(a).__name__} is not an array")
        have = _NP_DT.get(a.dtype.str)
        if have == "U16" and "BF16" in dts:
            have = "BF16"  # BF16 bits
        contig = a.flags.c_contiguous and a.flags.aligned
        got, size, addr = a.shape, a.nbytes, a.ctypes.data
        itemsize = a.dtype.itemsize
        if writable and not a.flags.writeable:
            raise Error(f"{name}: read-only array")
    if have not in dts:
        raise Error(f"{name}: dtype {have or getattr(a, 'dtype', '?')}, expected "
                    + " or ".join(dts))
    if itemsize != lib.lrmoe_dtype_size(DT[have]):
        raise Error(f"{name}: {itemsize}-byte elements for {have}")
    if len(got) != len(shape) or any(w is not None and g != w for g, w in zip(got, shape)):
        want = ",".join("*" if w is None else str(w) for w in shape)
        raise Error(f"{name}: shape {list(got)}, expected [{want}]")
    if not contig:
        raise Error(f"{name}: not a C-contiguous array")
    n = 1
    for g in got:
        n *= int(g)
    if size != n * itemsize:
        raise Error(f"{name}: {size} bytes for {n} elements of {have}")
    if n and not addr:
        raise Error(f"{name}: no memory")
    return addr or None


def ptr(a):
    """Address of a numpy array the binding allocated itself (or None)."""
    if a is None:
        return None
    if not a.flags.c_contiguous:
        raise Error("internal: a non-contiguous buffer")
    return a.ctypes.data


# the exec arguments that are numbers (lrmoe_exec_args_set); every other
# name is a buffer or pointer (lrmoe_exec_args_set_ptr)
_ARG_NUMBERS = frozenset((
    "backend", "threads", "allow_nonfinite", "device", "rank_threads", "cpu_clock", "gpus",
    "gemm", "gemm_streams", "compute", "T", "E", "K", "D", "F", "P", "weights_dtype",
    "act_dtype", "mode", "grad_dtype", "R"))


class ExecArgs:
    """lrmoe_exec_args_t (api.h): the arguments of lrmoe_exec_forward,
    lrmoe_exec_backward and lrmoe_pack_assign held by liblrmoe and set by
    field name, so this binding mirrors none of their structs. Built from
    dicts of fields (numbers, and buffers as addresses or None)."""

    def __init__(self, *groups: Dict[str, Any], **fields: Any) -> None:
        self.h = lib.lrmoe_exec_args_new()
        if not self.h:
            check(-1, "exec arguments")
        for g in groups:
            self.set(**g)
        self.set(**fields)

    def __del__(self) -> None:
        h, self.h = getattr(self, "h", None), None
        if h:
            lib.lrmoe_exec_args_free(h)

    def set(self, **fields: Any) -> "ExecArgs":
        for k, v in fields.items():
            if k in _ARG_NUMBERS:
                check(lib.lrmoe_exec_args_set(self.h, k.encode(), int(v)))
            else:
                check(lib.lrmoe_exec_args_set_ptr(self.h, k.encode(), v))
        return self

    def get(self, name: str) -> int:
        v = c_int64()
        check(lib.lrmoe_exec_args_get(self.h, name.encode(), ctypes.byref(v)))
        return v.value

    def get_ptr(self, name: str) -> Optional[int]:
        return lib.lrmoe_exec_args_get_ptr(self.h, name.encode())

    def pack(self) -> "ExecArgs":
        """lrmoe_pack_assign on the pack's fields; the backward's R and
        pack_* fields become its plan."""
        check(lib.lrmoe_exec_args_pack(self.h))
        return self
