"""netcl.graph: a captured training step replays bit-for-bit like the eager steps it stands for."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import nn, optim
from netcl.core.capture import capturing
from netcl.core.tensor import Tensor
from netcl.errors import GraphCaptureError
from netcl.graph import Graph
from netcl.ops import random
from netcl.profiling import count_launches
from netcl.train.loop import build_model


def _setup(queue, kind: str, batch: int):
    random.manual_seed(3)
    if kind == "dropout":
        model = nn.Sequential(nn.Flatten(), nn.Linear(queue, 784, 32), nn.ReLU(), nn.Dropout(0.5),
                              nn.Linear(queue, 32, 10))
    else:
        model = build_model(kind, queue, (1, 28, 28), 10)
    opt = optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    sched = optim.StepLR(opt, step_size=2, gamma=0.5)
    x = Tensor.empty(queue, (batch, 1, 28, 28))
    y = Tensor.empty(queue, (batch,), np.int32)
    return model, opt, sched, x, y


def _step(model, opt, x, y):
    with ag.Tape() as tape:
        loss = ag.cross_entropy(model(ag.tensor(x)), ag.tensor(y))
    tape.backward(loss)
    opt.step()
    opt.zero_grad()
    return loss.value


@pytest.mark.parametrize("kind", ["cnn", "mlp", "dropout"])
def test_replayed_steps_equal_eager_steps_bitwise(queue, kind):
    """Step 1 captured, steps 2..5 replayed on new data (copied into the captured inputs), with the
    scheduler halving the lr every 2 steps and (dropout) fresh masks each step: the parameters, the
    optimizer's step counts and the losses are bitwise those of five eager steps."""
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((16, 1, 28, 28)).astype(np.float32),
                rng.integers(0, 10, 16).astype(np.int32)) for _ in range(5)]

    def run(use_graph: bool):
        model, opt, sched, x, y = _setup(queue, kind, 16)
        graph, losses = Graph(), []
        for i, (xb, yb) in enumerate(batches):
            x.copy_from_host(xb)
            y.copy_from_host(yb)
            if not use_graph:
                loss = _step(model, opt, x, y)
            elif i == 0:
                with graph.capture():
                    loss = _step(model, opt, x, y)
            else:
                graph.replay()
            losses.append(loss.to_host().copy())
            sched.step()
        steps = sorted(st["step"] for st in opt.state.values())
        return [p.value.to_host() for p in model.parameters()], losses, steps, graph

    p_eager, l_eager, s_eager, _ = run(False)
    p_graph, l_graph, s_graph, graph = run(True)
    assert graph.launches > 0 and s_graph == s_eager == [5] * len(s_eager)
    for a, b in zip(l_eager, l_graph):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(p_eager, p_graph):
        np.testing.assert_array_equal(a, b)


def test_replay_counts_launches_and_reserves_buffers(queue):
    a = Tensor.from_host(queue, np.arange(1000, dtype=np.float32))
    graph = Graph()
    with graph.capture():
        tmp = (a * 2.0).realize()
        out = (tmp + 1.0).realize()
        del tmp  # freed inside the capture: the replay still writes it, so it is never handed out again
    assert capturing() is None
    with count_launches() as c:
        graph.replay()
    assert c.count == graph.launches == 2
    held = {id(b) for b in graph._buffers.values()}
    fresh = [Tensor.empty(queue, (1000,)) for _ in range(8)]
    assert not held & {id(t.buffer) for t in fresh}
    a.copy_from_host(np.ones(1000, dtype=np.float32))
    graph.replay()
    np.testing.assert_array_equal(out.to_host(), np.full(1000, 3.0, dtype=np.float32))
    graph.close()
    with pytest.raises(GraphCaptureError, match="closed"):
        graph.replay()


