"""Automatic fusion: elementwise results stay *pending* expressions until something needs memory.

How it works. An elementwise op (netcl.ops.elementwise) on Tensors returns a Tensor with no
storage whose `_pending` holds the expression (`Pending`). An op consuming a pending tensor inlines
its expression instead of reading memory, so a chain `((x * 2 + 1).exp() * y).tanh()` becomes one
expression and one kernel. The kernel runs when the result's storage is needed: `.storage` /
`.buffer` access (every non-elementwise op and host read goes through these), a view, or
`realize()`. Reductions take a pending input's expression as their prologue.

Correctness rules:
- An intermediate that Python still references when its consumer is computed is stored by the
  same launch as an extra output (same shape) or computed on its own first (other shape); one that
  is touched later without that recomputes itself: correct either way.
- A pending tensor is registered as a reader of the storages its expression reads; any access to
  such a storage's `.buffer` (e.g. an in-place write) first computes the pending readers, so they
  see the old contents (the registry below, behind core's `before_access` hook).
- Graphs are bounded (`MAX_NODES`, `MAX_LEAVES`): beyond that an operand is realised, not inlined.
- `NETCL_FUSION=0` (config.fusion_enabled()) makes every op launch at once; results are identical
  because float16 intermediates are rounded to half in fused kernels exactly as if stored.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

from netcl import config
from netcl.core import tensor as _tensor
from netcl.core.memory import Storage
from netcl.core.tensor import Tensor, contiguous_strides
from netcl.jit import ir
from netcl.jit.runner import run_elementwise, run_keyed

MAX_NODES = 160
MAX_LEAVES = 14


# -- pending readers ----------------------------------------------------------------------------------
# Pending tensors register as readers of the storages their expression reads; core's Tensor.storage calls
# `_tensor.before_access[id(storage)]` before handing such a storage out, which computes them first.
_pending_readers: dict[int, dict[int, weakref.ref]] = {}


class _ReaderRef(weakref.ref):
    """Weak reference to a pending tensor that also knows where it is registered (no per-tensor
    closure: registering is on the hot path of every lazy elementwise op)."""

    __slots__ = ("keys", "tid")


def _forget_reader(ref: _ReaderRef) -> None:
    tid = ref.tid
    for k in ref.keys:
        readers = _pending_readers.get(k)
        if readers is not None:
            readers.pop(tid, None)
            if not readers:
                _pending_readers.pop(k, None)
                _tensor.before_access.pop(k, None)


def register_pending_reader(tensor: Tensor, leaves: Sequence[Tensor]) -> None:
    """Register pending `tensor` as a reader of the storages of the tensors its expression reads."""
    ref = _ReaderRef(tensor, _forget_reader)
    ref.tid = tid = id(tensor)
    ref.keys = keys = []
    hooks = _tensor.before_access
    for t in leaves:
        k = id(t._storage)
        keys.append(k)
        readers = _pending_readers.get(k)
        if readers is None:
            _pending_readers[k] = {tid: ref}
            hooks[k] = realize_pending_readers
        else:
            readers[tid] = ref
    tensor._pending_forget = ref


def forget_pending_reader(tensor: Tensor) -> None:
    """Unregister a pending tensor that has been computed (see register_pending_reader)."""
    ref = tensor.__dict__.pop("_pending_forget", None)
    if ref is not None:
        _forget_reader(ref)


def realize_pending_readers(storage: Storage) -> None:
    """Compute every pending tensor that reads `storage` (before it is written)."""
    readers = _pending_readers.pop(id(storage), None)
    _tensor.before_access.pop(id(storage), None)
    if not readers:
        return
    for ref in list(readers.values()):
        t = ref()
        if t is not None and t._pending is not None:
            realize(t)

class _State(threading.local):
    tracing = 0  # class default: reading it in a fresh thread needs no getattr fallback


_state = _State()


def tracing() -> bool:
    return _state.tracing > 0


class trace_mode:
    """Inside: elementwise ops stay symbolic whatever NETCL_FUSION says (used by `fuse`)."""

    def __enter__(self) -> None:
        _state.tracing += 1

    def __exit__(self, *exc: object) -> None:
        _state.tracing -= 1


def lazy_enabled() -> bool:
    """Whether elementwise ops stay pending (read on every op: config.env is the cheap lookup)."""
    return _state.tracing > 0 or config.fusion_enabled()


_contiguous: dict[tuple[int, ...], tuple[int, ...]] = {}


class Pending:
    """The not-yet-computed value of a Tensor: its expression and the pending tensors inlined in it."""

    __slots__ = ("expr", "inlined", "leaves")

    def __init__(self, expr: ir.Node, inlined: list[weakref.ref], leaves: list[Tensor]):
        self.expr = expr
        self.inlined = inlined
        self.leaves = leaves

    def realize(self, tensor: Tensor) -> None:
        """Compute `tensor` (core's Tensor calls this when it needs the storage)."""
        realize(tensor)


def _info(expr: ir.Node) -> tuple:
    """(distinct leaf tensors in slot order, whether a trace input is reachable, structural key, params),
    memoised on the nodes: building a chain op by op stays linear instead of re-walking the whole graph per
    op, and realizing it looks its plan up by the key without walking it again.

    The structural key is what codegen.flatten's description and the leaves' layouts come to, built from
    the operands' keys: op, dtype, attr (not a leaf's tensor nor a param's value), the operands' keys and
    which leaf slots of the node each operand's leaves take (a tensor read by two operands has one slot).
    params are (value, dtype) in slot order. Both are None where a node is reached twice (a node with
    `uses` > 1 below): flatten numbers such a node once, so the caller flattens (runner.run_elementwise)."""
    info = expr.info
    if info is not None:
        return info
    op = expr.op
    args = expr.args
    if op == "leaf":
        t = expr.attr
        info = ((t,), False, ("leaf", t.dtype, t.shape, t.strides, t.offset), ())
    elif not args:
        if op == "param":
            info = ((), False, ("param", expr.dtype), ((expr.attr, expr.dtype),))
        else:
            info = ((), op == "input", (op, expr.dtype, expr.attr), ())
    elif len(args) == 1:
        a = args[0]
        leaves, has_input, key, params = a.info or _info(a)
        if key is not None and a.uses == 1:
            info = (leaves, has_input, (op, expr.dtype, expr.attr, key), params)
        else:
            info = (leaves, has_input, None, None)
    else:
        first = args[0]
        leaves0, has_input, key0, params = first.info or _info(first)
        shared = first.uses != 1 or key0 is None
        leaves = list(leaves0)
        keys = [key0]
        slots = []
        for a in args[1:]:
            ts, hi, key, ps = a.info or _info(a)
            has_input = has_input or hi
            if a.uses != 1 or key is None:
                shared = True
            elif not shared:
                keys.append(key)
                params += ps
            taken = []
            for t in ts:
                k = 0
                for u in leaves:
                    if u is t:
                        break
                    k += 1
                else:  # a new tensor: the next slot (k == its index)
                    leaves.append(t)
                taken.append(k)
            slots.append(tuple(taken))
        if shared:
            info = (tuple(leaves), has_input, None, None)
        else:
            info = (tuple(leaves), has_input, (op, expr.dtype, expr.attr, tuple(keys), tuple(slots)), params)
    expr.info = info
    return info


def operand(t: Tensor, inlined: list[weakref.ref]) -> ir.Node:
    """The IR node standing for tensor `t` in a new expression (inlining `t` if it is pending)."""
    pending = t._pending
    if pending is not None:
        if pending.expr.op == "input":  # a placeholder of a trace
            return pending.expr
        if pending.expr.size <= MAX_NODES and len(pending.leaves) <= MAX_LEAVES:
            inlined.append(weakref.ref(t))
            inlined.extend(pending.inlined)
            return pending.expr
        t.realize()
    return ir.leaf(t)


def make_result(expr: ir.Node, shape: tuple[int, ...], queue: Any, inlined: list[weakref.ref]) -> Tensor:
    """A Tensor for `expr`: pending when fusion is on, else computed now (one launch)."""
    strides = _contiguous.get(shape)
    if strides is None:
        strides = contiguous_strides(shape)
        if len(_contiguous) < 4096:
            _contiguous[shape] = strides
    # (an identity expression still gets a new tensor: ops never alias their input)
    out = Tensor(None, shape, strides, 0, expr.dtype, queue)  # type: ignore[arg-type]
    if _state.tracing > 0 or config.fusion_enabled():  # lazy_enabled(), without its call
        leaves = (expr.info or _info(expr))[0]
        if expr.size > MAX_NODES or len(leaves) > MAX_LEAVES:
            if tracing():
                raise ir.TraceError(f"a fused function grew past {MAX_NODES} nodes / {MAX_LEAVES} tensors")
        else:
            out._pending = Pending(expr, inlined, leaves)
            register_pending_reader(out, leaves)
            return out
    leaves, _, key, params = expr.info or _info(expr)
    if key is not None:
        run_keyed(expr, out, leaves, key, params)  # (allocates out)
    else:
        out._storage = queue.device.pool.allocate(out.nbytes, queue)
        run_elementwise([(expr, out)])
    return out


def realize(tensor: Tensor) -> None:
    """Compute a pending tensor (plus any still-referenced pending intermediates of the same shape,
    in the same launch)."""
    pending = tensor._pending
    if pending is None:
        return
    expr = pending.expr
    leaves, has_input, key, params = expr.info or _info(expr)
    if expr.op == "input" or has_input:
        raise ir.TraceError(
            "a function traced by netcl.jit.fuse needed the value of a traced tensor (a host read, a "
            "view, or a non-elementwise op); fuse only elementwise work, call the rest outside"
        )
    tensor._pending = None
    queue = tensor.queue
    outputs = [(expr, tensor)]
    if pending.inlined:
        done = {id(tensor)}
        for ref in pending.inlined:
            other = ref()
            if other is None or other._pending is None or id(other) in done:
                continue
            done.add(id(other))
            if other.shape == tensor.shape:
                outputs.append((other._pending.expr, other))
                other._pending = None
            else:
                other.realize()
    if len(outputs) == 1 and key is not None:
        run_keyed(expr, tensor, leaves, key, params)  # (allocates tensor)
        forget_pending_reader(tensor)
        return
    for _, t in outputs:
        t._storage = queue.device.pool.allocate(t.nbytes, queue)
    run_elementwise(outputs)
    for _, t in outputs:
        forget_pending_reader(t)


def expression_of(t: Tensor, inlined: list[weakref.ref] | None = None) -> ir.Node:
    """The IR of `t` (its pending expression, or a leaf) for consumers like reductions."""
    return operand(t, inlined if inlined is not None else [])
