"""Collectives on netcl Tensors (and host arrays): all_reduce, broadcast, all_gather, barrier.

A Tensor goes to the group through the host. On the shared-memory backend it is read from the device
straight into this rank's shared segment and written back straight from the segments, so the host copies
nothing itself; the chunks a rank sums are summed on the host for CPU devices, and on the device for GPUs
and accelerators (NETCL_DIST_DEVICE_SUM): there the rank's own chunk never leaves the device, the other
ranks' pieces of it come up, a pairwise tree of device additions sums them, and the host does no arithmetic.
Other backends get the tensor in a host array.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyopencl as cl

from netcl import config, ops
from netcl.autograd.engine import Node
from netcl.core.backend import enqueue_copy
from netcl.core.hostcopy import copy_bytes
from netcl.core.memory import pinned_empty
from netcl.core.tensor import Tensor
from netcl.distributed import runtime
from netcl.distributed.group import ProcessGroup, c_order, check_op, chunk_bounds
from netcl.distributed.shm import ALL_GATHER, BROADCAST, ShmGroup
from netcl.errors import DeviceMismatchError, DTypeError

_DEVICE_OPS = {"sum": ops.add, "mean": ops.add, "max": ops.maximum, "min": ops.minimum, "prod": ops.mul}


def _as_list(tensors: Any, what: str) -> list[Tensor | np.ndarray]:
    items = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
    if not items:
        raise ValueError(f"{what}: no tensors given")
    out: list[Tensor | np.ndarray] = []
    for i, t in enumerate(items):
        if isinstance(t, Node):
            t = t.value
        if not isinstance(t, (Tensor, np.ndarray)):
            raise TypeError(
                f"{what}: item {i} is a {type(t).__name__}; collectives take netcl Tensors, Nodes "
                "or NumPy arrays"
            )
        out.append(t)
    return out


def _by_dtype(items: list[Tensor | np.ndarray]) -> list[list[Tensor | np.ndarray]]:
    """The items grouped by dtype, groups in order of first appearance (one collective each)."""
    groups: dict[np.dtype, list[Tensor | np.ndarray]] = {}
    for t in items:
        groups.setdefault(np.dtype(t.dtype), []).append(t)
    return list(groups.values())


def device_sums(tensor: Tensor) -> bool:
    """Whether all_reduce sums this tensor's chunks on its device (NETCL_DIST_DEVICE_SUM)."""
    mode = config.dist_device_sum()
    return mode == "1" or (mode == "auto" and tensor.device.kind != "cpu")


# -- moving tensors to and from host memory
# --------------------------------------------------------------------
def _pieces(tensors: Sequence[Tensor], host: np.ndarray) -> list[tuple[Tensor, np.ndarray]]:
    """(tensor, its stretch of the flat host array) for tensors laid end to end in `host`."""
    pairs, offset = [], 0
    for t in tensors:
        pairs.append((t, host[offset : offset + t.size]))
        offset += t.size
    return pairs


# Transfers between a GPU and pageable memory (the shared segments) run at 5-12 GB/s on the H200's host,
# pinned ones at ~55 GB/s: large ones go through a pinned bounce buffer, the host side copied by threads.
BOUNCE_MIN_BYTES = 1 << 20
_bounce_lock = threading.Lock()
_bounces: dict[int, tuple[Any, np.ndarray]] = {}  # id(device) -> (device, pinned uint8 array)


