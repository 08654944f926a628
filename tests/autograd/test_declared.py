"""Every declared op's generated surface (netcl.ops.declaration -> the op on Nodes of netcl.autograd.declared,
Tensor's and Node's methods, netcl.amp.policy's row, netcl.nn.functional's names), its gradient against
finite differences, and that a declaration is all a new op needs to get every surface."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.nn.functional as F
from netcl import amp, ops, profiling
from netcl.autograd import autocast, declared
from netcl.autograd.engine import Node
from netcl.core.tensor import Tensor
from netcl.ops import declaration
from netcl.ops.declaration import OpDecl
from netcl.ops.operators import ELEMENTWISE_METHODS, REDUCE_METHODS, TENSOR_ONLY_METHODS, declared_methods
from tests.autograd.gradcheck import check_grads

R = np.random.default_rng(27)

# The autocast table as netcl/amp/policy.py wrote it by hand before the declarations (b5c65c0): generated
# from them now, it must say the same for every op.
HAND_WRITTEN_TABLE = {
    "matmul": ("half", ("float16", "bfloat16")),
    "linear": ("half", ("float16", "bfloat16")),
    "conv2d": ("half", ("float16", "bfloat16")),
    "flash_attention": ("half", ("float16", "bfloat16")),
    "softmax": ("float32", ()),
    "log_softmax": ("float32", ()),
    "batch_norm": ("half", ("float16", "bfloat16")),
    "layer_norm": ("half", ("float16", "bfloat16")),
    "group_norm": ("half", ("float16", "bfloat16")),
    "rms_norm": ("half", ("float16", "bfloat16")),
    "linear_residual": ("half", ("float16", "bfloat16")),
}
# nn.functional's names of the declared ops, as its hand-written list had them (the rest of it stays so)
HAND_WRITTEN_FUNCTIONAL = {"adaptive_avg_pool2d", "avg_pool2d", "batch_norm", "conv2d", "group_norm",
                           "layer_norm", "linear", "log_softmax", "max_pool2d", "rms_norm", "softmax",
                           "embedding", "cross_entropy", "nll", "nll_loss", "mse", "mse_loss", "l1",
                           "l1_loss", "smooth_l1", "smooth_l1_loss", "binary_cross_entropy_with_logits"}


def rnd(*shape: int) -> np.ndarray:
    return R.standard_normal(shape)


def _attention_inputs() -> list[np.ndarray]:
    return [rnd(1, 2, 3, 4), rnd(1, 1, 5, 4), rnd(1, 1, 5, 4)]


def _labels(queue):
    return (Tensor.from_host(queue, np.array([2, 0, 3, -100, 1], np.int32)),)


def _rope_tables(queue):
    return ops.rope_tables(queue, 8, 4, dtype=np.float64)


# op -> (function of Nodes, float64 inputs[, constants made on the queue]): a finite-difference check of each
CASES = {
    "reshape": (lambda x: ag.reshape(x, 6, -1) * x.reshape((4, 6)).transpose(0, 1), [rnd(2, 3, 4)]),
    "permute": (lambda x: ag.permute(x, (2, 0, 1)) * x.permute(2, 0, 1), [rnd(2, 3, 4)]),
    "transpose": (lambda x: ag.transpose(x, (0, 2, 1)) * x.transpose(2, 0, 1).transpose(1, 0, 2)
                  * x.transpose(0, -1).transpose(0, 2).transpose(dim0=1, dim1=2),
                  [rnd(2, 3, 4)]),
    "squeeze": (lambda x: ag.squeeze(x, 1), [rnd(3, 1, 4)]),
    "unsqueeze": (lambda x: x.unsqueeze(0) * 2.0, [rnd(3, 4)]),
    "expand": (lambda x: ag.expand(x, 2, 3, 4), [rnd(3, 1)]),
    "swapaxes": (lambda x: ag.swapaxes(x, 0, 2) * x.swapaxes(-1, 0), [rnd(2, 3, 4)]),
    "moveaxis": (lambda x: ag.moveaxis(x, 0, -1) * x.movedim((1, 2), (0, 1)), [rnd(2, 3, 4)]),
    "ravel": (lambda x: x.transpose(0, 1).ravel() * 2.0, [rnd(3, 4)]),
    "expand_dims": (lambda x: ag.expand_dims(x, (0, -1)) * 3.0, [rnd(3, 4)]),
    "sort": (lambda x: x.sort(dim=0, descending=True).values * ag.sort(x, axis=-1),
             [R.permutation(12).reshape(3, 4) / 4.0]),
    "getitem": (lambda x: x[1:, ::2] * x[0, ::2], [rnd(3, 5)]),
    "rope": (lambda x, cos, sin: ag.rope(ag.permute(x, (0, 2, 1, 3)), cos, sin, pairing="interleaved"),
             [rnd(1, 5, 2, 4)], _rope_tables),
    "embedding": (lambda w, ids: ag.embedding(w, ids), [rnd(4, 3)],
                  lambda q: (Tensor.from_host(q, np.array([[1, 3, 1], [0, 3, 3]], np.int64)),)),
    "cross_entropy": (lambda x, y: ag.cross_entropy(x, y, label_smoothing=0.1), [rnd(5, 4)], _labels),
    "nll": (lambda x, y: ag.nll_loss(x, y, reduction="sum"), [rnd(5, 4)], _labels),
    "mse": (lambda a, b: ag.mse(a, b), [rnd(3, 4), rnd(3, 4)]),
    "l1": (lambda a, b: ag.l1_loss(a, b, reduction="none"), [rnd(3, 4), rnd(3, 4)]),
    "smooth_l1": (lambda a, b: ag.smooth_l1(a, b, beta=0.7), [rnd(3, 4), rnd(3, 4)]),
    "binary_cross_entropy_with_logits": (lambda a, b: ag.binary_cross_entropy_with_logits(a, b),
                                         [rnd(3, 4), R.uniform(size=(3, 4))]),
    "matmul": (lambda a, b: ag.matmul(a, b), [rnd(2, 3, 4), rnd(4, 5)]),
    "linear": (lambda x, w, b: ag.linear(x, w, b, activation="relu"), [rnd(5, 3), rnd(4, 3), rnd(4)]),
    "linear_residual": (lambda x, w, b, r: ag.linear_residual(x, w, b, r),
                        [rnd(2, 3, 4), rnd(5, 4), rnd(5), rnd(2, 3, 5)]),
    "conv2d": (lambda x, w, b: ag.conv2d(x, w, b, stride=2, padding=1),
               [rnd(2, 3, 5, 6), rnd(4, 3, 3, 3), rnd(4)]),
    "max_pool2d": (lambda x: ag.max_pool2d(x, 3, stride=2, padding=1),
                   [R.permutation(2 * 3 * 5 * 6).reshape(2, 3, 5, 6) / 10.0]),
    "avg_pool2d": (lambda x: ag.avg_pool2d(x, 2, padding=1, count_include_pad=False), [rnd(1, 2, 5, 5)]),
    "adaptive_avg_pool2d": (lambda x: ag.adaptive_avg_pool2d(x, (2, 3)), [rnd(1, 2, 5, 7)]),
    "batch_norm": (lambda x, w: ag.batch_norm(x, w, None, None, None, True), [rnd(4, 3, 2, 3), rnd(3)]),
    "layer_norm": (lambda x, b: ag.layer_norm(x, 5, None, b), [rnd(3, 5), rnd(5)]),
    "group_norm": (lambda x: ag.group_norm(x, 2), [rnd(2, 4, 3)]),
    "rms_norm": (lambda x, w: ag.rms_norm(x, (2, 3), w), [rnd(4, 2, 3), rnd(2, 3)]),
    "softmax": (lambda x: ag.softmax(x, dim=0), [rnd(3, 4)]),
    "sum": (lambda x: x.sum(dim=(0, 2), keepdim=True), [rnd(2, 3, 4)]),
    "max": (lambda x: x.max(dim=1).values, [R.permutation(12).reshape(3, 4) / 4.0]),
    "min": (lambda x: ag.min(x, axis=(0, 1)), [R.permutation(12).reshape(3, 4) / 4.0]),
    "mean": (lambda x: ag.mean(x, axis=1), [rnd(2, 3, 4)]),
    "var": (lambda x: ag.var(x, axis=-1, ddof=1), [rnd(3, 5)]),
    "logsumexp": (lambda x: x.logsumexp(), [rnd(3, 5)]),
    "log_softmax": (lambda x: x.log_softmax(1), [rnd(3, 4)]),
    "flash_attention": (lambda q, k, v: ag.flash_attention(q, k, v, causal=True), _attention_inputs()),
}


def _differentiable() -> list[OpDecl]:
    return [d for d in declaration.declared() if d.autograd != "none"]


def test_every_declared_op_has_a_gradient_check_here():
    assert set(CASES) == {d.name for d in _differentiable()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_of_each_declared_op(queue, name):
    fn, inputs, *constants = CASES[name]
    extra = constants[0](queue) if constants else ()
    check_grads(queue, fn, inputs, rtol=1e-5, atol=1e-7, extra=extra)


def test_the_autocast_table_is_the_hand_written_one():
    assert amp.policy.TABLE == HAND_WRITTEN_TABLE
    for op, (rule, dtypes) in HAND_WRITTEN_TABLE.items():
        assert autocast.POLICY[op] == autocast.Rule(rule, frozenset(dtypes)), op


@pytest.mark.parametrize("decl", _differentiable(), ids=lambda d: d.name)
def test_each_declared_op_has_every_surface(decl):
    op = declared.OPS[decl.name]
    assert getattr(ag, decl.name) is op and decl.name in ag.__all__
    for name in decl.functional:
        assert getattr(F, name) is op and name in F.__all__, name
    for name in decl.methods:
        assert getattr(Node, name) is op, name
        assert callable(getattr(Tensor, name)), name
    if decl.autograd == "generated":
        hidden = (*decl.hide, "needs")  # needs: filled by the op
        want = [(p.name, p.kind, p.default) for p in decl.parameters().values() if p.name not in hidden]
        got = inspect.signature(op).parameters.values()
        assert [(p.name, p.kind, p.default) for p in got] == want  # a method's self: x
        assert all("Node" in str(p.annotation) for p in got if p.name in decl.inputs)
        assert op.__name__ == decl.name and "def backward(g)" in declared.source(decl.name)


def test_functional_names_are_what_they_were():
    named = {n for d in declaration.declared() for n in d.functional}
    assert named == HAND_WRITTEN_FUNCTIONAL
    assert HAND_WRITTEN_FUNCTIONAL <= set(F.__all__)


def test_tensor_and_node_method_lists_cannot_disagree():
    """Every method name declared anywhere is both Tensor's and Node's; the lists do not overlap."""
    lists = [ELEMENTWISE_METHODS, REDUCE_METHODS, declared_methods(), TENSOR_ONLY_METHODS]
    names = [n for names in lists for n in names]
    assert len(names) == len(set(names)), names
    for name in ELEMENTWISE_METHODS + REDUCE_METHODS + declared_methods():
        assert callable(getattr(Tensor, name)) and callable(getattr(Node, name)), name


def test_a_declared_method_computes_the_same_bits_on_tensor_and_node(queue):
    a = Tensor.from_host(queue, rnd(3, 5).astype(np.float32))
    b = Tensor.from_host(queue, rnd(5, 2).astype(np.float32))
    np.testing.assert_array_equal(a.matmul(b).to_host(), ag.tensor(a).matmul(ag.tensor(b)).value.to_host())
    np.testing.assert_array_equal(a.softmax(dim=0).to_host(), ag.tensor(a).softmax(dim=0).value.to_host())


def test_backward_launches_are_labelled_with_the_op(queue):
    x = ag.tensor(Tensor.from_host(queue, rnd(2, 3, 6, 6).astype(np.float32)), requires_grad=True)
    with profiling.profile() as prof:
        with ag.Tape() as tape:
            loss = ag.max_pool2d(ag.layer_norm(x, 6), 2).sum()
        tape.backward(loss)
        queue.finish()
    names = {r.name for r in prof.rows("op")}
    assert {"layer_norm", "max_pool2d", "layer_norm.backward", "max_pool2d.backward"} <= names, names


# -- a new op: its declaration is all it needs --------------------------------------------------------------
def _toy_scale(x: Tensor, w: Tensor | None = None, alpha: float = 2.0) -> Tensor:
    """alpha * x (* w)."""
    return ops.mul(x, alpha) if w is None else ops.mul(ops.mul(x, w), alpha)


def _toy_scale_backward(grad_out: Tensor, x: Tensor, w: Tensor | None, alpha: float,
                        needs: tuple[bool, ...]) -> tuple[Tensor, Tensor | None]:
    gx = ops.mul(grad_out, alpha) if w is None else ops.mul(ops.mul(grad_out, w), alpha)
    gw = ops.mul(ops.mul(grad_out, x), alpha) if needs[1] else None
    return gx, gw


@pytest.fixture
def toy_op():
    decl = declaration.declare(OpDecl("toy_scale", _toy_scale, _toy_scale_backward, inputs=("x", "w"),
                                      autocast="half", half_dtypes=("float16",), methods=("toy_scale",),
                                      functional=("toy_scale",)))
    try:
        yield decl
    finally:
        declaration.withdraw("toy_scale")


def test_a_declaration_gives_a_new_op_every_surface(queue, toy_op):
    op = ag.toy_scale
    assert F.toy_scale is op and Node.toy_scale is op and "toy_scale" in ag.__all__
    assert amp.policy.TABLE["toy_scale"] == ("half", ("float16",))
    assert list(inspect.signature(op).parameters) == ["x", "w", "alpha"]
    x_h, w_h = rnd(3, 4).astype(np.float32), rnd(3, 4).astype(np.float32)
    x, w = Tensor.from_host(queue, x_h), Tensor.from_host(queue, w_h)
    np.testing.assert_allclose(x.toy_scale(alpha=3.0).to_host(), 3 * x_h, rtol=1e-6)
    check_grads(queue, lambda x, w: op(x, w, alpha=0.5), [rnd(3, 4), rnd(3, 4)])
    check_grads(queue, lambda x: op(x), [rnd(2, 5)])  # w absent: one parent, one gradient
    check_grads(queue, lambda x, w: ag.tensor(x).toy_scale(w), [rnd(3, 4), rnd(3, 4)], wrt=[0])
    with amp.autocast("float16"):
        assert op(ag.tensor(x), w).dtype == np.float16
    with amp.autocast("bfloat16"):  # not a dtype it has: widened to float32
        assert op(ag.tensor(x), w).dtype == np.float32


def test_a_withdrawn_declaration_leaves_no_surface(toy_op):
    declaration.withdraw("toy_scale")
    try:
        for where in (ag, F, Node, Tensor):
            assert not hasattr(where, "toy_scale"), where
        assert "toy_scale" not in amp.policy.TABLE and "toy_scale" not in autocast.POLICY
        assert "toy_scale" not in ag.__all__ and "toy_scale" not in F.__all__
    finally:
        declaration.declare(toy_op)  # for the fixture's withdraw


def _toy_transpose(x: Tensor) -> Tensor:
    return x.transpose(0, 1).contiguous()


def _toy_transpose_backward(grad_out: Tensor, x_layout: declaration.Layout) -> Tensor:
    seen.append(x_layout)
    return grad_out.transpose(0, 1).contiguous()


seen: list = []


def test_a_backward_may_take_an_inputs_layout_instead_of_its_memory(queue):
    """`<input>_layout`: the input's shape, strides, dtype and queue, its memory not kept (rope's backward
    allocates its gradient in the input's order this way)."""
    import gc
    import weakref

    declaration.declare(OpDecl("toy_transpose", _toy_transpose, _toy_transpose_backward, inputs=("x",)))
    try:
        w = ag.tensor(Tensor.from_host(queue, rnd(4, 6).astype(np.float32)), requires_grad=True)
        with ag.Tape() as tape:
            x = ag.mul(w, 2.0)
            loss = ag.sum(ag.toy_transpose(x) * ag.tensor(Tensor.from_host(queue, rnd(6, 4).astype(
                np.float32))))
        x_value = weakref.ref(x.value)
        strides = x.value.strides
        del x
        gc.collect()
        assert x_value() is None  # neither the graph nor toy_transpose's rule kept it
        seen.clear()
        tape.backward(loss)
        (layout,) = seen
        assert (layout.shape, layout.strides, layout.dtype, layout.ndim) == ((4, 6), strides, np.float32, 2)
        assert layout.queue is queue and w.grad.shape == (4, 6)
    finally:
        declaration.withdraw("toy_transpose")


