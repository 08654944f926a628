"""netcl.core.capture: recordings of launches, named slots, replay with other tensors bound."""

from __future__ import annotations

import numpy as np
import pytest

from netcl import kernels, ops
from netcl.core import capture
from netcl.core.tensor import Tensor
from netcl.errors import GraphCaptureError
from netcl.graph import Graph
from netcl.kernels.tuning import database_for
from netcl.ops.gemm import api as gemm_api
from netcl.ops.gemm import choose_variant
from netcl.profiling import count_launches
from tests.reference import assert_close

SOURCE = """
__kernel void axpy(__global float *y, const long y_off, __global const float *x, const long x_off,
                   const float a, const int n)
{
    const int i = get_global_id(0);
    if (i < n) y[y_off + i] += a * x[x_off + i];
}
"""


def _axpy(queue, y: Tensor, x: Tensor, a: float) -> None:
    prg = kernels.build(queue.device, SOURCE, "test_capture")
    prg.axpy(
        queue,
        (y.size,),
        None,
        y=y.buffer,
        y_off=np.int64(y.offset),
        x=x.buffer,
        x_off=np.int64(x.offset),
        a=np.float32(a),
        n=np.int32(y.size),
    )
    capture.name_slots(y=("y", "y_off"), x=("x", "x_off"))


def test_a_slotted_recording_replays_on_the_tensors_bound(queue, rng):
    xs = rng.standard_normal((3, 10)).astype(np.float32)
    y0, x0 = Tensor.zeros(queue, (10,)), Tensor.from_host(queue, xs[0])
    rec = capture.Recording()
    with capture.recording(rec):
        _axpy(queue, y0, x0, 2.0)
    assert rec.slotted and rec.launches == 1
    rec.unbind()  # the template keeps no buffer; every replay binds all slots
    assert all(a is None for a in (rec.ops[0][4][0], rec.ops[0][4][2]))
    np.testing.assert_array_equal(y0.to_host(), 2 * xs[0])
    big = Tensor.from_host(queue, xs.ravel())
    y1 = Tensor.from_host(queue, np.ones(13, np.float32))[3:]  # an offset output
    with count_launches() as c:
        rec.replay({"y": y1, "x": big[10:20]})  # an offset input
    assert c.count == 1
    np.testing.assert_array_equal(y1.to_host(), 1 + 2 * xs[1])
    np.testing.assert_array_equal(y0.to_host(), 2 * xs[0])  # the recorded tensors are untouched


def test_slots_name_kernel_parameters(queue):
    y = Tensor.zeros(queue, (4,))
    rec = capture.Recording()
    with capture.recording(rec), pytest.raises(GraphCaptureError, match=r"no argument 'out'.*y, y_off, x"):
        prg = kernels.build(queue.device, SOURCE, "test_capture")
        prg.axpy(queue, (4,), None, y.buffer, np.int64(0), y.buffer, np.int64(0), np.float32(1), np.int32(4))
        capture.name_slots(out=("out", "y_off"))
    with (
        capture.recording(capture.Recording()),
        pytest.raises(GraphCaptureError, match="right after a kernel"),
    ):
        capture.name_slots(y=("y",))


def test_unslotted_or_host_work_is_not_a_template(queue):
    y, x = Tensor.zeros(queue, (4,)), Tensor.ones(queue, (4,))
    rec = capture.Recording()
    with capture.recording(rec):
        _axpy(queue, y, x, 1.0)
        y.to_host()  # a host transfer: an op's template cannot redo it
    assert not rec.replayable and not rec.slotted
    rec = capture.Recording()
    with capture.recording(rec):
        y.copy_(x)  # device work whose arguments no one named
        _axpy(queue, y, x, 1.0)
    assert rec.replayable and not rec.slotted


def test_an_op_template_inside_a_graph(queue, rng):
    """Launches reach every active recording; slots are named on the innermost op recording only, and the
    graph keeps the concrete arguments (it replays exactly what ran)."""
    xs = rng.standard_normal(6).astype(np.float32)
    y, x = Tensor.zeros(queue, (6,)), Tensor.from_host(queue, xs)
    graph, inner = Graph(), capture.Recording()
    with graph.capture(queue):
        with capture.recording(inner):
            _axpy(queue, y, x, 1.0)
        assert capture.capturing() is graph
    assert inner.slotted and graph.launches == 1 and not graph.ops[0][5]
    graph.replay()
    np.testing.assert_array_equal(y.to_host(), 2 * xs)
    outer, inner = capture.Recording(), capture.Recording()
    with capture.recording(outer), capture.recording(inner):
        _axpy(queue, y, x, 1.0)
    assert inner.slotted and not outer.slotted  # an op's template around another's launches


def test_plans_are_reused_per_signature_and_a_new_dtype_gets_its_own(device, queue, rng, monkeypatch):
    """One plan per call signature in capture.plans: a repeat reuses the very plan (GEMM template and
    elementwise launch alike), a new dtype builds its own beside it, and every result stays exact."""
    monkeypatch.setattr(capture, "plans", capture.PlanCache())
    dts = [np.float32] + ([np.float64] if device.capabilities.fp64 else [])
    kept = {}
    for _ in range(3):
        for dt in dts:
            a, b = rng.standard_normal((37, 29)).astype(dt), rng.standard_normal((29, 41)).astype(dt)
            got = ops.matmul(Tensor.from_host(queue, a), Tensor.from_host(queue, b)) * 2.0 + 1.0
            assert got.dtype == dt
            assert_close(got, (a.astype(np.float64) @ b) * 2 + 1, dt, atol=1e-4)
            for key, plan in capture.plans.items():
                assert kept.setdefault(key, plan) is plan  # a repeat finds the plan it built the first time
    by_op = sorted(key[0] for key in kept)
    assert by_op == ["ew"] * len(dts) + ["gemm"] * len(dts)
    assert {key[2] for key in kept if key[0] == "gemm"} == {np.dtype(dt) for dt in dts}


def test_a_changed_tuning_record_drops_every_plan(device, queue, rng, monkeypatch, tmp_path):
    """The one invalidation rule: a plan reads the tuning database when it is built, and a record written
    to it empties capture.plans, so the next call builds its plan on the new record (another kernel, the same
    values)."""
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("NETCL_TUNING", raising=False)
    monkeypatch.setattr(capture, "plans", capture.PlanCache())
    variant = choose_variant(device, 131, 95, 77)
    other = ({"MB": 30, "NB": 32, "KC": 48, "RM": 3, "VN": 8} if variant == "cpu"
             else {"BM": 64, "BN": 32, "BK": 8, "TX": 8, "TY": 8, "VW": 2, "PADA": 2, "PADB": 2})
    a, b = rng.standard_normal((131, 77)).astype(np.float32), rng.standard_normal((77, 95)).astype(np.float32)
    want = a.astype(np.float64) @ b

    def run() -> capture.Recording:
        assert_close(ops.matmul(Tensor.from_host(queue, a), Tensor.from_host(queue, b)) + 0.0, want,
                     np.float32, atol=1e-4)
        (template, _, _), = gemm_api.templates().values()
        return template

    before = run()
    assert run() is before and len(capture.plans) == 2  # the GEMM's template and the elementwise add's plan
    database_for(device).put(f"gemm_{variant}", "float32", other)
    assert len(capture.plans) == 0
    after = run()
    assert after is not before
    assert after.ops[0][1].program is not before.ops[0][1].program  # built with the new record's tile
    assert run() is after
