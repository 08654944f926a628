"""The differentiable op of each declaration (netcl.ops.declaration.OpDecl), generated, and Node's methods.

For `OpDecl("layer_norm", forward=norm.layer_norm, backward=norm.layer_norm_backward, inputs=("x",
"weight", "bias"), saves=("mean", "rstd"), autocast="half")` this module writes and compiles, once:

    def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-05):
        if _autocast.stack:
            x, weight, bias = _cast_inputs("layer_norm", x, weight, bias)
        if not _isinstance(x, _Node):
            x = _as_node(x)
        ...                                     # weight and bias likewise, when given
        x_v = x.value ...
        out, mean, rstd = _forward(x_v, normalized_shape, weight_v, bias_v, eps)
        def backward(g):                        # keeps exactly what the rule reads
            return _backward(g, x=x_v, normalized_shape=normalized_shape, mean=mean, rstd=rstd, ...)
        return _record(out, parents, backward, "layer_norm")

Generated source, not a generic wrapper: the op has the forward's own signature (help() and errors read
as the forward's) and binds no arguments per call; forward and backward together enter no more Python
functions than the hand-written rules did (no as_node or cast_inputs call for what is already a Node
outside autocast; a rule the hand-written closure inlined is one frame deeper: bench/NOTES.md). The
`backward` closure names the launches of the rule in the profiler (`layer_norm.backward`).

Ops whose rule needs the graph itself (linear folds its producer's relu into its input gradient) are
declared `autograd="manual"` and register their hand-written function with `implements`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from netcl.autograd import autocast, engine
from netcl.autograd.engine import Node, as_node, record
from netcl.core import template
from netcl.core.shapes import torch_names
from netcl.ops import declaration
from netcl.ops.declaration import Layout, OpDecl

# name -> the differentiable op of every declaration that has one (generated or hand-written)
OPS: dict[str, Callable[..., Any]] = {}
_SOURCES: dict[str, str] = {}  # name -> the generated source (for tests and for reading)


def _pick(grads: Any, keep: tuple[int, ...]) -> tuple:
    """The gradients of the inputs given (an optional input passed as None has no parent)."""
    return tuple(map(grads.__getitem__, keep))


def _on_values(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` (a function of Tensors: argmax) taking a Node as its Tensor."""

    def on_value(x: Any, *args: Any) -> Any:
        return fn(x.value if isinstance(x, Node) else x, *args)

    return on_value


def _on_nodes(p: inspect.Parameter, decl: OpDecl) -> inspect.Parameter:
    """The forward's parameter as the op takes it: an input a Node (a Tensor is wrapped), a constant a Node
    or what the forward takes."""
    ann = "" if p.annotation is p.empty else str(p.annotation)
    if p.name in decl.inputs:
        return p.replace(annotation=ann.replace("Tensor", "Node") if "Tensor" in ann else "Node")
    if p.name in decl.constants:
        return p.replace(annotation=f"Node | {ann}" if ann else "Any")
    return p


_optional = declaration.may_be_none  # an input that may be None (batch_norm's weight)


