"""netcl.ops.rope (rotary embeddings, both pairings, device offsets), its autograd rule, and
netcl.ops.cache_write (KV-cache writes at a device position), against float64 NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import ops
from netcl.core import dtypes
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, OutOfMemoryError, ShapeError
from tests.autograd.gradcheck import check_grads
from tests.models import reference_gpt as ref

TOL = {np.float16: 2e-3, dtypes.bfloat16: 2e-2, np.float32: 2e-6, np.float64: 1e-12}


def heads_view(queue, arr):
    """arr (B, H, S, D) as the permuted view of a (B, S, H, D) buffer (how attention sees projections)."""
    return Tensor.from_host(queue, np.ascontiguousarray(arr.transpose(0, 2, 1, 3))).permute(0, 2, 1, 3)


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, dtypes.bfloat16])
def test_rope_matches_numpy_at_offsets(queue, rng, pairing, dtype):
    b, h, s, d = 3, 2, 5, 12
    x = rng.standard_normal((b, h, s, d)).astype(dtype)
    cos, sin = ops.rope_tables(queue, 40, d, base=500.0, dtype=dtype)
    offsets = np.array([0, 7, 30], np.int32)
    got = ops.rope(heads_view(queue, x), cos, sin, Tensor.from_host(queue, offsets), pairing)
    want = ref.rope(x.astype(np.float64), offsets[:, None] + np.arange(s), 500.0, pairing)
    assert got.shape == (b, h, s, d) and got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got.to_host().astype(np.float64), want, atol=TOL[dtype] * 10, rtol=TOL[dtype])
    one = ops.rope(
        Tensor.from_host(queue, x), cos, sin, Tensor.from_host(queue, np.array([4], np.int32)), pairing
    )
    np.testing.assert_allclose(
        one.to_host().astype(np.float64),
        ref.rope(x.astype(np.float64), 4 + np.arange(s), 500.0, pairing),
        atol=TOL[dtype] * 10,
        rtol=TOL[dtype],
    )


def test_rope_pairings_differ_and_inverse_undoes(queue, rng):
    x = rng.standard_normal((1, 3, 4, 8))
    cos, sin = ops.rope_tables(queue, 16, 8, dtype=np.float64)
    xt = Tensor.from_host(queue, x)
    half = ops.rope(xt, cos, sin, pairing="half").to_host()
    inter = ops.rope(xt, cos, sin, pairing="interleaved").to_host()
    assert not np.allclose(half, inter)
    back = ops.rope(Tensor.from_host(queue, half), cos, sin, pairing="half", inverse=True)
    np.testing.assert_allclose(back.to_host(), x, atol=1e-12)
    # position 0 is the identity rotation
    np.testing.assert_allclose(half[:, :, 0], x[:, :, 0], atol=1e-15)


def test_rope_tables_follow_the_formula(queue):
    cos, sin = ops.rope_tables(queue, 9, 6, base=100.0, dtype=np.float64)
    ang = np.arange(9)[:, None] * 100.0 ** (-np.arange(0, 6, 2) / 6)
    np.testing.assert_allclose(cos.to_host(), np.cos(ang), atol=1e-15)
    np.testing.assert_allclose(sin.to_host(), np.sin(ang), atol=1e-15)
    assert ops.rope_tables(queue, 9, 6, base=100.0, dtype=np.float64)[0] is cos  # made once


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_rope_gradient(queue, pairing):
    cos, sin = ops.rope_tables(queue, 16, 4, dtype=np.float64)
    off = Tensor.from_host(queue, np.array([2, 5], np.int32))
    x = np.random.default_rng(3).standard_normal((2, 3, 2, 4))
    check_grads(queue, lambda n: ag.rope(ag.permute(n, (0, 2, 1, 3)), cos, sin, off, pairing), [x])


def test_rope_gradient_keeps_the_input_layout(queue, rng):
    """The backward writes the gradient in x's memory order, so the permute of a projection stays a view."""
    cos, sin = ops.rope_tables(queue, 8, 4)
    with ag.Tape() as tape:
        base = ag.tensor(Tensor.from_host(queue, rng.standard_normal((2, 3, 5, 4)).astype(np.float32)),
                         requires_grad=True)  # (B, S, H, D)
        out = ag.rope(ag.permute(base, (0, 2, 1, 3)), cos, sin)
    tape.backward(out, Tensor.ones(queue, out.shape))
    assert base.grad.shape == (2, 3, 5, 4) and base.grad.is_contiguous()


def test_rope_writes_into_a_cache_at_the_offset(queue, rng):
    x = rng.standard_normal((2, 2, 3, 8)).astype(np.float32)
    cos, sin = ops.rope_tables(queue, 32, 8)
    cache = Tensor.zeros(queue, (2, 2, 10, 8))
    offsets = np.array([1, 6], np.int32)
    ops.rope(heads_view(queue, x), cos, sin, Tensor.from_host(queue, offsets), out=cache, out_at_offset=True)
    got = cache.to_host()
    for b, o in enumerate(offsets):
        want = ref.rope(x[b:b + 1].astype(np.float64), o + np.arange(3))[0]
        np.testing.assert_allclose(got[b, :, o:o + 3], want, atol=1e-6)
        assert not np.delete(got[b], np.arange(o, o + 3), axis=1).any()


def test_rope_position_beyond_the_table_raises(queue):
    cos, sin = ops.rope_tables(queue, 6, 4)
    out = ops.rope(
        Tensor.zeros(queue, (1, 1, 4, 4)), cos, sin, Tensor.from_host(queue, np.array([3], np.int32))
    )
    with pytest.raises(ShapeError, match=r"position 6 .* outside \[0, 6\)"):
        out.to_host()


