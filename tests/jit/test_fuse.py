"""@fuse: one launch forward, one launch backward, gradients against finite differences / analytic."""

from __future__ import annotations

import numpy as np
import pytest

from netcl import ops
from netcl.core.tensor import Tensor
from netcl.jit import TraceError, fuse
from netcl.profiling import count_launches
from tests.reference import assert_close


@fuse
def gelu_gate(x, b, y):
    h = ops.gelu(x + b, approximate="tanh")
    return h * ops.sigmoid(y) + ops.tanh(x) * 0.5


def _ref(x, b, y):
    h = x + b
    g = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
    return g * (1 / (1 + np.exp(-y))) + np.tanh(x) * 0.5


def test_forward_one_launch(queue, rng):
    a, b, c = (rng.standard_normal((17, 9)).astype(np.float32) for _ in range(3))
    x, y = Tensor.from_host(queue, a), Tensor.from_host(queue, c)
    bias = Tensor.from_host(queue, b[0])
    gelu_gate(x, bias, y)  # trace + build
    with count_launches() as n:
        out = gelu_gate(x, bias, y)
    assert n.count == 1
    assert_close(out, _ref(a.astype(np.float64), b[0].astype(np.float64), c.astype(np.float64)), np.float32,
                 rtol=1e-5, atol=1e-6)


def test_backward_one_launch_matches_finite_differences(queue, rng):
    a, c = rng.standard_normal((5, 7)), rng.standard_normal((5, 7))
    b = rng.standard_normal((5, 7))
    g = rng.standard_normal((5, 7))
    xs = [Tensor.from_host(queue, v.astype(np.float64)) for v in (a, b, c)]
    gt = Tensor.from_host(queue, g)
    gelu_gate.backward(xs, gt)
    with count_launches() as n:
        grads = gelu_gate.backward(xs, gt)
    assert n.count == 1
    eps = 1e-6
    for i, v in enumerate((a, b, c)):
        args = [a, b, c]
        plus = list(args)
        minus = list(args)
        plus[i] = v + eps
        minus[i] = v - eps
        num = (_ref(*plus) - _ref(*minus)) / (2 * eps) * g
        assert_close(grads[i], num, np.float64, rtol=1e-6, atol=1e-7, err_msg=f"input {i}")


def test_backward_broadcast_input_is_summed(queue, rng):
    a = rng.standard_normal((6, 4)).astype(np.float32)
    b = rng.standard_normal((4,)).astype(np.float32)
    g = rng.standard_normal((6, 4)).astype(np.float32)

    @fuse
    def f(x, bias):
        return ops.relu(x * bias)

    gx, gb = f.backward((Tensor.from_host(queue, a), Tensor.from_host(queue, b)), Tensor.from_host(queue, g))
    mask = (a * b) > 0
    assert_close(gx, (g * mask * b).astype(np.float64), np.float32)
    assert_close(gb, (g * mask * a).sum(0).astype(np.float64), np.float32, rtol=1e-5)


def test_backward_gradients_must_be_tensors(queue, rng):
    """A NumPy gradient was read as one gradient per row ("1 outputs but 6 output gradients")."""
    x = Tensor.from_host(queue, rng.standard_normal((6, 4)).astype(np.float32))
    g = np.ones((6, 4), np.float32)
    for given in (g, [g], 1.0):
        with pytest.raises(TypeError, match=r"gelu_gate\.backward: the gradient of output 0 is a \w+; "
                           "gradients are Tensors"):
            gelu_gate.backward((x, x, x), given)


@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "sin", "cos", "tanh", "sigmoid", "silu", "softplus",
                                  "relu", "gelu", "abs", "rsqrt", "log1p", "expm1", "erf", "square",
                                  "reciprocal"])
