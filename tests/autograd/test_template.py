"""Ops declared with `replay` (netcl.core.template): a call of a signature seen before replays the launches
its first call recorded, bit for bit what running the op again gives; calls a template cannot cover run as
they are."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import ops
from netcl.core import capture, template
from netcl.core.backend import CHECK_WORDS, enqueue_copy
from netcl.core.tensor import Tensor
from netcl.ops import declaration
from netcl.ops.conv import choice
from netcl.ops.declaration import OpDecl


def templates(op: str) -> list:
    """The templates (or refusals) kept for op's calls."""
    return [v for k, v in capture.plans.items() if k[0] == f"{op} (replayed)"]


def conv_steps(queue, batches, steps=3):
    """Plain SGD on a two-convolution network with a batch norm (running statistics updated in place) and a
    max pool, eagerly: every step's loss, gradients, weights and running statistics, as bytes."""
    rng = np.random.default_rng(5)
    mean, var = Tensor.zeros(queue, (6,), np.float32), Tensor.ones(queue, (6,), np.float32)
    w1 = ag.tensor(Tensor.from_host(queue, rng.standard_normal((6, 3, 3, 3)).astype(np.float32) * 0.3),
                   requires_grad=True)
    b1 = ag.tensor(Tensor.from_host(queue, rng.standard_normal(6).astype(np.float32)), requires_grad=True)
    w2 = ag.tensor(Tensor.from_host(queue, rng.standard_normal((4, 6, 3, 3)).astype(np.float32) * 0.3),
                   requires_grad=True)
    seen = []
    for batch in batches:
        for _ in range(steps):
            x = ag.tensor(Tensor.from_host(queue, rng.standard_normal((batch, 3, 9, 8)).astype(np.float32)))
            with ag.Tape() as tape:
                h = ag.conv2d(x, w1, b1, padding=1, activation="relu")
                h = ag.max_pool2d(ag.batch_norm(h, None, None, mean, var, True, activation="relu"), 2)
                y = ag.conv2d(h, w2, None, padding=1, stride=2)
                loss = ag.sum(ag.mul(y, y))
            tape.backward(loss)
            seen += [loss.value.to_host().tobytes(), mean.to_host().tobytes(), var.to_host().tobytes()]
            for p in (w1, b1, w2):
                seen.append(p.grad.to_host().tobytes())
                p.value = ops.sub(p.value, ops.mul(p.grad, 1e-3)).realize()
                p.grad = None
    return seen


def test_conv_steps_replay_their_templates_bit_for_bit(queue, monkeypatch):
    """Training steps of conv2d (forward with bias and fused relu, strided without; backward with the relu's
    mask), batch_norm and max_pool2d: every result the same bytes as with the ops run each time, over steps
    and a new batch size (new signatures); the first call of a signature records, the later ones replay (no
    op Python)."""
    monkeypatch.setattr(template, "ENABLED", False)
    want = conv_steps(queue, (2, 3))
    assert not templates("conv2d")
    monkeypatch.setattr(template, "ENABLED", True)
    replays = []
    real = template.Template.replay
    monkeypatch.setattr(template.Template, "replay", lambda self, t: replays.append(self) or real(self, t))
    got = conv_steps(queue, (2, 3))
    assert got == want
    made = [t for op in ("conv2d", "batch_norm", "max_pool2d")
            for t in templates(op) + templates(op + ".backward")]
    assert len(made) == 16 and all(isinstance(t, template.Template) for t in made)   # 4 calls x 2 batches x 2
    assert len(replays) == 32   # (3 - 1) steps x 4 calls x 2 batches, forward and backward


def test_a_switch_set_anew_is_a_new_signature(queue, monkeypatch):
    """A module switch of the op's package (here conv.choice's) is part of the signature: set anew, the call
    records again and gives what the op gives under the new setting. Every package's switches hash."""
    import netcl.ops.gemm  # noqa: F401  (its switches hold a tuple of dicts)
    for package in ("netcl.ops.conv", "netcl.ops.gemm", "netcl.ops.norm", "netcl.ops.pool"):
        hash(template.switch_values(package))   # (a value that does not hash counts by identity)
    conv_steps(queue, (2,), steps=1)
    before = len(templates("conv2d"))
    monkeypatch.setattr(choice, "WINOGRAD_MIN_FLOPS_CPU", 1)
    monkeypatch.setattr(choice, "WINOGRAD_MIN_CHANNELS_CPU", 1)
    got = conv_steps(queue, (2,), steps=2)
    assert len(templates("conv2d")) == 2 * before
    monkeypatch.setattr(template, "ENABLED", False)
    assert conv_steps(queue, (2,), steps=2) == got


