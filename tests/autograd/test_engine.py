"""The tape: recording, reverse topological order, accumulation, no_grad, parameters across tapes."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.core.tensor import Tensor
from netcl.errors import DeviceMismatchError, DTypeError, NetclError, ShapeError


def _leaf(queue, arr, grad=True):
    return ag.tensor(Tensor.from_host(queue, np.asarray(arr, dtype=np.float64)), requires_grad=grad)


def test_reused_node_accumulates(queue):
    # y = x*x + x*3 + x: the leaf is used four times; dy/dx = 2x + 4
    x = _leaf(queue, [1.0, -2.0, 0.5])
    with ag.Tape() as tape:
        y = x * x + x * 3 + x
        loss = y.sum()
    tape.backward(loss)
    np.testing.assert_allclose(x.grad.to_host(), [6.0, 0.0, 5.0])


def test_diamond_graph_visits_each_node_once(queue):
    # a -> b, c (both from a) -> d = b * c; d/da = 2 * 3 * 2 a = 12 a... with b = 2a, c = 3a: d = 6 a^2
    a = _leaf(queue, [1.5, -1.0])
    with ag.Tape() as tape:
        b = a * 2
        c = a * 3
        d = (b * c).sum()
    tape.backward(d)
    np.testing.assert_allclose(a.grad.to_host(), 12 * np.array([1.5, -1.0]))


def test_parameter_grads_accumulate_across_tapes_until_zero_grad(queue):
    w = ag.Parameter(Tensor.from_host(queue, np.array([2.0, 3.0])))
    for _ in range(2):
        with ag.Tape() as tape:
            loss = (w * w).sum()
        tape.backward(loss)
    np.testing.assert_allclose(w.grad.to_host(), 2 * 2 * np.array([2.0, 3.0]))
    w.zero_grad()
    assert w.grad is None


def test_two_leaves_sharing_a_gradient_get_their_own_memory(queue):
    a, b = _leaf(queue, [1.0, 2.0]), _leaf(queue, [3.0, 4.0])
    with ag.Tape() as tape:
        loss = (a + b).sum()
    tape.backward(loss)
    assert a.grad.storage is not b.grad.storage
    a.grad.fill_(7.0)
    np.testing.assert_allclose(b.grad.to_host(), [1.0, 1.0])


def test_no_grad_and_outside_tape_record_nothing(queue):
    x = _leaf(queue, [1.0, 2.0])
    y = x * 2  # outside a tape
    assert not y.requires_grad and y.is_leaf
    with ag.Tape():
        with ag.no_grad():
            z = x * 2
    assert not z.requires_grad

    @ag.no_grad()
    def f(v):
        return v * 3

    with ag.Tape():
        assert not f(x).requires_grad
        assert (x * 3).requires_grad


def test_saved_tensors_are_freed_and_second_backward_refuses(queue):
    x = _leaf(queue, [1.0, 2.0])
    with ag.Tape() as tape:
        y = x.exp()
        loss = y.sum()
    tape.backward(loss)
    assert y.grad_fn.freed and y.grad_fn.backward is None and y.grad_fn.parents == ()
    with pytest.raises(NetclError, match="already differentiated"):
        tape.backward(loss)


def test_backward_errors(queue):
    x = _leaf(queue, [1.0, 2.0])
    with ag.Tape() as tape:
        y = x * 2
    with pytest.raises(ShapeError, match="one-element"):
        tape.backward(y)
    const = ag.tensor(Tensor.ones(queue, (1,)))
    with pytest.raises(NetclError, match="does not require grad"):
        tape.backward(const)
    with pytest.raises(TypeError, match="netcl Tensor"):
        ag.tensor(np.ones(3))


def test_a_custom_ops_mistakes_are_named(queue):
    """What a user's ag.record op gets wrong: a rule's bare Tensor was read as len(tensor) gradients
    ("returned 3 gradients for 1 inputs", or a wrong shape from iterating its rows), one Node for parents as
    its rows, a NumPy or Node gradient failed with AttributeError '_pending', a rule returning None with
    'no len()'."""
    def run(value, parents, backward, x):
        with ag.Tape() as tape:
            loss = ag.record(value(x), parents(x), backward, "square").sum()
        tape.backward(loss)
        return x.grad

    def square(x):
        return x.value * x.value

    def one(x):
        return (x,)

    for shape in ((3,), (1, 2)):
        row = _leaf(queue, np.ones(shape))
        with pytest.raises(NetclError, match=r"square returned a Tensor of shape \(\d.*\(grad,\) for one"):
            run(square, one, lambda g, row=row: g * 2 * row.value, row)
    x = _leaf(queue, [1.0, 2.0, 3.0])
    cases = [
        (square, one, lambda g: None, NetclError, "square returned None, not one gradient per input"),
        (square, one, lambda g: ((g * 2 * x.value).to_host(),), TypeError,
         r"returned a ndarray of shape \(3,\) as the gradient of input 0; a gradient is a netcl Tensor"),
        (square, one, lambda g: (ag.tensor(g),), TypeError, r"a Node of shape .*its \.value"),
        (square, lambda x: x, lambda g: (g,), TypeError, r"parents is a sequence .*one Node; write \(x,\)"),
        (square, lambda x: (x.value,), lambda g: (g,), TypeError, "parent 0 is a Tensor, not a Node"),
        (lambda x: x * x, one, lambda g: (g,), TypeError, r"value is .* Tensor, got Node .*\.value"),
        (square, one, None, TypeError, "backward is a function of the output's gradient"),
    ]
    for value, parents, backward, error, words in cases:
        with pytest.raises(error, match=words):
            run(value, parents, backward, x)
    x.zero_grad()
    np.testing.assert_array_equal(run(square, one, lambda g: [g * 2 * x.value], x).to_host(),
                                  [2.0, 4.0, 6.0])  # a list is one gradient per parent too


def test_seeded_backward_and_retain_grad(queue):
    x = _leaf(queue, [1.0, 2.0, 3.0])
    with ag.Tape() as tape:
        y = (x * x).retain_grad()
        z = y * 2
    tape.backward(z, Tensor.from_host(queue, np.array([1.0, 0.5, -1.0])))
    np.testing.assert_allclose(y.grad.to_host(), [2.0, 1.0, -2.0])
    np.testing.assert_allclose(x.grad.to_host(), [4.0, 4.0, -12.0])


def test_gradient_returns_without_touching_grad(queue):
    x = _leaf(queue, [1.0, 2.0])
    with ag.Tape() as tape:
        loss = (x * x).sum()
    (g,) = tape.gradient(loss, [x])
    np.testing.assert_allclose(g.to_host(), [2.0, 4.0])
    assert x.grad is None


def test_deep_chain_does_not_recurse(queue):
    x = _leaf(queue, [1.0])
    with ag.Tape() as tape:
        y = x
        for _ in range(3000):
            y = y + 0.0
        loss = y.sum()
    tape.backward(loss)
    np.testing.assert_allclose(x.grad.to_host(), [1.0])


def _shared_intermediate(queue):
    x = ag.tensor(Tensor.from_host(queue, np.array([1.0, 2.0], np.float32)), requires_grad=True)
    with ag.Tape() as tape:
        h = x * 2
        y = ag.sum(h)
        z = ag.sum(h * 3)
    return x, tape, y, z


def test_backward_through_a_freed_intermediate_raises_and_retain_graph_allows_it(queue):
    """PyTorch's rule: the first backward frees what the rules saved; a second backward that reaches a
    freed node is an error (it used to return x.grad from the first pass only), unless retain_graph."""
    x, tape, y, z = _shared_intermediate(queue)
    tape.backward(y)
    with pytest.raises(NetclError, match="retain_graph=True"):
        tape.backward(z)
    np.testing.assert_array_equal(x.grad.to_host(), [2.0, 2.0])  # the refused pass changed nothing
    x, tape, y, z = _shared_intermediate(queue)
    tape.backward(y, retain_graph=True)
    tape.backward(z)
    np.testing.assert_array_equal(x.grad.to_host(), [8.0, 8.0])


def test_a_forward_output_lives_while_the_user_or_a_rule_holds_it(queue):
    """PyTorch's rule: the graph holds no output. h = x @ w, which no rule saves (matmul's saves x and
    w, sum's nothing), goes when the user lets go of it, before backward; u = exp(a), which matmul's rule
    saves, lives until that rule (and exp's) ran, then goes during the pass, or stays with retain_graph. (A
    Node used to hold its parents, so every forward output lived until backward, and the pass held every
    node until it ended.)"""
    import gc
    import weakref

    x = _leaf(queue, np.ones((3, 4)))
    w = _leaf(queue, np.full((4, 5), 0.5))
    with ag.Tape() as tape:
        h = ag.matmul(x, w)
        loss = ag.sum(h)
    h_value = weakref.ref(h.value)
    del h
    gc.collect()
    assert h_value() is None
    tape.backward(loss)
    np.testing.assert_array_equal(x.grad.to_host(), np.full((3, 4), 2.5))

    for retain in (False, True):
        a = _leaf(queue, np.zeros((3, 4)))
        with ag.Tape() as tape:
            u = ag.exp(a)
            loss = ag.sum(ag.matmul(u, w))
        u_value = weakref.ref(u.value)
        del u
        gc.collect()
        assert u_value() is not None  # matmul's rule saved it
        seen = []
        a.register_post_accumulate_grad_hook(
            lambda node, seen=seen, u_value=u_value: (gc.collect(), seen.append(u_value() is None)))
        tape.backward(loss, retain_graph=retain)
        assert seen == [not retain]
        np.testing.assert_array_equal(a.grad.to_host(), np.full((3, 4), 2.5))


def test_rules_keep_only_what_they_read(queue):
    """A linear layer without relu keeps x and W, not its output (its rule read `out` only for relu's mask,
    but held it always); rope keeps its input's layout, not its memory (it allocates the gradient in the
    input's order). Both outputs went unfreed until backward: q and k before their rotation, every
    projection's output."""
    import gc
    import weakref

    from netcl import ops

    x = _leaf(queue, np.ones((6, 4)))
    w = _leaf(queue, np.full((8, 4), 0.25))
    cos, sin = ops.rope_tables(queue, 8, 4, dtype=np.float64)
    with ag.Tape() as tape:
        h = ag.linear(x, w)
        q = ag.permute(ag.reshape(h, (1, 6, 2, 4)), (0, 2, 1, 3))
        loss = ag.sum(ag.rope(q, cos, sin))
    h_value = weakref.ref(h.value)
    del h, q
    gc.collect()
    assert h_value() is None
    tape.backward(loss)
    assert x.grad.shape == (6, 4) and w.grad.shape == (8, 4)
    with ag.Tape() as tape:
        h = ag.linear(x, w, activation="relu")
        loss = ag.sum(h)
    h_value = weakref.ref(h.value)
    del h
    gc.collect()
    assert h_value() is not None  # relu's mask reads it


