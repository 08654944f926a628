"""The decode GEMV (kernels/gemm_gemv.cl): x @ W^T with a few rows of half x, against float64 NumPy, with
its epilogue, both work layouts (GPUs' work-group per row and CPUs' work-item per row), the automatic
choice (half, thin, aligned, K-contiguous) and what it leaves to the other kernels."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from netcl.core.tensor import Tensor
from netcl.errors import DeviceError
from netcl.ops.gemm import api, gemm
from netcl.ops.gemm.problem import _prepare
from netcl.ops.gemm.variants import gemv_rms_miscompiled

HALVES = [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
# bfloat16 keeps 8 bits, float16 11: the inputs are exactly representable, only the result is rounded
TOL = {"float16": 2e-3, "bfloat16": 1.6e-2}


def reference(x, w, bias=None, residual=None, activation=None):
    z = x.astype(np.float64) @ w.astype(np.float64).T
    if bias is not None:
        z = z + bias.astype(np.float64)
    if activation == "silu":
        z = z / (1 + np.exp(-z))
    if residual is not None:
        z = z + residual.astype(np.float64)
    return z


def assert_close(got, want, dtype):
    err = np.abs(got.to_host().astype(np.float64) - want).max() / np.abs(want).max()
    assert err < TOL[np.dtype(dtype).name], err


GROUPS = {"GEMV_WG": 8, "GEMV_ROWS": 3}
F16, BF16 = HALVES


def _paired(shapes: list[tuple], dtypes: list[np.dtype]) -> list:
    """Both work layouts at every shape, the dtypes paired with the shapes (not crossed: each (dtype, rows)
    is a program of its own, ~0.5 CPU s cold on PoCL), rotated between the layouts so that each layout runs
    every dtype and each shape runs several."""
    cases = []
    for i, (name, params) in enumerate((("default", None), ("groups", GROUPS))):
        for j, shape in enumerate(shapes):
            dt = dtypes[(i + j) % len(dtypes)]
            cases.append(pytest.param(*shape, dt, params, id=f"{name}-{'-'.join(map(str, shape))}-{dt.name}"))
    return cases


# the shapes: one row, several, the most (8), an odd count with one column and K of one chunk
@pytest.mark.parametrize("m,n,k,dtype,params", _paired([(1, 37, 64), (3, 130, 48), (8, 17, 1000), (5, 1, 8)],
                                                      HALVES))
def test_gemv_against_numpy(queue, rng, m, n, k, dtype, params):
    x, w = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((n, k)).astype(dtype)
    bias, res = rng.standard_normal(n).astype(dtype), rng.standard_normal((m, n)).astype(dtype)
    xs, ws, bs, rs = (Tensor.from_host(queue, a) for a in (x, w, bias, res))
    got = gemm(xs, ws.transpose(0, 1), variant="gemv", params=params)
    assert_close(got, reference(x, w), dtype)
    got = gemm(xs, ws.transpose(0, 1), bs, "silu", rs, variant="gemv", params=params)
    assert_close(got, reference(x, w, bias, res, "silu"), dtype)


@pytest.mark.parametrize("dtype", HALVES, ids=lambda d: d.name)
def test_thin_aligned_half_problems_choose_the_gemv(queue, rng, dtype):
    def variant(x, w):
        return api._auto_variant(_prepare(x, w.transpose(0, 1), None, None, None, 1.0, False))

    # up to 8 rows, or 1 where matrix units take the dtype (their "skinny" tile then)
    limit = api.gemv_max_rows(queue.device, dtype)
    w = Tensor.from_host(queue, rng.standard_normal((24, 32)).astype(dtype))
    shape = (2, 3, 32) if limit >= 6 else (1, limit, 32)
    tokens = Tensor.from_host(queue, rng.standard_normal(shape).astype(dtype))  # batch and rows: folded
    assert api.gemv_fits(tokens, w.transpose(0, 1))
    assert variant(tokens.view(-1, 32), w) == "gemv"
    many = Tensor.from_host(queue, rng.standard_normal((limit + 1, 32)).astype(dtype))
    odd_k = Tensor.from_host(queue, rng.standard_normal((24, 30)).astype(dtype))
    assert not api.gemv_fits(many, w.transpose(0, 1))  # too many rows: the GEMM kernels
    assert not api.gemv_fits(many[:2, :30], odd_k.transpose(0, 1))  # K not a multiple of 8
    assert not api.gemv_fits(tokens[:, :, 1:9], w[:, :8].transpose(0, 1))  # x off a 16-byte boundary
    assert not api.gemv_fits(tokens.view(-1, 32), w)  # W not read along K
    wide = Tensor.from_host(queue, rng.standard_normal((1, 32)).astype(np.float32))
    assert not api.gemv_fits(wide, Tensor.from_host(queue, np.ones((24, 32), np.float32)).transpose(0, 1))
    # the model's call: a (batch, tokens, dim) activation against a weight, through linear's folding
    x = tokens.to_host()
    want = reference(x.reshape(-1, 32), w.to_host()).reshape(*shape[:2], 24)
    assert_close(gemm(tokens, w.transpose(0, 1)), want, dtype)


def test_quantize_int8_rounds_per_channel(rng):
    from netcl.ops import quantize_int8

    w = rng.standard_normal((5, 16)).astype(np.float32)
    w[3] = 0.0
    q, scales = quantize_int8(w)
    assert q.dtype == np.uint8 and scales.dtype == np.float32
    np.testing.assert_allclose(scales[[0, 1, 2, 4]], np.abs(w[[0, 1, 2, 4]]).max(1) / 127, rtol=1e-6)
    assert scales[3] == 1.0 and (q[3] == 128).all()
    back = (q.astype(np.float64) - 128) * scales[:, None]
    assert np.abs(back - w).max() <= scales.max() / 2 + 1e-7  # round to nearest
    assert (np.abs(q.astype(int) - 128).max(1)[[0, 1, 2, 4]] == 127).all()  # each row's peak is +-127


@pytest.mark.parametrize("dtype", [*HALVES, np.dtype(np.float32)], ids=lambda d: d.name)
@pytest.mark.parametrize("m", [1, 3, 8, 11])
def test_linear_int8_against_the_dequantized_weight(queue, rng, dtype, m):
    """Few rows: the gemv kernel dequantizing in registers; 11 rows: the weight dequantized, then the GEMM."""
    from netcl.ops import linear_int8, quantize_int8

    n, k = 37, 96
    w = rng.standard_normal((n, k)).astype(np.float32)
    q, scales = quantize_int8(w)
    wq = (q.astype(np.float64) - 128) * scales[:, None]
    x = rng.standard_normal((m, k)).astype(dtype)
    bias, res = rng.standard_normal(n).astype(dtype), rng.standard_normal((m, n)).astype(dtype)
    qt, st = Tensor.from_host(queue, q), Tensor.from_host(queue, scales)
    xs, bs, rs = (Tensor.from_host(queue, a) for a in (x, bias, res))
    got = linear_int8(xs, qt, st, bs, "silu", rs)
    z = x.astype(np.float64) @ wq.T + bias.astype(np.float64)
    want = z / (1 + np.exp(-z)) + res.astype(np.float64)
    tol = 1e-5 if dtype == np.float32 else TOL[np.dtype(dtype).name]
    err = np.abs(got.to_host().astype(np.float64) - want).max() / np.abs(want).max()
    assert err < tol, err
    assert got.dtype == np.dtype(dtype)


def test_linear_int8_errors(queue):
    from netcl.errors import DTypeError, ShapeError
    from netcl.ops import linear_int8

    q = Tensor.from_host(queue, np.full((4, 8), 128, np.uint8))
    s = Tensor.from_host(queue, np.ones(4, np.float32))
    x = Tensor.from_host(queue, np.ones((1, 8), np.float32))
    with pytest.raises(DTypeError, match="uint8"):
        linear_int8(x, s, s)
    with pytest.raises(ShapeError, match=r"scales must be float32 of shape \(4,\)"):
        linear_int8(x, q, Tensor.from_host(queue, np.ones(3, np.float32)))
    with pytest.raises(ShapeError, match=r"x must be a floating Tensor \(\.\.\., 8\)"):
        linear_int8(Tensor.from_host(queue, np.ones((1, 7), np.float32)), q, s)
    with pytest.raises(DTypeError, match="bias must be a float32"):
        linear_int8(x, q, s, bias=Tensor.from_host(queue, np.ones(4, np.float16)))


@pytest.mark.parametrize("dtype", HALVES, ids=lambda d: d.name)
@pytest.mark.parametrize("int8", [False, True], ids=["half", "int8"])
@pytest.mark.parametrize("m", [1, 5, 12])
def test_linear_glu_against_numpy(queue, rng, dtype, int8, m):
    """SwiGLU's silu(x W1^T) * (x W3^T) from the stacked [W1; W3]: one gemv launch for up to 8 rows (half or
    int8 weights), the GEMM and a fused silu * up beyond."""
    from netcl.ops import linear_glu, quantize_int8
    from netcl.profiling import count_launches

    h, k = 19, 64
    w = rng.standard_normal((2 * h, k)).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(dtype)
    xs = Tensor.from_host(queue, x)
    if int8:
        q, scales = quantize_int8(w)
        wd = (q.astype(np.float64) - 128) * scales[:, None]
        args = (Tensor.from_host(queue, q), Tensor.from_host(queue, scales))
    else:
        wd = w.astype(dtype).astype(np.float64)
        args = (Tensor.from_host(queue, w.astype(dtype)),)
    z = x.astype(np.float64) @ wd.T
    want = z[:, :h] / (1 + np.exp(-z[:, :h])) * z[:, h:]
    linear_glu(xs, *args)  # programs built outside the count
    with count_launches() as launches:
        got = linear_glu(xs, *args)
    assert_close(got, want, dtype)
    assert got.shape == (m, h)
    if m <= (api.GEMV_MAX_ROWS if int8 else api.gemv_max_rows(queue.device, dtype)):  # int8: the gemv's rows
        assert launches.count == 1


def test_a_device_that_cannot_build_the_gemv_takes_the_other_kernels(queue, rng, monkeypatch):
    """A compiler that rejects gemm_gemv.cl costs one warning; half, int8 and GLU decode products are then
    computed by the GEMM kernels (int8 weights dequantized first), with the same values."""
    from netcl.errors import KernelBuildError
    from netcl.ops import linear_glu, linear_int8, quantize_int8
    from netcl.ops.gemm import variants

    real = variants._program

    def refuse(device, variant, defines):
        if variant == "gemv":
            raise KernelBuildError("gemm_gemv.cl: refused for the test")
        return real(device, variant, defines)

    monkeypatch.setattr(variants, "_program", refuse)
    monkeypatch.setattr(variants, "_gemv_ok", {})
    dtype = HALVES[1]
    x = rng.standard_normal((api.gemv_max_rows(queue.device, dtype), 32)).astype(dtype)  # rows gemv takes
    w = rng.standard_normal((24, 32)).astype(np.float32)
    xs, ws = Tensor.from_host(queue, x), Tensor.from_host(queue, w.astype(dtype))
    with pytest.warns(RuntimeWarning, match="does not build"):
        assert not api.gemv_fits(xs, ws.transpose(0, 1))
    assert_close(gemm(xs, ws.transpose(0, 1)), reference(x, w.astype(dtype)), dtype)
    q, scales = quantize_int8(w)
    wq = (q.astype(np.float64) - 128) * scales[:, None]
    got = linear_int8(xs, Tensor.from_host(queue, q), Tensor.from_host(queue, scales))
    assert_close(got, reference(x, wq), dtype)
    z = reference(x, w.astype(dtype))
    glu = linear_glu(xs, ws)
    assert_close(glu, z[:, :12] / (1 + np.exp(-z[:, :12])) * z[:, 12:], dtype)


# the kernel's knobs beyond the device's defaults: the GPUs' tile as it is (a warp a column, 4 loads in
# flight, A staged in local memory), two and three columns a work-item with ragged column groups, unroll steps
# that leave K ragged (1000 = 125 chunks: 8-wide items x 3 or 4 chunks a block), A read from global memory
KNOBS = [
    {"GEMV_WG": 32, "GEMV_ROWS": 8, "GEMV_COLS": 1, "GEMV_UNROLL": 4, "GEMV_STAGE": 1},
    {"GEMV_WG": 16, "GEMV_ROWS": 4, "GEMV_COLS": 2, "GEMV_UNROLL": 3, "GEMV_STAGE": 1},
    {"GEMV_WG": 8, "GEMV_ROWS": 2, "GEMV_COLS": 3, "GEMV_UNROLL": 2, "GEMV_STAGE": 0},
    {"GEMV_WG": 1, "GEMV_ROWS": 8, "GEMV_COLS": 2, "GEMV_UNROLL": 1, "GEMV_STAGE": 1},
]


def launch_gemv(x, w_t, params, scales=None, glu=False, bias=None, residual=None, activation=None, rms=None):
    """x @ w_t on the gemv kernel under tile `params` (int8 with `scales`, GLU: n = w_t's columns / 2; rms:
    (norm weight, eps), x's rows RMS-normalized in the prologue)."""
    from netcl.ops.gemm.launch import launch
    from netcl.ops.gemm.problem import _Problem

    m, k = x.shape
    n = w_t.shape[1] // (2 if glu else 1)
    out = Tensor.empty(x.queue, (m, n), x.dtype)
    p = _Problem(a=x, b=w_t, out=out, bias=bias, residual=residual, activation=activation, alpha=1.0,
                 m=m, n=n, k=k, batch=(), squeeze=())
    launch(p, "gemv", params=params, scales=scales, glu=glu, rms=rms)
    return out


@pytest.mark.parametrize("params", KNOBS, ids=lambda p: "wg{GEMV_WG}r{GEMV_ROWS}c{GEMV_COLS}u{GEMV_UNROLL}"
                         "s{GEMV_STAGE}".format(**p))
@pytest.mark.parametrize("m,n,k", [(1, 37, 1000), (2, 130, 64), (5, 1, 8), (8, 19, 136)])
def test_gemv_knobs_against_numpy(queue, rng, params, m, n, k):
    """Half weights with the full epilogue, x rows a wider buffer's (row stride k + 8), odd N."""
    dtype = HALVES[m % 2]
    x = rng.standard_normal((m, k + 8)).astype(dtype)
    w = rng.standard_normal((n, k)).astype(dtype)
    bias, res = rng.standard_normal(n).astype(dtype), rng.standard_normal((m, n)).astype(dtype)
    xs = Tensor.from_host(queue, x)[:, :k]
    ws, bs, rs = (Tensor.from_host(queue, a) for a in (w, bias, res))
    got = gemm(xs, ws.transpose(0, 1), bs, "silu", rs, variant="gemv", params=params)
    assert_close(got, reference(x[:, :k], w, bias, res, "silu"), dtype)
    assert_close(gemm(xs, ws.transpose(0, 1), variant="gemv", params=params), reference(x[:, :k], w), dtype)


# (m, dtype, knobs): each dtype with each row count and each tile, each tile with two row counts (GEMV_M only
# sets how many rows' sums an item keeps; the tiles' knobs lay out columns and K): 6 define sets of each form
# where the full product of the three was 18 (~45 CPU s cold on a PoCL)
INT8_GLU_CASES = [([1, 3, 8][(i + d) % 3], dtype, KNOBS[i])
                  for d, dtype in enumerate([HALVES[1], np.dtype(np.float32)]) for i in range(3)]


@pytest.mark.parametrize("m,dtype,params", INT8_GLU_CASES,
                         ids=[f"{m}-{dt.name}-wg{p['GEMV_WG']}c{p['GEMV_COLS']}"
                              for m, dt, p in INT8_GLU_CASES])
def test_gemv_knobs_int8_and_glu(queue, rng, params, dtype, m):
    """int8 weights (per-column scales) plain with bias + residual and as SwiGLU, half weights as SwiGLU."""
    from netcl.ops import quantize_int8

    h, k = 21, 200
    w = rng.standard_normal((2 * h, k)).astype(np.float32)
    q, scales = quantize_int8(w)
    wq = (q.astype(np.float64) - 128) * scales[:, None]
    x = rng.standard_normal((m, k)).astype(dtype)
    bias, res = rng.standard_normal(2 * h).astype(dtype), rng.standard_normal((m, 2 * h)).astype(dtype)
    xs, bs, rs = (Tensor.from_host(queue, a) for a in (x, bias, res))
    qt, st = Tensor.from_host(queue, q).transpose(0, 1), Tensor.from_host(queue, scales)
    tol = {"float32": 1e-5, "bfloat16": TOL["bfloat16"]}[dtype.name]

    def check(got, want):
        err = np.abs(got.to_host().astype(np.float64) - want).max() / np.abs(want).max()
        assert err < tol, err

    check(launch_gemv(xs, qt, params, scales=st, bias=bs, residual=rs),
          x.astype(np.float64) @ wq.T + bias.astype(np.float64) + res.astype(np.float64))
    z = x.astype(np.float64) @ wq.T
    check(launch_gemv(xs, qt, params, scales=st, glu=True), z[:, :h] / (1 + np.exp(-z[:, :h])) * z[:, h:])
    if dtype != np.float32:
        wh = w.astype(dtype)
        z = x.astype(np.float64) @ wh.astype(np.float64).T
        got = launch_gemv(xs, Tensor.from_host(queue, wh).transpose(0, 1), params, glu=True)
        check(got, z[:, :h] / (1 + np.exp(-z[:, :h])) * z[:, h:])


def test_decode_batches_take_the_rows_tile_on_nvidia(queue, monkeypatch):
    """The gemv kernel's shape class: one row keeps the default tile; M > 1 ("rows") takes the tile the
    H200's sweep chose for several rows (on NVIDIA's class; other classes keep their defaults)."""
    from netcl.ops.gemm import variants

    dev = queue.device
    assert variants.shape_class(dev, "gemv", 1, 2048, 2048) is None
    assert variants.shape_class(dev, "gemv", 8, 2048, 2048) == "rows"
    monkeypatch.setattr(variants, "device_class", lambda d: "nvidia")
    rows = variants.usable_params(dev, "gemv", ml_dtypes.bfloat16, shape_class="rows")
    assert (rows["GEMV_WG"], rows["GEMV_ROWS"], rows["GEMV_UNROLL"], rows["GEMV_STAGE"]) == (64, 4, 1, 0)
    one = variants.usable_params(dev, "gemv", ml_dtypes.bfloat16, shape_class=None)
    assert one == variants.default_params("gemv", ml_dtypes.bfloat16, dev)
    monkeypatch.setattr(variants, "device_class", lambda d: "gpu")
    assert variants.shape_params(dev, "gemv", ml_dtypes.bfloat16, "rows") == {}


def rms_reference(x, norm_w, eps, dtype):
    """rms_norm in float64, rounded to the storage like the norm's output, as float64."""
    x64 = x.astype(np.float64)
    y = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps) * norm_w.astype(np.float64)
    return y.astype(dtype).astype(np.float64)


