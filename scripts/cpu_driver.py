#!/usr/bin/env python
"""Make sure this machine has an OpenCL driver whose compiler builds programs (the Makefile's setup step).

    .venv/bin/python scripts/cpu_driver.py

The `pocl` extra brings PyPI's PoCL 3.0, whose LLVM 14 does not know every CPU: on AMD's Zen 5 it names the
CPU 'generic' and builds nothing ("unknown target CPU 'generic'", pocl/pocl#1049). Where no device but a
simulator builds, this installs Debian's PoCL (3.1, LLVM 15: `apt-get install pocl-opencl-icd`, through
sudo when not root), which netcl then finds beside it, as `.ci/run` does; where apt-get is missing it says
what to install and exits 1. A machine with a working driver is left as it is (exit 0, nothing printed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

_CHECK = """
from netcl.core.device import manager
handles = [h for h in manager.devices() if not h.is_simulator]
bad = [h.compiler_unusable for h in handles if h.compiler_unusable]
print("ok" if len(bad) < len(handles) else "\\n".join(bad) or "no OpenCL device")
"""


def problem() -> str | None:
    """None where some non-simulated device builds programs, else why not (in a fresh process: the ICD
    loader reads the installed drivers once)."""
    out = subprocess.run([sys.executable, "-c", _CHECK], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        return (out.stderr.strip().splitlines() or ["the device check failed"])[-1]
    text = out.stdout.strip()
    return None if text == "ok" else text


def main() -> int:
    why = problem()
    if why is None:
        return 0
    apt = shutil.which("apt-get")
    sudo = [] if os.geteuid() == 0 else (["sudo"] if shutil.which("sudo") else None)
    if apt is None or sudo is None:
        print(f"netcl: {why}\nnetcl: install an OpenCL CPU driver whose compiler knows this CPU (Debian and "
              "Ubuntu: `sudo apt-get install pocl-opencl-icd`), then run make again", file=sys.stderr)
        return 1
    print(f"netcl: {why}\nnetcl: installing Debian's PoCL (apt-get install pocl-opencl-icd)", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in ([*sudo, apt, "update", "-qq"],
                [*sudo, apt, "install", "-y", "-qq", "pocl-opencl-icd", "ocl-icd-libopencl1"]):
        if subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL).returncode != 0:
            print(f"netcl: `{' '.join(cmd)}` failed", file=sys.stderr)
            return 1
    why = problem()
    if why is not None:
        print(f"netcl: still no usable OpenCL device after installing Debian's PoCL: {why}", file=sys.stderr)
        return 1
    print("netcl: Debian's PoCL builds here; netcl's default device is now that one", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
