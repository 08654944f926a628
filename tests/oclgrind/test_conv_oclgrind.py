"""Convolution, pooling and normalisation kernels under Oclgrind (conv_direct.cl, winograd.cl,
im2col.cl, pool.cl, norm.cl, norm_batch.cl) on tiny odd shapes with padding, stride, dilation and groups,
forward and
backward, checked against float64 NumPy."""

from __future__ import annotations

import dataclasses
import inspect
import math

import numpy as np
import pytest

from netcl import kernels, ops
from netcl.core import capture
from netcl.core.tensor import Tensor
from netcl.ops import conv as conv_mod
from netcl.ops import norm as norm_mod
from tests.oclgrind.cases import close, dev, oclgrind_only

pytestmark = oclgrind_only


def _call(fn, *args, algorithm=None, **kw):
    """fn(*args, **kw), with algorithm= only where fn takes one (the backward paths grew that switch)."""
    if algorithm is not None and "algorithm" in inspect.signature(fn).parameters:
        kw["algorithm"] = algorithm
    return fn(*args, **kw)


def conv_ref(x, w, b, stride, pad, dil, groups):
    N, C, H, W = x.shape
    K, Cg, KH, KW = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dil
    OH = (H + 2 * ph - dh * (KH - 1) - 1) // sh + 1
    OW = (W + 2 * pw - dw * (KW - 1) - 1) // sw + 1
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    Kg = K // groups
    out = np.zeros((N, K, OH, OW))
    for g in range(groups):
        for kh in range(KH):
            for kw in range(KW):
                patch = xp[:, g * Cg:(g + 1) * Cg, kh * dh:kh * dh + sh * (OH - 1) + 1:sh,
                           kw * dw:kw * dw + sw * (OW - 1) + 1:sw]
                out[:, g * Kg : (g + 1) * Kg] += np.einsum(
                    "nchw,kc->nkhw", patch, w[g * Kg : (g + 1) * Kg, :, kh, kw]
                )
    return out + (b[None, :, None, None] if b is not None else 0)


def conv_grads_ref(x, w, gy, stride, pad, dil, groups):
    N, C, H, W = x.shape
    K, Cg, KH, KW = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dil
    OH, OW = gy.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    gxp = np.zeros_like(xp)
    gw = np.zeros(w.shape)
    Kg = K // groups
    for g in range(groups):
        gk = slice(g * Kg, (g + 1) * Kg)
        for kh in range(KH):
            for kw in range(KW):
                sl = (
                    slice(None),
                    slice(g * Cg, (g + 1) * Cg),
                    slice(kh * dh, kh * dh + sh * (OH - 1) + 1, sh),
                    slice(kw * dw, kw * dw + sw * (OW - 1) + 1, sw),
                )
                gxp[sl] += np.einsum("nkhw,kc->nchw", gy[:, gk], w[gk, :, kh, kw])
                gw[gk, :, kh, kw] = np.einsum("nkhw,nchw->kc", gy[:, gk], xp[sl])
    return gxp[:, :, ph:ph + H, pw:pw + W], gw


