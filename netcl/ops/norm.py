"""Normalisation ops: BatchNorm2d (train/eval), LayerNorm, RMSNorm, GroupNorm; forward and backward.

Each direction is one kernel launch (netcl/kernels/norm.cl). Forward functions return the output
and the statistics the backward needs (like PyTorch's native_* ops):
  batch_norm -> (out, save_mean, save_invstd)     layer_norm / group_norm -> (out, mean, rstd)
  rms_norm -> (out, rstd)
Statistics are accumulated in float32 for float32 tensors and float64 for float64 tensors.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from netcl import kernels
from netcl.core import dtypes
from netcl.core.tensor import Tensor, check_same_queue
from netcl.errors import DTypeError, ShapeError


def _float_dtype(op: str, *tensors: Tensor | None) -> np.dtype:
    ts = [t for t in tensors if t is not None]
    check_same_queue(*ts)
    dt = ts[0].dtype
    for t in ts:
        if t.dtype != dt:
            raise DTypeError(f"{op}: all tensors must share one dtype, got {[str(t.dtype) for t in ts]}")
    if dt not in (dtypes.float32, dtypes.float64):
        raise DTypeError(f"{op} supports float32 and float64 tensors, got {dt}")
    return dt


# Work-group size per row/channel; None = by device kind (1 on CPUs, 256 on GPUs). Tests set it
# to exercise the GPU's local-memory reduction on the CPU device.
local_size_override: int | None = None


def _local_size(device: Any) -> int:
    if local_size_override is not None:
        return local_size_override
    return 1 if device.capabilities.kind == "cpu" else 256


def _program(device: Any, dt: np.dtype, relu: bool = False):
    return kernels.program(device, "norm.cl", dtype=dt, act="relu" if relu else None, LOCAL=_local_size(device))


def _scalar(dt: np.dtype, v: float):
    return np.float64(v) if dt == dtypes.float64 else np.float32(v)


def _check_param(op: str, name: str, t: Tensor | None, shape: tuple[int, ...]) -> Tensor | None:
    if t is None:
        return None
    if tuple(t.shape) != shape:
        raise ShapeError(f"{op}: {name} must have shape {shape}, got {tuple(t.shape)}")
    return t.contiguous()


def _activation_flag(op: str, activation: str | None) -> bool:
    if activation not in (None, "relu"):
        raise ValueError(f"{op}: activation must be None or 'relu', got {activation!r}")
    return activation == "relu"


# -- BatchNorm -----------------------------------------------------------------------------------
def _bn_shape(op: str, x: Tensor) -> tuple[int, int, int]:
    if x.ndim < 2:
        raise ShapeError(f"{op}: input must be (N, C) or (N, C, *), got shape {x.shape}")
    return x.shape[0], x.shape[1], math.prod(x.shape[2:])


def batch_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, running_mean: Tensor | None,
               running_var: Tensor | None, training: bool, momentum: float = 0.1, eps: float = 1e-5,
               activation: str | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """BatchNorm over channel 1 of (N, C, *): y = (x - mean) * invstd * weight + bias [then relu].

    training: batch statistics (biased variance to normalise); running stats, when given, are
    updated in place with `momentum` and the unbiased variance, as PyTorch does. Eval: running stats.
    Returns (out, save_mean, save_invstd) where the saves are the statistics used, shape (C,).
    """
    relu = _activation_flag("batch_norm", activation)
    dt = _float_dtype("batch_norm", x, weight, bias, running_mean, running_var)
    n, c, hw = _bn_shape("batch_norm", x)
    weight = _check_param("batch_norm", "weight", weight, (c,))
    bias = _check_param("batch_norm", "bias", bias, (c,))
    for name, t in (("running_mean", running_mean), ("running_var", running_var)):
        if t is not None and (tuple(t.shape) != (c,) or not t.is_contiguous()):
            raise ShapeError(f"batch_norm: {name} must be a contiguous ({c},) tensor, got shape {tuple(t.shape)}")
    if (running_mean is None) != (running_var is None):
        raise ShapeError("batch_norm: pass both running_mean and running_var, or neither")
    if not training and running_mean is None:
        raise ShapeError("batch_norm: eval mode (training=False) needs running_mean and running_var")
    if training and n * hw <= 1:
        raise ShapeError(f"batch_norm: training needs more than one value per channel, got input shape {x.shape}")
    x = x.contiguous()
    out = Tensor.empty(x.queue, x.shape, dt)
    save_mean = Tensor.empty(x.queue, (c,), dt)
    save_invstd = Tensor.empty(x.queue, (c,), dt)
    if c == 0:
        return out, save_mean, save_invstd
    local = _local_size(x.device)
    prg = _program(x.device, dt, relu)
    dummy = out.buffer
    rm_off = running_mean.offset if running_mean is not None else 0
    rv_off = running_var.offset if running_var is not None else 0
    if rm_off or rv_off:
        raise ShapeError("batch_norm: running_mean/running_var views with an offset cannot be updated in "
                         "place; pass whole tensors")
    weight, bias = (t.clone() if t is not None and t.offset else t for t in (weight, bias))
    prg.batch_norm_forward(
        x.queue, (c * local,), (local,), x.buffer, np.int64(x.offset),
        weight.buffer if weight is not None else dummy, bias.buffer if bias is not None else dummy,
        np.int32(weight is not None), np.int32(bias is not None),
        running_mean.buffer if running_mean is not None else dummy,
        running_var.buffer if running_var is not None else dummy, np.int32(running_mean is not None),
        out.buffer, save_mean.buffer, save_invstd.buffer, np.int32(n), np.int32(c), np.int32(hw),
        np.int32(bool(training)), _scalar(dt, momentum), _scalar(dt, eps),
    )
    return out, save_mean, save_invstd


def batch_norm_relu(x: Tensor, weight: Tensor | None, bias: Tensor | None, running_mean: Tensor | None,
                    running_var: Tensor | None, training: bool, momentum: float = 0.1,
                    eps: float = 1e-5) -> tuple[Tensor, Tensor, Tensor]:
    """relu(batch_norm(...)) in one launch; backward: batch_norm_backward(..., activation='relu')."""
    return batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps, activation="relu")


def batch_norm_backward(grad_out: Tensor, x: Tensor, weight: Tensor | None, save_mean: Tensor,
                        save_invstd: Tensor, training: bool = True, bias: Tensor | None = None,
                        activation: str | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(grad_x, grad_weight, grad_bias) of batch_norm; activation='relu' (with bias) for batch_norm_relu."""
    relu = _activation_flag("batch_norm_backward", activation)
    dt = _float_dtype("batch_norm_backward", grad_out, x, weight, bias, save_mean, save_invstd)
    if tuple(grad_out.shape) != tuple(x.shape):
        raise ShapeError(f"batch_norm_backward: grad_out shape {grad_out.shape} != input shape {x.shape}")
    n, c, hw = _bn_shape("batch_norm_backward", x)
    weight = _check_param("batch_norm_backward", "weight", weight, (c,))
    bias = _check_param("batch_norm_backward", "bias", bias, (c,))
    save_mean = _check_param("batch_norm_backward", "save_mean", save_mean, (c,))
    save_invstd = _check_param("batch_norm_backward", "save_invstd", save_invstd, (c,))
    gy, x = grad_out.contiguous(), x.contiguous()
    # kernels take parameter buffers from offset 0
    weight, bias, save_mean, save_invstd = (
        t.clone() if t is not None and t.offset else t for t in (weight, bias, save_mean, save_invstd))
    gx = Tensor.empty(x.queue, x.shape, dt)
    gw = Tensor.empty(x.queue, (c,), dt)
    gb = Tensor.empty(x.queue, (c,), dt)
    if c:
        local = _local_size(x.device)
        dummy = gx.buffer
        _program(x.device, dt, relu).batch_norm_backward(
            x.queue, (c * local,), (local,), gy.buffer, np.int64(gy.offset), x.buffer, np.int64(x.offset),
            weight.buffer if weight is not None else dummy, bias.buffer if bias is not None else dummy,
            np.int32(weight is not None), np.int32(bias is not None), save_mean.buffer, save_invstd.buffer,
            gx.buffer, gw.buffer, gb.buffer, np.int32(n), np.int32(c), np.int32(hw), np.int32(bool(training)),
        )
    return gx, gw, gb


