"""k-means launches (kernels/kmeans*.cl): the fused assignment (distances and arg-min in one kernel, no
n x k buffer), the update step's per-cluster sums (partial sums per row segment, no atomics), the
finalize steps of Lloyd and mini-batch k-means, k-means++ seeding on the device, and row gathers.
netcl.cluster drives them; the algorithms' host-side rules (stopping, empty clusters) live there.

A `KMeansPlan` fixes, for one problem (queue, dtype, rows n of the data set, features d, clusters k),
the kernel variant ("cpu": work-items of one, register blocks of explicit vectors, for PoCL and other
CPU drivers; "gpu": local-memory tiles; "mma": the "gpu" kernels with the assignment on NVIDIA's matrix
units, for float16 / bfloat16 rows: kmeans_mma.cl), the tile parameters and the row segments of the update
step.
Every launch takes a block of rows `x` (contiguous, rows x d) and `row0`, the data-set index of its
first row, so a data set streamed from the host in chunks runs the very same kernels as one held on
the device, and (segments and k-means++ blocks being defined by data-set row numbers) gives the same
bits. All kernels work on data centred by `shift` (netcl.cluster's Data.mean; see kmeans_common.cl).

Half data (float16, bfloat16) is read as it is stored (`KMeansPlan.xdtype`) and computed in float32: the
plan's `dtype`, that of the centers, shift, distances, weights and every sum, is then float32.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from netcl import kernels
from netcl.core import dtypes
from netcl.core.tensor import Tensor, check_same_queue
from netcl.core.variants import Variant, first_usable, source_digest
from netcl.errors import DeviceMismatchError, DTypeError, KernelBuildError, ShapeError
from netcl.ops.gemm import variants as gemm_variants

__all__ = [
    "KMeansPlan",
    "PackedCenters",
    "Partials",
    "kmeans_assign",
    "kmeans_copy_rows",
    "kmeans_finalize",
    "kmeans_label_distance",
    "kmeans_minibatch_finalize",
    "kmeans_pack",
    "kmeans_packed",
    "kmeans_partials",
    "kmeans_plan",
    "kmeans_pp_pick",
    "kmeans_pp_potential",
    "kmeans_pp_search",
    "kmeans_pp_update",
    "kmeans_update",
    "pp_trials",
]

VARIANTS = ("cpu", "gpu", "mma")
PP_BLOCK = 256  # rows per k-means++ block (BLK): streamed chunks start at multiples of it
PARTIALS_BUDGET = 64 << 20  # bytes of update partial sums a GPU plan may hold
MIN_SEGMENT_ROWS = 2048  # rows per GPU update segment at least: the partial sums stay far below the data
CPU_STAGE_BYTES = 16 << 10  # bytes of rows a CPU assignment work-item stages (half a typical L1)


def pp_trials(n_clusters: int) -> int:
    """Candidates per k-means++ center: 2 + log(k), scikit-learn's (and Arthur and Vassilvitskii's) choice."""
    return 2 + int(np.log(n_clusters))


@dataclass(frozen=True)
class KMeansPlan:
    """Kernel choice and parameters of one k-means problem (see the module docstring)."""

    queue: Any
    dtype: np.dtype  # arithmetic, centers, shift, distances, weights, sums: float32 or float64
    xdtype: np.dtype  # the rows x as stored: dtype, or float16 / bfloat16 (computed in float32)
    n: int
    d: int
    k: int
    variant: str
    kpad: int  # centers padded to the assignment's tile (+inf norms: never chosen)
    dpad: int  # features padded to the GPU assignment's k tile (mma: to 8, 16-byte rows of packed centers)
    rows_per_group: int  # rows one assignment work-group owns
    defines: dict[str, Any] = field(hash=False)  # kmeans_cpu.cl or kmeans_gpu.cl: pack, assign, update
    shared_defines: dict[str, Any] = field(hash=False)  # kmeans.cl: finalize, rows
    pp_defines: dict[str, Any] = field(hash=False)  # kmeans.cl: k-means++ (WG divides PP_BLOCK)
    seg: int  # rows per update segment
    nseg: int  # segments
    nkc: int  # cluster blocks of a GPU update work-group (1 on CPUs)
    nfc: int  # feature blocks of a GPU update work-group (1 on CPUs)
    update_wg: int
    finalize_wg: int
    pp_wg: int
    mma: dict[str, Any] = field(default_factory=dict, hash=False)  # kmeans_mma.cl ("mma" variant)

    @property
    def device(self) -> Any:
        return self.queue.device

    @property
    def file(self) -> str:
        return "kmeans_cpu.cl" if self.variant == "cpu" else "kmeans_gpu.cl"

    @property
    def x_defines(self) -> dict[str, Any]:
        """The defines of x's storage (kmeans_common.cl): X_HALF, X_BF16, or none when x is `dtype`."""
        return x_defines(self.xdtype)

    def program(self, filename: str, defines: dict[str, Any], **extra: Any) -> Any:
        extra = {**self.x_defines, **extra}
        if filename not in ("kmeans_gpu.cl", "kmeans_mma.cl"):
            return kernels.program(self.device, filename, dtype=self.dtype, **defines, **extra)
        # the GEMM's block, built as the GEMM builds it (mad contraction; NVIDIA's register log on request)
        options = ("-cl-mad-enable", *gemm_variants.verbose_options(self.device))
        prg = kernels.program(self.device, filename, dtype=self.dtype, options=options, **defines, **extra)
        gemm_variants.print_build_log(self.device, prg, filename, defines)
        return prg


HALF_DTYPES = (dtypes.float16, dtypes.bfloat16)


def x_defines(xdtype: np.dtype) -> dict[str, Any]:
    """kmeans_common.cl's defines for rows stored as `xdtype`."""
    if xdtype == dtypes.float16:
        return {"X_HALF": None}
    if xdtype == dtypes.bfloat16:
        return {"X_BF16": None}
    return {}


def compute_dtype(dtype: Any) -> np.dtype:
    """The dtype k-means computes data of `dtype` in (centers, distances, sums): float32 for half data."""
    dt = np.dtype(dtype)
    return dtypes.float32 if dt in HALF_DTYPES else dt