# (x shape, w shape, stride, padding, dilation, groups, algorithm)
CONVS = [
    ((2, 3, 7, 5), (5, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1, "direct"),
    ((1, 4, 6, 9), (18, 2, 2, 3), (2, 3), (1, 0), (2, 1), 2, "direct"),  # KB=8 block with a ragged tail
    ((2, 3, 5, 7), (3, 1, 3, 3), (2, 1), (1, 2), (1, 1), 3, "depthwise"),
    ((2, 3, 7, 5), (5, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1, "winograd"),  # odd H, W: partial 2x2 tiles
    ((1, 2, 5, 6), (11, 2, 3, 3), (1, 1), (0, 2), (1, 1), 1, "winograd"),  # K not a multiple of KB
    ((2, 3, 6, 5), (4, 3, 3, 2), (2, 1), (1, 1), (1, 2), 1, "im2col"),
]


@pytest.mark.parametrize("xs,ws,stride,pad,dil,groups,algo", CONVS)
def test_conv2d_forward(queue, xs, ws, stride, pad, dil, groups, algo):
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    got = ops.conv2d(
        dev(queue, x.astype(np.float32)),
        dev(queue, w.astype(np.float32)),
        dev(queue, b.astype(np.float32)),
        stride,
        pad,
        dil,
        groups,
        activation="relu",
        algorithm=algo,
    )
    close(got, np.maximum(conv_ref(x, w, b, stride, pad, dil, groups), 0), 1e-4, 1e-4)


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_im2col_both_layouts(device, queue, monkeypatch, kind):
    """The GPU (one work-item per element) and CPU (whole rows/planes) im2col/col2im kernels, whatever
    the device reports."""
    monkeypatch.setattr(device, "capabilities", dataclasses.replace(device.capabilities, kind=kind))
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((2, 3, 2, 3))
    got = ops.conv2d(dev(queue, x.astype(np.float32)), dev(queue, w.astype(np.float32)), None, (1, 2), (2, 1),
                     (2, 1), 1, algorithm="im2col")
    close(got, conv_ref(x, w, None, (1, 2), (2, 1), (2, 1), 1), 1e-4, 1e-4)
    # the backward GEMM paths: col2im / col2im_plane and the batch-inner im2col
    gy = rng.standard_normal(got.shape)
    gx_ref, gw_ref = conv_grads_ref(x, w, gy, (1, 2), (2, 1), (2, 1), 1)
    gyt = dev(queue, gy.astype(np.float32))
    close(_call(ops.conv2d_backward_input, gyt, dev(queue, w.astype(np.float32)), x.shape, (1, 2), (2, 1),
                (2, 1), 1, algorithm="gemm"), gx_ref, 1e-4, 1e-4)
    close(_call(ops.conv2d_backward_weight, dev(queue, x.astype(np.float32)), gyt, w.shape, (1, 2), (2, 1),
                (2, 1), 1, algorithm="gemm"), gw_ref, 1e-4, 1e-4)


@pytest.mark.parametrize("xs,ws,stride,pad,dil,groups,algo", CONVS[:3])
@pytest.mark.parametrize("bwd", ["gemm", "direct"])
def test_conv2d_backward(queue, xs, ws, stride, pad, dil, groups, algo, bwd):
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    y = conv_ref(x, w, None, stride, pad, dil, groups)
    gy = rng.standard_normal(y.shape)
    gx_ref, gw_ref = conv_grads_ref(x, w, gy, stride, pad, dil, groups)
    gyt = dev(queue, gy.astype(np.float32))
    gx = _call(ops.conv2d_backward_input, gyt, dev(queue, w.astype(np.float32)), xs, stride, pad, dil, groups,
               algorithm=bwd)
    gw = _call(
        ops.conv2d_backward_weight,
        dev(queue, x.astype(np.float32)),
        gyt,
        ws,
        stride,
        pad,
        dil,
        groups,
        algorithm=bwd,
    )
    close(gx, gx_ref, 1e-4, 1e-4)
    close(gw, gw_ref, 1e-4, 1e-4)
    close(ops.conv2d_backward_bias(gyt), gy.sum(axis=(0, 2, 3)), 1e-4, 1e-4)


@pytest.mark.parametrize("layout", ["rows", "tiles", "flat", "tiles-apart"])
def test_winograd_layouts_and_backward(queue, monkeypatch, layout):
    """Both Winograd kernel layouts (the CPU's row walkers, the GPU's per-tile ones, also as a padded 1-D
    launch: flat; their transforms batched into one launch, or a launch each: tiles-apart): forward,
    backward data (flipped filters transformed from the weight) and backward weight (2 tile slices
    summed), then both backward passes together (the GPUs' four transforms in one launch)."""
    from netcl.ops.conv.backward import _conv2d_backward

    monkeypatch.setattr(conv_mod.winograd, "_winograd_rows", lambda device: layout == "rows")
    monkeypatch.setattr(conv_mod.winograd, "BATCH_TRANSFORMS", layout != "tiles-apart")
    monkeypatch.setattr(conv_mod.choice, "backward_input_algorithm", lambda device, p, dt: "flipped")
    monkeypatch.setattr(conv_mod.choice, "backward_weight_algorithm", lambda device, p, dt: "winograd")
    monkeypatch.setattr(conv_mod.winograd, "WINOGRAD_FLAT", 32 if layout == "flat" else 0)
    monkeypatch.setattr(conv_mod.choice, "_auto_algorithm", lambda device, p, dt: "winograd")
    monkeypatch.setattr(conv_mod.winograd, "_winograd_splits", lambda device, p, pt: 2 if pt % 2 == 0 else 1)
    monkeypatch.setattr(capture, "plans", capture.PlanCache())
    rng = np.random.default_rng(11)
    xs, ws = (2, 3, 5, 7), (4, 3, 3, 3)   # odd sizes: partial tiles; TW 4 (CH 4) forward, TW 4 backward
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(4)
    f = lambda a: dev(queue, a.astype(np.float32))  # noqa: E731
    got = ops.conv2d(f(x), f(w), f(b), 1, 1, activation="relu", algorithm="winograd")
    close(got, np.maximum(conv_ref(x, w, b, (1, 1), (1, 1), (1, 1), 1), 0), 1e-4, 1e-4)
    gy = rng.standard_normal(got.shape)
    gx_ref, gw_ref = conv_grads_ref(x, w, gy, (1, 1), (1, 1), (1, 1), 1)
    close(ops.conv2d_backward_input(f(gy), f(w), xs, 1, 1, algorithm="flipped"), gx_ref, 1e-4, 1e-4)
    close(ops.conv2d_backward_weight(f(x), f(gy), ws, 1, 1, algorithm="winograd"), gw_ref, 1e-4, 1e-4)
    gx, gw, _ = _conv2d_backward(f(gy), f(x), f(w), None, 1, 1, 1, 1, None, (True, True, False))
    close(gx, gx_ref, 1e-4, 1e-4)
    close(gw, gw_ref, 1e-4, 1e-4)


def test_col2im_kernel(queue):
    """col2im has no caller in netcl/ops yet: launched directly, the adjoint of im2col, into image n0=1 of
    2."""
    xs, ws, stride, pad, dil, groups = (2, 4, 5, 6), (2, 2, 2, 3), (2, 1), (1, 1), (1, 2), 2
    p = conv_mod.ConvParams(xs, ws, stride, pad, dil, groups)
    R, P = p.Cg * p.KH * p.KW, p.OH * p.OW
    rng = np.random.default_rng(4)
    cols = rng.standard_normal((1, groups, R, P))
    gx = Tensor.zeros(queue, xs, np.float32)
    prg = kernels.program(queue.device, "im2col.cl", dtype=np.float32)
    g = p.geometry()
    prg.col2im(queue, (p.W, p.H, p.C), None, dev(queue, cols.astype(np.float32)).buffer, gx.buffer,
               np.int64(0), np.int32(1), np.int32(1), g[1], g[2], g[3], *g[5:])
    # adjoint: gx[n=1] = sum over taps of cols placed at the positions im2col reads
    want = np.zeros(xs)
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dil
    xp = np.zeros((p.C, p.H + 2 * ph, p.W + 2 * pw))
    c6 = cols[0].reshape(groups, p.Cg, p.KH, p.KW, p.OH, p.OW)
    for gi in range(groups):
        for kh in range(p.KH):
            for kw in range(p.KW):
                xp[gi * p.Cg:(gi + 1) * p.Cg, kh * dh:kh * dh + sh * (p.OH - 1) + 1:sh,
                   kw * dw:kw * dw + sw * (p.OW - 1) + 1:sw] += c6[gi, :, kh, kw]
    want[1] = xp[:, ph:ph + p.H, pw:pw + p.W]
    close(gx, want, 1e-5, 1e-5)


# -- pooling -------------------------------------------------------------------------------------
def _pool_windows(H, OH, k, s, p):
    return [(max(o * s - p, 0), min(o * s - p + k, H)) for o in range(OH)]


@pytest.mark.parametrize("ceil_mode,bwd", [(False, "auto"), (True, "plane")])
def test_max_pool(queue, ceil_mode, bwd):
    rng = np.random.default_rng(5)
    x = rng.permutation(2 * 3 * 7 * 6).reshape(2, 3, 7, 6).astype(np.float64)  # distinct values: no ties
    k, s, p = (3, 2), (2, 2), (1, 0)
    out, idx = ops.max_pool2d(dev(queue, x.astype(np.float32)), k, s, p, ceil_mode=ceil_mode)
    OH, OW = out.shape[2:]
    want = np.zeros(out.shape)
    gy = rng.standard_normal(out.shape)
    gx = np.zeros(x.shape)
    for i, (h0, h1) in enumerate(_pool_windows(7, OH, k[0], s[0], p[0])):
        for j, (w0, w1) in enumerate(_pool_windows(6, OW, k[1], s[1], p[1])):
            win = x[:, :, h0:h1, w0:w1].reshape(2, 3, -1)
            want[:, :, i, j] = win.max(-1)
            a = win.argmax(-1)
            for n in range(2):
                for c in range(3):
                    gx[n, c, h0 + a[n, c] // (w1 - w0), w0 + a[n, c] % (w1 - w0)] += gy[n, c, i, j]
    close(out, want)
    got = _call(ops.max_pool2d_backward, dev(queue, gy.astype(np.float32)), idx, x.shape, k, s, p,
                ceil_mode=ceil_mode, algorithm=bwd)
    close(got, gx)


def test_avg_pool(queue):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 7, 5))
    k, s, p = (3, 2), (2, 1), (1, 1)
    for include in (True, False):
        out = ops.avg_pool2d(dev(queue, x.astype(np.float32)), k, s, p, count_include_pad=include)
        OH, OW = out.shape[2:]
        gy = rng.standard_normal(out.shape)
        want, gx = np.zeros(out.shape), np.zeros(x.shape)
        for i, (h0, h1) in enumerate(_pool_windows(7, OH, k[0], s[0], p[0])):
            for j, (w0, w1) in enumerate(_pool_windows(5, OW, k[1], s[1], p[1])):
                div = k[0] * k[1] if include else (h1 - h0) * (w1 - w0)
                want[:, :, i, j] = x[:, :, h0:h1, w0:w1].sum(axis=(2, 3)) / div
                gx[:, :, h0:h1, w0:w1] += (gy[:, :, i, j] / div)[:, :, None, None]
        close(out, want)
        close(ops.avg_pool2d_backward(dev(queue, gy.astype(np.float32)), x.shape, k, s, p,
                                      count_include_pad=include), gx)


def test_adaptive_avg_pool(queue):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 3, 7, 5))
    OH, OW = 3, 4
    out = ops.adaptive_avg_pool2d(dev(queue, x.astype(np.float32)), (OH, OW))
    gy = rng.standard_normal((1, 3, OH, OW))
    want, gx = np.zeros((1, 3, OH, OW)), np.zeros(x.shape)
    for i in range(OH):
        h0, h1 = (i * 7) // OH, math.ceil((i + 1) * 7 / OH)
        for j in range(OW):
            w0, w1 = (j * 5) // OW, math.ceil((j + 1) * 5 / OW)
            want[:, :, i, j] = x[:, :, h0:h1, w0:w1].mean(axis=(2, 3))
            gx[:, :, h0:h1, w0:w1] += (gy[:, :, i, j] / ((h1 - h0) * (w1 - w0)))[:, :, None, None]
    close(out, want)
    close(ops.adaptive_avg_pool2d_backward(dev(queue, gy.astype(np.float32)), x.shape), gx)


