"""Writing a file whole: `atomic_write` replaces a file so that a reader or a crash sees the old or the new.

The one atomic write of netcl: program binaries and variant verdicts (core), the tuning database
(kernels), checkpoints and model directories (io) and downloaded datasets (data) all go through it.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def _write_bytes(f: Any, data: bytes | bytearray | memoryview) -> None:
    """Write in chunks (one place to inject a failure in tests)."""
    view = memoryview(data)
    for start in range(0, len(view), _CHUNK):
        f.write(view[start : start + _CHUNK])


def _temporary_beside(target: Path) -> tuple[int, str]:
    """A new file next to `target` to write and rename over it: (open descriptor, path). Made with mode 0666
    less the umask, as open() makes files (0644 as a rule), unlike mkstemp's 0600: a model directory's
    weights and config must be as readable as the files written beside them."""
    for _ in range(100):
        tmp = str(target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {target}")


def _fsync_directory(directory: Path) -> None:
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass  # some filesystems cannot fsync a directory; the rename itself is still atomic


def atomic_write(path: str | os.PathLike, data: bytes | bytearray | memoryview, durable: bool = True) -> None:
    """Replace `path` by `data` so that at every instant `path` is either the old or the new file.

    The data goes to a temporary file in the same directory (made as open() makes files), which is
    renamed over `path`; on any error the temporary file is removed and `path` is untouched. With
    `durable` (the default) the file and its directory are fsynced too, so the new file also survives a
    power failure; caches that can be rebuilt pass durable=False and skip the two syncs.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"atomic_write: path must be a str or a path, got {type(path).__name__}")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"atomic_write: data must be bytes, got {type(data).__name__}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temporary_beside(target)
    try:
        with os.fdopen(fd, "wb") as f:
            _write_bytes(f, data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        _fsync_directory(target.parent)
