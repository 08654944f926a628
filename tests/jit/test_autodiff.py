"""netcl.jit.autodiff, the one derivative table: every rule through both of its users (netcl.autograd on
Nodes, @netcl.jit.fuse's symbolic backward) against float64 NumPy central differences on odd shapes
with broadcasting, PyTorch's conventions at ties, kinks, zeros and NaN, and the table's coverage."""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import ops
from netcl.autograd import elementwise as ag_ew
from netcl.core.tensor import Tensor
from netcl.jit import autodiff, fuse
from tests.reference import assert_close

ops_ew = importlib.import_module("netcl.ops.elementwise")  # netcl.ops.elementwise is also a function's name

R = np.random.default_rng(2024)
ERF = np.vectorize(math.erf)


def rnd(shape):
    x = R.standard_normal(shape)
    return np.where(np.abs(x) < 0.05, 0.3, x)  # away from kinks at 0 (abs, relu, leaky_relu)


def pos(shape):
    return R.uniform(0.5, 2.0, shape)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


UNARY = (3, 17)
A, B = (2, 3, 17), (3, 1)  # b broadcasts along two axes

# IR op -> (netcl function of Tensors, NumPy float64 forward, input makers and shapes). The autograd
# path calls the netcl.autograd function of the same name, the fuse path the netcl.ops one.
Case = tuple[Callable, Callable, list[tuple[Callable, tuple]]]
CASES: dict[str, Case] = {
    "add": (lambda m, a, b: m.add(a, b), np.add, [(rnd, A), (rnd, B)]),
    "sub": (lambda m, a, b: m.sub(a, b), np.subtract, [(rnd, B), (rnd, A)]),
    "mul": (lambda m, a, b: m.mul(a, b), np.multiply, [(rnd, A), (rnd, B)]),
    "div": (lambda m, a, b: m.div(a, b), np.divide, [(rnd, A), (pos, B)]),
    "pow": (lambda m, a, b: m.pow(a, b), np.power, [(pos, A), (rnd, B)]),
    "maximum": (lambda m, a, b: m.maximum(a, b), np.maximum, [(rnd, A), (rnd, B)]),
    "minimum": (lambda m, a, b: m.minimum(a, b), np.minimum, [(rnd, B), (rnd, A)]),
    "atan2": (lambda m, a, b: m.atan2(a, b), np.arctan2, [(rnd, A), (rnd, B)]),
    "remainder": (lambda m, a, b: m.remainder(a, b), np.remainder, [(rnd, A), (pos, B)]),
    "leaky_relu": (lambda m, x: m.leaky_relu(x, 0.2), lambda x: np.where(x > 0, x, 0.2 * x), [(rnd, UNARY)]),
    "neg": (lambda m, x: m.neg(x), np.negative, [(rnd, UNARY)]),
    "abs": (lambda m, x: m.abs(x), np.abs, [(rnd, UNARY)]),
    "exp": (lambda m, x: m.exp(x), np.exp, [(rnd, UNARY)]),
    "log": (lambda m, x: m.log(x), np.log, [(pos, UNARY)]),
    "log1p": (lambda m, x: m.log1p(x), np.log1p, [(pos, UNARY)]),
    "expm1": (lambda m, x: m.expm1(x), np.expm1, [(rnd, UNARY)]),
    "sqrt": (lambda m, x: m.sqrt(x), np.sqrt, [(pos, UNARY)]),
    "rsqrt": (lambda m, x: m.rsqrt(x), lambda x: 1 / np.sqrt(x), [(pos, UNARY)]),
    "square": (lambda m, x: m.square(x), np.square, [(rnd, UNARY)]),
    "reciprocal": (lambda m, x: m.reciprocal(x), np.reciprocal, [(pos, UNARY)]),
    "sin": (lambda m, x: m.sin(x), np.sin, [(rnd, UNARY)]),
    "cos": (lambda m, x: m.cos(x), np.cos, [(rnd, UNARY)]),
    "tan": (lambda m, x: m.tan(x), np.tan, [(rnd, UNARY)]),
    "tanh": (lambda m, x: m.tanh(x), np.tanh, [(rnd, UNARY)]),
    "erf": (lambda m, x: m.erf(x), ERF, [(rnd, UNARY)]),
    "sigmoid": (lambda m, x: m.sigmoid(x), sigmoid, [(rnd, UNARY)]),
    "silu": (lambda m, x: m.silu(x), lambda x: x * sigmoid(x), [(rnd, UNARY)]),
    "softplus": (lambda m, x: m.softplus(x), lambda x: np.logaddexp(x, 0), [(rnd, UNARY)]),
    "relu": (lambda m, x: m.relu(x), lambda x: np.maximum(x, 0), [(rnd, UNARY)]),
    "gelu": (lambda m, x: m.gelu(x), lambda x: 0.5 * x * (1 + ERF(x / math.sqrt(2))), [(rnd, UNARY)]),
    "gelu_tanh": (lambda m, x: m.gelu(x, approximate="tanh"), gelu_tanh, [(rnd, UNARY)]),
    "where": (lambda m, c, a, b: m.where(c, a, b), np.where,
              [(lambda s: R.random(s) < 0.5, (3, 17)), (rnd, A), (rnd, B)]),
    "cast": (lambda m, x: m.cast(x, np.float32), lambda x: x, [(rnd, UNARY)]),
}
# scalar operands: the rules' `param` branches (a fixed exponent, base, bound or scale)
SCALAR_CASES: dict[str, Case] = {
    "pow_scalar_exponent": (lambda m, x: m.pow(x, 2.5), lambda x: x**2.5, [(pos, UNARY)]),
    "pow_scalar_base": (lambda m, x: m.pow(1.7, x), lambda x: 1.7**x, [(rnd, UNARY)]),
    "clamp": (lambda m, x: m.clamp(x, -0.5, 0.7), lambda x: np.clip(x, -0.5, 0.7), [(rnd, UNARY)]),
    "maximum_scalar": (lambda m, x: m.maximum(x, 0.25), lambda x: np.maximum(x, 0.25), [(rnd, UNARY)]),
    "minimum_scalar_first": (lambda m, x: m.minimum(0.25, x), lambda x: np.minimum(0.25, x), [(rnd, UNARY)]),
    "div_scalar_numerator": (lambda m, x: m.div(3.0, x), lambda x: 3.0 / x, [(pos, UNARY)]),
    "sub_scalar_first": (lambda m, x: m.sub(1.5, x), lambda x: 1.5 - x, [(rnd, UNARY)]),
    "mul_int_tensor": (lambda m, x, k: m.mul(x, k), np.multiply,
                       [(rnd, A), (lambda s: R.integers(-3, 4, s).astype(np.int32), B)]),
}


