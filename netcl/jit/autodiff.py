"""netcl's one table of elementwise derivatives, and symbolic reverse-mode differentiation over it.

`rules(op, args, out, g)` is the only place an elementwise op's derivative is written. Given IR
expressions for the op's operands (`args`), for its value (`out`: a saved output, or the op's node
itself) and for the gradient arriving at it (`g`), it returns one gradient expression per operand
(None where no gradient flows). Its two users:

- `vjp(outputs, grads)` differentiates a whole elementwise graph; `@netcl.jit.fuse` runs the result
  as one kernel.
- netcl.autograd's elementwise ops trace the netcl.ops function into IR and call `vjp` with their
  saved output standing for the op's value, so rules that use the output (exp: g * out) read it
  instead of recomputing the forward.

Semantics are PyTorch's, also at the edges: comparisons, floor/ceil/round/trunc/sign and integer
casts pass no gradient; d/da a**b is 0 where b == 0 and d/db a**b is 0 where a == 0 and b >= 0;
relu passes nothing where its output is <= 0 (NaN passes), abs nothing at 0 or NaN; maximum and
minimum of two tensors send half the gradient to each side of a tie and all of it to both at NaN;
against a scalar (a `param` or `const`: clamp's bounds, or maximum(x, 0.5), which netcl.ops makes
the same IR) the full gradient passes where the bound holds (x >= min, x <= max; none at NaN), as
torch.clamp; atan2 passes 0 at (0, 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from netcl.core import launch_labels
from netcl.jit import ir
from netcl.jit.ir import Node

# rule(args, out, g) -> one gradient expression (or None) per operand
Rule = Callable[[Sequence[Node], Node, Node], list[Node | None]]

RULES: dict[str, Rule] = {}
NO_GRADIENT = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
                         "logical_not", "isnan", "isinf", "isfinite", "floor", "ceil", "round", "trunc",
                         "sign", "floor_divide", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not",
                         "left_shift", "right_shift"})


def rules(op: str, args: Sequence[Node], out: Node, g: Node) -> list[Node | None]:
    """Gradient expressions for each operand of elementwise op `op` (None: no gradient).

    `args`: the op's operands as IR (already cast to the op's dtype, as netcl.jit.ir's builders make
    them); `out`: an expression for the op's value (its dtype is the op's dtype); `g`: the gradient
    of the op's value. Raises NotImplementedError for an op without a rule."""
    rule = RULES.get(op)
    if rule is None:
        raise NotImplementedError(
            f"no derivative rule for elementwise op {op!r}; add one to netcl.jit.autodiff.RULES")
    return rule(args, out, g)