def test_unary_derivatives(queue, rng, name):
    a = rng.uniform(0.3, 2.0, size=(33,)) * rng.choice([-1, 1], size=33)
    if name in ("log", "sqrt", "rsqrt", "log1p"):
        a = np.abs(a)
    fn = getattr(ops, name)
    f = fuse(lambda x: fn(x))
    x = Tensor.from_host(queue, a)
    (g,) = f.backward((x,), Tensor.ones(queue, (33,), np.float64))
    eps = 1e-6
    plus = fn(Tensor.from_host(queue, a + eps)).to_host()
    minus = fn(Tensor.from_host(queue, a - eps)).to_host()
    assert_close(g, (plus - minus) / (2 * eps), np.float64, rtol=1e-5, atol=1e-6)


def test_binary_derivatives(queue, rng):
    a = rng.uniform(0.5, 2.0, size=(13,))
    b = rng.uniform(0.5, 2.0, size=(13,))

    @fuse
    def f(x, y):
        return (x / y) ** 1.5 + ops.maximum(x, y) * ops.clamp(y, 0.8, 1.6) - ops.pow(x, y)

    def ref(x, y):
        return (x / y) ** 1.5 + np.maximum(x, y) * np.clip(y, 0.8, 1.6) - x**y

    gx, gy = f.backward(
        (Tensor.from_host(queue, a), Tensor.from_host(queue, b)), Tensor.ones(queue, (13,), np.float64)
    )
    eps = 1e-6
    assert_close(gx, (ref(a + eps, b) - ref(a - eps, b)) / (2 * eps), np.float64, rtol=1e-5, atol=1e-6)
    assert_close(gy, (ref(a, b + eps) - ref(a, b - eps)) / (2 * eps), np.float64, rtol=1e-5, atol=1e-6)


def test_multiple_outputs_and_int_input(queue, rng):
    a = rng.standard_normal((3, 5)).astype(np.float32)
    m = rng.integers(0, 2, size=(3, 5)).astype(np.int32)

    @fuse
    def f(x, mask):
        return x * mask, ops.exp(x)

    x, mt = Tensor.from_host(queue, a), Tensor.from_host(queue, m)
    with count_launches() as n:
        y, e = f(x, mt)
    assert n.count <= 2  # first call also builds; outputs share one launch
    with count_launches() as n:
        y, e = f(x, mt)
    assert n.count == 1
    assert_close(y, (a * m).astype(np.float64), np.float32)
    assert_close(e, np.exp(a.astype(np.float64)), np.float32)
    gx, gm = f.backward((x, mt), (Tensor.ones(queue, (3, 5)), None))
    assert gm is None
    assert_close(gx, m.astype(np.float64), np.float32)


def test_trace_error_on_non_elementwise(queue):
    @fuse
    def f(x):
        return ops.sum(x)

    with pytest.raises(TraceError, match="elementwise"):
        f(Tensor.ones(queue, (3,)))


def test_host_data_and_keywords_are_answered_in_one_line(queue):
    """A host array was "unhashable type: 'numpy.ndarray'"; a keyword a bare "unexpected keyword argument"."""

    @fuse
    def scaled(x, y, scale=2.0):
        return x * y * scale

    x = Tensor.from_host(queue, np.arange(5, dtype=np.float32))
    want = np.arange(5, dtype=np.float32) ** 2
    assert_close(scaled(x, y=x).to_host(), 2 * want)
    assert_close(scaled(x, x, scale=3.0).to_host(), 3 * want)
    with pytest.raises(TypeError, match=r"argument 0 is a host ndarray of shape \(5,\).*Tensor\.from_host"):
        scaled(np.arange(5, dtype=np.float32), x)
    with pytest.raises(TypeError, match=r"argument 1 is a host list"):
        scaled(x, [1.0, 2.0])
    with pytest.raises(TypeError, match=r"scaled\(x, y, scale=2\.0\): .*'v'"):
        scaled(x, x, v=x)
    with pytest.raises(TypeError, match=r"argument 1 \(dict\) is neither a Tensor nor a hashable setting"):
        scaled(x, {"a": 1})