def _bounce(tensor: Tensor, nbytes: int) -> np.ndarray:
    """The device's pinned bounce buffer, at least `nbytes` long (grown in whole MiB). Hold _bounce_lock."""
    entry = _bounces.get(id(tensor.device))
    if entry is None or entry[1].nbytes < nbytes:
        size = -(-nbytes // (1 << 20)) * (1 << 20)
        entry = (tensor.device, pinned_empty(tensor.queue, (size,), np.uint8))
        _bounces[id(tensor.device)] = entry
    return entry[1]


def _staged(pairs: list[tuple[Tensor, np.ndarray]]) -> bool:
    return pairs[0][0].device.kind != "cpu" and sum(h.nbytes for _, h in pairs) >= BOUNCE_MIN_BYTES


def _bytes(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


def copy_out(pairs: Sequence[tuple[Tensor, np.ndarray]]) -> None:
    """Read each tensor into its contiguous host array of as many elements (waits for the copies)."""
    pairs = [(t if t.is_contiguous() else t.contiguous(), host) for t, host in pairs if t.size]
    if not pairs:
        return
    if not _staged(pairs):
        events = [enqueue_copy(t.queue, host.reshape(-1), t.buffer, src_offset=t.offset * t.itemsize,
                               is_blocking=False) for t, host in pairs]
        cl.wait_for_events(events)
        return
    with _bounce_lock:
        bounce = _bounce(pairs[0][0], sum(t.nbytes for t, _ in pairs))
        events, jobs, at = [], [], 0
        for t, host in pairs:
            part = bounce[at : at + t.nbytes]
            events.append(enqueue_copy(t.queue, part, t.buffer, src_offset=t.offset * t.itemsize,
                                       is_blocking=False))
            jobs.append((_bytes(host), part))
            at += t.nbytes
        cl.wait_for_events(events)
        copy_bytes(jobs)


def copy_in(pairs: Sequence[tuple[Tensor, np.ndarray]]) -> None:
    """Write each host array into its tensor (same number of elements); returns once the host memory has been
    read, so it may be reused."""
    targets, later = [], []
    for t, host in pairs:
        if not t.size:
            continue
        target = t if t.is_contiguous() else Tensor.empty(t.queue, t.shape, t.dtype)
        targets.append((target, host))
        if target is not t:
            later.append((t, target))
    if not targets:
        return
    if not _staged(targets):
        events = [enqueue_copy(t.queue, t.buffer, host.reshape(-1), dst_offset=t.offset * t.itemsize,
                               is_blocking=False) for t, host in targets]
        cl.wait_for_events(events)
    else:
        with _bounce_lock:
            bounce = _bounce(targets[0][0], sum(t.nbytes for t, _ in targets))
            parts, at = [], 0
            for t, _host in targets:
                parts.append(bounce[at : at + t.nbytes])
                at += t.nbytes
            copy_bytes([(part, _bytes(host)) for part, (_t, host) in zip(parts, targets)])
            events = [
                enqueue_copy(t.queue, t.buffer, part, dst_offset=t.offset * t.itemsize, is_blocking=False)
                for part, (t, _host) in zip(parts, targets)
            ]
            cl.wait_for_events(events)
    for t, target in later:
        t.copy_(target)


def _check_tensors(tensors: Sequence[Tensor], what: str) -> None:
    device = tensors[0].device
    for t in tensors[1:]:
        if t.device is not device:
            raise DeviceMismatchError(
                f"{what}: tensors on {device.describe()} and {t.device.describe()}; one "
                "call takes the tensors of one device"
            )
    for t in tensors:
        if np.dtype(t.dtype) == np.dtype(np.float64) or t.dtype.kind in "fiu":
            continue
        raise DTypeError(f"{what}: tensors of dtype {t.dtype} cannot be reduced")


# -- all_reduce
# -------------------------------------------------------------------------------------------------
def all_reduce(tensors: Any, op: str = "sum", weights: Sequence[float] | None = None) -> None:
    """Combine each tensor (Tensor, Node or NumPy array; one or a list) across the ranks, in place, so every
    rank holds the same result: op is sum, mean, max, min or prod; `weights` (one per rank, with sum) gives
    sum_r weights[r] * x_r. Tensors of one dtype travel as one collective. Every rank must make the same call
    with the same shapes; a rank that fails or does not arrive within the timeout raises DistributedError."""
    items = _as_list(tensors, "all_reduce")
    grp = runtime.group()
    if weights is not None:
        weights = [float(w) for w in weights]
        if len(weights) != grp.world_size:
            raise ValueError(f"all_reduce: {len(weights)} weights for {grp.world_size} ranks")
    for batch in _by_dtype(items):
        name = check_op(op, batch[0].dtype, weights)
        runtime.dispatcher().run(lambda b=batch, n=name: _all_reduce_one(grp, b, n, weights))


def _all_reduce_one(grp: ProcessGroup, items: list, op: str, weights: list[float] | None) -> None:
    hosts = [a for a in items if isinstance(a, np.ndarray)]
    tensors = [t for t in items if isinstance(t, Tensor)]
    for a in hosts:
        flat = c_order(a)
        grp.all_reduce(flat, op, weights)
        if flat is not a:
            a[...] = flat
    if not tensors or grp.world_size == 1 and weights is None:
        return
    _check_tensors(tensors, "all_reduce")
    work = [t if t.is_contiguous() else t.contiguous() for t in tensors]  # strided ones go through a copy
    all_reduce_contiguous(grp, work, op, weights)
    for t, w in zip(tensors, work):
        if w is not t:
            t.copy_(w)


def all_reduce_contiguous(
    grp: ProcessGroup, tensors: list[Tensor], op: str, weights: list[float] | None
) -> None:
    """The all-reduce of contiguous tensors of one dtype and queue, in place, on this thread (the caller is
    the collective worker: all_reduce above, or DistributedDataParallel's buckets)."""
    total = sum(t.size for t in tensors)
    dtype = np.dtype(tensors[0].dtype)
    if isinstance(grp, ShmGroup):
        if device_sums(tensors[0]):
            _device_sum_all_reduce(grp, tensors, total, dtype, op, weights)
            return
        own = grp.stage(total * dtype.itemsize).view(dtype)
        copy_out(_pieces(tensors, own))
        bounds = grp.reduce_staged(total, dtype, op, weights)
        copy_in(
            _spans(tensors, [(lo, hi, grp.half(r).view(dtype)[lo:hi]) for r, (lo, hi) in enumerate(bounds)])
        )
        grp.end_call()
        return
    host = np.empty(total, dtype)
    copy_out(_pieces(tensors, host))
    grp.all_reduce(host, op, weights)
    copy_in(_pieces(tensors, host))


def _spans(
    tensors: Sequence[Tensor], chunks: Sequence[tuple[int, int, np.ndarray]]
) -> list[tuple[Tensor, np.ndarray]]:
    """(piece of a tensor, host array) pairs where the contiguous tensors, laid end to end, meet the host
    `chunks` (start, stop, array) that tile their elements."""
    pairs, offset = [], 0
    for t in tensors:
        flat = t.reshape(-1)
        for lo, hi, host in chunks:
            a, b = max(lo, offset), min(hi, offset + t.size)
            if a < b:
                pairs.append((flat[a - offset : b - offset], host[a - lo : b - lo]))
        offset += t.size
    return pairs


def _device_sum_all_reduce(grp: ShmGroup, tensors: list[Tensor], total: int, dtype: np.dtype, op: str,
                           weights: list[float] | None) -> None:
    """The shm all-reduce with this rank's chunk summed on the device (see the module docstring)."""
    q = tensors[0].queue
    single = len(tensors) == 1
    flat = tensors[0].reshape(-1) if single else Tensor.empty(q, (total,), dtype)
    if not single:  # packed into one flat tensor on the device
        offset = 0
        for t in tensors:
            flat[offset : offset + t.size].copy_(t.reshape(-1))
            offset += t.size
    own = grp.stage(total * dtype.itemsize).view(dtype)
    bounds = chunk_bounds(total, grp.world_size, dtype.itemsize)
    lo, hi = bounds[grp.rank]
    others = [(r, a, b) for r, (a, b) in enumerate(bounds) if r != grp.rank and b > a]
    copy_out([(flat[a:b], own[a:b]) for _, a, b in others])  # the pieces the other ranks sum
    grp.enter_all_reduce(total, dtype, op)
    if hi > lo:
        parts = []
        for r in range(grp.world_size):
            if r == grp.rank:
                part = flat[lo:hi]
            else:
                part = Tensor.empty(q, (hi - lo,), dtype)
                copy_in([(part, grp.half(r).view(dtype)[lo:hi])])
            parts.append(ops.mul(part, weights[r]) if weights is not None else part)
        combine = _DEVICE_OPS[op]
        while len(parts) > 1:  # a pairwise tree: (x0 + x1) + (x2 + x3) ...
            parts = [combine(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i]
                     for i in range(0, len(parts), 2)]
        result = ops.mul(parts[0], 1.0 / grp.world_size) if op == "mean" else parts[0]
        flat[lo:hi].copy_(result)
        copy_out([(flat[lo:hi], own[lo:hi])])
    grp.leave_all_reduce(total, dtype, op)
    copy_in([(flat[a:b], grp.half(r).view(dtype)[a:b]) for r, a, b in others])
    grp.end_call()
    if not single:
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.size].reshape(t.shape))
            offset += t.size


