"""Shared fixtures: the device the suite runs on (the default device: PoCL's CPU device in CI)."""

from __future__ import annotations

import numpy as np
import pytest

from netcl.core.device import manager


@pytest.fixture(scope="session")
def device():
    return manager.default("auto")


@pytest.fixture(scope="session")
def queue(device):
    return device.queue


@pytest.fixture
def rng():
    return np.random.default_rng(12345)
