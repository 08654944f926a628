"""Checkpoints: model + optimizer + scheduler + step + RNG state in one safetensors file.

Tensors go in as safetensors tensors ('model/<dotted key>', 'optim/<param index>/<state name>');
everything else (hyperparameters, steps, scheduler, RNG, user extras) is JSON in the header's
metadata under 'netcl'. Nothing is ever unpickled. Writes are atomic: a temporary file in the same
directory, fsync, rename, fsync of the directory, so a crash mid-save leaves the previous
checkpoint intact. Loading checks names, shapes and dtypes and refuses anything else.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from netcl.core import random
from netcl.core.tensor import Tensor
from netcl.errors import NetclError

FORMAT = "netcl-checkpoint-1"
_CHUNK = 1 << 20


class CheckpointError(NetclError):
    """A checkpoint file is unreadable, of another format, or does not match what it is loaded into."""


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def _write_bytes(f: Any, data: bytes) -> None:
    """Write in chunks (one place to inject a failure in tests)."""
    view = memoryview(data)
    for start in range(0, len(view), _CHUNK):
        f.write(view[start : start + _CHUNK])


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Replace `path` by `data` so that at every instant `path` is either the old or the new file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            _write_bytes(f, data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass  # some filesystems cannot fsync a directory; the rename itself is still atomic


def _host(t: Any) -> np.ndarray:
    arr = t.to_host() if isinstance(t, Tensor) else np.asarray(t)
    return np.ascontiguousarray(arr)


def save_checkpoint(
    path: str | os.PathLike,
    model: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    step: int = 0,
    epoch: int = 0,
    loader: Any = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write everything needed to resume training to `path` (atomically)."""
    tensors: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {"format": FORMAT, "step": int(step), "epoch": int(epoch), "extra": extra or {}}
    if model is not None:
        for key, t in model.state_dict().items():
            tensors[f"model/{key}"] = _host(t)
        meta["model_keys"] = list(model.state_dict().keys())
    if optimizer is not None:
        sd = optimizer.state_dict()
        optim_meta: dict[str, Any] = {
            "type": type(optimizer).__name__,
            "param_groups": sd["param_groups"],
            "state": {},
        }
        for idx, st in sd["state"].items():
            entry = {}
            for name, value in st.items():
                if isinstance(value, np.ndarray):
                    tensors[f"optim/{idx}/{name}"] = np.ascontiguousarray(value)
                else:
                    entry[name] = value
            optim_meta["state"][str(idx)] = entry
        meta["optimizer"] = optim_meta
    if scheduler is not None:
        meta["scheduler"] = {"type": type(scheduler).__name__, "state": scheduler.state_dict()}
    if loader is not None:
        meta["loader"] = loader.state_dict()
    meta["rng"] = {"netcl": random.default_generator.state_dict()}
    header = {"netcl": json.dumps(meta, default=_json_default)}
    atomic_write(path, st_save(tensors, metadata=header))


def read_checkpoint(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(tensors, metadata) of a checkpoint file, validated as netcl's format."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {p}") from None
    try:
        tensors = st_load(data)
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + n])
    except (SafetensorError, ValueError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{p} is not a readable safetensors file: {exc}") from None
    raw = (header.get("__metadata__") or {}).get("netcl")
    if raw is None:
        raise CheckpointError(f"{p} is a safetensors file but not a netcl checkpoint (no 'netcl' metadata)")
    meta = json.loads(raw)
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{p} has format {meta.get('format')!r}, this netcl reads {FORMAT!r}")
    return tensors, meta


def load_checkpoint(
    path: str | os.PathLike,
    model: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    loader: Any = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Restore what was saved into the given objects; returns the metadata (step, epoch, extra...).

    Every check (model keys, shapes, dtypes; optimizer type and state shapes) runs before the
    model is touched; a mismatch raises CheckpointError naming what differs."""
    tensors, meta = read_checkpoint(path)
    if model is not None:
        if "model_keys" not in meta:
            raise CheckpointError(f"{path} holds no model")
        state = {k[len("model/") :]: v for k, v in tensors.items() if k.startswith("model/")}
        own = model.state_dict()
        problems = []
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        if missing:
            problems.append(f"missing keys: {', '.join(missing)}")
        if unexpected:
            problems.append(f"unexpected keys: {', '.join(unexpected)}")
        for k, t in own.items():
            if k in state:
                a = state[k]
                if a.shape != t.shape:
                    problems.append(f"{k}: shape {a.shape} in the checkpoint, {t.shape} in the model")
                elif a.dtype != t.dtype:
                    problems.append(f"{k}: dtype {a.dtype} in the checkpoint, {t.dtype} in the model")
        if problems:
            raise CheckpointError(
                f"checkpoint {path} does not fit {type(model).__name__}:\n  " + "\n  ".join(problems)
            )
    if optimizer is not None:
        om = meta.get("optimizer")
        if om is None:
            raise CheckpointError(f"{path} holds no optimizer state")
        if om["type"] != type(optimizer).__name__:
            raise CheckpointError(f"{path} holds {om['type']} state, not {type(optimizer).__name__}")
    if scheduler is not None:
        sm = meta.get("scheduler")
        if sm is None or sm["type"] != type(scheduler).__name__:
            found = sm["type"] if sm else "none"
            raise CheckpointError(f"{path} holds scheduler {found}, not {type(scheduler).__name__}")
    if model is not None:
        model.load_state_dict(state)
    if optimizer is not None:
        opt_state: dict[int, dict[str, Any]] = {int(i): dict(v) for i, v in om["state"].items()}
        for key, arr in tensors.items():
            if key.startswith("optim/"):
                _, idx, name = key.split("/", 2)
                opt_state.setdefault(int(idx), {})[name] = arr
        groups = om["param_groups"]
        for g in groups:
            if "betas" in g:
                g["betas"] = tuple(g["betas"])
        try:
            optimizer.load_state_dict({"state": opt_state, "param_groups": groups})
        except (ValueError, KeyError) as exc:
            raise CheckpointError(f"optimizer state in {path} does not fit: {exc}") from None
    if scheduler is not None:
        scheduler.load_state_dict(meta["scheduler"]["state"])
    if loader is not None and "loader" in meta:
        loader.load_state_dict(meta["loader"])
    if restore_rng and "rng" in meta:
        random.default_generator.load_state_dict(meta["rng"]["netcl"])
    return meta
