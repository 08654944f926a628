"""DistributedSampler: which samples of each epoch this rank trains on, when several processes share the data.

Each epoch's order (a permutation from (seed, epoch), or 0..n-1) is cut into consecutive groups of
sum(shares) samples, and rank r takes its share of every group: with one share per rank (the default) rank r
gets samples r, r + W, r + 2W, ... of the order, as PyTorch's DistributedSampler does; with per-rank batch
sizes as shares (netcl.distributed.batch_shares), step i's batches of all ranks together are exactly step
i's batch of one process training on the global batch. The order is padded by repeating its beginning so
every rank gets the same number of groups (drop_last=True drops the incomplete group instead).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl.distributed import runtime


def _integer(value: Any, what: str, minimum: int) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be an integer >= {minimum}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return int(value)


class DistributedSampler:
    """This rank's sample indices for each epoch (see the module docstring).

    num_samples: the dataset's length (or the dataset: anything with len()); num_replicas and rank default to
    netcl.distributed's world_size() and rank(); shares: one positive integer per rank (default all 1);
    shuffle, seed and drop_last as in DataLoader. Pass it to DataLoader(..., sampler=sampler); set_epoch(e)
    (or the loader's) picks the epoch, the same on every rank."""

    def __init__(self, num_samples: Any, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 shares: Sequence[int] | None = None):
        if not isinstance(num_samples, numbers.Integral) and hasattr(num_samples, "__len__"):
            num_samples = len(num_samples)
        self.num_samples = _integer(num_samples, "DistributedSampler: num_samples", 0)
        if num_replicas is None or rank is None:
            runtime.check_joined("DistributedSampler")
            num_replicas = runtime.world_size() if num_replicas is None else num_replicas
            rank = runtime.rank() if rank is None else rank
        self.num_replicas = _integer(num_replicas, "DistributedSampler: num_replicas", 1)
        self.rank = _integer(rank, "DistributedSampler: rank", 0)
        if self.rank >= self.num_replicas:
            raise ValueError(
                f"DistributedSampler: rank {self.rank} is not below num_replicas {self.num_replicas}"
            )
        if shares is None:
            shares = [1] * self.num_replicas
        if len(shares) != self.num_replicas:
            raise ValueError(f"DistributedSampler: {len(shares)} shares for {self.num_replicas} ranks")
        self.shares = [_integer(s, "DistributedSampler: each share", 1) for s in shares]
        if not isinstance(shuffle, (bool, np.bool_)) or not isinstance(drop_last, (bool, np.bool_)):
            raise TypeError("DistributedSampler: shuffle and drop_last must be True or False")
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.seed = _integer(seed, "DistributedSampler: seed", 0)
        self.epoch = 0
        self.group_size = sum(self.shares)
        self.start = sum(self.shares[: self.rank])
        groups = (
            self.num_samples // self.group_size if self.drop_last else -(-self.num_samples // self.group_size)
        )
        if self.num_samples == 0:
            groups = 0
        self.groups = groups

    def __len__(self) -> int:
        return self.groups * self.shares[self.rank]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = _integer(epoch, "DistributedSampler.set_epoch: epoch", 0)

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's sample indices for `epoch` (default: the current one), in order."""
        e = self.epoch if epoch is None else _integer(epoch, "DistributedSampler.indices: epoch", 0)
        n = self.num_samples
        order = np.random.default_rng([self.seed, e]).permutation(n) if self.shuffle else np.arange(n)
        total = self.groups * self.group_size
        if total > n:  # pad by repeating the beginning (as often as needed when the data is tiny)
            order = np.resize(order, total)
        grouped = order[:total].reshape(self.groups, self.group_size)
        return grouped[:, self.start : self.start + self.shares[self.rank]].reshape(-1)

    def __iter__(self) -> Any:
        return iter(self.indices().tolist())

    def __repr__(self) -> str:
        return (f"DistributedSampler({self.num_samples} samples, rank {self.rank} of {self.num_replicas}, "
                f"{len(self)} per epoch)")
