"""Autocast's hook: the mixed-precision dtype in force, and the cast each taking-part op gives its inputs.

netcl.amp.autocast sets the dtype (a per-thread stack); netcl.amp.policy fills POLICY, the one table of
what each op does under it. An op takes part by one call at its top, before it reads any value:

    x, weight, bias = autocast.cast_inputs("linear", x, weight, bias)

which changes nothing outside autocast or for an op the table does not name. The casts are autograd
ops (their gradients are cast back), so parameters stay float32 while the op runs in half.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from netcl.autograd import elementwise as ew
from netcl.autograd.engine import Node
from netcl.core import dtypes
from netcl.core.tensor import Tensor


@dataclass(frozen=True)
class Rule:
    """How an op's floating inputs are cast under autocast.

    cast: "half" (to the autocast dtype when the op has a path for it, `half_dtypes`, else left as they
    are) or "float32" (half inputs widened to float32: reductions, softmax and norms keep float32 results).
    """

    cast: str
    half_dtypes: frozenset[str] = frozenset()


POLICY: dict[str, Rule] = {}
_state = threading.local()


def active() -> np.dtype | None:
    """The autocast dtype in force on this thread (float16 or bfloat16), or None."""
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def enabled(dtype: np.dtype | None) -> Iterator[None]:
    """Autocast to `dtype` (None: turned off) inside the block; blocks nest, the innermost wins."""
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    stack.append(dtype)
    try:
        yield
    finally:
        stack.pop()


def target(op: str) -> np.dtype | None:
    """The dtype `op`'s floating inputs are cast to now (None: left as they are)."""
    dt = active()
    if dt is None:
        return None
    rule = POLICY.get(op)
    if rule is None:
        return None
    if rule.cast == "float32":
        return dtypes.float32
    return dt if dt.name in rule.half_dtypes else None


def cast_inputs(op: str, *xs: Any) -> tuple[Any, ...]:
    """`xs` as `op` takes them under the autocast in force: floating Nodes and Tensors of another floating
    dtype than the target are cast (float32 <-> half; float64 is left alone), anything else passes."""
    dt = target(op)
    if dt is None:
        return xs
    out = []
    for x in xs:
        value = x.value if isinstance(x, Node) else x
        if isinstance(value, Tensor) and value.dtype != dt and value.dtype in _CASTABLE:
            x = ew.cast(x, dt)
        out.append(x)
    return tuple(out)


_CASTABLE = frozenset((dtypes.float16, dtypes.bfloat16, dtypes.float32))

__all__: list[str] = []
