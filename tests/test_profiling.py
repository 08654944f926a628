"""netcl.profiling: event timings (non-negative, inside the wall time of a synchronous run), op and module
labels, declared work, graph replays and transfers, the Chrome trace (schema, tracks, nesting), whole-program
NETCL_PROFILE and `netcl profile`; netcl.memory_summary against BufferPool stats and in OOM errors."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import netcl
import netcl.autograd as ag
from netcl import cli, ops, optim, profiling
from netcl.core.memory import BufferPool
from netcl.core.tensor import Tensor
from netcl.errors import OutOfMemoryError
from netcl.graph import Graph
from netcl.nn import Linear, ReLU, Sequential

ROOT = Path(__file__).resolve().parents[1]


def _mlp(queue):
    return Sequential(Linear(queue, 12, 17), ReLU(), Linear(queue, 17, 5))


def _step(model, opt, x, y):
    with ag.Tape() as tape:
        loss = ag.cross_entropy(model(ag.tensor(x)), ag.tensor(y))
    tape.backward(loss)
    opt.step()
    opt.zero_grad()
    return loss


@pytest.fixture
def batch(queue, rng):
    x = Tensor.from_host(queue, rng.standard_normal((9, 12)).astype(np.float32))
    y = Tensor.from_host(queue, rng.integers(0, 5, 9).astype(np.int32))
    return x, y


def test_launch_timings_lie_inside_a_synchronous_run(queue, batch):
    model = _mlp(queue)
    opt = optim.AdamW(model.parameters(), lr=1e-2)
    _step(model, opt, *batch)
    queue.finish()
    assert (
        queue.timed == queue.profiling
    )  # the default queue is made without event timing (NETCL_PROFILE unset) ...
    t0 = time.perf_counter_ns()
    with profiling.profile() as prof:
        for _ in range(2):
            _step(model, opt, *batch)
            queue.finish()  # synchronous: every event completes inside the block
            assert queue.timed  # ... and switched to it for the profile (at its first launch)
    t1 = time.perf_counter_ns()
    assert queue.timed == queue.profiling  # given back its own setting
    spans = [s for s in prof.device_spans() if s["kind"] == "kernel"]
    assert len(spans) >= 2 * 10
    for s in spans:
        assert s["end"] >= s["start"]  # non-negative durations
        assert s["t1"] >= s["t0"]
        # device times mapped to the host clock: after the block started and before it ended
        assert t0 - 50_000 <= s["start"] and s["end"] <= t1 + 50_000, s
        assert s["start"] >= s["t0"] - 50_000  # nothing runs before it is enqueued
    device = sum(s["end"] - s["start"] for s in spans)
    assert 0 < device <= t1 - t0
    assert prof.device_seconds * 1e9 <= t1 - t0
    rows = prof.rows("kernel")
    assert sum(r.calls for r in rows) == len(prof.device_spans())
    assert abs(sum(r.share for r in rows) - 1.0) < 1e-9
    assert all(r.total >= 0 and r.mean >= 0 for r in rows)


def test_gaps_add_up_the_idle_device_time():
    """Profile.gaps over made-up spans (ns): overlapping events count once in busy, the idle time between
    them goes to its (before, after) pair, and the part of it before the next command was enqueued is the
    host's lateness; queues apart."""
    prof = profiling.Profile()

    def span(name, t1, start, end, queue="q0"):
        return {"name": name, "queue": queue, "t0": t1 - 5, "t1": t1, "start": start, "end": end}

    spans = [span("a", 0, 100, 200), span("b", 150, 180, 260),     # overlaps a: no gap
             span("c", 300, 310, 400),                               # 50 idle, host late 40 (enqueued at 300)
             span("a", 350, 420, 500),                               # 20 idle, enqueued before: late 0
             span("c", 600, 650, 700),                               # 150 idle, late 100
             span("z", 0, 1000, 1100, queue="q1"), span("x", 0, 5, None)]   # another queue; no device time
    prof.device_spans = lambda: spans
    totals, rows = prof.gaps()
    assert totals["span"] == pytest.approx((700 - 100 + 100) * 1e-9)
    assert totals["busy"] == pytest.approx((160 + 90 + 80 + 50 + 100) * 1e-9)
    assert totals["idle"] == pytest.approx((50 + 20 + 150) * 1e-9)
    assert totals["host_late"] == pytest.approx((40 + 100) * 1e-9)
    pairs = [(r["before"], r["after"], r["calls"]) for r in rows]
    assert pairs == [("a", "c", 1), ("b", "c", 1), ("c", "a", 1)]
    assert rows[0]["idle"] == pytest.approx(150e-9) and rows[0]["host_late"] == pytest.approx(100e-9)
    assert rows[1]["idle"] == pytest.approx(50e-9) and rows[1]["host_late"] == pytest.approx(40e-9)
    assert profiling.Profile().gaps() == ({"span": 0.0, "busy": 0.0, "idle": 0.0, "host_late": 0.0}, [])
    # the first two commands of each queue left out (q1 has one: none left): q0 from c at 310 on
    totals, rows = prof.gaps(skip=2)
    assert totals["span"] == pytest.approx((700 - 310) * 1e-9)
    assert totals["busy"] == pytest.approx((90 + 80 + 50) * 1e-9)
    assert totals["idle"] == pytest.approx((20 + 150) * 1e-9)
    assert totals["host_late"] == pytest.approx(100e-9)
    assert [(r["before"], r["after"]) for r in rows] == [("a", "c"), ("c", "a")]
    assert prof.gaps(skip=10) == ({"span": 0.0, "busy": 0.0, "idle": 0.0, "host_late": 0.0}, [])
    with pytest.raises(ValueError, match="skip"):
        prof.gaps(skip=-1)


