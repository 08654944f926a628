"""Python operators and tensor-like methods on Node, forwarding to the differentiable ops.

`==` is left as identity (Nodes are used as dict keys and in lists); use ag.eq for elementwise equality.
"""

from __future__ import annotations

import inspect

import numpy as np

from netcl.autograd import elementwise as ew
from netcl.autograd import movement as mv
from netcl.autograd import nnops
from netcl.autograd import reduce as rd
from netcl.autograd.engine import Node, is_recording
from netcl.core import dtypes, launch_labels
from netcl.errors import NetclError
from netcl.ops.operators import (
    DTYPE_METHODS,
    ELEMENTWISE_METHODS,
    METHOD_ALIASES,
    REDUCE_METHODS,
    dtype_method,
)


def _reflected(fn):
    return lambda self, other: fn(other, self)


def _to(node: Node, dtype: object) -> Node:
    """`node.to(dtype)`: PyTorch's spelling of astype (differentiable). A Node stays on its queue: move
    its Tensor instead (`node.value.to(queue)`, or the module: `model.to(queue)`)."""
    if not isinstance(dtype, (np.dtype, type, str)):
        raise TypeError(
            f"Node.to takes a dtype (np.float16, 'float64', ...), got {type(dtype).__name__}; a Node "
            "stays on its queue: move the Tensor (node.value.to(queue)) or the module (model.to(queue))"
        )
    dt = dtypes.normalize(dtype)
    return node if dt == node.dtype else ew.cast(node, dt)


def _inplace(symbol: str, dunder: str, op: object):
    """`node <symbol>= other`: outside a recording Tape (no Tape, or ag.no_grad()) the node's Tensor is
    written in place (Tensor's own `dunder`: one launch), so `with ag.no_grad(): p -= lr * p.grad` updates
    the parameter as PyTorch's does; inside one, a new recorded node (`x = x <symbol> y`), except on a leaf
    that requires grad (a Parameter), which PyTorch refuses too: its gradient would describe the value
    before the write. (Without these, Python made `p -= ...` a new node bound to the loop's name: the
    parameter stayed as it was, silently.)"""
    def inplace(self: Node, other: object) -> Node:
        if is_recording():
            if self.requires_grad and self.grad_fn is None:
                raise NetclError(
                    f"`x {symbol}= y` on a leaf that requires grad ({self!r}) while a Tape records: its "
                    "gradient would describe the value before the write. Update parameters under `with "
                    "ag.no_grad():` (PyTorch's `with torch.no_grad(): p -= lr * p.grad`) or outside the "
                    f"Tape; to record the op, write `x = x {symbol} y`")
            return op(self, other)
        getattr(self.value, dunder)(other.value if isinstance(other, Node) else other)
        return self

    inplace.__name__ = dunder
    return inplace


def _setitem(self: Node, index: object, value: object) -> None:
    """`node[index] = value` (PyTorch's `with torch.no_grad(): emb.weight[pad] = 0`): written into the node's
    Tensor outside a recording Tape; inside one refused, as a recorded graph may have saved the old values
    (netcl keeps no version counters to tell), with what to write instead."""
    if is_recording():
        raise NetclError(
            f"`x[...] = value` on {self!r} while a Tape records: the graph may have saved its old values. "
            "Write it under `with ag.no_grad():` or outside the Tape; to record the change, build a new node "
            "(ag.where(mask, value, x), or x + delta)")
    self.value[index] = value.value if isinstance(value, Node) else value


def install() -> None:
    N = Node
    N.__setitem__ = _setitem
    for symbol, dunder, op in (("+", "__iadd__", ew.add), ("-", "__isub__", ew.sub),
                               ("*", "__imul__", ew.mul), ("/", "__itruediv__", ew.div),
                               ("**", "__ipow__", ew.pow)):
        setattr(N, dunder, _inplace(symbol, dunder, op))
    N.__add__ = lambda s, o: ew.add(s, o)
    N.__radd__ = _reflected(ew.add)
    N.__sub__ = lambda s, o: ew.sub(s, o)
    N.__rsub__ = _reflected(ew.sub)
    N.__mul__ = lambda s, o: ew.mul(s, o)
    N.__rmul__ = _reflected(ew.mul)
    N.__truediv__ = lambda s, o: ew.div(s, o)
    N.__rtruediv__ = _reflected(ew.div)
    N.__pow__ = lambda s, o: ew.pow(s, o)
    N.__rpow__ = _reflected(ew.pow)
    N.__neg__ = lambda s: ew.neg(s)
    N.__abs__ = lambda s: ew.abs(s)
    N.__matmul__ = lambda s, o: nnops.matmul(s, o)
    N.__rmatmul__ = _reflected(nnops.matmul)
    N.__lt__ = lambda s, o: ew.lt(s, o)
    N.__le__ = lambda s, o: ew.le(s, o)
    N.__gt__ = lambda s, o: ew.gt(s, o)
    N.__ge__ = lambda s, o: ew.ge(s, o)
    N.__getitem__ = lambda s, idx: mv.getitem(s, idx)
    # the math methods Tensor has too, from the one list netcl.ops.operators declares (a declared op's
    # methods, matmul, softmax, ..., are set by netcl.autograd.declared as it makes the op)
    for name in ELEMENTWISE_METHODS:
        setattr(N, name, getattr(ew, name))
    for name in REDUCE_METHODS:
        setattr(N, name, getattr(rd, name))
    for alias, name in METHOD_ALIASES.items():
        setattr(N, alias, getattr(N, name))
    for name in DTYPE_METHODS:
        setattr(N, name, dtype_method(ew.cast, name))
    N.to = _to
    for name in (
        "reshape",
        "view",
        "flatten",
        "permute",
        "transpose",
        "squeeze",
        "unsqueeze",
        "expand",
        "contiguous",
        "split",
        "chunk",
    ):
        setattr(N, name, getattr(mv, name))
    N.T = property(lambda s: mv.permute(s, tuple(reversed(range(s.ndim)))))
    # the lambdas above only forward: the profiler labels launches with the ops they call ("add", "matmul")
    for value in vars(N).values():
        fn = value.fget if isinstance(value, property) else value
        if inspect.isfunction(fn) and fn.__module__ == __name__:
            launch_labels.transparent(fn)
