"""Large host-side copies and sums on several threads (NumPy releases the GIL in them): one thread moves
5-10 GB/s on the GPU hosts measured (the H200 machine's host memcpy), several together several times that.
Used by the pinned staging of uploads and downloads and by the collectives' host work."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

HOST_THREADS = max(1, min(8, (os.cpu_count() or 1) // 4))
HOST_SLICE_BYTES = 4 << 20
_pool: ThreadPoolExecutor | None = None


def in_slices(fn: Callable[[int, int], None], n: int, itemsize: int) -> None:
    """fn(start, stop) over [0, n) in slices of about HOST_SLICE_BYTES, on HOST_THREADS threads."""
    global _pool
    step = max(1, HOST_SLICE_BYTES // max(1, itemsize))
    spans = [(a, min(a + step, n)) for a in range(0, n, step)]
    if HOST_THREADS == 1 or len(spans) < 2:
        for a, b in spans:
            fn(a, b)
        return
    if _pool is None:
        _pool = ThreadPoolExecutor(HOST_THREADS, thread_name_prefix="netcl-host")
    for future in [_pool.submit(fn, a, b) for a, b in spans]:
        future.result()


def copy_bytes(jobs: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
    """dst[...] = src for each (dst, src) pair of flat uint8 arrays of one length, in slices on threads."""
    for d, s in jobs:
        in_slices(lambda a, b, d=d, s=s: np.copyto(d[a:b], s[a:b]), d.nbytes, 1)
