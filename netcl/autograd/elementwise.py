"""Elementwise ops on Nodes, each with its backward rule beside it.

Operands may be Nodes, raw Tensors (constants) or Python numbers. Broadcast inputs get their
gradient summed back to their own shape. The backward expressions are elementwise too, so the
JIT fuses each rule into one kernel (e.g. relu's `where(y > 0, g, 0)`).
"""

from __future__ import annotations

import math
from typing import Any

from netcl import ops
from netcl.ops import random
from netcl.autograd.engine import Node, as_node, record
from netcl.core.tensor import Tensor

Operand = Any


def _value(x: Operand) -> Any:
    return x.value if isinstance(x, Node) else x


def _shape(x: Operand) -> tuple[int, ...] | None:
    v = _value(x)
    return v.shape if isinstance(v, Tensor) else None


def sum_to_shape(g: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Sum a broadcast gradient back to `shape` (leading axes and axes where shape has 1)."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1
    )
    if not axes:
        return g.reshape(shape)
    return ops.sum(g, axis=axes, keepdims=False).reshape(shape)


def _parents(*xs: Operand) -> tuple[Node, ...]:
    return tuple(as_node(x) for x in xs if isinstance(x, (Node, Tensor)))


def _binary(name: str, a: Operand, b: Operand, grads) -> Node:
    """Record op `name`(a, b); grads(g, av, bv, out) -> (grad_a, grad_b) before unbroadcasting."""
    av, bv = _value(a), _value(b)
    out = getattr(ops, name)(av, bv)
    a_node = isinstance(a, (Node, Tensor))
    b_node = isinstance(b, (Node, Tensor))
    parents = _parents(a, b)
    a_shape, b_shape = _shape(a), _shape(b)

    def backward(g: Tensor):
        ga, gb = grads(g, av, bv, out)
        result = []
        if a_node:
            result.append(sum_to_shape(ga, a_shape) if ga is not None and parents[0].requires_grad else None)
        if b_node:
            result.append(sum_to_shape(gb, b_shape) if gb is not None and parents[-1].requires_grad else None)
        return tuple(result)

    return record(out, parents, backward, name)


def add(a: Operand, b: Operand) -> Node:
    return _binary("add", a, b, lambda g, x, y, o: (g, g))


def sub(a: Operand, b: Operand) -> Node:
    return _binary("sub", a, b, lambda g, x, y, o: (g, ops.neg(g)))


def mul(a: Operand, b: Operand) -> Node:
    return _binary("mul", a, b, lambda g, x, y, o: (ops.mul(g, y), ops.mul(g, x)))


def div(a: Operand, b: Operand) -> Node:
    return _binary("div", a, b, lambda g, x, y, o: (ops.div(g, y), ops.neg(ops.div(ops.mul(g, o), y))))


def pow(a: Operand, b: Operand) -> Node:  # noqa: A001
    """a ** b; d/da = b a^(b-1), d/db = a^b log a."""

    def grads(g, x, y, o):
        if not isinstance(x, Tensor):
            ga = None
        elif isinstance(y, Tensor):
            ga = ops.mul(g, ops.mul(y, ops.pow(x, ops.sub(y, 1))))
        else:
            ga = ops.mul(g, ops.mul(ops.pow(x, y - 1), y)) if y != 0 else ops.mul(g, 0.0)
        if not isinstance(y, Tensor):
            gb = None
        elif isinstance(x, Tensor):
            gb = ops.mul(g, ops.mul(o, ops.log(x)))
        else:
            gb = ops.mul(g, ops.mul(o, math.log(x)))
        return ga, gb

    return _binary("pow", a, b, grads)


def maximum(a: Operand, b: Operand) -> Node:
    """Ties send half the gradient to each side (as PyTorch)."""

    def grads(g, x, y, o):
        half = ops.mul(g, 0.5)
        ga = ops.where(ops.gt(x, y), g, ops.where(ops.eq(x, y), half, 0.0))
        gb = ops.where(ops.lt(x, y), g, ops.where(ops.eq(x, y), half, 0.0))
        return ga, gb

    return _binary("maximum", a, b, grads)


