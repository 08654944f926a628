"""Mixed precision: optimizers with float32 master weights for half parameters (against PyTorch on the
float32 masters), clipping and losses on half inputs (against their float32 paths), autocast's policy,
GradScaler against torch.amp.GradScaler on injected overflow, and a graph-recorded AMP step against the
eager one, bit for bit."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import netcl.autograd as ag
from netcl import amp, ops, optim
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, NetclError
from netcl.graph import Graph
from netcl.nn import Linear, ReLU, Sequential

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
HALVES = pytest.mark.parametrize("dt", [F16, BF16], ids=["float16", "bfloat16"])


def _ulp(dt: np.dtype) -> float:
    return 2.0**-7 if dt == BF16 else 2.0**-10


def _assert_rounded_from(half: np.ndarray, master: np.ndarray) -> None:
    """`half` is `master` rounded to its dtype: equal to NumPy's rounding but for a double-rounding tie
    (the master itself differs from PyTorch's by a float32 ulp), never more than one half ulp off."""
    want = master.astype(half.dtype).astype(np.float64)
    got = half.astype(np.float64)
    assert (np.abs(got - want) <= np.abs(want) * _ulp(half.dtype) + 1e-30).all()
    assert (got == want).mean() > 0.95


OPTIMIZERS = {
    "sgd_momentum": (lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01),
                     lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01)),
    "adamw": (lambda ps: optim.AdamW(ps, lr=1e-2), lambda ps: torch.optim.AdamW(ps, lr=1e-2)),
    "rmsprop": (lambda ps: optim.RMSprop(ps, lr=1e-2, centered=True, momentum=0.5),
                lambda ps: torch.optim.RMSprop(ps, lr=1e-2, centered=True, momentum=0.5)),
}


@HALVES
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_half_parameters_keep_float32_master_weights(queue, rng, dt, name):
    """Two half parameters of odd sizes in one launch: the float32 master follows PyTorch's float32 update
    on the same (half) gradients, the state is float32, and the parameter is the master rounded."""
    make, make_torch = OPTIMIZERS[name]
    w0 = [rng.standard_normal(s).astype(np.float32).astype(dt) for s in ((7, 3), (130,))]
    params = [ag.Parameter(Tensor.from_host(queue, w)) for w in w0]
    opt = make(params)
    tparams = [torch.tensor(w.astype(np.float32), requires_grad=True) for w in w0]
    topt = make_torch(tparams)
    for _ in range(3):
        for p, tp in zip(params, tparams):
            g = rng.standard_normal(p.shape).astype(dt)
            p.grad = Tensor.from_host(queue, g)
            tp.grad = torch.tensor(g.astype(np.float32))
        opt.step()
        topt.step()
    for p, tp in zip(params, tparams):
        st = opt.state[id(p)]
        assert st["master"].dtype == np.float32 and all(
            st[k].dtype == np.float32 for k in opt.slot_names if st.get(k) is not None)
        np.testing.assert_allclose(st["master"].to_host(), tp.detach().numpy(), rtol=2e-6, atol=2e-7)
        assert p.value.dtype == dt
        _assert_rounded_from(p.value.to_host(), st["master"].to_host())


def test_master_weights_survive_state_dict(queue, rng):
    p = ag.Parameter(Tensor.from_host(queue, rng.standard_normal(9).astype(F16)))
    opt = optim.Adam([p], lr=0.1)
    p.grad = Tensor.from_host(queue, rng.standard_normal(9).astype(F16))
    opt.step()
    sd = opt.state_dict()
    assert sd["state"][0]["master"].dtype == np.float32
    q = ag.Parameter(Tensor.from_host(queue, p.value.to_host()))
    opt2 = optim.Adam([q], lr=0.1)
    opt2.load_state_dict(sd)
    g = Tensor.from_host(queue, rng.standard_normal(9).astype(F16))
    p.grad, q.grad = g, g
    opt.step()
    opt2.step()
    assert np.array_equal(opt.state[id(p)]["master"].to_host(), opt2.state[id(q)]["master"].to_host())
    f32 = ag.Parameter(Tensor.from_host(queue, np.ones(9, np.float32)))
    with pytest.raises(ValueError, match="'master' weights, kept only for float16/bfloat16"):
        optim.Adam([f32]).load_state_dict(sd)


