"""Matrix multiplication: matmul, matmul_epilogue and linear, on the GEMM kernels of kernels/gemm*.cl.

Operands are read in place whatever their layout (transposed views included); batch dimensions
broadcast like NumPy's matmul. Three kernel variants, picked per device class and shape:
"direct" (one work-item per output, any strides: small and skinny shapes), "cpu" (register-blocked
wide-vector kernel without barriers, for CPU devices) and "tiled" (local-memory double-buffered tiles,
for GPUs). Their tile parameters come from the tuning database when `netcl tune` has measured them,
else from the per-device-class defaults below.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyopencl import cltypes

from netcl.core import dtypes
from netcl import kernels
from netcl.core.backend import format_options
from netcl.core.tensor import Tensor, check_same_queue
from netcl.core.variants import Variant, first_usable, source_digest
from netcl.errors import DTypeError, KernelBuildError, ShapeError

ACTIVATIONS = kernels.ACTIVATIONS  # the epilogue activations, by name
VARIANTS = ("direct", "dot", "cpu", "tiled")
_FLOAT_DTYPES = (dtypes.float16, dtypes.float32, dtypes.float64)

# Default tile parameters per variant (and dtype where it matters). Each knob's meaning is in the
# header of its kernel file. `netcl tune` overrides these per device.
DEFAULTS: dict[str, dict[str, dict[str, int]]] = {
    "direct": {"any": {"UNROLL": 4}},
    "dot": {"any": {"DOT_WG": 64}},
    "cpu": {
        # MB=128, NB=64: 128 divides the batch-sized M of training GEMMs (256: no ragged row block) and
        # a transposed B (linear's weight) is packed by half as many work-groups as with MB=64;
        # 256 x 256 x 784 still gives 8 work-groups. KC=512 keeps K <= 512 in one chunk (no
        # partial-sum round trips through local memory). Seed-MLP GEMMs: 2.3 ms/step vs 2.8 (64x64).
        "float32": {"MB": 128, "NB": 64, "KC": 512, "RM": 5, "VN": 16},
        "float16": {"MB": 128, "NB": 64, "KC": 512, "RM": 5, "VN": 16},
        "float64": {"MB": 64, "NB": 32, "KC": 256, "RM": 4, "VN": 8},
    },
    "tiled": {
        # float32: best of seven H200 sweeps (bench/logs/h200-2026-11-29/gemm_*sweep*.txt): 4-wide
        # global loads (GVEC), warps as 8 x 4 patches (WX=8), blocks in groups of 8 rows (GM=8); tile-
        # divisible problems compile without the edge path (INNER) at BK=8: 128 registers, two
        # work-groups per SM, 43.4 TFLOP/s at 4096^3 = 0.86x cuBLAS FP32 (sweep7); problems with edge
        # tiles keep the guarded kernel at BK=16 (BKE), 221 registers, 41 TFLOP/s
        "float32": {"BM": 128, "BN": 128, "BK": 8, "TX": 16, "TY": 16, "VW": 4, "PADA": 4, "PADB": 4,
                    "MAXRREG": 0, "GVEC": 1, "WX": 8, "GM": 8, "INNER": 1, "BKE": 16},
        "float16": {"BM": 128, "BN": 128, "BK": 16, "TX": 16, "TY": 16, "VW": 4, "PADA": 4, "PADB": 4,
                    "MAXRREG": 0, "WX": 8, "GM": 16},
        "float64": {"BM": 64, "BN": 64, "BK": 16, "TX": 16, "TY": 16, "VW": 2, "PADA": 2, "PADB": 2,
                    "MAXRREG": 0, "GVEC": 1, "WX": 0, "GM": 0},
    },
}
_KERNEL_FILES = {"direct": "gemm_direct.cl", "dot": "gemm_direct.cl", "cpu": "gemm_cpu.cl", "tiled": "gemm_tiled.cl"}


def default_params(variant: str, dtype: Any) -> dict[str, int]:
    table = DEFAULTS[variant]
    return dict(table.get(np.dtype(dtype).name, table.get("any", {})))


# Host-side caches of the launch path (a training step calls gemm a few times per step, where
# re-reading kernel sources, hashing them and resolving the tuning file's path cost ~0.3-1 ms a call).
_db_cache: dict[tuple, Any] = {}


def _database(device: Any) -> Any:
    """The tuning database of `device` (resolved once per device and cache directory), or None when
    NETCL_TUNING=0. The database object itself re-reads its file when it changes on disk."""
    from netcl import config

    if not config.tuning_enabled():
        return None
    key = (id(device), config.env("NETCL_CACHE_DIR", ""))
    db = _db_cache.get(key)
    if db is None:
        from netcl.tune.database import database_for

        db = _db_cache[key] = database_for(device)
    return db


def tuned_params(device: Any, variant: str, dtype: Any) -> dict[str, int]:
    """The parameters netcl uses for `variant` on `device`: tuned when stored, else the defaults."""
    params = default_params(variant, dtype)
    db = _database(device)
    stored = db.get(f"gemm_{variant}", np.dtype(dtype).name) if db is not None else None
    if stored:
        params.update({k: int(v) for k, v in stored.items() if k in params})
    return params


def choose_variant(device: Any, m: int, n: int, k: int) -> str:
    """Which kernel a problem of this size gets on `device` (its class decides)."""
    if device.capabilities.kind == "cpu":
        if m < 4 or n < 4 or m * n * k <= 32 * 32 * 32:
            return "direct"
        return "cpu"
    if m < 16 or n < 16 or m * n * k <= 64 * 64 * 64:
        return "direct"
    return "tiled"


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
# Set by bench/gemm.py --nv-verbose: build with NVIDIA's -cl-nv-verbose and print the build log
# (registers per work-item, spills) of each GEMM program built.
NV_VERBOSE = False


_nv_logged: set[tuple] = set()


def _program(device: Any, variant: str, defines: dict[str, Any]):
    """A GEMM kernel file (it includes gemm_common.cl) through netcl.kernels. Four knobs are not plain
    defines: DTYPE (the storage dtype: kernels.dtype_defines), ACT (the epilogue activation's name),
    MAD_ENABLE=0 (builds without -cl-mad-enable: the last resort of a variant chain) and MAXRREG (NVIDIA
    only: caps registers per work-item through -cl-nv-maxrregcount, so more work-groups fit on an SM)."""
    defines = dict(defines)
    dtype = defines.pop("DTYPE")
    act = defines.pop("ACT", None)
    extra: tuple[str, ...] = ("-cl-mad-enable",) if defines.pop("MAD_ENABLE", 1) else ()
    max_regs = defines.pop("MAXRREG", 0)
    nvidia = "cl_nv_compiler_options" in device.capabilities.extensions
    if nvidia and max_regs:
        # NVIDIA's OpenCL accepts this spelling but its ptxas did not cap registers on the H200 (215-221
        # used with =128); "-cl-nv-maxrregcount 128" fails to build. Kept as a knob for other drivers.
        extra += (f"-cl-nv-maxrregcount={int(max_regs)}",)
    if nvidia and NV_VERBOSE:
        extra += ("-cl-nv-verbose",)
    prg = kernels.program(device, _KERNEL_FILES[variant], dtype=dtype, act=act, options=extra, **defines)
    if nvidia and NV_VERBOSE and (id(prg), variant) not in _nv_logged:
        _nv_logged.add((id(prg), variant))
        import pyopencl as cl  # noqa: PLC0415  (a bench-only diagnostic)

        log = prg.cl.get_build_info(device.cl_device, cl.program_build_info.LOG).strip()
        print(f"[netcl] {variant} {defines}: {log or '(no log: loaded from the binary cache)'}")
    return prg


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


def variant_chain(variant: str, dt: np.dtype, requested: dict[str, int]) -> list[dict[str, int]]:
    """Tile parameters to try for `variant`, best first: `requested`, then narrower vectors (cpu) or
    the per-class defaults and a small safe tile (tiled), then the last of these without -cl-mad-enable."""
    chain = [dict(requested)]
    if variant == "cpu":
        asked = requested["VN"]
        for lanes in (CPU_SAFE_VECTOR_BYTES // _acc_size(dt), 4):
            if lanes < asked or asked not in (4, 8, 16):
                chain.append({**requested, "VN": lanes})
    elif variant == "tiled":
        chain.append(default_params("tiled", dt))
        vw = 2 if dt == dtypes.float64 else 4
        chain.append({**default_params("tiled", dt), **{k: v for k, v in _SAFE_TILED.items()
                                                         if k in default_params("tiled", dt)}, "VW": vw})
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
    if variant == "cpu" and device.capabilities.kind == "cpu" and tile["VN"] * _acc_size(dt) > CPU_SAFE_VECTOR_BYTES:
        probe = ("netcl.ops.matmul:probe_variant", (variant, dt.name, tile))
        risky_key = f"gemm_cpu | {dt.name} {tile['VN']}-wide vectors, mad {tile.get('MAD_ENABLE', 1)} | {digest[:16]}"
    return Variant(f"gemm_{variant}", label, options, digest,
                   build=lambda: _program(device, variant, {"DTYPE": dt, **defines}).kernel(f"gemm_{variant}"),
                   probe=probe, probe_key=risky_key, payload=tile)


def usable_params(device: Any, variant: str, dtype: Any, params: dict[str, int] | None = None,
                  required: bool = True) -> dict[str, int] | None:
    """The tile parameters `variant` runs with on `device`: `params` (over the defaults) exactly as given,
    or else the tuned ones, or the first of their fallback chain (variant_chain) that this device
    builds (and, for risky ones, runs correctly in a probe). When none works: KernelBuildError, or
    None with required=False (the caller then takes the direct kernel)."""
    dt = np.dtype(dtype)
    requested = {**default_params(variant, dt), **params} if params is not None else tuned_params(device, variant, dt)
    if variant in ("direct", "dot"):
        return requested
    key = (id(device), variant, dt, tuple(sorted(requested.items())), params is None)
    if key in _usable:
        found = _usable[key]
        if found is None and required:
            raise KernelBuildError(f"no variant of gemm_{variant} works on {device.describe()} (see the "
                                   "warnings printed when it was tried)")
        return None if found is None else dict(found)
    chain = variant_chain(variant, dt, requested) if params is None else [requested]
    chain = [_fit_device(device, variant, dt, t) for t in chain]
    try:
        chosen, _ = first_usable(device, [_variant(device, variant, dt, t) for t in chain])
        found = chosen.payload
    except KernelBuildError:
        _usable[key] = None
        if required:
            raise
        return None
    _usable[key] = found
    return dict(found)


def probe_variant(device: Any, variant: str, dtype_name: str, tile: dict[str, int]) -> None:
    """Run GEMM `variant` with `tile` on small odd problems in every layout and epilogue it is compiled
    differently for, and raise AssertionError where a result is not NumPy's. The probe of a risky
    variant (netcl.core.variants runs it in a child process: a compiler crash ends only the child)."""
    dt = np.dtype(dtype_name)
    q = device.queue
    rng = np.random.default_rng(0)
    tol = {"float16": 2e-2, "float32": 2e-4, "float64": 1e-10}[dt.name]
    m, n, k = 133, 70, 600  # ragged row and column blocks, more than one k chunk for KC < 600

    def dev(a: np.ndarray) -> Tensor:
        return Tensor.from_host(q, a.astype(dt))

    def near(got: Tensor, want: np.ndarray, what: str) -> None:
        got_h = got.to_host().astype(np.float64)
        scale = max(1.0, float(np.abs(want).max()))
        err = float(np.abs(got_h - want).max())
        if not err <= tol * scale * np.sqrt(k):
            raise AssertionError(f"gemm_{variant} {dtype_name} {tile}: {what} is off by {err:.3g}")

    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    a64, b64 = a.astype(dt).astype(np.float64), b.astype(dt).astype(np.float64)
    bias, res = rng.standard_normal(n), rng.standard_normal((m, n))
    bias64, res64 = bias.astype(dt).astype(np.float64), res.astype(dt).astype(np.float64)
    run = functools.partial(gemm, variant=variant, params=tile)
    near(run(dev(a), dev(b)), a64 @ b64, "a @ b")
    near(run(dev(a), dev(b.T.copy()).transpose(0, 1)), a64 @ b64, "a @ b (b transposed in place)")
    near(run(dev(a.T.copy()).transpose(0, 1), dev(b)), a64 @ b64, "a @ b (a transposed in place)")
    wide = dev(np.repeat(b, 2, axis=1))[:, ::2]
    near(run(dev(a), wide), a64 @ b64, "a @ b (b strided)")
    near(run(dev(a), dev(b), dev(bias), "relu", dev(res), 0.5),
         np.maximum(0.5 * (a64 @ b64) + bias64, 0) + res64, "relu(0.5 a @ b + bias) + residual")
    near(run(dev(np.stack([a, a[::-1]])), dev(b)), np.stack([a64, a64[::-1]]) @ b64, "batched a @ b")
    if variant == "cpu":
        p = _prepare(dev(a), dev(b), None, None, None, 1.0)
        rowsum = Tensor.empty(q, (m,), dt)
        _launch(p, variant, tile, rowsum=rowsum)
        near(p.out, a64 @ b64, "a @ b with row sums")
        near(rowsum, a64.sum(axis=1), "row sums of a")
        p = _prepare(dev(a), dev(b), None, dev(res), None, 1.0)
        _launch(p, variant, tile, mask_residual=True)
        near(p.out, np.where(res64 > 0, a64 @ b64, 0), "a @ b masked by residual > 0")


# -- shapes and layouts -------------------------------------------------------------------------------
def _broadcast_batch(a_shape: tuple[int, ...], b_shape: tuple[int, ...], a_full: tuple, b_full: tuple) -> tuple:
    n = max(len(a_shape), len(b_shape))
    pa = (1,) * (n - len(a_shape)) + tuple(a_shape)
    pb = (1,) * (n - len(b_shape)) + tuple(b_shape)
    out = []
    for x, y in zip(pa, pb):
        if x != y and x != 1 and y != 1:
            raise ShapeError(
                f"matmul: batch dimensions of a {a_full} and b {b_full} do not broadcast "
                f"({a_shape} vs {b_shape})"
            )
        out.append(max(x, y) if min(x, y) != 0 else 0)
    return tuple(out)


def _batch_strides(t: Tensor, batch: tuple[int, ...]) -> list[int]:
    """Strides of t's leading (batch) dims aligned to `batch`, 0 where t broadcasts."""
    own_shape, own_strides = t.shape[:-2], t.strides[:-2]
    lead = len(batch) - len(own_shape)
    out = [0] * lead
    for size, stride in zip(own_shape, own_strides):
        out.append(0 if size == 1 else stride)
    return out


def _collapse(batch: tuple[int, ...], stride_sets: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 batch dims and merge neighbours that are contiguous in every operand."""
    shape: list[int] = []
    out: list[list[int]] = [[] for _ in stride_sets]
    for i, size in enumerate(batch):
        if size == 1:
            continue
        if shape and all(o[-1] == s[i] * size for o, s in zip(out, stride_sets)):
            shape[-1] *= size
            for o, s in zip(out, stride_sets):
                o[-1] = s[i]
        else:
            shape.append(size)
            for o, s in zip(out, stride_sets):
                o.append(s[i])
    return shape, out


def _matrix_strides(rows: int, cols: int, row_stride: int, col_stride: int) -> tuple[int, int]:
    """Canonical strides of a rows x cols matrix (strides of size-1 dims are free to choose)."""
    if cols == 1:
        col_stride = 1
    if rows == 1:
        row_stride = max(cols, 1) if col_stride == 1 else 1
    return row_stride, col_stride


def _tiled_layout(rows: int, cols: int, row_stride: int, col_stride: int) -> bool | None:
    """For the tiled kernel: False = row-major (cols contiguous), True = transposed, None = neither."""
    rs, cs = _matrix_strides(rows, cols, row_stride, col_stride)
    if cs == 1 and rs >= cols:
        return False
    if rs == 1 and cs >= rows:
        return True
    return None


@dataclass
class _Problem:
    a: Tensor
    b: Tensor
    out: Tensor
    bias: Tensor | None
    residual: Tensor | None
    activation: str | None  # the epilogue activation's name (kernels.ACTIVATIONS)
    alpha: float
    m: int
    n: int
    k: int
    batch: tuple[int, ...]
    squeeze: tuple[int, ...]  # axes of the result removed because an operand was 1-D
    bias_rows: bool = False  # the bias runs along M (one value per output row) instead of N


def _as_float_dtype(a: Tensor, b: Tensor, extra: Sequence[tuple[str, Tensor | None]]) -> np.dtype:
    if a.dtype != b.dtype:
        raise DTypeError(f"matmul: a is {a.dtype} and b is {b.dtype}; cast one so both match")
    if a.dtype not in _FLOAT_DTYPES:
        raise DTypeError(f"matmul supports float16, float32 and float64, got {a.dtype}; cast first")
    for name, t in extra:
        if t is not None and t.dtype != a.dtype:
            raise DTypeError(f"matmul: {name} is {t.dtype} but the operands are {a.dtype}")
    dtypes.check_supported_on(a.dtype, a.device)
    return a.dtype


def _prepare(
    a: Tensor, b: Tensor, bias: Tensor | None, residual: Tensor | None, activation: Any, alpha: float,
    bias_rows: bool = False,
) -> _Problem:
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise DTypeError(f"matmul takes netcl Tensors, got {type(a).__name__} and {type(b).__name__}")
    check_same_queue(*[t for t in (a, b, bias, residual) if t is not None])
    _as_float_dtype(a, b, [("bias", bias), ("residual", residual)])
    kernels.activation(activation)  # ValueError naming the choices
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"matmul needs operands of at least 1 dimension, got shapes {a.shape} and {b.shape}")
    a_full, b_full = a.shape, b.shape
    squeeze = []
    if a.ndim == 1:
        a = a.unsqueeze(0)
        squeeze.append(-2)
    if b.ndim == 1:
        b = b.unsqueeze(1)
        squeeze.append(-1)
    m, k = a.shape[-2:]
    k2, n = b.shape[-2:]
    if k != k2:
        raise ShapeError(
            f"matmul: inner dimensions differ: a has shape {a_full} (K={k}) and b has shape {b_full} (K={k2})"
        )
    batch = _broadcast_batch(a.shape[:-2], b.shape[:-2], a_full, b_full)
    out = Tensor.empty(a.queue, batch + (m, n), a.dtype)
    along = m if bias_rows else n
    if bias is not None and (bias.ndim != 1 or bias.shape[0] != along):
        raise ShapeError(f"bias must have shape ({along},) for an output of shape {out.shape}"
                         f"{' (a bias per row)' if bias_rows else ''}, got {bias.shape}")
    if residual is not None:
        try:
            residual = residual.expand(out.shape)
        except ShapeError:
            raise ShapeError(
                f"residual of shape {residual.shape} does not broadcast to the output shape {out.shape}"
            ) from None
    return _Problem(a, b, out, bias, residual, None if activation == "none" else activation, float(alpha), m, n, k, batch,
                    tuple(squeeze), bias_rows and bias is not None)


# -- launching ----------------------------------------------------------------------------------------
def _launch(
    p: _Problem, variant: str, params: dict[str, int] | None = None, splits: int | None = None,
    rowsum: Tensor | None = None, record: list | None = None, mask_residual: bool = False,
) -> None:
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
    n_inner_levels = len(inner_shape)
    pad = 2 - n_inner_levels
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
    tile = usable_params(device, variant, dt, params)
    defines.update(tile)
    if variant == "cpu" and b_ns == 1:
        defines["B_NCONTIG"] = None
    elif variant == "cpu" and b_ks == 1:
        defines["B_KCONTIG"] = None
    if variant == "cpu" and a_rs == 1 and a_ks != 1:
        defines["A_MCONTIG"] = None
    if rowsum is not None:
        defines["ROWSUM_A"] = None  # cpu variant only (see matmul_rowsum): row sums of A into `rowsum`
    if mask_residual:  # cpu variant only (see matmul_relu_mask): the residual slot holds a mask
        defines.pop("HAS_RESIDUAL", None)
        defines["MASK_RESIDUAL"] = None
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
    if variant == "tiled" and splits is None:
        splits = choose_splits(device, p, tile)
    if variant == "tiled":
        depth = p.k // splits if splits and splits > 1 and p.k % splits == 0 else p.k
        if inner and _all_inner(p.m, p.n, depth, tile):
            defines["ALL_INNER"] = None  # no edge tiles: the guarded scalar path is not compiled
        elif inner and edge_bk and edge_bk != tile["BK"]:
            # problems with edge tiles take the guarded kernel with its own k tile (BKE): on the H200
            # BK=8 runs 43 TFLOP/s edge-free (128 registers, 2 work-groups per SM) but 38 guarded
            tile = _fit_local_memory({**tile, "BK": edge_bk}, dt, device.capabilities.local_mem)
            defines.update({k: tile[k] for k in ("BK", "PADA", "PADB")})
    if splits and splits > 1:
        _launch_split_k(p, a, b, (a_rs, a_ks, b_ks, b_ns), defines, tile, splits,
                        record if a is p.a and b is p.b else None)
        return
    kernel = getattr(_program(device, variant, defines), f"gemm_{variant}")

    if variant == "dot":
        gsize, lsize = (p.n * tile["DOT_WG"], p.m, nbatch), (tile["DOT_WG"], 1, 1)
    elif variant == "direct":
        lx = min(64, 1 << max(0, (p.n - 1).bit_length()))
        ly = max(1, min(256 // lx, 1 << max(0, (p.m - 1).bit_length())))
        gsize, lsize = (p.n, p.m, nbatch), ((lx, ly, 1) if device.capabilities.kind != "cpu" else None)
    elif variant == "cpu":
        gsize = (-(-p.n // tile["NB"]), -(-p.m // tile["MB"]), nbatch)
        lsize = (1, 1, 1)
    else:
        gsize = (-(-p.n // tile["BN"]) * tile["TX"], -(-p.m // tile["BM"]) * tile["TY"], nbatch)
        lsize = (tile["TX"], tile["TY"], 1)

    acc_type = np.float64 if dt == dtypes.float64 else np.float32
    bias_t = p.bias if p.bias is not None else (rowsum if rowsum is not None else out)
    bias_stride = bias_t.strides[0] if (p.bias is not None or rowsum is not None) else 0
    res_t = res if res is not None else out
    i64 = np.int64
    for outer in np.ndindex(*outer_shape) if outer_shape else [()]:
        extra = [sum(i * s[j] for j, i in enumerate(outer)) for s in (a_bs, b_bs, c_bs, r_bs)]
        args = (
            np.int32(p.m), np.int32(p.n), np.int32(p.k),
            a.buffer, i64(a.offset + extra[0]), i64(a_rs), i64(a_ks),
            b.buffer, i64(b.offset + extra[1]), i64(b_ks), i64(b_ns),
            out.buffer, i64(out.offset + extra[2]), i64(out.strides[-2]),
            bias_t.buffer, i64(bias_t.offset), i64(bias_stride),
            res_t.buffer, i64(res_t.offset + (extra[3] if res is not None else 0)), i64(res_rs), i64(res_cs),
            acc_type(p.alpha), np.int32(nb_inner),
            _long4(a_in[0], a_in[1], b_in[0], b_in[1]),
            _long4(c_in[0], c_in[1], r_in[0], r_in[1]),
        )
        if record is not None and not outer_shape and a is p.a and b is p.b:
            record.append((kernel, gsize, lsize, list(args), _GEMM_PATCHES))  # in place: replayable
        kernel(queue, gsize, lsize, *args)


def _all_inner(m: int, n: int, k: int, tile: dict[str, int]) -> bool:
    """Whether every BM x BN x BK tile of an m x n x k problem lies wholly inside it."""
    return m % tile["BM"] == 0 and n % tile["BN"] == 0 and k % tile["BK"] == 0


@functools.lru_cache(maxsize=256)
def _long4(x: int, y: int, z: int, w: int) -> Any:
    """cltypes.make_long4, cached: it costs ~25 us a call (it evals a constructor) and the batch
    strides repeat from call to call. The returned array is only read (passed as a kernel arg)."""
    return cltypes.make_long4(x, y, z, w)


def _k_contiguous(p: _Problem) -> bool:
    _, a_ks = _matrix_strides(p.m, p.k, p.a.strides[-2], p.a.strides[-1])
    b_ks, _ = _matrix_strides(p.k, p.n, p.b.strides[-2], p.b.strides[-1])
    return a_ks == 1 and b_ks == 1


def choose_splits(device: Any, p: _Problem, tile: dict[str, int]) -> int:
    """How many slices of K a tiled GEMM runs side by side: more than 1 only when M x N alone gives
    too few work-groups to fill the device (skinny problems such as 256 x 4096 x 4096)."""
    if device.capabilities.kind == "cpu" or p.out.dtype == dtypes.float16 or math.prod(p.batch) != 1:
        return 1
    tiles = -(-p.m // tile["BM"]) * -(-p.n // tile["BN"])
    target = 2 * device.capabilities.compute_units
    if tiles * 10 >= target * 9:
        return 1
    best = 1
    for s in (2, 4, 8, 16):
        if p.k % s or p.k // s < 256:
            break
        best = s
        if tiles * s * 10 >= target * 9:
            break
    return best


def _launch_split_k(
    p: _Problem, a: Tensor, b: Tensor, strides: tuple[int, int, int, int], defines: dict[str, Any],
    tile: dict[str, int], splits: int, record: list | None = None,
) -> None:
    """Split-K: `splits` tiled GEMMs over K/splits slices (as a batch) into an accumulator-typed
    workspace, then one reduction launch that sums the slices and applies the epilogue. With
    `record`, both launches are appended (with the workspace's shape) for replay."""
    a_rs, a_ks, b_ks, b_ns = strides
    if p.k % splits:
        raise ShapeError(f"split-K needs K={p.k} divisible by {splits}")
    queue, device, out, dt = p.out.queue, p.out.device, p.out, p.out.dtype
    chunk = p.k // splits
    acc_dt = dtypes.float64 if dt == dtypes.float64 else dtypes.float32
    acc_type = acc_dt.type
    work = Tensor.empty(queue, (splits, p.m, p.n), acc_dt)
    gemm_defines = {k: v for k, v in defines.items() if k not in ("HAS_BIAS", "BIAS_ROWS", "HAS_RESIDUAL")}
    gemm_defines["ACT"] = None
    if (chunk * a_ks) % 4 or (chunk * b_ks) % 4:
        gemm_defines.pop("GVEC", None)  # slice starts must stay 4-aligned for the 4-wide loads
    if dt != acc_dt:
        raise DTypeError(f"split-K runs for float32/float64 only, got {dt}")
    gemm_defines["DTYPE"] = acc_dt  # partial sums are stored at accumulator precision
    kernel = _program(device, "tiled", gemm_defines).gemm_tiled
    i64 = np.int64
    gsize = (-(-p.n // tile["BN"]) * tile["TX"], -(-p.m // tile["BM"]) * tile["TY"], splits)
    lsize = (tile["TX"], tile["TY"], 1)
    args = (
        np.int32(p.m), np.int32(p.n), np.int32(chunk),
        a.buffer, i64(a.offset), i64(a_rs), i64(a_ks),
        b.buffer, i64(b.offset), i64(b_ks), i64(b_ns),
        work.buffer, i64(work.offset), i64(p.n),
        work.buffer, i64(0), i64(0), work.buffer, i64(0), i64(0), i64(0),
        acc_type(1.0), np.int32(splits),
        _long4(0, chunk * a_ks, 0, chunk * b_ks),
        _long4(0, p.m * p.n, 0, 0),
    )
    kernel(queue, gsize, lsize, *args)
    if record is not None:
        record.append((kernel, gsize, lsize, list(args), _SPLIT_GEMM_PATCHES, work.shape, acc_dt))
    reduce_defines = {k: v for k, v in defines.items() if k in ("HAS_BIAS", "BIAS_ROWS", "HAS_RESIDUAL", "ACT")}
    reduce_defines["DTYPE"] = dt
    reducer = _program(device, "direct", reduce_defines).gemm_reduce_splits
    bias_t = p.bias if p.bias is not None else out
    res = p.residual
    res_t = res if res is not None else out
    lx = min(64, 1 << max(0, (p.n - 1).bit_length()))
    gsize, lsize = (p.n, p.m, 1), (lx, max(1, min(256 // lx, 4)), 1) if device.capabilities.kind != "cpu" else None
    args = (
        np.int32(splits), np.int32(p.m), np.int32(p.n), work.buffer,
        out.buffer, i64(out.offset), i64(out.strides[-2]),
        bias_t.buffer, i64(bias_t.offset), i64(bias_t.strides[0] if p.bias is not None else 0),
        res_t.buffer, i64(res_t.offset), i64(res.strides[-2] if res is not None else 0),
        i64(res.strides[-1] if res is not None else 0),
        acc_type(p.alpha),
    )
    reducer(queue, gsize, lsize, *args)
    if record is not None:
        record.append((reducer, gsize, lsize, list(args), _SPLIT_REDUCE_PATCHES))


# CPU split-K. A skinny GEMM with a long K (a convolution's weight gradient: M = 16/32 output
# channels, N = C*KH*KW = 9..144, K = batch*OH*OW = 25k..100k) makes one or a few of the cpu kernel's
# MB x NB blocks, so one core works alone. Splitting K into S slices, run as a batch of S cpu GEMMs
# over strided views (no copies) into an accumulator-typed workspace, then summed (with the epilogue)
# by gemm_reduce_splits, fills both cores: (16, 9, 100352) 3.1 -> 1.9 ms, (32, 144, 25088) 5.9 ->
# 3.6 ms on the 2-core PoCL device (S = 16), and the shorter sums are more accurate.
CPU_SPLIT_MIN_K = 8192  # split only K at least this long ...
CPU_SPLIT_MAX_BLOCKS = 8  # ... when the unsplit launch has at most this many MB x NB blocks


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


def _launch_cpu_split_k(p: _Problem, splits: int) -> None:
    """C = epilogue(sum over s of A[:, slice s] @ B[slice s, :]) as one batched cpu GEMM + a reduction."""
    queue, device, out, dt = p.out.queue, p.out.device, p.out, p.out.dtype
    a, b = p.a, p.b
    a_rs, a_ks = _matrix_strides(p.m, p.k, a.strides[-2], a.strides[-1])
    b_ks, b_ns = _matrix_strides(p.k, p.n, b.strides[-2], b.strides[-1])
    chunk = p.k // splits
    av = a._view((splits, p.m, chunk), (chunk * a_ks, a_rs, a_ks), a.offset)  # K slices as a batch
    bv = b._view((splits, chunk, p.n), (chunk * b_ks, b_ks, b_ns), b.offset)
    work = gemm(av, bv, variant="cpu")  # (splits, m, n), contiguous, in the operands' dtype (f32/f64)
    defines: dict[str, Any] = {"DTYPE": dt, "ACT": p.activation}
    if p.bias is not None:
        defines["HAS_BIAS"] = None
        if p.bias_rows:
            defines["BIAS_ROWS"] = None
    if p.residual is not None:
        defines["HAS_RESIDUAL"] = None
    reducer = _program(device, "direct", defines).gemm_reduce_splits
    bias_t = p.bias if p.bias is not None else out
    res = p.residual
    res_t = res if res is not None else out
    i64 = np.int64
    reducer(
        queue, (p.n, p.m, 1), None,
        np.int32(splits), np.int32(p.m), np.int32(p.n), work.buffer,
        out.buffer, i64(out.offset), i64(out.strides[-2]),
        bias_t.buffer, i64(bias_t.offset), i64(bias_t.strides[0] if p.bias is not None else 0),
        res_t.buffer, i64(res_t.offset), i64(res.strides[-2] if res is not None else 0),
        i64(res.strides[-1] if res is not None else 0),
        dt.type(p.alpha),
    )


def _finish(p: _Problem) -> Tensor:
    out = p.out
    for axis in p.squeeze:
        out = out.squeeze(axis)
    return out


def gemm(
    a: Tensor,
    b: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
    residual: Tensor | None = None,
    alpha: float = 1.0,
    *,
    variant: str | None = None,
    params: dict[str, int] | None = None,
    splits: int | None = None,
    bias_rows: bool = False,
) -> Tensor:
    """matmul_epilogue with an explicit kernel `variant`, tile `params` and (tiled only) K `splits`
    (tests, tuning, benchmarks); None means netcl's own choice. bias_rows=True takes a bias of shape
    (M,), one value per output row (a convolution's bias in y = W @ cols), shared by every batch."""
    bias_rows = bias_rows and bias is not None
    fast = variant is None and params is None and splits is None
    if fast:
        key = _replay_key(a, b, bias, residual, activation, alpha, bias_rows)
        hit = _replays.get(key) if key is not None else None
        if hit is not None:
            return _replay(hit, a, b, bias, residual)
    if not bias_rows:  # folding the batch into rows would change which row a bias value belongs to
        folded = _fold_batch_into_rows(a, b, bias, activation, residual, alpha, variant, params, splits)
        if folded is not None:
            return folded
    p = _prepare(a, b, bias, residual, activation, alpha, bias_rows)
    if p.out.size == 0:
        return _finish(p)
    if (variant in (None, "cpu") and params is None and splits is None
            and (cpu_splits := choose_cpu_splits(p, variant or _auto_variant(p)))):
        _launch_cpu_split_k(p, cpu_splits)
        return _finish(p)
    if fast and key is not None and not p.squeeze:
        record: list = []
        _launch(p, _auto_variant(p), None, None, record=record)
        _remember_replay(key, record, p)
        return _finish(p)
    if variant is None:
        variant = _auto_variant(p)  # the one place netcl picks a kernel (the replay path uses it too)
    elif variant not in VARIANTS:
        raise ValueError(f"unknown GEMM variant {variant!r}; one of {VARIANTS}")
    if p.k == 0 and variant == "tiled":
        variant = "direct"
    if splits is not None and splits > 1 and (variant != "tiled" or math.prod(p.batch) != 1):
        raise ValueError("split-K is for the tiled variant on unbatched problems")
    _launch(p, variant, params, splits)
    return _finish(p)


# -- replay of repeated launches ---------------------------------------------------------------------
# A training step calls gemm with the same shapes, strides and epilogue every step. The first call
# goes through _prepare/_launch (variant choice, tuning lookup, program, sizes); when that ended in a
# single in-place launch, the kernel and its sizes are remembered under the problem's signature, and
# later calls only allocate the output and enqueue (~0.1 ms less host time per call on PoCL). The
# signature holds everything the choice depended on: shapes, strides, dtype, epilogue, offsets mod 16
# (aligned-load variants), the device and the tuning database's state.
_replays: dict[tuple, tuple] = {}


def _auto_variant(p: _Problem) -> str:
    variant = choose_variant(p.out.device, p.m, p.n, p.k)
    if variant == "direct" and p.out.device.capabilities.kind != "cpu" and p.k >= 256 and _k_contiguous(p):
        variant = "dot"  # GPU, thin, both operands contiguous along K: coalesce along K instead
    if p.k == 0 and variant == "tiled":
        variant = "direct"
    if variant in ("cpu", "tiled") and usable_params(p.out.device, variant, p.out.dtype, required=False) is None:
        variant = "direct"  # no variant of the blocked kernel builds here (each rejection was warned)
    return variant


def _replay_key(a: Any, b: Any, bias: Any, residual: Any, activation: Any, alpha: float,
                bias_rows: bool = False) -> tuple | None:
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or a.ndim < 2 or b.ndim < 2:
        return None
    if a.queue is not b.queue or a.dtype != b.dtype or (
        activation not in ACTIVATIONS and activation not in ("rowsum", "relumask")
    ):
        return None
    extra: list[Any] = []
    for t in (bias, residual):
        if t is None:
            extra.append(None)
        elif not isinstance(t, Tensor) or t.queue is not a.queue or t.dtype != a.dtype:
            return None
        else:
            extra.append((t.shape, t.strides, t.offset % 16))
    db = _database(a.device)
    return (
        id(a.queue), a.dtype, a.shape, a.strides, a.offset % 16, b.shape, b.strides, b.offset % 16,
        *extra, activation, float(alpha), bias_rows, id(db), getattr(db, "_mtime", None),
    )


# Which arguments of a recorded launch change from call to call: (index, tensor role, offset?). The
# roles: the operands a and b, the fresh output, the split-K workspace, the bias slot (bias, or the
# row-sum output, or the output itself as a placeholder) and the residual slot (residual or output).
_GEMM_PATCHES = ((3, "a", 0), (4, "a", 1), (7, "b", 0), (8, "b", 1), (11, "out", 0), (12, "out", 1),
                 (14, "bias", 0), (15, "bias", 1), (17, "res", 0), (18, "res", 1))
_SPLIT_GEMM_PATCHES = ((3, "a", 0), (4, "a", 1), (7, "b", 0), (8, "b", 1), (11, "work", 0), (14, "work", 0),
                       (17, "work", 0))
_SPLIT_REDUCE_PATCHES = ((3, "work", 0), (4, "out", 0), (5, "out", 1), (7, "bias", 0), (8, "bias", 1),
                         (10, "res", 0), (11, "res", 1))


def _remember_replay(key: tuple | None, record: list, p: _Problem) -> None:
    """Keep a call's launches for replay when they were all recorded: one in-place GEMM, or split-K's
    GEMM + reduction (an operand copy or a batch loop records nothing, or not everything)."""
    if key is None or not record or len(record) > 2 or (len(record) == 2 and len(record[0]) != 7):
        return
    work = record[0][5:7] if len(record[0]) == 7 else None
    if len(_replays) < 4096:
        _replays[key] = (tuple(r[:5] for r in record), p.out.shape, work)


def _replay(
    hit: tuple, a: Tensor, b: Tensor, bias: Tensor | None, residual: Tensor | None, rowsum: Tensor | None = None
) -> Tensor:
    launches, out_shape, work_spec = hit
    out = Tensor.empty(a.queue, out_shape, a.dtype)
    roles = {
        "a": a, "b": b, "out": out,
        "work": Tensor.empty(a.queue, *work_spec) if work_spec is not None else None,
        "bias": bias if bias is not None else (rowsum if rowsum is not None else out),
        "res": residual if residual is not None else out,
    }
    i64 = np.int64
    for kernel, gsize, lsize, template, patches in launches:
        args = list(template)  # the stored list stays the template (launches may come from several threads)
        for i, role, offset in patches:
            t = roles[role]
            args[i] = i64(t.offset) if offset else t.buffer
        kernel(a.queue, gsize, lsize, *args)
    return out


def _fold_batch_into_rows(a, b, bias, activation, residual, alpha, variant, params, splits) -> Tensor | None:
    """(..., M, K) @ (K, N) with a's batch dims laid out like rows is one (prod(...)*M, K) GEMM: one
    launch with big tiles instead of a batch of thin ones (linear layers on (batch, tokens, features))."""
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or b.ndim != 2 or a.ndim <= 2:
        return None
    if a.shape[-1] != b.shape[0] or a.size == 0 or b.size == 0:
        return None  # the general path reports the error (naming the shapes given) or handles it
    try:
        rows = a.view(-1, a.shape[-1])
        out_shape = a.shape[:-1] + (b.shape[1],)
        res_rows = None if residual is None else residual.expand(out_shape).view(-1, b.shape[1])
    except ShapeError:
        return None  # batch strides that do not merge into rows (or a broadcast residual): batched path
    out = gemm(rows, b, bias, activation, res_rows, alpha, variant=variant, params=params, splits=splits)
    return out.view(out_shape)


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b for (..., M, K) and (..., K, N) (1-D operands as in NumPy), batch dims broadcast.

    Transposed or sliced views are read in place. float16 (float32 accumulation), float32, float64.
    """
    return gemm(a, b)


def matmul_rowsum(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor | None]:
    """(a @ b, row sums of a) for 2-D a (M, K) and b (K, N), in one launch where the CPU kernel runs
    (a linear layer's weight and bias gradients: a = g^T). Returns (a @ b, None) when the problem
    takes another kernel (GPU, tiny shapes); the caller then sums a's rows itself."""
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or a.ndim != 2 or b.ndim != 2:
        return matmul(a, b), None
    if a.device.capabilities.kind != "cpu" or choose_variant(a.device, a.shape[0], b.shape[1], a.shape[1]) != "cpu":
        return gemm(a, b), None
    key = _replay_key(a, b, None, None, "rowsum", 1.0)
    hit = _replays.get(key) if key is not None else None
    if hit is not None:
        rowsum = Tensor.empty(a.queue, (a.shape[0],), a.dtype)
        return _replay(hit, a, b, None, None, rowsum), rowsum
    p = _prepare(a, b, None, None, None, 1.0)
    if p.out.size == 0:
        return _finish(p), None
    rowsum = Tensor.empty(p.out.queue, (p.m,), p.out.dtype)
    record: list = []
    _launch(p, "cpu", rowsum=rowsum, record=record)
    if key is not None:
        _remember_replay(key, record, p)
    return _finish(p), rowsum


def matmul_relu_mask(a: Tensor, b: Tensor, mask: Tensor) -> tuple[Tensor, bool]:
    """where(mask > 0, a @ b, 0) for 2-D a, b and mask shaped like the product (a ReLU's backward
    folded into the GEMM that makes the incoming gradient), in one launch where the CPU kernel runs.
    Returns (result, True), or (a @ b, False) when the problem takes another kernel: the caller then
    applies the mask itself."""
    if (
        not (isinstance(a, Tensor) and isinstance(b, Tensor) and isinstance(mask, Tensor))
        or a.ndim != 2 or b.ndim != 2 or mask.shape != (a.shape[0], b.shape[1])
        or a.device.capabilities.kind != "cpu"
        or choose_variant(a.device, a.shape[0], b.shape[1], a.shape[1]) != "cpu"
    ):
        return gemm(a, b), False
    key = _replay_key(a, b, None, mask, "relumask", 1.0)
    hit = _replays.get(key) if key is not None else None
    if hit is not None:
        return _replay(hit, a, b, None, mask), True
    p = _prepare(a, b, None, mask, None, 1.0)
    if p.out.size == 0:
        return _finish(p), True
    record: list = []
    _launch(p, "cpu", record=record, mask_residual=True)
    if key is not None:
        _remember_replay(key, record, p)
    return _finish(p), True


def matmul_epilogue(
    a: Tensor,
    b: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
    residual: Tensor | None = None,
    alpha: float = 1.0,
) -> Tensor:
    """activation(alpha * (a @ b) + bias) + residual in one launch.

    bias has shape (N,) (added per column); activation is None, 'relu', 'gelu', 'gelu_tanh' or
    'silu'; residual broadcasts to the output shape and is added after the activation.
    """
    return gemm(a, b, bias, activation, residual, alpha)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str | None = None) -> Tensor:
    """x @ weight.T + bias (then activation), weight shaped (out_features, in_features) like PyTorch.

    The weight is read transposed in place (no copy). x is (..., in_features).
    """
    if not isinstance(weight, Tensor) or weight.ndim != 2:
        shape = getattr(weight, "shape", None)
        raise ShapeError(f"linear: weight must be 2-D (out_features, in_features), got shape {shape}")
    if not isinstance(x, Tensor) or x.ndim < 1 or x.shape[-1] != weight.shape[1]:
        raise ShapeError(
            f"linear: x of shape {getattr(x, 'shape', None)} does not end in in_features={weight.shape[1]} "
            f"of weight {weight.shape}"
        )
    return gemm(x, weight.transpose(0, 1), bias, activation)


def flops(m: int, n: int, k: int, batch: int = 1) -> float:
    """Floating-point operations of a GEMM (multiply and add counted separately)."""
    return 2.0 * m * n * k * batch


__all__ = [
    "ACTIVATIONS",
    "DEFAULTS",
    "VARIANTS",
    "choose_variant",
    "default_params",
    "flops",
    "gemm",
    "linear",
    "matmul",
    "matmul_epilogue",
    "tuned_params",
    "usable_params",
]
