"""BufferPool: size classes, reuse, stats, no leaks, out-of-memory handling; pinned staging."""

from __future__ import annotations

import gc

import numpy as np
import pyopencl as cl
import pytest

from netcl.core import hostcopy
from netcl.core.memory import BufferPool, PinnedStaging, is_pinned, pinned_empty, size_class, staging
from netcl.core.tensor import Tensor
from netcl.errors import OutOfMemoryError, ShapeError


def test_size_classes_waste_at_most_a_quarter():
    for n in [0, 1, 255, 256, 257, 4095, 4097, 10_000, 123_457, 1 << 20, (1 << 20) + 1, 987_654_321]:
        c = size_class(n)
        assert c >= max(n, 256)
        assert c <= max(256, n * 1.25 + 256)
    assert size_class(5000) == size_class(5100)
    # large blocks (a model's weights): 32 classes per power of two, at most 1/32 wasted
    for n in [16 << 20, (16 << 20) + 1, 23_068_672, 46_137_344, 131_072_000, 987_654_321]:
        c = size_class(n)
        assert n <= c <= n * (1 + 1 / 32)
    assert size_class(23_068_672) == 23_068_672  # TinyLlama's down projection in bfloat16: exact


def test_freed_tensors_return_to_pool_and_are_reused(device, queue):
    pool = device.pool
    gc.collect()
    before = pool.stats()
    t = Tensor.empty(queue, (1000, 3))
    mid = pool.stats()
    assert mid["in_use"] >= before["in_use"] + 12000
    del t
    gc.collect()
    after_free = pool.stats()
    assert after_free["in_use"] == before["in_use"]
    assert after_free["cached"] >= size_class(12000)
    allocations = pool.stats()["allocations"]
    t2 = Tensor.empty(queue, (3000,), np.float32)
    assert pool.stats()["allocations"] == allocations  # served from the cache
    assert pool.stats()["hits"] > after_free["hits"]
    del t2


def test_watching_sees_this_threads_blocks_only(device, queue):
    """BufferPool.watching (an op template's record of the blocks its call was handed): the blocks this thread
    is handed inside, in order, with the bytes asked; another thread's meanwhile not; a watch around another
    sees the inner one's blocks too; nothing is watched after."""
    import threading

    pool = device.pool
    other: list = []
    go, done = threading.Event(), threading.Event()

    def allocate_elsewhere():
        go.wait()
        other.append(Tensor.empty(queue, (333,), np.float32))
        done.set()

    thread = threading.Thread(target=allocate_elsewhere)
    thread.start()
    with pool.watching() as outer:
        a = Tensor.empty(queue, (100,), np.float32)
        with pool.watching() as inner:
            b = Tensor.empty(queue, (7,), np.int32)
            go.set()
            assert done.wait(10)
        c = Tensor.empty(queue, (5,), np.uint8)
    thread.join()
    assert inner == [(b.buffer, 28)]
    assert outer == [(a.buffer, 400), (b.buffer, 28), (c.buffer, 5)]
    assert not pool._watch
    Tensor.empty(queue, (9,), np.float32)
    assert len(outer) == 3


def test_views_keep_the_buffer_alive(device, queue):
    a = Tensor.from_host(queue, np.arange(100, dtype=np.float32))
    v = a[10:20]
    del a
    gc.collect()
    np.testing.assert_array_equal(v.to_host(), np.arange(10, 20, dtype=np.float32))


def test_no_leak_over_ten_thousand_steps(device, queue):
    pool = device.pool
    gc.collect()
    start = pool.stats()
    x = Tensor.zeros(queue, (64,))
    for _ in range(10_000):
        y = Tensor.empty(queue, (64,))
        x = y
    del x, y
    gc.collect()
    end = pool.stats()
    assert end["in_use"] == start["in_use"]
    assert end["allocations"] - start["allocations"] <= 2


def test_stats_peak_and_empty_cache(device, queue):
    pool = device.pool
    t = Tensor.empty(queue, (1 << 18,))
    assert pool.stats()["peak"] >= pool.stats()["in_use"] >= 1 << 20
    del t
    gc.collect()
    assert pool.stats()["cached"] > 0
    pool.empty_cache()
    assert pool.stats()["cached"] == 0


def test_request_above_largest_allocation_fails_before_opencl(device, queue):
    huge = device.capabilities.max_alloc + 1
    with pytest.raises(OutOfMemoryError) as err:
        Tensor.empty(queue, (huge,), np.uint8)
    msg = str(err.value)
    assert str(huge) in msg and "largest single allocation" in msg and "Try" in msg


