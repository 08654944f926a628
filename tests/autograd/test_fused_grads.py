"""The fused weight + bias gradient launch (matmul_rowsum), launch-argument reuse on repeat calls, and a
tensor's gradients from several readers summed in the last reader's own launch (engine.partial_gradient)."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import profiling
from netcl.core.tensor import Tensor
from netcl.ops import gemm as mm
from netcl.profiling import count_launches
from tests.reference import assert_close


@pytest.mark.parametrize(
    "m,n,k,a_transposed",
    [(17, 33, 7, True), (10, 130, 600, True), (33, 17, 130, False), (3, 5, 1, True)],
)
def test_matmul_rowsum_matches_numpy(queue, rng, m, n, k, a_transposed):
    a_np = rng.standard_normal((m, k)).astype(np.float32)
    b_np = rng.standard_normal((k, n)).astype(np.float32)
    # a as the transposed view the weight gradient passes (g^T), or row-major
    a = Tensor.from_host(queue, np.ascontiguousarray(a_np.T)).transpose(0, 1) if a_transposed else (
        Tensor.from_host(queue, a_np)
    )
    b = Tensor.from_host(queue, b_np)
    out, rowsum = mm.matmul_rowsum(a, b)
    atol = 1e-5 * np.sqrt(k)  # float32 sums of k standard-normal products
    assert_close(out, a_np.astype(np.float64) @ b_np.astype(np.float64), np.float32, atol=atol)
    if rowsum is None:  # a problem the CPU GEMM does not take: the caller sums itself
        assert mm.choose_variant(queue.device, m, n, k) != "cpu" or queue.device.capabilities.kind != "cpu"
    else:
        assert rowsum.shape == (m,)
        assert_close(rowsum, a_np.astype(np.float64).sum(axis=1), np.float32, atol=atol)


def test_linear_backward_bias_grad_fused(queue, rng):
    x_np = rng.standard_normal((37, 40)).astype(np.float32)
    w_np = rng.standard_normal((36, 40)).astype(np.float32)
    b_np = rng.standard_normal(36).astype(np.float32)
    g_np = rng.standard_normal((37, 36)).astype(np.float32)
    x = ag.tensor(Tensor.from_host(queue, x_np), requires_grad=True)
    w = ag.tensor(Tensor.from_host(queue, w_np), requires_grad=True)
    b = ag.tensor(Tensor.from_host(queue, b_np), requires_grad=True)
    with ag.Tape() as tape:
        y = ag.linear(x, w, b, activation="relu")
    z = x_np.astype(np.float64) @ w_np.T.astype(np.float64) + b_np
    gz = np.where(z > 0, g_np, 0.0)
    with count_launches() as c:
        tape.backward(y, Tensor.from_host(queue, g_np))
    assert_close(x.grad, gz @ w_np.astype(np.float64), np.float32)
    assert_close(w.grad, gz.T @ x_np.astype(np.float64), np.float32)
    assert_close(b.grad, gz.sum(axis=0), np.float32)
    if queue.device.capabilities.kind == "cpu":
        assert c.count <= 3  # relu mask, grad x, grad w with the bias grad


def test_repeat_launch_with_changed_scalars(queue, rng):
    """Kernels skip re-setting by-value args equal to the last launch: changed sizes must still apply."""
    for m, n, k in [(20, 24, 16), (20, 24, 16), (21, 24, 16), (20, 25, 17), (20, 24, 16)]:
        a_np = rng.standard_normal((m, k)).astype(np.float32)
        b_np = rng.standard_normal((k, n)).astype(np.float32)
        out = mm.matmul(Tensor.from_host(queue, a_np), Tensor.from_host(queue, b_np))
        assert_close(out, a_np.astype(np.float64) @ b_np.astype(np.float64), np.float32)


def _mlp_grads_numpy(x, w1, b1, w2, b2, g):
    z1 = x @ w1.T + b1
    h = np.maximum(z1, 0)
    gh = g @ w2
    gz1 = np.where(z1 > 0, gh, 0.0)
    return {"w2": g.T @ h, "b2": g.sum(0), "w1": gz1.T @ x, "b1": gz1.sum(0), "x": gz1 @ w1}


def test_relu_mask_folded_into_next_layers_grad_gemm(queue, rng):
    """linear -> relu -> linear: the relu backward runs inside the second layer's grad-input GEMM."""
    shapes = {"x": (40, 36), "w1": (48, 36), "b1": (48,), "w2": (33, 48), "b2": (33,), "g": (40, 33)}
    npv = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    nodes = {k: ag.tensor(Tensor.from_host(queue, v), requires_grad=True) for k, v in npv.items() if k != "g"}
    with ag.Tape() as tape:
        h = ag.linear(nodes["x"], nodes["w1"], nodes["b1"], activation="relu")
        y = ag.linear(h, nodes["w2"], nodes["b2"])
    with count_launches() as c, profiling.profile() as prof:
        tape.backward(y, Tensor.from_host(queue, npv["g"]))
        queue.finish()
    ref = _mlp_grads_numpy(*(npv[k].astype(np.float64) for k in ("x", "w1", "b1", "w2", "b2", "g")))
    for k, want in ref.items():
        assert_close(nodes[k].grad, want, np.float32, atol=1e-4, err_msg=k)
    # on any device the mask is no elementwise launch of its own (a GPU: the GEMM epilogue's MASK_RESIDUAL)
    assert "ew" not in {r.name for r in prof.rows()}, [r.name for r in prof.rows()]
    if queue.device.capabilities.kind == "cpu":
        assert c.count == 4  # per layer: grad x (masked for layer 1's relu), grad W with grad b