# -- normalisation -------------------------------------------------------------------------------
def _ln_backward(xhat, rstd, gyw):
    """grad of (x - mean) * rstd along the last axis, given gy * weight."""
    return rstd * (gyw - gyw.mean(-1, keepdims=True) - xhat * (gyw * xhat).mean(-1, keepdims=True))


def test_batch_norm(queue):
    rng = np.random.default_rng(8)
    x, w, b = rng.standard_normal((3, 5, 2, 3)), rng.standard_normal(5), rng.standard_normal(5)
    rm, rv = rng.standard_normal(5), rng.random(5) + 0.5
    f = lambda a: dev(queue, a.astype(np.float32))  # noqa: E731
    rmt, rvt = f(rm), f(rv)
    out, mean, invstd = ops.batch_norm(f(x), f(w), f(b), rmt, rvt, True, momentum=0.1, eps=1e-5)
    mu, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    inv = 1 / np.sqrt(var + 1e-5)
    xhat = (x - mu[None, :, None, None]) * inv[None, :, None, None]
    close(out, xhat * w[None, :, None, None] + b[None, :, None, None], 1e-4, 1e-4)
    close(rmt, 0.9 * rm + 0.1 * mu, 1e-4, 1e-4)
    close(rvt, 0.9 * rv + 0.1 * x.var(axis=(0, 2, 3), ddof=1), 1e-4, 1e-4)
    gy = rng.standard_normal(x.shape)
    gx, gw, gb = ops.batch_norm_backward(f(gy), f(x), f(w), mean, invstd, True)
    m = x.size // 5
    gsum, gxh = gy.sum(axis=(0, 2, 3)), (gy * xhat).sum(axis=(0, 2, 3))
    want = (
        (w * inv)[None, :, None, None]
        / m
        * (m * gy - gsum[None, :, None, None] - xhat * gxh[None, :, None, None])
    )
    close(gx, want, 1e-4, 1e-4)
    close(gw, gxh, 1e-4, 1e-4)
    close(gb, gsum, 1e-4, 1e-4)
    ev, _, _ = ops.batch_norm(f(x), f(w), f(b), f(rm), f(rv), False)
    close(ev, (x - rm[None, :, None, None]) / np.sqrt(rv + 1e-5)[None, :, None, None] * w[None, :, None, None]
          + b[None, :, None, None], 1e-4, 1e-4)


