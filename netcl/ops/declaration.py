"""One declaration per op (OpDecl): its forward launcher and backward on Tensors, the tensors it saves, its
autocast rule, its Tensor/Node method names and its nn.functional names, written once beside the forward.

Each layer that shows ops makes its surface from these records as they are declared (`subscribe`):
netcl.autograd the differentiable op on Nodes and Node's methods, netcl.ops.operators Tensor's methods,
netcl.amp.policy the autocast table, netcl.nn.functional the functional names. A declaration is all a new
op needs beyond its kernels and its test:

    declare(OpDecl("layer_norm", forward=layer_norm, backward=layer_norm_backward,
                   inputs=("x", "weight", "bias"), saves=("mean", "rstd"), autocast="half",
                   functional=("layer_norm",)))

The differentiable op takes the forward's parameters (less `hide`), Nodes where `inputs` and `constants`
are, and calls the forward with their values. The forward returns its result, or the result and then one
tensor (or value) per name of `saves`. The backward's parameter `grad_out` (else its first) is the result's
gradient; each other parameter is filled by name, once, when the forward runs (only what it names is kept
until backward):

    a parameter of the forward (the value given; an input's Tensor)    `out` (the forward's result)
    a name of `saves`              `<input>_shape` (an input's shape; `input_shape` the first input's)
    `needs` (per input, whether it gets a gradient: a tape records and it requires one)
    `<input>_layout` (an input's Layout: shape, strides, dtype and queue, not its memory)
    `wide` (per input, whether autocast cast it from float32 to half for this call: its gradient may be
    returned in float32, which the cast passes on unchanged; a weight gradient's float32 sums need not be
    rounded to half and widened again)
    `<input>_into` (filled when backward runs, not when the forward does: the input's gradient summed so far
    from the other ops that read it, a Tensor of the input's shape and dtype or None; a backward that takes
    it adds it into the input's gradient it returns, in its own launch instead of a separate add:
    netcl.autograd.engine.partial_gradient; for the inputs before the first that may be None)

A backward that needs an input's form and not its values names the shape or the layout: the input's memory
is then not kept for it (rope's input, rotated into the next op's, goes back to the pool in the forward).

A forward parameter `needs` is filled the same way (and is not the op's). A backward parameter with a
default that none of these names keeps its default. The backward returns one
gradient (or None) per name of `inputs`, in that order (an op of one input: the gradient itself); an
optional input given as None gets none.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

HALF_DTYPES = ("float16", "bfloat16")


class Layout(NamedTuple):
    """An input's form without its memory (a backward's `<input>_layout`): what allocating a gradient in the
    input's own memory order needs."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: Any
    queue: Any

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @classmethod
    def of(cls, t: Any) -> Layout:
        return cls(t.shape, t.strides, t.dtype, t.queue)