def test_rope_bad_input(queue):
    cos, sin = ops.rope_tables(queue, 8, 4)
    x = Tensor.zeros(queue, (1, 2, 3, 4))
    with pytest.raises(ValueError, match="pairing"):
        ops.rope(x, cos, sin, pairing="neox")
    with pytest.raises(ShapeError, match="4-D"):
        ops.rope(Tensor.zeros(queue, (2, 3, 4)), cos, sin)
    with pytest.raises(ShapeError, match="even"):
        ops.rope(Tensor.zeros(queue, (1, 1, 2, 5)), *ops.rope_tables(queue, 8, 6))
    with pytest.raises(ShapeError, match=r"cos must be a float32 table \(max_len, 2\)"):
        ops.rope(x, *ops.rope_tables(queue, 8, 6))
    with pytest.raises(DTypeError, match="int32 device Tensor"):
        ops.rope(x, cos, sin, 3)
    with pytest.raises(ShapeError, match=r"offset must be an int32 Tensor of shape \(1,\) or \(1,\)"):
        ops.rope(x, cos, sin, Tensor.zeros(queue, (1,), np.int64))
    with pytest.raises(DTypeError, match="floating point"):
        ops.rope(Tensor.zeros(queue, (1, 1, 2, 4), np.int32), cos, sin)
    with pytest.raises(ValueError, match="even"):
        ops.rope_tables(queue, 8, 3)
    with pytest.raises(ValueError, match="base"):
        ops.rope_tables(queue, 8, 4, base=1.0)


def test_cache_write(queue, rng):
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    cache = Tensor.zeros(queue, (2, 3, 9, 5))
    ops.cache_write(cache, heads_view(queue, x), Tensor.from_host(queue, np.array([0, 5], np.int32)))
    got = cache.to_host()
    np.testing.assert_array_equal(got[0, :, :4], x[0])
    np.testing.assert_array_equal(got[1, :, 5:9], x[1])
    assert not got[0, :, 4:].any() and not got[1, :, :5].any()
    f16 = Tensor.zeros(queue, (1, 1, 4, 2), np.float16)
    ops.cache_write(f16, Tensor.from_host(queue, np.ones((1, 1, 1, 2), np.float16)),
                    Tensor.from_host(queue, np.array([2], np.int32)))
    np.testing.assert_array_equal(f16.to_host()[0, 0, :, 0], [0, 0, 1, 0])


def test_cache_write_errors(queue):
    cache = Tensor.zeros(queue, (1, 2, 4, 3))
    with pytest.raises(ShapeError, match="does not fit a cache"):
        ops.cache_write(cache, Tensor.zeros(queue, (1, 3, 1, 3)))
    with pytest.raises(DTypeError, match="holds float32"):
        ops.cache_write(cache, Tensor.zeros(queue, (1, 2, 1, 3), np.float64))
    ops.cache_write(
        cache, Tensor.zeros(queue, (1, 2, 2, 3)), Tensor.from_host(queue, np.array([3], np.int32))
    )
    with pytest.raises(ShapeError, match=r"position 4 .* capacity"):
        cache.to_host()


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rope_qkv_cache_equals_the_three_ops(queue, rng, pairing, dtype):
    """One launch: q rotated out, k rotated into its cache, v copied into its cache, per-row offsets, from
    the heads of one stacked projection (B, S, Hq + 2 Hkv, D) read transposed in place."""
    b, s, hq, hkv, d, cap = 3, 2, 4, 2, 8, 9
    dt = np.dtype(dtype)
    cos, sin = ops.rope_tables(queue, 16, d, 100.0, dt)
    stacked = Tensor.from_host(queue, rng.standard_normal((b, s, hq + 2 * hkv, d)).astype(dt))
    heads = stacked.permute(0, 2, 1, 3)
    offset = Tensor.from_host(queue, np.array([0, 3, 7], np.int32))
    k1, v1, k2, v2 = (Tensor.zeros(queue, (b, hkv, cap, d), dt) for _ in range(4))
    q1 = ops.rope_qkv_cache(heads, hq, cos, sin, k1, v1, offset, pairing)
    q2 = ops.rope(heads[:, :hq], cos, sin, offset, pairing)
    ops.rope(heads[:, hq:hq + hkv], cos, sin, offset, pairing, out=k2, out_at_offset=True)
    ops.cache_write(v2, heads[:, hq + hkv:], offset)
    for got, want in ((q1, q2), (k1, k2), (v1, v2)):
        np.testing.assert_array_equal(got.to_host(), want.to_host())
    assert np.abs(k1.to_host().astype(np.float32)).sum() > 0  # the cache rows were written
    with pytest.raises(ShapeError, match="not q_heads=3 plus two equal groups"):
        ops.rope_qkv_cache(heads, 3, cos, sin, k1, v1, offset, pairing)
    with pytest.raises(ShapeError, match=r"k_cache must be"):
        ops.rope_qkv_cache(heads, hq, cos, sin, Tensor.zeros(queue, (b, 1, cap, d), dt), v1, offset, pairing)


def test_tables_past_the_hosts_memory_are_one_clear_error(queue):
    """GPT(q, GPTConfig(max_seq_len=10**12)) built the tables in numpy and died in its _ArrayMemoryError."""
    with pytest.raises(OutOfMemoryError, match=r"rotary tables of 1,000,000,000,000 positions x 4 pairs take "
                                               r"87\.3 TiB of host memory.*max_seq_len"):
        ops.rope_tables(queue, 10**12, 8)
    assert ops.rope_tables_host_bytes(10**12, 8) == 4 * 10**12 * 24
