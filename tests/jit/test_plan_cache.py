"""Launch plans of netcl.jit.runner / netcl.jit.reduce (kept in netcl.core.capture.plans): a repeat of the
same structure reuses the plan; anything that changes the launch (param values, buffers, offsets, strides)
must not."""

from __future__ import annotations

import numpy as np

from netcl import ops
from netcl.core import capture
from netcl.core.tensor import Tensor
from netcl.jit import codegen, ir, lazy
from netcl.jit import reduce as jreduce
from tests.reference import assert_close


def test_repeat_reuses_plan_and_sees_new_buffers_and_params(queue, rng):
    ha, hb = rng.standard_normal(37).astype(np.float32), rng.standard_normal(37).astype(np.float32)
    a, b = Tensor.from_host(queue, ha), Tensor.from_host(queue, hb)
    (a * 2.0 + b).realize()
    n_plans = len(capture.plans)
    for scale in (2.0, 3.0, 3.0, -0.5):  # same structure: one plan, new param values honoured
        hc = rng.standard_normal(37).astype(np.float32)
        c = Tensor.from_host(queue, hc)
        got = (c * scale + b).to_host()
        np.testing.assert_array_equal(got, hc * np.float32(scale) + hb)
    assert len(capture.plans) == n_plans


def test_signed_zero_param_is_not_mistaken_for_the_previous_one(queue):
    x = Tensor.from_host(queue, np.ones(5, np.float32))
    assert not np.signbit((x * 0.0).to_host()).any()
    assert np.signbit((x * -0.0).to_host()).all()
    assert not np.signbit((x * 0.0).to_host()).any()


def test_views_at_other_offsets_and_strides_get_their_own_plan(queue, rng):
    h = rng.standard_normal((7, 17)).astype(np.float32)
    x = Tensor.from_host(queue, h)
    for view, ref in ((x[1:], h[1:]), (x[2:], h[2:]), (x[:, 3:], h[:, 3:]), (x.T, h.T), (x[1:], h[1:])):
        assert_close(ops.exp(view * 0.5), np.exp(ref.astype(np.float64) * 0.5), np.float32)
        assert_close(ops.sum(view, axis=-1), ref.astype(np.float64).sum(-1), np.float32)
        assert_close(ops.softmax(view, -1), _softmax(ref.astype(np.float64)), np.float32)


def test_reduction_repeat_with_gpu_layout_and_partials(queue, rng, monkeypatch):
    monkeypatch.setattr(jreduce, "FORCE_KIND", "gpu")  # multi-part sum: stage two on every repeat
    for _ in range(3):
        h = rng.standard_normal(70001).astype(np.float32)
        x = Tensor.from_host(queue, h)
        assert_close(ops.sum(x * 2.0), (h.astype(np.float64) * 2).sum(), np.float32)


def test_flatten_matches_walk_order_on_shared_subgraphs(queue):
    t = [Tensor.from_host(queue, np.ones(3, np.float32)) for _ in range(2)]
    la, lb = ir.leaf(t[0]), ir.leaf(t[1])
    s = ir.binary("add", la, ir.param(1.0, ir.F32))
    e = ir.binary("mul", ir.unary("exp", s), ir.binary("sub", s, ir.leaf(t[0])))
    deep = lb
    for _ in range(3000):  # deeper than Python's recursion limit: the iterative fallback
        deep = ir.unary("neg", deep)
    for outs in ([e], [e, s], [deep, e]):
        got = codegen.flatten(outs)
        want = codegen._flatten_iterative(outs)
        assert got[0] == want[0] and got[2] == want[2]
        assert [id(x) for x in got[1]] == [id(x) for x in want[1]]


def _structure(t: Tensor) -> tuple:
    """(codegen.flatten's description, the leaves' layouts, the number of params) of pending `t`."""
    (desc, out_pos), leaves, params = codegen.flatten([t._pending.expr])
    return desc, out_pos, tuple((x.shape, x.strides, x.offset, x.dtype) for x in leaves), len(params)


