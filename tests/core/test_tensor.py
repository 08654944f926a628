"""Tensor: creation, dtypes, host round trips, views that share memory, copies, repr, errors."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.core.tensor import Tensor, check_same_queue
from netcl.errors import DeviceMismatchError, DTypeError, ScalarOverflowError, ShapeError

ALL_DTYPES = [np.float16, np.float32, np.float64, np.int32, np.int64, np.uint8, np.bool_]


def _sample(rng, shape, dtype):
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 100, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_round_trip_every_dtype(queue, rng, dtype):
    a = _sample(rng, (3, 17, 5), dtype)
    t = Tensor.from_host(queue, a)
    assert t.shape == (3, 17, 5) and t.dtype == np.dtype(dtype) and t.strides == (85, 5, 1)
    assert t.nbytes == a.nbytes and t.queue is queue and t.device is queue.device
    np.testing.assert_array_equal(t.to_host(), a)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_full_zeros_ones(queue, dtype):
    np.testing.assert_array_equal(Tensor.zeros(queue, (7, 3), dtype).to_host(), np.zeros((7, 3), dtype))
    np.testing.assert_array_equal(Tensor.ones(queue, (130,), dtype).to_host(), np.ones(130, dtype))
    np.testing.assert_array_equal(Tensor.full(queue, (2, 3), 5, dtype).to_host(), np.full((2, 3), 5, dtype))


def test_empty_and_scalar_shapes(queue):
    assert Tensor.zeros(queue, (0, 4)).to_host().shape == (0, 4)
    s = Tensor.from_host(queue, np.float32(2.5))
    assert s.shape == () and s.item() == 2.5


def test_unsupported_dtypes_are_refused(queue):
    with pytest.raises(DTypeError, match="complex64"):
        Tensor.from_host(queue, np.zeros(3, np.complex64))
    with pytest.raises(DTypeError, match="not supported"):
        Tensor.empty(queue, (2,), np.int16)
    with pytest.raises(DTypeError, match="not a dtype"):
        Tensor.empty(queue, (2,), "nonsense")


def test_float64_refused_without_fp64(queue, monkeypatch):
    import dataclasses

    caps = dataclasses.replace(queue.device.capabilities, fp64=False)
    monkeypatch.setattr(queue.device, "capabilities", caps)
    with pytest.raises(DTypeError, match="cl_khr_fp64"):
        Tensor.zeros(queue, (3,), np.float64)


def test_bad_shapes(queue):
    with pytest.raises(ShapeError, match="negative"):
        Tensor.empty(queue, (3, -1))
    with pytest.raises(ShapeError, match="at most 8"):
        Tensor.empty(queue, (1,) * 9)


def test_views_share_memory(queue, rng):
    a = rng.standard_normal((4, 6)).astype(np.float32)
    t = Tensor.from_host(queue, a)
    v = t.reshape(2, 12)
    assert v.storage is t.storage
    v[1, 3:5].fill_(7.0)
    a.reshape(2, 12)[1, 3:5] = 7.0
    np.testing.assert_array_equal(t.to_host(), a)


def test_transpose_permute_and_contiguous(queue, rng):
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    t = Tensor.from_host(queue, a)
    assert not t.transpose(0, 2).is_contiguous()
    np.testing.assert_array_equal(t.transpose(0, 2).to_host(), a.swapaxes(0, 2))
    np.testing.assert_array_equal(t.permute(2, 0, 1).to_host(), a.transpose(2, 0, 1))
    np.testing.assert_array_equal(t.T.to_host(), a.T)
    for dims in ((-1, 0, -2), [2, 0, 1], (np.int64(2), 0, 1), ((2, 0, 1),)):   # every form of the axes
        got = t.permute(*dims) if isinstance(dims, tuple) else t.permute(dims)
        np.testing.assert_array_equal(got.to_host(), a.transpose(2, 0, 1))
    for bad in ((0, 0, 1), (0, 1), (0, 1, 3), (0, 1, 2.0)):
        with pytest.raises((ShapeError, TypeError)):
            t.permute(*bad)
    c = t.permute(1, 2, 0).contiguous()
    assert c.is_contiguous() and c.storage is not t.storage
    np.testing.assert_array_equal(c.to_host(), a.transpose(1, 2, 0))
    assert t.contiguous() is t


def test_transpose_swaps_two_axes_takes_numpys_permutation_and_refuses_the_ambiguous_default(queue, rng):
    """PyTorch's swap of two axes; NumPy's permutation of all of them (PyTorch refuses that form); no axes:
    a matrix's transpose, but on more axes a TypeError naming both meanings (it swapped the last two
    silently where NumPy reverses them all)."""
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    t = Tensor.from_host(queue, a)
    for got, want in [(t.transpose(0, 2), a.swapaxes(0, 2)), (t.transpose(-2, -1), a.swapaxes(1, 2)),
                      (t.transpose(dim0=1, dim1=0), a.swapaxes(0, 1)),
                      (t.transpose(1, 0, 2), a.transpose(1, 0, 2)),
                      (t.transpose((2, 0, 1)), a.transpose(2, 0, 1)),
                      (t.transpose([0, 2, 1]), a.transpose(0, 2, 1)), (t[0].transpose(), a[0].T),
                      (t[0, 0].transpose(), a[0, 0]), (t[0, :, ::2].transpose(), a[0, :, ::2].T)]:
        np.testing.assert_array_equal(got.to_host(), want)
    for args in ((), (1,), (0, 1, 2, 3), ((0, 1),)):
        with pytest.raises(TypeError, match=r"x.transpose\(-2, -1\).*NumPy's x.transpose\(\) reverses"):
            t.transpose(*args)
    with pytest.raises(ShapeError):
        t.transpose(1, 1, 2)
    with pytest.raises(ShapeError):
        t.transpose(0, 3)


@pytest.mark.parametrize(
    "index",
    [
        (slice(None), slice(None, None, 2)),
        (slice(1, None, 3), Ellipsis, slice(None, None, -1)),
        (2,),
        (-1, slice(2, 7)),
        (Ellipsis, 1),
        (None, slice(None), None, 3),
        (slice(5, 2),),
        (slice(None, None, -2), slice(4, 0, -1)),
    ],
)
def test_basic_slicing_matches_numpy(queue, rng, index):
    a = rng.standard_normal((7, 9)).astype(np.float32)
    t = Tensor.from_host(queue, a)
    np.testing.assert_array_equal(t[index].to_host(), a[index])


def test_slicing_errors(queue):
    t = Tensor.zeros(queue, (3, 4))
    with pytest.raises(ShapeError, match="out of bounds for axis 1"):
        t[0, 9]
    with pytest.raises(ShapeError, match="too many indices"):
        t[0, 0, 0]
    with pytest.raises(ShapeError, match=r"index 1.5 \(float\) is not basic indexing"):
        t[1.5]


def test_reshape_view_rules(queue, rng):
    a = rng.standard_normal((4, 6)).astype(np.float32)
    t = Tensor.from_host(queue, a)
    np.testing.assert_array_equal(t.reshape(-1, 8).to_host(), a.reshape(-1, 8))
    np.testing.assert_array_equal(t.view(2, 2, 6).to_host(), a.reshape(2, 2, 6))
    tt = t.T  # (6, 4), not contiguous
    np.testing.assert_array_equal(tt.reshape(24).to_host(), a.T.reshape(24))
    with pytest.raises(ShapeError, match="without a copy"):
        tt.view(24)
    np.testing.assert_array_equal(tt.view(6, 2, 2).to_host(), a.T.reshape(6, 2, 2))
    sliced = t[:, ::2]  # (4, 3) stride 2
    np.testing.assert_array_equal(sliced.view(4, 3, 1).to_host(), a[:, ::2].reshape(4, 3, 1))
    with pytest.raises(ShapeError, match="cannot reshape"):
        t.reshape(5, 5)
    with pytest.raises(ShapeError, match="only one dimension"):
        t.reshape(-1, -1)


def test_expand_squeeze_unsqueeze(queue, rng):
    a = rng.standard_normal((3, 1)).astype(np.float32)
    t = Tensor.from_host(queue, a)
    np.testing.assert_array_equal(t.expand(2, 3, 4).to_host(), np.broadcast_to(a, (2, 3, 4)))
    np.testing.assert_array_equal(t.squeeze().to_host(), a[:, 0])
    np.testing.assert_array_equal(t.unsqueeze(0).to_host(), a[None])
    with pytest.raises(ShapeError, match="cannot expand"):
        t.expand(4, 4)


def test_swapaxes_moveaxis_ravel_expand_dims_match_numpy(queue, rng):
    """NumPy's (and PyTorch's) view spellings: views of the same memory, except ravel where the layout needs
    a copy (as NumPy's)."""
    a = rng.standard_normal((2, 3, 5)).astype(np.float32)
    t = Tensor.from_host(queue, a)
    views = [(t.swapaxes(0, 2), a.swapaxes(0, 2)), (t.swapaxes(-1, 1), a.swapaxes(-1, 1)),
             (t.swapaxes(1, 1), a), (t.moveaxis(0, -1), np.moveaxis(a, 0, -1)),
             (t.moveaxis((0, 1), (2, 0)), np.moveaxis(a, (0, 1), (2, 0))),
             (t.movedim([-1, 0], [0, 1]), np.moveaxis(a, [-1, 0], [0, 1])),
             (t.ravel(), a.ravel()), (t[1].ravel(), a[1].ravel()),
             (t.expand_dims(0), np.expand_dims(a, 0)), (t.expand_dims((0, -1)), np.expand_dims(a, (0, -1))),
             (t.expand_dims([3, 1]), np.expand_dims(a, [3, 1]))]
    for got, want in views:
        assert got.storage is t.storage and got.shape == want.shape
        np.testing.assert_array_equal(got.to_host(), want)
    copied = t.swapaxes(0, 1).ravel()   # not expressible as a view: a contiguous copy, as NumPy's ravel
    assert copied.storage is not t.storage
    np.testing.assert_array_equal(copied.to_host(), a.swapaxes(0, 1).ravel())
    vector = Tensor.from_host(queue, np.arange(3, dtype=np.int32))
    assert vector.swapaxes(0, -1).shape == (3,) and vector.expand_dims(1).shape == (3, 1)
    with pytest.raises(ShapeError, match="out of range for a tensor of shape"):
        t.swapaxes(0, 3)
    with pytest.raises(TypeError, match="x.permute"):
        t.swapaxes((0, 1), 2)
    with pytest.raises(ShapeError, match="must name as many axes"):
        t.moveaxis((0, 1), 2)
    with pytest.raises(ShapeError, match="must not repeat an axis"):
        t.moveaxis((0, 1), (2, -1))
    with pytest.raises(ShapeError, match="repeats an axis"):
        t.expand_dims((0, -5))
    with pytest.raises(ShapeError, match="out of range"):
        t.expand_dims(5)


def test_flatten_matches_torch_flatten(queue, rng):
    """x.flatten(start_dim, end_dim) as torch.flatten (and the Node's the same shapes): every axis by default,
    a 0-d tensor one element, a view where the layout allows; bad axes named."""
    a = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    t = Tensor.from_host(queue, a)
    for args, shape in (((), (120,)), ((1,), (2, 60)), ((1, 2), (2, 12, 5)), ((-2,), (2, 3, 20)),
                        ((0, 0), (2, 3, 4, 5)), ((2, -1), (2, 3, 20))):
        got = t.flatten(*args)
        assert got.shape == shape and got.storage is t.storage, args
        np.testing.assert_array_equal(got.to_host(), a.reshape(shape))
        assert ag.flatten(ag.tensor(t), *args).shape == shape
    assert Tensor.from_host(queue, np.float32(3.0)).flatten().shape == (1,)
    np.testing.assert_array_equal(t.swapaxes(0, 3).flatten(1).to_host(), a.swapaxes(0, 3).reshape(5, -1))
    with pytest.raises(ShapeError, match="start_dim 2 comes after end_dim 1"):
        t.flatten(2, 1)
    with pytest.raises(ShapeError, match="flatten: end_dim 4 is out of range"):
        t.flatten(0, 4)


def test_copy_into_strided_view_and_overlap(queue, rng):
    a = rng.standard_normal((5, 8)).astype(np.float32)
    t = Tensor.from_host(queue, a.copy())
    src = Tensor.from_host(queue, np.arange(20, dtype=np.float32).reshape(5, 4))
    t[:, 1::2].copy_(src)
    a[:, 1::2] = np.arange(20, dtype=np.float32).reshape(5, 4)
    np.testing.assert_array_equal(t.to_host(), a)
    flat = Tensor.from_host(queue, np.arange(10, dtype=np.float32))
    flat[2:10].copy_(flat[0:8])  # overlapping: must behave like NumPy's copy semantics
    np.testing.assert_array_equal(flat.to_host(), np.array([0, 1, 0, 1, 2, 3, 4, 5, 6, 7], np.float32))


def test_copy_from_host_into_view(queue):
    t = Tensor.zeros(queue, (4, 4))
    t.T[1:3].copy_from_host(np.ones((2, 4), np.float32))
    want = np.zeros((4, 4), np.float32)
    want.T[1:3] = 1
    np.testing.assert_array_equal(t.to_host(), want)
    with pytest.raises(ShapeError):
        t.copy_from_host(np.ones(3))


def test_tensor_of_another_queue_is_refused(device, queue):
    other = device.new_queue()
    a = Tensor.zeros(queue, (3,))
    b = Tensor.zeros(other, (3,))
    with pytest.raises(DeviceMismatchError) as err:
        check_same_queue(a, b)
    msg = str(err.value)
    assert "two different queues of one device" in msg and msg.count(device.device_name) == 1
    with pytest.raises(DeviceMismatchError):
        a.copy_(b)
    moved = b.to(queue)
    assert moved.queue is queue
    np.testing.assert_array_equal(moved.to_host(), np.zeros(3, np.float32))


def test_repr_like_numpy_for_small_and_summary_for_large(queue):
    small = Tensor.from_host(queue, np.array([[1.5, 2.0], [3.0, 4.25]], np.float32))
    text = repr(small)
    assert text.startswith("Tensor([[1.5 , 2.  ],") and "dtype=float32" in text
    big = Tensor.zeros(queue, (100, 100))
    assert "shape=(100, 100)" in repr(big)


def test_item_and_bool(queue):
    with pytest.raises(ShapeError, match="one element"):
        Tensor.zeros(queue, (2,)).item()
    with pytest.raises(ShapeError, match="ambiguous"):
        bool(Tensor.zeros(queue, (2,)))
    assert bool(Tensor.ones(queue, (1,))) is True


def test_bool_scalar_indices_add_an_axis_as_in_numpy(queue):
    a = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    x = Tensor.from_host(queue, a)
    for index in (True, False, np.True_, (slice(None), True), (Ellipsis, False, 1), (None, True, 0)):
        got = x[index]
        assert got.shape == a[index].shape, index
        np.testing.assert_array_equal(got.to_host(), a[index])


@pytest.mark.parametrize(
    "index,words", [(1.5, "1.5"), (5, "out of bounds"), ("a", "'a'"), ((0, 0, 0), "too many")]
)
def test_bad_indices_are_index_errors(queue, index, words):
    x = Tensor.from_host(queue, np.zeros((2, 3), np.float32))
    with pytest.raises(IndexError, match=words):
        x[index]


@pytest.mark.parametrize("make", [
    lambda q: Tensor.full(q, (2,), 300, dtype=np.uint8),
    lambda q: Tensor.full(q, (2,), -1, dtype=np.uint8),
    lambda q: Tensor.from_host(q, np.array([1, 2], np.int32)) + 2**40,
    lambda q: Tensor.from_host(q, np.array([1, 2], np.uint8)) * 256,
    lambda q: Tensor.zeros(q, (2,), np.int32).fill_(2**31),
])
def test_integer_scalars_that_do_not_fit_are_refused_at_the_op(queue, make):
    """NumPy 2 raises OverflowError; netcl raises it where the value enters (it used to wrap, or to
    raise a bare OverflowError at the later host read)."""
    with pytest.raises(ScalarOverflowError, match="does not fit"):
        make(queue)
    assert issubclass(ScalarOverflowError, OverflowError)
