"""Decode-step linear layers on the gemv kernel beyond a plain x @ W^T. Weight-only int8: a weight W (out, in)
as int8 values q (stored uint8 q + 128) and one float32 scale per output channel, W ~ scale[:, None] * q;
`linear_int8` computes x @ W^T on the fly: the gemv kernel dequantizes in registers for a decode step's few
rows (a quarter of float32's weight bytes, half of bfloat16's); more rows (a prompt) dequantize the weight
once per call into x's dtype and take the GEMM. `linear_glu`: SwiGLU's silu(x @ W1^T) * (x @ W3^T) from one
stacked weight [W1; W3], one launch a decode step. `rms_norm_linear`: any of them after an RMSNorm of x,
the norm in the gemv kernel's prologue: one launch a decode step instead of two."""

from __future__ import annotations

from typing import Any

import numpy as np

from netcl import kernels
from netcl.core import dtypes
from netcl.core.tensor import Tensor, check_same_queue
from netcl.errors import DTypeError, ShapeError
from netcl.ops import elementwise, norm
from netcl.ops.gemm.api import GEMV_MAX_ROWS, gemm, gemv_fits, gemv_max_rows
from netcl.ops.gemm.launch import gemv_rms_fits, launch
from netcl.ops.gemm.problem import _Problem
from netcl.ops.gemm.variants import gemv_usable

ZERO_POINT = 128  # uint8 storage of int8 values: q + 128


def quantize_int8(weight: Any) -> tuple[np.ndarray, np.ndarray]:
    """(q + 128 as uint8 (out, in), scales float32 (out,)) of a host weight (out, in): symmetric per output
    channel, scale = max |row| / 127, q = round(row / scale) (a zero row gets scale 1)."""
    w = np.asarray(weight)
    if w.ndim != 2 or not dtypes.is_floating(w.dtype):
        raise ShapeError(f"quantize_int8: weight must be a floating (out, in) array, got {w.dtype} {w.shape}")
    w = w.astype(np.float32)
    peak = np.abs(w).max(axis=1)
    scales = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scales[:, None]), -127, 127).astype(np.int16) + ZERO_POINT
    return q.astype(np.uint8), scales


def dequantize_int8(q: Tensor, scales: Tensor, dtype: Any) -> Tensor:
    """scales[:, None] * (q - 128) in `dtype`: the weight a quantized (out, in) pair stands for."""
    wide = elementwise.cast(q, dtypes.float32)
    w = elementwise.mul(elementwise.sub(wide, float(ZERO_POINT)), scales.reshape(-1, 1))
    return elementwise.cast(w, dtype).realize()


