"""Fused losses on Tensors (kernels/loss.cl): each one launch forward (the values and their mean or sum
in the same kernel) and one launch backward, which reads what the forward saved. netcl.autograd.loss
records them on the tape; the public losses are there.

Classes sit on the LAST axis: logits (..., C) with labels (...). The loss and reduction reach the
kernel file by name (LOSS=LOSS_MSE, REDUCTION=REDUCE_MEAN), never as numbers both sides must agree on.

Mixed precision: float16 and bfloat16 inputs are read as they are stored and every sum is float32, so
the loss (and the gradient coming back into it) is float32 while the input's gradient has the input's
dtype; float32 and float64 inputs give a loss of their own dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from netcl import kernels
from netcl.core import capture, dtypes
from netcl.core.backend import device_check
from netcl.core.tensor import Tensor, check_same_queue
from netcl.errors import DTypeError, ShapeError
from netcl.ops.declaration import OpDecl, declare

CLASS_LOSSES = ("cross_entropy", "nll")
POINTWISE_LOSSES = ("mse", "l1", "smooth_l1", "binary_cross_entropy_with_logits")
REDUCTIONS = ("none", "mean", "sum")
_LOSS_MACROS = {"cross_entropy": "LOSS_CROSS_ENTROPY", "nll": "LOSS_NLL", "mse": "LOSS_MSE", "l1": "LOSS_L1",
                "smooth_l1": "LOSS_SMOOTH_L1", "binary_cross_entropy_with_logits": "LOSS_BCE_WITH_LOGITS"}

# what the class-loss kernels report for a label outside [0, C) other than ignore_index
_LABEL_CHECK = {
    name: device_check(
        f"{name}: label {{value}} in row {{row}} is outside [0, {{limit}}) (the number "
        "of classes); labels must be class indices, or ignore_index to skip a row"
    )
    for name in CLASS_LOSSES
}


def _reduction(reduction: str) -> str:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    return f"REDUCE_{reduction.upper()}"


@dataclass
class Saved:
    """What a loss's forward keeps for its backward: the program, the forward's arguments by name, the
    per-row statistics (class losses) and the input's shape and dtype."""

    program: Any
    args: dict[str, Any]
    shape: tuple[int, ...]
    dtype: np.dtype
    tensors: tuple[Tensor, ...]  # keep the buffers in `args` alive
    grad_b: bool = False
    backward: Any = None  # the backward launch's Plan (class losses)


# Tests set this to run class_loss_rows' GPU shape (a work-group tree per row) on any device.
row_work_group_override: int | None = None


def class_loss(x: Tensor, labels: Tensor, loss: str = "cross_entropy", ignore_index: int = -100,
               smoothing: float = 0.0, reduction: str = "mean") -> tuple[Tensor, Saved]:
    """(loss, saved) of `loss` ("cross_entropy": log-softmax and NLL fused; "nll": on log-probabilities)
    of x (..., C) at integer labels (...). Rows labelled ignore_index count for nothing; `smoothing`
    mixes the one-hot target with the uniform distribution (PyTorch's label_smoothing). The result has
    shape (1,) for 'mean' and 'sum', labels' shape for 'none'."""
    if loss not in CLASS_LOSSES:
        raise ValueError(f"class loss must be one of {CLASS_LOSSES}, got {loss!r}")
    if not isinstance(labels, Tensor):
        raise TypeError(
            f"{loss}: labels must be a netcl Tensor or Node of integers, got {type(labels).__name__}"
        )
    queue = check_same_queue(x, labels)
    # the launches of this call signature, built once (checks, program, static arguments): capture.plans
    key = ("class_loss", id(queue.device), x.dtype, x.shape, labels.dtype, labels.shape, loss, ignore_index,
           repr(smoothing), reduction, row_work_group_override)
    plan = capture.plans.get(key)
    if plan is None:
        plan = capture.plans.put(key, _class_loss_plan(x, labels, loss, ignore_index, smoothing, reduction))
    prg, rows_launch, total_launch, backward_launch, acc, out_shape, statics = plan
    rows = max(int(statics["rows"]), 1)
    xc, labc = x.contiguous(), labels.contiguous()
    out = Tensor.empty(queue, out_shape, acc)
    stats = Tensor.empty(queue, (rows, 2), acc)  # per row: max and log-sum-exp of x - max
    count = Tensor.empty(queue, (1,), acc)
    row_loss = Tensor.empty(queue, (rows,), acc)  # each row's loss and whether it counts
    row_count = Tensor.empty(queue, (rows,), acc)
    # the offsets as Python ints (each Plan sets the long it was built with); each buffer read once
    x_off, lab_off = xc.offset, labc.offset
    x_buf, lab_buf, out_buf, stats_buf = xc.buffer, labc.buffer, out.buffer, stats.buffer
    count_buf, row_loss_buf, row_count_buf = count.buffer, row_loss.buffer, row_count.buffer
    if rows_launch is not None:  # a work-group per row, then one that adds the rows in a fixed order
        rows_launch(queue, x_buf, x_off, lab_buf, lab_off, out_buf, stats_buf, row_loss_buf, row_count_buf,
                    queue.check_buffer())
    total_launch(queue, row_loss_buf, row_count_buf, out_buf, count_buf)
    args = dict(x=x_buf, x_off=x_off, labels=lab_buf, lab_off=lab_off, stats=stats_buf, count=count_buf,
                **statics)
    return out, Saved(prg, args, x.shape, x.dtype, (xc, labc, stats, count), backward=backward_launch)


