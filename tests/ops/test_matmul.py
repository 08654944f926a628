"""matmul / matmul_epilogue / linear / fused GEMMs against float64 NumPy on odd shapes and layouts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from netcl.core import capture
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, ShapeError
from netcl.ops import linear, linear_relu, matmul, matmul_bias_relu, matmul_epilogue
from netcl.ops.gemm import api, choose_variant, gemm, splitk, variants
from netcl.ops.gemm import launch as gemm_launch
from netcl.ops.gemm.problem import _prepare
from netcl.profiling import count_launches

# A small tiled configuration: the GPU kernel's logic (double buffering, edges, both layouts) is
# checked on the CPU device too, where the default 128 x 128 tiles would only cost compile time.
SMALL_TILED = {"BM": 32, "BN": 32, "BK": 8, "TX": 8, "TY": 8, "VW": 4, "PADA": 4, "PADB": 4}
# The GPUs' tiled kernel is never chosen on a CPU device: its cases check index arithmetic, which does not
# depend on the compiler (scripts/test_matrix.py runs them on one of the CPU compilers only).
GPU_SHAPED = pytest.mark.gpu_shaped
TILED = pytest.param("tiled", SMALL_TILED, marks=GPU_SHAPED)
SMALL_CPU = {"MB": 24, "NB": 32, "KC": 64, "RM": 5, "VN": 16}  # several K chunks and ragged blocks


def _eps(dtype) -> float:
    return float(np.finfo(np.dtype(dtype)).eps)


def check(got: Tensor, want: np.ndarray, dtype=np.float32, k: int = 1) -> None:
    """Compare with a float64 reference; the absolute slack grows with the reduction length K."""
    out = got.to_host() if hasattr(got, "to_host") else np.asarray(got)
    assert out.shape == want.shape, f"shape {out.shape} != {want.shape}"
    assert out.dtype == np.dtype(dtype)
    if np.dtype(dtype) == np.float16:
        rtol, atol = 2e-3, 2e-3 * math.sqrt(max(k, 1))
    else:
        rtol, atol = 10 * _eps(dtype), 10 * _eps(dtype) * max(k, 1)
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=rtol, atol=atol)


def host(rng, shape, dtype=np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def dev(queue, arr, transposed=False) -> Tensor:
    """arr on the device; with transposed=True stored as arr.T and viewed back (swapped strides)."""
    if transposed:
        return Tensor.from_host(queue, np.ascontiguousarray(np.swapaxes(arr, -1, -2))).transpose(-1, -2)
    return Tensor.from_host(queue, arr)


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 33, 130), (130, 257, 33), (33, 7, 257), (257, 130, 7)])
def test_matmul_odd_shapes(queue, rng, m, n, k):
    a, b = host(rng, (m, k)), host(rng, (k, n))
    check(matmul(dev(queue, a), dev(queue, b)), a.astype(np.float64) @ b, k=k)


@pytest.mark.parametrize("variant,params", [("direct", None), ("dot", {"DOT_WG": 16}), ("cpu", SMALL_CPU),
                                            TILED])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
def test_every_variant_and_layout(queue, rng, variant, params, ta, tb):
    m, n, k = 67, 45, 130
    a, b = host(rng, (m, k)), host(rng, (k, n))
    A, B = dev(queue, a, ta), dev(queue, b, tb)
    assert (A.strides[-2] == 1) == ta and (B.strides[-2] == 1) == tb
    check(gemm(A, B, variant=variant, params=params), a.astype(np.float64) @ b, k=k)


@pytest.mark.parametrize("variant,params", [("direct", None), ("cpu", SMALL_CPU), TILED])
def test_strided_views_and_offsets(queue, rng, variant, params):
    base_a, base_b = host(rng, (90, 81)), host(rng, (70, 99))
    A = Tensor.from_host(queue, base_a)[3::2, 5:70]  # row stride 162, column stride 1, offset
    B = Tensor.from_host(queue, base_b)[1:66, ::3]   # column stride 3: neither layout is contiguous
    a, b = base_a[3::2, 5:70], base_b[1:66, ::3]
    check(gemm(A, B, variant=variant, params=params), a.astype(np.float64) @ b, k=65)


def test_batch_broadcasting(queue, rng):
    a, b = host(rng, (2, 1, 7, 33)), host(rng, (3, 33, 17))
    got = matmul(dev(queue, a), dev(queue, b))
    assert got.shape == (2, 3, 7, 17)
    check(got, np.matmul(a.astype(np.float64), b), k=33)


def test_batch_over_two_levels_and_host_loop(queue, rng):
    # (2, 3, 4) batch with b broadcast over the middle axis: cannot collapse into one stride
    a, b = host(rng, (2, 3, 4, 9, 10)), host(rng, (2, 1, 4, 10, 11))
    check(matmul(dev(queue, a), dev(queue, b)), np.matmul(a.astype(np.float64), b), k=10)


@pytest.mark.parametrize("variant,params", [("cpu", SMALL_CPU), TILED])
def test_batched_transposed_operands(queue, rng, variant, params):
    a, b = host(rng, (3, 40, 37)), host(rng, (3, 37, 35))
    got = gemm(dev(queue, a, True), dev(queue, b, True), variant=variant, params=params)
    check(got, np.matmul(a.astype(np.float64), b), k=37)


def test_one_dimensional_operands(queue, rng):
    v, mat, w = host(rng, (13,)), host(rng, (13, 6)), host(rng, (6,))
    check(matmul(dev(queue, v), dev(queue, mat)), v.astype(np.float64) @ mat, k=13)
    check(matmul(dev(queue, mat), dev(queue, w)), mat.astype(np.float64) @ w, k=6)
    check(matmul(dev(queue, v), dev(queue, v)), np.array(v.astype(np.float64) @ v), k=13)


def test_empty_and_zero_k(queue, rng):
    a, b = np.zeros((5, 0), np.float32), np.zeros((0, 4), np.float32)
    check(matmul(dev(queue, a), dev(queue, b)), np.zeros((5, 4)))
    bias = host(rng, (4,))
    check(matmul_epilogue(dev(queue, a), dev(queue, b), bias=dev(queue, bias)),
          np.broadcast_to(bias.astype(np.float64), (5, 4)))
    assert matmul(Tensor.empty(queue, (0, 3)), Tensor.empty(queue, (3, 4))).shape == (0, 4)


@pytest.mark.parametrize("variant,params", [(None, None), TILED])
def test_float16_storage_float32_accumulation(queue, rng, variant, params):
    m, n, k = 33, 130, 257
    a, b = host(rng, (m, k), np.float16), host(rng, (k, n), np.float16)
    got = gemm(dev(queue, a), dev(queue, b, True), variant=variant, params=params)
    check(got, a.astype(np.float64) @ b.astype(np.float64), np.float16, k=k)


def test_float64(device, queue, rng):
    if not device.capabilities.fp64:
        with pytest.raises(DTypeError, match="float64"):
            Tensor.from_host(queue, np.ones((2, 2)))
        return
    m, n, k = 35, 130, 257
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    check(matmul(dev(queue, a, True), dev(queue, b)), a @ b, np.float64, k=k)


def _gelu(x):
    from math import erf

    return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))


REFERENCE_ACT = {
    None: lambda y: y,
    "relu": lambda y: np.maximum(y, 0),
    "gelu": _gelu,
    "gelu_tanh": lambda y: 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y**3))),
    "silu": lambda y: y / (1 + np.exp(-y)),
}


@pytest.mark.parametrize("activation", list(REFERENCE_ACT))
def test_epilogue_bias_activation_residual_alpha(queue, rng, activation):
    m, n, k = 37, 70, 33
    a, b, bias, res = host(rng, (m, k)), host(rng, (k, n)), host(rng, (n,)), host(rng, (m, n))
    want = REFERENCE_ACT[activation](0.5 * (a.astype(np.float64) @ b) + bias) + res
    with count_launches() as launches:
        got = matmul_epilogue(dev(queue, a), dev(queue, b), bias=dev(queue, bias), activation=activation,
                              residual=dev(queue, res), alpha=0.5)
    assert launches.count == 1
    check(got, want, k=k)


@pytest.mark.parametrize("variant,params", [("direct", None), TILED])
def test_epilogue_other_variants_with_broadcast_residual(queue, rng, variant, params):
    a, b, bias, res = host(rng, (2, 19, 21)), host(rng, (21, 23)), host(rng, (23,)), host(rng, (19, 1))
    Bias = Tensor.from_host(queue, np.repeat(bias, 2))[::2]  # strided bias
    got = gemm(dev(queue, a), dev(queue, b), Bias, "gelu_tanh", dev(queue, res), 2.0, variant=variant,
               params=params)
    y = 2.0 * np.matmul(a.astype(np.float64), b) + bias
    check(got, REFERENCE_ACT["gelu_tanh"](y) + res, k=21)


def test_linear_reads_weight_transposed_in_place(queue, rng):
    x, w, bias = host(rng, (2, 5, 33)), host(rng, (17, 33)), host(rng, (17,))
    W = dev(queue, w)
    with count_launches() as launches:
        got = linear(dev(queue, x), W, dev(queue, bias))
    assert launches.count == 1  # no transpose copy, no separate bias add
    check(got, x.astype(np.float64) @ w.T + bias, k=33)
    check(linear(dev(queue, x), W), x.astype(np.float64) @ w.T, k=33)


def test_linear_relu_and_matmul_bias_relu_one_launch(queue, rng):
    x, w, bias = host(rng, (9, 40)), host(rng, (24, 40)), host(rng, (24,))
    X, W, Bias = dev(queue, x), dev(queue, w), dev(queue, bias)
    with count_launches() as launches:
        y1 = linear_relu(X, W, Bias)
        y2 = matmul_bias_relu(X, dev(queue, w.T.copy()), Bias)
    assert launches.count == 2
    want = np.maximum(x.astype(np.float64) @ w.T + bias, 0)
    check(y1, want, k=40)
    check(y2, want, k=40)


def test_variant_choice_by_device_class(device):
    cpu = device.capabilities.kind == "cpu"
    assert choose_variant(device, 1, 512, 512) == (
        "cpu" if cpu else "direct"
    )  # matrix-vector: blocked on CPUs
    assert choose_variant(device, 8, 2, 512) == "direct"  # two columns: no vector along N
    big = choose_variant(device, 1024, 1024, 1024)
    assert big == ("cpu" if device.capabilities.kind == "cpu" else "tiled")


# -- errors ---------------------------------------------------------------------------------------------
def test_inner_dimension_mismatch_names_both_shapes(queue):
    with pytest.raises(ShapeError, match=r"\(4, 5\).*\(6, 3\)"):
        matmul(Tensor.zeros(queue, (4, 5)), Tensor.zeros(queue, (6, 3)))


def test_bad_batch_broadcast_names_both_shapes(queue):
    with pytest.raises(ShapeError, match=r"\(2, 4, 5\).*\(3, 5, 6\)"):
        matmul(Tensor.zeros(queue, (2, 4, 5)), Tensor.zeros(queue, (3, 5, 6)))


def test_dtype_errors(queue):
    with pytest.raises(DTypeError, match="float32.*float16|float16.*float32"):
        matmul(Tensor.zeros(queue, (2, 2)), Tensor.zeros(queue, (2, 2), np.float16))
    with pytest.raises(DTypeError, match="int32"):
        matmul(Tensor.zeros(queue, (2, 2), np.int32), Tensor.zeros(queue, (2, 2), np.int32))


def test_epilogue_argument_errors(queue):
    a, b = Tensor.zeros(queue, (3, 4)), Tensor.zeros(queue, (4, 5))
    with pytest.raises(ShapeError, match=r"bias must have shape \(5,\)"):
        matmul_epilogue(a, b, bias=Tensor.zeros(queue, (4,)))
    with pytest.raises(ShapeError, match="residual"):
        matmul_epilogue(a, b, residual=Tensor.zeros(queue, (2, 5)))
    with pytest.raises(ValueError, match="activation"):
        matmul_epilogue(a, b, activation="tanh")
    with pytest.raises(ShapeError, match="in_features"):
        linear(Tensor.zeros(queue, (3, 4)), Tensor.zeros(queue, (5, 6)))


@GPU_SHAPED
@pytest.mark.parametrize("ta,tb,n", [(False, False, 29), (True, True, 29), (False, False, 32)])
def test_split_k_with_epilogue(queue, rng, ta, tb, n):
    # n = 32: the reduction reads four columns a work-item (RED_VEC 4), twelve slices (a group of eight
    # loads in flight, then four one at a time)
    m, k = 37, 96
    a, b, bias, res = host(rng, (m, k)), host(rng, (k, n)), host(rng, (n,)), host(rng, (m, n))
    got = gemm(dev(queue, a, ta), dev(queue, b, tb), dev(queue, bias), "relu", dev(queue, res), 1.5,
               variant="tiled", params=SMALL_TILED, splits=12 if n == 32 else 4)
    check(got, np.maximum(1.5 * (a.astype(np.float64) @ b) + bias, 0) + res, k=k)


@GPU_SHAPED
@pytest.mark.parametrize("variant, params, splits", [("tiled", SMALL_TILED, None), ("tiled", SMALL_TILED, 3),
                                                     ("direct", None, None), ("dot", None, None)],
                         ids=["tiled", "tiled-split3", "direct", "dot"])
def test_relu_mask_in_the_gpu_kernels_epilogue(queue, rng, variant, params, splits):
    """where(mask > 0, a @ b, 0) in the epilogue (MASK_RESIDUAL) of the GPU kernels, split-K's in its
    reduction (the slices stay raw sums): a ReLU's backward in the GEMM that makes the gradient
    (matmul_relu_mask on a GPU), against float64 with the mask's zeros and negatives."""
    m, n, k = 37, 29, 96
    a, b, mask = host(rng, (m, k)), host(rng, (k, n)), host(rng, (m, n))
    mask[0, :5] = 0.0                                     # exactly 0: not kept
    p = _prepare(dev(queue, a), dev(queue, b), None, dev(queue, mask), None, 1.0)
    gemm_launch.launch(p, variant, params, splits, mask_residual=True)
    check(p.out, np.where(mask > 0, a.astype(np.float64) @ b, 0.0), k=k)


