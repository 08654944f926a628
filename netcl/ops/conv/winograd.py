"""Winograd F(2x2, 3x3) through the GEMM (kernels/winograd.cl): the filter, input and output transforms,
the forward pass, and the weight gradient run backwards (the backward-input pass is the flipped forward).
CPUs take the transforms that walk whole tile rows, GPUs one work-item per tile."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from netcl import kernels
from netcl.core import capture
from netcl.core.tensor import Tensor
from netcl.ops import gemm as mm
from netcl.ops.conv.geometry import ConvParams


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


def _tile_plan(prg: Any, kernel: str, device: Any, th: int, tw: int, channels: int, nb: int,
               static: dict[str, Any], per_call: dict[str, Any]) -> Any:
    """The Plan of tile transform `kernel` ("winograd_input", "winograd_output", "winograd_grad_output") over
    th x tw tiles, `channels` and nb images: the CPUs' row kernel (a work-item a tile row, TH added), or the
    GPUs' (a work-item a tile; _tile_grid)."""
    if _winograd_rows(device):
        return getattr(prg, f"{kernel}_rows_2x2_3x3").plan_named((th, channels, nb), None,
                                                                 {**static, "TH": np.int32(th)}, per_call)
    return getattr(prg, f"{kernel}_2x2_3x3").plan_named(*_tile_grid(th * tw, channels, nb), static, per_call)


def _winograd_program(x: Tensor, p: ConvParams, act: str | None = None) -> Any:
    """winograd.cl for x's device and dtype; the CPU's row kernels take CH tiles at a time, CH the
    largest of 8, 4, 2, 1 that divides the TW tiles of a row (kernels/winograd.cl). Looked up once per
    (device, dtype, activation, geometry, layout) in netcl.core.capture.plans."""
    rows = _winograd_rows(x.device)
    key = ("winograd_program", x.device, x.dtype, act, p, rows, WINOGRAD_FLAT)
    prg = capture.plans.get(key)
    if prg is not None:
        return prg
    if not rows:
        if WINOGRAD_FLAT:
            prg = kernels.program(x.device, "winograd.cl", dtype=x.dtype, act=act, FLAT=None)
        else:
            prg = kernels.program(x.device, "winograd.cl", dtype=x.dtype, act=act)
    else:
        tw = math.ceil(p.OW / 2)
        ch = next(c for c in (8, 4, 2, 1) if tw % c == 0)
        prg = kernels.program(x.device, "winograd.cl", dtype=x.dtype, act=act, CH=ch)
    return capture.plans.put(key, prg)


# GPUs: the independent transforms of one pass (the filter and the input tiles; in a backward pass the
# rotated filter, grad_y's input tiles, x's input tiles and grad_y's Z) in one launch of
# winograd_transforms_2x2_3x3, work-groups of TRANSFORMS_LOCAL items: 2 and 4 launches become 1 (ResNet-18's
# step 52 launches fewer). Off: a launch each (tests compare the bits).
BATCH_TRANSFORMS = True
TRANSFORMS_LOCAL = 256


def _batched(device: Any) -> bool:
    """Whether this device's passes launch their transforms together (BATCH_TRANSFORMS; GPUs' per-tile
    kernels: the CPUs' row kernels keep a launch each)."""
    return BATCH_TRANSFORMS and not _winograd_rows(device)


# winograd_transforms_2x2_3x3's parts: f the filter, a and b input transforms, z a grad-output transform; per
# part its sizes' argument names (prefixed "<part>_"), and its source buffer, offset and output buffer
_PART_SIZES = {"f": ("K", "C", "SE", "SK", "SC", "flip"),
               "a": ("n0", "NB", "C", "H", "W", "TW", "TT", "PH", "PW"),
               "z": ("n0", "NB", "K", "OH", "OW", "TW", "TT")}
_PART_SIZES["b"] = _PART_SIZES["a"]
_PART_BUFFERS = {"f": ("w", "w_off", "u"), "a": ("x", "x_off", "v"), "b": ("x", "x_off", "v"),
                 "z": ("gy", "gy_off", "z")}
_LONG_SIZES = ("SE", "SK", "SC")