@pytest.mark.parametrize(
    "layout,parts,shape,offset,fused,chained",
    [("runs", 2, (4, 3, 2, 5), 0, False, False), ("groups", 1, (3, 2, 4, 4), 0, False, False),
     ("groups", 3, (3, 2, 5, 3), 1, False, False), ("groups", 3, (3, 2, 4, 4), 0, True, False),
     ("groups", 3, (3, 2, 4, 4), 0, True, True), ("groups", 1, (3, 2, 5, 3), 1, True, True)],
)
def test_batch_norm_layouts(queue, monkeypatch, layout, parts, shape, offset, fused, chained):
    """norm_batch.cl's CPU runs and GPU work-group trees (4-wide loads when aligned, scalar at an odd
    offset), one part per channel or several (the finalize kernels, or the last work-group: fused), each
    way as one launch (chained), relu fused, and eval."""
    monkeypatch.setattr(norm_mod, "FUSED_FINALIZE", fused)
    monkeypatch.setattr(norm_mod, "CHAINED", chained)
    monkeypatch.setattr(norm_mod, "FORCE_LAYOUT", layout)
    monkeypatch.setattr(norm_mod, "PARTS", parts)
    monkeypatch.setattr(norm_mod, "local_size_override", 4 if layout == "groups" else None)
    rng = np.random.default_rng(12)
    c = shape[1]
    x, w, b, gy = (
        rng.standard_normal(shape),
        rng.standard_normal(c),
        rng.standard_normal(c),
        rng.standard_normal(shape),
    )
    f = lambda a: dev(queue, a.astype(np.float32))  # noqa: E731
    xt = dev(queue, np.concatenate([np.zeros(offset), x.ravel()]).astype(np.float32))[offset:].reshape(shape)
    rmt, rvt = f(np.zeros(c)), f(np.ones(c))
    out, mean, invstd = ops.batch_norm(xt, f(w), f(b), rmt, rvt, True, activation="relu")
    axes = (0, 2, 3)
    mu, inv = x.mean(axis=axes), 1 / np.sqrt(x.var(axis=axes) + 1e-5)
    bc = lambda v: v[None, :, None, None]  # noqa: E731
    xhat = (x - bc(mu)) * bc(inv)
    y = xhat * bc(w) + bc(b)
    close(out, np.maximum(y, 0), 1e-4, 1e-4)
    close(rvt, 0.9 + 0.1 * x.var(axis=axes, ddof=1), 1e-4, 1e-4)
    g = np.where(y > 0, gy, 0)
    m = x.size // c
    gsum, gxh = g.sum(axis=axes), (g * xhat).sum(axis=axes)
    gx, gw, gb = ops.batch_norm_backward(f(gy), xt, f(w), mean, invstd, True, bias=f(b), activation="relu")
    close(gx, bc(w * inv) / m * (m * g - bc(gsum) - xhat * bc(gxh)), 1e-4, 1e-4)
    close(gw, gxh, 1e-4, 1e-4)
    close(gb, gsum, 1e-4, 1e-4)
    ev, _, _ = ops.batch_norm(xt, f(w), f(b), rmt, rvt, False)
    close(ev, (x - bc(rmt.to_host())) / np.sqrt(bc(rvt.to_host()) + 1e-5) * bc(w) + bc(b), 1e-4, 1e-4)


