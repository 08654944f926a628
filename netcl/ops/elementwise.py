"""Elementwise ops: arithmetic, math functions, activations, comparisons, where, cast.

Every op here builds a netcl.jit expression; with fusion on (the default) the result is a pending
Tensor that later ops extend, and one kernel computes the whole chain (see netcl.jit.lazy).

Broadcasting: NumPy's rules (shapes aligned on the right; a size-1 axis stretches). Inputs are
read in place through their strides (views, transposes, expanded tensors need no copy).

Type promotion:
- two tensors: NumPy's result_type within a category (bool < integer < floating), e.g.
  uint8 + int32 -> int32, float16 + float32 -> float32; across categories the higher category's
  dtype wins unchanged (int32 + float16 -> float16, int64 + float32 -> float32), as in PyTorch.
- Python scalars are "weak" (NumPy 2 / PyTorch): they take the tensor's dtype unless they are of a
  higher category: float32 * 2.0 -> float32, int32 + 1 -> int32, int32 * 0.5 -> float32,
  bool + 1 -> int32 (netcl's default integer), float16 + 1.5 -> float16.
- true division of integers or bools gives float32 (PyTorch's choice; NumPy gives float64).
- float math (exp, log, sqrt, sigmoid, gelu...) on integer/bool input gives float32.
- comparisons and logical ops give bool; `where(cond, a, b)` promotes a and b.
- bitwise ops (bitwise_and/or/xor/not, left_shift, right_shift; Tensor's &, |, ^, ~, <<, >>) take
  integer or bool operands and promote as arithmetic does; on bool they are the logical ops, as in
  NumPy and PyTorch (floats: DTypeError). A shift past the width gives 0 (-1 for a negative value
  shifted right), NumPy's result.
- float16 (stored as half) and bfloat16 (stored as the high 16 bits of a float32) are computed in
  float32; each float16 or bfloat16 result is rounded to its dtype (to nearest even), also
  inside fused kernels, so fused and unfused results are identical. float64 needs a device with fp64.
- sub and neg are not defined for bool (DTypeError), as in NumPy.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from netcl.core import dtypes
from netcl.core.tensor import Tensor, check_same_queue
from netcl.errors import DTypeError, ShapeError
from netcl.jit import ir, lazy

Operand = Any  # a Tensor or a Python/NumPy scalar

__all__ = [
    "abs",
    "add",
    "atan2",
    "bitwise_and",
    "bitwise_not",
    "bitwise_or",
    "bitwise_xor",
    "broadcast_shapes",
    "cast",
    "ceil",
    "clamp",
    "cos",
    "div",
    "eq",
    "erf",
    "exp",
    "expm1",
    "floor",
    "floor_divide",
    "ge",
    "gelu",
    "gt",
    "isfinite",
    "isinf",
    "isnan",
    "le",
    "leaky_relu",
    "left_shift",
    "log",
    "log1p",
    "logical_and",
    "logical_not",
    "logical_or",
    "logical_xor",
    "lt",
    "masked_fill",
    "maximum",
    "minimum",
    "mul",
    "ne",
    "neg",
    "pow",
    "reciprocal",
    "relu",
    "remainder",
    "right_shift",
    "round",
    "rsqrt",
    "sigmoid",
    "sign",
    "silu",
    "sin",
    "softplus",
    "sqrt",
    "square",
    "sub",
    "tan",
    "tanh",
    "true_divide",
    "trunc",
    "where",
]


def broadcast_shapes(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy broadcasting of `shapes`, or ShapeError naming the op and the shapes."""
    first = shapes[0] if shapes else ()
    if all(s == first for s in shapes):
        return tuple(first)
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for d in range(nd):
        size = 1
        for s in shapes:
            k = d - (nd - len(s))
            if k < 0 or s[k] == 1:
                continue
            if size != 1 and s[k] != size:
                raise ShapeError(
                    f"{op}: shapes {' and '.join(str(tuple(x)) for x in shapes)} cannot be broadcast "
                    f"together (axis {d - nd} has sizes {size} and {s[k]})"
                )
            size = s[k]
        out.append(size)
    return tuple(out)


_SCALARS = (bool, int, float, np.bool_, np.integer, np.floating)  # what an operand may be besides a Tensor


def _is_scalar(x: Any) -> bool:
    return isinstance(x, _SCALARS)


def _check_operand(op: str, x: Any) -> None:
    if not isinstance(x, Tensor) and not isinstance(x, _SCALARS):
        if isinstance(x, np.ndarray):
            raise DTypeError(f"{op}: got a NumPy array; move it to the device first with Tensor.from_host")
        raise DTypeError(f"{op}: operands must be Tensors or Python numbers, got {type(x).__name__}")


