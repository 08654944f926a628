"""sort and argsort along one axis, on the device (netcl/kernels/sort.cl: a bitonic network over (value,
position) pairs, rows padded to a power of two), and the sorted values' gradient (a scatter through the
indices).

PyTorch's spellings and NumPy's: `sort(x, dim=-1, descending=False, stable=False)` returns (values, indices)
as torch.sort does; spelled with NumPy's `axis=` or `kind=` it returns the values alone, as np.sort does.
`argsort` returns the indices in both libraries' spellings.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from netcl import kernels
from netcl.core import dtypes, shapes
from netcl.core.shapes import ValuesIndices
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, ShapeError
from netcl.ops.declaration import OpDecl, declare

__all__ = ["argsort", "sort"]

# Work-items of the chunk kernels (sort_rows, sort_first, sort_merge): each work-group sorts 2 * SORT_WG
# padded elements in local memory. One size per device (PoCL compiles a work-group function per local size).
SORT_WG = 256
# The longest axis sorted: positions are int in the kernel, and a row is padded to the next power of two.
MAX_LENGTH = 1 << 30
# np.sort's kinds -> whether the kind asks for a stable sort (every sort here is stable)
_KINDS = {"quicksort": False, "heapsort": False, "mergesort": True, "stable": True}


class _NotGiven:
    """The default of NumPy's `axis=`: not given (the spelling is PyTorch's, dim= decides the axis)."""

    def __repr__(self) -> str:
        return "<not given>"


NOT_GIVEN: Any = _NotGiven()


def sorted_along(op: str, x: Tensor, dim: Any = -1, descending: Any = False, stable: Any = False,
                 axis: Any = NOT_GIVEN, kind: Any = None) -> tuple[Tensor, Tensor, int | None, bool]:
    """sort's and argsort's work on their arguments as given: (values, indices, the axis sorted or None for
    NumPy's axis=None, which sorts the flattened tensor, whether the call was spelled as NumPy's)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: expected a Tensor, got {type(x).__name__}")
    if not isinstance(descending, (bool, np.bool_)):
        hint = (f"; NumPy's kind goes by name here: kind={descending!r}" if isinstance(descending, str)
                else "")
        raise TypeError(f"{op}: descending must be True or False, got {descending!r}{hint}")
    if stable is not None and not isinstance(stable, (bool, np.bool_)):
        raise TypeError(f"{op}: stable must be True, False or None, got {stable!r}")
    if kind is not None:
        if kind not in _KINDS:
            raise ValueError(f"{op}: kind must be one of {sorted(_KINDS)} (NumPy's) or None, got {kind!r}")
        if stable is not None and stable is not False:
            raise ValueError(f"{op}: give kind= (NumPy's) or stable= (PyTorch's and NumPy's), not both")
    numpy = axis is not NOT_GIVEN or kind is not None
    if axis is not NOT_GIVEN:
        if dim != -1:
            raise TypeError(f"{op}: dim={dim!r} and axis={axis!r} are one argument (PyTorch's name and "
                            f"NumPy's); give one of them")
        dim = axis
    if dim is None:   # NumPy's axis=None: the flattened tensor
        values, indices, _, _ = sorted_along(op, x.reshape(x.size), 0, descending, stable)
        return values, indices, None, numpy
    if x.ndim == 0:   # (PyTorch's: a 0-d tensor sorts along dim -1 or 0 as one element)
        shapes.axis(dim, 1, f"{op}: dim", shape_of=x.shape)
        values, indices, _, _ = sorted_along(op, x.reshape(1), 0, descending, stable)
        return values.reshape(()), indices.reshape(()), 0, numpy
    ax = shapes.axis(dim, x.ndim, f"{op}: dim", shape_of=x.shape)
    n = x.shape[ax]
    if n > MAX_LENGTH:
        raise ShapeError(f"{op}: an axis of {n} elements is longer than the {MAX_LENGTH} netcl sorts")
    order = [d for d in range(x.ndim) if d != ax] + [ax]
    moved = x.permute(order)
    rows = moved.size // n if n else int(np.prod(moved.shape[:-1]))
    values, indices = _sort_rows(moved.reshape(rows, n), bool(descending))
    inverse = [0] * x.ndim
    for i, d in enumerate(order):
        inverse[d] = i
    return (values.reshape(moved.shape).permute(inverse), indices.reshape(moved.shape).permute(inverse), ax,
            numpy)


def sort(x: Tensor, dim: int = -1, descending: bool = False, *, stable: bool | None = False,
         axis: Any = NOT_GIVEN, kind: str | None = None) -> Any:
    """x sorted along `dim` (the last axis by default), ascending unless `descending`, as torch.sort: returns
    (values, indices), indices int64 (shapes.ValuesIndices: `.values`, `.indices`, or unpack). Spelled as
    np.sort, with `axis=` (None: the flattened tensor) or `kind=`, it returns the values alone. Unlike NumPy's
    `a.sort()`, `x.sort()` sorts nothing in place (`x[...] = x.sort().values` does).

    NaN sorts after every number (descending: before, as PyTorch's), -0.0 and 0.0 are equal. Equal values
    keep their order along the axis whatever `stable` says (False, PyTorch's default, gives the stable order
    too: the network orders (value, position) pairs), as np.sort(kind="stable") and torch.sort(stable=True);
    `kind` takes NumPy's names. Every dtype. The values' gradient flows back through the indices."""
    values, indices, _, numpy = sorted_along("sort", x, dim, descending, stable, axis, kind)
    return values if numpy else ValuesIndices(values, indices)


