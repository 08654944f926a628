"""Training kernels under Oclgrind: loss.cl (class and pointwise losses, forward and backward, row
counts that are not multiples of the work-group) and optim.cl (every optimizer's fused step, several
parameters of odd sizes in one launch, clip_grad_norm_'s sum_squares / clip_coef / scale_by)."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import optim
from netcl.core.tensor import Tensor
from tests.oclgrind.cases import close, dev, oclgrind_only

pytestmark = oclgrind_only


def _log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@pytest.mark.parametrize("label_dtype", [np.int32, np.int64])
def test_cross_entropy_and_nll(queue, label_dtype):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((5, 3, 7))
    y = rng.integers(0, 7, size=(5, 3)).astype(label_dtype)
    y[1, 2] = -100
    keep = y != -100
    for name in ("cross_entropy", "nll"):
        inp = x if name == "cross_entropy" else _log_softmax(x)
        with ag.Tape() as tape:
            node = ag.tensor(dev(queue, inp.astype(np.float32)), requires_grad=True)
            if name == "cross_entropy":
                loss = ag.cross_entropy(node, dev(queue, y), label_smoothing=0.2)
            else:
                loss = ag.nll(node, dev(queue, y))
        tape.backward(loss)
        logp = _log_softmax(inp)
        onehot = np.eye(7)[np.where(keep, y, 0)]
        if name == "cross_entropy":
            target = 0.8 * onehot + 0.2 / 7
            rows = -(target * logp).sum(-1)
            grad = np.exp(logp) - target
        else:
            rows = -(onehot * inp).sum(-1)
            grad = -onehot
        rows, grad = rows * keep, grad * keep[..., None] / keep.sum()
        close(loss.value, [rows.sum() / keep.sum()], 1e-5, 1e-5)
        close(node.grad, grad, 1e-5, 1e-5)


@pytest.mark.parametrize("kind", ["mse", "l1", "smooth_l1", "bce"])
def test_pointwise_losses(queue, kind):
    rng = np.random.default_rng(12)
    a, b = rng.standard_normal((3, 7)), rng.standard_normal((3, 7))
    if kind == "bce":
        b = rng.random((3, 7))
    d = a - b
    if kind == "mse":
        val, grad, fn = d * d, 2 * d, ag.mse
    elif kind == "l1":
        val, grad, fn = np.abs(d), np.sign(d), ag.l1
    elif kind == "smooth_l1":
        val = np.where(np.abs(d) < 1, 0.5 * d * d, np.abs(d) - 0.5)
        grad, fn = np.clip(d, -1, 1), ag.smooth_l1
    else:
        val = np.maximum(a, 0) - a * b + np.log1p(np.exp(-np.abs(a)))
        grad, fn = 1 / (1 + np.exp(-a)) - b, ag.binary_cross_entropy_with_logits
    for reduction in ("mean", "none"):
        with ag.Tape() as tape:
            na = ag.tensor(dev(queue, a.astype(np.float32)), requires_grad=True)
            nb = ag.tensor(dev(queue, b.astype(np.float32)), requires_grad=True)
            loss = fn(na, nb, reduction=reduction)
        seed = None
        if reduction == "none":
            seed = rng.standard_normal(a.shape)
            tape.backward(loss, dev(queue, seed.astype(np.float32)))
            close(loss.value, val, 1e-5, 1e-5)
            close(na.grad, grad * seed, 1e-5, 1e-5)
        else:
            tape.backward(loss)
            close(loss.value, [val.mean()], 1e-5, 1e-5)
            close(na.grad, grad / a.size, 1e-5, 1e-5)
            if kind in ("mse", "l1", "smooth_l1"):
                close(nb.grad, -grad / a.size, 1e-5, 1e-5)


SHAPES = [(7, 3), (17,), (1,), (2, 3, 5)]
OPTIMIZERS = [
    (optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
    (optim.Adam, dict(lr=0.01)),
    (optim.RMSProp, dict(lr=0.01, momentum=0.5, centered=True)),
]


@pytest.mark.parametrize("cls,hyper", OPTIMIZERS)
def test_optimizer_steps(queue, cls, hyper):
    """Two steps (the first creates the state) on parameters of odd sizes; checked against plain SGD
    arithmetic for SGD and against direction/finiteness for the adaptive ones."""
    rng = np.random.default_rng(13)
    host = [rng.standard_normal(s) for s in SHAPES]
    params = [ag.Parameter(dev(queue, h.astype(np.float32))) for h in host]
    opt = cls(params, **hyper)
    grads = [rng.standard_normal(s) for s in SHAPES]
    for _ in range(2):
        for p, g in zip(params, grads):
            p.grad = dev(queue, g.astype(np.float32))
        opt.step()
    for p, h, g in zip(params, host, grads):
        got = p.value.to_host().astype(np.float64)
        assert np.all(np.isfinite(got))
        if cls is optim.SGD:
            lr, mu, wd = 0.05, 0.9, 0.01
            g1 = g + wd * h
            p1 = h - lr * (g1 + mu * g1)
            g2 = g + wd * p1
            buf = mu * g1 + g2
            np.testing.assert_allclose(got, p1 - lr * (g2 + mu * buf), rtol=1e-5, atol=1e-6)
        else:
            moved = got - h
            assert np.all((moved * g <= 1e-7) | (np.abs(moved) < 1e-6))  # against the gradient


def test_clip_grad_norm(queue):
    rng = np.random.default_rng(14)
    grads = [rng.standard_normal(s) for s in SHAPES]
    params = [ag.Parameter(Tensor.zeros(queue, s, np.float32)) for s in SHAPES]
    for p, g in zip(params, grads):
        p.grad = dev(queue, g.astype(np.float32))
    total = np.sqrt(sum(float((g * g).sum()) for g in grads))
    close(optim.clip_grad_norm_(params, max_norm=1.5), [total], 1e-5, 1e-5)
    for p, g in zip(params, grads):
        close(p.grad, g * 1.5 / (total + 1e-6), 1e-5, 1e-5)


def test_device_checks_report_bad_labels_and_ids(queue):
    """The check record (checks.cl): several work-items meet bad input at once, one wins the atomic and
    writes the record; the host raises it at the next read."""
    from netcl import ops
    from netcl.errors import ShapeError

    x = ag.tensor(dev(queue, np.zeros((300, 5), np.float32)), requires_grad=True)
    labels = np.arange(300) % 9  # labels 5..8 are out of range in many rows (and work-items)
    with pytest.raises(ShapeError, match=r"cross_entropy: label [5-8] in row \d+ is outside \[0, 5\)"):
        ag.cross_entropy(x, dev(queue, labels.astype(np.int32))).value.to_host()
    weight = dev(queue, np.ones((4, 3), np.float32))
    ids = dev(queue, np.array([[0, 7, -1], [3, 9, 2]], np.int64))
    with pytest.raises(ShapeError, match=r"embedding: id (7|-1|9) at position \d is outside \[0, 4\)"):
        ops.embedding(weight, ids).to_host()
    close(ops.embedding(weight, dev(queue, np.array([1, 3], np.int64))), np.ones((2, 3)))
