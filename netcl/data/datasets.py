"""Datasets as host arrays: scikit-learn's bundled digits, and (Fashion-)MNIST from IDX files.

IDX files (gz or raw) are looked for in: the directory given, the Debian package
dataset-fashion-mnist's /usr/share/datasets/fashion-mnist (Fashion-MNIST only), and netcl's cache
directory, where they are downloaded when the network allows.
"""

from __future__ import annotations

import gzip
import os
import struct
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from netcl import config
from netcl.errors import NetclError


class DatasetUnavailable(NetclError):
    """A dataset's files are not on this machine and could not be downloaded."""


@dataclass
class Split:
    """Images (N, 1, H, W) float32 and labels (N,) int32 of a train and a test split."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int = 10

    @property
    def image_shape(self) -> tuple[int, ...]:
        return self.x_train.shape[1:]


def load_digits(test_fraction: float = 0.2, seed: int = 0) -> Split:
    """scikit-learn's 1797 8x8 digits (0..16 scaled to [0, 1], then standardised), a fixed split."""
    try:
        from sklearn.datasets import load_digits as sk_digits
    except ImportError as exc:
        raise DatasetUnavailable("the digits dataset needs scikit-learn: pip install scikit-learn") from exc
    d = sk_digits()
    x = (d.images.astype(np.float32) / 16.0)[:, None, :, :]
    y = d.target.astype(np.int32)
    perm = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    test, train = perm[:n_test], perm[n_test:]
    mean, std = x[train].mean(), x[train].std()
    x = (x - mean) / std
    return Split("digits", x[train], y[train], x[test], y[test])


_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
_URLS = {
    "fashion-mnist": "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "mnist": "https://ossci-datasets.s3.amazonaws.com/mnist/",
}
_SYSTEM_DIRS = {"fashion-mnist": [Path("/usr/share/datasets/fashion-mnist")], "mnist": []}
# per-pixel statistics of the training sets, for standardisation
_STATS = {"fashion-mnist": (0.2860, 0.3530), "mnist": (0.1307, 0.3081)}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """An IDX array (ubyte data), gzip-compressed or raw."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rb") as f:
        data = f.read()
    if len(data) < 4:
        raise NetclError(f"{p} is too short to be an IDX file")
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise NetclError(f"{p} is not an unsigned-byte IDX file (magic {data[:4].hex()})")
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise NetclError(f"{p}: header says {dims} ({int(np.prod(dims))} bytes), file holds {body.size}")
    return body.reshape(dims)


def _find(directory: Path) -> dict[str, Path] | None:
    found = {}
    for key, stem in _FILES.items():
        for candidate in (directory / (stem + ".gz"), directory / stem):
            if candidate.exists():
                found[key] = candidate
                break
        else:
            return None
    return found


def _download(name: str, target: Path) -> dict[str, Path]:
    target.mkdir(parents=True, exist_ok=True)
    for stem in _FILES.values():
        dest = target / (stem + ".gz")
        if dest.exists():
            continue
        tmp = dest.with_suffix(".part")
        with urllib.request.urlopen(_URLS[name] + stem + ".gz", timeout=20) as r, open(tmp, "wb") as f:
            f.write(r.read())
        os.replace(tmp, dest)
    found = _find(target)
    assert found is not None
    return found


def locate(name: str, data_dir: str | os.PathLike | None = None, download: bool = True) -> dict[str, Path]:
    """Paths of the four IDX files of `name` ('fashion-mnist' or 'mnist'), or DatasetUnavailable.

    With `data_dir`, only that directory (and its `name` subdirectory) is searched, and nothing is
    downloaded: data the caller pointed at is never silently replaced by another copy."""
    if name not in _URLS:
        raise ValueError(f"unknown dataset {name!r}; known: {sorted(_URLS)}")
    if data_dir is not None:
        places = [Path(data_dir), Path(data_dir) / name]
        for place in places:
            found = _find(place)
            if found:
                return found
        raise DatasetUnavailable(
            f"{name} IDX files ({', '.join(s + '[.gz]' for s in _FILES.values())}) are not in {data_dir} "
            f"(nor in {places[1]})"
        )
    cache = config.cache_dir() / "datasets" / name
    places = _SYSTEM_DIRS[name] + [cache]
    for place in places:
        found = _find(place)
        if found:
            return found
    if download:
        try:
            return _download(name, cache)
        except OSError as exc:
            reason = f"download failed ({exc})"
    else:
        reason = "downloading is off"
    hint = " or `apt-get install dataset-fashion-mnist`" if name == "fashion-mnist" else ""
    raise DatasetUnavailable(
        f"{name} IDX files ({', '.join(s + '[.gz]' for s in _FILES.values())}) were not found in "
        f"{', '.join(str(p) for p in places)} and {reason}. Put them in a directory and pass --data-dir{hint}."
    )


def load_idx_dataset(name: str, data_dir: str | os.PathLike | None = None, download: bool = True) -> Split:
    """(Fashion-)MNIST as standardised float32 images (N, 1, 28, 28) and int32 labels."""
    files = locate(name, data_dir, download)
    mean, std = _STATS[name]
    arrays = {k: read_idx(p) for k, p in files.items()}

    def images(a: np.ndarray) -> np.ndarray:
        return ((a.astype(np.float32) / 255.0 - mean) / std)[:, None, :, :]

    return Split(
        name,
        images(arrays["train_images"]),
        arrays["train_labels"].astype(np.int32),
        images(arrays["test_images"]),
        arrays["test_labels"].astype(np.int32),
    )


def load_fashion_mnist(data_dir: str | os.PathLike | None = None, download: bool = True) -> Split:
    return load_idx_dataset("fashion-mnist", data_dir, download)


def load_mnist(data_dir: str | os.PathLike | None = None, download: bool = True) -> Split:
    return load_idx_dataset("mnist", data_dir, download)
