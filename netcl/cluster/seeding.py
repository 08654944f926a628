"""Initial centers: k-means++ on the device (scikit-learn's greedy variant, drawing the same random numbers
from the same RandomState, so a seed picks the same rows as scikit-learn's up to float rounding), random
rows, or given centers. Every result is the centred k x d centers on the device."""

from __future__ import annotations

from typing import Any

import numpy as np

from netcl.cluster.data import (
    Data,
    DeviceData,
    as_data,
    check_random_state,
    check_weights,
    host_array,
    resolve_queue,
)
from netcl.core.tensor import Tensor
from netcl.errors import ShapeError
from netcl.ops.kmeans import (
    PP_BLOCK,
    KMeansPlan,
    kmeans_copy_rows,
    kmeans_plan,
    kmeans_pp_pick,
    kmeans_pp_potential,
    kmeans_pp_search,
    kmeans_pp_update,
    pp_trials,
)


def sampling_probabilities(n: int, weights: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    """sample_weight / sample_weight.sum() in the data's dtype, as scikit-learn hands it to
    RandomState.choice (unit weights when there are none)."""
    w = np.ones(n, dtype=dtype) if weights is None else weights
    return w / w.sum()


def plusplus(plan: KMeansPlan, data: Data, shift: Tensor, shift_host: np.ndarray, weights: Tensor | None,
             weights_host: np.ndarray | None, random_state: np.random.RandomState,
             n_local_trials: int | None = None) -> tuple[Tensor, np.ndarray]:
    """k-means++ seeding of plan.k centers: (centred centers on the device, their row indices).

    Center 0 is a row drawn with probability proportional to its weight; each next center is, of
    `n_local_trials` rows drawn with probability proportional to weight x squared distance to the
    nearest center so far, the one that lowers the potential most. All of it runs on the device
    (the distances, their block sums, the searches, the potentials and the pick); streamed data
    is read twice per center, and its candidate rows come from host memory."""
    q, n, k, d = plan.queue, plan.n, plan.k, plan.d
    trials = pp_trials(k) if n_local_trials is None else int(n_local_trials)
    if trials < 1:
        raise ValueError(f"n_local_trials must be >= 1, got {trials}")
    first = int(random_state.choice(n, p=sampling_probabilities(n, weights_host, plan.dtype)))
    uniforms = random_state.uniform(size=max(k - 1, 0) * trials)
    nblk = -(-n // PP_BLOCK)
    closest = Tensor.full(q, (n,), np.inf, plan.dtype)
    block_sums = Tensor.empty(q, (nblk,), plan.dtype)
    part = Tensor.empty(q, (nblk, trials), plan.dtype)
    cand_ids = Tensor.empty(q, (trials,), np.int32)
    candidates = Tensor.empty(q, (trials, d), plan.dtype)
    centers = Tensor.empty(q, (k, d), plan.dtype)
    chosen = Tensor.zeros(q, (k,), np.int32)
    u = Tensor.from_host(q, uniforms.astype(plan.dtype)) if k > 1 else None
    resident = isinstance(data, DeviceData)
    data.rows(np.array([first]), shift_host, out=centers[0:1])

    def update(c: int) -> None:
        for x, row0 in data.chunks():
            kmeans_pp_update(plan, x, row0, shift, weights, centers, c, closest, block_sums)

    update(0)
    for c in range(1, k):
        kmeans_pp_search(plan, block_sums, closest, weights, u, (c - 1) * trials, trials, cand_ids)
        if resident:
            kmeans_copy_rows(data.x, cand_ids, candidates, shift=shift)
        else:
            data.rows(cand_ids.to_host(), shift_host, out=candidates)
        for x, row0 in data.chunks():
            kmeans_pp_potential(plan, x, row0, shift, weights, candidates, closest, part)
        kmeans_pp_pick(plan, part, cand_ids, candidates, c, centers, chosen)
        update(c)
    indices = chosen.to_host().astype(np.int64)
    indices[0] = first
    return centers, indices


def random_rows(plan: KMeansPlan, data: Data, shift_host: np.ndarray, weights_host: np.ndarray | None,
                random_state: np.random.RandomState) -> Tensor:
    """plan.k distinct rows drawn with probability proportional to their weight (scikit-learn's
    init='random'), centred."""
    seeds = random_state.choice(plan.n, size=plan.k, replace=False,
                                p=sampling_probabilities(plan.n, weights_host, plan.dtype))
    return data.rows(seeds, shift_host)


def given_centers(init: Any, k: int, d: int, dtype: np.dtype, device: Any) -> np.ndarray:
    """Checked initial centers (k x d, finite) as a host array of `dtype` (the data's compute dtype); a
    Tensor is read back (k rows: the centers go through the host once, as a host array's do)."""
    arr = host_array(init.to_host() if isinstance(init, Tensor) else init, device, "init")
    if arr.shape != (k, d):
        raise ShapeError(
            f"init of shape {arr.shape} does not match n_clusters={k} and the data's {d} features; "
            f"it must be ({k}, {d})"
        )
    return arr.astype(dtype)


def kmeans_plusplus(X: Any, n_clusters: int, *, sample_weight: Any = None, random_state: Any = None,
                    n_local_trials: int | None = None, device: Any = None) -> tuple[Any, np.ndarray]:
    """scikit-learn's `kmeans_plusplus` on the device: (centers, indices) of n_clusters rows of X chosen by
    greedy k-means++. Centers come back as X came (a NumPy array, or a Tensor for a Tensor)."""
    queue = resolve_queue(X, device)
    data = as_data(X, queue)
    if not isinstance(n_clusters, (int, np.integer)) or isinstance(n_clusters, bool) or n_clusters < 1:
        raise ValueError(f"n_clusters must be an int >= 1, got {n_clusters!r}")
    if data.n < n_clusters:
        raise ValueError(f"n_samples={data.n} should be >= n_clusters={n_clusters}.")
    weights, weights_host = check_weights(sample_weight, data)
    plan = kmeans_plan(queue, data.dtype, data.n, data.d, int(n_clusters))
    zero = np.zeros(data.d, data.compute_dtype)
    centers, indices = plusplus(plan, data, Tensor.from_host(queue, zero), zero, weights, weights_host,
                                check_random_state(random_state), n_local_trials)
    return (centers if data.is_tensor else centers.to_host()), indices
