"""Checkpoints: model + optimizer + scheduler + step + RNG state in one safetensors file.

Tensors go in as safetensors tensors ('model/<dotted key>', 'optim/<param index>/<state name>');
everything else (hyperparameters, steps, scheduler, RNG, user extras) is JSON in the header's
metadata under 'netcl'. Nothing is ever unpickled. Writes are atomic (`core.files.atomic_write`: a
temporary file in the same directory, fsync, rename, fsync of the directory), so a crash mid-save leaves
the previous checkpoint intact. Loading checks names, shapes and dtypes and refuses anything else.
"""

from __future__ import annotations

import json
import numbers
import os
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from netcl.core.files import atomic_write
from netcl.core.tensor import Tensor
from netcl.errors import NetclError
from netcl.ops import random

FORMAT = "netcl-checkpoint-1"


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
    """Write everything needed to resume training to `path` (atomically).

    step and epoch are integers >= 0; extra is a dict of JSON values (it comes back as JSON gives it)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"save_checkpoint: path must be a str or a path, got {type(path).__name__}")
    step = _count(step, "save_checkpoint: step")
    epoch = _count(epoch, "save_checkpoint: epoch")
    if extra is not None and not isinstance(extra, dict):
        raise TypeError(f"save_checkpoint: extra must be a dict (or None), got {type(extra).__name__}")
    for name, obj in (
        ("model", model),
        ("optimizer", optimizer),
        ("scheduler", scheduler),
        ("loader", loader),
    ):
        if obj is not None and not callable(getattr(obj, "state_dict", None)):
            raise TypeError(f"save_checkpoint: {name} has no state_dict() ({type(obj).__name__})")
    tensors: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {"format": FORMAT, "step": step, "epoch": epoch, "extra": extra or {}}
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
    try:
        header = {"netcl": json.dumps(meta, default=_json_default)}
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"save_checkpoint: the metadata (extra, hyperparameters, states) is not JSON: {exc}"
        ) from None
    atomic_write(path, st_save(tensors, metadata=header))


def _count(value: Any, what: str) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be an integer >= 0, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{what} must be an integer >= 0, got {value!r}")
    return int(value)


def read_checkpoint(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(tensors, metadata) of a checkpoint file, validated as netcl's format: every field netcl
    writes is there with the right type, and the tensors are the ones the metadata lists.
    Anything else raises CheckpointError naming the file and the field."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"read_checkpoint: path must be a str or a path, got {type(path).__name__}")
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {p}") from None
    except IsADirectoryError:
        raise CheckpointError(f"{p} is a directory, not a checkpoint file") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read the checkpoint {p}: {exc.strerror or exc}") from None
    if len(data) < 8:
        raise CheckpointError(
            f"{p} is not a readable safetensors file: {len(data)} bytes, not even the 8-byte header length"
        )
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        raise CheckpointError(
            f"{p} is not a readable safetensors file (truncated?): its header is {n} bytes, the file "
            f"holds {len(data) - 8} after the length"
        )
    try:
        header = json.loads(data[8 : 8 + n])
        tensors = st_load(data)
    except (SafetensorError, ValueError, KeyError, TypeError, OverflowError) as exc:
        raise CheckpointError(f"{p} is not a readable safetensors file: {exc}") from None
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    raw = (metadata or {}).get("netcl")
    if raw is None:
        raise CheckpointError(f"{p} is a safetensors file but not a netcl checkpoint (no 'netcl' metadata)")
    try:
        meta = json.loads(raw)
    except ValueError as exc:
        raise CheckpointError(f"{p}: the 'netcl' metadata is not JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{p}: the 'netcl' metadata is a JSON {type(meta).__name__}, not an object")
    if meta.get("format") != FORMAT:
        raise CheckpointError(
            f"{p} has format {meta.get('format')!r} (field 'format'), this netcl reads {FORMAT!r}"
        )
    _check_meta(p, meta, tensors)
    return tensors, meta


def _bad(path: Path, field: str, what: str) -> CheckpointError:
    return CheckpointError(f"{path}: field '{field}' of the checkpoint metadata {what}")


def _require(
    path: Path, meta: dict[str, Any], field: str, kind: type | tuple[type, ...], where: str = ""
) -> Any:
    name = f"{where}.{field}" if where else field
    if field not in meta:
        raise _bad(path, name, "is missing")
    value = meta[field]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        raise _bad(
            path, name, f"must be {' or '.join(k.__name__ for k in kinds)}, got {type(value).__name__}"
        )
    return value


_FIELDS = ("format", "step", "epoch", "extra", "model_keys", "optimizer", "scheduler", "loader", "rng")


def _check_meta(path: Path, meta: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    """Structure of netcl's metadata: the fields save_checkpoint writes, with their types."""
    unknown = [k for k in meta if k not in _FIELDS]
    if unknown:
        raise _bad(path, unknown[0], f"is not one netcl writes (it writes {', '.join(_FIELDS)})")
    for field in ("step", "epoch"):
        if _require(path, meta, field, int) < 0:
            raise _bad(path, field, f"must be >= 0, got {meta[field]}")
    _require(path, meta, "extra", dict)
    rng = _require(path, meta, "rng", dict)
    gen = _require(path, rng, "netcl", dict, "rng")
    for field in ("seed", "counter"):
        value = _require(path, gen, field, int, "rng.netcl")
        if not 0 <= value < 2**64:
            raise _bad(path, f"rng.netcl.{field}", f"must be in [0, 2**64), got {value}")
    model_tensors = {k[len("model/") :] for k in tensors if k.startswith("model/")}
    optim_tensors = [k for k in tensors if k.startswith("optim/")]
    strays = [k for k in tensors if not k.startswith(("model/", "optim/"))]
    if strays:
        raise CheckpointError(
            f"{path} holds tensor {strays[0]!r}, which is neither 'model/...' nor 'optim/...'"
        )
    if "model_keys" in meta:
        keys = _require(path, meta, "model_keys", list)
        if not all(isinstance(k, str) for k in keys) or len(set(keys)) != len(keys):
            raise _bad(path, "model_keys", "must be a list of distinct names")
        missing = [k for k in keys if k not in model_tensors]
        if missing:
            raise _bad(
                path, "model_keys", f"lists {missing[0]!r}, but the file has no tensor 'model/{missing[0]}'"
            )
        unlisted = sorted(model_tensors - set(keys))
        if unlisted:
            raise _bad(path, "model_keys", f"does not list the tensor 'model/{unlisted[0]}' the file holds")
    elif model_tensors:
        raise _bad(
            path, "model_keys", f"is missing, but the file holds model tensors ('model/{min(model_tensors)}')"
        )
    if "optimizer" in meta:
        _check_optimizer_meta(path, _require(path, meta, "optimizer", dict), optim_tensors)
    elif optim_tensors:
        raise _bad(
            path, "optimizer", f"is missing, but the file holds optimizer tensors ({optim_tensors[0]!r})"
        )
    if "scheduler" in meta:
        sched = _require(path, meta, "scheduler", dict)
        _require(path, sched, "type", str, "scheduler")
        _require(path, sched, "state", dict, "scheduler")
    if "loader" in meta:
        _require(path, meta, "loader", dict)


