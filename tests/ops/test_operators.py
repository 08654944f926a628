"""Tensor's math methods (netcl.ops.operators) and Node's (netcl.autograd.operators) come from one list, so
the two surfaces cannot disagree, and each method of both computes the same values."""

from __future__ import annotations

import math
import operator

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.autograd import elementwise as ag_elementwise
from netcl.autograd import reduce as ag_reduce
from netcl.autograd.engine import Node
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError
from netcl.ops import elementwise, reduce
from netcl.ops.operators import (
    DTYPE_METHODS,
    ELEMENTWISE_METHODS,
    METHOD_ALIASES,
    REDUCE_METHODS,
    TENSOR_ONLY_METHODS,
    declared_methods,
)
from tests.reference import assert_close

# the declared ops' methods (netcl.ops.declaration: matmul, softmax, log_softmax) are both surfaces' too
SHARED = (ELEMENTWISE_METHODS + REDUCE_METHODS + declared_methods() + tuple(METHOD_ALIASES)
          + tuple(DTYPE_METHODS))
# the arguments after the tensor of the methods that need some
ARGS = {"clamp": (-0.5, 0.5), "clip": (-0.5, 0.5), "pow": (2.0,), "cast": (np.float64,),
        "astype": (np.float64,), "leaky_relu": (0.1,), "softmax": (-1,), "log_softmax": (-1,),
        "reshape": (17, 3), "permute": (1, 0), "transpose": (0, 1), "unsqueeze": (1,), "expand": (2, 3, 17),
        "swapaxes": (0, 1), "moveaxis": (0, 1), "movedim": (1, 0), "expand_dims": ((0, 2),), "sort": (0,)}


def test_tensor_and_node_have_the_same_math_methods():
    """Every math op of netcl.ops that autograd differentiates is a method of both or of neither; the
    Tensor-only ones are the declared few (softplus was once a Node method only)."""
    ops_math = {n for n in list(elementwise.__all__) + dir(reduce) if not n.startswith("_")}
    differentiable = {n for n in ops_math if hasattr(ag_elementwise, n) or hasattr(ag_reduce, n)}
    on_tensor = {n for n in differentiable if callable(getattr(Tensor, n, None))}
    on_node = {n for n in differentiable if callable(getattr(Node, n, None))}
    assert on_tensor - set(TENSOR_ONLY_METHODS) == on_node, (
        f"Tensor only: {sorted(on_tensor - on_node)}; Node only: {sorted(on_node - on_tensor)}")
    for name in SHARED:
        assert callable(getattr(Tensor, name)) and callable(getattr(Node, name)), name
    for name in TENSOR_ONLY_METHODS:
        assert callable(getattr(Tensor, name)) and not hasattr(Node, name), name


@pytest.mark.parametrize("name", SHARED)
def test_each_shared_method_gives_tensor_and_node_the_same_values(queue, rng, name):
    """The Tensor method and the Node method of one name compute the same bits (one kernel behind both) on
    an odd shape; a few are checked against float64 NumPy too."""
    a = (rng.standard_normal((3, 17)) * 0.8).astype(np.float32)
    if name in ("log", "sqrt", "rsqrt", "reciprocal"):
        a = np.abs(a) + 0.25
    args = ARGS.get(name, ())
    if name == "matmul":
        args = (Tensor.from_host(queue, (rng.standard_normal((17, 5)) * 0.8).astype(np.float32)),)
    on_tensor = getattr(Tensor.from_host(queue, a), name)(*args)
    with ag.Tape():
        on_node = getattr(ag.tensor(Tensor.from_host(queue, a)), name)(*args)
    if name == "sort":   # (values, indices): the values a Node, the indices a Tensor on both
        np.testing.assert_array_equal(on_tensor.indices.to_host(), on_node.indices.to_host())
        on_tensor, on_node = on_tensor.values, on_node.values
    assert isinstance(on_node, Node)
    np.testing.assert_array_equal(on_tensor.to_host(), on_node.value.to_host())
    a64 = a.astype(np.float64)
    reference = {"softplus": np.log1p(np.exp(a64)), "exp": np.exp(a64), "tanh": np.tanh(a64),
                 "erf": np.vectorize(math.erf)(a64), "sum": np.array([a64.sum()]), "square": a64 * a64}
    if name in reference:
        want = reference[name]
        assert_close(on_tensor.reshape(want.shape) if name == "sum" else on_tensor, want, np.float32,
                     atol=2e-5 if name == "sum" else None)


