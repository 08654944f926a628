"""One rank of the DDP test (run by tests/distributed/test_ddp.py under `netcl run` or mpiexec): five AdamW steps
of a small MLP on this rank's share of each batch of 24; rank 0 saves the parameters to argv[1] (argv[2]: the
bucket size in MiB)."""

from __future__ import annotations

import sys

import numpy as np

import netcl.autograd as ag
import netcl.distributed as dist
from netcl import nn, optim
from netcl.core.device import manager
from netcl.data import DataLoader, DistributedSampler
from netcl.ops import random

STEPS, BATCH, FEATURES, CLASSES = 5, 12, 7, 3


def build(q, seed: int = 3):
    random.manual_seed(seed)
    return nn.Sequential(nn.Linear(q, FEATURES, 16), nn.Tanh(), nn.Linear(q, 16, 8), nn.ReLU(),
                         nn.Linear(q, 8, CLASSES))


def data():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((STEPS * BATCH * 2, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, len(x)).astype(np.int32)
    return x, y


def train(model, loader, opt, steps=STEPS):
    for step, (xb, yb) in enumerate(loader):
        if step == steps:
            break
        with ag.Tape() as tape:
            loss = ag.cross_entropy(model(ag.tensor(xb)), ag.tensor(yb))
        tape.backward(loss)
        opt.step()
        opt.zero_grad()
    return model


def main() -> None:
    dist.init()
    q = manager.default("auto").queue
    model = build(q, seed=99 if dist.rank() == 1 else 3)  # DDP must start every rank from rank 0's weights
    ddp = dist.DistributedDataParallel(model, bucket_mb=float(sys.argv[2]) if len(sys.argv) > 2 else None)
    x, y = data()
    per_rank = BATCH * 2 // dist.world_size()
    sampler = DistributedSampler(len(x), shuffle=True, seed=5, shares=[per_rank] * dist.world_size())
    loader = DataLoader((x, y), per_rank, q, sampler=sampler)
    train(ddp, loader, optim.AdamW(ddp.parameters(), lr=0.05))
    if dist.rank() == 0:
        np.savez(sys.argv[1], **{k: v.to_host() for k, v in model.state_dict().items()})


if __name__ == "__main__":
    main()