def _source(decl: OpDecl) -> tuple[str, dict[str, Any]]:
    """The op's source and the values its defaults and body read."""
    params = {n: p for n, p in decl.parameters().items() if n not in decl.hide and n != "needs"}
    forward = inspect.unwrap(decl.forward)  # a torch_names wrapper: the generated op gets its own
    optional = [n for n in decl.inputs if _optional(params[n])]
    env: dict[str, Any] = {}

    # the signature: the forward's parameter names; defaults bound by name in env
    head, seen_kwonly = [], False
    for i, (n, p) in enumerate(params.items()):
        if p.kind == p.KEYWORD_ONLY and not seen_kwonly:
            head.append("*")
            seen_kwonly = True
        if p.kind == p.VAR_KEYWORD:
            raise ValueError(f"OpDecl {decl.name!r}: the forward may not take **kwargs ({n})")
        if p.kind == p.VAR_POSITIONAL:  # reshape(x, *shape)
            head.append(f"*{n}")
            seen_kwonly = True
        elif p.default is p.empty:
            head.append(n)
        else:
            env[f"_d{i}"] = p.default
            head.append(f"{n}=_d{i}")
    lines = [f"def {decl.name}({', '.join(head)}):"]
    casts = decl.cast_inputs()
    wants_wide = decl.backward is not None and "wide" in decl.backward_arguments()
    if wants_wide:  # per input: whether autocast widened it here (declaration's `wide`)
        lines.append(f"    wide = {(False,) * len(decl.inputs)!r}")
    if casts:
        names = ", ".join(casts)
        lines += ["    if _autocast.stack:"]
        if wants_wide:
            lines.append(f"        _given = ({names},)")
        lines.append(f"        {names}, = _cast_inputs({decl.name!r}, {names})")
        if wants_wide:
            lines.append("        wide = (" + "".join(
                f"_widened(_given[{casts.index(n)}], {n}), " if n in casts else "False, "
                for n in decl.inputs) + ")")
    for n in decl.inputs:
        if n in optional:
            lines += [f"    if {n} is not None and not _isinstance({n}, _Node):",
                      f"        {n} = _as_node({n})", f"    {n}_v = None if {n} is None else {n}.value"]
        else:
            lines += [f"    if not _isinstance({n}, _Node):", f"        {n} = _as_node({n})",
                      f"    {n}_v = {n}.value"]
    for n in decl.constants:
        lines.append(f"    if _isinstance({n}, _Node):\n        {n} = {n}.value")

    # the forward's call: positional up to the first hidden or keyword-only parameter, then by name
    value = {n: (f"{n}_v" if n in decl.inputs else n) for n in params}
    args, by_name = [], False
    for n, p in decl.parameters().items():
        if n == "needs":
            by_name = True
            args.append("needs=needs")
            continue
        if n in decl.hide:
            by_name = True
            continue
        by_name = by_name or p.kind == p.KEYWORD_ONLY
        if p.kind == p.VAR_POSITIONAL:
            args.append(f"*{n}")
            continue
        args.append(f"{n}={value[n]}" if by_name else value[n])
    wants_needs = "needs" in decl.parameters() or "needs" in decl.backward_arguments()
    if wants_needs:  # whether each input gets a gradient: a tape records and it requires one
        lines.append("    recording = _engine.grad_enabled and bool(_engine.tapes)")
        lines.append("    needs = (" + "".join(
            f"recording and {n} is not None and {n}.requires_grad, " if n in optional
            else f"recording and {n}.requires_grad, " for n in decl.inputs) + ")")
    results = ", ".join(("out",) + decl.saves)
    if decl.replay is None:
        lines.append(f"    {results}{',' if decl.saves else ''} = _forward({', '.join(args)})")
    else:   # (netcl.core.template: the call replayed from its signature's template)
        named = [f"{n!r}: {'needs' if n == 'needs' else value[n]}" for n in decl.parameters()
                 if n not in decl.hide]
        lines.append(f"    {results}{',' if decl.saves else ''} = _replayed({decl.name!r}, _forward, "
                     f"{{{', '.join(named)}}}, _switch_values({decl.replay!r}))")

    # parents: the inputs given, in declaration order
    lead = []  # the inputs before the first optional one: the tuple's start
    for n in decl.inputs:
        if n in optional:
            break
        lead.append(n)
    lines.append(f"    parents = ({''.join(n + ', ' for n in lead)})")
    for n in decl.inputs[len(lead):]:
        lines.append(f"    if {n} is not None:\n        parents += ({n},)" if n in optional
                     else f"    parents += ({n},)")
    if optional:
        lines += ["    keep = None", f"    if len(parents) != {len(decl.inputs)}:", "        keep = ()"]
        for i, n in enumerate(decl.inputs):
            lines.append(f"        if {n} is not None:\n            keep += ({i},)" if n in optional
                         else f"        keep += ({i},)")

    # the backward's arguments, by name: what it reads is all the closure keeps
    available = {n: value[n] for n in params}
    available.update({s: s for s in decl.saves}, out="out", needs="needs", wide="wide")
    available.update({f"{n}_{form}": f"{n}_{form}" for form in ("shape", "layout") for n in decl.inputs})
    sums = decl.sums()
    available.update({f"{n}_into": f"{n}_into" for n in sums})
    if decl.inputs:
        available["input_shape"] = f"{decl.inputs[0]}_shape"
    bargs = [f"{n}={available[n]}" for n in decl.backward_arguments()]
    used = {a.split("=", 1)[1] for a in bargs}
    form = {}  # per input of `sums`: what the backward reads its shape, dtype and queue from
    for n in sums:  # (the input's Tensor where the backward keeps it anyway, else its layout)
        form[n] = f"{n}_v" if f"{n}_v" in used else f"{n}_layout"
        if form[n] == f"{n}_layout" and f"{n}_layout" not in used:
            lines.append(f"    {n}_layout = _layout({n}_v)")
    for n in decl.inputs:
        if f"{n}_shape" in used:
            lines.append(f"    {n}_shape = None if {n}_v is None else {n}_v.shape" if n in optional
                         else f"    {n}_shape = {n}_v.shape")
        if f"{n}_layout" in used:
            lines.append(f"    {n}_layout = None if {n}_v is None else _layout({n}_v)" if n in optional
                         else f"    {n}_layout = _layout({n}_v)")
    gname = decl.gradient_parameter()
    first = next(iter(inspect.signature(decl.backward).parameters))
    call = f"_backward({'g' if gname == first else 'grad_out=g'}{''.join(', ' + a for a in bargs)})"
    if decl.replay is not None:
        named = [f"{gname!r}: g"] + [f"{a.split('=', 1)[0]!r}: {a.split('=', 1)[1]}" for a in bargs]
        call = (f"_replayed({decl.name + '.backward'!r}, _backward, {{{', '.join(named)}}}, "
                f"_switch_values({decl.replay!r}))")
    lines += ["    def backward(g):"]
    for n in sums:  # (a required input: its place among the parents is its place among the inputs)
        lines.append(f"        {n}_into = _partial({decl.inputs.index(n)}, {form[n]}.shape, {form[n]}.dtype, "
                     f"{form[n]}.queue)")
    if optional:
        lines += [f"        grads = {call}", "        return grads if keep is None else _pick(grads, keep)"]
    elif len(decl.inputs) == 1:
        lines += [f"        return ({call},)"]
    else:
        lines += [f"        return {call}"]
    lines.append(f"    return _record(out, parents, backward, {decl.name!r}{', True' if sums else ''})")
    env.update(_partial=engine.partial_gradient, _forward=forward, _backward=decl.backward,
               _autocast=autocast._state,
               _cast_inputs=autocast.cast_inputs, _widened=autocast.widened, _isinstance=isinstance,
               _Node=Node, _as_node=as_node, _record=record, _layout=Layout.of, _engine=engine._state,
               _pick=_pick, _replayed=template.replayed, _switch_values=template.switch_values,
               __name__=__name__)
    return "\n".join(lines) + "\n", env


