"""The ops that keep a call's whole launch under its signature (capture.call_key): a repeat of a signature
skips the checks and gives the same bits as the first call; another signature (dtype, shape, an offset the
launch keeps) takes the full path; a call that the checks refuse still raises after a signature was kept; and
capture.plans.invalidate() forgets them."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from netcl.core import capture
from netcl.core.tensor import Tensor
from netcl.errors import NetclError, ShapeError
from netcl.ops import norm
from netcl.ops import update as upd
from netcl.profiling import count_launches

rope_mod = importlib.import_module("netcl.ops.rope")  # the module (netcl.ops.rope is also the function)


def _t(queue, a):
    return Tensor.from_host(queue, np.ascontiguousarray(a))


def _repeat_skips_checks(monkeypatch, module, check: str, call, again_checked):
    """call() twice: the second takes the kept launch (the check `module.check` not run: it raises if it is),
    with the first call's bits; then `again_checked()` (another signature) runs the check again."""
    first = [t.to_host() for t in call()]
    calls = []
    real = getattr(module, check)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, check, counted)
    with count_launches() as launches:
        second = [t.to_host() for t in call()]
    assert calls == [] and launches.count >= 1
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
    again_checked()
    assert calls, "another signature must take the full path (its checks)"


def test_rms_and_layer_norm_keep_their_launch(queue, rng, monkeypatch):
    x = rng.standard_normal((3, 5, 24)).astype(np.float32)
    w, b = rng.standard_normal(24).astype(np.float32), rng.standard_normal(24).astype(np.float32)
    xt, wt, bt = _t(queue, x), _t(queue, w), _t(queue, b)
    _repeat_skips_checks(monkeypatch, norm, "_row_dtype", lambda: norm.rms_norm(xt, (24,), wt, 1e-5),
                         lambda: norm.rms_norm(_t(queue, x[:, :4]), (24,), wt, 1e-5))
    out, mean, rstd = norm.layer_norm(xt, (24,), wt, bt, 1e-5)
    again = norm.layer_norm(xt, (24,), wt, bt, 1e-5)
    assert all(np.array_equal(a.to_host(), b.to_host()) for a, b in zip((out, mean, rstd), again))
    assert mean.shape == rstd.shape == (3, 5)
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * w + b
    np.testing.assert_allclose(again[0].to_host(), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeError):  # a weight of another shape is another signature: the checks refuse it
        norm.rms_norm(xt, (24,), _t(queue, w[:20]), 1e-5)
    # a weight that is a view at an offset is copied by the full path, never taken as it comes
    big = _t(queue, np.concatenate([np.zeros(8, np.float32), w]))
    view = big[8:]
    for _ in range(2):
        np.testing.assert_array_equal(norm.rms_norm(xt, (24,), view, 1e-5)[0].to_host(),
                                      norm.rms_norm(xt, (24,), wt, 1e-5)[0].to_host())


def test_rope_keeps_its_launch(queue, rng, monkeypatch):
    x = rng.standard_normal((2, 3, 7, 16)).astype(np.float32)
    cos, sin = rope_mod.rope_tables(queue, 32, 16)
    xt = _t(queue, x)
    offset = _t(queue, np.array([3], np.int32))
    _repeat_skips_checks(monkeypatch, rope_mod, "offset_args", lambda: [rope_mod.rope(xt, cos, sin, offset)],
                         lambda: rope_mod.rope(xt[:, :2], cos, sin, offset))
    # the offset's value is the call's, not the signature's
    moved = rope_mod.rope(xt, cos, sin, _t(queue, np.array([4], np.int32))).to_host()
    assert not np.array_equal(moved, rope_mod.rope(xt, cos, sin, offset).to_host())
    ref = rope_mod.rope(_t(queue, x), cos, sin, _t(queue, np.array([4], np.int32))).to_host()
    np.testing.assert_array_equal(moved, ref)


