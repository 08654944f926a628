"""Parameter updates on Tensors (kernels/optim.cl): fused optimizer steps (with float32 master weights for
float16/bfloat16 parameters), gradient-norm clipping, and dynamic loss scaling's unscale-and-check and
scale update.

netcl.optim and netcl.amp hold the hyperparameters, their checks, per-parameter state and schedules; the
launches are here. The update rule and its scalars reach the kernel by name: OPT=OPT_ADAM, and the scalars
as the kernel's own parameter names (lr=..., beta1=...), never as positions both sides must agree on.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from netcl import kernels
from netcl.core import capture, dtypes
from netcl.core.access import before_access
from netcl.core.tensor import Tensor
from netcl.errors import NetclError

# the update rules optim.cl defines (OPT_SGD, OPT_ADAM, ...), read from the file itself: one list, C's
_RULES = frozenset(
    m.lower() for m in re.findall(r"^#define OPT_([A-Z0-9_]+) \d+$", kernels.source("optim.cl"), re.M)
)
MAX_TENSORS_PER_LAUNCH = 8  # optim.cl's N_TENSORS
# optim.cl's TENSOR_ARGS(i): parameter, its offset, gradient, its offset, three state slots, master weights,
# length; GRAD_ARGS(i): gradient, its offset, length
_TENSOR_ARGS = [tuple(f"{name}{i}" for name in ("p", "po", "g", "go", "sa", "sb", "sc", "mw", "n"))
                for i in range(MAX_TENSORS_PER_LAUNCH)]
_GRAD_ARGS = [(f"x{i}", f"xo{i}", f"n{i}") for i in range(MAX_TENSORS_PER_LAUNCH)]
# optim.cl's sum_squares: elements a work-group sums for clip_grad_norm (16,384: a 25M-parameter GPT's
# norm is ~1,800 work-groups over every compute unit, where one work-group per gradient took 4 ms of its
# bfloat16 step on the H200)
_SQ_CHUNK = 1 << 14


def _grad_args(group: Sequence[Tensor]) -> dict[str, Any]:
    """optim.cl's GRAD_ARGS(i) of each gradient in `group` (one launch's): buffer, offset, length."""
    named: dict[str, Any] = {}
    for i, g in enumerate(group):
        named.update(zip(_GRAD_ARGS[i], (g.buffer, np.int64(g.offset), np.int64(g.size))))
    return named


def state_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype of optimizer state, master weights and clipping norms for parameters of `dtype`: float32 for
    float16/bfloat16 (mixed precision), else the parameters' own."""
    return dtypes.float32 if dtypes.is_half(dtype) else np.dtype(dtype)


def _items(queue: Any) -> int:
    return 1 if queue.device.capabilities.kind == "gpu" else 64  # elements per work-item (optim.cl)


def _scalars(hyper: dict[str, Any], dtype: np.dtype) -> dict[str, Any]:
    """Kernel arguments of the hyperparameters: flags as int, numbers in the parameters' dtype."""
    scalar = kernels.scalar_type(dtype)
    return {k: np.int32(v) if isinstance(v, (bool, np.bool_)) else scalar(v) for k, v in hyper.items()}


def _plan_values(hyper: dict[str, Any], dtype: np.dtype, into: dict[str, Any]) -> None:
    """The hyperparameters as a launch through the step's Plan takes them, written into `into`: a Python float
    or int as it is (the Plan sets it as the NumPy type _scalars gave it when the plan was built, the same
    bits, and only when it changed: most of them stay the same from step to step), a flag as int, anything
    else (a NumPy number) as _scalars makes it."""
    scalar = None
    for k, v in hyper.items():
        kind = type(v)
        if kind is float or kind is int:
            into[k] = v
        elif kind is bool:
            into[k] = int(v)
        else:
            if scalar is None:
                scalar = kernels.scalar_type(dtype)
            into[k] = np.int32(v) if isinstance(v, np.bool_) else scalar(v)


