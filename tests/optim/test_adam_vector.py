"""AdamW on CPUs runs 8 lanes at a time over each work-item's chunk: parameters larger than a chunk,
with offsets into their buffers and lengths that leave scalar tails, against the NumPy formula."""

from __future__ import annotations

import math

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import optim
from netcl.core.tensor import Tensor
from tests.reference import assert_close


@pytest.mark.parametrize("decoupled,amsgrad", [(True, False), (False, False), (True, True)])
def test_adam_large_and_offset_parameters(queue, rng, decoupled, amsgrad):
    storage = Tensor.from_host(queue, rng.standard_normal((40, 13)).astype(np.float32))
    p_offset = ag.Parameter(storage[3:30])  # contiguous rows at an element offset of 39: 351 elements
    p_big = ag.Parameter(Tensor.from_host(queue, rng.standard_normal(1003).astype(np.float32)))
    params = [p_offset, p_big]
    hosts = [p.value.to_host().astype(np.float64) for p in params]
    before = storage.to_host()
    cls = optim.AdamW if decoupled else optim.Adam
    lr, wd, b1, b2, eps = 0.01, 0.05, 0.9, 0.6 if amsgrad else 0.999, 1e-8
    opt = cls(params, lr=lr, betas=(b1, b2), weight_decay=wd, amsgrad=amsgrad)
    m = [np.zeros_like(h) for h in hosts]
    v = [np.zeros_like(h) for h in hosts]
    vmax = [np.zeros_like(h) for h in hosts]
    for step in range(1, 4):
        for i, p in enumerate(params):
            g = rng.standard_normal(p.shape).astype(np.float32)
            p.grad = Tensor.from_host(queue, g)
            g = g.astype(np.float64)
            if decoupled:
                hosts[i] = hosts[i] * (1 - lr * wd)
            else:
                g = g + wd * hosts[i]
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            bc1, bc2 = 1 - b1**step, 1 - b2**step
            vmax[i] = np.maximum(vmax[i], v[i])
            denominator = vmax[i] if amsgrad else v[i]
            hosts[i] = hosts[i] - lr / bc1 * m[i] / (np.sqrt(denominator) / math.sqrt(bc2) + eps)
        opt.step()
    for p, h in zip(params, hosts):
        assert_close(p.value, h, np.float32, rtol=1e-5, atol=1e-6)
    after = storage.to_host()  # rows outside the parameter's view are not written
    assert np.array_equal(after[:3], before[:3]) and np.array_equal(after[30:], before[30:])