def test_gaps_find_the_host_sleeping_between_launches(queue, rng):
    """A launch and its read, 30 ms of host sleep, another: the device's idle time between them is the
    host's, and the pair (the read, the next launch) holds it."""
    x = Tensor.from_host(queue, rng.standard_normal(1000).astype(np.float32))
    (x + 1.0).to_host()
    with profiling.profile() as prof:
        (x * 2.0).to_host()
        time.sleep(0.03)
        (x + 1.0).to_host()
    totals, rows = prof.gaps()
    assert totals["idle"] >= 0.025 and totals["host_late"] >= 0.025
    assert totals["busy"] <= totals["span"] and rows[0]["idle"] >= 0.025 and rows[0]["calls"] == 1
    assert rows[0]["host_late"] >= 0.025 and "D2H" in rows[0]["before"]


def test_ops_and_module_scopes_label_launches(queue, batch):
    model = _mlp(queue)
    opt = optim.AdamW(model.parameters(), lr=1e-2)
    with profiling.profile() as prof:
        _step(model, opt, *batch)
        queue.finish()
    ops_seen = {r.name for r in prof.rows("op")}
    assert {"linear", "linear.backward", "cross_entropy"} <= ops_seen, ops_seen
    assert any(name.endswith(".step") for name in ops_seen), ops_seen  # the optimizer's update
    scopes = {r.name for r in prof.rows("scope")}
    assert {"0 (Linear)", "2 (Linear)", "(no scope)"} <= scopes, scopes
    forward = [s for s in prof.device_spans() if s["op"] == "linear"]
    assert {s["scope"] for s in forward} == {"0 (Linear)", "2 (Linear)"}
    host = {(name, cat) for name, cat, *_ in prof.host_spans()}
    assert {("Sequential", "module"), ("0 (Linear)", "module"), ("2 (Linear)", "module")} <= host
    # a user scope labels what is inside it
    with profiling.profile() as prof2, profiling.scope("my block"):
        ops.sum(batch[0]).to_host()
    assert {s["scope"] for s in prof2.device_spans()} == {"my block"}
    with (
        profiling.profile() as prof3,
        profiling.scope("step"),
    ):  # modules inside a user scope keep their names
        model(ag.tensor(batch[0])).value.to_host()
    assert {"step", "Sequential", "0 (Linear)", "2 (Linear)"} <= {name for name, *_ in prof3.host_spans()}


def test_module_call_outside_a_profile_pushes_nothing(queue, batch):
    model = _mlp(queue)
    out = model(ag.tensor(batch[0]))
    assert out.shape == (9, 5)
    assert profiling.current_scope() == "" and not profiling.active