def test_split_k_choice_fills_a_gpu_only_for_skinny_problems(queue):
    from dataclasses import replace
    from types import SimpleNamespace

    choose_splits = splitk.choose_splits

    h200_like = SimpleNamespace(capabilities=SimpleNamespace(kind="gpu", compute_units=132, extensions=""),
                                platform_name="some GPU")
    tile = {"BM": 128, "BN": 128}
    p = _prepare(Tensor.zeros(queue, (2, 3)), Tensor.zeros(queue, (3, 2)), None, None, None, 1.0)
    assert choose_splits(h200_like, replace(p, m=4096, n=4096, k=4096), tile) == 1
    assert choose_splits(h200_like, replace(p, m=256, n=4096, k=4096), tile) == 4  # 64 tiles -> 256
    assert choose_splits(h200_like, replace(p, m=256, n=4096, k=300), tile) == 2   # short slices: one wave
    assert choose_splits(h200_like, replace(p, m=256, n=4096, k=100), tile) == 1   # K too short
    assert choose_splits(h200_like, replace(p, m=512, n=512, k=512), tile) == 8    # 16 tiles -> 128
    assert choose_splits(h200_like, replace(p, m=1000, n=1000, k=1000), tile) == 2  # 64 tiles -> 128
    assert choose_splits(h200_like, replace(p, m=2048, n=2048, k=2048), tile) == 1
    cpu = SimpleNamespace(capabilities=SimpleNamespace(kind="cpu", compute_units=2))
    assert choose_splits(cpu, replace(p, m=256, n=4096, k=4096), tile) == 1
    # half operands: the tiled kernel keeps them whole (its workspace would be half); the matrix units write
    # float32 partial sums, so an AMP weight gradient (704 x 256 over 2048 tokens: 12 blocks) is split
    p16 = _prepare(Tensor.zeros(queue, (2, 3), np.float16), Tensor.zeros(queue, (3, 2), np.float16),
                   None, None, None, 1.0)
    assert choose_splits(h200_like, replace(p16, m=704, n=256, k=2048), tile) == 1
    assert choose_splits(h200_like, replace(p16, m=704, n=256, k=2048), tile, partial_sums=True) == 16
    assert choose_splits(h200_like, replace(p16, m=8192, n=8192, k=8192), tile, partial_sums=True) == 1
    assert choose_splits(cpu, replace(p16, m=704, n=256, k=2048), tile, partial_sums=True) == 1
    # Hopper's warpgroup MMA: at most one wave of two blocks an SM (the 25M GPT's weight gradients over 16384
    # tokens), where another GPU aims long slices at two waves of one
    hopper_caps = SimpleNamespace(kind="gpu", compute_units=132, nv_compute_capability=(9, 0),
                                  extensions="cl_nv_compiler_options")
    hopper = SimpleNamespace(capabilities=hopper_caps, platform_name="NVIDIA CUDA")
    for m, n, on_hopper, elsewhere in ((512, 512, 16, 16), (1376, 512, 6, 8), (512, 1376, 6, 8)):
        gw = replace(p16, m=m, n=n, k=16384)
        assert choose_splits(hopper, gw, tile, partial_sums=True) == on_hopper
        assert choose_splits(h200_like, gw, tile, partial_sums=True) == elsewhere
    assert choose_splits(hopper, replace(p16, m=704, n=256, k=2048), tile, partial_sums=True) == 16
    # slices at least 64 deep: 600 in 9
    assert choose_splits(hopper, replace(p16, m=704, n=256, k=600), tile, partial_sums=True) == 9
    # six slices of 16384: five of 2752 (a 32-deep multiple) and a last one of 2624
    assert splitk.slices(16384, 6) == (2752, 6) and splitk.slices(16384, 8) == (2048, 8)
    assert splitk.slices(100, 3) == (64, 2)  # 34 -> 64 deep: two slices cover it


