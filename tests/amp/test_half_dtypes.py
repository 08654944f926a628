"""float16 and bfloat16 storage: host round trips, device conversions (rounding to nearest even, ties,
subnormals, overflow, inf, NaN) against NumPy float16 and ml_dtypes bfloat16, elementwise ops and
reductions against their float32 paths, promotion, and kernels that refuse bfloat16."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from netcl import kernels, ops
from netcl.core import dtypes
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
# the special values include float32 numbers beyond float16's range, which NumPy warns about converting
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint16)


def _special_floats() -> np.ndarray:
    """float32 values that exercise every rounding case of both half formats."""
    one = np.float32(1.0).view(np.uint32)
    vals = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        np.inf,
        -np.inf,
        np.nan,
        -np.nan,
        3.3895314e38,
        3.4028235e38,
        -3.4028235e38,  # bfloat16 max, float32 max (rounds to inf)
        65504.0,
        65519.0,
        65520.0,
        1e6,  # float16 max, last below the tie, the tie, far above
        6.1035156e-05,
        5.9604645e-08,
        2.9802322e-08,
        3e-08,  # float16 smallest normal, subnormal, tie to 0
        1.1754944e-38,
        9.1835e-41,
        1e-45,
        4e-41,
    ]  # float32/bfloat16 subnormals
    # bfloat16 ties: 1 + exactly half an ulp (even below -> down), 1 + 3 half ulps (odd below -> up), just
    # above
    for low in (0x8000, 0x18000, 0x8001, 0x7fff):
        vals.append(np.uint32(one + low).view(np.float32))
    # float16 ties around 1: half ulp = 2**-11
    vals += [1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-11 + 2.0**-20, 2049.0, 2051.0]
    rng = np.random.default_rng(3)
    vals += list(rng.standard_normal(40) * 10.0 ** rng.integers(-40, 38, 40))
    vals += list(np.uint32(rng.integers(0, 2**32, 64, dtype=np.uint64)).view(np.float32))  # any bit pattern
    return np.array(vals, dtype=np.float32)


def test_bfloat16_is_a_netcl_dtype():
    assert dtypes.normalize("bfloat16") == BF16
    assert dtypes.is_floating(BF16) and dtypes.is_half(BF16) and dtypes.is_half(F16)
    assert not dtypes.is_floating(np.int32) and not dtypes.is_half(np.float32)
    assert dtypes.from_token(dtypes.token(BF16)) == BF16


@pytest.mark.parametrize("dt", [F16, BF16], ids=["float16", "bfloat16"])
def test_host_round_trip_keeps_bits(queue, dt):
    a = _special_floats().astype(dt)
    back = Tensor.from_host(queue, a).to_host()
    assert back.dtype == dt
    assert np.array_equal(_bits(back), _bits(a))
    t = Tensor.from_host(queue, _special_floats(), dtype=dt)  # conversion on the host, by NumPy/ml_dtypes
    assert np.array_equal(_bits(t.to_host()), _bits(a))


@pytest.mark.parametrize("dt", [F16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_device_cast_rounds_like_numpy(queue, dt, layout):
    """float32 -> half on the device (vector stores for contiguous data, scalar ones for a strided view) is
    bit-identical to NumPy's float16 and ml_dtypes' bfloat16 (NaN compared as NaN: payloads may differ)."""
    x = _special_floats()
    src = Tensor.from_host(queue, np.repeat(x, 2) if layout == "strided" else x)
    if layout == "strided":
        src = src[::2]
    got = ops.cast(src, dt).to_host()
    want = x.astype(dt)
    nan = np.isnan(x)
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
    assert np.array_equal(_bits(got)[~nan], _bits(want)[~nan]), (
        x[~nan][_bits(got)[~nan] != _bits(want)[~nan]])
    # and back: half -> float32 is exact
    up = ops.cast(Tensor.from_host(queue, want), np.float32).to_host()
    assert np.array_equal(up[~nan], want.astype(np.float32)[~nan]) and np.isnan(up[nan]).all()


def test_bfloat16_float16_conversions_go_through_float32(queue):
    x = _special_floats()
    x = x[np.isfinite(x)]
    got = ops.cast(Tensor.from_host(queue, x.astype(BF16)), F16).to_host()
    assert np.array_equal(_bits(got), _bits(x.astype(BF16).astype(np.float32).astype(F16)))


UNARY = ["exp", "tanh", "sigmoid", "relu", "silu", "sqrt", "neg", "abs", "square", "gelu"]


@pytest.mark.parametrize("dt", [F16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", UNARY)
def test_unary_half_matches_float32_path(queue, rng, dt, name):
    """A half op = the float32 op on the half inputs, rounded once to the half format (float32 math)."""
    a = rng.uniform(0.1 if name == "sqrt" else -3, 3, size=(5, 41)).astype(dt)
    got = getattr(ops, name)(Tensor.from_host(queue, a))
    assert got.dtype == dt
    ref = getattr(ops, name)(Tensor.from_host(queue, a.astype(np.float32))).to_host().astype(dt)
    # float32 transcendental functions differ by an ulp or two between PoCL and NumPy; after rounding
    # to half the results agree but for rare double-rounding cases: at most one half ulp
    diff = np.abs(got.to_host().astype(np.float64) - ref.astype(np.float64))
    ulp = np.abs(ref.astype(np.float64)) * (2.0**-7 if dt == BF16 else 2.0**-10) + 1e-30
    assert (diff <= ulp).all()


@pytest.mark.parametrize("dt", [F16, BF16], ids=["float16", "bfloat16"])
def test_fused_chain_rounds_each_result(queue, rng, dt):
    """(a * b + 1) / c in one fused kernel rounds every intermediate to the half dtype, as op by op."""
    a, b, c = (rng.uniform(0.5, 2, size=(3, 29)).astype(dt) for _ in range(3))
    ta, tb, tc = (Tensor.from_host(queue, v) for v in (a, b, c))
    got = ((ta * tb + 1) / tc).to_host()
    f = np.float32
    want = (((a.astype(f) * b.astype(f)).astype(dt).astype(f) + 1).astype(dt).astype(f) / c.astype(f)).astype(
        dt
    )
    assert np.array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("dt", [F16, BF16], ids=["float16", "bfloat16"])
def test_reductions_accumulate_in_float32(queue, rng, dt):
    a = rng.standard_normal((6, 1000)).astype(dt)
    t = Tensor.from_host(queue, a)
    a64 = a.astype(np.float64)
    rel = 2.0**-8 if dt == BF16 else 2.0**-11  # one rounding of the float32 result to the half dtype
    s = t.sum(axis=1)
    assert s.dtype == dt
    assert np.allclose(
        s.to_host().astype(np.float64), a64.sum(1), rtol=rel, atol=rel * np.abs(a64).sum(1).max()
    )
    m = ops.mean(t, axis=1).to_host().astype(np.float64)
    assert np.allclose(m, a64.mean(1), rtol=rel, atol=1e-3)
    assert np.array_equal(ops.max(t, axis=1).to_host(), a.max(1))
    assert np.array_equal(ops.argmax(t, axis=1).to_host(), a.astype(np.float32).argmax(1))
    sm = ops.softmax(t, -1)
    assert sm.dtype == dt
    ref = np.exp(a64 - a64.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    assert np.allclose(sm.to_host().astype(np.float64), ref, rtol=2 * rel, atol=1e-6)
    assert (t.sum(dtype=np.float32)).dtype == np.float32  # accumulate and keep float32


def test_half_promotion_rules(queue):
    bf = Tensor.from_host(queue, np.ones(3, BF16))
    h = Tensor.from_host(queue, np.ones(3, F16))
    f = Tensor.from_host(queue, np.ones(3, np.float32))
    i = Tensor.from_host(queue, np.ones(3, np.int32))
    assert (bf + h).dtype == np.float32  # neither holds the other: float32, as in PyTorch
    assert (bf + f).dtype == np.float32
    assert (bf + i).dtype == BF16 and (bf * 2.5).dtype == BF16 and (bf + 1).dtype == BF16
    assert (bf > 0).dtype == np.bool_
    assert ops.exp(Tensor.from_host(queue, np.ones(3, np.int32))).dtype == np.float32
    np.testing.assert_array_equal((bf + h).to_host(), np.full(3, 2, np.float32))


def test_bfloat16_scalar_params_round_to_bfloat16(queue):
    x = Tensor.from_host(queue, np.ones(4, BF16))
    got = (x * 1.00390625).to_host()  # 1 + 2**-8: a tie in bfloat16, rounds to even (1.0)
    assert np.array_equal(_bits(got), _bits(np.ones(4, BF16)))


def test_kernel_files_without_bfloat16_refuse_it(device):
    with pytest.raises(DTypeError, match="bfloat16 is not supported by the kernels of kmeans.cl"):
        kernels.program(device, "kmeans.cl", dtype=BF16)
    assert kernels.program(device, "optim.cl", dtype=BF16, OPT="OPT_SGD") is not None


@pytest.mark.parametrize("dt", [F16, BF16], ids=["float16", "bfloat16"])
def test_gather_embedding_and_scatter_add_in_half(queue, rng, dt):
    """index.cl through LOAD_T/STORE_T: picks are bit copies; scatter_add adds in float32 and rounds once."""
    w = rng.standard_normal((7, 5)).astype(dt)
    ids = np.array([[0, 6, 3], [2, 2, 1]], np.int64)
    tw = Tensor.from_host(queue, w)
    assert np.array_equal(_bits(ops.embedding(tw, Tensor.from_host(queue, ids)).to_host()), _bits(w[ids]))
    idx = rng.integers(0, 7, (4, 5)).astype(np.int64)
    got = ops.gather(tw, 0, Tensor.from_host(queue, idx)).to_host()
    assert np.array_equal(_bits(got), _bits(np.take_along_axis(w, idx, 0)))
    src = rng.standard_normal((4, 5)).astype(dt)
    for deterministic in (False, True):
        out = ops.scatter_add(tw, 0, Tensor.from_host(queue, idx), Tensor.from_host(queue, src),
                              deterministic=deterministic).to_host()
        ref = w.astype(np.float64)
        np.add.at(ref, (idx, np.arange(5)[None, :].repeat(4, 0)), src.astype(np.float64))
        np.testing.assert_allclose(
            out.astype(np.float64), ref, rtol=4 * (2.0**-8 if dt == BF16 else 2.0**-11), atol=1e-2
        )
