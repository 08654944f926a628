"""The autograd engine's hooks that DistributedDataParallel stands on: a leaf's post-accumulate hook runs once
per
backward, right when its gradient is final (every path summed), before backward ends; callbacks queued during
a
pass run after every gradient is stored."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import nn
from netcl.core.tensor import Tensor
from netcl.errors import NetclError


def test_post_accumulate_hooks_see_final_gradients_before_backward_ends(queue, rng):
    xv = rng.standard_normal((3, 4)).astype(np.float32)
    wv = rng.standard_normal((4, 2)).astype(np.float32)
    w = ag.Parameter(Tensor.from_host(queue, wv))
    b = ag.Parameter(Tensor.from_host(queue, np.zeros(2, np.float32)))
    events = []

    def hook(node):
        events.append(("hook", id(node), node.grad.to_host().copy()))
        if len(events) == 1:
            ag.queue_callback(lambda: events.append(("end", [p.grad is not None for p in (w, b)])))

    handles = [w.register_post_accumulate_grad_hook(hook), b.register_post_accumulate_grad_hook(hook)]
    with ag.Tape() as tape:
        x = ag.tensor(Tensor.from_host(queue, xv))
        y = ag.matmul(x, w) + b
        loss = ag.sum(y * y) + ag.sum(ag.matmul(x, w))  # w is reached along two paths: one hook call, summed
    tape.backward(loss)
    hooks = [e for e in events if e[0] == "hook"]
    assert sorted(e[1] for e in hooks) == sorted([id(w), id(b)])
    y_host = xv @ wv
    want_w = xv.T @ (2 * y_host) + xv.T @ np.ones((3, 2), np.float32)
    got_w = next(e[2] for e in hooks if e[1] == id(w))
    np.testing.assert_allclose(got_w, want_w, rtol=1e-5, atol=1e-5)
    assert events[-1] == ("end", [True, True])  # the callback ran last, after every gradient was stored
    for h in handles:
        h.remove()
    events.clear()
    with ag.Tape() as tape:
        loss = ag.sum(ag.matmul(ag.tensor(Tensor.from_host(queue, xv)), w))
    tape.backward(loss)
    assert events == []


def test_hooks_on_non_leaves_and_callbacks_outside_backward_are_refused(queue):
    w = ag.Parameter(Tensor.from_host(queue, np.ones(3, np.float32)))
    with ag.Tape():
        y = w * 2.0
    with pytest.raises(NetclError, match="leaves"):
        y.register_post_accumulate_grad_hook(lambda n: None)
    with pytest.raises(TypeError, match="callable"):
        w.register_post_accumulate_grad_hook(3)
    with pytest.raises(NetclError, match="no backward pass is running"):
        ag.queue_callback(lambda: None)


def test_hooks_run_in_backward_order_right_after_the_last_rule_that_feeds_each_leaf(queue, rng):
    """Layer by layer from the output: a weight's hook runs before any rule of the layers below it (DDP
    starts a bucket's all-reduce from it; hooks all at the end of the pass would leave nothing to overlap)."""
    layers = [nn.Linear(queue, 5, 5) for _ in range(3)]
    events: list[str] = []
    for i, layer in enumerate(layers):
        layer.weight.register_post_accumulate_grad_hook(lambda p, i=i: events.append(f"hook {i}"))
    x = ag.tensor(Tensor.from_host(queue, rng.standard_normal((4, 5)).astype(np.float32)), requires_grad=True)
    with ag.Tape() as tape:
        h = x
        for layer in layers:
            h = layer(h)
        loss = ag.sum(h * h)
    tape.backward(loss)
    assert events == ["hook 2", "hook 1", "hook 0"]
