"""Seeing inside: the profiler (device time of every launch and transfer, by kernel, op and module scope;
a table and a Chrome trace-event JSON timeline). The launch path's half lives in core (profile_hooks,
launch_labels); this module re-exports its public names: scope(), work(), transparent(), and the launch
counter tests use to prove fusion (count_launches, launch_count).

    with profiling.profile() as prof:          # or NETCL_PROFILE=1 for a whole program
        train_step(...)
    prof.report()                              # calls, total, mean, share, GFLOP/s, GB/s per kernel and op
    prof.export_chrome_trace("step.json")      # open in Perfetto (ui.perfetto.dev) or chrome://tracing

How it works, and what it costs when off: the backend asks `netcl.core.profile_hooks.active` (one module
global) on each launch and transfer and hands each to the profiles running. Inside a profile, each launch is
timed with its OpenCL event (a queue made without event profiling is switched to one for the profile's
duration, and back), and labelled (netcl.core.launch_labels) with
- its *op*: the outermost netcl op, autograd rule or optimizer step on the Python stack that launched it
  (the layers declare which of their frames name ops: `conv2d`, `conv2d.backward`, `AdamW.step`), and
- its *scope*: the innermost `nn.Module` being called (its dotted name from `named_modules()` of the
  outermost module called, as `features.0 (Conv2d)`) or a user's `profiling.scope("name")`.
Ops declare the work of their next launch (`profiling.work(flops, nbytes)`, under `if profiling.active`) so
the table shows achieved GFLOP/s and GB/s. Device timestamps are mapped to the host's perf_counter clock
per queue: each launch's QUEUED timestamp lies between the host times before and after its enqueue call.
"""

from __future__ import annotations

import atexit
import json
import runpy
import sys
import threading
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

from netcl import config
from netcl.core import profile_hooks
from netcl.core.launch_labels import current_op, current_scope, site, transparent, work
from netcl.core.profile_hooks import (
    BYTES,
    END,
    EVENT,
    FLOPS,
    KIND,
    NAME,
    OP,
    QUEUE,
    QUEUED,
    SCOPE,
    START,
    T0,
    T1,
    THREAD,
    count_launches,
    launch_count,
    scope,
)

__all__ = [
    "Profile", "Row", "count_launches", "current_op", "current_scope", "launch_count", "process_profile",
    "profile", "report", "reset", "run_script", "scope", "site", "table", "transparent", "work",
]

_now = time.perf_counter_ns


