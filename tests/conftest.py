"""Shared fixtures: the device the suite runs on (the default device: PoCL's CPU device in CI)."""

from __future__ import annotations

import numpy as np
import pytest

from netcl import kernels
from netcl.core import capture
from netcl.core.device import manager
from netcl.ops import random


@pytest.fixture(scope="session")
def device():
    return manager.default("auto")


@pytest.fixture(scope="session")
def queue(device):
    return device.queue


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from netcl's default generator as a fresh process has it (seed 0, counter 0): the
    weights a test's layers draw must not depend on which tests ran before it in the same worker (a bfloat16
    ReLU network's gradients against float32's failed for 1 of 30 draws, and pytest-xdist's order decides)."""
    random.manual_seed(0)


@pytest.fixture(autouse=True)
def _own_plans():
    """Every test builds its own launch plans: a plan keeps the kernel its op chose from module switches that
    tests monkeypatch (FORCE_KIND, variant overrides, tiles), so one test's plans must not serve the next."""
    capture.plans.invalidate()


@pytest.fixture(autouse=True)
def _emulation_unoptimized(request, monkeypatch):
    """A GPU-shaped test on a CPU device (the GPUs' kernels run there for their index arithmetic, which no CPU
    user gets) builds its programs with -cl-opt-disable: PoCL builds them ~5x faster (netcl.kernels'
    EXTRA_OPTIONS, part of each program's key, so no other test meets these builds). On a GPU they are
    the real kernels, built as users get them."""
    if request.node.get_closest_marker("gpu_shaped") is not None and \
            request.getfixturevalue("device").capabilities.kind == "cpu":
        monkeypatch.setattr(kernels, "EXTRA_OPTIONS", ("-cl-opt-disable",))
