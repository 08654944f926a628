"""Norms forward against float64 NumPy, backward by finite differences in float64 (netcl/ops/norm.py)."""

from __future__ import annotations

import numpy as np
import pytest

from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, ShapeError
from netcl.ops import norm as Nm
from tests.reference import assert_close


def _t(queue, a):
    return None if a is None else Tensor.from_host(queue, a)


def _directional(loss, args, grads, rng, h=1e-6):
    """Check <grad_i, d_i> against central differences of loss along a random direction per argument."""
    for i, g in enumerate(grads):
        if g is None:
            continue
        d = rng.standard_normal(args[i].shape)
        plus = list(args)
        minus = list(args)
        plus[i] = args[i] + h * d
        minus[i] = args[i] - h * d
        fd = (loss(*plus) - loss(*minus)) / (2 * h)
        assert fd == pytest.approx(float(np.sum(g * d)), rel=1e-6, abs=1e-9), f"argument {i}"


# -- BatchNorm -----------------------------------------------------------------------------------
def ref_bn(x, w, b, mean, var, eps):
    shp = (1, -1) + (1,) * (x.ndim - 2)
    return (x - mean.reshape(shp)) / np.sqrt(var.reshape(shp) + eps) * w.reshape(shp) + b.reshape(shp)


GROUPS = pytest.mark.gpu_shaped  # the GPUs' work-group kernels, emulated here for their index arithmetic


@pytest.mark.parametrize(
    "dt,shape", [(np.float32, (3, 5, 7, 9)), (np.float64, (2, 3, 5)), (np.float32, (17, 4))]
)
def test_batch_norm_training_and_running_stats(queue, rng, dt, shape):
    x = (rng.standard_normal(shape) * 3 + 1).astype(dt)
    c = shape[1]
    w, b = rng.standard_normal(c).astype(dt), rng.standard_normal(c).astype(dt)
    rm, rv = rng.standard_normal(c).astype(dt), rng.random(c).astype(dt) + 0.5
    rmt, rvt = _t(queue, rm), _t(queue, rv)
    out, sm, si = Nm.batch_norm(
        _t(queue, x), _t(queue, w), _t(queue, b), rmt, rvt, True, momentum=0.2, eps=1e-5
    )
    axes = (0,) + tuple(range(2, len(shape)))
    x64 = x.astype(np.float64)
    mean, var = x64.mean(axis=axes), x64.var(axis=axes)
    m = x.size // c
    tol = dict(rtol=1e-5, atol=1e-5) if dt == np.float32 else {}
    assert_close(out, ref_bn(x64, w, b, mean, var, 1e-5), dt, **tol)
    assert_close(sm, mean, dt, **tol)
    assert_close(si, 1 / np.sqrt(var + 1e-5), dt, **tol)
    assert_close(rmt, 0.8 * rm + 0.2 * mean, dt, **tol)
    assert_close(rvt, 0.8 * rv + 0.2 * var * m / (m - 1), dt, **tol)
    # eval uses the running statistics and leaves them alone
    out_eval, _, _ = Nm.batch_norm(_t(queue, x), _t(queue, w), _t(queue, b), rmt, rvt, False)
    rm2, rv2 = rmt.to_host().astype(np.float64), rvt.to_host().astype(np.float64)
    assert_close(out_eval, ref_bn(x64, w, b, rm2, rv2, 1e-5), dt, **tol)
    assert_close(rmt, rm2, dt)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("relu", [False, True])
def test_batch_norm_backward_finite_differences(queue, rng, training, relu):
    x = rng.standard_normal((3, 2, 4, 3))
    w, b, gy = rng.standard_normal(2), rng.standard_normal(2), rng.standard_normal(x.shape)
    rm, rv = rng.standard_normal(2), rng.random(2) + 0.5
    act = "relu" if relu else None

    def loss(xa, wa, ba):
        out, _, _ = Nm.batch_norm(_t(queue, xa), _t(queue, wa), _t(queue, ba), _t(queue, rm), _t(queue, rv),
                                  training, activation=act)
        return float(np.sum(out.to_host() * gy))

    _, sm, si = Nm.batch_norm(
        _t(queue, x), _t(queue, w), _t(queue, b), _t(queue, rm), _t(queue, rv), training, activation=act
    )
    gx, gw, gb = Nm.batch_norm_backward(_t(queue, gy), _t(queue, x), _t(queue, w), sm, si, training,
                                        bias=_t(queue, b), activation=act)
    _directional(loss, (x, w, b), (gx.to_host(), gw.to_host(), gb.to_host()), rng)


