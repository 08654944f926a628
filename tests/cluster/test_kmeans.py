"""netcl.cluster.KMeans against scikit-learn on real data (digits; Fashion-MNIST pixels where present): the
same initial centers give the same labels, iterations and inertia; k-means++ picks the same rows for a
seed; streamed data gives the bits of in-memory data; no n x k buffer; bad input raises clearly."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from netcl.cluster import (
    ConvergenceWarning,
    KMeans,
    MiniBatchKMeans,
    NonFiniteError,
    NotFittedError,
    kmeans_plusplus,
)
from netcl.core import dtypes
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, ShapeError
from netcl.ops import kmeans as km

# scikit-learn is the reference of every case here (the GPU machines may lack it)
pytest.importorskip("sklearn")
from sklearn.cluster import KMeans as SKKMeans  # noqa: E402
from sklearn.cluster import kmeans_plusplus as sk_kmeans_plusplus  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

TOL = {np.float32: dict(rtol=1e-5, atol=1e-3), np.float64: dict(rtol=1e-12, atol=1e-9)}


@pytest.fixture(scope="module")
def digits():
    return load_digits().data  # 1797 x 64, float64, values 0..16


def same_fit(ours, theirs, dt, labels=True):
    if labels:
        np.testing.assert_array_equal(ours.labels_, theirs.labels_)
    assert ours.n_iter_ == theirs.n_iter_
    assert ours.inertia_ == pytest.approx(theirs.inertia_, rel=TOL[dt]["rtol"])
    np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, **TOL[dt])


@pytest.mark.parametrize("dt", [np.float64, np.float32])
def test_same_initial_centers_give_sklearns_clustering(digits, dt):
    X = digits.astype(dt)
    init = X[np.random.RandomState(0).choice(len(X), 10, replace=False)]
    ours = KMeans(10, init=init, n_init=1).fit(X)
    theirs = SKKMeans(10, init=init, n_init=1).fit(X)
    same_fit(ours, theirs, dt)
    assert ours.labels_.dtype == np.int32 and ours.cluster_centers_.dtype == dt


@pytest.mark.gpu_shaped
@pytest.mark.parametrize("dt", [np.float64, np.float32])
def test_gpu_assignment_gives_sklearns_clustering(monkeypatch, digits, dt):
    """The GPU variant (the assignment on the tiled GEMM's block) on any device, at a small GPU-shaped tile
    with 4-wide fetches (64 features, BK | d) and 10 clusters in one center tile: the same fit as
    scikit-learn's, and the same bits in a second fit (determinism)."""
    tile = km.assign_tile
    monkeypatch.setattr(km, "assign_tile", lambda device, dtype, k, overrides: tile(
        device, dtype, k, {**dict(BM=16, BN=16, BK=8, TX=4, TY=4, VW=2, PADA=2, PADB=2, WX=0), **overrides}))
    X = digits.astype(dt)
    init = X[np.random.RandomState(0).choice(len(X), 10, replace=False)]
    ours = KMeans(10, init=init, n_init=1, variant="gpu").fit(X)
    theirs = SKKMeans(10, init=init, n_init=1).fit(X)
    same_fit(ours, theirs, dt)
    again = KMeans(10, init=init, n_init=1, variant="gpu").fit(X)
    np.testing.assert_array_equal(again.cluster_centers_, ours.cluster_centers_)
    assert again.inertia_ == ours.inertia_


@pytest.mark.parametrize("dt", [np.float64, np.float32])
def test_kmeans_plusplus_picks_sklearns_rows(digits, dt):
    X = digits.astype(dt)
    centers, indices = kmeans_plusplus(X, 12, random_state=3)
    sk_centers, sk_indices = sk_kmeans_plusplus(X, 12, random_state=3)
    np.testing.assert_array_equal(indices, sk_indices)
    np.testing.assert_array_equal(centers, X[indices])


def test_seeded_fits_match_sklearn(digits):
    """k-means++ and random init (n_init=3, the best run kept), with sample weights."""
    w = np.random.RandomState(1).rand(len(digits)) * 3
    for params in (dict(init="k-means++"), dict(init="random", n_init=3)):
        ours = KMeans(11, random_state=4, **params).fit(digits, sample_weight=w)
        theirs = SKKMeans(11, random_state=4, **params).fit(digits, sample_weight=w)
        same_fit(ours, theirs, np.float64)


def test_empty_clusters_move_to_the_farthest_points(digits):
    X = digits.astype(np.float32)
    init = np.vstack([X[:8], np.full((4, 64), 100.0, np.float32)])  # four centers far from every row
    ours = KMeans(12, init=init, n_init=1).fit(X)
    theirs = SKKMeans(12, init=init, n_init=1).fit(X)
    same_fit(ours, theirs, np.float32)
    assert len(np.unique(ours.labels_)) == 12


def test_streamed_and_tensor_input_give_the_in_memory_bits(queue, digits):
    X = digits.astype(np.float32)
    w = np.random.RandomState(2).rand(len(X)).astype(np.float32)
    held = KMeans(9, random_state=5).fit(X, sample_weight=w)
    streamed = KMeans(9, random_state=5, chunk_rows=300).fit(X, sample_weight=w)  # 512-row chunks, 4 of them
    tensor = KMeans(9, random_state=5).fit(Tensor.from_host(queue, X), sample_weight=w)
    # streamed chunks run the very kernels on the very rows: the same bits
    np.testing.assert_array_equal(streamed.labels_, held.labels_)
    np.testing.assert_array_equal(streamed.cluster_centers_, held.cluster_centers_)
    assert streamed.inertia_ == held.inertia_ and streamed.n_iter_ == held.n_iter_
    np.testing.assert_array_equal(streamed.predict(X), held.predict(X))
    # transform's GEMM may pick another kernel for a chunk than for the whole array (rounding differs)
    np.testing.assert_allclose(streamed.transform(X), held.transform(X), rtol=1e-5, atol=1e-4)
    # a Tensor is centred by the same sample mean (Data.mean) and runs the same kernels: the same bits
    np.testing.assert_array_equal(tensor.labels_, held.labels_)
    assert tensor.n_iter_ == held.n_iter_ and tensor.inertia_ == held.inertia_
    np.testing.assert_array_equal(tensor.cluster_centers_, held.cluster_centers_)


def test_a_tensor_of_another_dtype_and_a_tensor_init_are_taken_as_arrays_are(queue, digits):
    """A float64 Tensor given to a float32 model was a DTypeError ("cast it first") where a float64 array is
    converted; init= a Tensor was "expected a host array"."""
    X = digits.astype(np.float32)
    init = X[:6]
    model = KMeans(6, init=Tensor.from_host(queue, init), n_init=1).fit(X)
    from_array = KMeans(6, init=init, n_init=1).fit(X)
    np.testing.assert_array_equal(model.cluster_centers_, from_array.cluster_centers_)
    new = digits[::7]
    got = model.predict(Tensor.from_host(queue, new))
    np.testing.assert_array_equal(got.to_host() if isinstance(got, Tensor) else got, model.predict(new))


def test_predict_transform_score_match_sklearn(queue, digits):
    X = digits[:1200]
    new = digits[1200:] + np.random.RandomState(3).standard_normal((597, 64))
    init = X[:7]
    ours = KMeans(7, init=init, n_init=1).fit(X)
    theirs = SKKMeans(7, init=init, n_init=1).fit(X)
    np.testing.assert_array_equal(ours.predict(new), theirs.predict(new))
    np.testing.assert_allclose(ours.transform(new), theirs.transform(new), rtol=1e-10)
    assert ours.score(new) == pytest.approx(theirs.score(new), rel=1e-12)
    w = np.arange(597) % 4
    assert ours.score(new, sample_weight=w) == pytest.approx(theirs.score(new, sample_weight=w), rel=1e-12)
    np.testing.assert_array_equal(KMeans(7, init=init, n_init=1).fit_predict(X), theirs.labels_)
    np.testing.assert_allclose(
        KMeans(7, init=init, n_init=1).fit_transform(X), theirs.transform(X), rtol=1e-10
    )
    # Tensors in, Tensors out
    labels = ours.predict(Tensor.from_host(queue, new))
    assert isinstance(labels, Tensor) and labels.dtype == np.int32
    np.testing.assert_array_equal(labels.to_host(), theirs.predict(new))
    dist = ours.transform(Tensor.from_host(queue, new))
    assert isinstance(dist, Tensor) and dist.shape == (597, 7)
    # integer data is taken as float64, as scikit-learn does
    ints = KMeans(7, init=init, n_init=1).fit(digits[:1200].astype(np.int64))
    assert ints.cluster_centers_.dtype == np.float64
    np.testing.assert_array_equal(ints.labels_, theirs.labels_)


def test_fashion_mnist_pixels_match_sklearn():
    from netcl.data.datasets import DatasetUnavailable, load_fashion_mnist

    try:
        split = load_fashion_mnist(download=False)
    except DatasetUnavailable as exc:
        pytest.skip(f"Fashion-MNIST is not on this machine: {exc}")
    X = np.ascontiguousarray(split.x_train[:3000].reshape(3000, -1), dtype=np.float32)
    init = X[np.random.RandomState(0).choice(3000, 10, replace=False)]
    ours = KMeans(10, init=init, n_init=1, max_iter=30).fit(X)
    theirs = SKKMeans(10, init=init, n_init=1, max_iter=30).fit(X)
    same_fit(ours, theirs, np.float32)


def _peak_during(device, fn):
    gc.collect()
    pool = device.pool
    pool.reset_peak()
    before = pool.stats()["in_use"]
    fn()
    return pool.stats()["peak"] - before


def test_no_n_by_k_buffer(device):
    n, d, k = 20000, 32, 64
    X = np.random.RandomState(4).standard_normal((n, d)).astype(np.float32)
    n_by_k = n * k * 4
    model = KMeans(k, max_iter=3, random_state=0)
    fit_peak = _peak_during(device, lambda: model.fit(X))
    predict_peak = _peak_during(device, lambda: model.predict(X))
    assert fit_peak < X.nbytes + n_by_k / 8, (fit_peak, n_by_k)
    assert predict_peak < X.nbytes + n_by_k / 8, (predict_peak, n_by_k)
    # streamed: two chunks and the per-row labels, distances and k-means++ weights, not the data
    streamed_peak = _peak_during(
        device, lambda: KMeans(k, max_iter=3, random_state=0, chunk_rows=2048).fit(X)
    )
    assert streamed_peak < X.nbytes / 2, (streamed_peak, X.nbytes)


def test_bad_input_is_refused(queue, digits):
    X = digits[:100]
    bad = X.copy()
    bad[37, 5] = np.nan
    with pytest.raises(NonFiniteError, match="row 37"):
        KMeans(3).fit(bad)
    bad[37, 5] = np.inf
    with pytest.raises(NonFiniteError, match="row 37"):
        KMeans(3).fit(Tensor.from_host(queue, bad.astype(np.float32)))
    with pytest.raises(ValueError, match="n_samples=100 should be >= n_clusters=101"):
        KMeans(101).fit(X)
    with pytest.raises(ShapeError, match="2-D"):
        KMeans(3).fit(X[0])
    with pytest.raises(ShapeError, match="2-D"):
        KMeans(3).fit(X.reshape(10, 10, 64))
    with pytest.raises(ShapeError, match="empty"):
        KMeans(3).fit(np.zeros((0, 4)))
    with pytest.raises(DTypeError, match="real numbers"):
        KMeans(3).fit(X.astype(np.complex64))
    with pytest.raises(DTypeError, match="real numbers"):
        KMeans(3).fit(np.array([["a", "b"], ["c", "d"]]))
    with pytest.raises(DTypeError, match="float32, float64, float16 or bfloat16 Tensor"):
        KMeans(3).fit(Tensor.from_host(queue, X.astype(np.int32)))
    with pytest.raises(ShapeError, match=r"init of shape \(3, 5\)"):
        KMeans(3, init=np.zeros((3, 5))).fit(X)
    with pytest.raises(NonFiniteError, match="init holds NaN"):
        KMeans(2, init=np.full((2, 64), np.nan)).fit(X)
    for params, error, words in [
        (dict(n_clusters=0), ValueError, "n_clusters"), (dict(n_clusters=2.5), TypeError, "n_clusters"),
        (dict(max_iter=0), ValueError, "max_iter"), (dict(tol=-1.0), ValueError, "tol"),
        (dict(n_init=0), ValueError, "n_init"), (dict(init="farthest"), ValueError, "init"),
        (dict(algorithm="elkan"), ValueError, "lloyd"), (dict(chunk_rows=0), ValueError, "chunk_rows"),
        (dict(random_state="seed"), ValueError, "random_state"),
    ]:
        with pytest.raises(error, match=words):
            KMeans(**{"n_clusters": 3, **params}).fit(X)
    with pytest.raises(ValueError, match="non-negative"):
        KMeans(3).fit(X, sample_weight=-np.ones(100))
    with pytest.raises(ShapeError, match=r"sample_weight must have shape \(100,\)"):
        KMeans(3).fit(X, sample_weight=np.ones(99))
    with pytest.raises(NotFittedError, match="not fitted"):
        KMeans(3).predict(X)
    fitted = KMeans(3, random_state=0).fit(X)
    with pytest.raises(ShapeError, match="fitted with 64"):
        fitted.predict(X[:, :10])
    with pytest.warns(RuntimeWarning, match="performing only one init"):
        KMeans(3, init=X[:3], n_init=4).fit(X)


def test_duplicate_points_warn_and_params_round_trip():
    X = np.repeat(np.eye(3), 10, axis=0)  # three distinct points
    with pytest.warns(
        ConvergenceWarning, match=r"distinct clusters \(3\) found smaller than n_clusters \(4\)"
    ):
        KMeans(4, random_state=0).fit(X)
    model = KMeans(5, max_iter=7)
    assert model.get_params()["max_iter"] == 7 and "device" in model.get_params()
    assert model.set_params(n_clusters=3) is model and model.n_clusters == 3
    assert repr(model) == "KMeans(n_clusters=3, max_iter=7)"
    with pytest.raises(ValueError, match="invalid parameter 'clusters'"):
        model.set_params(clusters=2)


HALF = [np.float16, dtypes.bfloat16]


@pytest.mark.parametrize("dt", HALF)
def test_half_rows_fit_as_their_float32_values(queue, digits, dt):
    """digits' pixels (integers 0..16) are exact in float16 and bfloat16: off the matrix units half rows are
    computed in float32 on the same values, so the fit is the float32 fit's bits (labels, iterations, inertia,
    centers, which the tests above pin to scikit-learn's), from an array, a Tensor and in streamed chunks.
    (The matrix units multiply by centers rounded to the rows' format, so a row between two near centers may
    take the other: test_half_rows_end_at_the_nearest_centers holds both paths to that.)"""
    variant = "cpu" if queue.device.capabilities.kind == "cpu" else "gpu"   # the portable assignment
    init = digits[np.random.RandomState(0).choice(len(digits), 10, replace=False)]
    ref = KMeans(10, init=init, n_init=1).fit(digits.astype(np.float32))
    X = digits.astype(dt)
    for fit in (KMeans(10, init=init, n_init=1, variant=variant).fit(X),
                KMeans(10, init=init, n_init=1, variant=variant).fit(Tensor.from_host(queue, X)),
                KMeans(10, init=init, n_init=1, chunk_rows=512, variant=variant).fit(X)):
        assert fit.cluster_centers_.dtype == np.float32
        np.testing.assert_array_equal(fit.labels_, ref.labels_)
        assert fit.n_iter_ == ref.n_iter_ and fit.inertia_ == ref.inertia_
        np.testing.assert_array_equal(fit.cluster_centers_, ref.cluster_centers_)


@pytest.mark.parametrize("dt", HALF)
def test_half_rows_end_at_the_nearest_centers(queue, rng, dt):
    """Rows that half rounds (blobs with noise, odd n and d): the labels are the nearest of the fitted float32
    centers in float64 arithmetic on the half-rounded rows (either of two within float32 rounding), the
    centers are the means of their rows, the inertia their squared distances; k-means++ seeded on the
    device. MiniBatchKMeans takes the same rows."""
    n, d, k = 997, 11, 6
    blobs = rng.standard_normal((k, d)) * 4
    X = (blobs[rng.integers(0, k, n)] + rng.standard_normal((n, d))).astype(dt)
    x64 = X.astype(np.float64)
    fit = KMeans(k, n_init=1, random_state=0, tol=0).fit(X)
    c = fit.cluster_centers_.astype(np.float64)
    d2 = ((x64[:, None] - c[None]) ** 2).sum(-1)
    best = d2.min(1)
    chosen = d2[np.arange(n), fit.labels_]
    assert (chosen - best <= 1e-5 * (best + (x64 ** 2).sum(1) + 1)).all()
    assert fit.inertia_ == pytest.approx(best.sum(), rel=1e-5)
    means = np.stack([x64[fit.labels_ == j].mean(0) for j in range(k)])
    np.testing.assert_allclose(c, means, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(fit.predict(X), fit.labels_)
    np.testing.assert_allclose(fit.transform(X), np.sqrt(d2), rtol=1e-4, atol=1e-3)

    mini = MiniBatchKMeans(k, batch_size=128, n_init=1, random_state=0).fit(Tensor.from_host(queue, X))
    md2 = ((x64[:, None] - mini.cluster_centers_.astype(np.float64)[None]) ** 2).sum(-1)
    assert mini.cluster_centers_.dtype == np.float32
    assert mini.inertia_ == pytest.approx(md2.min(1).sum(), rel=1e-5)


@pytest.mark.gpu_shaped
@pytest.mark.parametrize("dt", HALF)
def test_mma_assignment_fits_half_rows(monkeypatch, rng, dt):
    """The matrix-unit variant (its emulation, at a small tile) through a whole fit of half rows: the centers
    are the means of their rows and the labels the nearest centers up to the half rounding of the centers
    the matrix units multiply by (ops/test_kmeans.py's check_mma_assignment), the inertia their distances."""
    tile = km.mma_tile
    monkeypatch.setattr(km, "mma_tile", lambda device, xdt, d, k, overrides: tile(
        device, xdt, d, k, {**dict(BM=32, BN=32, BK=32, WM=16, WN=16, EMULATE=1), **overrides}))
    n, d, k = 301, 16, 6
    blobs = rng.standard_normal((k, d)) * 4
    X = (blobs[rng.integers(0, k, n)] + rng.standard_normal((n, d))).astype(dt)
    fit = KMeans(k, n_init=1, random_state=0, variant="mma").fit(X)
    x64, c = X.astype(np.float64), fit.cluster_centers_.astype(np.float64)
    means = np.stack([x64[fit.labels_ == j].mean(0) for j in range(k)])
    np.testing.assert_allclose(c, means, rtol=1e-5, atol=1e-4)
    d2 = ((x64[:, None] - c[None]) ** 2).sum(-1)
    shift = x64.mean(0).astype(np.float32)  # the data's mean (of all rows, n <= 16384): the centring
    ch = (fit.cluster_centers_ - shift).astype(dt).astype(np.float64) + shift  # what the units multiply by
    d2h = ((x64[:, None] - ch[None]) ** 2).sum(-1)
    moved = np.abs(d2h - d2).max(1) + 1e-5 * (d2.min(1) + (x64 ** 2).sum(1) + 1)
    assert (d2[np.arange(n), fit.labels_] - d2.min(1) <= 2 * moved).all()
    assert fit.inertia_ == pytest.approx(d2[np.arange(n), fit.labels_].sum(), rel=1e-5)
    np.testing.assert_array_equal(fit.predict(X), fit.labels_)


def test_scikit_learns_pipeline_and_clone_take_it(digits):
    """scikit-learn 1.6+ reads __sklearn_tags__ in Pipeline and clone: AttributeError before."""
    from sklearn.base import clone
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    ours = make_pipeline(StandardScaler(), KMeans(10, random_state=0, n_init=1)).fit(digits)
    theirs = make_pipeline(StandardScaler(), SKKMeans(10, random_state=0, n_init=1)).fit(digits)
    assert ours[-1].inertia_ == pytest.approx(theirs[-1].inertia_, rel=1e-12)
    np.testing.assert_array_equal(ours.predict(digits[:50]), ours[-1].labels_[:50])
    assert clone(KMeans(4, n_init=2)).get_params() == KMeans(4, n_init=2).get_params()