def __getattr__(name: str) -> Any:
    if name == "active":  # whether a profile records now: the launch path's own flag, read live
        return profile_hooks.active
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        t_start = _now()
        profile_hooks.attach(self)  # raises if it is recording already
        self.t_start = t_start
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop recording, give queues back their own timing setting, and wait for the recorded work: the wall
        time ends when the block's last command has (launches return at once, so a block that reads nothing
        back ended before its device work did: "device time 2.6 ms in 2.5 ms of wall time")."""
        if not profile_hooks.detach(self):
            return
        with self._lock:
            for rec in self._pending:
                if rec[EVENT] is not None:
                    try:
                        rec[EVENT].wait()
                    except Exception:  # (a failed command: _drain counts it without device time)
                        pass
        self.t_end = _now()
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
            ev = rec[EVENT]
            if ev is not None:
                try:
                    ev.wait()
                    prof = ev.profile
                    rec[START], rec[END] = int(prof.start), int(prof.end)
                except Exception:  # a queue without event profiling: counted, no device time
                    rec[START] = rec[END] = 0
                try:  # the clock mapping's sample; a driver may not report it (no mapping then)
                    rec[QUEUED] = int(prof.queued) if rec[END] else 0
                except Exception:
                    rec[QUEUED] = 0
                rec[EVENT] = None
            q = rec[QUEUE]
            if not isinstance(q, int):
                key = id(q)
                if key not in self._queue_names:
                    self._queue_names[key] = (q.device.device_name, f"queue {len(self._queue_names)}")
                rec[QUEUE] = key
            key = rec[QUEUE]
            ns = max(rec[END] - rec[START], 0)
            agg = self._agg[(rec[KIND], rec[NAME], rec[OP], rec[SCOPE])]
            agg[0] += 1
            agg[1] += ns
            if rec[FLOPS] is not None:
                agg[2] += rec[FLOPS]
                agg[3] += ns
            if rec[BYTES] is not None:
                agg[4] += rec[BYTES]
                agg[5] += ns
            if rec[END]:
                c = self._calib.get(key)
                if c is None:  # [lower, upper bound from QUEUED, samples, lower bound from START]
                    c = self._calib[key] = [-(1 << 62), 1 << 62, 0, -(1 << 62)]
                c[3] = max(c[3], rec[T0] - rec[START])  # nothing starts before it is enqueued
                if rec[QUEUED]:
                    c[0] = max(c[0], rec[T0] - rec[QUEUED])  # offset >= t0 - queued (queued after t0)
                    c[1] = min(c[1], rec[T1] - rec[QUEUED])  # offset <= t1 - queued (queued before t1)
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

    def report(self, by: tuple[str, ...] | str = ("kernel", "op"), file: Any = None,
               top: int | None = 30) -> str:
        """Print the table(s) (to `file`, stdout by default) and return the text: the `top` largest rows of
        each (None: all), the rest summed in a last row."""
        if top is not None and (not isinstance(top, int) or isinstance(top, bool) or top < 0):
            raise ValueError(f"report: top is how many rows to show, an int >= 0 (None: every row), got "
                             f"{top!r}")
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
                off = self._offset(rec[QUEUE])
                start = rec[START] + off if rec[END] else None
                end = rec[END] + off if rec[END] else None
                out.append(
                    {
                        "kind": rec[KIND],
                        "name": rec[NAME],
                        "op": rec[OP],
                        "scope": rec[SCOPE],
                        "queue": self._queue_names.get(rec[QUEUE], ("?", "?")),
                        "t0": rec[T0],
                        "t1": rec[T1],
                        "start": start,
                        "end": end,
                        "flops": rec[FLOPS],
                        "bytes": rec[BYTES],
                        "thread": rec[THREAD],
                    }
                )
        return out

    def gaps(self, top: int = 10, skip: int = 0) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """Where the device sat idle between the recorded launches and transfers of each queue: (totals,
        rows). totals: "span" (first start to last end), "busy" (the union of the events), "idle" (span -
        busy), "host_late" (idle while the next command had not been enqueued yet: its enqueue ended after
        the device had finished what came before; the rest of the idle time is the driver's between
        commands), in seconds. rows: the `top` (before, after) name pairs by idle time, each with calls, idle
        and host_late seconds. Events without device times (a driver that gave none) are left out, and so
        are the first `skip` commands of each queue by start time (what came before the part of the
        timeline asked about: a prefill before the decode steps)."""
        if skip < 0:
            raise ValueError(f"Profile.gaps: skip must be >= 0, got {skip}")
        totals = {"span": 0.0, "busy": 0.0, "idle": 0.0, "host_late": 0.0}
        pairs: dict[tuple[str, str], list] = defaultdict(lambda: [0, 0, 0])
        by_queue: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for span in self.device_spans():
            if span["start"] is not None and span["end"] is not None:
                by_queue[span["queue"]].append(span)
        for spans in by_queue.values():
            spans.sort(key=lambda sp: sp["start"])
            del spans[:skip]
            if not spans:
                continue
            totals["span"] += (max(sp["end"] for sp in spans) - spans[0]["start"]) * 1e-9
            done = spans[0]["end"]
            busy = done - spans[0]["start"]
            for before, after in zip(spans, spans[1:]):
                idle = after["start"] - done
                if idle > 0:
                    late = min(idle, max(0, after["t1"] - done))
                    pair = pairs[(before["name"], after["name"])]
                    pair[0] += 1
                    pair[1] += idle
                    pair[2] += late
                    totals["host_late"] += late * 1e-9
                busy += max(0, after["end"] - max(done, after["start"]))
                done = max(done, after["end"])
            totals["busy"] += busy * 1e-9
        totals["idle"] = max(0.0, totals["span"] - totals["busy"])
        rows = [{"before": a, "after": b, "calls": n, "idle": ns * 1e-9, "host_late": late * 1e-9}
                for (a, b), (n, ns, late) in pairs.items()]
        rows.sort(key=lambda r: (-r["idle"], r["before"], r["after"]))
        return totals, rows[:top]

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


def _record_whole_program() -> None:
    """NETCL_PROFILE: record the whole program into the process-wide profile and report it at exit. The
    first queue made from the environment's setting starts it (netcl.core.device, through
    profile_hooks.start_whole_program), not the import: nothing runs on a device before a queue exists, and a
    bad NETCL_PROFILE is an error of that call, not of `import netcl`."""
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



profile_hooks.install(_process, _record_whole_program)