def minimum(a: Operand, b: Operand) -> Node:

    def grads(g, x, y, o):
        half = ops.mul(g, 0.5)
        ga = ops.where(ops.lt(x, y), g, ops.where(ops.eq(x, y), half, 0.0))
        gb = ops.where(ops.gt(x, y), g, ops.where(ops.eq(x, y), half, 0.0))
        return ga, gb

    return _binary("minimum", a, b, grads)


def _unary(name: str, x: Operand, grad, *args: Any, **kwargs: Any) -> Node:
    """Record a unary op; grad(g, xv, out) -> grad_x."""
    x = as_node(x)
    xv = x.value
    out = getattr(ops, name)(xv, *args, **kwargs)
    return record(out, (x,), lambda g: (grad(g, xv, out),), name)


def neg(x: Operand) -> Node:
    return _unary("neg", x, lambda g, v, o: ops.neg(g))


def exp(x: Operand) -> Node:
    return _unary("exp", x, lambda g, v, o: ops.mul(g, o))


def log(x: Operand) -> Node:
    return _unary("log", x, lambda g, v, o: ops.div(g, v))


def log1p(x: Operand) -> Node:
    return _unary("log1p", x, lambda g, v, o: ops.div(g, ops.add(v, 1.0)))


def expm1(x: Operand) -> Node:
    return _unary("expm1", x, lambda g, v, o: ops.mul(g, ops.add(o, 1.0)))


def sqrt(x: Operand) -> Node:
    return _unary("sqrt", x, lambda g, v, o: ops.div(ops.mul(g, 0.5), o))


def rsqrt(x: Operand) -> Node:
    return _unary("rsqrt", x, lambda g, v, o: ops.mul(g, ops.mul(ops.mul(o, ops.mul(o, o)), -0.5)))


def square(x: Operand) -> Node:
    return _unary("square", x, lambda g, v, o: ops.mul(g, ops.mul(v, 2.0)))


def reciprocal(x: Operand) -> Node:
    return _unary("reciprocal", x, lambda g, v, o: ops.neg(ops.mul(g, ops.mul(o, o))))


def abs(x: Operand) -> Node:  # noqa: A001
    return _unary("abs", x, lambda g, v, o: ops.mul(g, ops.sign(v)))


def sin(x: Operand) -> Node:
    return _unary("sin", x, lambda g, v, o: ops.mul(g, ops.cos(v)))


def cos(x: Operand) -> Node:
    return _unary("cos", x, lambda g, v, o: ops.neg(ops.mul(g, ops.sin(v))))


def tanh(x: Operand) -> Node:
    return _unary("tanh", x, lambda g, v, o: ops.mul(g, ops.sub(1.0, ops.mul(o, o))))


def sigmoid(x: Operand) -> Node:
    return _unary("sigmoid", x, lambda g, v, o: ops.mul(g, ops.mul(o, ops.sub(1.0, o))))


def relu(x: Operand) -> Node:
    return _unary("relu", x, lambda g, v, o: ops.where(ops.gt(o, 0), g, 0.0))


def leaky_relu(x: Operand, negative_slope: float = 0.01) -> Node:
    return _unary(
        "leaky_relu",
        x,
        lambda g, v, o: ops.where(ops.gt(v, 0), g, ops.mul(g, negative_slope)),
        negative_slope,
    )


def silu(x: Operand) -> Node:
    """x sigmoid(x); d/dx = s (1 + x (1 - s))."""

    def grad(g, v, o):
        s = ops.sigmoid(v)
        return ops.mul(g, ops.mul(s, ops.add(1.0, ops.mul(v, ops.sub(1.0, s)))))

    return _unary("silu", x, grad)


def softplus(x: Operand) -> Node:
    return _unary("softplus", x, lambda g, v, o: ops.mul(g, ops.sigmoid(v)))


