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
from netcl.errors import NetclError
from netcl.optim.optimizer import Optimizer

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


def plan_shares(global_batch: int, rates: Sequence[float], sync_s: float = 0.0,
                margin: float = 0.05) -> tuple[list[int], list[str]]:
    """Which ranks take part, and their shares: for the k fastest ranks (k = 1..N), the step takes the
    longest rank's time on its share (`share / rate` seconds; proportional_shares, then evened out where
    rounding left one rank longest; one sample is the floor, however slow the rank) plus `sync_s` (the
    all-reduce a step pays, measured; none for one rank).
    The most ranks whose step is within `margin` of the fastest choice take part; the others get share 0.
    Returns (shares, one line per left-out rank saying why)."""
    speeds = np.asarray(rates, np.float64).reshape(-1)
    if not np.isfinite(sync_s) or sync_s < 0:
        raise ValueError(f"sync_s is the seconds a step's all-reduce costs, >= 0; got {sync_s!r}")
    if not 0 <= margin < 1:
        raise ValueError(f"margin is a fraction in [0, 1), got {margin!r}")
    proportional_shares(global_batch, speeds)  # checks the batch and the rates
    order = sorted(range(len(speeds)), key=lambda r: (-speeds[r], r))
    plans = []
    for k in range(1, min(len(speeds), int(global_batch)) + 1):
        ranks = sorted(order[:k])
        shares = _even_out(proportional_shares(global_batch, speeds[ranks]), speeds[ranks])
        seconds = max(s / speeds[r] for s, r in zip(shares, ranks)) + (sync_s if k > 1 else 0.0)
        plans.append((ranks, shares, seconds))
    best = min(p[2] for p in plans)
    ranks, shares, seconds = max((p for p in plans if p[2] <= best * (1 + margin)), key=lambda p: len(p[0]))
    full = [0] * len(speeds)
    for r, s in zip(ranks, shares):
        full[r] = s
    reasons = []
    if len(ranks) < len(speeds):
        everyone = plans[-1]
        for r in sorted(set(range(len(speeds))) - set(ranks)):
            floor = everyone[1][everyone[0].index(r)] / speeds[r] if r in everyone[0] else float("inf")
            reasons.append(
                f"rank {r} ({speeds[r]:,.1f} samples/s) is worth less than it costs: with it a step takes "
                f"{everyone[2] * 1e3:,.1f} ms (its share alone {floor * 1e3:,.1f} ms, the all-reduce "
                f"{sync_s * 1e3:,.1f} ms), without it {seconds * 1e3:,.1f} ms"
            )
    return full, reasons


