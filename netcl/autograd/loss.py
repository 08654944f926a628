"""Losses on Nodes, each one fused kernel launch forward and one backward (kernels/loss.cl), generated from
their declarations in netcl.ops.loss (netcl.autograd.declared).

A reduced loss ('mean' or 'sum', the default 'mean') is a Tensor of shape (1,), so
`loss.value.to_host()[0]` is the number; reduction='none' keeps the per-sample shape.
Classes sit on the LAST axis: logits (..., C) with labels (...) (PyTorch puts C on axis 1).
"""

from __future__ import annotations

from netcl.autograd.declared import OPS

cross_entropy = OPS["cross_entropy"]
nll = OPS["nll"]
mse = OPS["mse"]
l1 = OPS["l1"]
smooth_l1 = OPS["smooth_l1"]
binary_cross_entropy_with_logits = OPS["binary_cross_entropy_with_logits"]
nll_loss = nll
mse_loss = mse
l1_loss = l1
smooth_l1_loss = smooth_l1


__all__ = [
    "binary_cross_entropy_with_logits",
    "cross_entropy",
    "l1",
    "l1_loss",
    "mse",
    "mse_loss",
    "nll",
    "nll_loss",
    "smooth_l1",
    "smooth_l1_loss",
]