def test_linear_on_tokens_is_one_row_gemm(queue, rng):
    x, w, res = host(rng, (3, 7, 20)), host(rng, (11, 20)), host(rng, (3, 7, 11))
    with count_launches() as launches:
        got = matmul_epilogue(dev(queue, x), dev(queue, w).T, residual=dev(queue, res))
    assert launches.count == 1 and got.shape == (3, 7, 11)
    check(got, x.astype(np.float64) @ w.T + res, k=20)
    # batch dims that do not merge into rows (a sliced batch) still go through the batched path
    big = host(rng, (3, 9, 20))
    check(matmul(Tensor.from_host(queue, big)[:, 1:8], dev(queue, w).T), big[:, 1:8].astype(np.float64) @ w.T,
          k=20)


@GPU_SHAPED
@pytest.mark.parametrize("ta,tb", [(False, False), (True, True), (False, True), (True, False)])
def test_tiled_four_wide_fetch_interior_and_edges(queue, rng, monkeypatch, ta, tb):
    """Aligned operands take the tiled kernel's 4-wide global loads (GVEC) on interior tiles and the
    guarded scalar path on the edge tiles of M, N and K; both must agree with the reference. K is not
    split (splits=1, forced): a GPU's own choice splits these small problems, through split-K's launch,
    and the defines checked here are those of the unsplit kernel."""
    built = []
    real = gemm_launch._program
    monkeypatch.setattr(
        gemm_launch, "_program", lambda dev_, var, d: built.append(dict(d)) or real(dev_, var, d)
    )
    m, n, k = 72, 76, 132  # interior 32 x 32 x 8 tiles plus a ragged block in every dimension
    a, b = host(rng, (m, k)), host(rng, (k, n))
    check(
        gemm(dev(queue, a, ta), dev(queue, b, tb), variant="tiled", params={**SMALL_TILED, "WX": 4, "GM": 2},
             splits=1),
        a.astype(np.float64) @ b,
        k=k,
    )
    assert "GVEC" in built[-1] and built[-1]["WX"] == 4  # warps as 4 x 8 patches of the 8 x 8 grid
    # grouped block order over a 5 x 5 grid of blocks (a partial last group of rows)
    m2, n2 = 150, 140
    a2, b2 = host(rng, (m2, k)), host(rng, (k, n2))
    check(gemm(dev(queue, a2, ta), dev(queue, b2, tb), variant="tiled", params={**SMALL_TILED, "GM": 2},
               splits=1), a2.astype(np.float64) @ b2, k=k)
    # a 4-misaligned offset falls back to the scalar path
    base = host(rng, (m, k + 1))
    check(gemm(Tensor.from_host(queue, base)[:, 1:], dev(queue, b, tb), variant="tiled", params=SMALL_TILED,
               splits=1), base[:, 1:].astype(np.float64) @ b, k=k)
    assert "GVEC" not in built[-1]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cpu_split_k_long_k(device, queue, rng, dtype):
    """Skinny GEMM with a long K (a conv weight gradient) on CPUs: K split into slices + a reduction."""
    if dtype == np.float64 and not device.capabilities.fp64:
        pytest.skip("no fp64 on this device")
    m, n, k = 7, 3, 3 * 8192 + 16 * 17  # odd rows/cols; K divisible by 16, not a power of two
    a = rng.standard_normal((m, k))
    bt = rng.standard_normal((n, k))  # B read in place as a transposed view (K-contiguous)
    bias = rng.standard_normal(n)
    ta = Tensor.from_host(queue, a.astype(dtype))
    tb = Tensor.from_host(queue, bt.astype(dtype)).T
    p = _prepare(ta, tb, None, None, None, 1.0)
    assert splitk.choose_cpu_splits(p, "cpu") == (16 if device.capabilities.kind == "cpu" else 0)
    out = matmul_epilogue(ta, tb, bias=Tensor.from_host(queue, bias.astype(dtype)), activation="relu")
    a, bt, bias = (v.astype(dtype).astype(np.float64) for v in (a, bt, bias))  # the stored values
    check(out, np.maximum(a @ bt.T + bias, 0), dtype, k)
    off = Tensor.from_host(queue, np.concatenate([np.zeros(5), a.ravel()]).astype(dtype))[5:].reshape(m, k)
    check(gemm(off, tb, variant="cpu"), a @ bt.T, dtype, k)  # offset operand, explicit variant


