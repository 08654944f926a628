"""Helpers of the multi-process tests: start a script under `netcl run` (or mpiexec) and collect what it
did."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from netcl.core.device import manager

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MPIEXEC = Path(sys.executable).parent / "mpiexec"


def say(line: str) -> None:
    """For the scripts the ranks run: one line to stdout in one write(2). The ranks share the pipe,
    and print() with PYTHONUNBUFFERED=1 writes a line's text and its newline apart, so two ranks' lines
    could interleave (seen in CI: rank 0's and rank 2's errors on one line)."""
    os.write(1, (line + "\n").encode())


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def lines(self, prefix: str) -> list[str]:
        return [line for line in self.stdout.splitlines() if line.startswith(prefix)]


def environment(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("NETCL_RANK", "NETCL_WORLD", "NETCL_DIST", "PMI_", "OMPI_", "PMIX_"))
    }
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def netcl_run(nproc: int, script: str, *args: str, timeout: float = 120, devices: list[str] | None = None,
              **env: str) -> Result:
    """`python -m netcl.cli run --nproc N [--devices A,B,..] tests/distributed/SCRIPT ARGS` with NETCL_* `env`
    added."""
    cmd = [sys.executable, "-m", "netcl.cli", "run", "--nproc", str(nproc)]
    cmd += ["--devices", ",".join(devices)] if devices else []
    cmd += [str(HERE / script), *args]
    return _run(cmd, environment(**env), timeout)


def mpiexec(nproc: int, script: str, *args: str, timeout: float = 120, **env: str) -> Result:
    cmd = [
        str(MPIEXEC if MPIEXEC.exists() else shutil.which("mpiexec")),
        "-n",
        str(nproc),
        sys.executable,
        str(HERE / script),
        *args,
    ]
    return _run(cmd, environment(**env), timeout)


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> Result:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return Result(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0)


@functools.lru_cache(maxsize=1)
def mpi_available() -> bool:
    """mpi4py imports and the mpiexec the tests would use starts one rank of this Python that sees MPI: an
    mpiexec of another MPI than mpi4py's, or one that refuses to run (OpenMPI's as root), is no MPI here."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    launcher = MPIEXEC if MPIEXEC.exists() else shutil.which("mpiexec")
    if launcher is None:
        return False
    probe = [str(launcher), "-n", "1", sys.executable, "-c",
             "from mpi4py import MPI; assert MPI.COMM_WORLD.Get_size() == 1"]
    try:
        return subprocess.run(probe, env=environment(), capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def two_devices() -> tuple[list[str], list[str]]:
    """Two devices of different platforms and of the default device's kind when this machine has them (PoCL's
    wheel beside Debian's), with the --balance flags that go with them (none: auto balances different
    devices); else one device twice, balanced on purpose (--balance on). Not a GPU beside a CPU: the tests'
    timed slowdowns and float tolerances assume devices of one kind; nor a device whose compiler builds
    nothing (PyPI's PoCL on a CPU its LLVM does not know)."""
    kind = manager.default().kind
    first: dict[int, str] = {}
    for h in manager.devices():
        if not h.is_simulator and h.kind == kind and not h.compiler_unusable:
            first.setdefault(h.index[0], h.spec)
    specs = list(first.values())[:2]
    return (specs, []) if len(specs) == 2 else (specs * 2, ["--balance", "on"])


def shm_names(job: str) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(job))
