"""Optimizer updates against NumPy re-implementations of PyTorch's formulas, over several steps."""

from __future__ import annotations

import math

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import nn, optim
from netcl.core.tensor import Tensor
from netcl.profiling import count_launches

SHAPES = [(7, 3), (17,), (1,), (2, 3, 5)]


def _sgd(p, g, st, step, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
    g = g + weight_decay * p if weight_decay else g
    if momentum:
        buf = g.copy() if step == 1 else momentum * st["buf"] + (1 - dampening) * g
        st["buf"] = buf
        g = g + momentum * buf if nesterov else buf
    return p - lr * g


def _adam(p, g, st, step, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False, amsgrad=False):
    b1, b2 = betas
    if weight_decay:
        if decoupled:
            p = p * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * p
    st["m"] = st.get("m", 0) * b1 + (1 - b1) * g
    st["v"] = st.get("v", 0) * b2 + (1 - b2) * g * g
    bc1, bc2 = 1 - b1**step, 1 - b2**step
    v = st["v"]
    if amsgrad:   # PyTorch's max_exp_avg_sq: the largest v so far
        v = st["vmax"] = np.maximum(st.get("vmax", 0), st["v"])
    return p - lr / bc1 * st["m"] / (np.sqrt(v) / math.sqrt(bc2) + eps)


def _rmsprop(p, g, st, step, lr, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False):
    g = g + weight_decay * p if weight_decay else g
    st["sq"] = alpha * st.get("sq", 0) + (1 - alpha) * g * g
    if centered:
        st["ga"] = alpha * st.get("ga", 0) + (1 - alpha) * g
        avg = np.sqrt(st["sq"] - st["ga"] ** 2) + eps
    else:
        avg = np.sqrt(st["sq"]) + eps
    if momentum:
        st["buf"] = momentum * st.get("buf", 0) + g / avg
        return p - lr * st["buf"]
    return p - lr * g / avg


CASES = [
    (optim.SGD, _sgd, dict(lr=0.1)),
    (optim.SGD, _sgd, dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    (optim.SGD, _sgd, dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.02)),
    (optim.Momentum, _sgd, dict(lr=0.05, momentum=0.9)),
    (optim.Adam, _adam, dict(lr=0.01, weight_decay=0.05)),
    (
        optim.AdamW,
        lambda *a, **k: _adam(*a, decoupled=True, **k),
        dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1),
    ),
    (optim.Adam, _adam, dict(lr=0.01, betas=(0.5, 0.6), amsgrad=True)),
    (
        optim.AdamW,
        lambda *a, **k: _adam(*a, decoupled=True, **k),
        dict(lr=0.01, betas=(0.8, 0.7), weight_decay=0.1, amsgrad=True),
    ),
    (optim.RMSProp, _rmsprop, dict(lr=0.01)),
    (optim.RMSProp, _rmsprop, dict(lr=0.01, momentum=0.9, centered=True, weight_decay=0.01)),
    (optim.RMSProp, _rmsprop, dict(lr=0.01, momentum=0.5)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "cls,ref,hyper", CASES, ids=lambda v: getattr(v, "__name__", "") if callable(v) else ""
)
def test_matches_numpy_reference(queue, rng, dtype, cls, ref, hyper):
    host = [rng.standard_normal(s) for s in SHAPES]
    params = [ag.Parameter(Tensor.from_host(queue, h.astype(dtype))) for h in host]
    opt = cls(params, **hyper)
    states = [dict() for _ in host]
    want = [h.astype(dtype).astype(np.float64) for h in host]
    for step in range(1, 5):
        grads = [rng.standard_normal(s) for s in SHAPES]
        for p, g in zip(params, grads):
            p.grad = Tensor.from_host(queue, g.astype(dtype))
        opt.step()
        opt.zero_grad()
        want = [
            ref(w, g.astype(dtype).astype(np.float64), st, step, **hyper)
            for w, g, st in zip(want, grads, states)
        ]
    tol = dict(rtol=2e-5, atol=2e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-13)
    for p, w in zip(params, want):
        np.testing.assert_allclose(p.value.to_host(), w, **tol)


def test_one_launch_for_up_to_eight_parameters(queue, rng):
    params = [
        ag.Parameter(Tensor.from_host(queue, rng.standard_normal(s).astype(np.float32))) for s in SHAPES * 3
    ]
    for p in params:
        p.grad = Tensor.ones(queue, p.shape)
    opt = optim.AdamW(params)
    opt.step()  # makes the state
    with count_launches() as c:
        opt.step()
    assert c.count == 2  # 12 parameters: 8 + 4


def test_parameters_without_grad_are_skipped(queue):
    a = ag.Parameter(Tensor.ones(queue, (3,)))
    b = ag.Parameter(Tensor.ones(queue, (2,)))
    a.grad = Tensor.full(queue, (3,), 2.0)
    optim.SGD([a, b], lr=0.5).step()
    np.testing.assert_array_equal(a.value.to_host(), [0, 0, 0])
    np.testing.assert_array_equal(b.value.to_host(), [1, 1])


def test_step_takes_a_closure_and_returns_its_loss(queue, rng):
    """PyTorch's opt.step(closure): the closure computes the loss and gradients, step calls it first and
    returns what it returned (a TypeError before: step took no positional argument)."""
    theta0 = rng.standard_normal(5)
    p = ag.Parameter(Tensor.from_host(queue, theta0))
    opt = optim.SGD([p], lr=0.1, momentum=0.5)

    def closure():
        opt.zero_grad()
        with ag.Tape() as tape:
            loss = (p * p).sum()
        tape.backward(loss)
        return loss

    theta, buf, losses = theta0.copy(), np.zeros(5), []
    for i in range(3):
        losses.append(float(opt.step(closure).item()))
        assert losses[-1] == pytest.approx(float((theta**2).sum()), rel=1e-12)
        buf = 2 * theta if i == 0 else 0.5 * buf + 2 * theta
        theta = theta - 0.1 * buf
        np.testing.assert_allclose(p.value.to_host(), theta, rtol=1e-12)
    assert opt.step() is None
    with pytest.raises(TypeError, match="closure must be a function that computes the loss.*got float"):
        opt.step(0.1)


def test_state_is_found_by_the_parameter_as_in_pytorch(queue, rng):
    """PyTorch's `opt.state[p]['exp_avg']`: the state is keyed by id(p), and the parameter itself finds the
    same entry (it was a KeyError); a parameter that never had a gradient has none, also after a load."""
    used = ag.Parameter(Tensor.from_host(queue, rng.standard_normal(3)))
    unused = ag.Parameter(Tensor.ones(queue, (2,)))
    opt = optim.Adam([used, unused], lr=0.1)
    used.grad = Tensor.from_host(queue, rng.standard_normal(3))
    opt.step()
    loaded = optim.Adam([used, unused], lr=0.1)
    loaded.load_state_dict(opt.state_dict())
    for o in (opt, loaded):
        assert o.state[used] is o.state[id(used)] and o.state.get(used) is o.state[id(used)]
        assert used in o.state and unused not in o.state and o.state.get(unused) is None
        assert o.state[used]["step"] == 1
        np.testing.assert_allclose(o.state[used]["exp_avg"].to_host(), 0.1 * used.grad.to_host(), rtol=1e-12)
        with pytest.raises(KeyError):
            o.state[unused]


def test_param_groups_and_state_dict_round_trip(queue, rng):
    hosts = [rng.standard_normal((4, 3)), rng.standard_normal(5)]

    def make():
        ps = [ag.Parameter(Tensor.from_host(queue, h.astype(np.float32))) for h in hosts]
        return ps, optim.Adam([{"params": ps[:1]}, {"params": ps[1:], "lr": 0.1}], lr=0.01)

    grads = [[rng.standard_normal(h.shape).astype(np.float32) for h in hosts] for _ in range(4)]
    ps_a, opt_a = make()
    for gs in grads:
        for p, g in zip(ps_a, gs):
            p.grad = Tensor.from_host(queue, g)
        opt_a.step()
    ps_b, opt_b = make()
    for gs in grads[:2]:
        for p, g in zip(ps_b, gs):
            p.grad = Tensor.from_host(queue, g)
        opt_b.step()
    sd = opt_b.state_dict()
    assert sd["param_groups"][1]["lr"] == 0.1 and sd["state"][0]["step"] == 2
    ps_c, opt_c = make()
    for p, q in zip(ps_c, ps_b):
        p.value = q.value.clone()
    opt_c.load_state_dict(sd)
    for gs in grads[2:]:
        for p, g in zip(ps_c, gs):
            p.grad = Tensor.from_host(queue, g)
        opt_c.step()
    for p, q in zip(ps_a, ps_c):
        np.testing.assert_array_equal(p.value.to_host(), q.value.to_host())


def test_load_state_dict_rejects_wrong_shapes(queue):
    p = ag.Parameter(Tensor.ones(queue, (3,)))
    opt = optim.Adam([p])
    bad = {
        "state": {0: {"step": 1, "exp_avg": np.zeros(4), "exp_avg_sq": np.zeros(3)}},
        "param_groups": opt.state_dict()["param_groups"],
    }
    with pytest.raises(ValueError, match=r"exp_avg.*\(4,\).*\(3,\)"):
        opt.load_state_dict(bad)


def test_clip_grad_norm_over_many_chunked_gradients(queue, rng):
    """Eleven gradients (two launches of up to eight), three of them over several 16,384-element chunks and
    one empty: the norm and the scaled gradients against float64 NumPy, and the same bits on a second run."""
    shapes = [(3,), (40000,), (7, 5), (0,), (129, 257), (1,), (16384,), (16385,), (2, 3, 4), (600,), (5,)]
    grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    results = []
    for _ in range(2):
        params = [ag.Parameter(Tensor.zeros(queue, s, np.float32)) for s in shapes]
        for p, g in zip(params, grads):
            p.grad = Tensor.from_host(queue, g)
        norm = optim.clip_grad_norm_(params, max_norm=2.0).to_host()
        results.append((norm, [p.grad.to_host() for p in params]))
    total = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads))
    np.testing.assert_allclose(results[0][0], [total], rtol=1e-5)
    for got, g in zip(results[0][1], grads):
        np.testing.assert_allclose(got, g * (2.0 / (total + 1e-6)), rtol=1e-5, atol=1e-7)
    assert results[0][0].tobytes() == results[1][0].tobytes()
    assert all(a.tobytes() == b.tobytes() for a, b in zip(results[0][1], results[1][1]))


