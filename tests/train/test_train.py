"""Training end to end: digits accuracy, bitwise-identical resume, and the `netcl train` command."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from netcl import optim
from netcl.cli import main
from netcl.data import DataLoader, load_digits
from netcl.io import load_checkpoint, save_checkpoint
from netcl.io.checkpoint import read_checkpoint
from netcl.ops import random
from netcl.train import GraphedStep, build_model, evaluate, train_epoch
from tests.distributed.launching import ROOT, environment


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


def test_a_rank_left_out_of_netcl_train_still_trains_what_one_process_trains(tmp_path):
    """Rank 1 slowed to 50 ms a sample (tests/train/slowed_rank_script.py; one sample takes ~25x the other
    rank's whole batch of 64, which runs ~30,000 samples/s on a 2-core PoCL machine) is left out after 3
    steps: it only steps the cosine schedule, does not evaluate (its weights are behind; the accuracy is
    rank 0's), and rank 0's checkpoint equals one process's. With rank 0 slowed instead, rank 0 gets rank
    1's weights and AdamW state before it writes the checkpoint."""
    common = ["--dataset", "digits", "--model", "mlp", "--epochs", "2", "--train-limit", "320", "--eager",
              "--no-progress", "--seed", "3"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["train", *common, "--batch-size", "64", "--out", str(one)]) == 0
    a, meta_a = read_checkpoint(one / "checkpoint.safetensors")
    one_m = json.loads((one / "metrics.json").read_text())
    for slow, shares in ((1, [64, 0]), (0, [0, 64])):
        two = tmp_path / f"two-slow{slow}"
        cmd = [sys.executable, "-m", "netcl.cli", "run", "--nproc", "2", "--balance", "on",
               str(ROOT / "tests/train/slowed_rank_script.py"), str(slow), "0.05",
               "train", *common, "--batch-size", "32", "--nproc", "2", "--out", str(two)]
        proc = subprocess.run(cmd, env=environment(), cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"balance: after step 3, shares [32, 32] -> {shares} of 64" in proc.stdout, proc.stdout
        assert f"balance: rank {slow} (" in proc.stdout and "is worth less than it costs" in proc.stdout
        b, meta_b = read_checkpoint(two / "checkpoint.safetensors")
        assert sorted(a) == sorted(b)
        for k in a:
            np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-6, err_msg=f"slow rank {slow}: {k}")
        two_m = json.loads((two / "metrics.json").read_text())
        assert two_m["shares"] == shares
        # only the working rank evaluated: the accuracy is one process's
        assert two_m["test_accuracy"] == pytest.approx(one_m["test_accuracy"], abs=1e-9)
        loss_a, loss_b = meta_a["extra"]["history"]["loss"], meta_b["extra"]["history"]["loss"]
        if slow == 1:  # rank 0's losses: of its 32 rows for 3 steps, then of the whole batch (one process's)
            assert len(loss_a) == len(loss_b) == 10
            np.testing.assert_allclose(loss_b[3:], loss_a[3:], rtol=1e-5)
        else:  # rank 0 left out after 3 steps reports its 3 losses only
            assert len(loss_b) == 3 and "mean loss - (this rank was left out of every step)" in proc.stdout