def test_batch_norm_relu_matches_composition(queue, rng):
    x = rng.standard_normal((4, 3, 5, 5)).astype(np.float32)
    w, b = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    out, _, _ = Nm.batch_norm_relu(_t(queue, x), _t(queue, w), _t(queue, b), None, None, True)
    x64 = x.astype(np.float64)
    want = np.maximum(ref_bn(x64, w, b, x64.mean(axis=(0, 2, 3)), x64.var(axis=(0, 2, 3)), 1e-5), 0)
    assert_close(out, want, rtol=1e-5, atol=1e-5)


# -- LayerNorm / RMSNorm / GroupNorm ---------------------------------------------------------------
def ref_ln(x, nd, w, b, eps):
    axes = tuple(range(x.ndim - nd, x.ndim))
    y = (x - x.mean(axis=axes, keepdims=True)) / np.sqrt(x.var(axis=axes, keepdims=True) + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_layer_norm_forward(queue, rng, dt):
    x = (rng.standard_normal((3, 7, 33)) * 2 + 5).astype(dt)
    w, b = rng.standard_normal(33).astype(dt), rng.standard_normal(33).astype(dt)
    out, mean, rstd = Nm.layer_norm(_t(queue, x), 33, _t(queue, w), _t(queue, b))
    tol = dict(rtol=1e-5, atol=1e-5) if dt == np.float32 else {}
    x64 = x.astype(np.float64)
    assert_close(out, ref_ln(x64, 1, w, b, 1e-5), dt, **tol)
    assert_close(mean, x64.mean(axis=-1), dt, **tol)
    assert_close(rstd, 1 / np.sqrt(x64.var(axis=-1) + 1e-5), dt, **tol)
    out2, _, _ = Nm.layer_norm(_t(queue, x), (7, 33))  # two normalised dims, no affine
    assert_close(out2, ref_ln(x64, 2, None, None, 1e-5), dt, **tol)


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_backward_finite_differences(queue, rng, affine):
    x = rng.standard_normal((5, 3, 7))
    w, b = (rng.standard_normal((3, 7)), rng.standard_normal((3, 7))) if affine else (None, None)
    gy = rng.standard_normal(x.shape)

    def loss(xa, wa=None, ba=None):
        return float(
            np.sum(Nm.layer_norm(_t(queue, xa), (3, 7), _t(queue, wa), _t(queue, ba))[0].to_host() * gy)
        )

    _, mean, rstd = Nm.layer_norm(_t(queue, x), (3, 7), _t(queue, w), _t(queue, b))
    gx, gw, gb = Nm.layer_norm_backward(
        _t(queue, gy), _t(queue, x), (3, 7), mean, rstd, _t(queue, w), _t(queue, b)
    )
    if affine:
        _directional(loss, (x, w, b), (gx.to_host(), gw.to_host(), gb.to_host()), rng)
    else:
        assert gw is None and gb is None
        _directional(loss, (x,), (gx.to_host(),), rng)


def test_rms_norm_forward_backward(queue, rng):
    x = rng.standard_normal((4, 17))
    w, gy = rng.standard_normal(17), rng.standard_normal((4, 17))
    out, rstd = Nm.rms_norm(_t(queue, x), 17, _t(queue, w), eps=1e-6)
    r = 1 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6)
    assert_close(out, x * r * w)
    assert_close(rstd, r[:, 0])

    def loss(xa, wa):
        return float(np.sum(Nm.rms_norm(_t(queue, xa), 17, _t(queue, wa))[0].to_host() * gy))

    gx, gw = Nm.rms_norm_backward(_t(queue, gy), _t(queue, x), 17, rstd, _t(queue, w))
    _directional(loss, (x, w), (gx.to_host(), gw.to_host()), rng)
    out32, _ = Nm.rms_norm(_t(queue, x.astype(np.float32)), 17, _t(queue, w.astype(np.float32)))
    assert_close(out32, x * r * w, rtol=1e-5, atol=1e-5)


