"""Reductions and reduction-shaped ops: sum mean prod max min argmax argmin var std logsumexp any
all, softmax log_softmax, cumsum, topk.

All take `axis=None|int|tuple` (None = every axis) and `keepdims`, or PyTorch's names for them, `dim` and
`keepdim` (shapes.torch_names; `max(x, dim=d)` and `min` then return PyTorch's (values, indices)). A
pending elementwise input is fused into the reduction kernel as its prologue: `(x * x).sum(1)` is one
launch.
Result dtypes (NumPy/PyTorch): sum/prod/cumsum of bool or integers -> int64, of floats -> the same
dtype (float16, bfloat16 and float32 accumulate in float32, float64 in double); mean/var/std/logsumexp/softmax
of integers -> float32; argmax/argmin/topk indices -> int64 (first occurrence on ties; NaN counts as
the maximum, as in NumPy); any/all -> bool; max/min keep the dtype and propagate NaN.
"""

from __future__ import annotations

import builtins
import math
from typing import Any

import numpy as np

from netcl.core import dtypes, shapes
from netcl.core.shapes import torch_names
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, ShapeError
from netcl.jit import ir, lazy
from netcl.jit import reduce as jreduce
from netcl.ops import elementwise as _ew
from netcl.ops.declaration import OpDecl, declare
from netcl.ops.elementwise import sqrt

__all__ = [
    "all",
    "any",
    "argmax",
    "argmin",
    "cumsum",
    "log_softmax",
    "logsumexp",
    "max",
    "mean",
    "min",
    "normalize_axes",
    "prod",
    "softmax",
    "std",
    "sum",
    "topk",
    "var",
]


def normalize_axes(op: str, shape: tuple[int, ...], axis: Any) -> tuple[int, ...]:
    """Sorted non-negative axes; ShapeError naming the axis and the shape when out of range."""
    nd = len(shape)
    if axis is None:
        return tuple(range(nd))
    items = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    out = []
    for a in items:
        a = shapes.size(a, f"{op}: axis", minimum=None)
        if not -nd <= a < builtins.max(nd, 1):
            raise ShapeError(f"{op}: axis {a} is out of range for a tensor of shape {shape}")
        out.append(int(a) % builtins.max(nd, 1))
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: axis {axis!r} repeats an axis (shape {shape})")
    return tuple(sorted(out)) if nd else ()


def _tensor(op: str, x: Any) -> None:
    """DTypeError naming the op for an input that is not a Tensor (checked before its dtype is read)."""
    if not isinstance(x, Tensor):
        hint = ("; move it to the device first: Tensor.from_host(queue, array)"
                if isinstance(x, (np.ndarray, list, tuple)) else "")
        raise DTypeError(f"{op}: expected a Tensor, got {type(x).__name__}{hint}")


def _prologue(x: Tensor, op: str) -> ir.Node:
    _tensor(op, x)
    if x._pending is not None and x._pending.expr.op != "input":
        if builtins.any(n.op == "index" for n in ir.walk([x._pending.expr])):
            x.realize()
    return lazy.operand(x, [])


def _out_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if d in axes else s for d, s in enumerate(shape))
    return tuple(s for d, s in enumerate(shape) if d not in axes)


def _reduce(op: str, reducer: str, x: Tensor, axis: Any, keepdims: bool, out_dtype: np.dtype,
            value_dtype: np.dtype | None = None, mean: bool = False) -> Tensor:
    expr = _prologue(x, op)
    if value_dtype is not None:
        expr = ir.cast(expr, value_dtype)
    axes = normalize_axes(op, x.shape, axis)
    R = math.prod(x.shape[d] for d in axes)
    if R == 0 and reducer in ("max", "min", "argmax", "argmin"):
        raise ShapeError(f"{op}: cannot reduce over a zero-size axis (shape {x.shape}, axis {axis})")
    out = Tensor.empty(x.queue, _out_shape(x.shape, axes, keepdims), out_dtype)
    jreduce.run("reduce", reducer, expr, x.shape, axes, out, x.queue, mean=mean)
    return out


