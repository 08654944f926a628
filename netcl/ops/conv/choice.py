"""Which algorithm runs each pass of a convolution: the tuning database's choice for the geometry (one
family per pass), else the device class's defaults. Forward, backward-input and backward-weight choose
here, and nowhere else."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl.kernels import tuning
from netcl.ops.conv.geometry import _WINOGRAD_DTYPES, ALGORITHMS, ConvParams

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


def flippable(p: ConvParams) -> bool:
    """Whether the input gradient can run as the forward convolution of grad_out with the flipped,
    in/out-swapped weight (padding k - 1 - p): stride 1, dilation 1, one group, padding below the kernel."""
    return (p.SH, p.SW, p.DH, p.DW, p.G) == (1, 1, 1, 1, 1) and p.PH <= p.KH - 1 and p.PW <= p.KW - 1


def backward_input_algorithm(device: Any, p: ConvParams, dt: np.dtype) -> str:
    """The algorithm 'auto' uses for conv2d_backward_input: the tuning database's, else 'flipped' where the
    flipped convolution runs on Winograd and Winograd pays (3x3, >= 8 channels), else 'gemm' unless the
    layer is depthwise ('direct')."""
    tuned = _tuned_algorithm(device, p, dt, "backward_input")
    if tuned is not None and (tuned != "flipped" or flippable(p)):
        return tuned
    flops = 2 * p.N * p.C * p.H * p.W * p.K * p.KH * p.KW  # the flipped convolution's output is x-shaped
    if (flippable(p) and np.dtype(dt) in _WINOGRAD_DTYPES and p.KH == p.KW == 3 and min(p.C, p.K) >= 8
            and winograd_pays(device, flops, min(p.C, p.K))):
        return "flipped"
    return "gemm" if p.Cg * p.Kg > 1 else "direct"


def backward_weight_algorithm(device: Any, p: ConvParams, dt: np.dtype) -> str:
    """The algorithm 'auto' uses for conv2d_backward_weight: the tuning database's, else 'winograd' where it
    applies and pays (>= 8 channels), else 'gemm'."""
    tuned = _tuned_algorithm(device, p, dt, "backward_weight")
    winograd_ok = winograd_applicable(p) and np.dtype(dt) in _WINOGRAD_DTYPES
    if tuned is not None and (tuned != "winograd" or winograd_ok):
        return tuned
    if winograd_ok and min(p.C, p.K) >= 8 and winograd_pays(device, p.flops, min(p.C, p.K)):
        return "winograd"
    return "gemm"
