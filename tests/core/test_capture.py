"""netcl.core.capture: recordings of launches, named slots, replay with other tensors bound."""

from __future__ import annotations

import numpy as np
import pytest

from netcl import kernels
from netcl.core import capture
from netcl.core.tensor import Tensor
from netcl.errors import GraphCaptureError
from netcl.graph import Graph
from netcl.profiling import count_launches

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
