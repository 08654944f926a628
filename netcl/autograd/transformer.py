"""Transformer ops on Nodes: rotary embeddings and a linear layer whose residual add runs in the GEMM's
epilogue (both generated from their declarations in netcl.ops), and SwiGLU's gate silu(a) * b as one fused
elementwise node."""

from __future__ import annotations

from netcl import ops
from netcl.autograd.declared import OPS
from netcl.autograd.elementwise import apply
from netcl.autograd.engine import Node
from netcl.core.tensor import Tensor

rope = OPS["rope"]  # generated from its declaration in netcl.ops.rope
linear_residual = OPS["linear_residual"]  # generated from its declaration in netcl.ops.gemm


def _silu_mul(a: Tensor, b: Tensor) -> Tensor:
    return ops.mul(ops.silu(a), b)


def silu_mul(a: Node, b: Node) -> Node:
    """silu(a) * b (SwiGLU's gate): one fused launch forward, one for both gradients backward."""
    return apply(_silu_mul, a, b)


__all__ = ["linear_residual", "rope", "silu_mul"]
