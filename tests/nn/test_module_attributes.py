"""Module attributes behave as in PyTorch's nn.Module (the patterns of its own tests): None placeholders,
replacing a child, reassigning a buffer, deleting attributes, and the errors for values of the wrong kind."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import nn
from netcl.core.tensor import Tensor


def _param(queue, *values):
    return ag.Parameter(Tensor.from_host(queue, np.array(values, np.float32)))


class Block(nn.Module):
    def __init__(self, q, downsample: bool):
        super().__init__()
        self.conv = nn.Linear(q, 2, 2)
        self.downsample = None  # the ResNet pattern: a placeholder, replaced when needed
        if downsample:
            self.downsample = nn.Sequential(nn.Linear(q, 2, 2))

    def forward(self, x):
        y = self.conv(x)
        return y if self.downsample is None else y + self.downsample(x)


def test_none_placeholder_then_module(queue):
    b = Block(queue, downsample=True)
    assert isinstance(b.downsample, nn.Sequential)
    assert sorted(n for n, _ in b.named_parameters()) == [
        "conv.bias", "conv.weight", "downsample.0.bias", "downsample.0.weight"]
    x = ag.tensor(Tensor.from_host(queue, np.ones((3, 2), np.float32)))
    want = b.conv(x).value.to_host() + b.downsample(x).value.to_host()
    np.testing.assert_allclose(b(x).value.to_host(), want, rtol=1e-6)
    plain = Block(queue, downsample=False)
    assert plain.downsample is None and "downsample" not in dict(plain.named_modules())


def test_plain_value_then_parameter_and_back(queue):
    m = nn.Module()
    m.w = 3
    m.w = _param(queue, 1.0)
    assert isinstance(m.w, ag.Parameter) and list(m.state_dict()) == ["w"]
    with pytest.raises(TypeError, match="cannot assign int as parameter 'w'"):
        m.w = 4  # PyTorch: a Parameter or None expected
    m.w = None
    assert m.w is None and list(m.state_dict()) == [] and [n for n, _ in m.named_parameters()] == []
    del m.w
    m.w = 7  # after deleting it, the name is free for a plain value
    assert m.w == 7 and list(m.state_dict()) == []


def test_buffers_take_tensors_or_none(queue):
    m = nn.Module()
    m.register_buffer("running", Tensor.zeros(queue, (2,)))
    m.running = Tensor.from_host(queue, np.array([5.0, 6.0], np.float32))  # replaces the buffer
    np.testing.assert_array_equal(m.state_dict()["running"].to_host(), [5.0, 6.0])
    with pytest.raises(TypeError, match="buffer 'running'"):
        m.running = 5.0
    m.running = None
    assert m.running is None and "running" not in m.state_dict()
    m.plain = Tensor.zeros(queue, (1,))  # a Tensor assigned to a new name is a plain attribute
    assert "plain" not in m.state_dict()


def test_replacing_and_deleting_children(queue):
    b = Block(queue, downsample=True)
    b.conv = nn.Linear(queue, 2, 5)
    assert b.conv.weight.shape == (5, 2) and b.state_dict()["conv.weight"].shape == (5, 2)
    with pytest.raises(TypeError, match="child module 'conv'"):
        b.conv = "linear"
    del b.downsample
    assert not hasattr(b, "downsample")
    assert sorted(b.state_dict()) == ["conv.bias", "conv.weight"]
    b.conv = None
    assert b.conv is None and list(b.state_dict()) == []


def test_register_functions_check_their_arguments(queue):
    m = nn.Module()
    with pytest.raises(TypeError, match="cannot register Tensor as parameter 'w'"):
        m.register_parameter("w", Tensor.zeros(queue, (1,)))
    with pytest.raises(KeyError, match="'a.b'"):
        m.register_buffer("a.b", Tensor.zeros(queue, (1,)))
    with pytest.raises(TypeError, match="cannot add int as child module 'x'"):
        m.add_module("x", 3)
    m.register_parameter("bias", None)  # a placeholder, as in PyTorch
    assert m.bias is None and list(m.state_dict()) == []
    m.bias = _param(queue, 2.0)
    assert list(m.state_dict()) == ["bias"]
    with pytest.raises(TypeError, match="list"):
        m.load_state_dict([("bias", np.zeros(1, np.float32))])


def test_parameter_attribute_follows_every_change(queue):
    """A parameter is read as a plain attribute (kept beside _parameters): no write path may leave the
    attribute naming an old value."""
    m = nn.Module()
    p1, p2, p3, p4 = (_param(queue, float(i)) for i in range(4))
    m.w = p1
    m.w = p2
    assert m.w is p2 and dict(m.named_parameters())["w"] is p2
    buf = Tensor.zeros(queue, (1,))
    m.register_buffer("w", buf)  # a buffer takes the name over (netcl's and PyTorch's register rules)
    assert m.w is buf and list(m.named_parameters()) == [] and list(m.state_dict()) == ["w"]
    m.register_parameter("w", p3)
    assert m.w is p3 and m.state_dict()["w"].to_host()[0] == 2.0
    child = nn.Linear(queue, 2, 2)
    m.add_module("w", child)
    assert m.w is child and [n for n, _ in m.named_parameters()] == ["w.weight", "w.bias"]
    del m.w
    m.register_parameter("w", p4)
    assert m.w is p4
    m.w = None
    assert m.w is None and list(m.state_dict()) == []
    del m.w
    assert not hasattr(m, "w")
    with pytest.raises(AttributeError, match="Module has no attribute 'w'"):
        m.w  # noqa: B018



def test_structure_version_moves_with_every_change_of_parameters_or_children(queue):
    """nn.module.structure_version (what cached flat lists of a model's modules and parameters are checked
    against) changes with each way of changing a module's parameters or children, and not with plain
    attributes, buffers or a parameter's new value."""
    from netcl.nn.module import structure_version
    m = nn.Module()
    seq, lst = nn.Sequential(nn.Linear(queue, 2, 2)), nn.ModuleList()
    changes = {
        "parameter": lambda: setattr(m, "w", _param(queue, 1.0)),
        "parameter again": lambda: setattr(m, "w", _param(queue, 2.0)),
        "parameter to None": lambda: setattr(m, "w", None),
        "register_parameter": lambda: m.register_parameter("v", _param(queue, 3.0)),
        "child": lambda: setattr(m, "child", nn.Linear(queue, 2, 2)),
        "child to None": lambda: setattr(m, "child", None),
        "add_module": lambda: m.add_module("other", nn.ReLU()),
        "delattr": lambda: delattr(m, "other"),
        "Sequential.append": lambda: seq.append(nn.ReLU()),
        "ModuleList.append": lambda: lst.append(nn.ReLU()),
    }
    for what, change in changes.items():
        before = structure_version()
        change()
        assert structure_version() != before, what
    same = {
        "plain attribute": lambda: setattr(m, "scale", 2.0),
        "buffer": lambda: m.register_buffer("stat", Tensor.from_host(queue, np.zeros(2, np.float32))),
        "new value": lambda: setattr(m.v, "value", Tensor.from_host(queue, np.zeros(1, np.float32))),
    }
    for what, change in same.items():
        before = structure_version()
        change()
        assert structure_version() == before, what
