"""Module: the container of Parameters, buffers and sub-modules (PyTorch's names and dotted keys).

Assigning a Parameter or a Module to an attribute registers it; `state_dict()` maps dotted names
('0.weight', 'features.3.running_mean') to Tensors; `load_state_dict(strict=True)` checks every
key, shape and dtype before it copies anything, and lists all problems in one error.
"""

from __future__ import annotations

import copy
import functools
import inspect
import numbers
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import numpy as np

from netcl.autograd.engine import Parameter
from netcl.core import dtypes, launch_labels, profile_hooks
from netcl.core.backend import as_queue
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, NetclError


class StateDictError(NetclError, KeyError):
    """load_state_dict found missing or unexpected keys, or shapes/dtypes that do not match."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def _takes_the_queue_first(init: Any) -> bool:
    params = list(inspect.signature(init).parameters.values())
    return len(params) > 1 and params[1].name in ("q", "queue") and params[1].default is params[1].empty


def _queue_first(init: Any, layer: str) -> Any:
    """`init` (a layer's __init__ whose first argument is the queue) behind one check: PyTorch's habit of
    sizes first (Linear(4, 3)) is a TypeError that shows the netcl call, not one about `out_features`."""

    @functools.wraps(init)
    def __init__(self: Module, *args: Any, **kwargs: Any) -> None:
        if "q" not in kwargs and "queue" not in kwargs and (not args or isinstance(args[0], numbers.Number)):
            given = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
            netcl_call = f"{layer}(queue{', ' if given else ''}{given})"
            raise TypeError(
                f"{layer} takes the queue first, then its sizes: {netcl_call}, not PyTorch's "
                f"{layer}({given}). Every netcl tensor and layer lives on one queue, e.g. "
                "queue = netcl.manager.default().queue"
            )
        init(self, *args, **kwargs)

    return launch_labels.transparent(__init__)


# Bumped by every change of which parameters and child modules a module holds (assignment, registration,
# deletion, a container's append): flat lists of a model's modules and parameters made under one value (the
# decode loop's, netcl.models.generation) are valid while it holds.
_structure_version = 0


def structure_version() -> int:
    """The current value of the counter above."""
    return _structure_version


def structure_changed() -> None:
    """Mark a change of some module's parameters or children (containers that write _modules call it)."""
    global _structure_version
    _structure_version += 1


class Module:
    """Base class of every layer. Subclasses set attributes in __init__ and define forward()."""

    foreign_state_keys: tuple[str, ...] = ()  # see load_state_dict
    # attributes that cache device work made from the module (a recorded decode step): `copy.deepcopy` gives
    # the copy None there, and the copy makes its own
    transient_attributes: tuple[str, ...] = ()
    # buffers whose dtype Module.to(dtype) keeps (an int8 layer's float32 scales)
    kept_dtype_buffers: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass whose __init__ takes the queue first (`q` or `queue`: every layer with parameters)
        gets the check of _queue_first."""
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None and _takes_the_queue_first(init):
            cls.__init__ = _queue_first(init, cls.__name__)

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def __deepcopy__(self, memo: dict) -> Module:
        """`copy.deepcopy(model)` (an EMA model, the best epoch's snapshot): the same structure with its own
        parameters and buffers (device copies on the same queues), the training flag and plain attributes
        copied, `transient_attributes` left None."""
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        skip = type(self).transient_attributes
        for name, value in self.__dict__.items():
            object.__setattr__(new, name, None if name in skip else copy.deepcopy(value, memo))
        return new

    # -- registration ---------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        """PyTorch's rules: a Parameter or Module value registers under `name` (whatever `name` held
        before, a None placeholder included); a name that holds a parameter, module or buffer takes
        only its own kind or None; anything else is a plain attribute."""
        d = self.__dict__
        if "_parameters" not in d:
            raise NetclError(
                f"{type(self).__name__}.__init__ must call super().__init__() before setting {name!r}"
            )
        params, buffers, modules = d["_parameters"], d["_buffers"], d["_modules"]
        if isinstance(value, Parameter):
            self._forget(name, keep=params)
            params[name] = d[name] = value
            structure_changed()
        elif name in params:
            if value is not None:
                raise TypeError(f"cannot assign {type(value).__name__} as parameter {name!r} of "
                                f"{type(self).__name__} (a Parameter or None expected)")
            params[name] = d[name] = None
            structure_changed()
        elif isinstance(value, Module):
            self._forget(name, keep=modules)
            modules[name] = value
            structure_changed()
        elif name in modules:
            if value is not None:
                raise TypeError(f"cannot assign {type(value).__name__} as child module {name!r} of "
                                f"{type(self).__name__} (a Module or None expected)")
            modules[name] = None
            structure_changed()
        elif name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign {type(value).__name__} as buffer {name!r} of "
                                f"{type(self).__name__} (a netcl Tensor or None expected)")
            buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def _forget(self, name: str, keep: dict) -> None:
        """Drop `name` from every table but `keep`, and from the plain attributes (a parameter's copy too)."""
        self.__dict__.pop(name, None)
        for table in (self._parameters, self._buffers, self._modules):
            if table is not keep:
                table.pop(name, None)

    # A parameter is kept in _parameters (PyTorch's table: named_parameters, state_dict) and, the same object,
    # in the instance's __dict__, so that `self.weight` in a layer's forward is an ordinary attribute lookup
    # (before, the normal lookup failed, raised inside, and only then called __getattr__). Every write of a
    # parameter goes through __setattr__, register_parameter or __delattr__, which keep both. Buffers and
    # child modules are found by __getattr__ (containers write _modules directly).
    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if table in d and name in d[table]:
                return d[table][name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                if table is not self._buffers:
                    structure_changed()
                del table[name]
                if table is self._parameters:
                    self.__dict__.pop(name, None)
                return
        object.__delattr__(self, name)

    def _check_name(self, name: Any, kind: str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"{kind} name must be a str, got {type(name).__name__}")
        if not name or "." in name:
            raise KeyError(f"{kind} name {name!r} must be non-empty and contain no '.'")
        if hasattr(type(self), name) or (name in self.__dict__ and name not in ("training",)
                                         and name not in self._parameters):
            raise KeyError(
                f"attribute {name!r} of {type(self).__name__} already exists: it cannot also be a {kind}"
            )

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Register `param` (a Parameter, or None for a placeholder) under `name`."""
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot register {type(param).__name__} as parameter {name!r} (a Parameter or "
                            "None expected; wrap a Tensor in ag.Parameter)")
        if name not in self._parameters:
            self._check_name(name, "parameter")
        self._forget(name, keep=self._parameters)
        self._parameters[name] = self.__dict__[name] = param
        structure_changed()

    def register_buffer(self, name: str, tensor: Tensor | None) -> None:
        """A Tensor that is part of the state (saved, moved by to()) but not trained, e.g. running_mean."""
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"buffer {name!r} must be a netcl Tensor, got {type(tensor).__name__}")
        if name not in self._buffers:
            self._check_name(name, "buffer")
        self._forget(name, keep=self._buffers)
        self._buffers[name] = tensor

    def add_module(self, name: str, module: Module | None) -> None:
        """Register `module` (or None) as the child `name`."""
        if module is not None and not isinstance(module, Module):
            raise TypeError(
                f"cannot add {type(module).__name__} as child module {name!r} (a Module expected)"
            )
        if name not in self._modules:
            self._check_name(name, "module")
        self._forget(name, keep=self._modules)
        self._modules[name] = module
        structure_changed()

    # -- traversal ------------------------------------------------------------------------------
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def apply(self, fn: Any) -> Module:
        """Call `fn(module)` on every sub-module, then on this one (PyTorch's order); returns self. The
        place for custom initialisation: `model.apply(lambda m: init.zeros_(m.bias) if isinstance(m,
        Linear) else None)`."""
        if not callable(fn):
            raise TypeError(f"Module.apply takes a function of a module, got {type(fn).__name__}")
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def children(self) -> Iterator[Module]:
        yield from (m for m in self._modules.values() if m is not None)

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        seen: set[int] = set()
        for mod_name, m in self.named_modules(prefix):
            for name, p in m._parameters.items():
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{mod_name}.{name}" if mod_name else name), p

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        for mod_name, m in self.named_modules(prefix):
            for name, b in m._buffers.items():
                if b is not None:
                    yield (f"{mod_name}.{name}" if mod_name else name), b

    def buffers(self) -> list[Tensor]:
        return [b for _, b in self.named_buffers()]

    # -- modes and devices -------------------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        if not isinstance(mode, (bool, np.bool_)):  # train("eval") meant training; PyTorch refuses it too
            raise TypeError(
                f"Module.train(mode): mode must be True or False, got {type(mode).__name__} {mode!r}"
            )
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self) -> Module:
        return self.train(False)

    def to(self, target: Any) -> Module:
        """Move every parameter and buffer to the queue `target` (gradients are dropped). Given a dtype
        (`model.to(np.float64)`, as PyTorch's `.to(dtype)`), convert the floating-point parameters and
        buffers to it instead (integer buffers stay); build the optimizer after this."""
        if isinstance(target, (np.dtype, type, str)):
            return self._to_dtype(dtypes.normalize_or_device_hint(target))
        q = as_queue(target)
        for m in self.modules():
            for p in m._parameters.values():
                if p is not None:
                    p.value = p.value.to(q)
                    p.grad = None
            for name, b in list(m._buffers.items()):
                if b is not None:
                    m._buffers[name] = b.to(q)
        for m in reversed(list(self.modules())):  # children first: a parent's hook sees them moved
            m._moved(q, None)
        return self

    def _to_dtype(self, dt: np.dtype) -> Module:
        if not dtypes.is_floating(dt):
            raise DTypeError(f"Module.to({dt}): parameters convert to a floating-point dtype only")
        for m in self.modules():
            for p in m._parameters.values():
                if p is not None and dtypes.is_floating(p.dtype) and p.dtype != dt:
                    p.value = p.value.astype(dt)
                    p.grad = None
            for name, b in list(m._buffers.items()):
                if b is not None and dtypes.is_floating(b.dtype) and b.dtype != dt \
                        and name not in type(m).kept_dtype_buffers:
                    m._buffers[name] = b.astype(dt)
        for m in reversed(list(self.modules())):
            m._moved(None, dt)
        return self

    def _moved(self, queue: Any, dtype: np.dtype | None) -> None:
        """Called on every module by Module.to once all parameters and buffers moved to `queue` (or were
        converted to `dtype`; the other argument None): a module that keeps device state which is neither
        (RoPE's tables, a stacked projection's matrix, a model's queue, dtype and recorded decode step)
        brings it along here. Nothing by default."""

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    def requires_grad_(self, flag: bool = True) -> Module:
        for p in self.parameters():
            p.requires_grad = flag
        return self

    def num_parameters(self) -> int:
        return sum(p.size for p in self.parameters())

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> OrderedDict[str, Tensor]:
        """Dotted name -> Tensor (parameters' values and buffers; the tensors themselves, not copies)."""
        out: OrderedDict[str, Tensor] = OrderedDict()
        for mod_name, m in self.named_modules():
            for name, p in m._parameters.items():
                if p is not None:
                    out[f"{mod_name}.{name}" if mod_name else name] = p.value
            for name, b in m._buffers.items():
                if b is not None:
                    out[f"{mod_name}.{name}" if mod_name else name] = b
        return out

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> tuple[list[str], list[str]]:
        """Copy values (Tensors or NumPy arrays) into parameters and buffers, in place.

        Returns (missing, unexpected) keys. With strict=True any missing or unexpected key raises
        StateDictError; a shape or dtype mismatch always does. Nothing is copied if anything is wrong.
        """
        if not hasattr(state_dict, "keys") or not hasattr(state_dict, "__getitem__"):
            raise TypeError(f"load_state_dict takes a mapping of name -> Tensor or array, got "
                            f"{type(state_dict).__name__}")
        own = self.state_dict()
        # keys PyTorch's version of a layer has and netcl's does not need (BatchNorm's num_batches_tracked):
        # a PyTorch state_dict loads without them counting as unexpected
        foreign = {f"{name}.{key}" if name else key for name, m in self.named_modules()
                   for key in type(m).foreign_state_keys}
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own and k not in foreign]
        problems = []
        values: dict[str, Any] = {}
        for k, target in own.items():
            if k not in state_dict:
                continue
            src = state_dict[k]
            if not isinstance(src, Tensor):  # arrays, lists, anything with __array__ (torch CPU tensors)
                try:
                    arr = np.asarray(src)
                except Exception as exc:  # noqa: BLE001  (whatever the object raises: reported per key)
                    problems.append(f"{k}: a {type(src).__name__} that is not an array ({exc})")
                    continue
                if arr.dtype == object:
                    problems.append(f"{k}: a {type(src).__name__}, not an array of numbers")
                    continue
                src = arr
            values[k] = src
            shape, dtype = tuple(src.shape), src.dtype
            if shape != target.shape:
                problems.append(f"{k}: shape {shape} in the state dict, {target.shape} in the model")
            elif np.dtype(dtype) != target.dtype:
                problems.append(
                    f"{k}: dtype {np.dtype(dtype)} in the state dict, {target.dtype} in the model"
                )
        if problems or (strict and (missing or unexpected)):
            lines = [f"load_state_dict into {type(self).__name__} failed:"]
            if missing:
                lines.append(f"  missing keys ({len(missing)}): {', '.join(missing)}")
            if unexpected:
                lines.append(f"  unexpected keys ({len(unexpected)}): {', '.join(unexpected)}")
            if problems:
                lines.append(f"  mismatched ({len(problems)}):")
                lines.extend(f"    {p}" for p in problems)
            raise StateDictError("\n".join(lines))
        for k, target in own.items():
            if k in values:
                src = values[k]
                if isinstance(src, Tensor):
                    src = src.to(target.queue) if src.queue is not target.queue else src
                    target.copy_(src)
                else:
                    target.copy_from_host(src)
        return missing, unexpected

    # -- calling ---------------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} defines no forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if profile_hooks.active:  # the module's scope labels the launches inside (one global read when off)
            return profile_hooks.call_module(self, args, kwargs)
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        if self._modules:
            lines[0] = lines[0]
            for name, m in self._modules.items():
                child = repr(m).replace("\n", "\n  ")
                lines.append(f"  ({name}): {child}")
            lines.append(")")
            return "\n".join(lines)
        return lines[0] + ")"
