"""DataLoader batches, shuffling by (seed, epoch), drop_last, early exit; IDX reading; digits."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from netcl.data import ArrayDataset, DataLoader, DatasetUnavailable, load_digits, locate, read_idx
from netcl.errors import ShapeError


def _collect(loader):
    return [tuple(t.to_host() for t in batch) for batch in loader]


def test_batches_cover_the_data_in_order(queue, rng):
    x = rng.standard_normal((23, 3, 2)).astype(np.float32)
    y = np.arange(23, dtype=np.int32)
    batches = _collect(DataLoader((x, y), 5, queue))
    assert [len(b[1]) for b in batches] == [5, 5, 5, 5, 3]
    np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), x)
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), y)


def test_shuffle_is_a_function_of_seed_and_epoch(queue):
    x = np.arange(40, dtype=np.float32).reshape(40, 1)
    y = np.arange(40, dtype=np.int64)
    a = DataLoader((x, y), 8, queue, shuffle=True, seed=3, drop_last=True)
    first = np.concatenate([b[1] for b in _collect(a)])
    second = np.concatenate([b[1] for b in _collect(a)])
    assert sorted(first) == list(range(40)) and not np.array_equal(first, second)
    b = DataLoader((x, y), 8, queue, shuffle=True, seed=3)
    b.set_epoch(1)
    np.testing.assert_array_equal(np.concatenate([t[1] for t in _collect(b)]), second)
    for xb, yb in _collect(b):
        np.testing.assert_array_equal(xb[:, 0], yb.astype(np.float32))


def test_drop_last_and_len(queue):
    loader = DataLoader((np.zeros((10, 2), np.float32),), 4, queue, drop_last=True)
    assert len(loader) == 2 and len(_collect(loader)) == 2


def test_breaking_early_stops_the_worker(queue):
    loader = DataLoader((np.zeros((100, 2), np.float32),), 4, queue, prefetch=1)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert len(_collect(loader)) == 25


def test_dataset_length_mismatch():
    with pytest.raises(ShapeError, match="3 rows"):
        ArrayDataset(np.zeros(4), np.zeros(3))


def test_read_idx_gz_and_raw(tmp_path, rng):
    images = rng.integers(0, 256, (5, 4, 3), dtype=np.uint8)
    body = struct.pack(">HBB3I", 0, 8, 3, 5, 4, 3) + images.tobytes()
    (tmp_path / "a.idx").write_bytes(body)
    with gzip.open(tmp_path / "a.idx.gz", "wb") as f:
        f.write(body)
    np.testing.assert_array_equal(read_idx(tmp_path / "a.idx"), images)
    np.testing.assert_array_equal(read_idx(tmp_path / "a.idx.gz"), images)


def test_missing_dataset_message(tmp_path, monkeypatch):
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(DatasetUnavailable, match="--data-dir"):
        locate("mnist", None, download=False)
    # a directory the caller names is the only place searched: no other copy, no download
    with pytest.raises(DatasetUnavailable, match=f"are not in {tmp_path}"):
        locate("mnist", tmp_path, download=True)


def test_digits_split():
    d = load_digits()
    assert d.x_train.shape[1:] == (1, 8, 8) and len(d.y_train) + len(d.y_test) == 1797
    assert d.x_train.dtype == np.float32 and d.y_train.dtype == np.int32
