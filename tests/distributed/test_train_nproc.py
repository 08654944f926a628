"""`netcl train --nproc 2 --devices A,B`: the CNN trained by two processes (DDP, each rank its rows of every
global batch, balanced by measured speed when the devices differ); rank 0 writes and logs each rank's device
and share."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.distributed.launching import ROOT, environment, two_devices


def test_netcl_train_with_two_processes(tmp_path):
    out = tmp_path / "run"
    specs, balance = two_devices()
    cmd = [sys.executable, "-m", "netcl.cli", "train", "--nproc", "2", "--devices", ",".join(specs), *balance,
           "--dataset", "digits", "--epochs", "1", "--train-limit", "320", "--out", str(out), "--no-progress"]
    proc = subprocess.run(cmd, env=environment(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("epoch 1:") == 1  # rank 0 logs, rank 1 is quiet
    assert "batch 32 x 2 processes, 5 steps per epoch, eager steps" in proc.stdout
    assert "global batch 64, balanced by measured speed" in proc.stdout
    for r, spec in enumerate(specs):  # each rank's device and its first share
        assert re.search(rf"rank {r}: \[{spec}\] .*, share 32 of 64 \(50\.0%\)", proc.stdout), proc.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["processes"] == 2 and metrics["epochs"] == 1
    assert sum(metrics["shares"]) == 64
    # two ranks on one shared CPU: a measurement may find one worth less than the all-reduce it costs
    assert min(metrics["shares"]) >= 1 or "is worth less than it costs" in proc.stdout, proc.stdout
    assert 0.2 < metrics["final_test_accuracy"] <= 1.0  # 5 steps of 64 images: well above chance (0.1)
    assert (out / "checkpoint.safetensors").is_file()
