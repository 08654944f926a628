"""A chain of GEMVs in one launch (gemm_gemv.cl's gemv_chain): a decode step's dependent matrix-vector
products, phase after phase, without a launch (and the driver's gap between dependent kernels) between them.

    y, h, z = gemv_chain([
        ChainStep(attn, wo, residual=x),                           # y = attn @ wo^T + x
        ChainStep(0, w_gate_up, norm=(ln_w, 1e-5), glu=True),      # h = swiglu(rms_norm(y) @ w_gate_up^T)
        ChainStep(1, w_down, residual=0),                          # z = h @ w_down^T + y
    ])

A step's input rows and residual are Tensors or the index of an earlier step (its output). Work-groups take
tiles in the order of tickets drawn when they start, and a tile of a later step waits for the earlier step's
tiles to be done (gemm_gemv.cl explains why no schedule deadlocks); the last tile resets the counts, so one
launch of the queue's arrival counts serves every call and recorded replay. Each step's result has the bits
of the separate launch it replaces (ops.linear on the gemv kernel; with `norm`, ops.rms_norm_linear's
prologue; with `glu`, linear_glu).

Rows: 1 to MAX_ROWS (a decode batch), contiguous, K a multiple of 8 elements; float32, float16 or bfloat16.

`attention=` (a DecodePhase of ops.attention: rope_cache_decode_phase's launch, not made) puts a decode step's
attention into the same launch as its first tiles: step 0 (usually reading the attention's output rows) waits
for them, so a decode layer (attention, o-projection + residual, RMSNorm + gate/up + SwiGLU, down + residual,
the next layer's RMSNorm + q/k/v) is one launch. The attention has the bits of its own launch
(attention_fits says where it may join).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core import backend, capture, dtypes
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, NetclError, ShapeError
from netcl.ops.gemm.api import gemv_fits
from netcl.ops.gemm.launch import _gemv_prologue_bytes, gemv_rms_fits
from netcl.ops.gemm.variants import _program, usable_params

MAX_STEPS = 4  # the kernel's phases (CHAIN_PHASE_ARGS 0 .. 3)
# SPIN_NS: how a chain tile waits for the phase before it (common.cl nc_wait_at_least: on NVIDIA of compute
# capability 7.0 and later acquire loads in a loop, elsewhere atomic reads). None: that; an int: on NVIDIA the
# loop sleeps about SPIN_NS ns between reads when > 0 (nanosleep; before 7.0, volatile loads: NC_SPIN_LOAD);
# elsewhere the atomic read still.
SPIN_NS: int | None = None
# AHEAD: None, or (lines, phases[, far]): in gemv_layers a tile of a phase p with bit p of `phases` set (p: 0
# q/k/v, 2 o, 3 gate/up, 4 down; the attention's tiles read no weights) asks L2 for at most `lines` 128-byte
# lines of each weight row past its first loads once the phase before its own is released (bit p of `far`: the
# phase before that; gemm_gemv.cl's GEMV_AHEAD_LINES): the weights arrive while it waits, at most one (two)
# phases ahead. The same bits either way. The default: the o-projection's tiles read the rest of their rows
# while the attention runs, which reads almost nothing (H100, TinyLlama-shaped decode at batch 1: gemv_layers
# 1,010 -> 997 us a step, alternated twice; the gate/up's or down's too, or from two phases ahead, were
# slower: their reads delay the latency-bound attention and the running phase; bench/NOTES.md, thirty-seventh
# session).
AHEAD: tuple[int, ...] | None = (64, 0b00100)
# CAP_REGISTERS: on NVIDIA, a gemv_layers build that holds the decode attention's preload (DECODE_PRELOAD) is
# assembled again from its PTX within the registers of three work-groups an SM (`_register_cap`: 80 for 256
# work-items), the count ptxas picks for the launch without the preload. Unasked, with the preload, ptxas
# kept those 80 by spilling 8 bytes and reading the work-item id again (S2R) in every step of the GEMV loop
# (381 instructions a loop against 359); asked for the same 80 it spills nothing and the loop is the one
# without the preload (ptxas 13.0 on the driver's PTX, the driver's own the same). H100, TinyLlama-shaped
# bfloat16 decode at batch 1: 1.090 -> 1.062 ms a token at the 128-key cache, 1.132 -> 1.105 at 512 keys,
# 1.275 -> 1.255 at 2,048 (alternated). The builds without the preload (80 registers, or 98 with a 32-key
# tile) are left as ptxas makes them: the same cap spilled 68-76 bytes there and cost 6% (bench/NOTES.md,
# forty-third session). False: every build as ptxas makes it.
CAP_REGISTERS = True
REGISTER_FILE = 65536   # 32-bit registers an SM (NVIDIA, every architecture since Maxwell)
MAX_ROWS = 8
_FLAGS = {"norm": 1, "glu": 2, "residual": 4}  # gemm_gemv.cl's CHAIN_RMS, CHAIN_GLU, CHAIN_RES
_DTYPES = (dtypes.float32, dtypes.float16, dtypes.bfloat16)


@dataclass(frozen=True)
class ChainStep:
    """out (M, N) = a (M, K) @ weight^T, weight (N, K); `norm` (weight (K,), eps): a's rows RMS-normalized
    first; `glu`: weight (2N, K) and out = silu(a @ weight[:N]^T) * (a @ weight[N:]^T); `residual` (M, N)
    added last. `a` and `residual` may be the index of an earlier step, meaning its output."""

    a: Tensor | int
    weight: Tensor
    residual: Tensor | int | None = None
    norm: tuple[Tensor, float] | None = None
    glu: bool = False


def _operand(step: int, what: str, x: Any, outs: list[Tensor]) -> Tensor:
    if type(x) is int:
        if not 0 <= x < step:
            raise NetclError(f"gemv_chain: step {step}'s {what} names step {x}; only earlier steps "
                             f"(0 .. {step - 1}) have outputs")
        return outs[x]
    if not isinstance(x, Tensor):
        raise TypeError(f"gemv_chain: step {step}'s {what} must be a Tensor or an earlier step's index, got "
                        f"{type(x).__name__}")
    return x


def _aligned(step: int, what: str, t: Tensor, shape: tuple[int, ...], dtype: np.dtype, queue: Any) -> None:
    if t.queue is not queue or t.dtype != dtype:
        raise NetclError(f"gemv_chain: step {step}'s {what} is {t.dtype} on {t.queue.device.describe()}; "
                         f"every operand must be {dtype} on the first step's queue")
    if t.shape != shape:
        raise ShapeError(f"gemv_chain: step {step}'s {what} has shape {t.shape}, expected {shape}")
    if not t.is_contiguous() or t.offset % 8:
        raise ShapeError(f"gemv_chain: step {step}'s {what} must be contiguous and start at a multiple of 8 "
                         f"elements (16-byte loads); take .contiguous() of it first")


def mlp_half_fits(o: Tensor, x: Tensor, o_weight: Tensor, gate_up: Tensor, down: Tensor) -> bool:
    """Whether a decode layer's MLP half (o @ o_weight^T + x, then SwiGLU of its RMSNorm through the stacked
    gate_up (2h, d), then down (d, h) + the first result) may run as one gemv_chain with the bits of the three
    launches it replaces: one row (the gemv kernel's default tile; more rows take the "rows" tile or the
    matrix units'), half storage, each product one the gemv kernel takes (api.gemv_fits, and
    launch.gemv_rms_fits for the norm's prologue), the rows contiguous from a multiple of 8 elements."""
    if not all(isinstance(t, Tensor) for t in (o, x, o_weight, gate_up, down)):
        return False
    if o.ndim < 2 or o.size != o.shape[-1] or o.shape[-1] != o_weight.shape[-1] \
            or x.shape != o.shape[:-1] + (o_weight.shape[0],):
        return False
    d, h = o_weight.shape[0], down.shape[1]
    if gate_up.shape != (2 * h, d) or down.shape[0] != d or not dtypes.is_half(o.dtype):
        return False
    if any(t.dtype != o.dtype or t.queue is not o.queue for t in (x, o_weight, gate_up, down)):
        return False
    if not all(t.is_contiguous() and t.offset % 8 == 0 for t in (o, x, o_weight, gate_up, down)):
        return False
    if h % 8 or not (gemv_fits(o.reshape(1, d), o_weight.transpose(0, 1))
                     and rms_step_fits(x, gate_up, glu=True)):
        return False
    tile = usable_params(o.device, "gemv", o.dtype)
    return _local_bytes(o.device, tile, o.dtype, 1, max(d, h)) <= o.device.capabilities.local_mem


def rms_step_fits(x: Tensor, weight: Tensor, glu: bool = False) -> bool:
    """Whether ChainStep(x, weight, norm=..., glu=glu) of one half-precision row x (..., K) has the bits of
    ops.rms_norm_linear(x, ..., weight, glu=glu) (no bias, no int8 scales): the launch it replaces would be
    the gemv kernel's default tile with the norm in its prologue (launch.gemv_rms_fits), and the row fits
    the chain's local memory beside a K of its own."""
    if not (isinstance(x, Tensor) and isinstance(weight, Tensor)) or weight.ndim != 2 or x.ndim < 1:
        return False
    n, k = weight.shape
    if x.size != k or x.shape[-1] != k or not dtypes.is_half(x.dtype) or weight.dtype != x.dtype \
            or weight.queue is not x.queue or (glu and n % 2) or k % 8:
        return False
    if not (x.is_contiguous() and weight.is_contiguous() and x.offset % 8 == 0 and weight.offset % 8 == 0):
        return False
    if not (gemv_fits(x.reshape(1, k), weight.transpose(0, 1))
            and gemv_rms_fits(x.device, x.dtype, 1, n // 2 if glu else n, k, glu=glu)):
        return False
    tile = usable_params(x.device, "gemv", x.dtype)
    return _local_bytes(x.device, tile, x.dtype, 1, k) <= x.device.capabilities.local_mem


def _stage_bytes(device: Any, tile: dict[str, int], dt: np.dtype, m: int, k: int,
                 attention: Any = None) -> int:
    """The chain's a_stage: the staged rows and the RMSNorm's partial sums, or a joined attention's local
    memory where that is more (the attention's tiles hold theirs there)."""
    stage = m * k * dt.itemsize + _gemv_prologue_bytes(device, tile, m)
    return stage if attention is None else max(stage, attention.local_bytes())


def _local_bytes(device: Any, tile: dict[str, int], dt: np.dtype, m: int, k: int,
                 attention: Any = None) -> int:
    """Local memory of a chain of m rows whose longest K is k: a_stage (_stage_bytes), the columns' partial
    sums (the kernel's scratch)."""
    return _stage_bytes(device, tile, dt, m, k, attention) + 4 * tile["GEMV_ROWS"] * 2 * m * tile["GEMV_WG"]


def _counts(steps: int) -> int:
    """A chain's own arrival counts with a joined attention (gemm_gemv.cl's CHAIN_COUNTS): the ticket, the
    attention's done count, each step's; the attention's merge counts follow."""
    return 2 + steps


def attention_fits(attention: Any, rows: Tensor, most_k: int) -> bool:
    """Whether `attention` (a DecodePhase) may join a chain of these rows (its output's, (M, K)) whose longest
    K is most_k: the rows' dtype and queue, its work-items within the chain's work-group (the tile's GEMV_WG x
    GEMV_ROWS; the items past its own only reach its barriers), and the local memory (the attention's in the
    chain's a_stage) within the device's."""
    if attention is None or attention.queue is not rows.queue or attention.dtype != rows.dtype:
        return False
    return _attention_fits(rows.device, rows.dtype, rows.shape[0], most_k, attention)


def _attention_fits(device: Any, dt: np.dtype, m: int, most_k: int, attention: Any) -> bool:
    tile = usable_params(device, "gemv", dt)
    if attention.items > tile["GEMV_WG"] * tile["GEMV_ROWS"]:
        return False
    return _local_bytes(device, tile, dt, m, most_k, attention) <= device.capabilities.local_mem


def _spin_defines() -> dict[str, Any]:
    """The wait's build switches of SPIN_NS (checked)."""
    if SPIN_NS is None:
        return {}
    if isinstance(SPIN_NS, bool) or not isinstance(SPIN_NS, int) or not 0 <= SPIN_NS <= 1_000_000:
        raise ValueError(f"chain.SPIN_NS must be None or an int of 0 to 1000000 ns, got {SPIN_NS!r}")
    return {"NC_SPIN_LOAD": None, "NC_SPIN_NS": SPIN_NS}


def _ahead_defines() -> dict[str, Any]:
    """The read-ahead's build switches of AHEAD (checked)."""
    if AHEAD is None:
        return {}
    ok = isinstance(AHEAD, tuple) and len(AHEAD) in (2, 3) and all(type(v) is int for v in AHEAD)
    if ok:
        lines, phases, far = (*AHEAD, 0) if len(AHEAD) == 2 else AHEAD
        ok = 1 <= lines <= 4096 and 0 < phases < 32 and not phases & 2 and 0 <= far < 32 and not far & ~phases
    if not ok:
        raise ValueError(f"chain.AHEAD must be None or (lines 1 to 4096, a mask of the phases 0, 2, 3, 4[, a "
                         f"mask of those of them that read two phases ahead]), got {AHEAD!r}")
    return {"GEMV_AHEAD_LINES": lines, "GEMV_AHEAD_PHASES": phases, "GEMV_AHEAD_FAR": far}


def _plan(device: Any, dt: np.dtype, m: int, args: dict[str, Any], defines: dict[str, Any],
          dynamic: dict[str, Any], attention: Any = None) -> tuple[Any, list[str]]:
    """(the Plan of a chain of this signature, the names of its dynamic arguments in the Plan's order)."""
    steps = defines["CHAIN_P"]
    tile = usable_params(device, "gemv", dt)
    knobs = {knob: tile[knob] for knob in ("GEMV_WG", "GEMV_ROWS", "GEMV_UNROLL")}
    defines = {**defines, "GEMV_M": m, **knobs, **_spin_defines()}
    wg, rows = tile["GEMV_WG"], tile["GEMV_ROWS"]
    most_k = max(int(args[f"k{i}"]) for i in range(steps))
    if _local_bytes(device, tile, dt, m, most_k) > device.capabilities.local_mem:
        raise ShapeError(f"gemv_chain: {m} rows of K = {most_k} {dt.name} do not fit {device.describe()}'s "
                         f"local memory ({device.capabilities.local_mem} bytes)")
    static: dict[str, Any] = {"M": np.int32(m),
                              "a_stage": cl.LocalMemory(_stage_bytes(device, tile, dt, m, most_k, attention))}
    for i in range(MAX_STEPS):
        live = i < steps
        static[f"n{i}"] = np.int32(args[f"n{i}"] if live else 0)
        static[f"k{i}"] = np.int32(args[f"k{i}"] if live else 8)
        static[f"eps{i}"] = np.float32(args[f"eps{i}"] if live else 0.0)
    tiles = sum(-(-int(args[f"n{i}"]) // rows) for i in range(steps))
    if attention is not None:
        if not _attention_fits(device, dt, m, most_k, attention):
            raise NetclError("gemv_chain: this attention cannot join the chain (attention_fits: more "
                             "work-items than the chain's work-group, or too much local memory)")
        defines = {**defines, **attention.program, "CHAIN_ATTN": None, "CHAIN_COUNTS": _counts(steps)}
        nsplit, heads, batch = attention.grid
        static.update(attn_heads=np.int32(heads), attn_batch=np.int32(batch))
        tiles += nsplit * heads * batch
    kernel = _program(device, "gemv", {"DTYPE": dt, **defines}).gemv_chain
    order = [i for i, name in enumerate(kernel.arg_names) if name in dynamic]
    plan = kernel.plan((wg, rows * tiles, 1), (wg, rows, 1), kernel.positional((), {**static, **dynamic}),
                       order)
    return plan, [kernel.arg_names[i] for i in order]


def gemv_chain(steps: list[ChainStep], attention: Any = None) -> list[Tensor]:
    """The outputs of `steps` (1 to MAX_STEPS ChainSteps), computed in one launch (module docstring); with
    `attention` (a DecodePhase where attention_fits), that attention's tiles first, in the same launch."""
    if not isinstance(steps, (list, tuple)) or not 1 <= len(steps) <= MAX_STEPS:
        raise ValueError(f"gemv_chain takes a list of 1 to {MAX_STEPS} ChainSteps, got "
                         f"{len(steps) if isinstance(steps, (list, tuple)) else type(steps).__name__}")
    outs: list[Tensor] = []
    args: dict[str, Any] = {}
    defines: dict[str, Any] = {"GEMV_CHAIN": None, "CHAIN_P": len(steps)}
    first = None
    for i, s in enumerate(steps):
        if not isinstance(s, ChainStep):
            raise TypeError(f"gemv_chain: step {i} is a {type(s).__name__}, not a ChainStep")
        a = _operand(i, "input", s.a, outs)
        if first is None:
            first = a
            if a.dtype not in _DTYPES:
                raise DTypeError(f"gemv_chain: {a.dtype} rows; the chain takes float32, float16 or bfloat16")
            if len(a.shape) != 2 or not 1 <= a.shape[0] <= MAX_ROWS:
                raise ShapeError(f"gemv_chain: the input rows must be 2-D (M, K) with 1 <= M <= {MAX_ROWS}, "
                                 f"got shape {a.shape}")
        q, dt, m = first.queue, first.dtype, first.shape[0]
        if len(a.shape) != 2 or a.shape[0] != m:
            raise ShapeError(f"gemv_chain: step {i}'s input has shape {a.shape}; every step takes the "
                             f"first's {m} rows")
        k = a.shape[1]
        if k % 8 or k == 0:
            raise ShapeError(f"gemv_chain: step {i}'s K = {k} must be a positive multiple of 8")
        w = s.weight
        if not isinstance(w, Tensor) or len(w.shape) != 2 or w.shape[1] != k or (s.glu and w.shape[0] % 2):
            raise ShapeError(f"gemv_chain: step {i}'s weight must be ({'2N' if s.glu else 'N'}, {k}), got "
                             f"{getattr(w, 'shape', type(w).__name__)}")
        n = w.shape[0] // 2 if s.glu else w.shape[0]
        if n == 0:
            raise ShapeError(f"gemv_chain: step {i} has no output columns")
        _aligned(i, "input", a, (m, k), dt, q)
        _aligned(i, "weight", w, w.shape, dt, q)
        res = None if s.residual is None else _operand(i, "residual", s.residual, outs)
        if res is not None:
            _aligned(i, "residual", res, (m, n), dt, q)
        norm_w, eps = None, 0.0
        if s.norm is not None:
            norm_w, eps = s.norm
            if not isinstance(norm_w, Tensor):
                raise TypeError(f"gemv_chain: step {i}'s norm must be (weight Tensor, eps)")
            _aligned(i, "norm weight", norm_w, (k,), dt, q)
            eps = float(eps)
            if not eps >= 0.0:
                raise ValueError(f"gemv_chain: step {i}'s norm eps must be >= 0, got {eps}")
        out = Tensor.empty(q, (m, n), dt)
        outs.append(out)
        flags = (_FLAGS["norm"] if norm_w is not None else 0) | (_FLAGS["glu"] if s.glu else 0) | (
            _FLAGS["residual"] if res is not None else 0)
        defines[f"CHAIN_F{i}"] = flags
        args.update({f"a{i}": a, f"w{i}": w, f"c{i}": out, f"r{i}": res if res is not None else out,
                     f"nw{i}": norm_w if norm_w is not None else out, f"n{i}": n, f"k{i}": k, f"eps{i}": eps})
    assert first is not None
    q = first.queue
    if attention is None:
        dynamic: dict[str, Any] = {"counts": q.arrival_counts(MAX_STEPS + 1)}
    else:   # the plan's build checks the rest (attention_fits)
        if attention.queue is not q or attention.dtype != first.dtype:
            raise NetclError(f"gemv_chain: the attention must be {first.dtype} on the chain's queue, got "
                             f"{attention.dtype} on {attention.queue.device.describe()}")
        dynamic = {"counts": q.arrival_counts(_counts(len(steps)) + attention.arrivals), **attention.args}
    for i in range(MAX_STEPS):
        live = i < len(steps)  # phases past CHAIN_P are not read
        for name in ("a", "w", "c", "r", "nw"):
            t = args[f"{name}{i}"] if live else outs[0]
            dynamic[f"{name}{i}"], dynamic[f"{name}{i}_off"] = t.buffer, np.int64(t.offset if live else 0)
    # one Plan per signature (dtype, rows, each step's sizes, flags and eps), in netcl.core.capture.plans: the
    # tile, the program and the fixed arguments are worked out once; a call sets the buffers and offsets
    key = ("gemv_chain", id(q.device), first.dtype, first.shape[0],
           tuple((args[f"n{i}"], args[f"k{i}"], defines[f"CHAIN_F{i}"], args[f"eps{i}"])
                 for i in range(len(steps))),
           None if attention is None else (tuple(sorted(attention.program.items())), attention.grid), SPIN_NS)
    hit = capture.plans.get(key)
    if hit is None:
        hit = capture.plans.put(key, _plan(q.device, first.dtype, first.shape[0], args, defines, dynamic,
                                           attention))
    plan, names = hit
    plan(q, *[dynamic[n] for n in names])
    return outs


# -- whole decode layers in one launch (gemm_gemv.cl's gemv_layers) ------------------------------------------
MAX_LAYERS = 32     # gemv_layers' layers a launch at most (its LAYERS_ARGS cascade)
# TRACE: gemv_layers' tiles stamp their start, release, end and arrival (gemm_gemv.cl's CHAIN_TRACE) into a
# buffer of their own; read_trace() gives the last traced launch's records (bench/decode.py --trace). A
# diagnostic: the stamps cost a few stores a tile.
TRACE = False
_last_trace: dict[str, Any] = {}
_LAYER_ARGS = 16    # a layer's own arguments (LAYER_ARGS: 8 buffers and their offsets)
_LAYERS_FIXED_ARGS = 54  # gemv_layers' other arguments (tests/ops/test_gemv_chain.py checks both counts)


@dataclass(frozen=True)
class DecodeLayer:
    """One decode layer's operands for gemv_layers: the stacked q/k/v weight (NQ, D) and the RMSNorm weight
    (D,) before it, the layer's key and value caches (the attention's), the o-projection (D, KO), the MLP's
    RMSNorm weight (D,), the stacked gate/up weight (2F, D) and the down-projection (D, F)."""

    qkv: Tensor
    attn_norm: Tensor
    k_cache: Tensor
    v_cache: Tensor
    o: Tensor
    mlp_norm: Tensor
    gate_up: Tensor
    down: Tensor


def layers_per_launch(device: Any) -> int:
    """How many decode layers one gemv_layers launch takes on `device`: as many as its kernel-argument space
    (CL_DEVICE_MAX_PARAMETER_SIZE; 8 bytes counted for every argument) holds beside the fixed ones, at most
    MAX_LAYERS (1024 bytes, OpenCL's minimum and PoCL's: 4; NVIDIA's 4352: 32)."""
    room = device.capabilities.max_parameter_size // 8 - _LAYERS_FIXED_ARGS
    return max(0, min(MAX_LAYERS, room // _LAYER_ARGS))


def _check_layers(x: Tensor, layers: list[DecodeLayer]) -> tuple[int, int, int]:
    """(NQ, KO, F) of layers that gemv_layers takes after x (M, D); a clear error for anything else."""
    if not isinstance(x, Tensor) or x.ndim != 2 or not 1 <= x.shape[0] <= MAX_ROWS:
        raise ShapeError(f"gemv_layers: x must be a 2-D Tensor (M, D) with 1 <= M <= {MAX_ROWS}, got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    if x.dtype not in _DTYPES:
        raise DTypeError(f"gemv_layers: {x.dtype} rows; the layers take float32, float16 or bfloat16")
    if not isinstance(layers, (list, tuple)) or not layers:
        raise ValueError("gemv_layers takes a non-empty list of DecodeLayers")
    m, d = x.shape
    first = layers[0]
    if not isinstance(first, DecodeLayer):
        raise TypeError(f"gemv_layers: layer 0 is a {type(first).__name__}, not a DecodeLayer")
    nq, ko, f = first.qkv.shape[0], first.o.shape[1], first.down.shape[1]
    if min(d, nq, ko, f) <= 0 or d % 8 or nq % 8 or ko % 8 or f % 8:
        raise ShapeError(f"gemv_layers: D = {d}, NQ = {nq}, KO = {ko} and F = {f} must be positive multiples "
                         "of 8")
    _aligned(0, "input", x, (m, d), x.dtype, x.queue)
    cache = first.k_cache
    for j, layer in enumerate(layers):
        if not isinstance(layer, DecodeLayer):
            raise TypeError(f"gemv_layers: layer {j} is a {type(layer).__name__}, not a DecodeLayer")
        for what, t, shape in (("qkv", layer.qkv, (nq, d)), ("attn_norm", layer.attn_norm, (d,)),
                               ("o", layer.o, (d, ko)), ("mlp_norm", layer.mlp_norm, (d,)),
                               ("gate_up", layer.gate_up, (2 * f, d)), ("down", layer.down, (d, f))):
            if not isinstance(t, Tensor):
                raise TypeError(f"gemv_layers: layer {j}'s {what} must be a Tensor, got {type(t).__name__}")
            _aligned(j, f"layer {j}'s {what}", t, shape, x.dtype, x.queue)
        for what, t in (("k_cache", layer.k_cache), ("v_cache", layer.v_cache)):
            if not isinstance(t, Tensor) or t.queue is not x.queue or t.dtype != x.dtype \
                    or t.shape != cache.shape or t.strides != cache.strides:
                raise ShapeError(f"gemv_layers: layer {j}'s {what} must be a {x.dtype} Tensor on x's queue "
                                 f"shaped and strided as layer 0's key cache {cache.shape}")
    return nq, ko, f


def gemv_layers(x: Tensor, layers: list[DecodeLayer], eps: tuple[float, float],
                attention: Any) -> Tensor | None:
    """The rows x (M, D) through whole decode layers (each: RMSNorm + q/k/v, the decode attention with its
    caches, o-projection + residual, RMSNorm + gate/up + SwiGLU, down + residual; gemm_gemv.cl's gemv_layers)
    in as few launches as the device's argument space allows (layers_per_launch): the last layer's output
    (M, D), every phase with the bits of its own launch (gemv_chain's steps and the DecodePhase's attention),
    the caches written as those launches write them. eps: the two RMSNorms' (attention's, MLP's), the same in
    every layer. attention(qkv, n): the DecodePhase (ops.rope_cache_decode_phase, not launched) of layer 0's
    attention reading the q/k/v rows `qkv` (M, NQ), sized for n layers; its arguments serve every layer (each
    layer's caches are its own, shaped and strided as layer 0's).

    None, having launched nothing, where the layers cannot run so: attention() gives None, the attention does
    not fit the launch's work-group (attention_fits), or the device's argument space holds no layer."""
    nq, ko, f = _check_layers(x, layers)
    q, dt, (m, d) = x.queue, x.dtype, x.shape
    eps_a, eps_m = (float(e) for e in eps)
    if not (eps_a >= 0.0 and eps_m >= 0.0):
        raise ValueError(f"gemv_layers: the norms' eps must be >= 0, got {eps}")
    per = layers_per_launch(q.device)
    if per == 0:
        return None
    layer_act = m * (nq + ko + d + f + d)
    act = Tensor.empty(q, (len(layers) * layer_act,), dt)
    n0 = min(per, len(layers))
    phase = attention(act[:m * nq].reshape(m, nq), n0)
    if phase is None or phase.queue is not q or phase.dtype != dt \
            or not _attention_fits(q.device, dt, m, max(d, ko, f), phase):
        return None
    at_z = m * (nq + ko + d + f)
    for a in range(0, len(layers), per):
        chunk = layers[a:a + per]
        x_in = x if a == 0 else act[(a - 1) * layer_act + at_z:(a - 1) * layer_act + at_z + m * d]
        _launch_layers(x_in, act, a * layer_act, chunk, (nq, ko, d, f), (eps_a, eps_m), phase)
    last = (len(layers) - 1) * layer_act + at_z
    return act[last:last + m * d].reshape(m, d)


def _launch_layers(x: Tensor, act: Tensor, act_off: int, layers: list[DecodeLayer], sizes: tuple[int, ...],
                   eps: tuple[float, float], phase: Any) -> None:
    q, dt, m = act.queue, act.dtype, x.size // sizes[2]
    n = len(layers)
    counts = q.arrival_counts(1 + 5 * n + n * phase.arrivals)
    tiles = n * _layer_tiles(q.device, dt, sizes, phase) if TRACE else 0
    trace = _trace_buffer(q, tiles) if TRACE else None
    dynamic: dict[str, Any] = {
        "counts": counts, "trace": counts if trace is None else trace, "x": x.buffer,
        "x_off": np.int64(x.offset), "act": act.buffer, "act_off": np.int64(act.offset + act_off)}
    for j, layer in enumerate(layers):
        for name, t in (("wq", layer.qkv), ("nwa", layer.attn_norm), ("kc", layer.k_cache),
                        ("vc", layer.v_cache), ("wo", layer.o), ("nwm", layer.mlp_norm),
                        ("wgu", layer.gate_up), ("wd", layer.down)):
            dynamic[f"{name}{j}"], dynamic[f"{name}{j}_off"] = t.buffer, np.int64(t.offset)
    call = {**phase.args, **dynamic}   # the attention's arguments not gemv_layers' are not read
    key = ("gemv_layers", id(q.device), dt, m, sizes, eps, n, tuple(sorted(phase.program.items())),
           phase.grid, SPIN_NS, AHEAD, CAP_REGISTERS, trace is not None)
    hit = capture.plans.get(key)
    if hit is None:
        hit = capture.plans.put(key, _layers_plan(q.device, dt, m, sizes, eps, n, phase, call, key[-1]))
    plan, names = hit
    plan(q, *[call[name] for name in names])
    if trace is not None:
        _last_trace.update(queue=q, buffer=trace, tiles=tiles, layers=n, attention_grid=tuple(phase.grid),
                           phase_tiles=_phase_tiles(q.device, dt, sizes, phase))


def _trace_buffer(q: Any, tiles: int) -> cl.Buffer:
    """A zeroed trace for a launch of `tiles` tiles (a clock, then five 64-bit words a tile), kept while
    the last traced launch's shape stays."""
    if _last_trace.get("queue") is q and _last_trace.get("tiles") == tiles:
        return _last_trace["buffer"]
    flags = cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR
    return cl.Buffer(q.device.context, flags, hostbuf=np.zeros(1 + 5 * tiles, np.uint64))


def _phase_tiles(device: Any, dt: np.dtype, sizes: tuple[int, ...], phase: Any) -> tuple[int, ...]:
    """The tiles of a layer's five phases in gemv_layers (q/k/v, attention, o, gate/up, down)."""
    nq, _, d, f = sizes
    rows = usable_params(device, "gemv", dt)["GEMV_ROWS"]
    nsplit, heads, batch = phase.grid
    return (-(-nq // rows), nsplit * heads * batch, -(-d // rows), -(-f // rows), -(-d // rows))


def _layer_tiles(device: Any, dt: np.dtype, sizes: tuple[int, ...], phase: Any) -> int:
    return sum(_phase_tiles(device, dt, sizes, phase))


def read_trace() -> dict[str, Any] | None:
    """The records of the last gemv_layers launch made with TRACE on (its queue finished first), or None:
    {"start", "release", "end", "arrived"}: int64 arrays by ticket (NVIDIA: ns of %globaltimer from the
    launch's first start; elsewhere ticks of a device-wide counter, an order only), "phase" (the phase number
    g = 5 * layer + p in the launch, p: 0 q/k/v, 1 attention, 2 o, 3 gate/up, 4 down), "tile" (within its
    phase; an attention tile's is (batch row * kv heads + kv head) * splits + split), "unit" (the compute
    unit, NVIDIA), "phase_tiles" (a layer's tiles by p), "attention_grid" (splits, kv heads, batch rows),
    "layers", "ns" (whether the stamps are ns)."""
    if not _last_trace:
        return None
    q, tiles = _last_trace["queue"], _last_trace["tiles"]
    q.finish()
    words = np.empty(1 + 5 * tiles, np.uint64)
    cl.enqueue_copy(q.cl, words, _last_trace["buffer"])
    rec = words[1:].reshape(tiles, 5)
    info = rec[:, 4]
    stamps = rec[:, :4].astype(np.int64)
    ns = backend.nvidia_define(q.device) is not None
    if ns:
        stamps = stamps - stamps[:, 0].min()
    return {"start": stamps[:, 0], "release": stamps[:, 1], "end": stamps[:, 2], "arrived": stamps[:, 3],
            "phase": (info & 0xFFFF).astype(np.int64), "tile": ((info >> 16) & 0xFFFFFF).astype(np.int64),
            "unit": (info >> 40).astype(np.int64), "phase_tiles": _last_trace["phase_tiles"],
            "attention_grid": _last_trace["attention_grid"],
            "layers": _last_trace["layers"], "ns": ns}


def _register_cap(items: int) -> int:
    """The most registers a work-item may take while three work-groups of `items` work-items still share an
    SM (in steps of 8, as NVIDIA allocates them; at most 255)."""
    return min(255, REGISTER_FILE // (3 * items) // 8 * 8)


def _layers_plan(device: Any, dt: np.dtype, m: int, sizes: tuple[int, ...], eps: tuple[float, float], n: int,
                 phase: Any, call: dict[str, Any], trace: bool = False) -> tuple[Any, list[str]]:
    """(the Plan of a gemv_layers launch of n layers, the names of its per-call arguments in the Plan's
    order): the sizes, the norms' eps and the tile fixed; the buffers, offsets and the attention's arguments
    (`call`: this call's) set per call."""
    nq, ko, d, f = sizes
    tile = usable_params(device, "gemv", dt)
    knobs = {knob: tile[knob] for knob in ("GEMV_WG", "GEMV_ROWS", "GEMV_UNROLL")}
    rows = tile["GEMV_ROWS"]
    most_k = max(d, ko, f)
    defines = {"DTYPE": dt, "GEMV_CHAIN": None, "GEMV_LAYERS": n, "GEMV_M": m, **knobs, **phase.program,
               "CHAIN_COUNTS": 1 + 5 * n, **_spin_defines(), **_ahead_defines()}
    if CAP_REGISTERS and "DECODE_PRELOAD" in phase.program:
        defines["MAX_REGISTERS"] = (("gemv_layers", _register_cap(tile["GEMV_WG"] * rows)),)
    if trace:
        defines["CHAIN_TRACE"] = None
    static: dict[str, Any] = {
        "M": np.int32(m), "a_stage": cl.LocalMemory(_stage_bytes(device, tile, dt, m, most_k, phase)),
        "NQ": np.int32(nq), "KO": np.int32(ko), "D": np.int32(d), "F": np.int32(f),
        "eps_a": np.float32(eps[0]), "eps_m": np.float32(eps[1]),
        "attn_heads": np.int32(phase.grid[1]), "attn_batch": np.int32(phase.grid[2])}
    kernel = _program(device, "gemv", defines).gemv_layers
    if len(kernel.arg_names) != _LAYERS_FIXED_ARGS + _LAYER_ARGS * n:
        raise NetclError(f"gemv_layers has {len(kernel.arg_names)} arguments for {n} layers; "
                         f"chain._LAYERS_FIXED_ARGS and _LAYER_ARGS are out of date")
    per_layer = _layer_tiles(device, dt, sizes, phase)
    order = [i for i, name in enumerate(kernel.arg_names) if name not in static]
    plan = kernel.plan((tile["GEMV_WG"], rows * per_layer * n, 1), (tile["GEMV_WG"], rows, 1),
                       [static[name] if name in static else call[name] for name in kernel.arg_names], order)
    return plan, [kernel.arg_names[i] for i in order]


__all__ = ["MAX_LAYERS", "MAX_ROWS", "MAX_STEPS", "ChainStep", "DecodeLayer", "attention_fits", "gemv_chain",
           "gemv_layers", "layers_per_launch", "read_trace"]
