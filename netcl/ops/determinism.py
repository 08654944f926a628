"""Whether ops take their deterministic kernels (the default) or the float-atomic fast paths:
set_deterministic / get_deterministic, PyTorch's torch.use_deterministic_algorithms habit."""

from __future__ import annotations

import numpy as np

from netcl import config
from netcl.core import capture

__all__ = ["get_deterministic", "set_deterministic"]

# None until set_deterministic is called: NETCL_DETERMINISTIC (default on) decides
_deterministic: list[bool | None] = [None]


def set_deterministic(flag: bool) -> None:
    """True (the default): every op gives the same bits for the same inputs on the same device, run after
    run (no float atomics: attention's dq by per-work-group copies summed in a fixed order, scatter_add and
    embedding's backward by sorted segments). False: the float-atomic fast paths where an op has one (the
    fused attention backward's dq, float32 scatter_add), whose sums round in whatever order the adds land.
    Ops read it at each call; a recorded graph replays the kernels it recorded."""
    if not isinstance(flag, (bool, np.bool_)):
        raise TypeError(
            f"set_deterministic: flag must be True or False, got {flag!r} ({type(flag).__name__})"
        )
    if bool(flag) != _deterministic[0]:
        _deterministic[0] = bool(flag)
        capture.plans.invalidate()  # no plan may keep a kernel the other setting chose


def get_deterministic() -> bool:
    """Whether ops run their deterministic kernels (set_deterministic; until it is called,
    NETCL_DETERMINISTIC, default on)."""
    flag = _deterministic[0]
    return config.deterministic() if flag is None else flag
