"""Training end to end: digits accuracy, bitwise-identical resume, and the `netcl train` command."""

from __future__ import annotations

import json

import numpy as np
import pytest

from netcl import optim
from netcl.cli import main
from netcl.data import DataLoader, load_digits
from netcl.io import load_checkpoint, save_checkpoint
from netcl.ops import random
from netcl.train import GraphedStep, build_model, evaluate, train_epoch


@pytest.fixture(scope="module")
def digits():
    return load_digits()


def test_digits_mlp_reaches_97_percent(queue, digits):
    random.manual_seed(0)
    model = build_model("mlp", queue, digits.image_shape, 10)
    loader = DataLoader((digits.x_train, digits.y_train), 32, queue, shuffle=True, seed=0, drop_last=True)
    opt = optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    epochs = 8
    sched = optim.CosineAnnealing(opt, T_max=epochs * len(loader))
    losses = []
    for _ in range(epochs):
        losses += train_epoch(model, opt, loader, sched)
    assert np.mean(losses[-10:]) < 0.2 * np.mean(losses[:10])
    assert evaluate(model, digits.x_test, digits.y_test, queue) >= 0.97


def _setup(queue, digits):
    random.manual_seed(3)
    model = build_model("cnn", queue, digits.image_shape, 10)
    # 330 images in batches of 32: ten full batches and a partial one (which a GraphedStep runs eagerly)
    loader = DataLoader((digits.x_train[:330], digits.y_train[:330]), 32, queue, shuffle=True, seed=5)
    opt = optim.AdamW(model.parameters(), lr=3e-3)
    sched = optim.CosineAnnealing(opt, T_max=2 * len(loader))
    return model, loader, opt, sched


@pytest.mark.parametrize("graphed", [False, True])
def test_resume_is_bitwise_identical(queue, digits, tmp_path, graphed):
    """2 epochs straight (eager) == 1 epoch + save + load + 1 epoch, bit for bit; with graphed=True the
    interrupted run records its step and replays it (netcl train's default), in both halves."""
    model, loader, opt, sched = _setup(queue, digits)
    for epoch in range(2):
        loader.set_epoch(epoch)
        train_epoch(model, opt, loader, sched)
    straight = {k: v.to_host() for k, v in model.state_dict().items()}

    def epoch_of(model, loader, opt, sched):
        train_epoch(model, opt, loader, sched, step=GraphedStep(model, opt, sched) if graphed else None)

    model, loader, opt, sched = _setup(queue, digits)
    loader.set_epoch(0)
    epoch_of(model, loader, opt, sched)
    save_checkpoint(tmp_path / "c.safetensors", model, opt, sched, epoch=1, loader=loader)

    model, loader, opt, sched = _setup(queue, digits)  # fresh objects, different from the saved ones
    meta = load_checkpoint(tmp_path / "c.safetensors", model, opt, sched, loader)
    loader.set_epoch(meta["epoch"])
    epoch_of(model, loader, opt, sched)
    resumed = {k: v.to_host() for k, v in model.state_dict().items()}
    for k in straight:
        assert np.array_equal(straight[k], resumed[k]), k


def test_netcl_train_command_and_resume(tmp_path, capsys):
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
            "64",
            "--out",
            str(out),
            "--no-progress",
        ]

    assert main(args(1)) == 0
    assert (out / "checkpoint.safetensors").exists() and (out / "curves.png").stat().st_size > 1000
    assert main(args(2) + ["--resume"]) == 0
    text = capsys.readouterr().out
    assert "resumed from" in text and "epoch 2:" in text
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["test_accuracy"]) == 2 and metrics["final_test_accuracy"] > 0.8
