"""Split-K: a GEMM whose M x N alone cannot fill the device runs as S GEMMs over K/S slices (a batch)
into an accumulator-typed workspace, then one reduction launch (gemm_reduce_splits) sums the slices and
applies the epilogue, or (GPU, float32 accumulators, small blocks: sums_in_kernel) each block's last
work-group to finish sums them inside the same launch. Shorter sums are also more accurate.

GPU (tiled kernel): skinny problems such as 256 x 4096 x 4096 give too few 128 x 128 work-groups for the
SMs. CPU (cpu kernel): a convolution's weight gradient (M = 16/32 output channels, N = C*KH*KW = 9..144,
K = batch*OH*OW = 25k..100k) makes one or a few MB x NB blocks, so one core works alone; S = 16 slices,
run as a batch of cpu GEMMs over strided views (no copies), fill both cores: (16, 9, 100352) 3.1 -> 1.9
ms, (32, 144, 25088) 5.9 -> 3.6 ms on the 2-core PoCL device.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from netcl.core import capture, dtypes, launch_labels
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, ShapeError
from netcl.ops.gemm.problem import _long4, _matrix_strides, _Problem
from netcl.ops.gemm.variants import _program, has_wgmma, usable_params

GPU_SPLIT_MIN_K = 64  # GPUs: each K slice at least this long ...
GPU_SPLIT_FILL = 0.9  # ... and more slices while the blocks x slices are fewer than this x the waves
GPU_SPLIT_LONG_K = 512  # slices at least this long aim at 2 work-groups per compute unit, shorter ones at 1
# Who sums float32 split-K slices (float64's always take the reduction launch, gemm_reduce_splits):
# "kernel", each block's last work-group to finish (SPLIT_LAST of gemm_common.cl: one launch fewer);
# "launch", the reduction; "auto" (netcl's choice), the kernel for blocks of at most SPLIT_KERNEL_MAX_BLOCK
# outputs. The same bits either way. H200, replayed, alternated in one process (2026-12-03): the last
# work-group's serial tail (fences, the arrival, S slices read by one work-group a block) costs more than the
# reduction launch on large blocks (bfloat16 512 x 512 x 16384 in 8 slices of 128 x 128 blocks 61 against
# 43 us, 1376 x 512 x 16384 88 against 81, float32 512^3 56 against 25, the seed MLP's 64 x 64 blocks
# 784 x 100 x 128 33 against 27), and less on the 16 x 64 blocks of decode rows (the "skinny" tile, M = 8:
# TinyLlama's 2048 x 2048 9.9 against 17.7 us, 256 x 2048 9.8 against 17.5, 2048 x 5632 11.3 against 17.6,
# 11264 x 2048 17.3 against 20.7)
SPLIT_SUM = "auto"
SPLIT_KERNEL_MAX_BLOCK = 2048

CPU_SPLIT_MIN_K = 8192  # split only K at least this long ...
CPU_SPLIT_MAX_BLOCKS = 8  # ... when the unsplit launch has at most this many MB x NB blocks


def sums_in_kernel(acc_dtype: Any, tile: dict[str, int]) -> bool:
    """Whether a split GEMM with `acc_dtype` accumulators and blocks of `tile` sums its slices in the kernel
    (SPLIT_SUM)."""
    if acc_dtype != dtypes.float32 or SPLIT_SUM == "launch":
        return False
    return SPLIT_SUM == "kernel" or tile["BM"] * tile["BN"] <= SPLIT_KERNEL_MAX_BLOCK


def choose_splits(device: Any, p: _Problem, tile: dict[str, int], partial_sums: bool = False) -> int:
    """How many slices of K a tiled (or, with `partial_sums`, mma) GEMM runs side by side: more than 1 only
    when M x N alone gives too few work-groups to fill the device (skinny problems such as 256 x 4096 x
    4096, small squares, a linear layer's weight gradient dW = g^T x with K = the batch's tokens).
    Long slices (>= GPU_SPLIT_LONG_K) are added until 2 work-groups per compute unit, short ones until 1:
    on the H200 512^3 (16 blocks of 128 x 128) ran 0.47x cuBLAS unsplit, 0.68x at S=2, 1.14x at S=8 (64
    long); 1000^3 (64 blocks) 0.71x at S=2 and 0.64x at S=4 (bench/conv_sweep.py, bench/NOTES.md). The
    tiled kernel splits float32/float64 only (its workspace has the operands' dtype); the mma kernel
    writes float32 partial sums from any input (C_ACC), so `partial_sums` admits float16/bfloat16."""
    if device.capabilities.kind == "cpu" or math.prod(p.batch) != 1:
        return 1
    if not partial_sums and p.out.dtype not in (dtypes.float32, dtypes.float64):
        return 1
    tiles = -(-p.m // tile["BM"]) * -(-p.n // tile["BN"])
    units = device.capabilities.compute_units
    if tiles >= GPU_SPLIT_FILL * 2 * units:
        return 1
    best = 1
    if partial_sums and has_wgmma(device):
        # Hopper's warpgroup MMA: as many slices as make one wave of two blocks an SM (two fit: registers
        # and 48 KB of local memory each; an SM's k-tiles run ~1.6x faster with two than with one), any
        # count up to 16 (K need not divide: the last slice is shorter, `slices`). H200, the 25M GPT's
        # bfloat16 weight gradients, kernel + reduction, the float32 slices staged (EPI_SMEM): 512 x 512 x
        # 16384 in 16 slices 40.6 us against 43.0 in 8; 1376 x 512 x 16384 (44 blocks) in 6 70.4 against
        # 85.9 in 4 and 85.0 in 8 (bench/NOTES.md, fourteenth session)
        best = max(1, min(16, 2 * units // tiles))
        while best > 1 and -(-p.k // best) < GPU_SPLIT_MIN_K:
            best -= 1
        return best
    for s in (2, 4, 8, 16):
        if p.k % s or p.k // s < GPU_SPLIT_MIN_K:
            break
        best = s
        waves = 2 if p.k // s >= GPU_SPLIT_LONG_K else 1
        if tiles * s >= GPU_SPLIT_FILL * waves * units:
            break
    return best


def choose_cpu_splits(p: _Problem, variant: str) -> int:
    """Number of K slices for the cpu variant on `p` (0: do not split)."""
    if variant != "cpu" or p.out.device.capabilities.kind != "cpu" or math.prod(p.batch) != 1:
        return 0
    if p.out.dtype not in (dtypes.float32, dtypes.float64) or p.k < CPU_SPLIT_MIN_K:
        return 0
    tile = usable_params(p.out.device, "cpu", p.out.dtype, required=False)
    if tile is None or -(-p.m // tile["MB"]) * -(-p.n // tile["NB"]) > CPU_SPLIT_MAX_BLOCKS:
        return 0
    for s in (16, 8, 4, 2):
        if p.k % s == 0 and p.k // s >= 1024:
            return s
    return 0


def slices(k: int, splits: int) -> tuple[int, int]:
    """(chunk, count): K in `splits` slices of `chunk` (K divisible), or, where it does not divide, slices
    of a 32-deep multiple (a k-tile of every matrix-unit block: the slices start on 16-byte boundaries
    wherever K's rows do) and a shorter last one, fewer of them where that covers K sooner."""
    if splits <= 1:
        return k, 1
    if k % splits == 0:
        return k // splits, splits
    even = -(-k // splits)
    chunk = -(-even // 32) * 32
    return chunk, -(-k // chunk)


def gpu_split(
    variant: str,
    p: _Problem,
    a: Tensor,
    b: Tensor,
    strides: tuple[int, int, int, int],
    defines: dict[str, Any],
    splits: int,
    grid: tuple[int, int],
    local: tuple[int, ...],
    **extra: Any,
) -> Tensor:
    """The GPU split: one launch of `variant` (tiled or mma) over the K slices (as a batch) into a fresh
    workspace, then the reduction, which applies the epilogue (or, sums_in_kernel, the block's last work-group
    sums the slices and applies it: one launch). `defines`, `grid` (the unsplit launch's
    first two global sizes), `local` and `extra` (mma's DYN_LOCAL tiles) are the unsplit launch's
    (netcl.ops.gemm.launch, which checked the slices' alignment for mma's cp.async). The tiled kernel stores
    at its operands' dtype, so it splits float32/float64 only; the matrix units write float32 partial sums
    from any input (C_ACC) and the reduction rounds once to float16/bfloat16: an AMP step's weight
    gradients (M x N = 256..704 x 256, K = 2048 tokens) gave the unsplit mma kernel 4-11 blocks of 128 x 128
    for the H200's 132 SMs (2.35 TFLOP/s, bench/NOTES.md, mixed precision). Returns the workspace."""
    a_rs, a_ks, b_ks, b_ns = strides
    uneven = p.k % splits != 0
    if uneven and not (variant == "mma" and defines.get("WGMMA", 0) is None):
        raise ShapeError(f"split-K needs K={p.k} divisible by {splits} (a shorter last slice: the wgmma "
                         f"kernel only)")
    dt = p.out.dtype
    acc_dt = dtypes.float64 if dt == dtypes.float64 else dtypes.float32
    partial_sums = variant == "mma"
    if dt != acc_dt and not partial_sums:
        raise DTypeError(f"split-K on the {variant} kernel runs for float32/float64 only, got {dt}")
    chunk, splits = slices(p.k, splits)
    if uneven:
        defines = {**defines, "SPLIT_KT": p.k}  # each slice's K: the chunk, the last one what is left
    work = Tensor.empty(p.out.queue, (splits, p.m, p.n), acc_dt)
    in_kernel = sums_in_kernel(acc_dt, defines) and p.wide is None  # (the last work-group stores at dt)
    if in_kernel:  # the epilogue's defines stay: the block's last work-group applies it
        gemm_defines = {**defines, "SPLIT_LAST": None}
    else:
        gemm_defines = {k: v for k, v in defines.items()
                        if k not in ("HAS_BIAS", "BIAS_ROWS", "HAS_RESIDUAL", "MASK_RESIDUAL")}
        gemm_defines["ACT"] = None
        if partial_sums:
            gemm_defines["C_ACC"] = None  # C is the float32 workspace whatever the inputs
    if not partial_sums and ((chunk * a_ks) % 4 or (chunk * b_ks) % 4):
        gemm_defines.pop("GVEC", None)  # slice starts must stay 4-aligned for the 4-wide loads
    kernel = getattr(_program(p.out.device, variant, gemm_defines), f"gemm_{variant}")
    i64 = np.int64
    if capture.declaring():  # the K slices as a batch: A and B read once, `splits` partial products written
        # (and, summed in the kernel, all S read back and C written)
        written = splits * p.m * p.n * acc_dt.itemsize
        merged = (splits * acc_dt.itemsize + dt.itemsize) * p.m * p.n if in_kernel else 0
        launch_labels.work(2.0 * p.m * p.n * p.k,
                           float((p.m * p.k + p.k * p.n) * dt.itemsize + written + merged))
    if in_kernel:  # C, bias and residual are the output's (every slice's); the slices go to `work`
        out, bias, res = p.out, p.bias, p.residual
        bias_t = bias if bias is not None else out
        res_t = res if res is not None else out
        blocks = (grid[0] // local[0]) * (grid[1] // local[1])
        tail = dict(
            C=out.buffer, c_off=i64(out.offset), c_rs=i64(out.strides[-2]),
            bias=bias_t.buffer, bias_off=i64(bias_t.offset),
            bias_stride=i64(bias.strides[0] if bias is not None else 0),
            residual=res_t.buffer, res_off=i64(res_t.offset),
            res_rs=i64(res.strides[-2] if res is not None else 0),
            res_cs=i64(res.strides[-1] if res is not None else 0),
            alpha=acc_dt.type(p.alpha), bs_cr=_long4(0, 0, 0, 0),
            work=work.buffer, arrivals=out.queue.arrival_counts(blocks),
        )
    else:  # C is slice z of the workspace; no epilogue
        tail = dict(
            C=work.buffer, c_off=i64(work.offset), c_rs=i64(p.n),
            bias=work.buffer, bias_off=i64(0), bias_stride=i64(0),
            residual=work.buffer, res_off=i64(0), res_rs=i64(0), res_cs=i64(0),
            alpha=acc_dt.type(1.0), bs_cr=_long4(0, p.m * p.n, 0, 0),
        )
    kernel(
        p.out.queue, (*grid, splits), local,
        M=np.int32(p.m), N=np.int32(p.n), K=np.int32(chunk),
        A=a.buffer, a_off=i64(a.offset), a_rs=i64(a_rs), a_ks=i64(a_ks),
        B=b.buffer, b_off=i64(b.offset), b_ks=i64(b_ks), b_ns=i64(b_ns),
        nb_inner=np.int32(splits), bs_ab=_long4(0, chunk * a_ks, 0, chunk * b_ks),
        **tail, **extra,
    )
    if in_kernel:
        capture.name_slots(a=("A", "a_off"), b=("B", "b_off"), out=("C", "c_off"), bias=("bias", "bias_off"),
                           res=("residual", "res_off"), work=("work",))
        return work
    capture.name_slots(a=("A", "a_off"), b=("B", "b_off"), work=[("C", "c_off"), ("bias",), ("residual",)])
    if p.wide is not None and dt != acc_dt:  # the reduction writes the float32 sums: they are the result
        p.out = p.wide
    reduce_splits(p, work, splits, mask_residual="MASK_RESIDUAL" in defines)
    return work


def cpu_slices(p: _Problem, splits: int) -> tuple[Tensor, Tensor]:
    """The CPU split's operands: A's and B's K slices as batches of strided views (no copies), for one
    batched cpu GEMM whose (splits, M, N) result reduce_splits then sums."""
    a, b = p.a, p.b
    a_rs, a_ks = _matrix_strides(p.m, p.k, a.strides[-2], a.strides[-1])
    b_ks, b_ns = _matrix_strides(p.k, p.n, b.strides[-2], b.strides[-1])
    chunk = p.k // splits
    return (a._view((splits, p.m, chunk), (chunk * a_ks, a_rs, a_ks), a.offset),
            b._view((splits, chunk, p.n), (chunk * b_ks, b_ks, b_ns), b.offset))


def reduce_splits(p: _Problem, work: Tensor, splits: int, mask_residual: bool = False) -> None:
    """p.out = epilogue(sum over the first axis of `work`), the last launch of either split; mask_residual:
    p.residual is a mask (launch's mask_residual), applied here."""
    out, dt, device = p.out, p.out.dtype, p.out.device
    defines: dict[str, Any] = {"DTYPE": dt, "ACT": p.activation}
    if p.bias is not None:
        defines["HAS_BIAS"] = None
        if p.bias_rows:
            defines["BIAS_ROWS"] = None
    if p.residual is not None:
        defines["MASK_RESIDUAL" if mask_residual else "HAS_RESIDUAL"] = None
    vec = 4 if p.n % 4 == 0 and work.offset % 4 == 0 else 1   # 16-byte loads of the slices (gemm_direct.cl)
    if vec != 1:
        defines["RED_VEC"] = vec
    reducer = _program(device, "direct", defines).gemm_reduce_splits
    bias_t = p.bias if p.bias is not None else out
    res = p.residual
    res_t = res if res is not None else out
    cols = p.n // vec
    lx = min(64, 1 << max(0, (cols - 1).bit_length()))
    local = (lx, max(1, min(256 // lx, 4)), 1) if device.capabilities.kind != "cpu" else None
    i64 = np.int64
    if capture.declaring():  # S partial sums per output read, one output written
        launch_labels.work(float(splits * p.m * p.n),
                           float(p.m * p.n * (splits * work.itemsize + dt.itemsize)))
    reducer(
        out.queue,
        (cols, p.m, 1),
        local,
        S=np.int32(splits),
        M=np.int32(p.m),
        N=np.int32(p.n),
        partial=work.buffer,
        C=out.buffer,
        c_off=i64(out.offset),
        c_rs=i64(out.strides[-2]),
        bias=bias_t.buffer,
        bias_off=i64(bias_t.offset),
        bias_stride=i64(bias_t.strides[0] if p.bias is not None else 0),
        residual=res_t.buffer,
        res_off=i64(res_t.offset),
        res_rs=i64(res.strides[-2] if res is not None else 0),
        res_cs=i64(res.strides[-1] if res is not None else 0),
        alpha=work.dtype.type(p.alpha),
    )
    capture.name_slots(
        work=("partial",), out=("C", "c_off"), bias=("bias", "bias_off"), res=("residual", "res_off")
    )
