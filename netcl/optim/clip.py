"""Gradient clipping, PyTorch's two (torch.nn.utils): clip_grad_norm_ scales all gradients so their joint norm
is at most max_norm, clip_grad_value_ clamps each element; neither syncs with the host."""

from __future__ import annotations

import math
from collections.abc import Iterable

from netcl.autograd.engine import Node
from netcl.core import dtypes
from netcl.core.tensor import Tensor
from netcl.errors import NetclError
from netcl.ops import elementwise, movement, update
from netcl.optim.arguments import Flag, Real


def _params(parameters: Iterable[Node] | Node, name: str) -> list[Node]:
    """The parameters given to a clipping function, checked: a Parameter, or an iterable of them."""
    if isinstance(parameters, Node):
        return [parameters]
    if isinstance(parameters, (Tensor, str, bytes)):
        raise TypeError(f"{name}: parameters must be Parameters, got {type(parameters).__name__}")
    try:
        params = list(parameters)
    except TypeError:
        raise TypeError(
            f"{name}: parameters must be an iterable of Parameters, got {type(parameters).__name__}"
        ) from None
    for i, p in enumerate(params):
        if not isinstance(p, Node):
            raise TypeError(f"{name}: parameters[{i}] is a {type(p).__name__}, not a Parameter")
    return params


def clip_grad_norm_(
    parameters: Iterable[Node] | Node,
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
) -> Tensor:
    """Scale the gradients in place by min(1, max_norm / (norm + 1e-6)) (PyTorch's rule) and return
    the total norm before clipping as a Tensor of shape (1,). The norm never leaves the device. The L2 norm
    (norm_type=2, the default): 2 ceil(N / 8) + 1 launches for N gradients (partial sums, the coefficient,
    the scaling), each over the whole device; the same bits on every run. Any other order p > 0, inf
    included (the largest |g|), takes a reduction per gradient in float32, then the coefficient and a
    scaling per gradient.

    max_norm is a number >= 0 (inf: never clip); a negative one would flip the gradients. With
    error_if_nonfinite=True the norm is read back (one host sync) and a NaN or infinite norm raises
    NetclError before any gradient is scaled; by default a NaN norm leaves the gradients as they
    are and an infinite one scales them by 0, like the kernel's min(1, max_norm / norm)."""
    name = "clip_grad_norm_"
    max_norm = Real(0, allow_inf=True)(max_norm, f"{name}: max_norm")
    norm_type = float(Real(0, low_open=True, allow_inf=True)(norm_type, f"{name}: norm_type"))
    error_if_nonfinite = Flag()(error_if_nonfinite, f"{name}: error_if_nonfinite")
    params = _params(parameters, name)
    grads = [p.grad for p in params if p.grad is not None]
    if norm_type == 2.0:
        return update.clip_grad_norm(grads, max_norm, error_if_nonfinite)
    if not grads:
        raise NetclError(f"{name}: no parameter has a gradient (call backward first)")
    for g in grads:
        if g.queue is not grads[0].queue or g.dtype != grads[0].dtype:
            raise NetclError(f"{name}: all gradients must share one queue and one dtype")
    acc = dtypes.float64 if grads[0].dtype == dtypes.float64 else dtypes.float32
    total = None
    for g in grads:
        if g.size == 0:
            continue
        a = elementwise.abs(elementwise.cast(g, acc))
        part = a.max() if math.isinf(norm_type) else (a**norm_type).sum()
        total = part if total is None else (
            elementwise.maximum(total, part) if math.isinf(norm_type) else total + part)
    if total is None:
        total = Tensor.zeros(grads[0].queue, (), acc)
    elif not math.isinf(norm_type):
        total = total ** (1.0 / norm_type)
    total = total.reshape(1).realize()
    if error_if_nonfinite:
        value = float(total.to_host()[0])
        if not math.isfinite(value):
            raise NetclError(
                f"{name}: the total norm of order {norm_type} of the gradients is {value}, so they cannot "
                "be clipped; the gradients were left as they are (error_if_nonfinite=False scales them "
                "anyway)")
    ratio = max_norm / (total + 1e-6)
    coef = elementwise.where(ratio < 1.0, ratio, 1.0).realize()  # (a NaN norm: 1, as the L2 kernel's fmin)
    for g in grads:
        if g.size:
            movement.assign(g, g * coef, consume=True)
    return total


def clip_grad_value_(parameters: Iterable[Node] | Node, clip_value: float) -> None:
    """Clamp every gradient in place to [-clip_value, clip_value] (PyTorch's clip_grad_value_): one launch per
    gradient, no host sync. clip_value is a number >= 0 (inf: nothing changes); parameters without a
    gradient are passed over."""
    name = "clip_grad_value_"
    clip_value = float(Real(0, allow_inf=True)(clip_value, f"{name}: clip_value"))
    for p in _params(parameters, name):
        g = p.grad
        if g is not None and g.size:
            movement.assign(g, elementwise.clamp(g, -clip_value, clip_value), consume=True)
