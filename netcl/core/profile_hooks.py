"""The launch path's side of the profiler: the one global each launch, transfer and module call reads
(`active`), the hooks that record a launch or transfer for the profiles running (netcl.profiling's Profile
objects), host spans, the switch of queues to event timing, and the launch counter tests use to prove fusion.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from netcl.core import launch_labels as labels

# Read on every launch and transfer (the only cost when nothing is profiled).
active = False

_now = time.perf_counter_ns
_lock = threading.RLock()
_sessions: list[Any] = []  # the profiles running; replaced, never changed in place: hooks iterate it unlocked
_switched: list[Any] = []  # queues switched to event timing by a profile (switched back after the last)
_process: Any = None  # the process-wide profile: launches on queues made with event timing go to it
_start_whole_program: Callable[[], None] | None = None
_whole_program = False


def install(process: Any, start_whole_program: Callable[[], None]) -> None:
    """netcl.profiling hands over its process-wide profile (which records the launches on queues made with
    event timing) and what NETCL_PROFILE starts."""
    global _process, _start_whole_program
    _process, _start_whole_program = process, start_whole_program


def start_whole_program() -> None:
    """NETCL_PROFILE: record the whole program, once (the first queue made from the setting calls this)."""
    global _whole_program
    with _lock:
        if _whole_program or _start_whole_program is None:  # installed by netcl.profiling: `import netcl`
            return
        _whole_program = True
    _start_whole_program()


def attach(profile: Any) -> None:
    """Start recording into `profile` (its `_add` and `_add_host` receive the records)."""
    global active, _sessions
    with _lock:
        if profile in _sessions:
            raise RuntimeError("this profile is already active")
        _sessions = [*_sessions, profile]
        active = True


def detach(profile: Any) -> bool:
    """Stop recording into `profile`; after the last, give queues back their own timing setting. Whether it
    was recording."""
    global active, _sessions
    with _lock:
        if profile not in _sessions:
            return False
        _sessions = [s for s in _sessions if s is not profile]
        active = bool(_sessions)
        if not active:
            while _switched:
                q = _switched.pop()
                try:
                    q.set_timing(False)
                except Exception:  # a queue whose device failed keeps its timing: harmless
                    pass
    return True


# -- launch counter -------------------------------------------------------------------------------------
# The backend counts each launch by taking a number from `launch_ticks`: next() on an itertools.count is one C
# call, atomic under the GIL (exact from any thread, no lock or Python frame on the launch path). A graph
# replay adds its launches with count_launch(n). Reading the count takes a tick too, which it subtracts.
launch_ticks = itertools.count()
_counter_lock = threading.Lock()
_launches = 0  # counted by count_launch(n)
_reads = 0  # ticks taken by launch_count() itself


def count_launch(n: int = 1) -> None:
    """Count `n` kernel launches (a graph replay counts its own; the backend ticks `launch_ticks` instead)."""
    global _launches
    with _counter_lock:
        _launches += n


def launch_count() -> int:
    """How many kernels netcl has launched in this process."""
    global _reads
    with _counter_lock:
        ticks = next(launch_ticks) - _reads  # next() gives the ticks taken before it: launches + reads
        _reads += 1
        return _launches + ticks


class count_launches:
    """Context manager: `with count_launches() as c: ...; c.count` is the launches inside."""

    def __enter__(self) -> count_launches:
        self._start = launch_count()
        self.count = 0
        return self

    def __exit__(self, *exc: object) -> None:
        self.count = launch_count() - self._start

    @property
    def so_far(self) -> int:
        return launch_count() - self._start


# -- module and user scopes ---------------------------------------------------------------------------------
def call_module(module: Any, args: tuple, kwargs: dict) -> Any:
    """Module.__call__ while profiling: forward() inside the module's scope (a host span of the trace)."""
    label = labels.enter_module(module)
    t0 = _now()
    try:
        return module.forward(*args, **kwargs)
    finally:
        t1 = _now()
        labels.exit_module()
        _host_span(label, "module", t0, t1)


