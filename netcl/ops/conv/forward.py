"""conv2d and conv2d_relu: checks, the algorithm (conv.choice) and the launch of the forward pass."""

from __future__ import annotations

from typing import Any

from netcl.core.tensor import Tensor, check_same_queue
from netcl.errors import ShapeError
from netcl.ops.conv import choice, direct, im2col, winograd
from netcl.ops.conv.geometry import (
    ALGORITHMS,
    _activation,
    _check_winograd_dtype,
    _checked_key,
    _float_dtype,
    _params,
    _recall,
    _remember,
)


def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1, activation: str | None = None,
           algorithm: str = "auto") -> Tensor:
    """y = act(conv(x, weight) + bias), NCHW; weight (K, C/groups, KH, KW), bias (K,).

    activation: None or 'relu' (fused into the kernel's output stage). algorithm: one of ALGORITHMS.
    """
    key = _checked_key("conv2d", (x, weight, bias), stride, padding, dilation, groups, activation, algorithm)
    hit = _recall(key)
    if hit is not None:
        p, algo, act, dt = hit
    else:
        p, algo, act, dt = _remember(key, _conv2d_checks(x, weight, bias, stride, padding, dilation, groups,
                                                         activation, algorithm))
    x, weight = x.contiguous(), weight.contiguous()
    bias = bias.contiguous() if bias is not None else None
    if algo == "im2col" and p.N * p.K * p.OH * p.OW:
        return im2col._conv_im2col(x, weight, bias, p, activation)
    out = Tensor.empty(x.queue, p.output_shape, dt)
    if out.size == 0:
        return out
    if algo == "winograd":
        winograd._conv_winograd(x, weight, bias, out, p, act)
    else:
        direct._conv_direct(x, weight, bias, out, p, act, depthwise=(algo == "depthwise"))
    return out


def _conv2d_checks(x: Tensor, weight: Tensor, bias: Tensor | None, stride: Any, padding: Any, dilation: Any,
                   groups: int, activation: str | None, algorithm: str) -> tuple:
    """conv2d's argument checks and algorithm choice -> (ConvParams, algorithm, activation code, dtype)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    act = _activation(activation)
    tensors = (x, weight) if bias is None else (x, weight, bias)
    check_same_queue(*tensors)
    dt = _float_dtype("conv2d", *tensors)
    p = _params(x.shape, weight.shape, stride, padding, dilation, groups)
    if bias is not None and tuple(bias.shape) != (p.K,):
        raise ShapeError(
            f"conv2d: bias must have shape ({p.K},) for weight shape {weight.shape}, got {bias.shape}"
        )
    algo = choice._auto_algorithm(x.device, p, dt) if algorithm == "auto" else algorithm
    if algo == "winograd":
        _check_winograd_dtype("conv2d", dt)
    if algo == "winograd" and not choice.winograd_applicable(p):
        raise ShapeError(f"conv2d: algorithm='winograd' needs a 3x3 kernel, stride 1, dilation 1, groups 1; "
                         f"got kernel {(p.KH, p.KW)}, stride {(p.SH, p.SW)}, dilation {(p.DH, p.DW)}, "
                         f"groups {p.G}")
    if algo == "depthwise" and p.Cg != 1:
        raise ShapeError(f"conv2d: algorithm='depthwise' needs groups == C (one input channel per group); "
                         f"got C={p.C}, groups={p.G}")
    return p, algo, act, dt


def conv2d_relu(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
                dilation: Any = 1, groups: int = 1, algorithm: str = "auto") -> Tensor:
    """relu(conv2d(x, weight) + bias) with the bias and relu in the convolution's output stage."""
    return conv2d(x, weight, bias, stride, padding, dilation, groups, activation="relu", algorithm=algorithm)
