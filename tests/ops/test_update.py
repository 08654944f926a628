"""netcl.ops.update: the fused optimizer launch on Tensors, called directly (netcl.optim drives it)."""

from __future__ import annotations

import numpy as np
import pytest

from netcl.core.tensor import Tensor
from netcl.errors import KernelLaunchError, NetclError
from netcl.ops import update


def test_sgd_rule_by_name_matches_numpy(queue, rng):
    ps = [rng.standard_normal(n).astype(np.float32) for n in (5, 130)]
    gs = [rng.standard_normal(n).astype(np.float32) for n in (5, 130)]
    bufs = [np.full(n, 0.5, np.float32) for n in (5, 130)]
    params = [Tensor.from_host(queue, p) for p in ps]
    states = [[Tensor.from_host(queue, b)] for b in bufs]
    update.optimizer_step("sgd", params, [Tensor.from_host(queue, g) for g in gs], states,
                          dict(lr=0.1, momentum=0.9, dampening=0.0, weight_decay=0.01, nesterov=False,
                               first_step=False))
    for p, g, b, t, (s,) in zip(ps, gs, bufs, params, states):
        g = g.astype(np.float64) + 0.01 * p
        buf = 0.9 * b + g
        np.testing.assert_allclose(s.to_host(), buf, rtol=1e-6)
        np.testing.assert_allclose(t.to_host(), p - 0.1 * buf, rtol=1e-6, atol=1e-7)


def test_bad_calls_name_what_is_wrong(queue):
    p, g = Tensor.zeros(queue, (4,)), Tensor.zeros(queue, (4,))
    hyper = dict(lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, first_step=False)
    with pytest.raises(ValueError, match=r"update rule must be one of \['adam', 'rmsprop', 'sgd'\]"):
        update.optimizer_step("lion", [p], [g], [[None]], hyper)
    with pytest.raises(ValueError, match="1 to 8 parameters"):
        update.optimizer_step("sgd", [p] * 9, [g] * 9, [[None]] * 9, hyper)
    with pytest.raises(NetclError, match="parameter 0"):
        update.optimizer_step("sgd", [p], [Tensor.zeros(queue, (5,))], [[None]], hyper)
    with pytest.raises(KernelLaunchError, match=r"missing arguments \['first_step'\]"):
        update.optimizer_step(
            "sgd", [p], [g], [[None]], {k: v for k, v in hyper.items() if k != "first_step"}
        )
