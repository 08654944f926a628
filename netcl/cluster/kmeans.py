"""KMeans: Lloyd's k-means with scikit-learn's interface and rules (sklearn/cluster/_kmeans.py): the data
centred on its mean, k-means++ / random / given initialisation, n_init runs keeping the lowest inertia,
the stop on unchanged labels or on a squared center shift within tol x the data's mean variance, empty
clusters moved to the points farthest from their centers, and a last assignment when the run stopped on
tol or max_iter. Each iteration is two kernels over the data (the fused assignment, the partial sums)
and one over the clusters, then a read of 2k + 2 numbers; the n x k distance matrix is never made."""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

import netcl.ops as ops
from netcl.cluster.data import Data, as_data, check_random_state, check_weights, resolve_queue
from netcl.cluster.seeding import given_centers, plusplus, random_rows
from netcl.core.tensor import Tensor
from netcl.ops.kmeans import (
    KMeansPlan,
    PackedCenters,
    Partials,
    kmeans_assign,
    kmeans_finalize,
    kmeans_label_distance,
    kmeans_pack,
    kmeans_packed,
    kmeans_partials,
    kmeans_plan,
    kmeans_update,
)

__all__ = ["ConvergenceWarning", "KMeans", "NotFittedError"]


class ConvergenceWarning(UserWarning):
    """Fewer distinct clusters than asked for (duplicate points), as scikit-learn warns."""


class NotFittedError(ValueError, AttributeError):
    """predict, transform or score before fit (scikit-learn's NotFittedError is both too)."""


def check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    return int(value)


def check_real(name: str, value: Any, minimum: float) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number >= {minimum}, got {value!r}")
    if not value >= minimum or not np.isfinite(value):
        raise ValueError(f"{name} must be a finite number >= {minimum}, got {value}")
    return float(value)


def is_same_clustering(labels1: np.ndarray, labels2: np.ndarray, n_clusters: int) -> bool:
    """True when labels2 is a function of labels1 (scikit-learn's _is_same_clustering: the same partition,
    perhaps with other cluster numbers)."""
    mapping = np.full(n_clusters, -1, dtype=np.int64)
    mapping[labels1] = labels2
    return bool((mapping[labels1] == labels2).all())