def test_declared_work_gives_rates(queue, rng):
    a = Tensor.from_host(queue, rng.standard_normal((37, 53)).astype(np.float32))
    b = Tensor.from_host(queue, rng.standard_normal((53, 29)).astype(np.float32))
    c = Tensor.from_host(queue, rng.standard_normal((37, 29)).astype(np.float32))
    with profiling.profile() as prof:
        out = ops.matmul(a, b)
        s = ops.sum(ops.exp(c) * 2.0)
        queue.finish()
    np.testing.assert_allclose(out.to_host(), a.to_host() @ b.to_host(), rtol=1e-4, atol=1e-4)
    assert np.isfinite(s.to_host()).all()
    spans = prof.device_spans()
    gemm = [x for x in spans if x["op"] == "matmul" and x["flops"] is not None]
    assert len(gemm) == 1
    assert gemm[0]["flops"] == 2 * 37 * 53 * 29
    assert gemm[0]["bytes"] == (37 * 53 + 53 * 29 + 37 * 29) * 4
    red = [x for x in spans if x["op"] == "sum" and x["kind"] == "kernel"]
    assert red and red[0]["bytes"] >= 37 * 29 * 4  # the input read once (the exp and * fused into it)
    assert red[0]["flops"] >= 3 * 37 * 29  # exp, *, and the sum itself per element
    by_op = {r.name: r for r in prof.rows("op")}
    assert by_op["matmul"].gflops is not None and by_op["matmul"].gflops > 0
    assert by_op["matmul"].gbps is not None and by_op["matmul"].gbps > 0
    text = prof.report(file=open(os.devnull, "w"))
    assert "GFLOP/s" in text and "matmul" in text and "gemm_" in text


def test_convolutions_declare_their_work(queue, rng):
    x = Tensor.from_host(queue, rng.standard_normal((2, 3, 9, 7)).astype(np.float32))
    w = Tensor.from_host(queue, rng.standard_normal((5, 3, 3, 3)).astype(np.float32))
    with profiling.profile() as prof:
        direct = ops.conv2d(x, w, padding=1, algorithm="direct")
        cols = ops.conv2d(x, w, padding=1, algorithm="im2col")
        queue.finish()
    np.testing.assert_allclose(direct.to_host(), cols.to_host(), rtol=1e-4, atol=1e-4)
    spans = [s for s in prof.device_spans() if s["op"] == "conv2d"]
    flops = 2 * 2 * 5 * 9 * 7 * 3 * 3 * 3
    assert [s["flops"] for s in spans if s["name"] == "conv2d_direct"] == [flops]
    im2col = [s for s in spans if s["name"].startswith("im2col")]
    assert im2col and all(s["bytes"] >= x.nbytes for s in im2col)
    assert sum(s["flops"] or 0 for s in spans if s["name"].startswith("gemm")) == flops  # the GEMM's share


def test_transfers_are_timed_with_their_bytes(queue, rng):
    host = rng.standard_normal((31, 7)).astype(np.float32)
    with profiling.profile() as prof:
        t = Tensor.from_host(queue, host)
        back = t.to_host()
    np.testing.assert_array_equal(back, host)
    copies = {s["name"]: s for s in prof.device_spans() if s["kind"] == "copy"}
    assert copies["copy H2D"]["bytes"] == host.nbytes and copies["copy D2H"]["bytes"] == host.nbytes
    assert copies["copy D2H"]["op"] == "Tensor.to_host"
    assert all(s["end"] >= s["start"] for s in copies.values())


def test_graph_replays_are_profiled_with_their_captured_ops(queue, batch):
    model = _mlp(queue)
    opt = optim.SGD(model.parameters(), lr=0.1)
    x, y = batch
    graph = Graph()
    with graph.capture():  # captured outside any profile
        _step(model, opt, x, y)
    eager = model(ag.tensor(x)).value.to_host()
    with profiling.profile() as prof:
        graph.replay()
        graph.replay()
        queue.finish()
    kernels = [s for s in prof.device_spans() if s["kind"] == "kernel"]
    assert len(kernels) == 2 * graph.launches
    assert {"linear", "linear.backward"} <= {s["op"] for s in kernels}
    assert any(s["flops"] for s in kernels)  # the GEMMs' work, recorded at capture
    assert [name for name, cat, *_ in prof.host_spans() if cat == "graph"] == ["Graph.replay"] * 2
    assert not np.array_equal(model(ag.tensor(x)).value.to_host(), eager)  # the replays did train


# -- the Chrome trace -----------------------------------------------------------------------------------
_PHASES = {"X", "M"}