def test_switch_values_read_each_module_switch(monkeypatch):
    """switch_values: per module of the package (by name), its UPPERCASE globals in name order; a value that
    did not hash when first read by its identity, so a new dict is a new value and one changed in place is
    not."""
    import sys
    import types
    a, b = types.ModuleType("switchpkg.a"), types.ModuleType("switchpkg.b")
    a.ZETA, a.ALPHA, a._HIDDEN, a.lower = 2, "x", 1, 3
    b.TABLE = {"k": 1}
    for m in (a, b):
        monkeypatch.setitem(sys.modules, m.__name__, m)
    monkeypatch.delitem(template._switches, "switchpkg", raising=False)
    first = template.switch_values("switchpkg")
    assert first == (("x", 2), (id(b.TABLE),))
    b.TABLE["k"] = 2
    a.ZETA = 3
    assert template.switch_values("switchpkg") == (("x", 3), (id(b.TABLE),))
    old, b.TABLE = b.TABLE, {"k": 2}   # (the old one kept alive: its id is not reused)
    assert template.switch_values("switchpkg")[1] == (id(b.TABLE),) != (id(old),)
    hash(template.switch_values("switchpkg"))


KEPT: dict[str, Tensor] = {}


def _toy(x: Tensor, w: Tensor, mode: str = "mul") -> Tensor:
    if mode == "kept":   # reads a tensor the op keeps between calls: not the call's
        out = ops.mul(x, KEPT["c"])
    elif mode == "host":   # a host transfer inside
        out = ops.mul(x, float(w.to_host().ravel()[0]))
    elif mode == "pending":   # a result not computed yet
        return ops.mul(x, w)
    elif mode == "input":   # an input given back
        return x
    elif mode == "queue":   # a buffer the queue keeps (its check record), read through a copy
        record = Tensor.empty(x.queue, (CHECK_WORDS,), np.int32)
        enqueue_copy(x.queue, record.buffer, x.queue.check_buffer(), byte_count=4 * CHECK_WORDS)
        out = ops.mul(x, w)
    else:
        out = ops.mul(x, w)
    return out.realize()


def _toy_backward(grad_out: Tensor, x: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    return ops.mul(grad_out, w).realize(), ops.mul(grad_out, x).realize()


@pytest.fixture
def toy():
    declaration.declare(OpDecl("toy_replayed", _toy, _toy_backward, inputs=("x", "w"),
                               replay="netcl.ops.conv"))
    try:
        yield ag.toy_replayed
    finally:
        declaration.withdraw("toy_replayed")


def test_calls_a_template_cannot_cover_run_as_they_are(queue, toy):
    """A launch on a buffer the call neither got nor made, a host transfer, or a pending result: the
    signature keeps a refusal and every call runs the op (right results each time); a pending argument is
    computed first; an argument given back is returned itself; a buffer its queue keeps is the replaying
    queue's; two arguments sharing memory are another signature than two apart."""
    rng = np.random.default_rng(1)

    def arrays():
        return rng.standard_normal((5, 7)).astype(np.float32), rng.standard_normal((5, 7)).astype(np.float32)

    KEPT["c"] = Tensor.from_host(queue, np.full((5, 7), 3.0, np.float32))
    for mode, want in (("kept", lambda a, b: a * 3), ("host", lambda a, b: a * b.ravel()[0]),
                       ("pending", lambda a, b: a * b)):
        for _ in range(3):
            a, b = arrays()
            got = toy(Tensor.from_host(queue, a), Tensor.from_host(queue, b), mode=mode).value
            np.testing.assert_array_equal(got.to_host(), want(a, b))
        assert templates("toy_replayed") == [template._REFUSED], mode
        capture.plans.invalidate()
    a, b = arrays()
    x = Tensor.from_host(queue, a)
    for _ in range(2):
        assert toy(x, Tensor.from_host(queue, b), mode="input").value is x
    (made,) = templates("toy_replayed")
    assert isinstance(made, template.Template) and not made.steps
    capture.plans.invalidate()
    for _ in range(2):
        np.testing.assert_array_equal(toy(x, Tensor.from_host(queue, b), mode="queue").value.to_host(), a * b)
    (made,) = templates("toy_replayed")
    assert [step[2] for step in made.steps if step[0] == "copy"] == [("queue", -1)]
    capture.plans.invalidate()
    for _ in range(2):
        lazy = ops.add(x, 1.0)
        assert lazy._pending is not None
        np.testing.assert_array_equal(toy(lazy, x).value.to_host(), (a + 1) * a)   # (computed first)
        assert lazy._pending is None
    (made,) = templates("toy_replayed")
    assert isinstance(made, template.Template)
    capture.plans.invalidate()
    both = Tensor.from_host(queue, np.concatenate([a, b]))
    top, bottom = both[:5], both[5:]
    for _ in range(2):
        np.testing.assert_array_equal(toy(top, bottom).value.to_host(), a * b)
    np.testing.assert_array_equal(toy(x, Tensor.from_host(queue, b)).value.to_host(), a * b)
    assert len(templates("toy_replayed")) == 2


def test_a_replayed_backward_gives_the_gradients(queue, toy):
    """The backward of a replayed op, recorded on its first call, replayed on later ones: the gradients of
    each call's own inputs."""
    rng = np.random.default_rng(2)
    for _ in range(3):
        a, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
        x = ag.tensor(Tensor.from_host(queue, a), requires_grad=True)
        w = ag.tensor(Tensor.from_host(queue, b), requires_grad=True)
        with ag.Tape() as tape:
            y = ag.sum(toy(x, w))
        tape.backward(y)
        np.testing.assert_array_equal(x.grad.to_host(), b)
        np.testing.assert_array_equal(w.grad.to_host(), a)
    assert all(isinstance(t, template.Template) for t in templates("toy_replayed.backward"))
