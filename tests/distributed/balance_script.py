"""One rank of the balancing tests (tests/distributed/test_balance.py), started by `netcl run --nproc 2`:
SGD steps of ddp_script's MLP on this rank's rows of every global batch of 24, split by a Balancer that
re-measures every 2 steps. A test-only hook slows one rank: its forward sleeps SLOW_S per sample it holds
(a device 10-100x slower than the other), rank 1 for steps < SWITCH, rank 0 from SWITCH on. argv[1]: where
rank 0 saves the parameters and the shares of every step; argv[2]: `run`, `die` (rank 1 exits at step
DIE_AT) or `exclude`: rank 1 sleeps OUT_S a sample before SWITCH (worth less than it costs: left out, the
Balancer knowing the optimizer), then both ranks sleep EVEN_S (measured again after PROBE steps, it takes part
again); every rank saves its parameters (argv[1] with the rank before the suffix). `third` (3 ranks): ranks 0
and 1 sleep EVEN_S a sample, rank 2 4 * OUT_S throughout and is never measured again: two ranks all-reduce,
the third adds zeros; every rank saves. `die-out`: as `exclude`, and rank 1 exits at step DIE_AT, while it
is left out."""

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
OUT_S, EVEN_S, PROBE = 0.05, 0.005, 4
LR, MOMENTUM = 0.1, 0.9


class Throttled(nn.Module):
    """`inner`, made slower on the ranks and steps `slow(step)` names: a sleep per sample of the batch."""

    def __init__(self, inner: nn.Module, mode: str = "run"):
        super().__init__()
        self.inner = inner
        self.step = 0
        self.mode = mode

    def forward(self, x):
        if self.mode == "third":
            # two ranks share the batch at 60 ms each (alone 120): more than a busy host's all-reduce costs
            # (a GPU machine running the suite on 16 processes once left rank 1 out at EVEN_S / 5)
            delay = 4 * OUT_S if dist.rank() == 2 else EVEN_S
        elif self.mode in ("exclude", "die-out"):
            delay = (OUT_S if dist.rank() == 1 else 0.0) if self.step < SWITCH else EVEN_S
        else:
            delay = SLOW_S if dist.rank() == (1 if self.step < SWITCH else 0) else 0.0
        time.sleep(delay * x.shape[0])
        return self.inner(x)


def loader(q) -> DataLoader:
    x, y = ddp_script.data()
    return DataLoader((x, y), GLOBAL_BATCH, q, shuffle=True, seed=5, drop_last=True)


def train(model: nn.Module, batches, opt, on_step=None) -> None:
    for step, batch in enumerate(batches):
        if step == STEPS:
            break
        if batch is not None:  # None: this rank is left out of the step
            xb, yb = batch
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
    throttled = Throttled(model, mode)
    ddp = dist.DistributedDataParallel(throttled)
    opt = optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    balancer = dist.Balancer(ddp, GLOBAL_BATCH, mode="on", every=2, warmup=1, first=1, tolerance=0.0,
                             optimizer=opt if mode in ("exclude", "third", "die-out") else None,
                             probe=0 if mode == "third" else PROBE,
                             log=say if dist.rank() == 0 else None)
    shares: list[list[int]] = []

    def on_step(step: int) -> None:
        shares.append(list(balancer.shares))  # the shares this step trained with
        if mode in ("die", "die-out") and dist.rank() == 1 and step == DIE_AT:
            os._exit(1)
        throttled.step = step + 1

    # the data of each step: steps run forever (the loader repeats epochs) until STEPS
    def epochs():
        while True:
            yield from loader(q)

    t0 = time.monotonic()
    try:
        train(ddp, balancer.batches(epochs()), opt, on_step)
    except dist.DistributedError as exc:
        say(f"rank {dist.rank()} DistributedError after {time.monotonic() - t0:.1f}s "
            f"ranks={list(exc.ranks)}: {exc}")
        sys.exit(3)
    balancer.synchronize()  # a rank left out at the end gets the working ranks' weights
    say(f"rank {dist.rank()} shares {shares} changes {balancer.changes} left out {balancer.left_out_at}")
    if dist.rank() == 0 or mode in ("exclude", "third"):
        path = out if dist.rank() == 0 else out.replace(".npz", f".rank{dist.rank()}.npz")
        np.savez(path, shares=np.array(shares), **{k: v.to_host() for k, v in model.state_dict().items()})


if __name__ == "__main__":
    main()
