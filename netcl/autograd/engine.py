"""The autograd engine: Node (a Tensor plus how it was made), Parameter, Tape, no_grad, backward.

A recorded Node's graph side is its GradFn (PyTorch's grad_fn): the rule, the rule's parents (a leaf
Node itself, a recorded one by its GradFn) and what the pass needs of the node (shape, op). A GradFn does not
hold its Node (weakly, once retain_grad() asks) and no Node holds another, so a forward output lives while
the user or a rule that saved it does, not until backward: an intermediate nothing saved (q and k before their
rotation, say) goes back to the pool as soon as the forward pass lets go of it.

Ops record Nodes only inside `with Tape()` and only when an input requires a gradient, so code
that runs outside a tape (evaluation) builds no graph. `tape.backward(loss)` sorts the graph
topologically from the loss, runs each node's local rule once in reverse order, sums the
gradients of nodes used more than once, and frees each rule's saved tensors right after it ran.
A leaf's post-accumulate hooks run as soon as its `.grad` is final for the pass, and callbacks queued
during a pass run when it ends (what netcl.distributed's gradient buckets start and finish on).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from netcl import ops
from netcl.core import dtypes, launch_labels
from netcl.core.access import before_access
from netcl.core.tensor import Tensor, pytorch_spelling
from netcl.errors import DeviceMismatchError, DTypeError, NetclError, ShapeError

BackwardFn = Callable[[Tensor], Sequence[Tensor | None]]


class _State(threading.local):
    def __init__(self) -> None:
        self.tapes: list[Tape] = []
        self.grad_enabled = True
        self.callbacks: list[Callable[[], None]] | None = None  # queued during a backward pass
        # the running rule's parents' gradients summed so far, and which of them it took (partial_gradient)
        self.partials: list[Tensor | None] | None = None
        self.taken: list[int] | None = None


_state = _State()

# rules recorded with sums=True add their parents' gradients so far into their own where they can (a GEMM's
# epilogue, a norm's backward launch: partial_gradient); False: every sum is an add of its own (as before;
# tests compare the two)
SUMS = True


# where a Node's spelling of a PyTorch name differs from a Tensor's (tensor.pytorch_spelling: the rest)
_NODE_SPELLINGS = {
    "data": "node.value (its Tensor, outside the graph)",
    "zero_": "node.value.fill_(0)",
    **{f"{op}_": f"`node {sym}= y` (in place outside a recording Tape: under ag.no_grad() for a Parameter)"
       for op, sym in (("add", "+"), ("sub", "-"), ("mul", "*"), ("div", "/"))},
}


class Node:
    """A Tensor in the autograd graph.

    `.value` is the Tensor, `.grad` the accumulated gradient Tensor (leaves, parameters and
    nodes that called retain_grad()), `.requires_grad` whether gradients flow to it.
    """

    __slots__ = (
        "value",
        "grad",
        "requires_grad",
        "grad_fn",
        "_op",
        "_hooks",
        "__weakref__",
    )
    __array_priority__ = 1001

    def __init__(self, value: Tensor, requires_grad: bool = False):
        if not isinstance(value, Tensor):
            raise TypeError(f"a Node wraps a netcl Tensor, got {type(value).__name__}; use ag.tensor(t)")
        if requires_grad and value.dtype not in dtypes.FLOATING:
            _check_differentiable(value)
        self.value = value
        self.grad: Tensor | None = None
        self.requires_grad = bool(requires_grad)
        self.grad_fn: GradFn | None = None  # set by record(): None for a leaf
        self._op = "leaf"
        self._hooks: list[Callable[[Node], None]] | None = None

    # -- tensor-like properties -------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.value.shape

    @property
    def dtype(self) -> np.dtype:
        return self.value.dtype

    @property
    def ndim(self) -> int:
        return self.value.ndim

    @property
    def size(self) -> Any:
        """The number of elements; called, PyTorch's size() (see Tensor.size)."""
        return self.value.size

    def numel(self) -> int:
        return self.value.numel()

    @property
    def queue(self):
        return self.value.queue

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    def numpy(self) -> np.ndarray:
        return self.value.to_host()

    def cpu(self) -> np.ndarray:
        """PyTorch's `x.cpu()`: the value as a NumPy array (Tensor.cpu; `.numpy()` after it works too)."""
        return self.value.cpu()

    def item(self) -> Any:
        return self.value.item()

    def __float__(self) -> float:
        return float(self.value)

    def __int__(self) -> int:
        return int(self.value)

    def backward(self, grad: Tensor | None = None, retain_graph: bool = False) -> None:
        """`loss.backward()`: the same as `tape.backward(loss)` (PyTorch's spelling)."""
        backward(self, grad, retain_graph)

    def requires_grad_(self, requires_grad: bool = True) -> Node:
        """Make this leaf require a gradient (or not), in place; returns it (PyTorch's x.requires_grad_())."""
        if self.grad_fn is not None:
            raise NetclError(
                f"requires_grad_ sets a leaf's flag; {self!r} is computed by an op (use .detach() to cut it "
                "off the graph first)"
            )
        if requires_grad:
            _check_differentiable(self.value)
        self.requires_grad = bool(requires_grad)
        return self

    def retain_grad(self) -> Node:
        """Keep this (non-leaf) node's gradient in `.grad` after backward (while the node lives: the graph
        holds it weakly)."""
        if self.grad_fn is not None:
            self.grad_fn.retained = weakref.ref(self)
        return self

    def detach(self) -> Node:
        """The same value, cut off from the graph."""
        return Node(self.value)

    def zero_grad(self) -> None:
        self.grad = None

    def register_post_accumulate_grad_hook(self, hook: Callable[[Node], None]) -> HookHandle:
        """Call `hook(node)` during backward right after this leaf's `.grad` is final for the pass (its
        gradient from every path summed and accumulated), while the rest of backward is still to run.
        Returns a handle whose remove() unregisters it."""
        if not callable(hook):
            raise TypeError(f"a gradient hook must be callable, got {type(hook).__name__}")
        if self.grad_fn is not None:
            raise NetclError(f"post-accumulate gradient hooks belong on leaves (parameters), not on {self!r}")
        if self._hooks is None:
            self._hooks = []
        self._hooks.append(hook)
        return HookHandle(self._hooks, hook)

    def __len__(self) -> int:
        return len(self.value)

    def __iter__(self) -> Any:
        """Nodes along axis 0 (each a recorded index op); a 0-d Node is a TypeError, as in NumPy."""
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    def __getattr__(self, name: str) -> Any:
        """Only for names a Node lacks: one its Tensor has (argmax, to_host, tolist, ...) says where it is;
        PyTorch's names say netcl's spelling (tensor.pytorch_spelling; the Node's own: _NODE_SPELLINGS)."""
        if name.startswith("_"):
            raise AttributeError(f"'Node' object has no attribute {name!r}")
        if name not in _NODE_SPELLINGS and hasattr(Tensor, name):
            raise AttributeError(
                f"'Node' object has no attribute {name!r}; its Tensor has it: node.value.{name} (a Tensor "
                "op, outside the graph: no gradient flows through it)"
            )
        hint = _NODE_SPELLINGS.get(name)
        if hint is None:
            hint = pytorch_spelling(name)
            if hint is None:
                raise AttributeError(f"'Node' object has no attribute {name!r}")
            hint = f"on its Tensor x = node.value: {hint}"
        raise AttributeError(f"'Node' object has no attribute {name!r}; netcl spells it {hint}")

    def __repr__(self) -> str:
        flag = ", requires_grad=True" if self.requires_grad else ""
        return f"Node(shape={self.shape}, dtype={self.dtype}, op={self._op}{flag})"


