"""Sizes, shapes and axes as users give them: integers only, checked where they enter.

NumPy and PyTorch refuse a size that is not an integer (2.7, 2.0, '12', None) with a TypeError rather
than truncating it; netcl does the same everywhere a size, a shape or an axis is taken, through these
helpers. Integers are anything `operator.index` takes: int, NumPy integers (and bool, as in NumPy).
"""

from __future__ import annotations

import functools
import inspect
import operator
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from netcl.core import launch_labels
from netcl.errors import ShapeError, SizeTypeError


def _kind(value: Any) -> str:
    return type(value).__name__


def size(value: Any, what: str = "size", minimum: int | None = 0) -> int:
    """`value` as an int: SizeTypeError (a TypeError) when it is not an integer, ShapeError (a
    ValueError) when it is below `minimum` (None: no lower bound)."""
    try:
        n = operator.index(value)
    except TypeError:
        raise SizeTypeError(f"{what} must be an integer, got {value!r} ({_kind(value)})") from None
    if minimum is not None and n < minimum:
        raise ShapeError(f"{what} must be at least {minimum}, got {n}")
    return n


def sizes(values: Any, what: str = "size", minimum: int | None = 0) -> tuple[int, ...]:
    """A tuple of sizes from a sequence of them (each checked as `size`)."""
    if (
        isinstance(values, (str, bytes))
        or not isinstance(values, Sequence)
        and not hasattr(values, "__iter__")
    ):
        raise SizeTypeError(f"{what} must be a sequence of integers, got {values!r} ({_kind(values)})")
    return tuple(size(v, what, minimum) for v in values)


def shape(value: Any, what: str = "shape") -> tuple[int, ...]:
    """A shape from an int or a sequence of ints, every dimension >= 0."""
    if isinstance(value, (str, bytes)):
        raise SizeTypeError(
            f"{what} must be an integer or a sequence of integers, got {value!r} ({_kind(value)})"
        )
    try:
        return (
            (_dimension(value, (value,), what),)  # a bare size: -4 is refused as (-4,) is
            if _is_integer(value)
            else tuple(_dimension(v, value, what) for v in value)
        )
    except TypeError as exc:
        if isinstance(exc, SizeTypeError):
            raise
        raise SizeTypeError(
            f"{what} must be an integer or a sequence of integers, got {value!r} ({_kind(value)})"
        ) from None


def varargs(args: tuple) -> tuple:
    """The sizes of `f(2, 3)` or `f((2, 3))` (reshape, view, expand, permute, repeat)."""
    if len(args) != 1:
        return tuple(args)
    first = args[0]
    if type(first) is tuple:   # (the common forms first, without the checks below)
        return first
    if type(first) is list:
        return tuple(first)
    if not _is_integer(first) and not isinstance(first, (str, bytes)) and hasattr(first, "__iter__"):
        return tuple(first)
    return tuple(args)


def _is_integer(value: Any) -> bool:
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _dimension(v: Any, whole: Any, what: str) -> int:
    try:
        n = operator.index(v)
    except TypeError:
        raise SizeTypeError(
            f"{what} {whole!r} has a dimension that is not an integer: {v!r} ({_kind(v)})"
        ) from None
    if n < 0:
        shown = tuple(operator.index(d) if _is_integer(d) else d for d in whole)  # (-4,), not (np.int64(-4),)
        raise ShapeError(f"{what} {shown} has a negative dimension ({n})")
    return n


def pair(value: Any, what: str, minimum: int | None = 0) -> tuple[int, int]:
    """(h, w) from one size or two (kernel sizes, strides, paddings, dilations)."""
    if _is_integer(value):
        n = size(value, what, minimum)
        return n, n
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2:
        raise SizeTypeError(
            f"{what} must be an integer or a pair of integers, got {value!r} ({_kind(value)})"
        )
    return size(value[0], what, minimum), size(value[1], what, minimum)


def axis(value: Any, ndim: int, what: str = "axis", shape_of: Sequence[int] | None = None) -> int:
    """A non-negative axis of an `ndim`-dimensional tensor from one that may count from the end."""
    a = size(value, what, minimum=None)
    if not -ndim <= a < ndim:
        where = f"a tensor of shape {tuple(shape_of)}" if shape_of is not None else f"{ndim} dimensions"
        raise ShapeError(f"{what} {a} is out of range for {where}")
    return a % ndim


def flattened(shape: Sequence[int], start_dim: Any = 0, end_dim: Any = -1) -> tuple[int, ...]:
    """The shape with axes start_dim..end_dim merged into one (torch.flatten's; a 0-d shape gives (1,))."""
    shape = tuple(shape)
    if not shape:
        return (1,)
    s = axis(start_dim, len(shape), "flatten: start_dim", shape_of=shape)
    e = axis(end_dim, len(shape), "flatten: end_dim", shape_of=shape)
    if s > e:
        raise ShapeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} (shape {shape})")
    merged = 1
    for d in shape[s : e + 1]:
        merged *= d
    return shape[:s] + (merged,) + shape[e + 1 :]


class ElementCount(int):
    """What `Tensor.size` is: NumPy's number of elements, an int (`t.size == 0`, `range(t.size)`), and,
    called, PyTorch's size(): `t.size()` the shape, `t.size(dim)` one dimension (a negative dim counts from
    the end). It pickles, prints and serialises as the plain int it is."""

    shape: tuple[int, ...]

    def __new__(cls, shape: tuple[int, ...]) -> ElementCount:
        count = 1
        for d in shape:
            count *= d
        self = super().__new__(cls, count)
        self.shape = shape
        return self

    def __call__(self, dim: Any = None) -> Any:
        if dim is None:
            return self.shape
        return self.shape[axis(dim, len(self.shape), "size: dim", shape_of=self.shape)]

    def __reduce__(self) -> tuple:
        return int, (int(self),)