@GPU_SHAPED
@pytest.mark.parametrize("in_kernel", [True, False], ids=["summed-in-kernel", "reduction-launch"])
def test_split_k_calls_are_replayed(queue, rng, monkeypatch, in_kernel):
    """A repeated split-K problem (the GPU's choice for skinny shapes, forced here) skips the host
    path on later calls: its launches (the GEMM whose blocks' last work-group sums the slices, or the GEMM
    into the workspace and the reduction with the epilogue) are replayed with the new operands, output and
    workspace (the arrival counts reset by each launch), and the results stay right."""
    monkeypatch.setattr(splitk, "SPLIT_SUM", "kernel" if in_kernel else "launch")
    launches = 1 if in_kernel else 2
    real = variants.tuned_params
    monkeypatch.setattr(api, "choose_variant", lambda dev_, m, n, k: "tiled")
    monkeypatch.setattr(splitk, "choose_splits", lambda dev_, p, tile: 2)
    monkeypatch.setattr(
        variants,
        "tuned_params",
        lambda d, v, dt: {**real(d, v, dt), **SMALL_TILED} if v == "tiled" else real(d, v, dt),
    )
    monkeypatch.setattr(capture, "plans", capture.PlanCache())
    calls = []
    real_launch = api.launch
    monkeypatch.setattr(api, "launch", lambda *a, **kw: calls.append(1) or real_launch(*a, **kw))
    m, n, k = 37, 29, 96
    for _ in range(3):
        a, b, bias, res = host(rng, (m, k)), host(rng, (k, n)), host(rng, (n,)), host(rng, (m, n))
        with count_launches() as c:
            got = matmul_epilogue(dev(queue, a), dev(queue, b), dev(queue, bias), "relu", dev(queue, res))
        check(got, np.maximum(a.astype(np.float64) @ b + bias, 0) + res, k=k)
        assert c.count == launches
    assert len(calls) == 1  # the host path ran once; the later calls were replays
    (template, _, work), = api.templates().values()
    assert template.launches == launches and work[0] == (2, m, n)


