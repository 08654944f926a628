"""k-means kernels (netcl/ops/kmeans.py) against float64 NumPy on odd shapes: the fused assignment, the
partial sums and both finalize steps, k-means++'s search / potential / pick / update, row gathers; chunked
launches equal to one launch bit for bit; bad input at the op boundary.

The "gpu" variant runs here on GPU devices; on the CPU device its assignment runs at small GPU-shaped tiles
(test_gpu_assign_tiles) and the rest is checked under Oclgrind (tests/oclgrind/test_kmeans_oclgrind.py), as
PoCL takes about a minute to compile the default tile's barrier loops."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import netcl.ops.kmeans as km
from netcl.core import dtypes
from netcl.core.device import manager
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, KernelBuildError, ShapeError

VARIANTS = ["cpu"] if manager.default("auto").kind == "cpu" else ["cpu", "gpu"]
HALF = [np.float16, dtypes.bfloat16]


@pytest.fixture(params=VARIANTS)
def variant(request):
    return request.param


def t(queue, a):
    return Tensor.from_host(queue, np.ascontiguousarray(a))


def sq_dists(x, c):
    x, c = x.astype(np.float64), c.astype(np.float64)
    return ((x[:, None, :] - c[None]) ** 2).sum(-1)


def check_assignment(labels, dist, x, c, dt):
    """Labels must be the nearest centers (the first on ties); in float32 a row whose two nearest centers
    are within rounding of each other may take either, but never a farther one."""
    d2 = sq_dists(x, c)
    best = d2.min(axis=1)
    chosen = d2[np.arange(len(x)), labels]
    if dt == np.float64:
        np.testing.assert_array_equal(labels, d2.argmin(axis=1))
    else:
        slack = 1e-5 * (best + (x.astype(np.float64) ** 2).sum(1) + 1)
        assert (chosen - best <= slack).all()
        clear = np.sort(d2, axis=1)[:, 1] - best > 10 * slack if c.shape[0] > 1 else np.ones(len(x), bool)
        np.testing.assert_array_equal(labels[clear], d2.argmin(axis=1)[clear])
    rtol = 1e-10 if dt == np.float64 else 1e-4  # half rows are computed in float32
    np.testing.assert_allclose(dist, chosen, rtol=rtol, atol=rtol * (1 + best.max()))


# The GPU assignment (the tiled GEMM's block with an arg-min epilogue) at GPU-shaped tiles small enough to
# build quickly on PoCL: its index arithmetic (ragged rows, features not a multiple of BK, fewer clusters
# than a tile, 4-wide and guarded fetches, warp-patch ids) does not depend on the device.
GPU_SMALL = dict(BM=16, BN=16, BK=4, TX=4, TY=4, VW=2, PADA=2, PADB=2, WX=0)
GPU_WARPS = dict(BM=16, BN=32, BK=8, TX=16, TY=4, VW=2, PADA=2, PADB=0, WX=8)
SHAPES = [(1, 1, 1), (37, 3, 5), (300, 13, 37), (129, 70, 130), (70, 2, 200)]


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("n,d,k", SHAPES)
def test_assign_is_the_nearest_center(queue, rng, variant, dt, n, d, k):
    x = (rng.standard_normal((n, d)) * 2 + 3).astype(dt)
    c = (rng.standard_normal((k, d)) * 2 + 3).astype(dt)
    mean = x.mean(axis=0)
    # x as a view inside a larger tensor, labels/dist of a larger data set starting at row0
    big = t(queue, np.vstack([np.zeros((5, d), dt), x, np.zeros((2, d), dt)]))
    row0, total = 4, n + 9
    plan = km.kmeans_plan(queue, dt, total, d, k, variant)
    cc = t(queue, c - mean)
    packed = km.kmeans_pack(plan, cc)
    labels = Tensor.full(queue, (total,), -1, np.int32)
    dist = Tensor.zeros(queue, (total,), dt)
    changed = Tensor.zeros(queue, (1,), np.int32)
    km.kmeans_assign(plan, big[5:5 + n], row0, t(queue, mean), packed, cc, labels, dist, changed)
    got, got_dist = labels.to_host(), dist.to_host()
    assert (got[:row0] == -1).all() and (got[row0 + n:] == -1).all()  # nothing outside the rows
    check_assignment(got[row0:row0 + n], got_dist[row0:row0 + n], x - mean, c - mean, dt)
    assert changed.item() == n
    # again from the labels just written: nothing changes
    changed.fill_(0)
    km.kmeans_assign(plan, big[5:5 + n], row0, t(queue, mean), packed, cc, labels, dist, changed)
    assert changed.item() == 0
    np.testing.assert_array_equal(labels.to_host(), got)


@pytest.mark.parametrize("tiles", [None, pytest.param(GPU_SMALL, marks=pytest.mark.gpu_shaped)])
def test_assign_breaks_ties_by_the_first_center(queue, variant, tiles):
    if tiles is not None:
        variant = "gpu"
    # each center twice: every row must take the first copy, whichever tile or lane holds it
    c = np.repeat(np.arange(20, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32), 2, axis=0)
    c = np.vstack([c[1::2], c[::2]])  # copies 20 rows apart: k = 40
    x = np.arange(20, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32) + 0.25
    plan = km.kmeans_plan(queue, np.float32, 20, 3, 40, variant, assign_tiles=tiles)
    cc = t(queue, c)
    labels, dist = Tensor.empty(queue, (20,), np.int32), Tensor.empty(queue, (20,), np.float32)
    km.kmeans_assign(
        plan, t(queue, x), 0, Tensor.zeros(queue, (3,)), km.kmeans_pack(plan, cc), cc, labels, dist
    )
    np.testing.assert_array_equal(labels.to_host(), np.arange(20))
    np.testing.assert_allclose(dist.to_host(), np.full(20, 3 * 0.0625), rtol=1e-6)


GPU_CASES = [  # (n, d, k, tiles, dtype, element offset of x): what each exercises
    (37, 5, 7, GPU_SMALL, np.float32, 0),     # d % 4: guarded fetches only; k below one tile
    (130, 8, 40, GPU_SMALL, np.float32, 0),   # 4-wide fetches, BK | d (no guarded path), 3 center tiles
    (130, 8, 40, GPU_SMALL, np.float32, 1),   # the same rows off 16 bytes: the guarded build
    (45, 12, 75, GPU_WARPS, np.float32, 0),   # 4-wide then a guarded last k tile; 32-lane patches
    (29, 6, 19, GPU_WARPS, np.float64, 0),
    (37, 5, 7, GPU_SMALL, np.float16, 0),     # half rows, guarded fetches: converted as they are staged
    (130, 8, 40, GPU_SMALL, dtypes.bfloat16, 0),  # bfloat16 rows, 4-wide fetches
    (300, 64, 1030, None, np.float32, 0),    # the device's default tile (the GEMM's), as d = 64 runs on GPUs
]


@pytest.mark.gpu_shaped
@pytest.mark.parametrize("n,d,k,tiles,dt,off", GPU_CASES)
def test_gpu_assign_tiles(queue, rng, n, d, k, tiles, dt, off):
    x = (rng.standard_normal((n, d)) * 2 + 3).astype(dt)
    cdt = km.compute_dtype(dt)  # centers, shift and distances: float32 for half rows
    c = (rng.standard_normal((k, d)) * 2 + 3).astype(cdt)
    c[k // 2] = c[k // 3]  # a repeated center: the first copy wins
    mean = x.astype(cdt).mean(axis=0)
    flat = t(queue, np.concatenate([np.zeros(off, dt), x.ravel()]))
    rows = flat[off:].reshape(n, d)
    plan = km.kmeans_plan(queue, dt, n + 3, d, k, "gpu", assign_tiles=tiles)
    tile = tiles or plan.defines
    assert plan.variant == "gpu" and plan.rows_per_group == tile["BM"] and plan.kpad % tile["BN"] == 0
    cc = t(queue, c - mean)
    labels = Tensor.full(queue, (n + 3,), -1, np.int32)
    dist = Tensor.zeros(queue, (n + 3,), cdt)
    changed = Tensor.zeros(queue, (1,), np.int32)
    km.kmeans_assign(plan, rows, 2, t(queue, mean), km.kmeans_pack(plan, cc), cc, labels, dist, changed)
    got, got_dist = labels.to_host(), dist.to_host()
    assert (got[:2] == -1).all() and got[-1] == -1  # nothing outside the rows
    check_assignment(got[2:2 + n], got_dist[2:2 + n], x.astype(np.float64) - mean, c - mean, dt)
    assert not (got == k // 2).any()
    assert changed.item() == n


def test_gpu_assign_tile_is_the_gemms(queue):
    plan = km.kmeans_plan(queue, np.float32, 1000, 64, 1024, "gpu")
    gemm = km.gemm_variants.tuned_params(queue.device, "tiled", np.float32)
    for name in ("BM", "BN", "BK", "TX", "TY", "VW"):
        assert plan.defines[name] == gemm[name]
    assert plan.kpad == 1024 and plan.defines["NKT"] == 64 // gemm["BK"]
    assert "ALL_INNER" in plan.defines  # 64 features: every k tile whole
    few = km.kmeans_plan(queue, np.float32, 1000, 64, 5, "gpu")
    assert few.kpad == few.defines["BN"] <= gemm["BN"]
    # 5 clusters: the center block halves while they fit and it stays a multiple of TX * VW
    assert km.assign_tile(queue.device, np.float32, 5, dict(TX=8, TY=8, VW=2, BM=64))["BN"] == 16
    odd = km.kmeans_plan(queue, np.float32, 1000, 63, 5, "gpu")
    assert "GVEC" not in odd.defines and odd.dpad % gemm["BK"] == 0


def _update(queue, plan, x, mean, labels, dist, weights, chunks):
    parts = km.kmeans_partials(plan)
    xt, lt, dt_ = t(queue, x), t(queue, labels), t(queue, dist)
    wt = None if weights is None else t(queue, weights)
    for start, stop in chunks:
        km.kmeans_update(plan, xt[start:stop], start, t(queue, mean), lt, dt_, wt, parts)
    return parts


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("n,d,k,weighted", [(1, 1, 1, False), (301, 13, 9, True), (1000, 70, 150, True)])
def test_update_and_finalize(queue, rng, monkeypatch, variant, dt, n, d, k, weighted):
    monkeypatch.setattr(km, "MIN_SEGMENT_ROWS", 64)  # several GPU update segments at these sizes
    x = rng.standard_normal((n, d)).astype(dt)
    labels = rng.integers(0, k, n).astype(np.int32)
    labels[: min(n, k - 1)] = np.arange(min(n, k - 1))
    if k > 2:
        labels[labels == k - 2] = 0  # cluster k - 2 stays empty
    dist = rng.random(n).astype(dt)
    w = (rng.random(n) * 2).astype(dt) if weighted else None
    mean = x.mean(axis=0)
    old = rng.standard_normal((k, d)).astype(dt)
    plan = km.kmeans_plan(queue, dt, n, d, k, variant)
    parts = _update(queue, plan, x, mean, labels, dist, w, [(0, n)])
    new, sums = Tensor.empty(queue, (k, d), dt), Tensor.empty(queue, (k, d), dt)
    stats = Tensor.empty(queue, (2 * k + 1,), dt)
    km.kmeans_finalize(plan, parts, t(queue, old), new, sums, stats)

    w64 = np.ones(n) if w is None else w.astype(np.float64)
    xc = x.astype(np.float64) - mean
    ref_sums = np.zeros((k, d))
    np.add.at(ref_sums, labels, xc * w64[:, None])
    ref_w = np.bincount(labels, weights=w64, minlength=k)
    ref_new = np.where(ref_w[:, None] > 0, ref_sums / np.maximum(ref_w, 1e-300)[:, None], old)
    st = stats.to_host()
    tol = dict(rtol=1e-4, atol=1e-4) if dt == np.float32 else dict(rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(sums.to_host(), ref_sums, **tol)
    np.testing.assert_allclose(new.to_host(), ref_new, **tol)
    np.testing.assert_allclose(st[:k], ref_w, **tol)
    np.testing.assert_allclose(st[k:2 * k], ((ref_new - old) ** 2).sum(1), **tol)
    np.testing.assert_allclose(st[2 * k], (w64 * dist).sum(), **tol)
    if k > 2:
        assert st[k - 2] == 0 and (new.to_host()[k - 2] == old[k - 2]).all()

    # the same rows in uneven chunks (as a stream delivers them) give the same bits
    cuts = sorted({0, n, *rng.integers(0, n, 3).tolist()})
    chunked = _update(queue, plan, x, mean, labels, dist, w, list(zip(cuts[:-1], cuts[1:])))
    for a, b in (
        (parts.sums, chunked.sums),
        (parts.weights, chunked.weights),
        (parts.inertia, chunked.inertia),
    ):
        np.testing.assert_array_equal(a.to_host(), b.to_host())


def test_minibatch_finalize(queue, rng, variant):
    n, d, k, dt = 200, 7, 11, np.float64
    x = rng.standard_normal((n, d))
    labels = rng.integers(0, k - 1, n).astype(np.int32)  # cluster k - 1 gets nothing from this batch
    plan = km.kmeans_plan(queue, dt, n, d, k, variant)
    parts = _update(queue, plan, x, np.zeros(d), labels, np.ones(n), None, [(0, n)])
    old = rng.standard_normal((k, d))
    counts_host = rng.integers(0, 5, k).astype(dt)
    counts = t(queue, counts_host)
    new, stats = Tensor.empty(queue, (k, d), dt), Tensor.empty(queue, (2 * k + 1,), dt)
    km.kmeans_minibatch_finalize(plan, parts, t(queue, old), new, counts, stats)
    b = np.bincount(labels, minlength=k).astype(dt)
    sums = np.zeros((k, d))
    np.add.at(sums, labels, x)
    total = counts_host + b
    ref = np.where(
        b[:, None] > 0, (old * counts_host[:, None] + sums) / np.where(total > 0, total, 1)[:, None], old
    )
    np.testing.assert_allclose(new.to_host(), ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(counts.to_host(), np.where(b > 0, total, counts_host))
    st = stats.to_host()
    np.testing.assert_allclose(st[:k], b)
    np.testing.assert_allclose(st[k:2 * k], ((ref - old) ** 2).sum(1), atol=1e-12)
    assert st[2 * k] == n


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_plusplus_steps(queue, rng, variant, dt):
    n, d, k = 700, 5, 9  # three blocks of 256 rows, the last one short
    x = rng.standard_normal((n, d)).astype(dt)
    w = (rng.random(n) + 0.5).astype(dt)
    plan = km.kmeans_plan(queue, dt, n, d, k, variant)
    xt, wt, zero = t(queue, x), t(queue, w), Tensor.zeros(queue, (d,), dt)
    nblk = -(-n // km.PP_BLOCK)
    closest = Tensor.full(queue, (n,), np.inf, dt)
    bsum = Tensor.empty(queue, (nblk,), dt)
    centers = t(queue, x[[3, 500] + list(range(k - 2))])
    km.kmeans_pp_update(plan, xt, 0, zero, wt, centers, 0, closest, bsum)
    km.kmeans_pp_update(plan, xt[:512], 0, zero, wt, centers, 1, closest, bsum)  # a chunk, then the rest
    km.kmeans_pp_update(plan, xt[512:], 512, zero, wt, centers, 1, closest, bsum)
    near = np.minimum(sq_dists(x, x[[3]])[:, 0], sq_dists(x, x[[500]])[:, 0])
    tol = dict(rtol=1e-5, atol=1e-5) if dt == np.float32 else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(closest.to_host(), near, **tol)
    np.testing.assert_allclose(bsum.to_host(), np.add.reduceat(w * near, np.arange(0, n, km.PP_BLOCK)), **tol)

    # search: np.searchsorted(cumsum(w * closest), u * total), the edges included
    trials = 6
    u = np.array([0.0, 1e-9, 0.3, 0.5, 0.999999, 1.0])
    ids = Tensor.empty(queue, (trials,), np.int32)
    km.kmeans_pp_search(plan, bsum, closest, wt, t(queue, u.astype(dt)), 0, trials, ids)
    cum = np.cumsum(w.astype(np.float64) * closest.to_host())
    want = np.minimum(np.searchsorted(cum, u * cum[-1]), n - 1)
    got = ids.to_host()
    if dt == np.float64:
        np.testing.assert_array_equal(got, want)
    else:  # float32 sums may move a target across a boundary by a row
        assert (np.abs(got - want) <= 1).all() and got[0] == want[0]

    # potentials of candidates, and the pick of the least
    cand_rows = np.array([10, 20, 600, 3, 699, 256])
    cand = t(queue, x[cand_rows])
    part = Tensor.empty(queue, (nblk, trials), dt)
    km.kmeans_pp_potential(plan, xt, 0, zero, wt, cand, closest, part)
    pots = (w[:, None] * np.minimum(near[:, None], sq_dists(x, x[cand_rows]))).sum(0)
    np.testing.assert_allclose(part.to_host().sum(0), pots, **tol)
    chosen = Tensor.zeros(queue, (k,), np.int32)
    km.kmeans_pp_pick(plan, part, t(queue, cand_rows.astype(np.int32)), cand, 4, centers, chosen)
    best = int(np.argmin(pots))
    assert chosen.to_host()[4] == cand_rows[best]
    np.testing.assert_array_equal(centers.to_host()[4], x[cand_rows[best]])


def test_copy_rows_and_label_distance(queue, rng):
    x = rng.standard_normal((50, 6)).astype(np.float32)
    shift = rng.standard_normal(6).astype(np.float32)
    idx = np.array([49, 0, 7, 7], np.int32)
    out = Tensor.zeros(queue, (4, 6))
    km.kmeans_copy_rows(t(queue, x), t(queue, idx), out, shift=t(queue, shift))
    np.testing.assert_array_equal(out.to_host(), x[idx] - shift)
    scattered = Tensor.zeros(queue, (10, 6))
    km.kmeans_copy_rows(
        t(queue, x), t(queue, idx[:3]), scattered, dst_idx=t(queue, np.array([9, 2, 5], np.int32))
    )
    want = np.zeros((10, 6), np.float32)
    want[[9, 2, 5]] = x[idx[:3]]
    np.testing.assert_array_equal(scattered.to_host(), want)

    plan = km.kmeans_plan(queue, np.float32, 50, 6, 4)
    centers = rng.standard_normal((4, 6)).astype(np.float32)
    labels = rng.integers(0, 4, 50).astype(np.int32)
    dist = Tensor.empty(queue, (50,), np.float32)
    km.kmeans_label_distance(plan, t(queue, x), 0, t(queue, shift), t(queue, centers), t(queue, labels), dist)
    np.testing.assert_allclose(dist.to_host(), ((x - shift - centers[labels]) ** 2).sum(1), rtol=1e-5)


def test_bad_input_is_refused(queue):
    with pytest.raises(DTypeError, match="float32, float64, float16 or bfloat16"):
        km.kmeans_plan(queue, np.int32, 10, 2, 3)
    with pytest.raises(ShapeError, match="at least one row"):
        km.kmeans_plan(queue, np.float32, 10, 0, 3)
    with pytest.raises(ValueError, match="variant"):
        km.kmeans_plan(queue, np.float32, 10, 2, 3, variant="fpga")
    with pytest.raises(ValueError, match="BM a multiple of TY\\*VW"):
        km.kmeans_plan(queue, np.float32, 10, 2, 3, variant="gpu", assign_tiles=dict(BM=24, TY=16, VW=4))
    with pytest.raises(ValueError, match="WX must divide TX"):
        km.kmeans_plan(queue, np.float32, 10, 2, 3, variant="gpu", assign_tiles=dict(WX=3))
    with pytest.raises(ValueError, match="unknown k-means assignment tile knob 'TM'"):
        km.kmeans_plan(queue, np.float32, 10, 2, 3, variant="gpu", assign_tiles=dict(TM=8))
    with pytest.raises(ValueError, match="more than the device's"):
        km.kmeans_plan(queue, np.float32, 10, 2, 3, variant="gpu", assign_tiles=dict(TX=128, TY=128))
    with pytest.raises(ValueError, match="bytes of local memory, more than the device's"):
        km.kmeans_plan(queue, np.float32, 10, 2, 3, variant="gpu",
                       assign_tiles=dict(BM=2048, BN=2048, BK=512, TX=16, TY=16, VW=4))
    with pytest.raises(ShapeError, match="rows of 1000000 features need"):
        km.kmeans_plan(queue, np.float32, 10, 10**6, 3, variant="cpu")
    with pytest.raises(ValueError, match="knobs of the 'gpu' and 'mma' variants"):
        km.kmeans_plan(queue, np.float32, 10, 2, 3, variant="cpu", assign_tiles=dict(TX=8))
    plan = km.kmeans_plan(queue, np.float32, 10, 2, 3)
    centers = Tensor.zeros(queue, (3, 2))
    packed = km.kmeans_pack(plan, centers)
    labels, dist = Tensor.empty(queue, (10,), np.int32), Tensor.empty(queue, (10,))
    shift = Tensor.zeros(queue, (2,))
    with pytest.raises(ShapeError, match=r"x must have shape \(10, 2\)"):
        km.kmeans_assign(plan, Tensor.zeros(queue, (10, 3)), 0, shift, packed, centers, labels, dist)
    with pytest.raises(ShapeError, match="do not lie in the plan's 10 rows"):
        km.kmeans_assign(plan, Tensor.zeros(queue, (10, 2)), 1, shift, packed, centers, labels, dist)
    with pytest.raises(DTypeError, match="labels must be int32"):
        km.kmeans_assign(plan, Tensor.zeros(queue, (10, 2)), 0, shift, packed, centers, dist, dist)
    with pytest.raises(DTypeError, match="x must be float32"):
        km.kmeans_assign(
            plan, Tensor.zeros(queue, (10, 2), np.float64), 0, shift, packed, centers, labels, dist
        )
    with pytest.raises(ShapeError, match="contiguous"):
        km.kmeans_pack(plan, Tensor.zeros(queue, (2, 3)).T)
    with pytest.raises(ShapeError, match="multiple of 256"):
        km.kmeans_pp_update(plan, Tensor.zeros(queue, (5, 2)), 3, shift, None, centers, 0, dist,
                            Tensor.empty(queue, (1,)))


@pytest.mark.parametrize("dt", HALF)
def test_half_rows_in_every_kernel(queue, rng, variant, dt):
    """float16 / bfloat16 rows read as stored, computed in float32 (centers, shift, distances, sums float32):
    each kernel that reads rows against float64 NumPy on the half-rounded rows."""
    n, d, k = 301, 13, 9  # rows past a k-means++ block, odd features, clusters below a tile
    x = (rng.standard_normal((n, d)) * 2 + 3).astype(dt)
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=0).astype(np.float32)
    c = (rng.standard_normal((k, d)) * 2).astype(np.float32)
    plan = km.kmeans_plan(queue, dt, n, d, k, variant)
    assert plan.dtype == np.float32 and plan.xdtype == dt
    xt, shift, cc = t(queue, x), t(queue, mean), t(queue, c)

    labels, dist = Tensor.full(queue, (n,), -1, np.int32), Tensor.empty(queue, (n,), np.float32)
    packed = km.kmeans_pack(plan, cc)
    km.kmeans_assign(plan, xt[:200], 0, shift, packed, cc, labels, dist)  # in two chunks
    km.kmeans_assign(plan, xt[200:], 200, shift, packed, cc, labels, dist)
    got = labels.to_host()
    check_assignment(got, dist.to_host(), x64 - mean, c, np.float32)

    # the update's sums of the half rows, centred, in float32
    parts = km.kmeans_partials(plan)
    km.kmeans_update(plan, xt, 0, shift, labels, dist, None, parts)
    new, sums = Tensor.empty(queue, (k, d)), Tensor.empty(queue, (k, d))
    stats = Tensor.empty(queue, (2 * k + 1,))
    km.kmeans_finalize(plan, parts, cc, new, sums, stats)
    ref_sums = np.zeros((k, d))
    np.add.at(ref_sums, got, x64 - mean)
    np.testing.assert_allclose(sums.to_host(), ref_sums, rtol=1e-5, atol=1e-3)
    inertia = sq_dists(x64 - mean, c)[np.arange(n), got].sum()
    np.testing.assert_allclose(stats.to_host()[2 * k], inertia, rtol=1e-5)

    # given labels: their distances; k-means++'s distances and potentials
    km.kmeans_label_distance(plan, xt, 0, shift, cc, labels, dist)
    np.testing.assert_allclose(dist.to_host(), sq_dists(x64 - mean, c)[np.arange(n), got], rtol=1e-5)
    nblk = -(-n // km.PP_BLOCK)
    closest, bsum = Tensor.full(queue, (n,), np.inf), Tensor.empty(queue, (nblk,))
    km.kmeans_pp_update(plan, xt, 0, shift, None, cc, 2, closest, bsum)
    near = sq_dists(x64 - mean, c[[2]])[:, 0]
    np.testing.assert_allclose(closest.to_host(), near, rtol=1e-5, atol=1e-5)
    part = Tensor.empty(queue, (nblk, 3))
    km.kmeans_pp_potential(plan, xt, 0, shift, None, cc[:3], closest, part)
    pots = np.minimum(near[:, None], sq_dists(x64 - mean, c[:3])).sum(0)
    np.testing.assert_allclose(part.to_host().sum(0), pots, rtol=1e-5)

    # row gathers: the half bits as they are, or centred in float32
    idx = t(queue, np.array([300, 0, 7, 7], np.int32))
    raw = Tensor.empty(queue, (4, d), dt)
    km.kmeans_copy_rows(xt, idx, raw)
    np.testing.assert_array_equal(raw.to_host().view(np.uint16), x[[300, 0, 7, 7]].view(np.uint16))
    centred = Tensor.empty(queue, (4, d))
    km.kmeans_copy_rows(xt, idx, centred, shift=shift)
    np.testing.assert_allclose(centred.to_host(), x64[[300, 0, 7, 7]] - mean, rtol=1e-6, atol=1e-6)
    with pytest.raises(DTypeError, match="minus a shift are float32"):
        km.kmeans_copy_rows(xt, idx, raw, shift=shift)
    with pytest.raises(DTypeError, match="x must be"):
        km.kmeans_assign(plan, t(queue, x.astype(np.float32)), 0, shift, packed, cc, labels, dist)


# The matrix-unit assignment (kmeans_mma.cl: gemm_mma.cl's block and k loop, the arg-min folded into the C
# fragments) through the emulation of mma.sync, at small tiles: 4 warps of 16 x 16 over 32 x 32 blocks.
MMA_SMALL = dict(BM=32, BN=32, BK=32, WM=16, WN=16, EMULATE=1)
RING = dict(ASYNC=1, STAGES=2, LDMATRIX=1)
MMA_CASES = [  # (n, d, k, dtype, element offset of x, loader): what each exercises
    (37, 13, 7, np.float16, 0, RING),         # d % 8: the register loader (ASYNC dropped); k below a tile
    (101, 72, 75, np.float16, 8, RING),       # the cp.async ring with ldmatrix: 3 k tiles, 3 center tiles
    (67, 45, 100, dtypes.bfloat16, 3, dict(ASYNC=0, LDMATRIX=0)),  # rows off 16 bytes, plain fragment loads
    (70, 24, 40, dtypes.bfloat16, 0, dict(ASYNC=1, STAGES=3, LDMATRIX=1)),  # a three-stage ring
]
UNIT_ROUNDOFF = {np.dtype(np.float16): 2.0 ** -11, np.dtype(dtypes.bfloat16): 2.0 ** -8}


def check_mma_assignment(labels, dist, x, mean, c, dt):
    """The matrix units multiply the rows by the centers rounded to the rows' format (c_h): labels must be the
    nearest of the c_h in float64 on the half rows (either of two within float32 rounding of the uncentred
    dot products), hence the nearest float32 center up to what the rounding moves each distance; dist is the
    exact float32 distance to the chosen center."""
    rows = np.arange(len(x))
    xc = x.astype(np.float64) - mean
    ch = c.astype(dt).astype(np.float64)
    assert np.abs(ch - c).max() <= UNIT_ROUNDOFF[np.dtype(dt)] * np.abs(c).max()
    d2h, d2 = sq_dists(xc, ch), sq_dists(xc, c)
    slack = 1e-5 * (d2h.min(1) + (x.astype(np.float64) ** 2).sum(1) + (ch ** 2).sum(1).max() + 1)
    assert (d2h[rows, labels] - d2h.min(1) <= slack).all()
    moved = np.abs(d2h - d2).max(1)
    assert (d2[rows, labels] - d2.min(1) <= 2 * moved + slack).all()
    clear = np.sort(d2h, axis=1)[:, 1] - d2h.min(1) > 10 * slack
    np.testing.assert_array_equal(labels[clear], d2h.argmin(1)[clear])
    np.testing.assert_allclose(dist, d2[rows, labels], rtol=1e-4, atol=1e-4 * (1 + d2.max()))


@pytest.mark.gpu_shaped
@pytest.mark.parametrize("n,d,k,dt,off,loader", MMA_CASES, ids=[
    f"{n}-{d}-{k}-{np.dtype(dt).name}-off{off}-" + "-".join(f"{a}{b}" for a, b in ld.items())
    for n, d, k, dt, off, ld in MMA_CASES])
def test_mma_assign_against_float64(queue, rng, n, d, k, dt, off, loader):
    """kmeans_mma.cl's assignment at small tiles: the real kernel where the device has matrix units for `dt`
    (the H200's device tests), its emulation elsewhere. (The emulation of the three-stage ring gave one wrong
    label of 70 under NVIDIA's compiler and none under PoCL or Oclgrind, which also found no race: as the
    wgmma emulation's WPIPE 1 case, bench/NOTES.md.)"""
    tiles = {**MMA_SMALL, **loader, "EMULATE": 0 if km.takes_mma(queue.device, dt) else 1}
    x = (rng.standard_normal((n, d)) * 2 + 3).astype(dt)
    c = (rng.standard_normal((k, d)) * 2).astype(np.float32)
    c[k // 2] = c[k // 3]  # a repeated center: the first copy wins
    mean = x.astype(np.float64).mean(axis=0).astype(np.float32)
    flat = t(queue, np.concatenate([np.zeros(off, dt), x.ravel()]))
    plan = km.kmeans_plan(queue, dt, n + 3, d, k, "mma", assign_tiles=tiles)
    assert plan.kpad % 32 == 0 and plan.dpad % 8 == 0 and plan.mma["NKT"] == -(-d // 32)
    cc, shift = t(queue, c), t(queue, mean)
    packed = km.kmeans_pack(plan, cc, shift=shift)
    ch = c.astype(dt).astype(np.float64)
    np.testing.assert_array_equal(packed.layout.to_host()[:k, :d].astype(np.float64), ch)
    np.testing.assert_allclose(packed.norms.to_host()[:k], (ch ** 2).sum(1) + 2 * ch @ mean, rtol=1e-5)
    assert np.isinf(packed.norms.to_host()[k:]).all()
    labels = Tensor.full(queue, (n + 3,), -1, np.int32)
    dist = Tensor.zeros(queue, (n + 3,), np.float32)
    changed = Tensor.zeros(queue, (1,), np.int32)
    km.kmeans_assign(plan, flat[off:].reshape(n, d), 2, shift, packed, cc, labels, dist, changed)
    got, got_dist = labels.to_host(), dist.to_host()
    assert (got[:2] == -1).all() and got[-1] == -1  # nothing outside the rows
    check_mma_assignment(got[2:2 + n], got_dist[2:2 + n], x, mean, c, dt)
    assert not (got == k // 2).any()
    assert changed.item() == n


def test_mma_variant_is_refused_where_it_cannot_run(queue):
    with pytest.raises(DTypeError, match="float16 or bfloat16 rows"):
        km.kmeans_plan(queue, np.float32, 10, 2, 3, "mma")
    if not km.takes_mma(queue.device, np.float16):
        with pytest.raises(ValueError, match="needs matrix units"):
            km.kmeans_plan(queue, np.float16, 10, 2, 3, "mma")
        assert km.kmeans_plan(queue, np.float16, 10, 2, 3).variant != "mma"
    with pytest.raises(ValueError, match="unknown k-means matrix-unit tile knob 'TX'"):
        km.kmeans_plan(queue, np.float16, 10, 2, 3, "mma", assign_tiles=dict(TX=8, EMULATE=1))
    with pytest.raises(ValueError, match="WM of 16"):
        km.kmeans_plan(queue, np.float16, 10, 2, 3, "mma", assign_tiles=dict(MMA_SMALL, WM=8))
    with pytest.raises(ValueError, match="16-byte chunks"):
        km.kmeans_plan(queue, np.float16, 10, 2, 3, "mma", assign_tiles=dict(MMA_SMALL, BK=16))
    plan = km.kmeans_plan(queue, np.float16, 10, 2, 3, "mma", assign_tiles=MMA_SMALL)
    with pytest.raises(ValueError, match="pass shift="):
        km.kmeans_pack(plan, Tensor.zeros(queue, (3, 2)))


def test_mma_build_failure_falls_back_to_the_tiled_assignment(queue, monkeypatch):
    """Where the matrix-unit kernel would be the default but the driver rejects it (here: its build made to
    fail, as PoCL given the real mma.sync PTX does and a driver without them would), the plan warns once and
    takes the tiled GPU assignment."""
    monkeypatch.setattr(km, "takes_mma", lambda device, xdtype: True)
    monkeypatch.setattr(km, "_mma_unbuildable", set())
    build = km.KMeansPlan.program

    def refuse_mma(self, filename, defines, **extra):
        if filename == "kmeans_mma.cl":
            raise KernelBuildError("kmeans_mma.cl: refused (test)")
        return build(self, filename, defines, **extra)
    monkeypatch.setattr(km.KMeansPlan, "program", refuse_mma)
    with pytest.warns(RuntimeWarning, match="kmeans_mma.cl does not build"):
        plan = km.kmeans_plan(queue, np.float16, 10, 8, 3)
    assert plan.variant == "gpu" and not plan.mma
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # remembered: no second build, no second warning
        assert km.kmeans_plan(queue, np.float16, 10, 8, 3).variant != "mma"
