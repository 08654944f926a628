"""GEMM tuning: candidate tile configurations per kernel variant, and the measurement that picks one."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from netcl.core.tensor import Tensor
from netcl.kernels.tuning import database_for
from netcl.ops.gemm import default_params, flops, gemm
from netcl.tune.tuner import TuneResult, time_callable, tune_family


def _cpu_candidates(dtype: np.dtype, quick: bool) -> list[dict[str, int]]:
    wide = 8 if dtype == np.float64 else 16
    narrow = wide // 2
    out = [default_params("cpu", dtype)]
    # register blocks of at most ~12 accumulator registers (AVX2: 16 ymm) and a few cache blockings
    blocks = [(4, wide), (5, wide), (6, wide), (8, narrow), (3, wide)]
    shapes = [(64, 64, 256), (128, 64, 256), (64, 128, 256), (64, 64, 128), (96, 64, 384), (128, 128, 256)]
    if quick:
        blocks, shapes = blocks[:3], shapes[:3]
    for (rm, vn), (mb, nb, kc) in itertools.product(blocks, shapes):
        if nb % vn:
            continue
        mb = max(rm, mb // rm * rm)  # whole register blocks per work-item
        cand = {"MB": mb, "NB": nb, "KC": kc, "RM": rm, "VN": vn}
        if cand not in out:
            out.append(cand)
    return out


def _tiled_candidates(device: Any, dtype: np.dtype, quick: bool) -> list[dict[str, int]]:
    item = 8 if dtype == np.float64 else 4
    caps = device.capabilities
    out = [default_params("tiled", dtype, device)]
    grid = [
        # BM, BN, BK, TX, TY, VW, PAD, WX (warp patch width) (, MAXRREG: NVIDIA register cap)
        # ordered by the H200 sweeps of 2026-11-29 (bench/NOTES.md, GEMM);
        # GM (grouped block order) and GVEC are inherited from the defaults
        (128, 128, 16, 16, 16, 4, 4, 8),
        (128, 128, 8, 8, 16, 4, 4, 4),
        (128, 128, 16, 16, 16, 4, 4, 4),
        (128, 128, 16, 16, 16, 4, 4, 0),
        (128, 128, 16, 32, 8, 4, 4, 8),
        (64, 128, 16, 16, 8, 4, 4, 8),
        (128, 128, 8, 16, 16, 4, 4, 8),
        (128, 64, 16, 8, 16, 4, 4, 0),
        (128, 256, 8, 16, 16, 4, 4, 8),
        (256, 128, 8, 16, 16, 4, 4, 8),
        (128, 256, 16, 16, 16, 4, 0, 8),
        (64, 64, 16, 16, 16, 4, 4, 8),
        (64, 64, 8, 8, 8, 4, 4, 0),
        (128, 128, 16, 16, 16, 2, 2, 8),
        (128, 128, 16, 8, 32, 4, 4, 0),
    ]
    if quick:
        grid = grid[:7]
    nvidia = "cl_nv_compiler_options" in caps.extensions
    for bm, bn, bk, tx, ty, vw, pad, wx, *regs in grid:
        max_regs = regs[0] if regs else 0
        if max_regs and not nvidia:
            continue
        if dtype == np.float64 and vw > 2:
            vw, pad = 2, 2
        if bm % (ty * vw) or bn % (tx * vw) or tx * ty > caps.max_work_group_size:
            continue
        if 2 * bk * (bm + pad + bn + pad) * item > caps.local_mem:
            continue
        cand = {
            "BM": bm,
            "BN": bn,
            "BK": bk,
            "TX": tx,
            "TY": ty,
            "VW": vw,
            "PADA": pad,
            "PADB": pad,
            "WX": wx,
        }
        if max_regs:
            cand["MAXRREG"] = max_regs
        if cand not in out:
            out.append(cand)
    return out


def candidates(device: Any, variant: str, dtype: Any, quick: bool = False) -> list[dict[str, int]]:
    """Tile configurations worth measuring for `variant` on `device` (the default first)."""
    dt = np.dtype(dtype)
    if variant == "cpu":
        return _cpu_candidates(dt, quick)
    if variant == "tiled":
        return _tiled_candidates(device, dt, quick)
    return [default_params(variant, dt, device)]


def default_size(device: Any, quick: bool) -> tuple[int, int, int]:
    if device.capabilities.kind == "cpu":
        return (512, 512, 512) if quick else (1024, 1024, 1024)
    return (2048, 2048, 2048) if quick else (4096, 4096, 4096)


def gemm_benchmark(
    device: Any, variant: str, dtype: Any, size: tuple[int, int, int], repeats: int = 3
) -> Callable[[dict[str, int]], float]:
    """A closure: params -> median seconds of one (M, N, K) GEMM with those tile params."""
    q = device.queue
    m, n, k = size
    rng = np.random.default_rng(0)
    a = Tensor.from_host(q, rng.standard_normal((m, k), dtype=np.float32).astype(dtype))
    b = Tensor.from_host(q, rng.standard_normal((k, n), dtype=np.float32).astype(dtype))

    def bench(params: dict[str, int]) -> float:
        return time_callable(lambda: gemm(a, b, variant=variant, params=params), q.finish, repeats)

    return bench


def tune_gemm(
    device: Any,
    dtype: Any = np.float32,
    *,
    quick: bool = False,
    size: tuple[int, int, int] | None = None,
    variant: str | None = None,
    store: bool = True,
    verbose: bool = False,
    candidate_list: list[dict[str, int]] | None = None,
) -> TuneResult:
    """Measure GEMM tile candidates for the large-matrix variant of `device` and store the fastest."""
    dt = np.dtype(dtype)
    variant = variant or ("cpu" if device.capabilities.kind == "cpu" else "tiled")
    size = size or default_size(device, quick)
    cands = candidate_list if candidate_list is not None else candidates(device, variant, dt, quick)
    bench = gemm_benchmark(device, variant, dt, size, repeats=3 if quick else 5)
    result = tune_family(device, f"gemm_{variant}", dt.name, cands, bench, store=False, verbose=verbose)
    if store and result.best is not None:
        gflops = flops(*size) / result.best_seconds / 1e9
        default_seconds = {tuple(sorted(c.items())): s for c, s in result.timings}.get(
            tuple(sorted(cands[0].items()))
        )
        database_for(device).put(
            f"gemm_{variant}", dt.name, result.best, seconds=result.best_seconds, gflops=round(gflops, 2),
            size=list(size), candidates=len(cands),
            default_gflops=round(flops(*size) / default_seconds / 1e9, 2) if default_seconds else None,
        )
    return result