# -- broadcast, all_gather, barrier
# ---------------------------------------------------------------------------
def broadcast(tensors: Any, src: int = 0) -> None:
    """Overwrite each tensor (Tensor, Node or NumPy array; one or a list) with rank `src`'s, in place."""
    items = _as_list(tensors, "broadcast")
    grp = runtime.group()
    src = grp.check_root(src)
    for batch in _by_dtype(items):
        runtime.dispatcher().run(lambda b=batch: _broadcast_one(grp, b, src))


def _broadcast_one(grp: ProcessGroup, items: list, src: int) -> None:
    for a in items:
        if isinstance(a, np.ndarray):
            flat = c_order(a)
            grp.broadcast(flat, src)
            if flat is not a:
                a[...] = flat
    tensors = [t for t in items if isinstance(t, Tensor)]
    if not tensors or grp.world_size == 1:
        return
    _check_tensors(tensors, "broadcast")
    work = [t if t.is_contiguous() else t.contiguous() for t in tensors]
    dtype = np.dtype(work[0].dtype)
    total = sum(t.size for t in work)
    if isinstance(grp, ShmGroup):  # the source's segment is read straight onto every other device
        own = grp.stage(total * dtype.itemsize).view(dtype)
        if grp.rank == src:
            copy_out(_pieces(work, own))
        grp.sync(BROADCAST, total * dtype.itemsize, src)
        if grp.rank != src:
            copy_in(_pieces(work, grp.half(src).view(dtype)[:total]))
        grp.end_call()
    else:
        host = np.empty(total, dtype)
        if grp.rank == src:
            copy_out(_pieces(work, host))
        grp.broadcast(host, src)
        if grp.rank != src:
            copy_in(_pieces(work, host))
    for t, w in zip(tensors, work):
        if w is not t:
            t.copy_(w)


