"""Run fuzz cases of the public API in worker processes and classify what each one did.

A case is a few lines of Python run in a prepared namespace (see `PRELUDE`) with what it should do:
raise an error of a given kind with words that help (`Raises`), or compute what NumPy/PyTorch compute
(`Matches`). Cases run one after another in a worker process; if a case kills its worker (a compiler
abort, a segmentation fault) or hangs, that case is charged with it and a fresh worker takes the rest.

Outcomes:
  ok            the expected error (type and words), or the reference result
  silent        bad input accepted without an error, or a valid input that gave a wrong result
  wrong-error   an error, but not of the expected kind, or without the words that help
  internal      an internal Python error leaked (KeyError, ZeroDivisionError, struct.error, ...)
  crash / hang  the worker process died / did not answer in time

`python -m tests.fuzz.report` prints the counts per area and outcome (for any checkout on PYTHONPATH).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = """
import math, struct, json, io, os, tempfile, warnings
import numpy as np
import netcl
import netcl.autograd as ag
import netcl.nn as nn
import netcl.optim as optim
import netcl.ops as ops
from netcl import errors
from netcl.core.device import manager
from netcl.core.tensor import Tensor
q = manager.default().queue
dev = q.device
def T(a, dtype=np.float32):
    return Tensor.from_host(q, np.asarray(a, dtype=dtype))
def P(a, dtype=np.float32):
    return ag.Parameter(T(a, dtype))
def host(x):
    x = getattr(x, "value", x)
    return x.to_host() if hasattr(x, "to_host") else np.asarray(x)
TMP = tempfile.mkdtemp(prefix="netcl-fuzz-")
warnings.simplefilter("ignore")
"""

# Python errors that are never the right answer to bad input: they come from inside netcl.
INTERNAL = {"KeyError", "IndexError", "AttributeError", "ZeroDivisionError", "UnboundLocalError",
            "AssertionError", "error", "EOFError", "JSONDecodeError", "OverflowError", "RecursionError",
            "NameError", "NotImplementedError", "UnicodeDecodeError", "BadGzipFile", "SafetensorError",
            "LogicError", "RuntimeError", "MemoryError", "StopIteration", "FloatingPointError"}


@dataclass(frozen=True)
class Raises:
    """The case must raise one of `kinds` (class names, matched along the MRO) with every one of `words`."""

    kinds: tuple[str, ...]
    words: tuple[str, ...] = ()


@dataclass(frozen=True)
class Matches:
    """The case sets `result`; it must equal `reference` (an expression over the same namespace) within
    rtol/atol, with the same shape and (unless dtype=False) the same dtype kind."""

    reference: str
    rtol: float = 1e-5
    atol: float | str = 1e-6  # a number, or an expression (a bound relative to the reference's scale)
    dtype: bool = True


@dataclass(frozen=True)
class Case:
    area: str
    name: str
    code: str
    expect: Raises | Matches


@dataclass
class Outcome:
    case: Case
    outcome: str
    detail: str = ""
    seconds: float = 0.0


def raises(*kinds: str, words: tuple[str, ...] | str = ()) -> Raises:
    return Raises(tuple(kinds), (words,) if isinstance(words, str) else tuple(words))


def _worker_main() -> None:
    """Worker: read case JSON lines on stdin, answer one JSON line per case on stdout."""
    import traceback

    import numpy as np

    namespace: dict = {}
    exec(PRELUDE, namespace)
    out = sys.stdout
    sys.stdout = sys.stderr  # cases that print do not corrupt the protocol
    for line in sys.stdin:
        req = json.loads(line)
        out.write(json.dumps({"start": req["name"]}) + "\n")
        out.flush()
        local = dict(namespace)
        t0 = time.perf_counter()
        answer: dict = {"name": req["name"]}
        try:
            exec(req["code"], local)
            answer["raised"] = None
            if req.get("reference") is not None:
                got = local.get("result")
                want = eval(req["reference"], local)
                if isinstance(req.get("atol"), str):
                    req = {**req, "atol": float(eval(req["atol"], local))}
                answer["compare"] = _compare(got, want, req)
        except BaseException as exc:  # noqa: BLE001 (classifying every exception is the point)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)) and not isinstance(exc, SystemExit):
                raise
            answer["raised"] = [c.__name__ for c in type(exc).__mro__]
            answer["message"] = f"{type(exc).__name__}: {exc}"[:2000]
            answer["where"] = traceback.format_exc()[-600:]
        answer["seconds"] = time.perf_counter() - t0
        out.write(json.dumps(answer, default=str) + "\n")
        out.flush()
    del np


def _compare(got, want, req) -> str:
    import numpy as np

    got = getattr(got, "value", got)
    if hasattr(got, "to_host"):
        got = got.to_host()
    want = getattr(want, "value", want)
    if hasattr(want, "to_host"):
        want = want.to_host()
    if isinstance(want, (str, bytes, list, tuple, dict, bool, type(None))) and not isinstance(
        want, np.ndarray
    ):
        return "" if got == want else f"got {got!r}, want {want!r}"
    g, w = np.asarray(got), np.asarray(want)
    if g.shape != w.shape:
        return f"shape {g.shape}, want {w.shape}"
    if req.get("check_dtype", True) and g.dtype.kind != w.dtype.kind:
        return f"dtype {g.dtype}, want {w.dtype}"
    if g.dtype.kind in "fc" or w.dtype.kind in "fc":
        atol = req["atol"]
        ok = np.allclose(
            g.astype(np.float64), w.astype(np.float64), rtol=req["rtol"], atol=atol, equal_nan=True
        )
    else:
        ok = np.array_equal(g, w)
    if ok:
        return ""
    got, want = (np.array2string(a.ravel()[:8], precision=6) for a in (g, w))
    return f"got {got}, want {want}"


def classify(case: Case, answer: dict) -> Outcome:
    exp = case.expect
    raised = answer.get("raised")
    message = answer.get("message", "")
    if isinstance(exp, Raises):
        if raised is None:
            return Outcome(case, "silent", "no error")
        if any(k in raised for k in exp.kinds):
            missing = [w for w in exp.words if w.lower() not in message.lower()]
            return Outcome(case, "wrong-error" if missing else "ok",
                           f"missing words {missing}: {message}" if missing else message)
        is_netcl = "NetclError" in raised
        if not is_netcl and raised[0] in INTERNAL:
            return Outcome(case, "internal", message + "\n" + answer.get("where", ""))
        return Outcome(case, "wrong-error", f"want {exp.kinds}: {message}")
    if raised is not None:
        if "NetclError" not in raised and raised[0] in INTERNAL:
            return Outcome(case, "internal", message + "\n" + answer.get("where", ""))
        return Outcome(case, "wrong-error", f"valid input raised {message}")
    diff = answer.get("compare", "")
    return Outcome(case, "silent" if diff else "ok", diff)


@dataclass
class _Worker:
    env: dict
    proc: subprocess.Popen | None = None
    lines: queue.Queue | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-c", "from tests.fuzz.runner import _worker_main; _worker_main()"],
            cwd=ROOT, env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, bufsize=1,
        )
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc, self.lines), daemon=True).start()

    @staticmethod
    def _pump(proc: subprocess.Popen, lines: queue.Queue) -> None:
        """Move the worker's answer lines into a queue (None at its end), so waiting has a timeout."""
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    def read(self, timeout: float) -> str | None:
        """The worker's next line, or None when it died or said nothing for `timeout` seconds."""
        assert self.lines is not None
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def stop(self) -> None:
        if self.proc is not None:
            try:
                self.proc.kill()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self.proc = None


