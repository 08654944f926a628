"""conv2d forward/backward, conv_transpose2d, algorithms, Winograd's error bound, errors
(netcl/ops/conv/)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from netcl.core import capture
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, ShapeError
from netcl.ops import conv as C
from tests.reference import assert_close


# -- float64 NumPy references --------------------------------------------------------------------
def _geom(x_shape, w_shape, stride, pad, dil):
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dil
    _, _, h, w = x_shape
    _, _, kh, kw = w_shape
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    return oh, ow


def _windows(kh, kw, stride, dil, oh, ow):
    (sh, sw), (dh, dw) = stride, dil
    for i in range(kh):
        for j in range(kw):
            yield (
                i,
                j,
                np.s_[
                    :, :, i * dh : i * dh + sh * (oh - 1) + 1 : sh, j * dw : j * dw + sw * (ow - 1) + 1 : sw
                ],
            )


def ref_conv(x, w, b=None, stride=(1, 1), pad=(0, 0), dil=(1, 1), groups=1, relu=False):
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, _, _ = x.shape
    k, cg, kh, kw = w.shape
    oh, ow = _geom(x.shape, w.shape, stride, pad, dil)
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    out = np.zeros((n, k, oh, ow))
    kg = k // groups
    for g in range(groups):
        xg = xp[:, g * cg:(g + 1) * cg]
        for i, j, sl in _windows(kh, kw, stride, dil, oh, ow):
            out[:, g * kg:(g + 1) * kg] += np.einsum("nchw,kc->nkhw", xg[sl], w[g * kg:(g + 1) * kg, :, i, j])
    if b is not None:
        out += b.astype(np.float64)[None, :, None, None]
    return np.maximum(out, 0) if relu else out


def ref_conv_backward(x_shape, w, gy, stride=(1, 1), pad=(0, 0), dil=(1, 1), groups=1, x=None):
    """(grad_x, grad_w) of conv2d by the adjoint of ref_conv's sums."""
    n, c, h, wd = x_shape
    k, cg, kh, kw = w.shape
    oh, ow = gy.shape[2:]
    kg = k // groups
    gxp = np.zeros((n, c, h + 2 * pad[0], wd + 2 * pad[1]))
    gw = np.zeros(w.shape)
    xp = (
        None
        if x is None
        else np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    )
    for g in range(groups):
        cs, ks = slice(g * cg, (g + 1) * cg), slice(g * kg, (g + 1) * kg)
        for i, j, sl in _windows(kh, kw, stride, dil, oh, ow):
            gxp[:, cs][sl] += np.einsum("nkhw,kc->nchw", gy[:, ks], w[ks, :, i, j])
            if xp is not None:
                gw[ks, :, i, j] = np.einsum("nkhw,nchw->kc", gy[:, ks], xp[:, cs][sl])
    gx = gxp[:, :, pad[0]:pad[0] + h, pad[1]:pad[1] + wd]
    return gx, gw


def _data(rng, shape, dt=np.float32):
    return rng.standard_normal(shape).astype(dt)


# -- forward -------------------------------------------------------------------------------------
CASES = [
    # (N, C, H, W), (K, Cg, KH, KW), stride, padding, dilation, groups, algorithm
    ((2, 3, 7, 9), (5, 3, 3, 3), 1, 1, 1, 1, "direct"),
    ((1, 4, 13, 11), (17, 4, 3, 2), 2, (1, 2), 2, 1, "direct"),
    ((3, 6, 9, 8), (9, 2, 3, 3), (1, 2), 1, 1, 3, "auto"),        # grouped
    ((2, 5, 10, 7), (10, 1, 3, 3), 1, 1, 1, 5, "auto"),           # depthwise, multiplier 2
    ((2, 9, 11, 13), (7, 9, 3, 3), 1, 1, 1, 1, "winograd"),
    ((1, 8, 6, 5), (8, 8, 3, 3), 1, 0, 1, 1, "winograd"),         # odd output, no padding
    ((2, 3, 5, 5), (4, 3, 1, 1), 1, 0, 1, 1, "auto"),             # 1x1
    ((3, 6, 9, 8), (9, 2, 3, 2), (2, 1), (1, 0), (1, 2), 3, "im2col"),
]