def _class_loss_plan(x: Tensor, labels: Tensor, loss: str, ignore_index: int, smoothing: float,
                     reduction: str) -> tuple:
    """class_loss's checks and launches for one call signature: (program, the rows', total's and
    backward's Plans (netcl.core.backend; buffers and offsets per call), loss dtype, result shape, the
    static scalar arguments by name)."""
    queue = x.queue
    if labels.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise DTypeError(f"{loss}: labels must be int32 or int64 class indices, got {labels.dtype}")
    if x.ndim < 1 or x.shape[:-1] != labels.shape:
        raise ShapeError(
            f"{loss}: logits of shape {x.shape} need labels of shape {x.shape[:-1]} (classes on the "
            f"last axis), got labels of shape {labels.shape}"
        )
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"{loss}: label_smoothing must be in [0, 1], got {smoothing}")
    red = _reduction(reduction)
    rows = labels.size
    wg = kernels.work_group(queue.device)
    row_wg = row_work_group_override or (1 if queue.device.capabilities.kind == "cpu" else wg)  # CPUs: a
    # work-item per row (no barriers); GPUs: a work-group per row
    prg = kernels.program(
        queue.device,
        "loss.cl",
        **kernels.float_defines(x.dtype, loss, half=True),
        LOSS=_LOSS_MACROS[loss],
        REDUCTION=red,
        LABEL="int" if labels.dtype == np.int32 else "long",
        WG=wg,
        ROW_WG=row_wg,
    )
    acc = loss_dtype(x.dtype)
    statics = dict(rows=np.int64(rows), classes=np.int64(x.shape[-1]), ignore_index=np.int64(ignore_index),
                   smoothing=kernels.scalar_type(acc)(smoothing))
    # the offsets' type (a launch passes them as Python ints: the plans set them as these longs)
    offsets = dict(x_off=np.int64(0), lab_off=np.int64(0))
    rows_launch = None
    if rows:
        kernel = prg.class_loss_rows
        dynamic = ("x", "x_off", "labels", "lab_off", "out", "stats", "row_loss", "row_count", "err")
        rows_launch = kernel.plan((rows * row_wg,), (row_wg,), kernel.positional(
            (), {**statics, **dict.fromkeys(dynamic), **offsets, "err_code": _LABEL_CHECK[loss]}),
            [kernel.arg_index[n] for n in dynamic])
    kernel = prg.class_loss_total
    dynamic = ("row_loss", "row_count", "out", "count")
    total_launch = kernel.plan((wg,), (wg,), kernel.positional((), {"rows": statics["rows"],
                                                                    **dict.fromkeys(dynamic)}),
                               [kernel.arg_index[n] for n in dynamic])
    kernel = prg.class_loss_backward
    dynamic = ("x", "x_off", "labels", "lab_off", "stats", "count", "grad_out", "grad_out_off", "grad_x")
    backward_launch = kernel.plan((x.shape[-1], max(rows, 1)), None, kernel.positional(
        (), {**statics, **dict.fromkeys(dynamic), **offsets, "grad_out_off": np.int64(0)}),
        [kernel.arg_index[n] for n in dynamic])
    out_shape = labels.shape if reduction == "none" else (1,)
    return prg, rows_launch, total_launch, backward_launch, acc, out_shape, statics


