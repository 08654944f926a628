"""Seeing inside: the profiler (device time of every launch and transfer, by kernel, op and module scope;
a table and a Chrome trace-event JSON timeline) and the launch counter tests use to prove fusion.

    with profiling.profile() as prof:          # or NETCL_PROFILE=1 for a whole program
        train_step(...)
    prof.report()                              # calls, total, mean, share, GFLOP/s, GB/s per kernel and op
    prof.export_chrome_trace("step.json")      # open in Perfetto (ui.perfetto.dev) or chrome://tracing

How it works, and what it costs when off: the backend asks `active` (one module global) on each launch and
transfer. Inside a profile, each launch is timed with its OpenCL event (a queue made without event
profiling is switched to one for the profile's duration, and back), and labelled with
- its *op*: the outermost netcl op, autograd rule or optimizer step on the Python stack that launched it
  (found by walking the frames: `conv2d`, `conv2d.backward`, `AdamW.step`), and
- its *scope*: the innermost `nn.Module` being called (its dotted name from `named_modules()` of the
  outermost module called, as `features.0 (Conv2d)`) or a user's `profiling.scope("name")`.
Ops declare the work of their next launch (`profiling.work(flops, nbytes)`, under `if profiling.active`) so
the table shows achieved GFLOP/s and GB/s. Device timestamps are mapped to the host's perf_counter clock
per queue: each launch's QUEUED timestamp lies between the host times before and after its enqueue call.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import runpy
import sys
import threading
import time
import traceback
import weakref
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from netcl import config

# Read on every launch and transfer (the only cost when nothing is profiled).
active = False

_now = time.perf_counter_ns
_lock = threading.RLock()
_sessions: list[Profile] = []  # replaced, never changed in place: hooks iterate it without the lock


class _Local(threading.local):
    def __init__(self) -> None:
        self.scopes: list[str] = []  # module / user scope labels, innermost last
        self.root: Any = None  # the outermost module being called (its named_modules() name the others)
        self.modules = 0  # modules being called on this thread (0: the next one called is a root)
        self.work: tuple[float, float] | None = None  # declared by an op for its next launch


_local = _Local()


# -- launch counter -------------------------------------------------------------------------------------
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


# -- op labels: the frames that launched ----------------------------------------------------------------
_SKIP, _OP, _STOP = 0, 1, 2
_code_kind: dict[Any, int] = {}
_code_label: dict[Any, str] = {}
# layers below ops (walked through), the op layers (the outermost frame there names the op), the rest stop
_INNER = ("core", "kernels", "jit", "profiling", "config", "errors")
_OPS = ("ops", "autograd", "optim")


def _classify(module: str) -> int:
    parts = module.split(".")
    if parts[0] != "netcl" or len(parts) < 2:
        return _STOP  # the user's code: the op is the outermost netcl frame below it
    if module in ("netcl.jit.fuse", "netcl.jit.autodiff"):
        return _OP  # @jit.fuse functions are ops of their own
    if module in ("netcl.autograd.engine", "netcl.graph"):
        return _SKIP  # the backward walk (its rules, closures named `op.<locals>.backward`, are the ops);
        # a graph recording a launch
    if parts[1] in _INNER:
        return _SKIP
    return _OP if parts[1] in _OPS else _STOP


def transparent(fn: Any) -> Any:
    """Mark `fn`, a wrapper that only forwards to an op (a Tensor or Node operator method, a classmethod
    alias), as no op of its own: launches under it are labelled with the op it calls ("add", "randn"), not
    with the wrapper's name ("method", "install"). Returns fn."""
    _code_kind[fn.__code__] = _SKIP
    return fn


_ANONYMOUS = frozenset({"<locals>", "<lambda>", "<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>"})


def _label(code: Any) -> str:
    label = _code_label.get(code)
    if label is None:
        parts = [p for p in code.co_qualname.split(".") if p not in _ANONYMOUS]
        label = _code_label[code] = ".".join(parts).lstrip("_") or code.co_name
    return label


