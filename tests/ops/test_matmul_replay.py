"""gemm's replay of repeated launches: the second and later calls with the same signature reuse the
first call's kernel and sizes, with the new operands' buffers and offsets."""

from __future__ import annotations

import importlib
import math

import numpy as np

from netcl.core.tensor import Tensor
from netcl.ops import gemm as mm
from netcl.profiling import count_launches
from tests.reference import assert_close

ATOL = 1e-4  # float32 sums of ~30 standard-normal products (cancellation near zero)


def _ref(a, b):
    return a.astype(np.float64) @ b.astype(np.float64)


def test_replay_uses_new_operands_and_offsets(queue, rng):
    base = rng.standard_normal((40, 33)).astype(np.float32)
    w = rng.standard_normal((17, 33)).astype(np.float32)
    bias = rng.standard_normal(17).astype(np.float32)
    big = Tensor.from_host(queue, base)
    wt = Tensor.from_host(queue, w)
    bt = Tensor.from_host(queue, bias)
    for start in (0, 3, 3, 7, 0):  # row slices: same shape and strides, different offsets
        x = big[start : start + 30]
        with count_launches() as c:
            y = mm.linear(x, wt, bt, activation="relu")
        assert c.count == 1
        assert_close(y, np.maximum(_ref(base[start : start + 30], w.T) + bias, 0), np.float32, atol=ATOL)
    for _ in range(3):  # fresh operands each call
        a_np = rng.standard_normal((30, 33)).astype(np.float32)
        b_np = rng.standard_normal((33, 17)).astype(np.float32)
        r_np = rng.standard_normal((30, 17)).astype(np.float32)
        out = mm.matmul_epilogue(
            Tensor.from_host(queue, a_np),
            Tensor.from_host(queue, b_np),
            residual=Tensor.from_host(queue, r_np),
        )
        assert_close(out, _ref(a_np, b_np) + r_np, np.float32, atol=ATOL)


def test_replay_keys_differ_by_layout_and_epilogue(queue, rng):
    a_np = rng.standard_normal((20, 24)).astype(np.float32)
    b_np = rng.standard_normal((24, 36)).astype(np.float32)
    a = Tensor.from_host(queue, a_np)
    b = Tensor.from_host(queue, b_np)
    bt = Tensor.from_host(queue, np.ascontiguousarray(b_np.T)).transpose(0, 1)
    for _ in range(2):
        assert_close(mm.matmul(a, b), _ref(a_np, b_np), np.float32, atol=ATOL)
        assert_close(mm.matmul(a, bt), _ref(a_np, b_np), np.float32, atol=ATOL)
        assert_close(mm.matmul_epilogue(a, b, alpha=2.0), 2 * _ref(a_np, b_np), np.float32, atol=ATOL)
        assert_close(mm.matmul_epilogue(a, b, activation="relu"), np.maximum(_ref(a_np, b_np), 0), np.float32,
                     atol=ATOL)
        out, rowsum = mm.matmul_rowsum(a, b)
        assert_close(out, _ref(a_np, b_np), np.float32, atol=ATOL)
        if rowsum is not None:
            assert_close(rowsum, a_np.astype(np.float64).sum(axis=1), np.float32, atol=ATOL)


def test_repeated_problems_replay_their_template(queue, rng, monkeypatch):
    """The second call of a problem skips the host path (netcl.ops.gemm.launch): its recorded template is
    replayed with the new operands, output, bias and residual bound to the slots."""
    api = importlib.import_module("netcl.ops.gemm.api")
    monkeypatch.setattr(api, "_templates", {})
    calls = []
    real_launch = api.launch
    monkeypatch.setattr(api, "launch", lambda *a, **kw: calls.append(1) or real_launch(*a, **kw))
    base = rng.standard_normal((50, 33)).astype(np.float32)
    w = rng.standard_normal((33, 40)).astype(np.float32)
    bias, res = rng.standard_normal(40).astype(np.float32), rng.standard_normal((20, 40)).astype(np.float32)
    big = Tensor.from_host(queue, base)
    for start in (0, 12, 28):  # the same layout at other offsets (12*33 and 28*33 are both 12 mod 16)
        x = big[start:start + 20]
        got = mm.matmul_epilogue(x, Tensor.from_host(queue, w), Tensor.from_host(queue, bias), "gelu",
                                 Tensor.from_host(queue, res))
        want = _ref(base[start:start + 20], w) + bias
        want = 0.5 * want * (1 + np.vectorize(math.erf)(want / math.sqrt(2))) + res
        assert_close(got, want, np.float32, atol=ATOL)
    keys = {k[4] for k in api._templates}  # a's offset mod 16 is part of the key
    assert len(calls) == len(api._templates) == len(keys) == 2


def test_pending_operands_do_not_spoil_the_template(queue, rng, monkeypatch):
    """An operand that is still a pending elementwise result (a gradient masked by relu) is computed before
    the first call records its template, so the template holds the GEMM alone and later calls replay it."""
    from netcl import ops

    api = importlib.import_module("netcl.ops.gemm.api")
    monkeypatch.setattr(api, "_templates", {})
    calls = []
    real_launch = api.launch
    monkeypatch.setattr(api, "launch", lambda *a, **kw: calls.append(1) or real_launch(*a, **kw))
    for _ in range(3):
        a_np, b_np = (
            rng.standard_normal((40, 33)).astype(np.float32),
            rng.standard_normal((33, 24)).astype(np.float32),
        )
        a = ops.relu(Tensor.from_host(queue, a_np))
        assert a.is_pending  # (automatic fusion is on in the suite)
        assert_close(mm.matmul(a, Tensor.from_host(queue, b_np)), _ref(np.maximum(a_np, 0), b_np), np.float32,
                     atol=ATOL)
    assert len(calls) == 1 and len(api._templates) == 1