class BaseKMeans:
    """What KMeans and MiniBatchKMeans share: parameters (get_params/set_params as scikit-learn's
    estimators), input handling, and predict / transform / score on fitted centers."""

    _default_n_init = 10

    # -- scikit-learn's estimator protocol ---------------------------------------------------------
    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [p.name for p in sig.parameters.values() if p.name != "self"]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params: Any) -> BaseKMeans:
        names = self._param_names()
        for key, value in params.items():
            if key not in names:
                raise ValueError(f"invalid parameter {key!r} for {type(self).__name__}; valid ones: {names}")
            setattr(self, key, value)
        return self

    def __sklearn_tags__(self) -> Any:
        """scikit-learn's tags (1.6 and later read them in Pipeline, clone, cross-validation): a clusterer
        that transforms float32/float64 two-dimensional data."""
        # called by scikit-learn only: it is loaded by then, and netcl does not import it otherwise
        from sklearn.utils import InputTags, Tags, TargetTags, TransformerTags  # noqa: PLC0415

        return Tags(estimator_type="clusterer", target_tags=TargetTags(required=False),
                    transformer_tags=TransformerTags(preserves_dtype=["float64", "float32"]),
                    input_tags=InputTags(two_d_array=True))

    def __repr__(self) -> str:
        defaults = {p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()}
        changed = [
            f"{k}={v!r}"
            for k, v in self.get_params().items()
            if not (isinstance(defaults.get(k), str) and defaults.get(k) == v)
            and defaults.get(k) is not v
            and not (np.isscalar(v) and np.isscalar(defaults.get(k)) and v == defaults.get(k))
        ]
        return f"{type(self).__name__}({', '.join(changed)})"

    # -- checks ------------------------------------------------------------------------------------
    def _check_common_params(self) -> None:
        check_int("n_clusters", self.n_clusters, 1)
        check_int("max_iter", self.max_iter, 1)
        check_real("tol", self.tol, 0.0)
        if not (self.n_init == "auto" or (isinstance(self.n_init, (int, np.integer))
                                         and not isinstance(self.n_init, bool) and self.n_init >= 1)):
            raise ValueError(f"n_init must be 'auto' or an int >= 1, got {self.n_init!r}")
        if isinstance(self.init, str):
            if self.init not in ("k-means++", "random"):
                raise ValueError(f"init must be 'k-means++', 'random' or an array of shape (n_clusters, "
                                 f"n_features), got {self.init!r}")
        elif callable(self.init) or self.init is None:
            raise ValueError(
                "init must be 'k-means++', 'random' or an array of shape (n_clusters, n_features); "
                "netcl takes no callable: call it and pass its centers"
            )
        if self.chunk_rows is not None:
            check_int("chunk_rows", self.chunk_rows, 1)
        if self.variant not in (None, "cpu", "gpu", "mma"):
            raise ValueError(f"variant must be None, 'cpu', 'gpu' or 'mma', got {self.variant!r}")

    def _resolve_n_init(self) -> int:
        if self.n_init == "auto":
            n_init = self._default_n_init if isinstance(self.init, str) and self.init == "random" else 1
        else:
            n_init = int(self.n_init)
        if not isinstance(self.init, str) and n_init != 1:
            warnings.warn(f"Explicit initial center position passed: performing only one init in "
                          f"{type(self).__name__} instead of n_init={n_init}.", RuntimeWarning, stacklevel=3)
            n_init = 1
        return n_init

    def _check_fitted(self) -> None:
        if not hasattr(self, "cluster_centers_"):
            raise NotFittedError(f"this {type(self).__name__} instance is not fitted yet; call fit first")

    def _fit_data(self, X: Any) -> Data:
        queue = resolve_queue(X, self.device)
        data = as_data(X, queue, self.chunk_rows)
        if data.n < self.n_clusters:
            raise ValueError(f"n_samples={data.n} should be >= n_clusters={self.n_clusters}.")
        return data

    def _new_data(self, X: Any) -> Data:
        self._check_fitted()
        queue = (
            self._queue
            if (self.device is None and not isinstance(X, Tensor))
            else resolve_queue(X, self.device)
        )
        return as_data(X, queue, self.chunk_rows, n_features=self.n_features_in_, dtype=self._dtype)

    def _set_fitted(self, data: Data, centers_centred: np.ndarray, mean: np.ndarray) -> None:
        self._queue = data.queue
        self._dtype = data.dtype
        self._mean = mean
        self._centers_centred = centers_centred
        self.cluster_centers_ = (centers_centred + mean).astype(data.compute_dtype)
        self.n_features_in_ = data.d
        self._n_features_out = self.n_clusters

    # -- fitted centers on new data ----------------------------------------------------------------
    def _assign(self, data: Data) -> tuple[Tensor, Tensor]:
        """(labels, squared distances) of every row of `data` to the fitted centers, on the device."""
        plan = kmeans_plan(data.queue, data.dtype, data.n, data.d, self.n_clusters, self.variant)
        shift = Tensor.from_host(data.queue, self._mean)
        centers = Tensor.from_host(data.queue, self._centers_centred)
        packed = kmeans_pack(plan, centers, shift=shift)
        labels = Tensor.empty(data.queue, (data.n,), np.int32)
        dist = Tensor.empty(data.queue, (data.n,), plan.dtype)
        for x, row0 in data.chunks():
            kmeans_assign(plan, x, row0, shift, packed, centers, labels, dist)
        return labels, dist

    def predict(self, X: Any) -> Any:
        """The index of the nearest fitted center of each row of X (a Tensor for a Tensor)."""
        data = self._new_data(X)
        labels, _ = self._assign(data)
        return labels if data.is_tensor else labels.to_host()

    def score(self, X: Any, y: Any = None, sample_weight: Any = None) -> float:
        """Minus the (weighted) sum of squared distances of X's rows to their nearest fitted center."""
        data = self._new_data(X)
        weights, _ = check_weights(sample_weight, data)
        _, dist = self._assign(data)
        return -float((dist if weights is None else dist * weights).sum().item())

    def transform(self, X: Any) -> Any:
        """Euclidean distances of X's rows to every fitted center: (n_samples, n_clusters), as X came."""
        data = self._new_data(X)
        return self._distances(data)

    def _distances(self, data: Data) -> Any:
        q = data.queue
        shift = Tensor.from_host(q, self._mean)
        centers = Tensor.from_host(q, self._centers_centred)
        norms = ops.sum(ops.square(centers), axis=1)
        out = None if data.is_tensor else np.empty((data.n, self.n_clusters), data.compute_dtype)
        for x, row0 in data.chunks():
            if x.dtype != data.compute_dtype:  # half rows: distances in float32
                x = ops.cast(x, data.compute_dtype)
            xc = (x - shift).realize()
            sq = ops.sum(ops.square(xc), axis=1, keepdims=True) - 2 * ops.matmul(xc, centers.T) + norms
            dist = ops.sqrt(ops.maximum(sq, 0))
            if out is None:
                return dist.realize()
            out[row0:row0 + x.shape[0]] = dist.to_host()
        return out

    def fit_predict(self, X: Any, y: Any = None, sample_weight: Any = None) -> Any:
        """fit(X), then the labels of X's rows (labels_, or a Tensor of them for a Tensor)."""
        self.fit(X, sample_weight=sample_weight)
        return Tensor.from_host(X.queue, self.labels_) if isinstance(X, Tensor) else self.labels_

    def fit_transform(self, X: Any, y: Any = None, sample_weight: Any = None) -> Any:
        """fit(X), then transform(X)."""
        return self.fit(X, sample_weight=sample_weight).transform(X)

    def _initial_centers(self, plan: KMeansPlan, data: Data, init: Any, shift: Tensor, mean: np.ndarray,
                         weights: Tensor | None, weights_host: np.ndarray | None,
                         random_state: np.random.RandomState) -> Tensor:
        if isinstance(init, str) and init == "k-means++":
            centers, _ = plusplus(plan, data, shift, mean, weights, weights_host, random_state)
            return centers
        if isinstance(init, str):
            return random_rows(plan, data, mean, weights_host, random_state)
        return Tensor.from_host(data.queue, init - mean)


