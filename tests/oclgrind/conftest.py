"""Every case of tests/oclgrind carries the `oclgrind_case` marker, so the test matrix can leave the
GPU-shaped ones to the Oclgrind configuration (scripts/test_matrix.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.oclgrind_case)
