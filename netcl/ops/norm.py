"""Normalisation ops: BatchNorm2d (train/eval), LayerNorm, RMSNorm, GroupNorm; forward and backward.

The row norms are one kernel launch per direction (netcl/kernels/norm.cl); BatchNorm is a one-pass
per-channel reduction and an elementwise pass each way (netcl/kernels/norm_batch.cl). Forward functions
return the output and the statistics the backward needs (like PyTorch's native_* ops):
  batch_norm -> (out, save_mean, save_invstd)     layer_norm / group_norm -> (out, mean, rstd)
  rms_norm -> (out, rstd)
Statistics are accumulated in float32 for float32 tensors and float64 for float64 tensors. The row norms
also take float16/bfloat16 storage (float32 arithmetic; their mean/rstd are float32).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from netcl import kernels
from netcl.core import capture, dtypes, launch_labels
from netcl.core.tensor import Tensor, check_same_queue, contiguous_strides
from netcl.errors import DTypeError, ShapeError
from netcl.jit.reduce import row_group_size
from netcl.ops import elementwise, reduce
from netcl.ops.declaration import OpDecl, declare

# Work-group size per row/channel; None = by device kind (1 on CPUs, 256 on GPUs). Tests set it
# to exercise the GPU's local-memory reduction on the CPU device.
local_size_override: int | None = None


def _local_size(device: Any) -> int:
    if local_size_override is not None:
        return local_size_override
    return 1 if device.capabilities.kind == "cpu" else 256


def _program(device: Any, dt: np.dtype, relu: bool = False, vw: int = 4, local: int | None = None,
             pdt: np.dtype | None = None):
    """norm.cl for `dt`; vw: the elements a work-item of the vector kernels reads at once (_vector_width);
    local: their work-group (the device's halved by jit.reduce.row_group_size, the reductions' rule), else
    the device's; pdt: the parameters' dtype (float32 beside half rows: PARAM_F32), else dt."""
    if pdt is not None and pdt != dt:
        return kernels.program(device, "norm.cl", dtype=dt, act="relu" if relu else None,
                               LOCAL=local or _local_size(device), VW=vw, PARAM_F32=None)
    return kernels.program(
        device, "norm.cl", dtype=dt, act="relu" if relu else None, LOCAL=local or _local_size(device), VW=vw
    )


def _scalar(dt: np.dtype, v: float):
    return np.float64(v) if dt == dtypes.float64 else np.float32(v)


def _check_param(op: str, name: str, t: Tensor | None, shape: tuple[int, ...]) -> Tensor | None:
    if t is None:
        return None
    if tuple(t.shape) != shape:
        raise ShapeError(f"{op}: {name} must have shape {shape}, got {tuple(t.shape)}")
    return t.contiguous()


def _activation_flag(op: str, activation: str | None) -> bool:
    if activation not in (None, "relu"):
        raise ValueError(f"{op}: activation must be None or 'relu', got {activation!r}")
    return activation == "relu"


# -- BatchNorm -----------------------------------------------------------------------------------
# kernels/norm_batch.cl: the per-channel reductions (one pass over memory each) and one elementwise pass
# each way. Tests set FORCE_LAYOUT ("groups": the GPU's work-group trees and flat elementwise grid; "runs":
# the CPU's one-work-item runs) and PARTS (parts per channel; > 1 takes the finalize launch).
FORCE_LAYOUT: str | None = None
PARTS: int | None = None
# GPU layout ("groups") with parts > 1: the channel's last work-group merges the parts (LAST=1 in
# norm_batch.cl, a per-channel counter) instead of a finalize launch: forward + backward of
# (128, 64, 32, 32) 116 -> 104 us on the H200 (bench/conv_sweep.py; twice the parts: 120 / 112 us).
FUSED_FINALIZE = True
# GPU layout, training, float accumulators: the reduction and the elementwise pass of each way in one launch
# (norm_batch.cl's batch_norm_train_chain / batch_norm_backward_chain: the elementwise parts wait for their
# channel's statistics); two launches a batch norm a step instead of four. Off: the separate launches
# (tests compare the two bit for bit).
CHAINED = True
# GPU layout: float4 loads each work-item of the reductions issues before folding them in (UNR in
# norm_batch.cl; the statistics fold them as one batch of 4 x UNROLL values). bench/conv_sweep.py toggles it.
UNROLL = 4


def _bn_shape(op: str, x: Tensor) -> tuple[int, int, int]:
    if x.ndim < 2:
        raise ShapeError(f"{op}: input must be (N, C) or (N, C, *), got shape {x.shape}")
    return x.shape[0], x.shape[1], math.prod(x.shape[2:])


def _bn_layout(device: Any) -> str:
    if FORCE_LAYOUT is not None:
        return FORCE_LAYOUT
    return "runs" if device.capabilities.kind == "cpu" else "groups"


def _bn_parts(device: Any, layout: str, n: int, c: int, hw: int, local: int, vec: int) -> int:
    """Parts per channel: enough (c x parts) work-items / work-groups for the device (GPUs: 4 work-groups
    per compute unit; CPUs: 2 work-items per core), while each part keeps some work (GPUs: 8 loads per
    work-item; CPUs: whole images)."""
    if PARTS is not None:
        return max(1, min(PARTS, n if layout == "runs" else PARTS))
    units = device.capabilities.compute_units
    if layout == "runs":
        return max(1, min(n, -(-2 * units // c)))
    loads = n * (hw // vec)
    return max(1, min(-(-4 * units // c), loads // (8 * local)))


def _bn_dtypes(op: str, x: Tensor, grad_out: Tensor | None, params: dict[str, Tensor | None],
               stats: dict[str, Tensor | None]) -> tuple[np.dtype, np.dtype, dict[str, Tensor | None]]:
    """(x's dtype, the per-channel dtype, params) of a batch norm: x (and grad_out) float16, bfloat16,
    float32 or float64; weight, bias and the statistics in float32 for half x (PyTorch's mixed batch norm:
    half weight/bias are widened here, their gradients come back in float32) and in x's dtype otherwise."""
    ts = [t for t in (x, grad_out, *params.values(), *stats.values()) if t is not None]
    check_same_queue(*ts)
    dt = x.dtype
    if dt not in _ROW_DTYPES:
        raise DTypeError(f"{op} supports float16, bfloat16, float32 and float64 tensors, got {dt}")
    if grad_out is not None and grad_out.dtype != dt:
        raise DTypeError(f"{op}: grad_out must be {dt} like the input, got {grad_out.dtype}")
    pdt = _stat_dtype(dt)
    out = {}
    for name, t in params.items():
        if t is not None and t.dtype != pdt:
            if t.dtype != dt:
                raise DTypeError(f"{op}: {name} must be {pdt} (or {dt} like the input), got {t.dtype}")
            t = elementwise.cast(t, pdt)
        out[name] = t
    for name, t in stats.items():
        if t is not None and t.dtype != pdt:
            raise DTypeError(f"{op}: {name} of {dt} input must be {pdt}, got {t.dtype}")
    return dt, pdt, out


def _bn_vec(x: Tensor, *others: Tensor) -> int:
    """4 when every (n, c) run starts on a 4-element boundary of each operand (float4 loads)."""
    hw = math.prod(x.shape[2:])
    return 4 if hw % 4 == 0 and all(t.offset % 4 == 0 for t in (x, *others)) else 1


def _bn_fused(layout: str, parts: int, dt: np.dtype) -> bool:
    """Whether the reductions merge their parts in their last work-group (float accumulators only: the
    partials move through 32-bit atomics)."""
    return FUSED_FINALIZE and layout == "groups" and parts > 1 and dt != dtypes.float64


def _bn_chained(layout: str, dt: np.dtype) -> bool:
    """Whether a training batch norm runs each way as one launch (CHAINED): the GPU layout, float
    accumulators (the partials and the ready marks move through 32-bit atomics, as LAST's)."""
    return CHAINED and layout == "groups" and dt != dtypes.float64


def _bn_program(device: Any, dt: np.dtype, layout: str, hw: int, vec: int, relu: bool = False,
                fused: bool = False) -> Any:
    defines = {}
    if layout == "groups":
        defines = {"LOCAL": _local_size(device), "HW": hw, "VEC": vec, "LAST": int(fused), "UNR": UNROLL}
    return kernels.program(device, "norm_batch.cl", dtype=dt, act="relu" if relu else None, **defines)


def _bn_elementwise(prg: Any, layout: str, name: str, like: Tensor, hw: int, vec: int, **args: Any) -> Tensor:
    """One of the elementwise passes (batch_norm_apply, batch_norm_grad_input) into a new tensor shaped like
    x; `args` are the launch's buffers and offsets (its Plan keyed by the sizes)."""
    out = Tensor.empty(like.queue, like.shape, like.dtype)
    n, c = like.shape[0], like.shape[1]
    if capture.declaring():  # for the profiler: x (and grad_y) read once, the output written once
        launch_labels.work(0.0, float(like.nbytes * (3 if "grad" in name else 2)))
    static = {"C": np.int32(c), "NC": np.int32(n * c)}
    if layout == "groups":
        getattr(prg, f"{name}_flat").planned(like.queue, (hw // vec, n * c), None, static, signature=(n, c),
                                             out=out.buffer, **args)
    else:
        getattr(prg, f"{name}_runs").planned(like.queue, (n * c,), None, {**static, "hw": np.int32(hw)},
                                             signature=(n, c, hw), out=out.buffer, **args)
    return out


def _bn_key(op: str, tensors: tuple, *values: Any) -> tuple | None:
    """A batch norm call's signature for its one-launch fast path (capture.call_key: offsets modulo 4 for the
    4-wide loads), with the module's switches."""
    return capture.call_key(op, tensors, *values, CHAINED, FORCE_LAYOUT, PARTS, local_size_override, UNROLL,
                            FUSED_FINALIZE, align=4)


def _bn_train_fast(plan: Any, shape: tuple[int, ...], dt: np.dtype, pdt: np.dtype, part_size: int) -> Any:
    """batch_norm's training call on the GPU layout as one launch of `plan` (batch_norm_train_chain): the
    statistics (4, C), the parts' partials (part_size values, 0: none) and the output made, the buffers
    passed in the kernel's order (x, weight, bias, running statistics, partials, statistics, output)."""
    c = shape[1]
    work = float(math.prod(shape) * dt.itemsize * 3)  # x read twice, the output written

    def run(x: Tensor, weight: Tensor | None, bias: Tensor | None, rmean: Tensor | None,
            rvar: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        q = x.queue
        stats = Tensor.empty(q, (4, c), pdt)
        sb = stats.buffer
        part = Tensor.empty(q, (part_size,), dtypes.float32) if part_size else stats  # held to the launch
        out = Tensor.empty(q, shape, dt)
        if capture.declaring():
            launch_labels.work(0.0, work)
        plan(q, x.buffer, x.offset, sb if weight is None else weight.buffer,
             0 if weight is None else weight.offset, sb if bias is None else bias.buffer,
             0 if bias is None else bias.offset, sb if rmean is None else rmean.buffer,
             sb if rvar is None else rvar.buffer, part.buffer, sb, out.buffer)
        return out, stats._view((c,), (1,), 0), stats._view((c,), (1,), c)

    return run


def batch_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, running_mean: Tensor | None,
               running_var: Tensor | None, training: bool, momentum: float = 0.1, eps: float = 1e-5,
               activation: str | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """BatchNorm over channel 1 of (N, C, *): y = (x - mean) * invstd * weight + bias [then relu].

    training: batch statistics (biased variance to normalise); running stats, when given, are
    updated in place with `momentum` and the unbiased variance, as PyTorch does. Eval: running stats.
    Returns (out, save_mean, save_invstd) where the saves are the statistics used, shape (C,).
    """
    stats_offsets = tuple(t.offset if isinstance(t, Tensor) else None for t in (running_mean, running_var))
    key = _bn_key("batch_norm", (x, weight, bias, running_mean, running_var), stats_offsets, training,
                  momentum, eps, activation)
    fast = capture.plans.get(key) if key is not None else None
    if fast is not None:  # a training call on the GPU layout seen before: its one launch, no checks again
        return fast(x, weight, bias, running_mean, running_var)
    relu = _activation_flag("batch_norm", activation)
    # the fast path passes the tensors as they come: only for those the checks below take as they are
    as_given = key is not None and all(t is None or (t.dtype == _stat_dtype(x.dtype) and t.is_contiguous())
                                       for t in (weight, bias)) and x.is_contiguous()
    dt, pdt, params = _bn_dtypes("batch_norm", x, None, {"weight": weight, "bias": bias},
                                 {"running_mean": running_mean, "running_var": running_var})
    weight, bias = params["weight"], params["bias"]
    n, c, hw = _bn_shape("batch_norm", x)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (c,):
            raise ShapeError(f"batch_norm: {name} must have shape ({c},), got {tuple(t.shape)}")
    for name, t in (("running_mean", running_mean), ("running_var", running_var)):
        if t is not None and (tuple(t.shape) != (c,) or not t.is_contiguous()):
            raise ShapeError(
                f"batch_norm: {name} must be a contiguous ({c},) tensor, got shape {tuple(t.shape)}"
            )
    if (running_mean is None) != (running_var is None):
        raise ShapeError("batch_norm: pass both running_mean and running_var, or neither")
    if not training and running_mean is None:
        raise ShapeError("batch_norm: eval mode (training=False) needs running_mean and running_var")
    if training and n * hw <= 1:
        raise ShapeError(
            f"batch_norm: training needs more than one value per channel, got input shape {x.shape}"
        )
    if (running_mean is not None and running_mean.offset) or (running_var is not None and running_var.offset):
        raise ShapeError("batch_norm: running_mean/running_var views with an offset cannot be updated in "
                         "place; pass whole tensors")
    x = x.contiguous()
    weight, bias = (t.contiguous() if t is not None else None for t in (weight, bias))
    stats = Tensor.empty(x.queue, (4, c), pdt)  # mean, invstd, scale, beta
    save_mean, save_invstd = stats[0], stats[1]
    if c == 0 or x.size == 0:
        return Tensor.empty(x.queue, x.shape, dt), save_mean, save_invstd
    layout = _bn_layout(x.device)
    vec = _bn_vec(x) if layout == "groups" else 1
    local = _local_size(x.device) if layout == "groups" else 1
    dummy = stats.buffer
    # each launch through its Plan (Kernel.planned): `fixed` holds what the signature `sig` determines,
    # `common` the buffers and offsets of the call
    common = dict(
        w=weight.buffer if weight is not None else dummy,
        w_off=np.int64(weight.offset if weight is not None else 0),
        b=bias.buffer if bias is not None else dummy,
        b_off=np.int64(bias.offset if bias is not None else 0),
        rmean=running_mean.buffer if running_mean is not None else dummy,
        rvar=running_var.buffer if running_var is not None else dummy,
        stats=stats.buffer,
    )
    has_running = running_mean is not None and training
    fixed = dict(has_w=np.int32(weight is not None), has_b=np.int32(bias is not None),
                 has_running=np.int32(has_running), C=np.int32(c), momentum=_scalar(dt, momentum),
                 eps=_scalar(dt, eps))
    sig = (weight is not None, bias is not None, has_running, c, float(momentum), float(eps))
    parts = _bn_parts(x.device, layout, n, c, hw, local, vec) if training else 1
    chained = training and _bn_chained(layout, dt)
    fused = chained or _bn_fused(layout, parts, dt)
    prg = _bn_program(x.device, dt, layout, hw, vec, relu, fused)
    if training:
        part = (
            Tensor.empty(
                x.queue, (c * parts * 3,), dtypes.float64 if dt == dtypes.float64 else dtypes.float32
            )
            if parts > 1
            else stats
        )
        args = dict(x=x.buffer, x_off=np.int64(x.offset), part=part.buffer, **common)
        static = dict(N=np.int32(n), S=np.int32(parts), **fixed)
        if capture.declaring():  # x read (twice when chained: the statistics, then the output from it)
            launch_labels.work(0.0, float(x.nbytes * (3 if chained else 1)))
        if chained:
            out = Tensor.empty(x.queue, x.shape, dt)
            plan = prg.batch_norm_train_chain.plan_named(
                (2 * c * parts * local,), (local,), {**static, "count": x.queue.arrival_counts(2 + 2 * c)},
                {name: np.int64(0) if name.endswith("_off") else args[name]
                 for name in ("x", "x_off", "w", "w_off", "b", "b_off", "rmean", "rvar", "part", "stats")}
                | {"out": out.buffer})
            fast = _bn_train_fast(plan, x.shape, dt, pdt, c * parts * 3 if parts > 1 else 0)
            if as_given:
                capture.plans.put(key, fast)
            return fast(x, weight, bias, running_mean, running_var)
        if layout == "groups":
            count = x.queue.arrival_counts(c) if fused else part.buffer
            prg.batch_norm_stats_groups.planned(x.queue, (c * parts * local,), (local,), static,
                                                signature=(n, parts, *sig), count=count, **args)
        else:
            prg.batch_norm_stats_runs.planned(x.queue, (c * parts,), None, {**static, "hw": np.int32(hw)},
                                              signature=(n, parts, hw, *sig), **args)
        if parts > 1 and not fused:
            prg.batch_norm_finalize.planned(x.queue, (c,), None,
                                            {"S": np.int32(parts), "training": np.int32(1), **fixed},
                                            signature=(parts, True, *sig), part=part.buffer, **common)
    else:
        prg.batch_norm_finalize.planned(x.queue, (c,), None,
                                        {"S": np.int32(0), "training": np.int32(0), **fixed},
                                        signature=(0, False, *sig), part=stats.buffer, **common)
    out = _bn_elementwise(prg, layout, "batch_norm_apply", x, hw, vec, x=x.buffer, x_off=np.int64(x.offset),
                          stats=stats.buffer, stats_off=np.int64(stats.offset))
    return out, save_mean, save_invstd


def batch_norm_relu(x: Tensor, weight: Tensor | None, bias: Tensor | None, running_mean: Tensor | None,
                    running_var: Tensor | None, training: bool, momentum: float = 0.1,
                    eps: float = 1e-5) -> tuple[Tensor, Tensor, Tensor]:
    """relu(batch_norm(...)); backward: batch_norm_backward(..., activation='relu')."""
    return batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps, activation="relu")


def _bn_backward_fast(plan: Any, shape: tuple[int, ...], dt: np.dtype, pdt: np.dtype, part_size: int) -> Any:
    """batch_norm_backward on the GPU layout as one launch of `plan` (batch_norm_backward_chain): the
    parameter gradients, the coefficients (5, C), the partials (part_size values, 0: none) and grad_x made,
    the buffers passed in the kernel's order."""
    c = shape[1]
    work = float(math.prod(shape) * dt.itemsize * 5)  # grad_y and x read twice, grad_x written

    def run(gy: Tensor, x: Tensor, weight: Tensor | None, bias: Tensor | None, save_mean: Tensor,
            save_invstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q = x.queue
        gw, gb = Tensor.empty(q, (c,), pdt), Tensor.empty(q, (c,), pdt)
        coef = Tensor.empty(q, (5, c), pdt)  # k, mg, mean, d, beta; held (as part) to the launch: a
        cb = coef.buffer  # tensor dropped before it goes back to the pool, which may hand it to gx
        part = Tensor.empty(q, (part_size,), dtypes.float32) if part_size else coef
        gx = Tensor.empty(q, shape, dt)
        if capture.declaring():
            launch_labels.work(0.0, work)
        plan(q, gy.buffer, gy.offset, x.buffer, x.offset, cb if weight is None else weight.buffer,
             0 if weight is None else weight.offset, cb if bias is None else bias.buffer,
             0 if bias is None else bias.offset, save_mean.buffer, save_mean.offset, save_invstd.buffer,
             save_invstd.offset, part.buffer, gw.buffer, gb.buffer, cb, gx.buffer)
        return gx, gw, gb

    return run


def batch_norm_backward(grad_out: Tensor, x: Tensor, weight: Tensor | None, save_mean: Tensor,
                        save_invstd: Tensor, training: bool = True, bias: Tensor | None = None,
                        activation: str | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(grad_x, grad_weight, grad_bias) of batch_norm; activation='relu' (with bias) for batch_norm_relu.
    One pass over grad_out and x for the two per-channel sums, one more for grad_x."""
    key = _bn_key("batch_norm_backward", (grad_out, x, weight, bias, save_mean, save_invstd), training,
                  activation)
    fast = capture.plans.get(key) if key is not None else None
    if fast is not None:  # a call on the GPU layout seen before: its one launch, no checks again
        return fast(grad_out, x, weight, bias, save_mean, save_invstd)
    relu = _activation_flag("batch_norm_backward", activation)
    as_given = key is not None and all(  # what the fast path may pass as it comes (see batch_norm)
        t is None or (t.dtype == _stat_dtype(x.dtype) and t.is_contiguous())
        for t in (weight, bias, save_mean, save_invstd)) and x.is_contiguous() and grad_out.is_contiguous()
    param_dtypes = [t.dtype if t is not None else None for t in (weight, bias)]
    dt, pdt, params = _bn_dtypes("batch_norm_backward", x, grad_out, {"weight": weight, "bias": bias},
                                 {"save_mean": save_mean, "save_invstd": save_invstd})
    weight, bias = params["weight"], params["bias"]
    if tuple(grad_out.shape) != tuple(x.shape):
        raise ShapeError(f"batch_norm_backward: grad_out shape {grad_out.shape} != input shape {x.shape}")
    n, c, hw = _bn_shape("batch_norm_backward", x)
    weight = _check_param("batch_norm_backward", "weight", weight, (c,))
    bias = _check_param("batch_norm_backward", "bias", bias, (c,))
    save_mean = _check_param("batch_norm_backward", "save_mean", save_mean, (c,))
    save_invstd = _check_param("batch_norm_backward", "save_invstd", save_invstd, (c,))
    gy, x = grad_out.contiguous(), x.contiguous()
    gw = Tensor.empty(x.queue, (c,), pdt)
    gb = Tensor.empty(x.queue, (c,), pdt)
    coef = Tensor.empty(x.queue, (5, c), pdt)  # k, mg, mean, d, beta
    if c == 0 or x.size == 0:
        if c:
            gw.fill_(0.0)
            gb.fill_(0.0)
        return Tensor.empty(x.queue, x.shape, dt), gw, gb
    layout = _bn_layout(x.device)
    vec = _bn_vec(x, gy) if layout == "groups" else 1
    local = _local_size(x.device) if layout == "groups" else 1
    parts = _bn_parts(x.device, layout, n, c, hw, local, vec)
    part = (
        Tensor.empty(x.queue, (c * parts * 2,), dtypes.float64 if dt == dtypes.float64 else dtypes.float32)
        if parts > 1
        else coef
    )
    dummy = coef.buffer
    args = dict(
        gy=gy.buffer,
        gy_off=np.int64(gy.offset),
        x=x.buffer,
        x_off=np.int64(x.offset),
        w=weight.buffer if weight is not None else dummy,
        w_off=np.int64(weight.offset if weight is not None else 0),
        b=bias.buffer if bias is not None else dummy,
        b_off=np.int64(bias.offset if bias is not None else 0),
        mean_in=save_mean.buffer,
        mean_off=np.int64(save_mean.offset),
        invstd_in=save_invstd.buffer,
        invstd_off=np.int64(save_invstd.offset),
        part=part.buffer,
        gw=gw.buffer,
        gb=gb.buffer,
        coef=coef.buffer,
    )
    # each launch through its Plan (Kernel.planned), keyed by the signature `sig` that fixes `static`
    static = dict(has_w=np.int32(weight is not None), has_b=np.int32(bias is not None), N=np.int32(n),
                  C=np.int32(c), S=np.int32(parts), training=np.int32(bool(training)))
    sig = (weight is not None, bias is not None, n, c, parts, bool(training))
    chained = _bn_chained(layout, dt)
    fused = chained or _bn_fused(layout, parts, dt)
    prg = _bn_program(x.device, dt, layout, hw, vec, relu, fused)
    if capture.declaring():  # grad_y and x read (twice when chained: the sums, then grad_x written)
        launch_labels.work(0.0, float((5 if chained else 2) * x.nbytes))
    if chained:
        gx = Tensor.empty(x.queue, x.shape, dt)
        names = ("gy", "gy_off", "x", "x_off", "w", "w_off", "b", "b_off", "mean_in", "mean_off", "invstd_in",
                 "invstd_off", "part", "gw", "gb", "coef")
        plan = prg.batch_norm_backward_chain.plan_named(
            (2 * c * parts * local,), (local,), {**static, "count": x.queue.arrival_counts(2 + 2 * c)},
            {name: np.int64(0) if name.endswith("_off") else args[name] for name in names}
            | {"out": gx.buffer})
        fast = _bn_backward_fast(plan, x.shape, dt, pdt, c * parts * 2 if parts > 1 else 0)
        if as_given:
            capture.plans.put(key, fast)
        gx, gw, gb = fast(gy, x, weight, bias, save_mean, save_invstd)
    elif layout == "groups":
        count = x.queue.arrival_counts(c) if fused else part.buffer
        prg.batch_norm_backward_groups.planned(x.queue, (c * parts * local,), (local,), static, signature=sig,
                                               count=count, **args)
    else:
        prg.batch_norm_backward_runs.planned(x.queue, (c * parts,), None, {**static, "hw": np.int32(hw)},
                                             signature=(hw, *sig), **args)
    if parts > 1 and not fused:
        prg.batch_norm_backward_finalize.planned(x.queue, (c,), None, {**static, "M": np.int64(n * hw)},
                                                 signature=(hw, *sig), **args)
    if not chained:
        gx = _bn_elementwise(prg, layout, "batch_norm_grad_input", x, hw, vec, gy=gy.buffer,
                             gy_off=np.int64(gy.offset), x=x.buffer, x_off=np.int64(x.offset),
                             coef=coef.buffer, coef_off=np.int64(coef.offset))
    # half weight/bias (widened above): their gradients in their own dtype
    gw, gb = (g if pd in (None, pdt) else elementwise.cast(g, pd) for g, pd in zip((gw, gb), param_dtypes))
    return gx, gw, gb


# -- row norms: LayerNorm, RMSNorm, GroupNorm ----------------------------------------------------
def _row_forward(
    op: str,
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    rows: int,
    length: int,
    pg: int,
    pdiv: int,
    rms: bool,
    eps: float,
    relu: bool = False,
    key: tuple | None = None,
    lead: tuple[int, ...] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(out, mean, rstd) of the row norm `op` (mean and rstd (rows,), or shaped `lead` when given). `key`:
    the public call's signature (capture.call_key), under which the launch is kept for the next call with it
    (the checks then not run again); the caller gives one only where the call's tensors are used as they
    came (_as_given)."""
    dt = x.dtype
    x = x.contiguous()
    weight, bias = (t.clone() if t is not None and t.offset else t for t in (weight, bias))
    if rows == 0:
        stat_shape = (rows,) if lead is None else lead
        out = Tensor.empty(x.queue, x.shape, dt)
        mean = Tensor.empty(x.queue, stat_shape, _stat_dtype(dt))
        rstd = Tensor.empty(x.queue, stat_shape, _stat_dtype(dt))
        return out, mean, rstd
    local = _local_size(x.device)
    vw = _vector_width(local, pg, pdiv, length, dt, x)
    if vw:
        local = row_group_size(local, vw, length)
    prg = _program(x.device, dt, relu, vw or 4, local, _param_dtype(dt, weight, bias))
    kernel = prg.row_norm_forward_vec4 if vw else prg.row_norm_forward
    static = dict(has_w=np.int32(weight is not None), has_b=np.int32(bias is not None), ROWS=np.int32(rows),
                  L=np.int32(length), PG=np.int32(pg), PDIV=np.int32(pdiv), rms=np.int32(rms),
                  eps=_scalar(dt, eps))
    per_call = dict(x=x.buffer, x_off=np.int64(0), w=x.buffer, b=x.buffer, y=x.buffer, mean_out=x.buffer,
                    rstd_out=x.buffer)
    launch = _row_forward_launch(kernel.plan_named((rows * local,), (local,), static, per_call), x.shape, dt,
                                 rows, lead)
    if key is not None:
        capture.plans.put(key, launch)
    return launch(x, weight, bias)


def _as_given(x: Tensor, *params: Tensor | None) -> bool:
    """Whether a row norm takes these tensors as they come (x contiguous, parameters contiguous from their
    storage's start): only such a call's launch is kept for its signature."""
    return x.is_contiguous() and all(t is None or (t.offset == 0 and t.is_contiguous()) for t in params)


def _row_forward_launch(plan: Any, shape: tuple[int, ...], dt: np.dtype, rows: int,
                        lead: tuple[int, ...] | None) -> Any:
    """A row norm's forward through its Plan: the output and the statistics made (shaped `lead`), the
    buffers passed."""
    sdt = _stat_dtype(dt)
    stat_shape = (rows,) if lead is None else lead
    stat_strides = contiguous_strides(stat_shape)

    def run(x: Tensor, weight: Tensor | None, bias: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        q = x.queue
        out = Tensor.empty(q, shape, dt)
        mean = Tensor.empty(q, (rows,), sdt)
        rstd = Tensor.empty(q, (rows,), sdt)
        ob = out.buffer
        plan(q, x.buffer, x.offset, ob if weight is None else weight.buffer,
             ob if bias is None else bias.buffer, ob, mean.buffer, rstd.buffer)
        if lead is None:
            return out, mean, rstd
        return out, mean._view(stat_shape, stat_strides, 0), rstd._view(stat_shape, stat_strides, 0)

    return run


def _row_backward(grad_out: Tensor, x: Tensor, weight: Tensor | None, mean: Tensor | None, rstd: Tensor,
                  rows: int, length: int, pg: int, pdiv: int, nparam: int,
                  rms: bool, bias: Tensor | None = None,
                  into: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(grad x, grad weight, grad bias); the parameters' gradients in their dtype (`bias` only says it).
    `into` (x's shape and dtype): added to grad x in the same launch (x's gradient summed so far)."""
    dt = x.dtype
    pdt = _param_dtype(dt, weight, bias)
    gy, x = grad_out.contiguous(), x.contiguous()
    if into is not None:
        if tuple(into.shape) != tuple(x.shape):
            raise ShapeError(f"row norm backward: into of shape {into.shape} must have x's {x.shape}")
        if into.dtype != dt:
            raise DTypeError(f"row norm backward: into is {into.dtype}, x {dt}")
        into = into.contiguous()
    weight, mean, rstd = (t.clone() if t is not None and (t.offset or not t.is_contiguous()) else t
                          for t in (weight, mean, rstd))
    gx = Tensor.empty(x.queue, x.shape, dt)
    gw = Tensor.empty(x.queue, (max(nparam, 1),), pdt)
    gb = Tensor.empty(x.queue, (max(nparam, 1),), pdt)
    if rows:
        local = _local_size(x.device)
        # GPUs: a parameter per last-axis element (layer/RMS norm) takes its sums over the rows from the
        # reduction engine (every SM); the kernel's parameter part gives one work-item all the rows of a
        # parameter, which a GPT step's 16,384 rows made 7.6 ms a call on the H200
        by_reduction = local > 1 and pg == 1 and pdiv == 1 and nparam == length
        kernel_params = 0 if by_reduction else nparam
        groups = rows + math.ceil(kernel_params / local)
        vw = _vector_width(local, pg, pdiv, length, dt, x, gy) if by_reduction else 0
        if vw:
            local = row_group_size(local, vw, length)
            _program(x.device, dt, vw=vw, local=local, pdt=pdt).row_norm_backward_vec4(
                x.queue, (rows * local,), (local,), gy=gy.buffer, gy_off=np.int64(gy.offset), x=x.buffer,
                x_off=np.int64(x.offset), w=weight.buffer if weight is not None else gx.buffer,
                has_w=np.int32(weight is not None), mean_in=(mean if mean is not None else rstd).buffer,
                rstd_in=rstd.buffer, gx=gx.buffer, gin=(gx if into is None else into).buffer,
                gin_off=np.int64(0 if into is None else into.offset), has_in=np.int32(into is not None),
                ROWS=np.int32(rows), L=np.int32(length), rms=np.int32(rms))
        else:
            _program(x.device, dt, pdt=pdt).row_norm_backward(
                x.queue,
                (groups * local,),
                (local,),
                gy.buffer,
                np.int64(gy.offset),
                x.buffer,
                np.int64(x.offset),
                weight.buffer if weight is not None else gx.buffer,
                np.int32(weight is not None),
                mean.buffer if mean is not None else rstd.buffer,
                rstd.buffer,
                gx.buffer,
                (gx if into is None else into).buffer,
                np.int64(0 if into is None else into.offset),
                np.int32(into is not None),
                gw.buffer,
                gb.buffer,
                np.int32(rows),
                np.int32(length),
                np.int32(pg),
                np.int32(pdiv),
                np.int32(kernel_params),
                np.int32(rms),
            )
        if by_reduction:
            g2, x2 = gy.reshape(rows, length), x.reshape(rows, length)
            centered = x2 if mean is None else elementwise.sub(x2, mean.reshape(rows, 1))
            xhat = elementwise.mul(centered, rstd.reshape(rows, 1))
            gw = reduce.sum(elementwise.mul(g2, xhat), axis=0)  # half g2 * float32 xhat: float32 sums
            if not rms:  # float32 sums (of half rows, rounded once at the end when the bias is half)
                gb = reduce.sum(g2, axis=0, dtype=dtypes.float32 if dtypes.is_half(dt) else None)
            gw, gb = (t if t.dtype == pdt else elementwise.cast(t, pdt) for t in (gw, gb))
    return gx, gw, gb


def _vector_width(local: int, pg: int, pdiv: int, length: int, dt: np.dtype, *ts: Tensor) -> int:
    """The elements a work-item of norm.cl's vector kernels (row_norm_*_vec4) reads at once, 0 for the
    scalar kernels: GPUs (work-groups), one parameter per element, not float64; 8 for float16/bfloat16 rows
    of a multiple of 8 on 8-element boundaries (16 bytes, as float32's 4), else 4 where rows allow it."""
    if local == 1 or pg != 1 or pdiv != 1 or dt == dtypes.float64:
        return 0
    for vw in (8, 4) if dtypes.is_half(dt) else (4,):
        if length % vw == 0 and all(t.offset % vw == 0 for t in ts):
            return vw
    return 0


def _stat_dtype(dt: np.dtype) -> np.dtype:
    """The row norms' mean/rstd dtype: float32 for float16/bfloat16/float32 storage, float64 for float64."""
    return dtypes.float64 if dt == dtypes.float64 else dtypes.float32


def _row_dtype(op: str, *tensors: Tensor | None, params: tuple[Tensor | None, ...] = (),
               stats: tuple[Tensor | None, ...] = ()) -> np.dtype:
    """The row norms' dtype check: x (and the incoming gradient) and the parameters share one floating dtype,
    half included, or the rows are float16/bfloat16 and the parameters float32 (a float32 model under
    autocast: the parameters are not cast); the statistics are _stat_dtype of the rows' dtype."""
    ts = [t for t in tensors if t is not None]
    ps = [t for t in params if t is not None]
    check_same_queue(*ts, *ps, *(t for t in stats if t is not None))
    dt = ts[0].dtype
    for t in ts:
        if t.dtype != dt:
            raise DTypeError(f"{op}: all tensors must share one dtype, got {[str(t.dtype) for t in ts + ps]}")
    if dt not in _ROW_DTYPES:
        raise DTypeError(f"{op} supports float16, bfloat16, float32 and float64 tensors, got {dt}")
    if ps:
        pdt = ps[0].dtype
        widened = dtypes.is_half(dt) and pdt == dtypes.float32
        if any(t.dtype != pdt for t in ps) or not (pdt == dt or widened):
            raise DTypeError(f"{op}: the parameters must share the input's dtype ({dt})"
                             + (" or be float32" if dtypes.is_half(dt) else "")
                             + f", got {[str(t.dtype) for t in ps]}")
    for t in stats:
        if t is not None and t.dtype != _stat_dtype(dt):
            raise DTypeError(f"{op}: mean/rstd of {dt} tensors must be {_stat_dtype(dt)} (the forward's), "
                             f"got {t.dtype}")
    return dt


def _param_dtype(dt: np.dtype, *params: Tensor | None) -> np.dtype:
    """The dtype of the row norms' parameters (checked by _row_dtype): theirs, else the rows'."""
    for t in params:
        if t is not None:
            return t.dtype
    return dt


_ROW_DTYPES = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)


def _normalized(op: str, x: Tensor, normalized_shape: Any) -> tuple[tuple[int, ...], int, int]:
    shape = (int(normalized_shape),) if isinstance(normalized_shape, (int, np.integer)) else tuple(
        int(s) for s in normalized_shape)
    if not shape or tuple(x.shape[x.ndim - len(shape):]) != shape or len(shape) > x.ndim:
        raise ShapeError(f"{op}: normalized_shape {shape} must match the trailing dimensions of input shape "
                         f"{x.shape}")
    length = math.prod(shape)
    return shape, x.size // max(length, 1), length


def layer_norm(x: Tensor, normalized_shape: Any, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> tuple[Tensor, Tensor, Tensor]:
    """(out, mean, rstd): normalise over the trailing `normalized_shape` dims; mean/rstd are per row."""
    key = capture.call_key("layer_norm", (x, weight, bias), normalized_shape, eps, local_size_override,
                           align=None)  # offsets whole: x's picks the loads' width, the parameters' a copy
    fast = capture.plans.get(key) if key is not None else None
    if fast is not None:  # a call seen before: its launch, without the checks again
        return fast(x, weight, bias)
    _row_dtype("layer_norm", x, params=(weight, bias))
    if not _as_given(x, weight, bias):
        key = None
    shape, rows, length = _normalized("layer_norm", x, normalized_shape)
    weight = _check_param("layer_norm", "weight", weight, shape)
    bias = _check_param("layer_norm", "bias", bias, shape)
    return _row_forward("layer_norm", x, weight, bias, rows, length, 1, 1, False, eps, key=key,
                        lead=x.shape[: x.ndim - len(shape)])


def layer_norm_backward(grad_out: Tensor, x: Tensor, normalized_shape: Any, mean: Tensor, rstd: Tensor,
                        weight: Tensor | None = None, bias: Tensor | None = None, x_into: Tensor | None = None
                        ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(grad_x, grad_weight, grad_bias) of layer_norm; grads of absent parameters are None. x_into as
    rms_norm_backward's."""
    _row_dtype("layer_norm_backward", grad_out, x, params=(weight, bias), stats=(mean, rstd))
    if tuple(grad_out.shape) != tuple(x.shape):
        raise ShapeError(f"layer_norm_backward: grad_out shape {grad_out.shape} != input shape {x.shape}")
    shape, rows, length = _normalized("layer_norm_backward", x, normalized_shape)
    weight = _check_param("layer_norm_backward", "weight", weight, shape)
    gx, gw, gb = _row_backward(
        grad_out, x, weight, mean.reshape(rows), rstd.reshape(rows), rows, length, 1, 1, length, False, bias,
        into=x_into)
    return (
        gx,
        gw.reshape(shape) if weight is not None else None,
        gb.reshape(shape) if bias is not None else None,
    )


def rms_norm(x: Tensor, normalized_shape: Any, weight: Tensor | None = None,
             eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """(out, rstd): out = x * rsqrt(mean(x^2) + eps) * weight over the trailing dims."""
    key = capture.call_key("rms_norm", (x, weight), normalized_shape, eps, local_size_override,
                           align=None)  # offsets whole: x's picks the loads' width, the weight's a copy
    fast = capture.plans.get(key) if key is not None else None
    if fast is None:  # a call not seen before: the checks, then its launch kept under its signature
        _row_dtype("rms_norm", x, params=(weight,))
        if not _as_given(x, weight):
            key = None
        shape, rows, length = _normalized("rms_norm", x, normalized_shape)
        weight = _check_param("rms_norm", "weight", weight, shape)
        out, _, rstd = _row_forward("rms_norm", x, weight, None, rows, length, 1, 1, True, eps, key=key,
                                    lead=x.shape[: x.ndim - len(shape)])
        return out, rstd
    out, _, rstd = fast(x, weight, None)
    return out, rstd


def rms_norm_backward(grad_out: Tensor, x: Tensor, normalized_shape: Any, rstd: Tensor,
                      weight: Tensor | None = None,
                      x_into: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """(grad_x, grad_weight) of rms_norm; x_into (x's shape and dtype), where given, is added to grad_x in its
    launch (x's gradient from its other readers: the residual stream of a pre-norm block)."""
    _row_dtype("rms_norm_backward", grad_out, x, params=(weight,), stats=(rstd,))
    if tuple(grad_out.shape) != tuple(x.shape):
        raise ShapeError(f"rms_norm_backward: grad_out shape {grad_out.shape} != input shape {x.shape}")
    shape, rows, length = _normalized("rms_norm_backward", x, normalized_shape)
    weight = _check_param("rms_norm_backward", "weight", weight, shape)
    gx, gw, _ = _row_backward(grad_out, x, weight, None, rstd.reshape(rows), rows, length, 1, 1, length, True,
                              into=x_into)
    return gx, gw.reshape(shape) if weight is not None else None


def _group_geometry(op: str, x: Tensor, num_groups: int) -> tuple[int, int, int, int]:
    if x.ndim < 2:
        raise ShapeError(f"{op}: input must be (N, C, *), got shape {x.shape}")
    n, c = x.shape[0], x.shape[1]
    if not isinstance(num_groups, (int, np.integer)) or num_groups < 1 or c % num_groups:
        raise ShapeError(f"{op}: channels C={c} (input shape {x.shape}) are not divisible by "
                         f"num_groups={num_groups}")
    hw = math.prod(x.shape[2:])
    return n, c, hw, int(num_groups)


def group_norm(x: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> tuple[Tensor, Tensor, Tensor]:
    """(out, mean, rstd): normalise each of num_groups channel groups per sample; weight/bias per channel.
    mean and rstd have shape (N, num_groups)."""
    _row_dtype("group_norm", x, params=(weight, bias))
    n, c, hw, g = _group_geometry("group_norm", x, num_groups)
    weight = _check_param("group_norm", "weight", weight, (c,))
    bias = _check_param("group_norm", "bias", bias, (c,))
    out, mean, rstd = _row_forward(
        "group_norm", x, weight, bias, n * g, (c // g) * hw, g, max(hw, 1), False, eps
    )
    return out, mean.reshape(n, g), rstd.reshape(n, g)


def group_norm_backward(grad_out: Tensor, x: Tensor, num_groups: int, mean: Tensor, rstd: Tensor,
                        weight: Tensor | None = None, bias: Tensor | None = None
                        ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(grad_x, grad_weight, grad_bias) of group_norm; grads of absent parameters are None."""
    _row_dtype("group_norm_backward", grad_out, x, params=(weight, bias), stats=(mean, rstd))
    if tuple(grad_out.shape) != tuple(x.shape):
        raise ShapeError(f"group_norm_backward: grad_out shape {grad_out.shape} != input shape {x.shape}")
    n, c, hw, g = _group_geometry("group_norm_backward", x, num_groups)
    weight = _check_param("group_norm_backward", "weight", weight, (c,))
    gx, gw, gb = _row_backward(grad_out, x, weight, mean.reshape(n * g), rstd.reshape(n * g), n * g,
                               (c // g) * hw, g, max(hw, 1), c, False, bias)
    return gx, gw if weight is not None else None, gb if bias is not None else None


# the ops on Nodes, made from these (netcl.ops.declaration): float32 statistics, half storage under autocast
declare(OpDecl("batch_norm", batch_norm, batch_norm_backward, inputs=("x", "weight", "bias"),
               saves=("save_mean", "save_invstd"), autocast="half", cast=("x",), functional=("batch_norm",),
               replay="netcl.ops.norm",
               doc="BatchNorm over axis 1 (running stats updated in place when training); relu optionally "
                   "fused. Only x is cast under autocast: weight, bias and statistics stay float32."))
# The row norms likewise cast only x: float32 weights and biases are read as they are (PARAM_F32 in norm.cl)
# and their gradients come out float32, where a cast each way made three launches a norm a step (the
# weight's cast in the forward and again in the backward, the gradient's back to float32)
declare(OpDecl("layer_norm", layer_norm, layer_norm_backward, inputs=("x", "weight", "bias"),
               saves=("mean", "rstd"), autocast="half", cast=("x",), functional=("layer_norm",),
               replay="netcl.ops.norm"))
declare(OpDecl("group_norm", group_norm, group_norm_backward, inputs=("x", "weight", "bias"),
               saves=("mean", "rstd"), autocast="half", cast=("x",), functional=("group_norm",),
               replay="netcl.ops.norm"))
declare(OpDecl("rms_norm", rms_norm, rms_norm_backward, inputs=("x", "weight"), saves=("rstd",),
               autocast="half", cast=("x",), functional=("rms_norm",), replay="netcl.ops.norm"))

__all__ = [
    "batch_norm",
    "batch_norm_backward",
    "batch_norm_relu",
    "group_norm",
    "group_norm_backward",
    "layer_norm",
    "layer_norm_backward",
    "rms_norm",
    "rms_norm_backward",
]
