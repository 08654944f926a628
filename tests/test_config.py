"""netcl.config: the environment knobs, their checks, and the README's table of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from netcl import config

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_lists_every_jit_knob_with_its_default():
    rows = dict(re.findall(r"^\| `(NETCL_\w+)` \| `(\d+)` \|", README.read_text(), re.M))
    for name, (default, _, _) in config.JIT_KNOBS.items():
        assert rows.get(name) == str(default), f"README's knob table: {name}"


@pytest.mark.parametrize(
    "value,match",
    [("abc", "expected an integer >= 1"), ("-2", "expected an integer >= 1"), ("3", "one of 1, 2, 4, 8, 16")],
)
def test_a_bad_knob_value_is_an_error_naming_it(monkeypatch, value, match):
    monkeypatch.setenv("NETCL_EW_VEC", value)
    with pytest.raises(ValueError, match=f"NETCL_EW_VEC={value!r}|NETCL_EW_VEC={value}") as err:
        config.jit_knob("NETCL_EW_VEC")
    assert re.search(match, str(err.value))
    monkeypatch.setenv("NETCL_DEBUG", "loud")
    with pytest.raises(ValueError, match="NETCL_DEBUG='loud': expected an integer >= 0"):
        config.debug_level()


def test_unset_or_empty_knobs_take_their_defaults(monkeypatch):
    monkeypatch.delenv("NETCL_RED_UNROLL", raising=False)
    assert config.jit_knob("NETCL_RED_UNROLL") == 4
    monkeypatch.setenv("NETCL_RED_UNROLL", " ")
    assert config.jit_knob("NETCL_RED_UNROLL") == 4
    monkeypatch.setenv("NETCL_RED_UNROLL", "8")
    assert config.jit_knob("NETCL_RED_UNROLL") == 8