def test_layer_and_rms_norm(queue):
    rng = np.random.default_rng(9)
    x, w, b = rng.standard_normal((7, 3, 5)), rng.standard_normal((3, 5)), rng.standard_normal((3, 5))
    gy = rng.standard_normal(x.shape)
    f = lambda a: dev(queue, a.astype(np.float32))  # noqa: E731
    xr, wr, gr = x.reshape(7, 15), w.reshape(15), gy.reshape(7, 15)
    out, mean, rstd = ops.layer_norm(f(x), (3, 5), f(w), f(b))
    mu, rs = xr.mean(-1, keepdims=True), 1 / np.sqrt(xr.var(-1, keepdims=True) + 1e-5)
    xhat = (xr - mu) * rs
    close(out, (xhat * wr + b.reshape(15)).reshape(x.shape), 1e-4, 1e-4)
    gx, gw, gb = ops.layer_norm_backward(f(gy), f(x), (3, 5), mean, rstd, f(w), f(b))
    close(gx, _ln_backward(xhat, rs, gr * wr).reshape(x.shape), 1e-4, 1e-4)
    close(gw, (gr * xhat).sum(0).reshape(3, 5), 1e-4, 1e-4)
    close(gb, gr.sum(0).reshape(3, 5), 1e-4, 1e-4)
    out, rstd = ops.rms_norm(f(x), (3, 5), f(w), eps=1e-6)
    r = 1 / np.sqrt((xr * xr).mean(-1, keepdims=True) + 1e-6)
    close(out, (xr * r * wr).reshape(x.shape), 1e-4, 1e-4)
    gx, gw = ops.rms_norm_backward(f(gy), f(x), (3, 5), rstd, f(w))
    g = gr * wr
    close(gx, (r * (g - xr * r * r * (g * xr).mean(-1, keepdims=True))).reshape(x.shape), 1e-4, 1e-4)
    close(gw, (gr * xr * r).sum(0).reshape(3, 5), 1e-4, 1e-4)