# 16: the GPU shape (parameter sums by the reduction engine)
@pytest.mark.parametrize("local", [None, pytest.param(16, marks=GROUPS)])
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_row_norm_parameter_grads_against_float64(queue, rng, monkeypatch, local, dt):
    """grad_weight / grad_bias of layer and RMS norm over many rows (sums across rows), both kernel shapes."""
    monkeypatch.setattr(Nm, "local_size_override", local)
    x = (rng.standard_normal((3, 67, 37)) * 2 + 1).astype(dt)
    w, b, gy = (rng.standard_normal(37).astype(dt), rng.standard_normal(37).astype(dt),
                rng.standard_normal(x.shape).astype(dt))
    x64, gy64 = x.astype(np.float64), gy.astype(np.float64)
    tol = dict(rtol=2e-5, atol=2e-4) if dt == np.float32 else dict(rtol=1e-10, atol=1e-10)
    _, mean, rstd = Nm.layer_norm(_t(queue, x), 37, _t(queue, w), _t(queue, b))
    gx, gw, gb = Nm.layer_norm_backward(
        _t(queue, gy), _t(queue, x), 37, mean, rstd, _t(queue, w), _t(queue, b)
    )
    xhat = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    assert_close(gw, (gy64 * xhat).reshape(-1, 37).sum(0), dt, **tol)
    assert_close(gb, gy64.reshape(-1, 37).sum(0), dt, **tol)
    g = gy64 * w
    want_gx = (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True)) / np.sqrt(
        x64.var(-1, keepdims=True) + 1e-5)
    assert_close(gx, want_gx, dt, **tol)
    _, rstd = Nm.rms_norm(_t(queue, x), 37, _t(queue, w), eps=1e-6)
    _, gw = Nm.rms_norm_backward(_t(queue, gy), _t(queue, x), 37, rstd, _t(queue, w))
    r = 1 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6)
    assert_close(gw, (gy64 * x64 * r).reshape(-1, 37).sum(0), dt, **tol)


# half rows with float32 parameters (autocast leaves a model's parameters float32): the parameters read as
# they are, their gradients float32 sums; 16 is the GPU shape (vector kernels, parameter sums by the
# reduction)
@pytest.mark.parametrize("local", [None, pytest.param(16, marks=GROUPS)])
@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_row_norms_take_float32_parameters_beside_half_rows(queue, rng, monkeypatch, local, dt):
    import ml_dtypes

    half = np.dtype(np.float16) if dt == "float16" else np.dtype(ml_dtypes.bfloat16)
    ulp = 2.0**-10 if dt == "float16" else 2.0**-7
    monkeypatch.setattr(Nm, "local_size_override", local)
    x = (rng.standard_normal((3, 21, 40)) * 2 + 1).astype(half)
    gy = rng.standard_normal(x.shape).astype(half)
    w, b = rng.standard_normal(40).astype(np.float32), rng.standard_normal(40).astype(np.float32)
    x64, gy64 = x.astype(np.float64), gy.astype(np.float64)
    out, mean, rstd = Nm.layer_norm(_t(queue, x), 40, _t(queue, w), _t(queue, b))
    xhat = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    want = xhat * w + b
    assert out.dtype == half
    assert_close(out.to_host().astype(np.float64), want, rtol=ulp, atol=ulp * np.abs(want).max())
    gx, gw, gb = Nm.layer_norm_backward(_t(queue, gy), _t(queue, x), 40, mean, rstd, _t(queue, w),
                                        _t(queue, b))
    assert gx.dtype == half and gw.dtype == gb.dtype == np.float32
    # float32 sums of the half rows: float32's tolerance, not half's
    assert_close(gw, (gy64 * xhat).reshape(-1, 40).sum(0), rtol=2e-5, atol=2e-4)
    assert_close(gb, gy64.reshape(-1, 40).sum(0), rtol=2e-5, atol=2e-4)
    g = gy64 * w
    want_gx = (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True)) / np.sqrt(
        x64.var(-1, keepdims=True) + 1e-5)
    assert_close(gx.to_host().astype(np.float64), want_gx, rtol=2 * ulp, atol=2 * ulp * np.abs(want_gx).max())
    out, rstd = Nm.rms_norm(_t(queue, x), 40, _t(queue, w), eps=1e-6)
    r = 1 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6)
    want = x64 * r * w
    assert_close(out.to_host().astype(np.float64), want, rtol=ulp, atol=ulp * np.abs(want).max())
    _, gw = Nm.rms_norm_backward(_t(queue, gy), _t(queue, x), 40, rstd, _t(queue, w))
    assert gw.dtype == np.float32
    assert_close(gw, (gy64 * x64 * r).reshape(-1, 40).sum(0), rtol=2e-5, atol=2e-4)
    # group norm: the scalar kernels' parameter part (per channel, over rows and positions)
    xg = x.reshape(3, 6, 140)[:, :, :35].copy().reshape(3, 6, 5, 7)
    gyg = gy.reshape(3, 6, 140)[:, :, :35].copy().reshape(3, 6, 5, 7)
    wg, bg = w[:6].copy(), b[:6].copy()
    out, mean, rstd = Nm.group_norm(_t(queue, xg), 3, _t(queue, wg), _t(queue, bg))
    want = ref_gn(xg.astype(np.float64), 3, wg, bg, 1e-5)
    assert_close(out.to_host().astype(np.float64), want, rtol=ulp, atol=ulp * np.abs(want).max())
    _, gw, gb = Nm.group_norm_backward(_t(queue, gyg), _t(queue, xg), 3, mean, rstd, _t(queue, wg),
                                       _t(queue, bg))
    xr = xg.astype(np.float64).reshape(3, 3, -1)
    xh = ((xr - xr.mean(-1, keepdims=True)) / np.sqrt(xr.var(-1, keepdims=True) + 1e-5)).reshape(xg.shape)
    assert gw.dtype == gb.dtype == np.float32
    assert_close(gw, (gyg.astype(np.float64) * xh).sum((0, 2, 3)), rtol=2e-5, atol=2e-4)
    assert_close(gb, gyg.astype(np.float64).sum((0, 2, 3)), rtol=2e-5, atol=2e-4)


