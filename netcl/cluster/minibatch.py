"""MiniBatchKMeans: scikit-learn's mini-batch k-means (sklearn/cluster/_kmeans.py) on the device: batches
drawn
with the same RandomState calls (so a seed draws the same batches), centers moved by per-cluster running
means, low-count centers reassigned to batch rows, and the early stop on the smoothed batch inertia or
on tol. A step is a gather of the batch rows, the fused assignment, the partial sums and one kernel over
the clusters, then a read of 2k + 1 numbers."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from netcl.cluster.data import Data, DeviceData, as_data, check_random_state, check_weights, resolve_queue
from netcl.cluster.kmeans import BaseKMeans, check_int, check_real
from netcl.cluster.seeding import given_centers
from netcl.core.tensor import Tensor
from netcl.ops.kmeans import (
    KMeansPlan,
    kmeans_assign,
    kmeans_copy_rows,
    kmeans_minibatch_finalize,
    kmeans_pack,
    kmeans_packed,
    kmeans_partials,
    kmeans_plan,
    kmeans_update,
)

__all__ = ["MiniBatchKMeans"]


def batch_sampler(weights_host: np.ndarray | None, n: int, dtype: np.dtype) -> np.ndarray:
    """The cumulative distribution RandomState.choice(n, size, p=w / w.sum(), replace=True) builds on every
    call, built once: cdf.searchsorted(random_state.random_sample(size), side="right") then draws the very
    same rows (scikit-learn samples each batch that way)."""
    w = np.ones(n, dtype=dtype) if weights_host is None else weights_host
    p = (w / w.sum()).astype(np.float64)
    cdf = p.cumsum()
    cdf /= cdf[-1]
    return cdf


@dataclass
class StepState:
    """Device buffers of mini-batch steps over batches of one size (none of them n x k)."""

    plan: KMeansPlan
    labels: Tensor
    dist: Tensor
    partials: Any
    stats: Tensor
    packed: Any

    @classmethod
    def make(cls, plan: KMeansPlan) -> StepState:
        q = plan.queue
        return cls(plan, Tensor.empty(q, (plan.n,), np.int32), Tensor.empty(q, (plan.n,), plan.dtype),
                   kmeans_partials(plan), Tensor.empty(q, (2 * plan.k + 1,), plan.dtype),
                   kmeans_packed(plan))


class MiniBatchKMeans(BaseKMeans):
    """Mini-batch k-means on an OpenCL device, with scikit-learn's interface and rules.

    Parameters are scikit-learn's (n_clusters, init, max_iter, batch_size, verbose, compute_labels,
    random_state, tol, max_no_improvement, init_size, n_init, reassignment_ratio) plus `device`,
    `chunk_rows` and `variant` as for KMeans. fit, partial_fit, predict, transform, score; fitted
    attributes cluster_centers_, labels_, inertia_, n_iter_, n_steps_, n_features_in_.
    """

    _default_n_init = 3

    def __init__(
        self,
        n_clusters: int = 8,
        *,
        init: Any = "k-means++",
        max_iter: int = 100,
        batch_size: int = 1024,
        verbose: int = 0,
        compute_labels: bool = True,
        random_state: Any = None,
        tol: float = 0.0,
        max_no_improvement: int | None = 10,
        init_size: int | None = None,
        n_init: int | str = "auto",
        reassignment_ratio: float = 0.01,
        device: Any = None,
        chunk_rows: int | None = None,
        variant: str | None = None,
    ):
        self.n_clusters = n_clusters
        self.init = init
        self.max_iter = max_iter
        self.batch_size = batch_size
        self.verbose = verbose
        self.compute_labels = compute_labels
        self.random_state = random_state
        self.tol = tol
        self.max_no_improvement = max_no_improvement
        self.init_size = init_size
        self.n_init = n_init
        self.reassignment_ratio = reassignment_ratio
        self.device = device
        self.chunk_rows = chunk_rows
        self.variant = variant

    # -- parameters --------------------------------------------------------------------------------------
    def _check_params(self, n: int) -> None:
        self._check_common_params()
        check_int("batch_size", self.batch_size, 1)
        if self.max_no_improvement is not None:
            check_int("max_no_improvement", self.max_no_improvement, 0)
        if self.init_size is not None:
            check_int("init_size", self.init_size, 1)
        check_real("reassignment_ratio", self.reassignment_ratio, 0.0)
        self._batch_size = min(self.batch_size, n)
        init_size = self.init_size
        if init_size is None:
            init_size = 3 * self._batch_size
            if init_size < self.n_clusters:
                init_size = 3 * self.n_clusters
        elif init_size < self.n_clusters:
            warnings.warn(
                f"init_size={init_size} should be larger than n_clusters={self.n_clusters}. Setting it "
                "to min(3*n_clusters, n_samples)",
                RuntimeWarning,
                stacklevel=3,
            )
            init_size = 3 * self.n_clusters
        self._init_size = min(init_size, n)

    # -- pieces of scikit-learn's fit ------------------------------------------------------------------
    def _init_centroids(self, data: Data, init: Any, weights_host: np.ndarray | None, mean: np.ndarray,
                        shift: Tensor, random_state: np.random.RandomState) -> Tensor:
        """Initial centers (centred, on the device) from a random subset of init_size rows."""
        sub, sub_weights = data, weights_host
        if self._init_size < data.n:
            idx = random_state.randint(0, data.n, self._init_size)
            sub = DeviceData(data.rows(idx), is_tensor=False)
            sub_weights = None if weights_host is None else weights_host[idx]
        plan = kmeans_plan(data.queue, data.dtype, sub.n, data.d, self.n_clusters, self.variant)
        sub_w = None if sub_weights is None else Tensor.from_host(data.queue, sub_weights)
        return self._initial_centers(plan, sub, init, shift, mean, sub_w, sub_weights, random_state)

    def _random_reassign(self) -> bool:
        self._n_since_last_reassign += self._batch_size
        if (self._counts == 0).any() or self._n_since_last_reassign >= 10 * self.n_clusters:
            self._n_since_last_reassign = 0
            return True
        return False

    def _convergence(self, step: int, n_steps: int, n_samples: int, centers_squared_diff: float,
                     batch_inertia: float) -> bool:
        """scikit-learn's _mini_batch_convergence: an exponentially weighted average of the batch inertia,
        stopping on tol or after max_no_improvement steps without a new minimum."""
        batch_inertia /= self._batch_size
        step += 1
        if step == 1:
            if self.verbose:
                print(f"Minibatch step {step}/{n_steps}: mean batch inertia: {batch_inertia}")
            return False
        if self._ewa_inertia is None:
            self._ewa_inertia = batch_inertia
        else:
            alpha = min(self._batch_size * 2.0 / (n_samples + 1), 1)
            self._ewa_inertia = self._ewa_inertia * (1 - alpha) + batch_inertia * alpha
        if self.verbose:
            print(f"Minibatch step {step}/{n_steps}: mean batch inertia: {batch_inertia}, "
                  f"ewa inertia: {self._ewa_inertia}")
        if self._tol > 0.0 and centers_squared_diff <= self._tol:
            if self.verbose:
                print(f"Converged (small centers change) at step {step}/{n_steps}")
            return True
        if self._ewa_inertia_min is None or self._ewa_inertia < self._ewa_inertia_min:
            self._no_improvement = 0
            self._ewa_inertia_min = self._ewa_inertia
        else:
            self._no_improvement += 1
        if self.max_no_improvement is not None and self._no_improvement >= self.max_no_improvement:
            if self.verbose:
                print(f"Converged (lack of improvement in inertia) at step {step}/{n_steps}")
            return True
        return False

    def _step(self, state: StepState, batch: Data, weights: Tensor | None, shift: Tensor, centers: Tensor,
              new: Tensor, counts: Tensor, random_state: np.random.RandomState, random_reassign: bool,
              need_shift: bool) -> tuple[float, float]:
        """scikit-learn's _mini_batch_step: labels of the batch, the centers' update (into `new`), the
        reassignment of low-count centers. Returns (the batch's inertia before the update, the squared
        shift of all centers when need_shift, else 0)."""
        plan, k = state.plan, self.n_clusters
        kmeans_pack(plan, centers, state.packed, shift)
        state.partials.zero_()
        for x, row0 in batch.chunks():
            kmeans_assign(plan, x, row0, shift, state.packed, centers, state.labels, state.dist)
            kmeans_update(plan, x, row0, shift, state.labels, state.dist, weights, state.partials)
        kmeans_minibatch_finalize(plan, state.partials, centers, new, counts, state.stats)
        stats = state.stats.to_host()
        b = stats[:k]
        self._counts = np.where(b > 0, self._counts + b, self._counts).astype(self._counts.dtype)
        moved = float(stats[k:2 * k].sum())
        if random_reassign and self.reassignment_ratio > 0:
            to_reassign = self._counts < self.reassignment_ratio * self._counts.max()
            if to_reassign.sum() > 0.5 * batch.n:
                keep = np.argsort(self._counts, kind="stable")[int(0.5 * batch.n):]
                to_reassign[keep] = False
            n_reassigns = int(to_reassign.sum())
            if n_reassigns:
                rows = random_state.choice(batch.n, replace=False, size=n_reassigns)
                targets = np.where(to_reassign)[0]
                if self.verbose:
                    print(f"[MiniBatchKMeans] Reassigning {n_reassigns} cluster centers.")
                q = plan.queue
                src = batch.rows(rows, None) if not isinstance(batch, DeviceData) else batch.x
                src_idx = np.arange(n_reassigns) if not isinstance(batch, DeviceData) else rows
                kmeans_copy_rows(src, Tensor.from_host(q, src_idx.astype(np.int32)), new, shift=shift,
                                 dst_idx=Tensor.from_host(q, targets.astype(np.int32)))
                if need_shift:
                    moved = float(((new.to_host() - centers.to_host()) ** 2).sum())
            self._counts[to_reassign] = np.min(self._counts[~to_reassign])
            counts.copy_from_host(self._counts)
        return float(stats[2 * k]), (moved if need_shift else 0.0)

    # -- public ----------------------------------------------------------------------------------------
    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> MiniBatchKMeans:
        """Cluster X's rows by mini-batches; `sample_weight` sets how often each row is drawn."""
        self._check_common_params()
        data = self._fit_data(X)
        self._check_params(data.n)
        random_state = check_random_state(self.random_state)
        n_init = self._resolve_n_init()
        weights, weights_host = check_weights(sample_weight, data)
        q, n, k = data.queue, data.n, self.n_clusters
        init = self.init
        if not isinstance(init, str):
            init = given_centers(init, k, data.d, data.compute_dtype, q.device)
        self._tol = self.tol * data.mean_variance() if self.tol else 0.0
        mean = data.mean()
        shift = Tensor.from_host(q, mean)

        valid_idx = random_state.randint(0, n, self._init_size)
        valid = DeviceData(data.rows(valid_idx), is_tensor=False)
        valid_plan = kmeans_plan(q, data.dtype, valid.n, data.d, k, self.variant)
        valid_w = None if weights_host is None else Tensor.from_host(q, weights_host[valid_idx])
        best, best_inertia = None, None
        for i in range(n_init):
            if self.verbose:
                print(f"Init {i + 1}/{n_init} with method {init if isinstance(init, str) else 'array'}")
            centers = self._init_centroids(data, init, weights_host, mean, shift, random_state)
            inertia = self._inertia(valid_plan, valid, valid_w, shift, centers)
            if self.verbose:
                print(f"Inertia for init {i + 1}/{n_init}: {inertia}")
            if best_inertia is None or inertia < best_inertia:
                best, best_inertia = centers, inertia

        centers, new = best, Tensor.empty(q, (k, data.d), data.compute_dtype)
        self._counts = np.zeros(k, dtype=data.compute_dtype)
        counts = Tensor.zeros(q, (k,), data.compute_dtype)
        self._ewa_inertia = self._ewa_inertia_min = None
        self._no_improvement = 0
        self._n_since_last_reassign = 0
        sum_of_weights = float(n if weights_host is None else weights_host.sum())
        cdf = batch_sampler(weights_host, n, data.compute_dtype)
        state = StepState.make(kmeans_plan(q, data.dtype, self._batch_size, data.d, k, self.variant))
        batch = Tensor.empty(q, (self._batch_size, data.d), data.dtype)
        n_steps = (self.max_iter * n) // self._batch_size
        i = -1
        for i in range(n_steps):
            idx = cdf.searchsorted(random_state.random_sample(self._batch_size), side="right")
            data.rows(idx, None, out=batch)
            batch_inertia, moved = self._step(
                state,
                DeviceData(batch, is_tensor=False),
                None,
                shift,
                centers,
                new,
                counts,
                random_state,
                self._random_reassign(),
                self._tol > 0.0,
            )
            centers, new = new, centers
            if self._convergence(i, n_steps, n, moved, batch_inertia):
                break
        self._set_fitted(data, centers.to_host(), mean)
        self.n_steps_ = i + 1
        self.n_iter_ = int(np.ceil((i + 1) * self._batch_size / n))
        if self.compute_labels:
            labels, dist = self._assign(data)
            self.labels_ = labels.to_host()
            self.inertia_ = float((dist if weights is None else dist * weights).sum().item())
        else:
            self.inertia_ = (self._ewa_inertia or 0.0) * sum_of_weights
        return self

    def _inertia(
        self, plan: KMeansPlan, data: Data, weights: Tensor | None, shift: Tensor, centers: Tensor
    ) -> float:
        packed = kmeans_pack(plan, centers, shift=shift)
        labels = Tensor.empty(plan.queue, (plan.n,), np.int32)
        dist = Tensor.empty(plan.queue, (plan.n,), plan.dtype)
        for x, row0 in data.chunks():
            kmeans_assign(plan, x, row0, shift, packed, centers, labels, dist)
        return float((dist if weights is None else dist * weights).sum().item())

    def partial_fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> MiniBatchKMeans:
        """One mini-batch step on X (initialising from X on the first call)."""
        fitted = hasattr(self, "cluster_centers_")
        if fitted:
            data = self._new_data(X)
        else:
            self._check_common_params()
            data = as_data(X, resolve_queue(X, self.device), self.chunk_rows)
            if data.n < self.n_clusters:
                raise ValueError(f"n_samples={data.n} should be >= n_clusters={self.n_clusters}.")
        if not hasattr(self, "_random_state"):
            self._random_state = check_random_state(self.random_state)
        weights, weights_host = check_weights(sample_weight, data)
        self.n_steps_ = getattr(self, "n_steps_", 0)
        q, k = data.queue, self.n_clusters
        if not fitted:
            self._check_params(data.n)
            self._resolve_n_init()
            init = self.init
            if not isinstance(init, str):
                init = given_centers(init, k, data.d, data.compute_dtype, q.device)
            mean = data.mean()
            centers = self._init_centroids(data, init, weights_host, mean, Tensor.from_host(q, mean),
                                           self._random_state)
            self._set_fitted(data, centers.to_host(), mean)
            self._counts = np.zeros(k, dtype=data.compute_dtype)
            self._n_since_last_reassign = 0
        shift = Tensor.from_host(q, self._mean)
        centers = Tensor.from_host(q, self._centers_centred)
        new = Tensor.empty(q, centers.shape, data.compute_dtype)
        counts = Tensor.from_host(q, self._counts)
        state = StepState.make(kmeans_plan(q, data.dtype, data.n, data.d, k, self.variant))
        self._step(
            state,
            data,
            weights,
            shift,
            centers,
            new,
            counts,
            self._random_state,
            self._random_reassign(),
            False,
        )
        self._set_fitted(data, new.to_host(), self._mean)
        if self.compute_labels:
            labels, dist = self._assign(data)
            self.labels_ = labels.to_host()
            self.inertia_ = float((dist if weights is None else dist * weights).sum().item())
        self.n_steps_ += 1
        return self