@GPU_SHAPED
def test_split_k_summed_in_the_kernel_gives_the_reductions_bits(queue, rng, monkeypatch):
    """The slices summed by each block's last work-group (SPLIT_LAST) give the separate reduction's bits (the
    same order of additions, the same epilogue: bias, relu, residual, alpha) in one launch instead of two;
    blocks at the edges of M and N, 2 and 5 slices, and a second call (the arrival counts were reset). The
    matrix units' kernels: tests/ops/test_gemm_mma.py."""
    m, n, k = 37, 70, 120
    a, b, bias, res = host(rng, (m, k)), host(rng, (k, n)), host(rng, (n,)), host(rng, (m, n))
    results = {}
    for in_kernel in (True, False):
        monkeypatch.setattr(splitk, "SPLIT_SUM", "kernel" if in_kernel else "launch")
        for splits in (2, 5):
            for _ in range(2):
                with count_launches() as c:
                    got = gemm(dev(queue, a), dev(queue, b), dev(queue, bias), "relu", dev(queue, res), 0.75,
                               variant="tiled", params=SMALL_TILED, splits=splits)
                assert c.count == (1 if in_kernel else 2)
                results.setdefault(splits, []).append(got.to_host())
    want = np.maximum(0.75 * (a.astype(np.float64) @ b) + bias, 0) + res
    for got in results.values():
        check(got[0], want, k=k)
        for other in got[1:]:
            np.testing.assert_array_equal(other, got[0])