@dataclass
class LloydBuffers:
    """Device memory of Lloyd iterations, reused by every iteration and every run (none of it n x k)."""

    plan: KMeansPlan
    labels: Tensor
    dist: Tensor
    changed: Tensor
    partials: Partials
    sums: Tensor
    stats: Tensor
    packed: PackedCenters
    spare: Tensor

    @classmethod
    def make(cls, plan: KMeansPlan) -> LloydBuffers:
        q, n, k, d = plan.queue, plan.n, plan.k, plan.d
        centers = Tensor.empty(q, (k, d), plan.dtype)
        return cls(
            plan,
            Tensor.empty(q, (n,), np.int32),
            Tensor.empty(q, (n,), plan.dtype),
            Tensor.empty(q, (1,), np.int32),
            kmeans_partials(plan),
            Tensor.empty(q, (k, d), plan.dtype),
            Tensor.empty(q, (2 * k + 1,), plan.dtype),
            kmeans_packed(plan),
            centers,
        )


def relocate_empty_clusters(sums: np.ndarray, weight: np.ndarray, dist: np.ndarray, labels: np.ndarray,
                            far_rows: Any, sample_weight: np.ndarray | None) -> None:
    """scikit-learn's _relocate_empty_clusters_dense, in place on the clusters' sums and weights: each empty
    cluster takes one of the rows farthest from their centers (dist), which leaves its old cluster.
    far_rows(idx) gives those rows, centred."""
    empty = np.where(weight == 0)[0]
    n_empty = empty.shape[0]
    far = np.argpartition(dist, -n_empty)[:-n_empty - 1:-1]
    rows = far_rows(far)
    for j in range(n_empty):
        new_id, far_idx = empty[j], far[j]
        w = sums.dtype.type(1) if sample_weight is None else sample_weight[far_idx]
        old_id = labels[far_idx]
        sums[old_id] -= rows[j] * w
        sums[new_id] = rows[j] * w
        weight[new_id] = w
        weight[old_id] -= w


def lloyd(bufs: LloydBuffers, data: Data, shift: Tensor, mean: np.ndarray, weights: Tensor | None,
          weights_host: np.ndarray | None, centers: Tensor, max_iter: int, tol: float,
          verbose: int) -> tuple[np.ndarray, float, Tensor, int]:
    """One k-means run from `centers` (centred, on the device; used as scratch): scikit-learn's
    _kmeans_single_lloyd. Returns (labels, inertia, centers, iterations)."""
    plan = bufs.plan
    k = plan.k
    new = bufs.spare
    bufs.labels.fill_(-1)
    strict = False
    for i in range(max_iter):
        kmeans_pack(plan, centers, bufs.packed, shift)
        bufs.changed.fill_(0)
        bufs.partials.zero_()
        for x, row0 in data.chunks():
            kmeans_assign(plan, x, row0, shift, bufs.packed, centers, bufs.labels, bufs.dist, bufs.changed)
            kmeans_update(plan, x, row0, shift, bufs.labels, bufs.dist, weights, bufs.partials)
        kmeans_finalize(plan, bufs.partials, centers, new, bufs.sums, bufs.stats)
        stats = bufs.stats.to_host()
        changed = int(bufs.changed.to_host()[0])
        weight, shifts = stats[:k].copy(), stats[k:2 * k]
        if not weight.all():
            sums = bufs.sums.to_host()
            old = centers.to_host()
            relocate_empty_clusters(sums, weight, bufs.dist.to_host(), bufs.labels.to_host(),
                                    lambda idx: data.host_rows(idx) - mean, weights_host)
            with np.errstate(divide="ignore"):
                scale = np.where(weight > 0, sums.dtype.type(1) / weight, sums.dtype.type(1))
            moved = sums * scale[:, None]
            shifts = ((moved - old) ** 2).sum(axis=1)
            new.copy_from_host(moved)
        if verbose:
            print(f"Iteration {i}, inertia {stats[2 * k]}.")
        centers, new = new, centers
        if changed == 0:
            if verbose:
                print(f"Converged at iteration {i}: strict convergence.")
            strict = True
            break
        shift_total = float(shifts.sum())
        if shift_total <= tol:
            if verbose:
                print(f"Converged at iteration {i}: center shift {shift_total} within tolerance {tol}.")
            break
    if strict:
        for x, row0 in data.chunks():
            kmeans_label_distance(plan, x, row0, shift, centers, bufs.labels, bufs.dist)
    else:  # the labels of the final centers
        kmeans_pack(plan, centers, bufs.packed, shift)
        for x, row0 in data.chunks():
            kmeans_assign(plan, x, row0, shift, bufs.packed, centers, bufs.labels, bufs.dist)
    inertia = float((bufs.dist if weights is None else bufs.dist * weights).sum().item())
    bufs.spare = new
    return bufs.labels.to_host(), inertia, centers, i + 1


