"""Mixed-precision kernels under Oclgrind: bfloat16/float16 storage in generated elementwise and reduction
kernels (vector and strided paths), optim.cl with float32 master weights and the found-inf flag, the
GradScaler kernels (unscale_grads over several gradients of odd sizes with atomics, update_scale), clipping
and losses on half inputs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import netcl.autograd as ag
from netcl import amp, ops, optim
from netcl.ops import update
from tests.oclgrind.cases import close, dev, oclgrind_only, strided

pytestmark = oclgrind_only
BF16 = np.dtype(ml_dtypes.bfloat16)
HALVES = pytest.mark.parametrize("dt", [np.dtype(np.float16), BF16], ids=["float16", "bfloat16"])


def half_pair(queue, rng, dt, shape):
    """The same random values on the device in half storage `dt` and in float32."""
    a = rng.standard_normal(shape).astype(np.float32).astype(dt)
    return dev(queue, a), dev(queue, a.astype(np.float32))


def close_to_float32(h, f, tol):
    """A half result against its float32 path: relative `tol`, absolute `tol` x the largest value."""
    close(h.to_host().astype(np.float32), f.to_host(), tol, tol * float(np.abs(f.to_host()).max()))


@HALVES
def test_half_elementwise_and_reductions(queue, dt):
    rng = np.random.default_rng(21)
    a = rng.standard_normal((5, 37)).astype(np.float32)
    x = dev(queue, a.astype(dt))
    y = ops.tanh(x) * 2 + 1  # contiguous: vector loads and stores
    close(y, (np.tanh(a.astype(dt).astype(np.float64)) * 2 + 1), 2e-2, 2e-2)
    s = strided(queue, a.astype(dt))  # a strided view: scalar loads
    close(ops.cast(s, np.float32), a.astype(dt).astype(np.float32), 0, 0)
    close(ops.sum(x, axis=1), a.astype(dt).astype(np.float64).sum(1), 2e-2, 5e-2)
    close(ops.softmax(x, -1).astype(np.float32).sum(-1), np.ones(5), 2e-2, 2e-2)


@HALVES
def test_master_weight_step_and_loss_scaling(queue, dt):
    """Half parameters of odd sizes in one launch (master weights, state), the scaler's unscale over
    several gradients with an injected inf (flag set by atomics), the skipped step and the scale update."""
    rng = np.random.default_rng(22)
    shapes = [(7, 3), (17,), (1,)]
    params = [ag.Parameter(dev(queue, rng.standard_normal(s).astype(dt))) for s in shapes]
    opt = optim.AdamW(params, lr=0.01)
    scaler = amp.GradScaler(init_scale=4.0, growth_interval=1)
    with ag.Tape() as tape:
        loss = ag.sum(ag.mul(params[0], params[0]))
        for p in params[1:]:
            loss = ag.add(loss, ag.sum(p))
    tape.backward(scaler.scale(loss))
    before = [p.value.to_host() for p in params]
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 8.0
    for p, b in zip(params, before):
        assert not np.array_equal(p.value.to_host(), b)
    g = params[1].grad.to_host()
    g[3] = np.inf
    params[1].grad = dev(queue, g)
    before = [p.value.to_host() for p in params]
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 4.0
    for p, b in zip(params, before):
        assert np.array_equal(p.value.to_host(), b)


@HALVES
def test_clip_and_losses_on_half(queue, dt):
    rng = np.random.default_rng(23)
    grads = [rng.standard_normal(s).astype(dt) for s in ((7, 3), (17,))]
    params = [ag.Parameter(dev(queue, np.zeros(g.shape, dt))) for g in grads]
    for p, g in zip(params, grads):
        p.grad = dev(queue, g)
    total = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads))
    close(optim.clip_grad_norm_(params, max_norm=1.0), [total], 1e-5, 1e-5)
    x = rng.standard_normal((5, 7)).astype(dt)
    y = rng.integers(0, 7, 5).astype(np.int32)
    with ag.Tape() as tape:
        node = ag.tensor(dev(queue, x), requires_grad=True)
        loss = ag.cross_entropy(node, dev(queue, y))
    tape.backward(loss)
    assert loss.value.dtype == np.float32 and node.grad.dtype == dt
    mse = ag.mse(dev(queue, x), dev(queue, x[::-1].copy()))
    close(mse.value, [((x.astype(np.float64) - x[::-1].astype(np.float64)) ** 2).mean()], 1e-5, 1e-5)


def test_update_scale_growth_and_backoff(queue):
    scale = dev(queue, np.array([2.0], np.float32))
    tracker = dev(queue, np.array([0], np.int32))
    flag = dev(queue, np.array([0], np.int32))
    for _ in range(2):
        update.update_scale(scale, tracker, flag, 2.0, 0.5, 2)
    close(scale, [4.0], 0, 0)
    flag = dev(queue, np.array([1], np.int32))
    update.update_scale(scale, tracker, flag, 2.0, 0.5, 2)
    close(scale, [2.0], 0, 0)


@HALVES
def test_half_conv_pool_and_row_norms(queue, dt, monkeypatch):
    """conv2d on half storage (im2col + col2im + weight_bias with groups, the direct kernels and the bias
    gradient), max/avg pooling, and the row norms' work-group and 4-wide kernels (LOCAL=8), each against
    its float32 path on the same values (the norms with half parameters and with float32 ones)."""
    from netcl.ops import norm

    rng = np.random.default_rng(24)

    def pair(shape):
        return half_pair(queue, rng, dt, shape)

    def same(h, f, tol=3e-2):
        close_to_float32(h, f, tol)

    xh, xf = pair((2, 4, 5, 6))
    wh, wf = pair((6, 2, 3, 3))
    bh, bf = pair((6,))
    for algo in ("im2col", "direct"):
        same(ops.conv2d(xh, wh, bh, padding=1, groups=2, algorithm=algo),
             ops.conv2d(xf, wf, bf, padding=1, groups=2, algorithm=algo))
    gh, gf = pair((2, 6, 5, 6))
    for algo in ("gemm", "direct"):
        same(ops.conv2d_backward_input(gh, wh, xh.shape, padding=1, groups=2, algorithm=algo),
             ops.conv2d_backward_input(gf, wf, xf.shape, padding=1, groups=2, algorithm=algo))
        same(ops.conv2d_backward_weight(xh, gh, wh.shape, padding=1, groups=2, algorithm=algo),
             ops.conv2d_backward_weight(xf, gf, wf.shape, padding=1, groups=2, algorithm=algo))
    same(ops.conv2d_backward_bias(gh), ops.conv2d_backward_bias(gf))
    (mh, ih), (mf, _) = ops.max_pool2d(xh, 3, 2, 1), ops.max_pool2d(xf, 3, 2, 1)
    same(mh, mf, 0)
    ph, pf = pair(mh.shape)
    same(ops.max_pool2d_backward(ph, ih, xh.shape, 3, 2, 1),
         ops.max_pool2d_backward(pf, ih, xf.shape, 3, 2, 1))
    same(ops.avg_pool2d(xh, 2), ops.avg_pool2d(xf, 2))
    monkeypatch.setattr(norm, "local_size_override", 8)
    for length in (13, 16):  # the scalar work-group kernels, then the 4-wide ones
        rh, rf = pair((3, length))
        nh, nf = pair((length,))
        lh, lf = ops.layer_norm(rh, length, nh, nh), ops.layer_norm(rf, length, nf, nf)
        same(lh[0], lf[0])
        for got, want in zip(ops.layer_norm_backward(rh, rh, length, lh[1], lh[2], nh, nh),
                             ops.layer_norm_backward(rf, rf, length, lf[1], lf[2], nf, nf)):
            same(got, want)
        # half rows with float32 parameters (autocast's: PARAM_F32)
        lp = ops.layer_norm(rh, length, nf, nf)
        same(lp[0], lf[0])
        for got, want in zip(ops.layer_norm_backward(rh, rh, length, lp[1], lp[2], nf, nf),
                             ops.layer_norm_backward(rf, rf, length, lf[1], lf[2], nf, nf)):
            same(got, want)


def test_bfloat16_flash_attention(queue, monkeypatch):
    """flash attention on bfloat16 storage in both kernel families (4-wide ushort loads and stores on the
    GPU kernels, 8-wide on the CPU ones with a partial last vector), forward and backward."""
    from netcl.ops import attention

    rng = np.random.default_rng(25)
    for variant, d in (("gpu", 16), ("cpu", 12)):
        monkeypatch.setattr(attention, "variant_override", variant)
        ts = [rng.standard_normal((1, 2, s, d)).astype(np.float32).astype(BF16) for s in (17, 18, 18)]
        half = [dev(queue, t) for t in ts]
        full = [dev(queue, t.astype(np.float32)) for t in ts]
        oh, lh = attention.flash_attention_forward(*half, causal=True)
        of, lf = attention.flash_attention_forward(*full, causal=True)
        close(oh.to_host().astype(np.float32), of.to_host(), 3e-2, 3e-2)
        g = rng.standard_normal(oh.shape).astype(np.float32).astype(BF16)
        gf = dev(queue, g.astype(np.float32))
        for got, want in zip(attention.flash_attention_backward(*half, oh, lh, dev(queue, g), causal=True),
                             attention.flash_attention_backward(*full, of, lf, gf, causal=True)):
            close(got.to_host().astype(np.float32), want.to_host(), 5e-2, 5e-2)


@HALVES
def test_half_batch_norm(queue, dt, monkeypatch):
    """Batch norm on half x with float32 parameters and statistics: the GPUs' work-group kernels with
    4-wide half loads and stores (HW = 8), parts merged by the finalize launch, forward and backward."""
    from netcl.ops import norm

    monkeypatch.setattr(norm, "PARTS", 2)
    monkeypatch.setattr(norm, "local_size_override", 8)
    rng = np.random.default_rng(26)
    a = rng.standard_normal((2, 3, 2, 4)).astype(np.float32).astype(dt)
    w = dev(queue, rng.standard_normal(3).astype(np.float32))
    xh, xf = dev(queue, a), dev(queue, a.astype(np.float32))
    yh, mh, sh = ops.batch_norm(xh, w, w, None, None, True, activation="relu")
    yf, mf, sf = ops.batch_norm(xf, w, w, None, None, True, activation="relu")
    close(yh.to_host().astype(np.float32), yf.to_host(), 3e-2, 3e-2)
    gx = ops.batch_norm_backward(xh, xh, w, mh, sh, True, bias=w, activation="relu")[0]
    want = ops.batch_norm_backward(xf, xf, w, mf, sf, True, bias=w, activation="relu")[0]
    close(gx.to_host().astype(np.float32), want.to_host(), 5e-2, 5e-2)


@HALVES
def test_half_winograd(queue, dt):
    """Winograd F(2x2, 3x3) on half storage through the GPU transforms (partial tiles: 5x7 output),
    forward with bias and relu, the flipped filter transform of the input gradient, the weight gradient."""
    from netcl.ops import conv

    rng = np.random.default_rng(27)

    def pair(shape):
        return half_pair(queue, rng, dt, shape)

    def same(h, f, tol=4e-2):
        close_to_float32(h, f, tol)

    xh, xf = pair((1, 8, 5, 7))
    wh, wf = pair((8, 8, 3, 3))
    same(ops.conv2d(xh, wh, wh[:, 0, 0, 0].contiguous(), padding=1, activation="relu", algorithm="winograd"),
         ops.conv2d(xf, wf, wf[:, 0, 0, 0].contiguous(), padding=1, activation="relu", algorithm="winograd"))
    gh, gf = pair((1, 8, 5, 7))
    uh = conv.winograd_transform_weight(wh, flip=True)
    uf = conv.winograd_transform_weight(wf, flip=True)
    same(uh, uf)
    same(ops.conv2d_backward_weight(xh, gh, wh.shape, padding=1, algorithm="winograd"),
         ops.conv2d_backward_weight(xf, gf, wf.shape, padding=1, algorithm="winograd"))
