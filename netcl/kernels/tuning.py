"""The per-device tuning database (what `netcl tune` measured, read by the ops that pick kernel parameters):
one JSON file per device under config.cache_dir()/tuning.

Entries are keyed by kernel family (e.g. "gemm_tiled") and a problem key (e.g. "float32"); each holds
the winning define set and what was measured. Files are written atomically (temp file + rename), so a
crash never leaves a half-written database, and a file that cannot be parsed is treated as absent.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

from netcl import config
from netcl.core import capture
from netcl.core.files import atomic_write

FORMAT_VERSION = 1


def device_fingerprint(device: Any) -> str:
    """Platform, device name and driver version: what a tuned result is valid for."""
    d = device.cl_device
    return " | ".join(
        s.strip() for s in (device.platform_name, d.name, d.driver_version, d.version)
    )


def device_key(device: Any) -> str:
    """A file-name-safe key: readable device name plus a hash of the whole fingerprint."""
    fp = device_fingerprint(device)
    name = re.sub(r"[^A-Za-z0-9]+", "-", device.device_name).strip("-").lower()[:48] or "device"
    return f"{name}-{hashlib.sha256(fp.encode()).hexdigest()[:12]}"


class TuningDatabase:
    """Winning configurations for one device, backed by one JSON file."""

    def __init__(self, path: Path, fingerprint: str):
        self.path = path
        self.fingerprint = fingerprint
        self._lock = threading.Lock()
        self._data: dict[str, Any] | None = None
        self._mtime: float | None = None

    def _load(self) -> dict[str, Any]:
        try:
            mtime = self.path.stat().st_mtime
        except OSError:
            mtime = None
        if self._data is not None and mtime == self._mtime:
            return self._data
        data: dict[str, Any] = {"version": FORMAT_VERSION, "device": self.fingerprint, "entries": {}}
        if mtime is not None:
            try:
                loaded = json.loads(self.path.read_text())
                if (
                    isinstance(loaded, dict)
                    and loaded.get("version") == FORMAT_VERSION
                    and isinstance(loaded.get("entries"), dict)
                ):
                    data = loaded
            except (OSError, ValueError):
                pass  # unreadable or corrupt: behave as if there were no database
        self._data, self._mtime = data, mtime
        capture.plans.invalidate()  # plans built on what this database said before (netcl.core.capture)
        return data

    def get(self, family: str, key: str) -> dict[str, Any] | None:
        """The stored define set for (family, key), or None."""
        with self._lock:
            entry = self._load()["entries"].get(f"{family}/{key}")
        if isinstance(entry, dict) and isinstance(entry.get("params"), dict):
            return dict(entry["params"])
        return None

    def entries(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._load()["entries"])

    def put(self, family: str, key: str, params: dict[str, Any], **measured: Any) -> None:
        """Store (family, key) -> params with what was measured, and write the file atomically."""
        with self._lock:
            data = self._load()
            data["entries"][f"{family}/{key}"] = {
                "params": dict(params),
                "measured": measured,
                "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
            data["device"] = self.fingerprint
            self._write(data)

    def remove(self, family: str, key: str | None = None) -> None:
        """Forget one entry, or every entry of a family when key is None."""
        with self._lock:
            data = self._load()
            prefix = f"{family}/"
            for name in list(data["entries"]):
                if (key is None and name.startswith(prefix)) or name == f"{family}/{key}":
                    del data["entries"][name]
            self._write(data)

    def _write(self, data: dict[str, Any]) -> None:
        atomic_write(self.path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())
        self._data = data
        try:
            self._mtime = self.path.stat().st_mtime
        except OSError:
            self._mtime = None
        capture.plans.invalidate()


_databases: dict[tuple[int, str], TuningDatabase] = {}
_db_lock = threading.Lock()


def tuning_dir() -> Path:
    return config.cache_dir() / "tuning"


def database_for(device: Any) -> TuningDatabase:
    """The database of `device` (a DeviceHandle); the file need not exist yet."""
    path = tuning_dir() / f"{device_key(device)}.json"
    key = (id(device), str(path))
    with _db_lock:
        db = _databases.get(key)
        if db is None:
            db = TuningDatabase(path, device_fingerprint(device))
            _databases[key] = db
        return db


# The database the ops read, per device and cache directory: an op asks on every call (a training step
# calls gemm a few times per step) and resolving the file's path costs ~0.3 ms.
_active: dict[tuple, TuningDatabase] = {}


def active_database(device: Any) -> TuningDatabase | None:
    """The database the ops read for `device`, or None when NETCL_TUNING=0. The object re-reads its file
    when it changes on disk."""
    if not config.tuning_enabled():
        return None
    key = (id(device), config.env("NETCL_CACHE_DIR", ""))
    db = _active.get(key)
    if db is None:
        db = _active[key] = database_for(device)
    return db


def state(device: Any) -> tuple:
    """What a cached choice made from the database depends on: which database, and its file's mtime as
    last read in this process (part of the convolution algorithm keys; launch plans are dropped instead
    when the database changes: netcl.core.capture.plans)."""
    db = active_database(device)
    return (id(db), getattr(db, "_mtime", None))


def lookup(device: Any, family: str, key: str) -> dict[str, Any] | None:
    """Tuned defines for (family, key) on `device`, or None (then callers use their defaults)."""
    db = active_database(device)
    return None if db is None else db.get(family, key)
