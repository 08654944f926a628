"""Comparison helpers: every netcl result is checked against float64 NumPy with stated tolerances."""

from __future__ import annotations

import numpy as np

# Tolerances per dtype (relative, absolute) for results of a few roundings.
TOLERANCE = {
    np.dtype(np.float16): (1e-2, 1e-3),
    np.dtype(np.float32): (1e-5, 1e-6),
    np.dtype(np.float64): (1e-12, 1e-14),
}


def assert_close(actual, expected, dtype=None, rtol=None, atol=None, err_msg: str = "") -> None:
    """Compare a netcl Tensor (or array) with a float64 reference, at the tolerance of `dtype`."""
    got = actual.to_host() if hasattr(actual, "to_host") else np.asarray(actual)
    want = np.asarray(expected)
    dt = np.dtype(dtype) if dtype is not None else got.dtype
    r, a = TOLERANCE.get(dt, (0.0, 0.0))
    rtol = r if rtol is None else rtol
    atol = a if atol is None else atol
    assert got.shape == want.shape, f"shape {got.shape} != expected {want.shape} {err_msg}"
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
                               err_msg=err_msg)
