"""Shared bits of the per-area Oclgrind cases (tests/oclgrind/test_<area>_oclgrind.py).

The area cases below are meant for scripts/oclgrind_check.py (NETCL_DEVICE=oclgrind). On the normal
suite's device they would only repeat what tests/ops, tests/core ... already check, and cost the
kernel builds of many extra variants, so they skip there unless NETCL_OCLGRIND_CASES=1 (handy to
check a new case on PoCL before running it under the simulator).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from netcl.core.tensor import Tensor

UNDER_OCLGRIND = "oclgrind" in os.environ.get("NETCL_DEVICE", "").lower()
oclgrind_only = pytest.mark.skipif(
    not (UNDER_OCLGRIND or os.environ.get("NETCL_OCLGRIND_CASES") == "1"),
    reason="Oclgrind case: run scripts/oclgrind_check.py (or set NETCL_OCLGRIND_CASES=1)",
)


def dev(queue, arr) -> Tensor:
    return Tensor.from_host(queue, np.ascontiguousarray(arr))


def strided(queue, arr) -> Tensor:
    """A non-contiguous view holding `arr`: every other element of a wider buffer along the last axis."""
    wide = np.zeros(arr.shape[:-1] + (2 * arr.shape[-1] + 1,), arr.dtype)
    wide[..., 1::2] = arr
    return Tensor.from_host(queue, wide)[..., 1::2]


def close(got, want, rtol=1e-5, atol=1e-5) -> None:
    g = got.to_host() if isinstance(got, Tensor) else np.asarray(got)
    np.testing.assert_allclose(g.astype(np.float64), np.asarray(want, np.float64), rtol=rtol, atol=atol)
