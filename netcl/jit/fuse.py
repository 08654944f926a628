"""`@netcl.jit.fuse`: trace an elementwise function once per signature, run it as one kernel, and
derive its backward symbolically as one more kernel.

API (for users and for netcl.autograd)::

    @fuse
    def bias_gelu(x, b):
        return ops.gelu(x + b, approximate="tanh")

    y = bias_gelu(x, b)                           # one launch (per distinct output shape)
    gx, gb = bias_gelu.backward((x, b), grad_y)   # one launch; gb summed over broadcast axes
    bias_gelu.vjp_exprs((x, b))                   # {input index: IR expression of its gradient}

- Arguments: Tensors (traced symbolically) and Python scalars (baked into the trace: another
  value is another trace). Outputs: one Tensor or a tuple/list of Tensors.
- The trace is cached per (tensor shapes, dtypes, queue, scalar values); later calls substitute
  the real tensors and launch the cached kernel. Pending inputs are fused into the launch.
- `backward(inputs, grad_outputs)` (grad_outputs: a Tensor or one per output, None = zeros)
  returns one gradient per tensor input, None for non-float inputs. Every gradient is computed by
  ONE kernel from the inputs and the output gradients (the forward is recomputed inside it, nothing
  is saved). Inputs that were broadcast get one extra reduction launch each to sum over the
  broadcast axes.
- Inside the function only elementwise ops are allowed; a reduction, a view or a host read of a
  traced value raises netcl.jit.TraceError.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from netcl.core import dtypes, launch_labels
from netcl.core.tensor import Tensor, check_same_queue, contiguous_strides
from netcl.errors import ShapeError
from netcl.jit import autodiff, ir, lazy
from netcl.jit import reduce as jreduce
from netcl.jit.runner import run_elementwise


def _placeholder(queue: Any, shape: tuple[int, ...], dtype: np.dtype, slot: int) -> Tensor:
    t = Tensor(None, shape, contiguous_strides(shape), 0, dtype, queue)  # type: ignore[arg-type]
    t._pending = lazy.Pending(ir.Node("input", (), dtype, slot), [], [])
    return t


def substitute(exprs: list[ir.Node], mapping: dict[Any, ir.Node]) -> list[ir.Node]:
    """Copies of `exprs` with every `input` node replaced by mapping[slot]."""
    memo: dict[int, ir.Node] = {}
    for node in ir.walk(exprs):
        if node.op == "input":
            memo[id(node)] = mapping[node.attr]
        elif node.args:
            args = tuple(memo[id(a)] for a in node.args)
            if all(x is y for x, y in zip(args, node.args)):
                memo[id(node)] = node
            else:
                memo[id(node)] = ir.Node(node.op, args, node.dtype, node.attr)
        else:
            memo[id(node)] = node
    return [memo[id(e)] for e in exprs]


class Trace:
    """One traced signature: output expressions over input slots, their shapes and dtypes."""

    def __init__(self, exprs: list[ir.Node], shapes: list[tuple[int, ...]], n_inputs: int,
                 in_shapes: list[tuple[int, ...]], in_dtypes: list[np.dtype], single: bool):
        self.exprs = exprs
        self.shapes = shapes
        self.n_inputs = n_inputs
        self.in_shapes = in_shapes
        self.in_dtypes = in_dtypes
        self.single = single
        self._grads: dict[int, ir.Node] | None = None

    def grad_exprs(self) -> dict[int, ir.Node]:
        if self._grads is None:
            gs = [ir.Node("input", (), e.dtype, self.n_inputs + j) for j, e in enumerate(self.exprs)]
            self._grads = autodiff.vjp(self.exprs, gs)
        return self._grads


def _launch(exprs_shapes: list[tuple[ir.Node, tuple[int, ...]]], queue: Any) -> list[Tensor]:
    """Compute each expression into a new tensor, one launch per distinct shape."""
    outs = []
    groups: dict[tuple[int, ...], list[tuple[ir.Node, Tensor]]] = {}
    for expr, shape in exprs_shapes:
        t = Tensor.empty(queue, shape, expr.dtype)
        outs.append(t)
        groups.setdefault(shape, []).append((expr, t))
    for group in groups.values():
        run_elementwise(group)
    return outs


class FusedFunction:
    """A function of Tensors traced into one elementwise kernel (see the module docstring)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self._traces: dict[tuple, Trace] = {}
        functools.update_wrapper(self, fn)

    def _signature(self, args: tuple) -> tuple:
        key = []
        for i, a in enumerate(args):
            if isinstance(a, Tensor):
                key.append(("T", a.shape, dtypes.token(a.dtype), id(a.queue)))
            elif isinstance(a, (np.ndarray, list, tuple)):
                raise TypeError(f"{self.__name__}: argument {i} is a host {type(a).__name__} of shape "
                                f"{np.shape(a)}; a fused function takes Tensors (move it to the device "
                                "first: Tensor.from_host(queue, array)) and numbers")
            else:  # a number, or a static setting the function reads while traced (a string, a flag)
                try:
                    hash(a)
                except TypeError:
                    raise TypeError(f"{self.__name__}: argument {i} ({type(a).__name__}) is neither a Tensor "
                                    "nor a hashable setting the trace can be kept under") from None
                key.append(("S", type(a).__name__, a))
        return tuple(key)

    def trace(self, args: tuple) -> Trace:
        key = self._signature(args)
        tr = self._traces.get(key)
        if tr is not None:
            return tr
        tensors = [a for a in args if isinstance(a, Tensor)]
        queue = check_same_queue(*tensors) if tensors else None
        slot = 0
        symbolic = []
        for a in args:
            if isinstance(a, Tensor):
                symbolic.append(_placeholder(queue, a.shape, a.dtype, slot))
                slot += 1
            else:
                symbolic.append(a)
        with lazy.trace_mode():
            result = self.fn(*symbolic)
        single = isinstance(result, Tensor)
        outs = [result] if single else list(result)
        exprs = []
        for o in outs:
            if not isinstance(o, Tensor):
                raise ir.TraceError(f"a fused function must return Tensors, got {type(o).__name__}")
            pend = o._pending
            exprs.append(pend.expr if pend is not None else ir.leaf(o))
        tr = Trace(exprs, [o.shape for o in outs], slot, [t.shape for t in tensors],
                   [t.dtype for t in tensors], single)
        self._traces[key] = tr
        return tr

    def _mapping(self, tensors: list[Tensor]) -> dict[Any, ir.Node]:
        inlined: list = []
        return {i: lazy.operand(t, inlined) for i, t in enumerate(tensors)}

    def __call__(self, *args: Any, **named: Any) -> Any:
        if named:  # traced by position: keywords are placed by the function's own signature
            try:
                bound = inspect.signature(self.fn).bind(*args, **named)
            except TypeError as exc:
                raise TypeError(f"{self.__name__}{inspect.signature(self.fn)}: {exc}") from None
            bound.apply_defaults()
            if bound.kwargs:
                raise TypeError(f"{self.__name__}: a fused function's keyword-only parameters "
                                f"({', '.join(bound.kwargs)}) are not traced; make them positional")
            args = tuple(bound.args)
        tr = self.trace(args)
        tensors = [a for a in args if isinstance(a, Tensor)]
        queue = check_same_queue(*tensors)
        exprs = substitute(tr.exprs, self._mapping(tensors))
        outs = _launch(list(zip(exprs, tr.shapes)), queue)
        return outs[0] if tr.single else tuple(outs)

    def vjp_exprs(self, args: tuple) -> dict[int, ir.Node]:
        """{tensor-input index: gradient expression over `input` slots (inputs, then output grads)}."""
        return self.trace(tuple(args)).grad_exprs()

    def backward(self, inputs: Any, grad_outputs: Any) -> list[Tensor | None]:
        """Gradients of sum_j <grad_outputs[j], output_j> w.r.t. each tensor input (see module doc)."""
        args = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        tr = self.trace(args)
        tensors = [a for a in args if isinstance(a, Tensor)]
        queue = check_same_queue(*tensors)
        single = isinstance(grad_outputs, (Tensor, np.ndarray)) or not isinstance(grad_outputs, (tuple, list))
        gouts = [grad_outputs] if single else list(grad_outputs)
        for j, g in enumerate(gouts):
            if g is not None and not isinstance(g, Tensor):
                raise TypeError(f"{self.__name__}.backward: the gradient of output {j} is a "
                                f"{type(g).__name__}; gradients are Tensors on the inputs' queue (None: "
                                "zero), one per output")
        if len(gouts) != len(tr.exprs):
            raise ShapeError(f"backward: {len(tr.exprs)} outputs but {len(gouts)} output gradients")
        mapping = self._mapping(tensors)
        for j, (g, shape, e) in enumerate(zip(gouts, tr.shapes, tr.exprs)):
            if g is None:
                mapping[tr.n_inputs + j] = ir.const(0.0, e.dtype if ir.is_float(e.dtype) else ir.F32)
                continue
            if g.shape != shape:
                raise ShapeError(
                    f"backward: output {j} has shape {shape} but its gradient has shape {g.shape}"
                )
            check_same_queue(tensors[0], g)
            mapping[tr.n_inputs + j] = lazy.operand(g, [])
        grads = tr.grad_exprs()
        full = tuple(np.broadcast_shapes(*tr.shapes)) if tr.shapes else ()
        slots = [i for i in range(tr.n_inputs) if i in grads and ir.is_float(tr.in_dtypes[i])]
        exprs = substitute([ir.cast(grads[i], tr.in_dtypes[i]) for i in slots], mapping)
        results: list[Tensor | None] = [None] * tr.n_inputs
        direct = [(i, e) for i, e in zip(slots, exprs) if tr.in_shapes[i] == full]
        if direct:
            outs = _launch([(e, full) for _, e in direct], queue)
            for (i, _), t in zip(direct, outs):
                results[i] = t
        for i, e in zip(slots, exprs):
            if tr.in_shapes[i] == full:
                continue
            lead = len(full) - len(tr.in_shapes[i])
            axes = tuple(range(lead)) + tuple(
                lead + d for d, s in enumerate(tr.in_shapes[i]) if s == 1 and full[lead + d] != 1)
            # the broadcast input's gradient: summed over its broadcast axes by the reduction engine
            pending = lazy.make_result(e, full, queue, [])
            if any(n.op == "index" for n in ir.walk([e])):
                pending.realize()  # position-dependent expressions are computed before they are reduced
            summed = Tensor.empty(queue, tuple(s for d, s in enumerate(full) if d not in axes), e.dtype)
            jreduce.run("reduce", "sum", lazy.operand(pending, []), full, axes, summed, queue)
            results[i] = summed.reshape(tr.in_shapes[i])
        for i in range(tr.n_inputs):
            if results[i] is None and ir.is_float(tr.in_dtypes[i]) and i not in grads:
                results[i] = Tensor.zeros(queue, tr.in_shapes[i], tr.in_dtypes[i])
        return results


def fuse(fn: Callable[..., Any]) -> FusedFunction:
    """Decorator: run `fn` (elementwise work on Tensors) as one kernel; see the module docstring."""
    return FusedFunction(fn)

launch_labels.names_ops(__name__)  # netcl.profiling: a @jit.fuse function is an op of its own