@HALVES
def test_clip_grad_norm_on_half_gradients(queue, rng, dt):
    gs = [rng.standard_normal(s).astype(dt) * 3 for s in ((5, 7), (301,))]
    ps = [ag.Parameter(Tensor.from_host(queue, np.zeros(g.shape, dt))) for g in gs]
    for p, g in zip(ps, gs):
        p.grad = Tensor.from_host(queue, g)
    norm = optim.clip_grad_norm_(ps, 1.0)
    want = np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in gs))
    assert norm.dtype == np.float32
    np.testing.assert_allclose(norm.to_host()[0], want, rtol=1e-6)
    coef = 1.0 / (want + 1e-6)
    for p, g in zip(ps, gs):
        _assert_rounded_from(p.grad.to_host(), (g.astype(np.float64) * coef).astype(np.float32))


@HALVES
def test_losses_take_half_inputs_and_return_float32(queue, rng, dt):
    """Cross-entropy on half logits = the float32 path on the same values (a float32 loss), and the
    logits' gradient is that float32 gradient rounded to the half dtype."""
    x = (rng.standard_normal((6, 11)) * 3).astype(dt)
    y = rng.integers(0, 11, 6).astype(np.int32)
    y[2] = -100
    grads, losses = {}, {}
    for kind, arr in (("half", x), ("f32", x.astype(np.float32))):
        with ag.Tape() as tape:
            node = ag.tensor(Tensor.from_host(queue, arr), requires_grad=True)
            loss = ag.cross_entropy(node, Tensor.from_host(queue, y), label_smoothing=0.1)
        tape.backward(loss)
        losses[kind], grads[kind] = loss, node.grad
    assert losses["half"].value.dtype == np.float32
    np.testing.assert_allclose(losses["half"].value.to_host(), losses["f32"].value.to_host(), rtol=1e-6)
    assert grads["half"].dtype == dt
    _assert_rounded_from(grads["half"].to_host(), grads["f32"].to_host())
    a = rng.standard_normal((4, 9)).astype(dt)
    b = rng.standard_normal((4, 9)).astype(dt)
    for fn in (ag.mse, ag.smooth_l1, ag.binary_cross_entropy_with_logits):
        half = fn(Tensor.from_host(queue, a), Tensor.from_host(queue, b))
        full = fn(
            Tensor.from_host(queue, a.astype(np.float32)), Tensor.from_host(queue, b.astype(np.float32))
        )
        assert half.value.dtype == np.float32
        np.testing.assert_allclose(half.value.to_host(), full.value.to_host(), rtol=1e-6)


