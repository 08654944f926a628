"""Losses with their backward rules, each one fused kernel launch forward and one backward (kernels/loss.cl).

A reduced loss ('mean' or 'sum', the default 'mean') is a Tensor of shape (1,), so
`loss.value.to_host()[0]` is the number; reduction='none' keeps the per-sample shape.
Classes sit on the LAST axis: logits (..., C) with labels (...) (PyTorch puts C on axis 1).
"""

from __future__ import annotations

from typing import Any

from netcl.autograd.engine import Node, as_node, needs_grad, record
from netcl.ops import loss as ops_loss


def _class_loss(x: Node, labels: Any, loss: str, ignore_index: int, smoothing: float, reduction: str) -> Node:
    x = as_node(x)
    lab = labels.value if isinstance(labels, Node) else labels
    out, saved = ops_loss.class_loss(x.value, lab, loss, ignore_index, smoothing, reduction)
    return record(out, (x,), lambda g: (ops_loss.class_loss_backward(saved, g),), loss)


def cross_entropy(
    logits: Node, labels: Any, ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean"
) -> Node:
    """Softmax cross-entropy of logits (..., C) against integer labels (...): log-softmax and NLL
    fused in one launch. Rows whose label is ignore_index count for nothing; label_smoothing mixes
    the one-hot target with the uniform distribution (PyTorch's definition)."""
    return _class_loss(logits, labels, "cross_entropy", ignore_index, float(label_smoothing), reduction)


def nll(log_probs: Node, labels: Any, ignore_index: int = -100, reduction: str = "mean") -> Node:
    """Negative log-likelihood of log-probabilities (..., C) at integer labels (...)."""
    return _class_loss(log_probs, labels, "nll", ignore_index, 0.0, reduction)


nll_loss = nll


def _pointwise_loss(a: Any, b: Any, loss: str, reduction: str, beta: float = 1.0) -> Node:
    a, b = as_node(a), as_node(b)
    out, saved = ops_loss.pointwise_loss(a.value, b.value, loss, reduction, beta, grad_b=needs_grad(b))

    def backward(g: Any) -> tuple[Any, Any]:
        grad_a, grad_b = ops_loss.pointwise_loss_backward(saved, g)
        return (grad_a if a.requires_grad else None, grad_b)

    return record(out, (a, b), backward, loss)


def mse(input: Node, target: Node, reduction: str = "mean") -> Node:
    """Mean squared error (input - target)^2."""
    return _pointwise_loss(input, target, "mse", reduction)


def l1(input: Node, target: Node, reduction: str = "mean") -> Node:
    """Mean absolute error |input - target|."""
    return _pointwise_loss(input, target, "l1", reduction)


def smooth_l1(input: Node, target: Node, reduction: str = "mean", beta: float = 1.0) -> Node:
    """Huber-like loss: 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (beta=0 is l1)."""
    if beta < 0:
        raise ValueError(f"smooth_l1: beta must be >= 0, got {beta}")
    if beta == 0:
        return _pointwise_loss(input, target, "l1", reduction)
    return _pointwise_loss(input, target, "smooth_l1", reduction, beta)


def binary_cross_entropy_with_logits(input: Node, target: Node, reduction: str = "mean") -> Node:
    """Sigmoid + binary cross-entropy in the stable form max(x, 0) - x y + log(1 + e^-|x|)."""
    return _pointwise_loss(input, target, "binary_cross_entropy_with_logits", reduction)


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
