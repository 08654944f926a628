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


# PyTorch's other schedules (MultiStepLR ... SequentialLR were missing): each against torch's own over 30
# steps of two parameter groups, and its state_dict through JSON (a checkpoint's header) into a fresh one
def _torch_schedules(ts):
    return {
        "MultiStepLR": (lambda o: optim.MultiStepLR(o, [3, 7, 7, 12], 0.5),
                        lambda o: ts.MultiStepLR(o, [3, 7, 7, 12], 0.5)),
        "ExponentialLR": (lambda o: optim.ExponentialLR(o, 0.9), lambda o: ts.ExponentialLR(o, 0.9)),
        "LinearLR": (lambda o: optim.LinearLR(o, 0.1, 1.0, 6), lambda o: ts.LinearLR(o, 0.1, 1.0, 6)),
        "LinearLR decay": (lambda o: optim.LinearLR(o, 1.0, 0.0, 10), lambda o: ts.LinearLR(o, 1.0, 0.0, 10)),
        "ConstantLR": (lambda o: optim.ConstantLR(o, 0.25, 4), lambda o: ts.ConstantLR(o, 0.25, 4)),
        "PolynomialLR": (lambda o: optim.PolynomialLR(o, 10, 2.0), lambda o: ts.PolynomialLR(o, 10, 2.0)),
        "CosineAnnealingWarmRestarts": (lambda o: optim.CosineAnnealingWarmRestarts(o, 3, 2, 0.001),
                                        lambda o: ts.CosineAnnealingWarmRestarts(o, 3, 2, 0.001)),
        "LambdaLR": (lambda o: optim.LambdaLR(o, [lambda s: 1 / (s + 1), lambda s: min(1.0, (s + 1) / 5)]),
                     lambda o: ts.LambdaLR(o, [lambda s: 1 / (s + 1), lambda s: min(1.0, (s + 1) / 5)])),
        "SequentialLR": (
            lambda o: optim.SequentialLR(o, [optim.ConstantLR(o, 0.5, 3), optim.ExponentialLR(o, 0.8),
                                             optim.CosineAnnealingLR(o, 8, eta_min=1e-3)], [4, 10]),
            lambda o: ts.SequentialLR(o, [ts.ConstantLR(o, 0.5, 3), ts.ExponentialLR(o, 0.8),
                                          ts.CosineAnnealingLR(o, 8, eta_min=1e-3)], [4, 10])),
    }


@pytest.mark.parametrize("name", list(_torch_schedules(None)))
def test_pytorch_schedules_match_torch(queue, name):
    import json
    import warnings

    torch = pytest.importorskip("torch")
    make, make_torch = _torch_schedules(torch.optim.lr_scheduler)[name]

    def optimizers():
        ps, ts = [ag.Parameter(Tensor.ones(queue, (2,))) for _ in range(2)], [torch.ones(2) for _ in range(2)]
        return (optim.SGD([{"params": ps[:1], "lr": 0.1}, {"params": ps[1:]}], lr=0.03, momentum=0.9),
                torch.optim.SGD([{"params": ts[:1], "lr": 0.1}, {"params": ts[1:]}], lr=0.03, momentum=0.9))

    o, ot = optimizers()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's "lr_scheduler.step() before optimizer.step()"
        sched, torch_sched = make(o), make_torch(ot)
        for step in range(30):
            np.testing.assert_allclose(sched.get_last_lr(), torch_sched.get_last_lr(), rtol=1e-12, atol=1e-15)
            assert [g["lr"] for g in o.param_groups] == sched.get_last_lr()
            if step == 13:
                o2, _ = optimizers()
                resumed = make(o2)
                resumed.load_state_dict(json.loads(json.dumps(sched.state_dict())))
                assert resumed.get_last_lr() == sched.get_last_lr() == [g["lr"] for g in o2.param_groups]
                resumed.step()
            sched.step()
            torch_sched.step()
            if step == 13:
                assert resumed.get_last_lr() == sched.get_last_lr()


def test_pytorch_schedules_bad_input(opt):
    with pytest.raises(TypeError, match=r"MultiStepLR: milestones\[1\] must be an integer >= 0, got float"):
        optim.MultiStepLR(opt, [1, 2.5])
    with pytest.raises(ValueError, match=r"start_factor must be a finite number in \(0, 1\], got 0"):
        optim.LinearLR(opt, start_factor=0)
    with pytest.raises(ValueError, match="LambdaLR: lr_lambda is a list of 2 functions for 1 parameter"):
        optim.LambdaLR(opt, [abs, abs])
    with pytest.raises(TypeError, match="LambdaLR: lr_lambda must be a function of the step, got float"):
        optim.LambdaLR(opt, 0.5)
    with pytest.raises(ValueError, match=r"LambdaLR: lr_lambda\(0\) \(a factor of the lr\) must be .* >= 0"):
        optim.LambdaLR(opt, lambda s: -1.0)
    warm = optim.LinearLR(opt, 0.1, total_iters=3)
    with pytest.raises(ValueError, match="2 schedulers need 1 milestones, got 2"):
        optim.SequentialLR(opt, [warm, optim.ExponentialLR(opt, 0.9)], [3, 5])
    with pytest.raises(ValueError, match=r"milestones must increase, got \[5, 3\]"):
        optim.SequentialLR(opt, [warm, warm, warm], [5, 3])
    with pytest.raises(TypeError, match=r"schedulers\[1\] is a OneCycle; SequentialLR takes closed-form"):
        optim.SequentialLR(opt, [warm, optim.OneCycleLR(opt, 1.0, 10)], [3])
    seq = optim.SequentialLR(opt, [warm, optim.ExponentialLR(opt, 0.9)], [3])
    state = seq.state_dict()
    state["_schedulers"][1]["gamma"] = -1.0
    with pytest.raises(ValueError, match=r"_schedulers\[1\]: .*gamma must be a finite number >= 0, got -1.0"):
        seq.load_state_dict(state)
