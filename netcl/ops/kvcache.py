"""KV-cache writes (kernels/kvcache.cl): new keys or values (B, H, S, D) into a preallocated cache
(B, H, capacity, D) at the position held by a device int32 tensor, so a recorded decode step replays at
the next position without Python."""

from __future__ import annotations

import numpy as np

from netcl import kernels
from netcl.core import dtypes
from netcl.core.backend import device_check
from netcl.core.tensor import Tensor, check_same_queue
from netcl.errors import DTypeError, ShapeError
from netcl.ops.rope import offset_args, strides4

__all__ = ["cache_write"]

_CAPACITY_CHECK = device_check(
    "cache_write: position {value} (row {row} of (B*H*S)) is outside [0, {limit}), "
    "the KV cache's capacity; make the cache longer (max_len)"
)


def cache_write(cache: Tensor, x: Tensor, offset: Tensor | None = None) -> Tensor:
    """cache[:, :, p + s] = x[:, :, s] for x (B, H, S, D) and cache (B, H, capacity, D), any strides,
    p = offset (an int32 device Tensor (1,) or (B,); None: 0). Returns cache. A position beyond the
    capacity writes nothing and raises ShapeError at the next host read."""
    for name, t in (("cache", cache), ("x", x)):
        if not isinstance(t, Tensor) or t.ndim != 4:
            raise ShapeError(
                f"cache_write: {name} must be a 4-D Tensor (batch, heads, positions, head_dim), got "
                f"{getattr(t, 'shape', type(t).__name__)}"
            )
    queue = check_same_queue(cache, x)
    b, h, s, d = x.shape
    if cache.shape[:2] != (b, h) or cache.shape[3] != d:
        raise ShapeError(f"cache_write: x of shape {x.shape} does not fit a cache of shape {cache.shape}")
    if cache.dtype != x.dtype:
        raise DTypeError(f"cache_write: x is {x.dtype} but the cache holds {cache.dtype}")
    position = offset_args("cache_write", offset, b, queue)
    if x.size == 0:
        return cache
    prg = kernels.program(queue.device, "kvcache.cl", T=dtypes.cl_bits_type(x.itemsize))
    rows = b * h * s
    prg.cache_write(queue, (d, rows), None, x=x.buffer, x_off=np.int64(x.offset), x_strides=strides4(x),
                    cache=cache.buffer, cache_off=np.int64(cache.offset), cache_strides=strides4(cache),
                    **position, heads=np.int32(h), seq=np.int32(s), rows=np.int64(rows), dim=np.int32(d),
                    capacity=np.int32(cache.shape[2]), err=queue.check_buffer(), err_code=_CAPACITY_CHECK)
    return cache
