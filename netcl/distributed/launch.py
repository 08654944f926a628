"""`netcl run --nproc N [--devices P:D,...] [--balance auto|on|off] script.py ARGS`: start one process per
device, each a rank of one job.

Each process gets NETCL_RANK, NETCL_WORLD_SIZE, NETCL_DIST_ID (the job's id, which names its sockets and
shared memory) and, with --devices or when there are enough GPUs, its own NETCL_DEVICE (the devices may be on
different OpenCL platforms); --balance sets NETCL_DIST_BALANCE, which netcl.distributed.Balancer reads. The
launcher waits for them; when one fails (an error, a crash, a kill) the others see it in their next collective
and raise DistributedError naming it, and whatever is still running a few seconds later is ended. Exit
status: 0 when every rank exited 0, else the first failure's (128 + signal for a rank killed by a signal).
Shared memory of the job is removed on every way out (the ranks unlink their segments as soon as all have
mapped them; the launcher removes any a killed rank left behind); the ranks die with the launcher
(PR_SET_PDEATHSIG) if it is killed itself.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from netcl import config
from netcl.core.device import manager
from netcl.distributed import runtime
from netcl.errors import NetclError

BALANCE_CHOICES = config.BALANCE_MODES
GRACE_SECONDS = 2.0  # after a rank fails, how long the others get to notice and exit by themselves
SHM_DIR = "/dev/shm"


def positive_int(text: str) -> int:
    """argparse type of counts that must be >= 1 (--nproc here; netcl train's counts too)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _seconds(text: str) -> str:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return text


def add_device_arguments(p: argparse.ArgumentParser) -> None:
    """--devices and --balance, as `netcl run`, `netcl train` and `netcl lm-train` take them."""
    p.add_argument(
        "--devices",
        default=None,
        help="comma-separated devices, one per rank (P:D as `netcl devices` prints, or any NETCL_DEVICE "
        "value; different platforms may share a job); default: one GPU each when there are at least N, else "
        "every rank on the default device",
    )
    p.add_argument(
        "--balance",
        choices=BALANCE_CHOICES,
        default=None,
        help="each rank's share of every global batch: auto (by measured speed, re-measured as the run goes, "
        "when the ranks' devices differ; else equal), on (by measured speed always), off (equal); sets "
        "NETCL_DIST_BALANCE for the ranks (default: that variable, else auto)",
    )


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "run", help="run a script as N processes, one per device (data parallelism)", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=positive_int, required=True, help="how many processes (ranks) to start")
    add_device_arguments(p)
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=None,
        help="seconds a rank waits for the others in a collective before it raises (NETCL_DIST_TIMEOUT, "
        "default 60)",
    )
    p.add_argument("script", help="the Python script every rank runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    if not os.path.isfile(args.script):
        raise NetclError(f"no script {args.script} (netcl run starts a Python file)")
    extra = {"NETCL_DIST_TIMEOUT": args.timeout} if args.timeout else {}
    if args.balance:
        extra["NETCL_DIST_BALANCE"] = args.balance
    return launch([sys.executable, args.script, *args.args], args.nproc, args.devices, extra)


def spawn_ranks(argv: Sequence[str] | None, nproc: int, devices: str | None = None,
                balance: str | None = None) -> int | None:
    """The hook of commands with --nproc (`netcl train`; `netcl lm-train` takes the same two calls): in the
    process
    the user started, with nproc > 1, run the same command line again as `nproc` ranks and return their exit
    status; in a rank (started by this launcher or by mpiexec), or with nproc 1, return None: go on, then call
    join(nproc)."""
    if nproc <= 1 or config.dist_launch() is not None or any(v in os.environ for v in runtime.MPI_VARIABLES):
        return None
    if argv is None:
        raise NetclError("--nproc needs the command line to start again (netcl.cli.main records it)")
    return launch([sys.executable, "-m", "netcl.cli", *argv], nproc, devices,
                  {"NETCL_DIST_BALANCE": balance} if balance else None)


def join(nproc: int) -> bool:
    """In a rank of a --nproc command: join the job (netcl.distributed.init) and check it has `nproc` ranks.
    Returns whether this process is rank 0 (the one that logs and writes files); True for nproc 1."""
    if nproc <= 1:
        return True
    group = runtime.init()
    if group.world_size != nproc:
        raise NetclError(
            f"--nproc {nproc}, but this job has {group.world_size} processes (mpiexec -n or netcl run "
            "--nproc started another number)"
        )
    return group.rank == 0


def assign_devices(nproc: int, devices: str | None) -> list[str | None]:
    """The NETCL_DEVICE of each rank (None: the inherited one)."""
    if devices is not None:
        specs = [s.strip() for s in devices.split(",") if s.strip()]
        if len(specs) == 1:
            specs = specs * nproc
        if len(specs) != nproc:
            raise NetclError(
                f"--devices names {len(specs)} devices for --nproc {nproc}: give one per rank (or one "
                "for all)"
            )
        for spec in dict.fromkeys(specs):
            try:  # an unknown device is an error here, listing what exists, not in N processes
                manager.get(spec)
            except NetclError as exc:
                raise type(exc)(f"--devices {devices}: {exc}") from None
        return list(specs)
    gpus = [h for h in manager.devices() if h.kind == "gpu" and not h.is_simulator]
    if len(gpus) >= nproc and not os.environ.get("NETCL_DEVICE"):
        return [h.spec for h in gpus[:nproc]]
    return [None] * nproc


def _die_with_parent() -> None:
    """In each rank before it starts: be killed when the launcher dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _status(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by signal {-code} ({name})"
    return f"exited with status {code}"


def remove_segments(job: str) -> list[str]:
    """Unlink whatever shared memory of `job` is still named in /dev/shm (returns the names removed)."""
    removed = []
    for path in glob.glob(os.path.join(SHM_DIR, glob.escape(job) + "-*")):
        try:
            os.unlink(path)
            removed.append(os.path.basename(path))
        except FileNotFoundError:
            pass
    return removed


def _stop(procs: Sequence[subprocess.Popen], log: Any) -> None:
    """End every rank still running: SIGTERM to its process group, SIGKILL after a second."""
    running = [p for p in procs if p.poll() is None]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in running:
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and any(p.poll() is None for p in running):
            time.sleep(0.02)
        running = [p for p in running if p.poll() is None]
        if not running:
            return
    for p in running:
        log(f"netcl run: pid {p.pid} did not end after SIGKILL")


def launch(command: Sequence[str], nproc: int, devices: str | None = None, env: dict[str, str] | None = None,
           log: Any = None) -> int:
    """Run `command` as `nproc` ranks of one job (see the module docstring); returns the exit status."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    specs = assign_devices(nproc, devices)
    job = f"netcl-{os.getpid()}-{secrets.token_hex(4)}"
    base = {**os.environ, **(env or {}), "NETCL_WORLD_SIZE": str(nproc), "NETCL_DIST_ID": job}
    base.setdefault("NETCL_DIST_BACKEND", "shm")
    procs: list[subprocess.Popen] = []
    exits: queue.Queue = queue.Queue()  # (rank, status) in the order the ranks end
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    first_failure: tuple[int, int] | None = None
    try:
        for r in range(nproc):
            child = {**base, "NETCL_RANK": str(r)}
            if specs[r] is not None:
                child["NETCL_DEVICE"] = specs[r]
            p = subprocess.Popen(
                list(command), env=child, start_new_session=True, preexec_fn=_die_with_parent
            )
            procs.append(p)
            threading.Thread(target=lambda r=r, p=p: exits.put((r, p.wait())), daemon=True).start()
        ended, stop_at = 0, None
        while ended < nproc:
            try:
                r, code = exits.get(timeout=0.1 if stop_at is None else max(stop_at - time.monotonic(), 0.01))
            except queue.Empty:
                if stop_at is not None and time.monotonic() >= stop_at:
                    for rr, p in enumerate(procs):
                        if p.poll() is None:
                            log(f"netcl run: ending rank {rr} (pid {p.pid})")
                    break
                continue
            ended += 1
            if code != 0 and first_failure is None:
                first_failure = (r, code)
                stop_at = time.monotonic() + GRACE_SECONDS
                log(
                    f"netcl run: rank {r} (pid {procs[r].pid}) "
                    f"{_status(code)}; the other ranks stop at their next "
                    f"collective, or in {GRACE_SECONDS:g} s"
                )
            elif code != 0:
                log(f"netcl run: rank {r} (pid {procs[r].pid}) {_status(code)}")
    except KeyboardInterrupt:
        log("netcl run: interrupted; stopping every rank")
        first_failure = first_failure or (-1, 130)
    finally:
        signal.signal(signal.SIGTERM, previous)
        _stop(procs, log)
        left = remove_segments(job)
        if left:
            log(f"netcl run: removed shared memory a stopped rank left: {', '.join(left)}")
    if first_failure is None:
        return 0
    code = first_failure[1]
    return code if code > 0 else 128 - code