# -- row norms: LayerNorm, RMSNorm, GroupNorm ----------------------------------------------------
def _row_forward(op: str, x: Tensor, weight: Tensor | None, bias: Tensor | None, rows: int, length: int,
                 pg: int, pdiv: int, rms: bool, eps: float, relu: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    dt = x.dtype
    x = x.contiguous()
    out = Tensor.empty(x.queue, x.shape, dt)
    mean = Tensor.empty(x.queue, (rows,), dt)
    rstd = Tensor.empty(x.queue, (rows,), dt)
    if rows == 0:
        return out, mean, rstd
    weight, bias = (t.clone() if t is not None and t.offset else t for t in (weight, bias))
    local = _local_size(x.device)
    dummy = out.buffer
    _program(x.device, dt, relu).row_norm_forward(
        x.queue, (rows * local,), (local,), x.buffer, np.int64(x.offset),
        weight.buffer if weight is not None else dummy, bias.buffer if bias is not None else dummy,
        np.int32(weight is not None), np.int32(bias is not None), out.buffer, mean.buffer, rstd.buffer,
        np.int32(rows), np.int32(length), np.int32(pg), np.int32(pdiv), np.int32(rms), _scalar(dt, eps),
    )
    return out, mean, rstd


def _row_backward(grad_out: Tensor, x: Tensor, weight: Tensor | None, mean: Tensor | None, rstd: Tensor,
                  rows: int, length: int, pg: int, pdiv: int, nparam: int,
                  rms: bool) -> tuple[Tensor, Tensor, Tensor]:
    dt = x.dtype
    gy, x = grad_out.contiguous(), x.contiguous()
    weight, mean, rstd = (t.clone() if t is not None and (t.offset or not t.is_contiguous()) else t
                          for t in (weight, mean, rstd))
    gx = Tensor.empty(x.queue, x.shape, dt)
    gw = Tensor.empty(x.queue, (max(nparam, 1),), dt)
    gb = Tensor.empty(x.queue, (max(nparam, 1),), dt)
    if rows:
        local = _local_size(x.device)
        groups = rows + math.ceil(nparam / local)
        _program(x.device, dt).row_norm_backward(
            x.queue, (groups * local,), (local,), gy.buffer, np.int64(gy.offset), x.buffer, np.int64(x.offset),
            weight.buffer if weight is not None else gx.buffer, np.int32(weight is not None),
            mean.buffer if mean is not None else rstd.buffer, rstd.buffer, gx.buffer, gw.buffer, gb.buffer,
            np.int32(rows), np.int32(length), np.int32(pg), np.int32(pdiv), np.int32(nparam), np.int32(rms),
        )
    return gx, gw, gb


def _normalized(op: str, x: Tensor, normalized_shape: Any) -> tuple[tuple[int, ...], int, int]:
    shape = (int(normalized_shape),) if isinstance(normalized_shape, (int, np.integer)) else tuple(
        int(s) for s in normalized_shape)
    if not shape or tuple(x.shape[x.ndim - len(shape):]) != shape or len(shape) > x.ndim:
        raise ShapeError(f"{op}: normalized_shape {shape} must match the trailing dimensions of input shape "
                         f"{x.shape}")
    length = math.prod(shape)
    return shape, x.size // max(length, 1), length


def layer_norm(x: Tensor, normalized_shape: Any, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> tuple[Tensor, Tensor, Tensor]:
    """(out, mean, rstd): normalise over the trailing `normalized_shape` dims; mean/rstd are per row."""
    _float_dtype("layer_norm", x, weight, bias)
    shape, rows, length = _normalized("layer_norm", x, normalized_shape)
    weight = _check_param("layer_norm", "weight", weight, shape)
    bias = _check_param("layer_norm", "bias", bias, shape)
    out, mean, rstd = _row_forward("layer_norm", x, weight, bias, rows, length, 1, 1, False, eps)
    lead = x.shape[: x.ndim - len(shape)]
    return out, mean.reshape(lead), rstd.reshape(lead)


def layer_norm_backward(grad_out: Tensor, x: Tensor, normalized_shape: Any, mean: Tensor, rstd: Tensor,
                        weight: Tensor | None = None, bias: Tensor | None = None
                        ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(grad_x, grad_weight, grad_bias) of layer_norm; grads of absent parameters are None."""
    _float_dtype("layer_norm_backward", grad_out, x, weight, mean, rstd)
    if tuple(grad_out.shape) != tuple(x.shape):
        raise ShapeError(f"layer_norm_backward: grad_out shape {grad_out.shape} != input shape {x.shape}")
    shape, rows, length = _normalized("layer_norm_backward", x, normalized_shape)
    weight = _check_param("layer_norm_backward", "weight", weight, shape)
    gx, gw, gb = _row_backward(grad_out, x, weight, mean.reshape(rows), rstd.reshape(rows), rows, length, 1, 1,
                               length, False)
    return gx, gw.reshape(shape) if weight is not None else None, gb.reshape(shape) if bias is not None else None


def rms_norm(x: Tensor, normalized_shape: Any, weight: Tensor | None = None,
             eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """(out, rstd): out = x * rsqrt(mean(x^2) + eps) * weight over the trailing dims."""
    _float_dtype("rms_norm", x, weight)
    shape, rows, length = _normalized("rms_norm", x, normalized_shape)
    weight = _check_param("rms_norm", "weight", weight, shape)
    out, _, rstd = _row_forward("rms_norm", x, weight, None, rows, length, 1, 1, True, eps)
    return out, rstd.reshape(x.shape[: x.ndim - len(shape)])


def rms_norm_backward(grad_out: Tensor, x: Tensor, normalized_shape: Any, rstd: Tensor,
                      weight: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """(grad_x, grad_weight) of rms_norm."""
    _float_dtype("rms_norm_backward", grad_out, x, weight, rstd)
    if tuple(grad_out.shape) != tuple(x.shape):
        raise ShapeError(f"rms_norm_backward: grad_out shape {grad_out.shape} != input shape {x.shape}")
    shape, rows, length = _normalized("rms_norm_backward", x, normalized_shape)
    weight = _check_param("rms_norm_backward", "weight", weight, shape)
    gx, gw, _ = _row_backward(grad_out, x, weight, None, rstd.reshape(rows), rows, length, 1, 1, length, True)
    return gx, gw.reshape(shape) if weight is not None else None


def _group_geometry(op: str, x: Tensor, num_groups: int) -> tuple[int, int, int, int]:
    if x.ndim < 2:
        raise ShapeError(f"{op}: input must be (N, C, *), got shape {x.shape}")
    n, c = x.shape[0], x.shape[1]
    if not isinstance(num_groups, (int, np.integer)) or num_groups < 1 or c % num_groups:
        raise ShapeError(f"{op}: channels C={c} (input shape {x.shape}) are not divisible by "
                         f"num_groups={num_groups}")
    hw = math.prod(x.shape[2:])
    return n, c, hw, int(num_groups)


def group_norm(x: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> tuple[Tensor, Tensor, Tensor]:
    """(out, mean, rstd): normalise each of num_groups channel groups per sample; weight/bias per channel.
    mean and rstd have shape (N, num_groups)."""
    _float_dtype("group_norm", x, weight, bias)
    n, c, hw, g = _group_geometry("group_norm", x, num_groups)
    weight = _check_param("group_norm", "weight", weight, (c,))
    bias = _check_param("group_norm", "bias", bias, (c,))
    out, mean, rstd = _row_forward("group_norm", x, weight, bias, n * g, (c // g) * hw, g, max(hw, 1), False, eps)
    return out, mean.reshape(n, g), rstd.reshape(n, g)


def group_norm_backward(grad_out: Tensor, x: Tensor, num_groups: int, mean: Tensor, rstd: Tensor,
                        weight: Tensor | None = None, bias: Tensor | None = None
                        ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(grad_x, grad_weight, grad_bias) of group_norm; grads of absent parameters are None."""
    _float_dtype("group_norm_backward", grad_out, x, weight, mean, rstd)
    if tuple(grad_out.shape) != tuple(x.shape):
        raise ShapeError(f"group_norm_backward: grad_out shape {grad_out.shape} != input shape {x.shape}")
    n, c, hw, g = _group_geometry("group_norm_backward", x, num_groups)
    weight = _check_param("group_norm_backward", "weight", weight, (c,))
    gx, gw, gb = _row_backward(grad_out, x, weight, mean.reshape(n * g), rstd.reshape(n * g), n * g,
                               (c // g) * hw, g, max(hw, 1), c, False)
    return gx, gw if weight is not None else None, gb if bias is not None else None


__all__ = [
    "batch_norm",
    "batch_norm_backward",
    "batch_norm_relu",
    "group_norm",
    "group_norm_backward",
    "layer_norm",
    "layer_norm_backward",
    "rms_norm",
    "rms_norm_backward",
]
