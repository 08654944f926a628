"""Philox random numbers: bit-exact against a NumPy reference, reproducible, well distributed."""

from __future__ import annotations

import numpy as np
import pytest

from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, ShapeError
from netcl.ops import random

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
MASK = 0xFFFFFFFF


def philox_reference(counters: np.ndarray, seed: int) -> np.ndarray:
    """Philox4x32-10 in NumPy uint64 arithmetic: words (n, 4) for 64-bit counters (n,)."""
    c = np.zeros((counters.size, 4), dtype=np.uint64)
    c[:, 0] = counters & MASK
    c[:, 1] = counters >> np.uint64(32)
    k0, k1 = np.uint64(seed & MASK), np.uint64(seed >> 32)
    for _ in range(10):
        p0 = np.uint64(M0) * c[:, 0]
        p1 = np.uint64(M1) * c[:, 2]
        hi0, lo0 = p0 >> np.uint64(32), p0 & np.uint64(MASK)
        hi1, lo1 = p1 >> np.uint64(32), p1 & np.uint64(MASK)
        c = np.stack([hi1 ^ c[:, 1] ^ k0, lo1, hi0 ^ c[:, 3] ^ k1, lo0], axis=1)
        k0 = (k0 + np.uint64(W0)) & np.uint64(MASK)
        k1 = (k1 + np.uint64(W1)) & np.uint64(MASK)
    return c


def test_known_answer_vector():
    # Random123's published known-answer test for philox4x32_10: counter 0, key 0.
    words = philox_reference(np.zeros(1, np.uint64), 0)[0]
    assert [hex(int(w)) for w in words] == ["0x6627e8d5", "0xe169c58d", "0xbc57ac4c", "0x9b00dbd8"]


def test_rand_float32_is_bit_exact(queue):
    n, seed = 1001, 0x1234_5678_9ABC
    got = random.rand(queue, (n,), seed=seed).to_host()
    words = philox_reference(np.arange((n + 3) // 4, dtype=np.uint64), seed).reshape(-1)[:n]
    want = ((words >> np.uint64(8)).astype(np.float64) * 2.0**-24).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_rand_float64_and_randint_are_bit_exact(queue):
    n, seed = 77, 99
    words = philox_reference(np.arange(40, dtype=np.uint64), seed)
    got64 = random.rand(queue, (n,), np.float64, seed=seed).to_host()
    a = (words[:, 0::2] >> np.uint64(5)).reshape(-1)[:n].astype(np.float64)
    b = (words[:, 1::2] >> np.uint64(6)).reshape(-1)[:n].astype(np.float64)
    np.testing.assert_array_equal(got64, (a * 67108864.0 + b) * 2.0**-53)
    got_int = random.randint(queue, -5, 12, (n,), seed=seed).to_host()
    want_int = -5 + ((words.reshape(-1)[:n] * np.uint64(17)) >> np.uint64(32)).astype(np.int64)
    np.testing.assert_array_equal(got_int, want_int)


def test_bfloat16_rand_and_randn_follow_the_float32_streams(queue):
    import ml_dtypes

    n, seed = 1001, 21
    words = philox_reference(np.arange((n + 3) // 4, dtype=np.uint64), seed).reshape(-1)[:n]
    got = random.rand(queue, (n,), ml_dtypes.bfloat16, low=-2.0, high=2.0, seed=seed).to_host()
    want = (-2.0 + 4.0 * (words >> np.uint64(24)).astype(np.float32) * np.float32(2.0**-8))
    np.testing.assert_array_equal(got, want.astype(ml_dtypes.bfloat16))
    assert got.astype(np.float32).max() < 2.0
    normal = random.randn(queue, (n,), ml_dtypes.bfloat16, std=0.5, seed=seed).to_host()
    wide = random.randn(queue, (n,), np.float32, std=0.5, seed=seed).to_host()
    np.testing.assert_array_equal(normal, wide.astype(ml_dtypes.bfloat16))


def test_randn_matches_box_muller_reference(queue):
    n, seed = 1000, 7
    got = random.randn(queue, (n,), np.float64, seed=seed).to_host()
    w = philox_reference(np.arange(n // 2, dtype=np.uint64), seed)
    u1 = (
        (w[:, 0] >> np.uint64(5)).astype(np.float64) * 67108864.0 + (w[:, 1] >> np.uint64(6)) + 1
    ) * 2.0**-53
    u2 = ((w[:, 2] >> np.uint64(5)).astype(np.float64) * 67108864.0 + (w[:, 3] >> np.uint64(6))) * 2.0**-53
    r = np.sqrt(-2 * np.log(u1))
    want = np.stack([r * np.cos(2 * np.pi * u2), r * np.sin(2 * np.pi * u2)], axis=1).reshape(-1)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_distribution_moments(queue):
    x = random.randn(queue, (200_000,), seed=3, mean=2.0, std=0.5).to_host().astype(np.float64)
    assert abs(x.mean() - 2.0) < 0.01 and abs(x.std() - 0.5) < 0.01
    u = random.rand(queue, (200_000,), np.float16, seed=3).to_host().astype(np.float64)
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    k = random.randint(queue, 0, 10, (100_000,), np.int64, seed=3).to_host()
    assert k.min() == 0 and k.max() == 9
    assert np.all(np.abs(np.bincount(k) / k.size - 0.1) < 0.01)


def test_generator_reproducible_and_advancing(queue):
    g1, g2 = random.Generator(5), random.Generator(5)
    a1 = Tensor.rand(queue, (10,), generator=g1).to_host()
    a2 = Tensor.rand(queue, (10,), generator=g1).to_host()
    b1 = Tensor.rand(queue, (10,), generator=g2).to_host()
    np.testing.assert_array_equal(a1, b1)
    assert not np.array_equal(a1, a2)
    state = g1.state_dict()
    c1 = Tensor.randn(queue, (6,), generator=g1).to_host()
    g1.load_state_dict(state)
    np.testing.assert_array_equal(Tensor.randn(queue, (6,), generator=g1).to_host(), c1)
    random.manual_seed(11)
    d1 = Tensor.rand(queue, (4,)).to_host()
    random.manual_seed(11)
    np.testing.assert_array_equal(Tensor.rand(queue, (4,)).to_host(), d1)


def test_random_errors(queue):
    with pytest.raises(DTypeError):
        random.rand(queue, (3,), np.int32)
    with pytest.raises(DTypeError):
        random.randint(queue, 0, 3, (3,), np.float32)
    with pytest.raises(ShapeError, match="low < high"):
        random.randint(queue, 3, 3, (3,))
    with pytest.raises(ValueError, match="not both"):
        random.rand(queue, (3,), seed=1, generator=random.Generator(1))
    # a seed where a Generator goes (a layer's, a model's generator=) raised AttributeError 'take'
    with pytest.raises(TypeError, match="generator must be a netcl.ops.random.Generator .* got int 3"):
        random.randn(queue, (3,), generator=3)
