"""sort and argsort against NumPy's stable sort (and PyTorch's, where it is installed): odd lengths on both
kernel paths (a row in one work-group's chunk, and the global merge steps past it), every dtype, NaN, +-inf,
ties, views, PyTorch's and NumPy's spellings, the values' gradient, bad arguments."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import netcl.autograd as ag
from netcl import ops
from netcl.core.shapes import ValuesIndices
from netcl.core.tensor import Tensor
from netcl.errors import ShapeError
from netcl.ops import sorting
from netcl.profiling import count_launches


def reference(a: np.ndarray, axis: int = -1, descending: bool = False) -> np.ndarray:
    """The stable order along `axis` (NaN last; descending: largest first, NaN first, ties in their order)."""
    keys = a.astype(np.float32) if a.dtype == ml_dtypes.bfloat16 else a
    if not descending:
        return np.argsort(keys, axis=axis, kind="stable")
    n = a.shape[axis]
    backwards = np.argsort(np.flip(keys, axis), axis=axis, kind="stable")   # ties: last position first
    return np.flip(n - 1 - backwards, axis)


def check(x: Tensor, a: np.ndarray, axis: int = -1, descending: bool = False) -> None:
    values, indices = ops.sort(x, axis if axis is not None else -1, descending=descending)
    order = reference(a, axis, descending)
    assert indices.dtype == np.int64 and values.dtype == a.dtype and values.shape == a.shape
    np.testing.assert_array_equal(indices.to_host(), order)
    np.testing.assert_array_equal(values.to_host(), np.take_along_axis(a, order, axis))
    np.testing.assert_array_equal(ops.argsort(x, axis, descending).to_host(), order)


@pytest.mark.parametrize("shape, axis", [((1,), 0), ((7,), -1), ((5, 3), -1), ((3, 5), 0), ((2, 1000), -1),
                                         ((4097,), 0), ((3, 2, 600), 2), ((0, 4), -1), ((4, 0), -1)])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_matches_numpys_stable_order_at_odd_lengths(queue, rng, shape, axis, descending):
    """Lengths 1..4097: one work-group's chunk (<= 512) and the global steps past it (1000, 4097 and 600,
    whose padded rows of 1024 span two chunks); draws from few values, so ties run through every length."""
    a = rng.integers(-20, 20, shape).astype(np.float32) / 4
    check(Tensor.from_host(queue, a), a, axis, descending)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int32, np.int64,
                                   np.uint8, np.bool_])
@pytest.mark.parametrize("n", [13, 700])
def test_every_dtype(queue, device, rng, dtype, n):
    if dtype == np.float64 and not device.capabilities.fp64:
        pytest.skip("no fp64")
    if np.dtype(dtype) == np.int64:   # beyond float64's 53 bits: keys are compared as integers
        a = (2**62 + rng.integers(-3, 3, (3, n))).astype(np.int64)
    elif np.dtype(dtype).kind in "iub":
        a = rng.integers(0, 5 if dtype == np.uint8 else 2, (3, n)).astype(dtype)
    else:
        a = (rng.standard_normal((3, n)) * 3).astype(dtype)
        a[0, :4] = a[0, 4:8]   # ties
    x = Tensor.from_host(queue, a)
    check(x, a)
    check(x, a, descending=True)


@pytest.mark.parametrize("n", [9, 1000])
def test_nan_and_infinities_sort_as_numpy_and_pytorch(queue, rng, n):
    """NaN after +inf ascending (NumPy, PyTorch), before it descending (PyTorch); -0.0 equals 0.0 (ties)."""
    a = rng.standard_normal((3, n)).astype(np.float32)
    a[:, 1] = np.nan
    a[:, 2] = np.inf
    a[:, 3] = -np.inf
    a[:, 4] = np.nan
    a[:, 5], a[:, 6] = -0.0, 0.0
    a[2] = np.nan   # a row of NaN alone
    x = Tensor.from_host(queue, a)
    check(x, a)
    check(x, a, descending=True)
    torch = pytest.importorskip("torch")
    for descending in (False, True):
        want = torch.sort(torch.from_numpy(a), dim=-1, descending=descending, stable=True)
        got = ops.sort(x, descending=descending)
        np.testing.assert_array_equal(got.indices.to_host(), want.indices.numpy())
        np.testing.assert_array_equal(got.values.to_host(), want.values.numpy())


def test_views_and_pending_inputs(queue, rng):
    a = rng.standard_normal((6, 5, 8)).astype(np.float32)
    x = Tensor.from_host(queue, a)
    check(x.transpose(0, 2)[1:, ::2], a.transpose(2, 1, 0)[1:, ::2], 1)   # strided, along a middle axis
    check(x[:, ::-1], a[:, ::-1], 0)
    with count_launches() as launches:
        values, _ = ops.sort(x * 2 - 1, 2)   # the pending product: computed, then one sort launch
    assert launches.count == 2
    np.testing.assert_array_equal(values.to_host(), np.sort(a * 2 - 1, axis=2))


def test_pytorch_and_numpy_spellings(queue, rng):
    """torch.sort's (values, indices); np.sort's values alone when spelled with axis= or kind=; argsort is the
    indices in both; a 0-d tensor sorts as one element (PyTorch's)."""
    a = rng.standard_normal((4, 6)).astype(np.float32)
    x = Tensor.from_host(queue, a)
    pair = x.sort(0)
    assert isinstance(pair, ValuesIndices)
    values, indices = x.sort(dim=0, descending=False, stable=True)
    np.testing.assert_array_equal(values.to_host(), np.sort(a, 0))
    np.testing.assert_array_equal(pair.indices.to_host(), indices.to_host())
    for got, want in ((ops.sort(x, axis=0), np.sort(a, axis=0)), (x.sort(axis=None), np.sort(a, axis=None)),
                      (ops.sort(x, kind="stable"), np.sort(a, kind="stable")),
                      (ops.argsort(x, axis=None), np.argsort(a, axis=None, kind="stable")),
                      (x.argsort(0, kind="mergesort"), np.argsort(a, 0, kind="stable")),
                      (ops.argsort(x, dim=1, descending=True), np.argsort(-a, 1, kind="stable"))):
        assert isinstance(got, Tensor)
        np.testing.assert_array_equal(got.to_host(), want)
    scalar = Tensor.from_host(queue, np.float32(3.5))
    v, i = scalar.sort()
    assert v.shape == () and v.item() == 3.5 and i.item() == 0


def test_sort_gradient_flows_back_through_the_indices(queue, rng):
    """d values / d x: each value's gradient lands where it came from; the indices are a Tensor, no Node."""
    a = rng.permutation(3 * 700).reshape(3, 700).astype(np.float32)
    w = rng.standard_normal((3, 700)).astype(np.float32)
    x = ag.tensor(Tensor.from_host(queue, a), requires_grad=True)
    with ag.Tape() as tape:
        values, indices = x.sort(dim=1, descending=True)
        loss = (values * ag.tensor(Tensor.from_host(queue, w))).sum()
    assert isinstance(values, ag.Node) and isinstance(indices, Tensor)
    tape.backward(loss)
    want = np.zeros_like(w)
    np.put_along_axis(want, indices.to_host(), w, 1)
    np.testing.assert_array_equal(x.grad.to_host(), want)
    x.grad = None
    with ag.Tape() as tape:   # NumPy's spelling on a Node: the values alone, over the flattened input
        loss = (ag.sort(x, axis=None) * ag.tensor(Tensor.from_host(queue, w.reshape(-1)))).sum()
    tape.backward(loss)
    want = np.zeros(a.size, np.float32)
    want[np.argsort(a, axis=None)] = w.reshape(-1)
    np.testing.assert_array_equal(x.grad.to_host(), want.reshape(a.shape))


def test_the_global_steps_with_a_small_chunk(queue, rng, monkeypatch):
    """A work-group of 4 (chunks of 8): rows of 5..37 take sort_first, several sort_step and sort_merge
    rounds, as long rows do with the device's chunk."""
    monkeypatch.setattr(sorting, "SORT_WG", 4)
    for n in (5, 9, 37):
        a = rng.integers(-4, 4, (3, n)).astype(np.float32)
        a[1, ::3] = np.nan
        x = Tensor.from_host(queue, a)
        check(x, a)
        check(x, a, descending=True)


def test_bad_arguments_say_what_to_write(queue):
    x = Tensor.from_host(queue, np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="kind goes by name here: kind='stable'"):
        ops.sort(x, -1, "stable")   # np.sort(a, -1, 'stable'): the third place is PyTorch's descending
    with pytest.raises(TypeError, match="dim=0 and axis=1 are one argument"):
        ops.sort(x, 0, axis=1)
    with pytest.raises(ValueError, match="kind must be one of"):
        ops.argsort(x, kind="bogo")
    with pytest.raises(ValueError, match="not both"):
        ops.sort(x, kind="stable", stable=True)
    with pytest.raises(ShapeError, match="out of range for a tensor of shape"):
        x.sort(2)
    with pytest.raises(TypeError, match="expected a Tensor, got ndarray"):
        ops.argsort(np.zeros(3))
