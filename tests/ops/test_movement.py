"""Data movement and indexing ops against NumPy (exact: they move values)."""

from __future__ import annotations

import numpy as np
import pytest

import netcl
import netcl.autograd as ag
from netcl import ops
from netcl.core import dtypes
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, ShapeError
from netcl.graph import Graph
from netcl.ops import determinism, movement
from netcl.profiling import count_launches


def T(queue, a):
    return Tensor.from_host(queue, np.asarray(a))


def test_setitem(queue, rng):
    a = rng.standard_normal((7, 9)).astype(np.float32)
    x = T(queue, a)
    x[2:5, ::3] = 1.5
    a[2:5, ::3] = 1.5
    b = rng.standard_normal((9,)).astype(np.float32)
    x[-1] = T(queue, b) * 2.0
    a[-1] = b * 2.0
    x[:, 1] = T(queue, np.arange(7, dtype=np.int32))  # cast on assignment
    a[:, 1] = np.arange(7)
    np.testing.assert_array_equal(x.to_host(), a)
    mask = a > 0.5
    x[T(queue, mask)] = 0.0
    a[mask] = 0.0
    np.testing.assert_array_equal(x.to_host(), a)
    with pytest.raises(ShapeError, match=r"\(9,\) and \(4,\)"):
        x[0] = T(queue, np.zeros(4, np.float32))


def test_setitem_fuses_value(queue, rng):
    a = rng.standard_normal((5, 6)).astype(np.float32)
    x = T(queue, a)
    y = T(queue, a.copy())
    with count_launches() as n:
        x[1:4] = ops.exp(y[1:4]) + 1.0
    assert n.count == 1
    a[1:4] = np.exp(a[1:4]) + 1.0
    np.testing.assert_allclose(x.to_host(), a, rtol=1e-6)


