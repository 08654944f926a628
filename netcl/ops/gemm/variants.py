"""GEMM kernel variants, their tile parameters per device class, and which ones a device can use.

Five kernels (gemm_*.cl): "direct" (one work-item per output element, any strides: small and skinny
shapes), "dot" (a work-group per output element along K: thin GPU problems), "gemv" (a decode step's
x @ W^T on half (or int8) weights: a few rows of x, each weight element read once, 16 bytes at a time),
"cpu" (register-blocked wide vectors, no barriers: CPU devices) and "tiled" (local-memory tiles: GPUs).
Their parameters come from the per-device tuning database when `netcl tune` has measured them, else from the
defaults of the device's class below; `usable_params` walks a variant's fallback chain when a device's
compiler rejects (or, for risky variants, miscompiles) a configuration (netcl.core.variants).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pyopencl as cl

from netcl import kernels
from netcl.core import capture, dtypes
from netcl.core.backend import format_options
from netcl.core.variants import Variant, first_usable, source_digest
from netcl.core.variants import start_probes as start_variant_probes
from netcl.errors import KernelBuildError
from netcl.kernels import tuning

ACTIVATIONS = kernels.ACTIVATIONS  # the epilogue activations, by name
VARIANTS = ("direct", "dot", "gemv", "cpu", "tiled", "mma")
_KERNEL_FILES = {
    "direct": "gemm_direct.cl",
    "dot": "gemm_direct.cl",
    "gemv": "gemm_gemv.cl",
    "cpu": "gemm_cpu.cl",
    "tiled": "gemm_tiled.cl",
    "mma": "gemm_mma.cl",
}

# Default tile parameters per variant and dtype: the values of NVIDIA GPUs and CPUs (where they were
# measured), with CLASS_DEFAULTS adjusting them for other device classes. Each knob's meaning is in the
# header of its kernel file. `netcl tune` overrides these per device.
DEFAULTS: dict[str, dict[str, dict[str, int]]] = {
    "direct": {"any": {"UNROLL": 4}},
    "dot": {"any": {"DOT_WG": 64}},
    # GPUs: a warp of 32 work-items along K per weight row, each with 4 16-byte loads in flight, 8 rows per
    # work-group, A staged in local memory (the reasoning: gemm_gemv.cl's header; H200: 71% of the copy rate
    # at M = 1 on TinyLlama's decode shapes; M > 1 takes the "rows" class's tile, SHAPE_TILES). GEMV_NORM
    # (host only): ops.rms_norm_linear puts the RMSNorm in the GEMV's prologue (1) or launches it first (0)
    "gemv": {"any": {"GEMV_WG": 32, "GEMV_ROWS": 8, "GEMV_COLS": 1, "GEMV_UNROLL": 4, "GEMV_STAGE": 1,
                     "GEMV_NORM": 1}},
    "cpu": {
        # MB=128, NB=64: 128 divides the batch-sized M of training GEMMs (256: no ragged row block) and
        # a transposed B (linear's weight) is packed by half as many work-groups as with MB=64;
        # 256 x 256 x 784 still gives 8 work-groups. KC=512 keeps K <= 512 in one chunk (no
        # partial-sum round trips through local memory). Seed-MLP GEMMs: 2.3 ms/step vs 2.8 (64x64).
        # VN=16 (float) / 8 (double): 1.24x the 8 / 4-wide kernel at 1024^3 on AVX-512 (bench/NOTES.md).
        "float32": {"MB": 128, "NB": 64, "KC": 512, "RM": 5, "VN": 16},
        "float16": {"MB": 128, "NB": 64, "KC": 512, "RM": 5, "VN": 16},
        "float64": {"MB": 64, "NB": 32, "KC": 256, "RM": 4, "VN": 8},
    },
    "tiled": {
        # float32: the best of seven H200 sweeps (bench/NOTES.md, GEMM): 4-wide global loads (GVEC), warps
        # as 8 x 4 patches (WX=8), blocks in groups of 8 rows (GM=8); tile-divisible problems compile
        # without the edge path (INNER) at BK=8: 128 registers, two work-groups per SM, 43.4 TFLOP/s at
        # 4096^3 = 0.86x cuBLAS FP32; problems with edge tiles keep the guarded kernel at BK=16 (BKE)
        "float32": {
            "BM": 128,
            "BN": 128,
            "BK": 8,
            "TX": 16,
            "TY": 16,
            "VW": 4,
            "PADA": 4,
            "PADB": 4,
            "MAXRREG": 0,
            "GVEC": 1,
            "WX": 8,
            "GM": 8,
            "INNER": 1,
            "BKE": 16,
        },
        "float16": {
            "BM": 128,
            "BN": 128,
            "BK": 16,
            "TX": 16,
            "TY": 16,
            "VW": 4,
            "PADA": 4,
            "PADB": 4,
            "MAXRREG": 0,
            "WX": 8,
            "GM": 16,
        },
        "float64": {
            "BM": 64,
            "BN": 64,
            "BK": 16,
            "TX": 16,
            "TY": 16,
            "VW": 2,
            "PADA": 2,
            "PADB": 2,
            "MAXRREG": 0,
            "GVEC": 1,
            "WX": 0,
            "GM": 0,
        },
    },
    # NVIDIA's matrix units through inline PTX mma.sync (gemm_mma.cl): float16 / bfloat16 inputs, or TF32
    # from float32 inputs under set_matmul_precision("high"). 128 x 128 blocks of 4 warps of 64 x 64, a
    # two-stage cp.async ring of padded tiles, ldmatrix fragments, blocks in groups of 8 block rows (L2
    # reuse): 290 TFLOP/s float16 at 8192^3 on the H200, the best of the two sweeps (bench/NOTES.md, matrix
    # units; swizzled three-stage rings measured 6-12% slower). TF32: the swizzled three-stage ring with
    # ldmatrix (as fast as the padded one, 115-120). Operands off 16-byte boundaries take the register
    # loader (launch drops ASYNC).
    # EMULATE=1 runs the same fragments through a local-memory emulation of mma (tests on any device).
    # WGMMA=1: on compute capability 9.0, Hopper's warpgroup MMA instead (gemm_wgmma.cl: WGS warpgroups,
    # a WSTAGES-deep cp.async ring of swizzled tiles read by the matrix units through descriptors);
    # EMULATE=2 emulates that kernel on any device. EPI_SMEM=1: half C leaves through local memory in 16-byte
    # rows (H200, the 25M GPT's bfloat16 shapes, TFLOP/s: K = 512 forwards 179 -> 266, 247 -> 330, 253 -> 344,
    # lm_head 293 -> 380; grad inputs 231 -> 309, 358 -> 408, 257 -> 325, 462 -> 481); split-K's float32
    # partial sums leave the same way, 64 rows at a time (with one wave of two blocks an SM,
    # splitk.choose_splits: the weight gradients, replayed against torch's CUDA graph, 0.40 / 0.47 / 0.46x ->
    # 0.53 / 0.61 / 0.59x, fourteenth session). TF32 there: the float32 tiles
    # as they landed, the units reading their top 19 bits (TF32_ROUND=0, as CUTLASS's Hopper TF32 kernels
    # feed them); rounding them in local memory first (TF32_ROUND=1, mma.sync's cvt.rna) cost 1.5x: 135
    # against 215 TFLOP/s at 8192^3 on the H200, cuBLAS TF32 389 (bench/NOTES.md).
    "mma": {
        "float16": {
            "BM": 128,
            "BN": 128,
            "BK": 32,
            "WM": 64,
            "WN": 64,
            "PAD": 8,
            "PADB": 8,
            "EMULATE": 0,
            "ASYNC": 1,
            "STAGES": 2,
            "LDMATRIX": 1,
            "SWIZZLE": 0,
            "GROUP_M": 8,
            "DBUF": 0,
            "WGMMA": 1,
            "WGS": 1,
            "WSTAGES": 3,
            "WPIPE": 0,
            "EPI_SMEM": 1,
        },
        "bfloat16": {
            "BM": 128,
            "BN": 128,
            "BK": 32,
            "WM": 64,
            "WN": 64,
            "PAD": 8,
            "PADB": 8,
            "EMULATE": 0,
            "ASYNC": 1,
            "STAGES": 2,
            "LDMATRIX": 1,
            "SWIZZLE": 0,
            "GROUP_M": 8,
            "DBUF": 0,
            "WGMMA": 1,
            "WGS": 1,
            "WSTAGES": 3,
            "WPIPE": 0,
            "EPI_SMEM": 1,
        },
        "float32": {
            "BM": 128,
            "BN": 128,
            "BK": 16,
            "WM": 64,
            "WN": 64,
            "PAD": 4,
            "PADB": 8,
            "EMULATE": 0,
            "ASYNC": 1,
            "STAGES": 3,
            "LDMATRIX": 1,
            "SWIZZLE": 1,
            "GROUP_M": 8,
            "DBUF": 1,
            "WGMMA": 1,
            "WGS": 1,
            "WSTAGES": 3,
            "WPIPE": 0,
            "TF32_ROUND": 0,
        },
    },
}
# Adjustments per device class (see device_class). GPUs other than NVIDIA's (unmeasured so far: `netcl
# tune` finds their own): no warp-shaped id remap (WX assumes 32-wide warps), and 64 x 64 blocks, which
# need fewer registers and less local memory than the H200's 128 x 128.
CLASS_DEFAULTS: dict[str, dict[str, dict[str, dict[str, int]]]] = {
    # CPUs: one work-item per weight row (no barriers), PoCL's work-group of 8 rows, A read through the cache;
    # the RMSNorm prologue (which stages A) for float32 only. PoCL, 2 cores, x @ W^T of one row after its
    # norm (2026-12-02, min of 5 x 50 calls): float32 K 512 -> N 768 199 us fused, 365 us norm + GEMV;
    # bfloat16 K 2048 -> N 2560 3,533 us fused, 2,345 us norm + GEMV (A staged alone: 2,685; unstaged 2,236)
    "cpu": {"gemv": {name: {"GEMV_WG": 1, "GEMV_ROWS": 8, "GEMV_COLS": 1, "GEMV_UNROLL": 2, "GEMV_STAGE": 0,
                            "GEMV_NORM": int(name == "float32")}
                     for name in ("float16", "bfloat16", "float32")}},
    "gpu": {"tiled": {"float32": {"BM": 64, "BN": 64, "BK": 16, "WX": 0, "BKE": 0},
                      "float16": {"BM": 64, "BN": 64, "WX": 0}}},
}


# Tiles of the tiled kernel per shape class (tiled_shape_class), over the per-dtype defaults above, on one
# device class: the 128 x 128 block wastes half its rows on M = 64 (the first ResNet stage's Winograd
# GEMMs: M = channels = 64) and three quarters on a 64 x 64 output (their weight gradients), and a few
# large blocks leave most SMs idle (512^3 makes 16). A class entry of the tuning database
# ("gemm_tiled", "float32/<class>") replaces the class's tile; classes not listed keep the general tile.
# H200 (bench/conv_sweep.py, 2026-11-30): 64 x 64 blocks of 8 x 8 work-items with BK=16 ran the first
# stage's Winograd GEMMs 16 x (64 x 64 x 32768) at 29 TFLOP/s (the general tile: 11) and their weight
# gradients 16 x 32 x (64 x 64 x 1024) at 29 (8); of 64 x 128 / 64 x 256 / 128 x 64 blocks and 16 x 16
# grids none was faster there. Larger sides kept the general tile (C=128..512: within 3% of the best).
_TILE_64 = {"BM": 64, "BN": 64, "BK": 16, "TX": 8, "TY": 8, "BKE": 0}
# The matrix-unit kernel's classes (mma_shape_class): "short_k" (K <= 1024 on wgmma: a block walks few k
# tiles, so prologue, epilogue and the last wave weigh). H200, the 25M GPT's bfloat16 GEMMs replayed
# (bench/gemm_mma.py --gpt --tiles, 2026-12-02): 64 x 128 blocks ran the K = 512 shapes 1-20% faster than
# 128 x 128 (attention's 16384 x 512 x 512 forward 211 against 175 TFLOP/s), but K = 1376 and K = 4096
# 10-17% slower, and 64 x 64 or 128 x 256 blocks no better anywhere.
_MMA_SHORT_K = {"BM": 64}
# "skinny" (M <= MMA_SKINNY_ROWS: a decode step of a few sequences, x @ W^T): blocks of 16 rows on mma.sync,
# W streamed through a three-stage cp.async ring, split-K summed in the kernel where N alone gives few blocks.
# H200, TinyLlama-1.1B's decode shapes at M = 8, bfloat16, replayed (.gpu-style A/B, 2026-12-03): 16 x 64 x 64
# blocks read the weights 1.4-2.4x faster than the gemv kernel (N = 11264 x K = 2048: 17-19 against 40.5 us;
# 2048 x 5632: 12.2 against 26.1; 32000 x 2048: 46.6 against 99.6); 16 x 128, 32 x 128 and the wgmma 64-row
# blocks no better
_MMA_SKINNY = {"WGMMA": 0, "BM": 16, "BN": 64, "BK": 64, "WM": 16, "WN": 16, "ASYNC": 1, "STAGES": 3,
               "LDMATRIX": 1, "SWIZZLE": 0, "DBUF": 0, "GROUP_M": 0}
MMA_SKINNY_ROWS = 16
# The decode GEMV's class "rows" (M > 1: a batch of decode rows). H200, TinyLlama-1.1B's decode shapes
# (bench/gemv.py --gpu --sweep, 2026-12-02, event time, weight bytes over the copy rate): the default tile
# (a warp a column, 4 loads in flight, A staged) reads bfloat16 weights at 71% at M = 1 but 20% at M = 8,
# where 64 work-items a column without staging or unrolling read them at 28% (68% at M = 1).
_GEMV_ROWS = {"GEMV_WG": 64, "GEMV_ROWS": 4, "GEMV_COLS": 1, "GEMV_UNROLL": 1, "GEMV_STAGE": 0}
SHAPE_TILES: dict[str, dict[str, dict[str, dict[str, int]]]] = {
    "nvidia": {"float32": {"m64n64": _TILE_64, "m64": _TILE_64, "n64": _TILE_64, "rows": _GEMV_ROWS},
               "float16": {"short_k": _MMA_SHORT_K, "skinny": _MMA_SKINNY, "rows": _GEMV_ROWS},
               "bfloat16": {"short_k": _MMA_SHORT_K, "skinny": _MMA_SKINNY, "rows": _GEMV_ROWS}},
}
SHAPE_CLASSES = ("m64n64", "m64", "n64", "few_blocks", "short_k", "skinny", "rows")
MMA_SHORT_K = 1024


def tiled_shape_class(device: Any, m: int, n: int, k: int, batch: int = 1) -> str | None:
    """The tiled kernel's shape class of an m x n x k GEMM over `batch` matrices: "m64n64" (both output
    sides <= 64), "m64" / "n64" (one of them), "few_blocks" (128 x 128 blocks fill less than one wave of
    the device's compute units), None (large: the general tile)."""
    if m <= 64 and n <= 64:
        return "m64n64"
    if m <= 64:
        return "m64"
    if n <= 64:
        return "n64"
    if -(-m // 128) * -(-n // 128) * batch < device.capabilities.compute_units:
        return "few_blocks"
    return None


def mma_shape_class(device: Any, m: int, n: int, k: int) -> str | None:
    """The matrix-unit kernel's shape class of an m x n x k GEMM: "skinny" (M <= MMA_SKINNY_ROWS), "short_k"
    (K <= MMA_SHORT_K on a device with wgmma), None otherwise (the general tile)."""
    if m <= MMA_SKINNY_ROWS:
        return "skinny"
    return "short_k" if k <= MMA_SHORT_K and has_wgmma(device) else None


def shape_class(device: Any, variant: str, m: int, n: int, k: int, batch: int = 1) -> str | None:
    """The shape class `variant`'s tile is chosen by (tiled_shape_class, mma_shape_class, gemv's "rows"), or
    None."""
    if variant == "tiled":
        return tiled_shape_class(device, m, n, k, batch)
    if variant == "gemv":
        return "rows" if m > 1 else None
    return mma_shape_class(device, m, n, k) if variant == "mma" else None


def shape_params(device: Any, variant: str, dtype: Any, shape_class: str | None) -> dict[str, int]:
    """The tile changes of `shape_class` for `variant` on `device`: the tuning database's class entry when
    stored ("gemm_<variant>", "<dtype>/<class>"), else SHAPE_TILES of the device's class; {} for no class
    or no entry."""
    if variant not in ("tiled", "mma", "gemv") or shape_class is None:
        return {}
    name = np.dtype(dtype).name
    db = tuning.active_database(device)
    stored = db.get(f"gemm_{variant}", f"{name}/{shape_class}") if db is not None else None
    if stored:
        return {k: int(v) for k, v in stored.items()}
    return dict(SHAPE_TILES.get(device_class(device), {}).get(name, {}).get(shape_class, {}))


def tiled_block(device: Any, dtype: Any, m: int, n: int, k: int, batch: int = 1) -> tuple[int, int]:
    """(BM, BN) of the tiled kernel's block for this problem on `device` (its shape class's tile), for
    callers that size their own work split to it (Winograd's weight-gradient slices)."""
    tile = {**tuned_params(device, "tiled", dtype),
            **shape_params(device, "tiled", dtype, tiled_shape_class(device, m, n, k, batch))}
    return tile["BM"], tile["BN"]


def device_class(device: Any) -> str:
    """The device's class: "cpu", "nvidia" (NVIDIA's OpenCL driver) or "gpu" (any other GPU or
    accelerator)."""
    caps = device.capabilities
    if caps.kind == "cpu":
        return "cpu"
    if "cl_nv_compiler_options" in caps.extensions or "nvidia" in device.platform_name.lower():
        return "nvidia"
    return "gpu"


def default_params(variant: str, dtype: Any, device: Any = None) -> dict[str, int]:
    """The default tile parameters of `variant` for `dtype` (on `device`'s class when given)."""
    name = np.dtype(dtype).name
    table = DEFAULTS[variant]
    params = dict(table.get(name, table.get("any", {})))
    if device is not None:
        params.update(CLASS_DEFAULTS.get(device_class(device), {}).get(variant, {}).get(name, {}))
    return params


def tuned_params(device: Any, variant: str, dtype: Any) -> dict[str, int]:
    """The parameters netcl uses for `variant` on `device`: tuned when stored, else the class defaults."""
    params = default_params(variant, dtype, device)
    db = tuning.active_database(device)
    stored = db.get(f"gemm_{variant}", np.dtype(dtype).name) if db is not None else None
    if stored:
        params.update({k: int(v) for k, v in stored.items() if k in params})
    return params


def choose_variant(device: Any, m: int, n: int, k: int) -> str:
    """Which kernel a problem of this size gets on `device` (its class decides)."""
    if device.capabilities.kind == "cpu":
        # one to three rows too (a decode step's x @ W^T): the blocked kernel streams W 1.7-6x faster than
        # direct's one work-item per output (bench/NOTES.md, GEMM on CPUs: matrix-vector products)
        if n < 4 or m * n * k <= 32 * 32 * 32:
            return "direct"
        return "cpu"
    if m < 16 or n < 16 or m * n * k <= 64 * 64 * 64:
        return "direct"
    return "tiled"


# -- matrix units ---------------------------------------------------------------------------------------
MATMUL_PRECISIONS = ("highest", "high")
_precision = ["highest"]


def set_matmul_precision(precision: str) -> None:
    """How float32 GEMMs may compute, as PyTorch's torch.set_float32_matmul_precision: "highest" (the
    default: true float32 products) or "high" (TF32 on matrix units where the device has them: float32
    inputs rounded to 10-bit mantissas, float32 accumulation). float16 inputs always take matrix units."""
    if precision not in MATMUL_PRECISIONS:
        raise ValueError(f"matmul precision must be one of {MATMUL_PRECISIONS}, got {precision!r}")
    if precision != _precision[0]:
        _precision[0] = precision
        capture.plans.invalidate()  # a GEMM's plan keeps the kernel this setting chose (TF32 or not)


def get_matmul_precision() -> str:
    return _precision[0]


def matrix_units(device: Any) -> tuple[str, ...]:
    """The input dtypes `device`'s matrix units take through netcl: ("float16", "bfloat16", "tfloat32") on
    NVIDIA GPUs of compute capability 8.0 and later (mma.sync through inline PTX), () elsewhere."""
    cc = getattr(device.capabilities, "nv_compute_capability", None)
    if device_class(device) == "nvidia" and cc is not None and cc >= (8, 0):
        return ("float16", "bfloat16", "tfloat32")
    return ()


# knobs one matrix-unit kernel reads and the other ignores: left out of the other's defines (one program per
# choice, whatever the tile carries)
MMA_SYNC_KNOBS = ("WM", "WN", "PAD", "PADB", "ASYNC", "STAGES", "LDMATRIX", "SWIZZLE", "DBUF", "DYN_LOCAL",
                  "ALIGNED", "B_KMAJOR")
WGMMA_KNOBS = ("WGS", "WSTAGES", "WPIPE", "A_MN", "B_MN", "TF32_ROUND", "EPI_SMEM")


def takes_wgmma(device: Any, defines: dict[str, Any]) -> bool:
    """Whether mma defines build gemm_wgmma.cl: WGMMA None (launch chose it for the operands), or 1 on a
    device with wgmma (EMULATE=2: its emulation on any device); 0 (or EMULATE=1) is the mma.sync kernel."""
    wgmma, emulate = defines.get("WGMMA", 0), defines.get("EMULATE", 0)
    return wgmma is None or (bool(wgmma) and (emulate == 2 or (not emulate and has_wgmma(device))))


def has_wgmma(device: Any) -> bool:
    """Whether `device` runs Hopper's warpgroup MMA through netcl (gemm_wgmma.cl, rebuilt from its PTX for
    sm_90a): NVIDIA GPUs of compute capability 9.0 exactly (sm_90a instructions run on 9.0 only)."""
    cc = getattr(device.capabilities, "nv_compute_capability", None)
    return device_class(device) == "nvidia" and cc == (9, 0)


def uses_matrix_units(device: Any, dtype: Any) -> bool:
    """Whether a GEMM of `dtype` on `device` runs on matrix units (float32: only under precision "high")."""
    units = matrix_units(device)
    name = dtypes.token(dtype if isinstance(dtype, np.dtype) else np.dtype(dtype))  # (dtype.name: ~1 us)
    return (name in ("float16", "bfloat16") and name in units) or (
        name == "float32" and "tfloat32" in units and _precision[0] == "high")


def _fit_local_memory(tile: dict[str, int], dtype: np.dtype, local_mem: int) -> dict[str, int]:
    """Shrink the tiled kernel's k tile (then its padding) until both buffers fit the device."""
    tile = dict(tile)
    item = 8 if dtype == dtypes.float64 else 4

    def need() -> int:
        return 2 * tile["BK"] * (tile["BM"] + tile["PADA"] + tile["BN"] + tile["PADB"]) * item

    while need() > local_mem and tile["BK"] > 4:
        tile["BK"] //= 2
    if need() > local_mem:
        tile["PADA"] = tile["PADB"] = 0
    return tile

# -- program building -------------------------------------------------------------------------------
# Set by bench/gemm.py and bench/kmeans.py --nv-verbose: build with NVIDIA's -cl-nv-verbose and print the
# build log (registers per work-item, spills) of each GEMM (and k-means GPU) program built.
NV_VERBOSE = False

_nv_logged: set[tuple] = set()


_gemv_ok: dict[tuple[int, str, bool], bool] = {}


def gemv_usable(device: Any, dtype: Any, rms: bool = False) -> bool:
    """Whether the gemv kernel builds on `device` for activations of `dtype` (its plain, int8 and GLU forms;
    with `rms` its RMSNorm prologue instead; tried once per device and dtype). A build failure is warned
    once; decode steps then take the other GEMM kernels (int8 weights dequantized first; the norm as its
    own launch) instead of failing."""
    dt = np.dtype(dtype)
    key = (id(device), dtypes.token(dt), rms)
    ok = _gemv_ok.get(key)
    if ok is None and rms and gemv_rms_miscompiled(device, dt):
        ok = _gemv_ok[key] = False
    if ok is None:
        base = {"DTYPE": dt, "ACT": None, "GEMV_M": 1, **default_params("gemv", dt, device)}
        forms = ({"GEMV_STAGE_A": None, "GEMV_RMS": None},) if rms else (
            {}, {"W_INT8": None}, {"W_INT8": None, "GLU": None})
        try:
            for extra in forms:
                _program(device, "gemv", {**base, **extra})
            ok = True
        except KernelBuildError as exc:
            what = "the RMSNorm prologue of gemm_gemv.cl" if rms else "gemm_gemv.cl"
            warnings.warn(f"{what} does not build on {device.describe()} for {dt.name}: {exc}; decode "
                          "steps take " + ("a separate norm launch" if rms else "the other GEMM kernels"),
                          RuntimeWarning, stacklevel=2)
            ok = False
        _gemv_ok[key] = ok
    return ok


def gemv_rms_miscompiled(device: Any, dtype: Any) -> bool:
    """Whether `device`'s compiler is known to miscompile the gemv kernel's RMSNorm prologue for `dtype` rows:
    PyPI's PoCL 3.0 (LLVM 14) on half rows with more than one row (NaN and wrong sums in its work-group
    functions specialised to the local size; Oclgrind runs the same cases right, without races; PoCL 3.1 and
    NVIDIA's driver right too). There the norm stays its own launch (rms_norm_linear) and launch_gemv refuses
    the prologue."""
    return device.is_pocl_3_0 and np.dtype(dtype) in (np.dtype(np.float16), np.dtype(dtypes.bfloat16))


def _program(device: Any, variant: str, defines: dict[str, Any]):
    """A GEMM kernel file (it includes gemm_common.cl) through netcl.kernels. Four knobs are not plain
    defines: DTYPE (the storage dtype: kernels.dtype_defines), ACT (the epilogue activation's name),
    MAD_ENABLE=0 (builds without -cl-mad-enable: the last resort of a variant chain), MAXRREG (NVIDIA
    only: every kernel of the program within that many registers a work-item, so more work-groups fit on an
    SM) and MAX_REGISTERS ((kernel, N) pairs: each kernel named within N). Both are kernels.program's
    max_registers: the program assembled again from its PTX with `.maxnreg` (netcl.core.ptx.cap_registers;
    NVIDIA's OpenCL accepts -cl-nv-maxrregcount=N but ignored it on the H200: 215-221 registers with 128)."""
    defines = dict(defines)
    dtype = defines.pop("DTYPE")
    filename, ptx_target = _KERNEL_FILES[variant], None
    if variant == "mma":
        # switches: a tile value 1 (or a define already set by launch: None) turns one on, 0 leaves it out
        wgmma = takes_wgmma(device, defines)
        emulate = defines.pop("EMULATE", 0)
        defines.pop("WGMMA", None)
        if emulate is None or emulate:
            defines["MMA_EMULATE"] = None
        for knob in ("ASYNC", "LDMATRIX"):
            value = defines.pop(knob, 0)
            if value is None or value:
                defines[knob] = None
        if wgmma:  # Hopper's warpgroup MMA: its own kernel file, rebuilt from its PTX for sm_90a
            filename = "gemm_wgmma.cl"
            ptx_target = None if emulate else "sm_90a"
        for knob in MMA_SYNC_KNOBS if wgmma else WGMMA_KNOBS:
            defines.pop(knob, None)
        defines[{"float16": "MMA_F16", "bfloat16": "MMA_BF16"}.get(np.dtype(dtype).name, "MMA_TF32")] = None
    act = defines.pop("ACT", None)
    extra: tuple[str, ...] = ("-cl-mad-enable",) if defines.pop("MAD_ENABLE", 1) else ()
    max_regs = defines.pop("MAXRREG", 0)
    extra += verbose_options(device)
    max_registers = tuple(defines.pop("MAX_REGISTERS", ())) + ((("*", int(max_regs)),) if max_regs else ())
    prg = kernels.program(device, filename, dtype=dtype, act=act, options=extra, ptx_target=ptx_target,
                          max_registers=max_registers,
                          **defines)
    print_build_log(device, prg, variant, defines)
    return prg


def verbose_options(device: Any) -> tuple[str, ...]:
    """Build options that make NVIDIA's compiler log registers and spills, when NV_VERBOSE is set."""
    nvidia = "cl_nv_compiler_options" in device.capabilities.extensions
    return ("-cl-nv-verbose",) if NV_VERBOSE and nvidia else ()


def print_build_log(device: Any, prg: Any, what: str, defines: dict[str, Any]) -> None:
    """Print the build log of `prg` (what, defines) once, when NV_VERBOSE is set on an NVIDIA device."""
    if not verbose_options(device) or (id(prg), what) in _nv_logged:
        return
    _nv_logged.add((id(prg), what))
    log = prg.cl.get_build_info(device.cl_device, cl.program_build_info.LOG).strip()
    print(f"[netcl] {what} {defines}: {log or '(no log: loaded from the binary cache)'}")


# -- variants a device may not build or run (netcl.core.variants) ----------------------------------
# The cpu kernel with 512-bit vectors (VN=16 float, VN=8 double) is the risky one: PoCL 3.0 (LLVM 14)
# on AVX-512 CPUs that LLVM 14 does not know (AMD Zen 4, "znver3" to it) generates code for a CPU without
# AVX-512 but links the AVX-512 kernel library, and a 512-bit vector crossing a library call is then
# miscompiled or aborts LLVM in the middle of a launch. gemm_cpu.cl avoids such calls now, and a
# variant this wide is still run first in a child process (probe_variant) before this process builds it.
CPU_SAFE_VECTOR_BYTES = 32

# A tiled configuration that any OpenCL GPU should build (small tiles, no padding, no vector fetch):
# what the chain falls back to when the tuned or per-class defaults do not build on a device.
_SAFE_TILED = {"BM": 64, "BN": 64, "BK": 16, "TX": 16, "TY": 16, "PADA": 0, "PADB": 0, "MAXRREG": 0,
               "GVEC": 0, "WX": 0, "GM": 0, "INNER": 0, "BKE": 0}

_usable: dict[tuple, dict[str, int] | None] = {}

_digests: dict[str, str] = {}


def _acc_size(dt: np.dtype) -> int:
    return 8 if dt == dtypes.float64 else 4


def variant_chain(
    variant: str, dt: np.dtype, requested: dict[str, int], device: Any = None
) -> list[dict[str, int]]:
    """Tile parameters to try for `variant`, best first: `requested`, then narrower vectors (cpu) or
    the per-class defaults and a small safe tile (tiled), a smaller block (mma), then the last of these
    without -cl-mad-enable."""
    chain = [dict(requested)]
    if variant == "cpu":
        asked = requested["VN"]
        for lanes in (CPU_SAFE_VECTOR_BYTES // _acc_size(dt), 4):
            if lanes < asked or asked not in (4, 8, 16):
                chain.append({**requested, "VN": lanes})
    elif variant == "tiled":
        chain.append(default_params("tiled", dt, device))
        vw = 2 if dt == dtypes.float64 else 4
        base = default_params("tiled", dt)
        chain.append({**base, **{k: v for k, v in _SAFE_TILED.items() if k in base}, "VW": vw})
    elif variant == "mma":
        chain.append({**requested, "WGMMA": 0})  # mma.sync (a driver that rejects the sm_90a rebuild)
        chain.append({**chain[-1], "BM": 128, "BN": 128, "WM": 64, "WN": 32})  # fewer registers a thread
        chain.append({**chain[-1], "ASYNC": 0, "LDMATRIX": 0})  # plain loads (a driver that rejects the PTX)
    else:
        return chain
    chain.append({**chain[-1], "MAD_ENABLE": 0})
    unique: list[dict[str, int]] = []
    for c in chain:
        if c not in unique:
            unique.append(c)
    return unique


def _fit_device(device: Any, variant: str, dt: np.dtype, tile: dict[str, int]) -> dict[str, int]:
    """`tile` adjusted to what the device and the kernel's own rules allow (tiled: local memory, warps)."""
    if variant != "tiled":
        return tile
    tile = _fit_local_memory(tile, dt, device.capabilities.local_mem)
    wx, tx, ty = tile.get("WX", 0), tile["TX"], tile["TY"]
    if wx and ((tx * ty) % 32 or tx % wx or 32 % wx or ty % (32 // wx)):
        tile["WX"] = 0  # the warp remap does not fit this work-group shape: plain row-major ids
    return tile


def _variant(device: Any, variant: str, dt: np.dtype, tile: dict[str, int]) -> Variant:
    """The netcl.core.variants description of `variant` with `tile` (its build makes the plain define set)."""
    name = _KERNEL_FILES[variant]
    digest = _digests.get(name)
    if digest is None:
        digest = _digests[name] = source_digest(kernels.source(name))
    defines = {**tile}
    label = f"{dt.name} " + " ".join(f"{k}={v}" for k, v in sorted(tile.items()))
    options = format_options({**kernels.dtype_defines(dt), **{k: v for k, v in defines.items()
                                                              if k not in ("MAD_ENABLE", "MAXRREG")}},
                             ("-cl-mad-enable",) if tile.get("MAD_ENABLE", 1) else ())
    probe = None
    risky_key = None
    if (
        variant == "cpu"
        and device.capabilities.kind == "cpu"
        and tile["VN"] * _acc_size(dt) > CPU_SAFE_VECTOR_BYTES
    ):
        probe = ("netcl.ops.gemm.api:probe_variant", (variant, dt.name, tile))
        risky_key = (
            f"gemm_cpu | {dt.name} {tile['VN']}-wide vectors, mad {tile.get('MAD_ENABLE', 1)} | {digest[:16]}"
        )
    return Variant(
        f"gemm_{variant}",
        label,
        options,
        digest,
        build=lambda: _program(device, variant, {"DTYPE": dt, **defines}).kernel(f"gemm_{variant}"),
        probe=probe,
        probe_key=risky_key,
        payload=tile,
    )


def start_probes(device: Any) -> None:
    """Begin judging, in the background, the float32 tile of the CPU GEMM that `device` would take first,
    where that tile is a risky one (wide vectors: a child process builds and checks it, ~3 s on a 2-core
    CPU, once per device): a command calls this when it opens its device, and the first GEMM waits only
    for what is left of the probe (netcl.core.variants.start_probes). Nothing on other devices."""
    if device.capabilities.kind != "cpu":
        return
    dt = np.dtype(np.float32)
    start_variant_probes(device, _chain(device, "cpu", dt, _requested(device, "cpu", dt, None, None)))


def _requested(device: Any, variant: str, dt: np.dtype, params: dict[str, int] | None,
               shape_class: str | None) -> dict[str, int]:
    """The tile a GEMM asks for: `params` over the defaults, else the tuned one with `shape_class`'s."""
    if params is not None:
        return {**default_params(variant, dt, device), **params}
    return {**tuned_params(device, variant, dt), **shape_params(device, variant, dt, shape_class)}


def _chain(device: Any, variant: str, dt: np.dtype, requested: dict[str, int],
           fallbacks: bool = True) -> list[Variant]:
    """The variants usable_params tries for `requested`, best first (its fallback chain, or itself alone)."""
    tiles = variant_chain(variant, dt, requested, device) if fallbacks else [requested]
    return [_variant(device, variant, dt, _fit_device(device, variant, dt, t)) for t in tiles]


def usable_params(device: Any, variant: str, dtype: Any, params: dict[str, int] | None = None,
                  required: bool = True, shape_class: str | None = None) -> dict[str, int] | None:
    """The tile parameters `variant` runs with on `device`: `params` (over the defaults) exactly as given,
    or else the tuned ones (with `shape_class`'s tile: shape_params), or the first of their fallback
    chain (variant_chain) that this device builds (and, for risky ones, runs correctly in a probe).
    When none works: KernelBuildError, or None with required=False (the caller then takes the direct
    kernel)."""
    dt = np.dtype(dtype)
    requested = _requested(device, variant, dt, params, shape_class)
    if variant in ("direct", "dot", "gemv"):
        return requested
    key = (id(device), variant, dt, tuple(sorted(requested.items())), params is None)
    if key in _usable:
        found = _usable[key]
        if found is None and required:
            raise KernelBuildError(f"no variant of gemm_{variant} works on {device.describe()} (see the "
                                   "warnings printed when it was tried)")
        return None if found is None else dict(found)
    try:
        chosen, _ = first_usable(device, _chain(device, variant, dt, requested, fallbacks=params is None))
        found = chosen.payload
    except KernelBuildError:
        _usable[key] = None
        if required:
            raise
        return None
    _usable[key] = found
    return dict(found)