def linear_int8(x: Tensor, q: Tensor, scales: Tensor, bias: Tensor | None = None,
                activation: str | None = None, residual: Tensor | None = None) -> Tensor:
    """activation(x @ W^T + bias) + residual for W = scales[:, None] * (q - 128), q uint8 (out, in),
    scales float32 (out,); x (..., in) floating, bias (out,) and residual (..., out) in x's dtype."""
    if not isinstance(q, Tensor) or q.ndim != 2 or q.dtype != dtypes.uint8:
        raise DTypeError(f"linear_int8: the weight must be a uint8 (out, in) Tensor (int8 + 128), got "
                         f"{getattr(q, 'dtype', type(q).__name__)} {getattr(q, 'shape', '')}")
    n, k = q.shape
    if not isinstance(scales, Tensor) or scales.shape != (n,) or scales.dtype != dtypes.float32:
        raise ShapeError(f"linear_int8: scales must be float32 of shape ({n},), got "
                         f"{getattr(scales, 'dtype', None)} {getattr(scales, 'shape', None)}")
    if not isinstance(x, Tensor) or x.ndim < 1 or x.shape[-1] != k or not dtypes.is_floating(x.dtype):
        raise ShapeError(f"linear_int8: x must be a floating Tensor (..., {k}), got "
                         f"{getattr(x, 'dtype', None)} {getattr(x, 'shape', None)}")
    check_same_queue(x, q, scales)
    kernels.activation(activation)  # ValueError naming the choices
    for name, t in (("bias", bias), ("residual", residual)):
        if t is not None and (not isinstance(t, Tensor) or t.dtype != x.dtype):
            raise DTypeError(f"linear_int8: {name} must be a {x.dtype} Tensor like x, got "
                             f"{getattr(t, 'dtype', type(t).__name__)}")
    if bias is not None and bias.shape != (n,):
        raise ShapeError(f"linear_int8: bias must have shape ({n},), got {bias.shape}")
    rows = x.size // k if k else 0
    out_shape = x.shape[:-1] + (n,)
    xs = x if x.is_contiguous() else x.contiguous()
    x2 = xs.reshape(rows, k)
    res2 = None if residual is None else residual.expand(out_shape).contiguous().reshape(rows, n)
    if not (0 < rows <= GEMV_MAX_ROWS and k % 8 == 0 and x2.offset % 8 == 0 and q.offset % 8 == 0
            and x.dtype != dtypes.float64 and gemv_usable(x.device, x.dtype)):
        w = dequantize_int8(q, scales, x.dtype)
        return gemm(x2, w.transpose(0, 1), bias, activation, res2).reshape(out_shape)
    out = Tensor.empty(x.queue, (rows, n), x.dtype)
    act = None if activation == "none" else activation
    p = _Problem(a=x2, b=q.transpose(0, 1), out=out, bias=bias, residual=res2, activation=act, alpha=1.0,
                 m=rows, n=n, k=k, batch=(), squeeze=())
    launch(p, "gemv", scales=scales)
    return out.reshape(out_shape)


def linear_glu(x: Tensor, weight: Tensor, scales: Tensor | None = None) -> Tensor:
    """silu(x @ W[:h]^T) * (x @ W[h:]^T) for a stacked weight W (2h, in) (SwiGLU's gate over its up
    projection), W int8 with `scales` (2h,) when given. Decode rows (gemv_fits): one launch, the product never
    stored; more rows: the two products, then the fused silu * up."""
    if not isinstance(weight, Tensor) or weight.ndim != 2 or weight.shape[0] % 2:
        raise ShapeError(f"linear_glu: the weight must be a 2-D Tensor of 2h rows (gate over up), got "
                         f"{getattr(weight, 'shape', type(weight).__name__)}")
    h2, k = weight.shape
    h = h2 // 2
    if scales is not None:
        y = None if _glu_fits(x, weight, int8=True) else linear_int8(x, weight, scales)
    else:
        if weight.dtype != getattr(x, "dtype", None):
            raise DTypeError(f"linear_glu: x is {getattr(x, 'dtype', None)} but the weight is {weight.dtype}")
        y = None if _glu_fits(x, weight) and gemv_fits(x, weight.transpose(0, 1)) else gemm(
            x, weight.transpose(0, 1))
    if y is not None:
        return elementwise.mul(elementwise.silu(y[..., :h]), y[..., h:]).realize()
    rows = x.size // k
    x2 = (x if x.is_contiguous() else x.contiguous()).reshape(rows, k)
    out = Tensor.empty(x.queue, (rows, h), x.dtype)
    p = _Problem(a=x2, b=weight.transpose(0, 1), out=out, bias=None, residual=None, activation=None,
                 alpha=1.0, m=rows, n=h, k=k, batch=(), squeeze=())
    launch(p, "gemv", scales=scales, glu=True)
    return out.reshape(x.shape[:-1] + (h,))


def _glu_fits(x: Any, weight: Tensor, int8: bool = False) -> bool:
    """x takes the gemv kernel against `weight`: a floating Tensor of at most gemv_max_rows rows (an `int8`
    weight: GEMV_MAX_ROWS, the matrix units do not take it), K and the offsets multiples of 8 (the stacked
    weight is contiguous)."""
    if not isinstance(x, Tensor) or x.ndim < 1 or x.dtype not in (dtypes.float16, dtypes.bfloat16,
                                                                   dtypes.float32):
        return False
    k = weight.shape[1]
    rows = x.size // k if k and x.shape[-1] == k else 0
    limit = GEMV_MAX_ROWS if int8 else gemv_max_rows(x.device, x.dtype)
    return (0 < rows <= limit and k % 8 == 0 and x.offset % 8 == 0 and weight.offset % 8 == 0
            and weight.is_contiguous() and gemv_usable(x.device, x.dtype))


