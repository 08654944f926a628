"""JIT-generated kernels and index.cl under Oclgrind: elementwise on contiguous, strided, broadcast and
offset views (with a fused chain), reductions in both layouts (jit/reduce.py FORCE_KIND 'cpu' and 'gpu':
the GPU one is the local-memory tree), softmax / log_softmax, cumsum, topk, gather / scatter_add (atomic,
host-sorted, and by sorted segments: segments.cl's counting sort over several blocks)."""

from __future__ import annotations

import numpy as np
import pytest

from netcl import ops
from netcl.core.tensor import Tensor
from netcl.jit import reduce as jreduce
from netcl.ops import movement
from tests.oclgrind.cases import close, dev, oclgrind_only, strided

pytestmark = oclgrind_only


def test_elementwise_layouts(queue):
    rng = np.random.default_rng(15)
    a, b, c = rng.standard_normal((3, 7)), rng.standard_normal((7,)), rng.standard_normal((3, 1))
    ta, tb, tc = (strided(queue, a.astype(np.float32)), dev(queue, b.astype(np.float32)),
                  dev(queue, c.astype(np.float32)))
    close(ops.add(ta, tb), a + b)  # strided + broadcast row
    close(ops.mul(ops.exp(ta), tc), np.exp(a) * c)  # broadcast column
    close(
        ops.where(ops.gt(ta, 0.0), ops.sigmoid(ta), ops.tanh(tb)),
        np.where(a > 0, 1 / (1 + np.exp(-a)), np.tanh(b)),
    )
    full = dev(queue, rng.standard_normal((5, 9)).astype(np.float32))
    view = full[1:4, 2::3]  # offset + strides
    v = full.to_host()[1:4, 2::3].astype(np.float64)
    close(
        ops.gelu(ops.sub(view, 0.5), approximate="tanh"),
        0.5 * (v - 0.5) * (1 + np.tanh(np.sqrt(2 / np.pi) * ((v - 0.5) + 0.044715 * (v - 0.5) ** 3))),
        1e-4,
        1e-4,
    )
    i = dev(queue, np.arange(-3, 4, dtype=np.int32))
    np.testing.assert_array_equal(ops.maximum(i, 0).to_host(), np.maximum(np.arange(-3, 4), 0))
    h = Tensor.from_host(queue, a.astype(np.float16))
    close(ops.cast(ops.relu(h), np.float32), np.maximum(a.astype(np.float16), 0), 1e-3, 1e-3)


def test_augmented_assignments(queue):
    """`x += y` written by the one launch that reads x (a one-element tensor's is a broadcast scalar of its
    own memory: only the work-item with the element reads it), and reads of x through other mappings
    copied first: no race."""
    rng = np.random.default_rng(17)
    a, b = rng.standard_normal((5, 6)), rng.standard_normal((6,))
    x, row = dev(queue, a.astype(np.float32)), dev(queue, b.astype(np.float32))
    x += row
    x *= x
    v = x[1:]
    v += x[:-1]
    want = (a + b) ** 2
    want[1:] += want[:-1].copy()
    close(x, want, 1e-5, 1e-5)
    for shape in ((1,), (1, 3), (3, 1)):
        p = dev(queue, np.arange(np.prod(shape), dtype=np.int32).reshape(shape))
        p += 1
        np.testing.assert_array_equal(p.to_host(), np.arange(np.prod(shape)).reshape(shape) + 1)


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_reductions(queue, monkeypatch, kind):
    monkeypatch.setattr(jreduce, "FORCE_KIND", kind)
    rng = np.random.default_rng(16)
    x = rng.standard_normal((3, 5, 7))
    t = strided(queue, x.astype(np.float32))
    close(ops.sum(t), x.sum(), 1e-4, 1e-4)
    close(ops.sum(t, axis=(0, 2)), x.sum(axis=(0, 2)), 1e-4, 1e-4)
    close(ops.mean(t, axis=1, keepdims=True), x.mean(axis=1, keepdims=True), 1e-5, 1e-5)
    close(ops.max(t, axis=-1), x.max(-1))
    close(ops.var(t, axis=0), x.var(0), 1e-4, 1e-4)
    close(ops.logsumexp(t, axis=2), np.log(np.exp(x).sum(2)), 1e-5, 1e-5)
    np.testing.assert_array_equal(ops.argmin(t, axis=1).to_host(), x.argmin(1))
    np.testing.assert_array_equal(ops.argmax(t).to_host(), x.argmax())
    big = rng.standard_normal((2, 1031))  # longer than one work-group: several partials
    close(ops.sum(dev(queue, big.astype(np.float32)), axis=1), big.sum(1), 1e-4, 1e-4)
    close(ops.sum(dev(queue, big.astype(np.float32))), big.sum(), 1e-3, 1e-3)
    e = ops.prod(dev(queue, (x[0] > 0).astype(np.int32) + 1), axis=0)
    np.testing.assert_array_equal(e.to_host(), ((x[0] > 0) + 1).prod(0))
    np.testing.assert_array_equal(ops.any(dev(queue, x > 1.5), axis=0).to_host(), (x > 1.5).any(0))


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_softmax_cumsum_topk(queue, monkeypatch, kind):
    monkeypatch.setattr(jreduce, "FORCE_KIND", kind)
    rng = np.random.default_rng(17)
    x = rng.standard_normal((3, 7))
    t = strided(queue, x.astype(np.float32))
    e = np.exp(x - x.max(-1, keepdims=True))
    close(ops.softmax(t), e / e.sum(-1, keepdims=True))
    close(ops.log_softmax(t.T, axis=0), np.log(e / e.sum(-1, keepdims=True)).T, 1e-5, 1e-5)
    close(ops.cumsum(t, axis=1), np.cumsum(x, 1), 1e-5, 1e-5)
    close(ops.cumsum(t, axis=0), np.cumsum(x, 0), 1e-5, 1e-5)
    long = rng.standard_normal(1029)
    close(ops.cumsum(dev(queue, long.astype(np.float32)), axis=0), np.cumsum(long), 1e-3, 1e-3)
    vals, idx = ops.topk(t, 3, axis=-1)
    order = np.argsort(-x, axis=-1, kind="stable")[:, :3]
    np.testing.assert_array_equal(idx.to_host(), order)
    close(vals, np.take_along_axis(x, order, -1))
    vals, idx = ops.topk(t, 2, axis=0)
    np.testing.assert_array_equal(idx.to_host(), np.argsort(-x, axis=0, kind="stable")[:2])


