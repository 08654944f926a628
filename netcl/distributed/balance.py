"""Throughput-balanced data parallelism: each rank's share of every global batch in proportion to its measured
speed, re-measured as the run goes, with the gradient weights that make the update one device's on the whole
batch.

A rank's speed is its samples over the seconds from DistributedDataParallel's forward to the moment its last
gradient exists on the device (`ddp.last_pass["compute_s"]`: waiting for the other ranks is not in it). Shares
proportional to measured speeds have one fixed point, equal compute times on every rank, and re-measuring
walks toward it, so a rank's fixed costs (launches, the optimizer) need no model of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from netcl import config
from netcl.core.tensor import Tensor
from netcl.distributed import collectives, runtime
from netcl.distributed.ddp import DistributedDataParallel

NAME_BYTES = 96  # a device's description, as exchanged between the ranks


def proportional_shares(global_batch: int, rates: Sequence[float]) -> list[int]:
    """Split `global_batch` samples in proportion to `rates` (one per rank): integer shares, each >= 1,
    summing to global_batch; one sample each first, the rest by rate, leftovers to the largest remainders
    (ties to lower ranks). The same rates give the same shares on every rank."""
    if not isinstance(global_batch, (int, np.integer)) or isinstance(global_batch, bool):
        raise TypeError(f"global batch must be an integer, got {type(global_batch).__name__}")
    speeds = np.asarray(rates, np.float64).reshape(-1)
    world = len(speeds)
    if world == 0:
        raise ValueError("no rates given: one per rank")
    if global_batch < world:
        raise ValueError(f"a global batch of {global_batch} cannot give each of {world} ranks a sample")
    if not np.all(np.isfinite(speeds)) or not np.all(speeds > 0):
        raise ValueError(f"rates must be finite numbers > 0, got {speeds.tolist()}")
    spare = int(global_batch) - world
    exact = speeds / speeds.sum() * spare
    shares = np.floor(exact).astype(np.int64)
    order = sorted(range(world), key=lambda r: (-(exact[r] - shares[r]), r))
    for r in order[: spare - int(shares.sum())]:
        shares[r] += 1
    return [int(s) + 1 for s in shares]


def batch_shares(global_batch: int, speed: float) -> list[int]:
    """Split `global_batch` samples between the ranks in proportion to each rank's `speed` (samples per
    second, or any rate; every rank passes its own): proportional_shares of the gathered speeds. A
    collective: every rank calls it. Pair with DistributedSampler(shares=...) and
    DistributedDataParallel.set_shares; Balancer measures the speeds itself."""
    grp = runtime.group()
    rate = float(speed)
    if not rate > 0 or not np.isfinite(rate):
        raise ValueError(f"batch_shares: speed must be a finite number > 0, got {speed!r}")
    if isinstance(global_batch, (int, np.integer)) and not isinstance(global_batch, bool):
        if global_batch < grp.world_size:  # before the collective: every rank raises the same
            raise ValueError(f"batch_shares: a global batch of {global_batch} cannot give each of "
                             f"{grp.world_size} ranks a sample")
    rates = collectives.all_gather(np.array([rate], np.float64)).reshape(-1)
    return proportional_shares(global_batch, rates)


def _gather_names(text: str) -> list[str]:
    raw = np.zeros(NAME_BYTES, np.uint8)
    data = text.encode()[:NAME_BYTES]
    raw[: len(data)] = np.frombuffer(data, np.uint8)
    return [bytes(row).rstrip(b"\0").decode(errors="replace") for row in collectives.all_gather(raw)]


class Balancer:
    """This rank's rows of every global batch of `global_batch` samples, balanced by measured throughput.

    `ddp`: the DistributedDataParallel whose gradients get the share weights. `mode`: `auto` (balance when the
    ranks' devices differ, else equal shares), `on`, `off` (equal shares); default NETCL_DIST_BALANCE.
    Shares start equal; after `warmup` steps (program builds) and `first` measured steps they follow the
    measured speeds, then are measured again every `every` steps (a step after a change is not measured: new
    shapes may build programs). Shares change only when one moves by more than `tolerance` of the global
    batch.
    `log` (rank 0's logger or None) hears each change. Call step() after each optimizer step (batches() does);
    every rank makes the same calls, so the re-measurements are collectives in step."""

    def __init__(self, ddp: DistributedDataParallel, global_batch: int, mode: str | None = None,
                 every: int = 10, warmup: int = 1, first: int = 2, tolerance: float = 0.03,
                 log: Callable[[str], None] | None = None):
        if not isinstance(ddp, DistributedDataParallel):
            raise TypeError(f"Balancer balances a DistributedDataParallel, got {type(ddp).__name__}")
        mode = config.dist_balance() if mode is None else mode
        if mode not in config.BALANCE_MODES:
            raise ValueError(f"balance mode {mode!r}: expected one of {', '.join(config.BALANCE_MODES)}")
        for name, value, low in (("every", every, 1), ("warmup", warmup, 0), ("first", first, 1)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
                raise ValueError(f"Balancer: {name} must be an integer >= {low}, got {value!r}")
        if not 0 <= tolerance < 1:
            raise ValueError(f"Balancer: tolerance is a fraction of the global batch in [0, 1), got "
                             f"{tolerance!r}")
        self.ddp = ddp
        self.group = ddp.group
        self.rank, self.world = self.group.rank, self.group.world_size
        self.global_batch = int(global_batch)
        self.every, self.warmup, self.first, self.tolerance = int(every), int(warmup), int(first), tolerance
        self.log = log
        self.devices = _gather_names(self._device().describe() if self._device() is not None else "no device")
        differ = len(set(self.devices)) > 1
        self.mode = mode
        self.active = mode == "on" or (mode == "auto" and differ)
        self.steps = 0
        self.window: list[float] = []  # this rank's samples per second, one per measured step
        self.skip = self.warmup  # steps not to measure before the next one counts
        self.rates: list[float] | None = None  # the ranks' speeds at the last re-measurement
        self.changes: list[tuple[int, list[int]]] = []  # (step, new shares) of each change
        self.shares = proportional_shares(self.global_batch, [1.0] * self.world)
        self._apply(self.shares)

    def _device(self) -> Any:
        params = self.ddp.module.parameters()
        return params[0].value.device if params else None

    # -- this rank's part ------------------------------------------------------------------------------------
    @property
    def share(self) -> int:
        return self.shares[self.rank]

    @property
    def rows(self) -> slice:
        """This rank's rows of a global batch."""
        start = sum(self.shares[: self.rank])
        return slice(start, start + self.share)

    @property
    def fractions(self) -> list[float]:
        return [s / self.global_batch for s in self.shares]

    def split(self, batch: Any) -> Any:
        """This rank's rows of a global batch (a Tensor, an array, or a tuple/list of them: each the same)."""
        if isinstance(batch, (tuple, list)):
            return type(batch)(self.split(b) for b in batch)
        if len(batch) != self.global_batch:
            raise ValueError(f"Balancer.split: a batch of {len(batch)} rows, but the global batch is "
                             f"{self.global_batch}")
        part = batch[self.rows]
        return part.contiguous() if isinstance(part, Tensor) and not part.is_contiguous() else part

    def batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """This rank's rows of each global batch of `loader`; step() is called before every batch after the
        first (the previous step is done by then)."""
        for i, batch in enumerate(loader):
            if i:
                self.step()
            yield self.split(batch)

    # -- measuring -------------------------------------------------------------------------------------------
    def step(self) -> bool:
        """Count a finished step (its pass's compute time); at a re-measurement, gather the ranks' speeds and
        move the shares. Returns whether the shares changed."""
        self.steps += 1
        if not self.active:
            return False
        seconds = self.ddp.last_pass.pop("compute_s", None)  # each pass counted once
        if self.skip > 0:
            self.skip -= 1
        elif seconds is not None and seconds > 0:
            self.window.append(self.share / seconds)
        wanted = self.first if self.rates is None else self.every
        if len(self.window) < wanted:
            return False
        mine = float(np.median(self.window))
        self.window = []
        rates = collectives.all_gather(np.array([mine], np.float64)).reshape(-1).tolist()
        return self.rebalance(rates)

    def rebalance(self, rates: Sequence[float]) -> bool:
        """New shares from the ranks' speeds (the same list on every rank); returns whether they changed."""
        self.rates = [float(r) for r in rates]
        new = proportional_shares(self.global_batch, self.rates)
        moved = max(abs(a - b) for a, b in zip(new, self.shares))
        if moved == 0 or moved <= self.tolerance * self.global_batch:
            return False
        old, self.shares = self.shares, new
        self._apply(new)
        self.changes.append((self.steps, new))
        self.skip = 1
        if self.log is not None:
            speeds = ", ".join(f"{r:,.0f}" for r in self.rates)
            self.log(f"balance: after step {self.steps}, shares {old} -> {new} of {self.global_batch} "
                     f"(measured {speeds} samples/s)")
        return True

    def _apply(self, shares: list[int]) -> None:
        if len(set(shares)) == 1:
            self.ddp.set_shares(None)  # equal shares: the plain mean
        else:
            self.ddp.set_shares([s / self.global_batch for s in shares])

    def describe(self) -> list[str]:
        """One line per rank: its device and its share (for the log)."""
        how = {"on": "balanced by measured speed", "off": "equal shares (--balance off)",
               "auto": "balanced by measured speed (the devices differ)" if self.active else
               "equal shares (the devices are alike; --balance on measures anyway)"}[self.mode]
        lines = [f"data parallel: {self.world} ranks, global batch {self.global_batch}, {how}"]
        for r, (name, share) in enumerate(zip(self.devices, self.shares)):
            lines.append(f"rank {r}: {name}, share {share} of {self.global_batch} "
                         f"({share / self.global_batch:.1%})")
        return lines
