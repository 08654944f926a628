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
