"""Reductions and softmax on Nodes: sum, mean, max, min, var, logsumexp, softmax and log_softmax are generated
from their declarations in netcl.ops.reduce (netcl.autograd.declared); std (sqrt of var) is written here."""

from __future__ import annotations

from typing import Any

from netcl.autograd.declared import OPS
from netcl.autograd.elementwise import sqrt
from netcl.autograd.engine import Node
from netcl.core.shapes import torch_names

# the generated ops (netcl.autograd.declared), under the names this module always had
sum = OPS["sum"]  # noqa: A001
mean = OPS["mean"]
logsumexp = OPS["logsumexp"]
var = OPS["var"]
max = OPS["max"]  # noqa: A001  (max(x, dim=d) returns PyTorch's (values, indices), as netcl.ops.max)
min = OPS["min"]  # noqa: A001
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
