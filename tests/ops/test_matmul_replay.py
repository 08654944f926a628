"""gemm's replay of repeated launches: the second and later calls with the same signature reuse the
first call's kernel and sizes, with the new operands' buffers and offsets."""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest

from netcl.core import capture
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
    monkeypatch.setattr(capture, "plans", capture.PlanCache())
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
    keys = {k[5] for k in api.templates()}  # a's offset mod 16 is part of the key
    assert len(calls) == len(api.templates()) == len(keys) == 2


def test_pending_operands_do_not_spoil_the_template(queue, rng, monkeypatch):
    """An operand that is still a pending elementwise result (a gradient masked by relu) is computed before
    the first call records its template, so the template holds the GEMM alone and later calls replay it."""
    from netcl import ops

    api = importlib.import_module("netcl.ops.gemm.api")
    monkeypatch.setattr(capture, "plans", capture.PlanCache())
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
    assert len(calls) == 1 and len(api.templates()) == 1


def test_cpu_split_k_calls_are_replayed(device, queue, rng, monkeypatch):
    """A long-K problem that the CPU splits (a convolution's weight gradient: few output blocks, K = the
    batch's positions) records both launches (the batched GEMM over the K slices into the workspace, the
    reduction with the epilogue) on its first call; later calls replay them with new operands, output and
    workspace, without the host path (no problem prepared, no tuning read)."""
    if device.capabilities.kind != "cpu":
        pytest.skip("the cpu kernel's split-K runs on CPU devices")
    api = importlib.import_module("netcl.ops.gemm.api")
    monkeypatch.setattr(capture, "plans", capture.PlanCache())
    prepared = []
    real_prepare = api._prepare
    monkeypatch.setattr(api, "_prepare", lambda *a, **kw: prepared.append(1) or real_prepare(*a, **kw))
    m, n, k = 5, 7, 8192 + 1024  # 9216 = 9 x 1024: 8 slices of 1152 (a slice at least 1024 long)
    assert mm.splitk.choose_cpu_splits(real_prepare(
        Tensor.empty(queue, (m, k)), Tensor.empty(queue, (k, n)), None, None, None, 1.0), "cpu") == 8
    for _ in range(3):
        a_np = rng.standard_normal((m, k)).astype(np.float32)
        b_np = rng.standard_normal((n, k)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        with count_launches() as c:
            got = mm.linear(Tensor.from_host(queue, a_np), Tensor.from_host(queue, b_np),
                            Tensor.from_host(queue, bias))
        assert c.count == 2  # GEMM into the workspace + reduction with the bias
        assert_close(got, _ref(a_np, b_np.T) + bias, np.float32, atol=2e-3)
    assert len(prepared) == 2  # the first call's problem and its slices' problem; later calls replayed
    (template, _, work), = api.templates().values()
    assert template.launches == 2 and work[0] == (8, m, n)