def test_relu_mask_applied_when_gradient_is_summed(queue, rng):
    """Two consumers of one relu output: their gradients are summed (the fold's tag is lost) and the
    mask is applied again, which is harmless (idempotent)."""
    x_np = rng.standard_normal((20, 36)).astype(np.float32)
    w_np = rng.standard_normal((40, 36)).astype(np.float32)
    v_np = rng.standard_normal((34, 40)).astype(np.float32)
    g_np = rng.standard_normal((20, 34)).astype(np.float32)
    w = ag.tensor(Tensor.from_host(queue, w_np), requires_grad=True)
    v = ag.tensor(Tensor.from_host(queue, v_np), requires_grad=True)
    with ag.Tape() as tape:
        h = ag.linear(ag.tensor(Tensor.from_host(queue, x_np)), w, activation="relu")
        y = ag.linear(h, v) + ag.linear(h, v)
    tape.backward(y, Tensor.from_host(queue, g_np))
    z = x_np.astype(np.float64) @ w_np.T.astype(np.float64)
    gz = np.where(z > 0, 2 * g_np @ v_np.astype(np.float64), 0.0)
    assert_close(w.grad, gz.T @ x_np.astype(np.float64), np.float32, atol=1e-4)


def _three_readers(queue, npv, op="linear"):
    """x (batch, positions, features) read by three linear layers (attention's q, k and v), or three
    matmuls x @ w^T, each output weighted by a constant and summed: the backward of that sum, with x's
    gradient and the weights'."""
    nodes = {k: ag.tensor(Tensor.from_host(queue, npv[k]), requires_grad=True)
             for k in ("x", "wq", "wk", "wv")}

    def product(x, w):
        return ag.linear(x, w) if op == "linear" else ag.matmul(x, ag.transpose(w, 0, 1))

    with ag.Tape() as tape:
        terms = [ag.sum(product(nodes["x"], nodes[w]) * Tensor.from_host(queue, npv[c]))
                 for w, c in (("wq", "cq"), ("wk", "ck"), ("wv", "cv"))]
        loss = terms[0] + terms[1] + terms[2]
    with count_launches() as c:
        tape.backward(loss)
        queue.finish()
    return nodes, c.count


@pytest.mark.parametrize("op", ["linear", "matmul"])
def test_input_gradient_summed_in_the_gemm_epilogue(queue, rng, monkeypatch, op):
    """A tensor read by several linear layers (or matmuls): each one's input-gradient GEMM adds the gradient
    summed so far in its epilogue (engine.partial_gradient), the same bits as the separate adds in float32,
    one launch fewer here, and float64 NumPy's gradients."""
    from netcl.autograd import engine

    shapes = {"x": (3, 11, 24), "wq": (16, 24), "wk": (8, 24), "wv": (8, 24),
              "cq": (3, 11, 16), "ck": (3, 11, 8), "cv": (3, 11, 8)}
    npv = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    fused, launches = _three_readers(queue, npv, op)
    x64 = npv["x"].astype(np.float64)
    want_x = sum(npv[c].astype(np.float64) @ npv[w].astype(np.float64)
                 for w, c in (("wq", "cq"), ("wk", "ck"), ("wv", "cv")))
    assert_close(fused["x"].grad, want_x, np.float32, atol=1e-4)
    for w, c in (("wq", "cq"), ("wk", "ck"), ("wv", "cv")):
        want = np.einsum("bsn,bsk->nk", npv[c].astype(np.float64), x64)
        assert_close(fused[w].grad, want, np.float32, atol=1e-4, err_msg=w)
    monkeypatch.setattr(engine, "SUMS", False)  # the separate adds, as before
    separate, launches_before = _three_readers(queue, npv, op)
    for k in ("x", "wq", "wk", "wv"):
        np.testing.assert_array_equal(fused[k].grad.to_host(), separate[k].grad.to_host(), err_msg=k)
    assert launches == launches_before - 1  # (the separate adds fused into one launch of x + y + z)