def ref_gn(x, g, w, b, eps):
    n, c = x.shape[:2]
    xr = x.reshape(n, g, -1)
    y = ((xr - xr.mean(axis=-1, keepdims=True)) / np.sqrt(xr.var(axis=-1, keepdims=True) + eps)).reshape(
        x.shape
    )
    shp = (1, c) + (1,) * (x.ndim - 2)
    return y * w.reshape(shp) + b.reshape(shp)


def test_group_norm_forward_backward(queue, rng):
    x = rng.standard_normal((2, 6, 5, 3))
    w, b, gy = rng.standard_normal(6), rng.standard_normal(6), rng.standard_normal(x.shape)
    out, mean, rstd = Nm.group_norm(_t(queue, x), 3, _t(queue, w), _t(queue, b))
    assert_close(out, ref_gn(x, 3, w, b, 1e-5))
    assert mean.shape == (2, 3)

    def loss(xa, wa, ba):
        return float(np.sum(Nm.group_norm(_t(queue, xa), 3, _t(queue, wa), _t(queue, ba))[0].to_host() * gy))

    gx, gw, gb = Nm.group_norm_backward(
        _t(queue, gy), _t(queue, x), 3, mean, rstd, _t(queue, w), _t(queue, b)
    )
    _directional(loss, (x, w, b), (gx.to_host(), gw.to_host(), gb.to_host()), rng)
    x32 = x.astype(np.float32)
    out32, _, _ = Nm.group_norm(
        _t(queue, x32), 2, _t(queue, w.astype(np.float32)), _t(queue, b.astype(np.float32))
    )
    assert_close(out32, ref_gn(x32.astype(np.float64), 2, w, b, 1e-5), rtol=1e-5, atol=1e-5)


def test_norm_errors(queue):
    x = Tensor.zeros(queue, (2, 6, 4))
    with pytest.raises(ShapeError, match="num_groups=4"):
        Nm.group_norm(x, 4)
    with pytest.raises(ShapeError, match="normalized_shape"):
        Nm.layer_norm(x, 5)
    with pytest.raises(ShapeError, match="weight"):
        Nm.layer_norm(x, 4, Tensor.zeros(queue, (5,)))
    with pytest.raises(ShapeError, match="running_mean"):
        Nm.batch_norm(x, None, None, None, None, False)
    with pytest.raises(ShapeError, match=r"weight must have shape \(6,\)"):
        Nm.batch_norm(x, Tensor.zeros(queue, (4,)), None, None, None, True)
    with pytest.raises(DTypeError):
        Nm.rms_norm(Tensor.zeros(queue, (2, 3), np.int32), 3)
    # parameters in the rows' dtype, or float32 beside half rows; nothing else
    with pytest.raises(DTypeError, match=r"share the input's dtype \(float32\), got \['float16'\]"):
        Nm.rms_norm(x, 4, Tensor.zeros(queue, (4,), np.float16))
    with pytest.raises(DTypeError, match=r"\(float16\) or be float32, got \['float32', 'float16'\]"):
        Nm.layer_norm(Tensor.zeros(queue, (2, 4), np.float16), 4, Tensor.zeros(queue, (4,)),
                      Tensor.zeros(queue, (4,), np.float16))
    with pytest.raises(DTypeError, match=r"share the input's dtype \(float64\), got \['float32'\]"):
        Nm.layer_norm(Tensor.zeros(queue, (2, 4), np.float64), 4, Tensor.zeros(queue, (4,)))


