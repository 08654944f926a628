"""The one-host backend: each rank owns a POSIX shared-memory segment (multiprocessing.shared_memory) that
every other rank maps too, and a socket to every other rank (netcl.distributed.mesh) for the handshakes.

all_reduce is a reduce-scatter and an all-gather through the segments. Each rank copies its data into its
own segment (a Tensor is read from the device straight into it), then, once every rank has (sync 1), sums
chunk r of the data, reading chunk r of every rank's segment in rank order, and writes the sum into its own
segment (sync 2); the result is then read chunk by chunk from the rank that summed it (a Tensor is written
to the device straight from those chunks). Every rank maps every segment, so the reduce-scatter needs no
ring of neighbour hops: each rank reads each byte it needs once, in one step, and the whole collective costs
two handshakes whatever the number of ranks. Every chunk is summed by one rank only, so all ranks get
bit-identical results.

Each segment holds two halves used by alternate collectives, so a rank may fill its next half while a slower
rank still reads the last one (a rank refills a half only after a handshake that every rank reaches after
it has finished with that half). Segments grow together (every rank asks for the same size, as every rank
makes the same calls) and each is unlinked as soon as every rank has mapped it: no name is left in /dev/shm
whatever happens to the processes afterwards (kill -9 included); the memory goes when the last mapping does.
"""

from __future__ import annotations

from collections.abc import Sequence
from multiprocessing import resource_tracker, shared_memory

import numpy as np

from netcl.core.hostcopy import copy_bytes, in_slices
from netcl.distributed.group import (
    DTYPE_CODES,
    OP_CODES,
    ProcessGroup,
    c_order,
    check_op,
    chunk_bounds,
    reduce_into,
)
from netcl.distributed.mesh import GONE, SYNC, Mesh
from netcl.errors import DistributedError

ALL_REDUCE, REDUCED, BROADCAST, ALL_GATHER, BARRIER, GROW = 1, 2, 3, 4, 5, 6
_KIND_NAMES = {ALL_REDUCE: "all_reduce", REDUCED: "all_reduce (summed)", BROADCAST: "broadcast",
               ALL_GATHER: "all_gather", BARRIER: "barrier", GROW: "growing the shared buffers"}
_DTYPES = {code: dt for dt, code in DTYPE_CODES.items()}
_OPS = {code: name for name, code in OP_CODES.items()}
MIN_HALF = 1 << 20


def _describe(nbytes: int, code: int) -> str:
    kind, arg, dtype = code >> 16, (code >> 8) & 0xFF, code & 0xFF
    name = _KIND_NAMES.get(kind, f"call {kind}")
    if kind in (ALL_REDUCE, REDUCED):
        return f"{name}({_OPS.get(arg, '?')}) of {nbytes} bytes of {_DTYPES.get(dtype, '?')}"
    if kind == BROADCAST:
        return f"{name} from rank {arg} of {nbytes} bytes"
    if kind == ALL_GATHER:
        return f"{name} of {nbytes} bytes"
    if kind == GROW:
        return f"{name} to {nbytes} bytes"
    return name


class _Segment(shared_memory.SharedMemory):
    """A SharedMemory that, when collected while a NumPy view of it is still alive (at exit, in a traceback's
    frames), leaves the mapping to the process's end instead of printing BufferError."""

    def __del__(self) -> None:
        try:
            self.close()
        except BufferError:
            pass


def _attach(name: str) -> shared_memory.SharedMemory:
    seg = _Segment(name=name)
    # Python 3.11 registers a segment with its resource tracker on attach too, which would unlink it when this
    # process exits; the owner unlinks it (right after everyone has mapped it), so attached ones are not ours
    resource_tracker.unregister(seg._name, "shared_memory")
    return seg


