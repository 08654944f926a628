"""Mixed precision: `autocast` runs GEMMs (and the other ops of the policy table) in float16 or bfloat16,
`GradScaler` keeps float16 gradients from underflowing; optimizers keep float32 master weights for half
parameters by themselves (netcl.optim).

    from netcl import amp
    scaler = amp.GradScaler()
    with amp.autocast("float16"), ag.Tape() as tape:
        loss = ag.cross_entropy(model(x), y)     # linear layers in float16, the loss in float32
    tape.backward(scaler.scale(loss))
    scaler.step(opt)
    scaler.update()

What each op does under autocast is one table, netcl.amp.policy.TABLE.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from netcl import config
from netcl.amp import policy
from netcl.amp.scaler import GradScaler
from netcl.autograd import autocast as _hook
from netcl.core import dtypes
from netcl.errors import DTypeError

# PyTorch's device types: the first argument of torch.autocast and torch.amp.GradScaler
_DEVICE_TYPES = ("cuda", "cpu", "xpu", "mps", "hpu", "xla", "npu", "meta")


class autocast:  # noqa: N801  (PyTorch's name, used as a context manager)
    """Run the ops of netcl.amp.policy in `dtype` ("float16" or "bfloat16") inside the block, on this thread.

    Parameters stay as they are (float32): an op casts its inputs (a differentiable cast, so gradients come
    back in the parameters' dtype). enabled=False turns autocast off inside the block (also inside an outer
    autocast), and so does NETCL_HALF=off for the whole program. Blocks nest; the innermost wins. As a
    decorator (`@autocast("bfloat16")` on a forward), each call of the function runs inside such a block.

    PyTorch's first argument is a device type (`torch.autocast("cuda", dtype=torch.float16)`); netcl's is
    the dtype, since the device is the tensors' own: `autocast("float16")`."""

    def __init__(self, dtype: Any = "float16", enabled: bool = True):
        try:
            dt = dtypes.normalize(dtype)
        except DTypeError:
            dt = None
        if dt is None or not dtypes.is_half(dt):
            hint = ""
            if isinstance(dtype, str) and dtype.split(":")[0] in _DEVICE_TYPES:
                hint = (" (PyTorch's autocast takes a device type first; netcl's takes the dtype, the device "
                        "being the tensors' own: autocast('float16'))")
            raise DTypeError(f"autocast: dtype must be 'float16' or 'bfloat16', got {dtype!r}{hint}")
        if not isinstance(enabled, (bool, np.bool_)):
            raise TypeError(f"autocast: enabled must be True or False, got {type(enabled).__name__}")
        self.dtype = dt
        self.enabled = bool(enabled)
        self._ctx: Any = None

    def __enter__(self) -> autocast:
        on = self.enabled and config.half_mode() != "off"  # NETCL_HALF=off: mixed precision off everywhere
        self._ctx = _hook.enabled(self.dtype if on else None)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        ctx, self._ctx = self._ctx, None
        ctx.__exit__(*exc)

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`@autocast(dtype)`: fn's every call inside a block of this autocast."""
        if not callable(fn):
            raise TypeError(f"autocast used as a decorator takes a function, got {type(fn).__name__}")
        dtype, enabled = self.dtype, self.enabled

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with autocast(dtype, enabled):
                return fn(*args, **kwargs)

        return run


def autocast_dtype() -> np.dtype | None:
    """The autocast dtype in force on this thread (None outside autocast)."""
    return _hook.active()


__all__ = ["GradScaler", "autocast", "autocast_dtype", "policy"]
