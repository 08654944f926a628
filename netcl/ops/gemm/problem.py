"""A GEMM problem as the kernels see it: operands and their layouts, batch broadcasting, the epilogue
(bias per column or per row, activation, residual, alpha), checked before anything is enqueued."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyopencl import cltypes

from netcl import kernels
from netcl.core import dtypes
from netcl.core.tensor import Tensor, check_same_queue
from netcl.errors import DTypeError, ShapeError

_FLOAT_DTYPES = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)

# -- shapes and layouts -------------------------------------------------------------------------------


def _broadcast_batch(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...], a_full: tuple, b_full: tuple
) -> tuple:
    n = max(len(a_shape), len(b_shape))
    pa = (1,) * (n - len(a_shape)) + tuple(a_shape)
    pb = (1,) * (n - len(b_shape)) + tuple(b_shape)
    out = []
    for x, y in zip(pa, pb):
        if x != y and x != 1 and y != 1:
            raise ShapeError(
                f"matmul: batch dimensions of a {a_full} and b {b_full} do not broadcast "
                f"({a_shape} vs {b_shape})"
            )
        out.append(max(x, y) if min(x, y) != 0 else 0)
    return tuple(out)


def _batch_strides(t: Tensor, batch: tuple[int, ...]) -> list[int]:
    """Strides of t's leading (batch) dims aligned to `batch`, 0 where t broadcasts."""
    own_shape, own_strides = t.shape[:-2], t.strides[:-2]
    lead = len(batch) - len(own_shape)
    out = [0] * lead
    for size, stride in zip(own_shape, own_strides):
        out.append(0 if size == 1 else stride)
    return out


def _collapse(batch: tuple[int, ...], stride_sets: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 batch dims and merge neighbours that are contiguous in every operand."""
    shape: list[int] = []
    out: list[list[int]] = [[] for _ in stride_sets]
    for i, size in enumerate(batch):
        if size == 1:
            continue
        if shape and all(o[-1] == s[i] * size for o, s in zip(out, stride_sets)):
            shape[-1] *= size
            for o, s in zip(out, stride_sets):
                o[-1] = s[i]
        else:
            shape.append(size)
            for o, s in zip(out, stride_sets):
                o.append(s[i])
    return shape, out


def _matrix_strides(rows: int, cols: int, row_stride: int, col_stride: int) -> tuple[int, int]:
    """Canonical strides of a rows x cols matrix (strides of size-1 dims are free to choose)."""
    if cols == 1:
        col_stride = 1
    if rows == 1:
        row_stride = max(cols, 1) if col_stride == 1 else 1
    return row_stride, col_stride


def _tiled_layout(rows: int, cols: int, row_stride: int, col_stride: int) -> bool | None:
    """For the tiled kernel: False = row-major (cols contiguous), True = transposed, None = neither."""
    rs, cs = _matrix_strides(rows, cols, row_stride, col_stride)
    if cs == 1 and rs >= cols:
        return False
    if rs == 1 and cs >= rows:
        return True
    return None


@dataclass
class _Problem:
    a: Tensor
    b: Tensor
    out: Tensor
    bias: Tensor | None
    residual: Tensor | None
    activation: str | None  # the epilogue activation's name (kernels.ACTIVATIONS)
    alpha: float
    m: int
    n: int
    k: int
    batch: tuple[int, ...]
    squeeze: tuple[int, ...]  # axes of the result removed because an operand was 1-D
    bias_rows: bool = False  # the bias runs along M (one value per output row) instead of N
    # matmul_wide: a float32 tensor shaped like `out` that split-K's reduction launch writes instead of `out`
    # (the float32 sums of half operands, not rounded to half); the launch then makes it `out`
    wide: Tensor | None = None


def _as_float_dtype(a: Tensor, b: Tensor, extra: Sequence[tuple[str, Tensor | None]]) -> np.dtype:
    if a.dtype != b.dtype:
        raise DTypeError(f"matmul: a is {a.dtype} and b is {b.dtype}; cast one so both match")
    if a.dtype not in _FLOAT_DTYPES:
        raise DTypeError(f"matmul supports float16, bfloat16, float32 and float64, got {a.dtype}; cast first")
    for name, t in extra:
        if t is not None and t.dtype != a.dtype:
            raise DTypeError(f"matmul: {name} is {t.dtype} but the operands are {a.dtype}")
    dtypes.check_supported_on(a.dtype, a.device)
    return a.dtype


def _prepare(
    a: Tensor, b: Tensor, bias: Tensor | None, residual: Tensor | None, activation: Any, alpha: float,
    bias_rows: bool = False,
) -> _Problem:
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise DTypeError(f"matmul takes netcl Tensors, got {type(a).__name__} and {type(b).__name__}")
    check_same_queue(*[t for t in (a, b, bias, residual) if t is not None])
    _as_float_dtype(a, b, [("bias", bias), ("residual", residual)])
    kernels.activation(activation)  # ValueError naming the choices
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"matmul needs operands of at least 1 dimension, got shapes {a.shape} and {b.shape}")
    a_full, b_full = a.shape, b.shape
    squeeze = []
    if a.ndim == 1:
        a = a.unsqueeze(0)
        squeeze.append(-2)
    if b.ndim == 1:
        b = b.unsqueeze(1)
        squeeze.append(-1)
    m, k = a.shape[-2:]
    k2, n = b.shape[-2:]
    if k != k2:
        raise ShapeError(
            f"matmul: inner dimensions differ: a has shape {a_full} (K={k}) and b has shape {b_full} (K={k2})"
        )
    batch = _broadcast_batch(a.shape[:-2], b.shape[:-2], a_full, b_full)
    out = Tensor.empty(a.queue, batch + (m, n), a.dtype)
    along = m if bias_rows else n
    if bias is not None and (bias.ndim != 1 or bias.shape[0] != along):
        raise ShapeError(f"bias must have shape ({along},) for an output of shape {out.shape}"
                         f"{' (a bias per row)' if bias_rows else ''}, got {bias.shape}")
    if residual is not None:
        try:
            residual = residual.expand(out.shape)
        except ShapeError:
            raise ShapeError(
                f"residual of shape {residual.shape} does not broadcast to the output shape {out.shape}"
            ) from None
    return _Problem(
        a,
        b,
        out,
        bias,
        residual,
        None if activation == "none" else activation,
        float(alpha),
        m,
        n,
        k,
        batch,
        tuple(squeeze),
        bias_rows and bias is not None,
    )


def _finish(p: _Problem) -> Tensor:
    out = p.out
    for axis in p.squeeze:
        out = out.squeeze(axis)
    return out


@functools.lru_cache(maxsize=256)
def _long4(x: int, y: int, z: int, w: int) -> Any:
    """cltypes.make_long4, cached: it costs ~25 us a call (it evals a constructor) and the batch
    strides repeat from call to call. The returned array is only read (passed as a kernel arg)."""
    return cltypes.make_long4(x, y, z, w)


def _k_contiguous(p: _Problem) -> bool:
    _, a_ks = _matrix_strides(p.m, p.k, p.a.strides[-2], p.a.strides[-1])
    b_ks, _ = _matrix_strides(p.k, p.n, p.b.strides[-2], p.b.strides[-1])
    return a_ks == 1 and b_ks == 1


def flops(m: int, n: int, k: int, batch: int = 1) -> float:
    """Floating-point operations of a GEMM (multiply and add counted separately)."""
    return 2.0 * m * n * k * batch