def test_bad_declarations_say_what_is_wrong():
    with pytest.raises(ValueError, match="declared twice"):
        declaration.declare(declaration.get("softmax"))
    with pytest.raises(ValueError, match=r"\['y'\] are not parameters of _toy_scale"):
        OpDecl("bad", _toy_scale, _toy_scale_backward, inputs=("x", "y"))
    with pytest.raises(ValueError, match="parameter 'scale' is none of"):
        OpDecl("bad", _toy_scale, lambda g, scale: g, inputs=("x",))
    with pytest.raises(ValueError, match="needs a backward"):
        OpDecl("bad", _toy_scale, inputs=("x",))
    with pytest.raises(ValueError, match="autocast must be"):
        OpDecl("bad", _toy_scale, _toy_scale_backward, inputs=("x",), autocast="float16")
    with pytest.raises(ValueError, match="returns its result alone"):
        OpDecl("bad", _toy_scale, _toy_scale_backward, inputs=("x",), saves=("s",), methods=("bad",))
    with pytest.raises(ValueError, match="replay is for a generated op"):
        OpDecl("bad", _toy_scale, _toy_scale_backward, inputs=("x",), autograd="manual", replay="netcl.ops")
    with pytest.raises(ValueError, match="replay is for a generated op"):
        OpDecl("bad", lambda x, *shape: x, lambda g: g, inputs=("x",), replay="netcl.ops")
    assert "bad" not in declared.OPS