def from_ir(op: str, build: Any, *operands: Operand, dtype: np.dtype | None = None) -> Tensor:
    """The elementwise op `build(*nodes)` (an IR builder) on tensors/scalars, with broadcasting (how
    every op of this module and movement's triangular masks are made).

    Scalars become runtime params of dtype `dtype` or, if None, of the weak-promoted dtype."""
    tensors = []
    for x in operands:
        if isinstance(x, Tensor):
            tensors.append(x)
        else:
            _check_operand(op, x)
    if not tensors:
        raise DTypeError(f"{op}: at least one operand must be a Tensor")
    if len(tensors) == 1:
        queue, shape = tensors[0].queue, tensors[0].shape
    else:
        queue = check_same_queue(*tensors)
        shape = tensors[0].shape
        for t in tensors:
            if t.shape != shape:
                shape = broadcast_shapes(op, *[t.shape for t in tensors])
                break
    if dtype is None:
        dt = tensors[0].dtype
        for t in tensors[1:]:
            dt = ir.promote(dt, t.dtype)
        if len(tensors) != len(operands):
            for x in operands:
                if not isinstance(x, Tensor):
                    dt = ir.promote_weak(dt, x)
    else:
        dt = np.dtype(dtype)
    inlined: list[weakref.ref] = []
    nodes = []  # (a loop, not a comprehension: one call less per op)
    for x in operands:
        nodes.append(lazy.operand(x, inlined) if isinstance(x, Tensor) else ir.param(x, dt))
    expr = build(*nodes, dt)
    if expr.dtype == ir.F64:
        dtypes.check_supported_on(expr.dtype, queue.device)
    return lazy.make_result(expr, shape, queue, inlined)


def _binary(op: str) -> Any:
    def fn(a: Operand, b: Operand) -> Tensor:
        return from_ir(op, lambda x, y, dt: ir.binary(op, x, y, dt), a, b)

    fn.__name__ = op
    fn.__doc__ = f"Elementwise {op}(a, b) with broadcasting and netcl's promotion rules."
    return fn


def _unary(op: str) -> Any:
    def fn(x: Tensor) -> Tensor:
        return from_ir(op, lambda n, dt: ir.unary(op, n), x)

    fn.__name__ = op
    fn.__doc__ = f"Elementwise {op}(x)."
    return fn


add = _binary("add")
sub = _binary("sub")
mul = _binary("mul")
div = _binary("div")
true_divide = div
floor_divide = _binary("floor_divide")
remainder = _binary("remainder")
_pow = _binary("pow")


def pow(a: Operand, b: Operand) -> Tensor:  # noqa: A001
    """Elementwise a ** b with broadcasting. An integer base with a negative integer exponent is refused as
    NumPy refuses it (ValueError): a scalar exponent at once, a tensor exponent by reading its minimum back
    first (one small reduction and a host read, on integer powers only; PyTorch instead returns 1 ** -n = 1,
    (-1) ** -n = +-1 and 0 for the rest, silently)."""
    integer_base = (a.dtype.kind in "iub" if isinstance(a, Tensor)
                    else isinstance(a, (int, np.integer, np.bool_)))  # a Python bool is an int
    if integer_base and isinstance(b, (int, np.integer)) and not isinstance(b, (bool, np.bool_)) and b < 0:
        raise ValueError(f"pow: integers to negative integer powers are not allowed ({_dtype_of(a)} ** {b}), "
                         "as in NumPy; cast the base to a float dtype first")
    if integer_base and isinstance(b, Tensor) and b.dtype.kind == "i" and b.size:
        lowest = int(b.min().to_host())
        if lowest < 0:
            raise ValueError(
                f"pow: integers to negative integer powers are not allowed ({_dtype_of(a)} ** an exponent "
                f"tensor of {b.dtype} holding {lowest}), as in NumPy; cast the base to a float dtype first"
            )
    return _pow(a, b)


def _dtype_of(x: Operand) -> str:
    return str(x.dtype) if isinstance(x, Tensor) else type(x).__name__


maximum = _binary("maximum")
minimum = _binary("minimum")
atan2 = _binary("atan2")
eq = _binary("eq")
ne = _binary("ne")
lt = _binary("lt")
le = _binary("le")
gt = _binary("gt")
ge = _binary("ge")
logical_and = _binary("logical_and")
logical_or = _binary("logical_or")
logical_xor = _binary("logical_xor")
bitwise_and = _binary("bitwise_and")
bitwise_or = _binary("bitwise_or")
bitwise_xor = _binary("bitwise_xor")
left_shift = _binary("left_shift")
right_shift = _binary("right_shift")

neg = _unary("neg")
abs = _unary("abs")
exp = _unary("exp")
log = _unary("log")
log1p = _unary("log1p")
expm1 = _unary("expm1")
sqrt = _unary("sqrt")
rsqrt = _unary("rsqrt")
sin = _unary("sin")
cos = _unary("cos")
tan = _unary("tan")
tanh = _unary("tanh")
erf = _unary("erf")
sigmoid = _unary("sigmoid")
relu = _unary("relu")
silu = _unary("silu")
softplus = _unary("softplus")
square = _unary("square")
reciprocal = _unary("reciprocal")
sign = _unary("sign")
floor = _unary("floor")
ceil = _unary("ceil")
_round = _unary("round")