def current_op(depth: int = 2) -> str:
    """The op on this thread's Python stack (see the module docstring); "(direct)" for a kernel launched
    straight from user code."""
    f: Any = sys._getframe(depth)
    best = outer = None
    kinds = _code_kind
    while f is not None:
        code = f.f_code
        kind = kinds.get(code)
        if kind is None:
            kind = kinds[code] = _classify(f.f_globals.get("__name__", ""))
        if kind == _STOP:
            break
        if kind == _OP:
            best = code
        outer = code
        f = f.f_back
    code = best if best is not None else outer
    return _label(code) if code is not None else "(direct)"


def current_scope() -> str:
    """The innermost module or user scope of this thread ("" outside any)."""
    scopes = _local.scopes
    return scopes[-1] if scopes else ""


def site() -> str:
    """Where work happens now: "scope / op" (allocation sites of netcl.memory_summary)."""
    op = current_op(3)
    scope = current_scope()
    return f"{scope} / {op}" if scope else op


# -- declared work ------------------------------------------------------------------------------------
def work(flops: float = 0.0, nbytes: float = 0.0) -> None:
    """Declare the FLOPs and compulsory bytes (read + written once) of this thread's next launch. Ops call
    it only while it matters: `if capture.declaring(): profiling.work(2 * m * n * k, ...)` (a profile runs,
    or a recording keeps it for replays that may be profiled)."""
    _local.work = (float(flops), float(nbytes))


def take_work() -> tuple[float, float] | None:
    """The work declared for the next launch, consumed."""
    declared, _local.work = _local.work, None
    return declared


def recorded_site() -> tuple[str, str, tuple[float, float] | None]:
    """(op, scope, declared work) of the launch being recorded (netcl.core.capture keeps it for replays)."""
    return current_op(3), current_scope(), _local.work


# -- module and user scopes ---------------------------------------------------------------------------------
# id(root module) -> (weak reference to it, id(module) -> dotted path from its named_modules())
_module_names: dict[int, tuple[Any, dict[int, str]]] = {}


def _paths(root: Any, refresh: bool = False) -> dict[int, str]:
    entry = _module_names.get(id(root))
    if entry is None or entry[0]() is not root or refresh:
        entry = _module_names[id(root)] = (weakref.ref(root), {id(m): n for n, m in root.named_modules()})
    return entry[1]


def _module_label(module: Any, scopes: list[str]) -> str:
    cls = type(module).__name__
    if not _local.modules:
        _paths(module)
        _local.root = module
        return cls
    root = _local.root
    path = _paths(root).get(id(module))
    if path is None:  # a module added since, or one called that the root does not hold
        path = _paths(root, refresh=True).get(id(module))
    return f"{path} ({cls})" if path else f"{scopes[-1]}/{cls}"


def call_module(module: Any, args: tuple, kwargs: dict) -> Any:
    """Module.__call__ while profiling: forward() inside the module's scope (a host span of the trace)."""
    scopes = _local.scopes
    label = _module_label(module, scopes)
    scopes.append(label)
    _local.modules += 1
    t0 = _now()
    try:
        return module.forward(*args, **kwargs)
    finally:
        t1 = _now()
        scopes.pop()
        _local.modules -= 1
        if not _local.modules:
            _local.root = None
        _host_span(label, "module", t0, t1)


@contextlib.contextmanager
def scope(name: str) -> Iterator[None]:
    """Label the launches inside with `name` (a span on the host track of a trace); cheap when not
    profiling."""
    if not active:
        yield
        return
    scopes = _local.scopes
    scopes.append(str(name))
    t0 = _now()
    try:
        yield
    finally:
        t1 = _now()
        scopes.pop()
        _host_span(str(name), "scope", t0, t1)


