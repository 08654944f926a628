"""Pooling forward/backward against float64 NumPy loops and adjoint identities (netcl/ops/pool.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, ShapeError
from netcl.ops import pool as P
from tests.reference import assert_close


def _out(size, k, s, p, d, ceil_mode):
    span = size + 2 * p - d * (k - 1) - 1
    o = (math.ceil(span / s) if ceil_mode else span // s) + 1
    if ceil_mode and (o - 1) * s >= size + p:
        o -= 1
    return o


def ref_max_pool(x, k, s, p, d=(1, 1), ceil_mode=False):
    n, c, h, w = x.shape
    oh, ow = _out(h, k[0], s[0], p[0], d[0], ceil_mode), _out(w, k[1], s[1], p[1], d[1], ceil_mode)
    out = np.full((n, c, oh, ow), -np.inf)
    idx = np.zeros((n, c, oh, ow), np.int64)
    for i in range(oh):
        for j in range(ow):
            for a in range(k[0]):
                for b in range(k[1]):
                    ih, iw = i * s[0] - p[0] + a * d[0], j * s[1] - p[1] + b * d[1]
                    if 0 <= ih < h and 0 <= iw < w:
                        v = x[:, :, ih, iw]
                        better = v > out[:, :, i, j]
                        out[:, :, i, j] = np.where(better, v, out[:, :, i, j])
                        idx[:, :, i, j] = np.where(better, ih * w + iw, idx[:, :, i, j])
    return out, idx


def ref_avg_pool(x, k, s, p, include_pad, ceil_mode=False):
    n, c, h, w = x.shape
    oh, ow = _out(h, k[0], s[0], p[0], 1, ceil_mode), _out(w, k[1], s[1], p[1], 1, ceil_mode)
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            hs, ws = i * s[0] - p[0], j * s[1] - p[1]
            he, we = min(hs + k[0], h + p[0]), min(ws + k[1], w + p[1])
            win = x[:, :, max(hs, 0):min(he, h), max(ws, 0):min(we, w)]
            div = (he - hs) * (we - ws) if include_pad else win.shape[2] * win.shape[3]
            out[:, :, i, j] = win.sum(axis=(2, 3)) / div
    return out


def ref_adaptive(x, oh, ow):
    n, c, h, w = x.shape
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            hs, he = (i * h) // oh, -((-(i + 1) * h) // oh)
            ws, we = (j * w) // ow, -((-(j + 1) * w) // ow)
            out[:, :, i, j] = x[:, :, hs:he, ws:we].mean(axis=(2, 3))
    return out


MAX_CASES = [((2, 3, 7, 9), 3, 2, 1, 1, False), ((3, 5, 9, 11), 2, 2, 0, 1, False),
             ((1, 2, 8, 5), (2, 3), (2, 1), (1, 0), (2, 1), True),
             ((1, 1, 5, 5), 2, None, 0, 1, True), ((2, 3, 7, 9), 2, 2, 0, 1, False)]  # last: the 2x2 kernel


@pytest.mark.parametrize("algo", ["gather", "plane"])
@pytest.mark.parametrize("shape,k,s,p,d,ceil_mode", MAX_CASES)
def test_max_pool2d_forward_backward(queue, rng, shape, k, s, p, d, ceil_mode, algo):
    x = rng.standard_normal(shape)
    pair = lambda v: (v, v) if isinstance(v, int) else v  # noqa: E731
    want, want_idx = ref_max_pool(x, pair(k), pair(k if s is None else s), pair(p), pair(d), ceil_mode)
    fwd = "element" if algo == "gather" else "rows"  # each forward kernel once per case too
    out, idx = P.max_pool2d(Tensor.from_host(queue, x), k, s, p, d, ceil_mode, algorithm=fwd)
    assert_close(out, want)
    np.testing.assert_array_equal(idx.to_host(), want_idx)
    gy = rng.standard_normal(want.shape)
    gx = P.max_pool2d_backward(Tensor.from_host(queue, gy), idx, shape, k, s, p, d, ceil_mode,
                               algorithm=algo).to_host()
    ref = np.zeros(shape).reshape(shape[0], shape[1], -1)
    for (a, b, i, j), flat in np.ndenumerate(want_idx):
        ref[a, b, flat] += gy[a, b, i, j]
    assert_close(gx, ref.reshape(shape))


@pytest.mark.parametrize("algo", ["element", "rows"])
def test_max_pool2d_ties_float32(queue, algo):
    x = np.zeros((1, 2, 5, 7), np.float32)  # all ties: the first element of each window wins
    x[0, 1, 1, 2] = 1.0
    out, idx = P.max_pool2d(Tensor.from_host(queue, x), 3, 2, 1, algorithm=algo)
    want, want_idx = ref_max_pool(x.astype(np.float64), (3, 3), (2, 2), (1, 1))
    np.testing.assert_array_equal(out.to_host(), want.astype(np.float32))
    np.testing.assert_array_equal(idx.to_host(), want_idx)
    with pytest.raises(ValueError):
        P.max_pool2d(Tensor.from_host(queue, x), 2, algorithm="bogus")


def test_max_pool2d_float32_noncontiguous(queue, rng):
    x = rng.standard_normal((2, 6, 7, 3)).astype(np.float32)
    out, _ = P.max_pool2d(Tensor.from_host(queue, x).permute(0, 3, 1, 2), 2)
    assert_close(out, ref_max_pool(x.transpose(0, 3, 1, 2).astype(np.float64), (2, 2), (2, 2), (0, 0))[0])


@pytest.mark.parametrize("include_pad", [True, False])
@pytest.mark.parametrize("shape,k,s,p,ceil_mode",
                         [((2, 3, 7, 9), 3, 2, 1, False), ((1, 2, 6, 5), (3, 2), 2, (1, 1), True)])
def test_avg_pool2d_forward_and_adjoint_backward(queue, rng, shape, k, s, p, ceil_mode, include_pad):
    x = rng.standard_normal(shape)
    pair = lambda v: (v, v) if isinstance(v, int) else v  # noqa: E731
    want = ref_avg_pool(x, pair(k), pair(s), pair(p), include_pad, ceil_mode)
    out = P.avg_pool2d(Tensor.from_host(queue, x), k, s, p, ceil_mode, include_pad)
    assert_close(out, want)
    # the backward of a linear map is its adjoint: <pool(x), gy> == <x, pool_backward(gy)>
    gy = rng.standard_normal(want.shape)
    gx = P.avg_pool2d_backward(Tensor.from_host(queue, gy), shape, k, s, p, ceil_mode, include_pad).to_host()
    assert np.sum(want * gy) == pytest.approx(np.sum(x * gx), rel=1e-12)
    # and one coordinate checked directly
    e = np.zeros(shape)
    e[0, 0, 1, 1] = 1.0
    assert gx[0, 0, 1, 1] == pytest.approx(
        np.sum(ref_avg_pool(e, pair(k), pair(s), pair(p), include_pad, ceil_mode) * gy))


@pytest.mark.parametrize("shape,size", [((2, 3, 7, 9), (3, 4)), ((1, 2, 5, 6), 1), ((1, 1, 4, 3), (7, 5))])
def test_adaptive_avg_pool2d(queue, rng, shape, size):
    x = rng.standard_normal(shape)
    oh, ow = (size, size) if isinstance(size, int) else size
    want = ref_adaptive(x, oh, ow)
    assert_close(P.adaptive_avg_pool2d(Tensor.from_host(queue, x), size), want)
    gy = rng.standard_normal(want.shape)
    gx = P.adaptive_avg_pool2d_backward(Tensor.from_host(queue, gy), shape).to_host()
    assert np.sum(want * gy) == pytest.approx(np.sum(x * gx), rel=1e-12)
    basis = np.zeros(shape)
    basis[0, -1, -1, -1] = 1.0
    assert gx[0, -1, -1, -1] == pytest.approx(np.sum(ref_adaptive(basis, oh, ow) * gy))


def test_average_pools_keep_one_plan_a_signature(queue, rng):
    """The average pools' launches are Plans kept per call signature (netcl.core.capture.plans): a second call
    of the same shape, on other memory at another offset (a view), adds no plan and reads its own input; a new
    shape or output size adds one."""
    from netcl.core import capture
    x = rng.standard_normal((2, 3, 6, 5))
    big = rng.standard_normal((4, 3, 6, 5))
    calls = [lambda t: P.adaptive_avg_pool2d(t, (3, 2)), lambda t: P.avg_pool2d(t, 2, 1, 1),
             lambda t: P.adaptive_avg_pool2d_backward(t, (2, 3, 12, 10)),
             lambda t: P.avg_pool2d_backward(t, (2, 3, 5, 4), 2, 1, 1)]
    wants = [lambda a: ref_adaptive(a, 3, 2), lambda a: ref_avg_pool(a, (2, 2), (1, 1), (1, 1), True, False),
             None, None]
    for call, want in zip(calls, wants, strict=True):
        first = call(Tensor.from_host(queue, x)).to_host()
        before = len(capture.plans)
        view = Tensor.from_host(queue, big)[2:]   # the same shape at an offset into other memory
        second = call(view).to_host()
        assert len(capture.plans) == before
        if want is not None:
            assert_close(first, want(x))
            assert_close(second, want(big[2:]))
        else:
            assert_close(second, call(Tensor.from_host(queue, big[2:].copy())).to_host(), rtol=0, atol=0)
            assert not np.array_equal(first, second)
    P.adaptive_avg_pool2d(Tensor.from_host(queue, x), (2, 2))
    assert len(capture.plans) == before + 1


def test_global_avg_pool2d_float32(queue, rng):
    x = rng.standard_normal((3, 5, 7, 7)).astype(np.float32)
    assert_close(
        P.global_avg_pool2d(Tensor.from_host(queue, x)),
        x.astype(np.float64).mean(axis=(2, 3), keepdims=True),
        rtol=1e-5,
        atol=1e-6,
    )


def test_pool_errors(queue):
    x = Tensor.zeros(queue, (1, 2, 4, 4))
    with pytest.raises(ShapeError, match="4-D"):
        P.max_pool2d(Tensor.zeros(queue, (2, 4, 4)), 2)
    with pytest.raises(ShapeError, match="padding"):
        P.max_pool2d(x, 2, padding=2)
    with pytest.raises(ShapeError, match="kernel"):
        P.avg_pool2d(x, 5)
    with pytest.raises(ShapeError, match="stride"):
        P.avg_pool2d(x, 2, stride=0)
    with pytest.raises(DTypeError):
        P.max_pool2d(Tensor.zeros(queue, (1, 2, 4, 4), np.int32), 2)
    out, idx = P.max_pool2d(x, 2)
    with pytest.raises(ShapeError, match="pooled shape"):
        P.max_pool2d_backward(out, idx, (1, 2, 6, 6), 2)
