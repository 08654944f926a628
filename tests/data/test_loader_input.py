"""Bad input to DataLoader and ArrayDataset: sizes are integers (never truncated), flags are bools,
datasets are arrays netcl stores, indices are checked."""

from __future__ import annotations

import numpy as np
import pytest

from netcl.data import ArrayDataset, DataLoader
from netcl.errors import DTypeError, ShapeError


@pytest.fixture
def xy():
    return np.arange(20, dtype=np.float32).reshape(10, 2), np.arange(10, dtype=np.int32)


@pytest.mark.parametrize(
    "kwargs,error,words",
    [
        (dict(batch_size=2.7), TypeError, "batch_size must be an integer >= 1, got float 2.7"),
        (dict(batch_size=2.0), TypeError, "batch_size.*got float 2.0"),
        (dict(batch_size="12"), TypeError, "batch_size.*got str '12'"),
        (dict(batch_size=True), TypeError, "batch_size.*got bool True"),
        (dict(batch_size=np.float64(3.0)), TypeError, "batch_size.*got float64"),
        (dict(batch_size=None), TypeError, "batch_size.*got NoneType"),
        (dict(batch_size=0), ValueError, "batch_size must be an integer >= 1, got 0"),
        (dict(batch_size=-4), ValueError, "batch_size.*got -4"),
        (dict(seed=1.5), TypeError, "seed must be an integer >= 0, got float 1.5"),
        (dict(seed="x"), TypeError, "seed.*got str 'x'"),
        (dict(seed=-1), ValueError, "seed must be an integer >= 0, got -1"),
        (dict(prefetch=0), ValueError, "prefetch must be an integer >= 1, got 0"),
        (dict(prefetch=2.5), TypeError, "prefetch.*float"),
        (dict(shuffle="no"), TypeError, "shuffle must be True or False, got str 'no'"),
        (dict(shuffle=1), TypeError, "shuffle must be True or False, got int 1"),
        (dict(drop_last=None), TypeError, "drop_last must be True or False, got NoneType"),
    ],
)
def test_bad_arguments(queue, xy, kwargs, error, words):
    args = {"batch_size": 4, **kwargs}
    with pytest.raises(error, match=f"DataLoader: {words}"):
        DataLoader(xy, queue=queue, **args)


def test_numpy_integers_and_bools_are_accepted(queue, xy):
    loader = DataLoader(
        xy, np.int64(4), queue, shuffle=np.bool_(True), seed=np.uint8(3), prefetch=np.int32(1)
    )
    assert loader.batch_size == 4 and loader.seed == 3 and loader.shuffle is True and len(loader) == 3


def test_dataset_must_be_arrays_of_stored_dtypes(queue, xy):
    x, y = xy
    with pytest.raises(
        TypeError,
        match=r"dataset must be an ArrayDataset or a tuple of arrays.*got ndarray; wrap a single array "
        r"as \(x,\)",
    ):
        DataLoader(x, 2, queue)  # used to take each of the 10 rows as an array of 2 samples
    for bad, words in [(5, "got int"), ({"x": x}, "got dict"), ("xy", "got str")]:
        with pytest.raises(TypeError, match=words):
            DataLoader(bad, 2, queue)
    with pytest.raises(DTypeError, match="array 1 has dtype int16, which netcl does not store"):
        DataLoader((x, y.astype(np.int16)), 2, queue)
    with pytest.raises(DTypeError, match="array 0 has dtype object"):
        DataLoader((np.array([None] * 10),), 2, queue)
    with pytest.raises(ShapeError, match="array 1 has 9 rows, array 0 has 10"):
        DataLoader((x, y[:9]), 2, queue)


def test_epochs_and_state(queue, xy):
    loader = DataLoader(xy, 4, queue, shuffle=True, seed=2)
    for bad, error in [(1.5, TypeError), ("1", TypeError), (-1, ValueError), (True, TypeError)]:
        with pytest.raises(error, match="set_epoch: epoch must be an integer >= 0"):
            loader.set_epoch(bad)
        with pytest.raises(error, match="order: epoch must be an integer >= 0"):
            loader.order(bad)
    loader.set_epoch(np.int64(3))
    np.testing.assert_array_equal(loader.order(), np.random.default_rng([2, 3]).permutation(10))
    for state, error, words in [
        ({"epoch": 1}, ValueError, r"state holds \['epoch'\], a DataLoader's holds 'epoch' and 'seed'"),
        ({"epoch": 1, "seed": 2, "x": 0}, ValueError, "a DataLoader's holds"),
        ({"epoch": 1.5, "seed": 2}, TypeError, "load_state_dict: epoch must be an integer >= 0, got float"),
        ({"epoch": 1, "seed": -2}, ValueError, "load_state_dict: seed must be an integer >= 0, got -2"),
        ([1, 2], TypeError, "state must be a dict, got list"),
    ]:
        with pytest.raises(error, match=words):
            loader.load_state_dict(state)
        assert loader.state_dict() == {"epoch": 3, "seed": 2}


def test_array_dataset_inputs():
    with pytest.raises(ShapeError, match=r"array 1 is a scalar \(int 5\); each array has one row per sample"):
        ArrayDataset(np.zeros(3), 5)
    with pytest.raises(TypeError, match="array 0 is not an array"):
        ArrayDataset([[1.0], [1.0, 2.0]])
    assert len(ArrayDataset([1, 2, 3])) == 3


def test_array_dataset_indices():
    x = np.arange(12).reshape(6, 2)
    y = np.arange(6) * 10
    ds = ArrayDataset(x, y)
    np.testing.assert_array_equal(ds[np.int64(-1)][1], 50)
    np.testing.assert_array_equal(ds[1:3][0], x[1:3])
    np.testing.assert_array_equal(ds[[4, 0]][1], [40, 0])
    np.testing.assert_array_equal(ds[np.array([True, False] * 3)][1], [0, 20, 40])
    assert ds[[]][0].shape == (0, 2)
    for bad, error, words in [
        (6, IndexError, "ArrayDataset index 6 is out of range for 6 samples"),
        (-7, IndexError, "index -7 is out of range"),
        ([1, 9], IndexError, "index 9 is out of range for 6 samples"),
        (np.array([True, False]), IndexError, r"boolean index has shape \(2,\), the dataset has 6 samples"),
        (2.7, TypeError, "got float 2.7"),
        ("1", TypeError, "got str '1'"),
        (True, TypeError, "got bool True"),  # NumPy would add an axis
        (None, TypeError, "got NoneType"),
        ((1, 0), TypeError, r"got tuple \(1, 0\)"),
        ([1.5], TypeError, "indices must be integers, got an array of float64"),
    ]:
        with pytest.raises(error, match=words):
            ds[bad]
    assert [len(rows) for rows in ds] == [2] * 6  # iteration ends at the IndexError past the end
