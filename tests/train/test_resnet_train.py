"""`netcl train --model resnet`: the images it takes (zero-padded to a multiple of 8), a run and its
resume."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from netcl.cli import main
from netcl.data import load_digits
from netcl.data.datasets import Split
from netcl.nn.resnet import ResNet
from netcl.train import main as train_main
from netcl.train.loop import MODELS, build_model, prepare_images


def test_prepare_images_pads_to_a_multiple_of_8():
    x = np.arange(2 * 1 * 28 * 27, dtype=np.float32).reshape(2, 1, 28, 27) + 1
    p = prepare_images("resnet", x)
    assert p.shape == (2, 1, 32, 32) and p.dtype == np.float32
    np.testing.assert_array_equal(p[:, :, 2:30, 2:29], x)            # centred: 2 + 2 rows, 2 + 3 columns
    assert p.sum() == x.sum()
    same = np.ones((3, 1, 8, 16), np.float32)
    assert prepare_images("resnet", same) is same and prepare_images("cnn", x) is x


def test_build_model_resnet(queue):
    assert "resnet" in MODELS
    model = build_model("resnet", queue, (1, 32, 32), 10)
    assert isinstance(model, ResNet) and model.conv1.weight.shape == (64, 1, 3, 3) and model.num_classes == 10
    with pytest.raises(ValueError, match="resnet"):
        build_model("vgg", queue, (1, 32, 32), 10)


def _fewer_test_images(split: Split, n: int) -> Split:
    return dataclasses.replace(split, x_test=split.x_test[:n], y_test=split.y_test[:n])


def test_netcl_train_resnet_and_resume(tmp_path, capsys, monkeypatch):
    """The wiring of --model resnet (its images, a run, a resume): on 64 training and 32 test images, as
    ResNet-18's forward over the 359 test images of each epoch was most of the test's CPU time."""
    out = tmp_path / "run"
    monkeypatch.setattr(train_main, "load_digits", lambda: _fewer_test_images(load_digits(), 32))

    def args(epochs, *more):
        return [
            "train",
            "--dataset",
            "digits",
            "--model",
            "resnet",
            "--epochs",
            str(epochs),
            "--batch-size",
            "32",
            "--train-limit",
            "64",
            "--out",
            str(out),
            "--no-progress",
            *more,
        ]

    assert main(args(1)) == 0
    text = capsys.readouterr().out
    assert "resnet on digits (64 train / 32 test" in text and "11,1" in text  # ResNet-18: ~11.2M parameters
    assert main(args(2, "--resume")) == 0
    assert "epoch 2:" in capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["model"] == "resnet" and len(metrics["test_accuracy"]) == 2
    assert (
        main(args(3, "--resume")[:4] + ["cnn"] + args(3, "--resume")[5:]) == 1
    )  # a resumed run keeps its model
    assert "--model cnn differs" in capsys.readouterr().err
