"""DataLoader: shuffled mini-batches of host arrays, gathered by a background thread into pinned host
buffers and copied to the device asynchronously, so the next batch is ready while this one computes.

Shuffling is a function of (seed, epoch) only, so a run resumed at epoch e sees exactly the batches
an uninterrupted run would.
"""

from __future__ import annotations

import numbers
import queue as queue_mod
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from netcl.core import dtypes
from netcl.core.backend import as_queue, enqueue_copy
from netcl.core.memory import pinned_empty
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, ShapeError


def _count(value: Any, what: str, minimum: int) -> int:
    """An integer (int or NumPy integer, not bool) >= minimum; 2.7 and "12" are TypeErrors, not truncated."""
    if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be an integer >= {minimum}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _flag(value: Any, what: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be True or False, got {type(value).__name__} {value!r}")
    return bool(value)


class ArrayDataset:
    """Equal-length host arrays (e.g. images and labels) indexed together: dataset[i] is a tuple of
    rows; i is an integer, a slice, or an integer or boolean array (NumPy's indexing along axis 0)."""

    def __init__(self, *arrays: np.ndarray):
        if not arrays:
            raise ValueError("ArrayDataset needs at least one array")
        converted = []
        for i, a in enumerate(arrays):
            try:
                arr = np.asarray(a)
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"ArrayDataset: array {i} is not an array ({type(a).__name__}: {exc})"
                ) from None
            if arr.ndim == 0:
                raise ShapeError(
                    f"ArrayDataset: array {i} is a scalar ({type(a).__name__} {a!r}); each array has one "
                    "row per sample"
                )
            converted.append(np.ascontiguousarray(arr))
        n = len(converted[0])
        for i, a in enumerate(converted):
            if len(a) != n:
                raise ShapeError(f"ArrayDataset: array {i} has {len(a)} rows, array 0 has {n}")
        self.arrays = tuple(converted)

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, idx: Any) -> tuple[np.ndarray, ...]:
        n = len(self)
        if isinstance(idx, numbers.Integral) and not isinstance(idx, (bool, np.bool_)):
            if not -n <= idx < n:
                raise IndexError(f"ArrayDataset index {idx} is out of range for {n} samples")
            return tuple(a[int(idx)] for a in self.arrays)
        if isinstance(idx, slice):
            return tuple(a[idx] for a in self.arrays)
        if isinstance(idx, (list, np.ndarray)):
            sel = np.asarray(idx)
            if sel.size == 0 and sel.dtype.kind == "f":
                sel = sel.astype(np.intp)  # [] is an empty selection
            if sel.dtype.kind == "b":
                if sel.shape != (n,):
                    raise IndexError(
                        f"ArrayDataset: a boolean index has shape {sel.shape}, the dataset has {n} samples"
                    )
            elif sel.dtype.kind in "iu":
                bad = sel[(sel < -n) | (sel >= n)]
                if bad.size:
                    raise IndexError(f"ArrayDataset index {bad.flat[0]} is out of range for {n} samples")
            else:
                raise TypeError(f"ArrayDataset indices must be integers, got an array of {sel.dtype}")
            return tuple(a[sel] for a in self.arrays)
        raise TypeError(
            "ArrayDataset indices are integers, slices, or integer or boolean arrays; "
            f"got {type(idx).__name__} {idx!r}"
        )


