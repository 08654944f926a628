"""Checkpoints as safetensors + JSON metadata, written atomically; nothing is unpickled."""

from netcl.io.checkpoint import (
    CheckpointError,
    atomic_write,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
)

__all__ = ["CheckpointError", "atomic_write", "load_checkpoint", "read_checkpoint", "save_checkpoint"]