def _bn_reference(x, w, b, gy, relu, eps=1e-5):
    """(y, mean, invstd, grad_x, grad_w, grad_b) of batch norm (+ relu) in float64."""
    axes = (0,) + tuple(range(2, x.ndim))
    shp = (1, -1) + (1,) * (x.ndim - 2)
    mean, var = x.mean(axis=axes), x.var(axis=axes)
    inv = 1 / np.sqrt(var + eps)
    xhat = (x - mean.reshape(shp)) * inv.reshape(shp)
    y = xhat * w.reshape(shp) + b.reshape(shp)
    g = np.where(y > 0, gy, 0.0) if relu else gy
    if relu:
        y = np.maximum(y, 0)
    m = x.size // x.shape[1]
    gsum, gxh = g.sum(axis=axes), (g * xhat).sum(axis=axes)
    gx = (w * inv).reshape(shp) / m * (m * g - gsum.reshape(shp) - xhat * gxh.reshape(shp))
    return y, mean, inv, gx, gxh, gsum


BN_SHAPES = [((5, 3, 4, 6), 0), ((3, 4, 5, 7), 0), ((4, 3, 8), 1), ((6, 5), 0)]
# every shape with and without the fused ReLU on the CPU's runs; the GPU's work-group layouts (a program
# build per shape, so seconds each on PoCL) take every shape once, the ReLU on every other one
BN_CASES = [("runs", parts, None, shape, offset, relu) for parts in (None, 3) for shape, offset in BN_SHAPES
            for relu in (False, True)] + [
    pytest.param("groups", parts, local, shape, offset, i % 2 == 1, marks=GROUPS)
    for parts, local in ((1, 16), (5, 8), (None, 32)) for i, (shape, offset) in enumerate(BN_SHAPES)
]


@pytest.mark.parametrize("layout,parts,local,shape,offset,relu", BN_CASES)
def test_batch_norm_layouts(queue, rng, monkeypatch, layout, parts, local, shape, offset, relu):
    """Both reduction layouts (the CPU's runs, the GPU's work-group trees with 4-wide loads when aligned),
    one part per channel (the kernel finishes) or several (the finalize launch), odd and unaligned
    shapes (a view at an odd offset takes scalar loads), forward and backward against float64."""
    monkeypatch.setattr(Nm, "FORCE_LAYOUT", layout)
    monkeypatch.setattr(Nm, "PARTS", parts)
    monkeypatch.setattr(Nm, "local_size_override", local)
    c = shape[1]
    x = rng.standard_normal(shape) * 2 + 0.5
    w, b, gy = rng.standard_normal(c), rng.standard_normal(c), rng.standard_normal(shape)
    flat = np.concatenate([np.zeros(offset), x.ravel()])
    xt = Tensor.from_host(queue, flat)[offset:].reshape(shape)
    act = "relu" if relu else None
    out, sm, si = Nm.batch_norm(xt, _t(queue, w), _t(queue, b), None, None, True, activation=act)
    y, mean, inv, gx_ref, gw_ref, gb_ref = _bn_reference(x, w, b, gy, relu)
    assert_close(out, y, rtol=1e-10, atol=1e-12)
    assert_close(sm, mean, rtol=1e-12, atol=1e-12)
    assert_close(si, inv, rtol=1e-12, atol=1e-12)
    gx, gw, gb = Nm.batch_norm_backward(_t(queue, gy), xt, _t(queue, w), sm, si, True, bias=_t(queue, b),
                                        activation=act)
    assert_close(gx, gx_ref, rtol=1e-10, atol=1e-11)
    assert_close(gw, gw_ref, rtol=1e-10, atol=1e-11)
    assert_close(gb, gb_ref, rtol=1e-10, atol=1e-11)


@GROUPS
@pytest.mark.parametrize("shape,relu,unroll,parts", [((5, 3, 4, 6), True, 1, 5), ((3, 4, 5, 7), False, 4, 5),
                                                     ((7, 2, 8, 8), True, 4, 5), ((2, 3, 6, 6), True, 4, 1)])