class GradFn:
    """The graph side of a recorded Node: its rule (`backward(grad)` -> one gradient per parent), its parents
    (a leaf Node itself, a recorded Node by its GradFn, None for a parent no gradient flows to), the node's
    shape and op; the node itself only weakly and only once it called retain_grad(). After the rule ran
    without retain_graph its saved tensors and parents are dropped and it is marked freed."""

    __slots__ = ("backward", "parents", "shape", "op", "freed", "retained", "sums")

    def __init__(self, parents: tuple, backward: BackwardFn, shape: tuple[int, ...], op: str,
                 sums: bool = False) -> None:
        self.backward: BackwardFn | None = backward
        self.parents = parents
        self.shape = shape
        self.op = op
        self.freed = False
        self.retained: weakref.ref[Node] | None = None
        self.sums = sums  # the rule may add a parent's gradient so far into its own (partial_gradient)

    def __repr__(self) -> str:
        return f"GradFn(op={self.op}{', freed' if self.freed else ''})"


def _vertex(node: Node) -> Node | GradFn:
    """What the graph holds for `node` as a parent: its GradFn if it was recorded, the leaf itself."""
    return node if node.grad_fn is None else node.grad_fn


class HookHandle:
    """What register_post_accumulate_grad_hook returns: remove() unregisters the hook."""

    def __init__(self, hooks: list, hook: Callable) -> None:
        self._hooks, self._hook = hooks, hook

    def remove(self) -> None:
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)


