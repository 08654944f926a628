"""Reductions and softmax on Nodes, each with its backward rule beside it."""

from __future__ import annotations

import builtins
import math
from typing import Any

from netcl import ops
from netcl.autograd.declared import OPS
from netcl.autograd.elementwise import sqrt
from netcl.autograd.engine import Node, as_node, record
from netcl.core.shapes import torch_names
from netcl.core.tensor import Tensor


def _axes(axis: Any, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, int):
        axis = (axis,)
    return tuple(sorted(a % ndim for a in axis))


def _keepdims_shape(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if i in axes else s for i, s in enumerate(shape))


def _expand_back(g: Tensor, in_shape: tuple[int, ...], axes: tuple[int, ...]) -> Tensor:
    """A reduced gradient seen at the input's shape (stride-0 view: no copy)."""
    return g.reshape(_keepdims_shape(in_shape, axes)).expand(in_shape)


@torch_names
def sum(x: Node, axis: Any = None, keepdims: bool = False) -> Node:  # noqa: A001
    x = as_node(x)
    xv = x.value
    axes = _axes(axis, xv.ndim)
    out = ops.sum(xv, axis=axis, keepdims=keepdims)
    return record(out, (x,), lambda g: (_expand_back(g, xv.shape, axes),), "sum")


@torch_names
def mean(x: Node, axis: Any = None, keepdims: bool = False) -> Node:
    x = as_node(x)
    xv = x.value
    axes = _axes(axis, xv.ndim)
    count = math.prod(xv.shape[a] for a in axes) or 1
    out = ops.mean(xv, axis=axis, keepdims=keepdims)
    return record(out, (x,), lambda g: (_expand_back(ops.mul(g, 1.0 / count), xv.shape, axes),), "mean")


def _argmax_of_value(x: Any, axis: Any, keepdims: bool) -> Tensor:
    """The indices half of `max(x, dim=d)` (PyTorch's pair): not differentiable, a Tensor."""
    return ops.argmax(as_node(x).value, axis, keepdims)


def _argmin_of_value(x: Any, axis: Any, keepdims: bool) -> Tensor:
    return ops.argmin(as_node(x).value, axis, keepdims)


def _extremum(name: str, x: Node, axis: Any, keepdims: bool) -> Node:
    """Gradient split evenly among the elements equal to the extremum."""
    x = as_node(x)
    xv = x.value
    axes = _axes(axis, xv.ndim)
    out = getattr(ops, name)(xv, axis=axis, keepdims=keepdims)

    def backward(g: Tensor):
        hit = ops.eq(xv, _expand_back(out, xv.shape, axes))
        ties = ops.sum(ops.cast(hit, xv.dtype), axis=tuple(axes), keepdims=True)
        share = ops.div(g.reshape(_keepdims_shape(xv.shape, axes)), ties)
        return (ops.where(hit, share, 0.0),)

    return record(out, (x,), backward, name)


@torch_names(indices="_argmax_of_value")
def max(x: Node, axis: Any = None, keepdims: bool = False) -> Node:  # noqa: A001
    return _extremum("max", x, axis, keepdims)


@torch_names(indices="_argmin_of_value")
def min(x: Node, axis: Any = None, keepdims: bool = False) -> Node:  # noqa: A001
    return _extremum("min", x, axis, keepdims)


# the generated ops (netcl.autograd.declared), under the names this module always had
softmax = OPS["softmax"]
log_softmax = OPS["log_softmax"]


@torch_names
def logsumexp(x: Node, axis: Any = None, keepdims: bool = False) -> Node:
    """d x = g exp(x - lse)."""
    x = as_node(x)
    xv = x.value
    axes = _axes(axis, xv.ndim)
    out = ops.logsumexp(xv, axis=axis, keepdims=keepdims)

    def backward(g: Tensor):
        lse = _expand_back(out, xv.shape, axes)
        return (ops.mul(_expand_back(g, xv.shape, axes), ops.exp(ops.sub(xv, lse))),)

    return record(out, (x,), backward, "logsumexp")


@torch_names
def var(x: Node, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Node:
    """Variance / (n - ddof) (NumPy's default ddof=0); d x = 2 (x - mean) g / (n - ddof)."""
    x = as_node(x)
    xv = x.value
    axes = _axes(axis, xv.ndim)
    n = math.prod(xv.shape[a] for a in axes) or 1
    out = ops.var(xv, axis=axis, keepdims=keepdims, ddof=ddof)

    def backward(g: Tensor):
        mu = ops.mean(xv, axis=axes, keepdims=True)
        scale = 2.0 / builtins.max(n - ddof, 1)
        return (ops.mul(ops.mul(ops.sub(xv, mu), scale), _expand_back(g, xv.shape, axes)),)

    return record(out, (x,), backward, "var")


@torch_names
def std(x: Node, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Node:
    return sqrt(var(x, axis=axis, keepdims=keepdims, ddof=ddof))


__all__ = [
    "log_softmax",
    "logsumexp",
    "max",
    "mean",
    "min",
    "softmax",
    "std",
    "sum",
    "var",
]