class StepLaunch:
    """An optimizer_step launch kept for the next steps of the same parameters, states and gradient layouts
    (netcl.optim's step memo). At its first call it makes a Plan of its own with the parameters', states' and
    masters' buffers and the offsets set once; each call sets the new gradients' buffers and the step's
    scalars and enqueues (the same launch, without the per-tensor checks and the fixed arguments set again).
    The Plan keeps those buffers alive as long as the launch is kept."""

    __slots__ = ("queue", "kernel", "global_size", "named", "grad_names", "hyper_names", "dtype", "_plan")

    def __init__(self, queue: Any, kernel: Any, global_size: tuple[int, ...], named: dict[str, Any],
                 grad_names: tuple[str, ...], hyper_names: tuple[str, ...], dtype: np.dtype):
        self.queue, self.kernel, self.global_size, self.named = queue, kernel, global_size, named
        self.grad_names, self.hyper_names, self.dtype = grad_names, hyper_names, dtype
        self._plan: Any = None

    def __call__(self, grads: Sequence[Tensor], hyper: dict[str, Any]) -> None:
        plan = self._plan
        if plan is None:   # (its dynamic arguments: the gradients, then the scalars, in the kernel's order)
            kernel = self.kernel
            args = kernel.positional((), self.named)
            dynamic = sorted(kernel.arg_index[n] for n in (*self.grad_names, *self.hyper_names))
            plan = self._plan = (kernel.plan(self.global_size, None, args, dynamic),
                                 [kernel.arg_names[i] for i in dynamic])
        values = {name: g.buffer for name, g in zip(self.grad_names, grads, strict=True)}
        _plan_values(hyper, self.dtype, values)
        plan[0](self.queue, *map(values.__getitem__, plan[1]))


