"""`netcl train --amp`: the MLP on digits under float16 autocast with loss scaling, recorded and replayed,
reaches the accuracy of float32 training; the flag's choices are checked."""

from __future__ import annotations

import json

import pytest

from netcl.cli import main
from netcl.io.checkpoint import read_checkpoint


def _args(out, *extra):
    return ["train", "--dataset", "digits", "--model", "mlp", "--epochs", "4", "--batch-size", "64", "--out",
            str(out), "--no-progress", "--seed", "1", *extra]


def test_netcl_train_amp_matches_float32(tmp_path, capsys):
    assert main(_args(tmp_path / "f32")) == 0
    assert main(_args(tmp_path / "amp", "--amp")) == 0
    text = capsys.readouterr().out
    assert "mixed precision: autocast float16, dynamic loss scaling" in text
    acc = {
        k: json.loads((tmp_path / k / "metrics.json").read_text())["final_test_accuracy"]
        for k in ("f32", "amp")
    }
    assert acc["amp"] > 0.9
    assert abs(acc["amp"] - acc["f32"]) <= 0.02  # ~540 test images: a point is 5 images


def test_netcl_train_amp_choices(tmp_path):
    with pytest.raises(SystemExit):
        main(_args(tmp_path / "bad", "--amp", "float32"))


def test_netcl_train_amp_resume_keeps_the_loss_scale(tmp_path, capsys):
    """The checkpoint holds the GradScaler's state, and --resume continues from it."""
    out = tmp_path / "run"

    def args(epochs):
        return [
            "train",
            "--dataset",
            "digits",
            "--model",
            "mlp",
            "--epochs",
            str(epochs),
            "--batch-size",
            "256",
            "--train-limit",
            "512",
            "--out",
            str(out),
            "--no-progress",
            "--amp",
        ]

    assert main(args(1)) == 0
    _, meta = read_checkpoint(out / "checkpoint.safetensors")
    saved = meta["extra"]["grad_scaler"]
    assert saved["scale"] == 65536.0 and saved["growth_interval"] == 2000 and saved["_growth_tracker"] == 2
    assert main(args(2) + ["--resume"]) == 0
    assert "resumed from" in capsys.readouterr().out
    _, meta = read_checkpoint(out / "checkpoint.safetensors")
    assert meta["extra"]["grad_scaler"]["_growth_tracker"] == 4  # counted on from the saved tracker