_counts: dict[tuple[int, ...], ElementCount] = {}


def element_count(shape: tuple[int, ...]) -> ElementCount:
    """The ElementCount of `shape` (one per shape, kept: a program repeats its shapes)."""
    count = _counts.get(shape)
    if count is None:
        count = ElementCount(shape)
        if len(_counts) < 8192:
            _counts[shape] = count
    return count


# -- PyTorch's names for the axis arguments -------------------------------------------------------------
_TORCH_NAMES = (("dim", "axis"), ("keepdim", "keepdims"))
_DIVISORS = ("ddof", "correction", "unbiased")   # var's and std's n - ddof: NumPy's name and PyTorch's two
F = TypeVar("F", bound=Callable[..., Any])


class ValuesIndices(NamedTuple):
    """What max(x, dim=d) and min(x, dim=d) return, as in PyTorch: the extrema and their int64 indices."""

    values: Any
    indices: Any


def _where_libraries_differ(name: str, where: dict[str, int], pair: bool, args: tuple, kwargs: dict) -> None:
    """torch_names' rules where NumPy's and PyTorch's answers differ (max and min: `pair`; var and std): a
    positional axis is a TypeError naming both spellings (for var and std unless the divisor is given), and
    PyTorch's `correction=` / `unbiased=` become `ddof` in kwargs."""
    told = len(args) > where.get("ddof", len(args)) or any(k in kwargs for k in _DIVISORS)
    if len(args) > where["axis"] and (pair or not told):
        a = args[where["axis"]]
        what = (f"gives the values alone (NumPy's), dim={a!r} (values, indices) (PyTorch's)" if pair else
                f"divides by n - ddof (ddof 0 unless given: NumPy's), dim={a!r} by n - correction "
                "(correction 1 unless given: PyTorch's)")
        raise TypeError(f"{name}: name the axis: axis={a!r} {what}")
    if "ddof" in where and ("correction" in kwargs or "unbiased" in kwargs):
        if sum(k in kwargs for k in _DIVISORS) > 1 or len(args) > where["ddof"]:
            raise TypeError(f"{name}: ddof, correction and unbiased are one argument; give one")
        if "unbiased" in kwargs:
            unbiased = kwargs.pop("unbiased")
            if not isinstance(unbiased, bool):
                raise TypeError(f"{name}: unbiased must be True or False, got {unbiased!r}")
            kwargs["ddof"] = int(unbiased)
        else:
            kwargs["ddof"] = kwargs.pop("correction")


def torch_names(fn: F | None = None, *, indices: str | None = None) -> Any:
    """Let a reduction that takes `axis` (and `keepdims`) take PyTorch's `dim` (and `keepdim`) too. Giving
    both names of one argument is a TypeError naming them. `indices`, the name of a function (x, axis,
    keepdims) -> indices in the reduction's module (argmax for max), makes the `dim=` spelling return
    PyTorch's ValuesIndices: `v, i = x.max(dim=1)` means there what it means in PyTorch. A reduction with
    `ddof` (var, std) takes PyTorch's `correction=` and `unbiased=` for it, and spelled with `dim=` divides
    by n - 1 unless told otherwise, as PyTorch's does (NumPy's `axis=` by n). Where the two libraries'
    answers differ (max and min: a pair or the values; var and std: n - 1 or n) the axis must be named:
    `x.max(1)` is a TypeError that says both spellings, never the other library's answer in silence."""

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)
        where = {name: i for i, name in enumerate(signature.parameters)}
        differs = indices is not None or "ddof" in where   # NumPy's and PyTorch's answers differ

        @functools.wraps(fn)
        def reduction(*args: Any, **kwargs: Any) -> Any:
            if differs:   # (max, min, var, std only: sum's and mean's calls take the two checks below)
                _where_libraries_differ(fn.__name__, where, indices is not None, args, kwargs)
            if "dim" not in kwargs and "keepdim" not in kwargs:
                return fn(*args, **kwargs)
            pytorch = "dim" in kwargs
            empty = isinstance(kwargs.get("dim"), (tuple, list)) and len(kwargs["dim"]) == 0
            if empty and "keepdims" in where:
                kwargs["dim"] = None   # PyTorch's empty dim reduces every axis (NumPy's axis=() none)
            if pytorch and "ddof" in where and "ddof" not in kwargs:
                kwargs["ddof"] = 1   # PyTorch's default correction
            for torch_name, name in _TORCH_NAMES:
                if torch_name not in kwargs:
                    continue
                if name not in where:
                    raise TypeError(f"{fn.__name__}() got an unexpected keyword argument {torch_name!r}")
                if name in kwargs or len(args) > where[name]:
                    given = kwargs[name] if name in kwargs else args[where[name]]
                    raise TypeError(
                        f"{fn.__name__}: {name}={given!r} and {torch_name}={kwargs[torch_name]!r} are one "
                        f"argument (NumPy's name and PyTorch's); give one of them"
                    )
                kwargs[name] = kwargs.pop(torch_name)
            out = fn(*args, **kwargs)
            if indices is None or not pytorch:
                return out
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            given = bound.arguments
            found = fn.__globals__[indices](next(iter(given.values())), given["axis"], given["keepdims"])
            return ValuesIndices(out, found)

        # what netcl.autograd.declared looks for: the op it makes of fn takes these names too
        reduction.torch_names = True  # type: ignore[attr-defined]
        reduction.torch_names_indices = indices  # type: ignore[attr-defined]
        return launch_labels.transparent(reduction)  # type: ignore[return-value]

    return decorate if fn is None else decorate(fn)