def new_worker(env: dict | None = None) -> _Worker:
    """A worker (started by the first run_cases that takes it) that several run_cases calls can share: one
    process (~1 CPU s of imports) for many areas, a fresh one only after a crash or hang. stop() it after."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), str(ROOT)) if p)
    return _Worker(env)


def run_cases(cases: list[Case], timeout: float = 120.0, env: dict | None = None,
              worker: _Worker | None = None) -> list[Outcome]:
    """Run `cases` in order in worker processes; returns one Outcome per case. `worker` (new_worker): run
    them there and leave it running; else in a worker of their own, stopped at the end."""
    own = worker is None
    if worker is None:
        worker = new_worker(env)
    results: list[Outcome] = []
    for case in cases:
        if worker.proc is None or worker.proc.poll() is not None:
            worker.stop()
            worker.start()
        assert worker.proc is not None and worker.proc.stdin is not None
        req = {"name": f"{case.area}/{case.name}", "code": case.code}
        if isinstance(case.expect, Matches):
            req.update(reference=case.expect.reference, rtol=case.expect.rtol, atol=case.expect.atol,
                       check_dtype=case.expect.dtype)
        t0 = time.time()
        try:
            worker.proc.stdin.write(json.dumps(req) + "\n")
            worker.proc.stdin.flush()
        except OSError:
            worker.stop()
            results.append(Outcome(case, "crash", "the worker was gone before the case started"))
            continue
        line = worker.read(timeout)  # the "start" line
        answer = worker.read(timeout) if line else None
        if answer is None:
            hung = worker.proc.poll() is None
            code = worker.proc.returncode
            worker.stop()
            results.append(Outcome(case, "hang" if hung else "crash",
                                   f"no answer within {timeout:.0f} s" if hung else f"worker exit {code}",
                                   time.time() - t0))
            continue
        out = classify(case, json.loads(answer))
        out.seconds = time.time() - t0
        results.append(out)
    if own:
        worker.stop()
    return results


def table(results: list[Outcome]) -> str:
    """Counts per area and outcome, as a text table."""
    kinds = ["ok", "silent", "wrong-error", "internal", "crash", "hang"]
    areas = sorted({r.case.area for r in results})
    rows = [f"{'area':<12}" + "".join(f"{k:>12}" for k in kinds) + f"{'cases':>8}"]
    for area in areas + ["all"]:
        sel = [r for r in results if area == "all" or r.case.area == area]
        rows.append(f"{area:<12}" + "".join(f"{sum(r.outcome == k for r in sel):>12}" for k in kinds)
                    + f"{len(sel):>8}")
    return "\n".join(rows)
