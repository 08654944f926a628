"""Finite-difference gradient checks (float64, the test device) for every differentiable op: one line each."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.core.tensor import Tensor
from tests.autograd.gradcheck import check_grads

R = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def _own_inputs(request):
    """Each test draws its inputs from a generator seeded by its own name, not by the tests that ran before it
    in the worker (pytest-xdist's order decides those: a conv2d check drew inputs whose finite differences
    missed atol by 1e-8 in one order)."""
    global R
    R = np.random.default_rng(zlib.crc32(request.node.name.encode()))


def pos(*shape):
    return R.uniform(0.5, 2.0, shape)


def rnd(*shape):
    x = R.standard_normal(shape)
    return np.where(np.abs(x) < 0.05, 0.3, x)  # keep away from kinks (relu, abs) at 0


UNARY = {
    "neg": (ag.neg, rnd),
    "exp": (ag.exp, rnd),
    "log": (ag.log, pos),
    "log1p": (ag.log1p, pos),
    "expm1": (ag.expm1, rnd),
    "sqrt": (ag.sqrt, pos),
    "rsqrt": (ag.rsqrt, pos),
    "square": (ag.square, rnd),
    "reciprocal": (ag.reciprocal, pos),
    "abs": (ag.abs, rnd),
    "sin": (ag.sin, rnd),
    "cos": (ag.cos, rnd),
    "tanh": (ag.tanh, rnd),
    "sigmoid": (ag.sigmoid, rnd),
    "relu": (ag.relu, rnd),
    "silu": (ag.silu, rnd),
    "softplus": (ag.softplus, rnd),
    "gelu": (ag.gelu, rnd),
    "gelu_tanh": (lambda x: ag.gelu(x, approximate="tanh"), rnd),
    "leaky_relu": (lambda x: ag.leaky_relu(x, 0.1), rnd),
    "clamp": (lambda x: ag.clamp(x, -0.5, 0.7), rnd),
    "pow_scalar": (lambda x: x**3, rnd),
    "rpow_scalar": (lambda x: 2.0**x, rnd),
    "sum": (lambda x: x.sum(axis=1), rnd),
    "sum_all": (lambda x: x.sum(), rnd),
    "mean": (lambda x: x.mean(axis=(0, 2), keepdims=True), rnd),
    "max": (lambda x: x.max(axis=-1), rnd),
    "min": (lambda x: x.min(axis=0), rnd),
    "softmax": (lambda x: ag.softmax(x, axis=1), rnd),
    "log_softmax": (lambda x: ag.log_softmax(x, -1), rnd),
    "logsumexp": (lambda x: ag.logsumexp(x, axis=2), rnd),
    "var": (lambda x: ag.var(x, axis=1), rnd),
    "std": (lambda x: ag.std(x, axis=(1, 2)), rnd),
    "reshape": (lambda x: x.reshape(4, 6) * 1.5, rnd),
    "transpose": (lambda x: x.transpose(0, 2) * 2, rnd),
    "permute": (lambda x: x.permute(2, 0, 1).exp(), rnd),
    "T": (lambda x: x.T.tanh(), rnd),
    "getitem": (lambda x: x[1:, ::2, 1] * 3, rnd),
    "flatten": (lambda x: ag.flatten(x).sigmoid(), rnd),
    "expand": (lambda x: x[:, :1].expand(2, 5, 4) * 1.0, rnd),
    "unsqueeze": (lambda x: x.unsqueeze(1) * 2, rnd),
    "cast": (lambda x: ag.cast(x, np.float32).cast(np.float64), rnd),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(queue, name):
    fn, make = UNARY[name]
    tol = dict(rtol=1e-3, atol=1e-4, eps=1e-3) if name == "cast" else {}
    check_grads(queue, fn, [make(2, 3, 4)], **tol)


BINARY = {
    "add_broadcast": (lambda a, b: a + b, (3, 4), (4,)),
    "sub_broadcast": (lambda a, b: a - b, (3, 1), (1, 4)),
    "mul_broadcast": (lambda a, b: a * b, (2, 3, 4), (3, 1)),
    "div": (lambda a, b: a / b, (3, 4), (3, 4)),
    "pow": (lambda a, b: a**b, (3, 4), (3, 4)),
    "maximum": (ag.maximum, (3, 4), (3, 4)),
    "minimum": (ag.minimum, (3, 4), (4,)),
    "where": (lambda a, b: ag.where(ag.gt(a, 0.0), a, b), (3, 4), (3, 4)),
    "matmul": (lambda a, b: a @ b, (3, 5), (5, 4)),
    "matmul_batched": (lambda a, b: a @ b, (2, 3, 5), (5, 2)),
    "matmul_vec": (lambda a, b: a @ b, (5,), (5, 3)),
    "concat": (lambda a, b: ag.concat([a, b], axis=1), (3, 4), (3, 2)),
    "stack": (lambda a, b: ag.stack([a, b], axis=0), (3, 4), (3, 4)),
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary(queue, name):
    fn, sa, sb = BINARY[name]
    make = pos if name == "pow" else rnd
    check_grads(queue, fn, [make(*sa), make(*sb)])


def test_linear_and_linear_relu(queue):
    x, w, b = rnd(5, 3), rnd(4, 3), rnd(4)
    check_grads(queue, lambda x, w, b: ag.linear(x, w, b), [x, w, b])
    check_grads(queue, lambda x, w, b: ag.linear(x, w, b, activation="relu"), [x, w, b])
    check_grads(queue, lambda x, w: ag.linear(x, w, None, activation="gelu"), [rnd(2, 3, 3), w])


def test_conv2d(queue):
    x, w, b = rnd(2, 3, 6, 5), rnd(4, 3, 3, 3), rnd(4)
    check_grads(queue, lambda x, w, b: ag.conv2d(x, w, b, stride=1, padding=1), [x, w, b])
    check_grads(queue, lambda x, w, b: ag.conv2d(x, w, b, stride=2, padding=1, activation="relu"), [x, w, b])
    check_grads(queue, lambda x, w: ag.conv2d(x, w, None, groups=2), [rnd(1, 4, 5, 5), rnd(2, 2, 3, 3)])


def test_pools(queue):
    x = R.permutation(2 * 3 * 6 * 6).reshape(2, 3, 6, 6) / 10.0  # distinct values: a unique argmax
    check_grads(queue, lambda x: ag.max_pool2d(x, 2), [x])
    check_grads(queue, lambda x: ag.max_pool2d(x, 3, stride=2, padding=1), [x])
    check_grads(queue, lambda x: ag.avg_pool2d(x, 2), [rnd(2, 3, 6, 6)])
    check_grads(queue, lambda x: ag.adaptive_avg_pool2d(x, (2, 3)), [rnd(1, 2, 5, 7)])


def test_batch_norm(queue):
    c = 3
    rm = Tensor.zeros(queue, (c,), np.float64)
    rv = Tensor.ones(queue, (c,), np.float64)
    check_grads(
        queue, lambda x, w, b: ag.batch_norm(x, w, b, None, None, True), [rnd(4, c, 3, 2), rnd(c), rnd(c)]
    )
    check_grads(
        queue, lambda x, w, b: ag.batch_norm(x, w, b, rm, rv, False), [rnd(4, c, 3, 2), rnd(c), rnd(c)]
    )
    check_grads(
        queue,
        lambda x, w, b: ag.batch_norm(x, w, b, None, None, True, activation="relu"),
        [rnd(4, c, 3, 2), rnd(c), pos(c)],
    )


def test_row_norms(queue):
    check_grads(queue, lambda x, w, b: ag.layer_norm(x, 5, w, b), [rnd(3, 5), rnd(5), rnd(5)])
    check_grads(queue, lambda x, w: ag.rms_norm(x, (2, 3), w), [rnd(4, 2, 3), rnd(2, 3)])
    check_grads(queue, lambda x, w, b: ag.group_norm(x, 2, w, b), [rnd(2, 4, 3), rnd(4), rnd(4)])


def test_dropout_matches_its_mask(queue):
    from netcl.ops.random import Generator

    x = rnd(50, 40)
    out = ag.dropout(ag.tensor(Tensor.from_host(queue, x)), 0.3, generator=Generator(5))
    o = out.value.to_host()
    kept = o != 0
    assert 0.6 < kept.mean() < 0.8
    np.testing.assert_allclose(o[kept], x[kept] / 0.7)
    check_grads(queue, lambda v: ag.dropout(v, 0.3, seed=11), [rnd(4, 5)])