@pytest.mark.parametrize("xs,ws,stride,pad,dil,groups,algo", CASES)
def test_conv2d_forward_matches_reference(queue, rng, xs, ws, stride, pad, dil, groups, algo):
    x, w, b = _data(rng, xs), _data(rng, ws), _data(rng, (ws[0],))
    p = C.ConvParams(xs, ws, stride, pad, dil, groups)
    out = C.conv2d(Tensor.from_host(queue, x), Tensor.from_host(queue, w), Tensor.from_host(queue, b),
                   stride=stride, padding=pad, dilation=dil, groups=groups, algorithm=algo)
    want = ref_conv(x, w, b, (p.SH, p.SW), (p.PH, p.PW), (p.DH, p.DW), groups)
    assert_close(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("algo", ["direct", "winograd", "im2col"])
def test_conv2d_relu_fused_and_no_bias(queue, rng, algo):
    x, w, b = _data(rng, (2, 8, 9, 7)), _data(rng, (8, 8, 3, 3)), _data(rng, (8,))
    xt, wt = Tensor.from_host(queue, x), Tensor.from_host(queue, w)
    out = C.conv2d_relu(xt, wt, Tensor.from_host(queue, b), padding=1, algorithm=algo)
    assert_close(out, ref_conv(x, w, b, pad=(1, 1), relu=True), rtol=1e-4, atol=1e-4)
    out = C.conv2d(xt, wt, padding=1, algorithm=algo)
    assert_close(out, ref_conv(x, w, pad=(1, 1)), rtol=1e-4, atol=1e-4)


def test_im2col_in_chunks(queue, rng, monkeypatch):
    monkeypatch.setattr(C.im2col, "_im2col_chunk", lambda device, p, itemsize: 2)
    x, w, b = _data(rng, (5, 4, 6, 7)), _data(rng, (6, 4, 3, 3)), _data(rng, (6,))
    out = C.conv2d_relu(Tensor.from_host(queue, x), Tensor.from_host(queue, w), Tensor.from_host(queue, b),
                        stride=2, padding=1, algorithm="im2col")
    assert_close(out, ref_conv(x, w, b, (2, 2), (1, 1), relu=True), rtol=1e-4, atol=1e-4)


def test_conv2d_float64_and_noncontiguous_input(queue, rng):
    x = _data(rng, (2, 7, 6, 3), np.float64)  # stored NHWC, viewed as NCHW
    w = _data(rng, (4, 3, 2, 3), np.float64)
    xt = Tensor.from_host(queue, x).permute(0, 3, 1, 2)
    out = C.conv2d(xt, Tensor.from_host(queue, w), stride=(2, 1), padding=1)
    assert_close(out, ref_conv(x.transpose(0, 3, 1, 2), w, stride=(2, 1), pad=(1, 1)), rtol=1e-12, atol=1e-12)


def test_auto_picks_by_shape(device):
    assert (
        C.select_algorithm(device, C.ConvParams((1, 8, 8, 8), (8, 1, 3, 3), 1, 1, 1, 8), np.float32)
        == "depthwise"
    )
    # 3x3 stride 1: Winograd when large (GPUs from 1 GFLOP; CPUs from 2^27 FLOPs with >= 32 channels, the
    # row-walking transforms), im2col + GEMM for small convolutions (launch-bound) and thin layers
    big = C.ConvParams((32, 128, 56, 56), (128, 128, 3, 3), 1, 1, 1, 1)
    assert C.select_algorithm(device, big, np.float32) == "winograd"
    cifar = C.ConvParams((32, 64, 32, 32), (64, 64, 3, 3), 1, 1, 1, 1)  # 1.2 GFLOP: ResNet-18's first stage
    assert C.select_algorithm(device, cifar, np.float32) == "winograd"
    thin = C.ConvParams((32, 16, 32, 32), (16, 16, 3, 3), 1, 1, 1, 1)
    assert C.select_algorithm(device, thin, np.float32) == (
        "im2col" if device.capabilities.kind == "cpu" else "winograd" if thin.flops >= C.WINOGRAD_MIN_FLOPS
        else "im2col")
    assert (
        C.select_algorithm(device, C.ConvParams((1, 16, 8, 8), (16, 16, 3, 3), 1, 1, 1, 1), np.float32)
        == "im2col"
    )
    assert (
        C.select_algorithm(device, C.ConvParams((1, 16, 8, 8), (16, 16, 3, 3), 2, 1, 1, 1), np.float32)
        != "winograd"
    )


def test_winograd_error_bound(queue, rng):
    """Winograd F(2x2,3x3) error, stated: |y - y_exact| <= 4 * eps32 * sqrt(9C) * (|x| conv |w|).

    The bound is relative to the conv of absolute values (the error scale of any float32 dot
    product of length 9C); direct float32 convolution meets the same bound with ~2x margin less.
    """
    xs, ws = (2, 32, 14, 13), (16, 32, 3, 3)
    x, w = _data(rng, xs), _data(rng, ws)
    xt, wt = Tensor.from_host(queue, x), Tensor.from_host(queue, w)
    exact = ref_conv(x, w, pad=(1, 1))
    scale = ref_conv(np.abs(x), np.abs(w), pad=(1, 1))
    eps = np.finfo(np.float32).eps
    bound = 4 * eps * np.sqrt(9 * xs[1]) * scale
    wino = C.conv2d(xt, wt, padding=1, algorithm="winograd").to_host().astype(np.float64)
    direct = C.conv2d(xt, wt, padding=1, algorithm="direct").to_host().astype(np.float64)
    assert np.all(np.abs(wino - exact) <= bound), np.max(np.abs(wino - exact) / bound)
    assert np.all(np.abs(direct - exact) <= bound)
    # and Winograd is at most a small constant worse than direct on the same data
    assert np.max(np.abs(wino - exact) / scale) <= 8 * max(np.max(np.abs(direct - exact) / scale), eps)


# -- Winograd in both kernel layouts, and run backwards ------------------------------------------
# (x shape, K, padding): the CPU row kernels take CH = 8, 4, 1, 2 tiles of a row at a time (TW = 8, 4, 5, 6
# forward); the flipped backward-data convolution's rows are W wide (TW 8, 4, 6, 5); odd sizes leave
# partial 2x2 tiles.
WINOGRAD_CASES = [((2, 5, 9, 16), 7, 1), ((3, 4, 7, 7), 6, 1), ((1, 6, 8, 12), 3, 0), ((2, 3, 6, 10), 5, 2)]


@pytest.fixture(params=["rows", "tiles"])
def winograd_layout(request, monkeypatch):
    """The CPU's row-walking transforms or the GPU's one-work-item-per-tile ones, on this device."""
    monkeypatch.setattr(C.winograd, "_winograd_rows", lambda device: request.param == "rows")
    monkeypatch.setattr(capture, "plans", capture.PlanCache())  # other tests' plans must not decide the path
    return request.param


@pytest.mark.parametrize("xs,k,pad", WINOGRAD_CASES)
def test_winograd_three_passes_float64(queue, rng, monkeypatch, winograd_layout, xs, k, pad):
    """Forward (bias + relu), backward data through the flipped convolution on Winograd (the rotated,
    transposed filters transformed straight from the weight) and backward weight (F(2x2, 3x3) run
    backwards) against the float64 adjoint: in float64 Winograd is exact to rounding."""
    monkeypatch.setattr(C.choice, "_auto_algorithm", lambda device, p, dt: "winograd")
    ws = (k, xs[1], 3, 3)
    p = C.ConvParams(xs, ws, 1, pad, 1, 1)
    x, w, b = _data(rng, xs, np.float64), _data(rng, ws, np.float64), _data(rng, (k,), np.float64)
    gy = _data(rng, p.output_shape, np.float64)
    xt, wt, gyt = Tensor.from_host(queue, x), Tensor.from_host(queue, w), Tensor.from_host(queue, gy)
    out = C.conv2d(xt, wt, Tensor.from_host(queue, b), padding=pad, activation="relu", algorithm="winograd")
    assert_close(out, ref_conv(x, w, b, pad=(pad, pad), relu=True), rtol=1e-11, atol=1e-11)
    gx_ref, gw_ref = ref_conv_backward(xs, w, gy, pad=(pad, pad), x=x)
    assert_close(C.conv2d_backward_input(gyt, wt, xs, padding=pad, algorithm="flipped"), gx_ref, rtol=1e-11,
                 atol=1e-11)
    assert_close(C.conv2d_backward_weight(xt, gyt, ws, padding=pad, algorithm="winograd"), gw_ref, rtol=1e-11,
                 atol=1e-11)


@pytest.mark.parametrize("xs,k,pad", WINOGRAD_CASES[:2])
def test_winograd_flat_transform_launch(queue, rng, monkeypatch, xs, k, pad):
    """The GPU transforms as a 1-D launch of whole work-groups (WINOGRAD_FLAT: padded past the last
    tile x channel x image), all three passes against float64."""
    monkeypatch.setattr(C.winograd, "_winograd_rows", lambda device: False)
    monkeypatch.setattr(capture, "plans", capture.PlanCache())
    monkeypatch.setattr(C.winograd, "WINOGRAD_FLAT", 64)
    test_winograd_three_passes_float64(queue, rng, monkeypatch, "tiles", xs, k, pad)


@pytest.mark.parametrize("chunk,splits", [(None, 4), (2, 1), (2, 2)])
def test_winograd_weight_gradient_chunks_and_splits(queue, rng, monkeypatch, winograd_layout, chunk, splits):
    """Image chunks accumulate through the GEMM's residual epilogue; the tiles split into S slices whose
    partial products the filter transform sums (the GPUs' split GEMM; S divides every chunk's tiles:
    100, or 40 and 20); float32 views at an offset."""
    if chunk:
        monkeypatch.setattr(C.winograd, "_winograd_chunk", lambda device, p, itemsize, per_tile=None: chunk)
    monkeypatch.setattr(C.winograd, "_winograd_splits", lambda device, p, pt: splits)
    xs, ws = (5, 6, 7, 9), (4, 6, 3, 3)           # 4 x 5 = 20 tiles per image: chunks of 2 and 1 images
    p = C.ConvParams(xs, ws, 1, 1, 1, 1)
    x, w, gy = _data(rng, xs), _data(rng, ws), _data(rng, p.output_shape)
    big = Tensor.from_host(queue, np.concatenate([np.zeros(3, np.float32), x.ravel()]))
    xt = big[3:].reshape(xs)
    gx_ref, gw_ref = ref_conv_backward(xs, w.astype(np.float64), gy.astype(np.float64), pad=(1, 1), x=x)
    gw = C.conv2d_backward_weight(xt, Tensor.from_host(queue, gy), ws, padding=1, algorithm="winograd")
    assert_close(gw, gw_ref, rtol=1e-4, atol=1e-4)


def test_winograd_weight_gradient_error_bound(queue, rng):
    """float32: the Winograd weight gradient's error, relative to the adjoint of absolute values (the
    error scale of its dot products), stays within 8x im2col + GEMM's on the same data."""
    xs, ws = (4, 16, 12, 11), (8, 16, 3, 3)
    p = C.ConvParams(xs, ws, 1, 1, 1, 1)
    x, gy = _data(rng, xs), _data(rng, p.output_shape)
    _, exact = ref_conv_backward(xs, np.zeros(ws), gy.astype(np.float64), pad=(1, 1), x=x)
    _, scale = ref_conv_backward(xs, np.zeros(ws), np.abs(gy).astype(np.float64), pad=(1, 1), x=np.abs(x))
    xt, gyt = Tensor.from_host(queue, x), Tensor.from_host(queue, gy)
    errs = {}
    for algo in ("winograd", "gemm"):
        got = C.conv2d_backward_weight(xt, gyt, ws, padding=1, algorithm=algo).to_host().astype(np.float64)
        errs[algo] = np.max(np.abs(got - exact) / scale)
    eps = np.finfo(np.float32).eps
    assert errs["winograd"] <= 4 * eps * np.sqrt(p.N * p.OH * p.OW), errs
    assert errs["winograd"] <= 8 * max(errs["gemm"], eps), errs


def test_tuned_backward_algorithms(device, queue, rng, monkeypatch, tmp_path):
    """bench/conv.py --tune's per-pass records decide 'auto' (and only with an algorithm of that pass)."""
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(capture, "plans", capture.PlanCache())
    xs, ws = (2, 3, 6, 5), (4, 3, 3, 3)
    p = C.ConvParams(xs, ws, 1, 1, 1, 1)
    f64 = np.float64
    assert C.choice._tuned_algorithm(device, p, f64, "backward_weight") is None
    C.record_algorithm(device, xs, ws, f64, "direct", 1, 1, pass_="backward_weight", seconds=1e-3)
    C.record_algorithm(device, xs, ws, f64, "flipped", 1, 1, pass_="backward_input")
    assert C.choice._tuned_algorithm(device, p, f64, "backward_weight") == "direct"
    assert C.choice._tuned_algorithm(device, p, f64, "backward_input") == "flipped"
    assert C.choice._tuned_algorithm(device, p, f64) is None  # the forward pass has its own record
    assert C.choice._tuned_algorithm(device, p, np.float32, "backward_weight") is None   # and each dtype
    with pytest.raises(ValueError, match="backward_weight"):
        C.record_algorithm(device, xs, ws, f64, "flipped", 1, 1, pass_="backward_weight")

    def no_gemm(*args):
        raise AssertionError("the tuned 'direct' was not taken")

    monkeypatch.setattr(C.im2col, "_backward_weight_gemm", no_gemm)
    x, gy = _data(rng, xs, np.float64), _data(rng, p.output_shape, np.float64)
    _, gw_ref = ref_conv_backward(xs, np.zeros(ws), gy, pad=(1, 1), x=x)
    gw = C.conv2d_backward_weight(Tensor.from_host(queue, x), Tensor.from_host(queue, gy), ws, padding=1)
    assert_close(gw, gw_ref, rtol=1e-12, atol=1e-12)


def test_winograd_splits_divide_the_tiles(device, monkeypatch):
    """The GPU default: S divides the tiles, keeps slices >= 512 long, and stops once 16 x the output
    blocks x S fill the device twice; CPUs keep one slice."""
    gpu = dataclasses.replace(device.capabilities, kind="gpu", compute_units=132)
    monkeypatch.setattr(device, "capabilities", gpu)
    p = C.ConvParams((32, 64, 32, 32), (64, 64, 3, 3), 1, 1, 1, 1)
    for pt in (8192, 6000, 1000, 511, 32 * 64):
        s = C.winograd._winograd_splits(device, p, pt)
        assert pt % s == 0 and (s == 1 or pt // s >= 512), (pt, s)
    assert C.winograd._winograd_splits(device, p, 8192) == 16
    big = C.ConvParams((32, 512, 4, 4), (512, 512, 3, 3), 1, 1, 1, 1)
    assert C.winograd._winograd_splits(device, big, 32 * 4) == 1      # 128 tiles: too short to split
    monkeypatch.setattr(device, "capabilities", dataclasses.replace(gpu, kind="cpu"))
    assert C.winograd._winograd_splits(device, p, 8192) == 1


def test_winograd_backward_errors(queue):
    x, gy = Tensor.zeros(queue, (1, 4, 6, 6)), Tensor.zeros(queue, (1, 4, 3, 3))
    with pytest.raises(ShapeError, match="winograd"):
        C.conv2d_backward_weight(x, gy, (4, 4, 3, 3), stride=2, padding=1, algorithm="winograd")
    with pytest.raises(ValueError, match="algorithm"):
        C.conv2d_backward_weight(x, gy, (4, 4, 3, 3), stride=2, padding=1, algorithm="flipped")


# -- backward ------------------------------------------------------------------------------------
BACKWARD_CASES = [
    ((2, 3, 7, 6), (4, 3, 3, 3), 1, 1, 1, 1),
    ((1, 4, 9, 8), (6, 2, 3, 2), 2, (2, 1), (1, 2), 2),
    ((2, 3, 5, 6), (3, 1, 3, 3), 1, 1, 1, 3),
    ((3, 1, 17, 13), (5, 1, 3, 3), 3, 0, 2, 1),                 # stride 3, dilation 2, C=1, odd sizes
    ((1, 5, 4, 7), (7, 5, 1, 1), 1, 0, 1, 1),                   # 1x1
    ((3, 2, 6, 5), (2, 2, 5, 4), (1, 2), (2, 3), 1, 1),         # kernel wider than the padding walks
]


@pytest.mark.parametrize("algo", ["gemm", "direct"])
@pytest.mark.parametrize("xs,ws,stride,pad,dil,groups", BACKWARD_CASES)
def test_conv2d_backward_matches_adjoint(queue, rng, xs, ws, stride, pad, dil, groups, algo):
    p = C.ConvParams(xs, ws, stride, pad, dil, groups)
    x, w = _data(rng, xs, np.float64), _data(rng, ws, np.float64)
    gy = _data(rng, p.output_shape, np.float64)
    gx_ref, gw_ref = ref_conv_backward(xs, w, gy, (p.SH, p.SW), (p.PH, p.PW), (p.DH, p.DW), groups, x=x)
    kw = dict(stride=stride, padding=pad, dilation=dil, groups=groups, algorithm=algo)
    gyt = Tensor.from_host(queue, gy)
    gx = C.conv2d_backward_input(gyt, Tensor.from_host(queue, w), xs, **kw)
    gw = C.conv2d_backward_weight(Tensor.from_host(queue, x), gyt, ws, **kw)
    assert_close(gx, gx_ref, rtol=1e-12, atol=1e-12)
    assert_close(gw, gw_ref, rtol=1e-12, atol=1e-12)
    assert_close(C.conv2d_backward_bias(gyt), gy.sum(axis=(0, 2, 3)), rtol=1e-12, atol=1e-12)


def test_conv2d_backward_gemm_float32_chunked(queue, rng, monkeypatch):
    """The GEMM backward paths over image chunks (grad_weight accumulates through the residual
    epilogue), float32, non-contiguous grad_out, against the float64 adjoint."""
    monkeypatch.setattr(C.im2col, "_im2col_chunk", lambda device, p, itemsize: 2)
    xs, ws, kw = (5, 6, 9, 7), (4, 3, 3, 3), dict(stride=(2, 1), padding=(1, 2), dilation=(2, 1), groups=2)
    p = C.ConvParams(xs, ws, **kw)
    x, w = _data(rng, xs), _data(rng, ws)
    gy = _data(rng, (p.N, p.OH, p.OW, p.K))                         # stored NHWC, viewed NCHW
    gyt = Tensor.from_host(queue, gy).permute(0, 3, 1, 2)
    gy = gy.transpose(0, 3, 1, 2).astype(np.float64)
    gx_ref, gw_ref = ref_conv_backward(xs, w.astype(np.float64), gy, (p.SH, p.SW), (p.PH, p.PW), (p.DH, p.DW),
                                       p.G, x=x)
    gx = C.conv2d_backward_input(gyt, Tensor.from_host(queue, w), xs, algorithm="gemm", **kw)
    gw = C.conv2d_backward_weight(Tensor.from_host(queue, x), gyt, ws, algorithm="gemm", **kw)
    assert_close(gx, gx_ref, rtol=1e-4, atol=1e-4)
    assert_close(gw, gw_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("xs,ws,kw", [
    ((2, 4, 7, 6), (6, 2, 3, 2), dict(stride=(2, 1), padding=1, dilation=(1, 2), groups=2)),
    ((2, 3, 9, 8), (5, 3, 1, 1), dict(stride=2, padding=0, dilation=1, groups=1)),    # ResNet's shortcut
    ((3, 2, 7, 9), (4, 2, 3, 3), dict(stride=(2, 3), padding=1, dilation=1, groups=1)),
])
def test_gpu_shaped_im2col_col2im(queue, rng, monkeypatch, xs, ws, kw):
    """The per-element im2col/col2im kernels GPUs use (col2im's taps compiled in) give the same results
    as the reference."""
    monkeypatch.setattr(C.im2col, "_row_kernels", lambda device: False)
    p = C.ConvParams(xs, ws, **kw)
    x, w = _data(rng, xs, np.float64), _data(rng, ws, np.float64)
    gy = _data(rng, p.output_shape, np.float64)
    gx_ref, gw_ref = ref_conv_backward(xs, w, gy, (p.SH, p.SW), (p.PH, p.PW), (p.DH, p.DW), p.G, x=x)
    xt, wt, gyt = Tensor.from_host(queue, x), Tensor.from_host(queue, w), Tensor.from_host(queue, gy)
    assert_close(
        C.conv2d(xt, wt, algorithm="im2col", **kw),
        ref_conv(x, w, None, (p.SH, p.SW), (p.PH, p.PW), (p.DH, p.DW), p.G),
        rtol=1e-12,
        atol=1e-12,
    )
    assert_close(C.conv2d_backward_input(gyt, wt, xs, algorithm="gemm", **kw), gx_ref, rtol=1e-12, atol=1e-12)
    assert_close(
        C.conv2d_backward_weight(xt, gyt, ws, algorithm="gemm", **kw), gw_ref, rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("chunk", [None, 2])
@pytest.mark.parametrize("xs,ws,stride,pad,dil,groups", BACKWARD_CASES)
def test_weight_gradient_as_batched_gemm(queue, rng, monkeypatch, xs, ws, stride, pad, dil, groups, chunk):
    """The GPUs' weight gradient (one GEMM batched over images, then a sum over them; in image chunks
    that accumulate) against the float64 adjoint, run here on the test device."""
    if chunk:
        monkeypatch.setattr(C.im2col, "_im2col_chunk", lambda device, p, itemsize: chunk)
    p = C.ConvParams(xs, ws, stride, pad, dil, groups)
    x, w, gy = _data(rng, xs, np.float64), _data(rng, ws, np.float64), _data(rng, p.output_shape, np.float64)
    _, gw_ref = ref_conv_backward(xs, w, gy, (p.SH, p.SW), (p.PH, p.PW), (p.DH, p.DW), groups, x=x)
    gw = C.im2col._backward_weight_batched(Tensor.from_host(queue, x), Tensor.from_host(queue, gy), p)
    assert gw.shape == tuple(ws)
    assert_close(gw, gw_ref, rtol=1e-12, atol=1e-12)


def test_im2col_layouts_agree(queue, rng):
    """The per-image (nb, G, R, P) and batch-inner (G, R, nb*P) layouts hold the same columns."""
    xs, ws = (3, 4, 7, 6), (4, 2, 3, 2)
    p = C.ConvParams(xs, ws, (2, 1), (1, 1), (1, 2), 2)
    x = Tensor.from_host(queue, _data(rng, xs))
    per_image = C.im2col._im2col(x, p, 1, 2).to_host()                     # images 1, 2
    inner = C.im2col._im2col(x, p, 1, 2, batch_inner=True).to_host()
    r, P = p.Cg * p.KH * p.KW, p.OH * p.OW
    np.testing.assert_array_equal(inner.reshape(p.G, r, 2, P).transpose(2, 0, 1, 3), per_image)


def test_conv2d_backward_finite_differences(queue, rng):
    """Directional derivative of L = sum(conv(x, w) * gy) agrees with the analytic gradients (float64)."""
    xs, ws, kw = (1, 2, 5, 4), (3, 2, 3, 2), dict(stride=(2, 1), padding=1, dilation=(1, 2))
    x, w = _data(rng, xs, np.float64), _data(rng, ws, np.float64)
    p = C.ConvParams(xs, ws, **kw, groups=1)
    gy = _data(rng, p.output_shape, np.float64)

    def loss(xa, wa):
        return float(
            np.sum(C.conv2d(Tensor.from_host(queue, xa), Tensor.from_host(queue, wa), **kw).to_host() * gy)
        )

    gyt = Tensor.from_host(queue, gy)
    gx = C.conv2d_backward_input(gyt, Tensor.from_host(queue, w), xs, **kw).to_host()
    gw = C.conv2d_backward_weight(Tensor.from_host(queue, x), gyt, ws, **kw).to_host()
    dx, dw, h = _data(rng, xs, np.float64), _data(rng, ws, np.float64), 1e-6
    fd_x = (loss(x + h * dx, w) - loss(x - h * dx, w)) / (2 * h)
    fd_w = (loss(x, w + h * dw) - loss(x, w - h * dw)) / (2 * h)
    assert fd_x == pytest.approx(np.sum(gx * dx), rel=1e-7)
    assert fd_w == pytest.approx(np.sum(gw * dw), rel=1e-7)


@pytest.mark.parametrize("stride,pad,outpad,dil,groups", [(2, 1, 1, 1, 1), (1, 0, 0, 2, 2), (3, 2, 2, 1, 1)])
def test_conv_transpose2d_is_conv_adjoint(queue, rng, stride, pad, outpad, dil, groups):
    x = _data(rng, (2, 4, 5, 3), np.float64)
    w = _data(rng, (4, 3, 3, 2), np.float64)  # (Cin, Cout/groups, KH, KW)
    b = _data(rng, (3 * groups,), np.float64)
    out = C.conv_transpose2d(
        Tensor.from_host(queue, x),
        Tensor.from_host(queue, w),
        Tensor.from_host(queue, b),
        stride=stride,
        padding=pad,
        output_padding=outpad,
        groups=groups,
        dilation=dil,
    )
    hout = (5 - 1) * stride - 2 * pad + dil * 2 + outpad + 1
    wout = (3 - 1) * stride - 2 * pad + dil * 1 + outpad + 1
    want, _ = ref_conv_backward(
        (2, 3 * groups, hout, wout), w, x, (stride,) * 2, (pad,) * 2, (dil,) * 2, groups
    )
    assert_close(out, want + b[None, :, None, None], rtol=1e-12, atol=1e-12)


# -- errors --------------------------------------------------------------------------------------
def test_conv2d_errors_name_the_fault(queue):
    x = Tensor.zeros(queue, (1, 6, 5, 5))
    with pytest.raises(ShapeError, match=r"groups=4"):
        C.conv2d(x, Tensor.zeros(queue, (4, 1, 3, 3)), groups=4)
    with pytest.raises(ShapeError, match=r"weight shape \(4, 2, 3, 3\).*\(1, 6, 5, 5\)"):
        C.conv2d(x, Tensor.zeros(queue, (4, 2, 3, 3)))
    with pytest.raises(ShapeError, match=r"kernel \(7, 7\).*padding"):
        C.conv2d(x, Tensor.zeros(queue, (4, 6, 7, 7)))
    with pytest.raises(ShapeError, match=r"stride"):
        C.conv2d(x, Tensor.zeros(queue, (4, 6, 3, 3)), stride=0)
    with pytest.raises(ShapeError, match=r"padding"):
        C.conv2d(x, Tensor.zeros(queue, (4, 6, 3, 3)), padding=-1)
    with pytest.raises(ShapeError, match=r"4-D"):
        C.conv2d(Tensor.zeros(queue, (6, 5, 5)), Tensor.zeros(queue, (4, 6, 3, 3)))
    with pytest.raises(ShapeError, match=r"winograd"):
        C.conv2d(x, Tensor.zeros(queue, (4, 6, 3, 3)), stride=2, algorithm="winograd")
    with pytest.raises(ShapeError, match=r"bias"):
        C.conv2d(x, Tensor.zeros(queue, (4, 6, 3, 3)), Tensor.zeros(queue, (5,)))
    with pytest.raises(DTypeError):
        C.conv2d(x, Tensor.zeros(queue, (4, 6, 3, 3), np.float64))
    with pytest.raises(ShapeError, match=r"grad_out"):
        C.conv2d_backward_input(Tensor.zeros(queue, (1, 4, 2, 2)), Tensor.zeros(queue, (4, 6, 3, 3)), x.shape)


def test_padding_same(queue, rng):
    x, w = _data(rng, (1, 2, 6, 5)), _data(rng, (3, 2, 3, 5))
    out = C.conv2d(Tensor.from_host(queue, x), Tensor.from_host(queue, w), padding="same")
    assert_close(out, ref_conv(x, w, pad=(1, 2)), rtol=1e-4, atol=1e-4)


def test_repeated_calls_reuse_checks_bitwise(queue, rng):
    """The second call with one signature skips the checks and the choice (a cached plan): same
    launches, bit-identical results, also for a view at another offset; bad arguments still raise."""
    xs, ws = (3, 4, 9, 7), (6, 4, 3, 3)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    xt, wt, bt = Tensor.from_host(queue, x), Tensor.from_host(queue, w), Tensor.from_host(queue, b)
    big = Tensor.from_host(queue, np.concatenate([rng.standard_normal(xs).astype(np.float32), x]))
    xo = big[3:]  # same shape and strides as xt, offset 3*4*9*7
    assert xo.offset and xo.strides == xt.strides

    def run(xx):
        y = C.conv2d(xx, wt, bt, 1, 1)
        gy = y.contiguous()
        return (y.to_host(), C.conv2d_backward_input(gy, wt, xs, 1, 1).to_host(),
                C.conv2d_backward_weight(xx, gy, ws, 1, 1).to_host())

    first = run(xt)
    for again in (run(xt), run(xo)):
        for a, r in zip(first, again):
            np.testing.assert_array_equal(a, r)
    assert_close(first[0], ref_conv(x, w, b, pad=(1, 1)), np.float32)
    with pytest.raises(ShapeError):
        C.conv2d(xt, wt, bt, 1, 1, groups=3)
    with pytest.raises(ShapeError):
        C.conv2d_backward_input(Tensor.from_host(queue, first[0][:, :5].copy()), wt, xs, 1, 1)


@pytest.mark.parametrize("xs,k,pad", WINOGRAD_CASES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_winograd_transforms_in_one_launch(queue, rng, monkeypatch, xs, k, pad, dtype):
    """The GPUs' transforms batched (BATCH_TRANSFORMS, winograd_transforms_2x2_3x3): forward the filter and
    the input tiles in one launch (3 launches, not 4); the backward of both x and the weight the rotated
    filter, grad_y's input tiles, x's input tiles and grad_y's Z in one (5 launches, not 8); the same bits
    as a launch each, and float64 against the adjoint."""
    from netcl.ops.conv.backward import _conv2d_backward
    from netcl.profiling import count_launches

    monkeypatch.setattr(C.winograd, "_winograd_rows", lambda device: False)
    monkeypatch.setattr(C.choice, "_auto_algorithm", lambda device, p, dt: "winograd")
    monkeypatch.setattr(C.choice, "backward_input_algorithm", lambda device, p, dt: "flipped")
    monkeypatch.setattr(C.choice, "backward_weight_algorithm", lambda device, p, dt: "winograd")
    ws = (k, xs[1], 3, 3)
    p = C.ConvParams(xs, ws, 1, pad, 1, 1)
    x, w, gy = _data(rng, xs, dtype), _data(rng, ws, dtype), _data(rng, p.output_shape, dtype)
    xt, wt, gyt = Tensor.from_host(queue, x), Tensor.from_host(queue, w), Tensor.from_host(queue, gy)
    got = {}
    for together in (False, True):
        monkeypatch.setattr(C.winograd, "BATCH_TRANSFORMS", together)
        monkeypatch.setattr(capture, "plans", capture.PlanCache())
        C.conv2d(xt, wt, padding=pad)  # built once, then counted
        _conv2d_backward(gyt, xt, wt, None, 1, pad, 1, 1, None, (True, True, False))
        with count_launches() as fwd:
            out = C.conv2d(xt, wt, padding=pad)
        with count_launches() as bwd:
            gx, gw, _ = _conv2d_backward(gyt, xt, wt, None, 1, pad, 1, 1, None, (True, True, False))
        assert (fwd.count, bwd.count) == ((3, 5) if together else (4, 8))
        got[together] = [t.to_host() for t in (out, gx, gw)]
    assert all(np.array_equal(a, b) for a, b in zip(got[False], got[True]))
    if dtype == np.float64:
        gx_ref, gw_ref = ref_conv_backward(xs, w, gy, pad=(pad, pad), x=x)
        assert_close(got[True][0], ref_conv(x, w, pad=(pad, pad)), rtol=1e-11, atol=1e-11)
        assert_close(got[True][1], gx_ref, rtol=1e-11, atol=1e-11)
        assert_close(got[True][2], gw_ref, rtol=1e-11, atol=1e-11)


def test_winograd_backward_in_chunks_takes_the_passes_apart(queue, rng, monkeypatch):
    """Images in more than one chunk: the backward of both gradients takes the two passes apart (the batched
    transforms cover one chunk only), with the same values."""
    from netcl.ops.conv.backward import _conv2d_backward

    monkeypatch.setattr(C.winograd, "_winograd_rows", lambda device: False)
    monkeypatch.setattr(C.choice, "_auto_algorithm", lambda device, p, dt: "winograd")
    monkeypatch.setattr(C.choice, "backward_input_algorithm", lambda device, p, dt: "flipped")
    monkeypatch.setattr(C.choice, "backward_weight_algorithm", lambda device, p, dt: "winograd")
    monkeypatch.setattr(C.winograd, "_winograd_chunk", lambda device, p, itemsize, per_tile=None: 2)
    monkeypatch.setattr(capture, "plans", capture.PlanCache())
    xs, ws = (5, 3, 6, 7), (4, 3, 3, 3)
    p = C.ConvParams(xs, ws, 1, 1, 1, 1)
    x, w, gy = _data(rng, xs, np.float64), _data(rng, ws, np.float64), _data(rng, p.output_shape, np.float64)
    gyt, xt, wt = (Tensor.from_host(queue, a) for a in (gy, x, w))
    gx, gw, _ = _conv2d_backward(gyt, xt, wt, None, 1, 1, 1, 1, None, (True, True, False))
    gx_ref, gw_ref = ref_conv_backward(xs, w, gy, pad=(1, 1), x=x)
    assert_close(gx, gx_ref, rtol=1e-11, atol=1e-11)
    assert_close(gw, gw_ref, rtol=1e-11, atol=1e-11)
