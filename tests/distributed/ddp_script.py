"""One rank of the DDP test (run by tests/distributed/test_ddp.py under `netcl run` or mpiexec): five AdamW
steps
of a small MLP on this rank's share of each batch of 24; rank 0 saves the parameters to argv[1] (argv[2]: the
bucket size in MiB)."""

from __future__ import annotations

import sys

import numpy as np

import netcl.autograd as ag
import netcl.distributed as dist
from netcl import nn, optim
from netcl.core.device import manager
from netcl.core.tensor import Tensor
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
    sys.stdout.write(
        f"rank {dist.rank()} buckets {len(ddp.buckets)} started during backward "
        f"{ddp.started['during']} at its end {ddp.started['at_end']}\n"
    )  # one write: lines stay whole
    sys.stdout.flush()
    if dist.rank() == 0:
        np.savez(sys.argv[1], **{k: v.to_host() for k, v in model.state_dict().items()})
    check_no_sync_and_unused(q)


class TwoHeads(nn.Module):
    """Rank r's loss uses head r % 2 only: the other head gets no gradient on this rank."""

    def __init__(self, q):
        super().__init__()
        self.body = nn.Linear(q, FEATURES, 6)
        self.heads = nn.Sequential(nn.Linear(q, 6, CLASSES), nn.Linear(q, 6, CLASSES))

    def forward(self, x):
        return self.heads[dist.rank() % 2](ag.tanh(self.body(x)))


def check_no_sync_and_unused(q) -> None:
    """no_sync() leaves each rank's own gradients; the next backward averages them, with zeros for a parameter
    a
    rank never used (the other ranks' average reaches it all the same)."""
    model = TwoHeads(q)
    ddp = dist.DistributedDataParallel(model, bucket_mb=0.0002)
    x, y = data()
    xb = Tensor.from_host(q, x[dist.rank() :: dist.world_size()][:10])
    yb = Tensor.from_host(q, y[dist.rank() :: dist.world_size()][:10])

    def backward():
        with ag.Tape() as tape:
            loss = ag.cross_entropy(ddp(ag.tensor(xb)), ag.tensor(yb))
        tape.backward(loss)

    with ddp.no_sync():
        backward()
    params = model.parameters()
    local = [np.zeros(p.shape, np.float32) if p.grad is None else p.grad.to_host() for p in params]
    model.zero_grad()
    backward()
    for p, mine in zip(params, local):
        want = dist.all_gather(mine).mean(axis=0)
        np.testing.assert_allclose(p.grad.to_host(), want, rtol=1e-5, atol=1e-7)
    # per-rank batches of different sizes: DDP weights each rank's gradient by its share of the global batch
    w = dist.world_size()
    share = (dist.rank() + 1) / (w * (w + 1) / 2)
    weighted = TwoHeads(q)
    wddp = dist.DistributedDataParallel(weighted, sample_share=share)
    with wddp.no_sync():  # local gradients first (the hooks are on the parameters)
        with ag.Tape() as tape:
            loss = ag.cross_entropy(wddp(ag.tensor(xb)), ag.tensor(yb))
        tape.backward(loss)
    local = [
        np.zeros(p.shape, np.float32) if p.grad is None else p.grad.to_host() for p in weighted.parameters()
    ]
    weighted.zero_grad()
    with ag.Tape() as tape:
        loss = ag.cross_entropy(wddp(ag.tensor(xb)), ag.tensor(yb))
    tape.backward(loss)
    shares = dist.all_gather(np.array(share))
    for p, mine in zip(weighted.parameters(), local):
        want = np.tensordot(shares, dist.all_gather(mine), axes=1)
        np.testing.assert_allclose(p.grad.to_host(), want, rtol=1e-5, atol=1e-7)
    check_empty_parameter(q)
    sys.stdout.write(f"rank {dist.rank()} no_sync and unused parameters ok\n")
    sys.stdout.flush()


def check_empty_parameter(q) -> None:
    """A parameter with no elements (a Linear of 0 inputs) travels in its bucket as nothing: the copies of 0
    bytes OpenCL refuses are not made, and the bias beside it is averaged."""
    model = nn.Linear(q, 0, CLASSES)
    ddp = dist.DistributedDataParallel(model)
    rows = dist.rank() + 1
    with ag.Tape() as tape:
        loss = ddp(ag.tensor(Tensor.empty(q, (rows, 0)))).sum()
    tape.backward(loss)
    w = dist.world_size()
    assert model.weight.grad.shape == (CLASSES, 0)
    np.testing.assert_allclose(model.bias.grad.to_host(), np.full(CLASSES, (w + 1) / 2))


if __name__ == "__main__":
    main()
