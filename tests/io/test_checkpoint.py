"""Checkpoints: round trip, strict checks, atomic writes (an injected failure and a killed process)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import netcl.core.files as files_mod
from netcl import nn, optim
from netcl.io import CheckpointError, atomic_write, load_checkpoint, read_checkpoint, save_checkpoint
from netcl.ops import random


def _model(queue, hidden=5):
    return nn.Sequential(nn.Linear(queue, 4, hidden), nn.ReLU(), nn.Linear(queue, hidden, 3))


def _params(model):
    return {k: v.to_host() for k, v in model.state_dict().items()}


def test_round_trip(queue, tmp_path):
    random.manual_seed(1)
    m = _model(queue)
    opt = optim.Adam(m.parameters(), lr=0.01)
    for p in m.parameters():
        p.grad = p.value.clone()
    opt.step()
    sched = optim.StepLR(opt, 2)
    sched.step()
    random.default_generator.take(17)
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, m, opt, sched, step=7, epoch=2, extra={"note": "x"})
    rng_state = random.default_generator.state_dict()

    random.manual_seed(99)
    m2 = _model(queue)
    opt2 = optim.Adam(m2.parameters(), lr=0.5)
    sched2 = optim.StepLR(opt2, 2)
    meta = load_checkpoint(path, m2, opt2, sched2)
    assert meta["step"] == 7 and meta["epoch"] == 2 and meta["extra"] == {"note": "x"}
    for k, v in _params(m).items():
        np.testing.assert_array_equal(_params(m2)[k], v)
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert opt2.state_dict()["state"][0]["step"] == 1
    np.testing.assert_array_equal(
        opt2.state_dict()["state"][1]["exp_avg"], opt.state_dict()["state"][1]["exp_avg"]
    )
    assert random.default_generator.state_dict() == rng_state
    tensors, _ = read_checkpoint(path)
    assert "model/0.weight" in tensors and "optim/0/exp_avg" in tensors


def test_refuses_mismatches(queue, tmp_path):
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, _model(queue), optim.SGD(_model(queue).parameters(), lr=0.1))
    with pytest.raises(CheckpointError, match=r"0.weight: shape \(5, 4\) in the checkpoint, \(6, 4\)"):
        load_checkpoint(path, _model(queue, hidden=6))
    with pytest.raises(CheckpointError, match="holds SGD state, not Adam"):
        m = _model(queue)
        load_checkpoint(path, m, optim.Adam(m.parameters()))
    with pytest.raises(CheckpointError, match="missing keys: 3.weight, 3.bias"):
        load_checkpoint(
            path,
            nn.Sequential(nn.Linear(queue, 4, 5), nn.ReLU(), nn.Linear(queue, 5, 3), nn.Linear(queue, 3, 3)),
        )
    (tmp_path / "junk").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(CheckpointError, match="not a readable"):
        load_checkpoint(tmp_path / "junk", _model(queue))
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "absent", _model(queue))


def test_failed_save_keeps_the_old_checkpoint(queue, tmp_path, monkeypatch):
    path = tmp_path / "c.safetensors"
    m = _model(queue)
    save_checkpoint(path, m)
    before = _params(m)

    def broken(f, data):
        f.write(data[: len(data) // 2])
        raise OSError("disk full (injected)")

    monkeypatch.setattr(files_mod, "_write_bytes", broken)
    for p in m.parameters():
        p.value.fill_(3.0)
    with pytest.raises(OSError, match="injected"):
        save_checkpoint(path, m)
    assert [p.name for p in tmp_path.iterdir()] == ["c.safetensors"]  # the temporary file is gone
    m2 = _model(queue)
    load_checkpoint(path, m2)
    for k, v in before.items():
        np.testing.assert_array_equal(_params(m2)[k], v)


def test_killed_save_keeps_the_old_checkpoint(queue, tmp_path):
    path = tmp_path / "c.safetensors"
    script = textwrap.dedent(f"""
        import os, signal
        import netcl.io.checkpoint as c
        import netcl.core.files as files
        from netcl import nn
        from netcl.core.device import manager
        q = manager.default().queue
        m = nn.Sequential(nn.Linear(q, 4, 5), nn.ReLU(), nn.Linear(q, 5, 3))
        c.save_checkpoint({str(path)!r}, m)
        print("saved", flush=True)
        def die(f, data):
            f.write(data[: len(data) // 2]); f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        files._write_bytes = die
        for p in m.parameters():
            p.value.fill_(3.0)
        c.save_checkpoint({str(path)!r}, m)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "saved" in proc.stdout and proc.returncode == -9, proc.stderr
    m = _model(queue)
    load_checkpoint(path, m)
    assert not np.any(_params(m)["0.weight"] == 3.0)


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_writes_make_files_as_open_does(tmp_path, umask, mode):
    """Mode 0666 less the umask (mkstemp's 0600 made lm-train's checkpoint, weights and config.json
    unreadable to the group while its other files were 0644)."""
    old = os.umask(umask)
    try:
        atomic_write(tmp_path / "new.json", b"{}")
        (tmp_path / "old.json").write_bytes(b"[]")
        atomic_write(tmp_path / "old.json", b"{}")  # a replaced file too
    finally:
        os.umask(old)
    for name in ("new.json", "old.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode
        assert (tmp_path / name).read_bytes() == b"{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.json", "old.json"]