def _numeric_grads(np_fn: Callable, arrays: list[np.ndarray], w: np.ndarray, eps: float = 1e-6) -> list:
    """Central differences of sum(w * f) for an elementwise f: each output element depends on one element
    of each input, so moving a whole input at once gives every partial derivative together; a
    broadcast input then sums them back to its shape."""
    grads = []
    for i, x in enumerate(arrays):
        if x.dtype.kind != "f":
            grads.append(None)
            continue
        up, down = list(arrays), list(arrays)
        up[i], down[i] = x + eps, x - eps
        d = w * (np_fn(*up) - np_fn(*down)) / (2 * eps)
        lead = d.ndim - x.ndim
        d = d.sum(axis=tuple(range(lead)))
        grads.append(d.sum(axis=tuple(k for k, s in enumerate(x.shape) if s == 1), keepdims=True))
    return grads


def _inputs(makers: list[tuple[Callable, tuple]]) -> list[np.ndarray]:
    return [make(shape) for make, shape in makers]


def _device_arrays(arrays: list[np.ndarray], dtype) -> list[np.ndarray]:
    return [a.astype(dtype) if a.dtype.kind == "f" else a for a in arrays]


def _autograd_grads(queue, fn, arrays, w):
    with ag.Tape() as tape:
        nodes = [ag.tensor(Tensor.from_host(queue, a), requires_grad=a.dtype.kind == "f") for a in arrays]
        out = fn(ag_ew, *nodes)
    tape.backward(out, Tensor.from_host(queue, w.astype(out.dtype)))
    return out, [n.grad if n.requires_grad else None for n in nodes]


def _fused_grads(queue, fn, arrays, w):
    f = fuse(lambda *xs: fn(ops, *xs))
    tensors = [Tensor.from_host(queue, a) for a in arrays]
    out = f(*tensors)
    return out, f.backward(tensors, Tensor.from_host(queue, w.astype(out.dtype)))


