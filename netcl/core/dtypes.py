"""The dtypes netcl stores, their OpenCL C names, and the checks that guard them."""

from __future__ import annotations

from typing import Any

# bfloat16 as a NumPy dtype (JAX's library); importing it also registers np.dtype("bfloat16")
import ml_dtypes
import numpy as np

from netcl.errors import DTypeError, ScalarOverflowError

float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)  # NumPy sees it as kind "V": use is_floating, never dtype.kind
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
uint8 = np.dtype(np.uint8)
bool_ = np.dtype(np.bool_)

SUPPORTED: tuple[np.dtype, ...] = (float16, bfloat16, float32, float64, int32, int64, uint8, bool_)
FLOATING: frozenset[np.dtype] = frozenset((float16, bfloat16, float32, float64))
HALF: frozenset[np.dtype] = frozenset((float16, bfloat16))  # 2-byte storage, float32 arithmetic

# The OpenCL C type a kernel uses to *store* each dtype. float16 is stored as `half` and read
# with vload_half/vstore_half (core OpenCL), so it needs no cl_khr_fp16; bfloat16 is stored as the
# high 16 bits of a float32 in a `ushort` (common.cl converts, rounding to nearest even); bool is one byte.
_CL_STORAGE = {
    float16: "half",
    bfloat16: "ushort",
    float32: "float",
    float64: "double",
    int32: "int",
    int64: "long",
    uint8: "uchar",
    bool_: "uchar",
}

# Same-sized unsigned integer types: kernels that only move bytes (copies) use these.
_CL_BITS = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}


def normalize(dtype: Any) -> np.dtype:
    """Return the numpy dtype for `dtype` (a numpy dtype, type or name), or raise DTypeError."""
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise DTypeError(f"{dtype!r} is not a dtype; netcl supports {names()}") from exc
    if dt not in SUPPORTED:
        raise DTypeError(f"dtype {dt} is not supported; netcl supports {names()}")
    return dt


def normalize_or_device_hint(target: Any) -> np.dtype:
    """normalize() for `.to(target)`: a string that is no dtype ("cpu", "cuda", "gpu") is refused with how to
    move a tensor instead, since PyTorch's `.to("cpu")` names a device."""
    try:
        return normalize(target)
    except DTypeError:
        if not isinstance(target, str):
            raise
        raise DTypeError(
            f".to({target!r}): {target!r} is not a dtype ({names()}); to move to a device pass its queue, "
            f"e.g. .to(manager.get({target!r}).queue) (netcl.core.device.manager)"
        ) from None


def check_scalar_fits(value: Any, dtype: np.dtype, what: str = "value") -> None:
    """Refuse a Python (or NumPy) integer that `dtype`, an integer dtype, cannot hold, as NumPy 2 does
    (300 for uint8, 2**40 for int32): the alternative is a silently wrapped value."""
    if dtype.kind not in "iu" or isinstance(value, (bool, np.bool_)):
        return
    if not isinstance(value, (int, np.integer)):
        return
    info = np.iinfo(dtype)
    if not info.min <= int(value) <= info.max:
        raise ScalarOverflowError(
            f"{what} {int(value)} does not fit {dtype} (range [{info.min}, {info.max}]); use a wider dtype "
            "or a value in range"
        )


def names() -> str:
    return ", ".join(str(d) for d in SUPPORTED)


def cl_storage_type(dtype: np.dtype) -> str:
    """OpenCL C type that holds one element of `dtype` in a buffer."""
    return _CL_STORAGE[normalize(dtype)]


def cl_bits_type(itemsize: int) -> str:
    """Unsigned integer OpenCL C type of `itemsize` bytes (for dtype-agnostic copies)."""
    return _CL_BITS[itemsize]


def is_floating(dtype: Any) -> bool:
    """float16, bfloat16, float32 or float64 (bfloat16 is kind "V" to NumPy, so dtype.kind cannot say)."""
    return (dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)) in FLOATING


def is_half(dtype: Any) -> bool:
    """float16 or bfloat16: 2-byte storage computed in float32."""
    return (dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)) in HALF


def token(dtype: np.dtype) -> str:
    """A short string naming `dtype` that `from_token` turns back into it (dtype.str cannot: bfloat16's is
    '<V2', a plain void type); generated kernels key their caches on it."""
    return _TOKENS.get(dtype) or dtype.name


def from_token(text: str) -> np.dtype:
    return _FROM_TOKEN[text]


_TOKENS = {dt: dt.name for dt in SUPPORTED}
_FROM_TOKEN = {dt.name: dt for dt in SUPPORTED}


def check_supported_on(dtype: np.dtype, device: Any) -> None:
    """Refuse float64 on a device without cl_khr_fp64, naming the device."""
    if np.dtype(dtype) == float64 and not device.capabilities.fp64:
        raise DTypeError(
            f"float64 is not supported on {device.device_name} (no cl_khr_fp64); "
            "use float32, or pick a device with fp64 (see `netcl devices`)"
        )