def _host_span(name: str, cat: str, t0: int, t1: int, args: dict | None = None) -> None:
    tid = threading.get_ident()
    for s in _sessions:
        s._add_host(name, cat, t0, t1, tid, args)


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


_switched: list[Any] = []  # queues switched to event timing by a profile (switched back after the last)


def _targets(queue: Any) -> list[Profile]:
    if queue.profiling and _process not in _sessions:
        return _sessions + [_process]
    return _sessions


# record fields
_KIND, _NAME, _OP_, _SCOPE, _Q, _EV, _T0, _T1, _FLOPS, _BYTES, _TID, _START, _END, _QUEUED = range(14)


def launched(kernel: Any, queue: Any, event: Any, t0: int | None, site_info: tuple | None = None) -> None:
    """A kernel launch was enqueued (t0: host ns before the enqueue, None when only the queue profiles)."""
    t1 = _now()
    if site_info is None:
        op, scope_label, declared = current_op(3), current_scope(), _local.work
        _local.work = None
    else:  # a graph replay: the op and scope recorded at capture
        op, scope_label, declared = site_info
    flops, nbytes = declared if declared is not None else (None, None)
    rec = [
        "kernel",
        kernel.name,
        op,
        scope_label,
        queue,
        event,
        t0 if t0 is not None else t1,
        t1,
        flops,
        nbytes,
        threading.get_ident(),
        0,
        0,
        0,
    ]
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
    rec = ["copy", name, current_op(3), current_scope(), queue, event, t0 if t0 is not None else t1, t1, None,
           float(nbytes), threading.get_ident(), 0, 0, 0]
    for s in _targets(queue):
        s._add(rec)


def filled(queue: Any, event: Any, t0: int | None, nbytes: int) -> None:
    """A fill (enqueue_fill_buffer) was enqueued (graph replays)."""
    t1 = _now()
    rec = [
        "fill",
        "fill",
        current_op(3),
        current_scope(),
        queue,
        event,
        t0 if t0 is not None else t1,
        t1,
        None,
        float(nbytes),
        threading.get_ident(),
        0,
        0,
        0,
    ]
    for s in _targets(queue):
        s._add(rec)


def span(name: str, cat: str, t0: int) -> None:
    """A host span from `t0` (host ns) to now on the trace (graph replays add theirs while profiling)."""
    _host_span(name, cat, t0, _now())


# -- a profile ---------------------------------------------------------------------------------------------
class Row(NamedTuple):
    """One line of a profile's table: seconds; rates over the calls that declared their work (else None)."""

    name: str
    calls: int
    total: float
    mean: float
    share: float
    gflops: float | None
    gbps: float | None


_BY = {"kernel": lambda k: k[1], "op": lambda k: k[2], "scope": lambda k: k[3] or "(no scope)",
       "kind": lambda k: k[0]}


