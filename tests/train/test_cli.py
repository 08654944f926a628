"""`netcl train` as a user meets it: resume semantics, bad arguments, output directories, and that the
command claims only files it wrote."""

from __future__ import annotations

import json
import math

import pytest

from netcl.cli import main
from netcl.io.checkpoint import read_checkpoint
from netcl.train import main as train_main


def _digits(out, *extra: str) -> list[str]:
    return ["train", "--dataset", "digits", "--model", "mlp", "--batch-size", "64", "--out", str(out),
            "--no-progress", *extra]


def _steps_per_epoch(meta) -> int:
    return meta["step"] // meta["epoch"]


def test_resume_with_more_epochs_continues_a_longer_schedule(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_digits(out, "--epochs", "1")) == 0
    _, first = read_checkpoint(out / "checkpoint.safetensors")
    steps = _steps_per_epoch(first)
    assert first["scheduler"]["state"]["T_max"] == steps
    capsys.readouterr()
    assert main(_digits(out, "--epochs", "3", "--resume")) == 0
    text = capsys.readouterr().out
    assert "now spans 3 epochs" in text and "resumed from" in text
    # the lr continues along the 3-epoch cosine at step `steps`: base * (1 + cos(pi / 3)) / 2
    base = first["extra"]["args"]["lr"]
    assert f"lr {base * (1 + math.cos(math.pi / 3)) / 2:.3g}" in text
    _, meta = read_checkpoint(out / "checkpoint.safetensors")
    sched = meta["scheduler"]["state"]
    assert sched["T_max"] == 3 * steps and sched["last_epoch"] == 3 * steps
    lrs = sched["_last_lr"]
    assert all(abs(lr) < 1e-12 for lr in lrs)  # annealed to the end of the longer schedule, not back up
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["epochs"] == 3 and len(metrics["test_accuracy"]) == 3


def test_resume_of_an_interrupted_run_finishes_its_planned_epochs(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_digits(out, "--epochs", "1")) == 0
    _, meta = read_checkpoint(out / "checkpoint.safetensors")
    assert meta["extra"]["args"]["epochs"] == 1
    capsys.readouterr()
    # a resumed run keeps its settings: a different batch size is refused before anything is written
    before = (out / "checkpoint.safetensors").read_bytes()
    assert main(["train", "--resume", str(out / "checkpoint.safetensors"), "--batch-size", "32",
                 "--epochs", "2", "--no-progress"]) == 1
    assert "--batch-size 32 differs from the resumed run's 64" in capsys.readouterr().err
    assert (out / "checkpoint.safetensors").read_bytes() == before