@GPU_SHAPED
def test_split_k_sums_in_the_kernel_for_small_blocks(queue, rng, monkeypatch):
    """netcl's choice (SPLIT_SUM "auto"): blocks of at most SPLIT_KERNEL_MAX_BLOCK outputs sum their slices in
    the kernel (one launch), larger ones by the reduction launch (two), with the same bits; float64 always
    takes the reduction."""
    monkeypatch.setattr(splitk, "SPLIT_SUM", "auto")
    m, n, k = 37, 29, 96
    a, b = host(rng, (m, k)), host(rng, (k, n))
    small = {**SMALL_TILED, "BM": 32, "BN": 32, "TX": 8, "TY": 8}
    assert small["BM"] * small["BN"] <= splitk.SPLIT_KERNEL_MAX_BLOCK < 64 * 64
    results = []
    for tile, launches in ((small, 1), ({**small, "BM": 64, "BN": 64}, 2)):
        with count_launches() as c:
            out = gemm(dev(queue, a), dev(queue, b), variant="tiled", params=tile, splits=3)
        results.append(out.to_host())
        assert c.count == launches
    np.testing.assert_array_equal(results[1], results[0])
    check(results[0], a.astype(np.float64) @ b, k=k)
    assert not splitk.sums_in_kernel(np.dtype(np.float64), small)


