"""The before-access hooks of device storages: a pending result (netcl.jit.lazy) that reads a storage
registers a callback here, which computes it before anyone touches that storage (to write it in place, e.g.
an optimizer step). Kept below netcl.core.tensor and netcl.core.capture, which both read it on their hot
paths (Tensor.buffer, a template replay's slots)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# id(storage) -> callback(storage), called (and removed by the jit) on first access
before_access: dict[int, Callable[[Any], None]] = {}
