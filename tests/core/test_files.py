"""core/files.py: atomic_write leaves the old file or the new one, never a part, and no temporary file."""

from __future__ import annotations

import os

import numpy as np
import pytest

import netcl.core.files as files
from netcl.core.files import atomic_write


@pytest.mark.parametrize("durable", [True, False])
@pytest.mark.parametrize("size", [0, 1, 17, (1 << 20) + 3])
def test_atomic_write_replaces_the_file_whole(tmp_path, durable, size):
    rng = np.random.default_rng(size)
    data = rng.integers(0, 256, size, dtype="uint8").tobytes()
    target = tmp_path / "sub" / "dir" / "f.bin"  # missing parents are made
    atomic_write(target, b"old")
    atomic_write(target, data, durable=durable)
    assert target.read_bytes() == data
    assert sorted(p.name for p in target.parent.iterdir()) == ["f.bin"]


def test_atomic_write_takes_bytearray_and_memoryview(tmp_path):
    atomic_write(tmp_path / "a", bytearray(b"abc"))
    atomic_write(str(tmp_path / "b"), memoryview(b"xyz")[1:])
    assert (tmp_path / "a").read_bytes() == b"abc"
    assert (tmp_path / "b").read_bytes() == b"yz"


@pytest.mark.parametrize("durable", [True, False])
def test_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path, monkeypatch, durable):
    target = tmp_path / "f.json"
    target.write_bytes(b"{}")

    def broken(f, data):
        f.write(bytes(data[:3]))
        raise OSError("disk full (injected)")

    monkeypatch.setattr(files, "_write_bytes", broken)
    with pytest.raises(OSError, match="injected"):
        atomic_write(target, b'{"a": 1}', durable=durable)
    assert target.read_bytes() == b"{}"
    assert os.listdir(tmp_path) == ["f.json"]


def test_atomic_write_arguments(tmp_path):
    with pytest.raises(TypeError, match="data must be bytes, got str"):
        atomic_write(tmp_path / "f", "text")
    with pytest.raises(TypeError, match="path must be a str or a path, got NoneType"):
        atomic_write(None, b"x")
    assert list(tmp_path.iterdir()) == []