def _pow2_at_most(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


# kmeans_gpu.cl's assignment tile: gemm_tiled.cl's knobs (see its header), values the GEMM's (assign_tile)
ASSIGN_TILE_KNOBS = ("BM", "BN", "BK", "TX", "TY", "VW", "PADA", "PADB", "WX", "GVEC")


def kmeans_plan(queue: Any, dtype: Any, n_rows: int, n_features: int, n_clusters: int,
                variant: str | None = None, assign_tiles: dict[str, int] | None = None) -> KMeansPlan:
    """The plan for clustering n_rows x n_features data of `dtype` (float32, float64, or float16 / bfloat16
    rows computed in float32) into n_clusters on `queue`'s device.
    `variant` ("cpu", "gpu" or "mma") overrides the choice by device type and dtype (tests run them all on one
    device; by default "mma" where half rows meet matrix units that take them); `assign_tiles` overrides some
    of the assignment's tile knobs (ASSIGN_TILE_KNOBS: the tiled GEMM's; MMA_TILE_KNOBS for "mma": the
    matrix-unit GEMM's, EMULATE=1 its emulation on any device; bench sweeps, tests)."""
    xdt = np.dtype(dtype)
    if xdt not in (dtypes.float32, dtypes.float64, *HALF_DTYPES):
        raise DTypeError(f"k-means takes float32, float64, float16 or bfloat16 data, got {xdt}")
    dtypes.check_supported_on(xdt, queue.device)
    dt = compute_dtype(xdt)
    n, d, k = int(n_rows), int(n_features), int(n_clusters)
    if n < 1 or d < 1 or k < 1:
        raise ShapeError(f"k-means needs at least one row, feature and cluster, got n={n}, d={d}, k={k}")
    caps = queue.device.capabilities
    auto_mma = variant is None and not assign_tiles and takes_mma(queue.device, xdt) \
        and (id(queue.device), xdt) not in _mma_unbuildable  # (matrix units: never a CPU device)
    if variant is None:
        variant = "mma" if auto_mma else "cpu" if caps.kind == "cpu" else "gpu"
    if variant not in VARIANTS:
        raise ValueError(f"k-means variant must be one of {VARIANTS}, got {variant!r}")
    if variant == "mma" and xdt not in HALF_DTYPES:
        raise DTypeError(f"the 'mma' k-means variant takes float16 or bfloat16 rows, got {xdt}; use 'gpu'")
    size = dt.itemsize
    vec = 32 // size  # widest vector netcl passes through OpenCL library calls (float8, double4)
    max_wg = caps.max_work_group_size
    if assign_tiles and variant == "cpu":
        raise ValueError(f"assign_tiles are knobs of the 'gpu' and 'mma' variants, got {assign_tiles} for "
                         f"{variant!r}")
    mma: dict[str, Any] = {}
    if variant == "cpu":
        vn, rm, pb = cpu_lanes(queue.device, dt), 4, 2
        kpad = -(-k // (vn * pb)) * vn * pb
        # rows per work-item: as many as keep their staged copy within L1-sized scratch (at least RM)
        mb = max(rm, min(64, (CPU_STAGE_BYTES // (d * size)) // rm * rm))
        scratch = mb * d * size + mb * vn * 2 * size
        if scratch > caps.local_mem:
            raise ShapeError(
                f"k-means on {queue.device.describe()}: rows of {d} features need {scratch} bytes of "
                f"local scratch, more than the device's {caps.local_mem}; reduce the features "
                "(e.g. PCA) first"
            )
        variant_defines = dict(VN=vn, RM=rm, PB=pb, MB=mb, DSTAGE=d, VF=vec)
        rows_per_group = mb
        nseg = max(1, min(4 * caps.compute_units, -(-n // 256)))
        nkc = nfc = 1
        update_wg = finalize_wg = pp_wg = 1
        dpad = d
    else:
        tiles = assign_tile(queue.device, dt, k, (assign_tiles or {}) if variant == "gpu" else {})
        bn = tiles["BN"]
        kpad = -(-k // bn) * bn
        dpad = -(-d // tiles["BK"]) * tiles["BK"]
        variant_defines = {name: tiles[name] for name in ASSIGN_TILE_KNOBS if name != "GVEC"}
        variant_defines["NKT"] = dpad // tiles["BK"]
        if tiles["GVEC"] and d % 4 == 0:
            variant_defines["GVEC"] = None  # 4-wide fetches (dropped per launch for rows off 16 bytes)
            if d % tiles["BK"] == 0:
                variant_defines["ALL_INNER"] = None  # every k tile whole: no guarded fetch compiled
        rows_per_group = tiles["BM"]
        update_wg = min(32 if d <= 32 else 64, _pow2_at_most(max_wg))
        local_budget = min(caps.local_mem, 48 << 10) - (4 << 10)
        kc = max(1, min(k, local_budget // ((update_wg + 1) * size)))
        nkc, nfc = -(-k // kc), -(-d // update_wg)
        want = -(-8 * caps.compute_units // (nkc * nfc))
        cap = max(1, PARTIALS_BUDGET // (k * d * size))
        nseg = max(1, min(want, cap, -(-n // MIN_SEGMENT_ROWS)))
        variant_defines.update(WGU=update_wg, KC=kc)
        finalize_wg = min(64, _pow2_at_most(max_wg))
        pp_wg = min(PP_BLOCK, _pow2_at_most(max_wg))
        if variant == "mma":
            tile = mma_tile(queue.device, xdt, d, k, assign_tiles or {})
            kpad = -(-k // tile["BN"]) * tile["BN"]
            dpad = -(-d // 8) * 8  # packed center rows on 16 bytes (cp.async)
            rows_per_group = tile["BM"]
            mma = {name: tile[name] for name in ("BM", "BN", "BK", "WM", "WN", "PAD", "PADB", "STAGES")}
            mma["NKT"] = -(-d // tile["BK"])
            for knob, define in (("ASYNC", "ASYNC"), ("LDMATRIX", "LDMATRIX"), ("EMULATE", "MMA_EMULATE")):
                if tile[knob]:
                    mma[define] = None
    seg = -(-n // nseg)
    nseg = -(-n // seg)
    vf = vec if variant == "cpu" else max(1, vec // 2)
    shared = dict(WG=finalize_wg, VF=vf, BLK=PP_BLOCK)
    pp = dict(WG=pp_wg, VF=vf, BLK=PP_BLOCK)
    plan = KMeansPlan(queue, dt, xdt, n, d, k, variant, kpad, dpad, rows_per_group, variant_defines, shared,
                      pp, seg, nseg, nkc, nfc, update_wg, finalize_wg, pp_wg, mma)
    if auto_mma:  # a driver that rejects the matrix-unit kernel's PTX: the tiled assignment, warned once
        try:
            plan.program("kmeans_mma.cl", plan.mma)
        except KernelBuildError as exc:
            _mma_unbuildable.add((id(queue.device), xdt))
            warnings.warn(f"kmeans_mma.cl does not build on {queue.device.describe()} for {xdt} rows "
                          f"({exc}); k-means assigns them with the tiled kernel", RuntimeWarning,
                          stacklevel=2)
            return kmeans_plan(queue, dtype, n, d, k, "gpu", assign_tiles)
    return plan


_mma_unbuildable: set[tuple[int, np.dtype]] = set()  # (device, rows' dtype) whose matrix-unit build failed


# -- the CPU assignment's vector width --------------------------------------------------------------------
# 16 float lanes (64-byte vectors, plain arithmetic as gemm_cpu.cl's VN=16) measured 1.3x the 8-lane kernel on
# an AVX-512 EPYC under PoCL (bench/NOTES.md, k-means). 512-bit vectors are the construct PoCL 3.0 on Zen 4
# can crash on (netcl.ops.gemm.variants), so the wide kernel runs first in a child process
# (netcl.core.variants, probe_wide_assign) and the 8-lane one is what a device that fails it gets.
_lanes: dict[tuple, int] = {}


def cpu_lanes(device: Any, dt: np.dtype) -> int:
    """Centers per vector of kmeans_cpu.cl's assignment on `device` (VN): 16 for float32 on CPUs whose
    preferred float vector is 16 wide and whose compiler passes the probe, else 32 bytes' worth."""
    safe = 32 // dt.itemsize
    if dt != dtypes.float32 or device.capabilities.kind != "cpu" or \
            device.capabilities.preferred_vector_width.get("float", 0) < 16:
        return safe
    key = (id(device), dt)
    lanes = _lanes.get(key)
    if lanes is None:
        digest = source_digest(kernels.source("kmeans_cpu.cl"))

        def variant(vn: int) -> Variant:
            wide = vn * dt.itemsize > 32
            return Variant(
                "kmeans_assign_cpu",
                f"{dt.name} VN={vn}",
                (f"-DVN={vn}",),
                digest,
                build=lambda: (
                    kernels.program(
                        device, "kmeans_cpu.cl", dtype=dt, VN=vn, RM=4, PB=2, MB=8, DSTAGE=3, VF=safe
                    ).kmeans_assign_cpu
                ),
                probe=("netcl.ops.kmeans:probe_wide_assign", (dt.name,)) if wide else None,
                probe_key=f"kmeans_assign_cpu | {dt.name} {vn}-wide vectors | {digest[:16]}"
                if wide
                else None,
                payload=vn,
            )

        chosen, _ = first_usable(device, [variant(16), variant(safe)])
        lanes = _lanes[key] = chosen.payload
    return lanes


def probe_wide_assign(device: Any, dtype_name: str) -> None:
    """The probe of the 16-lane CPU assignment (run in a child process by netcl.core.variants, where
    cpu_lanes builds it without probing): assignments of ragged problems against NumPy."""
    dt = np.dtype(dtype_name)
    q = device.queue
    rng = np.random.default_rng(0)
    for n, d, k in ((37, 3, 5), (300, 13, 70), (130, 70, 33)):
        x, c = rng.standard_normal((n, d)).astype(dt), rng.standard_normal((k, d)).astype(dt)
        plan = kmeans_plan(q, dt, n, d, k, "cpu")
        centers = Tensor.from_host(q, c)
        labels, dist = Tensor.empty(q, (n,), np.int32), Tensor.empty(q, (n,), dt)
        kmeans_assign(plan, Tensor.from_host(q, x), 0, Tensor.zeros(q, (d,), dt), kmeans_pack(plan, centers),
                      centers, labels, dist)
        d2 = ((x[:, None, :].astype(np.float64) - c[None]) ** 2).sum(-1)
        got = labels.to_host()
        chosen = d2[np.arange(n), got]
        if not (chosen <= d2.min(axis=1) * (1 + 1e-4) + 1e-4).all():
            raise AssertionError(f"kmeans_assign_cpu VN={plan.defines['VN']} {dtype_name} n={n} d={d} k={k}: "
                                 "a row took a center that is not its nearest")
        if not np.allclose(dist.to_host(), chosen, rtol=1e-4, atol=1e-4):
            raise AssertionError(f"kmeans_assign_cpu VN={plan.defines['VN']} {dtype_name}: distances are off")


def assign_tile(device: Any, dt: np.dtype, k: int, overrides: dict[str, int]) -> dict[str, int]:
    """The GPU assignment's tile (ASSIGN_TILE_KNOBS) for k clusters on `device`: the tiled GEMM's tile
    for the device and dtype (netcl.ops.gemm.variants.tuned_params: `netcl tune`'s, else the defaults of the
    device's class), then `overrides`; the center block halved (unless given) while k fits in half of it (a
    few clusters need not pay for 128 padded ones), BK halved (unless given) while the local memory the
    kernel needs exceeds the device's. Checked as gemm_tiled.cl checks it."""
    for name, value in overrides.items():
        if name not in ASSIGN_TILE_KNOBS:
            raise ValueError(f"unknown k-means assignment tile knob {name!r}; knobs: {ASSIGN_TILE_KNOBS}")
        if not isinstance(value, (int, np.integer)) or value < (0 if name in ("PADA", "PADB", "WX", "GVEC")
                                                                 else 1):
            raise ValueError(f"k-means assignment tile knob {name} must be a positive int, got {value!r}")
    gemm = gemm_variants.tuned_params(device, "tiled", dt)
    tile = {name: int(gemm.get(name, 0)) for name in ASSIGN_TILE_KNOBS}
    max_wg = device.capabilities.max_work_group_size
    if tile["TX"] * tile["TY"] > max_wg and not {"TX", "TY", "BM", "BN"} & overrides.keys():
        tile.update(TX=8, TY=8, BM=64, BN=64)  # devices of smaller work-groups: 64 x 64 blocks of 8 x 8
    tile.update({name: int(value) for name, value in overrides.items()})
    if "BN" not in overrides:
        while k <= tile["BN"] // 2 and (tile["BN"] // 2) % (tile["TX"] * tile["VW"]) == 0:
            tile["BN"] //= 2
    bm, bn, tx, ty, vw, wx = (tile[name] for name in ("BM", "BN", "TX", "TY", "VW", "WX"))
    if tx * ty > max_wg:
        raise ValueError(f"k-means assignment tile {tile} needs work-groups of {tx * ty}, more than the "
                         f"device's {max_wg}")
    if vw not in (1, 2, 4, 8) or bm % (ty * vw) or bn % (tx * vw) or tile["PADA"] % vw or tile["PADB"] % vw:
        raise ValueError(f"k-means assignment tile {tile}: VW must be 1, 2, 4 or 8, BM a multiple of TY*VW, "
                         "BN of TX*VW, PADA and PADB multiples of VW")

    def local_bytes() -> int:  # the double-buffered tiles, or the fold's values and indices in their place
        return max(2 * tile["BK"] * (bm + tile["PADA"] + bn + tile["PADB"]) * size, bm * tx * (size + 4)) + 4

    size = np.dtype(dt).itemsize
    while local_bytes() > device.capabilities.local_mem and "BK" not in overrides and tile["BK"] > 4:
        tile["BK"] //= 2  # the GEMM's tile, thinner where local memory is short (float64 on 32 KB)
    local = local_bytes()
    if local > device.capabilities.local_mem:
        raise ValueError(f"k-means assignment tile {tile} needs {local} bytes of local memory, more than the "
                         f"device's {device.capabilities.local_mem}; use a smaller BM, BN or BK")
    if wx and wx != tx and ((tx * ty) % 32 or tx % wx or 32 % wx or ty % (32 // wx)):
        raise ValueError(f"k-means assignment tile {tile}: WX must divide TX and 32, and 32/WX must divide "
                         "TY")
    return tile


# kmeans_mma.cl's tile: gemm_mma.cl's knobs (values the matrix-unit GEMM's, mma_tile), EMULATE its emulation
MMA_TILE_KNOBS = ("BM", "BN", "BK", "WM", "WN", "PAD", "PADB", "STAGES", "ASYNC", "LDMATRIX", "EMULATE")
# over the GEMM's tile: 8 warps of 64 x 32 (the GEMM's 4 of 64 x 64 hold 230-238 registers a thread on the
# H200 without the fold's 2 * MT running minima and indices; 8 warps of 64 x 32 hold 124-128)
MMA_ASSIGN_TILE = {"WM": 64, "WN": 32}


def takes_mma(device: Any, xdtype: Any) -> bool:
    """Whether the assignment of rows of `xdtype` runs on `device`'s matrix units by default: float16 or
    bfloat16 rows where netcl drives matrix units that take them (netcl.ops.gemm.variants.matrix_units)."""
    dt = np.dtype(xdtype)
    return dt in HALF_DTYPES and dt.name in gemm_variants.matrix_units(device)


def mma_tile(device: Any, xdt: np.dtype, d: int, k: int, overrides: dict[str, int]) -> dict[str, int]:
    """The matrix-unit assignment's tile (MMA_TILE_KNOBS) for d features and k clusters of `xdt` rows: the
    matrix-unit GEMM's (variants.tuned_params "mma") with MMA_ASSIGN_TILE, then `overrides`; the center
    block halved (unless given) while k fits in half of it, the k tile halved (unless given) while d fits in
    half of it. Without EMULATE the device must have matrix units for `xdt` (ValueError otherwise)."""
    for name, value in overrides.items():
        if name not in MMA_TILE_KNOBS:
            raise ValueError(f"unknown k-means matrix-unit tile knob {name!r}; knobs: {MMA_TILE_KNOBS}")
        if not isinstance(value, (int, np.integer)) or value < (0 if name in (
                "PAD", "PADB", "ASYNC", "LDMATRIX", "EMULATE") else 1):
            raise ValueError(f"k-means matrix-unit tile knob {name} must be a positive int, got {value!r}")
    gemm = gemm_variants.tuned_params(device, "mma", xdt)
    tile = {name: int(gemm.get(name, 0)) for name in MMA_TILE_KNOBS}
    tile.update(MMA_ASSIGN_TILE)
    tile.update({name: int(value) for name, value in overrides.items()})
    if not tile["EMULATE"] and not takes_mma(device, xdt):
        raise ValueError(f"the 'mma' k-means variant needs matrix units that take {xdt} rows (NVIDIA, "
                         f"compute capability 8.0+); {device.describe()} has none: use variant 'gpu', or "
                         "EMULATE=1 for the emulation")
    if "BN" not in overrides:
        while k <= tile["BN"] // 2 and (tile["BN"] // 2) % tile["WN"] == 0:
            tile["BN"] //= 2
    bm, bn, wm, wn = (tile[name] for name in ("BM", "BN", "WM", "WN"))
    threads = (bm // max(wm, 1)) * (bn // max(wn, 1)) * 32
    if "BK" not in overrides:  # while the tiles still split into whole 16-byte chunks per work-item
        while d <= tile["BK"] // 2 and tile["BK"] // 2 >= 16 and \
                (bm * tile["BK"] // 2) % (8 * threads) == 0 and (bn * tile["BK"] // 2) % (8 * threads) == 0:
            tile["BK"] //= 2
    bk = tile["BK"]
    if bm % wm or bn % wn or wm % 16 or wn % (16 if tile["LDMATRIX"] else 8) or bk % 16:
        raise ValueError(f"k-means matrix-unit tile {tile}: BM must be a multiple of WM, BN of WN, WM of 16, "
                         "WN of 8 (16 with LDMATRIX), BK of 16")
    if (bm * bk) % (8 * threads) or (bn * bk) % (8 * threads):
        raise ValueError(f"k-means matrix-unit tile {tile}: the BM x BK and BN x BK tiles must split into "
                         f"16-byte chunks evenly among the {threads} work-items")
    if threads > device.capabilities.max_work_group_size:
        raise ValueError(f"k-means matrix-unit tile {tile} needs work-groups of {threads}, more than the "
                         f"device's {device.capabilities.max_work_group_size}")
    ring = tile["STAGES"] if tile["ASYNC"] else 1
    local = max(ring * (bm * (bk + tile["PAD"]) + bn * (bk + tile["PAD"])) * 2, bm * 4 * (bn // wn) * 8)
    if tile["EMULATE"]:
        local += (threads // 32) * (16 * 16 + 16 * 8) * 4
    if local > device.capabilities.local_mem:
        raise ValueError(f"k-means matrix-unit tile {tile} needs {local} bytes of local memory, more than "
                         f"the device's {device.capabilities.local_mem}; use a smaller BM, BN or BK")
    return tile


@dataclass
class PackedCenters:
    """The centers laid out for the assignment kernel (GPU: feature-major; CPU: panels of VN centers; mma:
    center-major, rounded to the rows' half format) and their squared norms (mma: plus 2 shift.c)."""

    layout: Tensor
    norms: Tensor


@dataclass
class Partials:
    """Per-segment partial sums of the update step: sums (nseg, k, d), weights (nseg, k), inertia
    (nseg * nkc)."""

    sums: Tensor
    weights: Tensor
    inertia: Tensor

    def zero_(self) -> Partials:
        for t in (self.sums, self.weights, self.inertia):
            t.fill_(0)
        return self


# -- checks at the op boundary --------------------------------------------------------------------------
def _check(
    plan: KMeansPlan, op: str, name: str, t: Tensor, shape: tuple[int, ...], dtype: Any = None
) -> None:
    want = np.dtype(dtype) if dtype is not None else plan.dtype
    if not isinstance(t, Tensor):
        raise TypeError(f"{op}: {name} must be a netcl Tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape:
        raise ShapeError(f"{op}: {name} must have shape {shape}, got {tuple(t.shape)}")
    if t.dtype != want:
        raise DTypeError(f"{op}: {name} must be {want}, got {t.dtype}")
    if not t.is_contiguous():
        raise ShapeError(f"{op}: {name} must be contiguous (call .contiguous() first)")
    if t.queue is not plan.queue:
        raise DeviceMismatchError(f"{op}: {name} lives on {t.queue!r} but the plan runs on {plan.queue!r}; "
                                  "move it with `.to(queue)` first")


def _check_rows(plan: KMeansPlan, op: str, x: Tensor, row0: int) -> int:
    if not isinstance(x, Tensor) or x.ndim != 2:
        raise ShapeError(f"{op}: x must be a 2-D Tensor of rows, got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    rows = x.shape[0]
    _check(plan, op, "x", x, (rows, plan.d), plan.xdtype)
    if rows < 1 or row0 < 0 or row0 + rows > plan.n:
        raise ShapeError(f"{op}: rows {row0}..{row0 + rows} do not lie in the plan's {plan.n} rows")
    return rows


def _weights_arg(plan: KMeansPlan, op: str, weights: Tensor | None, fallback: Tensor) -> tuple[Any, dict]:
    if weights is None:
        return fallback.buffer, {}
    _check(plan, op, "weights", weights, (plan.n,))
    return weights.buffer, {"HAS_WEIGHT": None}


# -- assignment -----------------------------------------------------------------------------------------
def kmeans_packed(plan: KMeansPlan) -> PackedCenters:
    """Device memory for kmeans_pack's layout of the plan's centers (its `out`)."""
    q, dtype = plan.queue, plan.dtype
    if plan.variant == "cpu":
        shape = (plan.kpad // plan.defines["VN"], plan.d, plan.defines["VN"])
    elif plan.variant == "mma":
        shape, dtype = (plan.kpad, plan.dpad), plan.xdtype
    else:
        shape = (plan.dpad, plan.kpad)
    return PackedCenters(Tensor.empty(q, shape, dtype), Tensor.empty(q, (plan.kpad,), plan.dtype))


def kmeans_pack(plan: KMeansPlan, centers: Tensor, out: PackedCenters | None = None,
                shift: Tensor | None = None) -> PackedCenters:
    """Lay out the (centred) k x d centers for kmeans_assign (into `out` when given). The "mma" variant's
    layout is the centers rounded to the rows' half format, and its norms take the data's `shift` (its rows
    reach the matrix units uncentred: kmeans_mma.cl), which it then requires; the others ignore it."""
    op = "kmeans_pack"
    _check(plan, op, "centers", centers, (plan.k, plan.d))
    q = plan.queue
    if plan.variant == "mma":
        if shift is None:
            raise ValueError(f"{op}: the 'mma' variant packs the centers with the data's shift; pass shift=")
        _check(plan, op, "shift", shift, (plan.d,))
    if out is None:
        out = kmeans_packed(plan)
    if plan.variant == "mma":
        prg = plan.program("kmeans_mma.cl", plan.mma)
        prg.kmeans_pack_mma(q, (plan.kpad,), None, centers=centers.buffer, k=np.int32(plan.k),
                            d=np.int32(plan.d), kpad=np.int32(plan.kpad), dpad=np.int32(plan.dpad),
                            shift=shift.buffer, ch=out.layout.buffer, cn=out.norms.buffer)
    elif plan.variant == "cpu":
        prg = plan.program("kmeans_cpu.cl", plan.defines)
        prg.kmeans_pack_cpu(
            q,
            (plan.kpad,),
            None,
            centers=centers.buffer,
            k=np.int32(plan.k),
            d=np.int32(plan.d),
            kpad=np.int32(plan.kpad),
            cp=out.layout.buffer,
            cn=out.norms.buffer,
        )
    else:
        prg = plan.program("kmeans_gpu.cl", plan.defines)
        prg.kmeans_pack(
            q,
            (plan.kpad,),
            None,
            centers=centers.buffer,
            k=np.int32(plan.k),
            d=np.int32(plan.d),
            kpad=np.int32(plan.kpad),
            dpad=np.int32(plan.dpad),
            ct=out.layout.buffer,
            cn=out.norms.buffer,
        )
    return out


def kmeans_assign(
    plan: KMeansPlan,
    x: Tensor,
    row0: int,
    shift: Tensor,
    packed: PackedCenters,
    centers: Tensor,
    labels: Tensor,
    dist: Tensor,
    changed: Tensor | None = None,
) -> None:
    """labels[row0 + i] = the nearest center of row i of x (the first on ties), dist[row0 + i] = its squared
    distance, in one kernel; with `changed` (an int32 (1,) tensor), also add the number of labels that
    differ from what `labels` held."""
    op = "kmeans_assign"
    rows = _check_rows(plan, op, x, row0)
    _check(plan, op, "shift", shift, (plan.d,))
    _check(plan, op, "centers", centers, (plan.k, plan.d))
    _check(plan, op, "labels", labels, (plan.n,), np.int32)
    _check(plan, op, "dist", dist, (plan.n,))
    if changed is not None:
        _check(plan, op, "changed", changed, (1,), np.int32)
    q = plan.queue
    groups = -(-rows // plan.rows_per_group)
    args = dict(
        x=x.buffer,
        x_off=np.int64(x.offset),
        n=np.int32(rows),
        d=np.int32(plan.d),
        row0=np.int64(row0),
        shift=shift.buffer,
        cn=packed.norms.buffer,
        kpad=np.int32(plan.kpad),
        centers=centers.buffer,
        labels=labels.buffer,
        dist=dist.buffer,
        changed=(labels if changed is None else changed).buffer,
        count_changes=np.int32(changed is not None),
    )
    if plan.variant == "cpu":
        prg = plan.program("kmeans_cpu.cl", plan.defines)
        prg.kmeans_assign_cpu(q, (groups,), (1,), cp=packed.layout.buffer, **args)
    elif plan.variant == "mma":
        defines = plan.mma
        if "ASYNC" in defines and (plan.d % 8 or x.offset % 8):
            defines = {name: v for name, v in defines.items() if name != "ASYNC"}  # rows off 16 bytes
        threads = (defines["BM"] // defines["WM"]) * (defines["BN"] // defines["WN"]) * 32
        prg = plan.program("kmeans_mma.cl", defines)
        prg.kmeans_assign_mma(q, (groups * threads,), (threads,), ch=packed.layout.buffer,
                              dpad=np.int32(plan.dpad), **args)
    else:
        t = plan.defines["TX"]
        defines = plan.defines
        if x.offset % 4 and "GVEC" in defines:
            defines = {name: v for name, v in defines.items() if name not in ("GVEC", "ALL_INNER")}
        prg = plan.program("kmeans_gpu.cl", defines)
        prg.kmeans_assign(q, (groups * t, plan.defines["TY"]), (t, plan.defines["TY"]),
                          ct=packed.layout.buffer, **args)


def kmeans_label_distance(
    plan: KMeansPlan, x: Tensor, row0: int, shift: Tensor, centers: Tensor, labels: Tensor, dist: Tensor
) -> None:
    """dist[row0 + i] = squared distance of row i of x to centers[labels[row0 + i]]."""
    op = "kmeans_label_distance"
    rows = _check_rows(plan, op, x, row0)
    _check(plan, op, "shift", shift, (plan.d,))
    _check(plan, op, "centers", centers, (plan.k, plan.d))
    _check(plan, op, "labels", labels, (plan.n,), np.int32)
    _check(plan, op, "dist", dist, (plan.n,))
    prg = plan.program("kmeans.cl", plan.shared_defines)
    prg.kmeans_label_distance(
        plan.queue,
        (rows,),
        None,
        x=x.buffer,
        x_off=np.int64(x.offset),
        n=np.int32(rows),
        d=np.int32(plan.d),
        row0=np.int64(row0),
        shift=shift.buffer,
        centers=centers.buffer,
        labels=labels.buffer,
        dist=dist.buffer,
    )


# -- update ---------------------------------------------------------------------------------------------
def kmeans_partials(plan: KMeansPlan) -> Partials:
    """Zeroed partial sums for kmeans_update (their size does not grow with the data: nseg is bounded)."""
    q = plan.queue
    return Partials(Tensor.empty(q, (plan.nseg, plan.k, plan.d), plan.dtype),
                    Tensor.empty(q, (plan.nseg, plan.k), plan.dtype),
                    Tensor.empty(q, (plan.nseg * plan.nkc,), plan.dtype)).zero_()


def kmeans_update(plan: KMeansPlan, x: Tensor, row0: int, shift: Tensor, labels: Tensor, dist: Tensor,
                  weights: Tensor | None, partials: Partials) -> None:
    """Add rows row0.. of x to the partial sums of their clusters (labels), their weights and their
    inertia (weights * dist); chunks must come in row order."""
    op = "kmeans_update"
    rows = _check_rows(plan, op, x, row0)
    _check(plan, op, "shift", shift, (plan.d,))
    _check(plan, op, "labels", labels, (plan.n,), np.int32)
    _check(plan, op, "dist", dist, (plan.n,))
    w, extra = _weights_arg(plan, op, weights, dist)
    first, last = row0 // plan.seg, (row0 + rows - 1) // plan.seg
    count = last - first + 1
    args = dict(
        x=x.buffer,
        x_off=np.int64(x.offset),
        n=np.int32(rows),
        d=np.int32(plan.d),
        row0=np.int64(row0),
        shift=shift.buffer,
        labels=labels.buffer,
        dist=dist.buffer,
        w=w,
        seg=np.int64(plan.seg),
        first_seg=np.int64(first),
        k=np.int32(plan.k),
        nkc=np.int32(plan.nkc),
        psum=partials.sums.buffer,
        pw=partials.weights.buffer,
        pin=partials.inertia.buffer,
    )
    if plan.variant == "cpu":
        prg = plan.program("kmeans_cpu.cl", plan.defines, **extra)
        prg.kmeans_update_cpu(plan.queue, (count,), (1,), **args)
    else:
        wg = plan.update_wg
        prg = plan.program("kmeans_gpu.cl", plan.defines, **extra)
        prg.kmeans_update(plan.queue, (count * wg, plan.nkc, plan.nfc), (wg, 1, 1), **args)


def kmeans_finalize(plan: KMeansPlan, partials: Partials, old: Tensor, new: Tensor, sums: Tensor,
                    stats: Tensor) -> None:
    """new = the weighted means of the partial sums (old for empty clusters), sums = the clusters' sums;
    stats (2k + 1,) = per-cluster weights, per-cluster squared shifts, and the inertia."""
    op = "kmeans_finalize"
    for name, t in (("old", old), ("new", new), ("sums", sums)):
        _check(plan, op, name, t, (plan.k, plan.d))
    _check(plan, op, "stats", stats, (2 * plan.k + 1,))
    prg = plan.program("kmeans.cl", plan.shared_defines)
    wg = plan.finalize_wg
    prg.kmeans_finalize(
        plan.queue,
        (plan.k * wg,),
        (wg,),
        psum=partials.sums.buffer,
        pw=partials.weights.buffer,
        pin=partials.inertia.buffer,
        nseg=np.int32(plan.nseg),
        npin=np.int32(plan.nseg * plan.nkc),
        k=np.int32(plan.k),
        d=np.int32(plan.d),
        old_c=old.buffer,
        new_c=new.buffer,
        sums=sums.buffer,
        stats=stats.buffer,
    )


def kmeans_minibatch_finalize(plan: KMeansPlan, partials: Partials, old: Tensor, new: Tensor, counts: Tensor,
                              stats: Tensor) -> None:
    """Mini-batch centers: clusters the batch touched move to (old * count + batch sum) / (count + batch
    weight) and their counts grow; stats (2k + 1,) = batch weight per cluster, squared shifts, batch
    inertia."""
    op = "kmeans_minibatch_finalize"
    for name, t in (("old", old), ("new", new)):
        _check(plan, op, name, t, (plan.k, plan.d))
    _check(plan, op, "counts", counts, (plan.k,))
    _check(plan, op, "stats", stats, (2 * plan.k + 1,))
    prg = plan.program("kmeans.cl", plan.shared_defines)
    wg = plan.finalize_wg
    prg.kmeans_minibatch_finalize(
        plan.queue,
        (plan.k * wg,),
        (wg,),
        psum=partials.sums.buffer,
        pw=partials.weights.buffer,
        pin=partials.inertia.buffer,
        nseg=np.int32(plan.nseg),
        npin=np.int32(plan.nseg * plan.nkc),
        k=np.int32(plan.k),
        d=np.int32(plan.d),
        old_c=old.buffer,
        new_c=new.buffer,
        counts=counts.buffer,
        stats=stats.buffer,
    )


# -- rows -----------------------------------------------------------------------------------------------
def kmeans_copy_rows(x: Tensor, src_idx: Tensor, out: Tensor, shift: Tensor | None = None,
                     dst_idx: Tensor | None = None) -> None:
    """out[j] = x[src_idx[j]] (minus shift when given); with dst_idx, out[dst_idx[j]] instead. Indices are
    int32 and must be valid rows (the callers draw them). out has x's dtype, or for half x (float16,
    bfloat16) float32, the dtype of the shift (rows gathered as centers)."""
    op = "kmeans_copy_rows"
    if x.ndim != 2 or out.ndim != 2 or out.shape[1] != x.shape[1]:
        raise ShapeError(f"{op}: x {x.shape} and out {out.shape} must be 2-D with one row length")
    if x.dtype not in (dtypes.float32, dtypes.float64, *HALF_DTYPES) or \
            out.dtype not in (x.dtype, compute_dtype(x.dtype)):
        raise DTypeError(f"{op}: x must be float32, float64, float16 or bfloat16 and out x's dtype or (half "
                         f"x) float32, got {x.dtype} and {out.dtype}")
    raw = out.dtype == x.dtype and x.dtype in HALF_DTYPES
    if raw and shift is not None:
        raise DTypeError(f"{op}: rows minus a shift are float32, not {out.dtype}")
    if shift is not None and shift.dtype != compute_dtype(x.dtype):
        raise DTypeError(f"{op}: shift must be {compute_dtype(x.dtype)}, got {shift.dtype}")
    count = src_idx.size
    for name, t in (("src_idx", src_idx), ("dst_idx", dst_idx)):
        if t is not None and (t.dtype != np.int32 or t.ndim != 1 or t.size != count or not t.is_contiguous()):
            raise ShapeError(f"{op}: {name} must be a contiguous int32 vector of {count} indices")
    if not x.is_contiguous() or not out.is_contiguous():
        raise ShapeError(f"{op}: x and out must be contiguous")
    if dst_idx is None and count > out.shape[0]:
        raise ShapeError(f"{op}: {count} rows do not fit out of shape {out.shape}")
    check_same_queue(*(t for t in (x, src_idx, out, shift, dst_idx) if t is not None))
    if count == 0:
        return
    d = x.shape[1]
    extra = {"OUT_X": None} if raw else {}
    prg = kernels.program(x.device, "kmeans.cl", dtype=compute_dtype(x.dtype), WG=1, **x_defines(x.dtype),
                          **extra)
    prg.kmeans_copy_rows(
        x.queue,
        (d, count),
        None,
        x=x.buffer,
        x_off=np.int64(x.offset),
        d=np.int32(d),
        shift=(shift if shift is not None else x).buffer,
        subtract=np.int32(shift is not None),
        src_idx=src_idx.buffer,
        dst_idx=(dst_idx if dst_idx is not None else src_idx).buffer,
        scatter=np.int32(dst_idx is not None),
        count=np.int32(count),
        out=out.buffer,
        out_off=np.int64(out.offset),
    )


# -- k-means++ ------------------------------------------------------------------------------------------
def _pp_program(plan: KMeansPlan, trials: int, weighted: bool) -> Any:
    extra = {"HAS_WEIGHT": None} if weighted else {}
    return plan.program("kmeans.cl", plan.pp_defines, TRIALS=trials, **extra)


def _check_pp_rows(plan: KMeansPlan, op: str, x: Tensor, row0: int) -> int:
    rows = _check_rows(plan, op, x, row0)
    if row0 % PP_BLOCK:
        raise ShapeError(f"{op}: a chunk must start at a multiple of {PP_BLOCK} rows, got row {row0}")
    return rows


def kmeans_pp_update(plan: KMeansPlan, x: Tensor, row0: int, shift: Tensor, weights: Tensor | None,
                     centers: Tensor, c: int, closest: Tensor, block_sums: Tensor) -> None:
    """closest = min(closest, squared distance to centers[c]) for rows row0..; block_sums[b] = the sum of
    weights * closest over block b (PP_BLOCK rows) of those rows."""
    op = "kmeans_pp_update"
    rows = _check_pp_rows(plan, op, x, row0)
    _check(plan, op, "closest", closest, (plan.n,))
    _check(plan, op, "block_sums", block_sums, (-(-plan.n // PP_BLOCK),))
    w, _ = _weights_arg(plan, op, weights, closest)
    prg = _pp_program(plan, 1, weights is not None)
    wg = plan.pp_wg
    prg.kmeans_pp_update(
        plan.queue,
        (-(-rows // PP_BLOCK) * wg,),
        (wg,),
        x=x.buffer,
        x_off=np.int64(x.offset),
        n=np.int32(rows),
        d=np.int32(plan.d),
        row0=np.int64(row0),
        shift=shift.buffer,
        w=w,
        centers=centers.buffer,
        c_off=np.int64(centers.offset + c * plan.d),
        closest=closest.buffer,
        bsum=block_sums.buffer,
    )


def kmeans_pp_search(plan: KMeansPlan, block_sums: Tensor, closest: Tensor, weights: Tensor | None,
                     uniforms: Tensor, u_off: int, trials: int, cand_ids: Tensor) -> None:
    """cand_ids[t] = the row where the running sum of weights * closest first reaches uniforms[u_off + t]
    times the total (numpy.searchsorted on the cumsum), for t < trials."""
    op = "kmeans_pp_search"
    nblk = -(-plan.n // PP_BLOCK)
    _check(plan, op, "block_sums", block_sums, (nblk,))
    _check(plan, op, "closest", closest, (plan.n,))
    _check(plan, op, "cand_ids", cand_ids, (trials,), np.int32)
    w, _ = _weights_arg(plan, op, weights, closest)
    prg = _pp_program(plan, trials, weights is not None)
    wg = plan.pp_wg
    prg.kmeans_pp_search(plan.queue, (trials * wg,), (wg,), bsum=block_sums.buffer, nblk=np.int32(nblk),
                         closest=closest.buffer, w=w, nrows=np.int64(plan.n), uniforms=uniforms.buffer,
                         u_off=np.int64(uniforms.offset + u_off), cand_ids=cand_ids.buffer)


def kmeans_pp_potential(plan: KMeansPlan, x: Tensor, row0: int, shift: Tensor, weights: Tensor | None,
                        candidates: Tensor, closest: Tensor, part: Tensor) -> None:
    """part[b, t] = the sum over block b of rows row0.. of weights * min(closest, squared distance to
    candidate t) (the candidates' potentials, by block)."""
    op = "kmeans_pp_potential"
    rows = _check_pp_rows(plan, op, x, row0)
    trials = candidates.shape[0]
    _check(plan, op, "candidates", candidates, (trials, plan.d))
    _check(plan, op, "closest", closest, (plan.n,))
    _check(plan, op, "part", part, (-(-plan.n // PP_BLOCK), trials))
    w, _ = _weights_arg(plan, op, weights, closest)
    prg = _pp_program(plan, trials, weights is not None)
    wg = plan.pp_wg
    prg.kmeans_pp_potential(
        plan.queue,
        (-(-rows // PP_BLOCK) * wg,),
        (wg,),
        x=x.buffer,
        x_off=np.int64(x.offset),
        n=np.int32(rows),
        d=np.int32(plan.d),
        row0=np.int64(row0),
        shift=shift.buffer,
        w=w,
        cand=candidates.buffer,
        closest=closest.buffer,
        part=part.buffer,
    )


def kmeans_pp_pick(
    plan: KMeansPlan,
    part: Tensor,
    cand_ids: Tensor,
    candidates: Tensor,
    c: int,
    centers: Tensor,
    chosen: Tensor,
) -> None:
    """Center c = the candidate of least potential (the first on ties); chosen[c] = its row."""
    op = "kmeans_pp_pick"
    trials = candidates.shape[0]
    nblk = -(-plan.n // PP_BLOCK)
    _check(plan, op, "part", part, (nblk, trials))
    _check(plan, op, "cand_ids", cand_ids, (trials,), np.int32)
    _check(plan, op, "centers", centers, (plan.k, plan.d))
    _check(plan, op, "chosen", chosen, (plan.k,), np.int32)
    prg = _pp_program(plan, trials, False)
    wg = plan.pp_wg
    prg.kmeans_pp_pick(
        plan.queue,
        (wg,),
        (wg,),
        part=part.buffer,
        nblk=np.int32(nblk),
        cand_ids=cand_ids.buffer,
        cand=candidates.buffer,
        d=np.int32(plan.d),
        c=np.int32(c),
        centers=centers.buffer,
        chosen=chosen.buffer,
    )