def test_invalid_hyperparameters():
    with pytest.raises(ValueError, match="Nesterov"):
        optim.SGD([ag.Parameter.__new__(ag.Parameter)], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="empty"):
        optim.Adam([])


def test_clip_grad_norm(queue, rng):
    grads = [rng.standard_normal(s) for s in SHAPES]
    params = [ag.Parameter(Tensor.zeros(queue, s, np.float64)) for s in SHAPES]
    for p, g in zip(params, grads):
        p.grad = Tensor.from_host(queue, g)
    total = math.sqrt(sum(float((g**2).sum()) for g in grads))
    norm = optim.clip_grad_norm_(params, max_norm=1.5)
    np.testing.assert_allclose(norm.to_host(), [total], rtol=1e-12)
    coef = 1.5 / (total + 1e-6)
    for p, g in zip(params, grads):
        np.testing.assert_allclose(p.grad.to_host(), g * coef, rtol=1e-12)
    # under the limit nothing changes
    norm2 = optim.clip_grad_norm_(params, max_norm=100.0)
    np.testing.assert_allclose(norm2.to_host(), [1.5], rtol=1e-6)
    for p, g in zip(params, grads):
        np.testing.assert_allclose(p.grad.to_host(), g * coef, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_clip_grad_norm_of_any_order_and_clip_grad_value(queue, rng, dtype):
    """PyTorch's other norms (norm_type 1, 3.5, inf: the largest |g|) and torch.nn.utils.clip_grad_value_,
    against float64 NumPy; both were missing (NotImplementedError, AttributeError). A parameter without a
    gradient is passed over; an empty gradient adds nothing."""
    shapes = [(4, 3), (0,), (17,), (1,)]
    grads = [(rng.standard_normal(s) * 3).astype(dtype) for s in shapes]
    tol = dict(rtol=1e-5, atol=1e-7) if dtype == np.float32 else dict(rtol=1e-12)

    def params():
        ps = [ag.Parameter(Tensor.zeros(queue, s, dtype)) for s in shapes + [(2,)]]
        for p, g in zip(ps, grads):
            p.grad = Tensor.from_host(queue, g)
        return ps

    flat = np.abs(np.concatenate([g.ravel() for g in grads]).astype(np.float64))
    for order, total in ((1, flat.sum()), (3.5, (flat**3.5).sum() ** (1 / 3.5)), (math.inf, flat.max())):
        for max_norm in (0.7, 1e4):
            ps = params()
            norm = optim.clip_grad_norm_(ps, max_norm, norm_type=order)
            assert norm.shape == (1,) and norm.dtype == dtype
            np.testing.assert_allclose(norm.to_host(), [total], **tol)
            coef = min(1.0, max_norm / (total + 1e-6))
            for p, g in zip(ps, grads):
                np.testing.assert_allclose(p.grad.to_host(), g * coef, **tol)
            assert ps[-1].grad is None
    ps = params()
    nn.utils.clip_grad_value_(ps, 0.5)
    for p, g in zip(ps, grads):
        np.testing.assert_array_equal(p.grad.to_host(), np.clip(g, -0.5, 0.5))
    with pytest.raises(ValueError, match="clip_value must be a number \\(not NaN\\) >= 0, got -1"):
        optim.clip_grad_value_(ps, -1)
    with pytest.raises(TypeError, match=r"parameters\[0\] is a Tensor, not a Parameter"):
        optim.clip_grad_value_([ps[0].grad], 1.0)


def test_step_computes_pending_readers_of_its_tensors_first(queue, rng):
    """A pending elementwise result (netcl.jit.lazy) reading a parameter or its state sees the values from
    before the step (the step writes them in place), and a pending gradient is computed before it is read."""
    a = rng.standard_normal((5, 3)).astype(np.float32)
    g = rng.standard_normal((5, 3)).astype(np.float32)
    p = ag.Parameter(Tensor.from_host(queue, a))
    opt = optim.Adam([p], lr=0.1)
    p.grad = Tensor.from_host(queue, g) * 1.0
    opt.step()  # the state exists from here
    st = {}
    want = _adam(a.astype(np.float64), g.astype(np.float64), st, 1, 0.1)
    np.testing.assert_allclose(p.value.to_host(), want, rtol=1e-5, atol=1e-6)
    p.grad = Tensor.from_host(queue, g) * 2.0
    old_p = p.value * 3.0
    old_m = opt.state[id(p)]["exp_avg"] * 1.0
    assert p.grad.is_pending and old_p.is_pending and old_m.is_pending  # (fusion is on in the suite)
    m_before = st["m"].copy()
    want2 = _adam(want, 2.0 * g.astype(np.float64), st, 2, 0.1)
    opt.step()
    np.testing.assert_allclose(old_p.to_host(), 3.0 * want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(old_m.to_host(), m_before, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(p.value.to_host(), want2, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["adamw", "sgd", "bfloat16"])
def test_step_memo_gives_the_slow_steps_bits(queue, monkeypatch, kind):
    """step() replays the last step's launches (Optimizer._memo_step) while the groups, parameters, values,
    state tensors and gradient layouts are the ones they were made for: over steps with a scheduler's lr, a
    parameter without a gradient for a step, zero_grad(set_to_none=False), a hyperparameter switched on that
    needs new state, a parameter given a new value and a state_dict loaded, every parameter and state the same
    bits as step() without the memo; the memo runs, and a bad hyperparameter is still refused."""
    shapes = [(7, 3), (17,), (5,), (2, 3, 4)]
    dt = np.float32 if kind != "bfloat16" else "bfloat16"

    def run(memo: bool):
        from netcl.optim import optimizer as optimizer_module

        monkeypatch.setattr(optimizer_module, "STEP_MEMO", memo)
        data = np.random.default_rng(11)

        def tensor(a):
            t = Tensor.from_host(queue, a.astype(np.float32))
            return t.to(dt).realize() if kind == "bfloat16" else t

        params = [ag.Parameter(tensor(data.standard_normal(s))) for s in shapes]
        if kind == "sgd":
            opt = optim.SGD([{"params": params[:2]}, {"params": params[2:], "lr": 0.05}], lr=0.1)
        else:
            opt = optim.AdamW([{"params": params[:2]}, {"params": params[2:], "lr": 3e-3}], lr=1e-2,
                              weight_decay=0.1)
        sched = optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        seen = []
        for step in range(9):
            for i, p in enumerate(params):
                if step == 3 and i == 1:
                    p.grad = None   # no gradient this step
                elif p.grad is not None and step == 5:
                    p.grad.fill_(0.25)   # zero_grad(set_to_none=False)'s kind of reuse
                else:
                    p.grad = tensor(data.standard_normal(p.value.shape))
            if step == 4 and kind == "sgd":
                opt.param_groups[1]["momentum"] = 0.9   # new state from here
            if step == 6:
                params[2].value = params[2].value.clone()   # a new value tensor
            if step == 7:
                opt.load_state_dict(opt.state_dict())
            opt.step()
            sched.step()
            for p in params:
                seen.append(p.value.to_host().tobytes())
                for t in opt.state[id(p)].values():
                    if isinstance(t, Tensor):
                        seen.append(t.to_host().tobytes())
        return seen, opt

    replays = []
    monkeypatch.setattr(optim.Optimizer, "_memo_step", lambda self, m: replays.append(True) or False)
    want, _ = run(False)
    assert not replays   # (STEP_MEMO off: never tried)
    monkeypatch.undo()
    real = optim.Optimizer._memo_step
    monkeypatch.setattr(optim.Optimizer, "_memo_step",
                        lambda self, m: replays.append(real(self, m)) or replays[-1])
    got, opt = run(True)
    assert got == want
    assert sum(replays) >= 3, replays
    opt.param_groups[0]["lr"] = -1.0
    with pytest.raises(ValueError, match="lr"):
        opt.step()


def test_a_state_dict_saved_before_amsgrad_loads(queue, rng):
    """Adam's amsgrad came after checkpoints were saved without it: such a group loads as amsgrad=False
    (what it did); one saved with amsgrad=True restores its max_exp_avg_sq."""
    for cls in (optim.Adam, optim.AdamW):
        p = ag.Parameter(Tensor.from_host(queue, rng.standard_normal(6).astype(np.float32)))
        opt = cls([p], lr=0.1, amsgrad=True)
        for _ in range(2):
            p.grad = Tensor.from_host(queue, rng.standard_normal(6).astype(np.float32))
            opt.step()
        saved = opt.state_dict()
        assert "max_exp_avg_sq" in saved["state"][0]
        old = {**saved, "param_groups": [{k: v for k, v in g.items() if k != "amsgrad"}
                                         for g in saved["param_groups"]],
               "state": {0: {k: v for k, v in saved["state"][0].items() if k != "max_exp_avg_sq"}}}
        fresh = cls([p], lr=0.1, amsgrad=True)
        fresh.load_state_dict(old)
        assert fresh.param_groups[0]["amsgrad"] is False
        again = cls([p], lr=0.1)
        again.load_state_dict(saved)
        assert again.param_groups[0]["amsgrad"] is True
        np.testing.assert_array_equal(again.state[id(p)]["max_exp_avg_sq"].to_host(),
                                      opt.state[id(p)]["max_exp_avg_sq"].to_host())
