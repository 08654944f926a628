"""scripts/test_matrix.py's lists of paths: every gpu_shaped test of a run-once path is where the
configuration that runs the GPU-shaped tests looks for it (ONCE_GPU_SHAPED), and every listed path exists."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _matrix():
    spec = importlib.util.spec_from_file_location("test_matrix_script", ROOT / "scripts" / "test_matrix.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _files(path: str) -> list[Path]:
    p = ROOT / path
    return sorted(p.rglob("test_*.py")) if p.is_dir() else [p]


def test_gpu_shaped_tests_of_run_once_paths_are_listed():
    m = _matrix()
    for path in m.ONCE + m.LAYERS + m.KERNEL_TESTS + m.ONCE_GPU_SHAPED:
        assert (ROOT / path).exists(), path
    assert set(m.ONCE_GPU_SHAPED) <= set(m.ONCE)
    marked = re.compile(r"\bgpu_shaped\b|\bGPU_SHAPED\b")
    holding = {path for path in m.ONCE for f in _files(path) if marked.search(f.read_text())}
    assert holding == set(m.ONCE_GPU_SHAPED), f"run-once paths with gpu_shaped tests: {sorted(holding)}"