def loss_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype of a loss of inputs of `dtype` (and of the gradient flowing into it): float32 for half
    inputs."""
    return dtypes.float32 if dtypes.is_half(dtype) else np.dtype(dtype)


def _grad_in(grad_out: Tensor, saved: Saved) -> Tensor:
    want = loss_dtype(saved.dtype)
    gc = grad_out.contiguous()
    return gc if gc.dtype == want else gc.astype(want)


def class_loss_backward(saved: Saved, grad_out: Tensor) -> Tensor:
    """d loss / d x of class_loss, given d (result) as grad_out."""
    queue = grad_out.queue
    gc = _grad_in(grad_out, saved)
    grad = Tensor.empty(queue, saved.shape, saved.dtype)
    a = saved.args
    saved.backward(queue, a["x"], a["x_off"], a["labels"], a["lab_off"], a["stats"], a["count"], gc.buffer,
                   gc.offset, grad.buffer)
    return grad


def pointwise_loss(a: Tensor, b: Tensor, loss: str, reduction: str = "mean", beta: float = 1.0,
                   grad_b: bool = False) -> tuple[Tensor, Saved]:
    """(loss, saved) of `loss` between input a and target b of one shape and dtype: "mse", "l1",
    "smooth_l1" (quadratic below `beta`) or "binary_cross_entropy_with_logits". grad_b: the backward
    also gives the target's gradient."""
    if loss not in POINTWISE_LOSSES:
        raise ValueError(f"pointwise loss must be one of {POINTWISE_LOSSES}, got {loss!r}")
    queue = check_same_queue(a, b)
    if a.shape != b.shape:
        raise ShapeError(f"{loss}: input of shape {a.shape} and target of shape {b.shape} must match")
    if a.dtype != b.dtype:
        raise DTypeError(f"{loss}: input is {a.dtype} but target is {b.dtype}; cast one of them")
    red = _reduction(reduction)
    wg = kernels.work_group(queue.device)
    defines = {
        **kernels.float_defines(a.dtype, loss, half=True),
        "LOSS": _LOSS_MACROS[loss],
        "REDUCTION": red,
        "WG": wg,
    }
    if grad_b:
        defines["HAS_GRAD_B"] = None
    prg = kernels.program(queue.device, "loss.cl", **defines)
    ac, bc = a.contiguous(), b.contiguous()
    args = dict(a=ac.buffer, a_off=np.int64(ac.offset), b=bc.buffer, b_off=np.int64(bc.offset),
                n=np.int64(a.size), beta=kernels.scalar_type(a.dtype)(beta))
    out = Tensor.empty(queue, a.shape if reduction == "none" else (1,), loss_dtype(a.dtype))
    prg.pointwise_loss_forward(queue, (wg,), (wg,), **args, out=out.buffer)
    return out, Saved(prg, args, a.shape, a.dtype, (ac, bc), grad_b)


def pointwise_loss_backward(saved: Saved, grad_out: Tensor) -> tuple[Tensor, Tensor | None]:
    """(d loss / d a, d loss / d b or None unless the forward had grad_b) of pointwise_loss."""
    queue = grad_out.queue
    gc = _grad_in(grad_out, saved)
    grad_a = Tensor.empty(queue, saved.shape, saved.dtype)
    grad_b = Tensor.empty(queue, saved.shape, saved.dtype) if saved.grad_b else grad_a
    saved.program.pointwise_loss_backward(queue, (max(int(saved.args["n"]), 1),), None, **saved.args,
                                          grad_out=gc.buffer, grad_out_off=np.int64(gc.offset),
                                          grad_a=grad_a.buffer, grad_b=grad_b.buffer)
    return grad_a, grad_b if saved.grad_b else None