class Profile:
    """Device work (launches, transfers) and host spans recorded while it is active (`with profile():`).

    Aggregates are kept for every launch; the per-launch timeline behind `chrome_trace()` keeps the first
    `max_events` launches and transfers (a long NETCL_PROFILE=1 run stays bounded in memory)."""

    def __init__(self, max_events: int = 500_000, name: str = "profile"):
        self.name = name
        self.max_events = int(max_events)
        self._pending: list[list] = []  # records whose events have not been read yet
        self._records: list[list] = []  # drained records kept for the timeline
        self._dropped = 0
        self._host: list[tuple] = []
        # (kind, name, op, scope) -> [calls, ns, flops, ns with flops, bytes, ns with bytes]
        self._agg: dict[tuple, list] = defaultdict(lambda: [0, 0, 0.0, 0, 0.0, 0])
        self._calib: dict[
            int, list
        ] = {}  # id(queue) -> [queue label, lower, upper, samples, min(t0 - start)]
        self._queue_names: dict[int, tuple[str, str]] = {}
        self._lock = threading.Lock()
        self.t_start = self.t_end = 0
        self.reported = False

    # -- recording --------------------------------------------------------------------------------
    def __enter__(self) -> Profile:
        global active, _sessions
        with _lock:
            if self in _sessions:
                raise RuntimeError("this profile is already active")
            self.t_start = _now()
            _sessions = [*_sessions, self]
            active = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop recording (waits for the recorded events) and give queues back their own timing setting."""
        global active, _sessions
        with _lock:
            if self not in _sessions:
                return
            _sessions = [s for s in _sessions if s is not self]
            active = bool(_sessions)
            self.t_end = _now()
            if not active:
                while _switched:
                    q = _switched.pop()
                    try:
                        q.set_timing(False)
                    except Exception:  # a queue whose device failed keeps its timing: harmless
                        pass
        self._drain()

    def _add(self, rec: list) -> None:
        with self._lock:
            self._pending.append(rec)
            if len(self._pending) >= 4096:
                self._drain_locked()

    def _add_host(self, name: str, cat: str, t0: int, t1: int, tid: int, args: dict | None) -> None:
        with self._lock:
            if len(self._host) < self.max_events:
                self._host.append((name, cat, t0, t1, tid, args))

    def _drain(self) -> None:
        with self._lock:
            self._drain_locked()

    def _drain_locked(self) -> None:
        for rec in self._pending:
            ev = rec[_EV]
            if ev is not None:
                try:
                    ev.wait()
                    prof = ev.profile
                    rec[_START], rec[_END] = int(prof.start), int(prof.end)
                except Exception:  # a queue without event profiling: counted, no device time
                    rec[_START] = rec[_END] = 0
                try:  # the clock mapping's sample; a driver may not report it (no mapping then)
                    rec[_QUEUED] = int(prof.queued) if rec[_END] else 0
                except Exception:
                    rec[_QUEUED] = 0
                rec[_EV] = None
            q = rec[_Q]
            if not isinstance(q, int):
                key = id(q)
                if key not in self._queue_names:
                    self._queue_names[key] = (q.device.device_name, f"queue {len(self._queue_names)}")
                rec[_Q] = key
            key = rec[_Q]
            ns = max(rec[_END] - rec[_START], 0)
            agg = self._agg[(rec[_KIND], rec[_NAME], rec[_OP_], rec[_SCOPE])]
            agg[0] += 1
            agg[1] += ns
            if rec[_FLOPS] is not None:
                agg[2] += rec[_FLOPS]
                agg[3] += ns
            if rec[_BYTES] is not None:
                agg[4] += rec[_BYTES]
                agg[5] += ns
            if rec[_END]:
                c = self._calib.get(key)
                if c is None:  # [lower, upper bound from QUEUED, samples, lower bound from START]
                    c = self._calib[key] = [-(1 << 62), 1 << 62, 0, -(1 << 62)]
                c[3] = max(c[3], rec[_T0] - rec[_START])  # nothing starts before it is enqueued
                if rec[_QUEUED]:
                    c[0] = max(c[0], rec[_T0] - rec[_QUEUED])  # offset >= t0 - queued (queued after t0)
                    c[1] = min(c[1], rec[_T1] - rec[_QUEUED])  # offset <= t1 - queued (queued before t1)
                    c[2] += 1
            if len(self._records) < self.max_events:
                self._records.append(rec)
            else:
                self._dropped += 1
        self._pending.clear()

    # -- reading ----------------------------------------------------------------------------------
    def rows(self, by: str = "kernel") -> list[Row]:
        """The table grouped by "kernel" (kernel or transfer name), "op", "scope" or "kind"; largest first."""
        if by not in _BY:
            raise ValueError(f"profile rows by {by!r}: choose one of {sorted(_BY)}")
        self._drain()
        key_of = _BY[by]
        groups: dict[str, list] = defaultdict(lambda: [0, 0, 0.0, 0, 0.0, 0])
        with self._lock:
            for key, agg in self._agg.items():
                g = groups[key_of(key)]
                for i in range(6):
                    g[i] += agg[i]
        total = sum(g[1] for g in groups.values()) or 1
        out = []
        for name, (calls, ns, flops, ns_f, nbytes, ns_b) in groups.items():
            out.append(Row(
                name, calls, ns * 1e-9, ns * 1e-9 / calls if calls else 0.0, ns / total,
                flops / ns_f if ns_f and flops else None,  # flop per ns = GFLOP/s
                nbytes / ns_b if ns_b and nbytes else None,
            ))
        return sorted(out, key=lambda r: (-r.total, r.name))

    @property
    def device_seconds(self) -> float:
        """Device time of everything recorded (sum of event durations)."""
        return sum(r.total for r in self.rows("kind"))

    def report(self, by: tuple[str, ...] | str = ("kernel", "op"), file: Any = None, top: int = 30) -> str:
        """Print the table(s) (to `file`, stdout by default) and return the text."""
        self.reported = True
        parts = []
        for group in (by,) if isinstance(by, str) else by:
            rows = self.rows(group)
            shown = rows[:top]
            width = max([len(group)] + [len(r.name) for r in shown])
            width = min(width, 64)
            lines = [f"{group:<{width}}  {'calls':>7}  {'total ms':>9}  {'mean us':>9}  {'share':>6}  "
                     f"{'GFLOP/s':>8}  {'GB/s':>8}"]
            for r in shown:
                gf = f"{r.gflops:8.1f}" if r.gflops is not None else f"{'':8}"
                gb = f"{r.gbps:8.1f}" if r.gbps is not None else f"{'':8}"
                lines.append(
                    f"{r.name[:width]:<{width}}  {r.calls:>7}  {r.total * 1e3:>9.3f}  {r.mean * 1e6:>9.1f}  "
                    f"{r.share * 100:>5.1f}%  {gf}  {gb}"
                )
            if len(rows) > len(shown):
                rest = rows[len(shown):]
                lines.append(f"{'(' + str(len(rest)) + ' more)':<{width}}  {sum(r.calls for r in rest):>7}  "
                             f"{sum(r.total for r in rest) * 1e3:>9.3f}")
            parts.append("\n".join(lines))
        total = self.device_seconds
        wall = ((self.t_end or _now()) - self.t_start) * 1e-9 if self.t_start else 0.0
        footer = f"device time {total * 1e3:.3f} ms" + (
            f" in {wall * 1e3:.1f} ms of wall time" if wall else ""
        )
        if self._dropped:
            footer += (
                f"; the timeline kept the first {self.max_events} of {self.max_events + self._dropped} events"
            )
        text = "\n\n".join(parts) + "\n" + footer
        print(text, file=file)
        return text

    # -- the timeline ---------------------------------------------------------------------------------
    def _offset(self, key: int) -> int:
        """ns to add to a device timestamp of queue `key` to get host perf_counter ns."""
        c = self._calib.get(key)
        if c is None:
            return 0
        if not c[2]:  # no QUEUED timestamps from this driver: the earliest mapping that is possible
            return c[3]
        lower, upper = c[0], c[1]
        return max((lower + upper) // 2 if lower <= upper else upper, c[3])

    def device_spans(self) -> list[dict[str, Any]]:
        """Every recorded launch and transfer: name, kind, op, scope, queue, host enqueue (t0, t1) and device
        (start, end) in host perf_counter ns."""
        self._drain()
        out = []
        with self._lock:
            for rec in self._records:
                off = self._offset(rec[_Q])
                start = rec[_START] + off if rec[_END] else None
                end = rec[_END] + off if rec[_END] else None
                out.append(
                    {
                        "kind": rec[_KIND],
                        "name": rec[_NAME],
                        "op": rec[_OP_],
                        "scope": rec[_SCOPE],
                        "queue": self._queue_names.get(rec[_Q], ("?", "?")),
                        "t0": rec[_T0],
                        "t1": rec[_T1],
                        "start": start,
                        "end": end,
                        "flops": rec[_FLOPS],
                        "bytes": rec[_BYTES],
                        "thread": rec[_TID],
                    }
                )
        return out

    def host_spans(self) -> list[tuple]:
        """(name, category, t0 ns, t1 ns, thread id, args) of module scopes, user scopes and graph replays."""
        with self._lock:
            return list(self._host)

    def chrome_trace(self) -> dict[str, Any]:
        """The Chrome trace-event JSON object: host spans (modules, scopes, enqueue calls) on one track per
        Python thread of process "netcl host", device spans on one track per queue of a process per device;
        timestamps in microseconds from the profile's start, device times mapped to the host clock."""
        spans = self.device_spans()
        origin = self.t_start or min([s["t0"] for s in spans] or [0])
        us = 1e-3
        events: list[dict[str, Any]] = []
        threads: dict[int, int] = {}

        def tid_of(ident: int) -> int:
            if ident not in threads:
                threads[ident] = len(threads) + 1
            return threads[ident]

        host_events = []
        for name, cat, t0, t1, ident, args in self.host_spans():
            ev = {"name": name, "cat": cat, "ph": "X", "pid": 1, "tid": tid_of(ident),
                  "ts": round((t0 - origin) * us, 3), "dur": round(max(t1 - t0, 0) * us, 3)}
            if args:
                ev["args"] = args
            host_events.append(ev)
        devices: dict[str, int] = {}
        queue_tids: dict[tuple[str, str], int] = {}
        last_end: dict[tuple[str, str], float] = {}
        device_events = []
        for s in sorted(spans, key=lambda s: (s["start"] or 0)):
            args = {"op": s["op"], "scope": s["scope"] or "-", "kind": s["kind"]}
            if s["bytes"] is not None:
                args["bytes"] = int(s["bytes"])
            if s["flops"] is not None:
                args["flops"] = int(s["flops"])
            host_events.append(
                {
                    "name": s["name"],
                    "cat": "enqueue",
                    "ph": "X",
                    "pid": 1,
                    "tid": tid_of(s["thread"]),
                    "ts": round((s["t0"] - origin) * us, 3),
                    "dur": round(max(s["t1"] - s["t0"], 0) * us, 3),
                    "args": {"op": s["op"]},
                }
            )
            if s["start"] is None:
                continue
            dev_name, qname = s["queue"]
            pid = devices.setdefault(dev_name, 2 + len(devices))
            track = (dev_name, qname)
            tid = queue_tids.setdefault(track, len(queue_tids) + 1)
            ts = (s["start"] - origin) * us
            ts = max(ts, last_end.get(track, ts))  # an in-order queue: spans never overlap on its track
            end = max((s["end"] - origin) * us, ts)
            last_end[track] = end
            device_events.append({"name": s["name"], "cat": s["kind"], "ph": "X", "pid": pid, "tid": tid,
                                  "ts": round(ts, 3), "dur": round(end - ts, 3), "args": args})
        events.append({"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "netcl host"}})
        events.append(
            {"name": "process_sort_index", "ph": "M", "pid": 1, "tid": 0, "args": {"sort_index": 0}}
        )
        for ident, tid in threads.items():
            tname = next((t.name for t in threading.enumerate() if t.ident == ident), f"thread {ident}")
            events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid,
                           "args": {"name": f"python {tname}"}})
        for dev_name, pid in devices.items():
            events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                           "args": {"name": f"device: {dev_name}"}})
            events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                           "args": {"sort_index": pid}})
        for (dev_name, qname), tid in queue_tids.items():
            events.append({"name": "thread_name", "ph": "M", "pid": devices[dev_name], "tid": tid,
                           "args": {"name": qname}})
        # ordered by start, enclosing spans first (a parent and its first child may start together)
        host_events.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], -e["dur"]))
        events.extend(host_events)
        events.extend(device_events)
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"producer": "netcl.profiling", "dropped_events": self._dropped}}

    def export_chrome_trace(self, path: str | Path) -> Path:
        """Write chrome_trace() as JSON to `path` (Perfetto and chrome://tracing open it)."""
        path = Path(path)
        if path.parent and not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.chrome_trace()))
        return path

    def reset(self) -> None:
        """Forget everything recorded so far (keeps recording if active)."""
        with self._lock:
            self._drain_locked()
            self._records.clear()
            self._host.clear()
            self._agg.clear()
            self._dropped = 0
            self.t_start = _now()