def _check_optimizer_meta(path: Path, om: dict[str, Any], optim_tensors: list[str]) -> None:
    _require(path, om, "type", str, "optimizer")
    groups = _require(path, om, "param_groups", list, "optimizer")
    listed: set[int] = set()
    for i, g in enumerate(groups):
        if not isinstance(g, dict):
            raise _bad(path, f"optimizer.param_groups[{i}]", f"must be an object, got {type(g).__name__}")
        indices = _require(path, g, "params", list, f"optimizer.param_groups[{i}]")
        if not all(isinstance(j, int) and not isinstance(j, bool) and j >= 0 for j in indices):
            raise _bad(path, f"optimizer.param_groups[{i}].params", "must be a list of parameter indices")
        listed.update(indices)
    state = _require(path, om, "state", dict, "optimizer")
    for key, entry in state.items():
        if not key.isascii() or not key.isdigit() or int(key) not in listed:
            raise _bad(path, f"optimizer.state.{key}", "is not the index of a parameter the groups list")
        if not isinstance(entry, dict):
            raise _bad(path, f"optimizer.state.{key}", f"must be an object, got {type(entry).__name__}")
    for name in optim_tensors:
        parts = name.split("/")
        if len(parts) != 3 or not parts[1].isascii() or not parts[1].isdigit() or not parts[2]:
            raise CheckpointError(
                f"{path} holds tensor {name!r}; optimizer tensors are 'optim/<index>/<name>'"
            )
        if int(parts[1]) not in listed:
            raise CheckpointError(
                f"{path} holds tensor {name!r} for parameter {parts[1]}, which field "
                "'optimizer.param_groups' does not list"
            )


def load_checkpoint(
    path: str | os.PathLike,
    model: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    loader: Any = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Restore what was saved into the given objects; returns the metadata (step, epoch, extra...).

    Every check (the file's format; model keys, shapes, dtypes; the optimizer's type, hyperparameters
    and state; the scheduler's and loader's state) runs before anything is touched; a mismatch raises
    CheckpointError naming the file and what differs, and leaves every object as it was."""
    tensors, meta = read_checkpoint(path)
    if not isinstance(restore_rng, (bool, np.bool_)):
        raise TypeError(
            f"load_checkpoint: restore_rng must be True or False, got {type(restore_rng).__name__}"
        )
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
        opt_state: dict[int, dict[str, Any]] = {int(i): dict(v) for i, v in om["state"].items()}
        for key, arr in tensors.items():
            if key.startswith("optim/"):
                _, idx, name = key.split("/", 2)
                opt_state.setdefault(int(idx), {})[name] = arr
        opt_sd = {"state": opt_state, "param_groups": om["param_groups"]}
        _check_part(path, "optimizer", optimizer, opt_sd)
    if scheduler is not None:
        sm = meta.get("scheduler")
        if sm is None or sm["type"] != type(scheduler).__name__:
            found = sm["type"] if sm else "none"
            raise CheckpointError(f"{path} holds scheduler {found}, not {type(scheduler).__name__}")
        _check_part(path, "scheduler", scheduler, sm["state"])
    if loader is not None:
        if "loader" not in meta:
            raise CheckpointError(f"{path} holds no loader state")
        _check_part(path, "loader", loader, meta["loader"])
    # everything fits: now change things
    if model is not None:
        model.load_state_dict(state)
    if optimizer is not None:
        optimizer.load_state_dict(opt_sd)
    if scheduler is not None:
        scheduler.load_state_dict(meta["scheduler"]["state"])
    if loader is not None:
        loader.load_state_dict(meta["loader"])
    if restore_rng:
        random.default_generator.load_state_dict(meta["rng"]["netcl"])
    return meta


def _check_part(path: str | os.PathLike, field: str, obj: Any, state: Any) -> None:
    """The object's own check of a state it is about to load (netcl's optimizers, schedulers and
    loaders have one), its error turned into a CheckpointError naming the file and the field."""
    check = getattr(obj, "_check_state_dict", None)
    if check is None:
        return
    try:
        check(state)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: the {field} state (field '{field}') does not fit: {exc}") from None
