"""2-D convolution (NCHW): conv2d with its backward passes, conv_transpose2d, and the algorithm pick.

Algorithms: 'direct' (register-blocked, barrier-free: the CPU shape), 'depthwise' (direct with one
channel per work-item row), 'winograd' (F(2x2,3x3) for 3x3 stride-1 dilation-1 groups-1),
'im2col' (im2col + the GEMM of netcl.ops.gemm). 'auto' picks by heuristic, after asking the
tuning database (netcl.kernels.tuning) when it exists.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl import kernels, profiling
from netcl.core import capture, dtypes, shapes
from netcl.core.tensor import Tensor, check_same_queue
from netcl.errors import DTypeError, ShapeError
from netcl.kernels import tuning
from netcl.ops import gemm as mm
from netcl.ops.elementwise import add
from netcl.ops.reduce import sum as sum_

ALGORITHMS = ("auto", "direct", "depthwise", "winograd", "im2col")
ACTIVATIONS = (None, "relu")  # what the direct and Winograd kernels fuse (kernels.ACTIVATIONS names)




# -- argument checks -----------------------------------------------------------------------------
def _float_dtype(op: str, *tensors: Tensor) -> np.dtype:
    dt = tensors[0].dtype
    for t in tensors:
        if t.dtype != dt:
            raise DTypeError(f"{op}: all tensors must share one dtype, got {[str(t.dtype) for t in tensors]}")
    if dt not in _DTYPES:
        raise DTypeError(f"{op} supports float16, bfloat16, float32 and float64 tensors, got {dt}")
    return dt


# float16/bfloat16: half storage, float32 arithmetic in the kernels (common.cl's LOAD_T/STORE_T, Winograd's
# transforms included) and the GEMM.
_DTYPES = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
_WINOGRAD_DTYPES = _DTYPES


def _check_winograd_dtype(op: str, dt: np.dtype) -> None:
    if dt not in _WINOGRAD_DTYPES:
        raise DTypeError(f"{op}: algorithm='winograd' supports float32 and float64 tensors, got {dt}; "
                         "use algorithm='auto' or 'im2col' for half")


def _activation(activation: str | None) -> str | None:
    """`activation` checked against what these kernels fuse (kernels.program takes the name)."""
    kernels.activation(activation, allowed=ACTIVATIONS)
    return activation


def _output_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


class ConvParams:
    """Checked geometry of one convolution: shapes, stride, padding, dilation, groups."""

    def __init__(self, x_shape: Sequence[int], w_shape: Sequence[int], stride: Any, padding: Any,
                 dilation: Any, groups: int, op: str = "conv2d"):
        if len(x_shape) != 4:
            raise ShapeError(f"{op}: input must be 4-D (N, C, H, W), got shape {tuple(x_shape)}")
        if len(w_shape) != 4:
            raise ShapeError(f"{op}: weight must be 4-D (K, C/groups, KH, KW), got shape {tuple(w_shape)}")
        self.N, self.C, self.H, self.W = (int(v) for v in x_shape)
        self.K, cg, self.KH, self.KW = (int(v) for v in w_shape)
        self.G = shapes.size(groups, f"{op}: groups", minimum=1)
        if self.C % self.G:
            raise ShapeError(f"{op}: input channels C={self.C} (input shape {tuple(x_shape)}) are not "
                             f"divisible by groups={self.G}")
        if self.K % self.G:
            raise ShapeError(f"{op}: output channels K={self.K} (weight shape {tuple(w_shape)}) are not "
                             f"divisible by groups={self.G}")
        if cg != self.C // self.G:
            raise ShapeError(f"{op}: weight shape {tuple(w_shape)} has {cg} input channels per group but the "
                             f"input shape {tuple(x_shape)} with groups={self.G} needs {self.C // self.G}; "
                             "weight must be (K, C/groups, KH, KW)")
        if self.KH < 1 or self.KW < 1:
            raise ShapeError(
                f"{op}: kernel size {(self.KH, self.KW)} from weight shape {tuple(w_shape)} is empty"
            )
        self.SH, self.SW = shapes.pair(stride, "stride", 1)
        self.DH, self.DW = shapes.pair(dilation, "dilation", 1)
        if isinstance(padding, str):
            if padding == "valid":
                padding = 0
            elif padding == "same":
                if (self.SH, self.SW) != (1, 1):
                    raise ShapeError(f"{op}: padding='same' needs stride 1, got stride {(self.SH, self.SW)}")
                eh, ew = self.DH * (self.KH - 1), self.DW * (self.KW - 1)
                if eh % 2 or ew % 2:
                    raise ShapeError(f"{op}: padding='same' needs an even dilated kernel extent, got "
                                     f"{(eh + 1, ew + 1)}; pad explicitly")
                padding = (eh // 2, ew // 2)
            else:
                raise ShapeError(f"{op}: padding must be an int, a pair, 'same' or 'valid', got {padding!r}")
        self.PH, self.PW = shapes.pair(padding, "padding", 0)
        self.OH = _output_size(self.H, self.KH, self.SH, self.PH, self.DH)
        self.OW = _output_size(self.W, self.KW, self.SW, self.PW, self.DW)
        if self.OH < 1 or self.OW < 1:
            raise ShapeError(
                f"{op}: kernel {(self.KH, self.KW)} with dilation "
                f"{(self.DH, self.DW)} does not fit the input "
                f"{(self.H, self.W)} padded by {(self.PH, self.PW)} (output would be {(self.OH, self.OW)}); "
                "use a smaller kernel or more padding"
            )

    @property
    def Cg(self) -> int:
        return self.C // self.G

    @property
    def Kg(self) -> int:
        return self.K // self.G

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        return (self.N, self.K, self.OH, self.OW)

    def geometry(self) -> tuple[np.int32, ...]:
        """Kernel arguments N..G in the order every conv kernel takes them (built once per instance:
        instances are shared through _params, and kernel args are only read)."""
        geom = self.__dict__.get("_geometry")
        if geom is None:
            vals = (self.N, self.C, self.H, self.W, self.K, self.OH, self.OW, self.KH, self.KW,
                    self.SH, self.SW, self.PH, self.PW, self.DH, self.DW, self.G)
            geom = self._geometry = tuple(np.int32(v) for v in vals)
        return geom

    @property
    def flops(self) -> int:
        return 2 * self.N * self.K * self.OH * self.OW * self.Cg * self.KH * self.KW

    def key(self) -> tuple:
        return (self.N, self.C, self.H, self.W, self.K, self.KH, self.KW, self.SH, self.SW, self.PH, self.PW,
                self.DH, self.DW, self.G)


_params_cache: dict[tuple, ConvParams] = {}


def _params(x_shape: Sequence[int], w_shape: Sequence[int], stride: Any, padding: Any, dilation: Any,
            groups: Any, op: str = "conv2d") -> ConvParams:
    """ConvParams(...), shared between calls with the same arguments (a training step repeats them);
    the checks run on the first call, so invalid arguments still raise every time (never cached)."""
    try:
        # repr: 2 and 2.0 (or (2, 2) and (2.0, 2.0)) hash alike, but only the int is a valid size
        key = (tuple(x_shape), tuple(w_shape), repr((stride, padding, dilation, groups)), op)
        hit = _params_cache.get(key)
    except TypeError:  # unhashable arguments (lists): no sharing
        return ConvParams(x_shape, w_shape, stride, padding, dilation, groups, op)
    if hit is None:
        hit = ConvParams(x_shape, w_shape, stride, padding, dilation, groups, op)
        if len(_params_cache) < 4096:
            _params_cache[key] = hit
    return hit


# Checked calls: a training step repeats each call with the same shapes, strides, dtypes, queues and
# parameters. The first call runs every check and the algorithm choice; later calls with the same
# signature reuse its result (ConvParams, algorithm) and go straight to allocation and launches, which
# are the same launches with the same arguments (results stay bit-identical). Offsets are not part
# of the signature: no check or choice depends on them, and every launch passes them afresh.
_checked: dict[tuple, Any] = {}


def _shape_key(shape: Any) -> Any:
    """A shape argument as a hashable key part (lists become tuples; anything odd stays as given)."""
    return tuple(shape) if isinstance(shape, (list, tuple)) else shape


def _tsig(t: Any) -> tuple | None:
    """What checks see of a tensor (AttributeError for non-tensors: the slow path reports them)."""
    return None if t is None else (id(t.queue), t.shape, t.strides, t.dtype)


def _checked_key(op: str, tensors: tuple, *params: Any) -> tuple | None:
    try:
        key = (op, *(_tsig(t) for t in tensors), repr(params))  # repr: 2 and 2.0 must not share a key
        hash(key)
    except (AttributeError, TypeError):
        return None
    return key


def _remember(key: tuple | None, value: Any) -> Any:
    if key is not None and len(_checked) < 4096:
        _checked[key] = value
    return value


def _db_state(device: Any) -> tuple:
    """The tuning database state the 'auto' algorithm depends on (see _auto_algorithm)."""
    return tuning.state(device)


# -- algorithm choice ----------------------------------------------------------------------------
# The tuning database (netcl.kernels.tuning) keeps one family per pass; bench/conv.py --tune stores the
# fastest algorithm measured for a geometry, which 'auto' then takes over the defaults below.
TUNE_FAMILY = "conv2d_algorithm"
TUNE_FAMILIES = {"forward": TUNE_FAMILY, "backward_input": "conv2d_backward_input_algorithm",
                 "backward_weight": "conv2d_backward_weight_algorithm"}
PASS_ALGORITHMS = {"forward": ALGORITHMS[1:], "backward_input": ("gemm", "direct", "flipped"),
                   "backward_weight": ("gemm", "direct", "winograd")}


def _tune_key(p: ConvParams, dt: np.dtype) -> str:
    return f"{np.dtype(dt).name}:" + "x".join(str(v) for v in p.key())


def _tuned_algorithm(device: Any, p: ConvParams, dt: np.dtype, pass_: str = "forward") -> str | None:
    """The algorithm stored for this geometry and pass in the per-device tuning database, if any."""
    try:
        found = tuning.lookup(device, TUNE_FAMILIES[pass_], _tune_key(p, dt))
    except Exception:  # a tuning database that cannot answer must never break a convolution
        return None
    algo = (found or {}).get("algorithm")
    return algo if algo in PASS_ALGORITHMS[pass_] else None


def record_algorithm(device: Any, x_shape: Sequence[int], w_shape: Sequence[int], dt: Any, algorithm: str,
                     stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1,
                     pass_: str = "forward", **measured: Any) -> None:
    """Store the winning algorithm of one pass ('forward', 'backward_input', 'backward_weight') for one
    geometry (bench/conv.py --tune calls this)."""
    if algorithm not in PASS_ALGORITHMS[pass_]:
        raise ValueError(
            f"{algorithm!r} is not an algorithm of the {pass_} pass; one of {PASS_ALGORITHMS[pass_]}"
        )
    p = ConvParams(x_shape, w_shape, stride, padding, dilation, groups)
    tuning.database_for(device).put(
        TUNE_FAMILIES[pass_], _tune_key(p, np.dtype(dt)), {"algorithm": algorithm}, **measured
    )


def winograd_applicable(p: ConvParams) -> bool:
    return (p.KH, p.KW, p.SH, p.SW, p.DH, p.DW, p.G) == (3, 3, 1, 1, 1, 1, 1)


_algorithm_cache: dict[tuple, str] = {}


def _auto_algorithm(device: Any, p: ConvParams, dt: np.dtype) -> str:
    """select_algorithm memoised per (device, geometry, dtype, tuning database state): the database
    lookup formats a key and takes a lock every call. The state is netcl.kernels.tuning.state (like the
    GEMM template key)."""
    key = (id(device), p.key(), np.dtype(dt).str, *tuning.state(device))
    algo = _algorithm_cache.get(key)
    if algo is None:
        algo = select_algorithm(device, p, dt)
        if tuning.state(device)[-1] == key[-1] and len(_algorithm_cache) < 4096:
            _algorithm_cache[key] = algo
    return algo


# Below this many (direct-convolution) FLOPs a GPU convolution is launch-bound: im2col + GEMM's 2-3
# launches beat Winograd's 4 (filter, input, GEMM, output transforms).
WINOGRAD_MIN_FLOPS = 1 << 30
# CPUs (PoCL): Winograd's GEMMs take half im2col's time on ResNet layers (64-512 channels), and with the
# row-walking transforms (kernels/winograd.cl, `_rows`) the whole pass wins from about this size on;
# thin layers (few channels) stay with im2col, whose GEMM has the longer inner dimension.
WINOGRAD_MIN_FLOPS_CPU = 1 << 27
WINOGRAD_MIN_CHANNELS_CPU = 32


def winograd_pays(device: Any, flops: int, channels: int = 1 << 30) -> bool:
    """Whether Winograd (through the GEMM) beats im2col + GEMM for a 3x3 convolution of `flops`
    (direct count) whose smaller channel count is `channels`, by the device class's defaults."""
    if device.capabilities.kind == "cpu":
        return flops >= WINOGRAD_MIN_FLOPS_CPU and channels >= WINOGRAD_MIN_CHANNELS_CPU
    return flops >= WINOGRAD_MIN_FLOPS


