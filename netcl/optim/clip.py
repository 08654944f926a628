"""clip_grad_norm_: scale all gradients so their joint L2 norm is at most max_norm, without a host sync."""

from __future__ import annotations

from collections.abc import Iterable

from netcl.autograd.engine import Node
from netcl.core.tensor import Tensor
from netcl.ops import update
from netcl.optim.arguments import Flag, Real


def clip_grad_norm_(
    parameters: Iterable[Node] | Node,
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
) -> Tensor:
    """Scale the gradients in place by min(1, max_norm / (norm + 1e-6)) (PyTorch's rule) and return
    the total norm before clipping as a Tensor of shape (1,). The norm never leaves the device:
    2 ceil(N / 8) + 1 launches for N gradients (partial sums, the coefficient, the scaling), each over the
    whole device; the same bits on every run.

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
    return update.clip_grad_norm([p.grad for p in params if p.grad is not None], max_norm, error_if_nonfinite)