def test_concat_stack_split_chunk(queue, rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((3, 2)).astype(np.float32)
    c = rng.integers(0, 9, size=(3, 1)).astype(np.int32)
    out = ops.concat([T(queue, a), T(queue, b).T.T, T(queue, c)], axis=1)
    np.testing.assert_array_equal(out.to_host(), np.concatenate([a, b, c], 1))
    assert out.dtype == np.float32
    s = ops.stack([T(queue, a), T(queue, a * 2)], axis=1)
    np.testing.assert_array_equal(s.to_host(), np.stack([a, a * 2], 1))
    parts = ops.split(T(queue, a), 3, axis=1)
    assert [p.shape for p in parts] == [(3, 3), (3, 1)]
    np.testing.assert_array_equal(parts[1].to_host(), a[:, 3:])
    parts = ops.split(T(queue, a), [1, 2], axis=0)
    np.testing.assert_array_equal(parts[1].to_host(), a[1:])
    ch = ops.chunk(T(queue, np.arange(7)), 3)
    assert [c.shape for c in ch] == [(3,), (3,), (1,)]
    with pytest.raises(ShapeError, match=r"\(3, 4\) and \(2, 2\)"):
        ops.concat([T(queue, a), T(queue, np.zeros((2, 2), np.float32))], axis=1)


def test_pad(queue, rng):
    a = rng.standard_normal((2, 5, 6)).astype(np.float32)
    x = T(queue, a)
    np.testing.assert_array_equal(ops.pad(x, (1, 2), value=7.0).to_host(),
                                  np.pad(a, ((0, 0), (0, 0), (1, 2)), constant_values=7.0))
    np.testing.assert_array_equal(ops.pad(x, (2, 1, 3, 0), mode="reflect").to_host(),
                                  np.pad(a, ((0, 0), (3, 0), (2, 1)), mode="reflect"))
    np.testing.assert_array_equal(ops.pad(x, (1, 1, 1, 1), mode="replicate").to_host(),
                                  np.pad(a, ((0, 0), (1, 1), (1, 1)), mode="edge"))
    with pytest.raises(ShapeError, match="reflect"):
        ops.pad(x, (6, 0), mode="reflect")


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
def test_gather_index_select_take_embedding(queue, rng, dtype):
    a = (rng.standard_normal((5, 7)) * 10).astype(dtype)
    x = T(queue, a)
    idx = rng.integers(-5, 5, size=(3, 7))
    got = ops.gather(x, 0, T(queue, idx.astype(np.int64)))
    np.testing.assert_array_equal(got.to_host(), np.take_along_axis(a, idx % 5, 0))
    idx1 = rng.integers(0, 7, size=(4, 2)).astype(np.int32)
    np.testing.assert_array_equal(
        ops.gather(x, 1, T(queue, idx1)).to_host(), np.take_along_axis(a[:4], idx1, 1)
    )
    sel = np.array([4, 0, 4, 2], np.int32)
    np.testing.assert_array_equal(ops.index_select(x.T, 1, T(queue, sel)).to_host(), a.T[:, sel])
    np.testing.assert_array_equal(ops.take(x, T(queue, np.array([[0, 34], [8, 3]]))).to_host(),
                                  np.take(a, [[0, 34], [8, 3]]))
    ids = np.array([[1, 4, 4], [0, 2, 3]], np.int32)
    np.testing.assert_array_equal(ops.embedding(x, T(queue, ids)).to_host(), a[ids])


@pytest.mark.parametrize("deterministic", [False, True])
def test_scatter_add(queue, rng, deterministic):
    a = rng.standard_normal((6, 4)).astype(np.float32)
    src = rng.standard_normal((9, 4)).astype(np.float32)
    idx = rng.integers(0, 6, size=(9, 4))
    got = ops.scatter_add(T(queue, a), 0, T(queue, idx), T(queue, src), deterministic=deterministic)
    want = a.astype(np.float64).copy()
    for i in range(9):
        for j in range(4):
            want[idx[i, j], j] += src[i, j]
    np.testing.assert_allclose(got.to_host(), want, rtol=1e-5, atol=1e-6)
    if deterministic:
        again = ops.scatter_add(T(queue, a), 0, T(queue, idx), T(queue, src), deterministic=True)
        np.testing.assert_array_equal(again.to_host(), got.to_host())
    i32 = ops.scatter_add(T(queue, np.zeros(5, np.int32)), 0, T(queue, np.array([1, 1, 4])),
                          T(queue, np.array([2, 3, 5], np.int32)), deterministic=deterministic)
    np.testing.assert_array_equal(i32.to_host(), [0, 5, 0, 0, 5])
    with pytest.raises(DTypeError, match="int32 or int64"):
        ops.scatter_add(T(queue, a), 0, T(queue, idx.astype(np.float32)), T(queue, src))


def _scatter_in_order(a, axis, idx, src):
    """scatter_add's deterministic result exactly: each destination starts from a and adds its contributions
    one by one in increasing position along `axis`, rounding to a's dtype after each add (float32 and
    float64; half types sum in float32: compare those with a tolerance)."""
    want = np.array(a, copy=True)
    size = a.shape[axis]
    for c in np.ndindex(*idx.shape):       # C order: position along `axis` increases within each line
        k = int(idx[c])
        k = k + size if k < 0 else k
        if 0 <= k < size:
            dest = c[:axis] + (k,) + c[axis + 1:]
            want[dest] = want[dest] + src[c]
    return want


def test_sorted_segments_are_stable_across_blocks(queue, rng, monkeypatch):
    """The device counting sort: positions grouped by key, each group in increasing position, over several
    blocks (3 of 64 positions); negatives count from the end, keys still out of range are left out."""
    monkeypatch.setattr(movement, "SEGMENT_BLOCK", 64)
    keys = rng.choice([0, 2, 2, 2, 6, -1, -7, 7, 9], size=170).astype(np.int64)
    order, start = movement.sorted_segments(T(queue, keys), 7)
    wrapped = np.where(keys < 0, keys + 7, keys)
    kept = np.flatnonzero((wrapped >= 0) & (wrapped < 7))
    want_order = kept[np.argsort(wrapped[kept], kind="stable")]
    want_start = np.r_[0, np.cumsum(np.bincount(wrapped[kept], minlength=7))]
    np.testing.assert_array_equal(start.to_host(), want_start)
    np.testing.assert_array_equal(order.to_host()[: want_start[-1]], want_order)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_scatter_add_colliding_ids_gives_the_same_bits_each_run(queue, device, rng, dtype):
    """Embedding's backward shape: 300 ids over 5 rows, most of them the same, the index expanded over the
    row width (strides 0): summed by sorted segments on the device, in position order (float32 and float64:
    bit for bit a sequential sum; float16 sums in float32), run twice with identical bits."""
    if dtype == np.float64 and not device.capabilities.fp64:
        pytest.skip("no fp64")
    ids = rng.choice([3, 3, 3, 3, 0, 1, 4], size=300).astype(np.int32)
    a = rng.standard_normal((5, 17)).astype(dtype)
    src = rng.standard_normal((300, 17)).astype(dtype)
    index = T(queue, ids).reshape(-1, 1).expand(-1, 17)
    runs = [ops.scatter_add(T(queue, a), 0, index, T(queue, src), check_bounds=False).to_host() for _ in "ab"]
    np.testing.assert_array_equal(runs[0], runs[1])
    want = a.astype(np.float64).copy()
    np.add.at(want, ids, src.astype(np.float64))
    tol = dict(rtol=2e-3, atol=2e-2) if dtype == np.float16 else dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(runs[0].astype(np.float64), want, **tol)
    if dtype != np.float16:
        full_idx = np.broadcast_to(ids[:, None], (300, 17))
        np.testing.assert_array_equal(runs[0], _scatter_in_order(a, 0, full_idx, src))


def test_scatter_add_shared_index_along_a_middle_axis(queue, rng):
    """A shared index along axis 1 of a 3-D x, smaller than x and src off the axis, with negative ids; int64
    values (no atomics for them either)."""
    ids = np.array([2, -1, 2, 0, 6, 2, -7, 5])
    a = rng.standard_normal((3, 7, 5)).astype(np.float32)
    src = rng.standard_normal((4, 8, 6)).astype(np.float32)
    index = T(queue, ids).reshape(1, 8, 1).expand(2, 8, 4)
    got = ops.scatter_add(T(queue, a), 1, index, T(queue, src))
    full_idx = np.broadcast_to(ids[None, :, None], (2, 8, 4))
    np.testing.assert_array_equal(got.to_host(), _scatter_in_order(a, 1, full_idx, src[:2, :, :4]))
    ai = rng.integers(-9, 9, size=(3, 7, 5))
    srci = rng.integers(-9, 9, size=(4, 8, 6))
    goti = ops.scatter_add(T(queue, ai), 1, index, T(queue, srci))
    np.testing.assert_array_equal(goti.to_host(), _scatter_in_order(ai, 1, full_idx, srci[:2, :, :4]))


def test_scatter_add_follows_set_deterministic(queue, rng, monkeypatch):
    """Default (deterministic): sorted segments, recordable in a graph (nothing read back); after
    set_deterministic(False), float32 takes the atomic kernel (one launch), whose sums
    are still right."""
    calls = []
    real = movement._scatter_add_segments
    monkeypatch.setattr(movement, "_scatter_add_segments", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(determinism, "_deterministic", [None])
    monkeypatch.delenv("NETCL_DETERMINISTIC", raising=False)
    ids = rng.integers(0, 4, size=200).astype(np.int64)
    a = np.zeros((4, 9), np.float32)
    src = rng.standard_normal((200, 9)).astype(np.float32)
    want = a.astype(np.float64)
    np.add.at(want, ids, src.astype(np.float64))
    x, s = T(queue, a), T(queue, src)
    index = T(queue, ids).reshape(-1, 1).expand(-1, 9)
    graph = Graph()
    with graph.capture():
        recorded = ops.scatter_add(x, 0, index, s, check_bounds=False)
    assert calls == [1]
    graph.replay()
    np.testing.assert_allclose(recorded.to_host(), want, rtol=1e-5, atol=1e-5)
    graph.close()
    netcl.set_deterministic(False)
    with count_launches() as n:
        fast = ops.scatter_add(x, 0, index, s, check_bounds=False)
        fast.realize()
    assert calls == [1] and n.count == 1   # scatter_add_atomic (x's copy is a device copy, no kernel)
    np.testing.assert_allclose(fast.to_host(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="deterministic must be None, True or False"):
        ops.scatter_add(x, 0, index, s, deterministic=1)


def test_masked_fill_tril_triu(queue, rng):
    a = rng.standard_normal((2, 4, 6)).astype(np.float32)
    x = T(queue, a)
    for k in (-1, 0, 2):
        np.testing.assert_array_equal(ops.tril(x, k).to_host(), np.tril(a, k))
        np.testing.assert_array_equal(ops.triu(x, k).to_host(), np.triu(a, k))
    causal = ops.triu(T(queue, np.ones((4, 4), np.bool_)), 1)
    np.testing.assert_array_equal(ops.masked_fill(T(queue, a[0, :, :4]), causal, -np.inf).to_host(),
                                  np.where(np.triu(np.ones((4, 4), bool), 1), -np.inf, a[0, :, :4]))


def test_arange_one_hot_repeat(queue, rng):
    np.testing.assert_array_equal(ops.arange(queue, 7).to_host(), np.arange(7))
    np.testing.assert_allclose(ops.arange(queue, 1.0, 2.0, 0.25).to_host(), np.arange(1.0, 2.0, 0.25))
    np.testing.assert_array_equal(ops.arange(queue, 10, 0, -3).to_host(), np.arange(10, 0, -3))
    for half in (dtypes.float16, dtypes.bfloat16):  # half steps kept (bfloat16's were taken as integers: 0s)
        got = ops.arange(queue, -1, 1, 0.25, dtype=half)
        assert got.dtype == half
        np.testing.assert_array_equal(got.to_host().astype(np.float32), np.arange(-1, 1, 0.25))
    ids = np.array([[0, 3], [2, 1]], np.int32)
    oh = ops.one_hot(T(queue, ids), 4)
    assert oh.dtype == np.int64
    np.testing.assert_array_equal(oh.to_host(), np.eye(4, dtype=np.int64)[ids])
    a = rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(ops.repeat(T(queue, a), 2, 1, 3).to_host(), np.tile(a, (2, 1, 3)))
    np.testing.assert_array_equal(ops.repeat(T(queue, a), (3, 2)).to_host(), np.tile(a, (3, 2)))


@pytest.mark.parametrize("start, stop, num, endpoint", [
    (0, 1, 5, True), (-3.5, 7, 11, False), (2, 2, 3, True), (1e3, -1e-3, 1, True), (0, 1, 0, True),
    (-1, 1, 1001, True), (0.1, 0.7, 1, False)])
def test_linspace_matches_numpy(queue, start, stop, num, endpoint):
    got = ops.linspace(queue, start, stop, num, endpoint=endpoint)
    want = np.linspace(start, stop, num, endpoint=endpoint)
    assert got.dtype == np.float32 and got.shape == (num,)
    np.testing.assert_allclose(got.to_host(), want, rtol=1e-6, atol=1e-7)
    if num > 1 and endpoint:
        assert got.to_host()[[0, -1]].tolist() == [np.float32(start), np.float32(stop)]


def test_linspace_dtypes_and_pytorchs_steps(queue, device):
    if device.capabilities.fp64:
        wide = ops.linspace(queue, -1.5, 2.0, 7, dtype=np.float64)
        np.testing.assert_allclose(wide.to_host(), np.linspace(-1.5, 2.0, 7), rtol=1e-15, atol=1e-15)
    for args, dt in (((-3, 7, 6), np.int32), ((-7.5, 2.5, 4), np.int64), ((0, 1, 9), np.float16)):
        got = ops.linspace(queue, *args, dtype=dt)   # integers: the floor, as NumPy 2's (-8, -5, -1, 2)
        assert got.dtype == dt
        np.testing.assert_array_equal(got.to_host(), np.linspace(*args, dtype=dt))
    np.testing.assert_allclose(ops.linspace(queue, 0, 1, steps=3).to_host(), [0, 0.5, 1])
    with count_launches() as launches:   # pending: it fuses into its elementwise consumer, as arange does
        doubled = (ops.linspace(queue, 0, 1, 11) * 2 - ops.eye(queue, 1, 11, k=10)).to_host()
    assert launches.count == 1
    np.testing.assert_allclose(doubled, np.linspace(0, 2, 11) - np.eye(1, 11, 10), rtol=1e-6)
    with pytest.raises(ShapeError, match="num must be at least 0"):
        ops.linspace(queue, 0, 1, -1)
    with pytest.raises(TypeError, match="stop must be a number"):
        ops.linspace(queue, 0, "1")


@pytest.mark.parametrize("n, m, k, dtype", [(3, None, 0, np.float32), (4, 6, 2, np.int64),
                                            (5, 2, -1, np.float16), (1, 1, 3, np.bool_),
                                            (0, 3, 0, np.float32), (7, 5, -6, np.int32)])
def test_eye_matches_numpy(queue, n, m, k, dtype):
    got = ops.eye(queue, n, m, k, dtype)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.to_host(), np.eye(n, m, k, dtype))


def test_like_makers_take_shape_queue_and_dtype(queue, rng):
    x = T(queue, rng.standard_normal((3, 5)).astype(np.float16)).T   # a view: the results are contiguous
    i = T(queue, np.arange(6, dtype=np.int32))
    for got, want in ((ops.zeros_like(x), np.zeros((5, 3), np.float16)),
                      (ops.ones_like(x, dtype=np.int32), np.ones((5, 3), np.int32)),
                      (ops.full_like(x, -2.5), np.full((5, 3), -2.5, np.float16)),
                      (ops.full_like(i, 2.7), np.full_like(np.arange(6, dtype=np.int32), 2.7)),
                      (ops.full_like(i, 1.5, dtype="float32"), np.full(6, 1.5, np.float32))):
        assert got.dtype == want.dtype and got.queue is queue and got.is_contiguous()
        np.testing.assert_array_equal(got.to_host(), want)
    e = ops.empty_like(x, dtype=np.int64)
    assert e.shape == (5, 3) and e.dtype == np.int64 and e.queue is queue
    with pytest.raises(TypeError, match="expected a Tensor, got ndarray"):
        ops.zeros_like(np.zeros(3))
    with pytest.raises(TypeError, match=r"a Node's Tensor is node.value"):
        ops.ones_like(ag.tensor(x))


def test_numpys_function_spellings_of_the_view_methods(queue, rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    x = T(queue, a)
    for got, want in ((ops.swapaxes(x, 0, 2), np.swapaxes(a, 0, 2)),
                      (ops.moveaxis(x, 0, -1), np.moveaxis(a, 0, -1)), (ops.ravel(x.T), np.ravel(a.T)),
                      (ops.expand_dims(x, (1, 4)), np.expand_dims(a, (1, 4)))):
        np.testing.assert_array_equal(got.to_host(), want)
    node = ag.tensor(x, requires_grad=True)   # a Node takes them too: recorded
    with ag.Tape() as tape:
        loss = (ops.moveaxis(node, 2, 0) * T(queue, np.moveaxis(a, 2, 0))).sum()
    tape.backward(loss)
    np.testing.assert_allclose(node.grad.to_host(), a)


@pytest.mark.parametrize("bad", [-6, 5])
def test_out_of_range_indices_raise(queue, bad):
    x = Tensor.from_host(queue, np.arange(15, dtype=np.float32).reshape(5, 3))
    idx = Tensor.from_host(queue, np.array([0, bad, 2], dtype=np.int64))
    with pytest.raises(ShapeError, match=r"\[-5, 5\)"):
        ops.index_select(x, 0, idx)
    with pytest.raises(ShapeError, match=f"embedding: id {bad} at position 1 is outside \\[0, 5\\)"):
        ops.embedding(x, idx).to_host()  # found by the kernel, raised at the next host read
    with pytest.raises(ShapeError, match="gather"):
        ops.gather(x, 0, Tensor.from_host(queue, np.array([[bad, 0, 1]], dtype=np.int64)))
    with pytest.raises(ShapeError, match="scatter_add"):
        ops.scatter_add(x, 0, Tensor.from_host(queue, np.array([[bad, 0, 1]], dtype=np.int64)),
                        Tensor.ones(queue, (1, 3)))
    with pytest.raises(ShapeError, match="num_classes"):
        ops.one_hot(idx, 5)
    with pytest.raises(ShapeError, match=r"\[0, 5\)"):
        ops.one_hot(Tensor.from_host(queue, np.array([-1, 0], dtype=np.int64)), 5)


@pytest.mark.parametrize("case", ["mask", "host mask", "leading mask", "mask after a slice", "list", "array",
                                  "tensor", "2-D tensor", "0-d", "negative", "after ...", "empty list"])
def test_advanced_getitem_matches_numpy(queue, rng, case):
    """One integer array or bool mask among slices and ... selects as NumPy and PyTorch do (a copy): it
    raised an IndexingError holding the whole repr of the index."""
    a = rng.standard_normal((6, 5, 3)).astype(np.float32)
    x = Tensor.from_host(queue, a)
    ids = rng.integers(-6, 6, size=(4,))
    index = {"mask": a > 0, "host mask": a > 0, "leading mask": a[:, :, 0] > 0,
             "mask after a slice": (slice(None, None, -2), a[0, :, 0] > 0), "list": [0, 2, 2],
             "array": np.array([5, 0]), "tensor": ids, "2-D tensor": (slice(1, 4), ids.reshape(2, 2) % 5),
             "0-d": (slice(None), np.array(3)), "negative": (Ellipsis, [-1, 0]),
             "after ...": (Ellipsis, ids[:2] % 3, slice(None)), "empty list": []}[case]
    on_device = index
    if case in ("mask", "leading mask", "tensor"):
        on_device = Tensor.from_host(queue, index)
    elif case == "2-D tensor":
        on_device = (index[0], Tensor.from_host(queue, index[1].astype(np.int32)))
    got = x[on_device]
    want = a[index]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.to_host(), want)


def test_advanced_indexing_errors_are_one_line(queue, rng):
    a = rng.standard_normal((7, 13)).astype(np.float32)
    x = Tensor.from_host(queue, a)
    for index, words in [(([0], [1]), r"index \(list of length 1, list of length 1\) of a tensor of shape"),
                         ((0, [1, 2]), "not several arrays nor an array beside ints or None"),
                         ((None, np.arange(3)), r"ndarray of shape \(3,\) and dtype int64"),
                         ([0.5], "must hold integers or bools"),
                         (Tensor.from_host(queue, a[0] > 0), r"mask of shape \(13,\) does not match"),
                         ([0, 7], r"indices must lie in \[-7, 7\)")]:
        with pytest.raises(ShapeError, match=words) as error:
            x[index]
        assert "\n" not in str(error.value)
    with pytest.raises(ShapeError, match=r"setitem: index \(list of length 2\) is advanced indexing"):
        x[[0, 1]] = 1.0


def test_node_getitem_with_an_array_is_a_one_line_error(queue, rng):
    """Advanced indexing is a copy netcl does not differentiate: on a Node the error says so in one line."""
    node = ag.tensor(Tensor.from_host(queue, rng.standard_normal((4, 5)).astype(np.float32)),
                     requires_grad=True)
    with ag.Tape(), pytest.raises(ShapeError, match="not basic indexing.*not differentiable") as error:
        node[np.arange(3)]
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16, np.bool_])
def test_setitem_takes_host_data_broadcast_as_numpy(queue, rng, dtype):
    """X[0] = np.arange(13), X[:] = [1, 2, 3] (PyTorch accepts them; they raised "value must be a Tensor or a
    Python number"): copied in the target's dtype, broadcast as NumPy, into views and through a mask."""
    a = (rng.standard_normal((4, 13)) * 5).astype(dtype)
    want = a.copy()
    x = Tensor.from_host(queue, a)
    for index, value in [(0, np.arange(13)), (slice(None), rng.standard_normal(13) * 3),
                         ((slice(1, 3), slice(None, None, -4)), [[1.5], [-2.0]]),
                         ((2, slice(0, 3)), (7, 8, 9)),
                         ((Ellipsis, 5), np.array(4.0)), ((3, slice(None)), np.arange(13, dtype=np.uint8))]:
        x[index] = value
        want[index] = value
        np.testing.assert_array_equal(x.to_host(), want)
    mask = want > 2
    x[Tensor.from_host(queue, mask)] = np.full(13, 6)
    want[mask] = 6
    np.testing.assert_array_equal(x.to_host(), want)
    with pytest.raises(ShapeError, match=r"shapes \(13,\) and \(3,\) cannot be broadcast"):
        x[0] = [1, 2, 3]
    with pytest.raises(DTypeError, match="not numbers"):
        x[0] = ["a"]


def test_split_sizes_that_do_not_add_up_name_np_splits_reading(queue):
    """split takes sizes (torch.split); np.split's cut points [2, 5] read as sizes were one bare error."""
    x = Tensor.zeros(queue, (7, 13))
    with pytest.raises(ShapeError, match=r"split takes the pieces' sizes, as torch.split does \(np.split's "
                                         r"cut points \[2, 5\] are the sizes \[2, 3, 8\]\)"):
        ops.split(x, [2, 5], axis=1)
    assert [p.shape for p in ops.split(x, [2, 3, 8], axis=1)] == [(7, 2), (7, 3), (7, 8)]


def test_an_empty_tensor_prints_its_shape(queue):
    assert "shape=(0, 3)" in repr(Tensor.zeros(queue, (0, 3)))
    assert "shape" not in repr(Tensor.zeros(queue, (0,)))  # [] says it, as NumPy's repr
