#!/usr/bin/env python
"""Run the whole test suite, the guide's pages included, on this machine's default GPU.

    .venv/bin/python scripts/test_gpu.py [pytest args ...]      (what `make test-gpu` runs)
    .venv/bin/python scripts/test_gpu.py --check                 (only say which GPU it would use)

For a machine with a GPU's OpenCL driver (NVIDIA, AMD ROCm, Intel compute-runtime, Apple): every test
runs with NETCL_DEVICE=gpu, so the suite's device (tests/conftest.py), its subprocesses and the guide's
code blocks all take the GPU netcl picks ("auto" without the CPU: `netcl devices` marks it). Where no GPU
OpenCL device is visible (simulators such as Oclgrind do not count), it says so in one line and exits 1
without running anything: a run that silently fell back to a CPU would not test what it claims.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    os.environ["NETCL_DEVICE"] = "gpu"
    sys.path.insert(0, str(ROOT))
    from netcl.core.device import manager  # noqa: PLC0415  (after NETCL_DEVICE is set, from this checkout)
    from netcl.errors import DeviceError  # noqa: PLC0415

    try:
        device = manager.default()
    except DeviceError:
        print("make test-gpu: no GPU OpenCL device is visible here (`netcl devices` lists what is); install "
              "the GPU vendor's OpenCL driver, or run `make test` for the CPU drivers", file=sys.stderr)
        return 1
    print(f"make test-gpu: the suite on {device.describe()} (NETCL_DEVICE=gpu)", flush=True)
    if argv[:1] == ["--check"]:
        return 0
    return subprocess.call([sys.executable, "-m", "pytest", *targets(argv), *workers(argv), *argv], cwd=ROOT)


def targets(argv: list[str]) -> list[str]:
    """The whole suite, unless the arguments name tests of their own (a path, or a path::test)."""
    named = [a for a in argv if not a.startswith("-") and (ROOT / a.split("::")[0]).exists()]
    return [] if named else ["tests"]


def workers(argv: list[str]) -> list[str]:
    """pytest-xdist's options for one test process per core (at most 16), unless the arguments choose: the
    tests' time is mostly the host building programs and preparing data, which one GPU serves for many
    processes (the H200 machine, 16 cores, from cold caches: 156-172 s with 12-14 processes)."""
    try:
        import xdist  # noqa: F401, PLC0415
    except ImportError:
        return []
    if "no:xdist" in argv or any(a.startswith(("-n", "--numprocesses")) for a in argv):
        return []
    return ["-n", str(max(1, min(16, os.cpu_count() or 1)))]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
