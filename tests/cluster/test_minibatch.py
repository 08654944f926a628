"""netcl.cluster.MiniBatchKMeans against scikit-learn on its digits: a seed draws the same batches, so the
steps, reassignments, early stops, labels and inertia are scikit-learn's; partial_fit too; streamed data
gives the bits of in-memory data; bad parameters raise clearly."""

from __future__ import annotations

import numpy as np
import pytest

from netcl.cluster import MiniBatchKMeans
from netcl.cluster.minibatch import batch_sampler

# scikit-learn is the reference of every case here (the GPU machines may lack it)
pytest.importorskip("sklearn")
from sklearn.cluster import MiniBatchKMeans as SKMiniBatchKMeans  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402


@pytest.fixture(scope="module")
def digits():
    return load_digits().data


def same_fit(ours, theirs, rtol=1e-12, atol=1e-9):
    np.testing.assert_array_equal(ours.labels_, theirs.labels_)
    assert ours.n_steps_ == theirs.n_steps_ and ours.n_iter_ == theirs.n_iter_
    assert ours.inertia_ == pytest.approx(theirs.inertia_, rel=rtol)
    np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, rtol=rtol, atol=atol)


def test_batches_are_drawn_as_random_state_choice_draws_them():
    w = np.random.RandomState(0).rand(500).astype(np.float32)
    cdf = batch_sampler(w, 500, np.float32)
    a, b = np.random.RandomState(7), np.random.RandomState(7)
    for _ in range(3):
        np.testing.assert_array_equal(cdf.searchsorted(a.random_sample(64), side="right"),
                                      b.choice(500, 64, p=w / w.sum(), replace=True))


@pytest.mark.parametrize("params", [
    dict(batch_size=256),
    dict(batch_size=100, init="random", n_init=3),
    dict(batch_size=300, tol=1e-3),
    dict(batch_size=64, reassignment_ratio=0.2, max_no_improvement=None, max_iter=3),
    dict(batch_size=200, compute_labels=False),
])
def test_fit_matches_sklearn(digits, params):
    ours = MiniBatchKMeans(10, random_state=0, **params).fit(digits)
    theirs = SKMiniBatchKMeans(10, random_state=0, **params).fit(digits)
    if params.get("compute_labels", True):
        same_fit(ours, theirs)
    else:
        assert not hasattr(ours, "labels_") and ours.n_steps_ == theirs.n_steps_
        assert ours.inertia_ == pytest.approx(theirs.inertia_, rel=1e-12)


def test_float32_weighted_fit_matches_sklearn(digits):
    X = digits.astype(np.float32)
    w = np.random.RandomState(1).rand(len(X)).astype(np.float32)
    ours = MiniBatchKMeans(8, random_state=2, batch_size=128).fit(X, sample_weight=w)
    theirs = SKMiniBatchKMeans(8, random_state=2, batch_size=128).fit(X, sample_weight=w)
    same_fit(ours, theirs, rtol=1e-5, atol=1e-3)


def test_partial_fit_matches_sklearn(digits):
    ours, theirs = MiniBatchKMeans(10, random_state=0), SKMiniBatchKMeans(10, random_state=0)
    for i in range(5):
        batch = digits[i * 300:(i + 1) * 300]
        ours.partial_fit(batch)
        theirs.partial_fit(batch)
    assert ours.n_steps_ == theirs.n_steps_ == 5
    np.testing.assert_array_equal(ours.labels_, theirs.labels_)
    np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, rtol=1e-12, atol=1e-9)
    np.testing.assert_array_equal(ours.predict(digits), theirs.predict(digits))


def test_streamed_gives_the_in_memory_bits(digits):
    X = digits.astype(np.float32)
    held = MiniBatchKMeans(6, random_state=3, batch_size=150).fit(X)
    streamed = MiniBatchKMeans(6, random_state=3, batch_size=150, chunk_rows=256).fit(X)
    np.testing.assert_array_equal(streamed.labels_, held.labels_)
    np.testing.assert_array_equal(streamed.cluster_centers_, held.cluster_centers_)
    assert streamed.inertia_ == held.inertia_ and streamed.n_steps_ == held.n_steps_


def test_bad_parameters_are_refused(digits):
    for params, error, words in [
        (dict(batch_size=0), ValueError, "batch_size"),
        (dict(reassignment_ratio=-0.1), ValueError, "reassignment"),
        (dict(max_no_improvement=-1), ValueError, "max_no_improvement"),
        (dict(init_size=1.5), TypeError, "init_size"),
    ]:
        with pytest.raises(error, match=words):
            MiniBatchKMeans(**{"n_clusters": 3, **params}).fit(digits)
    with pytest.warns(RuntimeWarning, match="init_size=2 should be larger than n_clusters=3"):
        MiniBatchKMeans(3, init_size=2, random_state=0, max_iter=1).fit(digits)