class KMeans(BaseKMeans):
    """K-means clustering (Lloyd's algorithm) on an OpenCL device, with scikit-learn's interface.

    Parameters are scikit-learn's (n_clusters, init, n_init, max_iter, tol, verbose, random_state,
    algorithm='lloyd') plus `device` (where to run: None for a Tensor's own device or the default one, a
    kind such as "gpu", a name as `netcl devices` lists, a DeviceHandle or a Queue), `chunk_rows` (stream a
    host array in chunks of this many rows; by default arrays that fit in half the device's memory are
    copied once and larger ones are streamed), and `variant` ("cpu"/"gpu" kernels, "mma": the "gpu" ones with
    the assignment on matrix units, for half rows; default by device and dtype).

    fit(X) takes a NumPy array (float32 and float64 stay as they are; integers become float64) or a netcl
    Tensor. float16 and bfloat16 rows (NumPy float16, ml_dtypes.bfloat16, or Tensors of those) stay half in
    device memory and are computed in float32: centers, distances and inertia are float32, and where the
    device has matrix units the assignment's dot products run on them.
    Fitted attributes (NumPy, as scikit-learn's): cluster_centers_ (n_clusters, n_features),
    labels_ (int32), inertia_, n_iter_, n_features_in_. predict / transform return Tensors for Tensors.
    """

    def __init__(self, n_clusters: int = 8, *, init: Any = "k-means++", n_init: int | str = "auto",
                 max_iter: int = 300, tol: float = 1e-4, verbose: int = 0, random_state: Any = None,
                 algorithm: str = "lloyd", device: Any = None, chunk_rows: int | None = None,
                 variant: str | None = None):
        self.n_clusters = n_clusters
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.verbose = verbose
        self.random_state = random_state
        self.algorithm = algorithm
        self.device = device
        self.chunk_rows = chunk_rows
        self.variant = variant

    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> KMeans:
        """Cluster X's rows; `sample_weight` weighs each row (not used by a given init array)."""
        self._check_common_params()
        if self.algorithm != "lloyd":
            raise ValueError(
                f"algorithm must be 'lloyd' (netcl runs Lloyd's algorithm), got {self.algorithm!r}"
            )
        random_state = check_random_state(self.random_state)
        n_init = self._resolve_n_init()
        data = self._fit_data(X)
        weights, weights_host = check_weights(sample_weight, data)
        init = self.init
        if not isinstance(init, str):
            init = given_centers(init, self.n_clusters, data.d, data.compute_dtype, data.queue.device)
        tol = self.tol * data.mean_variance() if self.tol else 0.0
        mean = data.mean()
        plan = kmeans_plan(data.queue, data.dtype, data.n, data.d, self.n_clusters, self.variant)
        shift = Tensor.from_host(data.queue, mean)
        bufs = LloydBuffers.make(plan)
        best = None
        for _ in range(n_init):
            centers = self._initial_centers(
                plan, data, init, shift, mean, weights, weights_host, random_state
            )
            if self.verbose:
                print("Initialization complete")
            labels, inertia, centers, n_iter = lloyd(bufs, data, shift, mean, weights, weights_host, centers,
                                                      self.max_iter, tol, self.verbose)
            if best is None or (
                inertia < best[1] and not is_same_clustering(labels, best[0], self.n_clusters)
            ):
                best = (labels, inertia, centers.to_host(), n_iter)
        labels, inertia, centers_host, n_iter = best
        distinct = int(np.count_nonzero(np.bincount(labels, minlength=self.n_clusters)))
        if distinct < self.n_clusters:
            warnings.warn(f"Number of distinct clusters ({distinct}) found smaller than n_clusters "
                          f"({self.n_clusters}). Possibly due to duplicate points in X.", ConvergenceWarning,
                          stacklevel=2)
        self._set_fitted(data, centers_host, mean)
        self.labels_ = labels
        self.inertia_ = inertia
        self.n_iter_ = n_iter
        return self

