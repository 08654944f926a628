"""Losses with their backward rules, each one fused kernel launch forward and one backward (kernels/loss.cl).

A reduced loss ('mean' or 'sum', the default 'mean') is a Tensor of shape (1,), so
`loss.value.to_host()[0]` is the number; reduction='none' keeps the per-sample shape.
Classes sit on the LAST axis: logits (..., C) with labels (...) (PyTorch puts C on axis 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from netcl import kernels
from netcl.autograd.engine import Node, as_node, needs_grad, record
from netcl.core.backend import device_check
from netcl.core.tensor import Tensor, check_same_queue
from netcl.errors import DTypeError, ShapeError

_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}
# what the class-loss kernels report for a label outside [0, C) other than ignore_index
_LABEL_CHECK = {name: device_check(f"{name}: label {{value}} in row {{row}} is outside [0, {{limit}}) (the number "
                                   "of classes); labels must be class indices, or ignore_index to skip a row")
                for name in ("cross_entropy", "nll")}


def _reduction_code(reduction: str) -> int:
    try:
        return _REDUCTIONS[reduction]
    except KeyError:
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}") from None


def _class_loss(
    x: Node, labels: Any, mode: int, ignore_index: int, smoothing: float, reduction: str, name: str
) -> Node:
    x = as_node(x)
    lab = labels.value if isinstance(labels, Node) else labels
    if not isinstance(lab, Tensor):
        raise TypeError(
            f"{name}: labels must be a netcl Tensor or Node of integers, got {type(lab).__name__}"
        )
    xv = x.value
    queue = check_same_queue(xv, lab)
    if lab.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise DTypeError(f"{name}: labels must be int32 or int64 class indices, got {lab.dtype}")
    if xv.ndim < 1 or xv.shape[:-1] != lab.shape:
        raise ShapeError(
            f"{name}: logits of shape {xv.shape} need labels of shape {xv.shape[:-1]} (classes on the "
            f"last axis), got labels of shape {lab.shape}"
        )
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"{name}: label_smoothing must be in [0, 1], got {smoothing}")
    red = _reduction_code(reduction)
    classes = xv.shape[-1]
    rows = lab.size
    defines = kernels.float_defines(xv.dtype, name)
    wg = kernels.work_group(queue.device)
    defines.update(LABEL="int" if lab.dtype == np.int32 else "long", MODE=mode, WG=wg)
    prg = kernels.program(queue.device, "loss.cl", **defines)
    scalar = kernels.scalar_type(xv.dtype)
    xc = xv.contiguous()
    labc = lab.contiguous()
    out = Tensor.empty(queue, lab.shape if red == 0 else (1,), xv.dtype)
    stats = Tensor.empty(queue, (max(rows, 1), 2), xv.dtype)  # per row: max and log-sum-exp of x - max
    count = Tensor.empty(queue, (1,), xv.dtype)
    common = (
        xc.buffer,
        np.int64(xc.offset),
        np.int64(rows),
        np.int64(classes),
        labc.buffer,
        np.int64(labc.offset),
        np.int64(ignore_index),
        scalar(smoothing),
        np.int32(red),
    )
    prg.class_loss_forward(queue, (wg,), (wg,), *common, out.buffer, stats.buffer, count.buffer,
                           queue.check_buffer(), _LABEL_CHECK[name])

    saved = (xc, labc, stats, count)  # the closure keeps these alive: `common` holds only raw buffers

    def backward(g: Tensor) -> tuple[Tensor | None]:
        assert saved
        gc = g.contiguous()
        grad = Tensor.empty(queue, xv.shape, xv.dtype)
        prg.class_loss_backward(
            queue,
            (classes, max(rows, 1)),
            None,
            *common,
            stats.buffer,
            count.buffer,
            gc.buffer,
            np.int64(gc.offset),
            grad.buffer,
        )
        return (grad,)

    return record(out, (x,), backward, name)


def cross_entropy(
    logits: Node, labels: Any, ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean"
) -> Node:
    """Softmax cross-entropy of logits (..., C) against integer labels (...): log-softmax and NLL
    fused in one launch. Rows whose label is ignore_index count for nothing; label_smoothing mixes
    the one-hot target with the uniform distribution (PyTorch's definition)."""
    return _class_loss(logits, labels, 1, ignore_index, float(label_smoothing), reduction, "cross_entropy")


def nll(log_probs: Node, labels: Any, ignore_index: int = -100, reduction: str = "mean") -> Node:
    """Negative log-likelihood of log-probabilities (..., C) at integer labels (...)."""
    return _class_loss(log_probs, labels, 2, ignore_index, 0.0, reduction, "nll")


nll_loss = nll

_KINDS = {"mse": 1, "l1": 2, "smooth_l1": 3, "binary_cross_entropy_with_logits": 4}


def _pointwise_loss(a: Any, b: Any, kind: str, reduction: str, beta: float = 1.0) -> Node:
    a, b = as_node(a), as_node(b)
    av, bv = a.value, b.value
    queue = check_same_queue(av, bv)
    if av.shape != bv.shape:
        raise ShapeError(f"{kind}: input of shape {av.shape} and target of shape {bv.shape} must match")
    if av.dtype != bv.dtype:
        raise DTypeError(f"{kind}: input is {av.dtype} but target is {bv.dtype}; cast one of them")
    red = _reduction_code(reduction)
    n = av.size
    wg = kernels.work_group(queue.device)
    want_b = needs_grad(b)
    defines = kernels.float_defines(av.dtype, kind)
    defines.update(KIND=_KINDS[kind], WG=wg)
    if want_b:
        defines["HAS_GRAD_B"] = None
    prg = kernels.program(queue.device, "loss.cl", **defines)
    scalar = kernels.scalar_type(av.dtype)
    ac, bc = av.contiguous(), bv.contiguous()
    args = (
        ac.buffer,
        np.int64(ac.offset),
        bc.buffer,
        np.int64(bc.offset),
        np.int64(n),
        scalar(beta),
        np.int32(red),
    )
    out = Tensor.empty(queue, av.shape if red == 0 else (1,), av.dtype)
    prg.pointwise_loss_forward(queue, (wg,), (wg,), *args, out.buffer)

    saved = (ac, bc)

    def backward(g: Tensor) -> tuple[Tensor | None, Tensor | None]:
        assert saved
        gc = g.contiguous()
        grad_a = Tensor.empty(queue, av.shape, av.dtype)
        grad_b = Tensor.empty(queue, av.shape, av.dtype) if want_b else grad_a
        prg.pointwise_loss_backward(
            queue, (max(n, 1),), None, *args, gc.buffer, np.int64(gc.offset), grad_a.buffer, grad_b.buffer
        )
        return (grad_a if a.requires_grad else None, grad_b if want_b else None)

    return record(out, (a, b), backward, kind)


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
