"""Tensor's Python operators (+, -, *, /, //, %, **, @, comparisons, &, |, ^, ~, <<, >>, in-place forms, item
assignment) and its math methods (sum, mean, exp, softmax, ...): netcl.ops functions, installed on Tensor
here, the way netcl.autograd.operators installs Node's. Core's Tensor knows nothing of ops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from netcl.core import dtypes, launch_labels
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError
from netcl.ops import declaration
from netcl.ops import elementwise as ew
from netcl.ops import movement as mv
from netcl.ops import reduce as rd
from netcl.ops import sorting as srt
from netcl.ops.gemm import matmul

# dunder -> op, for `x <op> y` and (reflected) `y <op> x`
_BINARY = {"__add__": ew.add, "__sub__": ew.sub, "__mul__": ew.mul, "__truediv__": ew.div,
           "__floordiv__": ew.floor_divide, "__mod__": ew.remainder, "__pow__": ew.pow, "__matmul__": matmul,
           "__and__": ew.bitwise_and, "__or__": ew.bitwise_or, "__xor__": ew.bitwise_xor,
           "__lshift__": ew.left_shift, "__rshift__": ew.right_shift,
           "__lt__": ew.lt, "__le__": ew.le, "__gt__": ew.gt, "__ge__": ew.ge}
_REFLECTED = {"__radd__": ew.add, "__rsub__": ew.sub, "__rmul__": ew.mul, "__rtruediv__": ew.div,
              "__rfloordiv__": ew.floor_divide, "__rmod__": ew.remainder, "__rpow__": ew.pow,
              "__rmatmul__": matmul, "__rand__": ew.bitwise_and, "__ror__": ew.bitwise_or,
              "__rxor__": ew.bitwise_xor, "__rlshift__": ew.left_shift, "__rrshift__": ew.right_shift}
_UNARY = {"__neg__": ew.neg, "__abs__": ew.abs, "__invert__": ew.bitwise_not}
_INPLACE = {"__iadd__": ew.add, "__isub__": ew.sub, "__imul__": ew.mul, "__itruediv__": ew.div,
            "__ifloordiv__": ew.floor_divide, "__imod__": ew.remainder, "__ipow__": ew.pow,
            "__iand__": ew.bitwise_and, "__ior__": ew.bitwise_or, "__ixor__": ew.bitwise_xor,
            "__ilshift__": ew.left_shift, "__irshift__": ew.right_shift}  # (`@=`: none, as in PyTorch)
# The methods of declared ops (netcl.ops.declaration: softmax, log_softmax, matmul, ...) are both Tensor's
# (the forward) and Node's (the differentiable op), installed as each is declared (declared_methods()).
# The math methods of both Tensor and Node, declared once: each name is a function of netcl.ops.elementwise
# (or .reduce) taking the tensor first (x.exp(), x.sum(axis=1), x.clamp(0, 1)), and a differentiable op of
# the same name in netcl.autograd.elementwise (or .reduce), which netcl.autograd.operators installs on Node
# from these same lists: the two surfaces cannot disagree (tests/ops/test_operators.py).
ELEMENTWISE_METHODS = (
    "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "square", "reciprocal", "sin", "cos", "tan", "tanh",
    "erf", "sigmoid", "relu", "silu", "softplus", "gelu", "leaky_relu", "neg", "abs", "sign", "floor", "ceil",
    "round", "trunc", "clamp", "pow", "cast",
)
REDUCE_METHODS = ("std",)  # sum, mean, max, min, var, logsumexp: declared (netcl.ops.reduce)
METHOD_ALIASES = {"astype": "cast", "clip": "clamp"}  # NumPy's (and PyTorch's) names beside netcl's
# PyTorch's dtype shortcuts (`mask.float()`, `y.long()`): the cast to that dtype, on Tensor and Node alike
DTYPE_METHODS = {"float": "float32", "double": "float64", "half": "float16", "bfloat16": "bfloat16",
                 "long": "int64", "int": "int32", "bool": "bool"}
# Tensor's alone: results no gradient flows through (indices, truth values) or reductions autograd has no
# rule for yet
TENSOR_ONLY_METHODS = ("prod", "argmax", "argmin", "any", "all", "cumsum", "argsort")
_METHODS = {
    **{name: getattr(ew, name) for name in ELEMENTWISE_METHODS},
    **{name: getattr(srt if name == "argsort" else rd, name)
       for name in REDUCE_METHODS + TENSOR_ONLY_METHODS},
}
_METHODS.update({alias: _METHODS[name] for alias, name in METHOD_ALIASES.items()})


def dtype_method(cast: Callable[[Any, str], Any], name: str) -> Callable[[Any], Any]:
    """PyTorch's `x.<name>()` for a name of DTYPE_METHODS: `cast(x, its dtype)` (Tensor's or Node's cast)."""
    dt = DTYPE_METHODS[name]

    def method(self: Any) -> Any:
        return cast(self, dt)

    method.__name__ = name
    method.__doc__ = f"PyTorch's `x.{name}()`: x cast to {dt}."
    return launch_labels.transparent(method)
