"""PyTorch habits a new user brings, on netcl's API: each either works as in PyTorch or is refused with an
error that says what netcl spells instead (the mapping table is docs/paths/pytorch/tensor-node.md)."""

from __future__ import annotations

import json
import pickle
import re
from collections import OrderedDict

import numpy as np
import pytest

import netcl
import netcl.autograd as ag
from netcl import nn, ops, optim
from netcl.core.tensor import Tensor
from netcl.data import DataLoader
from netcl.errors import DTypeError, NetclError, ShapeError
from netcl.nn import BatchNorm1d, BatchNorm2d, Linear, ReLU, Sequential, StateDictError, init


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
    with pytest.raises(DTypeError, match=r"to a device pass its queue, e.g. .to\(manager.get\('cpu'\)"):
        t.to("cpu")  # PyTorch's device string

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


def test_in_place_initialisers_through_apply(queue):
    model = Sequential(OrderedDict([("fc", Linear(queue, 48, 64)), ("act", ReLU()),
                                    ("out", Linear(queue, 64, 40))]))
    assert list(model.state_dict()) == ["fc.weight", "fc.bias", "out.weight", "out.bias"]
    values = {n: p.value for n, p in model.named_parameters()}
    seen = []

    def init_weights(m):
        seen.append(type(m).__name__)
        if isinstance(m, Linear):
            assert init.xavier_uniform_(m.weight) is m.weight
            init.constant_(m.bias, 0.5)

    assert model.apply(init_weights) is model
    assert seen == ["Linear", "ReLU", "Linear", "Sequential"]  # children first, as in PyTorch
    assert all(p.value is values[n] for n, p in model.named_parameters())  # filled in place
    w = model.fc.weight.numpy()
    bound = np.sqrt(6.0 / (48 + 64))
    assert np.abs(w).max() <= bound and abs(w.std() - bound / np.sqrt(3)) < 0.1 * bound / np.sqrt(3)
    assert np.array_equal(model.out.bias.numpy(), np.full(40, 0.5, np.float32))
    init.kaiming_normal_(model.fc.weight, mode="fan_out", nonlinearity="relu")
    std = np.sqrt(2.0) / np.sqrt(64)
    assert abs(model.fc.weight.numpy().std() - std) < 0.1 * std
    init.zeros_(model.fc.bias.value)  # a Tensor works too
    assert not model.fc.bias.numpy().any()
    with pytest.raises(ShapeError, match="2 or more dimensions"):
        init.xavier_uniform_(model.fc.bias)
    with pytest.raises(DTypeError, match="floating-point"):
        init.normal_(Tensor.zeros(queue, (2, 2), dtype=np.int32))
    with pytest.raises(ValueError, match="mode must be"):
        init.kaiming_uniform_(model.fc.weight, mode="fan_avg")


def test_requires_grad_on_a_leaf(queue):
    x = ag.tensor(Tensor.from_host(queue, np.array([1.0, 2.0], np.float32)))
    assert x.requires_grad_() is x and x.requires_grad
    with ag.Tape():
        y = (x * x).sum()
    y.backward()
    assert np.array_equal(x.grad.to_host(), [2.0, 4.0])
    with ag.Tape():
        z = x * 2
    with pytest.raises(NetclError, match="computed by an op"):
        z.requires_grad_(False)


