"""Structured ops on float16/bfloat16 storage (float32 arithmetic in the kernels) against their float32
paths on the same half-rounded inputs: convolution (forward, both gradients, bias), pooling, batch norm,
row norms. Tolerances: a few output roundings, relative to the output's scale (float16 2**-11 per
rounding, bfloat16 2**-8); intermediate buffers stored in half (im2col's GEMM output) add one rounding."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from netcl import ops
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError
from netcl.jit.reduce import ROW_LEAST, ROW_LOADS, row_group_size
from netcl.ops import attention, norm

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
GPU_SHAPED = pytest.mark.gpu_shaped  # the GPUs' kernels, emulated here for their index arithmetic
HALVES = pytest.mark.parametrize("dt", [F16, BF16], ids=["float16", "bfloat16"])


def _tol(dt: np.dtype) -> float:
    return 2.0**-6 if dt == BF16 else 2.0**-9  # four roundings of the dtype, relative to the scale


def _close(got: Tensor, want: Tensor, dt: np.dtype, what: str) -> None:
    assert got.dtype == dt, what
    g = got.to_host().astype(np.float64)
    w = want.to_host().astype(np.float64)
    scale = max(np.abs(w).max(), 1e-30)
    err = np.abs(g - w).max() / scale
    assert err <= _tol(dt), f"{what}: max error {err:.2e} of scale {scale:.3g} > {_tol(dt):.1e}"


def _pair(queue, rng, shape, dt):
    """(half tensor, float32 tensor) of the same half-rounded values."""
    a = rng.standard_normal(shape).astype(np.float32).astype(dt)
    return Tensor.from_host(queue, a), Tensor.from_host(queue, a.astype(np.float32))


def _row_norms_match_float32(queue, rng, dt: np.dtype, shape: tuple[int, ...]) -> tuple[Tensor, ...]:
    """LayerNorm and RMSNorm over the last axis of `shape` on half storage against the same values in
    float32: outputs and every gradient within half's rounding, mean/rstd float32. Returns the half x, w and
    gradient."""
    n = shape[-1]
    xh, xf = _pair(queue, rng, shape, dt)
    wh, wf = _pair(queue, rng, (n,), dt)
    bh, bf = _pair(queue, rng, (n,), dt)
    gh, gf = _pair(queue, rng, shape, dt)
    yh, mh, rh = ops.layer_norm(xh, n, wh, bh)
    yf, mf, rf = ops.layer_norm(xf, n, wf, bf)
    assert mh.dtype == rh.dtype == np.float32
    np.testing.assert_allclose(rh.to_host(), rf.to_host(), rtol=1e-5)
    _close(yh, yf, dt, "layer_norm")
    for got, want, what in zip(ops.layer_norm_backward(gh, xh, n, mh, rh, wh, bh),
                               ops.layer_norm_backward(gf, xf, n, mf, rf, wf, bf), ("gx", "gw", "gb")):
        _close(got, want, dt, f"layer_norm {what}")
    yh, rh = ops.rms_norm(xh, n, wh)
    yf, rf = ops.rms_norm(xf, n, wf)
    _close(yh, yf, dt, "rms_norm")
    for got, want, what in zip(ops.rms_norm_backward(gh, xh, n, rh, wh),
                               ops.rms_norm_backward(gf, xf, n, rf, wf), ("gx", "gw")):
        _close(got, want, dt, f"rms_norm {what}")
    return xh, wh, gh


# dtype x kernel family paired (not crossed): each pair builds its own programs, and CI builds them cold
@pytest.mark.parametrize(("dt", "algorithm"), [(F16, "im2col"), (BF16, "direct"), (BF16, "im2col")],
                         ids=["float16-im2col", "bfloat16-direct", "bfloat16-im2col"])
def test_conv2d_half_matches_float32(queue, rng, dt, algorithm):
    """Odd geometry (stride (2, 1), padding 1, 5 -> 6 channels, 9x7): forward with bias and relu, the input
    gradient, the weight gradient and the bias gradient, each by the named algorithm's half kernels."""
    xh, xf = _pair(queue, rng, (3, 5, 9, 7), dt)
    wh, wf = _pair(queue, rng, (6, 5, 3, 3), dt)
    bh, bf = _pair(queue, rng, (6,), dt)
    geo = dict(stride=(2, 1), padding=1)
    _close(ops.conv2d(xh, wh, bh, activation="relu", algorithm=algorithm, **geo),
           ops.conv2d(xf, wf, bf, activation="relu", algorithm=algorithm, **geo), dt, "forward")
    gh, gf = _pair(queue, rng, (3, 6, 5, 7), dt)
    back = "gemm" if algorithm == "im2col" else "direct"
    _close(ops.conv2d_backward_input(gh, wh, xh.shape, algorithm=back, **geo),
           ops.conv2d_backward_input(gf, wf, xf.shape, algorithm=back, **geo), dt, "grad input")
    _close(ops.conv2d_backward_weight(xh, gh, wh.shape, algorithm=back, **geo),
           ops.conv2d_backward_weight(xf, gf, wf.shape, algorithm=back, **geo), dt, "grad weight")
    _close(ops.conv2d_backward_bias(gh), ops.conv2d_backward_bias(gf), dt, "grad bias")