class DataLoader:
    """Iterate over (Tensor, ...) batches on `queue`.

    batch_size, shuffle (a fresh permutation per epoch from (seed, epoch)), drop_last; `prefetch`
    batches are prepared ahead by a background thread into pinned host memory and copied to the
    device without blocking. Each iteration is one epoch; set_epoch(e) picks the epoch (the loader
    also counts epochs itself).

    `dataset` is an ArrayDataset or a tuple (or list) of arrays, of dtypes netcl stores; batch_size
    is an integer >= 1, seed and epochs integers >= 0, prefetch an integer >= 1, shuffle and drop_last
    True or False. Sizes are never truncated: 2.7 and '12' are TypeErrors, and so is True.
    `sampler` (a netcl.data.DistributedSampler) picks which samples, in which order, each epoch has
    (it shuffles itself: shuffle stays False)."""

    def __init__(
        self,
        dataset: ArrayDataset | Sequence[np.ndarray],
        batch_size: int,
        queue: Any,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        prefetch: int = 2,
        sampler: Any = None,
    ):
        if isinstance(dataset, ArrayDataset):
            self.dataset = dataset
        elif isinstance(dataset, (tuple, list)):
            if isinstance(dataset, list) and len(dataset) > 2 and all(isinstance(s, tuple) for s in dataset):
                raise TypeError(
                    f"DataLoader: dataset is a list of {len(dataset)} tuples, which reads as samples "
                    "(PyTorch's map-style dataset); netcl takes one array per field, a row per sample: "
                    "stack them first, e.g. (np.stack([s[0] for s in samples]), "
                    "np.array([s[1] for s in samples]))"
                )
            self.dataset = ArrayDataset(*dataset)
        else:
            hint = "; wrap a single array as (x,)" if isinstance(dataset, np.ndarray) else ""
            raise TypeError(
                f"DataLoader: dataset must be an ArrayDataset or a tuple of arrays such as (x, y), "
                f"got {type(dataset).__name__}{hint}"
            )
        self.batch_size = _count(batch_size, "DataLoader: batch_size", 1)
        self.queue = as_queue(queue)
        self.shuffle = _flag(shuffle, "DataLoader: shuffle")
        self.seed = _count(seed, "DataLoader: seed", 0)
        self.drop_last = _flag(drop_last, "DataLoader: drop_last")
        self.prefetch = _count(prefetch, "DataLoader: prefetch", 1)
        if sampler is not None and not (hasattr(sampler, "indices") and hasattr(sampler, "__len__")):
            raise TypeError(f"DataLoader: sampler must be a DistributedSampler, got {type(sampler).__name__}")
        if sampler is not None and self.shuffle:
            raise ValueError(
                "DataLoader: pass shuffle to the sampler, not to the loader, when a sampler is given"
            )
        self.sampler = sampler
        for i, a in enumerate(self.dataset.arrays):
            if a.dtype not in dtypes.SUPPORTED:
                raise DTypeError(
                    f"DataLoader: array {i} has dtype {a.dtype}, which netcl does not store; "
                    f"convert it to one of {dtypes.names()}"
                )
            dtypes.check_supported_on(a.dtype, self.queue.device)
        self.epoch = 0
        self._slots: list[list[np.ndarray]] | None = None
        self._events: list[Any] = []

    def __len__(self) -> int:
        n = len(self.dataset) if self.sampler is None else len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = _count(epoch, "DataLoader.set_epoch: epoch", 0)

    def order(self, epoch: int | None = None) -> np.ndarray:
        """Sample order of an epoch."""
        n = len(self.dataset)
        e = self.epoch if epoch is None else _count(epoch, "DataLoader.order: epoch", 0)
        if self.sampler is not None:
            return self.sampler.indices(e)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, e]).permutation(n)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "seed": self.seed}

    def _check_state_dict(self, state: Any) -> dict[str, int]:
        """The checked state ({'epoch', 'seed'}, integers >= 0); changes nothing."""
        if not isinstance(state, Mapping):
            raise TypeError(f"DataLoader.load_state_dict: state must be a dict, got {type(state).__name__}")
        keys = ("epoch", "seed")
        unknown = [k for k in state if k not in keys]
        missing = [k for k in keys if k not in state]
        if unknown or missing:
            raise ValueError(
                f"DataLoader.load_state_dict: state holds {sorted(map(str, state))}, a DataLoader's holds "
                f"'epoch' and 'seed'"
            )
        return {k: _count(state[k], f"DataLoader.load_state_dict: {k}", 0) for k in keys}

    def load_state_dict(self, state: dict[str, int]) -> None:
        values = self._check_state_dict(state)
        self.epoch, self.seed = values["epoch"], values["seed"]

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