PATHS = {"autograd": _autograd_grads, "fuse": _fused_grads}


def _check_paths(queue, name, case, dtype, rtol, atol, paths=tuple(PATHS)):
    fn, np_fn, makers = case
    arrays = _device_arrays(_inputs(makers), dtype)
    ref_arrays = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in arrays]
    out_shape = np.broadcast_shapes(*(a.shape for a in arrays))
    w = R.standard_normal(out_shape)
    out_dtype = np.float32 if name == "cast" else dtype
    w = w.astype(out_dtype)  # the seed the device sees, so the reference uses it too
    want = _numeric_grads(np_fn, ref_arrays, w.astype(np.float64))
    for path in paths:
        out, got = PATHS[path](queue, fn, arrays, w)
        assert_close(out.value if path == "autograd" else out, np_fn(*ref_arrays), out_dtype,
                     rtol=max(rtol, 1e-6), atol=atol, err_msg=f"{name} forward ({path})")
        for i, (g, ref) in enumerate(zip(got, want)):
            if ref is None:
                assert g is None, f"{name}: integer input {i} got a gradient ({path})"
                continue
            assert g.dtype == arrays[i].dtype, f"{name}: gradient {i} is {g.dtype} ({path})"
            assert_close(g, ref, np.float64, rtol=rtol, atol=atol, err_msg=f"{name}: d/d input {i} ({path})")


