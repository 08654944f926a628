"""GEMM with a fused epilogue under the names other layers call: one kernel launch each."""

from __future__ import annotations

from netcl.core.tensor import Tensor
from netcl.ops.gemm import linear, matmul_epilogue


def linear_relu(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """relu(x @ weight.T + bias), weight shaped (out_features, in_features), in one launch."""
    return linear(x, weight, bias, activation="relu")


def matmul_bias_relu(a: Tensor, b: Tensor, bias: Tensor | None = None) -> Tensor:
    """relu(a @ b + bias) with bias over the last axis (N,), in one launch."""
    return matmul_epilogue(a, b, bias=bias, activation="relu")


__all__ = ["linear_relu", "matmul_bias_relu"]