def test_add_param_group_updates_the_new_group(queue):
    a, b = Linear(queue, 3, 2), Linear(queue, 3, 2)
    opt = optim.Adam(a.parameters(), lr=0.1)
    x = Tensor.from_host(queue, np.ones((1, 3), np.float32))

    def step():
        with ag.Tape():
            loss = (a(ag.tensor(x)) + b(ag.tensor(x))).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        a.zero_grad()
        b.zero_grad()

    step()
    before = b.weight.numpy().copy()
    opt.add_param_group({"params": b.parameters(), "lr": 0.01})  # unfreezing b, as in fine-tuning
    assert opt.param_groups[1]["lr"] == 0.01 and opt.param_groups[1]["betas"] == (0.9, 0.999)
    step()
    # Adam's first step moves every weight by lr (the gradient is 1 everywhere): b's by 0.01
    np.testing.assert_allclose(b.weight.numpy(), before - 0.01, rtol=0, atol=1e-6)
    state = opt.state_dict()
    assert len(state["param_groups"]) == 2 and len(state["state"]) == 4
    with pytest.raises(ValueError, match=r"param_groups\[2\]: params\[0\] is also in param_groups\[1\]"):
        opt.add_param_group({"params": [b.weight]})
    with pytest.raises(ValueError, match="unknown key"):
        opt.add_param_group({"params": [], "momentum": 0.9})


def test_a_list_of_samples_is_refused_with_how_to_stack_it(queue):
    samples = [(np.float32(i), i % 2) for i in range(6)]  # would read as 6 fields of 2 rows each
    with pytest.raises(TypeError, match=r"list of 6 tuples, which reads as samples.*np.stack"):
        DataLoader(samples, 2, queue)
    x = np.stack([s[0] for s in samples])
    y = np.array([s[1] for s in samples], np.int32)
    assert [b.shape for b, _ in DataLoader((x, y), 4, queue)] == [(4,), (2,)]