@pytest.mark.parametrize("name", sorted(CASES) + sorted(SCALAR_CASES))
def test_rule_in_float64(queue, name):
    case = CASES.get(name) or SCALAR_CASES[name]
    _check_paths(queue, name, case, np.float64, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_in_float32(queue, name):
    """The same rules on float32 tensors (gradients in float32) against the float64 reference, through
    autograd (a kernel per rule, as training runs them). The fuse path's backward is the same rules'
    expressions gathered into one kernel, the gathering dtype-blind: float64 above runs it for every rule (a
    float32 fused backward here was a second program per rule, ~35 more on each PoCL configuration)."""
    _check_paths(queue, name, CASES[name], np.float32, rtol=2e-4, atol=2e-5, paths=("autograd",))


def test_every_rule_has_a_case():
    differentiable = set(autodiff.RULES) - autodiff.NO_GRADIENT
    assert differentiable == set(CASES), (
        f"rules without a both-paths case: {sorted(differentiable - set(CASES))}; "
        f"cases without a rule: {sorted(set(CASES) - differentiable)}")


def test_every_elementwise_op_of_ops_is_differentiable_in_autograd():
    """A new elementwise op needs no backward code in autograd: `name = differentiable(ops.name)`."""
    names = [n for n in ops_ew.__all__ if n not in ("broadcast_shapes", "elementwise")]
    missing = [n for n in names if not hasattr(ag_ew, n)]
    assert not missing, (
        f"add `name = differentiable(ops.name)` to netcl/autograd/elementwise.py for {missing}"
    )
    for n in names:
        theirs = inspect.signature(getattr(ops, n)).parameters
        ours = inspect.signature(getattr(ag_ew, n)).parameters
        assert [(p.name, p.default) for p in ours.values()] == [
            (p.name, p.default) for p in theirs.values()
        ], n


# -- PyTorch's conventions where a derivative is not unique (ties, kinks, zeros, NaN) -------------------
NAN, INF = float("nan"), float("inf")
# name -> (function of (module, *tensors), inputs, expected gradient of sum(f) per input). The expected
# values are PyTorch's (torch.autograd on the same inputs), written from its rules.
EDGES = {
    # d/da = b a^(b-1) but 0 where b == 0; d/db = a^b log a but 0 where a == 0 and b >= 0
    "pow": (
        lambda m, a, b: m.pow(a, b),
        [[0.0, 0.0, 0.0, 2.0, -1.0], [0.0, 1.0, -1.0, 0.0, 0.5]],
        [[0.0, 1.0, -INF, 0.0, NAN], [0.0, 0.0, -INF, math.log(2.0), NAN]],
    ),
    "pow_scalar_zero": (lambda m, a: m.pow(a, 0.0), [[0.0, 1.0, -2.0]], [[0.0, 0.0, 0.0]]),
    "rpow_zero_base": (lambda m, b: m.pow(0.0, b), [[0.0, 1.0, -1.0]], [[0.0, 0.0, -INF]]),
    # ties: half to each side; NaN: all of it to both
    "maximum": (
        lambda m, a, b: m.maximum(a, b),
        [[1.0, NAN, 1.0, 2.0, 0.0], [1.0, 1.0, NAN, 1.0, 3.0]],
        [[0.5, 1.0, 1.0, 1.0, 0.0], [0.5, 1.0, 1.0, 0.0, 1.0]],
    ),
    "minimum": (
        lambda m, a, b: m.minimum(a, b),
        [[1.0, NAN, 1.0, 2.0, 0.0], [1.0, 1.0, NAN, 1.0, 3.0]],
        [[0.5, 1.0, 1.0, 0.0, 1.0], [0.5, 1.0, 1.0, 1.0, 0.0]],
    ),
    # a scalar bound (clamp): all of the gradient where min <= x <= max, none at NaN
    "clamp": (
        lambda m, x: m.clamp(x, -0.5, 0.5),
        [[-0.5, 0.5, NAN, 1.0, -1.0, 0.0]],
        [[1.0, 1.0, 0.0, 0.0, 0.0, 1.0]],
    ),
    "maximum_scalar_is_clamp": (
        lambda m, x: m.maximum(x, 0.5),
        [[0.5, 0.4, 0.6, NAN]],
        [[1.0, 0.0, 1.0, 0.0]],
    ),
    "minimum_scalar_is_clamp": (
        lambda m, x: m.minimum(x, 0.5),
        [[0.5, 0.4, 0.6, NAN]],
        [[1.0, 1.0, 0.0, 0.0]],
    ),
    # kinks: relu passes nothing at 0 (its output <= 0) and passes NaN; abs passes nothing at 0 and NaN
    "relu": (lambda m, x: m.relu(x), [[0.0, -0.0, NAN, -1.0, 1.0]], [[0.0, 0.0, 1.0, 0.0, 1.0]]),
    "abs": (lambda m, x: m.abs(x), [[0.0, -0.0, NAN, -1.0, 2.0]], [[0.0, 0.0, 0.0, -1.0, 1.0]]),
    "leaky_relu": (lambda m, x: m.leaky_relu(x, 0.1), [[0.0, NAN, -1.0, 1.0]], [[0.1, 0.1, 0.1, 1.0]]),
    "atan2_origin": (lambda m, a, b: m.atan2(a, b), [[0.0, 1.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, -1.0]]),
    "sqrt_zero": (lambda m, x: m.sqrt(x), [[0.0, 4.0]], [[INF, 0.25]]),
    "div_by_zero": (lambda m, a, b: m.div(a, b), [[1.0, 0.0], [0.0, 0.0]], [[INF, INF], [-INF, NAN]]),
}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_pytorch_conventions_at_the_edges(queue, name):
    fn, inputs, expected = EDGES[name]
    arrays = [np.array(x, dtype=np.float64) for x in inputs]
    ones = np.ones(arrays[0].shape)
    for path, run in PATHS.items():
        _, got = run(queue, fn, arrays, ones)
        for i, (g, want) in enumerate(zip(got, expected)):
            np.testing.assert_array_equal(g.to_host(), np.array(want), err_msg=f"{name}: input {i} ({path})")


@pytest.mark.parametrize("name", ["sign", "floor", "ceil", "round", "trunc"])
def test_piecewise_constant_ops_pass_no_gradient(queue, name):
    x = rnd((4, 7))
    w = R.standard_normal((4, 7))

    def fn(m, t):  # only the identity carries a gradient
        return m.add(t, getattr(m, name)(t))

    for path, run in PATHS.items():
        _, (g,) = run(queue, fn, [x], w)
        assert_close(g, w, np.float64, err_msg=path)


def test_comparisons_and_logical_ops_record_no_graph(queue):
    x = ag.tensor(Tensor.from_host(queue, rnd((3, 5))), requires_grad=True)
    with ag.Tape() as tape:
        results = [ag_ew.gt(x, 0.0), ag_ew.eq(x, x), ag_ew.isnan(x), ag_ew.logical_not(ag_ew.lt(x, 1.0)),
                   ag_ew.cast(x, np.int32)]
    assert tape.recorded == 0
    assert all(not r.requires_grad for r in results)


def test_unknown_op_names_the_table():
    with pytest.raises(NotImplementedError, match="netcl.jit.autodiff.RULES"):
        autodiff.rules("no_such_op", [], None, None)