def select_algorithm(device: Any, p: ConvParams, dt: np.dtype) -> str:
    """The algorithm 'auto' uses for this geometry on this device."""
    tuned = _tuned_algorithm(device, p, dt)
    winograd_ok = winograd_applicable(p) and np.dtype(dt) in _WINOGRAD_DTYPES
    if tuned is not None and (tuned != "winograd" or winograd_ok):
        return tuned
    if p.G > 1 and p.Cg == 1:
        return "depthwise"
    if winograd_ok and p.C >= 8 and p.K >= 8 and winograd_pays(device, p.flops, min(p.C, p.K)):
        return "winograd"  # GPUs, large: 1.9x im2col on the H200 (bench/NOTES.md)
    if p.G == 1:
        # on PoCL too: measured 9 GFLOP/s vs 1.7 for the direct kernel (bench/NOTES.md, convolution section)
        return "im2col"
    return "direct"


# -- forward -------------------------------------------------------------------------------------
def _direct_tiles(device: Any, p: ConvParams, depthwise: bool) -> tuple[int, int]:
    if depthwise:
        return 1, 8
    kb = 8 if p.Kg >= 8 else (4 if p.Kg >= 4 else 1)
    return kb, 4 if device.capabilities.kind == "cpu" else 2


def _conv_direct(x: Tensor, w: Tensor, bias: Tensor | None, out: Tensor, p: ConvParams, act: str | None,
                 depthwise: bool) -> None:
    kb, owb = _direct_tiles(x.device, p, depthwise)
    prg = kernels.program(x.device, "conv_direct.cl", dtype=x.dtype, act=act, KB=kb, OWB=owb)
    kblocks = p.G * math.ceil(p.Kg / kb)
    b = bias if bias is not None else out
    if capture.declaring():  # for the profiler: the convolution's FLOPs, x, w and out moved once
        profiling.work(p.flops, float(x.nbytes + w.nbytes + out.nbytes))
    prg.conv2d_direct(
        x.queue,
        (math.ceil(p.OW / owb), p.OH, p.N * kblocks),
        None,
        x.buffer,
        np.int64(x.offset),
        w.buffer,
        np.int64(w.offset),
        b.buffer,
        np.int64(b.offset),
        np.int32(bias is not None),
        out.buffer,
        np.int64(out.offset),
        *p.geometry(),
    )


