"""Automatic fusion: launch counts, fused == unfused, pending-result correctness rules, debug output."""

from __future__ import annotations

import math

import numpy as np
import pytest

from netcl import kernels, ops
from netcl.core.tensor import Tensor
from netcl.graph import Graph
from netcl.jit import codegen, ir
from netcl.profiling import count_launches
from tests.reference import assert_close


def chain(x, y):
    t = x * 2.0
    t = t + y
    t = ops.exp(t * -0.5)
    t = t - 1.0
    t = ops.tanh(t)
    t = t * y
    t = ops.abs(t)
    return ops.sqrt(t)


def chain_ref(a, b):
    return np.sqrt(np.abs(np.tanh(np.exp((a * 2 + b) * -0.5) - 1) * b))


def test_nine_op_chain_is_one_launch(queue, rng):
    a = rng.standard_normal((33, 17)).astype(np.float32)
    b = rng.standard_normal((17,)).astype(np.float32)
    x, y = Tensor.from_host(queue, a), Tensor.from_host(queue, b)
    with count_launches() as n:
        out = chain(x, y)
        assert out.is_pending
        host = out.to_host()
    assert n.count == 1
    assert_close(
        host, chain_ref(a.astype(np.float64), b.astype(np.float64)), np.float32, rtol=1e-5, atol=1e-6
    )


def test_unfused_is_one_launch_per_op_and_identical(queue, rng, monkeypatch):
    for dtype in (np.float32, np.float16):
        a = rng.standard_normal((7, 130)).astype(dtype)
        b = rng.standard_normal((130,)).astype(dtype)
        x, y = Tensor.from_host(queue, a), Tensor.from_host(queue, b)
        fused = chain(x, y).to_host()
        monkeypatch.setenv("NETCL_FUSION", "0")
        with count_launches() as n:
            unfused = chain(x, y).to_host()
        monkeypatch.delenv("NETCL_FUSION")
        assert n.count == 9  # one launch per op of the nine-op chain
        np.testing.assert_array_equal(fused, unfused)


def test_live_intermediate_is_stored_by_the_same_launch(queue, rng):
    a = rng.standard_normal((5, 9)).astype(np.float32)
    x = Tensor.from_host(queue, a)
    with count_launches() as n:
        h = x * 3.0
        out = ops.sigmoid(h) + 1.0
        out.to_host()
        assert not h.is_pending
        hh = h.to_host()
    assert n.count == 1
    assert_close(hh, a * 3.0, np.float32)


