"""GEMM cases for scripts/oclgrind_check.py: every GEMM kernel on tiny odd shapes, both layouts,
edges in every tile dimension, all storage dtypes and the full epilogue. Also plain tests elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

from netcl.core.tensor import Tensor
from netcl.ops.gemm import gemm
from tests.oclgrind.cases import oclgrind_only

TILED_SMALL = {"BM": 16, "BN": 16, "BK": 4, "TX": 4, "TY": 4, "VW": 2, "PADA": 2, "PADB": 2}
TILED_WIDE = {"BM": 32, "BN": 16, "BK": 8, "TX": 4, "TY": 8, "VW": 4, "PADA": 0, "PADB": 4}
CONFIGS = [
    ("direct", None),
    ("dot", {"DOT_WG": 8}),
    ("cpu", {"MB": 10, "NB": 16, "KC": 8, "RM": 5, "VN": 8}),  # ragged blocks, 3 k chunks
    # the GPUs' kernel (never chosen on a CPU device: on PoCL its index arithmetic is checked by one of the
    # CPU compilers only, see scripts/test_matrix.py; Oclgrind runs every case)
    pytest.param("tiled", TILED_SMALL, marks=pytest.mark.gpu_shaped),
    pytest.param("tiled", TILED_WIDE, marks=pytest.mark.gpu_shaped),
]


def _operand(queue, arr, transposed):
    if transposed:
        return Tensor.from_host(queue, np.ascontiguousarray(np.swapaxes(arr, -1, -2))).transpose(-1, -2)
    return Tensor.from_host(queue, arr)


@pytest.mark.parametrize("variant,params", CONFIGS)
@pytest.mark.parametrize("ta,tb", [(False, False), (True, True), (False, True)])
def test_gemm_kernels_in_bounds(queue, variant, params, ta, tb):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 19, 11)).astype(np.float32)
    b = rng.standard_normal((11, 17)).astype(np.float32)
    bias = rng.standard_normal(17).astype(np.float32)
    res = rng.standard_normal((19, 17)).astype(np.float32)
    got = gemm(_operand(queue, a, ta), _operand(queue, b, tb), Tensor.from_host(queue, bias), "silu",
               Tensor.from_host(queue, res), 0.5, variant=variant, params=params)
    y = 0.5 * np.matmul(a.astype(np.float64), b) + bias
    np.testing.assert_allclose(got.to_host(), y / (1 + np.exp(-y)) + res, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant,params", CONFIGS)
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_gemm_kernels_other_dtypes(device, queue, variant, params, dtype):
    if dtype == np.float64 and not device.capabilities.fp64:
        pytest.skip(f"{device.device_name} has no fp64")  # float64 is refused there (tested in ops)
    rng = np.random.default_rng(4)
    a = rng.standard_normal((9, 13)).astype(dtype)
    b = rng.standard_normal((13, 6)).astype(dtype)
    got = gemm(Tensor.from_host(queue, a), _operand(queue, b, True), variant=variant, params=params)
    tol = 2e-2 if dtype == np.float16 else 1e-12
    np.testing.assert_allclose(got.to_host().astype(np.float64), a.astype(np.float64) @ b.astype(np.float64),
                               rtol=tol, atol=tol)


@pytest.mark.gpu_shaped
@pytest.mark.parametrize(
    "params",
    [
        TILED_WIDE,
        {
            "BM": 32,
            "BN": 32,
            "BK": 8,
            "TX": 8,
            "TY": 8,
            "VW": 4,
            "PADA": 4,
            "PADB": 4,
            "WX": 4,
            "GM": 2,
        },  # remaps
    ],
)
@pytest.mark.parametrize("ta,tb", [(False, False), (True, True)])
def test_tiled_four_wide_fetch(queue, params, ta, tb):
    """Aligned operands: interior tiles use 4-wide global loads (GVEC), ragged M/N/K edges the guarded
    path."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((36, 24)).astype(np.float32)
    b = rng.standard_normal((24, 40)).astype(np.float32)
    got = gemm(_operand(queue, a, ta), _operand(queue, b, tb), variant="tiled", params=params)
    np.testing.assert_allclose(got.to_host(), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    split = gemm(_operand(queue, a, ta), _operand(queue, b, tb), variant="tiled", params=params, splits=2)
    np.testing.assert_allclose(split.to_host(), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu_shaped
def test_tiled_default_config(queue):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((70, 21)).astype(np.float32)
    b = rng.standard_normal((21, 66)).astype(np.float32)
    got = gemm(Tensor.from_host(queue, a), Tensor.from_host(queue, b), variant="tiled")
    np.testing.assert_allclose(got.to_host(), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu_shaped
def test_split_k_and_reduction(queue):
    rng = np.random.default_rng(6)
    a = rng.standard_normal((13, 24)).astype(np.float32)
    b = rng.standard_normal((24, 10)).astype(np.float32)
    bias = rng.standard_normal(10).astype(np.float32)
    got = gemm(Tensor.from_host(queue, a), _operand(queue, b, True), Tensor.from_host(queue, bias), "relu",
               variant="tiled", params=CONFIGS[2][1], splits=3)
    np.testing.assert_allclose(got.to_host(), np.maximum(a.astype(np.float64) @ b + bias, 0), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.gpu_shaped
@pytest.mark.parametrize("ta,tb", [(False, False), (True, True)])
def test_tiled_edge_free_kernel(queue, ta, tb):
    """Tile-divisible problems with INNER=1 compile without the guarded path (ALL_INNER): every load is
    a 4-wide interior one, direct and split-K."""
    rng = np.random.default_rng(8)
    params = {"BM": 32, "BN": 32, "BK": 8, "TX": 8, "TY": 8, "VW": 4, "PADA": 4, "PADB": 4, "WX": 4, "GM": 2,
              "INNER": 1}
    a = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal((32, 64)).astype(np.float32)
    for splits in (None, 2):
        got = gemm(
            _operand(queue, a, ta), _operand(queue, b, tb), variant="tiled", params=params, splits=splits
        )
        np.testing.assert_allclose(got.to_host(), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


MMA_SMALL = {"BM": 32, "BN": 32, "BK": 32, "WM": 16, "WN": 16, "EMULATE": 1}


@pytest.mark.gpu_shaped
@pytest.mark.parametrize("loader", [{"ASYNC": 0, "LDMATRIX": 0},
                                    {"ASYNC": 1, "STAGES": 3, "LDMATRIX": 1, "SWIZZLE": 1, "DBUF": 1}],
                         ids=["registers", "async+ldmatrix"])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False)])
def test_mma_gemm_in_bounds(queue, loader, ta, tb):
    """The matrix-unit GEMM (gemm_mma.cl) through its emulation: its tiles, loaders and fragments in bounds
    and aligned, edges in every dimension, the epilogue (its paired stores where C's rows are even)."""
    rng = np.random.default_rng(4)
    n = 18 if tb else 17
    a = rng.standard_normal((19, 40)).astype(np.float16)
    b = rng.standard_normal((40, n)).astype(np.float16)
    bias = rng.standard_normal(n).astype(np.float16)
    got = gemm(_operand(queue, a, ta), _operand(queue, b, tb), Tensor.from_host(queue, bias), "relu",
               variant="mma", params={**MMA_SMALL, **loader})
    want = np.maximum(a.astype(np.float64) @ b + bias, 0)
    np.testing.assert_allclose(got.to_host().astype(np.float64), want, rtol=0, atol=2e-3 * np.abs(want).max())


@pytest.mark.gpu_shaped
def test_mma_split_k_in_bounds(queue):
    """Split-K on the matrix-unit GEMM: each K slice's float32 partial sums (C_ACC) inside the workspace,
    slices read only their own K range (64 = 2 x 32, the cp.async ring), then the reduction's epilogue."""
    rng = np.random.default_rng(9)
    a = rng.standard_normal((19, 64)).astype(np.float16)
    b = rng.standard_normal((64, 18)).astype(np.float16)
    bias = rng.standard_normal(18).astype(np.float16)
    got = gemm(Tensor.from_host(queue, a), Tensor.from_host(queue, b), Tensor.from_host(queue, bias), "relu",
               variant="mma", params={**MMA_SMALL, "ASYNC": 1, "STAGES": 2, "LDMATRIX": 1}, splits=2)
    want = np.maximum(a.astype(np.float64) @ b + bias, 0)
    np.testing.assert_allclose(got.to_host().astype(np.float64), want, rtol=0, atol=2e-3 * np.abs(want).max())


@pytest.mark.gpu_shaped
@pytest.mark.parametrize("ta,tb", [(False, False), (True, True)],
                         ids=["a_kmajor-b_mnmajor", "a_mnmajor-b_kmajor"])
def test_wgmma_gemm_in_bounds(queue, ta, tb):
    """Hopper's warpgroup-MMA GEMM (gemm_wgmma.cl) through its emulation (EMULATE=2): the cp.async ring's
    swizzled stages, the descriptors' reads and the fragment store in bounds, edges in M and N (24 of a
    64 x 64 block), K over two 32-deep tiles, the fused epilogue."""
    rng = np.random.default_rng(11)
    a = rng.standard_normal((24, 64)).astype(np.float16)
    b = rng.standard_normal((64, 24)).astype(np.float16)
    bias = rng.standard_normal(24).astype(np.float16)
    params = {"BM": 64, "BN": 64, "BK": 32, "WGS": 1, "WSTAGES": 2, "GROUP_M": 0, "EMULATE": 2, "WGMMA": 1}
    got = gemm(_operand(queue, a, ta), _operand(queue, b, tb), Tensor.from_host(queue, bias), "relu",
               variant="mma", params=params)
    want = np.maximum(a.astype(np.float64) @ b + bias, 0)
    np.testing.assert_allclose(got.to_host().astype(np.float64), want, rtol=0, atol=2e-3 * np.abs(want).max())


@pytest.mark.gpu_shaped
def test_wgmma_split_slices_staged_in_bounds(queue):
    """The wgmma GEMM's split-K float32 slices through local memory (EPI_SMEM: 64 rows of BN + 4 floats, then
    16-byte pieces), two slices of one interior 64 x 64 block: the passes' barriers leave no race."""
    rng = np.random.default_rng(12)
    a = rng.standard_normal((64, 64)).astype(np.float16)
    b = rng.standard_normal((64, 64)).astype(np.float16)
    params = {"BM": 64, "BN": 64, "BK": 32, "WGS": 1, "WSTAGES": 3, "GROUP_M": 0, "EMULATE": 2, "WGMMA": 1,
              "EPI_SMEM": 1}
    got = gemm(_operand(queue, a, False), _operand(queue, b, False), variant="mma", params=params, splits=2)
    want = a.astype(np.float64) @ b
    np.testing.assert_allclose(got.to_host().astype(np.float64), want, rtol=0, atol=2e-3 * np.abs(want).max())


@pytest.mark.gpu_shaped
def test_wgmma_uneven_split_in_bounds(queue):
    """The wgmma GEMM's split-K where the slices do not divide K (SPLIT_KT): K = 80 in slices of 32, 32 and
    16, A stored K x M, the last slice's rows read up to K and no further; edges in M and N."""
    rng = np.random.default_rng(13)
    a = rng.standard_normal((24, 80)).astype(np.float16)
    b = rng.standard_normal((80, 24)).astype(np.float16)
    params = {"BM": 64, "BN": 64, "BK": 32, "WGS": 1, "WSTAGES": 2, "GROUP_M": 0, "EMULATE": 2, "WGMMA": 1}
    got = gemm(_operand(queue, a, True), _operand(queue, b, False), variant="mma", params=params, splits=3)
    want = a.astype(np.float64) @ b
    np.testing.assert_allclose(got.to_host().astype(np.float64), want, rtol=0, atol=2e-3 * np.abs(want).max())


# the decode GEMV (gemm_gemv.cl): the GPUs' layout (the local-memory tree here: Oclgrind is no NVIDIA
# device), ragged column groups and K blocks, A staged in local memory or read from global, and the CPUs' one
# item a row
GEMV_KNOBS = [
    {"GEMV_WG": 8, "GEMV_ROWS": 2, "GEMV_COLS": 2, "GEMV_UNROLL": 3, "GEMV_STAGE": 1},
    {"GEMV_WG": 4, "GEMV_ROWS": 3, "GEMV_COLS": 1, "GEMV_UNROLL": 2, "GEMV_STAGE": 0},
    {"GEMV_WG": 1, "GEMV_ROWS": 4, "GEMV_COLS": 3, "GEMV_UNROLL": 2, "GEMV_STAGE": 1},
]


@oclgrind_only
@pytest.mark.parametrize("params", GEMV_KNOBS, ids=["wg8c2s1", "wg4c1s0", "wg1c3s1"])
@pytest.mark.parametrize("m", [1, 3])
def test_gemv_in_bounds(queue, params, m):
    """bfloat16 with bias, silu and residual (x rows of a wider buffer); int8 weights plain and as SwiGLU; the
    RMSNorm prologue."""
    import ml_dtypes

    from netcl.ops import quantize_int8
    from tests.ops.test_gemm_gemv import launch_gemv

    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(5)
    n, k = 7, 56
    x = rng.standard_normal((m, k + 8)).astype(bf16)
    w = rng.standard_normal((2 * n, k)).astype(np.float32)
    bias, res = rng.standard_normal(2 * n).astype(bf16), rng.standard_normal((m, 2 * n)).astype(bf16)
    xs = Tensor.from_host(queue, x)[:, :k]
    wb = w.astype(bf16)
    got = gemm(xs, Tensor.from_host(queue, wb).transpose(0, 1), Tensor.from_host(queue, bias), "silu",
               Tensor.from_host(queue, res), variant="gemv", params=params)
    xd = x[:, :k].astype(np.float64)
    z = xd @ wb.astype(np.float64).T + bias.astype(np.float64)
    want = z / (1 + np.exp(-z)) + res.astype(np.float64)
    got = got.to_host().astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())
    q, scales = quantize_int8(w)
    qt, st = Tensor.from_host(queue, q).transpose(0, 1), Tensor.from_host(queue, scales)
    zq = xd @ ((q.astype(np.float64) - 128) * scales[:, None]).T
    glu = launch_gemv(xs, qt, params, scales=st, glu=True).to_host().astype(np.float64)
    want = zq[:, :n] / (1 + np.exp(-zq[:, :n])) * zq[:, n:]
    np.testing.assert_allclose(glu, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())
    plain = launch_gemv(xs, qt, params, scales=st).to_host().astype(np.float64)
    np.testing.assert_allclose(plain, zq, rtol=2e-2, atol=2e-2 * np.abs(zq).max())
    # the RMSNorm prologue (A staged whatever GEMV_STAGE says), plain and as SwiGLU of int8 weights
    norm_w = (1 + 0.2 * rng.standard_normal(k)).astype(bf16)
    rms = (Tensor.from_host(queue, norm_w), 1e-5)
    xn = xd / np.sqrt((xd * xd).mean(-1, keepdims=True) + 1e-5) * norm_w.astype(np.float64)
    normed = launch_gemv(xs, Tensor.from_host(queue, wb).transpose(0, 1), params, rms=rms)
    want = xn @ wb.astype(np.float64).T
    np.testing.assert_allclose(normed.to_host().astype(np.float64), want, rtol=2e-2,
                               atol=2e-2 * np.abs(want).max())
    zn = xn @ ((q.astype(np.float64) - 128) * scales[:, None]).T
    glu = launch_gemv(xs, qt, params, scales=st, glu=True, rms=rms).to_host().astype(np.float64)
    want = zn[:, :n] / (1 + np.exp(-zn[:, :n])) * zn[:, n:]
    np.testing.assert_allclose(glu, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())
