"""ag.gradcheck: a user's op with its own rule against central differences; a wrong rule is named by input,
elements and values."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.ops as ops
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, NetclError


def softplus(x, rule):
    value = ops.maximum(x.value, 0.0) + ops.log1p(ops.exp(-ops.abs(x.value)))
    return ag.record(value, (x,), lambda g: (g * rule(x.value),), "softplus")


def test_a_right_rule_passes_and_a_wrong_one_is_named(queue):
    rng = np.random.default_rng(0)
    x = ag.tensor(Tensor.from_host(queue, rng.standard_normal((3, 5))), requires_grad=True)
    assert ag.gradcheck(lambda v: softplus(v, ops.sigmoid), [x])
    assert x.grad is None  # the check leaves .grad as it was
    with pytest.raises(ag.GradcheckError, match=r"input 0 \(shape \(3, 5\)\).* at 15 of 15 elements.*"
                       r"the worst: \(\d, \d\): tape .*, numeric .*2 times the numeric one everywhere"):
        ag.gradcheck(lambda v: softplus(v, lambda t: 2 * ops.sigmoid(t)), [x])
    assert not ag.gradcheck(lambda v: softplus(v, lambda t: ops.sigmoid(-t)), [x], raise_exception=False)
    with pytest.raises(ag.GradcheckError, match="No gradient reached it"):
        ag.gradcheck(lambda v: ag.record(v.value * 2, (v,), lambda g: (None,), "twice"), [x])


def test_several_inputs_and_constants(queue):
    rng = np.random.default_rng(1)
    a = ag.tensor(Tensor.from_host(queue, rng.standard_normal((3, 4))), requires_grad=True)
    b = ag.tensor(Tensor.from_host(queue, rng.standard_normal((4, 5))), requires_grad=True)
    const = ag.tensor(Tensor.from_host(queue, rng.standard_normal(5)))
    assert ag.gradcheck(lambda a, b, c, s: ag.tanh(ag.matmul(a, b) + c) * s, [a, b, const, 0.5])
    with ag.Tape():
        inner = ag.tanh(a)  # an intermediate node is checked as the input it is to fn
    assert ag.gradcheck(lambda h, b: ag.matmul(h * h, b), [inner, b]) and a.grad is None

    def off_by_one_hundredth(a, b):  # the rule of b only is wrong
        return ag.record(a.value @ b.value, (a, b), lambda g: (g @ b.value.T, a.value.T @ g + 0.01), "mm")

    with pytest.raises(ag.GradcheckError, match=r"input 1 \(shape \(4, 5\)\)"):
        ag.gradcheck(off_by_one_hundredth, [a, b])


def test_what_it_refuses(queue):
    x32 = ag.tensor(Tensor.from_host(queue, np.ones(3, np.float32)), requires_grad=True)
    with pytest.raises(DTypeError, match=r"input 0 is float32; the check runs in float64.*astype"):
        ag.gradcheck(lambda v: v * 2, [x32])
    with pytest.raises(NetclError, match="no input requires grad"):
        ag.gradcheck(lambda v: v * 2, [Tensor.from_host(queue, np.ones(3))])
    x = ag.tensor(Tensor.from_host(queue, np.ones(3)), requires_grad=True)
    with pytest.raises(TypeError, match="fn must return one Node, got Tensor"):
        ag.gradcheck(lambda v: v.value, x)