_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu(x: Operand, approximate: str = "none") -> Node:
    """x Phi(x): d/dx = Phi(x) + x phi(x); the tanh form differentiates its own formula."""

    def grad(g, v, o):
        if approximate == "tanh":
            inner = ops.mul(ops.add(v, ops.mul(ops.mul(ops.mul(v, v), v), 0.044715)), _SQRT_2_OVER_PI)
            t = ops.tanh(inner)
            dinner = ops.mul(ops.add(1.0, ops.mul(ops.mul(v, v), 3 * 0.044715)), _SQRT_2_OVER_PI)
            d = ops.add(
                ops.mul(ops.add(1.0, t), 0.5),
                ops.mul(ops.mul(ops.mul(v, 0.5), ops.sub(1.0, ops.mul(t, t))), dinner),
            )
        else:
            cdf = ops.mul(ops.add(1.0, ops.erf(ops.mul(v, 1.0 / math.sqrt(2.0)))), 0.5)
            pdf = ops.mul(ops.exp(ops.mul(ops.mul(v, v), -0.5)), _INV_SQRT_2PI)
            d = ops.add(cdf, ops.mul(v, pdf))
        return ops.mul(g, d)

    return _unary("gelu", x, grad, approximate=approximate)


def clamp(x: Operand, min: float | None = None, max: float | None = None) -> Node:  # noqa: A002
    """Gradient passes where min <= x <= max."""

    def grad(g, v, o):
        inside = ops.eq(o, v)
        return ops.where(inside, g, 0.0)

    return _unary("clamp", x, grad, min=min, max=max)


def where(cond: Any, a: Operand, b: Operand) -> Node:
    """a where cond else b; cond is never differentiated."""
    c = _value(cond)
    av, bv = _value(a), _value(b)
    out = ops.where(c, av, bv)
    a_node = isinstance(a, (Node, Tensor))
    b_node = isinstance(b, (Node, Tensor))
    parents = _parents(a, b)
    a_shape, b_shape = _shape(a), _shape(b)

    def backward(g: Tensor):
        result = []
        if a_node:
            result.append(sum_to_shape(ops.where(c, g, 0.0), a_shape) if parents[0].requires_grad else None)
        if b_node:
            result.append(sum_to_shape(ops.where(c, 0.0, g), b_shape) if parents[-1].requires_grad else None)
        return tuple(result)

    return record(out, parents, backward, "where")


def cast(x: Operand, dtype: Any) -> Node:
    """Gradient is cast back to the input's dtype (integer inputs get none)."""
    x = as_node(x)
    xv = x.value
    out = ops.cast(xv, dtype)
    if xv.dtype.kind != "f" or out.dtype.kind != "f":
        return Node(out)
    return record(out, (x,), lambda g: (ops.cast(g, xv.dtype),), "cast")


def dropout(
    x: Operand, p: float = 0.5, training: bool = True, seed: int | None = None, generator: Any = None
) -> Node:
    """Zero each element with probability p and scale the rest by 1 / (1 - p) (Philox masks)."""
    x = as_node(x)
    if not training or p == 0.0:
        return x
    if not 0.0 <= p < 1.0:
        if p == 1.0:
            return mul(x, 0.0)
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")

    xv = x.value
    u = random.rand(xv.queue, xv.shape, xv.dtype, seed=seed, generator=generator)
    scale = 1.0 / (1.0 - p)
    keep = ops.ge(u, p)
    out = ops.where(keep, ops.mul(xv, scale), 0.0)
    return record(out, (x,), lambda g: (ops.where(keep, ops.mul(g, scale), 0.0),), "dropout")


# comparisons give boolean Nodes that carry no gradient
def _compare(name: str):
    def fn(a: Operand, b: Operand) -> Node:
        return Node(getattr(ops, name)(_value(a), _value(b)))

    fn.__name__ = name
    return fn


eq, ne, lt, le, gt, ge = (_compare(n) for n in ("eq", "ne", "lt", "le", "gt", "ge"))