@GPU_SHAPED
def test_tile_divisible_problems_take_the_edge_free_kernel(queue, rng, monkeypatch):
    """INNER=1: a problem whose every tile is interior compiles without the guarded path (ALL_INNER,
    at BK); one with edge tiles keeps the guarded kernel at its own k tile BKE. Both are exact. K is not
    split (splits=1, forced: a GPU would split these, and a slice's depth decides ALL_INNER there)."""
    built = []
    real = gemm_launch._program
    monkeypatch.setattr(
        gemm_launch, "_program", lambda dev_, var, d: built.append(dict(d)) or real(dev_, var, d)
    )
    params = {**SMALL_TILED, "INNER": 1, "BKE": 16}
    for (m, n, k), inner in (((64, 96, 48), True), ((72, 76, 132), False), ((64, 96, 44), False)):
        a, b = host(rng, (m, k)), host(rng, (k, n))
        check(
            gemm(dev(queue, a), dev(queue, b), variant="tiled", params=params, splits=1),
            a.astype(np.float64) @ b,
            k=k,
        )
        assert ("ALL_INNER" in built[-1]) == inner
        assert built[-1]["BK"] == (8 if inner else 16)
        assert "INNER" not in built[-1] and "BKE" not in built[-1]


@pytest.mark.parametrize("variant,params", [(None, None), ("direct", None), ("cpu", SMALL_CPU),
                                            TILED])
