"""Reductions and softmax on Nodes: sum, mean, var, logsumexp, softmax and log_softmax are generated from
their declarations in netcl.ops.reduce (netcl.autograd.declared); max and min (their dim= spelling returns
PyTorch's (values, indices) pair) and std (sqrt of var) are written here."""

from __future__ import annotations

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


# the generated ops (netcl.autograd.declared), under the names this module always had
sum = OPS["sum"]  # noqa: A001
mean = OPS["mean"]
logsumexp = OPS["logsumexp"]
var = OPS["var"]


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


softmax = OPS["softmax"]
log_softmax = OPS["log_softmax"]


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
