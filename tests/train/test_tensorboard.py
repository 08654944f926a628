"""TensorBoard scalars: the writer's event files and `netcl train --tensorboard`, read back with TensorBoard's
own reader (event_accumulator). Both packages are optional (the `tensorboard` extra brings the writer, the
`test` extra both): the tests that need them skip, naming what is missing, where they are not installed."""

from __future__ import annotations

import math
import sys

import pytest

from netcl.cli import main
from netcl.errors import NetclError
from netcl.train import tensorboard


@pytest.fixture
def tensorboard_packages():
    """tensorboardX (the writer, netcl's optional `tensorboard` extra) and TensorBoard's reader."""
    pytest.importorskip(
        "tensorboardX", reason="tensorboardX is not installed: pip install 'netcl[tensorboard]'"
    )
    return pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="TensorBoard (its event reader) is not installed: pip install tensorboard",
    )


def _scalars(event_accumulator, logdir) -> dict[str, list[tuple[int, float]]]:
    acc = event_accumulator.EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_writer_round_trips_through_tensorboards_reader(tmp_path, tensorboard_packages):
    logdir = tmp_path / "tb" / "run1"
    with tensorboard.open_writer(logdir) as tb:
        for step in range(5):
            tb.log(step * 10, {"train/loss": 1.0 / (step + 1), "train/learning_rate": 1e-3 * step})
        tb.log(50, {"test/accuracy": 0.875, "train/loss": float("nan")})
    got = _scalars(tensorboard_packages, logdir)
    assert set(got) == {"train/loss", "train/learning_rate", "test/accuracy"}
    assert [s for s, _ in got["train/loss"]] == [0, 10, 20, 30, 40, 50]
    for (_, value), want in zip(got["train/loss"], [1.0, 0.5, 1 / 3, 0.25, 0.2]):
        assert value == pytest.approx(want, rel=1e-6)  # stored as float32
    assert math.isnan(got["train/loss"][-1][1])
    assert got["test/accuracy"] == [(50, 0.875)]


def test_writer_refuses_bad_input(tmp_path, tensorboard_packages):
    tb = tensorboard.ScalarWriter(tmp_path / "tb")
    with pytest.raises(ValueError, match="step must be an integer"):
        tb.log(-1, {"a": 1.0})
    with pytest.raises(ValueError, match="tag must be"):
        tb.log(0, {"": 1.0})
    with pytest.raises(TypeError, match="'a' must be a number"):
        tb.log(0, {"a": "high"})
    tb.close()
    with pytest.raises(NetclError, match="closed"):
        tb.log(1, {"a": 1.0})
    (tmp_path / "file").write_text("x")
    with pytest.raises(NetclError, match="--tensorboard"):
        tensorboard.ScalarWriter(tmp_path / "file")
    tensorboard.open_writer(None).log(0, {"anything": 1.0})  # no --tensorboard: writes nothing


def test_netcl_train_writes_scalars(tmp_path, capsys, tensorboard_packages):
    out, logdir = tmp_path / "run", tmp_path / "tb"
    args = ["train", "--dataset", "digits", "--model", "mlp", "--batch-size", "64", "--epochs", "2",
            "--train-limit", "640", "--out", str(out), "--no-progress", "--tensorboard", str(logdir)]
    assert main(args) == 0
    assert f"wrote {logdir}" in capsys.readouterr().out
    got = _scalars(tensorboard_packages, logdir)
    assert {"train/loss", "train/learning_rate", "train/images_per_second", "test/accuracy",
            "train/epoch_mean_loss", "train/epoch_images_per_second"} <= set(got)
    steps_per_epoch = 640 // 64
    assert [s for s, _ in got["test/accuracy"]] == [steps_per_epoch, 2 * steps_per_epoch]
    assert all(0.0 <= v <= 1.0 for _, v in got["test/accuracy"])
    loss_steps = [s for s, _ in got["train/loss"]]
    assert loss_steps == sorted(loss_steps) and loss_steps[-1] == 2 * steps_per_epoch
    lrs = [v for _, v in got["train/learning_rate"]]
    assert lrs == sorted(lrs, reverse=True) and lrs[0] > 0  # the cosine schedule going down
    assert all(v > 0 for _, v in got["train/images_per_second"])


def test_without_tensorboardx_the_flag_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # importing it fails, as where it is absent
    words = r"--tensorboard needs the tensorboardX package: pip install 'netcl\[tensorboard\]'"
    with pytest.raises(NetclError, match=words):
        tensorboard.open_writer(tmp_path / "tb")
    assert not (tmp_path / "tb").exists()
    tensorboard.open_writer(None).log(0, {"loss": 1.0})  # without the flag nothing is imported