def _generate(decl: OpDecl) -> Callable[..., Any]:
    source, env = _source(decl)
    code = compile(source, f"<netcl.autograd op {decl.name}>", "exec")
    exec(code, env)  # noqa: S102  (our own source, made from the declaration above)
    fn = env[decl.name]
    fn.__module__ = __name__
    fn.__qualname__ = decl.name
    hidden = (*decl.hide, "needs")
    kept = [_on_nodes(p, decl) for p in decl.parameters().values() if p.name not in hidden]
    fn.__signature__ = inspect.Signature(kept, return_annotation="Node")
    summary = (decl.doc or decl.forward.__doc__ or f"{decl.name}.").strip()
    fn.__doc__ = f"{summary}\n\nOn Nodes: differentiable ({', '.join(decl.inputs)}), declared in " \
                 f"{decl.forward.__module__}."
    _SOURCES[decl.name] = source
    if getattr(decl.forward, "torch_names", False):  # the forward takes dim=/keepdim=: so does the op
        indices = decl.forward.torch_names_indices  # max(x, dim=d): (values, indices), the indices a Tensor
        if indices is not None:
            env[indices] = _on_values(inspect.unwrap(decl.forward).__globals__[indices])
        fn = torch_names(fn, indices=indices)
    return fn


def _install(decl: OpDecl) -> None:
    if decl.autograd == "generated":
        _add(decl, _generate(decl))
    elif decl.autograd == "manual" and decl.name in _manual:
        _add(decl, _manual[decl.name])


def _add(decl: OpDecl, fn: Callable[..., Any]) -> None:
    OPS[decl.name] = fn
    for method in decl.methods:
        setattr(Node, method, fn)


def _remove(decl: OpDecl) -> None:
    OPS.pop(decl.name, None)
    _SOURCES.pop(decl.name, None)
    for method in decl.methods:
        if method in vars(Node):
            delattr(Node, method)


_manual: dict[str, Callable[..., Any]] = {}


def implements(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: `fn` is the hand-written differentiable op of the declaration `name` (autograd="manual")."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        _manual[name] = fn
        decl = declaration.get(name)
        if decl.autograd != "manual":
            raise ValueError(f"@implements({name!r}): its declaration says autograd={decl.autograd!r}")
        _add(decl, fn)
        return fn

    return register


def source(name: str) -> str:
    """The generated source of the op `name` (what `_generate` compiled)."""
    return _SOURCES[name]


declaration.subscribe(_install, _remove)

__all__: list[str] = []
