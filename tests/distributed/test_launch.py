"""The launcher's checks, in process: device assignment and bad command lines."""

from __future__ import annotations

import pytest

from netcl.cli import main
from netcl.distributed.launch import assign_devices, spawn_ranks
from netcl.errors import DeviceError, NetclError


def test_devices_are_one_per_rank_or_one_for_all(device, monkeypatch):
    spec = device.spec
    assert assign_devices(3, spec) == [spec] * 3
    assert assign_devices(2, f"{spec},{spec}") == [spec, spec]
    with pytest.raises(NetclError, match="names 3 devices for --nproc 2"):
        assign_devices(2, f"{spec},{spec},{spec}")
    with pytest.raises(DeviceError, match="no device at index 9:9"):
        assign_devices(2, "9:9")
    monkeypatch.setenv("NETCL_DEVICE", spec)
    assert assign_devices(2, None) == [None, None]  # NETCL_DEVICE stays what every rank inherits


def test_bad_command_lines(capsys, monkeypatch):
    assert main(["run", "--nproc", "2", "no/such/script.py"]) == 1
    assert "no script no/such/script.py" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "--nproc", "0", "x.py"])
    assert "must be a positive integer" in capsys.readouterr().err
    monkeypatch.setenv("NETCL_RANK", "0")
    monkeypatch.setenv("NETCL_WORLD_SIZE", "2")
    monkeypatch.setenv("NETCL_DIST_ID", "job-1")
    assert spawn_ranks(["train"], 2) is None  # inside a rank: go on, do not start ranks again
    monkeypatch.delenv("NETCL_RANK")
    assert spawn_ranks(["train"], 1) is None
