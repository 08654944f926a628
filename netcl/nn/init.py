"""Parameter initialisers (PyTorch's formulas), drawn on the device from netcl.ops.random's Philox: ones that
make a new Tensor (uniform, kaiming_uniform, ...) and PyTorch's in-place ones (xavier_uniform_, zeros_, ...).

Each takes an optional Generator; without one the default generator is used, so
`netcl.ops.random.manual_seed(s)` makes model initialisation reproducible.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Any

from netcl.autograd.engine import Node
from netcl.core import dtypes
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, ShapeError
from netcl.ops import random


class _Skip(threading.local):
    depth = 0


_skip = _Skip()


@contextlib.contextmanager
def skipped() -> Iterator[None]:
    """`with init.skipped():` the initialisers that make a new Tensor (uniform, kaiming_uniform, normal,
    zeros, ones) return uninitialised ones (Tensor.empty) and draw nothing: for a model whose every
    parameter is loaded right after (GPT.from_pretrained), which then costs no random fill of its size."""
    _skip.depth += 1
    try:
        yield
    finally:
        _skip.depth -= 1


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
    if _skip.depth:
        return Tensor.empty(q, shape, dtype)
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
    if _skip.depth:
        return Tensor.empty(q, shape, dtype)
    return random.randn(q, shape, dtype, mean=mean, std=std, generator=generator)


def zeros(q: Any, shape: tuple[int, ...], dtype: Any = "float32") -> Tensor:
    return Tensor.empty(q, shape, dtype) if _skip.depth else Tensor.zeros(q, shape, dtype)


def ones(q: Any, shape: tuple[int, ...], dtype: Any = "float32") -> Tensor:
    return Tensor.empty(q, shape, dtype) if _skip.depth else Tensor.ones(q, shape, dtype)


# -- PyTorch's in-place initialisers (torch.nn.init.*_): fill an existing Parameter, Node or Tensor -------
# `model.apply(fn)` with `init.xavier_uniform_(m.weight)` and `init.zeros_(m.bias)` inside works as in
# PyTorch. Each writes into the tensor's memory (optimizer state keeps pointing at it) and returns its
# argument.
_GAINS = {"linear": 1.0, "identity": 1.0, "conv1d": 1.0, "conv2d": 1.0, "conv3d": 1.0, "sigmoid": 1.0,
          "tanh": 5.0 / 3.0, "relu": math.sqrt(2.0), "selu": 0.75}


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """PyTorch's recommended gain of a nonlinearity (leaky_relu's slope `param`, default 0.01)."""
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1 + slope * slope))
    if nonlinearity not in _GAINS:
        raise ValueError(f"calculate_gain: unknown nonlinearity {nonlinearity!r}; one of "
                         f"{sorted([*_GAINS, 'leaky_relu'])}")
    return _GAINS[nonlinearity]


def _target(x: Any, name: str) -> Tensor:
    t = x.value if isinstance(x, Node) else x
    if not isinstance(t, Tensor):
        raise TypeError(f"init.{name} fills a Parameter, Node or Tensor in place, got {type(x).__name__}")
    if not dtypes.is_floating(t.dtype):
        raise DTypeError(f"init.{name} fills floating-point tensors, got {t.dtype} (shape {t.shape})")
    return t


def _fan(t: Tensor, mode: str, name: str) -> int:
    if t.ndim < 2:
        raise ShapeError(
            f"init.{name} needs a weight of 2 or more dimensions (out, in, ...), got shape {t.shape}"
        )
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"init.{name}: mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = fans(t.shape)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(x: Any, a: float = 0.0, b: float = 1.0, generator: Any = None) -> Any:
    """Fill with U(a, b)."""
    t = _target(x, "uniform_")
    t.copy_(random.rand(t.queue, t.shape, t.dtype, low=a, high=b, generator=generator))
    return x


def normal_(x: Any, mean: float = 0.0, std: float = 1.0, generator: Any = None) -> Any:
    """Fill with N(mean, std^2)."""
    t = _target(x, "normal_")
    t.copy_(random.randn(t.queue, t.shape, t.dtype, mean=mean, std=std, generator=generator))
    return x


def constant_(x: Any, val: float) -> Any:
    _target(x, "constant_").fill_(val)
    return x


def zeros_(x: Any) -> Any:
    return constant_(x, 0.0)


def ones_(x: Any) -> Any:
    return constant_(x, 1.0)


def xavier_uniform_(x: Any, gain: float = 1.0, generator: Any = None) -> Any:
    """U(-b, b), b = gain * sqrt(6 / (fan_in + fan_out))."""
    t = _target(x, "xavier_uniform_")
    fan_in, fan_out = _fan(t, "fan_in", "xavier_uniform_"), _fan(t, "fan_out", "xavier_uniform_")
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(x, -bound, bound, generator)


def xavier_normal_(x: Any, gain: float = 1.0, generator: Any = None) -> Any:
    """N(0, std^2), std = gain * sqrt(2 / (fan_in + fan_out))."""
    t = _target(x, "xavier_normal_")
    fan_in, fan_out = _fan(t, "fan_in", "xavier_normal_"), _fan(t, "fan_out", "xavier_normal_")
    return normal_(x, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), generator)


def kaiming_uniform_(x: Any, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                     generator: Any = None) -> Any:
    """U(-b, b), b = gain * sqrt(3 / fan) (PyTorch's defaults: fan_in, leaky_relu with slope a)."""
    t = _target(x, "kaiming_uniform_")
    bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / max(_fan(t, mode, "kaiming_uniform_"), 1))
    return uniform_(x, -bound, bound, generator)


def kaiming_normal_(x: Any, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                    generator: Any = None) -> Any:
    """N(0, std^2), std = gain / sqrt(fan)."""
    t = _target(x, "kaiming_normal_")
    std = calculate_gain(nonlinearity, a) / math.sqrt(max(_fan(t, mode, "kaiming_normal_"), 1))
    return normal_(x, 0.0, std, generator)