def test_gather_scatter(queue):
    rng = np.random.default_rng(18)
    x = rng.standard_normal((5, 7))
    idx = rng.integers(0, 5, size=(3, 7)).astype(np.int64)
    tx = dev(queue, x.astype(np.float32))
    close(ops.gather(tx, 0, dev(queue, idx)), np.take_along_axis(x, idx, 0))
    ids = np.array([4, 0, 0, 3], np.int32)
    close(ops.index_select(tx, 0, dev(queue, ids)), x[ids])
    close(ops.embedding(tx, dev(queue, ids.reshape(2, 2))), x[ids.reshape(2, 2)])
    src = rng.standard_normal((3, 7))
    want = x.copy()
    np.add.at(want, (idx, np.arange(7)[None, :].repeat(3, 0)), src)
    for det in (False, True):
        got = ops.scatter_add(tx, 0, dev(queue, idx), dev(queue, src.astype(np.float32)), deterministic=det)
        close(got, want)


def test_scatter_add_by_sorted_segments(queue, monkeypatch):
    """segments.cl (rank, offsets, starts, place) and index.cl's scatter_add_segments: 37 colliding ids in
    5 blocks of 8 (the scan over 4 work-items), negatives and ids out of range, an index expanded over the
    rows (embedding's backward), float32 and int64."""
    monkeypatch.setattr(movement, "SEGMENT_BLOCK", 8)
    monkeypatch.setattr(movement, "SEGMENT_SCAN", 4)
    rng = np.random.default_rng(19)
    ids = rng.choice([0, 2, 2, 2, 5, -1, 6, -9], size=37)
    x = rng.standard_normal((6, 3))
    src = rng.standard_normal((37, 3))
    wrapped = np.where(ids < 0, ids + 6, ids)
    keep = (wrapped >= 0) & (wrapped < 6)
    want = x.copy()
    np.add.at(want, wrapped[keep], src[keep])
    index = dev(queue, ids.astype(np.int32)).reshape(-1, 1).expand(-1, 3)
    got = ops.scatter_add(dev(queue, x.astype(np.float32)), 0, index, dev(queue, src.astype(np.float32)),
                          deterministic=True, check_bounds=False)
    close(got, want)
    xi, srci = rng.integers(-5, 5, size=(6, 3)), rng.integers(-5, 5, size=(37, 3))
    wanti = xi.copy()
    np.add.at(wanti, wrapped[keep], srci[keep])
    goti = ops.scatter_add(dev(queue, xi), 0, index, dev(queue, srci), check_bounds=False)
    np.testing.assert_array_equal(goti.to_host(), wanti)
