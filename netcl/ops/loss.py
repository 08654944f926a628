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
from netcl.core import dtypes
from netcl.core.backend import device_check
from netcl.core.tensor import Tensor, check_same_queue
from netcl.errors import DTypeError, ShapeError

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
    xc, labc = x.contiguous(), labels.contiguous()
    acc = loss_dtype(x.dtype)
    out = Tensor.empty(queue, labels.shape if reduction == "none" else (1,), acc)
    stats = Tensor.empty(queue, (max(rows, 1), 2), acc)  # per row: max and log-sum-exp of x - max
    count = Tensor.empty(queue, (1,), acc)
    args = dict(x=xc.buffer, x_off=np.int64(xc.offset), rows=np.int64(rows), classes=np.int64(x.shape[-1]),
                labels=labc.buffer, lab_off=np.int64(labc.offset), ignore_index=np.int64(ignore_index),
                smoothing=kernels.scalar_type(acc)(smoothing))
    row_loss = Tensor.empty(queue, (max(rows, 1),), acc)  # each row's loss and whether it counts
    row_count = Tensor.empty(queue, (max(rows, 1),), acc)
    static = {"rows": args["rows"], "classes": args["classes"]}  # the call's signature (netcl.core Plan)
    if rows:  # a work-group per row, then one that adds the rows in a fixed order (reproducible)
        prg.class_loss_rows.planned(
            queue, (rows * row_wg,), (row_wg,), static, x=xc.buffer, x_off=args["x_off"], labels=labc.buffer,
            lab_off=args["lab_off"], ignore_index=args["ignore_index"], smoothing=args["smoothing"],
            out=out.buffer, stats=stats.buffer, row_loss=row_loss.buffer, row_count=row_count.buffer,
            err=queue.check_buffer(), err_code=_LABEL_CHECK[loss])
    prg.class_loss_total.planned(queue, (wg,), (wg,), {"rows": args["rows"]}, row_loss=row_loss.buffer,
                                 row_count=row_count.buffer, out=out.buffer, count=count.buffer)
    return out, Saved(prg, {**args, "stats": stats.buffer, "count": count.buffer}, x.shape, x.dtype,
                      (xc, labc, stats, count))


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
    rows = int(saved.args["rows"])
    a = saved.args
    saved.program.class_loss_backward.planned(
        queue, (saved.shape[-1], max(rows, 1)), None, {"rows": a["rows"], "classes": a["classes"]},
        **{n: v for n, v in a.items() if n not in ("rows", "classes")}, grad_out=gc.buffer,
        grad_out_off=np.int64(gc.offset), grad_x=grad.buffer)
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
