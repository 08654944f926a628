"""The direct convolution kernels (kernels/conv_direct.cl): register-blocked and barrier-free forward (and
depthwise), and the gather kernel of the backward-input pass (which transposed convolution runs too)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from netcl import kernels
from netcl.core import capture, launch_labels
from netcl.core.tensor import Tensor
from netcl.ops.conv.geometry import ConvParams


def _direct_tiles(device: Any, p: ConvParams, depthwise: bool) -> tuple[int, int]:
    if depthwise:
        return 1, 8
    kb = 8 if p.Kg >= 8 else (4 if p.Kg >= 4 else 1)
    return kb, 4 if device.capabilities.kind == "cpu" else 2


def _conv_direct(x: Tensor, w: Tensor, bias: Tensor | None, out: Tensor, p: ConvParams, act: str | None,
                 depthwise: bool) -> None:
    kb, owb = _direct_tiles(x.device, p, depthwise)
    prg = kernels.program(x.device, "conv_direct.cl", dtype=x.dtype, act=act, KB=kb, OWB=owb)
    kblocks = p.G * math.ceil(p.Kg / kb)
    b = bias if bias is not None else out
    if capture.declaring():  # for the profiler: the convolution's FLOPs, x, w and out moved once
        launch_labels.work(p.flops, float(x.nbytes + w.nbytes + out.nbytes))
    prg.conv2d_direct(
        x.queue,
        (math.ceil(p.OW / owb), p.OH, p.N * kblocks),
        None,
        x.buffer,
        np.int64(x.offset),
        w.buffer,
        np.int64(w.offset),
        b.buffer,
        np.int64(b.offset),
        np.int32(bias is not None),
        out.buffer,
        np.int64(out.offset),
        *p.geometry(),
    )


def _backward_input_into(gy: Tensor, w: Tensor, bias: Tensor | None, gx: Tensor, p: ConvParams,
                         act: str | None) -> None:
    prg = kernels.program(gy.device, "conv_direct.cl", dtype=gy.dtype, act=act)
    b = bias if bias is not None else gx
    if capture.declaring():  # for the profiler: the convolution's FLOPs, grad_out, w and grad_in moved once
        launch_labels.work(p.flops, float(gy.nbytes + w.nbytes + gx.nbytes))
    prg.conv2d_backward_input(gy.queue, (p.W, p.H, p.N * p.C), None, gy.buffer, np.int64(gy.offset),
                              w.buffer, np.int64(w.offset), b.buffer, np.int64(b.offset),
                              np.int32(bias is not None), gx.buffer, np.int64(gx.offset), *p.geometry())
