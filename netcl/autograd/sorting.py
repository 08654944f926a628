"""sort on Nodes (written by hand: it returns the indices beside the values): the sorted values are a
recorded Node whose gradient is scattered back through the indices (netcl.ops.sorting.sort_backward); the
indices are a Tensor, outside the graph, as a Node's max(dim=) gives them. argsort is its Tensor's alone
(`node.value.argsort()`)."""

from __future__ import annotations

from typing import Any

from netcl.autograd.declared import implements
from netcl.autograd.engine import Node, as_node, record
from netcl.core.shapes import ValuesIndices
from netcl.ops import sorting
from netcl.ops.sorting import NOT_GIVEN


@implements("sort")
def sort(x: Node, dim: int = -1, descending: bool = False, *, stable: bool | None = False,
         axis: Any = NOT_GIVEN, kind: str | None = None) -> Any:
    """netcl.ops.sort on a Node: (values, indices) in PyTorch's spelling, the values alone in NumPy's
    (`axis=`, `kind=`); the values are differentiable."""
    x = as_node(x)
    values, indices, ax, numpy = sorting.sorted_along("sort", x.value, dim, descending, stable, axis, kind)
    shape = x.shape
    node = record(values, (x,), lambda g: (sorting.sort_backward(g, indices, ax, shape),), "sort")
    return node if numpy else ValuesIndices(node, indices)


__all__ = ["sort"]
