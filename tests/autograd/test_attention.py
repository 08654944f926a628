"""ag.flash_attention: the tape's gradients against float64 NumPy, only the passes the inputs need, dropout's
mask regenerated in backward, and a recorded training step."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.core.tensor import Tensor
from netcl.graph import Graph
from netcl.ops import attention as attn
from netcl.ops.random import Generator
from netcl.profiling import count_launches
from tests.ops.test_attention import dev, inputs, reference


def _close(got, want):
    np.testing.assert_allclose(got.to_host(), want, rtol=2e-4, atol=2e-5 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_of_every_input(queue, rng, causal):
    q, k, v, g = inputs(rng, 2, 4, 2, 13, 21, 32)
    mask = rng.random((2, 1, 1, 21)) < 0.8
    want = reference(q, k, v, causal=causal, mask=mask, grad_out=g)
    with ag.Tape() as tape:
        nq, nk, nv = (ag.tensor(dev(queue, a), requires_grad=True) for a in (q, k, v))
        out = ag.flash_attention(nq, nk, nv, causal=causal, mask=dev(queue, mask))
    tape.backward(out, dev(queue, g))
    _close(out.value, want[0])
    for node, ref in zip((nq, nk, nv), want[2:], strict=True):
        _close(node.grad, ref)


def test_only_the_needed_pass_runs(queue, rng):
    q, k, v, g = inputs(rng, 1, 2, 1, 9, 9, 32)
    want = reference(q, k, v, grad_out=g)
    with ag.Tape() as tape:
        nq = ag.tensor(dev(queue, q), requires_grad=True)
        out = ag.flash_attention(nq, dev(queue, k), dev(queue, v))
    with count_launches() as only_q:
        tape.backward(out, dev(queue, g))
    _close(nq.grad, want[2])
    with ag.Tape() as tape:
        nk, nv = (ag.tensor(dev(queue, a), requires_grad=True) for a in (k, v))
        out = ag.flash_attention(dev(queue, q), nk, nv)
    with count_launches() as only_kv:
        tape.backward(out, dev(queue, g))
    _close(nk.grad, want[3])
    _close(nv.grad, want[4])
    assert only_q.count == 1 and only_kv.count == 2   # dq (with delta); delta-only dq launch + dkdv


def test_no_tape_records_nothing(queue, rng):
    q, k, v, _ = inputs(rng, 1, 1, 1, 3, 4, 32)
    out = ag.flash_attention(ag.tensor(dev(queue, q)), dev(queue, k), dev(queue, v))
    assert not out.requires_grad
    _close(out.value, reference(q, k, v)[0])


def test_dropout_backward_uses_the_forward_mask(queue, rng):
    B, H, S, D, p = 1, 2, 11, 32, 0.3
    q, k, v, g = inputs(rng, B, H, H, S, S, D)
    with ag.Tape() as tape:
        nq, nk, nv = (ag.tensor(dev(queue, a), requires_grad=True) for a in (q, k, v))
        out = ag.flash_attention(nq, nk, nv, dropout_p=p, generator=Generator(21), causal=True)
    tape.backward(out, dev(queue, g))
    draw = attn.DropoutDraw(Generator(21))   # the same generator state: the same counters
    draw.take(B * H * S)
    keep = attn.attention_dropout_mask(queue, draw, (B, H, S, S), p).to_host()
    assert 0 < keep.mean() < 1
    want = reference(q, k, v, causal=True, keep=keep, dropout_p=p, grad_out=g)
    _close(out.value, want[0])
    for node, ref in zip((nq, nk, nv), want[2:], strict=True):
        _close(node.grad, ref)


def test_recorded_step_replays(queue, rng):
    """A captured forward + backward replays on new inputs with the eager results."""
    q, k, v, g = inputs(rng, 1, 2, 2, 7, 7, 32)
    tq, tk, tv = (Tensor.from_host(queue, a) for a in (q, k, v))
    seed = dev(queue, g)
    graph = Graph()
    with graph.capture():
        with ag.Tape() as tape:
            nq, nk, nv = (ag.tensor(t, requires_grad=True) for t in (tq, tk, tv))
            out = ag.flash_attention(nq, nk, nv, causal=True)
        tape.backward(out, seed)
    for step in range(2):
        q2, k2, v2, _ = inputs(np.random.default_rng(step), 1, 2, 2, 7, 7, 32)
        for t, a in zip((tq, tk, tv), (q2, k2, v2), strict=True):
            t.copy_from_host(a)
        graph.replay()
        want = reference(q2, k2, v2, causal=True, grad_out=g)
        _close(out.value, want[0])
        for node, ref in zip((nq, nk, nv), want[2:], strict=True):
            _close(node.grad, ref)