@HALVES
def test_conv2d_winograd_half_matches_float32(queue, rng, dt):
    """Winograd F(2x2, 3x3) on half storage (transforms in float32, the GEMM in half): forward with bias
    and relu (odd 7x5 output: partial tiles), the flipped input gradient and the weight gradient."""
    xh, xf = _pair(queue, rng, (2, 8, 7, 5), dt)
    wh, wf = _pair(queue, rng, (9, 8, 3, 3), dt)
    bh, bf = _pair(queue, rng, (9,), dt)
    _close(ops.conv2d(xh, wh, bh, padding=1, activation="relu", algorithm="winograd"),
           ops.conv2d(xf, wf, bf, padding=1, activation="relu", algorithm="winograd"), dt, "forward")
    gh, gf = _pair(queue, rng, (2, 9, 7, 5), dt)
    _close(ops.conv2d_backward_input(gh, wh, xh.shape, padding=1, algorithm="flipped"),
           ops.conv2d_backward_input(gf, wf, xf.shape, padding=1, algorithm="flipped"), dt, "grad input")
    _close(ops.conv2d_backward_weight(xh, gh, wh.shape, padding=1, algorithm="winograd"),
           ops.conv2d_backward_weight(xf, gf, wf.shape, padding=1, algorithm="winograd"), dt, "grad weight")


@HALVES
def test_pooling_half_matches_float32(queue, rng, dt):
    """Max pooling (an odd padded window and the 2x2 kernel), average and adaptive average pooling,
    forward and backward: maxima and their indices are exact, the rest within a rounding or two."""
    xh, xf = _pair(queue, rng, (2, 3, 9, 8), dt)
    for args in (((3, 3), (2, 2), 1), (2, 2, 0)):
        (yh, ih), (yf, i_f) = ops.max_pool2d(xh, *args), ops.max_pool2d(xf, *args)
        assert np.array_equal(yh.to_host().astype(np.float32), yf.to_host())
        assert np.array_equal(ih.to_host(), i_f.to_host())
        gh, gf = _pair(queue, rng, yh.shape, dt)
        _close(ops.max_pool2d_backward(gh, ih, xh.shape, *args),
               ops.max_pool2d_backward(gf, i_f, xf.shape, *args), dt, f"max pool backward {args}")
    _close(ops.avg_pool2d(xh, 3, 2, 1), ops.avg_pool2d(xf, 3, 2, 1), dt, "avg pool")
    gh, gf = _pair(queue, rng, (2, 3, 5, 4), dt)
    _close(ops.avg_pool2d_backward(gh, xh.shape, 3, 2, 1), ops.avg_pool2d_backward(gf, xf.shape, 3, 2, 1),
           dt, "avg pool backward")
    _close(ops.adaptive_avg_pool2d(xh, (4, 3)), ops.adaptive_avg_pool2d(xf, (4, 3)), dt, "adaptive avg")


@pytest.mark.parametrize(("dt", "local"), [
    pytest.param(F16, None, id="float16-cpu-rows"),
    pytest.param(BF16, 8, id="bfloat16-work-groups", marks=GPU_SHAPED),
])
def test_row_norms_half_match_float32(queue, rng, dt, local, monkeypatch):
    """LayerNorm, RMSNorm and GroupNorm on half storage (odd rows and lengths): outputs and gradients in
    the half dtype, mean/rstd float32; `local` 8 runs the GPUs' work-group kernels and their parameter
    gradients through the reduction engine."""
    monkeypatch.setattr(norm, "local_size_override", local)
    xh, wh, gh = _row_norms_match_float32(queue, rng, dt, (5, 3, 37))
    if local is None:
        x4h, x4f = _pair(queue, rng, (2, 6, 3, 5), dt)
        c6h, c6f = _pair(queue, rng, (6,), dt)
        yh, mh, rh = ops.group_norm(x4h, 3, c6h, c6h)
        yf, mf, rf = ops.group_norm(x4f, 3, c6f, c6f)
        _close(yh, yf, dt, "group_norm")
        for got, want, what in zip(ops.group_norm_backward(x4h, x4h, 3, mh, rh, c6h, c6h),
                                   ops.group_norm_backward(x4f, x4f, 3, mf, rf, c6f, c6f),
                                   ("gx", "gw", "gb")):
            _close(got, want, dt, f"group_norm {what}")
    with pytest.raises(DTypeError, match="mean/rstd of .* must be float32"):
        ops.rms_norm_backward(gh, xh, 37, Tensor.from_host(queue, np.ones(15, dt)), wh)


