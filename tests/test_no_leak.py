"""Memory does not grow over long loops: every freed Tensor goes back to the BufferPool."""

from __future__ import annotations

import gc

import numpy as np

import netcl.autograd as ag
import netcl.ops as ops
from netcl.core.tensor import Tensor
from netcl.nn import Linear, ReLU, Sequential
from netcl.optim import SGD


def _in_use(device) -> int:
    gc.collect()
    return device.pool.stats()["in_use"]


def test_ten_thousand_op_steps_do_not_leak(device, queue):
    x = Tensor.from_host(queue, np.linspace(-1, 1, 96, dtype=np.float32).reshape(8, 12))
    acc = ops.sum(x * 0.0)
    acc.realize()
    start = _in_use(device)
    for step in range(10_000):
        acc = acc + ops.sum(ops.tanh(x * (step % 7)), axis=None)
        if step % 1000 == 0:
            acc.realize()
    value = float(acc.to_host())
    del acc
    assert np.isfinite(value)
    assert _in_use(device) <= start


def test_training_steps_do_not_leak(device, queue):
    model = Sequential(Linear(q := queue, 12, 16), ReLU(), Linear(q, 16, 3))
    opt = SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = Tensor.from_host(queue, np.linspace(-1, 1, 96, dtype=np.float32).reshape(8, 12))
    y = Tensor.from_host(queue, np.arange(8, dtype=np.int32) % 3)

    def step():
        with ag.Tape() as tape:
            loss = ag.cross_entropy(model(ag.tensor(x)), ag.tensor(y))
        tape.backward(loss)
        opt.step()
        opt.zero_grad()
        return loss

    step().value.to_host()  # optimizer state and caches exist from here on
    start = _in_use(device)
    for _ in range(200):
        loss = step()
    final = float(loss.value.to_host()[0])
    del loss
    assert np.isfinite(final)
    assert _in_use(device) <= start
