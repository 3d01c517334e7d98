"""lrmoe.budget (this module is lrmoe._budget): the per-layer memory budget of lrmoe-plan -M (lrmoe-budget(1)).

Every number comes from lrmoe_budget_compute (lib/budget.c); this module only
turns Python values into its arguments and its result into a dict whose keys
are lrmoe-budget --tsv's columns."""
import ctypes
import json
import os
from typing import Any, Dict, Optional, Union

from . import _lib
from ._lib import Error, check, lib

_CKPT = {"none": 0, "full": 1}
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


def model(config=None, preset=None):
    """The C model (a ctypes struct) from a config.json path, a config dict,
    a transformers config object, or a preset name."""
    m = _lib.BudgetModel()
    if (config is None) == (preset is None):
        raise Error("budget: give one of config= and preset=")
    if preset is not None:
        check(lib.lrmoe_budget_model_preset(_lib.cstr("preset", preset), ctypes.byref(m), None))
    elif isinstance(config, (str, bytes, os.PathLike)):
        check(lib.lrmoe_budget_model_file(_lib.cstr("config", config), ctypes.byref(m)))
    else:
        if hasattr(config, "to_json_string"):  # a transformers PretrainedConfig
            text = config.to_json_string(use_diff=False)
        elif isinstance(config, dict):
            text = json.dumps(config)
        else:
            raise Error(f"config: {type(config).__name__} is not a path, dict or HF config")
        check(lib.lrmoe_budget_model_json(_lib.cstr("config", text), ctypes.byref(m)))
    return m


def compute(m, gpu_mem, reserve=0, tp=1, pp=1, dp=1, ep=1, seq=4096, micro_batch=1,
            checkpoint="full", zero1=False, param_bytes=2, grad_bytes=4, optim_bytes=12,
            act_bytes=2, name="config"):
    """lrmoe_budget_compute on model m (see model()); the breakdown as a dict."""
    o = _lib.BudgetOpts()
    lib.lrmoe_budget_opts_default(ctypes.byref(o))
    for k, v in (("tp", tp), ("pp", pp), ("dp", dp), ("ep", ep), ("seq", seq),
                 ("micro_batch", micro_batch), ("param_bytes", param_bytes),
                 ("grad_bytes", grad_bytes), ("optim_bytes", optim_bytes),
                 ("act_bytes", act_bytes)):
        setattr(o, k, _lib.i64(k, v))
    if checkpoint not in _CKPT:
        raise Error(f"checkpoint: {checkpoint!r} is not 'full' or 'none'")
    o.checkpoint, o.zero1 = _CKPT[checkpoint], 1 if zero1 else 0
    o.gpu_mem, o.reserve = size_bytes("gpu_mem", gpu_mem), size_bytes("reserve", reserve)
    r = _lib.Budget()
    check(lib.lrmoe_budget_compute(ctypes.byref(m), ctypes.byref(o), ctypes.byref(r)))
    expert_total = m.expert_params * m.moe_layers
    return {
        "model": name, "family": m.family.decode(),
        "layers": m.layers, "moe_layers": m.moe_layers,
        "params_total": m.dense_params + expert_total, "params_experts_total": expert_total,
        "params_other_total": m.dense_params, "stage_layers": r.stage_layers,
        "stage_moe_layers": r.stage_moe_layers, "inflight": r.inflight, "edp": r.edp,
        "params_other": r.params_dense, "params_experts": r.params_expert,
        "gpu_mem_bytes": o.gpu_mem, "reserve_bytes": r.reserve, "weights_bytes": r.weights,
        "grads_bytes": r.grads, "optim_bytes": r.optim, "act_stored_bytes": r.act_stored,
        "act_working_bytes": r.act_working, "logits_bytes": r.logits,
        "free_bytes": r.free_bytes, "alive": r.alive, "hbm_bytes": r.hbm,
        "resident_bytes": r.resident, "fits": r.fits,
    }


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
    m = model(config, preset)
    return compute(m, gpu_mem, reserve, tp, pp, dp, ep, seq, micro_batch, checkpoint, zero1,
                   pb, _dtype_bytes("grad_dtype", grad_dtype), optim_bytes, pb,
                   name=preset if preset is not None else "config")
