"""DistributedSampler (netcl.data) and the host-side pieces of netcl.distributed that need no second process:
the reduction, the chunk split, the group of one."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.distributed as dist
from netcl.data import DataLoader, DistributedSampler
from netcl.distributed.group import SingleGroup, check_op, chunk_bounds, reduce_into


@pytest.mark.parametrize("n,world,drop_last", [(23, 3, False), (23, 3, True), (2, 4, False), (0, 2, False)])
def test_ranks_split_each_epoch_like_pytorch(n, world, drop_last):
    parts = [DistributedSampler(n, world, r, shuffle=True, seed=4, drop_last=drop_last) for r in range(world)]
    order = np.random.default_rng([4, 0]).permutation(n)
    total = (n // world if drop_last else -(-n // world)) * world
    padded = np.resize(order, total) if total else order[:0]
    for r, s in enumerate(parts):
        assert len(s) == total // world
        assert s.indices().tolist() == padded[r::world].tolist()  # PyTorch's interleaved split
    if not drop_last and n:
        assert set(np.concatenate([s.indices() for s in parts]).tolist()) == set(range(n))
    assert parts[0].indices(1).tolist() != parts[0].indices(0).tolist() or n <= 2


def test_shares_give_each_rank_its_block_of_every_global_batch():
    shares = [2, 5, 3]
    parts = [DistributedSampler(31, 3, r, shuffle=False, shares=shares) for r in range(3)]
    assert [len(p) for p in parts] == [2 * 4, 5 * 4, 3 * 4]  # 4 groups of 10 (padded from 31 to 40)
    for step in range(4):
        joined = np.concatenate([p.indices()[step * s : (step + 1) * s] for p, s in zip(parts, shares)])
        assert joined.tolist() == [(step * 10 + k) % 31 for k in range(10)]


def test_the_loader_takes_the_sampler_and_its_epochs(queue):
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    sampler = DistributedSampler(len(x), 2, 1, shuffle=True, seed=1)
    loader = DataLoader((x,), 4, queue, sampler=sampler)
    assert len(loader) == 3  # 10 samples for this rank, batches of 4
    loader.set_epoch(2)
    got = np.concatenate([b.to_host() for (b,) in loader])[:, 0] / 2
    assert got.astype(int).tolist() == sampler.indices(2).tolist()
    with pytest.raises(ValueError, match="shuffle to the sampler"):
        DataLoader((x,), 4, queue, shuffle=True, sampler=sampler)
    with pytest.raises(TypeError, match="DistributedSampler"):
        DataLoader((x,), 4, queue, sampler=[1, 2])


def test_sampler_arguments_are_checked():
    with pytest.raises(ValueError, match="rank 2 is not below num_replicas 2"):
        DistributedSampler(10, 2, 2)
    with pytest.raises(ValueError, match="3 shares for 2 ranks"):
        DistributedSampler(10, 2, 0, shares=[1, 1, 1])
    with pytest.raises(TypeError, match="integer"):
        DistributedSampler(10, 2.0, 0)
    with pytest.raises(ValueError, match=">= 1"):
        DistributedSampler(10, 2, 0, shares=[1, 0])
    assert len(DistributedSampler(np.zeros(7), 1, 0)) == 7  # a dataset: its length


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_reduce_into_matches_numpy_with_the_output_among_the_operands(op, world, rng):
    xs = [rng.standard_normal(70_001).astype(np.float32) for _ in range(world)]
    want = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}[op](
        np.stack(xs).astype(np.float64), axis=0)
    for alias in range(world):  # the reducing rank's own buffer is one of the operands, at any position
        ops = [x.copy() for x in xs]
        reduce_into(ops[alias], ops, op, scale=1 / world if op == "mean" else None)
        np.testing.assert_allclose(ops[alias], want, rtol=1e-5, atol=1e-5 * world)
    weights = [0.5, 0.25, 0.125, 0.0625, 0.0625][:world]
    ops = [x.copy() for x in xs]
    reduce_into(ops[-1], ops, "sum", weights=weights)
    np.testing.assert_allclose(ops[-1], sum(w * x.astype(np.float64) for w, x in zip(weights, xs)), rtol=1e-5,
                               atol=1e-5)


def test_chunks_tile_the_data_on_cache_lines():
    for count, world, itemsize in [(1, 3, 4), (130, 3, 4), (1001, 4, 8), (7, 2, 2)]:
        bounds = chunk_bounds(count, world, itemsize)
        assert bounds[0][0] == 0 and bounds[-1][1] == count and len(bounds) == world
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        assert all(lo * itemsize % 64 == 0 for lo, hi in bounds if hi > lo)


def test_bad_ops_and_a_job_of_one():
    with pytest.raises(ValueError, match="expected one of sum, mean, max, min, prod"):
        check_op("avg", np.float32)
    with pytest.raises(TypeError, match="'mean' needs a floating-point dtype"):
        check_op("mean", np.int32)
    with pytest.raises(ValueError, match="weights go with op 'sum'"):
        check_op("max", np.float32, [1.0])
    g = SingleGroup()
    a = np.arange(5.0)
    g.all_reduce(a, "mean")
    assert a.tolist() == [0, 1, 2, 3, 4] and g.all_gather(a).shape == (1, 5)
    assert (dist.rank(), dist.world_size()) == (0, 1)  # before init(): a job of one