def queue_callback(callback: Callable[[], None]) -> None:
    """Run `callback()` when the backward pass now running ends (after every gradient is stored), e.g. from
    a post-accumulate hook; callbacks queued by callbacks run too, in order. Outside backward: an error."""
    if _state.callbacks is None:
        raise NetclError("queue_callback: no backward pass is running (call it from a gradient hook)")
    _state.callbacks.append(callback)


def _check_differentiable(value: Tensor) -> None:
    if value.dtype not in dtypes.FLOATING:
        raise DTypeError(
            f"only floating-point tensors can require gradients, got {value.dtype} (shape {value.shape}); "
            "cast it first (x.astype(np.float32)), or leave requires_grad off for index tensors"
        )


class Parameter(Node):
    """A trainable leaf that lives across tapes; its `.grad` accumulates until zero_grad()."""

    __slots__ = ()

    def __init__(self, value: Tensor, requires_grad: bool = True):
        super().__init__(value, requires_grad=requires_grad)
        self._op = "parameter"

    def __repr__(self) -> str:
        return f"Parameter(shape={self.shape}, dtype={self.dtype})"


def tensor(t: Tensor | Node, requires_grad: bool = False) -> Node:
    """Wrap a raw Tensor into a leaf Node (a Node passes through, gaining requires_grad if asked)."""
    if isinstance(t, Node):
        if requires_grad and not t.requires_grad:
            if not t.is_leaf:
                raise NetclError("requires_grad can only be switched on for a leaf node")
            _check_differentiable(t.value)
            t.requires_grad = True
        return t
    if not isinstance(t, Tensor):
        raise TypeError(
            f"ag.tensor wraps a netcl Tensor, got {type(t).__name__}; "
            f"make one with Tensor.from_host(q, array)"
        )
    return Node(t, requires_grad=requires_grad)


def as_node(x: Any) -> Node:
    if isinstance(x, Node):
        return x
    if isinstance(x, Tensor):
        return Node(x)
    hint = (
        "; move it to the device first: Tensor.from_host(queue, array)"
        if isinstance(x, np.ndarray) else ""
    )
    raise TypeError(f"expected a Node or Tensor, got {type(x).__name__}{hint}")


# -- recording ------------------------------------------------------------------------------
def current_tape() -> Tape | None:
    return _state.tapes[-1] if _state.tapes else None


def is_grad_enabled() -> bool:
    return _state.grad_enabled


def is_recording() -> bool:
    """True inside a Tape with gradients enabled: ops on nodes that require grad build a graph."""
    return _state.grad_enabled and bool(_state.tapes)