class ShmGroup(ProcessGroup):
    """The ranks of job `job` on this host (see the module docstring)."""

    backend = "shm"

    def __init__(self, rank: int, world_size: int, job: str, timeout: float):
        super().__init__(rank, world_size)
        self.job = job
        self.mesh = Mesh(rank, world_size, job, timeout)
        self._sync_seq = 0
        self.calls = 0  # collectives made: the parity picks the half
        self.generation = 0
        self.half_bytes = 0
        self._segments: list[shared_memory.SharedMemory | None] = [None] * world_size
        self._maps: list[np.ndarray | None] = [None] * world_size
        self._retired: list[shared_memory.SharedMemory] = []

    # -- handshakes
    # -------------------------------------------------------------------------------------------
    def sync(self, kind: int, nbytes: int, arg: int = 0, dtype: np.dtype | None = None) -> None:
        """Every rank reaches this point of call #calls with the same (kind, size, op, dtype)."""
        code = kind << 16 | arg << 8 | (DTYPE_CODES[np.dtype(dtype)] if dtype is not None else 0)
        what = f"{_KIND_NAMES[kind]} (collective #{self.calls})"
        seq = self._sync_seq
        self._sync_seq += 1
        self.mesh.send(range(self.world_size), SYNC, seq, nbytes, code, what)
        self.mesh.wait(range(self.world_size), SYNC, seq, nbytes, code, what, _describe)

    @property
    def failed(self) -> DistributedError | None:
        return self.mesh.failed

    # -- the shared segments -------------------------------------------------------------------------------
    def _name(self, rank: int, generation: int) -> str:
        return f"{self.job}-r{rank}-g{generation}"

    def stage(self, nbytes: int) -> np.ndarray:
        """This rank's half for the coming collective, as `nbytes` bytes (uint8), growing every rank's segment
        first when it is too small (a collective step: every rank asks for the same size). The first
        collective maps the segments even when it moves nothing (an empty tensor: no half to slice before)."""
        if nbytes > self.half_bytes or not self.half_bytes:
            self._grow(nbytes)
        return self.half(self.rank)[:nbytes]

    def half(self, rank: int) -> np.ndarray:
        """Rank `rank`'s half for the current collective (uint8, the whole half)."""
        start = (self.calls % 2) * self.half_bytes
        return self._maps[rank][start : start + self.half_bytes]

    def _grow(self, nbytes: int) -> None:
        half = max(-(-nbytes // MIN_HALF) * MIN_HALF, 2 * self.half_bytes, MIN_HALF)
        generation = self.generation + 1
        name = self._name(self.rank, generation)
        try:
            own = _Segment(name=name, create=True, size=2 * half)
        except FileExistsError:
            raise DistributedError(
                f"shared memory {name} exists already: another job with id {self.job}?"
            ) from None
        except OSError as exc:
            raise DistributedError(
                f"rank {self.rank} could not create {2 * half} bytes of shared memory "
                f"(/dev/shm/{name}): {exc}"
            ) from None
        try:
            self.sync(GROW, half)
            segments = [
                own if r == self.rank else _attach(self._name(r, generation)) for r in range(self.world_size)
            ]
            self.sync(GROW, half)
        except BaseException:
            own.close()
            own.unlink()
            raise
        own.unlink()  # every rank has it mapped: the name can go now (the memory stays while a mapping does)
        self._retire()
        self._segments = segments
        self._maps = [np.frombuffer(s.buf, np.uint8) for s in segments]
        self.half_bytes, self.generation = half, generation

    def _retire(self) -> None:
        old = [s for s in self._segments if s is not None] + self._retired
        self._maps = [None] * self.world_size
        self._segments = [None] * self.world_size
        self._retired = []
        for seg in old:
            try:
                seg.close()
            except BufferError:  # a view of it is still alive somewhere: close it later
                self._retired.append(seg)

    # -- collectives on host arrays ------------------------------------------------------------------------
    def all_reduce(self, array: np.ndarray, op: str = "sum", weights: Sequence[float] | None = None) -> None:
        array = self.check_array(array, "all_reduce")
        op = check_op(op, array.dtype, weights)
        flat = array.reshape(-1)
        own = self.stage(flat.nbytes)
        copy_bytes([(own, flat.view(np.uint8))])
        bounds = self.reduce_staged(flat.size, array.dtype, op, weights)
        size = array.dtype.itemsize
        copy_bytes([(flat[lo:hi].view(np.uint8), self.half(r)[lo * size : hi * size])
                    for r, (lo, hi) in enumerate(bounds)])
        self.end_call()

    def reduce_staged(self, count: int, dtype: np.dtype, op: str, weights: Sequence[float] | None = None,
                      gather: bool = False) -> list[tuple[int, int]]:
        """The all-reduce of `count` elements already in every rank's staged half: sync, sum this rank's chunk
        into its own half, sync. Returns the chunk bounds; chunk r's result is in rank r's half (or, with
        `gather`, all of it in this rank's half). The caller reads the results, then calls end_call()."""
        dtype = np.dtype(dtype)
        self.enter_all_reduce(count, dtype, op)
        bounds = chunk_bounds(count, self.world_size, dtype.itemsize)
        lo, hi = bounds[self.rank]
        halves = [self.half(r).view(dtype) for r in range(self.world_size)]
        scale = 1.0 / self.world_size if op == "mean" else None
        in_slices(lambda a, b: reduce_into(halves[self.rank][lo + a : lo + b],
                                           [h[lo + a : lo + b] for h in halves], op, weights, scale),
                  hi - lo, dtype.itemsize)
        self.leave_all_reduce(count, dtype, op)
        if gather:
            own = halves[self.rank]
            for r, (a, b) in enumerate(bounds):
                if r != self.rank:
                    np.copyto(own[a:b], halves[r][a:b])
        return bounds

    def enter_all_reduce(self, count: int, dtype: np.dtype, op: str) -> None:
        """Sync 1 of an all-reduce: every rank's data is in its staged half."""
        self.sync(ALL_REDUCE, count * np.dtype(dtype).itemsize, OP_CODES[op], dtype)

    def leave_all_reduce(self, count: int, dtype: np.dtype, op: str) -> None:
        """Sync 2 of an all-reduce: every rank has summed its chunk into its own half."""
        self.sync(REDUCED, count * np.dtype(dtype).itemsize, OP_CODES[op], dtype)

    def end_call(self) -> None:
        self.calls += 1

    def broadcast(self, array: np.ndarray, root: int = 0) -> None:
        array = self.check_array(array, "broadcast")
        root = self.check_root(root)
        flat = array.reshape(-1).view(np.uint8)
        own = self.stage(flat.nbytes)
        if self.rank == root:
            np.copyto(own, flat)
        self.sync(BROADCAST, flat.nbytes, root)
        if self.rank != root:
            np.copyto(flat, self.half(root)[: flat.nbytes])
        self.end_call()

    def all_gather(self, array: np.ndarray) -> np.ndarray:
        array = c_order(array)
        flat = array.reshape(-1).view(np.uint8)
        own = self.stage(flat.nbytes)
        np.copyto(own, flat)
        self.sync(ALL_GATHER, flat.nbytes)
        out = np.empty((self.world_size,) + array.shape, array.dtype)
        rows = out.reshape(self.world_size, -1).view(np.uint8)
        for r in range(self.world_size):
            rows[r] = self.half(r)[: flat.nbytes]
        self.end_call()
        return out

    def barrier(self) -> None:
        self.sync(BARRIER, 0)
        self.end_call()

    def close(self) -> None:
        self._retire()
        self.mesh.close()

    def report_gone(self, ranks: list[int], message: str) -> DistributedError:
        return self.mesh.fail(message, ranks, GONE)
