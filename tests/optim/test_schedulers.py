"""Learning-rate schedules against hand-derived values, and their state_dict round trips."""

from __future__ import annotations

import math

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import optim
from netcl.core.tensor import Tensor


@pytest.fixture
def opt(queue):
    return optim.SGD([ag.Parameter(Tensor.ones(queue, (2,)))], lr=1.0, momentum=0.9)


def _run(sched, n):
    lrs = [sched.get_last_lr()[0]]
    for _ in range(n):
        sched.step()
        lrs.append(sched.get_last_lr()[0])
    return lrs


def test_step_lr(opt):
    assert _run(optim.StepLR(opt, step_size=2, gamma=0.5), 5) == [1, 1, 0.5, 0.5, 0.25, 0.25]


def test_cosine_annealing(opt):
    lrs = _run(optim.CosineAnnealing(opt, T_max=4, eta_min=0.1), 4)
    want = [0.1 + 0.9 * (1 + math.cos(math.pi * t / 4)) / 2 for t in range(5)]
    np.testing.assert_allclose(lrs, want)
    assert lrs[-1] == pytest.approx(0.1)


def test_warmup_cosine(opt):
    lrs = _run(optim.WarmupCosine(opt, warmup_steps=2, total_steps=6), 7)
    np.testing.assert_allclose(lrs[:3], [0.5, 1.0, 1.0])
    assert lrs[4] == pytest.approx(0.5)  # half way through the 4 cosine steps
    assert lrs[6] == 0.0 and lrs[7] == 0.0


def test_one_cycle(opt):
    sched = optim.OneCycle(opt, max_lr=2.0, total_steps=10, pct_start=0.3)
    lrs = _run(sched, 9)
    assert lrs[0] == pytest.approx(2.0 / 25)
    assert lrs[2] == pytest.approx(2.0)  # peak at pct_start * total - 1
    assert lrs[9] == pytest.approx(2.0 / 25 / 1e4)
    assert all(a >= b for a, b in zip(lrs[2:], lrs[3:]))
    assert opt.param_groups[0]["momentum"] == pytest.approx(0.95)  # back to max momentum at the end
    with pytest.raises(ValueError, match="total_steps"):
        sched.step()
        sched.step()


def test_reduce_on_plateau(opt):
    sched = optim.ReduceLROnPlateau(opt, factor=0.5, patience=1, cooldown=1)
    for metric, lr in [(1.0, 1.0), (1.0, 1.0), (1.0, 0.5), (1.0, 0.5), (1.0, 0.5), (1.0, 0.25), (0.1, 0.25)]:
        sched.step(metric)
        assert opt.param_groups[0]["lr"] == lr


@pytest.mark.parametrize(
    "make",
    [
        lambda o: optim.StepLR(o, 3),
        lambda o: optim.CosineAnnealing(o, 10),
        lambda o: optim.WarmupCosine(o, 3, 10),
        lambda o: optim.OneCycle(o, 1.0, 20),
    ],
)
def test_scheduler_state_dict(queue, make):
    o1 = optim.SGD([ag.Parameter(Tensor.ones(queue, (1,)))], lr=1.0, momentum=0.9)
    s1 = make(o1)
    for _ in range(4):
        s1.step()
    o2 = optim.SGD([ag.Parameter(Tensor.ones(queue, (1,)))], lr=1.0, momentum=0.9)
    s2 = make(o2)
    s2.load_state_dict(s1.state_dict())
    assert o2.param_groups[0]["lr"] == o1.param_groups[0]["lr"]
    s1.step()
    s2.step()
    assert s2.get_last_lr() == s1.get_last_lr()


def test_plateau_state_dict(opt, queue):
    s1 = optim.ReduceLROnPlateau(opt, patience=0)
    s1.step(1.0)
    s1.step(2.0)
    o2 = optim.SGD([ag.Parameter(Tensor.ones(queue, (1,)))], lr=1.0)
    s2 = optim.ReduceLROnPlateau(o2, patience=0)
    s2.load_state_dict(s1.state_dict())
    assert o2.param_groups[0]["lr"] == pytest.approx(0.1) and s2.best == 1.0
