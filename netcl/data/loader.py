"""DataLoader: shuffled mini-batches of host arrays, gathered by a background thread into pinned host
buffers and copied to the device asynchronously, so the next batch is ready while this one computes.

Shuffling is a function of (seed, epoch) only, so a run resumed at epoch e sees exactly the batches
an uninterrupted run would.
"""

from __future__ import annotations

import queue as queue_mod
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from netcl.core.backend import as_queue, enqueue_copy
from netcl.core.memory import pinned_empty
from netcl.core.tensor import Tensor
from netcl.errors import ShapeError


class ArrayDataset:
    """Equal-length host arrays (e.g. images and labels) indexed together."""

    def __init__(self, *arrays: np.ndarray):
        if not arrays:
            raise ValueError("ArrayDataset needs at least one array")
        n = len(arrays[0])
        for i, a in enumerate(arrays):
            if len(a) != n:
                raise ShapeError(f"ArrayDataset: array {i} has {len(a)} rows, array 0 has {n}")
        self.arrays = tuple(np.ascontiguousarray(a) for a in arrays)

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, idx: Any) -> tuple[np.ndarray, ...]:
        return tuple(a[idx] for a in self.arrays)


class DataLoader:
    """Iterate over (Tensor, ...) batches on `queue`.

    batch_size, shuffle (a fresh permutation per epoch from (seed, epoch)), drop_last; `prefetch`
    batches are prepared ahead by a background thread into pinned host memory and copied to the
    device without blocking. Each iteration is one epoch; set_epoch(e) picks the epoch (the loader
    also counts epochs itself)."""

    def __init__(
        self,
        dataset: ArrayDataset | Sequence[np.ndarray],
        batch_size: int,
        queue: Any,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        prefetch: int = 2,
    ):
        self.dataset = dataset if isinstance(dataset, ArrayDataset) else ArrayDataset(*dataset)
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.batch_size = int(batch_size)
        self.queue = as_queue(queue)
        self.shuffle, self.seed, self.drop_last = bool(shuffle), int(seed), bool(drop_last)
        self.prefetch = max(1, int(prefetch))
        self.epoch = 0
        self._slots: list[list[np.ndarray]] | None = None
        self._events: list[Any] = []

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def order(self, epoch: int | None = None) -> np.ndarray:
        """Sample order of an epoch."""
        n = len(self.dataset)
        e = self.epoch if epoch is None else epoch
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, e]).permutation(n)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.seed = int(state["epoch"]), int(state["seed"])

    def _ensure_slots(self) -> None:
        if self._slots is not None:
            return
        nslots = self.prefetch + 2
        self._slots = [
            [pinned_empty(self.queue, (self.batch_size,) + a.shape[1:], a.dtype) for a in self.dataset.arrays]
            for _ in range(nslots)
        ]
        self._events = [None] * nslots

    def __iter__(self) -> Iterator[tuple[Tensor, ...]]:
        self._ensure_slots()
        order = self.order()
        self.epoch += 1
        n_batches = len(self)
        slots, events = self._slots, self._events
        ready: queue_mod.Queue = queue_mod.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def produce() -> None:
            try:
                for b in range(n_batches):
                    idx = order[b * self.batch_size : (b + 1) * self.batch_size]
                    s = b % len(slots)
                    ev = events[s]
                    if ev is not None:
                        ev.wait()  # the previous copy out of this pinned slot has finished
                    for host, a in zip(slots[s], self.dataset.arrays):
                        np.take(a, idx, axis=0, out=host[: len(idx)])
                    while not stop.is_set():
                        try:
                            ready.put((s, len(idx)), timeout=0.1)
                            break
                        except queue_mod.Full:
                            continue
                    if stop.is_set():
                        return
            except BaseException as exc:  # surfaced in the consumer
                ready.put(exc)

        worker = threading.Thread(target=produce, name="netcl-dataloader", daemon=True)
        worker.start()
        try:
            for _ in range(n_batches):
                item = ready.get()
                if isinstance(item, BaseException):
                    raise item
                s, count = item
                batch = []
                event = None
                for host in slots[s]:
                    t = Tensor.empty(self.queue, (count,) + host.shape[1:], host.dtype)
                    if t.nbytes:
                        event = enqueue_copy(self.queue, t.buffer, host[:count], is_blocking=False)
                    batch.append(t)
                events[s] = event
                yield tuple(batch)
        finally:
            stop.set()
            worker.join(timeout=5)