def test_bias_per_row(queue, rng, variant, params):
    """bias_rows=True adds bias[m] (a convolution's per-channel bias in y = W @ cols), broadcast over a
    batch of right operands, with the activation after it; split-K's reduction applies it too."""
    m, n, k = 37, 29, 40
    a, b, bias = host(rng, (m, k)), host(rng, (3, k, n)), host(rng, (m,))
    want = np.maximum(a.astype(np.float64) @ b + bias[:, None], 0)
    for _ in range(2):  # the second auto call replays the first one's launch
        got = gemm(dev(queue, a), dev(queue, b), dev(queue, bias), "relu", variant=variant, params=params,
                   bias_rows=True)
        check(got, want, k=k)
    if variant == "tiled":
        got = gemm(
            dev(queue, a),
            dev(queue, b[0]),
            dev(queue, bias),
            variant="tiled",
            params=params,
            splits=2,
            bias_rows=True,
        )
        check(got, a.astype(np.float64) @ b[0] + bias[:, None], k=k)
    with pytest.raises(ShapeError, match=r"bias must have shape \(37,\).*per row"):
        gemm(dev(queue, a), dev(queue, b), dev(queue, host(rng, (n,))), bias_rows=True)


@GPU_SHAPED
def test_tiled_tile_per_shape_class(device, queue, rng, monkeypatch):
    """The tiled kernel's tile comes from the problem's shape class (variants.SHAPE_TILES of the device's
    class over the general tile): M <= 64 takes the "m64" tile here; the result stays exact; the classes
    follow the output sides and, for large sides, the block count against the compute units."""
    monkeypatch.setattr(api, "choose_variant", lambda dev_, m, n, k: "tiled")
    monkeypatch.setattr(capture, "plans", capture.PlanCache())
    monkeypatch.setattr(variants, "_usable", {})
    real = variants.tuned_params
    monkeypatch.setattr(variants, "tuned_params", lambda d, v, dt: {**real(d, v, dt), **SMALL_TILED}
                        if v == "tiled" else real(d, v, dt))
    m64 = {"BM": 64, "BN": 32, "TY": 8, "TX": 8}
    monkeypatch.setitem(variants.SHAPE_TILES, variants.device_class(device), {"float32": {"m64": m64}})
    built = []
    real_program = gemm_launch._program
    monkeypatch.setattr(gemm_launch, "_program",
                        lambda dev_, var, d: built.append(dict(d)) or real_program(dev_, var, d))
    for m, k, bm in ((37, 70, 64), (70, 40, 32)):   # (3, m, k) @ (3, k, 150): "m64", then no class
        a, b = host(rng, (3, m, k)), host(rng, (3, k, 150))
        check(matmul(dev(queue, a), dev(queue, b)), a.astype(np.float64) @ b, k=k)
        assert built[-1]["BM"] == bm
    assert variants.usable_params(device, "tiled", np.float32, shape_class="m64")["BN"] == 32
    cls = variants.tiled_shape_class
    assert [cls(device, 64, 64, 9), cls(device, 64, 4096, 9), cls(device, 4096, 60, 9)] == [
        "m64n64", "m64", "n64"]
    units = device.capabilities.compute_units
    assert cls(device, 128, 128 * units, 9) is None and cls(device, 128, 128 * (units - 1), 9) == "few_blocks"
    assert cls(device, 128, 128 * (units - 1), 9, batch=2) is None


TILED_CLASSES = ("m64n64", "m64", "n64", "few_blocks")  # variants.tiled_shape_class's


@GPU_SHAPED
@pytest.mark.parametrize("tile", [dict(t) for t in {tuple(sorted(t.items()))
                                                   for per in variants.SHAPE_TILES.values()
                                                   for classes in per.values() for name, t in classes.items()
                                                   if name in TILED_CLASSES}])
def test_shape_class_tiles_are_exact(queue, rng, tile):
    """Every tiled tile SHAPE_TILES names, on a batched problem with edge tiles (guarded path) and on a
    tile-divisible one (edge-free kernel), a transposed operand among them (the matrix units' classes:
    tests/ops/test_gemm_mma.py)."""
    for (bs, m, n, k), tb in (((3, 37, 70, 45), False), ((2, 64, 128, 64), True)):
        a, b = host(rng, (bs, m, k)), host(rng, (bs, k, n))
        bd = (Tensor.from_host(queue, np.ascontiguousarray(b.transpose(0, 2, 1))).transpose(1, 2) if tb
              else dev(queue, b))
        got = gemm(dev(queue, a), bd, variant="tiled", params=tile)
        check(got, a.astype(np.float64) @ b, k=k)