ALL_STORAGE = [np.dtype(np.float32), *HALVES]
TOL["float32"] = 1e-5


@pytest.mark.parametrize("m,n,k,dtype,params",
                         _paired([(1, 37, 200), (3, 20, 1000), (8, 9, 48)], ALL_STORAGE))
def test_rms_norm_linear_against_numpy(queue, rng, m, n, k, dtype, params):
    """The RMSNorm prologue (one launch) against float64 NumPy: rms_norm, then x @ W^T + bias; both work
    layouts (the CPUs' item a column; a tree of 8 items a column, 3 columns a work-group), K of an odd number
    of 8-element chunks; and ops.rms_norm_linear, in one launch where the device's tile takes the prologue."""
    from netcl.core import capture
    from netcl.ops import rms_norm_linear
    from netcl.ops.gemm.launch import gemv_rms_fits
    from netcl.profiling import count_launches

    x = (3 * rng.standard_normal((m, k))).astype(dtype)
    norm_w = (1 + 0.5 * rng.standard_normal(k)).astype(dtype)
    w, bias = rng.standard_normal((n, k)).astype(dtype), rng.standard_normal(n).astype(dtype)
    xs, nws, ws, bs = (Tensor.from_host(queue, a) for a in (x, norm_w, w, bias))
    tile = {"GEMV_WG": 1, "GEMV_ROWS": 8, **(params or {}), "GEMV_COLS": 1, "GEMV_UNROLL": 2, "GEMV_STAGE": 0}
    want = reference(rms_reference(x, norm_w, 1e-5, dtype), w, bias)
    if gemv_rms_miscompiled(queue.device, dtype):  # PyPI's PoCL 3.0 on half rows: refused, the op takes two
        with pytest.raises(DeviceError, match="miscompiles the RMSNorm prologue"):
            launch_gemv(xs, ws.transpose(0, 1), tile, bias=bs, rms=(nws, 1e-5))
        assert not gemv_rms_fits(queue.device, dtype, m, n, k)
    else:
        rec = capture.Recording()
        with capture.recording(rec):
            got = launch_gemv(xs, ws.transpose(0, 1), tile, bias=bs, rms=(nws, 1e-5))
        assert rec.launches == 1  # the norm is in the gemv's prologue
        assert_close(got, want, dtype)
    if params is None:  # the op: the prologue where the device's tile asks for it (GEMV_NORM), else two
        fused = m <= api.gemv_max_rows(queue.device, dtype) and gemv_rms_fits(queue.device, dtype, m, n, k)
        with count_launches() as launches:
            got = rms_norm_linear(xs, nws, 1e-5, ws, bs)
        assert_close(got, want, dtype)
        assert (launches.count == 1) == fused


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)], ids=lambda d: d.name)
@pytest.mark.parametrize("int8", [False, True], ids=["plain", "int8"])
@pytest.mark.parametrize("m", [1, 4, 12])
def test_rms_norm_linear_glu_and_int8(queue, rng, dtype, int8, m):
    """The prologue with SwiGLU's stacked gate and up (silu * up in the epilogue) and int8 weights: one launch
    for up to 8 rows where the device's tile takes the prologue (else and for 12 rows: rms_norm, then
    linear_glu / linear_int8)."""
    from netcl.ops import quantize_int8, rms_norm_linear
    from netcl.ops.gemm.launch import gemv_rms_fits
    from netcl.profiling import count_launches

    h, k = 19, 72
    w = rng.standard_normal((2 * h, k)).astype(np.float32)
    x = (2 * rng.standard_normal((m, k))).astype(dtype)
    norm_w = (1 + 0.5 * rng.standard_normal(k)).astype(dtype)
    xs, nws = Tensor.from_host(queue, x), Tensor.from_host(queue, norm_w)
    if int8:
        q, scales = quantize_int8(w)
        wd = (q.astype(np.float64) - 128) * scales[:, None]
        args = (Tensor.from_host(queue, q), None, Tensor.from_host(queue, scales))
    else:
        wd = w.astype(dtype).astype(np.float64)
        args = (Tensor.from_host(queue, w.astype(dtype)),)
    z = rms_reference(x, norm_w, 1e-6, dtype) @ wd.T
    rms_norm_linear(xs, nws, 1e-6, *args, glu=True)  # programs built outside the count
    with count_launches() as launches:
        got = rms_norm_linear(xs, nws, 1e-6, *args, glu=True)
    assert_close(got, z[:, :h] / (1 + np.exp(-z[:, :h])) * z[:, h:], dtype)
    limit = api.GEMV_MAX_ROWS if int8 else api.gemv_max_rows(queue.device, dtype)  # int8: the gemv's rows
    fused = m <= limit and gemv_rms_fits(queue.device, dtype, m, h, k, glu=True)
    assert (launches.count == 1) == fused
    with count_launches() as launches:  # the plain product (int8: linear_int8's form)
        got = rms_norm_linear(xs, nws, 1e-6, *args)
    assert_close(got, z, dtype)
    assert (launches.count == 1) == fused
    if m <= api.GEMV_MAX_ROWS and not gemv_rms_miscompiled(queue.device, dtype):
        # the prologue itself, whatever the device's tile says (test_rms_norm_linear_against_numpy checks the
        # refusal where the compiler is known to get it wrong)
        tile = {"GEMV_WG": 1, "GEMV_ROWS": 8, "GEMV_COLS": 1, "GEMV_UNROLL": 2, "GEMV_STAGE": 0}
        w_t = args[0].transpose(0, 1)
        scales = args[2] if int8 else None
        got = launch_gemv(xs, w_t, tile, scales=scales, glu=True, rms=(nws, 1e-6))
        assert_close(got, z[:, :h] / (1 + np.exp(-z[:, :h])) * z[:, h:], dtype)