class _Refusing(BufferPool):
    """A pool whose device refuses the first `refusals` allocations."""

    def __init__(self, device, refusals):
        super().__init__(device)
        self.refusals = refusals
        self.emptied = 0

    def _create_buffer(self, nbytes):
        if self.refusals > 0:
            self.refusals -= 1
            raise MemoryError("forced allocation failure")
        return super()._create_buffer(nbytes)

    def empty_cache(self):
        self.emptied += 1
        super().empty_cache()


def test_forced_failure_empties_cache_and_retries_once(device, queue):
    pool = _Refusing(device, refusals=1)
    s = pool.allocate(4096, queue)
    assert pool.emptied == 1 and s.capacity >= 4096


def test_forced_failure_twice_raises_out_of_memory_with_numbers(device, queue):
    pool = _Refusing(device, refusals=2)
    with pytest.raises(OutOfMemoryError) as err:
        pool.allocate(5000, queue)
    msg = str(err.value)
    assert "5000 bytes" in msg and "Device total" in msg and "in use" in msg and "cached" in msg
    assert pool.emptied == 1
    assert pool.stats()["in_use"] == 0  # nothing was lost or half-counted


def test_opencl_refusal_code_is_translated(device, queue):
    class ClRefusing(BufferPool):
        def _create_buffer(self, nbytes):
            raise cl.MemoryError("clCreateBuffer failed: MEM_OBJECT_ALLOCATION_FAILURE")

    with pytest.raises(OutOfMemoryError):
        ClRefusing(device).allocate(1024, queue)


def test_pinned_host_array_round_trip(queue):
    host = pinned_empty(queue, (300, 7), np.float32)
    assert is_pinned(host) and is_pinned(host[3:]) and not is_pinned(np.zeros(3))
    host[...] = np.arange(2100, dtype=np.float32).reshape(300, 7)
    t = Tensor.from_host(queue, host)
    back = pinned_empty(queue, (300, 7), np.float32)
    assert t.to_host(out=back) is back
    np.testing.assert_array_equal(back, host)
    with pytest.raises(ShapeError, match="out must be"):
        t.to_host(out=np.empty((7, 300), np.float32))


@pytest.mark.parametrize("pinned", [True, False])
def test_large_transfers_chunked_through_staging(queue, pinned, rng, monkeypatch):
    staging(queue)._ensure()  # its buffers at the full chunk size, before the chunk is made smaller below
    monkeypatch.setattr(PinnedStaging, "CHUNK", 1 << 20)
    monkeypatch.setattr(hostcopy, "HOST_THREADS", 3)  # each chunk's memcpy in slices on threads
    monkeypatch.setattr(hostcopy, "HOST_SLICE_BYTES", 100_003)
    n = (1 << 20) // 4 * 2 + 12345  # more than two staging chunks, not a multiple of one
    a = rng.standard_normal(n).astype(np.float32)
    want = a.copy()
    t = Tensor.empty(queue, (n,))
    if pinned:  # drive the staging path directly: from_host skips it on CPU devices
        staging(queue).write(t.buffer, 0, a)
    else:
        t._write_contiguous(a, pinned=False)
    a[:] = 0  # the caller may reuse its array as soon as the copy returns
    back = np.empty_like(a)
    if pinned:
        staging(queue).read(back, t.buffer, 0)
    else:
        back = t.to_host()
    np.testing.assert_array_equal(back, want)


def test_requests_beyond_the_device_total_are_refused_when_made(device, queue):
    """Drivers that allocate lazily (PoCL) accept blocks beyond the device's memory and fail later,
    elsewhere; the pool refuses them at the request, naming the numbers, after giving back its cache."""
    import dataclasses
    import types

    small = dataclasses.replace(device.capabilities, global_mem=1 << 20, max_alloc=1 << 19)
    fake = types.SimpleNamespace(context=device.context, capabilities=small, describe=device.describe)
    pool = BufferPool(fake)
    a = pool.allocate(400 << 10, queue)
    b = pool.allocate(400 << 10, queue)
    with pytest.raises(OutOfMemoryError) as err:
        pool.allocate(400 << 10, queue)
    assert "netcl already holds 896.0 KiB of the device's 1.0 MiB" in str(err.value)  # 2 x 448 KiB blocks
    del b  # back to the cache: the next request reuses it, and a larger one empties the cache first
    c = pool.allocate(400 << 10, queue)
    assert pool.stats()["hits"] == 1
    del c
    d = pool.allocate(500 << 10, queue)
    assert pool.stats()["cached"] == 0 and d.capacity >= 500 << 10
    del a, d
