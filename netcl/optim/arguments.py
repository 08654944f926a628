"""Checks for the numbers, flags, counts and choices that optimizers and schedulers are given.

Each check is a small callable: `check(value, what)` returns the value (a pair as a tuple) or raises
TypeError for a value of the wrong kind (a string, None, a bool where a number goes, a float where a
count goes) and ValueError for one out of range (NaN, inf, negative...), naming `what`, the value and
the allowed range. Counts are never truncated: 2.7 is not a step size.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np


def is_real(value: Any) -> bool:
    """An int, float or NumPy scalar number; not a bool (True is not a learning rate)."""
    if type(value) is float or type(value) is int:  # the usual values, without the ABC's isinstance
        return True
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def is_count(value: Any) -> bool:
    """An int or NumPy integer; not a bool, not a float even if whole."""
    if type(value) is int:
        return True
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _kind(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


class Real:
    """A finite real number in a range ([low, high] by default; open ends when asked)."""

    def __init__(
        self,
        low: float | None = None,
        high: float | None = None,
        *,
        low_open: bool = False,
        high_open: bool = False,
        allow_inf: bool = False,
    ):
        self.low, self.high = low, high
        self.low_open, self.high_open = low_open, high_open
        self.allow_inf = allow_inf

    def describe(self) -> str:
        kind = "a number (not NaN)" if self.allow_inf else "a finite number"
        if self.low is not None and self.high is not None:
            left = "(" if self.low_open else "["
            right = ")" if self.high_open else "]"
            return f"{kind} in {left}{self.low:g}, {self.high:g}{right}"
        if self.low is not None:
            return f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            return f"{kind} {'<' if self.high_open else '<='} {self.high:g}"
        return kind

    def __call__(self, value: Any, what: str) -> Any:
        if not is_real(value):
            raise TypeError(f"{what} must be {self.describe()}, got {_kind(value)}")
        v = float(value)
        bad = math.isnan(v) or (math.isinf(v) and not self.allow_inf)
        if self.low is not None:
            bad = bad or v < self.low or (self.low_open and v == self.low)
        if self.high is not None:
            bad = bad or v > self.high or (self.high_open and v == self.high)
        if bad:
            raise ValueError(f"{what} must be {self.describe()}, got {value!r}")
        return value


class Count:
    """An integer (int or NumPy integer) >= minimum."""

    def __init__(self, minimum: int | None = None):
        self.minimum = minimum

    def describe(self) -> str:
        return "an integer" if self.minimum is None else f"an integer >= {self.minimum}"

    def __call__(self, value: Any, what: str) -> int:
        if not is_count(value):
            raise TypeError(f"{what} must be {self.describe()}, got {_kind(value)}")
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"{what} must be {self.describe()}, got {value!r}")
        return int(value)


class Flag:
    """True or False (a NumPy bool too); 'no', 0 and None are not flags."""

    def describe(self) -> str:
        return "True or False"

    def __call__(self, value: Any, what: str) -> bool:
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{what} must be True or False, got {_kind(value)}")
        return bool(value)


class Choice:
    """One of a few strings."""

    def __init__(self, *options: str):
        self.options = options

    def describe(self) -> str:
        return "one of " + ", ".join(repr(o) for o in self.options)

    def __call__(self, value: Any, what: str) -> str:
        if not isinstance(value, str):
            raise TypeError(f"{what} must be {self.describe()}, got {_kind(value)}")
        if value not in self.options:
            raise ValueError(f"{what} must be {self.describe()}, got {value!r}")
        return value


class Pair:
    """Two numbers, each checked by `item` (Adam's betas); a list is accepted and returned as a tuple."""

    def __init__(self, item: Real):
        self.item = item

    def describe(self) -> str:
        return f"a pair of numbers, each {self.item.describe()}"

    def __call__(self, value: Any, what: str) -> tuple[Any, Any]:
        if not isinstance(value, (tuple, list)):
            raise TypeError(f"{what} must be {self.describe()}, got {_kind(value)}")
        if len(value) != 2:
            raise ValueError(f"{what} must be {self.describe()}, got {len(value)} values: {value!r}")
        return (self.item(value[0], f"{what}[0]"), self.item(value[1], f"{what}[1]"))


class Reals:
    """A list of numbers, each checked by `item`, of a given length (one per parameter group)."""

    def __init__(self, item: Real, length: int | None = None):
        self.item = item
        self.length = length

    def describe(self) -> str:
        n = "" if self.length is None else f"{self.length} "
        return f"a list of {n}numbers, each {self.item.describe()}"

    def __call__(self, value: Any, what: str) -> list[Any]:
        if not isinstance(value, (tuple, list)):
            raise TypeError(f"{what} must be {self.describe()}, got {_kind(value)}")
        if self.length is not None and len(value) != self.length:
            raise ValueError(f"{what} must be {self.describe()}, got {len(value)} values: {value!r}")
        return [self.item(v, f"{what}[{i}]") for i, v in enumerate(value)]
