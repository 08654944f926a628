"""The collectives' host transfers: the pinned bounce path GPUs take (forced here on the CPU device) moves
every element of strided, offset and odd-sized pieces, in both directions."""

from __future__ import annotations

import numpy as np

from netcl.core import hostcopy
from netcl.core.tensor import Tensor
from netcl.distributed import collectives


def test_bounced_copies_move_every_element(queue, rng, monkeypatch):
    monkeypatch.setattr(collectives, "_staged", lambda pairs: True)
    monkeypatch.setattr(hostcopy, "HOST_SLICE_BYTES", 4096 + 12)  # many slices, none page-aligned
    monkeypatch.setattr(hostcopy, "HOST_THREADS", 3)
    a = rng.standard_normal(10_007).astype(np.float32)
    b = rng.standard_normal((37, 29)).astype(np.float32)
    ta, tb = Tensor.from_host(queue, a), Tensor.from_host(queue, b)
    host_a, host_b = np.zeros(10_000, np.float32), np.zeros((29, 37), np.float32)
    collectives.copy_out([(ta[7:], host_a), (tb.T, host_b)])  # an offset piece and a transposed (strided) one
    np.testing.assert_array_equal(host_a, a[7:])
    np.testing.assert_array_equal(host_b, b.T)
    back_a, back_b = Tensor.zeros(queue, (10_007,), np.float32), Tensor.zeros(queue, (29, 37), np.float32)
    collectives.copy_in([(back_a[5:10_005], host_a), (back_b, host_b)])
    want = np.zeros(10_007, np.float32)
    want[5:10_005] = a[7:]
    np.testing.assert_array_equal(back_a.to_host(), want)
    np.testing.assert_array_equal(back_b.to_host(), b.T)
    collectives.copy_in([(back_b.T, np.ascontiguousarray(b))])  # into a strided view: through a temporary
    np.testing.assert_array_equal(back_b.to_host(), b.T)