def test_matmul_adds_the_gradient_so_far_where_a_is_broadcast(queue, rng):
    """a broadcast over b's batch (its gradient a sum over that batch) or a 1-D a: the gradient so far is
    added after the sum, against float64."""
    for a_shape, b_shape in (((5, 6), (4, 6, 3)), ((6,), (6, 3))):
        a_np = rng.standard_normal(a_shape).astype(np.float32)
        b_np = rng.standard_normal(b_shape).astype(np.float32)
        w_np = rng.standard_normal((7, a_shape[-1])).astype(np.float32)
        a = ag.tensor(Tensor.from_host(queue, a_np), requires_grad=True)
        b = ag.tensor(Tensor.from_host(queue, b_np))
        w = ag.tensor(Tensor.from_host(queue, w_np))
        with ag.Tape() as tape:  # a read by a linear layer too (its gradient realized: offered to matmul)
            loss = ag.sum(ag.linear(a, w)) + ag.sum(ag.matmul(a, b))
        tape.backward(loss)
        a64, b64 = a_np.astype(np.float64), b_np.astype(np.float64)
        want = np.broadcast_to(w_np.astype(np.float64).sum(0), a_shape).copy()
        ga = np.ones((a64 @ b64).shape) @ np.swapaxes(b64, -1, -2)  # summed over b's batch below
        want += ga.reshape((-1,) + a_shape).sum(0)
        assert_close(a.grad, want, np.float32, atol=1e-4, err_msg=str(a_shape))


def test_partial_gradient_only_inside_a_summing_rule(queue):
    """partial_gradient is None outside a rule, inside a rule recorded without sums=True, and for a partial
    of another dtype; a summing rule that runs after another reader of its input gets that gradient once, and
    the pass stores the rule's gradient (which includes it) as the sum."""
    from netcl import ops
    from netcl.autograd import engine

    assert engine.partial_gradient(0, (4,), np.dtype(np.float32), queue) is None
    taken = []
    for first_summing in (True, False):
        x = ag.tensor(Tensor.from_host(queue, np.arange(4, dtype=np.float32)), requires_grad=True)
        seen = []

        def op(node, summing, seen=seen):
            def backward(g):
                wrong = engine.partial_gradient(0, (4,), np.dtype(np.float64), queue)
                prev = engine.partial_gradient(0, (4,), np.dtype(np.float32), queue)
                seen.append((summing, wrong, prev))
                return [g.realize() if prev is None else ops.add(g, prev)]  # (a pending one is not offered)
            return engine.record(node.value, [node], backward, "probe", sums=summing)

        with ag.Tape() as tape:
            a, b = op(x, first_summing), op(x, not first_summing)
            loss = ag.sum(a * 2.0) + ag.sum(b * 3.0)
        tape.backward(loss)
        np.testing.assert_array_equal(x.grad.to_host(), np.full(4, 5.0, np.float32))
        assert len(seen) == 2 and all(wrong is None for _, wrong, _ in seen)
        assert all(prev is None for summing, _, prev in seen if not summing)
        taken += [prev for summing, _, prev in seen if summing and prev is not None]
    assert len(taken) == 1  # once, where the summing rule ran second


def test_transformer_block_backward_sums_in_its_launches(queue, rng, monkeypatch):
    """A pre-norm block's backward: x's and h's gradients (the residual stream, read by a norm and by a
    projection's residual epilogue) and the q/k/v and gate/up inputs' (read by several projections) summed in
    the norms' and the GEMMs' own launches: no elementwise add launch remains, the same bits as with every
    sum an add of its own (whose gradients the transformer tests check against references)."""
    from netcl.autograd import engine
    from netcl.nn.transformer import RoPE, TransformerBlock

    dim, heads, b, s = 32, 4, 2, 7
    x_np = rng.standard_normal((b, s, dim)).astype(np.float32)
    c_np = rng.standard_normal((b, s, dim)).astype(np.float32)

    def run():
        from netcl.ops import random

        random.manual_seed(3)
        block = TransformerBlock(queue, dim, heads, 48, n_kv_heads=2, rope=RoPE(queue, dim // heads, 16))
        x = ag.tensor(Tensor.from_host(queue, x_np), requires_grad=True)
        with ag.Tape() as tape:
            loss = ag.sum(block(x) * Tensor.from_host(queue, c_np))
        with profiling.profile() as prof:
            tape.backward(loss)
            queue.finish()
        grads = {name: p.grad.to_host() for name, p in block.named_parameters()}
        grads["x"] = x.grad.to_host()
        return grads, prof.rows(by="kernel")

    fused, rows = run()
    monkeypatch.setattr(engine, "SUMS", False)
    separate, rows_before = run()
    for name, g in separate.items():
        np.testing.assert_array_equal(fused[name], g, err_msg=name)
    ew = {r.name: r.calls for r in rows}.get("ew", 0)
    ew_before = {r.name: r.calls for r in rows_before}.get("ew", 0)
    assert ew == ew_before - 4  # (per block: q/k/v's inputs, gate/up's, and the two residual sums)
