"""Every NETCL_* environment knob, read in this one place (see the README's table)."""

from __future__ import annotations

import os
from pathlib import Path


_ENV_DATA = getattr(os.environ, "_data", None) if os.name == "posix" else None


def env(name: str, default: str | None = None) -> str | None:
    """os.environ.get(name, default), about 10x cheaper on POSIX (launches read NETCL_DEBUG each
    time): the environment mapping's own bytes dict, which os.environ and monkeypatch keep current."""
    if isinstance(_ENV_DATA, dict):
        raw = _ENV_DATA.get(name.encode())
        return default if raw is None else raw.decode("utf-8", "surrogateescape")
    return os.environ.get(name, default)


def _flag(name: str, default: bool = False) -> bool:
    raw = env(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() not in ("0", "false", "no", "off")


def _int(name: str, default: int) -> int:
    raw = env(name, "")
    try:
        return int(raw) if raw.strip() else default
    except ValueError:
        return default


def device_spec() -> str | None:
    """NETCL_DEVICE: `gpu`, `cpu`, `accelerator`, a name fragment, or `P:D`; None when unset."""
    raw = os.environ.get("NETCL_DEVICE", "").strip()
    return raw or None


def profiling() -> bool:
    """NETCL_PROFILE=1: time every launch with OpenCL events (queues made after it is set)."""
    return _flag("NETCL_PROFILE")


def debug_level() -> int:
    """NETCL_DEBUG: 0 silent, 1 print each launch, 2 also print generated source."""
    return _int("NETCL_DEBUG", 0)


def fusion_enabled() -> bool:
    """NETCL_FUSION=0 turns automatic elementwise fusion off (results are identical)."""
    return _flag("NETCL_FUSION", True)


def disk_cache_enabled() -> bool:
    """NETCL_DISK_CACHE=0 stops netcl storing and loading program binaries on disk."""
    return _flag("NETCL_DISK_CACHE", True)


def cache_dir() -> Path:
    """NETCL_CACHE_DIR: where program binaries and tuning results live (default: the user cache)."""
    raw = env("NETCL_CACHE_DIR", "").strip()
    if raw:
        return Path(raw).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("netcl"))


def tuning_enabled() -> bool:
    """NETCL_TUNING=0 ignores the tuning database (kernels use their per-device defaults)."""
    return _flag("NETCL_TUNING", True)