def _part_sizes(name: str, part: tuple) -> tuple[tuple[int, ...], int]:
    """(the sizes of _PART_SIZES[name], its work-items) of a present part: filt (w, u, flip), a / b (x, v, p,
    n0, nb), z (gy, z, p, n0, nb), as _transform_together takes them."""
    if name == "f":
        w, _, flip = part
        kk, cc = w.shape[0], w.shape[1]
        return (kk, cc, kk * cc, 1 if flip else cc, kk if flip else 1, int(flip)), kk * cc
    _, _, p, n0, nb = part
    th, tw = math.ceil(p.OH / 2), math.ceil(p.OW / 2)
    if name == "z":
        return (n0, nb, p.K, p.OH, p.OW, tw, th * tw), th * tw * p.K * nb
    return (n0, nb, p.C, p.H, p.W, tw, th * tw, p.PH, p.PW), th * tw * p.C * nb


def _transform_together(prg: Any, queue: Any, filt: tuple | None = None, a: tuple | None = None,
                        b: tuple | None = None, z: tuple | None = None) -> None:
    """One launch of winograd_transforms_2x2_3x3 (GPUs): filt = (w, u, flip) as winograd_transform_weight;
    a and b = (x, v, p, n0, nb) as _winograd_input; z = (gy, z, p, n0, nb) as the weight gradient's Z; an
    absent part takes no work-items. Its Plan is made once per program and sizes (netcl.core.capture.plans);
    a call passes the buffers."""
    parts = (filt, a, b, z)
    key = ("winograd_transforms", prg, None if filt is None else (filt[0].shape, filt[2]),
           *[None if part is None else part[2:] for part in parts[1:]])
    spare = next(part[1] for part in parts if part is not None).buffer  # an absent part's buffers
    plan = capture.plans.get(key)
    if plan is None:
        static: dict[str, Any] = {}
        per_call: dict[str, Any] = {}
        items = 0
        for name, part in zip("fabz", parts):
            names = _PART_SIZES[name]
            sizes, count = _part_sizes(name, part) if part is not None else ((1,) * len(names), 0)
            static.update({f"{name}_{k}": (np.int64 if k in _LONG_SIZES else np.int32)(v)
                           for k, v in zip(names, sizes)})
            static[f"{name}_items"] = np.int64(count)
            items += count
            src, off, dst = _PART_BUFFERS[name]
            per_call.update({f"{name}_{src}": spare, f"{name}_{off}": np.int64(0), f"{name}_{dst}": spare})
        local = TRANSFORMS_LOCAL
        plan = capture.plans.put(key, prg.winograd_transforms_2x2_3x3.plan_named(
            (-(-items // local) * local,), (local,), static, per_call))
    values: list[Any] = []
    for part in parts:
        values += (spare, 0, spare) if part is None else (part[0].buffer, part[0].offset, part[1].buffer)
    plan(queue, *values)


def winograd_transform_weight(w: Tensor, flip: bool = False) -> Tensor:
    """U = G g G^T for every (k, c) filter of a contiguous (K, C, 3, 3) weight: (16, K, C), 16 K x C
    matrices. flip=True transforms the filters rotated by 180 degrees into (16, C, K): the weight of the
    backward-data convolution (grad_x = conv(grad_y, rotated and transposed w)) without materialising it."""
    K, C = w.shape[0], w.shape[1]
    u = Tensor.empty(w.queue, (16, C, K) if flip else (16, K, C), w.dtype)
    rows = _winograd_rows(w.device)
    key = ("winograd_filter", w.device, w.dtype, K, C, bool(flip), rows)
    plan = capture.plans.get(key)
    if plan is None:  # its Plan, once per size
        prg = kernels.program(w.device, "winograd.cl", dtype=w.dtype)
        per_call = dict(w=w.buffer, w_off=np.int64(0), u=u.buffer)
        if rows:
            plan = prg.winograd_filter_rows_2x2_3x3.plan_named(
                (C if flip else K,), None, {"K": np.int32(K), "C": np.int32(C), "flip": np.int32(flip)},
                per_call)
        else:
            plan = prg.winograd_filter_2x2_3x3.plan_named(
                (K * C,), None, {"K": np.int32(K), "C": np.int32(C), "SE": np.int64(K * C),
                                 "SK": np.int64(1 if flip else C), "SC": np.int64(K if flip else 1),
                                 "flip": np.int32(flip)}, per_call)
        capture.plans.put(key, plan)
    plan(w.queue, w.buffer, w.offset, u.buffer)
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
    key = ("winograd_input", prg, p, n0, nb)
    plan = capture.plans.get(key)
    if plan is None:  # its Plan, once per program, geometry and chunk
        static = dict(n0=np.int32(n0), NB=np.int32(nb), C=np.int32(p.C), H=np.int32(p.H), W=np.int32(p.W),
                      TW=np.int32(tw), TT=np.int32(th * tw), PH=np.int32(p.PH), PW=np.int32(p.PW))
        plan = capture.plans.put(key, _tile_plan(prg, "winograd_input", x.device, th, tw, p.C, nb, static,
                                                 dict(x=x.buffer, x_off=np.int64(0), v=v.buffer)))
    plan(x.queue, x.buffer, x.offset, v.buffer)
    return v


def _conv_winograd(x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor, p: ConvParams,
                   act: str | None, flip: bool = False) -> None:
    """Filter transform (winograd_transform_weight of `weight`, rotated with `flip`: the backward-data
    convolution's) and input transform -> 16 batched GEMMs U[e] (K x C) @ V[e] (C x tiles) -> output
    transform (bias and activation there), over chunks of images. The GEMM is netcl's tuned one, so Winograd
    gains what it does on every device (2.25x fewer multiply-adds) on top of it. GPUs transform the filter
    and a single chunk's input tiles in one launch (_transform_together)."""
    prg = _winograd_program(x, p, act)
    th, tw = math.ceil(p.OH / 2), math.ceil(p.OW / 2)
    b = bias if bias is not None else out
    chunk = _winograd_chunk(x.device, p, x.itemsize)
    v = None
    if chunk >= p.N and _batched(x.device):
        u = Tensor.empty(x.queue, (16, p.K, p.C), x.dtype)
        v = Tensor.empty(x.queue, (16, p.C, p.N * th * tw), x.dtype)
        _transform_together(prg, x.queue, filt=(weight, u, flip), a=(x, v, p, 0, p.N))
    else:
        u = winograd_transform_weight(weight, flip)
    for n0 in range(0, p.N, chunk):
        nb = min(chunk, p.N - n0)
        if v is None:
            v = _winograd_input(prg, x, p, n0, nb)
        _winograd_output(prg, x.queue, mm.matmul(u, v), bias, b, out, p, act, n0, nb)
        v = None


def _winograd_output(prg: Any, queue: Any, m: Tensor, bias: Tensor | None, b: Tensor, out: Tensor,
                     p: ConvParams, act: str | None, n0: int, nb: int) -> None:
    """y of images n0..n0+nb-1 = A^T m A (+ bias, activation) from the GEMM's product m (16, K, nb*TT)."""
    key = ("winograd_output", prg, p, n0, nb, bias is not None)
    plan = capture.plans.get(key)
    if plan is None:  # its Plan, once per program (the activation), geometry, chunk and bias
        th, tw = math.ceil(p.OH / 2), math.ceil(p.OW / 2)
        static = dict(has_bias=np.int32(bias is not None), n0=np.int32(n0), NB=np.int32(nb), K=np.int32(p.K),
                      OH=np.int32(p.OH), OW=np.int32(p.OW), TW=np.int32(tw), TT=np.int32(th * tw))
        per_call = dict(m=m.buffer, bias=b.buffer, b_off=np.int64(0), y=out.buffer, y_off=np.int64(0))
        plan = capture.plans.put(key, _tile_plan(prg, "winograd_output", out.device, th, tw, p.K, nb, static,
                                                 per_call))
    plan(queue, m.buffer, b.buffer, b.offset, out.buffer, out.offset)


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


def _backward_weight_winograd(x: Tensor, gy: Tensor, p: ConvParams, vz: tuple | None = None) -> Tensor:
    """dW of a 3x3, stride-1 convolution by Winograd F(2x2, 3x3) run backwards (kernels/winograd.cl):
    V = B^T d B of the input tiles (as the forward), Z = A dY A^T of the output-gradient tiles, one
    batched GEMM dU[s, e] = Z[e][:, slice s] @ V[e][:, slice s]^T over the 16 positions e (and S slices
    of the tiles), then dW = G^T (sum over s of dU[s]) G. 2.25x fewer multiply-adds than im2col + GEMM,
    and no im2col buffer. Image chunks accumulate through the GEMM's residual epilogue. `vz`: (V, Z) of
    all the images, transformed already (_backward_winograd: one chunk)."""
    prg = _winograd_program(x, p)
    th, tw = math.ceil(p.OH / 2), math.ceil(p.OW / 2)
    tt = th * tw
    rows = _winograd_rows(x.device)
    key = ("winograd_weight_gradient", prg, p, vz is not None)
    sizes = capture.plans.get(key)
    if sizes is None:  # the chunk of images and the tile slices, once per geometry
        chunk = p.N if vz is not None else _winograd_chunk(x.device, p, x.itemsize, per_tile=16 * (p.C + p.K))
        # slices that divide every chunk's tiles
        splits = _winograd_splits(x.device, p, tt * math.gcd(chunk, p.N % chunk or chunk))
        sizes = capture.plans.put(key, (chunk, splits))
    chunk, splits = sizes
    du = None
    for n0 in range(0, p.N, chunk):
        nb = min(chunk, p.N - n0)
        pt = nb * tt
        if vz is not None:
            v, z = vz
            vz = None
        else:
            v = _winograd_input(prg, x, p, n0, nb)                              # (16, C, pt)
            z = Tensor.empty(x.queue, (16, p.K, pt), x.dtype)
            plan = capture.plans.get(("winograd_grad_output", prg, p, n0, nb))
            if plan is None:
                static = dict(n0=np.int32(n0), NB=np.int32(nb), K=np.int32(p.K), OH=np.int32(p.OH),
                              OW=np.int32(p.OW), TW=np.int32(tw), TT=np.int32(tt))
                plan = capture.plans.put(("winograd_grad_output", prg, p, n0, nb), _tile_plan(
                    prg, "winograd_grad_output", x.device, th, tw, p.K, nb, static,
                    dict(gy=gy.buffer, gy_off=np.int64(0), z=z.buffer)))
            plan(x.queue, gy.buffer, gy.offset, z.buffer)
        sl = pt // splits
        zs = z._view((splits, 16, p.K, sl), (sl, p.K * pt, pt, 1), z.offset)      # (S, 16, K, sl)
        vs = v._view((splits, 16, sl, p.C), (sl, p.C * pt, 1, pt), v.offset)      # (S, 16, sl, C)
        du = mm.matmul_epilogue(zs, vs, residual=du)                               # (S, 16, K, C)
        del v, z
    gw = Tensor.empty(x.queue, (p.K, p.C, 3, 3), x.dtype)
    if du.offset or not du.is_contiguous():
        du = du.contiguous()
    splits = du.shape[0]
    plan = capture.plans.get(("winograd_grad_filter", prg, p.K, p.C, splits))
    if plan is None:
        kernel = prg.winograd_grad_filter_rows_2x2_3x3 if rows else prg.winograd_grad_filter_2x2_3x3
        plan = capture.plans.put(("winograd_grad_filter", prg, p.K, p.C, splits), kernel.plan_named(
            (p.K,) if rows else (p.K * p.C,), None,
            dict(K=np.int32(p.K), C=np.int32(p.C), S=np.int32(splits)),
            dict(du=du.buffer, gw=gw.buffer, gw_off=np.int64(0))))
    plan(x.queue, du.buffer, gw.buffer, gw.offset)
    return gw


def _backward_winograd(x: Tensor, gy: Tensor, w: Tensor, p: ConvParams, fp: ConvParams) -> tuple | None:
    """(grad_x, grad_w) of a 3x3 stride-1 convolution whose input gradient runs as the flipped convolution
    fp on Winograd and whose weight gradient runs on Winograd, with the four transforms (the rotated filter,
    grad_y's input tiles, x's input tiles, grad_y's Z) in one launch; then the two GEMMs and their output
    transforms, the same bits as the two passes apart. None where it does not apply: the CPUs' row
    kernels, or images in more than one chunk."""
    dev = x.device
    if not (_batched(dev) and p.N * p.OH * p.OW and p.C
            and _winograd_chunk(dev, p, x.itemsize, per_tile=16 * (p.C + p.K)) >= p.N
            and _winograd_chunk(dev, fp, x.itemsize) >= p.N):
        return None
    q, dt = x.queue, x.dtype
    tt = math.ceil(p.OH / 2) * math.ceil(p.OW / 2)
    ftt = math.ceil(fp.OH / 2) * math.ceil(fp.OW / 2)
    u = Tensor.empty(q, (16, fp.K, fp.C), dt)                 # the rotated filters, (16, C, K)
    vg = Tensor.empty(q, (16, fp.C, p.N * ftt), dt)           # grad_y's input tiles
    vx = Tensor.empty(q, (16, p.C, p.N * tt), dt)             # x's
    z = Tensor.empty(q, (16, p.K, p.N * tt), dt)              # grad_y's Z
    prg = _winograd_program(x, p)
    _transform_together(prg, q, filt=(w, u, True), a=(gy, vg, fp, 0, p.N), b=(x, vx, p, 0, p.N),
                        z=(gy, z, p, 0, p.N))
    gx = Tensor.empty(q, (p.N, p.C, p.H, p.W), dt)
    _winograd_output(_winograd_program(gy, fp), q, mm.matmul(u, vg), None, gx, gx, fp, None, 0, p.N)
    del u, vg
    return gx, _backward_weight_winograd(x, gy, p, vz=(vx, z))
