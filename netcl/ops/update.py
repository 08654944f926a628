"""Parameter updates on Tensors (kernels/optim.cl): fused optimizer steps and gradient-norm clipping.

netcl.optim holds the hyperparameters, their checks, per-parameter state and schedules; the launches
are here. The update rule and its scalars reach the kernel by name: OPT=OPT_ADAM, and the scalars as
the kernel's own parameter names (lr=..., beta1=...), never as positions both sides must agree on.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from netcl import kernels
from netcl.core import capture
from netcl.core.tensor import Tensor
from netcl.errors import NetclError

# the update rules optim.cl defines (OPT_SGD, OPT_ADAM, ...), read from the file itself: one list, C's
_RULES = frozenset(m.lower() for m in re.findall(r"^#define OPT_([A-Z0-9_]+) \d+$", kernels.source("optim.cl"), re.M))
MAX_TENSORS_PER_LAUNCH = 8  # optim.cl's N_TENSORS
# optim.cl's TENSOR_ARGS(i): parameter, its offset, gradient, its offset, three state slots, length
_TENSOR_ARGS = [tuple(f"{name}{i}" for name in ("p", "po", "g", "go", "sa", "sb", "sc", "n"))
                for i in range(MAX_TENSORS_PER_LAUNCH)]


def _scalars(hyper: dict[str, Any], dtype: np.dtype) -> dict[str, Any]:
    """Kernel arguments of the hyperparameters: flags as int, numbers in the parameters' dtype."""
    scalar = kernels.scalar_type(dtype)
    return {k: np.int32(v) if isinstance(v, (bool, np.bool_)) else scalar(v) for k, v in hyper.items()}


def optimizer_step(rule: str, params: Sequence[Tensor], grads: Sequence[Tensor],
                   states: Sequence[Sequence[Tensor | None]], hyper: dict[str, Any],
                   refresh: Callable[[], dict[str, Any]] | None = None) -> None:
    """One launch of update `rule` (an OPT_ name of optim.cl, lower case: "sgd", "adam", "rmsprop") over up
    to 8 contiguous parameters of one queue and dtype (updated in place), their gradients, and each one's
    state tensors in the rule's slot order (sa, sb, sc; None where its hyperparameters use none: the
    kernel does not touch that slot). `hyper` gives the rule's scalars by their kernel
    names. Under a graph capture, `refresh()` gives the scalars of each replay (the next step's)."""
    if rule not in _RULES:
        raise ValueError(f"update rule must be one of {sorted(_RULES)} (optim.cl's OPT_ names), got {rule!r}")
    if not 0 < len(params) <= MAX_TENSORS_PER_LAUNCH or not len(params) == len(grads) == len(states):
        raise ValueError(f"optimizer_step: 1 to {MAX_TENSORS_PER_LAUNCH} parameters with one gradient and one "
                         f"state list each, got {len(params)}, {len(grads)} and {len(states)}")
    p0 = params[0]
    queue = p0.queue
    items = 1 if queue.device.capabilities.kind == "gpu" else 64  # elements per work-item (optim.cl)
    prg = kernels.program(queue.device, "optim.cl", **kernels.float_defines(p0.dtype, rule),
                          N_TENSORS=len(params), OPT=f"OPT_{rule.upper()}", ITEMS=items)
    named: dict[str, Any] = {}
    total = 0
    for i, (v, g, st) in enumerate(zip(params, grads, states)):
        if not (v.is_contiguous() and g.is_contiguous()) or g.shape != v.shape or g.dtype != v.dtype \
                or v.queue is not queue or v.dtype != p0.dtype:
            raise NetclError(f"optimizer_step: parameter {i} ({v.shape}, {v.dtype}) and its gradient ({g.shape}, "
                             f"{g.dtype}) must be contiguous, of one shape, and share the first's queue and dtype")
        slots = [s.buffer if s is not None else v.buffer for s in st] + [v.buffer] * (3 - len(st))
        named.update(zip(_TENSOR_ARGS[i], (v.buffer, np.int64(v.offset), g.buffer, np.int64(g.offset), *slots,
                                           np.int64(v.size))))
        total += -(-v.size // items)
    if not total:
        return
    kernel = prg.optimizer_step
    kernel(queue, (total,), None, **named, **_scalars(hyper, p0.dtype))
    graph = capture.capturing()
    if graph is not None and refresh is not None:
        index, dtype = kernel.arg_index, p0.dtype

        def on_replay(args: list) -> None:
            for name, value in _scalars(refresh(), dtype).items():
                args[index[name]] = value

        graph.on_replay(on_replay)


def clip_grad_norm(grads: Sequence[Tensor], max_norm: float, error_if_nonfinite: bool = False) -> Tensor:
    """Scale `grads` in place by min(1, max_norm / (norm + 1e-6)), norm their joint L2 norm, and return
    the norm before clipping as a Tensor of shape (1,): 2N + 1 launches for N gradients (partial sums,
    the coefficient, the scaling), no host sync. error_if_nonfinite: read the norm back first and raise
    NetclError, scaling nothing, when it is NaN or infinite."""
    if not grads:
        raise NetclError("clip_grad_norm_: no parameter has a gradient (call backward first)")
    queue, dtype = grads[0].queue, grads[0].dtype
    for g in grads:
        if g.queue is not queue or g.dtype != dtype:
            raise NetclError("clip_grad_norm_: all gradients must share one queue and one dtype")
        if not g.is_contiguous():
            raise NetclError(
                f"clip_grad_norm_: a gradient of shape {g.shape} is not contiguous; gradients are scaled "
                "in place, so they must be contiguous"
            )
    wg = kernels.work_group(queue.device)
    prg = kernels.program(queue.device, "optim.cl", **kernels.float_defines(dtype, "clip_grad_norm_"), WG=wg)
    partial = Tensor.empty(queue, (len(grads),), dtype)
    norm = Tensor.empty(queue, (2,), dtype)
    for slot, g in enumerate(grads):
        prg.sum_squares(queue, (wg,), (wg,), x=g.buffer, off=np.int64(g.offset), n=np.int64(g.size),
                        partial=partial.buffer, slot=np.int32(slot))
    prg.clip_coef(queue, (1,), (1,), partial=partial.buffer, count=np.int32(len(grads)),
                  max_norm=kernels.scalar_type(dtype)(max_norm), norm=norm.buffer)
    if error_if_nonfinite:
        total = float(norm.to_host()[0])
        if not math.isfinite(total):
            raise NetclError(
                f"clip_grad_norm_: the total norm of order 2.0 of the gradients is {total}, so they cannot be "
                "clipped; the gradients were left as they are (error_if_nonfinite=False scales them anyway)"
            )
    for g in grads:
        prg.scale_by(queue, (max(g.size, 1),), None, x=g.buffer, off=np.int64(g.offset), n=np.int64(g.size),
                     norm=norm.buffer)
    return norm[0:1]
