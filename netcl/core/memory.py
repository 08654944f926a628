"""Device memory: the BufferPool caching allocator (one per context), its summary (`memory_summary()`),
and pinned host staging."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core import launch_labels, profile_hooks
from netcl.core.backend import enqueue_copy, is_oom
from netcl.core.hostcopy import copy_bytes
from netcl.errors import DeviceError, OutOfMemoryError

MIN_BLOCK = 256


# blocks from this size on are classed 32 to a power of two instead of 4: a model's weights are long-lived
# blocks of many sizes (a 1B Llama's 23 and 46 MB matrices were rounded up by 9%, 145 MB in all)
FINE_CLASSES_FROM = 16 << 20


def size_class(nbytes: int) -> int:
    """Round a request up to its cache class: 256 B minimum, then four classes per power of two
    (2^k, 1.25, 1.5, 1.75 x 2^k), so a cached block wastes at most 25%; from FINE_CLASSES_FROM (16 MiB) on,
    32 classes per power of two (at most 3.1%)."""
    n = max(int(nbytes), MIN_BLOCK)
    if n <= 4096:
        return (n + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK
    top = 1 << (n.bit_length() - 1)
    step = top // (32 if n >= FINE_CLASSES_FROM else 4)
    return (n + step - 1) // step * step


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"


class Storage:
    """One device allocation from a pool; Tensors (and views) share it. Its buffer goes back to
    the pool when the last Tensor referring to it is garbage-collected."""

    __slots__ = ("buffer", "nbytes", "capacity", "queue", "pool", "site", "__weakref__")

    def __init__(self, pool: BufferPool, buffer: cl.Buffer, nbytes: int, capacity: int, queue: Any,
                 site: str | None = None):
        self.buffer = buffer
        self.nbytes = nbytes
        self.capacity = capacity
        self.queue = queue
        self.pool = pool
        self.site = site  # where it was allocated (netcl.profiling.site()), recorded while profiling

    def __del__(self) -> None:
        # __del__ rather than weakref.finalize: a training step allocates ~40 Storages, and a
        # finalizer object costs ~2 us more per allocation than this method. It is the pool's release itself
        # (BufferPool keeps no other way back): one Python call per freed block, not two.
        try:
            pool, buffer, capacity, queue = self.pool, self.buffer, self.capacity, self.queue
            with pool._lock:
                pool.in_use -= capacity
                rng = pool._ranges[capacity.bit_length()]
                rng[0] -= capacity
                rng[3] -= 1
                if self.site is not None:
                    entry = pool._sites[self.site]
                    entry[0] -= capacity
                    entry[2] -= 1
                if pool._graph_held and id(buffer) in pool._graph_held:
                    return  # a graph still writes here: dropped, freed when the graph is
                free = pool._free.get(queue)
                if free is None:
                    free = pool._free[queue] = {}
                bucket = free.get(capacity)
                if bucket is None:
                    free[capacity] = [buffer]
                else:
                    bucket.append(buffer)
                pool.cached += capacity
                rng[1] += capacity
        except Exception:  # interpreter shutdown: modules may already be torn down
            pass


class BufferPool:
    """Caching allocator of one device's context, by size class.

    Freed blocks are kept per queue: a block freed by queue A may still be read by A's pending
    kernels, so it is reused by A (in order, hence safely) and by other queues only after
    `empty_cache()` has waited for everything.
    """

    def __init__(self, device: Any):
        self.device = device
        self._lock = threading.RLock()
        self._free: dict[Any, dict[int, list[cl.Buffer]]] = {}
        self.in_use = 0
        self.cached = 0
        self.peak = 0
        self.allocations = 0  # blocks asked of OpenCL
        self.requests = 0
        self.hits = 0
        # buffers a live netcl.graph.Graph replays into: never handed out again while it lives
        # (id(buffer) -> how many graphs hold it; the graph keeps the buffer objects alive)
        self._graph_held: dict[int, int] = {}
        # per size range (the block size's power of two): [in use, cached, peak in use, blocks in use]
        self._ranges: dict[int, list[int]] = {}
        # per allocation site (recorded while profiling): [in use, peak in use, blocks in use, allocations]
        self._sites: dict[str, list[int]] = {}
        # bytes asked -> (bytes, size class, the statistics of the class's size range), checked
        self._classes: dict[int, tuple[int, int, list[int]]] = {}
        # threads recording an op's template (netcl.core.template) -> the blocks handed out to each meanwhile,
        # as (buffer, bytes) (`watching`)
        self._watch: dict[int, list[tuple[cl.Buffer, int]]] = {}
        _pools.add(self)

    # The one place that asks OpenCL for memory (tests replace it to force failures).
    def _create_buffer(self, nbytes: int) -> cl.Buffer:
        return cl.Buffer(self.device.context, cl.mem_flags.READ_WRITE, nbytes)

    def allocate(self, nbytes: int, queue: Any) -> Storage:
        """A Storage of at least `nbytes` for use on `queue`."""
        checked = self._classes.get(nbytes)
        if checked is None:  # a step repeats its sizes: each is checked and classed once
            nbytes = int(nbytes)
            if nbytes < 0:
                raise ValueError(f"cannot allocate {nbytes} bytes")
            caps = self.device.capabilities
            if nbytes > caps.max_alloc:
                raise OutOfMemoryError(self._oom_message(nbytes, "it is larger than one allocation may be"))
            cap = min(size_class(nbytes), max(caps.max_alloc, MIN_BLOCK))
            with self._lock:
                rng = self._ranges.setdefault(cap.bit_length(), [0, 0, 0, 0])
            checked = (nbytes, cap, rng)
            if len(self._classes) < 4096:
                self._classes[nbytes] = checked
        nbytes, cap, rng = checked
        site = launch_labels.site() if profile_hooks.active else None
        with self._lock:
            self.requests += 1
            free = self._free.get(queue)
            bucket = free.get(cap) if free is not None else None
            if bucket:
                buf = bucket.pop()
                self.cached -= cap
                rng[1] -= cap
                self.hits += 1
            else:
                self._check_total(cap, nbytes)
                buf = self._create_with_retry(cap, nbytes)
                self.allocations += 1
            if self._watch:
                watched = self._watch.get(threading.get_ident())
                if watched is not None:
                    watched.append((buf, nbytes))
            self.in_use += cap
            rng[0] += cap
            rng[3] += 1
            if rng[0] > rng[2]:
                rng[2] = rng[0]
            if self.in_use > self.peak:
                self.peak = self.in_use
            if site is not None:
                entry = self._sites.get(site)
                if entry is None:
                    entry = self._sites[site] = [0, 0, 0, 0]
                entry[0] += cap
                entry[2] += 1
                entry[3] += 1
                if entry[0] > entry[1]:
                    entry[1] = entry[0]
        return Storage(self, buf, nbytes, cap, queue, site)

    @contextlib.contextmanager
    def watching(self) -> Iterator[list[tuple[cl.Buffer, int]]]:
        """`with pool.watching() as made:` the blocks this thread is handed inside the block, as (buffer,
        bytes asked), in order (another thread's are not in it)."""
        me = threading.get_ident()
        made: list[tuple[cl.Buffer, int]] = []
        with self._lock:
            outer = self._watch.get(me)
            self._watch[me] = made
        try:
            yield made
        finally:
            with self._lock:
                if outer is None:
                    del self._watch[me]
                else:   # (a watch around this one sees these blocks too)
                    outer.extend(made)
                    self._watch[me] = outer

    def _check_total(self, cap: int, nbytes: int) -> None:
        """Refuse a block that, with what netcl already holds, exceeds the device's global memory. Drivers
        that allocate lazily (PoCL) would otherwise accept it and fail later, elsewhere."""
        total = self.device.capabilities.global_mem
        if self.in_use + self.cached + cap <= total:
            return
        if self.cached:
            self.empty_cache()  # cached blocks are ours to give back first
            if self.in_use + cap <= total:
                return
        raise OutOfMemoryError(self._oom_message(
            nbytes, f"netcl already holds {format_bytes(self.in_use)} of the device's {format_bytes(total)}",
            summary=True))

    def _create_with_retry(self, cap: int, nbytes: int) -> cl.Buffer:
        for attempt in (0, 1):
            try:
                return self._create_buffer(cap)
            except (cl.Error, MemoryError) as exc:
                if not (isinstance(exc, MemoryError) or is_oom(exc)):
                    raise DeviceError(
                        f"allocating {nbytes} bytes on {self.device.describe()} failed: {exc}"
                    ) from exc
                if attempt == 0:
                    self.empty_cache()
                    continue
                raise OutOfMemoryError(
                    self._oom_message(nbytes, "the device refused it", summary=True)
                ) from None
        raise AssertionError("unreachable")

    def hold_for_graph(self, buffers: Any) -> None:
        """Keep `buffers` out of the free lists while a graph that replays into them lives."""
        with self._lock:
            for buf in buffers:
                self._graph_held[id(buf)] = self._graph_held.get(id(buf), 0) + 1

    def release_from_graph(self, buffers: Any) -> None:
        with self._lock:
            for buf in buffers:
                left = self._graph_held.get(id(buf), 0) - 1
                if left > 0:
                    self._graph_held[id(buf)] = left
                else:
                    self._graph_held.pop(id(buf), None)

    def empty_cache(self) -> None:
        """Give every cached block back to OpenCL (after the queues that used them finish)."""
        with self._lock:
            # swap first: a finalizer that runs during the loop (GC in this thread) files its block
            # into the new dict instead of changing the one being walked
            free, self._free = self._free, {}
            self.cached = 0
            for rng in self._ranges.values():
                rng[1] = 0
            for queue, buckets in free.items():
                try:
                    queue.finish()
                except Exception:  # a failed queue must not keep its memory
                    pass
                for bufs in buckets.values():
                    for buf in bufs:
                        buf.release()

    def stats(self) -> dict[str, int]:
        """Bytes in use and cached (by size class), peak in use, and allocation counts."""
        with self._lock:
            return {
                "in_use": self.in_use,
                "cached": self.cached,
                "peak": self.peak,
                "allocations": self.allocations,
                "requests": self.requests,
                "hits": self.hits,
            }

    def reset_peak(self) -> None:
        """Peaks (in all, per size range, per site) start again from what is in use now."""
        with self._lock:
            self.peak = self.in_use
            for rng in self._ranges.values():
                rng[2] = rng[0]
            for entry in self._sites.values():
                entry[1] = entry[0]

    def size_ranges(self) -> list[dict[str, int]]:
        """Per block-size range [2^(k-1), 2^k) bytes: low, high, in_use, cached, peak (bytes), blocks in
        use."""
        with self._lock:
            return [{"low": 1 << (k - 1), "high": 1 << k, "in_use": r[0], "cached": r[1], "peak": r[2],
                     "blocks": r[3]} for k, r in sorted(self._ranges.items())]

    def sites(self) -> list[dict[str, Any]]:
        """Per allocation site ("scope / op", recorded while netcl.profiling runs): in_use, peak (bytes),
        blocks in use, allocations; largest peak first."""
        with self._lock:
            rows = [{"site": k, "in_use": v[0], "peak": v[1], "blocks": v[2], "allocations": v[3]}
                    for k, v in self._sites.items()]
        return sorted(rows, key=lambda r: (-r["peak"], r["site"]))

    def summary(self, top: int = 15) -> str:
        """A table like torch.cuda.memory_summary: totals, then in use / cached / peak per block-size range,
        then the allocation sites recorded while profiling (the op and module scope that allocated)."""
        st = self.stats()
        caps = self.device.capabilities
        lines = [
            f"netcl memory on {self.device.describe()}: {format_bytes(st['in_use'])} in use, "
            f"{format_bytes(st['cached'])} cached, peak {format_bytes(st['peak'])} in use "
            f"(device {format_bytes(caps.global_mem)}); {st['requests']} requests, {st['hits']} from the "
            f"cache, {st['allocations']} OpenCL allocations"
        ]
        ranges = [r for r in self.size_ranges() if r["in_use"] or r["cached"] or r["peak"]]
        if ranges:
            lines.append(f"  {'block size':<21}  {'in use':>10}  {'cached':>10}  {'peak':>10}  {'blocks':>6}")
            for r in ranges:
                label = f"{format_bytes(r['low'])} - {format_bytes(r['high'])}"
                lines.append(
                    f"  {label:<21}  {format_bytes(r['in_use']):>10}  {format_bytes(r['cached']):>10}  "
                    f"{format_bytes(r['peak']):>10}  {r['blocks']:>6}"
                )
        sites = self.sites()
        if sites:
            width = min(max(len(s["site"]) for s in sites[:top]), 60)
            lines.append(
                f"  {'allocated by (scope / op)':<{width}}  {'in use':>10}  {'peak':>10}  {'allocs':>7}"
            )
            for s in sites[:top]:
                lines.append(f"  {s['site'][:width]:<{width}}  {format_bytes(s['in_use']):>10}  "
                             f"{format_bytes(s['peak']):>10}  {s['allocations']:>7}")
            if len(sites) > top:
                lines.append(f"  ({len(sites) - top} more sites)")
        else:
            lines.append(
                "  (allocation sites are recorded while netcl.profiling.profile() or NETCL_PROFILE=1 runs)"
            )
        return "\n".join(lines)

    def describe_usage(self) -> str:
        return f"netcl holds {format_bytes(self.in_use)} in use and {format_bytes(self.cached)} cached"

    def _oom_message(self, nbytes: int, why: str, summary: bool = False) -> str:
        """The error text; with `summary` (the device is full, rather than one request too large) it ends
        with summary(), which says what holds the memory."""
        caps = self.device.capabilities
        text = (
            f"out of memory on {self.device.describe()}: asked for {format_bytes(nbytes)} ({nbytes} bytes) "
            f"and {why}. Device total {format_bytes(caps.global_mem)}, largest single allocation "
            f"{format_bytes(caps.max_alloc)}; {self.describe_usage()}. Try a smaller batch or model, "
            "delete tensors you no longer need, call pool.empty_cache(), or pick a device with more "
            "memory (NETCL_DEVICE)."
        )
        return text + "\n" + self.summary() if summary else text


_pools: weakref.WeakSet[BufferPool] = weakref.WeakSet()


def memory_summary(device: Any = None) -> str:
    """BufferPool in use / cached / peak by block size and by allocation site, for `device` (a DeviceHandle,
    a Queue or a Tensor) or for every device netcl has allocated on."""
    if device is not None:
        device = getattr(device, "device", device)  # a Queue or a Tensor: its device
        return device.pool.summary()
    pools = sorted(_pools, key=lambda p: p.device.describe())
    if not pools:
        return "netcl memory: nothing allocated on any device yet"
    return "\n\n".join(p.summary() for p in pools)


def staging(queue: Any) -> PinnedStaging:
    """`queue`'s pinned staging buffers (made on first use)."""
    with queue._lock:
        if queue._staging is None:
            queue._staging = PinnedStaging(queue)
        return queue._staging


class PinnedStaging:
    """Two pinned (CL_MEM_ALLOC_HOST_PTR, kept mapped) host buffers per queue, used in turn so a
    host memcpy into one overlaps the DMA out of the other; the memcpy runs on the host threads
    (netcl.core.hostcopy: one thread copied ~9 GB/s on the H200's host, the DMA runs ~55)."""

    CHUNK = 32 << 20

    def __init__(self, queue: Any):
        self.queue = queue
        self._lock = threading.Lock()
        self._slots: list[list[Any]] = []  # [cl.Buffer, mapped uint8 array, pending event]

    def _ensure(self) -> None:
        if self._slots:
            return
        ctx = self.queue.context
        flags = cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR
        for _ in range(2):
            buf = cl.Buffer(ctx, flags, self.CHUNK)
            host, _ev = cl.enqueue_map_buffer(
                self.queue.cl, buf, cl.map_flags.READ | cl.map_flags.WRITE, 0, (self.CHUNK,), np.uint8
            )
            self._slots.append([buf, host, None])
        self.queue.cl.finish()

    def write(self, dst: cl.Buffer, dst_offset: int, src: np.ndarray) -> None:
        """Copy the bytes of contiguous `src` to `dst` at `dst_offset`; returns once `src` may be
        reused (the last DMA may still be in flight: later commands on the queue are ordered)."""
        data = src.reshape(-1).view(np.uint8)
        with self._lock:
            self._ensure()
            for i, start in enumerate(range(0, data.size, self.CHUNK)):
                slot = self._slots[i % 2]
                if slot[2] is not None:
                    slot[2].wait()
                n = min(self.CHUNK, data.size - start)
                copy_bytes([(slot[1][:n], data[start : start + n])])
                slot[2] = enqueue_copy(
                    self.queue, dst, slot[1][:n], dst_offset=dst_offset + start, is_blocking=False
                )

    def read(self, out: np.ndarray, src: cl.Buffer, src_offset: int) -> None:
        """Fill contiguous `out` with bytes of `src` from `src_offset` (waits for them)."""
        data = out.reshape(-1).view(np.uint8)
        with self._lock:
            self._ensure()
            starts = list(range(0, data.size, self.CHUNK))
            events: list[Any] = [None] * len(starts)

            def issue(i: int) -> None:
                n = min(self.CHUNK, data.size - starts[i])
                events[i] = enqueue_copy(
                    self.queue, self._slots[i % 2][1][:n], src, src_offset=src_offset + starts[i],
                    is_blocking=False,
                )

            if starts:
                issue(0)
            for i, start in enumerate(starts):
                if i + 1 < len(starts):
                    issue(i + 1)
                events[i].wait()
                n = min(self.CHUNK, data.size - start)
                copy_bytes([(data[start : start + n], self._slots[i % 2][1][:n])])
            for slot in self._slots:
                slot[2] = None


def is_pinned(arr: np.ndarray) -> bool:
    """True when `arr` lives in a mapped OpenCL buffer (e.g. from pinned_empty): DMA reads it directly."""
    base = arr
    while base is not None:
        if isinstance(base, cl.MemoryMap):
            return True
        base = getattr(base, "base", None)
    return False


def pinned_empty(queue: Any, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    """A host array in pinned (page-locked, mapped) memory: transfers from it need no staging copy.

    The returned array keeps its OpenCL buffer alive.
    """
    dt = np.dtype(dtype)
    nbytes = max(int(np.prod(shape)) * dt.itemsize, 1)
    try:
        buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, nbytes)
        host, _ev = cl.enqueue_map_buffer(
            queue.cl, buf, cl.map_flags.READ | cl.map_flags.WRITE, 0, (nbytes,), np.uint8
        )
        queue.cl.finish()
    except cl.Error as exc:
        if is_oom(exc):
            raise OutOfMemoryError(
                f"could not pin {format_bytes(nbytes)} of host memory for {queue.device.describe()}: {exc}"
            ) from None
        raise DeviceError(f"pinned host allocation on {queue.device.describe()} failed: {exc}") from None
    arr = host[: int(np.prod(shape)) * dt.itemsize].view(dt).reshape(shape)
    return arr