def check_trace_schema(trace: dict) -> None:
    """The trace-event format (Chrome's JSON Object Format) as Perfetto's JSON importer reads it: complete
    events ("X") with name, pid, tid, ts and dur in microseconds; metadata ("M") naming processes and
    threads; spans on one track either nested or disjoint."""
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    assert trace.get("displayTimeUnit") in ("ms", "ns")
    tracks: dict[tuple, list] = {}
    for ev in trace["traceEvents"]:
        assert ev["ph"] in _PHASES, ev
        assert isinstance(ev["name"], str) and ev["name"]
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
        if ev["ph"] == "M":
            assert ev["name"] in ("process_name", "thread_name", "process_sort_index")
            assert isinstance(ev["args"], dict) and ev["args"]
            continue
        assert isinstance(ev["ts"], (int, float)) and isinstance(ev["dur"], (int, float))
        assert ev["ts"] >= 0 and ev["dur"] >= 0, ev
        assert isinstance(ev.get("args", {}), dict)
        tracks.setdefault((ev["pid"], ev["tid"]), []).append((ev["ts"], ev["ts"] + ev["dur"], ev["name"]))
    eps = 1e-3  # microseconds: the JSON rounds to ns
    for track, spans in tracks.items():
        open_ends: list[float] = []
        for start, end, name in sorted(spans, key=lambda s: (s[0], -s[1])):
            while open_ends and open_ends[-1] <= start + eps:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1] + eps, f"{name} overlaps its parent on {track}"
            open_ends.append(end)


def _names(trace: dict) -> dict[int, str]:
    return {ev["pid"]: ev["args"]["name"] for ev in trace["traceEvents"]
            if ev["ph"] == "M" and ev["name"] == "process_name"}


def test_chrome_trace_has_host_and_device_tracks(queue, batch, tmp_path):
    model = _mlp(queue)
    opt = optim.AdamW(model.parameters(), lr=1e-2)
    with profiling.profile() as prof:
        _step(model, opt, *batch).value.to_host()
    path = prof.export_chrome_trace(tmp_path / "step.json")
    trace = json.loads(path.read_text())
    check_trace_schema(trace)
    processes = _names(trace)
    assert processes[1] == "netcl host"
    device_pids = [pid for pid, name in processes.items() if name.startswith("device: ")]
    assert device_pids == [2] and queue.device.device_name in processes[2]
    threads = {(ev["pid"], ev["tid"]): ev["args"]["name"] for ev in trace["traceEvents"]
               if ev["ph"] == "M" and ev["name"] == "thread_name"}
    assert threads[(2, 1)] == "queue 0" and threads[(1, 1)].startswith("python ")
    slices = [ev for ev in trace["traceEvents"] if ev["ph"] == "X"]
    device_names = {ev["name"] for ev in slices if ev["pid"] == 2}
    host_names = {ev["name"] for ev in slices if ev["pid"] == 1}
    assert any(n.startswith("gemm_") for n in device_names) and "copy D2H" in device_names
    assert {"Sequential", "0 (Linear)", "2 (Linear)"} <= host_names
    assert device_names <= host_names  # every device span has its enqueue on the host track
    dev = [ev for ev in slices if ev["pid"] == 2]
    assert all(ev["args"]["op"] for ev in dev)