def test_comparing_with_host_data_is_the_error_arithmetic_gives(queue, rng):
    """`A == a` with a NumPy array, a list or a 0-d array was Python's identity fallback (one bool, False):
    it is the error `A + a` gives, telling to move the data to the device first."""
    a = rng.standard_normal((3, 5)).astype(np.float32)
    x = Tensor.from_host(queue, a)
    for host in (a, a[0], np.array(0.5, np.float32), [0.5, 1.0, 2.0, 3.0, 4.0], (1.0,)):
        for compare in (operator.eq, operator.ne):
            with pytest.raises(DTypeError) as got:
                compare(x, host)
            with pytest.raises(DTypeError):
                compare(host, x)
            with pytest.raises(DTypeError) as added:
                x + host
            assert str(got.value).split(":", 1)[1] == str(added.value).split(":", 1)[1]
    assert ((x == Tensor.from_host(queue, a)).to_host() == np.ones_like(a, bool)).all()
    assert (x == None) is False and (x != "x") is True  # noqa: E711  (Python's fallback for other objects)


INPLACE = {"+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
           "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow, "&=": operator.iand,
           "|=": operator.ior, "^=": operator.ixor, "<<=": operator.ilshift, ">>=": operator.irshift}


@pytest.mark.parametrize("symbol", sorted(INPLACE))
def test_in_place_operators_write_into_the_tensors_memory(queue, rng, symbol):
    """Every in-place operator writes into the tensor's memory as PyTorch's: a view of it sees the change and
    the result is the tensor itself (//=, **=, %=, &=, |=, ^= made a new tensor, the view kept old values)."""
    integer = symbol in ("&=", "|=", "^=", "<<=", ">>=")
    dtype = np.int32 if integer else np.float32
    a = (rng.integers(1, 9, size=(3, 17)) if integer else rng.uniform(0.5, 3, (3, 17))).astype(dtype)
    b = rng.integers(1, 5, size=(17,)).astype(dtype)
    x = Tensor.from_host(queue, a)
    view = x[1:]
    out = INPLACE[symbol](x, Tensor.from_host(queue, b))
    want = INPLACE[symbol](a.copy(), b)
    assert out is x
    if integer:
        np.testing.assert_array_equal(x.to_host(), want)
    else:
        assert_close(x, want, dtype)
    np.testing.assert_array_equal(view.to_host(), x.to_host()[1:])


def test_node_power_in_place_writes_its_tensor_outside_a_tape(queue):
    p = ag.tensor(Tensor.from_host(queue, np.array([1.5, -2.0, 3.0], np.float32)))
    value = p.value
    with ag.no_grad():
        p **= 2
    assert p.value is value
    np.testing.assert_array_equal(value.to_host(), np.array([2.25, 4.0, 9.0], np.float32))


@pytest.mark.parametrize(("dtype", "symbol", "value"), [
    (np.int32, "+=", 1.5), (np.int32, "/=", 2), (np.int64, "*=", 0.5), (np.uint8, "**=", 0.5),
    (np.int32, "-=", np.float32(1.0)), (np.bool_, "+=", 1), (np.bool_, "|=", 3),
    (np.int32, "+=", "f32 tensor"),
])
def test_in_place_refuses_a_result_of_a_higher_kind(queue, dtype, symbol, value):
    """`X += 1.5` on an int32 tensor truncated silently; PyTorch raises "result type Float can't be cast to
    the desired output type Int". The tensor keeps its values."""
    a = np.array([1, 0, 3], dtype)
    x = Tensor.from_host(queue, a)
    if isinstance(value, str):
        value = Tensor.from_host(queue, np.ones(3, np.float32))
    with pytest.raises(DTypeError, match=f"can't be cast to the tensor's dtype {np.dtype(dtype)}"):
        INPLACE[symbol](x, value)
    np.testing.assert_array_equal(x.to_host(), a)


def test_in_place_keeps_results_of_the_same_kind(queue):
    """Narrower targets of the same kind stay allowed, as in PyTorch: float16 += float32, int32 += int64."""
    h = Tensor.from_host(queue, np.array([1.5, 2.0], np.float16))
    h += Tensor.from_host(queue, np.array([0.25, 1.0], np.float32))
    np.testing.assert_array_equal(h.to_host(), np.array([1.75, 3.0], np.float16))
    i = Tensor.from_host(queue, np.array([1, 2], np.int32))
    i += Tensor.from_host(queue, np.array([5, 7], np.int64))
    i //= 2
    assert i.dtype == np.int32
    np.testing.assert_array_equal(i.to_host(), [3, 4])
    b = Tensor.from_host(queue, np.array([True, False]))
    b |= Tensor.from_host(queue, np.array([False, False]))
    np.testing.assert_array_equal(b.to_host(), [True, False])