def test_in_place_write_realizes_pending_readers_first(queue, rng):
    a = rng.standard_normal((4, 6)).astype(np.float32)
    x = Tensor.from_host(queue, a)
    y = x * 2.0
    assert y.is_pending
    x.fill_(0.0)
    assert_close(y, a * 2.0, np.float32)
    z = x + 1.0
    x[1:3] = 5.0
    assert_close(z, np.ones_like(a), np.float32)
    w = x * 1.0
    x += 1.0
    assert_close(w, np.where(np.arange(4)[:, None] // 1 % 3 != 0, 5, 0) * np.ones_like(a), np.float32)


def test_augmented_assignment_is_one_launch(queue, rng):
    """`x += y` (and -=, *=, /=) reads each element of x before it writes it, in one launch, as PyTorch's:
    by a scalar, a tensor, x itself, a broadcast row, a pending expression, on a transposed view. Where the
    right side reads x's memory elsewhere (a shifted slice, a transpose) that operand is copied first, and a
    pending result that Python still holds and that reads x is computed first: the results are NumPy's
    (which copies overlapping operands first)."""
    a = rng.standard_normal((5, 5)).astype(np.float32)
    b = rng.standard_normal((5, 5)).astype(np.float32)
    x, y = Tensor.from_host(queue, a), Tensor.from_host(queue, b)
    want = a.copy()
    row = Tensor.from_host(queue, b[0])
    for rhs, ref in ((1.5, lambda w: w + 1.5), (y, lambda w: w + b), (x, lambda w: w + w),
                     (row, lambda w: w + b[0]), (y * 2.0 - 1.0, lambda w: w + (b * 2 - 1))):
        with count_launches() as n:
            x += rhs
        assert n.count == 1
        want = ref(want)
        assert_close(x, want, np.float32)
    for op, ref in (("-=", np.subtract), ("*=", np.multiply), ("/=", np.divide)):
        with count_launches() as n:
            exec(f"x {op} y", {"x": x, "y": y})
        assert n.count == 1
        want = ref(want, b)
        assert_close(x, want, np.float32)
    xt = x.T
    with count_launches() as n:
        xt += 1.0
    assert n.count == 1
    want = want + 1.0
    assert_close(x, want, np.float32)
    # reads of x elsewhere than the element written: that operand is copied first (a copy of its own; a
    # device that happens to run the one launch in a safe order would hide the hazard, so the work is listed)
    for rhs, ref, first in ((lambda: x[:-1], lambda w: w[:-1], "copy"),
                            (lambda: x.T[1:], lambda w: w.T[1:], "strided_copy")):
        v = x[1:]
        g = Graph()
        with g.capture():   # (runs the work once, as it records it)
            v += rhs()
        assert [op[1].name if op[0] == "k" else op[0] for op in g.ops] == [first, "ew"]
        want[1:] += ref(want).copy()
        assert_close(x, want, np.float32)
    held = x * 3.0   # pending, read after the write: it keeps x's old values
    with count_launches() as n:
        x += 1.0
    assert n.count == 2
    assert_close(held, want * 3.0, np.float32)
    assert_close(x, want + 1.0, np.float32)
    for shape in ((6,), (1,), (1, 3), (3, 1)):   # a size-1 axis's stride is no other mapping: no copy
        i = Tensor.from_host(queue, np.arange(math.prod(shape), dtype=np.int32).reshape(shape))
        g = Graph()
        with g.capture():
            i += 2
        assert [op[1].name if op[0] == "k" else op[0] for op in g.ops] == ["ew"] and i.dtype == np.int32
        np.testing.assert_array_equal(i.to_host(), np.arange(math.prod(shape)).reshape(shape) + 2)
    col = Tensor.from_host(queue, np.arange(1.0, 9.0, dtype=np.float32).reshape(4, 2))
    col += col[1:2]   # row 1 read by every row, and written: the row copied first
    np.testing.assert_array_equal(col.to_host(), np.arange(1.0, 9.0).reshape(4, 2) + [3.0, 4.0])


def test_buffer_access_and_views_realize(queue, rng):
    a = rng.standard_normal((6, 4)).astype(np.float32)
    x = Tensor.from_host(queue, a)
    y = x - 1.0
    _ = y.buffer
    assert not y.is_pending
    z = x + 2.0
    assert_close(z.T, (a + 2.0).T, np.float32)
    assert_close((x * x).reshape(24)[3:9], (a * a).reshape(24)[3:9], np.float32)


def test_long_chains_stay_bounded(queue):
    x = Tensor.ones(queue, (10,))
    for _ in range(400):
        x = x + 1.0
    assert_close(x, np.full(10, 401.0), np.float32)


def test_generated_source_is_printed_at_debug_2(queue, monkeypatch, capfd):
    monkeypatch.setenv("NETCL_DEBUG", "2")
    monkeypatch.setenv("NETCL_DISK_CACHE", "0")
    monkeypatch.setattr(kernels, "_programs", {})  # a fresh program cache: the kernel is built (and printed)
    x = Tensor.ones(queue, (3,))
    (ops.atan2(x, x * 3.0)).to_host()
    err = capfd.readouterr().err
    assert "__kernel void ew" in err and "atan2" in err
    assert "launch ew" in err


def test_codegen_is_structural(queue):
    t = Tensor.ones(queue, (4,))
    e1 = ir.binary("mul", ir.leaf(t), ir.param(2.0, ir.F32))
    e2 = ir.binary("mul", ir.leaf(t), ir.param(3.0, ir.F32))
    assert codegen.flatten([e1])[0] == codegen.flatten([e2])[0]


@pytest.mark.parametrize("shape", [(1,), (3,), (130, 7)])
def test_vector_and_tail_paths(queue, rng, shape):
    a = rng.standard_normal(shape).astype(np.float32)
    x = Tensor.from_host(queue, a)
    assert_close(ops.exp(x) * x, np.exp(a.astype(np.float64)) * a, np.float32, rtol=2e-6)