@pytest.mark.parametrize("chained", [False, True])
def test_batch_norm_fused_finalize(queue, rng, monkeypatch, shape, relu, unroll, parts, chained):
    """The GPU reductions with LAST=1: each channel's last work-group merges the parts (a counter per
    channel, reset by that group) instead of a finalize launch, with 1 or 4 loads in flight (whole batches
    and a part's tail): 2 launches each way, float32 results against float64, and
    a second call on the same counters gives the same values (float32: the partials move through 32-bit
    atomics; float64 keeps the finalize launch). CHAINED: each way one launch (the elementwise parts wait for
    their channel's statistics), the same bits as the two launches."""
    from netcl.profiling import count_launches

    monkeypatch.setattr(Nm, "FORCE_LAYOUT", "groups")
    monkeypatch.setattr(Nm, "PARTS", parts)
    monkeypatch.setattr(Nm, "local_size_override", 8)
    monkeypatch.setattr(Nm, "FUSED_FINALIZE", True)
    monkeypatch.setattr(Nm, "UNROLL", unroll)  # float4 loads in flight (4-wide when HW % 4 == 0)
    c = shape[1]
    f32 = lambda a: a.astype(np.float32)  # noqa: E731
    x = f32(rng.standard_normal(shape) * 2 + 0.5)
    w, b, gy = f32(rng.standard_normal(c)), f32(rng.standard_normal(c)), f32(rng.standard_normal(shape))
    xt, wt, bt, gyt = _t(queue, x), _t(queue, w), _t(queue, b), _t(queue, gy)
    act = "relu" if relu else None
    y, mean, inv, gx_ref, gw_ref, gb_ref = _bn_reference(x.astype(np.float64), w, b, gy, relu)
    monkeypatch.setattr(Nm, "CHAINED", not chained)  # the other way, for the bits
    other = [t.to_host() for t in (*Nm.batch_norm(xt, wt, bt, None, None, True, activation=act),
                                   *Nm.batch_norm_backward(gyt, xt, wt, *Nm.batch_norm(
                                       xt, wt, bt, None, None, True, activation=act)[1:], True, bias=bt,
                                       activation=act))]
    monkeypatch.setattr(Nm, "CHAINED", chained)
    first = None
    for _ in range(2):
        with count_launches() as launches:
            out, sm, si = Nm.batch_norm(xt, wt, bt, None, None, True, activation=act)
            gx, gw, gb = Nm.batch_norm_backward(gyt, xt, wt, sm, si, True, bias=bt, activation=act)
        assert launches.count == (2 if chained else 4)
        assert all(np.array_equal(a, t.to_host()) for a, t in zip(other, (out, sm, si, gx, gw, gb)))
        assert_close(out, y, np.float32, rtol=1e-5, atol=1e-5)
        assert_close(si, inv, np.float32, rtol=1e-5, atol=1e-6)
        assert_close(gx, gx_ref, np.float32, rtol=1e-4, atol=1e-4)
        assert_close(gw, gw_ref, np.float32, rtol=1e-4, atol=1e-4)
        assert_close(gb, gb_ref, np.float32, rtol=1e-4, atol=1e-4)
        got = [t.to_host() for t in (out, gx, gw, gb)]
        if first is not None:
            assert all(np.array_equal(a, b) for a, b in zip(first, got))  # fixed merge order: bitwise equal
        first = got


