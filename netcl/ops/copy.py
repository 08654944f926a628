"""Copies between tensors of any layout (copy.cl): the strided copy behind Tensor.copy_, contiguous and
clone, which this module installs on Tensor (core knows no kernel file)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import pyopencl.cltypes as cltypes

from netcl import kernels
from netcl.core import dtypes
from netcl.core.backend import enqueue_copy
from netcl.core.tensor import MAX_DIMS, Tensor, _coalesce, check_same_queue
from netcl.errors import DTypeError, ShapeError


def long4x2(values: Sequence[int], fill: int) -> tuple[np.ndarray, np.ndarray]:
    """Up to 8 sizes or strides as the two long4 kernel arguments copy.cl and index.cl take."""
    return _long4x2_cached(tuple(int(v) for v in values), fill)


@functools.lru_cache(maxsize=1024)
def _long4x2_cached(values: tuple[int, ...], fill: int) -> tuple[np.ndarray, np.ndarray]:
    """cltypes.make_long4 evals a constructor (~50 us a call); the strides and shapes of copies
    repeat from step to step. The returned arrays are only read (passed as kernel args)."""
    padded = list(values) + [fill] * (MAX_DIMS - len(values))
    return cltypes.make_long4(*padded[:4]), cltypes.make_long4(*padded[4:])


def strided_copy(dst: Tensor, src: Tensor) -> None:
    """dst[...] = src[...] for tensors of equal shape and itemsize, any strides (one launch)."""
    n = dst.size
    if n == 0:
        return
    if dst.storage is src.storage:
        (d_lo, d_hi), (s_lo, s_hi) = dst._span(), src._span()
        if d_lo <= s_hi and s_lo <= d_hi:  # overlapping memory: go through a temporary
            src = src.clone()
    shape, (dst_strides, src_strides) = _coalesce(dst.shape, dst.strides, src.strides)
    if not shape:
        shape, dst_strides, src_strides = [1], [1], [1]
    if len(shape) == 1 and dst_strides[0] == 1 and src_strides[0] == 1:
        enqueue_copy(
            dst.queue, dst.buffer, src.buffer,
            src_offset=src.offset * src.itemsize, dst_offset=dst.offset * dst.itemsize,
            byte_count=n * dst.itemsize,
        )
        return
    prg = kernels.program(dst.device, "copy.cl", T=dtypes.cl_bits_type(dst.itemsize), NDIM=len(shape))
    prg.strided_copy(
        dst.queue, (n,), None,
        dst.buffer, np.int64(dst.offset), *long4x2(dst_strides, 0),
        src.buffer, np.int64(src.offset), *long4x2(src_strides, 0),
        *long4x2(shape, 1), np.int64(n),
    )


def copy_(self: Tensor, src: Tensor) -> Tensor:
    """Copy `src` (same shape and dtype, any layout) into this tensor's elements."""
    check_same_queue(self, src)
    if src.shape != self.shape:
        raise ShapeError(f"cannot copy a tensor of shape {src.shape} into one of shape {self.shape}")
    if src.dtype != self.dtype:
        raise DTypeError(f"cannot copy {src.dtype} into {self.dtype} (cast it first)")
    strided_copy(self, src)
    return self


def contiguous(self: Tensor) -> Tensor:
    """This tensor if already row-major contiguous, else a contiguous copy."""
    if self.is_contiguous():
        return self
    return self.clone()


def clone(self: Tensor) -> Tensor:
    """A contiguous copy with its own memory."""
    out = Tensor.empty(self.queue, self.shape, self.dtype)
    strided_copy(out, self)
    return out


def install() -> None:
    Tensor.copy_ = copy_
    Tensor.contiguous = contiguous
    Tensor.clone = clone