def _winograd_rows(device: Any) -> bool:
    """CPUs take the Winograd transforms that walk a whole tile row per work-item (PoCL pays per
    work-item and vectorises unit-stride loops); GPUs one work-item per tile (coalesced)."""
    return device.capabilities.kind == "cpu"


# GPUs: the tile transforms as a 1-D launch of work-groups of this many work-items (FLAT in winograd.cl);
# 0: the (tiles, channels, images) grid with the driver's work-group.
WINOGRAD_FLAT = 0


def _tile_grid(tt: int, c: int, nb: int) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """Global and local size of a GPU tile transform over tt tiles x c channels x nb images."""
    if not WINOGRAD_FLAT:
        return (tt, c, nb), None
    total = tt * c * nb
    return (-(-total // WINOGRAD_FLAT) * WINOGRAD_FLAT,), (WINOGRAD_FLAT,)


def _winograd_program(x: Tensor, p: ConvParams, act: str | None = None) -> Any:
    """winograd.cl for x's device and dtype; the CPU's row kernels take CH tiles at a time, CH the
    largest of 8, 4, 2, 1 that divides the TW tiles of a row (kernels/winograd.cl)."""
    if not _winograd_rows(x.device):
        if WINOGRAD_FLAT:
            return kernels.program(x.device, "winograd.cl", dtype=x.dtype, act=act, FLAT=None)
        return kernels.program(x.device, "winograd.cl", dtype=x.dtype, act=act)
    tw = math.ceil(p.OW / 2)
    ch = next(c for c in (8, 4, 2, 1) if tw % c == 0)
    return kernels.program(x.device, "winograd.cl", dtype=x.dtype, act=act, CH=ch)


def winograd_transform_weight(w: Tensor, flip: bool = False) -> Tensor:
    """U = G g G^T for every (k, c) filter of a contiguous (K, C, 3, 3) weight: (16, K, C), 16 K x C
    matrices. flip=True transforms the filters rotated by 180 degrees into (16, C, K): the weight of the
    backward-data convolution (grad_x = conv(grad_y, rotated and transposed w)) without materialising it."""
    K, C = w.shape[0], w.shape[1]
    u = Tensor.empty(w.queue, (16, C, K) if flip else (16, K, C), w.dtype)
    prg = kernels.program(w.device, "winograd.cl", dtype=w.dtype)
    if _winograd_rows(w.device):
        prg.winograd_filter_rows_2x2_3x3(
            w.queue,
            (C if flip else K,),
            None,
            w=w.buffer,
            w_off=np.int64(w.offset),
            u=u.buffer,
            K=np.int32(K),
            C=np.int32(C),
            flip=np.int32(flip),
        )
    else:
        prg.winograd_filter_2x2_3x3(w.queue, (K * C,), None, w=w.buffer, w_off=np.int64(w.offset), u=u.buffer,
                                    K=np.int32(K), C=np.int32(C), SE=np.int64(K * C),
                                    SK=np.int64(1 if flip else C), SC=np.int64(K if flip else 1),
                                    flip=np.int32(flip))
    return u


def _winograd_chunk(device: Any, p: ConvParams, itemsize: int, per_tile: int | None = None) -> int:
    """Images per Winograd pass: what one 2x2 tile needs in transformed buffers (`per_tile` values;
    default 16 x max(C, K): the transformed input, then the product) stays within a quarter of the
    device's largest allocation (and 1 GiB)."""
    tiles = math.ceil(p.OH / 2) * math.ceil(p.OW / 2)
    per_image = (per_tile or 16 * max(p.C, p.K)) * tiles * itemsize
    budget = min(device.capabilities.max_alloc // 4, 1 << 30)
    return max(1, min(p.N, budget // max(per_image, 1)))


def _winograd_input(prg: Any, x: Tensor, p: ConvParams, n0: int, nb: int) -> Tensor:
    """V (16, C, nb*TT): B^T d B of every input tile of images n0..n0+nb-1."""
    th, tw = math.ceil(p.OH / 2), math.ceil(p.OW / 2)
    v = Tensor.empty(x.queue, (16, p.C, nb * th * tw), x.dtype)
    args = dict(x=x.buffer, x_off=np.int64(x.offset), v=v.buffer, n0=np.int32(n0), NB=np.int32(nb),
                C=np.int32(p.C), H=np.int32(p.H), W=np.int32(p.W), TW=np.int32(tw), TT=np.int32(th * tw),
                PH=np.int32(p.PH), PW=np.int32(p.PW))
    if _winograd_rows(x.device):
        prg.winograd_input_rows_2x2_3x3(x.queue, (th, p.C, nb), None, TH=np.int32(th), **args)
    else:
        prg.winograd_input_2x2_3x3(x.queue, *_tile_grid(th * tw, p.C, nb), **args)
    return v


def _conv_winograd(
    x: Tensor, u: Tensor, bias: Tensor | None, out: Tensor, p: ConvParams, act: str | None
) -> None:
    """Input transform -> 16 batched GEMMs U[e] (K x C) @ V[e] (C x tiles) -> output transform (bias and
    activation there), over chunks of images; `u` is the transformed weight (winograd_transform_weight).
    The GEMM is netcl's tuned one, so Winograd gains what it does on every device (2.25x fewer
    multiply-adds) on top of it."""
    prg = _winograd_program(x, p, act)
    th, tw = math.ceil(p.OH / 2), math.ceil(p.OW / 2)
    b = bias if bias is not None else out
    chunk = _winograd_chunk(x.device, p, x.itemsize)
    for n0 in range(0, p.N, chunk):
        nb = min(chunk, p.N - n0)
        v = _winograd_input(prg, x, p, n0, nb)
        m = mm.matmul(u, v)
        del v
        args = dict(
            m=m.buffer,
            bias=b.buffer,
            b_off=np.int64(b.offset),
            has_bias=np.int32(bias is not None),
            y=out.buffer,
            y_off=np.int64(out.offset),
            n0=np.int32(n0),
            NB=np.int32(nb),
            K=np.int32(p.K),
            OH=np.int32(p.OH),
            OW=np.int32(p.OW),
            TW=np.int32(tw),
            TT=np.int32(th * tw),
        )
        if _winograd_rows(x.device):
            prg.winograd_output_rows_2x2_3x3(x.queue, (th, p.K, nb), None, TH=np.int32(th), **args)
        else:
            prg.winograd_output_2x2_3x3(x.queue, *_tile_grid(th * tw, p.K, nb), **args)


WINOGRAD_SPLIT_WAVES = 2  # GPUs: weight-gradient slices until 16 x S x blocks >= this many x compute units
WINOGRAD_SPLIT_MIN = 512  # ... each slice at least this many tiles long


def _winograd_splits(device: Any, p: ConvParams, pt: int) -> int:
    """K slices of the weight gradient's GEMMs dU[e] = Z[e] @ V[e]^T (K x C, inner length pt = tiles):
    on GPUs enough slices that 16 x the output blocks (of the GEMM's tile for this shape) fill the device
    WINOGRAD_SPLIT_WAVES times over, each slice at least WINOGRAD_SPLIT_MIN long and dividing pt; CPUs keep
    one (16 x blocks already spread over the cores)."""
    if device.capabilities.kind == "cpu":
        return 1
    bm, bn = mm.tiled_block(device, np.float32, p.K, p.C, pt, 16)
    blocks = 16 * math.ceil(p.K / bm) * math.ceil(p.C / bn)
    target = WINOGRAD_SPLIT_WAVES * device.capabilities.compute_units
    best = 1
    for s in (2, 4, 8, 16, 32, 64):
        if blocks * best >= target or pt % s or pt // s < WINOGRAD_SPLIT_MIN:
            break
        best = s
    return best


def _backward_weight_winograd(x: Tensor, gy: Tensor, p: ConvParams) -> Tensor:
    """dW of a 3x3, stride-1 convolution by Winograd F(2x2, 3x3) run backwards (kernels/winograd.cl):
    V = B^T d B of the input tiles (as the forward), Z = A dY A^T of the output-gradient tiles, one
    batched GEMM dU[s, e] = Z[e][:, slice s] @ V[e][:, slice s]^T over the 16 positions e (and S slices
    of the tiles), then dW = G^T (sum over s of dU[s]) G. 2.25x fewer multiply-adds than im2col + GEMM,
    and no im2col buffer. Image chunks accumulate through the GEMM's residual epilogue."""
    prg = _winograd_program(x, p)
    th, tw = math.ceil(p.OH / 2), math.ceil(p.OW / 2)
    tt = th * tw
    chunk = _winograd_chunk(x.device, p, x.itemsize, per_tile=16 * (p.C + p.K))
    rows = _winograd_rows(x.device)
    splits = _winograd_splits(x.device, p, tt * math.gcd(chunk, p.N % chunk or chunk))  # divides every chunk
    du = None
    for n0 in range(0, p.N, chunk):
        nb = min(chunk, p.N - n0)
        pt = nb * tt
        v = _winograd_input(prg, x, p, n0, nb)                                  # (16, C, pt)
        z = Tensor.empty(x.queue, (16, p.K, pt), x.dtype)
        args = dict(gy=gy.buffer, gy_off=np.int64(gy.offset), z=z.buffer, n0=np.int32(n0), NB=np.int32(nb),
                    K=np.int32(p.K), OH=np.int32(p.OH), OW=np.int32(p.OW), TW=np.int32(tw), TT=np.int32(tt))
        if rows:
            prg.winograd_grad_output_rows_2x2_3x3(x.queue, (th, p.K, nb), None, TH=np.int32(th), **args)
        else:
            prg.winograd_grad_output_2x2_3x3(x.queue, *_tile_grid(tt, p.K, nb), **args)
        sl = pt // splits
        zs = z._view((splits, 16, p.K, sl), (sl, p.K * pt, pt, 1), z.offset)      # (S, 16, K, sl)
        vs = v._view((splits, 16, sl, p.C), (sl, p.C * pt, 1, pt), v.offset)      # (S, 16, sl, C)
        du = mm.matmul_epilogue(zs, vs, residual=du)                               # (S, 16, K, C)
        del v, z
    gw = Tensor.empty(x.queue, (p.K, p.C, 3, 3), x.dtype)
    args = dict(du=du.buffer, gw=gw.buffer, gw_off=np.int64(gw.offset), K=np.int32(p.K), C=np.int32(p.C),
                S=np.int32(du.shape[0]))
    if du.offset or not du.is_contiguous():
        du = du.contiguous()
        args["du"] = du.buffer
    if rows:
        prg.winograd_grad_filter_rows_2x2_3x3(x.queue, (p.K,), None, **args)
    else:
        prg.winograd_grad_filter_2x2_3x3(x.queue, (p.K * p.C,), None, **args)
    return gw


def _im2col_chunk(device: Any, p: ConvParams, itemsize: int) -> int:
    budget = min(device.capabilities.max_alloc // 2, 1 << 30)
    per_image = p.C * (p.KH * p.KW + 1) * p.OH * p.OW * itemsize
    return max(1, min(p.N, budget // max(per_image, 1)))


def _row_kernels(device: Any) -> bool:
    """CPUs get the im2col/col2im kernels where one work-item copies whole rows (PoCL pays per
    work-item and vectorises unit-stride loops); GPUs one work-item per element (coalesced)."""
    return device.capabilities.kind == "cpu"


_im2col_plans: dict[tuple, tuple] = {}


def _im2col(x: Tensor, p: ConvParams, n0: int, nb: int, ones_row: bool = False,
            batch_inner: bool = False) -> Tensor:
    """cols of images n0..n0+nb-1, R = Cg*KH*KW [+1 row of ones] rows of P = OH*OW positions each:
    (nb, G, R, P) per image, or with batch_inner (G, R, nb*P) (every image's positions in one row).
    The launch (kernel, sizes, scalar arguments) is built once per (device, dtype, geometry, chunk)."""
    key = (id(x.device), x.dtype, p, n0, nb, ones_row, batch_inner, _row_kernels(x.device))
    plan = _im2col_plans.get(key)
    if plan is None or plan[0] is not x.device:
        plan = _im2col_plan(x, p, n0, nb, ones_row, batch_inner)
        if len(_im2col_plans) < 4096:
            _im2col_plans[key] = plan
    _, shape, launch = plan
    cols = Tensor.empty(x.queue, shape, x.dtype)
    if launch is not None:
        if capture.declaring():  # for the profiler: nb images read, the columns written
            profiling.work(0.0, float(nb * p.C * p.H * p.W * x.itemsize + cols.nbytes))
        launch(x.queue, x.buffer, np.int64(x.offset), cols.buffer)
    return cols


def _im2col_plan(x: Tensor, p: ConvParams, n0: int, nb: int, ones_row: bool, batch_inner: bool) -> tuple:
    rows = p.Cg * p.KH * p.KW + int(ones_row)
    P = p.OH * p.OW
    if batch_inner:
        shape = (p.G, rows, nb * P)
        sb, sg, sr = P, rows * nb * P, nb * P
    else:
        shape = (nb, p.G, rows, P)
        sb, sg, sr = p.G * rows * P, rows * P, P
    if math.prod(shape) == 0:
        return (x.device, shape, None)
    prg = kernels.program(x.device, "im2col.cl", dtype=x.dtype)
    g = p.geometry()
    tail = (np.int64(sb), np.int64(sg), np.int64(sr),
            np.int32(n0), np.int32(nb), np.int32(ones_row), g[1], g[2], g[3], *g[5:])
    # a Plan (netcl.core.backend): the geometry arguments set once; x, its offset and cols per call
    args = (None, None, None, *tail)
    if _row_kernels(x.device):
        return (x.device, shape, prg.im2col_rows.plan((rows, nb * p.G), None, args, (0, 1, 2)))
    return (x.device, shape, prg.im2col.plan((P, p.Cg + int(ones_row), nb * p.G), None, args, (0, 1, 2)))


def _conv_im2col(x: Tensor, w: Tensor, bias: Tensor | None, p: ConvParams, activation: str | None) -> Tensor:
    """y[n, g] (Kg x OH*OW) = w[g] (Kg x R) @ cols[n, g] (R x OH*OW): the GEMM writes NCHW directly.

    The bias runs along the GEMM's rows: with one group the GEMM adds it per row in its epilogue
    (bias_rows); with several, w gets a bias column and cols a row of ones (R+1), since the bias then
    differs between the batched GEMMs. The epilogue applies the activation: one GEMM launch.
    """

    r = p.Cg * p.KH * p.KW
    wg = w.reshape(p.G, p.Kg, r)
    ones_row = bias is not None and p.G > 1
    row_bias = bias if bias is not None and not ones_row else None
    if ones_row:  # w and bias are contiguous here (conv2d made them so)
        wb = Tensor.empty(w.queue, (p.G, p.Kg, r + 1), w.dtype)
        prg = kernels.program(w.device, "im2col.cl", dtype=w.dtype)
        prg.weight_bias(w.queue, (r + 1, p.K), None, w.buffer, np.int64(w.offset), bias.buffer,
                        np.int64(bias.offset), wb.buffer, np.int32(p.K), np.int32(r))
        wg = wb
    if row_bias is not None:
        wg = wg.reshape(p.Kg, r)  # one group: a plain (K, R) matrix, shared by every image
    chunk = _im2col_chunk(x.device, p, x.itemsize)
    if chunk >= p.N:
        cols = _im2col(x, p, 0, p.N, ones_row=ones_row)
        if row_bias is not None:
            cols = cols.reshape(p.N, r, p.OH * p.OW)
        return mm.gemm(wg, cols, row_bias, activation, bias_rows=row_bias is not None).reshape(p.output_shape)
    out = Tensor.empty(x.queue, p.output_shape, x.dtype)
    for n0 in range(0, p.N, chunk):
        nb = min(chunk, p.N - n0)
        cols = _im2col(x, p, n0, nb, ones_row=ones_row)
        if row_bias is not None:
            cols = cols.reshape(nb, r, p.OH * p.OW)
        res = mm.gemm(wg, cols, row_bias, activation, bias_rows=row_bias is not None)
        out[n0:n0 + nb].copy_(res.reshape(nb, p.K, p.OH, p.OW))
    return out


def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1, activation: str | None = None,
           algorithm: str = "auto") -> Tensor:
    """y = act(conv(x, weight) + bias), NCHW; weight (K, C/groups, KH, KW), bias (K,).

    activation: None or 'relu' (fused into the kernel's output stage). algorithm: one of ALGORITHMS.
    """
    key = _checked_key("conv2d", (x, weight, bias), stride, padding, dilation, groups, activation, algorithm)
    if key is not None and algorithm == "auto":
        key += _db_state(x.device)
    hit = _checked.get(key) if key is not None else None
    if hit is not None:
        p, algo, act, dt = hit
    else:
        p, algo, act, dt = _remember(key, _conv2d_checks(x, weight, bias, stride, padding, dilation, groups,
                                                         activation, algorithm))
    x, weight = x.contiguous(), weight.contiguous()
    bias = bias.contiguous() if bias is not None else None
    if algo == "im2col" and p.N * p.K * p.OH * p.OW:
        return _conv_im2col(x, weight, bias, p, activation)
    out = Tensor.empty(x.queue, p.output_shape, dt)
    if out.size == 0:
        return out
    if algo == "winograd":
        _conv_winograd(x, winograd_transform_weight(weight), bias, out, p, act)
    else:
        _conv_direct(x, weight, bias, out, p, act, depthwise=(algo == "depthwise"))
    return out


def _conv2d_checks(x: Tensor, weight: Tensor, bias: Tensor | None, stride: Any, padding: Any, dilation: Any,
                   groups: int, activation: str | None, algorithm: str) -> tuple:
    """conv2d's argument checks and algorithm choice -> (ConvParams, algorithm, activation code, dtype)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    act = _activation(activation)
    tensors = (x, weight) if bias is None else (x, weight, bias)
    check_same_queue(*tensors)
    dt = _float_dtype("conv2d", *tensors)
    p = _params(x.shape, weight.shape, stride, padding, dilation, groups)
    if bias is not None and tuple(bias.shape) != (p.K,):
        raise ShapeError(
            f"conv2d: bias must have shape ({p.K},) for weight shape {weight.shape}, got {bias.shape}"
        )
    algo = _auto_algorithm(x.device, p, dt) if algorithm == "auto" else algorithm
    if algo == "winograd":
        _check_winograd_dtype("conv2d", dt)
    if algo == "winograd" and not winograd_applicable(p):
        raise ShapeError(f"conv2d: algorithm='winograd' needs a 3x3 kernel, stride 1, dilation 1, groups 1; "
                         f"got kernel {(p.KH, p.KW)}, stride {(p.SH, p.SW)}, dilation {(p.DH, p.DW)}, "
                         f"groups {p.G}")
    if algo == "depthwise" and p.Cg != 1:
        raise ShapeError(f"conv2d: algorithm='depthwise' needs groups == C (one input channel per group); "
                         f"got C={p.C}, groups={p.G}")
    return p, algo, act, dt


def conv2d_relu(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
                dilation: Any = 1, groups: int = 1, algorithm: str = "auto") -> Tensor:
    """relu(conv2d(x, weight) + bias) with the bias and relu in the convolution's output stage."""
    return conv2d(x, weight, bias, stride, padding, dilation, groups, activation="relu", algorithm=algorithm)


# -- backward ------------------------------------------------------------------------------------
def _check_grad_out(op: str, grad_out: Tensor, p: ConvParams) -> None:
    if tuple(grad_out.shape) != p.output_shape:
        raise ShapeError(f"{op}: grad_out has shape {tuple(grad_out.shape)} but the convolution's output "
                         f"shape is {p.output_shape}")


def conv2d_backward_input(grad_out: Tensor, weight: Tensor, input_shape: Sequence[int], stride: Any = 1,
                          padding: Any = 0, dilation: Any = 1, groups: int = 1,
                          algorithm: str = "auto") -> Tensor:
    """d(loss)/d(x) of conv2d, shape `input_shape`: a transposed convolution of grad_out by weight.

    algorithm: 'gemm' (cols[n, g] = w[g]^T (R x Kg) @ gy[n, g] (Kg x P), then col2im), 'direct'
    (the gather kernel), 'flipped' (stride 1, dilation 1, one group, padding below the kernel size: the
    forward convolution of grad_out with the spatially flipped, in/out-swapped weight and padding
    k - 1 - p, on whatever algorithm conv2d picks; on Winograd the rotated filters are transformed
    straight from `weight`), or 'auto': the tuning database's choice for this geometry, else flipped
    where it runs on Winograd and Winograd pays (3x3 kernels, winograd_pays), else gemm unless the
    layer is depthwise.
    """
    key = _checked_key("conv2d_backward_input", (grad_out, weight), _shape_key(input_shape), stride, padding,
                       dilation, groups, algorithm)
    if key is not None and algorithm == "auto":  # 'auto' reads the tuning database
        key += _db_state(grad_out.device)
    hit = _checked.get(key) if key is not None else None
    if hit is None:
        if algorithm not in ("auto", "gemm", "direct", "flipped"):
            raise ValueError(f"algorithm must be 'auto', 'gemm', 'direct' or 'flipped', got {algorithm!r}")
        check_same_queue(grad_out, weight)
        dt = _float_dtype("conv2d_backward_input", grad_out, weight)
        p = _params(tuple(input_shape), weight.shape, stride, padding, dilation, groups,
                    op="conv2d_backward_input")
        _check_grad_out("conv2d_backward_input", grad_out, p)
        flippable = ((p.SH, p.SW, p.DH, p.DW, p.G) == (1, 1, 1, 1, 1) and p.PH <= p.KH - 1
                     and p.PW <= p.KW - 1)
        winograd_dt = dt in _WINOGRAD_DTYPES  # 'auto' flips only where the flipped conv runs on Winograd
        if algorithm == "flipped" and not flippable:
            raise ShapeError(
                f"conv2d_backward_input: algorithm='flipped' needs stride 1, dilation 1, one group "
                f"and padding below the kernel size; got stride {(p.SH, p.SW)}, dilation "
                f"{(p.DH, p.DW)}, groups {p.G}, padding {(p.PH, p.PW)}, kernel {(p.KH, p.KW)}"
            )
        algo = algorithm
        if algorithm == "auto":
            tuned = _tuned_algorithm(grad_out.device, p, dt, "backward_input")
            flops = (
                2 * p.N * p.C * p.H * p.W * p.K * p.KH * p.KW
            )  # the flipped convolution's output is x-shaped
            if tuned is not None and (tuned != "flipped" or flippable):
                algo = tuned
            elif flippable and winograd_dt and p.KH == p.KW == 3 and min(p.C, p.K) >= 8 and winograd_pays(
                    grad_out.device, flops, min(p.C, p.K)):
                algo = "flipped"
            else:
                algo = "gemm" if p.Cg * p.Kg > 1 else "direct"
        flipped_algo = None
        if algo == "flipped":  # the forward convolution it runs, and that one's algorithm
            fp = _params(
                (p.N, p.K, p.OH, p.OW),
                (p.C, p.K, p.KH, p.KW),
                1,
                (p.KH - 1 - p.PH, p.KW - 1 - p.PW),
                1,
                1,
                op="conv2d_backward_input",
            )
            flipped_algo = (fp, _auto_algorithm(grad_out.device, fp, dt))
        hit = _remember(key, (p, dt, algo, flipped_algo))
    p, dt, algo, flipped_algo = hit
    if algo == "flipped":
        fp, fa = flipped_algo
        if fa == "winograd":  # the rotated, transposed filters transformed straight from the weight
            gx = Tensor.empty(grad_out.queue, (p.N, p.C, p.H, p.W), dt)
            if gx.size:
                _conv_winograd(
                    grad_out.contiguous(),
                    winograd_transform_weight(weight.contiguous(), flip=True),
                    None,
                    gx,
                    fp,
                    None,
                )
            return gx
        flipped = weight[:, :, ::-1, ::-1].permute(1, 0, 2, 3).contiguous()
        return conv2d(
            grad_out, flipped, None, stride=1, padding=(p.KH - 1 - p.PH, p.KW - 1 - p.PW), algorithm=fa
        )
    gx = Tensor.empty(grad_out.queue, (p.N, p.C, p.H, p.W), dt)
    if gx.size == 0:
        return gx
    gy, w = grad_out.contiguous(), weight.contiguous()
    if algo == "gemm" and p.OH * p.OW:
        _backward_input_gemm(gy, w, gx, p)
    else:
        _backward_input_into(gy, w, None, gx, p, None)
    return gx


def _backward_input_gemm(gy: Tensor, w: Tensor, gx: Tensor, p: ConvParams) -> None:
    """cols[n, g] (R x P) = w[g]^T (R x Kg) @ gy[n, g] (Kg x P) (the weight's transpose read in
    place, batch-broadcast over n), then col2im gathers cols back into gx; chunked over images."""

    r, P = p.Cg * p.KH * p.KW, p.OH * p.OW
    wt = w.reshape(p.G, p.Kg, r).transpose(1, 2)                              # (G, R, Kg)
    chunk = _im2col_chunk(gy.device, p, gy.itemsize)
    for n0 in range(0, p.N, chunk):
        nb = min(chunk, p.N - n0)
        cols = mm.matmul(wt, gy[n0:n0 + nb].reshape(nb, p.G, p.Kg, P))        # (nb, G, R, P)
        if cols.offset or not cols.is_contiguous():
            cols = cols.clone()  # the kernels index a contiguous cols from element 0
        _col2im_plan(gy, p, n0, nb)(gy.queue, cols.buffer, gx.buffer, np.int64(gx.offset))


_col2im_plans: dict[tuple, tuple] = {}


def _col2im_plan(gy: Tensor, p: ConvParams, n0: int, nb: int) -> Any:
    """The Plan (netcl.core.backend) of one col2im chunk, built once: cols, gx and gx's offset per call."""
    rows = _row_kernels(gy.device)
    key = (id(gy.device), gy.dtype, p, n0, nb, rows)
    plan = _col2im_plans.get(key)
    if plan is None or plan[0] is not gy.device:
        g = p.geometry()
        tail = (np.int32(n0), np.int32(nb), g[1], g[2], g[3], *g[5:])
        if rows:
            prg = kernels.program(gy.device, "im2col.cl", dtype=gy.dtype)
            plan = (gy.device, prg.col2im_plane.plan((nb * p.C,), None, (None, None, None, *tail), (0, 1, 2)))
        else:  # the taps compiled in: no runtime division per tap (kernels/im2col.cl)
            prg = kernels.program(
                gy.device,
                "im2col.cl",
                dtype=gy.dtype,
                TAP_KH=p.KH,
                TAP_KW=p.KW,
                TAP_SH=p.SH,
                TAP_SW=p.SW,
                TAP_PH=p.PH,
                TAP_PW=p.PW,
                TAP_DH=p.DH,
                TAP_DW=p.DW,
            )
            plan = (gy.device, prg.col2im.plan((p.W, p.H, nb * p.C), None, (None, None, None, *tail),
                                               (0, 1, 2)))
        if len(_col2im_plans) < 4096:
            _col2im_plans[key] = plan
    return plan[1]


def _backward_input_into(gy: Tensor, w: Tensor, bias: Tensor | None, gx: Tensor, p: ConvParams,
                         act: str | None) -> None:
    prg = kernels.program(gy.device, "conv_direct.cl", dtype=gy.dtype, act=act)
    b = bias if bias is not None else gx
    if capture.declaring():  # for the profiler: the convolution's FLOPs, grad_out, w and grad_in moved once
        profiling.work(p.flops, float(gy.nbytes + w.nbytes + gx.nbytes))
    prg.conv2d_backward_input(gy.queue, (p.W, p.H, p.N * p.C), None, gy.buffer, np.int64(gy.offset),
                              w.buffer, np.int64(w.offset), b.buffer, np.int64(b.offset),
                              np.int32(bias is not None), gx.buffer, np.int64(gx.offset), *p.geometry())


def conv2d_backward_weight(x: Tensor, grad_out: Tensor, weight_shape: Sequence[int], stride: Any = 1,
                           padding: Any = 0, dilation: Any = 1, groups: int = 1,
                           algorithm: str = "auto") -> Tensor:
    """d(loss)/d(weight) of conv2d, shape `weight_shape` (K, C/groups, KH, KW).

    algorithm: 'gemm' (im2col + GEMM: see _backward_weight_gemm), 'winograd' (3x3, stride 1, dilation 1,
    one group: Winograd F(2x2, 3x3) run backwards, _backward_weight_winograd), 'direct' (the gather
    kernel: one work-item per weight element), or 'auto': the tuning database's choice for this
    geometry, else winograd where it pays (winograd_pays), else gemm.
    """
    key = _checked_key("conv2d_backward_weight", (x, grad_out), _shape_key(weight_shape), stride, padding,
                       dilation, groups, algorithm)
    if key is not None and algorithm == "auto":  # 'auto' reads the tuning database
        key += _db_state(x.device)
    hit = _checked.get(key) if key is not None else None
    if hit is None:
        if algorithm not in ("auto", "gemm", "direct", "winograd"):
            raise ValueError(f"algorithm must be 'auto', 'gemm', 'direct' or 'winograd', got {algorithm!r}")
        check_same_queue(x, grad_out)
        dt = _float_dtype("conv2d_backward_weight", x, grad_out)
        p = _params(
            x.shape, tuple(weight_shape), stride, padding, dilation, groups, op="conv2d_backward_weight"
        )
        _check_grad_out("conv2d_backward_weight", grad_out, p)
        if algorithm == "winograd":
            _check_winograd_dtype("conv2d_backward_weight", dt)
        if algorithm == "winograd" and not winograd_applicable(p):
            raise ShapeError(
                f"conv2d_backward_weight: algorithm='winograd' needs a 3x3 kernel, stride 1, dilation "
                f"1, groups 1; got kernel {(p.KH, p.KW)}, stride {(p.SH, p.SW)}, dilation "
                f"{(p.DH, p.DW)}, groups {p.G}"
            )
        algo = algorithm
        if algorithm == "auto":
            tuned = _tuned_algorithm(x.device, p, dt, "backward_weight")
            winograd_ok = winograd_applicable(p) and dt in _WINOGRAD_DTYPES
            if tuned is not None and (tuned != "winograd" or winograd_ok):
                algo = tuned
            elif (
                winograd_ok
                and min(p.C, p.K) >= 8
                and winograd_pays(x.device, p.flops, min(p.C, p.K))
            ):
                algo = "winograd"
            else:
                algo = "gemm"
        hit = _remember(key, (p, dt, algo))
    p, dt, algo = hit
    x, grad_out = x.contiguous(), grad_out.contiguous()
    if algo in ("gemm", "winograd"):
        if p.N * p.OH * p.OW == 0:
            return Tensor.zeros(x.queue, (p.K, p.Cg, p.KH, p.KW), dt)
        if algo == "winograd":
            return _backward_weight_winograd(x, grad_out, p)
        return _backward_weight_gemm(x, grad_out, p)
    gw = Tensor.empty(x.queue, (p.K, p.Cg, p.KH, p.KW), dt)
    prg = kernels.program(x.device, "conv_direct.cl", dtype=dt)
    prg.conv2d_backward_weight(x.queue, (p.Cg * p.KH * p.KW, p.K), None, x.buffer, np.int64(x.offset),
                               grad_out.buffer, np.int64(grad_out.offset), gw.buffer, np.int64(gw.offset),
                               *p.geometry())
    return gw


def _backward_weight_gemm(x: Tensor, gy: Tensor, p: ConvParams) -> Tensor:
    """GPUs with at least as many positions per image as rows of cols (P >= R: early layers): one GEMM
    batched over images and a sum (_backward_weight_batched); else (late layers, where the per-image
    products would be thin and their (N, K, R) workspace large) and on CPUs: one long-K GEMM over
    batch-inner columns (_backward_weight_rows; split K where M x N is small)."""
    if x.device.capabilities.kind != "cpu" and p.OH * p.OW >= p.Cg * p.KH * p.KW:
        return _backward_weight_batched(x, gy, p)
    return _backward_weight_rows(x, gy, p)


def _backward_weight_batched(x: Tensor, gy: Tensor, p: ConvParams) -> Tensor:
    """GPUs: gw[g] (Kg x R) = sum over images n of gy[n, g] (Kg x P) @ cols[n, g]^T (P x R): one batched
    GEMM over the images (gy read in place, cols in the forward's per-image layout, tile-divisible
    shapes take the edge-free kernel) into a (nb, G, Kg, R) workspace, then one sum over the images.
    On the H200 this replaced the 1x1 im2col that transposed gy into the single long-K GEMM's layout
    (one pass over gy and one launch less; bench/NOTES.md)."""
    r = p.Cg * p.KH * p.KW
    per_image = max(p.K * r, p.G * r * p.OH * p.OW) * x.itemsize
    budget = min(x.device.capabilities.max_alloc // 4, 1 << 28)
    chunk = max(1, min(p.N, _im2col_chunk(x.device, p, x.itemsize), budget // max(per_image, 1)))
    gw = None
    for n0 in range(0, p.N, chunk):
        nb = min(chunk, p.N - n0)
        cols = _im2col(x, p, n0, nb)                                              # (nb, G, R, P)
        g = gy[n0:n0 + nb].reshape(nb, p.G, p.Kg, p.OH * p.OW)                   # a view
        part = sum_(mm.matmul(g, cols.transpose(2, 3)), axis=0)                  # (G, Kg, R)
        gw = part if gw is None else add(gw, part)
    return gw.reshape(p.K, p.Cg, p.KH, p.KW)


def _backward_weight_rows(x: Tensor, gy: Tensor, p: ConvParams) -> Tensor:
    """CPUs: gw[g] (Kg x R) = sum over image chunks of gy[chunk, g] (Kg x nb*P) @ cols[g]^T (nb*P x R).

    cols is written batch-inner, (G, R, nb*P), so its transpose is read in place with unit stride
    along the GEMM's K; gy is copied once to (G, Kg, nb*P). Later chunks accumulate through the
    GEMM's residual epilogue (no separate reduction launch)."""
    chunk = _im2col_chunk(x.device, p, x.itemsize)
    # gy (N, K, OH, OW) -> (G, Kg, N*P) is the im2col of a 1x1 convolution over gy: the same row-copy
    # kernel (a generic strided copy measured 2x slower than the GEMM it feeds on PoCL)
    gp = _params(gy.shape, (p.K, p.Kg, 1, 1), 1, 0, 1, p.G, op="conv2d_backward_weight")
    gw = None
    for n0 in range(0, p.N, chunk):
        nb = min(chunk, p.N - n0)
        cols = _im2col(x, p, n0, nb, batch_inner=True)                        # (G, R, nb*P)
        g = _im2col(gy, gp, n0, nb, batch_inner=True)                        # (G, Kg, nb*P)
        gw = mm.matmul_epilogue(g, cols.transpose(1, 2), residual=gw)        # (G, Kg, R)
    return gw.reshape(p.K, p.Cg, p.KH, p.KW)


def conv2d_backward_bias(grad_out: Tensor) -> Tensor:
    """d(loss)/d(bias) of conv2d: grad_out summed over N, H, W -> (K,)."""
    if grad_out.ndim != 4:
        raise ShapeError(f"conv2d_backward_bias: grad_out must be 4-D (N, K, OH, OW), got {grad_out.shape}")
    dt = _float_dtype("conv2d_backward_bias", grad_out)
    g = grad_out.contiguous()
    n, k, oh, ow = g.shape
    gb = Tensor.empty(g.queue, (k,), dt)
    # one work-group per channel: 256 work-items on GPUs (a 128x16x28x28 gradient took 1.3 ms with one
    # work-item per channel on the H200), 8 on CPUs (PoCL vectorises across them)
    wg = 8 if g.device.capabilities.kind == "cpu" else 256
    prg = kernels.program(g.device, "conv_direct.cl", dtype=dt, BWG=wg)
    prg.conv2d_backward_bias(g.queue, (k * wg,), (wg,), g.buffer, np.int64(g.offset), gb.buffer, np.int64(0),
                             np.int32(n), np.int32(k), np.int32(oh * ow))
    return gb


# -- transposed convolution ----------------------------------------------------------------------
def conv_transpose2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
                     output_padding: Any = 0, groups: int = 1, dilation: Any = 1,
                     activation: str | None = None) -> Tensor:
    """Transposed convolution (the gradient of conv2d w.r.t. its input), PyTorch's layout:
    x (N, Cin, H, W), weight (Cin, Cout/groups, KH, KW), bias (Cout,) -> (N, Cout, Hout, Wout) with
    Hout = (H - 1)*stride - 2*padding + dilation*(KH - 1) + output_padding + 1.
    """
    act = _activation(activation)
    tensors = (x, weight) if bias is None else (x, weight, bias)
    check_same_queue(*tensors)
    dt = _float_dtype("conv_transpose2d", *tensors)
    if x.ndim != 4 or weight.ndim != 4:
        raise ShapeError(f"conv_transpose2d: input and weight must be 4-D, got {x.shape} and {weight.shape}")
    if not isinstance(groups, (int, np.integer)) or groups < 1:
        raise ShapeError(f"conv_transpose2d: groups must be a positive int, got {groups!r}")
    n, cin, h, w_ = x.shape
    if weight.shape[0] != cin:
        raise ShapeError(f"conv_transpose2d: weight shape {weight.shape} must start with the input's "
                         f"{cin} channels (input shape {x.shape}); weight is (Cin, Cout/groups, KH, KW)")
    if cin % groups:
        raise ShapeError(
            f"conv_transpose2d: input channels {cin} (input shape {x.shape}) are not divisible by "
            f"groups={groups}"
        )
    cout = weight.shape[1] * groups
    kh, kw = weight.shape[2], weight.shape[3]
    sh, sw = shapes.pair(stride, "stride", 1)
    ph, pw = shapes.pair(padding, "padding", 0)
    dh, dw = shapes.pair(dilation, "dilation", 1)
    oph, opw = shapes.pair(output_padding, "output_padding", 0)
    if oph >= max(sh, dh) or opw >= max(sw, dw):
        raise ShapeError(f"conv_transpose2d: output_padding {(oph, opw)} must be smaller than stride "
                         f"{(sh, sw)} or dilation {(dh, dw)}")
    hout = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
    wout = (w_ - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
    if hout < 1 or wout < 1:
        raise ShapeError(
            f"conv_transpose2d: output size {(hout, wout)} from input {x.shape}, kernel {(kh, kw)}, "
            f"stride {(sh, sw)}, padding {(ph, pw)} is empty"
        )
    if bias is not None and tuple(bias.shape) != (cout,):
        raise ShapeError(f"conv_transpose2d: bias must have shape ({cout},), got {bias.shape}")
    # the forward conv this transposes maps (N, Cout, Hout, Wout) -> (N, Cin, H, W) with weight (Cin, Cout/g,
    # ..)
    p = ConvParams((n, cout, hout, wout), weight.shape, (sh, sw), (ph, pw), (dh, dw), groups,
                   op="conv_transpose2d")
    if (p.OH, p.OW) != (h, w_):
        raise ShapeError(
            f"conv_transpose2d: inconsistent geometry: input {x.shape} vs derived {p.output_shape}"
        )
    out = Tensor.empty(x.queue, (n, cout, hout, wout), dt)
    if out.size:
        _backward_input_into(
            x.contiguous(), weight.contiguous(), bias.contiguous() if bias is not None else None, out, p, act
        )
    return out


__all__ = [
    "conv2d",
    "conv2d_backward_bias",
    "conv2d_backward_input",
    "conv2d_backward_weight",
    "conv2d_relu",
    "conv_transpose2d",
]
