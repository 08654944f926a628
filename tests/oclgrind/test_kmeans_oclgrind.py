"""k-means kernels under Oclgrind (kmeans.cl, kmeans_cpu.cl, kmeans_gpu.cl), both variants: whole fits on
small odd data through every kernel (pack, assign, update, finalize, k-means++'s update / search /
potential / pick, row gathers and scatters, the label distances of a strictly converged run, the mini-batch
finalize), with sample weights and streamed chunks, checked against scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import KMeans as SKKMeans
from sklearn.cluster import MiniBatchKMeans as SKMiniBatchKMeans
from sklearn.cluster import kmeans_plusplus

import netcl.ops.kmeans as km
from netcl.cluster import KMeans, MiniBatchKMeans
from tests.oclgrind.cases import close, dev, oclgrind_only

pytestmark = oclgrind_only


def blobs(n, d, k, seed):
    rng = np.random.RandomState(seed)
    centers = rng.standard_normal((k, d)) * 4
    return centers[rng.randint(0, k, n)] + rng.standard_normal((n, d))


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_kmeans_fit(variant, monkeypatch):
    """A whole weighted fit, streamed. k-means++'s kernels (kmeans.cl, the same for both variants) run in the
    GPU variant's fit; the CPU variant's starts from scikit-learn's k-means++ centres (under Oclgrind's race
    detection each launch costs ~0.4 s, and k-means++ is most of a fit's launches)."""
    monkeypatch.setattr(km, "MIN_SEGMENT_ROWS", 64)  # several GPU update segments
    X = blobs(300, 7, 5, 0)  # float64; 300 rows streamed as chunks of 256 and 44
    w = np.random.RandomState(1).rand(300) + 0.5
    init = "k-means++"
    if variant == "cpu":
        init, _ = kmeans_plusplus(X, 5, sample_weight=w, random_state=0)
    ours = KMeans(5, init=init, n_init=1, random_state=0, variant=variant, chunk_rows=256,
                  max_iter=6).fit(X, sample_weight=w)
    theirs = SKKMeans(5, init=init, n_init=1, random_state=0, max_iter=6).fit(X, sample_weight=w)
    np.testing.assert_array_equal(ours.labels_, theirs.labels_)
    assert ours.inertia_ == pytest.approx(theirs.inertia_, rel=1e-10)


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_kmeans_float32_with_an_empty_cluster(variant):
    X = blobs(131, 3, 4, 2).astype(np.float32)
    init = np.vstack([X[:3], np.full((1, 3), 50.0, np.float32)])  # the last center starts empty
    ours = KMeans(4, init=init, n_init=1, variant=variant, max_iter=4).fit(X)
    theirs = SKKMeans(4, init=init, n_init=1, max_iter=4).fit(X)
    np.testing.assert_array_equal(ours.labels_, theirs.labels_)
    close(ours.cluster_centers_, theirs.cluster_centers_, 1e-5, 1e-4)
    np.testing.assert_array_equal(ours.predict(X[::3]), theirs.predict(X[::3]))


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_minibatch_fit_with_reassignment(variant):
    X = blobs(120, 5, 6, 3).astype(np.float32)  # 3 batches; a reassignment after each 60 rows seen
    params = dict(batch_size=40, reassignment_ratio=0.5, max_iter=1, random_state=0)
    ours = MiniBatchKMeans(6, variant=variant, **params).fit(X)
    theirs = SKMiniBatchKMeans(6, **params).fit(X)
    np.testing.assert_array_equal(ours.labels_, theirs.labels_)
    close(ours.cluster_centers_, theirs.cluster_centers_, 1e-5, 1e-4)


def test_wide_rows_and_many_clusters(queue):
    """The CPU assignment's staging of rows wider than DMAX, and the GPU tiles' padded edges (k and d not
    multiples of the tiles), at the default tile and at small ones (the bench's sweep): 4-wide fetches with a
    guarded last k tile and 32-lane warp patches, and 4-wide fetches only (BK divides d) with fewer clusters
    than a tile; rows centred by a shift as they are staged."""
    rng = np.random.default_rng(4)
    warps = dict(BM=16, BN=32, BK=8, TX=16, TY=4, VW=2, PADA=2, PADB=0, WX=8)
    whole = dict(BM=16, BN=16, BK=4, TX=4, TY=4, VW=2, PADA=2, PADB=2, WX=0)
    for variant, n, d, k, tiles in (("cpu", 9, 300, 11, None), ("gpu", 130, 21, 70, None),
                                    ("gpu", 45, 20, 75, warps), ("gpu", 37, 16, 9, whole)):
        x = rng.standard_normal((n, d)).astype(np.float32)
        c = rng.standard_normal((k, d)).astype(np.float32)
        shift = rng.standard_normal(d).astype(np.float32)
        plan = km.kmeans_plan(queue, np.float32, n, d, k, variant, assign_tiles=tiles)
        cc = dev(queue, c)
        labels = dev(queue, np.full(n, -1, np.int32))
        dist = dev(queue, np.zeros(n, np.float32))
        km.kmeans_assign(
            plan,
            dev(queue, x),
            0,
            dev(queue, shift),
            km.kmeans_pack(plan, cc),
            cc,
            labels,
            dist,
        )
        d2 = ((x[:, None, :].astype(np.float64) - shift - c[None]) ** 2).sum(-1)
        np.testing.assert_array_equal(labels.to_host(), d2.argmin(1))
        close(dist, d2.min(1), 1e-4, 1e-3)


def test_half_rows_on_the_matrix_units_emulated(queue):
    """Half rows: the matrix-unit assignment through its emulation (kmeans_mma.cl: the cp.async ring with
    ldmatrix, and the register loader for rows off 16 bytes; the fold of the C fragments across lanes and
    warps through local memory), and the tiled assignment converting them as it stages them."""
    from netcl.core import dtypes

    rng = np.random.default_rng(5)
    small = dict(BM=32, BN=32, BK=32, WM=16, WN=16, EMULATE=1, ASYNC=1, STAGES=2, LDMATRIX=1)
    for variant, dt, n, d, k, tiles in (("mma", np.float16, 45, 24, 40, small),
                                        ("mma", dtypes.bfloat16, 37, 13, 7, small),
                                        ("gpu", np.float16, 37, 16, 9, dict(BM=16, BN=16, BK=4, TX=4, TY=4,
                                                                            VW=2, PADA=2, PADB=2, WX=0))):
        x = (rng.standard_normal((n, d)) + 2).astype(dt)
        c = rng.standard_normal((k, d)).astype(np.float32)
        shift = np.full(d, 2.0, np.float32)
        plan = km.kmeans_plan(queue, dt, n, d, k, variant, assign_tiles=tiles)
        cc, sh = dev(queue, c), dev(queue, shift)
        labels = dev(queue, np.full(n, -1, np.int32))
        dist = dev(queue, np.zeros(n, np.float32))
        km.kmeans_assign(plan, dev(queue, x), 0, sh, km.kmeans_pack(plan, cc, shift=sh), cc, labels, dist)
        ch = c.astype(dt).astype(np.float64) if variant == "mma" else c.astype(np.float64)
        d2 = ((x[:, None, :].astype(np.float64) - shift - ch[None]) ** 2).sum(-1)
        np.testing.assert_array_equal(labels.to_host(), d2.argmin(1))
        exact = ((x.astype(np.float64) - shift - c[labels.to_host()]) ** 2).sum(-1)
        close(dist, exact, 1e-4, 1e-3)