# -- the losses on Nodes (netcl.ops.declaration): labels are constants; a reduced loss has shape (1,) ------
def cross_entropy_forward(logits: Tensor, labels: Tensor, ignore_index: int = -100,
                          label_smoothing: float = 0.0, reduction: str = "mean") -> tuple[Tensor, Saved]:
    """Softmax cross-entropy of logits (..., C) against integer labels (...): log-softmax and NLL
    fused in one launch. Rows whose label is ignore_index count for nothing; label_smoothing mixes
    the one-hot target with the uniform distribution (PyTorch's definition)."""
    return class_loss(logits, labels, "cross_entropy", ignore_index, float(label_smoothing), reduction)


def nll_forward(log_probs: Tensor, labels: Tensor, ignore_index: int = -100,
                reduction: str = "mean") -> tuple[Tensor, Saved]:
    """Negative log-likelihood of log-probabilities (..., C) at integer labels (...)."""
    return class_loss(log_probs, labels, "nll", ignore_index, 0.0, reduction)


# `needs`: whether (input, target) get a gradient (filled by the op on Nodes): the kernels for the target's
# gradient are built only when it does
def mse_forward(input: Tensor, target: Tensor, reduction: str = "mean",
                needs: tuple[bool, ...] = (True, False)) -> tuple[Tensor, Saved]:
    """Mean squared error (input - target)^2."""
    return pointwise_loss(input, target, "mse", reduction, grad_b=needs[1])


def l1_forward(input: Tensor, target: Tensor, reduction: str = "mean",
               needs: tuple[bool, ...] = (True, False)) -> tuple[Tensor, Saved]:
    """Mean absolute error |input - target|."""
    return pointwise_loss(input, target, "l1", reduction, grad_b=needs[1])


def smooth_l1_forward(input: Tensor, target: Tensor, reduction: str = "mean", beta: float = 1.0,
                      needs: tuple[bool, ...] = (True, False)) -> tuple[Tensor, Saved]:
    """Huber-like loss: 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (beta=0 is l1)."""
    if beta < 0:
        raise ValueError(f"smooth_l1: beta must be >= 0, got {beta}")
    if beta == 0:
        return pointwise_loss(input, target, "l1", reduction, grad_b=needs[1])
    return pointwise_loss(input, target, "smooth_l1", reduction, beta, grad_b=needs[1])


def binary_cross_entropy_with_logits_forward(input: Tensor, target: Tensor, reduction: str = "mean",
                                             needs: tuple[bool, ...] = (True, False)) -> tuple[Tensor, Saved]:
    """Sigmoid + binary cross-entropy in the stable form max(x, 0) - x y + log(1 + e^-|x|)."""
    return pointwise_loss(input, target, "binary_cross_entropy_with_logits", reduction, grad_b=needs[1])


declare(OpDecl("cross_entropy", cross_entropy_forward, class_loss_backward, inputs=("logits",),
               constants=("labels",), saves=("saved",), functional=("cross_entropy",)))
declare(OpDecl("nll", nll_forward, class_loss_backward, inputs=("log_probs",), constants=("labels",),
               saves=("saved",), functional=("nll", "nll_loss")))
for _name, _forward, _functional in (
    ("mse", mse_forward, ("mse", "mse_loss")),
    ("l1", l1_forward, ("l1", "l1_loss")),
    ("smooth_l1", smooth_l1_forward, ("smooth_l1", "smooth_l1_loss")),
    ("binary_cross_entropy_with_logits", binary_cross_entropy_with_logits_forward,
     ("binary_cross_entropy_with_logits",)),
):
    declare(OpDecl(_name, _forward, pointwise_loss_backward, inputs=("input", "target"), saves=("saved",),
                   functional=_functional))