def record(value: Tensor, parents: Sequence[Node], backward: BackwardFn, op: str, sums: bool = False) -> Node:
    """The node for `value` made from `parents`; `backward(grad)` returns one gradient per parent
    (None where none flows). Outside a tape, or when no parent requires grad, a plain node. `sums`: the rule
    may take a parent's gradient summed so far into its own (partial_gradient)."""
    if not isinstance(value, Tensor) or isinstance(parents, (Node, Tensor)) or not callable(backward):
        _refuse_record(value, parents, backward, op)
    state = _state
    if not (state.grad_enabled and state.tapes):
        return Node(value)
    try:
        for p in parents:
            if p.requires_grad:
                break
        else:
            return Node(value)
        # a parent no gradient can reach (a constant, an index) is not kept: None in its place
        vertices = []
        for p in parents:
            vertices.append((p.grad_fn or p) if p.requires_grad else None)
    except AttributeError:  # a parent that is not a Node
        _refuse_record(value, parents, backward, op)
        raise
    node = Node(value, requires_grad=True)
    node.grad_fn = GradFn(tuple(vertices), backward, value.shape, op, sums)
    node._op = op
    state.tapes[-1]._count += 1
    return node


def _refuse_record(value: Any, parents: Any, backward: Any, op: str) -> None:
    """The TypeError for record()'s arguments that are not (a Tensor, Nodes, a function)."""
    where = f"record({op!r})"
    if not isinstance(value, Tensor):
        hint = " (a Node: pass its .value, the Tensor)" if isinstance(value, Node) else ""
        raise TypeError(f"{where}: value is the op's result as a netcl Tensor, got "
                        f"{type(value).__name__}{hint}")
    if isinstance(parents, (Node, Tensor)):
        raise TypeError(f"{where}: parents is a sequence of the op's input Nodes, got one "
                        f"{type(parents).__name__}; write (x,) for one")
    if not callable(backward):
        raise TypeError(f"{where}: backward is a function of the output's gradient, got "
                        f"{type(backward).__name__}")
    for i, p in enumerate(parents):
        if not isinstance(p, Node):
            hint = (": pass the Node the op read (ag.tensor(t) makes one)" if isinstance(p, Tensor) else "")
            raise TypeError(f"{where}: parent {i} is a {type(p).__name__}, not a Node{hint}")


def needs_grad(*nodes: Node) -> bool:
    """Whether a graph will be recorded for an op on `nodes` (rules skip saving work otherwise)."""
    return _state.grad_enabled and bool(_state.tapes) and any(n.requires_grad for n in nodes)


class _GradMode(contextlib.ContextDecorator):
    """Sets grad mode inside; as a decorator (`@ag.no_grad()` or bare `@ag.no_grad`) each call of the
    function enters its own context, so a recursive or concurrently called function restores the mode its
    caller had (one shared context saved the mode once per entry and left it off after recursion)."""

    enabled = True

    def __new__(cls, func: Callable[..., Any] | None = None) -> Any:
        if func is None:
            return super().__new__(cls)
        if not callable(func):
            raise TypeError(f"{cls.__name__}() takes no arguments (or decorates a function), got "
                            f"{type(func).__name__}")
        return cls()(func)  # bare @no_grad: the decorated function

    def _recreate_cm(self) -> _GradMode:
        return type(self)()

    def __enter__(self) -> _GradMode:
        self._prev = _state.grad_enabled
        _state.grad_enabled = self.enabled
        return self

    def __exit__(self, *exc: object) -> None:
        _state.grad_enabled = self._prev


class no_grad(_GradMode):
    """Context manager and decorator: ops inside record nothing."""

    enabled = False


class enable_grad(_GradMode):
    """Context manager and decorator: ops inside record again (inside a no_grad block)."""

    enabled = True


