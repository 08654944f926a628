"""Instrumentation: per-kernel timing (NETCL_PROFILE=1 times every launch with OpenCL events;
`netcl.profiling.table()` returns and `report()` prints name, calls, total and mean time) and the launch
counter (`with count_launches() as c: ...; c.count`, which tests use to prove fusion).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

_lock = threading.Lock()
_pending: list[tuple[str, Any]] = []
_totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])


def record(name: str, event: Any) -> None:
    """Remember a launch's event; its time is read when a table is asked for."""
    with _lock:
        _pending.append((name, event))
        if len(_pending) > 4096:
            _drain_locked()


def _drain_locked() -> None:
    for name, event in _pending:
        try:
            event.wait()
            seconds = (event.profile.end - event.profile.start) * 1e-9
        except Exception:  # a queue made without profiling: count the call, no time
            seconds = 0.0
        entry = _totals[name]
        entry[0] += 1
        entry[1] += seconds
    _pending.clear()


def table() -> list[tuple[str, int, float, float]]:
    """Rows (name, calls, total seconds, mean seconds), largest total first."""
    with _lock:
        _drain_locked()
        rows = [(name, int(c), t, t / c if c else 0.0) for name, (c, t) in _totals.items()]
    return sorted(rows, key=lambda r: -r[2])


def reset() -> None:
    with _lock:
        _pending.clear()
        _totals.clear()


def report(file: Any = None) -> str:
    """Print the per-kernel table (to `file`, stdout by default) and return it."""
    rows = table()
    width = max([len("kernel")] + [len(r[0]) for r in rows])
    lines = [f"{'kernel':<{width}}  {'calls':>8}  {'total ms':>10}  {'mean us':>10}"]
    for name, calls, total, mean in rows:
        lines.append(f"{name:<{width}}  {calls:>8}  {total * 1e3:>10.3f}  {mean * 1e6:>10.1f}")
    text = "\n".join(lines)
    print(text, file=file)
    return text


# -- launch counter ---------------------------------------------------------------------------------
_counter_lock = threading.Lock()
_launches = 0


def count_launch(n: int = 1) -> None:
    """Count `n` kernel launches (the backend counts each launch; a graph replay counts its own)."""
    global _launches
    with _counter_lock:
        _launches += n


def launch_count() -> int:
    """How many kernels netcl has launched in this process."""
    return _launches


class count_launches:
    """Context manager: `with count_launches() as c: ...; c.count` is the launches inside."""

    def __enter__(self) -> count_launches:
        self._start = _launches
        self.count = 0
        return self

    def __exit__(self, *exc: object) -> None:
        self.count = _launches - self._start

    @property
    def so_far(self) -> int:
        return _launches - self._start