def _rule(*ops: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for op in ops:
            RULES[op] = fn
        return fn

    return register


# -- expression helpers (the result dtype is the floating operand's) ------------------------------
def _c(v: float, like: Node) -> Node:
    return ir.const(v, like.dtype)


def _b(op: str, a: Node, b: Node) -> Node:
    return ir.binary(op, a, b, a.dtype if ir.is_float(a.dtype) else b.dtype)


def _mul(a: Node, b: Node) -> Node:
    return _b("mul", a, b)


def _add(a: Node, b: Node) -> Node:
    return _b("add", a, b)


def _sub(a: Node, b: Node) -> Node:
    return _b("sub", a, b)


def _div(a: Node, b: Node) -> Node:
    return _b("div", a, b)


def _neg(a: Node) -> Node:
    return ir.unary("neg", a)


def _where(cond: Node, a: Node, b: Node) -> Node:
    return ir.where(cond, a, b)


def _fixed(x: Node) -> bool:
    """A scalar of the kernel (a Python number in the op), not a tensor: it gets no gradient."""
    return x.op in ("param", "const")


# -- arithmetic -----------------------------------------------------------------------------------
@_rule("add")
def _d_add(args, out, g):
    return [g, g]


@_rule("sub")
def _d_sub(args, out, g):
    return [g, _neg(g)]


@_rule("mul")
def _d_mul(args, out, g):
    a, b = args
    return [_mul(g, b), _mul(g, a)]


@_rule("div")
def _d_div(args, out, g):
    b = args[1]
    return [_div(g, b), _neg(_div(_mul(g, out), b))]


@_rule("neg")
def _d_neg(args, out, g):
    return [_neg(g)]


@_rule("abs")
def _d_abs(args, out, g):
    (x,) = args
    zero = _c(0.0, g)
    return [_where(_b("gt", x, zero), g, _where(_b("lt", x, zero), _neg(g), zero))]


@_rule("pow")
def _d_pow(args, out, g):
    """b a^(b-1), 0 where b == 0; a^b log a, 0 where a == 0 and b >= 0 (PyTorch's pow_backward)."""
    a, b = args
    zero, one = _c(0.0, g), _c(1.0, g)
    ga = _where(_b("eq", b, zero), zero, _mul(g, _mul(b, _b("pow", a, _sub(b, one)))))
    if _fixed(b):
        return [ga, None]
    base_zero = ir.binary("logical_and", _b("eq", a, zero), _b("ge", b, zero))
    gb = _where(base_zero, zero, _mul(g, _mul(out, ir.unary("log", a))))
    return [ga, gb]


def _extremum(lose: str, holds: str) -> Rule:
    """maximum (lose="lt", holds="ge") or minimum (lose="gt", holds="le")."""

    def rule(args, out, g):
        a, b = args
        zero = _c(0.0, g)
        if _fixed(a) and _fixed(b):
            return [None, None]
        if _fixed(b):  # clamp(x, min=b) / clamp(x, max=b): the full gradient where the bound holds
            return [_where(_b(holds, a, b), g, zero), None]
        if _fixed(a):
            return [None, _where(_b(holds, b, a), g, zero)]
        split = _where(_b("eq", a, b), _mul(g, _c(0.5, g)), g)
        return [_where(_b(lose, a, b), zero, split), _where(_b(lose, b, a), zero, split)]

    return rule


RULES["maximum"] = _extremum("lt", "ge")
RULES["minimum"] = _extremum("gt", "le")


# -- float math (rules that use `out` read the saved output instead of recomputing) ---------------
@_rule("exp")
def _d_exp(args, out, g):
    return [_mul(g, out)]


@_rule("log")
def _d_log(args, out, g):
    return [_div(g, args[0])]


@_rule("log1p")
def _d_log1p(args, out, g):
    return [_div(g, _add(args[0], _c(1.0, g)))]


@_rule("expm1")
def _d_expm1(args, out, g):
    return [_mul(g, _add(out, _c(1.0, g)))]


@_rule("sqrt")
def _d_sqrt(args, out, g):
    return [_div(_mul(g, _c(0.5, g)), out)]


@_rule("rsqrt")
def _d_rsqrt(args, out, g):
    return [_mul(g, _mul(_c(-0.5, g), _mul(out, _mul(out, out))))]


@_rule("square")
def _d_square(args, out, g):
    return [_mul(g, _mul(_c(2.0, g), args[0]))]


@_rule("reciprocal")
def _d_reciprocal(args, out, g):
    return [_neg(_mul(g, _mul(out, out)))]


@_rule("sin")
def _d_sin(args, out, g):
    return [_mul(g, ir.unary("cos", args[0]))]


@_rule("cos")
def _d_cos(args, out, g):
    return [_neg(_mul(g, ir.unary("sin", args[0])))]


@_rule("tan")
def _d_tan(args, out, g):
    return [_mul(g, _add(_c(1.0, g), _mul(out, out)))]


@_rule("tanh")
def _d_tanh(args, out, g):
    return [_mul(g, _sub(_c(1.0, g), _mul(out, out)))]


@_rule("erf")
def _d_erf(args, out, g):
    (x,) = args
    return [_mul(g, _mul(_c(2 / math.sqrt(math.pi), g), ir.unary("exp", _neg(_mul(x, x)))))]


@_rule("atan2")
def _d_atan2(args, out, g):
    a, b = args
    zero = _c(0.0, g)
    den = _add(_mul(a, a), _mul(b, b))
    origin = _b("eq", den, zero)
    return [_where(origin, zero, _div(_mul(g, b), den)), _where(origin, zero, _neg(_div(_mul(g, a), den)))]


@_rule("remainder")
def _d_remainder(args, out, g):
    a, b = args
    return [g, _neg(_mul(g, ir.unary("floor", _div(a, b))))]


# -- activations ----------------------------------------------------------------------------------
@_rule("sigmoid")
def _d_sigmoid(args, out, g):
    return [_mul(g, _mul(out, _sub(_c(1.0, g), out)))]


@_rule("silu")
def _d_silu(args, out, g):
    """x sigmoid(x): s (1 + x (1 - s))."""
    (x,) = args
    s = ir.unary("sigmoid", x)
    one = _c(1.0, g)
    return [_mul(g, _mul(s, _add(one, _mul(x, _sub(one, s)))))]


@_rule("softplus")
def _d_softplus(args, out, g):
    return [_mul(g, ir.unary("sigmoid", args[0]))]


@_rule("relu")
def _d_relu(args, out, g):
    zero = _c(0.0, g)
    return [_where(_b("le", out, zero), zero, g)]


@_rule("leaky_relu")
def _d_leaky_relu(args, out, g):
    x, slope = args
    return [_where(_b("gt", x, _c(0.0, g)), g, _mul(g, slope)), None]


@_rule("gelu")
def _d_gelu(args, out, g):
    """x Phi(x): Phi(x) + x phi(x)."""
    (x,) = args
    cdf = _mul(_c(0.5, g), _add(_c(1.0, g), ir.unary("erf", _mul(x, _c(1 / math.sqrt(2), g)))))
    pdf = _mul(_c(1 / math.sqrt(2 * math.pi), g), ir.unary("exp", _mul(_c(-0.5, g), _mul(x, x))))
    return [_mul(g, _add(cdf, _mul(x, pdf)))]


@_rule("gelu_tanh")
def _d_gelu_tanh(args, out, g):
    """0.5 x (1 + tanh(k (x + c x^3))), differentiated as written."""
    (x,) = args
    k, c = math.sqrt(2 / math.pi), 0.044715
    one, half = _c(1.0, g), _c(0.5, g)
    t = ir.unary("tanh", _mul(_c(k, g), _add(x, _mul(_c(c, g), _mul(x, _mul(x, x))))))
    left = _mul(half, _add(one, t))
    dinner = _mul(_c(k, g), _add(one, _mul(_c(3 * c, g), _mul(x, x))))
    right = _mul(_mul(half, x), _mul(_sub(one, _mul(t, t)), dinner))
    return [_mul(g, _add(left, right))]


# -- selection and conversion ---------------------------------------------------------------------
@_rule("where")
def _d_where(args, out, g):
    cond = args[0]
    zero = _c(0.0, g)
    return [None, _where(cond, g, zero), _where(cond, zero, g)]


@_rule("cast")
def _d_cast(args, out, g):
    (x,) = args
    return [ir.cast(g, x.dtype)] if ir.is_float(x.dtype) else [None]


def _d_none(args, out, g):
    return [None] * len(args)


for _op in NO_GRADIENT:
    RULES[_op] = _d_none


def vjp(outputs: list[Node], grads: list[Node], values: dict[int, Node] | None = None) -> dict[object, Node]:
    """{input slot: adjoint expression} for every floating `input` node reachable from outputs.

    `values` maps id(node) of nodes whose value is already computed (autograd's saved output) to an
    expression standing for it: rules that use their op's value read that instead of the node."""
    order = ir.walk(outputs)
    adj: dict[int, Node] = {}
    for o, g in zip(outputs, grads):
        if not ir.is_float(o.dtype):
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
        if not node.args or not ir.is_float(node.dtype) and node.op != "cast":
            continue
        out = values.get(id(node), node) if values else node
        for arg, contrib in zip(node.args, rules(node.op, node.args, out, g)):
            if contrib is None or not ir.is_float(arg.dtype) or arg.op in ("param", "const", "index"):
                continue
            contrib = ir.cast(contrib, arg.dtype)
            adj[id(arg)] = _b("add", adj[id(arg)], contrib) if id(arg) in adj else contrib
    return result

launch_labels.names_ops(__name__)  # netcl.profiling: a fused function's derivative is an op of its own
