"""conv2d's backward passes: the input gradient, the weight gradient (each on the algorithm conv.choice
picks) and the bias gradient."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl import kernels
from netcl.core import capture
from netcl.core.tensor import Tensor, check_same_queue
from netcl.errors import ShapeError
from netcl.ops import elementwise
from netcl.ops.conv import choice, direct, im2col, winograd
from netcl.ops.conv.forward import conv2d
from netcl.ops.conv.geometry import (
    ConvParams,
    _check_winograd_dtype,
    _checked_key,
    _float_dtype,
    _params,
    _recall,
    _remember,
    _shape_key,
)
from netcl.ops.declaration import OpDecl, declare


def _check_grad_out(op: str, grad_out: Tensor, p: ConvParams) -> None:
    if tuple(grad_out.shape) != p.output_shape:
        raise ShapeError(f"{op}: grad_out has shape {tuple(grad_out.shape)} but the convolution's output "
                         f"shape is {p.output_shape}")


def conv2d_backward_input(grad_out: Tensor, weight: Tensor, input_shape: Sequence[int], stride: Any = 1,
                          padding: Any = 0, dilation: Any = 1, groups: int = 1,
                          algorithm: str = "auto") -> Tensor:
    """d(loss)/d(x) of conv2d, shape `input_shape`: a transposed convolution of grad_out by weight.

    algorithm: 'gemm' (cols[n, g] = w[g]^T (R x Kg) @ gy[n, g] (Kg x P), then col2im), 'direct'
    (the gather kernel), 'flipped' (stride 1, dilation 1, one group, padding below the kernel size: the
    forward convolution of grad_out with the spatially flipped, in/out-swapped weight and padding
    k - 1 - p, on whatever algorithm conv2d picks; on Winograd the rotated filters are transformed
    straight from `weight`), or 'auto': the tuning database's choice for this geometry, else flipped
    where it runs on Winograd and Winograd pays (3x3 kernels, winograd_pays), else gemm unless the
    layer is depthwise.
    """
    p, dt, algo, flipped_algo = _backward_input_plan(grad_out, weight, input_shape, stride, padding, dilation,
                                                     groups, algorithm)
    if algo == "flipped":
        fp, fa = flipped_algo
        if fa == "winograd":  # the rotated, transposed filters transformed straight from the weight
            gx = Tensor.empty(grad_out.queue, (p.N, p.C, p.H, p.W), dt)
            if gx.size:
                winograd._conv_winograd(grad_out.contiguous(), weight.contiguous(), None, gx, fp, None,
                                        flip=True)
            return gx
        flipped = weight[:, :, ::-1, ::-1].permute(1, 0, 2, 3).contiguous()
        return conv2d(
            grad_out, flipped, None, stride=1, padding=(p.KH - 1 - p.PH, p.KW - 1 - p.PW), algorithm=fa
        )
    gx = Tensor.empty(grad_out.queue, (p.N, p.C, p.H, p.W), dt)
    if gx.size == 0:
        return gx
    gy, w = grad_out.contiguous(), weight.contiguous()
    if algo == "gemm" and p.OH * p.OW:
        im2col._backward_input_gemm(gy, w, gx, p)
    else:
        direct._backward_input_into(gy, w, None, gx, p, None)
    return gx


def _backward_input_plan(grad_out: Tensor, weight: Tensor, input_shape: Sequence[int], stride: Any,
                         padding: Any, dilation: Any, groups: int, algorithm: str) -> tuple:
    """conv2d_backward_input's checks and choice, once per signature: (ConvParams, dtype, algorithm, and
    for 'flipped' (the forward convolution's ConvParams, its algorithm))."""
    key = _checked_key("conv2d_backward_input", (grad_out, weight), _shape_key(input_shape), stride, padding,
                       dilation, groups, algorithm)
    hit = _recall(key)
    if hit is None:
        if algorithm not in ("auto", "gemm", "direct", "flipped"):
            raise ValueError(f"algorithm must be 'auto', 'gemm', 'direct' or 'flipped', got {algorithm!r}")
        check_same_queue(grad_out, weight)
        dt = _float_dtype("conv2d_backward_input", grad_out, weight)
        p = _params(tuple(input_shape), weight.shape, stride, padding, dilation, groups,
                    op="conv2d_backward_input")
        _check_grad_out("conv2d_backward_input", grad_out, p)
        flippable = choice.flippable(p)
        if algorithm == "flipped" and not flippable:
            raise ShapeError(
                f"conv2d_backward_input: algorithm='flipped' needs stride 1, dilation 1, one group "
                f"and padding below the kernel size; got stride {(p.SH, p.SW)}, dilation "
                f"{(p.DH, p.DW)}, groups {p.G}, padding {(p.PH, p.PW)}, kernel {(p.KH, p.KW)}"
            )
        algo = choice.backward_input_algorithm(grad_out.device, p, dt) if algorithm == "auto" else algorithm
        flipped_algo = None
        if algo == "flipped":  # the forward convolution it runs, and that one's algorithm
            fp = _params(
                (p.N, p.K, p.OH, p.OW),
                (p.C, p.K, p.KH, p.KW),
                1,
                (p.KH - 1 - p.PH, p.KW - 1 - p.PW),
                1,
                1,
                op="conv2d_backward_input",
            )
            flipped_algo = (fp, choice._auto_algorithm(grad_out.device, fp, dt))
        hit = _remember(key, (p, dt, algo, flipped_algo))
    return hit


def conv2d_backward_weight(x: Tensor, grad_out: Tensor, weight_shape: Sequence[int], stride: Any = 1,
                           padding: Any = 0, dilation: Any = 1, groups: int = 1,
                           algorithm: str = "auto") -> Tensor:
    """d(loss)/d(weight) of conv2d, shape `weight_shape` (K, C/groups, KH, KW).

    algorithm: 'gemm' (im2col + GEMM: see _backward_weight_gemm), 'winograd' (3x3, stride 1, dilation 1,
    one group: Winograd F(2x2, 3x3) run backwards, _backward_weight_winograd), 'direct' (the gather
    kernel: one work-item per weight element), or 'auto': the tuning database's choice for this
    geometry, else winograd where it pays (winograd_pays), else gemm.
    """
    p, dt, algo = _backward_weight_plan(x, grad_out, weight_shape, stride, padding, dilation, groups,
                                        algorithm)
    x, grad_out = x.contiguous(), grad_out.contiguous()
    if algo in ("gemm", "winograd"):
        if p.N * p.OH * p.OW == 0:
            return Tensor.zeros(x.queue, (p.K, p.Cg, p.KH, p.KW), dt)
        if algo == "winograd":
            return winograd._backward_weight_winograd(x, grad_out, p)
        return im2col._backward_weight_gemm(x, grad_out, p)
    gw = Tensor.empty(x.queue, (p.K, p.Cg, p.KH, p.KW), dt)
    prg = kernels.program(x.device, "conv_direct.cl", dtype=dt)
    prg.conv2d_backward_weight(x.queue, (p.Cg * p.KH * p.KW, p.K), None, x.buffer, np.int64(x.offset),
                               grad_out.buffer, np.int64(grad_out.offset), gw.buffer, np.int64(gw.offset),
                               *p.geometry())
    return gw


def _backward_weight_plan(x: Tensor, grad_out: Tensor, weight_shape: Sequence[int], stride: Any, padding: Any,
                          dilation: Any, groups: int, algorithm: str) -> tuple:
    """conv2d_backward_weight's checks and choice, once per signature: (ConvParams, dtype, algorithm)."""
    key = _checked_key("conv2d_backward_weight", (x, grad_out), _shape_key(weight_shape), stride, padding,
                       dilation, groups, algorithm)
    hit = _recall(key)
    if hit is None:
        if algorithm not in ("auto", "gemm", "direct", "winograd"):
            raise ValueError(f"algorithm must be 'auto', 'gemm', 'direct' or 'winograd', got {algorithm!r}")
        check_same_queue(x, grad_out)
        dt = _float_dtype("conv2d_backward_weight", x, grad_out)
        p = _params(
            x.shape, tuple(weight_shape), stride, padding, dilation, groups, op="conv2d_backward_weight"
        )
        _check_grad_out("conv2d_backward_weight", grad_out, p)
        if algorithm == "winograd":
            _check_winograd_dtype("conv2d_backward_weight", dt)
        if algorithm == "winograd" and not choice.winograd_applicable(p):
            raise ShapeError(
                f"conv2d_backward_weight: algorithm='winograd' needs a 3x3 kernel, stride 1, dilation "
                f"1, groups 1; got kernel {(p.KH, p.KW)}, stride {(p.SH, p.SW)}, dilation "
                f"{(p.DH, p.DW)}, groups {p.G}"
            )
        algo = choice.backward_weight_algorithm(x.device, p, dt) if algorithm == "auto" else algorithm
        hit = _remember(key, (p, dt, algo))
    return hit


def conv2d_backward_bias(grad_out: Tensor) -> Tensor:
    """d(loss)/d(bias) of conv2d: grad_out summed over N, H, W -> (K,)."""
    if len(grad_out.shape) != 4:
        raise ShapeError(f"conv2d_backward_bias: grad_out must be 4-D (N, K, OH, OW), got {grad_out.shape}")
    key = ("conv2d_backward_bias", id(grad_out.queue.device), grad_out.dtype, grad_out.shape)
    launch = capture.plans.get(key)
    if launch is None:  # the checks, program and static arguments of this signature, once (capture.plans)
        dt = _float_dtype("conv2d_backward_bias", grad_out)
        n, k, oh, ow = grad_out.shape
        # one work-group per channel: 256 work-items on GPUs (a 128x16x28x28 gradient took 1.3 ms with one
        # work-item per channel on the H200), 8 on CPUs (PoCL vectorises across them)
        wg = 8 if grad_out.device.capabilities.kind == "cpu" else 256
        prg = kernels.program(grad_out.device, "conv_direct.cl", dtype=dt, BWG=wg)
        args = (None, np.int64(0), None, np.int64(0), np.int32(n), np.int32(k), np.int32(oh * ow))
        launch = capture.plans.put(key, prg.conv2d_backward_bias.plan((k * wg,), (wg,), args, (0, 1, 2)))
    g = grad_out.contiguous()
    gb = Tensor.empty(g.queue, (g.shape[1],), g.dtype)
    launch(g.queue, g.buffer, g.offset, gb.buffer)
    return gb


def _conv2d_backward(grad_out: Tensor, x: Tensor, weight: Tensor, out: Tensor, stride: Any, padding: Any,
                     dilation: Any, groups: int, activation: str | None,
                     needs: tuple[bool, ...]) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(d x, d weight, d bias) of conv2d for the inputs that need one; a fused relu is differentiated
    through the saved output (where(out > 0, g, 0), fused by the JIT into the next kernel's input)."""
    g = grad_out
    if activation == "relu":
        g = elementwise.where(elementwise.gt(out, 0), g, 0.0)
    g = g.contiguous()
    geometry = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    if needs[0] and needs[1]:  # both on Winograd: their four transforms in one launch (GPUs, one chunk)
        args = (stride, padding, dilation, groups, "auto")
        _, _, input_algo, flipped = _backward_input_plan(g, weight, x.shape, *args)
        p, _, weight_algo = _backward_weight_plan(x, g, weight.shape, *args)
        if input_algo == "flipped" and flipped[1] == "winograd" and weight_algo == "winograd":
            both = winograd._backward_winograd(x.contiguous(), g, weight.contiguous(), p, flipped[0])
            if both is not None:
                return (*both, conv2d_backward_bias(g) if needs[2] else None)
    gx = conv2d_backward_input(g, weight, x.shape, **geometry) if needs[0] else None
    gw = conv2d_backward_weight(x, g, weight.shape, **geometry) if needs[1] else None
    return gx, gw, (conv2d_backward_bias(g) if needs[2] else None)


# the op on Nodes, made from these (netcl.ops.declaration): im2col, direct and Winograd kernels and the GEMM
# on half storage (float32 arithmetic) under autocast
declare(OpDecl("conv2d", conv2d, _conv2d_backward, inputs=("x", "weight", "bias"), hide=("algorithm",),
               replay="netcl.ops.conv",
               autocast="half", functional=("conv2d",),
               doc="NCHW convolution (relu epilogue optional); backward through conv2d_backward_input, "
                   "_weight and _bias."))