def test_resume_at_the_end_says_so_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_digits(out, "--epochs", "1")) == 0
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert main(["train", "--resume", "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "already trained 1 of 1 epochs: nothing to do" in text and "--epochs N" in text
    assert "wrote" not in text
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files


def test_outputs_are_claimed_only_when_written(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_digits(out, "--epochs", "1")) == 0
    claimed = [
        line.split(" ", 1)[1] for line in capsys.readouterr().out.splitlines() if line.startswith("wrote ")
    ]
    assert sorted(claimed) == sorted(
        str(out / n) for n in ("checkpoint.safetensors", "best.safetensors", "curves.png", "metrics.json")
    )
    assert all(
        (out / name).stat().st_size > 0 for name in ("checkpoint.safetensors", "curves.png", "metrics.json")
    )


@pytest.mark.parametrize("flag,value,words", [
    ("--epochs", "0", "must be a positive integer, got 0"),
    ("--epochs", "-1", "must be a positive integer, got -1"),
    ("--epochs", "two", "expected a positive integer, got 'two'"),
    ("--batch-size", "0", "must be a positive integer, got 0"),
    ("--lr", "nan", "must be a finite number > 0"),
    ("--lr", "-0.1", "must be a finite number > 0"),
    ("--weight-decay", "-1", "must be a finite number >= 0"),
    ("--train-limit", "-3", "must be >= 0, got -3"),
    ("--seed", "-1", "must be an integer >= 0, got -1"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, capsys, flag, value, words):
    with pytest.raises(SystemExit) as exc:
        main(["train", flag, value, "--out", str(tmp_path / "never")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: {words}" in err and "Traceback" not in err
    assert not (tmp_path / "never").exists()


def test_bad_paths_are_clear_errors(tmp_path, capsys):
    assert main(_digits(tmp_path / "a", "--epochs", "1", "--data-dir", str(tmp_path / "nonexistent"))) == 0
    capsys.readouterr()  # digits needs no files: --data-dir is not consulted
    assert main(["train", "--dataset", "fashion-mnist", "--data-dir", str(tmp_path / "nonexistent"),
                 "--out", str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err
    assert f"--data-dir {tmp_path / 'nonexistent'}: no such directory" in err
    (tmp_path / "empty").mkdir()
    assert main(["train", "--data-dir", str(tmp_path / "empty"), "--out", str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err
    assert "fashion-mnist IDX files" in err and str(tmp_path / "empty") in err  # no silent fallback to digits
    (tmp_path / "file").write_text("x")
    assert main(_digits(tmp_path / "file" / "sub", "--epochs", "1")) == 1
    assert "cannot create the output directory" in capsys.readouterr().err
    assert main(_digits(tmp_path / "d", "--epochs", "1", "--batch-size", "5000")) == 1
    assert "larger than the" in capsys.readouterr().err


def test_an_earlier_run_is_never_overwritten_silently(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert main(_digits(out, "--epochs", "1")) == 0
    assert main(_digits(out, "--epochs", "1")) == 1
    assert "already holds a run" in capsys.readouterr().err
    assert main(_digits(out, "--epochs", "1", "--overwrite")) == 0
    # the default directory: a second run goes beside the first, and --resume finds the latest
    monkeypatch.chdir(tmp_path)
    args = [
        "train",
        "--dataset",
        "digits",
        "--model",
        "mlp",
        "--batch-size",
        "64",
        "--epochs",
        "1",
        "--no-progress",
    ]
    assert main(args) == 0 and (tmp_path / "runs/train/checkpoint.safetensors").exists()
    capsys.readouterr()
    assert main(args) == 0 and (tmp_path / "runs/train-2/checkpoint.safetensors").exists()
    assert "runs/train holds an earlier run: this one goes to runs/train-2" in capsys.readouterr().out
    assert main(["train", "--resume", "--epochs", "2", "--no-progress"]) == 0
    assert "resumed from runs/train-2/checkpoint.safetensors" in capsys.readouterr().out


def test_the_accuracy_curve_marks_whole_epochs():
    """curves.png of a two-epoch run had ticks at epochs 1.0, 1.2, ..., 2.0."""
    fig = train_main.curves_figure({"loss": [1.0, 0.8, 0.6, 0.5], "test_accuracy": [0.5, 0.75]}, "two epochs")
    epochs = fig.axes[1]
    assert epochs.get_xlabel() == "epoch"
    ticks = [t for t in epochs.get_xticks() if epochs.get_xlim()[0] <= t <= epochs.get_xlim()[1]]
    assert ticks == [1.0, 2.0]


def test_patience_stops_netcl_train_and_best_keeps_the_best_epoch(tmp_path, capsys, monkeypatch):
    """Test accuracies 0.5, 0.7, 0.6, 0.7 (a tie is no improvement): --patience 2 stops after epoch 4 of 6;
    best.safetensors holds epoch 2, checkpoint.safetensors epoch 4, and a resume goes on from epoch 4."""
    scripted = iter([0.5, 0.7, 0.6, 0.7])
    monkeypatch.setattr(train_main, "evaluate", lambda *a, **k: next(scripted))
    out = tmp_path / "run"
    assert main(_digits(out, "--epochs", "6", "--patience", "2")) == 0
    text = capsys.readouterr().out
    assert "epoch 5:" not in text
    assert (f"stopping early at epoch 4: the test accuracy has not improved for 2 evaluations "
            f"(--patience 2); the best, 0.7000 at epoch 2, is in {out / 'best.safetensors'}") in text
    assert "best.safetensors: the checkpoint of the best test accuracy, 0.7000 at epoch 2" in text
    last, best = read_checkpoint(out / "checkpoint.safetensors"), read_checkpoint(out / "best.safetensors")
    assert last[1]["epoch"] == 4 and best[1]["epoch"] == 2
    assert best[1]["extra"]["history"]["test_accuracy"] == [0.5, 0.7]
    assert not all((last[0][k] == best[0][k]).all() for k in last[0] if k.startswith("model/"))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["best"] == {"at": "epoch 2", "test_accuracy": 0.7, "checkpoint": "best.safetensors"}
    assert metrics["stopped_early_at"] == "epoch 4" and metrics["test_accuracy"] == [0.5, 0.7, 0.6, 0.7]
    # without --patience the resumed run trains on (its best so far stays epoch 2's until one beats 0.7)
    scripted = iter([0.65, 0.8])
    assert main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert read_checkpoint(out / "checkpoint.safetensors")[1]["epoch"] == 6
    assert read_checkpoint(out / "best.safetensors")[1]["epoch"] == 6


def test_a_diverging_run_stops_with_what_to_change(tmp_path, capsys):
    """A loss that became NaN (lr 1e30) ends the run with one line (the epoch, the lr, what to try) and saves
    nothing of that epoch (it printed 'mean loss nan', saved the NaN weights as the best and exited 0)."""
    out = tmp_path / "run"
    assert main(_digits(out, "--epochs", "2", "--lr", "1e30")) == 1
    err = capsys.readouterr().err
    assert "the training loss became nan in epoch 1; training diverged (this epoch not saved): try a lower " \
           "--lr (it was 1e+30)" in err and "Traceback" not in err
    assert not (out / "checkpoint.safetensors").exists() and not (out / "best.safetensors").exists()
