"""Datasets as host arrays: scikit-learn's bundled digits, and (Fashion-)MNIST from IDX files.

IDX files (gz or raw) are looked for in: the directory given, the Debian package
dataset-fashion-mnist's /usr/share/datasets/fashion-mnist (Fashion-MNIST only), and netcl's cache
directory, where they are downloaded when the network allows.
"""

from __future__ import annotations

import gzip
import importlib.util
import math
import numbers
import os
import struct
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from netcl import config
from netcl.core.files import atomic_write
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


def _digits() -> tuple[np.ndarray, np.ndarray]:
    """(images (1797, 8, 8) float64, targets) of scikit-learn's digits: read from the CSV the package ships
    (datasets/data/digits.csv.gz, found without importing scikit-learn, which takes 1-2 s: each rank of a
    `netcl run` job loads the digits), else through sklearn.datasets.load_digits; the same values either
    way."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise DatasetUnavailable("the digits dataset needs scikit-learn: pip install scikit-learn")
    shipped = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    try:
        table = np.loadtxt(shipped, delimiter=",", dtype=np.float64)
        if table.ndim == 2 and table.shape[1] == 65:
            return table[:, :64].reshape(-1, 8, 8), table[:, 64].astype(np.int64)
    except (OSError, ValueError):  # another layout of the package: ask it
        pass
    try:
        from sklearn.datasets import load_digits as sk_digits  # noqa: PLC0415
    except ImportError as exc:
        raise DatasetUnavailable("the digits dataset needs scikit-learn: pip install scikit-learn") from exc
    d = sk_digits()
    return d.images, d.target


def load_digits(test_fraction: float = 0.2, seed: int = 0) -> Split:
    """scikit-learn's 1797 8x8 digits (0..16 scaled to [0, 1], then standardised), a fixed split.

    test_fraction is a number in (0, 1) that leaves both splits non-empty; seed an integer >= 0."""
    if not isinstance(test_fraction, numbers.Real) or isinstance(test_fraction, (bool, np.bool_)):
        raise TypeError(
            f"load_digits: test_fraction must be a number in (0, 1), got {type(test_fraction).__name__}"
        )
    if not 0 < test_fraction < 1:
        raise ValueError(f"load_digits: test_fraction must be in (0, 1), got {test_fraction!r}")
    if not isinstance(seed, numbers.Integral) or isinstance(seed, (bool, np.bool_)):
        raise TypeError(f"load_digits: seed must be an integer >= 0, got {type(seed).__name__} {seed!r}")
    if seed < 0:
        raise ValueError(f"load_digits: seed must be an integer >= 0, got {seed}")
    images, target = _digits()
    x = (images.astype(np.float32) / 16.0)[:, None, :, :]
    y = target.astype(np.int32)
    perm = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    if not 0 < n_test < len(y):
        raise ValueError(
            f"load_digits: test_fraction={test_fraction!r} leaves {n_test} of {len(y)} samples for testing; "
            "both splits need at least one"
        )
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


# IDX data type codes (the third byte of the magic number); netcl reads unsigned bytes
_IDX_TYPES = {
    0x08: "unsigned byte",
    0x09: "signed byte",
    0x0B: "int16",
    0x0C: "int32",
    0x0D: "float32",
    0x0E: "float64",
}
_IDX_MAX_DIMS = 4


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """An IDX array (ubyte data, 1 to 4 dimensions), gzip-compressed (told by its first bytes) or raw.

    A file that is truncated, corrupt, or not an unsigned-byte IDX file raises NetclError naming the
    file, what its header promised and what it holds."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"read_idx: path must be a str or a path, got {type(path).__name__}")
    p = Path(path)
    raw = p.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(raw)
        except EOFError:
            raise NetclError(
                f"{p}: the gzip data ends early (the file is truncated at {len(raw)} bytes); "
                "get the file again"
            ) from None
        except (OSError, zlib.error) as exc:
            raise NetclError(f"{p}: corrupt gzip data ({exc}); get the file again") from None
    elif p.suffix == ".gz":
        raise NetclError(
            f"{p} is named .gz but is not gzip data (it starts with {raw[:4].hex() or 'nothing'})"
        )
    else:
        data = raw
    if len(data) < 4:
        raise NetclError(
            f"{p} is too short to be an IDX file: {len(data)} bytes, the header alone needs 4 or more"
        )
    code, ndim = data[2], data[3]
    if data[:2] != b"\0\0" or code not in _IDX_TYPES:
        raise NetclError(
            f"{p} is not an IDX file: it starts with {data[:4].hex()}, an IDX file with 0000 and a type"
        )
    if code != 0x08:
        raise NetclError(
            f"{p} holds {_IDX_TYPES[code]} data (IDX type 0x{code:02x}); netcl reads unsigned-byte "
            "(0x08) IDX files"
        )
    if not 1 <= ndim <= _IDX_MAX_DIMS:
        raise NetclError(f"{p}: the IDX header says {ndim} dimensions; netcl reads 1 to {_IDX_MAX_DIMS}")
    start = 4 + 4 * ndim
    if len(data) < start:
        raise NetclError(
            f"{p} is truncated: a {ndim}-dimensional IDX header "
            f"needs {start} bytes, the file holds {len(data)}"
        )
    dims = struct.unpack(f">{ndim}I", data[4:start])
    expected = math.prod(dims)
    found = len(data) - start
    if found != expected:
        why = "truncated" if found < expected else "extra bytes after the data"
        raise NetclError(
            f"{p}: the header says shape {dims} ({expected} bytes of data), the file holds {found} ({why})"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=start).reshape(dims)


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
        with urllib.request.urlopen(_URLS[name] + stem + ".gz", timeout=20) as r:
            atomic_write(dest, r.read())
    found = _find(target)
    assert found is not None
    return found


