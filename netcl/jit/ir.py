"""The elementwise expression IR: immutable nodes (leaves, scalars, ops, casts) and dtype promotion.

A graph is a DAG of `Node`s. Leaves refer to Tensors (read in place through their strides,
broadcast to the output shape), `param` nodes are runtime scalars (a kernel argument, so
`x * 2.0` and `x * 3.0` share one kernel), `const` nodes are literals baked into the source,
`index` nodes are the output coordinate along an axis (counted from the right, so they survive
broadcasting). Every node knows its result dtype; builders in this module apply netcl's
promotion rules (see netcl.ops.elementwise for the user-facing statement of them).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from netcl.core import dtypes
from netcl.errors import DTypeError, NetclError

F16, BF16, F32, F64 = dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64
I32, I64, U8, BOOL = dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.bool_
HALF = dtypes.HALF  # float16 and bfloat16: stored in 2 bytes, computed as float, rounded at every result

# OpenCL C type each dtype is *computed* in (float16 and bfloat16 are stored in 2 bytes, computed as float).
COMPUTE_TYPE = {
    F16: "float",
    BF16: "float",
    F32: "float",
    F64: "double",
    I32: "int",
    I64: "long",
    U8: "uchar",
    BOOL: "uchar",
}
COMPUTE_SIZE = {
    F16: 4,
    BF16: 4,
    F32: 4,
    F64: 8,
    I32: 4,
    I64: 8,
    U8: 1,
    BOOL: 1,
}  # bytes of one COMPUTE_TYPE value
# numpy scalar type a runtime scalar argument of each dtype is passed as.
ARG_TYPE = {F16: np.float32, BF16: np.float32, F32: np.float32, F64: np.float64, I32: np.int32, I64: np.int64,
            U8: np.uint8, BOOL: np.uint8}


class TraceError(NetclError):
    """A function under netcl.jit.fuse did something that is not elementwise on its inputs."""


class Node:
    """One value of an elementwise graph. `attr` is op-specific (leaf tensor, param value,
    const value, index axis); it is part of the structural key except for leaves and params."""

    __slots__ = ("args", "attr", "dtype", "info", "op", "size", "uses")

    def __init__(self, op: str, args: tuple[Node, ...], dtype: np.dtype, attr: Any = None):
        self.op = op
        self.args = args
        self.dtype = dtype
        self.attr = attr
        size = 1  # tree size: bounds how much inlining we do
        for a in args:
            size += a.size
            a.uses += 1
        self.size = size
        # operand slots that name this node so far: a node used twice makes a graph with sharing, which
        # netcl.jit.lazy's structural key does not describe (it falls back to codegen.flatten)
        self.uses = 0
        # memo of netcl.jit.lazy: (leaf tensors, reaches a trace input, structural key, params)
        self.info: Any = None

    def __repr__(self) -> str:
        if self.op == "leaf":
            return f"leaf{tuple(self.attr.shape)}:{self.dtype}"
        if self.op in ("param", "const", "index"):
            return f"{self.op}({self.attr!r}):{self.dtype}"
        return f"{self.op}({', '.join(map(repr, self.args))}):{self.dtype}"


# -- op table --------------------------------------------------------------------------------
# Every elementwise op by its dtype rule, with the OpenCL C expression over its operands ({0}, {1}) when
# that expression is the same for every dtype; None where netcl.jit.codegen writes it per dtype. A new
# op is one entry here, its derivative in netcl.jit.autodiff and its function in netcl.ops.elementwise.
UNARY_FLOAT: dict[str, str | None] = {  # float result (int/bool input computes in float32)
    "exp": "exp({0})", "log": "log({0})", "log1p": "log1p({0})", "expm1": "expm1({0})", "sqrt": "sqrt({0})",
    "rsqrt": "rsqrt({0})", "sin": "sin({0})", "cos": "cos({0})", "tan": "tan({0})", "tanh": "tanh({0})",
    "erf": "erf({0})", "sigmoid": None, "gelu": None, "gelu_tanh": None, "silu": None, "softplus": None,
    "reciprocal": None,
}
UNARY_SAME: dict[str, str | None] = {  # the input's dtype
    "neg": "(-{0})", "abs": None, "relu": None, "square": "({0} * {0})", "sign": None, "floor": "floor({0})",
    "ceil": "ceil({0})", "round": "rint({0})", "trunc": "trunc({0})",
}
BINARY_ARITH: dict[str, str | None] = {  # the promoted dtype
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})", "pow": None,
    "maximum": None, "minimum": None, "leaky_relu": None, "atan2": "atan2({0}, {1})", "floor_divide": None,
    "remainder": None,
}
COMPARE: dict[str, str | None] = {  # bool
    "eq": "({0} == {1})",
    "ne": "({0} != {1})",
    "lt": "({0} < {1})",
    "le": "({0} <= {1})",
    "gt": "({0} > {1})",
    "ge": "({0} >= {1})",
}
LOGICAL: dict[str, str | None] = {  # bool
    "logical_and": "({0} && {1})", "logical_or": "({0} || {1})", "logical_xor": "(!{0} != !{1})",
}
UNARY_BOOL: dict[str, str | None] = {"logical_not": "(!{0})", "isnan": None, "isinf": None, "isfinite": None}
BITWISE: dict[str, str | None] = {  # integer or bool operands, the promoted dtype (bitwise_not: the input's)
    "bitwise_and": "({0} & {1})", "bitwise_or": "({0} | {1})", "bitwise_xor": "({0} ^ {1})",
    "bitwise_not": "(~{0})", "left_shift": None, "right_shift": None,
}
# the C expression of every op that has one whatever the dtype (where, cast: see codegen)
C_EXPRESSIONS: dict[str, str] = {
    op: c for table in (UNARY_FLOAT, UNARY_SAME, BINARY_ARITH, COMPARE, LOGICAL, UNARY_BOOL, BITWISE)
    for op, c in table.items() if c is not None
}
C_EXPRESSIONS["where"] = "({0} ? {1} : {2})"


_UNARY_FLOAT, _UNARY_SAME, _UNARY_BOOL = frozenset(UNARY_FLOAT), frozenset(UNARY_SAME), frozenset(UNARY_BOOL)
_COMPARE, _LOGICAL, _BINARY_ARITH = frozenset(COMPARE), frozenset(LOGICAL), frozenset(BINARY_ARITH)
_BITWISE = frozenset(BITWISE)


_FLOATS = dtypes.FLOATING


def is_float(dt: np.dtype) -> bool:
    """float16, bfloat16, float32, float64 (never dt.kind: bfloat16 is kind "V" to NumPy)."""
    return dt in _FLOATS


def _category(dt: np.dtype) -> int:
    return 0 if dt == BOOL else (2 if dt in _FLOATS else 1)


def promote(a: np.dtype, b: np.dtype) -> np.dtype:
    """Result dtype of two tensor dtypes: NumPy's result_type within a category, but a float meeting
    an integer keeps the float's width (int32 + float16 -> float16, int64 + float32 -> float32),
    as PyTorch does; float16 meeting bfloat16 gives float32 (neither holds the other), as in PyTorch."""
    if a is b or a == b:
        return a
    ca, cb = _category(a), _category(b)
    if ca == cb:
        if a in HALF and b in HALF:
            return F32
        return np.result_type(a, b)
    return a if ca > cb else b


def promote_weak(tensor_dt: np.dtype, value: Any) -> np.dtype:
    """Result dtype of a tensor dtype meeting a Python scalar ("weak": it adopts the tensor's dtype
    unless it is of a higher category: bool < int < float)."""
    if type(value) is float and tensor_dt in _FLOATS:
        return tensor_dt
    if isinstance(value, (bool, np.bool_)):
        return tensor_dt
    if isinstance(value, (int, np.integer)):
        return tensor_dt if _category(tensor_dt) >= 1 else I32
    if isinstance(value, (float, np.floating)):
        return tensor_dt if is_float(tensor_dt) else F32
    raise DTypeError(f"cannot use a {type(value).__name__} ({value!r}) as a tensor operand")


def scalar_dtype(value: Any) -> np.dtype:
    """dtype of a Python scalar when no tensor fixes it."""
    if isinstance(value, (bool, np.bool_)):
        return BOOL
    if isinstance(value, (int, np.integer)):
        return I32 if -(2**31) <= int(value) < 2**31 else I64
    if isinstance(value, (float, np.floating)):
        return F32
    raise DTypeError(f"cannot use a {type(value).__name__} ({value!r}) as a tensor operand")


# -- builders --------------------------------------------------------------------------------
def leaf(tensor: Any) -> Node:
    return Node("leaf", (), tensor.dtype, tensor)


def param(value: Any, dtype: np.dtype) -> Node:
    """A runtime scalar argument (a Python number in an elementwise op); an integer that `dtype`
    cannot hold is refused here, at the op, as NumPy does."""
    dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
    dtypes.check_scalar_fits(value, dt, "scalar")
    return Node("param", (), dt, value)


def const(value: Any, dtype: np.dtype) -> Node:
    """A literal baked into the kernel source (for structural constants such as 0.5 in gelu)."""
    return Node("const", (), np.dtype(dtype), value)


def index(axis_from_right: int, dtype: np.dtype = I64) -> Node:
    """The output coordinate along axis `-axis_from_right` (1 = last axis)."""
    return Node("index", (), np.dtype(dtype), int(axis_from_right))


def cast(x: Node, dtype: Any) -> Node:
    dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
    if x.dtype is dt or x.dtype == dt:
        return x
    if x.op in ("param", "const"):
        if x.op == "param":
            dtypes.check_scalar_fits(x.attr, dt, "scalar")
        return Node(x.op, (), dt, x.attr)
    return Node("cast", (x,), dt)


def _check_bitwise(op: str, dt: np.dtype) -> None:
    if is_float(dt):
        raise DTypeError(f"{op} is not defined for {dt} (as in PyTorch and NumPy): bitwise ops take integer "
                         "or bool tensors; for truth values compare first (x != 0) or use logical_and/or/not")
    if dt == BOOL and op in ("left_shift", "right_shift"):
        raise DTypeError(f"{op} is not defined for two bool operands (as in PyTorch); cast one of them first")


def unary(op: str, x: Node) -> Node:
    if op == "bitwise_not":
        _check_bitwise(op, x.dtype)
        return Node("logical_not" if x.dtype == BOOL else op, (x,), x.dtype)
    if op in _UNARY_FLOAT:
        dt = x.dtype if is_float(x.dtype) else F32
        return Node(op, (cast(x, dt),), dt)
    if op in _UNARY_SAME:
        if x.dtype == BOOL and op in ("neg", "sign"):
            raise DTypeError(f"{op} is not defined for bool tensors; use logical_not (or cast first)")
        if not is_float(x.dtype) and op in ("floor", "ceil", "round", "trunc"):
            return x
        return Node(op, (x,), x.dtype)
    if op in _UNARY_BOOL:
        return Node(op, (x,), BOOL)
    raise DTypeError(f"unknown unary op {op!r}")


def binary(op: str, a: Node, b: Node, dtype: np.dtype | None = None) -> Node:
    """Build a binary op; `dtype` is the promoted operand dtype (computed from a and b if None)."""
    dt = promote(a.dtype, b.dtype) if dtype is None else (
        dtype if isinstance(dtype, np.dtype) else np.dtype(dtype))
    # an operand already of the dtype is taken as it is, without cast's call (what cast would return)
    if op in _COMPARE:
        return Node(op, (a if a.dtype is dt else cast(a, dt), b if b.dtype is dt else cast(b, dt)), BOOL)
    if op in _LOGICAL:
        return Node(op, (cast(a, BOOL), cast(b, BOOL)), BOOL)
    if op in _BITWISE:
        _check_bitwise(op, dt)
        return Node(op, (a if a.dtype is dt else cast(a, dt), b if b.dtype is dt else cast(b, dt)), dt)
    if op in ("div", "atan2") and not is_float(dt):
        dt = F32
    if dt == BOOL and op in ("sub", "pow", "floor_divide", "remainder"):
        raise DTypeError(f"{op} is not defined for two bool operands; cast one of them first")
    if op == "leaky_relu":
        return Node(op, (cast(a, dt), cast(b, dt)), dt)
    if op not in _BINARY_ARITH:
        raise DTypeError(f"unknown binary op {op!r}")
    return Node(op, (a if a.dtype is dt else cast(a, dt), b if b.dtype is dt else cast(b, dt)), dt)


def where(c: Node, a: Node, b: Node, dtype: np.dtype | None = None) -> Node:
    dt = promote(a.dtype, b.dtype) if dtype is None else (
        dtype if isinstance(dtype, np.dtype) else np.dtype(dtype))
    return Node("where", (c if c.dtype is BOOL else cast(c, BOOL), a if a.dtype is dt else cast(a, dt),
                          b if b.dtype is dt else cast(b, dt)), dt)


def walk(outputs: list[Node]) -> list[Node]:
    """Nodes reachable from `outputs`, each once, operands before users (topological order)."""
    order: list[Node] = []
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(n, False) for n in reversed(outputs)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in seen:
            continue
        if expanded or not node.args:
            seen.add(id(node))
            order.append(node)
            continue
        stack.append((node, True))
        for a in reversed(node.args):
            if id(a) not in seen:
                stack.append((a, False))
    return order
