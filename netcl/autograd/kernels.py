"""Programs of the training kernels (kernels/loss.cl, kernels/optim.cl), memoised per device and defines.

load_program re-reads and hashes the source on every call; a training step launches these
kernels a dozen times, so the built Program is kept here by (device, file, defines).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from netcl.core import dtypes
from netcl.core.backend import Program, load_program
from netcl.errors import DTypeError

_cache: dict[tuple, Program] = {}


def program(device: Any, filename: str, defines: dict[str, Any]) -> Program:
    key = (id(device), filename, tuple(sorted(defines.items())))
    prg = _cache.get(key)
    if prg is None:
        prg = load_program(device, filename, defines)
        _cache[key] = prg
    return prg


def float_defines(dtype: np.dtype, what: str) -> dict[str, Any]:
    """-D T=float|double (and USE_FP64) for a floating dtype, DTypeError otherwise."""
    dt = np.dtype(dtype)
    if dt == dtypes.float32:
        return {"T": "float"}
    if dt == dtypes.float64:
        return {"T": "double", "USE_FP64": None}
    raise DTypeError(f"{what} supports float32 and float64 tensors, got {dt}")


def scalar_type(dtype: np.dtype):
    return np.float64 if np.dtype(dtype) == dtypes.float64 else np.float32


def work_group(device: Any, limit: int = 256) -> int:
    """Largest power of two <= limit that the device accepts for a work-group."""
    cap = min(limit, device.capabilities.max_work_group_size)
    size = 1
    while size * 2 <= cap:
        size *= 2
    return size
