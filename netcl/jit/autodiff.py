"""Symbolic reverse-mode differentiation of elementwise expressions (one rule per op).

`vjp(outputs, grads)` returns, for every `input` node reachable from `outputs`, an expression for
sum_j grad_j * d output_j / d input: the whole backward is again one elementwise graph, so it runs
as one kernel. Gradients flow only through floating-point values; comparisons, floor/ceil/round,
sign and integer casts pass none (as in PyTorch).
"""

from __future__ import annotations

import math

from netcl.jit import ir
from netcl.jit.ir import Node

_NO_GRAD = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "logical_not",
            "isnan", "isinf", "isfinite", "floor", "ceil", "round", "trunc", "sign", "floor_divide"}


def _c(v: float, dt) -> Node:
    return ir.const(v, dt)


def _b(op: str, a: Node, b: Node) -> Node:
    return ir.binary(op, a, b, a.dtype if a.dtype.kind == "f" else b.dtype)


def _u(op: str, a: Node) -> Node:
    return ir.unary(op, a)


def _rules(node: Node, g: Node) -> list[Node | None]:
    """Adjoint contributions for each operand of `node` given its adjoint `g` (None: no gradient)."""
    op, a = node.op, node.args
    dt = node.dtype
    x = a[0] if a else None
    mul, add, sub, div = (lambda p, q: _b("mul", p, q)), (lambda p, q: _b("add", p, q)), \
        (lambda p, q: _b("sub", p, q)), (lambda p, q: _b("div", p, q))
    one = _c(1.0, dt)
    if op == "add":
        return [g, g]
    if op == "sub":
        return [g, _u("neg", g)]
    if op == "mul":
        return [mul(g, a[1]), mul(g, a[0])]
    if op == "div":
        return [div(g, a[1]), _u("neg", div(mul(g, node), a[1]))]
    if op == "neg":
        return [_u("neg", g)]
    if op == "abs":
        return [mul(g, _u("sign", x))]
    if op == "pow":
        ga = mul(g, mul(a[1], _b("pow", a[0], sub(a[1], one))))
        gb = None if a[1].op in ("param", "const") else mul(g, mul(node, _u("log", a[0])))
        return [ga, gb]
    if op == "exp":
        return [mul(g, node)]
    if op == "log":
        return [div(g, x)]
    if op == "log1p":
        return [div(g, add(x, one))]
    if op == "expm1":
        return [mul(g, add(node, one))]
    if op == "sqrt":
        return [div(mul(g, _c(0.5, dt)), node)]
    if op == "rsqrt":
        return [mul(g, mul(_c(-0.5, dt), mul(node, mul(node, node))))]
    if op == "sin":
        return [mul(g, _u("cos", x))]
    if op == "cos":
        return [_u("neg", mul(g, _u("sin", x)))]
    if op == "tan":
        return [mul(g, add(one, mul(node, node)))]
    if op == "tanh":
        return [mul(g, sub(one, mul(node, node)))]
    if op == "erf":
        return [mul(g, mul(_c(2 / math.sqrt(math.pi), dt), _u("exp", _u("neg", mul(x, x)))))]
    if op == "sigmoid":
        return [mul(g, mul(node, sub(one, node)))]
    if op == "silu":
        s = _u("sigmoid", x)
        return [mul(g, mul(s, add(one, mul(x, sub(one, s)))))]
    if op == "softplus":
        return [mul(g, _u("sigmoid", x))]
    if op == "relu":
        return [ir.where(_b("gt", x, _c(0.0, dt)), g, _c(0.0, dt))]
    if op == "leaky_relu":
        return [ir.where(_b("gt", x, _c(0.0, dt)), g, mul(g, a[1])), None]
    if op == "gelu":
        cdf = mul(_c(0.5, dt), add(one, _u("erf", mul(x, _c(1 / math.sqrt(2), dt)))))
        pdf = mul(_c(1 / math.sqrt(2 * math.pi), dt), _u("exp", mul(_c(-0.5, dt), mul(x, x))))
        return [mul(g, add(cdf, mul(x, pdf)))]
    if op == "gelu_tanh":
        k, c = math.sqrt(2 / math.pi), 0.044715
        t = _u("tanh", mul(_c(k, dt), add(x, mul(_c(c, dt), mul(x, mul(x, x))))))
        left = mul(_c(0.5, dt), add(one, t))
        right = mul(mul(_c(0.5, dt), x), mul(sub(one, mul(t, t)),
                                              mul(_c(k, dt), add(one, mul(_c(3 * c, dt), mul(x, x))))))
        return [mul(g, add(left, right))]
    if op == "square":
        return [mul(g, mul(_c(2.0, dt), x))]
    if op == "reciprocal":
        return [_u("neg", mul(g, mul(node, node)))]
    if op in ("maximum", "minimum"):
        cmp = "gt" if op == "maximum" else "lt"
        zero = _c(0.0, dt)
        if a[1].op in ("param", "const"):  # clamp: the gradient passes where the bound is not exceeded
            keep = _u("logical_not", _b(cmp, a[1], a[0]))
            return [ir.where(keep, g, zero), None]
        half = mul(g, _c(0.5, dt))
        ga = ir.where(_b(cmp, a[0], a[1]), g, ir.where(_b("eq", a[0], a[1]), half, zero))
        gb = ir.where(_b(cmp, a[1], a[0]), g, ir.where(_b("eq", a[0], a[1]), half, zero))
        return [ga, gb]
    if op == "where":
        zero = _c(0.0, dt)
        return [None, ir.where(a[0], g, zero), ir.where(a[0], zero, g)]
    if op == "cast":
        return [ir.cast(g, x.dtype)] if x.dtype.kind == "f" else [None]
    if op == "atan2":
        den = add(mul(a[0], a[0]), mul(a[1], a[1]))
        return [div(mul(g, a[1]), den), _u("neg", div(mul(g, a[0]), den))]
    if op == "remainder":
        return [g, _u("neg", mul(g, _u("floor", div(a[0], a[1]))))]
    if op in _NO_GRAD:
        return [None] * len(a)
    raise NotImplementedError(f"no derivative rule for elementwise op {op!r}")


def vjp(outputs: list[Node], grads: list[Node]) -> dict[object, Node]:
    """{input slot: adjoint expression} for every floating `input` node reachable from outputs."""
    order = ir.walk(outputs)
    adj: dict[int, Node] = {}
    for o, g in zip(outputs, grads):
        if o.dtype.kind != "f":
            continue
        g = ir.cast(g, o.dtype)
        adj[id(o)] = _b("add", adj[id(o)], g) if id(o) in adj else g
    result: dict[object, Node] = {}
    for node in reversed(order):
        g = adj.get(id(node))
        if g is None:
            continue
        if node.op == "input":
            result[node.attr] = _b("add", result[node.attr], g) if node.attr in result else g
            continue
        if not node.args or node.dtype.kind != "f" and node.op != "cast":
            continue
        for arg, contrib in zip(node.args, _rules(node, g)):
            if contrib is None or arg.dtype.kind != "f" or arg.op in ("param", "const", "index"):
                continue
            contrib = ir.cast(contrib, arg.dtype)
            adj[id(arg)] = _b("add", adj[id(arg)], contrib) if id(arg) in adj else contrib
    return result
