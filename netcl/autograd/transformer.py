"""Transformer ops on Nodes with their backward rules: rotary embeddings, a linear layer whose residual add
runs in the GEMM's epilogue, and SwiGLU's gate silu(a) * b as one fused elementwise node."""

from __future__ import annotations

from netcl import ops
from netcl.autograd import autocast
from netcl.autograd.elementwise import apply, sum_to_shape
from netcl.autograd.engine import Node, as_node, record
from netcl.core.tensor import Tensor
from netcl.ops import gemm as mm
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


def linear_residual(x: Node, weight: Node, bias: Node | None, residual: Node) -> Node:
    """x @ weight.T + bias + residual with the residual added in the GEMM's epilogue (one launch); the
    residual's gradient is g itself, the others are linear's."""
    x, weight, bias, residual = autocast.cast_inputs("linear_residual", x, weight, bias, residual)
    x, weight, residual = as_node(x), as_node(weight), as_node(residual)
    bias = as_node(bias) if bias is not None else None
    xv, wv, rv = x.value, weight.value, residual.value
    bv = bias.value if bias is not None else None
    out = mm.gemm(xv, wv.transpose(0, 1), bv, None, rv)
    in_features, out_features = wv.shape[1], wv.shape[0]
    parents = (x, weight, residual) if bias is None else (x, weight, residual, bias)

    def backward(g: Tensor):
        g2 = g.reshape(-1, out_features)
        x2 = xv.reshape(-1, in_features)
        gx = mm.matmul(g2, wv).reshape(xv.shape) if x.requires_grad else None
        gw = gb = None
        want_b = bias is not None and bias.requires_grad
        if weight.requires_grad and want_b:
            gw, gb = mm.matmul_rowsum(g2.transpose(0, 1), x2)
        elif weight.requires_grad:
            gw = mm.matmul(g2.transpose(0, 1), x2)
        if want_b and gb is None:
            gb = ops.sum(g2, axis=0)
        gr = sum_to_shape(g, rv.shape) if residual.requires_grad else None
        return (gx, gw, gr) if bias is None else (gx, gw, gr, gb)

    return record(out, parents, backward, "linear_residual")


def _silu_mul(a: Tensor, b: Tensor) -> Tensor:
    return ops.mul(ops.silu(a), b)


def silu_mul(a: Node, b: Node) -> Node:
    """silu(a) * b (SwiGLU's gate): one fused launch forward, one for both gradients backward."""
    return apply(_silu_mul, a, b)


__all__ = ["linear_residual", "rope", "silu_mul"]