def test_capture_errors_are_clear_and_leave_nothing_behind(queue):
    a = Tensor.from_host(queue, np.ones(10, dtype=np.float32))
    graph = Graph()
    with pytest.raises(GraphCaptureError, match="host transfer"), graph.capture():
        (a + 1.0).realize().to_host()
    assert capturing() is None and not graph._buffers
    with pytest.raises(GraphCaptureError, match="failed"):
        graph.replay()
    with pytest.raises(GraphCaptureError, match="needs a captured graph"):
        Graph().replay()
    with pytest.raises(GraphCaptureError, match="nothing was enqueued"), Graph().capture():
        pass
    outer = Graph()
    with outer.capture():
        (a + 1.0).realize()
        with pytest.raises(GraphCaptureError, match="nested"), Graph().capture():
            pass
    with pytest.raises(GraphCaptureError, match="already captured"), outer.capture():
        pass


# -- netcl.graph.compile: one decorator on a user's step ---------------------------------------------------
def _compiled_run(queue, kind: str, batches, compiled: bool):
    """Steps of a user's own loop over `batches` (shapes may change between them), eager or through
    netcl.graph.compile; returns parameters, losses and the compiled function."""
    from netcl.graph import compile as ncompile

    model, opt, sched, _, _ = _setup(queue, kind, 1)

    def step(x, y):
        return _step(model, opt, x, y)

    fn = ncompile(step) if compiled else step
    losses = []
    for xb, yb in batches:
        loss = fn(Tensor.from_host(queue, xb), Tensor.from_host(queue, yb))
        losses.append(loss.to_host().copy())
        sched.step()
    return [p.value.to_host() for p in model.parameters()], losses, fn


@pytest.mark.parametrize("kind", ["mlp", "dropout"])
def test_compiled_step_equals_eager_bitwise_across_a_shape_change(queue, kind):
    """A user's step with @netcl.graph.compile: eager on its first call, recorded on its second, replayed
    after; a new batch size records again. Over 7 steps (batch 16 x4, then 8 x3), with a scheduler and
    (dropout) fresh masks, the losses and parameters are bitwise those of the eager loop."""
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((b, 1, 28, 28)).astype(np.float32),
                rng.integers(0, 10, b).astype(np.int32)) for b in (16, 16, 16, 16, 8, 8, 8)]
    p_eager, l_eager, _ = _compiled_run(queue, kind, batches, False)
    p_comp, l_comp, fn = _compiled_run(queue, kind, batches, True)
    for a, b in zip(l_eager, l_comp):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(p_eager, p_comp):
        np.testing.assert_array_equal(a, b)
    ready = [e for e in fn._entries.values() if e.state == "ready"]
    assert len(ready) == 2 and all(e.graph.launches > 0 for e in ready)  # both batch sizes recorded
    assert repr(fn).startswith("compile(step: 2 recorded")


def test_compiled_step_replays_without_the_python(queue):
    """Calls after the recording run none of the function's Python: one replay of its launches."""
    from netcl.graph import compile as ncompile

    calls = []

    @ncompile
    def double_plus_one(x):
        calls.append(1)
        return ((x * 2.0) + 1.0).realize()

    for i in range(5):
        out = double_plus_one(Tensor.from_host(queue, np.full(64, float(i), np.float32)))
        np.testing.assert_array_equal(out.to_host(), np.full(64, 2.0 * i + 1.0, np.float32))
    assert len(calls) == 2  # eager, then recorded; three replays
    with count_launches() as c:
        double_plus_one(Tensor.from_host(queue, np.zeros(64, np.float32)))
    assert c.count == 1  # its one kernel (the input reaches the recording's own by a buffer copy)


def test_compiled_step_with_a_host_read_runs_eagerly_and_says_why(queue):
    from netcl.graph import compile as ncompile

    @ncompile
    def reads(x):
        return float((x + 1.0).realize().to_host().sum())

    with pytest.warns(RuntimeWarning, match="cannot be recorded: it does a read of device data on the host"):
        first = reads(Tensor.from_host(queue, np.ones(4, np.float32)))
    values = [reads(Tensor.from_host(queue, np.full(4, float(i), np.float32))) for i in range(3)]
    assert first == 8.0 and values == [4.0, 8.0, 12.0]  # eager every time, correct every time
    assert "1 eager" in repr(reads)


