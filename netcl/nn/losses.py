"""Losses as modules, PyTorch's nn.CrossEntropyLoss and the rest: each keeps its options and calls the
function of the same name in netcl.autograd (nn.functional's) on `(input, target)`, so `criterion =
nn.CrossEntropyLoss(); loss = criterion(model(x), y)` reads as in PyTorch. The options are keyword-only:
PyTorch's first positional argument (a class `weight`) is not netcl's.
"""

from __future__ import annotations

from typing import Any

import netcl.autograd as ag
from netcl.autograd.engine import Node
from netcl.nn.module import Module


class CrossEntropyLoss(Module):
    """Softmax cross-entropy of logits (..., C) against integer labels (...), log-softmax and NLL fused
    (ag.cross_entropy). Classes sit on the LAST axis: for (N, C) logits that is PyTorch's layout."""

    def __init__(self, *, ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean"):
        super().__init__()
        self.ignore_index, self.label_smoothing, self.reduction = ignore_index, label_smoothing, reduction

    def forward(self, input: Node, target: Any) -> Node:
        return ag.cross_entropy(input, target, self.ignore_index, self.label_smoothing, self.reduction)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, label_smoothing={self.label_smoothing}, "
                f"reduction={self.reduction!r}")


class NLLLoss(Module):
    """Negative log-likelihood of log-probabilities (..., C) at integer labels (...) (ag.nll)."""

    def __init__(self, *, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__()
        self.ignore_index, self.reduction = ignore_index, reduction

    def forward(self, input: Node, target: Any) -> Node:
        return ag.nll(input, target, self.ignore_index, self.reduction)

    def extra_repr(self) -> str:
        return f"ignore_index={self.ignore_index}, reduction={self.reduction!r}"


class _Pointwise(Module):
    """A loss of (input, target) pairs whose one option is the reduction."""

    def __init__(self, *, reduction: str = "mean"):
        super().__init__()
        self.reduction = reduction

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


class MSELoss(_Pointwise):
    """Mean squared error (input - target)^2 (ag.mse)."""

    def forward(self, input: Node, target: Any) -> Node:
        return ag.mse(input, target, self.reduction)


class L1Loss(_Pointwise):
    """Mean absolute error |input - target| (ag.l1)."""

    def forward(self, input: Node, target: Any) -> Node:
        return ag.l1(input, target, self.reduction)


class SmoothL1Loss(Module):
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta, d = input - target (ag.smooth_l1)."""

    def __init__(self, *, reduction: str = "mean", beta: float = 1.0):
        super().__init__()
        self.reduction, self.beta = reduction, beta

    def forward(self, input: Node, target: Any) -> Node:
        return ag.smooth_l1(input, target, self.reduction, self.beta)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, beta={self.beta}"


class BCEWithLogitsLoss(_Pointwise):
    """Sigmoid and binary cross-entropy in one stable form (ag.binary_cross_entropy_with_logits)."""

    def forward(self, input: Node, target: Any) -> Node:
        return ag.binary_cross_entropy_with_logits(input, target, self.reduction)


__all__ = ["BCEWithLogitsLoss", "CrossEntropyLoss", "L1Loss", "MSELoss", "NLLLoss", "SmoothL1Loss"]
