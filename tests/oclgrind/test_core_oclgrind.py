"""Core kernels under Oclgrind: copy.cl strided_copy (every element width, 1-4 dims, negative and zero
strides) and random.cl philox_fill (every dtype and kind, lengths that are not multiples of PER_ITEM)."""

from __future__ import annotations

import numpy as np
import pytest

from netcl.core.tensor import Tensor
from netcl.ops import random as nrandom
from tests.oclgrind.cases import oclgrind_only

pytestmark = oclgrind_only


@pytest.mark.parametrize("dtype", [np.uint8, np.float16, np.float32, np.float64])
def test_strided_copy_views(queue, dtype):
    host = (np.arange(3 * 5 * 7) % 23).astype(dtype).reshape(3, 5, 7)
    x = Tensor.from_host(queue, host)
    views = {
        "transpose": (x.transpose(0, 2), host.swapaxes(0, 2)),  # 3 dims after coalescing
        "slice": (x[1:, ::2, 1:6], host[1:, ::2, 1:6]),
        "flip": (x[:, ::-1, ::-3], host[:, ::-1, ::-3]),  # negative strides
    }
    for name, (view, want) in views.items():
        got = view.contiguous()
        np.testing.assert_array_equal(got.to_host(), want, err_msg=name)


def test_strided_copy_broadcast_and_4d(queue):
    host = np.arange(2 * 3 * 2 * 5, dtype=np.float32).reshape(2, 3, 2, 5)
    x = Tensor.from_host(queue, host)
    np.testing.assert_array_equal(x.permute(3, 1, 0, 2).contiguous().to_host(), host.transpose(3, 1, 0, 2))
    row = Tensor.from_host(queue, np.arange(7, dtype=np.float32))
    np.testing.assert_array_equal(
        row.expand(3, 7).contiguous().to_host(), np.broadcast_to(np.arange(7), (3, 7))
    )
    dst = Tensor.zeros(queue, (5, 6), np.float32)
    dst[1:4, ::2].copy_(Tensor.from_host(queue, np.ones((3, 3), np.float32)))  # strided destination
    want = np.zeros((5, 6), np.float32)
    want[1:4, ::2] = 1
    np.testing.assert_array_equal(dst.to_host(), want)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 7, 13])
def test_philox_float(device, queue, dtype, n):
    if dtype == np.float64 and not device.capabilities.fp64:
        pytest.skip("no fp64")
    u = nrandom.rand(queue, (n,), dtype, low=-2.0, high=3.0, seed=5).to_host().astype(np.float64)
    assert u.shape == (n,) and np.all(u >= -2.0) and np.all(u <= 3.0)
    z = nrandom.randn(queue, (n,), dtype, mean=1.0, std=0.5, seed=6).to_host().astype(np.float64)
    assert np.all(np.isfinite(z)) and np.all(np.abs(z - 1.0) < 0.5 * 8)
    if n > 1:
        assert len(set(u.tolist())) > 1 and len(set(z.tolist())) > 1


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("shape", [(1,), (3, 3)])
def test_philox_integer(queue, dtype, shape):
    got = nrandom.randint(queue, -3, 4, shape, dtype, seed=7).to_host()
    assert got.dtype == dtype and got.shape == shape
    assert np.all(got >= -3) and np.all(got < 4)
    wide = nrandom.randint(queue, 0, 1 << 31, (5,), dtype, seed=8).to_host()
    assert np.all(wide >= 0) and len(set(wide.tolist())) > 1