def round(x: Tensor, decimals: int = 0) -> Tensor:  # noqa: A001
    """Elementwise round half to even; with `decimals` as torch.round(x, decimals=d): rint(x * 10**d) / 10**d
    (d < 0: rint(x / 10**-d) * 10**-d), computed in x's dtype, so a result may differ from the decimal
    number by x's rounding, as in PyTorch. Integers are returned as they are (decimals >= 0)."""
    if decimals == 0:
        return _round(x)
    if not isinstance(decimals, (int, np.integer)) or isinstance(decimals, (bool, np.bool_)):
        raise TypeError(f"round: decimals must be an int, got {type(decimals).__name__}")
    if isinstance(x, Tensor) and not ir.is_float(x.dtype):
        if decimals > 0:
            return _round(x)
        raise DTypeError(f"round: decimals={decimals} on {x.dtype} is not supported; cast to a float first")
    scale = 10.0 ** (int(decimals) if decimals > 0 else -int(decimals))  # (this module's abs is the op)
    first, then = ("mul", "div") if decimals > 0 else ("div", "mul")

    def build(n: ir.Node, s: ir.Node, dt: np.dtype) -> ir.Node:
        return ir.binary(then, ir.unary("round", ir.binary(first, n, s, dt)), s, dt)

    return from_ir("round", build, x, scale)


trunc = _unary("trunc")
logical_not = _unary("logical_not")
bitwise_not = _unary("bitwise_not")
isnan = _unary("isnan")
isinf = _unary("isinf")
isfinite = _unary("isfinite")


def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    """x if x >= 0 else negative_slope * x."""
    return from_ir("leaky_relu", lambda n, s, dt: ir.binary("leaky_relu", n, s, dt), x,
                       float(negative_slope), dtype=x.dtype if ir.is_float(x.dtype) else ir.F32)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """x * Phi(x) (approximate="none", with erf) or its tanh approximation (approximate="tanh")."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    op = "gelu" if approximate == "none" else "gelu_tanh"
    return from_ir("gelu", lambda n, dt: ir.unary(op, n), x)


def clamp(x: Tensor, min: Operand = None, max: Operand = None) -> Tensor:
    """min(max(x, min), max); either bound may be None, a scalar or a tensor (NaN stays NaN)."""
    if min is None and max is None:
        raise ValueError("clamp: give at least one of min and max")
    ops = [x] + [b for b in (min, max) if b is not None]

    def build(*nodes: ir.Node) -> ir.Node:
        *ns, dt = nodes
        out = ns[0]
        k = 1
        if min is not None:
            out = ir.binary("maximum", out, ns[k], dt)
            k += 1
        if max is not None:
            out = ir.binary("minimum", out, ns[k], dt)
        return out

    return from_ir("clamp", build, *ops)


def where(cond: Operand, a: Operand, b: Operand) -> Tensor:
    """a where cond is true (nonzero), else b; broadcasting all three."""
    for x in (cond, a, b):
        if not isinstance(x, Tensor):
            _check_operand("where", x)
    vals = []  # (loops, not a comprehension nor a call per Tensor: the relu mask of every backward)
    for v in (a, b):
        if isinstance(v, Tensor):
            vals.append(v)
    if vals:
        dt = vals[0].dtype
        for v in vals[1:]:
            dt = ir.promote(dt, v.dtype)
        for v in (a, b):
            if not isinstance(v, Tensor):
                dt = ir.promote_weak(dt, v)
    else:
        dt = ir.promote(ir.scalar_dtype(a), ir.scalar_dtype(b))

    def build(c: ir.Node, x: ir.Node, y: ir.Node, _dt: np.dtype) -> ir.Node:
        if c.op == "param":
            c = ir.param(bool(c.attr), ir.BOOL)
        return ir.where(c, x, y, dt)

    return from_ir("where", build, cond, a, b, dtype=dt)


def masked_fill(x: Tensor, mask: Tensor, value: Any) -> Tensor:
    """x with `value` where `mask` (broadcast to x's shape) is true."""
    if not isinstance(mask, Tensor):
        raise DTypeError("masked_fill: mask must be a Tensor")
    out_shape = broadcast_shapes("masked_fill", x.shape, mask.shape)
    if out_shape != x.shape:
        raise ShapeError(f"masked_fill: mask of shape {mask.shape} does not broadcast to x's shape {x.shape}")
    return from_ir("masked_fill", lambda c, v, n, dt: ir.where(c, v, n, dt), mask, value, x,
                       dtype=x.dtype)


def cast(x: Tensor, dtype: Any) -> Tensor:
    """x converted to `dtype` (float -> int truncates toward zero; nonzero -> True for bool)."""
    dt = dtypes.normalize(dtype)
    return from_ir("cast", lambda n, _dt: ir.cast(n, dt) if n.dtype != dt else ir.Node("cast", (n,), dt), x)
