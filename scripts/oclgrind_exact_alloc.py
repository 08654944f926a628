"""pytest plugin used by scripts/oclgrind_check.py: make netcl allocate buffers of exactly the bytes asked.

netcl's BufferPool rounds allocations up to size classes, so a kernel reading a little past a tensor
would stay inside its buffer and Oclgrind could not see it. Under the check every buffer is exact.
"""

from netcl.core import memory


def _exact_size(nbytes: int) -> int:
    return max(int(nbytes), 1)


memory.size_class = _exact_size


def pytest_runtest_teardown(item, nextitem) -> None:
    """Each test's cached blocks go back to OpenCL when it ends: Oclgrind's race detection sizes its
    records to every buffer the context holds at each launch, so blocks kept for reuse made every later
    launch slower (the k-means mini-batch fit: 2 s alone, 35 s after the other k-means cases)."""
    import gc  # noqa: PLC0415

    from netcl.core.device import manager  # noqa: PLC0415

    gc.collect()
    for handle in manager.devices():
        if handle._pool is not None:
            handle.pool.empty_cache()