def argsort(x: Tensor, dim: int = -1, descending: bool = False, stable: bool | None = False, *,
            axis: Any = NOT_GIVEN, kind: str | None = None) -> Tensor:
    """The int64 indices that sort x along `dim` (torch.argsort; np.argsort's `axis=`, None for the flattened
    tensor, and `kind=`): sort's indices, with its order (NaN last, or first when descending; equal values
    in their order along the axis, stable or not)."""
    return sorted_along("argsort", x, dim, descending, stable, axis, kind)[1]


def _work_group(device: Any, key_dtype: np.dtype) -> int:
    """The chunk kernels' local size on `device`: SORT_WG, or less where the device's work-groups or local
    memory (2 * WG keys and int positions) are smaller."""
    caps = device.capabilities
    wg = min(SORT_WG, 1 << (caps.max_work_group_size.bit_length() - 1))
    while wg > 1 and 2 * wg * (key_dtype.itemsize + 4) > caps.local_mem:
        wg //= 2
    return wg


def _program(x: Tensor, key_dtype: np.dtype) -> tuple[Any, int]:
    wg = _work_group(x.device, key_dtype)
    floating = {"FLOATING": None} if dtypes.is_floating(x.dtype) else {}
    return kernels.program(x.device, "sort.cl", dtype=x.dtype, WG=wg, **floating), wg


def _sort_rows(x2: Tensor, descending: bool) -> tuple[Tensor, Tensor]:
    """Each row of the 2-D view x2 sorted: (values, int64 indices), contiguous (rows, n)."""
    rows, n = x2.shape
    queue = x2.queue
    values = Tensor.empty(queue, (rows, n), x2.dtype)
    indices = Tensor.empty(queue, (rows, n), dtypes.int64)
    if values.size == 0:
        return values, indices
    key_dtype = dtypes.float32 if dtypes.is_half(x2.dtype) else x2.dtype   # common.cl's ACC
    prg, wg = _program(x2, key_dtype)
    chunk = 2 * wg
    P = max(2, 1 << (n - 1).bit_length())
    source = (x2.buffer, np.int64(x2.offset), np.int64(x2.strides[0]), np.int64(x2.strides[1]),
              np.int64(rows), np.int32(n), np.int64(P), np.int32(descending))
    if P <= chunk:
        groups = -(-rows * P // chunk)
        prg.sort_rows(queue, (groups * wg,), (wg,), *source, values.buffer, indices.buffer)
        return values, indices
    total = rows * P   # a multiple of chunk
    keys = Tensor.empty(queue, (total,), key_dtype)
    positions = Tensor.empty(queue, (total,), dtypes.int32)
    groups = total // chunk
    prg.sort_first(queue, (groups * wg,), (wg,), *source, keys.buffer, positions.buffer)
    k = 2 * chunk
    while k <= P:
        j = k // 2
        while j >= chunk:
            prg.sort_step(queue, (total // 2,), None, keys.buffer, positions.buffer, np.int64(total // 2),
                          np.int64(P), np.int64(k), np.int64(j), np.int32(n), np.int32(descending))
            j //= 2
        prg.sort_merge(queue, (groups * wg,), (wg,), keys.buffer, positions.buffer, np.int64(rows),
                       np.int32(n), np.int64(P), np.int64(k), np.int32(descending), np.int32(k == P),
                       values.buffer, indices.buffer)
        k *= 2
    return values, indices


def sort_backward(grad_out: Tensor, indices: Tensor, axis: int | None, x_shape: tuple[int, ...]) -> Tensor:
    """The gradient of sort's values at the input: grad_out's elements put back where the indices say they
    came from (axis None: a sort of the flattened input). One launch; every element is written once."""
    if not dtypes.is_floating(grad_out.dtype):
        raise DTypeError(f"sort: a gradient must be floating, got {grad_out.dtype}")
    if axis is None:
        return sort_backward(grad_out, indices, 0, (grad_out.size,)).reshape(x_shape)
    if not x_shape:
        return grad_out.clone()
    n = x_shape[axis]
    order = [d for d in range(len(x_shape)) if d != axis] + [axis]
    g2 = grad_out.permute(order)
    moved_shape = g2.shape
    rows = g2.size // n if n else 0
    g2 = g2.reshape(rows, n)
    i2 = indices.permute(order).reshape(rows, n)   # a view: sort's indices are its own, laid out this way
    gx = Tensor.empty(grad_out.queue, (rows, n), grad_out.dtype)
    if gx.size:
        key_dtype = dtypes.float32 if dtypes.is_half(gx.dtype) else gx.dtype
        prg, _ = _program(gx, key_dtype)
        prg.sort_scatter(grad_out.queue, (rows * n,), None, g2.buffer, np.int64(g2.offset),
                         np.int64(g2.strides[0]), np.int64(g2.strides[1]), i2.buffer, np.int64(rows),
                         np.int64(n), gx.buffer)
    inverse = [0] * len(x_shape)
    for i, d in enumerate(order):
        inverse[d] = i
    return gx.reshape(moved_shape).permute(inverse)


# Tensor.sort (the forward) and Node.sort, its hand-written differentiable op (netcl.autograd.sorting:
# (values, indices) with the indices outside the graph); argsort is Tensor's alone (netcl.ops.operators)
declare(OpDecl("sort", sort, inputs=("x",), methods=("sort",), autograd="manual",
               doc="x sorted along one axis: (values, indices), as torch.sort; the values' gradient is "
                   "scattered back through the indices."))