def rms_norm_linear(x: Tensor, norm_weight: Tensor, eps: float, weight: Tensor, bias: Tensor | None = None,
                    scales: Tensor | None = None, glu: bool = False) -> Tensor:
    """y @ W^T (+ bias) for y = rms_norm(x, norm_weight, eps) over x's last axis (..., in): W (out, in) in x's
    dtype, or int8 with `scales` (linear_int8); `glu`: silu(y @ W[:h]^T) * (y @ W[h:]^T) of a stacked W (2h,
    in) (linear_glu, no bias). A decode step's few rows (linear_glu's rules, and A's rows fitting the kernel's
    local memory: gemv_rms_fits) take one gemv launch that normalizes each row in its prologue, rounded to
    x's storage as rms_norm's output is; more rows take rms_norm and then the linear layer."""
    if not isinstance(weight, Tensor) or weight.ndim != 2:
        raise ShapeError(f"rms_norm_linear: the weight must be a 2-D Tensor (out, in), got "
                         f"{getattr(weight, 'shape', type(weight).__name__)}")
    n, k = weight.shape
    if not isinstance(x, Tensor) or x.ndim < 1 or x.shape[-1] != k or not dtypes.is_floating(x.dtype):
        raise ShapeError(f"rms_norm_linear: x must be a floating Tensor (..., {k}), got "
                         f"{getattr(x, 'dtype', None)} {getattr(x, 'shape', None)}")
    if not isinstance(norm_weight, Tensor) or norm_weight.shape != (k,) or norm_weight.dtype != x.dtype:
        raise ShapeError(f"rms_norm_linear: norm_weight must be a {x.dtype} Tensor of shape ({k},), got "
                         f"{getattr(norm_weight, 'dtype', None)} {getattr(norm_weight, 'shape', None)}")
    if glu and (n % 2 or bias is not None):
        raise ShapeError(f"rms_norm_linear: glu needs a stacked weight of 2h rows and no bias, got {n} rows"
                         f"{' and a bias' if bias is not None else ''}")
    if scales is None and weight.dtype != x.dtype:
        raise DTypeError(f"rms_norm_linear: x is {x.dtype} but the weight is {weight.dtype}")
    if bias is not None and (not isinstance(bias, Tensor) or bias.shape != (n,) or bias.dtype != x.dtype):
        raise ShapeError(f"rms_norm_linear: bias must be a {x.dtype} Tensor of shape ({n},), got "
                         f"{getattr(bias, 'dtype', None)} {getattr(bias, 'shape', None)}")
    check_same_queue(x, norm_weight, weight)
    rows = x.size // k if k else 0
    width = n // 2 if glu else n
    fits = _glu_fits(x, weight, scales is not None)
    if not (fits and gemv_rms_fits(x.device, x.dtype, rows, width, k, glu)):
        y = norm.rms_norm(x, (k,), norm_weight, eps)[0]
        if glu:
            return linear_glu(y, weight, scales)
        if scales is not None:
            return linear_int8(y, weight, scales, bias)
        return gemm(y, weight.transpose(0, 1), bias)
    x2 = (x if x.is_contiguous() else x.contiguous()).reshape(rows, k)
    out = Tensor.empty(x.queue, (rows, width), x.dtype)
    p = _Problem(a=x2, b=weight.transpose(0, 1), out=out, bias=bias, residual=None, activation=None,
                 alpha=1.0, m=rows, n=width, k=k, batch=(), squeeze=())
    launch(p, "gemv", scales=scales, glu=glu, rms=(norm_weight, float(eps)))
    return out.reshape(x.shape[:-1] + (width,))
