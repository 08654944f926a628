"""Module system and layers: registration, dotted state_dict, strict loading, modes, init, forward values."""

from __future__ import annotations

import math

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import nn
from netcl.core.tensor import Tensor
from netcl.ops import random
from netcl.profiling import count_launches
from tests.autograd.gradcheck import check_grads


def _mlp(q):
    return nn.Sequential(nn.Linear(q, 7, 5), nn.ReLU(), nn.Linear(q, 5, 3, bias=False))


class Block(nn.Module):
    def __init__(self, q):
        super().__init__()
        self.body = _mlp(q)
        self.norm = nn.BatchNorm2d(q, 3)
        self.extra = nn.ModuleList([nn.Linear(q, 3, 3)])


def test_dotted_state_dict_keys_and_parameters(queue):
    b = Block(queue)
    assert list(b.state_dict()) == [
        "body.0.weight",
        "body.0.bias",
        "body.2.weight",
        "norm.weight",
        "norm.bias",
        "norm.running_mean",
        "norm.running_var",
        "extra.0.weight",
        "extra.0.bias",
    ]
    assert [n for n, _ in b.named_parameters()] == [k for k in b.state_dict() if "running" not in k]
    assert b.body[0].weight.shape == (5, 7)  # (out, in) like PyTorch
    assert b.num_parameters() == 7 * 5 + 5 + 5 * 3 + 3 + 3 + 9 + 3


def test_load_state_dict_round_trip_and_errors(queue):
    a, b = _mlp(queue), _mlp(queue)
    b.load_state_dict({k: v.to_host() for k, v in a.state_dict().items()})
    for k, v in a.state_dict().items():
        np.testing.assert_array_equal(b.state_dict()[k].to_host(), v.to_host())
    sd = {k: v.to_host() for k, v in a.state_dict().items()}
    sd["0.weight"] = np.zeros((4, 7), np.float32)
    del sd["2.weight"]
    sd["9.bias"] = np.zeros(3, np.float32)
    before = b.state_dict()["0.bias"].to_host()
    with pytest.raises(nn.StateDictError) as info:
        b.load_state_dict(sd)
    msg = str(info.value)
    assert "missing keys (1): 2.weight" in msg and "unexpected keys (1): 9.bias" in msg
    assert "0.weight: shape (4, 7) in the state dict, (5, 7) in the model" in msg
    np.testing.assert_array_equal(b.state_dict()["0.bias"].to_host(), before)  # nothing copied
    sd["0.weight"] = np.zeros((5, 7), np.float32)
    missing, unexpected = b.load_state_dict(sd, strict=False)
    assert missing == ["2.weight"] and unexpected == ["9.bias"]
    with pytest.raises(nn.StateDictError, match="dtype float64"):
        b.load_state_dict({**sd, "0.bias": np.zeros(5)}, strict=False)


def test_train_eval_and_to(queue, device):
    b = Block(queue)
    b.eval()
    assert not b.training and not b.body[0].training and not b.norm.training
    b.train()
    assert b.extra[0].training
    q2 = device.new_queue()
    b.to(q2)
    assert all(p.value.queue is q2 for p in b.parameters()) and b.norm.running_mean.queue is q2


def test_linear_init_is_pytorch_like_and_seeded(queue):
    random.manual_seed(4)
    w1 = nn.Linear(queue, 400, 300).weight.value.to_host()
    random.manual_seed(4)
    w2 = nn.Linear(queue, 400, 300).weight.value.to_host()
    np.testing.assert_array_equal(w1, w2)
    bound = 1 / math.sqrt(400)
    assert np.abs(w1).max() <= bound and np.abs(w1).max() > 0.98 * bound
    assert abs(w1.std() - bound / math.sqrt(3)) < 0.01 * bound
    conv = nn.Conv2d(queue, 3, 8, 3).weight.value.to_host()
    assert np.abs(conv).max() <= 1 / math.sqrt(27)


def test_linear_forward_matches_numpy(queue, rng):
    lin = nn.Linear(queue, 6, 4)
    x = rng.standard_normal((3, 2, 6)).astype(np.float32)
    y = lin(ag.tensor(Tensor.from_host(queue, x))).value.to_host()
    w, b = lin.weight.value.to_host(), lin.bias.value.to_host()
    np.testing.assert_allclose(y, x @ w.T + b, rtol=1e-5, atol=1e-5)


def test_sequential_fuses_relu_into_linear(queue, rng):
    m = _mlp(queue)
    x = ag.tensor(Tensor.from_host(queue, rng.standard_normal((4, 7)).astype(np.float32)))
    with count_launches() as c:
        y = m(x).value.to_host()
    assert c.count == 2  # two GEMMs, the relu rides the first one's epilogue
    w0, b0, w2 = (t.to_host() for t in m.state_dict().values())
    np.testing.assert_allclose(y, np.maximum(x.value.to_host() @ w0.T + b0, 0) @ w2.T, rtol=1e-5, atol=1e-5)


def test_layers_forward(queue, rng):
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    xn = ag.tensor(Tensor.from_host(queue, x))
    np.testing.assert_allclose(
        nn.MaxPool2d(2)(xn).value.to_host(), x.reshape(2, 3, 3, 2, 3, 2).max(axis=(3, 5))
    )
    np.testing.assert_allclose(
        nn.AvgPool2d(3)(xn).value.to_host(),
        x.reshape(2, 3, 2, 3, 2, 3).mean(axis=(3, 5)),
        rtol=1e-5,
        atol=1e-6,
    )
    assert nn.Flatten()(xn).shape == (2, 108)
    np.testing.assert_allclose(nn.Tanh()(xn).value.to_host(), np.tanh(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(nn.LeakyReLU(0.2)(xn).value.to_host(), np.where(x > 0, x, 0.2 * x), rtol=1e-6)
    np.testing.assert_allclose(nn.SiLU()(xn).value.to_host(), x / (1 + np.exp(-x)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(nn.Sigmoid()(xn).value.to_host(), 1 / (1 + np.exp(-x)), rtol=1e-5, atol=1e-6)
    bn = nn.BatchNorm2d(queue, 3)
    y = bn(xn).value.to_host()
    mu, var = x.mean(axis=(0, 2, 3), keepdims=True), x.var(axis=(0, 2, 3), keepdims=True)
    np.testing.assert_allclose(y, (x - mu) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(bn.running_mean.to_host(), 0.1 * mu.reshape(3), rtol=1e-4, atol=1e-6)
    ln = nn.LayerNorm(queue, 6)
    z = ln(xn).value.to_host()
    np.testing.assert_allclose(
        z, (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5), rtol=1e-4, atol=1e-4
    )


def test_dropout_train_and_eval(queue):
    d = nn.Dropout(0.5, generator=random.Generator(1))
    x = ag.tensor(Tensor.ones(queue, (1000,)))
    y = d(x).value.to_host()
    assert set(np.unique(y)) == {0.0, 2.0} and 400 < (y == 0).sum() < 600
    d.eval()
    assert d(x) is x


def test_embedding_forward_and_grad(queue, rng):
    emb = nn.Embedding(queue, 7, 3)
    ids = Tensor.from_host(queue, np.array([[1, 4, 1], [6, 0, 1]], dtype=np.int32))
    np.testing.assert_array_equal(emb(ids).value.to_host(), emb.weight.value.to_host()[ids.to_host()])
    check_grads(queue, lambda w, i: ag.embedding(w, i), [rng.standard_normal((7, 3))], extra=[ids])