def profile(max_events: int = 500_000) -> Profile:
    """`with profile() as prof:` records every launch and transfer inside (see the module docstring)."""
    return Profile(max_events=max_events)


# -- the process-wide profile: NETCL_PROFILE=1, and queues made with profiling ------------------------------
_process = Profile(name="process")


def table() -> list[tuple[str, int, float, float]]:
    """Per-kernel rows (name, calls, total seconds, mean seconds) of the process-wide profile (launches on
    queues made with profiling, everything under NETCL_PROFILE=1), largest total first."""
    _process.reported = True
    return [(r.name, r.calls, r.total, r.mean) for r in _process.rows("kernel")]


def reset() -> None:
    """Forget the process-wide profile's records."""
    _process.reset()


def report(file: Any = None) -> str:
    """Print the process-wide per-kernel and per-op tables (to `file`, stdout by default) and return them."""
    return _process.report(file=file)


def process_profile() -> Profile:
    """The process-wide profile (NETCL_PROFILE=1 records the whole program into it)."""
    return _process


def _report_at_exit() -> None:
    _process.stop()
    trace = config.profile_trace()
    if trace:
        path = _process.export_chrome_trace(trace)
        print(f"[netcl] NETCL_PROFILE: wrote the trace to {path}", file=sys.stderr)
    if not _process.reported and _process.rows("kind"):
        _process.report(file=sys.stderr)


