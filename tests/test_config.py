"""netcl.config: the environment knobs, their checks, and the README's table of them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from netcl import config
from netcl.errors import ConfigError

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


def _readme_variables() -> list[str]:
    rows = re.findall(r"^\| (`NETCL_\w+`(?:, `NETCL_\w+`)*) \|", README.read_text(), re.M)
    return [name for row in rows for name in re.findall(r"NETCL_\w+", row)]


def test_the_readme_lists_every_variable_config_reads():
    read = set(re.findall(r'"(NETCL_\w+)"', Path(config.__file__).read_text()))
    assert read == set(_readme_variables())


# a value each variable cannot take, and what else must be set for it to be read at all
BAD_VALUES = {
    "NETCL_RANK": ("x", {}),  # without NETCL_WORLD_SIZE
    "NETCL_WORLD_SIZE": ("0", {"NETCL_RANK": "0"}),
    "NETCL_DIST_ID": ("a b!", {"NETCL_RANK": "0", "NETCL_WORLD_SIZE": "1"}),
    "NETCL_PROFILE": ("trace.txt", {}),  # a trace must be .json
    "NETCL_EW_VEC": ("3", {}),
}


@pytest.mark.parametrize("name", [n for n in _readme_variables() if n != "NETCL_DEVICE"])
def test_check_environment_refuses_a_bad_value_of_every_variable(monkeypatch, tmp_path, name):
    """NETCL_DEVICE is the one variable config cannot judge: the device manager checks it against the
    devices there are (tests/core/test_device.py)."""
    for other in _readme_variables():
        monkeypatch.delenv(other, raising=False)
    value, others = BAD_VALUES.get(name, ("bogus", {}))
    if name == "NETCL_CACHE_DIR":
        value = str(tmp_path / "a-file")
        Path(value).write_text("x")
    for key, v in {**others, name: value}.items():
        monkeypatch.setenv(key, v)
    with pytest.raises(ConfigError, match=name) as err:
        config.check_environment()
    assert isinstance(err.value, ValueError) and "\n" not in str(err.value)
    for key in {**others, name: value}:
        monkeypatch.delenv(key)
    config.check_environment()  # unset, each takes its default


@pytest.mark.parametrize("value,want", [("1", True), ("on", True), (" TRUE ", True), ("yes", True),
                                        ("0", False), ("off", False), ("False", False), ("", True)])
def test_on_off_variables_take_the_usual_spellings(monkeypatch, value, want):
    monkeypatch.setenv("NETCL_FUSION", value)
    assert config.fusion_enabled() is want


def test_a_json_path_turns_the_whole_program_profile_on(monkeypatch):
    monkeypatch.setenv("NETCL_PROFILE", "out/run.JSON")
    assert config.profiling() and config.profile_trace() == "out/run.JSON"
    monkeypatch.setenv("NETCL_PROFILE", "0")
    assert not config.profiling() and config.profile_trace() is None


def _netcl(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "netcl", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env}, cwd=README.parent)


def test_the_command_says_a_bad_setting_in_one_line():
    """`import netcl` reads no knob: --help works whatever the environment holds; a command checks every
    variable first (the JIT's launch knobs were read at import, a 20-line traceback)."""
    done = _netcl(["--help"], NETCL_EW_VEC="abc")
    assert done.returncode == 0 and "usage: netcl" in done.stdout and not done.stderr
    for name, value, words in (
        ("NETCL_EW_VEC", "abc", "expected an integer >= 1 (unset it for 4)"),
        ("NETCL_HALF", "bogus", "expected auto, off, storage or native (unset it for auto)"),
        ("NETCL_DIST_TIMEOUT", "abc", "expected a number > 0 (unset it for 60)"),
    ):
        done = _netcl(["devices"], **{name: value})
        assert done.returncode == 1 and done.stdout == "", done.stderr
        assert done.stderr == f"netcl: {name}={value!r}: {words}\n"


def test_a_library_user_meets_the_error_at_the_first_launch_that_reads_the_knob():
    code = ("import numpy as np, netcl\n"
            "from netcl.errors import ConfigError\n"
            "q = netcl.manager.default().queue\n"
            "x = netcl.Tensor.from_host(q, np.ones(3, np.float32))\n"
            "try:\n    (x + 1).to_host()\n"
            "except ConfigError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NETCL_EW_ALIGNED": "-1"}, cwd=README.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "NETCL_EW_ALIGNED='-1': expected an integer >= 0 (unset it for 1)\n"