@GPU_SHAPED
@pytest.mark.parametrize("dt", [np.dtype(np.float32), F16, BF16], ids=["float32", "float16", "bfloat16"])
def test_row_norm_vec4_kernels_match_the_scalar_ones(queue, rng, dt, monkeypatch):
    """Rows of a multiple of 4 on GPUs take the vector kernels (work-groups of 8 here; float16 and bfloat16
    rows of a multiple of 8 read 8 values a work-item, of 36 four): LayerNorm and RMSNorm forward and
    backward against the float32 scalar (CPU-row) kernels."""
    if dt != np.float32 and queue.device.is_pocl_3_0:
        pytest.skip("PyPI's PoCL 3.0 aborts the process on the half vector norm kernels at work-groups of 8 "
                    "(the GPUs' layout, emulated); the test matrix runs this on Debian's PoCL 3.1")
    widths = []
    real = norm._vector_width
    monkeypatch.setattr(norm, "_vector_width", lambda *a: widths.append(real(*a)) or widths[-1])
    for n in (40, 36):
        xh, xf = _pair(queue, rng, (6, n), dt)
        wh, wf = _pair(queue, rng, (n,), dt)
        gh, gf = _pair(queue, rng, (6, n), dt)
        monkeypatch.setattr(norm, "local_size_override", None)
        ref = (ops.layer_norm(xf, n, wf, wf), ops.rms_norm(xf, n, wf))
        ref_back = (ops.layer_norm_backward(gf, xf, n, ref[0][1], ref[0][2], wf, wf),
                    ops.rms_norm_backward(gf, xf, n, ref[1][1], wf))
        monkeypatch.setattr(norm, "local_size_override", 8)
        widths.clear()
        ln, rn = ops.layer_norm(xh, n, wh, wh), ops.rms_norm(xh, n, wh)
        _close(ln[0], ref[0][0], dt, f"layer_norm vec {n}")
        _close(rn[0], ref[1][0], dt, f"rms_norm vec {n}")
        np.testing.assert_allclose(ln[2].to_host(), ref[0][2].to_host(), rtol=1e-5)
        for got, want in zip(ops.layer_norm_backward(gh, xh, n, ln[1], ln[2], wh, wh), ref_back[0]):
            _close(got, want, dt, f"layer_norm vec {n} backward")
        for got, want in zip(ops.rms_norm_backward(gh, xh, n, rn[1], wh), ref_back[1]):
            _close(got, want, dt, f"rms_norm vec {n} backward")
        assert set(widths) == {8 if n == 40 and dt != np.float32 else 4}, (n, widths)


@pytest.mark.parametrize("variant", ["cpu", pytest.param("gpu", marks=GPU_SHAPED)])
def test_flash_attention_bfloat16_matches_float32(queue, rng, variant, monkeypatch):
    """bfloat16 q, k, v (ushort storage, float32 math) in both kernel families: causal forward with an
    additive bfloat16 mask, and all three gradients, against the float32 path on the same values; head
    dims 24 (the CPU kernel's partial vector) and 16 (the GPU kernel's 4-wide loads and stores)."""
    monkeypatch.setattr(attention, "variant_override", variant)
    d = 24 if variant == "cpu" else 16
    qh, qf = _pair(queue, rng, (2, 3, 19, d), BF16)  # > 16 rows a head: not the decode kernel
    kh, kf = _pair(queue, rng, (2, 3, 21, d), BF16)
    vh, vf = _pair(queue, rng, (2, 3, 21, d), BF16)
    mh, mf = _pair(queue, rng, (1, 1, 19, 21), BF16)
    oh, lh = attention.flash_attention_forward(qh, kh, vh, causal=True, mask=mh)
    of, lf = attention.flash_attention_forward(qf, kf, vf, causal=True, mask=mf)
    _close(oh, of, BF16, f"{variant} forward")
    gh, gf = _pair(queue, rng, oh.shape, BF16)
    for got, want, what in zip(
            attention.flash_attention_backward(qh, kh, vh, oh, lh, gh, causal=True, mask=mh),
            attention.flash_attention_backward(qf, kf, vf, of, lf, gf, causal=True, mask=mf),
            ("dq", "dk", "dv")):
        _close(got, want, BF16, f"{variant} {what}")


