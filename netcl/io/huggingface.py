"""Hugging Face model directories: config.json plus model.safetensors, or shards listed by
model.safetensors.index.json. Read into NumPy arrays in the file's dtypes (bfloat16 as ml_dtypes' NumPy type,
so a half checkpoint loads into a half model without a float32 copy; nothing is unpickled, a pytorch_model.bin
alone is refused), written atomically in the same layout so that
transformers' from_pretrained loads it. Which tensor is which parameter is the model's business
(netcl.models.huggingface holds the tables)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save as st_save

from netcl.core import dtypes
from netcl.core.files import atomic_write
from netcl.errors import NetclError

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"

# safetensors dtype names -> how to read them
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": dtypes.bfloat16, "I64": np.int64,
           "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


class PretrainedError(NetclError):
    """A pretrained-model directory is missing, unreadable, or does not match the model it is loaded into."""


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """The config.json of a model directory as a dict."""
    directory = _directory(path)
    config = read_json(directory / CONFIG)
    if config is None:
        raise PretrainedError(f"{directory} has no {CONFIG}: not a Hugging Face model directory")
    return config


def read_json(file: Path) -> dict[str, Any] | None:
    """A JSON object file of a model directory (config.json, generation_config.json, tokenizer_config.json);
    None where there is none. One that cannot be read is a PretrainedError: what it says would be lost."""
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise PretrainedError(f"cannot read {file}: {exc}") from None
    if not isinstance(doc, dict):
        raise PretrainedError(f"{file} holds a JSON {type(doc).__name__}, not an object")
    return doc


def read_tensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of the directory's safetensors file(s), by name."""
    directory = _directory(path)
    index = directory / INDEX
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise PretrainedError(f"{index} is not a safetensors index (a 'weight_map' of name -> file): "
                                  f"{exc}") from None
        missing = [f for f in files if not (directory / f).is_file()]
        if missing:
            raise PretrainedError(
                f"{index} lists shard files that are not in {directory}: {', '.join(missing)}"
            )
    elif (directory / WEIGHTS).is_file():
        files, weight_map = [WEIGHTS], None
    else:
        others = sorted(p.name for p in directory.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        hint = (f" (found {', '.join(others)}: netcl reads safetensors only, never pickles; convert with "
                "transformers' save_pretrained(..., safe_serialization=True))") if others else ""
        raise PretrainedError(f"{directory} has neither {WEIGHTS} nor {INDEX}{hint}")
    tensors: dict[str, np.ndarray] = {}
    for name in files:
        for key, arr in _read_safetensors(directory / name).items():
            if key in tensors:
                raise PretrainedError(f"tensor {key!r} appears in two files of {directory}")
            if weight_map is not None and weight_map.get(key) != name:
                raise PretrainedError(f"{directory / name} holds {key!r}, which {INDEX} places in "
                                      f"{weight_map.get(key)!r}")
            tensors[key] = arr
    if weight_map is not None:
        absent = sorted(set(weight_map) - set(tensors))
        if absent:
            raise PretrainedError(f"{INDEX} lists tensors that no shard holds: {', '.join(absent)}")
    return tensors


def _directory(path: str | os.PathLike) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"a model directory must be a str or a path, got {type(path).__name__}")
    directory = Path(path)
    if not directory.is_dir():
        raise PretrainedError(f"{directory} is not a directory (a Hugging Face model directory holds "
                              f"{CONFIG} and {WEIGHTS})")
    return directory


def _read_safetensors(file: Path) -> dict[str, np.ndarray]:
    """A safetensors file's tensors (the format: 8-byte little-endian header length, a JSON header of
    name -> dtype, shape, data_offsets, then the data)."""
    try:
        data = np.memmap(file, dtype=np.uint8, mode="r") if file.stat().st_size else np.zeros(0, np.uint8)
    except OSError as exc:
        raise PretrainedError(f"cannot read {file}: {exc}") from None
    if data.size < 8:
        raise PretrainedError(f"{file} is not a safetensors file ({data.size} bytes)")
    n = int.from_bytes(bytes(data[:8]), "little")
    if n > data.size - 8:
        raise PretrainedError(f"{file} is not a safetensors file (truncated?): a {n}-byte header in "
                              f"{data.size} bytes")
    try:
        header = json.loads(bytes(data[8:8 + n]))
    except ValueError as exc:
        raise PretrainedError(f"{file}: the safetensors header is not JSON ({exc})") from None
    body = data[8 + n:]
    out: dict[str, np.ndarray] = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            kind, shape, (start, end) = _DTYPES[info["dtype"]], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise PretrainedError(
                f"{file}: tensor {key!r} has a header entry netcl cannot read: {info!r}"
            ) from None
        itemsize = np.dtype(kind).itemsize
        if not 0 <= start <= end <= body.size or end - start != math.prod(shape) * itemsize:
            raise PretrainedError(f"{file}: tensor {key!r} ({info['dtype']} {list(shape)}) has data offsets "
                                  f"{start}..{end} that do not fit its size or the file")
        raw = body[start:end]
        if kind == dtypes.bfloat16:  # (a void type to NumPy: no byte order to state)
            arr = raw.view(np.uint16).astype("<u2").view(kind)
        else:
            arr = raw.view(np.dtype(kind).newbyteorder("<")).astype(kind)
        out[key] = arr.reshape(shape)
    return out


def write(path: str | os.PathLike, config: dict[str, Any], tensors: dict[str, np.ndarray],
          max_shard_bytes: int | None = None) -> list[Path]:
    """Write config.json and the tensors as model.safetensors, or, when they exceed max_shard_bytes, as
    model-0000i-of-0000n.safetensors shards with model.safetensors.index.json (each file atomically).
    Returns the paths written, weights first."""
    if max_shard_bytes is not None and (
        isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int) or max_shard_bytes < 1
    ):
        raise ValueError(f"max_shard_bytes must be a positive int or None, got {max_shard_bytes!r}")
    directory = Path(path)
    if directory.exists() and not directory.is_dir():
        raise PretrainedError(f"{directory} exists and is not a directory")
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for key in sorted(arrays):
        nbytes = arrays[key].nbytes
        if max_shard_bytes is not None and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = arrays[key]
        size += nbytes
    metadata = {"format": "pt"}  # what transformers expects of a PyTorch-format safetensors file
    if len(shards) == 1:
        written = [directory / WEIGHTS]
        atomic_write(written[0], st_save(shards[0], metadata=metadata))
        stale = directory / INDEX
        if stale.exists():
            stale.unlink()
    else:
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
        written = [directory / name for name in names] + [directory / INDEX]
        for name, shard in zip(names, shards):
            atomic_write(directory / name, st_save(shard, metadata=metadata))
        index = {"metadata": {"total_size": sum(a.nbytes for a in arrays.values())},
                 "weight_map": {k: name for name, shard in zip(names, shards) for k in shard}}
        atomic_write(directory / INDEX, json.dumps(index, indent=2).encode())
        stale = directory / WEIGHTS
        if stale.exists():
            stale.unlink()
    atomic_write(directory / CONFIG, (json.dumps(config, indent=2, sort_keys=True) + "\n").encode())
    return [*written, directory / CONFIG]


__all__ = ["PretrainedError", "read_config", "read_tensors", "write"]