_SCALARS = (Tensor, bool, int, float, np.number, np.bool_)
# host data: `A == a` is ops.eq's error, as `A + a` is (not Python's identity fallback, one bool)
_COMPARED = _SCALARS + (np.ndarray, list, tuple)


def _method(fn: Callable[..., Any]) -> Callable[..., Any]:
    def method(self: Tensor, *args: Any, **kwargs: Any) -> Any:
        return fn(self, *args, **kwargs)

    method.__name__ = fn.__name__
    method.__doc__ = fn.__doc__
    return launch_labels.transparent(method)  # the profiler names `fn`, not this wrapper


def _reflected(fn: Callable[..., Any]) -> Callable[..., Any]:
    return launch_labels.transparent(lambda self, other: fn(other, self))


def _kind(dt: np.dtype) -> int:
    return 0 if dt == dtypes.bool_ else (2 if dt in dtypes.FLOATING else 1)


def _inplace(fn: Callable[..., Any]) -> Callable[..., Any]:
    def op(self: Tensor, other: Any) -> Tensor:
        """self[...] = op(self, other), written into this tensor's memory (one launch). A result of a higher
        kind than the tensor's dtype (float into an integer or bool tensor, integer into bool) is refused, as
        PyTorch refuses it, instead of truncated; float32 into float16 or bfloat16 is kept (same kind)."""
        result = fn(self, other)
        if _kind(result.dtype) > _kind(self.dtype):
            raise DTypeError(
                f"in-place {fn.__name__}: result type {result.dtype} can't be cast to the tensor's dtype "
                f"{self.dtype} (PyTorch refuses it too: \"result type Float can't be cast to the desired "
                f"output type Int\"); write x = x <op> y for a new {result.dtype} tensor, or cast first")
        mv.setitem(self, Ellipsis, result, consume=True)
        return self

    return launch_labels.transparent(op)


def _eq(self: Tensor, other: Any) -> Any:
    return ew.eq(self, other) if isinstance(other, _COMPARED) else NotImplemented


def _ne(self: Tensor, other: Any) -> Any:
    return ew.ne(self, other) if isinstance(other, _COMPARED) else NotImplemented


def declared_methods() -> tuple[str, ...]:
    """The Tensor and Node method names of the declared ops."""
    return tuple(m for decl in declaration.declared() for m in decl.methods)


_installed: set[str] = set()  # the method names installed here (a view op's forward is Tensor's own method)


def _install_declared(decl: declaration.OpDecl) -> None:
    for name in decl.methods:
        if getattr(Tensor, name, None) is not decl.forward:
            setattr(Tensor, name, _method(decl.forward))
            _installed.add(name)


def _remove_declared(decl: declaration.OpDecl) -> None:
    for name in decl.methods:
        if name in _installed:
            _installed.discard(name)
            delattr(Tensor, name)


def install() -> None:
    for name, fn in _BINARY.items():
        setattr(Tensor, name, _method(fn))
    for name, fn in _REFLECTED.items():
        setattr(Tensor, name, _reflected(fn))
    for name, fn in _UNARY.items():
        setattr(Tensor, name, _method(fn))
    for name, fn in _INPLACE.items():
        setattr(Tensor, name, _inplace(fn))
    for name, fn in _METHODS.items():
        setattr(Tensor, name, _method(fn))
    for name in DTYPE_METHODS:
        setattr(Tensor, name, dtype_method(ew.cast, name))
    declaration.subscribe(_install_declared, _remove_declared)
    Tensor.__eq__ = _eq  # type: ignore[method-assign]
    Tensor.__ne__ = _ne  # type: ignore[method-assign]
    Tensor.__pos__ = lambda self: self
    Tensor.__setitem__ = launch_labels.transparent(lambda self, index, value: mv.setitem(self, index, value))
    Tensor.__getitem__ = launch_labels.transparent(mv.getitem)