def test_only_floating_tensors_require_grad(queue):
    ints = Tensor.from_host(queue, np.array([1, 2], np.int32))
    with pytest.raises(DTypeError, match="only floating-point tensors can require gradients, got int32"):
        ag.tensor(ints, requires_grad=True)
    with pytest.raises(DTypeError, match="floating"):
        ag.Parameter(ints)
    node = ag.tensor(ints)
    with pytest.raises(DTypeError, match="floating"):
        ag.tensor(node, requires_grad=True)
    x = ag.tensor(Tensor.from_host(queue, np.array([1.0], np.float32)), requires_grad=True)
    with ag.Tape() as tape:
        y = x * 2
    with pytest.raises(DTypeError, match="grad must be floating point"):
        tape.backward(y, ints[:1])


def test_a_gradient_on_another_queue_is_refused(queue, device):
    """The rules ran on the gradient's queue and left x.grad there, silently; PyTorch refuses a gradient on
    another device. Moved explicitly, it gives the same gradient on the output's queue."""
    x = ag.tensor(Tensor.from_host(queue, np.array([1.0, 2.0, 3.0], np.float32)), requires_grad=True)
    other = device.new_queue()
    seed = Tensor.from_host(other, np.array([1.0, 0.5, 2.0], np.float32))
    with ag.Tape() as tape:
        y = x * 2
    with pytest.raises(DeviceMismatchError, match=r"grad is on another queue of the same device; move it "
                                                   r"first, grad.to\(output.queue\)"):
        tape.backward(y, seed, retain_graph=True)
    with pytest.raises(DeviceMismatchError, match="another queue"):
        y.backward(seed, retain_graph=True)
    assert x.grad is None  # refused before any rule ran
    tape.backward(y, seed.to(y.queue))
    assert x.grad.queue is queue and np.array_equal(x.grad.to_host(), [2.0, 1.0, 4.0])


def test_gradient_of_intermediate_nodes_and_its_errors(queue):
    x = ag.tensor(Tensor.from_host(queue, np.array([1.0, 2.0, 3.0], np.float32)), requires_grad=True)
    with ag.Tape() as tape:
        h = x * x
        y = ag.sum(h * 2)
    gx, gh = tape.gradient(y, [x, h], retain_graph=True)
    np.testing.assert_array_equal(gx.to_host(), [4.0, 8.0, 12.0])
    np.testing.assert_array_equal(gh.to_host(), [2.0, 2.0, 2.0])
    assert x.grad is None and h.grad is None  # returned, not accumulated
    const = ag.tensor(Tensor.from_host(queue, np.ones(3, np.float32)))
    with pytest.raises(NetclError, match="does not require grad"):
        tape.gradient(y, [const])
    w = ag.tensor(Tensor.from_host(queue, np.ones(1, np.float32)), requires_grad=True)
    with pytest.raises(NetclError, match="not used in computing the loss"):
        tape.gradient(y, [w])
    assert tape.gradient(y, [x, w], allow_unused=True)[1] is None
