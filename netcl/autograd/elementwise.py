"""Elementwise ops on Nodes: the forward is the netcl.ops function, the backward comes from netcl's one
derivative table (netcl.jit.autodiff). Every elementwise function of netcl.ops is an op here, same name
and parameters, made by `differentiable(ops.exp)` (the bottom of this module).

Recording an op traces its netcl.ops function into IR once per signature (operand dtypes, scalar
values), differentiates that with `autodiff.vjp` (the saved output standing for the op's value, so
exp's gradient reads exp(x) instead of recomputing it) and keeps the gradient expressions. Backward
substitutes the saved tensors and the incoming gradient into them; each operand's gradient is a
pending Tensor (netcl.jit.lazy) that fuses into whatever consumes it, summed back to the operand's
shape where it was broadcast (`sum_to_shape`).

Operands may be Nodes, raw Tensors (constants) or Python numbers (kernel scalars). Only Nodes that
require grad get a gradient; an op with a non-float result (a comparison) records no graph. Only
the tensors that the needed gradient expressions read are kept for backward (exp keeps its output,
add keeps nothing, mul keeps the other operand).
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from typing import Any

from netcl import ops
from netcl.autograd.engine import Node, as_node, needs_grad, record
from netcl.core.tensor import Tensor, contiguous_strides
from netcl.jit import autodiff, ir, lazy
from netcl.jit.fuse import substitute
from netcl.ops import elementwise as ops_elementwise
from netcl.ops.reduce import sum_to_shape

Operand = Any  # a Node, a Tensor (a constant) or a Python number


def _value(x: Operand) -> Any:
    return x.value if isinstance(x, Node) else x


# -- the traced derivative of one function and signature --------------------------------------------
class _Derivative:
    """Gradient expressions of one elementwise function for one signature, over `input` slots:
    0..n-1 the tensor operands, n the gradient of the output, n + 1 the output itself."""

    __slots__ = ("_reads", "g_slot", "grads", "out_slot")

    def __init__(self, grads: dict[Any, ir.Node], n: int):
        self.grads = grads
        self.g_slot = n
        self.out_slot = n + 1
        self._reads: dict[tuple[int, ...], tuple[int, ...]] = {}

    def reads(self, wanted: tuple[int, ...]) -> tuple[int, ...]:
        """Slots (operands, output; not the gradient) that the gradients of `wanted` read."""
        slots = self._reads.get(wanted)
        if slots is None:
            found = {n.attr for n in ir.walk([self.grads[i] for i in wanted]) if n.op == "input"}
            slots = self._reads[wanted] = tuple(sorted(found - {self.g_slot}))
        return slots


_derivatives: dict[tuple, _Derivative] = {}
_DERIVATIVES_LIMIT = 4096


def _signature_of(x: Any) -> tuple:
    if isinstance(x, Tensor):
        return (x.dtype,)  # shapes never change an elementwise expression
    return (type(x), repr(x))  # repr tells -0.0 from 0.0, and a NaN matches itself


def _placeholder(t: Tensor, slot: int) -> Tensor:
    """A Tensor standing for operand `slot` while a function is traced (as netcl.jit.fuse traces)."""
    p = Tensor(None, t.shape, contiguous_strides(t.shape), 0, t.dtype, t.queue)  # type: ignore[arg-type]
    p._pending = lazy.Pending(ir.Node("input", (), t.dtype, slot), [], [])
    return p


def _trace(fn: Callable[..., Tensor], args: list[Any], kwargs: dict[str, Any]) -> _Derivative:
    n = 0

    def stand_in(x: Any) -> Any:
        nonlocal n
        if not isinstance(x, Tensor):
            return x
        n += 1
        return _placeholder(x, n - 1)

    traced_args = [stand_in(a) for a in args]
    traced_kwargs = {k: stand_in(v) for k, v in kwargs.items()}
    with lazy.trace_mode():
        expr = lazy.expression_of(fn(*traced_args, **traced_kwargs))
    grad = ir.Node("input", (), expr.dtype, n)
    out = ir.Node("input", (), expr.dtype, n + 1)
    return _Derivative(autodiff.vjp([expr], [grad], values={id(expr): out}), n)


def _derivative(fn: Callable[..., Tensor], args: list[Any], kwargs: dict[str, Any]) -> _Derivative:
    key = (fn, tuple([_signature_of(a) for a in args]),
           tuple([(k, _signature_of(v)) for k, v in kwargs.items()]))
    d = _derivatives.get(key)
    if d is None:
        d = _trace(fn, args, kwargs)
        if len(_derivatives) >= _DERIVATIVES_LIMIT:  # e.g. a scalar that changes every step
            _derivatives.clear()
        _derivatives[key] = d
    return d


# -- recording --------------------------------------------------------------------------------------
def _record(fn: Callable[..., Tensor], name: str, args: tuple, kwargs: dict[str, Any]) -> Node:
    values = [_value(a) for a in args]
    kw_values = {k: _value(v) for k, v in kwargs.items()}
    out = fn(*values, **kw_values)
    operands = [x for x in (*args, *kwargs.values()) if isinstance(x, (Node, Tensor))]
    parents = tuple([as_node(x) for x in operands])
    if not ir.is_float(out.dtype) or not needs_grad(*parents):
        return Node(out)
    d = _derivative(fn, values, kw_values)
    wanted = tuple([i for i, p in enumerate(parents) if p.requires_grad and i in d.grads])
    tensors = [_value(x) for x in operands]
    saved = {s: out if s == d.out_slot else tensors[s] for s in d.reads(wanted)}
    shapes = [t.shape for t in tensors]
    dtypes = [t.dtype for t in tensors]
    out_dtype = out.dtype

    def backward(g: Tensor) -> list[Tensor | None]:
        return _gradients(d, wanted, saved, shapes, dtypes, out_dtype, g)

    return record(out, parents, backward, name)


def _gradients(d: _Derivative, wanted: tuple[int, ...], saved: dict[int, Tensor], shapes: list, dtypes: list,
               out_dtype: Any, g: Tensor) -> list[Tensor | None]:
    """One pending gradient per wanted operand (None for the others)."""
    inlined: list = []
    mapping = {s: lazy.operand(t, inlined) for s, t in saved.items()}
    mapping[d.g_slot] = ir.cast(lazy.operand(g, inlined), out_dtype)
    exprs = substitute([d.grads[i] for i in wanted], mapping)
    grads: list[Tensor | None] = [None] * len(shapes)
    made = []
    for i, expr in zip(wanted, exprs):
        traced = d.grads[i]
        if traced.op == "input" and traced.attr == d.g_slot and g.dtype == dtypes[i]:
            grads[i] = g  # add, sub: the gradient passes unchanged (no copy)
        elif (traced.op == "cast" and traced.args[0].op == "input" and traced.args[0].attr == d.g_slot
              and g.dtype == dtypes[i]):
            # a cast whose gradient arrives in its input's dtype already (autocast's float32 weight gradients,
            # netcl.autograd.autocast.widened): the identity, not a round trip through the cast's dtype
            grads[i] = g
        else:
            grads[i] = lazy.make_result(expr, g.shape, g.queue, inlined)
            made.append(grads[i])
    if len(made) > 1:
        # siblings: whichever is computed first computes the others still pending in the same launch
        inlined.extend(weakref.ref(t) for t in made)
    for i in wanted:
        grads[i] = sum_to_shape(grads[i], shapes[i])
    return grads


def apply(fn: Callable[..., Tensor], /, *args: Any, **kwargs: Any) -> Node:
    """`fn(*args, **kwargs)` on the values of Node operands, recorded as one node whose backward is one
    fused kernel. `fn` is elementwise work on Tensors (netcl.ops calls; a composite is fine) and should
    be a module-level function: traces are cached by it, the operand dtypes and the scalar values."""
    return _record(fn, fn.__name__, args, kwargs)


def _node_signature(fn: Callable[..., Tensor]) -> inspect.Signature:
    sig = inspect.signature(fn)
    params = [p.replace(annotation="Operand") if p.annotation in ("Tensor", "Operand") else p
              for p in sig.parameters.values()]
    return sig.replace(parameters=params, return_annotation="Node")


def differentiable(fn: Callable[..., Tensor], gradient: str = "") -> Callable[..., Node]:
    """The op on Nodes for `fn`, an elementwise function of netcl.ops: same parameters, operands may
    be Nodes, and the result is a Node recorded with its gradient from netcl.jit.autodiff.
    `gradient`: a sentence for the docstring where the derivative has a convention worth stating."""
    name = fn.__name__

    def op(*args: Any, **kwargs: Any) -> Node:
        return _record(fn, name, args, kwargs)

    op.__name__ = op.__qualname__ = name
    op.__module__ = __name__
    summary = (fn.__doc__ or f"Elementwise {name}.").strip()
    op.__doc__ = (
        f"{summary}\n\nOn Nodes: differentiable, the gradient from netcl.jit.autodiff's table. {gradient}"
    )
    op.__signature__ = _node_signature(fn)  # type: ignore[attr-defined]
    return op


# -- dropout: a mask drawn here, then an elementwise op like the others ---------------------------------
def _dropout_scale(x: Tensor, keep: Tensor, scale: float) -> Tensor:
    return ops.where(keep, ops.mul(x, scale), 0.0)


def dropout(
    x: Operand, p: float = 0.5, training: bool = True, seed: int | None = None, generator: Any = None
) -> Node:
    """Zero each element with probability p and scale the rest by 1 / (1 - p) (Philox masks)."""
    x = as_node(x)
    if not training or p == 0.0:
        return x
    if not 0.0 <= p < 1.0:
        if p == 1.0:
            return _record(ops.mul, "mul", (x, 0.0), {})
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    xv = x.value
    u = ops.rand(xv.queue, xv.shape, xv.dtype, seed=seed, generator=generator)
    return _record(_dropout_scale, "dropout", (x, ops.ge(u, p), 1.0 / (1.0 - p)), {})


_EXTREMUM_TIES = ("Ties between two tensors send half the gradient to each side and NaN sends all of it to "
                  "both (as PyTorch); against a Python number, a fixed bound, the full gradient passes where "
                  "the bound holds (as torch.clamp: maximum(x, s) is clamp(x, min=s)).")


# -- the ops: every elementwise function of netcl.ops, on Nodes (same name, same parameters) ----------------
# A new function in netcl.ops.elementwise (its __all__) is an op here with no line of its own; a sentence
# for its docstring goes below where its derivative has a convention worth stating.
_CONVENTIONS = {
    "pow": "d/da = b a^(b-1), 0 where b == 0; d/db = a^b log a, 0 where a == 0, b >= 0.",
    "maximum": _EXTREMUM_TIES,
    "minimum": _EXTREMUM_TIES,
    "abs": "The gradient is sign(x) g, 0 at 0 and NaN.",
    "relu": "No gradient where the output is <= 0 (so none at 0).",
    "clamp": "The gradient passes where min <= x <= max (none at NaN).",
    "where": "cond is never differentiated.",
    "cast": "The gradient is cast back to the input's dtype; an integer result records none.",
}
OPS = tuple(name for name in ops_elementwise.__all__ if name != "broadcast_shapes")
globals().update(
    {name: differentiable(getattr(ops_elementwise, name), _CONVENTIONS.get(name, "")) for name in OPS}
)

__all__ = ["apply", "differentiable", "dropout", "sum_to_shape", *OPS]