def test_structural_key_names_one_flattened_structure(queue, rng):
    """Expressions with shared leaves, shared pending operands and broadcasting, built op by op at random:
    wherever two get the same structural key (netcl.jit.lazy), flatten gives them the same description."""
    h = rng.standard_normal((4, 5)).astype(np.float32)
    base = [Tensor.from_host(queue, x) for x in (h, h.copy(), h[0].copy())]
    seen: dict[tuple, tuple] = {}
    keyed = 0
    for trial in range(300):
        pool = list(base)
        for _ in range(int(rng.integers(1, 6))):
            a, b = pool[int(rng.integers(len(pool)))], pool[int(rng.integers(len(pool)))]
            kind = int(rng.integers(5))
            if kind == 0:
                pool.append(a * b)
            elif kind == 1:
                pool.append(ops.relu(a + 1.5))
            elif kind == 2:
                pool.append(ops.where(ops.gt(a, 0), b, 0.0))
            elif kind == 3:
                pool.append(ops.exp(a) - a)
            else:
                pool.append(a.to(np.float16) * 2 if trial % 2 else a / (b * b + 1.0))
        out = pool[-1]
        if out._pending is None:
            continue
        key = lazy._info(out._pending.expr)[2]
        if key is None:
            continue
        keyed += 1
        assert seen.setdefault(key, _structure(out)) == _structure(out)
    assert keyed > 100 and len(seen) > 20


def test_repeat_by_key_does_not_flatten_and_honours_sharing(queue, rng, monkeypatch):
    h, hg = rng.standard_normal(33).astype(np.float32), rng.standard_normal(33).astype(np.float32)
    x, g = Tensor.from_host(queue, h), Tensor.from_host(queue, hg)
    relu_mask = np.where(h > 0, hg, np.float32(0.0))
    np.testing.assert_array_equal(ops.where(ops.gt(x, 0), g, 0.0).to_host(), relu_mask)
    calls = []
    real = codegen.flatten
    monkeypatch.setattr(codegen, "flatten", lambda outs: calls.append(1) or real(outs))
    for _ in range(3):  # a repeat: new nodes and result, the plan found by the key alone
        y = Tensor.from_host(queue, h)
        np.testing.assert_array_equal(ops.where(ops.gt(y, 0), g, 0.0).to_host(), relu_mask)
    assert calls == []
    # the same tree but one tensor in both places (one leaf slot): its own key and plan
    got = ops.where(ops.gt(x, 0), x, 0.0).to_host()
    np.testing.assert_array_equal(got, np.where(h > 0, h, 0).astype(np.float32))
    assert len(calls) == 1
    # a pending operand used twice (one node reached twice): flattened as before, values exact
    p = x * 2.0
    q = (p + 1.0) * (p - 1.0)
    assert lazy._info(q._pending.expr)[2] is None
    two = h * np.float32(2)
    np.testing.assert_array_equal(q.to_host(), (two + np.float32(1)) * (two - np.float32(1)))
    r = x * 3.0
    np.testing.assert_array_equal((r * r).to_host(), (h * np.float32(3)) ** 2)


def _softmax(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_precision_and_determinism_switches_forget_the_plans(queue, rng):
    """A plan keeps the kernel its op chose: changing a setting an op's choice reads (the float32 matmul
    precision: TF32 or not; determinism: the float-atomic paths or not) empties the cache, so the next call
    chooses again, and setting the same value keeps the plans."""
    import netcl

    a = Tensor.from_host(queue, rng.standard_normal((8, 8)).astype(np.float32))
    was_precision, was_deterministic = netcl.get_matmul_precision(), netcl.get_deterministic()
    try:
        for switch, values in ((netcl.set_matmul_precision, ("highest", "high")),
                               (netcl.set_deterministic, (True, False))):
            switch(values[0])
            (a @ a).realize()
            assert len(capture.plans) > 0
            switch(values[0])
            assert len(capture.plans) > 0
            switch(values[1])
            assert len(capture.plans) == 0
    finally:
        netcl.set_matmul_precision(was_precision)
        netcl.set_deterministic(was_deterministic)