# -- backward -------------------------------------------------------------------------------
def _topological_order(root: Node | GradFn) -> list[Node | GradFn]:
    """The graph's vertices (GradFns, and leaf Nodes that need a gradient) from `root`, parents before
    children (iterative post-order DFS). Leaves go onto the stack first, so they are explored last: a leaf
    lands in the order right before its first consumer, and the pass stores its gradient (and runs its hooks)
    right after the last rule that feeds it, not at the end of the pass (a parameter explored first would come
    after its consumer's whole input subtree; DDP then saw every gradient only once backward was over and
    could overlap no communication)."""
    order: list[Node | GradFn] = []
    visited: set[int] = set()
    stack: list[tuple[Node | GradFn, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        # leaves first, each kind in its order (a stable sort on "has a rule", in one pass over the parents)
        ruled = None
        for p in node.parents if type(node) is GradFn else ():
            if p is not None and id(p) not in visited and (type(p) is GradFn or p.requires_grad):
                if type(p) is not GradFn:
                    stack.append((p, False))
                elif ruled is None:
                    ruled = [(p, False)]
                else:
                    ruled.append((p, False))
        if ruled is not None:
            stack += ruled
    return order


def _accumulate(a: Tensor, b: Tensor) -> Tensor:
    return ops.add(a, b)


_FREED = (
    "backward: part of this graph was already differentiated and the tensors its rules saved were freed "
    "(node {op}); pass retain_graph=True to the first backward to differentiate the same graph again, or "
    "record the forward pass again"
)


def backward(root: Node, grad: Tensor | None = None, retain_graph: bool = False,
             _targets: dict[int, Node] | None = None) -> None:
    """Run reverse-mode differentiation from `root` (seeded with ones, or `grad`). Each rule's saved
    tensors are freed after it runs unless `retain_graph`; reaching a freed node again is an error
    (PyTorch's rule), never a silently missing gradient."""
    if not isinstance(root, Node):
        raise TypeError(f"backward needs a Node, got {type(root).__name__}")
    if not root.requires_grad:
        raise NetclError(
            "backward: this node does not require grad, so nothing was recorded. Run the forward pass "
            "inside `with ag.Tape() as tape:` with at least one parameter or ag.tensor(..., "
            "requires_grad=True)"
        )
    if root.grad_fn is not None and root.grad_fn.freed:
        raise NetclError(_FREED.format(op=root._op))
    if grad is None:
        if root.size != 1:
            raise ShapeError(
                f"backward without a gradient needs a one-element output, got shape {root.shape}; pass "
                "grad= with the output's shape"
            )
        grad = Tensor.full(root.queue, root.shape, 1.0, root.dtype)
    elif not isinstance(grad, Tensor):
        raise TypeError(f"backward: grad must be a netcl Tensor, got {type(grad).__name__}")
    elif grad.shape != root.shape:
        raise ShapeError(f"backward: grad of shape {grad.shape} does not match the output shape {root.shape}")
    elif not dtypes.is_floating(grad.dtype):
        raise DTypeError(
            f"backward: grad must be floating point like the output ({root.dtype}), got {grad.dtype}"
        )
    elif grad.queue is not root.queue:  # the rules would run on grad's queue and leave .grad there
        where = ("another queue of the same device" if grad.queue.device is root.queue.device
                 else f"{grad.queue.device.describe()}, the output on {root.queue.device.describe()}")
        raise DeviceMismatchError(
            f"backward: grad is on {where}; move it first, grad.to(output.queue) (PyTorch refuses a "
            "gradient on another device too)"
        )
    order = _topological_order(_vertex(root))
    freed = next((n for n in order if type(n) is GradFn and n.freed), None)
    if freed is not None:  # checked before any rule runs: a refused backward changes nothing
        raise NetclError(_FREED.format(op=freed.op))
    grads: dict[int, Tensor] = {id(_vertex(root)): grad}
    claimed: set[int] = set()  # storages handed to a leaf's .grad this pass: never shared between two
    outer_callbacks, _state.callbacks = _state.callbacks, []
    try:
        with no_grad():
            _run_rules(order, grads, claimed, retain_graph, _targets)
            while _state.callbacks:
                _state.callbacks.pop(0)()
    finally:
        _state.callbacks = outer_callbacks


def _run_rules(order: list[Node | GradFn], grads: dict[int, Tensor], claimed: set[int], retain_graph: bool,
               _targets: dict[int, Node] | None) -> None:
    """The pass itself: each rule once, in reverse topological order (see backward); `_targets`
    (tape.gradient) maps vertices to the Nodes whose gradients are wanted instead of stored in leaves. The
    order lets go of each vertex as its turn comes, so without retain_graph what a rule saved goes back to the
    pool right after the rule ran, as in PyTorch, not when the pass ends (bench/amp.py's act peak)."""
    for i in range(len(order) - 1, -1, -1):
        vertex = order[i]
        order[i] = None  # type: ignore[call-overload]
        g = grads.pop(id(vertex), None)
        if g is None:
            continue
        if _targets is not None:
            target = _targets.get(id(vertex))
            if target is not None:
                target.grad = g if target.grad is None else _accumulate(target.grad, g)
        if type(vertex) is not GradFn:  # a leaf: parameters and ag.tensor(..., requires_grad=True)
            if _targets is None:
                _store_leaf_grad(vertex, g, claimed)
                if vertex._hooks:
                    for hook in tuple(vertex._hooks):
                        hook(vertex)
            continue
        if _targets is None and vertex.retained is not None:
            node = vertex.retained()
            if node is not None:
                node.grad = g if node.grad is None else _accumulate(node.grad, g)
        parents = vertex.parents
        taken = None
        if vertex.sums and SUMS:  # hand the rule what its parents' gradients sum to so far (partial_gradient)
            partials = None
            for k, parent in enumerate(parents):
                prev = grads.get(id(parent)) if parent is not None else None
                # (a pending sum fuses into its consumer; a parent given twice is offered at its first place)
                if prev is not None and prev._pending is None and not any(p is parent for p in parents[:k]):
                    if partials is None:
                        partials = [None] * len(parents)
                    partials[k] = prev
            if partials is not None:
                state = _state
                outer = state.partials, state.taken  # (a rule may run a backward pass of its own)
                state.partials, state.taken = partials, []
                try:
                    parent_grads = vertex.backward(g)
                finally:
                    taken = state.taken
                    state.partials, state.taken = outer
            else:
                parent_grads = vertex.backward(g)
        else:
            parent_grads = vertex.backward(g)
        if not retain_graph:
            vertex.backward = None  # frees the tensors the rule saved
            vertex.parents = ()
            vertex.freed = True
        if parent_grads is None or isinstance(parent_grads, (Tensor, Node, np.ndarray)):
            raise NetclError(
                f"backward rule of {vertex.op} returned {_kind(parent_grads)}, not one gradient per input: "
                f"return a tuple of {len(parents)} (a Tensor or None each), (grad,) for one input"
            )
        if len(parent_grads) != len(parents):
            raise NetclError(
                f"backward rule of {vertex.op} returned {len(parent_grads)} gradients "
                f"for {len(parents)} inputs"
            )
        for k, (parent, pg) in enumerate(zip(parents, parent_grads)):
            if pg is None or parent is None:
                continue
            if not isinstance(pg, Tensor):
                raise TypeError(
                    f"backward rule of {vertex.op} returned {_kind(pg)} as the gradient of input {k}; a "
                    "gradient is a netcl Tensor (or None)"
                    + (" (a Node: its .value)" if isinstance(pg, Node) else "")
                )
            if type(parent) is GradFn:
                shape = parent.shape
            elif parent.requires_grad:
                shape = parent.value.shape
            else:
                continue
            if pg.shape != shape:
                raise ShapeError(
                    f"backward rule of {vertex.op} made a gradient of shape {pg.shape} "
                    f"for an input of shape {shape}"
                )
            key = id(parent)
            prev = grads.get(key)
            grads[key] = pg if prev is None or (taken and k in taken) else _accumulate(prev, pg)


def _kind(x: Any) -> str:
    """What a rule returned, for its error: a type, with a shape where it has one."""
    if x is None:
        return "None"
    shape = getattr(x, "shape", None)
    return f"a {type(x).__name__}" + (f" of shape {tuple(shape)}" if shape is not None else "")


def partial_gradient(index: int, shape: tuple[int, ...], dtype: Any, queue: Any) -> Tensor | None:
    """Inside a backward rule recorded with `sums=True`: the gradient of the rule's parent `index` summed so
    far from the rules that ran before it, for the rule to add into its own gradient of that parent where
    it costs nothing (a GEMM's residual epilogue: no add launch, one tensor less read and written). None
    where there is none yet, where it is still pending (an elementwise sum fuses into its consumer instead),
    or where it differs from the rule's gradient in shape, dtype or queue. A rule that gets a Tensor must
    return that gradient with it included: the pass stores the rule's gradient as the sum."""
    state = _state
    partials = state.partials
    if partials is None or index >= len(partials):
        return None
    prev = partials[index]
    if prev is None or prev.shape != shape or prev.dtype != dtype or prev.queue is not queue:
        return None
    partials[index] = None
    state.taken.append(index)
    return prev


def _store_leaf_grad(node: Node, g: Tensor, claimed: set[int]) -> None:
    if g.dtype != node.value.dtype:
        g = ops.cast(g, node.dtype)
    if node.grad is None:
        # Tensor.storage's usual case read in place (nothing pending, no before-access hook to run)
        storage = g._storage if g._pending is None and not before_access else g.storage
        if not g.is_contiguous() or id(storage) in claimed:
            g = g.clone()  # optimizers and clip_grad_norm_ update .grad in place: it must own its memory
            storage = g.storage
        claimed.add(id(storage))
        node.grad = g
    else:
        node.grad = _accumulate(node.grad, g)
        claimed.add(id(node.grad.storage))


class Tape:
    """`with Tape() as tape:` records the ops of the block; `tape.backward(loss)` differentiates."""

    def __init__(self) -> None:
        self._count = 0

    def __enter__(self) -> Tape:
        _state.tapes.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self in _state.tapes:
            _state.tapes.remove(self)

    @property
    def recorded(self) -> int:
        """How many nodes were recorded on this tape."""
        return self._count

    def backward(self, loss: Node, grad: Tensor | None = None, retain_graph: bool = False) -> None:
        """Accumulate d(loss)/d(leaf) into every leaf's `.grad` (seed: ones, or `grad`). The graph is
        freed as it goes unless `retain_graph` (needed to differentiate it, or a part of it, again)."""
        backward(loss, grad, retain_graph)

    def gradient(self, loss: Node, wrt: Sequence[Node], grad: Tensor | None = None,
                 retain_graph: bool = False, allow_unused: bool = False) -> list[Tensor | None]:
        """d(loss)/d(each of `wrt`), leaves or intermediate nodes, returned instead of accumulated into
        any `.grad` (torch.autograd.grad). A node of `wrt` that does not require grad is an error; one
        the loss does not depend on is too, unless allow_unused (then its gradient is None)."""
        wrt = list(wrt)
        for i, n in enumerate(wrt):
            if not isinstance(n, Node):
                raise TypeError(f"gradient: wrt[{i}] is a {type(n).__name__}, not a Node")
            if not n.requires_grad:
                raise NetclError(f"gradient: wrt[{i}] ({n!r}) does not require grad, so it has no gradient")
        reached = {id(n) for n in _topological_order(_vertex(loss))} if isinstance(loss, Node) else set()
        unused = [i for i, n in enumerate(wrt) if id(_vertex(n)) not in reached]
        if unused and not allow_unused:
            raise NetclError(
                f"gradient: wrt{unused} is not used in computing the loss (pass allow_unused=True "
                "to get None for it)"
            )
        saved = [n.grad for n in wrt]
        for n in wrt:
            n.grad = None
        try:
            backward(loss, grad, retain_graph, _targets={id(_vertex(n)): n for n in wrt})
            return [n.grad for n in wrt]
        finally:
            for n, s in zip(wrt, saved):
                n.grad = s


__all__ = [
    "GradFn",
    "HookHandle",
    "Node",
    "Parameter",
    "Tape",
    "as_node",
    "backward",
    "current_tape",
    "enable_grad",
    "is_grad_enabled",
    "is_recording",
    "needs_grad",
    "no_grad",
    "partial_gradient",
    "queue_callback",
    "record",
    "tensor",
]

launch_labels.walks_through(__name__)  # netcl.profiling: the backward walk: its rules name the launches
