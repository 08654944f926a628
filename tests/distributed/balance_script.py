"""One rank of the balancing tests (tests/distributed/test_balance.py), started by `netcl run --nproc 2`:
SGD steps of ddp_script's MLP on this rank's rows of every global batch of 24, split by a Balancer that
re-measures every 2 steps. A test-only hook slows one rank: its forward sleeps SLOW_S per sample it holds
(a device 10-100x slower than the other), rank 1 for steps < SWITCH, rank 0 from SWITCH on. argv[1]: where
rank 0 saves the parameters and the shares of every step; argv[2]: `run`, or `die` (rank 1 exits at step
DIE_AT)."""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import netcl.autograd as ag
import netcl.distributed as dist
from netcl import nn, optim
from netcl.core.device import manager
from netcl.data import DataLoader
from tests.distributed import ddp_script
from tests.distributed.launching import say

STEPS, SWITCH, GLOBAL_BATCH, SLOW_S, DIE_AT = 12, 6, 24, 0.01, 4
LR, MOMENTUM = 0.1, 0.9


class Throttled(nn.Module):
    """`inner`, made slower on the ranks and steps `slow(step)` names: a sleep per sample of the batch."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.step = 0

    def forward(self, x):
        slow_rank = 1 if self.step < SWITCH else 0
        if dist.rank() == slow_rank:
            time.sleep(SLOW_S * x.shape[0])
        return self.inner(x)


def loader(q) -> DataLoader:
    x, y = ddp_script.data()
    return DataLoader((x, y), GLOBAL_BATCH, q, shuffle=True, seed=5, drop_last=True)


def train(model: nn.Module, batches, opt, on_step=None) -> None:
    for step, (xb, yb) in enumerate(batches):
        if step == STEPS:
            break
        with ag.Tape() as tape:
            loss = ag.cross_entropy(model(ag.tensor(xb)), ag.tensor(yb))
        tape.backward(loss)
        opt.step()
        opt.zero_grad()
        if on_step is not None:
            on_step(step)


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    dist.init()
    q = manager.default("auto").queue
    model = ddp_script.build(q)
    throttled = Throttled(model)
    ddp = dist.DistributedDataParallel(throttled)
    balancer = dist.Balancer(ddp, GLOBAL_BATCH, mode="on", every=2, warmup=1, first=1, tolerance=0.0)
    shares: list[list[int]] = []

    def on_step(step: int) -> None:
        shares.append(list(balancer.shares))  # the shares this step trained with
        if mode == "die" and dist.rank() == 1 and step == DIE_AT:
            os._exit(1)
        throttled.step = step + 1

    # the data of each step: steps run forever (the loader repeats epochs) until STEPS
    def epochs():
        while True:
            yield from loader(q)

    opt = optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    t0 = time.monotonic()
    try:
        train(ddp, balancer.batches(epochs()), opt, on_step)
    except dist.DistributedError as exc:
        say(f"rank {dist.rank()} DistributedError after {time.monotonic() - t0:.1f}s "
            f"ranks={list(exc.ranks)}: {exc}")
        sys.exit(3)
    say(f"rank {dist.rank()} shares {shares} changes {balancer.changes}")
    if dist.rank() == 0:
        np.savez(out, shares=np.array(shares), **{k: v.to_host() for k, v in model.state_dict().items()})


if __name__ == "__main__":
    main()