def test_trace_schema_check_catches_partial_overlap():
    bad = {"traceEvents": [{"name": "a", "ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
                           {"name": "b", "ph": "X", "pid": 1, "tid": 1, "ts": 5, "dur": 10}],
           "displayTimeUnit": "ms"}
    with pytest.raises(AssertionError, match="overlaps"):
        check_trace_schema(bad)


def test_the_wall_time_spans_the_blocks_device_work(queue):
    """A block that only enqueues ends before its device work: the footer said "device time 2.6 ms in 2.5 ms
    of wall time"."""
    a = Tensor.randn(queue, (256, 256), seed=0)
    (a @ a).realize()
    queue.finish()
    with profiling.profile() as prof:
        for _ in range(8):
            (a @ a).realize()  # enqueued; nothing reads it back
    wall = (prof.t_end - prof.t_start) * 1e-9
    assert 0 < prof.device_seconds <= wall * 1.01 + 1e-4
    assert f"in {wall * 1e3:.1f} ms of wall time" in prof.report(file=io.StringIO())


def test_rows_by_unknown_group_is_an_error():
    with pytest.raises(ValueError, match="choose one of"):
        profiling.profile().rows("device")
    for top in ("3", -1, 2.5):  # a str raised TypeError from the slice; -1 hid the last row
        with pytest.raises(ValueError, match=r"top is how many rows to show, an int >= 0"):
            profiling.profile().report(top=top)


SCRIPT = """
import sys
import numpy as np
from netcl.core.device import manager
from netcl.core.tensor import Tensor
from netcl import ops
q = manager.default("auto").queue
x = Tensor.from_host(q, np.arange(40, dtype=np.float32).reshape(5, 8))
print("total", float(ops.sum(x * 2.0).to_host()), "args", sys.argv[1:])
"""


def test_netcl_profile_runs_a_script_and_writes_its_trace(tmp_path, capsys):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    trace = tmp_path / "out" / "job.json"
    assert cli.main(["profile", "--trace", str(trace), str(script), "--lr", "3"]) == 0
    captured = capsys.readouterr()
    assert "total 1560.0 args ['--lr', '3']" in captured.out
    assert "kernel" in captured.err and "copy D2H" in captured.err and str(trace) in captured.err
    data = json.loads(trace.read_text())
    check_trace_schema(data)
    assert any(ev["ph"] == "X" and ev["pid"] >= 2 for ev in data["traceEvents"])
    failing = tmp_path / "fail.py"
    failing.write_text("raise SystemExit(3)\n")
    assert cli.main(["profile", "--trace", str(tmp_path / "f.json"), str(failing)]) == 3
    assert cli.main(["profile", str(tmp_path / "missing.py")]) == 1
    assert "no script" in capsys.readouterr().err


def test_whole_program_profile_from_the_environment(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    trace = tmp_path / "whole.json"
    env = dict(os.environ, NETCL_PROFILE=str(trace),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "total 1560.0" in proc.stdout
    assert "device time" in proc.stderr and "wrote the trace" in proc.stderr
    check_trace_schema(json.loads(trace.read_text()))


# -- memory -----------------------------------------------------------------------------------------------
def test_memory_summary_matches_pool_stats(device, queue):
    pool = device.pool
    keep = [Tensor.empty(queue, (n,)) for n in (3, 700, 5000, 70_001)]
    with profiling.profile():
        made = ops.matmul(keep[1].reshape(28, 25), keep[1].reshape(25, 28))
        dropped = Tensor.empty(queue, (1000,))
    del dropped
    stats = pool.stats()
    ranges = pool.size_ranges()
    assert sum(r["in_use"] for r in ranges) == stats["in_use"]
    assert sum(r["cached"] for r in ranges) == stats["cached"]
    assert max(r["peak"] for r in ranges) <= stats["peak"]
    assert sum(r["blocks"] for r in ranges) >= len(keep) + 1
    for r in ranges:
        assert r["low"] * 2 == r["high"] and r["in_use"] <= r["peak"]
        assert r["low"] * r["blocks"] <= r["in_use"] < r["high"] * max(r["blocks"], 1) or not r["blocks"]
    sites = {s["site"]: s for s in pool.sites()}
    assert sites["matmul"]["in_use"] >= made.nbytes and sites["matmul"]["allocations"] >= 1
    assert sites["Tensor.empty"]["peak"] >= 4000 and sites["Tensor.empty"]["in_use"] == 0  # freed
    text = netcl.memory_summary()
    assert f"{stats['requests']} requests" in text
    assert "block size" in text and "allocated by (scope / op)" in text and "matmul" in text
    assert netcl.memory_summary(queue) == pool.summary() == netcl.memory_summary(made)
    del made, keep


def test_out_of_memory_error_carries_the_summary(device, queue):
    class Refusing(BufferPool):
        def _create_buffer(self, nbytes):
            raise MemoryError("no")

    pool = Refusing(device)
    pool._create_buffer = BufferPool._create_buffer.__get__(pool)  # the first block is granted
    with profiling.profile():
        held = pool.allocate(3000, queue)
    del pool._create_buffer
    with pytest.raises(OutOfMemoryError) as info:
        pool.allocate(1 << 20, queue)
    text = str(info.value)
    assert "the device refused it" in text and "block size" in text
    assert "2.0 KiB - 4.0 KiB" in text and "test_out_of_memory_error_carries_the_summary" not in text
    assert "Tensor" not in text and "(direct)" in text  # the site of the block this test allocated
    del held
    too_big = device.capabilities.max_alloc + 1
    with pytest.raises(OutOfMemoryError) as info:  # one request beyond the device's limit: no table
        pool.allocate(too_big, queue)
    assert "block size" not in str(info.value)