def _even_out(shares: list[int], speeds: np.ndarray) -> list[int]:
    """Move samples one at a time from the rank that takes longest (`share / speed`) to the one that would
    take least with one more, while that shortens the step: rounding can give a slow rank a second sample
    that doubles its time."""
    shares = list(shares)
    while len(shares) > 1:
        times = [s / v for s, v in zip(shares, speeds)]
        i = max(range(len(shares)), key=lambda r: (times[r], -r))
        if shares[i] <= 1:
            break
        j = min((r for r in range(len(shares)) if r != i), key=lambda r: ((shares[r] + 1) / speeds[r], r))
        if (shares[j] + 1) / speeds[j] >= times[i]:
            break
        shares[i] -= 1
        shares[j] += 1
    return shares


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

    Leaving a rank out (`optimizer` given): at each measurement plan_shares weighs what a rank brings (its
    share of the work) against what it costs (the all-reduce every step, and the one sample it holds at
    least, which the others wait for); a rank worth less gets share 0. It then runs no forward or backward;
    when one rank is left working there is no all-reduce in a step (only a handshake without data in step(),
    so a left-out rank is never more than a step behind), else the left-out ranks add zeros to the
    all-reduce. Their weights and `optimizer`'s state fall behind and are copied to them from the first
    working rank (synchronize) when they are needed: before a left-out rank 0 writes a checkpoint (the
    commands call it; a left-out rank does not evaluate) and when they come back. `probe` steps after a rank
    is left out, it takes part again for one measurement (its weights brought up to date first); left out
    again, it waits twice as long before the next (0: never measured again). Without `optimizer` no rank is
    left out (one sample each).
    `log` (rank 0's logger or None) hears each change. Call step() after each optimizer step (batches() does);
    every rank makes the same calls, so the re-measurements are collectives in step."""

    def __init__(self, ddp: DistributedDataParallel, global_batch: int, mode: str | None = None,
                 every: int = 10, warmup: int = 1, first: int = 2, tolerance: float = 0.03,
                 log: Callable[[str], None] | None = None, optimizer: Optimizer | None = None,
                 probe: int = 200, margin: float = 0.05):
        if not isinstance(ddp, DistributedDataParallel):
            raise TypeError(f"Balancer balances a DistributedDataParallel, got {type(ddp).__name__}")
        mode = config.dist_balance() if mode is None else mode
        if mode not in config.BALANCE_MODES:
            raise ValueError(f"balance mode {mode!r}: expected one of {', '.join(config.BALANCE_MODES)}")
        for name, value, low in (("every", every, 1), ("warmup", warmup, 0), ("first", first, 1),
                                 ("probe", probe, 0)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
                raise ValueError(f"Balancer: {name} must be an integer >= {low}, got {value!r}")
        if not 0 <= tolerance < 1:
            raise ValueError(f"Balancer: tolerance is a fraction of the global batch in [0, 1), got "
                             f"{tolerance!r}")
        if not 0 <= margin < 1:
            raise ValueError(f"Balancer: margin is a fraction of a step in [0, 1), got {margin!r}")
        if optimizer is not None and not isinstance(optimizer, Optimizer):
            raise TypeError(f"Balancer: optimizer must be a netcl.optim Optimizer (its state is copied to a "
                            f"rank that was left out), got {type(optimizer).__name__}")
        self.ddp = ddp
        self.group = ddp.group
        self.rank, self.world = self.group.rank, self.group.world_size
        if not isinstance(global_batch, (int, np.integer)) or isinstance(global_batch, bool):
            raise TypeError(f"Balancer: global_batch is the samples of one step on all ranks together, an "
                            f"integer; got {global_batch!r}")
        self.global_batch = int(global_batch)
        if self.global_batch < self.world:
            raise ValueError(f"Balancer: a global batch of {global_batch} cannot give each of {self.world} "
                             "ranks a sample")
        self.every, self.warmup, self.first, self.tolerance = int(every), int(warmup), int(first), tolerance
        self.optimizer, self.probe, self.margin = optimizer, int(probe), float(margin)
        self.log = log
        self.devices = _gather_names(self._device().describe() if self._device() is not None else "no device")
        differ = len(set(self.devices)) > 1
        self.mode = mode
        self.active = mode == "on" or (mode == "auto" and differ)
        self.steps = 0
        self.window: list[float] = []  # this rank's samples per second, one per measured step
        self.sync_window: list[float] = []  # seconds from its last gradient to the all-reduce's end
        self.counted = 0  # steps measured since the last re-measurement (the same on every rank)
        self.skip = self.warmup  # steps not to measure before the next one counts
        self.rates: list[float] | None = None  # the ranks' speeds at the last re-measurement
        self.known: list[float] = [float("nan")] * self.world  # each rank's last measured speed
        self.sync_s = 0.0  # what a step's all-reduce costs the job, measured (the least any rank waited)
        self.changes: list[tuple[int, list[int]]] = []  # (step, new shares) of each change
        self.left_out_at: list[tuple[int, list[int]]] = []  # (step, ranks) each time ranks are left out
        self.stale = False  # the left-out ranks' weights are behind the working ranks'
        self.probe_at: int | None = None  # the step at which the left-out ranks are measured again
        self.probe_gap = self.probe
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
    def working(self) -> bool:
        """Whether this rank has rows of the global batch (False: left out; skip the step, call step())."""
        return self.share > 0

    @property
    def left_out(self) -> list[int]:
        return [r for r, s in enumerate(self.shares) if s == 0]

    @property
    def rows(self) -> slice:
        """This rank's rows of a global batch."""
        start = sum(self.shares[: self.rank])
        return slice(start, start + self.share)

    @property
    def fractions(self) -> list[float]:
        return [s / self.global_batch for s in self.shares]

    def split(self, batch: Any) -> Any:
        """This rank's rows of a global batch (a Tensor, an array, or a tuple/list of them: each the same);
        None when this rank is left out (share 0): it runs no step, only step()."""
        if isinstance(batch, (tuple, list)):
            parts = type(batch)(self.split(b) for b in batch)
            return None if self.share == 0 else parts
        if len(batch) != self.global_batch:
            raise ValueError(f"Balancer.split: a batch of {len(batch)} rows, but the global batch is "
                             f"{self.global_batch}")
        if self.share == 0:
            return None
        part = batch[self.rows]
        return part.contiguous() if isinstance(part, Tensor) and not part.is_contiguous() else part

    def batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """This rank's rows of each global batch of `loader` (None where it is left out: skip that step);
        step() is called before every batch after the first (the previous step is done by then)."""
        for i, batch in enumerate(loader):
            if i:
                self.step()
            yield self.split(batch)

    # -- measuring -------------------------------------------------------------------------------------------
    def step(self) -> bool:
        """Count a finished step (its pass's compute time); a left-out rank takes its part in the step's
        collectives here. At a re-measurement, gather the ranks' speeds and move the shares. Returns whether
        the shares changed."""
        self.steps += 1
        if not self.active:
            return False
        if self.share == 0:
            self.ddp.idle_pass()  # the all-reduce the working ranks run (none when one works alone)
            seconds = synced = None
        else:
            seconds = self.ddp.last_pass.pop("compute_s", None)  # each pass counted once
            synced = self.ddp.last_pass.pop("sync_s", None)
        if self.left_out:
            self.stale = True
            if sum(s > 0 for s in self.shares) == 1:
                # one rank works alone: nothing to balance and no all-reduce, only a handshake (no data) that
                # keeps the left-out ranks one step behind at most, so none waits longer than a step in a
                # collective (NETCL_DIST_TIMEOUT) and a rank that dies is still seen within a step
                collectives.barrier()
                if self.probe_at is None or self.steps < self.probe_at:
                    return False
            if self.probe_at is not None and self.steps >= self.probe_at:
                return self._readmit()
        if self.skip > 0:
            self.skip -= 1
            return False
        self.counted += 1
        if seconds is not None and seconds > 0:
            self.window.append(self.share / seconds)
            if synced is not None:
                self.sync_window.append(synced)
        wanted = self.first if self.rates is None else self.every
        if self.counted < wanted:
            return False
        mine = [float(np.median(self.window)) if self.window else np.nan,
                float(np.median(self.sync_window)) if self.sync_window else np.nan]
        self.window, self.sync_window, self.counted = [], [], 0
        gathered = collectives.all_gather(np.array(mine, np.float64))
        rates = [float(r) if np.isfinite(r) and r > 0 else self.known[i]
                 for i, r in enumerate(gathered[:, 0])]
        if not all(np.isfinite(r) and r > 0 for r in rates):
            return False  # a rank measured nothing yet (no pass ended): the next measurement decides
        syncs = gathered[:, 1][np.isfinite(gathered[:, 1])]
        if len(syncs) and sum(s > 0 for s in self.shares) > 1:
            self.sync_s = float(syncs.min())  # the rank that arrived last waited only for the transfer
        return self.rebalance(rates)

    def rebalance(self, rates: Sequence[float]) -> bool:
        """New shares from the ranks' speeds (the same list on every rank); returns whether they changed."""
        self.rates = [float(r) for r in rates]
        self.known = list(self.rates)
        reasons: list[str] = []
        if self.optimizer is not None:
            new, reasons = plan_shares(self.global_batch, self.rates, self.sync_s, self.margin)
        else:  # one sample a rank at least, evened out where rounding gave a slow rank one more
            new = _even_out(proportional_shares(self.global_batch, self.rates), np.asarray(self.rates))
        was_out = self.left_out
        now_out = [r for r, s in enumerate(new) if s == 0]
        moved = max(abs(a - b) for a, b in zip(new, self.shares))
        if now_out and self.probe and self.probe_at is None:
            self.probe_at = self.steps + self.probe_gap
        elif not now_out:
            self.probe_at, self.probe_gap = None, self.probe
        if now_out == was_out and (moved == 0 or moved <= self.tolerance * self.global_batch):
            return False
        old = self.shares
        if set(was_out) - set(now_out):
            self.synchronize()  # a rank that comes back starts from the working ranks' weights
        self._set(new)
        if self.log is not None:
            speeds = ", ".join(f"{r:,.0f}" for r in self.rates)
            self.log(f"balance: after step {self.steps}, shares {old} -> {new} of {self.global_batch} "
                     f"(measured {speeds} samples/s)")
            for r, line in zip(now_out, reasons):
                if r in was_out:
                    continue  # said when it was left out
                alone = "; no all-reduce: one rank works alone" if sum(s > 0 for s in new) == 1 else ""
                self.log(f"balance: {line}; left out (no samples, no step of its own{alone})")
            if now_out and self.probe_at is not None:
                self.log(f"balance: the left-out ranks {now_out} are measured again at step {self.probe_at}")
        if now_out:
            self.left_out_at.append((self.steps, now_out))
        return True

    def _set(self, new: list[int]) -> None:
        self.shares = new
        self._apply(new)
        self.changes.append((self.steps, new))
        self.skip = 1

    def _readmit(self) -> bool:
        """The probe: bring the left-out ranks' weights up to date and give every rank a share by its last
        speed again (one sample at least), to be measured afresh."""
        self.synchronize()
        out = self.left_out
        self.probe_at = None
        self.probe_gap *= 2  # the next probe waits twice as long (back to `probe` when they stay in)
        new = proportional_shares(self.global_batch, self.known)
        old = self.shares
        self._set(new)
        self.rates, self.window, self.sync_window, self.counted = None, [], [], 0
        if self.log is not None:
            self.log(f"balance: after step {self.steps}, ranks {out} take part again to be measured: shares "
                     f"{old} -> {new}")
        return True

    def synchronize(self, needed_by: Sequence[int] | None = None) -> None:
        """Bring the left-out ranks up to date: the first working rank's parameters, buffers and optimizer
        state copied to every rank. A collective (every rank calls it at the same point, e.g. before a
        checkpoint or an evaluation); nothing happens while every rank works, nor when none of the ranks
        `needed_by` names (e.g. [0], the one that writes checkpoints) is left out."""
        if not self.stale:
            return
        if needed_by is not None and not set(needed_by) & set(self.left_out):
            return
        source = next(r for r, s in enumerate(self.shares) if s > 0)
        module = self.ddp.module
        tensors: list[Tensor] = [p.value for p in module.parameters()] + module.buffers()
        if self.optimizer is not None:
            slots, steps = _optimizer_state(self.optimizer)
            present = np.array([t is not None for t in slots], np.uint8)
            theirs = present.copy()
            collectives.broadcast(theirs, src=source)
            if not np.array_equal(theirs, present):
                raise NetclError(
                    f"Balancer.synchronize: rank {self.rank}'s optimizer holds other state than rank "
                    f"{source}'s ({int(present.sum())} against {int(theirs.sum())} tensors); every rank "
                    "must make the same optimizer with the same settings")
            tensors += [t for t in slots if t is not None]
            collectives.broadcast(steps, src=source)
            _set_optimizer_steps(self.optimizer, steps)
        if tensors:
            collectives.broadcast(tensors, src=source)
        self.stale = False

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
        if self.active and self.optimizer is not None:
            lines[0] += "; a rank worth less than its all-reduce and its one-sample floor is left out"
        for r, (name, share) in enumerate(zip(self.devices, self.shares)):
            lines.append(f"rank {r}: {name}, share {share} of {self.global_batch} "
                         f"({share / self.global_batch:.1%})" + (", left out" if share == 0 else ""))
        return lines


def _optimizer_state(optimizer: Optimizer) -> tuple[list[Tensor | None], np.ndarray]:
    """The optimizer's state tensors in a fixed order (None where a slot is empty), each parameter's step."""
    names = (*optimizer.slot_names, "master")
    slots: list[Tensor | None] = []
    steps = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            st = optimizer.state.get(id(p)) or {}
            steps.append(int(st.get("step", -1)))
            slots += [st.get(name) if isinstance(st.get(name), Tensor) else None for name in names]
    return slots, np.array(steps, np.int64)


def _set_optimizer_steps(optimizer: Optimizer, steps: np.ndarray) -> None:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for p, step in zip(params, steps.tolist()):
        st = optimizer.state.get(id(p))
        if st is not None and step >= 0:
            st["step"] = int(step)
