"""Parameter initialisers (PyTorch's formulas), drawn on the device from netcl.ops.random's Philox.

Each takes an optional Generator; without one the default generator is used, so
`netcl.ops.random.manual_seed(s)` makes model initialisation reproducible.
"""

from __future__ import annotations

import math
from typing import Any

from netcl.core.tensor import Tensor
from netcl.ops import random


def fans(shape: tuple[int, ...]) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight: (out, in) or (out, in, *kernel)."""
    if len(shape) < 2:
        return shape[0] if shape else 1, shape[0] if shape else 1
    receptive = math.prod(shape[2:]) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


def uniform(
    q: Any, shape: tuple[int, ...], bound: float, dtype: Any = "float32", generator: Any = None
) -> Tensor:
    """U(-bound, bound)."""
    return random.rand(q, shape, dtype, low=-bound, high=bound, generator=generator)


def kaiming_uniform(
    q: Any, shape: tuple[int, ...], a: float = math.sqrt(5), dtype: Any = "float32", generator: Any = None
) -> Tensor:
    """U(-b, b) with b = gain * sqrt(3 / fan_in), gain = sqrt(2 / (1 + a^2)); a = sqrt(5) gives
    PyTorch's default for Linear and Conv (b = 1 / sqrt(fan_in))."""
    fan_in, _ = fans(shape)
    gain = math.sqrt(2.0 / (1 + a * a))
    bound = gain * math.sqrt(3.0 / max(fan_in, 1))
    return uniform(q, shape, bound, dtype, generator)


def xavier_uniform(
    q: Any, shape: tuple[int, ...], gain: float = 1.0, dtype: Any = "float32", generator: Any = None
) -> Tensor:
    fan_in, fan_out = fans(shape)
    return uniform(q, shape, gain * math.sqrt(6.0 / (fan_in + fan_out)), dtype, generator)


def normal(
    q: Any,
    shape: tuple[int, ...],
    std: float = 1.0,
    mean: float = 0.0,
    dtype: Any = "float32",
    generator: Any = None,
) -> Tensor:
    return random.randn(q, shape, dtype, mean=mean, std=std, generator=generator)


def zeros(q: Any, shape: tuple[int, ...], dtype: Any = "float32") -> Tensor:
    return Tensor.zeros(q, shape, dtype)


def ones(q: Any, shape: tuple[int, ...], dtype: Any = "float32") -> Tensor:
    return Tensor.ones(q, shape, dtype)