def test_group_norm(queue):
    rng = np.random.default_rng(10)
    N, C, G = 2, 6, 3
    x, w, b = rng.standard_normal((N, C, 3, 5)), rng.standard_normal(C), rng.standard_normal(C)
    gy = rng.standard_normal(x.shape)
    f = lambda a: dev(queue, a.astype(np.float32))  # noqa: E731
    out, mean, rstd = ops.group_norm(f(x), G, f(w), f(b))
    xg = x.reshape(N, G, -1)
    mu, rs = xg.mean(-1, keepdims=True), 1 / np.sqrt(xg.var(-1, keepdims=True) + 1e-5)
    xhat = ((xg - mu) * rs).reshape(x.shape)
    close(out, xhat * w[None, :, None, None] + b[None, :, None, None], 1e-4, 1e-4)
    gx, gw, gb = ops.group_norm_backward(f(gy), f(x), G, mean, rstd, f(w), f(b))
    gyw = (gy * w[None, :, None, None]).reshape(N, G, -1)
    close(gx, _ln_backward(xhat.reshape(N, G, -1), rs, gyw).reshape(x.shape), 1e-4, 1e-4)
    close(gw, (gy * xhat).sum(axis=(0, 2, 3)), 1e-4, 1e-4)
    close(gb, gy.sum(axis=(0, 2, 3)), 1e-4, 1e-4)