@pytest.mark.parametrize(("dt", "layout"), [
    pytest.param(F16, "groups", id="float16-groups", marks=GPU_SHAPED),
    pytest.param(BF16, "runs", id="bfloat16-runs"),
])
def test_batch_norm_half_matches_float32(queue, rng, dt, layout, monkeypatch):
    """Half x with float32 weight, bias and running statistics (PyTorch's mixed batch norm), training
    with a fused relu and eval, forward and backward, in the CPUs' run kernels and the GPUs' work-group
    kernels (4-wide loads: HW = 12) with parts merged by the finalize launch; half weights are widened."""
    monkeypatch.setattr(norm, "FORCE_LAYOUT", layout)
    monkeypatch.setattr(norm, "PARTS", 2)
    monkeypatch.setattr(norm, "local_size_override", 8 if layout == "groups" else None)
    xh, xf = _pair(queue, rng, (3, 5, 3, 4), dt)
    w = Tensor.from_host(queue, rng.standard_normal(5).astype(np.float32))
    b = Tensor.from_host(queue, rng.standard_normal(5).astype(np.float32))
    rm = [Tensor.from_host(queue, np.zeros(5, np.float32)) for _ in range(2)]
    rv = [Tensor.from_host(queue, np.ones(5, np.float32)) for _ in range(2)]
    yh, mh, sh = ops.batch_norm(xh, w, b, rm[0], rv[0], True, activation="relu")
    yf, mf, sf = ops.batch_norm(xf, w, b, rm[1], rv[1], True, activation="relu")
    _close(yh, yf, dt, "batch_norm train")
    assert mh.dtype == sh.dtype == np.float32
    np.testing.assert_allclose(rm[0].to_host(), rm[1].to_host(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv[0].to_host(), rv[1].to_host(), rtol=1e-5)
    gh, gf = _pair(queue, rng, xh.shape, dt)
    got = ops.batch_norm_backward(gh, xh, w, mh, sh, True, bias=b, activation="relu")
    want = ops.batch_norm_backward(gf, xf, w, mf, sf, True, bias=b, activation="relu")
    _close(got[0], want[0], dt, "batch_norm grad x")
    for g, f in zip(got[1:], want[1:]):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g.to_host(), f.to_host(), rtol=1e-4, atol=1e-4 * np.abs(f.to_host()).max())
    _close(ops.batch_norm(xh, w, b, rm[0], rv[0], False)[0], ops.batch_norm(xf, w, b, rm[1], rv[1], False)[0],
           dt, "batch_norm eval")
    wh = Tensor.from_host(queue, w.to_host().astype(dt))
    assert ops.batch_norm_backward(gh, xh, wh, mh, sh, True)[1].dtype == dt
    with pytest.raises(DTypeError, match="running_mean of .* must be float32"):
        ops.batch_norm(xh, w, b, Tensor.from_host(queue, np.zeros(5, dt)), rv[0], True)


def test_row_work_group_halves_while_each_work_item_makes_its_loads():
    """The row kernels' work-group rule (norm.cl's vector kernels and the reductions, four loads a work-item
    down to one warp; at two loads and 64, as it was: a 1024-wide half row on 8 lanes a work-item takes 64
    (256 would leave half of them idle), float32's 4 lanes 128, rows of two loads a work-item or more keep
    the group, and 64 is the floor)."""
    assert (ROW_LOADS, ROW_LEAST) == (4, 32)
    assert row_group_size(256, 8, 1024) == 32 == row_group_size(256, 8, 1024, ROW_LOADS, ROW_LEAST)
    two = dict(loads=2, least=64)
    assert row_group_size(256, 8, 1024, **two) == 64
    assert row_group_size(256, 4, 1024, **two) == 128
    assert row_group_size(256, 8, 512, **two) == 64 == row_group_size(256, 8, 40, **two)
    assert row_group_size(256, 8, 4096, **two) == 256 == row_group_size(256, 4, 2048, **two)
    assert row_group_size(256, 4, 1023, **two) == 128 and row_group_size(256, 4, 1025, **two) == 256
    # four loads a work-item, down to one warp
    four = dict(loads=4, least=32)
    assert row_group_size(256, 8, 1024, **four) == 32 and row_group_size(256, 4, 1024, **four) == 64
    assert row_group_size(256, 8, 40, **four) == 32 and row_group_size(256, 4, 4096, **four) == 256
    assert row_group_size(256, 4, 2047, **four) == 128 and row_group_size(256, 4, 2049, **four) == 256


@GPU_SHAPED
@pytest.mark.parametrize("dt", [F16, BF16])
def test_row_norms_half_on_a_halved_work_group(queue, rng, dt, monkeypatch):
    """Rows of 512 half values on the vector kernels with 128 work-items halved to 32 (the floor: two 8-lane
    chunks of a row each; float32's 4 lanes: 32 of four loads each): forward and backward as float32's within
    half's rounding. (128, not the GPUs' 256: PoCL's CPU device crashes on these kernels at 256 work-items,
    with or without halving.)"""
    monkeypatch.setattr(norm, "local_size_override", 128)
    assert row_group_size(128, 8, 512) == 32 == row_group_size(128, 4, 512)
    _row_norms_match_float32(queue, rng, dt, (3, 512))
