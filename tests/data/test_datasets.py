"""read_idx on truncated, corrupt and foreign files (raw and gzip); load_idx_dataset, load_digits and
locate given bad arguments."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from netcl.data import load_digits, load_idx_dataset, locate, read_idx
from netcl.errors import NetclError


def _idx(array: np.ndarray, code: int = 0x08) -> bytes:
    return struct.pack(f">HBB{array.ndim}I", 0, code, array.ndim, *array.shape) + array.tobytes()


@pytest.fixture
def images(rng):
    return rng.integers(0, 256, (5, 4, 3), dtype=np.uint8)


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (2, 1, 3, 2), (0, 28, 28)])
def test_read_idx_shapes(tmp_path, rng, shape):
    a = rng.integers(0, 256, shape, dtype=np.uint8)
    (tmp_path / "x.idx").write_bytes(_idx(a))
    (tmp_path / "y").write_bytes(gzip.compress(_idx(a)))  # gzip is told by its first bytes, not the name
    np.testing.assert_array_equal(read_idx(tmp_path / "x.idx"), a)
    np.testing.assert_array_equal(read_idx(str(tmp_path / "y")), a)


def test_truncated_raw_files(tmp_path, images):
    body = _idx(images)  # 4 + 12 header bytes, then 60 data bytes
    cases = [
        (0, "too short to be an IDX file: 0 bytes"),
        (3, "too short to be an IDX file: 3 bytes"),
        (6, "truncated: a 3-dimensional IDX header needs 16 bytes, the file holds 6"),
        (15, "the file holds 15"),
        (16, r"shape \(5, 4, 3\) \(60 bytes of data\), the file holds 0 \(truncated\)"),
        (45, r"the file holds 29 \(truncated\)"),
        (75, r"the file holds 59 \(truncated\)"),
    ]
    for cut, words in cases:
        path = tmp_path / f"cut{cut}.idx"
        path.write_bytes(body[:cut])
        with pytest.raises(NetclError, match=rf"{path.name}.*{words}"):
            read_idx(path)


def test_truncated_gzip_files(tmp_path, images):
    blob = gzip.compress(_idx(images))
    for cut in (2, 10, len(blob) // 2, len(blob) - 4):
        path = tmp_path / f"cut{cut}.idx.gz"
        path.write_bytes(blob[:cut])
        with pytest.raises(NetclError, match=rf"{path.name}: (the gzip data ends early|corrupt gzip data)"):
            read_idx(path)
    # a whole gzip stream of a truncated IDX file: the IDX check names it
    path = tmp_path / "short-body.idx.gz"
    path.write_bytes(gzip.compress(_idx(images)[:40]))
    with pytest.raises(NetclError, match=r"short-body.idx.gz: the header says shape \(5, 4, 3\).*holds 24"):
        read_idx(path)


def test_corrupt_gzip_and_misnamed_files(tmp_path, images):
    blob = bytearray(gzip.compress(_idx(images)))
    blob[-8] ^= 0xFF  # the CRC no longer matches
    (tmp_path / "crc.idx.gz").write_bytes(bytes(blob))
    with pytest.raises(NetclError, match="crc.idx.gz: corrupt gzip data"):
        read_idx(tmp_path / "crc.idx.gz")
    (tmp_path / "raw.idx.gz").write_bytes(_idx(images))
    with pytest.raises(
        NetclError, match=r"raw.idx.gz is named .gz but is not gzip data \(it starts with 00000803\)"
    ):
        read_idx(tmp_path / "raw.idx.gz")


@pytest.mark.parametrize(
    "head,words",
    [
        (b"\x01\x02\x08\x01", "is not an IDX file: it starts with 01020801"),
        (b"<htm", "is not an IDX file: it starts with 3c68746d"),
        (b"\x00\x00\x0a\x01", "is not an IDX file"),
        (b"\x00\x00\x0d\x01", r"holds float32 data \(IDX type 0x0d\); netcl reads unsigned-byte"),
        (b"\x00\x00\x08\x00", "the IDX header says 0 dimensions; netcl reads 1 to 4"),
        (b"\x00\x00\x08\x05", "the IDX header says 5 dimensions"),
        (b"\x00\x00\x08\xff", "the IDX header says 255 dimensions"),
    ],
)
def test_foreign_headers(tmp_path, head, words):
    path = tmp_path / "f.idx"
    path.write_bytes(head + bytes(40))
    with pytest.raises(NetclError, match=rf"f.idx.*{words}"):
        read_idx(path)


def test_header_whose_size_overflows(tmp_path):
    """Four dims of 2**32 - 1: their product overflows 64 bits; the check uses exact integers."""
    path = tmp_path / "big.idx"
    dim = 2**32 - 1
    path.write_bytes(struct.pack(">HBB4I", 0, 8, 4, dim, dim, dim, dim) + bytes(8))
    with pytest.raises(
        NetclError, match=rf"big.idx: the header says shape .*\({dim**4} bytes of data\), the file holds 8"
    ):
        read_idx(path)


def test_extra_bytes_after_the_data(tmp_path, images):
    path = tmp_path / "long.idx"
    path.write_bytes(_idx(images) + b"\x00")
    with pytest.raises(NetclError, match=r"holds 61 \(extra bytes after the data\)"):
        read_idx(path)


def test_read_idx_path_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="none.idx"):
        read_idx(tmp_path / "none.idx")
    with pytest.raises(TypeError, match="path must be a str or a path, got int"):
        read_idx(3)


def _write_dataset(directory, train_images, train_labels, test_images, test_labels):
    names = {
        "train-images-idx3-ubyte": train_images,
        "train-labels-idx1-ubyte": train_labels,
        "t10k-images-idx3-ubyte": test_images,
        "t10k-labels-idx1-ubyte": test_labels,
    }
    for name, a in names.items():
        (directory / name).write_bytes(_idx(np.asarray(a, np.uint8)))


def test_load_idx_dataset_checks_the_files_against_each_other(tmp_path, rng):
    img = rng.integers(0, 256, (6, 28, 28), dtype=np.uint8)
    lab = rng.integers(0, 10, 6, dtype=np.uint8)
    _write_dataset(tmp_path, img, lab, img[:2], lab[:2])
    split = load_idx_dataset("mnist", tmp_path)
    assert split.x_train.shape == (6, 1, 28, 28) and split.y_test.tolist() == lab[:2].tolist()
    bad = [
        (
            (img, lab[:5], img[:2], lab[:2]),
            r"train-labels-idx1-ubyte holds 5 labels, .*train-images-idx3-ubyte 6",
        ),
        (
            (img, np.full(6, 10), img[:2], lab[:2]),
            "train-labels-idx1-ubyte: label 10 is out of range for 10 classes",
        ),
        (
            (img.reshape(6, 784), lab, img[:2], lab[:2]),
            r"train-images-idx3-ubyte: images are \(N, H, W\).*\(6, 784\)",
        ),
        ((img, lab.reshape(2, 3), img[:2], lab[:2]), r"labels are \(N,\), the file holds shape \(2, 3\)"),
        ((img, lab, img[:2, :14], lab[:2]), r"training images are \(28, 28\), test images \(14, 28\)"),
    ]
    for arrays, words in bad:
        _write_dataset(tmp_path, *arrays)
        with pytest.raises(NetclError, match=words):
            load_idx_dataset("mnist", tmp_path)


def test_load_digits_arguments():
    for fraction, error, words in [
        (0.0, ValueError, r"test_fraction must be in \(0, 1\), got 0.0"),
        (1, ValueError, "got 1"),
        (float("nan"), ValueError, "got nan"),
        ("0.2", TypeError, "test_fraction must be a number in \\(0, 1\\), got str"),
        (1e-5, ValueError, "leaves 0 of 1797 samples for testing"),
    ]:
        with pytest.raises(error, match=words):
            load_digits(test_fraction=fraction)
    for seed, error, words in [
        (-1, ValueError, "got -1"),
        (1.5, TypeError, "got float 1.5"),
        (True, TypeError, "got bool True"),
    ]:
        with pytest.raises(error, match=f"load_digits: seed must be an integer >= 0, {words}"):
            load_digits(seed=seed)


def test_locate_arguments(tmp_path):
    with pytest.raises(TypeError, match="name must be a dataset name \\(str\\), got list"):
        locate(["mnist"], tmp_path)
    with pytest.raises(ValueError, match="unknown dataset 'cifar'"):
        locate("cifar", tmp_path)
    with pytest.raises(TypeError, match="data_dir must be a str or a path, got int"):
        locate("mnist", 5)
    with pytest.raises(TypeError, match="download must be True or False, got str 'no'"):
        locate("mnist", None, download="no")


def test_digits_read_from_the_shipped_csv_equal_scikit_learns(monkeypatch, tmp_path):
    """load_digits reads scikit-learn's digits from the CSV the package ships, without importing it (1-2 s,
    once per rank of a job): the same images and targets as sklearn.datasets.load_digits; where the file is
    not there, through scikit-learn; without scikit-learn, DatasetUnavailable naming it."""
    import importlib.util
    import subprocess
    import sys
    from types import SimpleNamespace

    from sklearn.datasets import load_digits as sk_digits

    from netcl.data import DatasetUnavailable, datasets

    want = sk_digits()
    images, target = datasets._digits()
    assert images.dtype == want.images.dtype and images.shape == (1797, 8, 8)
    np.testing.assert_array_equal(images, want.images)
    np.testing.assert_array_equal(target, want.target)
    real = importlib.util.find_spec

    def spec_of(sklearn):
        return lambda name, *rest: sklearn if name == "sklearn" else real(name, *rest)

    # another layout: no shipped file beside the package's __init__ (the import path answers)
    monkeypatch.setattr(importlib.util, "find_spec",
                        spec_of(SimpleNamespace(origin=str(tmp_path / "sklearn" / "__init__.py"))))
    images, target = datasets._digits()
    np.testing.assert_array_equal(images, want.images)
    monkeypatch.setattr(importlib.util, "find_spec", spec_of(None))
    with pytest.raises(DatasetUnavailable, match="pip install scikit-learn"):
        datasets._digits()
    # and the shipped file's path imports no scikit-learn (a fresh interpreter)
    code = ("import sys; from netcl.data import datasets; datasets._digits(); "
            "print('sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