@dataclass(frozen=True)
class OpDecl:
    """What one op is, everywhere it shows (see the module docstring for the forward/backward contract).

    name: the op's name: the differentiable op in netcl.autograd, its autocast key, its node's label.
    forward: the launcher on Tensors. backward: the rule on Tensors; None for an op whose differentiable
    form netcl.autograd writes by hand on Nodes (`autograd="manual"`) or that has no gradient.
    inputs: the differentiable Tensor parameters, in the order of the node's parents (one whose default
    or annotation is None is optional). constants: parameters that may be Nodes but get no gradient (their
    values are passed). saves: names of the forward's extra results. hide: forward parameters the
    differentiable op does not take (their defaults are used).
    autocast: None (the op follows its inputs), "half" (floating inputs in the autocast dtype where
    `half_dtypes` lists it, else float32) or "float32" (half inputs widened); cast: the inputs cast
    (default: all of `inputs`).
    methods: names under which the op is a method of Tensor (the forward; a Tensor method given as the
    forward is left as it is) and of Node (the differentiable op). functional: its names in
    netcl.nn.functional (the differentiable op).
    autograd: "generated" (made from forward and backward), "manual" (netcl.autograd defines it by this
    name) or "none" (no differentiable op: methods are Tensor's alone).
    replay: for a generated op whose launches depend only on its tensors' layouts, its other arguments and
    the module switches of this package (e.g. "netcl.ops.conv"): its forward and backward calls are replayed
    from a template per call signature (netcl.core.template), not run through their Python again.
    """

    name: str
    forward: Callable[..., Any]
    backward: Callable[..., Any] | None = None
    inputs: tuple[str, ...] = ()
    constants: tuple[str, ...] = ()
    saves: tuple[str, ...] = ()
    hide: tuple[str, ...] = ()
    autocast: str | None = None
    half_dtypes: tuple[str, ...] = HALF_DTYPES
    cast: tuple[str, ...] | None = None
    methods: tuple[str, ...] = ()
    functional: tuple[str, ...] = ()
    autograd: str = "generated"
    replay: str | None = None
    doc: str = ""

    def __post_init__(self) -> None:
        if self.autograd not in ("generated", "manual", "none"):
            raise ValueError(f"OpDecl {self.name!r}: autograd must be 'generated', 'manual' or 'none', "
                             f"got {self.autograd!r}")
        if self.autograd == "generated" and self.backward is None:
            raise ValueError(f"OpDecl {self.name!r}: a generated op needs a backward (or autograd='manual')")
        if self.autocast not in (None, "half", "float32"):
            raise ValueError(f"OpDecl {self.name!r}: autocast must be None, 'half' or 'float32', "
                             f"got {self.autocast!r}")
        bad = [d for d in self.half_dtypes if d not in HALF_DTYPES]
        if bad:
            raise ValueError(f"OpDecl {self.name!r}: half_dtypes must be among {HALF_DTYPES}, got {bad}")
        params = self.parameters()
        missing = [n for n in (*self.inputs, *self.constants, *self.hide) if n not in params]
        if missing:
            raise ValueError(f"OpDecl {self.name!r}: {missing} are not parameters of "
                             f"{self.forward.__name__}{inspect.signature(self.forward)}")
        stray = [n for n in self.cast_inputs() if n not in self.inputs]
        if stray:
            raise ValueError(f"OpDecl {self.name!r}: cast {stray} must name inputs {self.inputs}")
        if self.methods and self.saves:
            raise ValueError(f"OpDecl {self.name!r}: a method is the forward on Tensors, so the forward "
                             f"of an op with methods {self.methods} returns its result alone (no saves "
                             f"{self.saves})")
        if self.backward is not None:
            self.backward_arguments()
        if self.replay is not None and (self.autograd != "generated" or any(
                p.kind in (p.VAR_POSITIONAL, p.POSITIONAL_ONLY) for p in self.parameters().values())):
            raise ValueError(f"OpDecl {self.name!r}: replay is for a generated op whose forward takes its "
                             f"arguments by name")

    def available(self) -> tuple[str, ...]:
        """The names a backward's parameters may take (the module docstring's list)."""
        signature = self.parameters()
        params = [n for n in signature if n not in self.hide]
        shapes = [f"{n}_{form}" for form in ("shape", "layout") for n in self.inputs]
        shapes += ["input_shape"] if self.inputs else []
        into = []  # the inputs before the first that may be None (each one's place among the node's parents)
        for n in self.inputs:
            if may_be_none(signature[n]):
                break
            into.append(f"{n}_into")
        return (*params, *self.saves, "out", "needs", "wide", *shapes, *into)

    def sums(self) -> tuple[str, ...]:
        """The inputs whose gradient so far the backward adds into its own (`<input>_into`)."""
        if self.backward is None:
            return ()
        names = self.backward_arguments()
        return tuple(n for n in self.inputs if f"{n}_into" in names)

    def gradient_parameter(self) -> str:
        """The backward's parameter that takes the result's gradient: `grad_out`, else the first."""
        assert self.backward is not None
        params = list(inspect.signature(self.backward).parameters)
        if not params:
            raise ValueError(f"OpDecl {self.name!r}: the backward takes the result's gradient (grad_out)")
        return "grad_out" if "grad_out" in params else params[0]

    def backward_arguments(self) -> tuple[str, ...]:
        """The backward's parameters after the gradient that the op fills (ValueError for a name it cannot
        fill that has no default)."""
        assert self.backward is not None
        available = set(self.available())
        bound = []
        for p in inspect.signature(self.backward).parameters.values():
            if p.name == self.gradient_parameter():
                continue
            if p.name in available:
                bound.append(p.name)
            elif p.default is p.empty:
                raise ValueError(f"OpDecl {self.name!r}: the backward's parameter {p.name!r} is none of "
                                 f"{sorted(available)} and has no default")
        return tuple(bound)

    def parameters(self) -> dict[str, inspect.Parameter]:
        """The forward's parameters (a torch_names wrapper's: the function it wraps; a Tensor method's `self`
        is the op's `x`)."""
        params = list(inspect.signature(self.forward).parameters.values())
        if params and params[0].name == "self":
            params[0] = params[0].replace(name="x")
        return {p.name: p for p in params}

    def cast_inputs(self) -> tuple[str, ...]:
        """The inputs autocast casts (none without an autocast rule)."""
        if self.autocast is None:
            return ()
        return self.inputs if self.cast is None else self.cast


def may_be_none(p: inspect.Parameter) -> bool:
    """A parameter that may be None: its default is None, or its annotation says so."""
    return p.default is None or "None" in str(p.annotation)


_DECLARED: dict[str, OpDecl] = {}
_listeners: list[tuple[Callable[[OpDecl], None], Callable[[OpDecl], None] | None]] = []


def declare(decl: OpDecl) -> OpDecl:
    """Register `decl` (a name declared once) and give it every surface whose layer has loaded."""
    if decl.name in _DECLARED:
        raise ValueError(f"op {decl.name!r} is declared twice")
    _DECLARED[decl.name] = decl
    for install, _ in list(_listeners):
        install(decl)
    return decl


def withdraw(name: str) -> None:
    """Remove the declaration `name` and the surfaces made from it (tests declare toy ops)."""
    decl = _DECLARED.pop(name)
    for _, remove in reversed(_listeners):
        if remove is not None:
            remove(decl)


def subscribe(install: Callable[[OpDecl], None], remove: Callable[[OpDecl], None] | None = None) -> None:
    """Call `install(decl)` for every declaration, those made already and those to come (a layer making its
    surface of the ops); `remove(decl)` when one is withdrawn."""
    _listeners.append((install, remove))
    for decl in list(_DECLARED.values()):
        install(decl)


def declared() -> tuple[OpDecl, ...]:
    """Every declaration, in the order made."""
    return tuple(_DECLARED.values())


def get(name: str) -> OpDecl:
    return _DECLARED[name]


__all__: list[str] = []
