"""One GEMM problem (netcl.ops.gemm.problem) onto one kernel variant: the compile-time layout and epilogue
defines, the launch geometry, the arguments by name, and the slots a replay rebinds."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core import backend, capture, dtypes, launch_labels
from netcl.core.tensor import Tensor
from netcl.errors import DeviceError, ShapeError
from netcl.ops.gemm import splitk, variants
from netcl.ops.gemm.problem import _batch_strides, _collapse, _long4, _matrix_strides, _Problem, _tiled_layout
from netcl.ops.gemm.variants import _fit_local_memory, _program, shape_class, usable_params


def gemm_work(
    m: int, n: int, k: int, batch: int, itemsize: int, residual: bool = False
) -> tuple[float, float]:
    """(FLOPs, compulsory bytes) of one GEMM launch, for the profiler: A, B read and C written once."""
    return 2.0 * m * n * k * batch, float((m * k + k * n + m * n * (2 if residual else 1)) * batch * itemsize)


def _all_inner(m: int, n: int, k: int, tile: dict[str, int]) -> bool:
    """Whether every BM x BN x BK tile of an m x n x k problem lies wholly inside it."""
    return m % tile["BM"] == 0 and n % tile["BN"] == 0 and k % tile["BK"] == 0


def launch(
    p: _Problem, variant: str, params: dict[str, int] | None = None, splits: int | None = None,
    rowsum: Tensor | None = None, mask_residual: bool = False, scales: Tensor | None = None,
    glu: bool = False, rms: tuple[Tensor, float] | None = None,
) -> Tensor | None:
    """Enqueue `p` on `variant` (tile `params` over the tuned ones; `splits` K slices, tiled and mma only,
    None: netcl's choice). `rowsum` (cpu only) also receives the row sums of A; `mask_residual` (any variant:
    the epilogue's MASK_RESIDUAL; split-K's reduction applies it) makes the residual a mask (out =
    where(mask > 0, a @ b, 0)); `scales` (gemv only: b is int8) are the float32 per-column scales of b; `glu`
    (gemv only) makes out silu(a @ b[:, :n]) * (a @ b[:, n:]) for a b of 2n columns; `rms` (gemv only:
    (weight (K,), eps), where gemv_rms_fits) RMS-normalizes a's rows first (out = rms_norm(a) @ b). Each
    launch names its slots (a, b, out, bias, res; split-K also work) for a recording (netcl.core.capture).
    Returns split-K's workspace, else None."""
    device = p.out.device
    queue = p.out.queue
    a, b = p.a, p.b
    if variant == "tiled":
        # the tiled kernel needs one unit stride per operand; other layouts are copied first
        if _tiled_layout(p.m, p.k, a.strides[-2], a.strides[-1]) is None:
            a = a.contiguous()
        if _tiled_layout(p.k, p.n, b.strides[-2], b.strides[-1]) is None:
            b = b.contiguous()
    a_rs, a_ks = _matrix_strides(p.m, p.k, a.strides[-2], a.strides[-1])
    b_ks, b_ns = _matrix_strides(p.k, p.n, b.strides[-2], b.strides[-1])
    out = p.out
    res = p.residual
    res_rs, res_cs = (res.strides[-2], res.strides[-1]) if res is not None else (0, 0)

    stride_sets = [
        _batch_strides(a, p.batch),
        _batch_strides(b, p.batch),
        list(out.strides[:-2]),
        _batch_strides(res, p.batch) if res is not None else [0] * len(p.batch),
    ]
    shape, (a_bs, b_bs, c_bs, r_bs) = _collapse(p.batch, stride_sets)
    # the kernel walks two batch levels; any further (outer) levels are walked here
    outer_shape, inner_shape = shape[:-2], shape[-2:]
    pad = 2 - len(inner_shape)
    inner_shape = [1] * pad + inner_shape
    a_in, b_in, c_in, r_in = ([0] * pad + s[len(outer_shape):] for s in (a_bs, b_bs, c_bs, r_bs))
    nb_inner = inner_shape[1]
    nbatch = inner_shape[0] * inner_shape[1]

    dt = out.dtype
    defines: dict[str, Any] = {"DTYPE": dt, "ACT": p.activation}
    if p.bias is not None:
        defines["HAS_BIAS"] = None
        if p.bias_rows:
            defines["BIAS_ROWS"] = None
    if res is not None:
        defines["HAS_RESIDUAL"] = None
    tile = usable_params(device, variant, dt, params,
                         shape_class=shape_class(device, variant, p.m, p.n, p.k, nbatch))
    defines.update(tile)
    if variant == "cpu" and b_ns == 1:
        defines["B_NCONTIG"] = None
    elif variant == "cpu" and b_ks == 1:
        defines["B_KCONTIG"] = None
    if variant == "cpu" and a_rs == 1 and a_ks != 1:
        defines["A_MCONTIG"] = None
    if rowsum is not None:
        defines["ROWSUM_A"] = None  # cpu variant only (see matmul_rowsum): row sums of A into `rowsum`
    if mask_residual:  # see matmul_relu_mask: the residual slot holds a mask
        defines.pop("HAS_RESIDUAL", None)
        defines["MASK_RESIDUAL"] = None
    if variant == "mma":
        chosen = splits is None
        if chosen:
            splits = splitk.choose_splits(device, p, tile, partial_sums=True)
        vec = 16 // dt.itemsize
        # the operands' contiguous axes: cp.async needs each row (and matrix, and slice) start on 16 bytes
        a_lead = a_rs if a_ks == 1 else a_ks if a_rs == 1 else 0
        b_lead = b_ks if b_ns == 1 else b_ns if b_ks == 1 else 0

        def copies_16(splits: int) -> bool:
            # split-K's slices start chunk * a_ks / chunk * b_ks elements on: batch steps as any other
            chunk = splitk.slices(p.k, splits)[0]
            slice_steps = (chunk * a_ks, chunk * b_ks) if splits > 1 else ()
            return a_lead > 0 and b_lead > 0 and all(
                v % vec == 0 for v in (a.offset, b.offset, a_lead, b_lead, *a_bs, *b_bs, *slice_steps))

        # Hopper's warpgroup MMA (gemm_wgmma.cl) where the tile asks for it and the device has it: A and B
        # K- or MN-major, copied 16 bytes at a time (TF32 both K-major: wgmma transposes 16-bit operands)
        wgmma_layout = dt != dtypes.float32 or (a_ks == 1 and b_ks == 1)
        aligned_16 = copies_16(splits)
        wgmma = wgmma_layout and aligned_16 and variants.takes_wgmma(device, defines)
        if chosen and not wgmma and splits > 1 and p.k % splits:
            # the mma.sync kernel's slices are all one length (a shorter last one: wgmma's SPLIT_KT only):
            # the nearest count that divides K, its slices' alignment checked again (a count the caller
            # gave that does not divide K is refused there: splitk.gpu_split)
            splits = max(s for s in range(1, splits + 1) if p.k % s == 0)
            aligned_16 = copies_16(splits)
        if wgmma:
            defines["WGMMA"] = None
            if a_ks != 1:
                defines["A_MN"] = None
            if b_ks != 1:
                defines["B_MN"] = None
        else:
            defines["WGMMA"] = 0  # the mma.sync kernel
            # 16-byte loads where A runs along K and B along N (its rows: a k-major tile) or along K;
            # cp.async (ASYNC) also needs every row and matrix start on a 16-byte boundary
            aligned = a_ks == 1 and (b_ns == 1 or b_ks == 1)
            if aligned:
                defines["ALIGNED"] = None
            if b_ns == 1:
                defines["B_KMAJOR"] = None
            if not (defines.pop("ASYNC", 0) and aligned and aligned_16):
                defines.pop("STAGES", None)
            else:
                defines["ASYNC"] = None
            # ldmatrix: 16-bit inputs; TF32 (32-bit rows seen as 16-bit pairs) with the cp.async tiles only
            if defines.pop("LDMATRIX", 0) and (dt != dtypes.float32 or "ASYNC" in defines):
                defines["LDMATRIX"] = None
    if variant == "tiled":
        defines["A_TRANS"] = int(not (a_ks == 1 and a_rs >= p.k))
        defines["B_TRANS"] = int(not (b_ns == 1 and b_ks >= p.n))
        defines.pop("GVEC", None)
        if tile.get("GVEC", 1) and dt != dtypes.float16 and all(
            v % 4 == 0 for v in (a.offset, b.offset, a_rs * a_ks, b_ks * b_ns, *a_bs, *b_bs)
        ):
            defines["GVEC"] = None  # interior tiles fetched with aligned 4-wide global loads
        inner = bool(defines.pop("INNER", 0)) and "GVEC" in defines
        edge_bk = defines.pop("BKE", 0)
        if splits is None:
            splits = splitk.choose_splits(device, p, tile)
        depth = p.k // splits if splits > 1 and p.k % splits == 0 else p.k
        if inner and _all_inner(p.m, p.n, depth, tile):
            defines["ALL_INNER"] = None  # no edge tiles: the guarded scalar path is not compiled
        elif inner and edge_bk and edge_bk != tile["BK"]:
            # problems with edge tiles take the guarded kernel with its own k tile (BKE): on the H200
            # BK=8 runs 43 TFLOP/s edge-free (128 registers, 2 work-groups per SM) but 38 guarded
            tile = _fit_local_memory({**tile, "BK": edge_bk}, dt, device.capabilities.local_mem)
            defines.update({k: tile[k] for k in ("BK", "PADA", "PADB")})
    dyn_local = defines.get("DYN_LOCAL") and defines.get("WGMMA", 0) is not None  # mma.sync's knob only
    more = {"tiles": cl.LocalMemory(_mma_local_bytes(defines, dt))} if dyn_local else {}

    if variant == "gemv":
        defines["GEMV_M"] = p.m
        if scales is not None:
            defines["W_INT8"] = None
        if glu:
            defines["GLU"] = None
        rows, cols = tile["GEMV_ROWS"], tile.get("GEMV_COLS", 1)
        gsize, lsize = (tile["GEMV_WG"], -(-p.n // (rows * cols)) * rows, 1), (tile["GEMV_WG"], rows, 1)
        stage = _gemv_stage_bytes(device, tile, defines, p.m, p.k, a.dtype.itemsize, rms is not None)
        if rms is not None and variants.gemv_rms_miscompiled(device, dt):
            raise DeviceError(f"gemm: {device.describe()} miscompiles the RMSNorm prologue for {dt.name} "
                              f"rows (variants.gemv_rms_miscompiled); use rms_norm then the linear layer "
                              f"(ops.rms_norm_linear does)")
        if rms is not None and not stage:
            raise ShapeError(f"gemm: the RMSNorm prologue needs A ({p.m} x {p.k} {dt.name}) staged in local "
                             f"memory, which it does not fit (check gemv_rms_fits first)")
        if stage:
            defines["GEMV_STAGE_A"] = None
        if rms is not None:
            defines["GEMV_RMS"] = None
        defines.pop("GEMV_STAGE", None)  # the host's knob; the kernel sees GEMV_STAGE_A
        defines.pop("GEMV_NORM", None)  # the host's (gemv_rms_fits); the kernel sees GEMV_RMS
        norm_w = rms[0] if rms is not None else out
        local = stage + _gemv_prologue_bytes(device, tile, p.m) if rms else stage or 16  # rms: sums after A
        more = {"scales": (scales if scales is not None else out).buffer, "a_stage": cl.LocalMemory(local),
                "rms_w": norm_w.buffer,
                "rms_off": np.int64(norm_w.offset if rms is not None else 0),
                "rms_eps": np.float32(rms[1] if rms is not None else 0.0)}
    elif variant == "dot":
        gsize, lsize = (p.n * tile["DOT_WG"], p.m, nbatch), (tile["DOT_WG"], 1, 1)
    elif variant == "direct":
        lx = min(64, 1 << max(0, (p.n - 1).bit_length()))
        ly = max(1, min(256 // lx, 1 << max(0, (p.m - 1).bit_length())))
        gsize, lsize = (p.n, p.m, nbatch), ((lx, ly, 1) if device.capabilities.kind != "cpu" else None)
    elif variant == "cpu":
        gsize = (-(-p.n // tile["NB"]), -(-p.m // tile["MB"]), nbatch)
        lsize = (1, 1, 1)
    elif variant == "mma":
        threads = (tile["WGS"] * 128 if defines["WGMMA"] is None
                   else (tile["BM"] // tile["WM"]) * (tile["BN"] // tile["WN"]) * 32)
        gsize = (-(-p.n // tile["BN"]) * threads, -(-p.m // tile["BM"]), nbatch)
        lsize = (threads, 1, 1)
    else:
        gsize = (-(-p.n // tile["BN"]) * tile["TX"], -(-p.m // tile["BM"]) * tile["TY"], nbatch)
        lsize = (tile["TX"], tile["TY"], 1)

    if variant in ("tiled", "mma") and splits > 1:
        return splitk.gpu_split(variant, p, a, b, (a_rs, a_ks, b_ks, b_ns), defines, splits, gsize[:2], lsize,
                                **more)
    kernel = getattr(_program(device, variant, defines), f"gemm_{variant}")
    acc_type = np.float64 if dt == dtypes.float64 else np.float32
    bias_t = p.bias if p.bias is not None else (rowsum if rowsum is not None else out)
    bias_stride = bias_t.strides[0] if (p.bias is not None or rowsum is not None) else 0
    res_t = res if res is not None else out
    i64 = np.int64
    for outer in np.ndindex(*outer_shape) if outer_shape else [()]:
        extra = [sum(i * s[j] for j, i in enumerate(outer)) for s in (a_bs, b_bs, c_bs, r_bs)]
        if capture.declaring():
            launch_labels.work(*gemm_work(p.m, p.n, p.k, nbatch, dt.itemsize, res is not None))
        kernel(
            queue,
            gsize,
            lsize,
            M=np.int32(p.m),
            N=np.int32(p.n),
            K=np.int32(p.k),
            A=a.buffer,
            a_off=i64(a.offset + extra[0]),
            a_rs=i64(a_rs),
            a_ks=i64(a_ks),
            B=b.buffer,
            b_off=i64(b.offset + extra[1]),
            b_ks=i64(b_ks),
            b_ns=i64(b_ns),
            C=out.buffer,
            c_off=i64(out.offset + extra[2]),
            c_rs=i64(out.strides[-2]),
            bias=bias_t.buffer,
            bias_off=i64(bias_t.offset),
            bias_stride=i64(bias_stride),
            residual=res_t.buffer,
            res_off=i64(res_t.offset + (extra[3] if res is not None else 0)),
            res_rs=i64(res_rs),
            res_cs=i64(res_cs),
            alpha=acc_type(p.alpha),
            nb_inner=np.int32(nb_inner),
            bs_ab=_long4(a_in[0], a_in[1], b_in[0], b_in[1]),
            bs_cr=_long4(c_in[0], c_in[1], r_in[0], r_in[1]),
            **more,
        )
        # a replay rebinds these (an operand copied above, or batch levels walked here, leave launches
        # without slots: the recording is then not replayable, netcl.ops.gemm.api)
        if not outer_shape:
            capture.name_slots(a=("A", "a_off"), b=("B", "b_off"), out=("C", "c_off"),
                               bias=("bias", "bias_off"), res=("residual", "res_off"))
    return None


def _gemv_stage_bytes(device: Any, tile: dict[str, int], defines: dict[str, Any], m: int, k: int,
                      itemsize: int, rms: bool = False) -> int:
    """Bytes of local memory the gemv kernel stages A's m x k elements in (GEMV_STAGE_A), or 0 where the tile
    says no (GEMV_STAGE 0; the RMSNorm prologue, `rms`, stages whatever the tile says) or they would take
    more than GEMV_STAGE_MAX bytes or, beside the reduction's partial sums (the tree of devices without warp
    shuffles) and the prologue's, half the device's local memory."""
    if not (tile.get("GEMV_STAGE", 0) or rms):
        return 0
    stage = m * k * itemsize
    wg, rows = tile["GEMV_WG"], tile["GEMV_ROWS"]
    shuffles = backend.nvidia_define(device) is not None  # the kernel's GEMV_SHFL
    tree = 0 if wg == 1 or (shuffles and wg <= 32) else 4 * rows * wg * m * tile.get("GEMV_COLS", 1) * (
        2 if "GLU" in defines else 1)
    prologue = _gemv_prologue_bytes(device, tile, m) if rms else 0
    fits = stage <= GEMV_STAGE_MAX and stage + tree + prologue <= device.capabilities.local_mem // 2
    return stage if fits else 0


def _gemv_prologue_bytes(device: Any, tile: dict[str, int], m: int) -> int:
    """Bytes of the RMSNorm prologue's partial sums, after the staged rows in a_stage (the kernel's
    rms_part): one float per row and column group, times the column's items where they add in a tree."""
    wg = tile["GEMV_WG"]
    tree = wg > 1 and not (backend.nvidia_define(device) is not None and wg <= 32)
    return 4 * m * tile["GEMV_ROWS"] * (wg if tree else 1)


def gemv_rms_fits(device: Any, dtype: Any, m: int, n: int, k: int, glu: bool = False) -> bool:
    """Whether the gemv kernel should RMS-normalize the m rows of a (m, k) A of `dtype` in its prologue: the
    tile's GEMV_NORM says so, and A's rows fit the stage in local memory (not float64); the caller checked
    the layout (gemv_fits' rules)."""
    dt = dtypes.normalize(dtype)
    if dt == dtypes.float64 or m < 1:
        return False
    tile = usable_params(device, "gemv", dt, None, shape_class=shape_class(device, "gemv", m, n, k, 1))
    if not tile.get("GEMV_NORM", 1):
        return False
    staged = _gemv_stage_bytes(device, tile, {"GLU": None} if glu else {}, m, k, dt.itemsize, True)
    return staged > 0 and variants.gemv_usable(device, dt, rms=True)


# the most A bytes the gemv kernel stages in local memory: M = 8 rows of K = 2048 bfloat16 (32 KB leaves an
# H200 SM room for 7 work-groups of 256, 1,792 of its 2,048 work-items)
GEMV_STAGE_MAX = 32 * 1024


def _mma_local_bytes(defines: dict[str, Any], dt: np.dtype) -> int:
    """Bytes of gemm_mma.cl's local tiles (A_TILE + B_TILE, a ring of STAGES with ASYNC): DYN_LOCAL."""
    ring = "ASYNC" in defines
    swizzled = ring and defines.get("SWIZZLE", 0)
    bm, bn, bk = defines["BM"], defines["BN"], defines["BK"]
    row = bk if swizzled else bk + defines["PAD"]
    b_tile = bk * (bn if swizzled else bn + defines["PADB"]) if "B_KMAJOR" in defines else bn * row
    return (defines["STAGES"] if ring else 1) * (bm * row + b_tile) * dt.itemsize
