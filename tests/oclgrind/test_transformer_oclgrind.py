"""Transformer kernels under Oclgrind: rope.cl (both pairings, per-batch offsets, strided input, the inverse
rotation, writing into a cache at the offset), kvcache.cl (cache writes at per-batch positions) and
sampling.cl (greedy, and temperature with top-k and top-p through the work-group reductions), on small
odd shapes."""

from __future__ import annotations

import numpy as np
import pytest

from netcl import ops
from netcl.core.tensor import Tensor
from tests.models import reference_gpt as ref
from tests.oclgrind.cases import close, dev, oclgrind_only, strided
from tests.ops.test_sampling import reference as sampled

pytestmark = oclgrind_only


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_rope(queue, pairing):
    rng = np.random.default_rng(21)
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    cos, sin = ops.rope_tables(queue, 13, 6)
    offsets = dev(queue, np.array([1, 8], np.int32))
    out = ops.rope(strided(queue, x), cos, sin, offsets, pairing)
    want = ref.rope(x.astype(np.float64), np.array([[1], [8]]) + np.arange(5), 10000.0, pairing)
    close(out, want, 1e-5, 1e-5)
    close(ops.rope(out, cos, sin, offsets, pairing, inverse=True), x, 1e-5, 1e-5)
    cache = Tensor.zeros(queue, (2, 3, 13, 6))
    ops.rope(dev(queue, x), cos, sin, offsets, pairing, out=cache, out_at_offset=True)
    close(cache[0, :, 1:6], want[0], 1e-5, 1e-5)


def test_cache_write(queue):
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    cache = Tensor.zeros(queue, (2, 3, 7, 5))
    ops.cache_write(cache, strided(queue, x), dev(queue, np.array([0, 3], np.int32)))
    got = cache.to_host()
    np.testing.assert_array_equal(got[0, :, :4], x[0])
    np.testing.assert_array_equal(got[1, :, 3:], x[1])


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, None, None), (0.8, 9, 0.7)])
def test_sample(queue, temperature, top_k, top_p):
    rng = np.random.default_rng(22)
    logits = (rng.standard_normal((3, 37)) * 2).astype(np.float32)
    u = rng.random((3, 37)).astype(np.float32)
    out = ops.sample(
        dev(queue, logits), temperature=temperature, top_k=top_k, top_p=top_p, uniforms=dev(queue, u)
    )
    np.testing.assert_array_equal(out.to_host(), sampled(logits, u, temperature, top_k, top_p))


@pytest.mark.parametrize("groups", [1, 3])
def test_sample_writes_the_next_input(queue, monkeypatch, groups):
    """The sampling launch's next input (embed=, advance=): the tokens' embedding rows copied (2-byte words:
    a row of 3 float16) and the positions advanced by the work-group that knows each token, a row over
    `groups` work-groups: every other work-group's stores are done before the copy reads the token."""
    from netcl.ops import sampling

    monkeypatch.setattr(sampling, "splits", lambda device, vocab, filtered: 1 if filtered else groups)
    rng = np.random.default_rng(23)
    logits = (rng.standard_normal((3, 37)) * 2).astype(np.float32)
    table = rng.standard_normal((40, 3)).astype(np.float16)
    rows, position = Tensor.zeros(queue, (3, 3), np.float16), dev(queue, np.array([2, 0, 5], np.int32))
    out = ops.sample(dev(queue, logits), temperature=0, embed=(dev(queue, table), rows),
                     advance=(position, 1))
    want = logits.argmax(1)
    np.testing.assert_array_equal(out.to_host(), want)
    np.testing.assert_array_equal(rows.to_host(), table[want])
    np.testing.assert_array_equal(position.to_host(), [3, 1, 6])
