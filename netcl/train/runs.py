"""Run directories of the training commands (`netcl train`, `netcl lm-train`): runs/NAME, runs/NAME-2, ...

A directory holds a run when it has a checkpoint or metrics; a new run without --out takes the first free
name after the default's."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from netcl.core.device import manager
from netcl.errors import NetclError

CHECKPOINT_FILE = "checkpoint.safetensors"


def path_arg(text: str) -> str:
    """An argparse type for path flags: an empty string (an unset shell variable in `--out "$DIR"`) would
    silently mean the current directory, so it is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return text


def open_device(spec: str) -> Any:
    """The device of a --device flag; a bad one is an error naming the flag and listing the devices. A
    command with --nproc N calls it before it starts the ranks, so a bad device is one error, not N."""
    try:
        return manager.default(spec)
    except NetclError as exc:
        raise NetclError(f"--device {spec}: {exc}") from None


def check_overwrite(resume: object, overwrite: bool) -> None:
    """--resume continues a run where it is and --overwrite replaces it: together one would be ignored."""
    if overwrite and resume is not None:
        raise NetclError("--resume continues a run and --overwrite replaces it; give one of them")


def holds_run(directory: Path) -> bool:
    return (directory / CHECKPOINT_FILE).exists() or (directory / "metrics.json").exists()


def default_runs(default_out: Path) -> list[Path]:
    """default_out, default_out-2, ... that hold a run, in the order they were numbered."""
    found = [default_out] if holds_run(default_out) else []
    numbered = []
    for p in default_out.parent.glob(default_out.name + "-*"):
        suffix = p.name[len(default_out.name) + 1 :]
        if suffix.isdigit() and holds_run(p):
            numbered.append((int(suffix), p))
    return found + [p for _, p in sorted(numbered)]


def fresh_default_out(default_out: Path) -> Path:
    """default_out when it holds no run, else the first default_out-N that does not exist."""
    if not holds_run(default_out):
        return default_out
    n = 2
    while (default_out.parent / f"{default_out.name}-{n}").exists():
        n += 1
    return default_out.parent / f"{default_out.name}-{n}"
