"""clip_grad_norm_: scale all gradients so their joint L2 norm is at most max_norm, without a host sync."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from netcl import kernels
from netcl.autograd.engine import Node
from netcl.core.tensor import Tensor
from netcl.errors import NetclError
from netcl.optim.arguments import Flag, Real


def clip_grad_norm_(
    parameters: Iterable[Node] | Node,
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
) -> Tensor:
    """Scale the gradients in place by min(1, max_norm / (norm + 1e-6)) (PyTorch's rule) and return
    the total norm before clipping as a Tensor of shape (1,). The norm never leaves the device:
    2N + 1 launches for N gradients (partial sums, the coefficient, the scaling).

    max_norm is a number >= 0 (inf: never clip); a negative one would flip the gradients. With
    error_if_nonfinite=True the norm is read back (one host sync) and a NaN or infinite norm raises
    NetclError before any gradient is scaled; by default a NaN norm leaves the gradients as they
    are and an infinite one scales them by 0, like the kernel's min(1, max_norm / norm)."""
    if isinstance(parameters, Node):
        parameters = [parameters]
    max_norm = Real(0, allow_inf=True)(max_norm, "clip_grad_norm_: max_norm")
    norm_type = Real(allow_inf=True)(norm_type, "clip_grad_norm_: norm_type")
    if float(norm_type) != 2.0:
        raise NotImplementedError(f"clip_grad_norm_ supports the L2 norm (norm_type=2), got {norm_type}")
    error_if_nonfinite = Flag()(error_if_nonfinite, "clip_grad_norm_: error_if_nonfinite")
    if isinstance(parameters, (Tensor, str, bytes)):
        raise TypeError(f"clip_grad_norm_: parameters must be Parameters, got {type(parameters).__name__}")
    try:
        params = list(parameters)
    except TypeError:
        raise TypeError(
            f"clip_grad_norm_: parameters must be an iterable of Parameters, got {type(parameters).__name__}"
        ) from None
    for i, p in enumerate(params):
        if not isinstance(p, Node):
            raise TypeError(f"clip_grad_norm_: parameters[{i}] is a {type(p).__name__}, not a Parameter")
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        raise NetclError("clip_grad_norm_: no parameter has a gradient (call backward first)")
    queue = grads[0].queue
    dtype = grads[0].dtype
    for g in grads:
        if g.queue is not queue or g.dtype != dtype:
            raise NetclError("clip_grad_norm_: all gradients must share one queue and one dtype")
        if not g.is_contiguous():
            raise NetclError(
                f"clip_grad_norm_: a gradient of shape {g.shape} is not contiguous; gradients are scaled "
                "in place, so they must be contiguous"
            )
    defines = kernels.float_defines(dtype, "clip_grad_norm_")
    wg = kernels.work_group(queue.device)
    defines.update(WG=wg)
    prg = kernels.program(queue.device, "optim.cl", **defines)
    scalar = kernels.scalar_type(dtype)
    partial = Tensor.empty(queue, (len(grads),), dtype)
    norm = Tensor.empty(queue, (2,), dtype)
    for slot, g in enumerate(grads):
        prg.sum_squares(
            queue,
            (wg,),
            (wg,),
            g.buffer,
            np.int64(g.offset),
            np.int64(g.size),
            partial.buffer,
            np.int32(slot),
        )
    prg.clip_coef(queue, (1,), (1,), partial.buffer, np.int32(len(grads)), scalar(max_norm), norm.buffer)
    if error_if_nonfinite:
        total = float(norm.to_host()[0])
        if not math.isfinite(total):
            raise NetclError(
                f"clip_grad_norm_: the total norm of order {norm_type} of the gradients is {total}, so "
                "they cannot be clipped; the gradients were left as they are (error_if_nonfinite=False "
                "scales them anyway)"
            )
    for g in grads:
        prg.scale_by(
            queue, (max(g.size, 1),), None, g.buffer, np.int64(g.offset), np.int64(g.size), norm.buffer
        )
    return norm[0:1]
