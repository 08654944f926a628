"""Mixed-precision kernels under Oclgrind: bfloat16/float16 storage in generated elementwise and reduction
kernels (vector and strided paths), optim.cl with float32 master weights and the found-inf flag, the
GradScaler kernels (unscale_grads over several gradients of odd sizes with atomics, update_scale), clipping
and losses on half inputs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import netcl.autograd as ag
from netcl import amp, ops, optim
from netcl.ops import update
from tests.oclgrind.cases import close, dev, oclgrind_only, strided

pytestmark = oclgrind_only
BF16 = np.dtype(ml_dtypes.bfloat16)
HALVES = pytest.mark.parametrize("dt", [np.dtype(np.float16), BF16], ids=["float16", "bfloat16"])


@HALVES
def test_half_elementwise_and_reductions(queue, dt):
    rng = np.random.default_rng(21)
    a = rng.standard_normal((5, 37)).astype(np.float32)
    x = dev(queue, a.astype(dt))
    y = ops.tanh(x) * 2 + 1  # contiguous: vector loads and stores
    close(y, (np.tanh(a.astype(dt).astype(np.float64)) * 2 + 1), 2e-2, 2e-2)
    s = strided(queue, a.astype(dt))  # a strided view: scalar loads
    close(ops.cast(s, np.float32), a.astype(dt).astype(np.float32), 0, 0)
    close(ops.sum(x, axis=1), a.astype(dt).astype(np.float64).sum(1), 2e-2, 5e-2)
    close(ops.softmax(x, -1).astype(np.float32).sum(-1), np.ones(5), 2e-2, 2e-2)


@HALVES
def test_master_weight_step_and_loss_scaling(queue, dt):
    """Half parameters of odd sizes in one launch (master weights, state), the scaler's unscale over
    several gradients with an injected inf (flag set by atomics), the skipped step and the scale update."""
    rng = np.random.default_rng(22)
    shapes = [(7, 3), (17,), (1,)]
    params = [ag.Parameter(dev(queue, rng.standard_normal(s).astype(dt))) for s in shapes]
    opt = optim.AdamW(params, lr=0.01)
    scaler = amp.GradScaler(init_scale=4.0, growth_interval=1)
    with ag.Tape() as tape:
        loss = ag.sum(ag.mul(params[0], params[0]))
        for p in params[1:]:
            loss = ag.add(loss, ag.sum(p))
    tape.backward(scaler.scale(loss))
    before = [p.value.to_host() for p in params]
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 8.0
    for p, b in zip(params, before):
        assert not np.array_equal(p.value.to_host(), b)
    g = params[1].grad.to_host()
    g[3] = np.inf
    params[1].grad = dev(queue, g)
    before = [p.value.to_host() for p in params]
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 4.0
    for p, b in zip(params, before):
        assert np.array_equal(p.value.to_host(), b)


@HALVES
def test_clip_and_losses_on_half(queue, dt):
    rng = np.random.default_rng(23)
    grads = [rng.standard_normal(s).astype(dt) for s in ((7, 3), (17,))]
    params = [ag.Parameter(dev(queue, np.zeros(g.shape, dt))) for g in grads]
    for p, g in zip(params, grads):
        p.grad = dev(queue, g)
    total = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads))
    close(optim.clip_grad_norm_(params, max_norm=1.0), [total], 1e-5, 1e-5)
    x = rng.standard_normal((5, 7)).astype(dt)
    y = rng.integers(0, 7, 5).astype(np.int32)
    with ag.Tape() as tape:
        node = ag.tensor(dev(queue, x), requires_grad=True)
        loss = ag.cross_entropy(node, dev(queue, y))
    tape.backward(loss)
    assert loss.value.dtype == np.float32 and node.grad.dtype == dt
    mse = ag.mse(dev(queue, x), dev(queue, x[::-1].copy()))
    close(mse.value, [((x.astype(np.float64) - x[::-1].astype(np.float64)) ** 2).mean()], 1e-5, 1e-5)


def test_update_scale_growth_and_backoff(queue):
    scale = dev(queue, np.array([2.0], np.float32))
    tracker = dev(queue, np.array([0], np.int32))
    flag = dev(queue, np.array([0], np.int32))
    for _ in range(2):
        update.update_scale(scale, tracker, flag, 2.0, 0.5, 2)
    close(scale, [4.0], 0, 0)
    flag = dev(queue, np.array([1], np.int32))
    update.update_scale(scale, tracker, flag, 2.0, 0.5, 2)
    close(scale, [2.0], 0, 0)
