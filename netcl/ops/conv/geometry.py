"""One convolution's checked geometry (ConvParams: shapes, stride, padding, dilation, groups, output size),
the argument checks every pass shares, and the caches that let a repeated call skip them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl import kernels
from netcl.core import capture, dtypes, shapes
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, ShapeError

ALGORITHMS = ("auto", "direct", "depthwise", "winograd", "im2col")
ACTIVATIONS = (None, "relu")  # what the direct and Winograd kernels fuse (kernels.ACTIVATIONS names)


# -- argument checks -----------------------------------------------------------------------------
def _float_dtype(op: str, *tensors: Tensor) -> np.dtype:
    dt = tensors[0].dtype
    for t in tensors:
        if t.dtype != dt:
            raise DTypeError(f"{op}: all tensors must share one dtype, got {[str(t.dtype) for t in tensors]}")
    if dt not in _DTYPES:
        raise DTypeError(f"{op} supports float16, bfloat16, float32 and float64 tensors, got {dt}")
    return dt


# float16/bfloat16: half storage, float32 arithmetic in the kernels (common.cl's LOAD_T/STORE_T, Winograd's
# transforms included) and the GEMM.
_DTYPES = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
_WINOGRAD_DTYPES = _DTYPES


def _check_winograd_dtype(op: str, dt: np.dtype) -> None:
    if dt not in _WINOGRAD_DTYPES:
        raise DTypeError(f"{op}: algorithm='winograd' supports float32 and float64 tensors, got {dt}; "
                         "use algorithm='auto' or 'im2col' for half")


def _activation(activation: str | None) -> str | None:
    """`activation` checked against what these kernels fuse (kernels.program takes the name)."""
    kernels.activation(activation, allowed=ACTIVATIONS)
    return activation


def _output_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


class ConvParams:
    """Checked geometry of one convolution: shapes, stride, padding, dilation, groups."""

    def __init__(self, x_shape: Sequence[int], w_shape: Sequence[int], stride: Any, padding: Any,
                 dilation: Any, groups: int, op: str = "conv2d"):
        if len(x_shape) != 4:
            raise ShapeError(f"{op}: input must be 4-D (N, C, H, W), got shape {tuple(x_shape)}")
        if len(w_shape) != 4:
            raise ShapeError(f"{op}: weight must be 4-D (K, C/groups, KH, KW), got shape {tuple(w_shape)}")
        self.N, self.C, self.H, self.W = (int(v) for v in x_shape)
        self.K, cg, self.KH, self.KW = (int(v) for v in w_shape)
        self.G = shapes.size(groups, f"{op}: groups", minimum=1)
        if self.C % self.G:
            raise ShapeError(f"{op}: input channels C={self.C} (input shape {tuple(x_shape)}) are not "
                             f"divisible by groups={self.G}")
        if self.K % self.G:
            raise ShapeError(f"{op}: output channels K={self.K} (weight shape {tuple(w_shape)}) are not "
                             f"divisible by groups={self.G}")
        if cg != self.C // self.G:
            raise ShapeError(f"{op}: weight shape {tuple(w_shape)} has {cg} input channels per group but the "
                             f"input shape {tuple(x_shape)} with groups={self.G} needs {self.C // self.G}; "
                             "weight must be (K, C/groups, KH, KW)")
        if self.KH < 1 or self.KW < 1:
            raise ShapeError(
                f"{op}: kernel size {(self.KH, self.KW)} from weight shape {tuple(w_shape)} is empty"
            )
        self.SH, self.SW = shapes.pair(stride, "stride", 1)
        self.DH, self.DW = shapes.pair(dilation, "dilation", 1)
        if isinstance(padding, str):
            if padding == "valid":
                padding = 0
            elif padding == "same":
                if (self.SH, self.SW) != (1, 1):
                    raise ShapeError(f"{op}: padding='same' needs stride 1, got stride {(self.SH, self.SW)}")
                eh, ew = self.DH * (self.KH - 1), self.DW * (self.KW - 1)
                if eh % 2 or ew % 2:
                    raise ShapeError(f"{op}: padding='same' needs an even dilated kernel extent, got "
                                     f"{(eh + 1, ew + 1)}; pad explicitly")
                padding = (eh // 2, ew // 2)
            else:
                raise ShapeError(f"{op}: padding must be an int, a pair, 'same' or 'valid', got {padding!r}")
        self.PH, self.PW = shapes.pair(padding, "padding", 0)
        self.OH = _output_size(self.H, self.KH, self.SH, self.PH, self.DH)
        self.OW = _output_size(self.W, self.KW, self.SW, self.PW, self.DW)
        if self.OH < 1 or self.OW < 1:
            raise ShapeError(
                f"{op}: kernel {(self.KH, self.KW)} with dilation "
                f"{(self.DH, self.DW)} does not fit the input "
                f"{(self.H, self.W)} padded by {(self.PH, self.PW)} (output would be {(self.OH, self.OW)}); "
                "use a smaller kernel or more padding"
            )
        # worked out once (an instance is shared by every call with these arguments, and only read): the
        # passes read them several times per call
        self.Cg = self.C // self.G  # input channels per group
        self.Kg = self.K // self.G  # output channels per group
        self.output_shape = (self.N, self.K, self.OH, self.OW)

    def geometry(self) -> tuple[np.int32, ...]:
        """Kernel arguments N..G in the order every conv kernel takes them (built once per instance:
        instances are shared through _params, and kernel args are only read)."""
        geom = self.__dict__.get("_geometry")
        if geom is None:
            vals = (self.N, self.C, self.H, self.W, self.K, self.OH, self.OW, self.KH, self.KW,
                    self.SH, self.SW, self.PH, self.PW, self.DH, self.DW, self.G)
            geom = self._geometry = tuple(np.int32(v) for v in vals)
        return geom

    @property
    def flops(self) -> int:
        return 2 * self.N * self.K * self.OH * self.OW * self.Cg * self.KH * self.KW

    def key(self) -> tuple:
        return (self.N, self.C, self.H, self.W, self.K, self.KH, self.KW, self.SH, self.SW, self.PH, self.PW,
                self.DH, self.DW, self.G)


_params_cache: dict[tuple, ConvParams] = {}


def _params(x_shape: Sequence[int], w_shape: Sequence[int], stride: Any, padding: Any, dilation: Any,
            groups: Any, op: str = "conv2d") -> ConvParams:
    """ConvParams(...), shared between calls with the same arguments (a training step repeats them);
    the checks run on the first call, so invalid arguments still raise every time (never cached)."""
    try:
        # repr: 2 and 2.0 (or (2, 2) and (2.0, 2.0)) hash alike, but only the int is a valid size
        key = (tuple(x_shape), tuple(w_shape), repr((stride, padding, dilation, groups)), op)
        hit = _params_cache.get(key)
    except TypeError:  # unhashable arguments (lists): no sharing
        return ConvParams(x_shape, w_shape, stride, padding, dilation, groups, op)
    if hit is None:
        hit = ConvParams(x_shape, w_shape, stride, padding, dilation, groups, op)
        if len(_params_cache) < 4096:
            _params_cache[key] = hit
    return hit


# Checked calls: a training step repeats each call with the same shapes, strides, dtypes, queues and
# parameters. The first call runs every check and the algorithm choice; later calls with the same
# signature reuse its result (ConvParams, algorithm) and go straight to allocation and launches, which
# are the same launches with the same arguments (results stay bit-identical). Offsets are not part
# of the signature: no check or choice depends on them, and every launch passes them afresh. The results
# live in netcl.core.capture.plans (keys ("conv", op, ...)): an 'auto' choice read the tuning database when
# it was made, and a change to the database empties that cache.


def _shape_key(shape: Any) -> Any:
    """A shape argument as a hashable key part (lists become tuples; anything odd stays as given)."""
    return tuple(shape) if isinstance(shape, (list, tuple)) else shape


def _checked_key(op: str, tensors: tuple, *params: Any) -> tuple | None:
    # what checks see of each tensor (capture.call_key); repr: 2 and 2.0 must not share a key
    return capture.call_key("conv", tensors, op, repr(params))


def _recall(key: tuple | None) -> Any:
    """What the first call with this signature decided (None: not seen, or no key)."""
    return capture.plans.get(key) if key is not None else None


def _remember(key: tuple | None, value: Any) -> Any:
    if key is not None:
        capture.plans.put(key, value)
    return value