def test_batch_norm_gpu_layout_keeps_its_launch(queue, rng, monkeypatch):
    monkeypatch.setattr(norm, "FORCE_LAYOUT", "groups")
    monkeypatch.setattr(norm, "local_size_override", 8)
    x = rng.standard_normal((3, 4, 5, 6)).astype(np.float32)
    w, b = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    xt, wt, bt = _t(queue, x), _t(queue, w), _t(queue, b)
    rm, rv = Tensor.zeros(queue, (4,)), Tensor.ones(queue, (4,))
    _repeat_skips_checks(monkeypatch, norm, "_bn_dtypes",
                         lambda: norm.batch_norm(xt, wt, bt, None, None, True, activation="relu"),
                         lambda: norm.batch_norm(xt, wt, bt, rm, rv, True, activation="relu"))
    # the running statistics move on each kept call as on the first
    norm.batch_norm(xt, wt, bt, rm, rv, True)
    mean = x.mean(axis=(0, 2, 3))
    np.testing.assert_allclose(rm.to_host(), 0.1 * mean + 0.1 * 0.9 * mean, rtol=1e-5, atol=1e-6)
    with pytest.raises(ShapeError):
        norm.batch_norm(xt, _t(queue, w[:3]), bt, None, None, True)


def test_clip_grad_norm_keeps_its_launches(queue, rng, monkeypatch):
    gs = [rng.standard_normal(n).astype(np.float32) for n in (5, 300, 17)]
    big = np.concatenate([np.zeros(3, np.float32), gs[1]])

    def run(second_at_offset=False):
        ts = [_t(queue, g) for g in gs]
        if second_at_offset:
            ts[1] = _t(queue, big)[3:]
        norm_t = upd.clip_grad_norm(ts, 1.0)
        return [norm_t, *ts]

    _repeat_skips_checks(monkeypatch, upd, "state_dtype", run, lambda: run(second_at_offset=True))
    total = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in gs))
    got = run(second_at_offset=True)  # an offset is part of the signature: its own launches
    np.testing.assert_allclose(got[0].to_host()[0], total, rtol=1e-5)
    np.testing.assert_allclose(got[2].to_host(), gs[1] * (1.0 / (total + 1e-6)), rtol=1e-5, atol=1e-7)
    with pytest.raises(NetclError):
        upd.clip_grad_norm([_t(queue, gs[0]), _t(queue, gs[1].astype(np.float64))], 1.0)


def test_invalidate_forgets_kept_calls(queue, rng):
    xt = _t(queue, rng.standard_normal((4, 8)).astype(np.float32))
    norm.rms_norm(xt, (8,), None, 1e-6)
    assert any(type(k) is tuple and k[0] == "rms_norm" for k in capture.plans)
    capture.plans.invalidate()
    assert not any(type(k) is tuple and k[0] == "rms_norm" for k in capture.plans)


def test_rope_tables_at_an_offset(queue, rng):
    """A table that is a view starting past its storage's first element is read from its own start (the
    kernels read tables from element 0: such a view is copied first), whether or not a call was kept."""
    x = _t(queue, rng.standard_normal((1, 2, 5, 8)).astype(np.float32))
    cos, sin = rope_mod.rope_tables(queue, 16, 8)
    want = rope_mod.rope(x, cos[3:], sin[3:]).to_host()
    shifted = rope_mod.rope(x, cos, sin, _t(queue, np.array([3], np.int32))).to_host()
    np.testing.assert_array_equal(want, shifted)
    np.testing.assert_array_equal(rope_mod.rope(x, cos[3:], sin[3:]).to_host(), shifted)


def test_row_norms_of_no_rows_keep_their_statistics_shape(queue):
    """An input with no rows: the statistics have the leading shape (as with rows), whether or not a call of
    that signature was kept."""
    x = Tensor.empty(queue, (2, 0, 6), np.float32)
    for _ in range(2):
        out, mean, rstd = norm.layer_norm(x, (6,), None, None, 1e-5)
        assert out.shape == (2, 0, 6) and mean.shape == rstd.shape == (2, 0)
        assert norm.rms_norm(x, (6,), None, 1e-5)[1].shape == (2, 0)