def _int_to_float(dt: np.dtype) -> np.dtype:
    return dt if ir.is_float(dt) else ir.F32


def _sum_dtype(dt: np.dtype) -> np.dtype:
    return dt if ir.is_float(dt) else ir.I64


@torch_names
def sum(x: Tensor, axis: Any = None, keepdims: bool = False, dtype: Any = None) -> Tensor:
    """Sum over `axis`."""
    _tensor("sum", x)
    out_dt = dtypes.normalize(dtype) if dtype is not None else _sum_dtype(x.dtype)
    vdt = out_dt if (dtype is not None and ir.is_float(out_dt)) else None
    return _reduce("sum", "sum", x, axis, keepdims, out_dt, vdt)


@torch_names
def mean(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """Arithmetic mean over `axis` (NaN for an empty axis)."""
    _tensor("mean", x)
    dt = _int_to_float(x.dtype)
    return _reduce("mean", "sum", x, axis, keepdims, dt, dt, mean=True)


@torch_names
def prod(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """Product over `axis`."""
    _tensor("prod", x)
    return _reduce("prod", "prod", x, axis, keepdims, _sum_dtype(x.dtype))


@torch_names(indices="argmax")
def max(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """Maximum over `axis` (NaN if any element is NaN). Spelled as in PyTorch, `max(x, dim=d)` returns
    PyTorch's pair (values, indices) (shapes.ValuesIndices)."""
    _tensor("max", x)
    return _reduce("max", "max", x, axis, keepdims, x.dtype)


@torch_names(indices="argmin")
def min(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """Minimum over `axis` (NaN if any element is NaN). `min(x, dim=d)` returns (values, indices), as
    PyTorch's does."""
    _tensor("min", x)
    return _reduce("min", "min", x, axis, keepdims, x.dtype)


def _single_axis(op: str, x: Tensor, axis: Any) -> Any:
    if axis is None or isinstance(axis, (int, np.integer)):
        return axis
    raise ShapeError(f"{op}: axis must be None or one int, got {axis!r}")


@torch_names
def argmax(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """Index (int64) of the first maximum along `axis` (flat index when axis is None)."""
    return _reduce("argmax", "argmax", x, _single_axis("argmax", x, axis), keepdims, ir.I64)


@torch_names
def argmin(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """Index (int64) of the first minimum along `axis` (flat index when axis is None)."""
    return _reduce("argmin", "argmin", x, _single_axis("argmin", x, axis), keepdims, ir.I64)


@torch_names
def any(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """True where any element along `axis` is nonzero."""
    return _reduce("any", "any", x, axis, keepdims, ir.BOOL, ir.BOOL)


@torch_names
def all(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """True where every element along `axis` is nonzero."""
    return _reduce("all", "all", x, axis, keepdims, ir.BOOL, ir.BOOL)


@torch_names
def logsumexp(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """log(sum(exp(x))) over `axis`, computed in one pass with a running maximum."""
    _tensor("logsumexp", x)
    dt = _int_to_float(x.dtype)
    return _reduce("logsumexp", "lse", x, axis, keepdims, dt, dt)


@torch_names
def var(x: Tensor, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Tensor:
    """Variance over `axis`: mean of squared deviations from the mean (two passes), / (n - ddof)."""
    _tensor("var", x)
    axes = normalize_axes("var", x.shape, axis)
    n = math.prod(x.shape[d] for d in axes)
    xf = x if ir.is_float(x.dtype) else x.astype(ir.F32)
    m = mean(xf, axes, keepdims=True)
    d = xf - m
    s = sum(d * d, axes, keepdims=keepdims)
    return s / float(builtins.max(n - ddof, 0))  # NumPy's: ddof >= n divides by 0 (inf, or nan for 0 / 0)


@torch_names
def std(x: Tensor, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Tensor:
    """Standard deviation: sqrt(var)."""
    _tensor("std", x)
    return sqrt(var(x, axis=axis, keepdims=keepdims, ddof=ddof))


def _rowwise(op: str, mode: str, x: Tensor, axis: int) -> Tensor:
    shapes.size(axis, f"{op}: axis", minimum=None)
    expr = _prologue(x, op)
    if x.ndim == 0:
        raise ShapeError(f"{op}: needs at least one axis (got a 0-d tensor)")
    ax = normalize_axes(op, x.shape, axis)
    dt = _int_to_float(x.dtype)
    out = Tensor.empty(x.queue, x.shape, dt)
    if out.size:
        jreduce.run(mode, "lse", ir.cast(expr, dt), x.shape, ax, out, x.queue)
    return out


@torch_names
def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """exp(x - max) / sum(exp(x - max)) along `axis` (one kernel: online max and sum, then write)."""
    return _rowwise("softmax", "softmax", x, axis)


@torch_names
def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """x - logsumexp(x) along `axis` (one kernel)."""
    return _rowwise("log_softmax", "log_softmax", x, axis)


def _softmax_backward(grad_out: Tensor, out: Tensor, axis: int) -> Tensor:
    """d x = y (g - sum(g y)) along `axis`, y the softmax."""
    dot = sum(_ew.mul(grad_out, out), axis=axis, keepdims=True)
    return _ew.mul(out, _ew.sub(grad_out, dot))


def _log_softmax_backward(grad_out: Tensor, out: Tensor, axis: int) -> Tensor:
    """d x = g - exp(y) sum(g) along `axis`, y the log-softmax."""
    total = sum(grad_out, axis=axis, keepdims=True)
    return _ew.sub(grad_out, _ew.mul(_ew.exp(out), total))


# the ops on Nodes, made from these (netcl.ops.declaration): float32 under autocast; Tensor and Node methods
declare(OpDecl("softmax", softmax, _softmax_backward, inputs=("x",), autocast="float32", half_dtypes=(),
               methods=("softmax",), functional=("softmax",)))
declare(OpDecl("log_softmax", log_softmax, _log_softmax_backward, inputs=("x",), autocast="float32",
               half_dtypes=(), methods=("log_softmax",), functional=("log_softmax",)))


def sum_to_shape(g: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Sum a broadcast gradient back to `shape` (leading axes and axes where shape has 1)."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1
    )
    if not axes:
        return g.reshape(shape)
    return sum(g, axis=axes, keepdims=False).reshape(shape)


@torch_names
def cumsum(x: Tensor, axis: int) -> Tensor:
    """Inclusive prefix sum along `axis` (int64 for integer/bool input, like NumPy)."""
    if not isinstance(axis, (int, np.integer)):
        raise ShapeError(f"cumsum: axis must be one int, got {axis!r}")
    expr = _prologue(x, "cumsum")
    if x.ndim == 0:
        x = x.reshape(1)
        expr = lazy.operand(x, [])
    ax = normalize_axes("cumsum", x.shape, axis)
    out = Tensor.empty(x.queue, x.shape, _sum_dtype(x.dtype))
    if out.size:
        jreduce.run("scan", "sum", expr, x.shape, ax, out, x.queue)
    return out


TOPK_MAX = 64


@torch_names
def topk(x: Tensor, k: int, axis: int = -1) -> tuple[Tensor, Tensor]:
    """The k largest values along `axis`, sorted descending, and their int64 indices (ties: lower
    index first). Meant for small k (at most 64): each row is scanned once with a sorted buffer."""
    expr = _prologue(x, "topk")
    if x.ndim == 0:
        raise ShapeError("topk: needs at least one axis (got a 0-d tensor)")
    (ax,) = normalize_axes("topk", x.shape, axis)
    n = x.shape[ax]
    k = shapes.size(k, "topk: k")
    if not 1 <= k <= n:
        raise ShapeError(
            f"topk: k={k} must be between 1 and the axis size {n} (shape {x.shape}, axis {axis})"
        )
    if k > TOPK_MAX:
        raise ShapeError(f"topk: k={k} is above the supported {TOPK_MAX}; sort on the host for large k")
    shape = tuple(k if d == ax else s for d, s in enumerate(x.shape))
    values = Tensor.empty(x.queue, shape, x.dtype)
    indices = Tensor.empty(x.queue, shape, ir.I64)
    if values.size:
        jreduce.run("topk", "max", expr, x.shape, (ax,), values, x.queue, out_idx=indices, topk_k=int(k))
    return values, indices


# -- the reductions on Nodes (netcl.ops.declaration): each rule sees the gradient at the input's shape -------
def _reduced_axes(axis: Any, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, int):
        axis = (axis,)
    return tuple(sorted(a % ndim for a in axis))


def _expand_back(g: Tensor, in_shape: tuple[int, ...], axes: tuple[int, ...]) -> Tensor:
    """A reduced gradient seen at the input's shape (stride-0 view: no copy)."""
    return g.reshape(tuple(1 if i in axes else s for i, s in enumerate(in_shape))).expand(in_shape)


def _sum_backward(grad_out: Tensor, x_shape: tuple[int, ...], axis: Any) -> Tensor:
    return _expand_back(grad_out, x_shape, _reduced_axes(axis, len(x_shape)))


def _mean_backward(grad_out: Tensor, x_shape: tuple[int, ...], axis: Any) -> Tensor:
    axes = _reduced_axes(axis, len(x_shape))
    count = math.prod(x_shape[a] for a in axes) or 1
    return _expand_back(_ew.mul(grad_out, 1.0 / count), x_shape, axes)


def _logsumexp_backward(grad_out: Tensor, x: Tensor, out: Tensor, axis: Any) -> Tensor:
    """d x = g exp(x - lse)."""
    axes = _reduced_axes(axis, x.ndim)
    lse = _expand_back(out, x.shape, axes)
    return _ew.mul(_expand_back(grad_out, x.shape, axes), _ew.exp(_ew.sub(x, lse)))


def _var_backward(grad_out: Tensor, x: Tensor, axis: Any, ddof: int) -> Tensor:
    """d x = 2 (x - mean) g / (n - ddof)."""
    axes = _reduced_axes(axis, x.ndim)
    n = math.prod(x.shape[a] for a in axes) or 1
    mu = mean(x, axis=axes, keepdims=True)
    scale = 2.0 / builtins.max(n - ddof, 1)
    return _ew.mul(_ew.mul(_ew.sub(x, mu), scale), _expand_back(grad_out, x.shape, axes))


def _extremum_backward(grad_out: Tensor, x: Tensor, out: Tensor, axis: Any) -> Tensor:
    """The gradient split evenly among the elements equal to the extremum."""
    axes = _reduced_axes(axis, x.ndim)
    hit = _ew.eq(x, _expand_back(out, x.shape, axes))
    ties = sum(_ew.cast(hit, x.dtype), axis=tuple(axes), keepdims=True)
    share = _ew.div(grad_out.reshape(tuple(1 if i in axes else s for i, s in enumerate(x.shape))), ties)
    return _ew.where(hit, share, 0.0)


declare(OpDecl("max", max, _extremum_backward, inputs=("x",), methods=("max",)))
declare(OpDecl("min", min, _extremum_backward, inputs=("x",), methods=("min",)))
declare(OpDecl("sum", sum, _sum_backward, inputs=("x",), hide=("dtype",), methods=("sum",)))
declare(OpDecl("mean", mean, _mean_backward, inputs=("x",), methods=("mean",)))
declare(OpDecl("logsumexp", logsumexp, _logsumexp_backward, inputs=("x",), methods=("logsumexp",)))
declare(OpDecl("var", var, _var_backward, inputs=("x",), methods=("var",),
               doc="Variance / (n - ddof) (NumPy's default ddof=0); d x = 2 (x - mean) g / (n - ddof)."))