def optimizer_step(rule: str, params: Sequence[Tensor], grads: Sequence[Tensor],
                   states: Sequence[Sequence[Tensor | None]], hyper: dict[str, Any],
                   refresh: Callable[[], dict[str, Any]] | None = None,
                   masters: Sequence[Tensor] | None = None, found_inf: Tensor | None = None
                   ) -> StepLaunch | None:
    """One launch of update `rule` (an OPT_ name of optim.cl, lower case: "sgd", "adam", "rmsprop") over up
    to 8 contiguous parameters of one queue and dtype (updated in place), their gradients, and each one's
    state tensors in the rule's slot order (sa, sb, sc; None where its hyperparameters use none: the
    kernel does not touch that slot). `hyper` gives the rule's scalars by their kernel
    names. Under a graph capture, `refresh()` gives the scalars of each replay (the next step's).

    float16/bfloat16 parameters need `masters`: one contiguous float32 tensor per parameter, the weights the
    update really keeps (state is float32 too); the kernel updates the master and writes the parameter
    rounded from it. `found_inf` (int32, shape (1,), from unscale_grads): when nonzero on the device the
    launch changes nothing, so an overflowing AMP step is skipped without the host reading the flag.

    Returns the launch as a StepLaunch for later steps of the same tensors (None under a graph capture,
    with found_inf, or when there was nothing to update)."""
    if rule not in _RULES:
        raise ValueError(f"update rule must be one of {sorted(_RULES)} (optim.cl's OPT_ names), got {rule!r}")
    if not 0 < len(params) <= MAX_TENSORS_PER_LAUNCH or not len(params) == len(grads) == len(states):
        raise ValueError(
            f"optimizer_step: 1 to {MAX_TENSORS_PER_LAUNCH} parameters with one gradient and one "
            f"state list each, got {len(params)}, {len(grads)} and {len(states)}"
        )
    p0 = params[0]
    queue = p0.queue
    half = dtypes.is_half(p0.dtype)
    if half and (masters is None or len(masters) != len(params)):
        raise NetclError(f"optimizer_step: {p0.dtype} parameters need one float32 master tensor each")
    if found_inf is not None:
        _check_flag(found_inf, queue, "optimizer_step")
    items = _items(queue)
    dynamic: dict[str, Any] = {}  # the arguments that change per call, by name: buffers and scalars
    layout: list[int] = []  # the fixed ones (offsets, lengths): with the rest of the key, they pick the plan
    total = 0
    for i, (v, g, st) in enumerate(zip(params, grads, states)):
        # a gradient laid out as its parameter (the usual case) is contiguous when the parameter is
        if not (v.is_contiguous() and (g.strides == v.strides or g.is_contiguous())) or g.shape != v.shape \
                or g.dtype != v.dtype \
                or v.queue is not queue or v.dtype != p0.dtype:
            raise NetclError(
                f"optimizer_step: parameter {i} ({v.shape}, {v.dtype}) and its gradient ({g.shape}, "
                f"{g.dtype}) must be contiguous, of one shape, and share the first's queue and dtype"
            )
        master = v
        if half:
            master = masters[i]
            if master.dtype != dtypes.float32 or master.shape != v.shape or not master.is_contiguous() \
                    or master.offset or master.queue is not queue:
                raise NetclError(
                    f"optimizer_step: the master weights of parameter {i} must be a contiguous float32 "
                    f"tensor of shape {v.shape} on its queue, got {master.dtype} {master.shape}"
                )
        # Tensor.buffer's usual case read in place (nothing pending, no before-access hook to run): four
        # buffers per parameter and step
        plain = not before_access
        master_buffer = master._storage.buffer if plain and master._pending is None else master.buffer
        p_name, _, g_name, _, sa, sb, sc, mw, _ = _TENSOR_ARGS[i]
        dynamic[p_name] = master_buffer if master is v else v.buffer
        dynamic[g_name] = g._storage.buffer if plain and g._pending is None else g.buffer
        dynamic[mw] = master_buffer
        for name, s in zip((sa, sb, sc), st):
            dynamic[name] = master_buffer if s is None else (
                s._storage.buffer if plain and s._pending is None else s.buffer)
        for name in (sa, sb, sc)[len(st):]:
            dynamic[name] = master_buffer
        size = math.prod(v.shape)
        layout += (v.offset, g.offset, size)
        total += -(-size // items)
    if not total:
        kernels.float_defines(p0.dtype, rule, half=True)  # a dtype the kernel does not take is refused
        return None
    if found_inf is not None:
        dynamic["found_inf"] = found_inf.buffer
    # one Plan per (kernel, parameter offsets and lengths): the buffers and the step's scalars change per call
    key = ("optimizer_step", id(queue.device), rule, p0.dtype, half, found_inf is not None, total,
           tuple(layout))
    hit = capture.plans.get(key)
    if hit is None:
        dynamic.update(_scalars(hyper, p0.dtype))  # the plan learns each scalar's type from these
        defines: dict[str, Any] = {**kernels.float_defines(p0.dtype, rule, half=True),
                                   "N_TENSORS": len(params), "OPT": f"OPT_{rule.upper()}", "ITEMS": items}
        if half:
            defines["MASTER"] = None
        if found_inf is not None:
            defines["FOUND_INF"] = None
        kernel = kernels.program(queue.device, "optim.cl", **defines).optimizer_step
        named = dict(dynamic)
        for i in range(len(params)):
            _, po, _, go, *_, n = _TENSOR_ARGS[i]
            named[po], named[go], named[n] = (np.int64(x) for x in layout[3 * i:3 * i + 3])
        args = kernel.positional((), named)
        order = [i for i, n in enumerate(kernel.arg_names) if n in dynamic]
        hit = capture.plans.put(key, (kernel, kernel.plan((total,), None, args, order),
                                      [kernel.arg_names[i] for i in order]))
    else:
        _plan_values(hyper, p0.dtype, dynamic)
    kernel, plan, names = hit
    plan(queue, *map(dynamic.__getitem__, names))
    graph = capture.capturing()
    if graph is not None and refresh is not None:
        index, dtype = kernel.arg_index, p0.dtype

        def on_replay(args: list) -> None:
            for name, value in _scalars(refresh(), dtype).items():
                args[index[name]] = value

        graph.on_replay(on_replay)
    if graph is not None or found_inf is not None:
        return None
    named = dict(dynamic)
    named.update(_scalars(hyper, p0.dtype))   # (the scalars' types, as the step's own Plan learned them)
    for i in range(len(params)):
        _, po, _, go, *_, n = _TENSOR_ARGS[i]
        named[po], named[go], named[n] = (np.int64(x) for x in layout[3 * i:3 * i + 3])
    grad_names = tuple(_TENSOR_ARGS[i][2] for i in range(len(params)))
    for name in grad_names:
        named[name] = None   # (set at each call: this step's gradients are not kept)
    return StepLaunch(queue, kernel, (total,), named, grad_names, tuple(hyper), p0.dtype)


def _check_flag(found_inf: Tensor, queue: Any, what: str) -> None:
    if not isinstance(found_inf, Tensor) or found_inf.dtype != dtypes.int32 or found_inf.shape != (1,) \
            or found_inf.queue is not queue:
        raise NetclError(f"{what}: found_inf must be an int32 Tensor of shape (1,) on the parameters' queue")


def clip_grad_norm(grads: Sequence[Tensor], max_norm: float, error_if_nonfinite: bool = False) -> Tensor:
    """Scale `grads` in place by min(1, max_norm / (norm + 1e-6)), norm their joint L2 norm, and return
    the norm before clipping as a Tensor of shape (1,): 2 ceil(N / 8) + 1 launches for N gradients (partial
    sums of 16,384-element chunks over 8 gradients a launch, the coefficient, the scaling), no host sync.
    error_if_nonfinite: read the norm back first and raise NetclError, scaling nothing, when it is NaN or
    infinite. float16/bfloat16 gradients accumulate in
    float32, and the norm is float32."""
    if not grads:
        raise NetclError("clip_grad_norm_: no parameter has a gradient (call backward first)")
    key = capture.call_key("clip_grad_norm", tuple(grads), max_norm, error_if_nonfinite,
                           align=None)  # the offsets are the launches' (fixed) arguments
    fast = capture.plans.get(key) if key is not None else None
    if fast is not None:  # the same gradients' layout as a call before: its launches, no checks again
        return fast(grads)
    queue, dtype = grads[0].queue, grads[0].dtype
    for g in grads:
        if g.queue is not queue or g.dtype != dtype:
            raise NetclError("clip_grad_norm_: all gradients must share one queue and one dtype")
        if not g.is_contiguous():
            raise NetclError(
                f"clip_grad_norm_: a gradient of shape {g.shape} is not contiguous; gradients are scaled "
                "in place, so they must be contiguous"
            )
    wg = kernels.work_group(queue.device)
    acc = state_dtype(dtype)
    groups = [grads[i:i + MAX_TENSORS_PER_LAUNCH] for i in range(0, len(grads), MAX_TENSORS_PER_LAUNCH)]
    programs = [kernels.program(queue.device, "optim.cl", **kernels.float_defines(dtype, "clip_grad_norm_",
                                                                                 half=True),
                                WG=wg, N_TENSORS=len(group), ITEMS=_items(queue), SQ_CHUNK=_SQ_CHUNK)
                for group in groups]
    chunks = [sum(-(-g.size // _SQ_CHUNK) for g in group) for group in groups]
    items = _items(queue)
    # the Plans of the launches (each group's sums of squares, the coefficient, each group's scaling; None
    # for a group of empty gradients): the gradients' offsets and lengths fixed, their buffers and the
    # workspaces given per call
    plans, first = [], 0
    for prg, group, n in zip(programs, groups, chunks):
        lengths = _grad_args(group)  # each gradient's buffer (given per call), offset and length (fixed)
        buffers = {x: lengths.pop(x) for x, _, _ in _GRAD_ARGS[:len(group)]}
        total_items = sum(-(-g.size // items) for g in group)
        plans.append((
            prg.sum_squares.plan_named((n * wg,), (wg,), {**lengths, "first": np.int64(first)},
                                       {**buffers, "partial": group[0].buffer}) if n else None,
            prg.scale_by.plan_named((total_items,), None, lengths, {**buffers, "norm": group[0].buffer})
            if total_items else None, len(group)))
        first += n
    coef = programs[0].clip_coef.plan_named((wg,), (wg,), {"count": np.int32(first),
                                                         "max_norm": kernels.scalar_type(acc)(max_norm)},
                                            {"partial": grads[0].buffer, "norm": grads[0].buffer})
    fast = _clip_launches(plans, coef, max(first, 1), acc, bool(error_if_nonfinite))
    if key is not None:
        capture.plans.put(key, fast)
    return fast(grads)


def _clip_launches(plans: list, coef: Any, partials: int, acc: np.dtype, check: bool) -> Any:
    """clip_grad_norm's call through its Plans (`plans`: per launch group (its sums' Plan, its scaling's
    Plan, its gradients' count); `partials`: the partial sums' count); `check`: error_if_nonfinite's host
    read between the coefficient and the scaling."""

    def run(grads: Sequence[Tensor]) -> Tensor:
        queue = grads[0].queue
        partial = Tensor.empty(queue, (partials,), acc)
        norm = Tensor.empty(queue, (2,), acc)
        buffers = [g.buffer for g in grads]
        start = 0
        for squares, _, n in plans:
            if squares is not None:
                squares(queue, *buffers[start:start + n], partial.buffer)
            start += n
        coef(queue, partial.buffer, norm.buffer)
        if check:
            total = float(norm.to_host()[0])
            if not math.isfinite(total):
                raise NetclError(
                    f"clip_grad_norm_: the total norm of order 2.0 of the gradients is {total}, so they "
                    "cannot be clipped; the gradients were left as they are (error_if_nonfinite=False scales "
                    "them anyway)")
        start = 0
        for _, scale, n in plans:
            if scale is not None:
                scale(queue, *buffers[start:start + n], norm.buffer)
            start += n
        return norm[0:1]

    return run


def unscale_grads(grads: Sequence[Tensor], scale: Tensor, found_inf: Tensor) -> None:
    """Multiply every gradient in place by 1 / scale[0] (a float32 Tensor of shape (1,)) and set found_inf[0]
    (int32, shape (1,)) to 1 where any result is infinite or NaN; found_inf is only ever set, never cleared.
    One launch per dtype and chunk of 8 gradients; nothing is read back."""
    if not grads:
        return
    queue = grads[0].queue
    _check_flag(found_inf, queue, "unscale_grads")
    if scale.dtype != dtypes.float32 or scale.shape != (1,) or scale.queue is not queue:
        raise NetclError(
            "unscale_grads: scale must be a float32 Tensor of shape (1,) on the gradients' queue"
        )
    by_dtype: dict[np.dtype, list[Tensor]] = {}
    for g in grads:
        if g.queue is not queue or not g.is_contiguous() or not dtypes.is_floating(g.dtype):
            raise NetclError(
                f"unscale_grads: gradients must be contiguous floating tensors of one queue, got "
                f"{g.dtype} {g.shape}"
            )
        by_dtype.setdefault(g.dtype, []).append(g)
    items = _items(queue)
    for dt, group in by_dtype.items():
        for start in range(0, len(group), MAX_TENSORS_PER_LAUNCH):
            chunk = group[start:start + MAX_TENSORS_PER_LAUNCH]
            prg = kernels.program(
                queue.device,
                "optim.cl",
                **kernels.float_defines(dt, "unscale_", half=True),
                N_TENSORS=len(chunk),
                ITEMS=items,
            )
            total = sum(-(-g.size // items) for g in chunk)
            if total:
                prg.unscale_grads(
                    queue, (total,), None, **_grad_args(chunk), scale=scale.buffer, found_inf=found_inf.buffer
                )


def update_scale(scale: Tensor, growth_tracker: Tensor, found_inf: Tensor, growth_factor: float,
                 backoff_factor: float, growth_interval: int) -> None:
    """torch's _amp_update_scale_ on the device (one launch, one work-item): back off on found_inf, else grow
    every growth_interval clean steps (see optim.cl)."""
    queue = scale.queue
    _check_flag(found_inf, queue, "update_scale")
    prg = kernels.program(queue.device, "optim.cl", dtype=dtypes.float32)
    prg.update_scale(queue, (1,), None, scale=scale.buffer, growth_tracker=growth_tracker.buffer,
                     found_inf=found_inf.buffer, growth_factor=np.float32(growth_factor),
                     backoff_factor=np.float32(backoff_factor), growth_interval=np.int32(growth_interval))
