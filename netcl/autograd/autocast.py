"""Autocast's hook: the mixed-precision dtype in force, and the cast each taking-part op gives its inputs.

netcl.amp.autocast sets the dtype (a per-thread stack); netcl.amp.policy fills POLICY, the one table of
what each op does under it. An op takes part by one call at its top, before it reads any value:

    x, weight, bias = autocast.cast_inputs("linear", x, weight, bias)

which changes nothing outside autocast or for an op the table does not name. The casts are autograd
ops (their gradients are cast back), so parameters stay float32 while the op runs in half. A leaf (a
parameter) is cast once per autocast block and dtype: later uses in the block share that cast (its
gradients add up in the one cast node), as PyTorch's autocast caches its weight casts; so is a recorded
node used by several ops. The cache is dropped when the outermost block exits (the optimizer changes the
weights between steps).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from netcl.autograd import elementwise as ew
from netcl.autograd.engine import Node, current_tape, is_recording
from netcl.core import dtypes
from netcl.core.tensor import Tensor


@dataclass(frozen=True)
class Rule:
    """How an op's floating inputs are cast under autocast.

    cast: "half" (to the autocast dtype when the op has a path for it, `half_dtypes`; else as "float32")
    or "float32" (half inputs widened to float32: the op's results and statistics stay float32).
    """

    cast: str
    half_dtypes: frozenset[str] = frozenset()


POLICY: dict[str, Rule] = {}
class _State(threading.local):
    """This thread's autocast: the stack of `enabled` blocks' dtypes and the casts they share. The class
    attributes are what a thread that never entered a block reads: a plain attribute read, where
    `getattr(local, name, None)` of a name never set raised and caught an AttributeError inside (~0.5 us
    at every autocast-aware op's check)."""

    stack: list | None = None
    cache: dict | None = None
    cache_tape: Any = None


_state = _State()


def active() -> np.dtype | None:
    """The autocast dtype in force on this thread (float16 or bfloat16), or None."""
    stack = _state.stack
    return stack[-1] if stack else None


@contextlib.contextmanager
def enabled(dtype: np.dtype | None) -> Iterator[None]:
    """Autocast to `dtype` (None: turned off) inside the block; blocks nest, the innermost wins."""
    stack = _state.stack
    if stack is None:
        stack = _state.stack = []
    if not stack:
        _state.cache, _state.cache_tape = {}, None
    stack.append(dtype)
    try:
        yield
    finally:
        stack.pop()
        if not stack:
            _state.cache, _state.cache_tape = {}, None


def target(op: str) -> np.dtype | None:
    """The dtype `op`'s floating inputs are cast to now (None: left as they are)."""
    stack = _state.stack
    dt = stack[-1] if stack else None
    if dt is None:
        return None
    rule = POLICY.get(op)
    if rule is None:
        return None
    if rule.cast == "float32":
        return dtypes.float32
    return dt if dtypes.token(dt) in rule.half_dtypes else dtypes.float32


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
            x = _cast(x, dt)
        out.append(x)
    return tuple(out)


def widened(given: Any, cast: Any) -> bool:
    """Whether cast_inputs made `cast` from `given`, a float32 Node or Tensor: the op's rule may then return
    that input's gradient in float32 (the cast's rule passes a gradient already in float32 on unchanged), as
    the GEMMs' weight gradients do (netcl.ops.gemm.matmul_wide: the float32 sums, not rounded to half and
    widened again by a launch of their own)."""
    if cast is given or given is None:
        return False
    value = given.value if isinstance(given, Node) else given
    return isinstance(value, Tensor) and value.dtype == dtypes.float32


def _cast(x: Any, dt: np.dtype) -> Any:
    """ew.cast(x, dt), shared within the autocast block for leaves (parameters, plain Tensors) and, while a
    tape records, for nodes that require grad (the tape holds them until backward anyway: a value used by
    two ops, such as a residual that is also normalised, is cast once). The key holds x (so its id stays
    its own) and the tape recording now (a cast made outside a tape has no graph to reuse inside one). A
    cast made under another tape is dropped when a new tape records: a block around several steps (each its
    own tape, the optimizer between them) neither reuses stale casts nor keeps old steps' nodes alive."""
    tape = current_tape() if is_recording() else None
    leaf = isinstance(x, Tensor) or (isinstance(x, Node) and x.is_leaf)
    cache = _state.cache
    if cache is None or not (leaf or (tape is not None and x.requires_grad)):
        return ew.cast(x, dt)
    if tape is not None and _state.cache_tape is not tape:
        cache.clear()
        _state.cache_tape = tape
    key = (id(x), dtypes.token(dt), id(tape))
    hit = cache.get(key)
    if hit is not None and hit[0] is x and hit[1] is tape and not getattr(hit[2], "_freed", False):
        return hit[2]
    y = ew.cast(x, dt)
    cache[key] = (x, tape, y)
    return y


_CASTABLE = frozenset((dtypes.float16, dtypes.bfloat16, dtypes.float32))

__all__: list[str] = []
