"""The one way to get a kernel program: `program(device, "gemm_tiled.cl", dtype=..., act=..., **defines)`.

The `.cl` files beside this module are netcl's hand-written kernels; this module builds them (and the
JIT's generated sources, `generated`) and keeps every built program in one cache. It also owns the two
tables kernels and hosts share by name:

- `dtype_defines(dtype)`: T (storage C type), ACC (arithmetic C type), IS_HALF (float16 stored as half,
  computed in float: vload_half/vstore_half), IS_BF16 (bfloat16 stored as ushort, computed in float),
  USE_FP64 (double: enables cl_khr_fp64). Every kernel file reads these names, through `common.cl`,
  whose LOAD_T(p, i) / STORE_T(p, i, v) read and write one element of any of them in ACC. A file that
  takes bfloat16 says so by using IS_BF16, LOAD_T or STORE_T; `program` refuses bfloat16 for the others
  (their T arithmetic on a ushort would be silently wrong).
- `ACTIVATIONS`: the epilogue activations a kernel can fuse, passed as `-DACT=ACT_RELU` (a name defined in
  `common.cl`, not a number the two sides must agree on).

Kernels are launched with named arguments where a call site has many (`prg.gemm_cpu(q, g, l, M=..., A=...)`,
see netcl.core.backend.Kernel).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable
from importlib import resources
from typing import Any

import numpy as np

from netcl import config
from netcl.core import dtypes, launch_labels
from netcl.core.backend import Program, build_program, build_stats, format_options
from netcl.errors import DTypeError, KernelBuildError

# activation name -> the macro kernels compare ACT against (common.cl defines the values)
ACTIVATIONS: dict[str | None, str] = {
    None: "ACT_NONE", "none": "ACT_NONE", "relu": "ACT_RELU", "gelu": "ACT_GELU",
    "gelu_tanh": "ACT_GELU_TANH", "silu": "ACT_SILU",
}

_DTYPES: dict[np.dtype, dict[str, Any]] = {
    dtypes.float16: {"T": "half", "ACC": "float", "IS_HALF": None},
    dtypes.bfloat16: {"T": "ushort", "ACC": "float", "IS_BF16": None},
    dtypes.float32: {"T": "float", "ACC": "float"},
    dtypes.float64: {"T": "double", "ACC": "double", "USE_FP64": None},
    dtypes.int32: {"T": "int", "ACC": "int"},
    dtypes.int64: {"T": "long", "ACC": "long"},
    dtypes.uint8: {"T": "uchar", "ACC": "uchar"},
    dtypes.bool_: {"T": "uchar", "ACC": "uchar"},
}


def dtype_defines(dtype: Any, prefix: str = "") -> dict[str, Any]:
    """The defines a kernel file reads for `dtype` (see the module docstring); `prefix` names a second
    dtype of the same kernel (an index dtype: prefix "I" gives IT)."""
    dt = dtypes.normalize(dtype)
    table = _DTYPES[dt]
    if not prefix:
        return dict(table)
    return {f"{prefix}{k}": v for k, v in table.items() if k in ("T", "ACC")}


def float_defines(dtype: Any, what: str, half: bool = False) -> dict[str, Any]:
    """dtype_defines for kernels written for float32 and float64 only, or (half=True) for every floating
    dtype through LOAD_T/STORE_T (DTypeError naming `what` else)."""
    dt = np.dtype(dtype)
    allowed = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64) if half else (dtypes.float32,
                                                                                             dtypes.float64)
    if dt not in allowed:
        names = [d.name for d in allowed]
        raise DTypeError(f"{what} supports {', '.join(names[:-1])} and {names[-1]} tensors, got {dt}")
    return dtype_defines(dt)


# Kernel families with a native-half-arithmetic variant, and the devices it was measured faster on (by
# device name fragment): `auto` uses native math only there. Empty: no device netcl has been measured on has
# cl_khr_fp16 (PoCL on the x86 CPUs here reports none, nor does NVIDIA's OpenCL driver on the H200), so every
# kernel computes float16 in float32 on half storage, the one path measured and tested.
NATIVE_HALF_FAMILIES: dict[str, tuple[str, ...]] = {}


def half_math(device: Any, family: str) -> str:
    """"native" or "storage": how kernel family `family` computes float16 on `device`, by NETCL_HALF (config):
    native only where the family has a native variant, the device passes the fp16 probe (DeviceHandle.fp16)
    and (auto) it was measured faster there; "storage" (float32 arithmetic) otherwise, and for off/storage."""
    mode = config.half_mode()
    if mode in ("off", "storage") or family not in NATIVE_HALF_FAMILIES:
        return "storage"
    if not device.fp16:
        return "storage"
    if mode == "native":
        return "native"
    name = device.device_name.lower()
    return "native" if any(frag.lower() in name for frag in NATIVE_HALF_FAMILIES[family]) else "storage"


def activation(name: str | None, allowed: tuple[str | None, ...] | None = None) -> str:
    """The ACT define of an activation name (ValueError listing the names `allowed`, default all)."""
    if name not in ACTIVATIONS or (
        allowed is not None and name not in allowed and name not in (None, "none")
    ):
        names = allowed if allowed is not None else tuple(k for k in ACTIVATIONS if k not in (None, "none"))
        raise ValueError(f"activation must be one of {[n for n in names if n]}, or None; got {name!r}")
    return ACTIVATIONS[name]


def scalar_type(dtype: Any) -> type:
    """The NumPy scalar type a float kernel argument of `dtype`'s arithmetic takes."""
    return np.float64 if np.dtype(dtype) == dtypes.float64 else np.float32