@contextlib.contextmanager
def scope(name: str) -> Iterator[None]:
    """Label the launches inside with `name` (a span on the host track of a trace); cheap when not
    profiling."""
    if not active:
        yield
        return
    labels.enter_scope(str(name))
    t0 = _now()
    try:
        yield
    finally:
        t1 = _now()
        labels.exit_scope()
        _host_span(str(name), "scope", t0, t1)


def _host_span(name: str, cat: str, t0: int, t1: int, args: dict | None = None) -> None:
    tid = threading.get_ident()
    for s in _sessions:
        s._add_host(name, cat, t0, t1, tid, args)


def span(name: str, cat: str, t0: int) -> None:
    """A host span from `t0` (host ns) to now on the trace (graph replays add theirs while profiling)."""
    _host_span(name, cat, t0, _now())


# -- launch and transfer hooks (netcl.core.backend, netcl.core.capture) -------------------------------------
def before(queue: Any) -> int:
    """Called before an enqueue while profiling: makes sure `queue` records event times; the host time."""
    if not queue.timed:
        _time_queue(queue)
    return _now()


def _time_queue(queue: Any) -> None:
    with _lock:
        if not queue.timed:
            queue.set_timing(True)
            _switched.append(queue)


def _targets(queue: Any) -> list[Any]:
    if queue.profiling and _process is not None and _process not in _sessions:
        return _sessions + [_process]
    return _sessions


# record fields (netcl.profiling's Profile reads them)
KIND, NAME, OP, SCOPE, QUEUE, EVENT, T0, T1, FLOPS, BYTES, THREAD, START, END, QUEUED = range(14)


def launched(kernel: Any, queue: Any, event: Any, t0: int | None, site_info: tuple | None = None) -> None:
    """A kernel launch was enqueued (t0: host ns before the enqueue, None when only the queue profiles)."""
    t1 = _now()
    if site_info is None:
        op, scope_label, declared = labels.current_op(3), labels.current_scope(), labels.take_work()
    else:  # a graph replay: the op and scope recorded at capture
        op, scope_label, declared = site_info
    flops, nbytes = declared if declared is not None else (None, None)
    rec = ["kernel", kernel.name, op, scope_label, queue, event, t0 if t0 is not None else t1, t1, flops,
           nbytes, threading.get_ident(), 0, 0, 0]
    for s in _targets(queue):
        s._add(rec)


def copied(queue: Any, event: Any, t0: int | None, dst: Any, src: Any, kwargs: dict, cl_module: Any) -> None:
    """A transfer (enqueue_copy) was enqueued."""
    t1 = _now()
    dst_dev = isinstance(dst, cl_module.MemoryObject)
    src_dev = isinstance(src, cl_module.MemoryObject)
    name = "copy D2D" if dst_dev and src_dev else ("copy H2D" if dst_dev else "copy D2H")
    nbytes = kwargs.get("byte_count")
    if nbytes is None:
        host = src if dst_dev and not src_dev else (dst if not dst_dev else None)
        nbytes = getattr(host, "nbytes", None)
        if nbytes is None:
            nbytes = min(getattr(dst, "size", 0), getattr(src, "size", 0))
    rec = ["copy", name, labels.current_op(3), labels.current_scope(), queue, event,
           t0 if t0 is not None else t1, t1, None, float(nbytes), threading.get_ident(), 0, 0, 0]
    for s in _targets(queue):
        s._add(rec)


def filled(queue: Any, event: Any, t0: int | None, nbytes: int) -> None:
    """A fill (enqueue_fill_buffer) was enqueued (graph replays)."""
    t1 = _now()
    rec = ["fill", "fill", labels.current_op(3), labels.current_scope(), queue, event,
           t0 if t0 is not None else t1, t1, None, float(nbytes), threading.get_ident(), 0, 0, 0]
    for s in _targets(queue):
        s._add(rec)