_whole_program = False


def start_whole_program() -> None:
    """NETCL_PROFILE: record the whole program into the process-wide profile and report it at exit. The
    first queue made from the environment's setting starts it (netcl.core.device), not the import: nothing
    runs on a device before a queue exists, and a bad NETCL_PROFILE is an error of that call, not of
    `import netcl`."""
    global _whole_program
    with _lock:
        if _whole_program:
            return
        _whole_program = True
    _process.__enter__()
    atexit.register(_report_at_exit)


def run_script(
    path: str,
    argv: list[str],
    trace: str | Path | None,
    by: tuple[str, ...] = ("kernel", "op", "scope"),
    file: Any = None,
    top: int = 25,
) -> tuple[int, Profile]:
    """Run the Python script `path` with `argv` as __main__ under a profile; print its tables to `file`
    (stderr by default) and write its trace to `trace`. Returns (exit status, profile)."""
    out = file if file is not None else sys.stderr
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [path, *argv]
    sys.path.insert(0, str(Path(path).resolve().parent))
    status = 0
    prof = Profile()
    try:
        with prof:
            try:
                runpy.run_path(path, run_name="__main__")
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if exc.code is not None and not isinstance(exc.code, int):
                    print(exc.code, file=sys.stderr)  # sys.exit("message") prints it, as Python does
            except Exception:  # the script's own error: shown, and its profile up to there still written
                traceback.print_exc()
                status = 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        prof.report(by=by, file=out, top=top)
        if trace is not None:
            try:
                written = prof.export_chrome_trace(trace)
            except OSError as exc:  # the tables above are still the profile; no traceback for a bad path
                print(f"netcl: could not write the trace to {trace}: {exc}", file=out)
                status = status or 1
            else:
                print(f"wrote {written} (open it in Perfetto: ui.perfetto.dev, or chrome://tracing)",
                      file=out)
    return status, prof

