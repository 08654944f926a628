"""clip_grad_norm_: scale all gradients so their joint L2 norm is at most max_norm, without a host sync."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from netcl.autograd import kernels
from netcl.autograd.engine import Node
from netcl.core.tensor import Tensor
from netcl.errors import NetclError


def clip_grad_norm_(parameters: Iterable[Node], max_norm: float, norm_type: float = 2.0) -> Tensor:
    """Scale the gradients in place by min(1, max_norm / (norm + 1e-6)) (PyTorch's rule) and return
    the total norm before clipping as a Tensor of shape (1,). The norm never leaves the device:
    2N + 1 launches for N gradients (partial sums, the coefficient, the scaling)."""
    if float(norm_type) != 2.0:
        raise NotImplementedError(f"clip_grad_norm_ supports the L2 norm (norm_type=2), got {norm_type}")
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        raise NetclError("clip_grad_norm_: no parameter has a gradient (call backward first)")
    queue = grads[0].queue
    dtype = grads[0].dtype
    for g in grads:
        if g.queue is not queue or g.dtype != dtype:
            raise NetclError("clip_grad_norm_: all gradients must share one queue and one dtype")
    defines = kernels.float_defines(dtype, "clip_grad_norm_")
    wg = kernels.work_group(queue.device)
    defines.update(WG=wg)
    prg = kernels.program(queue.device, "optim.cl", defines)
    scalar = kernels.scalar_type(dtype)
    partial = Tensor.empty(queue, (len(grads),), dtype)
    norm = Tensor.empty(queue, (2,), dtype)
    contiguous = [g if g.is_contiguous() else g.contiguous() for g in grads]
    for slot, g in enumerate(contiguous):
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
    for p_grad, g in zip(grads, contiguous):
        if g is not p_grad:
            raise NetclError("clip_grad_norm_: gradients must be contiguous to be scaled in place")
        prg.scale_by(
            queue, (max(g.size, 1),), None, g.buffer, np.int64(g.offset), np.int64(g.size), norm.buffer
        )
    return norm[0:1]
