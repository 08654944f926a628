"""`make test-gpu` (scripts/test_gpu.py): the suite on the default GPU, or one line saying there is none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from netcl.core.device import manager

ROOT = Path(__file__).resolve().parents[1]


def test_it_names_the_gpu_or_says_there_is_none():
    """--check stops before the suite (the suite runs this test: it must not start itself again)."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "test_gpu.py"), "--check"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    gpus = [h for h in manager.devices() if h.capabilities.kind == "gpu" and not h.is_simulator]
    if gpus:
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("make test-gpu: the suite on ") and "(NETCL_DEVICE=gpu)" in done.stdout
    else:
        assert done.returncode == 1 and done.stdout == ""
        assert done.stderr == (
            "make test-gpu: no GPU OpenCL device is visible here (`netcl devices` lists what is); install "
            "the GPU vendor's OpenCL driver, or run `make test` for the CPU drivers\n")


def test_the_makefile_and_the_readme_name_it():
    recipe = "\ntest-gpu: $(STAMP)\n\t$(PY) scripts/test_gpu.py $(PYTEST_ARGS)"
    assert recipe in (ROOT / "Makefile").read_text()
    assert "make test-gpu" in (ROOT / "README.md").read_text()


def test_named_tests_replace_the_whole_suite():
    """`make test-gpu PYTEST_ARGS=tests/ops/test_matmul.py` runs that file, not the suite and the file."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import test_gpu
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert test_gpu.targets(["-q", "-p", "no:cacheprovider", "-rf"]) == ["tests"]
    assert test_gpu.targets(["-q", "tests/ops/test_matmul.py"]) == []
    assert test_gpu.targets(["tests/ops/test_matmul.py::test_tiled_four_wide_fetch", "-x"]) == []
    assert test_gpu.targets(["-k", "no/such/path"]) == ["tests"]
