"""One rank of tests/distributed/test_collectives.py (started by `netcl run` or mpiexec): every collective on
odd sizes, on host arrays and on PoCL tensors (host sums and device sums), checked against a float64 NumPy
reference of all ranks' inputs; prints "rank R ok" at the end (an assertion error ends the rank otherwise)."""

from __future__ import annotations

import os

import numpy as np

import netcl.distributed as dist
from netcl.core.device import manager
from netcl.core.tensor import Tensor
from tests.distributed.launching import say

SIZES = (1, 17, 130, 1001, 70001)
TENSOR_SIZES = (1, 130, 70001)  # fewer shapes on the device: each is a kernel build on a cold cache


def inputs(rank: int, n: int, dtype: np.dtype, salt: int) -> np.ndarray:
    rng = np.random.default_rng([rank, n, salt])
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(n).astype(dtype)
    return rng.integers(-1000, 1000, n).astype(dtype)


def reference(world: int, n: int, dtype: np.dtype, salt: int, op: str, weights=None) -> np.ndarray:
    xs = np.stack(
        [
            inputs(r, n, dtype, salt).astype(np.float64 if np.dtype(dtype).kind == "f" else np.int64)
            for r in range(world)
        ]
    )
    if weights is not None:
        return (xs * np.array(weights)[:, None]).sum(0)
    return {"sum": xs.sum(0), "mean": xs.mean(0), "max": xs.max(0), "min": xs.min(0), "prod": xs.prod(0)}[op]


def close(got: np.ndarray, want: np.ndarray, dtype: np.dtype, what: str) -> None:
    if np.dtype(dtype).kind != "f":
        assert np.array_equal(got.astype(np.int64), want), f"{what}: integers differ"
        return
    tol = {2: 2e-3, 4: 2e-6, 8: 1e-13}[np.dtype(dtype).itemsize] * max(dist.world_size(), 2)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=what)


def main() -> None:
    dist.init()
    r, w = dist.rank(), dist.world_size()
    q = manager.default("auto").queue
    # empty tensors first: the job's first collective moves nothing (shm had no segment to slice yet)
    empty = Tensor.from_host(q, np.zeros((0, 3), np.float32))
    dist.all_reduce(empty)
    dist.broadcast(empty, src=w - 1)
    assert [p.shape for p in dist.all_gather(empty)] == [(0, 3)] * w and empty.shape == (0, 3)
    salt = 0
    # host arrays, every op, integer exactness
    for dtype in (np.int32, np.int64, np.float32, np.float64):
        for n in SIZES:
            for op in ("sum", "max", "min") + (("mean",) if np.dtype(dtype).kind == "f" else ()):
                salt += 1
                a = inputs(r, n, dtype, salt)
                dist.all_reduce(a, op)
                close(
                    a, reference(w, n, dtype, salt, op), dtype, f"host all_reduce {op} {dtype.__name__} n={n}"
                )
    # tensors: host sums, then device sums (NETCL_DIST_DEVICE_SUM=1 is how a GPU runs)
    for mode in ("0", "1"):
        os.environ["NETCL_DIST_DEVICE_SUM"] = mode
        for dtype in (np.int32, np.float32):
            for n in TENSOR_SIZES:
                for op in ("sum", "max", "prod") if np.dtype(dtype).kind == "i" else ("sum", "mean", "min"):
                    salt += 1
                    x = inputs(r, n, dtype, salt)
                    if op == "prod":
                        x = (x % 3).astype(dtype)  # keeps the product inside int32
                    t = Tensor.from_host(q, x)
                    dist.all_reduce(t, op)
                    want = (
                        reference(w, n, dtype, salt, op)
                        if op != "prod"
                        else np.prod(
                            np.stack([(inputs(k, n, dtype, salt) % 3).astype(np.int64) for k in range(w)]), 0
                        )
                    )
                    close(
                        t.to_host(),
                        want,
                        dtype,
                        f"tensor all_reduce {op} {dtype.__name__} n={n} device_sum={mode}",
                    )
        # several tensors of two dtypes, one strided, in one call; weighted sum
        salt += 1
        a = Tensor.from_host(q, inputs(r, 3 * 41, np.float32, salt).reshape(3, 41))
        b = Tensor.from_host(q, inputs(r, 29, np.int32, salt))
        c_full = Tensor.from_host(q, inputs(r, 6 * 7, np.float32, salt + 1).reshape(6, 7))
        c = c_full.T  # a strided view: reduced in place through a copy
        dist.all_reduce([a, b, c], "sum")
        close(
            a.to_host().reshape(-1),
            reference(w, 3 * 41, np.float32, salt, "sum"),
            np.float32,
            f"list a {mode}",
        )
        close(b.to_host(), reference(w, 29, np.int32, salt, "sum"), np.int32, f"list b {mode}")
        close(
            c_full.to_host().reshape(-1),
            reference(w, 42, np.float32, salt + 1, "sum"),
            np.float32,
            f"strided {mode}",
        )
        weights = [(k + 1) / (w * (w + 1) / 2) for k in range(w)]
        salt += 2
        t = Tensor.from_host(q, inputs(r, 1001, np.float32, salt))
        dist.all_reduce(t, "sum", weights=weights)
        close(
            t.to_host(), reference(w, 1001, np.float32, salt, "sum", weights), np.float32, f"weighted {mode}"
        )
    # broadcast from the last rank, all_gather, barrier, batch_shares
    for n in SIZES:
        t = Tensor.from_host(q, np.full(n, r * 10 + 1, np.int32))
        dist.broadcast(t, src=w - 1)
        assert (t.to_host() == (w - 1) * 10 + 1).all(), f"broadcast n={n}"
        h = np.full(n, float(r), np.float64)
        dist.broadcast(h, src=0)
        assert (h == 0).all()
        parts = dist.all_gather(Tensor.from_host(q, np.arange(n, dtype=np.float32) + r))
        assert [p.shape for p in parts] == [(n,)] * w
        for k, p in enumerate(parts):
            assert np.array_equal(p.to_host(), np.arange(n, dtype=np.float32) + k), (
                f"all_gather n={n} part {k}"
            )
    gathered = dist.all_gather(np.array([[r, -r]], np.int64))
    assert gathered.shape == (w, 1, 2) and gathered[:, 0, 0].tolist() == list(range(w))
    assert dist.all_gather(np.array(r, np.float32)).tolist() == list(range(w))  # 0-d arrays: shape (w,)
    assert dist.all_gather(float(r)).tolist() == list(range(w))
    dist.barrier()
    shares = dist.batch_shares(10 * w + 1, speed=1.0 + r)
    assert sum(shares) == 10 * w + 1 and min(shares) >= 1 and shares == sorted(shares), shares
    # a rank that makes a different call is named, not a hang (shm; MPI leaves a mismatch undefined)
    if dist.backend() == "mpi":
        say(f"rank {r} ok")
        return
    try:
        if r == 0:
            dist.all_reduce(np.zeros(5, np.float32))
        else:
            dist.broadcast(np.zeros(5, np.float32), src=0)
    except dist.DistributedError as exc:
        assert "disagree" in str(exc) or "different collective call" in str(exc), exc
        say(f"rank {r} mismatch named: {exc}")
    else:
        raise AssertionError("a mismatched call went unnoticed")
    say(f"rank {r} ok")


if __name__ == "__main__":
    main()
