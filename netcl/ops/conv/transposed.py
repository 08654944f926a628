"""conv_transpose2d: the gradient of conv2d with respect to its input, as a layer (PyTorch's layout)."""

from __future__ import annotations

from typing import Any

import numpy as np

from netcl.core import shapes
from netcl.core.tensor import Tensor, check_same_queue
from netcl.errors import ShapeError
from netcl.ops.conv.direct import _backward_input_into
from netcl.ops.conv.geometry import ConvParams, _activation, _float_dtype


def conv_transpose2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
                     output_padding: Any = 0, groups: int = 1, dilation: Any = 1,
                     activation: str | None = None) -> Tensor:
    """Transposed convolution (the gradient of conv2d w.r.t. its input), PyTorch's layout:
    x (N, Cin, H, W), weight (Cin, Cout/groups, KH, KW), bias (Cout,) -> (N, Cout, Hout, Wout) with
    Hout = (H - 1)*stride - 2*padding + dilation*(KH - 1) + output_padding + 1.
    """
    act = _activation(activation)
    tensors = (x, weight) if bias is None else (x, weight, bias)
    check_same_queue(*tensors)
    dt = _float_dtype("conv_transpose2d", *tensors)
    if x.ndim != 4 or weight.ndim != 4:
        raise ShapeError(f"conv_transpose2d: input and weight must be 4-D, got {x.shape} and {weight.shape}")
    if not isinstance(groups, (int, np.integer)) or groups < 1:
        raise ShapeError(f"conv_transpose2d: groups must be a positive int, got {groups!r}")
    n, cin, h, w_ = x.shape
    if weight.shape[0] != cin:
        raise ShapeError(f"conv_transpose2d: weight shape {weight.shape} must start with the input's "
                         f"{cin} channels (input shape {x.shape}); weight is (Cin, Cout/groups, KH, KW)")
    if cin % groups:
        raise ShapeError(
            f"conv_transpose2d: input channels {cin} (input shape {x.shape}) are not divisible by "
            f"groups={groups}"
        )
    cout = weight.shape[1] * groups
    kh, kw = weight.shape[2], weight.shape[3]
    sh, sw = shapes.pair(stride, "stride", 1)
    ph, pw = shapes.pair(padding, "padding", 0)
    dh, dw = shapes.pair(dilation, "dilation", 1)
    oph, opw = shapes.pair(output_padding, "output_padding", 0)
    if oph >= max(sh, dh) or opw >= max(sw, dw):
        raise ShapeError(f"conv_transpose2d: output_padding {(oph, opw)} must be smaller than stride "
                         f"{(sh, sw)} or dilation {(dh, dw)}")
    hout = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
    wout = (w_ - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
    if hout < 1 or wout < 1:
        raise ShapeError(
            f"conv_transpose2d: output size {(hout, wout)} from input {x.shape}, kernel {(kh, kw)}, "
            f"stride {(sh, sw)}, padding {(ph, pw)} is empty"
        )
    if bias is not None and tuple(bias.shape) != (cout,):
        raise ShapeError(f"conv_transpose2d: bias must have shape ({cout},), got {bias.shape}")
    # the forward conv this transposes maps (N, Cout, Hout, Wout) -> (N, Cin, H, W) with weight (Cin, Cout/g,
    # ..)
    p = ConvParams((n, cout, hout, wout), weight.shape, (sh, sw), (ph, pw), (dh, dw), groups,
                   op="conv_transpose2d")
    if (p.OH, p.OW) != (h, w_):
        raise ShapeError(
            f"conv_transpose2d: inconsistent geometry: input {x.shape} vs derived {p.output_shape}"
        )
    out = Tensor.empty(x.queue, (n, cout, hout, wout), dt)
    if out.size:
        _backward_input_into(
            x.contiguous(), weight.contiguous(), bias.contiguous() if bias is not None else None, out, p, act
        )
    return out