def work_group(device: Any, limit: int = 256) -> int:
    """The largest power of two <= limit that `device` accepts as a work-group size."""
    cap = min(limit, device.capabilities.max_work_group_size)
    size = 1
    while size * 2 <= cap:
        size *= 2
    return size


# -- sources ---------------------------------------------------------------------------------------------
_sources: dict[str, str] = {}
_INCLUDE = re.compile(r'^#include "([\w.]+)"[ \t]*$', re.MULTILINE)


def source(filename: str) -> str:
    """Text of a kernel file of this package (read once per process), with its `#include "other.cl"`
    lines replaced by those files (each once), so every program is one self-contained text."""
    text = _sources.get(filename)
    if text is None:
        try:
            text = resources.files(__name__).joinpath(filename).read_text()
        except FileNotFoundError as exc:
            raise KernelBuildError(f"no kernel file netcl/kernels/{filename}") from exc
        seen = {filename}

        def expand(m: re.Match) -> str:
            name = m.group(1)
            if name in seen:
                return f"/* {name} already included */"
            seen.add(name)
            return _INCLUDE.sub(expand, source(name))

        text = _INCLUDE.sub(expand, text)
        _sources[filename] = text
    return text


_BF16_MARKS = re.compile(r"\bIS_BF16\b|\bLOAD_T\(|\bSTORE_T\(")
_bf16_files: dict[str, bool] = {}


def _takes_bf16(filename: str) -> bool:
    """Whether kernel file `filename` (with what it includes, but not common.cl, which defines the names)
    reads IS_BF16 or uses LOAD_T/STORE_T: the mark of a kernel written for bfloat16 storage."""
    ok = _bf16_files.get(filename)
    if ok is None:
        text = source(filename).replace(source("common.cl"), "")
        ok = _bf16_files[filename] = bool(_BF16_MARKS.search(text))
    return ok


# -- the one program cache -------------------------------------------------------------------------------
# Keys: ("file", device id, filename, options) for kernel files, ("gen", device id, key, options) for the
# JIT's generated sources (key: its structural key, so a repeat needs no code generation) and ("src",
# device id, digest, options) for other sources. A repeat is one dict lookup.
_programs: dict[tuple, Program] = {}
_lock = threading.Lock()
# Build options added to every program built here, part of each program's key (the cache above). The test
# suite sets -cl-opt-disable for its GPU-shaped cases on CPU devices (tests/conftest.py): they check the GPU
# kernels' index arithmetic, which no CPU user runs, and PoCL builds them ~5x faster unoptimized (272 -> 54
# CPU s for those of tests/ops/test_{gemm_mma,attention}.py from cold caches).
EXTRA_OPTIONS: tuple[str, ...] = ()


def _cached(key: tuple, make: Callable[[], Program]) -> Program:
    prg = _programs.get(key)
    if prg is not None:
        return prg
    with _lock:
        prg = _programs.get(key)
        if prg is None:
            prg = _programs[key] = make()
        return prg


