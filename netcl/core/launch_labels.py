"""What a launch is labelled with while profiling: its *op* (read off the Python stack, by the roles the
layers declare for their own frames), its *scope* (the innermost module or user scope) and the work its op
declared for it.

Layers mark their launches themselves: a package that holds ops calls `names_ops(__name__)` (its outermost
frame on the stack names the op: `conv2d`, `conv2d.backward`, `AdamW.step`), launch machinery and wrappers
call `walks_through(__name__)` or `transparent(fn)` (their frames are passed over). Frames of any other
module (the user's, nn's, models') end the walk: the op is the outermost op frame below them."""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any

# -- op labels: each layer declares its frames' role -------------------------------------------------------
_WALK, _OP, _STOP = 0, 1, 2  # a frame's role in naming a launch's op
_roles: dict[str, int] = {}  # module or package name -> role, declared by the layer itself
_code_kind: dict[Any, int] = {}
_code_label: dict[Any, str] = {}


def names_ops(name: str) -> None:
    """Declare the module or package `name` (its `__name__`) an op layer: the outermost of its frames on a
    launch's stack names the launch's op. The innermost declaration on a module's dotted path wins."""
    _roles[name] = _OP


def walks_through(name: str) -> None:
    """Declare the module or package `name` launch machinery: its frames name no op (the walk goes on to
    its callers)."""
    _roles[name] = _WALK


def _role(module: str) -> int:
    while module:
        role = _roles.get(module)
        if role is not None:
            return role
        module = module.rpartition(".")[0]
    return _STOP  # undeclared: the user's code, nn, models; the op is the outermost op frame below it


def transparent(fn: Any) -> Any:
    """Mark `fn`, a wrapper that only forwards to an op (a Tensor or Node operator method, a classmethod
    alias), as no op of its own: launches under it are labelled with the op it calls ("add", "randn"), not
    with the wrapper's name ("method", "install"). Returns fn."""
    _code_kind[fn.__code__] = _WALK
    return fn


_ANONYMOUS = frozenset({"<locals>", "<lambda>", "<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>"})


def _label(code: Any) -> str:
    label = _code_label.get(code)
    if label is None:
        parts = [p for p in code.co_qualname.split(".") if p not in _ANONYMOUS]
        label = _code_label[code] = ".".join(parts).lstrip("_") or code.co_name
    return label


def current_op(depth: int = 2) -> str:
    """The op on this thread's Python stack (see the module docstring); "(direct)" for a kernel launched
    straight from user code."""
    f: Any = sys._getframe(depth)
    best = outer = None
    kinds = _code_kind
    while f is not None:
        code = f.f_code
        kind = kinds.get(code)
        if kind is None:
            kind = kinds[code] = _role(f.f_globals.get("__name__", ""))
        if kind == _STOP:
            break
        if kind == _OP:
            best = code
        outer = code
        f = f.f_back
    code = best if best is not None else outer
    return _label(code) if code is not None else "(direct)"


# -- scopes: modules being called, user scopes ---------------------------------------------------------------
class _Local(threading.local):
    def __init__(self) -> None:
        self.scopes: list[str] = []  # module / user scope labels, innermost last
        self.root: Any = None  # the outermost module being called (its named_modules() name the others)
        self.modules = 0  # modules being called on this thread (0: the next one called is a root)
        self.work: tuple[float, float] | None = None  # declared by an op for its next launch


_local = _Local()


def current_scope() -> str:
    """The innermost module or user scope of this thread ("" outside any)."""
    scopes = _local.scopes
    return scopes[-1] if scopes else ""


def enter_scope(name: str) -> None:
    """Label this thread's launches with `name` until the matching exit_scope()."""
    _local.scopes.append(name)


def exit_scope() -> None:
    _local.scopes.pop()


# id(root module) -> (weak reference to it, id(module) -> dotted path from its named_modules())
_module_names: dict[int, tuple[Any, dict[int, str]]] = {}


def _paths(root: Any, refresh: bool = False) -> dict[int, str]:
    entry = _module_names.get(id(root))
    if entry is None or entry[0]() is not root or refresh:
        entry = _module_names[id(root)] = (weakref.ref(root), {id(m): n for n, m in root.named_modules()})
    return entry[1]


def _module_label(module: Any) -> str:
    cls = type(module).__name__
    if not _local.modules:
        _paths(module)
        _local.root = module
        return cls
    root = _local.root
    path = _paths(root).get(id(module))
    if path is None:  # a module added since, or one called that the root does not hold
        path = _paths(root, refresh=True).get(id(module))
    return f"{path} ({cls})" if path else f"{_local.scopes[-1]}/{cls}"


def enter_module(module: Any) -> str:
    """Enter the scope of `module` (an nn.Module being called); its label: the class name for the outermost
    module called (the root), else its dotted path in the root's named_modules() with the class, as
    `features.0 (Conv2d)`."""
    label = _module_label(module)
    _local.scopes.append(label)
    _local.modules += 1
    return label


def exit_module() -> None:
    _local.scopes.pop()
    _local.modules -= 1
    if not _local.modules:
        _local.root = None


def site() -> str:
    """Where work happens now: "scope / op" (allocation sites of netcl.memory_summary)."""
    op = current_op(3)
    scope = current_scope()
    return f"{scope} / {op}" if scope else op


# -- declared work ------------------------------------------------------------------------------------
def work(flops: float = 0.0, nbytes: float = 0.0) -> None:
    """Declare the FLOPs and compulsory bytes (read + written once) of this thread's next launch. Ops call
    it only while it matters: `if capture.declaring(): work(2 * m * n * k, ...)` (a profile runs, or a
    recording keeps it for replays that may be profiled)."""
    _local.work = (float(flops), float(nbytes))


def take_work() -> tuple[float, float] | None:
    """The work declared for the next launch, consumed."""
    declared, _local.work = _local.work, None
    return declared


def recorded_site() -> tuple[str, str, tuple[float, float] | None]:
    """(op, scope, declared work) of the launch being recorded (netcl.core.capture keeps it for replays)."""
    return current_op(3), current_scope(), _local.work

