"""netcl.autograd.elementwise: ops made by `differentiable` from netcl.ops, their gradients from the
derivative table (values: tests/jit/test_autodiff.py). Here: launches per backward, the trace cache
across scalar values, mixed dtypes, and the public signatures."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import ops
from netcl.autograd import elementwise as ew
from netcl.core.tensor import Tensor
from netcl.profiling import count_launches
from tests.reference import assert_close


def _leaves(queue, rng, *shapes, dtype=np.float32):
    arrays = [rng.standard_normal(s).astype(dtype) for s in shapes]
    return arrays, [ag.tensor(Tensor.from_host(queue, a), requires_grad=True) for a in arrays]


def _backward_launches(queue, rng, fn, *shapes) -> int:
    """Kernel launches of one backward (gradients realised into the leaves' .grad), after a warm-up."""
    for _ in range(2):
        _, nodes = _leaves(queue, rng, *shapes)
        with ag.Tape() as tape:
            y = fn(*nodes)
        y.value.realize()
        g = Tensor.from_host(queue, rng.standard_normal(y.shape).astype(np.float32))
        with count_launches() as c:
            tape.backward(y, g)
            for n in nodes:
                n.grad.realize()
    return c.count


@pytest.mark.parametrize("name,fn,shapes,launches", [
    ("add", lambda a, b: a + b, [(17, 33), (17, 33)], 0),  # the gradient passes through, no copy
    ("add_broadcast", lambda a, b: a + b, [(17, 33), (33,)], 1),  # one reduction for b
    ("mul", lambda a, b: a * b, [(17, 33), (17, 33)], 1),  # both gradients in one launch
    ("div", lambda a, b: a / b, [(17, 33), (17, 33)], 1),
    ("maximum", ag.maximum, [(17, 33), (17, 33)], 1),
    ("where", lambda a, b: ag.where(ag.gt(a, 0.0), a, b), [(17, 33), (17, 33)], 1),
    ("exp", ag.exp, [(17, 33)], 1),
    ("gelu_tanh", lambda x: ag.gelu(x, approximate="tanh"), [(17, 33)], 1),
    ("clamp", lambda x: ag.clamp(x, -0.5, 0.5), [(17, 33)], 1),
    ("chain", lambda x, w: ag.tanh(x * w + 1.0).exp() * 2.0, [(17, 33), (17, 33)], 1),
])
def test_backward_launches(queue, rng, name, fn, shapes, launches):
    """One elementwise op's backward is one fused kernel (all its operands' gradients together); a chain
    of them fuses into one kernel too (each rule's result is pending in the next)."""
    assert _backward_launches(queue, rng, fn, *shapes) == launches


def test_scalars_of_other_values_get_their_own_gradient(queue, rng):
    """Traces are cached per scalar value: each value's gradient is its own (also -0.0 against 0.0)."""
    _, (x,) = _leaves(queue, rng, (5, 3))
    for s in (2.0, 3.0, 2.0, -0.0, 0.0, 1, True):
        x.grad = None
        with ag.Tape() as tape:
            y = ag.mul(x, s)
        tape.backward(y, Tensor.ones(queue, (5, 3)))
        got = x.grad.to_host()
        np.testing.assert_array_equal(got, np.full((5, 3), float(s), np.float32), err_msg=repr(s))
        assert np.all(np.signbit(got) == np.signbit(float(s))), repr(s)


def test_mixed_dtypes_give_each_operand_its_own_dtype(queue, rng):
    a = rng.standard_normal((4, 6)).astype(np.float32)
    b = rng.standard_normal((6,))
    x = ag.tensor(Tensor.from_host(queue, a), requires_grad=True)
    y = ag.tensor(Tensor.from_host(queue, b), requires_grad=True)
    g = rng.standard_normal((4, 6))
    with ag.Tape() as tape:
        out = x * ag.exp(y)
    assert out.dtype == np.float64
    tape.backward(out, Tensor.from_host(queue, g))
    assert x.grad.dtype == np.float32 and y.grad.dtype == np.float64
    a64 = a.astype(np.float64)
    assert_close(x.grad, g * np.exp(b), np.float32)
    assert_close(y.grad, (g * a64 * np.exp(b)).sum(0), np.float64)


def test_raw_tensors_and_integer_tensors_are_constants(queue, rng):
    a = rng.standard_normal((3, 7))
    k = rng.integers(-3, 4, (3, 7)).astype(np.int32)
    c = rng.standard_normal((7,))
    x = ag.tensor(Tensor.from_host(queue, a), requires_grad=True)
    with ag.Tape() as tape:
        out = ag.where(
            Tensor.from_host(queue, k > 0), x * Tensor.from_host(queue, k), Tensor.from_host(queue, c)
        )
    tape.backward(out, Tensor.ones(queue, (3, 7), np.float64))
    assert_close(x.grad, np.where(k > 0, k, 0).astype(np.float64), np.float64)


def test_float16_gradients(queue, rng):
    a = rng.uniform(0.5, 2.0, (9, 5)).astype(np.float16)
    x = ag.tensor(Tensor.from_host(queue, a), requires_grad=True)
    with ag.Tape() as tape:
        y = ag.sqrt(x) * ag.sigmoid(x)
    tape.backward(y, Tensor.ones(queue, (9, 5), np.float16))
    v = a.astype(np.float64)
    s = 1 / (1 + np.exp(-v))
    assert x.grad.dtype == np.float16
    assert_close(x.grad, 0.5 / np.sqrt(v) * s + np.sqrt(v) * s * (1 - s), np.float16)


def test_graph_can_be_differentiated_twice_with_retain_graph(queue, rng):
    (a, b), (x, w) = _leaves(queue, rng, (6, 4), (4,), dtype=np.float64)
    with ag.Tape() as tape:
        y = ag.tanh(x * w).sum()
    tape.backward(y, retain_graph=True)
    first = x.grad.to_host().copy()
    tape.backward(y)
    assert_close(x.grad, 2 * first, np.float64)
    assert_close(first, (1 - np.tanh(a * b) ** 2) * b, np.float64)


def test_public_signatures_are_the_ops_ones_on_nodes():
    sig = inspect.signature(ag.clamp)
    assert [(p.name, p.default) for p in sig.parameters.values()] == [("x", inspect.Parameter.empty),
                                                                     ("min", None), ("max", None)]
    assert sig.return_annotation == "Node"
    assert list(inspect.signature(ag.gelu).parameters) == ["x", "approximate"]
    assert inspect.signature(ag.leaky_relu).parameters["negative_slope"].default == 0.01
    assert ag.maximum.__name__ == "maximum" and "half the gradient" in ag.maximum.__doc__
    assert ew.tan.__module__ == "netcl.autograd.elementwise"


def _gated(x, y, scale):
    return ops.tanh(x * y) * scale + ops.exp(ops.minimum(x, 0.0))


def test_apply_records_a_composite_function_as_one_node(queue, rng):
    (a, b), (x, y) = _leaves(queue, rng, (5, 7), (7,), dtype=np.float64)
    g = rng.standard_normal((5, 7))
    with ag.Tape() as tape:
        out = ew.apply(_gated, x, y, 1.5)
    assert tape.recorded == 1
    with count_launches() as c:
        tape.backward(out, Tensor.from_host(queue, g))
        x.grad.realize()
        y.grad.realize()
    assert c.count == 2  # one kernel for both gradients, one reduction for y's broadcast axis
    t = np.tanh(a * b)
    assert_close(out.value, t * 1.5 + np.exp(np.minimum(a, 0.0)), np.float64)
    assert_close(x.grad, g * ((1 - t**2) * b * 1.5 + np.where(a < 0, np.exp(a), 0.0)), np.float64)
    assert_close(y.grad, (g * (1 - t**2) * a * 1.5).sum(0), np.float64)
