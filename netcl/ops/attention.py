"""Streaming (flash) attention: softmax(q k^T * scale + mask) v without ever holding an S x S matrix.

    out, lse = flash_attention_forward(q, k, v, causal=True)
    dq, dk, dv = flash_attention_backward(q, k, v, out, lse, grad_out, causal=True)

Layout as PyTorch's scaled_dot_product_attention: q (B, Hq, Sq, D), k and v (B, Hkv, Sk, D) with Hkv
dividing Hq (grouped-query attention: query head h reads kv head h // (Hq // Hkv)). Any strides: rows are
read in place when the last axis is contiguous (q, k, v as views of a fused projection cost no copy),
else through one contiguous copy. out is (B, Hq, Sq, D) in q's dtype; lse, the log-sum-exp of each row's
scores, is (B, Hq, Sq) float32 (float64 for float64 inputs), the one thing the backward pass keeps.

The forward streams keys through an online softmax (a running max and sum per query row); the backward
recomputes the probabilities per tile from lse: one pass for dq (which first writes delta = rowsum(grad_out *
out)), one for dk and dv (no atomics); on GPUs, float32 with all three gradients wanted, FlashAttention-2's
single pass instead (delta, then per key tile dk, dv and dq's share: 5 products per (query, key) pair where
the two passes take 7; GPU_BACKWARD). Its dq shares go, while netcl.get_deterministic() (the default), into a
float32 copy of dq per work-group, summed in a fixed order (the same bits on every run), else straight into
dq by float atomic adds (GPU_DQ_SPLIT_RESIDENT, GPU_DQ_ATOMIC). On NVIDIA's matrix units the float16 /
bfloat16 passes run attention_mma.cl, and float32 ones attention_tf32.cl (3xTF32: float32's accuracy, the
two backward passes without atomics; GPU_TF32X3). Kernels
(netcl/kernels/attention_*.cl), by device class: on CPUs a work-item (work-group size 1) takes a block of rows
in private memory (attention_cpu.cl); on GPUs a work-group takes a tile of rows in local memory and streams
the other operand's tiles past it (attention_gpu.cl), and a forward with few query rows per kv head (decoding
with a KV cache: GROUP * Sq <= DECODE_MAX_ROWS) splits the keys over work-groups that each take all the rows
of one kv head (so the cache is read once per kv head), merged by the last of them to finish.
rope_cache_decode_attention is a decode step's rope_qkv_cache and attention in that kernel's one launch.

Options:
- scale: default 1 / sqrt(D).
- causal: query i attends key j iff j <= i + (L - Sq), L the number of valid keys (bottom-right aligned, as
  a KV cache needs; for Sq == Sk the usual lower triangle).
- kv_len: None (all Sk keys valid) or an int32 Tensor of shape (1,) or (B,) on the device holding L per
  batch (clamped to [0, Sk]); the kernels read it, so a recorded decode step replays with a new length.
- mask: a bool Tensor (True = attend) or a float Tensor added to the scores, broadcastable to
  (B, Hq, Sq, Sk), read in place through its strides (a (B, 1, 1, Sk) padding mask costs no S x S). The
  mask gets no gradient.
- A query row with no key it may attend gets output 0, lse -inf and zero gradients (PyTorch gives NaN).
- dropout_p: dropout on the probabilities (kept ones scaled by 1 / (1 - p)) from Philox numbers of a
  `DropoutDraw`: the forward draws fresh counters from its generator on every call (and at every replay
  of a recorded graph), the backward given the same draw regenerates the same mask.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from netcl import kernels
from netcl.core import capture, dtypes
from netcl.core.backend import device_check
from netcl.core.tensor import Tensor, check_same_queue, empty_in_order
from netcl.errors import DTypeError, KernelBuildError, ShapeError
from netcl.ops.declaration import OpDecl, declare
from netcl.ops.determinism import get_deterministic
from netcl.ops.elementwise import add, cast
from netcl.ops.gemm.variants import has_wgmma, matrix_units, print_build_log, verbose_options
from netcl.ops.random import Generator, default_generator
from netcl.ops.rope import ROPE_PAIRINGS, check_qkv_cache, rope_qkv_cache, table_rows

__all__ = [
    "DecodePhase",
    "DropoutDraw",
    "attention_dropout_mask",
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_forward",
    "rope_cache_decode_attention",
    "rope_cache_decode_phase",
]

MAX_HEAD_DIM = 256
_FLOATS = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)

# Which kernels run: None = by device class ("cpu" on CPU devices, "gpu" elsewhere). Tests set it to run
# the GPU kernels on the CPU device.
variant_override: str | None = None

# Tile knobs (their meanings: the headers of attention_cpu.cl and attention_gpu.cl).
CPU_TILES = {"BQ": 8, "BK": 16, "BKV": 16, "BI": 4}
# GPU work-item grids, best first, per kernel: (TC, TR, rows per item, columns per item): TR x TC items, the
# head dim padded to a multiple of 4 * TC; the first grid of the least padding whose local memory fits the
# device (and whose register block suits the head dim) runs. Order: the H200 sweeps of bench/attention.py
# --sweep (B=8 H=16 S=2048 D=64: the TC=16 grids 4-24% faster than the TC=8 ones; the forward's 8 rows per
# item 5% faster than 4; the fused backward's (16, 8, 4, 2) 14-80% faster than the others; bench/NOTES.md).
GPU_GRIDS = {
    # rows: queries, columns: keys
    "forward": [(16, 8, 8, 2), (16, 16, 4, 2), (8, 16, 4, 4), (8, 8, 4, 4), (8, 8, 2, 4), (8, 4, 2, 2)],
    "dq": [(16, 8, 4, 2), (8, 8, 4, 2), (8, 8, 2, 4), (16, 8, 2, 1), (8, 4, 2, 2)],   # (16, 8, 2, 1): D = 128
    # rows: keys, columns: queries
    "dkdv": [(16, 8, 4, 2), (8, 8, 4, 2), (8, 8, 2, 4), (16, 8, 2, 1), (8, 4, 2, 2)],
    # the single backward pass (dk, dv and dq's atomic adds; float32): rows keys, columns queries, and the
    # query tile a multiple of TR
    "fused": [(16, 8, 4, 2), (8, 8, 4, 2), (8, 8, 2, 4), (16, 8, 2, 1), (8, 4, 2, 2)],
}

# The GPU backward of float32 inputs when both dq and dk/dv are wanted: "fused" (FlashAttention-2's single
# pass over key tiles, 5 products per (query, key) pair; dq by per-work-group copies when deterministic, else
# by float atomic adds, whose rounding depends on the order of the adds) or "two_pass" (a dq pass and a dk/dv
# pass, 7 products, reproducible bit for bit).
GPU_BACKWARD = "fused"
# The fused pass's float atomic add: None = by device (on NVIDIA GPUs inline PTX: "red4",
# red.global.add.v4.f32, on sm_90 and later, else "red", red.global.add.f32; "cas", an atomic_cmpxchg loop,
# elsewhere or where the driver rejects the PTX), or "cas", "red", "red4". The H200 (B=8 H=16 S=2048 D=64):
# red4 14.1 ms, red 16.1, cas 29.6 for the whole backward (bench --sweep).
GPU_DQ_ATOMIC: str | None = None
_ATOMIC_DEFINES = {"cas": "ATOMIC_CAS", "red": "ATOMIC_RED", "red4": "ATOMIC_RED4"}
# The fused pass while netcl.get_deterministic() (the default): FlashAttention-2's deterministic mode.
# Work-group s of a kv head takes the key tiles s, s + nsplit, ... in turn and adds dq's shares into its own
# float32 copy of dq; attention_dq_sum_gpu sums the nsplit copies in a fixed order (dq_splits picks nsplit).
# The copies cost nsplit x dq of memory, written (zeroed) and read once more. GPU_DQ_SPLIT_RESIDENT: the
# fused pass's work-groups one compute unit runs at once, as measured on the H200 (B=8 H=16 S=2048 D=64,
# nsplit swept, backward ms full / causal: 1 33.2 / 16.9, 2 21.4 / 10.7, 3 17.0 / 8.1, 4 22.2 / 11.3,
# 6 16.0 / 8.1, 8 16.7 / 8.7, 16 16.0 / 8.2, 32 15.5 / 8.2; the atomic pass 14.3 / 7.4): 4 and 2 take two
# waves where 3 takes one, so three fit (4 was an estimate from its local memory and registers, which picked
# 4 copies: 22 ms); nsplit within GPU_DQ_SPLIT_SLACK of the best estimated time, the fewest copies (10%:
# 3 copies for the bench's shape and the 25m GPT's, where 5% took 16 for the GPT, the atomic pass's count).
GPU_DQ_SPLIT_RESIDENT = 3
GPU_DQ_SPLIT_SLACK = 1.10
GPU_DQ_SPLIT_MAX = 64
# How a work-group adds into its own copy: None = by device (the PTX add dq_atomic would take, "red4" or
# "red": fire-and-forget, and applied in order since the work-group's key tiles are separated by barriers with
# a global fence; "plain", a load-add-store, elsewhere), or "plain", "red", "red4".
GPU_DQ_SPLIT_ADD: str | None = None
_SPLIT_ADD_DEFINES = {"plain": "ATOMIC_NONE", "red": "ATOMIC_RED", "red4": "ATOMIC_RED4"}
# The GPU kernels' probabilities through native_exp (NATIVE_EXP): None = on NVIDIA GPUs (ex2.approx, ~2 ulp,
# far inside float32 attention's error), or True / False.
GPU_NATIVE_EXP: bool | None = None
# The GPU kernels whose next tiles are loaded into registers while the current one is computed (PREFETCH):
# "forward" (k and v tiles), "dkdv" / "fused" (q and dO tiles). None by default: on the H200 it made both
# slower (forward 7.13 vs 6.34 ms, fused backward 16.4 vs 14.0: the registers it holds cost occupancy).
GPU_PREFETCH: tuple[str, ...] = ()
# The forward's tile row maxima by warp shuffles (ROW_SHFL: NVIDIA's shfl.sync through inline PTX; other
# devices emulate it through local memory, SHFL_EMULATE, for tests): 3 barriers a tile instead of 4. None =
# on NVIDIA GPUs (the H200: 5.87 vs 6.34 ms), or True / False.
GPU_ROW_SHFL: bool | None = None
# float16 / bfloat16 forwards on NVIDIA's matrix units (attention_mma.cl: q k^T and p v by mma.sync, head dims
# multiples of 16 up to 128, rows on 16-byte boundaries): None = where the device has them
# (gemm.variants.matrix_units), or True / False. MMA_EMULATE (tests): that kernel through its local-memory
# emulation of mma, ldmatrix and the shuffles, on any device.
GPU_MMA: bool | None = None
MMA_EMULATE = False
# attention_mma.cl's tiles: BM query rows a work-group (16 a warp; the dk/dv pass: BM keys), BN keys a tile
# of the forward and dq passes, BQ query rows a tile of the dk/dv pass; PREFETCH 1: the forward's and dq's k
# and v tiles through a two-stage cp.async ring (where it fits the device's local memory; H200, bfloat16,
# B=8 H=16 S=2048 D=64: forward+backward 4.79 against 5.13 ms, causal 2.61 against 2.96).
# DKDV_RING 1: the dk/dv pass's q and dO tiles (with their lse and delta) through a two-stage cp.async ring
# too, here with 64-row query tiles (H200, same run, B=8 H=16 S=2048 D=64 bfloat16, forward+backward: 4.31 ms
# with BQ 32 and no ring, 3.14 with the ring, 2.88 with the ring and BQ 64; the dk/dv pass alone 1.19 ms).
# A kernel's own tiles under its name ("forward", "dq", "dkdv": {"BN": 32}) override the shared ones for that
# kernel's program (none of those tried beat these: bench/NOTES.md).
# RB 2: two 16-row blocks of queries a warp in the forward and dq passes (FlashAttention-2's 32 rows a warp: a
# k or v fragment read by ldmatrix feeds two mma), 128 rows a work-group, dq over 32-key tiles (at 64 its
# registers spill); head dims over 64 keep one block a warp (RB 2 would spill there). H200, bfloat16, B=8 H=16
# S=2048 D=64, device time per pass: forward 0.562 -> 0.514 ms, dq 0.781 -> 0.636 (dq at BN 64: 0.776, 380
# bytes of spills); 235 and 243 registers.
MMA_TILES: dict[str, Any] = {"BM": 64, "BN": 64, "BQ": 64, "PREFETCH": 1, "DKDV_RING": 1,
                             "forward": {"BM": 128, "RB": 2}, "dq": {"BM": 128, "RB": 2, "BN": 32},
                             "forward_wg": {"BM": 64, "WG_KN": 1},
                             "dq_wg": {"BM": 64, "WG_KN": 1, "WG_SS": 1},
                             "dkdv_wg": {"BM": 64, "WG_KN": 1, "WG_SS": 1}}
# WGMMA_PASSES: the passes whose products run on Hopper's warpgroup matrix units (attention_mma.cl MMA_WG,
# head dim 64): s = q k^T and o += p v in the forward, s = q k^T and dp = dO v^T (and dq += ds k) in the dq
# pass, s^T and dp^T (and dv += (p z)^T dO, dk += ds^T q) in the dk/dv pass, by wgmma with the pass's own
# rows as A (the forward's q in local memory, the backward's as fragments in registers; p and ds packed in
# registers) and the streamed tiles swizzled for the units, read from local memory; 64 rows a warpgroup,
# MMA_TILES["forward_wg"] / ["dq_wg"] / ["dkdv_wg"]["BM"] rows a work-group;
# their "WG_KN" 1: the products that read a tile MN-major on the units too (0: on mma.sync); the backward
# passes' "WG_SS" 1: their rows in local memory as the forward's q. H200, bfloat16,
# B=8 H=16 S=2048 D=64, device time a pass (eighteenth session): forward 0.526 ms on mma.sync -> 0.371,
# dq 0.630 -> 0.568 with WG_KN, dk/dv 0.944 -> 0.863 with WG_KN (1.063 on mma.sync; two warpgroups a
# work-group were slower); twenty-second session, WG_SS: dq 0.576 -> 0.468, dk/dv 0.874 -> 0.808 (causal
# 0.346 -> 0.280, 0.492 -> 0.437), fwd+bwd 1.843 -> 1.667 ms full, 1.081 -> 0.960 causal.
# None = all three where the device runs wgmma (gemm.variants.has_wgmma), none elsewhere; or a tuple of
# "forward", "dq", "dkdv" (with MMA_EMULATE: their emulation on any device).
WGMMA_PASSES: tuple[str, ...] | None = None
# The passes ("forward", "dq", "dkdv") that run on wgmma at head dim 128 too, where WGMMA_PASSES puts them
# there (attention_mma.cl MMA_WG at HEAD_DIM 128: each row in local memory as two 64-column swizzled halves
# that the head dim 64 descriptors read; the forward and dq pass over 32-key tiles, s (and dp) as m64n32, o
# += p v and dq += ds k a half at a time, q's 64 rows and the ring's two stages exactly 48 KB, the dq pass's
# dO as fragments in registers; the dk/dv pass with k's and v's 64 rows in local memory and 16-row query
# tiles through the ring (48 KB), s^T and dp^T as m64n16, dk and dv whole in registers, no DSPLIT; TILES_128
# below: the tiles' sizes). Before TILES_128, H100, bfloat16, B=8 H=16 S=2048 D=128, causal, one call:
# forward 0.675 -> 0.437 ms, dq 0.786 -> 0.664, dk/dv 1.755 -> 1.174 (fwd+bwd 0.37x -> 0.52x SDPA; full
# 0.46x); () = all three on mma.sync at 128.
WGMMA_128: tuple[str, ...] = ("forward", "dq", "dkdv")
# The passes' streamed tiles on wgmma at head dim 128: keys a tile of the forward and the dq pass (32 or 64),
# query rows a tile of the dk/dv pass (16 or 32). The smaller size runs a two-stage ring; the larger one
# stage (48 KB hold no second), each tile loaded between two barriers while the SM's other work-group
# computes, and the score products twice as wide (m64n64 or m64n32: the A tile in local memory, q or k and
# v, read once for twice the columns). H100, bfloat16, B=8 H=16 S=2048 D=128, kernel ms, the two sizes in
# one call: forward 0.442 -> 0.402 causal, 0.751 -> 0.663 full; dq 0.657 -> 0.593 causal, 1.134 -> 0.962
# full (60 bytes of spills); dk/dv 1.174 -> 0.857 causal, 2.217 -> 1.784 full (then 0.831 / 1.591 with its
# lse and delta read while the tile flies). fwd+bwd with all three: 0.65x SDPA causal (1.838 vs 1.195 ms),
# 0.56x full (3.278 vs 1.843); 0.51x / 0.44x before (bench/NOTES.md, thirtieth session); with the
# one-stage passes' refills split and their products overlapped (attention_mma.cl KV_SPLIT, WG_OVERLAP;
# thirty-first session) 0.70x / 0.61x. MMA_TILES["dkdv_wg"]["DKDV_KREG"] keeps the dk/dv pass's k rows in
# registers and its 32-row query tiles in two stages (1), or k in local memory and one stage (0); unset, the
# former for rows that are not causal, the latter for causal ones (thirty-second session, one call: dk/dv
# 1.499 -> 1.423 ms full, 0.769 -> 0.793 causal). A new setting is a new dict (attention calls key their
# templates on the dict's identity, as MMA_TILES's).
TILES_128 = {"forward": 64, "dq": 64, "dkdv": 32}
MMA_RB_MAX_HEAD_DIM = 64
# The matrix-unit backward (dq pass, then dk/dv: no atomics) keeps k's and v's fragments and dk, dv in
# registers: whole up to head dim 64; above it each dk/dv work-group takes half of dk's and dv's columns
# (attention_mma.cl DSPLIT 2: s^T and dp^T computed by both halves), for head dims that are multiples of 32 up
# to MMA_BACKWARD_MAX_HEAD_DIM (the others take attention_gpu.cl's kernels).
MMA_BACKWARD_MAX_HEAD_DIM = 128
# float32 on NVIDIA's TF32 matrix units at float32's accuracy (attention_tf32.cl): each product as three TF32
# mma.sync (3xTF32: both operands split into a TF32 high part and a TF32 rest, the rest times the rest
# dropped, ~2^-22 of a product; CUTLASS's OpMultiplyAddFastF32, which PyTorch's float32 SDPA runs on sm_80+),
# the forward and two backward passes (no atomics: the same bits every run, deterministic or not), head dims
# that are multiples of 8 up to TF32_MAX_HEAD_DIM (q's or k's and v's fragments and two accumulators stay in
# registers), every row on a 16-byte boundary. None = where the device has matrix units
# (gemm.variants.matrix_units), or True / False (True on a device without them: the emulation, as
# MMA_EMULATE). The other float32 problems take attention_gpu.cl's kernels.
GPU_TF32X3: bool | None = None
TF32_MAX_HEAD_DIM = 64
# attention_tf32.cl's tiles: WARPS warps a work-group (16 query rows a warp; the dk/dv pass: 16 keys), BN keys
# a tile of the forward and dq passes, BQ query rows a tile of the dk/dv pass (each through a two-stage
# cp.async ring: 4 BN or 4 BQ rows of head dim + 4 floats of local memory); a pass's own tiles under its name
# ("forward", "dq", "dkdv") override the shared ones.
TF32_TILES: dict[str, Any] = {"WARPS": 4, "BN": 32, "BQ": 32}


def _row_shfl(device: Any) -> bool:
    return GPU_ROW_SHFL if GPU_ROW_SHFL is not None else _nvidia(device)


def _nvidia(device: Any) -> bool:
    return "cl_nv_compiler_options" in device.capabilities.extensions


def dq_atomic(device: Any) -> str:
    """The float atomic add the fused backward uses on `device` (GPU_DQ_ATOMIC)."""
    if GPU_DQ_ATOMIC is not None:
        if GPU_DQ_ATOMIC not in _ATOMIC_DEFINES:
            raise ValueError(
                f"GPU_DQ_ATOMIC must be None or one of {sorted(_ATOMIC_DEFINES)}, got {GPU_DQ_ATOMIC!r}"
            )
        return GPU_DQ_ATOMIC
    if not _nvidia(device):
        return "cas"
    cc = getattr(device.capabilities, "nv_compute_capability", None) or (0, 0)
    failed = _PTX_ATOMICS_FAIL.get(device.device_name, set())
    for kind in (("red4",) if cc >= (9, 0) else ()) + ("red",):
        if kind not in failed:
            return kind
    return "cas"


# (device name -> the PTX adds its compiler rejected)
_PTX_ATOMICS_FAIL: dict[str, set[str]] = {}


def dq_split_add(device: Any) -> str:
    """How the deterministic fused backward adds into a work-group's own copy of dq on `device`
    (GPU_DQ_SPLIT_ADD)."""
    if GPU_DQ_SPLIT_ADD is not None:
        if GPU_DQ_SPLIT_ADD not in _SPLIT_ADD_DEFINES:
            raise ValueError(f"GPU_DQ_SPLIT_ADD must be None or one of {sorted(_SPLIT_ADD_DEFINES)}, got "
                             f"{GPU_DQ_SPLIT_ADD!r}")
        return GPU_DQ_SPLIT_ADD
    kind = dq_atomic(device) if GPU_DQ_ATOMIC is None else "cas"
    return kind if kind in ("red", "red4") else "plain"


def dq_splits(device: Any, batch: int, kv_heads: int, keys: int, key_tile: int) -> int:
    """The number of dq copies (work-groups per kv head) of the deterministic fused backward: the estimated
    time of nsplit copies is its waves of work-groups, ceil(nsplit * pairs / slots) (pairs = batch x kv
    heads, slots = GPU_DQ_SPLIT_RESIDENT per compute unit), times the key tiles each walks, ceil(tiles /
    nsplit); the fewest copies (up to GPU_DQ_SPLIT_MAX) within GPU_DQ_SPLIT_SLACK of the best. The atomic
    pass's one key tile per work-group runs at ~ceil(tiles * pairs / slots): so does this, with few copies."""
    return _dq_splits(device.capabilities.compute_units * GPU_DQ_SPLIT_RESIDENT, max(batch * kv_heads, 1),
                      -(-keys // key_tile), GPU_DQ_SPLIT_SLACK, GPU_DQ_SPLIT_MAX)


@functools.lru_cache(maxsize=256)
def _dq_splits(slots: int, pairs: int, tiles: int, slack: float, most: int) -> int:
    slots = max(slots, 1)
    cost = {n: -(-n * pairs // slots) * -(-tiles // n) for n in range(1, max(1, min(tiles, most)) + 1)}
    best = min(cost.values())
    return min(n for n, c in cost.items() if c <= best * slack)


# Decoding (GPU variant): a forward whose GROUP * Sq query rows per kv head are at most DECODE_MAX_ROWS runs
# attention_decode_gpu: one work-group per (kv head, batch, split of the keys) over all those rows, the splits
# merged by the last of them to finish (one launch: the queue's arrival counts, one per (batch, kv head)).
# Splits: enough for DECODE_GROUPS_PER_CU work-groups per compute unit, at least one tile of keys each
# (float64: one split, its parts cannot move through the 32-bit atomics of the merge); DECODE_ITEMS
# work-items; tiles of keys: the largest of DECODE_TILE_KEYS that fits and still gives every wanted split a
# tile, else the smallest that fits (a short cache is latency: more, smaller splits; H100, TinyLlama's
# layers in one launch at 96 cached keys: 64 keys a tile 1,095 us a step, 32 1,040, 16 1,007, 8 1,030; at
# 1,064 keys 16 and 64 within 1%; bench/NOTES.md, twenty-fifth session).
DECODE_MAX_ROWS = 16
# H200, TinyLlama's 32:4 heads of 64, bfloat16, the splits merged in the last one (graph-replayed us at 96,
# 1,000 and 4,000 cached keys, batch 8 at 200): 4 groups a CU and 128 items 14.0 / 22.7 / 51.6 / 15.6; 1 and
# 256 12.2 / 20.7 / 35.5 / 13.7 (fewer splits for the last one to merge; bench/NOTES.md, seventh session)
DECODE_GROUPS_PER_CU = 1
DECODE_ITEMS = 256
DECODE_TILE_KEYS = (64, 32, 16)
# A v tile of its own in the decode kernel's local memory where it fits (DECODE_VS): a key tile's k and v rows
# are read together (one memory round trip a tile, not two), and a chained tile (gemv_layers) reads both of
# its first tile's cached rows before it waits for the q/k/v product.
DECODE_V_TILE = True
# The most keys a split of the decode kernel holds in local memory (DECODE_PRELOAD: its cached keys and values
# read at once, before a chained tile waits for the q/k/v product, instead of a round trip a key tile after
# it, and the split then done in one pass: every score of its rows at once, each row's maximum and sum by a
# butterfly over a group of items, then p v): the splits are then as few as hold the cache at that many keys
# each (no merge where one holds them all), in place of DECODE_GROUPS_PER_CU's. Within the device's local
# memory less DECODE_PRELOAD_SPARE bytes (a chain's own partial sums beside it, gemm/chain.py); 0, or float64:
# the splits of DECODE_GROUPS_PER_CU, key tile after key tile, the first read ahead. H100, TinyLlama-shaped
# bfloat16 decode at batch 1, ms a token without / with 64 (128) keys a split, the whole-layer launch
# assembled within its register count (gemm/chain.py's CAP_REGISTERS): a cache of 128 keys (prompt 32)
# 1.074-1.078 / 1.061-1.063 (1.053-1.055); 512 (450) 1.219-1.221 / 1.103-1.107 (1.116-1.121); 2,048 (2,000)
# 1.380-1.394 / 1.254-1.256 (1.277-1.285). Without that cap the preload's spill slowed every phase of the
# launch (gate/up 17.9 -> 19.0 us a layer) and short caches lost: 1.087 at 128 keys (bench/NOTES.md,
# forty-second and forty-third sessions).
DECODE_PRELOAD_KEYS = 64
DECODE_PRELOAD_SPARE = 4096
# The q heads of a kv head over this many work-groups of the decode kernel (HEAD_SPLIT, with the preload
# only; where it divides the heads of a kv head): each holds the kv head's preloaded keys and takes GROUP /
# DECODE_HEAD_SPLIT heads, so a work-group's scores, softmax and p v are that much shorter (the attention
# phase of a decode layer is latency: ~5 us of a tile's work at 128 keys for TinyLlama's 8 heads a kv head).
# The caches get the same bits; out and lse the same values to rounding (a row's maximum, sum and p v group
# over more items). 1: one work-group a kv head (the default measured so far).
DECODE_HEAD_SPLIT = 1
# rope_cache_decode_attention where the decode kernel runs: q rotated, k rotated into its cache and v copied
# into its cache inside that kernel (ROPE_CACHE), one launch a layer fewer than rope_qkv_cache and then the
# kernel; False: always the two launches (the same bits either way).
DECODE_ROPE_CACHE = True
_DECODE_POSITION_CHECK = device_check(
    "rope_cache_decode_attention: the new rows of batch row {row} reach position {value}, outside the "
    "cache's [0, {limit})")


class DecodePhase:
    """One launch of attention_decode_gpu, described and not yet made: `launch()` makes it; a chain kernel
    (ops.gemm.gemv_chain's attention=) may take it as its first tiles instead (gemm_gemv.cl, CHAIN_ATTN).
    program: the attention's build defines; args: the kernel's arguments by name but its arrival counts;
    grid: (splits of the keys, kv heads, batch rows), one work-group of `items` work-items each; out, lse:
    the results' Tensors."""

    __slots__ = ("queue", "dtype", "program", "args", "grid", "items", "out", "lse")

    def __init__(self, queue: Any, dtype: Any, program: dict[str, Any], args: dict[str, Any],
                 grid: tuple[int, int, int], items: int, out: Tensor, lse: Tensor):
        self.queue, self.dtype, self.program, self.args = queue, dtype, program, args
        self.grid, self.items, self.out, self.lse = grid, items, out, lse

    @property
    def arrivals(self) -> int:
        """Arrival counts the splits' merge takes (one a (batch row, kv head))."""
        return self.grid[1] * self.grid[2]

    def local_bytes(self) -> int:
        """The work-group's local memory (decode_local of attention_gpu.cl; decode_tiles' sum)."""
        return _decode_local_bytes(self.program, self.program["HEAD_DIM"], self.dtype)

    def launch(self) -> Any:
        """The attention's own launch; returns its kernel."""
        nsplit, heads, batch = self.grid
        prg = kernels.program(self.queue.device, "attention_gpu.cl", dtype=self.dtype,
                              options=("-cl-mad-enable",), **self.program)
        arrivals = self.queue.arrival_counts(self.arrivals) if nsplit > 1 else self.lse.buffer
        kernel = prg.attention_decode_gpu
        kernel(self.queue, (nsplit * self.items, heads, batch), (self.items, 1, 1), arrivals=arrivals,
               **self.args)
        return kernel


def decode_tiles(device: Any, rows: int, head_dim: int, dtype: Any, keys: int = 0,
                 heads: int = 1) -> dict[str, int | None] | None:
    """attention_decode_gpu's defines (DR, DK, DNT; DECODE_PRELOAD, its keys, where a split holds its cached
    keys in local memory (_decode_preload); else DECODE_VS, a flag: DECODE_V_TILE where it fits) for `rows`
    rows per kv head, or None when no key tile fits the device's local memory (the regular forward then
    runs). DK: of the DECODE_TILE_KEYS that fit, the largest that cuts `keys` (the cache's) into at least the
    splits wanted for `heads` (batch rows x kv heads; decode_splits_wanted; float64 takes one split), else
    the smallest."""
    budget = device.capabilities.local_mem - 1024
    if DECODE_ITEMS > device.capabilities.max_work_group_size:
        return None
    fits = sorted(dk for dk in DECODE_TILE_KEYS if _decode_local_bytes(
        {"DR": rows, "DK": dk, "DNT": DECODE_ITEMS}, head_dim, dtype) <= budget)
    if not fits:
        return None
    want = 1 if np.dtype(dtype) == dtypes.float64 else decode_splits_wanted(device, heads)  # float64: 1 split
    dk = max((d for d in fits if -(-keys // d) >= want), default=fits[0])
    tiles = {"DR": rows, "DK": dk, "DNT": DECODE_ITEMS}
    preload = _decode_preload(device, tiles, head_dim, dtype, keys)
    if preload:
        tiles["DECODE_PRELOAD"] = preload
    elif DECODE_V_TILE and _decode_local_bytes({**tiles, "DECODE_VS": None}, head_dim, dtype) <= budget:
        tiles["DECODE_VS"] = None
    return tiles


def _decode_preload(device: Any, tiles: dict[str, Any], head_dim: int, dtype: Any, keys: int) -> int:
    """DECODE_PRELOAD's keys for these tiles (a multiple of DK: at most DECODE_PRELOAD_KEYS, the cache's keys
    rounded up to a tile, and what the local memory less DECODE_PRELOAD_SPARE holds), or 0 (float64, or not
    one tile)."""
    dk = tiles["DK"]
    if np.dtype(dtype) == dtypes.float64:
        return 0
    budget = device.capabilities.local_mem - 1024 - DECODE_PRELOAD_SPARE
    most = min(DECODE_PRELOAD_KEYS, max(-(-keys // dk), 1) * dk) // dk * dk
    while most >= dk and _decode_local_bytes({**tiles, "DECODE_PRELOAD": most}, head_dim, dtype) > budget:
        most -= dk
    return most if most >= dk else 0


def decode_splits_wanted(device: Any, heads: int) -> int:
    """Splits of the keys a decode attention of `heads` (batch rows x kv heads) work-groups of its own wants:
    DECODE_GROUPS_PER_CU work-groups on every compute unit."""
    return max(1, -(-DECODE_GROUPS_PER_CU * device.capabilities.compute_units // heads))


def _decode_local_bytes(tiles: dict[str, Any], head_dim: int, dtype: Any) -> int:
    """attention_decode_gpu's local memory for these tiles: sizeof(decode_local) of attention_gpu.cl, its
    fields in order at their alignments (ACC, and ACC4 at 4 ACCs)."""
    rows, dk, q4 = tiles["DR"], tiles["DK"], -(-head_dim // 4)
    pairs = rows * q4
    groups = max(tiles["DNT"] // pairs, 1)
    acc = 8 if np.dtype(dtype) == dtypes.float64 else 4
    pre_t = min(np.dtype(dtype).itemsize, 4)   # DECODE_PRELOAD's elements: T's bits (float32: floats)
    preload = tiles.get("DECODE_PRELOAD", 0) * (4 * q4 + 4) * pre_t   # pk's bytes, and pv's (rows padded)
    in_pre = groups > 1 and 16 * groups * pairs <= preload      # ORED_IN_PRE
    if "DECODE_PRELOAD" in tiles:   # q, the split's rows, its scores, the butterflies' room, m and l
        fields = [(4 * acc, rows * (q4 + 1)), (pre_t, 2 * preload // pre_t),
                  (acc, rows * tiles["DECODE_PRELOAD"] + tiles["DNT"] + 2 * rows)]
    else:
        fields = [(4 * acc, rows * (q4 + 1)), (4 * acc, dk * (q4 + 1) * (2 if "DECODE_VS" in tiles else 1)),
                  (acc, 2 * rows * dk + 4 * rows)]
    fields += [(4 * acc, groups * pairs if groups > 1 and not in_pre else 1), (4, 1)]
    size = 0
    for align, count in fields:
        size = -(-size // align) * align + align * count
    return -(-size // (4 * acc)) * (4 * acc)


def _gpu_local_bytes(kernel: str, BM: int, BN: int, DP: int, TR: int, TC: int, item: int,
                     row_shfl: bool = False) -> int:
    """Local memory of an attention_gpu.cl kernel (the sums in its header)."""
    if kernel == "forward" and row_shfl:
        values = (BM + 2 * BN) * (DP + 4) + BM * (BN + 4) + TR * TC
    elif kernel == "forward":
        values = (BM + BN) * (DP + 4) + BM * (BN + 4) + BM * TC
    elif kernel == "dq":
        values = 2 * (BM + BN) * (DP + 4) + BM * (BN + 4) + 2 * BM
    else:  # dkdv and fused
        values = 2 * (BN + BM) * (DP + 4) + 2 * BN * (BM + 4) + 2 * BM
    return values * item


def gpu_tiles(device: Any, kernel: str, head_dim: int, dtype: Any) -> dict[str, int]:
    """The tile defines of an attention_gpu.cl kernel ("forward", "dq", "dkdv", "fused") for this head dim and
    dtype on `device`: among the grids of GPU_GRIDS that pad the head dim least, the first whose local memory
    fits and whose accumulators (the output's, or dk's and dv's) stay within 64 values per work-item (the
    last grid of the list may exceed that); "fused" also wants the query tile a multiple of TR."""
    item = 8 if np.dtype(dtype) == dtypes.float64 else 4
    caps = device.capabilities
    budget = caps.local_mem - 1024
    accumulators = 2 if kernel in ("dkdv", "fused") else 1
    grids = GPU_GRIDS[kernel]
    padded = [-(-head_dim // (4 * grid[0])) * 4 * grid[0] for grid in grids]
    order = sorted(range(len(grids)), key=lambda n: (padded[n], n))
    for n in order:
        TC, TR, rows, cols = grids[n]
        DP = padded[n]
        CE = DP // (4 * TC)
        if rows * CE * 4 * accumulators > 64 and n != len(grids) - 1:
            continue
        if kernel in ("dkdv", "fused"):
            BN, BM = TR * rows, TC * cols
            if kernel == "fused" and BM % TR:
                continue
        else:
            BM, BN = TR * rows, TC * cols
        fits = _gpu_local_bytes(kernel, BM, BN, DP, TR, TC, item, _row_shfl(device)) <= budget
        if TR * TC <= caps.max_work_group_size and fits:
            return {"BM": BM, "BN": BN, "TR": TR, "TC": TC, "CE": CE}
    raise DTypeError(f"flash_attention: head_dim {head_dim} ({np.dtype(dtype)}) needs more local memory than "
                     f"{device.device_name} has ({caps.local_mem} bytes)")


class DropoutDraw:
    """Which Philox numbers one attention call's dropout reads: the generator's key (`seed`) and the first
    of the counters reserved for it (`counter`, one per query row). The forward fills it (fresh counters
    from `generator` on every call; inside a graph capture, again at every replay); pass the same object
    to the backward, which regenerates the forward's mask from it."""

    def __init__(self, generator: Generator | None = None):
        if generator is not None and not isinstance(generator, Generator):
            raise TypeError(f"generator must be a netcl.ops.random.Generator, got {type(generator).__name__}")
        self.generator = generator if generator is not None else default_generator
        self.seed: int | None = None
        self.counter: int | None = None
        self.rows: int | None = None

    def take(self, rows: int) -> None:
        """Reserve counters for `rows` query rows (a new mask)."""
        self.seed = self.generator.seed
        self.counter = self.generator.take(max(rows, 1))
        self.rows = rows

    def args(self) -> dict[str, Any]:
        return {"seed_lo": np.uint32(self.seed & 0xFFFFFFFF), "seed_hi": np.uint32(self.seed >> 32),
                "counter0": np.uint64(self.counter)}

    def __repr__(self) -> str:
        return f"DropoutDraw(seed={self.seed}, counter={self.counter}, rows={self.rows})"


# -- checks ----------------------------------------------------------------------------------------------
class _Problem:
    """The checked shapes, dtype and options of one attention call."""

    def __init__(self, op: str, q: Any, k: Any, v: Any, causal: Any, scale: Any, mask: Any, dropout_p: Any,
                 kv_len: Any):
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, Tensor):
                raise TypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}")
            if t.ndim != 4:
                raise ShapeError(
                    f"{op}: {name} must be 4-D (batch, heads, sequence, head_dim), got shape {t.shape}"
                )
        check_same_queue(q, k, v)
        if not (q.dtype == k.dtype == v.dtype):
            raise DTypeError(f"{op}: q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
        if q.dtype not in _FLOATS:
            raise DTypeError(f"{op} supports float16, bfloat16, float32 and float64 tensors, got {q.dtype}")
        if q.dtype == dtypes.float64:
            dtypes.check_supported_on(q.dtype, q.device)
        B, HQ, SQ, D = q.shape
        if k.shape != v.shape:
            raise ShapeError(f"{op}: k and v must have one shape, got {k.shape} and {v.shape}")
        Bk, HKV, SK, Dk = k.shape
        if Bk != B or Dk != D:
            raise ShapeError(
                f"{op}: k and v must be (batch={B}, kv_heads, keys, head_dim={D}) like q {q.shape}, "
                f"got {k.shape}"
            )
        if HKV == 0 or HQ % HKV:
            raise ShapeError(f"{op}: the kv heads ({HKV}) must divide the query heads ({HQ}) "
                             f"(q {q.shape}, k {k.shape})")
        if not 1 <= D <= MAX_HEAD_DIM:
            raise ShapeError(f"{op}: head_dim must be between 1 and {MAX_HEAD_DIM}, got {D} (q {q.shape})")
        if not isinstance(causal, (bool, np.bool_)):
            raise TypeError(f"{op}: causal must be True or False, got {causal!r}")
        if scale is None:
            scale = 1.0 / math.sqrt(D)
        if isinstance(scale, (bool, np.bool_)) or not isinstance(
            scale, (int, float, np.floating, np.integer)
        ):
            raise TypeError(f"{op}: scale must be a number or None, got {scale!r}")
        if not math.isfinite(float(scale)):
            raise ValueError(f"{op}: scale must be finite, got {scale}")
        if isinstance(dropout_p, (bool, np.bool_)) or not isinstance(dropout_p, (int, float, np.floating)):
            raise TypeError(f"{op}: dropout_p must be a number in [0, 1), got {dropout_p!r}")
        if not 0.0 <= float(dropout_p) < 1.0:
            raise ValueError(f"{op}: dropout_p must be in [0, 1), got {dropout_p}")
        self.q, self.k, self.v = q, k, v
        self.queue, self.device, self.dtype = q.queue, q.device, q.dtype
        self.B, self.HQ, self.HKV, self.SQ, self.SK, self.D = B, HQ, HKV, SQ, SK, D
        self.group = HQ // HKV
        self.causal = bool(causal)
        self.scale = float(scale)
        self.dropout_p = float(dropout_p)
        self.mask, self.mask_kind = self._check_mask(op, mask)
        self.kv_len = self._check_kv_len(op, kv_len)
        self.vector_rows = self.dtype == dtypes.float32 and D % 4 == 0 and _rows_aligned(q, k, v)

    def _check_mask(self, op: str, mask: Any) -> tuple[Tensor | None, str]:
        if mask is None:
            return None, "MASK_NONE"
        if not isinstance(mask, Tensor):
            raise TypeError(f"{op}: mask must be a bool or float Tensor, got {type(mask).__name__}")
        check_same_queue(self.q, mask)
        full = (self.B, self.HQ, self.SQ, self.SK)
        if mask.ndim > 4:
            raise ShapeError(
                f"{op}: mask of shape {mask.shape} does not broadcast to (B, Hq, Sq, Sk) = {full}"
            )
        lead = (1,) * (4 - mask.ndim)
        for have, want in zip(lead + tuple(mask.shape), full, strict=True):
            if have not in (1, want):
                raise ShapeError(
                    f"{op}: mask of shape {mask.shape} does not broadcast to (B, Hq, Sq, Sk) = {full}"
                )
        if mask.dtype == dtypes.bool_:
            kind = "MASK_BOOL"
        elif mask.dtype in _FLOATS:
            kind = "MASK_ADD"
            if mask.dtype != self.dtype:
                mask = cast(mask, self.dtype)  # (the mask's own size: broadcasting happens in the kernel)
        else:
            raise DTypeError(
                f"{op}: mask must be bool (True = attend) or a float dtype (added to the scores), "
                f"got {mask.dtype}"
            )
        return mask.reshape(lead + tuple(mask.shape)).expand(*full), kind

    def _check_kv_len(self, op: str, kv_len: Any) -> Tensor | None:
        if kv_len is None:
            return None
        if not isinstance(kv_len, Tensor):
            raise TypeError(
                f"{op}: kv_len must be None or an int32 Tensor of shape (1,) or ({self.B},) on the "
                f"device (e.g. Tensor.from_host(queue, np.array([L], np.int32))), got "
                f"{type(kv_len).__name__}"
            )
        check_same_queue(self.q, kv_len)
        if kv_len.dtype != dtypes.int32:
            raise DTypeError(f"{op}: kv_len must be an int32 Tensor, got {kv_len.dtype}")
        if kv_len.shape not in ((1,), (self.B,)):
            raise ShapeError(
                f"{op}: kv_len must have shape (1,) or (batch,) = ({self.B},), got {kv_len.shape}"
            )
        return kv_len

    # -- kernels --------------------------------------------------------------------------------------
    def variant(self) -> str:
        return variant_override if variant_override is not None else \
            ("cpu" if self.device.capabilities.kind == "cpu" else "gpu")

    def decode_plan(self) -> dict[str, int | None] | None:
        """The decode kernel's defines when this forward should run it (GPU variant, few rows per kv head);
        HEAD_SPLIT where DECODE_HEAD_SPLIT divides a kv head's q heads and the split preloads its keys."""
        rows = self.group * self.SQ
        if self.variant() != "gpu" or rows > DECODE_MAX_ROWS:
            return None
        split = DECODE_HEAD_SPLIT
        if not isinstance(split, int) or isinstance(split, bool) or split < 1:
            raise ValueError(f"DECODE_HEAD_SPLIT must be an int >= 1, got {split!r}")
        if split > 1 and self.group % split == 0:
            tiles = decode_tiles(self.device, rows // split, self.D, self.dtype, self.SK,
                                 self.B * self.HKV * split)
            if tiles is not None and "DECODE_PRELOAD" in tiles:
                return {**tiles, "HEAD_SPLIT": split}
        return decode_tiles(self.device, rows, self.D, self.dtype, self.SK, self.B * self.HKV)

    def decode_phase(self, tiles: dict[str, Any], out: Tensor, lse: Tensor, args: dict[str, Any],
                     defines: dict[str, Any] | None = None, layers: int = 1) -> DecodePhase:
        """attention_decode_gpu's launch into out and lse, not yet made (over several splits of the keys,
        merged by the last split of each (batch, kv head) to finish), with extra `defines` (ROPE_CACHE); the
        splits' parts sized for `layers` layers one after the other (rope_cache_decode_phase)."""
        dk = tiles["DK"]
        tiles_of_keys = max(1, -(-self.SK // dk))
        if "DECODE_PRELOAD" in tiles:   # as few splits as hold the cache at DECODE_PRELOAD keys each
            nsplit = max(1, -(-self.SK // tiles["DECODE_PRELOAD"]))
        else:
            want = decode_splits_wanted(self.device, self.B * self.HKV)
            nsplit = 1 if self.dtype == dtypes.float64 else min(want, tiles_of_keys)
        chunk = -(-tiles_of_keys // nsplit) * dk
        nsplit = max(1, -(-self.SK // chunk))
        program = {"HEAD_DIM": self.D, "MASK": self.mask_kind, "PASS": "PASS_DECODE", **tiles,
                   **({"VEC_ROWS": None} if self.vector_rows else {}), **(defines or {})}
        q4 = -(-self.D // 4)
        if nsplit > 1:
            rows = layers * self.B * self.HQ * self.SQ
            part_o = Tensor.empty(self.queue, (rows, nsplit, 4 * q4), dtypes.float32)
            part_ml = Tensor.empty(self.queue, (rows, nsplit, 2), dtypes.float32)
            bufs = {"part_o": part_o.buffer, "part_ml": part_ml.buffer}
        else:
            bufs = {"part_o": lse.buffer, "part_ml": lse.buffer}  # unread: one split
        launch = {"out": out.buffer, "lse": lse.buffer, "nsplit": np.int32(nsplit), "chunk": np.int32(chunk),
                  **bufs, **args}
        heads = tiles.get("HEAD_SPLIT", 1)   # virtual kv heads: GROUP / HEAD_SPLIT q heads each
        if heads > 1:
            launch["GROUP"] = np.int32(self.group // heads)
        return DecodePhase(self.queue, self.dtype, program, launch, (nsplit, self.HKV * heads, self.B),
                           tiles["DNT"], out, lse)

    def launch_decode(self, tiles: dict[str, Any], out: Tensor, lse: Tensor, args: dict[str, Any],
                      defines: dict[str, Any] | None = None) -> Any:
        """decode_phase's launch, made; returns the kernel (for graph refreshes)."""
        return self.decode_phase(tiles, out, lse, args, defines).launch()

    def mma_forward(self) -> bool:
        """Whether the forward runs attention_mma.cl: float16 / bfloat16 inputs, a head dim that is a multiple
        of 16 up to 128, every row of q, k, v on a 16-byte boundary, and matrix units (GPU_MMA,
        MMA_EMULATE)."""
        if self.dtype not in (dtypes.float16, dtypes.bfloat16) or self.D % 16 or self.D > 128:
            return False
        if not _rows_16_bytes(self.q, self.k, self.v):
            return False
        if MMA_EMULATE:
            return True
        use = GPU_MMA if GPU_MMA is not None else bool(matrix_units(self.device))
        return use and self.variant() == "gpu"

    def mma_backward(self, grad_out: Tensor) -> bool:
        """Whether the backward runs attention_mma.cl's two passes: the forward's conditions, a head dim up to
        MMA_BACKWARD_MAX_HEAD_DIM (above 64 a multiple of 32: dk/dv in two column slices), and grad_out's rows
        on 16-byte boundaries too."""
        return (self.D <= 64 or (self.D <= MMA_BACKWARD_MAX_HEAD_DIM and self.D % 32 == 0)) \
            and self.mma_forward() and _rows_16_bytes(grad_out)

    def wgmma_pass(self, kernel: str) -> bool:
        """Whether the matrix-unit pass `kernel` ("forward", "dq", "dkdv") takes its products on wgmma
        (WGMMA_PASSES): head dim 64 (or 128, the passes WGMMA_128 names), and a device that runs wgmma or the
        emulation asked for."""
        if WGMMA_PASSES is not None and (not isinstance(WGMMA_PASSES, tuple)
                                         or not set(WGMMA_PASSES) <= {"forward", "dq", "dkdv"}):
            raise ValueError(f"WGMMA_PASSES must be None or a tuple of 'forward', 'dq', 'dkdv', got "
                             f"{WGMMA_PASSES!r}")
        if not isinstance(WGMMA_128, tuple) or not set(WGMMA_128) <= {"forward", "dq", "dkdv"}:
            raise ValueError(f"WGMMA_128 must be a tuple of 'forward', 'dq', 'dkdv', got {WGMMA_128!r}")
        if kernel not in ("forward", "dq", "dkdv"):
            return False
        if self.D == 128:
            if kernel not in WGMMA_128:
                return False
        elif self.D != 64:
            return False
        if WGMMA_PASSES is not None:
            return kernel in WGMMA_PASSES
        return not MMA_EMULATE and has_wgmma(self.device)

    def launch_mma(self, kernel: str, **args: Any) -> Any:
        """attention_mma.cl's `kernel` ("forward", "dq", "dkdv"; see mma_forward); returns the kernel."""
        tiles = {key: value for key, value in MMA_TILES.items() if not isinstance(value, dict)}
        tiles.update(MMA_TILES.get(kernel, {}))   # the kernel's own tiles, where MMA_TILES names some
        wg = self.wgmma_pass(kernel)
        if kernel == "dkdv":
            if MMA_TILES.get("dkdv", {}).get("RB", 1) != 1:
                raise ValueError("MMA_TILES: the dk/dv pass keeps 16 keys a warp (RB 1)")
            tiles.pop("RB", None)
        if wg:   # the units' tiles: 64 rows a warpgroup, 64-row streamed tiles through the ring
            fixed = {"BQ": 64, "DKDV_RING": 1} if kernel == "dkdv" else {"BN": 64, "RB": 1, "PREFETCH": 1}
            if self.D == 128:   # TILES_128's size: the smaller two stages, the larger one (48 KB either way)
                size = TILES_128.get(kernel) if isinstance(TILES_128, dict) else None
                small, large = (16, 32) if kernel == "dkdv" else (32, 64)
                if size not in (small, large):
                    raise ValueError(f"TILES_128[{kernel!r}] must be {small} or {large}, got {size!r}")
                if kernel == "dkdv":   # (64 keys and their k and v rows beside the query tiles)
                    # (DKDV_KREG: k's rows in registers, two stages of the larger tile; unset, on for
                    # rows that are not causal: see the note above TILES_128)
                    kreg = MMA_TILES.get("dkdv_wg", {}).get("DKDV_KREG")
                    kreg = int((not self.causal if kreg is None else bool(kreg)) and size == large)
                    fixed = {"BQ": size, "DKDV_RING": 1, "DKDV_STAGES": 2 if size == small or kreg else 1,
                             "BM": 64, "WG_KN": 1, "WG_SS": 1, "DKDV_KREG": kreg}
                else:   # (one warpgroup, q's rows beside the key tiles; the dq pass's dO in registers)
                    fixed = {"BN": size, "KV_STAGES": 2 if size == small else 1, "RB": 1, "PREFETCH": 1,
                             "BM": 64, "WG_KN": 1, "WG_SS": 0}
            tiles.update(MMA_TILES.get(f"{kernel}_wg", {}), **fixed, MMA_WG=1)
            if self.D != 128:
                tiles.pop("DKDV_KREG", None)   # (head dim 128's option)
            if tiles["BM"] % 64:
                raise ValueError(f"MMA_TILES['{kernel}_wg']: BM must be a multiple of 64 (rows of whole "
                                 f"warpgroups), got {tiles['BM']}")
            if tiles.get("WG_SS") and (kernel == "forward" or tiles["BM"] != 64):
                raise ValueError(f"MMA_TILES['{kernel}_wg']: WG_SS is the backward passes', with BM 64 "
                                 f"(their rows beside the ring fill 48 KB), got {tiles}")
        rb = tiles.get("RB", 1)
        if rb == 2 and self.D > MMA_RB_MAX_HEAD_DIM:
            tiles.update(RB=1, BM=tiles["BM"] // rb)   # the same warps, one row block each
            rb = 1
        if rb not in (1, 2) or tiles["BM"] % (16 * rb):
            raise ValueError(f"MMA_TILES[{kernel!r}]: RB must be 1 or 2 and BM a multiple of 16 RB, "
                             f"got {tiles}")
        # one kernel a program (each pass has tiles of its own; PoCL builds the emulated kernels slowly)
        defines: dict[str, Any] = {"HEAD_DIM": self.D, "MASK": self.mask_kind, **tiles,
                                   "MMA_PASS": {"forward": 1, "dq": 2, "dkdv": 3}[kernel]}
        # two stages of a k and a v tile (or q's and dO's BM rows, where more), bytes
        ring = 2 * max(2 * defines["BN"], defines["BM"]) * (self.D + 8) * 2
        dkdv_ring = 2 * max(2 * defines["BQ"], defines["BM"]) * (self.D + 8) * 2 + 16 * defines["BQ"]
        local_mem = self.device.capabilities.local_mem
        # (the wgmma forward, and the dq pass at head dim 128, keep q's BM rows in local memory besides: the
        # score product's A operand; the backward passes with WG_SS their rows beside the ring)
        q_rows = 0
        if wg and (kernel == "forward" or (kernel == "dq" and self.D == 128)):   # (k, v unpadded)
            ring = defines.get("KV_STAGES", 2) * 2 * defines["BN"] * self.D * 2
            q_rows = defines["BM"] * self.D * 2
        if tiles.get("WG_SS"):   # (the unpadded stages; lse and delta in registers, or before the ring)
            dkdv_ring = (2 * defines.get("DKDV_STAGES", 2) * defines["BQ"]
                         + (2 - defines.get("DKDV_KREG", 0)) * defines["BM"]) * self.D * 2
            ring = (2 * 2 * defines["BN"] + 2 * defines["BM"]) * self.D * 2
        need = dkdv_ring if kernel == "dkdv" else ring + q_rows
        if wg and need > local_mem:
            raise KernelBuildError(f"attention_mma.cl's wgmma {kernel} pass needs {need} bytes of local "
                                   f"memory; {self.device.describe()} has {local_mem}")
        if defines.get("PREFETCH") and ring > local_mem:
            defines["PREFETCH"] = 0
        if kernel == "dkdv" and self.D > 64 and not wg:   # dk's and dv's columns in two slices (DSPLIT)
            defines["DSPLIT"] = 2
            if defines.get("DKDV_RING") and dkdv_ring > local_mem and defines["BQ"] > 32:
                # the ring with 32-row query tiles rather than none (H200, bfloat16, head dim 64: no ring 4.31
                # ms against 3.14 with it at BQ 32; bench/NOTES.md)
                defines["BQ"] = 32
                dkdv_ring = 2 * max(2 * defines["BQ"], defines["BM"]) * (self.D + 8) * 2 + 16 * defines["BQ"]
        if defines.get("DKDV_RING") and dkdv_ring > local_mem:
            defines["DKDV_RING"] = 0
        if MMA_EMULATE:
            defines["MMA_EMULATE"] = None
        elif GPU_NATIVE_EXP or (GPU_NATIVE_EXP is None and _nvidia(self.device)):
            defines["NATIVE_EXP"] = None
        prg = kernels.program(self.device, "attention_mma.cl", dtype=self.dtype, options=("-cl-mad-enable",),
                              ptx_target="sm_90a" if wg and not MMA_EMULATE else None, **defines)
        threads = tiles["BM"] // (16 * rb) * 32   # a warp: 16 RB query rows (the dk/dv pass: 16 keys)
        rows, heads = (self.SK, self.HKV) if kernel == "dkdv" else (self.SQ, self.HQ)
        per_group = tiles["BM"]   # query rows a work-group (dk/dv: keys, 16 a warp)
        k = getattr(prg, {"forward": "attention_forward_mma", "dq": "attention_backward_dq_mma",
                          "dkdv": "attention_backward_dkdv_mma"}[kernel])
        slices = defines.get("DSPLIT", 1)   # (dk/dv: work-groups a key tile)
        k(self.queue, (-(-rows // per_group) * slices * threads, heads, self.B), (threads, 1, 1), **args)
        if capture.recording_now():   # an op template (the fast path below): what a replay rebinds
            capture.name_slots(**_SLOTS[kernel])
        return k

    def tf32_tiles(self, kernel: str) -> dict[str, int]:
        """attention_tf32.cl's tiles of pass `kernel` ("forward", "dq", "dkdv"; TF32_TILES), checked."""
        tiles = {key: value for key, value in TF32_TILES.items() if not isinstance(value, dict)}
        tiles.update(TF32_TILES.get(kernel, {}))
        warps, rows = tiles.get("WARPS"), tiles.get("BQ" if kernel == "dkdv" else "BN")
        if type(warps) is not int or type(rows) is not int or warps < 1 or rows < 16 or rows % 16 \
                or 16 * warps > 2 * rows:
            raise ValueError(f"TF32_TILES[{kernel!r}]: WARPS >= 1 and {'BQ' if kernel == 'dkdv' else 'BN'} a "
                             f"multiple of 16 of at least 8 WARPS, got {tiles}")
        return tiles

    def tf32_local_bytes(self, kernel: str) -> int:
        """Local memory of attention_tf32.cl's pass `kernel` (its header's sum, the emulation's scratch)."""
        tiles = self.tf32_tiles(kernel)
        rows = tiles["BQ"] if kernel == "dkdv" else tiles["BN"]
        need = 4 * rows * (self.D + 4) * 4 + {"forward": 0, "dq": 2 * 16 * tiles["WARPS"],
                                              "dkdv": 4 * tiles["BQ"]}[kernel] * 4
        if self._tf32_emulated():
            need += (tiles["WARPS"] * (16 * 8 + 8 * 8) + 32 * tiles["WARPS"]) * 4
        return need

    def _tf32_emulated(self) -> bool:
        return MMA_EMULATE or not matrix_units(self.device)

    def tf32_pass(self, kernel: str, *others: Tensor) -> bool:
        """Whether pass `kernel` ("forward", "dq", "dkdv") of this float32 problem runs attention_tf32.cl
        (GPU_TF32X3): the GPU variant, a head dim that is a multiple of 8 up to TF32_MAX_HEAD_DIM, the rows of
        q, k, v and `others` (the backward's grad_out and out) on 16-byte boundaries, its local memory on the
        device."""
        if self.dtype != dtypes.float32 or self.D % 8 or self.D > TF32_MAX_HEAD_DIM:
            return False
        if self.variant() != "gpu":
            return False
        use = GPU_TF32X3 if GPU_TF32X3 is not None else bool(matrix_units(self.device))
        return bool(use) and _rows_aligned(self.q, self.k, self.v, *others) and \
            self.tf32_local_bytes(kernel) <= self.device.capabilities.local_mem

    def launch_tf32(self, kernel: str, **args: Any) -> Any:
        """attention_tf32.cl's pass `kernel` ("forward", "dq", "dkdv"; see tf32_pass); returns the kernel."""
        tiles = self.tf32_tiles(kernel)
        defines: dict[str, Any] = {"HEAD_DIM": self.D, "MASK": self.mask_kind, "WARPS": tiles["WARPS"],
                                   "BN": tiles["BN"], "BQ": tiles["BQ"],
                                   "MMA_PASS": {"forward": 1, "dq": 2, "dkdv": 3}[kernel]}
        if self._tf32_emulated():
            defines["MMA_EMULATE"] = None
        elif GPU_NATIVE_EXP or (GPU_NATIVE_EXP is None and _nvidia(self.device)):
            defines["NATIVE_EXP"] = None
        prg = kernels.program(self.device, "attention_tf32.cl", dtype=self.dtype,
                              options=("-cl-mad-enable", *verbose_options(self.device)), **defines)
        print_build_log(self.device, prg, f"attention_tf32 {kernel}", defines)
        threads = 32 * tiles["WARPS"]
        rows, heads = (self.SK, self.HKV) if kernel == "dkdv" else (self.SQ, self.HQ)
        k = getattr(prg, {"forward": "attention_forward_tf32", "dq": "attention_backward_dq_tf32",
                          "dkdv": "attention_backward_dkdv_tf32"}[kernel])
        k(self.queue, (-(-rows // (16 * tiles["WARPS"])) * threads, heads, self.B), (threads, 1, 1), **args)
        if capture.recording_now():   # an op template (the fast path below): what a replay rebinds
            capture.name_slots(**_SLOTS[kernel])
        return k

    def fused_backward(self) -> bool:
        """Whether dq, dk and dv come from the single fused pass (GPU variant, float32, GPU_BACKWARD "fused",
        a grid that fits)."""
        if GPU_BACKWARD not in ("fused", "two_pass"):
            raise ValueError(f"GPU_BACKWARD must be 'fused' or 'two_pass', got {GPU_BACKWARD!r}")
        if self.variant() != "gpu" or self.dtype != dtypes.float32 or GPU_BACKWARD != "fused":
            return False
        try:
            gpu_tiles(self.device, "fused", self.D, self.dtype)
        except DTypeError:
            return False
        return True

    def launch(self, kernel: str, nsplit: int | None = None, **args: Any) -> Any:
        """Launch attention kernel `kernel` ("forward", "dq", "dkdv", "fused") of this problem's variant;
        returns the kernel object (for graph refreshes). "fused" with `nsplit`: the deterministic pass (dq_acc
        holds nsplit copies of dq; then sum_dq_copies)."""
        variant = self.variant()
        name = {
            "forward": "attention_forward",
            "dq": "attention_backward_dq",
            "dkdv": "attention_backward_dkdv",
            "fused": "attention_backward_dkdv",
        }
        by_keys = kernel in ("dkdv", "fused")
        rows, heads = (self.SK, self.HKV) if by_keys else (self.SQ, self.HQ)
        defines: dict[str, Any] = {"HEAD_DIM": self.D, "MASK": self.mask_kind}
        if kernel == "fused" and nsplit is not None:
            defines["DQ_SPLIT"] = None
            defines["DQ_ATOMIC"] = _SPLIT_ADD_DEFINES[dq_split_add(self.device)]
        elif kernel == "fused":
            defines["DQ_ATOMIC"] = _ATOMIC_DEFINES[dq_atomic(self.device)]
        tiles = None
        if variant == "gpu":
            try:
                tiles = gpu_tiles(self.device, kernel, self.D, self.dtype)
            except DTypeError:
                if variant_override == "gpu":
                    raise
                variant = "cpu"  # no grid's local memory fits (float64 at large head dims): the CPU kernels
        if tiles is None:
            if kernel == "fused":
                raise DTypeError("flash_attention_backward: the fused pass runs only the GPU kernels")
            defines.update(CPU_TILES)
            # few query rows (decoding): a smaller row block, not BQ rows computed for one
            defines["BQ"] = min(CPU_TILES["BQ"], 1 << (self.SQ - 1).bit_length())
            per_item = defines["BKV"] if by_keys else defines["BQ"]
            global_size, local_size = (-(-rows // per_item), heads, self.B), (1, 1, 1)
        else:
            defines.update(tiles)
            defines["PASS"] = {"forward": "PASS_FORWARD", "dq": "PASS_DQ"}.get(kernel, "PASS_DKDV")
            if self.vector_rows:
                defines["VEC_ROWS"] = None
            if GPU_NATIVE_EXP or (GPU_NATIVE_EXP is None and _nvidia(self.device)):
                defines["NATIVE_EXP"] = None
            if kernel != "dq" and kernel not in GPU_PREFETCH:
                defines["PREFETCH"] = 0
            if kernel == "forward" and _row_shfl(self.device) and self.dtype != dtypes.float64:
                defines["ROW_SHFL"] = 1
                if not _nvidia(self.device):
                    defines["SHFL_EMULATE"] = None
            threads = tiles["TR"] * tiles["TC"]
            per_group = tiles["BN"] if by_keys else tiles["BM"]
            groups = nsplit if nsplit is not None else -(-rows // per_group)
            global_size, local_size = (groups * threads, heads, self.B), (threads, 1, 1)
        while True:
            try:
                prg = kernels.program(self.device, f"attention_{variant}.cl", dtype=self.dtype,
                                      options=("-cl-mad-enable",), **defines)
                break
            except KernelBuildError:
                kind = {"ATOMIC_RED": "red", "ATOMIC_RED4": "red4"}.get(defines.get("DQ_ATOMIC", ""))
                chosen = GPU_DQ_ATOMIC if nsplit is None else GPU_DQ_SPLIT_ADD
                if kind is None or chosen is not None:
                    raise
                # a driver whose compiler rejects this inline PTX (chosen by device): the next kind
                _PTX_ATOMICS_FAIL.setdefault(self.device.device_name, set()).add(kind)
                defines["DQ_ATOMIC"] = (_ATOMIC_DEFINES[dq_atomic(self.device)] if nsplit is None else
                                        _SPLIT_ADD_DEFINES[dq_split_add(self.device)])
        k = getattr(prg, f"{name[kernel]}_{variant}")
        k(self.queue, global_size, local_size, **args)
        if nsplit is not None:
            self._split_program = prg
        elif kernel != "fused" and capture.recording_now():   # an op template: what a replay rebinds
            capture.name_slots(**_SLOTS[kernel])
        return k

    def sum_dq_copies(self, copies: Tensor, dq: Tensor) -> None:
        """dq = the sum of the deterministic fused pass's copies (nsplit, *dq.shape), in the order of the
        copies (attention_dq_sum_gpu, from the program of the pass just launched)."""
        n = dq.size
        self._split_program.attention_dq_sum_gpu(self.queue, (-(-n // 4),), None, dq_acc=copies.buffer,
                                                 dq=dq.buffer, n=np.int64(n),
                                                 nsplit=np.int32(copies.shape[0]))

    def common_args(self, draw: DropoutDraw | None) -> dict[str, Any]:
        acc = kernels.scalar_type(self.dtype)
        args: dict[str, Any] = {}
        for name, t in (("q", self.q), ("k", self.k), ("v", self.v)):
            args.update(_row_args(name, t))
        mask = self.mask
        if mask is None:
            args.update(mask=self.q.buffer, mask_off=np.int64(0), mask_sb=np.int64(0), mask_sh=np.int64(0),
                        mask_si=np.int64(0), mask_sj=np.int64(0))
        else:
            sb, sh, si, sj = (np.int64(s) for s in mask.strides)
            args.update(mask=mask.buffer, mask_off=np.int64(mask.offset), mask_sb=sb, mask_sh=sh, mask_si=si,
                        mask_sj=sj)
        kv_len = self.kv_len
        if kv_len is None:
            args.update(kv_len=self.q.buffer, kv_len_off=np.int64(0), has_kv_len=np.int32(0),
                        kv_len_stride=np.int64(0))
        else:
            stride = kv_len.strides[0] if kv_len.shape[0] > 1 else 0
            args.update(kv_len=kv_len.buffer, kv_len_off=np.int64(kv_len.offset), has_kv_len=np.int32(1),
                        kv_len_stride=np.int64(stride))
        args.update(HQ=np.int32(self.HQ), GROUP=np.int32(self.group), SQ=np.int32(self.SQ),
                    SK=np.int32(self.SK), causal=np.int32(self.causal), scale=acc(self.scale))
        if draw is None:
            args.update(drop_threshold=np.uint32(0), drop_scale=acc(1.0), seed_lo=np.uint32(0),
                        seed_hi=np.uint32(0), counter0=np.uint64(0))
        else:
            args.update(
                drop_threshold=_drop_threshold(self.dropout_p),
                drop_scale=acc(1.0 / (1.0 - self.dropout_p)),
                **draw.args(),
            )
        return args


def _row_args(name: str, t: Tensor) -> dict[str, Any]:
    """The (buffer, offset, batch/head/row strides) arguments of a (B, H, S, D) operand; its rows must be
    contiguous (the caller made a copy where they were not)."""
    sb, sh, ss, _ = t.strides
    return {name: t.buffer, f"{name}_off": np.int64(t.offset), f"{name}_sb": np.int64(sb),
            f"{name}_sh": np.int64(sh), f"{name}_ss": np.int64(ss)}


def _rows_aligned(*ts: Tensor) -> bool:
    """Every row of every tensor starts at a multiple of 4 elements (float4 loads)."""
    return all(t.offset % 4 == 0 and all(st % 4 == 0 for st, n in zip(t.strides[:3], t.shape[:3], strict=True)
                                         if n > 1) for t in ts)


def _rows_16_bytes(*ts: Tensor) -> bool:
    """Every row of every (B, H, S, D) 16-bit tensor starts on a 16-byte boundary (8 elements)."""
    return all(t.offset % 8 == 0 and all(st % 8 == 0 for st, n in zip(t.strides[:3], t.shape[:3]) if n > 1)
               for t in ts)


def _grad_rows(dk: Tensor, dv: Tensor) -> dict[str, Any]:
    """The dk/dv kernels' GRAD_ARGS of dk and dv (fresh tensors: offset 0, any order of their axes)."""
    i64 = np.int64
    return dict(dk=dk.buffer, dk_sb=i64(dk.strides[0]), dk_sh=i64(dk.strides[1]), dk_ss=i64(dk.strides[2]),
                dv=dv.buffer, dv_sb=i64(dv.strides[0]), dv_sh=i64(dv.strides[1]), dv_ss=i64(dv.strides[2]))


def _dq_rows(dq: Tensor) -> dict[str, Any]:
    """The dq passes' GRAD_ARGS of dq (or of delta, when the pass writes no dq: strides unused)."""
    st = dq.strides[:3] if dq.ndim == 4 else (0, 0, 0)
    return dict(dq=dq.buffer, dq_sb=np.int64(st[0]), dq_sh=np.int64(st[1]), dq_ss=np.int64(st[2]))


def _rows_contiguous(t: Tensor) -> Tensor:
    """t itself when its last axis is contiguous (read in place), else a contiguous copy; anything but a 4-D
    Tensor as it is, for _Problem's checks to name."""
    if not isinstance(t, Tensor) or t.ndim != 4 or t.shape[-1] == 1 or t.strides[-1] == 1:
        return t
    return t.contiguous()


def _drop_threshold(p: float) -> np.uint32:
    """Keep iff a 24-bit uniform draw >= this: probability 1 - threshold / 2**24 (= 1 - p to 2**-24)."""
    return np.uint32(min(round(p * (1 << 24)), (1 << 24) - 1))


def _refresh_dropout_on_replay(draw: DropoutDraw, kernel: Any, draws: bool) -> None:
    """Inside a graph capture: before each replay, the forward's launch takes fresh counters (`draws`) and
    every launch of the call reads the draw's current ones (refreshes run in recording order)."""
    graph = capture.capturing()
    if graph is None:
        return
    index = kernel.arg_index
    rows = draw.rows

    def refresh(args: list) -> None:
        if draws:
            draw.take(rows)
        for name, value in draw.args().items():
            args[index[name]] = value

    graph.on_replay(refresh)


# -- the fast path: templates of repeated calls -----------------------------------------------------------
# An attention call without dropout whose passes are the matrix units', or the forward / dq / dk-dv kernels
# of the CPU and GPU variants (not the fused float32 pass, nor decoding), records its launches the first time
# a call signature is seen (netcl.core.capture: the operands, outputs and workspaces as named slots) and
# replays them after:
# the checks, the tile choices and the ~45 kernel arguments are worked out once per signature, not per call
# (the GEMM's fast path, netcl.ops.gemm). A signature: the operands' shapes, strides, row alignment, dtype
# and queue, causal, scale, the mask's and kv_len's layout, and the module switches the kernels' choice reads
# (a switch assigned anew gives new signatures; capture.plans.invalidate() forgets every plan). Everything
# else (dropout, another kernel family, a copy or a fill on the way) takes the full path, remembered as such.
_INPUT_SLOTS = dict(q=("q", "q_off"), k=("k", "k_off"), v=("v", "v_off"), mask=("mask", "mask_off"),
                        kv=("kv_len", "kv_len_off"))
_SLOTS = {
    "forward": dict(_INPUT_SLOTS, out=("out",), lse=("lse",)),
    "dq": dict(_INPUT_SLOTS, g=("grad_out", "grad_out_off"), out=("out", "out_off"), lse=("lse",),
               delta=("delta",), dq=("dq",)),
    "dkdv": dict(_INPUT_SLOTS, g=("grad_out", "grad_out_off"), out=("out", "out_off"), lse=("lse",),
                 delta=("delta",), dk=("dk",), dv=("dv",)),
}


def _acc_dtype(dt: np.dtype) -> np.dtype:
    """The dtype of the log-sum-exp and delta rows: float64 for float64 operands, else float32."""
    return dtypes.float64 if dt == dtypes.float64 else dtypes.float32


def _layout(t: Any) -> tuple | None:
    """An operand's part of a template key: its shape, strides, row alignment, dtype and queue."""
    return (t.shape, t.strides, t.offset % 8, t.dtype, id(t.queue)) if type(t) is Tensor else None


def _template_key(kind: str, q: Any, k: Any, v: Any, causal: Any, scale: Any, mask: Any, kv_len: Any,
                  *extra: Any) -> tuple | None:
    """The signature of an attention call that may take a template, or None (it takes the full path, which
    checks it and says what is wrong)."""
    if type(q) is not Tensor or type(k) is not Tensor or type(v) is not Tensor or type(causal) is not bool:
        return None
    if scale is not None and type(scale) not in (float, int):
        return None
    if (mask is not None and type(mask) is not Tensor) or (kv_len is not None and type(kv_len) is not Tensor):
        return None
    return ("attention", kind, _layout(q), _layout(k), _layout(v), causal, scale, _layout(mask),
            _layout(kv_len), *extra, id(MMA_TILES), WGMMA_PASSES, WGMMA_128, id(TILES_128),
            MMA_EMULATE, GPU_MMA, GPU_NATIVE_EXP, variant_override, MMA_RB_MAX_HEAD_DIM,
            MMA_BACKWARD_MAX_HEAD_DIM, GPU_PREFETCH, id(CPU_TILES), id(GPU_GRIDS), GPU_TF32X3, id(TF32_TILES),
            TF32_MAX_HEAD_DIM, GPU_BACKWARD, GPU_ROW_SHFL, GPU_DQ_ATOMIC, GPU_DQ_SPLIT_ADD, DECODE_MAX_ROWS,
            get_deterministic())


def _recorded(key: tuple, inputs: tuple, run: Any) -> Any:
    """run() while recording; its launches become the template of `key` when a replay can rebind all of them
    (the matrix-unit kernels, their slots named), else the key is remembered as taking the full path."""
    result, rec = capture.record_template(run, inputs)
    capture.plans.put(key, rec if rec is not None else False)
    return result


# -- forward ---------------------------------------------------------------------------------------------
def flash_attention_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    generator: Generator | None = None,
    kv_len: Tensor | None = None,
    dropout_draw: DropoutDraw | None = None,
) -> tuple[Tensor, Tensor]:
    """(out, lse) of attention (module docstring). With dropout_p > 0 the mask comes from `dropout_draw`
    (filled with fresh counters here; keep it for flash_attention_backward), or from a new draw of
    `generator` (default: the default generator) when none is given."""
    key = None
    if type(dropout_p) in (float, int) and dropout_p == 0 and generator is None and dropout_draw is None \
            and capture.capturing() is None:
        key = _template_key("forward", q, k, v, causal, scale, mask, kv_len)
        hit = capture.plans.get(key) if key is not None else None
        if hit:   # the template: the output in q's memory order, lse
            out = empty_in_order(q)
            lse = Tensor.empty(q.queue, q.shape[:3], _acc_dtype(q.dtype))
            hit.replay({"q": q, "k": k, "v": v, "mask": q if mask is None else mask,
                        "kv": q if kv_len is None else kv_len, "out": out, "lse": lse})
            return out, lse
        if hit is False:
            key = None
    if key is not None:
        return _recorded(key, (q, k, v, mask, kv_len), lambda: _forward(
            q, k, v, causal=causal, scale=scale, mask=mask, kv_len=kv_len))
    return _forward(q, k, v, causal=causal, scale=scale, mask=mask, dropout_p=dropout_p, generator=generator,
                    kv_len=kv_len, dropout_draw=dropout_draw)


def _forward(q: Tensor, k: Tensor, v: Tensor, *, causal: Any = False, scale: Any = None, mask: Any = None,
             dropout_p: Any = 0.0, generator: Any = None, kv_len: Any = None,
             dropout_draw: Any = None) -> tuple[Tensor, Tensor]:
    """flash_attention_forward's full path: every check, the kernel's choice and its arguments."""
    op = "flash_attention"
    if generator is not None and dropout_draw is not None:
        raise ValueError(f"{op}: pass generator= or dropout_draw= (which holds its generator), not both")
    if dropout_draw is not None and not isinstance(dropout_draw, DropoutDraw):
        raise TypeError(f"{op}: dropout_draw must be a DropoutDraw, got {type(dropout_draw).__name__}")
    q = _rows_contiguous(q)
    pr = _Problem(op, q, _rows_contiguous(k), _rows_contiguous(v), causal, scale, mask, dropout_p, kv_len)
    acc_dtype = _acc_dtype(pr.dtype)
    decode = pr.decode_plan() if q.size else None
    # the output in the query's memory order (the decode kernel's contiguous): heads of a (B, S, H, D)
    # projection give an output whose (B, S, H * D) reshape for the next projection is a view, not a copy
    out = (Tensor.empty(pr.queue, (pr.B, pr.HQ, pr.SQ, pr.D), pr.dtype) if decode is not None
           else empty_in_order(q))
    lse = Tensor.empty(pr.queue, (pr.B, pr.HQ, pr.SQ), acc_dtype)
    draw = None
    if pr.dropout_p > 0:
        draw = dropout_draw if dropout_draw is not None else DropoutDraw(generator)
        draw.take(pr.B * pr.HQ * pr.SQ)
    if out.size == 0:
        return out, lse
    if decode is not None:
        kernel = pr.launch_decode(decode, out, lse, pr.common_args(draw))
    else:
        rows = dict(out=out.buffer, out_sb=np.int64(out.strides[0]), out_sh=np.int64(out.strides[1]),
                    out_ss=np.int64(out.strides[2]), lse=lse.buffer)
        if pr.mma_forward():
            kernel = pr.launch_mma("forward", **rows, **pr.common_args(draw))
        elif pr.tf32_pass("forward"):
            kernel = pr.launch_tf32("forward", **rows, **pr.common_args(draw))
        else:
            kernel = pr.launch("forward", **rows, **pr.common_args(draw))
    if draw is not None:
        _refresh_dropout_on_replay(draw, kernel, draws=True)
    return out, lse


def flash_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, scale: float | None = None,
                    mask: Tensor | None = None, dropout_p: float = 0.0, generator: Generator | None = None,
                    kv_len: Tensor | None = None) -> Tensor:
    """softmax(q k^T * scale + mask) v, (B, Hq, Sq, D) (module docstring; no S x S memory)."""
    return flash_attention_forward(q, k, v, causal=causal, scale=scale, mask=mask, dropout_p=dropout_p,
                                   generator=generator, kv_len=kv_len)[0]


def rope_cache_decode_attention(y: Tensor, q_heads: int, cos: Tensor, sin: Tensor, k_cache: Tensor,
                                v_cache: Tensor, position: Tensor, pairing: str = "half", *,
                                causal: bool = True, scale: float | None = None, mask: Tensor | None = None,
                                kv_len: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """A decode step's attention from its stacked projection: (out, lse) of attention over the caches' first
    position + S keys after writing the new rows into them, what rope_qkv_cache (its arguments: y (B,
    q_heads + 2 kv_heads, S, D), the tables, the caches (B, kv_heads, capacity, D), `position` the keys
    cached before, pairing) and then flash_attention_forward(q, k_cache, v_cache, causal, scale, mask,
    kv_len=position + S) give, bit for bit. kv_len: position + S when the caller computed it once for every
    layer.

    Where the decode kernel runs (the GPU variant, GROUP * S <= DECODE_MAX_ROWS, rows of y and the caches
    contiguous, tables of at least `capacity` rows, DECODE_ROPE_CACHE) it is one launch: the kernel rotates q
    while staging it and the split holding the new positions writes them (attention_gpu.cl, ROPE_CACHE; a
    position outside the cache raises ShapeError at the next host read); elsewhere the two launches."""
    phase = rope_cache_decode_phase(y, q_heads, cos, sin, k_cache, v_cache, position, pairing, causal=causal,
                                    scale=scale, mask=mask)
    if phase is None:
        q = rope_qkv_cache(y, q_heads, cos, sin, k_cache, v_cache, position, pairing)
        lengths = kv_len if kv_len is not None else add(position, y.shape[2])
        return flash_attention_forward(q, k_cache, v_cache, causal=causal, scale=scale, mask=mask,
                                       kv_len=lengths)
    phase.launch()
    return phase.out, phase.lse


def rope_cache_decode_phase(y: Tensor, q_heads: int, cos: Tensor, sin: Tensor, k_cache: Tensor,
                            v_cache: Tensor, position: Tensor, pairing: str = "half", *, causal: bool = True,
                            scale: float | None = None, mask: Tensor | None = None,
                            layers: int = 1) -> DecodePhase | None:
    """rope_cache_decode_attention's one launch, checked and described but not made (a DecodePhase: its
    `launch()`, or the first tiles of a gemv_chain, ops.gemm.chain), where the decode kernel runs; else None
    (the caller then takes rope_cache_decode_attention's two launches). layers > 1: the phase of that many
    layers of ops.gemm.chain.gemv_layers (its lse and the splits' parts sized for all of them, one after the
    other; `launch()` makes the first layer's)."""
    op = "rope_cache_decode_attention"
    queue, _, offset = check_qkv_cache(op, y, q_heads, cos, sin, k_cache, v_cache, position, pairing)
    b, _, s, d = y.shape
    fusable = (DECODE_ROPE_CACHE and y.size and y.strides[3] == 1 and k_cache.strides[3] == 1
               and v_cache.strides[3] == 1 and k_cache.shape == v_cache.shape
               and min(cos.shape[0], sin.shape[0]) >= k_cache.shape[2] >= s)
    if not fusable:
        return None
    pr = _Problem(op, y[:, :q_heads], k_cache, v_cache, causal, scale, mask, 0.0, None)
    tiles = pr.decode_plan()
    if tiles is None:
        return None
    acc_dtype = _acc_dtype(pr.dtype)
    out = Tensor.empty(queue, (b, q_heads, s, d), pr.dtype)
    if type(layers) is not int or layers < 1:
        raise ValueError(f"{op}: layers must be a positive int, got {layers!r}")
    lse = Tensor.empty(queue, (b, q_heads, s) if layers == 1 else (layers, b, q_heads, s), acc_dtype)
    args = pr.common_args(None)
    for name in ("kv_len", "kv_len_off", "has_kv_len", "kv_len_stride"):
        del args[name]
    args.update(position=offset["offsets"], position_off=offset["offset_off"],
                position_stride=offset["offset_stride"], cos_table=table_rows(cos).buffer,
                sin_table=table_rows(sin).buffer, err=queue.check_buffer(), err_code=_DECODE_POSITION_CHECK)
    return pr.decode_phase(tiles, out, lse, args, {"ROPE_CACHE": None, "PAIRING": ROPE_PAIRINGS[pairing]},
                           layers)


# -- backward --------------------------------------------------------------------------------------------
def flash_attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, grad_out: Tensor, *,
                             causal: bool = False, scale: float | None = None, mask: Tensor | None = None,
                             dropout_p: float = 0.0, kv_len: Tensor | None = None,
                             dropout_draw: DropoutDraw | None = None, need_dq: bool = True,
                             need_dkv: bool = True) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(dq, dk, dv) of flash_attention_forward's `out` for `grad_out`, given its `out` and `lse` and the same
    options (and, with dropout, the same DropoutDraw). need_dq / need_dkv skip a pass (its results None).
    Shapes and dtypes: those of q, k, v."""
    key = None
    if type(dropout_p) in (float, int) and dropout_p == 0 and dropout_draw is None and type(need_dq) is bool \
            and type(need_dkv) is bool and type(lse) is Tensor and capture.capturing() is None:
        key = _template_key("backward", q, k, v, causal, scale, mask, kv_len, _layout(out), _layout(grad_out),
                            lse.shape, lse.strides, lse.offset, lse.dtype, id(lse.queue), need_dq, need_dkv)
        hit = capture.plans.get(key) if key is not None else None
        if hit:   # the template: dq, dk, dv in q's, k's and v's memory order, delta its workspace
            dq = empty_in_order(q) if need_dq else None
            dk = empty_in_order(k) if need_dkv else None
            dv = empty_in_order(v) if need_dkv else None
            delta = Tensor.empty(q.queue, q.shape[:3], _acc_dtype(q.dtype))
            hit.replay({"q": q, "k": k, "v": v, "mask": q if mask is None else mask,
                        "kv": q if kv_len is None else kv_len, "g": grad_out, "out": out, "lse": lse,
                        "delta": delta, "dq": delta if dq is None else dq, "dk": dk, "dv": dv})
            return dq, dk, dv
        if hit is False:
            key = None
    if key is not None:
        return _recorded(key, (q, k, v, out, lse, grad_out, mask, kv_len), lambda: _backward(
            q, k, v, out, lse, grad_out, causal=causal, scale=scale, mask=mask, kv_len=kv_len,
            need_dq=need_dq, need_dkv=need_dkv))
    return _backward(q, k, v, out, lse, grad_out, causal=causal, scale=scale, mask=mask, dropout_p=dropout_p,
                     kv_len=kv_len, dropout_draw=dropout_draw, need_dq=need_dq, need_dkv=need_dkv)


def _backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, grad_out: Tensor, *,
              causal: Any = False, scale: Any = None, mask: Any = None, dropout_p: Any = 0.0,
              kv_len: Any = None, dropout_draw: Any = None, need_dq: Any = True,
              need_dkv: Any = True) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """flash_attention_backward's full path: every check, the kernels' choice and their arguments."""
    op = "flash_attention_backward"
    k, v = _rows_contiguous(k), _rows_contiguous(v)
    pr = _Problem(op, _rows_contiguous(q), k, v, causal, scale, mask, dropout_p, kv_len)
    full = (pr.B, pr.HQ, pr.SQ, pr.D)
    for name, t in (("out", out), ("grad_out", grad_out)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}")
        if tuple(t.shape) != full or t.dtype != pr.dtype:
            raise ShapeError(f"{op}: {name} must be a {pr.dtype} tensor of q's shape {full}, got {t.dtype} "
                             f"{t.shape}")
    acc_dtype = _acc_dtype(pr.dtype)
    if not isinstance(lse, Tensor) or tuple(lse.shape) != full[:3] or lse.dtype != acc_dtype:
        got = f"{lse.dtype} {lse.shape}" if isinstance(lse, Tensor) else type(lse).__name__
        raise ShapeError(f"{op}: lse must be the forward's {acc_dtype} tensor of shape {full[:3]}, got {got}")
    check_same_queue(q, out, lse, grad_out)
    draw = None
    if pr.dropout_p > 0:
        if not isinstance(dropout_draw, DropoutDraw) or dropout_draw.counter is None:
            raise ValueError(
                f"{op}: dropout_p > 0 needs dropout_draw=, the DropoutDraw the forward used (its "
                "mask is regenerated from it)"
            )
        if dropout_draw.rows != pr.B * pr.HQ * pr.SQ:
            raise ShapeError(
                f"{op}: dropout_draw was drawn for {dropout_draw.rows} query rows, this call has "
                f"{pr.B * pr.HQ * pr.SQ}"
            )
        draw = dropout_draw
    g, out = _rows_contiguous(grad_out), _rows_contiguous(out)
    mma = pr.mma_backward(g)
    tf32 = not mma and pr.tf32_pass("dq", g, out) and (not need_dkv or pr.tf32_pass("dkdv"))
    fused = not mma and not tf32 and need_dq and need_dkv and pr.fused_backward()
    # dq, dk and dv in q's, k's and v's memory order: heads of a (B, S, H, D) projection get gradients whose
    # (B, S, H * D) reshape for the projection's backward is a view, not a copy (the fused pass's dq, made by
    # float atomic adds over a float32 buffer, is contiguous)
    dq = (Tensor.empty(pr.queue, full, pr.dtype) if fused else empty_in_order(q)) if need_dq else None
    dk = empty_in_order(k) if need_dkv else None
    dv = empty_in_order(v) if need_dkv else None
    if pr.B * pr.HQ * pr.SQ * pr.D == 0 or pr.SK == 0:
        for t in (dq, dk, dv):
            if t is not None and t.size:
                t.fill_(0)
        return dq, dk, dv
    lse = lse if lse.offset == 0 and lse.is_contiguous() else lse.clone()
    delta = Tensor.empty(pr.queue, full[:3], acc_dtype)  # rowsum(grad_out * out), written by the dq pass
    if not (out.dtype == dtypes.float32 and _rows_aligned(g, out)):
        pr.vector_rows = False
    args = pr.common_args(draw)
    args.update(_row_args("grad_out", g))
    args.update(_row_args("out", out))
    args.update(lse=lse.buffer, delta=delta.buffer)
    if mma or tf32:
        if mma and not _rows_16_bytes(out):   # the dq pass reads out's rows 16 bytes at a time (delta)
            out = out.clone()
            args.update(_row_args("out", out))
        # the matrix units' two passes: dq (and delta), then dk and dv; no atomics, the same bits each run
        launch = pr.launch_mma if mma else pr.launch_tf32
        kernel = launch("dq", **_dq_rows(dq if dq is not None else delta), do_dq=np.int32(dq is not None),
                        **args)
        if draw is not None:
            _refresh_dropout_on_replay(draw, kernel, draws=False)
        if dk is not None:
            kernel = launch("dkdv", **_grad_rows(dk, dv), **args)
            if draw is not None:
                _refresh_dropout_on_replay(draw, kernel, draws=False)
        return dq, dk, dv
    # the dq pass (or, fused / dk and dv only, its first part: delta alone)
    kernel = pr.launch("dq", **_dq_rows(dq if dq is not None else delta),
                       do_dq=np.int32(dq is not None and not fused), **args)
    if draw is not None:
        _refresh_dropout_on_replay(draw, kernel, draws=False)
    split = fused and get_deterministic()
    if split:
        # FlashAttention-2's deterministic mode: nsplit float32 copies of dq, summed in a fixed order
        key_tile = gpu_tiles(pr.device, "fused", pr.D, pr.dtype)["BN"]
        nsplit = dq_splits(pr.device, pr.B, pr.HKV, pr.SK, key_tile)
        copies = Tensor.empty(pr.queue, (nsplit, *full), dtypes.float32)
        kernel = pr.launch("fused", nsplit=nsplit, **_grad_rows(dk, dv), dq_acc=copies.buffer, **args)
    elif fused:
        dq.fill_(0.0)
        kernel = pr.launch("fused", **_grad_rows(dk, dv), dq_acc=dq.buffer, **args)
    elif dk is not None:
        kernel = pr.launch("dkdv", **_grad_rows(dk, dv), **args)
    if dk is not None and draw is not None:
        _refresh_dropout_on_replay(draw, kernel, draws=False)   # (refreshes the launch just recorded)
    if split:
        pr.sum_dq_copies(copies, dq)
    return dq, dk, dv


# -- inspection ------------------------------------------------------------------------------------------
def attention_dropout_mask(queue: Any, draw: DropoutDraw, shape: tuple[int, int, int, int],
                           dropout_p: float) -> Tensor:
    """The keep-mask (bool, `shape` = (B, Hq, Sq, Sk)) that attention with `dropout_p` and `draw` (as filled
    by
    its forward) applies: True where a probability is kept (and scaled by 1 / (1 - p)). For tests and
    inspection only: it is the S x S matrix the attention kernels never store."""
    if not isinstance(draw, DropoutDraw) or draw.counter is None:
        raise ValueError("attention_dropout_mask: draw must be a DropoutDraw filled by a forward call")
    B, HQ, SQ, SK = (int(s) for s in shape)
    if B * HQ * SQ != draw.rows:
        raise ShapeError(f"attention_dropout_mask: the draw covers {draw.rows} query rows, shape {shape} has "
                         f"{B * HQ * SQ}")
    keep = Tensor.empty(queue, (B, HQ, SQ, SK), dtypes.bool_)
    if keep.size:
        prg = kernels.program(keep.device, "attention_dropout.cl", dtype=dtypes.float32)
        prg.attention_dropout_keep(
            keep.queue,
            (-(-SK // 4), SQ, B * HQ),
            None,
            keep=keep.buffer,
            BH=np.int32(B * HQ),
            SQ=np.int32(SQ),
            SK=np.int32(SK),
            drop_threshold=_drop_threshold(float(dropout_p)),
            **draw.args(),
        )
    return keep


# -- the op on Nodes (netcl.ops.declaration): the forward keeps out, the log-sum-exp and dropout's draw ------
def _flash_attention_saving(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, scale: float | None = None,
    mask: Tensor | None = None, dropout_p: float = 0.0, generator: Generator | None = None,
    kv_len: Tensor | None = None,
) -> tuple[Tensor, Tensor, DropoutDraw | None]:
    """softmax(q k^T * scale + mask) v on (B, Hq, Sq, D) queries and (B, Hkv, Sk, D) keys and values, as
    netcl.ops.flash_attention (its docstring has the options); gradients for whichever of q, k, v require
    them (the mask and kv_len are constants)."""
    draw = DropoutDraw(generator) if dropout_p and dropout_p > 0 else None
    out, lse = flash_attention_forward(q, k, v, causal=causal, scale=scale, mask=mask, dropout_p=dropout_p,
                                       kv_len=kv_len, dropout_draw=draw)
    return out, lse, draw


def _flash_attention_grads(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                           draw: DropoutDraw | None, causal: bool, scale: float | None, mask: Tensor | None,
                           dropout_p: float, kv_len: Tensor | None, needs: tuple[bool, ...]) -> tuple:
    dq, dk, dv = flash_attention_backward(q, k, v, out, lse, grad_out, causal=causal, scale=scale, mask=mask,
                                          dropout_p=dropout_p, kv_len=kv_len, dropout_draw=draw,
                                          need_dq=needs[0], need_dkv=needs[1] or needs[2])
    return dq, (dk if needs[1] else None), (dv if needs[2] else None)


declare(OpDecl("flash_attention", _flash_attention_saving, _flash_attention_grads, inputs=("q", "k", "v"),
               constants=("mask", "kv_len"), saves=("lse", "draw"), autocast="half"))