@GROUPS
@pytest.mark.parametrize("dt", [np.float32, np.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("shape,parts", [((3, 5, 3, 4), 2), ((2, 24, 4, 4), 3)])
def test_batch_norm_merges_repeat_bit_for_bit(queue, rng, monkeypatch, dt, shape, parts):
    """The in-launch merges (each channel's last part reads the others' partials, the chained elementwise
    parts the channel's constants) launch after launch: the same bits every time, and right. Neighbouring
    channels' partials share cache lines: a merge that reads a line its SM cached before the partials landed
    (NVIDIA's plain loads, before common.cl's nc_part_load) would give a channel wrong now and then, as the
    H100 suite once did (the float16 mixed batch norm's grad x; right when rerun alone), hence the repeats
    on a GPU. Before each step the pool holds NaN-filled blocks of the launch's own sizes (statistics,
    coefficients, partials): a part that reads its channel's constants before they are written for this
    launch reads NaN (the chained backward on NVIDIA with OpenCL's mem_fence as the release: every grad x;
    common.cl's NC_FENCE_DEVICE), where without them it read the last launch's and repeated its bits."""
    monkeypatch.setattr(Nm, "FORCE_LAYOUT", "groups")
    monkeypatch.setattr(Nm, "PARTS", parts)
    monkeypatch.setattr(Nm, "local_size_override", 8)
    c = shape[1]
    x, gy = (_t(queue, rng.standard_normal(shape).astype(dt)) for _ in range(2))
    w, b = (_t(queue, rng.standard_normal(c).astype(np.float32)) for _ in range(2))

    def step():
        for n in (4 * c, 5 * c, 2 * c * parts, 3 * c * parts, c):   # NaN blocks back to the pool
            Tensor.full(queue, (n,), float("nan"), np.float32)
        y, sm, si = Nm.batch_norm(x, w, b, None, None, True, activation="relu")
        return [t.to_host() for t in (y, sm, si, *Nm.batch_norm_backward(gy, x, w, sm, si, True, bias=b,
                                                                           activation="relu"))]

    first = step()
    x64, gy64 = x.to_host().astype(np.float64), gy.to_host().astype(np.float64)
    want = _bn_reference(x64, w.to_host().astype(np.float64), b.to_host().astype(np.float64), gy64, True)
    tol = 2e-2 if dt == np.float16 else 1e-4
    for got, ref in zip([first[i] for i in (0, 1, 2, 3, 4, 5)], want):
        np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol * np.abs(ref).max())
    repeats = 300 if queue.device.kind == "gpu" else 5
    for i in range(repeats):
        again = step()
        bad = [k for k, (a, f) in enumerate(zip(again, first)) if not np.array_equal(a, f)]
        assert not bad, f"repeat {i}: outputs {bad} (y, mean, invstd, grad x, grad w, grad b) changed"


@pytest.mark.parametrize("layout", ["runs", pytest.param("groups", marks=GROUPS)])
def test_batch_norm_statistics_survive_a_large_mean(queue, rng, monkeypatch, layout):
    """float32 values around 3000 with unit spread: a sum-of-squares variance would lose every digit
    (3000^2 = 9e6 against eps32 ~ 1e-7 relative); Welford/Chan merges keep the variance to ~1e-4."""
    monkeypatch.setattr(Nm, "FORCE_LAYOUT", layout)
    monkeypatch.setattr(Nm, "PARTS", 3)
    monkeypatch.setattr(Nm, "local_size_override", 16 if layout == "groups" else None)
    x = (3000 + rng.standard_normal((6, 2, 9, 8))).astype(np.float32)
    _, sm, si = Nm.batch_norm(_t(queue, x), None, None, None, None, True, eps=0.0)
    x64 = x.astype(np.float64)
    assert_close(sm, x64.mean(axis=(0, 2, 3)), np.float32, rtol=1e-6, atol=0)
    assert_close(si, 1 / x64.std(axis=(0, 2, 3)), np.float32, rtol=2e-4, atol=0)


@pytest.mark.parametrize("parts", [1, 2])
def test_batch_norm_launches(queue, rng, monkeypatch, parts):
    """Each direction is the one-pass reduction and one elementwise pass, plus a finalize launch when a
    channel is split in parts on the layout the device's own defaults take: on a CPU's ("runs"); a GPU's
    ("groups", FUSED_FINALIZE) merges the parts in each channel's last work-group instead, and (CHAINED)
    runs both passes as one launch."""
    from netcl.profiling import count_launches

    merged_in_place = Nm._bn_layout(queue.device) == "groups" and Nm.FUSED_FINALIZE
    launches = 1 if Nm._bn_chained(Nm._bn_layout(queue.device), np.dtype(np.float32)) else (
        2 if parts == 1 or merged_in_place else 3)
    monkeypatch.setattr(Nm, "PARTS", parts)
    x, gy = (
        rng.standard_normal((4, 3, 5, 5)).astype(np.float32),
        rng.standard_normal((4, 3, 5, 5)).astype(np.float32),
    )
    w, b = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    xt, gyt, wt, bt = _t(queue, x), _t(queue, gy), _t(queue, w), _t(queue, b)
    _, sm, si = Nm.batch_norm(xt, wt, bt, None, None, True, activation="relu")
    Nm.batch_norm_backward(gyt, xt, wt, sm, si, True, bias=bt, activation="relu")  # build the kernels first
    with count_launches() as fwd:
        out, sm, si = Nm.batch_norm(xt, wt, bt, None, None, True, activation="relu")
    with count_launches() as bwd:
        gx, gw, gb = Nm.batch_norm_backward(gyt, xt, wt, sm, si, True, bias=bt, activation="relu")
    assert (fwd.count, bwd.count) == (launches, launches)
    y, _, _, gx_ref, gw_ref, gb_ref = _bn_reference(x.astype(np.float64), w, b, gy, True)
    assert_close(out, y, np.float32, rtol=1e-5, atol=1e-5)
    assert_close(gx, gx_ref, np.float32, rtol=1e-4, atol=1e-4)
    assert_close(gw, gw_ref, np.float32, rtol=1e-4, atol=1e-4)
    assert_close(gb, gb_ref, np.float32, rtol=1e-4, atol=1e-4)


@GROUPS
def test_work_group_reduction_path(queue, rng, monkeypatch):
    """The GPU shape (a work-group of LOCAL items reducing in local memory), run on this device."""
    monkeypatch.setattr(Nm, "local_size_override", 16)
    monkeypatch.setattr(Nm, "FORCE_LAYOUT", "groups")
    x = rng.standard_normal((3, 4, 5, 7))
    w, b, gy = rng.standard_normal(4), rng.standard_normal(4), rng.standard_normal(x.shape)
    out, sm, si = Nm.batch_norm(_t(queue, x), _t(queue, w), _t(queue, b), None, None, True)
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    assert_close(out, ref_bn(x, w, b, mean, var, 1e-5))
    gx, gw, gb = Nm.batch_norm_backward(_t(queue, gy), _t(queue, x), _t(queue, w), sm, si, True)
    xhat = ref_bn(x, np.ones(4), np.zeros(4), mean, var, 1e-5)
    assert_close(gb, gy.sum(axis=(0, 2, 3)))
    assert_close(gw, (gy * xhat).sum(axis=(0, 2, 3)))
    m = x.size // 4
    shp = (1, 4, 1, 1)
    want_gx = (w / np.sqrt(var + 1e-5)).reshape(shp) / m * (
        m * gy - gy.sum(axis=(0, 2, 3)).reshape(shp) - xhat * (gy * xhat).sum(axis=(0, 2, 3)).reshape(shp))
    assert_close(gx, want_gx, rtol=1e-10, atol=1e-12)
    lw, lb = rng.standard_normal(35), rng.standard_normal(35)
    xl = x.reshape(12, 35)
    out, mean_l, rstd_l = Nm.layer_norm(_t(queue, xl), 35, _t(queue, lw), _t(queue, lb))
    assert_close(out, ref_ln(xl, 1, lw, lb, 1e-5))
    gyl = gy.reshape(12, 35)
    _, gw_l, gb_l = Nm.layer_norm_backward(_t(queue, gyl), _t(queue, xl), 35, mean_l, rstd_l, _t(queue, lw),
                                           _t(queue, lb))
    assert_close(gb_l, gyl.sum(axis=0))
    assert_close(gw_l, (gyl * ref_ln(xl, 1, None, None, 1e-5)).sum(axis=0), rtol=1e-10, atol=1e-12)


# x's gradient from its other readers added in the backward's own launch (x_into; engine.partial_gradient):
# float32's bits are those of the separate add, half rounds the sum once; 16 is the GPU shape (vector kernels)
@pytest.mark.parametrize("local", [None, pytest.param(16, marks=GROUPS)])
@pytest.mark.parametrize("dt", ["float32", "float64", "bfloat16"])
def test_row_norm_backward_adds_the_gradient_so_far(queue, rng, monkeypatch, local, dt):
    import ml_dtypes

    from netcl import ops

    half = dt == "bfloat16"
    npdt = np.dtype(ml_dtypes.bfloat16) if half else np.dtype(dt)
    monkeypatch.setattr(Nm, "local_size_override", local)
    x = (rng.standard_normal((5, 9, 40)) * 2 + 1).astype(npdt)
    gy, into = (rng.standard_normal(x.shape).astype(npdt) for _ in range(2))
    w = rng.standard_normal(40).astype(np.float32 if half else npdt)
    b = rng.standard_normal(40).astype(w.dtype)
    x64, gy64, into64 = (a.astype(np.float64) for a in (x, gy, into))
    _, mean, rstd = Nm.layer_norm(_t(queue, x), 40, _t(queue, w), _t(queue, b))
    _, rs = Nm.rms_norm(_t(queue, x), 40, _t(queue, w), eps=1e-6)
    calls = {
        "layer": lambda **kw: Nm.layer_norm_backward(_t(queue, gy), _t(queue, x), 40, mean, rstd,
                                                     _t(queue, w), _t(queue, b), **kw),
        "rms": lambda **kw: Nm.rms_norm_backward(_t(queue, gy), _t(queue, x), 40, rs, _t(queue, w), **kw),
    }
    xhat = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    g = gy64 * w
    want = {"layer": (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
            / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)}
    r = 1 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6)
    want["rms"] = r * (g - x64 * r * (g * x64 * r).mean(-1, keepdims=True))
    for name, call in calls.items():
        fused = call(x_into=_t(queue, into))[0].to_host()
        alone = call()[0]
        if half:  # one rounding of the sum: within half's precision of float64's
            ulp = 2.0**-7
            scale = np.abs(want[name] + into64).max()
            assert_close(fused.astype(np.float64), want[name] + into64, rtol=2 * ulp, atol=2 * ulp * scale)
        else:
            np.testing.assert_array_equal(fused, ops.add(alone, _t(queue, into)).to_host(), err_msg=name)
            tol = dict(rtol=2e-5, atol=2e-4) if dt == "float32" else dict(rtol=1e-10, atol=1e-10)
            assert_close(fused, want[name] + into64, npdt, **tol)
    with pytest.raises(ShapeError, match="into"):
        calls["rms"](x_into=_t(queue, into[:, :3]))
