"""Elementwise ops against float64 NumPy: every op, broadcasting, views, dtypes, promotion, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import ops
from netcl.core.tensor import Tensor
from netcl.errors import DeviceMismatchError, DTypeError, ShapeError
from tests.reference import assert_close


def _erf(x):
    return np.vectorize(math.erf)(x)


def _gelu(x):
    return 0.5 * x * (1 + _erf(x / np.sqrt(2)))


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


UNARY = {
    "exp": (np.exp, (-3, 3)),
    "log": (np.log, (0.1, 5)),
    "log1p": (np.log1p, (-0.5, 3)),
    "expm1": (np.expm1, (-2, 2)),
    "sqrt": (np.sqrt, (0, 9)),
    "rsqrt": (lambda x: 1 / np.sqrt(x), (0.2, 9)),
    "sin": (np.sin, (-4, 4)),
    "cos": (np.cos, (-4, 4)),
    "tanh": (np.tanh, (-4, 4)),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), (-8, 8)),
    "relu": (lambda x: np.maximum(x, 0), (-2, 2)),
    "silu": (lambda x: x / (1 + np.exp(-x)), (-6, 6)),
    "softplus": (lambda x: np.log1p(np.exp(x)), (-20, 30)),
    "neg": (np.negative, (-2, 2)),
    "abs": (np.abs, (-2, 2)),
    "square": (np.square, (-2, 2)),
    "reciprocal": (lambda x: 1 / x, (0.5, 3)),
    "sign": (np.sign, (-2, 2)),
    "floor": (np.floor, (-3, 3)),
    "ceil": (np.ceil, (-3, 3)),
    "erf": (_erf, (-3, 3)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_float32(queue, rng, name):
    ref, (lo, hi) = UNARY[name]
    a = rng.uniform(lo, hi, size=(7, 33)).astype(np.float32)
    out = getattr(ops, name)(Tensor.from_host(queue, a))
    assert out.dtype == np.float32
    assert_close(out, ref(a.astype(np.float64)), np.float32, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("name", ["exp", "tanh", "sigmoid", "sqrt", "abs"])
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_unary_other_floats(queue, rng, name, dtype):
    ref, (lo, hi) = UNARY[name]
    a = rng.uniform(lo, hi, size=(130,)).astype(dtype)
    out = getattr(ops, name)(Tensor.from_host(queue, a))
    assert out.dtype == dtype
    assert_close(out, ref(a.astype(np.float64)), dtype)


def test_gelu_both_forms(queue, rng):
    a = rng.uniform(-4, 4, size=(17, 3)).astype(np.float32)
    x = Tensor.from_host(queue, a)
    assert_close(ops.gelu(x), _gelu(a.astype(np.float64)), np.float32, rtol=1e-5, atol=1e-6)
    assert_close(ops.gelu(x, approximate="tanh"), _gelu_tanh(a.astype(np.float64)), np.float32,
                 rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="approximate"):
        ops.gelu(x, approximate="erf")


def test_leaky_relu_clamp(queue, rng):
    a = rng.uniform(-3, 3, size=(33,)).astype(np.float32)
    x = Tensor.from_host(queue, a)
    assert_close(ops.leaky_relu(x, 0.2), np.where(a < 0, 0.2 * a, a), np.float32)
    assert_close(ops.clamp(x, -1.0, 0.5), np.clip(a, -1, 0.5), np.float32)
    assert_close(ops.clamp(x, min=0.0), np.maximum(a, 0), np.float32)
    assert_close(ops.clamp(x, max=0.0), np.minimum(a, 0), np.float32)
    lo = rng.uniform(-1, 0, size=(33,)).astype(np.float32)
    assert_close(ops.clamp(x, Tensor.from_host(queue, lo), 1.0), np.clip(a, lo, 1.0), np.float32)


BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "maximum": np.maximum, "minimum": np.minimum, "pow": np.power,
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_broadcast_float32(queue, rng, name):
    a = rng.uniform(0.5, 2, size=(3, 1, 17)).astype(np.float32)
    b = rng.uniform(0.5, 2, size=(7, 1)).astype(np.float32)
    out = getattr(ops, name)(Tensor.from_host(queue, a), Tensor.from_host(queue, b))
    assert out.shape == (3, 7, 17)
    assert_close(out, BINARY[name](a.astype(np.float64), b.astype(np.float64)), np.float32, rtol=3e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.int64, np.uint8])
def test_arith_dtypes(queue, rng, dtype):
    if np.dtype(dtype).kind == "f":
        a = rng.uniform(-4, 4, size=(5, 13)).astype(dtype)
        b = rng.uniform(0.5, 4, size=(13,)).astype(dtype)
    else:
        a = rng.integers(0, 50, size=(5, 13)).astype(dtype)
        b = rng.integers(1, 50, size=(13,)).astype(dtype)
    x, y = Tensor.from_host(queue, a), Tensor.from_host(queue, b)
    r = x * y + x - y
    assert r.dtype == dtype
    with np.errstate(over="ignore"):
        want = a * b + a - b  # NumPy rounds/wraps each step in dtype, as netcl does
    if np.dtype(dtype).kind == "f":
        assert_close(r, want.astype(np.float64), dtype)
    else:
        np.testing.assert_array_equal(r.to_host(), want)


def test_integer_ops(queue, rng):
    a = rng.integers(-20, 20, size=(41,)).astype(np.int32)
    b = rng.integers(1, 6, size=(41,)).astype(np.int32) * rng.choice([-1, 1], size=41).astype(np.int32)
    x, y = Tensor.from_host(queue, a), Tensor.from_host(queue, b)
    np.testing.assert_array_equal((x // y).to_host(), a // b)
    np.testing.assert_array_equal((x % y).to_host(), a % b)
    np.testing.assert_array_equal(ops.abs(x).to_host(), np.abs(a))
    np.testing.assert_array_equal((x ** 3).to_host(), a**3)
    np.testing.assert_array_equal(ops.maximum(x, y).to_host(), np.maximum(a, b))
    q = x / y
    assert q.dtype == np.float32
    assert_close(q, a / b, np.float32)


def test_comparisons_and_logic(queue, rng):
    a = rng.integers(0, 4, size=(6, 7)).astype(np.float32)
    b = rng.integers(0, 4, size=(7,)).astype(np.float32)
    x, y = Tensor.from_host(queue, a), Tensor.from_host(queue, b)
    for name, ref in [("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
                      ("gt", np.greater), ("ge", np.greater_equal)]:
        out = getattr(ops, name)(x, y)
        assert out.dtype == np.bool_
        np.testing.assert_array_equal(out.to_host(), ref(a, b), err_msg=name)
    np.testing.assert_array_equal(((x > 1) & (y < 3)).to_host(), (a > 1) & (b < 3))
    np.testing.assert_array_equal(((x > 1) | ~(y < 3)).to_host(), (a > 1) | ~(b < 3))
    np.testing.assert_array_equal((x == 2.0).to_host(), a == 2)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_bitwise_ops_on_integers_match_numpy(queue, rng, dtype):
    """&, |, ^, ~, <<, >> are bitwise on integers (NumPy and PyTorch; they were logical: IA & 2 gave bools),
    broadcasting, with scalars on either side, on a non-contiguous view; shifts past the width as NumPy."""
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, size=(5, 17), endpoint=True, dtype=dtype)
    b = rng.integers(info.min, info.max, size=(17,), endpoint=True, dtype=dtype)
    shifts = rng.integers(0, 8 * a.itemsize + 3, size=(17,)).astype(dtype)
    x, y, s = (Tensor.from_host(queue, v) for v in (a, b, shifts))
    for got, want in [(x & y, a & b), (x | y, a | b), (x ^ y, a ^ b), (~x, ~a), (x & 6, a & 6),
                      (6 | x, 6 | a), (x[::2, ::-3] ^ 5, a[::2, ::-3] ^ 5), (ops.bitwise_not(x), ~a),
                      (x << s, a << shifts), (x >> s, a >> shifts), (x << 3, a << dtype(3)),
                      (1 << s, dtype(1) << shifts), (ops.right_shift(x, 2), a >> dtype(2))]:
        assert got.dtype == dtype
        np.testing.assert_array_equal(got.to_host(), want)


def test_bitwise_ops_on_bool_are_logical_and_floats_are_refused(queue, rng):
    a, b = rng.random((3, 7)) > 0.5, rng.random((7,)) > 0.5
    x, y = Tensor.from_host(queue, a), Tensor.from_host(queue, b)
    for got, want in [(x & y, a & b), (x | y, a | b), (x ^ y, a ^ b), (~x, ~a), (x ^ True, a ^ True)]:
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got.to_host(), want)
    i = Tensor.from_host(queue, np.array([1, 2, 3], np.int32))
    np.testing.assert_array_equal((i & Tensor.from_host(queue, np.array([True, False, True]))).to_host(),
                                  np.array([1, 2, 3], np.int32) & np.array([True, False, True]))
    f = Tensor.from_host(queue, np.ones(3, np.float32))
    for op in (lambda: f & 1, lambda: i | f, lambda: ~f, lambda: f ^ f, lambda: i << 1.5):
        with pytest.raises(DTypeError, match="integer or bool"):
            op()
    with pytest.raises(DTypeError, match="bool"):
        x << y


def test_where_masked_fill(queue, rng):
    a = rng.standard_normal((4, 9)).astype(np.float32)
    b = rng.standard_normal((9,)).astype(np.float32)
    c = rng.random((4, 1)) > 0.5
    x, y, m = Tensor.from_host(queue, a), Tensor.from_host(queue, b), Tensor.from_host(queue, c)
    assert_close(ops.where(m, x, y), np.where(c, a, b), np.float32)
    assert_close(ops.where(x > 0, x, 0.0), np.where(a > 0, a, 0), np.float32)
    mask = Tensor.from_host(queue, a > 0.3)
    assert_close(ops.masked_fill(x, mask, -1e9), np.where(a > 0.3, -1e9, a).astype(np.float32), np.float32)


def test_nan_propagation(queue):
    a = np.array([np.nan, 1.0, -1.0, np.nan], np.float32)
    b = np.array([0.0, np.nan, 2.0, np.nan], np.float32)
    x, y = Tensor.from_host(queue, a), Tensor.from_host(queue, b)
    np.testing.assert_array_equal(ops.maximum(x, y).to_host(), np.maximum(a, b))
    np.testing.assert_array_equal(ops.minimum(x, y).to_host(), np.minimum(a, b))
    np.testing.assert_array_equal(ops.relu(x).to_host(), np.array([np.nan, 1, 0, np.nan], np.float32))
    np.testing.assert_array_equal(ops.isnan(x).to_host(), np.isnan(a))


def test_non_contiguous_inputs(queue, rng):
    a = rng.standard_normal((9, 17)).astype(np.float32)
    b = rng.standard_normal((17, 9)).astype(np.float32)
    x, y = Tensor.from_host(queue, a), Tensor.from_host(queue, b)
    out = x[::2, 1:] * y.T[::2, 1:] + x[::-2, :-1]
    want = a[::2, 1:] * b.T[::2, 1:] + a[::-2, :-1]
    assert_close(out, want.astype(np.float64), np.float32)
    e = Tensor.from_host(queue, a[:1]).expand(5, 17)
    assert_close(ops.exp(e), np.exp(np.broadcast_to(a[:1], (5, 17)).astype(np.float64)), np.float32)


def test_scalar_promotion(queue):
    f32 = Tensor.from_host(queue, np.array([1.5, 2.5], np.float32))
    f16 = Tensor.from_host(queue, np.array([1.5, 2.5], np.float16))
    i32 = Tensor.from_host(queue, np.array([1, 2], np.int32))
    b = Tensor.from_host(queue, np.array([True, False]))
    assert (f32 * 2.0).dtype == np.float32
    assert (f16 + 1.5).dtype == np.float16
    assert (i32 + 1).dtype == np.int32
    assert (i32 * 0.5).dtype == np.float32
    assert (b + 1).dtype == np.int32
    assert (i32 + f16).dtype == np.float16
    assert (f16 + f32).dtype == np.float32
    assert ops.exp(i32).dtype == np.float32
    np.testing.assert_array_equal((2 - i32).to_host(), [1, 0])
    assert_close(1.0 / f32, 1 / np.array([1.5, 2.5]), np.float32)
    assert_close(
        f16 * 0.1, (np.array([1.5, 2.5], np.float16) * np.float16(0.1)).astype(np.float64), np.float16
    )
    np.testing.assert_array_equal((b & True).to_host(), [True, False])


def test_cast(queue, rng):
    a = rng.uniform(-5, 5, size=(3, 11)).astype(np.float32)
    x = Tensor.from_host(queue, a)
    np.testing.assert_array_equal(ops.cast(x, np.int32).to_host(), a.astype(np.int32))
    np.testing.assert_array_equal(x.astype("float16").to_host(), a.astype(np.float16))
    np.testing.assert_array_equal(ops.cast(x, np.bool_).to_host(), a.astype(np.bool_))
    np.testing.assert_array_equal(ops.cast(x > 0, np.float32).to_host(), (a > 0).astype(np.float32))
    assert_close(ops.cast(x, np.float64), a.astype(np.float64), np.float64)


def test_bool_rules(queue):
    b = Tensor.from_host(queue, np.array([True, False, True]))
    with pytest.raises(DTypeError, match="bool"):
        ops.neg(b)
    with pytest.raises(DTypeError, match="bool"):
        ops.sub(b, b)
    np.testing.assert_array_equal(
        (b + b).to_host(), np.array([True, False, True]) + np.array([True, False, True])
    )
    np.testing.assert_array_equal(ops.abs(b).to_host(), [True, False, True])


def test_zero_size_and_0d(queue):
    z = Tensor.from_host(queue, np.zeros((0, 3), np.float32))
    assert (z + 1).to_host().shape == (0, 3)
    s = Tensor.from_host(queue, np.array(2.0, np.float32))
    assert_close(s * 3, np.array(6.0), np.float32)


def test_errors(queue, device):
    x = Tensor.from_host(queue, np.zeros((3, 4), np.float32))
    y = Tensor.from_host(queue, np.zeros((5,), np.float32))
    with pytest.raises(ShapeError, match=r"\(3, 4\) and \(5,\)"):
        ops.add(x, y)
    with pytest.raises(DTypeError, match="NumPy array"):
        ops.add(x, np.zeros(4))
    with pytest.raises(DTypeError):
        ops.add(x, "a")
    other = device.new_queue()
    z = Tensor.from_host(other, np.zeros((3, 4), np.float32))
    with pytest.raises(DeviceMismatchError, match="two different queues of one device"):
        ops.mul(x, z)


def test_integer_division_edges_match_numpy(queue):
    """Floor semantics for negative operands, 0 for a zero divisor, and MIN // -1 wrapping as in NumPy
    (x86 traps on that division: on a CPU device it used to be able to kill the process)."""
    a = np.array([-7, 7, -7, 7, -2**31, 5, 0], np.int32)
    b = np.array([3, -3, -3, 3, -1, 0, -1], np.int32)
    ta, tb = Tensor.from_host(queue, a), Tensor.from_host(queue, b)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal((ta // tb).to_host(), a // b)
        np.testing.assert_array_equal((ta % tb).to_host(), a % b)
        np.testing.assert_array_equal((ta // -1).to_host(), a // -1)


def test_integer_powers_follow_numpy(queue):
    """NumPy refuses an integer to a negative integer power, for a scalar exponent and for any negative
    entry of an array exponent; tensor exponents gave PyTorch's silent 0 (2 ** -1) instead."""
    x = Tensor.from_host(queue, np.array([2, 1, -1, -2], np.int32))
    np.testing.assert_array_equal((x ** 3).to_host(), np.array([8, 1, -1, -8], np.int32))
    with pytest.raises(ValueError, match=r"\(int32 \*\* -1\), as in NumPy; cast the base to a float dtype"):
        x ** -1
    e = Tensor.from_host(queue, np.array([-1, -2, -3, 2], np.int32))
    with pytest.raises(ValueError, match=r"\(int32 \*\* an exponent tensor of int32 holding -3\), as in"):
        x ** e
    with pytest.raises(ValueError, match=r"\(int \*\* an exponent tensor of int32 holding -3\)"):
        2 ** e  # a Python integer base
    with pytest.raises(ValueError, match="holding -1"):
        Tensor.from_host(queue, np.array([3], np.uint8)) ** Tensor.from_host(queue, np.array([-1], np.int64))
    for base, exponent in (([2, 1, -1, -2], [0, 3, 2, 1]), ([3, 0, 5, -2], [1, 0, 2, 3])):
        a, b = np.array(base, np.int32), np.array(exponent, np.int32)
        got = (Tensor.from_host(queue, a) ** Tensor.from_host(queue, b)).to_host()
        np.testing.assert_array_equal(got, a ** b)
    f = Tensor.from_host(queue, np.array([2.0, 4.0], np.float32))  # a float base takes negative powers
    np.testing.assert_allclose((f ** Tensor.from_host(queue, np.array([-1, -2], np.int32))).to_host(),
                               [0.5, 0.0625])
    np.testing.assert_allclose((x ** -1.0).to_host(), [0.5, 1, -1, -0.5])  # a float exponent: a float result


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_round_with_decimals_matches_torch(queue, rng, dtype):
    """torch.round(x, decimals=d): rint(x * 10**d) / 10**d in x's dtype (d < 0: rint(x / 10**-d) * 10**-d),
    bit for bit; it raised a TypeError naming an internal function. On a Node too (no gradient flows)."""
    torch = pytest.importorskip("torch")
    a = (rng.standard_normal(1000) * 100).astype(dtype)
    a[:4] = [0.25, -0.35, 2.5, 15.0]  # halves: to even
    x = Tensor.from_host(queue, a)
    for d in (1, 2, 3, -1, -2, 0):
        want = torch.round(torch.from_numpy(a), decimals=d).numpy()
        np.testing.assert_array_equal(x.round(decimals=d).to_host(), want, err_msg=f"decimals={d}")
        np.testing.assert_array_equal(ops.round(x, d).to_host(), want, err_msg=f"decimals={d}")
    node = ag.tensor(x, requires_grad=True)
    np.testing.assert_array_equal(node.round(decimals=2).value.to_host(),
                                  torch.round(torch.from_numpy(a), decimals=2).numpy())
    i = Tensor.from_host(queue, np.array([15, -25], np.int32))
    np.testing.assert_array_equal(i.round(decimals=1).to_host(), [15, -25])
    with pytest.raises(DTypeError, match="decimals=-1 on int32"):
        i.round(decimals=-1)
    with pytest.raises(TypeError, match="decimals must be an int"):
        x.round(1.5)
