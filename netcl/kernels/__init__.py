"""The one way to get a kernel program: `program(device, "gemm_tiled.cl", dtype=..., act=..., **defines)`.

The `.cl` files beside this module are netcl's hand-written kernels; this module builds them (and the
JIT's generated sources, `generated`) and keeps every built program in one cache. It also owns the two
tables kernels and hosts share by name:

- `dtype_defines(dtype)`: T (storage C type), ACC (arithmetic C type), IS_HALF (float16 stored as half,
  computed in float: vload_half/vstore_half), USE_FP64 (double: enables cl_khr_fp64). Every kernel file
  reads these names, through `common.cl`.
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

from netcl.core import dtypes
from netcl.core.backend import Program, build_program, build_stats, format_options
from netcl.errors import DTypeError, KernelBuildError

# activation name -> the macro kernels compare ACT against (common.cl defines the values)
ACTIVATIONS: dict[str | None, str] = {
    None: "ACT_NONE", "none": "ACT_NONE", "relu": "ACT_RELU", "gelu": "ACT_GELU",
    "gelu_tanh": "ACT_GELU_TANH", "silu": "ACT_SILU",
}

_DTYPES: dict[np.dtype, dict[str, Any]] = {
    dtypes.float16: {"T": "half", "ACC": "float", "IS_HALF": None},
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


def float_defines(dtype: Any, what: str) -> dict[str, Any]:
    """dtype_defines for kernels written for float32 and float64 only (DTypeError naming `what` else)."""
    dt = np.dtype(dtype)
    if dt not in (dtypes.float32, dtypes.float64):
        raise DTypeError(f"{what} supports float32 and float64 tensors, got {dt}")
    return dtype_defines(dt)


def activation(name: str | None, allowed: tuple[str | None, ...] | None = None) -> str:
    """The ACT define of an activation name (ValueError listing the names `allowed`, default all)."""
    names = allowed if allowed is not None else tuple(k for k in ACTIVATIONS if k not in (None, "none"))
    if name not in ACTIVATIONS or (allowed is not None and name not in allowed and name not in (None, "none")):
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


# -- the one program cache -------------------------------------------------------------------------------
# Keys: ("file", device id, filename, options) for kernel files, ("gen", device id, key, options) for the
# JIT's generated sources (key: its structural key, so a repeat needs no code generation) and ("src",
# device id, digest, options) for other sources. A repeat is one dict lookup.
_programs: dict[tuple, Program] = {}
_lock = threading.Lock()


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
            options: tuple[str, ...] = (), **defines: Any) -> Program:
    """The built kernel file `filename` for `device`: specialised by `dtype` (dtype_defines), an epilogue
    activation name `act` (ACTIVATIONS) and any other -D `defines` (None: a flag without a value).

    Ops call this on every launch: a repeat is one dict lookup on the arguments as given (no option
    formatting; ~0.2 ms a call once went to re-reading and hashing sources here)."""
    fast = ("args", id(device), filename, dtype, act, options, tuple(sorted(defines.items())))
    prg = _programs.get(fast)
    if prg is not None:
        return prg
    if dtype is not None:
        defines = {**dtype_defines(dtype), **defines}
    if act is not None:
        defines["ACT"] = activation(act)
    opts = format_options(defines, options)
    prg = _cached(("file", id(device), filename, opts),
                  lambda: build_program(device, source(filename), opts, name=filename))
    _programs[fast] = prg
    return prg


def generated(device: Any, key: Any, make_source: Callable[[], str], name: str,
              options: tuple[str, ...] = (), **defines: Any) -> Program:
    """A program of generated source (the JIT's kernels), cached under `key`, which must determine the
    source: `make_source()` runs only when `key` is new."""
    opts = format_options(defines, options)
    return _cached(("gen", id(device), key, opts), lambda: build_program(device, make_source(), opts, name=name))


def build(device: Any, text: str, name: str = "<source>", options: tuple[str, ...] = (), **defines: Any) -> Program:
    """A program of any OpenCL C `text` (cached by its hash)."""
    opts = format_options(defines, options)
    digest = hashlib.sha256(text.encode()).hexdigest()
    return _cached(("src", id(device), digest, opts), lambda: build_program(device, text, opts, name=name))


def clear() -> None:
    """Forget every built program held in memory (binaries on disk stay)."""
    with _lock:
        _programs.clear()


__all__ = ["ACTIVATIONS", "activation", "build", "build_stats", "clear", "dtype_defines", "float_defines",
           "generated", "program", "scalar_type", "source", "work_group"]