def test_rms_norm_linear_falls_back_and_checks(queue, rng):
    """K off the 16-byte chunks (30) or a float64 x: rms_norm, then the GEMM, with the same values; bad
    arguments raise before anything is enqueued."""
    from netcl.errors import DTypeError, ShapeError
    from netcl.ops import rms_norm_linear

    for dtype, k in ((np.float32, 30), (np.float64, 32)):
        x, norm_w = rng.standard_normal((2, k)).astype(dtype), rng.standard_normal(k).astype(dtype)
        w = rng.standard_normal((5, k)).astype(dtype)
        got = rms_norm_linear(Tensor.from_host(queue, x), Tensor.from_host(queue, norm_w), 1e-5,
                              Tensor.from_host(queue, w))
        want = rms_reference(x, norm_w, 1e-5, dtype) @ w.astype(np.float64).T
        np.testing.assert_allclose(got.to_host(), want, rtol=1e-5, atol=1e-5)
    xs = Tensor.from_host(queue, np.ones((1, 16), np.float32))
    ws = Tensor.from_host(queue, np.ones((4, 16), np.float32))
    with pytest.raises(ShapeError, match=r"norm_weight must be a float32 Tensor of shape \(16,\)"):
        rms_norm_linear(xs, Tensor.from_host(queue, np.ones(8, np.float32)), 1e-5, ws)
    with pytest.raises(ShapeError, match="glu needs a stacked weight of 2h rows"):
        rms_norm_linear(xs, xs.reshape(16), 1e-5, ws[:3], glu=True)
    with pytest.raises(DTypeError, match="x is float32 but the weight is float16"):
        rms_norm_linear(xs, xs.reshape(16), 1e-5, Tensor.from_host(queue, np.ones((4, 16), np.float16)))
