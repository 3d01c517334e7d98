"""lrmoe: Python bindings of liblrmoe (ctypes over liblrmoe.so.2).

    lrmoe.read / lrmoe.write / lrmoe.Reader / lrmoe.Writer   streams (lrmoe-stream(5))
    lrmoe.route / lrmoe.plan / lrmoe.score / lrmoe.pack      the tools' work on arrays
    lrmoe.capacity / lrmoe.capacity_keep                     Megatron-style token dropping
    lrmoe.budget                                             lrmoe-budget: the per-layer -M
    lrmoe.forward / lrmoe.backward / lrmoe.Exec              lrmoe-exec on frames
    lrmoe.torch.dump / lrmoe.torch.patch / .unpatch          Hugging Face MoE models
    lrmoe.torch.register / .register_torchtitan              any SwiGLU MoE block
    lrmoe.torch.budget                                       -M of a live model + optimizer

NumPy is required; PyTorch only for lrmoe.torch. The shared library is
LRMOE_LIBRARY, else liblrmoe.so.2 on the loader's path (see lrmoe(3));
the package's reference is lrmoe-python(3).
"""
from ._lib import VERSION as __version__, Error, LibraryNotFound
from .frame import Frame, Reader, Writer, bf16_to_f32, f32_to_bf16, read, write
from .ops import (Exec, Planner, backward, capacity, capacity_keep, forward, pack, plan, route,
                  score)
from ._budget import budget

__all__ = ["Error", "LibraryNotFound", "Frame", "Reader", "Writer", "read", "write",
           "bf16_to_f32", "f32_to_bf16", "route", "plan", "Planner", "score", "pack",
           "capacity", "capacity_keep", "budget",
           "forward", "backward", "Exec",
           "__version__"]