def test_a_scheduler_stepped_inside_a_recorded_step_is_not_frozen(queue):
    """A scheduler stepped inside the step (PyTorch's habit: scheduler.step() in train_step) runs on the host,
    which a replay skips: the schedule stopped after the recording's call, silently. A graph capture refuses
    it; a compiled step says so and stays eager, so the schedule moves on every call."""
    from netcl.graph import compile as ncompile

    random.manual_seed(0)
    model = nn.Linear(queue, 4, 3)
    opt = optim.SGD(model.parameters(), lr=0.1)
    sched = optim.StepLR(opt, step_size=1, gamma=0.5)
    x = Tensor.from_host(queue, np.ones((2, 4), np.float32))
    y = Tensor.from_host(queue, np.zeros(2, np.int32))

    @ncompile
    def step(x, y):
        loss = _step(model, opt, x, y)
        sched.step()
        return loss

    with pytest.warns(RuntimeWarning, match=r"recorded: it calls StepLR.step\(\).*after the compiled step"):
        step(x, y)
    for _ in range(3):
        step(x, y)
    assert sched.get_last_lr() == [0.1 * 0.5**4] and "1 eager" in repr(step)
    plateau = optim.ReduceLROnPlateau(opt)
    for stepped in (lambda: sched.step(), lambda: plateau.step(1.0)):
        with pytest.raises(GraphCaptureError, match=r"\.step\(\) inside a graph capture.*after each replay"):
            with Graph().capture():
                _step(model, opt, x, y)
                stepped()
    assert sched.last_epoch == 4 and plateau.last_epoch == 0  # refused before anything changed


def test_compiled_step_bad_arguments(queue):
    from netcl.graph import compile as ncompile

    with pytest.raises(TypeError, match="takes a function"):
        ncompile(3)
    with pytest.raises(ValueError, match="max_recordings must be a positive int"):
        ncompile(max_recordings=0)(lambda x: x)
    fn = ncompile(lambda x, k=1: (x * float(k)).realize())
    with pytest.raises(TypeError, match="is a NumPy array; a compiled step takes its data as Tensors"):
        fn(np.ones(3, np.float32))
    with pytest.raises(TypeError, match="neither a Tensor nor hashable"):
        fn(Tensor.from_host(queue, np.ones(3, np.float32)), k=[1])
    a = Tensor.from_host(queue, np.ones(3, np.float32))
    outs = [fn(a, k=k).to_host() for k in (2, 2, 2, 3, 3, 3)]  # k is a constant: k=3 records again
    assert [o[0] for o in outs] == [2.0, 2.0, 2.0, 3.0, 3.0, 3.0]


def test_replayed_launches_of_one_kernel_keep_their_own_arguments(queue, rng):
    """Each replayed launch enqueues a kernel object of its own (its arguments set once, at the first
    replay): launches of one kernel on different tensors, and eager launches of it between replays, do not
    disturb one another."""
    from netcl import ops

    a, b, c = (Tensor.from_host(queue, rng.standard_normal(37).astype(np.float32)) for _ in range(3))
    graph = Graph()
    with graph.capture():
        s1 = ops.add(a, b).realize()
        s2 = ops.add(s1, c).realize()
    for _ in range(2):
        na, nb, nc = (rng.standard_normal(37).astype(np.float32) for _ in range(3))
        a.copy_from_host(na)
        b.copy_from_host(nb)
        c.copy_from_host(nc)
        ops.add(c, c).realize()  # the shared kernel, eager, between replays
        graph.replay()
        np.testing.assert_allclose(s1.to_host(), na + nb, rtol=1e-6)
        np.testing.assert_allclose(s2.to_host(), na + nb + nc, rtol=1e-6)
    raws = [plan.raw for plan in graph._fixed.values()]
    assert len(raws) == graph.launches and len({id(r) for r in raws}) == len(raws)
