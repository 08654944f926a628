"""Running a bench/ script from the tests: a child Python at the checkout's root, the checkout first on its
path (the rest of PYTHONPATH kept: a GPU machine's pyopencl may live there)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_bench(script: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python bench/<script> args...`, its output captured (text), whatever its exit status."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True,
                          timeout=timeout, check=False)
