"""Shape and indexing ops on Nodes (views where possible): reshape, permute, transpose, squeeze, unsqueeze,
expand and getitem are generated from their declarations in netcl.ops.movement; contiguous, concat, stack and
the composites (flatten, split, chunk) are written here with their backward rules."""

from __future__ import annotations

from netcl import ops
from netcl.autograd.declared import OPS
from netcl.autograd.engine import Node, as_node, record
from netcl.core import shapes
from netcl.core.shapes import torch_names
from netcl.core.tensor import Tensor

# the view ops generated from their declarations in netcl.ops.movement (netcl.autograd.declared)
reshape = OPS["reshape"]
view = reshape
permute = OPS["permute"]
transpose = OPS["transpose"]
squeeze = OPS["squeeze"]
unsqueeze = OPS["unsqueeze"]
expand = OPS["expand"]
getitem = OPS["getitem"]


def contiguous(x: Node) -> Node:
    x = as_node(x)
    return record(x.value.contiguous(), (x,), lambda g: (g,), "contiguous")


def flatten(x: Node, start_dim: int = 0, end_dim: int = -1) -> Node:
    """Axes start_dim..end_dim merged into one (torch.flatten: all of them unless told; nn.Flatten keeps
    the batch axis with its start_dim=1)."""
    x = as_node(x)
    return reshape(x, shapes.flattened(x.shape, start_dim, end_dim))


@torch_names
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


@torch_names
def stack(xs: list[Node], axis: int = 0) -> Node:
    nodes = [unsqueeze(as_node(x), axis) for x in xs]
    return concat(nodes, axis=axis)


@torch_names
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


@torch_names
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
