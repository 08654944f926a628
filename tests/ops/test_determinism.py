"""netcl.ops.determinism: the switch between deterministic kernels (the default) and the float-atomic fast
paths, its environment default and its bad input. The kernels it selects are tested beside their ops
(tests/ops/test_movement.py, tests/ops/test_attention.py) and a whole GPT step in
tests/models/test_gpt_determinism.py."""

from __future__ import annotations

import numpy as np
import pytest

import netcl
from netcl.ops import determinism


@pytest.fixture(autouse=True)
def _restore():
    old = determinism._deterministic[0]
    yield
    determinism._deterministic[0] = old


def test_on_by_default_and_switched_at_run_time(monkeypatch):
    monkeypatch.delenv("NETCL_DETERMINISTIC", raising=False)
    determinism._deterministic[0] = None
    assert netcl.get_deterministic() is True
    netcl.set_deterministic(False)
    assert netcl.get_deterministic() is False
    netcl.set_deterministic(np.bool_(True))
    assert netcl.get_deterministic() is True
    assert netcl.ops.set_deterministic is netcl.set_deterministic


def test_environment_gives_the_default_until_set(monkeypatch):
    determinism._deterministic[0] = None
    monkeypatch.setenv("NETCL_DETERMINISTIC", "0")
    assert netcl.get_deterministic() is False
    monkeypatch.setenv("NETCL_DETERMINISTIC", "1")
    assert netcl.get_deterministic() is True
    monkeypatch.setenv("NETCL_DETERMINISTIC", "0")
    netcl.set_deterministic(True)   # an explicit choice wins over the environment
    assert netcl.get_deterministic() is True


@pytest.mark.parametrize("bad", [1, 0, "true", None, 1.0])
def test_a_flag_that_is_not_a_bool_is_a_type_error(bad):
    netcl.set_deterministic(True)
    with pytest.raises(TypeError, match=r"set_deterministic: flag must be True or False, got .*"):
        netcl.set_deterministic(bad)
    assert netcl.get_deterministic() is True
