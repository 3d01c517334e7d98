"""lrmoe.budget (this module is lrmoe._budget): the per-layer memory budget of lrmoe-plan -M (lrmoe-budget(1)).

Every number comes from liblrmoe's budget handle (lrmoe_budget_cfg_t,
budget.h; lib/api_budget.c), set by lrmoe-budget's long option names; this
module only turns Python values into those strings and the handle's rows into
a dict whose keys are lrmoe-budget --tsv's columns."""
import ctypes
import json
import os
from typing import Any, Dict, Optional, Union

from . import _lib
from ._lib import Error, check, lib

_DT = {"bf16": 2, "f16": 2, "f32": 4}


def size_bytes(name, v):
    """A BYTES value (lrmoe(7)): an int, or a string such as "80G"."""
    if isinstance(v, str):
        d = ctypes.c_double()
        check(lib.lrmoe_parse_bytes(_lib.cstr(name, name), _lib.cstr(name, v), ctypes.byref(d)))
        return int(d.value)
    return _lib.i64(name, v, 0)


def _dtype_bytes(name, v):
    if isinstance(v, str) and v.lower() in _DT:
        return _DT[v.lower()]
    raise Error(f"{name}: {v!r} is not bf16, f16 or f32")


def presets():
    """The names lrmoe-budget --preset takes."""
    out, i = [], 0
    while True:
        n = lib.lrmoe_budget_preset_name(i)
        if not n:
            return out
        out.append(n.decode())
        i += 1


class Handle:
    """One lrmoe_budget_cfg_t: options set by lrmoe-budget's long names."""

    def __init__(self):
        self._h = lib.lrmoe_budget_cfg_new()
        if not self._h:
            check(-1, "budget")

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h:
            lib.lrmoe_budget_cfg_free(h)

    def set(self, name, value):
        v = None if value is None else _lib.cstr(name, str(value))
        check(lib.lrmoe_budget_cfg_set(self._h, name.encode(), v))
        return self

    def get(self, key):
        v = ctypes.c_int64()
        check(lib.lrmoe_budget_cfg_get(self._h, key.encode(), ctypes.byref(v)))
        return v.value

    def run(self):
        check(lib.lrmoe_budget_cfg_run(self._h))
        return self

    def rows(self):
        out, v, i = {}, ctypes.c_int64(), 0
        while True:
            k = lib.lrmoe_budget_cfg_row(self._h, i, ctypes.byref(v))
            if not k:
                return out
            out[k.decode()] = v.value
            i += 1

    def family(self):
        return lib.lrmoe_budget_cfg_family(self._h).decode()


def model(config=None, preset=None):
    """A handle holding the model from a config.json path, a config dict, a
    transformers config object, or a preset name."""
    h = Handle()
    if (config is None) == (preset is None):
        raise Error("budget: give one of config= and preset=")
    if preset is not None:
        return h.set("preset", preset)
    if isinstance(config, (str, bytes, os.PathLike)):
        return h.set("config", os.fsdecode(config))
    if hasattr(config, "to_json_string"):  # a transformers PretrainedConfig
        text = config.to_json_string(use_diff=False)
    elif isinstance(config, dict):
        text = json.dumps(config)
    else:
        raise Error(f"config: {type(config).__name__} is not a path, dict or HF config")
    return h.set("config-json", text)


def compute(h, gpu_mem, reserve=0, tp=1, pp=1, dp=1, ep=1, seq=4096, micro_batch=1,
            checkpoint="full", zero1=False, param_bytes=2, grad_bytes=4, optim_bytes=12,
            act_bytes=2, name="config"):
    """The budget of handle h (see model()); the breakdown as a dict."""
    for k, v in (("tp", tp), ("pp", pp), ("dp", dp), ("ep", ep), ("seq", seq),
                 ("micro-batch", micro_batch), ("param-bytes", param_bytes),
                 ("grad-bytes", grad_bytes), ("optim-bytes", optim_bytes),
                 ("act-bytes", act_bytes)):
        h.set(k, _lib.i64(k, v))
    if checkpoint not in ("full", "none"):
        raise Error(f"checkpoint: {checkpoint!r} is not 'full' or 'none'")
    h.set("checkpoint", checkpoint).set("zero1", 1 if zero1 else 0)
    h.set("gpu-mem", size_bytes("gpu_mem", gpu_mem)).set("reserve", size_bytes("reserve", reserve))
    return {"model": name, "family": h.family(), **h.run().rows()}


def budget(config: Any = None, preset: Optional[str] = None, *, gpu_mem: Union[int, str],
           reserve: Union[int, str] = 0, tp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1,
           seq: int = 4096, micro_batch: int = 1, checkpoint: str = "full", zero1: bool = False,
           dtype: str = "bf16", grad_dtype: str = "f32", optim_bytes: int = 12
           ) -> Dict[str, Any]:
    """lrmoe-budget in-process: the per-layer budget -M (hbm_bytes) and its
    breakdown, a dict keyed as lrmoe-budget --tsv's columns. config: a
    config.json path, a dict or a transformers config; or preset=NAME.
    A model that does not fit is not an error: fits is 0 and free_bytes < 0."""
    pb = _dtype_bytes("dtype", dtype)
    h = model(config, preset)
    return compute(h, gpu_mem, reserve, tp, pp, dp, ep, seq, micro_batch, checkpoint, zero1,
                   pb, _dtype_bytes("grad_dtype", grad_dtype), optim_bytes, pb,
                   name=preset if preset is not None else "config")
