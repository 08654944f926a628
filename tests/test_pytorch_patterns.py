"""PyTorch habits a new user brings, on netcl's API: each either works as in PyTorch or is refused with an
error that says what netcl spells instead (the mapping table is docs/paths/pytorch/tensor-node.md)."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import optim
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, ShapeError
from netcl.nn import BatchNorm1d, BatchNorm2d, Linear, ReLU, Sequential


def test_float_and_int_of_a_one_element_tensor_or_node(queue):
    t = Tensor.from_host(queue, np.array([2.5], np.float32))
    assert float(t) == 2.5 and int(Tensor.from_host(queue, np.array([[7]], np.int32))) == 7
    assert float(ag.tensor(t)) == 2.5 and int(ag.tensor(t)) == 2
    with pytest.raises(ShapeError, match=r"float\(\) needs a tensor of one element.*\(2,\)"):
        float(Tensor.from_host(queue, np.ones(2, np.float32)))


def test_to_dtype_converts_tensors_nodes_and_modules(queue, rng):
    a = rng.standard_normal((3, 5)).astype(np.float32)
    t = Tensor.from_host(queue, a)
    for spelling in (np.float64, np.dtype("float64"), "float64"):
        out = t.to(spelling)
        assert out.dtype == np.float64 and np.array_equal(out.to_host(), a.astype(np.float64))
    assert t.to(np.float32) is t and t.to(queue) is t
    with pytest.raises(DTypeError, match="not a dtype"):
        t.to("no-such-dtype")

    w = ag.tensor(t, requires_grad=True)
    with ag.Tape() as tape:
        loss = (w.to(np.float64) * 3.0).sum()
    assert loss.dtype == np.float64
    tape.backward(loss)
    assert w.grad.dtype == np.float32 and np.array_equal(w.grad.to_host(), np.full((3, 5), 3, np.float32))
    with pytest.raises(TypeError, match="Node.to takes a dtype"):
        w.to(queue)

    model = Sequential(Linear(queue, 5, 4), BatchNorm1d(queue, 4), ReLU(), Linear(queue, 4, 2))
    before = {k: v.to_host() for k, v in model.state_dict().items()}
    assert model.to(np.float64) is model
    after = model.state_dict()
    assert all(v.dtype == np.float64 and np.array_equal(v.to_host(), before[k]) for k, v in after.items())
    out = model(ag.tensor(out))
    assert out.dtype == np.float64
    with pytest.raises(DTypeError, match="floating-point dtype only"):
        model.to(np.int32)


def test_loss_backward_is_tape_backward(queue):
    lin = Linear(queue, 3, 2)
    x = Tensor.from_host(queue, np.arange(6, dtype=np.float32).reshape(2, 3))
    grads = []
    for spelling in ("tape", "node"):
        lin.zero_grad()
        with ag.Tape() as tape:
            loss = lin(ag.tensor(x)).sum()
        tape.backward(loss) if spelling == "tape" else loss.backward()
        grads.append(lin.weight.grad.to_host())
    assert np.array_equal(grads[0], grads[1]) and np.abs(grads[0]).sum() > 0


def test_batchnorm1d_is_named_as_such(queue):
    bn = BatchNorm1d(queue, 3)
    assert repr(bn).startswith("BatchNorm1d(3,") and isinstance(bn, BatchNorm2d)
    assert list(bn.state_dict()) == list(BatchNorm2d(queue, 3).state_dict())


def test_plateau_takes_the_loss_as_pytorch_code_passes_it(queue):
    lin = Linear(queue, 2, 2)
    opt = optim.SGD(lin.parameters(), lr=1.0)
    sched = optim.ReduceLROnPlateau(opt, patience=0, factor=0.5)
    loss = ag.tensor(Tensor.from_host(queue, np.array([0.25], np.float32)))
    sched.step(loss)  # a Node of one element, as `scheduler.step(val_loss)` passes it
    sched.step(loss.value)
    assert opt.param_groups[0]["lr"] == 0.5


def test_a_numpy_array_into_a_module_says_how_to_move_it(queue):
    with pytest.raises(TypeError, match=r"got ndarray; move it to the device first: Tensor.from_host"):
        Linear(queue, 2, 2)(np.ones((1, 2), np.float32))
