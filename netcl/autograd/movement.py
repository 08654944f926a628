"""Shape and indexing ops on Nodes (views where possible), each with its backward rule beside it."""

from __future__ import annotations

from typing import Any

from netcl import ops
from netcl.autograd.elementwise import sum_to_shape
from netcl.autograd.engine import Node, as_node, record
from netcl.core.tensor import Tensor


def reshape(x: Node, *shape: Any) -> Node:
    x = as_node(x)
    in_shape = x.shape
    out = x.value.reshape(*shape)
    return record(out, (x,), lambda g: (g.reshape(in_shape),), "reshape")


view = reshape


def flatten(x: Node, start_dim: int = 1, end_dim: int = -1) -> Node:
    shape = x.shape
    nd = len(shape)
    s, e = start_dim % nd, end_dim % nd
    merged = 1
    for d in shape[s : e + 1]:
        merged *= d
    return reshape(x, shape[:s] + (merged,) + shape[e + 1 :])


def permute(x: Node, *dims: Any) -> Node:
    x = as_node(x)
    out = x.value.permute(*dims)
    axes = tuple(dims[0]) if len(dims) == 1 and not isinstance(dims[0], int) else tuple(dims)
    axes = tuple(a % x.ndim for a in axes)
    inverse = [0] * len(axes)
    for i, a in enumerate(axes):
        inverse[a] = i
    return record(out, (x,), lambda g: (g.permute(inverse),), "permute")


def transpose(x: Node, dim0: int = -2, dim1: int = -1) -> Node:
    x = as_node(x)
    out = x.value.transpose(dim0, dim1)
    return record(out, (x,), lambda g: (g.transpose(dim0, dim1),), "transpose")


def squeeze(x: Node, axis: int | None = None) -> Node:
    x = as_node(x)
    in_shape = x.shape
    return record(x.value.squeeze(axis), (x,), lambda g: (g.reshape(in_shape),), "squeeze")


def unsqueeze(x: Node, axis: int) -> Node:
    x = as_node(x)
    in_shape = x.shape
    return record(x.value.unsqueeze(axis), (x,), lambda g: (g.reshape(in_shape),), "unsqueeze")


def expand(x: Node, *shape: Any) -> Node:
    x = as_node(x)
    in_shape = x.shape
    return record(x.value.expand(*shape), (x,), lambda g: (sum_to_shape(g, in_shape),), "expand")


def contiguous(x: Node) -> Node:
    x = as_node(x)
    return record(x.value.contiguous(), (x,), lambda g: (g,), "contiguous")


def getitem(x: Node, index: Any) -> Node:
    """Basic indexing (a view); the gradient is scattered into zeros of the input's shape."""
    x = as_node(x)
    xv = x.value
    out = xv[index]

    def backward(g: Tensor):
        full = Tensor.zeros(xv.queue, xv.shape, g.dtype)
        ops.setitem(full, index, g)
        return (full,)

    return record(out, (x,), backward, "getitem")


def concat(xs: list[Node], axis: int = 0) -> Node:
    """Join along `axis`; each input's gradient is its slice of g (a view)."""
    nodes = [as_node(x) for x in xs]
    ax = axis % nodes[0].ndim
    sizes = [n.shape[ax] for n in nodes]
    if hasattr(ops, "concat"):
        out = ops.concat([n.value for n in nodes], axis=axis)
    else:  # until netcl.ops has concat: one assignment per piece into the joined tensor
        first = nodes[0].value
        shape = first.shape[:ax] + (sum(sizes),) + first.shape[ax + 1 :]
        out = Tensor.empty(first.queue, shape, first.dtype)
        start = 0
        for n, size in zip(nodes, sizes):
            ops.assign(out[(slice(None),) * ax + (slice(start, start + size),)], n.value)
            start += size

    def backward(g: Tensor):
        grads, start = [], 0
        for size in sizes:
            idx = (slice(None),) * ax + (slice(start, start + size),)
            grads.append(g[idx])
            start += size
        return tuple(grads)

    return record(out, tuple(nodes), backward, "concat")


cat = concat


def stack(xs: list[Node], axis: int = 0) -> Node:
    nodes = [unsqueeze(as_node(x), axis) for x in xs]
    return concat(nodes, axis=axis)


def split(x: Node, sizes: int | list[int], axis: int = 0) -> list[Node]:
    """Pieces of x along axis (views through getitem)."""
    x = as_node(x)
    ax = axis % x.ndim
    total = x.shape[ax]
    if isinstance(sizes, int):
        sizes = [sizes] * (total // sizes) + ([total % sizes] if total % sizes else [])
    pieces, start = [], 0
    for s in sizes:
        pieces.append(getitem(x, (slice(None),) * ax + (slice(start, start + s),)))
        start += s
    return pieces


def chunk(x: Node, chunks: int, axis: int = 0) -> list[Node]:
    size = -(-x.shape[axis % x.ndim] // chunks)
    return split(x, size, axis)


__all__ = [
    "cat",
    "chunk",
    "concat",
    "contiguous",
    "expand",
    "flatten",
    "getitem",
    "permute",
    "reshape",
    "split",
    "squeeze",
    "stack",
    "transpose",
    "unsqueeze",
    "view",
]
