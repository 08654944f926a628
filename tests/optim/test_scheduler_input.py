"""Bad input to learning-rate schedulers: sizes are integers, values in range, state checked on load."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import optim
from netcl.core.tensor import Tensor

NAN = float("nan")


def _sgd(queue, groups=1):
    return optim.SGD(
        [{"params": [ag.Parameter(Tensor.ones(queue, (2,)))], "lr": 1.0} for _ in range(groups)], momentum=0.9
    )


# (make(optimizer, value), value, error, words)
BAD = [
    (
        lambda o, v: optim.StepLR(o, v),
        2.7,
        TypeError,
        "StepLR: step_size must be an integer >= 1, got float 2.7",
    ),
    (lambda o, v: optim.StepLR(o, v), "12", TypeError, "step_size.*got str '12'"),
    (lambda o, v: optim.StepLR(o, v), True, TypeError, "step_size.*got bool True"),
    (lambda o, v: optim.StepLR(o, v), 0, ValueError, "step_size must be an integer >= 1, got 0"),
    (
        lambda o, v: optim.StepLR(o, 2, gamma=v),
        -0.5,
        ValueError,
        "StepLR: gamma must be a finite number >= 0",
    ),
    (lambda o, v: optim.StepLR(o, 2, gamma=v), NAN, ValueError, "gamma.*got nan"),
    (
        lambda o, v: optim.StepLR(o, 2, last_epoch=v),
        1.5,
        TypeError,
        "StepLR: last_epoch must be an integer >= -1",
    ),
    (lambda o, v: optim.StepLR(o, 2, last_epoch=v), -2, ValueError, "last_epoch.*got -2"),
    (
        lambda o, v: optim.CosineAnnealing(o, v),
        10.0,
        TypeError,
        "CosineAnnealing: T_max must be an integer >= 1, got float",
    ),
    (lambda o, v: optim.CosineAnnealing(o, v), -3, ValueError, "T_max.*got -3"),
    (lambda o, v: optim.CosineAnnealing(o, 10, eta_min=v), "0", TypeError, "eta_min.*str"),
    (lambda o, v: optim.CosineAnnealing(o, 10, eta_min=v), -1.0, ValueError, "eta_min.*got -1.0"),
    (
        lambda o, v: optim.WarmupCosine(o, v, 10),
        2.5,
        TypeError,
        "WarmupCosine: warmup_steps must be an integer",
    ),
    (lambda o, v: optim.WarmupCosine(o, 2, v), "10", TypeError, "WarmupCosine: total_steps.*str"),
    (
        lambda o, v: optim.WarmupCosine(o, v, 10),
        -1,
        ValueError,
        "warmup_steps must be an integer >= 0, got -1",
    ),
    (
        lambda o, v: optim.WarmupCosine(o, v, 10),
        10,
        ValueError,
        "0 <= warmup_steps < total_steps, got 10, 10",
    ),
    (
        lambda o, v: optim.OneCycle(o, 1.0, v),
        2.5,
        TypeError,
        "OneCycle: total_steps must be an integer >= 1, got float 2.5",
    ),
    (lambda o, v: optim.OneCycle(o, 1.0, v), 0, ValueError, "total_steps.*got 0"),
    (lambda o, v: optim.OneCycle(o, v, 10), NAN, ValueError, "OneCycle: max_lr.*got nan"),
    (lambda o, v: optim.OneCycle(o, v, 10), "1", TypeError, "OneCycle: max_lr.*str"),
    (
        lambda o, v: optim.OneCycle(o, v, 10),
        [1.0, 2.0],
        ValueError,
        "max_lr \\(one per parameter group\\) must be a list of 1 numbers.*got 2 values",
    ),
    (
        lambda o, v: optim.OneCycle(o, 1.0, 10, pct_start=v),
        1.5,
        ValueError,
        r"pct_start must be a finite number in \[0, 1\]",
    ),
    (
        lambda o, v: optim.OneCycle(o, 1.0, 10, anneal_strategy=v),
        "cosine",
        ValueError,
        "anneal_strategy must be one of 'cos', 'linear'",
    ),
    (lambda o, v: optim.OneCycle(o, 1.0, 10, anneal_strategy=v), None, TypeError, "anneal_strategy"),
    (
        lambda o, v: optim.OneCycle(o, 1.0, 10, cycle_momentum=v),
        "no",
        TypeError,
        "cycle_momentum must be True or False",
    ),
    (
        lambda o, v: optim.OneCycle(o, 1.0, 10, div_factor=v),
        0.0,
        ValueError,
        "div_factor must be a finite number > 0",
    ),
    (lambda o, v: optim.OneCycle(o, 1.0, 10, final_div_factor=v), -1e4, ValueError, "final_div_factor.*> 0"),
    (lambda o, v: optim.OneCycle(o, 1.0, 10, base_momentum=v), -0.1, ValueError, "base_momentum.*>= 0"),
    (lambda o, v: optim.OneCycle(o, 1.0, 10, last_epoch=v), 0.5, TypeError, "OneCycle: last_epoch"),
    (
        lambda o, v: optim.ReduceLROnPlateau(o, factor=v),
        1.0,
        ValueError,
        r"factor must be a finite number in \[0, 1\), got 1.0",
    ),
    (lambda o, v: optim.ReduceLROnPlateau(o, factor=v), -0.5, ValueError, "factor.*got -0.5"),
    (
        lambda o, v: optim.ReduceLROnPlateau(o, patience=v),
        2.5,
        TypeError,
        "patience must be an integer >= 0, got float 2.5",
    ),
    (lambda o, v: optim.ReduceLROnPlateau(o, patience=v), -1, ValueError, "patience.*got -1"),
    (lambda o, v: optim.ReduceLROnPlateau(o, cooldown=v), "1", TypeError, "cooldown.*str"),
    (
        lambda o, v: optim.ReduceLROnPlateau(o, mode=v),
        "minimum",
        ValueError,
        "mode must be one of 'min', 'max'",
    ),
    (
        lambda o, v: optim.ReduceLROnPlateau(o, threshold_mode=v),
        "relative",
        ValueError,
        "threshold_mode must be one of",
    ),
    (lambda o, v: optim.ReduceLROnPlateau(o, threshold=v), NAN, ValueError, "threshold.*got nan"),
    (lambda o, v: optim.ReduceLROnPlateau(o, min_lr=v), [0.0], TypeError, "min_lr.*list"),
    (lambda o, v: optim.ReduceLROnPlateau(o, eps=v), -1e-8, ValueError, "eps.*>= 0"),
]


@pytest.mark.parametrize("make,value,error,words", BAD, ids=[f"{i}-{c[1]!r}" for i, c in enumerate(BAD)])
def test_constructor_rejects_bad_settings_and_leaves_the_optimizer_alone(queue, make, value, error, words):
    opt = _sgd(queue)
    before = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    with pytest.raises(error, match=words):
        make(opt, value)
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == before


def test_numpy_integers_are_sizes(queue):
    sched = optim.StepLR(_sgd(queue), np.int64(2), gamma=np.float32(0.5))
    assert sched.step_size == 2 and type(sched.step_size) is int
    assert optim.OneCycle(_sgd(queue, 2), [1.0, 2.0], np.int32(10)).total_steps == 10


def test_optimizer_must_be_an_optimizer(queue):
    for make in (lambda o: optim.StepLR(o, 2), lambda o: optim.OneCycle(o, 1.0, 10), optim.ReduceLROnPlateau):
        with pytest.raises(TypeError, match="optimizer must be a netcl Optimizer, got list"):
            make([ag.Parameter(Tensor.ones(queue, (2,)))])


def test_one_cycle_momentum_becoming_beta1_stays_below_one(queue):
    adam = optim.Adam([ag.Parameter(Tensor.ones(queue, (2,)))])
    with pytest.raises(ValueError, match=r"max_momentum must be a finite number in \[0, 1\), got 1.0"):
        optim.OneCycle(adam, 1.0, 10, max_momentum=1.0)
    sgd = _sgd(queue)
    assert optim.OneCycle(sgd, 1.0, 10, max_momentum=1.0).max_momentum == 1.0  # SGD momentum may be 1


def test_plateau_metric_must_be_a_number(queue):
    sched = optim.ReduceLROnPlateau(_sgd(queue))
    for bad, words in [
        ("0.5", "got str '0.5'"),
        (True, "got bool"),
        (None, "got NoneType"),
        ([1.0], "got list"),
    ]:
        with pytest.raises(TypeError, match=f"metric must be a number, {words}"):
            sched.step(bad)
    assert sched.last_epoch == 0 and sched.num_bad_epochs == 0
    sched.step(np.float32(0.5))
    sched.step(NAN)  # no improvement, as in PyTorch
    assert sched.best == 0.5 and sched.num_bad_epochs == 1


# -- load_state_dict ---------------------------------------------------------------------------------

MAKERS = {
    "StepLR": lambda o: optim.StepLR(o, 3),
    "CosineAnnealing": lambda o: optim.CosineAnnealing(o, 10),
    "WarmupCosine": lambda o: optim.WarmupCosine(o, 3, 10),
    "OneCycle": lambda o: optim.OneCycle(o, 1.0, 20),
    "ReduceLROnPlateau": lambda o: optim.ReduceLROnPlateau(o, patience=1),
}

# (scheduler, mutation of its state_dict, error, words)
BAD_STATE = [
    (
        "StepLR",
        lambda s: s.update(step_size=2.5),
        TypeError,
        "StepLR.load_state_dict: step_size must be an integer >= 1, got float",
    ),
    ("StepLR", lambda s: s.update(step_size=0), ValueError, "step_size.*got 0"),
    ("StepLR", lambda s: s.pop("gamma"), ValueError, "state has no 'gamma'"),
    (
        "StepLR",
        lambda s: s.update(T_max=10),
        ValueError,
        "unknown entries 'T_max' \\(is this the state of another scheduler",
    ),
    (
        "StepLR",
        lambda s: s.update(base_lrs=[1.0, 1.0]),
        ValueError,
        "base_lrs must be a list of 1 numbers.*got 2 values",
    ),
    ("StepLR", lambda s: s.update(_last_lr=[NAN]), ValueError, r"_last_lr\[0\].*got nan"),
    ("StepLR", lambda s: s.update(_last_lr=0.5), TypeError, "_last_lr must be a list"),
    ("StepLR", lambda s: s.update(last_epoch="4"), TypeError, "last_epoch must be an integer"),
    ("CosineAnnealing", lambda s: s.update(T_max=-1), ValueError, "T_max.*got -1"),
    ("WarmupCosine", lambda s: s.update(warmup_steps=20), ValueError, "0 <= warmup_steps < total_steps"),
    ("OneCycle", lambda s: s.update(phase_ends=[5.0]), ValueError, "phase_ends must be a list of 2 numbers"),
    ("OneCycle", lambda s: s.update(total_steps=30), ValueError, "phase_ends .* do not fit total_steps=30"),
    ("OneCycle", lambda s: s.update(anneal_strategy="exp"), ValueError, "anneal_strategy must be one of"),
    ("OneCycle", lambda s: s.update(cycle_momentum=1), TypeError, "cycle_momentum must be True or False"),
    ("ReduceLROnPlateau", lambda s: s.update(best="inf"), TypeError, "best must be a number \\(not NaN\\)"),
    ("ReduceLROnPlateau", lambda s: s.update(mode="up"), ValueError, "mode must be one of 'min', 'max'"),
    ("ReduceLROnPlateau", lambda s: s.update(num_bad_epochs=-1), ValueError, "num_bad_epochs.*got -1"),
    ("ReduceLROnPlateau", lambda s: s.update(step_size=3), ValueError, "unknown entries 'step_size'"),
]


@pytest.mark.parametrize(
    "kind,mutate,error,words", BAD_STATE, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_STATE)]
)
def test_load_state_dict_rejects_bad_state_and_changes_nothing(queue, kind, mutate, error, words):
    source = MAKERS[kind](_sgd(queue))
    for _ in range(4):
        source.step(1.0) if kind == "ReduceLROnPlateau" else source.step()
    state = source.state_dict()
    mutate(state)
    opt = _sgd(queue)
    target = MAKERS[kind](opt)
    before = (target.state_dict(), [dict(g) for g in opt.param_groups])
    with pytest.raises(error, match=words):
        target.load_state_dict(state)
    assert repr((target.state_dict(), [dict(g) for g in opt.param_groups])) == repr(before)


def test_load_state_dict_of_another_scheduler_and_not_a_dict(queue):
    step_lr = optim.StepLR(_sgd(queue), 3)
    cosine = optim.CosineAnnealing(_sgd(queue), 10)
    with pytest.raises(ValueError, match="StepLR.load_state_dict: unknown entries 'T_max', 'eta_min'"):
        step_lr.load_state_dict(cosine.state_dict())
    with pytest.raises(TypeError, match="state must be a dict .*got list"):
        step_lr.load_state_dict([])
