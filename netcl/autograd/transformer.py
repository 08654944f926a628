"""Transformer ops on Nodes with their backward rules: rotary embeddings, a linear layer whose residual add
runs in the GEMM's epilogue, and SwiGLU's gate silu(a) * b as one fused elementwise node."""

from __future__ import annotations

from netcl import ops
from netcl.autograd.declared import OPS
from netcl.autograd.elementwise import apply
from netcl.autograd.engine import Node, as_node, record
from netcl.core.tensor import Tensor
from netcl.ops.rope import rope as rotate


def _empty_in_layout(x: Tensor) -> Tensor:
    """An uninitialised tensor of x's shape whose memory order follows x's strides (a permuted view of a
    contiguous buffer): a gradient written in it lets the permute/reshape of x's producer stay views."""
    order = sorted(range(x.ndim), key=lambda d: (-abs(x.strides[d]), d))
    base = Tensor.empty(x.queue, tuple(x.shape[d] for d in order), x.dtype)
    return base.permute([order.index(d) for d in range(x.ndim)])


def rope(x: Node, cos: Tensor, sin: Tensor, offset: Tensor | None = None, pairing: str = "half") -> Node:
    """Rotary embedding of x (B, H, S, D) at positions s + offset (netcl.ops.rope); the gradient is the
    rotation of g by -theta, written in x's own memory order."""
    x = as_node(x)
    xv = x.value
    out = rotate(xv, cos, sin, offset, pairing)

    def backward(g: Tensor):
        return (rotate(g, cos, sin, offset, pairing, inverse=True, out=_empty_in_layout(xv)),)

    return record(out, (x,), backward, "rope")


linear_residual = OPS["linear_residual"]  # generated from its declaration in netcl.ops.gemm


def _silu_mul(a: Tensor, b: Tensor) -> Tensor:
    return ops.mul(ops.silu(a), b)


def silu_mul(a: Node, b: Node) -> Node:
    """silu(a) * b (SwiGLU's gate): one fused launch forward, one for both gradients backward."""
    return apply(_silu_mul, a, b)


__all__ = ["linear_residual", "rope", "silu_mul"]