def test_a_pytorch_state_dict_loads_as_it_is(queue, rng):
    torch = pytest.importorskip("torch")
    tnn = torch.nn
    tm = tnn.Sequential(tnn.Linear(4, 6), tnn.BatchNorm1d(6), tnn.ReLU(), tnn.Linear(6, 2))
    tm(torch.randn(8, 4))  # moves the running statistics and num_batches_tracked
    tm.eval()
    model = Sequential(Linear(queue, 4, 6), BatchNorm1d(queue, 6), ReLU(), Linear(queue, 6, 2)).eval()
    assert model.load_state_dict(tm.state_dict()) == ([], [])  # torch tensors in; num_batches_tracked ignored
    x = rng.standard_normal((3, 4)).astype(np.float32)
    want = tm(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(model(Tensor.from_host(queue, x)).numpy(), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(StateDictError, match="0.weight: a object, not an array of numbers"):
        model.load_state_dict({**tm.state_dict(), "0.weight": object()})
    with pytest.raises(StateDictError, match="unexpected keys"):  # only BatchNorm's own key is ignored
        model.load_state_dict({**tm.state_dict(), "0.num_batches_tracked": torch.tensor(1)})


def test_a_tensor_method_on_a_node_says_where_it_is(queue):
    out = ag.tensor(Tensor.from_host(queue, np.array([[0.1, 0.9], [0.8, 0.2]], np.float32)))
    with pytest.raises(AttributeError, match=r"no attribute 'argmax'; its Tensor has it: node.value.argmax"):
        out.argmax(axis=1)  # PyTorch's logits.argmax(1)
    assert out.value.argmax(axis=1).to_host().tolist() == [1, 0]
    assert not hasattr(out, "no_such_thing")


def test_no_grad_decorator_restores_the_mode_after_recursion(queue):
    @ag.no_grad()
    def walk(n):
        assert not ag.is_grad_enabled()
        return walk(n - 1) if n else 0

    walk(3)
    assert ag.is_grad_enabled()  # was left off: every later tape recorded nothing

    @ag.no_grad  # bare, as torch 2 allows
    def evaluate(lin, x):
        return lin(ag.tensor(x))

    lin = Linear(queue, 2, 2)
    with ag.Tape():
        assert not evaluate(lin, Tensor.from_host(queue, np.ones((1, 2), np.float32))).requires_grad
    assert ag.is_grad_enabled() and evaluate.__name__ == "evaluate"


def test_iterating_a_0d_tensor_is_an_error_not_empty(queue):
    scalar = Tensor.from_host(queue, np.float32(3.0))
    for t in (scalar, ag.tensor(scalar)):
        with pytest.raises(TypeError, match="iteration over a 0-d tensor"):
            list(t)  # was [] (Python's __getitem__ fallback stopped at the first IndexError)
    rows = Tensor.from_host(queue, np.arange(6, dtype=np.float32).reshape(3, 2))
    assert [r.to_host().tolist() for r in rows] == [[0, 1], [2, 3], [4, 5]]
    assert [r.shape for r in ag.tensor(rows)] == [(2,)] * 3


def test_train_mode_must_be_a_bool(queue):
    model = Sequential(Linear(queue, 2, 2), ReLU())
    with pytest.raises(TypeError, match="mode must be True or False, got str 'eval'"):
        model.train("eval")  # was training=True, silently
    assert model.train(np.bool_(False)).training is False and not model[0].training


@pytest.mark.parametrize("make, call", [
    (lambda: Linear(4, 3), "Linear(queue, 4, 3), not PyTorch's Linear(4, 3)"),
    (lambda: Linear(in_features=4, out_features=3), "Linear(queue, in_features=4, out_features=3)"),
    (lambda: BatchNorm2d(16), "BatchNorm2d(queue, 16), not PyTorch's BatchNorm2d(16)"),
    (lambda: nn.Conv2d(3, 8, 3, padding=1), "Conv2d(queue, 3, 8, 3, padding=1)"),
    (lambda: nn.Embedding(10, 4), "Embedding(queue, 10, 4)"),
])
def test_a_layer_made_without_its_queue_shows_the_netcl_call(make, call):
    """It was a TypeError about `out_features` (4 taken for the queue, 3 for in_features)."""
    with pytest.raises(TypeError, match=re.escape(f"takes the queue first, then its sizes: {call}")) as err:
        make()
    assert "queue = netcl.manager.default().queue" in str(err.value)


def test_a_subclass_taking_the_queue_first_is_checked_too(queue):
    class Block(nn.Module):
        def __init__(self, q, width):
            super().__init__()
            self.fc = Linear(q, width, width)

    assert Block(queue, 3).fc.in_features == 3 and Block(q=queue, width=2).fc.out_features == 2
    words = re.escape("Block takes the queue first, then its sizes: Block(queue, 3),")
    with pytest.raises(TypeError, match=words):
        Block(3)

    class Free(nn.Module):  # no queue argument: nothing to check
        def __init__(self, width=2):
            super().__init__()
            self.width = width

    assert Free(5).width == 5


def test_loss_modules_are_the_functions_with_their_options(queue, rng):
    logits = rng.standard_normal((5, 4))
    labels = np.array([0, 3, 1, -100, 2])
    keep = labels != -100
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    picked = -logp[keep, labels[keep]]
    x = ag.tensor(Tensor.from_host(queue, logits.astype(np.float32)), requires_grad=True)
    y = Tensor.from_host(queue, labels.astype(np.int32))
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    assert repr(criterion) == "CrossEntropyLoss(ignore_index=-100, label_smoothing=0.1, reduction='mean')"
    with ag.Tape():
        loss = criterion(x, y)
    want = (0.9 * picked + 0.1 * -logp[keep].mean(1)).mean()  # PyTorch's label smoothing
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    loss.backward()
    assert x.grad.shape == (5, 4) and not x.grad.to_host()[3].any()  # the ignored row
    log_probs = ag.tensor(Tensor.from_host(queue, logp.astype(np.float32)))
    np.testing.assert_allclose(float(nn.NLLLoss(reduction="sum")(log_probs, y)), picked.sum(), rtol=1e-5)

    a, b = rng.standard_normal((3, 7)), rng.standard_normal((3, 7))
    na, nb = (ag.tensor(Tensor.from_host(queue, v.astype(np.float32))) for v in (a, b))
    d = a - b
    for module, want in (
        (nn.MSELoss(), (d ** 2).mean()),
        (nn.L1Loss(reduction="sum"), np.abs(d).sum()),
        (nn.SmoothL1Loss(beta=0.5), np.where(np.abs(d) < 0.5, 0.5 * d ** 2 / 0.5, np.abs(d) - 0.25).mean()),
        (nn.BCEWithLogitsLoss(), (np.maximum(a, 0) - a * b + np.log1p(np.exp(-np.abs(a)))).mean()),
    ):
        np.testing.assert_allclose(float(module(na, nb)), want, rtol=1e-5, err_msg=repr(module))
    per_row = nn.MSELoss(reduction="none")(na, nb)
    np.testing.assert_allclose(per_row.numpy(), d ** 2, rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError):
        nn.CrossEntropyLoss(Tensor.from_host(queue, np.ones(4, np.float32)))  # PyTorch's class weights


def test_pytorch_paths_to_seeding_clipping_and_schedulers(queue):
    """netcl.manual_seed, nn.utils.clip_grad_norm_ and optim.lr_scheduler.* are the objects netcl already
    had (ops.random.manual_seed, optim.clip_grad_norm_, optim's schedulers), under PyTorch's names."""
    from netcl.nn.utils import clip_grad_norm_
    from netcl.optim.lr_scheduler import OneCycleLR

    assert nn.utils.clip_grad_norm_ is clip_grad_norm_ is optim.clip_grad_norm_
    assert OneCycleLR is optim.lr_scheduler.OneCycleLR is optim.OneCycleLR
    for name in optim.lr_scheduler.__all__:
        assert getattr(optim.lr_scheduler, name) is getattr(optim, name)
    assert {"StepLR", "CosineAnnealingLR", "OneCycleLR", "ReduceLROnPlateau", "LRScheduler"} <= set(
        optim.lr_scheduler.__all__)

    weights = []
    for seed in (7, 7, 8):
        netcl.manual_seed(seed)
        weights.append(Linear(queue, 3, 2).weight.numpy())
    assert np.array_equal(weights[0], weights[1]) and not np.array_equal(weights[0], weights[2])

    p = ag.Parameter(Tensor.from_host(queue, np.zeros(2, np.float32)))
    p.grad = Tensor.from_host(queue, np.array([3.0, 4.0], np.float32))
    total = nn.utils.clip_grad_norm_([p], max_norm=1.0)
    assert float(total) == pytest.approx(5.0)
    np.testing.assert_allclose(p.grad.to_host(), [0.6, 0.8], rtol=1e-5)


def test_size_numel_and_cpu_as_pytorch_spells_them(queue):
    """t.size stays NumPy's element count (an int); called it is PyTorch's size(); numel() and cpu() too."""
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = Tensor.from_host(queue, a)
    node = ag.tensor(t)
    for x in (t, node):
        assert x.size == 24 and x.size + 1 == 25 and isinstance(x.size, int)
        assert x.size() == (2, 3, 4) and x.size(1) == 3 and x.size(-1) == 4 and x.size(dim=0) == 2
        assert x.numel() == 24 and type(x.numel()) is int
        assert np.array_equal(x.cpu(), a) and isinstance(x.cpu(), np.ndarray)
    assert Tensor.from_host(queue, np.float32(2.0)).size() == () and t[0, 0].size(0) == 4
    with pytest.raises(ShapeError, match=r"size: dim 3 is out of range for a tensor of shape \(2, 3, 4\)"):
        t.size(3)
    with pytest.raises(TypeError, match="size: dim must be an integer, got 1.5"):
        t.size(1.5)
    assert json.dumps(t.size) == "24" and type(pickle.loads(pickle.dumps(t.size))) is int


def test_dim_and_keepdim_beside_axis_and_keepdims(queue, rng):
    a = rng.standard_normal((3, 5)).astype(np.float32)
    t = Tensor.from_host(queue, a)
    node = ag.tensor(t)
    assert np.array_equal(t.sum(dim=1).to_host(), t.sum(axis=1).to_host())
    np.testing.assert_allclose(ops.mean(t, dim=0, keepdim=True).to_host(), a.mean(0, keepdims=True),
                               rtol=1e-6)
    np.testing.assert_allclose(t.softmax(dim=0).to_host(), ops.softmax(t, 0).to_host(), rtol=0)
    np.testing.assert_allclose(nn.functional.softmax(node, dim=1).numpy(), ops.softmax(t, 1).to_host(),
                               rtol=0)
    assert t.argmax(dim=1).to_host().tolist() == a.argmax(1).tolist()
    assert np.array_equal(t.cumsum(dim=1).to_host(), ops.cumsum(t, 1).to_host())
    # max and min spelled with dim= give PyTorch's (values, indices); axis= keeps NumPy's values
    values, indices = t.max(dim=1)
    assert np.array_equal(values.to_host(), a.max(1)) and indices.to_host().tolist() == a.argmax(1).tolist()
    low = t.min(dim=0, keepdim=True)
    assert low.values.shape == (1, 5) and low.indices.to_host().tolist() == [a.argmin(0).tolist()]
    assert isinstance(t.max(axis=1), Tensor)
    # a positional axis, where NumPy's answer and PyTorch's differ: both spellings said, no answer given
    for call, words in ((lambda: t.max(1), r"max: name the axis: axis=1 gives the values alone .* dim=1 "
                         r"\(values, indices\)"),
                        (lambda: node.min(0), r"min: name the axis: axis=0"),
                        (lambda: t.std(1), r"std: name the axis: axis=1 divides by n - ddof .* dim=1 by n - "
                         "correction"),
                        (lambda: node.var(0), "var: name the axis")):
        with pytest.raises(TypeError, match=words):
            call()
    # var and std spelled as in PyTorch divide by n - 1 (correction=, unbiased= too); NumPy's by n - ddof
    np.testing.assert_allclose(t.std(dim=1).to_host(), a.std(1, ddof=1), rtol=1e-5)
    np.testing.assert_allclose(node.std(dim=1).numpy(), a.std(1, ddof=1), rtol=1e-5)
    np.testing.assert_allclose(t.var(dim=0, unbiased=False).to_host(), a.var(0), rtol=1e-5)
    np.testing.assert_allclose(t.var(dim=0, correction=2).to_host(), a.var(0, ddof=2), rtol=1e-5)
    np.testing.assert_allclose(node.std(axis=1, correction=1).numpy(), a.std(1, ddof=1), rtol=1e-5)
    np.testing.assert_allclose(t.var(1, ddof=1).to_host(), a.var(1, ddof=1), rtol=1e-5)   # told: no error
    np.testing.assert_allclose(t.var(axis=1).to_host(), a.var(1), rtol=1e-5)
    # an empty dim reduces every axis, as PyTorch's does (NumPy's axis=() reduces none)
    assert t.sum(dim=()).to_host() == pytest.approx(a.sum(), rel=1e-5)
    assert node.mean(dim=[]).numpy() == pytest.approx(a.mean(), rel=1e-5)
    assert t.sum(axis=()).shape == a.shape
    with pytest.raises(TypeError, match="ddof, correction and unbiased are one argument"):
        t.var(dim=1, ddof=0, correction=1)
    with pytest.raises(TypeError, match="unbiased must be True or False"):
        t.std(dim=1, unbiased=1)
    with ag.Tape() as tape:
        x = ag.tensor(t, requires_grad=True)
        best, where = x.max(dim=1)
        loss = best.sum(dim=0)
    tape.backward(loss)
    assert where.to_host().tolist() == a.argmax(1).tolist()
    assert np.array_equal(x.grad.to_host(), (a == a.max(1, keepdims=True)).astype(np.float32))
    words = r"sum: axis=0 and dim=1 are one argument \(NumPy's name and PyTorch's\); give one of them"
    with pytest.raises(TypeError, match=words):
        t.sum(axis=0, dim=1)
    with pytest.raises(TypeError, match=r"mean: axis=1 and dim=0 are one argument"):
        ops.mean(t, 1, dim=0)  # axis given by position
    with pytest.raises(TypeError, match=r"keepdims=True and keepdim=False are one argument"):
        node.sum(dim=0, keepdims=True, keepdim=False)
    with pytest.raises(TypeError, match="softmax.. got an unexpected keyword argument 'keepdim'"):
        ops.softmax(t, keepdim=True)


def test_a_hand_written_sgd_step_updates_the_parameters_in_place(queue, rng):
    """`with torch.no_grad(): for p in model.parameters(): p -= lr * p.grad`: the parameters' Tensors written
    in place (one launch each, the same Tensor objects), as in PyTorch; the same inside a Tape's no_grad
    block and with no Tape at all. Inside a recording Tape a Parameter's in-place update is refused as
    PyTorch refuses it, and a computed node's `h += r` records `h + r` (the gradient flows through both)."""
    from netcl.profiling import count_launches

    model = Sequential(Linear(queue, 6, 5), ReLU(), Linear(queue, 5, 3))
    x = Tensor.from_host(queue, rng.standard_normal((4, 6)).astype(np.float32))
    with ag.Tape() as tape:
        loss = model(x).square().mean()
    tape.backward(loss)
    params = list(model.parameters())
    before = [(p.value, p.numpy().copy(), p.grad.to_host().copy()) for p in params]
    with count_launches() as n, ag.no_grad():
        for p in params:
            p -= 0.1 * p.grad
    assert n.count == len(params)
    for p, (value, w, g) in zip(params, before, strict=True):
        assert p.value is value
        np.testing.assert_allclose(p.numpy(), w - 0.1 * g, rtol=1e-6, atol=1e-7)
    w = params[0].numpy().copy()
    params[0] *= 0.5          # no Tape: in place too
    params[0] /= 2.0
    params[0] += params[1].value.reshape(5, 1)   # a Tensor or a Node on the right
    np.testing.assert_allclose(params[0].numpy(), w / 4 + params[1].numpy()[:, None], rtol=1e-6)
    with ag.Tape():
        with pytest.raises(NetclError, match=r"`x -= y` on a leaf that requires grad .*ag.no_grad\(\)"):
            params[0] -= 0.1
    np.testing.assert_allclose(params[0].numpy(), w / 4 + params[1].numpy()[:, None], rtol=1e-6)
    xn = ag.tensor(x, requires_grad=True)
    with ag.Tape() as tape:
        h = xn * 2.0
        h += xn          # recorded: h = h + xn
        out = h.sum()
    tape.backward(out)
    np.testing.assert_allclose(xn.grad.to_host(), np.full((4, 6), 3.0, np.float32))


def test_deepcopy_of_a_model_tensor_and_optimizer(queue, rng):
    """`copy.deepcopy(model)` (an EMA model, the best epoch's snapshot): parameters and buffers of its own
    with the same values on the same queue, the structure and training flag kept, the copy trained apart
    from the original; a GPT's recorded decode step is not copied (the copy records its own, same tokens); a
    Tensor's deepcopy is a contiguous device copy; an optimizer's says how to make one."""
    import copy

    from netcl.models import GPT
    from netcl.models.config import GPTConfig

    model = Sequential(Linear(queue, 5, 4), BatchNorm1d(queue, 4), ReLU(), Linear(queue, 4, 3))
    x = Tensor.from_host(queue, rng.standard_normal((6, 5)).astype(np.float32))
    model(x)   # training mode: the running statistics move
    snap = copy.deepcopy(model)
    assert snap.training
    mine, theirs = model.state_dict(), snap.state_dict()
    assert list(mine) == list(theirs)
    for k in mine:
        assert mine[k] is not theirs[k] and mine[k].queue is theirs[k].queue
        np.testing.assert_array_equal(mine[k].to_host(), theirs[k].to_host())
    assert [type(m).__name__ for m in snap.modules()] == [type(m).__name__ for m in model.modules()]
    model.eval()
    snap.eval()
    np.testing.assert_array_equal(model(x).numpy(), snap(x).numpy())
    with ag.no_grad():
        snap[0].weight += 1.0
    assert not np.array_equal(model[0].weight.numpy(), snap[0].weight.numpy())
    np.testing.assert_array_equal(model[0].weight.numpy(), mine["0.weight"].to_host())

    gpt = GPT(queue, GPTConfig(vocab_size=40, dim=16, n_layers=1, n_heads=2, max_seq_len=24, arch="llama"))
    tokens = list(gpt.generate([3, 1, 4], 4, temperature=0))
    twin = copy.deepcopy(gpt)
    assert gpt._decoder is not None and twin._decoder is None
    assert list(twin.generate([3, 1, 4], 4, temperature=0)) == tokens

    base = Tensor.from_host(queue, rng.standard_normal((3, 4)).astype(np.float32))
    view = base.T
    dup = copy.deepcopy(view)
    assert dup.is_contiguous() and dup._storage is not base._storage and dup.queue is queue
    np.testing.assert_array_equal(dup.to_host(), base.to_host().T)

    opt = optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"load_state_dict\(opt.state_dict\(\)\)"):
        copy.deepcopy(opt)


def test_dtype_shortcuts_and_the_cpu_numpy_chain(queue, rng):
    """`(pred == y).float().mean()`, `y.long()`, `mask.bool()`, `x.half()` and `out.detach().cpu().numpy()`:
    PyTorch's loop idioms on Tensors and Nodes; `.cpu()` is a NumPy array (netcl's spelling) that also
    answers `.numpy()`."""
    logits = ag.tensor(Tensor.from_host(queue, rng.standard_normal((6, 4)).astype(np.float32)))
    y = Tensor.from_host(queue, np.array([0, 1, 2, 3, 0, 1], np.int32))
    pred = logits.value.argmax(axis=1)
    accuracy = (pred == y).float().mean().item()
    want = (logits.numpy().argmax(1) == y.numpy()).mean()
    assert accuracy == pytest.approx(want)
    assert y.long().dtype == np.int64 and (pred == y).float().dtype == np.float32
    assert logits.half().dtype == np.float16 and logits.double().dtype == np.float64
    assert isinstance(logits.bool(), ag.Node) and logits.bool().dtype == np.bool_
    np.testing.assert_array_equal(logits.int().numpy(), logits.numpy().astype(np.int32))   # toward zero
    host = logits.detach().cpu().numpy()
    assert type(host) is np.ndarray and np.array_equal(host, logits.numpy())
    assert isinstance(logits.cpu(), np.ndarray) and np.array_equal(y.cpu().numpy(), y.numpy())


def test_pytorch_names_a_tensor_lacks_say_netcls(queue):
    """A Tensor's (and a Node's) AttributeError for PyTorch's names says what netcl writes (x.t(), x.dim(),
    x.exp_(), x.topk(...), x.requires_grad; a Node's .data and add_); other names, and netcl's own `_`
    probes, keep the plain error; x.detach() is x (a Tensor is in no graph)."""
    x = Tensor.from_host(queue, np.ones((2, 3), np.float32))
    assert x.detach() is x
    for name, hint in (("t", "x.T"), ("dim", "x.ndim"), ("add_", "x += y"), ("zero_", "x.fill_(0)"),
                       ("exp_", "x[...] = netcl.ops.exp(x"), ("topk", "netcl.ops.topk(x"),
                       ("requires_grad", "ag.tensor(x, requires_grad=True)"),
                       ("amax", "x.max(axis=...)"), ("mT", "x.transpose(-1, -2)"),
                       ("type_as", "x.astype(other.dtype)"), ("zeros_like", "netcl.ops.zeros_like(x")):
        with pytest.raises(AttributeError, match=re.escape(f"no attribute '{name}'; netcl spells it {hint}")):
            getattr(x, name)
    for name in ("no_such_thing", "_private"):
        with pytest.raises(AttributeError) as info:
            getattr(x, name)
        assert "netcl spells" not in str(info.value)
    assert getattr(x, "_netcl_tag", None) is None and not hasattr(x, "dim")
    node = ag.tensor(x)   # a Node: its own spellings first, then its Tensor's
    for name, hint in (("data", "node.value"), ("add_", "`node += y`"), ("zero_", "node.value.fill_(0)"),
                       ("t", "on its Tensor x = node.value: x.T"),
                       ("topk", "on its Tensor x = node.value: netcl.ops.topk(x"),
                       ("argmax", "its Tensor has it: node.value.argmax")):
        pattern = re.escape(f"no attribute '{name}'; ") + ".*" + re.escape(hint)
        with pytest.raises(AttributeError, match=pattern):
            getattr(node, name)
    with pytest.raises(AttributeError) as info:
        _ = node.no_such_thing
    assert "spells" not in str(info.value)


def test_item_assignment_on_a_parameter(queue):
    """`with torch.no_grad(): emb.weight[pad] = 0`: a Node's item assignment writes its Tensor outside a
    recording Tape (a Tensor or a Node on the right); inside one it is refused with what to write instead."""
    emb = nn.Embedding(queue, 5, 3)
    w = emb.weight.numpy().copy()
    with ag.no_grad():
        emb.weight[2] = 0.0
    emb.weight[0, 1:] = ag.tensor(Tensor.from_host(queue, np.array([7.0, 8.0], np.float32)))   # no Tape
    w[2] = 0.0
    w[0, 1:] = [7.0, 8.0]
    np.testing.assert_array_equal(emb.weight.numpy(), w)
    with ag.Tape(), pytest.raises(NetclError, match=r"while a Tape records.*ag.no_grad\(\)"):
        emb.weight[1] = 0.0
    np.testing.assert_array_equal(emb.weight.numpy(), w)


def test_flatten_merges_every_axis_unless_told(queue):
    """node.flatten() and ag.flatten(node) as torch.flatten: every axis (it kept the batch axis, as nn.Flatten
    does, which keeps its start_dim=1)."""
    node = ag.tensor(Tensor.from_host(queue, np.arange(24, dtype=np.float32).reshape(2, 3, 4)))
    assert node.flatten().shape == (24,) and ag.flatten(node).shape == (24,)
    assert node.flatten(1).shape == (2, 12) and ag.flatten(node, 0, 1).shape == (6, 4)
    assert nn.Flatten()(node).shape == (2, 12)
    np.testing.assert_array_equal(node.flatten().numpy(), np.arange(24))


def test_dim_on_the_joins_splits_and_squeezes(queue):
    """cat, stack, split, chunk, squeeze and unsqueeze take PyTorch's `dim=` beside `axis=`, on Tensors
    (netcl.ops and the methods) and Nodes, with the same results; both names at once are refused."""
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x = Tensor.from_host(queue, a)
    n = ag.tensor(x)
    np.testing.assert_array_equal(ag.cat([n, n], dim=1).numpy(), np.concatenate([a, a], 1))
    np.testing.assert_array_equal(ag.stack([n, n], dim=1).numpy(), np.stack([a, a], 1))
    np.testing.assert_array_equal(ops.concat([x, x], dim=2).to_host(), np.concatenate([a, a], 2))
    np.testing.assert_array_equal(ops.stack([x, x], dim=-1).to_host(), np.stack([a, a], -1))
    for parts in (ops.split(x, 3, dim=-1), ops.chunk(x, 2, dim=-1), n.split(3, dim=-1), n.chunk(2, dim=-1)):
        got = [p.to_host() if isinstance(p, Tensor) else p.numpy() for p in parts]
        np.testing.assert_array_equal(np.concatenate(got, -1), a)
    assert x.unsqueeze(dim=0).shape == (1, 2, 3, 4) and n.unsqueeze(dim=-1).shape == (2, 3, 4, 1)
    assert x.reshape(1, 24).squeeze(dim=0).shape == (24,)
    assert ag.tensor(x.reshape(1, 24)).squeeze(dim=0).shape == (24,)
    with pytest.raises(TypeError, match="one argument"):
        ops.concat([x, x], axis=0, dim=1)