def test_autocast_runs_linear_in_float16_and_softmax_in_float32(queue, rng):
    model = Sequential(Linear(queue, 13, 17), ReLU(), Linear(queue, 17, 5))
    x = Tensor.from_host(queue, rng.standard_normal((9, 13)).astype(np.float32))
    y = Tensor.from_host(queue, rng.integers(0, 5, 9).astype(np.int32))
    with ag.Tape() as tape:
        ref_logits = model(ag.tensor(x))
        ref = ag.cross_entropy(ref_logits, y)
    tape.backward(ref)
    ref_grads = [p.grad.to_host() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    with amp.autocast("float16"), ag.Tape() as tape:
        assert amp.autocast_dtype() == F16
        logits = model(ag.tensor(x))
        sm = ag.softmax(logits)
        loss = ag.cross_entropy(logits, y)
    tape.backward(loss)
    assert amp.autocast_dtype() is None
    assert logits.value.dtype == F16 and sm.value.dtype == np.float32 and loss.value.dtype == np.float32
    np.testing.assert_allclose(logits.value.to_host().astype(np.float32), ref_logits.value.to_host(),
                               rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(loss.value.to_host(), ref.value.to_host(), rtol=5e-3)
    for p, want in zip(model.parameters(), ref_grads):
        assert p.value.dtype == np.float32 and p.grad.dtype == np.float32  # parameters stay float32
        np.testing.assert_allclose(p.grad.to_host(), want, rtol=2e-2, atol=2e-3)
    for p in model.parameters():
        p.grad = None
    # bfloat16: GEMMs on matrix units where the device has them, else float32 products rounded once
    with amp.autocast("bfloat16"), ag.Tape() as tape:
        logits = model(ag.tensor(x))
        loss = ag.cross_entropy(logits, y)
        with amp.autocast("float16", enabled=False):
            assert amp.autocast_dtype() is None
    tape.backward(loss)
    assert logits.value.dtype == BF16 and loss.value.dtype == np.float32
    np.testing.assert_allclose(logits.value.to_host().astype(np.float32), ref_logits.value.to_host(),
                               rtol=3e-2, atol=3e-2)
    for p, want in zip(model.parameters(), ref_grads):
        assert p.grad.dtype == np.float32
        np.testing.assert_allclose(p.grad.to_host(), want, rtol=6e-2, atol=1e-2)


def test_autocast_refuses_other_dtypes():
    for bad in ("float32", "int8", np.float64, 3):
        with pytest.raises(DTypeError, match="autocast: dtype must be 'float16' or 'bfloat16'"):
            amp.autocast(bad)
    with pytest.raises(ValueError, match="give one or more of"):
        amp.policy.allow("conv2d", "float32")


def test_pytorch_spellings_of_autocast_and_grad_scaler(queue, rng):
    """torch.autocast("cuda", ...) and GradScaler("cuda") pass a device type first: netcl's error says its
    first argument is the dtype (the scale), the device being the tensors' own. autocast as a decorator
    (PyTorch's @autocast() on a forward) runs each call under it (it was "object is not callable")."""
    with pytest.raises(DTypeError, match=r"got 'cuda' \(PyTorch's autocast takes a device type first.*"
                                         r"autocast\('float16'\)"):
        amp.autocast("cuda")
    with pytest.raises(TypeError, match=r"init_scale must be a number, got str 'cuda' \(PyTorch's"):
        amp.GradScaler("cuda")
    layer = Linear(queue, 4, 3)
    x = ag.tensor(Tensor.from_host(queue, rng.standard_normal((2, 4)).astype(np.float32)))

    @amp.autocast("bfloat16")
    def forward(x):
        """forward's docstring"""
        return layer(x)

    assert forward(x).value.dtype == ml_dtypes.bfloat16 and forward.__doc__ == "forward's docstring"
    assert layer(x).value.dtype == np.float32 and amp.autocast_dtype() is None  # (only inside the call)
    with pytest.raises(TypeError, match="autocast used as a decorator takes a function, got int"):
        amp.autocast()(3)


def _sgd_pair(queue):
    w = np.array([1.0, -2.0, 0.5], np.float32)
    p = ag.Parameter(Tensor.from_host(queue, w))
    tp = torch.nn.Parameter(torch.tensor(w))
    return p, optim.SGD([p], lr=0.1), tp, torch.optim.SGD([tp], lr=0.1)


@pytest.mark.parametrize("sync", [False, True])
def test_grad_scaler_skips_and_recovers_like_torch(queue, sync):
    """Injected inf gradients: the step is skipped (parameters unchanged), the scale backs off; after
    growth_interval clean steps it grows; the sequence of scales and parameters equals PyTorch's."""
    p, opt, tp, topt = _sgd_pair(queue)
    scaler = amp.GradScaler(init_scale=8.0, growth_interval=2, sync=sync)
    tscaler = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=2)
    for bad in (0, 1, 0, 0, 0, 1, 1, 0):
        with ag.Tape() as tape:
            loss = ag.sum(ag.mul(p, 2.0))
        tape.backward(scaler.scale(loss))
        tscaler.scale((tp * 2).sum()).backward()
        if bad:
            g = p.grad.to_host()
            g[1] = np.inf if bad else g[1]
            p.grad = Tensor.from_host(queue, g)
            tp.grad[1] = float("inf")
        before = p.value.to_host()
        scaler.step(opt)
        tscaler.step(topt)
        if bad:
            assert np.array_equal(p.value.to_host(), before)  # skipped on the device
            assert int(scaler.found_inf(opt).to_host()[0]) == 1
        scaler.update()
        tscaler.update()
        assert scaler.get_scale() == tscaler.get_scale()
        np.testing.assert_array_equal(p.value.to_host(), tp.detach().numpy())
        opt.zero_grad()
        topt.zero_grad()
    assert scaler.state_dict() == tscaler.state_dict()


def test_grad_scaler_state_dict_and_misuse(queue):
    p, opt, _, _ = _sgd_pair(queue)
    scaler = amp.GradScaler(init_scale=4.0, growth_interval=3)
    resumed = amp.GradScaler()
    resumed.load_state_dict(
        {
            "scale": 32.0,
            "growth_factor": 2.0,
            "backoff_factor": 0.25,
            "growth_interval": 3,
            "_growth_tracker": 2,
        }
    )
    assert resumed.get_scale() == 32.0 and resumed.get_backoff_factor() == 0.25
    with ag.Tape() as tape:
        loss = ag.sum(p)
    tape.backward(resumed.scale(loss))
    resumed.step(opt)
    resumed.update()  # third clean step since the saved tracker: grows
    assert resumed.state_dict()["scale"] == 64.0 and resumed.state_dict()["_growth_tracker"] == 0
    with pytest.raises(NetclError, match="scale\\(\\) was never called"):
        scaler.unscale_(opt)
    with ag.Tape() as tape:
        loss = ag.sum(p)
    tape.backward(scaler.scale(loss))
    scaler.unscale_(opt)
    with pytest.raises(NetclError, match="already been called"):
        scaler.unscale_(opt)
    for bad in ({"scale": -1.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 1,
                 "_growth_tracker": 0}, {"scale": 1.0}):
        with pytest.raises(ValueError):
            scaler.load_state_dict(bad)
    with pytest.raises(ValueError, match="backoff_factor must be a finite number in \\(0, 1\\)"):
        amp.GradScaler(backoff_factor=1.5)
    disabled = amp.GradScaler(enabled=False)
    assert disabled.scale(loss) is loss and disabled.state_dict() == {}


def _amp_step(model, opt, scaler, xs, ys):
    with amp.autocast("float16"), ag.Tape() as tape:
        loss = ag.cross_entropy(model(ag.tensor(xs)), ag.tensor(ys))
    tape.backward(scaler.scale(loss))
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    return loss


def test_graph_recorded_amp_step_equals_eager(queue):
    """Five AMP steps (float16 autocast, GradScaler, AdamW), one of them overflowing, replayed from a
    recording equal the same steps run eagerly, bit for bit: parameters, optimizer state and scale."""
    rng = np.random.default_rng(7)
    batches = [rng.standard_normal((8, 6)).astype(np.float32) for _ in range(6)]
    batches[3][0, 0] = 1e6  # above float16's range: inf in the autocast GEMM, a skipped step
    labels = rng.integers(0, 4, 8).astype(np.int32)
    runs = []
    for mode in ("eager", "graph"):
        model = Sequential(Linear(queue, 6, 16), ReLU(), Linear(queue, 16, 4))
        for p, v in zip(model.parameters(), np.random.default_rng(1).standard_normal((4, 16 * 6))):
            p.value.copy_from_host(v[: p.value.size].reshape(p.value.shape).astype(np.float32) * 0.3)
        opt = optim.AdamW(model.parameters(), lr=1e-2)
        scaler = amp.GradScaler(init_scale=1024.0, growth_interval=2)
        xs = Tensor.from_host(queue, batches[0])
        ys = Tensor.from_host(queue, labels)
        if mode == "eager":
            for b in batches:
                xs.copy_from_host(b)
                _amp_step(model, opt, scaler, xs, ys)
        else:
            graph = Graph()
            with graph.capture():
                _amp_step(model, opt, scaler, xs, ys)
            for b in batches[1:]:
                xs.copy_from_host(b)
                graph.replay()
        runs.append(
            (
                [p.value.to_host() for p in model.parameters()],
                [opt.state[id(p)]["exp_avg_sq"].to_host() for p in model.parameters()],
                scaler.get_scale(),
            )
        )
    (pe, se, scale_e), (pg, sg, scale_g) = runs
    assert scale_e == scale_g == 2048.0  # 1024: grew at steps 1 and 5, backed off at step 3
    for a, b in zip(pe + se, pg + sg):
        assert np.array_equal(a, b)


def test_netcl_half_knob_and_native_choice(monkeypatch, device, queue):
    from netcl import config, kernels

    monkeypatch.setenv("NETCL_HALF", "fast")
    with pytest.raises(ValueError, match="NETCL_HALF='fast': expected auto, off, storage or native"):
        config.half_mode()
    # no kernel family has a native-half variant yet: every mode computes float16 in float32
    for mode in ("auto", "storage", "native", "off"):
        monkeypatch.setenv("NETCL_HALF", mode)
        assert kernels.half_math(device, "elementwise") == "storage"
    # a family measured faster on this device: native only where the fp16 probe passes, never for storage/off
    monkeypatch.setitem(kernels.NATIVE_HALF_FAMILIES, "elementwise", (device.device_name,))
    for mode, want in (("auto", "native"), ("native", "native"), ("storage", "storage"), ("off", "storage")):
        monkeypatch.setenv("NETCL_HALF", mode)
        assert kernels.half_math(device, "elementwise") == (want if device.fp16 else "storage")
    monkeypatch.setenv("NETCL_HALF", "off")  # mixed precision off: autocast runs float32
    lin = Linear(queue, 3, 2)
    with amp.autocast("float16"):
        assert amp.autocast_dtype() is None
        assert lin(ag.tensor(Tensor.from_host(queue, np.ones((1, 3), np.float32)))).value.dtype == np.float32


def test_policy_allow_is_the_one_call(monkeypatch):
    from netcl.autograd import autocast as hook

    monkeypatch.setitem(amp.policy.TABLE, "my_op", ("half", ()))
    monkeypatch.setitem(hook.POLICY, "my_op", hook.Rule("half"))
    with amp.autocast("bfloat16"):
        assert hook.target("my_op") == np.float32  # no bfloat16 path: half inputs widened to float32
        amp.policy.allow("my_op", "bfloat16")
        assert hook.target("my_op") == BF16
        assert hook.target("softmax") == np.float32 and hook.target("not_in_table") is None
    assert hook.target("my_op") is None  # outside autocast


def test_autocast_casts_a_parameter_once_per_block(queue, rng):
    """A layer applied twice in one block shares one cast of its weight (its gradient is the sum over both
    uses, equal to the float32 run's within half rounding); a new block casts afresh."""
    from netcl.autograd import autocast as hook

    lin = Linear(queue, 11, 11)
    x = Tensor.from_host(queue, rng.standard_normal((6, 11)).astype(np.float32))
    grads = {}
    for mode in ("float32", "float16"):
        for p in lin.parameters():
            p.grad = None
        with amp.autocast("float16", enabled=mode == "float16"), ag.Tape() as tape:
            loss = ag.sum(lin(ag.relu(lin(ag.tensor(x)))))
            if mode == "float16":
                w16 = hook.cast_inputs("linear", lin.weight)[0]
                assert w16.dtype == F16 and hook.cast_inputs("linear", lin.weight)[0] is w16
        tape.backward(loss)
        grads[mode] = [p.grad.to_host() for p in lin.parameters()]
    with amp.autocast("float16"):
        assert hook.cast_inputs("linear", lin.weight)[0] is not w16
        with ag.Tape():  # one block around two steps: each tape casts afresh (the weights change between)
            first = hook.cast_inputs("linear", lin.weight)[0]
            assert hook.cast_inputs("linear", lin.weight)[0] is first
        with ag.Tape():
            assert hook.cast_inputs("linear", lin.weight)[0] is not first
    for got, want in zip(grads["float16"], grads["float32"]):
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


def test_autocast_conv_pool_norms_and_residual_in_half(queue, rng):
    """Under autocast float16 and bfloat16: conv2d, max pooling, the row norms and the transformer's
    linear_residual (its residual too) store half; a float32 value used by two ops is cast once; parameter
    gradients stay float32 and near the float32 run's."""
    from netcl.autograd import autocast as hook
    from netcl.nn import Conv2d, MaxPool2d, RMSNorm

    # the parameters from a fixed seed (not from whatever earlier tests drew): max pooling picks each window's
    # largest value, and a near-tie that float16 or bfloat16 rounding reorders sends that window's gradient
    # elsewhere (a valid result, not the float32 one); the margin is checked below
    ops.random.manual_seed(7)
    conv, pool, norm_ = Conv2d(queue, 3, 4, 3, padding=1), MaxPool2d(2), RMSNorm(queue, 5)
    lin = Linear(queue, 5, 5)
    x = Tensor.from_host(queue, rng.standard_normal((2, 3, 6, 5)).astype(np.float32))
    windows = conv(ag.tensor(x)).value.to_host()[:, :, :6, :4].reshape(2, 4, 3, 2, 2, 2).swapaxes(3, 4)
    top2 = np.sort(windows.reshape(2, 4, 3, 2, 4), axis=-1)[..., -2:]
    assert (top2[..., 1] - top2[..., 0]).min() > 2 ** -6 * np.abs(top2).max()  # 4 bfloat16 half-ulps
    params = [*conv.parameters(), *norm_.parameters(), *lin.parameters()]
    ref = None
    for mode in ("float32", "float16", "bfloat16"):
        for p in params:
            p.grad = None
        with amp.autocast("float16" if mode == "float32" else mode, enabled=mode != "float32"), \
                ag.Tape() as tape:
            y = pool(conv(ag.tensor(x)))                                 # (2, 4, 3, 2)
            h = ag.reshape(y, (2, 4, 6))[:, :, :5]                       # float32 residual below
            h32 = ag.cast(h, np.float32)
            out = ag.linear_residual(norm_(h32), lin.weight, lin.bias, h32)
            loss = ag.sum(out * out)
            if mode != "float32":  # the norm's and the residual's cast of h32: one node
                assert hook.cast_inputs("rms_norm", h32)[0] is hook.cast_inputs("linear_residual", h32)[0]
        half = np.float32 if mode == "float32" else (F16 if mode == "float16" else BF16)
        assert y.dtype == half and out.dtype == half
        tape.backward(loss)
        grads = [p.grad.to_host() for p in params]
        assert all(p.grad.dtype == np.float32 for p in params)
        if ref is None:
            ref = grads
            continue
        for got, want in zip(grads, ref):
            np.testing.assert_allclose(got, want, rtol=0.1, atol=0.05 * np.abs(want).max())


def test_fused_kernel_inputs_are_freed_without_the_garbage_collector(queue, rng):
    """The JIT's flatten once kept a fused kernel's inputs in a reference cycle (a closure naming itself):
    a step's activations then lived until the garbage collector ran, which doubled measured peaks."""
    import gc
    import weakref

    x = Tensor.from_host(queue, rng.standard_normal(37).astype(np.float32))
    gc.collect()
    gc.disable()
    try:
        y = ops.gelu(x * 2.0 + 1.0).realize()
        ref = weakref.ref(x)
        del x, y
        assert ref() is None
    finally:
        gc.enable()


@HALVES
def test_autocast_row_norms_keep_float32_parameters(queue, rng, dt):
    """Under autocast the row norms cast only x (as batch norm): the float32 weight and bias are read as they
    are, with no cast launch either way, and their gradients are the norm's float32 sums, bit for bit the
    op's own on the half input (before: the parameters cast to half in the forward and again in the
    backward, the gradients rounded to half and cast back)."""
    from netcl.nn import LayerNorm, RMSNorm
    from netcl.ops import norm as Nm
    from netcl.profiling import count_launches

    x = Tensor.from_host(queue, rng.standard_normal((4, 7, 24)).astype(np.float32))
    gy = rng.standard_normal((4, 7, 24)).astype(dt)
    for norm_ in (LayerNorm(queue, 24), RMSNorm(queue, 24)):
        for p in norm_.parameters():
            p.value.copy_from_host(rng.standard_normal(24).astype(np.float32))
        with amp.autocast(dt), ag.Tape() as tape:
            with count_launches() as c:
                y = norm_(ag.tensor(x))
        assert y.dtype == dt
        assert c.count == 2  # x's cast and the norm: the parameters are not cast
        with count_launches() as c:
            tape.backward(y, Tensor.from_host(queue, gy))
        params = list(norm_.parameters())
        assert all(p.grad.dtype == np.float32 for p in params)
        xh = ops.cast(x, dt)
        if isinstance(norm_, RMSNorm):
            _, rstd = Nm.rms_norm(xh, 24, params[0].value, norm_.eps)
            want = Nm.rms_norm_backward(Tensor.from_host(queue, gy), xh, 24, rstd, params[0].value)[1:]
        else:
            _, mean, rstd = Nm.layer_norm(xh, 24, params[0].value, params[1].value, norm_.eps)
            want = Nm.layer_norm_backward(Tensor.from_host(queue, gy), xh, 24, mean, rstd, params[0].value,
                                          params[1].value)[1:]
        for p, w in zip(params, want):
            np.testing.assert_array_equal(p.grad.to_host(), w.to_host())


@HALVES
def test_autocast_weight_gradients_are_float32_sums(device, queue, rng, dt):
    """A float32 Linear and linear_residual under autocast: the weight and bias gradients come from the half
    operands' float32 sums (netcl.ops.gemm.matmul_wide), passed through their casts unchanged, not a half
    product rounded and widened again: float32's tolerance against float64. bfloat16 without matrix units
    runs through float32; on matrix units the weight gradient (300 tokens) splits K and the split's
    reduction writes float32; float16's CPU GEMM stores half: there the half product widened, at its
    tolerance."""
    from netcl.ops.gemm.variants import uses_matrix_units

    tol = 1e-5 if dt == BF16 or uses_matrix_units(device, dt) else 2.0**-10
    x = rng.standard_normal((3, 100, 24)).astype(np.float32)
    gy = rng.standard_normal((3, 100, 10)).astype(dt)
    xh = x.astype(dt).astype(np.float64).reshape(-1, 24)
    g64 = gy.astype(np.float64).reshape(-1, 10)
    lin = Linear(queue, 24, 10)
    res = Tensor.from_host(queue, rng.standard_normal((3, 100, 10)).astype(np.float32))
    for residual in (False, True):
        lin.zero_grad()
        with amp.autocast(dt), ag.Tape() as tape:
            xn = ag.tensor(Tensor.from_host(queue, x))
            y = (ag.linear_residual(xn, lin.weight, lin.bias, ag.tensor(res)) if residual
                 else lin(xn))
        tape.backward(y, Tensor.from_host(queue, gy))
        for p, want in ((lin.weight, g64.T @ xh), (lin.bias, g64.sum(0))):
            assert p.grad.dtype == np.float32
            np.testing.assert_allclose(p.grad.to_host(), want, rtol=0, atol=tol * np.abs(want).max())