def program(device: Any, filename: str, *, dtype: Any = None, act: str | None = None,
            options: tuple[str, ...] = (), ptx_target: str | None = None,
            max_registers: tuple[tuple[str, int], ...] = (), **defines: Any) -> Program:
    """The built kernel file `filename` for `device`: specialised by `dtype` (dtype_defines), an epilogue
    activation name `act` (ACTIVATIONS) and any other -D `defines` (None: a flag without a value);
    `ptx_target` rebuilds it from its PTX for an arch-specific target (NVIDIA: netcl.core.ptx), and
    `max_registers`' (kernel, N) pairs are assembled again within N registers (NVIDIA: netcl.core.backend's
    build_program).

    Ops call this on every launch: a repeat is one dict lookup on the arguments as given (no option
    formatting; ~0.2 ms a call once went to re-reading and hashing sources here)."""
    if EXTRA_OPTIONS:
        options = options + EXTRA_OPTIONS
    fast = ("args", id(device), filename, dtype, act, options, ptx_target, max_registers,
            tuple(sorted(defines.items())))
    prg = _programs.get(fast)
    if prg is not None:
        return prg
    if dtype is not None:
        if dtypes.normalize(dtype) == dtypes.bfloat16 and not _takes_bf16(filename):
            raise DTypeError(
                f"bfloat16 is not supported by the kernels of {filename} yet; use float16 or float32 "
                "for this op (cast first)"
            )
        defines = {**dtype_defines(dtype), **defines}
    if act is not None:
        defines["ACT"] = activation(act)
    opts = format_options(defines, options)
    prg = _cached(("file", id(device), filename, opts, ptx_target, max_registers),
                  lambda: build_program(device, source(filename), opts, name=filename, ptx_target=ptx_target,
                                        max_registers=max_registers))
    _programs[fast] = prg
    return prg


def generated(device: Any, key: Any, make_source: Callable[[], str], name: str,
              options: tuple[str, ...] = (), **defines: Any) -> Program:
    """A program of generated source (the JIT's kernels), cached under `key`, which must determine the
    source: `make_source()` runs only when `key` is new."""
    opts = format_options(defines, options + EXTRA_OPTIONS)
    return _cached(
        ("gen", id(device), key, opts), lambda: build_program(device, make_source(), opts, name=name)
    )


def build(
    device: Any, text: str, name: str = "<source>", options: tuple[str, ...] = (), *, dtype: Any = None,
    **defines: Any
) -> Program:
    """A program of any OpenCL C `text` (cached by its hash), with -D `defines` and, as program() takes it,
    `dtype`'s (dtype_defines: T, ACC, ...). Its launches without a local size run exactly their global size
    (Program.exact_grid: the driver picks the work-group, as OpenCL's NULL local size means); with a local
    size the grid is rounded up to it."""
    if not isinstance(text, str):
        raise TypeError(f"kernels.build: the program is OpenCL C source text (a str), got "
                        f"{type(text).__name__}")
    if getattr(device, "cl_device", None) is None:
        hint = " (a queue: its .device)" if hasattr(getattr(device, "device", None), "cl_device") else ""
        raise TypeError(f"kernels.build: the first argument is the device to build for, manager.default() or "
                        f"q.device; got {type(device).__name__}{hint}")
    if dtype is not None:
        defines = {**dtype_defines(dtype), **defines}
    opts = format_options(defines, options + EXTRA_OPTIONS)
    digest = hashlib.sha256(text.encode()).hexdigest()
    def make() -> Program:
        prg = build_program(device, text, opts, name=name)
        prg.exact_grid = True
        return prg

    return _cached(("src", id(device), digest, opts), make)


def clear() -> None:
    """Forget every built program held in memory (binaries on disk stay)."""
    with _lock:
        _programs.clear()


__all__ = [
    "ACTIVATIONS",
    "NATIVE_HALF_FAMILIES",
    "activation",
    "build",
    "build_stats",
    "clear",
    "dtype_defines",
    "float_defines",
    "generated",
    "half_math",
    "program",
    "scalar_type",
    "source",
    "work_group",
]

launch_labels.walks_through(__name__)  # netcl.profiling: building and launching kernels: no op of its own