def locate(name: str, data_dir: str | os.PathLike | None = None, download: bool = True) -> dict[str, Path]:
    """Paths of the four IDX files of `name` ('fashion-mnist' or 'mnist'), or DatasetUnavailable.

    With `data_dir`, only that directory (and its `name` subdirectory) is searched, and nothing is
    downloaded: data the caller pointed at is never silently replaced by another copy."""
    if not isinstance(name, str):
        raise TypeError(f"locate: name must be a dataset name (str), got {type(name).__name__}")
    if name not in _URLS:
        raise ValueError(f"unknown dataset {name!r}; known: {sorted(_URLS)}")
    if data_dir is not None and not isinstance(data_dir, (str, os.PathLike)):
        raise TypeError(f"locate: data_dir must be a str or a path, got {type(data_dir).__name__}")
    if not isinstance(download, (bool, np.bool_)):
        raise TypeError(f"locate: download must be True or False, got {type(download).__name__} {download!r}")
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
        f"{', '.join(str(p) for p in places)} and {reason}. Put them in a directory and pass "
        f"--data-dir{hint}."
    )


def load_idx_dataset(name: str, data_dir: str | os.PathLike | None = None, download: bool = True) -> Split:
    """(Fashion-)MNIST as standardised float32 images (N, 1, 28, 28) and int32 labels."""
    files = locate(name, data_dir, download)
    mean, std = _STATS[name]
    arrays = {k: read_idx(p) for k, p in files.items()}
    _check_split(files, arrays, classes=10)

    def images(a: np.ndarray) -> np.ndarray:
        return ((a.astype(np.float32) / 255.0 - mean) / std)[:, None, :, :]

    return Split(
        name,
        images(arrays["train_images"]),
        arrays["train_labels"].astype(np.int32),
        images(arrays["test_images"]),
        arrays["test_labels"].astype(np.int32),
    )


def _check_split(files: dict[str, Path], arrays: dict[str, np.ndarray], classes: int) -> None:
    """Images (N, H, W) with N labels in [0, classes) per split, one image size for both splits."""
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.ndim != 3:
            raise NetclError(
                f"{files[f'{split}_images']}: images are (N, H, W), the file holds shape {images.shape}"
            )
        if labels.ndim != 1:
            raise NetclError(
                f"{files[f'{split}_labels']}: labels are (N,), the file holds shape {labels.shape}"
            )
        if len(labels) != len(images):
            raise NetclError(
                f"{files[f'{split}_labels']} holds {len(labels)} labels, {files[f'{split}_images']} "
                f"{len(images)} images"
            )
        if labels.size and int(labels.max()) >= classes:
            raise NetclError(
                f"{files[f'{split}_labels']}: label {int(labels.max())} is out of range for {classes} classes"
            )
    train, test = arrays["train_images"].shape[1:], arrays["test_images"].shape[1:]
    if train != test:
        raise NetclError(f"training images are {train}, test images {test} ({files['test_images']})")


def load_fashion_mnist(data_dir: str | os.PathLike | None = None, download: bool = True) -> Split:
    return load_idx_dataset("fashion-mnist", data_dir, download)


def load_mnist(data_dir: str | os.PathLike | None = None, download: bool = True) -> Split:
    return load_idx_dataset("mnist", data_dir, download)
