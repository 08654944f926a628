"""sort.cl under Oclgrind: sort_rows (rows within one chunk, the device's work-group), sort_first, sort_step
and sort_merge (rows past a chunk: a work-group of 4 here, so a row of 21 runs every one of them),
sort_scatter (the values' gradient); float16, float32 and int64, NaN, ties, a strided view, descending."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import ops
from netcl.core.tensor import Tensor
from netcl.ops import sorting
from tests.oclgrind.cases import oclgrind_only, strided

pytestmark = oclgrind_only


def _check(x: Tensor, a: np.ndarray, descending: bool) -> None:
    values, indices = ops.sort(x, descending=descending)
    keys = -a if descending else a   # (no NaN among the descending cases: -NaN is NaN)
    order = np.argsort(keys, axis=-1, kind="stable")
    np.testing.assert_array_equal(indices.to_host(), order)
    np.testing.assert_array_equal(values.to_host(), np.take_along_axis(a, order, -1))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int64])
def test_sort_rows(queue, dtype):
    a = (np.arange(3 * 7) * 5 % 11).astype(dtype).reshape(3, 7)
    if dtype != np.int64:
        a[1, 2] = np.nan
    _check(Tensor.from_host(queue, a), a, False)
    _check(strided(queue, a[:2, :5]), a[:2, :5], dtype == np.int64)


def test_sort_global_steps_and_gradient(queue, monkeypatch):
    monkeypatch.setattr(sorting, "SORT_WG", 4)
    a = (np.arange(2 * 21) * 7 % 13).astype(np.float32).reshape(2, 21)
    x = Tensor.from_host(queue, a)
    _check(x, a, False)
    _check(x, a, True)
    node = ag.tensor(x, requires_grad=True)
    w = np.arange(2 * 21, dtype=np.float32).reshape(2, 21)
    with ag.Tape() as tape:
        values, indices = node.sort(dim=1)
        loss = (values * ag.tensor(Tensor.from_host(queue, w))).sum()
    tape.backward(loss)
    want = np.zeros_like(w)
    np.put_along_axis(want, indices.to_host(), w, 1)
    np.testing.assert_array_equal(node.grad.to_host(), want)