def all_gather(tensor: Any) -> list[Tensor] | np.ndarray:
    """Every rank's `tensor`, in rank order: for a Tensor (or Node), a list of world_size() tensors on its
    queue
    (views of one (world_size, *shape) tensor); for a NumPy array, one array of shape (world_size, *shape).
    Every rank must pass the same shape and dtype."""
    if isinstance(tensor, (np.generic, int, float)) and not isinstance(tensor, bool):
        tensor = np.asarray(tensor)  # a number: gathered as a 0-d array
    (item,) = _as_list(tensor, "all_gather")
    grp = runtime.group()
    if isinstance(item, np.ndarray):
        return runtime.dispatcher().run(lambda: grp.all_gather(item))
    _check_tensors([item], "all_gather")
    out = Tensor.empty(item.queue, (grp.world_size,) + tuple(item.shape), item.dtype)
    if grp.world_size == 1:
        out[0].copy_(item)
        return [out[0]]

    def gather() -> None:
        src = item if item.is_contiguous() else item.contiguous()
        dtype, n = np.dtype(src.dtype), src.size
        if isinstance(grp, ShmGroup):  # every segment is written straight onto this device
            own = grp.stage(n * dtype.itemsize).view(dtype)
            copy_out([(src, own[:n])])
            grp.sync(ALL_GATHER, n * dtype.itemsize)
            copy_in([(out[r].reshape(-1), grp.half(r).view(dtype)[:n]) for r in range(grp.world_size)])
            grp.end_call()
        else:
            host = np.empty(n, dtype)
            copy_out([(src, host)])
            gathered = grp.all_gather(host)
            copy_in([(out.reshape(-1), gathered.reshape(-1))])

    runtime.dispatcher().run(gather)
    return [out[r] for r in range(grp.world_size)]


def barrier() -> None:
    """Wait until every rank has called barrier() (after the collectives started before it have finished)."""
    grp = runtime.group()
    runtime.dispatcher().run(grp.barrier)
